"""The docs' examples of a local run's controls (README, user guide section 1): each
marked block's commands run as written, in order, with the installed command line, on a
job whose driver runs the real agent around a stand-in query (helpers/fake_query.py)."""

import json
import subprocess
import time
from pathlib import Path

from helpers.doc_blocks import marked_blocks, shell_commands, shell_script, venv_environment
from helpers.fake_query import write_job

TEST_ID = (
    "tests/docs/test_control_examples.py::test_the_control_examples_run_against_a_detached_run"
)


def _run(command: list[str], cwd: Path) -> str:
    result = subprocess.run(
        command,
        cwd=cwd,
        env=venv_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{command} exits {result.returncode}: {result.stderr}"
    return result.stdout


def _until_running(cwd: Path) -> None:
    """As a reader does before asking for a savepoint: the driver's query runs."""
    deadline = time.monotonic() + 60
    while (
        json.loads(_run(["spark-checkpoint", "status", "-f", "job.yaml", "--json"], cwd))["phase"]
        != "Running"
    ):
        assert time.monotonic() < deadline, "the job never got Running"
        time.sleep(0.1)


def test_the_control_examples_run_against_a_detached_run(tmp_path: Path) -> None:
    readme, *others = marked_blocks(
        "tests/docs/test_control_examples.py::test_the_control_examples_run_against_a_detached_run"
    )
    commands = shell_commands(shell_script(readme))
    for block in others:  # the guide's: the same commands, commented for its section
        assert shell_commands(shell_script(block)) == commands, block
    # No periodic checkpoint: the block's first savepoint is savepoint 1.
    write_job(tmp_path, interval="1h")
    outputs = []
    for command in commands:
        outputs.append(_run(command, tmp_path))
        if "--detach" in command:
            _until_running(tmp_path)
    status = json.loads((tmp_path / ".spark-checkpoint/default/probe/status.json").read_text())
    assert status["status"]["phase"] == "Cancelled", outputs
    assert status["status"]["restoredFrom"]["source"] == "savepoint:1", outputs
    assert "savepoint 1 completed" in "".join(outputs), outputs
