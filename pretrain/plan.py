"""The strategy planner: every valid parallel plan for a model, batch and cluster, with its predicted
memory per device and step time, ranked.

How it works, top to bottom:

  profile_model()   builds the GPT on the meta device (accelerate's init_empty_weights: no memory, so
                    GPT-2 large costs nothing) and runs one block, the embeddings and the head forward
                    and backward on meta tensors, counting per microbatch: parameters, the bytes
                    autograd saves for backward (activations), the FLOPs of each matmul (torch's FLOP formulas), bytes
                    moved by non-matmul ops and the number of ops. Tensor-parallel shards are traced
                    as the narrower blocks they are.
  enumerate_plans() every (tp, pp, dp) factorisation of the world size, DDP / FSDP / HSDP for the data
                    dimension, every pipeline schedule with its microbatch counts and stages per rank,
                    layer splits balanced by stage cost (uneven on mixed devices), and node orders
                    that differ (placement). Each plan is checked with ParallelConfig.validate, the
                    same check training makes.
  estimate()        per rank: memory = parameters, gradients and AdamW states (sharded by FSDP and
                    TP), FSDP's unsharded buffers, activations of the microbatches the
                    schedule keeps in flight, the pipeline stages' per-microbatch buffers; step time =
                    compute (a roofline: each matmul at the rate the device measured for its size +
                    bytes at its measured rate for them + ops at its measured host cost per op) + the
                    collectives of each dimension over the links their groups cross (ring model; sends
                    that cross between the same two nodes at once share that link's bandwidth) +
                    pipeline transfers, the schedule's measured cost per action and the bubble, from
                    an event simulation of the schedule's real action order (torch's own for
                    multi-stage schedules).
  plan()            drops what does not fit, ranks the rest by step time.

Everything is in bytes and seconds; the table converts.
"""
from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

from common.errors import PipelineError
from pretrain.cluster import Cluster, Link, collective_time, ring_hops
from pretrain.config import ModelConfig, TrainConfig
from pretrain.parallel import MULTI_STAGE_SCHEDULES, SCHEDULES, SINGLE_STAGE_SCHEDULES, ParallelConfig, stage_layers

MB = 2**20
GiB = 2**30
DDP_FIRST_BUCKET = 1 * MB  # torch DDP: the first bucket is small so communication starts early
DDP_BUCKET = 25 * MB
KEEP_FOR_WEIGHT_GRAD = 0.5  # zero-bubble schedules: share of a stage's activations kept from I until W
RESERVE = 0.9  # plans may use this share of a device's memory (allocator fragmentation, runtime)


# ---------------------------------------------------------------- what is trained

@dataclass
class Workload:
    model: ModelConfig
    seq_len: int
    global_batch: int  # sequences per optimizer step
    act_bytes: int = 4  # 2 under bf16 autocast
    param_bytes: int = 4  # fp32 parameters, gradients and AdamW states

    def validate(self) -> None:
        if self.seq_len < 1 or self.global_batch < 1:
            raise PipelineError(f"--seq-len and --global-batch must be positive, got {self.seq_len} and {self.global_batch}")
        if self.seq_len > self.model.block_size:
            raise PipelineError(f"--seq-len {self.seq_len} exceeds the model's block size {self.model.block_size}")
        if self.model.n_embd % self.model.n_head:
            raise PipelineError(f"n_embd {self.model.n_embd} is not divisible by n_head {self.model.n_head}")


@dataclass
class OpCost:
    """Work of a forward or backward pass: the FLOPs of each matmul-like call (their sizes matter: small
    matmuls run far below a device's peak), bytes moved by non-matmul ops, ops dispatched, and those of
    them on DTensors (tensor parallelism's extra host cost)."""
    matmuls: tuple[float, ...] = ()  # FLOPs per call
    bytes: float = 0.0
    ops: float = 0.0
    dtensor_ops: float = 0.0

    @property
    def flops(self) -> float:
        return sum(self.matmuls)

    def for_rows(self, rows: int) -> "OpCost":
        """This per-sequence cost for a microbatch of `rows` sequences: each matmul and the bytes scale,
        op counts do not."""
        return OpCost(tuple(f * rows for f in self.matmuls), self.bytes * rows, self.ops, self.dtensor_ops)

    def __add__(self, other: "OpCost") -> "OpCost":
        return OpCost(self.matmuls + other.matmuls, self.bytes + other.bytes, self.ops + other.ops, self.dtensor_ops + other.dtensor_ops)


@dataclass
class PartProfile:
    """One part of the model (a block sharded over tp ranks, the embeddings, the head + loss) for a
    microbatch of `rows` sequences."""
    params: int  # held by one rank
    fwd: OpCost
    bwd: OpCost
    saved_bytes: float  # activations kept for backward


# ---------------------------------------------------------------- tracing on the meta device

def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and returns[0].alias_info is not None


class _Counter:
    """A TorchDispatchMode that counts ops, the FLOPs of each matmul-like call (torch's FLOP formulas)
    and the bytes non-matmul ops read and write."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                counter.ops += 1
                if func.overloadpacket in flop_registry:
                    counter.matmuls.append(float(flop_registry[func.overloadpacket](*args, **kwargs, out_val=out)))
                elif not _is_view(func):
                    import torch
                    from torch.utils._pytree import tree_leaves

                    counter.bytes += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor))
                return out

        self.mode = Mode()
        self.ops, self.bytes, self.matmuls = 0, 0, []

    def cost(self) -> "OpCost":
        return OpCost(tuple(self.matmuls), self.bytes, self.ops)


def _trace(module, make_input, loss_fn, act_dtype, seq_len: int) -> tuple[OpCost, OpCost, float]:
    """Forward and backward of `module` on meta tensors: (fwd cost, bwd cost, saved activation bytes).

    Meta tensors take scaled_dot_product_attention's math path, which saves the (seq × seq) attention
    matrix; the fused kernels training uses on CPU and GPU save one logsumexp per row instead, so such
    saved tensors are counted at that size."""
    import torch

    params = {p.untyped_storage()._cdata for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in params:
            nbytes = t.untyped_storage().nbytes()
            if t.dim() >= 2 and t.shape[-1] == seq_len and t.shape[-2] == seq_len and seq_len > 1:
                nbytes //= seq_len
            saved[key] = max(saved.get(key, 0), nbytes)
        return t

    x = make_input()
    counter = _Counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with counter.mode:
            out = module(x)
            loss = loss_fn(out)
    counter_b = _Counter()
    with counter_b.mode:
        loss.backward()
    fwd, bwd = counter.cost(), counter_b.cost()
    return fwd, bwd, float(sum(saved.values()))


def _sharded_block(model_cfg: ModelConfig, tp: int):
    """One transformer block as a tensor-parallel rank holds it: n_head/tp heads, 4d/tp MLP units."""
    import torch.nn as nn

    from pretrain.model import Block

    d = model_cfg.n_embd
    block = Block(model_cfg)
    if tp > 1:
        attn, mlp = block.attn, block.mlp
        attn.q_proj, attn.k_proj, attn.v_proj = (nn.Linear(d, d // tp) for _ in range(3))
        attn.out_proj = nn.Linear(d // tp, d)
        mlp.fc_in, mlp.fc_out = nn.Linear(d, 4 * d // tp), nn.Linear(4 * d // tp, d)
    return block


@dataclass
class ModelProfile:
    """What the cost model needs to know about the model, per microbatch row (sequence)."""
    cfg: ModelConfig
    seq_len: int
    act_bytes: int
    total_params: int
    block_params: int
    block_tp_sharded: int  # of block_params, those split by tensor parallelism
    block_tensors: int  # parameter tensors in a block (the optimizer's host cost is per tensor)
    embed_params: int  # token + position embeddings
    head_params: int  # final LayerNorm + lm_head (the tied weight counted again: a last stage holds a copy)
    _traces: dict = field(default_factory=dict)

    def block(self, tp: int) -> PartProfile:
        return self._part("block", tp)

    def embed(self) -> PartProfile:
        return self._part("embed", 1)

    def head(self) -> PartProfile:
        return self._part("head", 1)

    def _part(self, kind: str, tp: int) -> PartProfile:
        """Per microbatch row: traced once per (kind, tp) at one sequence (all costs are linear in rows
        except op counts, which are per microbatch)."""
        key = (kind, tp)
        if key not in self._traces:
            self._traces[key] = _trace_part(self.cfg, self.seq_len, kind, tp, self.act_bytes)
        return self._traces[key]

    def block_params_on_rank(self, tp: int) -> float:
        return self.block_tp_sharded / tp + (self.block_params - self.block_tp_sharded)


def _trace_part(cfg: ModelConfig, seq_len: int, kind: str, tp: int, act_bytes: int) -> PartProfile:
    import torch
    from accelerate import init_empty_weights

    from pretrain.model import GPT, lm_loss

    dtype = torch.bfloat16 if act_bytes == 2 else torch.float32
    with init_empty_weights():
        if kind == "block":
            module = _sharded_block(cfg, tp)
        else:
            module = GPT(replace(cfg, n_layer=0))
            if kind == "embed":
                module.ln_f = module.lm_head = None
            else:
                module.tok_emb = module.pos_emb = None
    module = module.to(dtype)
    d = cfg.n_embd
    if kind == "embed":
        fwd, bwd, saved = _trace(module, lambda: torch.zeros(1, seq_len, dtype=torch.long, device="meta"),
                                 lambda out: out.float().sum(), dtype, seq_len)
    elif kind == "head":
        target = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
        fwd, bwd, saved = _trace(module, lambda: torch.zeros(1, seq_len, d, device="meta", dtype=dtype, requires_grad=True),
                                 lambda out: lm_loss(out, target), dtype, seq_len)
    else:
        fwd, bwd, saved = _trace(module, lambda: torch.zeros(1, seq_len, d, device="meta", dtype=dtype, requires_grad=True),
                                 lambda out: out.float().sum(), dtype, seq_len)
        if tp > 1:  # the six sharded linears run on DTensors: about 3 ops each forward, 4 backward
            fwd.dtensor_ops, bwd.dtensor_ops = 18, 24
    params = sum(p.numel() for p in module.parameters())
    return PartProfile(params, fwd, bwd, saved)


@functools.lru_cache(maxsize=32)
def _profile_cached(cfg_items: tuple, seq_len: int, act_bytes: int) -> ModelProfile:
    from accelerate import init_empty_weights

    from pretrain.model import GPT

    cfg = ModelConfig(**dict(cfg_items))
    with init_empty_weights():
        model = GPT(cfg)
        block = model.layers["0"] if cfg.n_layer else None
    block_params = sum(p.numel() for p in block.parameters()) if block is not None else 0
    sharded = 0
    if block is not None:
        for name, p in block.named_parameters():
            # column-split q/k/v/fc_in (weights and biases), row-split out_proj/fc_out weights
            if any(k in name for k in ("q_proj", "k_proj", "v_proj", "fc_in")) or name.endswith(("out_proj.weight", "fc_out.weight")):
                sharded += p.numel()
    embed = cfg.vocab_size * cfg.n_embd + cfg.block_size * cfg.n_embd
    head = 2 * cfg.n_embd + cfg.vocab_size * cfg.n_embd
    # Not model.num_params(): init_empty_weights re-creates a parameter when it is assigned, which unties
    # lm_head from tok_emb on the meta device. The tied weight counts once.
    total = cfg.n_layer * block_params + embed + 2 * cfg.n_embd
    block_tensors = len(list(block.parameters())) if block is not None else 0
    return ModelProfile(cfg, seq_len, act_bytes, total, block_params, sharded, block_tensors, embed, head)


def profile_model(cfg: ModelConfig, seq_len: int, act_bytes: int = 4) -> ModelProfile:
    """The model's profile, built on the meta device (cached: planning many plans traces each part once)."""
    return _profile_cached(tuple(sorted(asdict(cfg).items())), seq_len, act_bytes)


# ---------------------------------------------------------------- candidates

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
        return {"plan": self.label, "config": self.candidate.config.to_dict(), "grad_accum": self.candidate.grad_accum,
                "node_order": list(self.candidate.node_order), "step_s": self.step_s, "tokens_per_s": self.tokens_per_s,
                "memory_mb": self.memory_bytes / MB, "fits": self.fits, "main_cost": self.main_cost,
                "bubble_fraction": self.bubble_fraction,
                "time_s": self.time_parts, "memory_parts_mb": {k: v / MB for k, v in self.memory_parts.items()}}


def _divisors(n: int) -> list[int]:
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


def enumerate_plans(world: int, work: Workload, cluster: Cluster | None = None, space: SearchSpace | None = None) -> list[Candidate]:
    """Every plan for `world` ranks that training accepts (ParallelConfig.validate)."""
    space = space or SearchSpace()
    cfg = work.model
    plans: list[Candidate] = []
    for tp in _divisors(world):
        if cfg.n_head % tp:
            continue
        for pp in _divisors(world // tp):
            if pp > cfg.n_layer:
                continue
            dp = world // (tp * pp)
            if work.global_batch % dp:
                continue
            local = work.global_batch // dp
            for data in _data_variants(dp, tp, pp, space):
                for pipe in _pipe_variants(pp, local, cfg.n_layer, space):
                    for ga in ([1] + ([g for g in _divisors(local) if g > 1 and g <= 8] if space.grad_accum and pp == 1 else [])):
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
        variants += [dict(dp_replicate=r, dp_shard=dp // r) for r in _divisors(dp) if 1 < r < dp]
    return variants


def _pipe_variants(pp: int, local: int, n_layer: int, space: SearchSpace) -> list[dict]:
    if pp == 1:
        return [dict()]
    out = []
    counts = [m for m in _divisors(local) if pp // 2 <= m <= pp * space.max_microbatch_factor and m >= 2]
    for schedule in space.schedules:
        for m in counts:
            if schedule in SINGLE_STAGE_SCHEDULES:
                out.append(dict(pp_schedule=schedule, microbatches=m))
            else:
                for v in ((2,) if schedule == "zbv" else space.stages_per_rank):
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
        if len(orders) >= 24:
            break
    return orders


# ---------------------------------------------------------------- ranks, groups, links

class Layout:
    """Where each mesh coordinate runs: global ranks in torchrun order under a node order."""

    def __init__(self, config: ParallelConfig, cluster: Cluster, node_order: tuple[int, ...]):
        self.c, self.cluster = config, cluster
        order = node_order or tuple(range(len(cluster.nodes)))
        # devices in job-rank order: nodes in `order`, each node's devices consecutively
        self.device_of_rank = [i for k in order for i, d in enumerate(cluster.devices) if d.node == k]
        self.shape = (config.pp, config.dp_replicate, config.dp_shard, config.tp)

    def rank(self, pp: int, rep: int, shard: int, tp: int) -> int:
        _, r, s, t = self.shape
        return ((pp * r + rep) * s + shard) * t + tp

    def device(self, rank: int):
        return self.cluster.devices[self.device_of_rank[rank]]

    def coords(self):
        return itertools.product(*(range(n) for n in self.shape))

    def group(self, dim: str, coord: tuple[int, int, int, int]) -> list[int]:
        """The device indices of the group along `dim` through `coord`."""
        i = ("pp", "dp_replicate", "dp_shard", "tp").index(dim)
        ranks = []
        for k in range(self.shape[i]):
            c = list(coord)
            c[i] = k
            ranks.append(self.device_of_rank[self.rank(*c)])
        return ranks

    def slowest_ring(self, dim: str) -> tuple[Link, int]:
        """The slowest ring hop over all groups along `dim` (they run their collectives at the same time),
        and the group size."""
        groups = list({tuple(self.group(dim, c)): None for c in self.coords()})
        hops = [hop for g in groups for hop in ring_hops(list(g))]
        return (self._concurrent(hops) if hops else Link(0.0, float("inf"))), len(groups[0])

    def pp_link(self, a: int, b: int) -> Link:
        """The slowest link between pipeline ranks a and b over all their dp/tp coordinates (every
        replica sends at the same time)."""
        return self._concurrent([(self.device_of_rank[self.rank(a, r, s, t)], self.device_of_rank[self.rank(b, r, s, t)])
                                 for p, r, s, t in self.coords() if p == 0])

    def _concurrent(self, hops: list[tuple[int, int]]) -> Link:
        """The slowest of device-to-device sends made at the same time. Where the cluster's links are
        shared (a real network), the sends crossing between the same two nodes in the same direction
        split that link's bandwidth."""
        node = lambda d: self.cluster.devices[d].node  # noqa: E731
        flows = Counter((node(a), node(b)) for a, b in hops if node(a) != node(b)) if self.cluster.shared_links else Counter()
        links = [self.cluster.link(a, b) for a, b in hops]
        return Link(max(link.latency_s for link in links),
                    min(link.bandwidth_Bps / max(1, flows[(node(a), node(b))]) for link, (a, b) in zip(links, hops)))

    def stage_devices(self, p: int) -> list:
        return [self.device(self.rank(p, r, s, t)) for _, r, s, t in self.coords() if _ == 0]


def compute_time(cost: OpCost, device, dtensor_s: float) -> float:
    """Roofline: each matmul at the device's rate for its size, other ops' bytes at the rate it measured
    for them, ops at its host cost per op."""
    return (sum(device.matmul_time(f) for f in cost.matmuls) + cost.bytes / device.elementwise_bandwidth
            + cost.ops * device.dispatch_s + cost.dtensor_ops * dtensor_s)


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


# ---------------------------------------------------------------- pipeline simulation

def stage_rank(config: ParallelConfig, stage: int) -> int:
    p = config.pp
    if config.pp_schedule == "zbv":
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


def schedule_order(config: ParallelConfig) -> dict[int, list[tuple[str, int, int]]]:
    """Per pipeline rank, its actions in order: (kind F/B/I/W, stage, microbatch). Single-stage schedules
    are written out here as torch runs them; multi-stage ones come from torch's own schedule classes."""
    p, m = config.pp, config.n_microbatches
    if config.pp_schedule == "gpipe":
        return {r: [("F", r, j) for j in range(m)] + [("B", r, j) for j in range(m)] for r in range(p)}
    if config.pp_schedule == "1f1b":
        order = {}
        for r in range(p):
            warmup = min(m, p - r)
            ops = [("F", r, j) for j in range(warmup)]
            for j in range(m - warmup):
                ops += [("B", r, j), ("F", r, warmup + j)]
            ops += [("B", r, j) for j in range(m - warmup, m)]
            order[r] = ops
        return order
    return _torch_order(config.pp_schedule, p, config.n_stages_per_rank, m)


@functools.lru_cache(maxsize=256)
def _torch_order(schedule: str, p: int, v: int, m: int) -> dict[int, list[tuple[str, int, int]]]:
    from torch.distributed.pipelining import schedules as S

    cls = {"interleaved-1f1b": S.ScheduleInterleaved1F1B, "looped-bfs": S.ScheduleLoopedBFS,
           "zero-bubble": S.ScheduleInterleavedZeroBubble, "zbv": S.ScheduleZBVZeroBubble}[schedule]
    # The action orders are computed from a handful of attributes, without stages or a process group.
    obj = cls.__new__(cls)
    obj.pp_group_size, obj.n_local_stages, obj._n_microbatches = p, v, m
    obj._num_stages = obj.num_stages = p * v
    obj._stages = [None] * v
    obj.number_of_rounds = max(1, m // p)
    obj.microbatches_per_round = m // obj.number_of_rounds
    obj.pipeline_order = {r: obj._calculate_single_rank_operations(r) for r in range(p)}
    if cls is S.ScheduleInterleavedZeroBubble:
        obj.pipeline_order = obj._add_bubbles_to_actions(v * p)
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}
    return {r: [(kinds[a.computation_type.name], a.stage_index, a.microbatch_index) for a in ops if a is not None]
            for r, ops in obj.pipeline_order.items()}


@dataclass
class SimResult:
    makespan: float
    busy: list[float]  # per pipeline rank
    peak_inflight: list[float]  # per pipeline rank: activation bytes at the worst moment


def simulate(config: ParallelConfig, fwd: list[float], bwd: list[float], act: list[float],
             transfer: dict[tuple[int, int], float]) -> SimResult:
    """Run the schedule's action order on a clock: each rank does its actions in order, each starting
    when the rank is free and its inputs have arrived (the previous stage's output plus the transfer
    time between their ranks). fwd/bwd/act are per stage; transfer[(rank_a, rank_b)] per microbatch."""
    order = schedule_order(config)
    n_stages = len(fwd)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * config.pp
    busy = [0.0] * config.pp
    pos = [0] * config.pp
    duration = {"F": lambda s: fwd[s], "B": lambda s: bwd[s], "I": lambda s: bwd[s] * 0.5, "W": lambda s: bwd[s] * 0.5}

    def hop(s_from: int, s_to: int) -> float:
        a, b = stage_rank(config, s_from), stage_rank(config, s_to)
        return 0.0 if a == b else transfer[(a, b)]

    def ready(kind: str, s: int, j: int) -> float | None:
        if kind == "F":
            if s == 0:
                return 0.0
            t = done.get(("F", s - 1, j))
            return None if t is None else t + hop(s - 1, s)
        if kind == "W":
            return done.get(("I", s, j))
        own = done.get(("F", s, j))
        if own is None:
            return None
        if s == n_stages - 1:
            return own
        nxt = done.get(("B", s + 1, j), done.get(("I", s + 1, j)))
        return None if nxt is None else max(own, nxt + hop(s + 1, s))

    remaining = sum(len(v) for v in order.values())
    while remaining:
        progressed = False
        for r in range(config.pp):
            while pos[r] < len(order[r]):
                kind, s, j = order[r][pos[r]]
                t = ready(kind, s, j)
                if t is None:
                    break
                start = max(free[r], t)
                free[r] = start + duration[kind](s)
                busy[r] += duration[kind](s)
                done[(kind, s, j)] = free[r]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"pipeline simulation of {config.pp_schedule} is stuck")  # a bug, not bad input
    peaks = []
    for r in range(config.pp):
        live = peak = 0.0
        for kind, s, _ in order[r]:
            live += {"F": act[s], "B": -act[s], "I": -act[s] * (1 - KEEP_FOR_WEIGHT_GRAD), "W": -act[s] * KEEP_FOR_WEIGHT_GRAD}[kind]
            peak = max(peak, live)
        peaks.append(peak)
    return SimResult(max(free), busy, peaks)


# ---------------------------------------------------------------- the estimate

def balanced_split(config: ParallelConfig, n_layer: int, layer_s: list[float], extra_s: list[float]) -> list[int]:
    """Layers per stage minimising the slowest stage: stage s costs layers × layer_s[s] + extra_s[s]
    (embeddings, head, a slower device). Greedy is optimal here: each layer goes where it adds least."""
    n = config.num_stages
    layers = [1] * n
    for _ in range(n_layer - n):
        best = min(range(n), key=lambda s: ((layers[s] + 1) * layer_s[s] + extra_s[s], s))
        layers[best] += 1
    return layers


def stage_compute(c: ParallelConfig, s: int, layout: Layout, cluster: Cluster, profile: ModelProfile,
                  rows: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Seconds per microbatch of `rows` sequences on stage s's slowest device: (forward, backward) of one
    of its layers, and of its other parts (the embeddings on the first stage, the head on the last)."""
    device = min(layout.stage_devices(stage_rank(c, s) if c.pp > 1 else 0), key=lambda d: d.flops)
    seconds = lambda cost: compute_time(cost.for_rows(rows), device, cluster.dtensor_overhead(0))  # noqa: E731
    block = profile.block(c.tp)
    others = ([profile.embed()] if s == 0 else []) + ([profile.head()] if s == c.num_stages - 1 else [])
    return ((seconds(block.fwd), seconds(block.bwd)),
            (sum(seconds(part.fwd) for part in others), sum(seconds(part.bwd) for part in others)))


def estimate(cand: Candidate, work: Workload, cluster: Cluster, profile: ModelProfile | None = None) -> Estimate:
    """Predicted memory per device and step time of one plan (see the module docstring)."""
    c = cand.config
    profile = profile or profile_model(work.model, work.seq_len, work.act_bytes)
    layout = Layout(c, cluster, cand.node_order)
    cfg, pb = work.model, work.param_bytes
    local_rows = work.global_batch // c.dp
    chunks = c.n_microbatches if c.pp > 1 else cand.grad_accum
    rows = local_rows // chunks  # sequences per microbatch
    block, embed, head = profile.block(c.tp), profile.embed(), profile.head()
    act_tensor = rows * work.seq_len * cfg.n_embd * work.act_bytes  # what crosses a stage boundary or a TP all-reduce

    # --- layers per stage, and each stage's parts
    n_stages = c.num_stages
    split = stage_layers(c, cfg.n_layer) if c.pp > 1 else [cfg.n_layer]  # --pp-split, or even
    stage_pp = [stage_rank(c, s) if c.pp > 1 else 0 for s in range(n_stages)]
    tp_link, tp_n = layout.slowest_ring("tp") if c.tp > 1 else (Link(0, float("inf")), 1)
    coll = cluster.collective_overhead_s

    def tp_comm(direction: str) -> float:  # per block per microbatch: 2 all-reduces forward, 4 backward (q, k, v, fc_in inputs)
        n_ar = 2 if direction == "fwd" else 4
        return n_ar * collective_time("all_reduce", act_tensor, tp_link, tp_n, coll) if c.tp > 1 else 0.0

    # per stage and microbatch: compute forward / backward, TP all-reduces forward / backward, saved activations
    comp_f, comp_b, tp_f, tp_b, act_bytes = [], [], [], [], []
    for s in range(n_stages):
        (layer_f, layer_b), (other_f, other_b) = stage_compute(c, s, layout, cluster, profile, rows)
        a = split[s] * block.saved_bytes * rows
        a += embed.saved_bytes * rows if s == 0 else 0.0
        a += head.saved_bytes * rows if s == n_stages - 1 else 0.0
        comp_f.append(split[s] * layer_f + other_f)
        comp_b.append(split[s] * layer_b + other_b)
        tp_f.append(split[s] * tp_comm("fwd"))
        tp_b.append(split[s] * tp_comm("bwd"))
        act_bytes.append(a)

    # --- parameters (before data-parallel sharding) and parameter tensors on each pipeline rank
    params_pp, tensors_pp = [0.0] * c.pp, [0] * c.pp
    for s in range(n_stages):
        p = split[s] * profile.block_params_on_rank(c.tp)
        p += profile.embed_params if s == 0 else 0
        p += profile.head_params if s == n_stages - 1 else 0
        params_pp[stage_pp[s]] += p
        tensors_pp[stage_pp[s]] += split[s] * profile.block_tensors + (2 if s == 0 else 0) + (3 if s == n_stages - 1 else 0)
    if c.pp == 1:
        params_pp = [cfg.n_layer * profile.block_params_on_rank(c.tp) + profile.embed_params + 2 * cfg.n_embd]  # head tied
        tensors_pp = [cfg.n_layer * profile.block_tensors + 4]  # token + position embeddings, final LayerNorm

    # --- data-parallel communication per step, on the slowest data-parallel ring
    dp_s = [0.0] * c.pp
    unsharded_extra = [0.0] * c.pp
    units = [split[s] for s in range(n_stages)]
    for r in range(c.pp):
        full_bytes = params_pp[r] * pb
        if c.uses_ddp:
            link, n = layout.slowest_ring("dp_replicate")
            buckets = _ddp_buckets(full_bytes)
            dp_s[r] = sum(collective_time("all_reduce", b, link, n, coll) for b in buckets)  # gradients are bucket views: no copy
        elif c.uses_fsdp:
            link, n = layout.slowest_ring("dp_shard")
            local_stages = [s for s in range(n_stages) if stage_pp[s] == r]
            n_blocks = sum(units[s] for s in local_stages)
            root = full_bytes - n_blocks * profile.block_params_on_rank(c.tp) * pb  # embeddings / head not in blocks
            block_b = profile.block_params_on_rank(c.tp) * pb
            ag = lambda nbytes: collective_time("all_gather", nbytes, link, n, coll)  # noqa: E731
            rs = lambda nbytes: collective_time("reduce_scatter", nbytes, link, n, coll)  # noqa: E731
            roots = len(local_stages)
            # FSDP's host work per parameter tensor (copies in and out of the collectives, hooks, DTensor
            # wrapping), measured for a unit gathered twice and reduced once, and for one kept gathered
            device = layout.stage_devices(r)[0]
            host, host_gathered = device.fsdp_s_per_tensor * tensors_pp[r], device.fsdp_gathered_s_per_tensor * tensors_pp[r]
            if c.pp == 1:  # resharded after forward: blocks are gathered again for backward, every microbatch
                per_mb = n_blocks * (2 * ag(block_b) + rs(block_b)) + ag(root) + rs(root) + host
                dp_s[r] = chunks * per_mb
                # at the peak, the end of forward: the root's parameters and two blocks gathered (the one
                # running, the one prefetched); unsharded gradients come as activations are freed
                unsharded_extra[r] = root + 2 * block_b
            else:  # kept gathered through the step; gradients reduced once, after the last microbatch
                dp_s[r] = (n_blocks * (ag(block_b) + rs(block_b)) + roots * (ag(root / roots) + rs(root / roots))
                           + host * 2 / 3 + chunks * host_gathered)
                unsharded_extra[r] = 2 * full_bytes  # gathered parameters and unsharded gradients
            if c.dp_replicate > 1:
                rlink, rn = layout.slowest_ring("dp_replicate")
                dp_s[r] += (n_blocks + roots) * collective_time("all_reduce", full_bytes / n / (n_blocks + roots), rlink, rn, coll)

    # --- the step: pipeline makespan (or microbatches in a row), then gradient sync, clipping, optimizer
    sync_s = 0.0  # small all-reduces of the gradient norm and (PP) the tied embedding
    if c.world_size > 1:
        if c.uses_fsdp or c.tp > 1:
            dims = [d for d, v in (("dp_shard", c.dp_shard), ("tp", c.tp)) if v > 1]
            for d in dims:
                link, n = layout.slowest_ring(d)
                sync_s += collective_time("all_reduce", 4, link, n, coll)
        if c.pp > 1:
            link, n = layout.slowest_ring("pp")
            sync_s += collective_time("all_reduce", 4, link, n, coll)
            first, last = stage_rank(c, 0), stage_rank(c, n_stages - 1)
            if first != last:
                tie = cfg.vocab_size * cfg.n_embd * pb  # the tied embedding's gradient (not TP-sharded)
                sync_s += collective_time("all_reduce", tie, layout.pp_link(first, last), 2, coll)
    bubble = 0.0
    if c.pp > 1:
        transfer = {}
        for a in range(c.pp):
            for b in range(c.pp):
                if a != b:
                    transfer[(a, b)] = layout.pp_link(a, b).time(act_tensor)  # software costs: in action_s below

        action_s = cluster.pipeline_action_s  # the schedule's own cost per action (measured)

        def run_pipeline(compute_speedup: float):
            fwd = [comp_f[s] / compute_speedup + tp_f[s] for s in range(n_stages)]
            bwd = [comp_b[s] / compute_speedup + tp_b[s] for s in range(n_stages)]
            with_overhead = lambda durations: [d + action_s for d in durations]  # noqa: E731
            return fwd, bwd, simulate(c, with_overhead(fwd), with_overhead(bwd), act_bytes, transfer)

        speedup = 1.0  # of compute, when CPU ranks that share cores sit idle in the pipeline's bubbles
        fwd_s, bwd_s, sim = run_pipeline(speedup)
        for _ in range(4):  # a fixed point: faster compute leaves more ranks idle at once
            shared = shared_cpu_speedup(layout.device(0), sum(sim.busy) / (c.pp * sim.makespan))
            if abs(shared - speedup) < 0.01:
                break
            speedup = shared
            fwd_s, bwd_s, sim = run_pipeline(speedup)
        ideal = simulate(c, fwd_s, bwd_s, act_bytes, {k: 0.0 for k in transfer})
        pipe_s = sim.makespan
        worst = max(range(c.pp), key=lambda r: sim.busy[r])
        on_worst = [s for s in range(n_stages) if stage_pp[s] == worst]
        compute = sum(comp_f[s] + comp_b[s] for s in on_worst) / speedup * chunks
        tp_total = sum(tp_f[s] + tp_b[s] for s in on_worst) * chunks
        p2p = max(0.0, sim.makespan - ideal.makespan)
        bubble = max(0.0, ideal.makespan - max(ideal.busy))
        inflight = sim.peak_inflight
    else:
        compute = chunks * (comp_f[0] + comp_b[0])
        tp_total = chunks * (tp_f[0] + tp_b[0])
        pipe_s = compute + tp_total
        p2p = 0.0
        inflight = [act_bytes[0]]
    opt_s = [_optimizer_time(params_pp[r] / (c.dp_shard if c.uses_fsdp else 1), tensors_pp[r], layout.stage_devices(r)[0],
                             dtensors=c.uses_fsdp or c.tp > 1) for r in range(c.pp)]
    step = pipe_s + max(dp_s[r] + opt_s[r] for r in range(c.pp)) + sync_s
    # the step's parts, as they add up on the critical path
    dp_name = "DDP all-reduce" if c.uses_ddp else "FSDP all-gather/reduce-scatter" if c.uses_fsdp else "data-parallel"
    parts = {"compute": compute, "TP all-reduce": tp_total, "PP transfers/schedule": p2p, "pipeline bubble": bubble,
             dp_name: max(dp_s), "optimizer": max(opt_s), "norm/tie sync": sync_s}
    parts = {k: v for k, v in parts.items() if v > 0}

    # --- memory on each pipeline rank; the report is the largest
    shard = c.dp_shard if c.uses_fsdp else 1
    # torch.distributed.pipelining keeps, per stage and microbatch for the whole step, a buffer for the
    # received activation and, after backward, its gradient (not on the first stage), and a buffer for
    # the received output gradient (not on the last stage).
    pipe_buffers = [0.0] * c.pp
    if c.pp > 1:
        for s in range(n_stages):
            pipe_buffers[stage_pp[s]] += ((s > 0) * 2 + (s < n_stages - 1)) * chunks * act_tensor
    mems = []
    for r in range(c.pp):
        states = params_pp[r] * pb / shard
        transient = rows * work.seq_len * cfg.vocab_size * work.act_bytes if (r == stage_pp[-1]) else 2 * act_tensor
        mem = {"parameters": states, "gradients": states, "optimizer": 2 * states,
               "activations": inflight[r], "pipeline buffers": pipe_buffers[r],
               "unsharded (FSDP)": unsharded_extra[r], "temporaries": transient}
        mems.append(mem)
    worst_mem = max(mems, key=lambda m: sum(m.values()))
    memory = sum(worst_mem.values())
    fits = all(sum(mems[r].values()) <= min(d.memory_bytes for d in layout.stage_devices(r)) * RESERVE for r in range(c.pp))
    tokens = work.global_batch * work.seq_len
    main = max(parts, key=parts.get)
    return Estimate(cand, step, tokens / step, memory, fits, parts, worst_mem, main, bubble / step if step else 0.0)


def _ddp_buckets(nbytes: float) -> list[float]:
    if nbytes <= DDP_FIRST_BUCKET:
        return [nbytes]
    rest = nbytes - DDP_FIRST_BUCKET
    return [DDP_FIRST_BUCKET] + [DDP_BUCKET] * int(rest // DDP_BUCKET) + ([rest % DDP_BUCKET] if rest % DDP_BUCKET else [])


def _optimizer_time(params: float, tensors: int, device, dtensors: bool) -> float:
    """Clipping and AdamW: about 16 fp32 passes over the parameters, plus the host cost per tensor the
    device measured, for plain or DTensor (FSDP, TP) parameters (without a measurement: ~40 ops in all,
    as fused multi-tensor kernels take)."""
    per_tensor = (dtensors and device.dtensor_optimizer_s_per_tensor) or device.optimizer_s_per_tensor
    host = tensors * per_tensor if per_tensor else 40 * device.dispatch_s
    return params * 4 * 16 / device.memory_bandwidth + host


# ---------------------------------------------------------------- planning

@dataclass
class PlanResult:
    ranked: list[Estimate]  # fitting plans, fastest first
    rejected: list[Estimate]  # plans that do not fit
    cluster: Cluster
    work: Workload

    def to_dict(self) -> dict:
        return {"cluster": self.cluster.describe(), "cluster_source": self.cluster.source, "world_size": self.cluster.world_size,
                "plans": [e.to_dict() for e in self.ranked], "rejected": len(self.rejected)}


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
        raise PipelineError(f"the model fits no plan on {world} device(s): the smallest plan ({least.label}) needs "
                            f"{least.memory_bytes / GiB:.2f} GiB per device, the devices have {device.memory_bytes / GiB:.2f} GiB "
                            f"(usable {RESERVE:.0%}); use more devices, a smaller --global-batch or --seq-len, or a smaller model")
    return PlanResult(ranked, rejected, cluster, work)


def _balanced(est: Estimate, work: Workload, cluster: Cluster, profile: ModelProfile) -> Estimate:
    """For a pipeline plan with an even split, try the split balanced by stage cost; keep the faster."""
    c = est.candidate.config
    if c.pp == 1 or c.pp_split:
        return est
    layout = Layout(c, cluster, est.candidate.node_order)
    rows = work.global_batch // c.dp // c.n_microbatches
    stages = [stage_compute(c, s, layout, cluster, profile, rows) for s in range(c.num_stages)]
    split = balanced_split(c, work.model.n_layer, [sum(layer) for layer, _ in stages], [sum(other) for _, other in stages])
    if split == stage_layers(c, work.model.n_layer):
        return est
    other = estimate(replace(est.candidate, config=replace(c, pp_split=split)), work, cluster, profile)
    if other.fits and (other.step_s < est.step_s * 0.99 or not est.fits):
        return other
    return est


def _first_devices(cluster: Cluster, n: int) -> Cluster:
    keep = list(range(n))
    devices = [cluster.devices[i] for i in keep]
    nodes_used = sorted({d.node for d in devices})
    remap = {k: i for i, k in enumerate(nodes_used)}
    devices = [replace(d, node=remap[d.node]) for d in devices]
    return replace(cluster, devices=devices, nodes=[cluster.nodes[k] for k in nodes_used],
                   latency_s=[row[:n] for row in cluster.latency_s[:n]], bandwidth_Bps=[row[:n] for row in cluster.bandwidth_Bps[:n]])


def _no_plan_reason(world: int, work: Workload) -> str:
    cfg = work.model
    dps = [world // (tp * pp) for tp in _divisors(world) if cfg.n_head % tp == 0 for pp in _divisors(world // tp) if pp <= cfg.n_layer]
    if not any(work.global_batch % dp == 0 for dp in dps):
        return (f"--global-batch {work.global_batch} cannot be divided among the data-parallel degrees a plan for {world} "
                f"devices can have ({', '.join(map(str, sorted(set(dps))))}); use a multiple of one of them")
    return f"no valid plan for {world} devices with {cfg.n_head} heads, {cfg.n_layer} layers and global batch {work.global_batch}"


def check_degrees(world: int, dp: int | None, tp: int | None, pp: int | None) -> None:
    """Degrees given by hand must multiply to the world size."""
    given = {k: v for k, v in dict(dp=dp, tp=tp, pp=pp).items() if v is not None}
    for k, v in given.items():
        if v < 1:
            raise PipelineError(f"--{k} must be positive, got {v}")
    if len(given) == 3 and dp * tp * pp != world:
        raise PipelineError(f"--dp {dp} × --tp {tp} × --pp {pp} = {dp * tp * pp}, not the world size {world}")
    product = math.prod(given.values()) if given else 1
    if world % product:
        raise PipelineError(f"the degrees given ({' × '.join(f'{k}={v}' for k, v in given.items())} = {product}) do not divide the world size {world}")


def filter_degrees(result: PlanResult, dp: int | None, tp: int | None, pp: int | None) -> PlanResult:
    keep = [e for e in result.ranked if all(v is None or getattr(e.candidate.config, k) == v for k, v in dict(dp=dp, tp=tp, pp=pp).items())]
    if not keep:
        raise PipelineError("no plan that fits has the degrees given (--dp/--tp/--pp)")
    return replace(result, ranked=keep)


# ---------------------------------------------------------------- output

def table_rows(result: PlanResult, top: int) -> list[list[str]]:
    rows = []
    for i, e in enumerate(result.ranked[:top], 1):
        parts = sorted(e.time_parts.items(), key=lambda kv: -kv[1])
        share = ", ".join(f"{k} {v / e.step_s:.0%}" for k, v in parts[:2])
        rows.append([str(i), e.label, f"{e.step_s * 1e3:,.1f}", f"{e.tokens_per_s:,.0f}", f"{e.memory_bytes / MB:,.1f}", share])
    return rows


def why(e: Estimate, result: PlanResult) -> str:
    """One line: why this plan was picked."""
    runner = result.ranked[1] if len(result.ranked) > 1 else None
    text = (f"predicted {e.step_s * 1e3:,.1f} ms/step, {e.tokens_per_s:,.0f} tokens/s, {e.memory_bytes / MB:,.1f} MiB per device; "
            f"main cost {e.main_cost} ({e.time_parts[e.main_cost] / e.step_s:.0%})")
    if runner is not None:
        text += f"; {runner.step_s / e.step_s:.2f}× faster than the next ({runner.label})"
    return text
