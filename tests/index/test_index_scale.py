"""Indexes for collections of millions, exercised small: int8 vectors in the store, IVF indexes trained on a
sample and filled in slices (common/dense/ivf.py), their lists on disk under a small memory budget, IVF-PQ
candidates re-scored from the int8 copy, recall reported when tuning cannot reach its target."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from common.dense import ivf
from common.dense.index_types import make_index
from common.store import Store
from common.vectors import dequantize
from common.workspace import Workspace
from conftest import run_cli
from index.build import refresh_indexes
from search.engine import DenseIndex, SearchEngine


def test_store_holds_int8_vectors_read_in_slices(trained_workspace):
    with Store(trained_workspace / "pipeline.duckdb", read_only=True) as store:
        assert store.vector_format("vectors") == "int8"
        ids, vectors = store.load_vectors()
        slices = list(store.iter_vector_codes(batch_rows=100))
    assert len(slices) == -(-len(ids) // 100)
    np.testing.assert_array_equal(np.concatenate([s[0] for s in slices]), ids)
    np.testing.assert_array_equal(np.concatenate([dequantize(s[1], s[2]) for s in slices]), vectors)


def exact_and_widest(ws: Workspace, n_queries: int = 25):
    """(queries, the exact search's (positions, scores) for each, the loaded base index set to search at its
    widest: every list probed and, for IVF-PQ, every vector a candidate to re-score)."""
    engine = SearchEngine(ws, load_model=False)
    with Store(ws.db_path, read_only=True) as store:
        ids, vectors = store.load_vectors()
    exact = DenseIndex(make_index("flat", vectors, ids), engine.shards[0].shard.corpus.chunk_ids)
    base = engine.shards[0].shard.dense[0]
    base.inner.nprobe = base.inner.nlist
    base.rescore = len(ids)
    queries = vectors[:: len(vectors) // n_queries][:n_queries]
    return queries, exact.search(queries, 10, None), base


@pytest.mark.parametrize(
    "kind, budget_bytes", [("ivfpq", 1), ("ivfpq", 2**30), ("ivf", 1)], ids=["pq-on-disk", "pq-in-memory", "sq-on-disk"]
)
def test_ivf_built_in_slices_rescored_answers_as_exact_search(
    trained_workspace, tmp_path, monkeypatch, kind, budget_bytes
):
    monkeypatch.setattr(ivf, "SLICE_BYTES", 4 * 32 * 300)  # slices of 300 vectors of the test model's 32 dimensions
    shutil.copytree(trained_workspace, tmp_path / "ws")
    entry = refresh_indexes(Workspace(tmp_path / "ws"), kind, memory_budget=budget_bytes)
    assert entry.type == kind and entry.rescore_path.endswith(".rescore.npy")
    assert (entry.lists_path is not None) == (budget_bytes == 1)
    assert set(entry.search_setting) == {"nprobe", "rescore"}
    # the workspace moved: the index finds its on-disk lists beside it
    shutil.move(tmp_path / "ws", tmp_path / "moved")
    queries, exact, base = exact_and_widest(Workspace(tmp_path / "moved"))
    for query, (positions, scores) in zip(queries, exact):
        found, found_scores = base.search(query[None], 10, None)[0]
        np.testing.assert_allclose(found_scores, scores, atol=1e-5)  # the same best scores, in order
        assert set(found) == set(positions) or found_scores[-1] - found_scores[-2] < 1e-5  # a tie at the cut


def test_recall_below_target_is_reported(trained_workspace, tmp_path):
    """The test model's 32-dimensional vectors are near-duplicates of each other: HNSW's graph search cannot
    find their exact top 10, and says so rather than accepting it silently."""
    ws = shutil.copytree(trained_workspace, tmp_path / "ws")
    done = run_cli("index", "-w", str(ws), "--type", "hnsw", "--json")
    summary = json.loads(done.stdout)
    assert summary["recall_short"] and summary["recall_at_10"] < summary["recall_target"]
    assert "below the target" in done.stderr
    status = run_cli("status", "-w", str(ws), check=False)
    assert f"recall@10 {summary['recall_at_10']:.3f}, below the 0.95 target" in status.stdout
