"""Writing the corpus snapshot (its files: common/snapshot/reader.py): what search shows of the documents and chunks,
and the filter table, written by every full build and every update (an update changes the live chunks) into
a new directory under index/ that the manifest's "index" section then names (index/files.py `record`).

A full build reads the store in three passes, none of which sorts text (at 10M documents DuckDB's sort of the
texts spilled to disk beside the store until the disk ran out; measured:
benchmarks/results/2026-11-28-design-measurements-cpu.md): the documents' fields in doc_id order (a document's
position), the chunks with their document's position, then the texts in the store's own order, each compressed
as it comes and recorded by its span in texts.bin; a chunk whose text is the slice of its document's text its
offsets say is recorded as that slice, not as text. What is kept per chunk (21 bytes: its document, whether it
starts mid-text, its span; 16 more in memory while the texts pass) and per document (32 bytes, with 64 bits of
its content hash) is written through memory maps; nothing else grows with the collection.

An update reads only the documents added or changed since the last snapshot (their content hashes tell),
writes them as a snapshot of their own and merges it with the last one: positions are arrays, the texts
file is the last one's with the new texts appended (copied compressed once a quarter of it is stale:
write_texts) and the filter rows are merged by DuckDB.
Rewriting every document whole is slow at millions of documents; an update's cost grows with what
changed, plus array work and a rewrite of the documents' fields, which grow with the collection
(measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).

The filter table (search/filters.py queries it) is a DuckDB file: one row per document, `position`,
`doc_id`, `title`, `source` and one typed column per metadata field (BIGINT, DOUBLE, BOOLEAN, DATE,
TIMESTAMP, VARCHAR or a list of them; a field whose values disagree on a type is VARCHAR holding their
JSON). A field's type depends on all its values, so it is decided over the first pass (MetadataFields),
and the columns are made by a second pass over the documents written in the first. What decided each type
is kept in corpus.json: an update whose values still fit the columns merges the rows, one whose values do
not (or a new field) makes the table anew with the wider types. Types only widen over updates (a deleted
document's values still count) until a full build. A metadata field named like one of the built-in columns
(DuckDB's names ignore case) stays in the document's metadata but is not a column; of two fields whose names
differ only in case, the first seen is.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.format import open_memmap

from common.console import warn
from common.snapshot.reader import (
    CHUNK_DOCS,
    CHUNK_IDS,
    CHUNK_SPANS,
    CHUNK_STARTS_MID_TEXT,
    CHUNK_TEXTS,
    DOCUMENT_CHUNKS,
    DOCUMENT_COLUMNS,
    DOCUMENT_HASHES,
    DOCUMENTS,
    FILTERS,
    META,
    NOT_A_SLICE,
    TEXT_DICTIONARY,
    TEXT_SPANS,
    TEXTS,
    Snapshot,
    compress_text,
    compressor,
    read_arrow,
)
from common.store import Store, short_hash
from common.workspace import write_directory

# Documents read from the store at once, with their chunks: their texts take little memory
# (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
DOCUMENT_BATCH = 20_000
FILTER_MEMORY = "1GB"  # DuckDB's while it merges filter tables (it spills beyond)
MAX_FILTER_FIELDS = 1000  # metadata fields that are filter-table columns (Elasticsearch's default field limit)
STALE_TEXTS = 0.25  # an update links the texts file while at most this share of it is stale (write_texts)
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
JSON_TYPES = {kind.__name__: kind for kind in (bool, int, float, str, list, dict, type(None))}  # what json.loads makes


def write_corpus(
    index_dir: Path,
    store: Store,
    live: np.ndarray,
    generation: int,
    previous: Path | None = None,
    doc_ids: list[str] | None = None,
) -> Path:
    """Write the snapshot of the store at `generation` (`live`: its chunk ids, ascending) into a new directory
    under index_dir and return it: the manifest then names it, so a reader never sees half of one. With
    `previous` (the snapshot of an earlier generation) only the documents added or changed since are read from
    the store, and the rest is copied from it (update_documents_and_chunks). With `doc_ids` (a shard's
    documents, ascending: index/shards.py), of those documents only (`live`: their chunks), the previous
    snapshot being that shard's."""

    def write(directory: Path) -> None:
        fields = None
        if previous is not None and can_update(previous):
            fields = update_documents_and_chunks(directory, previous, store, live, doc_ids)
        if fields is None:
            fields = write_documents_and_chunks(directory, store, live, doc_ids)
            write_filter_table(read_arrow(directory / DOCUMENTS), fields.column_types(), directory / FILTERS)
        if fields.unfiltered:
            warn(
                f"{len(fields.unfiltered):,} metadata field(s) past the first {MAX_FILTER_FIELDS:,} of the collection "
                "are stored and shown with results, not filterable (e.g. "
                + ", ".join(repr(name[:40]) for name in sorted(fields.unfiltered)[:3])
                + ")"
            )
        meta = {"generation": generation, "fields": fields.to_json()}
        (directory / META).write_text(json.dumps(meta) + "\n")

    return write_directory(write, index_dir, "corpus")


def can_update(previous: Path) -> bool:
    """Whether a snapshot can be the base of the next: one with documents, of this layout (it keeps their
    content hashes and what its metadata fields hold)."""
    try:
        meta = json.loads((previous / META).read_text())
    except (OSError, ValueError):
        return False
    return (
        "fields" in meta
        and len(meta["fields"]) <= MAX_FILTER_FIELDS  # a wider table (made before the limit) is made anew
        and (previous / DOCUMENT_HASHES).exists()
        and (previous / TEXT_SPANS).exists()
        and (previous / TEXT_DICTIONARY).stat().st_size > 0
    )


def write_documents_and_chunks(
    directory: Path, store: Store, live: np.ndarray, doc_ids: list[str] | None = None, dictionary: bytes | None = None
) -> "MetadataFields":
    """Every file of the snapshot but the filter table and corpus.json; returns what the metadata fields hold.
    With `doc_ids`, of those documents only (`live`: their chunks), their texts compressed with `dictionary`.
    Three passes over the store, none sorting text: the documents' fields in doc_id order (a document's
    position), the chunks with their document's position, then the texts in the store's own order, each
    compressed, written where the file ends and its span recorded at its document's position."""
    n_documents = store.counts()["documents"] if doc_ids is None else len(doc_ids)
    document_schema = pa.schema([(name, pa.string()) for name in DOCUMENT_COLUMNS])
    hashes = open_memmap(directory / DOCUMENT_HASHES, "w+", np.uint64, (n_documents,))
    rows = np.empty(n_documents, np.int64)  # each position's rowid in the store
    fields = MetadataFields()
    position = 0  # of the batch's first document
    with pa.ipc.new_file(str(directory / DOCUMENTS), document_schema) as documents_file:
        for batch in store.document_fields(DOCUMENT_BATCH, doc_ids):
            end = position + batch.num_rows
            hashes[position:end] = batch.column("hash").to_numpy()
            rows[position:end] = batch.column("row").to_numpy()
            documents_file.write_table(pa.Table.from_batches([batch]).select(DOCUMENT_COLUMNS).cast(document_schema))
            fields.add([json.loads(m) if m else {} for m in batch.column("metadata").to_pylist()])
            position = end

    np.save(directory / CHUNK_IDS, live)
    chunk_docs = open_memmap(directory / CHUNK_DOCS, "w+", np.int32, (len(live),))
    starts_mid_text = open_memmap(directory / CHUNK_STARTS_MID_TEXT, "w+", np.bool_, (len(live),))
    firsts, lasts = np.empty(len(live), np.int32), np.empty(len(live), np.int32)  # the chunks' offsets
    text_hashes = np.empty(len(live), np.uint64)
    for batch in store.chunk_positions(DOCUMENT_BATCH, doc_ids):
        at = np.searchsorted(live, batch.column("chunk_id").to_numpy())
        chunk_docs[at] = batch.column("position").to_numpy()
        starts_mid_text[at] = batch.column("chunk_index").to_numpy() > 0
        firsts[at] = pc.fill_null(batch.column("start_char"), -1).to_numpy()
        lasts[at] = pc.fill_null(batch.column("end_char"), -1).to_numpy()
        text_hashes[at] = pc.fill_null(batch.column("text_hash"), 0).to_numpy()
    document_chunks = open_memmap(directory / DOCUMENT_CHUNKS, "w+", np.int32, (n_documents,))
    document_chunks[:] = np.bincount(chunk_docs, minlength=n_documents)

    position_of_row = np.full(int(rows.max(initial=-1)) + 1, -1, np.int64)
    position_of_row[rows] = np.arange(n_documents)
    chunks_by_document = np.argsort(chunk_docs, kind="stable")  # the chunks of position p: from first_chunk[p] on
    first_chunk = np.concatenate([[0], np.cumsum(document_chunks, dtype=np.int64)])
    text_spans = open_memmap(directory / TEXT_SPANS, "w+", np.int64, (n_documents, 2))
    spans = open_memmap(directory / CHUNK_SPANS, "w+", np.int32, (len(live), 2))
    start = None if dictionary is None else compressor(dictionary)  # the compressor every text starts from
    written = 0  # bytes of texts.bin
    own_texts = 0  # chunk texts written to chunk_texts.arrow
    with (
        (directory / TEXTS).open("wb") as texts_file,
        pa.ipc.new_file(str(directory / CHUNK_TEXTS), pa.schema([("text", pa.string())])) as chunk_texts_file,
    ):
        for batch in store.document_texts_by_row(DOCUMENT_BATCH, doc_ids):
            texts = [text or "" for text in batch.column("text").to_pylist()]
            positions = position_of_row[batch.column("row").to_numpy()]
            if start is None:  # the dictionary is made from the first batch
                dictionary = text_dictionary(texts)
                start = compressor(dictionary)
            compressed = [compress_text(text, start) for text in texts]
            texts_file.write(b"".join(compressed))
            lengths = np.array([len(c) for c in compressed], np.int64)
            ends = written + np.cumsum(lengths)
            text_spans[positions, 1] = ends
            text_spans[positions, 0] = ends - lengths
            written = int(ends[-1])

            counts = document_chunks[positions]
            text_of_chunk = np.repeat(np.arange(len(texts)), counts)  # the batch's row of each chunk's document
            within = np.arange(len(text_of_chunk)) - np.repeat(np.cumsum(counts) - counts, counts)
            chunks = chunks_by_document[np.repeat(first_chunk[positions], counts) + within]
            spans[chunks], kept_whole = chunk_spans(
                live[chunks],
                firsts[chunks],
                lasts[chunks],
                text_hashes[chunks],
                [texts[row] for row in text_of_chunk.tolist()],
                own_texts,
                store,
            )
            chunk_texts_file.write_table(pa.table({"text": pa.array(kept_whole, pa.string())}))
            own_texts += len(kept_whole)
    (directory / TEXT_DICTIONARY).write_bytes(dictionary or b"")
    for array in (chunk_docs, starts_mid_text, spans, document_chunks, text_spans, hashes):
        array.flush()
    return fields


def update_documents_and_chunks(
    directory: Path, previous: Path, store: Store, live: np.ndarray, doc_ids: list[str] | None = None
) -> "MetadataFields | None":
    """The snapshot's files, as write_documents_and_chunks and write_filter_table write them, from the
    `previous` snapshot and the documents added or changed since (a document changed when its content hash
    did; a changed document's chunks are new ones: ids are never reused): those are written as a snapshot of
    their own (by write_documents_and_chunks, with the previous dictionary) and merged with the previous one's
    documents still stored, by position (with `doc_ids`, a shard's: of those documents only). Texts are
    appended or copied compressed (write_texts), and the filter table's rows merged by DuckDB. Returns what
    the metadata fields hold, or None when the previous snapshot does not match the store (a chunk of an
    unchanged document is gone): the caller then writes the snapshot whole."""
    old = Snapshot(previous)
    source, changed_ids = store.documents_since(
        read_arrow(previous / DOCUMENTS).column("doc_id"), np.load(previous / DOCUMENT_HASHES, mmap_mode="r"), doc_ids
    )
    from_old = source >= 0
    old_kept = np.isin(old.chunk_ids, live, assume_unique=True)
    new_position_of_old = np.full(old.n_documents, -1, np.int64)
    new_position_of_old[source[from_old]] = np.flatnonzero(from_old)
    if (new_position_of_old[old.chunk_docs[old_kept]] < 0).any() or old_kept.sum() != old.document_chunks[
        source[from_old]
    ].sum(dtype=np.int64):
        return None

    changed = directory / "changed"  # the documents added or changed, as a snapshot of their own
    changed.mkdir()
    added = live[~np.isin(live, old.chunk_ids[old_kept], assume_unique=True)]
    dictionary = (previous / TEXT_DICTIONARY).read_bytes()
    fields = write_documents_and_chunks(changed, store, added, changed_ids, dictionary)
    (changed / META).write_text(json.dumps({"generation": None}) + "\n")
    new = Snapshot(changed)

    merge_documents(directory, old, new, source)
    merge_chunks(directory, old, new, live, old_kept, new_position_of_old, np.flatnonzero(~from_old))
    (directory / TEXT_DICTIONARY).write_bytes(dictionary)

    old_fields = MetadataFields.from_json(json.loads((previous / META).read_text())["fields"])
    types = old_fields.column_types()
    old_fields.merge(fields)
    if old_fields.column_types() == types:
        write_filter_table(read_arrow(changed / DOCUMENTS), types, changed / FILTERS)
        merge_filter_tables(directory / FILTERS, previous / FILTERS, changed / FILTERS, source)
    else:  # a field's values no longer fit its column: the table is made anew
        write_filter_table(read_arrow(directory / DOCUMENTS), old_fields.column_types(), directory / FILTERS)
    del new
    shutil.rmtree(changed)
    return old_fields


def merge_documents(directory: Path, old: Snapshot, new: Snapshot, source: np.ndarray) -> None:
    """The files by document position (documents.arrow, texts.bin, text_spans.npy, document_chunks.npy,
    document_hashes.npy) of the documents at `source` (>= 0) of the `old` snapshot and, where source is -1,
    the next of the `new` one."""
    n = len(source)
    from_old = source >= 0
    new_rows = np.cumsum(~from_old) - 1  # where source is -1: the document's row in `new`

    for name, dtype, old_values, new_values in (
        (DOCUMENT_CHUNKS, np.int32, old.document_chunks, new.document_chunks),
        (DOCUMENT_HASHES, np.uint64, *(np.load(c.directory / DOCUMENT_HASHES, mmap_mode="r") for c in (old, new))),
    ):
        merged = open_memmap(directory / name, "w+", dtype, (n,))
        merged[from_old] = old_values[source[from_old]]
        merged[~from_old] = new_values
        merged.flush()

    write_texts(directory, old, new, source)

    old_documents, new_documents = read_arrow(old.directory / DOCUMENTS), read_arrow(new.directory / DOCUMENTS)
    with pa.ipc.new_file(str(directory / DOCUMENTS), old_documents.schema) as out:
        for start in range(0, n, DOCUMENT_BATCH):
            end = min(n, start + DOCUMENT_BATCH)
            kept = from_old[start:end]
            part = pa.concat_tables(
                [
                    take_ascending(old_documents, source[start:end][kept]),
                    take_ascending(new_documents, new_rows[start:end][~kept]),
                ]
            )
            order = np.empty(end - start, np.int64)
            order[kept] = np.arange(kept.sum())
            order[~kept] = kept.sum() + np.arange((~kept).sum())
            out.write_table(part.take(order))


def take_ascending(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """table.take(rows) for ascending rows, from the slice they span: a take from a whole memory-mapped table
    of ten million documents was slow however few rows it took (measured:
    benchmarks/results/2026-11-28-design-measurements-cpu.md). Both snapshots' documents are in doc_id order, so the
    rows merge_documents takes for a slice of positions lie together."""
    first = int(rows[0]) if len(rows) else 0
    return table.slice(first, int(rows[-1]) + 1 - first if len(rows) else 0).take(rows - first)


def write_texts(directory: Path, old: Snapshot, new: Snapshot, source: np.ndarray) -> None:
    """texts.bin and text_spans.npy of the merged snapshot (merge_documents). While the texts of documents
    deleted or changed since are at most STALE_TEXTS of what the old file holds, it is the old file itself,
    linked and with the new texts appended (the old snapshot reads only its own spans, and a file linked
    keeps the bytes of both): an update then writes only what it adds, where copying every text at ten million
    documents was slow (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md). Past that share, the
    old snapshot's kept texts are copied compressed, in the order they lie in its file, a run of adjacent ones
    at a time, then the new file."""
    from_old = source >= 0
    in_old = np.flatnonzero(from_old)
    old_spans = np.asarray(old.text_spans[source[in_old]])
    old_size, new_size = ((c.directory / TEXTS).stat().st_size for c in (old, new))
    text_spans = open_memmap(directory / TEXT_SPANS, "w+", np.int64, (len(source), 2))
    if int((old_spans[:, 1] - old_spans[:, 0]).sum()) >= (1 - STALE_TEXTS) * old_size and link(
        old.directory / TEXTS, directory / TEXTS
    ):
        text_spans[in_old] = old_spans
        text_spans[~from_old] = np.asarray(new.text_spans) + old_size
        with (directory / TEXTS).open("r+b") as out, (new.directory / TEXTS).open("rb") as new_texts:
            out.seek(old_size)  # (copy_file_range refuses a file opened to append)
            copy_range(new_texts, out, 0, new_size)
        text_spans.flush()
        return

    in_file = np.argsort(old_spans[:, 0], kind="stable")
    in_old, starts, ends = in_old[in_file], old_spans[in_file, 0], old_spans[in_file, 1]
    text_spans[in_old, 1] = np.cumsum(ends - starts)
    text_spans[in_old, 0] = text_spans[in_old, 1] - (ends - starts)
    text_spans[~from_old] = np.asarray(new.text_spans) + int((ends - starts).sum())
    text_spans.flush()
    breaks = (np.flatnonzero(starts[1:] != ends[:-1]) + 1).tolist()
    with (
        (directory / TEXTS).open("wb") as out,
        (old.directory / TEXTS).open("rb") as old_texts,
        (new.directory / TEXTS).open("rb") as new_texts,
    ):
        for first, last in zip([0, *breaks], [*breaks, len(in_old)]) if len(in_old) else ():
            copy_range(old_texts, out, int(starts[first]), int(ends[last - 1]))
        copy_range(new_texts, out, 0, new_size)


def link(source: Path, target: Path) -> bool:
    """Hard-link target to source; False where the file system cannot."""
    try:
        os.link(source, target)
    except OSError:
        return False
    return True


def copy_range(source, target, start: int, end: int) -> None:
    """Append bytes [start, end) of the file `source` to the file `target`, in the kernel."""
    target.flush()
    while start < end:
        copied = os.copy_file_range(source.fileno(), target.fileno(), end - start, start)
        if copied == 0:
            raise OSError(f"{source.name}: ends before byte {end}")
        start += copied


def merge_chunks(
    directory: Path,
    old: Snapshot,
    new: Snapshot,
    live: np.ndarray,
    old_kept: np.ndarray,
    new_position_of_old: np.ndarray,
    new_position_of_new: np.ndarray,
) -> None:
    """The files by chunk position (chunk_ids.npy, chunk_docs.npy, chunk_starts_mid_text.npy, chunk_spans.npy,
    chunk_texts.arrow) of the `live` chunks: the `old` snapshot's chunks where old_kept, and all of `new`'s;
    new_position_of_*: each snapshot's document positions in the merged one."""
    np.save(directory / CHUNK_IDS, live)
    at_old = np.searchsorted(live, old.chunk_ids[old_kept])
    at_new = np.searchsorted(live, new.chunk_ids)
    chunk_docs = open_memmap(directory / CHUNK_DOCS, "w+", np.int32, (len(live),))
    chunk_docs[at_old] = new_position_of_old[old.chunk_docs[old_kept]]
    chunk_docs[at_new] = new_position_of_new[new.chunk_docs]
    starts_mid_text = open_memmap(directory / CHUNK_STARTS_MID_TEXT, "w+", np.bool_, (len(live),))
    starts_mid_text[at_old] = old.chunk_starts_mid_text[old_kept]
    starts_mid_text[at_new] = new.chunk_starts_mid_text
    # A chunk kept as text of its own has its row of chunk_texts.arrow in its span: the old snapshot's kept
    # ones come first, in chunk order, then the new one's.
    old_spans, new_spans = np.array(old.chunk_spans[old_kept]), np.array(new.chunk_spans)
    old_whole, new_whole = old_spans[:, 0] == NOT_A_SLICE, new_spans[:, 0] == NOT_A_SLICE
    old_rows = old_spans[old_whole, 1]
    old_spans[old_whole, 1] = np.arange(len(old_rows))
    new_spans[new_whole, 1] += len(old_rows)
    spans = open_memmap(directory / CHUNK_SPANS, "w+", np.int32, (len(live), 2))
    spans[at_old], spans[at_new] = old_spans, new_spans
    for array in (chunk_docs, starts_mid_text, spans):
        array.flush()
    with pa.ipc.new_file(str(directory / CHUNK_TEXTS), pa.schema([("text", pa.string())])) as out:
        for start in range(0, len(old_rows), DOCUMENT_BATCH):
            out.write_table(pa.table({"text": old.chunk_texts.take(old_rows[start : start + DOCUMENT_BATCH])}))
        out.write_table(pa.table({"text": new.chunk_texts}))


def chunk_spans(
    chunk_ids: np.ndarray,
    firsts: np.ndarray,
    lasts: np.ndarray,
    text_hashes: np.ndarray,
    document_texts: list[str],
    next_row: int,
    store: Store,
) -> tuple[np.ndarray, list[str]]:
    """Each chunk's span [start, end) in its document's text (`document_texts`: each chunk's document's, its
    offsets `firsts` and `lasts`, -1 where none), and the texts of the chunks whose text is not that slice: their
    span is (NOT_A_SLICE, their row of chunk_texts.arrow, counting from `next_row`). The chunker cuts chunks from
    their document's text (embed/chunking.py); a chunk stored otherwise keeps its text, read from the store. A
    slice is told by the chunk's text hash (`text_hashes`: Store.chunk_positions' SHORT_HASH, which short_hash
    computes here for the slice)."""
    spans, others = [], []
    for i, (document_text, first, last, text_hash) in enumerate(
        zip(document_texts, firsts.tolist(), lasts.tolist(), text_hashes.tolist())
    ):
        if 0 <= first <= last and text_hash == short_hash(document_text[first:last]):
            spans.append((first, last))
        else:
            spans.append((NOT_A_SLICE, next_row + len(others)))
            others.append(i)
    texts = store.chunk_texts([int(chunk_ids[i]) for i in others]) if others else {}
    kept_whole = [texts[int(chunk_ids[i])] or "" for i in others]
    return np.array(spans, np.int32).reshape(-1, 2), kept_whole


def text_dictionary(texts: list[str]) -> bytes:
    """zlib's preset dictionary for the collection: DICTIONARY_BYTES of the texts of documents spread evenly over
    `texts` (the first batch). Whole texts, as they come, compressed short documents a little better than
    their most frequent words and phrases did
    (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
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

    def merge(self, other: "FieldValues") -> None:
        """Take in what `other` learnt of more values of the same field."""
        self.kinds |= other.kinds
        self.items |= other.items
        self.converts = {kind: self.converts[kind] and other.converts[kind] for kind in self.CHECKED}

    def to_json(self) -> dict:
        return {
            "kinds": sorted(kind.__name__ for kind in self.kinds),
            "items": sorted(kind.__name__ for kind in self.items),
            "converts": self.converts,
        }

    @classmethod
    def from_json(cls, data: dict) -> "FieldValues":
        values = cls()
        values.kinds = {JSON_TYPES[name] for name in data["kinds"]}
        values.items = {JSON_TYPES[name] for name in data["items"]}
        values.converts = {kind: bool(data["converts"][kind]) for kind in cls.CHECKED}
        return values

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
    """The metadata fields of the documents, in the order they are first seen, and what each holds: the
    filter table's columns. The first MAX_FILTER_FIELDS are; a field seen after them is stored and shown
    with hits, not filterable (counted in `unfiltered`), so no collection can make the table too wide to
    write or merge (six documents of ~5,000 fields each once made 23,854 columns, and every write failed)."""

    def __init__(self):
        self.fields: dict[str, FieldValues] = {}
        self._taken = {name.lower() for name in BUILT_IN}
        self.unfiltered: set[str] = set()

    def _take(self, name: str) -> bool:
        """Whether `name` is (now) a column."""
        if name in self.fields:
            return True
        if name.lower() in self._taken:
            return False
        if len(self.fields) >= MAX_FILTER_FIELDS:
            self.unfiltered.add(name)
            return False
        self._taken.add(name.lower())
        return True

    def add(self, metadata: list[dict]) -> None:
        """The metadata of a batch of documents."""
        for name in dict.fromkeys(name for fields in metadata for name in fields):
            if name not in self.fields and self._take(name):
                self.fields[name] = FieldValues()
        for name, values in self.fields.items():
            values.add([fields.get(name) for fields in metadata])

    def column_types(self) -> dict[str, str]:
        return {name: values.column_type() for name, values in self.fields.items()}

    def merge(self, other: "MetadataFields") -> None:
        """Take in the fields of more documents, as `add` would have."""
        for name, values in other.fields.items():
            if name in self.fields:
                self.fields[name].merge(values)
            elif self._take(name):
                self.fields[name] = values
        self.unfiltered |= other.unfiltered - set(self.fields)

    def to_json(self) -> list:
        """The fields in the order they were first seen, with what each holds (the snapshot's corpus.json
        keeps it, for the next snapshot to tell whether new values still fit their columns)."""
        return [[name, values.to_json()] for name, values in self.fields.items()]

    @classmethod
    def from_json(cls, data: list) -> "MetadataFields":
        fields = cls()
        for name, values in data:
            fields._taken.add(name.lower())
            fields.fields[name] = FieldValues.from_json(values)
        return fields


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


def merge_filter_tables(path: Path, old: Path, new: Path, source: np.ndarray) -> None:
    """The filter table at `path` of the rows of the `old` one at `source` (>= 0, their positions there) and,
    where source is -1, the next rows of the `new` one (both with the same columns), by position."""
    from_old = source >= 0
    moves = {
        "old_rows": pa.table(
            {"row": source[from_old].astype(np.int32), "position": np.flatnonzero(from_old).astype(np.int32)}
        ),
        "new_rows": pa.table(
            {
                "row": np.arange((~from_old).sum(), dtype=np.int32),
                "position": np.flatnonzero(~from_old).astype(np.int32),
            }
        ),
    }
    con = duckdb.connect(str(path))
    try:
        con.execute(f"SET memory_limit = '{FILTER_MEMORY}'")
        con.execute("ATTACH ? AS old (READ_ONLY)", [str(old)])
        con.execute("ATTACH ? AS new (READ_ONLY)", [str(new)])
        for name, table in moves.items():
            con.register(name, table)
        con.execute(
            "CREATE TABLE documents AS SELECT * FROM ("
            "SELECT m.position, d.* EXCLUDE (position) FROM old.documents d JOIN old_rows m ON d.position = m.row "
            "UNION ALL BY NAME "
            "SELECT m.position, d.* EXCLUDE (position) FROM new.documents d JOIN new_rows m ON d.position = m.row"
            ") ORDER BY position"
        )
        con.execute("DETACH old")
        con.execute("DETACH new")
    finally:
        con.close()
