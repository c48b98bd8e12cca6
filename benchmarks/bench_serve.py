"""Serving speed: a real `pipeline serve` (uvicorn) on loopback, an httpx client at 16 concurrent
requests, per mode; and the in-process cost per query of each step of a search.

The workspace is full SciFact (5,183 documents) with the model `pipeline pretrain` makes, adapted by its
default `pipeline tune` (reused when the workspace already has it). Queries are SciFact's own, cycled.
Client and server share this machine (2 cores here): the figures include the client's own cost.

    python benchmarks/bench_serve.py [--workspace DIR] [--time-budget 12m] [--requests 2000] [--concurrency 16]
    python benchmarks/bench_serve.py --ray --shards 1,2,4 [--replicas 1]

With --ray: the single-process server first (the baseline, same run), then for each shard count a copy of the
workspace indexed with `--shards N` and served by `pipeline serve --ray local` (Ray Serve on this machine: the
proxy, the ingress and a replica per shard are processes of their own), loaded the same way. Server CPU is then
the machine's busy CPU time less the client's, per request: Ray's own processes included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks_common import SCIFACT, pipeline, running_server, write_result

MODES = ("lexical", "dense", "hybrid")


def prepared_workspace(path: Path, time_budget: str) -> Path:
    """pretrain (with its default adaptation) -> embed -> index on all of SciFact, each step only if missing."""
    if not (path / "model" / "config.json").exists():
        pipeline("pretrain", "-w", str(path), "--data", str(SCIFACT / "corpus.jsonl"), "--time-budget", time_budget)
    if not (path / "pipeline.duckdb").exists():
        pipeline("embed", "-w", str(path))
    if "index" not in json.loads((path / "manifest.json").read_text()):
        pipeline("index", "-w", str(path))
    return path


def percentiles(seconds: list[float]) -> dict:
    ms = 1000 * np.asarray(seconds)
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
    }


def step_costs(ws: Path, queries: list[str]) -> dict:
    """In-process cost per query of each step, one query at a time (as requests arrive)."""
    import faiss
    import torch

    from common.workspace import Workspace
    from search.engine import FUSION_DEPTH, HYBRID_WALK_BUDGET, SearchEngine, fuse

    torch.set_num_threads(1)  # as `pipeline serve` runs
    faiss.omp_set_num_threads(1)
    engine = SearchEngine(Workspace(ws))
    fetch = engine.shards[0].first_fetch(FUSION_DEPTH, len(engine.shards[0].shard.corpus.chunk_ids))
    costs = {
        name: []
        for name in (
            "encode",
            "faiss",
            "bm25",
            "best_chunk_per_document",
            "fusion",
            "row_lookup_and_snippet",
            "search_hybrid_total",
        )
    }
    for query in queries:
        t0 = time.perf_counter()
        vector = engine.embed_queries([query])
        t1 = time.perf_counter()
        engine.shards[0].shard.dense_chunks(vector, fetch, None)
        t2 = time.perf_counter()
        engine.shards[0].shard.lexical.search_positions(query, fetch, None, HYBRID_WALK_BUDGET)
        t3 = time.perf_counter()
        dense = engine.shards[0].shard.dense_documents(vector, FUSION_DEPTH, None)[0]
        lexical = engine.shards[0].shard.lexical_documents(query, FUSION_DEPTH, None, HYBRID_WALK_BUDGET)
        t4 = time.perf_counter()
        ranked = fuse(dense, lexical, 0.5)
        t5 = time.perf_counter()
        engine.hits(query, ranked, 10)
        t6 = time.perf_counter()
        engine.search(query, 10, "hybrid")
        t7 = time.perf_counter()
        costs["encode"].append(t1 - t0)
        costs["faiss"].append(t2 - t1)
        costs["bm25"].append(t3 - t2)
        # both retrievers again, with the growing fetch and one best chunk per document, less the raw searches
        costs["best_chunk_per_document"].append(max(0.0, (t4 - t3) - (t3 - t1)))
        costs["fusion"].append(t5 - t4)
        costs["row_lookup_and_snippet"].append(t6 - t5)
        costs["search_hybrid_total"].append(t7 - t6)
    return {
        "vectors": len(engine.shards[0].shard.corpus.chunk_ids),
        "index_type": engine.shards[0].shard.dense[0].kind,
        "documents": engine.shards[0].shard.corpus.n_documents,
        "steps": {name: percentiles(values) for name, values in costs.items()},
    }


async def load(base: str, mode: str, queries: list[str], n_requests: int, concurrency: int) -> dict:
    """`concurrency` clients, each with its own keep-alive connection, sending requests back to back.
    One httpx client per connection, not one client's pool shared by all: against a server that does
    nothing, a pool shared by 16 tasks made ~500 requests/s with p99 160 ms (its own queueing), 16 clients
    ~1,050 requests/s with p99 18 ms, so the shared pool would measure itself, not the server."""
    import httpx

    latencies, errors, statuses = [], 0, {}
    next_index = 0
    clients = [httpx.AsyncClient(base_url=base, timeout=60) for _ in range(concurrency)]

    async def worker(client):
        nonlocal next_index, errors
        while next_index < n_requests:
            i = next_index
            next_index += 1
            start = time.perf_counter()
            try:
                response = await client.get("/search", params={"q": queries[i % len(queries)], "k": 10, "mode": mode})
                ok = response.status_code == 200
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            errors += not ok

    try:
        for _ in range(2):  # warm-up: connections, caches
            await asyncio.gather(
                *(c.get("/search", params={"q": q, "k": 10, "mode": mode}) for c, q in zip(clients, queries))
            )
        cpu = time.process_time()
        start = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in clients))
        wall = time.perf_counter() - start
        client_cpu = time.process_time() - cpu
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    return {
        "mode": mode,
        "requests": n_requests,
        "concurrency": concurrency,
        "errors": errors,
        "statuses": statuses,
        "requests_per_s": n_requests / wall,
        **percentiles(latencies),
        "client_cpu_ms_per_request": 1000 * client_cpu / n_requests,
    }


def served(base: str, server_pid: int, mode: str, queries: list[str], n_requests: int, concurrency: int) -> dict:
    """One mode's load, with the server's CPU time per request (client and server share the cores)."""
    import psutil

    server = psutil.Process(server_pid)
    before = sum(server.cpu_times()[:2])
    result = asyncio.run(load(base, mode, queries, n_requests, concurrency))
    result["server_cpu_ms_per_request"] = 1000 * (sum(server.cpu_times()[:2]) - before) / (n_requests + 2 * concurrency)
    return result


def served_on_ray(base: str, mode: str, queries: list[str], n_requests: int, concurrency: int) -> dict:
    """One mode's load against Ray Serve, with the machine's CPU time per request beyond the client's."""
    import psutil

    busy = psutil.cpu_times()
    before = busy.user + busy.system
    client_before = sum(psutil.Process().cpu_times()[:2])
    result = asyncio.run(load(base, mode, queries, n_requests, concurrency))
    busy = psutil.cpu_times()
    server_cpu = (busy.user + busy.system - before) - (sum(psutil.Process().cpu_times()[:2]) - client_before)
    result["server_cpu_ms_per_request"] = 1000 * server_cpu / (n_requests + 2 * concurrency)
    return result


def ray_scale_out(ws: Path, shard_counts: list[int], replicas: int, queries, args) -> list[dict]:
    """For each shard count: a copy of `ws` indexed in that many shards, served on Ray Serve, loaded per mode."""
    import shutil

    results = []
    for shards in shard_counts:
        copy = Path(tempfile.mkdtemp(prefix=f"bench-ray-{shards}-"))
        try:
            shutil.copytree(ws, copy / "ws")
            pipeline("index", "-w", str(copy / "ws"), "--shards", str(shards))
            start = time.perf_counter()
            with running_server(copy / "ws", "--ray", "local", "--replicas", str(replicas)) as base:
                started = time.perf_counter() - start
                http = [served_on_ray(base, mode, queries, args.requests, args.concurrency) for mode in MODES]
            results.append({"shards": shards, "replicas": replicas, "startup_s": started, "http": http})
        finally:
            shutil.rmtree(copy, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path(tempfile.gettempdir()) / "bench-serve-ws")
    parser.add_argument("--time-budget", default="12m", help="pretraining budget when the workspace has no model yet")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--step-queries", type=int, default=300)
    parser.add_argument("--ray", action="store_true", help="also serve on Ray Serve, sharded (--shards)")
    parser.add_argument("--shards", default="1,2,4", help="with --ray: the shard counts, comma-separated")
    parser.add_argument("--replicas", type=int, default=1, help="with --ray: replicas of each shard")
    args = parser.parse_args()

    ws = prepared_workspace(args.workspace, args.time_budget)
    queries = [
        json.loads(line)["text"] for line in (SCIFACT / "queries.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = step_costs(ws, queries[: args.step_queries])

    with running_server(ws) as base:
        server_pid = server_process(base)
        http = [served(base, server_pid, mode, queries, args.requests, args.concurrency) for mode in MODES]
    result = {
        "workspace": str(ws),
        "in_process": steps,
        "http": http,
        "note": "client and server on the same machine; other jobs may share it: compare ratios within one run",
    }
    if args.ray:
        shard_counts = [int(n) for n in args.shards.split(",")]
        result["ray"] = ray_scale_out(ws, shard_counts, args.replicas, queries, args)
        for run in result["ray"]:  # against the single-process server of this run
            for mode_result, single in zip(run["http"], http):
                mode_result["vs_single_process"] = {
                    "requests_per_s": mode_result["requests_per_s"] / single["requests_per_s"],
                    "p50": mode_result["p50_ms"] / single["p50_ms"],
                    "p99": mode_result["p99_ms"] / single["p99_ms"],
                }
    write_result("serve-ray" if args.ray else "serve", result)


def server_process(base: str) -> int:
    """The pid of the process listening on the server's port."""
    import psutil

    port = int(base.rsplit(":", 1)[1])
    return next(c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port)


if __name__ == "__main__":
    main()
