"""What each tokenizing process runs (pretrain/prepare.py starts them, or Ray Data runs them): light on
purpose, a process that imports only the readers, the tokenizer and numpy starts in a moment and holds
little memory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from common.heldout import is_held_out
from common.readers import Document, read_file
from common.workspace import atomic_write_json
from pretrain.tokenizer import END_OF_TEXT

BATCH_CHARS = 1 << 20  # text encoded at a time


def training_text(doc: Document) -> str:
    return f"{doc.title}\n{doc.text}" if doc.title else doc.text


def batches(documents: Iterator[Document], held_out: int) -> Iterator[tuple[list[str], list[str], list[int]]]:
    """(texts, split of each, UTF-8 size of each) in batches of about BATCH_CHARS characters."""
    texts, splits, sizes, chars = [], [], [], 0
    for doc in documents:
        text = training_text(doc)
        texts.append(text)
        splits.append("val" if is_held_out(doc.id, held_out) else "train")
        sizes.append(len(text.encode("utf-8")))
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield texts, splits, sizes
            texts, splits, sizes, chars = [], [], [], 0
    if texts:
        yield texts, splits, sizes


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest dtype of a token file for this vocabulary: uint16 up to 65,536 token types."""
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


_worker_tokenizer = None


def load_worker_tokenizer(path: str) -> None:
    global _worker_tokenizer
    from tokenizers import Tokenizer

    _worker_tokenizer = Tokenizer.from_file(path)


def encode_texts(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each text's token ids followed by <|endoftext|>, all in one array, and each text's length in it."""
    eot = _worker_tokenizer.token_to_id(END_OF_TEXT)
    dtype = token_dtype(_worker_tokenizer.get_vocab_size())
    flat: list[int] = []
    lengths = []
    for encoding in _worker_tokenizer.encode_batch(texts):
        ids = encoding.ids
        flat.extend(ids)
        flat.append(eot)
        lengths.append(len(ids) + 1)
    return np.array(flat, dtype=dtype), np.array(lengths, dtype=np.int64)


class ShardStream:
    """One split's shards, appended to as documents are tokenized: the open shard is closed at the first
    document end past `shard_tokens`. A stream made from a saved state cuts its open shard back to what
    that state counted (what was written after it is written again)."""

    def __init__(
        self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int, state: dict | None, first: int = 0
    ):
        self.directory, self.split, self.dtype, self.shard_tokens, self.first = (
            directory,
            split,
            dtype,
            shard_tokens,
            first,
        )
        state = state or {"closed": [], "open_tokens": 0, "open_documents": 0}
        self.closed = list(state["closed"])
        self.open_tokens, self.open_documents = state["open_tokens"], state["open_documents"]
        self.file = open(self.open_path(), "ab")
        self.file.truncate(self.open_tokens * dtype.itemsize)

    def open_path(self) -> Path:
        return self.directory / f"{self.split}-{self.first + len(self.closed):05d}.bin"

    def append(self, tokens: np.ndarray) -> bool:
        """Add one document's tokens; True when this closed a shard."""
        self.file.write(tokens.tobytes())
        self.open_tokens += len(tokens)
        self.open_documents += 1
        if self.open_tokens < self.shard_tokens:
            return False
        self.close_shard()
        self.file = open(self.open_path(), "wb")
        return True

    def close_shard(self) -> None:
        self.sync()
        self.file.close()
        self.closed.append(
            {"file": self.open_path().name, "tokens": self.open_tokens, "documents": self.open_documents}
        )
        self.open_tokens = self.open_documents = 0

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def state(self) -> dict:
        return {"closed": self.closed, "open_tokens": self.open_tokens, "open_documents": self.open_documents}

    def finish(self) -> list[dict]:
        """Close the last shard (an empty one is removed); the shards, in order."""
        if self.open_tokens:
            self.close_shard()
        else:
            self.file.close()
            self.open_path().unlink()
        return self.closed


def tokenize_file(task: dict) -> dict:
    """A Ray Data task: one input file's documents tokenized into shards of its own (train-FFFFF-NNNNN.bin,
    val-FFFFF-NNNNN.bin for file number FFFFF), recorded in done-FFFFF.json last, so that a run carried on
    after a failure skips the files already done. Returns the file's number, text bytes and shards."""
    directory, index = Path(task["directory"]), task["index"]
    done = directory / f"done-{index:05d}.json"
    if done.exists():
        return json.loads(done.read_text())
    load_worker_tokenizer(task["tokenizer"])
    dtype = token_dtype(_worker_tokenizer.get_vocab_size())
    streams = {
        split: ShardStream(directory, f"{split}-{index:05d}", dtype, task["shard_tokens"], None)
        for split in ("train", "val")
    }
    documents = (doc for doc, _ in read_file(Path(task["path"]), task["name"], task["text_field"]))
    text_bytes = 0
    for texts, splits, sizes in batches(documents, task["val_percent"]):
        tokens, lengths = encode_texts(texts)
        for piece, split in zip(np.split(tokens, np.cumsum(lengths)[:-1]), splits):
            streams[split].append(piece)
        text_bytes += sum(sizes)
    shards = {split: stream.finish() for split, stream in streams.items()}
    # The shards as JSON text: a row Ray Data carries as it is, whatever the lists hold (an empty one too).
    result = {"index": index, "text_bytes": text_bytes, "shards": json.dumps(shards)}
    atomic_write_json(done, result)
    return result
