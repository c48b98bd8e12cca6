"""BM25 over the live chunks held by one or more segments: built, updated with a delta, written, loaded and
searched (the kernel: kernel.py), one query at a time or many in forked processes; and the statistics a
sharded collection sums."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from common.errors import PipelineError
from common.lexical.analysis import ANALYZER_FILE, Analyzer
from common.lexical.bm25 import idf_of, mean_length_of, norms_of
from common.lexical.kernel import LiveSegment, QueryTerms, segment_top
from common.lexical.segment import Segment

DOCUMENT_FREQUENCIES_FILE = "document_frequencies.npy"


class LexicalIndex:
    """BM25 over the live chunks (`chunk_ids`, sorted) held by one or more segments."""

    def __init__(
        self,
        segments: list[Segment],
        chunk_ids: np.ndarray,
        analyzer: Analyzer,
        document_frequencies: np.ndarray | None = None,
    ):
        """document_frequencies: the live chunks' (as written with the index); computed when not given."""
        self.segments = segments
        self.analyzer = analyzer
        self.chunk_ids = chunk_ids  # position -> chunk id, ascending: the order of the store's chunks
        self.vocabulary = {
            term: i for i, term in enumerate(itertools.chain.from_iterable(s.new_terms for s in segments))
        }
        n = len(chunk_ids)
        positions = [self._positions(segment.chunk_ids) for segment in segments]
        if sum(int(np.count_nonzero(p >= 0)) for p in positions) != n:
            raise PipelineError("the BM25 index does not hold the stored chunks: run `pipeline index`")
        self.total_length = sum(int(s.lengths[p >= 0].sum(dtype=np.int64)) for s, p in zip(segments, positions))
        if document_frequencies is None:
            document_frequencies = np.zeros(len(self.vocabulary), np.int64)
            for segment, segment_positions in zip(segments, positions):
                frequencies = segment.document_frequencies(segment_positions >= 0)
                document_frequencies[: len(frequencies)] += frequencies
        self.document_frequencies = document_frequencies
        self.idf = idf_of(n, document_frequencies)
        self._segment_positions = positions
        self.average_length = mean_length_of(self.total_length, n)
        self.live_segments = self._live_segments(self.average_length)
        self._lock = threading.Lock()
        self._at_collection_average: tuple[float, list[LiveSegment]] | None = None

    def _live_segments(self, average_length: float) -> list["LiveSegment"]:
        return [
            LiveSegment(segment, segment_positions, norms_of(segment.lengths, average_length), average_length)
            for segment, segment_positions in zip(self.segments, self._segment_positions)
        ]

    def _segments_at(self, average_length: float) -> list["LiveSegment"]:
        """The live segments with norms at a collection's average length (a sharded search's, which changes
        only when some shard's chunks do): computed once per average, a pass over the lengths."""
        if average_length == self.average_length:
            return self.live_segments
        with self._lock:
            if self._at_collection_average is None or self._at_collection_average[0] != average_length:
                self._at_collection_average = (average_length, self._live_segments(average_length))
            return self._at_collection_average[1]

    def _positions(self, segment_chunk_ids: np.ndarray) -> np.ndarray:
        """Each segment row's position among the live chunks, or -1 when it was deleted."""
        n = len(self.chunk_ids)
        if not n:
            return np.full(len(segment_chunk_ids), -1, np.int32)
        at = np.minimum(np.searchsorted(self.chunk_ids, segment_chunk_ids), n - 1)
        return np.where(self.chunk_ids[at] == segment_chunk_ids, at, -1).astype(np.int32)

    @classmethod
    def build(cls, rows: list[tuple[int, str, str]], analyzer: Analyzer) -> "LexicalIndex":
        """An index in memory (a few hundred thousand chunks at most). rows: (chunk_id, document title,
        chunk text), in chunk_id order."""
        segment = Segment.build(rows, {}, analyzer)
        return cls([segment], segment.chunk_ids, analyzer)

    @classmethod
    def with_delta(
        cls, base: Segment, analyzer: Analyzer, delta_rows: list[tuple[int, str, str]], chunk_ids: np.ndarray
    ) -> "LexicalIndex":
        """The index over `chunk_ids` (the live chunks, sorted): those of `base` that are live, and
        `delta_rows` (the chunks added since the base; chunk_id order), a segment in memory analysed by
        `analyzer` (the base's)."""
        vocabulary = {term: i for i, term in enumerate(base.new_terms)}
        return cls([base, Segment.build(delta_rows, vocabulary, analyzer)], chunk_ids, analyzer)

    @classmethod
    def write_built(cls, directory: Path, batches: Iterable[list[tuple[int, str, str]]], analyzer: Analyzer) -> None:
        """Build the index of the rows in `batches` (lists of (chunk_id, document title, chunk text), in
        chunk_id order) into `directory` (existing, empty), in bounded memory."""
        segment = Segment.write(directory / "segment-0", batches, {}, analyzer)
        cls([segment], segment.chunk_ids, analyzer)._write_statistics(directory)

    @classmethod
    def write_updated(
        cls, directory: Path, base: Segment, delta_batches: Iterable[list[tuple[int, str, str]]], chunk_ids: np.ndarray
    ) -> None:
        """Write the index over `chunk_ids` (the live chunks, sorted) into `directory` (existing, empty): the
        base's files linked, its deleted chunks skipped, and the rows of `delta_batches` (the chunks added
        since the base, as write_built takes them) a new segment analysed as the base was."""
        base.link(directory / "segment-0")
        vocabulary = {term: i for i, term in enumerate(base.new_terms)}
        analyzer = Analyzer.load(base.source.parent)  # the index directory the base segment is in
        delta = Segment.write(directory / "segment-1", delta_batches, vocabulary, analyzer)
        cls([base, delta], chunk_ids, analyzer)._write_statistics(directory)

    def _write_statistics(self, directory: Path) -> None:
        """What the index adds to its segments: the analyzer, the live chunks and their document frequencies."""
        (directory / ANALYZER_FILE).write_text(json.dumps(self.analyzer.to_json()))
        np.save(directory / DOCUMENT_FREQUENCIES_FILE, self.document_frequencies)
        np.save(directory / "chunk_ids.npy", self.chunk_ids)

    def __len__(self) -> int:
        return len(self.chunk_ids)

    @classmethod
    def load(cls, path: Path) -> "LexicalIndex":
        """The index written into `path`, its arrays memory-mapped. An index written before this layout
        (postings without blocks) is refused: `pipeline index` writes it again."""
        segments = sorted(path.glob("segment-*"), key=lambda p: int(p.name.split("-")[1]))
        if not (path / DOCUMENT_FREQUENCIES_FILE).exists() or not segments or not all(map(Segment.exists, segments)):
            raise PipelineError(f"{path}: lexical index missing or from an older version; run `pipeline index`")
        try:
            return cls(
                [Segment.load(s) for s in segments],
                np.load(path / "chunk_ids.npy"),
                Analyzer.load(path),
                np.load(path / DOCUMENT_FREQUENCIES_FILE),
            )
        except (OSError, ValueError, EOFError, KeyError, IndexError) as e:  # a truncated or overwritten file
            raise PipelineError(
                f"{path}: damaged BM25 index "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}); "
                "run `pipeline index --rebuild`"
            ) from None

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best n (chunk ids, BM25 scores), best first; only chunks matching a query word, and only
        `allowed` chunk ids if given."""
        mask = np.isin(self.chunk_ids, allowed).astype(np.float32) if allowed is not None else None
        positions, scores = self.search_positions(query, n, mask)
        return self.chunk_ids[positions], scores

    def statistics(self, query: str) -> "CollectionStatistics":
        """This index's part of what BM25 needs of the whole collection for `query`: its live chunks, their
        total length and the document frequency of each of the query's terms. A search over shards sums them
        over its shards first (the DFS phase of a distributed search engine) and searches each with the sums."""
        frequencies = {
            term: int(self.document_frequencies[self.vocabulary[term]]) if term in self.vocabulary else 0
            for term in self.analyzer.query_terms(query)
        }
        return CollectionStatistics(len(self.chunk_ids), self.total_length, frequencies)

    def search_positions(
        self,
        query: str,
        n: int,
        weight_mask: np.ndarray | None = None,
        walk_budget: int | None = None,
        collection: "CollectionStatistics | None" = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best n (positions in the corpus, i.e. in chunk-id order; BM25 scores), best first (ties by
        position); only chunks sharing a word with the query, and only where weight_mask (1.0 per allowed
        position, 0 elsewhere) is set. Exactly the exhaustive ranking, found with pruning (module docstring),
        unless walk_budget is given: then the postings walked in full are bounded (module docstring).
        `collection`: the statistics of a collection this index is a shard of (statistics() summed over its
        shards), which the scores are then computed with; without it, this index's own."""
        query_words = [t for t in self.analyzer.query_terms(query) if t in self.vocabulary]
        positions, scores = np.zeros(0, np.int64), np.zeros(0, np.float64)
        if min(n, len(self.chunk_ids)) == 0 or not query_words:
            return positions, scores.astype(np.float32)
        terms, first, occurrences = np.unique(
            [self.vocabulary[t] for t in query_words], return_index=True, return_inverse=True
        )
        if collection is None:
            idf, segments = self.idf[terms], self.live_segments
        else:
            frequencies = np.array([collection.document_frequencies[query_words[i]] for i in first], np.int64)
            idf = idf_of(collection.chunks, frequencies)
            segments = self._segments_at(mean_length_of(collection.total_length, collection.chunks))
        query_terms = QueryTerms(terms, occurrences, np.bincount(occurrences).astype(np.float64), idf)
        threshold = 0.0  # the n-th best score found so far: a later segment's chunks must reach it
        for segment in segments:
            found_positions, found_scores = segment_top(segment, query_terms, weight_mask, n, threshold, walk_budget)
            positions, scores = np.concatenate([positions, found_positions]), np.concatenate([scores, found_scores])
            best = np.lexsort((positions, -scores))[:n]
            positions, scores = positions[best], scores[best]
            if len(scores) == n:
                threshold = scores[-1]
        return positions, scores.astype(np.float32)

    def top_many(self, queries: list[str], k: int) -> list[np.ndarray]:
        """The best k chunk ids of each query, best first, in a process per core. Analysing a query is Python
        and holds the interpreter lock, so threads queue on it (many threads mined hard negatives hardly faster
        than one core; measured: benchmarks/results/2026-11-28-design-measurements-cpu.md); forked processes share
        the index as it is in memory. With few queries one process does it; where forking is unsafe (no fork,
        or gRPC's threads in this process), threads."""
        processes = min(len(os.sched_getaffinity(0)), len(queries) // QUERIES_PER_PROCESS)
        # gRPC's threads (a Ray driver or worker: this process) do not survive a fork: threads then
        unsafe_to_fork = "grpc" in sys.modules or "fork" not in multiprocessing.get_all_start_methods()
        if processes >= 2 and unsafe_to_fork:
            with ThreadPoolExecutor(processes, thread_name_prefix="bm25") as pool:
                return list(pool.map(lambda query: self.top_chunk_ids(query, k), queries))
        if processes < 2:
            return [self.top_chunk_ids(query, k) for query in queries]
        global _FORKED_SEARCH
        _FORKED_SEARCH = (self, k)
        try:
            with multiprocessing.get_context("fork").Pool(processes) as pool:
                return pool.map(_top_in_forked_process, queries, chunksize=-(-len(queries) // (processes * 8)))
        finally:
            _FORKED_SEARCH = None

    def top_chunk_ids(self, query: str, k: int) -> np.ndarray:
        return self.chunk_ids[self.search_positions(query, k)[0]]


QUERIES_PER_PROCESS = 256  # fewer queries than this a process are searched in this one: a fork costs more
_FORKED_SEARCH: tuple[LexicalIndex, int] | None = None  # the index and k that top_many's forked processes search


def _top_in_forked_process(query: str) -> np.ndarray:
    index, k = _FORKED_SEARCH
    return index.top_chunk_ids(query, k)


@dataclass(frozen=True)
class CollectionStatistics:
    """What BM25's scores depend on beyond a chunk's own counts, for one query: the collection's live chunks,
    their total length (tokens), and the number of chunks holding each of the query's terms."""

    chunks: int
    total_length: int
    document_frequencies: dict[str, int]

    @classmethod
    def summed(cls, parts: "list[CollectionStatistics]") -> "CollectionStatistics":
        """A collection's, from its shards' (each a LexicalIndex's statistics() for the same query)."""
        frequencies: dict[str, int] = {}
        for part in parts:
            for term, count in part.document_frequencies.items():
                frequencies[term] = frequencies.get(term, 0) + count
        return cls(sum(p.chunks for p in parts), sum(p.total_length for p in parts), frequencies)
