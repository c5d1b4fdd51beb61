"""Layering rules that keep the architecture honest, checked on the source.

import-linter's graph builder (grimp) cannot treat our import names as packages
because `operator/` deliberately has no __init__.py (see pyproject.toml), so the
rules are checked here on the parsed source instead.
"""

import ast
import operator
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {
    "spark_checkpoint_operator": ROOT / "operator",
    "spark_checkpoint": ROOT / "spark_app",
}

HTTP_AND_CLUSTER = {
    "kopf",
    "kubernetes",
    "kubernetes_asyncio",
    "lightkube",
    "aiohttp",
    "httpx",
    "requests",
    "urllib3",
    "http",
    "urllib",
    "socket",
}
SPARK = {"pyspark", "py4j"}


def _modules() -> dict[str, Path]:
    found = {}
    for package, directory in PACKAGE_DIRS.items():
        for path in directory.rglob("*.py"):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> Iterator[str]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def _reachable_external(source_prefix: str) -> dict[str, str]:
    """Top-level external modules reachable from ``source_prefix``, each with the internal
    module that imports it."""
    todo = [m for m in MODULES if m == source_prefix or m.startswith(source_prefix + ".")]
    seen, external = set(todo), {}
    while todo:
        module = todo.pop()
        for imported in _imports(module, MODULES[module]):
            if imported in MODULES:
                if imported not in seen:
                    seen.add(imported)
                    todo.append(imported)
            elif imported.split(".")[0] not in PACKAGE_DIRS:
                external.setdefault(imported.split(".")[0], module)
    return external


@pytest.mark.parametrize(
    ("source", "forbidden"),
    [
        ("spark_checkpoint_operator.coordinator", HTTP_AND_CLUSTER | SPARK),
        ("spark_checkpoint_operator", SPARK),
        ("spark_checkpoint.storage", HTTP_AND_CLUSTER | SPARK),
        # Only the handlers know Kopf; the pods' shapes are pure functions of the manifest.
        ("spark_checkpoint_operator.kubernetes.controller", {"kopf"}),
        ("spark_checkpoint_operator.kubernetes.objects", HTTP_AND_CLUSTER),
        ("spark_checkpoint_operator.supervisor", {"kopf", "lightkube"}),
        ("spark_checkpoint_operator.local_runtime", {"kopf", "lightkube"}),
    ],
)
def test_dependency_direction(source: str, forbidden: set[str]) -> None:
    assert any(m.startswith(source) for m in MODULES), f"{source} has no modules"
    reached = _reachable_external(source)
    violations = {name: via for name, via in reached.items() if name in forbidden}
    assert violations == {}, f"{source} reaches forbidden modules (module: importer)"


def test_coordinator_core_imports_nothing_else_of_ours() -> None:
    core = "spark_checkpoint_operator.coordinator"
    for module, path in MODULES.items():
        if module.startswith(core):
            for imported in _imports(module, path):
                if imported.split(".")[0] in PACKAGE_DIRS:
                    assert imported.startswith(core), f"{module} imports {imported}"


def test_the_checker_sees_forbidden_imports(tmp_path: Path) -> None:
    module = "spark_checkpoint_operator.coordinator.fake"
    path = tmp_path / "fake.py"
    path.write_text(
        "from ..coordinator import reasons\nimport kopf\nfrom pyspark.sql import functions\n"
    )
    MODULES[module] = path
    try:
        reached = _reachable_external("spark_checkpoint_operator.coordinator")
    finally:
        del MODULES[module]
    assert {"kopf", "pyspark"} <= reached.keys()


STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_import_operator_is_the_standard_library_under_pytest() -> None:
    assert Path(operator.__file__).parent == STDLIB
    assert hasattr(operator, "itemgetter")


@pytest.mark.parametrize("flags", [[], ["-S"]], ids=["site", "no-site"])
def test_import_operator_is_the_standard_library_from_the_repository_root(
    flags: list[str],
) -> None:
    # -S skips site, which would otherwise import the standard module before cwd is searched.
    result = subprocess.run(
        [sys.executable, *flags, "-c", "import operator; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(result.stdout.strip()).parent == STDLIB
