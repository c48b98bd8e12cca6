"""Pretraining on a Ray cluster: the same train() under a Ray Train TorchTrainer.

Ray starts one worker per process of the plan (per GPU, or per CPU slot on CPU clusters) and sets
up the process group; train() builds its DeviceMesh on top of it, exactly as under torchrun. Every
checkpoint train() writes (torch.distributed.checkpoint, into the workspace) is reported to Ray
Train, which copies it to `storage_path`. When a worker dies, Ray (up to --max-failures times)
starts a new worker group, and the loop resumes from the latest reported checkpoint.

The workspace must be on storage every node sees (NFS or similar): workers read the token files
from it and write the checkpoints and the export into it.

Output. Ray keeps its workers' output in its own log directory (common/ray_cluster.py). Rank 0 writes
what train() tells the user (the plan, each step, validation, the export) to PROGRESS_LOG in the workspace
instead, and the driver shows each line as it is written: the lines of a run on one machine, without
Ray's notices or a prefix per actor; a fault Ray's driver is told of is one warning on stderr
(common/ray_cluster.py notices_on_stderr).
"""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import asdict
from pathlib import Path

from common.console import info
from common.errors import PipelineError
from common.manifest import ModelEntry, read_manifest
from common.ray_cluster import connect, notices_on_stderr
from common.workspace import Workspace

PROGRESS_LOG = "ray-progress.log"  # in the workspace: rank 0's lines, shown by the driver as they come
FOLLOW_INTERVAL_S = 0.2


def checkpoint_step(path: Path) -> int:
    return json.loads((path / "train_state.json").read_text())["step"]


def train_loop_per_worker(config: dict) -> None:
    """Runs on every Ray Train worker."""
    import ray.train

    from common import console
    from pretrain.checkpoint import checkpoint_dirs
    from pretrain.config import ParallelConfig, RuntimeOptions, train_config_from_dict
    from pretrain.train import train

    ws = Workspace(Path(config["workspace"]))
    if ray.train.get_context().get_world_rank() == 0:
        console.err.file = (ws.root / PROGRESS_LOG).open("a", encoding="utf-8")  # rich flushes each line
    # A restarted worker group continues from the newest checkpoint of this run: the one Ray Train
    # committed, or a newer complete one in the workspace (Ray commits reports with a lag; the
    # driver emptied the workspace's checkpoints before a fresh run, so all of them are this run's).
    candidates = [Path(config["resume_from"])] if config["resume_from"] else []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        candidates.append(Path(checkpoint.path))
    candidates += checkpoint_dirs(ws)[-1:]
    resume_from = max(candidates, key=checkpoint_step) if candidates else None

    def report(path: Path, step: int, metrics: dict) -> None:
        is_rank_0 = ray.train.get_context().get_world_rank() == 0
        ray.train.report(
            {"step": step, **metrics},
            checkpoint=ray.train.Checkpoint.from_directory(str(path)) if is_rank_0 else None,
            checkpoint_dir_name=path.name,
        )

    train(
        ws,
        train_config_from_dict(config["train"]),
        resume_from=resume_from,
        plan=ParallelConfig(**config["plan"]),
        options=RuntimeOptions(**config["options"]),
        on_checkpoint=report,
        prediction=config["prediction"],
    )


def run_on_ray(
    ws: Workspace,
    cfg,
    plan,
    options,
    resume_from: Path | None,
    address: str,
    max_failures: int,
    storage_path: Path | None = None,
    prediction: dict | None = None,
) -> ModelEntry | None:
    ray = connect(address)
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu = ray.cluster_resources().get("GPU", 0) >= plan.world_size
    storage = (storage_path or ws.root / "ray").resolve()
    info(
        f"training on Ray ({address}): {plan.world_size} workers, {'one GPU' if use_gpu else 'one CPU'} each; "
        f"checkpoints reported to {storage}; up to {max_failures} worker failures recovered"
    )
    if resume_from is None:  # a fresh run: checkpoints left in the workspace belong to an older one
        shutil.rmtree(ws.checkpoints_dir, ignore_errors=True)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "workspace": str(ws.root.resolve()),
            "train": asdict(cfg),
            "plan": plan.to_dict(),
            "options": options.to_dict(),
            "resume_from": str(resume_from.resolve()) if resume_from else None,
            "prediction": prediction,
        },
        scaling_config=ScalingConfig(num_workers=plan.world_size, use_gpu=use_gpu, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo", timeout_s=int(options.timeout_s)),
        run_config=RunConfig(
            name="pretrain",
            storage_path=str(storage),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    try:
        with FollowedLines(ws.root / PROGRESS_LOG), notices_on_stderr():
            trainer.fit()
    except Exception as e:  # Ray wraps worker errors; show the root cause in one line
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise PipelineError(
            f"training on Ray failed: {type(cause).__name__}: "
            f"{str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
        ) from None
    return read_manifest(ws).model


class FollowedLines:
    """Shows each line appended to `path` (emptied first) as it comes, from a thread, until the block ends."""

    def __init__(self, path: Path):
        self.path = path
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.follow, daemon=True)

    def __enter__(self) -> "FollowedLines":
        self.path.write_text("", encoding="utf-8")
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    def follow(self) -> None:
        with self.path.open(encoding="utf-8") as lines:
            partial = ""
            while True:
                finished = self.done.wait(FOLLOW_INTERVAL_S)
                *complete, partial = (partial + lines.read()).split("\n")
                for line in complete:
                    info(line)
                if finished:
                    return


def cluster_workers(address: str) -> int:
    """Default worker count: one per GPU in the cluster, else one per CPU slot."""
    ray = connect(address)
    resources = ray.cluster_resources()
    return int(resources.get("GPU", 0)) or max(1, int(resources.get("CPU", 1)))
