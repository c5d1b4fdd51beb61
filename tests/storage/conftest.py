"""Fixtures for the checkpoint storage tests: a job's storage on each kind of storage root,
a stand-in for the live Spark checkpoint location, and builders for manifests.

Every test that uses `storage_root` (directly or through `layout` and `storage`) runs three
times: on the local filesystem, on S3 (moto's server) and on Azure Blob Storage (Azurite),
each server started once per session on a loopback port (tests/conftest.py). A test marked
`local_only` runs once, on the local filesystem: it is about what only a local filesystem has
(hard links, symbolic links, fsync, rename), or about what does not depend on the storage
(argument checks, parsing), which keeps the object-store runs to what they add.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from helpers.objectstore import StorageRoot, storage_roots
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    ManifestEntry,
    TaskAcknowledgement,
)

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


ROOT_KINDS = ("local", "s3", "azure")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "storage_root" in metafunc.fixturenames:
        local_only = metafunc.definition.get_closest_marker("local_only") is not None
        metafunc.parametrize("storage_root", ["local"] if local_only else ROOT_KINDS, indirect=True)


@pytest.fixture
def storage_root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> StorageRoot:
    """A fresh, empty storage root; its credentials are in the environment, as in a pod."""
    servers = {"s3": "s3_server", "azure": "azure_server"}
    root = storage_roots(
        request.param, tmp_path / "storage", lambda kind: request.getfixturevalue(servers[kind])
    )
    for name, value in root.environment.items():
        monkeypatch.setenv(name, value)
    return root


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
