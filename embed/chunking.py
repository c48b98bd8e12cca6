"""Split documents into overlapping windows of tokens of the embedding model's own tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A text longer than this is tokenized in pieces of about this many characters, each cut before a space: a
# tokenizer's offsets cost ~700 bytes a token while it holds them for a whole text, so one large document
# would need ~170x its size. A piece's first tokens may differ from a whole-text tokenization's (a cut inside
# a word of more than PIECE_CHARS / 2 characters): its windows are still cut from the text itself.
PIECE_CHARS = 1 << 16
PIECES_PER_CALL = 4  # pieces tokenized together (the tokenizer's threads): a quarter of a megabyte of text


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    start_char: int
    end_char: int
    n_tokens: int
    # The chunk's tokens as the document's tokenization gave them: a list for a text of one chunk, else a view
    # of the text's int32 array (a large document's tokens are not held as Python ints, 36 bytes each).
    token_ids: list[int] | np.ndarray


def window_starts(n_tokens: int, size: int, overlap: int) -> list[int]:
    """Start offsets of windows of `size` tokens, each overlapping the previous by `overlap`."""
    if n_tokens <= size:
        return [0]
    step = size - overlap
    starts = list(range(0, n_tokens - size, step))
    return starts + [n_tokens - size] if starts[-1] + size < n_tokens else starts


def whole_text_chunk(text: str, token_ids: list[int]) -> Chunk:
    """The one chunk of a text that fits in a window: all of it."""
    return Chunk(0, text, 0, len(text), len(token_ids), token_ids)


def tokenized_whole(text: str) -> bool:
    """Whether a text is tokenized in one call (else in pieces: tokenized_in_pieces)."""
    return len(text) <= PIECE_CHARS


def chunk_texts(texts: list[str], tokenizer, size: int, overlap: int) -> list[list[Chunk]]:
    """Chunks for each text. Chunk text is cut from the original by character offsets, so nothing is re-decoded."""
    if not 0 <= overlap < size:
        raise ValueError(f"overlap must be in [0, chunk size): got overlap {overlap}, size {size}")
    short = [i for i, text in enumerate(texts) if tokenized_whole(text)]
    encoded = (
        tokenizer([texts[i] for i in short], add_special_tokens=False, return_offsets_mapping=True) if short else {}
    )
    tokens = dict(zip(short, zip(encoded.get("input_ids", []), encoded.get("offset_mapping", []))))
    del encoded
    result = []
    for i, text in enumerate(texts):
        ids, offsets = tokens.pop(i) if i in tokens else tokenized_in_pieces(text, tokenizer)
        result.append(windows(text, ids, offsets, size, overlap))
    return result


def windows(text: str, ids: list[int] | np.ndarray, offsets, size: int, overlap: int) -> list[Chunk]:
    """A text's chunks from its token ids and their (start, end) character offsets."""
    if len(ids) <= size:
        return [whole_text_chunk(text, ids)]
    ids = np.asarray(ids, np.int32)
    chunks = []
    for i, start in enumerate(window_starts(len(ids), size, overlap)):
        end = min(start + size, len(ids))
        first, last = int(offsets[start][0]), int(offsets[end - 1][1])
        chunks.append(Chunk(i, text[first:last], first, last, end - start, ids[start:end]))
    return chunks


def piece_starts(text: str) -> list[int]:
    """Where a long text's pieces start: every PIECE_CHARS characters or fewer, at the last space of the
    piece's second half (at PIECE_CHARS where there is none, as in text without spaces)."""
    starts = [0]
    while len(text) - starts[-1] > PIECE_CHARS:
        limit = starts[-1] + PIECE_CHARS
        space = text.rfind(" ", starts[-1] + PIECE_CHARS // 2, limit)
        starts.append(space if space > 0 else limit)
    return starts


def tokenized_in_pieces(text: str, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """A long text's token ids (int32) and their character offsets (int32 (start, end) rows), tokenized
    PIECES_PER_CALL pieces at a time: 12 bytes a token, not the tokenizer's objects for the whole text."""
    starts = piece_starts(text)
    bounds = list(zip(starts, starts[1:] + [len(text)]))
    ids, offsets = [], []
    for first in range(0, len(bounds), PIECES_PER_CALL):
        group = bounds[first : first + PIECES_PER_CALL]
        encoded = tokenizer(
            [text[start:end] for start, end in group], add_special_tokens=False, return_offsets_mapping=True
        )
        for (start, _), piece_ids, piece_offsets in zip(group, encoded["input_ids"], encoded["offset_mapping"]):
            ids.append(np.asarray(piece_ids, np.int32))
            offsets.append(np.asarray(piece_offsets, np.int32).reshape(-1, 2) + start)
    return np.concatenate(ids), np.concatenate(offsets)
