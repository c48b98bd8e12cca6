"""Measured device throughput, for model-FLOPs utilisation (MFU)."""
from __future__ import annotations

import time

import torch


def measure_matmul_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.5) -> float:
    """Sustained FLOP/s of a square matmul on `device`: this machine's practical peak."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.mm(a, b)  # warm-up
    _sync(device)
    iterations, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        iterations += 1
    _sync(device)
    return 2 * size**3 * iterations / (time.perf_counter() - start)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
