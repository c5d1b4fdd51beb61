"""Local runtime safeguards: never two drivers of one job."""

import json
import os
import subprocess
import time
from pathlib import Path

from spark_checkpoint_operator.local_runtime import LocalPaths, _stop_leftover_driver


def _fake_driver(work_dir: Path) -> subprocess.Popen[bytes]:
    environment = dict(os.environ, SPARK_CHECKPOINT_WORK_DIR=str(work_dir))
    process = subprocess.Popen(["sleep", "600"], env=environment, start_new_session=True)
    # Until it has exec'd, the child shows its parent's environment, not its own.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
        assert time.monotonic() < deadline, "the fake driver never started"
        time.sleep(0.01)
    return process


def _record(paths: LocalPaths, pid: int) -> None:
    paths.job_dir.mkdir(parents=True)
    paths.status_file.write_text(json.dumps({"driver": {"pid": pid}}))


def test_a_driver_left_over_from_a_killed_run_is_stopped(tmp_path: Path) -> None:
    paths = LocalPaths(tmp_path / "default" / "job")
    leftover = _fake_driver(paths.work_dir)
    _record(paths, leftover.pid)
    reports: list[str] = []
    _stop_leftover_driver(paths, reports.append)
    assert leftover.wait(timeout=10) == -9
    assert reports == [f"stopped driver {leftover.pid} left over from an earlier run"]


def test_a_reused_pid_of_another_process_is_left_alone(tmp_path: Path) -> None:
    paths = LocalPaths(tmp_path / "default" / "job")
    stranger = _fake_driver(tmp_path / "another-job" / "work")
    _record(paths, stranger.pid)
    try:
        _stop_leftover_driver(paths, print)
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
