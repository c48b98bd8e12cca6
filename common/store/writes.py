"""The store's write role: what `pipeline embed` and the document API (embed/ingest.py) do to it. A run
records what it read and which documents it stores (RUN_TABLES), stages them (the staged tables) and
publishes them in one transaction, which bumps the store's generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from common.store.connection import StoreConnection
from common.store.format import FETCH_ROWS, FLOAT32, PRUNED, SCHEMA, ChunkRow, columns, vector_table


class DocumentWrites(StoreConnection):
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
        scans the table, many times slower at millions of documents; measured:
        benchmarks/results/2026-11-28-design-measurements-cpu.md), through a cursor of their own so that the store
        can be written meanwhile."""
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
        returns those that are): nothing is deleted here, which cost time on every call
        (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
        metadata = [json.dumps(d[5], ensure_ascii=False) if d[5] else None for d in docs]
        ids = np.array([c.chunk_id for c in chunks], dtype=np.int64)
        # The recorded id, not next_chunk_id(): its max() scans the chunks written since the last checkpoint,
        # which grew with the run. The caller numbered the chunks from next_chunk_id().
        next_id = max([int(self.get_meta("next_chunk_id") or 0)] + [c.chunk_id + 1 for c in chunks])
        self.con.execute("BEGIN TRANSACTION")
        try:
            # Each column as one list parameter, unnested: one insert per table, not one per row (executemany
            # cost far more per document; measured: benchmarks/results/2026-11-28-design-measurements-cpu.md); the
            # vectors as an Arrow table over their own memory.
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
