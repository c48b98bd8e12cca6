"""Per-step measurements: time in communication, pipeline busy time, peak memory."""
from __future__ import annotations

import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process since reset_peak_memory: allocated GPU memory on CUDA, resident
    set size on CPU (which includes the Python and PyTorch runtime, some 300-400 MB)."""
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


@contextmanager
def _quiet_stderr():
    """Kineto prints two lines to the C-level stderr whenever a profiler starts or stops."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


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
            with _quiet_stderr():
                self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._profiler is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        with _quiet_stderr():
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
    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self) -> "Stopwatch":
        self._sync()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self.start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
