#!/usr/bin/env bash
# Set up, check the code's form (ruff: lint, then formatting), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
exec .venv/bin/python -m pytest "$@"
