"""Start-up cost of the CLI: `import cli` (python -X importtime) and the wall time of light commands, each
a new process, median of --runs. --checkout DIR measures another checkout of the repository with this
one's Python (e.g. a worktree of main, for a before/after); the calls of both are interleaved, so load
from other work falls on both alike.

    python benchmarks/bench_startup.py --workspace WS [--checkout ../main] [--runs 9]

WS is any workspace with an index (for status and a lexical search, which load no model).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks_common import REPO, write_result


def import_ms(checkout: Path) -> float:
    """Cumulative microseconds of `import cli` as -X importtime reports it, in milliseconds."""
    stderr = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import cli"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    last = stderr.strip().splitlines()[-1]  # "import time: self | cumulative | cli"
    return int(last.split("|")[1]) / 1000


def wall_s(checkout: Path, args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(checkout / "cli.py"), *args], cwd=checkout, capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--checkout", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--runs", type=int, default=9)
    options = parser.parse_args()
    ws = str(options.workspace.resolve())
    commands = {
        "--help": ["--help"],
        "search --help": ["search", "--help"],
        "status": ["status", "-w", ws],
        "search --mode lexical": ["search", "-w", ws, "cells", "--mode", "lexical", "-k", "3"],
    }
    checkouts = {"this": REPO, **({"other": options.checkout.resolve()} if options.checkout else {})}
    samples: dict = {name: {"import cli (ms)": [], **{c: [] for c in commands}} for name in checkouts}
    for _ in range(options.runs):
        for name, checkout in checkouts.items():
            samples[name]["import cli (ms)"].append(import_ms(checkout))
            for command, args in commands.items():
                samples[name][command].append(wall_s(checkout, args))
    result = {
        name: {what: round(statistics.median(values), 3) for what, values in measured.items()}
        for name, measured in samples.items()
    }
    result["checkouts"] = {name: str(path) for name, path in checkouts.items()}
    result["runs"] = options.runs
    write_result("startup", result)


if __name__ == "__main__":
    main()
