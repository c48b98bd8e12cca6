"""The corpus used when the user gives no data: docstrings of Python's standard library.

It is on every machine that runs this tool and needs no download. Modules are parsed with `ast`
(never imported, so nothing runs); each module becomes one document of its docstrings. Pretraining
trains on it and records DEFAULT_CORPUS_SOURCE as its sources; embed and tune without --data find that
marker in the manifest and read the same documents again.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from pathlib import Path
from typing import Iterator

from common.readers import Document

SKIPPED_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__", "turtledemo"}

# The manifest's record of this corpus as pretraining's sources (a marker, not a path).
DEFAULT_CORPUS_SOURCE = "<python standard library docstrings>"


def stdlib_documents() -> Iterator[Document]:
    """The corpus's documents, one per module. Parsed once per process (seconds: every module of the standard
    library): pretraining reads them twice (the tokenizer's sample, then the tokens), and a chain of commands in
    one process (workflows.py) reads them again to embed."""
    return iter(parsed_stdlib())


@functools.cache
def parsed_stdlib() -> tuple[Document, ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        docstrings = [
            doc
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and (doc := ast.get_docstring(node))
        ]
        if docstrings:
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            documents.append(
                Document(id=f"stdlib:{module}", title=module, source=str(path), text="\n\n".join(docstrings))
            )
    return tuple(documents)
