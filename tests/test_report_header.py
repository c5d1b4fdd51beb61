"""pytest's header says how each run's Spark drivers start and how fast the machine ran
Python as the run began: on this shared machine the host's load changes CI's time, and a
log that says how fast Python ran tells one kind of slow run from another (docs/testing.md)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_header_says_how_drivers_start_and_how_fast_the_machine_ran() -> None:
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", __file__],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "Spark drivers: no class archive (pytest's cache is off)" in collected.stdout
    speed = re.search(
        r"^machine speed: (\d+\.\d\d) CPU-s for 5 million steps ", collected.stdout, re.M
    )
    assert speed, collected.stdout
    assert 0 < float(speed[1]) < 60
