"""Pairs the corpus itself provides for measuring search, kept apart from those it provides for training.

Adaptation (`pipeline tune`) trains on pairs from the user's documents; choosing the default search
mode (search/calibrate.py) measures on pairs from documents adaptation never trained on. The split is
a fixed function of the document id, so both stages agree on it without talking to each other, and it
stays the same when documents are added.
"""
from __future__ import annotations

import hashlib
import random
import re

HELD_OUT_PERCENT = 5  # share of documents kept out of training to measure search on
MIN_QUERY_WORDS = 6  # shorter sentences ("Results.") make poor queries

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def is_held_out(doc_id: str) -> bool:
    digest = hashlib.blake2b(doc_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100 < HELD_OUT_PERCENT


def held_out_pair(text: str, rng: random.Random) -> tuple[str, str] | None:
    """(query, shortened text): one sentence of the text and the text without it (inverse cloze), or None
    if the text has fewer than 3 sentences or no sentence long enough to be a query."""
    parts = sentences(" ".join(text.split()))
    candidates = [i for i, s in enumerate(parts) if len(s.split()) >= MIN_QUERY_WORDS]
    if len(parts) < 3 or not candidates:
        return None
    i = rng.choice(candidates)
    return parts[i], " ".join(parts[:i] + parts[i + 1:])
