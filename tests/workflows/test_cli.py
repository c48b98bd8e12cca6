"""End to end through the CLI, as a user runs it."""

import inspect
import json
import shutil
from typing import get_args

import pytest

from common.embedder import embedding_text
from common.store import Store
from conftest import REPO, TINY_TRAINING, run_cli


def test_search_returns_one_ranked_row_per_document(trained_workspace, corpus_file):
    result = run_cli("search", "-w", str(trained_workspace), "cancer cells and tumour growth", "-k", "5", "--json")
    hits = [json.loads(line) for line in result.stdout.splitlines()]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    assert len({h["doc_id"] for h in hits}) == 5
    assert all(a["score"] >= b["score"] for a, b in zip(hits, hits[1:]))
    corpus_ids = {json.loads(line)["_id"] for line in corpus_file.read_text().splitlines()}
    assert {h["doc_id"] for h in hits} <= corpus_ids
    table = run_cli("search", "-w", str(trained_workspace), "cancer", "-k", "2").stdout
    assert "rank" in table and "score" in table and "snippet" in table


def test_a_chunk_finds_its_own_document(trained_workspace):
    """The query is embedded exactly as the stored chunk was, so it must come back first with score ~1."""
    with Store(trained_workspace / "pipeline.duckdb", read_only=True) as store:
        doc_id, title, text = store.con.execute(
            "SELECT d.doc_id, d.title, c.text FROM chunks c JOIN documents d USING (doc_id) "
            "WHERE c.chunk_index = 1 ORDER BY c.chunk_id LIMIT 1"
        ).fetchall()[0]
    result = run_cli(
        "search", "-w", str(trained_workspace), embedding_text(title, text), "-k", "3", "--mode", "dense", "--json"
    )
    best = json.loads(result.stdout.splitlines()[0])
    assert best["doc_id"] == doc_id and best["score"] > 0.9999


def test_status_reports_a_consistent_workspace(trained_workspace):
    report = json.loads(run_cli("status", "-w", str(trained_workspace), "--json").stdout)
    assert report["problems"] == []
    assert {name: part["state"] for name, part in report["parts"].items()} == {
        "tokenizer": "ok",
        "model": "ok",
        "tuned": "none",
        "vectors": "ok",
        "index": "ok",
        "search": "ok",
    }


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
    from common import console

    # wide enough that no cell wraps (the console reads COLUMNS when it is made, and the test processes differ)
    monkeypatch.setattr(console.out, "_width", 300)
    table = run_cli(
        "search", "-w", str(ws), "[bold]vitamin[/bold] density", "--title", "oops", "--mode", "lexical"
    ).stdout
    assert "results for: [bold]vitamin[/bold] density" in table
    assert title in table and text in table


def test_control_characters_in_documents_reach_the_terminal_shown_never_sent(trained_workspace, tmp_path, monkeypatch):
    """Escape sequences in a document's id, title and text (clear the screen, set the window's title, a C1
    CSI) are printed as visible characters by search, its --json, and an error naming the id."""
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    evil = "\x1b[31mRED\x1b[0m\x1b]0;pwned\x07\x1b[2J\x9b2J"
    row = {"_id": f"id{evil}", "title": f"bone {evil} title", "text": f"Bone density {evil} and vitamin D."}
    data = tmp_path / "evil.jsonl"
    data.write_text(json.dumps(row) + "\n")
    run_cli("embed", "-w", str(ws), "--data", str(data), "--chunk-tokens", "64", "--overlap", "8")
    run_cli("index", "-w", str(ws))
    monkeypatch.setenv("COLUMNS", "300")
    shown = run_cli("search", "-w", str(ws), "bone density pwned", "--mode", "lexical", "-k", "3").stdout
    lines = [run_cli("search", "-w", str(ws), "bone density pwned", "--mode", "lexical", "-k", "3", "--json").stdout]
    data.write_text((json.dumps(row) + "\n") * 2)  # the same id twice: an error that names it
    error = run_cli("embed", "-w", str(ws), "--data", str(data), check=False).stderr
    for output in (shown, *lines, error):
        assert not any(c in output for c in "\x1b\x07\x9b"), repr(output)
    assert "␛[2J" in shown and "␛]0;pwned␇" in shown and "duplicate document id 'id␛[31mRED" in error
    hits = [json.loads(line) for line in lines[0].splitlines()]
    assert any(hit["title"] == row["title"] for hit in hits)  # --json gives the text itself back, escaped


def test_search_with_a_retrained_model_fails_clearly(trained_workspace, tmp_path, corpus_file):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    run_cli("pretrain", "-w", str(ws), "--data", str(corpus_file), *TINY_TRAINING, "--max-steps", "3")
    mismatch = run_cli("search", "-w", str(ws), "anything", check=False)
    assert mismatch.returncode == 2
    assert (
        "the index was built with model" in mismatch.stderr
        and "run `pipeline embed` and `pipeline index` again" in mismatch.stderr
    )
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
    refused = run_cli(
        "embed",
        "-w",
        str(tmp_path / "ws"),
        "--model",
        str(trained_workspace / "model"),
        "--data",
        str(number),
        check=False,
    )
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
    assert (
        json.loads((original / "manifest.json").read_text())["embedder"]["model_path"] == "model"
    )  # relative to the workspace
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


def command_names() -> list[str]:
    from cli import app

    return [c.name or c.callback.__name__ for c in app.registered_commands]


def test_top_level_help_lists_every_command_one_per_line():
    """Each command on a line of its own with its whole summary (they were cut with "..."), and the first
    run's commands as written (they ran together into one paragraph)."""
    import cli

    help_text = run_cli("--help").stdout
    commands = help_text.split("Commands:")[1]
    listed = [line.split()[0] for line in commands.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert listed == command_names() and "plan" in listed
    assert "..." not in commands and all(
        " ".join(c.short_help.split()) in " ".join(commands.split()) for c in cli.app.registered_commands
    )
    first_run = [line.strip() for line in cli.__doc__.splitlines() if line.strip().startswith("pipeline ")]
    assert len(first_run) == 3 and all(
        line in [printed.strip() for printed in help_text.splitlines()] for line in first_run
    )
    assert "--version" in help_text and "--workspace" in help_text and "--install-completion" in help_text


def test_examples_are_printed_as_written_one_per_line():
    """Click rewraps help paragraphs to the terminal; examples are kept as written (a `\\b` block), so a
    long example and its comment stay on one line."""
    from cli import app

    for command in app.registered_commands:
        doc = inspect.getdoc(command.callback)
        examples = [
            line.strip() for line in doc.split("Examples:")[1].splitlines() if line.strip().startswith("pipeline ")
        ]
        assert examples, command.callback.__name__
        printed = {
            line.strip() for line in run_cli(command.name or command.callback.__name__, "--help").stdout.splitlines()
        }
        assert [e for e in examples if e not in printed] == []


def test_version():
    from importlib.metadata import version

    result = run_cli("--version")
    assert result.stdout.strip() == f"pipeline {version('embedding-pipeline')}"


def test_workspace_is_accepted_before_the_command_too(trained_workspace, tmp_path, monkeypatch):
    before = run_cli("-w", str(trained_workspace), "search", "cancer", "-k", "3", "--mode", "lexical", "--json").stdout
    after = run_cli("search", "-w", str(trained_workspace), "cancer", "-k", "3", "--mode", "lexical", "--json").stdout
    assert before == after and len(before.splitlines()) == 3
    # The command's own --workspace wins over the one before it; the one before it over $PIPELINE_WORKSPACE.
    assert run_cli("-w", str(tmp_path / "nowhere"), "status", "-w", str(trained_workspace)).returncode == 0
    monkeypatch.setenv("PIPELINE_WORKSPACE", str(tmp_path / "nowhere"))
    assert run_cli("-w", str(trained_workspace), "status").returncode == 0
    missing = run_cli("status", check=False)
    assert missing.returncode == 2 and f"no workspace at {tmp_path / 'nowhere'}" in missing.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("search", "q", "--mode", "fuzzy"),
            "error: --mode: 'fuzzy' is not one of 'dense', 'lexical', 'hybrid'; see `pipeline search --help`",
        ),
        (
            ("eval", "--queries", "q.jsonl", "--qrels", "q.tsv", "--mode", "best"),
            "error: --mode: 'best' is not one of 'dense', 'lexical', 'hybrid', 'all'; see `pipeline eval --help`",
        ),
        (
            ("index", "--type", "annoy"),
            "error: --type: 'annoy' is not one of 'auto', 'flat', 'hnsw', 'ivf', 'ivfpq'; see `pipeline index --help`",
        ),
        (
            ("pretrain", "--preset", "huge"),
            "error: --preset: 'huge' is not one of 'tiny', 'small', 'medium', 'large'; see `pipeline pretrain --help`",
        ),
        (
            ("tune", "--pairs-from", "title,quotes"),
            "error: --pairs-from: unknown kind 'quotes' (choose from title, ict, neighbours, dropout); "
            "see `pipeline tune --help`",
        ),
        (("search",), "error: Missing argument 'QUERY'; see `pipeline search --help`"),
        (("--colour", "status"), "error: No such option: --colour; see `pipeline --help`"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args, message, tmp_path):
    result = run_cli("-w", str(tmp_path / "ws"), *args, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == message
    assert not (tmp_path / "ws").exists()


def test_choices_are_the_ones_each_stage_accepts():
    from pretrain import settings
    from pretrain.config import PRESETS, SCHEDULES, STRATEGIES

    assert get_args(settings.Preset) == tuple(PRESETS) and get_args(settings.Strategy) == (*STRATEGIES, "auto")
    assert get_args(settings.PipelineSchedule) == SCHEDULES


@pytest.mark.parametrize(
    "words, expected",
    [
        ("pipeline p", ["pretrain", "plan"]),
        ("pipeline search q --mode ", ["dense", "lexical", "hybrid"]),
        ("pipeline -w ws index --type h", ["hnsw"]),
        ("pipeline tune --pairs-from title,", ["title,ict", "title,neighbours", "title,dropout"]),
    ],
)
def test_shell_completion_offers_commands_and_choices(words, expected, monkeypatch):
    monkeypatch.setenv("_PIPELINE_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", words)
    monkeypatch.setenv("COMP_CWORD", str(len(words.split(" ")) - 1))
    assert run_cli().stdout.split() == expected


def test_shell_completion_script(monkeypatch):
    """`pipeline --show-completion` prints the completion script of the shell it runs in, which Typer finds by
    walking up the process tree (shellingham): here, as if run from bash (the test's own ancestors may hold
    no shell at all, as under nohup)."""
    import shellingham

    monkeypatch.setattr(shellingham, "detect_shell", lambda: ("bash", "/bin/bash"))
    assert "_PIPELINE_COMPLETE=complete_bash" in run_cli("--show-completion").stdout


def test_no_library_noise_reaches_the_user(corpus_file, tmp_path):
    """What a user's terminal shows of `pipeline pretrain` as run by default (in its own process, adapting the
    model to retrieval after pretraining, as `pipeline tune` does): our lines only. Before, pretraining ended
    with torch.distributed.checkpoint's single-process UserWarning, and the adaptation printed
    sentence-transformers' "Computing widget examples" bar and its batch sampler's notice that a small corpus
    repeats pairs."""
    from conftest import run_cli_process

    shape = [arg for arg in TINY_TRAINING if arg != "--no-adapt"]
    ws = tmp_path / "ws"
    stderr = run_cli_process(
        "pretrain", "-w", str(ws), "--data", str(corpus_file), *shape, "--max-steps", "2", "--time-budget", "20s"
    ).stderr
    said_by_libraries = ("Warning", "Computing widget examples", "NoDuplicatesBatchSampler", "%|")
    noise = [line for line in stderr.splitlines() if any(text in line for text in said_by_libraries)]
    assert noise == []
    assert "exported the " in stderr and "tuned in" in stderr and "embedder kept:" in stderr


def python_api_example(section: str) -> str:
    """The first Python block under a heading of docs/python-api.md (the README links there)."""
    guide = (REPO / "docs" / "python-api.md").read_text()
    return guide.split(f"\n## {section}\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_python_api_guides_search_example_runs(trained_workspace, tmp_path, monkeypatch, capsys):
    """docs/python-api.md's search example (the README's Python API), run as written against a workspace at
    ./workspace."""
    code = python_api_example("Searching a workspace")
    (tmp_path / "workspace").symlink_to(trained_workspace)  # the engine only reads it
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(code, "docs/python-api.md", "exec"), names)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == ["1", "2", "3", "4", "5"]
    assert len(names["recent"]) == 5 and all(hit.metadata["year"] >= 2015 for hit in names["recent"])
    document = names["document"]
    assert document["doc_id"] == names["recent"][0].doc_id and document["text"] and document["metadata"]["year"] >= 2015


@pytest.mark.parametrize("damaged", ["faiss", "bm25", "store"])
def test_a_damaged_index_or_store_file_is_named_with_what_to_run(trained_workspace, tmp_path, damaged):
    """A truncated file gives one line naming it and what to run, not FAISS's "read error in : 918 != ...";
    the other files are left as they were."""
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    manifest = json.loads((ws / "manifest.json").read_text())
    file = {
        "faiss": ws / manifest["index"]["path"],
        "bm25": ws / manifest["index"]["lexical_path"] / "chunk_ids.npy",
        "store": ws / "pipeline.duckdb",
    }[damaged]
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 3])
    result = run_cli("search", "-w", str(ws), "cancer", "--mode", "hybrid", check=False)
    error = result.stderr.strip()
    assert result.returncode == 2 and len(error.splitlines()) == 1 and error.startswith("error: "), error
    named = file.parent if damaged == "bm25" else file  # the BM25 index is its directory
    assert str(named) in error and (
        "pipeline index --rebuild" in error if damaged != "store" else "pipeline embed" in error
    )


def test_the_python_api_guides_workflows_example_builds_a_consistent_workspace(
    corpus_file, tmp_path, monkeypatch, capsys
):
    """docs/python-api.md's second example (building a workspace with workflows.py), run as written on a
    folder of documents, with a budget of seconds instead of minutes."""
    code = python_api_example("Building a workspace")
    assert 'time_budget="5m"' in code
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(corpus_file, docs / "corpus.jsonl")
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace('time_budget="5m"', 'time_budget="15s"'), "docs/python-api.md", "exec"), {})
    mode, problems = capsys.readouterr().out.splitlines()[-2:]
    assert mode in ("dense", "lexical", "hybrid") and problems == "[]"
    manifest = json.loads((tmp_path / "my-workspace" / "manifest.json").read_text())
    assert {"tokenizer", "model", "tuned", "embedder", "index", "search"} <= set(manifest)
