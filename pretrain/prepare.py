"""The pretraining corpus, prepared once: a tokenizer trained on a sample, and the documents tokenized into shards.

    pass 1   read the corpus once: count its text (the vocabulary is sized to it, pretrain/sizing.py) and
             draw a seeded sample of about --tokenizer-sample-mb from all of it (each document kept with the
             same chance, wherever it lies), on which the byte-level BPE tokenizer is trained
    pass 2   read it again and tokenize it on every core (--tokenize-workers processes, in order) into shard
             files of about --shard-tokens tokens each (a shard ends at the first document end past that):
             data/train-00000.bin ..., data/val-00000.bin ... (uint16, or uint32 past 65,536 token types;
             each document followed by <|endoftext|>), listed with their counts in data/meta.json. A
             document whose id is held out (common/heldout.py) is a validation document: validation is a
             sample of documents, not the tail of a stream that may be sorted. With --ray, this pass runs
             on the Ray cluster instead, a Ray Data task per input file (tokenize_on_ray).

Memory stays bounded whatever the corpus's size: documents are streamed from the readers, the sample is
bounded, the workers are given a few batches at a time and the shards are appended to disk as they fill.

Everything is prepared in a staging directory inside the workspace (.data-preparing/), with a progress
file written as each training shard is closed: a preparation killed part-way and run again on the same
inputs with the same settings carries on after the last closed shard and ends with the same shards as
an uninterrupted one. Only when all is ready does the staged data replace data/, and the tokenizer and
the manifest follow; a failed preparation leaves the previous workspace as it was.
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from common.console import info
from common.default_corpus import DEFAULT_CORPUS_SOURCE, stdlib_documents
from common.durations import format_eta
from common.errors import PipelineError
from common.manifest import TokenizerEntry, read_manifest, write_section
from common.readers import Document, list_files, read_documents
from common.workspace import Workspace, atomic_write_json, file_sha256, replace_directory
from pretrain.config import TrainConfig
from pretrain.sizing import vocab_for
from pretrain.tokenize_worker import (
    ShardStream,
    batches,
    encode_texts,
    load_worker_tokenizer,
    token_dtype,
    training_text,
)
from pretrain.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

STAGING = ".data-preparing"
FORMAT = 2  # meta.json's layout: shards (format 1, before it, was one train.bin and one val.bin)
BATCHES_PER_WORKER = 2  # batches queued for each worker: enough to keep it busy, few enough to bound memory
# Text a tokenizing process is started for by default: starting one (Python, the tokenizer) costs about as much
# as tokenizing a few MB, so a smaller corpus is tokenized in this process.
BYTES_PER_WORKER = 4_000_000
PROGRESS_SECONDS = 10.0


@dataclass(frozen=True)
class DataOptions:
    """How the corpus is prepared (the flags of `pipeline pretrain` that say it)."""

    tokenizer_sample_mb: float = 256.0
    shard_tokens: int = 100_000_000
    workers: int = 0  # 0: every core the text is large enough for (BYTES_PER_WORKER)
    seed: int = 1337
    ray: str | None = None  # a Ray cluster's address: tokenized there, a Ray Data task per input file

    def worker_count(self, text_bytes: int) -> int:
        """The tokenizing processes for `text_bytes` of text: --tokenize-workers as given; by default one per
        core, but none past one per BYTES_PER_WORKER."""
        if self.workers:
            return self.workers
        return max(1, min(len(os.sched_getaffinity(0)), text_bytes // BYTES_PER_WORKER))


@dataclass(frozen=True)
class PretrainingSources:
    """The documents pretraining reads: the --data paths, or the built-in corpus when none are given."""

    paths: tuple[Path, ...]
    text_field: str | None
    skipped_files: frozenset[str] = frozenset()  # absolute paths whose documents are not read (already tokenized)

    @property
    def sources(self) -> list[str]:
        return [str(p) for p in self.paths] if self.paths else [DEFAULT_CORPUS_SOURCE]

    def documents(self) -> Iterator[Document]:
        if not self.paths:
            return stdlib_documents()
        documents = read_documents(self.paths, self.text_field, streamed=True)
        return (d for d in documents if d.source not in self.skipped_files) if self.skipped_files else documents

    def files(self) -> list[tuple[str, int, int]]:
        """(path, size, modification time) of every input file: what a staged preparation was made from."""
        return [(os.path.abspath(f), f.stat().st_size, f.stat().st_mtime_ns) for f, _ in list_files(self.paths)]


# ---------------------------------------------------------------- the whole preparation


def prepare_data(ws: Workspace, corpus: PretrainingSources, cfg: TrainConfig, options: DataOptions) -> dict:
    """Train the tokenizer and write the token shards; returns data/meta.json's contents. cfg.vocab_size 0
    sizes the vocabulary to the corpus (and sets it). A staged preparation of the same inputs and settings
    is carried on; nothing in the workspace changes until everything is ready."""
    staging = ws.root / STAGING
    new_workspace = not ws.root.exists()
    try:
        meta = stage_data(corpus, staging, cfg, options)
    except PipelineError:  # the input is at fault: nothing to carry on next time, and nothing left behind
        shutil.rmtree(staging, ignore_errors=True)
        if new_workspace:
            shutil.rmtree(ws.root, ignore_errors=True)
        raise

    # Everything is checked: from here on this is a new run. The previous run's checkpoints go first, so
    # that a `--resume` after a crash mid-way can never continue them on the new tokens.
    ws.create()
    shutil.rmtree(ws.checkpoints_dir, ignore_errors=True)
    replace_directory(staging / "data", ws.data_dir)
    replace_directory(staging / "tokenizer", ws.tokenizer_dir)
    shutil.rmtree(staging, ignore_errors=True)
    info(
        f"tokenized: {meta['train_tokens']:,} training tokens in {len(meta['shards']['train'])} shards, "
        f"{meta['val_tokens']:,} validation tokens ({meta['validation']})"
    )
    write_section(
        ws,
        TokenizerEntry(
            path="tokenizer",
            sha256=file_sha256(ws.tokenizer_dir / "tokenizer.json"),
            vocab_size=meta["vocab_size"],
            sources=corpus.sources,
            documents=meta["documents"]["train"] + meta["documents"]["val"],
            report={key: value for key, value in meta.items() if key not in ("vocab_size", "shards", "documents")}
            | {"shards": {split: len(entries) for split, entries in meta["shards"].items()}},
        ),
    )
    return meta


def stage_data(corpus: PretrainingSources, staging: Path, cfg: TrainConfig, options: DataOptions) -> dict:
    """The tokenizer and the shards in `staging`, carried on from where a run of the same key stopped."""
    files = corpus.files()
    key = {
        "sources": corpus.sources,
        "files": [list(f) for f in files],
        "text_field": corpus.text_field,
        "vocab_size": cfg.vocab_size,
        "tokenizer_sample_mb": options.tokenizer_sample_mb,
        "shard_tokens": options.shard_tokens,
        "seed": options.seed,
        "val_percent": val_percent(cfg),
        "on_ray": options.ray is not None,  # shards per input file
    }
    progress = staged_progress(staging, key)
    if progress is None:
        if not corpus.paths:
            info("no --data given: training on the built-in corpus of Python standard library docstrings")
        corpus_bytes = sum(size for _, size, _ in files)
        sample, read = sample_corpus(corpus, options.tokenizer_sample_mb * 1e6, corpus_bytes, options.seed)
        vocab_size = cfg.vocab_size or vocab_for(read["characters"])  # sized to the corpus (pretrain/sizing.py)
        info(
            f"training a {vocab_size:,}-token byte-level BPE tokenizer on {read['sample']}"
            + ("" if read["sample_documents"] == read["documents"] else " (drawn across the corpus)")
        )
        started = time.monotonic()
        tokenizer = train_tokenizer(sample, vocab_size)
        del sample
        save_tokenizer(tokenizer, staging / "tokenizer")
        info(f"tokenizer trained in {format_eta(time.monotonic() - started)}")
        progress = {"key": key, "read": read, "documents_done": 0, "bytes_done": 0, "streams": None}
        atomic_write_json(staging / "progress.json", progress)
    else:
        info(f"carrying on the preparation staged in {staging} ({progress['documents_done']:,} documents done)")
    if not cfg.vocab_size:
        cfg.vocab_size = load_tokenizer(staging / "tokenizer").get_vocab_size()
    if options.ray is not None:
        meta = tokenize_on_ray(corpus, staging, progress, options.ray, options.shard_tokens)
    else:
        meta = tokenize_to_shards(corpus, staging, progress, options)
    meta.update(validation_split(staging / "data", meta, cfg))
    meta["tokenizer_sample"] = progress["read"]
    meta["inputs"] = key["files"]
    meta["val_percent"] = key["val_percent"]
    atomic_write_json(staging / "data" / "meta.json", meta)
    return meta


def append_data(ws: Workspace, corpus: PretrainingSources, options: DataOptions) -> int:
    """Continued pretraining: tokenize the documents of input files not tokenized before (by path, size
    and modification time) with the workspace's tokenizer into new shards after the existing ones, which
    stay as they are; returns the training tokens added. Staged and carried on after a kill as a first
    preparation is; data/meta.json, rewritten last, is the commit point."""
    meta = json.loads((ws.data_dir / "meta.json").read_text())
    if "shards" not in meta:
        raise PipelineError(
            f"{ws.data_dir}: prepared before token shards; run `pipeline pretrain --data ...` without --resume"
        )
    done = {tuple(f) for f in meta.get("inputs", [])}
    files = corpus.files()
    new_files = [f for f in files if tuple(f) not in done]
    if not new_files:
        info("no new documents: every input file was tokenized before")
        return 0
    corpus = PretrainingSources(corpus.paths, corpus.text_field, frozenset(f[0] for f in files if tuple(f) in done))
    staging = ws.root / STAGING
    key = {
        "append_to": [meta["train_tokens"], meta["val_tokens"]],
        "files": [list(f) for f in files],
        "text_field": corpus.text_field,
        "shard_tokens": options.shard_tokens,
        "val_percent": meta.get("val_percent", 5),
    }
    progress = staged_progress(staging, key)
    if progress is None:
        shutil.copytree(ws.tokenizer_dir, staging / "tokenizer")
        progress = {
            "key": key,
            "read": {"text_bytes": sum(size for _, size, _ in new_files)},  # about: the files' size
            "first_shard": {split: len(entries) for split, entries in meta["shards"].items()},
            "documents_done": 0,
            "bytes_done": 0,
            "streams": None,
        }
        atomic_write_json(staging / "progress.json", progress)
    info(f"tokenizing the documents of {len(new_files)} new input file(s) with the workspace's tokenizer")
    added = tokenize_to_shards(corpus, staging, progress, options)
    for split, entries in added["shards"].items():
        for entry in entries:
            if (staging / "data" / entry["file"]).exists():  # else moved by a run killed before the commit
                os.replace(staging / "data" / entry["file"], ws.data_dir / entry["file"])
        meta["shards"][split] += entries
        meta[f"{split}_tokens"] += added[f"{split}_tokens"]
        meta["documents"][split] += added["documents"][split]
    meta["inputs"] = sorted([list(f) for f in done | {tuple(f) for f in new_files}])
    atomic_write_json(ws.data_dir / "meta.json", meta)
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = read_manifest(ws).tokenizer
    write_section(
        ws,
        TokenizerEntry(
            path=tokenizer.path,
            sha256=tokenizer.sha256,
            vocab_size=tokenizer.vocab_size,
            sources=tokenizer.sources + [s for s in corpus.sources if s not in tokenizer.sources],
            documents=tokenizer.documents + added["documents"]["train"] + added["documents"]["val"],
            report=tokenizer.report
            | {
                "train_tokens": meta["train_tokens"],
                "val_tokens": meta["val_tokens"],
                "shards": {split: len(entries) for split, entries in meta["shards"].items()},
            },
        ),
    )
    info(
        f"added {added['train_tokens']:,} training and {added['val_tokens']:,} validation tokens "
        f"({added['documents']['train'] + added['documents']['val']:,} documents) in new shards"
    )
    return added["train_tokens"]


def staged_progress(staging: Path, key: dict) -> dict | None:
    """The progress of a preparation staged for the same key, to carry on; else None, and the staging
    directory emptied for a new one (with its data/ folder)."""
    progress_file = staging / "progress.json"
    if progress_file.exists():
        progress = json.loads(progress_file.read_text())
        if progress["key"] == key:
            return progress
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "data").mkdir(parents=True)
    return None


def val_percent(cfg: TrainConfig) -> int:
    return max(1, round(cfg.val_fraction * 100))


# ---------------------------------------------------------------- pass 1: the tokenizer's sample


def sample_corpus(
    corpus: PretrainingSources, sample_bytes: float, corpus_bytes: int, seed: int
) -> tuple[list[str], dict]:
    """The training texts of a seeded sample of about `sample_bytes` (every document with the same chance:
    sample_bytes over the input files' size, all of them for a smaller corpus), and what was read."""
    rate = min(1.0, sample_bytes / max(1, corpus_bytes))
    rng = random.Random(seed)
    sample: list[str] = []
    documents = characters = text_bytes = sampled_bytes = 0
    meter = ProgressMeter("read", corpus_bytes, approximate=True)
    for doc in corpus.documents():
        text = training_text(doc)
        size = len(text.encode("utf-8"))
        documents += 1
        characters += len(text)
        text_bytes += size
        if rate == 1.0 or rng.random() < rate:
            sample.append(text)
            sampled_bytes += size
        meter.advance(size)
    if not documents:
        raise PipelineError(f"no documents with text in {', '.join(corpus.sources)}")
    described = (
        f"all {documents:,} documents ({sampled_bytes / 1e6:,.1f} MB)"
        if len(sample) == documents
        else f"{len(sample):,} of {documents:,} documents ({sampled_bytes / 1e6:,.1f} of {text_bytes / 1e6:,.1f} MB)"
    )
    read = {
        "documents": documents,
        "characters": characters,
        "text_bytes": text_bytes,
        "sample_documents": len(sample),
        "sample_bytes": sampled_bytes,
        "sample": described,
        "seed": seed,
    }
    return sample, read


# ---------------------------------------------------------------- pass 2: tokenized on every core into shards


def tokenize_to_shards(corpus: PretrainingSources, staging: Path, progress: dict, options: DataOptions) -> dict:
    """Tokenize every document into the staged shards, carrying on from `progress` (written to
    staging/progress.json as each training shard closes), in options.worker_count processes; returns the
    shards' counts."""
    shard_tokens = options.shard_tokens
    tokenizer_path = staging / "tokenizer" / "tokenizer.json"
    vocab_size = load_tokenizer(staging / "tokenizer").get_vocab_size()
    dtype = token_dtype(vocab_size)
    first = progress.get("first_shard", {})
    streams = {
        split: ShardStream(
            staging / "data", split, dtype, shard_tokens, (progress["streams"] or {}).get(split), first.get(split, 0)
        )
        for split in ("train", "val")
    }
    held_out = progress["key"]["val_percent"]
    done, done_bytes = progress["documents_done"], progress["bytes_done"]
    total_bytes = progress["read"]["text_bytes"]
    meter = ProgressMeter("tokenized", total_bytes, start=done_bytes, tokens=True)

    def save_progress() -> None:
        for stream in streams.values():
            stream.sync()
        progress.update(documents_done=done, bytes_done=done_bytes, streams={s: v.state() for s, v in streams.items()})
        atomic_write_json(staging / "progress.json", progress)

    documents = corpus.documents()
    for _ in range(done):  # what the last run finished: read again, not tokenized again
        next(documents)
    with Encoders(tokenizer_path, options.worker_count(total_bytes)) as encoders:
        for result in encoders.encode_in_order(batches(documents, held_out)):
            tokens, lengths, splits, sizes = result
            for piece, split, size in zip(np.split(tokens, np.cumsum(lengths)[:-1]), splits, sizes):
                closed = streams[split].append(piece)
                done, done_bytes = done + 1, done_bytes + size
                meter.advance(size, len(piece))
                if closed and split == "train":
                    save_progress()
    return shard_counts({split: stream.finish() for split, stream in streams.items()}, vocab_size, shard_tokens)


def tokenize_on_ray(corpus: PretrainingSources, staging: Path, progress: dict, address: str, shard_tokens: int) -> dict:
    """Pass 2 on a Ray cluster: a Ray Data task per input file (pretrain/tokenize_worker.py tokenize_file)
    writes that file's shards into the staging directory, which every node must see (the workspace on shared
    storage, as Ray Train needs it too); the shards are listed in input-file order whatever order the tasks
    ran in, so training reads the same token stream as after a preparation on one machine."""
    import logging

    from common.ray_cluster import connect, notices_on_stderr
    from pretrain.tokenize_worker import tokenize_file

    if not corpus.paths:
        raise PipelineError("--ray tokenizes input files on the cluster: give them with --data")
    ray = connect(address)
    ray.data.DataContext.get_current().enable_progress_bars = False  # ours report the progress
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    vocab_size = load_tokenizer(staging / "tokenizer").get_vocab_size()
    tasks = [
        {
            "index": i,
            "path": os.path.abspath(path),
            "name": name,
            "text_field": corpus.text_field,
            "tokenizer": str((staging / "tokenizer" / "tokenizer.json").resolve()),
            "directory": str((staging / "data").resolve()),
            "shard_tokens": shard_tokens,
            "val_percent": progress["key"]["val_percent"],
        }
        for i, (path, name) in enumerate(list_files(corpus.paths))
    ]
    info(f"tokenizing {len(tasks)} input file(s) on the Ray cluster, a task each")
    meter = ProgressMeter("tokenized", progress["read"]["text_bytes"])
    dataset = ray.data.from_items(tasks, override_num_blocks=len(tasks)).map(tokenize_file, num_cpus=1)
    results = []
    with notices_on_stderr():
        for row in dataset.iter_rows():
            results.append(row)
            meter.advance(row["text_bytes"])
    per_file = [json.loads(row["shards"]) for row in sorted(results, key=lambda row: row["index"])]
    shards = {split: [shard for each in per_file for shard in each[split]] for split in ("train", "val")}
    return shard_counts(shards, vocab_size, shard_tokens)


def shard_counts(shards: dict[str, list[dict]], vocab_size: int, shard_tokens: int) -> dict:
    """data/meta.json's account of the shards."""
    return {
        "format": FORMAT,
        "dtype": token_dtype(vocab_size).name,
        "vocab_size": vocab_size,
        "shard_tokens": shard_tokens,
        "shards": shards,
        "train_tokens": sum(s["tokens"] for s in shards["train"]),
        "val_tokens": sum(s["tokens"] for s in shards["val"]),
        "documents": {split: sum(s["documents"] for s in entries) for split, entries in shards.items()},
    }


class Encoders:
    """Token ids of batches of texts, encoded in `workers` processes (in this one for a single worker) and
    handed back in the order given, with at most BATCHES_PER_WORKER batches per worker in flight."""

    def __init__(self, tokenizer_path: Path, workers: int):
        self.workers = workers
        self.pool = None
        if workers > 1:
            import multiprocessing

            # spawn: a clean process (no fork of a process whose libraries run threads)
            self.pool = multiprocessing.get_context("spawn").Pool(
                workers, initializer=load_worker_tokenizer, initargs=(str(tokenizer_path),)
            )
        else:
            load_worker_tokenizer(str(tokenizer_path))

    def __enter__(self) -> "Encoders":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()  # finished, or failed: nothing is left to wait for
            self.pool.join()

    def encode_in_order(self, batches_: Iterator[tuple]) -> Iterator[tuple]:
        """(tokens, lengths, splits, sizes) for each batch: all of its documents' tokens in one array."""
        if self.pool is None:
            for texts, splits, sizes in batches_:
                yield (*encode_texts(texts), splits, sizes)
            return
        pending: collections.deque = collections.deque()
        for texts, splits, sizes in batches_:
            pending.append((self.pool.apply_async(encode_texts, (texts,)), splits, sizes))
            if len(pending) >= self.workers * BATCHES_PER_WORKER:
                result, splits_, sizes_ = pending.popleft()
                yield (*result.get(), splits_, sizes_)
        while pending:
            result, splits_, sizes_ = pending.popleft()
            yield (*result.get(), splits_, sizes_)


def validation_split(data_dir: Path, meta: dict, cfg: TrainConfig) -> dict:
    """Check the corpus is large enough, and where the held-out documents give less than one validation
    window (a corpus of few documents), make the last training tokens the validation tokens instead."""
    window = cfg.seq_len + 1
    total = meta["train_tokens"] + meta["val_tokens"]
    if total < 2 * window:
        raise PipelineError(f"corpus too small: {total} tokens, need at least {2 * window} for seq-len {cfg.seq_len}")
    if meta["val_tokens"] >= window:
        return {"validation": f"{meta['documents']['val']:,} held-out documents"}
    need = max(int(total * cfg.val_fraction), window) - meta["val_tokens"]
    train, moved = meta["shards"]["train"], []
    while need > 0:
        last = train[-1]
        take = min(need, last["tokens"])
        path = data_dir / last["file"]
        tokens = np.fromfile(
            path, dtype=meta["dtype"], offset=(last["tokens"] - take) * np.dtype(meta["dtype"]).itemsize
        )
        moved.insert(0, tokens)
        with open(path, "r+b") as f:
            f.truncate((last["tokens"] - take) * tokens.itemsize)
        last["tokens"] -= take
        if not last["tokens"]:
            path.unlink()
            train.pop()
        need -= take
    val = meta["shards"]["val"]
    existing = [np.fromfile(data_dir / s["file"], dtype=meta["dtype"]) for s in val]
    for s in val:
        (data_dir / s["file"]).unlink()
    combined = np.concatenate(existing + moved)
    combined.tofile(data_dir / "val-00000.bin")
    meta["shards"]["val"] = [{"file": "val-00000.bin", "tokens": len(combined), "documents": meta["documents"]["val"]}]
    moved_tokens = sum(map(len, moved))
    meta["train_tokens"] -= moved_tokens
    meta["val_tokens"] = len(combined)
    return {
        "validation": f"{meta['documents']['val']:,} held-out documents gave less than a window of {window} tokens: "
        f"the last {moved_tokens:,} training tokens too"
    }


class ProgressMeter:
    """A line every PROGRESS_SECONDS: how much is done, MB/s and the time left."""

    def __init__(self, verb: str, total_bytes: int, start: int = 0, approximate: bool = False, tokens: bool = False):
        self.verb, self.total, self.done, self.approximate, self.tokens = verb, total_bytes, start, approximate, tokens
        self.started, self.start_bytes, self.last = time.monotonic(), start, time.monotonic()
        self.token_count = 0

    def advance(self, size: int, tokens: int = 0) -> None:
        self.done += size
        self.token_count += tokens
        now = time.monotonic()
        if now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        rate = (self.done - self.start_bytes) / max(now - self.started, 1e-9)
        left = max(0, self.total - self.done) / rate if rate > 0 else math.inf
        share = min(1.0, self.done / max(1, self.total))
        counted = f", {self.token_count:,} tokens" if self.tokens else ""
        about = "about " if self.approximate else ""
        info(
            f"{self.verb} {self.done / 1e6:,.0f} of {about}{self.total / 1e6:,.0f} MB ({share:.0%}){counted}, "
            f"{rate / 1e6:,.1f} MB/s, {about}{format_eta(left)} left"
        )
