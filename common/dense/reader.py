"""Reading the index files `pipeline index` writes (index/): what search and the default-mode measurement
need of them, and nothing of how they are built. index/ writes these files and records them in the
manifest's "index" section (common/manifest.py IndexEntry); search/ reads them only through here, and the
corpus snapshot written beside them through common/snapshot/reader.py.
"""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

from common.console import quiet_stdout
from common.errors import PipelineError
from common.manifest import IndexEntry
from common.vectors import scores
from common.workspace import Workspace


def base_segment_dir(ws: Workspace, entry: IndexEntry) -> Path:
    """The last full build's BM25 base: the segment LexicalIndex.write_built writes (write_updated links it)."""
    return ws.root / entry.lexical_path / "segment-0"


# From this many queries at once a flat index's scores are one matrix product (BLAS), below it a scan of
# the vectors per query. FAISS 1.15 switches on query floats (queries x dimension) against a process-wide
# threshold, 128,000 by default: 125 queries of 1,024-d, so a search's batch was always scanned. On one
# thread a scan was faster for up to three queries, BLAS from four on, and by more the more queries there
# were (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
FLAT_BLAS_MIN_QUERIES = 4
DEEP_RESCORE = 10  # candidates re-scored per result past the 10th (candidates_to_rescore)


def load_index(path: Path) -> faiss.Index:
    """A FAISS index file as search and the server use it: an IVF index's lists memory-mapped (read from
    disk as searches touch them, whether they were written in the file or beside it: common/dense/ivf.py), any
    other index read whole. Sets FAISS's process-wide switch to matrix products for FLAT_BLAS_MIN_QUERIES
    queries or more of its dimension."""
    try:
        if not path.is_file():
            raise FileNotFoundError(path)
        if path.with_suffix(".ivfdata").exists():  # on-disk lists, found beside the file wherever the workspace is
            with quiet_stdout():  # FAISS prints where it found them
                index = faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR)
        else:  # (FAISS 1.15 crashes searching on-disk lists read with IO_FLAG_MMAP too)
            index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP)
    except FileNotFoundError:
        raise PipelineError(f"{path}: index file missing; run `pipeline index --rebuild`") from None
    except RuntimeError:  # FAISS's own message names neither the file nor what to do ("read error in : 918 != ...")
        raise PipelineError(
            f"{path}: damaged FAISS index file (it cannot be read whole: truncated or overwritten?); "
            "run `pipeline index --rebuild`"
        ) from None
    faiss.cvar.distance_compute_blas_threshold = FLAT_BLAS_MIN_QUERIES * index.d
    return index


def rescore_dtype(dim: int) -> np.dtype:
    """A row of an IVF index's rescoring file: a stored vector's int8 codes and scale (common/vectors.py)."""
    return np.dtype([("codes", np.int8, (dim,)), ("scale", np.float32)])


def read_rescore(path: Path, dim: int) -> np.ndarray:
    """The rescoring rows by slot, memory-mapped: a search reads the rows of its candidates only."""
    try:
        rows = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise PipelineError(f"{path}: rescoring file missing; run `pipeline index --rebuild`") from None
    except (OSError, ValueError):
        rows = None
    if rows is None or rows.dtype != rescore_dtype(dim):
        raise PipelineError(f"{path}: damaged rescoring file; run `pipeline index --rebuild`")
    return rows


def candidates_to_rescore(rescore: int, n: int) -> int:
    """How many of an IVF index's candidates are re-scored for its best n: `rescore` (tuned for the top 10)
    per result for the first 10, DEEP_RESCORE per result beyond. For hybrid search's deep fetch this kept nearly
    all the recall of re-scoring `rescore` each at a fraction of the time a query, where fewer lost recall
    (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
    return rescore * min(n, 10) + min(rescore, DEEP_RESCORE) * max(0, n - 10)


def rescored(query: np.ndarray, slots: np.ndarray, rows: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The best n of the candidate `slots` for one query vector [dim], by exact scores from the rescoring
    rows: (slots, scores), best first (ties by slot)."""
    candidates = np.sort(slots).astype(np.int64)  # the memory-mapped rows read in file order
    records = np.asarray(rows).view(np.int8).reshape(len(rows), rows.dtype.itemsize)  # codes, then the scale
    exact = scores(query, records, np.asarray(rows["scale"]), candidates)
    best = np.lexsort((candidates, -exact))[:n]
    return candidates[best], exact[best]
