#!/usr/bin/env bash
# Set up, check the code's form (ruff: lint, then formatting), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
# Most tests run one process at a time (one compute thread each, conftest.py), so the suite is spread over
# pytest-xdist processes, one per core (at most 8). The tests marked ray or multiprocess start many processes
# each: they all go to one of them (conftest.py's xdist group), one at a time, beside the others' tests
# (benchmarks/results/2026-11-28-test-suite.md).
# pytest rewrites the asserts of its plugins' modules (schemathesis's, hypothesis's) in each process and caches
# them as bytecode, which PYTHONDONTWRITEBYTECODE forbids: with it set, every xdist process rewrote them again
# (benchmarks/results/2026-11-29-test-suite-cpu.md).
unset PYTHONDONTWRITEBYTECODE
workers=$(nproc)
if [ "$workers" -gt 8 ]; then workers=8; fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
