"""A static embedder's training batches from texts tokenized once, before training.

Tokenizing a batch's texts as the trainer collates it (sentence-transformers' StaticEmbedding.preprocess)
took three quarters of a static tuning step on 2 CPU cores: the step's model work, a mean of token vectors
and its gradient, is cheap, and a document's text comes back in many batches as a hard negative. Here each
distinct text is tokenized once by the fast tokenizer (common.embedder.TokenIds, tiktoken when it gives the
same tokens), in chunks across the cores, and kept as an int32 array; a batch is then a concatenation.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from common.embedder import TokenIds

TOKENIZE_CHUNK = 8192  # texts tokenized at a time: their Python lists of ints are short-lived


class PretokenizedStatic:
    """Called as the collator's preprocess_fn: the StaticEmbedding's features for a batch of texts (every
    token, no special ones, flat, with each text's offset), the same as its own preprocess gives. A text not
    seen before is tokenized then, and kept."""

    def __init__(self, tokenizer, texts: Iterable[str]) -> None:
        self.token_ids = TokenIds(tokenizer)
        self.ids: dict[str, np.ndarray] = {}
        self.add(list(dict.fromkeys(texts)))

    def add(self, texts: list[str]) -> None:
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            chunk = texts[start : start + TOKENIZE_CHUNK]
            self.ids.update((text, np.asarray(ids, np.int32)) for text, ids in zip(chunk, self.token_ids(chunk)))

    def __call__(self, inputs: list[str], prompt: str | None = None, **kwargs) -> dict:
        import torch

        if prompt:
            inputs = [prompt + text for text in inputs]
        self.add([text for text in dict.fromkeys(inputs) if text not in self.ids])
        arrays = [self.ids[text] for text in inputs]
        lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        offsets = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64)
        flat = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
        return {"input_ids": torch.from_numpy(flat), "offsets": torch.from_numpy(offsets)}
