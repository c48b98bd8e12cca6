"""Helpers shared by the benchmark scripts: where data and results live, and a pretrained workspace."""
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


def pipeline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "cli.py"), *args], check=True, cwd=REPO, text=True, capture_output=True)


def pretrained_workspace(path: Path, steps: int = 300) -> Path:
    """A workspace whose tiny model was pretrained on all of SciFact (reused if already there)."""
    if not (path / "model" / "model.safetensors").exists():
        pipeline("pretrain", "-w", str(path), "--data", str(SCIFACT / "corpus.jsonl"), "--preset", "tiny",
                 "--max-steps", str(steps), "--log-every", "50", "--eval-every", str(steps), "--no-adapt")
    return path


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.machine(),
              "cpus": torch.get_num_threads(), "torch": torch.__version__, **result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return path
