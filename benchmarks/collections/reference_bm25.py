#!/usr/bin/env python3
"""Reference BM25 scores ("hand-built BM25 with the right analyzer") for the
collections in this folder.

For every collection and analyzer: documents are indexed as title + " " + text
with bm25s.BM25(k1=1.5, b=0.75) (method "lucene", the default), each query is
scored against every document, the top 100 documents with a score above zero
are the run (as a Lucene query would return only matching documents), and
nDCG@10 is computed with pytrec_eval ("ndcg_cut.10") against qrels/train.tsv
and qrels/test.tsv separately.  The mean is taken over all queries of the
qrels file; a query with no matching document scores 0.

Usage:  python reference_bm25.py [--out reference_bm25.json] [collection ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import unicodedata
from pathlib import Path

import bm25s
import numpy as np
import pytrec_eval
import Stemmer
from bm25s.stopwords import STOPWORDS_EN, STOPWORDS_RUSSIAN

HERE = Path(__file__).resolve().parent
TOKEN = re.compile(r"\w\w+")          # the token pattern of bm25s / scikit-learn
TOP_K = 100


# --------------------------------------------------------------------------
# analyzers: str -> list of terms
# --------------------------------------------------------------------------

def word_analyzer(stopwords=(), stemmer: str | None = None):
    """Lower-case, r"\\w\\w+" tokens, drop stop words (compared before
    stemming, as bm25s.tokenize does), then Snowball-stem."""
    stop = frozenset(stopwords)
    stem = Stemmer.Stemmer(stemmer).stemWords if stemmer else (lambda ws: ws)

    def analyze(text: str) -> list[str]:
        return stem([w for w in TOKEN.findall(text.lower()) if w not in stop])
    return analyze


# Han (with 々 and 〇), Hiragana, Katakana (without the middle dot ・ U+30FB),
# Katakana phonetic extensions, half-width Katakana (folded by NFKC anyway).
CJK = ("\u3005\u3007\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff"
       "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002ffff")
CJK_OR_WORD = re.compile(rf"([{CJK}]+)|((?:(?![{CJK}])\w)+)")


def cjk_bigram_analyzer(text: str) -> list[str]:
    """Like Lucene's CJKAnalyzer without stop words: NFKC (width folding),
    lower-case; every run of CJK characters gives its overlapping character
    bigrams (a one-character run gives the character itself); every run of
    other word characters is one term.  No stemming, no stop words."""
    terms = []
    for m in CJK_OR_WORD.finditer(unicodedata.normalize("NFKC", text).lower()):
        run = m.group(1)
        if run is None:
            terms.append(m.group(2))
        elif len(run) == 1:
            terms.append(run)
        else:
            terms.extend(run[i:i + 2] for i in range(len(run) - 1))
    return terms


ANALYZERS = {
    "english": ("lower-case, r'\\w\\w+', bm25s STOPWORDS_EN, Snowball english",
                word_analyzer(STOPWORDS_EN, "english")),
    "english-nostem": ("lower-case, r'\\w\\w+', bm25s STOPWORDS_EN, no stemming",
                       word_analyzer(STOPWORDS_EN, None)),
    "plain": ("lower-case, r'\\w\\w+', no stop words, no stemming",
              word_analyzer((), None)),
    "russian": ("lower-case, r'\\w\\w+', bm25s STOPWORDS_RUSSIAN, Snowball russian",
                word_analyzer(STOPWORDS_RUSSIAN, "russian")),
    "russian-nostem": ("lower-case, r'\\w\\w+', bm25s STOPWORDS_RUSSIAN, no stemming",
                       word_analyzer(STOPWORDS_RUSSIAN, None)),
    "russian-nostop": ("lower-case, r'\\w\\w+', no stop words, Snowball russian",
                       word_analyzer((), "russian")),
    "cjk-bigram": ("NFKC, lower-case, overlapping bigrams of CJK runs (Han, "
                   "Hiragana, Katakana; single-char run -> unigram), other \\w runs "
                   "as words; no stop words, no stemming", cjk_bigram_analyzer),
}

# collection -> (reference analyzer, comparison analyzers)
PLAN = {
    "cranfield": ("english", ["english-nostem", "plain"]),
    "xquad-ru": ("russian", ["russian-nostem", "russian-nostop", "plain", "english"]),
    "jsquad": ("cjk-bigram", ["plain", "english"]),
}


# --------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------

def load(name: str):
    folder = HERE / name
    docs = [json.loads(line) for line in open(folder / "corpus.jsonl", encoding="utf-8")]
    queries = {q["_id"]: q["text"] for q in
               map(json.loads, open(folder / "queries.jsonl", encoding="utf-8"))}
    qrels = {}
    for split in ("train", "test"):
        qrels[split] = {}
        with open(folder / "qrels" / f"{split}.tsv", encoding="utf-8") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                qrels[split].setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return docs, queries, qrels


def bm25_run(docs, queries, analyze) -> dict:
    doc_ids = [d["_id"] for d in docs]
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index([analyze(d["title"] + " " + d["text"]) for d in docs],
                    show_progress=False)
    vocab = retriever.vocab_dict
    run = {}
    for qid, text in queries.items():
        terms = [t for t in analyze(text) if t in vocab]
        if not terms:
            run[qid] = {}
            continue
        scores = retriever.get_scores(terms)
        top = np.argsort(-scores, kind="stable")[:TOP_K]
        run[qid] = {doc_ids[i]: float(scores[i]) for i in top if scores[i] > 0}
    return run


def ndcg10(qrels: dict, run: dict) -> float:
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"})
    per_query = evaluator.evaluate({q: r for q, r in run.items() if q in qrels and r})
    return sum(per_query.get(q, {}).get("ndcg_cut_10", 0.0) for q in qrels) / len(qrels)


def evaluate(name: str) -> dict:
    docs, queries, qrels = load(name)
    main, others = PLAN[name]
    result = {}
    for key in [main] + others:
        description, analyze = ANALYZERS[key]
        run = bm25_run(docs, queries, analyze)
        scores = {"analyzer": f"{key}: {description}",
                  "train": round(ndcg10(qrels["train"], run), 4),
                  "test": round(ndcg10(qrels["test"], run), 4)}
        print(f"{name:10s} {key:16s} train {scores['train']:.4f} test {scores['test']:.4f}",
              flush=True)
        if key == main:
            result.update(scores)
            result["variants"] = {}
        else:
            result["variants"][key] = scores
    result["counts"] = {"docs": len(docs), "queries": len(queries),
                        "train_queries": len(qrels["train"]),
                        "test_queries": len(qrels["test"])}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("collections", nargs="*", default=list(PLAN))
    ap.add_argument("--out", type=Path, default=HERE / "reference_bm25.json")
    args = ap.parse_args()
    results = {}
    if args.out.exists():
        results = json.loads(args.out.read_text(encoding="utf-8"))
    for name in args.collections:
        results[name] = evaluate(name)
    results["_settings"] = {
        "bm25": "bm25s.BM25(k1=1.5, b=0.75, method='lucene'), bm25s "
                + bm25s.__version__,
        "documents": "title + ' ' + text",
        "metric": "pytrec_eval ndcg_cut.10, mean over all queries of the qrels "
                  "file (0 for a query that matches nothing); run = top 100 "
                  "documents with score > 0",
    }
    args.out.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n",
                        encoding="utf-8")


if __name__ == "__main__":
    main()
