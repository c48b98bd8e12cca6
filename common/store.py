"""The DuckDB store: documents, their chunks, and one float32 vector per chunk.

    documents(doc_id, title, source, text, content_hash, updated_at)
    chunks(chunk_id, doc_id, chunk_index, text, start_char, end_char, n_tokens)
    vectors(chunk_id, vector FLOAT[dim])       -- from the embedder recorded in store_meta
    store_meta(key, value)

Every change to a document (its row, chunks and vectors) happens in one transaction, so an
interrupted run leaves each document either fully old or fully new. All SQL takes bound parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from common.errors import PipelineError

SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    doc_id VARCHAR PRIMARY KEY, title VARCHAR, source VARCHAR, text VARCHAR,
    content_hash VARCHAR NOT NULL, updated_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id BIGINT PRIMARY KEY, doc_id VARCHAR NOT NULL, chunk_index INTEGER NOT NULL, text VARCHAR,
    start_char INTEGER, end_char INTEGER, n_tokens INTEGER);
CREATE TABLE IF NOT EXISTS store_meta (key VARCHAR PRIMARY KEY, value VARCHAR);
"""


@dataclass
class ChunkRow:
    chunk_id: int
    doc_id: str
    chunk_index: int
    text: str
    start_char: int
    end_char: int
    n_tokens: int


class Store:
    def __init__(self, path: Path, read_only: bool = False):
        self.path = path
        if read_only and not path.exists():
            raise PipelineError(f"{path}: no document store yet; run `pipeline embed` first")
        try:
            self.con = duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as e:
            raise PipelineError(f"{path}: cannot open the DuckDB store ({str(e).splitlines()[0]})") from None
        if not read_only:
            self.con.execute(SCHEMA)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- metadata
    def get_meta(self, key: str) -> str | None:
        rows = self.con.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchall()
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self.con.execute("INSERT OR REPLACE INTO store_meta VALUES (?, ?)", [key, value])

    # ---- documents
    def document_hashes(self) -> dict[str, str]:
        return dict(self.con.execute("SELECT doc_id, content_hash FROM documents").fetchall())

    def next_chunk_id(self) -> int:
        return self.con.execute("SELECT coalesce(max(chunk_id), -1) + 1 FROM chunks").fetchall()[0][0]

    def reset_vectors(self, dim: int, embedder: str) -> None:
        """Start over for a new embedder: every document will be embedded again."""
        self.con.execute("BEGIN TRANSACTION")
        self.con.execute("DROP TABLE IF EXISTS vectors")
        # dim is an int from the model, not user text.
        self.con.execute(f"CREATE TABLE vectors (chunk_id BIGINT PRIMARY KEY, vector FLOAT[{int(dim)}])")
        self.con.execute("DELETE FROM chunks")
        self.con.execute("DELETE FROM documents")
        self.set_meta("embedder", embedder)
        self.set_meta("dim", str(int(dim)))
        self.con.execute("COMMIT")

    def write_documents(self, docs: list[tuple[str, str, str, str, str]], chunks: list[ChunkRow], vectors: np.ndarray) -> None:
        """Replace these documents (doc_id, title, source, text, content_hash) with their chunks and vectors, atomically."""
        ids = [d[0] for d in docs]
        chunk_table = pa.table({
            "chunk_id": pa.array([c.chunk_id for c in chunks], pa.int64()),
            "doc_id": pa.array([c.doc_id for c in chunks], pa.string()),
            "chunk_index": pa.array([c.chunk_index for c in chunks], pa.int32()),
            "text": pa.array([c.text for c in chunks], pa.string()),
            "start_char": pa.array([c.start_char for c in chunks], pa.int32()),
            "end_char": pa.array([c.end_char for c in chunks], pa.int32()),
            "n_tokens": pa.array([c.n_tokens for c in chunks], pa.int32()),
        })
        vector_table = pa.table({
            "chunk_id": chunk_table["chunk_id"],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.astype(np.float32).ravel()), vectors.shape[1]),
        })
        self.con.execute("BEGIN TRANSACTION")
        try:
            self._delete(ids)
            self.con.executemany("INSERT INTO documents (doc_id, title, source, text, content_hash) VALUES (?, ?, ?, ?, ?)", docs)
            self.con.register("new_chunks", chunk_table)
            self.con.register("new_vectors", vector_table)
            self.con.execute("INSERT INTO chunks SELECT * FROM new_chunks")
            self.con.execute("INSERT INTO vectors SELECT * FROM new_vectors")
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            self.con.unregister("new_chunks")
            self.con.unregister("new_vectors")

    def delete_documents(self, ids: list[str]) -> None:
        self.con.execute("BEGIN TRANSACTION")
        self._delete(ids)
        self.con.execute("COMMIT")

    def _delete(self, ids: list[str]) -> None:
        if not ids:
            return
        self.con.execute("DELETE FROM vectors WHERE chunk_id IN (SELECT chunk_id FROM chunks WHERE list_contains($ids, doc_id))", {"ids": ids})
        self.con.execute("DELETE FROM chunks WHERE list_contains($ids, doc_id)", {"ids": ids})
        self.con.execute("DELETE FROM documents WHERE list_contains($ids, doc_id)", {"ids": ids})

    # ---- reading
    def counts(self) -> dict[str, int]:
        tables = {r[0] for r in self.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        return {t: self.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] if t in tables else 0
                for t in ("documents", "chunks", "vectors")}

    def load_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """All (chunk_ids int64, vectors float32 [n, dim]) in chunk_id order."""
        dim = int(self.get_meta("dim") or 0)
        if not dim:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        table = self.con.sql("SELECT chunk_id, vector FROM vectors ORDER BY chunk_id").to_arrow_table()
        ids = table.column("chunk_id").to_numpy().astype(np.int64)
        flat = table.column("vector").combine_chunks().values.to_numpy(zero_copy_only=False)
        return ids, np.ascontiguousarray(flat.reshape(-1, dim), dtype=np.float32)

    def chunk_details(self, chunk_ids: list[int]) -> dict[int, dict]:
        """chunk_id -> doc_id, title, source, chunk text, for search results."""
        rows = self.con.execute(
            """SELECT c.chunk_id, c.doc_id, d.title, d.source, c.text, c.chunk_index
               FROM chunks c JOIN documents d USING (doc_id) WHERE list_contains($ids, c.chunk_id)""",
            {"ids": [int(i) for i in chunk_ids]},
        ).fetchall()
        keys = ("chunk_id", "doc_id", "title", "source", "text", "chunk_index")
        return {r[0]: dict(zip(keys, r)) for r in rows}
