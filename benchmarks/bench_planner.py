"""Does the planner pick the plan that is really fastest? Predicted vs measured, per network scenario.

On this machine, for 2 and 4 CPU ranks (gloo), two sites (2 ranks: one per site; 4 ranks: two per site)
joined by a link of 0, 5, 20 or 50 ms latency and 1 Gbit/s or 100 Mbit/s. Two ways to make the link:

    --network emulated (default)   tests/linkemu.py delays every collective and send by latency +
                                   bytes/bandwidth; the planner is told the link
    --network veth                 the sites are network namespaces joined by a veth pair that tc tbf caps
                                   to the bandwidth (benchmarks/netns.py; needs root); this kernel has no
                                   netem, so the latency is still emulated; the planner measures the link
                                   itself (its own cluster measurement, run across the namespaces)

For every plan of a bounded search space (bench_space):

    predicted step time and peak memory per device   pretrain.planner.cost.estimate, from the cluster measured
                                                     here once per world size (pretrain.planner.measure) with the
                                                     scenario's link added to the links between sites
    measured step time                               median of the steps after the first (real training
                                                     through pretrain.train, all plans of a scenario in
                                                     one job; 4-12 steps, about 2 s per plan, so the fast
                                                     plans that decide the regret get the most; a scenario
                                                     where a plan's steps swing by more than 2.5x, as when
                                                     this VM stalls for seconds, is measured again once)
    measured peak memory                             the resident memory a run added, largest rank
                                                     (benchmarks/planner_worker.py), in two jobs without
                                                     the emulator, in opposite plan orders (the larger)

Per scenario: Spearman rank correlation of predicted vs measured step time (scipy), memory error, and
regret = measured time of the planner's pick / measured time of the measured fastest plan.
Targets: memory within 15%, regret <= 1.10. Writes benchmarks/results/planner.json (planner_veth.json).

    .venv/bin/python benchmarks/bench_planner.py                  # all 16 scenarios (~27 min on 2 cores)
    .venv/bin/python benchmarks/bench_planner.py --worlds 2 --latencies 0 50 --bandwidths 1000
    .venv/bin/python benchmarks/bench_planner.py --network veth   # the same over a real capped link (~35 min)

Last runs (2 CPU cores; results/ is not committed, so the numbers are kept here). Regret with
--autotune 3 is the measured fastest of the top 3 predicted plans, from the same measurements.

Emulated network, all 16 scenarios (`--worlds 4 2`, 27 min):

    ranks  link              Spearman   regret  autotune 3  pure TP across sites vs fastest
    2      0 ms, 1G / 100M   0.89/1.00  1.00    1.00        3.1/6.9x
    2      5-50 ms           0.93-1.00  1.00    1.00        4.1-10.5x
    4      0 ms, 1G / 100M   0.99/1.00  1.00    1.00        5.7/12.9x
    4      5-50 ms           0.89-1.00  1.00    1.00        8.9-18.1x
    memory error, median / max: 3% / 5% (2 ranks), 2% / 14% (4 ranks: fsdp4, 14.1 vs 12.4 MB)

Veth network (real tbf-capped link, emulated latency), the planner measuring the cluster across the
namespaces itself, all 16 scenarios (`--worlds 4 2 --network veth`, 35 min):

    2      0 ms, 1G / 100M   0.71/1.00  1.13/1.00  1.00     3.1/6.3x
    2      5 ms, 1G / 100M   1.00/0.96  1.00/1.16  1.00     6.4/6.4x
    2      20-50 ms          0.96-1.00  1.00       1.00     6.8-17.7x
    4      0 ms, 1G / 100M   0.92/0.94  1.04/1.00  1.00     3.3/11.6x
    4      5 ms, 1G / 100M   0.94/0.90  1.00/1.29  1.00     7.8/11.6x
    4      20-50 ms          0.94-0.99  1.00       1.00     10.5-18.7x
    memory error, median / max: 4% / 14% (2 ranks), 3% / 13% (4 ranks)

    The 1.29 was two pipeline replicas (FSDP x PP) sending across the one site link at once, which
    the planner then priced as if each had the link to itself; with sends between the same two nodes
    sharing the link (pretrain/planner/layout.py), a rerun of 4 ranks at 5 ms / 100M gave Spearman 0.98,
    regret 1.00 (and 0 ms / 100M 0.98, 1.00). The two 2-rank misses are plans predicted within 1-4%
    of each other (pp2 1F1B with 2 or 4 microbatches at 5 ms; ddp2 and four pipelines within 15% at
    0 ms) whose measured steps vary by 10-40% from step to step on this VM; tbf's 64 KiB burst also
    sends 128 KiB activations faster than the link's sustained rate the planner measured. Reruns of
    2 ranks after all changes: 0 ms 1.00 / 1.08, 5 ms 1.04 / 1.11 then 1.06, 20-50 ms 1.00-1.01
    (regret with --autotune 3: 1.00 in all).

The study's finding holds on both networks: at 20-50 ms pure tensor parallelism across the sites is
6.0-18.7x slower than the fastest plan, and the fastest plans there are DDP, PP and FSDP x PP.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns import VethSites, unavailable_reason  # noqa: E402

from benchmarks_common import REPO, write_result  # noqa: E402
from common.workspace import Workspace  # noqa: E402
from linkemu import ENV, EmulatedLinks  # noqa: E402
from pretrain.config import ModelConfig, TrainConfig  # noqa: E402
from pretrain.launch import RunSpec, launch  # noqa: E402
from pretrain.planner.candidates import SearchSpace  # noqa: E402
from pretrain.planner.cluster import Cluster, Link  # noqa: E402
from pretrain.planner.measure import MeasureSettings, measure_cluster  # noqa: E402
from pretrain.planner.profile import Workload  # noqa: E402
from pretrain.planner.rank import plan  # noqa: E402

# Steps per plan: the first warms up, the median of the rest is the measurement. Fast plans, whose close
# calls decide the regret, run for about TIMED_SECONDS; slow ones (TP over a slow link) the minimum.
MIN_STEPS, MAX_STEPS, TIMED_SECONDS = 4, 12, 2.0
MODEL = dict(n_layer=4, n_head=4, n_embd=128)
SEQ, BATCH, VOCAB = 64, 16, 512
WORDS = (
    "the a of model data token train loss step rank shard pipeline stage tensor parallel batch gradient "
    "optimizer learning rate layer head attention mesh device process group checkpoint export"
).split()


def bench_space(world: int) -> SearchSpace:
    """Every plan of these shapes is run, so the space is kept to one or two schedules and few microbatch counts."""
    schedules = ("1f1b", "interleaved-1f1b") if world == 2 else ("1f1b",)
    return SearchSpace(
        schedules=schedules,
        max_microbatch_factor=2,
        stages_per_rank=(2,),
        hsdp=False,
        grad_accum=False,
        placements=False,
    )


def prepare(root: Path) -> tuple[Path, TrainConfig]:
    from pretrain.prepare import DataOptions, PretrainingSources, prepare_data

    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    rng = random.Random(0)
    for i in range(20):
        (corpus / f"doc{i}.txt").write_text(
            "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(200))
        )
    cfg = TrainConfig(
        max_steps=MIN_STEPS,
        seq_len=SEQ,
        batch_size=BATCH,
        vocab_size=VOCAB,
        eval_every=10**6,
        eval_batches=1,
        checkpoint_every=10**6,
        log_every=1,
        measure_comm=False,
    )
    ws = Workspace(root / "prepared").create()
    meta = prepare_data(ws, PretrainingSources((corpus,), None), cfg, DataOptions())
    cfg.model = ModelConfig(vocab_size=meta["vocab_size"], block_size=SEQ, **MODEL)
    return ws.root, cfg


def as_sites(base: Cluster, per_site: int) -> Cluster:
    """The measured cluster with its ranks assigned to sites (nodes), per_site consecutive ranks each."""
    devices = [replace(d, node=r // per_site) for r, d in enumerate(base.devices)]
    return replace(base, devices=devices, nodes=[f"site{k}" for k in range(base.world_size // per_site)])


def with_emulated_link(base: Cluster, per_site: int, link: Link) -> Cluster:
    """The measured cluster with the emulated link added between sites: its latency adds, its bandwidth
    caps (the emulator delays on top of the real loopback transfer). The emulator delays each rank's
    sends on their own, so every pair of ranks has a link of its own (not shared)."""
    n = base.world_size
    lat = [
        [base.latency_s[a][b] + (link.latency_s if a // per_site != b // per_site else 0.0) for b in range(n)]
        for a in range(n)
    ]
    bw = [
        [
            base.bandwidth_Bps[a][b]
            if a // per_site == b // per_site or a == b
            else 1 / (1 / base.bandwidth_Bps[a][b] + 1 / link.bandwidth_Bps)
            for b in range(n)
        ]
        for a in range(n)
    ]
    return replace(
        as_sites(base, per_site),
        latency_s=lat,
        bandwidth_Bps=bw,
        shared_links=False,
        source=(
            f"{base.source} + emulated {link.latency_s * 1e3:g} ms / "
            f"{link.bandwidth_Bps * 8 / 1e6:g} Mbit/s between sites"
        ),
    )


def timed_steps(est) -> int:
    return max(MIN_STEPS, min(MAX_STEPS, math.ceil(TIMED_SECONDS / est.step_s) + 1))


def launch_plans(
    estimates: list,
    prepared: Path,
    cfg: TrainConfig,
    world: int,
    scratch: Path,
    tag: str,
    env: dict,
    sites: VethSites | None = None,
    timed: bool = True,
) -> tuple[list[Path], float]:
    """Train every plan a few steps (timed: more for fast plans), all in one job (one torchrun, or one
    per site when `sites` joins two network namespaces); returns each plan's workspace and the wall time."""
    specs, roots = [], []
    for i, est in enumerate(estimates):
        root = scratch / f"{tag}-{i}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        (root / "data").symlink_to(prepared / "data")
        (root / "tokenizer").symlink_to(prepared / "tokenizer")
        steps = timed_steps(est) if timed else cfg.max_steps
        specs.append(
            RunSpec(
                str(root),
                asdict(replace(cfg, grad_accum=est.candidate.grad_accum, max_steps=steps)),
                est.candidate.config.to_dict(),
                None,
                export=False,
            )
        )
        roots.append(root)
    # A first, discarded run of the first plan pays the job's one-time costs (gloo connections, lazy
    # initialisation), which would otherwise count as that plan's memory.
    warm = scratch / f"{tag}-warmup"
    shutil.copytree(roots[0], warm, symlinks=True, dirs_exist_ok=True)
    specs.insert(0, replace(specs[0], workspace=str(warm)))
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world)), **env}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    start = time.perf_counter()
    try:
        if sites is None:
            launch(specs, world, module="benchmarks.planner_worker")
        else:
            sites.launch(specs, world // 2, module="benchmarks.planner_worker")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return roots, time.perf_counter() - start


def peak_memory_mb(root: Path) -> float:
    return max(json.loads(p.read_text())["peak_added_mb"] for p in root.glob("mem_rank*.json"))


def measure_memory(prepared: Path, cfg: TrainConfig, base: Cluster, world: int, scratch: Path) -> dict[str, float]:
    """Peak memory of every plan of the space, measured once per world size in jobs without the link
    emulator: memory does not depend on the network, and the emulator's copies of in-flight sends are
    not the plan's memory. A run can reuse memory an earlier run of the job freed without the resident
    set growing, which only ever lowers its figure; so the plans run twice, in opposite orders, and each
    keeps the larger figure."""
    estimates = plan(Workload(cfg.model, cfg.seq_len, cfg.batch_size), base, space=bench_space(world)).ranked
    peaks: dict[str, float] = {}
    for order, ests in (("forward", estimates), ("reversed", estimates[::-1])):
        # Freed tensors go back to the OS at once, so the resident set follows the live tensors. Only here:
        # it makes every large allocation a system call, which would slow the timed runs.
        roots, _ = launch_plans(
            ests,
            prepared,
            cfg,
            world,
            scratch,
            f"w{world}-memory-{order}",
            {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"},
            timed=False,
        )
        for est, root in zip(ests, roots):
            peaks[est.label] = max(peaks.get(est.label, 0.0), peak_memory_mb(root))
    return peaks


def run_scenario(
    prepared: Path,
    cfg: TrainConfig,
    base: Cluster,
    world: int,
    latency_ms: float,
    mbit: float,
    scratch: Path,
    memory_mb: dict[str, float],
    network: str,
) -> dict:
    per_site = world // 2
    link = Link(latency_ms / 1e3, mbit * 1e6 / 8)
    work = Workload(cfg.model, cfg.seq_len, cfg.batch_size)
    tag = f"w{world}-l{latency_ms:g}-b{mbit:g}"
    if network == "emulated":  # the planner is told the emulated link
        estimates = plan(work, with_emulated_link(base, per_site, link), space=bench_space(world)).ranked
        roots, wall = launch_plans(
            estimates, prepared, cfg, world, scratch, tag, {ENV: EmulatedLinks.sites(world, per_site, link).to_json()}
        )
    else:  # a real link capped to the bandwidth, the emulator adds only the latency; the planner measures both
        latency_only = (
            {ENV: EmulatedLinks.sites(world, per_site, Link(link.latency_s, float("inf"))).to_json()}
            if latency_ms
            else {}
        )
        with VethSites(mbit) as sites:
            measured = sites.measure_cluster(world, MeasureSettings(seconds=1.0, repeats=8), latency_only)
            estimates = plan(work, as_sites(measured, per_site), space=bench_space(world)).ranked
            roots, wall = launch_plans(estimates, prepared, cfg, world, scratch, tag, latency_only, sites)
    plans = []
    for est, root in zip(estimates, roots):
        steps = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines() if line]
        times = [s["step_s"] for s in steps if s.get("event") == "train"][1:]
        plans.append(
            {
                "plan": est.label,
                "predicted_step_s": est.step_s,
                "measured_step_s": statistics.median(times),
                "measured_steps_s": times,
                "predicted_mem_mb": est.memory_bytes / 2**20,
                # None: a plan the memory job did not run (veth: a layer split chosen from the cluster
                # measured across the namespaces, not from the one the memory job planned with)
                "measured_mem_mb": memory_mb.get(est.label),
                "measured_mem_with_emulator_mb": peak_memory_mb(root),
                "main_cost": est.main_cost,
            }
        )
    return {**summarize(world, latency_ms, mbit, plans, wall), "network": network}


def summarize(world: int, latency_ms: float, mbit: float, plans: list[dict], wall: float) -> dict:
    from scipy.stats import spearmanr

    predicted = [p["predicted_step_s"] for p in plans]
    measured = [p["measured_step_s"] for p in plans]
    pick = min(range(len(plans)), key=lambda i: predicted[i])
    best = min(range(len(plans)), key=lambda i: measured[i])
    # `pipeline pretrain --autotune 3` runs the top 3 predicted plans and keeps the measured fastest
    top3 = sorted(range(len(plans)), key=lambda i: predicted[i])[:3]
    mem_err = [
        abs(p["predicted_mem_mb"] - p["measured_mem_mb"]) / p["measured_mem_mb"] for p in plans if p["measured_mem_mb"]
    ]
    rho = spearmanr(predicted, measured).statistic if len(plans) > 2 else float("nan")
    tp = [p for p in plans if "tp" in p["plan"]]
    return {
        "world": world,
        "latency_ms": latency_ms,
        "bandwidth_mbit": mbit,
        "plans": plans,
        "spearman": rho,
        "regret": measured[pick] / measured[best],
        "pick": plans[pick]["plan"],
        "fastest": plans[best]["plan"],
        "regret_autotune3": min(measured[i] for i in top3) / measured[best],
        "memory_error_median": statistics.median(mem_err),
        "memory_error_max": max(mem_err),
        "best_tp_vs_fastest": min(p["measured_step_s"] for p in tp) / measured[best] if tp else None,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--latencies", type=float, nargs="+", default=[0, 5, 20, 50], help="ms between sites")
    parser.add_argument("--bandwidths", type=float, nargs="+", default=[1000, 100], help="Mbit/s between sites")
    parser.add_argument(
        "--network",
        choices=("emulated", "veth"),
        default="emulated",
        help="emulated: tests/linkemu.py delays every transfer; veth: the sites are network namespaces "
        "joined by a veth pair capped by tc tbf (real bandwidth; latency still emulated; needs root)",
    )
    args = parser.parse_args()
    if args.network == "veth" and (why := unavailable_reason()):
        parser.error(f"--network veth: {why}")
    os.chdir(REPO)  # the workers import benchmarks.planner_worker from here
    scenarios = []
    with tempfile.TemporaryDirectory(prefix="bench-planner-") as tmp:
        prepared, cfg = prepare(Path(tmp))
        for world in args.worlds:
            # Measured longer than `pipeline plan` does: every scenario of this world size plans from it.
            base = measure_cluster(world, MeasureSettings(seconds=1.0, repeats=8))
            print(
                f"measured {base.describe()}: collective overhead {base.collective_overhead_s * 1e3:.2f} ms", flush=True
            )
            memory_mb = measure_memory(prepared, cfg, base, world, Path(tmp) / "runs")
            shutil.rmtree(Path(tmp) / "runs", ignore_errors=True)
            for latency in args.latencies:
                for mbit in args.bandwidths:
                    s = run_scenario(
                        prepared, cfg, base, world, latency, mbit, Path(tmp) / "runs", memory_mb, args.network
                    )
                    if swings := disturbed(s):  # this VM stalls now and then for seconds; measure such a scenario again
                        print(
                            f"world {world} {latency:g} ms {mbit:g} Mbit/s: disturbed ({swings}), measuring again",
                            flush=True,
                        )
                        shutil.rmtree(Path(tmp) / "runs", ignore_errors=True)
                        s = {
                            **run_scenario(
                                prepared, cfg, base, world, latency, mbit, Path(tmp) / "runs", memory_mb, args.network
                            ),
                            "disturbed_first_run": swings,
                        }
                    scenarios.append(s)
                    print(
                        f"world {world} {latency:g} ms {mbit:g} Mbit/s: spearman {s['spearman']:.2f} "
                        f"regret {s['regret']:.2f} "
                        f"pick {s['pick']} fastest {s['fastest']} mem err median {s['memory_error_median']:.0%} "
                        f"max {s['memory_error_max']:.0%} ({s['wall_s']:.0f} s)",
                        flush=True,
                    )
                    shutil.rmtree(Path(tmp) / "runs", ignore_errors=True)
                    report(
                        scenarios, cfg, args.network
                    )  # after every scenario: a long run stopped early keeps what it measured


DISTURBED_SPREAD = 2.5  # slowest / fastest step of one plan; undisturbed plans stay below 1.7 here


def disturbed(scenario: dict) -> str | None:
    """The plans whose steps swing by more than DISTURBED_SPREAD (stalls of the machine, not the plan)."""
    swings = [
        f"{p['plan']} {max(p['measured_steps_s']) / min(p['measured_steps_s']):.1f}x"
        for p in scenario["plans"]
        if max(p["measured_steps_s"]) > DISTURBED_SPREAD * min(p["measured_steps_s"])
    ]
    return ", ".join(swings) or None


def tp_across_sites_vs_fastest(scenario: dict) -> float | None:
    """Measured step time of pure tensor parallelism over every rank (so its all-reduces cross the slow
    link) / the fastest plan's."""
    tp = [p for p in scenario["plans"] if p["plan"] == f"tp{scenario['world']}"]
    return tp[0]["measured_step_s"] / min(p["measured_step_s"] for p in scenario["plans"]) if tp else None


NETWORKS = {
    "emulated": "two sites, tests/linkemu.py emulated link between them (no netem in this kernel)",
    "veth": "two sites = two network namespaces joined by a veth pair capped by tc tbf (real bandwidth); "
    "latency added by tests/linkemu.py (no netem in this kernel)",
}


def report(scenarios: list[dict], cfg: TrainConfig, network: str) -> None:
    """The study's finding, checked: TP across sites collapses at tens of ms (here: more than 3x slower
    than the fastest plan), and pipeline / data-parallel combinations are the fastest there."""
    far = [s for s in scenarios if s["latency_ms"] >= 20]
    finding = {
        "tp_across_sites_vs_fastest": {
            f"{s['world']} ranks, {s['latency_ms']:g} ms, {s['bandwidth_mbit']:g} Mbit/s": tp_across_sites_vs_fastest(s)
            for s in scenarios
        },
        "tp_collapses_at_tens_of_ms": all((tp_across_sites_vs_fastest(s) or 0) > 3 for s in far),
        "fastest_at_tens_of_ms": sorted({s["fastest"] for s in far}),
    }
    write_result(
        "planner" if network == "emulated" else f"planner_{network}",
        {
            "model": {**MODEL, "seq_len": SEQ, "global_batch": BATCH, "vocab": cfg.model.vocab_size},
            "steps_per_plan": f"{MIN_STEPS}-{MAX_STEPS} (about {TIMED_SECONDS:g} s)",
            "network": NETWORKS[network],
            "targets": {"memory_error": 0.15, "regret": 1.10},
            "summary": [
                {
                    k: s[k]
                    for k in (
                        "world",
                        "latency_ms",
                        "bandwidth_mbit",
                        "spearman",
                        "regret",
                        "regret_autotune3",
                        "pick",
                        "fastest",
                        "memory_error_median",
                        "memory_error_max",
                        "best_tp_vs_fastest",
                    )
                }
                for s in scenarios
            ],
            "finding": finding,
            "scenarios": scenarios,
        },
    )


if __name__ == "__main__":
    main()
