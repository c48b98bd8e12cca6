"""Issue 49: could the pretrained GPT-2 write the adaptation's training queries (doc2query, InPars)? Pseudo-queries
help a retriever with the words a real query uses that its document lacks. For each judged (train query,
document) pair of a BEIR collection (never its test queries), this samples continuations of the document from a
workspace's model and counts how many of the query's content words missing from the document the continuations
produce. The same count for words drawn by their corpus frequency (a unigram model: no knowledge of the
document) is the floor any useful generator must clear:

    .venv/bin/python benchmarks/probe_generation.py --workspace WS [--workspace WS_RANDOM] [--data BEIR_DIR]

Results: benchmarks/results/2026-11-29-issue49-candidates-cpu.md.
"""

from __future__ import annotations

import argparse
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from bench_static_init import read_beir
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from benchmarks_common import SCIFACT, write_result

PROMPT_TOKENS = 100  # of the document: title and the start of its text
SAMPLES = 5  # continuations per document
NEW_TOKENS = 24  # a query's length, about
WORD = re.compile(r"[a-z][a-z0-9-]{2,}")  # content words: 3+ characters, lower-cased; stop words removed below


def words(text: str, stop: set[str]) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if w not in stop}


def continuations(workspace: Path, prompts: list[str], seed: int) -> list[str]:
    """SAMPLES continuations of each prompt, NEW_TOKENS long, top-50 sampling at temperature 0.8."""
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(workspace / "model" / "tokenizer.json"))
    model = GPT2LMHeadModel.from_pretrained(workspace / "model").eval()
    torch.manual_seed(seed)
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt)["input_ids"][:PROMPT_TOKENS]]).repeat(SAMPLES, 1)
            made = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                do_sample=True,
                top_k=50,
                temperature=0.8,
                pad_token_id=0,
            )
            out.append(" ".join(tokenizer.decode(row[ids.shape[1] :]) for row in made))
    return out


def gap_recall(generated: list[set[str]], gaps: list[set[str]]) -> float:
    """Of the query words missing from their documents, the share the generated words contain."""
    found = sum(len(g & w) for g, w in zip(gaps, generated))
    return found / max(1, sum(len(g) for g in gaps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, action="append", required=True)
    parser.add_argument("--data", type=Path, default=SCIFACT)
    parser.add_argument("--pairs", type=int, default=300, help="judged (query, document) pairs drawn")
    args = parser.parse_args()

    docs, queries, qrels = read_beir(args.data)
    by_id = {d["_id"]: d for d in docs}
    rng = random.Random(0)
    judged = [(q, d) for q, found in qrels.items() for d, score in found.items() if score > 0 and d in by_id]
    judged = rng.sample(judged, min(args.pairs, len(judged)))
    counts = Counter(w for d in docs for w in WORD.findall((d["title"] + " " + d["text"]).lower()))
    stop = {w for w, _ in counts.most_common(100)}  # the corpus's most frequent words carry no topic
    texts = [by_id[d]["title"] + "\n" + by_id[d]["text"] for _, d in judged]
    gaps = [words(queries[q], stop) - words(text, stop) for (q, _), text in zip(judged, texts)]

    # the floor: as many words as the continuations hold, drawn by corpus frequency, the document's own words kept
    vocab, weights = zip(*((w, c) for w, c in counts.items() if w not in stop))
    p = np.array(weights, dtype=float) / sum(weights)
    draw = np.random.default_rng(0)
    result = {"data": str(args.data), "pairs": len(judged), "query_words_missing": sum(map(len, gaps))}
    for workspace in args.workspace:
        generated = [words(t, stop) for t in continuations(workspace, texts, seed=0)]
        unigram = [set(draw.choice(vocab, size=max(1, len(g)), p=p)) for g in generated]
        result[str(workspace)] = {
            "gap_recall": round(gap_recall(generated, gaps), 4),
            "unigram_gap_recall": round(gap_recall(unigram, gaps), 4),
            "content_words_per_document": round(float(np.mean([len(g) for g in generated])), 1),
        }
    write_result("probe_generation", result)


if __name__ == "__main__":
    main()
