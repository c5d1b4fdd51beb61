"""A triggered checkpoint that waits for every expected task to acknowledge."""

from dataclasses import dataclass, field

from spark_checkpoint_operator.coordinator.requests import (
    AfterCompletion,
    CheckpointKind,
    RequestOrigin,
)


@dataclass(frozen=True, slots=True)
class TaskAck:
    """A snapshot task's report that its part of checkpoint N is durable in storage.

    ``batch_id`` is the committed micro-batch the snapshot captured; every task of one
    checkpoint must report the same one.
    """

    task: str
    batch_id: int
    size_bytes: int
    duration_ms: int


@dataclass(slots=True)
class PendingCheckpoint:
    checkpoint_id: int
    kind: CheckpointKind
    origin: RequestOrigin
    after: AfterCompletion
    forced: bool
    label: str
    # A drain savepoint's is its image's capture, once the input ran out.
    trigger_time: float
    # When it expires, on the coordinator's timer; None while a drain savepoint waits for
    # the input to run out (its timeout counts from the image's capture: `SnapshotCaptured`).
    deadline: float | None
    expected_tasks: frozenset[str]
    acks: dict[str, TaskAck] = field(default_factory=dict)
    finalizing: bool = False
    pinned: bool = False  # `TriggerRequested.pinned`

    def acknowledge(self, ack: TaskAck) -> bool:
        """Record ``ack``; False for a task this checkpoint does not expect or one that
        acknowledged already (its first acknowledgement stands)."""
        if ack.task not in self.expected_tasks or ack.task in self.acks:
            return False
        self.acks[ack.task] = ack
        return True

    @property
    def fully_acknowledged(self) -> bool:
        return len(self.acks) == len(self.expected_tasks)

    @property
    def batch_ids(self) -> frozenset[int]:
        return frozenset(ack.batch_id for ack in self.acks.values())

    @property
    def acknowledged_bytes(self) -> int:
        return sum(ack.size_bytes for ack in self.acks.values())
