"""A bounded job whose final checkpoint was registered but whose run was killed before it
ended, run again as a user does: the real CLI as a subprocess, the real `run_coordinated`
and agent around a stand-in query (helpers/fake_query.py) with a bounded input."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from helpers.fake_query import INPUT_BATCHES_VARIABLE, run_cli, write_job


def test_a_bounded_job_restored_from_the_checkpoint_covering_its_input_finishes(
    tmp_path: Path,
) -> None:
    """The restored query commits nothing (its input is done) and its driver waited for a
    final checkpoint that never came: the supervisor told it of the registered one, which
    the new driver's agent did not know (404), and the run hung (exactly-once tester)."""
    write_job(tmp_path, interval="1s")
    environment = os.environ | {INPUT_BATCHES_VARIABLE: "4"}
    first = subprocess.Popen(
        [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "-f", "job.yaml"],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert first.stdout is not None
    seen = []
    for line in first.stdout:
        seen.append(line)
        # Registered (the line follows the status write), covering the input's last batch.
        if re.search(r"checkpoint \d+ complete.*: batch 3,", line):
            break
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert "job finished" not in "".join(seen), "".join(seen)

    second = run_cli(tmp_path, "run", "-f", "job.yaml", environment=environment)

    output = second.stdout + second.stderr
    assert second.returncode == 0, output
    assert "restoring from checkpoint:" in output, output
    assert "the last run (attempt 1) ended without recording how (killed?) while Running" in (
        output
    )
    status_file = tmp_path / ".spark-checkpoint" / "default" / "probe" / "status.json"
    status = json.loads(status_file.read_text())["status"]
    assert (status["phase"], status["jobAttempt"]) == ("Finished", 2), output
