"""Writing a FAISS index file: under a name no file has had, whole or not at all (the manifest then names it,
so a reader never sees a half-written index)."""

from __future__ import annotations

import uuid
from pathlib import Path

import faiss

from common.workspace import atomic_write_bytes


def new_index_path(index_dir: Path, prefix: str) -> Path:
    """A name no index file has had: the manifest then names it, so a reader never sees a half-written index."""
    return index_dir / f"{prefix}-{uuid.uuid4().hex[:12]}.index"


def write_faiss(index: faiss.Index, index_dir: Path, prefix: str, path: Path | None = None) -> Path:
    """Write under a new name (`path`, else one new_index_path makes) and return it."""
    path = path or new_index_path(index_dir, prefix)
    atomic_write_bytes(path, faiss.serialize_index(index).tobytes())
    return path
