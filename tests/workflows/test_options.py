"""Every numeric option of every command is checked where cli.py declares it: a bad value (NaN, infinity,
out of range, a duration of no time) is one line on stderr naming the option, exit status 2, and the
workspace is untouched, since the command never starts. Each case fails in the parser, so the file runs in
seconds (the first run_cli pays the imports)."""

from __future__ import annotations

import hashlib
import inspect
import typing
from pathlib import Path

import pytest

from conftest import run_cli

# A workspace as a pretraining run leaves it, in miniature: a failed command must leave every byte of it.
WORKSPACE_FILES = {
    "manifest.json": '{"tokenizer": {"path": "tokenizer", "vocab_size": 400}}\n',
    "tokenizer/tokenizer.json": '{"model": {}}\n',
    "data/train.bin": "\0" * 64,
    "checkpoints/step_00000010/meta.json": '{"step": 10}\n',
    "model/config.json": '{"n_layer": 2}\n',
}

# Arguments each command needs besides the option under test (eval's files are never read: parsing fails first).
REQUIRED = {"search": ["q"], "eval": ["--queries", "q.jsonl", "--qrels", "qrels.tsv"]}

# (command, option, bad value, what the error says after "error: OPTION: ")
BAD = [
    ("index", "--memory-budget", "0", "0 is not in the range x>0"),
    ("index", "--memory-budget", "nan", "nan is not a finite number"),
    ("index", "--shards", "0", "0 is not in the range x>=1"),
    ("pretrain", "--time-budget", "0s", "must be more than 0s, got '0s'"),
    ("pretrain", "--time-budget", "-5m", "must be more than 0s, got '-5m'"),
    ("pretrain", "--time-budget", "nan", "'nan' is not a duration (e.g. 90s, 15m, 1.5h)"),
    ("pretrain", "--time-budget", "infh", "'infh' is not a duration (e.g. 90s, 15m, 1.5h)"),
    ("pretrain", "--time-budget", "soon", "'soon' is not a duration (e.g. 90s, 15m, 1.5h)"),
    ("pretrain", "--max-steps", "-1", "-1 is not in the range x>=0"),
    ("pretrain", "--tokenizer-sample-mb", "0", "0 is not in the range x>0"),
    ("pretrain", "--tokenizer-sample-mb", "nan", "nan is not a finite number"),
    ("pretrain", "--shard-tokens", "0", "0 is not in the range x>=1"),
    ("pretrain", "--tokenize-workers", "0", "0 is not in the range x>=1"),
    ("pretrain", "--tokens", "0", "0 is not in the range x>=1"),
    ("pretrain", "--seq-len", "0", "0 is not in the range x>=1"),
    ("pretrain", "--batch-size", "0", "0 is not in the range x>=1"),
    ("pretrain", "--batch-size", "nan", "'nan' is not a whole number"),
    ("pretrain", "--batch-size", "1.5", "'1.5' is not a whole number"),
    ("pretrain", "--grad-accum", "0", "0 is not in the range x>=1"),
    ("pretrain", "--lr", "nan", "nan is not a finite number"),
    ("pretrain", "--lr", "inf", "inf is not a finite number"),
    ("pretrain", "--lr", "-1", "-1 is not in the range x>0"),
    ("pretrain", "--lr", "0", "0 is not in the range x>0"),
    ("pretrain", "--lr", "fast", "'fast' is not a number"),
    ("pretrain", "--seed", "-1", "-1 is not in the range 0<=x<=4294967295"),
    ("pretrain", "--seed", "4294967296", "4294967296 is not in the range 0<=x<=4294967295"),
    ("pretrain", "--vocab-size", "256", "256 is not in the range x>=257"),
    ("pretrain", "--vocab-size", "0", "0 is not in the range x>=257"),
    ("pretrain", "--n-layer", "0", "0 is not in the range x>=1"),
    ("pretrain", "--n-head", "0", "0 is not in the range x>=1"),
    ("pretrain", "--n-embd", "-8", "-8 is not in the range x>=1"),
    ("pretrain", "--eval-every", "0", "0 is not in the range x>=1"),
    ("pretrain", "--patience", "-1", "-1 is not in the range x>=0"),
    ("pretrain", "--checkpoint-every", "0", "0 is not in the range x>=1"),
    ("pretrain", "--log-every", "0", "0 is not in the range x>=1"),
    ("pretrain", "--nproc", "0", "0 is not in the range x>=1"),
    ("pretrain", "--nnodes", "0", "0 is not in the range x>=1"),
    ("pretrain", "--node-rank", "-1", "-1 is not in the range x>=0"),
    ("pretrain", "--master-port", "0", "0 is not in the range 1<=x<=65535"),
    ("pretrain", "--master-port", "65536", "65536 is not in the range 1<=x<=65535"),
    ("pretrain", "--dp", "0", "0 is not in the range x>=1"),
    ("pretrain", "--dp-replicate", "0", "0 is not in the range x>=1"),
    ("pretrain", "--dp-shard", "0", "0 is not in the range x>=1"),
    ("pretrain", "--tp", "0", "0 is not in the range x>=1"),
    ("pretrain", "--pp", "0", "0 is not in the range x>=1"),
    ("pretrain", "--microbatches", "0", "0 is not in the range x>=1"),
    ("pretrain", "--stages-per-rank", "0", "0 is not in the range x>=1"),
    ("pretrain", "--dist-timeout", "0", "0 is not in the range x>0"),
    ("pretrain", "--dist-timeout", "nan", "nan is not a finite number"),
    ("pretrain", "--dist-timeout", "-inf", "-inf is not a finite number"),
    ("pretrain", "--autotune", "0", "0 is not in the range x>=1"),
    ("pretrain", "--max-failures", "-1", "-1 is not in the range x>=0"),
    ("embed", "--chunk-tokens", "7", "7 is not in the range x>=8"),
    ("embed", "--overlap", "-1", "-1 is not in the range x>=0"),
    ("embed", "--batch-size", "0", "0 is not in the range x>=1"),
    ("search", "-k", "0", "0 is not in the range 1<=x<=1000"),
    ("search", "-k", "1001", "1001 is not in the range 1<=x<=1000"),
    ("search", "--dense-weight", "nan", "nan is not a finite number"),
    ("search", "--dense-weight", "inf", "inf is not a finite number"),
    ("search", "--dense-weight", "-0.1", "-0.1 is not in the range 0<=x<=1"),
    ("search", "--dense-weight", "1.5", "1.5 is not in the range 0<=x<=1"),
    ("eval", "-k", "0", "0 is not in the range 1<=x<=1000"),
    ("eval", "-k", "1001", "1001 is not in the range 1<=x<=1000"),
    ("eval", "--dense-weight", "nan", "nan is not a finite number"),
    ("eval", "--dense-weight", "2", "2 is not in the range 0<=x<=1"),
    ("tune", "--time-budget", "0s", "must be more than 0s, got '0s'"),
    ("tune", "--time-budget", "nan", "'nan' is not a duration (e.g. 90s, 15m, 1.5h)"),
    ("tune", "--dimensions", "0", "0 is not in the range x>=1"),
    ("tune", "--steps", "0", "0 is not in the range x>=1"),
    ("tune", "--batch-size", "1", "1 is not in the range x>=2"),
    ("tune", "--mini-batch", "0", "0 is not in the range x>=1"),
    ("tune", "--loader-workers", "-1", "-1 is not in the range x>=0"),
    ("tune", "--lr", "nan", "nan is not a finite number"),
    ("tune", "--lr", "0", "0 is not in the range x>0"),
    ("tune", "--lr", "-inf", "-inf is not a finite number"),
    ("tune", "--max-seq-length", "0", "0 is not in the range x>=1"),
    ("tune", "--seed", "-1", "-1 is not in the range 0<=x<=4294967295"),
    ("tune", "--seed", "4294967296", "4294967296 is not in the range 0<=x<=4294967295"),
    ("serve", "--port", "0", "0 is not in the range 1<=x<=65535"),
    ("serve", "--port", "65536", "65536 is not in the range 1<=x<=65535"),
    ("serve", "--replicas", "0", "0 is not in the range 1<=x<=64"),
    ("plan", "--seq-len", "0", "0 is not in the range x>=1"),
    ("plan", "--global-batch", "0", "0 is not in the range x>=1"),
    ("plan", "--vocab-size", "0", "0 is not in the range x>=1"),
    ("plan", "--nproc", "0", "0 is not in the range x>=1"),
    ("plan", "--dp", "0", "0 is not in the range x>=1"),
    ("plan", "--tp", "0", "0 is not in the range x>=1"),
    ("plan", "--pp", "0", "0 is not in the range x>=1"),
    ("plan", "--top", "0", "0 is not in the range x>=1"),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("options") / "ws"
    for name, text in WORKSPACE_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def snapshot(root: Path) -> dict:
    """Every path under root with its size, modification time and (for files) content hash."""
    return {
        str(p.relative_to(root)): (
            p.is_dir(),
            p.stat().st_size,
            p.stat().st_mtime_ns,
            None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(root.rglob("*"))
    } | {".": root.stat().st_mtime_ns}


def command_args(command: str, *args: str, workspace: Path) -> list[str]:
    return [command, *REQUIRED.get(command, []), "-w", str(workspace), *args]


@pytest.mark.parametrize("command, option, value, problem", BAD, ids=[f"{c} {o} {v}" for c, o, v, _ in BAD])
def test_a_bad_number_is_one_line_naming_the_option_and_changes_nothing(command, option, value, problem, workspace):
    before = snapshot(workspace)
    result = run_cli(*command_args(command, option, value, workspace=workspace), check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"error: {option}: {problem}; see `pipeline {command} --help`"]
    assert snapshot(workspace) == before


def numeric_options() -> set[tuple[str, str]]:
    """(command, option) for every int or float option of every command, and every duration."""
    import typer

    import cli

    group = typer.main.get_command(cli.app)
    found = set()
    for registered in cli.app.registered_commands:
        name = registered.name or registered.callback.__name__
        hints = typing.get_type_hints(registered.callback, include_extras=True)
        for param in inspect.signature(registered.callback).parameters:
            annotated = hints[param]
            if typing.get_origin(annotated) is not typing.Annotated:  # an option made from a settings field
                found |= settings_options(name, registered.callback.settings_class, param, annotated, group)
                continue
            kind = typing.get_args(annotated)[0]
            kinds = {k for k in typing.get_args(kind) if k is not type(None)} or {kind}
            assert not kinds & {int, float}, f"pipeline {name}: {param} is a number declared outside its settings"
    return found


def settings_options(name: str, settings_class, param: str, annotation, group) -> set[tuple[str, str]]:
    """A numeric option made from a field of the command's settings class (common/options.py, cli.options_of):
    its range and finiteness are the field's declaration, checked when the settings are made."""
    from common.options import declared_fields

    declared = {f.name: f.metadata["option"] for f in declared_fields(settings_class)}
    kinds = {k for k in typing.get_args(annotation) if k is not type(None)} or {annotation}
    if param not in declared or not (kinds & {int, float} or declared[param].duration):
        return set()
    if float in kinds:
        assert declared[param].above is not None or declared[param].min is not None, (name, param)
    opts = next(p.opts for p in group.commands[name].params if p.name == param)
    return {(name, max(opts, key=len))}


def test_every_numeric_option_has_a_bad_value_tested():
    options = numeric_options()
    assert {(command, option) for command, option, _, _ in BAD} == options
    assert {command for command, _ in options} == {
        "pretrain",
        "embed",
        "index",
        "search",
        "eval",
        "tune",
        "serve",
        "plan",
    }


def test_the_limits_are_the_ones_each_stage_accepts():
    from pretrain.settings import MIN_VOCAB_SIZE
    from pretrain.tokenizer import train_tokenizer

    assert train_tokenizer(["a few words"], 1).get_vocab_size() == MIN_VOCAB_SIZE  # the fewest it makes


@pytest.mark.parametrize(
    "args",
    [
        [
            "pretrain",
            "--lr",
            "1e-9",
            "--max-steps",
            "0",
            "--vocab-size",
            "257",
            "--seed",
            "4294967295",
            "--max-failures",
            "0",
            "--dist-timeout",
            "0.001",
            "--time-budget",
            "0.001s",
            "--node-rank",
            "0",
            "--master-port",
            "65535",
            "--tokens",
            "1",
            "--grad-accum",
            "1",
            "--eval-every",
            "1",
            "--checkpoint-every",
            "1",
            "--log-every",
            "1",
            "--seq-len",
            "1",
            "--batch-size",
            "1",
        ],
        [
            "tune",
            "--time-budget",
            "1s",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--mini-batch",
            "1",
            "--lr",
            "1e-9",
            "--seed",
            "0",
            "--dimensions",
            "1",
            "--max-seq-length",
            "1",
        ],
        ["search", "q", "--dense-weight", "0", "-k", "1"],
        ["search", "q", "--dense-weight", "1", "-k", "1000"],
        ["eval", "--queries", "q.jsonl", "--qrels", "qrels.tsv", "--dense-weight", "0.5", "-k", "1000"],
        ["embed", "--chunk-tokens", "8", "--overlap", "0", "--batch-size", "1"],
        ["serve", "--port", "65535", "--api-key", "short"],
        ["plan", "--seq-len", "1", "--global-batch", "1", "--vocab-size", "1", "--nproc", "1", "--top", "1"],
    ],
    ids=lambda args: args[0],
)
def test_the_edges_of_each_range_are_accepted(args, tmp_path):
    """The parser takes them: the command starts and fails on something else (no data, no workspace, ...),
    with a stage's error, not a usage error."""
    missing = tmp_path / "missing"
    extra = {
        "pretrain": ["--data", str(missing)],
        "tune": ["--data", str(missing)],
        "plan": ["--cluster", str(missing)],
    }
    result = run_cli("-w", str(tmp_path / "ws"), *args, *extra.get(args[0], []), check=False)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert (
        result.stderr.startswith("error: ") and "--help`" not in result.stderr
    )  # a usage error ends with "see `pipeline X --help`"


def test_options_checked_together_still_fail_before_anything_is_written(workspace):
    before = snapshot(workspace)
    result = run_cli("pretrain", "-w", str(workspace), "--nnodes", "2", "--node-rank", "2", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --node-rank 2 is not a node of the job: the ranks of --nnodes 2 are 0 to 1"
    ]
    assert snapshot(workspace) == before


def test_a_nan_learning_rate_creates_no_workspace(tmp_path):
    """The report: `pretrain --lr nan` ended in the optimizer's traceback after the workspace was written."""
    result = run_cli("pretrain", "-w", str(tmp_path / "ws"), "--lr", "nan", check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --lr: nan is not a finite number; see `pipeline pretrain --help`"
    assert not (tmp_path / "ws").exists()


def test_ranges_show_in_help():
    help_text = " ".join(run_cli("pretrain", "--help").stdout.split())
    assert "[x>=1]" in help_text and "[1<=x<=65535]" in help_text and "Peak learning rate [x>0]" in help_text
    assert "0<=x<=1" in " ".join(run_cli("search", "--help").stdout.split())
