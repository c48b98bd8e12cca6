"""Issue 49's fourth candidate: the pretrained transformer's pooled states as a second, cheap feature fused with
the adapted static embedder's. For a workspace after the chain (its `tuned/` static embedder and its `model/`
GPT-2, unadapted), dense nDCG@10 on a BEIR collection's train queries (never its test queries) of the static
embedder alone, the transformer's mean-pooled states alone, and their cosine scores added with the transformer's
weighted by w. Run on a pretrained workspace and on its random-init twin to see what pretraining adds:

    .venv/bin/python benchmarks/bench_fused_states.py --workspace WS [--workspace WS_RANDOM] [--data BEIR_DIR]

Results: benchmarks/results/2026-11-29-issue49-candidates-cpu.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytrec_eval
from bench_static_init import read_beir
from sentence_transformers import SentenceTransformer

from benchmarks_common import SCIFACT, write_result

WEIGHTS = (0.1, 0.2, 0.3, 0.5, 1.0)


def ndcg_at_10(scores: np.ndarray, query_ids: list[str], doc_ids: list[str], qrels: dict) -> float:
    run = {}
    for row, query in zip(scores, query_ids):
        top = np.argpartition(-row, 10)[:10]
        run[query] = {doc_ids[j]: float(row[j]) for j in top}
    found = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return round(float(np.mean([v["ndcg_cut_10"] for v in found.values()])), 4)


def scores_of(model: SentenceTransformer, queries: list[str], texts: list[str]) -> np.ndarray:
    encode = dict(batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    return model.encode(queries, **encode) @ model.encode(texts, **encode).T


def measure(workspace: Path, docs: list[dict], queries: dict, qrels: dict) -> dict:
    query_ids = list(qrels)
    texts = [f"{d['title']}\n{d['text']}" for d in docs]
    doc_ids = [d["_id"] for d in docs]
    asked = [queries[q] for q in query_ids]
    static = scores_of(SentenceTransformer(str(workspace / "tuned"), device="cpu"), asked, texts)
    states = scores_of(SentenceTransformer(str(workspace / "model"), device="cpu"), asked, texts)
    row = {
        "static": ndcg_at_10(static, query_ids, doc_ids, qrels),
        "states": ndcg_at_10(states, query_ids, doc_ids, qrels),
    }
    row.update({f"static + {w} states": ndcg_at_10(static + w * states, query_ids, doc_ids, qrels) for w in WEIGHTS})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, action="append", required=True, help="a workspace after the chain")
    parser.add_argument("--data", type=Path, default=SCIFACT, help="a BEIR folder with qrels/train.tsv")
    args = parser.parse_args()
    docs, queries, qrels = read_beir(args.data)
    rows = {}
    for workspace in args.workspace:
        rows[str(workspace)] = measure(workspace, docs, queries, qrels)
        for name, value in rows[str(workspace)].items():
            print(f"{workspace}  {name:22s} {value:.4f}", flush=True)
    write_result("fused_states", {"data": str(args.data), "train_queries": len(qrels), "workspaces": rows})


if __name__ == "__main__":
    main()
