"""`spark-checkpoint simulate`: the coordinator against a simulated agent."""

import re

import pytest

from spark_checkpoint_operator.cli import main


def test_simulation_completes_checkpoints_and_keeps_retention(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--duration", "200", "--retained", "2", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    completed = [int(n) for n in re.findall(r"completed checkpoint (\d+)", out)]
    assert len(completed) >= 5
    assert completed == sorted(completed)
    summary = re.search(r"(\d+) completed, (\d+) failed; retained checkpoints: ([\d, ]+);", out)
    assert summary is not None
    assert int(summary[1]) == len(completed)
    assert [int(n) for n in summary[3].split(", ")] == completed[-2:]


def test_simulation_rejects_invalid_settings_naming_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--interval", "5", "--min-pause", "9"]) == 2
    assert "checkpointing.minPause (9.0) must not exceed" in capsys.readouterr().err
