"""What `pipeline embed` reads of its source, in two passes, neither of which holds the corpus.

`survey` reads every document once, hashes it and lists it in the store (a temporary table, common/store/
`source_read`: position, id, content hash; and the files skipped as unreadable in `source_skipped`, whose
stored documents `--prune` keeps), so that which documents are new, changed or gone, and whether an
id repeats, are questions DuckDB answers within its memory limit. `documents_at` reads the source again
and yields only the documents at the positions the store says to embed. Before, embed held every document,
a dict of their ids and dicts of their hashes: 2.3 GB at a million documents before the first one was
embedded, growing with the corpus. Reading the source twice costs ~9 s a million documents (of ~270 s
embedding them with the static embedder).

Positions number the documents in reading order, the ones a JSON-lines file gave an earlier run first
(embed/appended.py: they are not read again; the store's rows of them are listed instead).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from common.default_corpus import stdlib_documents
from common.readers import Document, JsonLinesRead, duplicate_id_error, list_files, located_documents
from common.store import Store
from embed import appended
from embed.ingest import content_hash

# Documents listed in the store per insert.
SURVEY_ROWS = 10_000


@dataclass
class Survey:
    """One survey of the source: its documents are listed in the store's `source_read`, at positions
    0 to `documents` - 1; those from the lines of JSON-lines files read by earlier runs come first
    (`read_before` of them, each file's as many as its start in `starts` says)."""

    paths: list[Path] | None  # None: the built-in corpus
    text_field: str | None
    starts: dict[str, JsonLinesRead]  # JSON-lines files resumed after the lines an earlier run read
    reads: dict[str, JsonLinesRead]  # how far each JSON-lines file was read, to its end
    files: dict[str, int]  # the number of each JSON-lines file in source_read
    read_before: int
    documents: int


def survey(store: Store, paths: list[Path] | None, text_field: str | None, resume: bool = True) -> Survey:
    """Read the source (None: the built-in corpus) into the store's `source_read`; with `resume`, each
    JSON-lines file from where an earlier run stopped, when it may (embed/appended.py). Raises PipelineError
    for bad input: a file that cannot be read, no document, an id given twice (file:line of both)."""
    starts = {}
    if resume and paths is not None:
        json_lines = [Path(os.path.abspath(f)) for f, _ in list_files(paths) if f.suffix.lower() == ".jsonl"]
        starts = appended.resume_points(store, json_lines, text_field)
    store.clear_source_read()
    files: dict[str, int] = {}
    position = 0
    for source in starts:
        position += store.add_read_before(position, source, files.setdefault(source, len(files)))
    read_before = position
    reads = {source: start.copy() for source, start in starts.items()}
    ids, hashes, numbers, skipped = [], [], [], []
    for doc, _ in _located(paths, text_field, reads, skipped):
        ids.append(doc.id)
        hashes.append(content_hash(doc))
        numbers.append(files.setdefault(doc.source, len(files)) if doc.source in reads else None)
        if len(ids) == SURVEY_ROWS:
            store.add_read(position, ids, hashes, numbers)
            position += len(ids)
            ids, hashes, numbers = [], [], []
    store.add_read(position, ids, hashes, numbers)
    store.add_skipped(skipped)
    result = Survey(paths, text_field, starts, reads, files, read_before, position + len(ids))
    repeated = store.first_repeated_id()
    if repeated is not None:
        doc_id, first, again = repeated
        where = _where(result, [first, again])
        raise duplicate_id_error(doc_id, where[again], where[first])
    return result


def documents_at(survey: Survey, positions: np.ndarray) -> Iterator[tuple[Document, str]]:
    """The documents at these positions (ascending, none read before) with their content hashes, read
    again from the source."""
    wanted = iter(positions)
    target = next(wanted, None)
    if target is None:
        return
    for position, (doc, _) in _reread(survey):
        if position == target:
            yield doc, content_hash(doc)
            target = next(wanted, None)
            if target is None:
                return


def _reread(survey: Survey) -> Iterator[tuple[int, tuple[Document, str]]]:
    """The source read again as the survey read it: (position, (document, where)) from read_before on."""
    starts = {source: start.copy() for source, start in survey.starts.items()}
    return enumerate(_located(survey.paths, survey.text_field, starts), start=survey.read_before)


def _located(
    paths: list[Path] | None,
    text_field: str | None,
    json_lines: dict[str, JsonLinesRead],
    skipped: list[str] | None = None,
) -> Iterator[tuple[Document, str]]:
    if paths is None:
        return ((doc, doc.source) for doc in stdlib_documents())
    return located_documents(paths, text_field, json_lines, skipped)


def _where(survey: Survey, positions: list[int]) -> dict[int, str]:
    """Where the documents at these positions are (as read_documents says it), reading the source again
    for those after the ones read before."""
    where, end = {}, 0
    for source, start in survey.starts.items():
        end += start.documents
        where.update({p: f"{source} (before line {start.lines + 1})" for p in positions if p < end and p not in where})
    left = {p for p in positions if p not in where}
    if left:
        for position, (_, location) in _reread(survey):
            if position in left:
                where[position] = location
                left.discard(position)
                if not left:
                    break
    return where
