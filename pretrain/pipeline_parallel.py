"""Pipeline parallelism: the model split into stages, and torch.distributed.pipelining's schedules.

Each pipeline rank runs one stage (GPipe, 1F1B) or several (interleaved 1F1B, looped BFS, zero bubble,
and ZBV's V shape), each a copy of the GPT keeping only its layers; a PipelineStage wraps each and the
schedule runs the microbatches through them.

Tied embeddings: the first stage holds tok_emb.weight and the last stage holds lm_head.weight, two
copies of one parameter. After each backward their gradients are summed (sync_tied_embeddings), so
both copies take identical optimizer steps, as in Megatron.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from pretrain.config import SINGLE_STAGE_SCHEDULES, ParallelConfig, stage_layers
from pretrain.mesh import Parallel


def stage_ids(config: ParallelConfig, pp_rank: int) -> list[int]:
    """The stages this pipeline rank runs: rank r takes r, r + pp, ... (looped), or r and 2pp-1-r (a V, for zbv)."""
    if config.pp_schedule == "zbv":
        return [pp_rank, 2 * config.pp - 1 - pp_rank]
    return [pp_rank + k * config.pp for k in range(config.n_stages_per_rank)]


def split_stage(model: nn.Module, config: ParallelConfig, stage: int) -> nn.Module:
    """A copy of the model that keeps only the stage's layers (and the embeddings on the first stage,
    the final LayerNorm and head on the last). Parameter names are unchanged, so checkpoints do not
    depend on the plan."""
    layers = stage_layers(config, len(model.layers))
    first = sum(layers[:stage])
    module = copy.deepcopy(model)
    for i in list(module.layers.keys()):
        if not first <= int(i) < first + layers[stage]:
            del module.layers[i]
    if stage > 0:
        module.tok_emb = module.pos_emb = None
    if stage < config.num_stages - 1:
        module.ln_f = module.lm_head = None
    return module


class TimedStage:
    """Mixin for PipelineStage: when `timing` is set, adds up the seconds spent computing forward and
    backward chunks (the rest of a schedule step is communication or waiting: the bubble)."""

    timing = False
    busy_s = 0.0

    def _timed(self, fn, *args, **kwargs):
        if not self.timing:
            return fn(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.busy_s += time.perf_counter() - start

    def forward_one_chunk(self, *args, **kwargs):
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args, **kwargs):
        return self._timed(super().backward_one_chunk, *args, **kwargs)

    def backward_weight_one_chunk(self, *args, **kwargs):
        return self._timed(super().backward_weight_one_chunk, *args, **kwargs)

    # torch 2.13: in eval(), V-shaped schedules (zbv) still hand input gradients between the two
    # stages of a rank, and PipelineStage asserts. Without backward there is nothing to hand over.
    def get_local_bwd_output(self, mb_index):
        return super().get_local_bwd_output(mb_index) if self.has_backward else ()

    def set_local_bwd_input(self, next_stage_bwd_outputs, mb_index):
        if self.has_backward:
            super().set_local_bwd_input(next_stage_bwd_outputs, mb_index)


def build_schedule(stage_modules: list[tuple[int, nn.Module]], par: Parallel, loss_fn):
    """Wrap each stage module in a PipelineStage and build the chosen schedule over them."""
    from torch.distributed.pipelining import PipelineStage, schedules

    config = par.config
    stage_cls = type("TimedPipelineStage", (TimedStage, PipelineStage), {})
    stages = [
        stage_cls(module, index, config.num_stages, par.device, group=par.pp_group()) for index, module in stage_modules
    ]
    schedule_cls = {
        "gpipe": schedules.ScheduleGPipe,
        "1f1b": schedules.Schedule1F1B,
        "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
        "looped-bfs": schedules.ScheduleLoopedBFS,
        "zero-bubble": schedules.ScheduleInterleavedZeroBubble,
        "zbv": schedules.ScheduleZBVZeroBubble,
    }[config.pp_schedule]
    # scale_grads: each microbatch loss is a mean, so the summed gradients are divided by the count.
    if config.pp_schedule in SINGLE_STAGE_SCHEDULES:
        return schedule_cls(stages[0], n_microbatches=config.n_microbatches, loss_fn=loss_fn, scale_grads=True), stages
    return schedule_cls(stages, n_microbatches=config.n_microbatches, loss_fn=loss_fn, scale_grads=True), stages


def tied_embedding_group(par: Parallel):
    """The ranks holding the first and the last stage (same dp/tp coordinates): they sum the
    gradients of the tied embedding/head. None where one rank holds both (zbv) or there is no PP."""
    config = par.config
    if config.pp == 1:
        return None
    first_rank = 0  # stage 0 is on pipeline rank 0; the last stage on rank pp - 1, or 0 in a V
    last_rank = 0 if config.pp_schedule == "zbv" else (config.num_stages - 1) % config.pp
    if first_rank == last_rank:
        return None
    if config.pp == 2:
        return par.pp_group()
    pp_dim = par.mesh.mesh_dim_names.index("pp")
    rows = par.mesh.mesh.movedim(pp_dim, -1).reshape(-1, config.pp)
    mine = None
    for row in rows.tolist():  # every rank creates every group, in the same order
        group = dist.new_group([row[first_rank], row[last_rank]])
        if par.rank in (row[first_rank], row[last_rank]):
            mine = group
    return mine


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def sync_tied_embeddings(parts: list[nn.Module], tie_group) -> None:
    """Sum the gradients of the copies of the tied embedding/head weight held by this rank's stages
    and, over `tie_group`, by the rank holding the other end of the pipeline."""
    copies = []
    for part in parts:
        for module in (part.tok_emb, part.lm_head):
            if module is not None and module.weight.grad is not None and all(module.weight is not c for c in copies):
                copies.append(module.weight)
    if not copies:
        return
    total = _local(copies[0].grad).clone()
    for other in copies[1:]:
        total += _local(other.grad)
    if tie_group is not None:
        dist.all_reduce(total, group=tie_group)
    for c in copies:
        _local(c.grad).copy_(total)
