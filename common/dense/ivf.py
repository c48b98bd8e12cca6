"""IVF indexes built in bounded memory: trained on a sample, filled in slices streamed from the store.

A collection of millions of chunks does not fit in memory as float32 (4 KB a vector at 1,024 dimensions:
41 GB at ten million), and an HNSW graph over it would not either. FAISS's recipe for such collections
("Indexing 1G vectors", "Indexes that do not fit in RAM") is an inverted file: k-means centroids trained
on a sample, each vector coded compactly in the list of its nearest centroid, and a search that scans the
lists of the `nprobe` centroids nearest the query. Here:

- `ivfpq`: PQ codes of 4 bits per 8 dimensions (64 bytes a vector at 1,024 dimensions), scanned with
  FAISS's fast-scan kernels.
- `ivf`: int8 scalar codes trained per dimension (1 KB a vector).

Either way the best `rescore` x k candidates (past the 10th result, 10 a result: common/dense/reader.py
candidates_to_rescore) are then scored exactly from an int8 copy of the store's
vectors (common/vectors.py) that `pipeline index` writes beside the index (the rescoring file, read
memory-mapped), as Qdrant and LanceDB re-score quantized search: what search returns is ranked by the
stored vectors' own scores, and the codes only choose the candidates.

The vectors are read from the store a slice at a time (SLICE_BYTES of float32), so memory holds one
slice, the training sample and the index's codes. When the codes would take more than the memory budget
(`--memory-budget`), each slice is written as an index file of its own and the slices' lists are merged
into one file of on-disk inverted lists (FAISS's OnDiskInvertedLists, read memory-mapped), coded with
8-bit PQ (fast-scan's blocked lists cannot live on disk) or int8. The exact neighbours that recall is
measured against are found in the same pass (each slice searched exactly for the sampled queries).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
from faiss.contrib.ondisk import merge_ondisk

from common.console import info, quiet_stdout
from common.dense.index_types import ExactNeighbours
from common.dense.reader import read_rescore, rescore_dtype
from common.durations import format_eta
from common.store import Store
from common.vectors import dequantize

SLICE_BYTES = 256 * 2**20  # float32 vectors read from the store and added at once
TRAINING_POINTS_PER_LIST = 40  # k-means wants >= 39 points a centroid (FAISS warns below)
KMEANS_ITERATIONS = 10  # FAISS's default is 25; the centroids hardly move after 10 (and training is the slow part)


def lists_for(n: int) -> int:
    """Inverted lists for n vectors: sqrt(n) (3,162 at ten million, ~3,000 vectors a list), and at least 39
    training points each. FAISS suggests 4-16 sqrt(n) with an HNSW quantizer; k-means over that many
    centroids on a 2-core machine would take far longer at ten million, and fast-scan makes a longer list
    cheap to scan (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
    return max(1, min(int(math.sqrt(n)), n // TRAINING_POINTS_PER_LIST))


def codes_bytes(kind: str, n: int, dim: int) -> int:
    """What the index's codes take in memory: PQ fast-scan 4 bits per 8 dimensions, int8 one byte each."""
    return n * dim if kind == "ivf" else n * pq_parts(dim) // 2


def pq_parts(dim: int) -> int:
    """PQ sub-vectors: one per 8 dimensions (64 bytes at 1,024 of 4 bits), or the largest divisor of dim below."""
    return next(m for m in (dim // 8, 32, 16, 8, 4, 2, 1) if m and dim % m == 0)


def factory_string(kind: str, dim: int, n: int, on_disk: bool) -> str:
    nlist = lists_for(n)
    if kind == "ivf":
        return f"IVF{nlist},SQ8"
    if not on_disk:
        return f"IVF{nlist},PQ{pq_parts(dim)}x4fs"
    # 8-bit PQ on disk, half as many sub-vectors for the same 64 bytes; fewer bits on small data (2**bits
    # centroids per sub-vector want ~39 points each).
    parts = next(m for m in (pq_parts(dim) // 2, pq_parts(dim)) if m and dim % m == 0)
    bits = max(4, min(8, int(math.log2(max(n, 1) / TRAINING_POINTS_PER_LIST))))
    return f"IVF{nlist},PQ{parts}x{bits}"


DRIFT_SAMPLE = 10_000  # vectors whose distance to the centroids is measured


@dataclass
class IvfBuild:
    index: faiss.Index  # IDMap over the IVF index; the IVF's own labels are slots (the order vectors were added)
    trained: faiss.Index  # the empty trained IVF index: an update fills a delta with it (index/update.py)
    on_disk_lists: Path | None  # the merged lists' file, beside the index file, when on disk
    rescore: np.ndarray  # the rescoring rows by slot (memory-mapped)
    centroid_distance: float  # mean 1 - cosine of sampled vectors to their nearest centroid
    queries: np.ndarray  # the recall sample: stored vectors as queries
    truth: np.ndarray  # their exact 10 nearest other stored chunks' ids
    own_ids: np.ndarray


def centroid_distance(ivf: faiss.Index, vectors: np.ndarray) -> float:
    """Mean 1 - cosine of the vectors to their nearest centroid: how well the trained lists fit them (an
    update compares the vectors added since with the base's: index/update.py)."""
    if len(vectors) == 0:
        return 0.0
    scores, _ = ivf.quantizer.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
    return float(np.mean(1.0 - scores[:, 0]))


def train_ivf(kind: str, store: Store, ids: np.ndarray, dim: int, on_disk: bool, seed: int = 0) -> faiss.Index:
    """An empty IVF index of `kind`, trained on a sample of the stored vectors of `ids`."""
    spec = factory_string(kind, dim, len(ids), on_disk)
    ivf = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.niter = KMEANS_ITERATIONS
    if hasattr(ivf, "do_polysemous_training"):
        ivf.do_polysemous_training = False  # a reordering for Hamming filtering, which search never uses
    sample = min(len(ids), max(TRAINING_POINTS_PER_LIST * ivf.nlist, 2**12))
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    _, training = store.load_vectors(np.sort(rng.choice(ids, sample, replace=False)))
    ivf.train(training)
    info(
        f"{spec}{' (lists on disk)' if on_disk else ''}: trained on {sample:,} vectors in "
        f"{time.perf_counter() - start:.1f}s"
    )
    return ivf


def build_ivf(
    kind: str,
    store: Store,
    ids: np.ndarray,
    dim: int,
    staging: Path,
    memory_budget: int,
    recall_sample: int,
    lists_name: str,
    trained: faiss.Index | None = None,
    seed: int = 0,
    queries: np.ndarray | None = None,
    on_disk: bool | None = None,
) -> IvfBuild:
    """An IVF index of `kind` ("ivf" or "ivfpq") over the store's vectors of chunks `ids` (ascending):
    every live chunk (a full build, trained here), or, given a `trained` index, some of them: the chunks
    added since the base it was trained for (an update's delta, in memory: on_disk False), or a shard's
    (index/shards.py: every shard filled from one training, on_disk as it was trained for). When its lists
    go on disk (on_disk None: when its codes take more than memory_budget), they are merged into
    `staging`/`lists_name` (a name the index then looks for beside its own file: the file is to be moved
    beside it). The rescoring rows are written to `staging`/rescore.npy. The exact neighbours of `queries`
    (else of recall_sample stored vectors) are found as the vectors stream past, for tuning."""
    n = len(ids)
    some = trained is not None  # ids are not every stored chunk: only they are read
    if on_disk is None:
        on_disk = codes_bytes(kind, n, dim) > memory_budget
    ivf = faiss.clone_index(trained) if some else train_ivf(kind, store, ids, dim, on_disk, seed)
    empty = faiss.serialize_index(ivf)
    rng = np.random.default_rng(seed + 1)
    _, sample = store.load_vectors(np.sort(rng.choice(ids, min(DRIFT_SAMPLE, n), replace=False)))
    fit = centroid_distance(ivf, sample)
    # Wrapped while empty (FAISS's rule); the IVF's own labels are slots, and the slots' chunk ids are set at the
    # end. IDMap, not IDMap2: IDMap2's reverse map (id -> slot, for reconstruct) is a hash table of every id, rebuilt
    # on every load (memory that grows with the collection), and search never reconstructs
    # (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
    index = faiss.IndexIDMap(ivf)
    index.own_fields = True
    ivf.this.disown()
    if queries is None:
        query_ids, queries = store.load_vectors(np.sort(rng.choice(ids, min(recall_sample, n), replace=False)))
    else:
        query_ids = np.full(len(queries), -1, np.int64)
    nearest = ExactNeighbours(queries, query_ids)
    parts, added, started = [], 0, time.perf_counter()
    rescore_path = staging / "rescore.npy"
    # In the store's own order (no sort of every vector first): each slot's chunk id is kept as it comes.
    slices = store.iter_vector_codes(ids if some else None, batch_rows=max(1, SLICE_BYTES // (4 * dim)), ordered=False)
    slot_ids = []
    with RescoreWriter(rescore_path, n, dim) as rescore:
        for chunk_ids, codes, scales in slices:
            vectors = dequantize(codes, scales)
            slots = np.arange(added, added + len(chunk_ids), dtype=np.int64)
            if on_disk:
                part = faiss.deserialize_index(empty)
                part.add_with_ids(vectors, slots)
                parts.append(staging / f"part-{len(parts)}.index")
                faiss.write_index(part, str(parts[-1]))
                del part
            else:
                ivf.add_with_ids(vectors, slots)
            rescore.write(codes, scales)
            slot_ids.append(chunk_ids)
            nearest.update(vectors, chunk_ids)
            added += len(chunk_ids)
            rate = added / (time.perf_counter() - started)
            info(f"added {added:,} of {n:,} vectors, {rate:,.0f}/s, {format_eta((n - added) / rate)} left")
    lists_path = None
    if on_disk:
        lists_path = staging / lists_name
        with quiet_stdout():  # FAISS prints the file's resizing
            merge_ondisk(ivf, [str(p) for p in parts], str(lists_path))
        for part in parts:
            part.unlink()
    slot_ids = np.concatenate(slot_ids) if slot_ids else np.zeros(0, np.int64)
    if len(slot_ids) != n or not np.array_equal(np.sort(slot_ids), ids):  # the store changed under the build
        raise RuntimeError(f"the store's vectors are not the {n:,} chunks the index was to hold")
    faiss.copy_array_to_vector(np.ascontiguousarray(slot_ids, dtype=np.int64), index.id_map)
    index.ntotal = n
    return IvfBuild(
        index,
        faiss.deserialize_index(empty),
        lists_path,
        read_rescore(rescore_path, dim),
        fit,
        nearest.queries,
        nearest.truth(),
        nearest.query_ids,
    )


class RescoreWriter:
    """Appends rows of (codes, scale) to an .npy file, slice by slice (nothing held in memory)."""

    def __init__(self, path: Path, n: int, dim: int):
        self.path, self.n, self.dtype = path, n, rescore_dtype(dim)

    def __enter__(self) -> "RescoreWriter":
        self.file = self.path.open("wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (self.n,)}
        np.lib.format.write_array_header_2_0(self.file, header)
        return self

    def write(self, codes: np.ndarray, scales: np.ndarray) -> None:
        rows = np.empty(len(codes), self.dtype)
        rows["codes"], rows["scale"] = codes, scales
        self.file.write(rows.tobytes())

    def __exit__(self, *exc) -> None:
        self.file.close()


def new_staging(index_dir: Path) -> Path:
    index_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=index_dir, prefix=".ivf.staging."))


def remove_staging(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
