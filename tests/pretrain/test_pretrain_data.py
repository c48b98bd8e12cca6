"""The pretraining corpus at scale, in miniature: a seeded tokenizer sample drawn across the corpus, token
shards written by worker processes (the same whatever their number), validation by held-out documents,
training windows read across shards. Killing and carrying on a preparation: tests/workflows/test_kill_points.py."""

import json

import numpy as np
import pytest

from common.heldout import is_held_out
from common.workspace import Workspace
from conftest import COMMON_WORDS, RARE_WORDS, write_word_corpus
from pretrain.config import TrainConfig
from pretrain.data import TokenWindows
from pretrain.prepare import BYTES_PER_WORKER, DataOptions, PretrainingSources, prepare_data
from pretrain.tokenizer import load_tokenizer


def prepare(tmp_path, name, corpus, vocab_size=320, **options):
    ws = Workspace(tmp_path / name)
    cfg = TrainConfig(seq_len=16, vocab_size=vocab_size)
    meta = prepare_data(ws, PretrainingSources((corpus,), None), cfg, DataOptions(**options))
    return ws, meta


def shard_bytes(ws):
    return {p.name: p.read_bytes() for p in sorted(ws.data_dir.glob("*.bin"))}


def test_a_small_corpus_is_tokenized_in_the_commands_process_unless_workers_are_asked_for(monkeypatch):
    """By default one tokenizing process per core, but none started for less text than BYTES_PER_WORKER each
    (starting one costs more than it saves there); --tokenize-workers is taken as given."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    default = DataOptions()
    assert default.worker_count(0) == default.worker_count(BYTES_PER_WORKER - 1) == 1
    assert default.worker_count(3 * BYTES_PER_WORKER) == 3 and default.worker_count(100 * BYTES_PER_WORKER) == 8
    assert DataOptions(workers=2).worker_count(0) == 2


def test_shards_are_the_same_whatever_the_number_of_workers_and_validation_is_the_held_out_documents(tmp_path):
    corpus = write_word_corpus(tmp_path / "corpus")
    one, meta = prepare(tmp_path, "one", corpus, shard_tokens=3_000, workers=1)
    two, _ = prepare(tmp_path, "two", corpus, shard_tokens=3_000, workers=2)
    assert shard_bytes(one) == shard_bytes(two)
    assert len(meta["shards"]["train"]) > 3

    eot = load_tokenizer(one.tokenizer_dir).token_to_id("<|endoftext|>")
    ids = [json.loads(line)["id"] for f in sorted(corpus.iterdir()) for line in f.read_text().splitlines()]
    held_out = sum(is_held_out(i) for i in ids)
    assert 0 < held_out and meta["documents"] == {"train": len(ids) - held_out, "val": held_out}
    for split in ("train", "val"):
        for shard in meta["shards"][split]:
            tokens = np.fromfile(one.data_dir / shard["file"], dtype=meta["dtype"])
            assert len(tokens) == shard["tokens"] and tokens[-1] == eot  # a shard ends where a document ends
            assert (tokens == eot).sum() == shard["documents"]
        assert sum(s["tokens"] for s in meta["shards"][split]) == meta[f"{split}_tokens"]
    assert all(s["tokens"] >= 3_000 for s in meta["shards"]["train"][:-1])  # closed at the first end past 3,000
    manifest = json.loads((one.root / "manifest.json").read_text())["tokenizer"]
    assert manifest["documents"] == len(ids) and manifest["shards"] == {"train": len(meta["shards"]["train"]), "val": 1}
    assert not (one.root / ".data-preparing").exists()


def test_the_tokenizer_is_trained_on_a_seeded_sample_drawn_across_the_whole_corpus(tmp_path):
    corpus = write_word_corpus(tmp_path / "corpus", files=5, documents=100)
    corpus_mb = sum(f.stat().st_size for f in corpus.iterdir()) / 1e6
    ws, meta = prepare(tmp_path, "sampled", corpus, 512, tokenizer_sample_mb=corpus_mb / 5, seed=3)
    sample = meta["tokenizer_sample"]
    assert sample["documents"] == 500 and 60 <= sample["sample_documents"] <= 140  # about a fifth
    assert "of 500 documents" in sample["sample"]
    # The rare words live only in the last file, yet the sample saw them: each is one or two tokens.
    tokenizer = load_tokenizer(ws.tokenizer_dir)
    assert all(len(tokenizer.encode(" " + word).ids) <= 2 for word in RARE_WORDS)
    again, meta_again = prepare(tmp_path, "again", corpus, 512, tokenizer_sample_mb=corpus_mb / 5, seed=3)
    assert meta_again["tokenizer_sample"] == sample and shard_bytes(again) == shard_bytes(ws)
    _, other_seed = prepare(tmp_path, "other", corpus, tokenizer_sample_mb=corpus_mb / 5, seed=4)
    assert other_seed["tokenizer_sample"]["sample_bytes"] != sample["sample_bytes"]
    _, whole = prepare(tmp_path, "whole", corpus, tokenizer_sample_mb=corpus_mb * 2)
    assert whole["tokenizer_sample"]["sample_documents"] == 500 and whole["tokenizer_sample"]["sample"].startswith(
        "all"
    )


def test_a_corpus_with_too_few_held_out_documents_validates_on_its_last_tokens(tmp_path):
    corpus = tmp_path / "few"
    corpus.mkdir()
    ids = [f"d{i}" for i in range(200) if not is_held_out(f"d{i}")][:3]  # none of them held out
    for doc_id in ids:
        (corpus / f"{doc_id}.txt").write_text(" ".join(COMMON_WORDS * 20))
    ws = Workspace(tmp_path / "ws")
    meta = prepare_data(ws, PretrainingSources((corpus,), None), TrainConfig(seq_len=16, vocab_size=320), DataOptions())
    assert meta["documents"]["val"] == 0 and meta["val_tokens"] >= 17 and "last" in meta["validation"]
    assert TokenWindows.open(ws.data_dir, "val", 16).batch([0])[0].shape == (1, 16)


def test_windows_are_numbered_across_shards_and_never_span_two(tmp_path):
    shards = [
        np.arange(0, 35, dtype=np.uint16),
        np.arange(100, 110, dtype=np.uint16),
        np.arange(200, 222, dtype=np.uint16),
    ]
    windows = TokenWindows(shards, seq_len=10)
    assert len(windows) == 3 + 0 + 2  # (35 - 1) // 10, (10 - 1) // 10, (22 - 1) // 10
    assert windows.window(2).tolist() == list(range(20, 31))
    assert windows.window(3).tolist() == list(range(200, 211)) and windows.window(4).tolist() == list(range(210, 221))
    # Data prepared before shards (one train.bin) is read as one shard.
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "train.bin")
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint16", "train_tokens": 50, "vocab_size": 300}))
    legacy = TokenWindows.open(tmp_path, "train", 10)
    assert len(legacy) == 4 and legacy.window(3).tolist() == list(range(30, 41))


@pytest.mark.parametrize("rows", [5, 23])
def test_structured_files_are_read_in_slices(tmp_path, monkeypatch, rows):
    import duckdb

    import common.readers as readers

    monkeypatch.setattr(readers, "DUCKDB_ROWS", 4)
    path = tmp_path / "docs.parquet"
    duckdb.sql(f"SELECT 'id-' || i AS id, 'text ' || i AS text FROM range({rows}) t(i)").write_parquet(str(path))
    documents = list(readers.read_documents([path]))
    assert [d.id for d in documents] == [f"id-{i}" for i in range(rows)]


def test_continued_pretraining_tokenizes_only_the_new_files_into_new_shards(tmp_path):
    from conftest import TINY_TRAINING, read_metrics, run_cli

    corpus = write_word_corpus(tmp_path / "corpus", files=2, documents=80)
    ws = tmp_path / "ws"
    args = ["--shard-tokens", "4000"]
    run_cli("pretrain", "-w", str(ws), "--data", str(corpus), *TINY_TRAINING, *args, "--max-steps", "4", "--no-adapt")
    before = shard_bytes(Workspace(ws))
    meta_before = json.loads((ws / "data" / "meta.json").read_text())

    write_word_corpus(tmp_path / "more", files=1, documents=80, seed=9).joinpath("part-0.jsonl").rename(
        corpus / "new.jsonl"
    )
    result = run_cli("pretrain", "-w", str(ws), "--data", str(corpus), "--resume", "--no-adapt", *args)
    meta = json.loads((ws / "data" / "meta.json").read_text())
    after = shard_bytes(Workspace(ws))
    assert {name: after[name] for name in before} == before  # the old shards untouched
    new_shards = sorted(set(after) - set(before))
    assert new_shards and all(int(name[-9:-4]) >= len(meta_before["shards"][name[:-10]]) for name in new_shards)
    assert (
        meta["documents"]["train"] + meta["documents"]["val"] == 240
        and meta["train_tokens"] > meta_before["train_tokens"]
    )
    more = -(-(meta["train_tokens"] - meta_before["train_tokens"]) // (8 * 32))  # steps of 8 x 32 tokens
    assert f"training {more:,} more steps (4 -> {4 + more:,})" in result.stderr
    assert [m["step"] for m in read_metrics(ws) if m["event"] == "resume"] == [4]
    assert json.loads((ws / "manifest.json").read_text())["model"]["steps"] == 4 + more
    again = run_cli("pretrain", "-w", str(ws), "--data", str(corpus), "--resume", "--no-adapt", *args)
    assert "no new documents" in again.stderr and shard_bytes(Workspace(ws)) == after


def test_pretraining_data_with_an_id_in_two_files_is_refused_in_one_line_naming_both(tmp_path):
    from conftest import run_cli

    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text(
        "".join(json.dumps({"_id": str(i), "text": f"text {i} " * 20}) + "\n" for i in range(30))
    )
    (data / "b.jsonl").write_text(json.dumps({"_id": "7", "text": "another document with the same id"}) + "\n")
    ws = tmp_path / "ws"
    result = run_cli("pretrain", "-w", str(ws), "--data", str(data), "--max-steps", "1", "--no-adapt", check=False)
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "duplicate document id '7'" in error, result.stderr
    assert "b.jsonl:1" in error and "a.jsonl:8" in error and "Traceback" not in result.stderr
    assert not ws.exists()  # nothing left behind
