"""Search over the workspace: dense (embedding + FAISS), lexical (BM25) or hybrid (the two fused).

Both retrievers rank chunks; results are documents, each shown with its best-matching chunk.
Hybrid fuses the two document rankings by a convex combination of their normalised scores:
score(d) = w * z_dense(d) + (1 - w) * z_lexical(d), where z is a score standardised over its retriever's
top documents for the query (mean 0, deviation 1), and a document missing from one list gets that list's
lowest score. Unlike reciprocal rank fusion, this keeps how far apart the scores are, so a retriever
that is confident about one document outweighs one that barely prefers another: on SciFact's train
queries, with the static embedder, it lifted hybrid above BM25 (0.704 vs 0.696 nDCG@10) where RRF fell
below it (0.693); Bruch et al. (2023) found the same across BEIR.

The engine loads the indexes and the model once; `search` can then be called many times, from
several threads (FAISS and bm25s searches only read; each call uses its own DuckDB cursor).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb
import faiss
import numpy as np

from common.console import warn
from common.errors import PipelineError
from common.lexical import LexicalIndex
from common.models import encode, load_embedder, token_limit, truncate_to_model
from common.store import Store, stale_index_message
from common.workspace import Workspace, model_fingerprint

MODES = ("dense", "lexical", "hybrid")
# Which mode ranks best depends on the collection and the model: `pipeline index` measures it on held-out
# pairs of the corpus (search/calibrate.py) and `pipeline eval --mode all --set-default` on judged queries;
# either records the winner (and the hybrid's dense weight) for the workspace. Unmeasured: lexical.
DEFAULT_MODE = "lexical"
DEFAULT_DENSE_WEIGHT = 0.5
FUSION_DEPTH = 100  # documents taken from each retriever before fusing
MAX_K = 1000
# Hugging Face fast tokenizers fail ("Already borrowed") when one is used from two threads at once, and
# torch already spreads one forward pass over every core: queries are encoded one batch at a time.
_ENCODE_LOCK = threading.Lock()


@dataclass
class Hit:
    rank: int
    score: float
    doc_id: str
    title: str
    source: str
    snippet: str
    chunk_id: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Filters:
    """Restrict results to documents whose source path matches a glob (`docs/*.md`) and/or whose title contains a text."""
    source: str | None = None
    title: str | None = None

    def __bool__(self) -> bool:
        return bool(self.source or self.title)

    @property
    def absolute_source(self) -> str | None:
        """The source glob read from the current directory, as sources are stored by absolute path:
        `docs/*.md` is `/home/me/docs/*.md` when run in /home/me."""
        return os.path.abspath(self.source) if self.source else None


def snippet(text: str, limit: int = 240, starts_mid_text: bool = False) -> str:
    """The chunk's text on one line, cut at a word boundary; a chunk that starts inside the document
    (token windows may cut a word) loses its leading word fragment."""
    text = " ".join(text.split())
    if starts_mid_text and " " in text:
        text = "… " + text.split(" ", 1)[1]
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def check_request(query: str, k: int, mode: str | None) -> str:
    """Validate one request; returns the stripped query. Raises PipelineError naming the problem."""
    query = query.strip()
    if not query:
        raise PipelineError("empty query")
    if not 1 <= k <= MAX_K:
        raise PipelineError(f"k must be between 1 and {MAX_K}, got {k}")
    if mode is not None and mode not in MODES:
        raise PipelineError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    return query


class SearchEngine:
    """Everything one index generation needs: FAISS, BM25, the query model and the chunk metadata.

    in_memory=True copies the documents and chunks tables into an in-memory DuckDB at load time: the
    server then holds no lock on the workspace's database file (so `pipeline embed` can write to it
    while serving) and answers from the same snapshot the indexes were loaded with.
    """

    def __init__(self, ws: Workspace, in_memory: bool = False, load_model: bool = True, reuse_model=None):
        self.ws = ws
        self.index_entry = ws.require("index", "run `pipeline embed` and `pipeline index` first")
        embedder = ws.require("embedder", "run `pipeline embed` first")
        index_path = ws.root / self.index_entry["path"]
        if not index_path.exists():
            raise PipelineError(f"{index_path}: index file missing; run `pipeline index`")
        self.model_dir = ws.embedder_model_dir(embedder)
        if not self.model_dir.exists():
            raise PipelineError(f"{self.model_dir}: the embedding model recorded in the manifest is gone")
        current = model_fingerprint(self.model_dir)  # a stale index is refused whatever the mode, as `pipeline status` does
        if self.index_entry["embedder_fingerprint"] != current:
            raise PipelineError(
                f"the index was built with model {self.index_entry['embedder_fingerprint']} but {self.model_dir} now holds "
                f"model {current}: run `pipeline embed` and `pipeline index` again")
        self._memory: duckdb.DuckDBPyConnection | None = None
        if in_memory:
            self._memory, generation = snapshot_store(ws.db_path)
        else:
            with Store(ws.db_path, read_only=True) as store:
                generation = store.generation()
        # The indexes hold chunk ids of the store generation they were built from: any other is refused.
        if generation != self.index_entry.get("store_generation"):
            if self._memory is not None:
                self._memory.close()
            raise PipelineError(stale_index_message(self.index_entry.get("store_generation"), generation))
        self.index = faiss.deserialize_index(np.fromfile(index_path, dtype=np.uint8))
        lexical_path = self.index_entry.get("lexical_path")
        self.lexical = LexicalIndex.load(ws.root / lexical_path) if lexical_path else None
        self._model = reuse_model
        self._default_mode, self._default_dense_weight = self.measured_defaults()
        self._model_lock = threading.Lock()
        self._warned_long: set[str] = set()
        if load_model and self._model is None:
            self.model  # noqa: B018 -- load now rather than on the first query

    # ---- resources
    @property
    def model(self):
        with self._model_lock:
            if self._model is None:
                self._model = load_embedder(self.model_dir)
            return self._model

    @contextmanager
    def connect(self):
        """A DuckDB connection for one request: a cursor on the snapshot, or a read-only file connection."""
        if self._memory is not None:
            cursor = self._memory.cursor()
            try:
                yield cursor
            finally:
                cursor.close()
            return
        if not self.ws.db_path.exists():
            raise PipelineError(f"{self.ws.db_path}: no document store yet; run `pipeline embed` first")
        try:
            con = duckdb.connect(str(self.ws.db_path), read_only=True)
        except duckdb.Error as e:
            raise PipelineError(f"{self.ws.db_path}: cannot open the DuckDB store ({str(e).splitlines()[0]})") from None
        try:
            yield con
        finally:
            con.close()

    def measured_defaults(self) -> tuple[str, float]:
        """The mode and hybrid weight measured best for this index's model (by `pipeline index` or
        `pipeline eval --set-default`), else DEFAULT_MODE and DEFAULT_DENSE_WEIGHT."""
        measured = self.ws.read_manifest().get("search", {})
        if measured.get("embedder_fingerprint") == self.index_entry["embedder_fingerprint"] and measured.get("default_mode") in MODES:
            return measured["default_mode"], float(measured.get("dense_weight", DEFAULT_DENSE_WEIGHT))
        return DEFAULT_MODE, DEFAULT_DENSE_WEIGHT

    def resolve_dense_weight(self, dense_weight: float | None) -> float:
        return self._default_dense_weight if dense_weight is None else dense_weight

    def resolve_mode(self, mode: str | None) -> str:
        if mode is None:
            mode = self._default_mode
            return mode if self.lexical is not None else "dense"
        if mode in ("lexical", "hybrid") and self.lexical is None:
            raise PipelineError(f"--mode {mode}: this index has no lexical part; run `pipeline index` again")
        return mode

    # ---- search
    def search(self, query: str, k: int = 10, mode: str | None = None, filters: Filters | None = None,
               dense_weight: float | None = None) -> list[Hit]:
        return self.search_many([query], k, mode, filters, dense_weight)[0]

    def search_many(self, queries: list[str], k: int = 10, mode: str | None = None, filters: Filters | None = None,
                    dense_weight: float | None = None, names: list[str] | None = None) -> list[list[Hit]]:
        """Results for each query; queries are embedded in one batch (what `pipeline eval` uses).
        mode and dense_weight default to the workspace's measured defaults. A query longer than the model
        reads is embedded up to the model's input length (lexical search reads all of it); given `names`
        (how to call each query), the first time for each name, with a warning naming it."""
        queries = [check_request(q, k, mode) for q in queries]
        mode = self.resolve_mode(mode)
        dense_weight = self.resolve_dense_weight(dense_weight)
        if not 0.0 <= dense_weight <= 1.0:
            raise PipelineError(f"dense weight must be between 0 and 1, got {dense_weight}")
        depth = k if mode != "hybrid" else max(k, FUSION_DEPTH)
        vectors = self.embed_queries(queries, names) if mode != "lexical" else None
        results = []
        with self.connect() as con:
            allowed = self._allowed_chunks(con, filters) if filters else None
            for i, query in enumerate(queries):
                if allowed is not None and len(allowed) == 0:
                    results.append([])
                    continue
                dense = self._dense(con, vectors[i:i + 1], depth, allowed) if mode != "lexical" else []
                lexical = self._lexical(con, query, depth, allowed) if mode != "dense" else []
                if mode == "hybrid":
                    ranked = fuse(dense, lexical, dense_weight)
                else:
                    ranked = dense or lexical
                results.append([Hit(rank, score, row["doc_id"], row["title"] or "", row["source"] or "",
                                    snippet(row["text"] or "", starts_mid_text=row["chunk_index"] > 0), row["chunk_id"])
                                for rank, (score, row) in enumerate(ranked[:k], start=1)])
        return results

    def embed_queries(self, queries: list[str], names: list[str] | None = None) -> np.ndarray:
        model = self.model
        with _ENCODE_LOCK:
            cut, lengths = truncate_to_model(model, queries)
            vectors = encode(model, cut)
        limit = token_limit(model)
        for name, n_tokens in zip(names or [], lengths):
            if n_tokens > limit and name not in self._warned_long:  # `eval --mode all` embeds the queries twice
                self._warned_long.add(name)
                warn(f"query {name} is {n_tokens:,} tokens long and the model reads {limit}: "
                     f"it is embedded up to there (lexical search reads all of it)")
        return vectors

    def _dense(self, con, vector: np.ndarray, n_docs: int, allowed: np.ndarray | None) -> list[tuple[float, dict]]:
        params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(allowed)) if allowed is not None else None
        total = self.index.ntotal if allowed is None else min(self.index.ntotal, len(allowed))

        def fetch(n: int):
            scores, ids = self.index.search(vector, n, params=params)
            keep = ids[0] >= 0
            return ids[0][keep], scores[0][keep]
        return best_chunk_per_document(con, fetch, n_docs, total)

    def _lexical(self, con, query: str, n_docs: int, allowed: np.ndarray | None) -> list[tuple[float, dict]]:
        total = len(self.lexical) if allowed is None else min(len(self.lexical), len(allowed))
        return best_chunk_per_document(con, lambda n: self.lexical.search(query, n, allowed), n_docs, total)

    def _allowed_chunks(self, con, filters: Filters) -> np.ndarray:
        rows = con.execute(
            """SELECT c.chunk_id FROM chunks c JOIN documents d USING (doc_id)
               WHERE ($source IS NULL OR d.source GLOB $source OR d.source GLOB $absolute_source)
                 AND ($title IS NULL OR contains(lower(coalesce(d.title, '')), lower($title)))
               ORDER BY c.chunk_id""",
            {"source": filters.source or None, "absolute_source": filters.absolute_source, "title": filters.title or None},
        ).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64)

    def document(self, doc_id: str) -> dict | None:
        with self.connect() as con:
            rows = con.execute("SELECT doc_id, title, source, text FROM documents WHERE doc_id = ?", [doc_id]).fetchall()
            if not rows:
                return None
            n_chunks = con.execute("SELECT count(*) FROM chunks WHERE doc_id = ?", [doc_id]).fetchall()[0][0]
        return {**dict(zip(("doc_id", "title", "source", "text"), rows[0])), "chunks": n_chunks}


def best_chunk_per_document(con, fetch, n_docs: int, total: int) -> list[tuple[float, dict]]:
    """Ask `fetch(n)` for the best n chunks (ids, scores), growing n until n_docs documents are covered;
    returns [(score, chunk row)] with each document's best chunk, best first."""
    n = min(total, 4 * n_docs)
    while True:
        ids, scores = fetch(n)
        details = chunk_details(con, [int(i) for i in ids])
        per_doc: dict[str, tuple[float, dict]] = {}
        for chunk_id, score in zip(ids, scores):
            row = details.get(int(chunk_id))
            if row is not None and row["doc_id"] not in per_doc:  # results come best-first
                per_doc[row["doc_id"]] = (float(score), row)
        if len(per_doc) >= n_docs or n >= total or len(ids) < n:
            return list(per_doc.values())[:n_docs]
        n = min(total, n * 4)


def chunk_details(con, chunk_ids: list[int]) -> dict[int, dict]:
    """chunk_id -> doc_id, title, source, chunk text."""
    if not chunk_ids:
        return {}
    rows = con.execute(
        """SELECT c.chunk_id, c.doc_id, d.title, d.source, c.text, c.chunk_index
           FROM (SELECT unnest($ids) AS chunk_id) wanted JOIN chunks c USING (chunk_id) JOIN documents d USING (doc_id)""",
        {"ids": chunk_ids},
    ).fetchall()
    keys = ("chunk_id", "doc_id", "title", "source", "text", "chunk_index")
    return {r[0]: dict(zip(keys, r)) for r in rows}


def fuse(dense: list[tuple[float, dict]], lexical: list[tuple[float, dict]], dense_weight: float) -> list[tuple[float, dict]]:
    """Convex combination of the two rankings' standardised scores (module docstring). Each retriever
    adds weight * (z(d) - its lowest z), which ranks as the combination does with a missing document
    at its list's lowest score, and keeps every fused score at 0 or above. A document is shown with
    the chunk of the retriever that contributed more to it."""
    scores: dict[str, float] = {}
    rows: dict[str, tuple[float, dict]] = {}
    for weight, ranking in ((dense_weight, dense), (1.0 - dense_weight, lexical)):
        if not ranking:
            continue
        raw = np.array([score for score, _ in ranking], dtype=np.float64)
        # all scores equal: each returned document is one deviation above those not returned
        above_lowest = (raw - raw.min()) / raw.std() if raw.std() > 0 else np.ones(len(raw))
        for (_, row), z in zip(ranking, above_lowest):
            contribution = weight * float(z)
            scores[row["doc_id"]] = scores.get(row["doc_id"], 0.0) + contribution
            if row["doc_id"] not in rows or contribution > rows[row["doc_id"]][0]:
                rows[row["doc_id"]] = (contribution, row)
    order = sorted(scores, key=lambda d: (-scores[d], d))
    return [(scores[d], rows[d][1]) for d in order]


def snapshot_store(db_path: Path) -> tuple[duckdb.DuckDBPyConnection, int]:
    """An in-memory DuckDB holding a copy of the store's documents and chunks tables (no vectors), and the
    store generation they are."""
    if not db_path.exists():
        raise PipelineError(f"{db_path}: no document store yet; run `pipeline embed` first")
    memory = duckdb.connect(":memory:")
    try:
        memory.execute("ATTACH ? AS store (READ_ONLY)", [str(db_path)])
        memory.execute("BEGIN TRANSACTION")  # the copies and the generation from one snapshot of the store
        memory.execute("CREATE TABLE documents AS SELECT doc_id, title, source, text FROM store.documents")
        memory.execute("CREATE TABLE chunks AS SELECT chunk_id, doc_id, chunk_index, text FROM store.chunks")
        rows = memory.execute("SELECT value FROM store.store_meta WHERE key = 'generation'").fetchall()
        memory.execute("COMMIT")
        memory.execute("DETACH store")
    except duckdb.Error as e:
        memory.close()
        raise PipelineError(f"{db_path}: cannot read the DuckDB store ({str(e).splitlines()[0]})") from None
    return memory, int(rows[0][0]) if rows else 0
