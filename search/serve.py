"""`pipeline serve`: search over HTTP with FastAPI on uvicorn.

    GET  /                  a web page: search box, ranked results with title, snippet and score
    GET  /search?q=...      ranked documents (k, mode, source, title, dense_weight as query parameters)
    POST /search            the same with a JSON body: {"q": ..., "k": 10, "mode": "hybrid", "filter": {"source": "docs/*"}}
    GET  /documents/{id}    one stored document
    GET  /health            liveness, what is loaded, whether it matches the store (never needs the API key)
    GET  /docs, /openapi.json   the OpenAPI description

The model and indexes are loaded once. A watcher thread notices when `pipeline index` has rebuilt the
index (the manifest's "index" section changed), loads the new generation beside the old one and swaps
it in under a lock: requests in flight finish on the generation they started with, none fails. Chunk
and document rows come from an in-memory copy of the store made at load time, so the server holds no
lock on the workspace's DuckDB file and `pipeline embed` can write to it meanwhile. An index is loaded
only with the store generation it was built from; when the documents change, the server keeps
answering from the generation it has and /health says so until `pipeline index` has run.

Requests are bounded and the bounds are declared in the OpenAPI description (query length, k, filter
length; a body over MAX_BODY_BYTES gets 413). Documents are read from the store: no route reads a file.

With an API key, /search and /documents need it (header X-API-Key, or ?api_key= for a browser);
the static page, the OpenAPI description and /health do not: they show no stored data.
"""
from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from contextlib import asynccontextmanager
from typing import Literal, Optional

import duckdb
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.console import info, warn
from common.errors import PipelineError
from common.store import stale_index_message
from common.workspace import Workspace
from search.engine import Filters, SearchEngine

# Bounds on a request, declared in the OpenAPI schema. A query longer than the model reads is embedded
# up to its input length (search/engine.py); the bound keeps a request's size, and BM25's work, small.
MAX_QUERY_CHARS = 2000
MAX_SERVE_K = 100
MAX_BODY_BYTES = 64 * 1024  # a JSON search request at its bounds, escaped, is under 20 KB
POLL_SECONDS = 1.0
PUBLIC_PATHS = {"/", "/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/favicon.ico"}
log = logging.getLogger("pipeline.serve")


class Generation:
    """The engine now serving, and the watcher that replaces it when the index is rebuilt."""

    def __init__(self, ws: Workspace, poll_seconds: float = POLL_SECONDS):
        self.ws = ws
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen_mtime = self._manifest_mtime()
        self.engine = SearchEngine(ws, in_memory=True)
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

    def check(self) -> bool:
        """Load and swap in a rebuilt index if the manifest says there is one. True if it swapped."""
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
            new = SearchEngine(self.ws, in_memory=True, reuse_model=old.model if same_model else None)
        except (PipelineError, OSError, duckdb.Error) as e:
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


QUERY_HELP = (f"The query, at most {MAX_QUERY_CHARS:,} characters. Dense search embeds it up to the model's input length "
              "(a longer query is cut there); lexical search reads all of it.")


class SearchFilter(BaseModel):
    source: Optional[str] = Field(None, max_length=500, description="Glob on the document's source file path, absolute or relative to the server's working directory, e.g. 'docs/*.md'.")
    title: Optional[str] = Field(None, max_length=500, description="Text the title must contain (case-insensitive).")


class SearchRequest(BaseModel):
    q: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, description=QUERY_HELP)
    k: int = Field(10, ge=1, le=MAX_SERVE_K, description="Number of documents.")
    mode: Optional[Literal["dense", "lexical", "hybrid"]] = Field(None, description="Default: the workspace's default mode (see /health).")
    dense_weight: Optional[float] = Field(None, ge=0.0, le=1.0, description="Hybrid: weight of the dense ranking (default: the workspace's, see /health).")
    filter: Optional[SearchFilter] = None


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message})


def create_app(ws: Workspace, api_key: str | None = None, poll_seconds: float = POLL_SECONDS) -> FastAPI:
    generation = Generation(ws, poll_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        generation.start()
        yield
        generation.stop()

    app = FastAPI(title="embedding-pipeline search", lifespan=lifespan, max_body_size=MAX_BODY_BYTES,
                  description="Search the documents of a pipeline workspace: dense, lexical (BM25) or hybrid.")
    app.state.generation = generation

    @app.middleware("http")
    async def require_key(request: Request, call_next):
        if api_key and request.url.path not in PUBLIC_PATHS:
            given = request.headers.get("x-api-key") or request.query_params.get("api_key") or ""
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return error(401, "missing or wrong API key (send it in the X-API-Key header)")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p not in ('body', 'query')) or 'body'}: {e['msg']}" for e in exc.errors())
        return error(422, problems or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("error while answering %s", request.url.path)
        return error(500, f"internal error ({type(exc).__name__}); the server keeps running")

    def run_search(body: SearchRequest) -> dict:
        engine = generation.current()
        start = time.perf_counter()
        filters = Filters(body.filter.source, body.filter.title) if body.filter else None
        try:
            hits = engine.search(body.q, body.k, body.mode, filters, body.dense_weight)
        except PipelineError as e:
            return error(400, str(e))
        except duckdb.Error as e:  # e.g. a malformed glob in the filter
            return error(400, f"bad filter: {str(e).splitlines()[0]}")
        return {"query": body.q, "mode": engine.resolve_mode(body.mode), "k": body.k,
                "took_ms": round((time.perf_counter() - start) * 1000, 2), "results": [h.to_dict() for h in hits]}

    @app.get("/search", summary="Search (query parameters)")
    def search_get(q: str = Query(..., min_length=1, max_length=MAX_QUERY_CHARS, description=QUERY_HELP),
                   k: int = Query(10, ge=1, le=MAX_SERVE_K),
                   mode: Optional[Literal["dense", "lexical", "hybrid"]] = None,
                   dense_weight: Optional[float] = Query(None, ge=0.0, le=1.0),
                   source: Optional[str] = Query(None, max_length=500),
                   title: Optional[str] = Query(None, max_length=500)):
        wanted = SearchFilter(source=source, title=title) if source or title else None
        return run_search(SearchRequest(q=q, k=k, mode=mode, dense_weight=dense_weight, filter=wanted))

    @app.post("/search", summary="Search (JSON body)")
    def search_post(body: SearchRequest):
        return run_search(body)

    @app.get("/documents/{doc_id:path}", summary="One stored document")
    def document(doc_id: str):
        found = generation.current().document(doc_id)
        return found if found is not None else error(404, f"no document with id '{doc_id}'")

    @app.get("/health", summary="Liveness, what is loaded, and whether it still matches the stored documents")
    def health():
        engine = generation.current()
        entry = engine.index_entry
        store_generation = ws.read_manifest().get("embedder", {}).get("store_generation")
        consistent = store_generation == entry.get("store_generation")
        problem = None if consistent else (stale_index_message(entry.get("store_generation"), store_generation)
                                           + "; serving the index loaded before until then")
        return {"status": "ok", "consistent": consistent, "problem": problem, "store_generation": store_generation,
                "index": {"type": entry.get("type"), "vectors": entry.get("vectors"), "build_id": entry.get("build_id"),
                          "store_generation": entry.get("store_generation"), "lexical": engine.lexical is not None},
                "default_mode": engine.resolve_mode(None), "default_dense_weight": engine.resolve_dense_weight(None), "model": str(engine.model_dir), "reloads": generation.reloads,
                "loaded_at": generation.loaded_at, "last_reload_error": generation.last_error, "auth": bool(api_key)}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page():
        return PAGE

    return app


def run_server(ws: Workspace, host: str, port: int, api_key: str | None) -> None:
    import uvicorn

    if not 0 < port < 65536:
        raise PipelineError(f"--port must be between 1 and 65535, got {port}")
    if api_key is not None and len(api_key) < 8:
        raise PipelineError("--api-key must be at least 8 characters")
    try:  # fail with one line, before loading anything, if the address is taken
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise PipelineError(f"cannot listen on {host}:{port} ({e.strerror})") from None
    # A query is a few tokens: one thread per forward pass and per FAISS search is ~10x faster than
    # torch's thread pool on a small, busy machine (57 ms -> 6 ms per query encode on 2 cores).
    import faiss
    import torch
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    app = create_app(ws, api_key)
    if host not in ("127.0.0.1", "localhost", "::1"):
        warn(f"listening on {host}: reachable from other machines" + ("" if api_key else " without an API key"))
    info(f"serving {ws.root} on http://{host}:{port}/  (API docs: /docs)")
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Search</title>
<style>
  body { font: 16px/1.45 system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; color: #1d1d1f; }
  form { display: flex; gap: .5rem; flex-wrap: wrap; }
  #q { flex: 1 1 20rem; padding: .55rem .7rem; font-size: 1.05rem; }
  button, select, input { padding: .5rem .7rem; font-size: 1rem; }
  #status { color: #666; margin: .8rem 0; min-height: 1.4em; }
  #status.error { color: #b00020; }
  ol { padding-left: 1.4rem; }
  li.result { margin: 0 0 1.1rem; }
  .title { font-weight: 600; margin: 0; font-size: 1.05rem; }
  .meta { color: #5f6368; font-size: .85rem; }
  .snippet { margin: .2rem 0 0; }
</style>
</head>
<body>
<h1>Search</h1>
<form id="search-form">
  <input id="q" name="q" type="search" placeholder="What are you looking for?" maxlength="2000" autofocus required>
  <select id="mode" name="mode" aria-label="mode">
    <option value="">default</option><option value="hybrid">hybrid</option>
    <option value="dense">dense</option><option value="lexical">lexical</option>
  </select>
  <input id="key" name="key" type="password" placeholder="API key" hidden>
  <button id="go" type="submit">Search</button>
</form>
<div id="status" role="status"></div>
<ol id="results"></ol>
<script>
const form = document.getElementById("search-form"), statusLine = document.getElementById("status");
const results = document.getElementById("results"), keyBox = document.getElementById("key");
const urlKey = new URLSearchParams(location.search).get("api_key");
fetch("health").then(r => r.json()).then(h => { if (h.auth && !urlKey) keyBox.hidden = false; });

function show(message, isError) {
  statusLine.textContent = message;
  statusLine.className = isError ? "error" : "";
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const params = new URLSearchParams({ q: document.getElementById("q").value, k: "10" });
  const mode = document.getElementById("mode").value;
  if (mode) params.set("mode", mode);
  const headers = {};
  const key = urlKey || keyBox.value;
  if (key) headers["X-API-Key"] = key;
  show("Searching…");
  results.replaceChildren();
  try {
    const response = await fetch("search?" + params, { headers });
    const body = await response.json();
    if (!response.ok) { show(body.error || ("error " + response.status), true); return; }
    show(body.results.length + " results (" + body.mode + ", " + body.took_ms + " ms)");
    for (const hit of body.results) {
      const item = document.createElement("li");
      item.className = "result";
      const title = document.createElement("p");
      title.className = "title";
      title.textContent = hit.title || hit.doc_id;
      const meta = document.createElement("div");
      meta.className = "meta";
      meta.textContent = "score " + hit.score.toFixed(4) + " · " + hit.doc_id + " · " + hit.source;
      const text = document.createElement("p");
      text.className = "snippet";
      text.textContent = hit.snippet;
      item.append(title, meta, text);
      results.append(item);
    }
  } catch (e) {
    show("The server did not answer: " + e, true);
  }
});
</script>
</body>
</html>
"""
