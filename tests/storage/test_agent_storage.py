"""The checkpoint agent (no Spark, a synthetic live location) taking incremental checkpoints
on each kind of storage root: what the driver does, on S3 and Azure Blob Storage too."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.agent import Running
from helpers.objectstore import S3Server, StorageRoot
from spark_checkpoint.protocol import AfterCompletion, SnapshotPhase, SnapshotStatus
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    FileDigest,
    JobStorageLayout,
    MissingFileError,
)
from spark_checkpoint.storage import store as store_module

CHECKPOINT = CheckpointKind.CHECKPOINT


@pytest.fixture
def running(storage_root: StorageRoot, tmp_path: Path) -> Iterator[Running]:
    job = Running(tmp_path, storage_root=storage_root.url)
    yield job
    job.agent.close()


def _checkpoint(job: Running, checkpoint_id: int) -> CheckpointMetadata:
    """Trigger, wait for every task's acknowledgement, finalize and complete."""
    job.agent.trigger(checkpoint_id, CHECKPOINT, AfterCompletion.CONTINUE)
    deadline = time.monotonic() + 30
    snapshot: SnapshotStatus | None = None
    while snapshot is None or snapshot.state is not SnapshotPhase.ACKNOWLEDGED:
        assert time.monotonic() < deadline, f"checkpoint {checkpoint_id} stuck: {snapshot}"
        time.sleep(0.05)
        found = [s for s in job.agent.status().checkpoints if s.checkpoint_id == checkpoint_id]
        snapshot = found[0] if found else None
    job.agent.finalize(checkpoint_id, [ack.task for ack in snapshot.acks])
    metadata = job.storage.read_metadata(CHECKPOINT, checkpoint_id)
    job.agent.complete(checkpoint_id, metadata.batch_id)
    return metadata


def _next_batch(job: Running, batch: int) -> set[str]:
    """Spark commits `batch`: new offsets, commit and state files; returns their paths."""
    files = {
        f"offsets/{batch}": f"offsets {batch}",
        f"commits/{batch}": f"commit {batch}",
        f"sources/0/{batch}": f"source {batch}",
        **{f"state/0/{p}/{batch + 1}.delta": f"delta {p} {batch + 1}" * 50 for p in range(2)},
    }
    for relative, text in files.items():
        (job.location / relative).write_text(text)
    return set(files)


def test_the_agent_checkpoints_incrementally(
    running: Running, storage_root: StorageRoot, request: pytest.FixtureRequest
) -> None:
    first = _checkpoint(running, 1)
    new_files = _next_batch(running, 3)
    s3: S3Server | None = (
        request.getfixturevalue("s3_server") if storage_root.kind == "s3" else None
    )
    before = None if s3 is None else s3.requests.snapshot()

    second = _checkpoint(running, 2)

    after = None if s3 is None else s3.requests.snapshot()
    assert second.batch_id == first.batch_id + 1
    running.storage.verify(second)
    shared = {entry.location for entry in first.files} & {e.location for e in second.files}
    new = {entry.path for entry in second.files if entry.location not in shared}
    assert new <= new_files  # files of earlier batches are referenced, not stored again
    if after is not None and before is not None:  # the server counts what it was sent
        requests = after - before
        # The new files and `_metadata`; `shared/` listed before `_metadata` is written
        # (the snapshot starts from what the previous one's listing found); nothing asked
        # about each unchanged file. (The test reads `_metadata` back: one ranged GET.)
        assert requests == {"PUT": len(new) + 1, "LIST": 1, "GET": 1}, requests


def test_files_the_newest_completed_checkpoint_has_unchanged_are_not_pinned_or_hashed(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unchanged file (same name, same identity in the live location) of the newest
    completed checkpoint is referenced where it is stored: no pin, hash or storage lookup.
    A file rewritten under its name is stored again, and after that checkpoint is
    discarded nothing is reused (its files may be gone)."""
    _checkpoint(running, 1)
    new_files = _next_batch(running, 3)
    (running.location / "sources/0/1").write_text("rewritten, longer than before")
    hashed: list[str] = []
    digest = store_module.digest_local_file

    def recorded_digest(path: str) -> FileDigest:
        hashed.append(Path(path).relative_to(running.root / "pins" / "chk-2").as_posix())
        return digest(path)

    monkeypatch.setattr(store_module, "digest_local_file", recorded_digest)

    second = _checkpoint(running, 2)

    assert sorted(hashed) == sorted(new_files | {"sources/0/1"})
    assert not (running.root / "pins" / "chk-2").exists()
    running.storage.verify(second)
    (rewritten,) = [e for e in second.files if e.path == "sources/0/1"]
    assert rewritten.size == len("rewritten, longer than before")

    running.agent.discard_checkpoint(2, retained=[1])
    monkeypatch.setattr(store_module, "digest_local_file", digest)
    third = _checkpoint(running, 3)

    running.storage.verify(third)
    assert {e.path for e in third.files} == {e.path for e in second.files}


def test_a_stored_file_deleted_behind_the_jobs_back_fails_one_checkpoint_then_is_stored_again(
    running: Running, storage_root: StorageRoot
) -> None:
    """A file of the newest completed checkpoint that someone else deleted (a bucket's
    lifecycle rule, a person) is found missing when the next `_metadata` would name it: that
    checkpoint fails, naming it, and the one after stores it again, where the completed
    checkpoint finds it too. Before, every later checkpoint reused the missing file."""
    first = _checkpoint(running, 1)
    new_files = _next_batch(running, 3)
    gone = next(entry for entry in first.files if entry.path not in new_files)
    someone_else = CheckpointStorage(JobStorageLayout(storage_root.url, "default", "wordcount"))
    someone_else.fs.delete_file(someone_else.layout.location_path(gone.location))

    with pytest.raises(MissingFileError, match=re.escape(repr(gone.path))):
        _checkpoint(running, 2)
    running.agent.abort(2, "finalize failed")
    _next_batch(running, 4)
    third = _checkpoint(running, 3)

    assert gone in third.files
    running.storage.verify(third)
    running.storage.verify(first)
