"""Snapshots written by the previous version (`_metadata` format 1) keep working.

`fixtures/format-1/` is a job's storage as the format 1 writer left it (see its README):
checkpoints 2 and 3, which share files, and savepoint 1. Each test copies it onto the
storage root under test (local, S3, Azure) and uses it the way the product does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from helpers.objectstore import StorageRoot
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointStorage,
    GarbageReport,
    JobStorageLayout,
)

FIXTURE = Path(__file__).parent / "fixtures" / "format-1"
CHECKPOINT, SAVEPOINT = CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT
# The Spark checkpoint files the fixture was written from.
CONTENTS = {
    "metadata": b'{"id":"5f0c7a52-1d5e-4a36-9d7e-0d6b1e1b7c11"}\n',
    "offsets/3": b"v1\n{}\n3\n",
    "commits/3": b"v1\n{}\n",
    "offsets/4": b"v1\n{}\n4\n",
    "commits/4": b"v1\n{}\n",
    "state/0/0/4.delta": b"delta 0/0 version 4",
    "state/0/1/4.delta": b"delta 0/1 version 4",
    "state/0/0/5.delta": b"delta 0/0 version 5",
    "state/0/1/5.delta": b"delta 0/1 version 5",
}
IMAGE_OF_CHECKPOINT_2 = {
    "metadata",
    "offsets/3",
    "commits/3",
    "state/0/0/4.delta",
    "state/0/1/4.delta",
}
IMAGE_OF_CHECKPOINT_3 = set(CONTENTS) - {"commits/3"}


@pytest.fixture
def storage(storage_root: StorageRoot) -> CheckpointStorage:
    for file in sorted(FIXTURE.rglob("*")):
        if file.is_file() and file.name != "README.md":
            relative = file.relative_to(FIXTURE).as_posix()
            storage_root.write(f"{storage_root.url}/{relative}", file.read_bytes())
    return CheckpointStorage(JobStorageLayout(storage_root.url, "team-a", "orders.v2"))


@pytest.mark.local_only
def test_the_fixture_is_format_1() -> None:
    for metadata in FIXTURE.rglob("_metadata"):
        assert metadata.read_bytes().startswith(b'{\n  "format_version": 1,\n'), metadata


@pytest.mark.parametrize(
    ("kind", "snapshot_id", "image"),
    [
        (CHECKPOINT, 2, IMAGE_OF_CHECKPOINT_2),
        (CHECKPOINT, 3, IMAGE_OF_CHECKPOINT_3),
        (SAVEPOINT, 1, IMAGE_OF_CHECKPOINT_3),
    ],
)
def test_a_format_1_snapshot_is_read_verified_and_restored(
    storage: CheckpointStorage,
    tmp_path: Path,
    kind: CheckpointKind,
    snapshot_id: int,
    image: set[str],
) -> None:
    meta = storage.read_metadata(kind, snapshot_id)
    storage.verify(meta)
    storage.materialize(meta, str(tmp_path / "restored"))

    assert meta.format_version == 1
    assert {e.path for e in meta.files} == image
    restored = {
        f.relative_to(tmp_path / "restored").as_posix(): f.read_bytes()
        for f in (tmp_path / "restored").rglob("*")
        if f.is_file()
    }
    assert restored == {path: CONTENTS[path] for path in image}


def test_format_1_and_format_2_checkpoints_share_files_and_are_collected_by_reference(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    # A checkpoint written now (format 2) of the same image as checkpoint 3 (format 1).
    previous = storage.read_metadata(CHECKPOINT, 3)
    storage.write_metadata(dataclasses.replace(previous, checkpoint_id=4, format_version=2))
    only_in_2 = storage.read_metadata(CHECKPOINT, 2).locations - previous.locations

    report = storage.collect_garbage(registered_checkpoints=[3, 4], registered_savepoints=[1])

    assert report == GarbageReport(
        checkpoint_ids=(2,), savepoint_ids=(), shared_locations=tuple(sorted(only_in_2))
    )
    storage.discard_checkpoint(3, retained=[4])
    new = storage.read_metadata(CHECKPOINT, 4)
    assert new.format_version == 2
    storage.verify(new)
    storage.materialize(new, str(tmp_path / "restored"))
    assert storage.list_ids(CHECKPOINT) == [4]
    assert storage.read_metadata(SAVEPOINT, 1).format_version == 1


def test_discarding_a_format_1_checkpoint_keeps_what_a_retained_one_references(
    storage: CheckpointStorage, storage_root: StorageRoot
) -> None:
    kept = storage.read_metadata(CHECKPOINT, 3)
    only_in_2 = storage.read_metadata(CHECKPOINT, 2).locations - kept.locations

    storage.discard_checkpoint(2, retained=[3])

    assert storage.list_ids(CHECKPOINT) == [3]
    storage.verify(kept)
    assert only_in_2
    for location in only_in_2:
        assert not storage_root.exists(storage.layout.location_path(location))
