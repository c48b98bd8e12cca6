"""`pipeline serve`: search over HTTP with FastAPI on uvicorn.

    GET  /                  a web page: search with filters, highlighted snippets, each document's page
                            (its style and script: /page.css, /page.js)
    GET  /search?q=...      ranked documents (k, mode, dense_weight, filter as JSON text, source, title)
    POST /search            the same with a JSON body: {"q": ..., "k": 10, "mode": "hybrid",
                            "filter": {"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}}}
    GET  /documents/{id}    one stored document, with its metadata
    POST /documents         add or replace documents: {"documents": [{"id", "title", "text", ...metadata}]}
    DELETE /documents/{id}  delete one
    GET  /fields            the fields a filter can use, with their types
    GET  /runs.json         the workspace's pretraining run (metrics.jsonl's records, the plan's prediction beside
                            the measurement, the sizing table), the adaptation's loss curves and candidates, the
                            default-mode measurement (search/serve/runs.py)
    GET  /runs              a web page drawing /runs.json (its script /runs.js, plotly.js at /plotly.min.js from
                            the plotly package: works offline)
    GET  /health            liveness, what is loaded, whether it matches the store (never needs the API key)
    GET  /docs, /openapi.json   the OpenAPI description (Swagger UI served from the swagger-ui-py package:
                            works offline)

The model and indexes are loaded once, and the documents and chunks are read from the corpus snapshot
`pipeline index` wrote beside them, memory-mapped (search/engine.py): nothing of the collection is loaded
at start-up, and a request does no SQL unless it filters. A watcher thread notices when `pipeline index`
has rebuilt the index (the manifest's "index" section changed), loads the new generation beside the old
one and swaps it in under a lock: requests in flight finish on the generation they started with, none
fails. The store is asked its generation once per generation and let go, so `pipeline embed` can write to
it meanwhile. An index is loaded only with the store generation it was built from; when the documents
change, the server keeps answering from the generation it has and /health says so until `pipeline index`
has run.

Writes (POST/DELETE /documents) go through the write path every command uses (workflows.write_documents,
given to create_app): new and changed documents embedded with the served model, staged and published with
the deletions in one store transaction (embed/ingest.py upsert_documents), the index updated (index/build.py
refresh_indexes: a delta beside the base, deletions skipped), and the result loaded before answering,
so a document is searchable, or gone, when the call returns. One writer at a time per workspace: the
server takes the workspace's writer lock, as `pipeline embed` and `pipeline index` do, and waits up to
WRITE_WAIT_SECONDS for it, then answers 503; a write never leaves a half-written store (a failure before
the publish leaves only staged rows, which the next write or embed clears).

Filters are structured (search/filters.py): compiled to SQL with bound values over the snapshot's
filter table; an unknown field or operator, or a value of the wrong type, is a 422 naming it.
Requests are bounded and the bounds are declared in the OpenAPI description (query length, k, filter
length; a body over MAX_BODY_BYTES gets 413). Errors are {"error": "..."}, declared per route.

With an API key, /search, /documents (reads and writes), /fields and /runs.json need it (header X-API-Key, or
?api_key= for a browser; both declared as OpenAPI security schemes); the pages, the docs and /health do not:
they show no stored data.

The package: schemas.py (the request and response models, the bounds), generation.py (the served engine, its
reload watcher, the document writes), batcher.py (SearchBatcher), routes.py (the routes, on routers), runs.py
(what /runs.json holds), app.py (create_app, run_server), page/ (the web page's HTML, CSS and JavaScript,
package data), ray_serve.py (the same API on Ray Serve). This file imports none of them: a shard's replica
on Ray imports ray_serve.py alone, not the HTTP app.
"""
