"""`pipeline index`: FAISS over the vectors in the store and BM25 over the chunks' text, brought up to the store.

`refresh_indexes` is the one way the indexes change, for `pipeline index` and the server's document API
alike: it updates the last build when little changed since it (index/update.py: the base kept, its
deleted chunks skipped, the chunks added since in a delta), and builds in full otherwise: the first time,
with --rebuild, for another index type or embedder, or when more than REBUILD_SHARE (10%) of the base was
added or deleted since. Either writes a new corpus snapshot beside the indexes, the documents and chunks as
search shows them (index/corpus.py), and is recorded in the manifest last (index/files.py), so a crash
mid-build leaves the previous index in use.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np

from common.console import info, warn
from common.embedder import encode, load_embedder
from common.errors import PipelineError
from common.index_files import base_segment_dir
from common.lexical import LANGUAGE_SAMPLE_CHUNKS, LexicalIndex, Segment, check_language, choose_analyzer
from common.manifest import read_manifest
from common.store import Store
from common.workspace import Workspace
from index.corpus import write_corpus
from index.faiss_index import (
    INDEX_TYPES,
    TARGET_RECALL,
    choose_type,
    exact_neighbours,
    make_index,
    query_spans,
    recall_sample,
    tune_search,
)
from index.files import new_index_path, record, write_directory, write_faiss
from index.ivf import build_ivf, new_staging, remove_staging
from index.update import Drifted, update, update_plan

DEFAULT_MEMORY_BUDGET = 4 * 2**30  # bytes an IVF index's codes may take in memory before its lists go on disk


def refresh_indexes(
    ws: Workspace,
    kind: str = "auto",
    rebuild: bool = False,
    language: str = "auto",
    full_build_allowed: bool = True,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> dict:
    """Bring the indexes up to the store: an update of the last build when that is cheap and sound,
    else a full build (index/update.py's `update_plan` says which). `language` chooses BM25's analyzer
    (common/lexical.py): auto detects it at a full build, and an update keeps the last build's. Without
    `full_build_allowed` (a document write through the server, which must answer quickly) the last build
    is updated even past REBUILD_SHARE, and says so: the next `pipeline index` then builds in full.
    `memory_budget` (bytes): an IVF index whose codes would take more is built with its lists on disk."""
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
        summary = None
        if base is not None:
            ids, vectors, chunk_batches = chunks_to_index(store, live, base, vectors=previous.trained_path is None)
            try:
                summary = update(ws, previous, base, ids, vectors, chunk_batches, live, reason, store)
            except Drifted as drifted:
                if not full_build_allowed:
                    raise PipelineError(f"the index cannot be updated ({drifted}): run `pipeline index`") from None
                reason = str(drifted)
        if summary is None:
            sample = [text for batch in store.iter_chunk_rows(language_sample(live)) for _, _, text in batch]
            summary = full_build(ws, kind, store, live, sample, reason, language, memory_budget)
        start = time.perf_counter()
        # An update copies the last snapshot's unchanged documents; a full build reads them all again.
        previous_corpus = ws.root / previous.corpus_path if base is not None and previous.corpus_path else None
        corpus_dir = write_corpus(ws.index_dir, store, live, generation, previous_corpus)
        summary.update(corpus_path=str(corpus_dir.relative_to(ws.root)), corpus_seconds=time.perf_counter() - start)
        info(f"corpus snapshot for search written in {summary['corpus_seconds']:.2f}s to {corpus_dir}")
    return record(ws, summary, embedder, live, generation)


def full_build(
    ws: Workspace,
    kind: str,
    store: Store,
    live: np.ndarray,
    language_texts: list[str],
    update_reason: str,
    language: str = "auto",
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> dict:
    """language_texts: a sample of the chunks' texts (language_sample) BM25's language is detected on."""
    analyzer, mix = choose_analyzer(language_texts, language)
    info(
        f"BM25 analyzer: {analyzer.describe()}; "
        + (f"languages detected: {mix.describe()}" if mix else "as --language chose")
    )
    # BM25 is built while FAISS builds in a thread beside it (reading the store through a connection of its
    # own): FAISS lets go of the GIL and BM25's tokenizing fills the gaps in its use of the cores (100k
    # chunks, HNSW: 39 -> 35 s for both).
    with ThreadPoolExecutor(1) as pool:
        building = pool.submit(build_faiss, ws, kind, live, update_reason, memory_budget)
        start = time.perf_counter()
        lexical_dir = write_directory(
            lambda directory: LexicalIndex.write_built(directory, store.iter_chunk_rows(), analyzer),
            ws.index_dir,
            "lexical",
        )
        lexical_seconds = time.perf_counter() - start
        try:
            built = building.result()
        except BaseException:  # nothing names the BM25 index just written: it goes too
            shutil.rmtree(lexical_dir, ignore_errors=True)
            raise
    info(f"built in {built['build_seconds']:.2f}s; written to {ws.root / built['path']}")
    info(f"BM25 index over {len(live):,} chunks built in {lexical_seconds:.2f}s; written to {lexical_dir}")
    return {
        **built,
        "update": "full",
        "update_reason": update_reason,
        "base_vectors": int(len(live)),
        "delta_path": None,
        "delta_vectors": 0,
        "deleted_in_base": 0,
        "lexical_path": str(lexical_dir.relative_to(ws.root)),
        "lexical_seconds": lexical_seconds,
        "analyzer": {
            **analyzer.to_json(),
            "chosen_by": "detected" if mix else "--language",
            "languages_detected": mix.shares if mix else None,
        },
    }


def build_faiss(ws: Workspace, kind: str, ids: np.ndarray, why: str, memory_budget: int) -> dict:
    """A FAISS index of `kind` (auto: choose_type's choice) over the stored vectors of chunks `ids` (every
    live chunk), trained, filled and, when approximate, tuned (tune_search), written under the workspace's
    index directory. auto's HNSW that cannot reach TARGET_RECALL is replaced by IVF-PQ with rescoring
    when that reaches more. Returns the manifest's record of it: files, type, why, build seconds, recall@10
    and search widths (None for exact search)."""
    reason = f"--type {kind}"
    chosen = kind
    if kind == "auto":
        chosen, reason = choose_type(len(ids))
    if chosen in ("ivf", "ivfpq") and len(ids) < 39:
        raise PipelineError(f"--type {chosen} needs at least 39 vectors to train, the store has {len(ids)}")
    with Store(ws.db_path, read_only=True) as store:
        dim = int(store.get_meta("dim"))
        info(f"{why}: a {chosen} index over {len(ids):,} vectors of dimension {dim} ({reason})")
        queries = tuning_queries(ws, store, len(ids)) if chosen != "flat" else None
        built = build_and_tune(ws, chosen, store, ids, dim, memory_budget, queries)
        if kind == "auto" and chosen == "hnsw" and built["recall_at_10"] < TARGET_RECALL:
            info(f"HNSW reached recall@10 {built['recall_at_10']:.3f}: trying IVF-PQ with rescoring")
            other = build_and_tune(ws, "ivfpq", store, ids, dim, memory_budget, queries)
            if other["recall_at_10"] > built["recall_at_10"]:
                built, reason = other, f"{reason}; IVF-PQ with rescoring reached more recall than HNSW"
    recall = built["recall_at_10"]
    short = recall is not None and recall < TARGET_RECALL
    if short:
        warn(
            f"recall@10 {recall:.3f} is below the target {TARGET_RECALL} at the widest search tried "
            f"({built['search_setting']}): results may miss some of the nearest chunks; `pipeline index --type flat` "
            "searches exactly"
        )
    return {**built, "reason": reason, "dim": dim, "recall_target": TARGET_RECALL, "recall_short": short}


def tuning_queries(ws: Workspace, store: Store, n: int) -> np.ndarray | None:
    """The queries an approximate index is tuned with (index/faiss_index.py QUERY_WORDS): spans of
    recall_sample(n) stored documents (a seeded sample) embedded by the workspace's embedder as search embeds
    a query; None (stored vectors as queries) when no document has text."""
    spans = query_spans([text or "" for _, _, text in store.document_texts(recall_sample(n))])
    if not spans:
        return None
    return encode(load_embedder(read_manifest(ws).embedder.model_dir(ws)), spans)


def build_and_tune(
    ws: Workspace, kind: str, store: Store, ids: np.ndarray, dim: int, memory_budget: int, queries: np.ndarray | None
) -> dict:
    """Build, tune (on `queries`: tuning_queries) and write one index of `kind`; returns what the manifest
    records of it."""
    start = time.perf_counter()
    rescore, lists, trained, extra = None, None, None, {}
    if kind in ("ivf", "ivfpq"):
        staging = new_staging(ws.index_dir)
        # On-disk lists are found by their file's name, beside the index file: named after it from the start.
        path = new_index_path(ws.index_dir, "faiss")
        try:
            lists_name = path.with_suffix(".ivfdata").name
            built = build_ivf(
                kind, store, ids, dim, staging, memory_budget, recall_sample(len(ids)), lists_name, queries=queries
            )
            build_seconds = time.perf_counter() - start
            index, queries, truth, own_ids = built.index, built.queries, built.truth, built.own_ids
            recall, search_setting = tune_search(index, kind, queries, truth, own_ids, built.rescore)
            if built.on_disk_lists is not None:
                lists = built.on_disk_lists.rename(path.with_suffix(".ivfdata"))
            write_faiss(index, ws.index_dir, "faiss", path)
            rescore = (staging / "rescore.npy").rename(path.with_suffix(".rescore.npy"))
            built.trained.nprobe = search_setting["nprobe"]  # an update's delta is searched as the base is
            trained = write_faiss(built.trained, ws.index_dir, "faiss", path.with_suffix(".trained.index"))
            extra = {"centroid_distance": built.centroid_distance}
        finally:
            remove_staging(staging)
    else:
        _, vectors = store.load_vectors()
        index = make_index(kind, vectors, ids)
        build_seconds = time.perf_counter() - start
        recall, search_setting = None, None
        if kind != "flat":
            recall, search_setting = tune_search(
                index, kind, *exact_neighbours(ids, vectors, recall_sample(len(ids)), queries=queries)
            )
        path = write_faiss(index, ws.index_dir, "faiss")
    if recall is not None:
        info(
            f"recall@10 against exact search for {len(queries) if queries is not None else recall_sample(len(ids)):,} "
            + ("spans of its documents as queries" if queries is not None else "of its vectors as queries")
            + f": {recall:.3f} with "
            + ", ".join(f"{name} {value}" for name, value in search_setting.items())
            + f" (aiming at {TARGET_RECALL}; {time.perf_counter() - start - build_seconds:.1f}s)"
        )
    return {
        "type": kind,
        "path": str(path.relative_to(ws.root)),
        "lists_path": str(lists.relative_to(ws.root)) if lists else None,
        "rescore_path": str(rescore.relative_to(ws.root)) if rescore else None,
        "trained_path": str(trained.relative_to(ws.root)) if trained else None,
        **extra,
        "build_seconds": build_seconds,
        "recall_at_10": recall,
        "search_setting": search_setting,
    }


def chunks_to_index(
    store: Store, live: np.ndarray, base: Segment, vectors: bool = True
) -> tuple[np.ndarray, np.ndarray | None, Iterator[list[tuple[int, str, str]]]]:
    """(chunk ids, vectors (None without `vectors`), batches of (chunk id, title, text) rows read from the store
    as they are used) of the chunks added since the base, for an update."""
    only = np.setdiff1d(live, base.chunk_ids, assume_unique=True)
    loaded = store.load_vectors(only)[1] if vectors else None
    return only, loaded, store.iter_chunk_rows(only)


def language_sample(live: np.ndarray) -> np.ndarray:
    """The chunks BM25's language is detected on: LANGUAGE_SAMPLE_CHUNKS of them drawn across the
    collection (seeded: the same store gives the same sample), ascending."""
    if len(live) <= LANGUAGE_SAMPLE_CHUNKS:
        return live
    return np.sort(np.random.default_rng(0).choice(live, LANGUAGE_SAMPLE_CHUNKS, replace=False))
