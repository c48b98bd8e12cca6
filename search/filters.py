"""Which documents a search may return: filters over the documents' metadata, source, title and id.

The documents' fields are loaded once per index generation into an in-memory DuckDB table, `documents`,
one typed column per field (BIGINT, DOUBLE, BOOLEAN, DATE, TIMESTAMP, VARCHAR or a list of them; a
field whose values disagree on a type is VARCHAR holding their JSON), plus `doc_id`, `title` and
`source`. A metadata field named like one of those three (DuckDB's names ignore case) stays in the
document's metadata but is not a column. Two ways to filter:

- `where`: the CLI's DuckDB SQL over those columns (`year >= 2015 AND journal = 'Nature'`). It is the
  user's own shell, but it still cannot change anything: it runs against the in-memory copy (the store
  is not attached), as one SELECT statement, with external access (files, ATTACH) switched off.
- `structured`: the API's {"field": {"operator": value}} (Qdrant/Chroma style), compiled to SQL in which
  every value is a bound parameter and every column name is one of the table's own; an unknown field,
  operator or a value of the wrong type is a FilterError naming it.

The result is the set of allowed documents' positions, cached per filter (an app asks with the same
filters again and again).
"""

from __future__ import annotations

import datetime
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock

import duckdb
import numpy as np
import pyarrow as pa

from common.errors import PipelineError
from common.store import Corpus

BUILT_IN = ("doc_id", "title", "source")
OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "glob", "contains")
COMPARISONS = {"eq": "=", "ne": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
CACHED_FILTERS = 256


class FilterError(PipelineError):
    """A filter that cannot be run as asked: the API answers 422."""


@dataclass(frozen=True)
class DocumentFilter:
    structured: str | None = None  # the structured filter as canonical JSON text (hashable, a cache key)
    where: str | None = None

    @classmethod
    def of(cls, structured: dict | None = None, where: str | None = None) -> "DocumentFilter | None":
        if not structured and not (where or "").strip():
            return None
        return cls(json.dumps(structured, sort_keys=True) if structured else None, (where or "").strip() or None)


def _typed_column(values: list) -> tuple[pa.Array, str]:
    """One metadata field's values (None where a document lacks it) as a typed Arrow array and its DuckDB type."""
    present = [v for v in values if v is not None]
    kinds = {type(v) for v in present}
    if kinds <= {bool}:
        return pa.array(values, pa.bool_()), "BOOLEAN"
    if kinds <= {int}:
        if all(-(2**63) <= v < 2**63 for v in present):
            return pa.array(values, pa.int64()), "BIGINT"
    if kinds <= {int, float}:
        return pa.array([None if v is None else float(v) for v in values], pa.float64()), "DOUBLE"
    if kinds <= {str}:
        for parse, arrow_type, name in (
            (datetime.date.fromisoformat, pa.date32(), "DATE"),
            (datetime.datetime.fromisoformat, pa.timestamp("us"), "TIMESTAMP"),
        ):
            try:  # ISO dates and timestamps (what the readers make of typed dates) compare as such
                if name == "DATE" and any(len(v) != 10 for v in present):
                    continue
                return pa.array([None if v is None else parse(v) for v in values], arrow_type), name
            except (ValueError, TypeError, pa.ArrowException):
                pass
        return pa.array(values, pa.string()), "VARCHAR"
    if kinds <= {list} and present:
        inner = {type(x) for v in present for x in v}
        for allowed, arrow_type, name in (
            ({str}, pa.string(), "VARCHAR[]"),
            ({int}, pa.int64(), "BIGINT[]"),
            ({int, float}, pa.float64(), "DOUBLE[]"),
        ):
            if inner and inner <= allowed:
                try:
                    return pa.array(values, pa.list_(arrow_type)), name
                except (pa.ArrowException, OverflowError):
                    break
    return pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values], pa.string()), "VARCHAR"


class DocumentFilters:
    """The filter table of one loaded corpus, and the cache of filters already run on it."""

    def __init__(self, corpus: Corpus):
        self.n_documents = len(corpus.doc_ids)
        columns = {
            "position": pa.array(np.arange(self.n_documents, dtype=np.int32)),
            "doc_id": pa.array(corpus.doc_ids, pa.string()),
            "title": pa.array(corpus.titles, pa.string()),
            "source": pa.array(corpus.sources, pa.string()),
        }
        self.fields = {"doc_id": "VARCHAR", "title": "VARCHAR", "source": "VARCHAR"}
        taken = {"position", *BUILT_IN}
        names = list(dict.fromkeys(name for metadata in corpus.metadata for name in metadata))
        for name in names:
            if name.lower() in taken:
                continue  # DuckDB's column names ignore case: the first of Year/year, and never a built-in
            taken.add(name.lower())
            columns[name], self.fields[name] = _typed_column([metadata.get(name) for metadata in corpus.metadata])
        self.con = duckdb.connect(":memory:")
        self.con.register("loaded", pa.table(columns))
        self.con.execute("CREATE TABLE documents AS SELECT * FROM loaded")
        self.con.unregister("loaded")
        # The CLI's SQL may read nothing but this table, and cannot switch that back on.
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")
        self._lowered = {name.lower(): name for name in self.fields}
        self._cache: OrderedDict[DocumentFilter, np.ndarray] = OrderedDict()
        self._lock = Lock()

    def close(self) -> None:
        self.con.close()

    def allowed_documents(self, wanted: DocumentFilter) -> np.ndarray:
        """Positions (ascending) of the documents the filter keeps."""
        with self._lock:
            if wanted in self._cache:
                self._cache.move_to_end(wanted)
                return self._cache[wanted]
        conditions, params = [], {}
        if wanted.structured:
            sql, params = self.compile(json.loads(wanted.structured))
            conditions.append(sql)
        if wanted.where:
            conditions.append(f"({self._check_where(wanted.where)}\n)")
        cursor = self.con.cursor()
        try:
            rows = cursor.execute(
                f"SELECT position FROM documents WHERE {' AND '.join(conditions)} ORDER BY position", params
            ).fetchnumpy()
        except duckdb.Error as e:
            what = "--where" if wanted.where and not wanted.structured else "filter"
            raise FilterError(f"{what}: {_first_line(e)}") from None
        finally:
            cursor.close()
        positions = rows["position"].astype(np.int64)
        with self._lock:
            self._cache[wanted] = positions
            if len(self._cache) > CACHED_FILTERS:
                self._cache.popitem(last=False)
        return positions

    def _check_where(self, where: str) -> str:
        """The CLI's condition, if it is one SELECT's condition: the statement must stay a single SELECT."""
        try:
            statements = self.con.extract_statements(f"SELECT position FROM documents WHERE ({where}\n)")
        except duckdb.Error as e:
            raise FilterError(f"--where: {_first_line(e)}") from None
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise FilterError(
                "--where: must be one condition over the documents' columns, "
                "e.g. \"year >= 2015 AND journal = 'Nature'\""
            )
        return where

    def compile(self, structured: dict) -> tuple[str, dict]:
        """{"field": {"operator": value} or value} -> (SQL condition, its parameters); all conditions must hold."""
        if not isinstance(structured, dict):
            raise FilterError("filter: expected an object of field -> condition")
        conditions, params = [], {}
        for field, condition in structured.items():
            column = self._lowered.get(str(field).lower())
            if column is None:
                raise FilterError(f"filter: unknown field '{field}' (fields: {', '.join(self.fields)})")
            if not isinstance(condition, dict):
                condition = {"eq": condition}
            if not condition:
                raise FilterError(f"filter.{field}: no operator (operators: {', '.join(OPERATORS)})")
            for operator, value in condition.items():
                if operator not in OPERATORS:
                    raise FilterError(
                        f"filter.{field}: unknown operator '{operator}' (operators: {', '.join(OPERATORS)})"
                    )
                conditions.append(self._condition(column, str(field), operator, value, params))
        return "(" + " AND ".join(conditions) + ")", params

    def _condition(self, column: str, field: str, operator: str, value, params: dict) -> str:
        kind = self.fields[column]
        quoted = '"' + column.replace('"', '""') + '"'  # a name of the table's own, never the request's text

        def bind(v) -> str:
            name = f"p{len(params)}"
            params[name] = v
            return f"${name}"

        where = f"filter.{field}.{operator}"
        if operator in ("in", "nin"):
            if not isinstance(value, list) or not value:
                raise FilterError(f"{where}: expects a non-empty list of values")
            values = [self._value(kind.removesuffix("[]"), v, where) for v in value]
            test = (
                f"list_has_any({quoted}, {bind(values)})"
                if kind.endswith("[]")
                else f"list_contains({bind(values)}, {quoted})"
            )
            return test if operator == "in" else f"NOT coalesce({test}, false)"
        if operator == "glob":
            if not isinstance(value, str) or kind != "VARCHAR":
                raise FilterError(f"{where}: expects a text pattern, on a text field")
            if column == "source":  # sources are absolute paths; a relative glob is read from the working directory
                return f"({quoted} GLOB {bind(value)} OR {quoted} GLOB {bind(os.path.abspath(value))})"
            return f"{quoted} GLOB {bind(value)}"
        if operator == "contains":
            if kind.endswith("[]"):
                return f"list_contains({quoted}, {bind(self._value(kind.removesuffix('[]'), value, where))})"
            if not isinstance(value, str) or kind != "VARCHAR":
                raise FilterError(f"{where}: expects a text, on a text or list field")
            return f"contains(lower({quoted}), lower({bind(value)}))"
        if kind.endswith("[]"):
            if operator not in ("eq", "ne"):
                raise FilterError(f"{where}: a list field takes eq, ne, in, nin or contains")
            test = f"list_contains({quoted}, {bind(self._value(kind.removesuffix('[]'), value, where))})"
            return test if operator == "eq" else f"NOT coalesce({test}, false)"
        if operator in ("gt", "gte", "lt", "lte") and kind in ("VARCHAR", "BOOLEAN"):
            raise FilterError(
                f"{where}: '{field}' is {'text' if kind == 'VARCHAR' else 'true/false'}; it takes eq, ne, in, nin"
                + (", glob, contains" if kind == "VARCHAR" else "")
            )
        test = f"{quoted} {COMPARISONS[operator]} {bind(self._value(kind, value, where))}"
        return test if operator != "ne" else f"({quoted} IS NULL OR {test})"

    @staticmethod
    def _value(kind: str, value, where: str):
        """The value as the column's type, or a FilterError naming what was expected."""
        if kind == "BOOLEAN" and isinstance(value, bool):
            return value
        if kind in ("BIGINT", "DOUBLE") and isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if kind == "VARCHAR" and isinstance(value, str):
            return value
        if kind in ("DATE", "TIMESTAMP") and isinstance(value, str):
            try:
                return (
                    datetime.date.fromisoformat(value)
                    if kind == "DATE" and len(value) == 10
                    else datetime.datetime.fromisoformat(value)
                )
            except ValueError:
                pass
        expected = {
            "BOOLEAN": "true or false",
            "BIGINT": "a number",
            "DOUBLE": "a number",
            "VARCHAR": "a text",
            "DATE": "an ISO date (2015-06-30)",
            "TIMESTAMP": "an ISO timestamp (2015-06-30T12:00:00)",
        }[kind]
        raise FilterError(f"{where}: expects {expected}, got {json.dumps(value)[:80]}")


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
