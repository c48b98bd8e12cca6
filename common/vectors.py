"""Compact vectors: each vector stored as int8 codes and one float scale (vector ~ codes * scale).

The codes are the vector divided by its largest component, times 127, rounded; the scale makes codes *
scale a unit vector again, so a stored vector's inner product with itself is 1 and no other vector's can
exceed it (rounding changes a vector's direction slightly, never its length).

The embedders' vectors are L2-normalised floats; 1,024 of them are 4 KB a chunk as float32, 41 GB at
ten million chunks. Scaled to int8 by their own largest component they are 1 KB and a float: the store
keeps them so (common/store/), and the index keeps a copy to re-score its candidates exactly
(index/, search/). Each vector carries its own scale, so nothing is trained: a vector written today
and one written a year later are coded alike, and updates never re-code the store.

On SciFact with the static embedder (`pipeline eval`, nDCG@10) these codes ranked nearly as well as float32
dense, and the default hybrid alike. A scalar quantizer trained per dimension was closer but needs training
on the collection; float16 (2 KB) was equal; keeping only the vectors' first dimensions lost clearly (the
embedder was not trained for truncation). Measured: benchmarks/results/2026-11-28-design-measurements-cpu.md.
"""

from __future__ import annotations

import numba
import numpy as np

LEVELS = 127  # int8 codes in [-127, 127]


def quantize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes [n, dim], float32 scales [n]) of float vectors [n, dim]."""
    vectors = np.asarray(vectors, dtype=np.float32)
    largest = np.abs(vectors).max(axis=1) if vectors.size else np.zeros(len(vectors), np.float32)
    codes = np.rint(vectors * (LEVELS / np.where(largest > 0, largest, 1.0))[:, None]).astype(np.int8)
    lengths = np.linalg.norm(codes.astype(np.float32), axis=1)
    return codes, np.where(lengths > 0, 1.0 / np.maximum(lengths, 1e-30), 0.0).astype(np.float32)


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The float32 vectors [n, dim] the codes stand for."""
    return codes.astype(np.float32) * np.asarray(scales, dtype=np.float32)[:, None]


def scores(query: np.ndarray, codes: np.ndarray, scales: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Inner products of one float query [dim] with the coded vectors at `rows` (int64) of codes [n, >= dim]
    (int8, each row's codes first and contiguous: the rescoring file's records as bytes do) and scales [n]:
    read where they lie (a memory-mapped file's pages), never copied or converted as a whole."""
    return _scores(np.asarray(query, dtype=np.float32), codes, scales, rows)


# fastmath: the sum of a row's products may be reordered, so it runs in SIMD lanes (faster than a strict
# order); the interpreter lock is released, so searches re-score side by side. Many times faster than numpy's
# gather, conversion and product of a query's candidate rows (measured:
# benchmarks/results/2026-11-28-design-measurements-cpu.md).
@numba.njit(cache=True, nogil=True, fastmath=True)
def _scores(query, codes, scales, rows):
    dim = query.shape[0]
    found = np.empty(len(rows), np.float32)
    for i in range(len(rows)):
        row = rows[i]
        total = np.float32(0.0)
        for j in range(dim):
            total += np.float32(codes[row, j]) * query[j]
        found[i] = total * scales[row]
    return found
