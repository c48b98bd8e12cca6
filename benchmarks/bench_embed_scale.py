"""`pipeline embed` as the collection grows: documents/s and peak RSS per size, and the store's bytes per chunk.

Synthetic abstract-like documents (benchmarks_common.synthetic_documents: SciFact sentences recombined with a
seed; each size is the first N of one sequence) are written to a JSON-lines file, and each size is embedded
into a new workspace by `pipeline embed --data FILE --model MODEL`, as a user runs it: a new process, whose
wall time and peak RSS (with its children, sampled every 50 ms) benchmarks_common.run_measured measures.
Per size: documents/s by wall time and by embed's own timer (from the first chunk embedded to the publish),
peak RSS, CPU seconds (user and system, of the process and its children: less swayed than wall time by
other work on the machine, whose load average is recorded before and after each size), and the store
file's bytes per chunk, split into the vectors' blocks and the rest (documents, chunk texts, ids: DuckDB's
`pragma_storage_info`), with what a chunk would take with int8 vectors (1,024 bytes and a 4-byte scale).
JSON to benchmarks/results/embed_scale.json, written after every size.

    .venv/bin/python benchmarks/bench_embed_scale.py --model WORKSPACE/tuned --documents 100000 1000000

What grows with the collection apart from its texts and vectors (ids, hashes, keys, the run's bookkeeping)
shows at ten million documents without their gigabytes: one sentence per document (--sentences 1 1) and a
static embedder of a few random dimensions over the model's tokenizer (--random-static-dim 16):

    .venv/bin/python benchmarks/bench_embed_scale.py --model WORKSPACE/tuned --documents 100000 10000000 \\
        --sentences 1 1 --random-static-dim 16 --out benchmarks/results/embed_scale_bookkeeping.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
from pathlib import Path

import duckdb
import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from benchmarks_common import RESULTS, run_measured, synthetic_documents

INT8_VECTOR_BYTES = 1024 + 4


def write_documents(path: Path, n: int, seed: int, sentences: tuple[int, int]) -> None:
    with path.open("w") as f:
        for document in synthetic_documents(n, seed, sentences=sentences):
            f.write(json.dumps(document) + "\n")


def random_static_model(model: Path, dim: int, directory: Path) -> Path:
    """A static embedder of `dim` random dimensions over the tokenizer of the static embedder `model`."""
    directory.mkdir()
    for name in ("tokenizer.json", "modules.json"):
        shutil.copy(model / name, directory)
    vocabulary = Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab_size()
    table = np.random.default_rng(0).standard_normal((vocabulary, dim)).astype(np.float32)
    save_file({"embedding.weight": table}, str(directory / "model.safetensors"))
    return directory


def cpu_seconds_of_children() -> float:
    """User and system CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def store_bytes(db_path: Path, chunks: int) -> dict:
    """The store file's bytes per chunk, the vectors' blocks apart from the rest."""
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        block_size = con.execute("SELECT block_size FROM pragma_database_size()").fetchall()[0][0]
        vector_blocks = con.execute(
            "SELECT count(DISTINCT block_id) FROM pragma_storage_info('vectors') WHERE persistent"
        ).fetchall()[0][0]
    finally:
        con.close()
    file_bytes = db_path.stat().st_size
    rest = file_bytes - vector_blocks * block_size
    return {
        "file_bytes": file_bytes,
        "bytes_per_chunk": round(file_bytes / chunks, 1),
        "vector_bytes_per_chunk": round(vector_blocks * block_size / chunks, 1),
        "other_bytes_per_chunk": round(rest / chunks, 1),
        "int8_bytes_per_chunk": round(rest / chunks + INT8_VECTOR_BYTES, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="sentence-transformers directory (e.g. WS/tuned)")
    parser.add_argument("--documents", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentences", type=int, nargs=2, default=(4, 9), metavar=("MIN", "MAX"))
    parser.add_argument("--random-static-dim", type=int, help="embed with random vectors of this width instead")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where data and stores go")
    parser.add_argument("--out", type=Path, default=RESULTS / "embed_scale.json")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "model": str(args.model.resolve()),
        "random_static_dim": args.random_static_dim,
        "sentences": args.sentences,
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-embed-scale-", dir=args.tmp) as tmp:
        tmp = Path(tmp)
        model = args.model.resolve()
        if args.random_static_dim:
            model = random_static_model(model, args.random_static_dim, tmp / "model")
        for n in sorted(args.documents):
            data, ws = tmp / f"docs-{n}.jsonl", tmp / f"ws-{n}"
            write_documents(data, n, args.seed, tuple(args.sentences))
            load_before, cpu_before = os.getloadavg(), cpu_seconds_of_children()
            measured = run_measured(["embed", "--data", str(data), "--model", str(model), "-w", str(ws), "--json"])
            cpu = cpu_seconds_of_children() - cpu_before
            summary = json.loads(measured.pop("stdout"))
            size = {
                "documents": n,
                "chunks": summary["chunks"],
                "data_bytes": data.stat().st_size,
                "seconds": measured["seconds"],
                "docs_per_s": round(n / measured["seconds"], 1),
                "embed_seconds": round(summary["seconds"], 2),
                "embed_docs_per_s": round(summary["docs_per_s"], 1),
                "peak_rss_gb": measured["peak_rss_gb"],
                "cpu_seconds": round(cpu, 1),
                "cpu_ms_per_document": round(cpu * 1000 / n, 3),
                "store": store_bytes(ws / "pipeline.duckdb", summary["chunks"]),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
            }
            result["sizes"].append(size)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(size), flush=True)
            shutil.rmtree(ws)
            data.unlink()


if __name__ == "__main__":
    main()
