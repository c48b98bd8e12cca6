"""Ray paths: embedding, training and tokenizing on the suite's Ray cluster of two nodes (conftest.py ray_cluster;
slow to start: few, bounded tests)."""

import numpy as np
import pytest

from common.store import Store
from common.workspace import Workspace
from conftest import run_cli

pytestmark = pytest.mark.ray

pytest.importorskip("ray", reason="the ray extra is not installed")


def test_ray_embedded_vectors_equal_single_process_ones(trained_workspace, tmp_path, corpus_file, ray_cluster, capfd):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(corpus_file.read_text().splitlines()[:30]) + "\n")
    from embed.run import run_embed
    from embed.settings import EmbedSettings

    stores = {}
    single, ray = Workspace(tmp_path / "single").create(), Workspace(tmp_path / "ray").create()
    run_embed(
        single, [data], None, EmbedSettings(model_dir=trained_workspace / "model", chunk_tokens=48, overlap=8)
    )  # the reference, without Ray
    # In this process, connected to the suite's cluster (a command reuses the connection it finds): a process and
    # a cluster of its own cost half a minute of the suite, for what the cluster's actors compute.
    run_cli(
        "embed",
        "-w",
        str(ray.root),
        "--data",
        str(data),
        "--model",
        str(trained_workspace / "model"),
        "--chunk-tokens",
        "48",
        "--overlap",
        "8",
        "--ray",
        ray_cluster,
    )
    # Ray's core worker logs its notice on actors with arguments in the object store (Ray Data's) on stderr too
    assert "core_worker" not in capfd.readouterr().err
    for name, ws in (("single", single), ("ray", ray)):
        with Store(ws.db_path, read_only=True) as store:
            chunks = store.con.execute(
                "SELECT chunk_id, doc_id, chunk_index, text FROM chunks ORDER BY chunk_id"
            ).fetchall()
            stores[name] = (chunks, *store.load_vectors())
    (chunks_1, ids_1, vectors_1), (chunks_r, ids_r, vectors_r) = stores["single"], stores["ray"]
    assert chunks_1 == chunks_r and len(chunks_1) > 30
    np.testing.assert_array_equal(ids_1, ids_r)
    np.testing.assert_allclose(vectors_r, vectors_1, atol=1e-5)


def test_ray_training_matches_one_process_and_survives_a_killed_worker(tmp_path, corpus_file, ray_cluster):
    """One Ray run of two workers, one SIGKILLed mid-run, must end with the losses of an uninterrupted run of one
    process (which two-process DDP under torchrun matches: tests/pretrain/test_parallel.py)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO, TINY_TRAINING, read_metrics

    # The kill lands within a step or two of the checkpoint of step 8; two more checkpoints (about 2 s each
    # on Ray) follow it, so it lands mid-run, not after the last step.
    args = [
        "--data",
        str(corpus_file),
        *TINY_TRAINING,
        "--max-steps",
        "16",
        "--checkpoint-every",
        "4",
    ]
    reference = tmp_path / "one-process"
    run_cli("pretrain", "-w", str(reference), *args)

    ws = tmp_path / "ray"
    log = open(tmp_path / "ray.log", "w")
    process = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "cli.py"),
            "pretrain",
            "-w",
            str(ws),
            *args,
            "--nproc",
            "2",
            "--strategy",
            "ddp",
            "--ray",
            ray_cluster,
            "--max-failures",
            "1",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 400
    while not (ws / "checkpoints" / "step_00000008").exists():
        assert process.poll() is None, (tmp_path / "ray.log").read_text()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True).stdout.split()
    assert workers, "no Ray Train worker process found"
    os.kill(int(workers[-1]), signal.SIGKILL)
    killed_at = sorted(p.name for p in (ws / "checkpoints").iterdir())
    assert process.wait(timeout=max(1, deadline - time.time())) == 0, (tmp_path / "ray.log").read_text()[-3000:]

    resumes = [m for m in read_metrics(ws) if m["event"] == "resume"]
    # The replacement worker group continued from a checkpoint Ray Train had committed before the kill.
    assert resumes, f"no resume after killing {workers[-1]} of {workers} at {killed_at}"
    assert resumes[-1]["step"] >= 8
    want = [m["loss"] for m in read_metrics(reference) if m["event"] == "train"]
    got = [m["loss"] for m in read_metrics(ws) if m["event"] == "train"]
    assert len(got) == len(want) == 16
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert (ws / "model" / "model.safetensors").exists()
    # The user sees rank 0's lines as a run on one machine prints them, and none of Ray's own.
    shown = (tmp_path / "ray.log").read_text()
    assert "\nstep 16/16  loss" in shown and "\nresumed from " in shown and "\nexported the best" in shown
    assert "\nwarning: Ray: A worker died or was killed" in shown  # Ray's notice, in a line
    for ray_own in ("TrainController", "PlacementGroupCleaner", "RayTrainWorker", "(raylet)", "Traceback"):
        assert ray_own not in shown, shown[-3000:]


def test_tokenizing_on_ray_gives_the_token_stream_of_one_machine(tmp_path, ray_cluster):
    """Ray Data tasks, one per input file, each writing that file's shards: listed in file order, the same
    tokens as a preparation on one machine, shard by shard within each file."""
    from conftest import write_word_corpus
    from pretrain.config import TrainConfig
    from pretrain.prepare import DataOptions, PretrainingSources, prepare_data

    corpus = write_word_corpus(tmp_path / "corpus", files=3, documents=50)
    metas, streams = {}, {}
    for name, on_ray in (("local", None), ("ray", ray_cluster)):
        ws = Workspace(tmp_path / name)
        cfg = TrainConfig(seq_len=16, vocab_size=320)
        metas[name] = prepare_data(
            ws, PretrainingSources((corpus,), None), cfg, DataOptions(shard_tokens=2_000, ray=on_ray)
        )
        streams[name] = {
            split: np.concatenate([np.fromfile(ws.data_dir / s["file"], dtype="uint16") for s in shards])
            for split, shards in metas[name]["shards"].items()
        }
    for split in ("train", "val"):
        np.testing.assert_array_equal(streams["ray"][split], streams["local"][split])
    files = [s["file"] for s in metas["ray"]["shards"]["train"]]
    assert files == sorted(files) and {f[6:11] for f in files} == {"00000", "00001", "00002"}  # shards of each file
    assert metas["ray"]["documents"] == metas["local"]["documents"]
