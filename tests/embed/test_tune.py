"""`pipeline tune`: pairs from the corpus, contrastive training, and the tuned model becoming embed's default."""

import collections
import json
import random
import re
import shutil

import numpy as np
import pytest

from common.embedder import encode, load_embedder
from common.errors import PipelineError
from common.language import sentences
from common.lexical import Analyzer
from common.readers import Document, read_documents
from common.workspace import Workspace
from conftest import run_cli, scifact_slice
from embed.run import source_documents
from embed.settings import TuneSettings
from embed.tune import (
    HARD_NEGATIVE_DEPTH,
    MAX_PAIR_REPEATS,
    SAVE_SHARE,
    DistinctDocumentsBatchSampler,
    TuningCosts,
    anchor_counts,
    batch_keys,
    document_text,
    documents_index,
    expected_anchors,
    hard_negatives,
    make_pairs,
    pair_for,
    pair_sources,
    planned_steps,
    read_labelled_pairs,
    run_tune,
)

ABSTRACT = (
    "Vitamin D is made in the skin. Sunlight drives its synthesis. Older people make less of it. "
    "Supplements raise blood levels. Bone density depends on it. Deficiency is common in winter."
)


def source(doc: Document, language: str = "en"):
    return pair_sources([doc], language)[0]


def test_pairs_the_corpus_provides():
    doc = source(Document("d1", "Vitamin D and bone", "src", ABSTRACT))
    parts = sentences(ABSTRACT)
    assert len(parts) == 6 and doc.parts == parts and doc.unit == "sentences"
    titles = {pair_for(doc, "title", random.Random(seed), 1000) for seed in range(40)}
    assert ("Vitamin D and bone", ABSTRACT) in titles and len(titles) > 5  # the whole text, or windows of it
    assert all(anchor == "Vitamin D and bone" and positive in ABSTRACT for anchor, positive in titles)
    for seed in range(20):
        anchor, positive = pair_for(doc, "ict", random.Random(seed), 1000)
        assert anchor in parts and positive.startswith("Vitamin D and bone\n")
    removed = sum(
        pair_for(doc, "ict", random.Random(s), 1000)[0] not in pair_for(doc, "ict", random.Random(s), 1000)[1]
        for s in range(200)
    )
    assert 150 < removed < 200  # the anchor sentence is taken out of its context about 90% of the time
    first, second = pair_for(doc, "neighbours", random.Random(1), 1000)
    assert ABSTRACT.index(first) < ABSTRACT.index(second)
    assert pair_for(doc, "dropout", random.Random(0), 1000)[0] == pair_for(doc, "dropout", random.Random(0), 1000)[1]
    short = source(Document("d2", "", "src", "One sentence only."))
    assert (
        pair_for(short, "title", random.Random(0), 1000) is None
        and pair_for(short, "ict", random.Random(0), 1000) is None
    )


def test_sentences_in_lower_case_and_other_scripts_and_spans_where_there_are_none():
    lower = "the boundary layer was measured at mach 2. results show that the flow separates early. this is new."
    assert len(source(Document("a", "", "s", lower)).parts) == 3
    russian = "Это первое предложение текста. Ёлки растут в лесу! Яблоко упало на землю."
    assert source(Document("b", "", "s", russian), "ru").parts == [
        "Это первое предложение текста.",
        "Ёлки растут в лесу!",
        "Яблоко упало на землю.",
    ]
    japanese = "東京は日本の首都である。人口は約千四百万人である。経済の中心でもある。"
    assert len(source(Document("c", "", "s", japanese), "ja").parts) == 3
    # One long sentence: spans of about 16 words, so it still gives ict pairs
    one = source(Document("d", "", "s", " ".join(f"word{i}" for i in range(60))))
    assert one.unit == "spans" and len(one.parts) == 4 and pair_for(one, "ict", random.Random(0), 1000) is not None


def test_a_title_repeating_the_text_is_taken_off_its_positive_and_a_shared_title_is_not_used():
    text = (
        "flow over a flat plate at high speed. the boundary layer thickens. heat transfer rises with it. "
        "we measured it."
    )
    repeated = source(Document("a", "Flow over a flat plate at high speed", "s", text))
    anchor, positive = pair_for(repeated, "title", random.Random(0), 1000)
    assert anchor == "Flow over a flat plate at high speed" and not positive.lower().startswith("flow over")
    shared = pair_sources([Document(str(i), "Tokyo", "s", ABSTRACT) for i in range(3)], "en")
    assert all(pair_for(s, "title", random.Random(0), 1000) is None for s in shared)


def test_no_pair_is_repeated_more_than_a_few_times_and_a_poor_corpus_gives_fewer_pairs():
    docs = [
        Document(str(i), f"Title number {i}", "s", f"Only one sentence in document {i} with some words.")
        for i in range(30)
    ]
    pairs, report = make_pairs(docs, TuneSettings(steps=100, batch_size=32), [])
    assert len(pairs) < 100 * 32  # the corpus cannot give that many distinct pairs
    assert max(collections.Counter((a, p) for a, p, _ in pairs).values()) <= MAX_PAIR_REPEATS
    assert report["distinct_pairs"] == len({(a, p) for a, p, _ in pairs}) and report["pairs"]["title"] > 0
    # Nothing of the kinds asked for: dropout pairs, said so, rather than a failure
    untitled = [Document(str(i), "", "s", f"tiny text {i}") for i in range(30)]
    pairs, report = make_pairs(untitled, TuneSettings(steps=10, batch_size=8, pairs_from="title,ict"), [])
    assert pairs and report["fallback"] and set(report["pairs"]) == {"dropout"}


def test_make_pairs_covers_the_steps_one_pair_per_document_per_round(corpus_file):
    docs = list(read_documents([corpus_file]))
    pairs, report = make_pairs(docs, TuneSettings(steps=10, batch_size=32), [("a query", "its document")])
    counts = report["pairs"]
    assert len(pairs) >= 320 and counts["title"] > 0 and counts["ict"] > 0
    rounds = -(-320 // (len(docs) + 1))
    assert counts["labelled"] == rounds and sum(counts.values()) == len(pairs)
    assert all(
        source is None if (anchor, positive) == ("a query", "its document") else docs[source].text
        for anchor, positive, source in pairs
    )


def test_hard_negatives_share_the_anchors_words_and_are_never_its_own_document(corpus_file):
    tokenize = Analyzer("en").tokenize
    docs = list(read_documents([corpus_file]))
    settings = TuneSettings(steps=4, batch_size=32)
    pairs, _ = make_pairs(docs, settings, [])
    negatives = hard_negatives(docs, pairs, settings)
    assert len(negatives) == len(pairs)
    assert not any(negative == source for negative, (_, _, source) in zip(negatives, pairs))
    shared = [
        bool(set(tokenize([anchor])[0]) & set(tokenize([document_text(docs[negative], settings.max_chars)])[0]))
        for (anchor, _, _), negative in zip(pairs, negatives)
    ]
    assert sum(shared) >= 0.9 * len(pairs)  # BM25 ranked them for the anchor's words (a few fall back to random)


def test_a_batch_holds_each_document_once(corpus_file):
    """No pair in a batch comes from another's document or from another's hard negative (they would be
    negatives of their own document), and batches are full but a few (never under half full)."""
    docs = list(read_documents([corpus_file]))
    settings = TuneSettings(steps=20, batch_size=len(docs) // 3)
    pairs, _ = make_pairs(docs, settings, [])
    negatives = hard_negatives(docs, pairs, settings)
    sampler = DistinctDocumentsBatchSampler(batch_keys(pairs, negatives), settings.batch_size, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler)  # the trainer is told how many batches the epoch has
    assert all(len(b) >= settings.batch_size // 2 for b in batches)
    assert sum(len(b) == settings.batch_size for b in batches) >= 0.8 * len(batches)
    for batch in batches:
        documents = [d for i in batch for d in (pairs[i][2], negatives[i])]
        assert len(set(documents)) == len(documents)
    assert len({i for b in batches for i in b}) == sum(map(len, batches))  # no pair twice in an epoch
    sampler.set_epoch(1)
    assert list(sampler)[0] != batches[0]  # each epoch its own order


def test_hard_negatives_search_each_anchor_once_and_each_pair_draws_from_its_own_anchors_ranking(corpus_file):
    """Rounds of pairs repeat anchors; each is searched once, and every pair's negative still comes from the
    ranking of its own anchor."""
    docs = list(read_documents([corpus_file]))
    settings = TuneSettings(steps=60, batch_size=32)
    pairs, _ = make_pairs(docs, settings, [])
    assert len({anchor for anchor, _, _ in pairs}) < 0.8 * len(pairs)  # the rounds repeat anchors
    lexical = documents_index(docs, "en")
    searched, search = [], lexical.top_many
    lexical.top_many = lambda queries, k: searched.extend(queries) or search(queries, k)  # the real search, counted
    negatives = hard_negatives(docs, pairs, settings, "en", lexical)
    assert sorted(searched) == sorted({anchor for anchor, _, _ in pairs})
    for (anchor, _, source), negative in zip(pairs, negatives):
        ranked = [int(c) for c in lexical.top_chunk_ids(anchor, HARD_NEGATIVE_DEPTH + 1) if int(c) != source]
        assert negative in ranked[:HARD_NEGATIVE_DEPTH] or not ranked


def test_the_distinct_anchors_of_the_pairs_are_predicted_before_they_are_made(corpus_file):
    """Planning prices mining by the distinct anchors expected among the pairs (a title, a sentence: rounds of
    pairs repeat them); the prediction follows the pairs make_pairs then makes, and never passes the anchors
    the documents have."""
    docs = list(read_documents([corpus_file]))
    sources = pair_sources(docs, "en")
    for kinds in ("title,ict,neighbours", "ict"):
        settings = TuneSettings(steps=500, batch_size=64, pairs_from=kinds)
        pairs, _ = make_pairs(docs, settings, [])
        counts = anchor_counts(sources, settings.pair_kinds)
        for n in (len(docs), 5 * len(docs), len(pairs)):
            distinct = len({anchor for anchor, _, _ in pairs[:n]})
            assert 0.85 * distinct <= expected_anchors(counts, n) <= 1.15 * distinct
            assert expected_anchors(counts, n) <= counts.sum()
    titled = sum(bool(s.title) and len(s.text) >= 20 for s in sources)
    assert expected_anchors(anchor_counts(sources, ("title",)), 100 * len(docs)) == pytest.approx(titled)


def test_tuning_steps_are_planned_to_fit_the_time_budget():
    """Steps fill what is left of the budget at the measured cost of a step, of making its pairs and of
    mining their new anchors, never more than asked for, never none."""
    settings = TuneSettings(steps=500, batch_size=1024)
    documents = np.full((5_000, 2), 10.0)  # 5,000 documents of 10 anchors of each of two kinds

    def steps(budget_s, elapsed_s=0.0, step_s=0.5, mine_s=0.0, anchors=None):
        return planned_steps(settings, budget_s, elapsed_s, TuningCosts(step_s, 1e-5, mine_s, anchors))

    assert steps(60) < steps(120) < steps(600) == 500
    assert steps(120, elapsed_s=60) < steps(120) and steps(120, mine_s=1e-4) < steps(120)
    assert steps(120, step_s=1.0) < steps(120) and steps(1) == steps(10, elapsed_s=20) == 1
    # anchors mined once: more steps fit than if every pair brought a new one
    assert steps(120, mine_s=1e-3) < steps(120, mine_s=1e-3, anchors=documents) < steps(120)
    for anchors in (None, documents, documents[:50]):
        costs = TuningCosts(0.5, 1e-5, 1e-3, anchors)
        planned = planned_steps(settings, 120, 0.0, costs)
        assert costs.seconds(planned, 1024) <= 120 * (1 - SAVE_SHARE) < costs.seconds(planned + 1, 1024)


def test_labelled_pairs_file(tmp_path):
    docs = {"7": Document("7", "T", "src", "Body text.")}
    good = tmp_path / "pairs.jsonl"
    good.write_text('{"query": "q1", "document": "some text"}\n\n{"query": "q2", "doc_id": 7}\n')
    assert read_labelled_pairs(good, docs) == [("q1", "some text"), ("q2", "T\nBody text.")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q1", "doc_id": "404"}\n')
    with pytest.raises(PipelineError, match=f"^{bad}:1: doc_id '404' is not in the corpus$"):
        read_labelled_pairs(bad, docs)
    bad.write_text('{"query": "q1"}\n')
    with pytest.raises(PipelineError, match='needs a "document" text or a "doc_id"'):
        read_labelled_pairs(bad, docs)


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    sims = vectors @ vectors.T
    n = len(vectors)
    return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))


@pytest.fixture(scope="module")
def tuned_workspace(trained_workspace, tmp_path_factory):
    ws = tmp_path_factory.mktemp("tuned") / "ws"
    shutil.copytree(trained_workspace, ws)
    run_cli(
        "tune",
        "-w",
        str(ws),
        "--architecture",
        "transformer",
        "--steps",
        "40",
        "--batch-size",
        "16",
        "--max-seq-length",
        "48",
        "--lr",
        "2e-3",
        "--pooling",
        "weightedmean",
    )
    return ws


def test_tune_saves_a_sentence_transformer_recorded_in_the_manifest(tuned_workspace, trained_workspace, corpus_file):
    tuned = json.loads((tuned_workspace / "manifest.json").read_text())["tuned"]
    assert tuned["path"] == "tuned" and tuned["architecture"] == "transformer"
    assert tuned["pooling"] == "weightedmean" and tuned["steps"] == 40
    assert tuned["final_loss"] < tuned["first_loss"]  # it learned something
    # where the steps' time went: every step but the first measured, the parts adding up to the step
    profile = tuned["step_profile"]
    assert profile["steps_measured"] == 39 and profile["step_s"] > 0
    shares = [profile["batching_share"], profile["forward_backward_share"], profile["optimizer_share"]]
    assert all(0 < share < 1 for share in shares) and abs(sum(shares) - 1) < 1e-9
    assert profile["forward_backward_share"] == max(shares)  # the model's passes are most of a step here
    pooling = json.loads((tuned_workspace / "tuned" / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == "weightedmean"
    assert json.loads((tuned_workspace / "tuned" / "config.json").read_text())["resid_pdrop"] == 0.0

    # Raw hidden states put every text in about the same direction (cosine ~0.9998); tuning spreads them apart.
    texts = [d.title + "\n" + d.text for d in list(read_documents([corpus_file]))[:40]]
    raw = mean_pairwise_cosine(encode(load_embedder(trained_workspace / "model"), texts))
    after = mean_pairwise_cosine(encode(load_embedder(tuned_workspace / "tuned"), texts))
    assert 1 - after > 10 * (1 - raw), (raw, after)


def test_embed_uses_the_tuned_model_by_default_and_search_follows(tuned_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(tuned_workspace, ws)
    few = scifact_slice(tmp_path / "few.jsonl", 12)
    summary = json.loads(
        run_cli(
            "embed", "-w", str(ws), "--data", str(few), "--prune", "--chunk-tokens", "64", "--overlap", "8", "--json"
        ).stdout
    )
    assert summary["model_path"] == "tuned"
    run_cli("index", "-w", str(ws))
    from search.engine import SearchEngine

    hits = SearchEngine(Workspace(ws)).search("cancer", k=3, mode="dense")
    assert len(hits) == 3 and SearchEngine(Workspace(ws)).model_dir == (ws / "tuned").resolve()
    # A pretrained model newer than the tuning makes embed fall back to it, saying why.
    manifest = json.loads((ws / "manifest.json").read_text())
    manifest["tuned"]["base_fingerprint"] = "0" * 16
    (ws / "manifest.json").write_text(json.dumps(manifest))
    from embed.tune import default_model_dir

    assert default_model_dir(Workspace(ws)) == ws / "model"


def title_hit_rate(ws, docs: list[Document]) -> float:
    """Share of documents that a dense search for their title puts first."""
    from search.engine import SearchEngine

    engine = SearchEngine(Workspace(ws))
    return float(np.mean([engine.search(d.title, k=1, mode="dense")[0].doc_id == d.id for d in docs]))


def test_static_tune_from_the_pretrained_token_embeddings_finds_documents_by_title(
    trained_workspace, corpus_file, tmp_path
):
    docs = list(read_documents([corpus_file]))
    ws = tmp_path / "static"
    shutil.copytree(trained_workspace, ws)
    run_cli("tune", "-w", str(ws), "--architecture", "static", "--steps", "150", "--batch-size", "32")
    run_cli("embed", "-w", str(ws))
    run_cli("index", "-w", str(ws))
    rates = {
        "raw": title_hit_rate(trained_workspace, docs[:40]),
        "static": title_hit_rate(ws, docs[:40]),
    }  # raw: the untuned model
    tuned = json.loads((tmp_path / "static" / "manifest.json").read_text())["tuned"]
    assert tuned["architecture"] == "static" and tuned["lr"] == 5e-2 and tuned["final_loss"] < tuned["first_loss"]
    status = json.loads(run_cli("status", "-w", str(tmp_path / "static"), "--json").stdout)["parts"]
    assert status["tuned"]["state"] == "ok" and status["tuned"]["detail"].startswith("static embedder, 150 steps")
    assert status["index"]["detail"].endswith("BM25 lexical index (en)")  # the language detected
    # pipeline index chose the default mode on held-out pairs of the corpus, for this model, and status says
    # what it measured: each mode's nDCG@10 with its standard error, and the kind of pairs
    search = status["search"]["detail"]
    assert status["search"]["state"] == "ok" and re.search(
        r"\(chosen on \d+ held-out corpus pairs \(\d+ \w+.*\), nDCG@10 lexical 0\.\d{3} ± 0\.\d{3}, "
        r"dense 0\.\d{3} ± 0\.\d{3}, hybrid 0\.\d{3} ± 0\.\d{3}\)$",
        search,
    ), search
    modules = json.loads((tmp_path / "static" / "tuned" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["StaticEmbedding"]
    # The untuned transformer's mean-pooled states rarely put a document first for its own title; the tuned
    # static embedder mostly does.
    assert rates["static"] >= 0.6 and rates["static"] > rates["raw"] + 0.3, rates


def test_auto_tunes_both_embedders_within_the_budget_and_keeps_the_better_on_held_out_pairs(
    trained_workspace, tmp_path
):
    ws = tmp_path / "auto"
    shutil.copytree(trained_workspace, ws)
    run_cli("tune", "-w", str(ws), "--steps", "3", "--batch-size", "8", "--time-budget", "30m")
    tuned = json.loads((ws / "manifest.json").read_text())["tuned"]
    candidates = tuned["candidates"]
    assert set(candidates) == {"static", "transformer"}
    scores = {name: c["held_out_ndcg@10"] for name, c in candidates.items()}
    assert all(0 <= score <= 1 for score in scores.values()) and candidates["static"]["held_out_pairs"] > 0
    kept = tuned["architecture"]
    assert tuned["path"] == "tuned" and (kept == "static" or scores["transformer"] > scores["static"])
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((ws / "tuned" / "modules.json").read_text())]
    assert ("StaticEmbedding" in modules) == (kept == "static")
    assert not list(ws.glob(".adapt.*"))  # the other candidate is gone
    # every phase planned and timed, each candidate's steps planned from a measured step
    assert {"probe", "static", "transformer", "measure"} <= set(tuned["phases"])
    assert all(phase["actual_s"] is not None for phase in tuned["phases"].values())
    assert tuned["plan"]["step_s"] > 0 and candidates["static"]["held_out_standard_error"] is not None
    # A budget the transformer's measured steps do not fit: the static embedder only, and why
    run_cli("tune", "-w", str(ws), "--steps", "3", "--batch-size", "8", "--time-budget", "0.001s")
    tuned = json.loads((ws / "manifest.json").read_text())["tuned"]
    assert tuned["architecture"] == "static" and "over the budget" in tuned["candidates"]["transformer"]["skipped"]


def test_a_corpus_of_three_documents_tunes_with_in_batch_negatives(trained_workspace, tmp_path):
    ws = tmp_path / "few"
    shutil.copytree(trained_workspace, ws)
    data = scifact_slice(tmp_path / "three.jsonl", 3)
    run_cli("tune", "-w", str(ws), "--data", str(data), "--architecture", "static", "--steps", "2", "--batch-size", "8")
    tuned = json.loads((ws / "manifest.json").read_text())["tuned"]
    assert tuned["steps"] >= 1 and tuned["hard_negatives"] is False  # trained, not saved untrained
    one = scifact_slice(tmp_path / "one.jsonl", 1)
    result = run_cli("tune", "-w", str(ws), "--data", str(one), "--architecture", "static", check=False)
    assert result.returncode == 2 and "tuning needs at least 2 documents" in result.stderr


def test_tune_bad_options_are_one_line(trained_workspace, tmp_path):
    # checked once, when the settings are made (embed/settings.py), for the CLI and Python callers alike
    for args, message in [
        (
            ["--pooling", "max"],
            "error: --pooling: 'max' is not one of 'mean', 'weightedmean', 'lasttoken'; see `pipeline tune --help`",
        ),
        (
            ["--architecture", "rnn"],
            "error: --architecture: 'rnn' is not one of 'auto', 'static', 'transformer'; see `pipeline tune --help`",
        ),
        (
            ["--architecture", "static", "--pooling", "lasttoken"],
            "error: --pooling: lasttoken is for --architecture transformer: a static embedding is the mean of its "
            "token vectors; see `pipeline tune --help`",
        ),
        (
            ["--pairs-from", "title,magic"],
            "error: --pairs-from: unknown kind 'magic' (choose from title, ict, neighbours, dropout); "
            "see `pipeline tune --help`",
        ),
        (["--batch-size", "1"], "error: --batch-size: 1 is not in the range x>=2; see `pipeline tune --help`"),
        (
            ["--time-budget", "soon"],
            "error: --time-budget: 'soon' is not a duration (e.g. 90s, 15m, 1.5h); see `pipeline tune --help`",
        ),
    ]:
        result = run_cli("tune", "-w", str(trained_workspace), *args, check=False)
        assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == message
    result = run_cli(
        "tune", "-w", str(tmp_path / "empty"), "--data", str(trained_workspace / "nope.jsonl"), check=False
    )
    assert result.returncode == 2


def test_tuning_reads_a_bounded_sample_drawn_across_a_large_corpus():
    from common.readers import Document
    from embed.tune import tuning_documents

    documents = [Document(f"d{i}", "", "", f"text {i}") for i in range(1000)]
    sample = tuning_documents(iter(documents), limit=50, seed=1)
    positions = [int(d.id[1:]) for d in sample]
    assert len(sample) == 50 and positions == sorted(positions) and positions[-1] > 500  # across, in corpus order
    assert tuning_documents(iter(documents), limit=50, seed=1) == sample != tuning_documents(iter(documents), 50, 2)
    assert tuning_documents(iter(documents[:30]), limit=50) == documents[:30]


def test_batches_from_texts_tokenized_once_are_what_the_models_make_themselves(
    trained_workspace, tuned_workspace, corpus_file
):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    from embed.pretokenized import static_texts, transformer_texts

    def same(ours: dict, theirs: dict) -> bool:
        return ours.keys() == theirs.keys() and all(
            torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype
            if isinstance(theirs[k], torch.Tensor)
            else ours[k] == theirs[k]
            for k in theirs
        )

    texts = [d.text for d in read_documents([corpus_file])][:50] + ["", "café 東京 🙂 don't\t\n", "not seen before"]
    tokenizer = Tokenizer.from_file(str(trained_workspace / "model" / "tokenizer.json"))
    static = StaticEmbedding(tokenizer, embedding_dim=8)
    transformer = SentenceTransformer(str(tuned_workspace / "tuned"), device="cpu")  # 48 tokens at most
    for model, pretokenized in (
        (static, static_texts(tokenizer, texts[:-1])),
        (transformer, transformer_texts(transformer.tokenizer, transformer.max_seq_length, texts[:-1])),
    ):
        for batch in (texts, texts[::-1], [texts[0]] * 3):
            assert same(pretokenized(batch), model.preprocess(batch))
        assert "not seen before" in pretokenized.position  # tokenized when first asked for, then kept
        # the trainer's batches: rows of text positions, each column's features under its name
        anchors, positives = pretokenized.positions(texts[:9]), pretokenized.positions(texts[9:18])
        collated = pretokenized.collator()([{"anchor": a, "positive": p} for a, p in zip(anchors, positives)])
        for column, part in (("anchor", texts[:9]), ("positive", texts[9:18])):
            theirs = model.preprocess(part)
            assert same({key: collated[f"{column}_{key}"] for key in theirs}, theirs)
        assert [key.split("_")[0] for key in collated][0] == "anchor"


def test_tuning_stops_where_its_time_budget_ends_when_steps_take_longer_than_planned(
    trained_workspace, tmp_path, monkeypatch
):
    import embed.tune

    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    docs = list(source_documents(Workspace(ws), [], None))
    # a plan that asks for every step the pairs allow (as a probe that said steps cost nothing would)
    monkeypatch.setattr(embed.tune, "planned_steps", lambda settings, *args: settings.steps)
    settings = TuneSettings(architecture="static", steps=100_000, batch_size=8, seed=0)
    summary = run_tune(Workspace(ws), docs, settings, record=False, budget_s=2.0)
    assert summary.report["planned_steps"] > summary.steps >= 1
    assert summary.final_loss is not None and (ws / summary.path / "modules.json").exists()


def test_batches_made_by_loader_workers_train_the_same_model(trained_workspace, tmp_path):
    """Processes batching ahead of the model (a GPU's default) give the same batches, so the same steps."""
    from safetensors.numpy import load_file

    docs = list(source_documents(Workspace(trained_workspace), [], None))
    losses, tables = [], []
    for workers in (0, 2):
        ws = tmp_path / f"workers-{workers}"
        shutil.copytree(trained_workspace, ws)
        settings = TuneSettings(architecture="static", steps=6, batch_size=8, seed=0, loader_workers=workers)
        summary = run_tune(Workspace(ws), docs, settings, record=False, budget_s=600.0)
        assert summary.steps == 6
        losses.append(summary.final_loss)
        (weights,) = (ws / summary.path).rglob("*.safetensors")
        tables.append(next(iter(load_file(weights).values())))
    assert losses[0] == losses[1], losses
    assert np.array_equal(tables[0], tables[1])
