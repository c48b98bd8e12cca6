"""The README and docs/ as a reader follows them: every `pipeline ...` line they show is a command with options
the CLI accepts, every relative link leads to a file (and heading) that exists, and the README's test command
is the one CI runs. Commands are parsed, never run: each line costs milliseconds."""

import re
import shlex
from pathlib import Path

import pytest
import typer

from conftest import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
FENCED = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
SHELL = ("bash", "sh", "shell", "console")
SEPARATORS = {"&&", "||", ";", "|", "&"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def code_blocks(text: str, languages: tuple[str, ...] | None = None) -> list[str]:
    """The fenced code blocks of a Markdown text, optionally only those of the given languages."""
    return [body for language, body in FENCED.findall(text) if languages is None or language in languages]


def pipeline_commands(block: str) -> list[list[str]]:
    """The `pipeline` invocations of a block of shell lines, each as its argument list: lines continued with a
    backslash are joined, comments dropped, `a && b` split, leading VAR=value assignments skipped; lines that
    run something else (bash, .venv/bin/python) are not ours."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        segment: list[str] = []
        for token in [*lexer, ";"]:
            if token not in SEPARATORS:
                segment.append(token)
                continue
            while segment and ASSIGNMENT.match(segment[0]):
                segment.pop(0)
            if segment and (segment[0] == "pipeline" or segment[0].endswith("/pipeline")):
                commands.append(segment[1:])
            segment = []
    return commands


def shown_commands() -> list[tuple[str, list[str]]]:
    """(where, arguments) of every `pipeline` line in the README's code blocks and in docs/'s shell blocks."""
    found = [("README.md", args) for block in code_blocks(README.read_text()) for args in pipeline_commands(block)]
    for doc in DOCS:
        for block in code_blocks(doc.read_text(), SHELL):
            found += [(f"docs/{doc.name}", args) for args in pipeline_commands(block)]
    return found


def parse_only() -> typer.core.TyperGroup:
    """The CLI as `pipeline` runs it, with every command's body (and the root's) replaced by nothing: parsing,
    choices, ranges and the options' own callbacks still run, and a command whose options are a settings
    dataclass's has its settings made (where their ranges are checked), so an unknown command, an unknown
    option, a missing argument or a value out of range fails as it would for the user, and nothing is
    computed."""
    from cli import app

    group = typer.main.get_command(app)  # a new click object: the app itself is left as it is
    group.callback = None
    for registered in app.registered_commands:
        name = registered.name or registered.callback.__name__
        group.commands[name].callback = settings_check(getattr(registered.callback, "settings_class", None))
    return group


def settings_check(settings_class):
    """A command body that only makes the command's settings (if it has a settings class), as cli.options_of
    does before running the command."""
    from cli import make_settings
    from common.options import OptionError

    def check(**values) -> None:
        if settings_class is not None:
            try:
                make_settings(settings_class, values)
            except OptionError as e:
                raise usage_error()(str(e)) from None

    return check


def check_command(args: list[str]) -> None:
    """Raise click's UsageError (typer's vendored click) if `pipeline ARGS` would be refused."""
    parse_only().main(list(args), prog_name="pipeline", standalone_mode=False)


def usage_error() -> type[Exception]:
    from typer._click.exceptions import UsageError  # typer>=0.29 vendors click

    return UsageError


def test_the_readme_shows_every_command():
    """The README's code blocks show each command at least once (the check below covers them)."""
    from cli import app

    shown = {args[0] for where, args in SHOWN if where == "README.md" and args}
    assert set(typer.main.get_command(app).commands) <= shown


SHOWN = shown_commands()


@pytest.mark.parametrize("where, args", SHOWN, ids=[f"{where}: pipeline {shlex.join(args)}" for where, args in SHOWN])
def test_each_command_line_shown_is_one_the_cli_accepts(where, args):
    try:
        check_command(args)
    except usage_error() as e:
        pytest.fail(f"{where}: `pipeline {shlex.join(args)}` is refused: {e.format_message()}")


@pytest.mark.parametrize(
    "line",
    [
        'pipeline search "query" --no-such-option',
        "pipeline frobnicate --data docs/",
        "pipeline index --type nope",
        "pipeline search",
        "pipeline search q -k 0",
        "pipeline tune --time-budget soon",
        "pipeline pretrain --lr nan",
        "pipeline index --shards 0",
        "pipeline eval --queries q.jsonl",
    ],
)
def test_the_check_refuses_what_the_cli_refuses(line):
    """The check can fail: a made-up option or command, a bad choice, a missing argument or required option, a
    number out of range (of a Typer option and of a settings field) and a malformed duration are all
    refused."""
    (args,) = pipeline_commands(line)
    with pytest.raises(usage_error()):
        check_command(args)


def test_the_command_lines_are_read_as_a_shell_reads_them():
    block = (
        "pipeline embed && pipeline index   # both\n"
        "WANDB_MODE=offline .venv/bin/pipeline pretrain --data docs/ \\\n    --wandb\n"
        ".venv/bin/python benchmarks/bench_index.py   # not a pipeline command\n"
        "pipeline search \"bone density\" --where \"year >= 2015 AND journal IN ('Nature', 'Cell')\"\n"
    )
    assert pipeline_commands(block) == [
        ["embed"],
        ["index"],
        ["pretrain", "--data", "docs/", "--wandb"],
        ["search", "bone density", "--where", "year >= 2015 AND journal IN ('Nature', 'Cell')"],
    ]


LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def relative_links(text: str) -> list[str]:
    """The targets of a Markdown text's links that are neither web addresses nor in code."""
    prose = INLINE_CODE.sub("", FENCED.sub("", text))
    return [target for target in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings: lower case, punctuation dropped, spaces as hyphens,
    repeats numbered."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCED.sub("", text), re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        numbered, n = anchor, 0
        while numbered in anchors:
            n += 1
            numbered = f"{anchor}-{n}"
        anchors.add(numbered)
    return anchors


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in relative_links(path.read_text()):
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text()):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda path: str(path.relative_to(REPO)))
def test_relative_links_lead_to_files_that_exist(path):
    assert relative_links(path.read_text()) or path == README, "no links found: is the pattern right?"
    assert broken_links(path) == []


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md), [ok](there.md#a-heading), [web](https://example.com/x), `[code](nowhere.md)`,\n"
        "[missing](nowhere.md), [no heading](there.md#elsewhere)\n"
    )
    assert broken_links(page) == ["nowhere.md (no such file)", "there.md#elsewhere (no such heading)"]


def test_the_readmes_test_command_is_the_one_ci_runs():
    """The README's "Tests and benchmarks" gives the test command first; .ci/run runs that same command."""
    section = README.read_text().split("\n## Tests and benchmarks\n", 1)[1]
    command = code_blocks(section)[0].strip()
    assert command == "bash scripts/test.sh"
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci
