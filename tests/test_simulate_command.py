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


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--tasks", "0"], "argument --tasks: '0' is not a whole number of 1 or more"),
        # Each simulated in memory: 100,000,000 took GiB before a line (a reviewer's).
        (["--tasks", "100001"], "argument --tasks: '100001' is more than 100000"),
        (["--retained", "0"], "argument --retained: '0' is not a whole number of 1 or more"),
        (
            ["--tolerable-failures", "-1"],
            "argument --tolerable-failures: '-1' is not a whole number of 0 or more",
        ),
        (["--duration", "-5"], "argument --duration: '-5' is not a number of seconds above 0"),
        (["--interval", "nan"], "argument --interval: 'nan' is not a number of seconds above 0"),
        (["--timeout", "inf"], "argument --timeout: 'inf' is not a number of seconds above 0"),
        (["--min-pause", "-1"], "argument --min-pause: '-1' is not a number of seconds from 0"),
    ],
)
def test_a_setting_out_of_range_is_a_one_line_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str], option: list[str], said: str
) -> None:
    """Before, `--tasks 0` ran with one task and `--duration -5` ran nothing, exit 0."""
    with pytest.raises(SystemExit) as exited:
        main(["simulate", *option])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spark-checkpoint simulate: {said}"), err
    assert len(err.splitlines()) == 1, err


def test_a_pause_of_zero_is_a_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--min-pause", "0", "--duration", "30"]) == 0
    assert "completed checkpoint 1 " in capsys.readouterr().out
