"""Documents into stored rows: the content hash, chunks and their vectors.

Shared by `pipeline embed` (embed/run.py) and the server's document API (search/serve/generation.py), so a
document stored either way is chunked, embedded and hashed alike.
"""
from __future__ import annotations

import hashlib
import json
from typing import Callable

import numpy as np

from common.chunking import chunk_texts, whole_text_chunk
from common.models import embed_token_ids, embedding_text, encode, fed_token_ids, model_token_ids
from common.readers import Document
from common.store import ChunkRow


_SORTED_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(..., sort_keys=True), without a new encoder per call


def content_hash(doc: Document) -> str:
    """Changes with anything stored about the document (the metadata counts only when there is some, so
    documents stored before metadata was kept keep their hash)."""
    parts = (doc.title, doc.source, doc.text) + ((_SORTED_JSON.encode(doc.metadata),) if doc.metadata else ())
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def document_rows(docs: list[Document], digests: dict[str, str] | None = None) -> list[tuple[str, str, str, str, str, dict]]:
    """The rows Store.write_documents takes; digests: each document's content_hash, when known already."""
    return [(d.id, d.title, d.source, d.text, digests[d.id] if digests else content_hash(d), d.metadata) for d in docs]


def chunk_and_embed(docs: list[Document], model, tokenizer, chunk_tokens: int, overlap: int, first_chunk_id: int,
                    embed_inputs: Callable[[list[list[int]]], np.ndarray] | None = None,
                    on_progress: Callable[[float], None] | None = None, batch_size: int = 64) -> tuple[list[ChunkRow], np.ndarray]:
    """The documents' chunks, numbered from first_chunk_id, and their vectors (the title, then the chunk).

    `tokenizer`: text_tokenizer(model). The model is fed token ids (fed_token_ids): each document is
    tokenized once (by the fast tokenizer when there is one: model_token_ids) for its chunks and their
    vectors, and only a document longer than a chunk again with character offsets to cut it; a chunk's
    input is its title's tokens and a newline's, then its own (embed_token_ids: a static model averages
    their vectors, a transformer gets its special tokens around them). `embed_inputs` embeds those inputs
    elsewhere (actors on a Ray cluster). A transformer whose tokenizer frames texts in a way
    encode_token_ids does not know embeds each chunk's text. on_progress(share of the chunks embedded)
    follows each batch."""
    if not fed_token_ids(model, tokenizer):
        return _chunk_and_embed_texts(docs, model, tokenizer, chunk_tokens, overlap, first_chunk_id, on_progress, batch_size)
    token_ids_of = model_token_ids(model)
    token_ids = token_ids_of([d.text for d in docs])
    long = [i for i, ids in enumerate(token_ids) if len(ids) > chunk_tokens]
    chunks_of = dict(zip(long, chunk_texts([docs[i].text for i in long], tokenizer, chunk_tokens, overlap)))
    title_ids = token_ids_of([f"{d.title}\n" for d in docs])
    rows, inputs = [], []
    for i, doc in enumerate(docs):
        for c in chunks_of.get(i) or [whole_text_chunk(doc.text, token_ids[i])]:
            rows.append(ChunkRow(first_chunk_id + len(rows), doc.id, c.index, c.text, c.start_char, c.end_char, c.n_tokens))
            inputs.append(title_ids[i] + c.token_ids if doc.title else c.token_ids)
    if not inputs:
        return rows, np.zeros((0, model.get_embedding_dimension()), np.float32)
    if embed_inputs is not None:
        vectors = embed_inputs(inputs)
        if on_progress is not None:
            on_progress(1.0)
        return rows, vectors
    return rows, embed_token_ids(model, inputs, batch_size, on_progress and (lambda n: on_progress(n / len(inputs))))


def _chunk_and_embed_texts(docs: list[Document], model, tokenizer, chunk_tokens: int, overlap: int, first_chunk_id: int,
                           on_progress: Callable[[float], None] | None, batch_size: int) -> tuple[list[ChunkRow], np.ndarray]:
    """chunk_and_embed for a transformer that cannot be fed token ids: each chunk's text is encoded."""
    rows: list[ChunkRow] = []
    texts: list[str] = []
    for doc, chunks in zip(docs, chunk_texts([d.text for d in docs], tokenizer, chunk_tokens, overlap)):
        for c in chunks:
            rows.append(ChunkRow(first_chunk_id + len(rows), doc.id, c.index, c.text, c.start_char, c.end_char, c.n_tokens))
            texts.append(embedding_text(doc.title, c.text))
    if not texts:
        return rows, np.zeros((0, model.get_embedding_dimension()), np.float32)
    return rows, encode(model, texts, batch_size, on_progress and (lambda n: on_progress(n / len(texts))))
