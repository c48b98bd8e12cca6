"""What Ray's workers are told about this project: nothing where it is installed (Ray then starts each worker
once), its source tree on their PYTHONPATH where it runs from an uninstalled copy."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from common.ray_cluster import worker_environment

REPO = Path(__file__).resolve().parents[2]
ASK = "from common.ray_cluster import worker_environment; print(worker_environment())"


def test_workers_of_the_installed_checkout_get_no_runtime_env():
    assert worker_environment() is None


def test_workers_of_an_uninstalled_copy_get_its_path(tmp_path):
    copy = tmp_path / "checkout"
    shutil.copytree(REPO / "common", copy / "common", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy)
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    answer = subprocess.run([sys.executable, "-c", ASK], cwd=copy, env=environment, capture_output=True, text=True)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == repr({"env_vars": {"PYTHONPATH": str(copy)}})


def test_while_ray_works_its_native_log_lines_are_dropped_from_stderr_and_nothing_else():
    """notices_on_stderr: a line of Ray's C++ log on descriptor 2 (its core worker logs there as well as in its
    log file) is dropped; our messages, a Python logger's lines (Ray's loggers hold the stream they started
    with) and other lines pass in order, and a line Ray's driver prints on stdout becomes a warning. A process
    of its own, whose stderr is descriptor 2 as a command's is."""
    script = (
        "import logging, os, sys\n"
        "from common.console import warn\n"
        "from common.ray_cluster import notices_on_stderr\n"
        "logging.getLogger('lib').addHandler(logging.StreamHandler(sys.stderr))\n"
        "with notices_on_stderr():\n"
        "    os.write(2, b'[2026-01-01 00:00:00,000 E 1 2] core_worker.cc:2465: a native notice\\n')\n"
        "    warn('ours, during')\n"
        "    logging.getLogger('lib').error('a library logs')\n"
        "    print('(raylet) A worker died or was killed while executing a task. More follows.')\n"
        "    os.write(2, b'[not Ray] a line\\n[2026-01-01 00:00:00,000 W 1 2] raylet.cc:1: ')\n"
        "    os.write(2, b'split across writes\\npartial ')\n"
        "os.write(2, b'native, after\\n')\n"
        "print('result')\n"
    )
    answer = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout == "result\n"
    assert answer.stderr.splitlines() == [
        "warning: ours, during",
        "a library logs",
        "warning: Ray: A worker died or was killed while executing a task.",
        "[not Ray] a line",
        "partial native, after",
    ]
