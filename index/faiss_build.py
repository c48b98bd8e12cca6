"""A FAISS index built over stored vectors and tuned: the type chosen, trained and filled (common/dense/ivf.py for the
IVF family, in slices), its search widths tuned for the recall target on queries made from the collection's
own documents, and its files written: for `pipeline index`'s full build (index/build.py) and for each shard of a
sharded one (index/shards.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from common.console import info, warn
from common.dense.files import new_index_path, write_faiss
from common.dense.index_types import (
    TARGET_RECALL,
    choose_type,
    exact_neighbours,
    make_index,
    query_spans,
    recall_sample,
    tune_search,
)
from common.dense.ivf import build_ivf, new_staging, remove_staging
from common.embedder import encode, load_embedder
from common.errors import PipelineError
from common.manifest import read_manifest
from common.store import Store
from common.workspace import Workspace


@dataclass
class ShardBuild:
    """Where one shard's files go (index/shards.py), and the IVF training every shard is filled from (None:
    not IVF; on_disk: whether it was trained for lists on disk)."""

    directory: Path
    trained: faiss.Index | None = None
    on_disk: bool | None = None


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
    return {**built, **recall_record(built["recall_at_10"], built["search_setting"]), "reason": reason, "dim": dim}


def recall_record(recall: float | None, search_setting: dict | None) -> dict:
    """The manifest's record of how an index's recall compares with the target, warning when it falls short."""
    short = recall is not None and recall < TARGET_RECALL
    if short:
        warn(
            f"recall@10 {recall:.3f} is below the target {TARGET_RECALL} at the widest search tried "
            f"({search_setting}): results may miss some of the nearest chunks; `pipeline index --type flat` "
            "searches exactly"
        )
    return {"recall_target": TARGET_RECALL, "recall_short": short}


def tuning_queries(ws: Workspace, store: Store, n: int) -> np.ndarray | None:
    """The queries an approximate index is tuned with (common/dense/index_types.py QUERY_WORDS): spans of
    recall_sample(n) stored documents (a seeded sample) embedded by the workspace's embedder as search embeds
    a query; None (stored vectors as queries) when no document has text."""
    spans = query_spans([text or "" for _, _, text in store.document_texts(recall_sample(n))])
    if not spans:
        return None
    return encode(load_embedder(read_manifest(ws).embedder.model_dir(ws)), spans)


def build_and_tune(
    ws: Workspace,
    kind: str,
    store: Store,
    ids: np.ndarray,
    dim: int,
    memory_budget: int,
    queries: np.ndarray | None,
    shard: ShardBuild | None = None,
) -> dict:
    """Build, tune (on `queries`: tuning_queries) and write one index of `kind`; returns what the manifest
    records of it. `ids`: every stored chunk, or a shard's (index/shards.py), whose files go in its directory."""
    start = time.perf_counter()
    index_dir = ws.index_dir if shard is None else shard.directory
    rescore, lists, trained, extra = None, None, None, {}
    if kind in ("ivf", "ivfpq"):
        staging = new_staging(index_dir)
        # On-disk lists are found by their file's name, beside the index file: named after it from the start.
        path = new_index_path(index_dir, "faiss")
        try:
            lists_name = path.with_suffix(".ivfdata").name
            built = build_ivf(
                kind,
                store,
                ids,
                dim,
                staging,
                memory_budget,
                recall_sample(len(ids)),
                lists_name,
                queries=queries,
                trained=None if shard is None else shard.trained,
                on_disk=None if shard is None else shard.on_disk,
            )
            build_seconds = time.perf_counter() - start
            index, queries, truth, own_ids = built.index, built.queries, built.truth, built.own_ids
            recall, search_setting = tune_search(index, kind, queries, truth, own_ids, built.rescore)
            if built.on_disk_lists is not None:
                lists = built.on_disk_lists.rename(path.with_suffix(".ivfdata"))
            write_faiss(index, index_dir, "faiss", path)
            rescore = (staging / "rescore.npy").rename(path.with_suffix(".rescore.npy"))
            built.trained.nprobe = search_setting["nprobe"]  # an update's delta is searched as the base is
            trained = write_faiss(built.trained, index_dir, "faiss", path.with_suffix(".trained.index"))
            extra = {"centroid_distance": built.centroid_distance}
        finally:
            remove_staging(staging)
    else:
        _, vectors = store.load_vectors(None if shard is None else ids)
        index = make_index(kind, vectors, ids)
        build_seconds = time.perf_counter() - start
        recall, search_setting = None, None
        if kind != "flat":
            recall, search_setting = tune_search(
                index, kind, *exact_neighbours(ids, vectors, recall_sample(len(ids)), queries=queries)
            )
        path = write_faiss(index, index_dir, "faiss")
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
