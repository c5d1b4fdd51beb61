"""An image that verifies but cannot be restored, end to end with real PySpark drivers.

The newest image is damaged the way a planner bug damages it (issue 11): a file Spark reads
at restart, here the state version the next batch loads, is left out of the image while its
`_metadata` stays consistent, so plain `verify` passes. `verify --deep` must catch it, and a
run must fall back to the previous image and still end exactly-once; with every image
damaged the job must fail and say why.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.images import leave_out_newest_state
from helpers.job_run import JobRun

pytestmark = pytest.mark.spark


def _verify(run: JobRun, *options: str) -> subprocess.CompletedProcess[str]:
    """``spark-checkpoint verify -f job.yaml`` as a user runs it, from the job's directory."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_checkpoint_operator.cli",
            "verify",
            "-f",
            "job.yaml",
            "--state-dir",
            "state",
            *options,
        ],
        cwd=run.directory,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _suspended_run(directory: Path, **options: object) -> tuple[JobRun, int]:
    """A run that took checkpoints, then was stopped with a savepoint (Ctrl-C)."""
    run = JobRun(directory, bounded=False, **options)  # type: ignore[arg-type]
    run.add_input(files=8)
    run.start()
    run.wait_for_line(r"checkpoint \d+ complete")
    run.wait_for_line(r"checkpoint \d+ complete")
    run.interrupt()
    savepoint = int(run.wait_for_line(r"savepoint (\d+) complete")[1])
    assert run.wait() == 0, "\n".join(run.lines)
    return run, savepoint


def test_an_unrestorable_image_is_caught_by_verify_deep_and_restore_falls_back(
    tmp_path: Path,
) -> None:
    first, savepoint = _suspended_run(tmp_path / "job")
    left_out = leave_out_newest_state(first.storage_dir, "savepoint", savepoint)
    assert left_out, "the image lost the state version its next batch loads"

    plain = _verify(first)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert re.search(rf"^savepoint:{savepoint}\s+OK", plain.stdout, re.MULTILINE), plain.stdout
    deep = _verify(first, "--deep")
    assert deep.returncode == 1, deep.stdout + deep.stderr
    lines = deep.stdout.splitlines()
    damaged = next(line for line in lines if line.startswith(f"savepoint:{savepoint} "))
    assert "FAILED  not restorable: state of operator 0" in damaged
    assert "CANNOT_LOAD_STATE_STORE" in damaged
    checkpoints = [line for line in lines if line.startswith("checkpoint:")]
    assert checkpoints and all(line.endswith(", restorable") for line in checkpoints), deep.stdout
    assert "(--deep: each intact one restored by Spark)" in lines[-1]

    resumed = JobRun(tmp_path / "job", bounded=True)
    resumed.add_input(files=4, start_index=8)
    resumed.start()
    fallback = resumed.wait_for_line(
        rf"savepoint:{savepoint} cannot be restored: .*; falling back to (checkpoint:\d+)"
    )
    # Spark's reason comes with it, not only in the driver's log.
    assert "points at the checkpoint: " in fallback[0], fallback[0]
    assert "CANNOT_LOAD_STATE_STORE" in fallback[0], fallback[0]
    assert resumed.wait() == 0, "\n".join(resumed.lines)
    status = resumed.status()["status"]
    assert status["phase"] == "Finished"
    assert status["restoredFrom"]["source"] == fallback[1]
    assert [entry["source"] for entry in status["unrestorable"]] == [f"savepoint:{savepoint}"]
    assert status["counts"]["failedRestores"] == 1
    assert status["counts"]["restored"] == 1, "the failed restore is not counted"
    failed_attempt = status["unrestorable"][0]["attempt"]
    driver_log = resumed.state_dir / f"default/wordcount/logs/driver-{failed_attempt}.log"
    assert re.search(r"cannot be used: .*CANNOT_LOAD_STATE_STORE", driver_log.read_text())
    assert resumed.output_counts() == resumed.expected_counts()
    batches = resumed.committed_batches()
    assert batches == list(range(len(batches))), "committed batches must be 0..N without gaps"


def test_with_every_image_unrestorable_the_job_fails_with_that_reason(tmp_path: Path) -> None:
    first, savepoint = _suspended_run(tmp_path / "job", checkpointing={"retained": 1})
    registered = first.status()["status"]["coordinator"]
    images = [f"checkpoint:{c['id']}" for c in registered["checkpoints"]]
    images.append(f"savepoint:{savepoint}")
    for image in images:
        kind, number = image.split(":")
        leave_out_newest_state(first.storage_dir, kind, int(number))

    resumed = JobRun(tmp_path / "job", bounded=True)
    resumed.add_input(files=2, start_index=8)
    resumed.start()
    assert resumed.wait() == 1, "\n".join(resumed.lines)
    status = resumed.status()["status"]
    assert status["phase"] == "Failed"
    assert status["message"].startswith("no restorable image left: ")
    for image in images:
        assert f"{image}: its restored query failed in attempt" in status["message"]
    assert sorted(e["source"] for e in status["unrestorable"]) == sorted(images)
    assert status["counts"]["failedRestores"] == len(images)
    assert status["counts"]["restored"] == 0
    assert any("job failed: no restorable image left" in line for line in resumed.lines)


def test_a_pipeline_change_the_state_cannot_follow_fails_the_job_and_leaves_its_images(
    tmp_path: Path,
) -> None:
    """A newcomer's bad upgrade (another grouping key) marked every checkpoint and
    savepoint unrestorable in turn; with the change undone the job could not run again."""
    run, _ = _suspended_run(tmp_path / "job")
    pipeline = run.directory / "pipeline.py"
    original = pipeline.read_text()
    pipeline.write_text(original.replace('groupBy("word")', 'groupBy("word", "n")'))
    run.add_input(files=2, start_index=8)  # a state store is read when data comes

    earlier = len(run.lines)
    run.start()
    assert run.wait() == 1, "\n".join(run.lines)
    status = run.status()["status"]
    assert status["phase"] == "Failed"
    assert status["message"].startswith("the restored query failed the same way on "), status
    assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in status["message"]
    assert status.get("unrestorable", []) == []
    started = [line for line in run.lines[earlier:] if "starting driver attempt" in line]
    assert len(started) == 2, "two images tried"

    pipeline.write_text(original)  # undone: the newest image restores
    run.start()
    run.wait_for_line(r"checkpoint \d+ complete")
    run.interrupt()
    assert run.wait() == 0, "\n".join(run.lines)
