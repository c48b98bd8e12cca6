"""The store's read role: what `pipeline index`, tune's measurement and the corpus snapshot read of the
published documents, chunks and vectors, streamed in batches so that a large store is never all in memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from common.store.connection import StoreConnection
from common.store.format import INT8, SHORT_HASH, VECTOR_BATCH, arrow_numbers
from common.vectors import dequantize, quantize


class CollectionReads(StoreConnection):
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
            # (beside the store) rather than hold every text in memory
            # (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
            cursor.execute(
                f"SELECT c.chunk_id, d.title, c.text FROM chunks c JOIN documents d USING (doc_id) {only} "
                "ORDER BY c.chunk_id",
                parameters,
            )
            while batch := cursor.fetchmany(batch_rows):
                yield batch
        finally:
            cursor.close()

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
        collection's text, whose sort spilled to disk beside the store at 10M documents
        (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
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
        own order, streamed without DuckDB sorting every vector first (at millions of chunks a sort larger than
        the memory DuckDB is given while BM25 reads the texts beside it; measured:
        benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
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
            # kept the vectors in memory; measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
            chunk_ids = arrow_numbers(batch.column(0), np.int64).copy()
            flat = batch.column(1).flatten()
            if vector_format == INT8:
                codes = arrow_numbers(flat, np.int8).reshape(-1, dim)
                yield chunk_ids, codes, arrow_numbers(batch.column(2), np.float32)
            else:
                yield chunk_ids, *quantize(arrow_numbers(flat, np.float32).reshape(-1, dim))
