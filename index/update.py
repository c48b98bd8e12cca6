"""Updating the last full build with what changed in the store: the base kept, a delta beside it.

A full build writes the base: a FAISS index (faiss-<id>.index) and a BM25 index of one segment
(lexical-<id>/segment-0/, the slices it was built in merged). An update (`update_plan`, `update`) keeps
the base as it is; its chunks deleted since are skipped at search (the store no longer holds them: they
are tombstones), and every chunk added since the base goes into a delta, rebuilt from the store at each
update: an exact FAISS index (faiss-delta-<id>.index), whose hits search merges with the base's, and a
second BM25 segment. Changed documents have new chunk ids (ids are never reused), so an update is an
exact set difference: a changed document's old chunks are deleted ones, its new chunks added ones. BM25
statistics are those of the live chunks (their document frequencies written with each version, the
rest computed on loading) and the delta's FAISS search is exact, so an updated flat index answers as a
full build over the same chunks would; an approximate base (HNSW, IVF) is searched as before, without
its deleted chunks. More than REBUILD_SHARE of the base added or deleted makes `pipeline index` build
in full: the delta is rebuilt at every update (its cost grows with it) and deleted chunks still cost
search time in the base.

The base segment's files in a new lexical directory are hard links to the previous version's: an
update does not copy the base. Its deleted chunks' terms are found by a pass over its postings (a range
at a time). The corpus snapshot search reads (common/snapshot/writer.py) is written anew from the last one and the
documents added or changed since.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import faiss
import numpy as np

from common.console import info
from common.dense.files import new_index_path, write_faiss
from common.dense.index_types import choose_type, make_index, recall_sample
from common.dense.ivf import build_ivf, new_staging, remove_staging
from common.dense.reader import base_segment_dir
from common.lexical import Analyzer, LexicalIndex, Segment
from common.manifest import EmbedderEntry, IndexEntry
from common.store import Store
from common.workspace import Workspace, write_directory

DRIFT_RATIO = 1.2  # added vectors this much further from an IVF base's centroids than its own: build in full
MIN_DRIFT_VECTORS = 100  # fewer added vectors say too little about drift
REBUILD_SHARE = (
    0.10  # chunks added or deleted since the last full build, as a share of it, beyond which `pipeline index` rebuilds
)


def update_plan(
    ws: Workspace,
    previous: IndexEntry | None,
    embedder: EmbedderEntry,
    kind: str,
    live: np.ndarray,
    rebuild: bool,
    language: str = "auto",
) -> tuple[Segment | None, str]:
    """Whether the last build can be updated to hold the chunks `live`: (its lexical base segment, why),
    or (None, why a full build). An update keeps the base (FAISS index and BM25 segment) as it is, skips
    its chunks that were deleted since, and puts every chunk added since the base into a delta. Deltas
    and deletions beyond REBUILD_SHARE of the base make a full build: the delta is rebuilt at every update
    (its cost grows with it) and deleted chunks still cost search time in the base."""
    if rebuild:
        return None, "full build (--rebuild)"
    if previous is None or previous.base_vectors is None:
        return None, "full build (no index of this version yet)"
    if not previous.built_by(embedder):
        return None, "full build (new embedder or chunking)"
    if language not in ("auto", previous.language):
        return None, f"full build (BM25 for --language {language}, the last build's is {previous.language})"
    wanted = choose_type(len(live))[0] if kind == "auto" else kind
    if wanted != previous.type:
        return None, f"full build ({wanted} index wanted, the last build is {previous.type})"
    base_dir = base_segment_dir(ws, previous)
    if not (ws.root / previous.path).exists() or not base_dir.is_dir():
        return None, "full build (the last build's files are missing)"
    if not Segment.exists(base_dir):
        return None, "full build (the last build's BM25 index is of an older layout)"
    base = Segment.load(base_dir)
    added = len(live) - int(np.isin(live, base.chunk_ids, assume_unique=True).sum())
    deleted = deleted_since(base, live, added)
    limit = REBUILD_SHARE * len(base.chunk_ids)
    if added > limit or deleted > limit:
        return None, f"full build ({update_summary(base, added, deleted)}: over {REBUILD_SHARE:.0%})"
    return base, f"update ({update_summary(base, added, deleted)})"


def deleted_since(base: Segment, live: np.ndarray, added: int) -> int:
    """How many of the base's chunks the store no longer holds, given the `live` chunks, `added` of them since."""
    return len(base.chunk_ids) - (len(live) - added)


def update_summary(base: Segment, added: int, deleted: int) -> str:
    return f"{added:,} chunks added and {deleted:,} deleted since the last full build of {len(base.chunk_ids):,}"


def update(
    ws: Workspace,
    previous: IndexEntry,
    base: Segment,
    ids: np.ndarray,
    vectors: np.ndarray,
    chunk_batches: Iterator[list[tuple[int, str, str]]],
    live: np.ndarray,
    update_reason: str,
    store: Store,
    index_dir: Path | None = None,
) -> dict:
    """The last build's base with a new delta holding `ids` (every chunk added since the base), whose
    (chunk id, title, text) rows `chunk_batches` reads from the store: exact (flat, from `vectors`) beside a
    flat or HNSW base; beside an IVF base, filled with the base's trained lists from the store (`vectors` is
    then None), unless the vectors added drifted from them (Drifted). Its files are written in index_dir (the
    workspace's index directory, or a shard's: index/shards.py)."""
    index_dir = index_dir or ws.index_dir
    info(update_reason)
    start = time.perf_counter()
    delta_path, delta_rescore = None, None
    if len(ids) and previous.trained_path:
        delta_path, delta_rescore = ivf_delta(ws, previous, store, ids, index_dir)
    elif len(ids):
        delta = make_index("flat", vectors, ids)  # exact: small, and merged with the base's hits
        delta_path = write_faiss(delta, index_dir, "faiss-delta")
    build_seconds = time.perf_counter() - start
    start = time.perf_counter()
    lexical_dir = write_directory(
        lambda directory: LexicalIndex.write_updated(directory, base, chunk_batches, live), index_dir, "lexical"
    )
    lexical_seconds = time.perf_counter() - start
    info(f"delta of {len(ids):,} chunks: FAISS {build_seconds:.2f}s, BM25 {lexical_seconds:.2f}s")
    deleted = deleted_since(base, live, len(ids))
    kept = (  # the base's
        "path",
        "type",
        "reason",
        "dim",
        "base_vectors",
        "lists_path",
        "rescore_path",
        "trained_path",
        "centroid_distance",
        "recall_at_10",
        "recall_target",
        "recall_short",
        "search_setting",
    )
    base_entry = previous.to_json()
    return {
        **{key: base_entry.get(key) for key in kept},
        "analyzer": previous.analyzer
        or {**Analyzer.load(base.source.parent).to_json(), "chosen_by": "an index from before languages"},
        "update": "incremental",
        "update_reason": update_reason,
        "delta_path": str(delta_path.relative_to(ws.root)) if delta_path else None,
        "delta_rescore_path": str(delta_rescore.relative_to(ws.root)) if delta_rescore else None,
        "delta_vectors": int(len(ids)),
        "deleted_in_base": int(deleted),
        "build_seconds": build_seconds,
        "lexical_path": str(lexical_dir.relative_to(ws.root)),
        "lexical_seconds": lexical_seconds,
    }


def chunks_to_index(
    store: Store, live: np.ndarray, base: Segment, vectors: bool = True
) -> tuple[np.ndarray, np.ndarray | None, Iterator[list[tuple[int, str, str]]]]:
    """(chunk ids, vectors (None without `vectors`), batches of (chunk id, title, text) rows read from the store
    as they are used) of the chunks added since the base, for an update."""
    only = np.setdiff1d(live, base.chunk_ids, assume_unique=True)
    loaded = store.load_vectors(only)[1] if vectors else None
    return only, loaded, store.iter_chunk_rows(only)


class Drifted(Exception):
    """The vectors added since an IVF base fit its trained lists worse than the base's own: build in full."""


def ivf_delta(ws: Workspace, previous: IndexEntry, store: Store, ids: np.ndarray, index_dir: Path) -> tuple[Path, Path]:
    """The delta of an IVF base: the chunks `ids` added in lists trained for the base (FAISS adds to trained
    lists without training again), with their rescoring rows; (index file, rescoring file). Raises Drifted
    when the added vectors are further from the base's centroids than DRIFT_RATIO times the base's vectors
    were (measured on a sample of each): their lists would then be searched with a worse fit."""
    trained = faiss.read_index(str(ws.root / previous.trained_path))
    path = new_index_path(index_dir, "faiss-delta")
    staging = new_staging(index_dir)
    try:
        dim = trained.d
        built = build_ivf(
            previous.type, store, ids, dim, staging, 0, recall_sample(len(ids)), "", trained=trained, on_disk=False
        )
        base_fit = previous.centroid_distance
        if base_fit and len(ids) >= MIN_DRIFT_VECTORS and built.centroid_distance > DRIFT_RATIO * base_fit:
            raise Drifted(
                f"full build (the {len(ids):,} vectors added since the last full build are "
                f"{built.centroid_distance / base_fit:.2f}x as far from its trained lists as its own: "
                f"over {DRIFT_RATIO}x)"
            )
        write_faiss(built.index, index_dir, "faiss-delta", path)
        rescore = (staging / "rescore.npy").rename(path.with_suffix(".rescore.npy"))
    finally:
        remove_staging(staging)
    return path, rescore
