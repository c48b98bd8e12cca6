"""The lexical (BM25) index over the stored chunks, with bm25s.

Shared by the stages that rank text lexically: `pipeline index` builds it and writes it into the
workspace (index/build.py names and swaps its versioned directory), search and the default-mode
measurement query it, and `pipeline tune` mines hard negatives with it before any index exists. It is
in common/ because three stages use it and no stage imports another; what only `pipeline index` does
(where the files go, when older versions are removed) is in index/build.py.

Each chunk is indexed as its document's title followed by the chunk text (what the dense side embeds
too), lower-cased, English stop words removed, Snowball-stemmed.
"""
from __future__ import annotations

import json
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from common.errors import PipelineError
from common.models import embedding_text

LANGUAGE = "english"
_stemmer = Stemmer.Stemmer(LANGUAGE)


def tokenize(texts: list[str]) -> list[list[str]]:
    """Lower-cased word tokens without English stop words, stemmed: the same for chunks and queries."""
    return bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer, return_ids=False, show_progress=False)


def query_terms(query: str) -> list[str]:
    """The stemmed terms BM25 matches for a query."""
    return tokenize([query])[0]


def stem_words(words: list[str]) -> list[str]:
    """Lower-cased words stemmed as the index stems them."""
    return _stemmer.stemWords(words)


class LexicalIndex:
    def __init__(self, retriever: bm25s.BM25, chunk_ids: np.ndarray):
        self.retriever = retriever
        self.chunk_ids = chunk_ids  # position in the BM25 corpus -> chunk id, sorted ascending

    @classmethod
    def build(cls, rows: list[tuple[int, str, str]]) -> "LexicalIndex":
        """rows: (chunk_id, document title, chunk text), in chunk_id order."""
        retriever = bm25s.BM25()
        retriever.index(tokenize([embedding_text(title or "", text or "") for _, title, text in rows]), show_progress=False)
        return cls(retriever, np.array([r[0] for r in rows], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def write(self, directory: Path) -> None:
        """Write the index's files into an existing, empty directory."""
        self.retriever.save(str(directory))
        np.save(directory / "chunk_ids.npy", self.chunk_ids)
        (directory / "tokenizer.json").write_text(json.dumps({"stopwords": "en", "stemmer": LANGUAGE}))

    @classmethod
    def load(cls, path: Path) -> "LexicalIndex":
        if not (path / "chunk_ids.npy").exists():
            raise PipelineError(f"{path}: lexical index missing; run `pipeline index`")
        return cls(bm25s.BM25.load(str(path)), np.load(path / "chunk_ids.npy"))

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best n (chunk ids, BM25 scores), best first; only chunks matching a query word, and only
        `allowed` chunk ids if given."""
        mask = np.isin(self.chunk_ids, allowed).astype(np.float32) if allowed is not None else None
        positions, scores = self.search_positions(query, n, mask)
        return self.chunk_ids[positions], scores

    def search_positions(self, query: str, n: int, weight_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best n (positions in the corpus, i.e. in chunk-id order; BM25 scores), best first; only
        chunks sharing a word with the query, and only where weight_mask (1.0 per allowed position) is set."""
        n = min(n, len(self.chunk_ids))
        tokens = tokenize([query])
        if n == 0 or not tokens[0]:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        positions, scores = self.retriever.retrieve(tokens, k=n, weight_mask=weight_mask, show_progress=False, n_threads=1)
        keep = scores[0] > 0  # bm25s pads with zero-score documents that share no word with the query
        return positions[0][keep].astype(np.int64), scores[0][keep].astype(np.float32)

    def top_many(self, queries: list[str], k: int) -> list[np.ndarray]:
        """The best k chunk ids of each query, best first (batched: for many queries at once)."""
        k = min(k, len(self.chunk_ids))
        if k == 0:
            return [np.zeros(0, np.int64) for _ in queries]
        positions, scores = self.retriever.retrieve(tokenize(queries), k=k, show_progress=False)
        return [self.chunk_ids[p[s > 0]] for p, s in zip(positions, scores)]
