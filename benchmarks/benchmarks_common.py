"""Helpers shared by the benchmark scripts: where data and results live, a pretrained workspace, and a
running `pipeline serve` (which tests/test_serve.py uses too)."""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
RESULTS = REPO / "benchmarks" / "results"


def pipeline(*args: str) -> subprocess.CompletedProcess:
    """`pipeline ARGS` in a new process; a failure raises with the command's own error output."""
    done = subprocess.run([sys.executable, str(REPO / "cli.py"), *args], cwd=REPO, text=True, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"pipeline {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(ws: Path, *options: str, output=subprocess.DEVNULL, timeout_s: float = 300) -> Iterator[str]:
    """`pipeline serve -w WS OPTIONS` in its own process on a free loopback port: yields the base URL once
    /health answers, and stops the server afterwards. `output` takes its stdout and stderr (a file or
    subprocess.PIPE, whose text a failure to start then includes)."""
    import httpx

    port = free_port()
    process = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "serve", "-w", str(ws), "--port", str(port), *options],
                               cwd=REPO, stdout=output, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                said = process.stdout.read() if output == subprocess.PIPE and process.poll() is not None else ""
                raise RuntimeError(f"pipeline serve did not start ({'exited' if process.poll() is not None else 'timed out'}): {said}")
            time.sleep(0.3)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
