"""A connection to the store: opened for reading, writing or a bulk write, with its metadata (store_meta)
and the helpers every query of the store shares.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Self

import duckdb
import numpy as np
import pyarrow as pa

from common.errors import PipelineError
from common.store.format import (
    BULK_CHECKPOINT_THRESHOLD,
    BULK_MEMORY_LIMIT,
    DAMAGED_ADVICE,
    FETCH_ROWS,
    FLOAT32,
    INT8,
    MEMORY_LIMIT,
    RUN_TABLES,
    SCHEMA,
)


class StoreConnection:
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
            # The vectors' floats are noise to DuckDB's float compression (ALP, ALP-RD): it made the file
            # larger and the checkpoint slower (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_meta(self, key: str) -> str | None:
        rows = self.con.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchall()
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self.con.execute("INSERT OR REPLACE INTO store_meta VALUES (?, ?)", [key, value])

    def generation(self) -> int:
        """Bumped by every publish: an index built at this generation matches the store exactly."""
        return int(self.get_meta("generation") or 0)

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

    def counts(self) -> dict[str, int]:
        tables = self._tables()
        return {
            t: self.con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] if t in tables else 0
            for t in ("documents", "chunks", "vectors")
        }

    def _batches(self, query: str, parameters: list) -> Iterator[list[str]]:
        """The one column of a query's rows, FETCH_ROWS at a time (nothing else runs on the connection
        until they are all read)."""
        result = self.con.execute(query, parameters)
        while rows := result.fetchmany(FETCH_ROWS):
            yield [row[0] for row in rows]

    @staticmethod
    def _only(ids: np.ndarray | None) -> tuple[str, list]:
        """A clause keeping only the chunks `ids` (one bound list, so thousands of ids cost one join) and its
        parameters, or nothing."""
        if ids is None:
            return "", []
        return "SEMI JOIN (SELECT unnest(?::BIGINT[]) AS chunk_id) USING (chunk_id)", [
            np.asarray(ids, dtype=np.int64).tolist()
        ]

    @staticmethod
    def _only_documents(doc_ids: list[str] | None) -> tuple[str, list]:
        """A clause keeping only the documents `doc_ids` (one bound list, joined: a constant clause, not user
        text) and its parameters, or nothing."""
        if doc_ids is None:
            return "", []
        return "SEMI JOIN (SELECT unnest(?::VARCHAR[]) AS doc_id) USING (doc_id)", [list(doc_ids)]

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
