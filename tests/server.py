"""A running `pipeline serve` for the tests that talk to a real server (and for the benchmarks, which
import it from here: benchmarks/benchmarks_common.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(process: subprocess.Popen, base: str, timeout_s: float = 300) -> None:
    """Return once the server `process` started answers /health at `base`; raise if it exits or times out
    first (with its output, when that was taken with subprocess.PIPE)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            said = process.stdout.read() if process.stdout is not None and process.poll() is not None else ""
            raise RuntimeError(
                f"pipeline serve did not start ({'exited' if process.poll() is not None else 'timed out'}): {said}"
            )
        time.sleep(0.3)


@contextmanager
def running_server(ws: Path, *options: str, output=subprocess.DEVNULL, timeout_s: float = 300) -> Iterator[str]:
    """`pipeline serve -w WS OPTIONS` in its own process on a free loopback port: yields the base URL once
    /health answers, and stops the server afterwards. `output` takes its stdout and stderr (a file or
    subprocess.PIPE, whose text a failure to start then includes)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(REPO / "cli.py"), "serve", "-w", str(ws), "--port", str(port), *options],
        cwd=REPO,
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(process, base, timeout_s)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
