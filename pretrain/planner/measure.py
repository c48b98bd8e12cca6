"""Measuring this machine for the planner, and keeping the measurement in the workspace.

    measure_cluster(nproc)   a short real job of `nproc` local processes (gloo on CPU, NCCL on GPU):
                             every rank times, at once (so ranks sharing a CPU see their share),
                             matmuls of several sizes, memory copies, real blocks' forward and backward
                             (the host cost per op, the rate of non-matmul ops) and the optimizer per
                             parameter tensor; then each pair of ranks ping-pongs small and large
                             tensors (an N×N latency/bandwidth matrix), the world all-reduces mid-step
                             (the software overhead of a collective), runs a tiny FSDP2 unit and DTensor
                             optimizer (their host cost per parameter tensor) and a tiny GPT as a real
                             1F1B pipeline (the schedule's cost per action).
    local_cluster(...)       the same, cached in the workspace's cluster.json, keyed by host, process
                             count and device type, so `pipeline plan` and `--strategy auto` measure once.

The calibrations (_block_costs, _pipeline_action_cost) fit the measured times against the planner's
own profile and cost model, so that the model's counts and the measured rates add up to what ran.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from common.errors import PipelineError
from pretrain.planner.candidates import Candidate
from pretrain.planner.cluster import Cluster, Device, Link
from pretrain.planner.cost import compute_time, estimate
from pretrain.planner.profile import Workload, profile_model


@dataclass
class MeasureSettings:
    seconds: float = 0.25  # per compute measurement
    small_bytes: int = 4
    large_bytes: int = 4 * 2**20
    repeats: int = 5  # ping-pongs per pair and size (fewer if each is slow)


def measure_cluster(
    nproc: int, settings: MeasureSettings | None = None, setup: Callable[[], None] | None = None
) -> Cluster:
    """Measure this machine with a short real job of `nproc` processes (see the module docstring).

    `setup`, if given, runs in every rank of a job of several before it joins the process group (a
    benchmark installs its network emulator there); it must be picklable (a module-level function)."""
    import torch
    import torch.multiprocessing as mp

    settings = settings or MeasureSettings()
    if nproc < 1:
        raise PipelineError(f"--nproc must be positive, got {nproc}")
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "cluster.json"
        if nproc == 1:
            measure_rank(0, 1, str(Path(tmp) / "store"), str(result), asdict(settings))
        else:
            mp.start_processes(
                measure_rank,
                args=(nproc, str(Path(tmp) / "store"), str(result), asdict(settings), setup),
                nprocs=nproc,
                start_method="spawn",
            )
        raw = json.loads(result.read_text())
    raw["source"] = (
        f"measured on {socket.gethostname()} ({nproc} process{'es' if nproc > 1 else ''}, "
        f"{'CUDA' if torch.cuda.is_available() else 'CPU'})"
    )
    return Cluster.from_dict(raw)


def measure_rank(
    rank: int, world: int, store_path: str, result_path: str, settings: dict, setup: Callable[[], None] | None = None
) -> None:
    """One rank of measure_cluster's job (the ranks meet through a file store at `store_path`; rank 0
    writes the Cluster as JSON to `result_path`). Public so that a job spread over several network
    namespaces or hosts that share a file system can run it too."""
    import torch
    import torch.distributed as dist

    settings = MeasureSettings(**settings)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:  # ranks share the CPU as training processes would
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if world > 1:
        if setup is not None:
            setup()
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"file://{store_path}", rank=rank, world_size=world
        )
    try:
        mine = _measure_device(device, settings, world)
        everyone = [mine]
        lat = [[0.0] * world for _ in range(world)]
        bw = [[float("inf")] * world for _ in range(world)]
        overhead, dtensor = 0.0, 0.0
        if world > 1:
            mine.update(_fsdp_costs(device, world))
            everyone = [None] * world
            dist.all_gather_object(everyone, mine)
            for a in range(world):
                for b in range(a + 1, world):
                    link = _ping_pong(a, b, rank, device, settings)
                    if rank == a:
                        lat[a][b] = lat[b][a] = link.latency_s
                        bw[a][b] = bw[b][a] = link.bandwidth_Bps
            overhead = _allreduce_overhead(device, settings, world)
            dtensor = _dtensor_overhead(device, world)
            rows = [None] * world
            dist.all_gather_object(rows, (lat, bw))
            for r, (l_r, b_r) in enumerate(rows):  # rank a measured the pairs (a, b > a)
                for b in range(r + 1, world):
                    lat[r][b] = lat[b][r] = l_r[r][b]
                    bw[r][b] = bw[b][r] = b_r[r][b]
        devices = [Device(**d, node=0) for d in everyone]
        cluster = Cluster(
            devices, [socket.gethostname()], lat, bw, collective_overhead_s=overhead, dtensor_dispatch_s=dtensor
        )
        if world > 1:
            cluster.pipeline_action_s = _pipeline_action_cost(cluster)
        if rank == 0:
            Path(result_path).write_text(json.dumps(cluster.to_dict()))
    finally:
        if world > 1:
            dist.destroy_process_group()


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, seconds: float, min_iters: int = 3) -> float:
    """Seconds per call of fn, over about `seconds`."""
    fn()
    _sync(device)
    n, start = 0, time.perf_counter()
    while n < min_iters or time.perf_counter() - start < seconds:
        fn()
        n += 1
    _sync(device)
    return (time.perf_counter() - start) / n


def _measure_device(device, settings: MeasureSettings, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from pretrain.hardware import measure_matmul_flops

    if world > 1:
        dist.barrier()  # every rank measures at the same time
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t = torch.ones(1, device=device)
    launch = _timed(lambda: t.add(t), device, settings.seconds / 4, min_iters=100)
    # Matmul throughput by size: a small model's matmuls run far below the peak of a large one. The best
    # of a few repeats, as for MFU's peak: a busy machine slows some down, nothing speeds one up.
    rates = []
    for size in (256, 512, 1024, 2048, 4096) if device.type == "cuda" else (32, 64, 128, 256, 512, 1024):
        flops = 2 * size**3
        seconds = flops / measure_matmul_flops(device, dtype, size, settings.seconds / 3, repeats=3)
        rates.append(
            [float(flops), flops / max(seconds - launch, seconds / 10)]
        )  # the op's own launch is counted per op
    x = torch.randn(8 * 2**20 // 4 * (8 if device.type == "cuda" else 1), device=device)
    y = torch.empty_like(x)
    copy_bw = 2 * x.numel() * 4 / _timed(lambda: y.copy_(x), device, settings.seconds / 2)
    dispatch, elementwise = _block_costs(device, settings, rates)
    optimizer = _optimizer_cost(device, settings)
    sharing = {}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = props.name, float(props.total_memory)
    else:
        import platform

        name = (
            f"CPU ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''}, {platform.machine()})"
        )
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / world
        sharing = dict(host_cores=os.cpu_count() or 1, host_ranks=world, threads=torch.get_num_threads())
    return dict(
        name=name,
        memory_bytes=memory,
        flops=max(r for _, r in rates),
        mem_bw_Bps=copy_bw,
        dispatch_s=dispatch,
        elementwise_Bps=elementwise,
        matmul_rates=rates,
        optimizer_s_per_tensor=optimizer,
        **sharing,
    )


def _block_costs(device, settings: MeasureSettings, rates: list[list[float]]) -> tuple[float, float]:
    """The two rates of the planner's compute model that only real training ops show, calibrated on real
    transformer blocks against the planner's own trace of them (so the trace's op and byte counts and
    the measured rates add up to the measured time):

    - host seconds per op: forward and backward of a block so small that its compute is nothing. Eager
      autograd's bookkeeping costs several times a bare op's dispatch, paid per op per microbatch;
    - bytes/s of the non-matmul ops: forward and backward of a block of a small model's size, less its
      matmuls (at the measured rates) and its ops' host time. GELU, softmax and layer norm compute
      more per byte than a copy, which a copy's bandwidth misses by several times on CPUs."""
    import torch

    from pretrain.config import ModelConfig
    from pretrain.model import Block

    cuda = device.type == "cuda"

    def run_and_trace(cfg: ModelConfig, rows: int) -> tuple[float, object]:
        block = Block(cfg).to(device)
        x = torch.randn(rows, cfg.block_size, cfg.n_embd, device=device, requires_grad=True)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):  # bf16 as the matmul rates
                block(x).float().sum().backward()

        seconds = _timed(step, device, settings.seconds / 2, min_iters=20)
        traced = profile_model(cfg, cfg.block_size, 2 if cuda else 4).block(1)
        return seconds, (traced.fwd + traced.bwd).for_rows(rows)

    probe = Device(
        "probe", 0, 0.0, max(r for _, r in rates), matmul_rates=rates, dispatch_s=0.0, elementwise_Bps=float("inf")
    )
    tiny_s, tiny = run_and_trace(ModelConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16), 1)
    dispatch = max(tiny_s - compute_time(tiny, probe, 0.0), tiny_s / 2) / tiny.ops
    size = dict(block_size=256, n_head=8, n_embd=512) if cuda else dict(block_size=64, n_head=4, n_embd=128)
    small_s, small = run_and_trace(ModelConfig(vocab_size=64, n_layer=1, **size), 8)
    rest = small_s - compute_time(small, probe, 0.0) - small.ops * dispatch
    # a rest at or below nothing: the matmul rates explain the block, the non-matmul ops are copy-bound
    return dispatch, (small.bytes / rest if rest > small_s * 0.05 else 0.0)


def _optimizer_cost(device, settings: MeasureSettings, tensors: int = 32) -> float:
    """Host seconds per parameter tensor of the step's tail as training runs it: gradient clipping, then
    AdamW. On CPU its foreach kernels loop over the tensors, so a model's count of tensors, not its size,
    sets this for small models."""
    import torch

    params = [torch.zeros(64, device=device, requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3)

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return _timed(step, device, settings.seconds / 2, min_iters=10) / tensors


def _ping_pong(a: int, b: int, rank: int, device, settings: MeasureSettings) -> Link:
    """One-way latency (small messages) and bandwidth (large ones) between ranks a and b; others wait."""
    import torch
    import torch.distributed as dist

    one_way = {}
    if rank in (a, b):
        peer = b if rank == a else a
        for nbytes in (settings.small_bytes, settings.large_bytes):
            buf = torch.zeros(max(1, nbytes // 4), device=device)
            times = []
            for i in range(settings.repeats + 1):
                start = time.perf_counter()
                if rank == a:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
                _sync(device)
                if i:  # the first exchange sets up the connection
                    times.append((time.perf_counter() - start) / 2)
                if sum(times) > 2.0 and len(times) >= 2:
                    break
            # the fastest exchange: the link itself; a rank descheduled now and then (a shared host) is a
            # cost of every blocking send, measured as such (collective and pipeline overheads)
            one_way[nbytes] = min(times)
    dist.barrier()
    if rank not in (a, b):
        return Link(0.0, float("inf"))
    latency = one_way[settings.small_bytes]
    transfer = max(one_way[settings.large_bytes] - latency, 1e-9)
    return Link(latency, settings.large_bytes / transfer)


def _allreduce_overhead(device, settings: MeasureSettings, world: int) -> float:
    """What a tiny all-reduce issued right after a burst of computation (as training issues them) costs
    beyond a back-to-back one (the ring's own latency, which the link matrix covers). Ranks arrive a
    little apart, and on a shared or oversubscribed host the collective also waits for its peers to be
    scheduled: both are real costs of every blocking collective in a step. Medians over the ranks'
    repeats, so one scheduling hiccup does not set the figure."""
    import statistics

    import torch
    import torch.distributed as dist

    t = torch.zeros(1, device=device)
    a = torch.randn(256, 256, device=device)

    def median_time(after_compute: bool) -> float:
        nonlocal a
        times = []
        dist.barrier()
        for i in range(5 * settings.repeats + 1):
            if after_compute:
                for _ in range(8):
                    a = torch.tanh(a @ a)
                _sync(device)
            start = time.perf_counter()
            dist.all_reduce(t)
            _sync(device)
            if i:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    extra = torch.tensor([max(0.0, median_time(True) - median_time(False))], dtype=torch.float64, device=device)
    dist.all_reduce(extra)
    return extra.item() / world


def _timed_iters(fn, device, iters: int) -> float:
    """Median seconds of a call over a fixed number of calls (collectives: every rank must make the same
    calls; the median, as ranks sharing a host get descheduled now and then)."""
    import statistics

    fn()
    times = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _fsdp_costs(device, world: int, iters: int = 20) -> dict:
    """FSDP2's host costs, per parameter tensor: (1) of a unit's forward + backward (gathered for forward,
    again for backward, gradients reduce-scattered) beyond the plain block and the three collectives' own
    time: copies into and out of the collectives, hooks, DTensor wrapping; (2) of AdamW on DTensor shards;
    (3) of a forward + backward of a unit kept gathered, as pipeline microbatches run it. Measured on a
    block so small that compute and transfer are nothing."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from pretrain.config import ModelConfig
    from pretrain.model import Block

    cfg = ModelConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16)
    plain, sharded = Block(cfg).to(device), Block(cfg).to(device)
    fully_shard(sharded, mesh=init_device_mesh(device.type, (world,)))
    x = torch.randn(1, 8, 16, device=device, requires_grad=True)
    tensors = len(list(plain.parameters()))
    small = torch.zeros(world, device=device)
    piece = torch.zeros(1, device=device)
    collectives = 2 * _timed_iters(lambda: dist.all_gather_single(small, piece), device, iters) + _timed_iters(
        lambda: dist.reduce_scatter_single(piece, small), device, iters
    )
    plain_s = _timed_iters(lambda: plain(x).sum().backward(), device, iters)
    extra = _timed_iters(lambda: sharded(x).sum().backward(), device, iters) - plain_s - collectives
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    dtensor_step = _timed_iters(optimizer.step, device, iters)
    # Under pipeline parallelism a unit stays gathered through the step and reduces its gradients once,
    # after the last microbatch; each microbatch still runs FSDP's hooks.
    sharded.unshard()
    sharded.set_reshard_after_forward(False)
    sharded.set_reshard_after_backward(False)
    sharded.set_requires_gradient_sync(False)
    gathered = _timed_iters(lambda: sharded(x).sum().backward(), device, iters) - plain_s
    sharded.set_requires_gradient_sync(True)
    return {
        "fsdp_s_per_tensor": max(0.0, extra) / tensors,
        "fsdp_gathered_s_per_tensor": max(0.0, gathered) / tensors,
        "dtensor_optimizer_s_per_tensor": dtensor_step / tensors,
    }


def _dtensor_overhead(device, world: int) -> float:
    """Extra host time of an op on DTensors over the same op on plain tensors (tensor parallelism pays it
    on every sharded linear)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh(device.type, (world,))
    plain = torch.ones(4, 4, device=device)
    dt = distribute_tensor(plain, mesh, [Replicate()])
    base = _timed(lambda: plain.add(plain), device, 0.05, min_iters=50)
    return max(0.0, _timed(lambda: dt.add(dt), device, 0.1, min_iters=50) - base)


def _pipeline_action_cost(cluster: Cluster, iters: int = 8) -> float:
    """Seconds per pipeline action (a stage's forward or backward of one microbatch) that the planner's
    model of the step misses: the schedule's bookkeeping, and the wait for the peer at every send and
    receive (on a shared host, for it to be scheduled). A real pipeline of a tiny GPT, one layer per
    rank, through training's own code (parallelize, 1F1B), runs the same batch as p and as 4p
    microbatches; the planner's estimate of both steps, with every action made longer by h, must differ
    by what was measured. Fixed costs of a step (optimizer, the tied embedding's sync) cancel out."""
    import torch
    import torch.distributed as dist

    from pretrain.config import ModelConfig, ParallelConfig
    from pretrain.mesh import build_mesh
    from pretrain.model import GPT, lm_loss
    from pretrain.parallel import parallelize

    p = cluster.world_size
    cfg = ModelConfig(vocab_size=64, block_size=8, n_layer=p, n_head=2, n_embd=16)
    work = Workload(cfg, seq_len=8, global_batch=4 * p)
    x = torch.randint(0, cfg.vocab_size, (work.global_batch, work.seq_len))
    measured, configs = [], []
    for m in (p, 4 * p):
        config = ParallelConfig(pp=p, pp_schedule="1f1b", microbatches=m, strategy="pp")
        pm = parallelize(GPT(cfg), build_mesh(config), lm_loss)
        device = pm.par.device
        batch = x.to(device)
        step = torch.tensor(
            [_timed_iters(lambda pm=pm, batch=batch: pm.forward_backward(batch, batch, 1), device, iters)],
            device=device,
        )
        dist.all_reduce(step, op=dist.ReduceOp.MAX)  # the step ends when its slowest rank does
        measured.append(step.item())
        configs.append(config)

    def predicted_gap(h: float) -> float:
        with_h = replace(cluster, pipeline_action_s=h)
        first, last = (estimate(Candidate(c), work, with_h).step_s for c in configs)
        return last - first

    # the gap grows with h by the actions on the critical path: linear over the range that matters
    base = predicted_gap(0.0)
    slope = (predicted_gap(1e-3) - base) / 1e-3
    return max(0.0, (measured[1] - measured[0] - base) / slope) if slope > 0 else 0.0


# ---------------------------------------------------------------- cached in the workspace

CLUSTER_CACHE = "cluster.json"  # in the workspace
MEASUREMENT_VERSION = 3  # raised when what a measured Device means changes, so older caches are measured again


def cache_key(nproc: int) -> str:
    import torch

    return f"{MEASUREMENT_VERSION}|{socket.gethostname()}|{nproc}|{'cuda' if torch.cuda.is_available() else 'cpu'}"


def local_cluster(
    cache_path: Path | None, nproc: int, remeasure: bool = False, settings: MeasureSettings | None = None
) -> tuple[Cluster, bool]:
    """The measured cluster for `nproc` local processes, from the cache when there; returns (cluster, cached)."""
    key = cache_key(nproc)
    cache = {}
    if cache_path is not None and cache_path.exists():
        try:
            cache = json.loads(cache_path.read_text())
        except json.JSONDecodeError:
            cache = {}
    if key in cache and not remeasure:
        return Cluster.from_dict(cache[key]), True
    cluster = measure_cluster(nproc, settings)
    if cache_path is not None:
        from common.workspace import atomic_write_json

        cache[key] = cluster.to_dict()
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache_path, cache)
    return cluster, False
