"""What each tokenizing process runs (pretrain/corpus.py starts them): light on purpose, a process that
imports only the tokenizer and numpy starts in a moment and holds little memory."""

from __future__ import annotations

import numpy as np

from pretrain.tokenizer import END_OF_TEXT

_worker_tokenizer = None


def load_worker_tokenizer(path: str) -> None:
    global _worker_tokenizer
    from tokenizers import Tokenizer

    _worker_tokenizer = Tokenizer.from_file(path)


def encode_texts(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's token ids followed by <|endoftext|>, all in one array, and each text's length in it."""
    eot = _worker_tokenizer.token_to_id(END_OF_TEXT)
    dtype = np.uint16 if _worker_tokenizer.get_vocab_size() <= 65536 else np.uint32
    flat: list[int] = []
    lengths = []
    for encoding in _worker_tokenizer.encode_batch(texts):
        ids = encoding.ids
        flat.extend(ids)
        flat.append(eot)
        lengths.append(len(ids) + 1)
    return np.array(flat, dtype=dtype), np.array(lengths, dtype=np.int64)
