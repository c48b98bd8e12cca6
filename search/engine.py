"""Dense search over the workspace: query -> embedding -> FAISS -> best chunk per document."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np

from common.errors import PipelineError
from common.models import encode, load_embedder
from common.store import Store
from common.workspace import Workspace, model_fingerprint

MAX_QUERY_CHARS = 2000


@dataclass
class Hit:
    rank: int
    score: float
    doc_id: str
    title: str
    source: str
    snippet: str
    chunk_id: int

    def to_dict(self) -> dict:
        return asdict(self)


def snippet(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


class SearchEngine:
    """Loads the index and its model once; `search` can then be called many times."""

    def __init__(self, ws: Workspace):
        self.ws = ws
        index_entry = ws.require("index", "run `pipeline embed` and `pipeline index` first")
        embedder = ws.require("embedder", "run `pipeline embed` first")
        index_path = ws.root / index_entry["path"]
        if not index_path.exists():
            raise PipelineError(f"{index_path}: index file missing; run `pipeline index`")
        model_dir = Path(embedder["model_path"])
        if not model_dir.exists():
            raise PipelineError(f"{model_dir}: the embedding model recorded in the manifest is gone")
        current = model_fingerprint(model_dir)
        if index_entry["embedder_fingerprint"] != current:
            raise PipelineError(
                f"the index was built with model {index_entry['embedder_fingerprint']} but {model_dir} now holds "
                f"model {current}: run `pipeline embed` and `pipeline index` again")
        self.index = faiss.deserialize_index(np.fromfile(index_path, dtype=np.uint8))
        self.model = load_embedder(model_dir)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        query = query.strip()
        if not query:
            raise PipelineError("empty query")
        if len(query) > MAX_QUERY_CHARS:
            raise PipelineError(f"query too long: {len(query)} characters (limit {MAX_QUERY_CHARS})")
        if k < 1:
            raise PipelineError(f"k must be at least 1, got {k}")
        vector = encode(self.model, [query])
        total = self.index.ntotal
        fetch = min(total, 4 * k)
        while True:
            scores, ids = self.index.search(vector, fetch)
            with Store(self.ws.db_path, read_only=True) as store:
                details = store.chunk_details([int(i) for i in ids[0] if i >= 0])
            per_doc: dict[str, tuple[float, dict]] = {}
            for score, chunk_id in zip(scores[0], ids[0]):
                row = details.get(int(chunk_id))
                if row is not None and row["doc_id"] not in per_doc:  # results come best-first
                    per_doc[row["doc_id"]] = (float(score), row)
            if len(per_doc) >= k or fetch >= total:
                break
            fetch = min(total, fetch * 4)
        ranked = list(per_doc.values())[:k]
        return [Hit(rank, score, row["doc_id"], row["title"] or "", row["source"] or "", snippet(row["text"] or ""), row["chunk_id"])
                for rank, (score, row) in enumerate(ranked, start=1)]
