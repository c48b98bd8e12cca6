"""A link emulator: make a job on one machine behave as if its ranks were connected by slower links.

Why: the planner's claims (tensor parallelism collapses over tens of milliseconds, pipeline and data
parallel combinations win) need networks that this machine does not have. Real caps between network
namespaces (veth + `tc qdisc netem`) would be better, but this kernel has no netem (only tbf/htb,
which cap bandwidth and cannot add latency), so benchmarks and tests use this emulator.

What it does, per link (a latency in seconds and a bandwidth in bytes/s between every pair of ranks):

    collectives   (all_reduce, all_gather, reduce_scatter, broadcast; c10d calls, DTensor's functional
                  collectives and DDP's gradient buckets) first sleep for the ring-model time of the
                  collective over the slowest link its group's ring crosses (the planner's collective_time),
                  then run for real. Every rank of the group sleeps the same time, so the collective
                  ends that much later everywhere; an asynchronous collective blocks its caller.
    isend         is deferred: a background thread posts the real send latency + bytes/bandwidth
                  later (sends to one peer stay in order and are serialised by bandwidth), so the data
                  arrives late while the sender goes on computing, as over a real network. The tensor
                  is copied when the send is issued.
    send          (blocking) sleeps latency + bytes/bandwidth, then sends.
    recv / irecv  are unchanged: they complete when the delayed data arrives.

The real transfer over loopback still happens and adds its own small cost, as a network card would.
Install it in every rank before the process group is created: `install(links)`, or set the
PIPELINE_LINK_EMULATOR environment variable to the JSON of an EmulatedLinks and call
install_from_env() (benchmarks/planner_worker.py does, before training; the planner's measurement
takes either as its `setup`). `stats` counts what was delayed (collectives by kind, bytes, seconds).

A benchmark and test tool: it patches torch.distributed, so the product never imports it.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass

from pretrain.planner.cluster import Link, collective_time

ENV = "PIPELINE_LINK_EMULATOR"


@dataclass
class EmulatedLinks:
    latency_s: list[list[float]]  # N×N
    bandwidth_Bps: list[list[float]]  # N×N

    def link(self, a: int, b: int) -> Link:
        if a == b:
            return Link(0.0, float("inf"))
        return Link(self.latency_s[a][b], self.bandwidth_Bps[a][b])

    def ring(self, ranks: list[int]) -> Link:
        hops = [self.link(a, b) for a, b in zip(ranks, ranks[1:] + ranks[:1])] if len(ranks) > 1 else []
        if not hops:
            return Link(0.0, float("inf"))
        return Link(max(h.latency_s for h in hops), min(h.bandwidth_Bps for h in hops))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "EmulatedLinks":
        return cls(**json.loads(text))

    @classmethod
    def sites(cls, n: int, per_site: int, inter: Link, intra: Link | None = None) -> "EmulatedLinks":
        """n ranks, `per_site` consecutive ranks per site; `inter` between sites, `intra` (default: no
        added delay) inside one."""
        intra = intra or Link(0.0, float("inf"))
        pick = lambda a, b: intra if a // per_site == b // per_site else inter  # noqa: E731
        return cls(
            [[0.0 if a == b else pick(a, b).latency_s for b in range(n)] for a in range(n)],
            [[float("inf") if a == b else pick(a, b).bandwidth_Bps for b in range(n)] for a in range(n)],
        )


stats: Counter = Counter()  # "<kind>" -> calls, "<kind>_bytes" -> bytes, "delay_s" -> seconds slept (callers)
_links: EmulatedLinks | None = None
_sender: "_DeferredSender | None" = None


# ---------------------------------------------------------------- groups and delays


def _group_ranks(group) -> list[int]:
    """Global ranks of a c10d group, a (mesh, dim) pair, a mesh, a rank list or a group name."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    if group is None:
        return list(range(dist.get_world_size()))
    if isinstance(group, tuple):
        mesh, dim = group
        group = mesh.get_group(dim)
    elif isinstance(group, DeviceMesh):
        group = group.get_group()
    elif isinstance(group, list):
        return [int(r) for r in group]
    elif isinstance(group, str):
        group = c10d._resolve_process_group(group)
    return dist.get_process_group_ranks(group)


def _delay_collective(kind: str, nbytes: int, group) -> None:
    ranks = _group_ranks(group)
    seconds = collective_time(kind, nbytes, _links.ring(ranks), len(ranks))
    stats[kind] += 1
    stats[f"{kind}_bytes"] += nbytes
    if seconds > 0:
        stats["delay_s"] += seconds
        time.sleep(seconds)


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _global_peer(group, peer, group_peer) -> int:
    import torch.distributed as dist

    if group_peer is not None and group is not None:
        return dist.get_global_rank(group, group_peer)
    return peer if peer is not None else group_peer


class _DoneWork:
    """What a deferred isend returns: done at once for the caller (the emulator owns the real send)."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


class _DeferredSender:
    """One thread that posts each send when its data would have crossed the link."""

    def __init__(self, isend):
        self.isend = isend
        self.queue: queue.Queue = queue.Queue()
        self.last_due: dict[int, float] = {}
        self.inflight: list = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="linkemu-sender", daemon=True)
        self.thread.start()

    def submit(self, tensor, dst: int, group, tag: int, link: Link) -> threading.Event:
        now = time.monotonic()
        with self.lock:
            serial = _nbytes(tensor) / link.bandwidth_Bps
            due = max(now + link.latency_s + serial, self.last_due.get(dst, 0.0) + serial)
            self.last_due[dst] = due
        done = threading.Event()
        self.queue.put((due, tensor.clone(), dst, group, tag, done))
        return done

    def _run(self) -> None:
        while True:
            due, tensor, dst, group, tag, done = self.queue.get()
            time.sleep(max(0.0, due - time.monotonic()))
            work = self.isend(tensor, dst=dst, group=group, tag=tag)
            self.inflight = [(w, t) for w, t in self.inflight if not w.is_completed()] + [(work, tensor)]
            done.set()
            self.queue.task_done()

    def flush(self) -> None:
        self.queue.join()
        for work, _ in self.inflight:
            work.wait()
        self.inflight = []


# ---------------------------------------------------------------- installing


def install(links: EmulatedLinks) -> None:
    """Patch torch.distributed in this process so every transfer pays its emulated link (idempotent)."""
    global _links, _sender
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    if _links is not None:
        _links = links
        return
    _links = links
    orig = {
        name: getattr(c10d, name)
        for name in (
            "all_reduce",
            "all_gather",
            "all_gather_into_tensor",
            "all_gather_single",
            "reduce_scatter_tensor",
            "reduce_scatter_single",
            "broadcast",
            "isend",
            "send",
            "destroy_process_group",
        )
    }
    _sender = _DeferredSender(orig["isend"])

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        _delay_collective("all_reduce", _nbytes(tensor), group)
        return orig["all_reduce"](tensor, op=op, group=group, async_op=async_op)

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        _delay_collective("all_gather", _nbytes(tensor) * len(tensor_list), group)
        return orig["all_gather"](tensor_list, tensor, group=group, async_op=async_op)

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        _delay_collective("all_gather", _nbytes(output_tensor), group)
        return orig["all_gather_into_tensor"](output_tensor, input_tensor, group=group, async_op=async_op)

    def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
        _delay_collective("all_gather", _nbytes(output_tensor), group)
        return orig["all_gather_single"](output_tensor, input_tensor, group=group, async_op=async_op)

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        _delay_collective("reduce_scatter", _nbytes(input), group)
        return orig["reduce_scatter_tensor"](output, input, op=op, group=group, async_op=async_op)

    def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        _delay_collective("reduce_scatter", _nbytes(input), group)
        return orig["reduce_scatter_single"](output, input, op=op, group=group, async_op=async_op)

    def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
        _delay_collective("broadcast", _nbytes(tensor), group)
        return orig["broadcast"](tensor, src=src, group=group, async_op=async_op, group_src=group_src)

    def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
        peer = _global_peer(group, dst, group_dst)
        stats["send"] += 1
        stats["send_bytes"] += _nbytes(tensor)
        _sender.submit(tensor, peer, group, tag, _links.link(dist.get_rank(), peer))
        return _DoneWork()

    def send(tensor, dst=None, group=None, tag=0, group_dst=None):
        peer = _global_peer(group, dst, group_dst)
        _sender.submit(tensor, peer, group, tag, _links.link(dist.get_rank(), peer)).wait()
        stats["send"] += 1
        stats["send_bytes"] += _nbytes(tensor)

    def destroy_process_group(group=None):
        _sender.flush()
        return orig["destroy_process_group"](group)

    patched = dict(
        all_reduce=all_reduce,
        all_gather=all_gather,
        all_gather_into_tensor=all_gather_into_tensor,
        all_gather_single=all_gather_single,
        reduce_scatter_tensor=reduce_scatter_tensor,
        reduce_scatter_single=reduce_scatter_single,
        broadcast=broadcast,
        isend=isend,
        send=send,
        destroy_process_group=destroy_process_group,
    )
    for name, fn in patched.items():
        fn.__name__ = fn.__qualname__ = name
        setattr(c10d, name, fn)  # P2POp checks `op in [isend, irecv]` against the module's own names
        setattr(dist, name, fn)
    _patch_functional_collectives(funcol)
    _patch_ddp()
    atexit.register(lambda: _sender.flush() if dist.is_initialized() else None)


def _patch_functional_collectives(funcol) -> None:
    """DTensor (tensor parallelism, gradient norms of sharded parameters) uses these."""
    orig_ar, orig_ag, orig_rs = funcol.all_reduce, funcol.all_gather_single, funcol.reduce_scatter_single

    def all_reduce(self, reduceOp, group, tag=""):
        _delay_collective("all_reduce", _nbytes(self), group)
        return orig_ar(self, reduceOp, group, tag)

    def all_gather_single(self, gather_dim, group, tag=""):
        ranks = _group_ranks(group)
        _delay_collective("all_gather", _nbytes(self) * len(ranks), group)
        return orig_ag(self, gather_dim, group, tag)

    def reduce_scatter_single(self, reduceOp, scatter_dim, group, tag=""):
        _delay_collective("reduce_scatter", _nbytes(self), group)
        return orig_rs(self, reduceOp, scatter_dim, group, tag)

    funcol.all_reduce, funcol.all_gather_single, funcol.reduce_scatter_single = (
        all_reduce,
        all_gather_single,
        reduce_scatter_single,
    )


def _patch_ddp() -> None:
    """DDP all-reduces its gradient buckets from C++; a communication hook brings them through all_reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.register_comm_hook(self.process_group, allreduce_hook)

    DistributedDataParallel.__init__ = __init__


def install_from_env() -> bool:
    """Install the emulator described by $PIPELINE_LINK_EMULATOR, if set; returns whether it did."""
    spec = os.environ.get(ENV)
    if not spec:
        return False
    install(EmulatedLinks.from_json(spec))
    return True
