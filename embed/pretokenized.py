"""Training batches from texts tokenized once, before training.

Tokenizing a batch's texts as the trainer collates it (the model's own preprocess) took three quarters of
a static tuning step on 2 CPU cores, and left a GPU idle between steps: a document comes back in many
batches as a hard negative, and a step's model work is small. Here each distinct text is tokenized once, in
chunks that the tokenizer spreads across the cores, and kept as an int32 array; a batch is then a
concatenation (a static embedder: every token, flat, with offsets) or a padded matrix (a transformer: the
first max_seq_length tokens, padded on the right, with the attention mask). The training dataset holds each
text's position among them, not the text: fetching a batch of long strings from the dataset cost more than
the step's model work on a GPU. Either is what the model's own preprocess gives for the same texts.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from common.embedder import TokenIds

TOKENIZE_CHUNK = 8192  # texts tokenized at a time: their Python lists of ints are short-lived


class PretokenizedTexts:
    """Called with texts (a text not seen before is tokenized then, and kept), or through `collator` with
    the texts' positions: the model's features for them."""

    def __init__(self, encode: Callable[[list[str]], list[list[int]]], features: Callable, texts: Iterable[str]):
        self.encode, self.make_features = encode, features
        self.position: dict[str, int] = {}
        self.ids: list[np.ndarray] = []
        self.add(list(dict.fromkeys(texts)))

    def add(self, texts: list[str]) -> None:
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            chunk = texts[start : start + TOKENIZE_CHUNK]
            for text, ids in zip(chunk, self.encode(chunk)):
                self.position[text] = len(self.ids)
                self.ids.append(np.asarray(ids, np.int32))

    def positions(self, texts: list[str]) -> list[int]:
        self.add([text for text in dict.fromkeys(texts) if text not in self.position])
        return [self.position[text] for text in texts]

    def features(self, positions: list[int]) -> dict:
        return self.make_features([self.ids[i] for i in positions])

    def __call__(self, inputs: list[str], prompt: str | None = None, **kwargs) -> dict:
        return self.features(self.positions([prompt + text for text in inputs] if prompt else inputs))

    def collator(self):
        """The trainer's data collator for a dataset whose columns hold text positions (`positions`): each
        column's features under its name, in the dataset's column order (the loss's anchor first)."""
        from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator

        texts = self

        class PositionsCollator(SentenceTransformerDataCollator):
            def __call__(self, rows: list[dict]) -> dict:
                batch = {}
                for column in rows[0]:
                    features = texts.features([row[column] for row in rows])
                    batch.update((f"{column}_{key}", value) for key, value in features.items())
                return batch

        return PositionsCollator(preprocess_fn=self)


def static_texts(tokenizer, texts: Iterable[str]) -> PretokenizedTexts:
    """A StaticEmbedding's: every token of a text (no special ones), by the fast tokenizer (TokenIds), flat,
    with each text's offset."""

    def features(arrays: list[np.ndarray]) -> dict:
        import torch

        lengths = np.fromiter(map(len, arrays), np.int64, len(arrays))
        offsets = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64)
        flat = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
        return {"input_ids": torch.from_numpy(flat), "offsets": torch.from_numpy(offsets)}

    return PretokenizedTexts(TokenIds(tokenizer), features, texts)


def transformer_texts(tokenizer, max_length: int, texts: Iterable[str]) -> PretokenizedTexts:
    """A sentence-transformers Transformer's: a text's first max_length tokens (the tokenizer's special
    tokens as it adds them), padded on the right to the batch's longest, with the attention mask."""

    def encode(chunk: list[str]) -> list[list[int]]:
        return tokenizer(chunk, truncation=True, max_length=max_length)["input_ids"]

    def features(arrays: list[np.ndarray]) -> dict:
        import torch

        width = max(map(len, arrays), default=0)
        ids = np.full((len(arrays), width), tokenizer.pad_token_id, np.int64)
        mask = np.zeros((len(arrays), width), np.int64)
        for row, array in enumerate(arrays):
            ids[row, : len(array)] = array
            mask[row, : len(array)] = 1
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask), "modality": "text"}

    return PretokenizedTexts(encode, features, texts)
