"""The default search mode, chosen without judged queries, on pairs the corpus itself provides.

Whether dense, lexical or hybrid search ranks best depends on the collection and the model, and a
user's documents come without relevance judgements. So `pipeline index` measures it, in a sample of the
documents adaptation held out from training (common/heldout.py), on two families of pairs:

- passages: one sentence (a span, in text without sentences) is taken out to be the query, and its
  document without that sentence is the one relevant answer (the inverse cloze task). It shares no word
  with its answer but those the rest of the document repeats, which handicaps lexical search as real
  queries do not.
- query-like: a run of 4-12 of a sentence's words is the query, and the document keeps its text with some
  of those words: like a question or a claim, the query shares part of its words with its answer. These
  favour lexical search more than judged queries do (benchmarks/results/2026-11-28-pair-kinds-cpu.md).
  A text too short for either gives its title as the query, a query-like pair of this family.

Sentences are found by the rules of the language the BM25 index was built for. A collection whose held-out
documents give no pair is measured on pairs of all its documents, so any collection with text is
measured. Both retrievers search the stored collection with the measured documents replaced by their
changed text. Each measured document gives up to DRAWS pairs of each family, another sentence in each
round, and counts with the mean of their nDCG@10 (pooled: the mean of its families' means): with one
sentence a document, which one was drawn decided much of the choice (on SciFact, six seeds chose dense
weights from 0.1 to 0.35; with eight sentences, 0.3 every time, its train queries' best).
`pipeline eval --set-default` on judged queries overrides the choice.

The choice is made with the measurement's uncertainty in view, because neither family is the user's
queries. nDCG@10 changes little over a wide range of dense weights, and on a few hundred pairs the best of
them is mostly noise: every weight whose nDCG@10 is within PLATEAU_ERRORS standard errors (of the per-pair
difference) of the best is on a family's plateau, and of the weights on any family's plateau the one
nearest PRIOR_DENSE_WEIGHT, the weight judged queries preferred on every collection measured
(benchmarks/results/2026-11-28-default-mode-cpu.md), is taken. The default is hybrid at that weight unless
lexical or dense search measured better than it by more than one standard error, pooled and in each family alike:
hybrid loses little where one retriever is better, and a single retriever chosen on a small margin, or on
one kind of query, lost up to 0.02. A family of pairs measured on few documents (a collection of titles and
short texts gives few passages), or inconclusive on its own, has no say in the weight or the mode: then all
pairs together decide.
"""

from __future__ import annotations

import collections
import math
import random
from dataclasses import dataclass

import numpy as np

from common.console import info
from common.dense.reader import base_segment_dir
from common.embedder import embedding_text, encode
from common.heldout import held_out_pairs, standard_error
from common.lexical import Analyzer, LexicalIndex, Segment
from common.manifest import SearchEntry, read_manifest, require, write_section
from common.store import Store
from common.workspace import Workspace
from search.engine import Ranking, fuse

MEASURED_DOCUMENTS = 300  # held-out documents measured, each giving up to DRAWS pairs of each family
# A larger collection is measured on a seeded sample of this many documents (the measured ones among them):
# each round scores every vector of the collection measured, and holds them in memory (4 KB each).
SAMPLE_DOCUMENTS = 100_000
DRAWS = 8  # pairs of each family (another sentence as the query each) per measured document
QUERY_BATCH = 64  # queries scored against the stored vectors at once
DEPTH = 100  # documents taken from each retriever, as in search
HYBRID_WEIGHTS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 ... 0.95
CHOSEN_BY = "held-out corpus pairs"
# Families of pair kinds (common/heldout.py): a part of the document taken out of it, or a query-like pair
FAMILY_OF = {"sentence": "passage", "span": "passage", "query": "query", "title": "query"}
FAMILIES = ("passage", "query")
# Below this nDCG@10 in every mode the pairs tell the modes nothing (the held-out documents are hardly ever
# found, e.g. in a collection of near-duplicates): the default stays lexical, and says so.
INCONCLUSIVE_NDCG = 0.05
MIN_FAMILY_DOCUMENTS = 30  # a family of pairs measured on fewer has no say (module docstring)
PRIOR_DENSE_WEIGHT = 0.3  # the hybrid's weight taken when the pairs cannot tell it from others (above)
PLATEAU_ERRORS = 2.0  # standard errors below the best weight's gain that a weight's may be, on the plateau


@dataclass(frozen=True)
class ModeMeasurement:
    """What measure_modes found: the mode chosen (and whether the pairs could tell the modes apart at all),
    the mode all pairs together chose (hybrid was chosen instead where the families of pairs disagree), each
    mode's mean nDCG@10 and its standard error (hybrid's at the weight chosen), hybrid's at every weight, and
    what was measured."""

    mode: str
    inconclusive: bool
    mode_of_all_pairs: str
    dense_weight: float
    ndcg: dict[str, float]  # lexical, dense, hybrid: each document's mean over its families of pairs
    ndcg_se: dict[str, float]
    ndcg_by_pair_family: dict[str, dict[str, float]]  # "passage" or "query" -> lexical, dense, hybrid
    families_with_a_say: list[str]  # those that chose the weight and the mode ("all" where none had a say)
    hybrid_ndcg: dict[float, float]  # by dense weight
    pairs: int
    documents_measured: int
    pair_kinds: dict[str, int]
    collection_documents: int  # the collection measured: every stored document, or a sample of them

    def report(self) -> dict:
        """As the manifest's "search" section records it."""
        return {
            "ndcg@10": self.ndcg,
            "ndcg@10_se": self.ndcg_se,
            "ndcg@10_by_pair_family": self.ndcg_by_pair_family,
            "families_with_a_say": self.families_with_a_say,
            "hybrid_ndcg@10": {str(w): v for w, v in self.hybrid_ndcg.items()},
            "pairs": self.pairs,
            "documents_measured": self.documents_measured,
            "pair_kinds": self.pair_kinds,
            "collection_documents": self.collection_documents,
            "inconclusive": self.inconclusive,
            "mode_of_all_pairs": self.mode_of_all_pairs,
        }


def measure_modes(ws: Workspace, model, seed: int = 0, draws: int = DRAWS) -> ModeMeasurement | None:
    """nDCG@10 of lexical, dense and hybrid (per dense weight) on held-out pairs of the stored corpus: up to
    `draws` of each family per document, one round each (a round searches the collection with that round's
    documents changed by their pair); a document's nDCG@10 in a family is the mean over its pairs there, and
    pooled the mean of its families' (module docstring); None when no document gives a pair."""
    rng = random.Random(seed)
    index_entry = require(ws, "index", "run `pipeline index` first")
    with Store(ws.db_path, read_only=True) as store:
        documents = store.document_texts(SAMPLE_DOCUMENTS, seed)
        drawn = held_out_pairs(documents, rng, index_entry.language, MEASURED_DOCUMENTS, draws, query_like=True)
        if not drawn:
            return None
        stored = store.counts()["documents"]
        # As the index analyses text (every shard of a sharded index alike).
        analyzer = Analyzer.load(ws.root / index_entry.shard_entries()[0].lexical_path)
        # The whole collection, and its BM25 base segment while that holds every stored chunk (not after an
        # update: a delta beside it, or chunks deleted from it); else a segment of the documents measured.
        base_is_whole = index_entry.delta_vectors == 0 and index_entry.deleted_in_base == 0
        if len(documents) == stored and not index_entry.shards and base_is_whole:
            chunk_ids, vectors = store.load_vectors()
            chunk_docs = [doc_id for _, doc_id in store.chunk_documents()]  # both in chunk id order
            base = Segment.load(base_segment_dir(ws, index_entry))
        else:
            rows = store.chunk_documents([doc_id for doc_id, _, _ in documents])
            chunk_ids, chunk_docs = np.array([c for c, _ in rows], dtype=np.int64), [d for _, d in rows]
            _, vectors = store.load_vectors(chunk_ids)
            texts = [row for batch in store.iter_chunk_rows(chunk_ids) for row in batch]
            base = Segment.build(texts, {}, analyzer)
            info(f"measuring the default search mode on {len(documents):,} of the {stored:,} documents (a sample)")
    collection = Collection(base, analyzer, documents, chunk_ids, vectors, chunk_docs)
    doc_ids = list(drawn)
    # Per family of pairs, per document: the sum of nDCG@10 by mode or hybrid weight, and the pairs summed.
    keys = ["lexical", "dense", *HYBRID_WEIGHTS]
    sums = {family: {key: np.zeros(len(doc_ids)) for key in keys} for family in FAMILIES}
    counts = {family: np.zeros(len(doc_ids)) for family in FAMILIES}
    for round_ in range(max(map(len, drawn.values()))):
        measured = [i for i, d in enumerate(doc_ids) if len(drawn[d]) > round_]
        gains = collection.round_gains(model, {doc_ids[i]: drawn[doc_ids[i]][round_] for i in measured})
        for at, i in enumerate(measured):
            family = FAMILY_OF[drawn[doc_ids[i]][round_][2]]
            for key in keys:
                sums[family][key][i] += gains[key][at]
            counts[family][i] += 1
    # Each family's per-document means, over the documents it measured; pooled, each document's mean over the
    # families it has (every document has one at least).
    has = {family: counts[family] > 0 for family in FAMILIES}
    means = {family: {key: sums[family][key] / np.maximum(counts[family], 1) for key in keys} for family in FAMILIES}
    by_family = {
        family: {key: means[family][key][has[family]] for key in keys} for family in FAMILIES if has[family].any()
    }
    families_of_document = sum(has[family].astype(float) for family in FAMILIES)
    pooled = {key: sum(np.where(has[f], means[f][key], 0.0) for f in FAMILIES) / families_of_document for key in keys}
    hybrid = {w: pooled[w] for w in HYBRID_WEIGHTS}
    voters = voting(by_family, pooled)
    weight = plateau_weight(*({w: gains[w] for w in HYBRID_WEIGHTS} for gains in voters.values()))
    per_pair = {"lexical": pooled["lexical"], "dense": pooled["dense"], "hybrid": hybrid[weight]}
    mode, inconclusive = agreed_mode(
        per_pair, [{"lexical": g["lexical"], "dense": g["dense"], "hybrid": g[weight]} for g in voters.values()]
    )
    return ModeMeasurement(
        mode=mode,
        inconclusive=inconclusive,
        mode_of_all_pairs=best_mode(per_pair)[0],
        dense_weight=weight,
        ndcg={name: float(gains.mean()) for name, gains in per_pair.items()},
        ndcg_se={name: standard_error(gains) for name, gains in per_pair.items()},
        ndcg_by_pair_family={
            family: {
                "lexical": float(g["lexical"].mean()),
                "dense": float(g["dense"].mean()),
                "hybrid": float(g[weight].mean()),
            }
            for family, g in by_family.items()
        },
        families_with_a_say=sorted(voters),
        hybrid_ndcg={w: float(g.mean()) for w, g in hybrid.items()},
        pairs=int(sum(c.sum() for c in counts.values())),
        documents_measured=len(doc_ids),
        pair_kinds=dict(collections.Counter(kind for each in drawn.values() for _, _, kind in each)),
        collection_documents=collection.documents,
    )


class Collection:
    """The stored collection (or a sample of SAMPLE_DOCUMENTS of its documents), searched with some documents
    replaced by their shortened texts: dense by exact scores, BM25 as an update of a base segment (the one
    `pipeline index` just built in full, or one built here of the sample) with a delta (index/update.py;
    statistics of that collection, as a full build's)."""

    def __init__(self, base: Segment, analyzer: Analyzer, documents, chunk_ids, vectors, chunk_docs):
        self.base, self.analyzer = base, analyzer
        self.titles = {d[0]: d[1] or "" for d in documents}
        self.chunk_ids, self.vectors, self.chunk_docs = chunk_ids, vectors, chunk_docs
        self.documents = len(documents)

    def round_gains(self, model, pairs: dict[str, tuple[str, str, str]]) -> dict:
        """Each pair's nDCG@10 (one relevant document) by mode ("lexical", "dense") and hybrid weight."""
        # A measured document keeps its title unless the title is the query.
        titles = {d: "" if kind == "title" else self.titles[d] for d, (_, _, kind) in pairs.items()}
        doc_ids = list(pairs)
        queries = [pairs[d][0] for d in doc_ids]
        # The collection, in chunk id order: every other document's chunks, then each measured document as one
        # shortened text (embedded here), numbered after the stored chunks.
        kept = np.array([d not in pairs for d in self.chunk_docs])
        shortened_ids = int(self.chunk_ids[-1]) + 1 + np.arange(len(doc_ids), dtype=np.int64)
        lexical = LexicalIndex.with_delta(
            self.base,
            self.analyzer,
            [(i, titles[d], pairs[d][1]) for i, d in zip(shortened_ids.tolist(), doc_ids)],
            np.concatenate([self.chunk_ids[kept], shortened_ids]),
        )
        shortened_vectors = encode(model, [embedding_text(titles[d], pairs[d][1]) for d in doc_ids])
        query_vectors = encode(model, queries)
        collection_ids = [d for d, keep in zip(self.chunk_docs, kept) if keep] + doc_ids

        # Documents as Rankings want them: numbered in id order.
        doc_numbers = {doc_id: i for i, doc_id in enumerate(sorted(set(collection_ids)))}
        collection_docs = np.array([doc_numbers[d] for d in collection_ids], dtype=np.int64)

        def documents_of(positions, scores) -> Ranking:
            docs = collection_docs[positions]
            _, first = np.unique(docs, return_index=True)
            first = np.sort(first)[:DEPTH]
            chunks = np.asarray(positions, dtype=np.int64)[first]
            # One collection (shard 0); a chunk's position stands for its id: they order alike.
            return Ranking(
                docs[first], chunks, np.asarray(scores, dtype=np.float64)[first], np.zeros_like(chunks), chunks
            )

        dense_rankings = []
        kept_rows = np.flatnonzero(kept)
        for start in range(0, len(queries), QUERY_BATCH):  # a matrix product per batch: one pass over the vectors
            batch = query_vectors[start : start + QUERY_BATCH]
            scores = np.concatenate([(self.vectors @ batch.T)[kept_rows], shortened_vectors @ batch.T]).T
            for row in scores:
                top = np.arange(len(row)) if len(row) <= 4 * DEPTH else np.argpartition(-row, 4 * DEPTH)[: 4 * DEPTH]
                top = top[np.lexsort((top, -row[top]))]
                dense_rankings.append(documents_of(top, row[top]))
        lexical_rankings = [documents_of(*lexical.search_positions(query, 4 * DEPTH)) for query in queries]

        def ndcg_at_10(rankings) -> np.ndarray:
            gains = []
            for doc_id, ranking in zip(doc_ids, rankings):
                found = np.flatnonzero(ranking.docs[:10] == doc_numbers[doc_id])
                gains.append(1 / math.log2(found[0] + 2) if len(found) else 0.0)
            return np.array(gains)

        gains = {"lexical": ndcg_at_10(lexical_rankings), "dense": ndcg_at_10(dense_rankings)}
        for w in HYBRID_WEIGHTS:
            gains[w] = ndcg_at_10([fuse(dense, lexical, w) for dense, lexical in zip(dense_rankings, lexical_rankings)])
        return gains


def voting(by_family: dict[str, dict], pooled: dict) -> dict[str, dict]:
    """The families of pairs that choose the weight and the mode (name -> their gains by mode and weight): those
    with a say, or, where none has one, all pairs together (as "all")."""
    return {family: gains for family, gains in by_family.items() if has_a_say(gains)} or {"all": pooled}


def has_a_say(gains: dict) -> bool:
    """Whether a family of pairs (its per-document gains by mode and hybrid weight) votes on the weight and
    the mode: measured on MIN_FAMILY_DOCUMENTS documents at least, and not inconclusive on its own."""
    enough = len(gains["lexical"]) >= MIN_FAMILY_DOCUMENTS
    return enough and max(float(g.mean()) for g in gains.values()) >= INCONCLUSIVE_NDCG


def plateau_weight(*gains_by_weight: dict[float, np.ndarray]) -> float:
    """Of the weights on the plateau of any of the measurements given (the gains by weight of each family of
    pairs with a say, else of all pairs), the one nearest PRIOR_DENSE_WEIGHT, the lower of two as near."""
    candidates = set().union(*map(plateau, gains_by_weight))
    return min(candidates, key=lambda w: (abs(w - PRIOR_DENSE_WEIGHT), w))


def plateau(gains_by_weight: dict[float, np.ndarray]) -> list[float]:
    """The weights whose mean gain is within PLATEAU_ERRORS standard errors of the best weight's (of the
    per-pair differences to the best)."""
    best = max(gains_by_weight, key=lambda w: gains_by_weight[w].mean())
    return [
        w for w, gains in gains_by_weight.items() if not clearly_better(gains_by_weight[best], gains, PLATEAU_ERRORS)
    ]


def clearly_better(gains: np.ndarray, than: np.ndarray, errors: float = 1.0) -> bool:
    """Whether the per-pair gains are higher than `than`'s by more than `errors` standard errors of their
    difference."""
    difference = gains - than
    return difference.mean() > errors * standard_error(difference)


def choose_default_mode(ws: Workspace, model, embedder_fingerprint: str) -> SearchEntry | None:
    """Measure the modes and record the best as the workspace's default, unless judged queries chose it
    for this model; returns the section recorded (None when nothing was)."""
    current = read_manifest(ws).search
    if current is not None and current.embedder_fingerprint == embedder_fingerprint and current.chosen_by != CHOSEN_BY:
        info(f"default search mode: {current.default_mode} (chosen on judged queries by `pipeline eval --set-default`)")
        return None
    result = measure_modes(ws, model)
    if result is None:
        info("default search mode: lexical (no document has enough text to measure search on)")
        return None
    section = record_default_mode(
        ws,
        result.mode,
        result.dense_weight,
        embedder_fingerprint,
        CHOSEN_BY,
        result.report(),
        base_index=read_manifest(ws).index.path,
    )
    measured = f"{section.measurement()}; hybrid at dense weight {result.dense_weight}"
    if result.inconclusive:
        info(
            "default search mode: lexical, as the measurement was inconclusive "
            f"({measured}: the held-out documents are hardly ever found, as in a collection of near-duplicates); "
            "with judged queries, `pipeline eval --set-default` chooses"
        )
    elif result.mode != result.mode_of_all_pairs:
        info(
            f"default search mode: hybrid ({measured}): all pairs together favour {result.mode_of_all_pairs} "
            "search alone, but not each family of them (passages taken out of documents, query-like runs of "
            "words), so the choice is hybrid, which loses least either way"
        )
    else:
        info(f"default search mode: {result.mode} ({measured})")
    return section


def record_default_mode(
    ws: Workspace,
    mode: str,
    dense_weight: float,
    embedder_fingerprint: str,
    chosen_by: str,
    report: dict,
    base_index: str | None = None,
) -> SearchEntry:
    """Make `mode` (and the hybrid's `dense_weight`) the default search mode of the index built by this
    embedder (with `base_index`, of that full build only): the manifest's "search" section, of which this is
    the one writer, for this measurement and for `pipeline eval --set-default`."""
    entry = SearchEntry(
        default_mode=mode,
        dense_weight=dense_weight,
        embedder_fingerprint=embedder_fingerprint,
        chosen_by=chosen_by,
        report=report,
        base_index=base_index,
    )
    write_section(ws, entry)
    return entry


def agreed_mode(pooled: dict[str, np.ndarray], families: list[dict[str, np.ndarray]]) -> tuple[str, bool]:
    """best_mode on the pooled gains when every family of pairs given (those with a say) chooses the same
    (hybrid otherwise: the pairs disagree on what users' queries would favour, and hybrid loses least either
    way); lexical when inconclusive."""
    mode, inconclusive = best_mode(pooled)
    if inconclusive or all(best_mode(gains)[0] == mode for gains in families):
        return mode, inconclusive
    return "hybrid", False


def best_mode(gains: dict[str, np.ndarray]) -> tuple[str, bool]:
    """From each mode's per-pair nDCG@10 (hybrid's at its chosen weight): hybrid, unless lexical or dense is
    clearly better than it (then the better of those), and whether the measurement was inconclusive (every
    mode below INCONCLUSIVE_NDCG on average: then lexical)."""
    means = {mode: float(g.mean()) for mode, g in gains.items()}
    if max(means.values()) < INCONCLUSIVE_NDCG:
        return "lexical", True
    better = [mode for mode in ("lexical", "dense") if clearly_better(gains[mode], gains["hybrid"])]
    return max(better, key=lambda mode: means[mode]) if better else "hybrid", False
