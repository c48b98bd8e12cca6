"""`pipeline index`: FAISS over the vectors in the store and BM25 over the chunks' text, brought up to the store.

`refresh_indexes` is the one way the indexes change, for `pipeline index` and the server's document API
alike: it updates the last build when little changed since it (index/update.py: the base kept, its
deleted chunks skipped, the chunks added since in a delta), and builds in full otherwise: the first time,
with --rebuild, for another index type or embedder, or when more than REBUILD_SHARE (10%) of the base was
added or deleted since. Either is recorded in the manifest last (index/files.py), so a crash mid-build
leaves the previous index in use.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

from common.console import info
from common.errors import PipelineError
from common.index_files import base_segment_dir
from common.lexical import LANGUAGE_SAMPLE_CHUNKS, LexicalIndex, Segment, check_language, choose_analyzer
from common.manifest import read_manifest
from common.store import Store
from common.workspace import Workspace
from index.faiss_index import INDEX_TYPES, RECALL_SAMPLE, TARGET_RECALL, choose_type, make_index, tune_search
from index.files import record, save_lexical, write_faiss
from index.update import update, update_plan


def refresh_indexes(
    ws: Workspace, kind: str = "auto", rebuild: bool = False, language: str = "auto", full_build_allowed: bool = True
) -> dict:
    """Bring the indexes up to the store: an update of the last build when that is cheap and sound,
    else a full build (index/update.py's `update_plan` says which). `language` chooses BM25's analyzer
    (common/lexical.py): auto detects it at a full build, and an update keeps the last build's. Without
    `full_build_allowed` (a document write through the server, which must answer quickly) the last build
    is updated even past REBUILD_SHARE, and says so: the next `pipeline index` then builds in full."""
    if kind not in INDEX_TYPES:
        raise PipelineError(f"--type: unknown index type '{kind}' (choose from {', '.join(INDEX_TYPES)})")
    language = language.lower()
    check_language(language)
    manifest = read_manifest(ws)
    embedder, previous = manifest.embedder, manifest.index
    if embedder is None:
        raise PipelineError(f"workspace {ws.root} has no embedder: run `pipeline embed` first")
    if not full_build_allowed and previous is None:
        raise PipelineError(f"workspace {ws.root} has no index: run `pipeline index` first")
    with Store(ws.db_path, read_only=True) as store:
        embedder.check_store(store.get_meta("embedder"), ws.db_path)
        generation = store.generation()
        live = store.chunk_ids()
        if len(live) == 0 and full_build_allowed:
            raise PipelineError(f"{ws.db_path}: no vectors stored; run `pipeline embed` first")
        base, reason = update_plan(
            ws, previous, embedder, kind if full_build_allowed else previous.type, live, rebuild, language
        )
        if base is None and not full_build_allowed:
            base_dir = base_segment_dir(ws, previous)
            if previous.base_vectors is None or not Segment.exists(base_dir):
                raise PipelineError(f"the index cannot be updated ({reason}): run `pipeline index`")
            base = Segment.load(base_dir)
            reason = f"update, though {reason.removeprefix('full build (').rstrip(')')}: `pipeline index` will rebuild"
        # BM25 reads the chunks' texts from the store as it builds: the store stays open until it is built.
        ids, vectors, chunk_batches = chunks_to_index(store, live, base)
        if base is None:
            sample = [text for batch in store.iter_chunk_rows(language_sample(live)) for _, _, text in batch]
            summary = full_build(ws, kind, ids, vectors, chunk_batches, sample, reason, language)
        else:
            summary = update(ws, previous, base, ids, vectors, chunk_batches, live, reason)
    return record(ws, summary, embedder, live, generation)


def full_build(
    ws: Workspace,
    kind: str,
    ids: np.ndarray,
    vectors: np.ndarray,
    chunk_batches: Iterator[list[tuple[int, str, str]]],
    language_texts: list[str],
    update_reason: str,
    language: str = "auto",
) -> dict:
    """language_texts: a sample of the chunks' texts (language_sample) BM25's language is detected on."""
    analyzer, mix = choose_analyzer(language_texts, language)
    info(
        f"BM25 analyzer: {analyzer.describe()}; "
        + (f"languages detected: {mix.describe()}" if mix else "as --language chose")
    )
    # BM25 is built while FAISS builds in a thread beside it: FAISS lets go of the GIL and BM25's
    # tokenizing fills the gaps in its use of the cores (100k chunks, HNSW: 39 -> 35 s for both).
    with ThreadPoolExecutor(1) as pool:
        building = pool.submit(build_faiss, kind, ids, vectors, update_reason)
        start = time.perf_counter()
        lexical_dir = save_lexical(
            lambda directory: LexicalIndex.write_built(directory, chunk_batches, analyzer), ws.index_dir
        )
        lexical_seconds = time.perf_counter() - start
        try:
            faiss_index = building.result()
            index, build_seconds = faiss_index["index"], faiss_index["build_seconds"]
            path = write_faiss(index, ws.index_dir, "faiss")
        except BaseException:  # BM25 was written as it was built: a failed build leaves none of its files
            shutil.rmtree(lexical_dir, ignore_errors=True)
            raise
    info(f"built in {build_seconds:.2f}s; written to {path}")
    info(f"BM25 index over {len(ids):,} chunks built in {lexical_seconds:.2f}s; written to {lexical_dir}")
    return {
        "path": str(path.relative_to(ws.root)),
        **{key: faiss_index[key] for key in ("type", "reason", "recall_at_10", "search_setting")},
        "dim": int(vectors.shape[1]),
        "update": "full",
        "update_reason": update_reason,
        "base_vectors": int(len(ids)),
        "delta_path": None,
        "delta_vectors": 0,
        "deleted_in_base": 0,
        "build_seconds": build_seconds,
        "lexical_path": str(lexical_dir.relative_to(ws.root)),
        "lexical_seconds": lexical_seconds,
        "analyzer": {
            **analyzer.to_json(),
            "chosen_by": "detected" if mix else "--language",
            "languages_detected": mix.shares if mix else None,
        },
    }


def build_faiss(kind: str, ids: np.ndarray, vectors: np.ndarray, why: str) -> dict:
    """A FAISS index of `kind` (auto: choose_type's choice) over the vectors, trained, filled and, when
    approximate, tuned (tune_search). Returns the index, its type, why that type, build seconds (train +
    add), recall@10 and search width (None for exact search)."""
    reason = f"--type {kind}"
    if kind == "auto":
        kind, reason = choose_type(len(ids))
    if kind in ("ivf", "ivfpq") and len(ids) < 39:
        raise PipelineError(f"--type {kind} needs at least 39 vectors to train, the store has {len(ids)}")
    info(f"{why}: a {kind} index over {len(ids):,} vectors of dimension {vectors.shape[1]} ({reason})")
    start = time.perf_counter()
    index = make_index(kind, vectors, ids)
    build_seconds = time.perf_counter() - start
    recall, search_setting = None, None
    if kind != "flat":
        start = time.perf_counter()
        recall, search_setting = tune_search(index, kind, ids, vectors)
        ((parameter, width),) = search_setting.items()
        info(
            f"recall@10 against exact search on {min(RECALL_SAMPLE, len(ids)):,} of its vectors: {recall:.3f} "
            f"with {parameter} {width} (aiming at {TARGET_RECALL}; {time.perf_counter() - start:.1f}s)"
        )
    return {
        "index": index,
        "type": kind,
        "reason": reason,
        "build_seconds": build_seconds,
        "recall_at_10": recall,
        "search_setting": search_setting,
    }


def chunks_to_index(
    store: Store, live: np.ndarray, base: Segment | None
) -> tuple[np.ndarray, np.ndarray, Iterator[list[tuple[int, str, str]]]]:
    """(chunk ids, vectors, batches of (chunk id, title, text) rows read from the store as they are used) of
    every stored chunk for a full build (no base), or of those added since the base for an update."""
    only = None if base is None else np.setdiff1d(live, base.chunk_ids, assume_unique=True)
    ids, vectors = store.load_vectors(only)
    return ids, vectors, store.iter_chunk_rows(only)


def language_sample(live: np.ndarray) -> np.ndarray:
    """The chunks BM25's language is detected on: LANGUAGE_SAMPLE_CHUNKS of them drawn across the
    collection (seeded: the same store gives the same sample), ascending."""
    if len(live) <= LANGUAGE_SAMPLE_CHUNKS:
        return live
    return np.sort(np.random.default_rng(0).choice(live, LANGUAGE_SAMPLE_CHUNKS, replace=False))
