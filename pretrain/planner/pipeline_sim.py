"""The pipeline-schedule simulation: a schedule's real action order run on a clock.

Single-stage schedules (GPipe, 1F1B) are written out here as torch runs them; multi-stage ones
(interleaved 1F1B, looped BFS, zero bubble, ZBV) come from torch's own schedule classes. simulate()
gives the step's makespan, each rank's busy time and its activations in flight at the worst moment:
the bubble, the transfers on the critical path and the memory of the schedule follow from these.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pretrain.config import ParallelConfig

# Zero-bubble schedules split a backward (B) into the input gradient (I) and the weight gradient (W):
INPUT_GRAD_SHARE = 0.5  # of a backward's time, I's (W takes the rest)
KEEP_FOR_WEIGHT_GRAD = 0.5  # share of a stage's activations kept from I until W


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

    cls = {
        "interleaved-1f1b": S.ScheduleInterleaved1F1B,
        "looped-bfs": S.ScheduleLoopedBFS,
        "zero-bubble": S.ScheduleInterleavedZeroBubble,
        "zbv": S.ScheduleZBVZeroBubble,
    }[schedule]
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
    return {
        r: [(kinds[a.computation_type.name], a.stage_index, a.microbatch_index) for a in ops if a is not None]
        for r, ops in obj.pipeline_order.items()
    }


@dataclass
class SimResult:
    makespan: float
    busy: list[float]  # per pipeline rank
    peak_inflight: list[float]  # per pipeline rank: activation bytes at the worst moment


def simulate(
    config: ParallelConfig, fwd: list[float], bwd: list[float], act: list[float], transfer: dict[tuple[int, int], float]
) -> SimResult:
    """Run the schedule's action order on a clock: each rank does its actions in order, each starting
    when the rank is free and its inputs have arrived (the previous stage's output plus the transfer
    time between their ranks). fwd/bwd/act are per stage; transfer[(rank_a, rank_b)] per microbatch."""
    order = schedule_order(config)
    n_stages = len(fwd)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * config.pp
    busy = [0.0] * config.pp
    pos = [0] * config.pp
    duration = {
        "F": lambda s: fwd[s],
        "B": lambda s: bwd[s],
        "I": lambda s: bwd[s] * INPUT_GRAD_SHARE,
        "W": lambda s: bwd[s] * (1 - INPUT_GRAD_SHARE),
    }

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
            live += {
                "F": act[s],
                "B": -act[s],
                "I": -act[s] * (1 - KEEP_FOR_WEIGHT_GRAD),
                "W": -act[s] * KEEP_FOR_WEIGHT_GRAD,
            }[kind]
            peak = max(peak, live)
        peaks.append(peak)
    return SimResult(max(free), busy, peaks)
