"""common/dense/: the FAISS index types, their search widths tuned, and their files written and read back."""

import faiss
import numpy as np
import pytest

from common.dense.files import write_faiss
from common.dense.reader import load_index
from common.errors import PipelineError
from common.vectors import dequantize, quantize
from conftest import ivfpq_with_rescoring


@pytest.mark.parametrize("kind, parameter", [("hnsw", "efSearch"), ("ivfpq", "nprobe")])
def test_an_approximate_index_is_searched_wide_enough_to_find_the_target_recall(kind, parameter, tmp_path):
    """Started at width 1 (far below the target on random vectors), the build's tuning widens the search
    (IVF-PQ: its probes and its re-scored candidates) until recall@10 on held-out neighbours reaches
    TARGET_RECALL, and the index file keeps the width."""
    from common.dense.index_types import (
        TARGET_RECALL,
        exact_neighbours,
        make_index,
        recall_at_10,
        rescored_search,
        tune_search,
    )

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1000, 4000, dtype=np.int64)
    index, rows = (
        (make_index(kind, vectors, ids), None) if kind == "hnsw" else ivfpq_with_rescoring(vectors, ids, 32, tmp_path)
    )
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    holder = inner.hnsw if kind == "hnsw" else inner
    setattr(holder, parameter, 1)

    def search(factor=None):
        return rescored_search(index, rows, factor) if kind == "ivfpq" else lambda q, k: index.search(q, k)[1]

    assert recall_at_10(search(1), *exact_neighbours(ids, vectors)) < TARGET_RECALL
    recall, setting = tune_search(index, kind, *exact_neighbours(ids, vectors), rows)
    assert recall >= TARGET_RECALL and setting[parameter] > 1
    other_queries = exact_neighbours(ids, vectors, seed=1)
    assert recall_at_10(search(setting.get("rescore")), *other_queries) >= TARGET_RECALL - 0.03
    loaded = load_index(write_faiss(index, tmp_path, "faiss"))  # owns the inner index: kept alive with it
    reloaded = faiss.downcast_index(faiss.downcast_index(loaded).index)
    assert getattr(reloaded.hnsw if kind == "hnsw" else reloaded, parameter) == setting[parameter]


def test_hnsw_over_wide_vectors_builds_its_graph_on_their_principal_components_and_searches_them_whole(tmp_path):
    """Vectors wider than GRAPH_DIMENSIONS: the graph comes from their leading principal components, but
    the index holds the full vectors (float16), finds each stored vector as its own nearest neighbour,
    reaches the recall target once tuned, and survives writing and reading."""
    from common.dense.index_types import GRAPH_DIMENSIONS, TARGET_RECALL, exact_neighbours, make_index, tune_search

    rng = np.random.default_rng(0)
    dim = 2 * GRAPH_DIMENSIONS + 64
    # Embedding-like: most of the variance in a few dozen directions, plus noise in all of them.
    vectors = (
        rng.standard_normal((4000, 48)) @ rng.standard_normal((48, dim)) + 0.3 * rng.standard_normal((4000, dim))
    ).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(4000, dtype=np.int64) * 7 + 5
    index = make_index("hnsw", vectors, ids)
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    assert index.ntotal == inner.ntotal == inner.storage.ntotal == 4000 and inner.d == dim
    assert np.abs(inner.reconstruct(123) - vectors[123]).max() < 1e-3  # the full vector, in float16
    scores, found = index.search(vectors[:50], 1)
    assert (found[:, 0] == ids[:50]).all() and np.allclose(scores[:, 0], 1.0, atol=1e-3)
    recall, _ = tune_search(index, "hnsw", *exact_neighbours(ids, vectors))
    assert recall >= TARGET_RECALL
    reloaded = load_index(write_faiss(index, tmp_path, "faiss"))
    assert (reloaded.search(vectors[:50], 1)[1][:, 0] == ids[:50]).all()


def test_int8_codes_keep_direction_and_unit_length():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 256)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    codes, scales = quantize(vectors)
    assert codes.dtype == np.int8 and np.abs(codes).max() == 127
    restored = dequantize(codes, scales)
    np.testing.assert_allclose(np.linalg.norm(restored, axis=1), 1.0, atol=1e-5)
    assert (np.sum(restored * vectors, axis=1) > 0.999).all()
    # each stored vector is its own nearest: rounding changes a direction, never a length
    assert (np.argmax(restored @ restored.T, axis=1) == np.arange(len(vectors))).all()


def test_tuning_queries_are_spans_of_the_documents_words():
    """Tuning's queries: QUERY_WORDS consecutive words of each text, the text whole when shorter, a text
    without spaces cut by characters, no empty query."""
    from common.dense.index_types import QUERY_WORDS, query_spans

    long_text = " ".join(f"w{i}" for i in range(100))
    chinese = "这是一个没有空格的很长的句子" * 10
    spans = query_spans([long_text, "three short words", chinese, "", "   "])
    assert len(spans) == 3
    words = spans[0].split()
    first = int(words[0][1:])
    assert words == [f"w{i}" for i in range(first, first + QUERY_WORDS)]
    assert spans[1] == "three short words"
    assert len(spans[2]) == 4 * QUERY_WORDS and spans[2] in chinese
    assert query_spans([long_text], seed=1) != query_spans([long_text], seed=2)  # seeded starts


def test_an_index_file_is_written_under_a_new_name_and_read_back_answering_as_it_did(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((200, 16)).astype(np.float32)
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(16))
    index.add_with_ids(vectors, np.arange(200, dtype=np.int64) * 3)
    first, second = write_faiss(index, tmp_path, "faiss"), write_faiss(index, tmp_path, "faiss")
    assert first != second and sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name])
    expected = index.search(vectors[:5], 3)
    found = load_index(first).search(vectors[:5], 3)
    np.testing.assert_array_equal(found[1], expected[1])
    np.testing.assert_allclose(found[0], expected[0], rtol=1e-6)


def test_a_missing_or_damaged_index_file_is_one_error_naming_it_and_the_fix(tmp_path):
    index = faiss.IndexFlatIP(8)
    index.add(np.eye(8, dtype=np.float32))
    path = write_faiss(index, tmp_path, "faiss")
    path.write_bytes(path.read_bytes()[:40])  # truncated
    with pytest.raises(PipelineError, match=rf"{path}: damaged FAISS index file.*pipeline index --rebuild"):
        load_index(path)
    with pytest.raises(PipelineError, match=r"gone\.index: index file missing; run `pipeline index --rebuild`"):
        load_index(tmp_path / "gone.index")
