"""Metadata kept from the input files, filters applied during retrieval (every mode, every index type),
and highlighted snippets."""

import json
import shutil

import faiss
import numpy as np
import pyarrow as pa
import pytest

from common.dense.index_types import make_index
from common.readers import read_documents
from common.snapshot.writer import MetadataFields, write_filter_table
from common.store import Store
from common.workspace import Workspace
from conftest import corpus_metadata, ivfpq_with_rescoring, run_cli
from index.build import refresh_indexes
from search.engine import AllowedChunks, DenseIndex, SearchEngine
from search.filters import DocumentFilter, DocumentFilters, FilterError
from search.snippets import make_snippet, snippet_terms

SHARES = {"1%": 1, "10%": 12, "90%": 108}  # documents kept of the 120: `year < 1900 + n` keeps the first n


def years_below(n: int) -> DocumentFilter:
    return DocumentFilter.of({"year": {"lt": 1900 + n}})


@pytest.fixture(scope="module")
def engine(trained_workspace):
    return SearchEngine(Workspace(trained_workspace))


def test_every_extra_field_is_kept_typed_and_returned(engine, corpus_file):
    rows = [json.loads(line) for line in corpus_file.read_text().splitlines()]
    hits = engine.search(rows[5]["title"], k=3, mode="lexical")
    assert hits[0].doc_id == rows[5]["_id"]
    assert hits[0].metadata == {k: v for k, v in rows[5].items() if k not in ("_id", "title", "text")}
    assert corpus_metadata(5).items() <= hits[0].metadata.items()
    assert hits[0].to_dict()["metadata"]["year"] == 1905
    document = engine.document(rows[5]["_id"])
    assert document["metadata"] == hits[0].metadata and document["text"] == rows[5]["text"]
    fields = engine.shards[0].shard.filters.fields
    assert {name: fields[name] for name in ("year", "journal", "open_access", "published", "tags")} == {
        "year": "BIGINT",
        "journal": "VARCHAR",
        "open_access": "BOOLEAN",
        "published": "DATE",
        "tags": "VARCHAR[]",
    }


def test_csv_and_parquet_columns_become_typed_metadata(tmp_path):
    import duckdb

    csv = tmp_path / "papers.csv"
    csv.write_text(
        "id,title,abstract,year,score,journal\np1,First,Some text,2015,0.5,Nature\np2,Second,More text,2019,1.25,Cell\n"
    )
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT 'q1' AS id, 'text here' AS text, DATE '2020-02-29' AS published, [1, 2] AS counts, "
        f"{{'lab': 'x'}} AS origin) TO '{tmp_path / 'more.parquet'}' (FORMAT parquet)"
    )
    con.close()
    docs = {d.id: d for d in read_documents([tmp_path])}
    assert docs["p1"].metadata == {"year": 2015, "score": 0.5, "journal": "Nature"}
    assert docs["q1"].metadata == {"published": "2020-02-29", "counts": [1, 2], "origin": {"lab": "x"}}
    metadata = MetadataFields()
    metadata.add([d.metadata for d in docs.values()])
    documents = pa.table(
        {
            "doc_id": list(docs),
            "title": [""] * 3,
            "source": [""] * 3,
            "metadata": [json.dumps(d.metadata) for d in docs.values()],
        }
    )
    write_filter_table(documents, metadata.column_types(), tmp_path / "filters.duckdb")
    filters = DocumentFilters(tmp_path / "filters.duckdb")
    assert {k: filters.fields[k] for k in ("year", "score", "published", "counts")} == {
        "year": "BIGINT",
        "score": "DOUBLE",
        "published": "DATE",
        "counts": "BIGINT[]",
    }
    assert list(filters.allowed_documents(DocumentFilter.of({"published": {"gte": "2020-01-01"}}))) == [
        list(docs).index("q1")
    ]
    assert len(filters.allowed_documents(DocumentFilter.of(where="score > 1 OR counts[1] = 1"))) == 2


@pytest.fixture(scope="module")
def copied_workspace(trained_workspace, tmp_path_factory) -> Workspace:
    root = tmp_path_factory.mktemp("filters") / "ws"
    shutil.copytree(trained_workspace, root)
    return Workspace(root)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq"])
def test_filters_keep_k_hits_in_every_mode_and_index_type(copied_workspace, kind):
    refresh_indexes(copied_workspace, kind)
    engine = SearchEngine(copied_workspace)
    query = "cells in tumour growth and immune response"
    everything = {mode: engine.search(query, k=1000, mode=mode) for mode in ("dense", "lexical")}
    for share, n in SHARES.items():
        corpus = engine.shards[0].shard.corpus
        allowed = {corpus.doc_id(i) for i in range(corpus.n_documents) if corpus.metadata(i)["year"] < 1900 + n}
        assert len(allowed) == n
        for mode in ("dense", "lexical", "hybrid"):
            hits = engine.search(query, k=10, mode=mode, filters=years_below(n))
            assert {h.doc_id for h in hits} <= allowed and all(h.metadata["year"] < 1900 + n for h in hits), (
                kind,
                share,
                mode,
            )
            matching = (
                min(10, n)
                if mode != "lexical"
                else min(10, len([h for h in everything["lexical"] if h.doc_id in allowed]))
            )
            assert len(hits) == matching, (kind, share, mode)
            if mode != "hybrid" and (
                kind == "flat" or mode == "lexical"
            ):  # exact: the unfiltered ranking's allowed documents
                expected = [h.doc_id for h in everything[mode] if h.doc_id in allowed][:10]
                assert [h.doc_id for h in hits] == expected, (kind, share, mode)


def test_dense_filters_return_k_hits_on_a_large_approximate_index(tmp_path):
    """8,000 vectors, where HNSW's walk (efSearch 64) and IVF-PQ's 16 probed lists of its 224 miss most of a small
    allowed set when filtered naively (IVF-PQ's candidates then re-scored)."""
    rng = np.random.default_rng(0)
    n, dim = 8_000, 32
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(n, dtype=np.int64) * 3  # chunk ids are not positions
    chunk_docs = np.arange(n, dtype=np.int32)  # a document a chunk
    queries = vectors[:5] + 0.2 * rng.standard_normal((5, dim)).astype(np.float32)
    for kind in ("hnsw", "ivfpq"):
        if kind == "hnsw":
            dense = DenseIndex(make_index(kind, vectors, ids), ids)
        else:
            index, rows = ivfpq_with_rescoring(vectors, ids, 224, tmp_path)
            faiss.downcast_index(faiss.downcast_index(index).index).nprobe = 16
            dense = DenseIndex(index, ids, rows, rescore=10)
        for share in (0.01, 0.1, 0.9):
            kept = np.sort(rng.choice(n, int(share * n), replace=False))
            allowed = AllowedChunks(kept, chunk_docs, n)
            for query in queries:
                ((positions, scores),) = dense.search(query[None, :], 40, allowed)
                assert len(positions) == 40 and np.isin(positions, kept).all(), (kind, share)
                assert np.all(np.diff(scores) <= 1e-6)  # best first


def test_structured_filter_errors_name_the_field_and_values_stay_values(engine):
    for structured, message in [
        ({"yeer": {"gte": 1}}, "unknown field 'yeer'"),
        ({"year": {"between": [1, 2]}}, "unknown operator 'between'"),
        ({"year": {"gte": "soon"}}, 'filter.year.gte: expects a number, got "soon"'),
        ({"journal": {"gt": "A"}}, "filter.journal.gt: 'journal' is text"),
        ({"year": {"in": []}}, "expects a non-empty list"),
        ({"published": {"lt": "yesterday"}}, "expects an ISO date"),
    ]:
        with pytest.raises(FilterError, match=message):
            engine.search("cells", k=5, filters=DocumentFilter.of(structured))
    injection = "Nature' OR '1'='1"
    assert engine.search("cells", k=5, mode="lexical", filters=DocumentFilter.of({"journal": injection})) == []
    with pytest.raises(FilterError, match="unknown field"):
        engine.search("cells", k=5, filters=DocumentFilter.of({'journal" = journal OR "year': "x"}))
    nature = engine.search(
        "cells", k=20, mode="dense", filters=DocumentFilter.of({"journal": {"in": ["Nature", "Cell"]}, "tags": "even"})
    )
    assert nature and all(h.metadata["journal"] in ("Nature", "Cell") and "even" in h.metadata["tags"] for h in nature)


def test_where_on_the_command_line(copied_workspace):
    root = str(copied_workspace.root)
    with Store(copied_workspace.db_path, read_only=True) as store:
        before = store.counts()
    hits = [
        json.loads(line)
        for line in run_cli(
            "search",
            "-w",
            root,
            "cells",
            "--json",
            "-k",
            "5",
            "--mode",
            "lexical",
            "--where",
            "year >= 1950 AND journal = 'Cell' AND NOT open_access -- a comment ends at the line's end",
        ).stdout.splitlines()
    ]
    assert len(hits) == 5 and all(h["metadata"]["year"] >= 1950 and h["metadata"]["journal"] == "Cell" for h in hits)
    like = "lower(journal) LIKE 'c%' AND year BETWEEN 1950 AND 2100 AND list_contains(tags, 'even')"
    hits = run_cli("search", "-w", root, "cells", "--json", "-k", "5", "--mode", "lexical", "--where", like).stdout
    assert all(json.loads(line)["metadata"]["journal"] == "Cell" for line in hits.splitlines())
    # an expression over the table's fields, never SQL: statements, set operations, subqueries, table
    # functions and other functions are refused before anything runs
    for where, message in [
        ("yeer > 3", "error: --where: no field 'yeer' (fields: "),
        ("year >", "error: --where: syntax error"),
        ("1=1); DROP TABLE documents; SELECT (1", "error: --where: must be one condition"),
        ("1=1) UNION ALL SELECT 99999999 WHERE (1=1", "error: --where: must be one condition"),
        ("1=0) UNION ALL SELECT -1 WHERE (1=1", "error: --where: must be one condition"),
        ("year > 0) --", "error: --where: syntax error"),
        ("year IN (SELECT 1 FROM read_csv('/etc/passwd'))", "error: --where: subquery not allowed"),
        ("getenv('HOME') = 'x'", "error: --where: function 'getenv' not allowed"),
        ("documents.year > 1", "error: --where: no field 'documents.year'"),
    ]:
        result = run_cli("search", "-w", root, "cells", "--where", where, check=False)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, (where, result.stderr)
        assert result.stderr.startswith(message), (where, result.stderr)
    with Store(copied_workspace.db_path, read_only=True) as store:
        assert store.counts() == before


def test_snippet_is_the_best_matching_passage_with_the_terms_marked():
    filler = "Nothing of interest is said in this sentence at all. " * 8
    text = filler + "Vitamin D deficiency weakens bones; vitamins matter for bone density. " + filler
    snippet, marks = make_snippet(text, snippet_terms("vitamin D and bone density"))
    assert snippet.startswith("… ") and snippet.endswith(" …") and len(snippet) <= 244
    assert [snippet[s:e] for s, e in marks] == ["Vitamin", "bones", "vitamins", "bone", "density"]
    plain, none = make_snippet(text, snippet_terms("zebra"))
    assert none == [] and plain.startswith("Nothing of interest") and plain.endswith(" …")
    short, marks = make_snippet("Tumours grow.", snippet_terms("tumour"))
    assert short == "Tumours grow." and marks == [(0, 7)]


def test_hits_carry_highlights_in_every_mode(engine):
    for mode in ("dense", "lexical", "hybrid"):
        hits = engine.search("tumour cells", k=5, mode=mode)
        assert hits, mode
        for hit in hits:
            assert "<mark>" not in hit.snippet
            for start, end in hit.highlights:
                assert hit.snippet[start:end].lower().startswith(("tumo", "cell")), (mode, hit.snippet[start:end])
        if mode != "dense":
            assert all(hit.highlights for hit in hits)  # lexical hits share a term with the query


def test_eval_within_a_filter(engine, corpus_file):
    from search.evaluate import evaluate

    rows = [json.loads(line) for line in corpus_file.read_text().splitlines()]
    queries = {"early": rows[3]["title"], "late": rows[100]["title"]}
    qrels = {"early": {rows[3]["_id"]: 1}, "late": {rows[100]["_id"]: 1}}
    everything = evaluate(engine, queries, qrels, mode="lexical", depth=10)
    before_1950 = evaluate(engine, queries, qrels, mode="lexical", depth=10, filters=years_below(50))
    assert everything.recall_at_100 == 1.0 and before_1950.recall_at_100 == 0.5  # the late document is filtered out


def test_fields_past_the_filter_limit_are_kept_not_filterable_and_a_wider_table_is_made_anew(
    trained_workspace, tmp_path, monkeypatch
):
    import common.snapshot.writer

    ws = tmp_path / "ws"
    shutil.copytree(trained_workspace, ws)
    # the trained workspace's index holds the corpus's 5 fields (year, journal, open_access, published, tags)
    monkeypatch.setattr(common.snapshot.writer, "MAX_FILTER_FIELDS", 2)
    note = tmp_path / "note.jsonl"
    note.write_text(json.dumps({"_id": "note", "text": "Cells divide.", "year": 2500, "extra": "kept"}) + "\n")
    run_cli("embed", "-w", str(ws), "--data", str(note))
    indexed = run_cli("index", "-w", str(ws))
    assert "field(s) past the first 2 of the collection are stored and shown with results, not filterable" in (
        indexed.stderr
    )
    engine = SearchEngine(Workspace(ws), load_model=False)
    assert set(engine.fields) - {"doc_id", "title", "source"} == {"year", "journal"}  # the first two seen
    with pytest.raises(FilterError, match="no field 'extra'"):
        engine.search("cells", k=5, mode="lexical", filters=DocumentFilter.of(where="extra = 'kept'"))
    hit = engine.search("cells divide", k=20, mode="lexical", filters=DocumentFilter.of(where="year = 2500"))
    assert [h.doc_id for h in hit] == ["note"] and hit[0].metadata["extra"] == "kept"  # stored, shown
