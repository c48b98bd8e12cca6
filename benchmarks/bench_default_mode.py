"""The default search mode `pipeline index` chooses, against judged queries (issue 50): for each built
workspace and its BEIR folder, the held-out measurement (search/calibrate.measure_modes: each mode's
nDCG@10 on held-out corpus pairs, the mode and dense weight chosen) beside the judged nDCG@10 of lexical,
dense and hybrid at dense weights 0.1 ... 0.7 on the train and test queries, and how far the chosen mode is
from the best judged one (target: within 0.01).

    .venv/bin/python benchmarks/bench_default_mode.py WS=BEIR_DIR [WS=BEIR_DIR ...]
    # e.g. /tmp/coll/cranfield=benchmarks/collections/cranfield
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks_common import pipeline, write_result
from common.embedder import load_embedder
from common.manifest import read_manifest
from common.workspace import Workspace
from search.calibrate import measure_modes

WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
TARGET_GAP = 0.01


def judged(ws: Path, beir: Path, split: str, *mode: str) -> float:
    """nDCG@10 of `pipeline eval` on the split's judged queries, in the given mode."""
    qrels = beir / "qrels" / f"{split}.tsv"
    done = pipeline(
        "eval", "-w", str(ws), "--queries", str(beir / "queries.jsonl"), "--qrels", str(qrels), "--json", *mode
    )
    report = json.loads(done.stdout)
    return round((report[0] if isinstance(report, list) else report)["ndcg@10"], 4)


def judged_columns(ws: Path, beir: Path, split: str) -> dict[str, float]:
    columns = {mode: judged(ws, beir, split, "--mode", mode) for mode in ("lexical", "dense")}
    for w in WEIGHTS:
        columns[f"hybrid {w}"] = judged(ws, beir, split, "--mode", "hybrid", "--dense-weight", str(w))
    return columns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", help="WORKSPACE=BEIR_DIR")
    args = parser.parse_args()
    rows = {}
    for pair in args.pairs:
        ws, beir = (Path(part).resolve() for part in pair.split("=", 1))
        workspace = Workspace(ws)
        measured = measure_modes(workspace, load_embedder(read_manifest(workspace).embedder.model_dir(workspace)))
        chosen = measured.mode if measured.mode != "hybrid" else f"hybrid {measured.dense_weight}"
        row = {
            "held_out": measured.ndcg,
            "held_out_se": measured.ndcg_se,
            "pair_kinds": measured.pair_kinds,
            "dense_weight": measured.dense_weight,
            "chosen": chosen,
        }
        for split in ("train", "test"):
            if not (beir / "qrels" / f"{split}.tsv").exists():
                continue
            columns = judged_columns(ws, beir, split)
            if chosen not in columns:  # a weight between the columns: judged on its own
                columns[chosen] = judged(ws, beir, split, "--mode", "hybrid", "--dense-weight", chosen.split()[1])
            best = max(columns.values())
            row[split] = {
                "judged": columns,
                "chosen": columns[chosen],
                "best": best,
                "gap": round(best - columns[chosen], 4),
            }
        row["target_met"] = all(row[s]["gap"] <= TARGET_GAP for s in ("train", "test") if s in row)
        rows[beir.name] = row
        print(beir.name, json.dumps({k: v for k, v in row.items() if k != "held_out"}), flush=True)
    write_result("default_mode", {"target_gap": TARGET_GAP, "collections": rows})


if __name__ == "__main__":
    main()
