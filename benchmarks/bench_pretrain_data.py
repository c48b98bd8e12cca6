"""Pretraining data at corpus scale: `pipeline pretrain --data` on a synthetic corpus of --gigabytes GB.

The corpus is JSON lines of abstract-like documents made from SciFact with a seed (benchmarks_common:
a title and 4 to 9 sentences drawn from all of its abstracts), written once into --workdir and reused.
`pipeline pretrain --data CORPUS --max-steps 2 --no-adapt --vocab-size 32768` (the vocabulary sizing
gives a corpus of this size) runs as a new process; from its progress lines come the wall time of each
phase (reading the corpus and drawing the tokenizer's sample, training the tokenizer, tokenizing into
shards, the first training step), and the peak RSS of the process with its workers until the data is
prepared. Then the baseline, in this process: the same tokenizer's own `encode_batch` (all threads) over
the same texts in batches of 1 MB, timed around encode_batch alone. JSON to benchmarks/results/.

    .venv/bin/python benchmarks/bench_pretrain_data.py --gigabytes 1 [--workdir DIR]

Targets (issue: pretraining on a real corpus): peak RSS of the preparation at most 2 GB for 1 GB, and
at most 10% more for a 4x larger corpus (compare two runs' JSON); tokenization at least 0.7x the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # the baseline: the library's encode_batch on every core

from benchmarks_common import run_measured, synthetic_documents, write_result  # noqa: E402

TARGETS = {"preparation_peak_rss_gb": 2.0, "rss_growth_4x": 1.10, "tokenize_vs_encode_batch": 0.7}
BASELINE_BATCH_CHARS = 1 << 20


def write_corpus(path: Path, gigabytes: float, seed: int) -> Path:
    """The synthetic corpus, written once (to a temporary name, then renamed) and reused."""
    if path.exists():
        return path
    target, written = int(gigabytes * 1e9), 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for doc in synthetic_documents(None, seed):
            line = json.dumps(doc) + "\n"
            f.write(line)
            written += len(line)
            if written >= target:
                break
    tmp.replace(path)
    return path


def encode_batch_baseline(corpus: Path, tokenizer_file: Path) -> dict:
    """MB/s of the tokenizer's own encode_batch over the corpus's training texts (title, newline, text)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    encoding_seconds, text_bytes, tokens, batch, chars = 0.0, 0, 0, [], 0

    def encode() -> None:
        nonlocal encoding_seconds, tokens
        started = time.perf_counter()
        encoded = tokenizer.encode_batch(batch)
        encoding_seconds += time.perf_counter() - started
        tokens += sum(len(e.ids) for e in encoded)

    with corpus.open() as f:
        for line in f:
            row = json.loads(line)
            text = f"{row['title']}\n{row['text']}" if row.get("title") else row["text"]
            batch.append(text)
            text_bytes += len(text.encode("utf-8"))
            chars += len(text)
            if chars >= BASELINE_BATCH_CHARS:
                encode()
                batch, chars = [], 0
    if batch:
        encode()
    return {
        "text_mb": round(text_bytes / 1e6, 1),
        "tokens": tokens,
        "encode_seconds": round(encoding_seconds, 2),
        "mb_per_s": round(text_bytes / 1e6 / encoding_seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, required=True, help="size of the synthetic corpus")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_pretrain_data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the workspace (the corpus is always kept)")
    parser.add_argument("--compare", type=Path, help="the JSON of a run on a smaller corpus: RSS growth against it")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    corpus = write_corpus(
        args.workdir / f"corpus-{args.gigabytes:g}gb-seed{args.seed}.jsonl", args.gigabytes, args.seed
    )
    print(f"corpus: {corpus} ({corpus.stat().st_size / 1e9:.2f} GB, {time.perf_counter() - started:.0f}s)", flush=True)
    ws = args.workdir / f"ws-{args.gigabytes:g}gb"
    shutil.rmtree(ws, ignore_errors=True)
    marks = {
        "sample_read": "training a ",
        "tokenizer_trained": "tokenizer trained",
        "tokenized": "tokenized:",
        "first_step": "step 1/",
    }
    command = ["pretrain", "-w", str(ws), "--data", str(corpus), "--max-steps", "2", "--no-adapt"]
    measured = run_measured([*command, "--vocab-size", "32768", "--log-every", "1"], marks)
    print("\n".join(measured["log"]), flush=True)
    meta = json.loads((ws / "data" / "meta.json").read_text())
    sample = meta["tokenizer_sample"]
    phases = {
        "read_and_sample_s": measured["sample_read"]["seconds"],
        "tokenizer_training_s": round(measured["tokenizer_trained"]["seconds"] - measured["sample_read"]["seconds"], 2),
        "tokenization_s": round(measured["tokenized"]["seconds"] - measured["tokenizer_trained"]["seconds"], 2),
        "first_step_s": round(measured["first_step"]["seconds"] - measured["tokenized"]["seconds"], 2),
    }
    tokenize_mb_per_s = sample["text_bytes"] / 1e6 / phases["tokenization_s"]
    print("baseline: the tokenizer's encode_batch over the same texts, all threads ...", flush=True)
    baseline = encode_batch_baseline(corpus, ws / "tokenizer" / "tokenizer.json")
    result = {
        "gigabytes": args.gigabytes,
        "corpus_bytes": corpus.stat().st_size,
        "documents": sample["documents"],
        "text_mb": round(sample["text_bytes"] / 1e6, 1),
        "tokenizer_sample": sample["sample"],
        "train_tokens": meta["train_tokens"],
        "val_tokens": meta["val_tokens"],
        "validation": meta["validation"],
        "shards": {split: len(entries) for split, entries in meta["shards"].items()},
        "phases": phases,
        "preparation_peak_rss_gb": measured["tokenized"]["peak_rss_gb"],
        "peak_rss_gb": measured["peak_rss_gb"],
        "tokenize_mb_per_s": round(tokenize_mb_per_s, 2),
        "encode_batch_baseline": baseline,
        "tokenize_vs_encode_batch": round(tokenize_mb_per_s / baseline["mb_per_s"], 3),
        "wall_s": measured["seconds"],
        "targets": TARGETS,
    }
    result["met"] = {
        "preparation_peak_rss_gb": result["preparation_peak_rss_gb"] <= TARGETS["preparation_peak_rss_gb"],
        "tokenize_vs_encode_batch": result["tokenize_vs_encode_batch"] >= TARGETS["tokenize_vs_encode_batch"],
    }
    if args.compare:
        smaller = json.loads(args.compare.read_text())
        growth = result["preparation_peak_rss_gb"] / smaller["preparation_peak_rss_gb"]
        result["rss_growth"] = {"against": smaller["gigabytes"], "ratio": round(growth, 3)}
        result["met"]["rss_growth_4x"] = growth <= TARGETS["rss_growth_4x"]
    path = write_result(f"pretrain_data_{args.gigabytes:g}gb", result)
    print(json.dumps(result, indent=2))
    print(f"written to {path}")
    if not args.keep:
        shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    main()
