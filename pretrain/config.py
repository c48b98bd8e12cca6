"""Configuration as dataclasses: the model's shape (ModelConfig), the training run (TrainConfig), the
parallel plan's degrees (ParallelConfig) and how each rank runs, whatever the plan (RuntimeOptions).
The CLI, the planner and the workers build them; checkpoints and worker specs store them as dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from common.errors import PipelineError

STRATEGIES = ("single", "ddp", "fsdp", "tp", "pp", "hybrid")
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")  # outermost first: tensor-parallel ranks are neighbours
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")
MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv")
SCHEDULES = SINGLE_STAGE_SCHEDULES + MULTI_STAGE_SCHEDULES


@dataclass(frozen=True)  # hashable: the planner caches a model's profile by it
class ModelConfig:
    vocab_size: int = 8192
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 256  # maximum sequence length (learned position embeddings)
    dropout: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# GPT-2 shapes: small / medium / large are the published 124M / 355M / 774M models
# (with the 50,257-token vocabulary; ours is trained on the user's data and usually smaller).
PRESETS: dict[str, dict] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "small": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
    "medium": dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024),
    "large": dict(n_layer=36, n_head=20, n_embd=1280, block_size=1024),
}

VALIDATIONS_PER_RUN = 20

# Sensible training defaults per preset: the tiny one finishes in a few minutes on 2 CPU cores.
PRESET_TRAINING: dict[str, dict] = {
    "tiny": dict(max_steps=300, seq_len=128, batch_size=16, lr=1e-3, vocab_size=4096),
    "small": dict(max_steps=5000, seq_len=1024, batch_size=64, lr=6e-4, vocab_size=32768),
    "medium": dict(max_steps=5000, seq_len=1024, batch_size=64, lr=3e-4, vocab_size=32768),
    "large": dict(max_steps=5000, seq_len=1024, batch_size=64, lr=2.5e-4, vocab_size=32768),
}


@dataclass
class TrainConfig:
    preset: str = "tiny"
    max_steps: int = 300
    seq_len: int = 128
    batch_size: int = 16  # sequences per optimizer step (global, whatever the parallel plan)
    grad_accum: int = 1  # the batch is split into this many micro-batches
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0  # 0 means 5% of max_steps
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337
    vocab_size: int = 4096
    val_fraction: float = 0.05
    eval_every: int = 0  # 0: about VALIDATIONS_PER_RUN a run (validation_interval)
    eval_batches: int = 8
    patience: int = 5  # validations without a new best before training stops (0: never stops early)
    checkpoint_every: int = 100
    log_every: int = 10
    measure_comm: bool = True  # profile the last step of each log window for its time in communication
    # Sized runs: the seconds the loop's steps were planned to take. The loop times its own first steps and
    # re-plans max_steps to fill them (once; then 0): sizing timed each shape in a moment that may not last.
    step_budget_s: float = 0.0
    max_planned_steps: int = 0  # sized runs: the re-plan's ceiling (MAX_EPOCHS over the corpus); 0: none
    model: ModelConfig = field(default_factory=ModelConfig)

    @property
    def warmup(self) -> int:
        return self.warmup_steps or max(1, self.max_steps // 20)

    @property
    def validation_interval(self) -> int:
        """Steps between validations: as given, else about VALIDATIONS_PER_RUN a run (enough to see the curve
        and stop when it turns), at least every 10 steps apart on a longer run."""
        if self.eval_every:
            return self.eval_every
        return max(min(10, self.max_steps), round(self.max_steps / VALIDATIONS_PER_RUN), 1)


def model_config_for(preset: str, vocab_size: int, seq_len: int, **overrides) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    shape = dict(PRESETS[preset])
    shape["block_size"] = max(shape["block_size"], seq_len)
    shape.update(overrides)
    return ModelConfig(vocab_size=vocab_size, **shape)


def train_config_from_dict(raw: dict) -> TrainConfig:
    """The inverse of dataclasses.asdict(TrainConfig): for checkpoints, worker specs and Ray workers."""
    raw = dict(raw)
    model = ModelConfig(**raw.pop("model"))
    return TrainConfig(**raw, model=model)


# ---------------------------------------------------------------- the parallel plan


@dataclass
class ParallelConfig:
    """The plan's degrees: how the model and each step's batch are split over the job's processes."""

    strategy: str = "single"
    dp_replicate: int = 1  # DDP degree, or the replicate degree of HSDP
    dp_shard: int = 1  # FSDP degree (the data-parallel degree in combinations)
    tp: int = 1
    pp: int = 1
    pp_schedule: str = "1f1b"
    microbatches: int = 0  # per data-parallel rank and step; 0 = one per pipeline stage
    stages_per_rank: int = 0  # 0 = 1 for gpipe/1f1b, 2 for the multi-stage schedules
    pp_split: list[int] | None = None  # layers per stage; None = as even as possible

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
    def resolve(
        cls,
        strategy: str | None,
        world_size: int,
        dp: int | None = None,
        dp_replicate: int | None = None,
        dp_shard: int | None = None,
        tp: int | None = None,
        pp: int | None = None,
        **pipeline,
    ) -> "ParallelConfig":
        """Turn the user's --strategy and degrees into a complete plan for `world_size` processes."""
        given = {
            k: v
            for k, v in dict(dp=dp, dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, pp=pp).items()
            if v is not None
        }
        if dp is not None and (dp_replicate is not None or dp_shard is not None):
            raise PipelineError("give either --dp or --dp-replicate/--dp-shard, not both")
        if strategy is None:
            strategy = _infer_strategy(world_size, {k for k, v in given.items() if v > 1})
        if strategy not in STRATEGIES:
            raise PipelineError(f"--strategy: unknown strategy '{strategy}' (choose from {', '.join(STRATEGIES)})")
        own = {
            "single": set(),
            "ddp": {"dp", "dp_replicate"},
            "fsdp": {"dp", "dp_replicate", "dp_shard"},
            "tp": {"tp"},
            "pp": {"pp"},
            "hybrid": set(given),
        }[strategy]
        foreign = sorted(k for k, v in given.items() if k not in own and v > 1)
        if foreign:
            raise PipelineError(
                f"--strategy {strategy} does not take --{foreign[0].replace('_', '-')}; "
                "combine dimensions with --strategy hybrid"
            )
        plan = cls(strategy=strategy, **pipeline)
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
            raise PipelineError(
                "--dp-replicate needs --dp-shard > 1 as well (HSDP); pure replication is --strategy ddp"
            )
        if plan.world_size != world_size:
            raise PipelineError(
                f"the plan needs {plan.world_size} processes ({plan.shape()}) but the job has {world_size} "
                f"(--nproc × --nnodes); make the degrees multiply to {world_size}"
            )
        return plan

    def shape(self) -> str:
        dims = [f"{name}={getattr(self, name)}" for name in MESH_DIMS if getattr(self, name) > 1]
        return " × ".join(dims) or "1 process"

    def validate(self, model: ModelConfig, train: TrainConfig) -> None:
        """Check the plan against the model and batch before any process starts: one clear error each."""
        if self.tp > 1 and model.n_head % self.tp:
            raise PipelineError(f"--tp {self.tp} must divide the number of attention heads ({model.n_head})")
        if train.batch_size % self.dp:
            raise PipelineError(
                f"--batch-size {train.batch_size} is not divisible by the data-parallel degree {self.dp}"
            )
        local = train.batch_size // self.dp
        if self.pp == 1:
            if self.pp_split or self.microbatches or self.stages_per_rank:
                raise PipelineError(
                    "--pp-split, --microbatches and --stages-per-rank need pipeline parallelism (--pp > 1)"
                )
            if local % train.grad_accum:
                raise PipelineError(
                    f"the per-rank batch ({local} sequences) is not divisible by --grad-accum {train.grad_accum}"
                )
            return
        if self.pp_schedule not in SCHEDULES:
            raise PipelineError(
                f"--pp-schedule: unknown schedule '{self.pp_schedule}' (choose from {', '.join(SCHEDULES)})"
            )
        if train.grad_accum != 1:
            raise PipelineError("--grad-accum does not combine with pipeline parallelism; use --microbatches")
        if self.pp_schedule in SINGLE_STAGE_SCHEDULES and self.n_stages_per_rank != 1:
            raise PipelineError(
                f"--pp-schedule {self.pp_schedule} runs one stage per rank; "
                f"use interleaved-1f1b, looped-bfs, zero-bubble or zbv for --stages-per-rank {self.n_stages_per_rank}"
            )
        if self.pp_schedule == "zbv" and self.n_stages_per_rank != 2:
            raise PipelineError("--pp-schedule zbv runs exactly 2 stages per rank (a V shape)")
        m = self.n_microbatches
        if local % m:
            raise PipelineError(f"the per-rank batch ({local} sequences) is not divisible by --microbatches {m}")
        if self.pp_schedule == "1f1b" and m < self.pp:
            raise PipelineError(
                f"--pp-schedule 1f1b needs at least as many microbatches as stages ({self.pp}), got {m}"
            )
        if self.pp_schedule in MULTI_STAGE_SCHEDULES and m % max(1, m // self.pp):
            raise PipelineError(
                f"--pp-schedule {self.pp_schedule} needs --microbatches to be a multiple of {max(1, m // self.pp)}"
            )
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


def stage_layers(config: ParallelConfig, n_layer: int) -> list[int]:
    """Layers per pipeline stage: --pp-split, or as even as possible (earlier stages take the remainder:
    the last one also holds the head)."""
    n = config.num_stages
    if config.pp_split:
        split = list(config.pp_split)
        if len(split) != n:
            raise PipelineError(
                f"--pp-split has {len(split)} entries but there are {n} stages (--pp × --stages-per-rank)"
            )
        if sum(split) != n_layer or min(split) < 1:
            raise PipelineError(
                f"--pp-split {','.join(map(str, split))} must give each stage at least one layer "
                f"and sum to {n_layer} layers"
            )
        return split
    if n_layer < n:
        raise PipelineError(f"{n} pipeline stages need at least {n} layers, the model has {n_layer}")
    base, extra = divmod(n_layer, n)
    return [base + (1 if s < extra else 0) for s in range(n)]


@dataclass
class RuntimeOptions:
    """How every rank runs its part, whatever the plan. The speed and memory features are meant for GPUs
    (they also run on CPU, where they are off by default)."""

    bf16: bool = False  # bf16 autocast
    compile: bool = False  # torch.compile each block
    ac: bool = False  # activation checkpointing of each block
    fused_adamw: bool = False  # fused AdamW kernel
    timeout_s: float = 300.0  # process-group timeout: a lost peer fails the job instead of hanging it
    wandb: bool = False  # rank 0 mirrors its TensorBoard events to Weights & Biases (common/board.py)

    def to_dict(self) -> dict:
        return asdict(self)
