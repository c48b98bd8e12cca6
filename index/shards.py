"""Sharded indexes: `pipeline index --shards N [--ray ADDRESS]`.

The collection is split by document: a document's shard is its id's MD5 modulo N (`shard_of`; in SQL DuckDB's
md5_number_lower, the same number: Store.shard), so a document and all its chunks are in one shard, whatever
the machine or the order documents came in, and a write to a document concerns one shard. Each shard is an
index generation of its own, in index/shards-<build>/<i>/: a FAISS index, a BM25 index of its chunks and the
corpus snapshot of its documents (what its hits show, and its filter table). Search (search/engine.py) asks
every shard and merges: BM25 with the collection's statistics summed over the shards (common/lexical/
CollectionStatistics, the DFS phase of a distributed search engine), so that N shards answer as one index.

What is decided once for the collection, not per shard: the BM25 analyzer (the language, detected on a sample
of every chunk), the index type (chosen for the largest shard), the queries approximate indexes are tuned
with, and an IVF index's training: trained once on a sample of the collection and filled per shard, as
FAISS's distributed recipe does (each shard then tunes its own search widths for the recall target).

Shards are built as Ray tasks with --ray (in parallel across the cluster's nodes; each task opens the store
read-only, so the workspace must be on storage every node reads), else one after another in this process.
A sharded index is built in full by every `pipeline index`. A document written through the server concerns
one shard: `update_shards` updates the shards whose chunks changed as an unsharded index is updated (a delta
beside the shard's base: index/update.py; its snapshot written from its last one) and keeps the others as
they are, with their build id, so that their Ray Serve deployments go on serving.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import faiss
import numpy as np

from common.console import info
from common.dense.index_types import choose_type
from common.dense.ivf import codes_bytes, train_ivf
from common.dense.reader import base_segment_dir
from common.errors import PipelineError
from common.lexical import Analyzer, LexicalIndex, Segment
from common.manifest import IndexEntry
from common.snapshot.reader import Snapshot
from common.snapshot.writer import write_corpus
from common.store import Store, short_hash
from common.workspace import Workspace, write_directory
from index.faiss_build import ShardBuild, build_and_tune, recall_record, tuning_queries
from index.files import shard_dir
from index.update import Drifted, chunks_to_index, deleted_since, update, update_summary


def shard_of(doc_id: str, shards: int) -> int:
    """The shard of the document `doc_id` among `shards`: its id's MD5, last 8 bytes little-endian, modulo."""
    return short_hash(doc_id) % shards


def build_shards(
    ws: Workspace,
    shards: int,
    kind: str,
    store: Store,
    generation: int,
    analyzer: Analyzer,
    memory_budget: int,
    reason: str,
    ray_address: str | None = None,
) -> dict:
    """Build every shard of the store's collection at `generation` into a new index/shards-<build>/ and return
    what the manifest records: the whole (type, vectors, the directory) and each shard (`shards`: what an
    unsharded index's record holds, its paths under the directory)."""
    parts = [store.shard(i, shards) for i in range(shards)]
    empty = [i for i, (chunk_ids, _) in enumerate(parts) if not len(chunk_ids)]
    if empty:
        raise PipelineError(
            f"--shards {shards}: shard {empty[0]} would hold no documents (the store holds "
            f"{store.counts()['documents']:,}): use fewer shards"
        )
    largest = max(len(chunk_ids) for chunk_ids, _ in parts)
    chosen, why = (kind, f"--type {kind}") if kind != "auto" else choose_type(largest)
    dim = int(store.get_meta("dim"))
    total = sum(len(chunk_ids) for chunk_ids, _ in parts)
    info(f"{reason}: {shards} shards of {total:,} chunks (the largest {largest:,}), {chosen} each ({why})")
    trained, on_disk = None, None
    if chosen in ("ivf", "ivfpq"):
        if largest < 39:
            raise PipelineError(
                f"--type {chosen} needs at least 39 vectors a shard to train, the largest has {largest}"
            )
        on_disk = codes_bytes(chosen, largest, dim) > memory_budget
        live = np.concatenate([chunk_ids for chunk_ids, _ in parts])
        trained = faiss.serialize_index(train_ivf(chosen, store, np.sort(live), dim, on_disk))
    queries = tuning_queries(ws, store, largest) if chosen != "flat" else None
    directory = ws.index_dir / f"shards-{uuid.uuid4().hex[:12]}"
    directory.mkdir(parents=True)
    shared = (chosen, analyzer, trained, on_disk, generation, queries, memory_budget)
    arguments = [
        (str(ws.root), str(shard_dir(directory, i)), chunk_ids, doc_ids, *shared)
        for i, (chunk_ids, doc_ids) in enumerate(parts)
    ]
    start = time.perf_counter()
    try:
        if ray_address:
            from common.ray_cluster import connect, notices_on_stderr

            ray = connect(ray_address)
            task = ray.remote(num_cpus=1)(build_shard)
            with notices_on_stderr():
                built = ray.get([task.remote(*shard_arguments) for shard_arguments in arguments])
        else:
            built = [build_shard(*shard_arguments) for shard_arguments in arguments]
    except BaseException:  # nothing names these shards: they go, and the last build stays in use
        shutil.rmtree(directory, ignore_errors=True)
        raise
    info(
        f"{shards} shards built in {time.perf_counter() - start:.1f}s"
        + (f" on Ray ({ray_address})" if ray_address else "")
    )
    recalls = [shard["recall_at_10"] for shard in built if shard["recall_at_10"] is not None]
    relative = str(directory.relative_to(ws.root))
    return {
        "path": relative,
        "corpus_path": relative,
        "type": chosen,
        "reason": why,
        "dim": dim,
        "update": "full",
        "update_reason": reason,
        "base_vectors": total,
        "delta_vectors": 0,
        "deleted_in_base": 0,
        "recall_at_10": min(recalls) if recalls else None,
        "recall_short": any(shard["recall_short"] for shard in built),
        "build_seconds": time.perf_counter() - start,
        "shards": built,
    }


def build_shard(
    root: str,
    directory: str,
    chunk_ids: np.ndarray,
    doc_ids: list[str],
    kind: str,
    analyzer: Analyzer,
    trained: np.ndarray | None,
    on_disk: bool | None,
    generation: int,
    queries: np.ndarray | None,
    memory_budget: int,
) -> dict:
    """One shard's FAISS index, BM25 index and corpus snapshot, in `directory` (a Ray task, or called here);
    returns its record, paths relative to the workspace."""
    ws, shard_dir = Workspace(Path(root)), Path(directory)
    shard_dir.mkdir()
    with Store(ws.db_path, read_only=True) as store:
        dim = int(store.get_meta("dim"))
        shard = ShardBuild(shard_dir, faiss.deserialize_index(trained) if trained is not None else None, on_disk)
        built = build_and_tune(ws, kind, store, chunk_ids, dim, memory_budget, queries, shard)
        lexical_dir = write_directory(
            lambda d: LexicalIndex.write_built(d, store.iter_chunk_rows(chunk_ids), analyzer),
            shard_dir,
            "lexical",
        )
        corpus_dir = write_corpus(shard_dir, store, chunk_ids, generation, doc_ids=doc_ids)
    return {
        **built,
        "build_id": uuid.uuid4().hex,  # the shard's own: an update of other shards keeps it
        **recall_record(built["recall_at_10"], built["search_setting"]),
        "dim": dim,
        "vectors": int(len(chunk_ids)),
        "base_vectors": int(len(chunk_ids)),
        "documents": len(doc_ids),
        "lexical_path": str(lexical_dir.relative_to(ws.root)),
        "corpus_path": str(corpus_dir.relative_to(ws.root)),
        "analyzer": analyzer.to_json(),
        "store_generation": generation,
    }


def update_shards(ws: Workspace, previous: IndexEntry, store: Store, generation: int) -> dict:
    """A document write's update of the sharded index `previous`: every shard whose chunks the store no longer
    matches is updated (a delta beside its base, and a corpus snapshot written from its last one, in its own
    directory), the others kept; returns what the manifest records, as build_shards does."""
    shards, updated = [], []
    for number, (record, entry) in enumerate(zip(previous.shards, previous.shard_entries())):
        chunk_ids, doc_ids = store.shard(number, len(previous.shards))
        if np.array_equal(chunk_ids, Snapshot(ws.root / entry.corpus_path).chunk_ids):
            shards.append(record)
            continue
        directory = shard_dir(ws.root / previous.path, number)
        base = Segment.load(base_segment_dir(ws, entry))
        added, vectors, batches = chunks_to_index(store, chunk_ids, base, vectors=entry.trained_path is None)
        reason = (
            f"shard {number}: update ({update_summary(base, len(added), deleted_since(base, chunk_ids, len(added)))})"
        )
        try:
            summary = update(ws, entry, base, added, vectors, batches, chunk_ids, reason, store, directory)
        except Drifted as drifted:
            raise PipelineError(f"shard {number} cannot be updated ({drifted}): run `pipeline index`") from None
        corpus_dir = write_corpus(directory, store, chunk_ids, generation, ws.root / entry.corpus_path, doc_ids)
        shards.append(
            {
                **record,
                **summary,
                "vectors": int(len(chunk_ids)),
                "documents": len(doc_ids),
                "corpus_path": str(corpus_dir.relative_to(ws.root)),
                "store_generation": generation,
                "build_id": uuid.uuid4().hex,
            }
        )
        updated.append(number)
    return {
        **previous.to_json(),
        "update": "incremental",
        "update_reason": f"update of shard{'s' * (len(updated) != 1)} {', '.join(map(str, updated)) or 'none'}",
        "delta_vectors": sum(int(shard.get("delta_vectors") or 0) for shard in shards),
        "deleted_in_base": sum(int(shard.get("deleted_in_base") or 0) for shard in shards),
        "shards": shards,
    }
