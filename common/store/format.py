"""The store's tables as DuckDB holds them (the schema, a writer's temporary tables, the memory DuckDB is
given), and the rows and vectors as they go in and come out (Arrow over numpy memory, int8 codes and a scale).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from common.errors import PipelineError
from common.vectors import quantize

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
# connection, which DuckDB spills to disk past its memory limit. The Python dicts and lists of every id and
# content hash grew with the collection, too large at a million documents
# (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
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
# into the file, and by default may use 80% of the machine's memory (much of it held at a million documents).
# Its memory is bounded here: what does not fit (rows written since the last checkpoint, a large join, the
# run's temporary tables) spills to pipeline.duckdb.tmp beside the store. The log is checkpointed every 4 GB
# (not every 16 MB, DuckDB's default, whose checkpoints took much of embed's time): a checkpoint writes the
# last, partly filled row group of each table again, so frequent checkpoints grew the file and cost CPU. A
# 2 GB limit took less CPU than 1 GB, for a higher peak memory
# (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
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
# most of what it read in memory (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md); set per
# connection, not per query, as a RESET returns to that default.
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
