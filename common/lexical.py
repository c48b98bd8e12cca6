"""The lexical (BM25) index over the stored chunks, with bm25s.

Shared by the stages that rank text lexically: `pipeline index` builds and saves it, search and the
default-mode measurement query it, and `pipeline tune` mines hard negatives with it.

Each chunk is indexed as its document's title followed by the chunk text (what the dense side embeds
too), lower-cased, English stop words removed, Snowball-stemmed. The index lives in its own directory
under the workspace's index/ folder: it is written to a temporary directory, renamed to a new
versioned name (lexical-<id>/) and only then recorded in the manifest, so a reader always finds a
complete index; `pipeline index` removes older versions afterwards.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import uuid
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

    def save(self, index_dir: Path) -> Path:
        """Write into a fresh versioned directory under index_dir and return it (the caller records it)."""
        index_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=index_dir, prefix=".lexical.staging."))
        try:
            self.retriever.save(str(staging))
            np.save(staging / "chunk_ids.npy", self.chunk_ids)
            (staging / "tokenizer.json").write_text(json.dumps({"stopwords": "en", "stemmer": LANGUAGE}))
            final = index_dir / f"lexical-{uuid.uuid4().hex[:12]}"
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return final

    @classmethod
    def load(cls, path: Path) -> "LexicalIndex":
        if not (path / "chunk_ids.npy").exists():
            raise PipelineError(f"{path}: lexical index missing; run `pipeline index`")
        return cls(bm25s.BM25.load(str(path)), np.load(path / "chunk_ids.npy"))

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best n (chunk ids, BM25 scores), best first; only chunks matching a query word, and only
        `allowed` chunk ids if given."""
        n = min(n, len(self.chunk_ids))
        tokens = tokenize([query])
        if n == 0 or not tokens[0]:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        mask = None
        if allowed is not None:
            mask = np.isin(self.chunk_ids, allowed).astype(np.float32)
        positions, scores = self.retriever.retrieve(tokens, k=n, weight_mask=mask, show_progress=False, n_threads=1)
        positions, scores = positions[0], scores[0]
        keep = scores > 0  # bm25s pads with zero-score documents that share no word with the query
        return self.chunk_ids[positions[keep]], scores[keep].astype(np.float32)

    def top_many(self, queries: list[str], k: int) -> list[np.ndarray]:
        """The best k chunk ids of each query, best first (batched: for many queries at once)."""
        k = min(k, len(self.chunk_ids))
        if k == 0:
            return [np.zeros(0, np.int64) for _ in queries]
        positions, scores = self.retriever.retrieve(tokenize(queries), k=k, show_progress=False)
        return [self.chunk_ids[p[s > 0]] for p, s in zip(positions, scores)]
