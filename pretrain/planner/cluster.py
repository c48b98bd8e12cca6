"""The hardware a plan runs on, as the planner sees it: devices, their speed and memory, the links
between them, and what a collective costs over those links. A Cluster comes from a cluster file
(load_cluster_toml: hardware that cannot be measured from here, for what-if planning), from a
measurement of this machine (measure.py), or is built by hand (uniform_cluster, for tests and benchmarks).

Collective costs use the textbook ring model over the slowest link the ring crosses (Thakur et al.,
2005): an all-reduce of M bytes over n ranks takes 2(n-1) latencies and moves 2(n-1)/n·M bytes per
link. Sends crossing between the same two nodes at the same time share that link's bandwidth
(Cluster.shared_links), as on a real network. The benchmarks' link emulator (benchmarks/linkemu.py)
delays collectives by the same formulas but gives each pair of ranks a link of its own, so a cluster
that describes it sets shared_links=False; then the planner and the emulated network agree on what a
link is and differ only in what the plan actually sends.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.errors import PipelineError

GB = 1e9
# What a device that was described, not measured, is assumed to have beside its matmul FLOP/s:
UNMEASURED_BYTES_PER_FLOP = 0.04  # copy bandwidth: 40 bytes per 1000 FLOPs (a GPU's HBM against its tensor cores)
UNMEASURED_DISPATCH_S = 10e-6  # host time per op of eager PyTorch (dispatch and autograd)
DTENSOR_DISPATCH_FACTOR = 10  # a DTensor op's extra host time, in plain ops' dispatch (unmeasured)


@dataclass
class Link:
    latency_s: float
    bandwidth_Bps: float  # bytes per second

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass
class Device:
    """One rank's device, as the cost model sees it."""

    name: str
    node: int  # index into Cluster.nodes
    memory_bytes: float
    flops: float  # sustained dense matmul FLOP/s (large matmuls)
    mem_bw_Bps: float = 0.0  # sustained copy bandwidth (the optimizer's passes); 0 = UNMEASURED_BYTES_PER_FLOP
    dispatch_s: float = UNMEASURED_DISPATCH_S  # host time per op of a training step (eager PyTorch: dispatch, autograd)
    matmul_rates: list[list[float]] = field(default_factory=list)  # measured [FLOPs per call, FLOP/s], by size
    # bytes/s of a training step's non-matmul ops (layer norms, GELU, softmax, adds) as a real transformer
    # block runs them: GELU's and softmax's math makes them slower than a copy on CPUs; 0 = copy bandwidth
    elementwise_Bps: float = 0.0
    optimizer_s_per_tensor: float = (
        0.0  # host seconds of gradient clipping + AdamW per parameter tensor; 0 = 40 ops' dispatch
    )
    dtensor_optimizer_s_per_tensor: float = 0.0  # the same for DTensor parameters (FSDP, TP); 0 = as plain ones
    fsdp_s_per_tensor: float = 0.0  # FSDP2's host cost per parameter tensor of a unit's forward + backward (measured)
    fsdp_gathered_s_per_tensor: float = 0.0  # the same for a unit kept gathered (pipeline microbatches)
    # CPU ranks that share a host's cores: the host's cores, the ranks measured on it at once, threads per rank
    host_cores: int = 0
    host_ranks: int = 0
    threads: int = 0

    @property
    def memory_bandwidth(self) -> float:
        return self.mem_bw_Bps or self.flops * UNMEASURED_BYTES_PER_FLOP

    @property
    def elementwise_bandwidth(self) -> float:
        return self.elementwise_Bps or self.memory_bandwidth

    def matmul_time(self, flops: float) -> float:
        """Seconds of one matmul of `flops`: at the rate measured for the nearest sizes (interpolated on a
        log scale), at the peak rate where nothing was measured."""
        rates = self.matmul_rates
        if not rates:
            return flops / self.flops
        if flops <= rates[0][0]:
            return flops / rates[0][1]
        for (f0, r0), (f1, r1) in zip(rates, rates[1:]):
            if flops <= f1:
                w = math.log(flops / f0) / math.log(f1 / f0)
                return flops / math.exp((1 - w) * math.log(r0) + w * math.log(r1))
        return flops / rates[-1][1]


@dataclass
class Cluster:
    devices: list[Device]  # in rank order: torchrun puts consecutive ranks on one node
    nodes: list[str]
    latency_s: list[list[float]]  # N×N, [i][j] = one-way latency from rank i to rank j
    bandwidth_Bps: list[list[float]]  # N×N
    source: str = "measured"
    collective_overhead_s: float = 0.0  # software cost of one collective beyond the ring model (measured)
    dtensor_dispatch_s: float = (
        0.0  # extra host time of a DTensor op over a plain one (measured; 0 = DTENSOR_DISPATCH_FACTOR × dispatch)
    )
    # a real network: sends between the same two nodes at once share the link's bandwidth (False: each
    # pair of ranks has a link of its own, as benchmarks/linkemu.py emulates them)
    shared_links: bool = True
    # time a pipeline stage loses per forward or backward action beyond its compute and the link: the
    # schedule's bookkeeping and the wait for a peer to be scheduled (measured in a real 1F1B pipeline)
    pipeline_action_s: float = 0.0

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def link(self, i: int, j: int) -> Link:
        if i == j:
            return Link(0.0, float("inf"))
        return Link(self.latency_s[i][j], self.bandwidth_Bps[i][j])

    def ring(self, ranks: list[int]) -> Link:
        """The slowest link a ring over `ranks` (in this order) crosses: it paces every step."""
        hops = [self.link(a, b) for a, b in ring_hops(ranks)]
        if not hops:
            return Link(0.0, float("inf"))
        return Link(max(h.latency_s for h in hops), min(h.bandwidth_Bps for h in hops))

    def dtensor_overhead(self, rank: int) -> float:
        return self.dtensor_dispatch_s or DTENSOR_DISPATCH_FACTOR * self.devices[rank].dispatch_s

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for d in self.devices:
            key = f"{self.nodes[d.node]}: {d.name}"
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{n}× {k}" for k, n in counts.items())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Cluster":
        raw = dict(raw)
        raw["devices"] = [Device(**d) for d in raw["devices"]]
        return cls(**raw)


# ---------------------------------------------------------------- collective cost model


def ring_hops(ranks: list[int]) -> list[tuple[int, int]]:
    """The (sender, receiver) pairs of a ring over `ranks` in this order; none for a single rank."""
    return list(zip(ranks, ranks[1:] + ranks[:1])) if len(ranks) > 1 else []


def ring_steps_and_volume(kind: str, n: int) -> tuple[int, float]:
    """(latency steps, bytes per link as a fraction of the message) of a ring collective over n ranks.

    all_reduce: reduce-scatter then all-gather; all_gather / reduce_scatter: the message is the
    full (gathered) tensor; broadcast: a pipelined chain."""
    if n < 2:
        return 0, 0.0
    if kind == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1, (n - 1) / n
    if kind == "broadcast":
        return n - 1, 1.0
    raise ValueError(f"unknown collective {kind}")


def collective_time(kind: str, nbytes: float, link: Link, n: int, overhead_s: float = 0.0) -> float:
    """Seconds of one ring collective of `nbytes` over n ranks whose slowest link is `link`."""
    steps, volume = ring_steps_and_volume(kind, n)
    if steps == 0:
        return 0.0
    return steps * link.latency_s + volume * nbytes / link.bandwidth_Bps + overhead_s


# ---------------------------------------------------------------- from a TOML file

EXAMPLE_TOML = """\
# Two sites 30 ms apart, each with one node of 4 GPUs.
[[nodes]]
name = "site-a"
devices = 4
device = "A100-40GB"
memory_gb = 40
tflops = 150            # sustained dense matmul TFLOP/s per device

[[nodes]]
name = "site-b"
devices = 4
device = "A100-40GB"
memory_gb = 40
tflops = 150

[links.intra_node]
bandwidth_gbps = 2400   # gigabits per second (NVLink)
latency_ms = 0.01

[links.inter_node]
bandwidth_gbps = 10
latency_ms = 30
"""


def _number(table: dict, key: str, where: str, default=None, positive: bool = True) -> float:
    if key not in table:
        if default is not None:
            return default
        raise PipelineError(f"{where}: missing field '{key}'")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PipelineError(f"{where}: '{key}' must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise PipelineError(f"{where}: '{key}' must be {'positive' if positive else 'non-negative'}, got {value}")
    return float(value)


def _link(table: dict | None, where: str) -> Link:
    if not isinstance(table, dict):
        raise PipelineError(f"{where}: missing table (bandwidth_gbps, latency_ms)")
    return Link(
        _number(table, "latency_ms", where, positive=False) / 1e3, _number(table, "bandwidth_gbps", where) * GB / 8
    )


def load_cluster_toml(path: Path) -> Cluster:
    """A cluster description for what-if planning; every problem is one PipelineError naming the field."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: no such file")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise PipelineError(f"{path}: invalid TOML ({e})") from None
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise PipelineError(f"{path}: missing [[nodes]] (at least one node with devices, memory_gb and tflops)")
    links = raw.get("links", {})
    intra = _link(links.get("intra_node"), f"{path}: [links.intra_node]")
    inter = (
        _link(links.get("inter_node"), f"{path}: [links.inter_node]")
        if len(nodes_raw) > 1 or any(n.get("count", 1) > 1 for n in nodes_raw)
        else intra
    )
    nodes, devices = [], []
    for i, node in enumerate(nodes_raw):
        where = f"{path}: nodes[{i}]"
        count = int(_number(node, "count", where, default=1))
        per_node = _number(node, "devices", where)
        if per_node != int(per_node):
            raise PipelineError(f"{where}: 'devices' must be a whole number, got {per_node}")
        memory = _number(node, "memory_gb", where) * GB
        flops = _number(node, "tflops", where) * 1e12
        mem_bw = _number(node, "memory_bandwidth_gbs", where, default=0.0, positive=False) * GB
        dispatch = _number(node, "dispatch_us", where, default=10.0) / 1e6
        name = str(node.get("name", f"node{i}"))
        for c in range(count):
            nodes.append(name if count == 1 else f"{name}-{c}")
            devices += [
                Device(str(node.get("device", "device")), len(nodes) - 1, memory, flops, mem_bw, dispatch)
                for _ in range(int(per_node))
            ]
    pair_links: dict[tuple[str, str], Link] = {}
    for k, between in enumerate(links.get("between", [])):
        where = f"{path}: links.between[{k}]"
        names = between.get("nodes")
        if (
            not isinstance(names, list)
            or len(names) != 2
            or not all(n in nodes or any(x.startswith(f"{n}-") for x in nodes) for n in names)
        ):
            raise PipelineError(f"{where}: 'nodes' must name two nodes of the cluster ({', '.join(nodes)})")
        pair_links[tuple(names)] = pair_links[tuple(reversed(names))] = _link(between, where)
    n = len(devices)
    latency = [[0.0] * n for _ in range(n)]
    bandwidth = [[float("inf")] * n for _ in range(n)]
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            na, nb = devices[a].node, devices[b].node
            link = (
                intra
                if na == nb
                else pair_links.get((_base(nodes[na]), _base(nodes[nb])), pair_links.get((nodes[na], nodes[nb]), inter))
            )
            latency[a][b], bandwidth[a][b] = link.latency_s, link.bandwidth_Bps
    return Cluster(devices, nodes, latency, bandwidth, source=str(path))


def _base(name: str) -> str:
    return name.rsplit("-", 1)[0] if name[-1:].isdigit() and "-" in name else name


def uniform_cluster(
    n: int,
    flops: float,
    memory_bytes: float,
    intra: Link,
    inter: Link | None = None,
    per_node: int | None = None,
    name: str = "device",
    **device,
) -> Cluster:
    """n identical devices, `per_node` to a node (default: all on one), for tests and benchmarks."""
    per_node = per_node or n
    devices = [Device(name, r // per_node, memory_bytes, flops, **device) for r in range(n)]
    nodes = [f"node{k}" for k in range((n + per_node - 1) // per_node)]
    inter = inter or intra
    lat = [
        [0.0 if a == b else (intra if a // per_node == b // per_node else inter).latency_s for b in range(n)]
        for a in range(n)
    ]
    bw = [
        [
            float("inf") if a == b else (intra if a // per_node == b // per_node else inter).bandwidth_Bps
            for b in range(n)
        ]
        for a in range(n)
    ]
    return Cluster(devices, nodes, lat, bw, source="given")
