"""What a pretrained GPT-2 gives the static embedder before its adaptation (issue 49), measured untuned: a
table of token vectors, a text being the weighted mean of its tokens' vectors, dense nDCG@10 on a BEIR
collection's train queries (never its test queries). Tables:

    wte                   the model's token embeddings, centred (what the adaptation starts from today, beside
                          random columns up to 1,024)
    contextual layer L    each token's mean hidden state at layer L over its occurrences in the corpus
                          (Model2Vec-style distillation of the contextual model into a static table), centred
    contextual, all       every layer's, side by side; and beside random columns up to 1,024
    random                1,024 random columns

Each is weighted by SIF (a / (a + p(token)), as the adaptation's start is); the random table also by the
model's mean surprisal of the token in context, by both, and by -log p(token).

    .venv/bin/python benchmarks/bench_static_init.py --model WS/model [--data BEIR_DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pytrec_eval
import torch
from tokenizers import Tokenizer
from transformers import AutoModel

from benchmarks_common import SCIFACT, write_result

BLOCK = 256  # tokens per sequence the model reads
WIDTH = 1024  # the adapted table's width (embed/tune.py TuneSettings.dimensions)
SIF_A = 1e-3


def read_beir(root: Path) -> tuple[list[dict], dict[str, str], dict[str, dict[str, int]]]:
    docs = [json.loads(line) for line in (root / "corpus.jsonl").open()]
    queries = {row["_id"]: row["text"] for row in map(json.loads, (root / "queries.jsonl").open())}
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels" / "train.tsv").read_text().splitlines()[1:]:
        query, doc, score = line.split("\t")
        qrels.setdefault(query, {})[doc] = int(score)
    return docs, queries, qrels


def corpus_states(model, ids: torch.Tensor, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Each token's mean hidden state per layer ((layers + 1) x vocab x width) and its mean surprisal."""
    width = model.config.n_embd
    sums = torch.zeros(model.config.n_layer + 1, vocab, width)
    surprisal, counts = torch.zeros(vocab, dtype=torch.float64), torch.zeros(vocab, dtype=torch.float64)
    table = model.get_input_embeddings().weight
    with torch.inference_mode():
        for start in range(0, len(ids) - BLOCK + 1, BLOCK * 32):
            batch = ids[start : start + BLOCK * 32]
            batch = batch[: len(batch) // BLOCK * BLOCK].view(-1, BLOCK)
            out = model(input_ids=batch, output_hidden_states=True)
            for layer, states in enumerate(out.hidden_states):
                sums[layer].index_add_(0, batch.reshape(-1), states.reshape(-1, width))
            log_p = torch.log_softmax(out.last_hidden_state[:, :-1] @ table.T, -1)
            nexts = batch[:, 1:]
            surprisal.index_add_(0, nexts.reshape(-1), -log_p.gather(-1, nexts[..., None]).reshape(-1).double())
            counts.index_add_(0, nexts.reshape(-1), torch.ones(nexts.numel(), dtype=torch.float64))
    occurrences = torch.bincount(ids, minlength=vocab).clamp(min=1).float()
    mean_surprisal = (surprisal / counts.clamp(min=1)).numpy()
    mean_surprisal[counts.numpy() == 0] = mean_surprisal[counts.numpy() > 0].max()
    return (sums / occurrences[None, :, None]).numpy(), mean_surprisal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a pretrained workspace's model/ directory")
    parser.add_argument("--data", type=Path, default=SCIFACT, help="a BEIR folder with qrels/train.tsv")
    args = parser.parse_args()
    docs, queries, qrels = read_beir(args.data)
    tokenizer = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    doc_ids = [e.ids for e in tokenizer.encode_batch([f"{d['title']}\n{d['text']}" for d in docs])]
    query_ids = list(qrels)
    query_tokens = [e.ids for e in tokenizer.encode_batch([queries[q] for q in query_ids])]
    frequency = np.bincount(np.concatenate(doc_ids), minlength=vocab) / sum(map(len, doc_ids))
    model = AutoModel.from_pretrained(str(args.model)).eval()
    start = time.perf_counter()
    means, surprisal = corpus_states(model, torch.tensor(np.concatenate(doc_ids)), vocab)
    states_s = time.perf_counter() - start

    def ndcg(table: np.ndarray, weights: np.ndarray) -> float:
        def embed(texts: list[list[int]]) -> np.ndarray:
            out = np.stack([(table[t] * weights[t, None]).mean(0) if t else np.zeros(table.shape[1]) for t in texts])
            return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

        scores = embed(query_tokens) @ embed(doc_ids).T
        run = {}
        for row, query in zip(scores, query_ids):
            top = np.argsort(-row)[:10]
            run[query] = {docs[j]["_id"]: float(row[j]) for j in top}
        found = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
        return round(float(np.mean([v["ndcg_cut_10"] for v in found.values()])), 4)

    def centred(table: np.ndarray) -> np.ndarray:
        table = table - frequency @ table
        return table / max(float(table.std()), 1e-12)

    wte = model.get_input_embeddings().weight.detach().numpy()
    seen = (frequency > 0)[:, None]
    layers = [centred(np.where(seen, layer, wte)) for layer in means]
    contextual = np.concatenate(layers, axis=1)
    random = np.random.default_rng(0).standard_normal((vocab, WIDTH))
    sif = SIF_A / (SIF_A + frequency)
    tables = {
        "wte": centred(wte),
        **{f"contextual layer {i}": layer for i, layer in enumerate(layers)},
        "contextual, all layers": contextual,
        "contextual, all layers + random columns": np.concatenate([contextual, random[:, contextual.shape[1] :]], 1),
        "wte + random columns": np.concatenate([centred(wte), random[:, wte.shape[1] :]], 1),
        "random": random,
    }
    rows = {name: ndcg(table, sif) for name, table in tables.items()}
    weights = {"surprisal": surprisal, "sif x surprisal": sif * surprisal, "-log p": -np.log(frequency + 1e-9)}
    rows.update({f"random, weighted by {name}": ndcg(random, w) for name, w in weights.items()})
    for name, value in rows.items():
        print(f"{name:45s} {value:.4f}")
    write_result(
        "static_init",
        {"model": str(args.model), "data": str(args.data), "train_queries": len(qrels), "states_s": states_s, **rows},
    )


if __name__ == "__main__":
    main()
