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
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer._click.exceptions import BadParameter, NoArgsIsHelpError, UsageError  # typer>=0.29 vendors click
from typer.core import TyperGroup

import workflows
from common.console import err, out, quiet_libraries, visible, visible_json
from common.errors import PipelineError, disk_full_error, out_of_memory_error
from common.options import OptionError, declared_fields
from common.workspace import WORKSPACE_ENV, Workspace
from embed.settings import EmbedSettings, TuneSettings
from index.settings import IndexSettings
from pretrain.settings import PlanSettings, PretrainSettings
from search.settings import EvalSettings, SearchSettings, ServeSettings


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
    a number's type with pydantic, whose message does not show the value."""
    errors = getattr(e.__cause__, "errors", None)  # the pydantic ValidationError typer raised this from
    if not callable(errors) or not errors():
        return None
    kind, value = errors()[0]["type"], errors()[0].get("input")
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"'{value}' is not a whole number"
    if kind in ("float_parsing", "float_type"):
        return f"'{value}' is not a number"
    return None


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


def command_workspace(ctx: typer.Context, param: typer.CallbackParam, value: Path) -> Path:
    """A command's --workspace: given to the command, else given before it (`pipeline -w DIR search ...`),
    else $PIPELINE_WORKSPACE, else ./workspace."""
    source = ctx.get_parameter_source(param.name)
    given_before = ctx.find_root().params.get("workspace")
    if given_before is not None and (source is None or source.name != "COMMANDLINE"):
        return given_before
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
        field_parameters = []
        for f in declared_fields(settings_class):
            declared = f.metadata["option"]
            has_factory = f.default_factory is not dataclasses.MISSING
            required = not has_factory and f.default is dataclasses.MISSING
            annotation = Optional[hints[f.name]] if has_factory else hints[f.name]
            help_text = (
                f"{declared.help.rstrip('.')} [{declared.range_text()}]." if declared.range_text() else declared.help
            )
            default = typer.Option(
                ... if required else None if has_factory else f.default,
                *declared.flags,
                help=help_text,
                metavar=declared.metavar,
                envvar=declared.envvar,
                show_default=not has_factory and not required,
                autocompletion=declared.complete if declared.listing else None,
            )
            field_parameters.append(
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            )
        # the settings' options where the command has its `settings` parameter, so --help lists them there
        parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
        for p in own.values():
            if p.name == "settings":
                parameters += field_parameters
            else:
                parameters.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=command_hints[p.name]))
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
        out.print_json(json.dumps(summary.to_json()))


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
        out.print_json(json.dumps(summary.to_json()))


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
        out.print_json(json.dumps(summary.to_json()))


@app.command(short_help="ranked documents for a query: dense, lexical or hybrid")
@user_errors
@options_of(SearchSettings)
def search(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to look for.")],
    settings: SearchSettings,
    workspace: WorkspaceOption = Path("workspace"),
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

    hits = workflows.search(Workspace(workspace), query, settings)
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


@app.command(name="eval", short_help="nDCG@10, Recall@100, MRR@10 on judged (BEIR-format) queries")
@user_errors
@options_of(EvalSettings)
def eval_command(
    settings: EvalSettings, workspace: WorkspaceOption = Path("workspace"), json_output: JsonOption = False
):
    """Retrieval quality on judged queries: nDCG@10, Recall@100 and MRR@10 (pytrec_eval).

    Examples:

    \b
        pipeline eval --queries scifact/queries.jsonl --qrels scifact/qrels/test.tsv
        pipeline eval --queries q.jsonl --qrels qrels.tsv --mode all --json
        pipeline eval --queries q.jsonl --qrels qrels.tsv --mode all --set-default
        pipeline eval --queries q.jsonl --qrels qrels.tsv --where "year >= 2015"   # on a part of the collection
    """
    reports = workflows.evaluate(Workspace(workspace), settings)
    if json_output:
        rows = [r.to_json() for r in reports]
        out.print_json(json.dumps(rows if len(rows) > 1 else rows[0]))
        return
    for r in reports:
        out.print(
            f"{r.mode:8} nDCG@10 {r.ndcg_at_10:.4f}  Recall@100 {r.recall_at_100:.4f}  MRR@10 {r.mrr_at_10:.4f}  "
            f"({r.queries} queries, {r.queries_per_s:.1f}/s)"
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
        out.print_json(json.dumps(summary.to_json()))


@app.command(short_help="HTTP API and web page for search and document writes")
@user_errors
@options_of(ServeSettings)
def serve(settings: ServeSettings, workspace: WorkspaceOption = Path("workspace")):
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
    workflows.serve(Workspace(workspace), settings)


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
        out.print_json(json.dumps(report.to_json()))
    else:
        for name, part in report.parts.items():
            out.print(f"{name:10} {part.state:8} {part.detail}")
        for problem in report.problems:
            out.print(Text.assemble(("problem:", "red"), " ", problem))
        if not report.problems:
            out.print("consistent", style="green")
    if report.problems:
        raise typer.Exit(1)


@app.command(short_help="rank parallel training plans by predicted step time and memory")
@user_errors
@options_of(PlanSettings)
def plan(settings: PlanSettings, workspace: WorkspaceOption = Path("workspace"), json_output: JsonOption = False):
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

    from pretrain.planner.rank import table_rows, why

    result = workflows.plan(Workspace(workspace), settings)
    if json_output:
        out.print_json(json.dumps(result.to_dict()))
        return
    table = Table(
        title=f"{len(result.ranked)} plans fit on {result.cluster.describe()} ({len(result.rejected)} do not); "
        f"global batch {result.work.global_batch} × {result.work.seq_len} tokens"
    )
    for column in ("#", "plan", "step ms", "tokens/s", "MiB/device", "main costs"):
        table.add_column(column, justify="right" if column in ("#", "step ms", "tokens/s", "MiB/device") else "left")
    for row in table_rows(result, settings.top):
        table.add_row(*row)
    out.print(table)
    out.print(f"best: {result.ranked[0].label}: {why(result.ranked[0], result)}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
