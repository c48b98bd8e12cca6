"""Parallel pretraining on CPU ranks: tokens/s, peak memory per rank, communication and pipeline bubble.

    python benchmarks/bench_parallel.py            # writes benchmarks/results/parallel.json
    python benchmarks/bench_parallel.py --quick    # the tiny model only

For each model (the tiny preset, and a larger one), every plan at 2 and 4 processes runs a few
steps in one torchrun job per world size (start-up is paid once); the first log window (warm-up,
profiler start) is left out. For pipeline plans the measured bubble (the share of a step a rank
does not spend computing its stages) is set beside the theory, (p-1)/(m+p-1) for GPipe and 1F1B.
On a machine with fewer cores than ranks the processes share cores: throughput does not scale,
and waiting for a descheduled peer shows up as communication and bubble.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks_common import SCIFACT, write_result  # noqa: E402
from common.workspace import Workspace  # noqa: E402
from pretrain.config import MULTI_STAGE_SCHEDULES, SCHEDULES, ModelConfig, ParallelConfig, TrainConfig  # noqa: E402
from pretrain.launch import RunSpec, launch  # noqa: E402

MODELS = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128),  # the tiny preset
    "larger": dict(n_layer=8, n_head=8, n_embd=256),
}
STEPS, LOG_EVERY, MICROBATCHES = 6, 2, 4


def plans(world: int, n_layer: int) -> dict[str, dict]:
    if world == 1:
        return {"single": dict(strategy="single")}
    found = {
        "ddp": dict(strategy="ddp", dp_replicate=world),
        "fsdp": dict(strategy="fsdp", dp_shard=world),
        "tp": dict(strategy="tp", tp=world),
    }
    for schedule in SCHEDULES:
        stages = world * (2 if schedule in MULTI_STAGE_SCHEDULES else 1)
        if stages <= n_layer:
            found[f"pp-{schedule}"] = dict(strategy="pp", pp=world, pp_schedule=schedule, microbatches=MICROBATCHES)
    if world == 4:
        found.update(
            {
                "hsdp-2x2": dict(strategy="fsdp", dp_replicate=2, dp_shard=2),
                "dp2xtp2": dict(strategy="hybrid", dp_shard=2, tp=2),
                "dp2xpp2-1f1b": dict(
                    strategy="hybrid", dp_shard=2, pp=2, pp_schedule="1f1b", microbatches=MICROBATCHES
                ),
                "tp2xpp2-1f1b": dict(strategy="hybrid", tp=2, pp=2, pp_schedule="1f1b", microbatches=MICROBATCHES),
            }
        )
    return found


def summarize(ws: Path, plan: dict, world: int) -> dict:
    records = [json.loads(line) for line in (ws / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["event"] == "train"][1:]  # the first window warms up
    mean = lambda key: sum(r[key] for r in train) / len(train)  # noqa: E731
    result = {
        "world": world,
        "plan": plan,
        "tokens_per_s": mean("tokens_per_s"),
        "mfu": mean("mfu"),
        "step_s": mean("step_s"),
        "comm_fraction": mean("comm_fraction"),
        "peak_mem_mb_per_rank": [max(r["peak_mem_mb_per_rank"][i] for r in train) for i in range(world)],
        "model_state_mb_per_rank": train[-1]["model_state_mb_per_rank"],
        "loss": train[-1]["loss"],
    }
    if "bubble_fraction" in train[-1]:
        result.update(bubble_measured=mean("bubble_fraction"), bubble_theory=train[-1]["bubble_theory"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model only")
    args = parser.parse_args()
    from pretrain.prepare import DataOptions, PretrainingSources, prepare_data

    root = Path(tempfile.mkdtemp(prefix="bench_parallel_"))
    base = TrainConfig(
        max_steps=STEPS,
        seq_len=128,
        batch_size=16,
        lr=1e-3,
        vocab_size=4096,
        eval_every=10**6,
        checkpoint_every=10**6,
        log_every=LOG_EVERY,
    )
    prepared = Workspace(root / "prepared").create()
    data = [SCIFACT / "corpus.jsonl"] if SCIFACT.exists() else []  # else the built-in corpus
    meta = prepare_data(prepared, PretrainingSources(tuple(data), None), base, DataOptions())
    results = []
    try:
        for model_name, shape in MODELS.items():
            if args.quick and model_name != "tiny":
                continue
            cfg = replace(base, model=ModelConfig(vocab_size=meta["vocab_size"], block_size=base.seq_len, **shape))
            for world in (1, 2, 4):
                specs, names = [], []
                for name, plan in plans(world, shape["n_layer"]).items():
                    ws = root / f"{model_name}-{world}-{name}"
                    shutil.copytree(prepared.root / "data", ws / "data")
                    shutil.copytree(prepared.root / "tokenizer", ws / "tokenizer")
                    specs.append(RunSpec(str(ws), asdict(cfg), asdict(ParallelConfig(**plan)), export=False))
                    names.append((name, ws, plan))
                launch(specs, world)  # one process as well: the same start-up and the same code path
                for name, ws, plan in names:
                    results.append({"model": model_name, "name": name, **summarize(ws, plan, world)})
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"\n{'model':7} {'ranks':>5} {'plan':22} {'tokens/s':>9} {'mfu':>6} {'comm':>5} {'bubble':>7} {'theory':>7}  "
        "peak RSS MB per rank | weights+Adam MB per rank"
    )
    for r in results:
        bubble = f"{r['bubble_measured']:.0%}" if "bubble_measured" in r else ""
        theory = f"{r['bubble_theory']:.0%}" if r.get("bubble_theory") is not None else ""
        print(
            f"{r['model']:7} {r['world']:>5} {r['name']:22} {r['tokens_per_s']:>9,.0f} {r['mfu']:>6.1%} "
            f"{r['comm_fraction']:>5.0%} "
            f"{bubble:>7} {theory:>7}  {' '.join(f'{m:.0f}' for m in r['peak_mem_mb_per_rank'])} | "
            f"{' '.join(f'{m:.1f}' for m in r['model_state_mb_per_rank'])}"
        )
    write_result(
        "parallel",
        {
            "steps": STEPS,
            "seq_len": base.seq_len,
            "batch_size": base.batch_size,
            "microbatches": MICROBATCHES,
            "models": MODELS,
            "runs": results,
        },
    )


if __name__ == "__main__":
    main()
