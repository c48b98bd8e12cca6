"""`pipeline embed`'s and `pipeline tune`'s settings, declared once (common/options.py): cli.py makes each
command's options from these fields, and workflows.py and the stage run with the same dataclass.

Light on purpose (no torch): the CLI imports it to build `--help`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, get_args

from common.durations import parse_duration
from common.options import SEED_MAX, OptionError, check_declared, option

Architecture = Literal["auto", "static", "transformer"]
Pooling = Literal["mean", "weightedmean", "lasttoken"]
PairKind = Literal["title", "ict", "neighbours", "dropout"]
PAIR_KINDS: tuple[str, ...] = get_args(PairKind)
DEFAULT_LR = {"static": 5e-2, "transformer": 3e-4}
MIN_CHUNK_TOKENS = 8  # the fewest tokens per chunk embed takes


@dataclass
class EmbedSettings:
    """Everything `pipeline embed` can be told besides its documents."""

    model_dir: Optional[Path] = option(
        None,
        "A sentence-transformers model directory (default: the workspace's tuned model, else its pretrained one).",
        flags=("--model",),
    )
    chunk_tokens: Optional[int] = option(
        None, "Tokens per chunk (default: the model's maximum input less 32 for the title).", min=MIN_CHUNK_TOKENS
    )
    overlap: int = option(32, "Tokens shared by consecutive chunks (fewer than --chunk-tokens).", min=0)
    batch_size: int = option(64, "Chunks per forward pass.", min=1)
    prune: bool = option(
        False,
        "Remove stored documents that are no longer in the source (an unreadable file keeps its own).",
        flags=("--prune/--no-prune",),
    )
    ray: Optional[str] = option(
        None, "Embed on a Ray cluster: local, auto, or the head's address (needs the ray extra)."
    )
    group_size: int = 1024  # documents per transaction; larger groups sort better by length (not an option)

    def __post_init__(self):
        check_declared(self)
        if self.chunk_tokens is not None and self.overlap >= self.chunk_tokens:
            raise OptionError("--overlap", f"{self.overlap} is not below --chunk-tokens {self.chunk_tokens}")


@dataclass
class TuneSettings:
    """Everything `pipeline tune` can be told (and the chained adaptation of `pipeline pretrain` uses, at
    these defaults)."""

    architecture: Architecture = option(
        "auto",
        "static (the GPT-2's token embeddings, mean of a text's tokens; fast, best on CPU), transformer (the whole "
        "GPT-2 plus pooling), or auto: static, and the transformer too if its steps fit --time-budget here "
        "(batches of up to 256, its own learning rate), the better on held-out documents kept.",
    )
    time_budget: str = option(
        "12m",
        "Time for the whole command (e.g. 90s, 15m, 1h): steps (at most --steps) and the pairs mined for them are "
        "planned from a step and mining timed here; with auto, both candidates and their measurement fit in it.",
        duration=True,
        metavar="DURATION",
    )
    pairs_from: str = option(
        "title,ict,neighbours",
        f"Pairs the corpus gives, comma-separated kinds: {', '.join(PAIR_KINDS)}.",
        metavar="KIND,...",
        listing=PAIR_KINDS,
    )
    hard_negatives: bool = option(
        True,
        "Give each pair a negative mined with BM25 (a document sharing the anchor's words that is not its own).",
        flags=("--hard-negatives/--no-hard-negatives",),
    )
    pairs_file: Optional[Path] = option(
        None,
        'Labelled pairs, JSON lines: {"query": ..., "document": text} or {"query": ..., "doc_id": ...}.',
        flags=("--pairs",),
    )
    pooling: Pooling = option(
        "mean", "With --architecture transformer: mean, weightedmean (position-weighted, SGPT) or lasttoken."
    )
    dimensions: int = option(
        1024,
        "With --architecture static: the width of its token vectors (the pretrained model's, then random ones).",
        min=1,
    )
    steps: int = option(500, "Optimizer steps.", min=1)
    batch_size: int = option(
        1024,
        "Pairs per batch; the other pairs are each one's negatives. A batch holds each document once, so at most a "
        "third as many pairs as there are documents.",
        min=2,
    )
    mini_batch: Optional[int] = option(
        None,
        "Use CachedMultipleNegativesRankingLoss with this many texts per pass (large batches, little memory).",
        min=1,
    )
    lr: Optional[float] = option(None, "Peak learning rate (default: 5e-2 static, 3e-4 transformer).", above=0)
    max_seq_length: int = option(128, "Tokens per training text (longer ones are truncated).", min=1)
    seed: int = option(0, "Random seed (pairs, order, weights).", min=0, max=SEED_MAX)
    loader_workers: Optional[int] = option(
        None,
        "Processes that batch the pairs ahead of the model (default: on a GPU, a quarter of the cores up to 4; "
        "on a CPU none, as they would take the cores the model trains on).",
        min=0,
    )
    wandb: bool = option(
        False,
        "Also log the tuning to Weights & Biases (needs `pip install wandb`; WANDB_MODE=offline keeps it on disk). "
        "TensorBoard event files are always written, under WORKSPACE/tensorboard.",
        flags=("--wandb",),
    )
    # not options: fixed by the adaptation itself
    dropout: float = 0.1
    log_every: int = 10

    def __post_init__(self):
        check_declared(self)
        if self.architecture == "static" and self.pooling != "mean":
            raise OptionError(
                "--pooling",
                f"{self.pooling} is for --architecture transformer: a static embedding is the mean of its token "
                "vectors",
            )

    @property
    def pair_kinds(self) -> tuple[str, ...]:
        return tuple(kind.strip() for kind in self.pairs_from.split(",") if kind.strip())

    @property
    def time_budget_seconds(self) -> float:
        return parse_duration(self.time_budget)

    @property
    def learning_rate(self) -> float:
        """The peak learning rate: the one given, else the architecture's."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.architecture]

    @property
    def max_chars(self) -> int:
        """Characters kept of a training text: ample for max_seq_length tokens; the tokenizer truncates the rest."""
        return self.max_seq_length * 6
