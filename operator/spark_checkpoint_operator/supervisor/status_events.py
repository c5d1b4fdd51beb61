"""The agent's status document (`spark_checkpoint.protocol.AgentStatus`) read as
coordinator events (docs/agent-protocol.md, "The status document").

The agent lists each snapshot in flight with all its acknowledgements and declines until
the snapshot is done; each is fed to the coordinator once. A snapshot the coordinator
neither waits for nor registered is reported once, to be dropped at the agent.
"""

import contextlib
from collections.abc import Collection
from dataclasses import dataclass, replace

from spark_checkpoint.protocol import (
    AgentStatus,
    ProtocolError,
    QueryState,
    RestoreCandidate,
    RestoredFrom,
    SkippedImage,
    SnapshotPhase,
    SnapshotStatus,
)
from spark_checkpoint_operator.coordinator import (
    SnapshotCaptured,
    StoredIdsReported,
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    shortened,
)


@dataclass(frozen=True, slots=True)
class UnknownSnapshot:
    """Triggered before this runtime restarted, or aborted while the agent was unreachable:
    the agent drops it and unpins its files; its id is never used again."""

    checkpoint_id: int


Progress = SnapshotCaptured | TaskAcknowledged | TaskDeclined | UnknownSnapshot


def restore_within_bounds(
    restored: RestoredFrom, candidates: Collection[str]
) -> RestoredFrom | None:
    """What the driver says it restored, as the job's status keeps it: an image among the
    candidates it was given (else nothing), the images it passed over only among them, each
    once, and why in a short message. The driver runs the job author's code; thousands of
    long reasons, or a source of megabytes, kept its status from being written, for good
    (the hostile reviewer's, then a reviewer's)."""
    given = set()
    for candidate in candidates:  # as the driver read them
        with contextlib.suppress(ProtocolError):
            given.add(RestoreCandidate.decode(candidate).encode())
    if restored.candidate.encode() not in given:
        return None
    kept: dict[str, SkippedImage] = {}
    for image in restored.skipped:
        source = image.candidate.encode()
        if source in given and source not in kept:
            kept[source] = replace(image, reason=shortened(image.reason))
    return replace(restored, skipped=tuple(kept.values()))


def tasks_reported(status: AgentStatus, executors_ready: bool) -> TasksReported:
    """The tasks a checkpoint needs now; not all running while an executor is replaced."""
    return TasksReported(frozenset(status.tasks), status.all_tasks_running and executors_ready)


def stored_ids_reported(status: AgentStatus) -> StoredIdsReported | None:
    """The ids taken in the job's storage when the driver started: the coordinator's continue
    above them."""
    highest = status.highest_stored_id
    return None if highest is None else StoredIdsReported(highest)


def input_exhausted_at(status: AgentStatus) -> int | None:
    """The last batch of bounded input, once the query waits for its final checkpoint."""
    return status.query.last_committed_batch if status.awaiting_final_checkpoint else None


def finished_and_told(status: AgentStatus) -> bool:
    """The query ended and a completion the driver was told of covers its last batch: the
    driver exits without waiting for a final checkpoint."""
    return status.query.state is QueryState.FINISHED and not status.awaiting_final_checkpoint


class SnapshotProgress:
    """Remembers what was fed of each snapshot while the agent lists it: a job runs for
    months, so what it no longer lists is forgotten."""

    def __init__(self) -> None:
        self._fed_acks: set[tuple[int, str]] = set()
        self._fed_declines: set[tuple[int, str]] = set()
        self._dropped: set[int] = set()
        self._captured: set[int] = set()

    def read(self, status: AgentStatus, known: set[int]) -> list[Progress]:
        """What is new in ``status``, in the agent's order, for the snapshots the
        coordinator knows (``known``: pending or registered); the others are unknown."""
        progress: list[Progress] = []
        in_flight = {snapshot.checkpoint_id for snapshot in status.checkpoints}
        for snapshot in status.checkpoints:
            checkpoint_id = snapshot.checkpoint_id
            if checkpoint_id in known:
                progress.extend(self._new(snapshot))
            elif checkpoint_id not in self._dropped:
                self._dropped.add(checkpoint_id)
                progress.append(UnknownSnapshot(checkpoint_id))
        self._fed_acks = {key for key in self._fed_acks if key[0] in in_flight}
        self._fed_declines = {key for key in self._fed_declines if key[0] in in_flight}
        self._dropped &= in_flight
        self._captured &= in_flight
        return progress

    def _new(self, snapshot: SnapshotStatus) -> list[Progress]:
        checkpoint_id = snapshot.checkpoint_id
        progress: list[Progress] = []
        if snapshot.state is not SnapshotPhase.CAPTURING and checkpoint_id not in self._captured:
            self._captured.add(checkpoint_id)
            progress.append(SnapshotCaptured(checkpoint_id))
        for ack in snapshot.acks:
            key = (checkpoint_id, ack.task)
            if key not in self._fed_acks:
                self._fed_acks.add(key)
                task_ack = TaskAck(ack.task, ack.batch_id, ack.size_bytes, ack.duration_ms)
                progress.append(TaskAcknowledged(checkpoint_id, task_ack))
        for decline in snapshot.declines:
            key = (checkpoint_id, decline.task)
            if key not in self._fed_declines:
                self._fed_declines.add(key)
                progress.append(TaskDeclined(checkpoint_id, decline.task, decline.message))
        return progress
