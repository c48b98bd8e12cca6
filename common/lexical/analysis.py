"""How text becomes BM25 terms, the same for chunks and queries (the Analyzer), and how a collection's is
chosen: by the language detected in it, or given with --language."""

from __future__ import annotations

import functools
import itertools
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import Stemmer

from common.console import warn
from common.errors import PipelineError
from common.language import LanguageMix, cjk_tokens, detect_languages, has_cjk
from common.lexical.bm25 import K1, B
from common.stopwords import STOPWORDS

LANGUAGE_SAMPLE_CHUNKS = 20_000  # chunks the collection's language is detected on (a seeded sample)
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
LANGUAGE_CHOICES = "auto (detected), none (no stop words or stemming), or an ISO 639-1 code (en, de, ru, ja, ...)"

# bm25s's (and scikit-learn's) token pattern, r"\b\w\w+\b", as it matches: each run of two or more word
# characters (faster without the boundary tests; measured:
# benchmarks/results/2026-11-28-design-measurements-cpu.md)
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

    @functools.cached_property  # asked for each query's words
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
