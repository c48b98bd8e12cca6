import json
import shutil
from pathlib import Path

import faiss
import numpy as np
import pytest

from common.dense.reader import load_index
from common.errors import PipelineError
from common.manifest import TokenizerEntry, read_json, write_section
from common.store import Store
from common.workspace import Workspace
from conftest import ivfpq_with_rescoring, run_cli, save_static_model, scifact_rows, scifact_slice
from embed import ingest as embed_ingest
from embed.chunking import chunk_texts, window_starts
from embed.run import run_embed
from embed.settings import EmbedSettings
from index.build import refresh_indexes


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


def copy_workspace(src, dst):
    shutil.copytree(src, dst)
    return Workspace(dst)


def test_incremental_embed_only_embeds_new_or_changed_and_prunes(trained_workspace, tmp_path):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    data = tmp_path / "docs.jsonl"
    rows = scifact_rows(6)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = EmbedSettings(chunk_tokens=64, overlap=8)
    first = run_embed(ws, [data], None, settings)
    assert first["embedded_documents"] == 6  # another source than the one in the store: all new
    assert run_embed(ws, [data], None, settings)["embedded_documents"] == 0

    rows[2]["text"] += " An added sentence."
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))  # one changed, one removed
    again = run_embed(ws, [data], None, settings)
    assert again["embedded_documents"] == 1
    assert again["documents"] == first["documents"]  # kept without --prune
    pruned = run_embed(ws, [data], None, EmbedSettings(chunk_tokens=64, overlap=8, prune=True))
    assert pruned["documents"] == 5  # everything not in the current source is gone
    with Store(ws.db_path, read_only=True) as store:
        n_chunks = store.con.execute("SELECT count(*) FROM chunks WHERE doc_id = ?", [rows[5]["_id"]]).fetchall()[0][0]
        text = store.con.execute("SELECT text FROM documents WHERE doc_id = ?", [rows[2]["_id"]]).fetchall()[0][0]
    assert n_chunks == 0 and text.endswith("An added sentence.")


def test_a_new_chunking_embeds_the_stored_documents_again_and_search_waits_for_the_index(trained_workspace, tmp_path):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    with Store(ws.db_path, read_only=True) as store:
        stored = store.con.execute("SELECT doc_id, title, source, text FROM documents ORDER BY doc_id").fetchall()
        old_ids = {r[0] for r in store.con.execute("SELECT chunk_id FROM chunks").fetchall()}
    other = scifact_slice(tmp_path / "other.jsonl", 2, start=400)
    summary = run_embed(ws, [other], None, EmbedSettings(chunk_tokens=48, overlap=8))
    assert summary["documents"] == len(stored) + 2 and summary["embedded_documents"] == len(stored) + 2
    with Store(ws.db_path, read_only=True) as store:
        kept = store.con.execute(
            "SELECT doc_id, title, source, text FROM documents WHERE doc_id IN (SELECT unnest($ids)) ORDER BY doc_id",
            {"ids": [r[0] for r in stored]},
        ).fetchall()
        chunks = store.con.execute("SELECT chunk_id, n_tokens FROM chunks").fetchall()
        assert store.counts()["vectors"] == len(chunks)
    assert kept == stored  # every stored document is still there, unchanged
    assert max(n for _, n in chunks) <= 48 and not {c for c, _ in chunks} & old_ids  # new chunks, never an old id

    stale = run_cli("search", "-w", str(ws.root), "vitamin calcium", check=False)
    assert stale.returncode == 2 and len(stale.stderr.strip().splitlines()) == 1
    assert (
        stale.stderr.startswith("error: the documents changed since the index was built")
        and "run `pipeline index`" in stale.stderr
    )
    refresh_indexes(ws)
    title = json.loads(other.read_text().splitlines()[0])["title"]
    hits = run_cli("search", "-w", str(ws.root), title, "--mode", "lexical", "--json").stdout.splitlines()
    assert json.loads(hits[0])["doc_id"] == json.loads(other.read_text().splitlines()[0])["_id"]

    pruned = run_embed(
        ws, [other], None, EmbedSettings(chunk_tokens=64, overlap=8, prune=True)
    )  # asked for: only the source stays
    assert pruned["documents"] == 2


def test_a_directory_typed_relative_or_absolute_holds_the_same_documents(trained_workspace, tmp_path, monkeypatch):
    ws = Workspace(tmp_path / "ws").create()
    shutil.copytree(trained_workspace / "model", ws.model_dir)
    (tmp_path / "txt" / "sub").mkdir(parents=True)
    (tmp_path / "txt" / "a.md").write_text("# Vitamin D\nBone density and vitamin D.\n")
    (tmp_path / "txt" / "sub" / "b.txt").write_text("Tumour cells grow.\n")
    monkeypatch.chdir(tmp_path)
    settings = EmbedSettings(chunk_tokens=64, overlap=8)
    assert run_embed(ws, [Path("txt")], None, settings)["documents"] == 2
    again = run_embed(ws, [tmp_path / "txt"], None, settings)
    assert again["documents"] == 2 and again["embedded_documents"] == 0
    with Store(ws.db_path, read_only=True) as store:
        stored = store.con.execute("SELECT doc_id, source FROM documents ORDER BY doc_id").fetchall()
    assert stored == [("a.md", str(tmp_path / "txt" / "a.md")), ("sub/b.txt", str(tmp_path / "txt" / "sub" / "b.txt"))]


def test_interrupted_embed_changes_nothing_search_sees_and_resumes(
    trained_workspace, tmp_path, monkeypatch, corpus_file
):
    ws = Workspace(tmp_path / "ws")
    ws.create()
    shutil.copytree(trained_workspace / "model", ws.model_dir)
    real_chunk_and_embed, calls = embed_ingest.chunk_and_embed, []

    def embed_then_crash(*args, **kwargs):  # simulates Ctrl-C during the second group of documents
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_chunk_and_embed(*args, **kwargs)

    monkeypatch.setattr(embed_ingest, "chunk_and_embed", embed_then_crash)
    settings = EmbedSettings(chunk_tokens=64, overlap=8, group_size=40)
    with pytest.raises(KeyboardInterrupt):
        run_embed(ws, [corpus_file], None, settings)
    with Store(ws.db_path, read_only=True) as store:
        assert store.counts() == {"documents": 0, "chunks": 0, "vectors": 0} and store.generation() == 0
        staged = store.con.execute("SELECT count(*) FROM staged_documents").fetchall()[0][0]
        orphans = store.con.execute(
            "SELECT count(*) FROM staged_documents d "
            "WHERE NOT EXISTS (SELECT 1 FROM staged_chunks c WHERE c.doc_id = d.doc_id)"
        ).fetchall()[0][0]
        unvectored = store.con.execute(
            "SELECT count(*) FROM staged_chunks c "
            "WHERE NOT EXISTS (SELECT 1 FROM staged_vectors v WHERE v.chunk_id = c.chunk_id)"
        ).fetchall()[0][0]
    assert staged == 40 and orphans == 0 and unvectored == 0  # whole documents, kept for the next run
    monkeypatch.setattr(embed_ingest, "chunk_and_embed", real_chunk_and_embed)
    resumed = run_embed(ws, [corpus_file], None, settings)
    assert resumed["embedded_documents"] == 80 and resumed["documents"] == 120 and resumed["store_generation"] == 1


def test_each_index_type_finds_stored_vectors(trained_workspace, tmp_path):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    with Store(ws.db_path, read_only=True) as store:
        ids, vectors = store.load_vectors()
    for kind in ("flat", "hnsw", "ivf", "ivfpq"):
        summary = refresh_indexes(ws, kind)
        index = load_index(ws.root / summary["path"])
        assert index.ntotal == len(ids) and summary["type"] == kind
        _, found = index.search(vectors[:5], 1)
        if kind == "flat":
            assert summary["recall_at_10"] is None
            np.testing.assert_array_equal(found[:, 0], ids[:5])
        else:
            assert 0.0 <= summary["recall_at_10"] <= 1.0
            assert set(found[:, 0]) <= set(ids)
    assert refresh_indexes(ws, "auto")["type"] == "flat"


@pytest.mark.parametrize("held", ["one chunk twice, another not", "one chunk missing"])
def test_an_index_that_does_not_hold_every_stored_chunk_once_is_refused(trained_workspace, tmp_path, held):
    from common.dense.index_types import make_index
    from search.engine import SearchEngine

    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    with Store(ws.db_path, read_only=True) as store:
        ids, vectors = store.load_vectors()
    ids = ids.copy()
    if held == "one chunk twice, another not":
        ids[1] = ids[0]
    else:
        ids, vectors = ids[1:], vectors[1:]
    faiss.write_index(make_index("flat", vectors, ids), str(ws.root / read_json(ws)["index"]["path"]))
    with pytest.raises(PipelineError, match="does not hold the stored chunks"):
        SearchEngine(ws, load_model=False)


def test_index_failure_leaves_the_previous_index(trained_workspace, tmp_path, monkeypatch):
    ws = copy_workspace(trained_workspace, tmp_path / "ws")
    recorded = ws.root / read_json(ws)["index"]["path"]
    before = recorded.read_bytes()
    files_before = sorted(p.name for p in ws.index_dir.iterdir())  # the FAISS file, the lexical and corpus directories

    def crash(*args):  # the process dies while serialising the new index
        raise KeyboardInterrupt

    monkeypatch.setattr(faiss, "serialize_index", crash)
    with pytest.raises(KeyboardInterrupt):
        refresh_indexes(ws, "hnsw")
    assert recorded.read_bytes() == before and ws.root / read_json(ws)["index"]["path"] == recorded
    assert sorted(p.name for p in ws.index_dir.iterdir()) == files_before


def test_unknown_index_type_and_index_before_embed(tmp_path):
    from common.options import OptionError
    from index.settings import IndexSettings

    with pytest.raises(OptionError, match="--type: unknown 'annoy'"):
        IndexSettings(index_type="annoy")
    with pytest.raises(PipelineError, match="has no embedder: run `pipeline embed` first"):
        refresh_indexes(Workspace(tmp_path), "flat")


def test_embed_without_data_reads_the_built_in_corpus_when_pretraining_used_it(tmp_path):
    """pretrain without --data records the built-in corpus's marker as its sources; embed (and tune) then
    read that corpus again, from common/ (no stage imports another)."""
    from common.default_corpus import DEFAULT_CORPUS_SOURCE
    from embed.run import source_documents

    ws = Workspace(tmp_path / "ws").create()
    write_section(ws, TokenizerEntry(path="tokenizer", sha256="", vocab_size=0, sources=[DEFAULT_CORPUS_SOURCE]))
    first = next(iter(source_documents(ws, [], None)))
    assert first.id.startswith("stdlib:") and first.text


def test_encode_reports_each_batch_and_gives_the_same_vectors(trained_workspace):
    from common.embedder import encode, load_embedder

    model = load_embedder(trained_workspace / "model")
    texts = [f"text number {i} " * (i % 7 + 1) for i in range(23)]
    seen = []
    vectors = encode(model, texts, batch_size=5, on_batch=seen.append)
    assert seen == [5, 10, 15, 20, 23]
    np.testing.assert_allclose(vectors, encode(model, texts, batch_size=5), atol=1e-5)


def test_embed_progress_moves_with_every_encoded_batch(trained_workspace, corpus_file, tmp_path, monkeypatch):
    """All 120 documents are one group (one transaction); the bar moved only when a group was stored, so it
    sat at 0/120 until the end. It now moves with each encoded batch."""
    from rich.progress import Progress

    completed = []
    update = Progress.update

    def recording_update(self, task, **fields):
        completed.append(fields["completed"])
        return update(self, task, **fields)

    monkeypatch.setattr(Progress, "update", recording_update)
    summary = run_embed(
        Workspace(tmp_path / "ws").create(),
        [corpus_file],
        None,
        EmbedSettings(model_dir=trained_workspace / "model", chunk_tokens=64, overlap=8, batch_size=16),
    )
    batches = -(-summary["embedded_chunks"] // 16)
    assert batches > 2 and len(completed) == batches + 1  # each batch, then the stored group
    assert completed == sorted(completed) and 0 < completed[0] < 120 and completed[-1] == 120


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


@pytest.mark.parametrize("kind, parameter", [("hnsw", "efSearch"), ("ivfpq", "nprobe")])
def test_an_approximate_index_is_searched_wide_enough_to_find_the_target_recall(kind, parameter, tmp_path):
    """Started at width 1 (far below the target on random vectors), the build's tuning widens the search
    (IVF-PQ: its probes and its re-scored candidates) until recall@10 on held-out neighbours reaches
    TARGET_RECALL, and the index file keeps the width."""
    from common.dense.files import write_faiss
    from common.dense.index_types import (
        TARGET_RECALL,
        exact_neighbours,
        make_index,
        recall_at_10,
        rescored_search,
        tune_search,
    )

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1000, 4000, dtype=np.int64)
    index, rows = (
        (make_index(kind, vectors, ids), None) if kind == "hnsw" else ivfpq_with_rescoring(vectors, ids, 32, tmp_path)
    )
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    holder = inner.hnsw if kind == "hnsw" else inner
    setattr(holder, parameter, 1)

    def search(factor=None):
        return rescored_search(index, rows, factor) if kind == "ivfpq" else lambda q, k: index.search(q, k)[1]

    assert recall_at_10(search(1), *exact_neighbours(ids, vectors)) < TARGET_RECALL
    recall, setting = tune_search(index, kind, *exact_neighbours(ids, vectors), rows)
    assert recall >= TARGET_RECALL and setting[parameter] > 1
    other_queries = exact_neighbours(ids, vectors, seed=1)
    assert recall_at_10(search(setting.get("rescore")), *other_queries) >= TARGET_RECALL - 0.03
    loaded = load_index(write_faiss(index, tmp_path, "faiss"))  # owns the inner index: kept alive with it
    reloaded = faiss.downcast_index(faiss.downcast_index(loaded).index)
    assert getattr(reloaded.hnsw if kind == "hnsw" else reloaded, parameter) == setting[parameter]


def test_hnsw_over_wide_vectors_builds_its_graph_on_their_principal_components_and_searches_them_whole(tmp_path):
    """Vectors wider than GRAPH_DIMENSIONS: the graph comes from their leading principal components, but
    the index holds the full vectors (float16), finds each stored vector as its own nearest neighbour,
    reaches the recall target once tuned, and survives writing and reading."""
    from common.dense.files import write_faiss
    from common.dense.index_types import GRAPH_DIMENSIONS, TARGET_RECALL, exact_neighbours, make_index, tune_search
    from common.dense.reader import load_index

    rng = np.random.default_rng(0)
    dim = 2 * GRAPH_DIMENSIONS + 64
    # Embedding-like: most of the variance in a few dozen directions, plus noise in all of them.
    vectors = (
        rng.standard_normal((4000, 48)) @ rng.standard_normal((48, dim)) + 0.3 * rng.standard_normal((4000, dim))
    ).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(4000, dtype=np.int64) * 7 + 5
    index = make_index("hnsw", vectors, ids)
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    assert index.ntotal == inner.ntotal == inner.storage.ntotal == 4000 and inner.d == dim
    assert np.abs(inner.reconstruct(123) - vectors[123]).max() < 1e-3  # the full vector, in float16
    scores, found = index.search(vectors[:50], 1)
    assert (found[:, 0] == ids[:50]).all() and np.allclose(scores[:, 0], 1.0, atol=1e-3)
    recall, _ = tune_search(index, "hnsw", *exact_neighbours(ids, vectors))
    assert recall >= TARGET_RECALL
    reloaded = load_index(write_faiss(index, tmp_path, "faiss"))
    assert (reloaded.search(vectors[:50], 1)[1][:, 0] == ids[:50]).all()
