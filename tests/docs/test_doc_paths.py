"""Every repository path the docs name exists: a path in backticks that starts at one of
the repository's top-level folders (`operator/...`, `tests/...`); and a file a doc names
by a shorter path (`supervisor/job.py`, `spark_checkpoint/protocol.py`, `results/x.json`)
under a package, a package's folder or the doc's own folder. Paths under `build/` (and
mutmut's `mutants/` in it) are made by the make targets and are not checked."""

import re
from pathlib import Path

import pytest

from helpers.doc_blocks import ROOT, doc_paths

TOP_LEVEL = ("operator/", "spark_app/", "tests/", "benchmarks/", "charts/", "crds/", "docs/")
PACKAGES = (
    ROOT / "operator" / "spark_checkpoint_operator",
    ROOT / "spark_app" / "spark_checkpoint",
)
BASES = (ROOT, *PACKAGES, *(package.parent for package in PACKAGES))
# A file or folder name in backticks: words joined by '/', ending in a file name or '/'.
_PATH = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.{},-]+)*/?)`")
_FILE = re.compile(r"\.(py|md|yaml|yml|json|toml|txt|sh)$")


def _candidates(text: str) -> set[str]:
    found = set()
    for match in _PATH.finditer(text):
        path = match.group(1)
        if path.startswith(("build/", "mutants/")):
            continue
        if "/" in path and (path.startswith(TOP_LEVEL) or _FILE.search(path)):
            found.add(path)
    return found


def _exists(path: str, doc_dir: Path = ROOT) -> bool:
    if "{" in path:  # a brace list: `kubernetes/{runtime,controller}.py`
        head, _, rest = path.partition("{")
        names, _, tail = rest.partition("}")
        return all(_exists(f"{head}{name}{tail}", doc_dir) for name in names.split(","))
    if path.startswith(TOP_LEVEL):
        return (ROOT / path).exists()
    return any((base / path).exists() for base in (*BASES, doc_dir))


@pytest.mark.parametrize("doc", [*doc_paths(), "STYLE.md"])
def test_every_path_a_doc_names_exists(doc: str) -> None:
    text = (ROOT / doc).read_text()
    missing = sorted(p for p in _candidates(text) if not _exists(p, (ROOT / doc).parent))
    assert missing == [], f"{doc} names paths that do not exist"


def test_the_check_finds_a_missing_path() -> None:
    text = "see `operator/spark_checkpoint_operator/supervisor.py` and `supervisor/job.py`"
    assert sorted(p for p in _candidates(text) if not _exists(p)) == [
        "operator/spark_checkpoint_operator/supervisor.py"
    ]
