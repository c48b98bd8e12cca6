"""End to end through the CLI, as a user runs it."""
import json
import shutil

from common.models import embedding_text
from common.store import Store

from conftest import TINY_TRAINING, run_cli


def test_search_returns_one_ranked_row_per_document(trained_workspace, corpus_file):
    result = run_cli("search", "-w", str(trained_workspace), "cancer cells and tumour growth", "-k", "5", "--json")
    hits = [json.loads(line) for line in result.stdout.splitlines()]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert len({h["doc_id"] for h in hits}) == 5
    assert all(a["score"] >= b["score"] for a, b in zip(hits, hits[1:]))
    corpus_ids = {json.loads(l)["_id"] for l in corpus_file.read_text().splitlines()}
    assert {h["doc_id"] for h in hits} <= corpus_ids
    table = run_cli("search", "-w", str(trained_workspace), "cancer", "-k", "2").stdout
    assert "rank" in table and "score" in table and "snippet" in table


def test_a_chunk_finds_its_own_document(trained_workspace):
    """The query is embedded exactly as the stored chunk was, so it must come back first with score ~1."""
    with Store(trained_workspace / "pipeline.duckdb", read_only=True) as store:
        doc_id, title, text = store.con.execute(
            "SELECT d.doc_id, d.title, c.text FROM chunks c JOIN documents d USING (doc_id) "
            "WHERE c.chunk_index = 1 ORDER BY c.chunk_id LIMIT 1").fetchall()[0]
    result = run_cli("search", "-w", str(trained_workspace), embedding_text(title, text), "-k", "3", "--mode", "dense", "--json")
    best = json.loads(result.stdout.splitlines()[0])
    assert best["doc_id"] == doc_id and best["score"] > 0.9999


def test_status_reports_a_consistent_workspace(trained_workspace):
    report = json.loads(run_cli("status", "-w", str(trained_workspace), "--json").stdout)
    assert report["problems"] == []
    assert {name: part["state"] for name, part in report["parts"].items()} == {
        "tokenizer": "ok", "model": "ok", "tuned": "none", "vectors": "ok", "index": "ok", "search": "ok"}


def test_status_of_a_missing_workspace_says_so_and_fails(tmp_path):
    for args in ((), ("--json",)):
        result = run_cli("status", "-w", str(tmp_path / "nowhere"), *args, check=False)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.strip().startswith(f"error: no workspace at {tmp_path / 'nowhere'} (no manifest.json)")
    assert not (tmp_path / "nowhere").exists()


def test_search_prints_titles_and_text_verbatim_never_as_markup(trained_workspace, tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    title, text = "[/oops] [red]x[/red] :warning:", "Bone [b]density[/b] and vitamin D :smile:."
    data = tmp_path / "odd.jsonl"
    data.write_text(json.dumps({"_id": "odd", "title": title, "text": text}) + "\n")
    run_cli("embed", "-w", str(ws), "--data", str(data), "--chunk-tokens", "64", "--overlap", "8")
    run_cli("index", "-w", str(ws))
    monkeypatch.setenv("COLUMNS", "300")  # wide enough that no cell wraps
    table = run_cli("search", "-w", str(ws), "[bold]vitamin[/bold] density", "--title", "oops", "--mode", "lexical").stdout
    assert "results for: [bold]vitamin[/bold] density" in table
    assert title in table and text in table


def test_search_with_a_retrained_model_fails_clearly(trained_workspace, tmp_path, corpus_file):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    run_cli("pretrain", "-w", str(ws), "--data", str(corpus_file), *TINY_TRAINING, "--max-steps", "3")
    mismatch = run_cli("search", "-w", str(ws), "anything", check=False)
    assert mismatch.returncode == 2
    assert "the index was built with model" in mismatch.stderr and "run `pipeline embed` and `pipeline index` again" in mismatch.stderr
    assert len(mismatch.stderr.strip().splitlines()) == 1
    status = run_cli("status", "-w", str(ws), check=False)
    assert status.returncode == 1 and "problem:" in status.stdout


def test_bad_input_is_one_line_naming_the_problem(tmp_path, trained_workspace):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "1", "text": "fine"}\nnot json\n')
    result = run_cli("pretrain", "-w", str(tmp_path / "ws"), "--data", str(bad), check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {bad}:2: invalid JSON (Expecting value at column 1)"
    assert not (tmp_path / "ws" / "model").exists()
    missing = run_cli("embed", "-w", str(trained_workspace), "--data", str(tmp_path / "nope"), check=False)
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: {tmp_path / 'nope'}: no such file or directory"
    no_model = run_cli("embed", "-w", str(tmp_path / "ws"), check=False)
    assert no_model.returncode == 2 and "run `pipeline pretrain` first, or pass --model DIR" in no_model.stderr
    number = tmp_path / "number.jsonl"
    number.write_text('{"_id": "1", "text": 3.5}\n')
    refused = run_cli("embed", "-w", str(tmp_path / "ws"), "--model", str(trained_workspace / "model"), "--data", str(number), check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"error: {number}:1: field 'text' holds a number, not text"


def test_every_command_has_help_with_examples():
    from cli import app

    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"pretrain", "embed", "index", "search", "status"} <= set(commands)
    for command in commands:
        result = run_cli(command, "--help")
        assert "Examples:" in result.stdout and f"pipeline {command}" in result.stdout, command


def test_a_moved_or_copied_workspace_searches_with_its_own_model(trained_workspace, tmp_path):
    original = tmp_path / "original"
    shutil.copytree(trained_workspace, original)
    assert json.loads((original / "manifest.json").read_text())["embedder"]["model_path"] == "model"  # relative to the workspace
    moved = tmp_path / "moved"
    original.rename(moved)
    assert run_cli("search", "-w", str(moved), "cancer", "--mode", "dense", "--json").stdout
    copy = tmp_path / "copy"
    shutil.copytree(moved, copy)
    shutil.rmtree(moved)  # the copy must not need the workspace it was copied from
    assert run_cli("search", "-w", str(copy), "cancer", "--mode", "dense", "--json").stdout
    assert run_cli("status", "-w", str(copy)).returncode == 0


def test_a_manifest_with_absolute_paths_from_an_older_version_survives_a_move(trained_workspace, tmp_path):
    original = tmp_path / "original"
    shutil.copytree(trained_workspace, original)
    manifest = json.loads((original / "manifest.json").read_text())
    manifest["embedder"]["model_path"] = str(original / "model")  # what older versions wrote
    (original / "manifest.json").write_text(json.dumps(manifest))
    moved = tmp_path / "moved"
    original.rename(moved)
    assert run_cli("search", "-w", str(moved), "cancer", "--mode", "dense", "--json").stdout
    assert run_cli("status", "-w", str(moved)).returncode == 0
