"""From raw documents to semantic search, with one workspace.

\b
A first run, on your own documents:
    pipeline pretrain --data docs/     # tokenizer + GPT-2 on them, adapted to retrieval
    pipeline embed && pipeline index   # chunks and vectors into DuckDB; FAISS and BM25
    pipeline search "query"            # ranked documents

Every command reads and writes the workspace: --workspace DIR (before the command or after it),
else $PIPELINE_WORKSPACE, else ./workspace. Each command's --help has examples.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from typer._click.exceptions import BadParameter, NoArgsIsHelpError, UsageError  # typer>=0.29 vendors click
from typer.core import TyperGroup

import workflows
from common.console import err, out, quiet_libraries, visible, visible_json
from common.durations import parse_duration
from common.errors import PipelineError, disk_full_error, out_of_memory_error
from common.options import OptionError, declared_fields
from common.workspace import WORKSPACE_ENV, Workspace
from embed.settings import EmbedSettings, TuneSettings
from index.settings import IndexSettings
from pretrain.settings import MAX_PORT, Preset, PretrainSettings


class OneLineUsageError(UsageError):
    """A usage error (an unknown option, an invalid choice, a missing argument) printed as one line, as
    every other input error is, instead of click's usage block."""

    def show(self, file=None) -> None:
        where = f"; see `{self.ctx.command_path} --help`" if self.ctx is not None else ""
        err.print(f"error: {self.message}{where}", style="red")


@contextmanager
def one_line_usage_errors():
    try:
        yield
    except NoArgsIsHelpError:
        raise
    except UsageError as e:
        if isinstance(e, OneLineUsageError):
            raise
        message = e.format_message()
        if type(e) is BadParameter and e.param is not None and e.param.param_type_name == "option":
            # "--mode: ..." rather than "Invalid value for '--mode': ..."
            message = f"{max(e.param.opts, key=len)}: {number_message(e) or e.message}"
        # typer validates through pydantic, whose messages carry its "Value error, " prefix.
        raise OneLineUsageError(message.replace("Value error, ", "").rstrip("."), e.ctx) from None


def number_message(e: BadParameter) -> str | None:
    """What is wrong with a number typer refused, in our words, or None if it was not a number: typer checks
    a number's type and its min=/max= with pydantic, whose message does not show the value ("Input should be
    greater than or equal to 1"), and calls NaN out of range rather than not a number."""
    errors = getattr(e.__cause__, "errors", None)  # the pydantic ValidationError typer raised this from
    if not callable(errors) or not errors():
        return None
    kind, value = errors()[0]["type"], errors()[0].get("input")
    if kind in ("greater_than_equal", "less_than_equal"):
        try:
            if not math.isfinite(float(value)):
                return f"{value} is not a finite number"
        except (TypeError, ValueError):
            pass
        return (
            f"{value} is not in the range {number_range(getattr(e.param, 'min', None), getattr(e.param, 'max', None))}"
        )
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"'{value}' is not a whole number"
    if kind in ("float_parsing", "float_type"):
        return f"'{value}' is not a number"
    return None


def number_range(low, high) -> str:
    """A range as typer's --help shows it: x>=1, 0<=x<=1."""
    return (
        f"{low}<=x<={high}"
        if low is not None and high is not None
        else f"x>={low}"
        if low is not None
        else f"x<={high}"
    )


class Commands(TyperGroup):
    """The command group: its own parsing and each command's report usage errors in one line."""

    def make_context(self, *args, **kwargs):
        with one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with one_line_usage_errors():
            return super().invoke(ctx)


app = typer.Typer(
    cls=Commands, help=__doc__, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_show_locals=False
)

# Choices, as each stage spells them (tests/workflows/test_cli.py checks they agree); the CLI doesn't import the
# stages to read them, so that `pipeline --help` and light commands start fast.
SearchMode = Literal["dense", "lexical", "hybrid"]
EvalMode = Literal["dense", "lexical", "hybrid", "all"]


def command_workspace(ctx: typer.Context, param: typer.CallbackParam, value: Path) -> Path:
    """A command's --workspace: given to the command, else given before it (`pipeline -w DIR search ...`),
    else $PIPELINE_WORKSPACE, else ./workspace."""
    source = ctx.get_parameter_source(param.name)
    given_before = ctx.find_root().params.get("workspace")
    if given_before is not None and (source is None or source.name != "COMMANDLINE"):
        return given_before
    return value


# Numbers: each option's range where it is declared, checked before the command runs: typer's min=/max=
# (inclusive; shown in --help), and these callbacks for what they don't cover. NaN and infinity are floats
# too ("--lr nan" reached the optimizer); every float option has a callback that refuses them.
MAX_K = 1000  # search/engine.py's MAX_K


def finite(value: float | None) -> float | None:
    """A float option's callback: a finite number (typer's range passes infinity when there is no max)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def positive(value: float | None) -> float | None:
    """A float option's callback: finite and more than 0 (typer's min= includes its bound, and 0 is no rate
    or timeout); its help says [x>0]."""
    if finite(value) is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not in the range x>0")
    return value


def duration(value: str) -> str:
    """A duration option's callback (--time-budget): 90s, 15m, 1.5h or seconds, more than 0s; kept as given."""
    try:
        parse_duration(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return value


WorkspaceOption = Annotated[
    Path,
    typer.Option(
        "--workspace",
        "-w",
        envvar=WORKSPACE_ENV,
        metavar="DIR",
        callback=command_workspace,
        help="Workspace directory (also accepted before the command).",
    ),
]
DataOption = Annotated[
    Optional[list[Path]],
    typer.Option(
        "--data",
        "-d",
        metavar="PATH",
        help="File or directory (.txt .md .jsonl .json .csv .parquet .pdf .html .htm .docx); repeatable.",
    ),
]
TextFieldOption = Annotated[
    Optional[str],
    typer.Option(metavar="FIELD", help="Field holding the text in structured files (auto-detected by default)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
ModeOption = Annotated[
    Optional[SearchMode],
    typer.Option(
        help=(
            "Retriever (default: the mode `pipeline index` or `pipeline eval --set-default` measured best, "
            "else lexical)."
        )
    ),
]
WhereOption = Annotated[
    Optional[str],
    typer.Option(
        metavar="CONDITION",
        help=(
            "Only documents for which this condition holds, over their metadata fields (the columns of the "
            "input files), doc_id, title and source, e.g. \"year >= 2015 AND journal = 'Nature'\": comparisons, "
            "AND/OR/NOT, IN, BETWEEN, LIKE, and text, list and date functions; not SQL statements."
        ),
    ),
]
DenseWeightOption = Annotated[
    Optional[float],
    typer.Option(
        min=0,
        max=1,
        callback=finite,
        help=(
            "Hybrid only: weight of the dense ranking in the fusion (lexical gets 1 - it) "
            "[default: the workspace's, set by eval --set-default, else 0.5]."
        ),
    ),
]


def show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"pipeline {version('embedding-pipeline')}")
        raise typer.Exit()


@app.callback()
def root(
    workspace: Annotated[
        Optional[Path],
        typer.Option(
            "--workspace",
            "-w",
            metavar="DIR",
            show_default=False,
            help="Workspace directory for the command that follows [default: $PIPELINE_WORKSPACE, else ./workspace].",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Embedding pipeline: pretrain -> embed -> index -> search."""
    quiet_libraries()  # again before each command: a caller (a test runner) may have reset the warning filters


def options_of(settings_class):
    """Give a command one option per field of a settings dataclass whose fields are declared with their
    help and range (common/options.py `option`), and call it with the settings made from them. The
    options are declared once, in the dataclass; its own checks run when the settings are made, and a value
    out of range is a one-line usage error naming the option, as typer's own are."""
    hints = typing.get_type_hints(settings_class)

    def decorate(command):
        own = inspect.signature(command).parameters
        command_hints = typing.get_type_hints(command, include_extras=True)
        parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
        parameters += [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=command_hints[p.name])
            for p in own.values()
            if p.name != "settings"
        ]
        for f in declared_fields(settings_class):
            declared = f.metadata["option"]
            has_factory = f.default_factory is not dataclasses.MISSING
            annotation = Optional[hints[f.name]] if has_factory else hints[f.name]
            help_text = (
                f"{declared.help.rstrip('.')} [{declared.range_text()}]." if declared.range_text() else declared.help
            )
            default = typer.Option(
                None if has_factory else f.default,
                *declared.flags,
                help=help_text,
                metavar=declared.metavar,
                show_default=not has_factory,
                autocompletion=declared.complete if declared.listing else None,
            )
            parameters.append(
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            )
        fields = {f.name for f in declared_fields(settings_class)}

        @functools.wraps(command)
        def with_settings(ctx: typer.Context, **values):
            try:
                settings = make_settings(settings_class, values)
            except OptionError as e:
                raise OneLineUsageError(str(e), ctx) from None
            return command(settings=settings, **{name: value for name, value in values.items() if name not in fields})

        with_settings.__signature__ = inspect.Signature(parameters)
        with_settings.__annotations__ = {p.name: p.annotation for p in parameters}
        with_settings.settings_class = settings_class  # for checking a command line without running it
        return with_settings

    return decorate


def make_settings(settings_class, values: dict):
    """A command's settings from its parsed options (those that are fields; an option not given keeps the
    field's default), checked as they are made (OptionError)."""
    fields = {f.name for f in declared_fields(settings_class)}
    return settings_class(**{name: value for name, value in values.items() if name in fields and value is not None})


def user_errors(command):
    """Print a PipelineError, a damaged store, an out-of-memory GPU or a full disk as one line on stderr and exit
    2, instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except PipelineError as e:
            err.print(f"error: {e}", style="red")
            raise typer.Exit(2) from None
        except Exception as e:
            from common.store import damaged_store_error  # only now: the store's module imports DuckDB

            said = damaged_store_error(e) or out_of_memory_error(e) or disk_full_error(e)
            if said is None:
                raise
            err.print(f"error: {said}", style="red")
            raise typer.Exit(2) from None

    return wrapper


@app.command(short_help="tokenizer + GPT-2 trained on your documents, adapted to retrieval")
@user_errors
@options_of(PretrainSettings)
def pretrain(
    settings: PretrainSettings,
    workspace: WorkspaceOption = Path("workspace"),
    adapt: Annotated[
        bool,
        typer.Option(
            "--adapt/--no-adapt",
            help=(
                "After pretraining, adapt the model to retrieval on the same documents "
                "(`pipeline tune` with its defaults, in what pretraining left of --time-budget), "
                "so `pipeline embed` uses it."
            ),
        ),
    ] = True,
    json_output: JsonOption = False,
):
    """Train a tokenizer and a GPT-2 on your documents, export it in Hugging Face format, and adapt it to retrieval.

    The adaptation is `pipeline tune` with its defaults on the same, unlabelled documents: afterwards
    `pipeline embed && pipeline index` embed with the adapted model and `pipeline search` uses it.
    The run's curves are TensorBoard event files: `tensorboard --logdir WORKSPACE/tensorboard`.

    Examples:

    \b
        pipeline pretrain --data docs/                     # model and tokens sized to the data and this machine
        pipeline pretrain --data docs/ --time-budget 1h    # a longer budget: a larger model, more epochs
        pipeline pretrain --preset tiny                    # tiny model on the built-in corpus
        pipeline pretrain --data docs/ --preset tiny --max-steps 500
        pipeline pretrain --data corpus.jsonl --text-field body --tokens 2000000
        pipeline pretrain --data docs/ --max-steps 0       # the model at initialisation (ablation baseline)
        pipeline pretrain --resume                         # continue after an interruption
        WANDB_MODE=offline pipeline pretrain --data docs/ --wandb   # also to Weights & Biases (pip install wandb)
        pipeline pretrain --nproc 4 --strategy fsdp        # 4 processes (torchrun), sharded data parallel
        pipeline pretrain --nproc 4 --strategy hybrid --dp 2 --pp 2 --pp-schedule interleaved-1f1b
        pipeline pretrain --nproc 4 --strategy auto               # the planner's top plan, and why
        pipeline pretrain --nproc 4 --strategy auto --autotune 3  # measure the top 3, keep the fastest
        pipeline pretrain --ray auto --nproc 8 --strategy hybrid --dp 4 --pp 2 --max-failures 3
    """
    # The workspace is created when the data is prepared, after every check: a failed run writes nothing.
    summary = workflows.pretrain(Workspace(workspace), settings, adapt)
    if json_output:
        out.print_json(json.dumps(summary))


@app.command(short_help="chunk and embed documents into the workspace's DuckDB store")
@user_errors
@options_of(EmbedSettings)
def embed(
    settings: EmbedSettings,
    workspace: WorkspaceOption = Path("workspace"),
    data: DataOption = None,
    text_field: TextFieldOption = None,
    json_output: JsonOption = False,
):
    """Chunk and embed documents into the workspace's DuckDB store (only new or changed ones; of a JSON-lines
    file that only grew since the last run, only the lines added).

    Examples:

    \b
        pipeline embed                                   # the documents pretraining used
        pipeline embed --data docs/ --prune              # sync with a folder
        pipeline embed --data tickets.jsonl              # again after appending: reads the new lines only
        pipeline embed --data corpus.jsonl --model ~/models/all-MiniLM-L6-v2
        pipeline embed --data corpus.jsonl --ray auto    # model actors on every node of a Ray cluster
    """
    summary = workflows.embed(Workspace(workspace), list(data or []), text_field, settings)
    if json_output:
        out.print_json(json.dumps(summary))


@app.command(short_help="build or update the FAISS and BM25 indexes")
@user_errors
@options_of(IndexSettings)
def index(settings: IndexSettings, workspace: WorkspaceOption = Path("workspace"), json_output: JsonOption = False):
    """Build the FAISS and BM25 indexes over the stored chunks, or update the last build with what changed.

    An update keeps the last full build, skips its deleted chunks and indexes the chunks added since in a
    delta; more than 10% added or deleted since the last full build, another index type, or a new
    embedder makes a full build, which then chooses the default search mode.

    The default mode (dense, lexical or hybrid, and the hybrid's dense weight) is measured on pairs the
    corpus provides: a sentence (or, in text without sentences, a span) taken out of a held-out document
    is the query, that document the answer. `pipeline eval --set-default` on judged queries overrides it.

    The vectors are read from the store in slices: an IVF index is trained on a sample and filled slice by
    slice, so a collection of millions of chunks is indexed in bounded memory. An approximate index's
    search width is tuned to recall@10 >= 0.95 against exact search; when no width reaches it, the index
    says so (here, in `pipeline status` and the server's /health).

        BM25 analyses text by the collection's language, detected at a full build: its stop words and
    Snowball stemmer, and Chinese, Japanese and Korean as character bigrams.

    Examples:

    \b
        pipeline index                 # exact below 50k vectors, HNSW above
        pipeline index --type ivfpq    # compressed; prints recall@10 against exact search
        pipeline index --memory-budget 1   # IVF lists on disk beyond 1 GB of codes
        pipeline index --language de   # German stop words and stemmer, whatever was detected
        pipeline index --shards 4 --ray auto   # four shards built on the Ray cluster
    """
    summary = workflows.index(Workspace(workspace), settings)
    if json_output:
        out.print_json(json.dumps(summary))


@app.command(short_help="ranked documents for a query: dense, lexical or hybrid")
@user_errors
def search(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to look for.")],
    workspace: WorkspaceOption = Path("workspace"),
    k: Annotated[int, typer.Option("-k", min=1, max=MAX_K, help="Number of documents to return.")] = 10,
    mode: ModeOption = None,
    dense_weight: DenseWeightOption = None,
    where: WhereOption = None,
    source: Annotated[
        Optional[str],
        typer.Option(
            metavar="GLOB",
            help=(
                "Only documents whose source file matches this glob, absolute or relative to the current directory, "
                "e.g. 'docs/*.md'."
            ),
        ),
    ] = None,
    title: Annotated[
        Optional[str],
        typer.Option(metavar="TEXT", help="Only documents whose title contains this text (case-insensitive)."),
    ] = None,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help=(
                "One JSON object per result line "
                "(with the document's metadata and the snippet's highlighted character ranges)."
            ),
        ),
    ] = False,
):
    """Search the indexed documents; one row per document, with the passage of its best chunk that best
    matches the query, the query's terms highlighted.

    Examples:

    \b
        pipeline search "how do I parse command line options"
        pipeline search "vitamin D and bone density" -k 5 --json
        pipeline search "bone density" --mode lexical --source 'papers/*.jsonl'
        pipeline search "bone density" --where "year >= 2015 AND journal IN ('Nature', 'Cell')"
    """
    from rich.table import Table
    from rich.text import Text

    hits = workflows.search(
        Workspace(workspace), query, k, mode, command_line_filter(where, source, title), dense_weight
    )
    if json_output:
        for hit in hits:
            print(visible_json(json.dumps(hit.to_dict(), ensure_ascii=False)))
        return
    # the documents' text, never read as markup, its control characters shown (common/console.py)
    table = Table(title=f"results for: {visible(query)}", show_lines=True)
    for column in ("rank", "score", "title / source", "snippet"):
        table.add_column(column)
    for hit in hits:
        source = (visible(hit.source), "dim")
        about = Text.assemble(visible(hit.title), "\n", source) if hit.title else Text.assemble(source)
        if hit.metadata:
            about.append(
                "\n"
                + ", ".join(
                    f"{visible(name)}: {visible_json(json.dumps(value, ensure_ascii=False))}"
                    for name, value in hit.metadata.items()
                ),
                "dim",
            )
        snippet = Text(visible(hit.snippet))  # the same length: the highlights keep their places
        for start, end in hit.highlights:
            snippet.stylize("bold yellow", start, end)
        table.add_row(str(hit.rank), f"{hit.score:.3f}", about, snippet)
    out.print(table)


def command_line_filter(where: str | None, source: str | None = None, title: str | None = None):
    """--where, --source and --title as one filter (all must hold), or None."""
    from search.filters import DocumentFilter

    structured = {
        **({"source": {"glob": source}} if source else {}),
        **({"title": {"contains": title}} if title else {}),
    }
    return DocumentFilter.of(structured, where)


@app.command(name="eval", short_help="nDCG@10, Recall@100, MRR@10 on judged (BEIR-format) queries")
@user_errors
def eval_command(
    queries: Annotated[Path, typer.Option(help='BEIR queries.jsonl: {"_id": ..., "text": ...} per line.')],
    qrels: Annotated[Path, typer.Option(help="BEIR qrels .tsv: query-id, corpus-id, score (header line optional).")],
    workspace: WorkspaceOption = Path("workspace"),
    mode: Annotated[
        Optional[EvalMode], typer.Option(help="Retriever, or all of them (default: the search default).")
    ] = None,
    k: Annotated[
        int, typer.Option("-k", min=1, max=MAX_K, help="Documents retrieved per query (Recall@100 needs 100).")
    ] = 100,
    dense_weight: DenseWeightOption = None,
    where: WhereOption = None,
    set_default: Annotated[
        bool,
        typer.Option(
            "--set-default",
            help=(
                "With --mode all: make the best mode (by nDCG@10), and the --dense-weight used, "
                "this workspace's default for search and serve."
            ),
        ),
    ] = False,
    json_output: JsonOption = False,
):
    """Retrieval quality on judged queries: nDCG@10, Recall@100 and MRR@10 (pytrec_eval).

    Examples:

    \b
        pipeline eval --queries scifact/queries.jsonl --qrels scifact/qrels/test.tsv
        pipeline eval --queries q.jsonl --qrels qrels.tsv --mode all --json
        pipeline eval --queries q.jsonl --qrels qrels.tsv --mode all --set-default
        pipeline eval --queries q.jsonl --qrels qrels.tsv --where "year >= 2015"   # on a part of the collection
    """
    reports = workflows.evaluate(
        Workspace(workspace), queries, qrels, mode, k, dense_weight, command_line_filter(where), set_default
    )
    if json_output:
        out.print_json(json.dumps(reports if len(reports) > 1 else reports[0]))
        return
    for r in reports:
        out.print(
            f"{r['mode']:8} nDCG@10 {r['ndcg@10']:.4f}  Recall@100 {r['recall@100']:.4f}  MRR@10 {r['mrr@10']:.4f}  "
            f"({r['queries']} queries, {r['queries_per_s']:.1f}/s)"
        )


@app.command(short_help="tune the pretrained model into a sentence embedder (contrastive)")
@user_errors
@options_of(TuneSettings)
def tune(
    settings: TuneSettings,
    workspace: WorkspaceOption = Path("workspace"),
    data: DataOption = None,
    text_field: TextFieldOption = None,
    json_output: JsonOption = False,
):
    """Contrastive tuning of the pretrained model into a sentence embedder, from your unlabelled documents.

    Pairs the corpus provides (title <-> text, a sentence <-> its passage, neighbouring parts, dropout
    views; sentences found in any language, spans where a text has none; no pair more than 3 times) are
    trained with in-batch negatives and a BM25-mined hard negative each (MultipleNegativesRankingLoss).
    The static embedder is a table of token vectors, the pretrained model's token embeddings widened
    with random columns to --dimensions, a text being the mean of its tokens' vectors (it measured far
    better than the tuned transformer for small models trained on a CPU). With --architecture auto (the
    default) the transformer is tuned too when a measured step says it fits --time-budget, and the
    better of the two on held-out documents is kept. The result goes to the workspace's tuned/
    directory; `pipeline embed` uses it from then on.

    Examples:

    \b
        pipeline tune                                    # pretraining's documents; static or transformer, measured
        pipeline tune --architecture static --steps 200  # the static embedder only
        pipeline tune --architecture transformer --data docs/ --steps 1000 --pooling weightedmean
        pipeline tune --pairs labelled.jsonl --batch-size 256 --mini-batch 32
        pipeline tune && pipeline embed && pipeline index
    """
    from common.board import require_wandb

    if settings.wandb:
        require_wandb()
    summary = workflows.tune(Workspace(workspace), list(data or []), text_field, settings)
    if json_output:
        out.print_json(json.dumps(summary))


@app.command(short_help="HTTP API and web page for search and document writes")
@user_errors
def serve(
    workspace: WorkspaceOption = Path("workspace"),
    host: Annotated[
        str, typer.Option(help="Address to listen on (loopback by default; 0.0.0.0 exposes it to the network).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=MAX_PORT, help="TCP port.")] = 8000,
    api_key: Annotated[
        Optional[str],
        typer.Option(
            envvar="PIPELINE_API_KEY",
            help="Require this key (X-API-Key header or ?api_key=) on the data routes: /search, /documents, /fields, "
            "/runs.json. /health, /openapi.json and the pages (/, /runs, /docs; they ask for the key) stay open.",
        ),
    ] = None,
    ray: Annotated[
        Optional[str],
        typer.Option(
            help="Serve on a Ray cluster with Ray Serve, a deployment per shard: local, auto, or the head's address "
            "(the workspace on storage every node reads; needs the ray extra)."
        ),
    ] = None,
    replicas: Annotated[
        int, typer.Option(min=1, max=64, help="With --ray: replicas of each shard (Ray Serve restarts one that dies).")
    ] = 1,
):
    """Serve search over HTTP: a web page at /, the JSON API (/search, /documents, /health), docs at /docs.

    The model and indexes load once; a rebuilt index (`pipeline index`) is picked up without a restart.
    POST /documents and DELETE /documents/{id} add, replace and delete documents, searchable on return.
    With --ray, each shard of the index (`pipeline index --shards N`) is a Ray Serve deployment and the HTTP
    API is Ray Serve's, answering as one machine does.

    Examples:

    \b
        pipeline serve                                   # http://127.0.0.1:8000/
        pipeline serve --port 9000 --api-key s3cret      # curl -H 'X-API-Key: s3cret' 'localhost:9000/search?q=x'
        pipeline serve --ray auto --replicas 2           # every shard twice, on the Ray cluster
    """
    if ray is None and replicas != 1:
        raise PipelineError("--replicas is for --ray: give --ray ADDRESS too")
    workflows.serve(Workspace(workspace), host, port, api_key, ray, replicas)


@app.command(short_help="what the workspace holds, and whether it is consistent")
@user_errors
def status(workspace: WorkspaceOption = Path("workspace"), json_output: JsonOption = False):
    """What the workspace holds, and whether tokenizer, model, vectors and index belong together.

    Examples:

    \b
        pipeline status
        pipeline status --json
    """
    from rich.text import Text

    report = workflows.status(Workspace(workspace))
    if json_output:
        out.print_json(json.dumps(report))
    else:
        for name, part in report["parts"].items():
            out.print(f"{name:10} {part['state']:8} {part['detail']}")
        for problem in report["problems"]:
            out.print(Text.assemble(("problem:", "red"), " ", problem))
        if not report["problems"]:
            out.print("consistent", style="green")
    if report["problems"]:
        raise typer.Exit(1)


@app.command(short_help="rank parallel training plans by predicted step time and memory")
@user_errors
def plan(
    workspace: WorkspaceOption = Path("workspace"),
    preset: Annotated[
        Preset, typer.Option(help="Model shape: tiny, small (124M), medium (355M), large (774M).")
    ] = "small",
    model_config: Annotated[
        Optional[Path],
        typer.Option(help="JSON model shape instead of --preset (our fields, or a Hugging Face GPT-2 config.json)."),
    ] = None,
    seq_len: Annotated[Optional[int], typer.Option(min=1, help="Tokens per sequence (default: the preset's).")] = None,
    global_batch: Annotated[
        Optional[int], typer.Option(min=1, help="Sequences per optimizer step (default: the preset's).")
    ] = None,
    vocab_size: Annotated[Optional[int], typer.Option(min=1, help="Vocabulary size (default: the preset's).")] = None,
    cluster: Annotated[
        Optional[Path], typer.Option(help="Cluster TOML file for what-if planning (default: measure this machine).")
    ] = None,
    nproc: Annotated[
        Optional[int],
        typer.Option(min=1, help="Processes (default: all devices of --cluster, or this machine's GPUs, 1 on CPU)."),
    ] = None,
    dp: Annotated[Optional[int], typer.Option(min=1, help="Only plans with this data-parallel degree.")] = None,
    tp: Annotated[Optional[int], typer.Option(min=1, help="Only plans with this tensor-parallel degree.")] = None,
    pp: Annotated[Optional[int], typer.Option(min=1, help="Only plans with this pipeline degree.")] = None,
    bf16: Annotated[bool, typer.Option("--bf16", help="Plan for bf16 autocast (2-byte activations).")] = False,
    top: Annotated[int, typer.Option(min=1, help="Rows of the table.")] = 15,
    remeasure: Annotated[
        bool, typer.Option(help="Measure this machine again instead of using the cached measurement.")
    ] = False,
    json_output: JsonOption = False,
):
    """Rank every parallel plan by predicted step time, from measured (or described) hardware and network.

    Enumerates data/tensor/pipeline degrees, DDP or FSDP, pipeline schedules, microbatches, stages per rank
    and node placement; estimates memory per device and step time per plan; drops plans that don't fit.

    Examples:

    \b
        pipeline plan --preset tiny --nproc 2                 # measure this machine with 2 processes
        pipeline plan --preset large --cluster two_sites.toml --seq-len 1024 --global-batch 64
        pipeline plan --model-config workspace/model/config.json --nproc 4 --json
        pipeline plan --preset medium --cluster cluster.toml --tp 1      # only plans without TP
    """
    from rich.table import Table

    from pretrain.planner.auto import workload_from_args
    from pretrain.planner.rank import table_rows, why

    work = workload_from_args(preset, model_config, seq_len, global_batch, vocab_size, bf16)
    result = workflows.plan(Workspace(workspace), work, cluster, nproc, dp, tp, pp, remeasure)
    if json_output:
        out.print_json(json.dumps(result.to_dict()))
        return
    table = Table(
        title=f"{len(result.ranked)} plans fit on {result.cluster.describe()} ({len(result.rejected)} do not); "
        f"global batch {work.global_batch} × {work.seq_len} tokens"
    )
    for column in ("#", "plan", "step ms", "tokens/s", "MiB/device", "main costs"):
        table.add_column(column, justify="right" if column in ("#", "step ms", "tokens/s", "MiB/device") else "left")
    for row in table_rows(result, top):
        table.add_row(*row)
    out.print(table)
    out.print(f"best: {result.ranked[0].label}: {why(result.ranked[0], result)}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
