"""Reading only what was appended to a JSON-lines file since the last `pipeline embed`.

A growing JSON-lines file (a ticket stream, new papers each week) is mostly lines an earlier embed read
already, and reading and hashing them was most of a small update (1.9 of 3 s when 1,000 documents were
appended to 100,000). So after each run embed records how far it read each JSON-lines file (bytes,
lines, the SHA-256 of those bytes) and a digest of the documents they gave (ids and content hashes). The
next run starts such a file where the last one stopped when both of these hold:

- the file still begins with exactly the bytes read then, read with the same --text-field;
- the store holds exactly those documents from that file, unchanged: nothing written through the
  document API or left unpruned since.

The documents before that point are then the stored ones, as reading them again would have found them;
otherwise the whole file is read, as before. So is every file when a new model or chunking embeds every
document again (embed/run.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from common.readers import Document, JsonLinesRead
from common.store import Store

BLOCK = 1 << 20


def documents_digest(pairs: list[tuple[str, str]]) -> str:
    """SHA-256 of (doc_id, content hash) pairs, whatever their order."""
    return hashlib.sha256("\n".join(f"{doc_id}\x1f{digest}" for doc_id, digest in sorted(pairs)).encode()).hexdigest()


def resume_points(
    store: Store, files: list[Path], text_field: str | None
) -> tuple[dict[str, JsonLinesRead], dict[str, str]]:
    """Where to start reading each of these JSON-lines files (absolute path -> JsonLinesRead, for
    read_documents) and the stored documents before those points (doc_id -> content hash)."""
    recorded = store.source_files()
    starts, before = {}, {}
    for file in files:
        source = str(file)
        if source not in recorded:
            continue
        field, size, lines, sha256, documents_sha256 = recorded[source]
        if field != text_field:
            continue
        read = JsonLinesRead(offset=size, lines=lines)
        if not _begins_with(file, size, sha256, read.digest):
            continue
        stored = store.documents_from(source)
        if documents_digest(stored) != documents_sha256:
            continue
        read.ids = frozenset(doc_id for doc_id, _ in stored)
        starts[source] = read
        before.update(stored)
    return starts, before


def _begins_with(file: Path, size: int, sha256: str, digest) -> bool:
    """Whether the file's first `size` bytes have this SHA-256 (`digest` is fed those bytes)."""
    try:
        with open(file, "rb") as f:
            left = size
            while left:
                block = f.read(min(BLOCK, left))
                if not block:
                    return False  # shorter than it was
                digest.update(block)
                left -= len(block)
    except OSError:
        return False
    return digest.hexdigest() == sha256


def record(
    store: Store,
    reads: dict[str, JsonLinesRead],
    text_field: str | None,
    documents: list[Document],
    digests: dict[str, str],
    before: dict[str, str],
) -> None:
    """After a run that stored `documents` (with these content hashes) and kept `before`: record how far
    each JSON-lines file was read. A file whose last line has no line ending yet is not recorded (the line
    may still be growing): the next run reads it whole."""
    pairs: dict[str, list[tuple[str, str]]] = {
        source: [(doc_id, before[doc_id]) for doc_id in read.ids] for source, read in reads.items()
    }
    for doc in documents:
        if doc.source in pairs:
            pairs[doc.source].append((doc.id, digests[doc.id]))
    store.record_source_files(
        list(reads),
        [
            (source, text_field, read.offset, read.lines, read.digest.hexdigest(), documents_digest(pairs[source]))
            for source, read in reads.items()
            if read.ends_with_newline
        ],
    )
