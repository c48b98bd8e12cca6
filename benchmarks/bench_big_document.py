"""Memory for one large document: `pipeline embed` of a single document of --megabytes of text (one JSON
line), against the same command on a one-sentence document, for the transformer the pretraining exported and
for a static embedder tuned from it. Reports each run's peak RSS and the growth per megabyte of the document
(target of issue 48: at most 20 MB per MB).

    .venv/bin/python benchmarks/bench_big_document.py --megabytes 50
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from benchmarks_common import SCIFACT, pipeline, pretrained_workspace, run_measured, write_result

TARGET_MB_PER_MB = 20


def write_document(path: Path, megabytes: float, seed: int = 0) -> int:
    """One document of about `megabytes` of SciFact's words in a seeded random order; its size in bytes."""
    words = " ".join(json.loads(line)["text"] for line in (SCIFACT / "corpus.jsonl").open()).split()
    rng = random.Random(seed)
    size, parts = 0, []
    while size < megabytes * 2**20:
        part = " ".join(rng.choices(words, k=10_000))
        parts.append(part)
        size += len(part.encode()) + 1
    text = " ".join(parts)
    path.write_text(json.dumps({"_id": "large", "title": "One large document", "text": text}) + "\n")
    return len(text.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=50)
    parser.add_argument("--workspace", type=Path, default=Path(tempfile.gettempdir()) / "bench_big_document_ws")
    args = parser.parse_args()
    ws = pretrained_workspace(args.workspace, steps=50)
    if not (ws / "tuned").exists():
        pipeline("tune", "-w", str(ws), "--architecture", "static", "--steps", "20")
    with tempfile.TemporaryDirectory() as scratch:
        small, large = Path(scratch) / "small.jsonl", Path(scratch) / "large.jsonl"
        small.write_text(json.dumps({"_id": "small", "title": "A small one", "text": "One short sentence."}) + "\n")
        size = write_document(large, args.megabytes)
        rows = {}
        for embedder in ("model", "tuned"):
            runs = {}
            for name, data in (("one_sentence", small), ("large", large)):
                target = Path(scratch) / f"ws-{embedder}-{name}"
                target.mkdir()
                runs[name] = run_measured(
                    ["embed", "-w", str(target), "--data", str(data), "--model", str(ws / embedder), "--json"]
                )
                del runs[name]["stdout"]
            growth_mb = (runs["large"]["peak_rss_gb"] - runs["one_sentence"]["peak_rss_gb"]) * 1024
            rows[embedder] = {
                **runs,
                "rss_growth_mb_per_document_mb": round(growth_mb / (size / 2**20), 2),
                "target_met": growth_mb / (size / 2**20) <= TARGET_MB_PER_MB,
            }
            print(f"{embedder}: {rows[embedder]['rss_growth_mb_per_document_mb']} MB of RSS per MB of document")
    write_result("big_document", {"document_bytes": size, "target_mb_per_mb": TARGET_MB_PER_MB, "embedders": rows})


if __name__ == "__main__":
    main()
