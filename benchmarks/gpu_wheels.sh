#!/usr/bin/env bash
# Download, here, the wheels of the project's dependencies that a GPU machine with PyTorch but no internet lacks
# (the device image: Python 3.12, torch, transformers, numpy, scipy, numba, pyarrow ... already there), into
# .whl/ (ignored by git), with SciFact compressed. benchmarks/README.md says how they are installed there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
# What the chain (pretrain, tune, embed, index, eval) imports and the image lacks or has at another version;
# the document readers' and the server page's packages are left out: with SciFact, under the 64 MiB a
# device call can carry.
PACKAGES=(
    duckdb faiss-cpu bm25s PyStemmer py3langid sentencex pytrec-eval-terrier datasets dill multiprocess
    fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn httptools filelock
    typer==0.29.2 sentence-transformers==6.2.0
)
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${PACKAGES[@]}"
# SciFact, compressed, to unpack there (benchmarks/README.md)
tar czf .whl/scifact.tar.gz -C ../shared/data scifact
du -sh .whl
