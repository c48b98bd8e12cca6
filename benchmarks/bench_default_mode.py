"""The default search mode `pipeline index` chooses, against judged queries (issue 50): for each built
workspace and its BEIR folder, the held-out measurement (search/calibrate.measure_modes: each mode's
nDCG@10 on held-out corpus pairs, by family of pairs and pooled, the mode and dense weight chosen) beside
the judged nDCG@10 of lexical, dense and hybrid at dense weights 0.1 ... 0.9 on the train and test
queries, and how far the chosen mode is from the best judged one (target: within 0.01).

    .venv/bin/python benchmarks/bench_default_mode.py WS=BEIR_DIR [WS=BEIR_DIR ...]
    # e.g. /tmp/coll/cranfield=benchmarks/collections/cranfield
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks_common import write_result
from common.workspace import Workspace
from search.calibrate import measure_modes
from search.engine import SearchEngine
from search.evaluate import evaluate, read_qrels, read_queries

WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
TARGET_GAP = 0.01


def judged_columns(engine: SearchEngine, queries: dict, qrels: dict, chosen_weight: float | None) -> dict[str, float]:
    """nDCG@10 on the judged queries (as `pipeline eval` scores them) of lexical, dense, hybrid at each of
    WEIGHTS, and hybrid at the chosen weight when it is not one of them."""
    columns = {mode: evaluate(engine, queries, qrels, mode).ndcg_at_10 for mode in ("lexical", "dense")}
    for w in sorted({*WEIGHTS, *([chosen_weight] if chosen_weight is not None else [])}):
        columns[f"hybrid {w}"] = evaluate(engine, queries, qrels, "hybrid", dense_weight=w).ndcg_at_10
    return {name: round(value, 4) for name, value in columns.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", help="WORKSPACE=BEIR_DIR")
    args = parser.parse_args()
    rows = {}
    for pair in args.pairs:
        ws, beir = (Path(part).resolve() for part in pair.split("=", 1))
        workspace = Workspace(ws)
        engine = SearchEngine(workspace)
        measured = measure_modes(workspace, engine.model)
        chosen = measured.mode if measured.mode != "hybrid" else f"hybrid {measured.dense_weight}"
        row = {
            "held_out": measured.ndcg,
            "held_out_se": measured.ndcg_se,
            "held_out_by_pair_family": measured.ndcg_by_pair_family,
            "pair_kinds": measured.pair_kinds,
            "dense_weight": measured.dense_weight,
            "chosen": chosen,
        }
        queries = read_queries(beir / "queries.jsonl")
        for split in ("train", "test"):
            if not (beir / "qrels" / f"{split}.tsv").exists():
                continue
            qrels = read_qrels(beir / "qrels" / f"{split}.tsv")
            columns = judged_columns(
                engine, queries, qrels, measured.dense_weight if measured.mode == "hybrid" else None
            )
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
