"""search, eval and serve's settings (search/settings.py): checked once, when they are made, by a Python caller
and the CLI alike."""

import math
from pathlib import Path

import pytest

from common.options import OptionError
from conftest import run_cli
from search.settings import EvalSettings, SearchSettings, ServeSettings


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SearchSettings(mode="fuzzy"), "--mode: unknown 'fuzzy' (choose from dense, lexical, hybrid)"),
        (lambda: SearchSettings(k=0), "-k: 0 is not in the range 1<=x<=1000"),
        (lambda: SearchSettings(dense_weight=math.nan), "--dense-weight: nan is not a finite number"),
        (lambda: SearchSettings(dense_weight=1.5), "--dense-weight: 1.5 is not in the range 0<=x<=1"),
        (
            lambda: EvalSettings(Path("q.jsonl"), Path("qrels.tsv"), mode="dense", set_default=True),
            "--set-default: it needs --mode all: the default is the best of the measured modes",
        ),
        (
            lambda: EvalSettings(Path("q.jsonl"), Path("qrels.tsv"), mode="all", set_default=True, where="year > 1"),
            "--set-default: it measures the whole collection: leave out --where",
        ),
        (lambda: ServeSettings(replicas=2), "--replicas: it is for --ray: give --ray ADDRESS too"),
        (lambda: ServeSettings(port=70000), "--port: 70000 is not in the range 1<=x<=65535"),
    ],
)
def test_settings_out_of_range_or_contradictory_are_refused_when_made(make, message):
    with pytest.raises(OptionError) as error:
        make()
    assert str(error.value) == message


def test_the_defaults_are_the_commands_defaults():
    assert SearchSettings().k == 10 and EvalSettings(Path("q"), Path("r")).k == 100
    assert ServeSettings().host == "127.0.0.1"  # loopback unless told otherwise
    assert SearchSettings(source="docs/*.md").document_filter() is not None
    assert SearchSettings().document_filter() is None


def test_the_cli_refuses_what_the_settings_refuse_in_one_line_before_reading_anything(tmp_path):
    missing = str(tmp_path / "absent.jsonl")
    result = run_cli(
        "-w", str(tmp_path / "ws"), "eval", "--queries", missing, "--qrels", missing, "--set-default", check=False
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "error: --set-default: it needs --mode all: the default is the best of the measured modes; "
        "see `pipeline eval --help`"
    )
    result = run_cli("serve", "-w", str(tmp_path / "ws"), "--api-key", "k", "--replicas", "3", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: --replicas: it is for --ray")
    assert not (tmp_path / "ws").exists()
