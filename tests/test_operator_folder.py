"""The control plane's folder, `operator/`, never shadows the standard `operator` module.

`operator/` holds the package `spark_checkpoint_operator/` and has no __init__.py of its own.
The layering rules are import-linter's contracts in `.importlinter` (run by `make lint`).
"""

import operator
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
