"""Export the trained model in Hugging Face format, loadable by transformers and sentence-transformers.

The directory holds config.json + model.safetensors (GPT2LMHeadModel), the tokenizer files, and
the sentence-transformers module files (Transformer + mean Pooling), so both
`AutoModelForCausalLM.from_pretrained(dir)` and `SentenceTransformer(dir)` work on it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer

from common.workspace import replace_directory
from pretrain.config import ModelConfig
from pretrain.tokenizer import END_OF_TEXT


def to_hf_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename our parameters to GPT2LMHeadModel's. HF's Conv1D stores weights as (in, out): transpose."""
    hf = {
        "transformer.wte.weight": state["tok_emb.weight"],
        "transformer.wpe.weight": state["pos_emb.weight"],
        "transformer.ln_f.weight": state["ln_f.weight"],
        "transformer.ln_f.bias": state["ln_f.bias"],
    }
    for i in range(cfg.n_layer):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            hf[theirs + f"{ln}.weight"] = state[ours + f"{ln}.weight"]
            hf[theirs + f"{ln}.bias"] = state[ours + f"{ln}.bias"]
        qkv = [ours + f"attn.{p}_proj" for p in "qkv"]
        hf[theirs + "attn.c_attn.weight"] = torch.cat([state[n + ".weight"] for n in qkv], dim=0).t()
        hf[theirs + "attn.c_attn.bias"] = torch.cat([state[n + ".bias"] for n in qkv], dim=0)
        for ours_name, theirs_name in (
            ("attn.out_proj", "attn.c_proj"),
            ("mlp.fc_in", "mlp.c_fc"),
            ("mlp.fc_out", "mlp.c_proj"),
        ):
            hf[theirs + theirs_name + ".weight"] = state[ours + ours_name + ".weight"].t()
            hf[theirs + theirs_name + ".bias"] = state[ours + ours_name + ".bias"]
    return {k: v.detach().clone().contiguous() for k, v in hf.items()}


def export_model(state: dict[str, torch.Tensor], cfg: ModelConfig, tokenizer: Tokenizer, out_dir: Path) -> Path:
    """Write the export into a temporary directory, then swap it in: a crash leaves the old export intact."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    eot = tokenizer.token_to_id(END_OF_TEXT)
    # gelu_pytorch_tanh is what pretrain/model.py runs (F.gelu(approximate="tanh")); gelu_new, the same
    # function written as eight tensor operations, was a third of the exported model's CPU time.
    hf_config = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        activation_function="gelu_pytorch_tanh",
        layer_norm_epsilon=1e-5,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        tie_word_embeddings=True,
    )
    hf_model = GPT2LMHeadModel(hf_config)
    missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(state, cfg), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")]
    if missing or unexpected:
        raise RuntimeError(f"export mapping is incomplete: missing {missing}, unexpected {unexpected}")
    hf_model.tie_weights()
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        model_max_length=cfg.block_size,
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.staging."))
    try:
        hf_only = staging / "hf"
        hf_model.save_pretrained(hf_only)
        hf_tokenizer.save_pretrained(hf_only)
        embedder = SentenceTransformer(
            modules=[
                Transformer(str(hf_only), max_seq_length=cfg.block_size),
                Pooling(cfg.n_embd, pooling_mode="mean"),
            ],
            device="cpu",
        )
        final = staging / "model"
        embedder.save(str(final))
        # sentence-transformers saved the base GPT2Model; overwrite with the LM-head model (same
        # weights plus the tied head) so AutoModelForCausalLM loads it as well.
        hf_model.save_pretrained(final)
        hf_tokenizer.save_pretrained(final)
        replace_directory(final, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
