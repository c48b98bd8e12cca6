"""What a run measures and reports: per-step time in communication, peak memory, MFU against this
machine's measured matmul peak and the card's datasheet peak (pretrain/hardware.py), the pipeline's
bubble; RunLog writes them to metrics.jsonl and as TensorBoard scalars to tensorboard/pretrain/ (rank 0;
common/board.py, mirrored to W&B with --wandb) and prints the progress lines."""

from __future__ import annotations

import json
import math
import os
import resource
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from common.board import Board
from common.console import info, quiet_descriptor
from common.durations import format_eta
from common.workspace import Workspace, atomic_write_bytes
from pretrain.config import ParallelConfig, TrainConfig
from pretrain.hardware import (
    PEAK_CACHE,
    cached_peak,
    checked_peak,
    datasheet_peak,
    machine_key,
    measure_matmul_flops,
    record_peak,
)
from pretrain.mesh import Parallel, gather_floats


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process since reset_peak_memory: allocated GPU memory on CUDA, resident
    set size on CPU (which includes the Python and PyTorch runtime; measured:
    benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_now_mb(device: torch.device) -> float:
    """Memory in use now: allocated GPU memory, or this process's resident set on CPU (the baseline that
    the measured peak is counted from, so it compares with the planner's estimate)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: each run of a job that runs several reports its own."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets the peak RSS to the current RSS
    except OSError:
        pass


def model_state_mb(modules: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> float:
    """Memory of this rank's share of the weights and optimizer state: what sharding divides."""
    tensors = {id(p): p for m in modules for p in m.parameters()}
    for optimizer in optimizers:
        for state in optimizer.state.values():
            tensors.update({id(t): t for t in state.values() if isinstance(t, torch.Tensor)})
    local = (t.to_local() if isinstance(t, DTensor) else t for t in tensors.values())
    return sum(t.numel() * t.element_size() for t in local) / 2**20


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e9  # nanoseconds


class CommunicationTimer:
    """Seconds during which a collective or point-to-point transfer was in flight, for one step.

    Uses the PyTorch profiler: on CPU the `gloo:*` spans (from posting to completion, waiting for
    peers included), on GPU the NCCL kernels. Overlapping transfers count once; transfers hidden
    behind computation count too (this is time in communication, not exposed time). Pipeline
    schedules post their receives early, so under PP this is close to the whole step: the
    pipeline's bubble (ParallelModel.bubble_fraction) says how long a stage really waited.
    """

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled, self.seconds = device, enabled, 0.0
        self._profiler = None

    def __enter__(self) -> "CommunicationTimer":
        if self.enabled:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self._profiler = profile(activities=activities)  # the first start in a process takes a second or two
            with quiet_descriptor(2):
                self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._profiler is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        with quiet_descriptor(2):
            self._profiler.__exit__(*exc)
        # The profiler's raw events: much cheaper than building its FunctionEvent tree.
        spans = []
        for event in self._profiler.profiler.kineto_results.events():
            name = event.name().lower()
            if self.device.type == "cuda":
                is_comm = "nccl" in name and event.device_type() == torch.autograd.DeviceType.CUDA
            else:
                is_comm = name.startswith("gloo:")
            if is_comm:
                spans.append((event.start_ns(), event.end_ns()))
        self.seconds = _union_seconds(spans)
        self._profiler = None


class Stopwatch:
    """Seconds of a block of device work (waiting for the device before and after); disabled, it neither
    waits nor measures (seconds is None)."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.device, self.enabled, self.seconds = device, enabled, None

    def __enter__(self) -> "Stopwatch":
        if self.enabled:
            self._sync()
            self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._sync()
            self.seconds = time.perf_counter() - self.start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_peak_flops: dict[str, float] = {}  # machine_key -> the peak this process measured or was given


def job_peak_flops(par: Parallel, cache: Path) -> float:
    """Sustained matmul FLOP/s of the whole job (pretrain/hardware.py), as rank 0 knows it: recorded in
    the workspace for this machine and job size, else measured by every rank at once (ranks sharing a
    CPU share it), summed and recorded. Rank 0 decides, so that every rank measures or none does."""
    key = machine_key(par.device, par.world_size)
    peak = torch.tensor(
        [(cached_peak(cache, key) or _peak_flops.get(key, 0.0)) if par.rank == 0 else 0.0], dtype=torch.float64
    )
    if par.world_size > 1:
        dist.broadcast(peak, 0)
    if peak.item() == 0.0:  # none recorded: measure
        peak = torch.tensor([measure_matmul_flops(par.device)], dtype=torch.float64)
        if par.world_size > 1:
            dist.all_reduce(peak)
    _peak_flops[key] = peak.item()
    how = "measured (best of 5 rounds of matmuls, " + key.rsplit("|", 1)[-1] + ")"
    return record_peak(cache, key, peak.item(), how) if par.rank == 0 else peak.item()


def theoretical_bubble(config: ParallelConfig) -> float | None:
    """Idle fraction of a pipeline step in theory: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v·m+p-1)
    for interleaved 1F1B with v stages per rank (Narayanan et al., 2021)."""
    p, m = config.pp, config.n_microbatches
    if p == 1:
        return 0.0
    if config.pp_schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if config.pp_schedule == "interleaved-1f1b":
        return (p - 1) / (config.n_stages_per_rank * m + p - 1)
    return None


# metrics.jsonl's fields drawn in TensorBoard, tag: field (a per-rank list is drawn as its largest value)
BOARD_SCALARS = {
    "loss/train": "loss",
    "loss/validation": "val_loss",
    "optimizer/lr": "lr",
    "optimizer/grad_norm": "grad_norm",
    "throughput/tokens_per_s": "tokens_per_s",
    "throughput/mfu": "mfu",
    "memory/peak_mb": "peak_mem_mb_per_rank",
    "memory/model_state_mb": "model_state_mb_per_rank",
    "memory/peak_rss_mb": "peak_rss_mb",
    "time/step_s": "step_s",
    "time/comm_fraction": "comm_fraction",
    "time/bubble_fraction": "bubble_fraction",
    "plan/step_s_predicted": "predicted_step_s",
    "plan/step_s_measured": "measured_step_s",
    "plan/peak_mem_mb_predicted": "predicted_peak_mem_mb",
    "plan/peak_mem_mb_measured": "measured_peak_mem_mb",
}
# Charts drawing several of them together (TensorBoard's Custom Scalars tab)
BOARD_CHARTS = {
    "loss": {"train and validation loss": ["loss/train", "loss/validation"]},
    "plan": {
        "step time (s): the plan's prediction and the run": ["plan/step_s_predicted", "plan/step_s_measured"],
        "peak memory (MB): the plan's prediction and the run": [
            "plan/peak_mem_mb_predicted",
            "plan/peak_mem_mb_measured",
        ],
    },
}


def board_values(record: dict) -> dict[str, float]:
    values = {tag: record.get(name) for tag, name in BOARD_SCALARS.items()}
    return {tag: max(v) if isinstance(v, list) else v for tag, v in values.items() if v is not None}


def sizing_markdown(sizing: dict) -> str:
    """The sizing table as TensorBoard's text tab shows it."""
    rows = [
        "| rank | layers | d | parameters | ms/step | steps | tokens | epochs | chosen |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sizing["shapes"]:
        rows.append(
            f"| {c['law_rank']} | {c['n_layer']} | {c['n_embd']} | {c['parameters'] / 1e6:.2f}M | "
            f"{c['step_s'] * 1000:.0f} | {c['steps']:,} | {c['tokens'] / 1e6:.1f}M | {c['epochs']:.1f} | "
            f"{'yes' if c['chosen'] else ''} |"
        )
    return (
        "Each shape timed on this machine, ranked by the scaling law (1 = the lowest loss it predicts; a ranking, "
        "not a forecast: pretrain/sizing.py).\n\n" + "\n".join(rows)
    )


class RunLog:
    """A run's metrics (JSON lines in the workspace and TensorBoard event files, written by rank 0; on
    resume, lines and events past the checkpoint are dropped) and progress lines. Every rank calls
    train_step at logged steps: the per-rank figures are gathered from all of them."""

    def __init__(
        self,
        ws: Workspace,
        par: Parallel,
        cfg: TrainConfig,
        flops_per_token: float,
        start_step: int,
        resume_from: Path | None,
        prediction: dict | None,
        memory_base_mb: float,
        wandb: bool = False,
    ):
        self.par, self.cfg, self.plan = par, cfg, par.config
        self.main = par.rank == 0
        self.path = ws.metrics_path
        self.board = None
        if self.main:
            self.board = Board(
                ws,
                "pretrain",
                resume_step=None if resume_from is None else start_step,
                wandb=wandb,
                config={"train": asdict(cfg), "plan": self.plan.to_dict()},
            )
            self.board.charts(BOARD_CHARTS)
            info(f"TensorBoard: tensorboard --logdir {ws.tensorboard_dir}  (this run: {self.board.directory})")
        if self.main and resume_from is None:
            atomic_write_bytes(self.path, b"")
        elif self.main and self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line and json.loads(line).get("step", 0) <= start_step
            ]
            atomic_write_bytes(self.path, "".join(line + "\n" for line in kept).encode())
        if resume_from is not None:  # the log says where a resumed run picked up
            self.write(
                {"event": "resume", "step": start_step, "checkpoint": str(resume_from), "world_size": par.world_size}
            )
        self.peak_cache, self.peak_key = ws.root / PEAK_CACHE, machine_key(par.device, par.world_size)
        self.peak_flops: float | None = job_peak_flops(par, self.peak_cache)  # None once proved wrong
        card = datasheet_peak(par.device)
        # the whole job's datasheet peak (its processes each drive one such card)
        self.card, self.datasheet_flops = (card[0], card[1] * par.world_size) if card else (None, None)
        self.flops_per_token, self.tokens_per_step = flops_per_token, cfg.batch_size * cfg.seq_len
        # the planner's step time and memory for the plan (when this machine was measured), and sizing's ranking
        prediction = prediction or {}
        self.prediction = prediction if "step_s" in prediction else None
        self.sizing, self.memory_base_mb = prediction.get("sizing"), memory_base_mb
        self.uniform_loss = math.log(cfg.model.vocab_size)  # a model that learned nothing
        if self.sizing and resume_from is None:
            self.write({"event": "sizing", "step": start_step, **self.sizing})
            if self.board:
                self.board.text("sizing", sizing_markdown(self.sizing))
        self.run_start = self.last_log = time.perf_counter()
        self.steps_since_log = 0

    def write(self, record: dict) -> None:
        """A record of metrics.jsonl, and its figures as TensorBoard scalars at its step."""
        if self.main:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if self.board and "step" in record:
                self.board.scalars(record["step"], board_values(record))

    def start(self) -> None:
        self.run_start = self.last_log = time.perf_counter()

    def count_step(self) -> None:
        """After a step that is not logged: its tokens count toward the next logged step's tokens/s."""
        self.steps_since_log += 1

    def train_step(
        self,
        done: int,
        loss: float,
        lr: float,
        grad_norm: float,
        comm_s: float,
        step_s: float,
        pm,
        optimizers,
    ) -> None:
        """After a logged step: its record and progress line."""
        self.count_step()
        par, cfg, plan = self.par, self.cfg, self.plan
        now = time.perf_counter()
        tokens_per_s = self.steps_since_log * self.tokens_per_step / (now - self.last_log)
        eta = (cfg.max_steps - done) * self.tokens_per_step / tokens_per_s
        # Per rank: peak memory, weights + optimizer state, seconds in communication, step seconds, bubble.
        ranks = gather_floats(
            par,
            [peak_memory_mb(par.device), model_state_mb(pm.parts, optimizers), comm_s, step_s, pm.bubble_fraction()],
        )
        if self.main:
            achieved = tokens_per_s * self.flops_per_token
            self.check_measured_peak(achieved, done)
            record = {
                "event": "train",
                "step": done,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens_per_s": tokens_per_s,
                # against the datasheet where the card is known, else against the measured peak
                "mfu": achieved / (self.datasheet_flops or self.peak_flops),
                "mfu_datasheet": achieved / self.datasheet_flops if self.datasheet_flops else None,
                "mfu_measured": achieved / self.peak_flops if self.peak_flops else None,
                "matmul_peak_flops": self.peak_flops,
                "datasheet_peak_flops": self.datasheet_flops,
                "peak_rss_mb": peak_rss_mb(),
                "peak_mem_mb_per_rank": [r[0] for r in ranks],
                "model_state_mb_per_rank": [r[1] for r in ranks],
                "step_s": step_s,
                "comm_s_per_rank": [r[2] for r in ranks],
                "comm_fraction": sum(r[2] / r[3] for r in ranks) / len(ranks),
                "tokens_seen": done * self.tokens_per_step,
                "elapsed_s": now - self.run_start,
                "world_size": par.world_size,
                "strategy": plan.strategy,
            }
            if self.prediction:
                record.update(
                    predicted_step_s=self.prediction["step_s"],
                    measured_step_s=step_s,
                    predicted_peak_mem_mb=self.prediction["peak_mem_mb"],
                    measured_peak_mem_mb=max(r[0] for r in ranks) - self.memory_base_mb,
                )
            if plan.pp > 1:
                bubbles = [r[4] for r in ranks]
                record.update(
                    bubble_fraction=sum(bubbles) / len(bubbles),
                    bubble_fraction_per_rank=bubbles,
                    bubble_theory=theoretical_bubble(plan),
                )
            self.write(record)
            info(
                f"step {done}/{cfg.max_steps}  loss {loss:.4f}  lr {lr:.2e}  "
                f"{tokens_per_s:,.0f} tok/s  {self.mfu_text(record)}  "
                f"comm {record['comm_fraction']:.0%}"
                + (f"  bubble {record['bubble_fraction']:.0%}" if plan.pp > 1 else "")
                + f"  eta {format_eta(eta)}"
            )
        self.last_log, self.steps_since_log = time.perf_counter(), 0

    def check_measured_peak(self, achieved: float, done: int) -> None:
        """A run computing faster than the measured peak proves the measurement wrong (hardware.checked_peak)."""
        if self.peak_flops is None or achieved <= self.peak_flops:
            return
        measured, self.peak_flops = self.peak_flops, checked_peak(achieved, self.peak_flops, self.datasheet_flops)
        if self.peak_flops is None:
            info(
                f"this run computes {achieved / 1e12:,.1f} TFLOP/s, above the matmul peak measured here "
                f"({measured / 1e12:,.1f}): that measurement was wrong, so MFU is against the datasheet peak "
                f"of the {self.card} alone ({self.datasheet_flops / 1e12:,.1f} TFLOP/s)"
            )
            return
        info(
            f"this run computes {achieved / 1e9:,.1f} GFLOP/s, above the matmul peak measured here "
            f"({measured / 1e9:,.1f}): the peak was measured low; it is now {achieved / 1e9:,.1f}"
        )
        self.peak_flops = _peak_flops[self.peak_key] = record_peak(
            self.peak_cache, self.peak_key, achieved, f"achieved by training, step {done}"
        )

    def peaks_text(self) -> str:
        """What MFU is against, for the line before training starts."""
        measured = f"this machine's measured matmul peak, {self.peak_flops / 1e9:,.1f} GFLOP/s ({self.peak_cache.name})"
        if self.datasheet_flops is None:
            card = "" if self.par.device.type == "cpu" else " (no datasheet peak is known for this card)"
            return f"MFU below is model FLOP/s against {measured}{card}, not a datasheet peak"
        return (
            f"MFU below is model FLOP/s against the datasheet dense bf16 peak of the {self.card} "
            f"({self.datasheet_flops / 1e12:,.1f} TFLOP/s for the job) and against {measured}"
        )

    @staticmethod
    def mfu_text(record: dict) -> str:
        if record["mfu_datasheet"] is None:
            return f"MFU {record['mfu']:.1%} of measured peak"
        measured = "" if record["mfu_measured"] is None else f", {record['mfu_measured']:.1%} of measured"
        return f"MFU {record['mfu_datasheet']:.1%} of datasheet{measured}"

    def validation(self, done: int, val_loss: float) -> None:
        self.write({"event": "val", "step": done, "val_loss": val_loss, "val_ppl": math.exp(val_loss)})
        if self.main:
            info(f"step {done}: validation loss {val_loss:.4f}, perplexity {math.exp(val_loss):.1f}")

    def end(self, done: int, val_loss: float | None, best_step: int | None, best_val_loss: float | None) -> None:
        """The validation loss the run reached, beside what was predicted of it: sizing ranked the shape by
        a scaling law whose value (law_loss) is recorded to show how far off it is, never printed as a forecast."""
        record = {
            "event": "end",
            "step": done,
            "val_loss_reached": val_loss,
            "best_step": best_step,
            "best_val_loss": best_val_loss,  # the weights exported
            "uniform_loss": self.uniform_loss,
        }
        chosen = next((c for c in self.sizing["shapes"] if c["chosen"]), None) if self.sizing else None
        if chosen is not None:
            record.update(
                law_rank=chosen["law_rank"], shapes_ranked=len(self.sizing["shapes"]), law_loss=chosen["law_loss"]
            )
        self.write(record)
        if self.main and val_loss is not None:
            line = (
                f"validation loss reached {val_loss:.4f}"
                + (f", best {best_val_loss:.4f} at step {best_step}" if best_val_loss is not None else "")
                + f" (a model that learned nothing scores ln {self.cfg.model.vocab_size} = {self.uniform_loss:.2f})"
            )
            if chosen is not None:
                line += (
                    f"; sizing ranked this shape {chosen['law_rank']} of {record['shapes_ranked']} by the scaling law"
                )
            info(line)
            self.board.text("result", line, done)

    def close(self) -> None:
        if self.board:
            self.board.close()
