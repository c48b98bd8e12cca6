#!/usr/bin/env bash
# Set up, check the code's form (ruff: lint, then formatting), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
# Each test process computes on one thread (tests/conftest.py), so the suite runs in up to 4 processes
# (pytest-xdist; the Ray tests together in one of them).
exec .venv/bin/python -m pytest -n auto --maxprocesses 4 --dist loadgroup "$@"
