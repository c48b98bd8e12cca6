"""`pipeline index`: FAISS over the vectors in the store and BM25 over the chunks' text, brought up to the store.

`refresh_indexes` is the one way the indexes change, for `pipeline index` and the server's document API
alike: it updates the last build when little changed since it (index/update.py: the base kept, its
deleted chunks skipped, the chunks added since in a delta), and builds in full otherwise: the first time,
with --rebuild, for another index type or embedder, or when more than REBUILD_SHARE (10%) of the base was
added or deleted since. Either writes a new corpus snapshot beside the indexes, the documents and chunks as
search shows them (common/snapshot/writer.py), and is recorded in the manifest last (index/files.py), so a crash
mid-build leaves the previous index in use.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from common.console import info
from common.dense.reader import base_segment_dir
from common.errors import PipelineError
from common.language import LanguageMix
from common.lexical import (
    LANGUAGE_SAMPLE_CHUNKS,
    Analyzer,
    LexicalIndex,
    Segment,
    check_language,
    choose_analyzer,
)
from common.manifest import IndexEntry, read_manifest
from common.snapshot.writer import write_corpus
from common.store import Store
from common.workspace import Workspace, write_directory
from index.faiss_build import build_faiss
from index.files import record
from index.settings import IndexSettings
from index.shards import build_shards, update_shards
from index.update import Drifted, chunks_to_index, update, update_plan

DEFAULT_MEMORY_BUDGET = IndexSettings().memory_budget_bytes  # --memory-budget's default, in bytes


def refresh_indexes(
    ws: Workspace,
    kind: str = "auto",
    rebuild: bool = False,
    language: str = "auto",
    full_build_allowed: bool = True,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    shards: int | None = None,
    ray: str | None = None,
) -> IndexEntry:
    """Bring the indexes up to the store: an update of the last build when that is cheap and sound,
    else a full build (index/update.py's `update_plan` says which). `language` chooses BM25's analyzer
    (common/lexical/): auto detects it at a full build, and an update keeps the last build's. Without
    `full_build_allowed` (a document write through the server, which must answer quickly) the last build
    is updated even past REBUILD_SHARE, and says so: the next `pipeline index` then builds in full.
    `memory_budget` (bytes): an IVF index whose codes would take more is built with its lists on disk.
    `shards`: build the collection as that many shards (index/shards.py; on the Ray cluster `ray`), in full
    (a document write updates the shards it changed); None: as many as the last build had (none: one
    unsharded index). Returns the manifest's index section as recorded."""
    language = language.lower()
    check_language(language)
    manifest = read_manifest(ws)
    embedder, previous = manifest.embedder, manifest.index
    if embedder is None:
        raise PipelineError(f"workspace {ws.root} has no embedder: run `pipeline embed` first")
    if not full_build_allowed and previous is None:
        raise PipelineError(f"workspace {ws.root} has no index: run `pipeline index` first")
    if shards is None and previous is not None and previous.shards:
        shards = len(previous.shards)
    with Store(ws.db_path, read_only=True) as store:
        embedder.check_store(store.get_meta("embedder"), ws.db_path)
        generation = store.generation()
        live = store.chunk_ids()
        if len(live) == 0 and full_build_allowed:
            raise PipelineError(f"{ws.db_path}: no vectors stored; run `pipeline embed` first")
        if shards is not None and not full_build_allowed:  # a document write: only the shards it changed
            return record(ws, update_shards(ws, previous, store, generation), embedder, live, generation)
        if shards is not None:
            sample = [text for batch in store.iter_chunk_rows(language_sample(live)) for _, _, text in batch]
            analyzer, mix = choose_analyzer(sample, language)
            chosen = analyzer_record(analyzer, mix)
            reason = "full build (sharded: every build is full)"
            summary = build_shards(ws, shards, kind, store, generation, analyzer, memory_budget, reason, ray)
            return record(ws, {**summary, "analyzer": chosen}, embedder, live, generation)
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
    chosen = analyzer_record(analyzer, mix)
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
        "analyzer": chosen,
    }


def analyzer_record(analyzer: Analyzer, mix: LanguageMix | None) -> dict:
    """The manifest's record of BM25's analyzer and how it was chosen (detected: `mix`; else --language),
    said to the user too."""
    info(
        f"BM25 analyzer: {analyzer.describe()}; "
        + (f"languages detected: {mix.describe()}" if mix else "as --language chose")
    )
    return {
        **analyzer.to_json(),
        "chosen_by": "detected" if mix else "--language",
        "languages_detected": mix.shares if mix else None,
    }


def language_sample(live: np.ndarray) -> np.ndarray:
    """The chunks BM25's language is detected on: LANGUAGE_SAMPLE_CHUNKS of them drawn across the
    collection (seeded: the same store gives the same sample), ascending."""
    if len(live) <= LANGUAGE_SAMPLE_CHUNKS:
        return live
    return np.sort(np.random.default_rng(0).choice(live, LANGUAGE_SAMPLE_CHUNKS, replace=False))
