"""`pipeline embed`: ingest documents, chunk them, embed the chunks, store everything in DuckDB.

Only new or changed documents (by content hash) are embedded, unless the model or the chunking changed:
then every document is, the stored ones from their stored text. The source is read twice, and held by
neither pass: once to list every document's id and hash in the store, where DuckDB finds what changed,
then again for the documents to embed (embed/survey.py). Documents are staged in groups, each group in one
transaction, so an interrupted run resumes where it stopped; search sees the run's documents once they
are all written, in one transaction (common/store/).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from common.console import err, info
from common.default_corpus import DEFAULT_CORPUS_SOURCE, stdlib_documents
from common.embedder import fed_token_ids, is_static, load_embedder, text_tokenizer, token_limit
from common.errors import PipelineError
from common.manifest import EmbedderEntry, embedder_key, read_manifest
from common.readers import Document, read_documents
from common.store import Store
from common.workspace import Workspace, model_fingerprint
from embed import appended
from embed.ingest import Embedding, store_wanted_documents
from embed.settings import EmbedSettings
from embed.survey import documents_at, survey
from embed.tune import default_model_dir

# Documents per group on Ray: each group is one Ray Data pipeline, which starts its own actor pool (every
# actor loads the model: ~2 s a group on SciFact), so groups there are larger.
RAY_GROUP_SIZE = 16_384
# Room left in each model input for the document title that precedes the chunk.
TITLE_TOKENS = 32
# From this many documents a static model averages with torch (its import, ~2 s, then pays for itself:
# common/embedder.py StaticEmbedder.mean_with_torch); below, numpy is faster overall.
TORCH_MEAN_DOCUMENTS = 20_000


@dataclass
class EmbedRun:
    """What `pipeline embed` did: the embedder section it recorded (the store's documents and chunks now), what
    it embedded, and how many documents of appended-to JSON-lines files it did not read again."""

    embedder: EmbedderEntry
    embedded_documents: int
    embedded_chunks: int
    documents_read_before: int
    seconds: float

    @property
    def docs_per_s(self) -> float | None:
        return self.embedded_documents / self.seconds if self.seconds else None

    def to_json(self) -> dict:
        """`pipeline embed --json`: the embedder section, with the run's figures."""
        run = {"documents_read_before": self.documents_read_before, "seconds": self.seconds}
        return {**self.embedder.to_json(), **run, "docs_per_s": self.docs_per_s}


def source_paths(ws: Workspace, data: list[Path]) -> list[Path] | None:
    """The user's --data, or else the files pretraining read; None for the built-in corpus."""
    if data:
        return data
    tokenizer = read_manifest(ws).tokenizer
    sources = tokenizer.sources if tokenizer else None
    if not sources:
        raise PipelineError("no --data given and the workspace records no pretraining data to reuse")
    if sources == [DEFAULT_CORPUS_SOURCE]:  # the same built-in corpus pretrain used
        info("no --data given: reading the built-in corpus pretraining used")
        return None
    info(f"no --data given: reading the pretraining data ({', '.join(sources)})")
    return [Path(s) for s in sources]


def source_documents(ws: Workspace, data: list[Path], text_field: str | None) -> Iterable[Document]:
    """The user's --data, or else the sources pretraining used (the built-in corpus included)."""
    paths = source_paths(ws, data)
    return stdlib_documents() if paths is None else read_documents(paths, text_field)


def run_embed(ws: Workspace, data: list[Path], text_field: str | None, settings: EmbedSettings) -> EmbedRun:
    model_dir = settings.model_dir or default_model_dir(ws)  # the tuned model if `pipeline tune` made one
    if settings.model_dir is None and not any((model_dir / f).exists() for f in ("config.json", "modules.json")):
        raise PipelineError(f"no model in {model_dir}: run `pipeline pretrain` first, or pass --model DIR")
    if not model_dir.exists():
        raise PipelineError(f"--model {model_dir}: no such directory")
    paths = source_paths(ws, data)
    with Store(ws.db_path, bulk=True) as store:
        source = survey(store, paths, text_field)  # bad input fails before the model loads
        model = load_embedder(model_dir)
        if settings.chunk_tokens is None:  # the model's: the overlap is checked against it here
            settings.chunk_tokens = max(32, token_limit(model) - TITLE_TOKENS)
            if settings.overlap >= settings.chunk_tokens:
                raise PipelineError(
                    f"--overlap {settings.overlap}: not below this model's chunk size ({settings.chunk_tokens} "
                    "tokens); give a smaller --overlap or a --chunk-tokens"
                )
        tokenizer = text_tokenizer(model)
        fingerprint = model_fingerprint(model_dir)
        key = embedder_key(fingerprint, settings.chunk_tokens, settings.overlap)
        embed_inputs = None  # here, unless on Ray
        if settings.ray:
            if not fed_token_ids(model, tokenizer):
                raise PipelineError(
                    f"--ray: the model's tokenizer ({model_dir}) adds special tokens in a way the Ray path "
                    "cannot reproduce from token ids; embed without --ray"
                )
            from embed.ray_encode import RayEncoder

            ray_encoder = RayEncoder(settings.ray, model_dir, settings.batch_size)
            info(f"embedding on Ray ({settings.ray}) with {ray_encoder.workers} model actors")
            embed_inputs = ray_encoder  # the actors take a group's chunks at once

        rebuild = store.get_meta("embedder") != key
        if rebuild and source.read_before:  # every document is embedded again: the lines read before too
            source = survey(store, paths, text_field, resume=False)
        stored = store.counts()["documents"]
        # the stored documents the run did not read: those of files skipped as unreadable are kept, --prune or not
        kept, unreadable = store.unreadable_count()
        gone = store.unread_count() - kept
        # new vectors for every document on a rebuild: the source's and the stored ones that are not pruned
        todo = store.want_read_documents(changed_only=not rebuild, stored_unread=rebuild, pruned=settings.prune)
        if rebuild:
            if stored:
                info(
                    f"the embedding model or chunking changed: all {todo} documents are embedded again "
                    f"({todo - source.documents} stored ones that are not in the source from their stored text)"
                )
        else:
            info(
                f"{source.documents} documents: {todo} new or changed, {source.documents - todo} unchanged"
                + (f" ({source.read_before} of them in lines read before)" if source.read_before else "")
            )
        if gone:
            info(
                f"pruning {gone} stored documents no longer in the source"
                if settings.prune
                else f"{gone} stored documents are not in the source (kept; --prune removes them)"
            )
        if kept:
            info(
                f"kept {kept} stored documents of {unreadable} unreadable file{'s' if unreadable != 1 else ''} "
                "(--prune removes only documents whose file is gone or no longer holds them)"
            )
        if is_static(model):
            model.mean_with_torch = todo >= TORCH_MEAN_DOCUMENTS
        embedding = Embedding(
            model,
            tokenizer,
            model_dir,
            fingerprint,
            settings.chunk_tokens,
            settings.overlap,
            settings.batch_size,
            embed_inputs,
        )
        with Progress(
            TextColumn("embedding"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as bar:
            task = bar.add_task("embed", total=todo, rate="")
            start = time.perf_counter()

            def advance(documents_done: float) -> None:  # with every encoded batch
                bar.update(
                    task, completed=documents_done, rate=f"{documents_done / (time.perf_counter() - start):.1f} docs/s"
                )

            entry = store_wanted_documents(
                ws,
                store,
                embedding,
                lambda positions: documents_at(source, positions),
                remove_unread=settings.prune and gone > 0,
                replace_all=rebuild,
                on_progress=advance,
                group_size=max(settings.group_size, RAY_GROUP_SIZE) if settings.ray else settings.group_size,
            )
        appended.record(store, source)
        elapsed = time.perf_counter() - start

    run = EmbedRun(
        entry,
        entry.report["embedded_documents"],
        entry.report["embedded_chunks"],
        source.read_before,
        elapsed,
    )
    rate = f", {run.docs_per_s:.1f} docs/s" if run.embedded_documents else ""
    info(
        f"embedded {run.embedded_documents} documents ({run.embedded_chunks} chunks) in {elapsed:.1f}s{rate}; "
        f"store holds {entry.documents} documents, {entry.chunks} chunks"
    )
    return run
