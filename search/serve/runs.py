"""What the runs page draws (GET /runs.json): the workspace's pretraining run, its adaptation and the
default-mode measurement, from the files that hold them, read at each request (a run in progress shows
its latest steps).

- pretraining: metrics.jsonl's records as pretrain wrote them (`train`, `val`, `resume`, the `sizing`
  table, the `end` record), the manifest's model (shape, steps, the validation loss reached) and, when the
  run had a plan prediction (a machine `pipeline plan` measured), the plan's predicted step time and peak
  memory beside the run's measured median step time and peak; None when the workspace has no run log.
- adaptation: the manifest's tuned section (the embedder kept, its first and last loss, each candidate's
  held-out nDCG@10 or why it was skipped) and each tuned candidate's loss curve, read from the TensorBoard
  events tune wrote (tensorboard/tune-ARCHITECTURE/): the one record of it, which `tensorboard --logdir`
  shows too; None before any tuning.
- search: the manifest's search section (nDCG@10 per mode, per hybrid weight, the pairs measured on);
  None before `pipeline index`.
"""

from __future__ import annotations

import statistics

from common.manifest import ModelEntry, TunedEntry, read_manifest
from common.runs import read_run_log, read_scalars
from common.workspace import Workspace

ARCHITECTURES = ("static", "transformer")  # tune's run directories: tensorboard/tune-ARCHITECTURE
MODEL_FIELDS = (
    "preset",
    "steps",
    "planned_steps",
    "stopped_early",
    "parameters",
    "config",
    "seq_len",
    "batch_size",
    "lr",
    "final_val_loss",
    "best_step",
    "best_val_loss",
)


def run_report(ws: Workspace) -> dict:
    manifest = read_manifest(ws)
    return {
        "pretraining": pretraining(read_run_log(ws), manifest.model),
        "adaptation": adaptation(ws, manifest.tuned),
        "search": manifest.search.to_json() if manifest.search else None,
    }


def pretraining(records: list[dict], model: ModelEntry | None) -> dict | None:
    if not records:
        return None

    def events(kind: str) -> list[dict]:
        return [r for r in records if r.get("event") == kind]

    train = events("train")
    model_json = model.to_json() if model else {}
    return {
        "train": train,
        "val": events("val"),
        "resumes": events("resume"),
        "sizing": next(iter(events("sizing")), None),
        "end": next(iter(events("end")[-1:]), None),
        "model": {name: model_json[name] for name in MODEL_FIELDS if name in model_json} or None,
        "plan": plan(train, model_json),
    }


def plan(train: list[dict], model_json: dict) -> dict | None:
    """The plan's prediction beside the run's measurement, from the steps that logged both."""
    predicted = [r for r in train if r.get("predicted_step_s") is not None]
    if not predicted:
        return None
    step_times = [r["measured_step_s"] for r in predicted if r.get("measured_step_s") is not None]
    memory = [r["measured_peak_mem_mb"] for r in predicted if r.get("measured_peak_mem_mb") is not None]
    prediction = model_json.get("prediction") or {}
    return {
        "plan": prediction.get("plan") or predicted[-1].get("strategy"),
        "main_cost": prediction.get("main_cost"),
        "parallelism": model_json.get("plan"),
        "predicted_step_s": predicted[-1]["predicted_step_s"],
        "measured_step_s": statistics.median(step_times) if step_times else None,
        "predicted_peak_mem_mb": predicted[-1].get("predicted_peak_mem_mb"),
        "measured_peak_mem_mb": max(memory) if memory else None,
    }


def adaptation(ws: Workspace, tuned: TunedEntry | None) -> dict | None:
    if tuned is None:
        return None
    candidates = tuned.report.get("candidates") or {}
    # the candidates the adaptation tuned (a skipped one has no score), or the one `pipeline tune` made
    names = [
        name
        for name in ARCHITECTURES
        if name == tuned.architecture or (candidates.get(name) or {}).get("held_out_ndcg@10") is not None
    ]
    return {
        "kept": tuned.architecture,
        "steps": tuned.steps,
        "first_loss": tuned.first_loss,
        "final_loss": tuned.final_loss,
        "candidates": candidates,
        "loss": {name: read_scalars(ws.tensorboard_dir / f"tune-{name}").get("train/loss", []) for name in names},
    }
