"""The cost model: one plan's predicted step time and memory per device.

estimate() adds up, per pipeline rank, what a step costs, one function per concern:

    step_shape()          how the plan cuts the step: microbatches, rows per microbatch, layers per stage
    stage_costs()         per stage and microbatch: compute (a roofline: each matmul at the rate the device
                          measured for its size + bytes at its measured rate for them + ops at its host
                          cost per op), tensor-parallel all-reduces, activations saved for backward
    rank_parameters()     parameters and parameter tensors each pipeline rank holds
    data_parallel_time()  DDP's bucketed all-reduces, or FSDP's gathers and reduce-scatters and their
                          host cost per tensor (HSDP: plus the replicas' all-reduce)
    sync_time()           the small all-reduces of the gradient norm and the tied embedding
    pipeline_time()       the pipeline's makespan from an event simulation of the schedule's real action
                          order (pipeline_sim.py): bubble, transfers, the measured cost per action
    optimizer_time()      clipping + AdamW per rank
    memory_per_rank()     parameters, gradients and AdamW states (sharded by FSDP and TP), FSDP's
                          unsharded buffers, the activations of the microbatches the schedule keeps in
                          flight, the pipeline stages' per-microbatch buffers, temporaries

Collectives use the ring model over the slowest link their group crosses (cluster.py, layout.py).
Everything is in bytes and seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrain.config import ParallelConfig, stage_layers
from pretrain.planner.candidates import Candidate
from pretrain.planner.cluster import Cluster, Link, collective_time
from pretrain.planner.layout import Layout
from pretrain.planner.pipeline_sim import simulate, stage_rank
from pretrain.planner.profile import ModelProfile, OpCost, Workload, profile_model

MB = 2**20
RESERVE = 0.9  # plans may use this share of a device's memory (allocator fragmentation, runtime)

# torch DDP's gradient buckets: the first is small so communication starts early, then 25 MiB each.
DDP_FIRST_BUCKET = 1 * MB
DDP_BUCKET = 25 * MB
# Megatron-style TP all-reduces per block and microbatch: forward, the outputs of out_proj and fc_out;
# backward, the input gradients of the column-split linears (q, k, v, fc_in).
TP_ALL_REDUCES_FWD, TP_ALL_REDUCES_BWD = 2, 4
# Parameter tensors outside the blocks (the optimizer's and FSDP's host costs are per tensor).
EMBED_TENSORS = 2  # token and position embeddings
HEAD_TENSORS = 3  # final LayerNorm weight and bias, lm_head (tied to the token embedding in one stage)
# FSDP, host cost: measured for a unit gathered twice and reduced once; under PP a unit stays gathered
# through the step, so it is gathered and reduced once.
FSDP_MEASURED_COLLECTIVES, FSDP_KEPT_GATHERED_COLLECTIVES = 3, 2
# FSDP without PP, at the memory peak (the end of forward): the root's parameters and two blocks
# gathered (the one running, the one prefetched); unsharded gradients come as activations are freed.
FSDP_BLOCKS_GATHERED_AT_PEAK = 2
NORM_BYTES = 4  # the gradient norm: one float32 all-reduced per group
# CPU ranks sharing cores compute faster while others idle in a bubble; a fixed point of this many
# rounds, stopping when the speedup moves less than this.
SHARED_CPU_ROUNDS, SHARED_CPU_TOLERANCE = 4, 0.01
# Clipping and AdamW: about this many fp32 passes over the parameters, and, where the device did not
# measure its host cost per tensor, about this many ops in all (fused multi-tensor kernels).
OPTIMIZER_PASSES, OPTIMIZER_OPS_UNMEASURED = 16, 40
FP32_BYTES = 4
ADAMW_STATES = 2  # exp_avg and exp_avg_sq per parameter
# Outside the last stage, the largest temporaries of a step are about two activation tensors (a
# block's input and output); the last stage holds the logits.
TEMPORARY_ACTIVATIONS = 2


@dataclass
class Estimate:
    candidate: Candidate
    step_s: float
    tokens_per_s: float
    memory_bytes: float  # the largest over ranks
    fits: bool
    time_parts: dict[str, float]  # seconds on the slowest rank's critical path, by cause
    memory_parts: dict[str, float]  # bytes on the rank with the most memory
    main_cost: str
    bubble_fraction: float = 0.0

    @property
    def label(self) -> str:
        return self.candidate.label()

    def to_dict(self) -> dict:
        return {
            "plan": self.label,
            "config": self.candidate.config.to_dict(),
            "grad_accum": self.candidate.grad_accum,
            "node_order": list(self.candidate.node_order),
            "step_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "memory_mb": self.memory_bytes / MB,
            "fits": self.fits,
            "main_cost": self.main_cost,
            "bubble_fraction": self.bubble_fraction,
            "time_s": self.time_parts,
            "memory_parts_mb": {k: v / MB for k, v in self.memory_parts.items()},
        }


# ---------------------------------------------------------------- compute


def compute_time(cost: OpCost, device, dtensor_s: float) -> float:
    """Roofline: each matmul at the device's rate for its size, other ops' bytes at the rate it measured
    for them, ops at its host cost per op."""
    return (
        sum(device.matmul_time(f) for f in cost.matmuls)
        + cost.bytes / device.elementwise_bandwidth
        + cost.ops * device.dispatch_s
        + cost.dtensor_ops * dtensor_s
    )


def shared_cpu_speedup(device, utilisation: float) -> float:
    """How much faster a CPU rank computes when its host's ranks are busy only `utilisation` of the time.

    Ranks that share a host's cores (more ranks than cores) were measured all busy at once, each with
    its share of the cores; a rank waiting in a pipeline bubble blocks and leaves its share to the
    others, up to each rank's own threads. 1 where the ranks do not share cores (and for GPUs)."""
    if not device.host_cores or device.host_ranks <= device.host_cores:
        return 1.0
    busy_ranks = max(1.0, device.host_ranks * utilisation)
    measured = min(device.threads, device.host_cores / device.host_ranks)
    return min(device.threads, device.host_cores / busy_ranks) / measured


def balanced_split(config: ParallelConfig, n_layer: int, layer_s: list[float], extra_s: list[float]) -> list[int]:
    """Layers per stage minimising the slowest stage: stage s costs layers × layer_s[s] + extra_s[s]
    (embeddings, head, a slower device). Greedy is optimal here: each layer goes where it adds least."""
    n = config.num_stages
    layers = [1] * n
    for _ in range(n_layer - n):
        best = min(range(n), key=lambda s: ((layers[s] + 1) * layer_s[s] + extra_s[s], s))
        layers[best] += 1
    return layers


def stage_compute(
    c: ParallelConfig, s: int, layout: Layout, cluster: Cluster, profile: ModelProfile, rows: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Seconds per microbatch of `rows` sequences on stage s's slowest device: (forward, backward) of one
    of its layers, and of its other parts (the embeddings on the first stage, the head on the last)."""
    device = min(layout.stage_devices(stage_rank(c, s) if c.pp > 1 else 0), key=lambda d: d.flops)
    seconds = lambda cost: compute_time(cost.for_rows(rows), device, cluster.dtensor_overhead(0))  # noqa: E731
    block = profile.block(c.tp)
    others = ([profile.embed()] if s == 0 else []) + ([profile.head()] if s == c.num_stages - 1 else [])
    return (
        (seconds(block.fwd), seconds(block.bwd)),
        (sum(seconds(part.fwd) for part in others), sum(seconds(part.bwd) for part in others)),
    )


# ---------------------------------------------------------------- one step, concern by concern


@dataclass
class StepShape:
    """How a plan cuts one step of a workload."""

    config: ParallelConfig
    layout: Layout
    chunks: int  # microbatches per step on a data-parallel rank (pipeline microbatches, or gradient accumulation)
    rows: int  # sequences per microbatch
    act_tensor: float  # bytes of one microbatch's hidden states: what crosses a stage boundary or a TP all-reduce
    split: list[int]  # layers per stage (--pp-split, or even)
    stage_pp: list[int]  # the pipeline rank of each stage

    @property
    def n_stages(self) -> int:
        return self.config.num_stages


def step_shape(cand: Candidate, work: Workload, cluster: Cluster) -> StepShape:
    c = cand.config
    chunks = c.n_microbatches if c.pp > 1 else cand.grad_accum
    rows = work.global_batch // c.dp // chunks
    split = stage_layers(c, work.model.n_layer) if c.pp > 1 else [work.model.n_layer]
    stage_pp = [stage_rank(c, s) if c.pp > 1 else 0 for s in range(c.num_stages)]
    return StepShape(
        c,
        Layout(c, cluster, cand.node_order),
        chunks,
        rows,
        rows * work.seq_len * work.model.n_embd * work.act_bytes,
        split,
        stage_pp,
    )


@dataclass
class StageCosts:
    """Per stage, for one microbatch: seconds of compute and of TP all-reduces, forward and backward,
    and the activation bytes saved for backward."""

    comp_f: list[float]
    comp_b: list[float]
    tp_f: list[float]
    tp_b: list[float]
    act_bytes: list[float]


def stage_costs(shape: StepShape, cluster: Cluster, profile: ModelProfile) -> StageCosts:
    c, rows, split = shape.config, shape.rows, shape.split
    block, embed, head = profile.block(c.tp), profile.embed(), profile.head()
    tp_link, tp_n = shape.layout.slowest_ring("tp") if c.tp > 1 else (Link(0, float("inf")), 1)

    def tp_comm(n_all_reduces: int) -> float:  # per block and microbatch
        return (
            n_all_reduces
            * collective_time("all_reduce", shape.act_tensor, tp_link, tp_n, cluster.collective_overhead_s)
            if c.tp > 1
            else 0.0
        )

    costs = StageCosts([], [], [], [], [])
    for s in range(shape.n_stages):
        (layer_f, layer_b), (other_f, other_b) = stage_compute(c, s, shape.layout, cluster, profile, rows)
        a = split[s] * block.saved_bytes * rows
        a += embed.saved_bytes * rows if s == 0 else 0.0
        a += head.saved_bytes * rows if s == shape.n_stages - 1 else 0.0
        costs.comp_f.append(split[s] * layer_f + other_f)
        costs.comp_b.append(split[s] * layer_b + other_b)
        costs.tp_f.append(split[s] * tp_comm(TP_ALL_REDUCES_FWD))
        costs.tp_b.append(split[s] * tp_comm(TP_ALL_REDUCES_BWD))
        costs.act_bytes.append(a)
    return costs


def rank_parameters(shape: StepShape, work: Workload, profile: ModelProfile) -> tuple[list[float], list[int]]:
    """Parameters (before data-parallel sharding) and parameter tensors on each pipeline rank."""
    c, cfg = shape.config, work.model
    if c.pp == 1:  # the head is tied to the token embedding: only the final LayerNorm is extra
        return (
            [cfg.n_layer * profile.block_params_on_rank(c.tp) + profile.embed_params + 2 * cfg.n_embd],
            [cfg.n_layer * profile.block_tensors + EMBED_TENSORS + HEAD_TENSORS - 1],
        )
    params, tensors = [0.0] * c.pp, [0] * c.pp
    for s in range(shape.n_stages):
        p = shape.split[s] * profile.block_params_on_rank(c.tp)
        p += profile.embed_params if s == 0 else 0
        p += profile.head_params if s == shape.n_stages - 1 else 0
        params[shape.stage_pp[s]] += p
        tensors[shape.stage_pp[s]] += (
            shape.split[s] * profile.block_tensors
            + (EMBED_TENSORS if s == 0 else 0)
            + (HEAD_TENSORS if s == shape.n_stages - 1 else 0)
        )
    return params, tensors


def data_parallel_time(
    shape: StepShape, work: Workload, cluster: Cluster, profile: ModelProfile, params: list[float], tensors: list[int]
) -> tuple[list[float], list[float]]:
    """Per pipeline rank: seconds of data-parallel communication per step (on the slowest data-parallel
    ring), and the bytes FSDP holds unsharded at the memory peak."""
    c, layout, pb, coll = shape.config, shape.layout, work.param_bytes, cluster.collective_overhead_s
    dp_s = [0.0] * c.pp
    unsharded = [0.0] * c.pp
    for r in range(c.pp):
        full_bytes = params[r] * pb
        if c.uses_ddp:
            link, n = layout.slowest_ring("dp_replicate")
            # gradients are bucket views: no copy
            dp_s[r] = sum(collective_time("all_reduce", b, link, n, coll) for b in ddp_buckets(full_bytes))
        elif c.uses_fsdp:
            link, n = layout.slowest_ring("dp_shard")
            local_stages = [s for s in range(shape.n_stages) if shape.stage_pp[s] == r]
            n_blocks = sum(shape.split[s] for s in local_stages)
            root = full_bytes - n_blocks * profile.block_params_on_rank(c.tp) * pb  # embeddings / head not in blocks
            block_b = profile.block_params_on_rank(c.tp) * pb
            ag = lambda nbytes, link=link, n=n: collective_time("all_gather", nbytes, link, n, coll)  # noqa: E731
            rs = lambda nbytes, link=link, n=n: collective_time("reduce_scatter", nbytes, link, n, coll)  # noqa: E731
            roots = len(local_stages)
            # FSDP's host work per parameter tensor (copies in and out of the collectives, hooks, DTensor
            # wrapping), measured for a unit gathered twice and reduced once, and for one kept gathered
            device = layout.stage_devices(r)[0]
            host, host_gathered = device.fsdp_s_per_tensor * tensors[r], device.fsdp_gathered_s_per_tensor * tensors[r]
            if c.pp == 1:  # resharded after forward: blocks are gathered again for backward, every microbatch
                per_mb = n_blocks * (2 * ag(block_b) + rs(block_b)) + ag(root) + rs(root) + host
                dp_s[r] = shape.chunks * per_mb
                unsharded[r] = root + FSDP_BLOCKS_GATHERED_AT_PEAK * block_b
            else:  # kept gathered through the step; gradients reduced once, after the last microbatch
                dp_s[r] = (
                    n_blocks * (ag(block_b) + rs(block_b))
                    + roots * (ag(root / roots) + rs(root / roots))
                    + host * FSDP_KEPT_GATHERED_COLLECTIVES / FSDP_MEASURED_COLLECTIVES
                    + shape.chunks * host_gathered
                )
                unsharded[r] = 2 * full_bytes  # gathered parameters and unsharded gradients
            if c.dp_replicate > 1:
                rlink, rn = layout.slowest_ring("dp_replicate")
                dp_s[r] += (n_blocks + roots) * collective_time(
                    "all_reduce", full_bytes / n / (n_blocks + roots), rlink, rn, coll
                )
    return dp_s, unsharded


def sync_time(shape: StepShape, work: Workload, cluster: Cluster) -> float:
    """The small all-reduces of a step: the gradient norm over sharded dimensions, and under PP the
    norm over stages and the tied embedding's gradient between the first and the last stage."""
    c, layout, coll = shape.config, shape.layout, cluster.collective_overhead_s
    sync_s = 0.0
    if c.world_size == 1:
        return sync_s
    if c.uses_fsdp or c.tp > 1:
        dims = [d for d, v in (("dp_shard", c.dp_shard), ("tp", c.tp)) if v > 1]
        for d in dims:
            link, n = layout.slowest_ring(d)
            sync_s += collective_time("all_reduce", NORM_BYTES, link, n, coll)
    if c.pp > 1:
        link, n = layout.slowest_ring("pp")
        sync_s += collective_time("all_reduce", NORM_BYTES, link, n, coll)
        first, last = stage_rank(c, 0), stage_rank(c, shape.n_stages - 1)
        if first != last:
            tie = (
                work.model.vocab_size * work.model.n_embd * work.param_bytes
            )  # the tied embedding's gradient (not TP-sharded)
            sync_s += collective_time("all_reduce", tie, layout.pp_link(first, last), 2, coll)
    return sync_s


@dataclass
class PipelineTime:
    """The forward and backward of a step's microbatches on the critical path."""

    makespan: float  # seconds from the first forward to the last backward
    compute: float  # of which computing, on the busiest pipeline rank
    tp: float  # TP all-reduces, on the busiest pipeline rank
    p2p: float  # stage-to-stage transfers and the schedule's cost per action
    bubble: float  # idle time of the schedule itself (0 without PP)
    inflight: list[float]  # per pipeline rank: activation bytes at the worst moment


def pipeline_time(shape: StepShape, stages: StageCosts, cluster: Cluster) -> PipelineTime:
    c, chunks, layout = shape.config, shape.chunks, shape.layout
    if c.pp == 1:  # microbatches in a row
        compute = chunks * (stages.comp_f[0] + stages.comp_b[0])
        tp_total = chunks * (stages.tp_f[0] + stages.tp_b[0])
        return PipelineTime(compute + tp_total, compute, tp_total, 0.0, 0.0, [stages.act_bytes[0]])
    n_stages = shape.n_stages
    transfer = {}
    for a in range(c.pp):
        for b in range(c.pp):
            if a != b:
                transfer[(a, b)] = layout.pp_link(a, b).time(shape.act_tensor)  # software costs: in action_s below

    action_s = cluster.pipeline_action_s  # the schedule's own cost per action (measured)

    def run_pipeline(compute_speedup: float):
        fwd = [stages.comp_f[s] / compute_speedup + stages.tp_f[s] for s in range(n_stages)]
        bwd = [stages.comp_b[s] / compute_speedup + stages.tp_b[s] for s in range(n_stages)]
        with_overhead = lambda durations: [d + action_s for d in durations]  # noqa: E731
        return fwd, bwd, simulate(c, with_overhead(fwd), with_overhead(bwd), stages.act_bytes, transfer)

    speedup = 1.0  # of compute, when CPU ranks that share cores sit idle in the pipeline's bubbles
    fwd_s, bwd_s, sim = run_pipeline(speedup)
    for _ in range(SHARED_CPU_ROUNDS):  # a fixed point: faster compute leaves more ranks idle at once
        shared = shared_cpu_speedup(layout.device(0), sum(sim.busy) / (c.pp * sim.makespan))
        if abs(shared - speedup) < SHARED_CPU_TOLERANCE:
            break
        speedup = shared
        fwd_s, bwd_s, sim = run_pipeline(speedup)
    ideal = simulate(c, fwd_s, bwd_s, stages.act_bytes, {k: 0.0 for k in transfer})  # no transfers, no cost per action
    worst = max(range(c.pp), key=lambda r: sim.busy[r])
    on_worst = [s for s in range(n_stages) if shape.stage_pp[s] == worst]
    compute = sum(stages.comp_f[s] + stages.comp_b[s] for s in on_worst) / speedup * chunks
    tp_total = sum(stages.tp_f[s] + stages.tp_b[s] for s in on_worst) * chunks
    return PipelineTime(
        sim.makespan,
        compute,
        tp_total,
        max(0.0, sim.makespan - ideal.makespan),
        max(0.0, ideal.makespan - max(ideal.busy)),
        sim.peak_inflight,
    )


def ddp_buckets(nbytes: float) -> list[float]:
    if nbytes <= DDP_FIRST_BUCKET:
        return [nbytes]
    rest = nbytes - DDP_FIRST_BUCKET
    return (
        [DDP_FIRST_BUCKET] + [DDP_BUCKET] * int(rest // DDP_BUCKET) + ([rest % DDP_BUCKET] if rest % DDP_BUCKET else [])
    )


def optimizer_time(params: float, tensors: int, device, dtensors: bool) -> float:
    """Clipping and AdamW: OPTIMIZER_PASSES fp32 passes over the parameters, plus the host cost per tensor
    the device measured, for plain or DTensor (FSDP, TP) parameters."""
    per_tensor = (dtensors and device.dtensor_optimizer_s_per_tensor) or device.optimizer_s_per_tensor
    host = tensors * per_tensor if per_tensor else OPTIMIZER_OPS_UNMEASURED * device.dispatch_s
    return params * FP32_BYTES * OPTIMIZER_PASSES / device.memory_bandwidth + host


def memory_per_rank(
    shape: StepShape, work: Workload, params: list[float], inflight: list[float], unsharded: list[float]
) -> list[dict[str, float]]:
    """Bytes on each pipeline rank at its peak, by cause."""
    c, chunks, act_tensor = shape.config, shape.chunks, shape.act_tensor
    shard = c.dp_shard if c.uses_fsdp else 1
    # torch.distributed.pipelining keeps, per stage and microbatch for the whole step, a buffer for the
    # received activation and, after backward, its gradient (not on the first stage), and a buffer for
    # the received output gradient (not on the last stage).
    pipe_buffers = [0.0] * c.pp
    if c.pp > 1:
        for s in range(shape.n_stages):
            pipe_buffers[shape.stage_pp[s]] += ((s > 0) * 2 + (s < shape.n_stages - 1)) * chunks * act_tensor
    mems = []
    for r in range(c.pp):
        states = params[r] * work.param_bytes / shard
        logits = shape.rows * work.seq_len * work.model.vocab_size * work.act_bytes
        transient = logits if r == shape.stage_pp[-1] else TEMPORARY_ACTIVATIONS * act_tensor
        mems.append(
            {
                "parameters": states,
                "gradients": states,
                "optimizer": ADAMW_STATES * states,
                "activations": inflight[r],
                "pipeline buffers": pipe_buffers[r],
                "unsharded (FSDP)": unsharded[r],
                "temporaries": transient,
            }
        )
    return mems


# ---------------------------------------------------------------- the estimate


def estimate(cand: Candidate, work: Workload, cluster: Cluster, profile: ModelProfile | None = None) -> Estimate:
    """Predicted memory per device and step time of one plan (see the module docstring)."""
    c = cand.config
    profile = profile or profile_model(work.model, work.seq_len, work.act_bytes)
    shape = step_shape(cand, work, cluster)
    stages = stage_costs(shape, cluster, profile)
    params, tensors = rank_parameters(shape, work, profile)
    dp_s, unsharded = data_parallel_time(shape, work, cluster, profile, params, tensors)
    sync_s = sync_time(shape, work, cluster)
    pipe = pipeline_time(shape, stages, cluster)
    opt_s = [
        optimizer_time(
            params[r] / (c.dp_shard if c.uses_fsdp else 1),
            tensors[r],
            shape.layout.stage_devices(r)[0],
            dtensors=c.uses_fsdp or c.tp > 1,
        )
        for r in range(c.pp)
    ]
    step = pipe.makespan + max(dp_s[r] + opt_s[r] for r in range(c.pp)) + sync_s
    # the step's parts, as they add up on the critical path
    dp_name = "DDP all-reduce" if c.uses_ddp else "FSDP all-gather/reduce-scatter" if c.uses_fsdp else "data-parallel"
    parts = {
        "compute": pipe.compute,
        "TP all-reduce": pipe.tp,
        "PP transfers/schedule": pipe.p2p,
        "pipeline bubble": pipe.bubble,
        dp_name: max(dp_s),
        "optimizer": max(opt_s),
        "norm/tie sync": sync_s,
    }
    parts = {k: v for k, v in parts.items() if v > 0}

    mems = memory_per_rank(shape, work, params, pipe.inflight, unsharded)
    worst_mem = max(mems, key=lambda m: sum(m.values()))
    fits = all(
        sum(mems[r].values()) <= min(d.memory_bytes for d in shape.layout.stage_devices(r)) * RESERVE
        for r in range(c.pp)
    )
    tokens = work.global_batch * work.seq_len
    main = max(parts, key=parts.get)
    return Estimate(
        cand,
        step,
        tokens / step,
        sum(worst_mem.values()),
        fits,
        parts,
        worst_mem,
        main,
        pipe.bubble / step if step else 0.0,
    )
