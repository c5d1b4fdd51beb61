"""A restore that takes longer than the start timeout, run as a user runs a job: the real
CLI as a subprocess, the real `run_coordinated` and agent around a stand-in query
(helpers/fake_query.py) whose driver restores its image slowly, as a large image's does."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from helpers.fake_query import BATCHES_VARIABLE, RESTORE_SECONDS_VARIABLE, run_cli, write_job


def test_a_restore_longer_than_the_start_timeout_resumes_the_job(tmp_path: Path) -> None:
    write_job(tmp_path, interval="1s")
    first = subprocess.Popen(
        [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "-f", "job.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert first.stdout is not None
    for line in first.stdout:  # until a checkpoint completed
        if " checkpoint 1 complete" in line:
            break
    first.send_signal(signal.SIGINT)  # a savepoint, then stop
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out

    # The agent answers within 4 s of the driver's start (2 s were too few for the
    # driver's Python to start on a machine loaded 7 times over); its restore takes 8 s.
    environment = os.environ | {RESTORE_SECONDS_VARIABLE: "8", BATCHES_VARIABLE: "3"}
    second = run_cli(
        tmp_path, "run", "-f", "job.yaml", "--agent-timeout", "4", environment=environment
    )

    output = second.stdout + second.stderr
    assert second.returncode == 0, output
    assert "never answered" not in output
    restored = re.search(r"restored from (savepoint:\d+)", output)
    assert restored is not None, output
    status_file = tmp_path / ".spark-checkpoint" / "default" / "probe" / "status.json"
    status = json.loads(status_file.read_text())["status"]
    assert (status["phase"], status["jobAttempt"]) == ("Finished", 2)
    assert status["restoredFrom"]["source"] == restored[1]
    assert status["counts"]["restored"] == 1
