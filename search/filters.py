"""Which documents a search may return: filters over the documents' metadata, source, title and id.

The documents' fields are a table of the corpus snapshot `pipeline index` writes (common/snapshot/writer.py; the
snapshot: common/snapshot/reader.py), `documents`, one typed column per metadata field (BIGINT, DOUBLE, BOOLEAN,
DATE, TIMESTAMP, VARCHAR or a list of them; a field whose values disagree on a type is VARCHAR holding
their JSON), plus `doc_id`, `title` and `source`, and each document's `position`. It is a DuckDB file,
opened read-only: a filter reads its columns from disk, and no more than the pages it scans stay in memory.
Two ways to filter:

- `where`: the CLI's condition over those columns in DuckDB's syntax (`year >= 2015 AND journal =
  'Nature'`). It is an expression, not SQL: parsed by DuckDB into its syntax tree, and refused unless it
  is made of comparisons, AND/OR/NOT, IN, BETWEEN, constants, the table's columns and a short list of
  functions (no statement, set operation, subquery or table function). It runs against the read-only
  filter table (the store is not attached) with external access (files, ATTACH) switched off.
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
from pathlib import Path
from threading import Lock

import duckdb
import numpy as np

from common.errors import PipelineError

OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "glob", "contains")
COMPARISONS = {"eq": "=", "ne": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
CACHED_FILTERS = 256
# What a --where condition may be made of: comparisons, AND/OR/NOT, IN, IS NULL, BETWEEN, CASE and casts
# over constants, the table's columns, and these functions (the operators LIKE ~~, ILIKE ~~*, GLOB ~~~,
# SIMILAR TO, arithmetic and ||; text, list and date functions).
WHERE_EXPRESSIONS = {
    "COMPARISON", "CONJUNCTION", "OPERATOR", "BETWEEN", "CASE", "CAST", "TYPE", "CONSTANT", "COLUMN_REF", "FUNCTION",
}  # fmt: skip
WHERE_FUNCTIONS = {
    "~~", "!~~", "~~*", "!~~*", "~~~", "!~~~", "regexp_full_match", "regexp_matches", "+", "-", "*", "/", "//",
    "%", "||", "lower", "upper", "lcase", "ucase", "length", "len", "strlen", "trim", "ltrim", "rtrim",
    "contains", "starts_with", "ends_with", "prefix", "suffix", "list_contains", "list_has", "array_contains",
    "list_has_any", "list_has_all", "array_length", "year", "month", "day", "date_part", "date_trunc", "abs",
    "round", "floor", "ceil", "coalesce", "isnan",
}  # fmt: skip
WHERE_EXAMPLE = (
    "--where: must be one condition over the documents' fields, e.g. \"year >= 2015 AND journal = 'Nature'\""
)


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


class DocumentFilters:
    """The filter table of one corpus snapshot, and the cache of filters already run on it."""

    def __init__(self, path: Path):
        # The CLI's SQL may read nothing but this table, and cannot switch that back on.
        self.con = duckdb.connect(
            str(path), read_only=True, config={"enable_external_access": False, "lock_configuration": True}
        )
        columns = self.con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'documents' ORDER BY column_index"
        ).fetchall()
        self.fields = {name: kind for name, kind in columns if name != "position"}
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
        """The CLI's condition, if it is one: DuckDB parses it inside this table's SELECT (json_serialize_sql,
        which runs nothing), and the parse must be that SELECT alone with a WHERE made of the expressions in
        WHERE_EXPRESSIONS over the table's own columns and functions in WHERE_FUNCTIONS: no second
        statement, set operation, subquery, table function, window or lambda can get through."""
        sql = f"SELECT position FROM documents WHERE ({where}\n)"
        parsed = json.loads(self.con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
        if parsed.get("error") and parsed.get("error_type") == "parser":
            raise FilterError(f"--where: {parsed.get('error_message', 'not a condition')}")
        if parsed.get("error"):  # e.g. a second statement that is not a SELECT
            raise FilterError(WHERE_EXAMPLE)
        statements = parsed["statements"]
        node = statements[0]["node"] if len(statements) == 1 else {}
        only_this_select = (
            node.get("type") == "SELECT_NODE"
            and not node.get("modifiers")
            and not node.get("cte_map", {}).get("map")
            and (node.get("from_table") or {}).get("table_name") == "documents"
            and not any(node.get(key) for key in ("group_expressions", "group_sets", "having", "sample", "qualify"))
        )
        if not only_this_select:
            raise FilterError(WHERE_EXAMPLE)
        self._check_expression(node["where_clause"])
        return where

    def _check_expression(self, expression) -> None:
        if isinstance(expression, list):
            for item in expression:
                self._check_expression(item)
            return
        if not isinstance(expression, dict):
            return
        kind = expression.get("class")
        if kind is not None and kind not in WHERE_EXPRESSIONS:
            raise FilterError(f"--where: {kind.lower().replace('_', ' ')} not allowed; {WHERE_EXAMPLE[9:]}")
        if kind == "COLUMN_REF":
            names = expression.get("column_names") or []
            if len(names) != 1 or names[0].lower() not in self._lowered:
                raise FilterError(f"--where: no field {'.'.join(names)!r} (fields: {', '.join(sorted(self.fields))})")
        if kind == "FUNCTION":
            name = expression.get("function_name", "")
            if expression.get("schema") or expression.get("catalog") or name.lower() not in WHERE_FUNCTIONS:
                raise FilterError(f"--where: function {name!r} not allowed; {WHERE_EXAMPLE[9:]}")
        for value in expression.values():
            self._check_expression(value)

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
