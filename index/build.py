"""`pipeline index`: FAISS over the vectors in the store and BM25 over the chunks' text, built in full or updated.

Vectors are L2-normalised, so every index uses inner product (= cosine similarity). Chunk ids are
kept through IndexIDMap2. A run updates the last build when little changed since it (common/indexes.py:
the base kept, its deleted chunks skipped, the chunks added since in a delta), and builds in full
otherwise: the first time, with --rebuild, for another index type or embedder, or when more than
REBUILD_SHARE (10%) of the base was added or deleted since. The full build is here; both are recorded
in the manifest last, so a crash mid-build leaves the previous index in use.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import faiss
import numpy as np

from common.console import info
from common.errors import PipelineError
from common.indexes import chunks_to_index, check_store, choose_type, make_index, record, save_lexical, update, update_plan, write_faiss
from common.lexical import LexicalIndex, check_language, choose_analyzer
from common.store import Store
from common.workspace import Workspace

INDEX_TYPES = ("auto", "flat", "hnsw", "ivf", "ivfpq")


# An approximate index is searched as broadly as it takes to find this share of the exact top 10 (on a
# sample of its own vectors as queries), within the limits below.
TARGET_RECALL = 0.95
MAX_EF_SEARCH = 1024  # HNSW: beyond this a search costs more than the graph saves
RECALL_SAMPLE = 1000


def exact_neighbours(ids: np.ndarray, vectors: np.ndarray, sample: int = RECALL_SAMPLE, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query vectors, ids of their exact 10 nearest stored vectors, the queries' own ids) for a sample of
    stored vectors as queries; each query's own vector is left out of its neighbours (a new query is not
    in the index)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(vectors), size=min(sample, len(vectors)), replace=False))
    # faiss.knn reads the vectors where they are (an IndexFlat would copy them: 4 GB at a million)
    _, found = faiss.knn(vectors[rows], vectors, min(11, len(vectors)), metric=faiss.METRIC_INNER_PRODUCT)
    return vectors[rows], np.array([[ids[r] for r in row if r != own][:10] for row, own in zip(found, rows)]), ids[rows]


def recall_at_10(index: faiss.Index, queries: np.ndarray, truth: np.ndarray, own_ids: np.ndarray) -> float:
    """Share of the exact top 10 (`truth`, exact_neighbours) that the index finds, leaving out each query's own id."""
    if truth.shape[1] == 0:  # an index of one vector: nothing else to find
        return 1.0
    _, found = index.search(queries, truth.shape[1] + 1)
    return float(np.mean([len(set(t) & (set(f) - {own})) / len(t) for t, f, own in zip(truth, found, own_ids)]))


def tune_search(index: faiss.Index, kind: str, ids: np.ndarray, vectors: np.ndarray) -> tuple[float, dict]:
    """Widen an approximate index's search (HNSW's efSearch, IVF's nprobe), doubling it, until its
    recall@10 on a sample reaches TARGET_RECALL, the width its limit, or doubling gains under 0.005 (IVF-PQ's
    compressed codes cap its recall whatever the width). The index file keeps the width chosen; returns
    (recall, {parameter: width})."""
    queries, truth, own_ids = exact_neighbours(ids, vectors)
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    name, limit = ("efSearch", MAX_EF_SEARCH) if kind == "hnsw" else ("nprobe", inner.nlist)
    holder = inner.hnsw if kind == "hnsw" else inner
    recall = recall_at_10(index, queries, truth, own_ids)
    while recall < TARGET_RECALL and getattr(holder, name) < limit:
        width = getattr(holder, name)
        setattr(holder, name, min(limit, 2 * width))
        wider = recall_at_10(index, queries, truth, own_ids)
        if wider - recall < 0.005:
            setattr(holder, name, width)
            break
        recall = wider
    return recall, {name: int(getattr(holder, name))}


def build_index(ws: Workspace, kind: str = "auto", rebuild: bool = False, language: str = "auto") -> dict:
    """Bring the indexes up to the store: an update of the last build when that is cheap and sound,
    else a full build (common/indexes.py's `update_plan` says which). `language` chooses BM25's analyzer
    (common/lexical.py): auto detects it at a full build, and an update keeps the last build's."""
    if kind not in INDEX_TYPES:
        raise PipelineError(f"--type: unknown index type '{kind}' (choose from {', '.join(INDEX_TYPES)})")
    language = language.lower()
    check_language(language)
    embedder = ws.require("embedder", "run `pipeline embed` first")
    with Store(ws.db_path, read_only=True) as store:
        check_store(store, embedder, ws)
        generation = store.generation()
        live = store.chunk_ids()
        if len(live) == 0:
            raise PipelineError(f"{ws.db_path}: no vectors stored; run `pipeline embed` first")
        previous = ws.read_manifest().get("index")
        base, reason = update_plan(ws, previous, embedder, kind, live, rebuild, language)
        ids, vectors, chunk_rows = chunks_to_index(store, live, base)
    if base is None:
        summary = full_build(ws, kind, ids, vectors, chunk_rows, reason, language)
    else:
        summary = update(ws, previous, base, ids, vectors, chunk_rows, live, reason)
    return record(ws, summary, embedder, live, generation)


def full_build(ws: Workspace, kind: str, ids: np.ndarray, vectors: np.ndarray, chunk_rows: list, update_reason: str,
               language: str = "auto") -> dict:
    analyzer, mix = choose_analyzer([text for _, _, text in chunk_rows], language)
    info(f"BM25 analyzer: {analyzer.describe()}; " + (f"languages detected: {mix.describe()}" if mix else "as --language chose"))
    # BM25 is built while FAISS builds in a thread beside it: FAISS lets go of the GIL and BM25's
    # tokenizing fills the gaps in its use of the cores (100k chunks, HNSW: 39 -> 35 s for both).
    with ThreadPoolExecutor(1) as pool:
        building = pool.submit(build_faiss, kind, ids, vectors, update_reason)
        start = time.perf_counter()
        lexical = LexicalIndex.build(chunk_rows, analyzer)
        lexical_seconds = time.perf_counter() - start
        faiss_index = building.result()
    index, build_seconds = faiss_index["index"], faiss_index["build_seconds"]
    path = write_faiss(index, ws.index_dir, "faiss")
    info(f"built in {build_seconds:.2f}s; written to {path}")
    lexical_dir = save_lexical(lexical, ws.index_dir)
    info(f"BM25 index over {len(chunk_rows):,} chunks built in {lexical_seconds:.2f}s; written to {lexical_dir}")
    return {"path": str(path.relative_to(ws.root)), **{key: faiss_index[key] for key in ("type", "reason", "recall_at_10", "search_setting")},
            "dim": int(vectors.shape[1]), "update": "full", "update_reason": update_reason, "base_vectors": int(len(ids)),
            "delta_path": None, "delta_vectors": 0, "deleted_in_base": 0, "build_seconds": build_seconds,
            "lexical_path": str(lexical_dir.relative_to(ws.root)), "lexical_seconds": lexical_seconds,
            "analyzer": {**analyzer.to_json(), "chosen_by": "detected" if mix else "--language",
                         "languages_detected": mix.shares if mix else None}}


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
        (parameter, width), = search_setting.items()
        info(f"recall@10 against exact search on {min(RECALL_SAMPLE, len(ids)):,} of its vectors: {recall:.3f} "
             f"with {parameter} {width} (aiming at {TARGET_RECALL}; {time.perf_counter() - start:.1f}s)")
    return {"index": index, "type": kind, "reason": reason, "build_seconds": build_seconds, "recall_at_10": recall,
            "search_setting": search_setting}
