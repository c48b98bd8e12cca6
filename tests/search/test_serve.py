"""`pipeline serve`: a real uvicorn server on loopback, real HTTP requests, a real headless browser."""

import json
import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from server import running_server

KEY = "test-key-0123456789"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def workspace(trained_workspace, tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("serve") / "ws"
    shutil.copytree(trained_workspace, ws)
    return ws


@pytest.fixture(scope="module")
def server(workspace):
    with running_server(workspace, "--api-key", KEY, output=subprocess.PIPE, timeout_s=180) as base:
        yield base


@pytest.fixture(scope="module")
def api_schema(static_workspace, tmp_path_factory):
    """The OpenAPI description of a server of its own: fuzzing writes documents, which the other tests'
    workspace must not see."""
    import schemathesis

    ws = tmp_path_factory.mktemp("fuzz") / "ws"
    shutil.copytree(static_workspace, ws)
    with running_server(ws, "--api-key", KEY, output=subprocess.PIPE, timeout_s=180) as base:
        yield schemathesis.openapi.from_url(f"{base}/openapi.json")


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server, headers={"X-API-Key": KEY}, timeout=60) as c:
        yield c


def test_search_get_and_post_return_ranked_documents(client, workspace):
    got = client.get("/search", params={"q": "cancer cells and tumour growth", "k": 5})
    assert got.status_code == 200
    body = got.json()
    chosen = json.loads((workspace / "manifest.json").read_text())["search"]["default_mode"]  # by `pipeline index`
    assert body["mode"] == client.get("/health").json()["default_mode"] == chosen
    assert [h["rank"] for h in body["results"]] == [1, 2, 3, 4, 5]
    assert len({h["doc_id"] for h in body["results"]}) == 5
    assert all(a["score"] >= b["score"] for a, b in zip(body["results"], body["results"][1:]))
    assert all(h["title"] and h["snippet"] for h in body["results"])

    lexical_get = client.get("/search", params={"q": "vitamin D deficiency", "k": 3, "mode": "lexical"}).json()
    lexical_post = client.post("/search", json={"q": "vitamin D deficiency", "k": 3, "mode": "lexical"}).json()
    assert lexical_get["results"] == lexical_post["results"] and lexical_post["mode"] == "lexical"

    filtered = client.post(
        "/search", json={"q": "cells", "k": 5, "mode": "dense", "filter": {"title": {"contains": "cell"}}}
    ).json()
    assert filtered["results"] and all("cell" in h["title"].lower() for h in filtered["results"])
    nothing = client.get("/search", params={"q": "cells", "source": "/no/such/*"}).json()
    assert nothing["results"] == []


def test_structured_filters_metadata_and_highlights(client, corpus_file):
    structured = {
        "year": {"gte": 1950},
        "journal": {"in": ["Nature", "Cell"]},
        "source": {"glob": str(corpus_file.parent) + "/**"},  # where the documents were read from
    }
    body = client.post("/search", json={"q": "tumour cells", "k": 7, "mode": "hybrid", "filter": structured}).json()
    assert len(body["results"]) == 7
    for hit in body["results"]:
        assert hit["metadata"]["year"] >= 1950 and hit["metadata"]["journal"] in ("Nature", "Cell")
        assert "<" not in hit["snippet"] or "<mark>" not in hit["snippet"]  # offsets, never HTML
        assert all(0 <= start < end <= len(hit["snippet"]) for start, end in hit["highlights"])
    as_get = client.get(
        "/search", params={"q": "tumour cells", "k": 7, "mode": "hybrid", "filter": json.dumps(structured)}
    ).json()
    assert as_get["results"] == body["results"]
    lexical = client.get("/search", params={"q": "tumour cells", "k": 3, "mode": "lexical"}).json()["results"]
    assert all(h["highlights"] for h in lexical)
    assert {h["snippet"][s:e].lower()[:4] for h in lexical for s, e in h["highlights"]} <= {"tumo", "cell"}
    doc = client.get(f"/documents/{body['results'][0]['doc_id']}").json()
    assert doc["metadata"] == body["results"][0]["metadata"]
    fields = client.get("/fields").json()
    assert fields["fields"]["year"] == "BIGINT" and "gte" in fields["operators"]

    for wrong, named in [
        ({"yeer": {"gte": 1}}, "filter: unknown field 'yeer'"),
        ({"year": {"around": 1}}, "unknown operator 'around'"),
        ({"year": {"gte": "1950; DROP TABLE documents"}}, "filter.year.gte: expects a number"),
    ]:
        response = client.post("/search", json={"q": "cells", "filter": wrong})
        assert response.status_code == 422 and named in response.json()["error"], response.text
    assert client.get("/search", params={"q": "cells", "filter": "{not json"}).status_code == 422
    injected = client.post(
        "/search", json={"q": "cells", "mode": "lexical", "filter": {"journal": "x' OR '1'='1"}}
    ).json()
    assert injected["results"] == []
    assert client.get("/health").json()["status"] == "ok"


def test_docs_work_offline_and_the_schema_declares_models_and_the_key(client):
    page = client.get("/docs")
    assert (
        page.status_code == 200 and "docs-assets/swagger-ui-bundle.js" in page.text and "cdn" not in page.text.lower()
    )
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        served = client.get(f"/docs-assets/{asset}")
        assert served.status_code == 200 and len(served.content) > 10_000
    assert client.get("/docs-assets/../manifest.json").status_code == 404
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["APIKeyHeader"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "The server's --api-key.",
    }
    post = schema["paths"]["/search"]["post"]
    assert post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/SearchResponse")
    assert post["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert {"APIKeyHeader": []} in post["security"]


def test_documents_endpoint(client):
    hit = client.get("/search", params={"q": "cancer", "k": 1}).json()["results"][0]
    doc = client.get(f"/documents/{hit['doc_id']}")
    assert doc.status_code == 200
    assert doc.json()["doc_id"] == hit["doc_id"] and doc.json()["title"] == hit["title"] and doc.json()["chunks"] >= 1
    missing = client.get("/documents/no-such-id")
    assert missing.status_code == 404 and missing.json() == {"error": "no document with id 'no-such-id'"}


def test_bad_requests_get_4xx_json_and_the_server_lives_on(client):
    bad = [
        client.get("/search"),
        client.get("/search", params={"q": ""}),
        client.get("/search", params={"q": "x" * 2001}),
        client.get("/search", params={"q": "x", "k": 0}),
        client.get("/search", params={"q": "x", "k": 101}),
        client.get("/search", params={"q": "x", "k": "ten"}),
        client.get("/search", params={"q": "x", "mode": "fuzzy"}),
        client.get("/search", params={"q": "x", "dense_weight": 2}),
        client.get("/search", params={"q": "   "}),
        client.post("/search", content=b"not json", headers={"content-type": "application/json"}),
        client.post("/search", json={"q": "x", "filter": "nope"}),
        client.post("/search", json=["q"]),
        client.get("/nowhere"),
    ]
    for response in bad:
        assert 400 <= response.status_code < 500, (response.request.url, response.status_code, response.text)
        assert isinstance(response.json()["error"], str) and response.json()["error"]
    assert client.get("/search", params={"q": "   "}).json() == {"error": "empty query"}
    assert client.get("/health").json()["status"] == "ok"


def test_request_size_is_bounded_and_the_bounds_are_in_the_schema(client):
    schema = client.get("/openapi.json").json()
    get_q = next(p for p in schema["paths"]["/search"]["get"]["parameters"] if p["name"] == "q")
    assert get_q["schema"]["maxLength"] == 2000
    assert schema["components"]["schemas"]["SearchRequest"]["properties"]["q"]["maxLength"] == 2000
    too_long = client.post("/search", json={"q": "x" * 2001})
    assert too_long.status_code == 422 and "at most 2000 characters" in too_long.json()["error"]
    huge = client.post(
        "/search", content=b'{"q": "x", "pad": "' + b"y" * 200_000 + b'"}', headers={"content-type": "application/json"}
    )
    assert huge.status_code == 413 and huge.json() == {"error": "body over 65,536 bytes"}  # before parsing


def test_http_edges_head_allow_and_strict_types(client):
    head, get = client.head("/health"), client.get("/health")
    assert (
        head.status_code == 200 and head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
    )
    assert client.head("/search", params={"q": "cells"}).status_code == 200
    wrong_method = client.put("/search")
    assert wrong_method.status_code == 405 and set(wrong_method.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}
    assert wrong_method.json()["error"]
    for weight in (False, True):
        answer = client.post("/search", json={"q": "cells", "dense_weight": weight})
        assert answer.status_code == 422 and "dense_weight" in answer.json()["error"], (weight, answer.text)
    assert client.post("/search", json={"q": "cells", "mode": "hybrid", "dense_weight": 1}).status_code == 200
    assert client.get("/health").json()["status"] == "ok"


def raw_get(base: str, path: str) -> tuple[int, str]:
    """GET `path` exactly as written: HTTP clients normalise `..` away before sending it."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {KEY}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    head, _, body = reply.decode(errors="replace").partition("\r\n\r\n")
    return int(head.split()[1]), body


def test_no_path_reads_a_file_outside_the_workspace(server, workspace):
    """Documents come from the store, never from the file system; no route serves files."""
    secret = workspace.parent / "secret.txt"
    secret.write_text("TOP-SECRET-0451")
    depth = "../" * len(workspace.parts)
    paths = [
        "/documents/../secret.txt",
        "/documents/..%2Fsecret.txt",
        "/documents/%2e%2e/%2e%2e/secret.txt",
        f"/documents/{secret}",
        f"/documents/%2F{str(secret).lstrip('/')}",
        f"/documents/{depth}etc/passwd",
        f"/documents/{depth.replace('/', '%2F')}etc%2Fpasswd",
        f"/{depth}etc/passwd",
        f"/%2e%2e/{depth}etc/passwd",
        f"/docs/{depth}etc/passwd",
        f"/static/{depth}etc/passwd",
        f"/{secret}",
        "/documents/manifest.json",
        "/documents/../manifest.json",
        "/..%2Fmanifest.json",
        "/pipeline.duckdb",
    ]
    manifest = (workspace / "manifest.json").read_text()
    for path in paths:
        status, body = raw_get(server, path)
        assert status in (400, 404), (path, status, body)
        assert "TOP-SECRET" not in body and "root:x:" not in body and manifest[:200] not in body, path


def test_fuzzed_requests_never_get_a_server_error(api_schema):
    """Schemathesis generates requests for every operation of the OpenAPI description, within the declared
    bounds and outside them; none may answer 5xx, and every answer must match the schema. Bounded to 60
    requests: a few seconds."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from schemathesis import checks
    from schemathesis.generation import GenerationMode

    @given(case=st.one_of([api_schema.as_strategy(generation_mode=mode) for mode in GenerationMode]))
    @settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    def no_server_error(case):
        response = case.call(headers={"X-API-Key": KEY}, timeout=60)  # a write embeds and updates the index
        assert response.status_code < 500, (case.method, case.formatted_path, case.query, case.body, response.text)
        # Status codes, content types and bodies as the schema declares them. (Not "positive data acceptance":
        # a filter's fields are the loaded documents' own, which a schema cannot list, so a schema-valid
        # filter on a field that does not exist is rightly a 422.)
        case.validate_response(
            response,
            checks=[
                checks.not_a_server_error,
                checks.status_code_conformance,
                checks.content_type_conformance,
                checks.response_schema_conformance,
            ],
        )
        seen.add((case.method, case.path))

    seen = set()
    no_server_error()
    assert seen >= {("GET", "/search"), ("POST", "/search"), ("GET", "/documents/{doc_id}")}


def test_api_key_is_required_for_data_but_not_for_health(server):
    assert httpx.get(f"{server}/search", params={"q": "cancer"}).status_code == 401
    assert (
        httpx.get(f"{server}/search", params={"q": "cancer"}, headers={"X-API-Key": "wrong-key-000"}).status_code == 401
    )
    assert httpx.get(f"{server}/documents/1").json() == {
        "error": "missing or wrong API key (send it in the X-API-Key header)"
    }
    assert httpx.get(f"{server}/search", params={"q": "cancer", "api_key": KEY}).status_code == 200
    health = httpx.get(f"{server}/health").json()
    assert health["auth"] is True and health["index"]["lexical"] is True
    assert httpx.get(f"{server}/openapi.json").json()["paths"].keys() >= {"/search", "/documents/{doc_id}", "/health"}


def test_concurrent_requests_all_succeed_with_consistent_answers(client):
    queries = ["cancer", "vitamin D", "stem cells", "bone density"] * 12

    def ask(q):
        response = client.get("/search", params={"q": q, "k": 5})
        return q, response.status_code, [h["doc_id"] for h in response.json().get("results", [])]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, queries))
    assert all(status == 200 for _, status, _ in answers)
    by_query = {}
    for q, _, ids in answers:
        by_query.setdefault(q, set()).add(tuple(ids))
    assert all(len(variants) == 1 for variants in by_query.values())


def test_a_static_embedders_searches_answer_concurrently_as_the_engine_does(static_workspace, tmp_path):
    """A static model's searches run on the server's event loop (search/serve/batcher.py): many at once, in every
    mode, each answered exactly as the engine answers it in process; a served transformer (the other
    tests) goes through the thread pool, and so do a static model's searches once timed costly."""
    from common.workspace import Workspace
    from search.engine import SearchEngine

    ws = tmp_path / "ws"
    shutil.copytree(static_workspace, ws)
    engine = SearchEngine(Workspace(ws))
    requests = [
        (q, mode)
        for q in ("cancer", "vitamin D", "stem cells", "bone density", "   ")
        for mode in ("dense", "lexical", "hybrid")
    ] * 4
    with (
        running_server(ws, output=subprocess.PIPE, timeout_s=180) as base,
        httpx.Client(base_url=base, timeout=60) as c,
    ):
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda r: c.get("/search", params={"q": r[0], "k": 5, "mode": r[1]}), requests))
    # a blank query searched alongside others is refused alone
    assert all(
        (a.status_code, a.json()) == (400, {"error": "empty query"})
        for (q, _), a in zip(requests, answers)
        if not q.strip()
    )
    assert all(a.status_code == 200 for (q, _), a in zip(requests, answers) if q.strip())
    for (q, mode), answer in zip(requests, answers):
        if not q.strip():
            continue
        expected = [(h.doc_id, h.chunk_id, h.snippet) for h in engine.search(q, 5, mode)]
        assert [(h["doc_id"], h["chunk_id"], h["snippet"]) for h in answer.json()["results"]] == expected
    assert_batches_move_to_worker_threads_when_costly(engine, [r for r in requests if r[0].strip()])


def assert_batches_move_to_worker_threads_when_costly(engine, requests):
    """The batcher times an engine's batches on the event loop, each mode apart; once a mode's are timed costly
    (here: any cost at all), its later batches are answered in worker threads, with the same answers."""
    import asyncio

    from search.serve.batcher import SearchBatcher
    from search.serve.schemas import SearchRequest

    on_main_thread = []
    search_many = engine.search_many

    def observed(*args):
        on_main_thread.append(threading.current_thread() is threading.main_thread())
        return search_many(*args)

    expected = [[(h.doc_id, h.chunk_id) for h in engine.search(q, 5, mode)] for q, mode in requests]
    engine.search_many = observed  # (only watched: the engine's own search answers)
    modes = {mode for _, mode in requests}

    async def rounds(batcher: SearchBatcher, count: int) -> list:
        answers = []
        for _ in range(count):
            asked = (batcher.search(engine, SearchRequest(q=q, k=5, mode=mode)) for q, mode in requests)
            answers.append(await asyncio.gather(*asked))
        return answers

    for threshold, in_threads in ((float("inf"), False), (0.0, True)):
        batcher = SearchBatcher()
        batcher.ON_LOOP_MAX_S = threshold
        timed = batcher.WARM_UP_BATCHES + batcher.MEASURED_BATCHES
        on_main_thread.clear()
        answered = asyncio.run(rounds(batcher, timed + 2))
        assert all(batcher.on_loop(engine, (mode, False)) is not in_threads for mode in modes)
        # a round is one batch a mode: the timed rounds on the loop, the two after them in threads
        per_round = [on_main_thread[i : i + len(modes)] for i in range(0, len(on_main_thread), len(modes))]
        assert per_round == [[True] * len(modes)] * timed + [[not in_threads] * len(modes)] * 2
        for answers in answered:
            assert [[(h.doc_id, h.chunk_id) for h in hits] for hits in answers] == expected


def test_a_rebuilt_index_is_picked_up_without_a_failed_request(client, workspace):
    before = client.get("/health").json()
    failures, done = [], threading.Event()

    def hammer():
        while not done.is_set():
            response = client.get("/search", params={"q": "cancer", "k": 3})
            if response.status_code != 200 or len(response.json()["results"]) != 3:
                failures.append(response.text)

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        run_cli("index", "-w", str(workspace), "--type", "hnsw")
        deadline = time.monotonic() + 60
        while (
            client.get("/health").json()["index"]["build_id"] == before["index"]["build_id"]
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
    finally:
        done.set()
        thread.join()
    after = client.get("/health").json()
    assert after["index"]["type"] == "hnsw" and after["reloads"] == before["reloads"] + 1
    assert failures == []


def test_port_in_use_is_a_one_line_error(workspace):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "-w", str(workspace), "--port", str(port), check=False)
    assert (
        result.returncode == 2
        and result.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port} (Address already in use)"
    )


def wait_for_page(page, condition: str, server: str) -> None:
    """Wait up to a minute for `condition` (JavaScript) to hold on the page; if it does not, fail saying what
    the page shows and how the server answers the same search directly (once seen: a search the page never
    showed, whose cause the bare timeout did not tell)."""
    from playwright.sync_api import TimeoutError as PageTimeout

    try:
        page.wait_for_function(condition, timeout=60_000)
    except PageTimeout:
        started = time.monotonic()
        try:
            query = {"q": page.input_value("#q")}
            direct = httpx.post(f"{server}/search", json=query, headers={"X-API-Key": KEY}, timeout=60)
            answer = f"got {direct.status_code}"
        except httpx.HTTPError as error:
            answer = f"failed ({type(error).__name__})"
        raise AssertionError(
            f"after 60 s the page at {page.url} shows {page.inner_text('#status')!r}; the same search sent here "
            "with the key "
            f"{answer} in {time.monotonic() - started:.1f} s"
        ) from None


@pytest.mark.browser
def test_web_page_searches_in_a_real_browser(server, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(
            "no browser: /usr/bin/chromium is missing (scripts/setup.sh installs Debian's chromium when run as root)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page()
            # Words typed before the page's first answers came (its fields held back here) stay in the box once
            # the page applies its address (they were wiped, and the required box then stopped the search).
            held = []
            page.route("**/fields", lambda route: held.append(route))
            page.goto(f"{server}/?api_key={KEY}")
            deadline = time.monotonic() + 60
            while not held and time.monotonic() < deadline:
                page.wait_for_timeout(50)
            page.fill("#q", "cancer cells")
            for route in held:
                route.continue_()
            page.unroute("**/fields")
            page.wait_for_selector("body[data-ready=true]", timeout=60_000)
            assert page.input_value("#q") == "cancer cells"
            page.click("#go")
            # results, or an error the page shows (then the assertion below names it)
            wait_for_page(
                page,
                "document.querySelector('li.result') || document.getElementById('status').className === 'error'",
                server,
            )
            results = page.locator("li.result")
            assert results.count() == 10, page.inner_text("#status")
            first = results.nth(0)
            assert first.locator(".title").inner_text().strip()
            assert first.locator(".snippet").inner_text().strip()
            assert first.locator(".meta").inner_text().startswith("score ")
            default = httpx.get(f"{server}/health").json()["default_mode"]  # what `pipeline index` measured
            assert page.inner_text("#status").startswith(f"10 results ({default}, ")
            page.screenshot(path=str(tmp_path / "search.png"))
            assert page.inner_text("#default-mode") == f"default ({default})"

            # A filtered search: query, k and filter go into the address, matched terms are marked.
            page.click("#add-filter")
            page.select_option(".filter-field", "year")
            page.select_option(".filter-op", "gte")
            page.fill(".filter-value", "1990")
            page.select_option("#k", "5")
            page.fill("#q", "tumour cells")
            page.click("#go")
            wait_for_page(page, "document.getElementById('status').textContent.startsWith('5 results')", server)
            assert all(
                int(text.split("year: ")[1].split(" ")[0]) >= 1990
                for text in page.locator("li.result .fields").all_inner_texts()
            )
            marked = page.locator(
                "li.result .snippet mark"
            ).all_inner_texts()  # hybrid and lexical results share a term
            assert (marked or default == "dense") and all(m.lower().startswith(("tumo", "cell")) for m in marked)
            assert "filter=" in page.url and "q=tumour+cells" in page.url and "k=5" in page.url
            filtered_url, first_title = page.url, page.locator("li.result .title").nth(0).inner_text()

            page.locator("li.result a.doc-link").nth(0).click()  # the document's own page, then back to the results
            page.wait_for_selector("#document-view:not([hidden])")
            assert page.inner_text("#document-title") == first_title and "year: " in page.inner_text("#document-fields")
            page.go_back()
            page.wait_for_function(
                "document.getElementById('status').textContent.startsWith('5 results')", timeout=60_000
            )
            assert page.url == filtered_url and page.input_value(".filter-value") == "1990"

            page.fill(".filter-value", "3000")  # nothing left: a clear empty state
            page.click("#go")
            page.wait_for_selector("#empty:not([hidden])", timeout=60_000)
            assert "with these filters" in page.inner_text("#empty")

            page.goto(f"{server}/docs")  # Swagger UI from the server's own assets (the browser has no network)
            page.wait_for_selector(".swagger-ui .opblock-summary-path", timeout=60_000)
            assert "/search" in page.locator(".swagger-ui .opblock-summary-path").all_inner_texts()

            page.goto(f"{server}/")  # without the key: the page asks for one and shows the server's refusal
            page.wait_for_selector("#key:not([hidden])", timeout=60_000)
            page.wait_for_selector("body[data-ready=true]", timeout=60_000)
            page.fill("#q", "cancer")
            page.click("#go")
            wait_for_page(page, "document.getElementById('status').className === 'error'", server)
            assert "API key" in page.inner_text("#status")
        finally:
            browser.close()


def test_changed_documents_keep_the_loaded_index_serving_and_health_says_so(client, workspace, tmp_path):
    from common.workspace import Workspace
    from conftest import scifact_slice
    from embed.run import run_embed
    from embed.settings import EmbedSettings

    before = client.get("/search", params={"q": "cancer", "k": 5, "mode": "lexical"}).json()["results"]
    assert client.get("/health").json()["consistent"] is True
    new = scifact_slice(tmp_path / "new.jsonl", 3, start=500)
    run_embed(Workspace(workspace), [new], None, EmbedSettings(chunk_tokens=64, overlap=8))  # the server holds no lock
    health = client.get("/health").json()
    assert health["consistent"] is False and "run `pipeline index`" in health["problem"]
    assert health["store_generation"] == health["index"]["store_generation"] + 1
    assert client.get("/search", params={"q": "cancer", "k": 5, "mode": "lexical"}).json()["results"] == before

    reloads = health["reloads"]
    run_cli("index", "-w", str(workspace))
    deadline = time.monotonic() + 60
    while client.get("/health").json()["reloads"] == reloads and time.monotonic() < deadline:
        time.sleep(0.2)
    health = client.get("/health").json()
    assert health["consistent"] is True and health["problem"] is None and health["reloads"] == reloads + 1
    title, doc_id = (json.loads(new.read_text().splitlines()[0])[k] for k in ("title", "_id"))
    assert (
        client.get("/search", params={"q": title, "k": 1, "mode": "lexical"}).json()["results"][0]["doc_id"] == doc_id
    )
