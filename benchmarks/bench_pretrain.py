"""Single-process pretraining throughput (tokens/s) and model-FLOPs utilisation (MFU).

MFU = tokens/s x training FLOPs per token / this machine's matmul peak, the peak measured in the
same run (a square float32 matmul), so the ratio is comparable across noisy runs. Trains on all of
SciFact with the tiny preset and with the GPT-2 small shape (a few steps).

    python benchmarks/bench_pretrain.py
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from benchmarks_common import SCIFACT, pipeline, write_result

CASES = {
    "tiny": ["--preset", "tiny", "--max-steps", "60", "--log-every", "10"],
    "gpt2-small-shape": [
        "--preset",
        "small",
        "--vocab-size",
        "8192",
        "--seq-len",
        "256",
        "--batch-size",
        "4",
        "--max-steps",
        "6",
        "--log-every",
        "1",
    ],
}


def main() -> None:
    from pretrain.hardware import measure_matmul_flops

    peak = measure_matmul_flops(seconds=2.0)
    results = {}
    for name, args in CASES.items():
        ws = Path(tempfile.mkdtemp()) / name
        pipeline(
            "pretrain",
            "-w",
            str(ws),
            "--data",
            str(SCIFACT / "corpus.jsonl"),
            "--eval-every",
            "1000",
            "--checkpoint-every",
            "1000",
            "--no-adapt",
            *args,
        )
        steps = [json.loads(line) for line in (ws / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
        steady = steps[1:] or steps  # the first interval includes warm-up
        results[name] = {
            "parameters": json.loads((ws / "manifest.json").read_text())["model"]["parameters"],
            "tokens_per_s": statistics.median(s["tokens_per_s"] for s in steady),
            "mfu": statistics.median(s["mfu"] for s in steady),
            "peak_rss_mb": max(s.get("peak_rss_mb", 0) for s in steps),
        }
    write_result("pretrain", {"matmul_peak_gflops": peak / 1e9, "cases": results})


if __name__ == "__main__":
    main()
