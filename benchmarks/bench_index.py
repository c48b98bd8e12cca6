"""Index build time, search latency per query and recall@10 of the index types built in memory (flat, HNSW;
IVF indexes are built from a store in slices: benchmarks/bench_scale.py measures them).

Two vector sets: the chunk vectors of all SciFact documents embedded by the workspace's pretrained
tiny model (through `pipeline embed`), and 100,000 random unit vectors of the same dimension (where
approximate indexes start to pay off). Exact search (flat) is the baseline in the same run.

    python benchmarks/bench_index.py [--workspace DIR] [--synthetic N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks_common import SCIFACT, pipeline, pretrained_workspace, write_result


def measure(kind: str, ids: np.ndarray, vectors: np.ndarray, queries: np.ndarray) -> dict:
    import faiss

    from common.dense.index_types import exact_neighbours, make_index, recall_at_10

    start = time.perf_counter()
    index = make_index(kind, vectors, ids)
    build_s = time.perf_counter() - start
    latencies = []
    for q in queries:  # one query at a time, as a user's searches arrive
        t = time.perf_counter()
        index.search(q[None, :], 10)
        latencies.append(time.perf_counter() - t)
    return {
        "type": kind,
        "vectors": int(len(ids)),
        "build_s": build_s,
        "search_ms_p50": 1000 * float(np.percentile(latencies, 50)),
        "search_ms_p99": 1000 * float(np.percentile(latencies, 99)),
        "recall_at_10": 1.0
        if kind == "flat"
        else recall_at_10(lambda q, k: index.search(q, k)[1], *exact_neighbours(ids, vectors, sample=len(queries))),
        "bytes": int(faiss.serialize_index(index).nbytes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path(tempfile.gettempdir()) / "bench-scifact-ws")
    parser.add_argument("--synthetic", type=int, default=100_000)
    args = parser.parse_args()

    from common.store import Store

    ws = pretrained_workspace(args.workspace)
    if not (ws / "pipeline.duckdb").exists():
        pipeline("embed", "-w", str(ws), "--data", str(SCIFACT / "corpus.jsonl"))
    with Store(ws / "pipeline.duckdb", read_only=True) as store:
        ids, vectors = store.load_vectors()
    rng = np.random.default_rng(0)
    sets = {"scifact_chunks": (ids, vectors)}
    synthetic = rng.standard_normal((args.synthetic, vectors.shape[1])).astype(np.float32)
    synthetic /= np.linalg.norm(synthetic, axis=1, keepdims=True)
    sets["random_unit"] = (np.arange(args.synthetic, dtype=np.int64), synthetic)

    results = {}
    for name, (set_ids, set_vectors) in sets.items():
        queries = set_vectors[rng.choice(len(set_vectors), 300, replace=False)]
        rows = [measure(kind, set_ids, set_vectors, queries) for kind in ("flat", "hnsw")]
        flat = rows[0]
        for row in rows:
            row["speedup_vs_flat_p50"] = flat["search_ms_p50"] / row["search_ms_p50"]
        results[name] = rows
    write_result("index", {"sets": results})


if __name__ == "__main__":
    main()
