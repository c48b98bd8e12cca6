"""Documents into stored rows: the content hash, chunks and their vectors.

Shared by `pipeline embed` (embed/run.py) and the server's document API (search/serve.py), so a
document stored either way is chunked, embedded and hashed alike.
"""
from __future__ import annotations

import hashlib
import json
from typing import Callable

import numpy as np

from common.chunking import chunk_texts
from common.models import embedding_text
from common.readers import Document
from common.store import ChunkRow


def content_hash(doc: Document) -> str:
    """Changes with anything stored about the document (the metadata counts only when there is some, so
    documents stored before metadata was kept keep their hash)."""
    parts = (doc.title, doc.source, doc.text) + ((json.dumps(doc.metadata, sort_keys=True),) if doc.metadata else ())
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def document_rows(docs: list[Document]) -> list[tuple[str, str, str, str, str, dict]]:
    """The rows Store.write_documents takes."""
    return [(d.id, d.title, d.source, d.text, content_hash(d), d.metadata) for d in docs]


def chunk_and_embed(docs: list[Document], tokenizer, embed_texts: Callable[[list[str]], np.ndarray], chunk_tokens: int,
                    overlap: int, first_chunk_id: int, dim: int) -> tuple[list[ChunkRow], np.ndarray]:
    """The documents' chunks, numbered from first_chunk_id, and their vectors (title + chunk embedded)."""
    rows: list[ChunkRow] = []
    texts: list[str] = []
    for doc, chunks in zip(docs, chunk_texts([d.text for d in docs], tokenizer, chunk_tokens, overlap)):
        for c in chunks:
            rows.append(ChunkRow(first_chunk_id + len(rows), doc.id, c.index, c.text, c.start_char, c.end_char, c.n_tokens))
            texts.append(embedding_text(doc.title, c.text))
    vectors = embed_texts(texts) if texts else np.zeros((0, dim), np.float32)
    return rows, vectors
