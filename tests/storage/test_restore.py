"""Restore with fallback (spark_checkpoint.restore) on every kind of storage root: a damaged
newest image is skipped with its reason and the previous one is restored, and an external
savepoint is read from its `_metadata` URI on the same store."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest
from s3fs import S3FileSystem

from helpers.objectstore import S3Server, StorageRoot
from spark_checkpoint.exit_codes import STORAGE_UNAVAILABLE
from spark_checkpoint.protocol import RestoreCandidate
from spark_checkpoint.restore import RestoreFailed, StorageUnavailable, restore
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    StorageAccessError,
)
from spark_checkpoint_operator.supervisor.driver_errors import passes

SparkFile = Callable[[str, bytes], str]
MetadataMaker = Callable[..., CheckpointMetadata]
SPARK_METADATA = b'{"id":"5f0c7a52-1d5e-4a36-9d7e-0d6b1e1b7c11"}'
# Checkpoints 2 and 1, as the runtime passes registered images: newest first.
NEWEST_FIRST = (
    RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 2),
    RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 1),
)


@pytest.fixture
def checkpoint(
    storage: CheckpointStorage, spark_file: SparkFile, make_metadata: MetadataMaker
) -> Callable[[int, bytes], CheckpointMetadata]:
    """Takes checkpoint N of Spark's `metadata` file and the offsets of batch N."""

    def take(checkpoint_id: int, offsets: bytes) -> CheckpointMetadata:
        # Spark writes a new file per batch; it never rewrites one (which hard links share).
        files = {"metadata": SPARK_METADATA, f"offsets/{checkpoint_id}": offsets}
        entries = [storage.add_shared_file(spark_file(p, c), p) for p, c in files.items()]
        meta = make_metadata(CheckpointKind.CHECKPOINT, checkpoint_id, entries)
        storage.write_metadata(meta)
        return meta

    return take


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    storage: CheckpointStorage,
    checkpoint: Callable[[int, bytes], CheckpointMetadata],
    storage_root: StorageRoot,
    tmp_path: Path,
) -> None:
    checkpoint(1, b"batch 1")
    newest = checkpoint(2, b"batch 2")
    damaged = storage.layout.location_path(newest.files[1].location)
    storage_root.write(damaged, b"batch 3")  # same size, other bytes
    target = tmp_path / "restored"

    outcome = restore(
        storage,
        NEWEST_FIRST,
        target,
    )

    assert outcome is not None and str(outcome.candidate) == "checkpoint:1"
    assert str(outcome.skipped[0].candidate) == "checkpoint:2"
    assert outcome.skipped[0].reason.startswith(f"{damaged}: sha256 mismatch")
    assert (target / "offsets" / "1").read_bytes() == b"batch 1"
    assert not (target / "offsets" / "2").exists()


@pytest.mark.parametrize(
    "crafted",
    [b'{"a":' * 200_000, b'{"format_version": ' + b"9" * 5000 + b"}"],
    ids=["nested-too-deeply", "too-many-digits"],
)
def test_a_crafted_newest_metadata_falls_back_to_the_previous_image(
    storage: CheckpointStorage,
    checkpoint: Callable[[int, bytes], CheckpointMetadata],
    storage_root: StorageRoot,
    tmp_path: Path,
    crafted: bytes,
) -> None:
    # The security review's case: the parser's RecursionError, or its ValueError for a
    # number it refuses, ended the restore instead of the image.
    checkpoint(1, b"batch 1")
    newest = storage.layout.metadata_path(CheckpointKind.CHECKPOINT, 2)
    storage_root.write(newest, crafted)

    outcome = restore(
        storage,
        NEWEST_FIRST,
        tmp_path / "restored",
    )

    assert outcome is not None and str(outcome.candidate) == "checkpoint:1"
    assert outcome.skipped[0].reason.startswith(f"{newest}: not parseable as JSON (")


def test_with_every_image_unreadable_restore_fails_naming_each(
    storage: CheckpointStorage,
    checkpoint: Callable[[int, bytes], CheckpointMetadata],
    storage_root: StorageRoot,
    tmp_path: Path,
) -> None:
    meta = checkpoint(1, b"batch 1")
    storage_root.delete(storage.layout.location_path(meta.files[0].location))

    with pytest.raises(RestoreFailed) as raised:
        restore(
            storage,
            (
                RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 1),
                RestoreCandidate.registered(CheckpointKind.SAVEPOINT, 9),
            ),
            tmp_path / "restored",
        )

    assert "checkpoint:1: " in str(raised.value)
    assert f"savepoint:9: {storage.layout.metadata_path(CheckpointKind.SAVEPOINT, 9)}" in str(
        raised.value
    )
    assert not (tmp_path / "restored").exists()


def test_an_external_savepoint_on_the_store_is_restored(
    storage_root: StorageRoot,
    spark_file: SparkFile,
    make_metadata: MetadataMaker,
    tmp_path: Path,
) -> None:
    source = CheckpointStorage(JobStorageLayout(f"{storage_root.url}/other", "team-a", "orders.v2"))
    files = {"metadata": SPARK_METADATA, "offsets/0": b"batch 1"}
    entries = [source.add_savepoint_file(3, spark_file(p, c), p) for p, c in files.items()]
    source.write_metadata(make_metadata(CheckpointKind.SAVEPOINT, 3, entries))
    fork = CheckpointStorage(JobStorageLayout(f"{storage_root.url}/mine", "team-a", "fork"))
    uri = source.layout.metadata_path(CheckpointKind.SAVEPOINT, 3)
    target = tmp_path / "restored"

    outcome = restore(fork, (RestoreCandidate.external(uri),), target)

    assert outcome is not None and outcome.batch_id == 7
    assert (target / "offsets" / "0").read_bytes() == b"batch 1"


@pytest.mark.local_only  # the failure is made here; the stores' own: the test below
@pytest.mark.parametrize(
    "failure",
    [
        TimeoutError(errno.ETIMEDOUT, "Read timeout on endpoint URL"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        OSError(errno.EBUSY, "Please reduce your request rate."),  # s3fs's SlowDown
        StorageAccessError("s3://bucket/chk-2", "EndpointConnectionError: no answer"),
    ],
    ids=["timeout", "reset", "slow-down", "no-answer"],
)
def test_storage_that_does_not_answer_fails_the_attempt_without_passing_the_image_over(
    storage: CheckpointStorage,
    checkpoint: Callable[[int, bytes], CheckpointMetadata],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failure: Exception,
) -> None:
    """A read storage did not answer says nothing of the image: passed over, it was never
    restored again and the job rolled back to an older one (or failed for good with none
    left; an object-store review's). The attempt's error passes: it is retried however
    often it comes."""
    checkpoint(1, b"batch 1")
    checkpoint(2, b"batch 2")

    def unreadable(*_args: object) -> None:
        raise failure

    monkeypatch.setattr(CheckpointStorage, "materialize", unreadable)
    target = tmp_path / "restored"

    with pytest.raises(StorageUnavailable) as raised:
        restore(
            storage,
            NEWEST_FIRST,
            target,
        )

    said = str(raised.value)
    assert said.startswith(f"{STORAGE_UNAVAILABLE}: checkpoint:2 ({failure}); it is not "), said
    assert passes([said])
    assert not target.exists()


@pytest.mark.local_only
def test_a_refused_read_passes_the_image_over_as_a_missing_file_does(
    storage: CheckpointStorage,
    checkpoint: Callable[[int, bytes], CheckpointMetadata],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S3 answers the read of a missing object 403 without the right to list, and of an
    archived one too: a refusal is the image's, which a retry would meet for ever."""
    checkpoint(1, b"batch 1")
    checkpoint(2, b"batch 2")
    materialize = CheckpointStorage.materialize

    def refused_once(self: CheckpointStorage, metadata: CheckpointMetadata, target: str) -> None:
        if metadata.checkpoint_id == 2:
            raise PermissionError(errno.EACCES, "Access Denied")
        materialize(self, metadata, target)

    monkeypatch.setattr(CheckpointStorage, "materialize", refused_once)

    outcome = restore(
        storage,
        NEWEST_FIRST,
        tmp_path / "restored",
    )

    assert outcome is not None and str(outcome.candidate) == "checkpoint:1"
    assert "Access Denied" in outcome.skipped[0].reason


def test_an_external_savepoint_without_credentials_is_not_passed_over(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's environment has no credentials for the savepoint's bucket: restore
    names the failure instead of crashing the driver, and the attempt fails (the next may
    have them)."""
    nowhere = str(tmp_path / "absent")
    for name, value in {
        **s3_server.environment(),
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SHARED_CREDENTIALS_FILE": nowhere,
        "AWS_CONFIG_FILE": nowhere,
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    # fsspec reuses filesystem objects made with the same arguments: one made here reads
    # this environment, and none made here is reused later.
    S3FileSystem.clear_instance_cache()
    monkeypatch.setattr(S3FileSystem, "cachable", False)
    uri = f"s3://{s3_server.bucket}/elsewhere/team-a/orders.v2/savepoints/sp-3/_metadata"
    fork = CheckpointStorage(JobStorageLayout(str(tmp_path / "mine"), "team-a", "fork"))

    with pytest.raises(StorageUnavailable) as raised:
        restore(fork, (RestoreCandidate.external(uri),), tmp_path / "restored")

    assert str(raised.value) == (
        f"{STORAGE_UNAVAILABLE}: external:{uri} ({uri}: NoCredentialsError: Unable to "
        "locate credentials); it is not passed over: the next attempt restores it if "
        "storage answers then"
    )
