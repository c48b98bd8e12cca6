"""The DuckDB store: documents, their chunks, and one vector per chunk (int8 codes and a scale).

    documents(doc_id, title, source, text, content_hash, updated_at, metadata JSON)
    chunks(chunk_id, doc_id, chunk_index, text, start_char, end_char, n_tokens)
    vectors(chunk_id, vector TINYINT[dim], scale FLOAT)   -- int8 codes (common/vectors.py) of the
                                               -- embedder recorded in store_meta; FLOAT[dim] in older stores
    store_meta(key, value)
    staged_documents, staged_chunks, staged_vectors   -- the next generation, while `pipeline embed` runs
    source_read, source_skipped, run_documents, removed_documents  -- a writer's temporary tables: one run's bookkeeping

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
its own for filters, into a snapshot beside the indexes (common/snapshot/writer.py, read by common/snapshot/reader.py),
streaming them from here: the documents' fields in doc_id order, their chunks with their document's
position, then the texts in the store's own order (`document_fields`, `chunk_positions`,
`document_texts_by_row`), so that nothing sorts the collection's text.

All SQL against the store is in this module, and it takes bound parameters.
"""

from __future__ import annotations

import hashlib
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
VECTOR_BATCH = 50_000  # rows of vectors read at once by iter_vector_codes: 50 MB of int8 codes at 1,024 dimensions
# What one run of a writer works through, kept in DuckDB rather than in Python: temporary tables of its
# connection, which DuckDB spills to disk past its memory limit. At a million documents the Python dicts and
# lists of every id and content hash were gigabytes.
RUN_TABLES = """
-- every document an embed run read from its source, in reading order (embed/survey.py); `file` numbers
-- the JSON-lines file it came from
CREATE TEMP TABLE source_read (position BIGINT, doc_id VARCHAR, content_hash VARCHAR, file INTEGER);
-- the files of its source it skipped as unreadable (absolute paths, as documents.source): their stored
-- documents are kept, by `embed --prune` too
CREATE TEMP TABLE source_skipped (source VARCHAR);
-- the documents the run stores: the one at `position` in what it read (or in the document API's list), or
-- a stored one (`stored_rowid`) embedded again from its stored text
CREATE TEMP TABLE run_documents (position BIGINT, stored_rowid BIGINT, doc_id VARCHAR, content_hash VARCHAR);
-- the stored documents its publish deletes
CREATE TEMP TABLE removed_documents (doc_id VARCHAR);
"""
# `pipeline embed` (bulk) writes gigabytes: DuckDB keeps what it writes in memory until a checkpoint moves it
# into the file, and by default may use 80% of the machine's memory (7 GB held at a million documents). Its
# memory is bounded here: what does not fit (rows written since the last checkpoint, a large join, the run's
# temporary tables) spills to pipeline.duckdb.tmp beside the store. The log is checkpointed every 4 GB (not
# every 16 MB: 40% of embed's time on 20,000 documents): a checkpoint writes the last, partly filled row
# group of each table again, so checkpoints every 256 MB made 300,000 documents' file 2.66 GB against 1.54,
# and took 10% more CPU. A 2 GB limit took 7% less CPU than 1 GB (peak RSS 2.35 against 1.40 GB).
BULK_MEMORY_LIMIT = "2GB"
BULK_CHECKPOINT_THRESHOLD = "4GB"
# The stored documents `embed --prune` deletes: those the run did not read, unless their file was skipped as
# unreadable (it is still there: what it held is kept).
PRUNED = "SELECT doc_id FROM documents ANTI JOIN source_read USING (doc_id) ANTI JOIN source_skipped USING (source)"
# Rows fetched at a time from a long result (Store.stored_documents, the hash lines).
FETCH_ROWS = 10_000
# DuckDB's memory for a store opened other than for bulk writes: its sorts (the chunks' texts for BM25, the
# documents' fields for the corpus snapshot) spill to disk beside the store beyond it, and its buffer pool keeps
# the blocks a scan read up to it. Without a limit (80% of RAM) the IVF build's one pass over 10M vectors left
# 12 GB of them in memory; set per connection, not per query, as a RESET returns to that default.
MEMORY_LIMIT = "1GB"
# What the corpus snapshot keeps of a document's content_hash to tell whether it changed since: 64 bits of its MD5
# (a standard function, so the same in every DuckDB version).
SHORT_HASH = "md5_number_lower({column})"


def short_hash(text: str) -> int:
    """SHORT_HASH of `text` computed here: its MD5's last 8 bytes, read little-endian (as DuckDB reads them)."""
    return int.from_bytes(hashlib.md5(text.encode()).digest()[8:], "little")


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
        """bulk: a run writing many rows (`pipeline embed`): DuckDB's memory is bounded (BULK_MEMORY_LIMIT) and
        it checkpoints its write-ahead log every BULK_CHECKPOINT_THRESHOLD rather than every 16 MB."""
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
            self.con.execute(RUN_TABLES)
        self.con.execute(f"SET memory_limit = '{BULK_MEMORY_LIMIT if bulk else MEMORY_LIMIT}'")
        if bulk:
            self.con.execute(f"SET checkpoint_threshold = '{BULK_CHECKPOINT_THRESHOLD}'")
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
    def document_hashes(self, ids: list[str]) -> dict[str, str]:
        """doc_id -> content hash of those of these documents that are stored."""
        return dict(
            self.con.execute(
                "SELECT doc_id, content_hash FROM documents SEMI JOIN (SELECT unnest(?::VARCHAR[]) AS doc_id) "
                "USING (doc_id)",
                [ids],
            ).fetchall()
        )

    def stored_documents(self, rowids: np.ndarray) -> Iterator[tuple[str, str, str, str, dict, str]]:
        """(doc_id, title, source, text, metadata, content_hash) of the stored documents at these rowids
        (ascending), to embed them again: fetched a few thousand at a time (by rowid: a lookup by doc_id
        scans the table, 35 ms per 1,024 ids at 2M documents against 2.7 ms), through a cursor of their own
        so that the store can be written meanwhile."""
        reader = self.con.cursor()
        try:
            for start in range(0, len(rowids), FETCH_ROWS):
                rows = reader.execute(
                    "SELECT doc_id, title, source, text, metadata, content_hash FROM documents "
                    "WHERE rowid IN (SELECT unnest(?::BIGINT[])) ORDER BY rowid",
                    [rowids[start : start + FETCH_ROWS].tolist()],
                ).fetchall()
                for row in rows:
                    yield (*row[:4], json.loads(row[4]) if row[4] else {}, row[5])
        finally:
            reader.close()

    def next_chunk_id(self) -> int:
        """The first id never given to a chunk (ids are not reused, so an old index never names a new chunk)."""
        highest = self.con.execute(
            "SELECT greatest((SELECT max(chunk_id) FROM chunks), (SELECT max(chunk_id) FROM staged_chunks))"
        ).fetchall()[0][0]
        return max(int(self.get_meta("next_chunk_id") or 0), -1 if highest is None else highest + 1)

    # ---- what a run read and what it stores (RUN_TABLES)
    def clear_source_read(self) -> None:
        self.con.execute("DELETE FROM source_read")
        self.con.execute("DELETE FROM source_skipped")

    def add_skipped(self, sources: list[str]) -> None:
        """Record the files of the source skipped as unreadable (absolute paths)."""
        self.con.execute("INSERT INTO source_skipped SELECT unnest(?::VARCHAR[])", [sources])

    def add_read(
        self, first_position: int, doc_ids: list[str], content_hashes: list[str], files: list[int | None]
    ) -> None:
        """Record documents read, at the positions from first_position on."""
        self.con.execute(
            "INSERT INTO source_read SELECT unnest(range(?::BIGINT, ?::BIGINT)), unnest(?::VARCHAR[]), "
            "unnest(?::VARCHAR[]), unnest(?::INTEGER[])",
            [first_position, first_position + len(doc_ids), doc_ids, content_hashes, files],
        )

    def add_read_before(self, first_position: int, source: str, file: int) -> int:
        """Record the stored documents of `source` as read, at the positions from first_position on (the
        lines of a JSON-lines file an earlier run read: embed/appended.py); returns how many."""
        return self.con.execute(
            "INSERT INTO source_read SELECT ? + row_number() OVER (ORDER BY doc_id) - 1, doc_id, content_hash, ? "
            "FROM documents WHERE source = ?",
            [first_position, file, source],
        ).fetchall()[0][0]

    def first_repeated_id(self) -> tuple[str, int, int] | None:
        """Of the ids read more than once, the one read again first: (doc_id, its first position, its second);
        None when every id was read once."""
        rows = self.con.execute(
            """SELECT doc_id, min(position), list(position ORDER BY position)[2] AS again FROM source_read
               WHERE doc_id IN (SELECT doc_id FROM source_read GROUP BY doc_id HAVING count(*) > 1)
               GROUP BY doc_id ORDER BY again LIMIT 1"""
        ).fetchall()
        return rows[0] if rows else None

    def read_hash_lines(self, file: int | None) -> Iterator[list[str]]:
        """As stored_hash_lines, for the documents read from the JSON-lines file numbered `file` (none for None)."""
        return self._batches(
            "SELECT doc_id || chr(31) || content_hash FROM source_read WHERE file = ? ORDER BY doc_id", [file]
        )

    def unread_count(self) -> int:
        """How many stored documents the run did not read."""
        return self.con.execute("SELECT count(*) FROM documents ANTI JOIN source_read USING (doc_id)").fetchall()[0][0]

    def unreadable_count(self) -> tuple[int, int]:
        """Of the stored documents the run did not read, how many are of files it skipped as unreadable, and
        of how many files."""
        return self.con.execute(
            "SELECT count(*), count(DISTINCT source) "
            "FROM documents ANTI JOIN source_read USING (doc_id) SEMI JOIN source_skipped USING (source)"
        ).fetchall()[0]

    def want_documents(self, rows: list[tuple[str, str]]) -> None:
        """The documents the run stores: these (doc_id, content hash), at their positions in the list."""
        self.con.execute("DELETE FROM run_documents")
        self.con.execute(
            "INSERT INTO run_documents "
            "SELECT unnest(range(?::BIGINT)), NULL, unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
            [len(rows), *columns(rows, 2)],
        )

    def want_read_documents(self, changed_only: bool, stored_unread: bool, pruned: bool = False) -> int:
        """The documents the run stores: those it read (source_read), only the new and changed ones if
        changed_only, and with stored_unread every stored document it did not read too (from its stored
        text), but for those `embed --prune` deletes (PRUNED) when pruned. Returns how many."""
        changed = "ANTI JOIN documents USING (doc_id, content_hash)" if changed_only else ""
        self.con.execute("DELETE FROM run_documents")
        self.con.execute(
            f"INSERT INTO run_documents SELECT position, NULL, doc_id, content_hash FROM source_read {changed}"
        )
        if stored_unread:
            # The clause is a constant of this module, not user text.
            self.con.execute(
                "INSERT INTO run_documents SELECT NULL, d.rowid, d.doc_id, d.content_hash "
                "FROM documents d ANTI JOIN source_read USING (doc_id)"
                + (f" WHERE d.doc_id NOT IN ({PRUNED})" if pruned else "")
            )
        return self.con.execute("SELECT count(*) FROM run_documents").fetchall()[0][0]

    def unstaged_documents(self) -> tuple[np.ndarray, np.ndarray]:
        """The documents the run stores that are not staged yet: their positions, and the rowids of the stored
        ones embedded again; each ascending (int64: 8 bytes a document)."""
        unstaged = "FROM run_documents ANTI JOIN staged_documents USING (doc_id, content_hash)"
        positions = self.con.execute(
            f"SELECT position {unstaged} WHERE position IS NOT NULL ORDER BY position"
        ).fetchnumpy()["position"]
        rowids = self.con.execute(
            f"SELECT stored_rowid {unstaged} WHERE stored_rowid IS NOT NULL ORDER BY stored_rowid"
        ).fetchnumpy()["stored_rowid"]
        return positions.astype(np.int64), rowids.astype(np.int64)

    def staged_otherwise_than_wanted(self) -> str | None:
        """The id of a document the run wanted that is not staged as it wanted, or of one staged that it did
        not want; None when the staged documents are exactly the wanted ones."""
        rows = self.con.execute(
            """(SELECT doc_id FROM run_documents ANTI JOIN staged_documents USING (doc_id, content_hash) LIMIT 1)
               UNION ALL
               (SELECT doc_id FROM staged_documents ANTI JOIN run_documents USING (doc_id, content_hash) LIMIT 1)"""
        ).fetchall()
        return rows[0][0] if rows else None

    def stage(self, dim: int, embedder: str) -> int:
        """Prepare the staged tables for a run writing vectors of `embedder` for the documents it wants
        (run_documents: want_documents, want_read_documents). Documents a killed run of the same embedder
        staged already are kept when they are still wanted unchanged; returns how many."""
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
            self._delete(
                "SELECT doc_id FROM staged_documents ANTI JOIN run_documents USING (doc_id, content_hash)", "staged_"
            )
            self.con.execute("COMMIT")
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        return self.con.execute("SELECT count(*) FROM staged_documents").fetchall()[0][0]

    def write_documents(
        self, docs: list[tuple[str, str, str, str, str, dict]], chunks: list[ChunkRow], vectors: np.ndarray
    ) -> None:
        """Stage these documents (doc_id, title, source, text, content_hash, metadata) with their chunks and
        vectors, atomically; search sees them once `publish` runs. They must not be staged already (`stage`
        returns those that are): nothing is deleted here, which cost 13 ms a call over 100,000 documents."""
        metadata = [json.dumps(d[5], ensure_ascii=False) if d[5] else None for d in docs]
        ids = np.array([c.chunk_id for c in chunks], dtype=np.int64)
        # The recorded id, not next_chunk_id(): its max() scans the chunks written since the last checkpoint,
        # which grew with the run. The caller numbered the chunks from next_chunk_id().
        next_id = max([int(self.get_meta("next_chunk_id") or 0)] + [c.chunk_id + 1 for c in chunks])
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

    def publish(self, replace_all: bool, remove: list[str] = (), remove_unread: bool = False) -> int:
        """Make the staged documents what search sees, in one transaction: with replace_all they become the
        whole store (a new embedder), else they replace their stored versions and `remove` is deleted, and
        with remove_unread every stored document the run did not read (source_read: `embed --prune`) but for
        those of files it skipped as unreadable (source_skipped: PRUNED).
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
                self.con.execute("DELETE FROM removed_documents")
                self.con.execute("INSERT INTO removed_documents SELECT unnest(?::VARCHAR[])", [list(remove)])
                if remove_unread:
                    self.con.execute(f"INSERT INTO removed_documents {PRUNED}")  # a constant, not user text
                self._delete("SELECT doc_id FROM staged_documents UNION ALL SELECT doc_id FROM removed_documents")
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

    def _delete(self, ids_query: str, prefix: str = "") -> None:
        """Delete the documents whose ids `ids_query` gives with their chunks and vectors from the live tables,
        or the staged ones (prefix "staged_")."""
        # The ids in a subquery: a hash join. The query and prefix are constants of this module, not user text.
        deleted = f"({ids_query})"
        self.con.execute(
            f"DELETE FROM {prefix}vectors "
            f"WHERE chunk_id IN (SELECT chunk_id FROM {prefix}chunks WHERE doc_id IN {deleted})"
        )
        self.con.execute(f"DELETE FROM {prefix}chunks WHERE doc_id IN {deleted}")
        self.con.execute(f"DELETE FROM {prefix}documents WHERE doc_id IN {deleted}")

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

    def chunk_texts(self, ids: list[int]) -> dict[int, str | None]:
        """chunk_id -> text of the chunks `ids`."""
        only, parameters = self._only(np.asarray(ids, dtype=np.int64))
        return dict(self.con.execute(f"SELECT chunk_id, text FROM chunks {only}", parameters).fetchall())

    def iter_chunk_rows(
        self, ids: np.ndarray | None = None, batch_rows: int = 10_000
    ) -> Iterator[list[tuple[int, str, str]]]:
        """(chunk_id, document title, chunk text) of every chunk, or of the chunks `ids`, in chunk_id order, in
        lists of batch_rows: fetched as they are used, so the texts of a large store are never all in memory."""
        only, parameters = self._only(ids)
        cursor = self.con.cursor()  # a result of its own: another query on the store meanwhile does not end it
        try:
            # DuckDB sorts the whole result before the first row: past MEMORY_LIMIT it spills the sort to disk
            # (beside the store) rather than hold every text (2 GB of memory at a million chunks of SciFact).
            cursor.execute(
                f"SELECT c.chunk_id, d.title, c.text FROM chunks c JOIN documents d USING (doc_id) {only} "
                "ORDER BY c.chunk_id",
                parameters,
            )
            while batch := cursor.fetchmany(batch_rows):
                yield batch
        finally:
            cursor.close()

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

    def stored_hash_lines(self, source: str) -> Iterator[list[str]]:
        """`doc_id<US>content_hash` of each stored document whose source is `source`, by doc_id, a batch of
        lines at a time (embed/appended.py hashes them)."""
        return self._batches(
            "SELECT doc_id || chr(31) || content_hash FROM documents WHERE source = ? ORDER BY doc_id", [source]
        )

    def _batches(self, query: str, parameters: list) -> Iterator[list[str]]:
        """The one column of a query's rows, FETCH_ROWS at a time (nothing else runs on the connection
        until they are all read)."""
        result = self.con.execute(query, parameters)
        while rows := result.fetchmany(FETCH_ROWS):
            yield [row[0] for row in rows]

    def chunk_documents(self, doc_ids: list[str] | None = None) -> list[tuple[int, str]]:
        """(chunk_id, doc_id) of every chunk, or of the chunks of the documents `doc_ids`, in chunk_id order."""
        if doc_ids is None:
            return self.con.execute("SELECT chunk_id, doc_id FROM chunks ORDER BY chunk_id").fetchall()
        return self.con.execute(
            "SELECT chunk_id, doc_id FROM chunks SEMI JOIN (SELECT unnest(?::VARCHAR[]) AS doc_id) USING (doc_id) "
            "ORDER BY chunk_id",
            [doc_ids],
        ).fetchall()

    def shard(self, shard: int, shards: int) -> tuple[np.ndarray, list[str]]:
        """(chunk ids, ascending; doc ids, ascending) of the documents of shard `shard` of `shards`: those whose
        id's SHORT_HASH is `shard` modulo `shards` (index/shards.py shard_of, with short_hash, the same number)."""
        where = f"WHERE {SHORT_HASH.format(column='doc_id')} % ? = ?"
        chunk_ids = self.con.execute(
            f"SELECT chunk_id FROM chunks {where} ORDER BY chunk_id", [shards, shard]
        ).fetchnumpy()["chunk_id"]
        doc_ids = [
            row[0]
            for row in self.con.execute(
                f"SELECT doc_id FROM documents {where} ORDER BY doc_id", [shards, shard]
            ).fetchall()
        ]
        return np.asarray(chunk_ids, dtype=np.int64), doc_ids

    @staticmethod
    def _only(ids: np.ndarray | None) -> tuple[str, list]:
        """A clause keeping only the chunks `ids` (one bound list, so thousands of ids cost one join) and its
        parameters, or nothing."""
        if ids is None:
            return "", []
        return "SEMI JOIN (SELECT unnest(?::BIGINT[]) AS chunk_id) USING (chunk_id)", [
            np.asarray(ids, dtype=np.int64).tolist()
        ]

    def document_texts(self, limit: int, seed: int = 0) -> list[tuple[str, str, str]]:
        """(doc_id, title, text) of every document, or of a seeded random sample of `limit` of them when the
        store holds more, by doc_id."""
        count = self.con.execute("SELECT count(*) FROM documents").fetchall()[0][0]
        # DuckDB takes only constants in a sample clause: two ints of ours, not user text.
        sample = f"USING SAMPLE reservoir({int(limit)} ROWS) REPEATABLE ({int(seed)})" if count > limit else ""
        return self.con.execute(
            f"SELECT * FROM (SELECT doc_id, title, text FROM documents {sample}) ORDER BY doc_id"
        ).fetchall()

    def document_fields(self, batch_rows: int, doc_ids: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Every document's fields but its text, or those of the documents `doc_ids`, in doc_id order, batch_rows
        at a time: doc_id, title, source, metadata (JSON text), hash (SHORT_HASH of the content hash) and row (its
        rowid, which document_texts_by_row gives with each text). A document's position in this order is its position
        in the corpus snapshot. The text is left out so that DuckDB's sort holds ~100 bytes a document, not the
        collection's text: sorting the texts spilled 12 GB beside the store at 10M documents."""
        metadata = "metadata::VARCHAR" if self.has_metadata else "NULL::VARCHAR"
        only, parameters = self._only_documents(doc_ids)
        return self._arrow_batches(
            f"SELECT doc_id, title, source, {metadata} AS metadata, "
            f"{SHORT_HASH.format(column='content_hash')} AS hash, documents.rowid AS row "
            f"FROM documents {only} ORDER BY doc_id",
            parameters,
            batch_rows,
        )

    def chunk_positions(self, batch_rows: int, doc_ids: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Every chunk, or the chunks of the documents `doc_ids`, in chunk_id order, batch_rows at a time:
        chunk_id, position (its document's position in document_fields' order), chunk_index, start_char,
        end_char and text_hash (SHORT_HASH of its text: the text itself is not sorted, a chunk is nearly always a
        slice of its document's text, which the hash confirms)."""
        only, parameters = self._only_documents(doc_ids)
        return self._arrow_batches(
            "WITH positions AS (SELECT doc_id, row_number() OVER (ORDER BY doc_id) - 1 AS position "
            f"FROM documents {only}) "
            "SELECT c.chunk_id, p.position, c.chunk_index, c.start_char, c.end_char, c.text_hash FROM "
            f"(SELECT doc_id, chunk_id, chunk_index, start_char, end_char, {SHORT_HASH.format(column='text')} "
            "AS text_hash FROM chunks) c JOIN positions p USING (doc_id) ORDER BY c.chunk_id",
            parameters,
            batch_rows,
        )

    def document_texts_by_row(self, batch_rows: int, doc_ids: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """(row, text) of every document, or of the documents `doc_ids`, in the store's own order: nothing is
        sorted. `row` is the rowid document_fields gives; rowids hold while nothing writes to the store."""
        only, parameters = self._only_documents(doc_ids)
        return self._arrow_batches(f"SELECT documents.rowid AS row, text FROM documents {only}", parameters, batch_rows)

    def _arrow_batches(self, query: str, parameters: list, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """A query's result as Arrow batches of batch_rows, on a cursor of its own (other queries may run
        meanwhile), DuckDB holding at most MEMORY_LIMIT if it sorts (on disk, beside the store, beyond)."""
        cursor = self.con.cursor()
        try:
            for batch in cursor.sql(query, params=parameters or None).to_arrow_reader(batch_rows):
                if batch.num_rows:
                    yield batch
        finally:
            cursor.close()

    @staticmethod
    def _only_documents(doc_ids: list[str] | None) -> tuple[str, list]:
        """A clause keeping only the documents `doc_ids` (one bound list, joined: a constant clause, not user
        text) and its parameters, or nothing."""
        if doc_ids is None:
            return "", []
        return "SEMI JOIN (SELECT unnest(?::VARCHAR[]) AS doc_id) USING (doc_id)", [list(doc_ids)]

    def documents_since(
        self, doc_ids: pa.Array, hashes: np.ndarray, only: list[str] | None = None
    ) -> tuple[np.ndarray, list[str]]:
        """Which stored documents (or of them, the documents `only`) an earlier snapshot holds as they are now,
        given its `doc_ids` (by position) and `hashes` (SHORT_HASH of each): (for every such document in doc_id
        order, its position there, or -1 when it is new or changed since; the doc_ids of those, in doc_id
        order)."""
        previous = pa.table(
            {"doc_id": doc_ids, "hash": pa.array(hashes, pa.uint64()), "position": np.arange(len(hashes))}
        )
        short_hash = SHORT_HASH.format(column="d.content_hash")
        restriction, parameters = self._only_documents(only)
        cursor = self.con.cursor()
        try:
            cursor.register("previous", previous)
            found = cursor.sql(
                "SELECT coalesce(p.position, -1) AS position, CASE WHEN p.position IS NULL THEN d.doc_id END AS doc_id "
                f"FROM documents d {restriction} "
                f"LEFT JOIN previous p ON d.doc_id = p.doc_id AND {short_hash} = p.hash ORDER BY d.doc_id",
                params=parameters or None,
            ).to_arrow_table()
        finally:
            cursor.close()
        return found.column("position").to_numpy().astype(np.int64), found.column("doc_id").drop_null().to_pylist()

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
        self, ids: np.ndarray | None = None, batch_rows: int = VECTOR_BATCH, ordered: bool = True
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(chunk ids int64, int8 codes [m, dim], scales float32 [m]) of every stored vector, or of the chunks
        `ids`, batch_rows at a time (an older store's float32 vectors coded as read; the codes and scales are
        views of the batch read, valid while it is used): in chunk_id order, or without `ordered` in the table's
        own order, streamed without DuckDB sorting every vector first (2 GB
        at two million chunks, more than the memory DuckDB is given while BM25 reads the texts beside it)."""
        dim = int(self.get_meta("dim") or 0)
        vector_format = self.vector_format("vectors")
        if not dim or vector_format is None:
            return
        only, parameters = self._only(ids)
        scale = "scale" if vector_format == INT8 else "NULL AS scale"
        reader = self.con.sql(
            f"SELECT chunk_id, vector, {scale} FROM vectors {only} {'ORDER BY chunk_id' if ordered else ''}",
            params=parameters,
        ).to_arrow_reader(batch_rows)
        for batch in reader:
            if batch.num_rows == 0:
                continue
            # The ids copied (8 bytes a row), the codes and scales read in place: a view of any of the batch's
            # buffers keeps the whole batch alive, and the IVF build keeps every slice's ids (at 10M chunks, views
            # kept 10 GB of vectors in memory).
            chunk_ids = arrow_numbers(batch.column(0), np.int64).copy()
            flat = batch.column(1).flatten()
            if vector_format == INT8:
                codes = arrow_numbers(flat, np.int8).reshape(-1, dim)
                yield chunk_ids, codes, arrow_numbers(batch.column(2), np.float32)
            else:
                yield chunk_ids, *quantize(arrow_numbers(flat, np.float32).reshape(-1, dim))
