"""Stop-word lists by ISO 639-1 code: bm25s's lists, read without importing the bm25s package.

bm25s's package __init__ imports its top-k selection, which imports JAX whenever JAX is installed and
calls it at import time: XLA then preallocates most of a GPU's memory, in a process that only wanted
word lists. Its `stopwords` module is plain data (no imports), so it is loaded from its file on its own.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

# bm25s's list of each language that has one; a language without one keeps every word
LISTS = {
    "en": "STOPWORDS_EN",
    "da": "STOPWORDS_DANISH",
    "nl": "STOPWORDS_DUTCH",
    "fr": "STOPWORDS_FRENCH",
    "de": "STOPWORDS_GERMAN",
    "it": "STOPWORDS_ITALIAN",
    "no": "STOPWORDS_NORWEGIAN",
    "nb": "STOPWORDS_NORWEGIAN",
    "pt": "STOPWORDS_PORTUGUESE",
    "ru": "STOPWORDS_RUSSIAN",
    "es": "STOPWORDS_SPANISH",
    "sv": "STOPWORDS_SWEDISH",
    "tr": "STOPWORDS_TURKISH",
}


def _bm25s_stopwords_module() -> ModuleType:
    """bm25s/stopwords.py executed as a module of its own (the package's __init__ is not run)."""
    package = importlib.util.find_spec("bm25s")  # finds the package without importing it
    if package is None or not package.submodule_search_locations:
        raise ImportError("bm25s is not installed (its stop-word lists are a dependency: pip install bm25s)")
    path = Path(next(iter(package.submodule_search_locations))) / "stopwords.py"
    spec = importlib.util.spec_from_file_location("_bm25s_stopwords", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_module = _bm25s_stopwords_module()
STOPWORDS: dict[str, tuple[str, ...]] = {code: tuple(getattr(_module, name)) for code, name in LISTS.items()}
