"""Candidate plans: every (tp, pp, dp) factorisation of the world size, DDP / FSDP / HSDP for the data
dimension, every pipeline schedule with its microbatch counts and stages per rank, gradient
accumulation, and the node orders that differ (placement). Each plan is checked with
ParallelConfig.validate, the same check training makes, so every candidate is one training accepts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from common.errors import PipelineError
from pretrain.config import MULTI_STAGE_SCHEDULES, SCHEDULES, SINGLE_STAGE_SCHEDULES, ParallelConfig, TrainConfig
from pretrain.planner.cluster import Cluster
from pretrain.planner.profile import Workload

MAX_GRAD_ACCUM = 8  # gradient accumulation tried up to this many microbatches (without PP: it saves memory)
MAX_NODE_ORDERS = 24  # placements tried per plan on clusters of unlike nodes


@dataclass
class Candidate:
    """One plan to estimate: the parallel config, gradient accumulation (without PP), node order."""

    config: ParallelConfig
    grad_accum: int = 1
    node_order: tuple[int, ...] = ()  # node i of the job runs on cluster node node_order[i]

    def label(self) -> str:
        c = self.config
        if c.world_size == 1:
            parts = ["single"]
        else:
            parts = []
            if c.dp > 1:
                kind = "ddp" if c.uses_ddp else "hsdp" if c.dp_replicate > 1 else "fsdp"
                parts.append(f"{kind}{c.dp}" if kind != "hsdp" else f"hsdp{c.dp_replicate}x{c.dp_shard}")
            if c.tp > 1:
                parts.append(f"tp{c.tp}")
            if c.pp > 1:
                spr = f"v{c.n_stages_per_rank}" if c.pp_schedule in MULTI_STAGE_SCHEDULES else ""
                parts.append(f"pp{c.pp}-{c.pp_schedule}{spr}-m{c.n_microbatches}")
                if c.pp_split:
                    parts.append("split" + ":".join(map(str, c.pp_split)))
        if self.grad_accum > 1:
            parts.append(f"ga{self.grad_accum}")
        if self.node_order and list(self.node_order) != sorted(self.node_order):
            parts.append("nodes" + "".join(map(str, self.node_order)))
        return " ".join(parts)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class SearchSpace:
    """What enumerate_plans may vary (benchmarks narrow it to keep measurement bounded)."""

    schedules: tuple[str, ...] = SCHEDULES
    max_microbatch_factor: int = 4  # microbatches up to this many times the pipeline degree
    stages_per_rank: tuple[int, ...] = (2, 4)
    hsdp: bool = True
    grad_accum: bool = True  # also plans that split a data-parallel rank's batch to save memory
    placements: bool = True


def enumerate_plans(
    world: int, work: Workload, cluster: Cluster | None = None, space: SearchSpace | None = None
) -> list[Candidate]:
    """Every plan for `world` ranks that training accepts (ParallelConfig.validate)."""
    space = space or SearchSpace()
    cfg = work.model
    plans: list[Candidate] = []
    for tp in divisors(world):
        if cfg.n_head % tp:
            continue
        for pp in divisors(world // tp):
            if pp > cfg.n_layer:
                continue
            dp = world // (tp * pp)
            if work.global_batch % dp:
                continue
            local = work.global_batch // dp
            for data in _data_variants(dp, tp, pp, space):
                for pipe in _pipe_variants(pp, local, cfg.n_layer, space):
                    for ga in [1] + (
                        [g for g in divisors(local) if g > 1 and g <= MAX_GRAD_ACCUM]
                        if space.grad_accum and pp == 1
                        else []
                    ):
                        config = ParallelConfig(**data, tp=tp, pp=pp, **pipe)
                        config.strategy = _strategy(config)
                        if _valid(config, work, ga):
                            plans.append(Candidate(config, ga))
    if cluster is not None and space.placements:
        plans = [replace(c, node_order=order) for c in plans for order in _node_orders(cluster)]
    return plans


def _strategy(c: ParallelConfig) -> str:
    dims = [name for name, v in (("dp", c.dp), ("tp", c.tp), ("pp", c.pp)) if v > 1]
    if not dims:
        return "single"
    if len(dims) > 1:
        return "hybrid"
    return {"tp": "tp", "pp": "pp"}.get(dims[0], "ddp" if c.dp_shard == 1 else "fsdp")


def _data_variants(dp: int, tp: int, pp: int, space: SearchSpace) -> list[dict]:
    if dp == 1:
        return [dict(dp_replicate=1, dp_shard=1)]
    variants = [dict(dp_shard=dp, dp_replicate=1)]
    if tp == pp == 1:
        variants.append(dict(dp_replicate=dp, dp_shard=1))  # DDP only alone (parallel.py: combinations use FSDP)
    if space.hsdp:
        variants += [dict(dp_replicate=r, dp_shard=dp // r) for r in divisors(dp) if 1 < r < dp]
    return variants


def _pipe_variants(pp: int, local: int, n_layer: int, space: SearchSpace) -> list[dict]:
    if pp == 1:
        return [dict()]
    out = []
    counts = [m for m in divisors(local) if pp // 2 <= m <= pp * space.max_microbatch_factor and m >= 2]
    for schedule in space.schedules:
        for m in counts:
            if schedule in SINGLE_STAGE_SCHEDULES:
                out.append(dict(pp_schedule=schedule, microbatches=m))
            else:
                for v in (2,) if schedule == "zbv" else space.stages_per_rank:
                    if pp * v <= n_layer:
                        out.append(dict(pp_schedule=schedule, microbatches=m, stages_per_rank=v))
    return out


def _valid(config: ParallelConfig, work: Workload, grad_accum: int) -> bool:
    train = TrainConfig(batch_size=work.global_batch, seq_len=work.seq_len, grad_accum=grad_accum)
    try:
        config.validate(work.model, train)
    except PipelineError:
        return False
    return True


def _node_orders(cluster: Cluster) -> list[tuple[int, ...]]:
    """Orders of the cluster's nodes that differ (nodes with the same devices are interchangeable)."""
    n = len(cluster.nodes)
    signature = lambda k: tuple((d.name, d.flops, d.memory_bytes) for d in cluster.devices if d.node == k)  # noqa: E731
    if n == 1 or len({signature(k) for k in range(n)}) == 1:
        return [tuple(range(n))]
    seen, orders = set(), []
    for order in itertools.permutations(range(n)):
        key = tuple(signature(k) for k in order)
        if key not in seen:
            seen.add(key)
            orders.append(order)
        if len(orders) >= MAX_NODE_ORDERS:
            break
    return orders
