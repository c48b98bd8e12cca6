"""Parallel training plans: one DeviceMesh, and one small function per parallelism.

A plan (ParallelConfig) gives the degree of each mesh dimension; outermost first they are

    pp            pipeline stages          torch.distributed.pipelining (PipelineStage + a schedule)
    dp_replicate  data-parallel replicas   DDP alone, or the replicate dimension of HSDP
    dp_shard      data-parallel shards     FSDP2 fully_shard
    tp            tensor-parallel shards   DTensor parallelize_module, Megatron-style

so tensor-parallel ranks are neighbours (same host) and pipeline stages are furthest apart.
build_mesh() is the only place that builds the mesh. parallelize() applies, to the same GPT:
pipeline split -> apply_tp -> apply_ac -> apply_compile -> apply_fsdp / apply_ddp, as torchtitan
does. Every function is a no-op when its degree is 1, so one process is the same code path.

Tied embeddings under pipeline parallelism: the first stage holds tok_emb.weight and the last
stage holds lm_head.weight, two copies of one parameter. After each backward their gradients are
summed (sync_tied_embeddings), so both copies take identical optimizer steps, as in Megatron.
"""
from __future__ import annotations

import copy
import os
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from common.errors import PipelineError
from pretrain.config import ModelConfig, TrainConfig
from pretrain.model import lm_loss

STRATEGIES = ("single", "ddp", "fsdp", "tp", "pp", "hybrid")
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")
MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv")
SCHEDULES = SINGLE_STAGE_SCHEDULES + MULTI_STAGE_SCHEDULES


@dataclass
class ParallelConfig:
    strategy: str = "single"
    dp_replicate: int = 1  # DDP degree, or the replicate degree of HSDP
    dp_shard: int = 1  # FSDP degree (the data-parallel degree in combinations)
    tp: int = 1
    pp: int = 1
    pp_schedule: str = "1f1b"
    microbatches: int = 0  # per data-parallel rank and step; 0 = one per pipeline stage
    stages_per_rank: int = 0  # 0 = 1 for gpipe/1f1b, 2 for the multi-stage schedules
    pp_split: list[int] | None = None  # layers per stage; None = as even as possible
    # Speed and memory features meant for GPUs (they also run on CPU, where they are off by default).
    bf16: bool = False  # bf16 autocast
    compile: bool = False  # torch.compile each block
    ac: bool = False  # activation checkpointing of each block
    fused_adamw: bool = False  # fused AdamW kernel
    timeout_s: float = 300.0  # process-group timeout: a lost peer fails the job instead of hanging it

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def uses_ddp(self) -> bool:
        return self.strategy == "ddp" and self.dp_replicate > 1

    @property
    def uses_fsdp(self) -> bool:
        return self.dp_shard > 1

    @property
    def n_stages_per_rank(self) -> int:
        if self.stages_per_rank:
            return self.stages_per_rank
        return 2 if self.pp_schedule in MULTI_STAGE_SCHEDULES else 1

    @property
    def num_stages(self) -> int:
        return self.pp * self.n_stages_per_rank if self.pp > 1 else 1

    @property
    def n_microbatches(self) -> int:
        return self.microbatches or self.pp

    @classmethod
    def resolve(cls, strategy: str | None, world_size: int, dp: int | None = None, dp_replicate: int | None = None,
                dp_shard: int | None = None, tp: int | None = None, pp: int | None = None, **options) -> "ParallelConfig":
        """Turn the user's --strategy and degrees into a complete plan for `world_size` processes."""
        given = {k: v for k, v in dict(dp=dp, dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, pp=pp).items() if v is not None}
        for name, value in given.items():
            if value < 1:
                raise PipelineError(f"--{name.replace('_', '-')} must be positive, got {value}")
        if dp is not None and (dp_replicate is not None or dp_shard is not None):
            raise PipelineError("give either --dp or --dp-replicate/--dp-shard, not both")
        if strategy is None:
            strategy = _infer_strategy(world_size, {k for k, v in given.items() if v > 1})
        if strategy not in STRATEGIES:
            raise PipelineError(f"--strategy: unknown strategy '{strategy}' (choose from {', '.join(STRATEGIES)})")
        own = {"single": set(), "ddp": {"dp", "dp_replicate"}, "fsdp": {"dp", "dp_replicate", "dp_shard"}, "tp": {"tp"},
               "pp": {"pp"}, "hybrid": set(given)}[strategy]
        foreign = sorted(k for k, v in given.items() if k not in own and v > 1)
        if foreign:
            raise PipelineError(f"--strategy {strategy} does not take --{foreign[0].replace('_', '-')}; combine dimensions with --strategy hybrid")
        plan = cls(strategy=strategy, **options)
        if strategy == "single":
            pass
        elif strategy == "ddp":
            plan.dp_replicate = dp or dp_replicate or world_size
        elif strategy == "fsdp":
            plan.dp_shard = dp or dp_shard or (world_size // (dp_replicate or 1))
            plan.dp_replicate = dp_replicate or 1
        elif strategy == "tp":
            plan.tp = tp or world_size
        elif strategy == "pp":
            plan.pp = pp or world_size
        else:  # hybrid: the data-parallel dimension is FSDP (HSDP with --dp-replicate and --dp-shard)
            plan.tp, plan.pp = tp or 1, pp or 1
            plan.dp_replicate = dp_replicate or 1
            plan.dp_shard = dp or dp_shard or world_size // (plan.tp * plan.pp * plan.dp_replicate) or 1
        if strategy != "ddp" and plan.dp_replicate > 1 and plan.dp_shard == 1:
            raise PipelineError("--dp-replicate needs --dp-shard > 1 as well (HSDP); pure replication is --strategy ddp")
        if plan.world_size != world_size:
            raise PipelineError(f"the plan needs {plan.world_size} processes ({plan.shape()}) but the job has {world_size} "
                                f"(--nproc × --nnodes); make the degrees multiply to {world_size}")
        return plan

    def shape(self) -> str:
        dims = [f"{name}={getattr(self, name)}" for name in MESH_DIMS if getattr(self, name) > 1]
        return " × ".join(dims) or "1 process"

    def validate(self, model: ModelConfig, train: TrainConfig) -> None:
        """Check the plan against the model and batch before any process starts: one clear error each."""
        if self.tp > 1 and model.n_head % self.tp:
            raise PipelineError(f"--tp {self.tp} must divide the number of attention heads ({model.n_head})")
        if train.batch_size % self.dp:
            raise PipelineError(f"--batch-size {train.batch_size} is not divisible by the data-parallel degree {self.dp}")
        local = train.batch_size // self.dp
        if self.pp == 1:
            if self.pp_split or self.microbatches or self.stages_per_rank:
                raise PipelineError("--pp-split, --microbatches and --stages-per-rank need pipeline parallelism (--pp > 1)")
            if local % train.grad_accum:
                raise PipelineError(f"the per-rank batch ({local} sequences) is not divisible by --grad-accum {train.grad_accum}")
            return
        if self.pp_schedule not in SCHEDULES:
            raise PipelineError(f"--pp-schedule: unknown schedule '{self.pp_schedule}' (choose from {', '.join(SCHEDULES)})")
        if train.grad_accum != 1:
            raise PipelineError("--grad-accum does not combine with pipeline parallelism; use --microbatches")
        if self.pp_schedule in SINGLE_STAGE_SCHEDULES and self.n_stages_per_rank != 1:
            raise PipelineError(f"--pp-schedule {self.pp_schedule} runs one stage per rank; use interleaved-1f1b, looped-bfs, zero-bubble or zbv for --stages-per-rank {self.n_stages_per_rank}")
        if self.pp_schedule == "zbv" and self.n_stages_per_rank != 2:
            raise PipelineError("--pp-schedule zbv runs exactly 2 stages per rank (a V shape)")
        m = self.n_microbatches
        if local % m:
            raise PipelineError(f"the per-rank batch ({local} sequences) is not divisible by --microbatches {m}")
        if self.pp_schedule == "1f1b" and m < self.pp:
            raise PipelineError(f"--pp-schedule 1f1b needs at least as many microbatches as stages ({self.pp}), got {m}")
        if self.pp_schedule in MULTI_STAGE_SCHEDULES and m % max(1, m // self.pp):
            raise PipelineError(f"--pp-schedule {self.pp_schedule} needs --microbatches to be a multiple of {max(1, m // self.pp)}")
        stage_layers(self, model.n_layer)  # raises on a bad --pp-split

    def to_dict(self) -> dict:
        return asdict(self)


def _infer_strategy(world_size: int, dims: set[str]) -> str:
    """--strategy left out: the one the degrees name (several dimensions: hybrid; none: ddp on several processes)."""
    data, model = dims & {"dp", "dp_replicate", "dp_shard"}, dims & {"tp", "pp"}
    if len(model) + bool(data) > 1:
        return "hybrid"
    if model:
        return model.pop()
    if "dp_shard" in data:
        return "fsdp"
    return "ddp" if data or world_size > 1 else "single"


# ---------------------------------------------------------------- the mesh

@dataclass
class Parallel:
    """A plan in a running job: the mesh and this rank's place in it."""
    config: ParallelConfig
    mesh: DeviceMesh | None
    device: torch.device
    rank: int = 0
    world_size: int = 1
    coords: dict[str, int] = field(default_factory=dict)

    def coord(self, dim: str) -> int:
        return self.coords.get(dim, 0)

    @property
    def dp_rank(self) -> int:
        return self.coord("dp_replicate") * self.config.dp_shard + self.coord("dp_shard")

    @property
    def pp_rank(self) -> int:
        return self.coord("pp")

    def submesh(self, *dims: str) -> DeviceMesh:
        return self.mesh[dims if len(dims) > 1 else dims[0]]

    def pp_group(self):
        return self.submesh("pp").get_group() if self.config.pp > 1 else None


def init_distributed(config: ParallelConfig) -> tuple[int, int, torch.device]:
    """Join the job's process group (started by torchrun); returns (rank, world size, device)."""
    cuda = torch.cuda.is_available()
    if config.world_size == 1 and not dist.is_initialized():
        return 0, 1, torch.device("cuda" if cuda else "cpu")
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise PipelineError(f"a plan of {config.world_size} processes must be started with torchrun (pipeline pretrain --nproc N)")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        # NCCL for GPU tensors, gloo for CPU ones (and for everything on a CPU-only machine).
        dist.init_process_group("cuda:nccl,cpu:gloo" if cuda else "gloo", timeout=timedelta(seconds=config.timeout_s))
    if dist.get_world_size() != config.world_size:
        raise PipelineError(f"the plan needs {config.world_size} processes ({config.shape()}), the job has {dist.get_world_size()}")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def build_mesh(config: ParallelConfig) -> Parallel:
    """The one place that builds the DeviceMesh: dimensions of degree 1 are left out."""
    rank, world_size, device = init_distributed(config)
    dims = [(name, getattr(config, name)) for name in MESH_DIMS if getattr(config, name) > 1]
    if not dims:
        return Parallel(config, None, device, rank, world_size)
    mesh = init_device_mesh(device.type, tuple(size for _, size in dims), mesh_dim_names=tuple(name for name, _ in dims))
    coords = {name: mesh[name].get_local_rank() for name, _ in dims}
    return Parallel(config, mesh, device, rank, world_size, coords)


# ---------------------------------------------------------------- one function per parallelism

def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron-style tensor parallelism inside every block.

    q/k/v and fc_in are split by output columns (each rank computes n_head / tp heads and a slice of
    the MLP), out_proj and fc_out by input rows, whose partial outputs are summed by an all-reduce.
    Embeddings, LayerNorms and the head stay replicated.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
            "attn.out_proj": RowwiseParallel(), "mlp.fc_in": ColwiseParallel(), "mlp.fc_out": RowwiseParallel()}
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


# ---------------------------------------------------------------- pipeline parallelism

def stage_layers(config: ParallelConfig, n_layer: int) -> list[int]:
    """Layers per pipeline stage: --pp-split, or as even as possible (earlier stages take the remainder:
    the last one also holds the head)."""
    n = config.num_stages
    if config.pp_split:
        split = list(config.pp_split)
        if len(split) != n:
            raise PipelineError(f"--pp-split has {len(split)} entries but there are {n} stages (--pp × --stages-per-rank)")
        if sum(split) != n_layer or min(split) < 1:
            raise PipelineError(f"--pp-split {','.join(map(str, split))} must give each stage at least one layer and sum to {n_layer} layers")
        return split
    if n_layer < n:
        raise PipelineError(f"{n} pipeline stages need at least {n} layers, the model has {n_layer}")
    base, extra = divmod(n_layer, n)
    return [base + (1 if s < extra else 0) for s in range(n)]


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
    stages = [stage_cls(module, index, config.num_stages, par.device, group=par.pp_group()) for index, module in stage_modules]
    schedule_cls = {
        "gpipe": schedules.ScheduleGPipe, "1f1b": schedules.Schedule1F1B,
        "interleaved-1f1b": schedules.ScheduleInterleaved1F1B, "looped-bfs": schedules.ScheduleLoopedBFS,
        "zero-bubble": schedules.ScheduleInterleavedZeroBubble, "zbv": schedules.ScheduleZBVZeroBubble,
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
        with torch.autocast(self.par.device.type, dtype=torch.bfloat16, enabled=self.par.config.bf16):
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                start = time.perf_counter()
                # Only the losses are used: returning outputs would keep every microbatch's logits until the step ends.
                self.schedule.step(*([x] if self.has_first else []), target=y, losses=losses, return_outputs=False)
                self.pipeline_s = time.perf_counter() - start
                local = torch.stack(losses).mean().detach() if self.has_last else torch.zeros((), device=self.par.device)
            else:
                model = self.parts[0]
                local = torch.zeros((), device=self.par.device)
                for i, (mx, my) in enumerate(zip(x.chunk(grad_accum), y.chunk(grad_accum))):
                    sync = i == grad_accum - 1 or not hasattr(model, "no_sync")  # DDP: all-reduce once per step
                    with nullcontext() if sync else model.no_sync():
                        loss = self.loss_fn(model(mx), my) / grad_accum
                        loss.backward()
                    local += loss.detach()
        sync_tied_embeddings(self)
        return local

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor, chunks: int) -> torch.Tensor:
        with torch.autocast(self.par.device.type, dtype=torch.bfloat16, enabled=self.par.config.bf16):
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


def parallelize(model: nn.Module, par: Parallel, loss_fn) -> ParallelModel:
    """Apply the plan to a freshly initialised full model (identical on every rank)."""
    config = par.config
    model.to(par.device)
    if config.pp > 1:
        stage_modules = [(s, split_stage(model, config, s)) for s in stage_ids(config, par.pp_rank)]
    else:
        stage_modules = [(0, model)]
    parts = []
    for _, module in stage_modules:
        if config.tp > 1:
            apply_tp(module, par.submesh("tp"))
        if config.ac:
            apply_ac(module)
        if config.compile:
            apply_compile(module)
        if config.uses_fsdp:
            dp_mesh = par.submesh("dp_replicate", "dp_shard") if config.dp_replicate > 1 else par.submesh("dp_shard")
            apply_fsdp(module, dp_mesh, reshard_after_forward=config.pp == 1)
        elif config.uses_ddp:
            module = apply_ddp(module, par.submesh("dp_replicate"))
        parts.append(module)
    if config.pp == 1:
        return ParallelModel(par, parts, loss_fn=loss_fn)
    schedule, stages = build_schedule(list(zip([s for s, _ in stage_modules], parts)), par, loss_fn)
    return ParallelModel(par, parts, schedule, stages,
                         has_first=any(s.is_first for s in stages), has_last=any(s.is_last for s in stages),
                         tie_group=tied_embedding_group(par), loss_fn=loss_fn)


# ---------------------------------------------------------------- gradients

def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def sync_tied_embeddings(pm: ParallelModel) -> None:
    """Sum the gradients of the copies of the tied embedding/head weight held by different stages."""
    if pm.schedule is None:
        return
    copies = []
    for part in pm.modules():
        for module in (part.tok_emb, part.lm_head):
            if module is not None and module.weight.grad is not None and all(module.weight is not c for c in copies):
                copies.append(module.weight)
    if not copies:
        return
    total = _local(copies[0].grad).clone()
    for other in copies[1:]:
        total += _local(other.grad)
    if pm.tie_group is not None:
        dist.all_reduce(total, group=pm.tie_group)
    for c in copies:
        _local(c.grad).copy_(total)


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
def clip_grad_norm(pm: ParallelModel, max_norm: float) -> float:
    """Clip by the norm of the whole model's gradient, whatever the plan.

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
    coef = max_norm / (total.item() + 1e-6)
    if coef < 1.0:
        for p in _all_params(pm):
            if p.grad is not None:
                p.grad.mul_(coef)
    return total.item()


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
        held.append(f"tp {r}/{plan.tp}: attention heads {r * heads}-{(r + 1) * heads - 1}, MLP units {r * hidden}-{(r + 1) * hidden - 1}")
    if plan.uses_fsdp:
        group = f" in replica group {par.coord('dp_replicate')}/{plan.dp_replicate}" if plan.dp_replicate > 1 else ""
        held.append(f"FSDP shard {par.coord('dp_shard')}/{plan.dp_shard} of each parameter{group}")
    elif plan.uses_ddp:
        held.append(f"DDP replica {par.coord('dp_replicate')}/{plan.dp_replicate}")
    local = cfg.batch_size // plan.dp
    held.append(f"batch rows {par.dp_rank * local}-{(par.dp_rank + 1) * local - 1}")
    return f"rank {par.rank}: " + "; ".join(held)
