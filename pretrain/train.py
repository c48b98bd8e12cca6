"""The training loop, the same for one process and for every parallel plan, nanoGPT-like.

train() builds the mesh (pretrain/mesh.py), the GPT (pretrain/model.py) and parallelizes it
(pretrain/parallel.py: a ParallelModel, the model parts on this rank and a pipeline schedule under
PP), then loops: this rank's slice of the step's batch, forward and backward, clipping, AdamW, and
now and then metrics (pretrain/metrics.py), validation and a checkpoint (pretrain/checkpoint.py).
Whenever validation loss reaches a new best the weights are kept (checkpoints/best/); once it has not for
`patience` validations, training stops early (nanoGPT keeps its best checkpoint the same way). At the end
rank 0 exports the best-validation weights in Hugging Face format (pretrain/export.py).
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from torch.distributed.tensor import DTensor

from common.console import info
from common.manifest import ModelEntry, write_section
from common.workspace import Workspace, model_fingerprint
from pretrain.checkpoint import best_record, full_state_dict, load_best, load_checkpoint, save_best, save_checkpoint
from pretrain.config import ParallelConfig, RuntimeOptions, TrainConfig
from pretrain.data import TokenWindows, step_sample_indices
from pretrain.export import export_model
from pretrain.mesh import barrier, build_mesh
from pretrain.metrics import CommunicationTimer, RunLog, Stopwatch, memory_now_mb, reset_peak_memory
from pretrain.model import GPT, lm_loss
from pretrain.parallel import ParallelModel, clip_grad_norm, parallelize, print_layout
from pretrain.sizing import REPLAN_AFTER, replanned_steps
from pretrain.tokenizer import load_tokenizer

# ---------------------------------------------------------------- optimisation


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not biases, LayerNorms).

    Under tensor parallelism alone some parameters are DTensors and some plain tensors; they go in
    separate groups, as the fused kernel takes one kind at a time.
    """
    groups = []
    for decay in (True, False):
        for distributed in (False, True):
            params = [
                p for p in model.parameters() if (p.dim() >= 2) == decay and isinstance(p, DTensor) == distributed
            ]
            if params:
                groups.append({"params": params, "weight_decay": cfg.weight_decay if decay else 0.0})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if fused else {}))


def lr_multiplier(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio of the peak."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def replan_steps(cfg: TrainConfig, step_s: float, done: int, par, main: bool) -> None:
    """A sized run's step count, re-planned once from the loop's own step time (the slowest rank's, so every
    rank decides alike) to fill the seconds sizing planned for steps; the warmup stays as planned."""
    if par.world_size > 1:
        slowest = torch.tensor([step_s], dtype=torch.float64, device=par.device)
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        step_s = float(slowest.item())
    budget, cfg.step_budget_s = cfg.step_budget_s, 0.0  # once: a resumed run keeps the count
    steps = replanned_steps(cfg.max_steps, budget, step_s, done, cfg.max_planned_steps or None)
    if steps is None:
        return
    if main:
        info(
            f"re-planned: {steps:,} steps instead of {cfg.max_steps:,} to fill the {budget:.0f}s planned for "
            f"steps (a step takes {step_s * 1000:.0f} ms here now)"
        )
    cfg.warmup_steps = cfg.warmup
    cfg.max_steps = steps


# ---------------------------------------------------------------- the loop


@torch.no_grad()
def evaluate(pm: ParallelModel, val: TokenWindows, cfg: TrainConfig) -> float:
    """Mean loss over up to eval_batches global batches of validation windows (wrapping around a small set)."""
    for part in pm.parts:
        part.eval()
    par = pm.par
    local = cfg.batch_size // par.config.dp
    n_batches = max(1, math.ceil(min(len(val), cfg.eval_batches * cfg.batch_size) / cfg.batch_size))
    losses = []
    for b in range(n_batches):
        start = b * cfg.batch_size + par.dp_rank * local
        x, y = val.batch([(start + j) % len(val) for j in range(local)])
        losses.append(pm.global_mean(pm.eval_loss(x.to(par.device), y.to(par.device), cfg.grad_accum)))
    for part in pm.parts:
        part.train()
    return sum(losses) / len(losses)


class BestValidation:
    """The best validation loss so far (kept across --resume in checkpoints/best/) and how many validations
    since it: when to keep the weights and when to stop."""

    def __init__(self, ws: Workspace, par, resumed: bool):
        record = best_record(ws) if resumed and par.rank == 0 else None
        best = torch.tensor(
            [record["val_loss"] if record else math.inf, record["step"] if record else -1], dtype=torch.float64
        )
        if par.world_size > 1:  # rank 0 read it: every rank decides alike
            best = best.to(par.device)
            torch.distributed.broadcast(best, 0)
            best = best.cpu()
        self.val_loss, self.step = float(best[0]), int(best[1])
        self.since = 0

    def improved(self, step: int, val_loss: float) -> bool:
        if val_loss < self.val_loss:
            self.val_loss, self.step, self.since = val_loss, step, 0
            return True
        self.since += 1
        return False

    @property
    def kept(self) -> bool:
        return self.step >= 0


def train(
    ws: Workspace,
    cfg: TrainConfig,
    resume_from: Path | None = None,
    plan: ParallelConfig | None = None,
    export: bool = True,
    on_checkpoint: Callable[[Path, int, dict], None] | None = None,
    prediction: dict | None = None,
    options: RuntimeOptions | None = None,
) -> ModelEntry | None:
    """Run (or continue) training under a parallel plan (one process by default); export the final model.

    Every rank of the job calls this; rank 0 alone writes metrics, the manifest and the export.
    `prediction` (from the caller), the planner's step time and peak memory for this plan and the sizing's
    ranking of the shapes, is logged beside what the run measures. Returns the manifest's model section as
    exported (on rank 0; None on other ranks and without `export`).
    """
    plan, options = plan or ParallelConfig(), options or RuntimeOptions()  # the plan as validated by run_pretrain
    par = build_mesh(plan, options.timeout_s)
    reset_peak_memory(par.device)
    main = par.rank == 0
    memory_base_mb = memory_now_mb(par.device)  # measured peak memory is counted from here, as the planner counts it
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)  # the full model, identical on every rank; parallelize() splits and shards it
    n_params, flops_per_token = model.num_params(), model.flops_per_token(cfg.seq_len)
    pm = parallelize(model, par, lm_loss, options)
    del model
    optimizers = [build_optimizer(part, cfg, fused=options.fused_adamw) for part in pm.parts]
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: lr_multiplier(step, cfg)) for o in optimizers]
    start_step = 0
    if resume_from is not None:
        start_step = load_checkpoint(resume_from, pm, optimizers, schedulers)
        if main:
            info(f"resumed from {resume_from} at step {start_step}")
    elif main:
        shutil.rmtree(ws.checkpoints_dir, ignore_errors=True)
    barrier(par)

    train_windows = TokenWindows.open(ws.data_dir, "train", cfg.seq_len)
    val_windows = TokenWindows.open(ws.data_dir, "val", cfg.seq_len)
    log = RunLog(
        ws,
        par,
        cfg,
        flops_per_token,
        start_step,
        resume_from,
        prediction if main else None,
        memory_base_mb,
        wandb=options.wandb,
    )
    local_batch = cfg.batch_size // plan.dp
    if main:
        info(
            f"model: {n_params / 1e6:.2f}M parameters, {cfg.model.n_layer} layers, d={cfg.model.n_embd}; "
            f"{cfg.max_steps} steps of {log.tokens_per_step:,} tokens; {len(train_windows):,} training windows"
        )
        info(log.peaks_text())
    print_layout(pm, cfg)

    for part in pm.parts:
        part.train()
    del part  # the loop's name would keep the last part alive after the run
    loss_value, val_loss = (
        None,
        None,
    )  # stay None when there is no step to run (--max-steps 0: the model at initialisation)
    best = BestValidation(ws, par, resume_from is not None)
    log.start()
    timed_from = None  # when the loop's own timing of its steps began (after the first step: it warms up)
    step = start_step
    while step < cfg.max_steps:  # a sized run's max_steps is re-planned on the way (replan_steps)
        done = step + 1
        if cfg.step_budget_s and done == start_step + 2:
            timed_from = time.perf_counter()
        if timed_from is not None and done == start_step + 2 + REPLAN_AFTER:
            replan_steps(cfg, (time.perf_counter() - timed_from) / REPLAN_AFTER, step, par, main)
            timed_from = None
        logged = done % cfg.log_every == 0 or done == cfg.max_steps
        # This rank's slice of the global batch of this step (the same batch under every plan).
        indices = step_sample_indices(step, cfg.batch_size, len(train_windows), cfg.seed)
        x, y = train_windows.batch(indices[par.dp_rank * local_batch : (par.dp_rank + 1) * local_batch])
        x, y = x.to(par.device), y.to(par.device)
        pm.set_timing(logged)  # the last step of each log window is measured in detail
        # Only a logged step waits for the device (its clock, its loss read back): the others queue their
        # work behind the step before, so a GPU never idles while the host prepares the next batch.
        with (
            CommunicationTimer(par.device, enabled=logged and cfg.measure_comm and par.world_size > 1) as comm,
            Stopwatch(par.device, enabled=logged) as watch,
        ):
            local_loss = pm.forward_backward(x, y, cfg.grad_accum)
            grad_norm = clip_grad_norm(pm, cfg.grad_clip)
            for optimizer, scheduler in zip(optimizers, schedulers):
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        if logged:
            loss_value = pm.global_mean(local_loss)  # a collective: `logged` is alike on every rank
            log.train_step(
                done,
                loss_value,
                schedulers[0].get_last_lr()[0],
                grad_norm.item(),
                comm.seconds,
                watch.seconds,
                pm,
                optimizers,
            )
        else:
            log.count_step()
        stopping = False
        if done % cfg.validation_interval == 0 or done == cfg.max_steps:
            val_loss = evaluate(pm, val_windows, cfg)
            log.validation(done, val_loss)
            if best.improved(done, val_loss):
                state = full_state_dict(pm)  # a collective: every rank takes part
                if main:
                    save_best(ws, state, done, val_loss)
            stopping = cfg.patience > 0 and best.since >= cfg.patience and done < cfg.max_steps
        if done % cfg.checkpoint_every == 0 or done == cfg.max_steps or stopping:
            path = save_checkpoint(ws, done, pm, optimizers, schedulers, cfg)
            if on_checkpoint is not None:  # e.g. reported to Ray Train (pretrain/ray_train.py)
                on_checkpoint(path, done, {"loss": pm.global_mean(local_loss)})
        step = done
        if stopping:
            if main:
                info(
                    f"stopping early at step {done} of {cfg.max_steps}: validation loss has not improved on "
                    f"{best.val_loss:.4f} (step {best.step}) for {best.since} validations"
                )
            break

    pm.set_timing(False)
    if step > start_step:  # the last step's loss, logged or not (a collective)
        loss_value = pm.global_mean(local_loss)
    log.end(step, val_loss, best.step if best.kept else None, best.val_loss if best.kept else None)
    log.close()
    state = None
    if export:  # the best-validation weights where validation ran, else (no step run) the model as it is
        state = (load_best(ws) if main else None) if best.kept else full_state_dict(pm)
    del pm, optimizers, schedulers
    if par.device.type == "cuda":  # the adaptation, or another process on this GPU, gets the memory back
        torch.cuda.empty_cache()
    if not main or not export:
        return None
    summary = {
        "path": "model",
        "preset": cfg.preset,
        "steps": step,
        "planned_steps": cfg.max_steps,
        "stopped_early": step < cfg.max_steps,
        "final_loss": loss_value,
        "final_val_loss": val_loss,
        "best_step": best.step if best.kept else None,
        "best_val_loss": best.val_loss if best.kept else None,
        "parameters": n_params,
        "config": asdict(cfg.model),
        "seq_len": cfg.seq_len,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "plan": plan.to_dict(),
        "options": options.to_dict(),
        **({"prediction": prediction} if prediction else {}),
    }
    export_model(state, cfg.model, load_tokenizer(ws.tokenizer_dir), ws.model_dir)
    entry = ModelEntry.from_json({**summary, "fingerprint": model_fingerprint(ws.model_dir)})
    write_section(ws, entry)
    what = f"the best-validation weights (step {best.step}, loss {best.val_loss:.4f})" if best.kept else "the model"
    info(f"exported {what} to {ws.model_dir}")
    return entry
