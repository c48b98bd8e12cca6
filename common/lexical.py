"""The lexical (BM25) index over the stored chunks: analysed by the collection's language, BM25 scores
computed on loading.

Shared by the stages that rank text lexically: `pipeline index` builds it and writes it into the
workspace (index/build.py names and swaps its versioned directory), search and the default-mode
measurement query it, and `pipeline tune` mines hard negatives with it before any index exists. It is
in common/ because three stages use it and no stage imports another; what only `pipeline index` does
(where the files go, when older versions are removed) is in index/build.py.

Each chunk is indexed as its document's title followed by the chunk text (what the dense side embeds
too), analysed by the collection's Analyzer: lower-cased, split into words (bm25s's word pattern) and
runs of Chinese, Japanese or Korean characters into overlapping bigrams (as Lucene's CJK analyzer does),
the language's stop words removed and its Snowball stemmer applied. The language is detected by
`pipeline index` on the collection (common/language.py) or given by the user (`--language`), and written
with the index, so queries are analysed exactly as the chunks were. For English these are bm25s's tokens
(its word pattern and stop words), made without its per-call set-up, which was most of a query's
tokenizing (50 us of 56).

Why the scores are not bm25s's own index: bm25s stores every (term, chunk) score computed with the
collection's statistics (the number of chunks, each term's document frequency, the average length), so
adding or deleting one chunk changes every stored score and only a full rebuild puts them right (on
20,700 SciFact documents: 3.3 s to tokenize, 2.0 s to index, both proportional to the collection). This
index stores what a chunk's arrival or departure does not change, each chunk's term counts and length, in
segments: the base, written by a full build, and a delta with the chunks added since (index/build.py).
Base chunks the store no longer holds are skipped (tombstones). BM25 (Lucene's variant, as bm25s:
k1 = 1.5, b = 0.75) is computed from the live chunks' statistics when the index is loaded, so an updated
index scores every chunk exactly as one built from scratch over the same chunks.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shutil
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse
import Stemmer
from bm25s.stopwords import (
    STOPWORDS_DANISH,
    STOPWORDS_DUTCH,
    STOPWORDS_EN,
    STOPWORDS_FRENCH,
    STOPWORDS_GERMAN,
    STOPWORDS_ITALIAN,
    STOPWORDS_NORWEGIAN,
    STOPWORDS_PORTUGUESE,
    STOPWORDS_RUSSIAN,
    STOPWORDS_SPANISH,
    STOPWORDS_SWEDISH,
    STOPWORDS_TURKISH,
)

from common.console import warn
from common.embedder import embedding_text
from common.errors import PipelineError
from common.language import LanguageMix, cjk_tokens, detect_languages, has_cjk

K1, B = 1.5, 0.75
TOKENIZE_BATCH = 10_000  # chunks tokenized at once: bounds the memory the token strings take
SEGMENT_FILES = ("chunk_ids.npy", "lengths.npy", "indptr.npy", "rows.npy", "counts.npy", "new_terms.json")
ANALYZER_FILE = "tokenizer.json"

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
# bm25s's stop-word lists by ISO 639-1 code; a language without one keeps every word.
STOPWORDS = {
    "en": STOPWORDS_EN,
    "da": STOPWORDS_DANISH,
    "nl": STOPWORDS_DUTCH,
    "fr": STOPWORDS_FRENCH,
    "de": STOPWORDS_GERMAN,
    "it": STOPWORDS_ITALIAN,
    "no": STOPWORDS_NORWEGIAN,
    "nb": STOPWORDS_NORWEGIAN,
    "pt": STOPWORDS_PORTUGUESE,
    "ru": STOPWORDS_RUSSIAN,
    "es": STOPWORDS_SPANISH,
    "sv": STOPWORDS_SWEDISH,
    "tr": STOPWORDS_TURKISH,
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


@dataclass
class Segment:
    """Term counts of some chunks, by term (CSC): the chunks of term t are rows[indptr[t]:indptr[t + 1]],
    with counts in counts[...]; term ids index the vocabulary of this segment and the ones before it."""

    chunk_ids: np.ndarray  # int64, one per row
    lengths: np.ndarray  # int32: tokens per row
    indptr: np.ndarray
    rows: np.ndarray
    counts: np.ndarray  # float32
    new_terms: list[str]  # the terms this segment added to the vocabulary, in id order
    source: Path | None = None  # the directory it was loaded from (a new index version links its files)

    @classmethod
    def build(cls, rows: list[tuple[int, str, str]], vocabulary: dict[str, int], analyzer: Analyzer) -> "Segment":
        """rows: (chunk_id, document title, chunk text). New terms are added to `vocabulary`."""
        known = len(vocabulary)
        term_ids, lengths = [], []
        for start in range(0, len(rows), TOKENIZE_BATCH):
            words = analyzer.words(
                [embedding_text(title or "", text or "") for _, title, text in rows[start : start + TOKENIZE_BATCH]]
            )
            stems = analyzer.stems(words)
            # Each distinct word's term id (new terms numbered in order of first use), then every word's in
            # one pass in C: a Python step per word was half of building the index (18M words at 100k chunks).
            all_words = list(itertools.chain.from_iterable(words))
            term_of = {word: vocabulary.setdefault(stems[word], len(vocabulary)) for word in dict.fromkeys(all_words)}
            term_ids.append(np.fromiter(map(term_of.__getitem__, all_words), np.int64, len(all_words)))
            lengths.extend(map(len, words))
        lengths = np.array(lengths, dtype=np.int32)
        flat = np.concatenate(term_ids) if term_ids else np.zeros(0, np.int64)
        row_starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        matrix = scipy.sparse.csr_matrix(
            (np.ones(len(flat), np.float32), flat, row_starts), shape=(len(rows), len(vocabulary))
        ).tocsc()
        matrix.sum_duplicates()
        return cls(
            np.array([r[0] for r in rows], dtype=np.int64),
            lengths,
            matrix.indptr.astype(np.int64),
            matrix.indices.astype(np.int32),
            matrix.data.astype(np.float32),
            list(vocabulary)[known:],
        )

    def write(self, directory: Path) -> None:
        directory.mkdir()
        if self.source is not None:  # unchanged since it was written: the new version shares its files
            for name in SEGMENT_FILES:
                try:
                    os.link(self.source / name, directory / name)
                except OSError:
                    shutil.copy2(self.source / name, directory / name)
            return
        for name in SEGMENT_FILES[:-1]:
            np.save(directory / name, getattr(self, name.removesuffix(".npy")))
        (directory / "new_terms.json").write_text(json.dumps(self.new_terms, ensure_ascii=False))

    @classmethod
    def load(cls, directory: Path) -> "Segment":
        arrays = {name.removesuffix(".npy"): np.load(directory / name) for name in SEGMENT_FILES[:-1]}
        return cls(**arrays, new_terms=json.loads((directory / "new_terms.json").read_text()), source=directory)


class LexicalIndex:
    """BM25 over the live chunks (`chunk_ids`, sorted) held by one or more segments."""

    def __init__(self, segments: list[Segment], chunk_ids: np.ndarray, analyzer: Analyzer):
        self.segments = segments
        self.analyzer = analyzer
        self.chunk_ids = chunk_ids  # position -> chunk id, ascending: the order of the store's chunks
        self.vocabulary: dict[str, int] = {}
        for segment in segments:
            for term in segment.new_terms:
                self.vocabulary[term] = len(self.vocabulary)
        n = len(chunk_ids)
        # Each segment row's position among the live chunks, or n (a bin that is dropped) when deleted.
        self._positions, self._live_rows = [], []
        for segment in segments:
            at = np.minimum(np.searchsorted(chunk_ids, segment.chunk_ids), max(n - 1, 0))
            live = (chunk_ids[at] == segment.chunk_ids) if n else np.zeros(len(segment.chunk_ids), bool)
            self._positions.append(np.where(live, at, n).astype(np.int32))
            self._live_rows.append(live)
        if sum(int(live.sum()) for live in self._live_rows) != n:
            raise PipelineError("the BM25 index does not hold the stored chunks: run `pipeline index`")
        self._scored: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._scoring = threading.Lock()  # scored once, should two threads search an unscored index at once

    def postings(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per segment: by term, the live position and BM25 score of each chunk holding it. Scored when
        first asked: an index loaded for search is scored then (`load`), one `pipeline index` builds or
        updates is only written (0.4 s of 100k chunks)."""
        with self._scoring:
            if self._scored is None:
                self._scored = self._score()
        return self._scored

    def _score(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """postings(), computed: BM25 with the document frequencies and average length of the live chunks."""
        n = len(self.chunk_ids)
        entry_terms = [
            np.repeat(np.arange(len(segment.indptr) - 1), np.diff(segment.indptr)) for segment in self.segments
        ]
        document_frequency = np.zeros(len(self.vocabulary))
        total_length = 0
        for segment, live, terms in zip(self.segments, self._live_rows, entry_terms):
            document_frequency += np.bincount(terms, weights=live[segment.rows], minlength=len(self.vocabulary))
            total_length += int(segment.lengths[live].sum(dtype=np.int64))
        average_length = max(total_length / n, 1.0) if n else 1.0
        idf = np.log(1 + (n - document_frequency + 0.5) / (document_frequency + 0.5)).astype(np.float32)
        scored = []
        for segment, position, live, terms in zip(self.segments, self._positions, self._live_rows, entry_terms):
            norm = (K1 * ((1 - B) + B * segment.lengths / average_length)).astype(np.float32)
            scores = idf[terms] * segment.counts / (segment.counts + norm[segment.rows])
            scored.append(
                (segment.indptr, position[segment.rows], np.where(live[segment.rows], scores, 0).astype(np.float32))
            )
        return scored

    @classmethod
    def build(cls, rows: list[tuple[int, str, str]], analyzer: Analyzer) -> "LexicalIndex":
        """rows: (chunk_id, document title, chunk text), in chunk_id order."""
        segment = Segment.build(rows, {}, analyzer)
        return cls([segment], segment.chunk_ids, analyzer)

    @classmethod
    def with_delta(cls, base: Segment, delta_rows: list[tuple[int, str, str]], chunk_ids: np.ndarray) -> "LexicalIndex":
        """The index over `chunk_ids` (the live chunks, sorted): those of `base` that are live, and
        `delta_rows` (the chunks added since the base; chunk_id order), a new segment analysed as the base was."""
        vocabulary = {}
        for term in base.new_terms:
            vocabulary[term] = len(vocabulary)
        analyzer = Analyzer.load(base.source.parent)  # the index directory the base segment is in
        return cls([base, Segment.build(delta_rows, vocabulary, analyzer)], chunk_ids, analyzer)

    @property
    def base(self) -> Segment:
        return self.segments[0]

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def write(self, directory: Path) -> None:
        """Write the index's files into an existing, empty directory (a segment loaded from disk is linked)."""
        for i, segment in enumerate(self.segments):
            segment.write(directory / f"segment-{i}")
        (directory / ANALYZER_FILE).write_text(json.dumps(self.analyzer.to_json()))
        np.save(directory / "chunk_ids.npy", self.chunk_ids)

    @classmethod
    def load(cls, path: Path) -> "LexicalIndex":
        segments = sorted(path.glob("segment-*"), key=lambda p: int(p.name.split("-")[1]))
        if not (path / "chunk_ids.npy").exists() or not segments:
            raise PipelineError(f"{path}: lexical index missing or from an older version; run `pipeline index`")
        try:
            index = cls([Segment.load(s) for s in segments], np.load(path / "chunk_ids.npy"), Analyzer.load(path))
            index.postings()  # scored now: a search pays nothing for it
        except (OSError, ValueError, EOFError, KeyError, IndexError) as e:  # a truncated or overwritten file
            raise PipelineError(
                f"{path}: damaged BM25 index "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}); "
                "run `pipeline index --rebuild`"
            ) from None
        return index

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best n (chunk ids, BM25 scores), best first; only chunks matching a query word, and only
        `allowed` chunk ids if given."""
        mask = np.isin(self.chunk_ids, allowed).astype(np.float32) if allowed is not None else None
        positions, scores = self.search_positions(query, n, mask)
        return self.chunk_ids[positions], scores

    def search_positions(
        self, query: str, n: int, weight_mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best n (positions in the corpus, i.e. in chunk-id order; BM25 scores), best first (ties by
        position); only chunks sharing a word with the query, and only where weight_mask (1.0 per allowed
        position) is set."""
        total = len(self.chunk_ids)
        terms = [self.vocabulary[t] for t in self.analyzer.query_terms(query) if t in self.vocabulary]
        if min(n, total) == 0 or not terms:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        positions, scores = [], []
        for indptr, entry_positions, entry_scores in self.postings():
            for t in terms:
                if t < len(indptr) - 1:
                    positions.append(entry_positions[indptr[t] : indptr[t + 1]])
                    scores.append(entry_scores[indptr[t] : indptr[t + 1]])
        summed = np.bincount(np.concatenate(positions), weights=np.concatenate(scores), minlength=total + 1)[:total]
        if weight_mask is not None:
            summed *= weight_mask
        found = np.flatnonzero(summed > 0)
        if len(found) > n:
            found = found[np.argpartition(-summed[found], n - 1)[:n]]
        found = found[np.lexsort((found, -summed[found]))]
        return found.astype(np.int64), summed[found].astype(np.float32)

    def top_many(self, queries: list[str], k: int) -> list[np.ndarray]:
        """The best k chunk ids of each query, best first."""
        return [self.chunk_ids[self.search_positions(query, k)[0]] for query in queries]
