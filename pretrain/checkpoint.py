"""Checkpoints: the whole training state with torch.distributed.checkpoint, whatever the plan.

A checkpoint holds the state of the whole model whatever the plan that wrote it: every rank
contributes its parameters (FSDP/TP shards, pipeline stages) under their full-model names, and
DCP stores each tensor once. The optimizer state is flattened ("state.<param>.exp_avg") so model
parts of a pipeline merge into one dictionary. The tied embedding's optimizer state is always
stored under tok_emb.weight, as in the unsplit model, even by a last stage that holds it as
lm_head.weight. So any plan can resume any checkpoint.

full_state_dict() gathers the whole model's weights on rank 0 for the export. The best-validation
weights are kept beside the checkpoints (checkpoints/best/: model.safetensors and best.json with the
step and validation loss), written by rank 0 whenever validation improves: they are what is exported.
"""

from __future__ import annotations

import base64
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from common.workspace import Workspace, atomic_write_json, replace_directory
from pretrain.config import TrainConfig, train_config_from_dict
from pretrain.mesh import barrier
from pretrain.parallel import ParallelModel


def checkpoint_dirs(ws: Workspace) -> list[Path]:
    if not ws.checkpoints_dir.exists():
        return []
    return sorted(p for p in ws.checkpoints_dir.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))


def _holds_head_only(module: torch.nn.Module) -> bool:
    return module.lm_head is not None and module.tok_emb is None


def _part_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    model_state, optim_state = get_state_dict(
        module, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
    )
    if _holds_head_only(module):
        optim_state = {k.replace(".lm_head.weight.", ".tok_emb.weight."): v for k, v in optim_state.items()}
    return {"model": model_state, "optim": optim_state}


def _merge(states: list[dict]) -> dict:
    merged: dict = {"model": {}, "optim": {}}
    for state in states:
        for section, values in state.items():
            for key, value in values.items():
                merged[section].setdefault(key, value)
    return merged


def save_checkpoint(
    ws: Workspace, step: int, pm: ParallelModel, optimizers, schedulers, cfg: TrainConfig, keep: int = 2
) -> Path:
    """Save model, optimizer, scheduler and RNG state with torch.distributed.checkpoint (a collective).

    Written to step_N.tmp and renamed by rank 0 when complete, so a crash never leaves a half
    checkpoint that --resume would pick up.
    """
    final = ws.checkpoints_dir / f"step_{step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    main = pm.par.rank == 0
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier(pm.par)
    dcp.save(_merge([_part_state(m, o) for m, o in zip(pm.modules(), optimizers)]), checkpoint_id=tmp)
    if main:
        train_state = {
            "step": step,  # optimizer steps done = index of the next batch: the data position
            "scheduler": schedulers[0].state_dict(),
            "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            "config": asdict(cfg),
            "plan": pm.par.config.to_dict(),  # informational: any plan can resume it
        }
        atomic_write_json(tmp / "train_state.json", train_state)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in checkpoint_dirs(ws)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier(pm.par)
    return final


def load_checkpoint(path: Path, pm: ParallelModel | torch.nn.Module, optimizers, schedulers) -> int:
    """Restore everything save_checkpoint wrote, under this run's plan; returns the step to continue from.

    Also takes a plain model with its optimizer and scheduler (one process, no plan).
    """
    if not isinstance(pm, ParallelModel):
        pm, optimizers, schedulers = ParallelModel.single(pm), [optimizers], [schedulers]
    states = [_part_state(m, o) for m, o in zip(pm.modules(), optimizers)]
    merged = _merge(states)
    dcp.load(merged, checkpoint_id=path)
    for module, optimizer, state in zip(pm.modules(), optimizers, states):
        for section, values in state.items():
            for key, value in values.items():
                loaded = merged[section][key]
                if not isinstance(value, torch.Tensor):
                    values[key] = loaded
                elif loaded is not value:  # a second copy of the tied weight on this rank (zbv)
                    value.copy_(loaded)
        optim_state = state["optim"]
        if _holds_head_only(module):
            optim_state = {k.replace(".tok_emb.weight.", ".lm_head.weight."): v for k, v in optim_state.items()}
        set_state_dict(
            module,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=optim_state,
            options=StateDictOptions(flatten_optimizer_state_dict=True),
        )
    train_state = json.loads((path / "train_state.json").read_text())
    saved = train_state["scheduler"]
    for scheduler in schedulers:
        # One schedule for all parameter groups, whose number depends on the plan.
        groups = len(scheduler.optimizer.param_groups)
        scheduler.load_state_dict(
            {**saved, "base_lrs": saved["base_lrs"][:1] * groups, "_last_lr": saved["_last_lr"][:1] * groups}
        )
    rng = torch.frombuffer(bytearray(base64.b64decode(train_state["torch_rng"])), dtype=torch.uint8)
    torch.set_rng_state(rng)
    return train_state["step"]


def config_from_checkpoint(path: Path) -> TrainConfig:
    return train_config_from_dict(json.loads((path / "train_state.json").read_text())["config"])


def full_state_dict(pm: ParallelModel) -> dict[str, torch.Tensor] | None:
    """The whole model's weights as plain CPU tensors on rank 0 (None elsewhere): FSDP and TP shards
    are gathered by get_model_state_dict; pipeline stages are then gathered over the pp group."""
    par = pm.par
    if par.config.pp == 1:
        state = get_model_state_dict(pm.modules()[0], options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if par.rank == 0 else None
    state = {}
    for module in pm.modules():
        part = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
        state.update({k: v.detach().cpu() for k, v in part.items()})
    if any(par.coord(dim) for dim in ("dp_replicate", "dp_shard", "tp")):
        return None  # a copy of what the pipeline of rank 0's coordinates holds
    gathered = [None] * par.config.pp if par.rank == 0 else None
    dist.gather_object(state, gathered, dst=0, group=par.pp_group())
    if par.rank != 0:
        return None
    return {k: v for stage_state in gathered for k, v in stage_state.items()}


# ---------------------------------------------------------------- the best-validation weights

BEST_DIR = "best"
BEST_WEIGHTS, BEST_RECORD = "model.safetensors", "best.json"


def save_best(ws: Workspace, state: dict[str, torch.Tensor], step: int, val_loss: float) -> None:
    """Keep `state` (rank 0's full state dict) as the best-validation weights: written aside, then swapped in."""
    from safetensors.torch import save_file

    tmp = ws.checkpoints_dir / f"{BEST_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # the tied embedding is one tensor under two names; safetensors stores each name's own copy
    save_file({name: tensor.detach().contiguous().clone() for name, tensor in state.items()}, tmp / BEST_WEIGHTS)
    atomic_write_json(tmp / BEST_RECORD, {"step": step, "val_loss": val_loss})
    replace_directory(tmp, ws.checkpoints_dir / BEST_DIR)


def best_record(ws: Workspace) -> dict | None:
    """{"step", "val_loss"} of the best-validation weights kept, or None."""
    try:
        return json.loads((ws.checkpoints_dir / BEST_DIR / BEST_RECORD).read_text())
    except (OSError, ValueError):
        return None


def load_best(ws: Workspace) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(ws.checkpoints_dir / BEST_DIR / BEST_WEIGHTS)
