"""Shared by every stage: the workspace layout, its manifest, document readers and the DuckDB store."""

import os

# Nothing is ever downloaded: models come from local directories only. Quiet the libraries' own bars.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault(
    "TQDM_DISABLE", "1"
)  # e.g. sentence-transformers' "Computing widget examples" in tune; tqdm reads it on import
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
