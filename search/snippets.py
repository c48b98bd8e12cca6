"""The snippet shown with a hit: the passage of its best chunk that best matches the query, and where the
query's terms are in it.

Terms are matched as BM25 matches them (common/lexical.py: lower-cased words of two or more letters, no
stop words, Snowball stems), so "tumours" in a query marks "tumour" and "Tumours" in the text, whatever
the mode that found the hit. The passage is the window of at most `limit` characters, starting at a word,
holding the most distinct query terms (then the most matches, then the earliest); with no term in the
chunk, its beginning. Offsets are character offsets into the snippet text: [start, end) pairs.
"""
from __future__ import annotations

import re

from common.lexical import query_terms, stem_words

WORD = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern
LIMIT = 240


def make_snippet(text: str, terms: frozenset[str], starts_mid_text: bool = False, limit: int = LIMIT) -> tuple[str, list[tuple[int, int]]]:
    """(snippet, [(start, end) of each matched term in it]) for a chunk's text and the query's stemmed terms."""
    text = " ".join(text.split())
    words = [(m.start(), m.end()) for m in WORD.finditer(text)]
    stems = stem_words([text[s:e].lower() for s, e in words]) if terms and words else []
    matched = [i for i, stem in enumerate(stems) if stem in terms]
    if matched:
        first_word, last_char = _best_window(words, stems, matched, limit)
        start = words[first_word][0]
    else:
        start, last_char = 0, limit
        if starts_mid_text and " " in text:  # a token window may start inside a word: drop the fragment
            start = text.index(" ") + 1
    end = len(text) if len(text) - start <= limit else _cut_at_space(text, start, min(last_char, start + limit))
    prefix = "… " if start > 0 else ""
    suffix = " …" if end < len(text) else ""
    shift = len(prefix) - start
    marks = [(words[i][0] + shift, words[i][1] + shift) for i in matched if start <= words[i][0] and words[i][1] <= end]
    return prefix + text[start:end] + suffix, marks


def _best_window(words, stems, matched, limit) -> tuple[int, int]:
    """The first word and the end of the window of at most `limit` characters holding the most distinct
    terms, then the most matches; it starts at a matched word."""
    best, best_key = matched[0], None
    for i in matched:
        window_end = words[i][0] + limit
        inside = [j for j in matched if i <= j and words[j][1] <= window_end]
        key = (len({stems[j] for j in inside}), len(inside))
        if best_key is None or key > best_key:
            best, best_key = i, key
    start = words[best][0]
    # Start a little before the first match, at a word, so the term is read in its sentence.
    lead = max((j for j in range(best, -1, -1) if start - words[j][0] <= 40), default=best)
    return lead, words[lead][0] + limit


def _cut_at_space(text: str, start: int, end: int) -> int:
    cut = text.rfind(" ", start, end + 1)
    return cut if cut > start else end


def snippet_terms(query: str) -> frozenset[str]:
    return frozenset(query_terms(query))
