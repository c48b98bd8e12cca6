#!/usr/bin/env bash
# Set up, check the code's form (ruff: lint, then formatting), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
# A test keeps about two cores busy (each command it runs is a process importing torch), so the suite is spread
# over one pytest-xdist process per two cores, at most 4 (the Ray tests together in one of them); on 2 cores
# it runs in one (two processes there measured no faster: benchmarks/results/2026-11-28-test-suite.md).
workers=$(( $(nproc) / 2 ))
if [ "$workers" -gt 4 ]; then workers=4; fi
if [ "$workers" -lt 2 ]; then workers=0; fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
