"""The snippet shown with a hit: the passage of its best chunk that best matches the query, and where the
query's terms are in it.

Terms are matched as BM25 matches them (common/lexical.py: lower-cased words of two or more letters, no
stop words, Snowball stems), so "tumours" in a query marks "tumour" and "Tumours" in the text, whatever
the mode that found the hit. The passage is the window of at most `limit` characters, starting at a word,
holding the most distinct query terms (then the most matches, then the earliest); with no term in the
chunk, its beginning. Offsets are character offsets into the snippet text: [start, end) pairs.
"""
from __future__ import annotations

import functools
import re
from array import array
from dataclasses import dataclass

from common.lexical import query_terms, stem_words

LIMIT = 240


_STEMS: dict[str, str] = {}  # lower-cased word -> its stem; grows to the corpus's vocabulary at most
_WORDS = re.compile(r"\w{2,}")  # the words BM25 indexes (common/lexical.py)


def _stem(lowered: str) -> str:
    """The stem of a lower-cased word."""
    stem = _STEMS.get(lowered)
    if stem is None:
        stem = _STEMS[lowered] = stem_words([lowered])[0]
    return stem


def snippet_terms(query: str) -> frozenset[str]:
    """The query's terms as BM25 has them: stems of its words, stop words left out."""
    return frozenset(query_terms(query))


@dataclass(frozen=True)
class ChunkWords:
    """A chunk's text with each run of whitespace made one space, and the stem and [start, end) of each of
    its words in that text, in order."""
    text: str
    stems: tuple[str, ...]
    spans: array  # start, end of word 0, then of word 1, ...


@functools.lru_cache(maxsize=8192)
def chunk_words(text: str) -> ChunkWords:
    """A chunk's words, found and stemmed once: the best chunks of hits recur across queries, and finding
    a query's terms in a chunk's text at each search was most of a search's snippet time (~3 KB a chunk)."""
    text = " ".join(text.split())
    found = list(_WORDS.finditer(text))
    spans = array("i", [at for word in found for at in word.span()])
    return ChunkWords(text, tuple(_stem(word.group().lower()) for word in found), spans)


def make_snippet(text: str, terms: frozenset[str], starts_mid_text: bool = False, limit: int = LIMIT) -> tuple[str, list[tuple[int, int]]]:
    """(snippet, [(start, end) of each matched term in it]) for a chunk's text and the query's terms."""
    words = chunk_words(text)
    text, spans = words.text, words.spans
    # (start, end, stem) of each word that is a query term
    matched = [(spans[2 * i], spans[2 * i + 1], stem) for i, stem in enumerate(words.stems) if stem in terms]
    if matched:
        start = _best_window_start(text, matched, limit)
    else:
        start = 0
        if starts_mid_text and " " in text:  # a token window may start inside a word: drop the fragment
            start = text.index(" ") + 1
    end = len(text) if len(text) - start <= limit else _cut_at_space(text, start, start + limit)
    prefix = "… " if start > 0 else ""
    suffix = " …" if end < len(text) else ""
    shift = len(prefix) - start
    marks = [(s + shift, e + shift) for s, e, _ in matched if start <= s and e <= end]
    return prefix + text[start:end] + suffix, marks


def _best_window_start(text: str, matched: list[tuple[int, int, str]], limit: int) -> int:
    """Where the window of at most `limit` characters holding the most distinct terms, then the most
    matches, starts: a little before its first match (up to 40 characters, at a space), so the term is
    read in its sentence. The window from match i holds matches i to j - 1 (they are in text order)."""
    best, best_key = 0, (-1, -1)
    inside: dict[str, int] = {}  # stem -> its matches in the window
    j = 0
    for i, (start, _, stem) in enumerate(matched):
        bound = start + limit - 40
        while j < len(matched) and matched[j][1] <= bound:
            inside[matched[j][2]] = inside.get(matched[j][2], 0) + 1
            j += 1
        key = (len(inside), j - i)
        if key > best_key:
            best, best_key = start, key
        if j > i:  # match i leaves the window
            if inside[stem] == 1:
                del inside[stem]
            else:
                inside[stem] -= 1
        else:  # a word longer than the window: the next window starts after it
            j = i + 1
    if best <= 40:
        return 0
    space = text.rfind(" ", best - 40, best - 1)
    return space + 1 if space >= 0 else best


def _cut_at_space(text: str, start: int, end: int) -> int:
    cut = text.rfind(" ", start, end + 1)
    return cut if cut > start else end

