"""Documents into the store: `store_wanted_documents`, the one write path, and what it is made of (the
content hash, chunks and their vectors).

`pipeline embed` (embed/run.py, which decides what changed in the source), the server's document API
(search/serve/, through workflows.py and `upsert_documents`) and embed on Ray all store documents through
`store_wanted_documents`, so a document stored any way is chunked, embedded, hashed, staged, published and
recorded alike.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from common.console import info
from common.embedder import embed_token_ids, embedding_text, encode, fed_token_ids, model_token_ids
from common.errors import PipelineError
from common.manifest import EmbedderEntry, embedder_key, write_section
from common.readers import Document
from common.store import ChunkRow, Store
from common.workspace import Workspace
from embed.chunking import chunk_texts, tokenized_whole, whole_text_chunk


@dataclass
class Embedding:
    """What stored vectors are made with: the loaded model, its tokenizer (text_tokenizer), where it is
    (its fingerprint names it in the store and the manifest) and the chunking."""

    model: Any
    tokenizer: Any
    model_dir: Path
    fingerprint: str
    chunk_tokens: int
    overlap: int
    batch_size: int = 64  # chunks per forward pass
    embed_inputs: Callable[[list[np.ndarray]], np.ndarray] | None = None  # elsewhere: actors on a Ray cluster

    @property
    def dim(self) -> int:
        return self.model.get_embedding_dimension()


def upsert_documents(
    ws: Workspace,
    store: Store,
    embedding: Embedding,
    documents: list[Document],
    digests: dict[str, str],
    remove: list[str] = (),
) -> EmbedderEntry:
    """Store `documents` (doc_id -> content_hash in `digests`) and delete `remove`, in one publish: the
    document API's write (store_wanted_documents)."""
    store.want_documents([(d.id, digests[d.id]) for d in documents])
    return store_wanted_documents(
        ws, store, embedding, lambda positions: ((documents[p], digests[documents[p].id]) for p in positions), remove
    )


def store_wanted_documents(
    ws: Workspace,
    store: Store,
    embedding: Embedding,
    documents_at: Callable[[np.ndarray], Iterable[tuple[Document, str]]],
    remove: list[str] = (),
    remove_unread: bool = False,
    replace_all: bool = False,
    group_size: int = 1024,
    on_progress: Callable[[float], None] | None = None,
) -> EmbedderEntry:
    """Store the documents the store's run wants (Store.want_documents, want_read_documents) and delete
    `remove` (with remove_unread, every stored document the run did not read too), in one publish: what
    search sees changes at once (common/store/). documents_at(positions): the wanted documents at these
    positions (ascending) with their content hashes; the stored ones wanted again are read from the store.
    `replace_all`: these documents are the whole store (a new model or chunking embeds everything again).
    Documents an interrupted run of the same embedder staged already are not embedded again. Each group of
    `group_size` documents is written while the next is embedded (DuckDB lets go of the GIL as it inserts).
    on_progress(documents done, of those wanted) follows each batch. The manifest's "embedder" section (this
    is its one writer) records the result."""
    done = store.stage(embedding.dim, embedder_key(embedding.fingerprint, embedding.chunk_tokens, embedding.overlap))
    if done:  # staged already: progress counts them as done
        info(f"{done} of them were embedded by an interrupted run: resuming after them")
    positions, rowids = store.unstaged_documents()
    to_embed = itertools.chain(
        documents_at(positions), ((Document(*row[:5]), row[5]) for row in store.stored_documents(rowids))
    )
    next_id, embedded, chunks = store.next_chunk_id(), 0, 0
    with ThreadPoolExecutor(1) as writer:
        written = None
        while group := list(itertools.islice(to_embed, group_size)):
            rows, vectors = chunk_and_embed(
                [doc for doc, _ in group],
                embedding.model,
                embedding.tokenizer,
                embedding.chunk_tokens,
                embedding.overlap,
                next_id,
                embedding.embed_inputs,
                on_progress and (lambda share, before=done + embedded, n=len(group): on_progress(before + n * share)),
                embedding.batch_size,
            )
            next_id += len(rows)
            if written is not None:
                written.result()  # one group in writing at a time; its error is raised here
            written = writer.submit(store.write_documents, document_rows(group), rows, vectors)
            embedded += len(group)
            chunks += len(rows)
            if on_progress is not None:
                on_progress(done + embedded)
        if written is not None:
            written.result()
    changed = store.staged_otherwise_than_wanted()
    if changed is not None:  # embed reads its source twice (embed/survey.py): it changed in between
        raise PipelineError(f"document '{changed}' changed while `pipeline embed` read its source: run it again")
    if replace_all or done or embedded or remove or remove_unread:
        store.publish(replace_all, list(remove), remove_unread)
    counts = store.counts()
    entry = EmbedderEntry(
        model_path=ws.recorded_path(embedding.model_dir),
        fingerprint=embedding.fingerprint,
        dim=embedding.dim,
        chunk_tokens=embedding.chunk_tokens,
        overlap=embedding.overlap,
        documents=counts["documents"],
        chunks=counts["chunks"],
        store_generation=store.generation(),
        report={"embedded_documents": embedded, "embedded_chunks": chunks},
    )
    write_section(ws, entry)
    return entry


_SORTED_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(..., sort_keys=True), without a new encoder per call


def content_hash(doc: Document) -> str:
    """Changes with anything stored about the document (the metadata counts only when there is some, so
    documents stored before metadata was kept keep their hash)."""
    parts = (doc.title, doc.source, doc.text) + ((_SORTED_JSON.encode(doc.metadata),) if doc.metadata else ())
    digest = hashlib.sha256()
    for i, part in enumerate(parts):  # the hash of "\x1f".join(parts), without a copy of a large text joined
        digest.update(b"\x1f" if i else b"")
        digest.update(part.encode())
    return digest.hexdigest()


def document_rows(documents: list[tuple[Document, str]]) -> list[tuple[str, str, str, str, str, dict]]:
    """The rows Store.write_documents takes, of (document, its content_hash) pairs."""
    return [(d.id, d.title, d.source, d.text, digest, d.metadata) for d, digest in documents]


def chunk_and_embed(
    docs: list[Document],
    model,
    tokenizer,
    chunk_tokens: int,
    overlap: int,
    first_chunk_id: int,
    embed_inputs: Callable[[list[np.ndarray]], np.ndarray] | None = None,
    on_progress: Callable[[float], None] | None = None,
    batch_size: int = 64,
) -> tuple[list[ChunkRow], np.ndarray]:
    """The documents' chunks, numbered from first_chunk_id, and their vectors (the title, then the chunk).

    `tokenizer`: text_tokenizer(model). The model is fed token ids (fed_token_ids): each document is
    tokenized once (by the fast tokenizer when there is one: model_token_ids) for its chunks and their
    vectors, and only a document longer than a chunk again with character offsets to cut it; a chunk's
    input is its title's tokens and a newline's, then its own (embed_token_ids: a static model averages
    their vectors, a transformer gets its special tokens around them). `embed_inputs` embeds those inputs
    elsewhere (actors on a Ray cluster). A transformer whose tokenizer frames texts in a way
    encode_token_ids does not know embeds each chunk's text. on_progress(share of the chunks embedded)
    follows each batch."""
    if not fed_token_ids(model, tokenizer):
        return _chunk_and_embed_texts(
            docs, model, tokenizer, chunk_tokens, overlap, first_chunk_id, on_progress, batch_size
        )
    token_ids_of = model_token_ids(model)
    # A text tokenized in pieces is long whatever its tokens: chunk_texts alone tokenizes it.
    token_ids = token_ids_of([d.text if tokenized_whole(d.text) else "" for d in docs])
    long = [i for i, d in enumerate(docs) if not tokenized_whole(d.text) or len(token_ids[i]) > chunk_tokens]
    chunks_of = dict(zip(long, chunk_texts([docs[i].text for i in long], tokenizer, chunk_tokens, overlap)))
    title_ids = token_ids_of([f"{d.title}\n" for d in docs])
    rows, inputs = [], []
    for i, doc in enumerate(docs):
        for c in chunks_of.get(i) or [whole_text_chunk(doc.text, token_ids[i])]:
            rows.append(
                ChunkRow(first_chunk_id + len(rows), doc.id, c.index, c.text, c.start_char, c.end_char, c.n_tokens)
            )
            ids = np.asarray(c.token_ids, np.int32)
            inputs.append(np.concatenate((np.asarray(title_ids[i], np.int32), ids)) if doc.title else ids)
    if not inputs:
        return rows, np.zeros((0, model.get_embedding_dimension()), np.float32)
    if embed_inputs is not None:
        vectors = embed_inputs(inputs)
        if on_progress is not None:
            on_progress(1.0)
        return rows, vectors
    return rows, embed_token_ids(model, inputs, batch_size, on_progress and (lambda n: on_progress(n / len(inputs))))


def _chunk_and_embed_texts(
    docs: list[Document],
    model,
    tokenizer,
    chunk_tokens: int,
    overlap: int,
    first_chunk_id: int,
    on_progress: Callable[[float], None] | None,
    batch_size: int,
) -> tuple[list[ChunkRow], np.ndarray]:
    """chunk_and_embed for a transformer that cannot be fed token ids: each chunk's text is encoded."""
    rows: list[ChunkRow] = []
    texts: list[str] = []
    for doc, chunks in zip(docs, chunk_texts([d.text for d in docs], tokenizer, chunk_tokens, overlap)):
        for c in chunks:
            rows.append(
                ChunkRow(first_chunk_id + len(rows), doc.id, c.index, c.text, c.start_char, c.end_char, c.n_tokens)
            )
            texts.append(embedding_text(doc.title, c.text))
    if not texts:
        return rows, np.zeros((0, model.get_embedding_dimension()), np.float32)
    return rows, encode(model, texts, batch_size, on_progress and (lambda n: on_progress(n / len(texts))))
