"""The search kernel: the exact top n of one segment without scoring every posting (MaxScore, document at a
time, compiled with numba), and what it reads: a query's terms and a segment under the live statistics."""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from common.lexical.bm25 import SLACK
from common.lexical.segment import Segment


@dataclass
class QueryTerms:
    """A query's distinct terms (ids, ascending), which of them each query word is, in query order, how
    many words each is, and their idf."""

    terms: np.ndarray
    occurrences: np.ndarray
    multiplicity: np.ndarray  # float64
    idf: np.ndarray  # float32


class LiveSegment:
    """A segment as search reads it, under the live statistics: each row's position among the live chunks
    (-1: deleted) and its norm, and the factor r by which the norms at the segment's own average length
    may shrink: norm_live >= r * norm_own, with r = min(1, own average / live average)."""

    def __init__(self, segment: Segment, positions: np.ndarray, norms: np.ndarray, average_length: float):
        self.segment, self.positions, self.norms = segment, positions, norms
        self.all_live = bool((positions >= 0).all())  # no row deleted: rows need no check
        self.norm_scale = min(1.0, segment.average_length / average_length)


def segment_top(
    live: LiveSegment,
    query: QueryTerms,
    weight_mask: np.ndarray | None,
    n: int,
    threshold: float,
    walk_budget: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One query's best n chunks in one segment among those scoring at least `threshold`: (positions, float64
    scores), best first, ties by position. Terms are the query's distinct terms; a term's contribution to a
    chunk counts once per query word (its multiplicity). walk_budget: see max_score (None: exact)."""
    segment = live.segment
    held = query.terms < len(segment.indptr) - 1  # a term the segments after this one added is not here
    terms = np.where(held, query.terms, 0)
    starts = np.where(held, segment.indptr[terms], 0)
    stops = np.where(held, segment.indptr[terms + 1], 0)
    # Each term's bound on its contribution to a chunk (times its multiplicity): its best block's u = tf /
    # (tf + norm) at the segment's own average length bounds tf / (tf + r * norm) by u / (u + r (1 - u)).
    r = live.norm_scale
    upper = np.zeros(len(terms))
    for j, (first, end) in enumerate(zip(segment.block_indptr[terms], segment.block_indptr[terms + 1])):
        u = float(segment.block_max[first:end].max(initial=0.0)) if held[j] else 0.0
        upper[j] = query.multiplicity[j] * query.idf[j] * (1 + SLACK) * u / (u + r * (1 - u))
    mask = np.zeros(0, np.float32) if weight_mask is None else weight_mask
    rows, scores = max_score(
        segment.rows,
        segment.tfs,
        live.norms,
        live.positions,
        mask,
        weight_mask is not None,
        live.all_live,
        starts,
        stops,
        query.idf,
        query.multiplicity,
        query.occurrences,
        upper,
        n,
        threshold,
        -1 if walk_budget is None else walk_budget,
    )
    best = np.lexsort((rows, -scores))
    return live.positions[rows[best]].astype(np.int64), scores[best]


@numba.njit(cache=True, nogil=True)
def max_score(
    rows,
    tfs,
    norms,
    row_positions,
    mask,
    masked,
    all_live,
    starts,
    stops,
    idf,
    multiplicity,
    occurrences,
    upper,
    n,
    threshold,
    walk_budget,
):
    """MaxScore (Turtle and Flood), document at a time over the rows of the query's terms' postings, in row
    order: the terms ordered by bound; the first ones, whose bounds sum below the n-th best score so far
    (non-essential), only looked up (by binary search) for the rows the others hold, and only while the
    row can still reach that score. Exact: a row's score is its query words' float32 contributions summed
    in query order into float64, as the definition sums them. Returns (rows, scores) best first, ties by
    row (unordered). The GIL is released: the server's threads search side by side.
    walk_budget >= 0: the terms of lowest bound are non-essential from the start, as many as leave at most
    that many postings to walk (the term of highest bound is always walked): rows holding none of the walked
    terms are not found; a row found is still scored exactly."""
    m = len(starts)
    order = np.argsort(upper)
    bound_sums = np.cumsum(upper[order])  # bound_sums[i]: the bounds of terms order[0..i]
    at = starts[order].copy()
    ends = stops[order].copy()
    rank_of = np.empty(m, np.int64)  # query term j -> its place in `order`
    for i in range(m):
        rank_of[order[i]] = i
    contribution = np.zeros(m, np.float32)
    heap_scores = np.empty(n, np.float64)
    heap_rows = np.empty(n, np.int64)
    size = 0
    least = threshold * (1 - SLACK)  # a row below it cannot be among the best n
    essential = 0
    if walk_budget >= 0 and m > 0:
        essential = m - 1
        walked = ends[essential] - at[essential]
        while essential > 0 and walked + ends[essential - 1] - at[essential - 1] <= walk_budget:
            essential -= 1
            walked += ends[essential] - at[essential]
    while essential < m and bound_sums[essential] < least:
        essential += 1
    no_row = 1 << 62  # above every row
    while essential < m:
        row = no_row
        for i in range(essential, m):
            if at[i] < ends[i] and rows[at[i]] < row:
                row = rows[at[i]]
        if row == no_row:
            break
        allowed = True
        if not all_live or masked:
            position = row_positions[row]
            allowed = position >= 0 and (not masked or mask[position] > 0)
        partial = 0.0
        for i in range(m):
            contribution[i] = 0.0
        for i in range(essential, m):
            if at[i] < ends[i] and rows[at[i]] == row:
                if allowed:
                    tf = np.float32(tfs[at[i]])
                    contribution[i] = idf[order[i]] * tf / (tf + norms[row])
                    partial += multiplicity[order[i]] * contribution[i]
                at[i] += 1
        if not allowed:
            continue
        reachable = True
        for i in range(essential - 1, -1, -1):
            if partial + bound_sums[i] < least:
                reachable = False
                break
            low, high = at[i], ends[i]  # the first posting at or after `row`
            step = 1
            while low + step < high and rows[low + step] < row:  # galloping, then binary search
                low += step
                step *= 2
            high = min(high, low + step + 1)
            while low < high:
                middle = (low + high) // 2
                if rows[middle] < row:
                    low = middle + 1
                else:
                    high = middle
            at[i] = low
            if low < ends[i] and rows[low] == row:
                tf = np.float32(tfs[low])
                contribution[i] = idf[order[i]] * tf / (tf + norms[row])
                partial += multiplicity[order[i]] * contribution[i]
        if not reachable or partial < least:
            continue
        score = 0.0
        for j in occurrences:
            score += contribution[rank_of[j]]
        if size < n:
            if score < threshold:
                continue
            # sift up: the heap's root is the worst row (lowest score; of equal scores, the later row)
            k = size
            size += 1
            while k > 0:
                parent = (k - 1) // 2
                if heap_scores[parent] < score or (heap_scores[parent] == score and heap_rows[parent] > row):
                    break
                heap_scores[k], heap_rows[k] = heap_scores[parent], heap_rows[parent]
                k = parent
            heap_scores[k], heap_rows[k] = score, row
        elif score > heap_scores[0]:  # rows come in order: an equal score loses to the earlier row
            k = 0
            while True:
                child = 2 * k + 1
                if child >= n:
                    break
                if child + 1 < n and (
                    heap_scores[child + 1] < heap_scores[child]
                    or (heap_scores[child + 1] == heap_scores[child] and heap_rows[child + 1] > heap_rows[child])
                ):
                    child += 1
                if score < heap_scores[child] or (score == heap_scores[child] and row > heap_rows[child]):
                    break
                heap_scores[k], heap_rows[k] = heap_scores[child], heap_rows[child]
                k = child
            heap_scores[k], heap_rows[k] = score, row
        else:
            continue
        if size == n:
            least = max(least, heap_scores[0] * (1 - SLACK))
            while essential < m and bound_sums[essential] < least:
                essential += 1
    return heap_rows[:size], heap_scores[:size]
