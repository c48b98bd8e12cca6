"""Lexical and hybrid search, filters, and `pipeline eval` on the SciFact slice of the shared workspace."""

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from common.errors import PipelineError
from common.heldout import held_out_pair
from common.workspace import Workspace
from conftest import run_cli
from search.calibrate import DRAWS
from search.engine import NO_RANKING, Ranking, SearchEngine, fuse
from search.evaluate import evaluate, read_qrels, read_queries
from search.filters import DocumentFilter


def corpus_rows(corpus_file):
    return [json.loads(line) for line in corpus_file.read_text().splitlines()]


@pytest.fixture(scope="module")
def engine(trained_workspace):
    return SearchEngine(Workspace(trained_workspace))


def test_index_builds_a_lexical_index_recorded_in_the_manifest(trained_workspace):
    entry = json.loads((trained_workspace / "manifest.json").read_text())["index"]
    lexical = trained_workspace / entry["lexical_path"]
    assert lexical.is_dir() and (lexical / "chunk_ids.npy").exists()
    assert entry["lexical_chunks"] == entry["vectors"]  # the same chunks as the dense index
    assert [p.name for p in (trained_workspace / "index").iterdir() if p.name.startswith(".")] == []  # no staging left


def test_rebuilding_replaces_the_lexical_index_and_removes_the_old_one(trained_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    first = json.loads(run_cli("index", "-w", str(ws), "--json").stdout)  # nothing changed: an update of the last build
    second = json.loads(run_cli("index", "-w", str(ws), "--json", "--rebuild").stdout)
    assert (
        first["update"] == "incremental"
        and first["path"] == json.loads((trained_workspace / "manifest.json").read_text())["index"]["path"]
    )
    assert (
        second["update"] == "full"
        and first["lexical_path"] != second["lexical_path"]
        and first["build_id"] != second["build_id"]
    )
    assert first["path"] != second["path"]
    assert sorted(p.name for p in (ws / "index").iterdir()) == sorted(
        path.split("/")[-1] for path in (second["path"], second["lexical_path"], second["corpus_path"])
    )


def test_bm25_tokens_are_bm25s_tokens(corpus_file):
    """Our tokenizer makes bm25s's tokens (its word pattern, stop words, stemmer) without its per-call set-up:
    indexes written with bm25s's tokenizer stay valid."""
    import bm25s
    import Stemmer

    from common.lexical import Analyzer

    texts = [f"{row['title']}\n{row['text']}" for row in corpus_rows(corpus_file)]
    texts += ["naïve café it's x_y __ a1 1a ½ ²³ THE The the", "a b cc ddd e-f g_h", ""]
    english = Stemmer.Stemmer("english")
    assert Analyzer("en").tokenize(texts) == bm25s.tokenize(
        texts, stopwords="en", stemmer=english, return_ids=False, show_progress=False
    )
    # An index written before languages were analysed keeps its tokens, CJK runs whole, as bm25s made them
    texts.append("東京 the runs")
    old = Analyzer.load(Path("no such index"))
    assert old == Analyzer("en", cjk_bigrams=False)
    assert old.tokenize(texts) == bm25s.tokenize(
        texts, stopwords="en", stemmer=english, return_ids=False, show_progress=False
    )


def test_bm25_analyzes_by_language_and_cjk_by_bigrams():
    from common.lexical import Analyzer, choose_analyzer

    assert Analyzer("ru").tokenize(["Яблоки падают на землю."]) == [["яблок", "пада", "земл"]]  # "на": a stop word
    assert Analyzer("ja").tokenize(["東京都に住む ＡＢＣ"]) == [["東京", "京都", "都に", "に住", "住む", "abc"]]
    assert Analyzer("en").tokenize(["東 the runs"]) == [["東", "run"]]  # a CJK character alone is a token too
    assert (
        Analyzer("en").tokenize(["ＩＢＭ rocks"]) == Analyzer("en").tokenize(["IBM rocks"]) == [["ibm", "rock"]]
    )  # full-width folded
    assert choose_analyzer(["Это русский текст о яблоках и грушах, который растёт."] * 5)[0] == Analyzer("ru")
    assert choose_analyzer(["anything"], "none")[0].tokenize(["The running"]) == [["the", "running"]]
    with pytest.raises(PipelineError, match="--language: 'english' is not"):
        choose_analyzer([], "english")


def test_lexical_search_finds_a_document_by_its_title_words(engine, corpus_file):
    row = corpus_rows(corpus_file)[7]
    hits = engine.search(row["title"], k=3, mode="lexical")
    assert hits[0].doc_id == row["_id"]
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
    assert engine.search("zzzqqq xyzzy", k=3, mode="lexical") == []  # no shared word, no result


def test_hybrid_keeps_what_lexical_finds_and_returns_distinct_documents(engine, corpus_file):
    rows = corpus_rows(corpus_file)
    for row in rows[10:15]:
        hits = engine.search(row["title"], k=10, mode="hybrid")
        assert row["_id"] in [h.doc_id for h in hits[:3]]
        assert len({h.doc_id for h in hits}) == len(hits) == 10


def test_fusion_combines_standardised_scores():
    def ranking(
        *scored, chunk=0
    ):  # (score, document letter) pairs, best first; a document's chunk: its number * 10 + chunk
        docs = np.array([ord(letter) - ord("a") for _, letter in scored], dtype=np.int64)
        chunks = docs * 10 + chunk  # positions; ids the same
        return Ranking(docs, chunks, np.array([s for s, _ in scored], dtype=np.float64), np.zeros_like(docs), chunks)

    def letters(fused):
        return [chr(ord("a") + int(d)) for d in fused.docs]

    dense = ranking((0.9, "a"), (0.8, "b"), (0.7, "c"))
    lexical = ranking((9.0, "c"), (8.9, "d"), (2.0, "e"), chunk=1)
    assert letters(fuse(dense, lexical, 1.0))[:2] == ["a", "b"]
    assert letters(fuse(dense, lexical, 0.0))[:2] == ["c", "d"]
    balanced = fuse(dense, lexical, 0.5)
    # Each retriever adds weight * (score - its lowest score) / deviation of its scores. a leads dense by
    # a clear gap; c is dense's last but BM25's first, barely ahead of d: a wins, where reciprocal rank
    # fusion would put c, the only document in both lists, first.
    expected = {
        "a": 0.5 * 0.2 / np.std([0.9, 0.8, 0.7]),
        "b": 0.5 * 0.1 / np.std([0.9, 0.8, 0.7]),
        "c": 0.5 * 7.0 / np.std([9.0, 8.9, 2.0]),
        "d": 0.5 * 6.9 / np.std([9.0, 8.9, 2.0]),
        "e": 0.0,
    }
    assert letters(balanced) == ["a", "c", "d", "b", "e"]
    assert dict(zip(letters(balanced), balanced.scores)) == pytest.approx(expected)
    assert list(balanced.chunks) == [0, 21, 31, 10, 41]  # the chunk of the retriever that contributed more
    assert letters(fuse(dense, NO_RANKING, 0.5)) == ["a", "b", "c"]
    # a list of one document, or of equal scores: each counts as one deviation above the documents not returned
    assert letters(fuse(ranking((0.5, "x")), ranking((1.0, "y"), (1.0, "x")), 0.5))[0] == "x"
    # equal fused scores rank by their chunk's id (as in every ranking: shards merge as one index ranks)
    assert letters(fuse(ranking((1.0, "d")), ranking((1.0, "b"), chunk=5), 0.5)) == ["b", "d"]
    assert letters(fuse(ranking((1.0, "b"), chunk=25), ranking((1.0, "d")), 0.5)) == ["d", "b"]  # 30 before 35


def test_filters_restrict_results(engine, corpus_file):
    rows = corpus_rows(corpus_file)
    word = "cell"
    for mode in ("dense", "lexical", "hybrid"):
        hits = engine.search(
            "cells in tumours", k=5, mode=mode, filters=DocumentFilter.of({"title": {"contains": word.upper()}})
        )
        assert hits and all(word in h.title.lower() for h in hits), mode
        assert (
            engine.search("cells", k=5, mode=mode, filters=DocumentFilter.of({"source": {"glob": "/no/such/dir/*"}}))
            == []
        )
    everything = engine.search(
        "cells", k=5, mode="dense", filters=DocumentFilter.of({"source": {"glob": str(corpus_file.parent / "*.jsonl")}})
    )
    assert len(everything) == 5 and {h.source for h in everything} == {str(corpus_file)}
    assert len(rows) > 5


def test_a_relative_source_glob_is_read_from_the_current_directory(engine, corpus_file, monkeypatch):
    monkeypatch.chdir(corpus_file.parent.parent)
    folder = corpus_file.parent.name
    for glob in (f"{folder}/*.jsonl", f"./{folder}/corpus.*", "*.jsonl"):
        hits = engine.search("cells", k=5, mode="lexical", filters=DocumentFilter.of({"source": {"glob": glob}}))
        assert len(hits) == 5 and {h.source for h in hits} == {str(corpus_file)}, glob
    assert (
        engine.search(
            "cells", k=5, mode="lexical", filters=DocumentFilter.of({"source": {"glob": "elsewhere/*.jsonl"}})
        )
        == []
    )


def test_bad_requests_are_pipeline_errors(engine):
    for query, k, mode, message in [
        ("", 5, None, "empty query"),
        ("q", 0, None, "k must be between"),
        ("q", 5, "fuzzy", "unknown mode"),
    ]:
        with pytest.raises(PipelineError, match=message):
            engine.search(query, k, mode)


def test_a_query_longer_than_the_model_reads_is_embedded_up_to_its_input_length(engine, corpus_file, capsys):
    from common.embedder import token_limit, truncate_to_model

    long_query = " ".join(row["text"] for row in corpus_rows(corpus_file)[:5])
    (cut,), (n_tokens,) = truncate_to_model(engine.model, [long_query])
    assert n_tokens > token_limit(engine.model) and long_query.startswith(cut) and len(cut) < len(long_query)
    for mode in ("dense", "hybrid", "lexical"):
        assert engine.search_many([long_query], k=5, mode=mode, names=["the long one"])[0], mode
    ranking = lambda hits: [(h.doc_id, h.chunk_id, h.score) for h in hits]  # noqa: E731 (the snippets mark each query's own terms)
    assert ranking(engine.search(long_query, k=5, mode="dense")) == ranking(engine.search(cut, k=5, mode="dense"))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: query the long one is {n_tokens:,} tokens long")


@pytest.fixture(scope="module")
def judged_titles(corpus_file, tmp_path_factory):
    """Queries that are documents' titles, each judged relevant to its own document: an easy, known answer;
    and one query far longer than the model reads (five documents' texts), judged relevant to those five."""
    rows = corpus_rows(corpus_file)[:30]
    folder = tmp_path_factory.mktemp("eval")
    queries = [{"_id": f"q{i}", "text": r["title"]} for i, r in enumerate(rows)] + [
        {"_id": "long", "text": " ".join(r["text"] for r in rows[:5])}
    ]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"q{i}\t{r['_id']}\t1\n" for i, r in enumerate(rows))
        + "".join(f"long\t{r['_id']}\t1\n" for r in rows[:5])
    )
    return folder


def test_eval_scores_every_mode_with_pytrec_eval_and_sets_the_default(trained_workspace, judged_titles, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    result = run_cli(
        "eval",
        "-w",
        str(ws),
        "--queries",
        str(judged_titles / "queries.jsonl"),
        "--qrels",
        str(judged_titles / "qrels.tsv"),
        "--mode",
        "all",
        "--set-default",
        "--dense-weight",
        "0.2",
        "--json",
    )
    reports = {r["mode"]: r for r in json.loads(result.stdout)}
    best = max(reports, key=lambda m: reports[m]["ndcg@10"])
    assert reports["hybrid"]["dense_weight"] == 0.2
    assert json.loads((ws / "manifest.json").read_text())["search"]["default_mode"] == best
    assert SearchEngine(Workspace(ws), load_model=False).resolve_mode(None) == best
    assert (
        SearchEngine(Workspace(ws), load_model=False).resolve_dense_weight(None) == 0.2
    )  # the weight that was measured
    assert f"default mode for this workspace: {best}" in result.stderr
    # it says what it is doing: loading the model once, then each mode's queries
    queries = reports["dense"]["queries"]
    assert result.stderr.count("loading the embedding model") == 1
    assert [
        line.split(":")[0] for line in result.stderr.splitlines() if f"searching {queries} judged queries" in line
    ] == list(reports)
    # the long query is evaluated, cut to the model's input length, with one warning though two modes embed it
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: query long is "), warnings
    manifest = json.loads((ws / "manifest.json").read_text())
    manifest["search"]["default_mode"] = "hybrid"
    (ws / "manifest.json").write_text(json.dumps(manifest))
    assert SearchEngine(Workspace(ws), load_model=False).resolve_mode(None) == "hybrid"
    manifest["search"]["embedder_fingerprint"] = "another model"  # measured for other vectors: not used
    (ws / "manifest.json").write_text(json.dumps(manifest))
    assert SearchEngine(Workspace(ws), load_model=False).resolve_mode(None) == "lexical"
    assert SearchEngine(Workspace(ws), load_model=False).resolve_dense_weight(None) == 0.5
    assert set(reports) == {"dense", "lexical", "hybrid"}
    for report in reports.values():
        assert report["queries"] == 31
        for metric in ("ndcg@10", "recall@100", "mrr@10"):
            assert 0.0 <= report[metric] <= 1.0
    # A title finds its own document by its words: near-perfect lexical scores, and fusion keeps most of it.
    assert reports["lexical"]["mrr@10"] > 0.9 and reports["lexical"]["recall@100"] == 1.0
    assert reports["hybrid"]["ndcg@10"] > 0.6
    assert reports["dense"]["ndcg@10"] < reports["lexical"]["ndcg@10"]  # the barely trained, untuned test model
    # Without --json: a table, one line per mode. A mode chosen on judged queries is kept when `pipeline index`
    # runs again for the same model.
    table = run_cli(
        "eval",
        "-w",
        str(ws),
        "--queries",
        str(judged_titles / "queries.jsonl"),
        "--qrels",
        str(judged_titles / "qrels.tsv"),
        "--mode",
        "all",
        "--set-default",
        "--dense-weight",
        "0.2",
    ).stdout.splitlines()
    assert [line.split()[0] for line in table] == ["dense", "lexical", "hybrid"]
    assert "nDCG@10" in table[1] and "Recall@100 1.0000" in table[1] and "MRR@10" in table[1]
    run_cli("index", "-w", str(ws))
    search = json.loads((ws / "manifest.json").read_text())["search"]
    assert search["chosen_by"] == "judged queries" and search["default_mode"] == best


def test_hybrid_weight_is_the_plateaus_weight_nearest_the_prior():
    from search.calibrate import PRIOR_DENSE_WEIGHT, plateau_weight

    rng = np.random.default_rng(0)
    base = rng.random(400)
    # One weight clearly best: it is chosen, however far from the prior.
    clear = {0.1: base, 0.2: base, 0.6: base + 0.2, 0.3: base}
    assert plateau_weight(clear) == 0.6
    # 0.1-0.4 differ per pair but equal on average (0.4 best by far less than a standard error), 0.5
    # clearly worse: of the plateau, the weight nearest the prior, not the best by a hair.
    flat = {}
    for w in (0.1, 0.2, 0.3, 0.4):
        noise = rng.choice([-0.05, 0.05], 400)
        flat[w] = base + noise - noise.mean()
    flat[0.4] = flat[0.4] + 1e-3
    flat[0.5] = base - 0.3
    assert plateau_weight(flat) == PRIOR_DENSE_WEIGHT == 0.3
    # A plateau away from the prior: its nearest end.
    low = {w: flat[w] for w in (0.1, 0.2)} | {0.3: base - 0.3, 0.4: base - 0.3}
    assert plateau_weight(low) == 0.2
    # Two families of pairs: a weight either one cannot rule out may be taken.
    assert plateau_weight(low, clear) == 0.2 and plateau_weight(low, flat) == 0.3


def test_the_default_mode_is_hybrid_unless_another_is_clearly_better_and_lexical_when_inconclusive():
    from search.calibrate import best_mode

    rng = np.random.default_rng(1)
    base = rng.random(300)
    noise = rng.choice([-0.1, 0.1], 300)
    # lexical ahead of hybrid by less than a standard error of the per-pair difference: hybrid, the safe choice
    assert best_mode({"lexical": base + noise + 0.002, "dense": base - 0.2, "hybrid": base}) == ("hybrid", False)
    # lexical clearly ahead: lexical; dense clearly ahead of both: dense
    assert best_mode({"lexical": base + 0.05, "dense": base - 0.2, "hybrid": base}) == ("lexical", False)
    assert best_mode({"lexical": base + 0.05, "dense": base + 0.1, "hybrid": base}) == ("dense", False)
    # nothing found in any mode: no evidence, lexical
    found = np.zeros(300)
    found[:3] = 1.0
    assert best_mode({"lexical": found * 0, "dense": found, "hybrid": found}) == ("lexical", True)


def test_held_out_pairs_draw_distinct_sentences_each_left_out_of_its_text():
    text = " ".join(f"Sentence number {n} of this abstract says something new." for n in range(5))
    drawn = held_out_pair("A title", text, random.Random(0), "en", draws=8)
    assert len(drawn) == 5 and len({query for query, _, _ in drawn}) == 5  # every sentence once, no more
    for query, shortened, kind in drawn:
        assert kind == "sentence" and query not in shortened and len(shortened.split(". ")) == 4
    assert held_out_pair("A title", text, random.Random(0), "en")[0] == drawn[0]  # one draw: the first of them


def test_the_default_mode_is_a_single_one_only_when_every_family_of_pairs_chooses_it():
    from search.calibrate import agreed_mode

    rng = np.random.default_rng(2)
    base = rng.random(300)
    lexical_ahead = {"lexical": base + 0.05, "dense": base - 0.2, "hybrid": base}
    even = {"lexical": base, "dense": base - 0.2, "hybrid": base + 0.001}
    assert agreed_mode(lexical_ahead, [lexical_ahead, lexical_ahead]) == ("lexical", False)
    # query-like pairs favour lexical search, passages do not: the pairs disagree, so hybrid
    assert agreed_mode(lexical_ahead, [even, lexical_ahead]) == ("hybrid", False)
    nothing = {mode: np.zeros(300) for mode in ("lexical", "dense", "hybrid")}
    assert agreed_mode(nothing, [nothing, even]) == ("lexical", True)


def test_a_family_of_pairs_measured_on_few_documents_or_inconclusive_has_no_say():
    from search.calibrate import MIN_FAMILY_DOCUMENTS, has_a_say, voting

    rng = np.random.default_rng(5)

    def family(documents, level):
        return {key: level * rng.random(documents) for key in ("lexical", "dense", 0.3)}

    assert has_a_say(family(MIN_FAMILY_DOCUMENTS, 0.5))
    assert not has_a_say(family(MIN_FAMILY_DOCUMENTS - 1, 0.5))  # too few documents
    assert not has_a_say(family(300, 0.02))  # hardly anything found: it tells the modes nothing
    # Those with a say choose; where none has one, all pairs together do.
    passages, few, pooled = family(300, 0.5), family(12, 0.5), family(312, 0.5)
    assert list(voting({"passage": passages, "query": few}, pooled)) == ["passage"]
    assert voting({"passage": few, "query": family(300, 0.01)}, pooled) == {"all": pooled}


def test_query_like_pairs_are_a_run_of_a_sentences_words_that_its_document_keeps_in_part():
    # six sentences of fourteen words, no word in two of them
    sentences = [" ".join(f"w{n}x{k}" for k in range(14)) + "." for n in range(6)]
    text = " ".join(sentences)
    drawn = held_out_pair("A title", text, random.Random(3), "en", draws=4, query_like=True)
    assert len(drawn) == 4 and {kind for _, _, kind in drawn} == {"query"}
    for query, document, _ in drawn:
        (source,) = [s for s in sentences if query in s]  # a run of one sentence's words
        assert 4 <= len(query.split()) <= 12
        others = [s for s in sentences if s != source]
        assert all(s in document for s in others)  # only that sentence changed
        # what is left of it: the sentence with some of the query's words gone, none of its other words
        left = document
        for s in others:
            left = left.replace(s, "")
        words_left, query_words = left.split(), query.split()
        assert set(words_left) <= set(source.split())
        assert set(source.split()) - set(query_words) <= set(words_left)
    # Each of the query's words stays in the document at even odds: about half of them over many pairs.
    kept = asked = 0
    for seed in range(40):
        for query, document, _ in held_out_pair("A title", text, random.Random(seed), "en", draws=6, query_like=True):
            words = set(document.split())
            kept, asked = kept + sum(word in words for word in query.split()), asked + len(query.split())
    assert 0.4 < kept / asked < 0.6
    # In a script without spaces, a run of characters: twice as many as words would be.
    chinese = "".join(f"第{n}句话讲述了袋熊在干燥的桉树根下挖洞的故事。" for n in range(5))
    for query, _, _ in held_out_pair("", chinese, random.Random(4), "zh", draws=5, query_like=True):
        assert 8 <= len(query) <= 24 and " " not in query and query in chinese
    # Latin words and numbers among the Chinese are whole in the query, never cut into letters.
    mixed = "".join(f"第{n}个模型在H100 GPU上训练了GPT-2 small共{n}小时。" for n in range(5))
    whole = {"H100", "GPU", "GPT-2", "small"}
    for seed in range(20):
        for query, document, _ in held_out_pair("", mixed, random.Random(seed), "zh", draws=5, query_like=True):
            latin = re.findall(r"[A-Za-z0-9-]+", query)
            assert query in mixed and query == query.strip()
            assert set(latin) - {str(n) for n in range(5)} <= whole
            assert set(re.findall(r"[A-Za-z0-9-]+", document)) - {str(n) for n in range(5)} <= whole  # none joined


def test_index_chooses_the_default_mode_on_held_out_corpus_pairs(trained_workspace):
    from common.heldout import is_held_out

    manifest = json.loads((trained_workspace / "manifest.json").read_text())
    search = manifest["search"]
    assert (
        search["chosen_by"] == "held-out corpus pairs"
        and search["embedder_fingerprint"] == manifest["index"]["embedder_fingerprint"]
    )
    assert search["inconclusive"] is (max(search["ndcg@10"].values()) < 0.05)
    assert 0 < search["documents_measured"] <= search["collection_documents"] == manifest["embedder"]["documents"]
    # each measured document: up to DRAWS passages taken out, and as many query-like pairs
    assert search["documents_measured"] <= search["pairs"] <= 2 * DRAWS * search["documents_measured"]
    assert search["pair_kinds"]["query"] > 0 and set(search["ndcg@10_by_pair_family"]) == {"passage", "query"}
    scores = search["ndcg@10"]
    assert all(0.0 <= v <= 1.0 for family in search["ndcg@10_by_pair_family"].values() for v in family.values())
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    assert scores["hybrid"] == search["hybrid_ndcg@10"][str(search["dense_weight"])]
    # A single retriever is chosen over hybrid only where it measured better than hybrid, on all pairs together
    # (and in each family of them: else the default is hybrid).
    for mode in {search["default_mode"], search["mode_of_all_pairs"]} - {"hybrid"}:
        assert search["inconclusive"] or scores[mode] > scores["hybrid"]
    assert search["default_mode"] in (search["mode_of_all_pairs"], "hybrid")
    assert set(search["families_with_a_say"]) <= {"passage", "query"} or search["families_with_a_say"] == ["all"]
    assert SearchEngine(Workspace(trained_workspace), load_model=False).resolve_mode(None) == search["default_mode"]
    # The split is a fixed function of the id: about 5% of documents are held out, the same ones every time.
    ids = [f"doc-{i}" for i in range(2000)]
    assert 60 <= sum(map(is_held_out, ids)) <= 140 and [is_held_out(i) for i in ids] == [is_held_out(i) for i in ids]


def test_eval_agrees_with_a_hand_computed_reciprocal_rank(judged_titles, engine):
    """pytrec_eval's MRR@10 for one query equals 1/rank of its relevant document in the engine's own ranking."""
    queries = read_queries(judged_titles / "queries.jsonl")
    qrels = {"q3": read_qrels(judged_titles / "qrels.tsv")["q3"]}
    hits = engine.search(queries["q3"], k=10, mode="dense")
    rank = next((h.rank for h in hits if h.doc_id in qrels["q3"]), None)
    report = evaluate(engine, queries, qrels, mode="dense", depth=10)
    assert report.queries == 1 and report.skipped_queries == 0
    assert report.mrr_at_10 == pytest.approx(1 / rank if rank else 0.0)
    assert report.recall_at_100 == (1.0 if rank else 0.0)


def test_eval_bad_input_is_one_line(trained_workspace, judged_titles, tmp_path):
    bad = tmp_path / "qrels.tsv"
    bad.write_text("query-id\tcorpus-id\tscore\nq1\tdoc\tvery\n")
    result = run_cli(
        "eval",
        "-w",
        str(trained_workspace),
        "--queries",
        str(judged_titles / "queries.jsonl"),
        "--qrels",
        str(bad),
        check=False,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip() == f"error: {bad}:2: expected query-id, corpus-id and an integer score separated by tabs"
    )
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"_id": "x", "text": "fine"}\n{"_id": "y"\n')
    result = run_cli(
        "eval",
        "-w",
        str(trained_workspace),
        "--queries",
        str(queries),
        "--qrels",
        str(judged_titles / "qrels.tsv"),
        check=False,
    )
    assert result.returncode == 2 and result.stderr.startswith(f"error: {queries}:2: invalid JSON")
    other = tmp_path / "other.tsv"
    other.write_text("nope\tdoc\t1\n")
    result = run_cli(
        "eval",
        "-w",
        str(trained_workspace),
        "--queries",
        str(judged_titles / "queries.jsonl"),
        "--qrels",
        str(other),
        check=False,
    )
    assert result.returncode == 2 and "no query in the qrels file has a text in the queries file" in result.stderr
    result = run_cli("search", "-w", str(trained_workspace), "cells", "--mode", "fuzzy", check=False)
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: --mode: 'fuzzy' is not one of 'dense', 'lexical', 'hybrid'; see `pipeline search --help`"
    )


def test_a_large_collection_is_measured_on_a_sample_of_its_documents(trained_workspace, monkeypatch):
    """Above SAMPLE_DOCUMENTS documents, the default mode is measured on a seeded sample of them (its own BM25
    segment, its documents' vectors), not on every stored vector held in memory at once."""
    from common.embedder import load_embedder
    from common.manifest import read_manifest
    from search import calibrate

    monkeypatch.setattr(calibrate, "SAMPLE_DOCUMENTS", 60)  # of the 120 stored
    ws = Workspace(trained_workspace)
    model = load_embedder(read_manifest(ws).embedder.model_dir(ws))
    result = calibrate.measure_modes(ws, model)
    assert result.collection_documents == 60 and result.documents_measured > 0
    assert all(0.0 <= v <= 1.0 for v in result.ndcg.values()) and all(v >= 0.0 for v in result.ndcg_se.values())
    assert calibrate.measure_modes(ws, model) == result  # the same sample, the same measurement
