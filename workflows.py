"""The workflows: what each `pipeline` command does, from its settings to its summary, chaining stages where
a command spans several. cli.py only parses options and renders what these return; a Python program calls
them the same way:

    from pathlib import Path
    import workflows
    from common.workspace import Workspace
    from pretrain.settings import PretrainSettings

    ws = Workspace("workspace")
    workflows.pretrain(ws, PretrainSettings(data=[Path("docs")], time_budget="5m"))   # then adapted to retrieval
    workflows.embed(ws, [Path("docs")])
    workflows.index(ws)                                                                # then the default mode measured

Stages never import each other (tests/workflows/test_layout.py); this module is where they meet:

    pretrain     pretrain/ trains and exports the model, then embed/ adapts it to retrieval (the embedder
                 kept by measurement, embed/choose.py), unless adapt=False
    tune         embed/: the static embedder, or with architecture auto the better of it and the transformer
    embed        embed/: new and changed documents into the store (embed/ingest.py upsert_documents)
    index        index/ brings the indexes up to the store (refresh_indexes); after a full build search/
                 measures the default mode on held-out corpus pairs (search/calibrate.py)
    search       search/: one query's ranked documents
    evaluate     search/: judged queries; with set_default the best mode becomes the default
    serve        search/serve/, its document API writing through write_documents: embed/'s upsert, then
                 index/'s refresh, the same two functions `pipeline embed` and `pipeline index` use
    status       what the workspace holds, and whether its parts belong together (the manifest's checks)
    plan         pretrain/planner/: parallel plans ranked by predicted step time

Each command's settings are one dataclass (PretrainSettings, TuneSettings, EmbedSettings, IndexSettings,
SearchSettings, EvalSettings, ServeSettings, PlanSettings), the same one the CLI makes from its options.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from common.console import info, quiet_libraries, warn
from common.errors import PipelineError, StoredNotIndexed, UnknownDocument, disk_full_error
from common.manifest import IndexEntry, ModelEntry, SearchEntry, TunedEntry, read_manifest, require
from common.workspace import Workspace, file_sha256, model_fingerprint
from pretrain.settings import PlanSettings
from search.settings import EvalSettings, SearchSettings, ServeSettings

if TYPE_CHECKING:  # types only: the readers import DuckDB, the evaluation pytrec_eval, which light commands do without
    from common.readers import Document
    from embed.run import EmbedRun
    from search.evaluate import ModeScores
    from search.serve.generation import DocumentsWritten

quiet_libraries()  # the libraries' own notices reach no user, of the CLI or of these functions


PRETRAIN_SHARE = 0.4  # of `pipeline pretrain`'s time budget, planned for pretraining when the adaptation follows
MIN_ADAPTATION_SHARE = 0.1  # the least the adaptation gets, even after a pretraining that ran over


@dataclass
class Phase:
    """A phase of a command's time budget: the seconds planned for it (None: no budget) and those it took."""

    planned_s: float | None
    actual_s: float | None


@dataclass
class BudgetSplit:
    """How `pipeline pretrain`'s budget was divided between pretraining and the adaptation, and why; then what
    the adaptation took of its part, and why."""

    pretraining_planned_s: float
    pretraining_s: float
    adaptation_s: float
    why: str
    adaptation_took_s: float | None = None
    adaptation_why: str | None = None


@dataclass
class PretrainRun:
    """What `pipeline pretrain` did: the model section it recorded (None on nodes other than the first), the
    adaptation's tuned section, how the budget was split, and each phase's seconds."""

    model: ModelEntry | None
    phases: dict[str, Phase]
    budget_split: BudgetSplit | None = None
    adaptation: TunedEntry | None = None

    def to_json(self) -> dict:
        """`pipeline pretrain --json`: the model section, with the rest under "budget_split", "adaptation" and
        "phases"."""
        value = self.model.to_json() if self.model else {}
        if self.budget_split:
            value["budget_split"] = asdict(self.budget_split)
        if self.adaptation:
            value["adaptation"] = self.adaptation.to_json()
        return {**value, "phases": {name: asdict(phase) for name, phase in self.phases.items()}}


def pretrain(ws: Workspace, settings, adapt: bool = True) -> PretrainRun:
    """Pretrain (pretrain/run.py), then adapt the model to retrieval on the same documents, with `pipeline
    tune`'s defaults. The time budget is the whole command's: pretraining is planned in PRETRAIN_SHARE of
    it, and the adaptation (embed/choose.py) in whatever pretraining left, which is more when the corpus is
    too small to use its share (pretrain/sizing.py's MAX_EPOCHS)."""
    import time

    from embed.choose import adapt as adapt_embedder
    from embed.run import source_documents
    from embed.settings import TuneSettings
    from embed.tune import tuning_documents
    from pretrain.run import run_pretrain

    started = time.perf_counter()
    budget = settings.time_budget_seconds
    adapting = adapt and settings.node_rank == 0  # the other nodes only train
    pretraining_s = budget * PRETRAIN_SHARE if adapt else budget  # every node sizes alike
    run = PretrainRun(run_pretrain(ws, settings, pretraining_s), phases={})
    pretrained = Phase(None if settings.shape_given else pretraining_s, time.perf_counter() - started)
    run.phases["pretraining"] = pretrained
    if adapting:
        info("adapting the pretrained model to retrieval on the same documents (--no-adapt skips this)")
        # a pretraining of a given length (or resumed) has no share of the budget: the adaptation keeps its own
        left = budget - pretrained.actual_s
        adaptation_s = budget * (1 - PRETRAIN_SHARE) if settings.shape_given or settings.resume else left
        if adaptation_s < budget * MIN_ADAPTATION_SHARE:
            warn(
                f"pretraining took {pretrained.actual_s:.0f}s of the {budget:.0f}s budget: the "
                f"adaptation gets {budget * MIN_ADAPTATION_SHARE:.0f}s, over the budget"
            )
            adaptation_s = budget * MIN_ADAPTATION_SHARE
        if not (settings.shape_given or settings.resume):
            run.budget_split = budget_split(run.model, pretraining_s, pretrained.actual_s, adaptation_s)
            info(run.budget_split.why)
        documents = tuning_documents(source_documents(ws, settings.data, settings.text_field))
        static = TuneSettings(architecture="static", wandb=settings.wandb)
        run.adaptation = adapt_embedder(ws, documents, adaptation_s, static)
        figures = run.adaptation.report
        if run.budget_split:
            run.budget_split.adaptation_took_s = figures["seconds_total"]
            run.budget_split.adaptation_why = adaptation_ending(run.adaptation, adaptation_s, static.steps)
            info(run.budget_split.adaptation_why)
        run.phases["adaptation"] = Phase(adaptation_s, figures["seconds_total"])
        run.phases.update({f"adaptation: {name}": Phase(**times) for name, times in figures["phases"].items()})
    planned = None if settings.shape_given and not adapting else budget  # a given length has no budget
    run.phases["total"] = Phase(planned, time.perf_counter() - started)
    info(phases_line(run.phases))
    return run


def budget_split(model: ModelEntry, planned_s: float, pretraining_s: float, adaptation_s: float) -> BudgetSplit:
    """How the budget was divided between pretraining and the adaptation, and why: pretraining is planned in
    PRETRAIN_SHARE, and what it does not use goes to the adaptation, when validation loss stopped falling
    (early stopping) or the corpus was worth fewer epochs than the share could train (sizing's cap)."""
    handed_over = planned_s - pretraining_s
    if model.stopped_early:
        reason = (
            f"pretraining stopped at step {model.steps} of {model.planned_steps}: validation loss stopped "
            f"falling (best {model.best_val_loss:.4f} at step {model.best_step})"
        )
    elif (model.report.get("prediction") or {}).get("sizing", {}).get("capped_at_max_epochs"):
        reason = "the corpus is worth fewer epochs of pretraining than its share could train"
    elif handed_over < 0:
        reason = f"pretraining ran {-handed_over:.0f}s over its share"
    else:
        reason = "pretraining used its share"
    given = f": the {handed_over:.0f}s it did not use go to the adaptation" if handed_over >= 1 else ""
    why = f"budget: {reason}{given} ({pretraining_s:.0f}s pretraining, {adaptation_s:.0f}s adaptation)"
    return BudgetSplit(planned_s, pretraining_s, adaptation_s, why)


def adaptation_ending(tuned: TunedEntry, planned_s: float, steps_asked: int) -> str:
    """What the adaptation took of its part of the budget, and what ended it: the steps asked for, the pairs
    the corpus gives, or the time (the plan's steps, or a deadline the steps ran into)."""
    from embed.tune import MAX_PAIR_REPEATS

    report, embedder = tuned.report, f"the {tuned.architecture} embedder"
    timed = (report.get("plan") or {}).get("steps", report["planned_steps"])  # the steps the time allowed
    if tuned.steps < report["planned_steps"]:
        reason = f"{embedder}'s steps took longer than planned: {tuned.steps} of {report['planned_steps']} ran"
    elif report["planned_steps"] < timed:
        bound = "asked for" if timed >= steps_asked else "the time allowed"  # the plan takes the fewer of the two
        reason = (
            f"the corpus gave pairs for {report['planned_steps']} steps of the {timed} {bound} "
            f"(no pair is trained more than {MAX_PAIR_REPEATS} times)"
        )
    elif timed >= steps_asked:
        reason = f"{embedder} ran all {steps_asked} steps asked for (`pipeline tune --steps N` sets another number)"
    else:
        phase = report.get("phases", {}).get(tuned.architecture) or {}
        reason = f"{embedder} ran the {timed} steps planned to fit its {phase.get('planned_s', planned_s):.0f}s"
        if phase.get("actual_s") is not None:
            reason += f"; they took {phase['actual_s']:.0f}s"
    return f"adaptation: {report['seconds_total']:.0f}s of its {planned_s:.0f}s: {reason}"


def phases_line(phases: dict[str, Phase]) -> str:
    """Where the time went: each phase's planned and actual seconds."""

    def seconds(value) -> str:
        return "-" if value is None else f"{value:.0f}s"

    return "time: " + "; ".join(
        f"{name} {seconds(phase.actual_s)} (planned {seconds(phase.planned_s)})" for name, phase in phases.items()
    )


def tune(ws: Workspace, data: list[Path], text_field: str | None, settings) -> TunedEntry:
    """`pipeline tune` (settings: embed/settings.py TuneSettings): with architecture auto, the static embedder
    and, when its steps fit the budget, the transformer, the better kept (embed/choose.py); else the one
    architecture asked for, its steps planned to fit the budget. Either way the budget is the whole command's."""
    from embed.choose import adapt
    from embed.run import source_documents
    from embed.tune import run_tune, tuning_documents

    documents = tuning_documents(source_documents(ws, data, text_field))
    if settings.architecture == "auto":
        static = replace(settings, architecture="static", pooling="mean")
        return adapt(ws, documents, settings.time_budget_seconds, static, transformer_pooling=settings.pooling)
    return run_tune(ws, documents, settings, budget_s=settings.time_budget_seconds)


def embed(ws: Workspace, data: list[Path], text_field: str | None = None, settings=None) -> EmbedRun:
    """`pipeline embed`: the source's new and changed documents into the store, as the workspace's one writer."""
    from embed.run import run_embed
    from embed.settings import EmbedSettings

    ws.create()
    with ws.writing():
        return run_embed(ws, data, text_field, settings or EmbedSettings())


@dataclass
class IndexRun:
    """What `pipeline index` did: the index section it recorded and, when it measured the default search mode
    (after a full build), the search section it recorded."""

    index: IndexEntry
    measured: bool = False
    search: SearchEntry | None = None  # None when measured: judged queries had chosen, or no text to measure on

    def to_json(self) -> dict:
        """`pipeline index --json`: the index section, and the search section under "search" when measured."""
        search = {"search": self.search.to_json() if self.search else None} if self.measured else {}
        return {**self.index.to_json(), **search}


def index(ws: Workspace, settings=None) -> IndexRun:
    """`pipeline index` (settings: index/settings.py IndexSettings): the indexes brought up to the store; a full
    build then measures the default search mode (an update changes too little to measure again), as does a run
    finding its full build unchanged and without its measurement (a killed run's)."""
    from common.embedder import load_embedder
    from index.build import refresh_indexes
    from index.settings import IndexSettings
    from search.calibrate import choose_default_mode

    settings = settings or IndexSettings()
    with ws.writing():
        entry = refresh_indexes(
            ws,
            settings.index_type,
            settings.rebuild,
            settings.language,
            memory_budget=settings.memory_budget_bytes,
            shards=settings.shards,
            ray=settings.ray,
        )
        run = IndexRun(entry)
        manifest = read_manifest(ws)
        # a killed run's full build beside the last build's measurement (updated since or not): measured now
        base_unmeasured = manifest.search is not None and not manifest.search.measured_for(manifest.index)
        if entry.update == "full" or base_unmeasured:
            embedder = require(ws, "embedder", "run `pipeline embed` first")
            run.measured = True
            run.search = choose_default_mode(ws, load_embedder(embedder.model_dir(ws)), entry.embedder_fingerprint)
    return run


def search(ws: Workspace, query: str, settings: SearchSettings | None = None) -> list:
    """`pipeline search`: the ranked hits (search/engine.py Hit) for one query."""
    from search.engine import SearchEngine, short_text

    settings = settings or SearchSettings()
    engine = SearchEngine(ws, load_model=False)  # the query model loads only if a dense search asks for it
    name = f'"{short_text(query, 40)}"'
    return engine.search_many(
        [query], settings.k, settings.mode, settings.document_filter(), settings.dense_weight, names=[name]
    )[0]


def plan(ws: Workspace, settings: PlanSettings | None = None):
    """`pipeline plan`: every parallel plan for the settings' model and batch ranked (pretrain/planner), on the
    cluster a TOML file describes or, without one, on this machine as measured (the measurement cached in the
    workspace)."""
    from pretrain.planner.auto import get_cluster, plan_for, workload_from_args

    s = settings or PlanSettings()
    work = workload_from_args(s.preset, s.model_config, s.seq_len, s.global_batch, s.vocab_size, s.bf16)
    if s.cluster is None:
        ws.create()
    return plan_for(work, get_cluster(ws, s.cluster, s.nproc, s.remeasure), s.nproc, s.dp, s.tp, s.pp)


def evaluate(ws: Workspace, settings: EvalSettings) -> list[ModeScores]:
    """`pipeline eval`: nDCG@10, Recall@100 and MRR@10 per mode (mode "all": every mode the index has); with
    set_default the best by nDCG@10, with the dense weight used, becomes the workspace's default mode."""
    from search.calibrate import record_default_mode
    from search.engine import SearchEngine
    from search.evaluate import evaluate as evaluate_queries
    from search.evaluate import modes_to_run, read_qrels, read_queries

    s = settings
    judged, texts = read_qrels(s.qrels), read_queries(s.queries)
    engine = SearchEngine(ws, load_model=False)
    modes = modes_to_run(engine, s.mode) if s.mode else [None]
    reports = [evaluate_queries(engine, texts, judged, m, s.k, s.dense_weight, s.document_filter()) for m in modes]
    if s.set_default:
        best = max(reports, key=lambda r: r.ndcg_at_10)
        record_default_mode(
            ws,
            best.mode,
            engine.resolve_dense_weight(s.dense_weight),
            engine.index_entry.embedder_fingerprint,
            "judged queries",
            {"ndcg@10": {r.mode: r.ndcg_at_10 for r in reports}, "queries": str(s.queries), "qrels": str(s.qrels)},
        )
        info(f"default mode for this workspace: {best.mode} (nDCG@10 {best.ndcg_at_10:.4f})")
    return reports


def write_documents(ws: Workspace, engine, upserts: list[Document], deletes: list[str]) -> DocumentsWritten:
    """The document API's write (search/serve/): store `upserts` (the new and changed ones embedded with the
    served model) and delete `deletes` in one publish (embed/ingest.py upsert_documents), then update the
    indexes (index/build.py refresh_indexes, an update even past its rebuild share: the server must answer
    quickly). The caller holds the workspace's writer lock."""
    from common.store import Store
    from embed.ingest import Embedding, content_hash, upsert_documents
    from index.build import refresh_indexes
    from search.serve.generation import DocumentsWritten, IndexUpdated

    embedder = require(ws, "embedder", "run `pipeline embed` first")
    with Store(ws.db_path) as store:
        embedder.check_store(store.get_meta("embedder"), ws.db_path)
        stored = store.document_hashes([d.id for d in upserts] + list(deletes))
        missing = [doc_id for doc_id in deletes if doc_id not in stored]
        if missing:
            raise UnknownDocument(f"no document with id '{missing[0]}'")
        digests = {d.id: content_hash(d) for d in upserts}
        todo = [d for d in upserts if stored.get(d.id) != digests[d.id]]
        if not todo and not deletes:
            return DocumentsWritten(stored=0, unchanged=len(upserts), deleted=0, store_generation=store.generation())
        with engine.embedding_model() as (model, tokenizer):
            embedding = Embedding(
                model, tokenizer, embedder.model_dir(ws), embedder.fingerprint, embedder.chunk_tokens, embedder.overlap
            )
            stored_entry = upsert_documents(ws, store, embedding, todo, digests, remove=deletes)
    try:
        index = refresh_indexes(ws, full_build_allowed=False)
    except Exception as e:  # the store has them: the reply must say so, whatever stopped the index update
        reason = disk_full_error(e) or (str(e).splitlines() or [type(e).__name__])[0]
        raise StoredNotIndexed(
            f"the documents are stored (store generation {stored_entry.store_generation}) but the index could "
            f"not be updated ({reason}); they become searchable once it is (`pipeline index`, or a server restart)"
        ) from e
    return DocumentsWritten(
        stored=len(todo),
        unchanged=len(upserts) - len(todo),
        deleted=len(deletes),
        store_generation=stored_entry.store_generation,
        index=IndexUpdated(
            index.update, index.update_reason, index.vectors, index.delta_vectors, index.deleted_in_base
        ),
    )


def serve(ws: Workspace, settings: ServeSettings | None = None) -> None:
    """`pipeline serve`: the HTTP API and page; the document API writes through write_documents. With `ray`,
    on the Ray cluster of `settings.ray`, each shard a Ray Serve deployment of `settings.replicas` replicas."""
    s = settings or ServeSettings()
    finish_interrupted_write(ws)
    if s.ray is None:
        from search.serve.app import run_server

        run_server(ws, s.host, s.port, s.api_key, write_documents)
        return
    from common.ray_cluster import INSTALL_HINT

    try:
        from search.serve.ray_serve import serve_on_ray
    except ImportError:  # Ray, or its Serve part, is not installed
        raise PipelineError(INSTALL_HINT) from None

    serve_on_ray(ws, s.ray, s.host, s.port, s.api_key, write_documents, s.replicas)


def finish_interrupted_write(ws: Workspace) -> None:
    """A server killed between a write's store commit and its index update leaves the store ahead of the
    index (as does `pipeline embed` without `pipeline index`). When the index can be brought up to date from
    the store (it holds the current embedder's vectors), do it before serving, as `pipeline index` would,
    instead of refusing to start until someone runs it."""
    from index.build import refresh_indexes

    manifest = read_manifest(ws)
    index, embedder = manifest.index, manifest.embedder
    if index is None or embedder is None or index.corpus_path is None or not index.built_by(embedder):
        return
    if index.stale_reason(embedder.store_generation) is None:
        return
    info(
        f"the documents changed since the index was built (store generation {embedder.store_generation}, index "
        f"built from {index.store_generation}): updating the index before serving"
    )
    with ws.writing():
        refresh_indexes(ws)


@dataclass(frozen=True)
class PartStatus:
    state: str  # ok, missing, changed, stale, none (an optional part) or default (no measured search mode)
    detail: str


@dataclass(frozen=True)
class WorkspaceStatus:
    """`pipeline status`: each part's state, and the problems that make the workspace inconsistent."""

    workspace: str
    parts: dict[str, PartStatus]
    problems: list[str]

    def to_json(self) -> dict:
        return asdict(self)


def status(ws: Workspace) -> WorkspaceStatus:
    """`pipeline status`: each part's state and detail, and the problems found, by the manifest's own checks."""
    from common.store import Store

    if not ws.manifest_path.exists():
        raise PipelineError(
            f"no workspace at {ws.root} (no {ws.manifest_path.name}): `pipeline pretrain` "
            "or `pipeline embed --model DIR` makes one"
        )
    manifest = read_manifest(ws)
    generation, counts = None, None
    if manifest.embedder and ws.db_path.exists():
        with Store(ws.db_path, read_only=True) as store:
            counts, generation = store.counts(), store.generation()
    checked = {
        "tokenizer": tokenizer_status(ws, manifest.tokenizer),
        "model": model_status(ws, manifest.model),
        "tuned": tuned_status(ws, manifest.tuned),
        "vectors": vectors_status(ws, manifest.embedder, counts),
        "index": index_status(ws, manifest.index, manifest.embedder, generation),
    }
    if manifest.index:
        checked["search"] = search_status(manifest.search, manifest.index)
    return WorkspaceStatus(
        workspace=str(ws.root),
        parts={name: PartStatus(state, detail) for name, (state, detail, _) in checked.items()},
        problems=[problem for _, _, problem in checked.values() if problem],
    )


# Each part's (state, detail, problem or None).


def tokenizer_status(ws: Workspace, tok) -> tuple[str, str, str | None]:
    if tok is None:
        return "missing", "run `pipeline pretrain`", None
    path = ws.tokenizer_dir / "tokenizer.json"
    detail = f"{tok.vocab_size} tokens, trained on {tok.documents} documents"
    if path.exists() and file_sha256(path) == tok.sha256:
        return "ok", detail, None
    return "changed", detail, f"{path} differs from the tokenizer recorded in the manifest"


def model_status(ws: Workspace, model) -> tuple[str, str, str | None]:
    if model is None:
        return "missing", "run `pipeline pretrain`", None
    detail = (
        f"{model.preset} preset, {model.parameters / 1e6:.1f}M parameters, {model.steps} steps, id {model.fingerprint}"
    )
    if ws.model_dir.exists() and model_fingerprint(ws.model_dir) == model.fingerprint:
        return "ok", detail, None
    return "changed", detail, f"{ws.model_dir} differs from the model recorded in the manifest"


def tuned_status(ws: Workspace, tuned) -> tuple[str, str, str | None]:
    """A stale tuned embedder is no fault: embed then uses the pretrained model (and says so)."""
    if tuned is None:
        return "none", "optional: `pipeline tune` makes a better embedder", None
    detail = (
        f"{tuned.architecture} embedder, {tuned.steps} steps, "
        f"loss {tuned.first_loss or 0:.3f} -> {tuned.final_loss or 0:.3f}, id {tuned.fingerprint}"
    )
    if not (ws.root / tuned.path).exists():
        return "missing", f"{ws.root / tuned.path} is gone: run `pipeline tune`", None
    if not tuned.tuned_from(ws):
        return "stale", f"{detail}; tuned from an older pretrained model: run `pipeline tune`", None
    return "ok", detail, None


def vectors_status(ws: Workspace, embedder, counts: dict | None) -> tuple[str, str, str | None]:
    if embedder is None or counts is None:
        return "missing", "run `pipeline embed`", None
    model_dir = embedder.model_dir(ws)
    current = model_fingerprint(model_dir) if model_dir.exists() else None
    detail = (
        f"{counts['documents']} documents, {counts['chunks']} chunks, "
        f"{counts['vectors']} vectors from model {embedder.fingerprint} ({model_dir})"
    )
    if current == embedder.fingerprint:
        return "ok", detail, None
    return (
        "stale",
        detail,
        (
            f"the stored vectors were made by model {embedder.fingerprint}, but {model_dir} is now {current}: "
            "run `pipeline embed`"
        ),
    )


def index_status(ws: Workspace, index, embedder, store_generation: int | None) -> tuple[str, str, str | None]:
    if index is None:
        return "missing", "run `pipeline index`", None
    has_lexical = all(shard.lexical_path for shard in index.shard_entries())
    lexical = f", BM25 lexical index ({index.language})" if has_lexical else ", no lexical index"
    sharded = f" in {len(index.shards)} shards" if index.shards else ""
    delta = (
        f" ({index.delta_vectors} in the delta, {index.deleted_in_base} deleted from the base)"
        if index.delta_vectors or index.deleted_in_base
        else ""
    )
    recall = ""
    if index.recall_at_10 is not None:
        short = f", below the {index.recall_target} target" if index.recall_short else ""
        recall = f", recall@10 {index.recall_at_10:.3f}{short}"
    detail = f"{index.type}, {index.vectors} vectors{sharded}{delta}{recall}{lexical}"
    missing = [path for path in index.all_paths if not (ws.root / path).exists()]
    if missing:
        return "missing", detail, f"{ws.root / missing[0]} is missing: run `pipeline index`"
    if embedder and not index.built_by(embedder):
        return (
            "stale",
            detail,
            "the index was built from another model's vectors (or another chunking): run `pipeline index`",
        )
    if index.stale_reason(store_generation):
        return "stale", detail, index.stale_reason(store_generation)
    return "ok", detail, None


def search_status(measured, index) -> tuple[str, str, str | None]:
    if measured is None or not measured.measured_for(index):
        return (
            "default",
            "default mode lexical; `pipeline index` or `pipeline eval --mode all --set-default` measures the best",
            None,
        )
    weight = (
        f", dense weight {measured.dense_weight}"
        if measured.default_mode == "hybrid" and measured.dense_weight is not None
        else ""
    )
    return "ok", f"default mode {measured.default_mode}{weight} ({measured.measurement()})", None
