"""BM25 (common/lexical/) at N chunks: building it from the store, loading it, and its queries against
the exhaustive scoring it replaced, in one run.

The chunks are synthetic documents made from SciFact with a seed (benchmarks_common.synthetic_documents:
a title and 4 to 9 sentences of the corpus's abstracts), one chunk each, written to a DuckDB store as
`pipeline embed` writes them (with one-dimensional vectors: BM25 reads none). Each step runs in a process
of its own, measured by benchmarks_common.run_measured (wall seconds, peak RSS sampled every 50 ms):

- build: what `pipeline index` does for BM25 (index/build.py): the language detected on a seeded sample,
  then LexicalIndex.write_built reading Store.iter_chunk_rows. The RSS after the imports is reported too.
- query: LexicalIndex.load (seconds, RSS after it), then SciFact's train queries at n=100, one thread
  (wall and CPU time: the CPU time of a query is what it costs when other jobs share the machine):
  search_positions (pruned), and the exhaustive scoring the index had before pruning as the baseline
  (each query word's postings scored and summed over every chunk with np.bincount; the scores it computed
  for every posting when loading are computed here per query, untimed). The two rankings must be equal:
  the same scores, and the same chunks in the same order, but for chunks tied with the n-th score (the
  exhaustive scoring took any of them, pruning takes the first by position).

JSON to benchmarks/results/lexical.json, a run per number of chunks (runs at other sizes are kept).

    cd benchmarks && ../.venv/bin/python bench_lexical.py --chunks 1000000 [--workdir DIR]

--workdir keeps the store (reused by a later run of the same size and seed) and the index there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's modules, not those of an installed copy

QUERY_N = 100
WRITE_GROUP = 20_000  # documents written to the store per transaction


def rss_gb() -> float:
    import psutil

    return round(psutil.Process().memory_info().rss / 2**30, 3)


def write_store(path: Path, chunks: int, seed: int) -> None:
    """A store of `chunks` synthetic documents, one chunk each, as `pipeline embed` publishes them."""
    from benchmarks_common import synthetic_documents
    from common.store import ChunkRow, Store

    with Store(path, bulk=True) as store:
        store.stage(1, "bench-lexical", {})
        documents, rows = [], []
        for i, document in enumerate(synthetic_documents(chunks, seed)):
            text = document["text"]
            documents.append((document["_id"], document["title"], "synthetic", text, str(i), {}))
            rows.append(ChunkRow(i, document["_id"], 0, text, 0, len(text), 0))
            if len(documents) == WRITE_GROUP or i == chunks - 1:
                store.write_documents(documents, rows, np.zeros((len(rows), 1), np.float32))
                documents, rows = [], []
        store.publish(replace_all=True, remove=[])


def build(store_path: Path, index_dir: Path) -> None:
    """The build step (in its own process): BM25 as `pipeline index` builds it."""
    from common.lexical import LexicalIndex, choose_analyzer
    from common.store import Store
    from index.build import language_sample

    imported_rss = rss_gb()
    start = time.perf_counter()
    with Store(store_path, read_only=True) as store:
        live = store.chunk_ids()
        sample = [text for batch in store.iter_chunk_rows(language_sample(live)) for _, _, text in batch]
        analyzer, _ = choose_analyzer(sample)
        index_dir.mkdir()
        LexicalIndex.write_built(index_dir, store.iter_chunk_rows(), analyzer)
    print(json.dumps({"build_seconds": time.perf_counter() - start, "rss_after_imports_gb": imported_rss}))


class Stopwatch:
    """Wall and CPU (this thread's) seconds of the sections timed: on a machine other jobs share, CPU time is
    what the work cost, wall time what a user waited."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    @contextlib.contextmanager
    def timing(self):
        wall, cpu = time.perf_counter(), time.thread_time()
        yield
        self.wall += time.perf_counter() - wall
        self.cpu += time.thread_time() - cpu


def exhaustive_search(index, query: str, n: int, watch: Stopwatch) -> tuple[np.ndarray, np.ndarray]:
    """The ranking before pruning: (positions, scores). What it computed for every posting when loading (each
    one's live position and score) is computed here for the query's terms, outside `watch`."""
    with watch.timing():
        terms = [index.vocabulary[t] for t in index.analyzer.query_terms(query) if t in index.vocabulary]
    if not terms:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    total = len(index.chunk_ids)
    positions, scores = [], []
    for term in terms:
        for live in index.live_segments:
            segment = live.segment
            if term < len(segment.indptr) - 1:
                postings = slice(segment.indptr[term], segment.indptr[term + 1])
                rows, tf = segment.rows[postings], segment.tfs[postings].astype(np.float32)
                positions.append(np.where(live.positions[rows] >= 0, live.positions[rows], total))
                scores.append(index.idf[term] * tf / (tf + live.norms[rows]))
    with watch.timing():
        summed = np.bincount(np.concatenate(positions), weights=np.concatenate(scores), minlength=total + 1)[:total]
        found = np.flatnonzero(summed > 0)
        if len(found) > n:
            found = found[np.argpartition(-summed[found], n - 1)[:n]]
        found = found[np.lexsort((found, -summed[found]))]
    return found, summed[found].astype(np.float32)


def percentiles(seconds: list[float]) -> dict:
    ms = np.array(seconds) * 1000
    return {key: round(float(np.percentile(ms, q)), 3) for key, q in (("p50", 50), ("p90", 90), ("p99", 99))} | {
        "mean": round(float(ms.mean()), 3),
        "max": round(float(ms.max()), 3),
    }


def query(index_dir: Path, scifact: Path) -> None:
    """The query step (in its own process): loading, then the train queries, pruned and exhaustive."""
    from common.lexical import LexicalIndex

    imported_rss = rss_gb()
    start = time.perf_counter()
    index = LexicalIndex.load(index_dir)
    load_seconds, loaded_rss = time.perf_counter() - start, rss_gb()
    judged = {line.split("\t")[0] for line in (scifact / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    rows = [json.loads(line) for line in (scifact / "queries.jsonl").read_text().splitlines()]
    queries = [row["text"] for row in rows if row["_id"] in judged]
    for text in queries[:20]:  # warm-up
        index.search_positions(text, QUERY_N)
    pruned, exhaustive, differing = [], [], []
    for text in queries:
        pruned.append(Stopwatch())
        with pruned[-1].timing():
            positions, scores = index.search_positions(text, QUERY_N)
        exhaustive.append(Stopwatch())
        want_positions, want_scores = exhaustive_search(index, text, QUERY_N, exhaustive[-1])
        # The exhaustive scoring took any of the chunks tied with its n-th score (np.argpartition), pruning
        # the first by position: the chunks scoring above that must be the same, in the same order.
        above = want_scores > want_scores[-1] if len(want_scores) else []
        if not np.array_equal(scores, want_scores) or positions[above].tolist() != want_positions[above].tolist():
            differing.append(text)
    pruned_ms, exhaustive_ms = percentiles([w.wall for w in pruned]), percentiles([w.wall for w in exhaustive])
    pruned_cpu_ms, exhaustive_cpu_ms = percentiles([w.cpu for w in pruned]), percentiles([w.cpu for w in exhaustive])
    print(
        json.dumps(
            {
                "load_seconds": round(load_seconds, 3),
                "rss_after_imports_gb": imported_rss,
                "rss_after_load_gb": loaded_rss,
                "rss_after_queries_gb": rss_gb(),
                "queries": len(queries),
                "n": QUERY_N,
                "pruned_ms": pruned_ms,
                "exhaustive_ms": exhaustive_ms,
                "speedup_p50": round(exhaustive_ms["p50"] / pruned_ms["p50"], 1),
                "speedup_p99": round(exhaustive_ms["p99"] / pruned_ms["p99"], 1),
                "pruned_cpu_ms": pruned_cpu_ms,
                "exhaustive_cpu_ms": exhaustive_cpu_ms,
                "cpu_speedup_p50": round(exhaustive_cpu_ms["p50"] / pruned_cpu_ms["p50"], 1),
                "cpu_speedup_p99": round(exhaustive_cpu_ms["p99"] / pruned_cpu_ms["p99"], 1),
                "rankings_equal": not differing,
                "differing_queries": differing[:10],
            }
        )
    )


def main() -> None:
    # Here, not above: it imports torch, which the measured steps (this file in processes of their own) do not.
    from benchmarks_common import RESULTS, SCIFACT, run_measured, write_result

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, help="keeps the store and the index (default: a temporary directory)")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-lexical-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_path, index_dir = workdir / f"store-{args.chunks}-{args.seed}.duckdb", workdir / f"lexical-{args.chunks}"
    try:
        run = {"chunks": args.chunks, "seed": args.seed}
        if not store_path.exists():
            start = time.perf_counter()
            write_store(store_path, args.chunks, args.seed)
            run["store_seconds"] = round(time.perf_counter() - start, 1)
        shutil.rmtree(index_dir, ignore_errors=True)
        built = run_measured(["build", str(store_path), str(index_dir)], script=Path(__file__).resolve())
        run["build"] = {"seconds": built["seconds"], "peak_rss_gb": built["peak_rss_gb"], **json.loads(built["stdout"])}
        run["index_gb"] = round(sum(f.stat().st_size for f in index_dir.rglob("*") if f.is_file()) / 2**30, 3)
        queried = run_measured(["query", str(index_dir), str(SCIFACT)], script=Path(__file__).resolve())
        run["query"] = {"peak_rss_gb": queried["peak_rss_gb"], **json.loads(queried["stdout"])}
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    previous = RESULTS / "lexical.json"
    runs = json.loads(previous.read_text()).get("runs", {}) if previous.exists() else {}
    write_result("lexical", {"runs": {**runs, str(args.chunks): run}})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "build":
        build(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "query":
        query(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
