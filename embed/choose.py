"""The embedder the adaptation keeps, chosen by measurement: static, or the transformer where the budget allows.

Two embedders can be made from the pretrained GPT-2 (embed/tune.py): the static table of token vectors,
cheap to train and to encode and the better one on a CPU's budget, and the whole transformer with
pooling, where pretraining shows (on SciFact, after 200 CPU steps: 0.088 from the pretrained model, 0.006
from random weights), which needs a GPU's compute. `pipeline pretrain` (and `pipeline tune` at its
default, `--architecture auto`) decides between them on the machine it runs on, within one time budget
that covers all of it:

1. a transformer step is timed here (embed/tune.py's step_seconds; on a GPU its whole batch in one pass
   where the card takes it, else the cached loss's mini-batches), and the transformer is a candidate only
   if MIN_TRANSFORMER_STEPS of its steps and its measurement fit 1 - STATIC_SHARE of the budget; otherwise
   the reason is reported;
2. the static embedder is tuned, its steps and the pairs mined for them planned to fit all of the budget but
   MEASURE_SHARE and, when the transformer is a candidate, its MIN_TRANSFORMER_STEPS and measurement: it
   always fits, and is what is kept if nothing else is; then the transformer in what is left (the static
   embedder's steps are often bounded by the pairs the corpus gives, which leaves the transformer more);
3. each candidate is measured on held-out corpus pairs (common/heldout.py: documents tuning never saw, a
   sentence or span of one as the query, the rest of it the answer), dense nDCG@10 among all the
   documents (a sample of MEASURE_DOCUMENTS on a large collection), and the transformer becomes tuned/
   only if it is ahead by more than the standard error of the per-pair differences; else the static one.

A transformer that fails to tune (out of GPU memory, say) is reported and the static embedder kept.

The manifest's "tuned" section records the kept embedder and, under "candidates", each one's score with
its standard error, time, or why it was skipped, and under "phases" each phase's planned and actual seconds.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from common.console import info
from common.embedder import embedding_text, encode, load_embedder
from common.errors import PipelineError
from common.heldout import held_out_pairs, standard_error
from common.language import detect_languages
from common.manifest import TunedEntry
from common.readers import Document
from common.workspace import Workspace, model_fingerprint, replace_directory
from embed.settings import TuneSettings
from embed.tune import (
    PROBE_PAIRS,
    TUNED_DIR,
    document_text,
    record_tuned,
    run_tune,
    step_seconds,
    transformer_student,
)

TRANSFORMER_BATCH = 256  # pairs per step: the transformer's batch (a static table takes 1,024 cheaply)
TRANSFORMER_MINI_BATCH = 64  # texts per forward pass (CachedMultipleNegativesRankingLoss): bounded memory
# Fewer steps than this in its share of the budget: the transformer is not tuned. After 200 steps on a CPU it
# scored 0.088 against the static table's 0.59 (SciFact), and at 12m on 2 cores 82 steps of it took 65% of
# the adaptation for 0.012 on held-out pairs: fewer steps only take time from the static embedder.
MIN_TRANSFORMER_STEPS = 200
STATIC_SHARE = 0.35  # of the adaptation's time, at least, for the static embedder when the transformer is tuned too
MEASURE_SHARE = 0.05  # of the adaptation's time, kept for measuring the static candidate on held-out pairs
MEASURE_PAIRS = 300
ENCODE_PROBE_TEXTS = 128  # documents encoded to time the transformer's measurement
MEASURE_DOCUMENTS = 20_000


def transformer_settings(static: TuneSettings, pooling: str = "mean", mini_batches: bool = True) -> TuneSettings:
    """The transformer candidate's settings: the static one's steps and pairs, a transformer's batch and rate,
    and, with `mini_batches`, the cached loss's passes of TRANSFORMER_MINI_BATCH texts (bounded memory)."""
    batch = min(static.batch_size, TRANSFORMER_BATCH)
    return replace(
        static,
        architecture="transformer",
        pooling=pooling,
        batch_size=batch,
        lr=None,
        mini_batch=TRANSFORMER_MINI_BATCH if mini_batches and batch > TRANSFORMER_MINI_BATCH else None,
    )


def timed_transformer(
    ws: Workspace, docs: list[Document], static: TuneSettings, pooling: str, enough_s: float, fits_s: float
) -> tuple[TuneSettings, float, float]:
    """The transformer candidate's settings, its step's seconds and its measurement's, timed here (the
    measurement's only where a step takes at most `fits_s`). On a GPU its whole batch in one pass, if the card
    takes it: mini-batches of a few texts leave it idle (on an H200 a step of 256 pairs took 0.36 s in passes
    of 64 texts, 0.04 s in one); on a CPU, or a GPU that runs out of memory, the cached loss's mini-batches."""
    import torch

    if torch.cuda.is_available():
        settings = transformer_settings(static, pooling, mini_batches=False)
        try:
            return settings, *transformer_step_seconds(ws, docs, settings, enough_s, fits_s)
        except torch.OutOfMemoryError:
            pass  # the cached loss's mini-batches below, once the memory the attempt held is let go
        torch.cuda.empty_cache()
    settings = transformer_settings(static, pooling)
    return settings, *transformer_step_seconds(ws, docs, settings, enough_s, fits_s)


def adapt(
    ws: Workspace, docs: list[Document], budget_seconds: float, static: TuneSettings, transformer_pooling: str = "mean"
) -> TunedEntry:
    """Tune the candidates the budget allows, keep the one that finds held-out documents best (module
    docstring), record it in the manifest and return its section (the candidates' measurements and the
    phases' seconds in its report). Everything, the measurements included, is planned to end within
    `budget_seconds`: the transformer's step is timed first, and it is tuned only if MIN_TRANSFORMER_STEPS of
    it fit its share beside the static embedder's and its measurement."""
    started = time.perf_counter()
    candidates: dict[str, TunedEntry] = {}
    skipped = None
    transformer_s = measure_transformer_s = needed_s = 0.0
    try:
        fewest = min(MIN_TRANSFORMER_STEPS, static.steps)
        # a warm-up step three times too slow already says no; its measurement is timed only if its steps fit
        transformer, step_s, measure_transformer_s = timed_transformer(
            ws, docs, static, transformer_pooling, 3 * budget_seconds / MIN_TRANSFORMER_STEPS,
            budget_seconds * (1 - STATIC_SHARE) / fewest,
        )  # fmt: skip
        share_s = (budget_seconds - (time.perf_counter() - started)) * (1 - STATIC_SHARE)
        transformer_s = share_s - measure_transformer_s  # infinite where its steps alone do not fit
        needed_s = fewest * step_s + measure_transformer_s  # what the transformer is kept from the static one
        if transformer_s < fewest * step_s:
            left_for_steps = share_s - (measure_transformer_s if math.isfinite(measure_transformer_s) else 0)
            skipped = {
                "skipped": f"{fewest} steps of {transformer.batch_size} pairs would take about "
                f"{fewest * step_s / 60:.1f} min here ({step_s:.2f} s a step, measured), over the budget left "
                f"for it ({max(left_for_steps, 0) / 60:.1f} min)",
                "step_seconds": step_s,
            }
    except (RuntimeError, PipelineError) as e:  # e.g. out of GPU memory: the static embedder stands
        skipped = {"skipped": f"tuning failed: {(str(e).splitlines() or [type(e).__name__])[0]}"}
    left = budget_seconds - (time.perf_counter() - started)
    # The static embedder, kept unless the transformer beats it, takes all but the transformer's fewest steps:
    # its steps are often bounded by the pairs the corpus gives, and the transformer then gets what it left.
    static_s = left * (1 - MEASURE_SHARE) - (needed_s if skipped is None else 0.0)
    planned = {"probe": time.perf_counter() - started, "static": static_s, "measure": left * MEASURE_SHARE}
    workdir = Path(tempfile.mkdtemp(dir=ws.root, prefix=".adapt."))  # the candidates, until one is kept
    try:
        candidates["static"] = run_tune(
            ws, docs, static, out_name=f"{workdir.name}/static", record=False, budget_s=static_s
        )
        if skipped is None:
            transformer_s = budget_seconds - (time.perf_counter() - started) - left * MEASURE_SHARE
            transformer_s -= measure_transformer_s
        if skipped is None and transformer_s < fewest * step_s:  # the static embedder took longer than planned
            skipped = {
                "skipped": f"{fewest} steps would take {fewest * step_s / 60:.1f} min here, over the "
                f"{max(transformer_s, 0) / 60:.1f} min the static embedder left of the budget",
                "step_seconds": step_s,
            }
        if skipped is None:
            planned.update(transformer=transformer_s, measure=planned["measure"] + measure_transformer_s)
            info(
                f"tuning the transformer too: {transformer_s / 60:.1f} min of the budget "
                f"({step_s:.2f} s a step of {transformer.batch_size} pairs, measured)"
            )
            try:
                candidates["transformer"] = run_tune(
                    ws,
                    docs,
                    transformer,
                    out_name=f"{workdir.name}/transformer",
                    record=False,
                    budget_s=transformer_s,
                )
            except (RuntimeError, PipelineError) as e:
                skipped = {"skipped": f"tuning failed: {(str(e).splitlines() or [type(e).__name__])[0]}"}
        if skipped:
            info(f"the transformer embedder is not tuned: {skipped['skipped']}")
        measuring = time.perf_counter()
        language = detect_languages([d.text for d in docs]).language
        gains = {name: held_out_gains(ws.root / entry.path, docs, language) for name, entry in candidates.items()}
        measured_s = time.perf_counter() - measuring
        kept = better(gains)
        replace_directory(ws.root / candidates[kept].path, ws.root / TUNED_DIR)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        name: {
            "held_out_ndcg@10": float(gains[name].mean()) if len(gains[name]) else None,
            # none from fewer than two pairs (recorded as unknown, not as 0)
            "held_out_standard_error": standard_error(gains[name]) if len(gains[name]) > 1 else None,
            "held_out_pairs": len(gains[name]),
            "seconds": entry.report["seconds"],
            "steps": entry.steps,
            "batch_size": entry.report["batch_size"],
            "step_profile": entry.report["step_profile"],
            "probe_step_s": entry.report.get("plan", {}).get("step_s"),
        }
        for name, entry in candidates.items()
    }
    if skipped:
        report["transformer"] = skipped
    actual = {"probe": planned["probe"], "measure": measured_s}
    actual.update((name, entry.report["phases_s"]["total"]) for name, entry in candidates.items())
    # a transformer planned but failed has no actual seconds
    phases = {name: {"planned_s": planned_s, "actual_s": actual.get(name)} for name, planned_s in planned.items()}
    figures = {"candidates": report, "budget_s": budget_seconds, "phases": phases}
    chosen = replace(
        candidates[kept],
        path=TUNED_DIR,
        fingerprint=model_fingerprint(ws.root / TUNED_DIR),
        report={**candidates[kept].report, **figures, "seconds_total": time.perf_counter() - started},
    )
    record_tuned(ws, chosen)
    measured = ", ".join(
        f"{name} {report[name]['held_out_ndcg@10'] or 0:.3f} ± {report[name]['held_out_standard_error'] or 0:.3f}"
        for name in candidates
    )
    info(
        f"embedder kept: {kept} (dense nDCG@10 on {len(gains[kept])} held-out corpus pairs, ± its standard error: "
        f"{measured}); `pipeline embed` now uses it"
    )
    return chosen


def better(gains: dict[str, np.ndarray]) -> str:
    """The static embedder, unless the transformer finds the held-out documents better by more than the
    standard error of the per-pair differences (a few hundred pairs: a smaller lead is noise)."""
    if "transformer" not in gains or not len(gains["static"]):
        return "static"
    difference = gains["transformer"] - gains["static"]
    return "transformer" if difference.mean() > standard_error(difference) else "static"


def transformer_step_seconds(
    ws: Workspace, docs: list[Document], settings: TuneSettings, enough_s: float = math.inf, fits_s: float = math.inf
) -> tuple[float, float]:
    """Seconds one training step of the transformer candidate takes on this machine (embed/tune.py's
    step_seconds on (document, document, document) triples of the corpus), and, where a step takes at most
    `fits_s`, the seconds its measurement on held-out pairs will take (measure_seconds; else infinity)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    loading = time.perf_counter()
    model, finish = transformer_student(ws.model_dir, settings, device, docs)
    load_s = time.perf_counter() - loading
    texts = [document_text(docs[i % len(docs)], settings.max_chars) for i in range(3 * PROBE_PAIRS)]
    triples = list(zip(texts[0::3], texts[1::3], texts[2::3]))
    step_s = step_seconds(model, triples, settings, device, enough_s)
    if step_s > fits_s:
        return step_s, math.inf
    finish(model)  # measured as it will embed: full-length texts
    return step_s, measure_seconds(model.eval(), docs, load_s)


def measure_seconds(model, docs: list[Document], load_s: float) -> float:
    """Seconds measuring a transformer on held-out pairs will take (held_out_gains): loading it, and encoding up
    to MEASURE_DOCUMENTS documents and MEASURE_PAIRS queries at the pace `model` encodes a sample of the
    documents here, timed after a warm-up batch. A training step's time did not tell: counting a third of a
    step's work a text said 0.2 s on an H200, where loading and encoding took about 6 s."""
    sample = [embedding_text(d.title, d.text) for d in docs[:ENCODE_PROBE_TEXTS]]
    encode(model, sample[:8])
    start = time.perf_counter()
    encode(model, sample)
    per_text = (time.perf_counter() - start) / len(sample)
    return load_s + per_text * (min(len(docs), MEASURE_DOCUMENTS) + MEASURE_PAIRS)


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
