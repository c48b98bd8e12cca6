"""Seeing a run: the TensorBoard event files pretrain and tune write, read back with TensorBoard's own reader,
the run's log keeping the validation loss it reached, and W&B only when asked for."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil

import pytest

from conftest import TINY_TRAINING, board, board_charts, board_texts, read_metrics, run_cli

WANDB_MISSING = "error: --wandb: the wandb package is not installed (pip install wandb), or drop --wandb"


def test_pretrain_writes_its_metrics_as_tensorboard_scalars_and_records_the_loss_it_reached(trained_workspace):
    """The session's tiny run (20 steps, logged at each, validated at 10 and 20): every figure of
    metrics.jsonl that the issue names is a TensorBoard scalar at its step, with the same value."""
    metrics = read_metrics(trained_workspace)
    scalars = board(trained_workspace / "tensorboard" / "pretrain")
    train = [m for m in metrics if m["event"] == "train"]
    val = [m for m in metrics if m["event"] == "val"]
    assert [m["step"] for m in train] == list(range(1, 21)) and [m["step"] for m in val] == [10, 20]
    for tag, field, records in [
        ("loss/train", "loss", train),
        ("loss/validation", "val_loss", val),
        ("optimizer/lr", "lr", train),
        ("optimizer/grad_norm", "grad_norm", train),
        ("throughput/tokens_per_s", "tokens_per_s", train),
        ("throughput/mfu", "mfu", train),
        ("memory/peak_rss_mb", "peak_rss_mb", train),
        ("time/step_s", "step_s", train),
    ]:
        assert [step for step, _ in scalars[tag]] == [m["step"] for m in records], tag
        assert [value for _, value in scalars[tag]] == pytest.approx([m[field] for m in records], rel=1e-6), tag
    assert [v for _, v in scalars["memory/peak_mb"]] == pytest.approx([max(m["peak_mem_mb_per_rank"]) for m in train])
    assert all(0 < v <= 1 for _, v in scalars["throughput/mfu"]) and all(v > 0 for _, v in scalars["memory/peak_mb"])
    assert scalars["loss/train"][-1][1] < scalars["loss/train"][0][1]  # it learned
    # no cluster measured in this workspace: no plan prediction to draw beside the run (test_planner draws one)
    assert not any(tag.startswith("plan/") for tag in scalars)
    charts = board_charts(trained_workspace / "tensorboard" / "pretrain")
    assert charts["train and validation loss"] == ["loss/train", "loss/validation"]
    # The log's last record: the validation loss reached, beside a model that learned nothing (400 token types)
    end = metrics[-1]
    assert end["event"] == "end" and end["step"] == 20 and end["val_loss_reached"] == val[-1]["val_loss"]
    assert end["uniform_loss"] == pytest.approx(math.log(400)) and end["val_loss_reached"] < end["uniform_loss"]
    assert "law_rank" not in end  # the shape was given, not sized
    assert "validation loss reached" in board_texts(trained_workspace / "tensorboard" / "pretrain")["result"]


def test_tensorboard_when_asked_for_wandb(tmp_path, trained_workspace, corpus_file, monkeypatch):
    """--wandb with wandb not installed is one line before anything is written (pretrain and tune); installed,
    WANDB_MODE=offline keeps the run in the workspace with no network."""
    ws = tmp_path / "ws"
    args = ("pretrain", "-w", str(ws), "--data", str(corpus_file), *TINY_TRAINING, "--max-steps", "2", "--wandb")
    if importlib.util.find_spec("wandb") is None:
        result = run_cli(*args, check=False)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [WANDB_MISSING]
        assert not ws.exists()
        tuned = tmp_path / "tuned"
        shutil.copytree(trained_workspace, tuned)
        result = run_cli("tune", "-w", str(tuned), "--steps", "2", "--wandb", check=False)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [WANDB_MISSING]
        assert sorted(p.name for p in (tuned / "tensorboard").iterdir()) == ["pretrain"]
        return
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_cli(*args)
    assert len(list((ws / "wandb").glob("offline-run-*"))) == 1
    assert [step for step, _ in board(ws / "tensorboard" / "pretrain")["loss/train"]] == [1, 2]


def test_tune_writes_its_loss_for_tensorboard(trained_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    result = run_cli("tune", "-w", str(ws), "--architecture", "static", "--steps", "4", "--batch-size", "8")
    assert f"TensorBoard: tensorboard --logdir {ws / 'tensorboard'}" in result.stderr
    scalars = board(ws / "tensorboard" / "tune-static")
    tuned = json.loads((ws / "manifest.json").read_text())["tuned"]
    assert [step for step, _ in scalars["train/loss"]] == [4]  # logged every 10 steps, or at the last
    assert scalars["train/loss"][-1][1] == pytest.approx(tuned["final_loss"], rel=1e-6)
    assert {"train/learning_rate", "train/grad_norm"} <= set(scalars)
    assert not (ws / "tensorboard" / "tune-transformer").exists()
