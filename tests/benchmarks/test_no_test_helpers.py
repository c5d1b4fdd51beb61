"""The benchmarks import nothing from the test suite: no module of ``tests/`` (``helpers``,
``conftest``) and no path into ``tests/`` put on ``sys.path``. What they measure on this
machine with the suite's emulator, they reach as a user would reach a cluster (the
operator-scale benchmark: through a kubeconfig), so they run against a real one as well.
import-linter cannot state this rule: ``benchmarks/`` is scripts, not a package."""

import ast
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TEST_MODULES = {"helpers", "tests", "conftest"}


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module and its functions and classes."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def reaches_into_tests(source: str) -> list[str]:
    """What in a benchmark's source imports a test module or names the ``tests/`` folder."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and Path(node.value).parts[:1] == ("tests",)
        ):
            found.append((node.lineno, f"the path {node.value!r}"))
            continue
        else:
            continue
        found += [
            (node.lineno, f"import {name}") for name in names if name.split(".")[0] in TEST_MODULES
        ]
    return [f"line {line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda path: path.name)
def test_a_benchmark_imports_nothing_from_the_tests(script: Path) -> None:
    assert reaches_into_tests(script.read_text(encoding="utf-8")) == []


def test_the_check_finds_an_import_of_a_helper_and_a_path_into_the_tests() -> None:
    source = '''"""Mentions tests/helpers in a docstring, which is fine."""
import sys
sys.path.insert(0, str(ROOT / "tests"))
from helpers.kube.emulator import spark_checkpoint_api
import tests.helpers
'''
    assert reaches_into_tests(source) == [
        "line 3: the path 'tests'",
        "line 4: import helpers.kube.emulator",
        "line 5: import tests.helpers",
    ]
