"""The snippet shown with a hit: the passage of its best chunk that best matches the query, and where the
query's terms are in it.

Terms are matched as BM25 matches them (common/lexical/'s Analyzer of the index: lower-cased words of
two or more letters, no stop words, the language's Snowball stems; CJK bigrams), so "tumours" in a query
marks "tumour" and "Tumours" in the text, whatever the mode that found the hit. The passage is the
window of at most `limit` characters, starting at a word, holding the most distinct query terms (then
the most matches, then the earliest); with no term in the chunk, its beginning. Offsets are character
offsets into the snippet text: [start, end) pairs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from common.language import has_cjk
from common.lexical import Analyzer

LIMIT = 240


_STEMS: dict[
    tuple[str, str], str
] = {}  # (language, lower-cased word) -> its stem; grows to the corpus's vocabulary at most


def _stem(analyzer: Analyzer, lowered: str) -> str:
    """The stem of a lower-cased word."""
    stem = _STEMS.get((analyzer.language, lowered))
    if stem is None:
        stem = _STEMS[analyzer.language, lowered] = analyzer.stem_words([lowered])[0]
    return stem


@dataclass(frozen=True)
class QueryTerms:
    """A query's stemmed terms, and the prefixes of the words that may be one of them: a word whose stem is
    a term starts with the term less its last letter (Snowball changes only a word's ending, e.g.
    density -> densiti), so only the few words of a chunk that start with a prefix are stemmed."""

    stems: frozenset[str]
    prefixes: tuple[str, ...]
    cjk: tuple[str, ...]  # CJK bigrams: matched where they are, inside a run of characters without spaces
    analyzer: Analyzer


def snippet_terms(query: str, analyzer: Analyzer = Analyzer()) -> QueryTerms:
    stems = frozenset(analyzer.query_terms(query))
    words = {stem for stem in stems if not has_cjk(stem)}
    return QueryTerms(
        stems,
        tuple(sorted({stem[:-1] if len(stem) > 2 else stem for stem in words})),
        tuple(sorted(stems - words)),
        analyzer,
    )


def _cjk_matches(text: str, bigrams: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """(start, end, bigram) of each place a query's CJK bigram is in the text."""
    lowered = text.lower()
    found = []
    for bigram in bigrams:
        at = lowered.find(bigram)
        while at >= 0:
            found.append((at, at + len(bigram), bigram))
            at = lowered.find(bigram, at + 1)
    return found


_WORD_REST = re.compile(r"\w*")


def _candidate_words(text: str, prefixes: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """(start, end, the word lower-cased) of each word of `text` that starts with one of the prefixes, in
    any case, in text order. str.find over the lower-cased text: faster than one case-insensitive regex of
    the prefixes (the largest part of a search's snippets; measured:
    benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters lower-case to two: search the text itself
        pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, prefixes)) + r")\w*", re.IGNORECASE)
        return [(found.start(), found.end(), found.group().lower()) for found in pattern.finditer(text)]
    words = {}
    for prefix in prefixes:
        at = lowered.find(prefix)
        while at >= 0:
            before = lowered[at - 1] if at else " "
            if not (before.isalnum() or before == "_"):  # the prefix starts a word (\w is these characters)
                end = _WORD_REST.match(lowered, at).end()
                words[at] = (at, end, lowered[at:end])
                at = lowered.find(prefix, end)
            else:
                at = lowered.find(prefix, at + 1)
    return [words[at] for at in sorted(words)]


@functools.lru_cache(maxsize=8192)
def _one_line(text: str) -> str:
    """The text with each run of whitespace made one space. Cached: the best chunks of hits recur across
    queries, and this was a tenth of a search's time; a chunk's string is hashed once by Python."""
    return " ".join(text.split())


def make_snippet(
    text: str, terms: QueryTerms, starts_mid_text: bool = False, limit: int = LIMIT
) -> tuple[str, list[tuple[int, int]]]:
    """(snippet, [(start, end) of each matched term in it]) for a chunk's text and the query's terms."""
    text = _one_line(text)
    matched = []  # (start, end, stem) of each word that is a query term
    if terms.prefixes:
        for start, end, word in _candidate_words(text, terms.prefixes):
            stem = _stem(terms.analyzer, word)
            if stem in terms.stems and end - start >= 2:
                matched.append((start, end, stem))
    if terms.cjk and len(text) == len(text.lower()):
        matched = sorted(matched + _cjk_matches(text, terms.cjk))
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
    marks: list[tuple[int, int]] = []
    for s, e, _ in matched:
        if start <= s and e <= end:
            if marks and s + shift <= marks[-1][1]:  # overlapping CJK bigrams mark one run
                marks[-1] = (marks[-1][0], max(marks[-1][1], e + shift))
            else:
                marks.append((s + shift, e + shift))
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
