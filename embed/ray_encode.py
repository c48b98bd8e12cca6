"""Embedding on a Ray cluster with Ray Data: one model per actor, results back in input order.

The driver still chunks the documents and writes DuckDB; only the model forward passes are spread
over the cluster, so the stored vectors are the same as on one process.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from common.ray_cluster import connect


class ChunkEmbedder:
    """A Ray Data actor: loads the model once, then embeds batches of texts."""

    def __init__(self, model_dir: str, batch_size: int):
        from common.models import load_embedder

        self.model = load_embedder(Path(model_dir))
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from common.models import encode

        vectors = encode(self.model, [str(t) for t in batch["text"]], self.batch_size)
        return {"row": batch["row"], "vector": vectors}


class RayEncoder:
    def __init__(self, address: str, model_dir: Path, batch_size: int, workers: int | None = None):
        self.ray = connect(address)
        self.model_dir = str(Path(model_dir).resolve())
        self.batch_size = batch_size
        self.workers = workers or max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        context = self.ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # its INFO lines (execution plans, log paths) are not the user's

    def __call__(self, texts: list[str]) -> np.ndarray:
        rows = [{"row": i, "text": t} for i, t in enumerate(texts)]
        dataset = self.ray.data.from_items(rows, override_num_blocks=min(len(rows), self.workers * 4))
        embedded = dataset.map_batches(
            ChunkEmbedder, fn_constructor_args=(self.model_dir, self.batch_size), batch_size=self.batch_size * 4,
            compute=self.ray.data.ActorPoolStrategy(size=self.workers), num_cpus=1, batch_format="numpy",
        ).take_all()
        embedded.sort(key=lambda r: r["row"])
        return np.stack([np.asarray(r["vector"], dtype=np.float32) for r in embedded])
