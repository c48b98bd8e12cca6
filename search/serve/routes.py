"""The server's routes, on two routers: `data` (search, documents, fields: behind the API key when the server
has one, which create_app decides as it includes the router) and `public` (health, the page, the docs).
What they share lives on the app's state, set by create_app, and reaches them as dependencies: the served
`Generation`, the `SearchBatcher`, the API key, and the fixed files the page and the docs are made of."""

from __future__ import annotations

import functools
import hmac
import json
import time
from importlib.resources import files
from typing import Annotated, Optional

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import APIKeyHeader, APIKeyQuery
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.embedder import is_static
from common.errors import PipelineError, StoredNotIndexed, UnknownDocument, disk_full_error
from common.manifest import read_manifest
from common.readers import Document, check_metadata
from search.filters import OPERATORS, DocumentFilter, FilterError
from search.serve.batcher import SearchBatcher
from search.serve.generation import Generation, WriteConflict
from search.serve.runs import run_report
from search.serve.schemas import (
    ERRORS,
    FILTER_HELP,
    MAX_FILTER_CHARS,
    MAX_QUERY_CHARS,
    MAX_SERVE_K,
    MODE_HELP,
    NOT_FOUND,
    QUERY_HELP,
    WRITE_ERRORS,
    DocumentResponse,
    FieldsResponse,
    HealthResponse,
    RunsResponse,
    SearchRequest,
    SearchResponse,
    UpsertRequest,
    WriteResponse,
    error,
)
from search.settings import SearchMode

API_SOURCE = "api"  # the source recorded for documents stored through POST /documents
SWAGGER_ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css")
PAGE_FILES = ("index.html", "page.css", "page.js", "runs.html", "runs.js")
PLOTLY = "plotly.min.js"  # the runs page's charts: plotly.js as the plotly package ships it


def read_assets() -> dict[str, bytes]:
    """The pages' files (package data of search.serve), Swagger UI's two (from the swagger-ui-py package) and
    plotly.js (from the plotly package), by name: read once, when the app is made, so that no request path
    reaches the file system and nothing is fetched from elsewhere."""
    page, swagger = files("search.serve") / "page", files("swagger_ui") / "static"
    return {
        **{name: (page / name).read_bytes() for name in PAGE_FILES},
        **{name: (swagger / name).read_bytes() for name in SWAGGER_ASSETS},
        PLOTLY: (files("plotly") / "package_data" / PLOTLY).read_bytes(),
    }


# Async, so that they run on the event loop: a plain function would be sent to the thread pool, a hand-off
# a static model's cheap searches are answered on the loop to avoid (batcher.py).
async def served_generation(request: Request) -> Generation:
    return request.app.state.generation


async def search_batcher(request: Request) -> SearchBatcher:
    return request.app.state.batcher


Served = Annotated[Generation, Depends(served_generation)]
Batcher = Annotated[SearchBatcher, Depends(search_batcher)]
header_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="The server's --api-key.")
query_key = APIKeyQuery(
    name="api_key", auto_error=False, description="The same key as a query parameter, for a browser."
)


def require_key(
    request: Request, from_header: Optional[str] = Security(header_key), from_query: Optional[str] = Security(query_key)
) -> None:
    """The API key check: create_app puts it on the `data` router only when the server has a key."""
    api_key = request.app.state.api_key
    if api_key and not hmac.compare_digest((from_header or from_query or "").encode(), api_key.encode()):
        raise StarletteHTTPException(401, "missing or wrong API key (send it in the X-API-Key header)")


data = APIRouter()
public = APIRouter()


async def run_search(generation: Generation, batcher: SearchBatcher, body: SearchRequest):
    engine = generation.current()
    start = time.perf_counter()
    try:
        if is_static(engine.model) and not body.filter:
            hits = await batcher.search(engine, body)
        else:
            search = functools.partial(
                engine.search, body.q, body.k, body.mode, DocumentFilter.of(body.filter), body.dense_weight
            )
            # A transformer's forward pass (tens of ms) would stall every other request on the event loop, as
            # would a large collection's searches; shards in other processes are awaited in a worker thread too.
            kind = (body.mode, True)
            if is_static(engine.model) and batcher.on_loop(engine, kind):
                hits = batcher.run_on_loop(engine, kind, search, 1)
            else:
                hits = await run_in_threadpool(search)
    except FilterError as e:
        return error(422, str(e))
    except PipelineError as e:
        return error(400, str(e))
    # Returned as a response, not a dict: FastAPI would validate it against SearchResponse again (a
    # tenth of a search's cost); it has that shape by construction and the OpenAPI description keeps it.
    return JSONResponse(
        {
            "query": body.q,
            "mode": engine.resolve_mode(body.mode),
            "k": body.k,
            "took_ms": round((time.perf_counter() - start) * 1000, 2),
            "results": [h.to_dict() for h in hits],
        }
    )


@data.get("/search", summary="Search (query parameters)", response_model=SearchResponse, responses=ERRORS)
async def search_get(
    generation: Served,
    batcher: Batcher,
    q: str = Query(..., min_length=1, max_length=MAX_QUERY_CHARS, description=QUERY_HELP),
    k: int = Query(10, ge=1, le=MAX_SERVE_K),
    mode: Optional[SearchMode] = Query(None, description=MODE_HELP),
    dense_weight: Optional[float] = Query(None, ge=0.0, le=1.0),
    filter: Optional[str] = Query(
        None, max_length=MAX_FILTER_CHARS, description="The filter as JSON text: " + FILTER_HELP
    ),
    source: Optional[str] = Query(None, max_length=500, description='Shorthand for filter {"source": {"glob": ...}}.'),
    title: Optional[str] = Query(
        None, max_length=500, description='Shorthand for filter {"title": {"contains": ...}}.'
    ),
):
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
    body = SearchRequest(q=q, k=k, mode=mode, dense_weight=dense_weight, filter=structured or None)
    return await run_search(generation, batcher, body)


@data.post("/search", summary="Search (JSON body)", response_model=SearchResponse, responses=ERRORS)
async def search_post(body: SearchRequest, generation: Served, batcher: Batcher):
    return await run_search(generation, batcher, body)


@data.get(
    "/documents/{doc_id:path}",
    summary="One stored document",
    response_model=DocumentResponse,
    responses={**ERRORS, **NOT_FOUND},
)
def document(doc_id: str, generation: Served):
    found = generation.current().document(doc_id)
    return found if found is not None else error(404, f"no document with id '{doc_id}'")


def write(generation: Generation, upserts: list[Document], deletes: list[str]):
    try:
        return generation.write(upserts, deletes)
    except UnknownDocument as e:
        return error(404, str(e))
    except WriteConflict as e:
        return error(409, str(e))
    except StoredNotIndexed as e:  # kept, and the reply says so: 507 when the disk is full, else 503
        return error(507 if disk_full_error(e) else 503, str(e))
    except PipelineError as e:  # another writer held the workspace past the wait, or the store is unusable
        return error(503, str(e))
    except Exception as e:  # a full disk before the store's commit: nothing was stored
        said = disk_full_error(e)
        if said is None:
            raise
        return error(507, f"nothing was stored: {said}")


@data.post("/documents", summary="Add or replace documents", response_model=WriteResponse, responses=WRITE_ERRORS)
def post_documents(body: UpsertRequest, generation: Served):
    """Embedded with the workspace's model, stored in one publish of the store, added to both indexes:
    searchable when this returns. Documents identical to their stored version are left alone."""
    ids = [d.id for d in body.documents]
    if len(set(ids)) != len(ids):
        return error(422, f"documents: the id '{next(i for i in ids if ids.count(i) > 1)}' appears twice")
    documents = [Document(d.id, d.title, API_SOURCE, d.text, dict(d.model_extra or {})) for d in body.documents]
    try:  # bounded metadata (common/readers.py): nothing is stored when one document is past a limit
        for i, document in enumerate(documents):
            check_metadata(document.metadata, f"documents[{i}]")
    except PipelineError as e:
        return error(422, str(e))
    return write(generation, documents, [])


@data.delete(
    "/documents/{doc_id:path}",
    summary="Delete a document",
    response_model=WriteResponse,
    responses={**WRITE_ERRORS, **NOT_FOUND},
)
def delete_document(doc_id: str, generation: Served):
    """Removed from the store and from both indexes: no search returns it once this returns."""
    return write(generation, [], [doc_id])


@data.get("/fields", summary="The fields filters can use", response_model=FieldsResponse, responses={401: ERRORS[401]})
def fields(generation: Served):
    return {"fields": generation.current().fields, "operators": list(OPERATORS)}


@data.get(
    "/runs.json",
    summary="The workspace's pretraining run, its adaptation and the default-mode measurement",
    response_model=RunsResponse,
    responses={401: ERRORS[401]},
)
def runs(generation: Served):
    """What the runs page (/runs) draws, read from the workspace at each request: metrics.jsonl's records,
    the plan's prediction beside the measurement, the sizing table, the adaptation's loss curves (its
    TensorBoard events) and the search modes' nDCG@10 on held-out pairs."""
    return run_report(generation.ws)


@public.get(
    "/health",
    summary="Liveness, what is loaded, and whether it still matches the stored documents",
    response_model=HealthResponse,
)
def health(request: Request, generation: Served):
    engine = generation.current()
    entry = engine.index_entry
    embedder = read_manifest(generation.ws).embedder
    store_generation = embedder.store_generation if embedder else None
    stale = entry.stale_reason(store_generation)
    return {
        "status": "ok",
        "consistent": stale is None,
        "problem": stale and f"{stale}; serving the index loaded before until then",
        "store_generation": store_generation,
        "index": {
            "type": entry.type,
            "vectors": entry.vectors,
            "build_id": entry.build_id,
            "store_generation": entry.store_generation,
            "lexical": engine.has_lexical,
            "recall_at_10": entry.recall_at_10,
            "recall_target": entry.recall_target,
            "recall_short": entry.recall_short,
        },
        "default_mode": engine.resolve_mode(None),
        "default_dense_weight": engine.resolve_dense_weight(None),
        "model": str(engine.model_dir),
        "reloads": generation.reloads,
        "loaded_at": generation.loaded_at,
        "last_reload_error": generation.last_error,
        "auth": bool(request.app.state.api_key),
    }


@public.get("/docs", include_in_schema=False)
def docs(request: Request):
    return get_swagger_ui_html(
        openapi_url="openapi.json",
        title=request.app.title + " - docs",
        swagger_js_url="docs-assets/swagger-ui-bundle.js",
        swagger_css_url="docs-assets/swagger-ui.css",
        swagger_favicon_url="data:,",
    )


@public.get("/docs-assets/{name}", include_in_schema=False)
def docs_asset(name: str, request: Request):
    if name not in SWAGGER_ASSETS:  # two fixed files, read at start: no path reaches the file system
        return error(404, f"no asset '{name}'")
    media_type = "text/javascript" if name.endswith(".js") else "text/css"
    return Response(request.app.state.assets[name], media_type=media_type)


# The page and its two files, at fixed addresses. The page links them by relative URLs (as it calls `search`
# and `fields`), so it works behind a path prefix.
@public.get("/", response_class=HTMLResponse, include_in_schema=False)
def page(request: Request):
    return HTMLResponse(request.app.state.assets["index.html"])


@public.get("/page.css", include_in_schema=False)
def page_css(request: Request):
    return Response(request.app.state.assets["page.css"], media_type="text/css")


@public.get("/page.js", include_in_schema=False)
def page_js(request: Request):
    return Response(request.app.state.assets["page.js"], media_type="text/javascript")


# The runs page (linked from the search page) and its script; the charts' library from the server itself.
@public.get("/runs", response_class=HTMLResponse, include_in_schema=False)
def runs_page(request: Request):
    return HTMLResponse(request.app.state.assets["runs.html"])


@public.get("/runs.js", include_in_schema=False)
def runs_js(request: Request):
    return Response(request.app.state.assets["runs.js"], media_type="text/javascript")


@public.get(f"/{PLOTLY}", include_in_schema=False)
def plotly_js(request: Request):
    return Response(request.app.state.assets[PLOTLY], media_type="text/javascript")
