"""Token files and batches.

Documents are tokenized once into flat uint16/uint32 memmaps (train.bin / val.bin, documents
separated by <|endoftext|>). Training reads non-overlapping windows of seq_len + 1 tokens in an
order fixed by the seed and the epoch, so the batch of step N depends only on (seed, N): a
resumed run, or a run under another parallel plan, sees exactly the same tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from tokenizers import Tokenizer

from common.errors import PipelineError
from common.workspace import atomic_write_json
from pretrain.tokenizer import END_OF_TEXT


def tokenize_corpus(texts: Iterable[str], tokenizer: Tokenizer, val_fraction: float, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """All texts as one token array, split into (train, val): the last `val_fraction` of tokens for
    validation. Nothing is written: a corpus too small for seq_len is refused first."""
    eot = tokenizer.token_to_id(END_OF_TEXT)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.uint32
    pieces: list[np.ndarray] = []
    batch: list[str] = []

    def flush() -> None:
        for enc in tokenizer.encode_batch(batch):
            pieces.append(np.asarray(enc.ids + [eot], dtype=dtype))
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) == 256:
            flush()
    flush()
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
    n_val = max(int(len(tokens) * val_fraction), seq_len + 1)
    if len(tokens) - n_val < seq_len + 1:
        raise PipelineError(f"corpus too small: {len(tokens)} tokens, need at least {2 * (seq_len + 1)} for seq-len {seq_len}")
    return tokens[:-n_val], tokens[-n_val:]


def write_token_files(train: np.ndarray, val: np.ndarray, vocab_size: int, data_dir: Path) -> dict:
    """train.bin, val.bin and meta.json, each written to a temporary name and renamed."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train), ("val", val)):
        tmp = data_dir / f".{name}.bin.tmp"
        part.tofile(tmp)
        tmp.replace(data_dir / f"{name}.bin")
    meta = {"dtype": train.dtype.name, "train_tokens": len(train), "val_tokens": len(val), "vocab_size": vocab_size}
    atomic_write_json(data_dir / "meta.json", meta)
    return meta


@dataclass
class TokenWindows:
    """Non-overlapping windows of seq_len + 1 tokens over one token file."""
    tokens: np.ndarray
    seq_len: int

    @classmethod
    def open(cls, data_dir: Path, split: str, seq_len: int) -> "TokenWindows":
        meta = json.loads((data_dir / "meta.json").read_text())
        tokens = np.memmap(data_dir / f"{split}.bin", dtype=meta["dtype"], mode="r")
        return cls(tokens, seq_len)

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def window(self, i: int) -> np.ndarray:
        start = i * self.seq_len
        return np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int64)

    def batch(self, indices: Iterable[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(np.stack([self.window(i) for i in indices]))
        return rows[:, :-1], rows[:, 1:]


def step_sample_indices(step: int, batch_size: int, n_windows: int, seed: int) -> list[int]:
    """Window indices of the global batch of optimizer step `step` (0-based).

    Samples are drawn in epochs: each epoch is a permutation of all windows seeded by (seed, epoch).
    """
    indices = []
    for sample in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(sample, n_windows)
        order = _epoch_order(seed, epoch, n_windows)
        indices.append(int(order[offset]))
    return indices


_order_cache: dict[tuple[int, int, int], np.ndarray] = {}


def _epoch_order(seed: int, epoch: int, n_windows: int) -> np.ndarray:
    key = (seed, epoch, n_windows)
    if key not in _order_cache:
        _order_cache.clear()
        _order_cache[key] = np.random.default_rng([seed, epoch]).permutation(n_windows)
    return _order_cache[key]
