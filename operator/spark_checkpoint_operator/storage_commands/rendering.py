"""How the storage commands show what they found: tables and summaries for people, JSON
documents for scripts."""

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_checkpoint.storage import CheckpointKind, CheckpointMetadata
from spark_checkpoint_operator.storage_commands.job import JobStorage, Registry
from spark_checkpoint_operator.storage_commands.snapshots import (
    SharedReuse,
    SnapshotRow,
    StoredSnapshotState,
    Verification,
    shared_locations,
)


def list_document(
    job: JobStorage, registry: Registry | None, rows: Sequence[SnapshotRow], now: datetime
) -> dict[str, Any]:
    """``list --json``."""
    return {
        "namespace": job.layout.namespace,
        "job": job.layout.job,
        "storage": job.layout.root,
        "jobRoot": job.layout.job_root,
        "statusFile": str(registry.source) if registry else None,
        "snapshots": [row_json(row, now) for row in rows],
    }


def list_lines(
    job: JobStorage, registry: Registry | None, rows: Sequence[SnapshotRow], now: datetime
) -> list[str]:
    """``list``: the job, its registry and a table of its snapshots."""
    lines = [f"job {job.layout.namespace}/{job.layout.job}: {job.layout.job_root}"]
    lines.append(registry_line(job.status_file, registry))
    if not rows:
        return [*lines, "no checkpoints or savepoints in storage"]
    table = [["KIND", "ID", "BATCH", "SIZE", "FILES", "AGE", "REGISTRY", "NOTE"]]
    for row in rows:
        meta = row.metadata
        table.append(
            [
                row.ref.kind.value,
                str(row.ref.snapshot_id),
                str(meta.batch_id) if meta else "-",
                human_size(meta.total_bytes) if meta else "-",
                str(len(meta.files)) if meta else "-",
                human_age(age_seconds(meta.completion_time, now)) if meta else "-",
                registry_word(row.registered),
                row_note(row),
            ]
        )
    return lines + format_table(table, right_aligned={1, 2, 3, 4, 5})


def verify_document(job: JobStorage, results: Sequence[Verification], ok: bool) -> dict[str, Any]:
    """``verify --json``."""
    return {
        "namespace": job.layout.namespace,
        "job": job.layout.job,
        "jobRoot": job.layout.job_root,
        "ok": ok,
        "snapshots": [verification_json(result) for result in results],
    }


def verify_lines(results: Sequence[Verification]) -> list[str]:
    """``verify``: a line per snapshot, one more per further problem, and a summary."""
    failed = sum(not result.ok for result in results)
    width = max(len(str(result.ref)) for result in results)
    lines = []
    for result in results:
        name = f"{result.ref!s:<{width}}"
        if result.ok:
            lines.append(f"{name}  OK      {result.files} files, {human_size(result.total_bytes)}")
            continue
        first, *rest = result.problems
        lines.append(f"{name}  FAILED  {first}")
        lines += [f"{'':<{width}}          {problem}" for problem in rest]
    lines.append(f"{len(results)} verified: {len(results) - failed} OK, {failed} failed")
    return lines


def registry_word(registered: bool | None) -> str:
    if registered is None:
        return "-"
    return "registered" if registered else "unregistered"


def registry_line(status_file: Path, registry: Registry | None) -> str:
    if registry is None:
        return f"registry: none (no readable status file at {status_file})"
    return f"registry: {registry.source}"


def row_json(row: SnapshotRow, now: datetime) -> dict[str, Any]:
    meta = row.metadata
    return {
        "kind": row.ref.kind.value,
        "id": row.ref.snapshot_id,
        "state": row.state.value,
        "registered": row.registered,
        "batchId": meta.batch_id if meta else None,
        "sizeBytes": meta.total_bytes if meta else None,
        "files": len(meta.files) if meta else None,
        "triggerTime": timestamp(meta.trigger_time) if meta else None,
        "completionTime": timestamp(meta.completion_time) if meta else None,
        "ageSeconds": age_seconds(meta.completion_time, now) if meta else None,
        "path": row.path,
        "error": row.error,
    }


def row_note(row: SnapshotRow) -> str:
    if row.state is StoredSnapshotState.COMPLETE:
        if row.registered is not False:
            return ""
        if row.ref.kind is CheckpointKind.CHECKPOINT:
            return "not in the registry: never restored from; garbage collection removes it"
        return "not in the registry: kept, a savepoint with _metadata is the user's"
    if row.state is StoredSnapshotState.UNREADABLE:
        return f"unreadable _metadata: {row.error}"
    if row.state is StoredSnapshotState.MISSING:
        return "registered but not in storage"
    if row.registered:
        return f"registered but its _metadata is missing ({row.state.value})"
    if row.state is StoredSnapshotState.INCOMPLETE:
        return "no _metadata: in flight or cut short"
    return "being discarded (_discarding present)"


def verification_json(result: Verification) -> dict[str, Any]:
    return {
        "kind": result.ref.kind.value,
        "id": result.ref.snapshot_id,
        "ok": result.ok,
        "files": result.files,
        "sizeBytes": result.total_bytes,
        "problems": list(result.problems),
    }


def describe_metadata(
    meta: CheckpointMetadata,
    *,
    path: str,
    registered: bool | None,
    reuse: SharedReuse | None,
    now: datetime,
    show_files: bool,
) -> list[str]:
    """The human summary of a `_metadata` document."""
    duration = (meta.completion_time - meta.trigger_time).total_seconds()
    shared = len(shared_locations(meta))
    shared_text = str(shared)
    if reuse is not None:
        shared_text += f" ({reuse.shared_with_others} also referenced by other checkpoints"
        if reuse.unreadable:
            unreadable = ", ".join(str(i) for i in reuse.unreadable)
            shared_text += f"; unreadable _metadata of checkpoints {unreadable} not counted"
        shared_text += ")"
    registry = {
        None: "unknown (no readable status file)",
        True: "registered",
        False: "unregistered",
    }
    fields = [
        ("metadata", path),
        ("registry", registry[registered]),
        ("format version", str(meta.format_version)),
        ("batch", str(meta.batch_id)),
        ("query id", meta.query_id),
        ("triggered", timestamp(meta.trigger_time)),
        (
            "completed",
            f"{timestamp(meta.completion_time)} ({short_duration(duration)} after the trigger, "
            f"{human_age(age_seconds(meta.completion_time, now))} ago)",
        ),
        (
            "total",
            f"{human_size(meta.total_bytes)} ({meta.total_bytes} bytes) in {len(meta.files)} files",
        ),
        ("shared files", shared_text),
    ]
    if meta.properties:
        fields.append(
            ("properties", ", ".join(f"{k}={v}" for k, v in sorted(meta.properties.items())))
        )
    width = max(len(name) for name, _ in fields) + 1
    lines = [f"{meta.kind.value} {meta.checkpoint_id} of {meta.namespace}/{meta.job}"]
    lines += [f"  {name + ':':<{width}} {value}" for name, value in fields]
    lines.append(f"  task acknowledgements ({len(meta.acknowledgements)}):")
    table = [["TASK", "FILES", "BYTES", "DURATION"]]
    table += [
        [
            ack.task,
            str(len(ack.files)),
            human_size(ack.bytes),
            short_duration(ack.duration_ms / 1000),
        ]
        for ack in meta.acknowledgements
    ]
    lines += [f"    {line}" for line in format_table(table, right_aligned={1, 2, 3})]
    if show_files:
        lines.append(f"  files ({len(meta.files)}):")
        table = [["PATH", "SIZE", "SHA256", "LOCATION"]]
        table += [
            [entry.path, human_size(entry.size), entry.sha256[:12], entry.location]
            for entry in meta.files
        ]
        lines += [f"    {line}" for line in format_table(table, right_aligned={1})]
    return lines


def human_size(size: int) -> str:
    """``17 B``, ``9.3 KiB``, ``1.2 MiB`` ..."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def human_age(seconds: float) -> str:
    """A duration the way ``kubectl get`` shows ages: ``45s``, ``5m30s``, ``3h``, ``2d``."""
    total = max(0, math.floor(seconds))
    minutes, hours, days = total // 60, total // 3600, total // 86400
    if total < 120:
        return f"{total}s"
    if minutes < 10:
        return f"{minutes}m{total % 60}s" if total % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


def short_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:.2f}s"


def age_seconds(completion_time: datetime, now: datetime) -> float:
    return (now - completion_time).total_seconds()


def timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_table(rows: Iterable[Sequence[str]], right_aligned: set[int]) -> list[str]:
    rows = [list(row) for row in rows]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[column]) if column in right_aligned else cell.ljust(widths[column])
            for column, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
