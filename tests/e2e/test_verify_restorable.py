"""checkpointing.verifyRestorable end to end with real PySpark: an image damaged right
after it completed (tests/e2e/damage_on_check, which also kills the driver with kill -9)
is found unrestorable by Spark in the background check, reported with Spark's reason and
recorded in status.unrestorable; the restore after the kill skips it although it is the
newest image, and the job still ends exactly-once."""

import re
from pathlib import Path

import pytest

from helpers.job_run import JobRun

pytestmark = pytest.mark.spark

HOOK = Path(__file__).parent / "damage_on_check"


def test_an_image_found_unrestorable_after_it_completed_is_skipped_by_the_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "job"
    monkeypatch.setenv("PYTHONPATH", str(HOOK))
    monkeypatch.setenv("CHECK_HOOK_JOB", str(directory))
    run = JobRun(
        directory,
        bounded=False,
        checkpointing={"verifyRestorable": True, "retained": 4},
        shutdown={"drain": True},
    )
    run.add_input(files=16)
    run.start()
    warning = run.wait_for_line(r"(checkpoint:\d+) is not restorable, restores skip it: (.*)")
    damaged = warning[1]
    assert (directory / "damaged").read_text() == f"{damaged} {damaged}", "newest when killed"
    assert "CANNOT_LOAD_STATE_STORE" in warning[2]
    restored = run.wait_for_line(r"restored from (checkpoint:\d+)")[1]
    assert int(restored.split(":")[1]) < int(damaged.split(":")[1])
    run.wait_for_line(r"checkpoint \d+ complete")
    run.interrupt()
    run.wait_for_line(r"savepoint \d+ complete")
    assert run.wait() == 0, "\n".join(run.lines)

    status = run.status()["status"]
    (entry,) = status["unrestorable"]
    assert entry["source"] == damaged
    assert entry["reason"].startswith("the restorable check after it completed found: state")
    assert status["counts"]["failedRestores"] == 0, "no restore was tried on it"
    assert not any(re.search(rf"{damaged} cannot be restored", line) for line in run.lines)
    assert run.output_counts() == run.expected_counts()
    batches = run.committed_batches()
    assert batches == list(range(len(batches))), "committed batches must be 0..N without gaps"
