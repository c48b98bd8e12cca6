"""The BM25 index (common/lexical/) against BM25 computed here from its definition: built from batches of
rows in slices merged on disk, updated (a delta beside the base, deleted chunks skipped), and searched with
pruning, which must find exactly what scoring every chunk finds."""

from __future__ import annotations

import json
import random
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse

from common.embedder import embedding_text
from common.errors import PipelineError
from common.lexical import K1, Analyzer, B, CollectionStatistics, LexicalIndex, Segment
from common.lexical import index as lexical_index
from common.lexical import segment as lexical_segment
from conftest import scifact_lines, scifact_queries

ANALYZER = Analyzer("en")
N_VALUES = (1, 7, 100, 1000)


@pytest.fixture(scope="module", autouse=True)
def small_slices_and_blocks():
    """Sizes scaled down to the test's thousands of chunks: several slices to merge, several merge ranges,
    blocks of a few postings (so that search skips some)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lexical_segment, "TOKENIZE_BATCH", 500)
        patch.setattr(lexical_segment, "SLICE_TOKENS", 20_000)
        patch.setattr(lexical_segment, "MERGE_POSTINGS", 5_000)
        patch.setattr(lexical_segment, "BLOCK", 8)
        yield


def scifact_chunks(first_document: int, documents: int, first_id: int) -> list[tuple[int, str, str]]:
    """(chunk_id, title, text): SciFact abstracts, each cut into two chunks."""
    lines = scifact_lines(documents, first_document)
    chunks = []
    for row in map(json.loads, lines):
        words = row["text"].split()
        for part in (words[: len(words) // 2], words[len(words) // 2 :]):
            chunks.append((first_id + len(chunks), row["title"], " ".join(part)))
    return chunks


def batches(rows: list, size: int = 700) -> list[list]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


class ReferenceBM25:
    """BM25 over the chunks from its definition: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), each query
    word's contribution idf * tf / (tf + k1 * (1 - b + b * length / average length)), summed. Contributions
    are rounded to float32 and summed in float64 in query order, as the index computes them, so that
    rankings compare exactly, ties (broken by position) included."""

    def __init__(self, chunks: list[tuple[int, str, str]]):
        tokens = ANALYZER.tokenize([embedding_text(title, text) for _, title, text in chunks])
        self.vocabulary: dict[str, int] = {}
        counts = [Counter(vocabulary_ids) for vocabulary_ids in ([self._id(t) for t in chunk] for chunk in tokens)]
        self.tf = scipy.sparse.csc_matrix(
            (
                [c for chunk in counts for c in chunk.values()],
                ([i for i, chunk in enumerate(counts) for _ in chunk], [t for chunk in counts for t in chunk]),
            ),
            shape=(len(chunks), len(self.vocabulary)),
        )
        n, lengths = len(chunks), np.array([len(t) for t in tokens])
        average_length = max(lengths.sum() / n, 1.0)
        self.norm = (K1 * (1 - B + B * lengths / average_length)).astype(np.float32)
        document_frequencies = np.diff(self.tf.indptr)
        self.idf = np.log(1 + (n - document_frequencies + 0.5) / (document_frequencies + 0.5)).astype(np.float32)

    def _id(self, term: str) -> int:
        return self.vocabulary.setdefault(term, len(self.vocabulary))

    def search(self, query: str, n: int, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        scores = np.zeros(self.tf.shape[0])
        for term in ANALYZER.query_terms(query):
            if term in self.vocabulary:
                t = self.vocabulary[term]
                tf = self.tf[:, [t]].toarray().ravel().astype(np.float32)
                scores += self.idf[t] * tf / (tf + self.norm)
        if mask is not None:
            scores *= mask
        found = np.flatnonzero(scores > 0)
        best = found[np.lexsort((found, -scores[found]))][:n]
        return best, scores[best]

    def common_words(self, chunks: list[tuple[int, str, str]], count: int) -> list[str]:
        """Words of the `count` terms held by the most chunks (each as a word the analyzer makes that term of)."""
        words = ANALYZER.words([embedding_text(title, text) for _, title, text in chunks])
        word_of = {stem: word for word, stem in ANALYZER.stems(words).items()}
        by_frequency = np.argsort(-np.diff(self.tf.indptr))[:count]
        terms = list(self.vocabulary)
        return [word_of[terms[t]] for t in by_frequency]


def queries(reference: ReferenceBM25, chunks: list, count: int, seed: int) -> list[str]:
    """SciFact's queries, and queries of the collection's commonest words (one to five, some repeated):
    the ones whose postings are longest, which pruning is for."""
    rng = random.Random(seed)
    scifact = scifact_queries()
    common = reference.common_words(chunks, 40)
    made = [" ".join(rng.choices(common[: rng.choice([3, 10, 40])], k=rng.randint(1, 5))) for _ in range(count)]
    return rng.sample(scifact, count) + made + [common[0], f"{common[0]} {common[0]} {common[1]}", "zzzqqq xyzzy"]


def assert_same_ranking(index: LexicalIndex, reference: ReferenceBM25, query: str, n: int, mask=None) -> None:
    positions, scores = index.search_positions(query, n, mask)
    want_positions, want_scores = reference.search(query, n, mask)
    assert positions.tolist() == want_positions.tolist(), (query, n)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, err_msg=f"{query!r}, n={n}")


@pytest.fixture(scope="module")
def base_chunks() -> list[tuple[int, str, str]]:
    return scifact_chunks(0, 1500, first_id=0)


@pytest.fixture(scope="module")
def built(base_chunks, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("built")
    LexicalIndex.write_built(directory, batches(base_chunks), ANALYZER)
    return directory


@pytest.fixture(scope="module")
def updated(built, base_chunks, tmp_path_factory) -> tuple[Path, list]:
    """The built index updated: a tenth of its chunks deleted, 600 added (new ids, after the base's)."""
    rng = random.Random(1)
    deleted = set(rng.sample([c[0] for c in base_chunks], len(base_chunks) // 10))
    added = scifact_chunks(1500, 300, first_id=len(base_chunks) + 10)
    live = [c for c in base_chunks if c[0] not in deleted] + added
    directory = tmp_path_factory.mktemp("updated")
    base = Segment.load(built / "segment-0")
    LexicalIndex.write_updated(directory, base, batches(added), np.array([c[0] for c in live]))
    return directory, live


def test_a_build_in_slices_ranks_exactly_as_bm25_defines_it(built, base_chunks):
    tokens = sum(map(len, ANALYZER.tokenize([embedding_text(t, x) for _, t, x in base_chunks])))
    assert tokens > 5 * lexical_segment.SLICE_TOKENS  # several slices, merged
    index = LexicalIndex.load(built)
    reference = ReferenceBM25(base_chunks)
    assert len(index.segments) == 1 and isinstance(index.segments[0].rows.base, np.memmap)
    for query in queries(reference, base_chunks, 40, seed=0):
        for n in N_VALUES:
            assert_same_ranking(index, reference, query, n)


def test_an_updated_index_ranks_its_live_chunks_as_bm25_defines_it(built, updated):
    directory, live = updated
    index = LexicalIndex.load(directory)
    reference = ReferenceBM25(live)
    assert len(index.segments) == 2 and len(index) == len(live)
    for name in lexical_segment.SEGMENT_FILES:  # the base is shared with the build it came from, not copied
        assert (directory / "segment-0" / name).samefile(built / "segment-0" / name)
    for query in queries(reference, live, 40, seed=1):
        for n in N_VALUES:
            assert_same_ranking(index, reference, query, n)


def test_a_filter_mask_keeps_the_ranking_exact(updated):
    directory, live = updated
    index = LexicalIndex.load(directory)
    reference = ReferenceBM25(live)
    rng = np.random.default_rng(2)
    for share in (0.5, 0.05, 0.002):  # the last lets through fewer chunks than most queries want
        mask = (rng.random(len(live)) < share).astype(np.float32)
        for query in queries(reference, live, 15, seed=3):
            for n in (10, 100):
                assert_same_ranking(index, reference, query, n, mask)


def test_a_walk_budget_bounds_the_postings_walked_and_keeps_found_chunks_scored_exactly(updated):
    """With a budget, the most common terms are only looked up: what is found is among the chunks holding the
    walked terms, each scored exactly; a budget over every posting changes nothing."""
    directory, live = updated
    index = LexicalIndex.load(directory)
    reference = ReferenceBM25(live)
    everything = sum(len(segment.rows) for segment in index.segments)
    narrowed = 0
    for query in queries(reference, live, 30, seed=6):
        exact = index.search_positions(query, 100)
        unbounded = index.search_positions(query, 100, walk_budget=everything)
        assert exact[0].tolist() == unbounded[0].tolist() and np.array_equal(exact[1], unbounded[1]), query
        positions, scores = index.search_positions(query, 100, walk_budget=50)
        want_positions, want_scores = reference.search(query, len(live))
        exact_score = dict(zip(want_positions.tolist(), want_scores.tolist()))
        np.testing.assert_allclose(scores, [exact_score[p] for p in positions.tolist()], rtol=1e-5, err_msg=query)
        assert np.all(np.diff(scores) <= 0), query
        if len(set(ANALYZER.query_terms(query)) & set(index.vocabulary)) == 1:  # its one term is always walked
            assert positions.tolist() == exact[0].tolist(), query
        narrowed += len(positions) < len(exact[0]) or positions.tolist() != exact[0].tolist()
    assert narrowed  # a budget of 50 postings does leave chunks out


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shards_searched_with_their_summed_statistics_rank_as_the_whole_index(updated, shards):
    """The collection split by document into shards, each its own index: searched with the statistics summed
    over the shards and merged by score (ties by chunk id), they give the whole index's chunks, order and
    scores."""
    directory, live = updated
    whole = LexicalIndex.load(directory)
    parts = [
        LexicalIndex.build([c for c in live if zlib.crc32(c[1].encode()) % shards == i], ANALYZER)
        for i in range(shards)
    ]
    assert sum(len(part) for part in parts) == len(live) and all(len(part) for part in parts)
    for query in queries(ReferenceBM25(live), live, 30, seed=7):
        collection = CollectionStatistics.summed([part.statistics(query) for part in parts])
        for n in (10, 100):
            found = [part.search_positions(query, n, collection=collection) for part in parts]
            ids = np.concatenate([part.chunk_ids[positions] for part, (positions, _) in zip(parts, found)])
            scores = np.concatenate([scores for _, scores in found])
            best = np.lexsort((ids, -scores))[:n]
            positions, want_scores = whole.search_positions(query, n)
            assert ids[best].tolist() == whole.chunk_ids[positions].tolist(), (query, n)
            np.testing.assert_array_equal(scores[best], want_scores, err_msg=query)


def test_an_updated_index_scores_as_a_full_build_of_the_same_chunks(updated, tmp_path):
    directory, live = updated
    LexicalIndex.write_built(tmp_path, batches(live), ANALYZER)
    incremental, scratch = LexicalIndex.load(directory), LexicalIndex.load(tmp_path)
    reference = ReferenceBM25(live)
    for query in queries(reference, live, 20, seed=4):
        got, want = incremental.search_positions(query, 50), scratch.search_positions(query, 50)
        assert got[0].tolist() == want[0].tolist() and np.array_equal(got[1], want[1]), query


def test_an_index_in_memory_ranks_as_one_written_to_disk(built, base_chunks):
    in_memory, written = LexicalIndex.build(base_chunks, ANALYZER), LexicalIndex.load(built)
    reference = ReferenceBM25(base_chunks)
    for query in queries(reference, base_chunks, 20, seed=5):
        got, want = in_memory.search_positions(query, 30), written.search_positions(query, 30)
        assert got[0].tolist() == want[0].tolist() and np.array_equal(got[1], want[1]), query


def test_many_queries_searched_in_forked_processes_rank_as_one_at_a_time(built, base_chunks, monkeypatch):
    monkeypatch.setattr(lexical_index, "QUERIES_PER_PROCESS", 8)  # forks even for a handful of queries, on 2+ cores
    index, reference = LexicalIndex.load(built), ReferenceBM25(base_chunks)
    many = queries(reference, base_chunks, 40, seed=9)
    got = index.top_many(many, 12)
    assert len(got) == len(many)
    for query, ids in zip(many, got):
        assert ids.tolist() == index.chunk_ids[reference.search(query, 12)[0]].tolist(), query
    monkeypatch.setitem(sys.modules, "grpc", None)  # a Ray process, which must not fork: threads, the same answers
    assert [ids.tolist() for ids in index.top_many(many, 12)] == [ids.tolist() for ids in got]


def test_an_index_of_an_older_layout_asks_for_pipeline_index(built, tmp_path):
    old = tmp_path / "lexical-old"
    (old / "segment-0").mkdir(parents=True)
    for name in ("chunk_ids.npy", "lengths.npy", "indptr.npy", "rows.npy"):
        (old / "segment-0" / name).write_bytes((built / "segment-0" / name).read_bytes())
    (old / "chunk_ids.npy").write_bytes((built / "chunk_ids.npy").read_bytes())
    assert not Segment.exists(old / "segment-0")
    with pytest.raises(PipelineError, match=r"from an older version; run `pipeline index`$"):
        LexicalIndex.load(old)


def test_a_truncated_postings_file_is_one_line_naming_the_index(built, tmp_path):
    damaged = tmp_path / "lexical"
    (damaged / "segment-0").mkdir(parents=True)
    for path in built.rglob("*.*"):
        (damaged / path.relative_to(built)).write_bytes(path.read_bytes())
    rows = damaged / "segment-0" / "rows.npy"
    rows.write_bytes(rows.read_bytes()[: rows.stat().st_size // 2])
    with pytest.raises(PipelineError) as error:
        LexicalIndex.load(damaged)
    message = str(error.value)
    assert len(message.splitlines()) == 1 and str(damaged) in message and "pipeline index --rebuild" in message


def test_the_store_gives_chunk_rows_in_id_order_in_batches(tmp_path):
    from common.store import ChunkRow, Store

    chunks = scifact_chunks(0, 30, first_id=100)
    with Store(tmp_path / "store.duckdb") as store:
        store.want_documents([])
        store.stage(1, "test")
        documents = {(title, f"doc-{i // 2}") for i, (_, title, _) in enumerate(chunks)}
        store.write_documents(
            [(doc_id, title, "test", "", doc_id, {}) for title, doc_id in sorted(documents, key=lambda d: d[1])],
            [ChunkRow(c, f"doc-{i // 2}", i % 2, text, 0, len(text), 0) for i, (c, _, text) in enumerate(chunks)],
            np.zeros((len(chunks), 1), np.float32),
        )
        store.publish(replace_all=True, remove=[])
    with Store(tmp_path / "store.duckdb", read_only=True) as store:
        default_memory = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
        got = list(store.iter_chunk_rows(batch_rows=7))
        assert [len(batch) for batch in got] == [7] * 8 + [4]
        assert [row for batch in got for row in batch] == chunks
        some = np.array([c[0] for c in chunks[5:12:2]])
        assert [row for batch in store.iter_chunk_rows(some) for row in batch] == chunks[5:12:2]
        assert store.con.execute("SELECT current_setting('memory_limit')").fetchone() == default_memory
