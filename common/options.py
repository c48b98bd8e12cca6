"""Settings declared once: a command's settings are a dataclass whose fields carry their option's help, flags
and range (`option`). cli.py makes the command's options from the fields (`cli.options_of`), a Python program
makes the same dataclass, and `check_declared` (called from the dataclass's `__post_init__`) checks every
field's range before anything runs: `--lr nan` or `--steps 0` is one line naming the option.

Light on purpose (no torch): the CLI imports the settings classes to build `--help`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from common.durations import parse_duration
from common.errors import PipelineError

SEED_MAX = 2**32 - 1  # numpy's (transformers seeds it), the narrowest of the seeded generators
MAX_PORT = 65535


@dataclass(frozen=True)
class Declared:
    """How a field is offered as an option: its help, its flags (default: --field-name), its range, and a
    metavar; `above` is an exclusive lower bound (a rate, a timeout), `duration` a text like 90s or 15m,
    `listing` the items of a comma-separated list of them (completed in the shell)."""

    help: str
    flags: tuple[str, ...] = ()
    min: float | None = None
    max: float | None = None
    above: float | None = None
    duration: bool = False
    metavar: str | None = None
    listing: tuple[str, ...] = ()
    envvar: str | None = None

    def range_text(self) -> str | None:
        """The range as --help shows it: x>=1, 0<=x<=1, x>0."""
        if self.above is not None:
            return f"x>{number(self.above)}"
        if self.min is not None and self.max is not None:
            return f"{number(self.min)}<=x<={number(self.max)}"
        if self.min is not None:
            return f"x>={number(self.min)}"
        return None

    def problem(self, value: Any) -> str | None:
        """What is wrong with a value of this option, or None."""
        if value is None or isinstance(value, bool):
            return None
        if self.listing:
            items = [item.strip() for item in value.split(",") if item.strip()]
            unknown = [item for item in items if item not in self.listing]
            if unknown or not items:
                what = f"unknown kind '{','.join(unknown)}'" if unknown else "no kind given"
                return f"{what} (choose from {', '.join(self.listing)})"
            return None
        if self.duration:
            try:
                parse_duration(value)
            except ValueError as e:
                return str(e)
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return f"{value} is not a finite number"
        if isinstance(value, (int, float)):
            low_ok = (self.min is None or value >= self.min) and (self.above is None or value > self.above)
            if not low_ok or (self.max is not None and value > self.max):
                return f"{number(value)} is not in the range {self.range_text()}"
        return None

    def complete(self, incomplete: str) -> list[str]:
        """Shell completion of a comma-separated `listing`: the list so far, with each item its last one can
        still become."""
        done, _, last = incomplete.rpartition(",")
        chosen = done.split(",") if done else []
        return [",".join([*chosen, item]) for item in self.listing if item.startswith(last) and item not in chosen]


def number(value: float) -> str:
    """A bound or value as typed: 4294967295, 0.001, 1e-09."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def option(default: Any = None, help: str = "", *, factory=None, required: bool = False, **declared) -> Any:
    """A settings field that is also an option (Declared's arguments); a `required` one has no default (it comes
    before the fields that have one)."""
    metadata = {"option": Declared(help, **declared)}
    if required:
        return field(metadata=metadata)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def declared_fields(settings_class) -> list[dataclasses.Field]:
    """The fields that are options (a settings class may also hold fields that are not)."""
    return [f for f in dataclasses.fields(settings_class) if "option" in f.metadata]


class OptionError(PipelineError):
    """A setting out of its declared range; `option` is its flag (--lr)."""

    def __init__(self, option: str, problem: str):
        super().__init__(f"{option}: {problem}")
        self.option, self.problem = option, problem


def flag(f: dataclasses.Field) -> str:
    """A field's option as the user types it: its first flag, else --field-name."""
    declared = f.metadata["option"]
    return declared.flags[0].split("/")[0] if declared.flags else "--" + f.name.replace("_", "-")


def check_declared(settings) -> None:
    """Raise OptionError for the first field whose value is outside its declared range, or not one of the
    choices its type lists (a Literal): the CLI's parser checks those too, a Python caller only here."""
    hints = typing.get_type_hints(type(settings))
    for f in declared_fields(settings):
        value = getattr(settings, f.name)
        choices = literal_choices(hints[f.name])
        if choices and value is not None and value not in choices:
            raise OptionError(flag(f), f"unknown {value!r} (choose from {', '.join(choices)})")
        problem = f.metadata["option"].problem(value)
        if problem is not None:
            raise OptionError(flag(f), problem)


def literal_choices(hint) -> tuple:
    """The values a Literal type (or an Optional of one) allows; () for any other type."""
    if typing.get_origin(hint) is typing.Union:
        return next((literal_choices(arg) for arg in typing.get_args(hint) if literal_choices(arg)), ())
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()
