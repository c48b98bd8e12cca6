"""Planning: estimate every candidate plan, drop those that don't fit, rank the rest fastest first;
and the ranking's output (the table of `pipeline plan`, one line on why a plan was picked)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from common.errors import PipelineError
from pretrain.config import stage_layers
from pretrain.planner.candidates import SearchSpace, divisors, enumerate_plans
from pretrain.planner.cluster import Cluster
from pretrain.planner.cost import MB, RESERVE, Estimate, balanced_split, estimate, stage_compute
from pretrain.planner.layout import Layout
from pretrain.planner.profile import ModelProfile, Workload, profile_model

GiB = 2**30
# A pipeline plan's split balanced by stage cost replaces its even split only if at least 1% faster.
BALANCED_SPLIT_MIN_GAIN = 0.99


@dataclass
class PlanResult:
    ranked: list[Estimate]  # fitting plans, fastest first
    rejected: list[Estimate]  # plans that do not fit
    cluster: Cluster
    work: Workload

    def to_dict(self) -> dict:
        return {
            "cluster": self.cluster.describe(),
            "cluster_source": self.cluster.source,
            "world_size": self.cluster.world_size,
            "plans": [e.to_dict() for e in self.ranked],
            "rejected": len(self.rejected),
        }


def plan(work: Workload, cluster: Cluster, space: SearchSpace | None = None, world: int | None = None) -> PlanResult:
    """Estimate every plan for the cluster, drop those that don't fit, fastest first."""
    work.validate()
    world = world or cluster.world_size
    if world > cluster.world_size:
        raise PipelineError(f"--nproc {world} is more than the cluster's {cluster.world_size} devices")
    if world < cluster.world_size:
        cluster = _first_devices(cluster, world)
    candidates = enumerate_plans(world, work, cluster, space)
    if not candidates:
        raise PipelineError(_no_plan_reason(world, work))
    profile = profile_model(work.model, work.seq_len, work.act_bytes)
    estimates = [_balanced(estimate(c, work, cluster, profile), work, cluster, profile) for c in candidates]
    ranked = sorted((e for e in estimates if e.fits), key=lambda e: (e.step_s, e.memory_bytes))
    rejected = [e for e in estimates if not e.fits]
    if not ranked:
        least = min(rejected, key=lambda e: e.memory_bytes)
        device = min(cluster.devices, key=lambda d: d.memory_bytes)
        raise PipelineError(
            f"the model fits no plan on {world} device(s): the smallest plan ({least.label}) needs "
            f"{least.memory_bytes / GiB:.2f} GiB per device, the devices have {device.memory_bytes / GiB:.2f} GiB "
            f"(usable {RESERVE:.0%}); use more devices, a smaller --global-batch or --seq-len, or a smaller model"
        )
    return PlanResult(ranked, rejected, cluster, work)


def _balanced(est: Estimate, work: Workload, cluster: Cluster, profile: ModelProfile) -> Estimate:
    """For a pipeline plan with an even split, try the split balanced by stage cost; keep the faster."""
    c = est.candidate.config
    if c.pp == 1 or c.pp_split:
        return est
    layout = Layout(c, cluster, est.candidate.node_order)
    rows = work.global_batch // c.dp // c.n_microbatches
    stages = [stage_compute(c, s, layout, cluster, profile, rows) for s in range(c.num_stages)]
    split = balanced_split(
        c, work.model.n_layer, [sum(layer) for layer, _ in stages], [sum(other) for _, other in stages]
    )
    if split == stage_layers(c, work.model.n_layer):
        return est
    other = estimate(replace(est.candidate, config=replace(c, pp_split=split)), work, cluster, profile)
    if other.fits and (other.step_s < est.step_s * BALANCED_SPLIT_MIN_GAIN or not est.fits):
        return other
    return est


def _first_devices(cluster: Cluster, n: int) -> Cluster:
    keep = list(range(n))
    devices = [cluster.devices[i] for i in keep]
    nodes_used = sorted({d.node for d in devices})
    remap = {k: i for i, k in enumerate(nodes_used)}
    devices = [replace(d, node=remap[d.node]) for d in devices]
    return replace(
        cluster,
        devices=devices,
        nodes=[cluster.nodes[k] for k in nodes_used],
        latency_s=[row[:n] for row in cluster.latency_s[:n]],
        bandwidth_Bps=[row[:n] for row in cluster.bandwidth_Bps[:n]],
    )


def _no_plan_reason(world: int, work: Workload) -> str:
    cfg = work.model
    dps = [
        world // (tp * pp)
        for tp in divisors(world)
        if cfg.n_head % tp == 0
        for pp in divisors(world // tp)
        if pp <= cfg.n_layer
    ]
    if not any(work.global_batch % dp == 0 for dp in dps):
        return (
            f"--global-batch {work.global_batch} cannot be divided among the data-parallel degrees a plan for {world} "
            f"devices can have ({', '.join(map(str, sorted(set(dps))))}); use a multiple of one of them"
        )
    return (
        f"no valid plan for {world} devices with {cfg.n_head} heads, {cfg.n_layer} layers "
        f"and global batch {work.global_batch}"
    )


def check_degrees(world: int, dp: int | None, tp: int | None, pp: int | None) -> None:
    """Degrees given by hand (each positive: cli.py checks it) must multiply to the world size."""
    given = {k: v for k, v in dict(dp=dp, tp=tp, pp=pp).items() if v is not None}
    if len(given) == 3 and dp * tp * pp != world:
        raise PipelineError(f"--dp {dp} × --tp {tp} × --pp {pp} = {dp * tp * pp}, not the world size {world}")
    product = math.prod(given.values()) if given else 1
    if world % product:
        raise PipelineError(
            f"the degrees given ({' × '.join(f'{k}={v}' for k, v in given.items())} = {product}) "
            f"do not divide the world size {world}"
        )


def filter_degrees(result: PlanResult, dp: int | None, tp: int | None, pp: int | None) -> PlanResult:
    keep = [
        e
        for e in result.ranked
        if all(v is None or getattr(e.candidate.config, k) == v for k, v in dict(dp=dp, tp=tp, pp=pp).items())
    ]
    if not keep:
        raise PipelineError("no plan that fits has the degrees given (--dp/--tp/--pp)")
    return replace(result, ranked=keep)


# ---------------------------------------------------------------- output


def table_rows(result: PlanResult, top: int) -> list[list[str]]:
    rows = []
    for i, e in enumerate(result.ranked[:top], 1):
        parts = sorted(e.time_parts.items(), key=lambda kv: -kv[1])
        share = ", ".join(f"{k} {v / e.step_s:.0%}" for k, v in parts[:2])
        rows.append(
            [str(i), e.label, f"{e.step_s * 1e3:,.1f}", f"{e.tokens_per_s:,.0f}", f"{e.memory_bytes / MB:,.1f}", share]
        )
    return rows


def why(e: Estimate, result: PlanResult) -> str:
    """One line: why this plan was picked."""
    runner = result.ranked[1] if len(result.ranked) > 1 else None
    text = (
        f"predicted {e.step_s * 1e3:,.1f} ms/step, {e.tokens_per_s:,.0f} tokens/s, "
        f"{e.memory_bytes / MB:,.1f} MiB per device; "
        f"main cost {e.main_cost} ({e.time_parts[e.main_cost] / e.step_s:.0%})"
    )
    if runner is not None:
        text += f"; {runner.step_s / e.step_s:.2f}× faster than the next ({runner.label})"
    return text
