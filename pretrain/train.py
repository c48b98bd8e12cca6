"""The pretraining run: data preparation, the training loop, checkpoints and export.

Read top to bottom: prepare_data() builds the tokenizer and token files, train() runs the loop.
The loop is the same for one process and for every parallel plan: pretrain/parallel.py turns the
model into a ParallelModel (model parts on this rank, and a pipeline schedule under PP) and
train() only talks to that.
"""
from __future__ import annotations

import base64
import json
import math
import resource
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from common.console import info
from common.errors import PipelineError
from common.readers import Document, read_documents
from common.workspace import Workspace, atomic_write_bytes, atomic_write_json, file_sha256, model_fingerprint
from pretrain.config import ModelConfig, TrainConfig
from pretrain.data import TokenWindows, step_sample_indices, tokenize_corpus, write_token_files
from pretrain.default_corpus import stdlib_documents
from pretrain.export import export_model
from pretrain.hardware import PEAK_CACHE, cached_peak, machine_key, measure_matmul_flops, record_peak
from pretrain.metrics import CommunicationTimer, Stopwatch, memory_now_mb, model_state_mb, peak_memory_mb, reset_peak_memory
from pretrain.model import GPT, lm_loss
from pretrain.parallel import (Parallel, ParallelConfig, ParallelModel, build_mesh, clip_grad_norm, describe_rank,
                               parallelize, stage_layers)
from pretrain.sizing import vocab_for
from pretrain.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer


# ---------------------------------------------------------------- data

def training_texts(documents: Iterable[Document]) -> Iterator[str]:
    for doc in documents:
        yield f"{doc.title}\n{doc.text}" if doc.title else doc.text


def prepare_data(ws: Workspace, data_paths: list[Path], text_field: str | None, cfg: TrainConfig) -> dict:
    """Train the tokenizer and write the token files; returns the data section of the manifest.
    cfg.vocab_size 0 sizes the vocabulary to the corpus (and sets it). Nothing is written unless the
    corpus is usable; each file is written to a temporary name and renamed."""
    if data_paths:
        documents = list(read_documents(data_paths, text_field))
        sources = [str(p) for p in data_paths]
    else:
        documents = list(stdlib_documents())
        sources = ["<python standard library docstrings>"]
        info(f"no --data given: training on the built-in corpus of Python standard library docstrings ({len(documents)} modules)")
    if not documents:
        raise PipelineError(f"no documents with text in {', '.join(sources)}")
    if not cfg.vocab_size:  # sized to the corpus (pretrain/sizing.py)
        cfg.vocab_size = vocab_for(sum(len(text) for text in training_texts(documents)))
    info(f"training a {cfg.vocab_size}-token byte-level BPE tokenizer on {len(documents)} documents")
    tokenizer = train_tokenizer(training_texts(documents), cfg.vocab_size)
    train_tokens, val_tokens = tokenize_corpus(training_texts(documents), tokenizer, cfg.val_fraction, cfg.seq_len)
    # Everything is checked: from here on this is a new run. The previous run's checkpoints go first, so
    # that a `--resume` after a crash mid-way can never continue them on the new tokens.
    ws.create()
    shutil.rmtree(ws.checkpoints_dir, ignore_errors=True)
    save_tokenizer(tokenizer, ws.tokenizer_dir)
    meta = write_token_files(train_tokens, val_tokens, tokenizer.get_vocab_size(), ws.data_dir)
    info(f"tokenized: {meta['train_tokens']:,} training and {meta['val_tokens']:,} validation tokens")
    ws.update_manifest("tokenizer", {
        "path": "tokenizer", "sha256": file_sha256(ws.tokenizer_dir / "tokenizer.json"),
        "vocab_size": tokenizer.get_vocab_size(), "sources": sources, "documents": len(documents), **meta,
    })
    return meta


# ---------------------------------------------------------------- optimisation

def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not biases, LayerNorms).

    Under tensor parallelism alone some parameters are DTensors and some plain tensors; they go in
    separate groups, as the fused kernel takes one kind at a time.
    """
    groups = []
    for decay in (True, False):
        for distributed in (False, True):
            params = [p for p in model.parameters() if (p.dim() >= 2) == decay and isinstance(p, DTensor) == distributed]
            if params:
                groups.append({"params": params, "weight_decay": cfg.weight_decay if decay else 0.0})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if fused else {}))


def lr_multiplier(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio of the peak."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- checkpoints
#
# A checkpoint holds the state of the whole model whatever the plan that wrote it: every rank
# contributes its parameters (FSDP/TP shards, pipeline stages) under their full-model names, and
# DCP stores each tensor once. The optimizer state is flattened ("state.<param>.exp_avg") so model
# parts of a pipeline merge into one dictionary. The tied embedding's optimizer state is always
# stored under tok_emb.weight, as in the unsplit model, even by a last stage that holds it as
# lm_head.weight.

def checkpoint_dirs(ws: Workspace) -> list[Path]:
    if not ws.checkpoints_dir.exists():
        return []
    return sorted(p for p in ws.checkpoints_dir.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))


def _holds_head_only(module: torch.nn.Module) -> bool:
    return module.lm_head is not None and module.tok_emb is None


def _part_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    model_state, optim_state = get_state_dict(module, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
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


def save_checkpoint(ws: Workspace, step: int, pm: ParallelModel, optimizers, schedulers, cfg: TrainConfig, keep: int = 2) -> Path:
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
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=optim_state,
                       options=StateDictOptions(flatten_optimizer_state_dict=True))
    train_state = json.loads((path / "train_state.json").read_text())
    saved = train_state["scheduler"]
    for scheduler in schedulers:
        # One schedule for all parameter groups, whose number depends on the plan.
        groups = len(scheduler.optimizer.param_groups)
        scheduler.load_state_dict({**saved, "base_lrs": saved["base_lrs"][:1] * groups, "_last_lr": saved["_last_lr"][:1] * groups})
    rng = torch.frombuffer(bytearray(base64.b64decode(train_state["torch_rng"])), dtype=torch.uint8)
    torch.set_rng_state(rng)
    return train_state["step"]


def config_from_checkpoint(path: Path) -> TrainConfig:
    raw = json.loads((path / "train_state.json").read_text())["config"]
    model = ModelConfig(**raw.pop("model"))
    return TrainConfig(**raw, model=model)


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


# ---------------------------------------------------------------- metrics and progress

class MetricsLog:
    """Metrics as JSON lines in the workspace; on resume, lines past the checkpoint are dropped."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is None:
            atomic_write_bytes(path, b"")
        elif path.exists():
            kept = [line for line in path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= resume_step]
            atomic_write_bytes(path, "".join(line + "\n" for line in kept).encode())

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def format_eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def barrier(par: Parallel) -> None:
    if par.world_size > 1:
        dist.barrier()


def gather_floats(par: Parallel, values: list[float]) -> list[list[float]]:
    """The same few numbers from every rank, in rank order."""
    if par.world_size == 1:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(par.world_size)]
    dist.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]


_peak_flops: dict[str, float] = {}  # machine_key -> the peak this process measured or was given


def job_peak_flops(par: Parallel, cache: Path) -> float:
    """Sustained matmul FLOP/s of the whole job (pretrain/hardware.py), as rank 0 knows it: recorded in
    the workspace for this machine and job size, else measured by every rank at once (ranks sharing a
    CPU share it), summed and recorded. Rank 0 decides, so that every rank measures or none does."""
    key = machine_key(par.device, par.world_size)
    peak = torch.tensor([(cached_peak(cache, key) or _peak_flops.get(key, 0.0)) if par.rank == 0 else 0.0], dtype=torch.float64)
    if par.world_size > 1:
        dist.broadcast(peak, 0)
    if peak.item() == 0.0:  # none recorded: measure
        peak = torch.tensor([measure_matmul_flops(par.device)], dtype=torch.float64)
        if par.world_size > 1:
            dist.all_reduce(peak)
    _peak_flops[key] = peak.item()
    return record_peak(cache, key, peak.item(), "measured (best of 5 matmul timings)") if par.rank == 0 else peak.item()


def theoretical_bubble(config: ParallelConfig) -> float | None:
    """Idle fraction of a pipeline step in theory: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v·m+p-1)
    for interleaved 1F1B with v stages per rank (Narayanan et al., 2021)."""
    p, m = config.pp, config.n_microbatches
    if p == 1:
        return 0.0
    if config.pp_schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if config.pp_schedule == "interleaved-1f1b":
        return (p - 1) / (config.n_stages_per_rank * m + p - 1)
    return None


def print_layout(pm: ParallelModel, cfg: TrainConfig) -> None:
    """Rank 0 prints which rank holds which layers and shards."""
    par, plan = pm.par, pm.par.config
    lines = [describe_rank(pm, cfg)]
    if par.world_size > 1:
        everyone = [None] * par.world_size
        dist.all_gather_object(everyone, lines[0])
        lines = everyone
    if par.rank != 0:
        return
    backend = dist.get_backend() if par.world_size > 1 else "no process group"
    info(f"plan: {plan.strategy}, {plan.shape()} on {par.world_size} {par.device.type.upper()} process(es) ({backend}); "
         f"global batch {cfg.batch_size} × {cfg.seq_len} tokens")
    if plan.pp > 1:
        local = cfg.batch_size // plan.dp
        info(f"pipeline: schedule {plan.pp_schedule}, {plan.num_stages} stages ({plan.n_stages_per_rank} per rank), "
             f"layers per stage {stage_layers(plan, cfg.model.n_layer)}, {plan.n_microbatches} microbatches of "
             f"{local // plan.n_microbatches} sequences per step")
    for line in lines:
        info("  " + line)


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


def train(ws: Workspace, cfg: TrainConfig, resume_from: Path | None = None, plan: ParallelConfig | None = None,
          export: bool = True, on_checkpoint: Callable[[Path, int, dict], None] | None = None,
          prediction: dict | None = None) -> dict:
    """Run (or continue) training under a parallel plan (one process by default); export the final model.

    Every rank of the job calls this; rank 0 alone writes metrics, the manifest and the export.
    `prediction`, the planner's step time and peak memory for this plan (from the caller), is logged
    beside what the run measures. Returns a summary (on rank 0; other ranks get {}).
    """
    plan = plan or ParallelConfig()
    plan.validate(cfg.model, cfg)
    par = build_mesh(plan)
    reset_peak_memory(par.device)
    main = par.rank == 0
    prediction = prediction if main else None
    memory_base_mb = memory_now_mb(par.device)  # measured peak memory is counted from here, as the planner counts it
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)  # the full model, identical on every rank; parallelize() splits and shards it
    n_params, flops_per_token = model.num_params(), model.flops_per_token(cfg.seq_len)
    pm = parallelize(model, par, lm_loss)
    del model
    optimizers = [build_optimizer(part, cfg, fused=plan.fused_adamw) for part in pm.parts]
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
    metrics = MetricsLog(ws.metrics_path, start_step if resume_from else None) if main else None
    if metrics is not None and resume_from is not None:  # the log says where a resumed run picked up
        metrics.write({"event": "resume", "step": start_step, "checkpoint": str(resume_from), "world_size": par.world_size})
    peak_cache, peak_key = ws.root / PEAK_CACHE, machine_key(par.device, par.world_size)
    peak_flops = job_peak_flops(par, peak_cache)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    local_batch = cfg.batch_size // plan.dp
    if main:
        info(f"model: {n_params / 1e6:.2f}M parameters, {cfg.model.n_layer} layers, d={cfg.model.n_embd}; "
             f"{cfg.max_steps} steps of {tokens_per_step:,} tokens; {len(train_windows):,} training windows")
        info(f"MFU below is model FLOP/s against this machine's measured matmul peak, {peak_flops / 1e9:,.1f} GFLOP/s "
             f"({peak_cache.name}), not a datasheet peak")
    print_layout(pm, cfg)

    for part in pm.parts:
        part.train()
    loss_value, val_loss = None, None  # stay None when there is no step to run (--max-steps 0: the model at initialisation)
    run_start = last_log = time.perf_counter()
    steps_since_log = 0
    for step in range(start_step, cfg.max_steps):
        done = step + 1
        logged = done % cfg.log_every == 0 or done == cfg.max_steps
        # This rank's slice of the global batch of this step (the same batch under every plan).
        indices = step_sample_indices(step, cfg.batch_size, len(train_windows), cfg.seed)
        x, y = train_windows.batch(indices[par.dp_rank * local_batch:(par.dp_rank + 1) * local_batch])
        x, y = x.to(par.device), y.to(par.device)
        pm.set_timing(logged)  # the last step of each log window is measured in detail
        with CommunicationTimer(par.device, enabled=logged and cfg.measure_comm and par.world_size > 1) as comm, Stopwatch(par.device) as watch:
            local_loss = pm.forward_backward(x, y, cfg.grad_accum)
            grad_norm = clip_grad_norm(pm, cfg.grad_clip)
            for optimizer, scheduler in zip(optimizers, schedulers):
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        loss_value = pm.global_mean(local_loss)
        steps_since_log += 1

        if logged:
            now = time.perf_counter()
            tokens_per_s = steps_since_log * tokens_per_step / (now - last_log)
            eta = (cfg.max_steps - done) * tokens_per_step / tokens_per_s
            # Per rank: peak memory, weights + optimizer state, seconds in communication, step seconds, bubble.
            ranks = gather_floats(par, [peak_memory_mb(par.device), model_state_mb(pm.parts, optimizers), comm.seconds,
                                        watch.seconds, pm.bubble_fraction()])
            if main:
                achieved = tokens_per_s * flops_per_token
                if achieved > peak_flops:  # faster than the peak: the peak was measured low (a busy machine)
                    info(f"this run computes {achieved / 1e9:,.1f} GFLOP/s, above the matmul peak measured here "
                         f"({peak_flops / 1e9:,.1f}): the peak was measured low; it is now {achieved / 1e9:,.1f}")
                    peak_flops = _peak_flops[peak_key] = record_peak(peak_cache, peak_key, achieved, f"achieved by training, step {done}")
                record = {"event": "train", "step": done, "loss": loss_value, "lr": schedulers[0].get_last_lr()[0],
                          "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                          "mfu": achieved / peak_flops, "matmul_peak_flops": peak_flops,
                          "peak_rss_mb": peak_rss_mb(), "peak_mem_mb_per_rank": [r[0] for r in ranks],
                          "model_state_mb_per_rank": [r[1] for r in ranks],
                          "step_s": watch.seconds, "comm_s_per_rank": [r[2] for r in ranks],
                          "comm_fraction": sum(r[2] / r[3] for r in ranks) / len(ranks),
                          "tokens_seen": done * tokens_per_step, "elapsed_s": now - run_start,
                          "world_size": par.world_size, "strategy": plan.strategy}
                if prediction:
                    record.update(predicted_step_s=prediction["step_s"], measured_step_s=watch.seconds,
                                  predicted_peak_mem_mb=prediction["peak_mem_mb"],
                                  measured_peak_mem_mb=max(r[0] for r in ranks) - memory_base_mb)
                if plan.pp > 1:
                    bubbles = [r[4] for r in ranks]
                    record.update(bubble_fraction=sum(bubbles) / len(bubbles), bubble_fraction_per_rank=bubbles,
                                  bubble_theory=theoretical_bubble(plan))
                metrics.write(record)
                info(f"step {done}/{cfg.max_steps}  loss {loss_value:.4f}  lr {record['lr']:.2e}  "
                     f"{tokens_per_s:,.0f} tok/s  MFU {record['mfu']:.1%} of measured peak  comm {record['comm_fraction']:.0%}"
                     + (f"  bubble {record['bubble_fraction']:.0%}" if plan.pp > 1 else "") + f"  eta {format_eta(eta)}")
            last_log, steps_since_log = time.perf_counter(), 0
        if done % cfg.eval_every == 0 or done == cfg.max_steps:
            val_loss = evaluate(pm, val_windows, cfg)
            if main:
                metrics.write({"event": "val", "step": done, "val_loss": val_loss, "val_ppl": math.exp(val_loss)})
                info(f"step {done}: validation loss {val_loss:.4f}, perplexity {math.exp(val_loss):.1f}")
        if done % cfg.checkpoint_every == 0 or done == cfg.max_steps:
            path = save_checkpoint(ws, done, pm, optimizers, schedulers, cfg)
            if on_checkpoint is not None:  # e.g. reported to Ray Train (pretrain/ray_train.py)
                on_checkpoint(path, done, {"loss": loss_value})

    pm.set_timing(False)
    state = full_state_dict(pm) if export else None
    if not main:
        return {}
    summary = {"path": "model", "preset": cfg.preset, "steps": cfg.max_steps, "final_loss": loss_value,
               "final_val_loss": val_loss, "parameters": n_params, "config": asdict(cfg.model), "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "lr": cfg.lr,
               "plan": plan.to_dict(), **({"prediction": prediction} if prediction else {})}
    if export:
        export_model(state, cfg.model, load_tokenizer(ws.tokenizer_dir), ws.model_dir)
        summary["fingerprint"] = model_fingerprint(ws.model_dir)
        ws.update_manifest("model", summary)
        info(f"exported the model to {ws.model_dir}")
    return summary
