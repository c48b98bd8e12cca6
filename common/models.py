"""Loading an embedding model: any sentence-transformers directory (ours, exported by pretrain, or external).

Embed and search both load the model through here so a query is encoded exactly as the documents were.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

from common.console import info
from common.errors import PipelineError

# Chunk length for models without a token limit (static embeddings), the common 512 of passage
# retrieval: on SciFact's train queries, chunks of 480 tokens (+ the title) rather than 224 left the
# static embedder's nDCG@10 as it was (0.569) and raised BM25's from 0.692 to 0.699.
UNLIMITED_MODEL_CHUNK_TOKENS = 512


def load_embedder(path: Path, device: str | None = None):
    from sentence_transformers import SentenceTransformer
    import torch

    if not (path / "config.json").exists() and not (path / "modules.json").exists():
        raise PipelineError(f"{path}: not a model directory (no config.json or modules.json)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    info(f"loading the embedding model {path}")
    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    ensure_pad_token(model.tokenizer)
    return model


def ensure_pad_token(tokenizer) -> None:
    """GPT-style tokenizers have no padding token; padding is masked anyway, so end-of-text serves.
    (A static-embedding model's bare `tokenizers.Tokenizer` does not pad: nothing to do.)"""
    if getattr(tokenizer, "pad_token", "") is None:
        tokenizer.pad_token = tokenizer.eos_token


def text_tokenizer(model):
    """The model's tokenizer with Hugging Face's calling convention (offsets, batches): static-embedding
    models hold a bare `tokenizers.Tokenizer`, which gets wrapped."""
    from tokenizers import Tokenizer

    if isinstance(model.tokenizer, Tokenizer):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=model.tokenizer)
    return model.tokenizer


def token_limit(model) -> int:
    """The most tokens the model reads from one text."""
    limit = model.max_seq_length
    return int(limit) if limit and math.isfinite(limit) else UNLIMITED_MODEL_CHUNK_TOKENS


def truncate_to_model(model, texts: list[str], tokenizer=None) -> tuple[list[str], list[int]]:
    """Each text cut after the tokens the model reads (token_limit), at a token boundary of the original
    text, and each text's number of tokens. A transformer would drop the rest itself; a static model
    averages every token, so a text is cut to what chunks hold. `tokenizer`: text_tokenizer(model), made
    once by a caller that truncates often (wrapping a static model's tokenizer copies it)."""
    limit = token_limit(model)
    offsets = (tokenizer or text_tokenizer(model))(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    cut = [text if len(spans) <= limit else text[:spans[limit - 1][1]] for text, spans in zip(texts, offsets)]
    return cut, [len(spans) for spans in offsets]


def is_static(model) -> bool:
    """A static-embedding model (a table of token vectors): its forward pass is a lookup and its bare
    `tokenizers.Tokenizer` keeps no per-call state, so it may encode from several threads at once."""
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    return isinstance(model[0], StaticEmbedding)


def embedding_text(title: str, text: str) -> str:
    """What gets embedded for a chunk: its document's title, then the chunk."""
    return f"{title}\n{text}" if title else text


def encode(model, texts: list[str], batch_size: int = 64, on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """L2-normalised float32 embeddings: inner product = cosine similarity in the index. With on_batch,
    on_batch(number of texts encoded so far) is called after each batch: a transformer's texts are encoded
    one batch at a time, longest first (the batches sentence-transformers makes itself), a static model's
    STATIC_BATCH_TEXTS at a time (a tokenizer call each)."""
    static = is_static(model)
    step = STATIC_BATCH_TEXTS if static else batch_size
    if on_batch is not None and len(texts) > step:
        order = list(range(len(texts))) if static else sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors = np.zeros((len(texts), model.get_embedding_dimension()), np.float32)
        for start in range(0, len(texts), step):
            batch = order[start:start + step]
            vectors[batch] = encode(model, [texts[i] for i in batch], batch_size)
            on_batch(start + len(batch))
        return vectors
    if static:
        vectors = encode_static(model, texts)
    else:
        vectors = np.asarray(model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                          convert_to_numpy=True, show_progress_bar=False), dtype=np.float32)
    if on_batch is not None:
        on_batch(len(texts))
    return vectors


STATIC_BATCH_TEXTS = 1024  # texts per tokenizer call (it tokenizes a batch in parallel)


def encode_static(model, texts: list[str]) -> np.ndarray:
    """What `model.encode(texts, normalize_embeddings=True)` gives for a static embedding (the mean of each
    text's token vectors, L2-normalised), without sentence-transformers' per-call machinery: one query cost
    0.5-0.7 ms instead of 2.3-3.3 ms side by side on a loaded 2-core machine. The same tokenizer call as
    StaticEmbedding's; an empty text is all zeros."""
    module = model[0]
    table = module.embedding.weight.detach().numpy()
    out = np.zeros((len(texts), table.shape[1]), np.float32)
    for start in range(0, len(texts), STATIC_BATCH_TEXTS):
        encodings = module.tokenizer.encode_batch(texts[start:start + STATIC_BATCH_TEXTS], add_special_tokens=False)
        for i, encoding in enumerate(encodings, start):
            if encoding.ids:
                out[i] = table[encoding.ids].mean(axis=0)
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out
