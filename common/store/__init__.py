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

All SQL against the store is in this package, and it takes bound parameters.

The package, by role: format.py (the tables, and rows and vectors as they go in and out), connection.py
(StoreConnection: opening it, its metadata), writes.py (DocumentWrites: embed's and the document API's
writes), reads.py (CollectionReads: what index, tune and the snapshot read). Store is all of them on one
connection; a function that only reads can say so by taking a CollectionReads.
"""

from common.store.format import SHORT_HASH, ChunkRow, damaged_store_error, short_hash
from common.store.reads import CollectionReads
from common.store.writes import DocumentWrites


class Store(DocumentWrites, CollectionReads):
    """The store, opened on one DuckDB connection: every role's methods (see the package's docstring)."""


__all__ = ["SHORT_HASH", "ChunkRow", "CollectionReads", "DocumentWrites", "Store", "damaged_store_error", "short_hash"]
