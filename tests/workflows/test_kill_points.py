"""SIGKILL `embed`, `index`, `tune` and `pretrain` (real CLI processes) at points inside their writes.

Each kill point is a function call (tests/killpoint.py, which forks each command from one process that
imported the libraries once): inside a DuckDB transaction, between writing a file and recording it in
the manifest, before and after swapping a directory. After each kill, search
answers exactly as before the command, or, once the command's work is in place (its commit point
passed), refuses the way it does after that command completed; re-running the command ends where an
uninterrupted run ends. The commands whose writes do not depend on the embedder's kind (embed, index, serve)
run on the session's static-embedded workspace: a transformer would only make each run slower.
"""

import json
import shutil
import signal
import subprocess
from contextlib import contextmanager

import numpy as np
import pytest

from common.errors import PipelineError
from common.manifest import read_json
from common.store import Store
from common.workspace import Workspace, model_fingerprint
from conftest import TINY_TRAINING, board, read_metrics, run_cli, scifact_slice
from embed.run import run_embed, source_documents
from embed.settings import EmbedSettings, TuneSettings
from embed.tune import run_tune
from index.build import refresh_indexes
from killpoint import Killer, armed_process
from search.engine import SearchEngine

QUERIES = ["cancer cells and tumour growth", "vitamin D deficiency", "bone density"]
# One pytest-xdist process runs them all, so the module's forking process (`killer`: torch and sentence-transformers
# imported once) is started once, not in each.
pytestmark = pytest.mark.xdist_group("kill_points")


@pytest.fixture(scope="module")
def killer(tmp_path_factory):
    killer = Killer(tmp_path_factory.mktemp("killed"))
    yield killer
    killer.close()


def data_files(ws) -> dict:
    return {p.name: p.read_bytes() for p in sorted((ws / "data").iterdir())}


def answers(ws, modes=("lexical", "dense")) -> list:
    engine = SearchEngine(Workspace(ws))
    return [
        [(h.doc_id, h.chunk_id, round(h.score, 5)) for h in engine.search(q, 5, mode)]
        for q in QUERIES
        for mode in modes
    ]


def store_contents(ws) -> tuple:
    with Store(ws / "pipeline.duckdb", read_only=True) as store:
        documents = store.con.execute(
            "SELECT doc_id, title, source, text, content_hash FROM documents ORDER BY doc_id"
        ).fetchall()
        chunks = store.con.execute("SELECT * FROM chunks ORDER BY chunk_id").fetchall()
        ids, vectors = store.load_vectors()
    return documents, chunks, ids, vectors


def assert_same_store(a, b) -> None:
    (docs_a, chunks_a, ids_a, vectors_a), (docs_b, chunks_b, ids_b, vectors_b) = store_contents(a), store_contents(b)
    assert docs_a == docs_b and chunks_a == chunks_b
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_allclose(vectors_a, vectors_b, atol=1e-6)


@contextmanager
def server_armed_at_index_update(ws, **armed):
    """`pipeline serve` on a free port, armed (killpoint.armed_process) at the first index update a document
    write makes: the process and its address once it serves; killed when done."""
    from server import free_port, wait_until_serving

    port = free_port()
    server = armed_process(
        "index.build:refresh_indexes", 1, "serve", "-w", str(ws), "--port", str(port),
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, **armed,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(server, base)
        yield server, base
    finally:
        server.kill()
        server.wait()


def test_killed_embed_leaves_the_store_as_it_was_and_a_rerun_ends_as_an_uninterrupted_run(
    killer, static_workspace, tmp_path
):
    extra = scifact_slice(tmp_path / "extra.jsonl", 6, start=300)
    # A new chunking: every stored document is embedded again, with the new ones.
    straight = tmp_path / "straight"
    shutil.copytree(static_workspace, straight)
    run_embed(Workspace(straight), [extra], None, EmbedSettings(chunk_tokens=48, overlap=8))
    ws = tmp_path / "ws"
    shutil.copytree(static_workspace, ws)
    before = answers(ws)
    args = ["embed", "-w", str(ws), "--data", str(extra), "--chunk-tokens", "48", "--overlap", "8"]
    for point in (
        "common.store:Store.stage",  # after start: documents read, model loaded
        "common.store:Store.set_meta:next_chunk_id",  # inside the transaction writing the vectors
        "common.store:Store.set_meta:generation",
    ):  # inside the transaction publishing them
        killer.run(point, 1, *args)
        assert answers(ws) == before, point
    # Killed after publishing, before the manifest: the store is new, the index is not.
    killer.run("common.manifest:replace_section:embedder", 1, *args)
    with pytest.raises(
        PipelineError, match=r"^the documents changed since the index was built .*: run `pipeline index`$"
    ):
        SearchEngine(Workspace(ws), load_model=False)
    with pytest.raises(PipelineError, match="run `pipeline embed` again"):
        refresh_indexes(Workspace(ws))
    rerun = run_embed(Workspace(ws), [extra], None, EmbedSettings(chunk_tokens=48, overlap=8))
    assert rerun.embedded_documents == 0 and rerun.embedder.documents == 126
    assert_same_store(ws, straight)
    refresh_indexes(Workspace(ws))
    assert answers(ws)  # consistent again


def test_killed_index_keeps_the_previous_index_in_use_and_a_rerun_cleans_up(killer, static_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(static_workspace, ws)
    before, entry = answers(ws), read_json(Workspace(ws))["index"]
    args = ["index", "-w", str(ws), "--type", "flat", "--rebuild"]
    for point in (
        "os:replace:.index",  # the FAISS file written to its temporary name, not renamed
        "common.lexical.index:np.save:chunk_ids.npy",  # in the middle of writing the BM25 index
        "common.snapshot.writer:write_filter_table",  # in the middle of writing the corpus snapshot
        "common.manifest:replace_section:index",
    ):  # both written, not recorded
        killer.run(point, 1, *args)
        assert read_json(Workspace(ws))["index"] == entry and answers(ws) == before, point
    killer.run("index.files:remove_other_files", 1, *args)  # recorded; older files not yet removed
    assert read_json(Workspace(ws))["index"]["build_id"] != entry["build_id"] and answers(ws) == before
    summary = refresh_indexes(Workspace(ws), "flat")
    assert sorted(p.name for p in (ws / "index").iterdir()) == sorted(
        path.split("/")[-1] for path in (summary.path, summary.lexical_path, summary.corpus_path)
    )
    assert answers(ws) == before


def test_a_server_killed_between_a_writes_store_commit_and_its_index_update_restarts_and_serves(
    static_workspace, tmp_path
):
    """The document API stores a write, then updates the index: a kill between the two leaves the store
    ahead of the index. The restarted server brings the index up to date itself and serves the document."""
    import httpx

    from server import running_server

    ws = tmp_path / "ws"
    shutil.copytree(static_workspace, ws)
    with server_armed_at_index_update(ws) as (server, base):
        note = {"id": "kill-note", "text": "Marmots hibernate in alpine burrows through the winter."}
        with pytest.raises(httpx.HTTPError):  # killed before it could answer
            httpx.post(f"{base}/documents", json={"documents": [note]}, timeout=120)
        assert server.wait(timeout=60) == -signal.SIGKILL
    with pytest.raises(PipelineError, match="the documents changed since the index was built"):
        SearchEngine(Workspace(ws), load_model=False)  # the state the kill left
    with running_server(ws) as base:
        hits = httpx.get(f"{base}/search", params={"q": "marmots hibernate", "mode": "lexical"}).json()["results"]
        assert hits[0]["doc_id"] == "kill-note"
    status = json.loads(run_cli("status", "-w", str(ws), "--json").stdout)
    assert not status["problems"], status


def test_a_full_disk_is_one_line_and_no_lie(static_workspace, tmp_path, monkeypatch):
    """A write to a full disk (fault-injected: the index's filter table, the server's index update) is one
    line naming what to free, the workspace is as it was, and the API says whether it stored the documents."""
    import errno

    import httpx

    import common.snapshot.writer

    ws = tmp_path / "ws"
    shutil.copytree(static_workspace, ws)
    manifest = (ws / "manifest.json").read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(ws / "index" / "filters.duckdb"))

    monkeypatch.setattr(common.snapshot.writer, "write_filter_table", full)
    failed = run_cli("index", "-w", str(ws), "--rebuild", check=False)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert (
        failed.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: no space left on the device writing {ws / 'index' / 'filters.duckdb'}: free space there")
    )
    assert (ws / "manifest.json").read_bytes() == manifest
    monkeypatch.undo()

    with server_armed_at_index_update(ws, disk_full=True) as (_, base):
        note = {"id": "full-note", "text": "Marmots hibernate in alpine burrows through the winter."}
        answer = httpx.post(f"{base}/documents", json={"documents": [note]}, timeout=120)
        assert answer.status_code == 507 and answer.json()["error"].startswith("the documents are stored"), answer.text
        assert httpx.get(f"{base}/health").status_code == 200  # still serving
    # As the answer said: stored. (A restart brings the index up to date: the test of a server killed there.)
    with Store(ws / "pipeline.duckdb", read_only=True) as store:
        assert store.con.execute("SELECT text FROM documents WHERE doc_id = ?", ["full-note"]).fetchall() == [
            (note["text"],)
        ]


@pytest.mark.parametrize("written_after", [False, True], ids=["rerun", "write-then-rerun"])
def test_a_build_killed_before_its_default_mode_was_measured_is_measured_by_the_rerun(
    killer, static_workspace, tmp_path, written_after
):
    """A full build recorded, then killed while measuring the default mode: the last build's measurement is
    not taken for the new one (status says the default is unmeasured), and re-running `pipeline index`
    measures it: when nothing changed, and when a document was written meanwhile (the rerun then updates
    the killed build, whose BM25 base no longer holds every chunk)."""
    ws = tmp_path / "ws"
    shutil.copytree(static_workspace, ws)
    before = json.loads((ws / "manifest.json").read_text())
    note = tmp_path / "note.jsonl"
    note.write_text(json.dumps({"_id": "note", "text": "Marmots hibernate in alpine burrows."}) + "\n")
    run_cli("embed", "-w", str(ws), "--data", str(note))
    killer.run("search.calibrate:measure_modes", 1, "index", "-w", str(ws), "--rebuild")
    killed = json.loads((ws / "manifest.json").read_text())
    assert killed["index"]["path"] != before["index"]["path"] and killed["search"] == before["search"]
    status = json.loads(run_cli("status", "-w", str(ws), "--json").stdout)
    assert status["parts"]["search"]["state"] == "default" and not status["problems"]
    if written_after:
        later = tmp_path / "later.jsonl"
        later.write_text(json.dumps({"_id": "later", "text": "Pikas gather hay for the winter."}) + "\n")
        run_cli("embed", "-w", str(ws), "--data", str(later))
    rerun = run_cli("index", "-w", str(ws))
    assert "default search mode:" in rerun.stderr
    measured = json.loads((ws / "manifest.json").read_text())
    assert measured["index"]["path"] == killed["index"]["path"]  # the same build, now measured
    assert (measured["index"]["delta_vectors"] > 0) == written_after  # the write went to a delta beside its base
    assert measured["search"]["base_index"] == measured["index"]["path"]
    status = json.loads(run_cli("status", "-w", str(ws), "--json").stdout)
    assert status["parts"]["search"]["state"] == "ok"


def test_killed_tune_keeps_the_previous_embedder_until_its_model_is_in_place(killer, trained_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    settings = dict(architecture="static", steps=2, batch_size=8, hard_negatives=False)
    docs = list(source_documents(Workspace(ws), [], None))
    run_tune(Workspace(ws), docs, TuneSettings(**settings, seed=0))
    run_embed(Workspace(ws), [], None, EmbedSettings(chunk_tokens=64, overlap=8))  # with the tuned model
    refresh_indexes(Workspace(ws))
    before, tuned_before = answers(ws), model_fingerprint(ws / "tuned")
    args = [
        "tune",
        "-w",
        str(ws),
        "--architecture",
        "static",
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--no-hard-negatives",
        "--seed",
        "1",
    ]
    killer.run("embed.tune:replace_directory", 1, *args)  # trained and saved aside, not swapped in
    assert model_fingerprint(ws / "tuned") == tuned_before and answers(ws) == before
    # Swapped in, not yet recorded: the embedder changed, as after a finished tune.
    killer.run("common.manifest:replace_section:tuned", 1, *args)
    swapped = model_fingerprint(ws / "tuned")
    assert swapped != tuned_before
    with pytest.raises(PipelineError, match="run `pipeline embed` and `pipeline index` again"):
        SearchEngine(Workspace(ws), load_model=False)
    summary = run_tune(Workspace(ws), docs, TuneSettings(**settings, seed=1))
    assert summary.fingerprint == swapped  # the re-run ends with the model the killed run had made


def test_killed_adaptation_keeps_the_previous_embedder_and_leaves_no_candidate_in_use(
    killer, trained_workspace, tmp_path
):
    """`pipeline tune --architecture auto` (what pretrain chains): killed after both candidates are tuned and
    measured, before the better one is swapped in, the previous embedder is still the one in use."""
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    docs = list(source_documents(Workspace(ws), [], None))
    run_tune(
        Workspace(ws), docs, TuneSettings(architecture="static", steps=2, batch_size=8, hard_negatives=False, seed=0)
    )
    tuned_before = model_fingerprint(ws / "tuned")
    args = [
        "tune",
        "-w",
        str(ws),
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--no-hard-negatives",
        "--seed",
        "1",
        "--time-budget",
        "30m",
    ]
    killer.run("embed.choose:replace_directory", 1, *args)
    assert model_fingerprint(ws / "tuned") == tuned_before
    assert json.loads((ws / "manifest.json").read_text())["tuned"]["fingerprint"] == tuned_before
    run_cli(*args)  # run again: ends with one of the candidates kept and recorded
    tuned = json.loads((ws / "manifest.json").read_text())["tuned"]
    assert tuned["fingerprint"] == model_fingerprint(ws / "tuned") and set(tuned["candidates"]) == {
        "static",
        "transformer",
    }


def test_killed_pretrain_keeps_the_previous_model_and_resumes_to_the_same_losses(
    killer, trained_workspace, tmp_path, corpus_file
):
    args = ["--data", str(corpus_file), *TINY_TRAINING, "--max-steps", "8", "--checkpoint-every", "2"]
    args += ["--shard-tokens", "5000", "--tokenize-workers", "2"]
    straight = tmp_path / "straight"
    run_cli("pretrain", "-w", str(straight), *args)
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    before, model_before = answers(ws, ("dense",)), model_fingerprint(ws / "model")
    data_before = data_files(ws)

    # Tokenizing, as the second shard closes: the workspace is untouched, the staged shards are carried on.
    killer.run("pretrain.prepare:atomic_write_json:progress.json", 3, "pretrain", "-w", str(ws), *args)
    assert data_files(ws) == data_before and model_fingerprint(ws / "model") == model_before
    staged = json.loads((ws / ".data-preparing" / "progress.json").read_text())
    assert len(staged["streams"]["train"]["closed"]) == 1  # the first shard was recorded, the second was not
    # Putting the new data in place: a new run has started (the old checkpoints are gone), the old model is intact.
    carried_on = killer.run("pretrain.prepare:replace_directory", 1, "pretrain", "-w", str(ws), *args)
    assert "carrying on the preparation staged" in carried_on
    assert not (ws / "checkpoints").exists()
    assert run_cli("pretrain", "-w", str(ws), "--resume", check=False).returncode == 2
    # In the middle of the third checkpoint (step 6): its tensors written, not its training state.
    killer.run("pretrain.checkpoint:atomic_write_json:train_state.json", 3, "pretrain", "-w", str(ws), *args)
    assert sorted(p.name for p in (ws / "checkpoints").iterdir()) == [
        "step_00000002",
        "step_00000004",
        "step_00000006.tmp",
    ]
    # Resumed, then killed while swapping in the exported model.
    killer.run("pretrain.export:replace_directory", 1, "pretrain", "-w", str(ws), "--resume", "--no-adapt")
    assert model_fingerprint(ws / "model") == model_before and answers(ws, ("dense",)) == before
    assert "resumed from" in run_cli("pretrain", "-w", str(ws), "--resume", "--no-adapt").stderr
    resumes = [m["step"] for m in read_metrics(ws) if m["event"] == "resume"]
    assert resumes == [4, 8]  # the half-written checkpoint of step 6 was passed over
    assert data_files(ws) == data_files(straight)  # the same shards as a preparation never killed
    want = [m["loss"] for m in read_metrics(straight) if m["event"] == "train"]
    got = [m["loss"] for m in read_metrics(ws) if m["event"] == "train"]
    assert len(got) == len(want) == 8
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # TensorBoard too: the killed runs' events past the checkpoint each resumed from are purged
    curve = board(ws / "tensorboard" / "pretrain")["loss/train"]
    assert [step for step, _ in curve] == list(range(1, 9))
    np.testing.assert_allclose([value for _, value in curve], want, rtol=1e-6)
    assert (
        json.loads((ws / "manifest.json").read_text())["model"]["fingerprint"]
        == model_fingerprint(ws / "model")
        != model_before
    )
