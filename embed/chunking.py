"""Split documents into overlapping windows of tokens of the embedding model's own tokenizer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    start_char: int
    end_char: int
    n_tokens: int
    token_ids: list[int]  # the chunk's tokens as the document's tokenization gave them


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


def chunk_texts(texts: list[str], tokenizer, size: int, overlap: int) -> list[list[Chunk]]:
    """Chunks for each text. Chunk text is cut from the original by character offsets, so nothing is re-decoded."""
    if not 0 <= overlap < size:
        raise ValueError(f"overlap must be in [0, chunk size): got overlap {overlap}, size {size}")
    if not texts:
        return []
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    result = []
    for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"]):
        if len(ids) <= size:
            result.append([whole_text_chunk(text, ids)])
            continue
        chunks = []
        for i, start in enumerate(window_starts(len(offsets), size, overlap)):
            end = min(start + size, len(offsets))
            first, last = offsets[start][0], offsets[end - 1][1]
            chunks.append(Chunk(i, text[first:last], first, last, end - start, ids[start:end]))
        result.append(chunks)
    return result
