"""The corpus snapshot: the documents and chunks as search shows them, written by `pipeline index` beside the
index files (common/snapshot/writer.py) and read here by search, memory-mapped.

Search used to load the whole store into Python lists when it started: 43 s and 11.7 GB for a one-off search
over 1M documents, and out of reach of a 24 GB machine at 10M. The snapshot is laid out so that a search
reads only what it touches: arrays by chunk position (chunk-id order, the order of the FAISS and BM25
indexes) and by document position (doc-id order), and the texts of the hits it returns. Nothing is read
into memory when it is opened; the operating system pages in what is used.

    corpus.json                 the store generation it was written from
    chunk_ids.npy               int64 [chunks], ascending
    chunk_docs.npy              int32 [chunks]: the position of each chunk's document
    chunk_starts_mid_text.npy   bool [chunks]: the chunk is not its document's first
    chunk_spans.npy             int32 [chunks, 2]: the chunk's text as [start, end) of its document's text (the
                                chunker cuts chunks from it: embed/chunking.py), or (-1, row of chunk_texts.arrow)
                                for a chunk whose text is not such a slice
    chunk_texts.arrow           the texts of those chunks
    documents.arrow             doc_id, title, source, metadata (JSON text or null), by document position
    document_chunks.npy         int32 [documents]: how many chunks each document has
    texts.bin                   each document's text, compressed on its own, in no particular order
    text_spans.npy              int64 [documents, 2]: where each document's text is in texts.bin, [start, end)
    text_dictionary.bin         the preset dictionary every text is compressed with
    filters.duckdb              the documents' fields typed for filters (search/filters.py)
    document_hashes.npy         uint64 [documents]: 64 bits of each document's content hash, so that the
                                next snapshot copies what did not change (common/snapshot/writer.py)

The Arrow files are uncompressed IPC files: memory-mapped, a column is read in place. A document's position
is found from its id by binary search over doc_id (DuckDB sorts text by its UTF-8 bytes, which is the order
of Python's strings).

Search reads the texts and the documents' fields at random places, a few hits a query, so those two files are
mapped without the kernel's read-around (MADV_RANDOM). With it, each hit read 128 KB around it from disk, and
at ten million documents the texts and fields (6 GB) filled the page cache and pushed out the index files
every search reads.

Texts are zlib streams with a preset dictionary of the collection's own text, so that one document is read
alone. On 20,000 abstract-like documents of 1 KB: 1.7x smaller than the text without the dictionary, 2.22x
with it at level 3, 2.31x at level 6, which took 101 us a document to compress against 37 us (it is done for
every document at every `pipeline index`); a text is read back in ~18 us.
"""

from __future__ import annotations

import bisect
import json
import mmap
import os
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.errors import PipelineError

META = "corpus.json"
CHUNK_IDS = "chunk_ids.npy"
CHUNK_DOCS = "chunk_docs.npy"
CHUNK_STARTS_MID_TEXT = "chunk_starts_mid_text.npy"
CHUNK_SPANS = "chunk_spans.npy"
CHUNK_TEXTS = "chunk_texts.arrow"
DOCUMENTS = "documents.arrow"
DOCUMENT_CHUNKS = "document_chunks.npy"
TEXTS = "texts.bin"
TEXT_SPANS = "text_spans.npy"
TEXT_OFFSETS = "text_offsets.npy"  # the layout before text_spans: [documents + 1], texts in position order
TEXT_DICTIONARY = "text_dictionary.bin"
FILTERS = "filters.duckdb"
DOCUMENT_HASHES = "document_hashes.npy"
DOCUMENT_COLUMNS = ("doc_id", "title", "source", "metadata")
NOT_A_SLICE = -1  # chunk_spans' start for a chunk whose text is in chunk_texts.arrow


def compressor(dictionary: bytes) -> "zlib._Compress":
    """The compressor every text starts from: a copy of it compresses one text (a copy is cheaper than
    loading the dictionary again). Level 3: see the module docstring."""
    return zlib.compressobj(3, zlib.DEFLATED, zlib.MAX_WBITS, 8, zlib.Z_DEFAULT_STRATEGY, dictionary)


def compress_text(text: str, start: "zlib._Compress") -> bytes:
    """One document's text, compressed alone from `start` (a `compressor`)."""
    stream = start.copy()
    return stream.compress(text.encode()) + stream.flush()


def read_arrow(path: Path) -> pa.Table:
    """An Arrow IPC file memory-mapped: its columns are read in place, as they are used."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def map_for_random_reads(path: Path) -> pa.Buffer:
    """The file memory-mapped for reads at random places: a page is read from disk when touched, not the
    128 KB around it (module docstring)."""
    with path.open("rb") as f:
        if not os.fstat(f.fileno()).st_size:
            return pa.py_buffer(b"")  # an empty file cannot be mapped
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise"):  # (not on Windows)
        mapped.madvise(mmap.MADV_RANDOM)
    return pa.py_buffer(mapped)


class Snapshot:
    """A corpus snapshot opened for search: arrays by chunk position and by document position, memory-mapped,
    and each document's fields and text read when asked for."""

    def __init__(self, directory: Path):
        try:
            meta = json.loads((directory / META).read_text())
            self.generation: int = meta["generation"]
            self.chunk_ids = np.load(directory / CHUNK_IDS, mmap_mode="r")
            self.chunk_docs = np.load(directory / CHUNK_DOCS, mmap_mode="r")
            self.chunk_starts_mid_text = np.load(directory / CHUNK_STARTS_MID_TEXT, mmap_mode="r")
            self.chunk_spans = np.load(directory / CHUNK_SPANS, mmap_mode="r")
            self.document_chunks = np.load(directory / DOCUMENT_CHUNKS, mmap_mode="r")
            if (directory / TEXT_SPANS).exists():
                self.text_spans = np.load(directory / TEXT_SPANS, mmap_mode="r")
            else:  # an earlier layout: still searched, written anew by the next `pipeline index`
                offsets = np.load(directory / TEXT_OFFSETS, mmap_mode="r")
                self.text_spans = np.lib.stride_tricks.sliding_window_view(offsets, 2)
            self.chunk_texts = read_arrow(directory / CHUNK_TEXTS).column("text")  # of chunks that are not slices
            documents = pa.ipc.open_file(map_for_random_reads(directory / DOCUMENTS)).read_all()
            # read_at copies without the interpreter lock: a text read from disk holds up no other thread
            self._texts = pa.BufferReader(map_for_random_reads(directory / TEXTS))
            self._dictionary = (directory / TEXT_DICTIONARY).read_bytes()
        except (OSError, ValueError, KeyError, pa.ArrowException) as e:
            raise PipelineError(
                f"{directory}: the corpus snapshot cannot be read ({e}); run `pipeline index --rebuild`"
            ) from None
        self._doc_ids, self._titles, self._sources, self._metadata = (documents.column(c) for c in DOCUMENT_COLUMNS)
        self.directory = directory
        self.filters_path = directory / FILTERS
        self.n_documents = len(self.document_chunks)

    def doc_id(self, position: int) -> str:
        return self._doc_ids[position].as_py()

    def title(self, position: int) -> str:
        return self._titles[position].as_py() or ""

    def source(self, position: int) -> str:
        return self._sources[position].as_py() or ""

    def metadata(self, position: int) -> dict:
        """The document's metadata, parsed now: only the documents shown are."""
        text = self._metadata[position].as_py()
        return json.loads(text) if text else {}

    def text(self, position: int) -> str:
        """The document's whole text."""
        start, end = (int(x) for x in self.text_spans[position])
        stream = zlib.decompressobj(zlib.MAX_WBITS, self._dictionary)
        return stream.decompress(self._texts.read_at(end - start, start)).decode()

    def chunk_text(self, position: int) -> str:
        start, end = (int(x) for x in self.chunk_spans[position])
        if start == NOT_A_SLICE:
            return self.chunk_texts[end].as_py()
        return self.text(int(self.chunk_docs[position]))[start:end]

    def position_of(self, doc_id: str) -> int | None:
        """The position of the document `doc_id`, or None when there is none."""
        at = bisect.bisect_left(range(self.n_documents), doc_id, key=self.doc_id)
        return at if at < self.n_documents and self.doc_id(at) == doc_id else None
