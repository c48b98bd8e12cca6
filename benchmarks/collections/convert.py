#!/usr/bin/env python3
"""Convert the public source files into the BEIR-format collections in this folder.

This script documents (and reproduces) the conversion; it downloads nothing.
Pass it the paths of the source files (see README.md for where they come from):

    python convert.py cranfield --docs cran.all.1400 --queries cran.qry \
        --qrels cranqrel --out cranfield
    python convert.py xquad --json xquad.ru.json --out xquad-ru
    python convert.py jsquad --json valid-v1.3.json --out jsquad

Every collection is written in BEIR layout:

    <out>/corpus.jsonl      {"_id": str, "title": str, "text": str} per line
    <out>/queries.jsonl     {"_id": str, "text": str} per line
    <out>/qrels/train.tsv   "query-id<TAB>corpus-id<TAB>score" (header line first)
    <out>/qrels/test.tsv

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
    """Parse a SMART-format file: records start with ".I <id>", fields with
    ".T" (title), ".A" (author), ".B" (bibliography), ".W" (text).  CRLF line
    ends are accepted."""
    records = []
    field = None
    for line in path.read_text(encoding="ascii").replace("\r\n", "\n").split("\n"):
        m = re.match(r"^\.([ITABW])\b ?(.*)$", line)
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


def convert_cranfield(args) -> dict:
    docs = [(r["I"], r.get("T", ""), r.get("W", "")) for r in parse_smart(args.docs)]
    assert [d[0] for d in docs] == [str(i) for i in range(1, len(docs) + 1)]
    # cranqrel numbers the queries by their position in cran.qry (1..225),
    # not by the ".I" numbers (001, 002, 004, 008, ...), so the query id is the
    # sequential position.
    qrecs = parse_smart(args.queries)
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
    for line in args.qrels.read_text(encoding="ascii").split("\n"):
        if not line.strip():
            continue
        qid, did, code = line.split()
        codes[int(code)] += 1
        if 1 <= int(code) <= 4:
            qrels.setdefault(qid, []).append(did)
    counts = write_collection(args.out, docs, queries, qrels)
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


def convert_xquad(args) -> dict:
    data = json.loads(args.json.read_text(encoding="utf-8"))["data"]
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
    return write_collection(args.out, docs, queries, qrels)


# --------------------------------------------------------------------------
# 3. JSQuAD (SQuAD format; context = "<article title> [SEP] <paragraph>")
# --------------------------------------------------------------------------

def convert_jsquad(args) -> dict:
    data = json.loads(args.json.read_text(encoding="utf-8"))["data"]
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
    return write_collection(args.out, docs, queries, qrels)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    c = sub.add_parser("cranfield")
    c.add_argument("--docs", type=Path, required=True, help="cran.all.1400")
    c.add_argument("--queries", type=Path, required=True, help="cran.qry")
    c.add_argument("--qrels", type=Path, required=True, help="cranqrel")
    for name in ("xquad", "jsquad"):
        p = sub.add_parser(name)
        p.add_argument("--json", type=Path, required=True,
                       help="xquad.<lang>.json" if name == "xquad" else "valid-v1.3.json")
    for p in sub.choices.values():
        p.add_argument("--out", type=Path, required=True, help="output folder")
    args = ap.parse_args(argv)
    counts = {"cranfield": convert_cranfield, "xquad": convert_xquad,
              "jsquad": convert_jsquad}[args.kind](args)
    json.dump(counts, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main()
