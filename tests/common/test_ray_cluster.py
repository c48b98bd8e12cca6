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
