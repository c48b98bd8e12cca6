"""The document API of `pipeline serve` (POST/DELETE /documents) on a real server, and a CLI embed
writing to the same workspace meanwhile."""

import json
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from common.manifest import read_manifest
from common.workspace import Workspace
from conftest import REPO, run_cli, scifact_rows
from server import running_server

KEY = "documents-key-0123456789"
MODES = ("dense", "lexical", "hybrid")
NOTE = {
    "id": "note-quokka",
    "title": "Quokka field notes",
    "text": "The quokka xylophone survey counted marsupials on Rottnest Island.",
    "year": 2099,
    "journal": "Field Notes",
}


@pytest.fixture(scope="module")
def workspace(static_workspace, tmp_path_factory):
    ws = tmp_path_factory.mktemp("documents") / "ws"
    shutil.copytree(static_workspace, ws)
    return ws


@pytest.fixture(scope="module")
def client(workspace):
    with (
        running_server(workspace, "--api-key", KEY) as base,
        httpx.Client(base_url=base, headers={"X-API-Key": KEY}, timeout=120) as c,
    ):
        yield c


def found(client, query: str, mode: str, filter: dict | None = None, k: int = 10) -> list[str]:
    answer = client.post("/search", json={"q": query, "k": k, "mode": mode, **({"filter": filter} if filter else {})})
    assert answer.status_code == 200, answer.text
    return [hit["doc_id"] for hit in answer.json()["results"]]


def test_an_upserted_document_is_searchable_when_the_call_returns(client, workspace):
    answer = client.post("/documents", json={"documents": [NOTE]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["stored"] == 1 and body["index"]["update"] == "incremental"
    assert found(client, "quokka xylophone", "lexical")[0] == NOTE["id"]
    for mode in MODES:  # the filter keeps only this document: every retriever must hold it
        assert found(client, "marsupials survey", mode, {"year": 2099}) == [NOTE["id"]]
    document = client.get(f"/documents/{NOTE['id']}").json()
    assert document["metadata"] == {"year": 2099, "journal": "Field Notes"} and document["source"] == "api"
    assert client.get("/health").json()["consistent"] is True
    assert run_cli("status", "-w", str(workspace), check=False).returncode == 0  # store and index agree on disk too
    again = client.post("/documents", json={"documents": [NOTE]}).json()
    assert again["stored"] == 0 and again["unchanged"] == 1


def test_a_replaced_document_is_found_by_its_new_text_only(client):
    replaced = {
        **NOTE,
        "title": "Pelican survey",
        "text": "Pelican nesting colonies were mapped by drone along the estuary.",
    }
    assert client.post("/documents", json={"documents": [replaced]}).status_code == 200
    assert NOTE["id"] not in found(client, "quokka xylophone", "lexical", k=100)
    assert found(client, "pelican nesting drone", "lexical")[0] == NOTE["id"]


def test_a_deleted_document_never_comes_back(client):
    doc = {
        "id": "to-delete",
        "title": "Axolotl gills",
        "text": "Axolotl gill regeneration in zygomorphic tanks.",
        "year": 2098,
    }
    assert client.post("/documents", json={"documents": [doc]}).status_code == 200
    assert found(client, "axolotl zygomorphic", "lexical")[0] == "to-delete"
    answer = client.delete("/documents/to-delete")
    assert answer.status_code == 200 and answer.json()["deleted"] == 1
    for mode in MODES:
        assert "to-delete" not in found(client, "Axolotl gill regeneration in zygomorphic tanks", mode, k=100)
        assert found(client, "axolotl", mode, {"year": 2098}) == []
    assert client.get("/documents/to-delete").status_code == 404
    again = client.delete("/documents/to-delete")
    assert again.status_code == 404 and again.json() == {"error": "no document with id 'to-delete'"}


def test_writes_need_the_key_and_bounded_valid_bodies(client):
    base = str(client.base_url)
    assert httpx.post(f"{base}/documents", json={"documents": [NOTE]}).status_code == 401
    assert httpx.delete(f"{base}/documents/{NOTE['id']}").status_code == 401
    missing_text = client.post("/documents", json={"documents": [{"id": "x"}]})
    assert missing_text.status_code == 422 and "text" in missing_text.json()["error"]
    blank_text = client.post("/documents", json={"documents": [{"id": "x", "text": " \n"}]})  # the fuzzer's 500, once
    assert blank_text.status_code == 422 and "text" in blank_text.json()["error"]
    twice = client.post("/documents", json={"documents": [NOTE, NOTE]})
    assert twice.status_code == 422 and "appears twice" in twice.json()["error"]
    assert (
        client.post("/documents", json={"documents": [{"id": f"d{i}", "text": "x"} for i in range(101)]}).status_code
        == 422
    )
    assert client.post("/documents", json={"documents": [{"id": "big", "text": "word " * 20_000}]}).status_code == 413
    # metadata past its bounds (common/readers.py) is refused with the reason, and nothing of the batch is stored
    wide = {"id": "wide", "text": "wide metadata", **{f"f{i}": i for i in range(101)}}
    long_name = {"id": "long", "text": "a long field name", "x" * 300: 1}
    for bad in (wide, long_name):
        answer = client.post("/documents", json={"documents": [{"id": "fine", "text": "fine"}, bad]})
        assert answer.status_code == 422 and answer.json()["error"].startswith("documents[1]: "), answer.text
    assert client.get("/documents/fine").status_code == 404 and client.get("/documents/wide").status_code == 404


def test_a_cli_embed_during_api_writes_corrupts_nothing(client, workspace, tmp_path):
    """`pipeline embed` and API writes take turns (the workspace's writer lock); afterwards every document
    of both is stored once, and after `pipeline index` the server finds them all."""
    cli_docs = scifact_rows(5, start=700)
    data = tmp_path / "more.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in cli_docs))
    model = read_manifest(Workspace(workspace)).embedder.model_dir(Workspace(workspace))  # the served embedder
    embed = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "cli.py"),
            "embed",
            "-w",
            str(workspace),
            "--data",
            str(data),
            "--model",
            str(model),
            "--chunk-tokens",
            "64",
            "--overlap",
            "8",
        ],  # the shared workspace's chunking
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    api_ids = []
    for i in range(6):
        doc = {
            "id": f"concurrent-{i}",
            "title": f"Concurrent note {i}",
            "text": f"Ocelot telemetry batch number {i} recorded.",
        }
        while True:  # 503 when the CLI holds the workspace longer than the server waits: retry, as a client would
            answer = client.post("/documents", json={"documents": [doc]})
            if answer.status_code != 503:
                break
            time.sleep(0.5)
        assert answer.status_code == 200, answer.text
        api_ids.append(doc["id"])
    _, stderr = embed.communicate(timeout=600)
    assert embed.returncode == 0, stderr
    before = client.get("/health").json()["reloads"]
    run_cli("index", "-w", str(workspace))
    deadline = time.monotonic() + 120
    while client.get("/health").json()["reloads"] == before and time.monotonic() < deadline:
        time.sleep(0.3)
    health = client.get("/health").json()
    assert health["consistent"] is True and health["last_reload_error"] is None
    for doc in cli_docs:
        assert doc["_id"] in found(client, doc["title"], "lexical", k=20)
    ocelots = found(client, "ocelot telemetry batch", "lexical", k=50)
    assert set(api_ids) <= set(ocelots)
    assert run_cli("status", "-w", str(workspace), check=False).returncode == 0
