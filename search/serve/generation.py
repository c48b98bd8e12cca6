"""The served generation: the search engine now answering, the watcher thread that loads a rebuilt index
beside it and swaps it in, and the document API's writes (`Generation.write`): the store and the indexes
changed by `write_documents` (given by workflows.py: embed's upsert, then index's refresh, the same two
functions `pipeline embed` and `pipeline index` use), the result loaded before they return."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import duckdb

from common.console import info, warn
from common.errors import PipelineError
from common.manifest import read_manifest, require
from common.readers import Document
from common.workspace import Workspace
from search.engine import OpenShards, SearchEngine, local_shards

POLL_SECONDS = 1.0
WRITE_WAIT_SECONDS = 10.0  # how long a document write waits for another writer (e.g. `pipeline embed`) before a 503
SERVED_WAIT_SECONDS = 120.0  # how long a write waits for another process to serve what it wrote (Ray Serve)
log = logging.getLogger("pipeline.serve")


@dataclass(frozen=True)
class IndexUpdated:
    """How a write's index update went (index/build.py refresh_indexes): the reply's `index`."""

    update: str  # "incremental" (the last build updated), or "full"
    update_reason: str
    vectors: int
    delta_vectors: int
    deleted_in_base: int


@dataclass(frozen=True)
class DocumentsWritten:
    """What a document write did: the reply of POST /documents and DELETE /documents/{id} (schemas.py
    WriteResponse). `index` is None when nothing changed, so the index was not touched."""

    stored: int  # new or changed documents, embedded and stored
    unchanged: int  # identical to their stored version
    deleted: int
    store_generation: int
    index: IndexUpdated | None = None


# (workspace, the serving engine, documents to store, ids to delete) -> what was written
WriteDocuments = Callable[[Workspace, SearchEngine, list[Document], list[str]], DocumentsWritten]


class WriteConflict(Exception):
    """The served index and the workspace's embedder disagree: documents cannot be added to it."""


class Generation:
    """The engine now serving, the watcher that replaces it when the index is rebuilt, and the document
    API's writes (`write`)."""

    def __init__(
        self,
        ws: Workspace,
        write_documents: WriteDocuments,
        poll_seconds: float | None = POLL_SECONDS,
        open_shards: OpenShards = local_shards,
    ):
        """poll_seconds None: no watcher; the index is reloaded when `check` is called (search/serve/ray_serve.py:
        once every shard of the new index is deployed), and a write waits for that."""
        self.ws = ws
        self.write_documents = write_documents
        self.poll_seconds = poll_seconds
        self.open_shards = open_shards
        self._lock = threading.Lock()
        # DuckDB refuses a read-only and a read-write connection to one file in one process: loading a
        # generation and writing documents take turns.
        self._store_lock = threading.RLock()
        self._stop = threading.Event()
        self._seen_mtime = self._manifest_mtime()
        self.engine = SearchEngine(ws, open_shards=open_shards)
        self.loaded_at = time.time()
        self.reloads = 0
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None

    def current(self) -> SearchEngine:
        with self._lock:
            return self.engine

    def _manifest_mtime(self) -> int:
        try:
            return self.ws.manifest_path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def check(self, raise_errors: bool = False) -> bool:
        """Load and swap in a rebuilt index if the manifest says there is one. True if it swapped."""
        with self._store_lock:
            return self._check(raise_errors)

    def _check(self, raise_errors: bool) -> bool:
        mtime = self._manifest_mtime()
        if mtime == self._seen_mtime:
            return False
        try:
            manifest = read_manifest(self.ws)
            entry = manifest.index
            old = self.current()
            if entry is None or entry == old.index_entry:
                self._seen_mtime = mtime  # another stage wrote the manifest; the index is unchanged
                return False
            store_generation = manifest.embedder.store_generation if manifest.embedder else None
            if entry.stale_reason(store_generation):  # known stale without reading the store
                raise PipelineError(entry.stale_reason(store_generation))
            same_model = entry.embedder_fingerprint == old.index_entry.embedder_fingerprint
            new = SearchEngine(self.ws, reuse_model=old.model if same_model else None, open_shards=self.open_shards)
        except (PipelineError, OSError, duckdb.Error) as e:
            if raise_errors:
                raise
            # E.g. `pipeline embed` holds the store while it writes: keep serving, try again on the next poll.
            if str(e) != self.last_error:
                warn(f"keeping the current index: cannot load the rebuilt one yet ({e})")
            self.last_error = str(e)
            return False
        with self._lock:
            self.engine = new
            self._seen_mtime = mtime
            self.reloads += 1
            self.loaded_at = time.time()
            self.last_error = None
        info(f"loaded the rebuilt index ({entry.vectors} vectors)")
        return True

    def write(self, upserts: list[Document], deletes: list[str]) -> DocumentsWritten:
        """Store these documents (new or changed ones embedded with the served model) and delete `deletes`
        in one publish of the store, update the index (of a sharded one, the shards they belong to) and serve
        the result: searchable when this returns. One writer at a time: the workspace's writer lock, shared
        with `pipeline embed` and `pipeline index`, waited for up to WRITE_WAIT_SECONDS."""
        with self._store_lock, self.ws.writing(wait=WRITE_WAIT_SECONDS):
            engine = self.current()
            if not engine.index_entry.built_by(require(self.ws, "embedder", "run `pipeline embed` first")):
                raise WriteConflict(
                    "the workspace's documents were embedded with another model or chunking than the served "
                    "index: run `pipeline index`, then the server loads it"
                )
            written = self.write_documents(self.ws, engine, upserts, deletes)
            if self.poll_seconds is not None:
                self.check(raise_errors=True)
                return written
        self.wait_until_served(read_manifest(self.ws).index.build_id)
        return written

    def wait_until_served(self, build_id: str) -> None:
        """Wait until the index `build_id` is the one served, loaded by whoever reloads this generation (on Ray
        Serve the driver, once the shards a write changed are deployed: search/serve/ray_serve.py)."""
        deadline = time.monotonic() + SERVED_WAIT_SECONDS
        while self.current().index_entry.build_id != build_id:
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"the documents are stored and indexed (index {build_id}), but that index was not served "
                    f"within {SERVED_WAIT_SECONDS:.0f} s; they are searchable once it is"
                )
            time.sleep(0.05)

    def start(self) -> None:
        if self.poll_seconds is None:
            return

        def watch():
            while not self._stop.wait(self.poll_seconds):
                try:
                    self.check()
                except Exception as e:  # the watcher must never die; the old generation keeps serving
                    log.exception("index watcher: %s", e)

        self._thread = threading.Thread(target=watch, name="index-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
