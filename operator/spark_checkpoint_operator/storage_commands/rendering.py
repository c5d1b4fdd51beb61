"""How the storage commands show what they found: tables and summaries for people, JSON
documents for scripts."""

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    printable,
    printable_line,
)
from spark_checkpoint_operator.cli_conventions import format_table
from spark_checkpoint_operator.storage_commands.job import JobStorage, Registry
from spark_checkpoint_operator.storage_commands.snapshots import (
    Inspection,
    Ownership,
    SnapshotRow,
    StoredSnapshotState,
    Verification,
    shared_locations,
)


def unrestorable_note(registry: Registry | None) -> str:
    """What `list` and `verify` say of an intact image a restored query failed on: `run
    --from` restores it, unless the job Finished (`run` refuses it, saying what to do)."""
    if registry is not None and registry.registered.finished:
        return "not restored from again"
    return "not restored from again (run --from names it to try)"


def list_document(
    job: JobStorage,
    registry: Registry | None,
    ownership: Ownership,
    rows: Sequence[SnapshotRow],
    now: datetime,
    *,
    missing: str | None = None,
) -> dict[str, Any]:
    """``list -o json|yaml``; ``nothingStored`` says why storage holds nothing of the job
    when its directory does not exist (a mistyped storage, namespace or name)."""
    owner = ownership.owner
    return {
        "namespace": job.layout.namespace,
        "job": job.layout.job,
        "storage": job.layout.root,
        "jobRoot": job.layout.job_root,
        "statusFile": str(registry.source) if registry else None,
        "owner": {"id": owner.id, "description": owner.description} if owner else None,
        "ownerProblem": ownership.problem,
        "ownerIsThisRegistry": ownership.is_this_registry,
        "nothingStored": missing,
        "snapshots": [row_json(row, now) for row in rows],
    }


def list_lines(
    job: JobStorage,
    registry: Registry | None,
    ownership: Ownership,
    rows: Sequence[SnapshotRow],
    now: datetime,
    *,
    wide: bool,
    missing: str | None = None,
) -> list[str]:
    """``list``: the job, its registry, the registry its storage belongs to and a table of
    its snapshots; ``wide`` adds when each completed, how long it took and where it is;
    ``missing`` says why storage holds none when the job's directory does not exist
    (registered snapshots are listed all the same)."""
    lines = [f"job {job.layout.namespace}/{job.layout.job}: {job.layout.job_root}"]
    lines.append(registry_line(job.status_file, registry))
    lines.append(owner_line(ownership))
    if not rows:
        return [*lines, missing or "no checkpoints or savepoints in storage"]
    if missing:
        lines.append(missing)
    header = ["KIND", "ID", "BATCH", "SIZE", "FILES", "AGE", "REGISTRY", "LABEL"]
    table = [header + (["COMPLETED", "DURATION", "PATH", "NOTE"] if wide else ["NOTE"])]
    for row in rows:
        meta = row.metadata
        cells = [
            row.ref.kind.value,
            str(row.ref.snapshot_id),
            str(meta.batch_id) if meta else "-",
            human_size(meta.total_bytes) if meta else "-",
            str(len(meta.files)) if meta else "-",
            human_age(age_seconds(meta.completion_time, now)) if meta else "-",
            registry_word(row.registered),
            row.label or "-",
        ]
        if wide:
            cells += [
                timestamp(meta.completion_time) if meta else "-",
                short_duration(duration_seconds(meta)) if meta else "-",
                row.path,
            ]
        owned_here = ownership.is_this_registry is not False
        table.append([*cells, row_note(row, owned_here=owned_here, registry=registry)])
    return lines + format_table(table, right_aligned={1, 2, 3, 4, 5})


def inspect_document(
    job: JobStorage, registry: Registry | None, inspection: Inspection
) -> dict[str, Any]:
    """``inspect -o json|yaml``: each snapshot's `_metadata` document as stored, with what
    the job says of it."""
    return {
        "namespace": job.layout.namespace,
        "job": job.layout.job,
        "jobRoot": job.layout.job_root,
        "statusFile": str(registry.source) if registry else None,
        "snapshots": [
            {
                "kind": found.ref.kind.value,
                "id": found.ref.snapshot_id,
                "metadataPath": found.metadata_path,
                "registered": found.registered,
                "sharedFiles": len(shared_locations(found.metadata)),
                "sharedWithOthers": found.reuse.shared_with_others if found.reuse else None,
                "unreadableOthers": list(found.reuse.unreadable) if found.reuse else [],
                "metadata": json.loads(found.metadata.to_json()),
            }
            for found in inspection.snapshots
        ],
        "problems": inspection.problems,
    }


def inspect_lines(inspection: Inspection, now: datetime, *, wide: bool) -> list[str]:
    """``inspect``: a line per snapshot with the essentials of its `_metadata`; ``wide``
    adds the trigger time, the tasks, the query, the registry and the `_metadata` path."""
    if not inspection.snapshots:
        return []
    header = ["KIND", "ID", "BATCH", "COMPLETED", "AGE", "DURATION", "SIZE", "FILES", "SHARED"]
    if wide:
        header += ["REUSED", "TRIGGERED", "TASKS", "QUERY", "REGISTRY", "METADATA"]
    table = [header]
    for found in inspection.snapshots:
        meta = found.metadata
        cells = [
            meta.kind.value,
            str(meta.checkpoint_id),
            str(meta.batch_id),
            timestamp(meta.completion_time),
            human_age(age_seconds(meta.completion_time, now)),
            short_duration(duration_seconds(meta)),
            human_size(meta.total_bytes),
            str(len(meta.files)),
            str(len(shared_locations(meta))),
        ]
        if wide:
            cells += [
                "-" if found.reuse is None else str(found.reuse.shared_with_others),
                timestamp(meta.trigger_time),
                str(len(meta.acknowledgements)),
                meta.query_id,
                registry_word(found.registered),
                found.metadata_path,
            ]
        table.append(cells)
    return format_table(table, right_aligned={1, 2, 4, 5, 6, 7, 8, 9, 11})


def verify_document(
    job: JobStorage, results: Sequence[Verification], ok: bool, missing: str | None = None
) -> dict[str, Any]:
    """``verify -o json|yaml``; ``nothingStored`` as in `list_document`."""
    return {
        "namespace": job.layout.namespace,
        "job": job.layout.job,
        "jobRoot": job.layout.job_root,
        "ok": ok,
        "nothingStored": missing,
        "snapshots": [verification_json(result) for result in results],
    }


def verify_lines(results: Sequence[Verification], registry: Registry | None) -> list[str]:
    """``verify``: a line per snapshot, one more per further problem, and a summary."""
    failed = sum(not result.ok for result in results)
    width = max(len(str(result.ref)) for result in results)
    lines = []
    for result in results:
        name = f"{result.ref!s:<{width}}"
        if result.ok:
            restored = ", restorable" if result.restorable else ""
            size = human_size(result.total_bytes)
            lines.append(f"{name}  OK      {result.files} files, {size}{restored}")
            if result.unrestorable is not None:
                unrestorable = printable(result.unrestorable)  # from the status file
                note = unrestorable_note(registry)
                lines.append(f"{'':<{width}}          {note}: {unrestorable}")
            continue
        first, *rest = map(printable, result.problems)  # they quote storage
        lines.append(f"{name}  FAILED  {first}")
        lines += [f"{'':<{width}}          {problem}" for problem in rest]
    deep = (
        " (--deep: each intact one restored by Spark)"
        if any(result.restorable is not None for result in results)
        else ""
    )
    lines.append(f"{len(results)} verified{deep}: {len(results) - failed} OK, {failed} failed")
    return lines


def registry_word(registered: bool | None) -> str:
    if registered is None:
        return "-"
    return "registered" if registered else "unregistered"


def registry_line(status_file: Path, registry: Registry | None) -> str:
    if registry is None:
        return f"registry: none (no readable status file at {status_file})"
    return f"registry: {registry.source}"


def owner_line(ownership: Ownership) -> str:
    if ownership.problem is not None:
        return f"owner: unreadable: {ownership.problem}"
    if ownership.owner is None:
        return "owner: none recorded (the next run or cleanup of the job claims the storage)"
    owner = f"owner: {printable_line(ownership.owner.description)}"
    if ownership.moved_here:
        return f"{owner}: this state directory's registry, copied or moved here since"
    if ownership.is_this_registry:
        return f"{owner}: this state directory's registry"
    if ownership.is_this_registry is False:
        assert ownership.registry_here is not None
        return (
            f"{owner}: not this state directory's registry ({ownership.registry_here[:8]}): "
            "runs from here are refused while the owner's checkpoints are there"
        )
    return owner


def row_json(row: SnapshotRow, now: datetime) -> dict[str, Any]:
    meta = row.metadata
    return {
        "kind": row.ref.kind.value,
        "id": row.ref.snapshot_id,
        "state": row.state.value,
        "registered": row.registered,
        "unrestorable": row.unrestorable,
        "label": row.label,
        "batchId": meta.batch_id if meta else None,
        "sizeBytes": meta.total_bytes if meta else None,
        "files": len(meta.files) if meta else None,
        "triggerTime": timestamp(meta.trigger_time) if meta else None,
        "completionTime": timestamp(meta.completion_time) if meta else None,
        "ageSeconds": age_seconds(meta.completion_time, now) if meta else None,
        "path": row.path,
        "error": row.error,
    }


def row_note(row: SnapshotRow, *, owned_here: bool, registry: Registry | None) -> str:
    """``owned_here``: the storage may belong to this state directory's registry, whose
    garbage collection then removes a checkpoint it does not list (another's never runs)."""
    if row.state is StoredSnapshotState.COMPLETE:
        if row.unrestorable is not None:
            return f"{unrestorable_note(registry)}: {row.unrestorable}"
        if row.registered is not False:
            return ""
        if row.ref.kind is CheckpointKind.CHECKPOINT and not owned_here:
            return "not in this registry: the owner's"
        if row.ref.kind is CheckpointKind.CHECKPOINT:
            # Subsumed ones too, between their registry's write and their discard (a
            # newcomer read the words as an orphan's).
            return (
                "not in the registry (subsumed, or left by a crash): never restored from; "
                "its discard or garbage collection removes it"
            )
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
        "restorable": result.restorable,
        "unrestorable": result.unrestorable,
    }


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


def duration_seconds(meta: CheckpointMetadata) -> float:
    """From the trigger to the completion of a snapshot."""
    return (meta.completion_time - meta.trigger_time).total_seconds()


def age_seconds(completion_time: datetime, now: datetime) -> float:
    return (now - completion_time).total_seconds()


def timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
