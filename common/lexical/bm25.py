"""BM25's formula (Lucene's variant, as bm25s: k1 = 1.5, b = 0.75), computed at query time from the live
chunks' statistics (the package docstring says why nothing stored depends on them)."""

from __future__ import annotations

import numpy as np

K1, B = 1.5, 0.75
SLACK = 1e-6  # relative: bounds and thresholds allow for float32 scores and float64 sums in another order


def idf_of(chunks: int, document_frequencies: np.ndarray) -> np.ndarray:
    """BM25's idf of terms held by these many of the collection's chunks, in float32."""
    return np.log(1 + (chunks - document_frequencies + 0.5) / (document_frequencies + 0.5)).astype(np.float32)


def mean_length_of(total_length: int, chunks: int) -> float:
    """A collection's average chunk length, as BM25's norms use it (at least 1)."""
    return max(total_length / chunks, 1.0) if chunks else 1.0


def average_length_of(lengths: np.ndarray) -> float:
    return mean_length_of(int(lengths.sum(dtype=np.int64)), len(lengths))


def norms_of(lengths: np.ndarray, average_length: float) -> np.ndarray:
    """BM25's length normalisation of each chunk, k1 * (1 - b + b * length / average length), in float32."""
    return (K1 * ((1 - B) + B * lengths / average_length)).astype(np.float32)
