"""Loading an embedding model: any sentence-transformers directory (ours, exported by pretrain, or external).

Embed and search both load the model through here so a query is encoded exactly as the documents were.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from common.console import info
from common.errors import PipelineError

# Chunk length for models without a token limit (static embeddings), the common 512 of passage
# retrieval: on SciFact's train queries, chunks of 480 tokens (+ the title) rather than 224 left the
# static embedder's nDCG@10 as it was (0.569) and raised BM25's from 0.692 to 0.699.
UNLIMITED_MODEL_CHUNK_TOKENS = 512


def load_embedder(path: Path, device: str | None = None):
    """The model in `path`: a StaticEmbedder for a static-embedding model (what `pipeline tune` makes by
    default), else a SentenceTransformer."""
    if not (path / "config.json").exists() and not (path / "modules.json").exists():
        raise PipelineError(f"{path}: not a model directory (no config.json or modules.json)")
    info(f"loading the embedding model {path}")
    static_dir = static_embedding_dir(path)
    if static_dir is not None:
        return StaticEmbedder(static_dir)
    import torch
    from sentence_transformers import SentenceTransformer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = SentenceTransformer(str(path), device=device, local_files_only=True)
    ensure_pad_token(model.tokenizer)
    return model


def static_embedding_dir(path: Path) -> Path | None:
    """Where a sentence-transformers directory keeps its StaticEmbedding module, when that is all the model
    is (a Normalize after it changes nothing: vectors are normalised anyway); else None."""
    modules_file = path / "modules.json"
    if not modules_file.exists():
        return None
    modules = json.loads(modules_file.read_text())
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    if not kinds or kinds[0] != "StaticEmbedding" or any(k != "Normalize" for k in kinds[1:]):
        return None
    return path / modules[0].get("path", "")


class StaticEmbedder:
    """A static-embedding model (a table of token vectors; a text's vector is the mean of its tokens'), read
    straight from the files sentence-transformers' StaticEmbedding saves (tokenizer.json and
    model.safetensors' "embedding.weight"). Loading it imports neither torch nor sentence-transformers
    (seconds at every start), and documents are embedded from token ids, so `pipeline embed` tokenizes
    each document once for both its chunks and their vectors."""

    max_seq_length = math.inf  # it reads a text of any length

    def __init__(self, directory: Path):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.table = np.ascontiguousarray(
            load_file(str(directory / "model.safetensors"))["embedding.weight"], dtype=np.float32
        )
        self.token_ids = TokenIds(self.tokenizer)
        # How texts' token vectors are averaged: numpy, one text at a time, or torch's embedding_bag (several
        # times as fast on 2 cores), whose import takes seconds: worth it for a large embed only, which sets
        # this (embed/run.py). A search or a 1% update stays without torch
        # (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
        self.mean_with_torch = False

    def get_embedding_dimension(self) -> int:
        return self.table.shape[1]

    def embed_ids(self, ids: list[list[int]]) -> np.ndarray:
        """L2-normalised mean of each list's token vectors; an empty list gives zeros."""
        out = np.zeros((len(ids), self.table.shape[1]), np.float32)
        if (
            not self.mean_with_torch or sum(map(len, ids)) <= SMALL_BATCH_TOKENS
        ):  # a query: numpy costs less than a torch call
            for row, text_ids in zip(out, ids):
                if len(text_ids):
                    self.table.take(text_ids, axis=0).mean(axis=0, out=row)
        else:
            import torch

            table = torch.from_numpy(self.table)
            for start in range(0, len(ids), STATIC_BATCH_TEXTS):
                batch = ids[start : start + STATIC_BATCH_TEXTS]
                lengths = np.fromiter(map(len, batch), np.int64, len(batch))
                flat = np.concatenate([np.asarray(text_ids, np.int64) for text_ids in batch])
                offsets = np.concatenate([[0], np.cumsum(lengths[:-1])])
                # One multi-threaded gather-and-average for the batch (a bag's mean); an empty bag gives zeros.
                out[start : start + len(batch)] = torch.nn.functional.embedding_bag(
                    torch.from_numpy(flat), table, torch.from_numpy(offsets), mode="mean"
                ).numpy()
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


class TokenIds:
    """Texts to their token ids (no special tokens added) as a `tokenizers.Tokenizer` gives them: by
    tiktoken when the tokenizer is GPT-2-style byte-level BPE (fast_byte_level_bpe), else by the library."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.fast = fast_byte_level_bpe(json.loads(tokenizer.to_str()), tokenizer)

    def __call__(self, texts: list[str]) -> list[list[int]]:
        if self.fast is None:
            return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        encode = functools.partial(self.fast.encode, allowed_special="all")
        threads = min(len(os.sched_getaffinity(0)), len(texts) // 64)
        if threads < 2:
            return [encode(text) for text in texts]
        # tiktoken releases the GIL while it encodes: a thread per core, each a contiguous share of the texts
        # (its own encode_batch makes a task per text, which cost more than the encoding here).
        share = -(-len(texts) // threads)
        with ThreadPoolExecutor(threads) as pool:
            parts = pool.map(
                lambda start: [encode(text) for text in texts[start : start + share]], range(0, len(texts), share)
            )
            return list(itertools.chain.from_iterable(parts))


def model_token_ids(model) -> TokenIds:
    """How texts become the model's token ids: a static model's own, or made once for a transformer's tokenizer."""
    if is_static(model):
        return model.token_ids
    made = getattr(model, "_pipeline_token_ids", None)
    if made is None:
        made = model._pipeline_token_ids = TokenIds(model.tokenizer.backend_tokenizer)
    return made


# The GPT-2 pre-tokenizer's split (Hugging Face's ByteLevel pre-tokenizer with use_regex uses the same).
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's bytes_to_unicode), mapped back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


# Texts on which the fast tokenizer must give exactly the model's own tokens before it is used.
TOKENIZER_CHECK_TEXTS = [
    "Hello world! It's 2024: naïve café, 東京, emoji 🙂 and\ttabs\n\n  spaced   out.\r\n",
    "don't we'll they've I'm she'd x'll 3.14159 -- ++ == <|endoftext|> ___ \u00a0nbsp\x1ccontrol",
]


def fast_byte_level_bpe(spec: dict, tokenizer):
    """A tiktoken encoder with the same vocabulary and merges as a GPT-2-style byte-level BPE tokenizer
    (ours is one; `spec`: its tokenizer.json): the same tokens, faster than the tokenizers library, which is
    what bounds `pipeline embed` with a static model
    (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md).
    tiktoken merges by rank, where the library follows its list of merges; token ids stand in for ranks,
    which follows that list when a trained BPE numbers each merge's token in merge order (checked here).
    The two agreed on every text tried (20,000 SciFact-derived documents, the tests' texts), which is
    evidence, not proof, hence the checks: the tokenizer's shape, then its tokens on TOKENIZER_CHECK_TEXTS.
    None when any check fails: the library is used then. Documents and queries both go through here, so a
    query is tokenized as the documents were."""
    import tiktoken

    model = spec.get("model") or {}
    pre = spec.get("pre_tokenizer") or {}
    if (
        spec.get("normalizer") is not None
        or model.get("type") != "BPE"
        or model.get("dropout")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
        or model.get("byte_fallback")
        or pre.get("type") != "ByteLevel"
        or pre.get("add_prefix_space")
        or not pre.get("use_regex", True)
    ):
        return None
    alphabet = gpt2_byte_alphabet()
    special = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    try:
        ranks = {bytes(alphabet[ch] for ch in token): i for token, i in model["vocab"].items() if token not in special}
        merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        merged_ids = [model["vocab"][a + b] for a, b in merges]
    except (KeyError, ValueError):
        return None
    if len(ranks) < 256 or any(a >= b for a, b in zip(merged_ids, merged_ids[1:])):
        return None
    encoder = tiktoken.Encoding(
        "workspace-bpe", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=special
    )
    expected = [e.ids for e in tokenizer.encode_batch(TOKENIZER_CHECK_TEXTS, add_special_tokens=False)]
    return encoder if encoder.encode_batch(TOKENIZER_CHECK_TEXTS, allowed_special="all") == expected else None


def ensure_pad_token(tokenizer) -> None:
    """GPT-style tokenizers have no padding token; padding is masked anyway, so end-of-text serves.
    (A static-embedding model's bare `tokenizers.Tokenizer` does not pad: nothing to do.)"""
    if getattr(tokenizer, "pad_token", "") is None:
        tokenizer.pad_token = tokenizer.eos_token


def text_tokenizer(model):
    """The model's tokenizer with Hugging Face's calling convention (token ids and offsets for a batch):
    a static model's bare `tokenizers.Tokenizer` is wrapped (without importing transformers)."""
    return BareTokenizerCalls(model.tokenizer) if is_static(model) else model.tokenizer


class BareTokenizerCalls:
    """A `tokenizers.Tokenizer` called like a Hugging Face tokenizer, for what chunking and query truncation
    ask of it: `tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)`."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, texts: list[str], add_special_tokens: bool = False, return_offsets_mapping: bool = True) -> dict:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encodings], "offset_mapping": [e.offsets for e in encodings]}


def token_limit(model) -> int:
    """The most tokens the model reads from one text."""
    limit = model.max_seq_length
    return int(limit) if limit and math.isfinite(limit) else UNLIMITED_MODEL_CHUNK_TOKENS


def truncate_to_model(model, texts: list[str], tokenizer=None) -> tuple[list[str], list[int]]:
    """Each text cut after the tokens the model reads (token_limit), at a token boundary of the original
    text, and each text's number of tokens. A transformer would drop the rest itself; a static model
    averages every token, so a text is cut to what chunks hold. `tokenizer`: text_tokenizer(model), made
    once by a caller that truncates often (wrapping a static model's tokenizer copies it)."""
    limit = token_limit(model)
    offsets = (tokenizer or text_tokenizer(model))(texts, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    cut = [text if len(spans) <= limit else text[: spans[limit - 1][1]] for text, spans in zip(texts, offsets)]
    return cut, [len(spans) for spans in offsets]


def is_static(model) -> bool:
    """A static-embedding model: its forward pass is a lookup and its bare `tokenizers.Tokenizer` keeps no
    per-call state, so it may encode from several threads at once."""
    return isinstance(model, StaticEmbedder)


def embedding_text(title: str, text: str) -> str:
    """What gets embedded for a chunk: its document's title, then the chunk."""
    return f"{title}\n{text}" if title else text


def encode(model, texts: list[str], batch_size: int = 64, on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """L2-normalised float32 embeddings: inner product = cosine similarity in the index. With on_batch,
    on_batch(number of texts encoded so far) is called after each batch: a transformer's texts are encoded
    one batch at a time, longest first (the batches sentence-transformers makes itself), a static model's
    STATIC_BATCH_TEXTS at a time. A static model's texts are tokenized and averaged here, not by
    sentence-transformers' per-call machinery (what its `encode(normalize_embeddings=True)` gives, at a
    fraction of its cost a query; measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)."""
    if is_static(model):
        return embed_token_ids(model, model.token_ids(texts), on_batch=on_batch)
    if on_batch is not None and len(texts) > batch_size:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors = np.zeros((len(texts), model.get_embedding_dimension()), np.float32)
        for start in range(0, len(texts), batch_size):
            batch = order[start : start + batch_size]
            vectors[batch] = encode(model, [texts[i] for i in batch], batch_size)
            on_batch(start + len(batch))
        return vectors
    vectors = np.asarray(
        model.encode(
            texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        ),
        dtype=np.float32,
    )
    if on_batch is not None:
        on_batch(len(texts))
    return vectors


STATIC_BATCH_TEXTS = 1024  # texts averaged per call of a static model (a progress step)
# below this many tokens a static model averages with numpy even after importing torch, whose call costs more
# than a small batch's mean (measured: benchmarks/results/2026-11-28-design-measurements-cpu.md)
SMALL_BATCH_TOKENS = 4096


def fed_token_ids(model, tokenizer) -> bool:
    """Whether the model embeds chunks from their token ids (embed_token_ids): a static model always, a
    transformer when its tokenizer puts known special tokens around a text (special_token_frame)."""
    return is_static(model) or special_token_frame(tokenizer) is not None


def embed_token_ids(
    model, token_ids: list[list[int]], batch_size: int = 64, on_batch: Callable[[int], None] | None = None
) -> np.ndarray:
    """L2-normalised vectors of texts given as their token ids (no special tokens): a static model's mean
    token vector, STATIC_BATCH_TEXTS at a time, or a transformer's forward passes (encode_token_ids).
    on_batch(number of texts embedded so far) follows each batch."""
    if not is_static(model):
        return encode_token_ids(model, token_ids, batch_size, on_batch)
    vectors = np.zeros((len(token_ids), model.get_embedding_dimension()), np.float32)
    for start in range(0, len(token_ids), STATIC_BATCH_TEXTS):
        vectors[start : start + STATIC_BATCH_TEXTS] = model.embed_ids(token_ids[start : start + STATIC_BATCH_TEXTS])
        if on_batch is not None:
            on_batch(min(start + STATIC_BATCH_TEXTS, len(token_ids)))
    return vectors


def special_token_frame(tokenizer) -> tuple[list[int], list[int]] | None:
    """The ids a Hugging Face tokenizer puts before and after a text's own tokens (BERT's [CLS] ... [SEP],
    RoBERTa's <s> ... </s>, nothing for GPT-2), found by tokenizing probe texts with and without them;
    None when the tokenizer frames a text some other way (then texts are encoded as texts)."""
    frame = None
    for probe in ("a probe text", "Another, longer probe text: 42 words?"):
        plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
        framed = tokenizer(probe)["input_ids"]
        starts = [s for s in range(len(framed) - len(plain) + 1) if framed[s : s + len(plain)] == plain]
        if not plain or not starts:
            return None
        this = (framed[: starts[0]], framed[starts[0] + len(plain) :])
        if frame not in (None, this):
            return None
        frame = this
    return frame


def encode_token_ids(
    model, token_ids: list[list[int]], batch_size: int = 64, on_batch: Callable[[int], None] | None = None
) -> np.ndarray:
    """What `encode` gives for the texts these token ids (no special tokens) came from, for a
    sentence-transformers model, without tokenizing again: the model's special tokens are put around each
    list, which is cut to the model's input length as its tokenizer would, and the lists run longest first
    in batches padded to their longest. A causal model (padding_needs_mask) runs without the padding mask:
    padding comes after every real token, which never sees it, and attention takes its causal fast path."""
    import torch

    frame = special_token_frame(model.tokenizer)
    if frame is None:
        raise ValueError("the tokenizer frames texts in a way encode_token_ids does not know")
    before, after = frame
    room = token_limit(model) - len(before) - len(after)

    def framed(i: int) -> list[int]:  # made a batch at a time: a large document's chunks are not copied at once
        return before + np.asarray(token_ids[i][:room]).tolist() + after

    lengths = [len(before) + min(len(ids), room) + len(after) for ids in token_ids]
    order = sorted(range(len(token_ids)), key=lambda i: -lengths[i])
    pad = model.tokenizer.pad_token_id or 0
    vectors = np.zeros((len(token_ids), model.get_embedding_dimension()), np.float32)
    with torch.inference_mode():
        masked = padding_needs_mask(model, framed(order[0]) if order else [])
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            longest = max(1, lengths[batch[0]])
            ids = torch.full((len(batch), longest), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, : lengths[i]] = torch.tensor(framed(i), dtype=torch.long)
                mask[row, : lengths[i]] = 1
            vectors[batch] = _sentence_embeddings(model, ids, mask, masked).float().numpy()
            if on_batch is not None:
                on_batch(start + len(batch))
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors


def _sentence_embeddings(model, ids, mask, masked: bool):
    """The model's modules in order (the transformer, pooling, ...) on one padded batch; the transformer
    sees the padding mask only when it needs it, the modules after it (pooling) always."""
    first, *rest = list(model)
    features = first({"input_ids": ids, "attention_mask": mask} if masked else {"input_ids": ids})
    features["attention_mask"] = mask
    for module in rest:
        features = module(features)
    return features["sentence_embedding"]


def padding_needs_mask(model, probe_ids: list[int]) -> bool:
    """Whether right padding changes the model's vector of a text unless it is masked: measured once per
    model on a probe (a text, and its first half padded to the text's length). A causal model's (GPT-2's)
    tokens never see the ones after them, so its vectors come out the same either way."""
    known = getattr(model, "_pipeline_padding_needs_mask", None)
    if known is not None:
        return known
    import torch

    if len(probe_ids) < 2:
        return True  # nothing to measure on: mask, which is always right
    half = len(probe_ids) // 2
    ids = torch.tensor([probe_ids, probe_ids[:half] + [model.tokenizer.pad_token_id or 0] * (len(probe_ids) - half)])
    mask = torch.tensor([[1] * len(probe_ids), [1] * half + [0] * (len(probe_ids) - half)])
    with torch.inference_mode():
        same = torch.allclose(
            _sentence_embeddings(model, ids, mask, True), _sentence_embeddings(model, ids, mask, False), atol=1e-5
        )
    model._pipeline_padding_needs_mask = not same
    return not same
