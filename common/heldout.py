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

A query-like pair (asked for with `query_like`) is shaped as users' queries are: a run of QUERY_WORDS
words of a sentence (twice as many characters of Chinese or Japanese) is the query, and the document
keeps its text, that sentence with each of the query's words kept at random (QUERY_WORD_KEPT): like a
question or claim, the query shares some of its words with its answer, not all. The inverse cloze task
shares none but those the rest of the document repeats, which handicaps lexical search in a way real
queries do not; query-like pairs make lexical search look stronger than judged queries do
(benchmarks/results/2026-11-28-pair-kinds-cpu.md). search/calibrate.py measures on both.
"""

from __future__ import annotations

import collections
import hashlib
import math
import random

from common.language import CJK_CHARS_PER_WORD, has_cjk, passages, text_units, word_count

HELD_OUT_PERCENT = 5  # share of documents kept out of training to measure search on
MIN_QUERY_WORDS = 6  # shorter sentences ("Results.") make poor queries
QUERY_WORDS = (4, 12)  # a query-like pair's query: this many of a sentence's words, uniformly
QUERY_WORD_KEPT = 0.5  # the chance that each of them stays in the document's text


def is_held_out(doc_id: str, percent: int = HELD_OUT_PERCENT) -> bool:
    """Whether a document is held out: a fixed function of its id. Pretraining's validation documents are
    those of its own percent (5 by default: the same documents, so search is measured on text no stage
    trained on)."""
    digest = hashlib.blake2b(doc_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100 < percent


def held_out_pairs(
    documents: list[tuple[str, str, str]],
    rng: random.Random,
    language: str,
    limit: int,
    draws: int = 1,
    query_like: bool = False,
) -> dict[str, list[tuple[str, str, str]]]:
    """Held-out pairs of up to `limit` documents, doc_id -> [(query, shortened text, kind), ...] (up to
    `draws` pairs, each with another sentence as the query, and with `query_like` up to `draws` query-like
    pairs after them), from (doc_id, title, text) documents in random order: from the held-out documents, or
    from all of them when those give none, so any collection with text is measured. A title several
    documents share is no query for one of them."""
    shared = shared_titles(title for _, title, _ in documents)
    pairs = {}
    for sample in ([d for d in documents if is_held_out(d[0])], documents):
        for doc_id, title, text in rng.sample(sample, len(sample)):
            unique_title = "" if title_key(title) in shared else title or ""
            drawn = held_out_pair(unique_title, text or "", rng, language, draws)
            if drawn and query_like and drawn[0][2] != "title":  # a title is a query-like pair already
                drawn += held_out_pair(unique_title, text or "", rng, language, draws, query_like=True)
            if drawn:
                pairs[doc_id] = drawn
            if len(pairs) == limit:
                return pairs
        if pairs:
            break
    return pairs


def title_key(title: str | None) -> str:
    """A title as documents are compared by it: lower-cased, single spaces."""
    return " ".join((title or "").split()).lower()


def shared_titles(titles) -> set[str]:
    """The title keys more than one document has (an article's sections): no query for any one of them."""
    return {key for key, n in collections.Counter(map(title_key, titles)).items() if n > 1}


def held_out_pair(
    title: str, text: str, rng: random.Random, language: str = "en", draws: int = 1, query_like: bool = False
) -> list[tuple[str, str, str]]:
    """Up to `draws` pairs (query, shortened text, kind), each one sentence (or span) of the text, drawn
    without repeats, and the text without it, kind "sentence" or "span" (with `query_like`, a run of the
    sentence's words and the text with some of them, kind "query"); the title and the whole text (kind
    "title") when the text is too short to lose a part; none when the document has neither."""
    parts, unit = passages(text, language)
    candidates = [i for i, part in enumerate(parts) if word_count(part) >= MIN_QUERY_WORDS]
    chosen = []
    if len(parts) >= 3 and candidates:
        chosen = rng.sample(candidates, min(draws, len(candidates)))
    elif len(parts) == 2 and candidates:  # two parts: the shorter one that is long enough is the query
        chosen = [min(candidates, key=lambda k: word_count(parts[k]))]
    if chosen and query_like:
        return [query_like_pair(parts, i, rng) for i in chosen]
    if chosen:
        return [(parts[i], " ".join(parts[:i] + parts[i + 1 :]), unit.removesuffix("s")) for i in chosen]
    title = " ".join(title.split())
    if (
        (word_count(title) >= 2 or (has_cjk(title) and len(title) >= 2))
        and text.strip()
        and after_title(text, title) is None
    ):
        return [(title, " ".join(text.split()), "title")]
    return []


def query_like_pair(parts: list[str], i: int, rng: random.Random) -> tuple[str, str, str]:
    """A run of QUERY_WORDS words of part i (where the script has no spaces, twice as many of its pieces:
    common/language.text_units) as the query, and the text with part i keeping each of the query's words
    with the chance QUERY_WORD_KEPT."""
    units, joiner = text_units(parts[i])
    length = rng.randint(*QUERY_WORDS) * (1 if joiner else CJK_CHARS_PER_WORD)
    length = min(length, len(units))
    start = rng.randrange(len(units) - length + 1)
    query = units[start : start + length]
    kept = []
    for unit in query:
        if unit.isspace() or rng.random() < QUERY_WORD_KEPT:  # a space is no word
            kept.append(unit)
        elif not joiner:  # a character taken out leaves a gap, so that two Latin words around it stay apart
            kept.append(" ")
    part = joiner.join(units[:start] + kept + units[start + length :])
    document = " ".join([*parts[:i], part, *parts[i + 1 :]])
    return joiner.join(query).strip(), " ".join(document.split()), "query"


def after_title(text: str, title: str) -> str | None:
    """The text after the title if the text begins with it (case, spacing and punctuation aside: such a
    title only repeats the text's first words), else None."""
    letters = [ch for ch in title.lower() if ch.isalnum()]
    if not letters:
        return None
    matched = 0
    for at, ch in enumerate(text):
        if not ch.isalnum():
            continue
        if ch.lower() != letters[matched]:
            return None
        matched += 1
        if matched == len(letters):
            return text[at + 1 :].lstrip(" .:;,-\u2013\u2014")
    return None


def standard_error(values) -> float:
    """The standard error of the mean of per-pair values (a numpy array; 0 for fewer than two): what the
    choices made on held-out pairs weigh a difference against."""
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
