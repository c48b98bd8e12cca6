"""`pipeline serve`: search over HTTP with FastAPI on uvicorn.

    GET  /                  a web page: search with filters, highlighted snippets, each document's page
    GET  /search?q=...      ranked documents (k, mode, dense_weight, filter as JSON text, source, title)
    POST /search            the same with a JSON body: {"q": ..., "k": 10, "mode": "hybrid",
                            "filter": {"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}}}
    GET  /documents/{id}    one stored document, with its metadata
    POST /documents         add or replace documents: {"documents": [{"id", "title", "text", ...metadata}]}
    DELETE /documents/{id}  delete one
    GET  /fields            the fields a filter can use, with their types
    GET  /health            liveness, what is loaded, whether it matches the store (never needs the API key)
    GET  /docs, /openapi.json   the OpenAPI description (Swagger UI served from the swagger-ui-py package: works offline)

The model, indexes, documents and chunks are loaded once (search/engine.py): a request reads arrays, no
SQL, no file. A watcher thread notices when `pipeline index` has rebuilt the index (the manifest's
"index" section changed), loads the new generation beside the old one and swaps it in under a lock:
requests in flight finish on the generation they started with, none fails. The store is read once per
generation and let go, so `pipeline embed` can write to it meanwhile. An index is loaded only with the
store generation it was built from; when the documents change, the server keeps answering from the
generation it has and /health says so until `pipeline index` has run.

Writes (POST/DELETE /documents) embed new and changed documents with the served model, stage them and
publish them with the deletions in one store transaction (common/store.py), update the index
(common/indexes.py: a delta beside the base, deletions skipped) and load the result before answering,
so a document is searchable, or gone, when the call returns. One writer at a time per workspace: the
server takes the workspace's writer lock, as `pipeline embed` and `pipeline index` do, and waits up to
WRITE_WAIT_SECONDS for it, then answers 503; a write never leaves a half-written store (a failure before
the publish leaves only staged rows, which the next write or embed clears).

Filters are structured (common/filters.py): compiled to SQL with bound values over the loaded
documents' fields; an unknown field or operator, or a value of the wrong type, is a 422 naming it.
Requests are bounded and the bounds are declared in the OpenAPI description (query length, k, filter
length; a body over MAX_BODY_BYTES gets 413). Errors are {"error": "..."}, declared per route.

With an API key, /search, /documents (reads and writes) and /fields need it (header X-API-Key, or ?api_key= for a
browser; both declared as OpenAPI security schemes); the page, the docs and /health do not: they show
no stored data.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import os
import socket
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, Optional

import anyio
import duckdb
from fastapi import Depends, FastAPI, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import APIKeyHeader, APIKeyQuery
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.console import info, warn
from common.errors import PipelineError
from common.filters import OPERATORS, DocumentFilter, FilterError
from common.indexes import check_store, update_from_store
from common.ingest import content_hash, document_rows
from common.models import is_static
from common.readers import Document
from common.store import Store, embedder_key, stale_index_message
from common.workspace import Workspace
from search.engine import SearchEngine

# Bounds on a request, declared in the OpenAPI schema. A query longer than the model reads is embedded
# up to its input length (search/engine.py); the bound keeps a request's size, and BM25's work, small.
MAX_QUERY_CHARS = 2000
MAX_SERVE_K = 100
MAX_FILTER_CHARS = 2000
MAX_BODY_BYTES = 64 * 1024  # a JSON search request at its bounds, escaped, is under 20 KB
POLL_SECONDS = 1.0
WRITE_WAIT_SECONDS = 10.0  # how long a document write waits for another writer (e.g. `pipeline embed`) before a 503
MAX_UPSERT_DOCUMENTS = 100
API_SOURCE = "api"  # the source recorded for documents stored through POST /documents
SEARCH_THREADS = max(2, os.cpu_count() or 1)
log = logging.getLogger("pipeline.serve")


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


class SearchBatcher:
    """A static model's unfiltered searches, answered on the event loop, several at a time: the requests
    that arrive together (one turn of the loop) wait for one `search_many` per (k, mode, weight), whose
    one FAISS call reads the vectors once for all of them. Why on the event loop: a static model's search
    is ~2 ms, mostly Python holding the interpreter lock, so worker threads would only take turns at it and
    pay for the hand-offs (server CPU per hybrid request at 16 concurrent: 3.9-4.4 ms through the thread
    pool, 3.4 ms on the loop one at a time). A batch is answered WAIT_TURNS more turns of the loop after
    the turn its first request joined it: a request read in one turn reaches the batcher up to two turns
    later (the app awaits its way there), so waiting gathers the requests that arrived together (at 16
    concurrent: 3.9 requests a batch without waiting, 5.3 after one more turn, 7.5 after two or more;
    hybrid 430-490 -> 600-660 requests/s, p99 39-49 -> 31-36 ms). An idle server waits microseconds."""

    WAIT_TURNS = 2

    def __init__(self):
        self.pending: list[tuple[SearchEngine, "SearchRequest", asyncio.Future]] = []

    async def search(self, engine: SearchEngine, body: "SearchRequest") -> list:
        loop = asyncio.get_running_loop()
        if not self.pending:
            loop.call_soon(self._answer_pending, self.WAIT_TURNS)
        future = loop.create_future()
        self.pending.append((engine, body, future))
        return await future

    def _answer_pending(self, turns_left: int) -> None:
        if turns_left:  # let the requests already read reach the batch first
            asyncio.get_running_loop().call_soon(self._answer_pending, turns_left - 1)
            return
        pending, self.pending = self.pending, []
        groups: dict[tuple, list] = {}
        for engine, body, future in pending:
            groups.setdefault((id(engine), body.k, body.mode, body.dense_weight), []).append((engine, body, future))
        for members in groups.values():
            try:
                self._answer(members)
            except Exception as e:  # noqa: BLE001 -- a fault answers its requests (500), never leaves them waiting
                for _, _, future in members:
                    if not future.done():
                        future.set_exception(e)

    @staticmethod
    def _answer(members: list) -> None:
        engine, first, _ = members[0]
        try:
            answers = engine.search_many([body.q for _, body, _ in members], first.k, first.mode, None, first.dense_weight)
        except PipelineError:  # one request's error (e.g. a blank query) must not be the others': one at a time
            answers = None
        for i, (_, body, future) in enumerate(members):
            if future.done():  # its client went away
                continue
            if answers is not None:
                future.set_result(answers[i])
                continue
            try:
                future.set_result(engine.search(body.q, body.k, body.mode, None, body.dense_weight))
            except PipelineError as e:
                future.set_exception(e)


class WriteConflict(Exception):
    """The served index and the workspace's embedder disagree: documents cannot be added to it."""


class UnknownDocument(Exception):
    """A deletion names a document the store does not hold."""


QUERY_HELP = (f"The query, at most {MAX_QUERY_CHARS:,} characters. Dense search embeds it up to the model's input length "
              "(a longer query is cut there); lexical search reads all of it.")
MODE_HELP = "dense, lexical or hybrid. Default: the workspace's default mode, measured on its documents (`default_mode` in /health)."
FILTER_HELP = ("Only documents whose fields satisfy every condition: {\"field\": {\"operator\": value}} or {\"field\": value} "
               f"(= eq). Operators: {', '.join(OPERATORS)}. Fields: the documents' metadata (GET /fields), doc_id, title, source "
               "(source globs are also read relative to the server's working directory). Example: "
               '{"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}, "source": {"glob": "docs/**"}}. '
               "An unknown field or operator, or a value of the wrong type, is a 422 naming it.")
Scalar = str | int | float | bool


class FieldCondition(BaseModel):
    """Conditions on one field; all must hold. (The filter's shape in the OpenAPI description; requests are
    checked by common/filters.py against the loaded fields, which names what is wrong.)"""
    model_config = ConfigDict(extra="forbid")
    eq: Optional[Scalar] = None
    ne: Optional[Scalar] = None
    gt: Optional[Scalar] = None
    gte: Optional[Scalar] = None
    lt: Optional[Scalar] = None
    lte: Optional[Scalar] = None
    in_: Optional[list[Scalar]] = Field(None, alias="in")
    nin: Optional[list[Scalar]] = None
    glob: Optional[str] = None
    contains: Optional[Scalar] = None


class SearchRequest(BaseModel):
    q: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, description=QUERY_HELP)
    k: int = Field(10, ge=1, le=MAX_SERVE_K, description="Number of documents.")
    mode: Optional[Literal["dense", "lexical", "hybrid"]] = Field(None, description=MODE_HELP)
    dense_weight: Optional[float] = Field(None, ge=0.0, le=1.0, description="Hybrid: weight of the dense ranking (default: the workspace's, see /health).")
    filter: Optional[dict[str, Any]] = Field(None, description=FILTER_HELP, json_schema_extra={
        "additionalProperties": {"anyOf": [FieldCondition.model_json_schema(by_alias=True), {"type": "string"}, {"type": "number"}, {"type": "boolean"}]},
        "examples": [{"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}}]})


class SearchHit(BaseModel):
    rank: int
    score: float
    doc_id: str
    title: str
    source: str
    snippet: str = Field(description="Plain text (never HTML): the passage of the document's best chunk that best matches the query.")
    highlights: list[list[int]] = Field(description="[start, end) character offsets of the query's terms in `snippet`.")
    chunk_id: int
    metadata: dict[str, Any] = Field(description="The document's own fields beyond id, title and text, as stored.")


class SearchResponse(BaseModel):
    query: str
    mode: str
    k: int
    took_ms: float
    results: list[SearchHit]


class DocumentResponse(BaseModel):
    doc_id: str
    title: str
    source: str
    text: str
    metadata: dict[str, Any]
    chunks: int


class DocumentIn(BaseModel):
    """A document to store: its id, title and text; every other field is its metadata (filterable)."""
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{"id": "note-1", "title": "Vitamin D", "text": "Vitamin D and bone density.", "year": 2021}]})
    id: str = Field(..., min_length=1, max_length=500)
    title: str = Field("", max_length=2000)
    text: str = Field(..., pattern=r"\S", description="The text to chunk, embed and index (not empty: it is what search finds).")


class UpsertRequest(BaseModel):
    documents: list[DocumentIn] = Field(..., min_length=1, max_length=MAX_UPSERT_DOCUMENTS,
                                        description=f"At most {MAX_UPSERT_DOCUMENTS} documents (and a body of at most {MAX_BODY_BYTES:,} bytes). "
                                                    "A document with a stored id replaces it.")


class IndexUpdate(BaseModel):
    update: str = Field(description="incremental, or full")
    update_reason: str
    vectors: int
    delta_vectors: int
    deleted_in_base: int


class WriteResponse(BaseModel):
    stored: int = Field(description="Documents new or changed, embedded and stored.")
    unchanged: int = Field(description="Documents identical to their stored version (nothing to do).")
    deleted: int
    store_generation: int
    index: Optional[IndexUpdate] = None


class FieldsResponse(BaseModel):
    fields: dict[str, str] = Field(description="Field name -> its type in filters (DuckDB's: BIGINT, DOUBLE, BOOLEAN, DATE, TIMESTAMP, VARCHAR, VARCHAR[], ...).")
    operators: list[str]


class IndexInfo(BaseModel):
    type: Optional[str]
    vectors: Optional[int]
    build_id: Optional[str]
    store_generation: Optional[int]
    lexical: bool


class HealthResponse(BaseModel):
    status: str
    consistent: bool
    problem: Optional[str]
    store_generation: Optional[int]
    index: IndexInfo
    default_mode: str
    default_dense_weight: float
    model: str
    reloads: int
    loaded_at: float
    last_reload_error: Optional[str]
    auth: bool


class ErrorResponse(BaseModel):
    error: str = Field(description="What was wrong, in one line.")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message})


ERRORS = {400: {"model": ErrorResponse, "description": "A request the engine cannot answer (e.g. an empty query)."},
          401: {"model": ErrorResponse, "description": "Missing or wrong API key."},
          413: {"model": ErrorResponse, "description": f"Body over {MAX_BODY_BYTES:,} bytes."},
          422: {"model": ErrorResponse, "description": "Invalid parameters or filter; the message names the field."}}
SWAGGER_ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css")


def swagger_asset(name: str) -> bytes:
    import swagger_ui

    return (Path(swagger_ui.__file__).parent / "static" / name).read_bytes()


def create_app(ws: Workspace, api_key: str | None = None, poll_seconds: float = POLL_SECONDS) -> FastAPI:
    generation = Generation(ws, poll_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # A transformer's searches and the synchronous routes run in worker threads (a static model's searches
        # on the event loop: SearchBatcher). Python holds one lock for its bytecode, so threads beyond the
        # cores only take turns at it, less fairly the more there are: hybrid at 16 concurrent requests had
        # a p99 7.3x its p50 with the default 40 threads, 1.8x with 2 (one run each on a busy 2-core
        # machine, benchmarks/bench_serve.py). As many threads as cores still overlap FAISS's and numpy's
        # work, which releases the lock.
        anyio.to_thread.current_default_thread_limiter().total_tokens = SEARCH_THREADS
        generation.start()
        yield
        generation.stop()

    app = FastAPI(title="embedding-pipeline search", lifespan=lifespan, max_body_size=MAX_BODY_BYTES, docs_url=None, redoc_url=None,
                  description="Search the documents of a pipeline workspace: dense, lexical (BM25) or hybrid, with metadata filters.")
    app.state.generation = generation
    header_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="The server's --api-key.")
    query_key = APIKeyQuery(name="api_key", auto_error=False, description="The same key as a query parameter, for a browser.")

    def require_key(from_header: Optional[str] = Security(header_key), from_query: Optional[str] = Security(query_key)) -> None:
        if api_key and not hmac.compare_digest((from_header or from_query or "").encode(), api_key.encode()):
            raise StarletteHTTPException(401, "missing or wrong API key (send it in the X-API-Key header)")

    # Without a key nothing is checked, and the OpenAPI description declares no key (and a request skips
    # resolving the two key parameters).
    protected = [Depends(require_key)] if api_key else []

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

    batcher = SearchBatcher()

    async def run_search(body: SearchRequest):
        engine = generation.current()
        start = time.perf_counter()
        try:
            if is_static(engine.model) and not body.filter:
                hits = await batcher.search(engine, body)
            else:
                search = functools.partial(engine.search, body.q, body.k, body.mode, DocumentFilter.of(body.filter), body.dense_weight)
                # A transformer's forward pass (tens of ms) would stall every other request on the event loop.
                hits = search() if is_static(engine.model) else await run_in_threadpool(search)
        except FilterError as e:
            return error(422, str(e))
        except PipelineError as e:
            return error(400, str(e))
        # Returned as a response, not a dict: FastAPI would validate it against SearchResponse again (a
        # tenth of a search's cost); it has that shape by construction and the OpenAPI description keeps it.
        return JSONResponse({"query": body.q, "mode": engine.resolve_mode(body.mode), "k": body.k,
                             "took_ms": round((time.perf_counter() - start) * 1000, 2), "results": [h.to_dict() for h in hits]})

    @app.get("/search", summary="Search (query parameters)", response_model=SearchResponse, responses=ERRORS, dependencies=protected)
    async def search_get(q: str = Query(..., min_length=1, max_length=MAX_QUERY_CHARS, description=QUERY_HELP),
                         k: int = Query(10, ge=1, le=MAX_SERVE_K),
                         mode: Optional[Literal["dense", "lexical", "hybrid"]] = Query(None, description=MODE_HELP),
                         dense_weight: Optional[float] = Query(None, ge=0.0, le=1.0),
                         filter: Optional[str] = Query(None, max_length=MAX_FILTER_CHARS, description="The filter as JSON text: " + FILTER_HELP),
                         source: Optional[str] = Query(None, max_length=500, description="Shorthand for filter {\"source\": {\"glob\": ...}}."),
                         title: Optional[str] = Query(None, max_length=500, description="Shorthand for filter {\"title\": {\"contains\": ...}}.")):
        structured = {}
        if filter:
            try:
                structured = json.loads(filter)
            except json.JSONDecodeError as e:
                return error(422, f"filter: not JSON ({e.msg} at column {e.colno})")
            if not isinstance(structured, dict):
                return error(422, "filter: expected a JSON object of field -> condition")
        if source:
            structured.setdefault("source", {})
        if title:
            structured.setdefault("title", {})
        for name, operator, value in (("source", "glob", source), ("title", "contains", title)):
            if value:
                if not isinstance(structured[name], dict):
                    structured[name] = {"eq": structured[name]}
                structured[name][operator] = value
        return await run_search(SearchRequest(q=q, k=k, mode=mode, dense_weight=dense_weight, filter=structured or None))

    @app.post("/search", summary="Search (JSON body)", response_model=SearchResponse, responses=ERRORS, dependencies=protected)
    async def search_post(body: SearchRequest):
        return await run_search(body)

    @app.get("/documents/{doc_id:path}", summary="One stored document", response_model=DocumentResponse,
             responses={**ERRORS, 404: {"model": ErrorResponse, "description": "No such document."}}, dependencies=protected)
    def document(doc_id: str):
        found = generation.current().document(doc_id)
        return found if found is not None else error(404, f"no document with id '{doc_id}'")

    def write(upserts: list[Document], deletes: list[str]):
        try:
            return generation.write(upserts, deletes)
        except UnknownDocument as e:
            return error(404, str(e))
        except WriteConflict as e:
            return error(409, str(e))
        except PipelineError as e:  # another writer held the workspace past the wait, or the store is unusable
            return error(503, str(e))

    write_errors = {**ERRORS, 409: {"model": ErrorResponse, "description": "The served index is of another embedder than the workspace's documents."},
                    503: {"model": ErrorResponse, "description": "Another writer (e.g. `pipeline embed`) held the workspace too long; retry."}}

    @app.post("/documents", summary="Add or replace documents", response_model=WriteResponse, responses=write_errors, dependencies=protected)
    def upsert_documents(body: UpsertRequest):
        """Embedded with the workspace's model, stored in one publish of the store, added to both indexes:
        searchable when this returns. Documents identical to their stored version are left alone."""
        ids = [d.id for d in body.documents]
        if len(set(ids)) != len(ids):
            return error(422, f"documents: the id '{next(i for i in ids if ids.count(i) > 1)}' appears twice")
        return write([Document(d.id, d.title, API_SOURCE, d.text, dict(d.model_extra or {})) for d in body.documents], [])

    @app.delete("/documents/{doc_id:path}", summary="Delete a document", response_model=WriteResponse,
                responses={**write_errors, 404: {"model": ErrorResponse, "description": "No such document."}}, dependencies=protected)
    def delete_document(doc_id: str):
        """Removed from the store and from both indexes: no search returns it once this returns."""
        return write([], [doc_id])

    @app.get("/fields", summary="The fields filters can use", response_model=FieldsResponse, responses={401: ERRORS[401]}, dependencies=protected)
    def fields():
        return {"fields": generation.current().filters.fields, "operators": list(OPERATORS)}

    @app.get("/health", summary="Liveness, what is loaded, and whether it still matches the stored documents", response_model=HealthResponse)
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

    assets = {name: swagger_asset(name) for name in SWAGGER_ASSETS}

    @app.get("/docs", include_in_schema=False)
    def docs():
        return get_swagger_ui_html(openapi_url="openapi.json", title=app.title + " - docs",
                                   swagger_js_url="docs-assets/swagger-ui-bundle.js", swagger_css_url="docs-assets/swagger-ui.css",
                                   swagger_favicon_url="data:,")

    @app.get("/docs-assets/{name}", include_in_schema=False)
    def docs_asset(name: str):
        if name not in assets:  # two fixed files of the package, read at start: no path reaches the file system
            return error(404, f"no asset '{name}'")
        return Response(assets[name], media_type="text/javascript" if name.endswith(".js") else "text/css")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page():
        return PAGE

    return app


def run_server(ws: Workspace, host: str, port: int, api_key: str | None) -> None:
    import uvicorn

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
    # The standard library's event loop, even where uvloop is installed: uvloop served a saturated server's
    # requests out of turn (at 16 concurrent, p99 twice the median, against 1.1-1.3x with asyncio's loop,
    # for a server spending a fixed 2 ms per request; benchmarks/bench_serve.py).
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, loop="asyncio")


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Search</title>
<style>
  body { font: 16px/1.45 system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; color: #1d1d1f; }
  form { display: flex; gap: .5rem; flex-wrap: wrap; align-items: center; }
  #q { flex: 1 1 20rem; padding: .55rem .7rem; font-size: 1.05rem; }
  button, select, input { padding: .45rem .6rem; font-size: 1rem; }
  #filters { margin: .6rem 0 0; display: flex; flex-direction: column; gap: .4rem; }
  .filter { display: flex; gap: .4rem; flex-wrap: wrap; }
  #status { color: #666; margin: .8rem 0; min-height: 1.4em; }
  #status.error { color: #b00020; }
  ol { padding-left: 1.4rem; }
  li.result { margin: 0 0 1.1rem; }
  .title { font-weight: 600; margin: 0; font-size: 1.05rem; }
  .meta, .fields { color: #5f6368; font-size: .85rem; }
  .snippet { margin: .2rem 0 0; }
  mark { background: #fff2a8; padding: 0 .1em; }
  #document { white-space: pre-wrap; }
  #empty { color: #444; background: #f5f5f7; padding: .8rem 1rem; border-radius: .4rem; }
</style>
</head>
<body>
<h1><a href="./" id="home" style="color: inherit; text-decoration: none">Search</a></h1>
<form id="search-form">
  <input id="q" name="q" type="search" placeholder="What are you looking for?" maxlength="2000" autofocus required>
  <label>mode <select id="mode" name="mode" aria-label="mode">
    <option value="" id="default-mode">default</option><option value="hybrid">hybrid</option>
    <option value="dense">dense</option><option value="lexical">lexical</option>
  </select></label>
  <label>k <select id="k" name="k" aria-label="number of results">
    <option>5</option><option selected>10</option><option>20</option><option>50</option><option>100</option>
  </select></label>
  <input id="key" name="key" type="password" placeholder="API key" hidden>
  <button id="go" type="submit">Search</button>
  <button id="add-filter" type="button">+ filter</button>
</form>
<div id="filters"></div>
<div id="status" role="status"></div>
<div id="empty" hidden></div>
<ol id="results"></ol>
<article id="document-view" hidden><h2 id="document-title"></h2><div class="meta" id="document-meta"></div>
  <div class="fields" id="document-fields"></div><p id="document"></p></article>
<script>
const $ = (id) => document.getElementById(id);
const statusLine = $("status"), results = $("results"), keyBox = $("key"), filtersBox = $("filters"), empty = $("empty");
const urlKey = new URLSearchParams(location.search).get("api_key");
const OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "glob", "contains"];
let fields = {};

function show(message, isError) { statusLine.textContent = message; statusLine.className = isError ? "error" : ""; }
function headers() { const key = urlKey || keyBox.value; return key ? { "X-API-Key": key } : {}; }
function element(tag, className, text) { const e = document.createElement(tag); if (className) e.className = className; if (text !== undefined) e.textContent = text; return e; }
function pageUrl(params) { if (urlKey) params.set("api_key", urlKey); return "?" + params; }

function addFilterRow(field, operator, value) {
  const row = element("div", "filter");
  const fieldSelect = element("select", "filter-field"), opSelect = element("select", "filter-op");
  for (const name of Object.keys(fields)) fieldSelect.append(new Option(name + " (" + fields[name].toLowerCase() + ")", name));
  for (const op of OPERATORS) opSelect.append(new Option(op, op));
  const input = element("input", "filter-value"); input.placeholder = "value (in/nin: a, b, c)";
  const remove = element("button", "filter-remove", "×"); remove.type = "button"; remove.title = "remove this filter";
  remove.onclick = () => row.remove();
  if (field) { if (!(field in fields)) fieldSelect.append(new Option(field, field)); fieldSelect.value = field; }
  opSelect.value = operator || "eq";
  input.value = value === undefined ? "" : (Array.isArray(value) ? value.join(", ") : String(value));
  row.append(fieldSelect, opSelect, input, remove);
  filtersBox.append(row);
}

function typed(field, text) {
  const kind = (fields[field] || "VARCHAR").replace("[]", "");
  if (["BIGINT", "DOUBLE", "INTEGER"].includes(kind) && text.trim() !== "" && !isNaN(Number(text))) return Number(text);
  if (kind === "BOOLEAN" && (text === "true" || text === "false")) return text === "true";
  return text;
}

function currentFilter() {
  const filter = {};
  for (const row of filtersBox.querySelectorAll(".filter")) {
    const field = row.querySelector(".filter-field").value, op = row.querySelector(".filter-op").value;
    const text = row.querySelector(".filter-value").value;
    if (!field || text.trim() === "") continue;
    const value = (op === "in" || op === "nin") ? text.split(",").map(v => typed(field, v.trim())).filter(v => v !== "") : typed(field, text.trim());
    (filter[field] = filter[field] || {})[op] = value;
  }
  return filter;
}

function snippetNode(text, highlights) {
  const p = element("p", "snippet");
  let at = 0;
  for (const [start, end] of highlights) {  // plain text and <mark> elements: nothing is read as HTML
    p.append(document.createTextNode(text.slice(at, start)), element("mark", "", text.slice(start, end)));
    at = end;
  }
  p.append(document.createTextNode(text.slice(at)));
  return p;
}

function fieldsLine(metadata) {
  return Object.entries(metadata || {}).map(([name, value]) => name + ": " + (typeof value === "string" ? value : JSON.stringify(value))).join(" · ");
}

// Each search or document view takes a number; an answer arriving after a newer one started is dropped,
// so two searches in flight (a click while the page loads its address) never show both their results.
let latestView = 0;

async function runSearch(params) {
  const view = ++latestView;
  $("document-view").hidden = true; empty.hidden = true;
  results.replaceChildren();
  const filter = params.get("filter") ? JSON.parse(params.get("filter")) : {};
  const body = { q: params.get("q"), k: Number(params.get("k") || 10), filter };
  if (params.get("mode")) body.mode = params.get("mode");
  show("Searching…");
  try {
    const response = await fetch("search", { method: "POST", headers: { ...headers(), "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const answer = await response.json();
    if (view !== latestView) return;
    if (!response.ok) { show(answer.error || ("error " + response.status), true); return; }
    results.replaceChildren();
    show(answer.results.length + " results (" + answer.mode + ", " + answer.took_ms + " ms)");
    if (!answer.results.length) {
      empty.textContent = Object.keys(filter).length ? "No document matches this query with these filters. Try removing a filter or other words."
                                                     : "No document matches this query. Try other words" + (answer.mode === "lexical" ? ", or the dense or hybrid mode." : ".");
      empty.hidden = false;
    }
    for (const hit of answer.results) {
      const item = element("li", "result");
      const title = element("p", "title");
      const link = element("a", "doc-link", hit.title || hit.doc_id);
      link.href = pageUrl(new URLSearchParams({ doc: hit.doc_id }));
      title.append(link);
      const meta = element("div", "meta", "score " + hit.score.toFixed(4) + " · " + hit.doc_id + " · " + hit.source);
      item.append(title, meta);
      if (Object.keys(hit.metadata).length) item.append(element("div", "fields", fieldsLine(hit.metadata)));
      item.append(snippetNode(hit.snippet, hit.highlights));
      results.append(item);
    }
  } catch (e) {
    if (view === latestView) show("The server did not answer: " + e, true);
  }
}

async function showDocument(docId) {
  const view = ++latestView;
  results.replaceChildren(); empty.hidden = true;
  show("Loading…");
  const response = await fetch("documents/" + encodeURIComponent(docId).replaceAll("%2F", "/"), { headers: headers() });
  const doc = await response.json();
  if (view !== latestView) return;
  if (!response.ok) { show(doc.error || ("error " + response.status), true); return; }
  show("");
  $("document-title").textContent = doc.title || doc.doc_id;
  $("document-meta").textContent = doc.doc_id + " · " + doc.source + " · " + doc.chunks + " chunks";
  $("document-fields").textContent = fieldsLine(doc.metadata);
  $("document").textContent = doc.text;
  $("document-view").hidden = false;
}

function fromUrl() {
  const params = new URLSearchParams(location.search);
  $("q").value = params.get("q") || "";
  $("mode").value = params.get("mode") || "";
  $("k").value = params.get("k") || "10";
  filtersBox.replaceChildren();
  let filter = {};
  try { filter = JSON.parse(params.get("filter") || "{}"); } catch (e) { show("The filter in the address is not JSON", true); }
  for (const [field, condition] of Object.entries(filter)) {
    const conditions = (condition && typeof condition === "object" && !Array.isArray(condition)) ? condition : { eq: condition };
    for (const [op, value] of Object.entries(conditions)) addFilterRow(field, op, value);
  }
  if (params.get("doc")) showDocument(params.get("doc"));
  else if (params.get("q")) runSearch(params);
  else { latestView++; results.replaceChildren(); $("document-view").hidden = true; empty.hidden = true; show(""); }
}

async function loadFields() {
  const response = await fetch("fields", { headers: headers() });
  if (response.ok) fields = (await response.json()).fields;
}

$("search-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!Object.keys(fields).length && keyBox.value) loadFields();  // the key was typed after the page loaded
  const params = new URLSearchParams({ q: $("q").value, k: $("k").value });
  if ($("mode").value) params.set("mode", $("mode").value);
  const filter = currentFilter();
  if (Object.keys(filter).length) params.set("filter", JSON.stringify(filter));
  history.pushState(null, "", pageUrl(params));  // the address holds the search: back button, sharing
  runSearch(params);
});
$("add-filter").addEventListener("click", () => addFilterRow());
$("home").href = pageUrl(new URLSearchParams());
window.addEventListener("popstate", fromUrl);

fetch("health").then(r => r.json()).then(async (h) => {
  $("default-mode").textContent = "default (" + h.default_mode + ")";
  if (h.auth && !urlKey) keyBox.hidden = false;
  await loadFields();
  fromUrl();
});
</script>
</body>
</html>
"""
