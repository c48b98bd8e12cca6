"""Updating the last full build with what changed in the store: the base kept, a delta beside it.

A full build writes the base: a FAISS index (faiss-<id>.index) and a BM25 index of one segment
(lexical-<id>/segment-0/). An update (`update_plan`, `update`) keeps the base as it is; its chunks
deleted since are skipped at search (the store no longer holds them: they are tombstones), and every
chunk added since the base goes into a delta, rebuilt from the store at each update: an exact FAISS
index (faiss-delta-<id>.index), whose hits search merges with the base's, and a second BM25 segment.
Changed documents have new chunk ids (ids are never reused), so an update is an exact set difference:
a changed document's old chunks are deleted ones, its new chunks added ones. BM25 statistics are those
of the live chunks (computed on loading) and the delta's FAISS search is exact, so an updated flat
index answers as a full build over the same chunks would; an approximate base (HNSW, IVF) is searched
as before, without its deleted chunks. More than REBUILD_SHARE of the base added or deleted makes
`pipeline index` build in full: the delta is rebuilt at every update (its cost grows with it) and
deleted chunks still cost search time in the base.

The base segment's files in a new lexical directory are hard links to the previous version's: an
update does not copy the base. The corpus snapshot search reads (index/corpus.py) is written whole by an
update as by a full build: it holds the live chunks, which an update changes.
"""

from __future__ import annotations

import time

import numpy as np

from common.console import info
from common.index_files import base_segment_dir
from common.lexical import Analyzer, LexicalIndex, Segment
from common.manifest import EmbedderEntry, IndexEntry
from common.workspace import Workspace
from index.faiss_index import choose_type, make_index
from index.files import save_lexical, write_faiss

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
    base = Segment.load(base_dir)
    added = len(live) - int(np.isin(live, base.chunk_ids, assume_unique=True).sum())
    deleted = len(base.chunk_ids) - (len(live) - added)
    limit = REBUILD_SHARE * len(base.chunk_ids)
    if added > limit or deleted > limit:
        return None, (
            f"full build ({added:,} chunks added and {deleted:,} deleted since the last full build of "
            f"{len(base.chunk_ids):,}: over {REBUILD_SHARE:.0%})"
        )
    return (
        base,
        f"update ({added:,} chunks added and {deleted:,} deleted since the last full build of {len(base.chunk_ids):,})",
    )


def update(
    ws: Workspace,
    previous: IndexEntry,
    base: Segment,
    ids: np.ndarray,
    vectors: np.ndarray,
    chunk_rows: list,
    live: np.ndarray,
    update_reason: str,
) -> dict:
    """The last build's base with a new delta holding `ids` (every chunk added since the base)."""
    info(update_reason)
    start = time.perf_counter()
    delta_path = None
    if len(ids):
        delta = make_index("flat", vectors, ids)  # exact: small, and merged with the base's hits
        delta_path = write_faiss(delta, ws.index_dir, "faiss-delta")
    build_seconds = time.perf_counter() - start
    start = time.perf_counter()
    lexical_dir = save_lexical(LexicalIndex.with_delta(base, chunk_rows, live), ws.index_dir)
    lexical_seconds = time.perf_counter() - start
    info(f"delta of {len(ids):,} chunks: FAISS {build_seconds:.2f}s, BM25 {lexical_seconds:.2f}s")
    deleted = len(base.chunk_ids) - (len(live) - len(ids))
    kept = (  # the base's
        "path",
        "type",
        "reason",
        "dim",
        "base_vectors",
        "lists_path",
        "rescore_path",
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
        "delta_vectors": int(len(ids)),
        "deleted_in_base": int(deleted),
        "build_seconds": build_seconds,
        "lexical_path": str(lexical_dir.relative_to(ws.root)),
        "lexical_seconds": lexical_seconds,
    }
