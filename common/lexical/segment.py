"""A segment: term counts of some chunks, by term, cut into blocks with score bounds, built in memory or
written to disk in bounded memory (analysed slices, then merged), and memory-mapped when loaded. The layout
is in the package docstring."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import scipy.sparse

from common.embedder import embedding_text
from common.lexical.analysis import Analyzer
from common.lexical.bm25 import average_length_of, norms_of

TOKENIZE_BATCH = 10_000  # chunks tokenized at once: bounds the memory the token strings take
# SLICE_TOKENS and MERGE_POSTINGS bound a segment build's peak memory
# (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
SLICE_TOKENS = 8_000_000  # tokens analysed in memory before they are written as a slice
MERGE_POSTINGS = 8_000_000  # postings merged from the slices at once
BLOCK = 128  # postings per block, the unit of score bounds a search skips by
MAX_TF = np.iinfo(np.uint16).max
SEGMENT_ARRAYS = (
    "chunk_ids",
    "lengths",
    "indptr",
    "rows",
    "tfs",
    "block_indptr",
    "block_max",
)
SEGMENT_INFO = "segment.json"  # its block size, average length and the terms it added to the vocabulary
SEGMENT_FILES = (*(f"{name}.npy" for name in SEGMENT_ARRAYS), SEGMENT_INFO)


class Analysed(NamedTuple):
    """A batch of rows analysed: chunk ids, lengths in tokens and every token's term id, row after row."""

    chunk_ids: np.ndarray  # int64
    lengths: np.ndarray  # int32
    term_ids: np.ndarray  # int32

    @classmethod
    def of(cls, rows: list[tuple[int, str, str]], vocabulary: dict[str, int], analyzer: Analyzer) -> "Analysed":
        """rows: (chunk_id, document title, chunk text). New terms are added to `vocabulary`."""
        words = analyzer.words([embedding_text(title or "", text or "") for _, title, text in rows])
        stems = analyzer.stems(words)
        # Each distinct word's term id (new terms numbered in order of first use), then every word's in one
        # pass in C: a Python step per word was half of building the index (18M words at 100k chunks).
        all_words = list(itertools.chain.from_iterable(words))
        term_of = {word: vocabulary.setdefault(stems[word], len(vocabulary)) for word in dict.fromkeys(all_words)}
        return cls(
            np.array([row[0] for row in rows], dtype=np.int64),
            np.array(list(map(len, words)), dtype=np.int32),
            np.fromiter(map(term_of.__getitem__, all_words), np.int32, len(all_words)),
        )

    @classmethod
    def joined(cls, parts: list["Analysed"]) -> "Analysed":
        if not parts:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32))
        return cls(*(np.concatenate(arrays) for arrays in zip(*parts)))

    def term_major(self, vocabulary_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, rows, tfs): each term's rows, ascending, with the term's count in each."""
        row_starts = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])
        matrix = scipy.sparse.csr_matrix(
            (np.ones(len(self.term_ids), np.int32), self.term_ids, row_starts),
            shape=(len(self.lengths), vocabulary_size),
        ).tocsc()  # a counting sort: linear in the tokens
        matrix.sum_duplicates()
        return (
            matrix.indptr.astype(np.int64),
            matrix.indices.astype(np.int32),
            np.minimum(matrix.data, MAX_TF).astype(np.uint16),
        )


@dataclass
class Segment:
    """Term counts of some chunks, by term, cut into blocks with score bounds (the layout is in the module
    docstring); term ids index the vocabulary of this segment and the ones before it."""

    chunk_ids: np.ndarray  # int64, one per row, ascending
    lengths: np.ndarray  # int32: tokens per row
    indptr: np.ndarray  # int64: term t's postings are [indptr[t], indptr[t + 1])
    rows: np.ndarray  # int32: each posting's row, ascending within a term
    tfs: np.ndarray  # uint16: each posting's term frequency
    block_indptr: np.ndarray  # int64: term t's blocks are [block_indptr[t], block_indptr[t + 1])
    block_max: np.ndarray  # float32: each block's highest tf / (tf + norm), norm at average_length
    block_size: int  # postings per block (BLOCK when it was written)
    average_length: float  # of this segment's rows
    new_terms: list[str]  # the terms this segment added to the vocabulary, in id order
    source: Path | None = None  # the directory it was loaded from (a new index version links its files)

    @classmethod
    def build(cls, rows: list[tuple[int, str, str]], vocabulary: dict[str, int], analyzer: Analyzer) -> "Segment":
        """A segment in memory (for a few hundred thousand chunks at most). rows: (chunk_id, document title,
        chunk text), in chunk_id order. New terms are added to `vocabulary`."""
        known = len(vocabulary)
        analysed = Analysed.joined(
            [
                Analysed.of(rows[i : i + TOKENIZE_BATCH], vocabulary, analyzer)
                for i in range(0, len(rows), TOKENIZE_BATCH)
            ]
        )
        indptr, term_rows, tfs = analysed.term_major(len(vocabulary))
        average_length = average_length_of(analysed.lengths)
        block_max = block_max_of(indptr, term_rows, tfs, norms_of(analysed.lengths, average_length))
        return cls(
            analysed.chunk_ids,
            analysed.lengths,
            indptr,
            term_rows,
            tfs,
            block_indptr_of(indptr),
            block_max,
            BLOCK,
            average_length,
            list(itertools.islice(vocabulary, known, None)),
        )

    @classmethod
    def write(
        cls,
        directory: Path,
        batches: Iterable[list[tuple[int, str, str]]],
        vocabulary: dict[str, int],
        analyzer: Analyzer,
    ) -> "Segment":
        """Build a segment of the rows in `batches` (lists of (chunk_id, document title, chunk text), in
        chunk_id order) into `directory` (new), in bounded memory: analysed slices written as they fill,
        then merged (module docstring). New terms are added to `vocabulary`. Returns it loaded."""
        known = len(vocabulary)
        slices_dir = directory / ".slices"
        slices_dir.mkdir(parents=True)
        slices, pending = [], []

        def write_slice() -> None:
            analysed = Analysed.joined(pending)
            indptr, term_rows, tfs = analysed.term_major(len(vocabulary))
            slices.append(slices_dir / f"slice-{len(slices)}")
            slices[-1].mkdir()
            arrays = {"chunk_ids": analysed.chunk_ids, "lengths": analysed.lengths, "indptr": indptr}
            for name, array in {**arrays, "rows": term_rows, "tfs": tfs}.items():
                np.save(slices[-1] / f"{name}.npy", array)
            pending.clear()

        for batch in batches:
            for start in range(0, len(batch), TOKENIZE_BATCH):
                pending.append(Analysed.of(batch[start : start + TOKENIZE_BATCH], vocabulary, analyzer))
                if sum(len(part.term_ids) for part in pending) >= SLICE_TOKENS:
                    write_slice()
        if pending or not slices:
            write_slice()
        average_length = merge_slices(slices, directory, len(vocabulary))
        shutil.rmtree(slices_dir)
        new_terms = list(itertools.islice(vocabulary, known, None))
        (directory / SEGMENT_INFO).write_text(
            json.dumps(
                {"block_size": BLOCK, "average_length": average_length, "new_terms": new_terms}, ensure_ascii=False
            )
        )
        return cls.load(directory)

    def link(self, directory: Path) -> None:
        """The segment's files in a new index version: hard links to those it was loaded from (unchanged)."""
        directory.mkdir()
        for name in SEGMENT_FILES:
            try:
                os.link(self.source / name, directory / name)
            except OSError:
                shutil.copy2(self.source / name, directory / name)

    @staticmethod
    def exists(directory: Path) -> bool:
        """Whether `directory` holds a segment of this layout (an older version's has no SEGMENT_INFO)."""
        return (directory / SEGMENT_INFO).is_file()

    @classmethod
    def load(cls, directory: Path) -> "Segment":
        info = json.loads((directory / SEGMENT_INFO).read_text())
        # Plain arrays over the mappings: indexing an np.memmap costs microseconds of Python per call.
        arrays = {name: np.asarray(np.load(directory / f"{name}.npy", mmap_mode="r")) for name in SEGMENT_ARRAYS}
        return cls(**arrays, **info, source=directory)

    def document_frequencies(self, live: np.ndarray) -> np.ndarray:
        """Each term's number of live rows (`live`: a bool per row): a pass over the postings when some row
        is not live, a range at a time."""
        frequencies = np.diff(self.indptr)
        if live.all():
            return frequencies
        for start in range(0, len(self.rows), MERGE_POSTINGS):
            stop = min(start + MERGE_POSTINGS, len(self.rows))
            rows = read_range(self.source / "rows.npy", start, stop) if self.source else self.rows[start:stop]
            deleted = start + np.flatnonzero(~live[rows])
            frequencies -= np.bincount(
                np.searchsorted(self.indptr, deleted, side="right") - 1, minlength=len(frequencies)
            )
        return frequencies


def merge_slices(slices: list[Path], directory: Path, vocabulary_size: int) -> float:
    """Write the slices' postings (each slice's rows after the previous one's) as one segment's arrays into
    `directory`, with their blocks; returns the segment's average length."""
    slice_lengths = [np.load(part / "lengths.npy") for part in slices]
    row_offsets = np.cumsum([0] + [len(part_lengths) for part_lengths in slice_lengths])
    lengths = np.concatenate(slice_lengths)
    np.save(directory / "chunk_ids.npy", np.concatenate([np.load(part / "chunk_ids.npy") for part in slices]))
    np.save(directory / "lengths.npy", lengths)
    average_length = average_length_of(lengths)
    norms = norms_of(lengths, average_length)
    slice_terms, frequencies = [], np.zeros(vocabulary_size, np.int64)
    for part in slices:
        slice_frequencies = np.diff(np.load(part / "indptr.npy"))
        frequencies[: len(slice_frequencies)] += slice_frequencies
        slice_terms.append(len(slice_frequencies))
    indptr = np.concatenate([[0], np.cumsum(frequencies)])
    block_indptr = block_indptr_of(indptr)
    np.save(directory / "indptr.npy", indptr)
    np.save(directory / "block_indptr.npy", block_indptr)
    postings, blocks = int(indptr[-1]), int(block_indptr[-1])
    with (
        ArrayFile(directory / "rows.npy", np.int32, postings) as rows_file,
        ArrayFile(directory / "tfs.npy", np.uint16, postings) as tfs_file,
        ArrayFile(directory / "block_max.npy", np.float32, blocks) as block_max_file,
    ):
        # Ranges of terms of about MERGE_POSTINGS postings (a term with more is a range of its own).
        cuts = np.searchsorted(indptr, np.arange(MERGE_POSTINGS, postings, MERGE_POSTINGS), side="right") - 1
        cuts = np.unique(np.concatenate([[0], cuts, [vocabulary_size]]))
        for first, end in zip(cuts[:-1], cuts[1:]):
            range_indptr = indptr[first : end + 1] - indptr[first]
            rows, tfs = np.empty(range_indptr[-1], np.int32), np.empty(range_indptr[-1], np.uint16)
            filled = range_indptr[:-1].copy()  # where each term's next slice run goes
            for part, terms, row_offset in zip(slices, slice_terms, row_offsets):
                slice_indptr = read_range(part / "indptr.npy", min(first, terms), min(end, terms) + 1)
                runs = np.diff(slice_indptr)
                if not runs.sum():
                    continue
                destination = np.repeat(filled[: len(runs)] - (slice_indptr[:-1] - slice_indptr[0]), runs)
                destination += np.arange(len(destination))
                rows[destination] = read_range(part / "rows.npy", slice_indptr[0], slice_indptr[-1]) + row_offset
                tfs[destination] = read_range(part / "tfs.npy", slice_indptr[0], slice_indptr[-1])
                filled[: len(runs)] += runs
            rows_file.append(rows)
            tfs_file.append(tfs)
            block_max_file.append(block_max_of(range_indptr, rows, tfs, norms))
    return average_length


def block_indptr_of(indptr: np.ndarray) -> np.ndarray:
    """Where each term's blocks start (BLOCK postings each, the last one shorter)."""
    return np.concatenate([[0], np.cumsum(-(-np.diff(indptr) // BLOCK))])


def block_max_of(indptr: np.ndarray, rows: np.ndarray, tfs: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """The highest tf / (tf + norm) of each block of these terms' postings (indptr from 0), in float32."""
    block_indptr = block_indptr_of(indptr)
    first_postings = np.repeat(indptr[:-1] - block_indptr[:-1] * BLOCK, np.diff(block_indptr))
    first_postings += BLOCK * np.arange(block_indptr[-1])
    if not len(first_postings):
        return np.zeros(0, np.float32)
    tf = tfs.astype(np.float64)
    return np.maximum.reduceat(tf / (tf + norms[rows]), first_postings).astype(np.float32)


def read_range(path: Path, start: int, stop: int) -> np.ndarray:
    """A range of a .npy file's array, copied: through a mapping let go at once, so what a pass over a large
    file reads does not stay in this process's resident memory."""
    return np.array(np.load(path, mmap_mode="r")[start:stop])


class ArrayFile:
    """A one-dimensional .npy file of known length, written in pieces with plain writes (a writable mapping
    would keep every written page in this process's resident memory)."""

    def __init__(self, path: Path, dtype, length: int):
        self.dtype = np.dtype(dtype)
        self.file = open(path, "wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (length,)}
        np.lib.format.write_array_header_1_0(self.file, header)

    def append(self, array: np.ndarray) -> None:
        array.astype(self.dtype, copy=False).tofile(self.file)

    def __enter__(self) -> "ArrayFile":
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()
