"""`pipeline index`: FAISS over the vectors in the store and BM25 over the chunks' text, built in full or updated.

Vectors are L2-normalised, so every index uses inner product (= cosine similarity). Chunk ids are
kept through IndexIDMap2. A full build writes the base: a FAISS index (faiss-<id>.index) and a BM25
index (common/lexical.py) of one segment (lexical-<id>/segment-0/). Later runs update it when little
changed (`update_plan`): the base stays as it is, its chunks deleted since are skipped at search (the
store no longer holds them: they are tombstones), and every chunk added since the base goes into a
delta, rebuilt from the store at each update: an exact FAISS index (faiss-delta-<id>.index), whose hits
search merges with the base's, and a second BM25 segment. Changed documents have new chunk ids (ids are
never reused), so an update is an exact set difference: a changed document's old chunks are deleted
ones, its new chunks added ones. BM25 statistics are those of the live chunks (computed on loading) and
the delta's FAISS search is exact, so an updated flat index answers as a full build over the same
chunks would; an approximate base (HNSW, IVF) is searched as before, without its deleted chunks.

Each run writes new files and a new lexical directory (the base segment's files are hard links to the
previous version's: an update does not copy the base); the manifest's "index" section, written last,
names them and the store generation they were built from, so a reader that follows the manifest always
sees a matching set, and a crash mid-build leaves the previous index in use. Older files are removed
after the manifest moved on.
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
from common.lexical import LexicalIndex, Segment
from common.store import Store, embedder_key
from common.workspace import Workspace, atomic_write_bytes

INDEX_TYPES = ("auto", "flat", "hnsw", "ivf", "ivfpq")
EXACT_LIMIT = 50_000  # below this many vectors exact search is fast enough and has perfect recall
REBUILD_SHARE = 0.10  # chunks added or deleted since the last full build, as a share of it, beyond which index rebuilds


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
        "hnsw": "IDMap2,HNSW32,Flat",
        "ivf": f"IDMap2,IVF{n_lists},Flat",
        "ivfpq": f"IDMap2,IVF{n_lists},PQ{pq_parts}x{pq_bits}",
    }[kind]


def make_index(kind: str, dim: int, n: int) -> faiss.Index:
    index = faiss.index_factory(dim, factory_string(kind, dim, n), faiss.METRIC_INNER_PRODUCT)
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    if kind == "hnsw":
        inner.hnsw.efConstruction = 80
        inner.hnsw.efSearch = 64
    elif kind in ("ivf", "ivfpq"):
        inner.nprobe = min(inner.nlist, 16)
    return index


def recall_at_10(index: faiss.Index, ids: np.ndarray, vectors: np.ndarray, sample: int = 200, seed: int = 0) -> float:
    """Share of the exact top-10 neighbours the index finds, for a sample of stored vectors as queries."""
    rng = np.random.default_rng(seed)
    queries = vectors[rng.choice(len(vectors), size=min(sample, len(vectors)), replace=False)]
    k = min(10, len(vectors))
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    _, truth_rows = exact.search(queries, k)
    _, found_ids = index.search(queries, k)
    return float(np.mean([len(set(ids[t]) & set(f)) / k for t, f in zip(truth_rows, found_ids)]))


def build_index(ws: Workspace, kind: str = "auto", rebuild: bool = False) -> dict:
    """Bring the indexes up to the store: an update of the last build's when that is cheap and sound,
    else a full build (see `update_plan`)."""
    if kind not in INDEX_TYPES:
        raise PipelineError(f"--type: unknown index type '{kind}' (choose from {', '.join(INDEX_TYPES)})")
    embedder = ws.require("embedder", "run `pipeline embed` first")
    with Store(ws.db_path, read_only=True) as store:
        if store.get_meta("embedder") != embedder_key(embedder["fingerprint"], embedder["chunk_tokens"], embedder["overlap"]):
            # Only a `pipeline embed` killed after it changed the store and before it updated the manifest leaves this.
            raise PipelineError(f"{ws.db_path} holds vectors of another embedder than the manifest records "
                                "(an interrupted `pipeline embed`?): run `pipeline embed` again")
        generation = store.generation()
        live = store.chunk_ids()
        if len(live) == 0:
            raise PipelineError(f"{ws.db_path}: no vectors stored; run `pipeline embed` first")
        previous = ws.read_manifest().get("index")
        base, reason = update_plan(ws, previous, embedder, kind, live, rebuild)
        if base is None:
            ids, vectors = store.load_vectors()
            chunk_rows = [(chunk_id, title, text) for chunk_id, _, title, text in store.chunk_rows()]
        else:
            added = np.setdiff1d(live, base.chunk_ids, assume_unique=True)
            ids, vectors = store.load_vectors(added)
            chunk_rows = [(chunk_id, title, text) for chunk_id, _, title, text in store.chunk_rows(added)]
    if base is None:
        summary = full_build(ws, kind, ids, vectors, chunk_rows, reason)
    else:
        summary = update(ws, previous, base, ids, vectors, chunk_rows, live, reason)
    summary.update({"vectors": int(len(live)), "embedder_fingerprint": embedder["fingerprint"],
                    "embedder_chunking": [embedder["chunk_tokens"], embedder["overlap"]],
                    "lexical_chunks": int(len(live)), "store_generation": generation, "build_id": uuid.uuid4().hex})
    ws.update_manifest("index", summary)
    remove_other_files(ws.index_dir, keep={Path(summary[key]).name for key in ("path", "delta_path", "lexical_path") if summary.get(key)})
    return summary


def update_plan(ws: Workspace, previous: dict | None, embedder: dict, kind: str, live: np.ndarray,
                rebuild: bool) -> tuple[Segment | None, str]:
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
    wanted = choose_type(len(live))[0] if kind == "auto" else kind
    if wanted != previous["type"]:
        return None, f"full build ({wanted} index wanted, the last build is {previous['type']})"
    base_dir = ws.root / previous["lexical_path"] / "segment-0"
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


def full_build(ws: Workspace, kind: str, ids: np.ndarray, vectors: np.ndarray, chunk_rows: list, update_reason: str) -> dict:
    reason = f"--type {kind}"
    if kind == "auto":
        kind, reason = choose_type(len(ids))
    if kind in ("ivf", "ivfpq") and len(ids) < 39:
        raise PipelineError(f"--type {kind} needs at least 39 vectors to train, the store has {len(ids)}")
    info(f"{update_reason}: a {kind} index over {len(ids):,} vectors of dimension {vectors.shape[1]} ({reason})")

    start = time.perf_counter()
    index = make_index(kind, vectors.shape[1], len(ids))
    if not index.is_trained:
        index.train(vectors)
    index.add_with_ids(vectors, ids)
    build_seconds = time.perf_counter() - start

    recall = None
    if kind != "flat":
        recall = recall_at_10(index, ids, vectors)
        info(f"recall@10 against exact search on a sample: {recall:.3f}")
    path = write_faiss(index, ws.index_dir, "faiss")
    info(f"built in {build_seconds:.2f}s; written to {path}")

    start = time.perf_counter()
    lexical_dir = save_lexical(LexicalIndex.build(chunk_rows), ws.index_dir)
    lexical_seconds = time.perf_counter() - start
    info(f"BM25 index over {len(chunk_rows):,} chunks built in {lexical_seconds:.2f}s; written to {lexical_dir}")
    return {"path": str(path.relative_to(ws.root)), "type": kind, "reason": reason, "dim": int(vectors.shape[1]),
            "update": "full", "update_reason": update_reason, "base_vectors": int(len(ids)), "delta_path": None,
            "delta_vectors": 0, "deleted_in_base": 0, "build_seconds": build_seconds, "recall_at_10": recall,
            "lexical_path": str(lexical_dir.relative_to(ws.root)), "lexical_seconds": lexical_seconds}


def update(ws: Workspace, previous: dict, base: Segment, ids: np.ndarray, vectors: np.ndarray, chunk_rows: list,
           live: np.ndarray, update_reason: str) -> dict:
    """The last build's base with a new delta holding `ids` (every chunk added since the base)."""
    info(update_reason)
    start = time.perf_counter()
    delta_path = None
    if len(ids):
        delta = make_index("flat", vectors.shape[1], len(ids))  # exact: small, and merged with the base's hits
        delta.add_with_ids(vectors, ids)
        delta_path = write_faiss(delta, ws.index_dir, "faiss-delta")
    build_seconds = time.perf_counter() - start
    start = time.perf_counter()
    lexical_dir = save_lexical(LexicalIndex.with_delta(base, chunk_rows, live), ws.index_dir)
    lexical_seconds = time.perf_counter() - start
    info(f"delta of {len(ids):,} chunks: FAISS {build_seconds:.2f}s, BM25 {lexical_seconds:.2f}s")
    deleted = len(base.chunk_ids) - (len(live) - len(ids))
    return {**{key: previous[key] for key in ("path", "type", "reason", "dim", "base_vectors", "recall_at_10")},
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


def load_index(path: Path) -> faiss.Index:
    return faiss.deserialize_index(np.fromfile(path, dtype=np.uint8))
