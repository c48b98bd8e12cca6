"""`pipeline tune`: contrastive adaptation of the pretrained GPT-2 into a sentence embedder.

The raw hidden states of a small language model trained from scratch make poor embeddings (every
text lands in nearly the same direction). Tuning teaches the model which texts belong together,
in one of two shapes:

    static       the GPT-2's tokenizer and a table of token vectors as a sentence-transformers
                 StaticEmbedding (the mean of a text's token vectors), trained contrastively: the
                 pretrained token embeddings widened with random columns (static_student). Cheap
                 enough to train well on a CPU in minutes, and fast to encode.
    transformer  the whole GPT-2 with a pooling layer (mean, SGPT's position-weighted mean, or the
                 last token). Far more compute per step.

For models pretrained on a CPU the static shape is the better embedder, and the default: its quality comes
from the tuning pairs rather than from pretraining (a random table does as well), while the transformer is
where pretraining shows and needs a GPU's compute. The measurements:
benchmarks/results/2026-11-28-search-quality-cpu.md.

The pairs come from the user's own, unlabelled corpus:

    title      a document's title            <->  its text
    ict        one sentence of a passage     <->  the rest of the passage with that sentence taken out
               (inverse cloze task, Lee et al. 2019: sentence-like queries against their context)
    neighbours one span of a document        <->  the span that follows it
    dropout    a passage                     <->  the same passage (two dropout noise draws, SimCSE)

plus, optionally, labelled (query, relevant document) pairs the user has. Documents held out by
common/heldout.py give no pairs: `pipeline index` measures the search modes on them. Training uses
sentence-transformers' SentenceTransformerTrainer with MultipleNegativesRankingLoss: every other
positive in the batch is a negative, and so is each pair's BM25-mined hard negative
(CachedMultipleNegativesRankingLoss with --mini-batch for large batches on little memory). A batch holds
each document once (DistinctDocumentsBatchSampler): random batches put more of a pair's own documents among
its negatives, and measured worse at every batch size (the same report). The tuned model is saved as a
sentence-transformers directory in the workspace (tuned/) and recorded in the manifest; embed uses it by
default afterwards.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable

import numpy as np

from common.board import Board
from common.console import info, warn
from common.embedder import embedding_text, ensure_pad_token
from common.errors import PipelineError
from common.heldout import after_title, is_held_out, shared_titles, title_key
from common.language import detect_languages, passages
from common.manifest import TunedEntry, read_manifest, write_section
from common.readers import Document, read_json_lines
from common.workspace import Workspace, model_fingerprint, replace_directory
from embed.pretokenized import PretokenizedTexts, static_texts, transformer_texts
from embed.settings import TuneSettings
from embed.step_clock import StepClock

TUNED_DIR = "tuned"
SIF_A = 1e-3  # the smoothing of SIF weights a / (a + p(token)), as Arora et al. chose
HARD_NEGATIVE_DEPTH = 8  # a hard negative is drawn from the anchor's top BM25 documents, its own excluded
# A batch holds each document once (DistinctDocumentsBatchSampler) and a pair brings two (its own and its hard
# negative's): batches of at most a third as many pairs as there are documents stay easy to fill.
DOCUMENTS_PER_BATCH_PAIR = 3
# Documents tuning reads at most: enough for its 500 x 1,024 pairs (2-3 rounds of one pair a document) and a
# pretraining corpus of gigabytes is not held in memory for them.
MAX_TUNING_DOCUMENTS = 200_000
MAX_PAIR_REPEATS = 3  # times one (anchor, positive) pair may be trained on: more teaches the pair, not the task
# Planning to a time budget (run_tune's budget_s): a step and the mining are timed here first.
PROBE_STEPS = 2  # timed steps, after one that warms up
STATIC_PROBE_STEPS = 6  # a static step is cheap, and its first few vary by 2x as its memory is first touched
PROBE_PAIRS = 64  # a transformer's timed batch (scaled to its own): a static step is cheap enough to time whole
MINE_PROBE_PAIRS = 2048  # pairs whose hard negatives are timed (and kept) before the rest are mined
PAIR_SLACK = 1.2  # pairs mined beyond steps x batch: the distinct-documents sampler leaves some out of batches
SAVE_SHARE = 0.03  # of the budget, left for saving the model


def tuning_documents(documents: Iterable[Document], limit: int = MAX_TUNING_DOCUMENTS, seed: int = 0) -> list[Document]:
    """The documents tuning draws its pairs from: all of them, or for a larger corpus (a pretraining corpus
    of gigabytes) a seeded uniform sample of `limit` (reservoir sampling: memory bounded by it, one pass),
    in corpus order."""
    rng = random.Random(seed)
    kept: list[tuple[int, Document]] = []
    seen = 0
    for i, doc in enumerate(documents):
        seen = i + 1
        if len(kept) < limit:
            kept.append((i, doc))
        elif (j := rng.randrange(i + 1)) < limit:
            kept[j] = (i, doc)
    if seen > limit:
        info(f"tuning on a sample of {limit:,} of the corpus's {seen:,} documents, drawn across it")
    return [doc for _, doc in sorted(kept, key=lambda item: item[0])]


def tuned_model_dir(ws: Workspace) -> Path | None:
    """The tuned model recorded in the manifest, if it is there and was tuned from the current pretrained model."""
    tuned = read_manifest(ws).tuned
    if tuned is None:
        return None
    path = ws.root / tuned.path
    if not (path / "modules.json").exists():
        warn(f"the tuned model {path} is missing: using the pretrained model (run `pipeline tune` again)")
        return None
    if not tuned.tuned_from(ws):
        warn(
            "the pretrained model changed since `pipeline tune`: using the pretrained model (run `pipeline tune` again)"
        )
        return None
    return path


def default_model_dir(ws: Workspace) -> Path:
    """What embed uses without --model: the tuned model if there is one, else the pretrained export."""
    return tuned_model_dir(ws) or ws.model_dir


# ---- pairs
@dataclass
class PairSource:
    """A training document as pairs are drawn from it: its title when the title is a query of its own (not
    the text's first words, not shared with other documents), and its text cut into parts (sentences, or
    spans where it has too few: common/language.py)."""

    doc: Document
    title: str
    text: str
    parts: list[str]
    unit: str  # "sentences" or "spans"


def pair_sources(docs: list[Document], language: str) -> list[PairSource]:
    shared = shared_titles(d.title for d in docs)
    sources = []
    for doc in docs:
        text = " ".join(doc.text.split())
        title = " ".join(doc.title.split())
        if title_key(title) in shared:  # a title many documents share (an article's sections) names none of them
            title = ""
        elif title and (rest := after_title(text, title)) is not None:  # a title repeating the text's start:
            text = rest  # the rest of the text is its positive
        parts, unit = passages(text, language)
        sources.append(PairSource(doc, title, text, parts, unit))
    return sources


def document_text(doc: Document, max_chars: int) -> str:
    """A whole document as a training text: its title and text, cut to what the model reads."""
    return embedding_text(doc.title, " ".join(doc.text.split()))[:max_chars]


def anchors_of(source: PairSource, kind: str) -> int:
    """The distinct anchors a document can give pairs of this kind (0: it gives none): its title, each part
    (ict), the parts before each cut (neighbours), itself (dropout)."""
    parts = len(source.parts)
    if kind == "title":
        return int(bool(source.title) and len(source.text) >= 20)
    if kind == "ict":
        return parts if parts >= 3 else 0
    if kind == "neighbours":
        return max(0, parts - 3)
    if kind == "dropout":
        return 1
    raise ValueError(kind)


def pair_for(source: PairSource, kind: str, rng: random.Random, max_chars: int) -> tuple[str, str] | None:
    """One (anchor, positive) pair of this kind from a document, or None if the document cannot give one.
    Each kind draws a part or a window of parts at random, so a document gives many distinct pairs."""
    if not anchors_of(source, kind):
        return None
    parts, text = source.parts, source.text
    if kind == "title":
        if len(parts) < 3 or rng.random() < 0.5:  # the whole text, or a window of at least half of its parts
            return source.title, text[:max_chars]
        size = rng.randint((len(parts) + 1) // 2, len(parts) - 1)
        lo = rng.randint(0, len(parts) - size)
        return source.title, " ".join(parts[lo : lo + size])[:max_chars]
    if kind == "dropout":
        passage = document_text(source.doc, max_chars)
        return passage, passage
    if kind == "ict":
        # A window of parts around the anchor keeps the context within the model's input length.
        i = rng.randrange(len(parts))
        lo = max(0, i - rng.randint(2, 6))
        window = parts[lo:i] + parts[i + 1 : i + 1 + rng.randint(2, 6)]
        if rng.random() < 0.1:  # as in the ICT paper: sometimes keep the sentence, so lexical overlap still counts
            window = parts[lo : i + 1 + rng.randint(2, 6)]
        return parts[i], embedding_text(source.title, " ".join(window))[:max_chars]
    cut = rng.randrange(2, len(parts) - 1)  # neighbours
    return " ".join(parts[max(0, cut - 3) : cut])[:max_chars], " ".join(parts[cut : cut + 3])[:max_chars]


def read_labelled_pairs(path: Path, documents: dict[str, Document]) -> list[tuple[str, str]]:
    """JSON lines with "query" and either "document" (its text) or "doc_id" (a document of the corpus)."""
    if not path.is_file():
        raise PipelineError(f"--pairs {path}: no such file")
    pairs = []
    for line_no, row in read_json_lines(path):
        query = row.get("query")
        if not isinstance(query, str) or not query.strip():
            raise PipelineError(f'{path}:{line_no}: a pair needs a non-empty "query"')
        if isinstance(row.get("document"), str) and row["document"].strip():
            positive = row["document"]
        elif row.get("doc_id") is not None:
            doc = documents.get(str(row["doc_id"]))
            if doc is None:
                raise PipelineError(f"{path}:{line_no}: doc_id '{row['doc_id']}' is not in the corpus")
            positive = embedding_text(doc.title, doc.text)
        else:
            raise PipelineError(f'{path}:{line_no}: a pair needs a "document" text or a "doc_id"')
        pairs.append((query.strip(), positive))
    if not pairs:
        raise PipelineError(f"--pairs {path}: no pairs")
    return pairs


def make_pairs(
    docs: list[Document], settings: TuneSettings, labelled: list[tuple[str, str]], language: str = "en"
) -> tuple[list[tuple[str, str, int | None]], dict]:
    """(anchor, positive, source document's index) triples for up to settings.steps batches, and what they
    are: rounds over the corpus, one pair per document per round, of a kind drawn at random among those the
    document can give; labelled pairs have no source document (None). No (anchor, positive) pair is made
    more than MAX_PAIR_REPEATS times: a corpus that offers fewer distinct pairs than the steps need gives
    fewer pairs (and tune then fewer steps) rather than the same pairs over and over. When the kinds asked
    for give no pair at all, dropout pairs (each document with itself) are used, and the report says so."""
    rng = random.Random(settings.seed)
    needed = settings.steps * settings.batch_size
    sources = pair_sources(docs, language)
    kinds = settings.pair_kinds
    made: collections.Counter = collections.Counter()
    pairs: list[tuple[str, str, int | None]] = []
    counts = {kind: 0 for kind in (*kinds, "labelled")}
    fallback = None
    while len(pairs) < needed:
        before = len(pairs)
        for i in rng.sample(range(len(sources)), len(sources)):
            for kind in rng.sample(kinds, len(kinds)):
                pair = pair_for(sources[i], kind, rng, settings.max_chars)
                if pair is not None and made[pair] < MAX_PAIR_REPEATS:
                    made[pair] += 1
                    pairs.append((*pair, i))
                    counts[kind] = counts.get(kind, 0) + 1
                    break
        for pair in labelled:
            if made[pair] < MAX_PAIR_REPEATS:
                made[pair] += 1
                pairs.append((*pair, None))
                counts["labelled"] += 1
        if len(pairs) == 0 and "dropout" not in kinds:
            fallback = (
                f"no document gives a pair of kind {', '.join(kinds)}: "
                "dropout pairs (each document with itself) instead"
            )
            kinds = ("dropout",)
            continue
        if len(pairs) - before < max(1, len(sources) // 100):  # the corpus has no more distinct pairs to give
            break
    if not pairs:
        raise PipelineError("no document has text to make a training pair from")
    units = collections.Counter(source.unit for source in sources)
    report = {
        "pairs": {kind: n for kind, n in counts.items() if n},
        "distinct_pairs": len(made),
        "max_repeats": MAX_PAIR_REPEATS,
        "documents_split_into": dict(units),
        "titles_used": sum(bool(s.title) for s in sources),
        "language": language,
        "fallback": fallback,
    }
    return pairs, report


def hard_negatives(
    docs: list[Document],
    pairs: list[tuple[str, str, int | None]],
    settings: TuneSettings,
    language: str = "en",
    lexical=None,
) -> list[int]:
    """One negative per pair: a document BM25 ranks among the top HARD_NEGATIVE_DEPTH for the anchor that is
    not the pair's own. It shares the anchor's words, so the model has to learn more than word overlap to
    tell them apart, which random in-batch negatives rarely ask of it. A pair with no such document (or a
    labelled pair, whose document may be any of them) gets a random other document. Returns each pair's
    negative as an index into docs. `lexical`: the documents' BM25 index (documents_index), if built already."""
    rng = random.Random(settings.seed + 1)
    if lexical is None:
        lexical = documents_index(docs, language)
    anchors = searched_anchors(pairs)
    ranked = dict(zip(anchors, lexical.top_many(anchors, HARD_NEGATIVE_DEPTH + 1)))
    negatives = []
    for anchor, _, source in pairs:
        others = [] if source is None else [int(c) for c in ranked[anchor] if int(c) != source][:HARD_NEGATIVE_DEPTH]
        if others:
            negatives.append(rng.choice(others))
        else:  # any document but the pair's own (the caller ensures there are at least two)
            j = rng.randrange(len(docs) - (source is not None))
            negatives.append(j + (source is not None and j >= source))
    return negatives


def searched_anchors(pairs: list[tuple[str, str, int | None]]) -> list[str]:
    """The anchors hard_negatives searches, each once (rounds of pairs repeat them: a title, a sentence, in many
    pairs): those of pairs cut from a document, in order."""
    return list(dict.fromkeys(anchor for anchor, _, source in pairs if source is not None))


def documents_index(docs: list[Document], language: str):
    """The documents' BM25 index (ids = their positions) that hard negatives are mined from."""
    # imported here: its scipy import is 0.2 s of every `pipeline embed` (it imports this module)
    from common.lexical import Analyzer, LexicalIndex

    return LexicalIndex.build([(i, d.title, d.text) for i, d in enumerate(docs)], Analyzer(language))


def batch_keys(pairs: list[tuple[str, str, int | None]], negatives: list[int] | None) -> list[frozenset]:
    """What each pair brings into a batch that no other pair there may bring: its two texts, its source
    document and its hard negative's (indices into the documents)."""
    keys = []
    for i, (anchor, positive, source) in enumerate(pairs):
        documents = {source, None if negatives is None else negatives[i]} - {None}
        keys.append(frozenset({("text", anchor), ("text", positive), *(("document", d) for d in documents)}))
    return keys


class DistinctDocumentsBatchSampler:
    """Batches in which no document is there twice: each pair brings its source document and its hard
    negative's, and a batch takes a pair only if neither is already in it (nor its anchor or positive text,
    as sentence-transformers' NO_DUPLICATES sampler asks). Every text in a batch is a negative for every
    other pair's anchor, so two pairs from one document, or one pair's source among the hard negatives,
    would teach the model to push a text away from its own document. With random batches that is common:
    a batch of 1,024 pairs holds 1,024 hard-negative documents, a fifth of a 5,000-document corpus. Pairs that
    do not fit a batch wait for the next; a batch that cannot be filled from what is left is kept if at least
    half full, and ends the epoch otherwise. An epoch's batches are made before it starts, so the trainer is
    told how many there are (it stopped after 3 steps when it was told a number the epoch did not reach);
    the order is shuffled with seed + epoch, as the library's samplers."""

    def __init__(self, keys: list[frozenset], batch_size: int, seed: int):
        self.keys, self.batch_size, self.seed, self.epoch = keys, batch_size, seed, 0
        self._made: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self):
        yield from self.batches()

    def batches(self) -> list[list[int]]:
        if self._made is None or self._made[0] != self.epoch:
            self._made = (self.epoch, self._make_batches())
        return self._made[1]

    def _make_batches(self) -> list[list[int]]:
        order = list(range(len(self.keys)))
        random.Random(self.seed + self.epoch).shuffle(order)
        pending = collections.deque(order)
        batches = []
        while pending:
            batch, taken, skipped = [], set(), []
            while pending and len(batch) < self.batch_size:
                i = pending.popleft()
                if taken.isdisjoint(self.keys[i]):
                    batch.append(i)
                    taken.update(self.keys[i])
                else:
                    skipped.append(i)
            pending.extendleft(reversed(skipped))
            if len(batch) < max(2, self.batch_size // 2):  # what is left makes no batch worth a step
                break
            batches.append(batch)
        return batches


# ---- training
def run_tune(
    ws: Workspace,
    docs: list[Document],
    settings: TuneSettings,
    out_name: str = TUNED_DIR,
    record: bool = True,
    budget_s: float | None = None,
) -> TunedEntry:
    """Tune, save the model to the workspace's `out_name` directory and, with `record`, name it in the
    manifest as the model embed uses; returns what was done (the manifest's "tuned" section, the figures in
    its report). With
    `budget_s`, the steps (at most settings.steps) are planned to end within that many seconds."""
    if settings.architecture not in ("static", "transformer"):
        raise ValueError(f"run_tune tunes one architecture, not {settings.architecture!r} (embed/choose.py: auto)")
    if not (ws.model_dir / "config.json").exists():
        raise PipelineError(f"no pretrained model in {ws.model_dir}: run `pipeline pretrain` first")

    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from transformers.integrations import TensorBoardCallback

    started = time.perf_counter()  # what a time budget counts from
    labelled = read_labelled_pairs(settings.pairs_file, {d.id: d for d in docs}) if settings.pairs_file else []
    # Documents held out here are where `pipeline index` measures which search mode works best.
    training_docs = [d for d in docs if not is_held_out(d.id)] or docs
    largest_batch = max(2, len(training_docs) // DOCUMENTS_PER_BATCH_PAIR)
    if settings.batch_size > largest_batch:
        info(
            f"batches of {largest_batch} pairs instead of {settings.batch_size}: a batch holds each document once, "
            f"and {len(training_docs):,} documents fill batches of up to {largest_batch}"
        )
        settings = replace(settings, batch_size=largest_batch)
    language = detect_languages([d.text for d in training_docs]).language
    torch.manual_seed(settings.seed)
    base_fingerprint = model_fingerprint(ws.model_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    build = static_student if settings.architecture == "static" else transformer_student
    model, finish = build(ws.model_dir, settings, device, training_docs)
    loss = training_loss(model, settings)

    mining = settings.hard_negatives and len(training_docs) > 1
    plan, lexical, probed, probe_negatives = None, None, [], []
    if budget_s is not None:  # only the pairs the steps that fit will use are made and mined
        plan, lexical = budget_plan(
            model, training_docs, labelled, settings, language, device, started, budget_s, mining
        )
        probed, probe_negatives = plan.pop("mined")
        settings = replace(settings, steps=plan["steps"])
    pairs, report, settings = training_pairs(training_docs, len(docs), settings, labelled, language)
    pairs_s = time.perf_counter() - started
    columns = {"anchor": [a for a, _, _ in pairs], "positive": [p for _, p, _ in pairs]}
    negatives, mine_s = None, 0.0
    if mining:
        mine = time.perf_counter()
        negatives = mined_negatives(training_docs, pairs, settings, language, lexical, (probed, probe_negatives))
        mine_s = time.perf_counter() - mine
        texts = [document_text(d, settings.max_chars) for d in training_docs]  # once per document, not per pair
        columns["negative"] = [texts[j] for j in negatives]
    sampler, columns, settings = batch_sampler(pairs, columns, negatives, settings, len(training_docs))
    tokenizing = time.perf_counter()
    preprocess = training_preprocess(model, settings, ())  # each column's texts tokenized as it is positioned
    columns = {name: preprocess.positions(texts) for name, texts in columns.items()}  # batched from their tokens
    tokenize_s = time.perf_counter() - tokenizing
    dataset = Dataset.from_dict(columns)
    # the loss, learning rate and gradient norm at each logged step, as TensorBoard scalars (train/loss ...)
    board = Board(
        ws,
        f"tune-{settings.architecture}",
        wandb=settings.wandb,
        config=json.loads(json.dumps(asdict(settings), default=str)),
    )
    info(f"TensorBoard: tensorboard --logdir {ws.tensorboard_dir}  (this run: {board.directory})")
    scratch = Path(tempfile.mkdtemp(dir=ws.root, prefix=".tune."))
    start = time.perf_counter()

    clock = StepClock(device)
    # the plan's steps are a prediction: training also stops where the budget (less saving) ends
    deadline = started + budget_s * (1 - SAVE_SHARE) if budget_s else math.inf
    progress = tune_progress(clock, start, deadline)
    trainer = SentenceTransformerTrainer(
        model=model,
        args=training_arguments(settings, scratch, sampler, device),
        train_dataset=dataset,
        loss=loss,
        data_collator=preprocess.collator(),
        callbacks=[progress, TensorBoardCallback(board.writer)],
    )
    trainer.remove_callback(
        next(c for c in trainer.callback_handler.callbacks if type(c).__name__ == "PrinterCallback")
    )
    try:
        result = trainer.train()
        seconds = time.perf_counter() - start
        step_profile = clock.profile()
        if progress.stopped_at:
            warn(
                f"tuning stopped after {progress.stopped_at[0]} of {settings.steps} planned steps: the time budget "
                f"of {budget_s:.0f}s ran out (steps took longer than the probe said)"
            )
        if step_profile:
            info(
                f"a tune step took {step_profile['step_s']:.3f}s: {step_profile['forward_backward_share']:.0%} "
                f"forward and backward, {step_profile['batching_share']:.0%} batching and tokenizing, "
                f"{step_profile['optimizer_share']:.0%} the optimizer"
            )
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        model.eval()
        finish(model)
        out_dir = ws.root / out_name
        save_swapped(model, out_dir, scratch)
    finally:
        board.close()
        shutil.rmtree(scratch, ignore_errors=True)
        del trainer, model, loss
        if device == "cuda":  # the next candidate, or another process on this GPU, gets the memory back
            torch.cuda.empty_cache()

    entry = TunedEntry.from_json(
        {
            "path": out_name,
            "fingerprint": model_fingerprint(out_dir),
            "base_fingerprint": base_fingerprint,
            "architecture": settings.architecture,
            "pooling": settings.pooling,
            "dimensions": settings.dimensions if settings.architecture == "static" else None,
            "pairs": report,
            "hard_negatives": "negative" in columns,
            "steps": progress.stopped_at[0] if progress.stopped_at else settings.steps,
            "planned_steps": settings.steps,
            "batch_size": settings.batch_size,
            "loss": "cached_mnrl" if settings.mini_batch else "mnrl",
            "lr": settings.learning_rate,
            "max_seq_length": settings.max_seq_length,
            "dropout": settings.dropout,
            "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else result.training_loss,
            "seconds": seconds,  # training
            "step_profile": step_profile,
            "phases_s": {
                "pairs": pairs_s,
                "mining": mine_s,
                "tokenizing": tokenize_s,
                "training": seconds,
                "total": time.perf_counter() - started,
            },
            **({"plan": plan} if plan else {}),
        }
    )
    losses_said = f"loss {entry.first_loss:.3f} -> {entry.final_loss:.3f}" if losses else f"loss {entry.final_loss:.3f}"
    if record:
        record_tuned(ws, entry)
    info(
        f"tuned in {seconds:.0f}s, {result.global_step} steps ({losses_said}); saved to {out_dir}"
        + ("; `pipeline embed` now uses it" if record else "")
    )
    return entry


def training_pairs(
    training_docs: list[Document], documents: int, settings: TuneSettings, labelled: list, language: str
) -> tuple[list, dict, TuneSettings]:
    """The pairs the planned steps use (make_pairs, then cut to them), what they are, and the settings with the
    batch size shrunk when fewer documents gave pairs than a batch needs; says what was made."""
    pairs, report = make_pairs(training_docs, settings, labelled, language)
    # a round is one pair a document: on a large corpus more than a few steps use, and every pair kept is mined
    pairs = pairs[: max(2 * settings.batch_size, math.ceil(settings.steps * settings.batch_size * PAIR_SLACK))]
    if report["fallback"]:
        warn(report["fallback"])
    # Only documents that gave pairs fill batches (with their hard negatives): in a corpus of short documents
    # those may be far fewer than the documents.
    sources = len({source for _, _, source in pairs if source is not None}) + len(set(labelled))
    if settings.batch_size > max(2, sources // DOCUMENTS_PER_BATCH_PAIR):
        info(
            f"batches of {max(2, sources // DOCUMENTS_PER_BATCH_PAIR)} pairs instead of {settings.batch_size}: "
            f"{sources:,} documents gave pairs, and a batch holds each document once"
        )
        settings = replace(settings, batch_size=max(2, sources // DOCUMENTS_PER_BATCH_PAIR))
    split = report["documents_split_into"]
    info(
        f"{len(pairs):,} training pairs ({report['distinct_pairs']:,} distinct, "
        f"none more than {MAX_PAIR_REPEATS} times) "
        f"from {len(training_docs):,} documents ({documents - len(training_docs):,} held out to measure search on): "
        + ", ".join(f"{n:,} {kind}" for kind, n in report["pairs"].items())
        + f"; language {language}, {split.get('sentences', 0):,} documents cut into sentences "
        f"and {split.get('spans', 0):,} into spans; {report['titles_used']:,} titles used"
    )
    return pairs, report, settings


def mined_negatives(
    training_docs: list[Document], pairs: list, settings: TuneSettings, language: str, lexical, probe: tuple
) -> list[int]:
    """A BM25 hard negative (a document's position) for each pair; `probe` is the pairs planning mined first
    and their negatives, kept when they are these pairs' first (the same seed makes the same first round),
    `lexical` planning's index, or None."""
    started = time.perf_counter()
    probed, probe_negatives = probe
    kept = min(len(pairs), len(probed))
    negatives = probe_negatives[:kept] if pairs[:kept] == probed[:kept] else []
    if lexical is None:  # not made while planning (no budget)
        lexical = documents_index(training_docs, language)
    negatives += hard_negatives(training_docs, pairs[len(negatives) :], settings, language, lexical)
    info(f"mined a BM25 hard negative for each of {len(pairs):,} pairs in {time.perf_counter() - started:.0f}s")
    return negatives


def batch_sampler(
    pairs: list, columns: dict, negatives: list[int] | None, settings: TuneSettings, documents: int
) -> tuple[DistinctDocumentsBatchSampler, dict, TuneSettings]:
    """The batch sampler, the columns it draws from (without the hard negatives when they leave no batch), and
    the settings with fewer steps when the pairs give fewer batches than planned."""
    sampler = DistinctDocumentsBatchSampler(batch_keys(pairs, negatives), settings.batch_size, settings.seed)
    if len(sampler) == 0 and negatives is not None:  # a handful of documents: their hard negatives leave no batch
        info("no batch holds each document once with hard negatives among so few documents: in-batch negatives only")
        columns = {name: texts for name, texts in columns.items() if name != "negative"}
        sampler = DistinctDocumentsBatchSampler(batch_keys(pairs, None), settings.batch_size, settings.seed)
    if len(sampler) == 0:
        raise PipelineError(
            f"{documents} document(s) give no batch of two pairs from different documents: "
            "tuning needs at least 2 documents with text"
        )
    if len(sampler) < settings.steps:  # each pair at most once more in training: fewer steps, not repeated pairs
        info(
            f"{len(sampler)} steps instead of {settings.steps}: the corpus gives {len(pairs):,} pairs, "
            f"{len(sampler)} batches of {settings.batch_size}"
        )
        settings = replace(settings, steps=max(1, len(sampler)))
    return sampler, columns, settings


def tune_progress(clock: StepClock, start: float, deadline: float):
    """The trainer's callback that times each step, logs step, loss, learning rate and ETA, and stops training
    at `deadline` (the steps it stopped after: `.stopped_at`)."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def __init__(self):
            self.stopped_at: list[int] = []

        def on_step_begin(self, args, state, control, **kwargs):
            clock.begin()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            clock.before_optimizer()

        def on_step_end(self, args, state, control, **kwargs):
            clock.end()
            if time.perf_counter() > deadline and state.global_step < state.max_steps:
                control.should_training_stop = control.should_log = True
                self.stopped_at.append(state.global_step)
            if state.global_step == state.max_steps:  # the last step's loss is logged too (planned steps are any)
                control.should_log = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                elapsed = time.perf_counter() - start
                eta = elapsed / max(state.global_step, 1) * (state.max_steps - state.global_step)
                info(
                    f"tune step {state.global_step}/{state.max_steps}  loss {logs['loss']:.4f}  "
                    f"lr {logs.get('learning_rate', 0):.2e}  {elapsed:.0f}s  eta {eta:.0f}s"
                )

    return Progress()


def training_arguments(settings: TuneSettings, scratch: Path, sampler, device: str):
    """sentence-transformers' trainer arguments for these settings: linear warm-up and decay, our batch sampler,
    no checkpoints and no reports of its own (the Board and the progress callback report)."""
    import torch
    from sentence_transformers import SentenceTransformerTrainingArguments

    return SentenceTransformerTrainingArguments(
        output_dir=str(scratch),
        max_steps=settings.steps,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        warmup_steps=max(1, settings.steps // 10),
        lr_scheduler_type="linear",
        weight_decay=0.01,
        batch_sampler=lambda dataset, batch_size, seed, **_: sampler,
        logging_steps=min(settings.log_every, settings.steps),
        logging_nan_inf_filter=False,  # its check reads the loss back every step, idling the GPU while it batches
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=settings.seed,
        data_seed=settings.seed,
        dataloader_drop_last=True,
        dataloader_num_workers=loader_workers(settings, device),
        use_cpu=device == "cpu",
        bf16=device == "cuda" and settings.architecture == "transformer" and torch.cuda.is_bf16_supported(),
    )


def loader_workers(settings: TuneSettings, device: str) -> int:
    """Processes batching ahead of the model: on a GPU a static step's model work is a few milliseconds, less
    than fetching and collating its batch, which workers then do while the device trains on the one before.
    None in a process whose threads do not survive a fork (gRPC's: a Ray driver or worker)."""
    if settings.loader_workers is not None:
        return settings.loader_workers
    if device != "cuda" or "grpc" in sys.modules:
        return 0
    return min(4, (os.cpu_count() or 1) // 4)


def budget_plan(
    model,
    docs: list[Document],
    labelled: list[tuple[str, str]],
    settings: TuneSettings,
    language: str,
    device: str,
    started: float,
    budget_s: float,
    mining: bool,
) -> tuple[dict, object]:
    """The steps that end the tuning within `budget_s` of `started`, from what one round of pairs
    (one a document) costs to make, to mine (MINE_PROBE_PAIRS of them, after the BM25 index is built) and to
    train on (a step timed on a copy of the model). Returns the plan and the BM25 index, for the mining.
    Making pairs first cuts every document into sentences, once per call whatever the pairs asked for: that
    part is timed apart and counted once (counted in each pair, it made a pair look 5 times dearer on SciFact)."""
    start = time.perf_counter()
    sources = pair_sources(docs, language)
    sources_s = time.perf_counter() - start
    start = time.perf_counter()
    first, _ = make_pairs(docs, replace(settings, steps=1), labelled, language)
    pair_s = max(0.0, time.perf_counter() - start - sources_s) / len(first)
    lexical, mined, mine_per_anchor = None, [], 0.0
    anchors = anchor_counts(sources, settings.pair_kinds)
    if mining:
        lexical = documents_index(docs, language)
        hard_negatives(docs, first[:8], settings, language, lexical)  # loads the compiled search kernel
        start = time.perf_counter()
        mined = hard_negatives(docs, first[:MINE_PROBE_PAIRS], settings, language, lexical)
        mine_per_anchor = (time.perf_counter() - start) / max(1, len(searched_anchors(first[:MINE_PROBE_PAIRS])))
    sample = first[:MINE_PROBE_PAIRS]  # pairs are tokenized before training (embed/pretokenized.py)
    start = time.perf_counter()
    training_preprocess(model, settings, [text for a, p, _ in sample for text in (a, p)])
    tokenize_per_pair = (time.perf_counter() - start) / len(sample)
    negatives = [document_text(docs[(i * 7919) % len(docs)], settings.max_chars) for i in range(settings.batch_size)]
    probe = [(a, p, negative) for (a, p, _), negative in zip(first[: settings.batch_size], negatives)]
    step_s = step_seconds(model, probe, settings, device)
    elapsed = time.perf_counter() - started + sources_s  # the pairs' making will cut the documents again
    pair_s += tokenize_per_pair
    costs = TuningCosts(step_s, pair_s, mine_per_anchor, anchors)
    steps = planned_steps(settings, budget_s, elapsed, costs)
    plan = {
        "budget_s": budget_s,
        "steps": steps,
        "step_s": step_s,
        "mine_s_per_anchor": mine_per_anchor,
        "anchors_possible": int(anchors.sum()),
        "make_s_per_pair": pair_s,  # tokenizing included
        "before_training_s": elapsed,  # cutting the documents for the pairs included
        "mined": (first[: len(mined)], mined),  # the first pairs' negatives, for the mining to go on from
        "planned_s": elapsed + costs.seconds(steps, settings.batch_size),
    }
    info(
        f"planned {steps} {settings.architecture} steps of {settings.batch_size} pairs for the "
        f"{budget_s:.0f}s budget: a step takes {step_s:.2f}s here (timed), a pair {pair_s * 1000:.2f} ms to make "
        f"and tokenize, an anchor {mine_per_anchor * 1000:.2f} ms to mine (once: rounds of pairs repeat them), "
        f"{elapsed - sources_s:.0f}s spent planning" + (" (the most asked for)" if steps == settings.steps else "")
    )
    return plan, lexical


@dataclass(frozen=True)
class TuningCosts:
    """What tuning costs here, timed by budget_plan: a training step, making and tokenizing a pair, and mining
    an anchor's hard negatives, paid once per distinct anchor (expected_anchors of `anchors`, each document's
    anchors per kind; None: every pair's anchor is new)."""

    step_s: float
    pair_s: float
    mine_s: float = 0.0
    anchors: np.ndarray | None = None

    def seconds(self, steps: float, batch_size: int) -> float:
        """Seconds `steps` steps take, their pairs (PAIR_SLACK more than the batches hold) made and mined."""
        pairs = steps * batch_size * PAIR_SLACK
        mined = pairs if self.anchors is None else min(pairs, expected_anchors(self.anchors, pairs))
        return steps * self.step_s + pairs * self.pair_s + mined * self.mine_s


def anchor_counts(sources: list[PairSource], kinds: tuple[str, ...]) -> np.ndarray:
    """Each document's distinct anchors (anchors_of) per kind asked for; one a document (dropout, the fallback)
    when the kinds give no pair."""
    counts = np.array([[anchors_of(source, kind) for kind in kinds] for source in sources], dtype=float)
    return counts if counts.sum() else np.ones((len(sources), 1))


def expected_anchors(counts: np.ndarray, pairs: float) -> float:
    """Distinct anchors expected among `pairs` pairs made as make_pairs makes them: rounds of one pair a
    document, of a kind drawn evenly among those it gives, its anchor evenly among the kind's. A kind of `a`
    anchors drawn with probability p a round has a(1 - (1 - p/a)^rounds) distinct ones after that many rounds.
    A little under the real count, as the repeat limit sends some draws to anchors not drawn yet (measured:
    benchmarks/results/2026-11-29-issue49-adaptation-cpu.md)."""
    giving = counts > 0
    kinds = giving.sum(axis=1, keepdims=True)
    rounds = pairs / max(1, int((kinds > 0).sum()))
    drawn = np.divide(1.0, kinds * counts, out=np.zeros_like(counts), where=giving)  # p/a: an anchor's odds a round
    return float((counts * (1 - (1 - drawn) ** rounds)).sum())


def planned_steps(settings: TuneSettings, budget_s: float, elapsed_s: float, costs: TuningCosts) -> int:
    """As many steps as fit what is left of the budget (less SAVE_SHARE for saving), each with its batch's
    pairs made and their new anchors mined; at least one, at most settings.steps."""
    available = budget_s * (1 - SAVE_SHARE) - elapsed_s
    fits, over = 0, settings.steps + 1  # the most steps known to fit, the fewest known not to (or too many)
    while over - fits > 1:
        middle = (fits + over) // 2
        fits, over = (middle, over) if costs.seconds(middle, settings.batch_size) <= available else (fits, middle)
    return max(1, fits)


def step_seconds(
    model, triples: list[tuple[str, str, str]], settings: TuneSettings, device: str, enough_s: float = math.inf
) -> float:
    """Seconds a training step of `model` takes here on a batch of settings.batch_size (anchor, positive,
    negative) triples, batched as the trainer batches them (from texts tokenized beforehand): the median of
    PROBE_STEPS (a static embedder's: STATIC_PROBE_STEPS) steps after one that warms up, on a copy of the
    model (the model itself is not trained), with the trainer's loss (the cached one's mini-batches too). A
    transformer on a CPU is timed on PROBE_PAIRS triples and scaled to its batch (a step's cost grows with
    its texts; on a GPU a small batch leaves the device idle, and scaling it overestimated the step 2.6x). A
    first step (on a GPU, the one after it) already slower than `enough_s` is the answer."""
    import copy
    import statistics

    import torch

    model = copy.deepcopy(model).train()
    whole = settings.architecture == "static" or device == "cuda"
    pairs = settings.batch_size if whole else min(PROBE_PAIRS, settings.batch_size)
    batch = [triples[i % len(triples)] for i in range(pairs)]
    loss = training_loss(model, settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    bf16 = device == "cuda" and settings.architecture == "transformer" and torch.cuda.is_bf16_supported()
    scale = settings.batch_size / pairs
    preprocess = training_preprocess(model, settings, itertools.chain.from_iterable(batch))
    # on a GPU the first step pays the device's set-up (2.4 s on an H200 where a step took 0.05 s): the
    # step after it is the first that can say a step is too slow
    deciding = 1 if device == "cuda" else 0
    times = []
    for _ in range((STATIC_PROBE_STEPS if settings.architecture == "static" else PROBE_STEPS) + 1):
        start = time.perf_counter()
        features = [
            {k: v.to(device) if hasattr(v, "to") else v for k, v in preprocess([t[column] for t in batch]).items()}
            for column in range(3)
        ]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            value = loss(features, None)
        value.backward()
        optimizer.step()
        optimizer.zero_grad()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if len(times) == deciding + 1 and times[deciding] * scale > enough_s:
            return times[deciding] * scale
    return statistics.median(times[1:]) * scale


def training_loss(model, settings: TuneSettings):
    """In-batch negatives (MultipleNegativesRankingLoss); with --mini-batch its cached form, which embeds a
    batch in passes of that many texts and so bounds the memory a large batch takes."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    if settings.mini_batch:
        return CachedMultipleNegativesRankingLoss(model, mini_batch_size=settings.mini_batch)
    return MultipleNegativesRankingLoss(model)


def training_preprocess(model, settings: TuneSettings, texts: Iterable[str]) -> PretokenizedTexts:
    """How a batch's texts become the model's features in training: from the texts tokenized once, here
    (embed/pretokenized.py), as the model's own preprocess would make them."""
    if settings.architecture == "static":
        return static_texts(model[0].tokenizer, texts)
    return transformer_texts(model.tokenizer, model.max_seq_length, texts)


def record_tuned(ws: Workspace, entry: TunedEntry) -> None:
    """The manifest's "tuned" section names the embedder `pipeline embed` uses (its one writer: `pipeline
    tune` and the embedder choice, embed/choose.py)."""
    write_section(ws, entry)


def static_student(model_dir: Path, settings: TuneSettings, device: str, docs: list[Document]):
    """The GPT-2's tokenizer and a token-embedding table as a StaticEmbedding: a text is the mean of its
    token vectors. The table is wider than the GPT-2's (settings.dimensions): the pretrained token
    embeddings (centred) fill its first columns and random ones the rest, since a mean of vectors keeps more
    words apart the more dimensions it has (on SciFact's train queries, with SIF weights and no tuning,
    1,024 random dimensions retrieve at nDCG@10 0.50-0.52 and 192 at 0.35). Each token's vector is scaled by
    its SIF weight a / (a + p(token)) in the corpus (Arora et al., 2017), so frequent tokens start nearly
    silent in the mean and tuning starts from a weighted bag of words instead of learning the weights
    first."""
    import torch
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    pretrained = load_file(model_dir / "model.safetensors")["transformer.wte.weight"]
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab_size, width = pretrained.shape
    counts = torch.zeros(vocab_size)
    for encoding in tokenizer.encode_batch([embedding_text(d.title, d.text) for d in docs]):
        counts.index_add_(0, torch.tensor(encoding.ids, dtype=torch.long), torch.ones(len(encoding.ids)))
    frequency = counts / counts.sum().clamp(min=1)
    # A language model's token embeddings share a common direction, which a mean of them would carry
    # into every text: take it out, and give the columns the random ones' scale.
    centred = pretrained[:, : settings.dimensions] - frequency @ pretrained[:, : settings.dimensions]
    centred = centred / centred.std().clamp(min=1e-12)
    generator = torch.Generator().manual_seed(settings.seed)
    extra = torch.randn(vocab_size, max(0, settings.dimensions - width), generator=generator)
    vectors = torch.cat([centred, extra], dim=1) * pretrained.std()
    vectors *= (SIF_A / (SIF_A + frequency))[:, None]
    model = SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_weights=vectors)], device=device)
    return model, lambda model: None


def transformer_student(model_dir: Path, settings: TuneSettings, device: str, docs: list[Document]):
    """The whole GPT-2 (with dropout for training) and a pooling layer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    drop = settings.dropout
    transformer = Transformer(
        str(model_dir), config_kwargs={"resid_pdrop": drop, "embd_pdrop": drop, "attn_pdrop": drop}
    )
    base_max_length = transformer.max_seq_length
    model = SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=settings.pooling)],
        device=device,
    )
    model.max_seq_length = settings.max_seq_length
    ensure_pad_token(model.tokenizer)

    def finish(model) -> None:  # trained on shorter inputs for speed; embed full-length chunks as before
        model.max_seq_length = base_max_length
        model.tokenizer.model_max_length = base_max_length

    return model, finish


def save_swapped(model, out_dir: Path, scratch: Path) -> None:
    """Save into scratch, then swap in: a crash leaves the previous tuned model intact."""
    staged = scratch / "model"
    model.save(str(staged))
    for p in staged.rglob("*"):  # inference needs no dropout; keep the saved config clean
        if p.name == "config.json" and (p.parent == staged):
            config = json.loads(p.read_text())
            config.update({k: 0.0 for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop") if k in config})
            p.write_text(json.dumps(config, indent=2))
    replace_directory(staged, out_dir)
