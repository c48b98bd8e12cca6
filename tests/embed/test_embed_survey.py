"""`pipeline embed` finds what changed in its source through the store (embed/survey.py: the source's ids and
hashes listed in DuckDB, then read again for the documents to embed), and ends as a fresh embed of the
same source ends."""

import hashlib
import json

import pytest

from common.errors import PipelineError
from common.store import Store
from common.workspace import Workspace
from conftest import scifact_rows
from embed import run as embed_run
from embed.appended import documents_digest
from embed.run import EmbedRun, run_embed
from embed.settings import EmbedSettings

DOCUMENTS = 1200  # in groups of 256 (embed()): five groups a run
FIRST_FILE = 800  # of them in a.jsonl, the rest in b.jsonl


def write(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def embed(ws: Workspace, data, model, prune: bool = False) -> EmbedRun:
    settings = EmbedSettings(model_dir=model, chunk_tokens=64, overlap=8, prune=prune, group_size=256)
    return run_embed(ws, [data], None, settings)


def documents(ws: Workspace) -> list[tuple]:
    with Store(ws.db_path, read_only=True) as store:
        return store.con.execute(
            "SELECT doc_id, title, source, text, content_hash, metadata FROM documents ORDER BY doc_id"
        ).fetchall()


def chunks(ws: Workspace) -> dict[str, list[tuple]]:
    """doc_id -> its chunks (chunk_id, chunk_index, text) in order."""
    with Store(ws.db_path, read_only=True) as store:
        rows = store.con.execute("SELECT doc_id, chunk_id, chunk_index, text FROM chunks ORDER BY chunk_id").fetchall()
    by_document = {}
    for doc_id, *chunk in rows:
        by_document.setdefault(doc_id, []).append(tuple(chunk))
    return by_document


@pytest.fixture()
def source(tmp_path):
    """A directory of two JSON-lines files of SciFact documents, each with a `year`."""
    rows = scifact_rows(DOCUMENTS + 40)
    rows = [{**row, "year": 1990 + i % 30} for i, row in enumerate(rows)]
    directory = tmp_path / "docs"
    directory.mkdir()
    write(directory / "a.jsonl", rows[:FIRST_FILE])
    write(directory / "b.jsonl", rows[FIRST_FILE:DOCUMENTS])
    return directory, rows


def test_new_changed_and_gone_documents_among_a_thousand_end_as_a_fresh_embed(static_model, source, tmp_path):
    directory, rows = source
    ws = Workspace(tmp_path / "ws").create()
    first = embed(ws, directory, static_model)
    assert first.embedded_documents == first.embedder.documents == DOCUMENTS
    first_chunks = chunks(ws)

    b = rows[FIRST_FILE:DOCUMENTS]
    for row in b[:30]:
        row["text"] += " An added sentence."
    for row in b[30:40]:
        row["year"] += 1  # metadata counts as a change too
    removed = [row["_id"] for row in b[-20:]]
    write(directory / "b.jsonl", b[:-20] + rows[DOCUMENTS:])  # a.jsonl as it was: its lines are not read again
    again = embed(ws, directory, static_model)
    assert again.documents_read_before == FIRST_FILE
    assert again.embedded_documents == 30 + 10 + 40
    assert again.embedder.documents == DOCUMENTS + 40  # the removed ones are kept without --prune

    updated_chunks = chunks(ws)
    changed = {row["_id"] for row in b[:40]}
    assert {doc_id: first_chunks[doc_id] for doc_id in first_chunks if doc_id not in changed} == {
        doc_id: updated_chunks[doc_id] for doc_id in first_chunks if doc_id not in changed
    }  # the unchanged documents keep their chunks
    old_ids = {chunk[0] for document in first_chunks.values() for chunk in document}
    new_ids = {chunk[0] for doc_id in changed for chunk in updated_chunks[doc_id]}
    assert new_ids and not new_ids & old_ids  # a changed document's chunks get new ids, never an old one

    pruned = embed(ws, directory, static_model, prune=True)
    assert pruned.embedded_documents == 0 and pruned.embedder.documents == DOCUMENTS + 20
    assert not set(removed) & {d[0] for d in documents(ws)}

    fresh = Workspace(tmp_path / "fresh").create()
    embed(fresh, directory, static_model)
    assert documents(ws) == documents(fresh)
    assert {doc_id: [c[1:] for c in document] for doc_id, document in chunks(ws).items()} == {
        doc_id: [c[1:] for c in document] for doc_id, document in chunks(fresh).items()
    }


def test_an_id_repeated_in_another_file_is_refused_naming_both_lines(static_model, source, tmp_path):
    directory, rows = source
    ws = Workspace(tmp_path / "ws").create()
    embed(ws, directory, static_model)
    write(directory / "c.jsonl", [rows[DOCUMENTS], rows[DOCUMENTS + 1], {**rows[234], "text": "Another text."}])
    with pytest.raises(PipelineError) as refused:
        embed(ws, directory, static_model)
    # a.jsonl's lines were read by the last run: the first sighting is named by the line its reading had reached
    assert str(refused.value) == (
        f"{directory / 'c.jsonl'}:3: duplicate document id '{rows[234]['_id']}' "
        f"(first seen at {directory / 'a.jsonl'} (before line {FIRST_FILE + 1}))"
    )
    compact = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows[:FIRST_FILE])
    (directory / "a.jsonl").write_text(compact)  # the same documents in other bytes: read whole
    with pytest.raises(PipelineError, match=r"c\.jsonl:3: duplicate .* \(first seen at .*a\.jsonl:235\)$"):
        embed(ws, directory, static_model)
    with Store(ws.db_path, read_only=True) as store:
        assert store.counts()["documents"] == DOCUMENTS and store.generation() == 1


def test_a_source_changed_between_its_two_reads_is_refused_and_the_next_run_ends_as_a_fresh_one(
    static_model, source, tmp_path, monkeypatch
):
    directory, rows = source
    ws = Workspace(tmp_path / "ws").create()
    real_load = embed_run.load_embedder

    def load_while_a_line_changes(path):  # between the survey and the second read
        edited = rows[FIRST_FILE:DOCUMENTS]
        edited[300] = {**edited[300], "text": "Rewritten while embed ran."}
        write(directory / "b.jsonl", edited)
        return real_load(path)

    monkeypatch.setattr(embed_run, "load_embedder", load_while_a_line_changes)
    with pytest.raises(
        PipelineError, match=rf"document '{rows[FIRST_FILE + 300]['_id']}' changed while `pipeline embed` read"
    ):
        embed(ws, directory, static_model)
    with Store(ws.db_path, read_only=True) as store:
        assert store.counts()["documents"] == 0 and store.generation() == 0  # nothing published
    monkeypatch.setattr(embed_run, "load_embedder", real_load)
    resumed = embed(ws, directory, static_model)
    assert resumed.embedder.documents == DOCUMENTS and resumed.embedded_documents < DOCUMENTS  # the staged ones kept
    fresh = Workspace(tmp_path / "fresh").create()
    embed(fresh, directory, static_model)
    assert documents(ws) == documents(fresh)


def test_the_digest_of_a_files_documents_is_the_one_recorded_before_it_was_hashed_in_batches():
    pairs = [("b", "2"), ("a", "1"), ("c", "3")]
    before = hashlib.sha256("\n".join(f"{i}\x1f{h}" for i, h in sorted(pairs)).encode()).hexdigest()
    assert documents_digest([["a\x1f1", "b\x1f2"], ["c\x1f3"]]) == (before, 3)
    assert documents_digest([]) == (hashlib.sha256(b"").hexdigest(), 0)
