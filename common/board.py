"""A training run's curves as TensorBoard event files, and, when the user asks, the same in Weights & Biases.

Each run writes one directory under the workspace's tensorboard/ (`pretrain`, `tune-static`,
`tune-transformer`): a new run of its kind replaces it, a resumed one continues it (the events past the
checkpoint it resumes from are purged, as metrics.jsonl's lines are). `tensorboard --logdir
WORKSPACE/tensorboard` shows them side by side. With --wandb, W&B mirrors the event files as they are
written (`wandb.tensorboard.patch`, W&B's sync_tensorboard): one writer, two views. W&B's own settings apply
(WANDB_PROJECT, WANDB_MODE=offline keeps the run in WORKSPACE/wandb/ with no network; `wandb sync` uploads
it later). wandb is not a dependency: --wandb without it installed is an error before the command starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

from common.errors import PipelineError
from common.workspace import Workspace

WANDB_PROJECT = "embedding-pipeline"  # unless WANDB_PROJECT says otherwise


def require_wandb() -> None:
    """--wandb's check, made before anything is written."""
    if importlib.util.find_spec("wandb") is None:
        raise PipelineError("--wandb: the wandb package is not installed (pip install wandb), or drop --wandb")


class Board:
    """One run's TensorBoard directory (tensorboard/NAME), written by the one process that owns the run's log."""

    def __init__(
        self, ws: Workspace, name: str, resume_step: int | None = None, wandb: bool = False, config: dict | None = None
    ):
        from torch.utils.tensorboard import SummaryWriter

        self.directory = ws.tensorboard_dir / name
        if resume_step is None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.wandb = None
        if wandb:  # before the writer: W&B patches TensorBoard's event writer to mirror what it writes
            require_wandb()
            import wandb as wandb_module

            wandb_module.tensorboard.patch(root_logdir=str(ws.tensorboard_dir))  # sync_tensorboard, rooted here
            self.wandb = wandb_module.init(
                project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), name=name, dir=str(ws.root), config=config
            )
        # purge_step: TensorBoard drops this directory's events from that step on, written before a resume
        self.writer = SummaryWriter(
            str(self.directory), purge_step=None if resume_step is None else resume_step + 1, flush_secs=10
        )

    def scalars(self, step: int, values: dict[str, Any]) -> None:
        for tag, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def text(self, tag: str, markdown: str, step: int = 0) -> None:
        self.writer.add_text(tag, markdown, step)
        self.writer.flush()

    def charts(self, layout: dict[str, dict[str, list[str]]]) -> None:
        """Charts that draw several scalars together (TensorBoard's Custom Scalars tab): {section: {chart: tags}}."""
        self.writer.add_custom_scalars(
            {
                section: {chart: ["Multiline", tags] for chart, tags in charts.items()}
                for section, charts in layout.items()
            }
        )

    def close(self) -> None:
        self.writer.close()
        if self.wandb is not None:
            import wandb as wandb_module

            self.wandb.finish()
            wandb_module.tensorboard.unpatch()  # the next run (tune's second candidate) patches it again
            self.wandb = None
