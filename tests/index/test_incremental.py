"""Incremental index updates: adds, changes and deletes since the last full build answer as a full build
over the same documents does, and a deleted document never comes back from any retriever."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from common.store import Store
from common.workspace import Workspace
from conftest import assert_corpus_matches_store, run_cli, scifact_rows
from embed.run import run_embed
from embed.settings import EmbedSettings
from index.build import refresh_indexes
from search.engine import SearchEngine
from search.filters import DocumentFilter

CHUNKING = dict(chunk_tokens=64, overlap=8)
MODES = ("dense", "lexical", "hybrid")


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def document_ids(engine: SearchEngine) -> list[str]:
    return [engine.shards[0].shard.corpus.doc_id(i) for i in range(engine.shards[0].shard.corpus.n_documents)]


def answers(engine: SearchEngine, queries: list[str], mode: str, k: int = 10) -> list[list[tuple[str, float]]]:
    return [[(h.doc_id, h.score) for h in hits] for hits in engine.search_many(queries, k, mode, dense_weight=0.5)]


def assert_same_ranking(got: list[tuple[str, float]], want: list[tuple[str, float]], tolerance: float = 1e-4) -> None:
    """Same scores rank by rank, and the same document wherever its score is not tied with a neighbour's
    (two workspaces order tied chunks by their own chunk ids)."""
    assert len(got) == len(want)
    got_scores, want_scores = np.array([s for _, s in got]), np.array([s for _, s in want])
    assert np.allclose(got_scores, want_scores, atol=tolerance)
    for i, ((got_doc, _), (want_doc, score)) in enumerate(zip(got, want)):
        neighbours = [want[j][1] for j in (i - 1, i + 1) if 0 <= j < len(want)]
        if all(abs(score - other) > tolerance for other in neighbours) and i < len(want) - 1:
            assert got_doc == want_doc


@pytest.fixture(scope="module")
def updated(trained_workspace, tmp_path_factory):
    """A copy of the shared workspace, updated twice (adds, changes, deletes) and indexed incrementally
    each time, and a workspace built from scratch on the final documents with the same model."""
    root = tmp_path_factory.mktemp("incremental")
    ws = Workspace(root / "ws")
    shutil.copytree(trained_workspace, ws.root)
    data = root / "docs.jsonl"
    rows = source_rows(ws)
    new = scifact_rows(6, start=600)
    titles = {r["_id"]: r["title"] for r in rows + new}

    # The base: the same documents from a file of the test's own (a document's source is part of what it is).
    run_embed(ws, [write_rows(data, rows)], None, EmbedSettings(**CHUNKING, prune=True))
    assert refresh_indexes(ws).update == "full"

    # First update: 4 documents added, 2 changed, 3 deleted.
    rows[5]["text"] += " Zebrafish regeneration was also observed."
    rows[6]["title"] = "A retitled study of telomerase"
    deleted = [rows.pop(10)["_id"], rows.pop(20)["_id"], rows.pop(30)["_id"]]
    rows += new[:4]
    run_embed(ws, [write_rows(data, rows)], None, EmbedSettings(**CHUNKING, prune=True))
    first = refresh_indexes(ws)

    # Second update: one document added in the first update deleted, another changed, two more added.
    deleted.append(rows.pop(-1)["_id"])
    rows[-1]["text"] = "Mitochondrial fission in cardiomyocytes. " + rows[-1]["text"]
    rows += new[4:]
    run_embed(ws, [write_rows(data, rows)], None, EmbedSettings(**CHUNKING, prune=True))
    second = refresh_indexes(ws)

    scratch = Workspace(root / "scratch").create()
    run_embed(scratch, [data], None, EmbedSettings(model_dir=ws.model_dir, **CHUNKING))
    refresh_indexes(scratch)
    queries = [r["title"] for r in rows[::9]] + ["telomerase", "zebrafish regeneration", "mitochondrial fission heart"]
    return {
        "ws": ws,
        "data": data,
        "scratch": scratch,
        "first": first,
        "second": second,
        "deleted": deleted,
        "rows": rows,
        "queries": queries,
        "deleted_titles": [titles[d] for d in deleted],
    }


def source_rows(ws: Workspace) -> list[dict]:
    """The documents the workspace was pretrained and embedded on."""
    source = Path(json.loads(ws.manifest_path.read_text())["tokenizer"]["sources"][0])
    return [json.loads(line) for line in source.read_text().splitlines()]


def test_small_changes_update_the_index_instead_of_rebuilding_it(updated):
    first, second = updated["first"], updated["second"]
    assert first.update == second.update == "incremental"
    assert first.path == second.path  # the base FAISS index is kept
    assert first.delta_vectors > 0 and second.delta_vectors > 0
    assert second.deleted_in_base >= first.deleted_in_base > 0
    index_files = sorted(p.name for p in updated["ws"].index_dir.iterdir())
    assert len(index_files) == 4  # the base, the delta, the lexical and corpus directories; older versions removed


def test_an_updated_index_answers_as_a_full_build_of_the_same_documents(updated):
    incremental, scratch = SearchEngine(updated["ws"]), SearchEngine(updated["scratch"])
    assert document_ids(incremental) == document_ids(scratch)
    for mode in MODES:
        # A hybrid score divides by the deviation of the top 100 scores, which for this tiny model's cosines is
        # ~5e-5: cosines that differ by float rounding (~1e-7: a base with deletions is scanned query by query,
        # a full build's queries in one matrix product) differ by up to ~3e-3 there.
        tolerance = 5e-3 if mode == "hybrid" else 1e-4
        for got, want in zip(
            answers(incremental, updated["queries"], mode), answers(scratch, updated["queries"], mode)
        ):
            assert_same_ranking(got, want, tolerance)


def test_deleted_and_replaced_documents_never_come_back(updated):
    engine = SearchEngine(updated["ws"])
    deleted = set(updated["deleted"])
    everyone = DocumentFilter.of({"year": {"gte": 0}})  # the filtered path too (selectors over the live slots)
    for mode in MODES:
        for filters in (None, everyone):
            for hits in engine.search_many(updated["deleted_titles"], 100, mode, filters):
                assert deleted.isdisjoint(h.doc_id for h in hits)
    # A changed document is found by its new text, and its old chunks are gone.
    hits = engine.search("Zebrafish regeneration was also observed", 3, "lexical")
    assert (
        hits and hits[0].doc_id == updated["rows"][5]["_id"] and "Zebrafish" in engine.document(hits[0].doc_id)["text"]
    )
    chunk_docs = [engine.shards[0].shard.corpus.doc_id(d) for d in engine.shards[0].shard.corpus.chunk_docs.tolist()]
    assert deleted.isdisjoint(chunk_docs)


def test_an_update_writes_the_snapshot_of_the_changed_store(updated):
    """The corpus snapshot search reads is the store's after the update: documents added, changed, deleted."""
    assert updated["second"].update == "incremental"
    corpus = SearchEngine(updated["ws"]).shards[0].shard.corpus
    with Store(updated["ws"].db_path, read_only=True) as store:
        assert_corpus_matches_store(corpus, store)
    rows = updated["rows"]
    assert all(corpus.position_of(doc_id) is None for doc_id in updated["deleted"])
    assert corpus.text(corpus.position_of(rows[5]["_id"])).endswith("Zebrafish regeneration was also observed.")
    assert corpus.title(corpus.position_of(rows[6]["_id"])) == "A retitled study of telomerase"
    assert corpus.text(corpus.position_of(rows[-3]["_id"])).startswith("Mitochondrial fission in cardiomyocytes.")
    assert corpus.n_documents == len(rows)


def test_deletes_from_an_hnsw_base_never_come_back_and_large_changes_rebuild(updated, tmp_path):
    ws = Workspace(tmp_path / "ws")
    shutil.copytree(updated["ws"].root, ws.root)
    assert refresh_indexes(ws, "hnsw").update == "full"  # another type than the last build
    rows = updated["rows"]
    gone = rows[:3]
    # The same file as the documents' source (the last test to use it): only the deletions differ.
    run_embed(ws, [write_rows(updated["data"], rows[3:])], None, EmbedSettings(**CHUNKING, prune=True))
    summary = refresh_indexes(ws, "hnsw")
    assert summary.update == "incremental" and summary.type == "hnsw" and summary.delta_path is None
    engine = SearchEngine(ws)
    for mode in MODES:
        for hits in engine.search_many([r["title"] for r in gone], 100, mode):
            assert {r["_id"] for r in gone}.isdisjoint(h.doc_id for h in hits)

    run_embed(ws, [write_rows(updated["data"], rows[3:60])], None, EmbedSettings(**CHUNKING, prune=True))
    rebuilt = refresh_indexes(ws, "hnsw")
    assert rebuilt.update == "full" and "over 10%" in rebuilt.update_reason
    assert rebuilt.deleted_in_base == 0 and rebuilt.base_vectors == rebuilt.vectors


def test_one_writer_at_a_time(updated, monkeypatch):
    """While another process writes (holds the workspace's writer lock), `embed` and `index` wait, then
    fail with one line and change nothing."""
    from filelock import FileLock

    ws = updated["ws"]
    before = json.loads(ws.manifest_path.read_text())
    monkeypatch.setenv("PIPELINE_LOCK_WAIT", "0.5")
    with FileLock(ws.writer_lock_path):
        for command in (["index", "--rebuild"], ["embed", "--data", str(updated["data"])]):
            result = run_cli(*command, "-w", str(ws.root), check=False)
            assert result.returncode == 2 and "another command is writing to this workspace" in result.stderr
    assert json.loads(ws.manifest_path.read_text()) == before
    assert run_cli("index", "-w", str(ws.root), "--json").returncode == 0  # free again


def test_an_ivf_base_takes_added_chunks_in_its_trained_lists_and_rebuilds_when_they_drift(
    updated, tmp_path, monkeypatch
):
    from index import update as index_update

    ws = Workspace(tmp_path / "ws")
    shutil.copytree(updated["ws"].root, ws.root)
    assert refresh_indexes(ws, "ivfpq").update == "full"
    rows, new = updated["rows"], scifact_rows(5, start=700)
    # The same file as the documents' source (the tests before this one wrote it too): 2 deleted, 5 added.
    run_embed(ws, [write_rows(updated["data"], rows[2:] + new)], None, EmbedSettings(**CHUNKING, prune=True))
    summary = refresh_indexes(ws, "ivfpq")
    assert summary.update == "incremental" and summary.delta_vectors > 0
    assert summary.delta_rescore_path and summary.trained_path

    engine = SearchEngine(ws)
    for part in engine.shards[0].shard.dense:  # searched at their widest, the base and the delta answer as exact search
        part.inner.nprobe, part.rescore = part.inner.nlist, part.ntotal
    added = {r["_id"] for r in new}
    added_chunks = [
        i
        for i, d in enumerate(engine.shards[0].shard.corpus.chunk_docs)
        if engine.shards[0].shard.corpus.doc_id(d) in added
    ]
    with Store(ws.db_path, read_only=True) as store:
        _, vectors = store.load_vectors(engine.shards[0].shard.corpus.chunk_ids[added_chunks])
    for position, (found, scores) in zip(added_chunks, engine.shards[0].shard.dense_chunks(vectors, 3, None)):
        assert position in found[scores >= scores[0] - 1e-5]  # each added chunk is its own nearest
    for mode in MODES:
        for hits in engine.search_many([r["title"] for r in rows[:2]], 100, mode):
            assert {r["_id"] for r in rows[:2]}.isdisjoint(h.doc_id for h in hits)
    # A filter keeping a base document only: the delta has no allowed chunk, the base answers alone.
    only_base = DocumentFilter.of({"doc_id": rows[5]["_id"]})
    assert [h.doc_id for h in engine.search(rows[5]["title"], 5, "dense", only_base)] == [rows[5]["_id"]]

    monkeypatch.setattr(index_update, "DRIFT_RATIO", 0.0)  # any added vector counts as drifted
    monkeypatch.setattr(index_update, "MIN_DRIFT_VECTORS", 1)
    run_embed(
        ws, [write_rows(updated["data"], rows[2:] + new + scifact_rows(2, start=720))], None, EmbedSettings(**CHUNKING)
    )
    rebuilt = refresh_indexes(ws, "ivfpq")
    assert rebuilt.update == "full" and "far from its trained lists" in rebuilt.update_reason
