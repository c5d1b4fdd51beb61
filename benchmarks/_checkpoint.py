"""Take a checkpoint of a live Spark checkpoint location the way the agent does, with the
project's snapshot and storage modules, but synchronously and without the coordinator."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from spark_checkpoint.agent.snapshot import pin, plan_snapshot
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    ManifestEntry,
    TaskAcknowledgement,
)


def query_id_of(location: Path) -> str:
    return str(json.loads((location / "metadata").read_text())["id"])


def take_checkpoint(
    storage: CheckpointStorage,
    location: Path,
    *,
    batch_id: int,
    checkpoint_id: int,
    pin_dir: Path,
    link: bool,
    query_id: str,
    workers: int = 2,
) -> tuple[float, CheckpointMetadata]:
    """One checkpoint as the agent takes it: plan, pin (hard links), store each task's
    files (``workers`` tasks at a time, as the agent's copy pool), then ``_metadata``.
    Returns the duration in seconds and the metadata."""
    started = time.monotonic()
    trigger_time = datetime.now(UTC)
    plan = plan_snapshot(location, batch_id)
    pin(location, (f for files in plan.files_by_task.values() for f in files), pin_dir)

    def copy_task(
        task: str, files: tuple[str, ...]
    ) -> tuple[TaskAcknowledgement, list[ManifestEntry]]:
        task_started = time.monotonic()
        entries: list[ManifestEntry] = [
            storage.add_shared_file(str(pin_dir / relative), relative, link=link)
            for relative in files
        ]
        ack = TaskAcknowledgement(
            task=task,
            files=tuple(e.path for e in entries),
            bytes=sum(e.size for e in entries),
            duration_ms=int((time.monotonic() - task_started) * 1000),
        )
        return ack, entries

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda item: copy_task(*item), sorted(plan.files_by_task.items())))
    entries = [e for _ack, task_entries in results for e in task_entries]
    metadata = CheckpointMetadata(
        namespace=storage.layout.namespace,
        job=storage.layout.job,
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.CHECKPOINT,
        batch_id=batch_id,
        query_id=query_id,
        trigger_time=trigger_time,
        completion_time=datetime.now(UTC),
        acknowledgements=tuple(ack for ack, _entries in results),
        files=tuple(entries),
        total_bytes=sum(e.size for e in entries),
        properties={"benchmark": "true"},
    )
    storage.write_metadata(metadata)
    shutil.rmtree(pin_dir)
    return time.monotonic() - started, metadata
