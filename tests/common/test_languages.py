"""Collections that are not cased English: Japanese (no spaces), Russian one-sentence documents without
titles, lower-case English whose titles repeat the text. The first two are slices of benchmark collections
(tests/data, with their sources and licence), embedded with the shared workspace's model (its byte-level BPE
reads any text); the third is SciFact written the way Cranfield is."""

import json
import re
import shutil
from pathlib import Path

from common.workspace import Workspace
from conftest import REPO, run_cli, scifact_rows
from search.engine import SearchEngine

TEST_DATA = REPO / "tests" / "data"
SLICES = {"jsquad": "jsquad-60.jsonl", "xquad-ru": "xquad-ru-150.jsonl"}


def collection_slice(name: str, n: int, path: Path) -> Path:
    lines = (TEST_DATA / SLICES[name]).read_text(encoding="utf-8").splitlines()[:n]
    assert len(lines) == n
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def lower_case_as_cranfield(rows: list[dict]) -> list[dict]:
    """Documents as Cranfield's are: all lower-case, full stops set off by spaces, the text beginning with
    the title."""

    def lower(text: str) -> str:
        return re.sub(r"\.(\s|$)", r" .\1", text.lower()).strip()

    return [
        {"_id": row["_id"], "title": lower(row["title"]), "text": f"{lower(row['title'])} {lower(row['text'])}"}
        for row in rows
    ]


def indexed(trained_workspace: Path, tmp_path: Path, name: str, n: int, *index_args: str) -> tuple[Path, list[dict]]:
    data = collection_slice(name, n, tmp_path / f"{name}.jsonl")
    ws = tmp_path / "ws"
    run_cli(
        "embed",
        "-w",
        str(ws),
        "--data",
        str(data),
        "--model",
        str(trained_workspace / "model"),
        "--chunk-tokens",
        "64",
        "--overlap",
        "8",
    )
    run_cli("index", "-w", str(ws), *index_args)
    return ws, [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]


def manifest(ws: Path) -> dict:
    return json.loads((ws / "manifest.json").read_text())


def test_japanese_is_indexed_by_character_bigrams_and_found_by_its_words(trained_workspace, tmp_path):
    ws, rows = indexed(trained_workspace, tmp_path, "jsquad", 60)
    analyzer = manifest(ws)["index"]["analyzer"]
    assert analyzer["language"] == "ja" and analyzer["cjk"] == "bigrams" and analyzer["languages_detected"]["ja"] > 0.9
    engine = SearchEngine(Workspace(ws), load_model=False)
    found = 0
    for row in rows[::6]:
        phrase = row["text"][40:52]  # a stretch of a paragraph, cut anywhere: Japanese has no spaces to cut at
        hit = engine.search(phrase, k=1, mode="lexical")[0]
        found += hit.doc_id == row["_id"]
        assert hit.highlights  # the query's bigrams are marked in the snippet
    assert found >= 8  # of 10; the plain word pattern made each run of Japanese one token and found almost none
    # The default mode was measured on held-out pairs of these unspaced paragraphs, not given up on
    assert manifest(ws)["search"]["pairs"] > 0


def test_russian_sentences_without_titles_are_stemmed_and_measured_on_spans(trained_workspace, tmp_path):
    ws, rows = indexed(trained_workspace, tmp_path, "xquad-ru", 150)
    index = manifest(ws)["index"]
    assert index["analyzer"]["language"] == "ru" and index["analyzer"]["stemmer"] == "russian"
    search = manifest(ws)["search"]  # one sentence a document: the held-out queries are spans of them
    assert search["pairs"] > 0 and "span" in search["pair_kinds"]
    engine = SearchEngine(Workspace(ws), load_model=False)
    hits = engine.search("перехваты", k=3, mode="lexical")  # the documents say "по перехватам": one stem
    texts = {r["_id"]: r["text"] for r in rows}
    assert hits and all("перехват" in texts[h.doc_id].lower() for h in hits)
    # The user's language overrides the detected one, with a full build
    summary = json.loads(run_cli("index", "-w", str(ws), "--language", "none", "--json").stdout)
    assert (
        summary["update"] == "full"
        and summary["analyzer"]["language"] == "none"
        and summary["analyzer"]["stemmer"] is None
    )
    assert (
        run_cli("index", "-w", str(ws), "--language", "russian", check=False)
        .stderr.strip()
        .endswith(
            "--language: 'russian' is not auto (detected), none (no stop words or stemming), "
            "or an ISO 639-1 code (en, de, ru, ja, ...)"
        )
    )


def test_tune_on_one_sentence_documents_trains_on_spans_rather_than_failing(trained_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    data = collection_slice("xquad-ru", 120, tmp_path / "ru.jsonl")
    run_cli("tune", "-w", str(ws), "--data", str(data), "--architecture", "static", "--steps", "4", "--batch-size", "8")
    pairs = manifest(ws)["tuned"]["pairs"]
    assert pairs["language"] == "ru" and pairs["documents_split_into"].get("spans", 0) > 0
    assert pairs["pairs"].get("ict", 0) > 0 and "title" not in pairs["pairs"]  # no titles: sentences' spans instead


def test_lower_case_titles_repeating_the_text_are_not_trained_as_their_own_answer(tmp_path):
    from common.readers import read_documents
    from embed.settings import TuneSettings
    from embed.tune import make_pairs

    n = 80
    data = tmp_path / "lower.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in lower_case_as_cranfield(scifact_rows(n))))
    docs = list(read_documents([data]))
    pairs, report = make_pairs(docs, TuneSettings(steps=20, batch_size=16), [], "en")
    assert report["documents_split_into"].get("sentences", 0) > n // 2  # lower-case text has sentences too
    titled = [
        (anchor, positive) for anchor, positive, source in pairs if anchor == " ".join(docs[source].title.split())
    ]
    assert titled and not any(positive.startswith(anchor) for anchor, positive in titled)
