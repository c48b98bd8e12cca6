"""Parallel training plans: one small function per parallelism, applied to the same GPT.

parallelize() applies, as torchtitan does: the pipeline split (pretrain/pipeline_parallel.py) -> apply_tp ->
apply_ac -> apply_compile -> apply_fsdp / apply_ddp, over the mesh of pretrain/mesh.py. Every function
is a no-op when its degree is 1, so one process is the same code path. The result, a ParallelModel,
is all the training loop talks to: forward and backward of this rank's slice of the batch, the loss
over the data-parallel ranks, gradient clipping over the whole model.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from common.console import info
from pretrain.config import ParallelConfig, RuntimeOptions, TrainConfig, stage_layers
from pretrain.mesh import Parallel
from pretrain.model import lm_loss
from pretrain.pipeline_parallel import (
    build_schedule,
    split_stage,
    stage_ids,
    sync_tied_embeddings,
    tied_embedding_group,
)

# ---------------------------------------------------------------- one function per parallelism


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron-style tensor parallelism inside every block.

    q/k/v and fc_in are split by output columns (each rank computes n_head / tp heads and a slice of
    the MLP), out_proj and fc_out by input rows, whose partial outputs are summed by an all-reduce.
    Embeddings, LayerNorms and the head stay replicated.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {
        "attn.q_proj": ColwiseParallel(),
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.out_proj": RowwiseParallel(),
        "mlp.fc_in": ColwiseParallel(),
        "mlp.fc_out": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)


def apply_ac(model: nn.Module) -> None:
    """Activation checkpointing: each block keeps only its input and recomputes the rest in backward."""
    for block in model.layers.values():
        block.checkpoint_activations = True


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block in place (names, and so checkpoints, are unchanged)."""
    for block in model.layers.values():
        block.compile()


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool = True) -> None:
    """FSDP2: shard every block, then the root (embeddings, final LayerNorm, head), over the data-parallel mesh.

    A 2-D mesh (dp_replicate, dp_shard) gives HSDP: sharded within a group, replicated across groups.
    """
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    """Plain data parallelism: every rank holds the whole model; gradients are averaged in backward.
    The gradients are views into DDP's communication buckets, not a second copy of them."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), gradient_as_bucket_view=True)


# ---------------------------------------------------------------- the parallel model


@dataclass
class ParallelModel:
    """What the training loop needs from a parallelized GPT on one rank."""

    par: Parallel
    parts: list[nn.Module]  # one per pipeline stage on this rank; the whole (wrapped) model without PP
    schedule: object | None = None
    stages: list = field(default_factory=list)
    has_first: bool = True
    has_last: bool = True
    tie_group: object | None = None
    pipeline_s: float = 0.0  # seconds of the last schedule step
    loss_fn: object = lm_loss  # (logits, targets) -> mean loss
    bf16: bool = False  # bf16 autocast (RuntimeOptions.bf16)

    @classmethod
    def single(cls, model: nn.Module) -> "ParallelModel":
        """A model in one process, without a plan."""
        return cls(Parallel(ParallelConfig(), None, next(model.parameters()).device), [model])

    def modules(self) -> list[nn.Module]:
        """The model parts with DDP's wrapper removed (for state dicts and inspection)."""
        return [getattr(p, "module", p) for p in self.parts]

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, grad_accum: int) -> torch.Tensor:
        """Loss and gradients of this rank's slice of the batch; returns the mean loss (0 on pipeline
        ranks without the last stage)."""
        with torch.autocast(self.par.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                start = time.perf_counter()
                # Only the losses are used: returning outputs would keep every microbatch's logits until the step ends.
                self.schedule.step(*([x] if self.has_first else []), target=y, losses=losses, return_outputs=False)
                self.pipeline_s = time.perf_counter() - start
                local = (
                    torch.stack(losses).mean().detach() if self.has_last else torch.zeros((), device=self.par.device)
                )
            else:
                model = self.parts[0]
                local = torch.zeros((), device=self.par.device)
                for i, (mx, my) in enumerate(zip(x.chunk(grad_accum), y.chunk(grad_accum))):
                    sync = i == grad_accum - 1 or not hasattr(model, "no_sync")  # DDP: all-reduce once per step
                    with nullcontext() if sync else model.no_sync():
                        loss = self.loss_fn(model(mx), my) / grad_accum
                        loss.backward()
                    local += loss.detach()
        if self.schedule is not None:
            sync_tied_embeddings(self.modules(), self.tie_group)
        return local

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor, chunks: int) -> torch.Tensor:
        with torch.autocast(self.par.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                self.schedule.eval(*([x] if self.has_first else []), target=y, losses=losses)
                return torch.stack(losses).mean().float() if self.has_last else torch.zeros((), device=self.par.device)
            model = self.parts[0]
            return torch.stack([self.loss_fn(model(mx), my) for mx, my in zip(x.chunk(chunks), y.chunk(chunks))]).mean()

    def global_mean(self, local: torch.Tensor) -> float:
        """The mean over data-parallel ranks of a per-rank loss (held by every tp rank of the last stage)."""
        if self.par.world_size == 1:
            return local.item()
        total = local.detach().float().reshape(1).clone()
        dist.all_reduce(total)
        return total.item() / (self.par.config.dp * self.par.config.tp)

    def set_timing(self, on: bool) -> None:
        for stage in self.stages:
            stage.timing, stage.busy_s = on, 0.0

    def bubble_fraction(self) -> float:
        """Share of the last schedule step this rank spent not computing its stages (measured when timing)."""
        if not self.stages or self.pipeline_s <= 0:
            return 0.0
        if self.par.device.type == "cuda":
            torch.cuda.synchronize(self.par.device)
        return max(0.0, 1 - sum(stage.busy_s for stage in self.stages) / self.pipeline_s)


def parallelize(model: nn.Module, par: Parallel, loss_fn, options: RuntimeOptions | None = None) -> ParallelModel:
    """Apply the plan to a freshly initialised full model (identical on every rank)."""
    config, options = par.config, options or RuntimeOptions()
    model.to(par.device)
    if config.pp > 1:
        stage_modules = [(s, split_stage(model, config, s)) for s in stage_ids(config, par.pp_rank)]
    else:
        stage_modules = [(0, model)]
    if options.compile and config.tp == 1:
        # The loss too: unfused, its float32 upcast, log-softmax and their backward move several times the
        # logits' bytes, which on a GPU is memory-bound time; under TP the logits are DTensors, left eager.
        loss_fn = torch.compile(loss_fn)
    parts = []
    for _, module in stage_modules:
        if config.tp > 1:
            apply_tp(module, par.submesh("tp"))
        if options.ac:
            apply_ac(module)
        if options.compile:
            apply_compile(module)
        if config.uses_fsdp:
            dp_mesh = par.submesh("dp_replicate", "dp_shard") if config.dp_replicate > 1 else par.submesh("dp_shard")
            apply_fsdp(module, dp_mesh, reshard_after_forward=config.pp == 1)
        elif config.uses_ddp:
            module = apply_ddp(module, par.submesh("dp_replicate"))
        parts.append(module)
    if config.pp == 1:
        return ParallelModel(par, parts, loss_fn=loss_fn, bf16=options.bf16)
    schedule, stages = build_schedule(list(zip([s for s, _ in stage_modules], parts)), par, loss_fn)
    return ParallelModel(
        par,
        parts,
        schedule,
        stages,
        has_first=any(s.is_first for s in stages),
        has_last=any(s.is_last for s in stages),
        tie_group=tied_embedding_group(par),
        loss_fn=loss_fn,
        bf16=options.bf16,
    )


# ---------------------------------------------------------------- gradients


def grad_norm_params(pm: ParallelModel) -> list[torch.Tensor]:
    """Parameters counted in the global gradient norm: each tied copy is counted once (on the first stage)."""
    params, seen = [], set()
    for part in pm.modules():
        for name, p in part.named_parameters():
            if id(p) in seen or p.grad is None:
                continue
            seen.add(id(p))
            if name == "lm_head.weight" and getattr(part, "tok_emb", None) is None and pm.schedule is not None:
                continue
            params.append(p)
    return params


@torch.no_grad()
def clip_grad_norm(pm: ParallelModel, max_norm: float) -> torch.Tensor:
    """Clip by the norm of the whole model's gradient, whatever the plan; returns the norm before clipping (a
    tensor on the device).

    DTensor gradients (FSDP shards, TP shards) are reduced to their full norm over their mesh;
    pipeline stages then add their squared norms over the pp group.
    """
    params = grad_norm_params(pm)
    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        g = p.grad
        groups[(g.device_mesh, g.placements) if isinstance(g, DTensor) else None].append(g)
    squared = torch.zeros((), device=pm.par.device, dtype=torch.float32)
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squared += norm.float() ** 2
    if pm.par.config.pp > 1:
        dist.all_reduce(squared, group=pm.par.pp_group())
    total = squared.sqrt()
    # Scaled by min(1, coef) on the device, as torch's clip_grad_norm_ does: reading the norm back here would
    # make the host wait for the backward pass before it can queue the optimizer step.
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    grads = [p.grad for p in _all_params(pm) if p.grad is not None]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    if plain:
        torch._foreach_mul_(plain, coef)  # one launch for all of them
    for g in grads:
        if isinstance(g, DTensor):
            g.mul_(coef)
    return total


def _all_params(pm: ParallelModel) -> list[torch.Tensor]:
    params, seen = [], set()
    for part in pm.parts:
        for p in part.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def describe_rank(pm: ParallelModel, cfg: TrainConfig) -> str:
    """One line: what this rank holds (layers, shards) and which rows of the batch it trains on."""
    par, plan, n_layer = pm.par, pm.par.config, cfg.model.n_layer
    held = []
    if plan.pp > 1:
        layers = stage_layers(plan, n_layer)
        for s in stage_ids(plan, par.pp_rank):
            first = sum(layers[:s])
            extras = (["embeddings"] if s == 0 else []) + (["ln_f + head"] if s == plan.num_stages - 1 else [])
            span = f"layer {first}" if layers[s] == 1 else f"layers {first}-{first + layers[s] - 1}"
            held.append(f"stage {s} = {span}" + "".join(f" + {e}" for e in extras))
    else:
        held.append(f"layers 0-{n_layer - 1} + embeddings + ln_f + head")
    if plan.tp > 1:
        r, heads, hidden = par.coord("tp"), cfg.model.n_head // plan.tp, 4 * cfg.model.n_embd // plan.tp
        held.append(
            f"tp {r}/{plan.tp}: attention heads {r * heads}-{(r + 1) * heads - 1}, "
            f"MLP units {r * hidden}-{(r + 1) * hidden - 1}"
        )
    if plan.uses_fsdp:
        group = f" in replica group {par.coord('dp_replicate')}/{plan.dp_replicate}" if plan.dp_replicate > 1 else ""
        held.append(f"FSDP shard {par.coord('dp_shard')}/{plan.dp_shard} of each parameter{group}")
    elif plan.uses_ddp:
        held.append(f"DDP replica {par.coord('dp_replicate')}/{plan.dp_replicate}")
    local = cfg.batch_size // plan.dp
    held.append(f"batch rows {par.dp_rank * local}-{(par.dp_rank + 1) * local - 1}")
    return f"rank {par.rank}: " + "; ".join(held)


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
    info(
        f"plan: {plan.strategy}, {plan.shape()} on {par.world_size} {par.device.type.upper()} process(es) ({backend}); "
        f"global batch {cfg.batch_size} × {cfg.seq_len} tokens"
    )
    if plan.pp > 1:
        local = cfg.batch_size // plan.dp
        info(
            f"pipeline: schedule {plan.pp_schedule}, {plan.num_stages} stages ({plan.n_stages_per_rank} per rank), "
            f"layers per stage {stage_layers(plan, cfg.model.n_layer)}, {plan.n_microbatches} microbatches of "
            f"{local // plan.n_microbatches} sequences per step"
        )
    for line in lines:
        info("  " + line)
