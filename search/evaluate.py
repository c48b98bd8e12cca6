"""`pipeline eval`: retrieval quality on BEIR-format queries and relevance judgements.

    queries.jsonl   one JSON object per line: {"_id": "q1", "text": "..."}
    qrels.tsv       query-id <TAB> corpus-id <TAB> score, with a header line (BEIR's format)

Document ids in the qrels are the stored doc_ids (the `_id`/`id` fields of the embedded files).
Metrics come from pytrec_eval (trec_eval's own code): nDCG@10, Recall@100, MRR@10. Only queries
that have judgements are run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytrec_eval

from common.console import info
from common.errors import PipelineError
from common.readers import read_json_lines
from search.engine import SearchEngine
from search.filters import DocumentFilter
from search.settings import MODES


def read_queries(path: Path) -> dict[str, str]:
    if not path.is_file():
        raise PipelineError(f"{path}: no such file")
    queries: dict[str, str] = {}
    for line_no, row in read_json_lines(path):
        qid = row.get("_id", row.get("id"))
        text = row.get("text", row.get("query"))
        if qid is None or not isinstance(text, str) or not text.strip():
            raise PipelineError(f'{path}:{line_no}: a query needs an "_id" and a non-empty "text"')
        queries[str(qid)] = text
    if not queries:
        raise PipelineError(f"{path}: no queries")
    return queries


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    if not path.is_file():
        raise PipelineError(f"{path}: no such file")
    qrels: dict[str, dict[str, int]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise PipelineError(f"{path}: not UTF-8 text") from None
    for line_no, line in enumerate(lines, start=1):
        fields = line.split("\t") if "\t" in line else line.split()
        if not line.strip():
            continue
        if line_no == 1 and not fields[-1].strip().lstrip("-").isdigit():
            continue  # the header: query-id corpus-id score
        if len(fields) == 4:  # TREC's query-id 0 doc-id relevance
            fields = [fields[0], fields[2], fields[3]]
        if len(fields) != 3 or not fields[2].strip().lstrip("-").isdigit():
            raise PipelineError(
                f"{path}:{line_no}: expected query-id, corpus-id and an integer score separated by tabs"
            )
        qid, doc_id, score = (x.strip() for x in fields)
        qrels.setdefault(qid, {})[doc_id] = int(score)
    if not qrels:
        raise PipelineError(f"{path}: no relevance judgements")
    return qrels


@dataclass(frozen=True)
class ModeScores:
    """One mode's scores on the judged queries: a row of `pipeline eval`, its --json object by to_json."""

    mode: str
    queries: int  # the judged queries that have a text
    skipped_queries: int  # judged but with no text in the queries file
    depth: int
    dense_weight: float | None  # the hybrid's; None for the other modes
    ndcg_at_10: float
    recall_at_100: float
    mrr_at_10: float
    seconds: float
    queries_per_s: float | None

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            "queries": self.queries,
            "skipped_queries": self.skipped_queries,
            "depth": self.depth,
            "dense_weight": self.dense_weight,
            "ndcg@10": self.ndcg_at_10,
            "recall@100": self.recall_at_100,
            "mrr@10": self.mrr_at_10,
            "seconds": self.seconds,
            "queries_per_s": self.queries_per_s,
        }


def evaluate(
    engine: SearchEngine,
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    mode: str | None = None,
    depth: int = 100,
    dense_weight: float | None = None,
    filters: DocumentFilter | None = None,
) -> ModeScores:
    """Run every judged query and score the rankings (only among the documents `filters` keeps, if given)."""
    judged = [q for q in qrels if q in queries]
    if not judged:
        raise PipelineError("no query in the qrels file has a text in the queries file (are the ids the same?)")
    mode = engine.resolve_mode(mode)
    info(f"{mode}: searching {len(judged):,} judged queries (top {depth})")
    start = time.perf_counter()
    results = engine.search_many(
        [queries[q] for q in judged], k=depth, mode=mode, filters=filters, dense_weight=dense_weight, names=judged
    )
    seconds = time.perf_counter() - start
    run = {q: [hit.doc_id for hit in hits] for q, hits in zip(judged, results)}
    metrics = score_run(run, {q: qrels[q] for q in judged})
    return ModeScores(
        mode=mode,
        queries=len(judged),
        skipped_queries=len(qrels) - len(judged),
        depth=depth,
        dense_weight=engine.resolve_dense_weight(dense_weight) if mode == "hybrid" else None,
        ndcg_at_10=metrics["ndcg@10"],
        recall_at_100=metrics["recall@100"],
        mrr_at_10=metrics["mrr@10"],
        seconds=seconds,
        queries_per_s=len(judged) / seconds if seconds else None,
    )


def score_run(run: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """Mean nDCG@10, Recall@100 and MRR@10 of ranked doc-id lists (best first) against the judgements."""
    # pytrec_eval orders a run by score: the negative rank keeps the engine's order.
    scored = {q: {d: float(-rank) for rank, d in enumerate(ranking, start=1)} for q, ranking in run.items()}
    top10 = {q: {d: s for d, s in ranking.items() if s >= -10} for q, ranking in scored.items()}
    judged = {q: qrels[q] for q in run}
    per_query = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10", "recall.100"}).evaluate(scored)
    reciprocal = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top10)

    # pytrec_eval leaves out queries with an empty run: they score 0, so divide by all queries.
    def mean(values):
        return sum(values) / len(run)

    return {
        "ndcg@10": mean(m["ndcg_cut_10"] for m in per_query.values()),
        "recall@100": mean(m["recall_100"] for m in per_query.values()),
        "mrr@10": mean(m["recip_rank"] for m in reciprocal.values()),
    }


def modes_to_run(engine: SearchEngine, mode: str) -> list[str | None]:
    if mode == "all":
        return [m for m in MODES if m == "dense" or engine.has_lexical]
    if mode not in MODES:
        raise PipelineError(f"--mode: unknown mode '{mode}' (choose from {', '.join(MODES)} or all)")
    return [mode]
