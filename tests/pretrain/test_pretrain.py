import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_TRAINING, board_texts, read_metrics, run_cli, scifact_slice
from pretrain.config import TrainConfig, model_config_for
from pretrain.data import step_sample_indices
from pretrain.model import GPT, lm_loss
from pretrain.train import lr_multiplier


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    multipliers = [lr_multiplier(s, cfg) for s in range(100)]
    assert multipliers[0] == pytest.approx(0.1) and multipliers[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(multipliers[10:], multipliers[11:]))
    assert multipliers[-1] == pytest.approx(0.1, abs=1e-3)


def test_batches_depend_only_on_seed_and_step_and_cover_each_epoch():
    first = [step_sample_indices(s, 4, 10, seed=7) for s in range(5)]  # 20 samples = 2 epochs of 10 windows
    assert first == [step_sample_indices(s, 4, 10, seed=7) for s in range(5)]
    flat = [i for batch in first for i in batch]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat != [i for s in range(5) for i in step_sample_indices(s, 4, 10, seed=8)]


def test_model_learns_a_repeated_sequence():
    torch.manual_seed(0)
    model = GPT(model_config_for("tiny", vocab_size=50, seq_len=16, n_layer=2, n_embd=32, n_head=2))
    x = torch.arange(17).remainder(50).unsqueeze(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = lm_loss(model(x[:, :-1]), x[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_export_matches_training_model_in_transformers_and_loads_in_sentence_transformers(trained_workspace):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForCausalLM

    from common.workspace import Workspace
    from pretrain.checkpoint import checkpoint_dirs, config_from_checkpoint, load_checkpoint
    from pretrain.train import build_optimizer

    ws = Workspace(trained_workspace)
    checkpoint = checkpoint_dirs(ws)[-1]
    cfg = config_from_checkpoint(checkpoint)
    model = GPT(cfg.model)
    optimizer = build_optimizer(model, cfg)
    load_checkpoint(checkpoint, model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))
    model.eval()
    hf = AutoModelForCausalLM.from_pretrained(ws.model_dir).eval()
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=0, atol=1e-5)
    embedder = SentenceTransformer(str(ws.model_dir), device="cpu")
    vectors = embedder.encode(["a short sentence", "another, somewhat longer sentence"])
    assert vectors.shape == (2, cfg.model.n_embd) and np.isfinite(vectors).all()


def test_a_failed_pretrain_changes_nothing_in_the_workspace(trained_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)

    def files():
        return {p.relative_to(ws): p.read_bytes() for p in sorted(ws.rglob("*")) if p.is_file()}

    before = files()
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text('{"_id": "1", "text": "Too short."}\n{"_id": "2", "text": "Also short."}\n')
    result = run_cli("pretrain", "-w", str(ws), "--data", str(tiny), *TINY_TRAINING, check=False)
    assert result.returncode == 2 and "corpus too small" in result.stderr
    assert files() == before
    fresh = run_cli("pretrain", "-w", str(tmp_path / "new"), "--data", str(tiny), *TINY_TRAINING, check=False)
    assert fresh.returncode == 2 and not (tmp_path / "new").exists()


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    result = run_cli("pretrain", "-w", str(tmp_path), "--resume", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: --resume: no checkpoint in {tmp_path / 'checkpoints'}"]


def test_default_corpus_and_zero_steps_export_the_model_at_initialisation(tmp_path):
    """Without --data, the built-in corpus is used and said. --max-steps 0 is the ablation baseline: the
    exported weights are GPT-2's initialisation for the seed. Search before embed and index says what to run."""
    from safetensors.torch import load_file

    ws = tmp_path / "ws"
    result = run_cli(
        "pretrain", "-w", str(ws), *TINY_TRAINING, "--max-steps", "0", "--vocab-size", "300", "--seed", "5"
    )
    assert "built-in corpus of Python standard library docstrings" in result.stderr
    manifest = json.loads((ws / "manifest.json").read_text())
    assert manifest["model"]["steps"] == 0 and manifest["model"]["final_loss"] is None
    torch.manual_seed(5)
    initial = GPT(
        model_config_for(
            "tiny",
            **{k: manifest["model"]["config"][k] for k in ("vocab_size",)},
            seq_len=32,
            n_layer=2,
            n_head=2,
            n_embd=32,
        )
    )
    exported = load_file(ws / "model" / "model.safetensors")
    torch.testing.assert_close(exported["transformer.wte.weight"], initial.tok_emb.weight.detach(), rtol=0, atol=0)
    torch.testing.assert_close(
        exported["transformer.h.1.mlp.c_fc.weight"], initial.layers["1"].mlp.fc_in.weight.detach().t(), rtol=0, atol=0
    )
    no_index = run_cli("search", "-w", str(ws), "anything", check=False)
    assert no_index.returncode == 2
    assert (
        no_index.stderr.strip()
        == f"error: workspace {ws} has no index: run `pipeline embed` and `pipeline index` first"
    )


def test_sizing_moves_up_the_ladder_on_a_faster_machine_and_discounts_repeated_data():
    from pretrain.sizing import LADDER, choose_shape, law_loss

    # Repeated tokens are worth less than new ones, and more than none.
    assert law_loss(10**6, 10**7, 10**7) < law_loss(10**6, 10**7, 10**6) < law_loss(10**6, 10**6, 10**6)

    def machine(flops_per_s: float):
        def timer(shape, vocab_size, device):  # a step costs its training FLOPs at this speed
            parameters = 12 * shape.n_layer * shape.n_embd**2 + vocab_size * shape.n_embd
            return parameters, 6 * parameters * shape.batch_size * shape.seq_len / flops_per_s

        return timer

    chosen = {
        speed: choose_shape(2_000_000, 8192, 600, torch.device("cpu"), timer=machine(speed))[0]
        for speed in (5e10, 5e13)
    }
    slow, fast = chosen[5e10], chosen[5e13]
    assert LADDER.index(fast.shape) > LADDER.index(slow.shape)
    assert slow.epochs > 1 and slow.steps >= 100  # a small corpus on a CPU: a small model, several epochs
    # A pretraining corpus of billions of tokens: the data is no limit, each faster machine a larger shape.
    corpus = [
        choose_shape(2 * 10**9, 32768, 3600, torch.device("cpu"), timer=machine(s))[0] for s in (5e10, 5e13, 4e14)
    ]
    assert [LADDER.index(c.shape) for c in corpus] == sorted({LADDER.index(c.shape) for c in corpus})
    assert all(c.epochs < 1.5 for c in corpus)


def test_the_sizing_table_ranks_the_shapes_and_prints_no_loss():
    """The law's losses for these shapes are far above any a run reaches (pretrain/sizing.py): the table
    prints each shape's rank by them, the record keeps them beside the rank."""
    from pretrain.config import TrainConfig
    from pretrain.sizing import LADDER, LAW_GAIN, size_to_budget

    def timer(shape, vocab_size, device):  # a machine of 5 TFLOP/s: several shapes fit 10 minutes
        parameters = 12 * shape.n_layer * shape.n_embd**2 + vocab_size * shape.n_embd
        return parameters, 6 * parameters * shape.batch_size * shape.seq_len / 5e12

    cfg = TrainConfig(vocab_size=8192)
    cfg, lines, record = size_to_budget(cfg, 2_000_000, 600, timer=timer)
    shapes, table = record["shapes"], lines[1 : 1 + len(record["shapes"])]
    assert len(shapes) >= 3 and lines[1 + len(shapes)].startswith("chosen: ")
    assert "a ranking, not a forecast" in lines[0] and "loss" not in " ".join(table)
    by_law = sorted(shapes, key=lambda c: c["law_loss"])
    assert [c["law_rank"] for c in by_law] == list(range(1, len(shapes) + 1))
    (chosen,) = [c for c in shapes if c["chosen"]]
    assert (cfg.model.n_layer, cfg.model.n_embd) == (chosen["n_layer"], chosen["n_embd"])
    # the first by the law, or a smaller shape the larger ones are predicted to gain less than LAW_GAIN over
    assert chosen["law_loss"] <= by_law[0]["law_loss"] + LAW_GAIN
    assert all(c["law_loss"] > chosen["law_loss"] - LAW_GAIN for c in shapes if c["parameters"] > chosen["parameters"])
    for line, c in zip(table, shapes):  # in ladder order, each with its rank, the chosen one marked
        assert line.startswith(f"{'->' if c['chosen'] else '  '} rank {c['law_rank']} ") and f"d={c['n_embd']}" in line
    assert [(c["n_layer"], c["n_embd"]) for c in shapes] == [(s.n_layer, s.n_embd) for s in LADDER[: len(shapes)]]


def test_a_sized_run_replans_its_steps_from_its_own_step_time():
    from pretrain.sizing import replanned_steps

    assert replanned_steps(1000, 60.0, 0.03, 12) == 2000  # the steps run twice as fast as sized: twice as many
    assert replanned_steps(1000, 60.0, 0.12, 12) == 500
    assert replanned_steps(1000, 60.0, 0.062, 12) is None  # within 10%: as planned
    assert replanned_steps(1000, 60.0, 10.0, 12) == 13  # never fewer than the steps done and one more


def test_sizing_says_when_other_processes_loaded_the_machine_while_it_timed_the_shapes():
    import multiprocessing
    import time

    import psutil

    from pretrain.sizing import BUSY_SHARE, OtherLoad

    stop = multiprocessing.get_context("spawn").Event()
    busy = [multiprocessing.get_context("spawn").Process(target=spin, args=(stop,)) for _ in range(psutil.cpu_count())]
    with OtherLoad() as loaded:
        for process in busy:
            process.start()
        time.sleep(1.5)
        stop.set()
        for process in busy:
            process.join()
    assert BUSY_SHARE <= loaded.share <= 1.05  # every core spun by other processes: nearly all of the machine


def spin(stop) -> None:
    while not stop.is_set():
        pass


def test_pretrain_without_a_shape_is_sized_to_the_time_budget(tmp_path, corpus_file):
    from pretrain.sizing import LADDER

    ws = tmp_path / "ws"
    result = run_cli(
        "pretrain", "-w", str(ws), "--data", str(corpus_file), "--time-budget", "5s", "--no-adapt", "--log-every", "5"
    )
    assert "sizing for" in result.stderr and "chosen:" in result.stderr
    model = json.loads((ws / "manifest.json").read_text())["model"]
    planned = int(re.search(r"chosen: .*?, ([\d,]+) steps", result.stderr).group(1).replace(",", ""))
    replanned = re.search(r"re-planned: ([\d,]+) steps instead of ([\d,]+)", result.stderr)
    # The loop re-planned its steps from its own timing, or found sizing's plan within 10% of it.
    assert model["steps"] == (int(replanned.group(1).replace(",", "")) if replanned else planned)
    shapes = {(s.n_layer, s.n_embd, s.n_head, s.batch_size) for s in LADDER}
    assert model["preset"] == "sized" and model["steps"] >= 1
    # The table ranks the shapes by the scaling law and prints none of its losses, which no run here reaches.
    table = [line for line in result.stderr.splitlines() if re.match(r"(->|  ) rank \d", line)]
    assert table and sum(line.startswith("->") for line in table) == 1 and "loss" not in " ".join(table)
    # The run's log: what sizing timed and ranked, then the validation loss reached after all the (re-planned) steps
    metrics = read_metrics(ws)
    sizing, end = metrics[0], metrics[-1]
    assert sizing["event"] == "sizing" and len(sizing["shapes"]) == len(table)
    assert sorted(c["law_rank"] for c in sizing["shapes"]) == list(range(1, len(table) + 1))
    chosen = next(c for c in sizing["shapes"] if c["chosen"])
    assert chosen["law_rank"] == 1 and (chosen["n_layer"], chosen["n_embd"]) == (
        model["config"]["n_layer"],
        model["config"]["n_embd"],
    )
    assert [m["step"] for m in metrics if m["event"] == "train"][-1] == model["steps"]
    val = [m for m in metrics if m["event"] == "val"]
    assert val[-1]["step"] == model["steps"] and model["final_val_loss"] == val[-1]["val_loss"]
    assert end["event"] == "end" and end["val_loss_reached"] == val[-1]["val_loss"] and end["law_rank"] == 1
    assert end["law_loss"] == chosen["law_loss"] and end["shapes_ranked"] == len(table)
    assert model["prediction"]["sizing"]["shapes"] == sizing["shapes"]  # the manifest keeps it too
    assert f"TensorBoard: tensorboard --logdir {ws / 'tensorboard'}" in result.stderr
    assert "| rank | layers |" in board_texts(ws / "tensorboard" / "pretrain")["sizing"]
    assert (
        model["config"]["n_layer"],
        model["config"]["n_embd"],
        model["config"]["n_head"],
        model["batch_size"],
    ) in shapes
    bad = run_cli(
        "pretrain", "-w", str(tmp_path / "bad"), "--data", str(corpus_file), "--time-budget", "soon", check=False
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --time-budget: 'soon' is not a duration (e.g. 90s, 15m, 1.5h); see `pipeline pretrain --help`"
    ]
    assert not (tmp_path / "bad").exists()


def test_datasheet_peaks_of_known_cards_and_none_for_others():
    """The card's name as torch reports it picks its dense bf16 peak; the more specific name wins (an H100
    PCIe is not an SXM card, an L40S not an L4); an unknown card and a CPU have none."""
    from pretrain.hardware import card_peak, datasheet_peak

    assert card_peak("NVIDIA H100 80GB HBM3") == ("NVIDIA H100 80GB HBM3", pytest.approx(989.4e12))
    assert card_peak("NVIDIA H100 PCIe")[1] == pytest.approx(756e12)
    assert card_peak("NVIDIA H200")[1] == pytest.approx(989.4e12)
    assert card_peak("NVIDIA H20")[1] == pytest.approx(148e12)
    assert card_peak("NVIDIA A100-SXM4-80GB")[1] == pytest.approx(312e12)
    assert card_peak("NVIDIA L40S")[1] == pytest.approx(362.1e12)
    assert card_peak("NVIDIA L4")[1] == pytest.approx(121e12)
    assert card_peak("Some Future GPU") is None
    assert datasheet_peak("cpu") is None


def test_a_peak_below_what_a_run_computes_is_dropped_for_the_datasheet_or_raised_without_one():
    """Never 100% MFU against a wrong measurement: with a datasheet peak the measurement is dropped, without
    one (a CPU, an unknown card) the run's own rate becomes the peak, as on CPU before."""
    from pretrain.hardware import checked_peak

    assert checked_peak(277e12, 38e12, 989.4e12) is None
    assert checked_peak(277e12, 38e12, None) == 277e12
    assert checked_peak(277e12, 800e12, 989.4e12) == 800e12


def test_the_measured_peak_is_keyed_by_its_method():
    """A peak recorded by another method (fp32 1024x1024 on a GPU, once) is not reused: the key names it."""
    from pretrain.hardware import machine_key, measure_matmul_flops

    assert machine_key(torch.device("cpu"), 1).endswith("|float32 1024x1024")
    assert measure_matmul_flops("cpu", size=256, seconds=0.05) > 0


def exported_validation_loss(ws: Path, seq_len: int, batch_size: int, eval_batches: int = 8) -> float:
    """The exported model's loss on the validation windows training measures (pretrain/train.py's evaluate)."""
    from transformers import GPT2LMHeadModel

    from pretrain.data import TokenWindows

    model = GPT2LMHeadModel.from_pretrained(ws / "model").eval()
    val = TokenWindows.open(ws / "data", "val", seq_len)
    losses = []
    with torch.no_grad():
        for b in range(max(1, -(-min(len(val), eval_batches * batch_size) // batch_size))):
            x, y = val.batch([(b * batch_size + j) % len(val) for j in range(batch_size)])
            losses.append(torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


def test_the_best_validation_step_is_exported_kept_across_resume_and_training_stops_early(tmp_path):
    """On documents few enough to overfit, validation loss falls, then rises: the export is the best step's
    weights (its loss on the validation windows is the best one logged, not the last), recorded in the
    manifest; a resumed run keeps that best, and stops once `--patience` validations bring no new one."""
    from common.manifest import read_manifest
    from common.workspace import Workspace

    data = scifact_slice(tmp_path / "few.jsonl", 8)
    ws = tmp_path / "ws"
    shape = [*TINY_TRAINING, "--n-layer", "4", "--n-embd", "128", "--lr", "3e-3", "--eval-every", "20"]
    run_cli("pretrain", "-w", str(ws), "--data", str(data), *shape, "--max-steps", "320", "--patience", "0")
    validations = {r["step"]: r["val_loss"] for r in read_metrics(ws) if r.get("event") == "val"}
    best_step = min(validations, key=validations.get)
    assert best_step < 320 and validations[320] > validations[best_step]  # it overfit: the test means something
    assert exported_validation_loss(ws, 32, 8) == pytest.approx(validations[best_step], abs=1e-3)
    model = read_manifest(Workspace(ws)).model.to_json()
    assert (model["best_step"], model["best_val_loss"], model["steps"]) == (best_step, validations[best_step], 320)

    resumed = run_cli("pretrain", "-w", str(ws), "--resume", "--max-steps", "400", "--patience", "2", "--no-adapt")
    assert "stopping early at step 360 of 400" in resumed.stderr
    end = [r for r in read_metrics(ws) if r.get("event") == "end"][-1]
    assert (end["step"], end["best_step"]) == (360, best_step)
    assert exported_validation_loss(ws, 32, 8) == pytest.approx(validations[best_step], abs=1e-3)
    model = read_manifest(Workspace(ws)).model.to_json()
    assert (model["steps"], model["stopped_early"], model["best_step"]) == (360, True, best_step)


def test_sizing_keeps_a_small_corpus_within_the_epoch_limit_on_a_gpu_class_machine():
    """SciFact's 1.7M tokens on a GPU's speed for 2 minutes: 92M parameters for 23 epochs overfit there. The
    data-constrained law ranks shapes that would repeat the data or outgrow it down, the steps stop at
    MAX_EPOCHS, and the plan says the budget is more than the data can use."""
    from pretrain.config import TrainConfig
    from pretrain.sizing import MAX_EPOCHS, law_loss, size_to_budget

    # parameters beyond what the unique tokens can fill gain less than where the data fills them, but still gain
    gain_few_tokens = law_loss(10**7, 4 * 10**6, 10**6) - law_loss(10**8, 4 * 10**6, 10**6)
    gain_many_tokens = law_loss(10**7, 4 * 10**9, 10**9) - law_loss(10**8, 4 * 10**9, 10**9)
    assert 0 < gain_few_tokens < gain_many_tokens / 10

    def gpu(shape, vocab_size, device):  # 300 TFLOP/s of model FLOPs: an H100 with bf16
        parameters = 12 * shape.n_layer * shape.n_embd**2 + vocab_size * shape.n_embd
        return parameters, 6 * parameters * shape.batch_size * shape.seq_len / 3e14

    cfg, lines, record = size_to_budget(TrainConfig(vocab_size=8192), 1_670_000, 120, timer=gpu)
    (chosen,) = [c for c in record["shapes"] if c["chosen"]]
    assert chosen["epochs"] <= MAX_EPOCHS and cfg.max_steps <= cfg.max_planned_steps
    assert cfg.max_planned_steps * cfg.batch_size * cfg.seq_len <= MAX_EPOCHS * 1_670_000
    assert 92e6 > chosen["parameters"] > record["shapes"][0]["parameters"]  # larger than the smallest, not GPT-2's
    assert record["capped_at_max_epochs"] and any("more than these 1,670,000 tokens can use" in line for line in lines)


def test_an_out_of_memory_gpu_is_one_line_saying_what_to_lower():
    from common.errors import out_of_memory_error

    said = out_of_memory_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has"))
    assert said.startswith("the GPU ran out of memory (CUDA out of memory)") and "--batch-size" in said
    assert "\n" not in said
    assert out_of_memory_error(RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be")) is not None
    assert out_of_memory_error(RuntimeError("shape mismatch")) is None and out_of_memory_error(ValueError("x")) is None
