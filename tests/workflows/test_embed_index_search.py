import json
import shutil
from pathlib import Path

import faiss
import numpy as np
import pytest

from common.dense.reader import load_index
from common.errors import PipelineError
from common.manifest import TokenizerEntry, read_json, write_section
from common.store import Store
from common.workspace import Workspace
from conftest import run_cli, scifact_rows, scifact_slice
from embed import ingest as embed_ingest
from embed.run import run_embed
from embed.settings import EmbedSettings
from index.build import refresh_indexes


def copy_workspace(src, dst):
    shutil.copytree(src, dst)
    return Workspace(dst)


def test_incremental_embed_only_embeds_new_or_changed_and_prunes(trained_workspace, tmp_path):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    data = tmp_path / "docs.jsonl"
    rows = scifact_rows(6)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = EmbedSettings(chunk_tokens=64, overlap=8)
    first = run_embed(ws, [data], None, settings)
    assert first.embedded_documents == 6  # another source than the one in the store: all new
    assert run_embed(ws, [data], None, settings).embedded_documents == 0

    rows[2]["text"] += " An added sentence."
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))  # one changed, one removed
    again = run_embed(ws, [data], None, settings)
    assert again.embedded_documents == 1
    assert again.embedder.documents == first.embedder.documents  # kept without --prune
    pruned = run_embed(ws, [data], None, EmbedSettings(chunk_tokens=64, overlap=8, prune=True))
    assert pruned.embedder.documents == 5  # everything not in the current source is gone
    with Store(ws.db_path, read_only=True) as store:
        n_chunks = store.con.execute("SELECT count(*) FROM chunks WHERE doc_id = ?", [rows[5]["_id"]]).fetchall()[0][0]
        text = store.con.execute("SELECT text FROM documents WHERE doc_id = ?", [rows[2]["_id"]]).fetchall()[0][0]
    assert n_chunks == 0 and text.endswith("An added sentence.")


def test_a_new_chunking_embeds_the_stored_documents_again_and_search_waits_for_the_index(trained_workspace, tmp_path):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    with Store(ws.db_path, read_only=True) as store:
        stored = store.con.execute("SELECT doc_id, title, source, text FROM documents ORDER BY doc_id").fetchall()
        old_ids = {r[0] for r in store.con.execute("SELECT chunk_id FROM chunks").fetchall()}
    other = scifact_slice(tmp_path / "other.jsonl", 2, start=400)
    summary = run_embed(ws, [other], None, EmbedSettings(chunk_tokens=48, overlap=8))
    assert summary.embedder.documents == len(stored) + 2 and summary.embedded_documents == len(stored) + 2
    with Store(ws.db_path, read_only=True) as store:
        kept = store.con.execute(
            "SELECT doc_id, title, source, text FROM documents WHERE doc_id IN (SELECT unnest($ids)) ORDER BY doc_id",
            {"ids": [r[0] for r in stored]},
        ).fetchall()
        chunks = store.con.execute("SELECT chunk_id, n_tokens FROM chunks").fetchall()
        assert store.counts()["vectors"] == len(chunks)
    assert kept == stored  # every stored document is still there, unchanged
    assert max(n for _, n in chunks) <= 48 and not {c for c, _ in chunks} & old_ids  # new chunks, never an old id

    stale = run_cli("search", "-w", str(ws.root), "vitamin calcium", check=False)
    assert stale.returncode == 2 and len(stale.stderr.strip().splitlines()) == 1
    assert (
        stale.stderr.startswith("error: the documents changed since the index was built")
        and "run `pipeline index`" in stale.stderr
    )
    refresh_indexes(ws)
    title = json.loads(other.read_text().splitlines()[0])["title"]
    hits = run_cli("search", "-w", str(ws.root), title, "--mode", "lexical", "--json").stdout.splitlines()
    assert json.loads(hits[0])["doc_id"] == json.loads(other.read_text().splitlines()[0])["_id"]

    pruned = run_embed(
        ws, [other], None, EmbedSettings(chunk_tokens=64, overlap=8, prune=True)
    )  # asked for: only the source stays
    assert pruned.embedder.documents == 2


def test_a_directory_typed_relative_or_absolute_holds_the_same_documents(trained_workspace, tmp_path, monkeypatch):
    ws = Workspace(tmp_path / "ws").create()
    shutil.copytree(trained_workspace / "model", ws.model_dir)
    (tmp_path / "txt" / "sub").mkdir(parents=True)
    (tmp_path / "txt" / "a.md").write_text("# Vitamin D\nBone density and vitamin D.\n")
    (tmp_path / "txt" / "sub" / "b.txt").write_text("Tumour cells grow.\n")
    monkeypatch.chdir(tmp_path)
    settings = EmbedSettings(chunk_tokens=64, overlap=8)
    assert run_embed(ws, [Path("txt")], None, settings).embedder.documents == 2
    again = run_embed(ws, [tmp_path / "txt"], None, settings)
    assert again.embedder.documents == 2 and again.embedded_documents == 0
    with Store(ws.db_path, read_only=True) as store:
        stored = store.con.execute("SELECT doc_id, source FROM documents ORDER BY doc_id").fetchall()
    assert stored == [("a.md", str(tmp_path / "txt" / "a.md")), ("sub/b.txt", str(tmp_path / "txt" / "sub" / "b.txt"))]


def test_interrupted_embed_changes_nothing_search_sees_and_resumes(
    trained_workspace, tmp_path, monkeypatch, corpus_file
):
    ws = Workspace(tmp_path / "ws")
    ws.create()
    shutil.copytree(trained_workspace / "model", ws.model_dir)
    real_chunk_and_embed, calls = embed_ingest.chunk_and_embed, []

    def embed_then_crash(*args, **kwargs):  # simulates Ctrl-C during the second group of documents
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_chunk_and_embed(*args, **kwargs)

    monkeypatch.setattr(embed_ingest, "chunk_and_embed", embed_then_crash)
    settings = EmbedSettings(chunk_tokens=64, overlap=8, group_size=40)
    with pytest.raises(KeyboardInterrupt):
        run_embed(ws, [corpus_file], None, settings)
    with Store(ws.db_path, read_only=True) as store:
        assert store.counts() == {"documents": 0, "chunks": 0, "vectors": 0} and store.generation() == 0
        staged = store.con.execute("SELECT count(*) FROM staged_documents").fetchall()[0][0]
        orphans = store.con.execute(
            "SELECT count(*) FROM staged_documents d "
            "WHERE NOT EXISTS (SELECT 1 FROM staged_chunks c WHERE c.doc_id = d.doc_id)"
        ).fetchall()[0][0]
        unvectored = store.con.execute(
            "SELECT count(*) FROM staged_chunks c "
            "WHERE NOT EXISTS (SELECT 1 FROM staged_vectors v WHERE v.chunk_id = c.chunk_id)"
        ).fetchall()[0][0]
    assert staged == 40 and orphans == 0 and unvectored == 0  # whole documents, kept for the next run
    monkeypatch.setattr(embed_ingest, "chunk_and_embed", real_chunk_and_embed)
    resumed = run_embed(ws, [corpus_file], None, settings)
    assert (
        resumed.embedded_documents == 80
        and resumed.embedder.documents == 120
        and resumed.embedder.store_generation == 1
    )


def test_each_index_type_finds_stored_vectors(trained_workspace, tmp_path):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    with Store(ws.db_path, read_only=True) as store:
        ids, vectors = store.load_vectors()
    for kind in ("flat", "hnsw", "ivf", "ivfpq"):
        summary = refresh_indexes(ws, kind)
        index = load_index(ws.root / summary.path)
        assert index.ntotal == len(ids) and summary.type == kind
        _, found = index.search(vectors[:5], 1)
        if kind == "flat":
            assert summary.recall_at_10 is None
            np.testing.assert_array_equal(found[:, 0], ids[:5])
        else:
            assert 0.0 <= summary.recall_at_10 <= 1.0
            assert set(found[:, 0]) <= set(ids)
    assert refresh_indexes(ws, "auto").type == "flat"


@pytest.mark.parametrize("held", ["one chunk twice, another not", "one chunk missing"])
def test_an_index_that_does_not_hold_every_stored_chunk_once_is_refused(trained_workspace, tmp_path, held):
    from common.dense.index_types import make_index
    from search.engine import SearchEngine

    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    with Store(ws.db_path, read_only=True) as store:
        ids, vectors = store.load_vectors()
    ids = ids.copy()
    if held == "one chunk twice, another not":
        ids[1] = ids[0]
    else:
        ids, vectors = ids[1:], vectors[1:]
    faiss.write_index(make_index("flat", vectors, ids), str(ws.root / read_json(ws)["index"]["path"]))
    with pytest.raises(PipelineError, match="does not hold the stored chunks"):
        SearchEngine(ws, load_model=False)


def test_index_failure_leaves_the_previous_index(trained_workspace, tmp_path, monkeypatch):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    recorded = ws.root / read_json(ws)["index"]["path"]
    before = recorded.read_bytes()
    files_before = sorted(p.name for p in ws.index_dir.iterdir())  # the FAISS file, the lexical and corpus directories

    def crash(*args):  # the process dies while serialising the new index
        raise KeyboardInterrupt

    monkeypatch.setattr(faiss, "serialize_index", crash)
    with pytest.raises(KeyboardInterrupt):
        refresh_indexes(ws, "hnsw")
    assert recorded.read_bytes() == before and ws.root / read_json(ws)["index"]["path"] == recorded
    assert sorted(p.name for p in ws.index_dir.iterdir()) == files_before


def test_unknown_index_type_and_index_before_embed(tmp_path):
    from common.options import OptionError
    from index.settings import IndexSettings

    with pytest.raises(OptionError, match="--type: unknown 'annoy'"):
        IndexSettings(index_type="annoy")
    with pytest.raises(PipelineError, match="has no embedder: run `pipeline embed` first"):
        refresh_indexes(Workspace(tmp_path), "flat")


def test_embed_without_data_reads_the_built_in_corpus_when_pretraining_used_it(tmp_path):
    """pretrain without --data records the built-in corpus's marker as its sources; embed (and tune) then
    read that corpus again, from common/ (no stage imports another)."""
    from common.default_corpus import DEFAULT_CORPUS_SOURCE
    from embed.run import source_documents

    ws = Workspace(tmp_path / "ws").create()
    write_section(ws, TokenizerEntry(path="tokenizer", sha256="", vocab_size=0, sources=[DEFAULT_CORPUS_SOURCE]))
    first = next(iter(source_documents(ws, [], None)))
    assert first.id.startswith("stdlib:") and first.text


def test_embed_progress_moves_with_every_encoded_batch(trained_workspace, corpus_file, tmp_path, monkeypatch):
    """All 120 documents are one group (one transaction); the bar moved only when a group was stored, so it
    sat at 0/120 until the end. It now moves with each encoded batch."""
    from rich.progress import Progress

    completed = []
    update = Progress.update

    def recording_update(self, task, **fields):
        completed.append(fields["completed"])
        return update(self, task, **fields)

    monkeypatch.setattr(Progress, "update", recording_update)
    summary = run_embed(
        Workspace(tmp_path / "ws").create(),
        [corpus_file],
        None,
        EmbedSettings(model_dir=trained_workspace / "model", chunk_tokens=64, overlap=8, batch_size=16),
    )
    batches = -(-summary.embedded_chunks // 16)
    assert batches > 2 and len(completed) == batches + 1  # each batch, then the stored group
    assert completed == sorted(completed) and 0 < completed[0] < 120 and completed[-1] == 120
