"""Byte-level BPE tokenizer trained on the user's documents with Hugging Face `tokenizers`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

END_OF_TEXT = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable: no unknown tokens
        show_progress=False,
    )
    # On every core: common/__init__.py turns the library's threads off for the processes that encode.
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        tokenizer.train_from_iterator(texts, trainer=trainer)
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tmp = directory / ".tokenizer.json.tmp"
    tokenizer.save(str(tmp))
    tmp.replace(path)
    return path


def load_tokenizer(directory: Path) -> Tokenizer:
    return Tokenizer.from_file(str(directory / "tokenizer.json"))
