"""Which libraries read PDF, HTML and DOCX (common/readers.py): speed and text quality on files made here.

The files hold SciFact abstracts (real prose, known text), made the ways such files are made:
- PDF: a 20-page report written by fpdf2 (a TrueType font, a running header and footer; the text of each
  page is known, so each page's extraction is compared with its own text), pages of two justified columns
  (fpdf2), and an article printed to PDF by
  Chromium (Skia's PDFs, as browsers and many office tools write them; one section in two CSS columns).
- HTML: pages of four kinds with the same article inside boilerplate: a blog (header, nav, aside of related
  posts, footer, cookie banner, scripts), a documentation page (sidebar of links, <main>), an old page
  laid out with tables and divs named menu/content/footer (no semantic tags), and a page of utility-class
  divs (Tailwind-like: nothing in a tag or a name says which div is boilerplate).
- DOCX: reports written by python-docx (a Title, Heading 1/2 sections, paragraphs, a bulleted list, a table).

Quality: the extracted words against the known words: recall (of the multiset), and order (difflib's ratio
over the word sequences); for HTML, how many boilerplate phrases leaked and whether the title is the page's;
for DOCX, how many headings come out as headings. Speed: best of 3, files or pages a second, and each
library's import time in a new process.

    .venv/bin/pip install pypdf pdfminer.six mammoth selectolax   # the candidates not chosen
    .venv/bin/python benchmarks/bench_readers.py            # -> benchmarks/results/readers.json
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks_common import RESULTS, SCIFACT

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
CHROMIUM = Path("/usr/bin/chromium")


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def quality(truth: str, got: str) -> dict:
    t, g = words(truth), words(got)
    common = sum((Counter(t) & Counter(g)).values())
    return {
        "recall": common / max(len(t), 1),
        "precision": common / max(len(g), 1),
        "order": difflib.SequenceMatcher(None, t, g, autojunk=False).ratio(),
    }


def mean(rows: list[dict]) -> dict:
    return {key: round(sum(r[key] for r in rows) / len(rows), 4) for key in rows[0]}


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def import_seconds(module: str) -> float:
    code = f"import time; s = time.perf_counter(); import {module}; print(time.perf_counter() - s)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout) for _ in range(3)
    ]
    return round(min(runs), 3)


def abstracts(n: int, seed: int = 0) -> list[dict]:
    rows = [json.loads(line) for line in (SCIFACT / "corpus.jsonl").read_text().splitlines()]
    rows = [r for r in rows if 600 < len(r["text"]) < 1800 and r["title"]]
    return random.Random(seed).sample(rows, n)


# ---------------------------------------------------------------- PDF


def make_fpdf_report(path: Path, docs: list[dict]) -> list[str]:
    """One abstract per page under a running header and footer; returns each page's text."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_font("DejaVu", fname=str(FONT))
    pdf.set_auto_page_break(False)
    pages = []
    for number, doc in enumerate(docs, start=1):
        pdf.add_page()
        header, footer = "Quarterly research digest · internal", f"Page {number} of {len(docs)}"
        pdf.set_font("DejaVu", size=8)
        pdf.cell(0, 6, header, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("DejaVu", size=14)
        pdf.multi_cell(0, 7, doc["title"], new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
        pdf.set_font("DejaVu", size=10)
        pdf.multi_cell(0, 5, doc["text"], new_x="LMARGIN", new_y="NEXT")
        pdf.set_y(-15)
        pdf.set_font("DejaVu", size=8)
        pdf.cell(0, 6, footer, align="C")
        pages.append("\n".join([header, doc["title"], doc["text"], footer]))
    pdf.output(str(path))
    return pages


def make_fpdf_columns(path: Path, docs: list[dict]) -> list[str]:
    """Two abstracts a page in two justified columns (fpdf2's text_columns); returns each page's text."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_font("DejaVu", fname=str(FONT))
    pdf.set_font("DejaVu", size=9)
    pages = []
    for left, right in zip(docs[::2], docs[1::2]):
        pdf.add_page()
        with pdf.text_columns(ncols=2, gutter=8, text_align="J", balance=False) as columns:
            for doc in (left, right):
                columns.write(doc["text"])
                columns.new_column()
        pages.append(f"{left['text']}\n{right['text']}")
    pdf.output(str(path))
    return pages


def article_html(docs: list[dict], columns: bool = True) -> str:
    sections = []
    for i, doc in enumerate(docs):
        style = ' style="column-count:2"' if columns and i == len(docs) // 2 else ""
        sections.append(f"<h2>{doc['title']}</h2><p{style}>{doc['text']}</p>")
    return f"<html><body style='font-family:DejaVu Sans'><h1>Collected abstracts</h1>{''.join(sections)}</body></html>"


def make_chromium_pdf(path: Path, docs: list[dict]) -> str:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.set_content(article_html(docs))
        page.pdf(path=str(path), format="A4")
        browser.close()
    return "\n".join(["Collected abstracts"] + [f"{d['title']}\n{d['text']}" for d in docs])


def pdf_pypdf(path: Path) -> list[str]:
    import pypdf

    return [page.extract_text() or "" for page in pypdf.PdfReader(path).pages]


def pdf_pdfminer(path: Path) -> list[str]:
    from pdfminer.high_level import extract_text

    text = extract_text(str(path))
    return text.split("\f")[: text.count("\f")]  # a form feed ends each page


def pdf_pypdfium2(path: Path) -> list[str]:
    import pypdfium2

    pdf = pypdfium2.PdfDocument(path)
    try:
        return [page.get_textpage().get_text_bounded() for page in pdf]
    finally:
        pdf.close()


def bench_pdf(folder: Path) -> dict:
    docs = abstracts(40, seed=1)
    report, article = folder / "report.pdf", folder / "article.pdf"
    report_pages = make_fpdf_report(report, docs[:20])
    columns = folder / "columns.pdf"
    column_pages = make_fpdf_columns(columns, [d for d in docs[:20] if len(d["text"]) < 1300][:10])
    results = {
        "files": {
            "report.pdf": {"pages": 20, "producer": "fpdf2"},
            "columns.pdf": {"pages": len(column_pages), "producer": "fpdf2, two justified columns"},
        }
    }
    article_text = None
    if CHROMIUM.exists():
        article_text = make_chromium_pdf(article, docs[20:])
    readers = {"pypdf": pdf_pypdf, "pdfminer.six": pdf_pdfminer, "pypdfium2": pdf_pypdfium2}
    modules = {"pypdf": "pypdf", "pdfminer.six": "pdfminer.high_level", "pypdfium2": "pypdfium2"}
    for name, read in readers.items():
        pages = read(report)
        row = {
            "report_pages_found": len(pages),
            "report_per_page": mean([quality(t, g) for t, g in zip(report_pages, pages)]),
            "report_seconds": round(best_of(lambda read=read: read(report)), 4),
            "import_seconds": import_seconds(modules[name]),
        }
        row["report_pages_per_second"] = round(20 / row["report_seconds"], 1)
        got = read(columns)
        row["columns_per_page"] = mean([quality(t, g) for t, g in zip(column_pages, got)])
        if article_text is not None:
            got = read(article)
            row["article_pages_found"] = len(got)
            row["article"] = {k: round(v, 4) for k, v in quality(article_text, "\n".join(got)).items()}
            row["article_seconds"] = round(best_of(lambda read=read: read(article)), 4)
        results[name] = row
    if article_text is not None:
        results["files"]["article.pdf"] = {"pages": len(pdf_pypdfium2(article)), "producer": "Chromium (Skia)"}
    return results


# ---------------------------------------------------------------- HTML

BOILERPLATE = [
    "Subscribe to our weekly newsletter",
    "Accept all cookies",
    "Copyright 2025 Example Health Media Group",
    "Privacy policy and terms of service",
    "Related posts you may like",
    "Browse the documentation index",
    "Sign in to your account",
]


def html_pages(doc: dict, related: list[dict]) -> dict[str, str]:
    paragraphs = re.split(r"(?<=[.!?])\s+(?=[A-Z])", doc["text"])
    half = max(1, len(paragraphs) // 2)
    body = "".join(f"<p>{' '.join(paragraphs[i : i + half])}</p>" for i in range(0, len(paragraphs), half))
    links = "".join(f'<li><a href="/{i}">{r["title"]}</a></li>' for i, r in enumerate(related))
    title = doc["title"]
    blog = f"""<!doctype html><html><head><title>{title} | Example Health Blog</title>
<script>window.dataLayer = [{{"event": "pageview"}}];</script><style>body {{ margin: 0 }}</style></head><body>
<header><a href="/">Example Health</a><nav><ul><li><a href="/">Home</a></li><li><a href="/about">About us</a></li>
<li><a href="/login">{BOILERPLATE[6]}</a></li></ul></nav></header>
<div class="cookie-banner">We use cookies to improve your experience. <button>{BOILERPLATE[1]}</button></div>
<article><h1>{title}</h1><p class="byline">By the editors</p>{body}</article>
<aside><h3>{BOILERPLATE[4]}</h3><ul>{links}</ul></aside>
<footer><p>{BOILERPLATE[0]}</p><p>{BOILERPLATE[2]}</p><a href="/privacy">{BOILERPLATE[3]}</a></footer>
<script>console.log("analytics loaded")</script></body></html>"""
    docs = f"""<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head><body>
<div class="sidebar"><p>{BOILERPLATE[5]}</p><ul>{links}</ul></div>
<main><h1>{title}</h1>{body}</main>
<div class="footer">{BOILERPLATE[2]} · <a href="/privacy">{BOILERPLATE[3]}</a></div></body></html>"""
    legacy = f"""<html><head><title>{title}</title></head><body><table width="100%"><tr>
<td id="menu" width="20%"><a href="/">Home</a><br><a href="/login">{BOILERPLATE[6]}</a><br>{links}</td>
<td id="content"><div class="headline">{title}</div>{body}</td></tr>
<tr><td colspan="2" id="footer">{BOILERPLATE[2]}. {BOILERPLATE[0]}.</td></tr></table></body></html>"""
    utility = f"""<!doctype html><html><head><title>{title} - Example Health</title></head><body>
<div class="flex items-center gap-4 px-6"><a href="/">Example Health</a><a href="/">Home</a>
<a href="/about">About us</a><a href="/login">{BOILERPLATE[6]}</a></div>
<div class="grid grid-cols-12"><div class="col-span-3 text-sm"><p>{BOILERPLATE[4]}</p><ul>{links}</ul></div>
<div class="col-span-9 prose"><h1>{title}</h1>{body}</div></div>
<div class="bg-gray-900 text-white p-8"><p>{BOILERPLATE[0]}</p><p>{BOILERPLATE[2]}</p>
<a href="/privacy">{BOILERPLATE[3]}</a></div></body></html>"""
    return {"blog": blog, "docs": docs, "legacy": legacy, "utility classes": utility}


def html_trafilatura(html: str, fast: bool = False, favor_precision: bool = False) -> tuple[str, str]:
    import trafilatura

    found = trafilatura.bare_extraction(
        html, with_metadata=True, include_comments=False, fast=fast, favor_precision=favor_precision
    )
    if found is None:
        return "", ""
    return found.title or "", found.text or ""


BOILERPLATE_TAGS = "script, style, noscript, template, svg, nav, header, footer, aside, form, iframe, button"
BOILERPLATE_NAMES = re.compile(r"nav|menu|footer|sidebar|cookie|banner|share|related|comment|breadcrumb|social", re.I)


def html_selectolax(html: str) -> tuple[str, str]:
    """selectolax with the usual rules: boilerplate tags and elements named like boilerplate removed, then
    <main> or <article> if there is one, else the body."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(html)
    title_node = tree.css_first("title")
    title = title_node.text(strip=True) if title_node else ""
    for node in tree.css(BOILERPLATE_TAGS):
        node.decompose()
    for node in tree.css("[id], [class], [role]"):
        label = " ".join(filter(None, (node.attributes.get(a) for a in ("id", "class", "role"))))
        if BOILERPLATE_NAMES.search(label):
            node.decompose()
    root = tree.css_first("main") or tree.css_first("article") or tree.body
    return title, root.text(separator="\n", strip=True) if root else ""


def bench_html() -> dict:
    docs = abstracts(60, seed=2)
    pages = []  # (kind, html, title, main text)
    for i, doc in enumerate(docs[:20]):
        related = docs[20 + i : 23 + i]
        for kind, html in html_pages(doc, related).items():
            pages.append((kind, html, doc["title"], f"{doc['title']}\n{doc['text']}", related))
    readers = {
        "trafilatura": html_trafilatura,
        "trafilatura fast": lambda html: html_trafilatura(html, fast=True),
        "trafilatura favor_precision": lambda html: html_trafilatura(html, favor_precision=True),
        "selectolax + rules": html_selectolax,
    }
    modules = {
        "trafilatura": "trafilatura",
        "trafilatura fast": "trafilatura",
        "trafilatura favor_precision": "trafilatura",
        "selectolax + rules": "selectolax.lexbor",
    }
    results = {"pages": len(pages), "kinds": ["blog", "docs", "legacy", "utility classes"]}
    for name, read in readers.items():
        by_kind: dict[str, list[dict]] = {}
        for kind, html, title, truth, related in pages:
            got_title, got = read(html)
            normal = " ".join(words(got))
            leaked = [p for p in BOILERPLATE + [r["title"] for r in related] if " ".join(words(p)) in normal]
            row = quality(truth, got)
            row["boilerplate_leaked"] = len(leaked)
            row["title_is_the_pages"] = float(got_title.startswith(title))
            by_kind.setdefault(kind, []).append(row)
        seconds = best_of(lambda read=read: [read(p[1]) for p in pages])
        results[name] = {
            **{kind: mean(rows) for kind, rows in by_kind.items()},
            "pages_per_second": round(len(pages) / seconds, 1),
            "import_seconds": import_seconds(modules[name]),
        }
    return results


# ---------------------------------------------------------------- DOCX


def make_docx(path: Path, docs: list[dict]) -> tuple[str, list[str]]:
    import docx

    document = docx.Document()
    document.add_paragraph("Annual review of findings", style="Title")
    text, headings = ["Annual review of findings"], []
    for i, doc in enumerate(docs):
        level = 1 if i % 2 == 0 else 2
        document.add_heading(doc["title"], level=level)
        headings.append(doc["title"])
        sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z])", doc["text"])
        for sentence in sentences[:-2]:
            document.add_paragraph(sentence)
        for sentence in sentences[-2:]:
            document.add_paragraph(sentence, style="List Bullet")
        text += [doc["title"]] + sentences
    table = document.add_table(rows=2, cols=2)
    cells = [("Cohort", "Participants"), ("Neonatal imaging", "seventeen infants")]
    for r, row in enumerate(cells):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
            text.append(value)
    document.save(str(path))
    return "\n".join(text), headings


def docx_python_docx(path: Path) -> tuple[str, list[str]]:
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    document = docx.Document(str(path))
    lines, headings = [], []
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            style = block.style.name if block.style is not None else ""
            if style.startswith("Heading"):
                headings.append(block.text)
            lines.append(block.text)
        elif isinstance(block, Table):
            lines.extend(cell.text for row in block.rows for cell in row.cells)
    return "\n".join(lines), headings


def docx_mammoth(path: Path) -> tuple[str, list[str]]:
    import mammoth

    with open(path, "rb") as f:
        markdown = mammoth.convert_to_markdown(f).value
    headings = [line.lstrip("#").strip() for line in markdown.splitlines() if line.startswith("#")]
    headings = [re.sub(r"\\(.)", r"\1", h) for h in headings]
    return markdown, headings


def bench_docx(folder: Path) -> dict:
    docs = abstracts(60, seed=3)
    files = []
    for i in range(10):
        path = folder / f"review-{i}.docx"
        files.append((path, *make_docx(path, docs[i * 6 : i * 6 + 6])))
    readers = {"python-docx": docx_python_docx, "mammoth": docx_mammoth}
    modules = {"python-docx": "docx", "mammoth": "mammoth"}
    results = {"files": len(files)}
    for name, read in readers.items():
        rows = []
        for path, truth, headings in files:
            got, got_headings = read(path)
            row = quality(truth, got)
            row["headings_found"] = len(set(got_headings) & set(headings)) / len(headings)
            rows.append(row)
        seconds = best_of(lambda read=read: [read(f[0]) for f in files])
        results[name] = {
            **mean(rows),
            "files_per_second": round(len(files) / seconds, 1),
            "import_seconds": import_seconds(modules[name]),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / "readers.json")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)  # the libraries' own notices; quality is what is measured here
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        results = {"pdf": bench_pdf(folder), "html": bench_html(), "docx": bench_docx(folder)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    out = io.StringIO()
    json.dump(results, out, indent=1)
    print(out.getvalue())
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
