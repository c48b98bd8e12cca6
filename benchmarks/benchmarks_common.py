"""Helpers shared by the benchmark scripts: where data and results live, a pretrained workspace, and a
running `pipeline serve` (`running_server`, the tests' own helper: tests/server.py)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
RESULTS = REPO / "benchmarks" / "results"

if str(REPO / "tests") not in sys.path:  # the benchmarks run as scripts, with benchmarks/ on the path
    sys.path.insert(0, str(REPO / "tests"))
from server import running_server  # noqa: E402,F401  (re-exported for the benchmarks that serve)


def pipeline(*args: str) -> subprocess.CompletedProcess:
    """`pipeline ARGS` in a new process; a failure raises with the command's own error output."""
    done = subprocess.run([sys.executable, str(REPO / "cli.py"), *args], cwd=REPO, text=True, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"pipeline {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def pretrained_workspace(path: Path, steps: int = 300) -> Path:
    """A workspace whose tiny model was pretrained on all of SciFact (reused if already there)."""
    if not (path / "model" / "model.safetensors").exists():
        pipeline(
            "pretrain",
            "-w",
            str(path),
            "--data",
            str(SCIFACT / "corpus.jsonl"),
            "--preset",
            "tiny",
            "--max-steps",
            str(steps),
            "--log-every",
            "50",
            "--eval-every",
            str(steps),
            "--no-adapt",
        )
    return path


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": platform.machine(),
        "cpus": torch.get_num_threads(),
        "torch": torch.__version__,
        **result,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return path
