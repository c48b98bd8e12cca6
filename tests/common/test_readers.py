import json
import zipfile
from pathlib import Path

import duckdb
import pytest

from common.errors import PipelineError
from common.readers import located_documents, read_documents


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
        (
            b'{"_id": "2", "text": "x", "meta": ' + b"[" * 10_000 + b"]" * 10_000 + b"}\n",
            "JSON nested too deeply to read",
        ),
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
    skipped = []  # the caller asks which files were skipped (embed --prune keeps what they stored)
    assert [d.id for d, _ in located_documents([tmp_path], skipped=skipped)] == ["good.txt"]
    assert skipped == [str(tmp_path / "blob.txt"), str(tmp_path / "latin1.txt")]


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


def test_only_regular_files_are_read_a_fifo_or_device_never_blocks(tmp_path, capsys):
    import os

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "fine.txt").write_text("A fine text.\n")
    os.mkfifo(folder / "pipe.txt")  # reading it would block forever
    (folder / "zero.txt").symlink_to("/dev/zero")  # reading it would never end
    docs = list(read_documents([folder]))
    assert [d.title for d in docs] == ["fine"]
    said = capsys.readouterr().err
    assert f"skipping {folder / 'pipe.txt'}: not a regular file" in said and "zero.txt: not a regular file" in said
    for named in (folder / "pipe.txt", folder / "zero.txt"):
        with pytest.raises(PipelineError, match=r"not a regular file \(a FIFO, device or socket\)"):
            list(read_documents([named]))


def test_unreadable_parquet_is_one_clear_error(tmp_path):
    f = tmp_path / "broken.parquet"
    f.write_bytes(b"not a parquet file")
    with pytest.raises(PipelineError, match=r"broken\.parquet: cannot read as parquet"):
        list(read_documents([f]))


# ---------------------------------------------------------------- PDF, HTML, DOCX, built here


def write_pdf(path: Path, pages: list[str | None], title: str | None = None, user_password: str | None = None) -> Path:
    """A PDF of these pages (None: a page with a drawing and no text, as a scan has), written by fpdf2."""
    from fpdf import FPDF

    pdf = FPDF()
    if title:
        pdf.set_title(title)
    for text in pages:
        pdf.add_page()
        if text is None:
            pdf.rect(20, 20, 120, 80, style="F")
        else:
            pdf.set_font("helvetica", size=11)
            pdf.multi_cell(0, 6, text)
    if user_password:
        pdf.set_encryption(owner_password="owner", user_password=user_password)
    pdf.output(str(path))
    return path


BLOG_PAGE = """<!doctype html><html><head><title>Zebra stripes and biting flies | Savanna Notes</title>
<script>window.tracking = {"page": "zebra"};</script><style>nav { float: left }</style></head><body>
<header><a href="/">Savanna Notes</a><nav><ul><li><a href="/">Home</a></li><li><a href="/about">About us</a></li>
<li><a href="/login">Sign in to your account</a></li></ul></nav></header>
<div class="cookie-banner">We use cookies. <button>Accept all cookies</button></div>
<article><h1>Zebra stripes and biting flies</h1>
<p>Field experiments with horses wearing striped coats showed that tabanid flies approached them as often as
uniform coats but failed to land, overshooting or bumping into the stripes.</p>
<p>The stripes seem to disrupt the optic flow that flies use to slow down before landing, which would explain
why zebras living where biting flies are common carry the boldest patterns.</p></article>
<aside><h3>Related posts you may like</h3><ul><li><a href="/giraffes">Why giraffes hum at night</a></li></ul></aside>
<footer><p>Subscribe to our weekly newsletter</p><p>Copyright 2025 Savanna Notes</p></footer></body></html>
"""


def write_docx(path: Path) -> Path:
    import docx

    document = docx.Document()
    document.add_paragraph("Glacier survey", style="Title")
    document.add_heading("Methods", level=1)
    document.add_paragraph("Ablation stakes were drilled into the moraine every spring.")
    document.add_heading("Instruments", level=2)
    document.add_paragraph("a steam drill", style="List Bullet")
    table = document.add_table(rows=2, cols=2)
    for r, row in enumerate([("Stake", "Melt"), ("S1", "2.3 m")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.save(str(path))
    return path


def test_a_pdf_is_one_document_per_page_with_text_with_its_page_number(tmp_path):
    pages = ["Photosynthesis in kelp forests.", None, "Sea otters eat urchins that graze kelp."]
    write_pdf(tmp_path / "ocean.pdf", pages, title="Kelp report")
    docs = list(read_documents([tmp_path]))
    assert [d.id for d in docs] == ["ocean.pdf#page=1", "ocean.pdf#page=3"]  # page 2 has no text
    assert [d.metadata for d in docs] == [{"page": 1, "pages": 3}, {"page": 3, "pages": 3}]
    assert [d.text for d in docs] == [pages[0], pages[2]]
    assert {d.title for d in docs} == {"Kelp report"} and {d.source for d in docs} == {str(tmp_path / "ocean.pdf")}
    write_pdf(tmp_path / "ocean.pdf", ["no title here"])
    assert [d.title for d in read_documents([tmp_path / "ocean.pdf"])] == ["ocean"]  # none in the PDF: the file's


def test_pdf_ligatures_are_read_as_letters(tmp_path):
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.add_font("DejaVu", fname="/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
    pdf.set_font("DejaVu", size=12)
    pdf.cell(0, 10, "\ufb01ndings of the e\ufb00ect")  # ﬁ and ﬀ, as typesetting writes them
    pdf.output(str(tmp_path / "lig.pdf"))
    assert [d.text for d in read_documents([tmp_path])] == ["findings of the effect"]


def test_html_main_text_and_the_pages_title_without_boilerplate(tmp_path):
    (tmp_path / "zebra.html").write_text(BLOG_PAGE)
    (tmp_path / "short.htm").write_text("<html><body><p>Okapi live in the Ituri forest.</p></body></html>")
    docs = {d.id: d for d in read_documents([tmp_path])}
    zebra = docs["zebra.html"]
    assert zebra.title == "Zebra stripes and biting flies" and zebra.source == str(tmp_path / "zebra.html")
    assert "tabanid flies approached them" in zebra.text and "boldest patterns" in zebra.text
    for boilerplate in ("Sign in", "Accept all cookies", "Related posts", "giraffes", "newsletter", "Copyright"):
        assert boilerplate not in zebra.text
    assert docs["short.htm"].text == "Okapi live in the Ituri forest." and docs["short.htm"].title == "short"


def test_docx_paragraphs_tables_and_headings_as_structure(tmp_path):
    write_docx(tmp_path / "survey.docx")
    [doc] = read_documents([tmp_path])
    assert doc.id == "survey.docx" and doc.title == "Glacier survey"
    assert doc.text == (
        "# Glacier survey\n\n# Methods\n\nAblation stakes were drilled into the moraine every spring.\n\n"
        "## Instruments\n\n- a steam drill\n\nStake | Melt\n\nS1 | 2.3 m"
    )


def test_unreadable_documents_are_one_line_warnings_naming_them_and_the_rest_is_read(tmp_path, capfd):
    write_pdf(tmp_path / "good.pdf", ["Lichens grow on bare granite."])
    write_pdf(tmp_path / "locked.pdf", ["secret text"], user_password="pass")
    write_pdf(tmp_path / "scan.pdf", [None, None])
    (tmp_path / "broken.pdf").write_bytes(write_pdf(tmp_path / "x.pdf", ["cut short"]).read_bytes()[:400])
    (tmp_path / "x.pdf").unlink()
    (tmp_path / "broken.docx").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "locked.docx").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600))  # Office encryption
    write_docx(tmp_path / "zipped-not-docx.docx")
    with zipfile.ZipFile(tmp_path / "zipped-not-docx.docx", "w") as z:
        z.writestr("hello.txt", "a zip, not a document")
    (tmp_path / "page.html").write_text(BLOG_PAGE)
    (tmp_path / "nested.html").write_text("<html><body>" + "<div>" * 5000 + "Deep text." + "</div>" * 5000)
    skipped = []
    assert [d.id for d, _ in located_documents([tmp_path], skipped=skipped)] == ["good.pdf#page=1", "page.html"]
    unreadable = [
        "broken.docx", "broken.pdf", "locked.docx", "locked.pdf", "nested.html", "scan.pdf", "zipped-not-docx.docx"
    ]  # fmt: skip
    assert skipped == [str(tmp_path / name) for name in unreadable]
    out, err = capfd.readouterr()  # what the process printed, the libraries' C code too
    assert out == ""
    lines = err.strip().splitlines()
    assert sorted(lines) == [
        f"warning: skipping {tmp_path / 'broken.docx'}: not a readable DOCX (not a zip file: corrupt or truncated)",
        f"warning: skipping {tmp_path / 'broken.pdf'}: not a readable PDF (corrupt or truncated)",
        f"warning: skipping {tmp_path / 'locked.docx'}: encrypted DOCX (password-protected) or an old binary .doc",
        f"warning: skipping {tmp_path / 'locked.pdf'}: encrypted PDF (it needs a password)",
        f"warning: skipping {tmp_path / 'nested.html'}: no text found in the page (none, or markup the HTML parser "
        "could not read)",
        f"warning: skipping {tmp_path / 'scan.pdf'}: no text layer (none of its 2 pages has text: a scan? OCR it"
        " first)",
        lines[6],
    ]
    assert lines[6].startswith(f"warning: skipping {tmp_path / 'zipped-not-docx.docx'}: cannot read as docx (")


def test_pdf_html_and_docx_are_searchable_and_a_hit_names_its_page(trained_workspace, tmp_path):
    """Embed a folder with one file of each kind (and a broken one), then search: each file's words find it,
    a PDF's hit is its page (id, metadata, snippet); the file broken later keeps what was stored of it, with
    --prune too (and a new chunking), until it is deleted."""
    import shutil

    from conftest import run_cli

    ws, data = tmp_path / "ws", tmp_path / "docs"
    shutil.copytree(trained_workspace, ws)
    data.mkdir()
    pages = ["Basalt columns form as lava cools.", "Obsidian is volcanic glass.", "Pumice floats on seawater."]
    write_pdf(data / "rocks.pdf", pages, title="Volcanic rocks")
    (data / "zebra.html").write_text(BLOG_PAGE)
    write_docx(data / "survey.docx")
    (data / "broken.pdf").write_bytes(b"%PDF-1.7 truncated")
    embedded = run_cli("embed", "-w", str(ws), "--data", str(data), "--chunk-tokens", "64", "--overlap", "8")
    assert f"warning: skipping {data / 'broken.pdf'}: not a readable PDF (corrupt or truncated)" in embedded.stderr
    run_cli("index", "-w", str(ws))

    def top(query: str) -> dict:
        result = run_cli("search", "-w", str(ws), query, "-k", "1", "--mode", "lexical", "--json")
        return json.loads(result.stdout.splitlines()[0])

    pumice = top("pumice floats")
    assert pumice["doc_id"] == "rocks.pdf#page=3" and pumice["title"] == "Volcanic rocks"
    assert pumice["metadata"] == {"page": 3, "pages": 3}
    assert pumice["snippet"] == pages[2]
    assert [pumice["snippet"][s:e] for s, e in pumice["highlights"]] == ["Pumice", "floats"]
    assert top("obsidian")["metadata"]["page"] == 2
    zebra = top("tabanid flies stripes")
    assert zebra["doc_id"] == "zebra.html" and zebra["title"] == "Zebra stripes and biting flies"
    assert top("ablation stakes moraine")["doc_id"] == "survey.docx"
    assert "page: 3" in run_cli("search", "-w", str(ws), "pumice", "-k", "1", "--mode", "lexical").stdout
    banner = run_cli("search", "-w", str(ws), "accept cookies", "--mode", "lexical", "--json").stdout
    assert "zebra.html" not in {json.loads(line)["doc_id"] for line in banner.splitlines()}  # boilerplate not stored

    (data / "rocks.pdf").write_bytes(b"%PDF-1.7 overwritten by a failed download")
    again = run_cli("embed", "-w", str(ws), "--data", str(data), "--chunk-tokens", "64", "--overlap", "8")
    assert f"warning: skipping {data / 'rocks.pdf'}: not a readable PDF" in again.stderr
    run_cli("index", "-w", str(ws))
    assert top("pumice floats")["doc_id"] == "rocks.pdf#page=3"  # nothing stored lost

    def stored() -> list[str]:
        with duckdb.connect(str(ws / "pipeline.duckdb"), read_only=True) as con:
            return [row[0] for row in con.execute("SELECT doc_id FROM documents ORDER BY doc_id").fetchall()]

    others = ["survey.docx", "zebra.html"]
    rocks = ["rocks.pdf#page=1", "rocks.pdf#page=2", "rocks.pdf#page=3"]
    kept = (
        "kept 3 stored documents of 1 unreadable file "
        "(--prune removes only documents whose file is gone or no longer holds them)"
    )
    # the workspace's own documents (its pretraining corpus) are pruned, the unreadable file's pages kept; then
    # with a new chunking, which embeds every document again (the kept ones from their stored text)
    for chunk_tokens in ("64", "48"):
        pruned = run_cli(
            "embed", "-w", str(ws), "--data", str(data), "--prune", "--chunk-tokens", chunk_tokens, "--overlap", "8"
        )
        assert kept in pruned.stderr and f"warning: skipping {data / 'rocks.pdf'}" in pruned.stderr
        assert ("stored documents no longer in the source" in pruned.stderr) == (chunk_tokens == "64")
        assert stored() == rocks + others
        run_cli("index", "-w", str(ws))
        assert top("pumice floats")["doc_id"] == "rocks.pdf#page=3"

    (data / "rocks.pdf").unlink()  # gone: --prune removes what it stored
    gone = run_cli("embed", "-w", str(ws), "--data", str(data), "--prune", "--chunk-tokens", "48", "--overlap", "8")
    assert "pruning 3 stored documents no longer in the source" in gone.stderr and "unreadable" not in gone.stderr
    assert stored() == others
    run_cli("index", "-w", str(ws))
    hits = run_cli("search", "-w", str(ws), "pumice floats", "--mode", "lexical", "--json").stdout.splitlines()
    assert not any(json.loads(line)["doc_id"].startswith("rocks.pdf") for line in hits)


def test_metadata_past_its_bounds_is_one_line_naming_the_document(tmp_path):
    from common.readers import MAX_FIELD_NAME_CHARS, MAX_METADATA_BYTES, MAX_METADATA_FIELDS

    cases = [
        (
            {f"f{i}": i for i in range(MAX_METADATA_FIELDS + 1)},
            f"101 metadata fields, more than the {MAX_METADATA_FIELDS}",
        ),
        ({"x" * (MAX_FIELD_NAME_CHARS + 1): 1}, f"longer than {MAX_FIELD_NAME_CHARS} characters"),
        ({"big": "y" * MAX_METADATA_BYTES}, f"more than the {MAX_METADATA_BYTES:,} a document may have"),
    ]
    for metadata, message in cases:
        path = tmp_path / "meta.jsonl"
        path.write_text(
            json.dumps({"_id": "1", "text": "fine"}) + "\n" + json.dumps({"_id": "2", "text": "t", **metadata}) + "\n"
        )
        with pytest.raises(PipelineError, match=r"meta\.jsonl:2: ") as raised:
            list(read_documents([path]))
        assert message in str(raised.value) and "\n" not in str(raised.value)
    path.write_text(json.dumps({"_id": "3", "text": "t", **{f"f{i}": i for i in range(MAX_METADATA_FIELDS)}}) + "\n")
    assert len(next(read_documents([path])).metadata) == MAX_METADATA_FIELDS  # at the bound: kept
