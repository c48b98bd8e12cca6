#!/usr/bin/env bash
# Set up, check the code's form (ruff: lint, then formatting), then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
PYTEST=(.venv/bin/python -m pytest)
if [ "$#" -gt 0 ]; then  # arguments go to pytest: one run of what they select
    exec "${PYTEST[@]}" "$@"
fi
# The suite in two parts. Most tests run one process at a time (one compute thread each, conftest.py), so they
# are spread over pytest-xdist processes, one per core (at most 8). The tests marked ray or multiprocess start
# many processes each (a Ray cluster's, torchrun's workers), which beside other tests took 3 to 5 times as
# long: they run afterwards, one at a time (benchmarks/results/2026-11-28-test-suite.md).
ONE_AT_A_TIME="ray or multiprocess"
workers=$(nproc)
if [ "$workers" -gt 8 ]; then workers=8; fi
status=0
"${PYTEST[@]}" -n "$workers" -m "not ($ONE_AT_A_TIME)" || status=$?
"${PYTEST[@]}" -n 0 -m "$ONE_AT_A_TIME" || status=$?
exit "$status"
