"""`pipeline`: from raw documents to semantic search.

    pipeline pretrain            tokenizer + GPT-2 trained on your documents
    pipeline embed               chunk and embed documents into the workspace's DuckDB
    pipeline index               build the FAISS index over the stored vectors
    pipeline search "query"      ranked documents for a query
    pipeline status              what the workspace holds, and whether it is consistent

Every stage reads and writes the workspace (--workspace, or $PIPELINE_WORKSPACE, default ./workspace).
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from common.console import err, out
from common.errors import PipelineError
from common.workspace import WORKSPACE_ENV, Workspace

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, rich_markup_mode=None)

WorkspaceOption = Annotated[Path, typer.Option("--workspace", "-w", envvar=WORKSPACE_ENV, help="Workspace directory.")]
DataOption = Annotated[Optional[list[Path]], typer.Option("--data", "-d", help="File or directory (.txt .md .jsonl .json .csv .parquet); repeatable.")]
TextFieldOption = Annotated[Optional[str], typer.Option(help="Field holding the text in structured files (auto-detected by default).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]


@app.callback()
def root() -> None:
    """Embedding pipeline: pretrain -> embed -> index -> search."""


def user_errors(command):
    """Print a PipelineError as one line on stderr and exit 2, instead of a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except PipelineError as e:
            err.print(f"error: {e}", style="red", highlight=False, markup=False)
            raise typer.Exit(2)
    return wrapper


@app.command()
@user_errors
def pretrain(
    workspace: WorkspaceOption = Path("workspace"),
    data: DataOption = None,
    text_field: TextFieldOption = None,
    preset: Annotated[str, typer.Option(help="Model shape: tiny, small (124M), medium (355M), large (774M).")] = "tiny",
    max_steps: Annotated[Optional[int], typer.Option(help="Optimizer steps (default: the preset's).")] = None,
    tokens: Annotated[Optional[int], typer.Option(help="Train on this many tokens instead of --max-steps.")] = None,
    seq_len: Annotated[Optional[int], typer.Option(help="Tokens per training sequence.")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Sequences per optimizer step (global).")] = None,
    grad_accum: Annotated[int, typer.Option(help="Split each step's batch into this many micro-batches.")] = 1,
    lr: Annotated[Optional[float], typer.Option(help="Peak learning rate.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed (weights, data order).")] = 1337,
    vocab_size: Annotated[Optional[int], typer.Option(help="Tokenizer vocabulary size.")] = None,
    n_layer: Annotated[Optional[int], typer.Option(help="Override the preset's number of layers.")] = None,
    n_head: Annotated[Optional[int], typer.Option(help="Override the preset's attention heads.")] = None,
    n_embd: Annotated[Optional[int], typer.Option(help="Override the preset's hidden size.")] = None,
    eval_every: Annotated[int, typer.Option(help="Validation every N steps.")] = 100,
    checkpoint_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 100,
    log_every: Annotated[int, typer.Option(help="Log metrics every N steps.")] = 10,
    resume: Annotated[bool, typer.Option(help="Continue from the latest checkpoint in the workspace.")] = False,
    json_output: JsonOption = False,
):
    """Train a tokenizer and a GPT-2 on your documents, then export it in Hugging Face format.

    Examples:

        pipeline pretrain                                  # tiny model on the built-in corpus

        pipeline pretrain --data docs/ --preset tiny --max-steps 500

        pipeline pretrain --data corpus.jsonl --text-field body --tokens 2000000

        pipeline pretrain --resume                         # continue after an interruption
    """
    from pretrain.config import PRESET_TRAINING, PRESETS, TrainConfig, model_config_for
    from pretrain.train import checkpoint_dirs, config_from_checkpoint, prepare_data, train

    ws = Workspace(workspace).create()
    if resume:
        checkpoints = checkpoint_dirs(ws)
        if not checkpoints:
            raise PipelineError(f"--resume: no checkpoint in {ws.checkpoints_dir}")
        cfg = config_from_checkpoint(checkpoints[-1])
        if max_steps is not None:
            cfg.max_steps = max_steps
        summary = train(ws, cfg, resume_from=checkpoints[-1])
    else:
        if preset not in PRESETS:
            raise PipelineError(f"--preset: unknown preset '{preset}' (choose from {', '.join(PRESETS)})")
        defaults = PRESET_TRAINING[preset]
        seq_len = seq_len or defaults["seq_len"]
        batch_size = batch_size or defaults["batch_size"]
        if tokens is not None:
            max_steps = max(1, -(-tokens // (batch_size * seq_len)))
        overrides = {k: v for k, v in dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd).items() if v is not None}
        vocab = vocab_size or defaults["vocab_size"]
        for name, value in dict(max_steps=max_steps or 1, seq_len=seq_len, batch_size=batch_size, grad_accum=grad_accum, vocab_size=vocab).items():
            if value < 1:
                raise PipelineError(f"--{name.replace('_', '-')} must be positive, got {value}")
        cfg = TrainConfig(
            preset=preset, max_steps=max_steps or defaults["max_steps"], seq_len=seq_len, batch_size=batch_size,
            grad_accum=grad_accum, lr=lr or defaults["lr"], seed=seed, vocab_size=vocab,
            eval_every=eval_every, checkpoint_every=checkpoint_every, log_every=log_every,
        )
        meta = prepare_data(ws, list(data or []), text_field, cfg)
        cfg.model = model_config_for(preset, meta["vocab_size"], seq_len, **overrides)
        if cfg.model.n_embd % cfg.model.n_head:
            raise PipelineError(f"--n-embd {cfg.model.n_embd} is not divisible by --n-head {cfg.model.n_head}")
        summary = train(ws, cfg)
    if json_output:
        out.print_json(json.dumps(summary))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
