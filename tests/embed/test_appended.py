"""An embed reads only what was appended to a JSON-lines file since the last run (embed/appended.py),
and reads the whole file whenever the lines read before may no longer be what the store holds."""

import json
import shutil

import pytest

from common.errors import PipelineError
from common.manifest import embedder_key, read_json
from common.store import Store
from common.workspace import Workspace
from conftest import scifact_rows
from embed.run import EmbedRun, run_embed
from embed.settings import EmbedSettings

CHUNKING = dict(chunk_tokens=64, overlap=8)


def lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def stored(ws: Workspace) -> dict[str, str]:
    with Store(ws.db_path, read_only=True) as store:
        return dict(store.con.execute("SELECT doc_id, content_hash FROM documents").fetchall())


@pytest.fixture()
def workspace(trained_workspace, tmp_path):
    ws = Workspace(tmp_path / "ws")
    shutil.copytree(trained_workspace, ws.root)
    return ws


def embed(ws: Workspace, data, prune: bool = False, model_dir=None, chunking: dict = CHUNKING) -> EmbedRun:
    return run_embed(ws, [data], None, EmbedSettings(model_dir=model_dir or ws.model_dir, prune=prune, **chunking))


def test_appended_lines_are_read_alone_and_store_what_a_full_read_stores(workspace, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text(lines(scifact_rows(30)))
    first = embed(workspace, data, prune=True)  # only this file's documents stay
    assert first.documents_read_before == 0 and first.embedded_documents == 30

    with data.open("a") as f:
        f.write(lines(scifact_rows(4, start=30)))
    second = embed(workspace, data)
    assert second.documents_read_before == 30 and second.embedded_documents == 4
    assert second.embedder.documents == 34

    scratch = Workspace(tmp_path / "scratch").create()
    embed(scratch, data, model_dir=workspace.model_dir)
    assert stored(workspace) == stored(scratch)

    again = embed(workspace, data)  # nothing appended: nothing to read or embed
    assert again.documents_read_before == 34 and again.embedded_documents == 0


def test_a_changed_line_before_the_end_makes_the_whole_file_read(workspace, tmp_path):
    data = tmp_path / "docs.jsonl"
    docs = scifact_rows(20)
    data.write_text(lines(docs))
    embed(workspace, data)
    docs[3]["text"] += " An added sentence."
    data.write_text(lines(docs + scifact_rows(2, start=20)))
    summary = embed(workspace, data)
    assert summary.documents_read_before == 0 and summary.embedded_documents == 3


def test_a_document_kept_after_its_line_went_is_still_pruned_after_an_append(workspace, tmp_path):
    """The store then holds a document of the file that its lines no longer give: reading only the
    appended lines would take it for one of them, and --prune would never remove it."""
    data = tmp_path / "docs.jsonl"
    docs = scifact_rows(20)
    data.write_text(lines(docs))
    embed(workspace, data, prune=True)
    removed = docs.pop(5)["_id"]
    data.write_text(lines(docs))
    embed(workspace, data)  # without --prune: kept
    assert removed in stored(workspace)
    with data.open("a") as f:
        f.write(lines(scifact_rows(1, start=20)))
    summary = embed(workspace, data, prune=True)
    assert summary.documents_read_before == 0
    assert removed not in stored(workspace) and len(stored(workspace)) == 20


def test_an_appended_duplicate_id_is_refused(workspace, tmp_path):
    data = tmp_path / "docs.jsonl"
    docs = scifact_rows(10)
    data.write_text(lines(docs))
    embed(workspace, data)
    with data.open("a") as f:
        f.write(lines([{**docs[2], "text": "Another text under the same id."}]))
    with pytest.raises(PipelineError, match=rf"{data}:11: duplicate document id '{docs[2]['_id']}'"):
        embed(workspace, data)


def test_a_last_line_without_its_ending_is_read_again(workspace, tmp_path):
    data = tmp_path / "docs.jsonl"
    docs = scifact_rows(10)
    data.write_text(lines(docs).rstrip("\n"))  # a writer may still be writing that line
    embed(workspace, data)
    data.write_text(lines(docs + scifact_rows(1, start=10)))
    summary = embed(workspace, data)
    assert summary.documents_read_before == 0 and summary.embedded_documents == 1


def test_new_chunking_reads_every_line_again(workspace, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text(lines(scifact_rows(12)))
    embed(workspace, data, prune=True)
    with data.open("a") as f:
        f.write(lines(scifact_rows(2, start=12)))
    summary = embed(workspace, data, chunking=dict(chunk_tokens=48, overlap=8))
    assert summary.documents_read_before == 0 and summary.embedded_documents == summary.embedder.documents == 14


def test_a_document_deleted_outside_embed_makes_the_whole_file_read(workspace, tmp_path):
    """As the document API deletes (stage, then publish with `remove`): the file's lines read before no
    longer give what the store holds, so they are read again and the document comes back from its line,
    as a whole read of the file always brought it back."""
    data = tmp_path / "docs.jsonl"
    docs = scifact_rows(12)
    data.write_text(lines(docs))
    embed(workspace, data, prune=True)
    embedder = read_json(workspace)["embedder"]
    with Store(workspace.db_path) as store:
        store.stage(
            embedder["dim"], embedder_key(embedder["fingerprint"], embedder["chunk_tokens"], embedder["overlap"])
        )
        store.publish(replace_all=False, remove=[docs[4]["_id"]])
    assert docs[4]["_id"] not in stored(workspace)
    with data.open("a") as f:
        f.write(lines(scifact_rows(1, start=12)))
    summary = embed(workspace, data)
    assert summary.documents_read_before == 0 and summary.embedded_documents == 2
    assert docs[4]["_id"] in stored(workspace)
