"""`pipeline index`: build a FAISS index over the vectors in the store, and a BM25 index over the chunks' text.

Vectors are L2-normalised, so every index uses inner product (= cosine similarity). Chunk ids are
kept through IndexIDMap2. Each build writes new files: the FAISS index under a name of its own
(faiss-<build id>.index, written to a temporary name and renamed) and the lexical index
(common/lexical.py) into a staging directory renamed to a versioned name (lexical-<id>/). The manifest's "index" section, written last,
names both and the store generation they were built from, so a reader that follows the manifest
always sees a matching pair, and a crash mid-build leaves the previous index in use. Older files
are removed after the manifest moved on.
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
from common.lexical import LexicalIndex
from common.store import Store, embedder_key
from common.workspace import Workspace, atomic_write_bytes

INDEX_TYPES = ("auto", "flat", "hnsw", "ivf", "ivfpq")
EXACT_LIMIT = 50_000  # below this many vectors exact search is fast enough and has perfect recall


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
    if kind == "ivfpq":
        # Polysemous training reorders the PQ codes for Hamming-distance filtering, which search never uses
        # (distances are the same either way); it was most of the build time (15 of 20 s for 1,700 vectors).
        inner.do_polysemous_training = False
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


def build_index(ws: Workspace, kind: str = "auto") -> dict:
    if kind not in INDEX_TYPES:
        raise PipelineError(f"--type: unknown index type '{kind}' (choose from {', '.join(INDEX_TYPES)})")
    embedder = ws.require("embedder", "run `pipeline embed` first")
    with Store(ws.db_path, read_only=True) as store:
        if store.get_meta("embedder") != embedder_key(embedder["fingerprint"], embedder["chunk_tokens"], embedder["overlap"]):
            # Only a `pipeline embed` killed after it changed the store and before it updated the manifest leaves this.
            raise PipelineError(f"{ws.db_path} holds vectors of another embedder than the manifest records "
                                "(an interrupted `pipeline embed`?): run `pipeline embed` again")
        generation = store.generation()
        ids, vectors = store.load_vectors()
        chunk_rows = [(chunk_id, title, text) for chunk_id, _, title, text in store.chunk_rows()]
    if len(ids) == 0:
        raise PipelineError(f"{ws.db_path}: no vectors stored; run `pipeline embed` first")
    reason = f"--type {kind}"
    if kind == "auto":
        kind, reason = choose_type(len(ids))
    if kind in ("ivf", "ivfpq") and len(ids) < 39:
        raise PipelineError(f"--type {kind} needs at least 39 vectors to train, the store has {len(ids)}")
    info(f"building a {kind} index over {len(ids):,} vectors of dimension {vectors.shape[1]} ({reason})")

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
    build_id = uuid.uuid4().hex
    path = ws.index_dir / f"faiss-{build_id[:12]}.index"
    atomic_write_bytes(path, faiss.serialize_index(index).tobytes())
    info(f"built in {build_seconds:.2f}s; written to {path}")

    start = time.perf_counter()
    lexical_dir = save_lexical(LexicalIndex.build(chunk_rows), ws.index_dir)
    lexical_seconds = time.perf_counter() - start
    info(f"BM25 index over {len(chunk_rows):,} chunks built in {lexical_seconds:.2f}s; written to {lexical_dir}")

    summary = {"path": str(path.relative_to(ws.root)), "type": kind, "reason": reason, "vectors": int(len(ids)),
               "dim": int(vectors.shape[1]), "embedder_fingerprint": embedder["fingerprint"],
               "embedder_chunking": [embedder["chunk_tokens"], embedder["overlap"]],
               "build_seconds": build_seconds, "recall_at_10": recall,
               "lexical_path": str(lexical_dir.relative_to(ws.root)), "lexical_chunks": len(chunk_rows),
               "lexical_seconds": lexical_seconds, "store_generation": generation, "build_id": build_id}
    ws.update_manifest("index", summary)
    remove_other_files(ws.index_dir, keep={path.name, lexical_dir.name})
    return summary


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
