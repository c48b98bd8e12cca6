"""`pipeline serve --ray` (search/serve/ray_serve.py) on a local Ray cluster of two nodes: a sharded index's
shards as Ray Serve applications answer as the whole index does (N = 2, 3), the ingress serves the HTTP
API, a killed shard replica is restarted while requests either succeed or fail naming the shard, a document
write deploys anew only the shard it changed, and a new index is swapped in with all its shards or not at
all."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed")

from conftest import shard_queries_and_filters, sharded_copy  # noqa: E402

QUERIES, FILTERS = shard_queries_and_filters()

from common.manifest import read_manifest  # noqa: E402
from common.workspace import Workspace  # noqa: E402
from index.build import refresh_indexes  # noqa: E402
from index.shards import shard_of  # noqa: E402
from search.engine import SearchEngine  # noqa: E402
from search.serve.ray_serve import (  # noqa: E402
    QUIET,
    RayServing,
    delete_applications,
    deploy_shards,
    remote_shards,
    shard_application,
)
from server import free_port  # noqa: E402
from workflows import write_documents  # noqa: E402

pytestmark = pytest.mark.ray

KEY = "ray-serve-key"
RETRY_S = 5  # how long a new index that could not be served waits to be tried again
NOTE = {"id": "note-1", "title": "A note", "text": "Quokka survey on an island."}


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    """Ray Serve started on the suite's Ray cluster: its HTTP port."""
    port = free_port()
    # As RayServing.start asks (Serve is started once, by whichever asks first): one HTTP proxy, not one per node.
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port}, logging_config=QUIET)
    yield port
    serve.shutdown()


@pytest.fixture(scope="module")
def whole(static_workspace) -> SearchEngine:
    """The index the shards are compared with. Static-embedded: the ingress replicas start without importing
    sentence-transformers."""
    return SearchEngine(Workspace(static_workspace))


def assert_same_answers(engine, whole, queries, modes=("dense", "lexical", "hybrid"), filters=(None,)) -> None:
    for where in filters:
        for mode in modes:
            for query in queries:
                want = whole.search(query, 10, mode, where, dense_weight=0.4)
                got = engine.search(query, 10, mode, where, dense_weight=0.4)
                assert [(h.doc_id, h.chunk_id, h.snippet) for h in got] == [
                    (h.doc_id, h.chunk_id, h.snippet) for h in want
                ], (query, mode, where)
                np.testing.assert_allclose([h.score for h in got], [h.score for h in want], rtol=0, atol=1e-5)


def test_shards_deployed_on_ray_serve_answer_as_the_whole_index(cluster, whole, static_workspace, tmp_path):
    """Three shards (two: in the test of the ingress below; a sharded index's merging, one shard included, is
    tests/index/test_shards.py's, in one process)."""
    ws = sharded_copy(static_workspace, tmp_path / "ws", 3)
    entry = read_manifest(ws).index
    names = deploy_shards(ws.root, entry, replicas=1)
    try:
        assert names == [shard_application(shard.build_id, n) for n, shard in enumerate(entry.shard_entries())]
        assert_answers_as_the_whole_index(SearchEngine(ws, open_shards=remote_shards), whole)
    finally:
        delete_applications(names)


def assert_answers_as_the_whole_index(engine: SearchEngine, whole: SearchEngine) -> None:
    assert not engine.in_process
    assert_same_answers(engine, whole, QUERIES[:3] + QUERIES[-2:], filters=FILTERS)
    doc_id = whole.shards[0].shard.corpus.doc_id(7)
    assert engine.document(doc_id) == whole.document(doc_id)
    assert engine.fields == whole.fields


def shard_replicas(application: str) -> list[str]:
    """The names of the running replica actors of a shard's application."""
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and actor["name"].startswith(f"SERVE_REPLICA::{application}#")
    ]


def answered_while_polling(serving: RayServing, request):
    """The response of request(), made on a thread while the driver polls the manifest as `pipeline serve --ray`
    does: a document write answers once the driver has deployed the shard it changed."""
    with ThreadPoolExecutor(1) as pool:
        response = pool.submit(request)
        deadline = time.monotonic() + 120
        while not response.done() and time.monotonic() < deadline:
            serving.poll()
            time.sleep(0.2)
        return response.result(timeout=1)


def test_the_ingress_serves_the_api_survives_a_killed_replica_and_swaps_whole_indexes(
    cluster, whole, static_workspace, tmp_path, capsys
):
    ws = sharded_copy(static_workspace, tmp_path / "ws", 2)
    serving = RayServing(ws, KEY, write_documents, replicas=2, retire_after=0, retry_refused_after=RETRY_S)
    port = cluster
    serving.start("127.0.0.1", port)
    query = QUERIES[0]
    want = [h.doc_id for h in whole.search(query, 5, "hybrid", dense_weight=0.4)]
    params = {"q": query, "k": 5, "mode": "hybrid", "dense_weight": 0.4}
    try:
        assert_answers_as_the_whole_index(SearchEngine(ws, open_shards=remote_shards), whole)  # N = 2
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": KEY}, timeout=120) as client:
            # The API as one machine serves it: the key, filters, documents, fields; writes refused before storing.
            answer = client.get("/search", params=params).json()
            assert [h["doc_id"] for h in answer["results"]] == want
            assert httpx.get(f"http://127.0.0.1:{port}/search", params=params).status_code == 401
            filtered = client.post("/search", json={**params, "filter": {"year": {"lt": 1930}}}).json()
            assert [h["doc_id"] for h in filtered["results"]] == [
                h.doc_id for h in whole.search(query, 5, "hybrid", FILTERS[1], dense_weight=0.4)
            ]
            unknown = client.post("/search", json={"q": query, "filter": {"nope": 1}})
            assert unknown.status_code == 422 and "nope" in unknown.json()["error"]
            doc_id = want[0]
            assert client.get(f"/documents/{doc_id}").json() == whole.document(doc_id)
            assert client.get("/fields").json()["fields"] == whole.fields

            # A replica of shard 0 killed while requests come: each answers right or fails naming the shard.
            application = serving.served[0]
            assert len(shard_replicas(application)) == 2
            answers, stop = [], threading.Event()

            def ask():
                while not stop.is_set():
                    response = client.get("/search", params=params)
                    answers.append((response.status_code, response.json()))

            asking = threading.Thread(target=ask)
            asking.start()
            time.sleep(1)
            ray.kill(ray.get_actor(shard_replicas(application)[0], namespace="serve"), no_restart=True)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # Ray Serve starts another
                time.sleep(1)
                running = serve.status().applications[application].deployments["shard"].replica_states
                if running.get("RUNNING", 0) == 2 and len(answers) > 20:
                    break
            stop.set()
            asking.join()
            assert running.get("RUNNING", 0) == 2
            for status, body in answers:
                if status == 200:
                    assert [h["doc_id"] for h in body["results"]] == want
                else:
                    assert status == 503 and "shard 0" in body["error"], body
            assert sum(status == 200 for status, _ in answers) > 10

            # A document written, then deleted: each time only the shard it belongs to is deployed anew.
            serving.replicas = 1  # (fewer replica starts)
            owner = shard_of(NOTE["id"], 2)
            for request, stored in (
                (lambda: client.post("/documents", json={"documents": [NOTE]}), True),
                (lambda: client.delete(f"/documents/{NOTE['id']}"), False),
            ):
                served = list(serving.served)
                response = answered_while_polling(serving, request)
                assert response.status_code == 200, response.text
                assert serving.served[1 - owner] == served[1 - owner] and serving.served[owner] != served[owner]
                serving.poll()  # retires the shard replaced
                assert not shard_replicas(served[owner]) and shard_replicas(served[1 - owner])
                found = client.get("/search", params={"q": "quokka survey island", "k": 3, "mode": "lexical"}).json()
                assert (NOTE["id"] in [h["doc_id"] for h in found["results"]]) == stored
            assert [h["doc_id"] for h in client.get("/search", params=params).json()["results"]] == want

            # A new index one of whose shards cannot load: none of its shards is served, the last index answers.
            first, first_shards = serving.entry.build_id, list(serving.served)
            refresh_indexes(ws, "flat")
            second = read_manifest(ws).index
            chunk_ids = ws.root / second.shard_entries()[1].corpus_path / "chunk_ids.npy"
            saved = chunk_ids.read_bytes()
            chunk_ids.unlink()
            capsys.readouterr()
            assert not serving.poll()
            refused_at = time.monotonic()
            said = capsys.readouterr().err
            assert f"keeping index {first}: shard 1 of index {second.build_id} did not start" in said
            assert str(chunk_ids) in said  # the replica's error, naming the file, not only Ray Serve's verdict
            assert f"trying it again in {RETRY_S} s" in said
            assert not serving.poll() and capsys.readouterr().err == ""  # not tried at every poll
            assert client.get("/health").json()["index"]["build_id"] == first
            assert not shard_replicas(shard_application(second.shard_entries()[0].build_id, 0))
            assert [h["doc_id"] for h in client.get("/search", params=params).json()["results"]] == want

            # Once it can, and its time to be tried again has come: its shards deployed beside the old ones, then
            # swapped in.
            chunk_ids.write_bytes(saved)
            time.sleep(max(0.0, refused_at + RETRY_S - time.monotonic()))
            assert serving.poll()
            assert client.get("/health").json()["index"]["build_id"] == second.build_id != first
            assert [h["doc_id"] for h in client.get("/search", params=params).json()["results"]] == want
            serving.poll()  # retires the first index's shards
            assert not any(shard_replicas(name) for name in first_shards)
    finally:
        serving.stop()
