"""Pairs the corpus itself provides for measuring search, kept apart from those it provides for training.

Adaptation (`pipeline tune`) trains on pairs from the user's documents; choosing the default search
mode (search/calibrate.py) and the embedder (embed/tune.py) measures on pairs from documents adaptation
never trained on. The split is a fixed function of the document id, so the stages agree on it without
talking to each other, and it stays the same when documents are added.

A pair is the inverse cloze task: one sentence of a document is the query, the document without it the
one relevant answer. A document with too few sentences for that (one long sentence, text without
sentence marks) gives a span of about SPAN_WORDS words instead (common/language.py), and one too short
for a span, its title if the title is not just the text's beginning: so any collection with some text is
measured, whatever its language or punctuation.
"""
from __future__ import annotations

import hashlib
import random

from common.language import SPAN_WORDS, passages, word_count

HELD_OUT_PERCENT = 5  # share of documents kept out of training to measure search on
MIN_QUERY_WORDS = 6  # shorter sentences ("Results.") make poor queries


def is_held_out(doc_id: str) -> bool:
    digest = hashlib.blake2b(doc_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100 < HELD_OUT_PERCENT


def held_out_pair(title: str, text: str, rng: random.Random, language: str = "en") -> tuple[str, str, str] | None:
    """(query, shortened text, kind): one sentence (or span) of the text and the text without it, kind
    "sentence" or "span"; the title and the whole text (kind "title") when the text is too short to lose a
    part; None when the document has neither."""
    # Spans short enough that a short text still has three, long enough to be a query.
    parts, unit = passages(text, language, span_words=min(SPAN_WORDS, max(MIN_QUERY_WORDS, word_count(text) // 3)))
    candidates = [i for i, part in enumerate(parts) if word_count(part) >= MIN_QUERY_WORDS]
    if len(parts) >= 3 and candidates:
        i = rng.choice(candidates)
        return parts[i], " ".join(parts[:i] + parts[i + 1:]), unit.removesuffix("s")
    if len(parts) == 2 and candidates:  # two parts: the shorter one that is long enough is the query
        i = min(candidates, key=lambda k: word_count(parts[k]))
        return parts[i], parts[1 - i], unit.removesuffix("s")
    title = " ".join(title.split())
    if word_count(title) >= 2 and text.strip() and not starts_with(text, title):
        return title, " ".join(text.split()), "title"
    return None


def starts_with(text: str, title: str) -> bool:
    """Whether the text begins with the title (case, spacing and punctuation aside): such a title only
    repeats the text's first words."""
    def letters(s: str) -> str:
        return "".join(ch for ch in s.lower() if ch.isalnum())
    head = letters(title)
    return bool(head) and letters(text[:len(title) * 2 + 20]).startswith(head)
