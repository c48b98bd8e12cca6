"""FAISS index types: which one a collection gets, how each is made, and how widely an approximate one
searches (its width tuned to a recall target on a sample of its own vectors).

Vectors are L2-normalised, so every index uses inner product (= cosine similarity); chunk ids are kept
through IndexIDMap2.
"""

from __future__ import annotations

import math

import faiss
import numpy as np

INDEX_TYPES = ("auto", "flat", "hnsw", "ivf", "ivfpq")
EXACT_LIMIT = 50_000  # below this many vectors exact search is fast enough and has perfect recall

HNSW_LINKS = 32  # HNSW's M: each node's links per layer (twice as many in the bottom one)

GRAPH_DIMENSIONS = (
    128  # HNSW's graph is built over this many principal components of wider vectors (add_with_reduced_graph)
)

PCA_SAMPLE = 20_000  # vectors the principal components are computed from


# An approximate index is searched as broadly as it takes to find this share of the exact top 10 (on a
# sample of its own vectors as queries), within the limits below.
# An approximate index is searched as broadly as it takes to find this share of the exact top 10 (on a
# sample of its own vectors as queries), within the limits below.
TARGET_RECALL = 0.95

MAX_EF_SEARCH = 1024  # HNSW: beyond this a search costs more than the graph saves

RECALL_SAMPLE = 1000


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


def exact_neighbours(
    ids: np.ndarray, vectors: np.ndarray, sample: int = RECALL_SAMPLE, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
