"""common/store/: the DuckDB store by role. What a run stages is invisible until it publishes, a publish is one
new generation, a failed write leaves nothing half-written, and a read-only store refuses writes."""

from dataclasses import replace

import duckdb
import numpy as np
import pytest

from common.errors import PipelineError
from common.store import ChunkRow, Store

DIM = 8


def documents(*ids: str, version: str = "1") -> tuple[list[tuple], list[ChunkRow], np.ndarray]:
    """Rows, chunks (two per document, numbered from 0) and unit vectors for documents `ids`."""
    rows = [
        (i, f"title {i}", "docs.jsonl", f"text of {i} v{version}", f"hash-{i}-{version}", {"v": version}) for i in ids
    ]
    chunks = [
        ChunkRow(2 * n + part, doc_id, part, f"part {part} of {doc_id}", 0, 5, 3)
        for n, doc_id in enumerate(ids)
        for part in (0, 1)
    ]
    vectors = np.random.default_rng(len(ids)).standard_normal((len(chunks), DIM)).astype(np.float32)
    return rows, chunks, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def stage_documents(store: Store, rows, chunks, vectors) -> None:
    """What `pipeline embed` writes before it publishes: the documents wanted, the staged tables, the rows."""
    store.want_documents([(row[0], row[4]) for row in rows])
    store.stage(DIM, "embedder-a")
    store.write_documents(rows, chunks, vectors)


def embed_run(
    store: Store, rows, chunks, vectors, first_chunk_id: int = 0, replace_all: bool = False, remove: list[str] = ()
) -> int:
    """A whole `pipeline embed` run on the store: staged, then published; returns the new generation."""
    stage_documents(store, rows, [replace(c, chunk_id=first_chunk_id + c.chunk_id) for c in chunks], vectors)
    return store.publish(replace_all=replace_all, remove=remove)


def test_staged_documents_are_invisible_until_published_and_a_publish_is_one_generation(tmp_path):
    with Store(tmp_path / "store.duckdb") as store:
        assert store.generation() == 0
        rows, chunks, vectors = documents("a", "b")
        stage_documents(store, rows, chunks, vectors)
        assert store.counts()["documents"] == 0 and len(store.chunk_ids()) == 0  # staged only
        assert store.publish(replace_all=True) == 1
        assert store.counts() == {"documents": 2, "chunks": 4, "vectors": 4}
        assert store.chunk_ids().tolist() == [0, 1, 2, 3]
        assert store.document_hashes(["a", "b", "gone"]) == {"a": "hash-a-1", "b": "hash-b-1"}
        assert store.get_meta("embedder") == "embedder-a"
        ids, stored = store.load_vectors()
        assert ids.tolist() == [0, 1, 2, 3]
        assert (np.sum(stored * vectors, axis=1) > 0.999).all()  # int8 codes keep each direction


def test_a_changed_document_replaces_its_chunks_a_removed_one_goes_and_chunk_ids_are_never_reused(tmp_path):
    with Store(tmp_path / "store.duckdb") as store:
        embed_run(store, *documents("a", "b"), replace_all=True)
        rows, chunks, vectors = documents("a", version="2")
        generation = embed_run(store, rows, chunks, vectors, first_chunk_id=store.next_chunk_id(), remove=["b"])
        assert generation == 2
        assert store.document_hashes(["a", "b"]) == {"a": "hash-a-2"}
        assert store.chunk_ids().tolist() == [4, 5]  # a's new chunks, numbered after every id ever given
        assert store.chunk_texts([4, 0]) == {4: "part 0 of a"}  # chunk 0 went with the old version
        assert store.next_chunk_id() == 6


def test_a_write_that_fails_leaves_the_staged_tables_as_they_were(tmp_path):
    with Store(tmp_path / "store.duckdb") as store:
        rows, chunks, vectors = documents("a", "b")
        store.want_documents([(row[0], row[4]) for row in rows])
        store.stage(DIM, "embedder-a")
        store.write_documents(rows[:1], chunks[:2], vectors[:2])
        with pytest.raises(duckdb.Error):  # b's chunks reuse a's ids: the insert fails after b's document row
            store.write_documents(rows[1:], chunks[:2], vectors[2:])
        assert store.publish(replace_all=True) == 1
        assert store.document_hashes(["a", "b"]) == {"a": "hash-a-1"} and store.chunk_ids().tolist() == [0, 1]


def test_a_read_only_store_reads_and_refuses_writes_and_a_missing_one_says_to_embed(tmp_path):
    path = tmp_path / "store.duckdb"
    with pytest.raises(PipelineError, match=rf"{path}: no document store yet; run `pipeline embed` first"):
        Store(path, read_only=True)
    with Store(path) as store:
        embed_run(store, *documents("a"), replace_all=True)
    with Store(path, read_only=True) as store:
        assert store.generation() == 1 and store.chunk_ids().tolist() == [0, 1]
        with pytest.raises(duckdb.Error):
            store.set_meta("generation", "7")
