"""The strategy planner: cluster descriptions, the meta-device model profile, the schedule simulation,
plan choices that follow the hardware, bad input, and the link emulator and cluster measurement on a
real gloo job. Benchmarks (benchmarks/bench_planner.py) check predictions against measured runs."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import resource
from dataclasses import replace

import pytest
import torch

from common.errors import PipelineError
from conftest import board, board_charts, run_cli
from pretrain.config import ModelConfig, ParallelConfig, model_config_for
from pretrain.planner.candidates import Candidate, enumerate_plans
from pretrain.planner.cluster import EXAMPLE_TOML, Device, Link, load_cluster_toml, uniform_cluster
from pretrain.planner.cost import estimate, shared_cpu_speedup
from pretrain.planner.layout import Layout
from pretrain.planner.measure import MeasureSettings, local_cluster, measure_cluster
from pretrain.planner.pipeline_sim import simulate
from pretrain.planner.profile import Workload, profile_model
from pretrain.planner.rank import check_degrees, filter_degrees, plan

GB = 1e9
TWO_SITES = """
[[nodes]]
name = "site-a"
devices = 4
device = "A100-40GB"
memory_gb = 40
tflops = 150

[[nodes]]
name = "site-b"
devices = 4
device = "A100-40GB"
memory_gb = 40
tflops = 150

[links.intra_node]
bandwidth_gbps = 2400
latency_ms = 0.01

[links.inter_node]
bandwidth_gbps = 10
latency_ms = {latency}
"""


def gpu_sites(latency_ms: float, per_node: int = 4, nodes: int = 2):
    """Identical GPU nodes: NVLink inside, `latency_ms` and 10 Gbit/s between."""
    return uniform_cluster(
        per_node * nodes,
        150e12,
        40 * GB,
        Link(10e-6, 300 * GB),
        Link(latency_ms / 1e3, 10 * GB / 8),
        per_node=per_node,
        mem_bw_Bps=1.5e12,
        dispatch_s=5e-6,
    )


# ---------------------------------------------------------------- cluster files


def test_cluster_toml_gives_a_link_matrix_with_slow_links_only_between_sites(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TWO_SITES.format(latency=30))
    cluster = load_cluster_toml(path)
    assert cluster.world_size == 8 and cluster.nodes == ["site-a", "site-b"]
    assert cluster.link(0, 3).latency_s == pytest.approx(1e-5) and cluster.link(0, 3).bandwidth_Bps == pytest.approx(
        300e9
    )
    assert cluster.link(3, 4).latency_s == pytest.approx(0.03) and cluster.link(3, 4).bandwidth_Bps == pytest.approx(
        1.25e9
    )
    assert cluster.ring([0, 1, 2, 3]).latency_s < 1e-3 and cluster.ring([0, 4]).latency_s == pytest.approx(0.03)
    assert cluster.devices[5].memory_bytes == 40e9 and cluster.devices[5].flops == 150e12


def test_the_example_cluster_file_reads_as_it_says(tmp_path):
    """The example cluster file docs/plan.md points to reads as its comments say: two sites of 4 GPUs, 30 ms and
    10 Gbit/s apart."""
    path = tmp_path / "example.toml"
    path.write_text(EXAMPLE_TOML)
    cluster = load_cluster_toml(path)
    assert cluster.world_size == 8 and cluster.nodes == ["site-a", "site-b"]
    assert cluster.link(0, 1).bandwidth_Bps == pytest.approx(2400e9 / 8)
    assert cluster.link(3, 4).latency_s == pytest.approx(0.03) and cluster.link(3, 4).bandwidth_Bps == pytest.approx(
        10e9 / 8
    )
    assert {d.name for d in cluster.devices} == {"A100-40GB"} and cluster.devices[0].flops == 150e12


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace("memory_gb = 40\n", "", 1), "nodes[0]: missing field 'memory_gb'"),
        (lambda t: t.replace("tflops = 150", "tflops = -3", 1), "nodes[0]: 'tflops' must be positive, got -3"),
        (
            lambda t: t.replace("bandwidth_gbps = 10", "bandwidth_gbps = 0"),
            "[links.inter_node]: 'bandwidth_gbps' must be positive, got 0",
        ),
        (lambda t: t.replace("devices = 4", 'devices = "four"', 1), "nodes[0]: 'devices' must be a number"),
        (lambda t: t[: t.index("[links.inter_node]")], "[links.inter_node]: missing table"),
        (lambda t: "nodes = 3", "missing [[nodes]]"),
        (lambda t: t + "\n[[[", "invalid TOML"),
    ],
)
def test_bad_cluster_files_are_one_error_naming_the_field(tmp_path, edit, message):
    path = tmp_path / "c.toml"
    path.write_text(edit(TWO_SITES.format(latency=30)))
    with pytest.raises(PipelineError) as e:
        load_cluster_toml(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- the model profile


def test_profile_of_gpt2_large_is_built_on_the_meta_device_without_memory():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    profile = profile_model(model_config_for("large", 50257, 1024), 1024)
    block = profile.block(4)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert 770e6 < profile.total_params < 780e6  # GPT-2 large: 774M
    assert grown_mb < 300  # a real GPT-2 large is 3 GB of fp32 weights alone
    # a TP shard of 4 has a quarter of the matmul FLOPs and about a quarter of the block's parameters
    assert block.fwd.flops == pytest.approx(profile.block(1).fwd.flops / 4, rel=0.05)
    assert profile.block_params_on_rank(4) == pytest.approx(profile.block_params / 4, rel=0.01)


def test_activation_bytes_counted_on_meta_match_what_autograd_saves_on_cpu():
    """The meta trace corrects for attention's math path: it must equal the real CPU saved bytes."""
    from pretrain.model import Block

    cfg = ModelConfig(vocab_size=256, n_layer=1, n_head=4, n_embd=64, block_size=32)
    profile = profile_model(cfg, 32)
    block = Block(cfg)
    params = {p.untyped_storage()._cdata for p in block.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage()._cdata not in params:
            saved[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(3, 32, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x).float().sum()
    assert profile.block(1).saved_bytes * 3 == pytest.approx(sum(saved.values()), rel=0.02)


# ---------------------------------------------------------------- the schedule simulation


def test_simulated_1f1b_and_gpipe_have_the_textbook_bubble_and_in_flight_microbatches():
    p, m, tf, tb = 4, 8, 1.0, 2.0
    no_comm = {(a, b): 0.0 for a in range(p) for b in range(p) if a != b}
    for schedule, in_flight in (("1f1b", p), ("gpipe", m)):
        config = ParallelConfig(strategy="pp", pp=p, pp_schedule=schedule, microbatches=m)
        sim = simulate(config, [tf] * p, [tb] * p, [1.0] * p, no_comm)
        assert sim.makespan == pytest.approx((m + p - 1) * (tf + tb))  # bubble (p-1)/(m+p-1)
        assert sim.peak_inflight[0] == in_flight
    # a transfer between stages delays every hop of the critical path
    slow = simulate(
        ParallelConfig(strategy="pp", pp=p, pp_schedule="1f1b", microbatches=m),
        [tf] * p,
        [tb] * p,
        [1.0] * p,
        {k: 0.5 for k in no_comm},
    )
    assert slow.makespan >= (m + p - 1) * (tf + tb) + 2 * (p - 1) * 0.5


def test_interleaved_and_zero_bubble_orders_come_from_torch_and_shrink_the_bubble():
    p, m = 4, 8
    no_comm = {(a, b): 0.0 for a in range(p) for b in range(p) if a != b}
    one = simulate(
        ParallelConfig(strategy="pp", pp=p, pp_schedule="1f1b", microbatches=m),
        [1.0] * p,
        [2.0] * p,
        [1.0] * p,
        no_comm,
    )
    v = 2  # the same work in twice as many stages of half the size
    inter = simulate(
        ParallelConfig(strategy="pp", pp=p, pp_schedule="interleaved-1f1b", microbatches=m, stages_per_rank=v),
        [0.5] * p * v,
        [1.0] * p * v,
        [0.5] * p * v,
        no_comm,
    )
    zb = simulate(
        ParallelConfig(strategy="pp", pp=p, pp_schedule="zero-bubble", microbatches=m, stages_per_rank=v),
        [0.5] * p * v,
        [1.0] * p * v,
        [0.5] * p * v,
        no_comm,
    )
    busy = m * 3.0
    assert busy < zb.makespan <= inter.makespan < one.makespan


# ---------------------------------------------------------------- choices that follow the hardware


def test_small_matmuls_cost_more_per_flop_where_the_device_measured_so():
    device = Device("cpu", 0, 8 * GB, 200e9, matmul_rates=[[1e6, 20e9], [1e8, 100e9], [1e10, 200e9]])
    assert device.matmul_time(1e6) == pytest.approx(1e6 / 20e9)
    assert device.matmul_time(1e10) == pytest.approx(1e10 / 200e9)
    between = 1e7 / device.matmul_time(1e7)  # halfway on a log scale: the geometric mean of the rates
    assert between == pytest.approx((20e9 * 100e9) ** 0.5)
    assert Device("cpu", 0, 8 * GB, 200e9).matmul_time(1e6) == pytest.approx(1e6 / 200e9)  # nothing measured: the peak


def test_cpu_ranks_sharing_cores_compute_faster_when_the_pipeline_leaves_some_idle():
    shared = Device("cpu", 0, 8 * GB, 1e9, host_cores=2, host_ranks=4, threads=1)
    assert shared_cpu_speedup(shared, 1.0) == pytest.approx(1.0)  # all busy: as measured
    assert shared_cpu_speedup(shared, 0.5) == pytest.approx(2.0)  # two of four busy: a core each
    assert shared_cpu_speedup(shared, 0.1) == pytest.approx(2.0)  # never more than a rank's own threads
    assert shared_cpu_speedup(Device("cpu", 0, 8 * GB, 1e9, host_cores=2, host_ranks=2, threads=1), 0.5) == 1.0
    assert shared_cpu_speedup(Device("gpu", 0, 8 * GB, 1e12), 0.5) == 1.0
    # so a pipeline on an oversubscribed host is predicted faster than the same pipeline on cores of its own
    cfg = ModelConfig(vocab_size=256, block_size=32, n_layer=4, n_head=2, n_embd=32)
    config = ParallelConfig(strategy="pp", pp=4, pp_schedule="1f1b", microbatches=4)
    own = uniform_cluster(4, 1e9, 8 * GB, Link(1e-5, 1e9), mem_bw_Bps=1e9)
    sharing = uniform_cluster(4, 1e9, 8 * GB, Link(1e-5, 1e9), mem_bw_Bps=1e9, host_cores=2, host_ranks=4, threads=1)
    work = Workload(cfg, 32, 8)
    assert estimate(Candidate(config), work, sharing).step_s < 0.8 * estimate(Candidate(config), work, own).step_s


def test_tensor_parallelism_stays_inside_a_node_and_slow_sites_get_the_pipeline():
    work = Workload(model_config_for("medium", 32768, 1024), 1024, 64)
    far = plan(work, gpu_sites(30))
    best = far.ranked[0].candidate.config
    assert best.pp > 1 and best.tp <= 4  # the pipeline crosses the 30 ms link, nothing else does
    tp8 = [e for e in far.ranked if e.candidate.config.tp == 8]
    assert not tp8 or tp8[0].step_s > 3 * far.ranked[0].step_s
    near = plan(work, gpu_sites(0.005))  # one fast network: no reason to pay a pipeline bubble
    assert near.ranked[0].step_s < far.ranked[0].step_s


def test_tensor_parallel_step_time_grows_with_latency_faster_than_pipeline():
    work = Workload(model_config_for("small", 8192, 512), 512, 32)
    tp = Candidate(ParallelConfig(strategy="tp", tp=2))
    pp = Candidate(ParallelConfig(strategy="pp", pp=2, pp_schedule="1f1b", microbatches=4))

    def fast_link(latency_ms):  # NVLink-class bandwidth, only the latency changes
        return uniform_cluster(
            2, 150e12, 40 * GB, Link(latency_ms / 1e3, 300 * GB), per_node=1, mem_bw_Bps=1.5e12, dispatch_s=5e-6
        )

    times = {
        lat: (estimate(tp, work, fast_link(lat)).step_s, estimate(pp, work, fast_link(lat)).step_s)
        for lat in (0.0, 20.0)
    }
    ratio = {lat: tp_s / pp_s for lat, (tp_s, pp_s) in times.items()}
    assert ratio[0.0] < 1.5  # a fast link: TP is competitive
    assert ratio[20.0] > 5 * ratio[0.0]  # 20 ms: TP's per-layer all-reduces collapse it, PP pays a few hops


def test_sends_crossing_between_the_same_two_nodes_at_once_share_the_link():
    """Two nodes of two ranks, 100 Mbit/s between them. Pipeline replicas (FSDP × PP) and data-parallel
    groups spread over both nodes send across the one link at the same time; a ring's two crossings go in
    opposite directions and do not. With links of their own (the emulator), nothing is shared."""
    inter = 100e6 / 8
    shared = uniform_cluster(4, 1e12, 8 * GB, Link(1e-5, 10 * GB), Link(0.0, inter), per_node=2)
    own = replace(shared, shared_links=False)
    fsdp_pp = ParallelConfig(strategy="hybrid", dp_shard=2, pp=2, pp_schedule="1f1b", microbatches=2)
    assert Layout(fsdp_pp, shared, ()).pp_link(0, 1).bandwidth_Bps == pytest.approx(inter / 2)  # both replicas cross
    assert Layout(fsdp_pp, own, ()).pp_link(0, 1).bandwidth_Bps == pytest.approx(inter)
    assert Layout(fsdp_pp, shared, ()).slowest_ring("dp_shard")[0].bandwidth_Bps == pytest.approx(
        10 * GB
    )  # inside a node
    pp4 = ParallelConfig(strategy="pp", pp=4, pp_schedule="1f1b", microbatches=4)
    assert Layout(pp4, shared, ()).pp_link(1, 2).bandwidth_Bps == pytest.approx(inter)  # one stage boundary crosses
    fsdp_tp = ParallelConfig(strategy="hybrid", dp_shard=2, tp=2)  # TP inside the nodes, FSDP pairs across
    assert Layout(fsdp_tp, shared, ()).slowest_ring("dp_shard")[0].bandwidth_Bps == pytest.approx(inter / 2)
    ddp = ParallelConfig(strategy="ddp", dp_replicate=4)
    assert Layout(ddp, shared, ()).slowest_ring("dp_replicate")[0].bandwidth_Bps == pytest.approx(inter)
    work = Workload(ModelConfig(vocab_size=512, n_layer=4, n_head=4, n_embd=128, block_size=64), 64, 16)
    assert estimate(Candidate(fsdp_pp), work, shared).step_s > estimate(Candidate(fsdp_pp), work, own).step_s
    assert estimate(Candidate(pp4), work, shared).step_s == pytest.approx(estimate(Candidate(pp4), work, own).step_s)


def test_mixed_devices_get_an_uneven_pipeline_split_with_more_layers_on_the_faster_one():
    fast = Device("H100", 0, 80 * GB, 400e12, 3e12, 5e-6)
    slow = Device("T4", 1, 16 * GB, 40e12, 0.3e12, 5e-6)
    cluster = uniform_cluster(2, 1, 1, Link(1e-5, 25 * GB), per_node=1)
    cluster.devices = [fast, slow]
    work = Workload(ModelConfig(vocab_size=8192, n_layer=12, n_head=12, n_embd=768, block_size=512), 512, 16)
    result = filter_degrees(plan(work, cluster), dp=1, tp=1, pp=2)
    split = result.ranked[0].candidate.config.pp_split
    order = result.ranked[0].candidate.node_order
    fast_stage = 0 if order[0] == 0 else 1
    assert split is not None and split[fast_stage] > split[1 - fast_stage]


def test_memory_estimate_shards_with_fsdp_and_counts_in_flight_microbatches():
    work = Workload(model_config_for("small", 32768, 1024), 1024, 32)
    cluster = gpu_sites(0.01)
    ddp = estimate(Candidate(ParallelConfig(strategy="ddp", dp_replicate=8)), work, cluster)
    fsdp = estimate(Candidate(ParallelConfig(strategy="fsdp", dp_shard=8)), work, cluster)
    assert fsdp.memory_parts["optimizer"] == pytest.approx(ddp.memory_parts["optimizer"] / 8)
    gpipe = estimate(
        Candidate(ParallelConfig(strategy="pp", pp=8, pp_schedule="gpipe", microbatches=16)),
        Workload(work.model, 1024, 32),
        cluster,
    )
    onef = estimate(
        Candidate(ParallelConfig(strategy="pp", pp=8, pp_schedule="1f1b", microbatches=16)),
        Workload(work.model, 1024, 32),
        cluster,
    )
    assert gpipe.memory_parts["activations"] > 1.8 * onef.memory_parts["activations"]  # 16 vs 8 microbatches in flight


def test_every_enumerated_plan_is_one_training_accepts():
    work = Workload(ModelConfig(vocab_size=512, n_layer=4, n_head=4, n_embd=64, block_size=64), 64, 16)
    plans = enumerate_plans(4, work)
    kinds = {c.label().split()[0].rstrip("0123456789x") for c in plans}
    assert {"ddp", "fsdp", "hsdp", "tp", "pp"} <= {k.split("-")[0].rstrip("0123456789") for k in kinds}
    for c in plans:
        assert c.config.world_size == 4
        ParallelConfig.resolve(
            c.config.strategy,
            4,
            dp_replicate=c.config.dp_replicate if c.config.dp_replicate > 1 else None,
            dp_shard=c.config.dp_shard if c.config.dp_shard > 1 else None,
            tp=c.config.tp if c.config.tp > 1 else None,
            pp=c.config.pp if c.config.pp > 1 else None,
        )


# ---------------------------------------------------------------- bad input


def test_bad_planning_input_names_the_problem():
    cfg = ModelConfig(vocab_size=512, n_layer=1, n_head=3, n_embd=48, block_size=64)  # no TP or PP of 2 or 4: dp = 4
    with pytest.raises(PipelineError, match="--global-batch 3 cannot be divided"):
        plan(Workload(cfg, 64, 3), uniform_cluster(4, 1e12, 8 * GB, Link(1e-5, 1e10)))
    with pytest.raises(
        PipelineError,
        match=r"fits no plan on 8 device\(s\): the smallest plan .* needs [0-9.]+ GiB per device, "
        r"the devices have 1.00 GiB",
    ):
        plan(
            Workload(model_config_for("large", 50257, 1024), 1024, 64),
            uniform_cluster(8, 1e12, 2**30, Link(1e-5, 1e10)),
        )
    with pytest.raises(PipelineError, match="--dp 3 × --tp 1 × --pp 1 = 3, not the world size 4"):
        check_degrees(4, 3, 1, 1)
    with pytest.raises(PipelineError, match="do not divide the world size 4"):
        check_degrees(4, None, 3, None)


def test_plan_command_table_json_and_errors(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TWO_SITES.format(latency=30))
    table = run_cli(
        "plan", "--preset", "medium", "--cluster", str(path), "--seq-len", "1024", "--global-batch", "64", "--top", "5"
    )
    assert "step ms" in table.stdout and "tokens/s" in table.stdout and "best:" in table.stdout
    data = json.loads(run_cli("plan", "--preset", "tiny", "--cluster", str(path), "--json").stdout)
    first = data["plans"][0]
    assert (
        data["world_size"] == 8
        and first["fits"]
        and first["step_s"] > 0
        and first["memory_mb"] > 0
        and first["main_cost"]
    )
    assert all(a["step_s"] <= b["step_s"] for a, b in zip(data["plans"], data["plans"][1:]))
    bad = run_cli("plan", "--cluster", str(path), "--preset", "tiny", "--dp", "3", check=False)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: the degrees given (dp=3 = 3) do not divide the world size 8"
    )
    path.write_text(TWO_SITES.format(latency=30).replace("tflops = 150\n", "", 1))
    missing = run_cli("plan", "--cluster", str(path), check=False)
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: {path}: nodes[0]: missing field 'tflops'"


# ---------------------------------------------------------------- real processes: emulator and measurement


@pytest.mark.multiprocess
def test_measured_links_show_the_emulated_latency_and_bandwidth():
    """A real 2-process gloo job measures this machine; the link emulator (tests/linkemu.py), installed in
    each rank by the measurement's setup, adds 25 ms and 80 Mbit/s. How much more than that a message takes
    depends on the machine and its load: the test asserts only what the emulator guarantees (no message
    arrives sooner than its emulated time) and that every cost the planner needs was measured."""
    from linkemu import EmulatedLinks, install

    emulated = Link(0.025, 10e6)
    settings = MeasureSettings(seconds=0.05, large_bytes=2**20, repeats=2)
    cluster = measure_cluster(2, settings, setup=functools.partial(install, EmulatedLinks.sites(2, 1, emulated)))
    link = cluster.link(0, 1)
    assert link.latency_s >= emulated.latency_s
    assert link.time(settings.large_bytes) >= emulated.time(settings.large_bytes)
    assert cluster.link(1, 0) == link
    device = cluster.devices[0]
    assert device.flops > 0 and cluster.devices[1].memory_bytes > 0
    # matmul rates by size, the peak being the best of them
    sizes = [size for size, _ in device.matmul_rates]
    assert len(sizes) >= 4 and sizes == sorted(sizes) and all(rate > 0 for _, rate in device.matmul_rates)
    assert device.flops == max(rate for _, rate in device.matmul_rates)
    # host costs a step pays beyond its FLOPs, measured for real
    assert device.dispatch_s > 0 and device.optimizer_s_per_tensor > 0 and device.dtensor_optimizer_s_per_tensor > 0
    assert device.elementwise_Bps >= 0  # GELU, layer norm, softmax, calibrated on a real block (0: copy-bound)
    # a real 1F1B pipeline's cost per action beyond compute and the hops the estimate already counts
    assert math.isfinite(cluster.pipeline_action_s) and cluster.pipeline_action_s >= 0
    assert device.host_ranks == 2 and device.host_cores == os.cpu_count()


def test_cluster_is_measured_once_and_cached_in_the_workspace(tmp_path):
    quick = MeasureSettings(seconds=0.05)
    first, cached = local_cluster(tmp_path / "cluster.json", 1, settings=quick)
    assert not cached and first.world_size == 1
    again, cached = local_cluster(tmp_path / "cluster.json", 1, settings=quick)
    assert cached and again.devices[0].flops == first.devices[0].flops


def test_strategy_auto_trains_the_top_plan_and_logs_its_prediction_beside_the_measurement(tmp_path, corpus_file):
    """One process: the planner measures this machine (cached in the workspace), picks the plan, and
    the run logs the planner's step time and memory beside what it measured."""
    from conftest import TINY_TRAINING

    ws = tmp_path / "ws"
    done = run_cli(
        "pretrain", "-w", str(ws), "--data", str(corpus_file), *TINY_TRAINING, "--max-steps", "2", "--strategy", "auto"
    )
    # One process: no parallelism, but gradient accumulation may rank first where its smaller matmuls measured
    # faster per FLOP (as they may on a loaded machine): the plan run is the one printed.
    chosen = re.search(r"strategy auto: (.+?) out of \d+ plans", done.stderr).group(1)
    assert chosen.split()[0] == "single"
    assert list(json.loads((ws / "cluster.json").read_text())) != []
    steps = [json.loads(line) for line in (ws / "metrics.jsonl").read_text().splitlines()]
    train = [s for s in steps if s["event"] == "train"]
    assert len(train) == 2 and all(s["predicted_step_s"] > 0 and s["measured_step_s"] > 0 for s in train)
    assert all(s["predicted_peak_mem_mb"] > 0 for s in train)
    assert json.loads((ws / "manifest.json").read_text())["model"]["prediction"]["plan"] == chosen
    # TensorBoard draws the prediction beside the measurement, one chart each for step time and memory
    scalars = board(ws / "tensorboard" / "pretrain")
    for tag, field in [
        ("plan/step_s_predicted", "predicted_step_s"),
        ("plan/step_s_measured", "measured_step_s"),
        ("plan/peak_mem_mb_predicted", "predicted_peak_mem_mb"),
        ("plan/peak_mem_mb_measured", "measured_peak_mem_mb"),
    ]:
        assert scalars[tag] == [(s["step"], pytest.approx(s[field], rel=1e-6)) for s in train], tag
    charts = board_charts(ws / "tensorboard" / "pretrain")
    assert charts["step time (s): the plan's prediction and the run"] == [
        "plan/step_s_predicted",
        "plan/step_s_measured",
    ]
    assert charts["peak memory (MB): the plan's prediction and the run"] == [
        "plan/peak_mem_mb_predicted",
        "plan/peak_mem_mb_measured",
    ]
