"""README's `make demo`, run as it is (a copy of examples/wordcount, so the checkout's data
directory is left alone): it must kill the driver, restore it and verify the output. Its
default input once ran out before its kill on a quiet machine, and it said nothing."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.doc_blocks import ROOT

pytestmark = pytest.mark.spark


def _demo(directory: Path, *arguments: str) -> tuple[int, str]:
    example = directory / "wordcount"
    shutil.copytree(ROOT / "examples" / "wordcount", example, ignore=shutil.ignore_patterns("data"))
    demo = subprocess.run(
        [sys.executable, str(example / "demo.py"), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return demo.returncode, demo.stdout + demo.stderr


def test_the_demo_kills_restores_and_verifies_exactly_once(tmp_path: Path) -> None:
    returncode, output = _demo(tmp_path)
    assert returncode == 0, output
    assert "demo: killing the driver" in output, output
    assert "restored from checkpoint:" in output, output
    assert "exactly-once output verified" in output, output
    data = tmp_path / "wordcount" / "data"
    assert sorted(path.name for path in data.iterdir()) == ["input"], "a run afterwards starts anew"
    # The command it suggests runs where `make demo` left the user: nothing is on PATH.
    command = re.search(r"`(\S+) run (\S+)` runs the job on it from the start", output)
    assert command is not None, output
    assert Path(command[1]).is_file() and Path(command[2]) == tmp_path / "wordcount" / "job.yaml"


def test_a_demo_whose_input_runs_out_before_its_kill_fails_saying_so(tmp_path: Path) -> None:
    returncode, output = _demo(tmp_path, "--files", "2", "--kill-after-checkpoints", "5")
    assert returncode == 1, output
    assert "demo: the input ran out after" in output, output
    assert "run it with more --files" in output, output
