"""A sharded index (index/shards.py) answers as one index over the same store: lexical (BM25 with the
collection's statistics summed over the shards), dense (exact) and hybrid give the same documents, in the same
order, with the same scores, chunks and snippets, filtered or not."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from common.manifest import read_manifest
from common.workspace import Workspace
from conftest import run_cli, shard_queries_and_filters, sharded_copy
from index.build import refresh_indexes
from index.shards import shard_of
from search.engine import SearchEngine

SHARD_QUERIES, SHARD_FILTERS = shard_queries_and_filters()


# The session's static-embedded workspace: what is tested is how shards split and merge, for any embedder, and a
# static one encodes queries and starts servers without sentence-transformers.
@pytest.fixture(scope="module")
def whole(static_workspace) -> SearchEngine:
    assert read_manifest(Workspace(static_workspace)).index.type == "flat"
    return SearchEngine(Workspace(static_workspace))


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shards_answer_as_the_whole_index(whole, static_workspace, tmp_path, shards):
    ws = sharded_copy(static_workspace, tmp_path / "ws", shards)
    entry = read_manifest(ws).index
    assert len(entry.shards) == shards and sum(shard["vectors"] for shard in entry.shards) == entry.vectors
    engine = SearchEngine(ws)
    for local in engine.shards:  # each document in the shard its id says, with all its chunks
        corpus = local.shard.corpus
        assert {shard_of(corpus.doc_id(i), shards) for i in range(corpus.n_documents)} == {local.shard.number}
    for filters in SHARD_FILTERS:
        for mode in ("dense", "lexical", "hybrid"):
            for query in SHARD_QUERIES:
                want = whole.search(query, 10, mode, filters, dense_weight=0.4)
                got = engine.search(query, 10, mode, filters, dense_weight=0.4)
                where = (query, mode, filters)
                assert [h.doc_id for h in got] == [h.doc_id for h in want], where
                assert [(h.chunk_id, h.snippet, h.rank) for h in got] == [(h.chunk_id, h.snippet, h.rank) for h in want]
                np.testing.assert_allclose([h.score for h in got], [h.score for h in want], rtol=0, atol=1e-5)
    doc_id = whole.shards[0].shard.corpus.doc_id(7)
    assert engine.document(doc_id) == whole.document(doc_id)
    assert engine.fields == whole.fields


def test_a_sharded_index_is_built_in_full_again_and_keeps_its_shard_count(static_workspace, tmp_path):
    ws = sharded_copy(static_workspace, tmp_path / "ws", 2)
    first = read_manifest(ws).index
    refresh_indexes(ws, "flat")  # no --shards: as the last build
    again = read_manifest(ws).index
    assert len(again.shards) == 2 and again.build_id != first.build_id
    assert not (ws.root / first.path).exists()  # the older build's shards are removed once the manifest moved on


def test_more_shards_than_documents_is_one_line_before_anything_is_written(static_workspace, tmp_path):
    ws = Workspace(tmp_path / "ws")
    shutil.copytree(static_workspace, ws.root)
    before = read_manifest(ws).index
    with pytest.raises(Exception, match="shard .* would hold no documents"):
        refresh_indexes(ws, "flat", shards=500)
    assert read_manifest(ws).index == before
    assert not list(ws.index_dir.glob("shards-*"))


@pytest.mark.ray
def test_shards_built_as_ray_tasks_are_the_shards_built_here(whole, static_workspace, tmp_path, ray_cluster):
    ws = Workspace(tmp_path / "ray")
    shutil.copytree(static_workspace, ws.root)
    run_cli("index", "-w", str(ws.root), "--type", "flat", "--shards", "3", "--ray", ray_cluster)
    entry = read_manifest(ws).index
    corpus = whole.shards[0].shard.corpus
    owners = [shard_of(corpus.doc_id(i), 3) for i in range(corpus.n_documents)]
    assert [shard["documents"] for shard in entry.shards] == [owners.count(n) for n in range(3)]
    engine = SearchEngine(ws)
    for query in SHARD_QUERIES[:10]:
        want = whole.search(query, 10, "hybrid", dense_weight=0.4)
        assert [h.doc_id for h in engine.search(query, 10, "hybrid", dense_weight=0.4)] == [h.doc_id for h in want]


def test_document_writes_update_only_their_shards_and_answer_as_a_full_build(whole, static_workspace, tmp_path):
    """Served on one machine, a sharded index takes the document API's writes: the shard the documents belong
    to is updated (a delta beside its base, its snapshot written anew, what it replaced removed), the other one
    kept as it was (its files and build id), and the index answers as a sharded one built in full over the same
    store would."""
    import httpx

    from server import running_server

    ws = sharded_copy(static_workspace, tmp_path / "ws", 2)
    before = read_manifest(ws).index
    ids = [doc_id for doc_id in (f"note-{i}" for i in range(20)) if shard_of(doc_id, 2) == 0][:3]
    notes = [{"id": doc_id, "title": "A note", "text": f"Quokka survey {doc_id} on an island."} for doc_id in ids]
    corpus = whole.shards[0].shard.corpus
    deleted = next(d for d in (corpus.doc_id(i) for i in range(corpus.n_documents)) if shard_of(d, 2) == 0)
    with running_server(ws.root) as base, httpx.Client(base_url=base, timeout=120) as client:
        written = client.post("/documents", json={"documents": notes})
        assert written.status_code == 200, written.text
        assert written.json()["index"]["update"] == "incremental"
        assert client.delete(f"/documents/{deleted}").status_code == 200
        found = client.get("/search", params={"q": "quokka survey island", "k": 5, "mode": "lexical"}).json()
        assert {hit["doc_id"] for hit in found["results"][:3]} == set(ids)
        assert client.get(f"/documents/{deleted}").status_code == 404
    after = read_manifest(ws).index
    assert after.shards[1] == before.shards[1]  # untouched: the same files, the same build
    assert after.shards[0]["build_id"] != before.shards[0]["build_id"] and after.shards[0]["delta_vectors"] > 0
    assert not (ws.root / before.shards[0]["corpus_path"]).exists()  # what the update replaced is removed
    assert (ws.root / before.shards[0]["path"]).exists()  # the base it kept is not
    rebuilt = Workspace(tmp_path / "rebuilt")
    shutil.copytree(ws.root, rebuilt.root)
    refresh_indexes(rebuilt, "flat")  # `pipeline index`: the shards built in full
    assert read_manifest(rebuilt).index.update == "full"
    engine, full = SearchEngine(ws), SearchEngine(rebuilt)
    for mode in ("dense", "lexical", "hybrid"):
        for query in [*SHARD_QUERIES[:10], "quokka survey island"]:
            want = full.search(query, 10, mode, dense_weight=0.4)
            got = engine.search(query, 10, mode, dense_weight=0.4)
            assert [h.doc_id for h in got] == [h.doc_id for h in want], (query, mode)
            np.testing.assert_allclose([h.score for h in got], [h.score for h in want], rtol=0, atol=1e-5)
