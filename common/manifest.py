"""The manifest (manifest.json): which tokenizer, model, embedder and index belong together.

One dataclass per section, each written by one writer only (named in its docstring) and read through
`read_manifest`. A section's fields are what other code reads from it; what a writer records only to
report (timings, pair counts, measured figures) is kept in `report` and written beside them, so the
JSON stays one flat object per section, as workspaces written before this module hold it (they are
read as they are: a field added since is None there).

Whether the parts still belong together is asked of the sections themselves (`IndexEntry.built_by`,
`IndexEntry.stale_reason`, `SearchEntry.measured_for`, `TunedEntry.tuned_from`): search, the server,
`pipeline status`, index updates and embed all use these, never their own comparison.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from common.errors import PipelineError
from common.workspace import Workspace, atomic_write_json, model_fingerprint


@dataclass
class Section:
    """A section: its declared fields, and `report`, the rest of what its writer recorded."""

    NAME: ClassVar[str]
    report: dict[str, Any] = field(default_factory=dict, kw_only=True)

    @classmethod
    def from_json(cls, value: dict[str, Any]):
        declared = {f.name for f in dataclasses.fields(cls)} - {"report"}
        known = {name: value[name] for name in declared if name in value}
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name in declared - set(known)
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise PipelineError(f"manifest.json: the {cls.NAME} section has no '{missing[0]}'")
        return cls(**known, report={k: v for k, v in value.items() if k not in declared})

    def to_json(self) -> dict[str, Any]:
        value = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "report"}
        return {**self.report, **value}


@dataclass
class TokenizerEntry(Section):
    """Written by pretrain/prepare.py when the data is prepared (and when continued pretraining adds to it)."""

    NAME: ClassVar[str] = "tokenizer"
    path: str
    sha256: str
    vocab_size: int
    sources: list[str] = field(default_factory=list)  # the --data paths read (embed and tune read them again)
    documents: int = 0


@dataclass
class ModelEntry(Section):
    """Written by pretrain/train.py when the model is exported."""

    NAME: ClassVar[str] = "model"
    path: str
    fingerprint: str
    preset: str = ""
    steps: int = 0
    planned_steps: int | None = None
    stopped_early: bool = False  # validation loss stopped falling before planned_steps
    best_step: int | None = None  # the step whose weights were exported (None: the last step's)
    best_val_loss: float | None = None
    parameters: int = 0


@dataclass
class TunedEntry(Section):
    """Written by embed/tune.py (`record_tuned`), for `pipeline tune` and the embedder choice alike."""

    NAME: ClassVar[str] = "tuned"
    path: str
    fingerprint: str
    base_fingerprint: str  # the pretrained model it was tuned from
    architecture: str = "transformer"  # tuned embedders from before the static one were transformers
    steps: int = 0
    first_loss: float | None = None
    final_loss: float | None = None

    def tuned_from(self, ws: Workspace) -> bool:
        """Whether it was tuned from the workspace's pretrained model as it is now (no pretrained model: yes)."""
        if not (ws.model_dir / "config.json").exists():
            return True
        return model_fingerprint(ws.model_dir) == self.base_fingerprint


def embedder_key(fingerprint: str, chunk_tokens: int, overlap: int) -> str:
    """What stored vectors were made with, the model and the chunking, as the store records it beside them
    (its "embedder" meta) and the manifest's embedder section says it (EmbedderEntry.store_key)."""
    return f"{fingerprint}|chunk={chunk_tokens}|overlap={overlap}"


@dataclass
class EmbedderEntry(Section):
    """Written by embed/ingest.py (`upsert_documents`), for `pipeline embed` and the document API alike."""

    NAME: ClassVar[str] = "embedder"
    model_path: str  # relative to the workspace for its own models (Workspace.recorded_path)
    fingerprint: str
    dim: int
    chunk_tokens: int
    overlap: int
    documents: int = 0
    chunks: int = 0
    store_generation: int | None = None

    @property
    def chunking(self) -> list[int]:
        return [self.chunk_tokens, self.overlap]

    @property
    def store_key(self) -> str:
        """What the store records as the embedder of its vectors (Store's "embedder" meta)."""
        return embedder_key(self.fingerprint, self.chunk_tokens, self.overlap)

    def check_store(self, stored_key: str | None, db_path: Path) -> None:
        if stored_key != self.store_key:
            # Only a `pipeline embed` killed after it changed the store and before the manifest leaves this.
            raise PipelineError(
                f"{db_path} holds vectors of another embedder than the manifest records "
                "(an interrupted `pipeline embed`?): run `pipeline embed` again"
            )

    def model_dir(self, ws: Workspace) -> Path:
        """The model the stored vectors were made with.

        Manifests written before paths were recorded relative to the workspace hold an absolute path even
        for the workspace's own model/ or tuned/. When this workspace has a directory of that name holding
        the recorded model (same fingerprint), that is the one meant: the workspace was moved or copied."""
        recorded = Path(self.model_path)
        if not recorded.is_absolute():
            return ws.root / recorded
        own = ws.root / recorded.name
        if own.is_dir() and own.resolve() != recorded.resolve() and model_fingerprint(own) == self.fingerprint:
            return own
        return recorded


@dataclass
class IndexEntry(Section):
    """Written by index/files.py (`record`), for `pipeline index` and the document API's updates alike."""

    NAME: ClassVar[str] = "index"
    path: str  # the base FAISS index
    type: str
    vectors: int
    embedder_fingerprint: str
    embedder_chunking: list[int] | None = None
    store_generation: int | None = None
    build_id: str | None = None
    delta_path: str | None = None  # the exact FAISS index of the chunks added since the base
    lexical_path: str | None = None
    base_vectors: int | None = None  # None: an index from before updates, which is rebuilt in full
    delta_vectors: int = 0
    deleted_in_base: int = 0
    analyzer: dict[str, Any] | None = None  # None: an index from before languages (English)
    update: str = "full"
    update_reason: str | None = None  # why a full build or an update (None in workspaces from before it was recorded)
    lists_path: str | None = None  # the base's IVF lists, when on disk (common/dense/ivf.py)
    rescore_path: str | None = None  # the int8 vectors an IVF base re-scores its candidates from
    trained_path: str | None = None  # an IVF base's empty trained index, which an update's delta is filled with
    centroid_distance: float | None = None  # how well an IVF base's lists fit its vectors (common/dense/ivf.py)
    delta_rescore_path: str | None = None  # the int8 vectors of an IVF delta
    search_setting: dict[str, int] | None = None  # the base's tuned search widths (efSearch, nprobe, rescore)
    recall_at_10: float | None = None  # the base's, against exact search; None for exact search
    recall_target: float | None = None
    recall_short: bool = False  # tuning could not reach recall_target
    corpus_path: str | None = (
        None  # the corpus snapshot search reads (common/snapshot/writer.py); None before snapshots
    )
    # A sharded index (index/shards.py): each shard's record, as an unsharded index's (paths under `path`, the
    # shards' directory, which corpus_path names too).
    shards: list[dict[str, Any]] | None = None

    @property
    def language(self) -> str:
        return (self.analyzer or {}).get("language", "en")

    @property
    def files(self) -> list[str]:
        """The FAISS indexes it is made of: the base, and the delta if there is one."""
        return [self.path] + ([self.delta_path] if self.delta_path else [])

    @property
    def all_paths(self) -> list[str]:
        """Every file and directory of the index the workspace holds (the FAISS indexes, the base's on-disk
        lists and rescoring vectors, the BM25 directory, the corpus snapshot)."""
        extra = [self.lists_path, self.rescore_path, self.trained_path, self.delta_rescore_path]
        return [p for p in [*self.files, *extra, self.lexical_path, self.corpus_path] if p]

    def shard_entries(self) -> list["IndexEntry"]:
        """The index's shards, each as an unsharded index's entry (what they share from this one): this one
        alone when it is not sharded."""
        if not self.shards:
            return [self]
        shared = {**self.to_json(), "shards": None}
        return [IndexEntry.from_json({**shared, **shard}) for shard in self.shards]

    def built_by(self, embedder: EmbedderEntry) -> bool:
        """Whether its vectors are the embedder's: the same model and the same chunking."""
        return self.embedder_fingerprint == embedder.fingerprint and self.embedder_chunking == embedder.chunking

    def stale_reason(self, store_generation: int | None) -> str | None:
        """Why it cannot answer for the store at `store_generation`, or None when it holds that generation."""
        if self.corpus_path is None:
            return "the index was built before search read a corpus snapshot: run `pipeline index`"
        if self.store_generation == store_generation:
            return None
        built_from = self.store_generation if self.store_generation is not None else "an older version"
        return (
            f"the documents changed since the index was built (store generation {store_generation}, index built "
            f"from {built_from}): run `pipeline index`"
        )


@dataclass
class SearchEntry(Section):
    """The default search mode. Written by search/calibrate.py (`record_default_mode`), for the measurement
    `pipeline index` makes and `pipeline eval --set-default` alike."""

    NAME: ClassVar[str] = "search"
    default_mode: str
    embedder_fingerprint: str
    dense_weight: float | None = None
    chosen_by: str = "judged queries"
    # the base index (IndexEntry.path) of the full build measured on held-out pairs; None for a choice on
    # judged queries (`pipeline eval --set-default`), which holds for any build of that embedder
    base_index: str | None = None

    def measured_for(self, index: IndexEntry) -> bool:
        """Whether this choice was made for `index`: its embedder, and for a measurement its full build (a
        killed `pipeline index` can leave a new build beside the last build's measurement)."""
        same_build = self.base_index is None or self.base_index == index.path
        return self.embedder_fingerprint == index.embedder_fingerprint and same_build

    def measurement(self) -> str:
        """What chose the mode, in a phrase: for a measurement, each mode's nDCG@10 with its standard error and
        the kind of pairs measured."""
        scores, errors = self.report.get("ndcg@10"), self.report.get("ndcg@10_se", {})
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.report.get("pair_kinds", {}).items())
        if not scores or not kinds:
            return f"chosen on {self.chosen_by}"
        order = [mode for mode in ("lexical", "dense", "hybrid") if mode in scores]
        each = ", ".join(
            f"{mode} {scores[mode]:.3f}" + (f" ± {errors[mode]:.3f}" if mode in errors else "") for mode in order
        )
        return f"chosen on {self.report['pairs']} {self.chosen_by} ({kinds}), nDCG@10 {each}"


SECTIONS = (TokenizerEntry, ModelEntry, TunedEntry, EmbedderEntry, IndexEntry, SearchEntry)


@dataclass
class Manifest:
    """The workspace's manifest as read: a section is None until its writer has run."""

    tokenizer: TokenizerEntry | None = None
    model: ModelEntry | None = None
    tuned: TunedEntry | None = None
    embedder: EmbedderEntry | None = None
    index: IndexEntry | None = None
    search: SearchEntry | None = None


def read_manifest(ws: Workspace) -> Manifest:
    raw = read_json(ws)
    return Manifest(**{cls.NAME: cls.from_json(raw[cls.NAME]) for cls in SECTIONS if raw.get(cls.NAME)})


def require(ws: Workspace, section: str, hint: str):
    """The manifest's section, or a one-line error saying what to run first."""
    entry = getattr(read_manifest(ws), section)
    if entry is None:
        raise PipelineError(f"workspace {ws.root} has no {section}: {hint}")
    return entry


def write_section(ws: Workspace, entry: Section) -> None:
    """Replace the entry's section of the manifest, atomically (each section's writer calls this)."""
    replace_section(ws, entry.NAME, entry.to_json())


def replace_section(ws: Workspace, name: str, value: dict[str, Any]) -> None:
    """One write of manifest.json (a test kills a command here, by the section's name)."""
    manifest = read_json(ws)
    manifest[name] = value
    atomic_write_json(ws.manifest_path, manifest)


def read_json(ws: Workspace) -> dict[str, Any]:
    if not ws.manifest_path.exists():
        return {}
    try:
        return json.loads(ws.manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise PipelineError(
            f"{ws.manifest_path}: corrupt manifest ({e}); the files it named are still there: "
            "run the stage that wrote them again"
        ) from e
