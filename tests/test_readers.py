import json
from pathlib import Path

import duckdb
import pytest

from common.errors import PipelineError
from common.readers import read_documents


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_reads_every_format_with_ids_titles_and_sources(tmp_path):
    (tmp_path / "notes.md").write_text("# Heading here\nbody of the note\n")
    (tmp_path / "plain.txt").write_text("just text\n")
    write_jsonl(tmp_path / "a.jsonl", [{"_id": "j1", "title": "T1", "text": "first"}, {"_id": "j2", "text": "second"}])
    (tmp_path / "b.json").write_text(json.dumps([{"id": "k1", "content": "from json"}]))
    (tmp_path / "c.csv").write_text("doc_id,title,body\nc1,Title C,csv body text\n")
    duckdb.sql(f"COPY (SELECT 'p1' AS id, 'parquet text' AS text) TO '{tmp_path / 'd.parquet'}' (FORMAT parquet)")
    docs = {d.id: d for d in read_documents([tmp_path])}
    assert set(docs) == {"notes.md", "plain.txt", "j1", "j2", "k1", "c1", "p1"}
    assert docs["notes.md"].title == "Heading here" and docs["notes.md"].source == str(tmp_path / "notes.md")
    assert docs["plain.txt"].title == "plain"
    assert docs["j1"].title == "T1" and docs["j1"].text == "first" and docs["j1"].source == str(tmp_path / "a.jsonl")
    assert docs["k1"].text == "from json"
    assert docs["c1"].text == "csv body text" and docs["c1"].title == "Title C"
    assert docs["p1"].text == "parquet text"


def test_text_file_ids_are_relative_to_the_path_given(tmp_path, monkeypatch):
    (tmp_path / "txt" / "sub").mkdir(parents=True)
    (tmp_path / "txt" / "a.md").write_text("alpha\n")
    (tmp_path / "txt" / "sub" / "b.md").write_text("beta\n")
    monkeypatch.chdir(tmp_path)
    relative, absolute = list(read_documents([Path("txt")])), list(read_documents([tmp_path / "txt"]))
    assert [d.id for d in relative] == [d.id for d in absolute] == ["a.md", "sub/b.md"]
    assert (
        [d.source for d in relative]
        == [d.source for d in absolute]
        == [str(tmp_path / "txt" / "a.md"), str(tmp_path / "txt" / "sub" / "b.md")]
    )
    assert [d.id for d in read_documents([Path("txt/sub/b.md")])] == ["b.md"]  # a file given itself: its name
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.md").write_text("another alpha\n")
    with pytest.raises(PipelineError, match=r"other/a\.md: duplicate document id 'a\.md' \(first seen at txt/a\.md\)"):
        list(read_documents([Path("txt"), Path("other")]))


def test_text_field_option_and_unknown_field(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [{"id": "1", "summary": "s", "text": "t"}])
    assert [d.text for d in read_documents([f], text_field="summary")] == ["s"]
    with pytest.raises(PipelineError, match=r"x\.jsonl: no text field 'nope' \(fields: id, summary, text\)"):
        list(read_documents([f], text_field="nope"))


def test_undetectable_text_field_names_the_fields(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [{"id": "1", "words": "w"}])
    with pytest.raises(PipelineError, match=r"x\.jsonl:1: no text field found \(fields: id, words\)"):
        list(read_documents([f]))


def test_a_text_field_that_is_not_a_string_is_refused_naming_file_line_and_field(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [{"id": "1", "text": "fine"}, {"id": "2", "text": 42}])
    with pytest.raises(PipelineError, match=r"x\.jsonl:2: field 'text' holds a number, not text$"):
        list(read_documents([f]))
    write_jsonl(f, [{"id": "1", "body": {"words": "inside"}}])
    with pytest.raises(PipelineError, match=r"x\.jsonl:1: field 'body' holds an object, not text$"):
        list(read_documents([f]))
    g = tmp_path / "y.json"
    g.write_text(json.dumps([{"id": "1", "text": [1, 2]}]))
    with pytest.raises(PipelineError, match=r"y\.json:row 1: field 'text' holds an array, not text$"):
        list(read_documents([g]))


@pytest.mark.parametrize(
    "bad_line, message",
    [
        (b'{"_id": "2", "text": \n', "invalid JSON (Expecting value at column 22)"),
        (b'["not", "an", "object"]\n', "expected a JSON object, got an array"),
        (b'"just text"\n', "expected a JSON object, got a string"),
        (b'{"_id": "2", "text": "caf\xe9"}\n', "not UTF-8 (byte 0xe9 at column 26)"),
    ],
)
def test_every_jsonl_input_reports_a_bad_line_alike(tmp_path, bad_line, message):
    """Documents, eval's queries and tune's labelled pairs go through one JSON-lines reader: a bad line is
    the same one-line error, naming file and line, whichever command reads it."""
    from embed.tune import read_labelled_pairs
    from search.evaluate import read_queries

    path = tmp_path / "input.jsonl"
    path.write_bytes(b'{"_id": "1", "text": "fine", "query": "fine", "document": "fine"}\n\n' + bad_line)
    for read in (
        lambda: list(read_documents([path])),
        lambda: read_queries(path),
        lambda: read_labelled_pairs(path, {}),
    ):
        with pytest.raises(PipelineError) as error:
            read()
        assert str(error.value) == f"{path}:3: {message}"


def test_broken_jsonl_line_is_reported_as_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "1", "text": "ok"}\n{"id": "2", "text": \n')
    with pytest.raises(PipelineError, match=r"bad\.jsonl:2: invalid JSON"):
        list(read_documents([f]))


def test_binary_and_non_utf8_files_are_skipped_with_a_warning(tmp_path, capsys):
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    docs = list(read_documents([tmp_path]))
    assert [Path(d.id).name for d in docs] == ["good.txt"]
    warnings = capsys.readouterr().err
    assert "latin1.txt: not UTF-8 (byte 0xe9 at offset 3)" in warnings
    assert "blob.txt: binary file" in warnings


def test_warnings_print_file_names_verbatim(tmp_path, capsys):
    odd = tmp_path / "odd[" / "x]" / "[red]"  # the path holds "[/x]" and "[red]", which rich would read as markup
    odd.mkdir(parents=True)
    (odd / "good.txt").write_text("fine")
    (odd / "blob.txt").write_bytes(b"\x00binary")
    (odd / ":warning:.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert [d.id for d in read_documents([tmp_path])] == ["odd[/x]/[red]/good.txt"]
    warnings = capsys.readouterr().err
    assert f"warning: skipping {odd / 'blob.txt'}: binary file" in warnings
    assert f"warning: skipping {odd / ':warning:.txt'}: not UTF-8" in warnings


def test_missing_path_empty_corpus_and_duplicates(tmp_path):
    with pytest.raises(PipelineError, match="no such file or directory"):
        list(read_documents([tmp_path / "absent"]))
    (tmp_path / "empty.txt").write_text("   \n")
    with pytest.raises(PipelineError, match="empty corpus"):
        list(read_documents([tmp_path / "empty.txt"]))
    f = write_jsonl(tmp_path / "dup.jsonl", [{"id": "1", "text": "a"}, {"id": "1", "text": "b"}])
    with pytest.raises(
        PipelineError, match=r"dup\.jsonl:2: duplicate document id '1' \(first seen at .*dup\.jsonl:1\)"
    ):
        list(read_documents([f]))


def test_unreadable_parquet_is_one_clear_error(tmp_path):
    f = tmp_path / "broken.parquet"
    f.write_bytes(b"not a parquet file")
    with pytest.raises(PipelineError, match=r"broken\.parquet: cannot read as parquet"):
        list(read_documents([f]))
