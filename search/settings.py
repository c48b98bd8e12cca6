"""`pipeline search`, `pipeline eval` and `pipeline serve`'s settings, declared once (common/options.py): cli.py
makes each command's options from these fields, and workflows.py runs with the same dataclasses.

Light on purpose (no faiss, no torch): the CLI imports it to build `--help`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, get_args

from common.options import MAX_PORT, OptionError, check_declared, option

SearchMode = Literal["dense", "lexical", "hybrid"]
MODES: tuple[str, ...] = get_args(SearchMode)
EvalMode = Literal[SearchMode, "all"]  # all: every mode the index has
MAX_K = 1000  # documents a query may ask for

MODE_HELP = (
    "Retriever (default: the mode `pipeline index` or `pipeline eval --set-default` measured best, else lexical)."
)
DENSE_WEIGHT_HELP = (
    "Hybrid only: weight of the dense ranking in the fusion (lexical gets 1 - it) "
    "(default: the workspace's, set by eval --set-default, else 0.5)."
)
WHERE_HELP = (
    "Only documents for which this condition holds, over their metadata fields (the columns of the input files), "
    "doc_id, title and source, e.g. \"year >= 2015 AND journal = 'Nature'\": comparisons, AND/OR/NOT, IN, BETWEEN, "
    "LIKE, and text, list and date functions; not SQL statements."
)


def document_filter(where: str | None, source: str | None = None, title: str | None = None):
    """--where, --source and --title as one filter (all must hold), or None."""
    from search.filters import DocumentFilter

    structured = {
        **({"source": {"glob": source}} if source else {}),
        **({"title": {"contains": title}} if title else {}),
    }
    return DocumentFilter.of(structured, where)


@dataclass
class SearchSettings:
    """Everything `pipeline search` can be told besides the query."""

    k: int = option(10, "Number of documents to return.", flags=("-k",), min=1, max=MAX_K)
    mode: Optional[SearchMode] = option(None, MODE_HELP)
    dense_weight: Optional[float] = option(None, DENSE_WEIGHT_HELP, min=0, max=1)
    where: Optional[str] = option(None, WHERE_HELP, metavar="CONDITION")
    source: Optional[str] = option(
        None,
        "Only documents whose source file matches this glob, absolute or relative to the current directory, "
        "e.g. 'docs/*.md'.",
        metavar="GLOB",
    )
    title: Optional[str] = option(
        None, "Only documents whose title contains this text (case-insensitive).", metavar="TEXT"
    )

    def __post_init__(self):
        check_declared(self)

    def document_filter(self):
        return document_filter(self.where, self.source, self.title)


@dataclass
class EvalSettings:
    """Everything `pipeline eval` can be told: the judged queries, and how to search them."""

    queries: Path = option(help='BEIR queries.jsonl: {"_id": ..., "text": ...} per line.', required=True)
    qrels: Path = option(help="BEIR qrels .tsv: query-id, corpus-id, score (header line optional).", required=True)
    mode: Optional[EvalMode] = option(None, "Retriever, or all of them (default: the search default).")
    k: int = option(100, "Documents retrieved per query (Recall@100 needs 100).", flags=("-k",), min=1, max=MAX_K)
    dense_weight: Optional[float] = option(None, DENSE_WEIGHT_HELP, min=0, max=1)
    where: Optional[str] = option(None, WHERE_HELP, metavar="CONDITION")
    set_default: bool = option(
        False,
        "With --mode all: make the best mode (by nDCG@10), and the --dense-weight used, this workspace's default "
        "for search and serve.",
        flags=("--set-default",),
    )

    def __post_init__(self):
        check_declared(self)
        if self.set_default and self.mode != "all":
            raise OptionError("--set-default", "it needs --mode all: the default is the best of the measured modes")
        if self.set_default and self.where is not None:
            raise OptionError("--set-default", "it measures the whole collection: leave out --where")

    def document_filter(self):
        return document_filter(self.where)


@dataclass
class ServeSettings:
    """Everything `pipeline serve` can be told."""

    host: str = option("127.0.0.1", "Address to listen on (loopback by default; 0.0.0.0 exposes it to the network).")
    port: int = option(8000, "TCP port.", min=1, max=MAX_PORT)
    api_key: Optional[str] = option(
        None,
        "Require this key (X-API-Key header or ?api_key=) on the data routes: /search, /documents, /fields, "
        "/runs.json. /health, /openapi.json and the pages (/, /runs, /docs; they ask for the key) stay open.",
        envvar="PIPELINE_API_KEY",
    )
    ray: Optional[str] = option(
        None,
        "Serve on a Ray cluster with Ray Serve, a deployment per shard: local, auto, or the head's address (the "
        "workspace on storage every node reads; needs the ray extra).",
    )
    replicas: int = option(1, "With --ray: replicas of each shard (Ray Serve restarts one that dies).", min=1, max=64)

    def __post_init__(self):
        check_declared(self)
        if self.ray is None and self.replicas != 1:
            raise OptionError("--replicas", "it is for --ray: give --ray ADDRESS too")
