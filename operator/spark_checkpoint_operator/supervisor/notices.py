"""What the supervisor tells the user (a Kubernetes event, a line of the local runner),
and how it words drivers' exits and completed images."""

import logging
import signal
from dataclasses import dataclass
from enum import StrEnum

from spark_checkpoint.protocol import CollectGarbageAnswer
from spark_checkpoint_operator.coordinator import CheckpointKind, CompletedCheckpoint, FailureReason

log = logging.getLogger(__name__)


class Level(StrEnum):
    DETAIL = "detail"  # routine progress: logged, not an event
    NOTE = "note"  # worth an event: restores, savepoints, terminations
    WARNING = "warning"  # something failed


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should be told; ``reason`` is CamelCase (a Kubernetes event's)."""

    reason: str
    level: Level
    message: str
    # The label of the user request the notice is about (a decline, a failure, a snapshot
    # given up), so that whoever made the request can tell its answer from another's.
    label: str = ""
    # The image (a restore candidate's spelling) a restore notice is about.
    image: str = ""
    # Why a request was declined or its checkpoint failed (a decline because the job stops
    # is no failure of the request's own).
    cause: FailureReason | None = None


def log_notice(notice: Notice) -> None:
    log.log(logging.WARNING if notice.level is Level.WARNING else logging.INFO, notice.message)


# The exit code of a driver gone without one (a pod deleted before its container's end
# was seen): a process exits 0..255, and a negative code is the signal that killed it.
DRIVER_GONE = -1024


def describe_exit(exit_code: int) -> str:
    """A driver's exit as a person reads it: a negative code is the signal that killed it."""
    if exit_code == DRIVER_GONE:
        return "its pod was deleted"
    if exit_code >= 0:
        return f"exit {exit_code}"
    try:
        return f"killed by {signal.Signals(-exit_code).name}"
    except ValueError:
        return f"killed by signal {-exit_code}"


def error_lines(error: list[str]) -> str:
    """A driver's error lines as the indented tail of a notice."""
    return "".join(f"\n    {line}" for line in ["its error:", *error]) if error else ""


def completion_reason(completed: CompletedCheckpoint) -> str:
    return (
        "SavepointCompleted"
        if completed.kind is CheckpointKind.SAVEPOINT
        else "CheckpointCompleted"
    )


def describe_completion(completed: CompletedCheckpoint) -> str:
    label = f" ({completed.label})" if completed.label else ""
    return (
        f"{completed.kind.value} {completed.checkpoint_id} complete{label}: batch "
        f"{completed.batch_id}, {completed.size_bytes / 1024:.1f} KiB, {completed.duration:.2f}s"
    )


def describe_garbage(report: CollectGarbageAnswer) -> str:
    """What garbage collection removed, in words; empty if nothing."""
    removed = [
        f"unregistered {kind}{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"
        for kind, ids in (("checkpoint", report.checkpoints), ("savepoint", report.savepoints))
        if ids
    ]
    if report.shared_files:
        removed.append(f"{report.shared_files} unreferenced shared file(s)")
    return ", ".join(removed[:-1]) + " and " + removed[-1] if len(removed) > 1 else "".join(removed)
