"""Search over the workspace: dense (embedding + FAISS), lexical (BM25) or hybrid (the two fused).

Both retrievers rank chunks; results are documents, each shown with its best-matching chunk.
Hybrid fuses the two document rankings by a convex combination of their normalised scores:
score(d) = w * z_dense(d) + (1 - w) * z_lexical(d), where z is a score standardised over its retriever's
top documents for the query (mean 0, deviation 1), and a document missing from one list gets that list's
lowest score. Unlike reciprocal rank fusion, this keeps how far apart the scores are, so a retriever
that is confident about one document outweighs one that barely prefers another: on SciFact's train
queries, with the static embedder, it lifted hybrid above BM25 (nDCG@10) where RRF fell below it
(measured: benchmarks/results/2026-11-28-design-measurements-cpu.md); Bruch et al. (2023) found the same across
BEIR.

The engine loads the indexes and the model once, and opens the corpus snapshot `pipeline index` wrote beside
them (common/snapshot/reader.py): arrays by chunk position (chunk-id order) and by document position (doc-id order),
memory-mapped, and each document's fields and compressed text. Nothing of the collection is read into memory
at load: a hit's document is an array lookup, and only the hits' texts and metadata are read, when they are
shown (a one-off search over 1M documents used to load the whole store first, slowly and into much memory:
benchmarks/results/2026-11-28-design-measurements-cpu.md). The store itself is only asked its generation: an
index, and the snapshot written with it, answer only for the store generation they were built from. A request
does no SQL unless it filters. An updated index is a base and a delta (index/build.py): both FAISS indexes are
searched and their hits merged by score, the base's deleted chunks never among them; BM25 reads both segments.
`search` can be called from several threads (FAISS and BM25 searches only read).

A sharded index (index/shards.py) is searched shard by shard through the Shard interface (which a shard in
another process answers too): the query embedded once, BM25 scored with the collection's statistics summed over
the shards first (the DFS phase of a distributed search engine), each retriever's rankings merged by score, then
fused, and the hits read from their shards. Every ranking orders equal scores by chunk id, so N shards answer
exactly as one index over the same chunks.

Filters (search/filters.py) are applied during retrieval, never after it, so k documents come back
whenever k allowed documents match: the allowed chunks become a bitmap (FAISS) and a weight mask
(BM25). For FAISS: flat scans only the allowed vectors; HNSW and IVF widen their search by the inverse
of the allowed share (efSearch, nprobe), and a graph walk that still comes back short, or a small
allowed share where the walk would visit mostly refused nodes, is answered by an exact scan of the
allowed vectors in HNSW's own flat storage; IVF then probes every list.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generic, Protocol, TypeVar

import faiss
import numpy as np

from common.console import warn
from common.dense.reader import candidates_to_rescore, load_index, read_rescore, rescored
from common.embedder import encode, is_static, load_embedder, text_tokenizer, token_limit, truncate_to_model
from common.errors import PipelineError
from common.lexical import Analyzer, CollectionStatistics, LexicalIndex
from common.manifest import IndexEntry, SearchEntry, read_manifest
from common.snapshot.reader import Snapshot
from common.store import Store
from common.workspace import Workspace, model_fingerprint
from search.filters import DocumentFilter, DocumentFilters
from search.settings import MAX_K, MODES
from search.snippets import make_snippet, snippet_terms

# Which mode ranks best depends on the collection and the model: `pipeline index` measures it on held-out
# pairs of the corpus (search/calibrate.py) and `pipeline eval --mode all --set-default` on judged queries;
# either records the winner (and the hybrid's dense weight) for the workspace. Unmeasured: lexical.
DEFAULT_MODE = "lexical"
DEFAULT_DENSE_WEIGHT = 0.5
FUSION_DEPTH = 100  # documents taken from each retriever before fusing
FETCH_MARGIN = 1.5  # chunks fetched first per document wanted, over the collection's chunks per document
# Hybrid's BM25 walks at most this many postings in full; its commonest terms are then only looked up for the
# chunks the others hold (common/lexical/). At 10M topical chunks this budget cut exact BM25's time a query,
# most at the tail (p99), and still found the same chunks, where smaller budgets lost some of them (measured:
# benchmarks/results/2026-11-28-design-measurements-cpu.md). Lexical mode stays exact; below ~1M chunks it
# never binds.
HYBRID_WALK_BUDGET = 1_000_000


@dataclass
class Hit:
    rank: int
    score: float
    doc_id: str
    title: str
    source: str
    snippet: str
    highlights: list[tuple[int, int]]  # [start, end) character offsets of the query's terms in the snippet
    chunk_id: int
    metadata: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "score": self.score,
            "doc_id": self.doc_id,
            "title": self.title,
            "source": self.source,
            "snippet": self.snippet,
            "highlights": [list(h) for h in self.highlights],
            "chunk_id": self.chunk_id,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class Ranking:
    """Documents best first, each with its best chunk (positions in their shard's corpus, and the chunk's id:
    equal scores rank by it, in every ranking, so that shards merge as one index ranks), and scores. Arrays,
    not a row per document: a hybrid query ranks 200 documents, and building a Python object for each was a
    tenth of its cost."""

    docs: np.ndarray  # int64 document positions (in their shard's corpus)
    chunks: np.ndarray  # int64 chunk positions (in their shard's corpus)
    scores: np.ndarray  # float64
    shards: np.ndarray  # int64: the shard each document is in (IndexShard; 0 for an unsharded index)
    chunk_ids: np.ndarray  # int64: the chunks' ids, which order equal scores across shards

    def __len__(self) -> int:
        return len(self.docs)

    def head(self, k: int) -> "Ranking":
        return self.take(slice(0, k))

    def take(self, rows) -> "Ranking":
        return Ranking(self.docs[rows], self.chunks[rows], self.scores[rows], self.shards[rows], self.chunk_ids[rows])

    @property
    def keys(self) -> np.ndarray:
        """One number per document, unique across shards, in document order within a shard."""
        return self.shards << 32 | self.docs


NO_RANKING = Ranking(*(np.zeros(0, np.int64),) * 2, np.zeros(0, np.float64), *(np.zeros(0, np.int64),) * 2)


def short_text(text: str, limit: int) -> str:
    """A text on one line, cut at a word boundary (for naming a query in a warning)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def check_request(query: str, k: int, mode: str | None) -> str:
    """Validate one request; returns the stripped query. Raises PipelineError naming the problem."""
    query = query.strip()
    if not query:
        raise PipelineError("empty query")
    if not 1 <= k <= MAX_K:
        raise PipelineError(f"k must be between 1 and {MAX_K}, got {k}")
    if mode is not None and mode not in MODES:
        raise PipelineError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    return query


class DenseIndex:
    """One FAISS index (the base, or the delta of chunks added since: index/build.py) searched for corpus
    positions. Its slots (the order vectors were added in) map to chunk positions; slots of chunks
    deleted since it was built are never returned: every search then goes through a selector of the
    live slots. Unfiltered or restricted to allowed chunks (see the module docstring)."""

    def __init__(
        self, index: faiss.Index, chunk_ids: np.ndarray, rescore_rows: np.ndarray | None = None, rescore: int = 1
    ):
        """chunk_ids: the live chunks' ids by position (ascending). rescore_rows: an IVF index's rescoring rows
        by slot (common/dense/reader.py); its best candidates_to_rescore(rescore, n) candidates are then scored
        exactly from them."""
        ids = faiss.vector_to_array(faiss.downcast_index(index).id_map)
        at = np.minimum(np.searchsorted(chunk_ids, ids), max(len(chunk_ids) - 1, 0))
        live = chunk_ids[at] == ids if len(chunk_ids) else np.zeros(len(ids), bool)
        self.positions = np.where(live, at, -1)  # slot -> chunk position, -1 for a deleted chunk
        self.live_positions = at[live]
        self.index = index  # owns the inner index: kept alive with it
        self.inner = faiss.downcast_index(faiss.downcast_index(index).index)
        self.ntotal = self.inner.ntotal
        self.kind = "hnsw" if hasattr(self.inner, "hnsw") else "ivf" if hasattr(self.inner, "nprobe") else "flat"
        self.exact = (
            faiss.downcast_index(self.inner.storage)
            if self.kind == "hnsw"
            else self.inner
            if self.kind == "flat"
            else None
        )
        self.live_slots = None if len(self.live_positions) == self.ntotal else Slots(live)
        self.rescore_rows, self.rescore = rescore_rows, rescore

    def search(
        self, vectors: np.ndarray, n: int, allowed: "AllowedChunks | None"
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The best n (chunk positions, scores) for each query vector [m, dim], best first. Unrestricted
        queries are searched in one call: over a flat index several queries share one pass over the
        vectors (the scan is memory-bound)."""
        slots = allowed.slots(self) if allowed is not None else self.live_slots
        if self.rescore_rows is not None:  # a query a thread: FAISS and the re-scoring let go of the GIL
            return list(
                searching_threads().map(lambda i: self._rescored(vectors[i : i + 1], n, slots), range(len(vectors)))
            )
        if slots is None:
            scores, labels = self.inner.search(vectors, min(n, self.ntotal))
            return [self._valid(scores[i : i + 1], labels[i : i + 1]) for i in range(len(vectors))]
        return [self._search_slots(vectors[i : i + 1], n, slots) for i in range(len(vectors))]

    def _rescored(self, vector: np.ndarray, n: int, slots: "Slots | None") -> tuple[np.ndarray, np.ndarray]:
        """IVF: the best candidates_to_rescore(rescore, n) by their codes, the best n of them by exact scores."""
        if slots is not None and slots.count == 0:  # a filter that keeps none of this index's chunks
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        if slots is None:
            _, labels = self.inner.search(vector, min(candidates_to_rescore(self.rescore, n), self.ntotal))
        else:
            _, labels = self._search_slots(vector, candidates_to_rescore(self.rescore, n), slots, labels_only=True)
        candidates = labels[0][labels[0] >= 0]
        found, scores = rescored(vector[0], candidates, self.rescore_rows, n)
        return self.positions[found].astype(np.int64), scores

    def _search_slots(self, vector: np.ndarray, n: int, slots: "Slots", labels_only: bool = False):
        """The best n of the given slots for one query vector [1, dim] (see the module docstring): (chunk
        positions, scores), or with labels_only FAISS's (scores, slots) [1, n] of an IVF index."""
        want = min(n, slots.count)
        if want == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        share = slots.count / self.ntotal
        if self.kind == "hnsw":
            ef = min(self.ntotal, math.ceil(max(self.inner.hnsw.efSearch, want) / share))
            # A walk computes a distance to every neighbour of each of ~ef nodes, refused or not; the exact
            # scan one per allowed vector: it wins below share ~ sqrt(ef * neighbours / ntotal).
            if slots.count <= ef * self.inner.hnsw.nb_neighbors(0):
                return self._exact(vector, want, slots)
            params = faiss.SearchParametersHNSW(sel=slots.selector, efSearch=ef)
        elif self.kind == "flat":
            return self._exact(vector, want, slots)
        else:
            params = faiss.SearchParametersIVF(
                sel=slots.selector, nprobe=min(self.inner.nlist, math.ceil(self.inner.nprobe / share))
            )
        found = self.inner.search(vector, want, params=params)
        if (found[1][0] >= 0).sum() < want:  # the widened search still came back short
            if self.exact is not None:
                return self._exact(vector, want, slots)
            params = faiss.SearchParametersIVF(sel=slots.selector, nprobe=self.inner.nlist)
            found = self.inner.search(vector, want, params=params)
        return found if labels_only else self._valid(*found)

    def _exact(self, vector: np.ndarray, n: int, slots: "Slots") -> tuple[np.ndarray, np.ndarray]:
        """Exact search over the allowed vectors only (the flat storage computes no refused one)."""
        return self._valid(*self.exact.search(vector, n, params=faiss.SearchParameters(sel=slots.selector)))

    def _valid(self, scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = labels[0] >= 0
        return self.positions[labels[0][keep]].astype(np.int64), scores[0][keep]


class Slots:
    """Some slots of a FAISS index, as a bitmap selector FAISS reads."""

    def __init__(self, mask: np.ndarray):
        self.count = int(mask.sum())
        self._bitmap = np.packbits(mask, bitorder="little")  # kept alive: FAISS reads it by pointer
        self.selector = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(self._bitmap))


class AllowedChunks:
    """The chunks of the documents a filter keeps: a mask by chunk position, as BM25 weights, and the
    slots of each FAISS index that hold them (made on first use, once per request)."""

    def __init__(self, document_positions: np.ndarray, chunk_docs: np.ndarray, n_documents: int):
        """chunk_docs: each chunk's document position, by chunk position."""
        if len(document_positions) and (document_positions.min() < 0 or document_positions.max() >= n_documents):
            raise PipelineError(  # the filter table and the snapshot disagree: never index with wrapped positions
                f"the filter gave document positions outside the collection's {n_documents}: run `pipeline index`"
            )
        documents = np.zeros(n_documents, dtype=bool)
        documents[document_positions] = True
        self.mask = documents[chunk_docs]
        self.count = int(self.mask.sum())
        self.weights = self.mask.astype(np.float32)
        self._slots: dict[int, Slots] = {}

    def slots(self, dense: DenseIndex) -> Slots:
        if id(dense) not in self._slots:
            self._slots[id(dense)] = Slots(self.mask[dense.positions] & (dense.positions >= 0))
        return self._slots[id(dense)]


class IndexShard:
    """One index generation's files over some of the collection: all of it (an unsharded index) or one shard's
    documents (index/shards.py): the FAISS indexes (the base, and the delta of chunks added since it was
    built: index/update.py), BM25, the corpus snapshot and its filter table. What a shard answers: its best
    documents for a query vector or text, and its documents as hits."""

    def __init__(self, root: Path, entry: IndexEntry, number: int = 0):
        self.entry, self.number = entry, number
        self.corpus = Snapshot(root / entry.corpus_path)
        if self.corpus.generation != entry.store_generation:  # the manifest names them together
            raise PipelineError("the corpus snapshot does not match the index: run `pipeline index`")
        # An IVF base and its delta re-score their candidates from int8 copies of the vectors (common/dense/ivf.py).
        rescore = int((entry.search_setting or {}).get("rescore", 1))
        self.dense = []
        for path, rescore_path in zip(entry.files, [entry.rescore_path, entry.delta_rescore_path]):
            index = load_index(root / path)
            rows = read_rescore(root / rescore_path, index.d) if rescore_path else None
            self.dense.append(DenseIndex(index, self.corpus.chunk_ids, rows, rescore))
        # Every stored chunk held once: as many held as stored, and every position among them. (np.unique of
        # the positions took most of a load at ten million chunks:
        # benchmarks/results/2026-11-28-design-measurements-cpu.md.)
        held = np.concatenate([part.live_positions for part in self.dense])
        covered = np.zeros(len(self.corpus.chunk_ids), bool)
        covered[held] = True
        if len(held) != len(covered) or not covered.all():
            raise PipelineError("the FAISS index does not hold the stored chunks: run `pipeline index`")
        self.lexical = LexicalIndex.load(root / entry.lexical_path) if entry.lexical_path else None
        if self.lexical is not None and not np.array_equal(self.lexical.chunk_ids, self.corpus.chunk_ids):
            raise PipelineError("the BM25 index does not hold the stored chunks: run `pipeline index`")
        self.filters = DocumentFilters(self.corpus.filters_path)

    # ---- what a search asks of a shard (the Shard interface below: LocalShard asks these in this process)
    def statistics(self, query: str) -> CollectionStatistics:
        """This shard's part of BM25's collection statistics for `query` (summed over the shards first)."""
        return self.lexical.statistics(query)

    def candidates(
        self,
        vectors: np.ndarray | None,
        queries: list[str],
        depth: int,
        filters: DocumentFilter | None,
        walk_budget: int | None,
        collections: list[CollectionStatistics | None] | None,
    ) -> tuple[list[Ranking] | None, list[Ranking] | None]:
        """Each query's best `depth` documents here among those `filters` keeps: dense for the query `vectors`
        (None: no dense search) and BM25 scored with `collections` (each query's collection statistics, None
        for this shard's own; the list None: no BM25 search). BM25 searches a batch on a thread per core."""
        allowed = self.allowed(filters) if filters else None
        if allowed is not None and allowed.count == 0:  # nothing here passes the filter
            return (None if vectors is None else [NO_RANKING] * len(queries)), (
                None if collections is None else [NO_RANKING] * len(queries)
            )
        dense = None if vectors is None else self.dense_documents(vectors, depth, allowed)
        lexical = None
        if collections is not None:
            lexical = list(
                searching_threads().map(
                    lambda query, collection: self.lexical_documents(query, depth, allowed, walk_budget, collection),
                    queries,
                    collections,
                )
            )
        return dense, lexical

    def hits(self, query: str, ranking: Ranking) -> list[Hit]:
        """The documents of `ranking` (this shard's) as hits: fields and a snippet of the best chunk, read now.
        Ranks are left 0: the caller ranks hits of all shards."""
        terms = snippet_terms(query, self.lexical.analyzer if self.lexical is not None else Analyzer())
        corpus, hits = self.corpus, []
        for doc, chunk, score in zip(ranking.docs.tolist(), ranking.chunks.tolist(), ranking.scores.tolist()):
            text, marks = make_snippet(corpus.chunk_text(chunk), terms, bool(corpus.chunk_starts_mid_text[chunk]))
            hits.append(
                Hit(
                    0,
                    score,
                    corpus.doc_id(doc),
                    corpus.title(doc),
                    corpus.source(doc),
                    text,
                    marks,
                    int(corpus.chunk_ids[chunk]),
                    corpus.metadata(doc),
                )
            )
        return hits

    def fields(self) -> dict[str, str]:
        """The fields this shard's filters can use, with their types."""
        return self.filters.fields

    # ---- within the shard
    def allowed(self, filters: DocumentFilter) -> AllowedChunks:
        return AllowedChunks(self.filters.allowed_documents(filters), self.corpus.chunk_docs, self.corpus.n_documents)

    def dense_documents(self, vectors: np.ndarray, n_docs: int, allowed: AllowedChunks | None) -> list[Ranking]:
        """Each query vector's best n_docs documents: the first fetch of chunks for all queries at once."""
        total = len(self.corpus.chunk_ids) if allowed is None else allowed.count
        first = self.dense_chunks(vectors, self.first_fetch(n_docs, total), allowed)
        return [
            self.best_chunk_per_document(
                lambda n, v=vectors[i : i + 1]: self.dense_chunks(v, n, allowed)[0], n_docs, total, first[i]
            )
            for i in range(len(vectors))
        ]

    def dense_chunks(
        self, vectors: np.ndarray, n: int, allowed: AllowedChunks | None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each query vector, the best n (chunk positions, scores) of the base and delta indexes
        together, best first, equal scores by position (FAISS leaves their order open; shards must agree)."""
        found = [part.search(vectors, n, allowed) for part in self.dense]
        merged = []
        for per_part in zip(*found):
            positions, scores = np.concatenate([f[0] for f in per_part]), np.concatenate([f[1] for f in per_part])
            best = np.lexsort((positions, -scores))[:n]
            merged.append((positions[best], scores[best]))
        return merged

    def lexical_documents(
        self,
        query: str,
        n_docs: int,
        allowed: AllowedChunks | None,
        walk_budget: int | None = None,
        collection: CollectionStatistics | None = None,
    ) -> Ranking:
        """The query's best n_docs documents by BM25 (with the statistics of the collection this is a shard of)."""
        total = len(self.lexical) if allowed is None else allowed.count
        weights = None if allowed is None else allowed.weights
        return self.best_chunk_per_document(
            lambda n: self.lexical.search_positions(query, n, weights, walk_budget, collection), n_docs, total
        )

    def first_fetch(self, n_docs: int, total: int) -> int:
        """How many chunks are fetched first for n_docs documents: a document may have several among them,
        about as many as the collection's documents have on average, and FETCH_MARGIN times that, so that
        one fetch nearly always covers them (another fetches 4x as many)."""
        per_document = max(1.0, len(self.corpus.chunk_ids) / max(1, self.corpus.n_documents))
        return min(total, math.ceil(n_docs * per_document * FETCH_MARGIN))

    def best_chunk_per_document(self, fetch, n_docs: int, total: int, fetched=None) -> Ranking:
        """Ask `fetch(n)` for the best n chunks (positions, scores), growing n until n_docs documents are
        covered (`fetched`: what fetch(self.first_fetch(n_docs, total)) gives, when already fetched); returns
        each document's best chunk, best first."""
        n = self.first_fetch(n_docs, total)
        while True:
            positions, scores = fetched if fetched is not None else fetch(n)
            fetched = None
            docs = self.corpus.chunk_docs[positions].astype(np.int64)
            _, first = np.unique(docs, return_index=True)  # results come best-first
            if len(first) >= n_docs or n >= total or len(positions) < n:
                first = np.sort(first)[:n_docs]
                chunks, shards = positions[first], np.full(len(first), self.number, np.int64)
                return Ranking(
                    docs[first], chunks, scores[first].astype(np.float64), shards, self.corpus.chunk_ids[chunks]
                )
            n = min(total, n * 4)

    def document(self, doc_id: str) -> dict | None:
        corpus = self.corpus
        position = corpus.position_of(doc_id)
        if position is None:
            return None
        return {
            "doc_id": doc_id,
            "title": corpus.title(position),
            "source": corpus.source(position),
            "text": corpus.text(position),
            "metadata": corpus.metadata(position),
            "chunks": int(corpus.document_chunks[position]),
        }


class ShardUnavailable(Exception):
    """A shard answering from another process did not answer (search/serve/ray_serve.py): the request fails
    naming it (503), never answered from the other shards alone."""


T = TypeVar("T")


class Answer(Protocol[T]):
    """A shard's answer to one call, awaited by result() (a ShardUnavailable when a shard elsewhere fails)."""

    def result(self) -> T: ...


class Shard(Protocol):
    """What the engine asks of one shard of the index: IndexShard's questions, each call started at once and
    answered by its Answer's result(). The engine makes every shard's call before it awaits any, so shards in
    other processes work side by side. Implemented by LocalShard (an IndexShard in this process) and by
    search/serve/ray_serve.py's RemoteShard (a shard's Ray Serve application)."""

    def statistics(self, query: str) -> Answer[CollectionStatistics]: ...

    def candidates(
        self,
        vectors: np.ndarray | None,
        queries: list[str],
        depth: int,
        filters: DocumentFilter | None,
        walk_budget: int | None,
        collections: list[CollectionStatistics | None] | None,
    ) -> Answer[tuple[list[Ranking] | None, list[Ranking] | None]]: ...

    def hits(self, query: str, ranking: Ranking) -> Answer[list[Hit]]: ...

    def document(self, doc_id: str) -> Answer[dict | None]: ...

    def fields(self) -> Answer[dict[str, str]]: ...


@dataclass(frozen=True)
class Answered(Generic[T]):
    """An answer there at once."""

    value: T

    def result(self) -> T:
        return self.value


class LocalShard:
    """An IndexShard in this process, asked through the Shard interface: each answer is there at once."""

    def __init__(self, shard: IndexShard):
        self.shard = shard

    def statistics(self, query: str) -> Answered[CollectionStatistics]:
        return Answered(self.shard.statistics(query))

    def candidates(self, *arguments) -> Answered[tuple[list[Ranking] | None, list[Ranking] | None]]:
        return Answered(self.shard.candidates(*arguments))

    def hits(self, query: str, ranking: Ranking) -> Answered[list[Hit]]:
        return Answered(self.shard.hits(query, ranking))

    def document(self, doc_id: str) -> Answered[dict | None]:
        return Answered(self.shard.document(doc_id))

    def fields(self) -> Answered[dict[str, str]]:
        return Answered(self.shard.fields())


def local_shards(root: Path, entry: IndexEntry) -> list[LocalShard]:
    """The index's shards opened in this process (one for an unsharded index)."""
    return [LocalShard(IndexShard(root, shard_entry, i)) for i, shard_entry in enumerate(entry.shard_entries())]


# (workspace root, the index's record) -> its shards: LocalShards here, or what answers for them elsewhere
OpenShards = Callable[[Path, IndexEntry], list[Shard]]


def awaited(answers: list[Answer[T]]) -> list[T]:
    """The answers' results, in order: awaited only after every call was made."""
    return [answer.result() for answer in answers]


class SearchEngine:
    """Search over the workspace's index: the query model, and the index's shards (one IndexShard for an
    unsharded index), whose answers are merged and fused here. `open_shards` opens them (local_shards: in this
    process; search/serve/ray_serve.py: deployments of Ray Serve)."""

    def __init__(
        self, ws: Workspace, load_model: bool = True, reuse_model=None, open_shards: OpenShards = local_shards
    ):
        self.ws = ws
        manifest = read_manifest(ws)
        if manifest.index is None or manifest.embedder is None:
            raise PipelineError(f"workspace {ws.root} has no index: run `pipeline embed` and `pipeline index` first")
        self.index_entry = manifest.index
        self.model_dir = manifest.embedder.model_dir(ws)
        if not self.model_dir.exists():
            raise PipelineError(f"{self.model_dir}: the embedding model recorded in the manifest is gone")
        current = model_fingerprint(self.model_dir)  # a stale index is refused whatever the mode, as `status` does
        if self.index_entry.embedder_fingerprint != current:
            raise PipelineError(
                f"the index was built with model {self.index_entry.embedder_fingerprint} "
                f"but {self.model_dir} now holds model {current}: run `pipeline embed` and `pipeline index` again"
            )
        # The store's generation only, then the file is let go (`pipeline embed` may write to it meanwhile).
        with Store(ws.db_path, read_only=True) as store:
            store_generation = store.generation()
        # The indexes and the snapshot hold the store generation they were built from: any other is refused.
        if self.index_entry.stale_reason(store_generation):
            raise PipelineError(self.index_entry.stale_reason(store_generation))
        self.shards = open_shards(ws.root, self.index_entry)
        self.in_process = all(isinstance(shard, LocalShard) for shard in self.shards)
        self.has_lexical = all(entry.lexical_path for entry in self.index_entry.shard_entries())
        self._model = reuse_model
        self._default_mode, self._default_dense_weight = self.measured_defaults(manifest.search)
        self._model_lock = threading.Lock()
        self._warned_long: set[str] = set()
        if load_model and self._model is None:
            self.model  # noqa: B018 -- load now rather than on the first query

    # ---- resources
    @property
    def model(self):
        with self._model_lock:
            if self._model is None:
                self._model = load_embedder(self.model_dir)
            if not hasattr(self, "_query_tokenizer"):
                self._query_tokenizer = text_tokenizer(self._model)
                # A transformer's Hugging Face tokenizer fails ("Already borrowed") when two threads use it at
                # once, and torch spreads one forward pass over every core anyway: one batch at a time. A
                # static model's lookup has neither problem, so its queries are encoded concurrently.
                self._encode_lock = nullcontext() if is_static(self._model) else threading.Lock()
            return self._model

    def measured_defaults(self, measured: SearchEntry | None) -> tuple[str, float]:
        """The mode and hybrid weight measured best for this index's model (by `pipeline index` or
        `pipeline eval --set-default`), else DEFAULT_MODE and DEFAULT_DENSE_WEIGHT."""
        if measured is not None and measured.measured_for(self.index_entry) and measured.default_mode in MODES:
            weight = measured.dense_weight if measured.dense_weight is not None else DEFAULT_DENSE_WEIGHT
            return measured.default_mode, float(weight)
        return DEFAULT_MODE, DEFAULT_DENSE_WEIGHT

    def resolve_dense_weight(self, dense_weight: float | None) -> float:
        return self._default_dense_weight if dense_weight is None else dense_weight

    def resolve_mode(self, mode: str | None) -> str:
        if mode is None:
            mode = self._default_mode
            return mode if self.has_lexical else "dense"
        if mode in ("lexical", "hybrid") and not self.has_lexical:
            raise PipelineError(f"--mode {mode}: this index has no lexical part; run `pipeline index` again")
        return mode

    # ---- search
    def search(
        self,
        query: str,
        k: int = 10,
        mode: str | None = None,
        filters: DocumentFilter | None = None,
        dense_weight: float | None = None,
    ) -> list[Hit]:
        return self.search_many([query], k, mode, filters, dense_weight)[0]

    def search_many(
        self,
        queries: list[str],
        k: int = 10,
        mode: str | None = None,
        filters: DocumentFilter | None = None,
        dense_weight: float | None = None,
        names: list[str] | None = None,
    ) -> list[list[Hit]]:
        """Results for each query; queries are embedded in one batch (what `pipeline eval` uses).
        mode and dense_weight default to the workspace's measured defaults. A query longer than the model
        reads is embedded up to the model's input length (lexical search reads all of it); given `names`
        (how to call each query), the first time for each name, with a warning naming it."""
        queries = [check_request(q, k, mode) for q in queries]
        mode = self.resolve_mode(mode)
        dense_weight = self.resolve_dense_weight(dense_weight)
        if not 0.0 <= dense_weight <= 1.0:
            raise PipelineError(f"dense weight must be between 0 and 1, got {dense_weight}")
        depth = k if mode != "hybrid" else max(k, FUSION_DEPTH)
        vectors = None if mode == "lexical" else self.embed_queries(queries, names)
        collections = None
        if mode != "dense":  # over several shards, BM25 scores with the whole collection's statistics (DFS)
            collections = [None] * len(queries)
            if len(self.shards) > 1:
                parts = awaited([shard.statistics(query) for query in queries for shard in self.shards])
                n = len(self.shards)
                collections = [CollectionStatistics.summed(parts[i * n : (i + 1) * n]) for i in range(len(queries))]
        budget = HYBRID_WALK_BUDGET if mode == "hybrid" else None
        arguments = (vectors, queries, depth, filters, budget, collections)
        found = awaited([shard.candidates(*arguments) for shard in self.shards])
        results = []
        for i, query in enumerate(queries):
            dense = NO_RANKING if vectors is None else self._merged([shard_dense[i] for shard_dense, _ in found], depth)
            lexical = NO_RANKING if collections is None else self._merged([lex[i] for _, lex in found], depth)
            ranked = fuse(dense, lexical, dense_weight) if mode == "hybrid" else dense if mode == "dense" else lexical
            results.append(self.hits(query, ranked, k))
        return results

    def _merged(self, rankings: list[Ranking], n: int) -> Ranking:
        """The best n documents of the shards' rankings, by score, equal scores by their chunk's id: as one
        index ranks them (its chunk positions are in id order)."""
        if len(rankings) == 1:
            return rankings[0]
        rankings = [ranking for ranking in rankings if len(ranking)]
        if not rankings:
            return NO_RANKING
        merged = Ranking(
            *(
                np.concatenate([getattr(r, name) for r in rankings])
                for name in ("docs", "chunks", "scores", "shards", "chunk_ids")
            )
        )
        return merged.take(np.lexsort((merged.chunk_ids, -merged.scores))[:n])

    def hits(self, query: str, ranking: Ranking, k: int) -> list[Hit]:
        """The first k documents of `ranking` as hits, each read from its shard, ranked."""
        head = ranking.head(k)
        rows = {int(n): np.flatnonzero(head.shards == n) for n in np.unique(head.shards)}
        answers = awaited([self.shards[n].hits(query, head.take(at)) for n, at in rows.items()])
        hits: list[Hit] = [None] * len(head)  # type: ignore[list-item]
        for at, found in zip(rows.values(), answers):
            for i, hit in zip(at.tolist(), found):
                hits[i] = hit
        for rank, hit in enumerate(hits, start=1):
            hit.rank = rank
        return hits

    def document(self, doc_id: str) -> dict | None:
        """The stored document `doc_id` (from the shard holding it), or None."""
        found = awaited([shard.document(doc_id) for shard in self.shards])
        return next((document for document in found if document is not None), None)

    @property
    def fields(self) -> dict[str, str]:
        """The fields filters can use, with their types (every shard's)."""
        found = awaited([shard.fields() for shard in self.shards])
        return {name: kind for fields in found for name, kind in fields.items()}

    def embed_queries(self, queries: list[str], names: list[str] | None = None) -> np.ndarray:
        model = self.model
        limit = token_limit(model)
        with self._encode_lock:
            if is_static(model):  # one tokenizer call gives both the ids to average and each query's length
                ids = model.token_ids(queries)
                lengths = [len(text_ids) for text_ids in ids]
                vectors = model.embed_ids([text_ids[:limit] for text_ids in ids])
            else:
                cut, lengths = truncate_to_model(model, queries, self._query_tokenizer)
                vectors = encode(model, cut)
        for name, n_tokens in zip(names or [], lengths):
            if n_tokens > limit and name not in self._warned_long:  # `eval --mode all` embeds the queries twice
                self._warned_long.add(name)
                warn(
                    f"query {name} is {n_tokens:,} tokens long and the model reads {limit}: "
                    f"it is embedded up to there (lexical search reads all of it)"
                )
        return vectors

    @contextmanager
    def embedding_model(self):
        """(model, tokenizer) to embed documents with (the document API stores them as `pipeline embed`
        does): a transformer's tokenizer and forward passes, one caller at a time."""
        model = self.model
        with self._encode_lock:
            yield model, self._query_tokenizer


@functools.cache
def searching_threads() -> ThreadPoolExecutor:
    """Threads for a batch's searches, one a core: BM25 and an IVF index's search and re-scoring release the
    interpreter lock (numba, FAISS), so a batch (the server's SearchBatcher, `pipeline eval`) is searched on
    every core, not one."""
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="search")


def fuse(dense: Ranking, lexical: Ranking, dense_weight: float) -> Ranking:
    """Convex combination of the two rankings' standardised scores (module docstring). Each retriever
    adds weight * (z(d) - its lowest z), which ranks as the combination does with a missing document
    at its list's lowest score, and keeps every fused score at 0 or above. A document is shown with
    the chunk of the retriever that contributed more to it (dense on a tie); equal scores rank by their chunk's id."""
    parts = [
        (weight, ranking) for weight, ranking in ((dense_weight, dense), (1.0 - dense_weight, lexical)) if len(ranking)
    ]
    if not parts:
        return NO_RANKING
    contributions = []
    for weight, ranking in parts:
        raw, deviation = ranking.scores, ranking.scores.std()
        # all scores equal: each returned document is one deviation above those not returned
        contributions.append(weight * ((raw - raw.min()) / deviation if deviation > 0 else np.ones(len(raw))))
    keys = np.concatenate([ranking.keys for _, ranking in parts])
    chunks = np.concatenate([ranking.chunks for _, ranking in parts])
    chunk_ids = np.concatenate([ranking.chunk_ids for _, ranking in parts])
    contribution = np.concatenate(contributions)
    fused_keys, group = np.unique(keys, return_inverse=True)
    fused = np.bincount(group, weights=contribution, minlength=len(fused_keys))
    by_group = np.lexsort((-contribution, group))  # stable: among equal contributions, dense's comes first
    first_of_group = by_group[np.r_[True, group[by_group][1:] != group[by_group][:-1]]]
    best_chunk, best_chunk_id = chunks[first_of_group], chunk_ids[first_of_group]
    order = np.lexsort((best_chunk_id, -fused))  # equal scores by chunk id, as every ranking here
    return Ranking(
        fused_keys[order] & 0xFFFFFFFF, best_chunk[order], fused[order], fused_keys[order] >> 32, best_chunk_id[order]
    )
