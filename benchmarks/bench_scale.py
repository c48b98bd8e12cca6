"""Scale: synthetic abstract-like documents through `pipeline embed` and `pipeline index`, then a 1% update.

The documents are made here from SciFact with a seed: each is a title and 4 to 9 sentences drawn from
the whole corpus's abstracts, and a `year`. Each command runs as a user runs it (a new process, start-up
included); wall time and peak RSS (the process and its children, sampled by psutil every 50 ms) are
measured per command. Then 1% more documents are embedded and indexed (an incremental update) and its
cost is compared with the full embed + index. JSON to benchmarks/results/scale.json (written after
every step, so an interrupted run keeps what it measured).

    .venv/bin/python benchmarks/bench_scale.py --model WORKSPACE/tuned [--documents 100000]

--model: a sentence-transformers directory; the issue's figures are for the static embedder
`pipeline tune` makes (WORKSPACE/tuned after `pipeline pretrain`, whose adaptation runs tune).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks_common import run_measured, synthetic_documents

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"embed_docs_per_s": 4000, "embed_plus_index_s": 60, "peak_rss_gb": 4, "update_ratio": 0.05}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", type=Path, required=True, help="sentence-transformers directory (the static embedder tune made)"
    )
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--update-share", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale.json")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "documents": args.documents,
        "model": str(args.model.resolve()),
        "seed": args.seed,
        "targets": TARGETS,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }

    def save():
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        tmp = Path(tmp)
        documents = list(synthetic_documents(args.documents, args.seed))
        data = tmp / "docs.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in documents))
        ws = str(tmp / "ws")

        def step(name: str, command: list[str]) -> dict:
            measured = run_measured([*command, "-w", ws, "--json"])
            summary = json.loads(measured.pop("stdout"))
            result[name] = {
                **measured,
                "summary": {k: v for k, v in summary.items() if not isinstance(v, (dict, list)) or k == "search"},
            }
            print(f"{name}: {measured['seconds']}s, peak RSS {measured['peak_rss_gb']} GB", flush=True)
            save()
            return summary

        embedded = step("embed", ["embed", "--data", str(data), "--model", str(args.model.resolve())])
        step("index", ["index"])
        full = result["embed"]["seconds"] + result["index"]["seconds"]
        result["embed_docs_per_s"] = round(args.documents / result["embed"]["seconds"], 1)
        result["embed_plus_index_s"] = round(full, 2)
        result["chunks"] = embedded["chunks"]

        added = list(
            synthetic_documents(max(1, int(args.documents * args.update_share)), args.seed + 1, first_id=args.documents)
        )
        with data.open("a") as f:
            f.write("".join(json.dumps(d) + "\n" for d in added))
        step("update_embed", ["embed", "--data", str(data), "--model", str(args.model.resolve())])
        step("update_index", ["index"])
        update = result["update_embed"]["seconds"] + result["update_index"]["seconds"]
        result["update_documents"] = len(added)
        result["update_s"] = round(update, 2)
        result["update_ratio"] = round(update / full, 4)
        result["peak_rss_gb"] = max(
            result[s]["peak_rss_gb"] for s in ("embed", "index", "update_embed", "update_index")
        )
        result["load_average_after"] = os.getloadavg()
        save()
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "documents",
                    "chunks",
                    "embed_docs_per_s",
                    "embed_plus_index_s",
                    "update_s",
                    "update_ratio",
                    "peak_rss_gb",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
