#!/usr/bin/env bash
# Download, here, the wheels of the project's dependencies that a GPU machine with PyTorch but no internet lacks
# (the device image: Python 3.12, torch, transformers, sentence-transformers, numpy, scipy, numba, pyarrow ...
# already there), into .whl/ (ignored by git). benchmarks/README.md says how they are installed there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PACKAGES=(
    duckdb faiss-cpu bm25s PyStemmer py3langid sentencex pytrec-eval-terrier datasets dill multiprocess
    fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn httptools
    swagger-ui-py plotly pypdfium2 trafilatura lxml_html_clean python-docx filelock
    htmldate courlan justext dateparser tld tzlocal babel charset-normalizer
)
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "${PACKAGES[@]}"
du -sh .whl
