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
   documents (a sample of MEASURE_DOCUMENTS on a large collection), and the better one becomes tuned/.

The manifest's "tuned" section records the kept embedder and, under "candidates", each one's score,
time, or why it was skipped.
"""
from __future__ import annotations

import math
import random
import shutil
import statistics
import time
from dataclasses import replace

import numpy as np

from common.console import info
from common.heldout import held_out_pair, is_held_out
from common.language import detect_languages
from common.models import embedding_text, encode, load_embedder
from common.readers import Document
from common.workspace import Workspace, model_fingerprint, replace_directory
from embed.tune import DEFAULT_LR, TUNED_DIR, TuneSettings, document_text, run_tune, transformer_student

CANDIDATE_PREFIX = ".tuned-candidate-"  # each candidate's directory in the workspace until one is kept
TRANSFORMER_BATCH = 256  # pairs per step: the transformer's batch (a static table takes 1,024 cheaply)
TRANSFORMER_MINI_BATCH = 64  # texts per forward pass (CachedMultipleNegativesRankingLoss): bounded memory
PROBE_PAIRS = 16
PROBE_STEPS = 3
MEASURE_PAIRS = 300
MEASURE_DOCUMENTS = 20_000


def transformer_settings(static: TuneSettings, pooling: str = "mean") -> TuneSettings:
    """The transformer candidate's settings: the static one's steps and pairs, a transformer's batch and rate."""
    batch = min(static.batch_size, TRANSFORMER_BATCH)
    return replace(static, architecture="transformer", pooling=pooling, batch_size=batch, lr=None,
                   mini_batch=TRANSFORMER_MINI_BATCH if batch > TRANSFORMER_MINI_BATCH else None)


def adapt(ws: Workspace, docs: list[Document], budget_seconds: float, static: TuneSettings, transformer_pooling: str = "mean") -> dict:
    """Tune the candidates the budget allows, keep the one that finds held-out documents best (module
    docstring), record it in the manifest and return its summary."""
    for leftover in ws.root.glob(f"{CANDIDATE_PREFIX}*"):  # from a run that was killed
        shutil.rmtree(leftover, ignore_errors=True)
    transformer = transformer_settings(static, transformer_pooling)
    candidates: dict[str, dict] = {}
    try:
        candidates["static"] = run_tune(ws, docs, static, out_name=f"{CANDIDATE_PREFIX}static", record=False)
        step_seconds = transformer_step_seconds(ws, docs, transformer)
        estimate = step_seconds * transformer.steps
        if estimate <= budget_seconds:
            info(f"tuning the transformer too: {transformer.steps} steps of {transformer.batch_size} pairs, about "
                 f"{estimate / 60:.1f} min here ({step_seconds:.2f} s a step), within the budget of {budget_seconds / 60:.1f} min")
            candidates["transformer"] = run_tune(ws, docs, transformer, out_name=f"{CANDIDATE_PREFIX}transformer", record=False)
        else:
            reason = (f"{transformer.steps} steps of {transformer.batch_size} pairs would take about {estimate / 60:.0f} min here "
                      f"({step_seconds:.2f} s a step, measured), over the budget of {budget_seconds / 60:.1f} min")
            info(f"the transformer embedder is not tuned: {reason}")
        language = detect_languages([d.text for d in docs]).language
        scores = {name: held_out_ndcg(ws.root / summary["path"], docs, language) for name, summary in candidates.items()}
        kept = max(candidates, key=lambda name: scores[name][0])  # ties: static, the first
        replace_directory(ws.root / candidates[kept]["path"], ws.root / TUNED_DIR)
    finally:
        for leftover in ws.root.glob(f"{CANDIDATE_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)
    report = {name: {"held_out_ndcg@10": scores[name][0], "held_out_pairs": scores[name][1], "seconds": summary["seconds"],
                     "steps": summary["steps"], "batch_size": summary["batch_size"]} for name, summary in candidates.items()}
    if "transformer" not in candidates:
        report["transformer"] = {"skipped": reason, "step_seconds": step_seconds}
    summary = {**candidates[kept], "path": TUNED_DIR, "fingerprint": model_fingerprint(ws.root / TUNED_DIR), "candidates": report}
    ws.update_manifest("tuned", summary)
    measured = ", ".join(f"{name} {scores[name][0]:.3f}" for name in candidates)
    info(f"embedder kept: {kept} (dense nDCG@10 on {scores[kept][1]} held-out corpus pairs: {measured}); "
         "`pipeline embed` now uses it")
    return summary


def transformer_step_seconds(ws: Workspace, docs: list[Document], settings: TuneSettings) -> float:
    """Seconds one training step of the transformer candidate takes on this machine: the median of
    PROBE_STEPS steps of PROBE_PAIRS (anchor, positive, negative) triples, after one to warm up, scaled to
    its batch (the cost of a step grows with its texts), and by 4/3 for the cached loss's extra forward pass."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = transformer_student(ws.model_dir, settings, device, docs)
    texts = [document_text(docs[i % len(docs)], settings.max_chars) for i in range(3 * PROBE_PAIRS)]
    features = []
    for part in (texts[0::3], texts[1::3], texts[2::3]):
        features.append({k: v.to(device) if hasattr(v, "to") else v for k, v in model.tokenize(part).items()})
    loss = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr or DEFAULT_LR["transformer"])
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda" and torch.cuda.is_bf16_supported())
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
    scale = settings.batch_size / PROBE_PAIRS * (4 / 3 if settings.mini_batch else 1)
    return statistics.median(times[1:]) * scale


def held_out_ndcg(model_dir, docs: list[Document], language: str, seed: int = 0) -> tuple[float, int]:
    """(dense nDCG@10, pairs): each held-out document's query (common/heldout.py) searched among the other
    documents (up to MEASURE_DOCUMENTS) and the held-out ones shortened by their query; one relevant each."""
    rng = random.Random(seed)
    held = [d for d in docs if is_held_out(d.id)] or docs
    pairs = {}
    for doc in rng.sample(held, len(held)):
        pair = held_out_pair(doc.title, doc.text, rng, language)
        if pair is not None:
            pairs[doc.id] = (doc, *pair)
        if len(pairs) == MEASURE_PAIRS:
            break
    if not pairs:
        return 0.0, 0
    others = [d for d in docs if d.id not in pairs]
    others = rng.sample(others, min(len(others), MEASURE_DOCUMENTS - len(pairs)))
    texts = [embedding_text(d.title, d.text) for d in others]
    texts += [embedding_text("" if kind == "title" else doc.title, shortened) for doc, _, shortened, kind in pairs.values()]
    model = load_embedder(model_dir)
    documents = encode(model, texts)
    queries = encode(model, [query for _, query, _, _ in pairs.values()])
    scores = queries @ documents.T
    own = np.arange(len(others), len(others) + len(pairs))
    ranks = (scores > scores[np.arange(len(pairs)), own][:, None]).sum(axis=1)  # documents scored above its own
    return float(np.mean([1 / math.log2(rank + 2) if rank < 10 else 0.0 for rank in ranks])), len(pairs)
