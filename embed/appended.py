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
from typing import TYPE_CHECKING, Iterable

from common.readers import JsonLinesRead
from common.store import Store

if TYPE_CHECKING:
    from embed.survey import Survey

BLOCK = 1 << 20


def documents_digest(line_batches: Iterable[list[str]]) -> tuple[str, int]:
    """SHA-256 of documents' `doc_id<US>content_hash` lines (Store.stored_hash_lines, read_hash_lines: by
    doc_id) joined by newlines, and how many there are: hashed a batch at a time, never all held (a file's
    pairs and their joined text grew with the file)."""
    digest, count = hashlib.sha256(), 0
    for lines in line_batches:
        digest.update((("\n" if count else "") + "\n".join(lines)).encode())
        count += len(lines)
    return digest.hexdigest(), count


def resume_points(store: Store, files: list[Path], text_field: str | None) -> dict[str, JsonLinesRead]:
    """Where to start reading each of these JSON-lines files (absolute path -> JsonLinesRead, for
    located_documents, counting the stored documents before that point)."""
    recorded = store.source_files()
    starts = {}
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
        digest, read.documents = documents_digest(store.stored_hash_lines(source))
        if digest != documents_sha256:
            continue
        starts[source] = read
    return starts


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


def record(store: Store, survey: Survey) -> None:
    """After a run that stored what `survey` read: record how far each JSON-lines file was read, and the
    digest of the documents it gave (all of them, read before or not). A file whose last line has no line
    ending yet is not recorded (the line may still be growing): the next run reads it whole."""
    store.record_source_files(
        list(survey.reads),
        [
            (
                source,
                survey.text_field,
                read.offset,
                read.lines,
                read.digest.hexdigest(),
                # a file that gave no document has no number and no lines
                documents_digest(store.read_hash_lines(survey.files.get(source)))[0],
            )
            for source, read in survey.reads.items()
            if read.ends_with_newline
        ],
    )
