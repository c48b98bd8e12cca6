"""The training data: the tokenizer and token files (prepare_data), and the batches training reads.

Documents are tokenized once into flat uint16/uint32 memmaps (train.bin / val.bin, documents
separated by <|endoftext|>). Training reads non-overlapping windows of seq_len + 1 tokens in an
order fixed by the seed and the epoch, so the batch of step N depends only on (seed, N): a
resumed run, or a run under another parallel plan, sees exactly the same tokens.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch
from tokenizers import Tokenizer

from common.console import info
from common.default_corpus import DEFAULT_CORPUS_SOURCE, stdlib_documents
from common.errors import PipelineError
from common.manifest import TokenizerEntry, write_section
from common.readers import Document, read_documents
from common.workspace import Workspace, atomic_write_json, file_sha256
from pretrain.config import TrainConfig
from pretrain.sizing import vocab_for
from pretrain.tokenizer import END_OF_TEXT, save_tokenizer, train_tokenizer


def training_texts(documents: Iterable[Document]) -> Iterator[str]:
    for doc in documents:
        yield f"{doc.title}\n{doc.text}" if doc.title else doc.text


def prepare_data(ws: Workspace, data_paths: list[Path], text_field: str | None, cfg: TrainConfig) -> dict:
    """Train the tokenizer and write the token files; returns the data section of the manifest.
    cfg.vocab_size 0 sizes the vocabulary to the corpus (and sets it). Nothing is written unless the
    corpus is usable; each file is written to a temporary name and renamed."""
    if data_paths:
        documents = list(read_documents(data_paths, text_field))
        sources = [str(p) for p in data_paths]
    else:
        documents = list(stdlib_documents())
        sources = [DEFAULT_CORPUS_SOURCE]
        info(
            "no --data given: training on the built-in corpus of Python standard library docstrings "
            f"({len(documents)} modules)"
        )
    if not documents:
        raise PipelineError(f"no documents with text in {', '.join(sources)}")
    if not cfg.vocab_size:  # sized to the corpus (pretrain/sizing.py)
        cfg.vocab_size = vocab_for(sum(len(text) for text in training_texts(documents)))
    info(f"training a {cfg.vocab_size}-token byte-level BPE tokenizer on {len(documents)} documents")
    tokenizer = train_tokenizer(training_texts(documents), cfg.vocab_size)
    train_tokens, val_tokens = tokenize_corpus(training_texts(documents), tokenizer, cfg.val_fraction, cfg.seq_len)
    # Everything is checked: from here on this is a new run. The previous run's checkpoints go first, so
    # that a `--resume` after a crash mid-way can never continue them on the new tokens.
    ws.create()
    shutil.rmtree(ws.checkpoints_dir, ignore_errors=True)
    save_tokenizer(tokenizer, ws.tokenizer_dir)
    meta = write_token_files(train_tokens, val_tokens, tokenizer.get_vocab_size(), ws.data_dir)
    info(f"tokenized: {meta['train_tokens']:,} training and {meta['val_tokens']:,} validation tokens")
    write_section(
        ws,
        TokenizerEntry(
            path="tokenizer",
            sha256=file_sha256(ws.tokenizer_dir / "tokenizer.json"),
            vocab_size=tokenizer.get_vocab_size(),
            sources=sources,
            documents=len(documents),
            report={key: value for key, value in meta.items() if key != "vocab_size"},
        ),
    )
    return meta


def tokenize_corpus(
    texts: Iterable[str], tokenizer: Tokenizer, val_fraction: float, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
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
        raise PipelineError(
            f"corpus too small: {len(tokens)} tokens, need at least {2 * (seq_len + 1)} for seq-len {seq_len}"
        )
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
        return np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)

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
