"""What language a collection is in, and its text cut into sentences or spans, for any language or script.

Three stages read text this way: `pipeline tune` makes training pairs from sentences, `pipeline index`
chooses the BM25 analyzer by language and measures the search modes on held-out sentences, and search
tokenizes queries as the index did. Tune detects the language of its documents and index that of the
stored chunks with the same function; what the index chose is written with it, and calibration and search
read it from there.

- Language: py3langid (langid.py's model, 97 languages) on an evenly spread sample of the documents; the
  collection's language is the most common one, and the shares of the others are reported.
- Sentences: sentencex (Wikimedia's rule-based segmenter, ~300 languages, abbreviations per language),
  which finds sentences in lower-case text, in text whose sentences start with "É" or "Я", and in Chinese
  and Japanese ("。" with no space after it), where a pattern of "[.!?], a space, a capital" finds none.
- Spans: a text with too few sentences (one sentence, a title and a line) is cut into spans of about
  SPAN_WORDS words instead, and so is a "sentence" too long to be one (a list, text without marks), so
  every text gives pairs and held-out queries. Chinese and Japanese, written without spaces, are counted in
  characters: CJK_CHARS_PER_WORD make a word.
"""

from __future__ import annotations

import collections
import functools
import re
from dataclasses import dataclass

LANGUAGE_SAMPLE = 300  # documents the language is detected on
DETECT_CHARS = 1_000  # characters of each sampled document
SPAN_WORDS = 16  # a span's length when a text has too few sentences
MIN_SPAN_WORDS = 6  # a short text's spans: no shorter (a query of fewer words says little)
LONGEST_SENTENCE = 100  # words: longer is no sentence (41 of SciFact's 5,183 abstracts have one)
CJK_CHARS_PER_WORD = 2  # Chinese and Japanese words are mostly one to three characters

# Han, Hiragana, Katakana (with its long-vowel mark) and Hangul: the scripts Lucene's CJK analyzer bigrams.
CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\uff66-\uff9f"
_CJK_CHAR = re.compile(f"[{CJK_RANGES}]")
_CJK_OR_WIDE = re.compile(f"[{CJK_RANGES}\uff01-\uff5e]")  # with full-width Latin letters and digits (ＡＢＣ１２３)
# A run of other characters among CJK ones (a Latin word, a number, "GPT-2", a URL) counts as one word, as
# text_units keeps it one piece.
_NON_CJK_WORD = re.compile(f"[^\\s{CJK_RANGES}]*[^\\W{CJK_RANGES}][^\\s{CJK_RANGES}]*")
_CJK_UNIT = re.compile(f"[{CJK_RANGES}]|[^\\s{CJK_RANGES}]+|\\s")  # a CJK character, a run of others, a space


@dataclass(frozen=True)
class LanguageMix:
    """The collection's language (ISO 639-1, as langid reports it) and the share of each language found
    in the sample, most common first."""

    language: str
    shares: dict[str, float]

    def describe(self) -> str:
        return ", ".join(f"{code} {share:.0%}" for code, share in list(self.shares.items())[:3])


def detect_languages(texts: list[str]) -> LanguageMix:
    """The languages of an evenly spread sample of the texts (empty ones skipped): English if none has text."""
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        return LanguageMix("en", {"en": 1.0})
    step = max(1, len(texts) // LANGUAGE_SAMPLE)
    sample = texts[::step][:LANGUAGE_SAMPLE]
    identify = _identifier()
    counts = collections.Counter(identify(text[:DETECT_CHARS])[0] for text in sample)
    shares = {code: n / len(sample) for code, n in counts.most_common()}
    return LanguageMix(next(iter(shares)), shares)


@functools.lru_cache(maxsize=1)
def _identifier():
    import py3langid  # loads its model (~0.2 s): only where a language is detected

    return py3langid.classify


def sentences(text: str, language: str = "en") -> list[str]:
    """The text's sentences, whitespace made single spaces, by the language's rules."""
    from sentencex import segment

    text = " ".join(text.split())
    return [s.strip() for s in segment(language, text) if s.strip()]


def word_count(text: str) -> int:
    """Words of a text, counting CJK_CHARS_PER_WORD characters of Chinese or Japanese as one."""
    cjk = len(_CJK_CHAR.findall(text))
    if not cjk:
        return len(text.split())
    return len(_NON_CJK_WORD.findall(text)) + cjk // CJK_CHARS_PER_WORD


def text_units(text: str) -> tuple[list[str], str]:
    """The text's words and " ", or, in a script written without spaces (Chinese, Japanese), its pieces and "":
    what the text is cut between, and what joins the pieces again. The pieces are each CJK character, each
    space, and each run of other characters between them (a Latin word or a number among the Chinese, with
    punctuation next to it), never cut."""
    text = " ".join(text.split())
    tokens = text.split(" ")
    if len(tokens) * 3 >= word_count(text):
        return tokens, " "
    return _CJK_UNIT.findall(text), ""


def spans(text: str, words: int = SPAN_WORDS) -> list[str]:
    """The text cut into consecutive spans of about `words` words (of characters, in a script without spaces)."""
    units, joiner = text_units(text)
    size = words if joiner else words * CJK_CHARS_PER_WORD
    cut = (joiner.join(units[i : i + size]).strip() for i in range(0, len(units), size))
    return [span for span in cut if span]


def passages(text: str, language: str = "en", minimum: int = 3) -> tuple[list[str], str]:
    """(parts, "sentences" or "spans"): the text's sentences when it has at least `minimum` (a "sentence"
    of more than LONGEST_SENTENCE words, a list or text without marks, cut into spans), else its spans:
    of SPAN_WORDS words, or shorter so that a short text still has `minimum` of them, but never shorter
    than MIN_SPAN_WORDS."""
    parts = []
    for sentence in sentences(text, language):
        parts.extend(spans(sentence) if word_count(sentence) > LONGEST_SENTENCE else [sentence])
    if len(parts) >= minimum:
        return parts, "sentences"
    return spans(text, min(SPAN_WORDS, max(MIN_SPAN_WORDS, word_count(text) // minimum))), "spans"


def has_cjk(text: str) -> bool:
    """Whether the text has CJK characters or full-width forms (which NFKC makes ordinary letters and digits)."""
    return _CJK_OR_WIDE.search(text) is not None


def cjk_tokens(lowered: str) -> list[str]:
    """Words of two or more characters and, for each run of CJK characters, its overlapping bigrams (a run
    of one character is itself), in text order: Lucene's CJK analyzer's tokens, as the BM25 index needs them
    where no space separates words."""
    tokens = []
    for match in re.finditer(f"[{CJK_RANGES}]+|[^\\W{CJK_RANGES}]{{2,}}", lowered):
        run = match.group()
        if _CJK_CHAR.match(run):
            tokens.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
        else:
            tokens.append(run)
    return tokens
