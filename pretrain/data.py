"""The batches training reads from the token shards pretrain/prepare.py wrote.

Each shard (a flat uint16/uint32 file, documents separated by <|endoftext|>) is memory-mapped and cut
into non-overlapping windows of seq_len + 1 tokens; the windows of all shards are numbered in shard
order. Training reads them in an order fixed by the seed and the epoch, so the batch of step N depends
only on (seed, N): a resumed run, or a run under another parallel plan, sees exactly the same tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np
import torch


class TokenWindows:
    """Non-overlapping windows of seq_len + 1 tokens over one split's shards (a window never spans two)."""

    def __init__(self, shards: list[np.ndarray], seq_len: int):
        self.shards, self.seq_len = shards, seq_len
        counts = [max(0, (len(s) - 1) // seq_len) for s in shards]
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # each shard's first window

    @classmethod
    def open(cls, data_dir: Path, split: str, seq_len: int) -> "TokenWindows":
        meta = json.loads((data_dir / "meta.json").read_text())
        # Data prepared before shards (one train.bin and one val.bin) is one shard a split.
        files = [s["file"] for s in meta["shards"][split]] if "shards" in meta else [f"{split}.bin"]
        return cls([np.memmap(data_dir / f, dtype=meta["dtype"], mode="r") for f in files], seq_len)

    def __len__(self) -> int:
        return int(self.first[-1])

    def window(self, i: int) -> np.ndarray:
        shard = int(np.searchsorted(self.first, i, side="right")) - 1
        start = (i - int(self.first[shard])) * self.seq_len
        return np.asarray(self.shards[shard][start : start + self.seq_len + 1], dtype=np.int64)

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
