"""This machine's matmul peak, the denominator of model-FLOPs utilisation (MFU).

MFU here is model FLOP/s over the measured FLOP/s of a large square matmul: what this machine sustains,
not a datasheet figure. A measurement taken while other work shares the machine comes out low (and MFU
high), so the peak is the best of several short repeats, kept per machine and job size in the
workspace (matmul_peak.json) and measured once. A run that computes faster than the recorded peak
proves the peak was measured low: training then records what it achieved as the peak, so MFU never
exceeds 100%.
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


def measure_matmul_flops(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int = 1024,
    seconds: float = 0.5,
    repeats: int = 5,
) -> float:
    """Sustained FLOP/s of a square matmul on `device`: the best of `repeats` timings of seconds/repeats
    each (other work on the machine slows some of them down; none speeds one up)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.mm(a, b)  # warm-up
    _sync(device)
    best = 0.0
    for _ in range(repeats):
        iterations, start = 0, time.perf_counter()
        while iterations == 0 or time.perf_counter() - start < seconds / repeats:
            torch.mm(a, b)
            iterations += 1
        _sync(device)
        best = max(best, 2 * size**3 * iterations / (time.perf_counter() - start))
    return best


def machine_key(device: torch.device, world_size: int) -> str:
    """What the peak belongs to: this host, its device, the job's process count and threads per process."""
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = f"CPU {platform.machine()} {torch.get_num_threads()} threads"
    return f"{socket.gethostname()}|{what}|{world_size} process(es)"


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


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
