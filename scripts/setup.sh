#!/usr/bin/env bash
# Create .venv and install the project into it. Safe to run again: it skips work already done.
# On a machine without an NVIDIA GPU it installs the CPU build of torch and no CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ -f "$stamp" ]; then
    exit 0
fi

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "setup: NVIDIA GPU found, installing torch $TORCH_VERSION with CUDA" >&2
        "${PIP[@]}" install --no-compile "torch==$TORCH_VERSION"
    else
        echo "setup: no GPU, installing the CPU build of torch $TORCH_VERSION" >&2
        # A local wheel cache (pip's find-links) may already hold the CPU build; otherwise use PyTorch's CPU index.
        "${PIP[@]}" install --no-compile --no-deps --no-index "torch==$TORCH_VERSION" 2>/dev/null \
            || "${PIP[@]}" install --no-compile --no-deps "torch==$TORCH_VERSION" --index-url "$TORCH_CPU_INDEX"
    fi
fi
# torch is in place, so its pin is already satisfied and no other build is pulled in. uv installs the rest
# in seconds where pip takes minutes (it downloads and unpacks in parallel); without uv (no package index
# reachable for it), pip does it.
if ! { "${PIP[@]}" install uv 2>/dev/null && .venv/bin/uv pip install --quiet --python .venv/bin/python -e '.[dev]'; }; then
    "${PIP[@]}" install --no-compile -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" >&2 || true
fi
# Bytecode: neither installer compiled the installed modules; importing what the pipeline and its tests use
# compiles those, a fifth of them, in less time than compiling all, in two processes (the torch stack, which
# is also the check that the installation works; the rest, extras among them, which may be missing;
# benchmarks/results/2026-11-29-test-suite-cpu.md). Where PYTHONDONTWRITEBYTECODE is set nothing would compile
# them, and every process (a test's commands, torchrun's and Ray's workers) would compile what it imports
# again: these imports lift it for themselves.
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c '
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:  # an extra not installed
        pass' duckdb ray ray.data ray.train ray.serve uvicorn search.serve.app pytest xdist schemathesis httpx \
    playwright.sync_api tensorboard.backend.event_processing.event_accumulator &
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import torch, transformers, sentence_transformers, faiss, duckdb
import pretrain.run, pretrain.launch, embed.run, embed.tune, embed.choose, index.build, search.engine
import search.evaluate, common.board" || { echo "setup: installation failed" >&2; exit 1; }
wait
# The web page's browser test drives Debian's chromium (Playwright never downloads a browser here).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
    echo "setup: installing Debian's chromium for the browser test" >&2
    { apt-get update -q && apt-get install -y -q chromium chromium-driver; } >/dev/null 2>&1 \
        || echo "setup: could not install chromium; the browser test will be skipped" >&2
fi
rm -f .venv/.installed-*
touch "$stamp"
