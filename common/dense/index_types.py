"""FAISS index types: which one a collection gets, how each is made, and how widely an approximate one
searches (its width tuned to a recall target on a sample of its own vectors).

Vectors are L2-normalised, so every index uses inner product (= cosine similarity); chunk ids are kept
through IndexIDMap2 (IndexIDMap for IVF: common/dense/ivf.py).
"""

from __future__ import annotations

import os

import faiss
import numpy as np

from common.dense.reader import candidates_to_rescore, rescored

EXACT_LIMIT = 50_000  # below this many vectors exact search is fast enough and has perfect recall

HNSW_LINKS = 32  # HNSW's M: each node's links per layer (twice as many in the bottom one)

GRAPH_DIMENSIONS = (
    128  # HNSW's graph is built over this many principal components of wider vectors (add_with_reduced_graph)
)

PCA_SAMPLE = 20_000  # vectors the principal components are computed from


# An approximate index is searched as broadly as it takes to find this share of the exact top 10 (on a
# sample of its own vectors as queries), within the limits below.
TARGET_RECALL = 0.95

MAX_EF_SEARCH = 1024  # HNSW: beyond this a search costs more than the graph saves
RESCORE_FACTOR = 10  # IVF-PQ: candidates re-scored per result wanted, to start with
# IVF-PQ: the most candidates tuning may re-score per result. At ten million chunks, past a few dozen probes
# the codes' ranking, not the lists searched, loses the neighbours, so only more re-scored candidates reach
# the target, and a lower cap stopped short of it on another sample
# (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
MAX_RESCORE_FACTOR = 320
# Tuning's queries: spans of this many words of the documents, embedded as search embeds a query. Stored
# vectors as queries overstate a user's recall: they lie in the clusters IVF's lists were trained on, a query
# between them. Spans of this length came out a little harder than SciFact's claims as queries (shorter spans
# harder still, whole sentences and stored vectors easier): the width they need is enough for queries like
# those (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
QUERY_WORDS = 12

RECALL_SAMPLE = 1000


# from here IVF-PQ with rescoring (ivf.py): an HNSW graph's memory and build grow with n
HNSW_LIMIT = 500_000


def choose_type(n: int) -> tuple[str, str]:
    if n < EXACT_LIMIT:
        return "flat", f"{n:,} vectors < {EXACT_LIMIT:,}: exact search is fast enough and has perfect recall"
    if n < HNSW_LIMIT:
        return "hnsw", f"{n:,} vectors >= {EXACT_LIMIT:,}: HNSW graph search is much faster than exact at high recall"
    return "ivfpq", (
        f"{n:,} vectors >= {HNSW_LIMIT:,}: IVF-PQ codes (64 bytes a vector) built in slices, "
        "candidates re-scored from int8 vectors"
    )


def make_index(kind: str, vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    """A flat or HNSW FAISS index over the vectors, found by `ids` (IVF indexes are built in slices: ivf.py)."""
    dim = vectors.shape[1]
    spec = {"flat": "IDMap2,Flat", "hnsw": f"IDMap2,HNSW{HNSW_LINKS},SQfp16"}[kind]
    index = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    if kind == "hnsw":
        # The graph's build is most of `pipeline index` beyond EXACT_LIMIT vectors. A lower efConstruction over
        # float16 vectors (half the memory to read per distance) built much faster than a higher one over
        # float32, at a little lower recall, which a wider search makes up (the search width is then tuned:
        # index/faiss_build.py). Float16 changes a cosine far less than the differences that order search results
        # (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
        inner.hnsw.efConstruction = 40
        inner.hnsw.efSearch = 64
        if not index.is_trained:
            index.train(vectors)
        if dim > GRAPH_DIMENSIONS:
            add_with_reduced_graph(index, inner, vectors, ids)
            return index
    index.add_with_ids(vectors, ids)
    return index


def add_with_reduced_graph(index: faiss.Index, hnsw_index: faiss.Index, vectors: np.ndarray, ids: np.ndarray) -> None:
    """Fill an empty IDMap2-wrapped HNSW index whose graph is built over the vectors' first GRAPH_DIMENSIONS
    principal components, while the index keeps (and searches, and filters over) the full vectors. Which
    vectors are a node's neighbours hardly changes when distances come from the leading components, and
    building the graph is most of the cost: on the scale benchmark's vectors the graph over the leading
    components built much faster than over all of them, at a little lower recall@10 (searched over the full
    vectors) at the same efSearch; the build's tuning then widens the search to the recall target
    (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
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


def recall_sample(n: int) -> int:
    """Queries recall is measured with: RECALL_SAMPLE, fewer from a million vectors on (their exact neighbours
    cost a pass over every vector per query: 200 queries at ten million)."""
    return max(200, min(RECALL_SAMPLE, 10**9 // max(n, 1)))


def query_spans(texts: list[str], seed: int = 0) -> list[str]:
    """Tuning's queries (QUERY_WORDS): a span of QUERY_WORDS words of each text from a seeded random start (the
    text whole when shorter; a text without spaces, e.g. Chinese, by characters, 4 to a word)."""
    rng = np.random.default_rng(seed)
    spans = []
    for text in texts:
        words = text.split()
        if len(words) <= 1:
            words, glue = list(text), ""
            length = 4 * QUERY_WORDS
        else:
            glue, length = " ", QUERY_WORDS
        start = int(rng.integers(0, max(1, len(words) - length + 1)))
        spans.append(glue.join(words[start : start + length]))
    return [span for span in spans if span.strip()]


def exact_neighbours(
    ids: np.ndarray, vectors: np.ndarray, sample: int = RECALL_SAMPLE, seed: int = 0, queries: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query vectors, ids of their exact 10 nearest stored vectors, the queries' own ids) for `queries` (own
    id -1: none) or a sample of stored vectors in memory as queries (each one's own vector left out of its
    neighbours)."""
    if queries is not None:
        nearest = ExactNeighbours(queries, np.full(len(queries), -1, np.int64))
    else:
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(len(vectors), size=min(sample, len(vectors)), replace=False))
        nearest = ExactNeighbours(vectors[rows], ids[rows])
    nearest.update(vectors, ids)  # faiss.knn reads the vectors where they are (an IndexFlat would copy them)
    return nearest.queries, nearest.truth(), nearest.query_ids


class ExactNeighbours:
    """The exact 10 nearest stored chunks of query vectors, found slice by slice as the vectors stream past
    (a query that is a stored vector has its own chunk left out: a new query is not in the index)."""

    def __init__(self, queries: np.ndarray, query_ids: np.ndarray):
        self.queries, self.query_ids = np.ascontiguousarray(queries), query_ids
        self.best_scores = np.full((len(queries), 11), -np.inf, np.float32)
        self.best_ids = np.full((len(queries), 11), -1, np.int64)

    def update(self, vectors: np.ndarray, chunk_ids: np.ndarray) -> None:
        k = min(11, len(vectors))
        found_scores, found = faiss.knn(self.queries, vectors, k, metric=faiss.METRIC_INNER_PRODUCT)
        both_scores = np.concatenate([self.best_scores, found_scores], axis=1)
        both_ids = np.concatenate([self.best_ids, chunk_ids[found]], axis=1)
        keep = np.argsort(-both_scores, axis=1, kind="stable")[:, :11]
        self.best_scores = np.take_along_axis(both_scores, keep, axis=1)
        self.best_ids = np.take_along_axis(both_ids, keep, axis=1)

    def truth(self) -> np.ndarray:
        return np.array(
            [[i for i in row if i != own and i >= 0][:10] for row, own in zip(self.best_ids, self.query_ids)]
        )


def recall_at_10(search, queries: np.ndarray, truth: np.ndarray, own_ids: np.ndarray) -> float:
    """Share of the exact top 10 (`truth`) that search(queries, k) -> chunk ids [m, k] finds, leaving out each
    query's own id."""
    if truth.shape[1] == 0:  # an index of one vector: nothing else to find
        return 1.0
    found = search(queries, truth.shape[1] + 1)
    return float(np.mean([len(set(t) & (set(f) - {own})) / len(t) for t, f, own in zip(truth, found, own_ids)]))


def rescored_search(index: faiss.Index, rows: np.memmap, factor: int):
    """search(queries, k) -> chunk ids of an IVF index whose best factor * k candidates are re-scored
    from the rescoring rows (what search/engine.py does per query). The candidates' rows are read from the
    file into memory (read_rows), not through its memory map: at ten million chunks the pages the map
    brought in around them (the kernel reads ahead) grew `pipeline index`'s memory while it tuned
    (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
    ivf = faiss.downcast_index(faiss.downcast_index(index).index)
    chunk_ids = faiss.vector_to_array(faiss.downcast_index(index).id_map)

    def search(queries: np.ndarray, k: int) -> list[np.ndarray]:
        _, candidates = ivf.search(queries, candidates_to_rescore(factor, k))
        slots = np.unique(candidates[candidates >= 0])
        read = read_rows(rows, slots)
        return [
            chunk_ids[slots[rescored(q, np.searchsorted(slots, c[c >= 0]), read, k)[0]]]
            for q, c in zip(queries, candidates)
        ]

    return search


def read_rows(rows: np.memmap, slots: np.ndarray) -> np.ndarray:
    """rows[slots] read with pread from the memory-mapped array's file."""
    size = rows.dtype.itemsize
    read = bytearray(len(slots) * size)
    with open(rows.filename, "rb") as file:
        for i, slot in enumerate(slots.tolist()):
            read[i * size : (i + 1) * size] = os.pread(file.fileno(), size, rows.offset + slot * size)
    return np.frombuffer(read, rows.dtype)


def tune_search(
    index: faiss.Index, kind: str, queries: np.ndarray, truth: np.ndarray, own_ids: np.ndarray, rows=None
) -> tuple[float, dict]:
    """Widen an approximate index's search until its recall@10 on the sample reaches TARGET_RECALL: HNSW's
    efSearch and IVF's nprobe doubled until the target, their limit, or a doubling gaining under 0.005;
    IVF's re-scored candidates (rescore x k, from `rows`) doubled too, whichever of the two gains more each
    step (its compressed codes alone cap its recall whatever the width). The index file keeps efSearch and
    nprobe; returns (recall, {parameter: width}) for the manifest."""
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    if kind == "hnsw":
        widths, limits, holder = {"efSearch": inner.hnsw.efSearch}, {"efSearch": MAX_EF_SEARCH}, inner.hnsw
    else:
        widths, limits, holder = {"nprobe": min(inner.nlist, 16)}, {"nprobe": inner.nlist}, inner
        widths["rescore"], limits["rescore"] = RESCORE_FACTOR, MAX_RESCORE_FACTOR

    def measure(setting: dict) -> float:
        for name in ("efSearch", "nprobe"):
            if name in setting:
                setattr(holder, name, setting[name])
        search = (
            rescored_search(index, rows, setting["rescore"]) if rows is not None else lambda q, k: index.search(q, k)[1]
        )
        return recall_at_10(search, queries, truth, own_ids)

    recall = measure(widths)
    while recall < TARGET_RECALL:
        tried = {
            name: measure({**widths, name: min(limits[name], 2 * width)})
            for name, width in widths.items()
            if width < limits[name]
        }
        best = max(tried.values(), default=recall)
        if best - recall < 0.005 and best < TARGET_RECALL:  # a step that reaches the target is taken however small
            break
        name = max(tried, key=tried.get)
        widths[name], recall = min(limits[name], 2 * widths[name]), tried[name]
    measure(widths)  # the index keeps the chosen width
    return recall, widths
