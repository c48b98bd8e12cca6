"""`pipeline embed` throughput against SentenceTransformer.encode of the same model on the same documents.

Both embed title + text of every SciFact document with the workspace's pretrained tiny model. The
baseline encodes each document once, truncated to the model's max_seq_length; the pipeline chunks
every document fully (so it embeds at least as many tokens), stores chunks and vectors in DuckDB.
Target: ratio (pipeline docs/s / encode docs/s) >= 1.0.

    python benchmarks/bench_embed.py [--workspace DIR] [--docs N]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks_common import SCIFACT, pretrained_workspace, write_result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path(tempfile.gettempdir()) / "bench-scifact-ws")
    parser.add_argument("--docs", type=int, default=None, help="only the first N documents")
    args = parser.parse_args()

    from common.embedder import embedding_text, encode, load_embedder
    from common.readers import read_documents
    from common.workspace import Workspace
    from embed.run import run_embed
    from embed.settings import EmbedSettings

    source = pretrained_workspace(args.workspace)
    docs = list(read_documents([SCIFACT / "corpus.jsonl"]))[: args.docs]
    data = Path(tempfile.mkdtemp()) / "corpus.jsonl"
    data.write_text("".join(line + "\n" for line in (SCIFACT / "corpus.jsonl").read_text().splitlines()[: len(docs)]))

    model = load_embedder(source / "model")
    texts = [embedding_text(d.title, d.text) for d in docs]
    encode(model, texts[:64])  # warm-up
    start = time.perf_counter()
    encode(model, texts, batch_size=64)
    baseline_s = time.perf_counter() - start
    baseline_tokens = sum(min(len(ids), model.max_seq_length) for ids in model.tokenizer(texts)["input_ids"])

    ws = Workspace(Path(tempfile.mkdtemp()) / "ws").create()
    shutil.copytree(source / "model", ws.model_dir)
    run = run_embed(ws, [data], None, EmbedSettings())
    pipeline_s = run.seconds
    from common.store import Store

    with Store(ws.db_path, read_only=True) as store:
        pipeline_tokens = store.con.execute("SELECT sum(n_tokens) FROM chunks").fetchall()[0][0]

    write_result(
        "embed",
        {
            "documents": len(docs),
            "model": str(source / "model"),
            "encode_seconds": baseline_s,
            "encode_docs_per_s": len(docs) / baseline_s,
            "encode_tokens": baseline_tokens,
            "pipeline_seconds": pipeline_s,
            "pipeline_docs_per_s": len(docs) / pipeline_s,
            "pipeline_chunks": run.embedder.chunks,
            "pipeline_tokens": pipeline_tokens,
            "chunk_tokens": run.embedder.chunk_tokens,
            "overlap": run.embedder.overlap,
            "ratio_pipeline_over_encode": baseline_s / pipeline_s,
            "target_ratio": 1.0,
        },
    )


if __name__ == "__main__":
    main()
