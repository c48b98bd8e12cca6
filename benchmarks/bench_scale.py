"""Scale: synthetic abstract-like documents through `pipeline embed`, `pipeline index` and `pipeline serve`,
then a 1% update.

The documents are made here from SciFact with a seed (benchmarks_common.synthetic_documents: a title and 4
to 9 sentences drawn from the whole corpus's abstracts, and a `year`; with --topical, sentences mostly of
one abstract each), written to a JSON-lines file as they are made. Each command runs as a user runs it (a
new process, start-up included); wall time and peak RSS (the process and its children, sampled by psutil
every 50 ms) are measured per command. Then:

- disk: the workspace's size, the store's bytes per chunk, the index's files;
- serving: `pipeline serve`'s start-up (until /health answers) and hybrid search at 16 concurrent
  clients (SciFact's queries, cycled; p50/p99), client and server on this machine;
- filters during retrieval: served hybrid searches one at a time with a filter on the documents' `year`
  (one year, ~3% of the documents; one year and a title word, fewer): every hit must match, and k come back
  whenever k match;
- recall@10 of the dense index against exact search, on SciFact's train queries embedded by the
  workspace's model: exact neighbours found by a pass over the stored vectors in slices;
- a one-off `pipeline search`;
- 1% more documents embedded and indexed (an update), its cost against the full embed + index.

JSON to benchmarks/results/scale-<documents>.json, written after every step (an interrupted run keeps
what it measured; with --keep and --resume a later run goes on from the first step not measured). `--compare`
a smaller run's JSON to report how each figure grew.

    .venv/bin/python benchmarks/bench_scale.py --model WORKSPACE/tuned --documents 2000000 [--compare JSON]

--model: a sentence-transformers directory; the issue's figures are for the static embedder
`pipeline tune` makes (WORKSPACE/tuned after `pipeline pretrain`, whose adaptation runs tune).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from bench_serve import percentiles, served, server_process
from benchmarks_common import SCIFACT, run_measured, running_server, synthetic_documents

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "index_peak_rss_gb": 8,
    "index_rss_growth_2m_to_10m": 1.5,
    "embed_peak_rss_gb": 4,
    "store_bytes_per_chunk": 2500,
    "serve_startup_s": 60,
    "hybrid_p99_ms_at_16": 100,
    "recall_at_10": 0.95,
    "update_ratio": 0.05,
}


def write_documents(path: Path, n: int, seed: int, topical: bool, first_id: int = 0, mode: str = "w") -> None:
    with path.open(mode) as f:
        for document in synthetic_documents(n, seed, first_id=first_id, topical=topical):
            f.write(json.dumps(document) + "\n")


def disk_use(ws: Path) -> dict:
    sizes = {p.relative_to(ws).as_posix(): p.stat().st_size for p in ws.rglob("*") if p.is_file()}
    index = {name: size for name, size in sizes.items() if name.startswith("index/")}
    return {
        "workspace_gb": round(sum(sizes.values()) / 1e9, 3),
        "store_gb": round(sizes.get("pipeline.duckdb", 0) / 1e9, 3),
        "index_gb": round(sum(index.values()) / 1e9, 3),
        "largest_index_files_gb": {
            name: round(size / 1e9, 3) for name, size in sorted(index.items(), key=lambda kv: -kv[1])[:6]
        },
    }


FILTERS = {
    "one_year": {"year": {"eq": 2001}},
    "one_year_and_a_title_word": {"year": {"eq": 2001}, "title": {"contains": "cell"}},
}


def filtered_searches(base: str, queries: list[str], n: int) -> dict:
    """Each of FILTERS with n hybrid searches, one at a time: latency, and the hits that broke the filter or
    came back short of k (a request's count of matching documents is /search's own answer with k = 1000)."""
    import httpx

    found = {}
    with httpx.Client(base_url=base, timeout=600) as client:
        for name, condition in FILTERS.items():
            latencies, wrong, short = [], 0, 0
            for query in queries[:n]:
                params = {"q": query, "k": 10, "mode": "hybrid", "filter": json.dumps(condition)}
                start = time.perf_counter()
                hits = client.get("/search", params=params).raise_for_status().json()["results"]
                latencies.append(time.perf_counter() - start)
                wrong += sum(
                    hit["metadata"].get("year") != 2001 or ("title" in condition and "cell" not in hit["title"].lower())
                    for hit in hits
                )
                if len(hits) < 10:
                    matching = client.get("/search", params={**params, "k": 1000}).raise_for_status().json()
                    short += len(matching["results"]) > len(hits)
            found[name] = {"requests": len(latencies), "hits_breaking_the_filter": wrong, "short_of_k": short}
            found[name].update(percentiles(latencies))
            print(f"filtered ({name}): p50 {found[name]['p50_ms']:.1f} ms, p99 {found[name]['p99_ms']:.1f}", flush=True)
    return found


def dense_recall(ws: Path, queries: list[str]) -> dict:
    """recall@10 of the index's dense search (chunks) against exact search over the stored vectors, read in
    slices; both score the vectors the store holds."""
    from common.store import Store
    from common.vectors import dequantize
    from common.workspace import Workspace
    from search.engine import SearchEngine

    engine = SearchEngine(Workspace(ws))
    vectors = engine.embed_queries(queries)
    found = [
        engine.shards[0].shard.corpus.chunk_ids[positions]
        for positions, _ in engine.shards[0].shard.dense_chunks(vectors, 10, None)
    ]
    best_scores = np.full((len(queries), 10), -np.inf, np.float32)
    best_ids = np.zeros((len(queries), 10), np.int64)
    start = time.perf_counter()
    with Store(ws / "pipeline.duckdb", read_only=True) as store:
        for ids, codes, scales in store.iter_vector_codes(ordered=False):  # not sorting 10 GB first
            scores = vectors @ dequantize(codes, scales).T
            both_scores = np.concatenate([best_scores, scores], axis=1)
            both_ids = np.concatenate([best_ids, np.broadcast_to(ids, scores.shape)], axis=1)
            keep = np.argsort(-both_scores, axis=1, kind="stable")[:, :10]
            best_scores = np.take_along_axis(both_scores, keep, axis=1)
            best_ids = np.take_along_axis(both_ids, keep, axis=1)
    recall = float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, best_ids)]))
    return {"queries": len(queries), "recall_at_10": round(recall, 4), "exact_pass_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", type=Path, required=True, help="sentence-transformers directory (the static embedder tune made)"
    )
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--update-share", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--topical",
        action="store_true",
        help="documents each about one abstract (synthetic_documents' topical) rather than mixing unrelated ones",
    )
    parser.add_argument("--requests", type=int, default=2000, help="hybrid searches in the load test")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--recall-queries", type=int, default=200)
    parser.add_argument("--filtered-queries", type=int, default=100, help="searches per filter")
    parser.add_argument("--workdir", type=Path, default=REPO / "benchmarks" / "results" / "scale-work")
    parser.add_argument("--keep", action="store_true", help="keep the data and workspace afterwards")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with a kept run of the same size (its JSON and --workdir): steps it measured are not run again",
    )
    parser.add_argument("--compare", type=Path, help="a smaller run's JSON: how each figure grew since")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out or REPO / "benchmarks" / "results" / f"scale-{args.documents}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "documents": args.documents,
        "model": str(args.model.resolve()),
        "seed": args.seed,
        "topical": args.topical,
        "targets": TARGETS,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }
    if args.resume:  # the steps measured before keep their figures; the rest are measured now
        result = {**json.loads(out.read_text()), "resumed_with_load_average": os.getloadavg()}
        if result["documents"] != args.documents or not (args.workdir / "ws").is_dir():
            parser.error(f"--resume: {out} is not a kept run of {args.documents:,} documents in {args.workdir}")

    def save():
        out.write_text(json.dumps(result, indent=2) + "\n")

    data, ws = args.workdir / "docs.jsonl", args.workdir / "ws"
    if "data" not in result:
        shutil.rmtree(args.workdir, ignore_errors=True)
        args.workdir.mkdir(parents=True)
        start = time.perf_counter()
        write_documents(data, args.documents, args.seed, args.topical)
        result["data"] = {"bytes": data.stat().st_size, "seconds": round(time.perf_counter() - start, 1)}
    print(f"{args.documents:,} documents, {result['data']['bytes'] / 1e9:.2f} GB", flush=True)
    queries = [json.loads(line)["text"] for line in (SCIFACT / "queries.jsonl").read_text().splitlines()]
    train = {line.split("\t")[0] for line in (SCIFACT / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    train_queries = [
        json.loads(line)["text"]
        for line in (SCIFACT / "queries.jsonl").read_text().splitlines()
        if json.loads(line)["_id"] in train
    ]

    def step(name: str, command: list[str], json_output: bool = True) -> dict:
        if name in result:  # measured before (--resume)
            return result[name]["summary"]
        try:
            measured = run_measured([*command, "-w", str(ws)] + (["--json"] if json_output else []))
        except SystemExit as failed:  # kept in the JSON: how far it got, its time and memory until then
            result[name] = {"failed": str(failed)}
            save()
            raise
        stdout = measured.pop("stdout")
        summary = json.loads(stdout) if json_output else {}
        result[name] = {
            **measured,
            "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list)) or k == "search"},
        }
        print(f"{name}: {measured['seconds']}s, peak RSS {measured['peak_rss_gb']} GB", flush=True)
        save()
        return summary

    embedded = step("embed", ["embed", "--data", str(data), "--model", str(args.model.resolve())])
    indexed = step("index", ["index"])
    result["chunks"] = embedded["chunks"]
    result["embed_docs_per_s"] = round(args.documents / result["embed"]["seconds"], 1)
    result["index"].setdefault(
        "faiss", {key: indexed.get(key) for key in ("type", "reason", "recall_at_10", "search_setting", "lists_path")}
    )
    result["disk"] = disk_use(ws)
    result["store_bytes_per_chunk"] = round(result["disk"]["store_gb"] * 1e9 / embedded["chunks"])
    save()

    if "serve" not in result:
        start = time.perf_counter()
        with running_server(ws, timeout_s=1800) as base:
            result["serve_startup_s"] = round(time.perf_counter() - start, 2)
            print(f"serve started in {result['serve_startup_s']}s", flush=True)
            result["serve"] = served(base, server_process(base), "hybrid", queries, args.requests, args.concurrency)
            save()
            result["filtered"] = filtered_searches(base, queries, args.filtered_queries)
        save()
    print(f"hybrid at {args.concurrency}: p50 {result['serve']['p50_ms']:.1f} ms, p99 {result['serve']['p99_ms']:.1f}")
    step("search_once", ["search", "cancer stem cells"], json_output=False)
    if "dense_recall" not in result:
        result["dense_recall"] = dense_recall(ws, train_queries[: args.recall_queries])
        save()
    print(f"dense recall@10 against exact: {result['dense_recall']['recall_at_10']}", flush=True)

    added = max(1, int(args.documents * args.update_share))
    if data.stat().st_size == result["data"]["bytes"]:  # not appended yet (--resume)
        write_documents(data, added, args.seed + 1, args.topical, first_id=args.documents, mode="a")
    step("update_embed", ["embed", "--data", str(data), "--model", str(args.model.resolve())])
    step("update_index", ["index"])
    full = result["embed"]["seconds"] + result["index"]["seconds"]
    update = result["update_embed"]["seconds"] + result["update_index"]["seconds"]
    result.update(
        {
            "update_documents": added,
            "update_s": round(update, 2),
            "update_ratio": round(update / full, 4),
            "load_average_after": os.getloadavg(),
        }
    )
    if args.compare:
        before = json.loads(args.compare.read_text())
        result["growth_since"] = {
            "documents": before["documents"],
            **{
                f"{name}_peak_rss": round(result[name]["peak_rss_gb"] / before[name]["peak_rss_gb"], 3)
                for name in ("embed", "index", "search_once")
            },
            "embed_docs_per_s": round(result["embed_docs_per_s"] / before["embed_docs_per_s"], 3),
        }
    save()
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=2))


if __name__ == "__main__":
    main()
