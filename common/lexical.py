"""The lexical (BM25) index over the stored chunks: analysed by the collection's language, written to disk
as it is built, memory-mapped when loaded, and searched with dynamic pruning (exact top n).

Shared by the stages that rank text lexically: `pipeline index` builds it and writes it into the
workspace (index/build.py names and swaps its versioned directory), search and the default-mode
measurement query it, and `pipeline tune` mines hard negatives with it before any index exists. It is
in common/ because three stages use it and no stage imports another; what only `pipeline index` does
(where the files go, when older versions are removed) is in index/build.py.

Analysis. Each chunk is indexed as its document's title followed by the chunk text (what the dense side
embeds too), analysed by the collection's Analyzer: lower-cased, split into words (bm25s's word pattern)
and runs of Chinese, Japanese or Korean characters into overlapping bigrams (as Lucene's CJK analyzer
does), the language's stop words removed and its Snowball stemmer applied. The language is detected by
`pipeline index` on a sample of the chunks (common/language.py) or given by the user (`--language`), and
written with the index, so queries are analysed exactly as the chunks were. For English these are bm25s's
tokens (its word pattern and stop words), made without its per-call set-up, which was most of a query's
tokenizing (50 us of 56).

What is stored. Not BM25 scores, which depend on the whole collection (the number of chunks, each term's
document frequency, the average length), so that one chunk's arrival or departure would change them all:
each chunk's term counts and length, in segments. The base is written by a full build, and a delta holds
the chunks added since (index/update.py); base chunks the store no longer holds are skipped (tombstones).
BM25 (Lucene's variant, as bm25s: k1 = 1.5, b = 0.75) is computed at query time from the live chunks'
statistics, so an updated index scores every chunk exactly as one built from scratch over the same chunks.

Layout. An index directory holds segment-0/ (the base), segment-1/ (a delta, after an update), the live
chunk ids (chunk_ids.npy: position -> chunk id), the live chunks' document frequency of every term
(document_frequencies.npy: written with the index, since finding which terms the deleted chunks held
takes a pass over the postings) and the analyzer (tokenizer.json). A segment holds, for its rows (chunks,
in chunk id order): chunk_ids, lengths (tokens), and by term, in the ids of the vocabulary that this
segment and the ones before it grew (segment.json lists the terms it added): its postings
rows[indptr[t]:indptr[t + 1]] (int32 rows, ascending) with their term frequencies in tfs (uint16, a
count above 65,535 counted as that), in blocks of BLOCK postings (block_indptr[t] onwards), each with its
highest tf / (tf + norm) at the segment's own average length (block_max). All arrays are memory-mapped
on loading: what loading computes is per chunk (norms, live positions) and per term (idf), never per
posting. An index directory of an older layout (without document_frequencies.npy and segment.json) is
refused with "run `pipeline index`", which builds this one.

Building in bounded memory. Rows arrive in batches (Store.iter_chunk_rows); each is analysed, and every
SLICE_TOKENS tokens the analysed rows become a slice (term-major, as a segment) written to disk. The
slices are then merged into one segment a range of terms at a time (about MERGE_POSTINGS postings): a
term's postings are its slices' runs one after the other, already in row order. What the build holds is
the vocabulary, a few arrays per chunk, one slice and one range of postings, whatever the collection's size.

Searching: the exact top n without scoring every posting (MaxScore, document at a time, compiled with
numba: _max_score). A query term's contribution to a chunk is idf * tf / (tf + norm) (times the number of
query words that are the term). A block's maximum bounds it for every chunk of the block: norms under the
live statistics are at least those at the segment's own average length times r = min(1, own average /
live average), so tf / (tf + norm) <= u / (u + r (1 - u)) for the block's maximum u; a term's bound is its
best block's. The terms are ordered by bound; the rows of the postings are visited in order, and once n
rows are found, the first terms whose bounds sum below the n-th best score ("non-essential": the most
common terms, which hold most postings) are no longer walked: they are looked up (galloping, then binary
search) only for the rows the others hold, and only while a row can still reach that score. A row's
score is its query words' float32 contributions added into float64 in query order, as the exhaustive sum
scores it; rows are ranked by score, ties by position. On the 2M-chunk scale workspace (synthetic
abstracts; 1,109 SciFact queries, n = 100) it took 8.1 / 24.9 / 54.5 ms of CPU at p50 / p90 / p99, and the
numpy version it replaced (block-wise candidates, then lookups for them) 15.1 / 34.9 / 57.9, with the
same rankings. A first threshold from the best blocks and skipping by block bounds were tried and cost
more than they saved there. A filter (weights of 1.0 for allowed positions, 0
otherwise) lets only allowed chunks in, so it prunes less. Each segment is searched with the threshold
the ones before it reached, and their results merged. Bounds and thresholds allow for float rounding
(SLACK).

A walk budget bounds the cost where exact BM25's grows with the collection (a query with several common
words walks millions of postings at 10M chunks): the terms of lowest bound are non-essential from the start,
as many as leave at most `walk_budget` postings to walk (the term of highest bound is always walked). A
chunk holding only those terms is then not found; every chunk found is scored exactly. Hybrid search uses
it (search/engine.py), where BM25 is one of two retrievers; lexical search stays exact.
"""

from __future__ import annotations

import functools
import itertools
import json
import multiprocessing
import os
import re
import shutil
import sys
import threading
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

import numba
import numpy as np
import scipy.sparse
import Stemmer

from common.console import warn
from common.embedder import embedding_text
from common.errors import PipelineError
from common.language import LanguageMix, cjk_tokens, detect_languages, has_cjk
from common.stopwords import STOPWORDS

K1, B = 1.5, 0.75
TOKENIZE_BATCH = 10_000  # chunks tokenized at once: bounds the memory the token strings take
SLICE_TOKENS = 8_000_000  # tokens analysed in memory before they are written as a slice (~250 MB at its peak)
MERGE_POSTINGS = 8_000_000  # postings merged from the slices at once (~300 MB at its peak)
BLOCK = 128  # postings per block, the unit of score bounds a search skips by
SLACK = 1e-6  # relative: bounds and thresholds allow for float32 scores and float64 sums in another order
MAX_TF = np.iinfo(np.uint16).max
LANGUAGE_SAMPLE_CHUNKS = 20_000  # chunks the collection's language is detected on (a seeded sample)
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
ANALYZER_FILE = "tokenizer.json"
DOCUMENT_FREQUENCIES_FILE = "document_frequencies.npy"

# Snowball stemmers (PyStemmer) by ISO 639-1 code; a language without one is not stemmed.
SNOWBALL = {
    "ar": "arabic",
    "hy": "armenian",
    "eu": "basque",
    "ca": "catalan",
    "cs": "czech",
    "da": "danish",
    "nl": "dutch",
    "en": "english",
    "eo": "esperanto",
    "et": "estonian",
    "fi": "finnish",
    "fr": "french",
    "de": "german",
    "el": "greek",
    "hi": "hindi",
    "hu": "hungarian",
    "id": "indonesian",
    "ga": "irish",
    "it": "italian",
    "lt": "lithuanian",
    "ne": "nepali",
    "no": "norwegian",
    "nb": "norwegian",
    "nn": "norwegian",
    "fa": "persian",
    "pl": "polish",
    "pt": "portuguese",
    "ro": "romanian",
    "ru": "russian",
    "sr": "serbian",
    "es": "spanish",
    "sv": "swedish",
    "ta": "tamil",
    "tr": "turkish",
    "yi": "yiddish",
}
LANGUAGE_CHOICES = "auto (detected), none (no stop words or stemming), or an ISO 639-1 code (en, de, ru, ja, ...)"

# bm25s's (and scikit-learn's) token pattern, r"\b\w\w+\b", as it matches: each run of two or more word
# characters (20% faster without the boundary tests)
_WORDS = re.compile(r"\w{2,}").findall


@functools.cache
def _stemmer(name: str) -> Stemmer.Stemmer:
    return Stemmer.Stemmer(name)


@dataclass(frozen=True)
class Analyzer:
    """How text becomes BM25 terms, the same for chunks and queries: lower-cased words of two or more
    characters (runs of CJK characters as bigrams, a text with CJK or full-width characters NFKC-normalised
    first), without the language's stop words, stemmed by its Snowball stemmer. A language without a
    stemmer or list goes without. An index written before languages were analysed keeps CJK runs whole."""

    language: str = "en"  # ISO 639-1, or "none"
    cjk_bigrams: bool = True

    @property
    def stemmer(self) -> str | None:
        name = SNOWBALL.get(self.language)
        return name if name in Stemmer.algorithms() else None  # an older PyStemmer lacks some

    @functools.cached_property
    def stopwords(self) -> frozenset[str]:
        return frozenset(STOPWORDS.get(self.language, ()))

    def describe(self) -> str:
        return (
            f"{self.language} ({f'{self.stemmer} stemmer' if self.stemmer else 'no stemmer'}, "
            f"{'stop words' if self.stopwords else 'no stop words'}, "
            f"CJK {'as bigrams' if self.cjk_bigrams else 'runs whole'})"
        )

    def to_json(self) -> dict:
        return {
            "language": self.language,
            "stemmer": self.stemmer,
            "stopwords": self.language if self.stopwords else None,
            "cjk": "bigrams" if self.cjk_bigrams else None,
            "k1": K1,
            "b": B,
        }

    @classmethod
    def load(cls, directory: Path) -> "Analyzer":
        """The analyzer an index directory was written with: one written before languages were analysed
        ({"stopwords": "en", "stemmer": "english"}) is English with CJK runs kept whole, as it was built."""
        path = directory / ANALYZER_FILE
        written = json.loads(path.read_text()) if path.exists() else {}
        return cls(written.get("language", "en"), cjk_bigrams=written.get("cjk") == "bigrams")

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        words = self.words(texts)
        stem = self.stems(words).__getitem__
        return [list(map(stem, text_words)) for text_words in words]

    def words(self, texts: list[str]) -> list[list[str]]:
        """Each text's lower-cased words (CJK bigrams), stop words left out (not yet stemmed)."""
        tokens = (
            cjk_tokens(unicodedata.normalize("NFKC", lowered))
            if self.cjk_bigrams and has_cjk(lowered)
            else _WORDS(lowered)
            for lowered in map(str.lower, texts)
        )
        if not self.stopwords:
            return [list(text_tokens) for text_tokens in tokens]
        return [list(itertools.filterfalse(self.stopwords.__contains__, text_tokens)) for text_tokens in tokens]

    def stems(self, words: list[list[str]]) -> dict[str, str]:
        """Word -> stem for every distinct word of the lists (each stemmed once)."""
        distinct = list(set().union(*words))
        return dict(zip(distinct, self.stem_words(distinct)))

    def stem_words(self, words: list[str]) -> list[str]:
        """Lower-cased words stemmed as the index stems them."""
        return _stemmer(self.stemmer).stemWords(words) if self.stemmer else list(words)

    def query_terms(self, query: str) -> list[str]:
        """The terms BM25 matches for a query."""
        return self.tokenize([query])[0]


def choose_analyzer(texts: list[str], language: str = "auto") -> tuple[Analyzer, LanguageMix | None]:
    """The collection's analyzer: that of the language detected in its texts (`auto`), or of the one given
    (then no mix is returned)."""
    if language == "auto":
        mix = detect_languages(texts)
        return Analyzer(mix.language), mix
    check_language(language)
    return Analyzer(language), None


def check_language(language: str) -> None:
    if language not in ("auto", "none") and not re.fullmatch(r"[a-z]{2}", language):
        raise PipelineError(f"--language: '{language}' is not {LANGUAGE_CHOICES}")
    if language not in ("auto", "none") and language not in SNOWBALL and language not in STOPWORDS:
        warn(f"--language {language}: no stemmer or stop words for it; words are only lower-cased (CJK as bigrams)")


class _Analysed(NamedTuple):
    """A batch of rows analysed: chunk ids, lengths in tokens and every token's term id, row after row."""

    chunk_ids: np.ndarray  # int64
    lengths: np.ndarray  # int32
    term_ids: np.ndarray  # int32

    @classmethod
    def of(cls, rows: list[tuple[int, str, str]], vocabulary: dict[str, int], analyzer: Analyzer) -> "_Analysed":
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
    def joined(cls, parts: list["_Analysed"]) -> "_Analysed":
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
        analysed = _Analysed.joined(
            [
                _Analysed.of(rows[i : i + TOKENIZE_BATCH], vocabulary, analyzer)
                for i in range(0, len(rows), TOKENIZE_BATCH)
            ]
        )
        indptr, term_rows, tfs = analysed.term_major(len(vocabulary))
        average_length = _average_length(analysed.lengths)
        block_max = _block_max(indptr, term_rows, tfs, _norms(analysed.lengths, average_length))
        return cls(
            analysed.chunk_ids,
            analysed.lengths,
            indptr,
            term_rows,
            tfs,
            _block_indptr(indptr),
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
            analysed = _Analysed.joined(pending)
            indptr, term_rows, tfs = analysed.term_major(len(vocabulary))
            slices.append(slices_dir / f"slice-{len(slices)}")
            slices[-1].mkdir()
            arrays = {"chunk_ids": analysed.chunk_ids, "lengths": analysed.lengths, "indptr": indptr}
            for name, array in {**arrays, "rows": term_rows, "tfs": tfs}.items():
                np.save(slices[-1] / f"{name}.npy", array)
            pending.clear()

        for batch in batches:
            for start in range(0, len(batch), TOKENIZE_BATCH):
                pending.append(_Analysed.of(batch[start : start + TOKENIZE_BATCH], vocabulary, analyzer))
                if sum(len(part.term_ids) for part in pending) >= SLICE_TOKENS:
                    write_slice()
        if pending or not slices:
            write_slice()
        average_length = _merge(slices, directory, len(vocabulary))
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
            rows = _read(self.source / "rows.npy", start, stop) if self.source else self.rows[start:stop]
            deleted = start + np.flatnonzero(~live[rows])
            frequencies -= np.bincount(
                np.searchsorted(self.indptr, deleted, side="right") - 1, minlength=len(frequencies)
            )
        return frequencies


def _merge(slices: list[Path], directory: Path, vocabulary_size: int) -> float:
    """Write the slices' postings (each slice's rows after the previous one's) as one segment's arrays into
    `directory`, with their blocks; returns the segment's average length."""
    slice_lengths = [np.load(part / "lengths.npy") for part in slices]
    row_offsets = np.cumsum([0] + [len(part_lengths) for part_lengths in slice_lengths])
    lengths = np.concatenate(slice_lengths)
    np.save(directory / "chunk_ids.npy", np.concatenate([np.load(part / "chunk_ids.npy") for part in slices]))
    np.save(directory / "lengths.npy", lengths)
    average_length = _average_length(lengths)
    norms = _norms(lengths, average_length)
    slice_terms, frequencies = [], np.zeros(vocabulary_size, np.int64)
    for part in slices:
        slice_frequencies = np.diff(np.load(part / "indptr.npy"))
        frequencies[: len(slice_frequencies)] += slice_frequencies
        slice_terms.append(len(slice_frequencies))
    indptr = np.concatenate([[0], np.cumsum(frequencies)])
    block_indptr = _block_indptr(indptr)
    np.save(directory / "indptr.npy", indptr)
    np.save(directory / "block_indptr.npy", block_indptr)
    postings, blocks = int(indptr[-1]), int(block_indptr[-1])
    with (
        _ArrayFile(directory / "rows.npy", np.int32, postings) as rows_file,
        _ArrayFile(directory / "tfs.npy", np.uint16, postings) as tfs_file,
        _ArrayFile(directory / "block_max.npy", np.float32, blocks) as block_max_file,
    ):
        # Ranges of terms of about MERGE_POSTINGS postings (a term with more is a range of its own).
        cuts = np.searchsorted(indptr, np.arange(MERGE_POSTINGS, postings, MERGE_POSTINGS), side="right") - 1
        cuts = np.unique(np.concatenate([[0], cuts, [vocabulary_size]]))
        for first, end in zip(cuts[:-1], cuts[1:]):
            range_indptr = indptr[first : end + 1] - indptr[first]
            rows, tfs = np.empty(range_indptr[-1], np.int32), np.empty(range_indptr[-1], np.uint16)
            filled = range_indptr[:-1].copy()  # where each term's next slice run goes
            for part, terms, row_offset in zip(slices, slice_terms, row_offsets):
                slice_indptr = _read(part / "indptr.npy", min(first, terms), min(end, terms) + 1)
                runs = np.diff(slice_indptr)
                if not runs.sum():
                    continue
                destination = np.repeat(filled[: len(runs)] - (slice_indptr[:-1] - slice_indptr[0]), runs)
                destination += np.arange(len(destination))
                rows[destination] = _read(part / "rows.npy", slice_indptr[0], slice_indptr[-1]) + row_offset
                tfs[destination] = _read(part / "tfs.npy", slice_indptr[0], slice_indptr[-1])
                filled[: len(runs)] += runs
            rows_file.append(rows)
            tfs_file.append(tfs)
            block_max_file.append(_block_max(range_indptr, rows, tfs, norms))
    return average_length


def _block_indptr(indptr: np.ndarray) -> np.ndarray:
    """Where each term's blocks start (BLOCK postings each, the last one shorter)."""
    return np.concatenate([[0], np.cumsum(-(-np.diff(indptr) // BLOCK))])


def _block_max(indptr: np.ndarray, rows: np.ndarray, tfs: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """The highest tf / (tf + norm) of each block of these terms' postings (indptr from 0), in float32."""
    block_indptr = _block_indptr(indptr)
    first_postings = np.repeat(indptr[:-1] - block_indptr[:-1] * BLOCK, np.diff(block_indptr))
    first_postings += BLOCK * np.arange(block_indptr[-1])
    if not len(first_postings):
        return np.zeros(0, np.float32)
    tf = tfs.astype(np.float64)
    return np.maximum.reduceat(tf / (tf + norms[rows]), first_postings).astype(np.float32)


def _idf(chunks: int, document_frequencies: np.ndarray) -> np.ndarray:
    """BM25's idf of terms held by these many of the collection's chunks, in float32."""
    return np.log(1 + (chunks - document_frequencies + 0.5) / (document_frequencies + 0.5)).astype(np.float32)


def _mean_length(total_length: int, chunks: int) -> float:
    """A collection's average chunk length, as BM25's norms use it (at least 1)."""
    return max(total_length / chunks, 1.0) if chunks else 1.0


def _average_length(lengths: np.ndarray) -> float:
    return _mean_length(int(lengths.sum(dtype=np.int64)), len(lengths))


def _norms(lengths: np.ndarray, average_length: float) -> np.ndarray:
    """BM25's length normalisation of each chunk, k1 * (1 - b + b * length / average length), in float32."""
    return (K1 * ((1 - B) + B * lengths / average_length)).astype(np.float32)


def _read(path: Path, start: int, stop: int) -> np.ndarray:
    """A range of a .npy file's array, copied: through a mapping let go at once, so what a pass over a large
    file reads does not stay in this process's resident memory."""
    return np.array(np.load(path, mmap_mode="r")[start:stop])


class _ArrayFile:
    """A one-dimensional .npy file of known length, written in pieces with plain writes (a writable mapping
    would keep every written page in this process's resident memory)."""

    def __init__(self, path: Path, dtype, length: int):
        self.dtype = np.dtype(dtype)
        self.file = open(path, "wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (length,)}
        np.lib.format.write_array_header_1_0(self.file, header)

    def append(self, array: np.ndarray) -> None:
        array.astype(self.dtype, copy=False).tofile(self.file)

    def __enter__(self) -> "_ArrayFile":
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


class LexicalIndex:
    """BM25 over the live chunks (`chunk_ids`, sorted) held by one or more segments."""

    def __init__(
        self,
        segments: list[Segment],
        chunk_ids: np.ndarray,
        analyzer: Analyzer,
        document_frequencies: np.ndarray | None = None,
    ):
        """document_frequencies: the live chunks' (as written with the index); computed when not given."""
        self.segments = segments
        self.analyzer = analyzer
        self.chunk_ids = chunk_ids  # position -> chunk id, ascending: the order of the store's chunks
        self.vocabulary = {
            term: i for i, term in enumerate(itertools.chain.from_iterable(s.new_terms for s in segments))
        }
        n = len(chunk_ids)
        positions = [self._positions(segment.chunk_ids) for segment in segments]
        if sum(int(np.count_nonzero(p >= 0)) for p in positions) != n:
            raise PipelineError("the BM25 index does not hold the stored chunks: run `pipeline index`")
        self.total_length = sum(int(s.lengths[p >= 0].sum(dtype=np.int64)) for s, p in zip(segments, positions))
        if document_frequencies is None:
            document_frequencies = np.zeros(len(self.vocabulary), np.int64)
            for segment, segment_positions in zip(segments, positions):
                frequencies = segment.document_frequencies(segment_positions >= 0)
                document_frequencies[: len(frequencies)] += frequencies
        self.document_frequencies = document_frequencies
        self.idf = _idf(n, document_frequencies)
        self._segment_positions = positions
        self.average_length = _mean_length(self.total_length, n)
        self.live_segments = self._live_segments(self.average_length)
        self._lock = threading.Lock()
        self._at_collection_average: tuple[float, list[LiveSegment]] | None = None

    def _live_segments(self, average_length: float) -> list["LiveSegment"]:
        return [
            LiveSegment(segment, segment_positions, _norms(segment.lengths, average_length), average_length)
            for segment, segment_positions in zip(self.segments, self._segment_positions)
        ]

    def _segments_at(self, average_length: float) -> list["LiveSegment"]:
        """The live segments with norms at a collection's average length (a sharded search's, which changes
        only when some shard's chunks do): computed once per average, a pass over the lengths."""
        if average_length == self.average_length:
            return self.live_segments
        with self._lock:
            if self._at_collection_average is None or self._at_collection_average[0] != average_length:
                self._at_collection_average = (average_length, self._live_segments(average_length))
            return self._at_collection_average[1]

    def _positions(self, segment_chunk_ids: np.ndarray) -> np.ndarray:
        """Each segment row's position among the live chunks, or -1 when it was deleted."""
        n = len(self.chunk_ids)
        if not n:
            return np.full(len(segment_chunk_ids), -1, np.int32)
        at = np.minimum(np.searchsorted(self.chunk_ids, segment_chunk_ids), n - 1)
        return np.where(self.chunk_ids[at] == segment_chunk_ids, at, -1).astype(np.int32)

    @classmethod
    def build(cls, rows: list[tuple[int, str, str]], analyzer: Analyzer) -> "LexicalIndex":
        """An index in memory (a few hundred thousand chunks at most). rows: (chunk_id, document title,
        chunk text), in chunk_id order."""
        segment = Segment.build(rows, {}, analyzer)
        return cls([segment], segment.chunk_ids, analyzer)

    @classmethod
    def with_delta(
        cls, base: Segment, analyzer: Analyzer, delta_rows: list[tuple[int, str, str]], chunk_ids: np.ndarray
    ) -> "LexicalIndex":
        """The index over `chunk_ids` (the live chunks, sorted): those of `base` that are live, and
        `delta_rows` (the chunks added since the base; chunk_id order), a segment in memory analysed by
        `analyzer` (the base's)."""
        vocabulary = {term: i for i, term in enumerate(base.new_terms)}
        return cls([base, Segment.build(delta_rows, vocabulary, analyzer)], chunk_ids, analyzer)

    @classmethod
    def write_built(cls, directory: Path, batches: Iterable[list[tuple[int, str, str]]], analyzer: Analyzer) -> None:
        """Build the index of the rows in `batches` (lists of (chunk_id, document title, chunk text), in
        chunk_id order) into `directory` (existing, empty), in bounded memory."""
        segment = Segment.write(directory / "segment-0", batches, {}, analyzer)
        cls([segment], segment.chunk_ids, analyzer)._write_statistics(directory)

    @classmethod
    def write_updated(
        cls, directory: Path, base: Segment, delta_batches: Iterable[list[tuple[int, str, str]]], chunk_ids: np.ndarray
    ) -> None:
        """Write the index over `chunk_ids` (the live chunks, sorted) into `directory` (existing, empty): the
        base's files linked, its deleted chunks skipped, and the rows of `delta_batches` (the chunks added
        since the base, as write_built takes them) a new segment analysed as the base was."""
        base.link(directory / "segment-0")
        vocabulary = {term: i for i, term in enumerate(base.new_terms)}
        analyzer = Analyzer.load(base.source.parent)  # the index directory the base segment is in
        delta = Segment.write(directory / "segment-1", delta_batches, vocabulary, analyzer)
        cls([base, delta], chunk_ids, analyzer)._write_statistics(directory)

    def _write_statistics(self, directory: Path) -> None:
        """What the index adds to its segments: the analyzer, the live chunks and their document frequencies."""
        (directory / ANALYZER_FILE).write_text(json.dumps(self.analyzer.to_json()))
        np.save(directory / DOCUMENT_FREQUENCIES_FILE, self.document_frequencies)
        np.save(directory / "chunk_ids.npy", self.chunk_ids)

    def __len__(self) -> int:
        return len(self.chunk_ids)

    @classmethod
    def load(cls, path: Path) -> "LexicalIndex":
        """The index written into `path`, its arrays memory-mapped. An index written before this layout
        (postings without blocks) is refused: `pipeline index` writes it again."""
        segments = sorted(path.glob("segment-*"), key=lambda p: int(p.name.split("-")[1]))
        if not (path / DOCUMENT_FREQUENCIES_FILE).exists() or not segments or not all(map(Segment.exists, segments)):
            raise PipelineError(f"{path}: lexical index missing or from an older version; run `pipeline index`")
        try:
            return cls(
                [Segment.load(s) for s in segments],
                np.load(path / "chunk_ids.npy"),
                Analyzer.load(path),
                np.load(path / DOCUMENT_FREQUENCIES_FILE),
            )
        except (OSError, ValueError, EOFError, KeyError, IndexError) as e:  # a truncated or overwritten file
            raise PipelineError(
                f"{path}: damaged BM25 index "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}); "
                "run `pipeline index --rebuild`"
            ) from None

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best n (chunk ids, BM25 scores), best first; only chunks matching a query word, and only
        `allowed` chunk ids if given."""
        mask = np.isin(self.chunk_ids, allowed).astype(np.float32) if allowed is not None else None
        positions, scores = self.search_positions(query, n, mask)
        return self.chunk_ids[positions], scores

    def statistics(self, query: str) -> "CollectionStatistics":
        """This index's part of what BM25 needs of the whole collection for `query`: its live chunks, their
        total length and the document frequency of each of the query's terms. A search over shards sums them
        over its shards first (the DFS phase of a distributed search engine) and searches each with the sums."""
        frequencies = {
            term: int(self.document_frequencies[self.vocabulary[term]]) if term in self.vocabulary else 0
            for term in self.analyzer.query_terms(query)
        }
        return CollectionStatistics(len(self.chunk_ids), self.total_length, frequencies)

    def search_positions(
        self,
        query: str,
        n: int,
        weight_mask: np.ndarray | None = None,
        walk_budget: int | None = None,
        collection: "CollectionStatistics | None" = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best n (positions in the corpus, i.e. in chunk-id order; BM25 scores), best first (ties by
        position); only chunks sharing a word with the query, and only where weight_mask (1.0 per allowed
        position, 0 elsewhere) is set. Exactly the exhaustive ranking, found with pruning (module docstring),
        unless walk_budget is given: then the postings walked in full are bounded (module docstring).
        `collection`: the statistics of a collection this index is a shard of (statistics() summed over its
        shards), which the scores are then computed with; without it, this index's own."""
        query_words = [t for t in self.analyzer.query_terms(query) if t in self.vocabulary]
        positions, scores = np.zeros(0, np.int64), np.zeros(0, np.float64)
        if min(n, len(self.chunk_ids)) == 0 or not query_words:
            return positions, scores.astype(np.float32)
        terms, first, occurrences = np.unique(
            [self.vocabulary[t] for t in query_words], return_index=True, return_inverse=True
        )
        if collection is None:
            idf, segments = self.idf[terms], self.live_segments
        else:
            frequencies = np.array([collection.document_frequencies[query_words[i]] for i in first], np.int64)
            idf = _idf(collection.chunks, frequencies)
            segments = self._segments_at(_mean_length(collection.total_length, collection.chunks))
        query_terms = _QueryTerms(terms, occurrences, np.bincount(occurrences).astype(np.float64), idf)
        threshold = 0.0  # the n-th best score found so far: a later segment's chunks must reach it
        for segment in segments:
            found_positions, found_scores = _segment_top(segment, query_terms, weight_mask, n, threshold, walk_budget)
            positions, scores = np.concatenate([positions, found_positions]), np.concatenate([scores, found_scores])
            best = np.lexsort((positions, -scores))[:n]
            positions, scores = positions[best], scores[best]
            if len(scores) == n:
                threshold = scores[-1]
        return positions, scores.astype(np.float32)

    def top_many(self, queries: list[str], k: int) -> list[np.ndarray]:
        """The best k chunk ids of each query, best first, in a process per core. Analysing a query is Python
        and holds the interpreter lock, so threads queue on it (16 threads mined hard negatives at 1.3x one
        core's speed); forked processes share the index as it is in memory. With few queries one process
        does it; where forking is unsafe (no fork, or gRPC's threads in this process), threads."""
        processes = min(len(os.sched_getaffinity(0)), len(queries) // QUERIES_PER_PROCESS)
        # gRPC's threads (a Ray driver or worker: this process) do not survive a fork: threads then
        unsafe_to_fork = "grpc" in sys.modules or "fork" not in multiprocessing.get_all_start_methods()
        if processes >= 2 and unsafe_to_fork:
            with ThreadPoolExecutor(processes, thread_name_prefix="bm25") as pool:
                return list(pool.map(lambda query: self.top_chunk_ids(query, k), queries))
        if processes < 2:
            return [self.top_chunk_ids(query, k) for query in queries]
        global _FORKED_SEARCH
        _FORKED_SEARCH = (self, k)
        try:
            with multiprocessing.get_context("fork").Pool(processes) as pool:
                return pool.map(_top_in_forked_process, queries, chunksize=-(-len(queries) // (processes * 8)))
        finally:
            _FORKED_SEARCH = None

    def top_chunk_ids(self, query: str, k: int) -> np.ndarray:
        return self.chunk_ids[self.search_positions(query, k)[0]]


QUERIES_PER_PROCESS = 256  # fewer queries than this a process are searched in this one: a fork costs more
_FORKED_SEARCH: tuple[LexicalIndex, int] | None = None  # the index and k that top_many's forked processes search


def _top_in_forked_process(query: str) -> np.ndarray:
    index, k = _FORKED_SEARCH
    return index.top_chunk_ids(query, k)


@dataclass(frozen=True)
class CollectionStatistics:
    """What BM25's scores depend on beyond a chunk's own counts, for one query: the collection's live chunks,
    their total length (tokens), and the number of chunks holding each of the query's terms."""

    chunks: int
    total_length: int
    document_frequencies: dict[str, int]

    @classmethod
    def summed(cls, parts: "list[CollectionStatistics]") -> "CollectionStatistics":
        """A collection's, from its shards' (each a LexicalIndex's statistics() for the same query)."""
        frequencies: dict[str, int] = {}
        for part in parts:
            for term, count in part.document_frequencies.items():
                frequencies[term] = frequencies.get(term, 0) + count
        return cls(sum(p.chunks for p in parts), sum(p.total_length for p in parts), frequencies)


@dataclass
class _QueryTerms:
    """A query's distinct terms (ids, ascending), which of them each query word is, in query order, how
    many words each is, and their idf."""

    terms: np.ndarray
    occurrences: np.ndarray
    multiplicity: np.ndarray  # float64
    idf: np.ndarray  # float32


class LiveSegment:
    """A segment as search reads it, under the live statistics: each row's position among the live chunks
    (-1: deleted) and its norm, and the factor r by which the norms at the segment's own average length
    may shrink: norm_live >= r * norm_own, with r = min(1, own average / live average)."""

    def __init__(self, segment: Segment, positions: np.ndarray, norms: np.ndarray, average_length: float):
        self.segment, self.positions, self.norms = segment, positions, norms
        self.all_live = bool((positions >= 0).all())  # no row deleted: rows need no check
        self.norm_scale = min(1.0, segment.average_length / average_length)


def _segment_top(
    live: LiveSegment,
    query: _QueryTerms,
    weight_mask: np.ndarray | None,
    n: int,
    threshold: float,
    walk_budget: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One query's best n chunks in one segment among those scoring at least `threshold`: (positions, float64
    scores), best first, ties by position. Terms are the query's distinct terms; a term's contribution to a
    chunk counts once per query word (its multiplicity). walk_budget: see _max_score (None: exact)."""
    segment = live.segment
    held = query.terms < len(segment.indptr) - 1  # a term the segments after this one added is not here
    terms = np.where(held, query.terms, 0)
    starts = np.where(held, segment.indptr[terms], 0)
    stops = np.where(held, segment.indptr[terms + 1], 0)
    # Each term's bound on its contribution to a chunk (times its multiplicity): its best block's u = tf /
    # (tf + norm) at the segment's own average length bounds tf / (tf + r * norm) by u / (u + r (1 - u)).
    r = live.norm_scale
    upper = np.zeros(len(terms))
    for j, (first, end) in enumerate(zip(segment.block_indptr[terms], segment.block_indptr[terms + 1])):
        u = float(segment.block_max[first:end].max(initial=0.0)) if held[j] else 0.0
        upper[j] = query.multiplicity[j] * query.idf[j] * (1 + SLACK) * u / (u + r * (1 - u))
    mask = np.zeros(0, np.float32) if weight_mask is None else weight_mask
    rows, scores = _max_score(
        segment.rows,
        segment.tfs,
        live.norms,
        live.positions,
        mask,
        weight_mask is not None,
        live.all_live,
        starts,
        stops,
        query.idf,
        query.multiplicity,
        query.occurrences,
        upper,
        n,
        threshold,
        -1 if walk_budget is None else walk_budget,
    )
    best = np.lexsort((rows, -scores))
    return live.positions[rows[best]].astype(np.int64), scores[best]


@numba.njit(cache=True, nogil=True)
def _max_score(
    rows,
    tfs,
    norms,
    row_positions,
    mask,
    masked,
    all_live,
    starts,
    stops,
    idf,
    multiplicity,
    occurrences,
    upper,
    n,
    threshold,
    walk_budget,
):
    """MaxScore (Turtle and Flood), document at a time over the rows of the query's terms' postings, in row
    order: the terms ordered by bound; the first ones, whose bounds sum below the n-th best score so far
    (non-essential), only looked up (by binary search) for the rows the others hold, and only while the
    row can still reach that score. Exact: a row's score is its query words' float32 contributions summed
    in query order into float64, as the definition sums them. Returns (rows, scores) best first, ties by
    row (unordered). The GIL is released: the server's threads search side by side.
    walk_budget >= 0: the terms of lowest bound are non-essential from the start, as many as leave at most
    that many postings to walk (the term of highest bound is always walked): rows holding none of the walked
    terms are not found; a row found is still scored exactly."""
    m = len(starts)
    order = np.argsort(upper)
    bound_sums = np.cumsum(upper[order])  # bound_sums[i]: the bounds of terms order[0..i]
    at = starts[order].copy()
    ends = stops[order].copy()
    rank_of = np.empty(m, np.int64)  # query term j -> its place in `order`
    for i in range(m):
        rank_of[order[i]] = i
    contribution = np.zeros(m, np.float32)
    heap_scores = np.empty(n, np.float64)
    heap_rows = np.empty(n, np.int64)
    size = 0
    least = threshold * (1 - SLACK)  # a row below it cannot be among the best n
    essential = 0
    if walk_budget >= 0 and m > 0:
        essential = m - 1
        walked = ends[essential] - at[essential]
        while essential > 0 and walked + ends[essential - 1] - at[essential - 1] <= walk_budget:
            essential -= 1
            walked += ends[essential] - at[essential]
    while essential < m and bound_sums[essential] < least:
        essential += 1
    no_row = 1 << 62  # above every row
    while essential < m:
        row = no_row
        for i in range(essential, m):
            if at[i] < ends[i] and rows[at[i]] < row:
                row = rows[at[i]]
        if row == no_row:
            break
        allowed = True
        if not all_live or masked:
            position = row_positions[row]
            allowed = position >= 0 and (not masked or mask[position] > 0)
        partial = 0.0
        for i in range(m):
            contribution[i] = 0.0
        for i in range(essential, m):
            if at[i] < ends[i] and rows[at[i]] == row:
                if allowed:
                    tf = np.float32(tfs[at[i]])
                    contribution[i] = idf[order[i]] * tf / (tf + norms[row])
                    partial += multiplicity[order[i]] * contribution[i]
                at[i] += 1
        if not allowed:
            continue
        reachable = True
        for i in range(essential - 1, -1, -1):
            if partial + bound_sums[i] < least:
                reachable = False
                break
            low, high = at[i], ends[i]  # the first posting at or after `row`
            step = 1
            while low + step < high and rows[low + step] < row:  # galloping, then binary search
                low += step
                step *= 2
            high = min(high, low + step + 1)
            while low < high:
                middle = (low + high) // 2
                if rows[middle] < row:
                    low = middle + 1
                else:
                    high = middle
            at[i] = low
            if low < ends[i] and rows[low] == row:
                tf = np.float32(tfs[low])
                contribution[i] = idf[order[i]] * tf / (tf + norms[row])
                partial += multiplicity[order[i]] * contribution[i]
        if not reachable or partial < least:
            continue
        score = 0.0
        for j in occurrences:
            score += contribution[rank_of[j]]
        if size < n:
            if score < threshold:
                continue
            # sift up: the heap's root is the worst row (lowest score; of equal scores, the later row)
            k = size
            size += 1
            while k > 0:
                parent = (k - 1) // 2
                if heap_scores[parent] < score or (heap_scores[parent] == score and heap_rows[parent] > row):
                    break
                heap_scores[k], heap_rows[k] = heap_scores[parent], heap_rows[parent]
                k = parent
            heap_scores[k], heap_rows[k] = score, row
        elif score > heap_scores[0]:  # rows come in order: an equal score loses to the earlier row
            k = 0
            while True:
                child = 2 * k + 1
                if child >= n:
                    break
                if child + 1 < n and (
                    heap_scores[child + 1] < heap_scores[child]
                    or (heap_scores[child + 1] == heap_scores[child] and heap_rows[child + 1] > heap_rows[child])
                ):
                    child += 1
                if score < heap_scores[child] or (score == heap_scores[child] and row > heap_rows[child]):
                    break
                heap_scores[k], heap_rows[k] = heap_scores[child], heap_rows[child]
                k = child
            heap_scores[k], heap_rows[k] = score, row
        else:
            continue
        if size == n:
            least = max(least, heap_scores[0] * (1 - SLACK))
            while essential < m and bound_sums[essential] < least:
                essential += 1
    return heap_rows[:size], heap_scores[:size]
