"""The product on one GPU, in one command of at most 8 minutes on an H100-class card, written as one JSON file.

    throughput   GPT-2 small (12 layers, d 768, vocabulary 32,768, 64 x 1,024 tokens a step) trained for
                 --small-steps steps, eager and with --compile: tokens/s and MFU against the card's datasheet
                 bf16 peak and against the matmul peak measured on it (pretrain/hardware.py), the medians of
                 the logged steps after the first
    chain        `pipeline pretrain --time-budget 2m` on SciFact (sized, adapted): each phase's planned and
                 actual seconds, the shape, epochs, best and final validation loss, the embedder kept and
                 each candidate's held-out score with its standard error, its tune step's time split
                 into batching, forward and backward, and the optimizer (embed/step_clock.py), and the
                 step time its probe predicted; then `pipeline embed`,
                 `pipeline index` and `pipeline eval --mode all` on the test queries
    random init  the same shape at initialisation (`pretrain --max-steps 0`) and the same adaptation
                 (`pipeline tune` in the seconds the chain's adaptation was planned), embedded, indexed
                 and evaluated alike: pretraining's contribution, pretrained - random dense nDCG@10
    runner-up    in each of the two, the candidate the adaptation tuned and did not keep, tuned again alike
                 and evaluated: the static table's and the transformer's search quality, pretrained and not
    tune         where the chain did not tune the transformer, `pipeline tune --architecture transformer` alone
                 on a copy of that model: its step's split and the probe's prediction
    sharing      two such tunes at once on the one GPU: both finish, and the memory each held (nvidia-smi)

    python benchmarks/bench_gpu.py [--data BEIR_DIR] [--out FILE] [--workdir DIR] [--quick] [--only-chain]

The JSON is rewritten after each section (a run cut short keeps what it measured); "targets" checks the
issue's figures: MFU >= 40% of the datasheet peak with --compile, each phase within its plan + 10%,
pretrained - random dense nDCG@10 >= +0.03, >= 70% of a tune step in forward and backward, the probe's step
time within 25% of the measured one, two tunes sharing the GPU.

--quick is for trying the script on a CPU (the tiny preset, a 300-document slice, a 1-minute budget): its
figures mean nothing. How to run it on a machine with a GPU and no internet: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"


STDERR_LOG = Path("/dev/null")  # where each command's own output to the user (stderr) is kept; set in main


def pipeline(*args: str) -> str:
    """`pipeline ARGS` in a new process; its stdout. A failure stops the benchmark with the command's own error."""
    done = subprocess.run([sys.executable, str(REPO / "cli.py"), *args], cwd=REPO, text=True, capture_output=True)
    with STDERR_LOG.open("a") as log:
        log.write(f"$ pipeline {' '.join(args)}\n{done.stderr}\n")
    if done.returncode != 0:
        raise SystemExit(f"pipeline {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def timed(*args: str) -> tuple[str, float]:
    start = time.perf_counter()
    return pipeline(*args), time.perf_counter() - start


def records(ws: Path, event: str) -> list[dict]:
    lines = (ws / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def throughput(ws: Path, corpus: Path, steps: int, compile_: bool, quick: bool) -> dict:
    """GPT-2 small (the tiny preset with --quick) for `steps` steps: the logged steps' median figures."""
    shape = ["--preset", "tiny"] if quick else ["--preset", "small"]
    _, seconds = timed(
        "pretrain", "-w", str(ws), "--data", str(corpus), *shape, "--max-steps", str(steps), "--log-every",
        str(max(1, steps // 10)), "--eval-every", str(steps), "--patience", "0", "--no-adapt",
        *(["--compile"] if compile_ else []),
    )  # fmt: skip
    train = records(ws, "train")[1:] or records(ws, "train")  # the first logged window holds the warm-up

    def median(key: str):
        values = [r[key] for r in train if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "compile": compile_,
        "steps": steps,
        "seconds": round(seconds, 1),
        "tokens_per_s": median("tokens_per_s"),
        "mfu_datasheet": median("mfu_datasheet"),
        "mfu_measured": median("mfu_measured"),
        "datasheet_peak_tflops": (train[-1].get("datasheet_peak_flops") or 0) / 1e12 or None,
        "measured_peak_tflops": (train[-1].get("matmul_peak_flops") or 0) / 1e12 or None,
    }


def evaluate(ws: Path, data: Path, split: str) -> dict:
    judged = ["--queries", str(data / "queries.jsonl"), "--qrels", str(data / "qrels" / f"{split}.tsv")]
    rows = json.loads(pipeline("eval", "-w", str(ws), *judged, "--mode", "all", "--json"))
    default = json.loads(pipeline("eval", "-w", str(ws), *judged, "--json"))
    scores = {r["mode"]: r["ndcg@10"] for r in rows}
    return {**scores, "default": default["ndcg@10"], "default_mode": default["mode"]}


def embed_index_eval(ws: Path, data: Path, split: str) -> dict:
    _, embed_s = timed("embed", "-w", str(ws), "--data", str(data / "corpus.jsonl"))
    _, index_s = timed("index", "-w", str(ws))
    return {"embed_s": round(embed_s, 1), "index_s": round(index_s, 1), "ndcg@10": evaluate(ws, data, split)}


def chain(ws: Path, data: Path, budget: str, split: str) -> dict:
    """The default chain at `budget`: what it planned, spent, trained, kept, and how it searches."""
    summary = json.loads(pipeline("pretrain", "-w", str(ws), "--data", str(data / "corpus.jsonl"),
                                  "--time-budget", budget, "--json"))  # fmt: skip
    sizing = (records(ws, "sizing") or [{}])[0]
    chosen = next((s for s in sizing.get("shapes", []) if s["chosen"]), {})
    end = records(ws, "end")[-1]
    adaptation = summary.get("adaptation", {})
    return {
        "phases": summary["phases"],
        "shape": summary["config"],
        "parameters": summary["parameters"],
        "steps": summary["steps"],
        "planned_steps": summary.get("planned_steps"),
        "epochs": chosen.get("epochs"),
        "capped_at_max_epochs": sizing.get("capped_at_max_epochs"),
        "best_step": end.get("best_step"),
        "best_val_loss": end.get("best_val_loss"),
        "final_val_loss": end.get("val_loss_reached"),
        "seq_len": summary["seq_len"],
        "embedder_kept": adaptation.get("architecture"),
        "candidates": adaptation.get("candidates"),
        **embed_index_eval(ws, data, split),
    }


def random_init(ws: Path, data: Path, trained: dict, split: str) -> dict:
    """The chain's shape at initialisation, adapted in the seconds the chain's adaptation was planned."""
    shape = trained["shape"]
    pipeline(
        "pretrain", "-w", str(ws), "--data", str(data / "corpus.jsonl"), "--max-steps", "0", "--no-adapt",
        "--n-layer", str(shape["n_layer"]), "--n-head", str(shape["n_head"]), "--n-embd", str(shape["n_embd"]),
        "--seq-len", str(trained["seq_len"]), "--vocab-size", str(shape["vocab_size"]),
    )  # fmt: skip
    adaptation_s = trained["phases"]["adaptation"]["planned_s"]
    tuned = json.loads(pipeline("tune", "-w", str(ws), "--time-budget", f"{adaptation_s:.0f}s", "--json"))
    return {"adaptation_s": adaptation_s, "embedder_kept": tuned["architecture"],
            "candidates": tuned.get("candidates"), **embed_index_eval(ws, data, split)}  # fmt: skip


def runner_up(ws: Path, data: Path, run: dict, split: str) -> dict | None:
    """The candidate the adaptation tuned and did not keep, tuned again alike (its architecture, steps and
    batch, the same seed) on a copy of the workspace, then embedded, indexed and evaluated: the search quality
    of both candidates, not only of the one kept. None where only one was tuned."""
    candidates = run.get("candidates") or {}
    other = next((n for n, c in candidates.items() if n != run["embedder_kept"] and c.get("steps")), None)
    if other is None:
        return None
    copy = ws.parent / f"{ws.name}-{other}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(ws, copy)
    pipeline(
        "tune", "-w", str(copy), "--architecture", other, "--steps", str(candidates[other]["steps"]),
        "--batch-size", str(candidates[other]["batch_size"]), "--time-budget", "10m",
    )  # fmt: skip
    return {"architecture": other, **embed_index_eval(copy, data, split)}


PROFILED = {"static": (100, 1024), "transformer": (40, 256)}  # steps, batch size of each architecture's profile


def tune_command(ws: Path, architecture: str, quick: bool) -> list[str]:
    steps, batch = PROFILED[architecture]
    return [
        "tune", "-w", str(ws), "--architecture", architecture, "--steps", str(4 if quick else steps),
        "--batch-size", str(batch), "--time-budget", "10m", "--json",
    ]  # fmt: skip


def tune_profile(summary: dict) -> dict:
    return {
        "steps": summary["steps"],
        "batch_size": summary["batch_size"],
        "step_profile": summary["step_profile"],
        "probe_step_s": summary.get("plan", {}).get("step_s"),
        "phases_s": summary["phases_s"],
        "pairs": sum(summary["pairs"]["pairs"].values()),
    }


def model_at_initialisation(ws: Path, data: Path) -> None:
    """A model of the chain's usual GPU shape at initialisation (a step's time does not depend on the weights)."""
    pipeline(
        "pretrain", "-w", str(ws), "--data", str(data / "corpus.jsonl"), "--max-steps", "0", "--no-adapt",
        "--n-layer", "6", "--n-head", "8", "--n-embd", "256", "--seq-len", "256", "--vocab-size", "8192",
    )  # fmt: skip


def tune_profiles(ws: Path, architectures: tuple[str, ...], quick: bool) -> dict:
    """`pipeline tune` of each architecture alone on the GPU, on the model in `ws`: where a step's time goes,
    and the step time its probe predicted."""
    return {a: tune_profile(json.loads(pipeline(*tune_command(ws, a, quick)))) for a in architectures}


def gpu_memory_mb() -> dict[int, float]:
    """Memory each process holds on the GPU (nvidia-smi), by process id; empty where nvidia-smi is absent."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split(",") for line in done.stdout.splitlines() if line.strip()]
    return {int(pid): float(mb) for pid, mb in rows if pid.strip().isdigit() and mb.strip().replace(".", "").isdigit()}


def sharing(ws: Path, quick: bool) -> dict:
    """Two `pipeline tune` (transformer) at once on the same GPU, each on its own copy of the model in `ws`:
    both must finish; nvidia-smi's reading of each one's memory, sampled every half second."""
    commands = []
    for n in (1, 2):
        copy = ws.parent / f"{ws.name}-share{n}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(ws, copy)
        commands.append([sys.executable, str(REPO / "cli.py"), *tune_command(copy, "transformer", quick)])
    start = time.perf_counter()
    runs = [subprocess.Popen(c, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in commands]
    peak_mb = {run.pid: 0.0 for run in runs}
    while any(run.poll() is None for run in runs):
        for pid, mb in gpu_memory_mb().items():
            if pid in peak_mb:
                peak_mb[pid] = max(peak_mb[pid], mb)
        time.sleep(0.5)
    outputs = [run.communicate() for run in runs]
    with STDERR_LOG.open("a") as log:
        for command, (_, err) in zip(commands, outputs):
            log.write(f"$ (shared GPU) {' '.join(command[2:])}\n{err}\n")
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "exit_codes": [run.returncode for run in runs],
        "peak_gpu_memory_mb": [peak_mb[run.pid] or None for run in runs],
        "step_s": [
            json.loads(out)["step_profile"]["step_s"] if run.returncode == 0 else None
            for run, (out, _) in zip(runs, outputs)
        ],
        "errors": [err.strip().splitlines()[-1] if run.returncode else None for run, (_, err) in zip(runs, outputs)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=SCIFACT, help="a BEIR folder (default: ../shared SciFact)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gpu.json")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_gpu"))
    parser.add_argument("--small-steps", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="try the script on a CPU (meaningless figures)")
    parser.add_argument("--only-tune", action="store_true", help="only the tune step profiles of each architecture")
    parser.add_argument("--only-chain", action="store_true", help="only the chain and its random-init twin")
    args = parser.parse_args()
    import torch

    global STDERR_LOG
    args.workdir.mkdir(parents=True, exist_ok=True)
    STDERR_LOG = args.workdir / "pipeline-stderr.log"
    STDERR_LOG.write_text("")

    data = args.data
    if args.quick:  # a slice of the collection, its judged queries kept
        data = args.workdir / "slice"
        (data / "qrels").mkdir(parents=True, exist_ok=True)
        (data / "corpus.jsonl").write_text("".join((args.data / "corpus.jsonl").open().readlines()[:300]))
        shutil.copy(args.data / "queries.jsonl", data / "queries.jsonl")
        shutil.copy(args.data / "qrels" / f"{args.split}.tsv", data / "qrels" / f"{args.split}.tsv")
    shutil.rmtree(args.workdir / "ws", ignore_errors=True)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "quick": args.quick,
    }
    started = time.perf_counter()

    def save(section: str) -> None:
        """Each section's figures written as soon as they exist: a run cut short keeps what it measured."""
        result["seconds"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"[bench_gpu {result['seconds']:.0f}s] {section} done", file=sys.stderr, flush=True)

    def section(name: str, key: str, measure, *arguments):
        """One section's figures under `key`, or, where one of its commands failed, its error under "failed"
        (the sections after it that do not need it still run: a GPU's minutes are few); the JSON rewritten."""
        try:
            result[key] = measure(*arguments)
        except (SystemExit, Exception) as error:  # a command's failure, or a figure missing from its output
            result.setdefault("failed", {})[name] = f"{type(error).__name__}: {str(error)[-3000:]}"
        result["targets"] = targets(result)
        save(name)
        return result.get(key)

    if args.only_tune:
        model_at_initialisation(args.workdir / "ws" / "tune", data)
        section("tune profiles", "tune", tune_profiles, args.workdir / "ws" / "tune", tuple(PROFILED), args.quick)
        print(json.dumps(result, indent=2))
        return
    steps = 6 if args.quick else args.small_steps
    for mode in () if args.only_chain else ("eager", "compile"):
        ws = args.workdir / "ws" / f"small-{mode}"
        section(
            f"GPT-2 small {mode}", f"gpt2_small_{mode}", throughput, ws, data / "corpus.jsonl", steps,
            mode == "compile", args.quick,
        )  # fmt: skip
    budget = "1m" if args.quick else "2m"
    trained_ws, random = args.workdir / "ws" / "chain", args.workdir / "ws" / "random"
    trained = section("chain", "chain", chain, trained_ws, data, budget, args.split)
    twin = trained and section("random init", "random_init", random_init, random, data, trained, args.split)
    if trained:
        section("the chain's other candidate", "chain_runner_up", runner_up, trained_ws, data, trained, args.split)
    if twin:
        section("the random init's other candidate", "random_init_runner_up", runner_up, random, data, twin, args.split)
    if twin and not args.only_chain:
        # On a copy of the random-init workspace (the chain's shape at initialisation): the transformer's step
        # alone on the GPU, where the chain did not tune it; then two tunes sharing the GPU.
        model = args.workdir / "ws" / "random-copy"
        shutil.copytree(random, model)
        if not (trained.get("candidates") or {}).get("transformer", {}).get("step_profile"):
            section("transformer tune profile", "tune", tune_profiles, model, ("transformer",), args.quick)
        section("two tunes sharing the GPU", "sharing", sharing, model, args.quick)
    print(json.dumps(result, indent=2))


def targets(result: dict) -> dict:
    """The issue's GPU targets, each with the figure it was checked on (None where its section is missing)."""
    compiled = result.get("gpt2_small_compile")
    trained, random = result.get("chain") or {}, result.get("random_init")
    over = {
        name: round(t["actual_s"] / t["planned_s"], 3)
        for name, t in trained.get("phases", {}).items()
        if t.get("planned_s") and t.get("actual_s") is not None
    }
    tuned = {name: c for name, c in (trained.get("candidates") or {}).items() if c.get("step_profile")}
    for name, profile in (result.get("tune") or {}).items():  # tuned alone, where the chain did not tune it
        tuned.setdefault(name, profile)
    ratios = {n: c["probe_step_s"] / c["step_profile"]["step_s"] for n, c in tuned.items() if c.get("probe_step_s")}
    gain = trained["ndcg@10"]["dense"] - random["ndcg@10"]["dense"] if trained and random else None
    shared = result.get("sharing")
    dense = {  # each candidate's dense nDCG@10 on the judged queries, pretrained and at initialisation
        f"{name}: {run['embedder_kept']} (kept)": run["ndcg@10"]["dense"]
        for name, run in (("pretrained", trained), ("random init", random or {}))
        if run.get("ndcg@10")
    }
    for name, key in (("pretrained", "chain_runner_up"), ("random init", "random_init_runner_up")):
        if result.get(key):
            dense[f"{name}: {result[key]['architecture']}"] = result[key]["ndcg@10"]["dense"]
    return {
        "dense_ndcg@10_by_candidate": dense,
        "mfu_datasheet_compile": compiled and compiled["mfu_datasheet"],
        "mfu_datasheet_compile_at_least_0.40": compiled and (compiled["mfu_datasheet"] or 0) >= 0.40,
        "phase_actual_over_planned": over,
        "every_phase_within_10_percent": all(ratio <= 1.10 for ratio in over.values()) if over else None,
        "pretrained_minus_random_dense": gain,
        "pretrained_minus_random_dense_at_least_0.03": gain >= 0.03 if gain is not None else None,
        "tune_forward_backward_share": {n: c["step_profile"]["forward_backward_share"] for n, c in tuned.items()},
        "tune_forward_backward_at_least_0.70": (
            all(c["step_profile"]["forward_backward_share"] >= 0.70 for c in tuned.values()) if tuned else None
        ),
        "tune_probe_over_measured_step": ratios,
        "tune_probe_within_25_percent": all(0.75 <= r <= 1.25 for r in ratios.values()) if ratios else None,
        "two_tunes_share_the_gpu": shared["exit_codes"] == [0, 0] if shared else None,
    }


if __name__ == "__main__":
    main()
