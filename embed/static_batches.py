"""A static embedder's training batches from texts tokenized once, before training.

Tokenizing a batch's texts as the trainer collates it (sentence-transformers' StaticEmbedding.preprocess)
took three quarters of a static tuning step on 2 CPU cores: the step's model work, a mean of token vectors
and its gradient, is cheap, and a document's text comes back in many batches as a hard negative. Here each
distinct text is tokenized once by the fast tokenizer (common.embedder.TokenIds, tiktoken when it gives the
same tokens), in chunks across the cores, and kept as an int32 array; a batch is then a concatenation. The
training dataset holds each text's position among them, not the text: fetching a batch of long strings from
the dataset cost more than the step's model work on a GPU.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from common.embedder import TokenIds

TOKENIZE_CHUNK = 8192  # texts tokenized at a time: their Python lists of ints are short-lived


class PretokenizedStatic:
    """The StaticEmbedding's features for a batch of texts (every token, no special ones, flat, with each
    text's offset), the same as its own preprocess gives: called with texts (a text not seen before is
    tokenized then, and kept), or through `collator` with the texts' positions."""

    def __init__(self, tokenizer, texts: Iterable[str]) -> None:
        self.token_ids = TokenIds(tokenizer)
        self.position: dict[str, int] = {}
        self.ids: list[np.ndarray] = []
        self.add(list(dict.fromkeys(texts)))

    def add(self, texts: list[str]) -> None:
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            chunk = texts[start : start + TOKENIZE_CHUNK]
            for text, ids in zip(chunk, self.token_ids(chunk)):
                self.position[text] = len(self.ids)
                self.ids.append(np.asarray(ids, np.int32))

    def positions(self, texts: list[str]) -> list[int]:
        self.add([text for text in dict.fromkeys(texts) if text not in self.position])
        return [self.position[text] for text in texts]

    def features(self, positions: list[int]) -> dict:
        import torch

        arrays = [self.ids[i] for i in positions]
        lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        offsets = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64)
        flat = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
        return {"input_ids": torch.from_numpy(flat), "offsets": torch.from_numpy(offsets)}

    def __call__(self, inputs: list[str], prompt: str | None = None, **kwargs) -> dict:
        return self.features(self.positions([prompt + text for text in inputs] if prompt else inputs))

    def collator(self):
        """The trainer's data collator for a dataset whose columns hold text positions (`positions`): each
        column's features under its name, in the dataset's column order (the loss's anchor first)."""
        from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator

        batches = self

        class PositionsCollator(SentenceTransformerDataCollator):
            def __call__(self, rows: list[dict]) -> dict:
                batch = {}
                for column in rows[0]:
                    features = batches.features([row[column] for row in rows])
                    batch.update((f"{column}_{key}", value) for key, value in features.items())
                return batch

        return PositionsCollator(preprocess_fn=self)
