"""`pipeline pretrain`: from documents to a trained, exported model.

run_pretrain() resolves the settings once, before anything is written (`resolve`: how they combine is checked,
then they become a PretrainJob: the sources, data options, training config, plan, runtime options and the
processes' placement), then

    a new run    prepares the data (tokenizer and token shards, pretrain/prepare.py), sizes the model to the
                 time budget unless a shape or step count was given (pretrain/sizing.py), takes the plan
                 given or, with --strategy auto, the planner's (pretrain/planner/auto.py, --autotune), and
                 trains: in this process, under torchrun (pretrain/launch.py) or on Ray (pretrain/ray_train.py)
    --resume     continues the latest checkpoint under this run's plan (any plan can resume any checkpoint);
                 with --data, the documents of new input files first go into new shards (continued pretraining)

The adaptation to retrieval that follows (`pipeline tune` with its defaults, unless --no-adapt) is the
embed stage's: workflows.py chains it after this, since no stage imports another.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from common.board import require_wandb
from common.console import info
from common.errors import PipelineError
from common.manifest import ModelEntry, read_manifest
from common.workspace import Workspace
from pretrain.checkpoint import BEST_DIR, checkpoint_dirs, config_from_checkpoint
from pretrain.config import PRESET_TRAINING, PRESETS, ParallelConfig, RuntimeOptions, TrainConfig, model_config_for
from pretrain.prepare import DataOptions, PretrainingSources, append_data, prepare_data
from pretrain.settings import PretrainSettings
from pretrain.sizing import size_to_budget

AUTOTUNE_STEPS = 4  # steps of each plan --autotune measures (the first warms up)


@dataclass
class Placement:
    """Where the job's processes run: nproc on each of nnodes nodes (torchrun's), or workers on a Ray cluster."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    ray: str | None = None
    max_failures: int = 0  # Ray: worker failures recovered

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    def launch_args(self) -> dict:
        """launch()'s arguments for this placement (torchrun on this node)."""
        return dict(
            nproc=self.nproc,
            nnodes=self.nnodes,
            node_rank=self.node_rank,
            master_addr=self.master_addr,
            master_port=self.master_port,
        )


@dataclass
class PretrainJob:
    """The settings resolved once, at the start, into the typed parts pretraining runs with (as torchtitan
    turns its job config into parallel dims, model args and a training spec): nothing after `resolve` reads
    PretrainSettings."""

    budget_s: float
    sources: PretrainingSources
    data: DataOptions
    config: TrainConfig  # the preset's, or the checkpoint's when resuming; sizing may replace its shape
    plan: ParallelConfig | None  # None: the planner chooses (--strategy auto)
    autotune: int | None  # with the planner: measure this many of its top plans
    cluster: Path | None  # with the planner: a cluster file instead of measuring this machine
    options: RuntimeOptions
    placement: Placement
    resume_from: Path | None
    continue_with_data: bool  # --resume --data: the new documents in new shards first
    steps_given: bool  # --max-steps: a continued run does not add steps for the new tokens
    sized: bool  # no shape or length given: model and tokens sized to the budget
    vocab_size: int  # the vocabulary asked for; 0: sized to the corpus


def resolve(ws: Workspace, s: PretrainSettings, budget_s: float | None = None) -> PretrainJob:
    """Check how the settings combine (check_settings) and resolve them into a PretrainJob; `budget_s`:
    pretraining's share of the time budget (default: all of it)."""
    checked_budget_s = check_settings(s)
    placement = Placement(
        nproc=s.nproc if s.nproc is not None else default_workers(s.ray),
        nnodes=s.nnodes,
        node_rank=s.node_rank,
        master_addr=s.master_addr,
        master_port=s.master_port,
        ray=s.ray,
        max_failures=s.max_failures,
    )
    plan = ParallelConfig.resolve(
        None if s.auto else s.strategy,
        placement.world,
        dp=s.dp,
        dp_replicate=s.dp_replicate,
        dp_shard=s.dp_shard,
        tp=s.tp,
        pp=s.pp,
        pp_schedule=s.pp_schedule,
        microbatches=s.microbatches or 0,
        stages_per_rank=s.stages_per_rank or 0,
        pp_split=parse_split(s.pp_split),
    )
    resume_from = latest_checkpoint(ws) if s.resume else None
    return PretrainJob(
        budget_s=checked_budget_s if budget_s is None else budget_s,
        sources=PretrainingSources(tuple(s.data), s.text_field),
        data=DataOptions(
            tokenizer_sample_mb=s.tokenizer_sample_mb,
            shard_tokens=s.shard_tokens,
            workers=s.tokenize_workers or 0,
            seed=s.seed,
            ray=s.ray,
        ),
        config=resumed_config(resume_from, s) if resume_from else new_train_config(s),
        plan=None if s.auto else plan,
        autotune=s.autotune,
        cluster=s.cluster,
        options=runtime_options(s),
        placement=placement,
        resume_from=resume_from,
        continue_with_data=resume_from is not None and bool(s.data),
        steps_given=s.max_steps is not None,
        sized=resume_from is None and not s.shape_given,
        vocab_size=s.vocab_size or 0,
    )


def run_pretrain(ws: Workspace, s: PretrainSettings, budget_s: float | None = None) -> ModelEntry | None:
    """Run `pipeline pretrain`'s pretraining in `budget_s` seconds (default: all of --time-budget); returns
    the manifest's model section as exported (None on nodes other than the first)."""
    job = resolve(ws, s, budget_s)
    cfg, plan = job.config, job.plan
    if job.continue_with_data:  # continued pretraining: the new documents in new shards
        added = append_data(ws, job.sources, job.data)
        if added:  # the best validation so far was on the old data: the continued run keeps its own
            shutil.rmtree(ws.checkpoints_dir / BEST_DIR, ignore_errors=True)
        if not job.steps_given and added:  # as many more steps as the new tokens fill
            more = math.ceil(added / (cfg.batch_size * cfg.seq_len))
            info(f"training {more:,} more steps ({cfg.max_steps:,} -> {cfg.max_steps + more:,}) for the new tokens")
            cfg.max_steps += more
    if plan is not None:
        plan.validate(cfg.model, cfg)  # the plan the user gave, before anything is written

    sizing = None  # what sizing measured and ranked, kept in the run's log
    if job.sized:  # sized to the data, this machine and the time budget
        started = time.monotonic()
        cfg.preset, cfg.vocab_size = "sized", job.vocab_size
        meta = prepare_data(ws, job.sources, cfg, job.data)
        left_s = job.budget_s - (time.monotonic() - started)
        cfg, report, sizing = size_to_budget(cfg, meta["train_tokens"], left_s, job.placement.world, plan)
        for line in report:  # only shapes the plan accepts
            info(line)
    elif job.resume_from is None:  # a shape or length given
        meta = prepare_data(ws, job.sources, cfg, job.data)  # once, in this process: workers only train
        cfg.model = replace(cfg.model, vocab_size=meta["vocab_size"])
    if plan is None:  # the planner's plans are ones training accepts (the same check)
        from pretrain.planner.auto import apply_estimate, autotune_plan, choose_plan

        result, best = choose_plan(ws, cfg, job.placement.nproc, job.placement.nnodes, job.cluster, job.options.bf16)
        plan, cfg = apply_estimate(cfg, best)
        if job.autotune and job.resume_from is None:
            measured = autotune_plan(
                ws, cfg, job.options, result, job.autotune, AUTOTUNE_STEPS, job.placement.launch_args()
            )
            plan, cfg = apply_estimate(cfg, measured)

    return train_job(ws, cfg, plan, job, sizing)


# ---------------------------------------------------------------- settings, checked once


def check_settings(s: PretrainSettings) -> float:
    """Every check of how the settings combine (each option's own range is checked where it is declared,
    pretrain/settings.py); returns the time budget in seconds."""
    if s.ray is not None and (s.nnodes != 1 or s.node_rank != 0 or s.master_addr or s.master_port):
        raise PipelineError("--ray places the workers itself: drop --nnodes/--node-rank/--master-addr/--master-port")
    if s.node_rank >= s.nnodes:
        raise PipelineError(
            f"--node-rank {s.node_rank} is not a node of the job: "
            f"the ranks of --nnodes {s.nnodes} are 0 to {s.nnodes - 1}"
        )
    given = (s.dp, s.dp_replicate, s.dp_shard, s.tp, s.pp, s.microbatches, s.stages_per_rank, s.pp_split)
    if s.auto and any(v is not None for v in given):
        raise PipelineError(
            "--strategy auto chooses the degrees, schedule and split itself; "
            "drop --dp/--tp/--pp and the pipeline options"
        )
    if (s.autotune is not None or s.cluster is not None) and not s.auto:
        raise PipelineError("--autotune and --cluster go with --strategy auto")
    if s.wandb:
        require_wandb()
    return s.time_budget_seconds


def parse_split(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise PipelineError(f"--pp-split: expected layers per stage like 5,3, got '{text}'") from None


def default_workers(ray: str | None) -> int:
    """One process per GPU (1 on CPU), or with --ray one worker per GPU or CPU slot of the Ray cluster."""
    if ray is not None:
        from pretrain.ray_train import cluster_workers

        return cluster_workers(ray)
    from pretrain.launch import default_nproc

    return default_nproc()


def runtime_options(s: PretrainSettings) -> RuntimeOptions:
    import torch

    cuda = torch.cuda.is_available()
    return RuntimeOptions(
        bf16=cuda if s.bf16 is None else s.bf16,
        compile=s.compile,
        ac=s.ac,
        fused_adamw=cuda if s.fused_adamw is None else s.fused_adamw,
        timeout_s=s.dist_timeout,
        wandb=s.wandb,
    )


def shape_overrides(s: PretrainSettings) -> dict:
    return {k: v for k, v in dict(n_layer=s.n_layer, n_head=s.n_head, n_embd=s.n_embd).items() if v is not None}


def new_train_config(s: PretrainSettings) -> TrainConfig:
    """The run's configuration from the preset (tiny by default) and the settings that override it."""
    preset = s.preset or "tiny"
    if preset not in PRESETS:
        raise PipelineError(f"--preset: unknown preset '{preset}' (choose from {', '.join(PRESETS)})")
    defaults = PRESET_TRAINING[preset]
    seq_len = s.seq_len or defaults["seq_len"]
    batch_size = s.batch_size or defaults["batch_size"]
    vocab = s.vocab_size or defaults["vocab_size"]
    max_steps = max(1, -(-s.tokens // (batch_size * seq_len))) if s.tokens is not None else s.max_steps
    cfg = TrainConfig(
        preset=preset,
        max_steps=defaults["max_steps"] if max_steps is None else max_steps,
        seq_len=seq_len,
        batch_size=batch_size,
        grad_accum=s.grad_accum,
        lr=s.lr or defaults["lr"],
        seed=s.seed,
        vocab_size=vocab,
        eval_every=s.eval_every or 0,
        patience=s.patience,
        checkpoint_every=s.checkpoint_every,
        log_every=s.log_every,
    )
    cfg.model = model_config_for(preset, vocab, seq_len, **shape_overrides(s))
    if cfg.model.n_embd % cfg.model.n_head:
        raise PipelineError(f"--n-embd {cfg.model.n_embd} is not divisible by --n-head {cfg.model.n_head}")
    return cfg


def latest_checkpoint(ws: Workspace) -> Path:
    checkpoints = checkpoint_dirs(ws)
    if not checkpoints:
        raise PipelineError(f"--resume: no checkpoint in {ws.checkpoints_dir}")
    return checkpoints[-1]


def resumed_config(checkpoint: Path, s: PretrainSettings) -> TrainConfig:
    cfg = config_from_checkpoint(checkpoint)
    if s.max_steps is not None:
        cfg.max_steps = s.max_steps
    cfg.patience = s.patience  # when to stop is this run's choice, as is how often to validate
    if s.eval_every is not None:
        cfg.eval_every = s.eval_every
    return cfg


# ---------------------------------------------------------------- training, where the job runs


def train_job(
    ws: Workspace, cfg: TrainConfig, plan: ParallelConfig, job: PretrainJob, sizing: dict | None = None
) -> ModelEntry | None:
    """Train in this process when the job is one process, else under torchrun on this node, or on Ray;
    returns the manifest's model section (None on nodes other than the first). What was predicted before the run
    goes with it, to be logged beside what it measures: the planner's step time and memory for the plan,
    if this machine was measured, and the sizing's ranking of the shapes."""
    from pretrain.launch import RunSpec, launch
    from pretrain.planner.auto import predict_run
    from pretrain.train import train

    options, resume_from, placement = job.options, job.resume_from, job.placement
    prediction = {**(predict_run(ws, cfg, plan, options.bf16) or {}), **({"sizing": sizing} if sizing else {})} or None
    if placement.ray is not None:
        from pretrain.ray_train import run_on_ray

        return run_on_ray(
            ws, cfg, plan, options, resume_from, placement.ray, placement.max_failures, prediction=prediction
        )
    if placement.world == 1:
        return train(ws, cfg, resume_from=resume_from, plan=plan, options=options, prediction=prediction)
    spec = RunSpec(
        str(ws.root.resolve()),
        asdict(cfg),
        plan.to_dict(),
        str(resume_from.resolve()) if resume_from else None,
        prediction=prediction,
        options=options.to_dict(),
    )
    launch([spec], **placement.launch_args())
    return read_manifest(ws).model if placement.node_rank == 0 else None
