"""`pipeline index`'s settings, declared once (common/options.py): cli.py makes the command's options from
these fields, and workflows.index runs with the same dataclass.

Light on purpose (no faiss): the CLI imports it to build `pipeline index --help`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from common.options import OptionError, check_declared, option

IndexType = Literal["auto", "flat", "hnsw", "ivf", "ivfpq"]  # ivf, ivfpq: common/dense/ivf.py


@dataclass
class IndexSettings:
    """Everything `pipeline index` can be told."""

    index_type: IndexType = option(
        "auto",
        "FAISS index type: flat is exact; hnsw a graph; ivf int8 codes in inverted lists; ivfpq 64-byte PQ codes in "
        "inverted lists, candidates re-scored exactly. auto: flat below 50,000 vectors, HNSW below 500,000, IVF-PQ "
        "from there.",
        flags=("--type",),
    )
    rebuild: bool = option(False, "Build in full even when the last build could be updated.", flags=("--rebuild",))
    language: str = option(
        "auto",
        "BM25's analyzer: auto (the collection's language, detected), none (no stop words or stemming), or an ISO "
        "639-1 code (en, de, ru, ja, ...); another than the last build's builds in full.",
        metavar="CODE",
    )
    memory_budget: float = option(
        4.0,
        "Memory an IVF index's codes may take, in GB; beyond it their lists are written to disk and memory-mapped.",
        above=0,
        metavar="GB",
    )
    shards: Optional[int] = option(
        None,
        "Split the collection by document into this many shards, each with its own indexes, built in full (default: "
        "as the last build; none for a new workspace). Search merges them: the same results.",
        min=1,
    )
    ray: Optional[str] = option(
        None,
        "Build the shards as tasks on a Ray cluster: local, auto, or the head's address (the workspace on storage "
        "every node reads; needs the ray extra).",
    )

    def __post_init__(self):
        check_declared(self)
        if self.ray is not None and self.shards is None:
            raise OptionError("--ray", "it builds shards: give --shards N too")

    @property
    def memory_budget_bytes(self) -> int:
        return int(self.memory_budget * 2**30)
