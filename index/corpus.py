"""Writing the corpus snapshot (its files: common/corpus.py): what search shows of the documents and chunks,
and the filter table, written by every full build and every update (an update changes the live chunks) into
a new directory under index/ that the manifest's "index" section then names (index/files.py `record`).

The store is read once, in doc_id order, a batch of documents with their chunks at a time
(Store.iter_documents): each document's text is compressed as it comes, and a chunk whose text is the slice
of its document's text its offsets say is recorded as that slice, not as text. What is kept per chunk (21
bytes: its document, whether it starts mid-text, its span) and per document (12 bytes) is written through
memory maps; nothing else grows with the collection.

The filter table (search/filters.py queries it) is a DuckDB file: one row per document, `position`,
`doc_id`, `title`, `source` and one typed column per metadata field (BIGINT, DOUBLE, BOOLEAN, DATE,
TIMESTAMP, VARCHAR or a list of them; a field whose values disagree on a type is VARCHAR holding their
JSON). A field's type depends on all its values, so it is decided over the first pass (MetadataFields),
and the columns are made by a second pass over the documents written in the first. A metadata field named
like one of the built-in columns (DuckDB's names ignore case) stays in the document's metadata but is not a
column; of two fields whose names differ only in case, the first seen is.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.format import open_memmap

from common.corpus import (
    CHUNK_DOCS,
    CHUNK_IDS,
    CHUNK_SPANS,
    CHUNK_STARTS_MID_TEXT,
    CHUNK_TEXTS,
    DOCUMENT_CHUNKS,
    DOCUMENT_COLUMNS,
    DOCUMENTS,
    FILTERS,
    META,
    NOT_A_SLICE,
    TEXT_DICTIONARY,
    TEXT_OFFSETS,
    TEXTS,
    compress_text,
    compressor,
    read_arrow,
)
from common.store import Store
from index.files import write_directory

DOCUMENT_BATCH = 20_000  # documents read from the store at once, with their chunks: ~50 MB of 1 KB texts
DICTIONARY_BYTES = 32 * 1024  # zlib's window: the most of a preset dictionary it can use
BUILT_IN = ("position", "doc_id", "title", "source")  # the filter table's own columns
COLUMN_TYPES = {  # a metadata field's column type -> its Arrow type ("JSON": VARCHAR holding each value's JSON)
    "BOOLEAN": pa.bool_(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us"),
    "VARCHAR": pa.string(),
    "VARCHAR[]": pa.list_(pa.string()),
    "BIGINT[]": pa.list_(pa.int64()),
    "DOUBLE[]": pa.list_(pa.float64()),
    "JSON": pa.string(),
}


def write_corpus(index_dir: Path, store: Store, live: np.ndarray, generation: int) -> Path:
    """Write the snapshot of the store at `generation` (`live`: its chunk ids, ascending) into a new directory
    under index_dir and return it: the manifest then names it, so a reader never sees half of one."""

    def write(directory: Path) -> None:
        fields = write_documents_and_chunks(directory, store, live)
        write_filter_table(read_arrow(directory / DOCUMENTS), fields.column_types(), directory / FILTERS)
        (directory / META).write_text(json.dumps({"generation": generation}) + "\n")

    return write_directory(write, index_dir, "corpus")


def write_documents_and_chunks(directory: Path, store: Store, live: np.ndarray) -> "MetadataFields":
    """Every file of the snapshot but the filter table and corpus.json; returns what the metadata fields hold."""
    n_documents = store.counts()["documents"]
    np.save(directory / CHUNK_IDS, live)
    chunk_docs = open_memmap(directory / CHUNK_DOCS, "w+", np.int32, (len(live),))
    starts_mid_text = open_memmap(directory / CHUNK_STARTS_MID_TEXT, "w+", np.bool_, (len(live),))
    spans = open_memmap(directory / CHUNK_SPANS, "w+", np.int32, (len(live), 2))
    document_chunks = open_memmap(directory / DOCUMENT_CHUNKS, "w+", np.int32, (n_documents,))
    text_offsets = open_memmap(directory / TEXT_OFFSETS, "w+", np.int64, (n_documents + 1,))
    document_schema = pa.schema([(name, pa.string()) for name in DOCUMENT_COLUMNS])
    chunk_text_schema = pa.schema([("text", pa.string())])
    fields = MetadataFields()
    start = None  # the compressor every text starts from, once the dictionary is made from the first batch
    position = 0  # of the batch's first document
    own_texts = 0  # chunk texts written to chunk_texts.arrow
    with (
        (directory / TEXTS).open("wb") as texts_file,
        pa.ipc.new_file(str(directory / DOCUMENTS), document_schema) as documents_file,
        pa.ipc.new_file(str(directory / CHUNK_TEXTS), chunk_text_schema) as chunk_texts_file,
    ):
        for documents, chunks in store.iter_documents(DOCUMENT_BATCH):
            texts = [text or "" for text in documents.column("text").to_pylist()]
            if start is None:
                dictionary = text_dictionary(texts)
                (directory / TEXT_DICTIONARY).write_bytes(dictionary)
                start = compressor(dictionary)
            compressed = [compress_text(text, start) for text in texts]
            texts_file.write(b"".join(compressed))
            end = position + len(texts)
            text_offsets[position + 1 : end + 1] = text_offsets[position] + np.cumsum([len(c) for c in compressed])
            documents_file.write_table(documents.select(DOCUMENT_COLUMNS).cast(document_schema))
            fields.add([json.loads(m) if m else {} for m in documents.column("metadata").to_pylist()])

            row_of = {doc_id: row for row, doc_id in enumerate(documents.column("doc_id").to_pylist())}
            rows = np.array([row_of[doc_id] for doc_id in chunks.column("doc_id").to_pylist()], np.int32)
            at = np.searchsorted(live, chunks.column("chunk_id").to_numpy())
            chunk_docs[at] = position + rows
            starts_mid_text[at] = chunks.column("chunk_index").to_numpy() > 0
            document_chunks[position:end] = np.bincount(rows, minlength=len(texts))
            spans[at], kept_whole = chunk_spans(chunks, [texts[row] for row in rows.tolist()], own_texts)
            chunk_texts_file.write_table(pa.table({"text": pa.array(kept_whole, pa.string())}))
            own_texts += len(kept_whole)
            position = end
        if start is None:  # no documents
            (directory / TEXT_DICTIONARY).write_bytes(b"")
    for array in (chunk_docs, starts_mid_text, spans, document_chunks, text_offsets):
        array.flush()
    return fields


def chunk_spans(chunks: pa.Table, document_texts: list[str], next_row: int) -> tuple[np.ndarray, list[str]]:
    """Each chunk's span [start, end) in its document's text (`document_texts`: each chunk's document's), and the
    texts of the chunks whose text is not that slice: their span is (NOT_A_SLICE, their row of chunk_texts.arrow,
    counting from `next_row`). The chunker cuts chunks from their document's text (embed/chunking.py); a chunk
    stored otherwise keeps its text."""
    spans, kept_whole = [], []
    for document_text, first, last, text in zip(
        document_texts,
        chunks.column("start_char").to_pylist(),
        chunks.column("end_char").to_pylist(),
        chunks.column("text").to_pylist(),
    ):
        if first is not None and last is not None and 0 <= first <= last and document_text[first:last] == text:
            spans.append((first, last))
        else:
            spans.append((NOT_A_SLICE, next_row + len(kept_whole)))
            kept_whole.append(text or "")
    return np.array(spans, np.int32).reshape(-1, 2), kept_whole


def text_dictionary(texts: list[str]) -> bytes:
    """zlib's preset dictionary for the collection: DICTIONARY_BYTES of the texts of documents spread evenly over
    `texts` (the first batch). Whole texts, as they come, compressed 1 KB documents 2.31x where their most
    frequent words and phrases did 2.26x."""
    step = max(1, sum(len(text) for text in texts) // DICTIONARY_BYTES)
    return "".join(texts[::step]).encode()[-DICTIONARY_BYTES:]


class FieldValues:
    """What the first pass learns of one metadata field's values, a batch at a time: the Python types of its
    values and of the items of its lists, and whether every value seen so far converts to each column type
    that takes some values and not others."""

    CHECKED = ("BIGINT", "DOUBLE", "DATE", "TIMESTAMP", "VARCHAR[]", "BIGINT[]", "DOUBLE[]")

    def __init__(self):
        self.kinds: set[type] = set()
        self.items: set[type] = set()
        self.converts = dict.fromkeys(self.CHECKED, True)

    def add(self, values: list) -> None:
        present = [v for v in values if v is not None]
        self.kinds |= {type(v) for v in present}
        self.items |= {type(x) for v in present if isinstance(v, list) for x in v}
        for kind in self.CHECKED:
            if self.converts[kind]:
                try:
                    typed_column(values, kind)
                except (ValueError, TypeError, OverflowError, pa.ArrowException):
                    self.converts[kind] = False

    def column_type(self) -> str:
        """The field's column type: the first of these its values all fit."""
        kinds, items = self.kinds, self.items
        if kinds <= {bool}:
            return "BOOLEAN"
        if kinds <= {int} and self.converts["BIGINT"]:  # within 64 bits
            return "BIGINT"
        if kinds <= {int, float} and self.converts["DOUBLE"]:
            return "DOUBLE"
        if kinds <= {str}:  # ISO dates and timestamps (what the readers make of typed dates) compare as such
            return next((kind for kind in ("DATE", "TIMESTAMP") if self.converts[kind]), "VARCHAR")
        if kinds <= {list} and items:
            for allowed, kind in (({str}, "VARCHAR[]"), ({int}, "BIGINT[]"), ({int, float}, "DOUBLE[]")):
                if items <= allowed:
                    return kind if self.converts[kind] else "JSON"
        return "JSON"


class MetadataFields:
    """The metadata fields of the documents, in the order they are first seen, and what each holds."""

    def __init__(self):
        self.fields: dict[str, FieldValues] = {}
        self._taken = {name.lower() for name in BUILT_IN}

    def add(self, metadata: list[dict]) -> None:
        """The metadata of a batch of documents."""
        for name in dict.fromkeys(name for fields in metadata for name in fields):
            if name not in self.fields and name.lower() not in self._taken:
                self._taken.add(name.lower())
                self.fields[name] = FieldValues()
        for name, values in self.fields.items():
            values.add([fields.get(name) for fields in metadata])

    def column_types(self) -> dict[str, str]:
        return {name: values.column_type() for name, values in self.fields.items()}


def typed_column(values: list, kind: str) -> pa.Array:
    """One metadata field's values (None where a document lacks it) as a column of `kind` (COLUMN_TYPES); raises
    when one of them is not of that kind."""
    if kind == "DOUBLE":
        values = [None if v is None else float(v) for v in values]
    elif kind == "DATE":
        values = [None if v is None else iso_date(v) for v in values]
    elif kind == "TIMESTAMP":
        values = [None if v is None else datetime.datetime.fromisoformat(v) for v in values]
    elif kind == "JSON":
        values = [None if v is None else json.dumps(v, ensure_ascii=False) for v in values]
    return pa.array(values, COLUMN_TYPES[kind])


def iso_date(value: str) -> datetime.date:
    """A date written as YYYY-MM-DD (a longer ISO text is a timestamp)."""
    if len(value) != 10:
        raise ValueError(f"not an ISO date: {value}")
    return datetime.date.fromisoformat(value)


def write_filter_table(documents: pa.Table, column_types: dict[str, str], path: Path) -> None:
    """The filter table: a row per document of `documents` (doc_id, title, source, metadata as JSON text, by
    position), with a column of each type of `column_types` (metadata field -> its type)."""
    schema = pa.schema(
        [("position", pa.int32()), ("doc_id", pa.string()), ("title", pa.string()), ("source", pa.string())]
        + [(name, COLUMN_TYPES[kind]) for name, kind in column_types.items()]
    )
    con = duckdb.connect(str(path))
    try:
        con.register("batch", schema.empty_table())
        con.execute("CREATE TABLE documents AS SELECT * FROM batch")
        position = 0
        for batch in documents.to_batches():
            metadata = [json.loads(m) if m else {} for m in batch.column("metadata").to_pylist()]
            columns = [
                pa.array(np.arange(position, position + batch.num_rows, dtype=np.int32)),
                batch.column("doc_id"),
                pc.fill_null(batch.column("title"), ""),
                pc.fill_null(batch.column("source"), ""),
            ] + [typed_column([fields.get(name) for fields in metadata], kind) for name, kind in column_types.items()]
            con.register("batch", pa.Table.from_arrays(columns, schema=schema))
            con.execute("INSERT INTO documents SELECT * FROM batch")
            position += batch.num_rows
        con.unregister("batch")
    finally:
        con.close()
