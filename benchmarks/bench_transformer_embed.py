"""A transformer embedder's documents/s in `pipeline embed` against `SentenceTransformer.encode` over the same chunks.

Both start from the same documents (SciFact abstracts) and make the same chunks (embed/chunking.py with
the model's tokenizer). The reference then embeds each chunk's text ("title\\nchunk") with
`SentenceTransformer.encode(batch_size=64, normalize_embeddings=True)`; ours is what `pipeline embed`
runs, `embed/ingest.chunk_and_embed`: the chunks' token ids from chunking, fed to the model without a
second tokenization (common/embedder.encode_token_ids). The two alternate `--repeats` times in one process
(this machine's speed drifts). JSON to benchmarks/results/transformer_embed.json, with the largest
difference between the two's vectors. (bench_embed.py measures the whole `pipeline embed` command.)

    .venv/bin/python benchmarks/bench_transformer_embed.py --model WORKSPACE/model [--documents 2000]
    .venv/bin/python benchmarks/bench_transformer_embed.py --minilm-shaped /tmp/minilm   # a BERT of MiniLM-L6's shape

--minilm-shaped DIR makes (once) a sentence-transformers model of all-MiniLM-L6-v2's shape (6 layers, 384
wide, WordPiece vocabulary of 30,522 trained on the corpus, mean pooling) with random weights: nothing is
downloaded, and its speed is that of the real model's shape.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks_common import SCIFACT, write_result


def minilm_shaped(directory: Path) -> Path:
    """A randomly initialised sentence-transformers model of all-MiniLM-L6-v2's shape, saved in directory."""
    if (directory / "modules.json").exists():
        return directory
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    texts = [
        f"{row['title']}\n{row['text']}" for row in map(json.loads, (SCIFACT / "corpus.jsonl").read_text().splitlines())
    ]
    words = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    words.normalizer = normalizers.BertNormalizer(lowercase=True)
    words.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=30_522, special_tokens=specials))
    words.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    bert = directory / "bert"
    PreTrainedTokenizerFast(
        tokenizer_object=words,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    ).save_pretrained(bert)
    BertModel(
        BertConfig(
            vocab_size=words.get_vocab_size(),
            hidden_size=384,
            num_hidden_layers=6,
            num_attention_heads=12,
            intermediate_size=1536,
            max_position_embeddings=512,
        )
    ).save_pretrained(bert)
    transformer = Transformer(str(bert), max_seq_length=256)  # all-MiniLM-L6-v2 reads 256 tokens
    SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()], device="cpu"
    ).save(str(directory))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", type=Path, help="a sentence-transformers directory with a transformer (e.g. WORKSPACE/model)"
    )
    parser.add_argument(
        "--minilm-shaped", type=Path, help="make (once) and use a random model of all-MiniLM-L6-v2's shape here"
    )
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if (args.model is None) == (args.minilm_shaped is None):
        parser.error("give one of --model and --minilm-shaped")

    from common.embedder import embedding_text, load_embedder, token_limit
    from common.readers import Document
    from embed.chunking import chunk_texts
    from embed.ingest import chunk_and_embed
    from embed.run import TITLE_TOKENS
    from embed.settings import EmbedSettings

    model_dir = args.model or minilm_shaped(args.minilm_shaped)
    model = load_embedder(model_dir, device="cpu")
    rows = [json.loads(line) for line in (SCIFACT / "corpus.jsonl").read_text().splitlines()[: args.documents]]
    docs = [Document(r["_id"], r.get("title", ""), "corpus.jsonl", r["text"]) for r in rows]
    settings = EmbedSettings()
    chunk_tokens = max(32, token_limit(model) - TITLE_TOKENS)

    def reference() -> np.ndarray:
        chunked = chunk_texts([d.text for d in docs], model.tokenizer, chunk_tokens, settings.overlap)
        texts = [embedding_text(d.title, c.text) for d, chunks in zip(docs, chunked) for c in chunks]
        return model.encode(
            texts,
            batch_size=settings.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )

    def ours() -> np.ndarray:
        return chunk_and_embed(
            docs, model, model.tokenizer, chunk_tokens, settings.overlap, 0, batch_size=settings.batch_size
        )[1]

    ours()  # warm-up: the first forward passes allocate
    timings = {"sentence_transformers_encode": [], "pipeline_embed": []}
    for _ in range(args.repeats):
        for name, run in (("sentence_transformers_encode", reference), ("pipeline_embed", ours)):
            start = time.perf_counter()
            vectors = run()
            timings[name].append(time.perf_counter() - start)
            if name == "sentence_transformers_encode":
                expected = vectors
    difference = float(np.abs(vectors - expected).max())
    cosine = (vectors * expected).sum(axis=1)
    rates = {name: len(docs) / min(seconds) for name, seconds in timings.items()}
    result = {
        "model": str(model_dir),
        "documents": len(docs),
        "chunks": len(vectors),
        "chunk_tokens": chunk_tokens,
        "seconds": timings,
        "docs_per_s": rates,
        "speedup": rates["pipeline_embed"] / rates["sentence_transformers_encode"],
        "target_speedup": 1.5,
        "max_abs_difference": difference,
        "min_cosine": float(cosine.min()),
        "note": (
            "best of the repeats for each; a later chunk of a long document may differ by its first token "
            "(chunking's tokens vs the chunk text's)"
        ),
    }
    write_result("transformer_embed", result)


if __name__ == "__main__":
    main()
