"""Read user documents from files and directories: .txt/.md, .jsonl, .json, .csv, .parquet, .pdf,
.html/.htm, .docx.

Every document keeps an id, a title, the path it came from (absolute), its text and its metadata: every
other field of a structured row (JSONL keys, CSV/Parquet/JSON columns), with the type the reader gave it
(JSON's types; a date or timestamp becomes its ISO text, a decimal a number). A .txt/.md file's
id is its path relative to the --data directory given (its name when the file itself is given), so the
same file gets the same id however the directory is typed. Structured formats (.json, .csv, .parquet)
go through DuckDB's readers; .jsonl is parsed line by line so that a broken line is reported as file:line.

Documents people have (benchmarks/bench_readers.py chose the libraries by speed and text quality on files it
makes; each is imported only when a folder holds such a file):
- .pdf (pypdfium2, Google's PDFium): one document per page with text, id `NAME#page=N` (how PDF viewers
  open a page), metadata {"page": N, "pages": total}, title the PDF's own or the file name. A page per
  document is what makes the page number true of every hit with no other machinery: its chunks, snippet
  and highlights are that page's text, the page is in its metadata (shown with every hit, filterable:
  --where "page <= 3"), and the store, the index and search stay as they are. Ligatures (ﬁ, ﬀ) are
  written out as letters, so "find" matches "ﬁnd".
- .html/.htm (trafilatura, favouring precision): the page's main text, boilerplate (navigation, sidebars,
  footers, cookie banners, scripts) removed; the title is the page's own (its <title>, without a site
  name), else the file name. A page trafilatura finds no main text in gives all its visible text.
- .docx (python-docx): body paragraphs and tables in document order; headings kept as structure, written
  as Markdown headings as in a .md file (Title and Heading 1 `# ...`, Heading 2 `## ...`), list items as
  `- ...`, table rows as cells joined by ` | `. The title is the document's own (its properties, else its
  Title paragraph, else its first heading), else the file name.
A file such a reader cannot read (a PDF without a text layer, an encrypted or corrupt file) is skipped with
a one-line warning naming it, and the rest of the folder is read; the caller can ask for the skipped files
(`skipped`): what is stored of them is kept, by `embed --prune` too (it removes only the documents of files
gone or no longer holding them). The libraries' own warnings and log lines never reach the user.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import hashlib
import json
import logging
import math
import os
import re
import warnings
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator

import duckdb

from common.console import warn
from common.errors import PipelineError

TEXT_SUFFIXES = {".txt", ".md"}
STRUCTURED_SUFFIXES = {".jsonl", ".json", ".csv", ".parquet"}
DOCUMENT_SUFFIXES = {".pdf", ".html", ".htm", ".docx"}  # one document per file (per page for a PDF)
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | STRUCTURED_SUFFIXES | DOCUMENT_SUFFIXES

# Field names tried in order when the user gives none.
TEXT_FIELDS = ("text", "content", "body", "contents", "abstract", "passage", "document")
ID_FIELDS = ("_id", "id", "doc_id", "docid", "uuid")
TITLE_FIELDS = ("title", "name", "heading", "subject")


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    source: str
    text: str
    metadata: dict = field(default_factory=dict)


# A document's metadata, bounded as Elasticsearch bounds a mapping: fields a document may have, the length of
# a field's name, and the size of all its values as JSON. (The collection's filterable fields are bounded
# where the filter table is made: common/snapshot/writer.py's MAX_FILTER_FIELDS.)
MAX_METADATA_FIELDS = 100
MAX_FIELD_NAME_CHARS = 256
MAX_METADATA_BYTES = 64 * 1024


def check_metadata(metadata: dict, where: str) -> None:
    """A PipelineError naming `where` and the limit when a document's metadata is past one of them."""
    if len(metadata) > MAX_METADATA_FIELDS:
        raise PipelineError(
            f"{where}: {len(metadata):,} metadata fields, more than the {MAX_METADATA_FIELDS} a document may have"
        )
    for name in metadata:
        if not name.strip() or len(name) > MAX_FIELD_NAME_CHARS:
            shown = name[:40] + ("..." if len(name) > 40 else "")
            raise PipelineError(
                f"{where}: metadata field name {shown!r} is empty or longer than {MAX_FIELD_NAME_CHARS} characters"
            )
    size = len(json.dumps(metadata, ensure_ascii=False, default=str).encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        raise PipelineError(
            f"{where}: metadata of {size:,} bytes as JSON, more than the {MAX_METADATA_BYTES:,} a document may have"
        )


@dataclass
class JsonLinesRead:
    """How far a JSON-lines file has been read: its first `offset` bytes, `lines` lines, the SHA-256 of
    those bytes, and (for a read resumed from an earlier run's) how many documents those lines gave.
    located_documents starts a file there and carries it on to the end, so a caller can keep it and next
    time read only what was appended (embed/appended.py)."""

    offset: int = 0
    lines: int = 0
    digest: "hashlib._Hash" = field(default_factory=hashlib.sha256)
    documents: int = 0
    ends_with_newline: bool = True  # False: the last line may still be growing

    def advance(self, raw: bytes, line_no: int) -> None:
        """Carry the read on over one more line (its raw bytes)."""
        self.offset += len(raw)
        self.lines = line_no
        self.digest.update(raw)
        self.ends_with_newline = raw.endswith(b"\n")

    def copy(self) -> "JsonLinesRead":
        """The same point, carried on apart from this one."""
        return replace(self, digest=self.digest.copy())


def list_files(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """Expand directories (recursively, sorted, hidden files skipped) into supported files, each with its
    name relative to the path given: its path inside a directory, its file name for a file. Only regular
    files are read: a FIFO or a device (e.g. /dev/zero behind a link named zero.txt) would block or never
    end; one inside a directory is skipped with a warning, one named on its own is an error."""
    files: list[tuple[Path, str]] = []
    for path in paths:
        if not path.exists():
            raise PipelineError(f"{path}: no such file or directory")
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if not p.is_dir()
                and p.suffix.lower() in SUPPORTED_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            for p in found:
                if p.is_file():
                    files.append((p, p.relative_to(path).as_posix()))
                else:
                    warn(f"skipping {p}: not a regular file (a FIFO, device or socket)")
        elif not path.is_file():
            raise PipelineError(f"{path}: not a regular file (a FIFO, device or socket): give a file or a folder")
        elif path.suffix.lower() in SUPPORTED_SUFFIXES:
            files.append((path, path.name))
        else:
            raise PipelineError(
                f"{path}: unsupported file type '{path.suffix}' (supported: {', '.join(sorted(SUPPORTED_SUFFIXES))})"
            )
    return files


def read_documents(paths: Iterable[Path], text_field: str | None = None, streamed: bool = False) -> Iterator[Document]:
    """Yield every non-empty document under `paths`, one at a time. Raises PipelineError if none is found,
    or for an id seen twice: at once, from a dict of the ids seen; or, `streamed` (pretraining reads
    gigabytes and keys nothing by id), once all are read, from 8 bytes a document (a hash of each id), the
    repeat then found by a second read to name both places. (embed checks in its store: embed/survey.py.)"""
    if streamed:
        yield from _ids_checked_at_end(paths, text_field)
        return
    seen: dict[str, str] = {}
    for doc, where in located_documents(paths, text_field):
        if doc.id in seen:
            raise duplicate_id_error(doc.id, where, seen[doc.id])
        seen[doc.id] = where
        yield doc


def _ids_checked_at_end(paths: Iterable[Path], text_field: str | None) -> Iterator[Document]:
    import numpy as np

    paths = list(paths)
    hashes, chunk = [], []
    for doc, _ in located_documents(paths, text_field):
        chunk.append(int.from_bytes(hashlib.blake2b(doc.id.encode(), digest_size=8).digest(), "little"))
        if len(chunk) == 65_536:
            hashes.append(np.array(chunk, np.uint64))
            chunk = []
        yield doc
    ordered = np.sort(np.concatenate([*hashes, np.array(chunk, np.uint64)]))
    if len(ordered) > 1 and (ordered[1:] == ordered[:-1]).any():
        # a repeated hash: the checked read raises at the repeated id (a collision reads through, no error)
        for _ in read_documents(paths, text_field):
            pass


def duplicate_id_error(doc_id: str, where: str, first_where: str) -> PipelineError:
    return PipelineError(f"{where}: duplicate document id '{doc_id}' (first seen at {first_where})")


def located_documents(
    paths: Iterable[Path],
    text_field: str | None = None,
    json_lines: dict[str, JsonLinesRead] | None = None,
    skipped: list[str] | None = None,
) -> Iterator[tuple[Document, str]]:
    """Every non-empty document under `paths`, one at a time, with where it is (file:line, file:row, the
    file). Raises PipelineError if none is found. Ids are not checked for duplicates (read_documents).

    json_lines (absolute path -> JsonLinesRead): where to start each JSON-lines file it names (the
    documents before that point count as read for the empty-corpus check); it is filled in for every
    JSON-lines file as read to its end. skipped: the absolute path of every file skipped as unreadable
    (with its warning) is appended to it."""
    paths = [Path(p) for p in paths]
    files = list_files(paths)
    if not files:
        raise PipelineError(
            f"no supported files ({', '.join(sorted(SUPPORTED_SUFFIXES))}) under {', '.join(map(str, paths))}"
        )
    count = 0
    for file, name in files:
        read = None
        if json_lines is not None and file.suffix.lower() == ".jsonl":
            read = json_lines.setdefault(os.path.abspath(file), JsonLinesRead())
            count += read.documents  # read before: counted
        for located in read_file(file, name, text_field, read, skipped):
            count += 1
            yield located
    if count == 0:
        raise PipelineError(f"empty corpus: no document with text under {', '.join(map(str, paths))}")


def read_file(
    file: Path,
    name: str,
    text_field: str | None = None,
    read: JsonLinesRead | None = None,
    skipped: list[str] | None = None,
) -> Iterator[tuple[Document, str]]:
    """The documents of one supported file, each with where it is (file:line, file:row); `name` is the file's
    name as list_files gives it (a text file's id), `read` where a JSON-lines file starts, `skipped` where to
    append the file's absolute path if it is skipped as unreadable (located_documents)."""
    suffix = file.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _read_text_file(file, name, skipped)
    if suffix in DOCUMENT_SUFFIXES:
        return _read_document_file(file, name, skipped)
    if suffix == ".jsonl":
        return _read_jsonl(file, text_field, read)
    return _read_with_duckdb(file, text_field)


def _skip(file: Path, why: str, skipped: list[str] | None) -> None:
    """Skip a file that cannot be read: a one-line warning, and its absolute path in `skipped` if given."""
    warn(f"skipping {file}: {why}")
    if skipped is not None:
        skipped.append(os.path.abspath(file))


def _read_text_file(file: Path, doc_id: str, skipped: list[str] | None = None) -> Iterator[tuple[Document, str]]:
    with open(file, "rb") as f:  # the binary check on the first bytes, before reading the rest
        raw = f.read(8192)
        if b"\x00" in raw:
            _skip(file, "binary file", skipped)
            return
        raw += f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _skip(file, f"not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})", skipped)
        return
    if not text.strip():
        return
    first_line = text.lstrip().splitlines()[0]
    title = first_line.lstrip("# ").strip() if first_line.startswith("#") else file.stem
    yield Document(id=doc_id, title=title, source=os.path.abspath(file), text=text), str(file)


def _pick_field(
    fields: list[str], wanted: str | None, candidates: tuple[str, ...], file: Path, what: str
) -> str | None:
    if wanted is not None:
        if wanted not in fields:
            raise PipelineError(f"{file}: no {what} field '{wanted}' (fields: {', '.join(fields)})")
        return wanted
    lower = {f.lower(): f for f in fields}
    return next((lower[c] for c in candidates if c in lower), None)


@functools.lru_cache(maxsize=256)
def _field_roles(
    fields: tuple[str, ...], text_field: str | None, file: Path
) -> tuple[str | None, str | None, str | None, str]:
    """The text, id and title fields among a row's fields, and the file's absolute path: the same for most
    rows of a file, so worked out once (per row it was half of reading 100,000 JSONL documents)."""
    return (
        _pick_field(list(fields), text_field, TEXT_FIELDS, file, "text"),
        _pick_field(list(fields), None, ID_FIELDS, file, "id"),
        _pick_field(list(fields), None, TITLE_FIELDS, file, "title"),
        os.path.abspath(file),
    )


def _row_to_document(row: dict, file: Path, where: str, fallback_id: str, text_field: str | None) -> Document | None:
    text_key, id_key, title_key, source = _field_roles(tuple(row), text_field, file)
    if text_key is None:
        raise PipelineError(f"{where}: no text field found (fields: {', '.join(row)}); choose one with --text-field")
    text = row.get(text_key)
    if text is not None and not isinstance(text, str):
        raise PipelineError(f"{where}: field '{text_key}' holds {_kind(text)}, not text")
    if text is None or not text.strip():
        return None
    doc_id = str(row[id_key]) if id_key and row.get(id_key) is not None else fallback_id
    title = str(row[title_key]) if title_key and row.get(title_key) is not None else ""
    metadata = {key: json_value(value) for key, value in row.items() if key not in (text_key, id_key, title_key)}
    metadata = {key: value for key, value in metadata.items() if value is not None}  # a missing value is no field
    check_metadata(metadata, where)
    return Document(id=doc_id, title=title, source=source, text=text, metadata=metadata)


def json_value(value):
    """A reader's value as JSON keeps it: dates and timestamps as ISO text, decimals as numbers, a
    float that is not a number as missing (None), lists and objects item by item."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # e.g. an interval: kept as DuckDB writes it


def _kind(value: object) -> str:
    """What a value is, in JSON's words where it has them."""
    names = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        dict: "an object",
        list: "an array",
        str: "a string",
        type(None): "null",
    }
    return names.get(type(value), f"a value of type {type(value).__name__}")


def read_json_lines(path: Path, read: JsonLinesRead | None = None) -> Iterator[tuple[int, dict]]:
    """Each non-blank line of a JSON-lines file as (line number, object): the one reader of every `.jsonl`
    input (documents, eval's queries, tune's labelled pairs). A line that is not UTF-8, not JSON or not a
    JSON object is an error naming file:line. With `read`, from where it says, and carried on to each
    line's end (hashing the lines read: 0.1 of 0.5 s for 100,000 lines, so only when asked)."""
    with open(path, "rb") as f:
        if read is not None:
            f.seek(read.offset)
        for line_no, raw in enumerate(f, start=1 if read is None else read.lines + 1):
            if read is not None:
                read.advance(raw, line_no)
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PipelineError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:  # without its line ending, so an error at its end is in its columns
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise PipelineError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            except RecursionError:  # the parser recurses once per level of nesting
                raise PipelineError(f"{where}: JSON nested too deeply to read") from None
            if not isinstance(row, dict):
                raise PipelineError(f"{where}: expected a JSON object, got {_kind(row)}")
            yield line_no, row


def _read_jsonl(file: Path, text_field: str | None, read: JsonLinesRead | None) -> Iterator[tuple[Document, str]]:
    for line_no, row in read_json_lines(file, read):
        where = f"{file}:{line_no}"
        doc = _row_to_document(row, file, where, f"{file.name}:{line_no}", text_field)
        if doc is not None:
            yield doc, where


_DUCKDB_READERS = {".json": "read_json_auto", ".csv": "read_csv_auto", ".parquet": "read_parquet"}
DUCKDB_ROWS = 10_000  # rows fetched at a time: a file of gigabytes is never held whole


def _read_with_duckdb(file: Path, text_field: str | None) -> Iterator[tuple[Document, str]]:
    reader = _DUCKDB_READERS[file.suffix.lower()]
    con = duckdb.connect()
    try:
        # The table function is chosen from a fixed list above; the path is a bound parameter.
        result = con.execute(f"SELECT * FROM {reader}($path)", {"path": str(file)})
        fields = [d[0] for d in result.description]
        row_no = 0
        while rows := result.fetchmany(DUCKDB_ROWS):
            for values in rows:
                row_no += 1
                where = f"{file}:row {row_no}"
                doc = _row_to_document(dict(zip(fields, values)), file, where, f"{file.name}:{row_no}", text_field)
                if doc is not None:
                    yield doc, where
    except duckdb.Error as e:
        first_line = str(e).strip().splitlines()[0]
        raise PipelineError(f"{file}: cannot read as {file.suffix.lstrip('.')} ({first_line})") from None
    finally:
        con.close()


# ---------------------------------------------------------------- PDF, HTML, DOCX

# The libraries these readers use log through `logging` (with no handler configured, Python prints a
# logger's warnings to stderr) and warn through `warnings`: silenced, the skip warning says what matters.
_LIBRARY_LOGGERS = ("trafilatura", "htmldate", "courlan", "justext", "pypdfium2", "docx")
_LIGATURES = str.maketrans(
    {"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl", "\ufb05": "st", "\ufb06": "st"}
)


class _Unreadable(Exception):
    """A file a document reader cannot read: the reason, for the warning that skips it."""


def _read_document_file(file: Path, name: str, skipped: list[str] | None = None) -> Iterator[tuple[Document, str]]:
    """A PDF's pages, or an HTML or DOCX file's one document; a file that cannot be read is skipped with a
    one-line warning naming it (the error's first line), and reading goes on."""
    for logger in _LIBRARY_LOGGERS:
        logging.getLogger(logger).setLevel(logging.CRITICAL + 1)
    suffix = file.suffix.lower()
    reader = _read_pdf if suffix == ".pdf" else _read_docx if suffix == ".docx" else _read_html
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            documents = list(reader(file, name))  # a file at a time: a failure half-way stores nothing of it
    except _Unreadable as e:
        _skip(file, str(e), skipped)
        return
    except Exception as e:  # whatever a library raises on a malformed file: the file is skipped, not the run
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        _skip(file, f"cannot read as {suffix.lstrip('.')} ({first_line})", skipped)
        return
    yield from documents


def _clean(text: str) -> str:
    """Text as extracted, for search: ligatures as letters, line ends as \\n, no NUL, trimmed."""
    return text.translate(_LIGATURES).replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "").strip()


def _read_pdf(file: Path, name: str) -> Iterator[tuple[Document, str]]:
    import pypdfium2
    import pypdfium2.raw as pdfium_c

    try:
        pdf = pypdfium2.PdfDocument(str(file))
    except pypdfium2.PdfiumError as e:
        code = getattr(e, "err_code", None)
        if code == pdfium_c.FPDF_ERR_PASSWORD:
            raise _Unreadable("encrypted PDF (it needs a password)") from None
        if code == pdfium_c.FPDF_ERR_SECURITY:
            raise _Unreadable("encrypted PDF (an unsupported security handler)") from None
        raise _Unreadable("not a readable PDF (corrupt or truncated)") from None
    try:
        pages = len(pdf)
        title = " ".join((pdf.get_metadata_dict().get("Title") or "").split()) or file.stem
        source = os.path.abspath(file)
        found = 0
        for number in range(1, pages + 1):
            page = pdf[number - 1]
            try:
                textpage = page.get_textpage()
                text = _clean(textpage.get_text_bounded())
                textpage.close()
            finally:
                page.close()
            if text:
                found += 1
                metadata = {"page": number, "pages": pages}
                document = Document(
                    id=f"{name}#page={number}", title=title, source=source, text=text, metadata=metadata
                )
                yield document, f"{file}:page {number}"
    finally:
        pdf.close()
    if found == 0:
        raise _Unreadable(
            f"no text layer (none of its {pages} page{'s' if pages != 1 else ''} has text: a scan? OCR it first)"
        )


def _read_html(file: Path, name: str) -> Iterator[tuple[Document, str]]:
    import trafilatura

    raw = file.read_bytes()
    found = trafilatura.bare_extraction(raw, with_metadata=True, include_comments=False, favor_precision=True)
    text = _clean(found.text or "") if found is not None else ""
    if not text:  # no main text found: all the page's visible text rather than nothing
        text = _clean(trafilatura.html2txt(raw) or "")
    if not text and raw.strip():  # e.g. markup nested deeper than the parser goes: said, not dropped unseen
        raise _Unreadable("no text found in the page (none, or markup the HTML parser could not read)")
    if not text:
        return
    title = " ".join((found.title or "").split()) if found is not None else ""
    yield Document(id=name, title=title or file.stem, source=os.path.abspath(file), text=text), str(file)


_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # a password-protected Office file (or an old .doc)
_HEADING_STYLE = re.compile(r"Heading (\d)")


def _read_docx(file: Path, name: str) -> Iterator[tuple[Document, str]]:
    with open(file, "rb") as f:
        head = f.read(8)
    if head == _OLE_MAGIC:
        raise _Unreadable("encrypted DOCX (password-protected) or an old binary .doc")
    if not zipfile.is_zipfile(file):
        raise _Unreadable("not a readable DOCX (not a zip file: corrupt or truncated)")
    import docx
    from docx.table import Table

    document = docx.Document(str(file))
    lines, title = [], " ".join((document.core_properties.title or "").split())
    first_heading = ""
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            for row in block.rows:
                cells = [" ".join(cell.text.split()) for cell in row.cells]
                if any(cells):
                    lines.append(" | ".join(cells))
            continue
        text = " ".join(block.text.split())
        if not text:
            continue
        style = block.style.name if block.style is not None else ""
        level = _HEADING_STYLE.fullmatch(style)
        if style == "Title":
            title = title or text
            lines.append(f"# {text}")
        elif level:
            first_heading = first_heading or text
            lines.append(f"{'#' * int(level.group(1))} {text}")
        elif style.startswith("List"):
            lines.append(f"- {text}")
        else:
            lines.append(text)
    text = _clean("\n\n".join(lines))
    if text:
        title = title or first_heading or file.stem
        yield Document(id=name, title=title, source=os.path.abspath(file), text=text), str(file)
