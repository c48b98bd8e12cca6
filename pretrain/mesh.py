"""The job's processes and its one DeviceMesh.

init_distributed() joins the process group torchrun (or Ray Train) started; build_mesh() is the only
place that builds the mesh, with one named dimension per degree above 1 of the plan, outermost first:

    pp            pipeline stages          pretrain/pipeline_parallel.py
    dp_replicate  data-parallel replicas   DDP alone, or the replicate dimension of HSDP
    dp_shard      data-parallel shards     FSDP2 fully_shard
    tp            tensor-parallel shards   DTensor parallelize_module, Megatron-style

so tensor-parallel ranks are neighbours (same host) and pipeline stages are furthest apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from common.errors import PipelineError
from pretrain.config import MESH_DIMS, ParallelConfig


@dataclass
class Parallel:
    """A plan in a running job: the mesh and this rank's place in it."""

    config: ParallelConfig
    mesh: DeviceMesh | None
    device: torch.device
    rank: int = 0
    world_size: int = 1
    coords: dict[str, int] = field(default_factory=dict)

    def coord(self, dim: str) -> int:
        return self.coords.get(dim, 0)

    @property
    def dp_rank(self) -> int:
        return self.coord("dp_replicate") * self.config.dp_shard + self.coord("dp_shard")

    @property
    def pp_rank(self) -> int:
        return self.coord("pp")

    def submesh(self, *dims: str) -> DeviceMesh:
        return self.mesh[dims if len(dims) > 1 else dims[0]]

    def pp_group(self):
        return self.submesh("pp").get_group() if self.config.pp > 1 else None


def init_distributed(config: ParallelConfig, timeout_s: float) -> tuple[int, int, torch.device]:
    """Join the job's process group (started by torchrun); returns (rank, world size, device)."""
    cuda = torch.cuda.is_available()
    if config.world_size == 1 and not dist.is_initialized():
        return 0, 1, torch.device("cuda" if cuda else "cpu")
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise PipelineError(
                f"a plan of {config.world_size} processes must be started with torchrun (pipeline pretrain --nproc N)"
            )
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        # NCCL for GPU tensors, gloo for CPU ones (and for everything on a CPU-only machine).
        dist.init_process_group("cuda:nccl,cpu:gloo" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    if dist.get_world_size() != config.world_size:
        raise PipelineError(
            f"the plan needs {config.world_size} processes ({config.shape()}), the job has {dist.get_world_size()}"
        )
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def build_mesh(config: ParallelConfig, timeout_s: float = 300.0) -> Parallel:
    """The one place that builds the DeviceMesh: dimensions of degree 1 are left out. `timeout_s` bounds
    a collective's wait for a lost peer (RuntimeOptions.timeout_s)."""
    rank, world_size, device = init_distributed(config, timeout_s)
    dims = [(name, getattr(config, name)) for name in MESH_DIMS if getattr(config, name) > 1]
    if not dims:
        return Parallel(config, None, device, rank, world_size)
    mesh = init_device_mesh(
        device.type, tuple(size for _, size in dims), mesh_dim_names=tuple(name for name, _ in dims)
    )
    coords = {name: mesh[name].get_local_rank() for name, _ in dims}
    return Parallel(config, mesh, device, rank, world_size, coords)


def barrier(par: Parallel) -> None:
    if par.world_size > 1:
        dist.barrier()


def gather_floats(par: Parallel, values: list[float]) -> list[list[float]]:
    """The same few numbers from every rank, in rank order."""
    if par.world_size == 1:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(par.world_size)]
    dist.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]
