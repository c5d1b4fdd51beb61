"""The checkpoint agent (no Spark, a synthetic live location) taking incremental checkpoints
on each kind of storage root: what the driver does, on S3 and Azure Blob Storage too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.agent import Running
from helpers.objectstore import S3Server, StorageRoot
from spark_checkpoint.protocol import AfterCompletion, SnapshotPhase, SnapshotStatus
from spark_checkpoint.storage import CheckpointKind, CheckpointMetadata

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

    assert second.batch_id == first.batch_id + 1
    running.storage.verify(second)
    shared = {entry.location for entry in first.files} & {e.location for e in second.files}
    new = {entry.path for entry in second.files if entry.location not in shared}
    assert new <= new_files  # files of earlier batches are referenced, not stored again
    if s3 is not None and before is not None:  # the server counts what it was sent
        requests = s3.requests.snapshot() - before
        # The new files and `_metadata`; `shared/` listed when the snapshot starts and
        # before `_metadata` is written; nothing asked about each unchanged file.
        assert requests == {"PUT": len(new) + 1, "LIST": 2}, requests
