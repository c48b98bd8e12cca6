"""The workspace's indexes on disk: FAISS and BM25 (common/lexical.py), built in full or updated.

`pipeline index` (index/build.py) makes full builds; updating the last build with what changed in the
store is here because both `pipeline index` and the server's document API (search/serve/generation.py) do it, and
no stage imports another.

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

Each run writes new files and a new lexical directory (the base segment's files are hard links to the
previous version's: an update does not copy the base); the manifest's "index" section, written last
(`record`), names them and the store generation they were built from, so a reader that follows the
manifest always sees a matching set, and a crash mid-build leaves the previous index in use. Older
files are removed after the manifest moved on.
"""
from __future__ import annotations

import math
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import faiss
import numpy as np

from common.console import info
from common.errors import PipelineError
from common.lexical import Analyzer, LexicalIndex, Segment
from common.store import Store, embedder_key
from common.workspace import Workspace, atomic_write_bytes

EXACT_LIMIT = 50_000  # below this many vectors exact search is fast enough and has perfect recall
HNSW_LINKS = 32  # HNSW's M: each node's links per layer (twice as many in the bottom one)
GRAPH_DIMENSIONS = 128  # HNSW's graph is built over this many principal components of wider vectors (add_with_reduced_graph)
PCA_SAMPLE = 20_000  # vectors the principal components are computed from
REBUILD_SHARE = 0.10  # chunks added or deleted since the last full build, as a share of it, beyond which `pipeline index` rebuilds


def choose_type(n: int) -> tuple[str, str]:
    if n < EXACT_LIMIT:
        return "flat", f"{n:,} vectors < {EXACT_LIMIT:,}: exact search is fast enough and has perfect recall"
    if n < 2_000_000:
        return "hnsw", f"{n:,} vectors >= {EXACT_LIMIT:,}: HNSW graph search is much faster than exact at high recall"
    return "ivfpq", f"{n:,} vectors: IVF-PQ keeps the index small in memory"


def factory_string(kind: str, dim: int, n: int) -> str:
    """The FAISS index_factory description of each index type, sized for n vectors."""
    n_lists = max(1, min(int(4 * math.sqrt(n)), n // 39))  # FAISS wants >= 39 training points per list
    pq_parts = next(m for m in (32, 16, 8, 4, 2, 1) if dim % m == 0)
    # PQ trains 2**bits centroids per part and wants ~39 points per centroid: fewer bits on small data.
    pq_bits = max(4, min(8, int(math.log2(max(n, 1) / 39))))
    return {
        "flat": "IDMap2,Flat",
        "hnsw": f"IDMap2,HNSW{HNSW_LINKS},SQfp16",
        "ivf": f"IDMap2,IVF{n_lists},Flat",
        "ivfpq": f"IDMap2,IVF{n_lists},PQ{pq_parts}x{pq_bits}",
    }[kind]


def make_index(kind: str, vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    """A FAISS index of `kind` over the vectors (trained where the type needs it), found by `ids`."""
    dim, n = vectors.shape[1], len(vectors)
    index = faiss.index_factory(dim, factory_string(kind, dim, n), faiss.METRIC_INNER_PRODUCT)
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    if kind == "hnsw":
        # The graph's build is most of `pipeline index` beyond 50,000 vectors. Measured on 100,241 vectors of
        # 1,024-d (2 cores): efConstruction 80 over float32 vectors built in 58 s, recall@10 0.958 at
        # efSearch 256; 40 over float16 vectors (half the memory to read per distance) in 25 s, recall
        # 0.946 at 256 and 0.977 at 512 (the search width is then tuned: index/build.py). Float16 changes
        # a cosine by ~1e-4, far below the differences that order search results.
        inner.hnsw.efConstruction = 40
        inner.hnsw.efSearch = 64
    elif kind in ("ivf", "ivfpq"):
        inner.nprobe = min(inner.nlist, 16)
    if kind == "ivfpq":
        # Polysemous training reorders the PQ codes for Hamming-distance filtering, which search never uses
        # (distances are the same either way); it was most of the build time (15 of 20 s for 1,700 vectors).
        inner.do_polysemous_training = False
    if not index.is_trained:
        index.train(vectors)
    if kind == "hnsw" and dim > GRAPH_DIMENSIONS:
        add_with_reduced_graph(index, inner, vectors, ids)
    else:
        index.add_with_ids(vectors, ids)
    return index


def add_with_reduced_graph(index: faiss.Index, hnsw_index: faiss.Index, vectors: np.ndarray, ids: np.ndarray) -> None:
    """Fill an empty IDMap2-wrapped HNSW index whose graph is built over the vectors' first GRAPH_DIMENSIONS
    principal components, while the index keeps (and searches, and filters over) the full vectors. Which
    vectors are a node's neighbours hardly changes when distances come from the leading components, and
    building the graph is most of the cost: on the 100,241 vectors of 1,024-d of the scale benchmark, the
    graph over 128 components built in 7.5 s against 26.8 s over all 1,024, recall@10 (searched over the
    full vectors) 0.912 / 0.953 / 0.984 at efSearch 256 / 512 / 1,024 against 0.926 / 0.964 / 0.985 (over
    256 components 14.8 s and 0.928 / 0.964 / 0.986); the build's tuning then widens the search to the
    recall target."""
    rng = np.random.default_rng(0)
    pca = faiss.PCAMatrix(vectors.shape[1], GRAPH_DIMENSIONS)
    pca.train(vectors[np.sort(rng.choice(len(vectors), min(len(vectors), PCA_SAMPLE), replace=False))])
    graph = faiss.IndexHNSWSQ(GRAPH_DIMENSIONS, faiss.ScalarQuantizer.QT_fp16, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = hnsw_index.hnsw.efConstruction
    graph.add(pca.apply(vectors))
    hnsw_index.storage.add(vectors)
    hnsw_index.hnsw = graph.hnsw  # a copy of the graph: node i is vector i in both
    hnsw_index.ntotal = len(vectors)
    id_map = faiss.downcast_index(index)
    faiss.copy_array_to_vector(np.ascontiguousarray(ids, dtype=np.int64), id_map.id_map)
    id_map.ntotal = len(vectors)
    id_map.construct_rev_map()


def check_store(store: Store, embedder: dict, ws: Workspace) -> None:
    if store.get_meta("embedder") != embedder_key(embedder["fingerprint"], embedder["chunk_tokens"], embedder["overlap"]):
        # Only a `pipeline embed` killed after it changed the store and before it updated the manifest leaves this.
        raise PipelineError(f"{ws.db_path} holds vectors of another embedder than the manifest records "
                            "(an interrupted `pipeline embed`?): run `pipeline embed` again")


def record(ws: Workspace, summary: dict, embedder: dict, live: np.ndarray, generation: int) -> dict:
    """Name the new files, and the store generation they hold, in the manifest (last), then remove older ones."""
    summary.update({"vectors": int(len(live)), "embedder_fingerprint": embedder["fingerprint"],
                    "embedder_chunking": [embedder["chunk_tokens"], embedder["overlap"]],
                    "lexical_chunks": int(len(live)), "store_generation": generation, "build_id": uuid.uuid4().hex})
    ws.update_manifest("index", summary)
    remove_other_files(ws.index_dir, keep={Path(summary[key]).name for key in ("path", "delta_path", "lexical_path") if summary.get(key)})
    return summary


def chunks_to_index(store: Store, live: np.ndarray, base: Segment | None) -> tuple[np.ndarray, np.ndarray, list]:
    """(chunk ids, vectors, (chunk id, title, text) rows) of every stored chunk for a full build (no base),
    or of those added since the base for an update."""
    only = None if base is None else np.setdiff1d(live, base.chunk_ids, assume_unique=True)
    ids, vectors = store.load_vectors(only)
    return ids, vectors, [(chunk_id, title, text) for chunk_id, _, title, text in store.chunk_rows(only)]


def update_from_store(ws: Workspace) -> dict:
    """Update the last build to the store as it is now (the server's document API: it has an index to
    update). Past REBUILD_SHARE it updates anyway and says so: `pipeline index` then builds in full."""
    embedder = ws.require("embedder", "run `pipeline embed` first")
    previous = ws.require("index", "run `pipeline index` first")
    with Store(ws.db_path, read_only=True) as store:
        check_store(store, embedder, ws)
        generation = store.generation()
        live = store.chunk_ids()
        base, reason = update_plan(ws, previous, embedder, previous["type"], live, rebuild=False)
        if base is None:
            base_dir = base_segment_dir(ws, previous)
            if "base_vectors" not in previous or not base_dir.is_dir():
                raise PipelineError(f"the index cannot be updated ({reason}): run `pipeline index`")
            base, reason = Segment.load(base_dir), f"update, though {reason.removeprefix('full build (').rstrip(')')}: `pipeline index` will rebuild"
        ids, vectors, chunk_rows = chunks_to_index(store, live, base)
    return record(ws, update(ws, previous, base, ids, vectors, chunk_rows, live, reason), embedder, live, generation)


def base_segment_dir(ws: Workspace, previous: dict) -> Path:
    """The last build's BM25 base: the first segment LexicalIndex.write writes."""
    return ws.root / previous["lexical_path"] / "segment-0"


def update_plan(ws: Workspace, previous: dict | None, embedder: dict, kind: str, live: np.ndarray,
                rebuild: bool, language: str = "auto") -> tuple[Segment | None, str]:
    """Whether the last build can be updated to hold the chunks `live`: (its lexical base segment, why),
    or (None, why a full build). An update keeps the base (FAISS index and BM25 segment) as it is, skips
    its chunks that were deleted since, and puts every chunk added since the base into a delta. Deltas
    and deletions beyond REBUILD_SHARE of the base make a full build: the delta is rebuilt at every update
    (its cost grows with it) and deleted chunks still cost search time in the base."""
    if rebuild:
        return None, "full build (--rebuild)"
    if not previous or "base_vectors" not in previous:
        return None, "full build (no index of this version yet)"
    if previous.get("embedder_fingerprint") != embedder["fingerprint"] or previous.get("embedder_chunking") != [embedder["chunk_tokens"], embedder["overlap"]]:
        return None, "full build (new embedder or chunking)"
    built_language = (previous.get("analyzer") or {}).get("language", "en")  # an index from before languages: English
    if language not in ("auto", built_language):
        return None, f"full build (BM25 for --language {language}, the last build's is {built_language})"
    wanted = choose_type(len(live))[0] if kind == "auto" else kind
    if wanted != previous["type"]:
        return None, f"full build ({wanted} index wanted, the last build is {previous['type']})"
    base_dir = base_segment_dir(ws, previous)
    if not (ws.root / previous["path"]).exists() or not base_dir.is_dir():
        return None, "full build (the last build's files are missing)"
    base = Segment.load(base_dir)
    added = len(live) - int(np.isin(live, base.chunk_ids, assume_unique=True).sum())
    deleted = len(base.chunk_ids) - (len(live) - added)
    limit = REBUILD_SHARE * len(base.chunk_ids)
    if added > limit or deleted > limit:
        return None, (f"full build ({added:,} chunks added and {deleted:,} deleted since the last full build of "
                      f"{len(base.chunk_ids):,}: over {REBUILD_SHARE:.0%})")
    return base, f"update ({added:,} chunks added and {deleted:,} deleted since the last full build of {len(base.chunk_ids):,})"


def update(ws: Workspace, previous: dict, base: Segment, ids: np.ndarray, vectors: np.ndarray, chunk_rows: list,
           live: np.ndarray, update_reason: str) -> dict:
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
    kept = ("path", "type", "reason", "dim", "base_vectors", "recall_at_10", "search_setting")  # the base's
    return {**{key: previous.get(key) for key in kept},
            "analyzer": previous.get("analyzer") or {**Analyzer.load(base.source.parent).to_json(), "chosen_by": "an index from before languages"},
            "update": "incremental", "update_reason": update_reason,
            "delta_path": str(delta_path.relative_to(ws.root)) if delta_path else None, "delta_vectors": int(len(ids)),
            "deleted_in_base": int(deleted), "build_seconds": build_seconds,
            "lexical_path": str(lexical_dir.relative_to(ws.root)), "lexical_seconds": lexical_seconds}


def write_faiss(index: faiss.Index, index_dir: Path, prefix: str) -> Path:
    """Write under a new name (the manifest then names it): a reader never sees a half-written index."""
    path = index_dir / f"{prefix}-{uuid.uuid4().hex[:12]}.index"
    atomic_write_bytes(path, faiss.serialize_index(index).tobytes())
    return path


def save_lexical(lexical: LexicalIndex, index_dir: Path) -> Path:
    """Write into a fresh versioned directory under index_dir and return it (the manifest then names it),
    so a reader always finds a complete index."""
    index_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=index_dir, prefix=".lexical.staging."))
    try:
        lexical.write(staging)
        final = index_dir / f"lexical-{uuid.uuid4().hex[:12]}"
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def remove_other_files(index_dir: Path, keep: set[str]) -> None:
    """Remove what the manifest no longer names: older index versions, and what a killed build left."""
    for old in index_dir.iterdir():
        if old.name in keep:
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


# From this many queries at once a flat index's scores are one matrix product (BLAS), below it a scan of
# the vectors per query. FAISS 1.15 switches on query floats (queries x dimension) against a process-wide
# threshold, 128,000 by default: 125 queries of 1,024-d, so a search's batch was always scanned. Measured
# on 5,705 vectors of 1,024-d, one thread: 1 query 0.8 ms scanned / 2.5 by BLAS, 3 queries 2.5 / 3.4,
# 4 queries 2.7-3.2 / 2.1-2.8, 8 queries 6.0-7.1 / 2.6-3.4, 16 queries 10.5-12.5 / 3.7-4.1.
FLAT_BLAS_MIN_QUERIES = 4


def load_index(path: Path) -> faiss.Index:
    """A FAISS index file, read whole and deserialised (what search and the server use). Sets FAISS's
    process-wide switch to matrix products for FLAT_BLAS_MIN_QUERIES queries or more of its dimension."""
    index = faiss.deserialize_index(np.fromfile(path, dtype=np.uint8))
    faiss.cvar.distance_compute_blas_threshold = FLAT_BLAS_MIN_QUERIES * index.d
    return index
