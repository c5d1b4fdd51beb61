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


def test_a_deleted_jobs_live_directory_is_removed_and_only_it(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    for job in ("orders-1a2b", "orders-9f8e"):
        (claim / job / "attempt-3" / "state").mkdir(parents=True)
        (claim / job / "attempt-3" / "state" / "1.delta").write_text("state")

    removed = _janitor(
        tmp_path, "remove-live-directory", "orders-1a2b", SPARK_CHECKPOINT_LIVE_ROOT=str(claim)
    )
    again = _janitor(
        tmp_path, "remove-live-directory", "orders-1a2b", SPARK_CHECKPOINT_LIVE_ROOT=str(claim)
    )

    assert removed.returncode == 0, removed.stderr
    assert not (claim / "orders-1a2b").exists()
    assert (claim / "orders-9f8e" / "attempt-3" / "state" / "1.delta").exists()
    assert again.returncode == 0 and "nothing to remove" in again.stdout


@pytest.mark.parametrize("name", ["..", ".", "", "orders/../../etc"])
def test_a_live_directory_is_one_name_under_the_root(tmp_path: Path, name: str) -> None:
    (tmp_path / "claim").mkdir()

    result = _janitor(
        tmp_path, "remove-live-directory", name, SPARK_CHECKPOINT_LIVE_ROOT=str(tmp_path / "claim")
    )

    assert result.returncode == 2
    assert "not one directory name" in result.stderr
    assert (tmp_path / "claim").exists()


def test_removing_a_live_directory_needs_the_claims_root(tmp_path: Path) -> None:
    result = _janitor(tmp_path, "remove-live-directory", "orders-1a2b")

    assert result.returncode == 2
    assert "SPARK_CHECKPOINT_LIVE_ROOT" in result.stderr
