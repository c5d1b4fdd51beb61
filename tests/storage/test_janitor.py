"""`python -m spark_checkpoint.janitor`: what a cleanup pod runs while no driver does."""

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.imports import modules_loaded_by
from helpers.objectstore import S3Server, StorageRoot, storage_roots
from spark_checkpoint.janitor_commands import janitor_environment
from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
)

REGISTRY = StorageOwner(id="registry-1", description="the registry of these tests")


def _janitor(
    storage: Path | str, *arguments: str, **environment: str
) -> subprocess.CompletedProcess[str]:
    """Runs the janitor on the storage root `storage` (a local directory or a URI), with
    this process's environment, where storage_root put the credentials."""
    root = storage.as_uri() if isinstance(storage, Path) else storage
    env = {
        **os.environ,
        **janitor_environment("default", "orders", root, REGISTRY),
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


@pytest.fixture
def stored_job(storage_root: StorageRoot) -> str:
    """The job_storage files, on each kind of storage root; returns the job's directory."""
    root = f"{storage_root.url}/default/orders"
    for directory in ("chk-3", "chk-4", "savepoints/sp-2"):
        storage_root.write(f"{root}/{directory}/part", b"state")
    return root


def test_garbage_collection_keeps_what_is_registered(
    storage_root: StorageRoot, stored_job: str
) -> None:
    result = _janitor(storage_root.url, "collect-garbage", "--checkpoints=", "--savepoints=2")

    assert result.returncode == 0, result.stderr
    assert not storage_root.exists(f"{stored_job}/chk-3")
    assert not storage_root.exists(f"{stored_job}/chk-4")
    assert storage_root.exists(f"{stored_job}/savepoints/sp-2/part")
    assert "removed checkpoints [3, 4]" in result.stdout


@pytest.mark.local_only  # test_store covers discarding on every kind of root
def test_a_savepoint_is_discarded(storage_root: StorageRoot, stored_job: str) -> None:
    result = _janitor(storage_root.url, "discard-savepoint", "2")

    assert result.returncode == 0, result.stderr
    assert not storage_root.exists(f"{stored_job}/savepoints/sp-2")


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


# ---------------------------------------------------------------- symbolic links (issue 12, #7)


def _outside(tmp_path: Path) -> Path:
    """Files outside every job's directory that a link inside one points at."""
    outside = tmp_path / "elsewhere"
    for relative in ("ab/precious-1", "ab/precious-2", "sp-3/part", "top-file"):
        (outside / relative).parent.mkdir(parents=True, exist_ok=True)
        (outside / relative).write_text("not the job's")
    return outside


def _intact(outside: Path) -> bool:
    return all(
        (outside / relative).read_text() == "not the job's"
        for relative in ("ab/precious-1", "ab/precious-2", "sp-3/part", "top-file")
    )


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("shared", ""),  # the whole shared directory
        ("shared/ab", "ab"),  # one fan-out directory of it
        ("chk-9", "ab"),  # an unregistered checkpoint
        ("savepoints", ""),  # every savepoint (sp-3 has no _metadata: garbage)
        ("savepoints/sp-5", "sp-3"),  # one savepoint directory
        ("shared/ab/link-to-file", "top-file"),  # a file of shared/
    ],
)
def test_garbage_collection_refuses_a_symbolic_link_and_deletes_nothing(
    tmp_path: Path, job_storage: Path, link: str, target: str
) -> None:
    outside = _outside(tmp_path)
    if (job_storage / link).is_dir():
        shutil.rmtree(job_storage / link)  # replaced by the link
    (job_storage / link).parent.mkdir(parents=True, exist_ok=True)
    (job_storage / link).symlink_to(outside / target)

    result = _janitor(tmp_path, "collect-garbage", "--checkpoints=", "--savepoints=2")

    assert result.returncode == 1, result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("collect-garbage failed: ") and "is a symbolic link" in last
    assert "Traceback" not in result.stderr
    assert _intact(outside)
    assert (job_storage / "chk-3" / "part").exists(), "refused before deleting anything"


def test_discarding_a_checkpoint_through_a_linked_directory_is_refused(
    tmp_path: Path, job_storage: Path
) -> None:
    outside = _outside(tmp_path)
    (job_storage / "chk-7").symlink_to(outside / "ab")

    result = _janitor(tmp_path, "discard-checkpoint", "7")

    assert result.returncode == 1
    assert "is a symbolic link" in result.stderr.strip().splitlines()[-1]
    assert _intact(outside)


def test_discarding_a_checkpoint_whose_shared_files_are_behind_a_link_is_refused(
    tmp_path: Path, make_metadata: Callable[..., CheckpointMetadata]
) -> None:
    storage = CheckpointStorage(JobStorageLayout(tmp_path.as_uri(), "default", "orders"))
    source = tmp_path / "live" / "state" / "1.delta"
    source.parent.mkdir(parents=True)
    source.write_text("state of batch 1")
    entry = storage.add_shared_file(str(source), "state/1.delta", link=False)
    meta = make_metadata(CheckpointKind.CHECKPOINT, 1, [entry])
    storage.write_metadata(dataclasses.replace(meta, namespace="default", job="orders"))
    shared = tmp_path / "default" / "orders" / "shared"
    moved = tmp_path / "elsewhere"
    shared.rename(moved)
    shared.symlink_to(moved)

    result = _janitor(tmp_path, "discard-checkpoint", "1")

    assert result.returncode == 1
    assert "is a symbolic link" in result.stderr
    assert (moved / entry.location.removeprefix("shared/")).exists()
    assert (tmp_path / "default/orders/chk-1/_metadata").exists(), "nothing changed"


def test_discarding_a_linked_savepoint_is_refused(tmp_path: Path, job_storage: Path) -> None:
    outside = _outside(tmp_path)
    (job_storage / "savepoints" / "sp-8").symlink_to(outside / "sp-3")

    result = _janitor(tmp_path, "discard-savepoint", "8")

    assert result.returncode == 1
    assert "is a symbolic link" in result.stderr
    assert _intact(outside)


def test_a_live_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    (tmp_path / "claim").mkdir()
    (tmp_path / "claim" / "orders-1a2b").symlink_to(outside)

    result = _janitor(
        tmp_path,
        "remove-live-directory",
        "orders-1a2b",
        SPARK_CHECKPOINT_LIVE_ROOT=str(tmp_path / "claim"),
    )

    assert result.returncode == 1
    assert "is a symbolic link" in result.stderr
    assert _intact(outside)


# ---------------------------------------------------------------- bad settings (issue 12, #9)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SPARK_CHECKPOINT_NAMESPACE", "Not_A_Label"),
        ("SPARK_CHECKPOINT_NAMESPACE", "default\n"),
        ("SPARK_CHECKPOINT_JOB", "../../etc"),
        ("SPARK_CHECKPOINT_JOB", "x" * 254),
        ("SPARK_CHECKPOINT_STORAGE", "nosuchprotocol://bucket/prefix"),
        ("SPARK_CHECKPOINT_OWNER", ""),
        ("SPARK_CHECKPOINT_OWNER", '{"id": "", "description": "x"}'),
        ("SPARK_CHECKPOINT_OWNER", "registry-1"),
    ],
)
def test_a_bad_job_namespace_or_storage_exits_2_naming_it(
    tmp_path: Path, job_storage: Path, variable: str, value: str
) -> None:
    result = _janitor(tmp_path, "collect-garbage", **{variable: value})

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    named = {
        "SPARK_CHECKPOINT_NAMESPACE": "namespace",
        "SPARK_CHECKPOINT_JOB": "job",
        "SPARK_CHECKPOINT_OWNER": "SPARK_CHECKPOINT_OWNER",
    }
    assert named.get(variable, "nosuchprotocol") in result.stderr
    assert (job_storage / "chk-3").exists()


@pytest.mark.parametrize(
    "arguments",
    [
        ("discard-checkpoint", "-1"),
        ("discard-checkpoint", "٣"),  # an Arabic-Indic three: int() would take it
        ("discard-checkpoint", "3", "--retained=4,-1"),
        ("discard-savepoint", "1_0"),
        ("collect-garbage", "--checkpoints=3, 4"),
    ],
)
def test_a_bad_id_exits_2_and_deletes_nothing(
    tmp_path: Path, job_storage: Path, arguments: tuple[str, ...]
) -> None:
    result = _janitor(tmp_path, *arguments)

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "is not an id" in result.stderr
    assert (job_storage / "chk-3").exists() and (job_storage / "savepoints/sp-2").exists()


def test_without_credentials_the_failure_is_one_line_and_nothing_is_deleted(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials come only from the cleanup pod's environment; without them, the janitor
    says so in its last line (the pod's termination message), not in a traceback."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    storage_root = storage_roots("s3", tmp_path, lambda _kind: s3_server)
    storage_root.write(f"{storage_root.url}/default/orders/chk-3/part", b"state")
    nowhere = str(tmp_path / "absent")

    result = _janitor(
        storage_root.url,
        "collect-garbage",
        AWS_ACCESS_KEY_ID="",
        AWS_SECRET_ACCESS_KEY="",
        # Nor from anywhere else botocore looks.
        AWS_SHARED_CREDENTIALS_FILE=nowhere,
        AWS_CONFIG_FILE=nowhere,
        AWS_EC2_METADATA_DISABLED="true",
    )

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        # Its first request reads who the storage belongs to (CheckpointStorage.claim).
        f"collect-garbage failed: {storage_root.url}/default/orders/owner.json: "
        "NoCredentialsError: Unable to locate credentials"
    ]
    assert storage_root.exists(f"{storage_root.url}/default/orders/chk-3/part")


# verify-restorable, as a check pod runs it: the verdicts themselves are Spark's
# (tests/kubernetes/test_verify_restorable_e2e.py).


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (("external:s3a://b/sp-1", "--report=r"), "'external:s3a://b/sp-1' is not checkpoint:N"),
        (("checkpoint:-1", "--report=r"), "is not checkpoint:N or savepoint:N"),
        (("checkpoint:3",), "--report"),
    ],
)
def test_verify_restorable_bad_arguments_are_one_line_naming_them(
    tmp_path: Path, arguments: tuple[str, ...], named: str
) -> None:
    result = _janitor(tmp_path, "verify-restorable", *arguments)

    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert "verify-restorable: error:" in last and named in last, result.stderr
    assert "Traceback" not in result.stderr


def test_verify_restorable_without_spark_is_no_verdict_and_one_line(tmp_path: Path) -> None:
    report = tmp_path / "termination-log"
    report.touch()

    result = _janitor(
        tmp_path,
        "verify-restorable",
        "checkpoint:3",
        f"--report={report}",
        JAVA_HOME=str(tmp_path / "no-java"),
    )

    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("verify-restorable failed: Spark could not read checkpoint:3: "), last
    assert report.read_text() == "", "no verdict: the pod's log tail says why"


# ---------------------------------------------------------------- the storage's owner


@pytest.mark.parametrize(
    "arguments",
    [
        ("collect-garbage", "--checkpoints=4"),
        ("discard-checkpoint", "3"),
        ("discard-savepoint", "2"),
        ("claim-storage",),
    ],
)
def test_storage_of_another_registry_is_refused_in_one_line_and_nothing_is_deleted(
    tmp_path: Path, job_storage: Path, arguments: tuple[str, ...]
) -> None:
    """A job recreated under its name, or run from a second state directory, is another
    registry of the job: its janitor deleted the first one's checkpoints as garbage."""
    earlier = StorageOwner(id="registry-0", description="SparkCheckpointJob default/orders")
    (job_storage / "owner.json").write_text(earlier.encode())

    result = _janitor(tmp_path, *arguments)

    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert (
        "this job's storage belongs to SparkCheckpointJob default/orders, not to the "
        "registry of these tests" in result.stderr
    )
    assert str(job_storage / "owner.json") in result.stderr
    for directory in ("chk-3", "chk-4", "savepoints/sp-2"):
        assert (job_storage / directory / "part").read_text() == "state"


def test_unclaimed_storage_is_claimed_by_its_first_janitor_and_kept_by_it(
    tmp_path: Path, job_storage: Path
) -> None:
    first = _janitor(tmp_path, "discard-checkpoint", "3")
    again = _janitor(tmp_path, "discard-savepoint", "2")

    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert StorageOwner.decode((job_storage / "owner.json").read_text()) == REGISTRY
    assert not (job_storage / "chk-3").exists() and not (job_storage / "savepoints/sp-2").exists()
    assert (job_storage / "chk-4").exists()


def test_claiming_storage_claims_it_and_touches_nothing_else(
    tmp_path: Path, job_storage: Path
) -> None:
    """A local run's check before Spark starts that the storage can be used."""
    before = sorted(str(p.relative_to(job_storage)) for p in job_storage.rglob("*"))

    result = _janitor(tmp_path, "claim-storage")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"claimed {tmp_path.as_uri()}/default/orders\n"
    assert StorageOwner.decode((job_storage / "owner.json").read_text()) == REGISTRY
    after = sorted(str(p.relative_to(job_storage)) for p in job_storage.rglob("*"))
    assert after == sorted([*before, "owner.json"])


def test_commands_other_than_verify_restorable_start_without_pyspark() -> None:
    """Most cleanup pods discard or collect garbage: importing pyspark made each start
    slower (0.12 s of CPU here) for a module only `verify-restorable` uses."""
    loaded = modules_loaded_by("spark_checkpoint.janitor")
    assert sorted(name for name in loaded if name.split(".")[0] == "pyspark") == []
