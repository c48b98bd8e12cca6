"""embed/chunking.py and embed/ingest.py's chunk_and_embed: documents cut into overlapping token windows that
are slices of their text, and each chunk's vector made from the document's own tokens."""

import numpy as np
import pytest

from conftest import save_static_model, scifact_rows
from embed.chunking import chunk_texts, window_starts


def test_window_starts_overlap_and_cover_the_text():
    assert window_starts(5, 8, 2) == [0]
    assert window_starts(10, 4, 1) == [0, 3, 6]
    for n, size, overlap in [(100, 16, 4), (17, 16, 4), (33, 8, 0)]:
        starts = window_starts(n, size, overlap)
        covered = set()
        for s in starts:
            covered.update(range(s, min(s + size, n)))
        assert covered == set(range(n))
        assert all(b - a <= size - overlap for a, b in zip(starts, starts[1:]))


def test_chunks_are_slices_of_the_original_text(trained_workspace):
    from common.embedder import load_embedder

    model = load_embedder(trained_workspace / "model")
    text = "Vitamin D deficiency is common. " * 20
    (chunks,) = chunk_texts([text], model.tokenizer, size=16, overlap=4)
    assert len(chunks) > 3
    for c in chunks:
        assert c.text == text[c.start_char : c.end_char] and c.n_tokens <= 16
    assert chunks[0].start_char == 0 and chunks[-1].end_char == len(text.rstrip()) or chunks[-1].end_char == len(text)


def test_a_static_embedders_chunks_are_embedded_from_the_documents_tokens(trained_workspace, tmp_path):
    """One tokenization per document gives a chunk's vector: the mean over its title, a newline and its tokens."""
    from common.embedder import embedding_text, encode, load_embedder, text_tokenizer
    from common.readers import Document
    from embed.ingest import chunk_and_embed

    model = load_embedder(save_static_model(trained_workspace, tmp_path / "static"))
    long_text = " ".join(f"Sentence {i} is about vitamin D and bone density." for i in range(40))
    docs = [
        Document("short", "Vitamin D", "src", "Bone density rose with vitamin D."),
        Document("untitled", "", "src", "Tumour cells grow."),
        Document("long", "A long one", "src", long_text),
    ]
    rows, vectors = chunk_and_embed(docs, model, text_tokenizer(model), 64, 8, 100)
    assert [r.chunk_id for r in rows] == list(range(100, 100 + len(rows)))
    long_rows = [r for r in rows if r.doc_id == "long"]
    assert len(long_rows) > 2 and all(long_text[r.start_char : r.end_char] == r.text for r in long_rows)
    assert (rows[0].text, rows[0].start_char, rows[0].end_char) == (docs[0].text, 0, len(docs[0].text))
    # A document's first chunk: exactly the vector of its title and text embedded as one text.
    firsts = [0, 1, rows.index(long_rows[0])]
    texts = [embedding_text(docs[i].title, rows[f].text) for i, f in enumerate(firsts)]
    np.testing.assert_allclose(vectors[firsts], encode(model, texts), atol=1e-6)
    # A later chunk: its tokens as the document's tokenization cut them, after the title's.
    middle = long_rows[1]
    ids = model.token_ids(["A long one\n"])[0] + model.token_ids([long_text])[0][56 : 56 + 64]
    assert middle.n_tokens == 64
    np.testing.assert_allclose(vectors[rows.index(middle)], model.embed_ids([ids])[0], atol=1e-6)


@pytest.mark.parametrize("embedder", ["static", "transformer"])
def test_a_document_tokenized_in_pieces_gets_the_chunks_and_vectors_of_one_tokenized_whole(
    trained_workspace, tmp_path, monkeypatch, embedder
):
    """A text longer than PIECE_CHARS is tokenized in pieces cut before a space, its tokens held as int32
    arrays (bounded memory for a large document): with byte-level BPE, which splits words at spaces anyway, its
    chunks (texts, offsets, tokens) and their vectors are those of the whole text tokenized at once."""
    from common.embedder import load_embedder, text_tokenizer
    from common.readers import Document
    from embed import chunking
    from embed.ingest import chunk_and_embed

    path = save_static_model(trained_workspace, tmp_path / "static") if embedder == "static" else None
    model = load_embedder(path or trained_workspace / "model")
    rows = scifact_rows(8)
    docs = [Document(r["_id"], r["title"], "src", r["text"]) for r in rows]

    def chunked() -> tuple[list, list, np.ndarray]:
        chunks = chunking.chunk_texts([d.text for d in docs], text_tokenizer(model), 48, 8)
        return chunks, *chunk_and_embed(docs, model, text_tokenizer(model), 48, 8, 0, batch_size=16)

    whole_chunks, whole_rows, whole_vectors = chunked()
    monkeypatch.setattr(chunking, "PIECE_CHARS", 200)
    assert all(len(d.text) > 4 * chunking.PIECE_CHARS for d in docs[:3])  # several pieces, several calls
    assert len(chunking.piece_starts(docs[0].text)) > chunking.PIECES_PER_CALL
    pieced_chunks, pieced_rows, pieced_vectors = chunked()
    assert [[(c.text, c.start_char, c.end_char, list(c.token_ids)) for c in cs] for cs in pieced_chunks] == [
        [(c.text, c.start_char, c.end_char, list(c.token_ids)) for c in cs] for cs in whole_chunks
    ]
    assert pieced_rows == whole_rows and len(pieced_rows) > 3 * len(docs)
    np.testing.assert_allclose(pieced_vectors, whole_vectors, atol=1e-5)


def chunk_vectors_match_their_texts(model, tokenizer) -> tuple[list, np.ndarray]:
    """Chunks of three documents (one with no title, one longer than a chunk) embedded by chunk_and_embed;
    each document's first chunk must have the vector `encode` gives its title and text as one text."""
    from common.embedder import embedding_text, encode
    from common.readers import Document
    from embed.ingest import chunk_and_embed

    long_text = " ".join(f"Sentence {i} is about vitamin D and bone density." for i in range(40))
    docs = [
        Document("short", "Vitamin D", "src", "Bone density rose with vitamin D."),
        Document("untitled", "", "src", "Tumour cells grow."),
        Document("long", "A long one", "src", long_text),
    ]
    rows, vectors = chunk_and_embed(docs, model, tokenizer, 64, 8, 0, batch_size=2)
    assert len(rows) == len(vectors) > 4 and {r.doc_id for r in rows} == {"short", "untitled", "long"}
    titles = {d.id: d.title for d in docs}
    first = [i for i, r in enumerate(rows) if r.chunk_index == 0]
    expected = encode(model, [embedding_text(titles[rows[i].doc_id], rows[i].text) for i in first])
    np.testing.assert_allclose(vectors[first], expected, atol=1e-5)
    return rows, vectors


def test_a_causal_transformer_is_fed_its_chunks_token_ids_without_a_padding_mask(trained_workspace, monkeypatch):
    """The exported GPT-2 gets its documents' token ids (no second tokenization of a chunk) and runs without the
    padding mask (its tokens never see the padding after them): the same vectors as `encode` of the texts."""
    from common import embedder
    from common.embedder import embedding_text

    model = embedder.load_embedder(trained_workspace / "model")
    assert embedder.special_token_frame(model.tokenizer) == ([], [])  # GPT-2 adds no special tokens
    assert embedder.model_token_ids(model).fast is not None  # documents are tokenized by tiktoken, as a static model's
    tokenized = []
    call = type(model.tokenizer).__call__
    monkeypatch.setattr(
        type(model.tokenizer),
        "__call__",
        lambda self, texts, *a, **kw: (
            tokenized.extend([texts] if isinstance(texts, str) else texts) or call(self, texts, *a, **kw)
        ),
    )
    rows, _ = chunk_vectors_match_their_texts(model, model.tokenizer)
    assert model._pipeline_padding_needs_mask is False
    later = [r for r in rows if r.chunk_index > 0]
    assert later and not {embedding_text("A long one", r.text) for r in later} & set(tokenized)  # never tokenized again


def test_a_bidirectional_transformer_with_special_tokens_is_fed_token_ids_with_its_padding_mask(tmp_path):
    """Any sentence-transformers model: a BERT-shaped one ([CLS] text [SEP], attention both ways) gets its
    special tokens around the chunk's ids and the padding mask, and the vectors `encode` gives its texts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from tokenizers import Tokenizer, pre_tokenizers, processors, trainers
    from tokenizers import models as tokenizer_models
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    from common.embedder import padding_needs_mask, special_token_frame

    words = Tokenizer(tokenizer_models.WordPiece(unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words.train_from_iterator(
        [f"sentence {i} is about vitamin d and bone density tumour cells grow" for i in range(50)],
        trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]),
    )
    words.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    ).save_pretrained(tmp_path / "bert")
    BertModel(
        BertConfig(
            vocab_size=words.get_vocab_size(),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
        )
    ).save_pretrained(tmp_path / "bert")
    transformer = Transformer(str(tmp_path / "bert"), max_seq_length=128)
    model = SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")], device="cpu"
    )
    assert special_token_frame(model.tokenizer) == ([2], [3])
    chunk_vectors_match_their_texts(model, model.tokenizer)
    assert padding_needs_mask(model, [2, 10, 11, 12, 3]) is True
