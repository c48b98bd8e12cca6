"""Shared fixtures: small slices of SciFact and one tiny trained workspace reused across tests."""

from __future__ import annotations

import os

# One compute thread per process (torch, FAISS, and the processes tests start inherit it). The test models
# are too small to gain from a second thread, and on a busy 2-core machine a pool of two waits at every
# operation for the thread the other job has preempted: a 40-step tune took 65 s with two threads, 5 s
# with one. Set before numpy, torch or FAISS is imported: they read it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray's usage statistics: one actor more on every cluster the suite starts, reporting to a server it cannot reach.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import fcntl
import json
import logging
import random
import shutil
import subprocess
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"

# A model small enough to train in seconds; the shapes are still GPT-2's.
TINY_TRAINING = [
    "--preset",
    "tiny",
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--n-embd",
    "32",
    "--seq-len",
    "32",
    "--batch-size",
    "8",
    "--vocab-size",
    "400",
    "--eval-every",
    "10",
    "--log-every",
    "1",
    "--no-adapt",
]


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `pipeline ARGS` in this process, as the installed command would run it, and return its exit
    status and output as a finished process would.

    A separate process pays 5-10 s of imports (torch, sentence-transformers, FAISS) per command; this
    pays them once per test session. Each run is isolated: it starts in the repository (a subprocess's
    working directory), and the environment, warning filters, logging setup, torch's thread count and
    the random generators are put back as they were afterwards. Tests whose point is a separate process
    (a kill, a server, torchrun or Ray workers) use run_cli_process."""
    from typer.testing import CliRunner

    from cli import app

    with isolated_run():
        result = CliRunner().invoke(app, list(args), prog_name="pipeline")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # An unexpected exception: what the process would have printed before exiting with status 1.
        stderr += "".join(traceback.format_exception(*result.exc_info))
    done = subprocess.CompletedProcess(["pipeline", *args], result.exit_code, result.stdout, stderr)
    if check and done.returncode != 0:
        raise AssertionError(f"pipeline {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


@contextmanager
def isolated_run():
    """Undo what a command may change in the process that runs it, so that one run cannot affect the next."""
    import faiss
    import torch

    cwd, environ = os.getcwd(), dict(os.environ)
    threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    rng = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    root = logging.getLogger()
    logging_setup = root.level, list(root.handlers)
    os.chdir(REPO)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(faiss_threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.random.set_rng_state(rng[2])
        root.setLevel(logging_setup[0])
        root.handlers[:] = logging_setup[1]


def run_cli_process(*args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `pipeline ARGS` in a separate process: for tests where the process itself is the point."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "cli.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"pipeline {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def scifact_lines(n: int, start: int = 0, file: str = "corpus.jsonl") -> list[str]:
    """Lines start ... start + n - 1 of a SciFact file (the shared BEIR data beside the repository)."""
    return (SCIFACT / file).read_text().splitlines()[start : start + n]


def scifact_rows(n: int, start: int = 0) -> list[dict]:
    """SciFact documents start ... start + n - 1, as {"_id", "title", "text"}."""
    return [json.loads(line) for line in scifact_lines(n, start)]


def scifact_queries(n: int | None = None) -> list[str]:
    """The texts of SciFact's first n queries (all of them without n)."""
    return [json.loads(line)["text"] for line in scifact_lines(n if n is not None else 10**9, 0, "queries.jsonl")]


def scifact_slice(path: Path, n: int, start: int = 0) -> Path:
    """SciFact documents start ... start + n - 1 written to `path` (JSON lines)."""
    path.write_text("\n".join(scifact_lines(n, start)) + "\n")
    return path


def built_once(tmp_path_factory, worker_id: str, name: str, build: Callable[[Path], None]) -> Path:
    """The directory `name`, made by `build(directory)` once for the whole test session: by the first pytest-xdist
    process that asks for it, in the temporary directory they share, while any other that asks waits for it
    (pytest-xdist's recipe for session data, with a lock file). The suite's first minutes differ in each process
    (one starts with the torchrun jobs, which need no workspace), so the second usually finds it made."""
    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # under xdist: basetemp/popen-gwN, its parent the session's
        root = root.parent
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            build(directory)
            done.touch()
    return directory


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory, worker_id) -> Path:
    if not SCIFACT.exists():
        pytest.skip(f"{SCIFACT} not found (the shared SciFact data sits beside the repository)")

    def write(directory: Path) -> None:
        path = scifact_slice(directory / "corpus.jsonl", 120)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**row, **corpus_metadata(i)}) + "\n" for i, row in enumerate(rows)))

    return built_once(tmp_path_factory, worker_id, "data", write) / "corpus.jsonl"


JOURNALS = ("Nature", "Cell", "Science", "Lancet")


def corpus_metadata(i: int) -> dict:
    """The fields a user's documents carry beside their text, for the i-th document of the corpus slice:
    `year` is 1900 + i, so `year < 1900 + n` keeps exactly the first n documents."""
    return {
        "year": 1900 + i,
        "journal": JOURNALS[i % len(JOURNALS)],
        "open_access": i % 2 == 0,
        "published": f"{1900 + i}-0{1 + i % 9}-15",
        "tags": ["even" if i % 2 == 0 else "odd", f"group-{i % 3}"],
    }


@pytest.fixture(scope="session")
def trained_workspace(tmp_path_factory, worker_id, corpus_file) -> Path:
    """pretrain -> embed -> index on the SciFact slice, through the CLI, once for the session (built_once). Tests
    must not modify it. Its pretraining is also the uninterrupted run a killed and resumed one is compared with
    (test_pretrain)."""

    def build(ws: Path) -> None:
        run_cli("pretrain", "-w", str(ws), "--data", str(corpus_file), *TINY_TRAINING, "--max-steps", "20")
        run_cli("embed", "-w", str(ws), "--chunk-tokens", "64", "--overlap", "8")
        run_cli("index", "-w", str(ws))

    return built_once(tmp_path_factory, worker_id, "trained-workspace", build)


@pytest.fixture(scope="session")
def static_workspace(tmp_path_factory, worker_id, trained_workspace) -> Path:
    """trained_workspace embedded anew with a static embedder (random vectors of 16 dimensions, its tokenizer)
    and indexed, once for the session: for the tests of servers and writes, whose processes then start without
    importing sentence-transformers (seconds each; a served transformer is test_serve.py's `server`). Tests
    must not modify it."""

    def build(directory: Path) -> None:
        ws = directory / "ws"
        shutil.copytree(trained_workspace, ws)
        model = save_static_model(trained_workspace, directory / "static-model")
        run_cli("embed", "-w", str(ws), "--model", str(model), "--chunk-tokens", "64", "--overlap", "8")  # as trained
        run_cli("index", "-w", str(ws))

    return built_once(tmp_path_factory, worker_id, "static-workspace", build) / "ws"


@pytest.fixture(scope="session")
def static_model(static_workspace) -> Path:
    """static_workspace's embedder (save_static_model): 16 dimensions over the trained workspace's tokenizer, for
    the tests that need an embedder but not a transformer's vectors."""
    return static_workspace.parent / "static-model"


ONE_AT_A_TIME = "one_at_a_time"  # the xdist group of the tests that must not run beside each other


def pytest_itemcollected(item) -> None:
    """The tests that start many processes each (a Ray cluster's, torchrun's workers) go to one pytest-xdist
    process, where they run one at a time beside the others' single-process tests (scripts/test.sh: --dist
    loadgroup), so each module's fixtures (a Ray cluster, the torchrun jobs) are made once. Marked as each test
    is collected, before any plugin's pytest_collection_modifyitems: pytest-xdist reads the group into the
    test's id in its own (tests/workflows/test_layout.py checks that the grouping holds)."""
    if item.get_closest_marker("ray") or item.get_closest_marker("multiprocess"):
        item.add_marker(pytest.mark.xdist_group(ONE_AT_A_TIME))


def pytest_collection_modifyitems(items) -> None:
    """The Ray tests last (a stable sort: otherwise in the order collected), so the suite's Ray cluster, which
    takes CPU time while idle, is started after the group's other tests rather than beside them."""
    items.sort(key=lambda item: item.get_closest_marker("ray") is not None)


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """One Ray cluster for every Ray test (starting one costs seconds): a head and one more node, one CPU each,
    on this machine (ray.cluster_utils.Cluster), this process connected to it; its address, for `--ray`."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from ray.cluster_utils import Cluster

    from common.ray_cluster import connect

    # No dashboard: no test reads it, and it is several more processes on each node. Two nodes: a third added only
    # its agents' and idle workers' CPU time (benchmarks/results/2026-11-29-test-suite-cpu.md).
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1, include_dashboard=False)
    connect(nodes.address)
    yield nodes.address
    ray.shutdown()
    nodes.shutdown()


def read_metrics(ws: Path) -> list[dict]:
    return [json.loads(line) for line in (ws / "metrics.jsonl").read_text().splitlines() if line]


def board_events(directory: Path):
    """A run's TensorBoard event files, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return events


def board(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run: tag -> [(step, value)]."""
    events = board_events(directory)
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def board_tensor(events, tag: str) -> bytes:
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(events.Tensors(tag)[-1].tensor_proto).item()


def board_texts(directory: Path) -> dict[str, str]:
    """The text tab: tag -> its latest text."""
    events = board_events(directory)
    tags = [tag for tag in events.Tags()["tensors"] if tag.endswith("/text_summary")]
    return {tag.removesuffix("/text_summary"): board_tensor(events, tag).decode() for tag in tags}


def board_charts(directory: Path) -> dict[str, list[str]]:
    """The Custom Scalars tab: chart title -> the tags it draws together."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    layout = layout_pb2.Layout.FromString(board_tensor(board_events(directory), "custom_scalars__config__"))
    return {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}


@pytest.fixture(autouse=True)
def one_compute_thread():
    """Keep torch at the session's thread count across tests: code run in this process may change it
    (measuring the cluster in-process sets one thread count per rank), and the next tests would inherit it."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def ivfpq_with_rescoring(vectors: np.ndarray, ids: np.ndarray, lists: int, directory: Path) -> tuple:
    """An IDMap-wrapped IVF-PQ fast-scan index whose labels are slots, as common/dense/ivf.py builds it, and its
    rescoring rows, written to `directory`/rescore.npy and memory-mapped."""
    import faiss

    from common.dense.reader import read_rescore, rescore_dtype
    from common.vectors import quantize

    ivf = faiss.index_factory(vectors.shape[1], f"IVF{lists},PQ8x4fs", faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    index = faiss.IndexIDMap(ivf)
    index.own_fields = True
    ivf.this.disown()
    ivf.add_with_ids(vectors, np.arange(len(vectors), dtype=np.int64))
    faiss.copy_array_to_vector(ids, index.id_map)
    index.ntotal = len(ids)
    rows = np.empty(len(vectors), rescore_dtype(vectors.shape[1]))
    rows["codes"], rows["scale"] = quantize(vectors)
    np.save(directory / "rescore.npy", rows)
    return index, read_rescore(directory / "rescore.npy", vectors.shape[1])


def assert_corpus_matches_store(corpus, store) -> None:
    """The corpus snapshot (common/snapshot/reader.py) holds what the store holds: every document's fields, text and
    number of chunks, by doc_id, and every chunk's id, document, place in it and text, by chunk id."""
    documents = store.con.execute(
        "SELECT doc_id, title, source, text, metadata FROM documents ORDER BY doc_id"
    ).fetchall()
    chunks = store.con.execute("SELECT chunk_id, doc_id, chunk_index, text FROM chunks ORDER BY chunk_id").fetchall()
    assert corpus.generation == store.generation()
    assert [
        (corpus.doc_id(i), corpus.title(i), corpus.source(i), corpus.text(i), corpus.metadata(i))
        for i in range(corpus.n_documents)
    ] == [(d, t or "", s or "", x or "", json.loads(m) if m else {}) for d, t, s, x, m in documents]
    assert [corpus.position_of(d[0]) for d in documents] == list(range(len(documents)))
    assert corpus.chunk_ids.tolist() == [c[0] for c in chunks]
    assert [
        (corpus.doc_id(doc), starts_mid_text, corpus.chunk_text(i))
        for i, (doc, starts_mid_text) in enumerate(
            zip(corpus.chunk_docs.tolist(), corpus.chunk_starts_mid_text.tolist())
        )
    ] == [(doc_id, index > 0, text or "") for _, doc_id, index, text in chunks]
    per_document = {d[0]: 0 for d in documents}
    for _, doc_id, _, _ in chunks:
        per_document[doc_id] += 1
    assert corpus.document_chunks.tolist() == list(per_document.values())


# ---- helpers several test modules share

COMMON_WORDS = "the a of model data token train loss step rank shard pipeline stage tensor batch gradient".split()
RARE_WORDS = ["zorblax", "quuxvane", "flimbrot", "gravnik"]  # only in the last file


def write_word_corpus(directory, files=4, documents=60, seed=0):
    """JSON-lines files of documents of common words; the last file's documents are mostly four rare words."""
    rng = random.Random(seed)
    directory.mkdir()
    for f in range(files):
        words = RARE_WORDS if f == files - 1 else COMMON_WORDS
        with (directory / f"part-{f}.jsonl").open("w") as out:
            for d in range(documents):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(40, 120)))
                doc_id = f"doc-{f}-{d}" if seed == 0 else f"doc-s{seed}-{f}-{d}"  # ids unique across corpora
                out.write(json.dumps({"id": doc_id, "title": f"Title {f} {d}", "text": text}) + "\n")
    return directory


def save_static_model(trained_workspace: Path, directory: Path, dim: int = 16) -> Path:
    """A static embedder with the workspace's tokenizer (random vectors, the same in every run), saved by
    sentence-transformers."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(trained_workspace / "model" / "tokenizer.json"))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_dim=dim)]).save(str(directory))
    return directory


def sharded_copy(workspace: Path, directory: Path, shards: int):
    """A copy of `workspace` at `directory` whose index is rebuilt flat in `shards` shards (index/shards.py): a
    Workspace."""
    from common.workspace import Workspace
    from index.build import refresh_indexes

    ws = Workspace(directory)
    shutil.copytree(workspace, ws.root)
    refresh_indexes(ws, "flat", shards=shards)
    return ws


def shard_queries_and_filters() -> tuple[list[str], list]:
    """The queries and filters the sharded searches are compared on (a whole index against its shards)."""
    from search.filters import DocumentFilter

    queries = scifact_queries(40) + [
        "cells in tumour growth and immune response",
        "the the of",  # stop words only: nothing to find lexically
    ]
    filters = [None, DocumentFilter.of({"year": {"lt": 1930}}), DocumentFilter.of({"journal": {"eq": "Cell"}})]
    return queries, filters
