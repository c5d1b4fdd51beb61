"""`python -m spark_checkpoint.janitor`: what a cleanup pod runs while no driver does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _janitor(
    storage: Path, *arguments: str, **environment: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPARK_CHECKPOINT_NAMESPACE": "default",
        "SPARK_CHECKPOINT_JOB": "orders",
        "SPARK_CHECKPOINT_STORAGE": storage.as_uri(),
        **environment,
    }
    return subprocess.run(
        [sys.executable, "-m", "spark_checkpoint.janitor", *arguments],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def job_storage(tmp_path: Path) -> Path:
    root = tmp_path / "default" / "orders"
    for directory in ("chk-3", "chk-4", "savepoints/sp-2"):
        (root / directory).mkdir(parents=True)
        (root / directory / "part").write_text("state")
    return root


def test_garbage_collection_keeps_what_is_registered(tmp_path: Path, job_storage: Path) -> None:
    result = _janitor(tmp_path, "collect-garbage", "--checkpoints=", "--savepoints=2")

    assert result.returncode == 0, result.stderr
    assert not (job_storage / "chk-3").exists()
    assert not (job_storage / "chk-4").exists()
    assert (job_storage / "savepoints" / "sp-2" / "part").exists()
    assert "removed checkpoints [3, 4]" in result.stdout


def test_a_savepoint_is_discarded(tmp_path: Path, job_storage: Path) -> None:
    result = _janitor(tmp_path, "discard-savepoint", "2")

    assert result.returncode == 0, result.stderr
    assert not (job_storage / "savepoints" / "sp-2").exists()


def test_missing_settings_are_named(tmp_path: Path) -> None:
    result = _janitor(tmp_path, "collect-garbage", SPARK_CHECKPOINT_JOB="")

    assert result.returncode == 2
    assert "SPARK_CHECKPOINT_JOB" in result.stderr


def test_a_storage_failure_is_the_last_line(tmp_path: Path, job_storage: Path) -> None:
    result = _janitor(tmp_path, "discard-checkpoint", "3", "--retained=3")

    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("discard-checkpoint failed:")
    assert (job_storage / "chk-3").exists(), "nothing was deleted"
