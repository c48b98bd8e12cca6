"""Using the planner: plan from command-line arguments, pick a plan for `pretrain --strategy auto`,
and --autotune (a few real steps of each of the top K plans, keep the measured fastest).

The measured cluster is cached in the workspace (cluster.json), keyed by host, process count and
device type, so a second `pipeline plan` or `pretrain --strategy auto` does not measure again.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from common.console import info
from common.errors import PipelineError
from common.workspace import Workspace
from pretrain.config import (
    PRESET_TRAINING,
    PRESETS,
    ModelConfig,
    ParallelConfig,
    RuntimeOptions,
    TrainConfig,
    model_config_for,
)
from pretrain.planner.candidates import Candidate
from pretrain.planner.cluster import Cluster, load_cluster_toml
from pretrain.planner.cost import Estimate, estimate
from pretrain.planner.measure import CLUSTER_CACHE, cache_key, local_cluster
from pretrain.planner.profile import Workload
from pretrain.planner.rank import PlanResult, check_degrees, filter_degrees, plan, why


def load_model_config(path: Path, seq_len: int | None, vocab_size: int | None) -> ModelConfig:
    """A ModelConfig from JSON: our field names, or a Hugging Face GPT-2 config.json (n_positions, ...)."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"--model-config {path}: no such file")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PipelineError(f"--model-config {path}: invalid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise PipelineError(f"--model-config {path}: expected a JSON object")
    raw = raw.get("config", raw)  # a manifest's model section holds it under "config"
    fields = {
        "vocab_size": raw.get("vocab_size"),
        "n_layer": raw.get("n_layer"),
        "n_head": raw.get("n_head"),
        "n_embd": raw.get("n_embd"),
        "block_size": raw.get("block_size", raw.get("n_positions")),
    }
    for name, value in fields.items():
        if name == "vocab_size" and vocab_size:
            continue
        if not isinstance(value, int) or value < 1:
            raise PipelineError(f"--model-config {path}: field '{name}' must be a positive integer, got {value!r}")
    cfg = ModelConfig(**{k: v for k, v in fields.items() if v is not None})
    if vocab_size:
        cfg = replace(cfg, vocab_size=vocab_size)
    if seq_len and seq_len > cfg.block_size:
        cfg = replace(cfg, block_size=seq_len)
    return cfg


def workload_from_args(
    preset: str,
    model_config: Path | None,
    seq_len: int | None,
    global_batch: int | None,
    vocab_size: int | None,
    bf16: bool,
) -> Workload:
    if model_config is not None:
        cfg = load_model_config(model_config, seq_len, vocab_size)
        defaults = PRESET_TRAINING["small"]
    else:
        if preset not in PRESETS:
            raise PipelineError(f"--preset: unknown preset '{preset}' (choose from {', '.join(PRESETS)})")
        defaults = PRESET_TRAINING[preset]
        cfg = model_config_for(preset, vocab_size or defaults["vocab_size"], seq_len or defaults["seq_len"])
    work = Workload(
        cfg,
        seq_len or min(defaults["seq_len"], cfg.block_size),
        global_batch or defaults["batch_size"],
        act_bytes=2 if bf16 else 4,
    )
    work.validate()
    return work


def get_cluster(ws: Workspace | None, cluster_file: Path | None, nproc: int | None, remeasure: bool = False) -> Cluster:
    """The cluster from --cluster, or measured here over `nproc` processes (cached in the workspace)."""
    if cluster_file is not None:
        return load_cluster_toml(cluster_file)
    from pretrain.launch import default_nproc

    nproc = nproc or default_nproc()
    cache = ws.root / CLUSTER_CACHE if ws is not None else None
    cluster, cached = local_cluster(cache, nproc, remeasure)
    if not cached:
        info(f"measured {cluster.describe()} over {nproc} process(es); cached in {cache}")
    return cluster


def plan_for(
    work: Workload,
    cluster: Cluster,
    world: int | None,
    dp: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
) -> PlanResult:
    world = world or cluster.world_size
    check_degrees(world, dp, tp, pp)
    result = plan(work, cluster, world=world)
    if dp or tp or pp:
        result = filter_degrees(result, dp, tp, pp)
    return result


# ---------------------------------------------------------------- pretrain --strategy auto / --autotune


def choose_plan(
    ws: Workspace, cfg: TrainConfig, nproc: int, nnodes: int, cluster_file: Path | None, bf16: bool
) -> tuple[PlanResult, Estimate]:
    """The planner's top plan for this run; prints why."""
    world = nproc * nnodes
    if nnodes > 1 and cluster_file is None:
        raise PipelineError(
            "--strategy auto on several nodes needs --cluster FILE describing them (only this node can be measured)"
        )
    cluster = get_cluster(ws, cluster_file, nproc)
    work = Workload(cfg.model, cfg.seq_len, cfg.batch_size, act_bytes=2 if bf16 else 4)
    result = plan_for(work, cluster, world)
    best = result.ranked[0]
    info(
        f"strategy auto: {best.label} out of {len(result.ranked)} plans that fit ({len(result.rejected)} do not): "
        f"{why(best, result)}"
    )
    return result, best


def apply_estimate(cfg: TrainConfig, est: Estimate) -> tuple[ParallelConfig, TrainConfig]:
    """The ParallelConfig and TrainConfig that run an estimated plan."""
    return replace(est.candidate.config), replace(cfg, grad_accum=est.candidate.grad_accum)


def prediction(est: Estimate) -> dict:
    return {
        "plan": est.label,
        "step_s": est.step_s,
        "peak_mem_mb": est.memory_bytes / 2**20,
        "main_cost": est.main_cost,
    }


def autotune_plan(
    ws: Workspace, cfg: TrainConfig, options: RuntimeOptions, result: PlanResult, k: int, steps: int, launch_args: dict
) -> Estimate:
    """Run `steps` steps of each of the top k plans in one job (scratch workspaces sharing the token files)
    and return the estimate of the measured fastest; prints predicted vs measured."""
    from pretrain.launch import RunSpec, launch
    from pretrain.train import train

    top = result.ranked[:k]
    trial_cfg = replace(cfg, max_steps=steps, log_every=1, eval_every=10**9, checkpoint_every=10**9, measure_comm=False)
    with tempfile.TemporaryDirectory(dir=ws.root, prefix="autotune-") as tmp:
        specs, roots = [], []
        for i, est in enumerate(top):
            root = Path(tmp) / f"plan{i}"
            root.mkdir()
            (root / "data").symlink_to(ws.data_dir.resolve())
            (root / "tokenizer").symlink_to(ws.tokenizer_dir.resolve())
            config, run_cfg = apply_estimate(trial_cfg, est)
            specs.append(
                RunSpec(str(root), asdict(run_cfg), config.to_dict(), None, export=False, options=options.to_dict())
            )
            roots.append(root)
        info(f"autotune: {steps} steps of each of the top {len(top)} plans")
        if launch_args["nproc"] * launch_args.get("nnodes", 1) == 1:
            for spec, est in zip(specs, top):
                config, run_cfg = apply_estimate(trial_cfg, est)
                train(Workspace(Path(spec.workspace)), run_cfg, plan=config, options=options, export=False)
        else:
            launch(specs, **launch_args)
        measured = [_median_step(root) for root in roots]
    info(f"{'plan':40} {'predicted ms':>12} {'measured ms':>12}")
    for est, m in zip(top, measured):
        info(f"{est.label:40} {est.step_s * 1e3:12.1f} {m * 1e3:12.1f}")
    best = min(range(len(top)), key=lambda i: measured[i])
    info(
        f"autotune: keeping {top[best].label} (measured {measured[best] * 1e3:.1f} ms/step"
        + ("" if best == 0 else f"; the planner's pick {top[0].label} measured {measured[0] * 1e3:.1f}")
        + ")"
    )
    return top[best]


def _median_step(root: Path) -> float:
    steps = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines() if line]
    times = [s["step_s"] for s in steps if s.get("event") == "train"]
    times = times[1:] if len(times) > 1 else times  # the first step warms up (pipeline shape inference, allocator)
    return statistics.median(times)


# ---------------------------------------------------------------- predicted beside measured, in every run


def predict_run(ws: Workspace, cfg: TrainConfig, config: ParallelConfig, bf16: bool) -> dict | None:
    """The planner's step time and peak memory for this run's plan, if the workspace holds a cluster
    measurement for its world size (training never measures by itself). Never fails the run."""
    try:
        cache = ws.root / CLUSTER_CACHE
        key = cache_key(config.world_size)
        if not cache.exists():
            return None
        raw = json.loads(cache.read_text()).get(key)
        if raw is None:
            return None
        work = Workload(cfg.model, cfg.seq_len, cfg.batch_size, act_bytes=2 if bf16 else 4)
        est = estimate(Candidate(config, cfg.grad_accum), work, Cluster.from_dict(raw))
        return prediction(est)
    except Exception as e:  # noqa: BLE001 - a prediction is informative; training goes on without it
        info(f"no step-time prediction for this plan ({type(e).__name__}: {e})")
        return None
