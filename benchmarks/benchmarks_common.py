"""Helpers shared by the benchmark scripts: where data and results live, a pretrained workspace, and a
running `pipeline serve` (`running_server`, the tests' own helper: tests/server.py)."""

from __future__ import annotations

import itertools
import json
import os
import platform
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import psutil
import torch

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
RESULTS = REPO / "benchmarks" / "results"
TOPIC_SHARE = 0.75  # of a topical synthetic document's sentences, drawn from its own abstract

# The benchmarks run as scripts, with benchmarks/ on the path: the project's own code is this checkout's (not
# another one an editable install points to: a benchmark runs from a clone while the main one changes).
for path in (REPO / "tests", REPO):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
from server import running_server  # noqa: E402,F401  (re-exported for the benchmarks that serve)


def synthetic_documents(
    n: int | None, seed: int, first_id: int = 0, sentences: tuple[int, int] = (4, 9), topical: bool = False
) -> Iterator[dict]:
    """Abstract-like documents made from SciFact with a seed (n of them; without end for None): a title and 4
    to 9 (`sentences`) sentences, and a `year`. The sentences are drawn from the whole corpus's abstracts, so
    that a document mixes unrelated subjects; with `topical`, each is about one abstract (its title; each
    sentence one of that abstract's with probability TOPIC_SHARE, else any abstract's), as the documents of a
    real collection each have a subject, and the abstract's many such documents are near-duplicates. Its own
    sentences keep their order and are not repeated."""
    rows = [json.loads(line) for line in (SCIFACT / "corpus.jsonl").read_text().splitlines()]
    split = [[s for s in re.split(r"(?<=[.!?])\s+", r["text"]) if len(s) > 20] for r in rows]
    corpus_sentences = [s for abstract in split for s in abstract]
    titles = [r["title"] for r in rows]
    with_sentences = [i for i, abstract in enumerate(split) if abstract]
    rng = random.Random(seed)
    for i in itertools.count() if n is None else range(n):
        if topical:
            topic = rng.choice(with_sentences)
            title = titles[topic]
            count = rng.randint(*sentences)
            own = min(len(split[topic]), sum(rng.random() < TOPIC_SHARE for _ in range(count)))
            chosen = [split[topic][j] for j in sorted(rng.sample(range(len(split[topic])), own))]  # in its order
            for _ in range(count - own):
                chosen.insert(rng.randint(0, len(chosen)), rng.choice(corpus_sentences))
        else:  # the draws in the order they were first made: a seed gives the documents it always gave
            title, chosen = rng.choice(titles), rng.choices(corpus_sentences, k=rng.randint(*sentences))
        yield {
            "_id": f"synthetic-{first_id + i}",
            "title": title,
            "text": " ".join(chosen),
            "year": rng.randint(1990, 2025),
        }


def pipeline(*args: str) -> subprocess.CompletedProcess:
    """`pipeline ARGS` in a new process; a failure raises with the command's own error output."""
    done = subprocess.run([sys.executable, str(REPO / "cli.py"), *args], cwd=REPO, text=True, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"pipeline {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def run_measured(args: list[str], marks: dict[str, str] | None = None, script: Path = REPO / "cli.py") -> dict:
    """Run `pipeline ARGS` (or another Python `script` with ARGS); wall seconds and the peak RSS of the
    process with its children (sampled every 50 ms), and of its anonymous memory (RSS less the pages it
    shares with files: what memory-mapped files it reads bring in is reclaimable, what it allocates is not),
    and for each of `marks` (name -> the start of a progress line), the seconds until that line was printed
    and the peak RSS until then."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: lines.extend((time.perf_counter() - start, line) for line in process.stderr), daemon=True
    )
    reader.start()
    parent, samples = psutil.Process(process.pid), []
    while process.poll() is None:
        try:
            memory = [p.memory_info() for p in [parent, *parent.children(recursive=True)]]
            rss = sum(m.rss for m in memory)
            samples.append((time.perf_counter() - start, rss, rss - sum(m.shared for m in memory)))
        except psutil.Error:
            pass
        time.sleep(0.05)
    stdout = process.stdout.read()
    reader.join()
    seconds = time.perf_counter() - start
    stderr = "".join(line for _, line in lines)
    if process.returncode != 0:  # what it printed before the traceback says how far it got
        progress = [line.rstrip() for _, line in lines if line[:1].isalnum()][-20:]
        peak = max((rss for _, rss, _ in samples), default=0) / 2**30
        raise SystemExit(
            f"{script.name} {' '.join(args)} failed after {seconds:.0f}s (peak RSS {peak:.2f} GB so far):\n"
            + "\n".join(progress)
            + f"\n{stderr[-3000:]}"
        )
    result = {
        "seconds": round(seconds, 2),
        "peak_rss_gb": round(max(rss for _, rss, _ in samples) / 2**30, 3),
        "peak_anon_gb": round(max(anon for _, _, anon in samples) / 2**30, 3),
        "stdout": stdout,
        "log": stderr.strip().splitlines()[-6:],
    }
    for name, prefix in (marks or {}).items():
        at = next((t for t, line in lines if line.startswith(prefix)), None)
        if at is not None:
            result[name] = {
                "seconds": round(at, 2),
                "peak_rss_gb": round(max((rss for t, rss, _ in samples if t <= at), default=0) / 2**30, 3),
            }
    return result


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
