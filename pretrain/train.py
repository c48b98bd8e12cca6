"""The pretraining run: data preparation, the training loop, checkpoints and export.

Read top to bottom: prepare_data() builds the tokenizer and token files, train() runs the loop.
"""
from __future__ import annotations

import base64
import json
import math
import resource
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from common.console import info, warn
from common.errors import PipelineError
from common.readers import Document, read_documents
from common.workspace import Workspace, atomic_write_bytes, atomic_write_json, file_sha256, model_fingerprint
from pretrain.config import ModelConfig, TrainConfig
from pretrain.data import TokenWindows, step_sample_indices, write_token_files
from pretrain.default_corpus import stdlib_documents
from pretrain.export import export_model
from pretrain.hardware import measure_matmul_flops
from pretrain.model import GPT, lm_loss
from pretrain.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer


# ---------------------------------------------------------------- data

def training_texts(documents: Iterable[Document]) -> Iterator[str]:
    for doc in documents:
        yield f"{doc.title}\n{doc.text}" if doc.title else doc.text


def prepare_data(ws: Workspace, data_paths: list[Path], text_field: str | None, cfg: TrainConfig) -> dict:
    """Train the tokenizer and write the token files; returns the data section of the manifest."""
    if data_paths:
        documents = list(read_documents(data_paths, text_field))
        sources = [str(p) for p in data_paths]
    else:
        documents = list(stdlib_documents())
        sources = ["<python standard library docstrings>"]
        info(f"no --data given: training on the built-in corpus of Python standard library docstrings ({len(documents)} modules)")
    info(f"training a {cfg.vocab_size}-token byte-level BPE tokenizer on {len(documents)} documents")
    tokenizer = train_tokenizer(training_texts(documents), cfg.vocab_size)
    save_tokenizer(tokenizer, ws.tokenizer_dir)
    meta = write_token_files(training_texts(documents), tokenizer, ws.data_dir, cfg.val_fraction, cfg.seq_len)
    info(f"tokenized: {meta['train_tokens']:,} training and {meta['val_tokens']:,} validation tokens")
    ws.update_manifest("tokenizer", {
        "path": "tokenizer", "sha256": file_sha256(ws.tokenizer_dir / "tokenizer.json"),
        "vocab_size": tokenizer.get_vocab_size(), "sources": sources, "documents": len(documents), **meta,
    })
    return meta


# ---------------------------------------------------------------- optimisation

def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not biases, LayerNorms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def lr_multiplier(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio of the peak."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- checkpoints

def checkpoint_dirs(ws: Workspace) -> list[Path]:
    if not ws.checkpoints_dir.exists():
        return []
    return sorted(p for p in ws.checkpoints_dir.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))


def save_checkpoint(ws: Workspace, step: int, model, optimizer, scheduler, cfg: TrainConfig, keep: int = 2) -> Path:
    """Save model, optimizer, scheduler and RNG state with torch.distributed.checkpoint.

    Written to step_N.tmp and renamed when complete, so a crash never leaves a half checkpoint
    that --resume would pick up.
    """
    final = ws.checkpoints_dir / f"step_{step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    train_state = {
        "step": step,  # optimizer steps done = index of the next batch: the data position
        "scheduler": scheduler.state_dict(),
        "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "config": asdict(cfg),
    }
    atomic_write_json(tmp / "train_state.json", train_state)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in checkpoint_dirs(ws)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler) -> int:
    """Restore everything save_checkpoint wrote; returns the step to continue from."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    train_state = json.loads((path / "train_state.json").read_text())
    scheduler.load_state_dict(train_state["scheduler"])
    rng = torch.frombuffer(bytearray(base64.b64decode(train_state["torch_rng"])), dtype=torch.uint8)
    torch.set_rng_state(rng)
    return train_state["step"]


def config_from_checkpoint(path: Path) -> TrainConfig:
    raw = json.loads((path / "train_state.json").read_text())["config"]
    model = ModelConfig(**raw.pop("model"))
    return TrainConfig(**raw, model=model)


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


# ---------------------------------------------------------------- the loop

@torch.no_grad()
def evaluate(model, val: TokenWindows, cfg: TrainConfig) -> float:
    model.eval()
    n = min(len(val), cfg.eval_batches * cfg.micro_batch_size)
    losses = []
    for start in range(0, n, cfg.micro_batch_size):
        x, y = val.batch(range(start, min(n, start + cfg.micro_batch_size)))
        losses.append(lm_loss(model(x), y).item())
    model.train()
    return sum(losses) / len(losses)


def train(ws: Workspace, cfg: TrainConfig, resume_from: Path | None = None) -> dict:
    """Run (or continue) training; export the final model. Returns a summary."""
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model)
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, cfg))
    start_step = 0
    if resume_from is not None:
        start_step = load_checkpoint(resume_from, model, optimizer, scheduler)
        info(f"resumed from {resume_from} at step {start_step}")
    else:
        shutil.rmtree(ws.checkpoints_dir, ignore_errors=True)

    train_windows = TokenWindows.open(ws.data_dir, "train", cfg.seq_len)
    val_windows = TokenWindows.open(ws.data_dir, "val", cfg.seq_len)
    if cfg.batch_size % cfg.grad_accum:
        raise PipelineError(f"--batch-size {cfg.batch_size} is not divisible by --grad-accum {cfg.grad_accum}")
    metrics = MetricsLog(ws.metrics_path, start_step if resume_from else None)
    peak_flops = measure_matmul_flops()
    flops_per_token = model.flops_per_token(cfg.seq_len)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    info(f"model: {model.num_params() / 1e6:.2f}M parameters, {cfg.model.n_layer} layers, d={cfg.model.n_embd}; "
         f"{cfg.max_steps} steps of {tokens_per_step:,} tokens; {len(train_windows):,} training windows")

    model.train()
    loss_value, val_loss = float("nan"), None
    run_start = last_log = time.perf_counter()
    steps_since_log = 0
    for step in range(start_step, cfg.max_steps):
        indices = step_sample_indices(step, cfg.batch_size, len(train_windows), cfg.seed)
        x, y = train_windows.batch(indices)
        loss_sum = 0.0
        for micro_x, micro_y in zip(x.chunk(cfg.grad_accum), y.chunk(cfg.grad_accum)):
            loss = lm_loss(model(micro_x), micro_y) / cfg.grad_accum
            loss.backward()
            loss_sum += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss_sum
        steps_since_log += 1
        done = step + 1

        if done % cfg.log_every == 0 or done == cfg.max_steps:
            now = time.perf_counter()
            tokens_per_s = steps_since_log * tokens_per_step / (now - last_log)
            eta = (cfg.max_steps - done) * tokens_per_step / tokens_per_s
            record = {"event": "train", "step": done, "loss": loss_value, "lr": scheduler.get_last_lr()[0],
                      "grad_norm": grad_norm, "tokens_per_s": tokens_per_s, "mfu": tokens_per_s * flops_per_token / peak_flops,
                      "peak_rss_mb": peak_rss_mb(), "tokens_seen": done * tokens_per_step, "elapsed_s": now - run_start}
            metrics.write(record)
            info(f"step {done}/{cfg.max_steps}  loss {loss_value:.4f}  lr {record['lr']:.2e}  "
                 f"{tokens_per_s:,.0f} tok/s  mfu {record['mfu']:.1%}  eta {format_eta(eta)}")
            last_log, steps_since_log = now, 0
        if done % cfg.eval_every == 0 or done == cfg.max_steps:
            val_loss = evaluate(model, val_windows, cfg)
            metrics.write({"event": "val", "step": done, "val_loss": val_loss, "val_ppl": math.exp(val_loss)})
            info(f"step {done}: validation loss {val_loss:.4f}, perplexity {math.exp(val_loss):.1f}")
        if done % cfg.checkpoint_every == 0 or done == cfg.max_steps:
            save_checkpoint(ws, done, model, optimizer, scheduler, cfg)

    tokenizer = load_tokenizer(ws.tokenizer_dir)
    export_model(model.state_dict(), cfg.model, tokenizer, ws.model_dir)
    summary = {"path": "model", "fingerprint": model_fingerprint(ws.model_dir), "preset": cfg.preset,
               "steps": cfg.max_steps, "final_loss": loss_value, "final_val_loss": val_loss,
               "parameters": model.num_params(), "config": asdict(cfg.model)}
    ws.update_manifest("model", summary)
    info(f"exported the model to {ws.model_dir}")
    return summary
