"""The DuckDB store: documents, their chunks, and one vector per chunk (int8 codes and a scale).

    documents(doc_id, title, source, text, content_hash, updated_at, metadata JSON)
    chunks(chunk_id, doc_id, chunk_index, text, start_char, end_char, n_tokens)
    vectors(chunk_id, vector TINYINT[dim], scale FLOAT)   -- int8 codes (common/vectors.py) of the
                                               -- embedder recorded in store_meta; FLOAT[dim] in older stores
    store_meta(key, value)
    staged_documents, staged_chunks, staged_vectors   -- the next generation, while `pipeline embed` runs

What search sees (documents, chunks, vectors) changes only when an embed run publishes: the run writes
its documents into the staged tables, a transaction per group (so a killed run resumes where it
stopped), and then one transaction moves them into the live tables and bumps the store's generation.
An interrupted run leaves the live tables exactly as they were. A new embedder (model or chunking)
stages every document again, the stored ones from their stored text, and publishing replaces the whole
live generation. `pipeline index` records the generation it indexed, so a reader can tell exactly and
cheaply whether an index matches the store. Chunk ids are never reused: the next free id is kept in
store_meta and survives every change.

A document's metadata (every field of its input row beyond id, title and text) is one JSON object:
documents from different files carry different fields, and a JSON column takes them all without a
schema change in the middle of an embed run. Search does not read the store per query: `pipeline index`
writes what search shows of the documents and chunks, with each metadata field typed into a column of
its own for filters, into a snapshot beside the indexes (index/corpus.py, read by common/corpus.py),
streaming them from here in doc_id order (`iter_documents`).

All SQL against the store is in this module, and it takes bound parameters.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from common.errors import PipelineError
from common.vectors import dequantize, quantize

DOCUMENT_COLUMNS = """(doc_id VARCHAR PRIMARY KEY, title VARCHAR, source VARCHAR, text VARCHAR,
    content_hash VARCHAR NOT NULL, updated_at TIMESTAMP DEFAULT current_timestamp, metadata JSON)"""
CHUNK_COLUMNS = """(chunk_id BIGINT PRIMARY KEY, doc_id VARCHAR NOT NULL, chunk_index INTEGER NOT NULL, text VARCHAR,
    start_char INTEGER, end_char INTEGER, n_tokens INTEGER)"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS documents {DOCUMENT_COLUMNS};
CREATE TABLE IF NOT EXISTS chunks {CHUNK_COLUMNS};
CREATE TABLE IF NOT EXISTS staged_documents {DOCUMENT_COLUMNS};
CREATE TABLE IF NOT EXISTS staged_chunks {CHUNK_COLUMNS};
CREATE TABLE IF NOT EXISTS store_meta (key VARCHAR PRIMARY KEY, value VARCHAR);
-- how far the last embed read each JSON-lines file (embed/appended.py)
CREATE TABLE IF NOT EXISTS source_files (source VARCHAR PRIMARY KEY, text_field VARCHAR, bytes BIGINT, lines BIGINT,
    sha256 VARCHAR, documents_sha256 VARCHAR);
-- stores written before documents had metadata
ALTER TABLE documents ADD COLUMN IF NOT EXISTS metadata JSON;
ALTER TABLE staged_documents ADD COLUMN IF NOT EXISTS metadata JSON;
"""
INT8, FLOAT32 = "int8", "float32"  # how a vectors table holds its vectors (older stores: float32)
VECTOR_BATCH = 50_000  # rows of vectors read at once by iter_vectors: 50 MB of int8 codes at 1,024 dimensions
# What DuckDB may hold while it sorts the documents and chunks for iter_documents: 1M documents of 1 KB were
# sorted in 10.6 s with 1 GB (peak RSS 1.2 GB), in 5.4 s without a limit (2.2 GB): the difference is spilled to disk.
SORT_MEMORY = "1GB"


@dataclass
class ChunkRow:
    chunk_id: int
    doc_id: str
    chunk_index: int
    text: str
    start_char: int
    end_char: int
    n_tokens: int


def columns(rows: list[tuple], width: int) -> list[list]:
    """Rows of `width` values as that many column lists (empty ones for no rows)."""
    return [list(column) for column in zip(*rows)] or [[] for _ in range(width)]


def arrow_array(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """A flat numpy array as an Arrow array over its memory (pa.array would import pandas)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def vector_table(ids: np.ndarray, vectors: np.ndarray, vector_format: str) -> pa.Table:
    """(chunk_id, vector[, scale]) rows as an Arrow table: int8 codes and scales, or float32 (older stores)."""
    ids = arrow_array(np.asarray(ids, dtype=np.int64), pa.int64())
    if vector_format == FLOAT32:
        flat = np.asarray(vectors, dtype=np.float32)
        rows = pa.FixedSizeListArray.from_arrays(arrow_array(flat.ravel(), pa.float32()), flat.shape[1])
        return pa.Table.from_arrays([ids, rows], names=["chunk_id", "vector"])
    codes, scales = quantize(vectors)
    rows = pa.FixedSizeListArray.from_arrays(arrow_array(codes.ravel(), pa.int8()), codes.shape[1])
    return pa.Table.from_arrays([ids, rows, arrow_array(scales, pa.float32())], names=["chunk_id", "vector", "scale"])


def arrow_numbers(array: pa.Array, dtype) -> np.ndarray:
    """A fixed-width Arrow array without nulls as numpy, read in place: pyarrow's own to_numpy imports
    pandas, a quarter of a second of every command that reads chunk ids or vectors."""
    return np.frombuffer(
        array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize
    )


DAMAGED_ADVICE = (
    "the file is damaged: restore it from a copy, or move it aside and run `pipeline embed` and "
    "`pipeline index` to build it again from the documents' sources"
)


def damaged_store_error(error: BaseException) -> PipelineError | None:
    """A store file that opened but cannot be read further (truncated, overwritten) fails inside DuckDB
    with an IO error naming the file: as a one-line error saying what to do; None for any other error."""
    if not isinstance(error, duckdb.IOException):
        return None
    return PipelineError(f"{str(error).splitlines()[0].removeprefix('IO Error: ')}: {DAMAGED_ADVICE}")


class Store:
    def __init__(self, path: Path, read_only: bool = False, bulk: bool = False):
        """bulk: a run writing many rows (`pipeline embed`): DuckDB checkpoints its write-ahead log when the
        store is closed rather than every 16 MB, which were 40% of embed's time on 20,000 documents."""
        self.path = path
        if read_only and not path.exists():
            raise PipelineError(f"{path}: no document store yet; run `pipeline embed` first")
        try:
            self.con = duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as e:
            reason = str(e).splitlines()[0]
            advice = "another process holds it: wait for it to finish" if "lock" in reason.lower() else DAMAGED_ADVICE
            raise PipelineError(f"{path}: cannot open the DuckDB store ({reason}); {advice}") from None
        if not read_only:
            self.con.execute(SCHEMA)
            # The vectors' floats are noise to DuckDB's float compression (ALP, ALP-RD): on 100,241 vectors
            # of 1,024-d it made the file larger (419 against 412 MB) and the checkpoint 0.7-1 s slower.
            self.con.execute("SET disabled_compression_methods = 'alp,alprd'")
        if bulk:
            self.con.execute("SET checkpoint_threshold = '4GB'")
        self.has_metadata = "metadata" in {
            r[0]
            for r in self.con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = 'documents'"
            ).fetchall()
        }

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

    def generation(self) -> int:
        """Bumped by every publish: an index built at this generation matches the store exactly."""
        return int(self.get_meta("generation") or 0)

    # ---- documents
    def document_hashes(self) -> dict[str, str]:
        return dict(self.con.execute("SELECT doc_id, content_hash FROM documents").fetchall())

    def stored_documents(self, ids: list[str]) -> list[tuple[str, str, str, str, dict]]:
        """(doc_id, title, source, text, metadata) of these stored documents, to embed them again."""
        rows = self.con.execute(
            "SELECT doc_id, title, source, text, metadata FROM documents "
            "WHERE list_contains($ids, doc_id) ORDER BY doc_id",
            {"ids": ids},
        ).fetchall()
        return [(*row[:4], json.loads(row[4]) if row[4] else {}) for row in rows]

    def next_chunk_id(self) -> int:
        """The first id never given to a chunk (ids are not reused, so an old index never names a new chunk)."""
        highest = self.con.execute(
            "SELECT greatest((SELECT max(chunk_id) FROM chunks), (SELECT max(chunk_id) FROM staged_chunks))"
        ).fetchall()[0][0]
        return max(int(self.get_meta("next_chunk_id") or 0), -1 if highest is None else highest + 1)

    def stage(self, dim: int, embedder: str, wanted: dict[str, str]) -> dict[str, str]:
        """Prepare the staged tables for a run writing vectors of `embedder` for the documents `wanted`
        (doc_id -> content hash). Documents a killed run of the same embedder staged already are kept
        when they are still wanted unchanged; returns them (doc_id -> content hash)."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            if self.get_meta("staged_embedder") != embedder or "staged_vectors" not in self._tables():
                self.con.execute("DROP TABLE IF EXISTS staged_vectors")
                # Vectors go into the live table as they are staged: int8 codes, unless they are to join an
                # older store's float32 vectors of the same embedder. dim is an int from the model, not user text.
                if self.get_meta("embedder") == embedder and self.vector_format("vectors") == FLOAT32:
                    columns = f"vector FLOAT[{int(dim)}]"
                else:
                    columns = f"vector TINYINT[{int(dim)}], scale FLOAT"
                self.con.execute(f"CREATE TABLE staged_vectors (chunk_id BIGINT PRIMARY KEY, {columns})")
                self.con.execute("DELETE FROM staged_chunks")
                self.con.execute("DELETE FROM staged_documents")
                self.set_meta("staged_embedder", embedder)
                self.set_meta("staged_dim", str(int(dim)))
            staged = dict(self.con.execute("SELECT doc_id, content_hash FROM staged_documents").fetchall())
            unwanted = [doc_id for doc_id, digest in staged.items() if wanted.get(doc_id) != digest]
            self._delete(unwanted, "staged_")
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        return {doc_id: digest for doc_id, digest in staged.items() if wanted.get(doc_id) == digest}

    def write_documents(
        self, docs: list[tuple[str, str, str, str, str, dict]], chunks: list[ChunkRow], vectors: np.ndarray
    ) -> None:
        """Stage these documents (doc_id, title, source, text, content_hash, metadata) with their chunks and
        vectors, atomically; search sees them once `publish` runs. They must not be staged already (`stage`
        returns those that are): nothing is deleted here, which cost 13 ms a call over 100,000 documents."""
        metadata = [json.dumps(d[5], ensure_ascii=False) if d[5] else None for d in docs]
        ids = np.array([c.chunk_id for c in chunks], dtype=np.int64)
        next_id = max([self.next_chunk_id()] + [c.chunk_id + 1 for c in chunks])
        self.con.execute("BEGIN TRANSACTION")
        try:
            # Each column as one list parameter, unnested: one insert per table, not one per row (executemany
            # took 1.3 ms per document); the vectors as an Arrow table over their own memory.
            self.con.execute(
                "INSERT INTO staged_documents (doc_id, title, source, text, content_hash, metadata) SELECT "
                + ", ".join(["unnest(?::VARCHAR[])"] * 5)
                + ", unnest(?::VARCHAR[])::JSON",
                [*columns([d[:5] for d in docs], 5), metadata],
            )
            self.con.execute(
                "INSERT INTO staged_chunks SELECT unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::INTEGER[]), "
                "unnest(?::VARCHAR[]), unnest(?::INTEGER[]), unnest(?::INTEGER[]), unnest(?::INTEGER[])",
                [
                    ids.tolist(),
                    *columns(
                        [(c.doc_id, c.chunk_index, c.text, c.start_char, c.end_char, c.n_tokens) for c in chunks], 6
                    ),
                ],
            )
            self.con.register("new_vectors", vector_table(ids, vectors, self.vector_format("staged_vectors")))
            self.con.execute("INSERT INTO staged_vectors SELECT * FROM new_vectors")
            self.set_meta("next_chunk_id", str(next_id))
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            self.con.unregister("new_vectors")

    def publish(self, replace_all: bool, remove: list[str]) -> int:
        """Make the staged documents what search sees, in one transaction: with replace_all they become the
        whole store (a new embedder), else they replace their stored versions and `remove` is deleted.
        Returns the new generation."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            if replace_all:  # the staged tables become the live ones: renamed, not copied
                for table in ("documents", "chunks", "vectors"):
                    self.con.execute(f"DROP TABLE IF EXISTS {table}")  # constants, not user text
                    self.con.execute(f"ALTER TABLE staged_{table} RENAME TO {table}")
                self.con.execute(SCHEMA)  # new, empty staged tables
                self.set_meta("dim", self.get_meta("staged_dim"))
            else:
                staged = [r[0] for r in self.con.execute("SELECT doc_id FROM staged_documents").fetchall()]
                self._delete(staged + remove)
                self.con.execute("INSERT INTO documents BY NAME SELECT * FROM staged_documents")
                self.con.execute("INSERT INTO chunks SELECT * FROM staged_chunks")
                self.con.execute("INSERT INTO vectors SELECT * FROM staged_vectors")
                self.con.execute("DROP TABLE staged_vectors")
                self.con.execute("DELETE FROM staged_chunks")
                self.con.execute("DELETE FROM staged_documents")
            self.set_meta("embedder", self.get_meta("staged_embedder"))
            self.con.execute("DELETE FROM store_meta WHERE key IN ('staged_embedder', 'staged_dim')")
            generation = self.generation() + 1
            self.set_meta("generation", str(generation))
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        return generation

    def _delete(self, ids: list[str], prefix: str = "") -> None:
        """Delete these documents with their chunks and vectors from the live tables, or the staged ones
        (prefix "staged_")."""
        if not ids:
            return
        # The ids unnested in a subquery: a hash join, where `IN ?` compares the list with every row (quadratic
        # over a run). prefix is one of two constants, not user text.
        deleted = "(SELECT unnest(?::VARCHAR[]))"
        self.con.execute(
            f"DELETE FROM {prefix}vectors "
            f"WHERE chunk_id IN (SELECT chunk_id FROM {prefix}chunks WHERE doc_id IN {deleted})",
            [ids],
        )
        self.con.execute(f"DELETE FROM {prefix}chunks WHERE doc_id IN {deleted}", [ids])
        self.con.execute(f"DELETE FROM {prefix}documents WHERE doc_id IN {deleted}", [ids])

    def vector_format(self, table: str) -> str | None:
        """How `table` (vectors or staged_vectors) holds its vectors: INT8 codes with scales, FLOAT32, or
        None when there is no such table."""
        types = dict(
            self.con.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ?", [table]
            ).fetchall()
        )
        if "vector" not in types:
            return None
        return INT8 if "scale" in types else FLOAT32

    def _tables(self) -> set[str]:
        return {r[0] for r in self.con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}

    # ---- reading
    def counts(self) -> dict[str, int]:
        tables = self._tables()
        return {
            t: self.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] if t in tables else 0
            for t in ("documents", "chunks", "vectors")
        }

    def chunk_ids(self) -> np.ndarray:
        """Every stored chunk id (int64), ascending."""
        return (
            self.con.execute("SELECT chunk_id FROM chunks ORDER BY chunk_id").fetchnumpy()["chunk_id"].astype(np.int64)
        )

    def chunk_rows(self, ids: np.ndarray | None = None) -> list[tuple[int, str, str, str]]:
        """(chunk_id, doc_id, document title, chunk text) of every chunk, or of the chunks `ids`, in chunk_id order."""
        only, parameters = self._only(ids)
        return self.con.execute(
            f"SELECT c.chunk_id, c.doc_id, d.title, c.text FROM chunks c JOIN documents d USING (doc_id) {only} "
            "ORDER BY c.chunk_id",
            parameters,
        ).fetchall()

    def source_files(self) -> dict[str, tuple[str | None, int, int, str, str]]:
        """source -> (text_field, bytes, lines, sha256, documents_sha256): how far the last embed read each
        JSON-lines file (embed/appended.py); empty for a store from before it was recorded."""
        if "source_files" not in self._tables():
            return {}
        return {row[0]: row[1:] for row in self.con.execute("SELECT * FROM source_files").fetchall()}

    def record_source_files(self, sources: list[str], rows: list[tuple[str, str | None, int, int, str, str]]) -> None:
        """Replace what is recorded of these sources by these (source, text_field, bytes, lines, sha256,
        documents_sha256) rows (none for a source that is not to be resumed)."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DELETE FROM source_files WHERE source IN (SELECT unnest(?::VARCHAR[]))", [sources])
            if rows:
                self.con.executemany("INSERT INTO source_files VALUES (?, ?, ?, ?, ?, ?)", rows)
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise

    def documents_from(self, source: str) -> list[tuple[str, str]]:
        """(doc_id, content_hash) of the stored documents whose source is `source`, by doc_id."""
        return self.con.execute(
            "SELECT doc_id, content_hash FROM documents WHERE source = ? ORDER BY doc_id", [source]
        ).fetchall()

    def chunk_documents(self) -> list[tuple[int, str]]:
        """(chunk_id, doc_id) of every chunk, in chunk_id order."""
        return self.con.execute("SELECT chunk_id, doc_id FROM chunks ORDER BY chunk_id").fetchall()

    @staticmethod
    def _only(ids: np.ndarray | None) -> tuple[str, list]:
        """A clause keeping only the chunks `ids` (one bound list, so thousands of ids cost one join) and its
        parameters, or nothing."""
        if ids is None:
            return "", []
        return "SEMI JOIN (SELECT unnest(?::BIGINT[]) AS chunk_id) USING (chunk_id)", [
            np.asarray(ids, dtype=np.int64).tolist()
        ]

    def document_texts(self) -> list[tuple[str, str, str]]:
        """(doc_id, title, text) of every document, by doc_id."""
        return self.con.execute("SELECT doc_id, title, text FROM documents ORDER BY doc_id").fetchall()

    def iter_documents(self, batch_rows: int) -> Iterator[tuple[pa.Table, pa.Table]]:
        """Every document with its chunks, in doc_id order, batch_rows documents at a time: (the documents
        (doc_id, title, source, text, metadata as JSON text), their chunks (doc_id, chunk_id, chunk_index,
        start_char, end_char, text) by doc_id, then chunk_id). DuckDB sorts both tables within SORT_MEMORY,
        on disk beyond it (in its temporary directory beside the store)."""
        metadata = "metadata::VARCHAR" if self.has_metadata else "NULL::VARCHAR"
        self.con.execute(f"SET memory_limit = '{SORT_MEMORY}'")
        try:
            # Two result sets read side by side: each on a cursor of its own.
            documents = (
                self.con.cursor()
                .sql(f"SELECT doc_id, title, source, text, {metadata} AS metadata FROM documents ORDER BY doc_id")
                .to_arrow_reader(batch_rows)
            )
            chunks = (
                self.con.cursor()
                .sql(
                    "SELECT doc_id, chunk_id, chunk_index, start_char, end_char, text FROM chunks "
                    "ORDER BY doc_id, chunk_id"
                )
                .to_arrow_reader(batch_rows)
            )
            unread = (batch for batch in chunks if batch.num_rows)
            ahead: list[pa.RecordBatch] = []  # chunks read, not yet given with their documents
            for batch in documents:
                if batch.num_rows == 0:
                    continue
                last = batch.column(0)[-1].as_py()
                while not ahead or ahead[-1].column(0)[-1].as_py() <= last:  # Python orders str as DuckDB does
                    following = next(unread, None)
                    if following is None:
                        break
                    ahead.append(following)
                read = pa.Table.from_batches(ahead, chunks.schema)
                ids = read.column(0)
                theirs = bisect.bisect_right(range(len(read)), last, key=lambda row: ids[row].as_py())
                yield pa.Table.from_batches([batch]), read.slice(0, theirs)
                ahead = read.slice(theirs).to_batches()
        finally:
            self.con.execute("RESET memory_limit")

    def load_vectors(self, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All (chunk_ids int64, vectors float32 [n, dim]), or those of the chunks `ids`, in chunk_id order.
        Every vector in memory as float32 (4 KB a chunk at 1,024 dimensions): for what is small (a delta,
        a test); a whole collection is read with iter_vector_codes."""
        parts = list(self.iter_vector_codes(ids))
        if not parts:
            return np.zeros(0, np.int64), np.zeros((0, int(self.get_meta("dim") or 0)), np.float32)
        return (
            np.concatenate([part_ids for part_ids, _, _ in parts]),
            np.concatenate([dequantize(codes, scales) for _, codes, scales in parts]),
        )

    def iter_vector_codes(
        self, ids: np.ndarray | None = None, batch_rows: int = VECTOR_BATCH
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(chunk ids int64, int8 codes [m, dim], scales float32 [m]) of every stored vector, or of the chunks
        `ids`, in chunk_id order, batch_rows at a time (an older store's float32 vectors coded as read)."""
        dim = int(self.get_meta("dim") or 0)
        vector_format = self.vector_format("vectors")
        if not dim or vector_format is None:
            return
        only, parameters = self._only(ids)
        scale = "scale" if vector_format == INT8 else "NULL AS scale"
        reader = self.con.sql(
            f"SELECT chunk_id, vector, {scale} FROM vectors {only} ORDER BY chunk_id", params=parameters
        ).to_arrow_reader(batch_rows)
        for batch in reader:
            if batch.num_rows == 0:
                continue
            chunk_ids = arrow_numbers(batch.column(0), np.int64)
            flat = batch.column(1).flatten()
            if vector_format == INT8:
                codes = arrow_numbers(flat, np.int8).reshape(-1, dim)
                yield chunk_ids, codes, arrow_numbers(batch.column(2), np.float32)
            else:
                yield chunk_ids, *quantize(arrow_numbers(flat, np.float32).reshape(-1, dim))
