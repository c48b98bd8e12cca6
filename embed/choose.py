"""The embedder the adaptation keeps, chosen by measurement: static, or the transformer where the budget allows.

Two embedders can be made from the pretrained GPT-2 (embed/tune.py): the static table of token vectors,
cheap to train and to encode and the better one on a CPU's budget, and the whole transformer with
pooling, where pretraining shows (on SciFact, after 200 CPU steps: 0.088 from the pretrained model, 0.006
from random weights), which needs a GPU's compute. `pipeline pretrain` (and `pipeline tune` at its
default, `--architecture auto`) decides between them on the machine it runs on:

1. the static embedder is tuned: it always fits, and is what is kept if nothing else is;
2. a transformer step is timed here (PROBE_STEPS steps of PROBE_PAIRS pairs, scaled to its batch), and
   the transformer is tuned only if its steps fit the time budget; otherwise the reason is reported;
3. each candidate is measured on held-out corpus pairs (common/heldout.py: documents tuning never saw, a
   sentence or span of one as the query, the rest of it the answer), dense nDCG@10 among all the
   documents (a sample of MEASURE_DOCUMENTS on a large collection), and the transformer becomes tuned/
   only if it is ahead by more than the standard error of the per-pair differences; else the static one.

A transformer that fails to tune (out of GPU memory, say) is reported and the static embedder kept.

The manifest's "tuned" section records the kept embedder and, under "candidates", each one's score,
time, or why it was skipped.
"""

from __future__ import annotations

import math
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from common.console import info
from common.embedder import embedding_text, encode, load_embedder
from common.errors import PipelineError
from common.heldout import held_out_pairs
from common.language import detect_languages
from common.readers import Document
from common.workspace import Workspace, model_fingerprint, replace_directory
from embed.tune import DEFAULT_LR, TUNED_DIR, TuneSettings, document_text, record_tuned, run_tune, transformer_student

TRANSFORMER_BATCH = 256  # pairs per step: the transformer's batch (a static table takes 1,024 cheaply)
TRANSFORMER_MINI_BATCH = 64  # texts per forward pass (CachedMultipleNegativesRankingLoss): bounded memory
PROBE_PAIRS = 64  # pairs a timed step holds: enough that a GPU's step is not all launch overhead
PROBE_STEPS = 3
MEASURE_PAIRS = 300
MEASURE_DOCUMENTS = 20_000


def transformer_settings(static: TuneSettings, pooling: str = "mean") -> TuneSettings:
    """The transformer candidate's settings: the static one's steps and pairs, a transformer's batch and rate."""
    batch = min(static.batch_size, TRANSFORMER_BATCH)
    return replace(
        static,
        architecture="transformer",
        pooling=pooling,
        batch_size=batch,
        lr=None,
        mini_batch=TRANSFORMER_MINI_BATCH if batch > TRANSFORMER_MINI_BATCH else None,
    )


def adapt(
    ws: Workspace, docs: list[Document], budget_seconds: float, static: TuneSettings, transformer_pooling: str = "mean"
) -> dict:
    """Tune the candidates the budget allows, keep the one that finds held-out documents best (module
    docstring), record it in the manifest and return its summary."""
    transformer = transformer_settings(static, transformer_pooling)
    candidates: dict[str, dict] = {}
    skipped = None
    workdir = Path(tempfile.mkdtemp(dir=ws.root, prefix=".adapt."))  # the candidates, until one is kept
    try:
        candidates["static"] = run_tune(ws, docs, static, out_name=f"{workdir.name}/static", record=False)
        try:
            step_seconds = transformer_step_seconds(ws, docs, transformer, budget_seconds)
            estimate = step_seconds * transformer.steps
            if estimate <= budget_seconds:
                info(
                    f"tuning the transformer too: {transformer.steps} steps of {transformer.batch_size} pairs, about "
                    f"{estimate / 60:.1f} min here ({step_seconds:.2f} s a step), "
                    f"within the budget of {budget_seconds / 60:.1f} min"
                )
                candidates["transformer"] = run_tune(
                    ws, docs, transformer, out_name=f"{workdir.name}/transformer", record=False
                )
            else:
                skipped = {
                    "skipped": f"{transformer.steps} steps of {transformer.batch_size} pairs would take about "
                    f"{estimate / 60:.0f} min here ({step_seconds:.2f} s a step, measured), over the budget "
                    f"of {budget_seconds / 60:.1f} min",
                    "step_seconds": step_seconds,
                }
        except (RuntimeError, PipelineError) as e:  # e.g. out of GPU memory: the static embedder stands
            skipped = {"skipped": f"tuning failed: {(str(e).splitlines() or [type(e).__name__])[0]}"}
        if skipped:
            info(f"the transformer embedder is not tuned: {skipped['skipped']}")
        language = detect_languages([d.text for d in docs]).language
        gains = {
            name: held_out_gains(ws.root / summary["path"], docs, language) for name, summary in candidates.items()
        }
        kept = better(gains)
        replace_directory(ws.root / candidates[kept]["path"], ws.root / TUNED_DIR)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        name: {
            "held_out_ndcg@10": float(gains[name].mean()) if len(gains[name]) else None,
            "held_out_pairs": len(gains[name]),
            "seconds": summary["seconds"],
            "steps": summary["steps"],
            "batch_size": summary["batch_size"],
        }
        for name, summary in candidates.items()
    }
    if skipped:
        report["transformer"] = skipped
    summary = {
        **candidates[kept],
        "path": TUNED_DIR,
        "fingerprint": model_fingerprint(ws.root / TUNED_DIR),
        "candidates": report,
    }
    record_tuned(ws, summary)
    measured = ", ".join(f"{name} {report[name]['held_out_ndcg@10'] or 0:.3f}" for name in candidates)
    info(
        f"embedder kept: {kept} (dense nDCG@10 on {len(gains[kept])} held-out corpus pairs: {measured}); "
        "`pipeline embed` now uses it"
    )
    return summary


def better(gains: dict[str, np.ndarray]) -> str:
    """The static embedder, unless the transformer finds the held-out documents better by more than the
    standard error of the per-pair differences (a few hundred pairs: a smaller lead is noise)."""
    if "transformer" not in gains or not len(gains["static"]):
        return "static"
    difference = gains["transformer"] - gains["static"]
    standard_error = difference.std(ddof=1) / math.sqrt(len(difference)) if len(difference) > 1 else 0.0
    return "transformer" if difference.mean() > standard_error else "static"


def transformer_step_seconds(
    ws: Workspace, docs: list[Document], settings: TuneSettings, budget_seconds: float
) -> float:
    """Seconds one training step of the transformer candidate takes on this machine: the median of
    PROBE_STEPS steps of PROBE_PAIRS (anchor, positive, negative) triples after one to warm up, scaled to
    its batch (a step's cost grows with its texts) and by 4/3 for the cached loss's extra forward pass. A
    warm-up step that already puts the steps far over the budget is the answer."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pairs = min(PROBE_PAIRS, settings.batch_size)
    model, _ = transformer_student(ws.model_dir, settings, device, docs)
    texts = [document_text(docs[i % len(docs)], settings.max_chars) for i in range(3 * pairs)]
    features = []
    for part in (texts[0::3], texts[1::3], texts[2::3]):
        features.append({k: v.to(device) if hasattr(v, "to") else v for k, v in model.tokenize(part).items()})
    loss = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr or DEFAULT_LR["transformer"])
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda" and torch.cuda.is_bf16_supported())
    scale = settings.batch_size / pairs * (4 / 3 if settings.mini_batch else 1)
    times = []
    for _ in range(PROBE_STEPS + 1):
        start = time.perf_counter()
        with autocast:
            value = loss(features, None)
        value.backward()
        optimizer.step()
        optimizer.zero_grad()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if len(times) == 1 and times[0] * scale * settings.steps > 10 * budget_seconds:
            return times[0] * scale
    return statistics.median(times[1:]) * scale


def held_out_gains(model_dir: Path, docs: list[Document], language: str, seed: int = 0) -> np.ndarray:
    """Each held-out pair's nDCG@10 (common/heldout.py: one relevant document), dense: its query searched
    among the other documents (up to MEASURE_DOCUMENTS) and the held-out ones shortened by their query. A
    document scored as high as the relevant one counts as ranked above it (a model that scores everything
    alike finds nothing)."""
    rng = random.Random(seed)
    drawn = held_out_pairs([(d.id, d.title, d.text) for d in docs], rng, language, MEASURE_PAIRS)
    pairs = {doc_id: each[0] for doc_id, each in drawn.items()}
    if not pairs:
        return np.zeros(0)
    titles = {d.id: d.title for d in docs}
    others = [d for d in docs if d.id not in pairs]
    others = rng.sample(others, min(len(others), MEASURE_DOCUMENTS - len(pairs)))
    texts = [embedding_text(d.title, d.text) for d in others]
    texts += [
        embedding_text("" if kind == "title" else titles[doc_id], shortened)
        for doc_id, (_, shortened, kind) in pairs.items()
    ]
    model = load_embedder(model_dir)
    documents = encode(model, texts)
    queries = encode(model, [query for query, _, _ in pairs.values()])
    scores = queries @ documents.T
    own = scores[np.arange(len(pairs)), np.arange(len(others), len(others) + len(pairs))]
    ranks = (scores >= own[:, None]).sum(axis=1) - 1  # documents scored at least as high, but its own
    return np.where(ranks < 10, 1 / np.log2(ranks + 2), 0.0)
