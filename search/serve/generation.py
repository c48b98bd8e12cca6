"""The served generation: the search engine now answering, the watcher thread that loads a rebuilt index
beside it and swaps it in, and the document API's writes (`Generation.write`), which publish to the store,
update the index and load the result before they return."""
from __future__ import annotations

import logging
import threading
import time

import duckdb

from common.console import info, warn
from common.errors import PipelineError
from common.indexes import check_store, update_from_store
from common.ingest import content_hash, document_rows
from common.readers import Document
from common.store import Store, embedder_key, stale_index_message
from common.workspace import Workspace
from search.engine import SearchEngine

POLL_SECONDS = 1.0
WRITE_WAIT_SECONDS = 10.0  # how long a document write waits for another writer (e.g. `pipeline embed`) before a 503
log = logging.getLogger("pipeline.serve")


class WriteConflict(Exception):
    """The served index and the workspace's embedder disagree: documents cannot be added to it."""


class UnknownDocument(Exception):
    """A deletion names a document the store does not hold."""


class Generation:
    """The engine now serving, the watcher that replaces it when the index is rebuilt, and the document
    API's writes (`write`)."""

    def __init__(self, ws: Workspace, poll_seconds: float = POLL_SECONDS):
        self.ws = ws
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        # DuckDB refuses a read-only and a read-write connection to one file in one process: loading a
        # generation and writing documents take turns.
        self._store_lock = threading.RLock()
        self._stop = threading.Event()
        self._seen_mtime = self._manifest_mtime()
        self.engine = SearchEngine(ws)
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
            manifest = self.ws.read_manifest()
            entry = manifest.get("index")
            old = self.current()
            if not entry or entry == old.index_entry:
                self._seen_mtime = mtime  # another stage wrote the manifest; the index is unchanged
                return False
            store_generation = manifest.get("embedder", {}).get("store_generation")
            if entry.get("store_generation") != store_generation:  # known stale without reading the store
                raise PipelineError(stale_index_message(entry.get("store_generation"), store_generation))
            same_model = entry.get("embedder_fingerprint") == old.index_entry.get("embedder_fingerprint")
            new = SearchEngine(self.ws, reuse_model=old.model if same_model else None)
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
        info(f"loaded the rebuilt index ({entry.get('vectors')} vectors)")
        return True

    def write(self, upserts: list[Document], deletes: list[str]) -> dict:
        """Store these documents (new or changed ones embedded with the served model) and delete `deletes`
        in one publish of the store, update the index (common/indexes.py) and serve the result: searchable
        when this returns. One writer at a time: the workspace's writer lock, shared with `pipeline
        embed` and `pipeline index`, waited for up to WRITE_WAIT_SECONDS."""
        with self._store_lock, self.ws.writing(wait=WRITE_WAIT_SECONDS):
            engine = self.current()
            embedder = self.ws.require("embedder", "run `pipeline embed` first")
            if engine.index_entry["embedder_fingerprint"] != embedder["fingerprint"] or engine.index_entry["embedder_chunking"] != [embedder["chunk_tokens"], embedder["overlap"]]:
                raise WriteConflict("the workspace's documents were embedded with another model or chunking than the served "
                                    "index: run `pipeline index`, then the server loads it")
            key = embedder_key(embedder["fingerprint"], embedder["chunk_tokens"], embedder["overlap"])
            with Store(self.ws.db_path) as store:
                check_store(store, embedder, self.ws)
                stored = store.document_hashes()
                missing = [doc_id for doc_id in deletes if doc_id not in stored]
                if missing:
                    raise UnknownDocument(f"no document with id '{missing[0]}'")
                todo = [d for d in upserts if stored.get(d.id) != content_hash(d)]
                if not todo and not deletes:
                    return {"stored": 0, "unchanged": len(upserts), "deleted": 0, "store_generation": store.generation()}
                staged = store.stage(int(embedder["dim"]), key, {d.id: content_hash(d) for d in todo})
                to_embed = [d for d in todo if d.id not in staged]  # an interrupted `pipeline embed` staged the rest
                if to_embed:
                    rows, vectors = engine.chunk_and_embed(to_embed, embedder["chunk_tokens"], embedder["overlap"], store.next_chunk_id())
                    store.write_documents(document_rows(to_embed), rows, vectors)
                generation = store.publish(replace_all=False, remove=deletes)  # what search sees changes here, at once
                counts = store.counts()
            self.ws.update_manifest("embedder", {**embedder, "documents": counts["documents"], "chunks": counts["chunks"],
                                                 "store_generation": generation})
            index = update_from_store(self.ws)
            self.check(raise_errors=True)
        return {"stored": len(todo), "unchanged": len(upserts) - len(todo), "deleted": len(deletes), "store_generation": generation,
                "index": {key: index[key] for key in ("update", "update_reason", "vectors", "delta_vectors", "deleted_in_base")}}

    def start(self) -> None:
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
