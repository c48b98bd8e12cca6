"""`create_app`: the FastAPI application (its state, lifespan, error handlers and routers), and `run_server`,
which checks the address and serves it with uvicorn (`pipeline serve`)."""

from __future__ import annotations

import logging
import os
import socket
from contextlib import asynccontextmanager

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from common.console import info, warn
from common.errors import PipelineError
from common.workspace import Workspace
from search.engine import OpenShards, ShardUnavailable, local_shards
from search.serve.batcher import SearchBatcher
from search.serve.generation import POLL_SECONDS, Generation, WriteDocuments
from search.serve.routes import data, public, read_assets, require_key
from search.serve.schemas import MAX_BODY_BYTES, error

SEARCH_THREADS = max(2, os.cpu_count() or 1)
log = logging.getLogger("pipeline.serve")


@asynccontextmanager
async def lifespan(app: FastAPI):
    # A transformer's searches, a large collection's and the synchronous routes run in worker threads (a
    # static model's cheap searches on the event loop: SearchBatcher). Python holds one lock for its
    # bytecode, so threads beyond the cores only take turns at it, less fairly the more there are: hybrid's
    # p99 under load was much further from its p50 with the default 40 threads than with 2 (benchmarks/bench_serve.py;
    # measured: benchmarks/results/2026-11-28-design-measurements-cpu.md). As many threads as cores still overlap
    # FAISS's and numpy's work, which releases the lock.
    anyio.to_thread.current_default_thread_limiter().total_tokens = SEARCH_THREADS
    app.state.generation.start()
    yield
    app.state.generation.stop()


async def invalid(request: Request, exc: RequestValidationError):
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc'] if p not in ('body', 'query')) or 'body'}: {e['msg']}"
        for e in exc.errors()
    )
    return error(422, problems or "invalid request")


async def http_error(request: Request, exc: StarletteHTTPException):
    response = error(exc.status_code, str(exc.detail))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:  # Allow: every method a route of this path takes (the framework names one's)
        allowed = {
            method
            for method in ("GET", "POST", "PUT", "PATCH", "DELETE")
            if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in request.app.routes)
        }
        response.headers["Allow"] = ", ".join(sorted(allowed | ({"HEAD"} if "GET" in allowed else set())))
    return response


class RequestEdges:
    """What the framework leaves to each app: a body over MAX_BODY_BYTES answered 413 in the API's error
    shape (from its Content-Length, or once a streamed body passes the limit), and HEAD answered as the GET
    of the same path, without its body."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return await error(413, f"body over {MAX_BODY_BYTES:,} bytes")(scope, receive, send)
        received = 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES:
                raise StarletteHTTPException(413, f"body over {MAX_BODY_BYTES:,} bytes")
            return message

        if scope["method"] != "HEAD":
            return await self.app(scope, bounded_receive, send)

        async def without_body(message):
            await send({**message, "body": b""} if message["type"] == "http.response.body" else message)

        await self.app({**scope, "method": "GET"}, bounded_receive, without_body)


async def shard_unavailable(request: Request, exc: ShardUnavailable):
    return error(503, str(exc))


async def unexpected(request: Request, exc: Exception):
    log.exception("error while answering %s", request.url.path)
    return error(500, f"internal error ({type(exc).__name__}); the server keeps running")


def create_app(
    ws: Workspace,
    write_documents: WriteDocuments,
    api_key: str | None = None,
    poll_seconds: float | None = POLL_SECONDS,
    open_shards: OpenShards = local_shards,
) -> FastAPI:
    """The app serving `ws`; its document API writes through `write_documents` (workflows.write_documents).
    With `open_shards` the index's shards answer from elsewhere (search/serve/ray_serve.py), and with
    poll_seconds None the index is reloaded when told (Generation.check), not when the manifest changes."""
    app = FastAPI(
        title="embedding-pipeline search",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="Search the documents of a pipeline workspace: dense, lexical (BM25) or "
        "hybrid, with metadata filters.",
    )
    app.state.generation = Generation(ws, write_documents, poll_seconds, open_shards)
    app.state.batcher = SearchBatcher()
    app.state.api_key = api_key
    app.state.assets = read_assets()
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ShardUnavailable, shard_unavailable)
    app.add_exception_handler(Exception, unexpected)
    app.add_middleware(RequestEdges)
    # Without a key nothing is checked, and the OpenAPI description declares no key (and a request skips
    # resolving the two key parameters).
    app.include_router(data, dependencies=[Depends(require_key)] if api_key else [])
    app.include_router(public)
    return app


def run_server(ws: Workspace, host: str, port: int, api_key: str | None, write_documents: WriteDocuments) -> None:
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
    # A query is a few tokens: one thread per forward pass and per FAISS search is many times faster than
    # torch's thread pool on a small, busy machine (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
    import faiss
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    app = create_app(ws, write_documents, api_key)
    if host not in ("127.0.0.1", "localhost", "::1"):
        warn(f"listening on {host}: reachable from other machines" + ("" if api_key else " without an API key"))
    info(f"serving {ws.root} on http://{host}:{port}/  (API docs: /docs)")
    # The standard library's event loop, even where uvloop is installed: uvloop served a saturated server's
    # requests out of turn (under load, a tail latency far from the median where asyncio's loop kept it close,
    # for a server spending a fixed time per request; benchmarks/bench_serve.py, measured:
    # benchmarks/results/2026-11-28-design-measurements-cpu.md).
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, loop="asyncio")
