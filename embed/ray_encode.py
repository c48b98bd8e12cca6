"""Embedding on a Ray cluster with Ray Data: one model per actor, results back in input order.

The driver still tokenizes and chunks the documents and writes DuckDB; the actors get each chunk's token
ids (embed/ingest.chunk_and_embed) and run only the model, so the stored vectors are the same as on one
process.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from common.ray_cluster import connect, notices_on_stderr


class ChunkEmbedder:
    """A Ray Data actor: loads the model once, then embeds batches of chunks given as token ids."""

    def __init__(self, model_dir: str, batch_size: int):
        from common.embedder import load_embedder

        self.model = load_embedder(Path(model_dir))
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from common.embedder import embed_token_ids

        vectors = embed_token_ids(self.model, list(batch["ids"]), self.batch_size)
        return {"row": batch["row"], "vector": vectors}


class RayEncoder:
    def __init__(self, address: str, model_dir: Path, batch_size: int, workers: int | None = None):
        self.ray = connect(address)
        self.model_dir = str(Path(model_dir).resolve())
        self.batch_size = batch_size
        self.workers = workers or max(1, int(self.ray.cluster_resources().get("CPU", 1)))
        context = self.ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        # Its INFO lines (execution plans, log paths) and its warning that progress bars are off (ours are on)
        # are not the user's.
        logging.getLogger("ray.data").setLevel(logging.ERROR)

    def __call__(self, inputs: list[np.ndarray]) -> np.ndarray:
        rows = [{"row": i, "ids": ids} for i, ids in enumerate(inputs)]
        dataset = self.ray.data.from_items(rows, override_num_blocks=min(len(rows), self.workers * 4))
        embedding = dataset.map_batches(
            ChunkEmbedder,
            fn_constructor_args=(self.model_dir, self.batch_size),
            batch_size=self.batch_size * 4,
            compute=self.ray.data.ActorPoolStrategy(size=self.workers),
            num_cpus=1,
            batch_format="numpy",
        )
        with notices_on_stderr():
            embedded = embedding.take_all()
        embedded.sort(key=lambda r: r["row"])
        return np.stack([np.asarray(r["vector"], dtype=np.float32) for r in embedded])
