"""Worker entry point of bench_planner.py (python -m benchmarks.planner_worker SPEC, started by torchrun).

The training worker of pretrain.launch with two additions: the link emulator from
$PIPELINE_LINK_EMULATOR, and a memory measurement per run. On CPU the peak resident set (VmHWM) is
reset before each run (/proc/self/clear_refs, value 5) and the resident set just before the run is
subtracted, so the number is the memory the run added: parameters, gradients, optimizer states,
activations and buffers, like the planner's estimate. The benchmark's memory jobs (only those: it
slows every large allocation) set MALLOC_MMAP_THRESHOLD_ so that freed tensors go back to the OS and
the resident set follows the live tensors.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(spec_json: str) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/linkemu.py
    import linkemu
    from common.workspace import Workspace
    from pretrain import metrics
    from pretrain.config import ParallelConfig, RuntimeOptions, train_config_from_dict
    from pretrain.hardware import machine_key
    from pretrain.train import train

    linkemu.install_from_env()
    try:
        for run in json.loads(spec_json):
            plan = ParallelConfig(**run["plan"])
            # MFU's matmul peak is measured inside train() unless known; its 12 MB of matrices would count as
            # the run's memory, and MFU is not what this benchmark looks at: a peak no run reaches, never measured.
            metrics._peak_flops[machine_key(torch.device("cpu"), plan.world_size)] = 1e30
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")
            base = _status_kb("VmRSS")
            train(
                Workspace(Path(run["workspace"])),
                train_config_from_dict(run["train"]),
                plan=plan,
                options=RuntimeOptions(**run["options"]),
                export=False,
            )
            peak = _status_kb("VmHWM") - base
            rank = dist.get_rank() if dist.is_initialized() else 0
            (Path(run["workspace"]) / f"mem_rank{rank}.json").write_text(json.dumps({"peak_added_mb": peak / 1024}))
            gc.collect()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    del torch


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    record(worker)(sys.argv[1])
