"""`pipeline index --type auto` at a million vectors: the index it builds, its recall@10 against exact
search on queries it never saw, and its queries/s against exact search's, in one run.

The vectors are synthetic with the structure of real ones, of the workspace embedder's dimension: each
is a random mix of two chunk vectors stored in WORKSPACE (e.g. all of SciFact after `pipeline embed`),
plus noise, normalised; the queries are made the same way and are not indexed. The index is built by
what `pipeline index` runs (index/build.build_faiss: index/faiss_index.py's choose_type, make_index,
tune_search), so its type and search width are auto's. Both searches take the queries in batches of 100
with FAISS's threads (all cores); exact search computes each batch's scores with one matrix product, as
search does. Peak RSS is this process's. JSON to benchmarks/results/million.json.

    .venv/bin/python benchmarks/bench_million.py --workspace WORKSPACE [--vectors 1000000] [--queries 1000]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np

from benchmarks_common import write_result

BATCH = 100


def synthetic_vectors(base: np.ndarray, n: int, seed: int) -> np.ndarray:
    """n unit vectors, each base[i] + w * base[j] + noise (w uniform in [0, 1], noise of norm ~0.5)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, base.shape[1]), np.float32)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        part = (
            base[rng.integers(len(base), size=m)]
            + rng.uniform(0, 1, (m, 1)).astype(np.float32) * base[rng.integers(len(base), size=m)]
        )
        part += rng.standard_normal(part.shape, dtype=np.float32) * np.float32(0.5 / np.sqrt(base.shape[1]))
        out[start : start + m] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return out


def queries_per_second(search, queries: np.ndarray) -> tuple[float, np.ndarray]:
    start, found = time.perf_counter(), []
    for i in range(0, len(queries), BATCH):
        found.append(search(queries[i : i + BATCH]))
    return len(queries) / (time.perf_counter() - start), np.concatenate(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--workspace",
        type=Path,
        required=True,
        help="a workspace after `pipeline embed` (its vectors seed the synthetic ones)",
    )
    parser.add_argument("--vectors", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    args = parser.parse_args()

    import faiss

    from common.index_files import FLAT_BLAS_MIN_QUERIES
    from common.store import Store
    from index.build import build_faiss
    from index.faiss_index import TARGET_RECALL

    with Store(args.workspace / "pipeline.duckdb", read_only=True) as store:
        _, base = store.load_vectors()
    vectors = synthetic_vectors(np.asarray(base), args.vectors, seed=0)
    queries = synthetic_vectors(np.asarray(base), args.queries, seed=1)
    ids = np.arange(args.vectors, dtype=np.int64)
    print(f"{args.vectors:,} vectors of dimension {vectors.shape[1]}, {args.queries:,} queries", flush=True)

    built = build_faiss("auto", ids, vectors, "benchmark")
    index = built["index"]
    faiss.cvar.distance_compute_blas_threshold = (
        FLAT_BLAS_MIN_QUERIES * vectors.shape[1]
    )  # as search sets it (load_index)
    approximate_qps, found = queries_per_second(lambda q: index.search(q, 10)[1], queries)
    exact_qps, truth = queries_per_second(
        lambda q: faiss.knn(q, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)[1], queries
    )
    recall = float(np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, found)]))
    result = {
        "vectors": args.vectors,
        "dim": int(vectors.shape[1]),
        "queries": args.queries,
        "type": built["type"],
        "reason": built["reason"],
        "build_s": built["build_seconds"],
        "search_setting": built["search_setting"],
        "recall_at_10_tuning_sample": built["recall_at_10"],
        "recall_at_10_new_queries": recall,
        "approximate_qps": approximate_qps,
        "exact_qps": exact_qps,
        "speedup": approximate_qps / exact_qps,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "targets": {"recall_at_10": TARGET_RECALL, "speedup": 5},
    }
    write_result("million", result)


if __name__ == "__main__":
    main()
