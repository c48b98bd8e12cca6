"""The code's layout rules, checked on the source: stages talk through the workspace, never through each
other's packages, and common/ serves them all without depending on any."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ONE_AT_A_TIME, REPO

STAGES = ("pretrain", "embed", "index", "search")


def imported_packages(package: str, root: Path = REPO) -> dict[str, set[str]]:
    """For each module of the package, the top-level packages it imports (at any depth of the code: an
    import inside a function counts as much as one at the top)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(root))] = names
    return found


def test_no_stage_imports_another_stage():
    crossings = [
        f"{module} imports {other}"
        for stage in STAGES
        for module, names in imported_packages(stage).items()
        for other in sorted(names & set(STAGES) - {stage})
    ]
    assert crossings == []


def test_common_imports_no_stage():
    crossings = [
        f"{module} imports {stage}"
        for module, names in imported_packages("common").items()
        for stage in sorted(names & set(STAGES))
    ]
    assert crossings == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    """The check itself: an import inside a function body is found (embed imported pretrain's default
    corpus that way), and so are plain and dotted imports."""
    (tmp_path / "embed").mkdir()
    (tmp_path / "embed" / "run.py").write_text(
        "import json\nimport search.engine\n\ndef f():\n    from pretrain.default_corpus import stdlib_documents\n"
    )
    assert imported_packages("embed", tmp_path) == {"embed/run.py": {"json", "search", "pretrain"}}


def constructed_sections(root: Path = REPO) -> dict[str, set[str]]:
    """For each manifest section class, the modules (outside tests/ and benchmarks/) that construct one
    (`TunedEntry(...)`, `TunedEntry.from_json(...)`): writing a section starts with making it."""
    from common.manifest import SECTIONS

    names = {cls.__name__ for cls in SECTIONS}
    found: dict[str, set[str]] = {name: set() for name in names}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in ("tests", "benchmarks", ".venv") or relative == Path("common/manifest.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call):
                called = (
                    node.func.value
                    if isinstance(node.func, ast.Attribute) and node.func.attr == "from_json"
                    else node.func
                )
                if isinstance(called, ast.Name) and called.id in names:
                    found[called.id].add(str(relative))
    return found


def test_each_manifest_section_has_one_writer():
    """common/manifest.py: one writer per section, named in the section's docstring."""
    from common.manifest import SECTIONS

    writers = constructed_sections()
    for cls in SECTIONS:
        assert len(writers[cls.__name__]) == 1, f"{cls.__name__} is made in {sorted(writers[cls.__name__])}"
        (writer,) = writers[cls.__name__]
        assert writer in cls.__doc__, f"{cls.__name__}'s docstring does not name its writer {writer}"


def test_search_reads_index_files_only_through_common():
    """index/ writes the index files; search/ reads them through common/dense/reader.py, and index/ does
    not read search/ (the one allowed direction, through common/)."""
    assert not any("index" in names for names in imported_packages("search").values())
    readers = {
        module
        for module, names in imported_packages("search").items()
        if "common" in names and "common.dense.reader" in (REPO / module).read_text()
    }
    assert readers, "search/ reads the index files through common/dense/reader.py"


HEAVY_FRAMEWORKS = ("jax", "tensorflow")  # each preallocates a GPU's memory when imported with one


def test_no_module_imports_jax_or_tensorflow(tmp_path):
    """Every product module, and every library they import (at the top or inside a function), is imported
    with stand-ins for JAX and TensorFlow on the path: none may import either (bm25s imported JAX for its
    stop-word lists, and XLA then took most of a GPU's memory). The stand-ins make the check able to fail
    on a machine where neither is installed."""
    for name in HEAVY_FRAMEWORKS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    modules = sorted(
        {
            ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            for package in (*STAGES, "common")
            for path in (REPO / package).rglob("*.py")
        }
        | {"cli", "workflows"}
    )
    libraries = sorted(
        {name for package in (*STAGES, "common") for names in imported_packages(package).values() for name in names}
        - {*STAGES, "common", "ray"}  # ray is optional ([ray] extra); its own tests cover it
    )
    script = (
        "import importlib, sys\n"
        f"for name in {modules + libraries!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        pass\n"
        f"print(sorted(name for name in {HEAVY_FRAMEWORKS!r} if name in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"


def test_every_package_is_installed():
    """pyproject.toml lists the packages an install carries: every folder of the stages and common/ that is a
    package (has an __init__.py) is among them, so an installed (not editable) copy imports what the tree does."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for root in (*STAGES, "common")
        for init in (REPO / root).rglob("__init__.py")
    }
    assert found <= listed, found - listed


def test_tests_share_helpers_through_conftest_only():
    """A test module imports no other test module (nor benchmarks/): what several share is in conftest.py."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.startswith(("test_", "benchmarks"))]
    assert not offenders, offenders


@pytest.mark.multiprocess
def test_the_tests_that_start_processes_share_one_xdist_worker(request):
    """Under scripts/test.sh (pytest-xdist, --dist loadgroup) the `multiprocess` and `ray` tests are one group,
    run one at a time by one worker, so their module fixtures (torchrun jobs, a Ray cluster) are made once.
    pytest 9.2 broke the grouping silently (pytest-dev/pytest-xdist#1386): this fails if it is lost again."""
    if not getattr(request.config.option, "loadgroup", False):  # set by pytest-xdist for --dist loadgroup only
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith(f"@{ONE_AT_A_TIME}")
