"""A pytest plugin that records, for each test, its xdist process, its start and end, and how busy the whole
machine was meanwhile (CPU seconds from /proc/stat, which counts every process, Ray's included):

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -n 2 --dist loadgroup -p suite_timeline

One JSON line per test goes to $SUITE_TIMELINE (default: benchmarks/results/suite_timeline.jsonl)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from machine_busy import machine_busy_seconds

OUT = Path(os.environ.get("SUITE_TIMELINE", Path(__file__).parent / "results" / "suite_timeline.jsonl"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started, busy = time.time(), machine_busy_seconds()
    yield
    record = {
        "test": item.nodeid,
        "process": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": started,
        "seconds": time.time() - started,
        "machine_cpu_s": machine_busy_seconds() - busy,
    }
    with open(OUT, "a") as out:
        out.write(json.dumps(record) + "\n")
