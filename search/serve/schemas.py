"""The server's request and response models (pydantic), the bounds on a request they declare, and the error
body every failure answers with: together what the OpenAPI description says of each route."""

from __future__ import annotations

from typing import Any, Optional

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from search.filters import OPERATORS
from search.settings import SearchMode

# Bounds on a request, declared in the OpenAPI schema. A query longer than the model reads is embedded
# up to its input length (search/engine.py); the bound keeps a request's size, and BM25's work, small.
MAX_QUERY_CHARS = 2000
MAX_SERVE_K = 100
MAX_FILTER_CHARS = 2000
MAX_BODY_BYTES = 64 * 1024  # a JSON search request at its bounds, escaped, is under 20 KB
MAX_UPSERT_DOCUMENTS = 100

QUERY_HELP = (
    f"The query, at most {MAX_QUERY_CHARS:,} characters. Dense search embeds it up to the model's input "
    "length (a longer query is cut there); lexical search reads all of it."
)
MODE_HELP = (
    "dense, lexical or hybrid. Default: the workspace's default mode, measured on its documents "
    "(`default_mode` in /health)."
)
FILTER_HELP = (
    'Only documents whose fields satisfy every condition: {"field": {"operator": value}} or {"field": value} '
    f"(= eq). Operators: {', '.join(OPERATORS)}. Fields: the documents' metadata (GET /fields), doc_id, "
    "title, source (source globs are also read relative to the server's working directory). "
    'Example: {"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}, "source": {"glob": "docs/**"}}. '
    "An unknown field or operator, or a value of the wrong type, is a 422 naming it."
)
Scalar = str | int | float | bool


class FieldCondition(BaseModel):
    """Conditions on one field; all must hold. (The filter's shape in the OpenAPI description; requests are
    checked by search/filters.py against the loaded fields, which names what is wrong.)"""

    model_config = ConfigDict(extra="forbid")
    eq: Optional[Scalar] = None
    ne: Optional[Scalar] = None
    gt: Optional[Scalar] = None
    gte: Optional[Scalar] = None
    lt: Optional[Scalar] = None
    lte: Optional[Scalar] = None
    in_: Optional[list[Scalar]] = Field(None, alias="in")
    nin: Optional[list[Scalar]] = None
    glob: Optional[str] = None
    contains: Optional[Scalar] = None


class SearchRequest(BaseModel):
    q: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, description=QUERY_HELP)
    k: int = Field(10, ge=1, le=MAX_SERVE_K, description="Number of documents.")
    mode: Optional[SearchMode] = Field(None, description=MODE_HELP)
    dense_weight: Optional[float] = Field(
        None, ge=0.0, le=1.0, description="Hybrid: weight of the dense ranking (default: the workspace's, see /health)."
    )

    @field_validator("dense_weight", mode="before")
    @classmethod
    def not_a_boolean(cls, value):  # JSON's false would otherwise be read as 0.0
        if isinstance(value, bool):
            raise ValueError("a number from 0 to 1, not true or false")
        return value

    filter: Optional[dict[str, Any]] = Field(
        None,
        description=FILTER_HELP,
        json_schema_extra={
            "additionalProperties": {
                "anyOf": [
                    FieldCondition.model_json_schema(by_alias=True),
                    {"type": "string"},
                    {"type": "number"},
                    {"type": "boolean"},
                ]
            },
            "examples": [{"year": {"gte": 2015}, "journal": {"in": ["Nature", "Cell"]}}],
        },
    )


class SearchHit(BaseModel):
    rank: int
    score: float
    doc_id: str
    title: str
    source: str
    snippet: str = Field(
        description="Plain text (never HTML): the passage of the document's best chunk that best matches the query."
    )
    highlights: list[list[int]] = Field(description="[start, end) character offsets of the query's terms in `snippet`.")
    chunk_id: int
    metadata: dict[str, Any] = Field(description="The document's own fields beyond id, title and text, as stored.")


class SearchResponse(BaseModel):
    query: str
    mode: str
    k: int
    took_ms: float
    results: list[SearchHit]


class DocumentResponse(BaseModel):
    doc_id: str
    title: str
    source: str
    text: str
    metadata: dict[str, Any]
    chunks: int


class DocumentIn(BaseModel):
    """A document to store: its id, title and text; every other field is its metadata (filterable)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [{"id": "note-1", "title": "Vitamin D", "text": "Vitamin D and bone density.", "year": 2021}]
        },
    )
    id: str = Field(..., min_length=1, max_length=500)
    title: str = Field("", max_length=2000)
    text: str = Field(
        ..., pattern=r"\S", description="The text to chunk, embed and index (not empty: it is what search finds)."
    )


class UpsertRequest(BaseModel):
    documents: list[DocumentIn] = Field(
        ...,
        min_length=1,
        max_length=MAX_UPSERT_DOCUMENTS,
        description=f"At most {MAX_UPSERT_DOCUMENTS} documents (and a body of at most {MAX_BODY_BYTES:,} bytes). "
        "A document with a stored id replaces it.",
    )


class IndexUpdate(BaseModel):
    update: str = Field(description="incremental, or full")
    update_reason: str
    vectors: int
    delta_vectors: int
    deleted_in_base: int


class WriteResponse(BaseModel):
    stored: int = Field(description="Documents new or changed, embedded and stored.")
    unchanged: int = Field(description="Documents identical to their stored version (nothing to do).")
    deleted: int
    store_generation: int
    index: Optional[IndexUpdate] = None


class FieldsResponse(BaseModel):
    fields: dict[str, str] = Field(
        description="Field name -> its type in filters (DuckDB's: BIGINT, DOUBLE, BOOLEAN, "
        "DATE, TIMESTAMP, VARCHAR, VARCHAR[], ...)."
    )
    operators: list[str]


class IndexInfo(BaseModel):
    type: Optional[str]
    vectors: Optional[int]
    build_id: Optional[str]
    store_generation: Optional[int]
    lexical: bool
    recall_at_10: Optional[float] = Field(
        None, description="Of the exact 10 nearest chunks, the share the dense index finds (null: exact search)"
    )
    recall_target: Optional[float] = None
    recall_short: bool = Field(False, description="Tuning could not reach recall_target: dense results may miss some")


class HealthResponse(BaseModel):
    status: str
    consistent: bool
    problem: Optional[str]
    store_generation: Optional[int]
    index: IndexInfo
    default_mode: str
    default_dense_weight: float
    model: str
    reloads: int
    loaded_at: float
    last_reload_error: Optional[str]
    auth: bool


Record = dict[str, Any]
Point = tuple[int, Optional[float]]


class PlanComparison(BaseModel):
    plan: Optional[str] = Field(description="The plan trained with (single, ddp, fsdp, hsdp, ...).")
    main_cost: Optional[str] = Field(description="What the planner said dominates its step time.")
    parallelism: Optional[Record] = Field(description="Its degrees (dp, tp, pp), schedule and microbatches.")
    predicted_step_s: float
    measured_step_s: Optional[float] = Field(description="The median over the steps logged.")
    predicted_peak_mem_mb: Optional[float]
    measured_peak_mem_mb: Optional[float] = Field(description="The largest over the steps logged.")


class PretrainingRun(BaseModel):
    train: list[Record] = Field(description="metrics.jsonl's train records, as pretrain wrote them.")
    val: list[Record] = Field(description="Its validation records (step, val_loss, val_ppl).")
    resumes: list[Record] = Field(description="Where a --resume picked up (step, checkpoint).")
    sizing: Optional[Record] = Field(description="The sizing record: every shape timed, its steps, its law_rank.")
    end: Optional[Record] = Field(description="The end record: val_loss_reached, uniform_loss, law_rank.")
    model: Optional[Record] = Field(description="The exported model: preset, steps, parameters, final_val_loss...")
    plan: Optional[PlanComparison] = Field(description="Null when no plan was predicted for the run.")


class Adaptation(BaseModel):
    kept: str = Field(description="The embedder kept: static or transformer.")
    steps: int
    first_loss: Optional[float]
    final_loss: Optional[float]
    candidates: dict[str, Record] = Field(description="Each candidate's held-out nDCG@10, or why it was skipped.")
    loss: dict[str, list[Point]] = Field(description="Each tuned candidate's loss curve: [step, loss] points.")


class RunsResponse(BaseModel):
    pretraining: Optional[PretrainingRun] = Field(description="Null: the workspace has no pretraining run.")
    adaptation: Optional[Adaptation] = Field(description="Null: no embedder was tuned.")
    search: Optional[Record] = Field(
        description="The default-mode measurement: default_mode, ndcg@10 per mode, hybrid_ndcg@10 per dense "
        "weight, pairs; null before `pipeline index`."
    )


class ErrorResponse(BaseModel):
    error: str = Field(description="What was wrong, in one line.")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message})


ERRORS = {
    400: {"model": ErrorResponse, "description": "A request the engine cannot answer (e.g. an empty query)."},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key."},
    413: {"model": ErrorResponse, "description": f"Body over {MAX_BODY_BYTES:,} bytes."},
    422: {"model": ErrorResponse, "description": "Invalid parameters or filter; the message names the field."},
}
NOT_FOUND = {404: {"model": ErrorResponse, "description": "No such document."}}
WRITE_ERRORS = {
    **ERRORS,
    409: {
        "model": ErrorResponse,
        "description": "The served index is of another embedder than the workspace's documents.",
    },
    503: {
        "model": ErrorResponse,
        "description": "Another writer (e.g. `pipeline embed`) held the workspace too long (retry), or the "
        "documents are stored but the index holding them is not served yet (Ray Serve deploying its shards, or "
        "the index update failed: the message says which).",
    },
    507: {
        "model": ErrorResponse,
        "description": "The disk is full: the message says whether the documents were stored (then searchable "
        "once the index is updated) or nothing was.",
    },
}
