"""Fixtures for the checkpoint storage tests: a job's storage on each kind of storage root,
a stand-in for the live Spark checkpoint location, and builders for manifests.

Every test that uses `storage_root` (directly or through `layout` and `storage`) runs four
times: on the local filesystem, on S3 (moto's server), on Google Cloud Storage
(fake-gcs-server) and on Azure Blob Storage (Azurite), each server started once per session
on a loopback port (tests/conftest.py). A test marked `local_only` runs once, on the local
filesystem: it is about what only a local filesystem has (hard links, symbolic links, fsync,
rename), or about what does not depend on the storage (argument checks, parsing), which keeps
the object-store runs to what they add.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from helpers.objectstore import StorageRoot, parametrize_storage_roots, storage_root_for
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    ManifestEntry,
    TaskAcknowledgement,
)
from spark_checkpoint.storage import durability as durability_module

NAMESPACE = "team-a"
JOB = "orders.v2"
TRIGGER_TIME = datetime(2026, 11, 21, 23, 59, 0, 123456, tzinfo=UTC)
COMPLETION_TIME = datetime(2026, 11, 21, 23, 59, 2, 654321, tzinfo=UTC)


def build_metadata(
    kind: CheckpointKind,
    snapshot_id: int,
    files: Sequence[ManifestEntry],
    *,
    batch_id: int = 7,
    acknowledge: bool = True,
) -> CheckpointMetadata:
    """A consistent manifest: one acknowledgement per file when `acknowledge`."""
    acknowledgements = (
        tuple(
            TaskAcknowledgement(
                task=f"task-{index}", files=(entry.path,), bytes=entry.size, duration_ms=3
            )
            for index, entry in enumerate(files)
        )
        if acknowledge
        else ()
    )
    return CheckpointMetadata(
        namespace=NAMESPACE,
        job=JOB,
        checkpoint_id=snapshot_id,
        kind=kind,
        batch_id=batch_id,
        query_id="5f0c7a52-1d5e-4a36-9d7e-0d6b1e1b7c11",
        trigger_time=TRIGGER_TIME,
        completion_time=COMPLETION_TIME,
        acknowledgements=acknowledgements,
        files=tuple(files),
        total_bytes=sum(entry.size for entry in files),
        properties={"spark.sql.shuffle.partitions": "4"},
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_storage_roots(metafunc, "storage_root")


@pytest.fixture
def storage_root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> StorageRoot:
    """A fresh, empty storage root; its credentials are in the environment, as in a pod."""
    return storage_root_for(request, tmp_path / "storage", monkeypatch)


@pytest.fixture
def layout(storage_root: StorageRoot) -> JobStorageLayout:
    return JobStorageLayout(storage_root.url, NAMESPACE, JOB)


@pytest.fixture
def storage(layout: JobStorageLayout) -> CheckpointStorage:
    return CheckpointStorage(layout)


@pytest.fixture
def spark_dir(tmp_path: Path) -> Path:
    """Stands in for the live Spark checkpoint location."""
    return tmp_path / "spark"


@pytest.fixture
def spark_file(spark_dir: Path) -> Callable[[str, bytes], str]:
    """Creates a file at a path inside the Spark checkpoint location; returns its local path."""

    def make(path: str, content: bytes) -> str:
        local = spark_dir / path
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(content)
        return str(local)

    return make


@pytest.fixture
def make_metadata() -> Callable[..., CheckpointMetadata]:
    return build_metadata


# A power loss cannot be simulated here, so durability is observed at the system calls that
# provide it: which paths were fsynced, and which filesystems syncfs was called on.
DurabilityCall = tuple[str, str]


@pytest.fixture
def durability_calls(monkeypatch: pytest.MonkeyPatch) -> list[DurabilityCall]:
    """The calls, in order, by which `make_durable` made files durable: ("fsync", path) and
    ("syncfs", device number of the filesystem synced). Both still do their work."""
    calls: list[DurabilityCall] = []
    fsync_path = durability_module.fsync_path
    syncfs = durability_module._syncfs

    def recorded_fsync(path: str) -> None:
        calls.append(("fsync", path))
        fsync_path(path)

    def recorded_syncfs(descriptor: int) -> int:
        calls.append(("syncfs", str(os.fstat(descriptor).st_dev)))
        assert syncfs is not None
        return syncfs(descriptor)

    monkeypatch.setattr(durability_module, "fsync_path", recorded_fsync)
    if syncfs is not None:
        monkeypatch.setattr(durability_module, "_syncfs", recorded_syncfs)
    return calls


def choose_syncfs(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make `make_durable` choose syncfs for `directory`'s filesystem, as it does while
    the system holds no dirty data; skip where it never would (no syncfs, or a filesystem
    it is not used on, e.g. a tmpfs)."""
    if durability_module._syncfs is None or durability_module._fstatfs is None:
        pytest.skip("the C library has no syncfs or fstatfs")
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        filesystem = durability_module._filesystem_type(descriptor)
    finally:
        os.close(descriptor)
    if filesystem not in durability_module._SYNCFS_FILESYSTEMS:
        pytest.skip(f"{directory} is on a filesystem (type {filesystem}) syncfs is not used on")
    monkeypatch.setattr(durability_module, "_dirty_bytes", lambda: 0)


def choose_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `make_durable` fsync, as where the C library has no syncfs."""
    monkeypatch.setattr(durability_module, "_syncfs", None)
