"""A workspace's training runs as their files hold them, for what shows them (the server's runs page,
search/serve/runs.py): metrics.jsonl's records (pretrain/metrics.py writes them) and a TensorBoard run's
scalars (common/board.py writes them; read back here with TensorBoard's own reader)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from common.workspace import Workspace


def _finite_or_none(constant: str) -> None:
    return None  # NaN and ±Infinity (a diverged run's loss): JSON has no such numbers, a chart draws a gap


def read_run_log(ws: Workspace) -> list[dict]:
    """metrics.jsonl's records in order ([] without a pretraining run). A line that is not JSON is the one a
    running pretrain is writing: left out. NaN and infinite figures become None."""
    if not ws.metrics_path.exists():
        return []
    records = []
    for line in ws.metrics_path.read_text().splitlines():
        try:
            record = json.loads(line, parse_constant=_finite_or_none)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard run directory, tag -> [(step, value)] ({} when there is none). All the
    points, not the reader's default sample of them; values as the event files hold them (float32)."""
    if not directory.is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {
        tag: [(e.step, e.value if math.isfinite(e.value) else None) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }
