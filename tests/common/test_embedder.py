"""common/embedder.py: a workspace's embedder loaded (a sentence-transformers model or the static table) and
texts encoded, batch by batch."""

import numpy as np

from conftest import save_static_model


def test_encode_reports_each_batch_and_gives_the_same_vectors(trained_workspace):
    from common.embedder import encode, load_embedder

    model = load_embedder(trained_workspace / "model")
    texts = [f"text number {i} " * (i % 7 + 1) for i in range(23)]
    seen = []
    vectors = encode(model, texts, batch_size=5, on_batch=seen.append)
    assert seen == [5, 10, 15, 20, 23]
    np.testing.assert_allclose(vectors, encode(model, texts, batch_size=5), atol=1e-5)


def test_a_static_embedder_reports_progress_per_tokenizer_batch_with_the_same_vectors(trained_workspace, tmp_path):
    from common.embedder import STATIC_BATCH_TEXTS, encode, load_embedder

    model = load_embedder(save_static_model(trained_workspace, tmp_path / "static"))
    texts = [f"cells and tumour growth {i}" for i in range(STATIC_BATCH_TEXTS + 10)]
    seen = []
    vectors = encode(model, texts, on_batch=seen.append)
    assert seen == [STATIC_BATCH_TEXTS, STATIC_BATCH_TEXTS + 10]
    np.testing.assert_allclose(vectors, encode(model, texts), atol=1e-6)


def test_a_static_embedder_loads_without_sentence_transformers_and_encodes_as_it_does(trained_workspace, tmp_path):
    from sentence_transformers import SentenceTransformer

    from common.embedder import StaticEmbedder, encode, load_embedder

    path = save_static_model(trained_workspace, tmp_path / "static")
    model = load_embedder(path)
    assert isinstance(model, StaticEmbedder) and model.token_ids.fast is not None  # our byte-level BPE gets tiktoken
    texts = [
        "Vitamin D and bone density",
        "naïve café 東京 🙂 it's 3.14\n\n  tabs\tand <|endoftext|> too",
        "",
        *[f"tumour growth in cell line {i} " * (i % 9 + 1) for i in range(200)],
    ]  # enough to use threads
    assert model.token_ids(texts) == [e.ids for e in model.tokenizer.encode_batch(texts, add_special_tokens=False)]
    reference = SentenceTransformer(str(path), device="cpu").encode(
        texts, normalize_embeddings=True, convert_to_numpy=True
    )
    np.testing.assert_allclose(encode(model, texts), reference, atol=1e-5)
    model.mean_with_torch = True  # what a large embed sets: the same vectors by torch's embedding_bag
    np.testing.assert_allclose(encode(model, texts), reference, atol=1e-5)
