"""Shared fixtures: small slices of SciFact and one tiny trained workspace reused across tests."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"

# A model small enough to train in seconds; the shapes are still GPT-2's.
TINY_TRAINING = ["--preset", "tiny", "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--seq-len", "32",
                 "--batch-size", "8", "--vocab-size", "400", "--eval-every", "10", "--log-every", "1", "--no-adapt"]


def run_cli(*args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the `pipeline` CLI as a user would, in a separate process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, str(REPO / "cli.py"), *args], capture_output=True, text=True,
                            timeout=timeout, env=env, cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"pipeline {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def scifact_slice(path: Path, n: int, start: int = 0) -> Path:
    lines = (SCIFACT / "corpus.jsonl").read_text().splitlines()[start:start + n]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    if not SCIFACT.exists():
        pytest.skip(f"{SCIFACT} not found (the shared SciFact data sits beside the repository)")
    path = scifact_slice(tmp_path_factory.mktemp("data") / "corpus.jsonl", 120)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**row, **corpus_metadata(i)}) + "\n" for i, row in enumerate(rows)))
    return path


JOURNALS = ("Nature", "Cell", "Science", "Lancet")


def corpus_metadata(i: int) -> dict:
    """The fields a user's documents carry beside their text, for the i-th document of the corpus slice:
    `year` is 1900 + i, so `year < 1900 + n` keeps exactly the first n documents."""
    return {"year": 1900 + i, "journal": JOURNALS[i % len(JOURNALS)], "open_access": i % 2 == 0,
            "published": f"{1900 + i}-0{1 + i % 9}-15", "tags": ["even" if i % 2 == 0 else "odd", f"group-{i % 3}"]}


@pytest.fixture(scope="session")
def trained_workspace(tmp_path_factory, corpus_file) -> Path:
    """pretrain -> embed -> index on the SciFact slice, through the CLI. Tests must not modify it. Its
    pretraining is also the uninterrupted run a killed and resumed one is compared with (test_pretrain)."""
    ws = tmp_path_factory.mktemp("ws")
    run_cli("pretrain", "-w", str(ws), "--data", str(corpus_file), *TINY_TRAINING, "--max-steps", "20")
    run_cli("embed", "-w", str(ws), "--chunk-tokens", "64", "--overlap", "8")
    run_cli("index", "-w", str(ws))
    return ws


def read_metrics(ws: Path) -> list[dict]:
    return [json.loads(line) for line in (ws / "metrics.jsonl").read_text().splitlines() if line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(ws: Path, *args: str):
    """`pipeline serve` on a free loopback port, as a separate process; yields its base URL once /health answers."""
    import httpx

    port = free_port()
    process = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "serve", "-w", str(ws), "--port", str(port), *args],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"server exited: {process.stdout.read()}")
            if time.monotonic() > deadline:
                pytest.fail("server did not start in time")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
