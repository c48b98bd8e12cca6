"""The peaks MFU (model-FLOPs utilisation) is reported against: measured here, and the card's datasheet.

The measured peak is what this machine sustains on a large square matmul, measured as GPUs are measured
(llm.c and torchtitan report MFU against the datasheet; the measurement shows what this card reaches):
on a GPU, bf16 matmuls of 8192 x 8192 (large enough to saturate an H100), after a warm-up, timed with
CUDA events; on a CPU, float32 matmuls of 1024. A measurement taken while other work shares the machine
comes out low, so the peak is the best of several short repeats, kept per machine, job size and method in
the workspace (matmul_peak.json) and measured once.

The datasheet peak is the dense bf16 tensor-core figure of known GPUs (DATASHEET_BF16_TFLOPS); an
unknown card, or a CPU, has none, and says so.

A run that computes faster than the measured peak proves the measurement wrong. Where the datasheet
peak is known, the measurement is dropped and MFU is against the datasheet alone (said once); where it
is not (a CPU, an unknown card), the run's own rate becomes the measured peak (said each time), so MFU
never exceeds 100%.
"""

from __future__ import annotations

import json
import platform
import socket
import time
from pathlib import Path

import torch

from common.workspace import atomic_write_json

PEAK_CACHE = "matmul_peak.json"
GPU_MATMUL = (torch.bfloat16, 8192)  # dtype and size of the matmul a GPU's peak is measured with
CPU_MATMUL = (torch.float32, 1024)

# Dense bf16 tensor-core TFLOP/s from NVIDIA's datasheets (no sparsity), by a part of the name
# torch.cuda.get_device_name gives; the first match wins, so the more specific names come first.
DATASHEET_BF16_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H200 NVL", 835.0),
    ("H100", 989.4),  # SXM
    ("H200", 989.4),  # SXM; GH200 too
    ("H20", 148.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.1),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A6000", 154.8),  # RTX A6000
)


def matmul_method(device: torch.device | str) -> tuple[torch.dtype, int]:
    return GPU_MATMUL if torch.device(device).type == "cuda" else CPU_MATMUL


def measure_matmul_flops(
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    size: int | None = None,
    seconds: float = 0.5,
    repeats: int = 5,
) -> float:
    """Sustained FLOP/s of a square matmul on `device` (by default the method of matmul_method): the best
    of `repeats` timings of seconds/repeats each (other work on the machine slows some of them down; none
    speeds one up), after a warm-up of as long."""
    device = torch.device(device)
    default_dtype, default_size = matmul_method(device)
    dtype, size = dtype or default_dtype, size or default_size
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    flops = 2 * size**3
    if device.type == "cuda":
        return _best_cuda_rate(a, b, flops, seconds, repeats)
    best = 0.0
    for i in range(repeats + 1):
        iterations, start = 0, time.perf_counter()
        while iterations == 0 or time.perf_counter() - start < seconds / repeats:
            torch.mm(a, b)
            iterations += 1
        if i > 0:  # the first round warms up
            best = max(best, flops * iterations / (time.perf_counter() - start))
    return best


def _best_cuda_rate(a: torch.Tensor, b: torch.Tensor, flops: int, seconds: float, repeats: int) -> float:
    """The best FLOP/s of `repeats` rounds of back-to-back matmuls, each timed by CUDA events around it
    (the host only queues the work), after a round that warms up the clocks and the kernel choice."""
    torch.mm(a, b)
    torch.cuda.synchronize(a.device)
    start = time.perf_counter()
    torch.mm(a, b)
    torch.cuda.synchronize(a.device)
    per_round = max(1, int(seconds / repeats / max(time.perf_counter() - start, 1e-6)))
    best = 0.0
    for i in range(repeats + 1):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(per_round):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        if i > 0:
            best = max(best, flops * per_round / (begin.elapsed_time(end) / 1000))
    return best


def datasheet_peak(device: torch.device | str) -> tuple[str, float] | None:
    """(the card's name, its datasheet dense bf16 FLOP/s) for a known GPU; None for a CPU or an unknown card."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return card_peak(torch.cuda.get_device_name(device))


def card_peak(name: str) -> tuple[str, float] | None:
    for part, tflops in DATASHEET_BF16_TFLOPS:
        if part.lower() in name.lower():
            return name, tflops * 1e12
    return None


def checked_peak(achieved: float, measured: float, datasheet: float | None) -> float | None:
    """The measured peak to go on reporting MFU against once a run computes `achieved` FLOP/s: unchanged
    when it is at least that; else the measurement is wrong, and is dropped (None) where a datasheet peak
    stands instead, or raised to `achieved` where none does (a CPU, an unknown card)."""
    if achieved <= measured:
        return measured
    return None if datasheet else achieved


def machine_key(device: torch.device, world_size: int) -> str:
    """What the peak belongs to: this host, its device, the job's process count and threads per process, and
    how it is measured (a peak recorded by another method is measured again)."""
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = f"CPU {platform.machine()} {torch.get_num_threads()} threads"
    dtype, size = matmul_method(device)
    method = f"{str(dtype).removeprefix('torch.')} {size}x{size}"
    return f"{socket.gethostname()}|{what}|{world_size} process(es)|{method}"


def cached_peak(cache: Path, key: str) -> float | None:
    try:
        value = json.loads(cache.read_text()).get(key, {}).get("flops")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def record_peak(cache: Path, key: str, flops: float, how: str) -> float:
    """Keep `flops` as the peak for `key` unless a higher one is recorded; returns the peak kept."""
    try:
        entries = json.loads(cache.read_text())
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    known = cached_peak(cache, key) or 0.0
    if flops > known:
        entries[key] = {"flops": flops, "how": how}
        atomic_write_json(cache, entries)
    return max(flops, known)
