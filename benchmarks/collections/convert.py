#!/usr/bin/env python3
"""Build the BEIR-format collections of this folder from their public source files.

The corpora are not committed: sources.json names each collection's source files (a GitHub repository, a
commit, the paths and their sha256) and its licence, and this script builds the collections from them:

    python convert.py                      # every collection in sources.json
    python convert.py cranfield npl        # some of them
    python convert.py --sources DIR ...    # the source files are in DIR (by file name): nothing is downloaded

A source file not in --sources is downloaded from raw.githubusercontent.com at the pinned commit. Every
file's sha256 is checked before it is read. Every collection is written in BEIR layout:

    <name>/corpus.jsonl      {"_id": str, "title": str, "text": str} per line
    <name>/queries.jsonl     {"_id": str, "text": str} per line
    <name>/qrels/train.tsv   "query-id<TAB>corpus-id<TAB>score" (header line first)
    <name>/qrels/test.tsv

Queries without any relevant document are dropped.  Queries are split into
train and test by a hash of the query id (see ``split_of``), so every query,
with all its qrels, lands in exactly one half.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import urllib.request
from collections import Counter
from pathlib import Path


# --------------------------------------------------------------------------
# common output
# --------------------------------------------------------------------------

def split_of(query_id: str) -> str:
    """Deterministic train/test split: blake2b-64 of the UTF-8 query id, read
    as a big-endian integer; even -> "train", odd -> "test"."""
    digest = hashlib.blake2b(query_id.encode("utf-8"), digest_size=8).digest()
    return "train" if int.from_bytes(digest, "big") % 2 == 0 else "test"


def write_collection(out: Path, docs, queries, qrels) -> dict:
    """docs: list of (id, title, text); queries: list of (id, text);
    qrels: dict query_id -> list of relevant doc ids (score 1)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    doc_ids = [d[0] for d in docs]
    assert len(set(doc_ids)) == len(doc_ids), "duplicate document ids"
    known = set(doc_ids)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for did, title, text in docs:
            f.write(json.dumps({"_id": did, "title": title, "text": text},
                               ensure_ascii=False) + "\n")
    kept = [(qid, text) for qid, text in queries if qrels.get(qid)]
    dropped = [qid for qid, _ in queries if not qrels.get(qid)]
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in kept:
            f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    counts = {"docs": len(docs), "queries": len(kept), "dropped_queries": dropped}
    files = {s: open(out / "qrels" / f"{s}.tsv", "w", encoding="utf-8")
             for s in ("train", "test")}
    for s, f in files.items():
        f.write("query-id\tcorpus-id\tscore\n")
        counts[f"{s}_queries"] = 0
        counts[f"{s}_qrels"] = 0
    for qid, _ in kept:
        s = split_of(qid)
        counts[f"{s}_queries"] += 1
        for did in sorted(set(qrels[qid]), key=doc_ids.index):
            assert did in known, (qid, did)
            files[s].write(f"{qid}\t{did}\t1\n")
            counts[f"{s}_qrels"] += 1
    for f in files.values():
        f.close()
    return counts


def squash(text: str) -> str:
    """Join lines and collapse runs of white space into one space."""
    return " ".join(text.split())


# --------------------------------------------------------------------------
# 1. Cranfield (SMART format)
# --------------------------------------------------------------------------

def parse_smart(path: Path) -> list[dict]:
    """Parse a SMART-format file: records start with ".I <id>", fields with a
    dot and one capital letter: ".T" (title), ".A" (author), ".B"
    (bibliography), ".W" (text), and in CISI ".X" (citations), ".K", ".C".
    CRLF line ends are accepted."""
    records = []
    field = None
    for line in path.read_text(encoding="ascii").replace("\r\n", "\n").split("\n"):
        m = re.match(r"^\.([A-Z])\b ?(.*)$", line)
        if m and m.group(1) == "I":
            records.append({"I": m.group(2).strip()})
            field = None
        elif m:
            field = m.group(1)
            records[-1].setdefault(field, [])
            if m.group(2).strip():
                records[-1][field].append(m.group(2))
        elif field is not None:
            records[-1][field].append(line)
    return [{k: (v if k == "I" else squash("\n".join(v))) for k, v in r.items()}
            for r in records]


def convert_cranfield(files: dict[str, Path], out: Path) -> dict:
    docs = [(r["I"], r.get("T", ""), r.get("W", "")) for r in parse_smart(files["docs"])]
    assert [d[0] for d in docs] == [str(i) for i in range(1, len(docs) + 1)]
    # cranqrel numbers the queries by their position in cran.qry (1..225),
    # not by the ".I" numbers (001, 002, 004, 008, ...), so the query id is the
    # sequential position.
    qrecs = parse_smart(files["queries"])
    queries = [(str(pos), r["W"]) for pos, r in enumerate(qrecs, start=1)]
    # cranqrel: "<query position> <doc id> <code>".  Codes 1..4 are Cleverdon's
    # relevance grades (1 = complete answer ... 4 = minimum interest; 5 = no
    # interest is never listed; see cranqrel.readme).  Code -1 occurs exactly
    # once per query; it appears to mark the query's *source* document (the
    # paper whose author posed the question: query 1 -> doc 486 "similarity
    # laws for aerothermoelastic testing"), which was not graded.  ir_datasets
    # labels -1 "References of no interest".  Either way it is not counted as
    # relevant here.
    qrels: dict[str, list[str]] = {}
    codes = Counter()
    for line in files["qrels"].read_text(encoding="ascii").split("\n"):
        if not line.strip():
            continue
        qid, did, code = line.split()
        codes[int(code)] += 1
        if 1 <= int(code) <= 4:
            qrels.setdefault(qid, []).append(did)
    counts = write_collection(out, docs, queries, qrels)
    counts["qrel_codes"] = dict(sorted(codes.items()))
    return counts


# --------------------------------------------------------------------------
# 2. XQuAD (SQuAD format) -> one document per sentence
# --------------------------------------------------------------------------

# Abbreviations after which a period does not end a sentence (Russian,
# German, English); single capital letters (initials) are also kept joined.
ABBREVIATIONS = {
    "г", "гг", "т", "е", "др", "им", "ул", "св", "см", "ср", "стр", "рис", "млн",
    "млрд", "тыс", "руб", "проф", "акад", "напр", "ум", "род", "ок", "c",
    "dr", "prof", "nr", "bzw", "ca", "vgl", "usw", "st", "jh", "chr", "mr",
    "mrs", "ms", "vs", "etc", "no",
}

_BOUNDARY = re.compile(r"[.!?…]+[»\"'”)\]]*(\s+)(?=[«\"„“(\[]?[A-ZА-ЯЁÄÖÜ0-9])")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Split ``text`` into sentences; returns (start, end) character offsets
    into ``text`` (white space and byte-order marks trimmed off each span).
    A boundary is end punctuation (optionally followed by closing quotes or
    brackets), then white space, then an upper-case letter, a digit or an
    opening quote, unless the word before the period is an abbreviation or a
    single capital letter (an initial)."""
    cuts = [0]
    for m in _BOUNDARY.finditer(text):
        before = re.search(r"(\w+)\W*$", text[cuts[-1]:m.start() + 1])
        word = before.group(1) if before else ""
        if text[m.start()] == "." and (word.lower() in ABBREVIATIONS
                                        or (len(word) == 1 and word.isupper())):
            continue
        cuts.append(m.start(1))
    cuts.append(len(text))
    spans = []
    for a, b in zip(cuts, cuts[1:]):
        while a < b and (text[a].isspace() or text[a] == "\ufeff"):
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            spans.append((a, b))
    return spans


def convert_xquad(files: dict[str, Path], out: Path) -> dict:
    data = json.loads(files["json"].read_text(encoding="utf-8"))["data"]
    docs, queries, qrels = [], [], {}
    pidx = 0
    for article in data:
        for para in article["paragraphs"]:
            ctx = para["context"]
            spans = sentence_spans(ctx)
            ids = [f"p{pidx}-s{sidx}" for sidx in range(len(spans))]
            docs += [(did, "", ctx[a:b]) for did, (a, b) in zip(ids, spans)]
            for qa in para["qas"]:
                queries.append((qa["id"], qa["question"].strip()))
                rel = []
                for ans in qa["answers"]:
                    start = ans["answer_start"]
                    assert ctx[start:start + len(ans["text"])] == ans["text"]
                    # the sentence containing the answer's first character; an
                    # answer starting in trimmed white space goes to the next
                    hit = next(did for did, (a, b) in zip(ids, spans) if start < b)
                    rel.append(hit)
                qrels[qa["id"]] = rel
            pidx += 1
    return write_collection(out, docs, queries, qrels)


# --------------------------------------------------------------------------
# 3. JSQuAD (SQuAD format; context = "<article title> [SEP] <paragraph>")
# --------------------------------------------------------------------------

def convert_jsquad(files: dict[str, Path], out: Path) -> dict:
    data = json.loads(files["json"].read_text(encoding="utf-8"))["data"]
    docs, queries, qrels = [], [], {}
    for article in data:
        for para in article["paragraphs"]:
            title, sep, text = para["context"].partition(" [SEP] ")
            assert sep and title == article["title"], para["context"][:80]
            # question ids are "a<article>p<paragraph>q<question>"; the
            # paragraph's id is the question id without the "q..." part
            pids = {re.sub(r"q\d+$", "", qa["id"]) for qa in para["qas"]}
            assert len(pids) == 1, pids
            pid = pids.pop()
            docs.append((pid, title.strip(), text.strip()))
            for qa in para["qas"]:
                queries.append((qa["id"], qa["question"].strip()))
                qrels[qa["id"]] = [pid]
    return write_collection(out, docs, queries, qrels)


# --------------------------------------------------------------------------
# 4. CISI (SMART format; long natural-language queries)
# --------------------------------------------------------------------------

def convert_cisi(files: dict[str, Path], out: Path) -> dict:
    docs = [(r["I"], r.get("T", ""), r.get("W", "")) for r in parse_smart(files["docs"])]
    assert [d[0] for d in docs] == [str(i) for i in range(1, len(docs) + 1)]
    # The ".I" numbers of CISI.QRY run 1..112 in order, and CISI.REL uses them.
    qrecs = parse_smart(files["queries"])
    assert [r["I"] for r in qrecs] == [str(i) for i in range(1, len(qrecs) + 1)]
    queries = [(r["I"], r["W"]) for r in qrecs]
    # CISI.REL: "<query> <doc> 0 0.000000" per line; every listed pair is relevant.
    qrels: dict[str, list[str]] = {}
    for line in files["qrels"].read_text(encoding="ascii").split("\n"):
        if line.strip():
            qid, did = line.split()[:2]
            qrels.setdefault(qid, []).append(did)
    return write_collection(out, docs, queries, qrels)


# --------------------------------------------------------------------------
# 5. NPL (Vaswani; "<id>" then text lines then "/"; short keyword queries)
# --------------------------------------------------------------------------

def parse_slash_records(path: Path) -> list[tuple[str, str]]:
    """Records of the NPL files: an id line, text lines, then a line "/"."""
    records = []
    for block in re.split(r"^\s*/\s*$", path.read_text(encoding="ascii"), flags=re.M):
        lines = block.strip().split("\n")
        if lines != [""]:
            records.append((lines[0].strip(), squash("\n".join(lines[1:]))))
    return records


def convert_npl(files: dict[str, Path], out: Path) -> dict:
    docs = [(did, "", text) for did, text in parse_slash_records(files["docs"])]
    # Ids run 1..11429 in order; three numbers (6984 among them) have no record.
    assert [int(d[0]) for d in docs] == sorted({int(d[0]) for d in docs})
    # The documents are lower-case in the source and the queries upper-case
    # (a 1960s convention); the queries are lower-cased to match.
    queries = [(qid, text.lower()) for qid, text in parse_slash_records(files["queries"])]
    # rlv-ass: per query, the relevant document ids, white-space separated.
    qrels = {qid: ids.split() for qid, ids in parse_slash_records(files["qrels"])}
    return write_collection(out, docs, queries, qrels)


# --------------------------------------------------------------------------
# 6. CMRC 2018 (SQuAD format; Chinese questions over Wikipedia paragraphs)
# --------------------------------------------------------------------------

def convert_cmrc2018(files: dict[str, Path], out: Path) -> dict:
    data = json.loads(files["json"].read_text(encoding="utf-8"))["data"]
    docs, queries, qrels = [], [], {}
    for article in data:
        for para in article["paragraphs"]:
            # question ids are "<paragraph id>_QUERY_<n>"
            assert all(qa["id"].startswith(para["id"] + "_QUERY_") for qa in para["qas"])
            docs.append((para["id"], article["title"].strip(), para["context"].strip()))
            for qa in para["qas"]:
                queries.append((qa["id"], qa["question"].strip()))
                qrels[qa["id"]] = [para["id"]]
    return write_collection(out, docs, queries, qrels)


# --------------------------------------------------------------------------
# 7. JaQuAD (Japanese questions over Wikipedia paragraphs; the dev questions
#    against every paragraph of both halves, most of them no question's answer)
# --------------------------------------------------------------------------

def convert_jaquad(files: dict[str, Path], out: Path) -> dict:
    docs, queries, qrels = [], [], {}
    for role in sorted(files):  # dev_0000 ... dev_0003, then train_0000 ... train_0029
        for article in json.loads(files[role].read_text(encoding="utf-8"))["data"]:
            for para in article["paragraphs"]:
                # question ids are "<split>-<article>-<paragraph>-<question>": the paragraph's id is the rest
                pids = {qa["id"].rsplit("-", 1)[0] for qa in para["qas"]}
                assert len(pids) == 1, pids
                pid = pids.pop()
                docs.append((pid, article["title"].strip(), para["context"].strip()))
                if role.startswith("dev_"):
                    for qa in para["qas"]:
                        queries.append((qa["id"], qa["question"].strip()))
                        qrels[qa["id"]] = [pid]
    return write_collection(out, docs, queries, qrels)


CONVERTERS = {
    "cranfield": convert_cranfield,
    "xquad": convert_xquad,
    "jsquad": convert_jsquad,
    "cisi": convert_cisi,
    "npl": convert_npl,
    "cmrc2018": convert_cmrc2018,
    "jaquad": convert_jaquad,
}
HERE = Path(__file__).resolve().parent


def source_file(repo: str, commit: str, path: str, sha256: str, sources: Path | None, cache: Path) -> Path:
    """The source file, from --sources (by file name) or downloaded once into `cache`; its sha256 checked."""
    name = Path(path).name
    local = sources / name if sources else cache / repo.replace("/", "+") / name
    if not local.exists():
        if sources:
            sys.exit(f"convert.py: {local} is missing (from github.com/{repo} at {commit}: {path})")
        local.parent.mkdir(parents=True, exist_ok=True)
        url = f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"
        print(f"downloading {url}", file=sys.stderr)
        urllib.request.urlretrieve(url, local)
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    if digest != sha256:
        sys.exit(f"convert.py: {local}: sha256 {digest}, expected {sha256}")
    return local


def main(argv=None) -> None:
    catalogue = json.loads((HERE / "sources.json").read_text(encoding="utf-8"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"collections to build (default: all of {', '.join(catalogue)})")
    ap.add_argument("--sources", type=Path, help="a folder holding the source files, by file name")
    ap.add_argument("--cache", type=Path, default=HERE / ".sources",
                    help="where downloaded source files are kept (default: .sources here)")
    args = ap.parse_args(argv)
    unknown = [name for name in args.names if name not in catalogue]
    if unknown:
        ap.error(f"no collection {unknown[0]!r} in sources.json")
    for name in args.names or list(catalogue):
        entry = catalogue[name]
        files = {role: source_file(entry["repo"], entry["commit"], path, sha256, args.sources, args.cache)
                 for role, (path, sha256) in entry["files"].items()}
        counts = CONVERTERS[entry["convert"]](files, HERE / name)
        print(json.dumps({name: counts}, ensure_ascii=False))


if __name__ == "__main__":
    main()
