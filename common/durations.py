"""Durations as the commands take them (--time-budget 90s, 15m, 1.5h): light, so that cli.py can check one
where the option is declared without importing a stage."""

from __future__ import annotations

import math

UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """Seconds in '90s', '15m', '1.5h' or a bare number of seconds; ValueError unless more than 0 and finite."""
    value = text.strip().lower()
    try:
        seconds = float(value[:-1]) * UNITS[value[-1]] if value and value[-1] in UNITS else float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):  # "soon", "nan", "inf"
        raise ValueError(f"'{text}' is not a duration (e.g. 90s, 15m, 1.5h)")
    if not seconds > 0:
        raise ValueError(f"must be more than 0s, got '{text}'")
    return seconds


def format_eta(seconds: float) -> str:
    """A duration as h:mm:ss (a time left, a time taken)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
