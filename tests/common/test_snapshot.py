"""The corpus snapshot `pipeline index` writes for search (common/snapshot/: writer.py, reader.py): it reads
back what the store holds, search answers from it without loading the collection, and an index from before
snapshots asks for `pipeline index`."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import common.snapshot.writer
from common.manifest import read_manifest
from common.snapshot.reader import NOT_A_SLICE, Snapshot
from common.snapshot.writer import write_corpus
from common.store import ChunkRow, Store
from common.workspace import Workspace
from conftest import assert_corpus_matches_store, run_cli
from search.engine import SearchEngine
from search.filters import DocumentFilter, DocumentFilters
from search.snippets import make_snippet, snippet_terms

MIXED = "Größe, café — naïve 日本語のテキスト 😀 and then a few more plain words"
# (doc_id, title, text, metadata, chunks as (chunk_index, text, start_char, end_char)); ids out of order, some
# beyond ASCII (the snapshot orders them as DuckDB does, by UTF-8 bytes: Python's order of str)
DOCUMENTS = [
    ("b", "Bee", "Chunked otherwise.", {"year": 2001}, [(0, "Bee\nChunked otherwise.", 0, 18)]),
    ("😀", None, MIXED, {"year": 2.5, "when": "2020-01-02"}, [(0, MIXED[:20], 0, 20), (1, MIXED[15:], 15, len(MIXED))]),
    ("A", "First", "Plain text in one chunk.", {}, [(0, "Plain text in one chunk.", 0, 24)]),
    ("é", "Empty", "", {"mixed": 1, "when": "2020-01-03"}, [(0, "", 0, 0)]),
    ("z", "No offsets", "Offsets were not kept.", {"mixed": "one"}, [(0, "Offsets were not kept.", None, None)]),
    ("日本", "Three", "one two three four five", {"year": 1999}, [(0, "one two", 0, 7), (1, "three", 8, 13)]),
    ("a/2", "Last", "Its chunk ids come first.", {"tags": ["x"]}, [(0, "Its chunk ids come first.", 0, 25)]),
]


def small_store(path) -> Store:
    """A store of DOCUMENTS, written as `pipeline embed` writes one (stage, write, publish), with vectors of 4
    dimensions; the last document's chunk is numbered first."""
    rows = [(doc_id, title, "docs.jsonl", text, f"hash-{doc_id}", meta) for doc_id, title, text, meta, _ in DOCUMENTS]
    numbered = [(doc_id, part) for doc_id, *_, parts in DOCUMENTS for part in parts]
    numbered = numbered[-1:] + numbered[:-1]
    chunks = [
        ChunkRow(i, doc_id, index, text, start, end, 3)
        for i, (doc_id, (index, text, start, end)) in enumerate(numbered)
    ]
    store = Store(path)
    store.want_documents([(row[0], row[4]) for row in rows])
    store.stage(4, "test-embedder")
    store.write_documents(rows, chunks, np.random.default_rng(0).standard_normal((len(chunks), 4)).astype(np.float32))
    store.publish(replace_all=True, remove=[])
    return store


@pytest.fixture
def snapshot(tmp_path, monkeypatch) -> tuple[Snapshot, Store]:
    """The small store's snapshot, written two documents at a time (so chunks and field types span batches)."""
    monkeypatch.setattr(common.snapshot.writer, "DOCUMENT_BATCH", 2)
    store = small_store(tmp_path / "store.duckdb")
    directory = write_corpus(tmp_path / "index", store, store.chunk_ids(), store.generation())
    yield Snapshot(directory), store
    store.close()


def texts_read(monkeypatch) -> list:
    """What the snapshots written from now on read of the documents' texts from the store: for each, the
    doc_ids asked for (None: every document)."""
    read = []
    document_texts_by_row = Store.document_texts_by_row
    monkeypatch.setattr(
        Store,
        "document_texts_by_row",
        lambda self, n, ids=None: read.append(ids) or document_texts_by_row(self, n, ids),
    )
    return read


def test_the_snapshot_reads_back_what_the_store_holds(snapshot):
    corpus, store = snapshot
    assert_corpus_matches_store(corpus, store)
    ids = [corpus.doc_id(i) for i in range(corpus.n_documents)]
    assert ids == sorted(doc_id for doc_id, *_ in DOCUMENTS) == ["A", "a/2", "b", "z", "é", "日本", "😀"]
    assert corpus.position_of("日本") == 5 and corpus.position_of("zz") is None and corpus.position_of("") is None
    assert corpus.text(corpus.position_of("😀")) == MIXED


def test_a_chunk_that_is_not_a_slice_of_its_document_keeps_its_text(snapshot):
    corpus, _ = snapshot
    kept_whole = {corpus.chunk_text(i) for i in range(len(corpus.chunk_ids)) if corpus.chunk_spans[i][0] == NOT_A_SLICE}
    assert kept_whole == {"Bee\nChunked otherwise.", "Offsets were not kept."}  # the title joined; no offsets
    assert (corpus.chunk_spans[:, 0] != NOT_A_SLICE).sum() == len(corpus.chunk_ids) - 2


def test_a_snapshot_of_the_earlier_layout_is_read_and_then_written_whole(snapshot, tmp_path, monkeypatch):
    """Snapshots written before texts.bin was kept in the store's order held the texts in position order with
    their offsets (text_offsets.npy): search still reads one, and the next snapshot is written whole from it."""
    corpus, store = snapshot
    earlier = tmp_path / "earlier"
    shutil.copytree(corpus.directory, earlier)
    texts = [corpus._texts.read_at(int(end - start), int(start)) for start, end in corpus.text_spans]
    (earlier / "texts.bin").write_bytes(b"".join(texts))
    np.save(earlier / "text_offsets.npy", np.cumsum([0] + [len(text) for text in texts]))
    (earlier / "text_spans.npy").unlink()
    assert_corpus_matches_store(Snapshot(earlier), store)

    read = texts_read(monkeypatch)
    change_store(store, [("b", "Bee again", "Changed text of b.", {})], remove=[])
    assert_corpus_matches_store(
        Snapshot(write_corpus(tmp_path / "index", store, store.chunk_ids(), store.generation(), earlier)), store
    )
    assert read == [None]


def test_field_types_over_batches_are_those_of_all_the_values(snapshot):
    """Typed two documents at a time: `year` is whole in the first batches that have it, `mixed` text in its
    first, and both take the type all their values give (the documents in id order: A, a/2 | b, z | é, 日本 | 😀)."""
    corpus, _ = snapshot
    filters = DocumentFilters(corpus.filters_path)
    assert filters.fields == {
        "doc_id": "VARCHAR",
        "title": "VARCHAR",
        "source": "VARCHAR",
        "tags": "VARCHAR[]",
        "year": "DOUBLE",
        "mixed": "VARCHAR",  # holding each value's JSON
        "when": "DATE",
    }
    assert list(filters.fields)[3:] == ["tags", "year", "mixed", "when"]  # in the order first seen
    allowed = filters.allowed_documents(DocumentFilter.of({"year": {"gte": 2000}, "title": {"ne": "x"}}))
    assert [corpus.doc_id(i) for i in allowed] == ["b"]
    assert list(filters.allowed_documents(DocumentFilter.of(where="mixed = '1'"))) == [corpus.position_of("é")]


def change_store(store: Store, documents: list[tuple], remove: list[str]) -> None:
    """Store `documents` (doc_id, title, text, metadata), new or changed, each one chunk of its whole text, and
    delete the documents `remove`, as an incremental `pipeline embed` does."""
    first = store.next_chunk_id()
    rows = [
        (doc_id, title, "docs.jsonl", text, f"hash-{doc_id}-{text}", meta) for doc_id, title, text, meta in documents
    ]
    chunks = [ChunkRow(first + i, row[0], 0, row[3], 0, len(row[3]), 3) for i, row in enumerate(rows)]
    store.want_documents([(row[0], row[4]) for row in rows])
    store.stage(4, "test-embedder")
    store.write_documents(rows, chunks, np.ones((len(chunks), 4), np.float32))
    store.publish(replace_all=False, remove=remove)


def filter_rows(corpus: Snapshot) -> tuple[dict, list[dict]]:
    """The filter table's columns and types, and its rows by position (each row by column name: an update
    adds new fields' columns after the others)."""
    filters = DocumentFilters(corpus.filters_path)
    rows = filters.con.execute("SELECT * FROM documents ORDER BY position")
    names = [column[0] for column in rows.description]
    return filters.fields, [dict(zip(names, row)) for row in rows.fetchall()]


@pytest.mark.parametrize(
    "new_year, stale_texts",
    [(2003, 1.0), ("unknown", 0.0)],  # fits the year column (DOUBLE) / does not; texts file linked / copied
)
def test_an_updated_snapshot_reads_only_what_changed_and_equals_one_written_whole(
    snapshot, tmp_path, monkeypatch, new_year, stale_texts
):
    """After documents are added (one between stored ids, one sorting last), changed and deleted (one whose
    fields decided no column's type: a column's type only widens over updates, a full build makes them anew),
    the snapshot written from the last one reads only the added and changed documents from the store, and
    holds what one written whole holds: the same documents, chunks, texts and filter rows. Its texts file is
    the last one's with the new texts appended while few enough of those are stale (and the last snapshot
    still reads its own), else a copy of the texts kept."""
    monkeypatch.setattr(common.snapshot.writer, "STALE_TEXTS", stale_texts)
    previous, store = snapshot
    previous_texts = [previous.text(i) for i in range(previous.n_documents)]
    change_store(
        store,
        [
            ("b", "Bee again", "Changed text of b.", {"year": 2002}),
            ("c", "Sea", "A new document between b and z.", {"year": new_year, "new field": True}),
            ("🙂", "Last", "Sorts after every other id.", {}),
        ],
        remove=["A"],
    )
    read = texts_read(monkeypatch)
    previous_dir = tmp_path / "index" / Path(previous.filters_path).parent.name
    updated = Snapshot(write_corpus(tmp_path / "index", store, store.chunk_ids(), store.generation(), previous_dir))
    assert read == [["b", "c", "🙂"]]
    whole = Snapshot(write_corpus(tmp_path / "whole", store, store.chunk_ids(), store.generation()))
    assert_corpus_matches_store(updated, store)
    assert_corpus_matches_store(whole, store)
    assert filter_rows(updated) == filter_rows(whole)
    assert filter_rows(updated)[0]["year"] == (
        "DOUBLE" if new_year == 2003 else "VARCHAR"
    )  # VARCHAR: each value's JSON
    allowed = DocumentFilters(updated.filters_path).allowed_documents(DocumentFilter.of(where='"new field"'))
    assert [updated.doc_id(i) for i in allowed] == ["c"]
    linked = (updated.directory / "texts.bin").stat().st_ino == (previous.directory / "texts.bin").stat().st_ino
    assert linked == (stale_texts == 1.0)
    assert [Snapshot(previous.directory).text(i) for i in range(previous.n_documents)] == previous_texts


def test_a_snapshot_that_no_longer_matches_the_store_is_written_whole(snapshot, tmp_path, monkeypatch):
    """A new embedder re-chunks every document under new chunk ids while their texts stay: nothing of the
    last snapshot's chunks can be copied, and the snapshot is written from the store."""
    previous, store = snapshot
    ids = store.chunk_ids()
    store.con.execute("UPDATE chunks SET chunk_id = chunk_id + 100")
    read = texts_read(monkeypatch)
    previous_dir = tmp_path / "index" / Path(previous.filters_path).parent.name
    corpus = Snapshot(write_corpus(tmp_path / "index", store, ids + 100, store.generation(), previous_dir))
    assert read == [None]
    assert_corpus_matches_store(corpus, store)


def test_search_answers_from_the_snapshot_as_from_the_store(trained_workspace):
    """Every hit's fields, and its snippet, are the store's."""
    engine = SearchEngine(Workspace(trained_workspace))
    with Store(Workspace(trained_workspace).db_path, read_only=True) as store:
        assert_corpus_matches_store(engine.shards[0].shard.corpus, store)
        documents = {
            row[0]: row[1:]
            for row in store.con.execute("SELECT doc_id, title, source, text, metadata FROM documents").fetchall()
        }
        chunks = {
            row[0]: row[1:] for row in store.con.execute("SELECT chunk_id, text, chunk_index FROM chunks").fetchall()
        }
    for query in ("tumour cells immune response", "vitamin D", "protein folding in bacteria"):
        terms = snippet_terms(query, engine.shards[0].shard.lexical.analyzer)
        for mode in ("dense", "lexical", "hybrid"):
            hits = engine.search(query, k=20, mode=mode)
            assert hits, (query, mode)
            for hit in hits:
                title, source, _, metadata = documents[hit.doc_id]
                assert (hit.title, hit.source, hit.metadata) == (title, source, json.loads(metadata))
                text, index = chunks[hit.chunk_id]
                assert (hit.snippet, hit.highlights) == make_snippet(text, terms, index > 0)
    for doc_id, (title, source, text, metadata) in documents.items():
        document = engine.document(doc_id)
        assert (document["title"], document["source"], document["text"], document["metadata"]) == (
            title,
            source,
            text,
            json.loads(metadata),
        )


def test_the_loaded_engine_holds_no_texts(trained_workspace):
    """The arrays are memory-mapped, the Arrow files read in place (no Arrow memory allocated by opening them),
    and nothing holds a Python list of the documents or chunks."""
    before = pa.total_allocated_bytes()
    engine = SearchEngine(Workspace(trained_workspace), load_model=False)
    corpus = engine.shards[0].shard.corpus
    assert pa.total_allocated_bytes() - before < 64 * 1024
    arrays = [value for value in vars(corpus).values() if isinstance(value, np.ndarray)]
    assert len(arrays) == 6 and all(isinstance(array, np.memmap) for array in arrays)
    for owner in (engine, corpus, engine.shards[0].shard.filters):
        assert not [
            name
            for name, value in vars(owner).items()
            if isinstance(value, (list, tuple, dict)) and len(value) >= corpus.n_documents
        ]


def test_an_index_from_before_snapshots_asks_for_pipeline_index(trained_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    manifest = json.loads((ws / "manifest.json").read_text())
    shutil.rmtree(ws / manifest["index"].pop("corpus_path"))
    (ws / "manifest.json").write_text(json.dumps(manifest))
    failed = run_cli("search", "-w", str(ws), "cells", check=False)
    assert failed.returncode == 2 and failed.stderr.strip().splitlines() == [
        "error: the index was built before search read a corpus snapshot: run `pipeline index`"
    ]
    assert "built before search read a corpus snapshot" in run_cli("status", "-w", str(ws), check=False).stdout
    run_cli("index", "-w", str(ws))
    assert read_manifest(Workspace(ws)).index.corpus_path is not None
    assert run_cli("search", "-w", str(ws), "cells").returncode == 0
