"""The index files on disk and their record in the manifest.

Each run writes new files and a new lexical directory under new names; the manifest's "index" section,
written last (`record`, its one writer), names them and the store generation they were built from, so a
reader that follows the manifest always sees a matching set, and a crash mid-build leaves the previous
index in use. Older files are removed after the manifest moved on. Search reads these files through
common/dense/.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np

from common.manifest import EmbedderEntry, IndexEntry, write_section
from common.workspace import Workspace


def record(ws: Workspace, summary: dict, embedder: EmbedderEntry, live: np.ndarray, generation: int) -> IndexEntry:
    """Name the new files, and the store generation they hold, in the manifest (last), then remove older ones
    (in a sharded index's directory too: what an update of a shard replaced). Returns the section recorded."""
    summary.update(
        {
            "vectors": int(len(live)),
            "embedder_fingerprint": embedder.fingerprint,
            "embedder_chunking": embedder.chunking,
            "lexical_chunks": int(len(live)),
            "store_generation": generation,
            "build_id": uuid.uuid4().hex,
        }
    )
    entry = IndexEntry.from_json(summary)
    write_section(ws, entry)
    remove_other_files(ws.index_dir, keep={Path(path).name for path in entry.all_paths})
    for number, shard in enumerate(entry.shard_entries() if entry.shards else []):
        remove_other_files(shard_dir(ws.root / entry.path, number), keep={Path(path).name for path in shard.all_paths})
    return entry


def shard_dir(index_path: Path, number: int) -> Path:
    """Where shard `number` of a sharded index (its directory: index_path) keeps its files."""
    return index_path / str(number)


def remove_other_files(index_dir: Path, keep: set[str]) -> None:
    """Remove what the manifest no longer names: older index versions, and what a killed build left."""
    for old in index_dir.iterdir():
        if old.name in keep:
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
