"""`pipeline pretrain`'s settings, declared once.

Each field of PretrainSettings is an option of the command (common/options.py): cli.py makes the options
from these fields (name, type, default, help, range), and a Python program passes the same settings to
workflows.pretrain. Each field's range is checked where it is declared, when the settings are made
(`__post_init__`), before anything is written: `--lr nan`, `--batch-size 0` or `--time-budget 0s` is one
line naming the option. Checks that involve several options (the plan's degrees against the process
count, --ray against the multi-node options) are pretrain/run.py's `check_settings`.

Light on purpose (no torch): the CLI imports it to build `pipeline pretrain --help`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from common.durations import parse_duration
from common.options import MAX_PORT, SEED_MAX, check_declared, option

Preset = Literal["tiny", "small", "medium", "large"]
Strategy = Literal["single", "ddp", "fsdp", "tp", "pp", "hybrid", "auto"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv"]

MIN_VOCAB_SIZE = 257  # the byte-level tokenizer's 256 bytes and its end-of-text token (pretrain/tokenizer.py)


@dataclass
class PretrainSettings:
    """Everything `pipeline pretrain` can be told; without a preset, shape or step count the model is sized
    to time_budget."""

    data: list[Path] = option(
        help="File or directory (.txt .md .jsonl .json .csv .parquet); repeatable.",
        flags=("--data", "-d"),
        metavar="PATH",
        factory=list,
    )
    text_field: Optional[str] = option(
        None, "Field holding the text in structured files (auto-detected by default).", metavar="FIELD"
    )
    tokenizer_sample_mb: float = option(
        256.0,
        "Megabytes of text, drawn across the corpus (seeded by --seed), the tokenizer is trained on; "
        "all of it when the corpus is smaller.",
        above=0,
        metavar="MB",
    )
    shard_tokens: int = option(
        100_000_000,
        "Tokens per token file (data/train-00000.bin ...): a shard ends at the first document end past it.",
        min=1,
    )
    tokenize_workers: Optional[int] = option(
        None, "Processes that tokenize the corpus (default: every core, at most one per 4 MB of text).", min=1
    )
    # the model and the run
    preset: Optional[Preset] = option(
        None,
        "Model shape: tiny, small (124M), medium (355M), large (774M) (default: "
        "sized to the data, the machine and --time-budget).",
    )
    time_budget: str = option(
        "12m",
        "Time for the whole command (e.g. 90s, 15m, 1h): 40% planned for pretraining (without --preset/"
        "--max-steps/--tokens: model size and tokens chosen to fit, at most 4 epochs), the adaptation in what "
        "pretraining leaves.",
        duration=True,
        metavar="DURATION",
    )
    max_steps: Optional[int] = option(
        None,
        "Optimizer steps (default: the preset's); 0 exports the model at initialisation (an untrained baseline).",
        min=0,
    )
    tokens: Optional[int] = option(None, "Train on this many tokens instead of --max-steps.", min=1)
    seq_len: Optional[int] = option(None, "Tokens per training sequence.", min=1)
    batch_size: Optional[int] = option(None, "Sequences per optimizer step (global).", min=1)
    grad_accum: int = option(1, "Split each step's batch into this many micro-batches.", min=1)
    lr: Optional[float] = option(None, "Peak learning rate.", above=0)
    seed: int = option(1337, "Random seed (weights, data order).", min=0, max=SEED_MAX)
    vocab_size: Optional[int] = option(
        None, "Tokenizer vocabulary size (at least its 256 bytes and end-of-text).", min=MIN_VOCAB_SIZE
    )
    n_layer: Optional[int] = option(None, "Override the preset's number of layers.", min=1)
    n_head: Optional[int] = option(None, "Override the preset's attention heads.", min=1)
    n_embd: Optional[int] = option(None, "Override the preset's hidden size.", min=1)
    eval_every: Optional[int] = option(None, "Validation every N steps (default: about 20 a run).", min=1)
    patience: int = option(
        5,
        "Stop training after N validations without a new best validation loss (0: never stop early); the "
        "best-validation weights are exported either way.",
        min=0,
    )
    checkpoint_every: int = option(100, "Checkpoint every N steps.", min=1)
    log_every: int = option(10, "Log metrics every N steps.", min=1)
    resume: bool = option(
        False,
        "Continue from the latest checkpoint in the workspace (under any plan); with --data, the documents of "
        "files not tokenized before go into new shards first, and training runs as many more steps as they fill "
        "(unless --max-steps says). The adaptation that follows is this command's: give --no-adapt again to skip it.",
    )
    wandb: bool = option(
        False,
        "Also log the run to Weights & Biases (needs `pip install wandb`; WANDB_MODE=offline keeps it on disk, "
        "WANDB_PROJECT names the project). TensorBoard event files are always written, under WORKSPACE/tensorboard.",
        flags=("--wandb",),
    )
    # the job
    nproc: Optional[int] = option(None, "Processes on this node (default: number of GPUs, 1 on CPU).", min=1)
    nnodes: int = option(1, "Nodes in the job.", min=1)
    node_rank: int = option(0, "This node's rank (multi-node): 0 to --nnodes - 1.", min=0)
    master_addr: Optional[str] = option(None, "Address of node 0 (multi-node).")
    master_port: Optional[int] = option(None, "Port on node 0 (multi-node).", min=1, max=MAX_PORT)
    ray: Optional[str] = option(
        None,
        "Train on a Ray cluster (Ray Train): local, auto, or the head's address; "
        "--nproc is then the number of workers.",
    )
    max_failures: int = option(
        0, "With --ray: dead workers replaced (resuming from the latest checkpoint) up to N times.", min=0
    )
    # the plan: degrees given (or inferred), or the planner's with strategy "auto"
    strategy: Optional[Strategy] = option(
        None, "Parallelism; auto is the planner's top plan (see pipeline plan) (default: from the degrees)."
    )
    dp: Optional[int] = option(None, "Data-parallel degree (DDP for ddp, FSDP otherwise).", min=1)
    dp_replicate: Optional[int] = option(None, "Replicate degree (with --dp-shard: HSDP).", min=1)
    dp_shard: Optional[int] = option(None, "FSDP shard degree.", min=1)
    tp: Optional[int] = option(None, "Tensor-parallel degree.", min=1)
    pp: Optional[int] = option(None, "Pipeline-parallel degree.", min=1)
    pp_schedule: PipelineSchedule = option("1f1b", "Pipeline schedule.")
    microbatches: Optional[int] = option(None, "Pipeline microbatches per step (default: --pp).", min=1)
    stages_per_rank: Optional[int] = option(None, "Pipeline stages per rank (multi-stage schedules; default 2).", min=1)
    pp_split: Optional[str] = option(None, "Layers per pipeline stage, e.g. 5,3 (default: even).")
    autotune: Optional[int] = option(
        None,
        "With --strategy auto: run 4 steps of each of the planner's top K plans and keep the measured fastest.",
        min=1,
    )
    cluster: Optional[Path] = option(
        None, "With --strategy auto: cluster TOML file (needed for several nodes; default: measure this machine)."
    )
    # how each rank runs (RuntimeOptions); None: on with a GPU
    bf16: Optional[bool] = option(None, "bf16 autocast (default: on with a GPU).", flags=("--bf16/--no-bf16",))
    compile: bool = option(False, "torch.compile each block.", flags=("--compile",))
    ac: bool = option(False, "Activation checkpointing of each block.", flags=("--ac",))
    fused_adamw: Optional[bool] = option(
        None, "Fused AdamW (default: on with a GPU).", flags=("--fused-adamw/--no-fused-adamw",)
    )
    dist_timeout: float = option(300.0, "Seconds a collective may wait for a peer before the job fails.", above=0)

    def __post_init__(self):
        check_declared(self)
        self.time_budget_seconds = parse_duration(self.time_budget)

    @property
    def auto(self) -> bool:
        return self.strategy == "auto"

    @property
    def shape_given(self) -> bool:
        """Anything that fixes the model's shape or the run's length: then nothing is sized."""
        return any(
            v is not None
            for v in (
                self.preset,
                self.max_steps,
                self.tokens,
                self.n_layer,
                self.n_head,
                self.n_embd,
                self.seq_len,
                self.batch_size,
            )
        )


@dataclass
class PlanSettings:
    """Everything `pipeline plan` can be told: the model and batch to plan for, and the cluster."""

    preset: Preset = option("small", "Model shape: tiny, small (124M), medium (355M), large (774M).")
    model_config: Optional[Path] = option(
        None, "JSON model shape instead of --preset (our fields, or a Hugging Face GPT-2 config.json)."
    )
    seq_len: Optional[int] = option(None, "Tokens per sequence (default: the preset's).", min=1)
    global_batch: Optional[int] = option(None, "Sequences per optimizer step (default: the preset's).", min=1)
    vocab_size: Optional[int] = option(None, "Vocabulary size (default: the preset's).", min=1)
    cluster: Optional[Path] = option(None, "Cluster TOML file for what-if planning (default: measure this machine).")
    nproc: Optional[int] = option(
        None, "Processes (default: all devices of --cluster, or this machine's GPUs, 1 on CPU).", min=1
    )
    dp: Optional[int] = option(None, "Only plans with this data-parallel degree.", min=1)
    tp: Optional[int] = option(None, "Only plans with this tensor-parallel degree.", min=1)
    pp: Optional[int] = option(None, "Only plans with this pipeline degree.", min=1)
    bf16: bool = option(False, "Plan for bf16 autocast (2-byte activations).", flags=("--bf16",))
    top: int = option(15, "Rows of the table.", min=1)
    remeasure: bool = option(False, "Measure this machine again instead of using the cached measurement.")

    def __post_init__(self):
        check_declared(self)
