"""The workspace: one directory holding everything a run produces (the manifest tying the parts together is
common/manifest.py).

Layout (all paths relative to the workspace root):
    manifest.json        which tokenizer, model, embedder and index belong together
    tokenizer/           tokenizer.json trained on the user's data
    data/                token shards (train-00000.bin ..., val-00000.bin ...) and meta.json
    checkpoints/         step_XXXXXXXX/ directories (torch.distributed.checkpoint)
    model/               the exported Hugging Face + sentence-transformers model
    metrics.jsonl        one JSON object per logged training step / validation
    tensorboard/         TensorBoard event files, one directory per run (pretrain/, tune-static/, ...)
    pipeline.duckdb      documents, chunks and vectors (common/store/)
    index/               the FAISS index (faiss-<build>.index), the BM25 index (lexical-<id>/) and the corpus
                         snapshot search reads (corpus-<id>/: common/snapshot/reader.py)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common.errors import PipelineError

WORKSPACE_ENV = "PIPELINE_WORKSPACE"
LOCK_WAIT_ENV = "PIPELINE_LOCK_WAIT"
LOCK_WAIT_SECONDS = 30.0  # how long a writer waits for another one before giving up with an error


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


_RENAME_EXCHANGE = 2  # linux/fs.h: swap the two paths in one step
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where the system or the
    filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here
        return False
    raise OSError(errno, os.strerror(errno), str(b))


def write_directory(write: Callable[[Path], None], index_dir: Path, kind: str) -> Path:
    """Have `write` fill a staging directory under index_dir (a BM25 index: common/lexical/ write_built or
    write_updated; the corpus snapshot: common/snapshot/writer.py), then rename it to a fresh `kind`-<id> name and
    return that (the manifest then names it), so a reader always finds a complete directory."""
    index_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=index_dir, prefix=f".{kind}.staging."))
    try:
        write(staging)
        final = index_dir / f"{kind}-{uuid.uuid4().hex[:12]}"
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def replace_directory(staged: Path, final: Path) -> None:
    """Put the complete directory `staged` in place of `final` (same filesystem). os.replace cannot replace a
    non-empty directory, so the two are exchanged in one step: a process killed at any point leaves either
    the old directory or the new one at `final`, never neither. (Without the exchange, on other systems,
    the old directory is renamed aside first: a kill between the two renames leaves `final` missing.)"""
    if final.exists() and _exchange(staged, final):
        shutil.rmtree(staged, ignore_errors=True)  # now the old version
        return
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staged.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_fingerprint(model_dir: Path) -> str:
    """A short id for a model directory: the hash of its weight and config files, so a retrained model gets a new id."""
    digest = hashlib.sha256()
    files = sorted(
        p for p in model_dir.rglob("*") if p.is_file() and p.suffix in {".safetensors", ".json", ".bin", ".txt"}
    )
    if not files:
        raise PipelineError(f"{model_dir}: not a model directory (no weights or config files)")
    for p in files:
        digest.update(str(p.relative_to(model_dir)).encode())
        digest.update(file_sha256(p).encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Workspace:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))  # a path given as text, e.g. from the Python API

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def db_path(self) -> Path:
        return self.root / "pipeline.duckdb"

    @property
    def index_dir(self) -> Path:
        return self.root / "index"

    def create(self) -> "Workspace":
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    def recorded_path(self, path: Path) -> str:
        """How the manifest records a path: relative to the workspace root when it lies inside it (so the
        workspace can be moved or copied), else absolute (an external `--model DIR`)."""
        path = path.resolve()
        try:
            return str(path.relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    @property
    def writer_lock_path(self) -> Path:
        return self.root / ".writer.lock"

    @contextmanager
    def writing(self, wait: float | None = None):
        """Hold the workspace's writer lock: one writer at a time (`embed`, `index`). Waits up to `wait`
        seconds (default PIPELINE_LOCK_WAIT, else 30) for another writer to finish, then fails with one
        line. An advisory lock on a file (filelock, fcntl on Linux): the system releases it when its
        holder dies, so a killed command never leaves the workspace locked."""
        from filelock import FileLock, Timeout

        if wait is None:
            wait = float(os.environ.get(LOCK_WAIT_ENV, LOCK_WAIT_SECONDS))
        if not self.root.is_dir():
            raise PipelineError(f"no workspace at {self.root}")
        lock = FileLock(self.writer_lock_path)
        try:
            lock.acquire(timeout=wait)
        except Timeout:
            raise PipelineError(
                f"{self.root}: another command is writing to this workspace (waited {wait:g}s for "
                f"{self.writer_lock_path.name}); try again when it has finished"
            ) from None
        try:
            yield
        finally:
            lock.release()
