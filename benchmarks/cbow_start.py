"""Issue 49's proxy for a masked pretraining objective: what the best token table a small bidirectional
objective could teach gives the static embedder as its start. CBOW (word2vec's masked objective: each token
predicted from the mean of the 4 tokens either side, full softmax) is trained at the pretrained model's width on
a pretrained workspace's training tokens for a fixed time; a copy of the workspace is written whose model's token
embeddings (wte, tied to the head) are the CBOW input table, scaled to the GPT-2's spread. The copy then goes
through the chain as any other (`pipeline tune`, `embed`, `index`, `eval`):

    .venv/bin/python benchmarks/cbow_start.py --workspace WS --copy WS_CBOW --seconds 240

Results: benchmarks/results/2026-11-29-issue49-candidates-cpu.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

WINDOW = 4  # tokens either side
BATCH = 4096  # centre tokens a step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, required=True, help="a pretrained workspace (its data/ and model/)")
    parser.add_argument("--copy", type=Path, required=True, help="the workspace copy to write, with the CBOW table")
    parser.add_argument("--seconds", type=float, default=240.0, help="CBOW's training time")
    args = parser.parse_args()
    source, copy, seconds = args.workspace, args.copy, args.seconds
    torch.manual_seed(0)
    meta = json.loads((source / "data" / "meta.json").read_text())
    shards = [np.fromfile(source / "data" / s["file"], dtype=meta["dtype"]) for s in meta["shards"]["train"]]
    tokens = torch.from_numpy(np.concatenate(shards).astype(np.int64))
    weights = load_file(source / "model" / "model.safetensors")
    wte = weights["transformer.wte.weight"]
    vocab, width = wte.shape
    table, head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab)
    torch.nn.init.normal_(table.weight, std=0.1)
    optimizer = torch.optim.Adam([*table.parameters(), *head.parameters()], lr=3e-3)
    offsets = torch.tensor([o for o in range(-WINDOW, WINDOW + 1) if o != 0])
    start, step = time.time(), 0
    while time.time() - start < seconds:
        centre = torch.randint(WINDOW, len(tokens) - WINDOW, (BATCH,))
        logits = head(table(tokens[centre[:, None] + offsets]).mean(1))
        loss = torch.nn.functional.cross_entropy(logits, tokens[centre])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 200 == 0:
            print(step, f"{loss.item():.3f}", f"{step * BATCH / len(tokens):.2f} epochs", flush=True)
    print("steps", step, "positions", step * BATCH, "epochs", step * BATCH / len(tokens), "loss", loss.item())
    shutil.copytree(source, copy)
    weights["transformer.wte.weight"] = (table.weight.detach() * (wte.std() / table.weight.std())).contiguous()
    if "lm_head.weight" in weights:
        weights["lm_head.weight"] = weights["transformer.wte.weight"]
    save_file(weights, copy / "model" / "model.safetensors", metadata={"format": "pt"})


if __name__ == "__main__":
    main()
