"""What the coordinator asks its adapter to do, in order.

The adapter carries effects out one after another and stops at the first that fails:
the order is the crash-consistency protocol (persist the id before the trigger goes out;
persist the registry before sinks are notified; discard only after that).
"""

from dataclasses import dataclass

from spark_checkpoint_operator.coordinator.completed import CompletedCheckpoint
from spark_checkpoint_operator.coordinator.reasons import FailureReason
from spark_checkpoint_operator.coordinator.requests import (
    AfterCompletion,
    CheckpointKind,
    TriggerRequest,
)
from spark_checkpoint_operator.coordinator.state import PersistedState


@dataclass(frozen=True, slots=True)
class PersistState:
    state: PersistedState


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint:
    checkpoint_id: int
    kind: CheckpointKind
    after: AfterCompletion
    trigger_time: float
    expected_tasks: frozenset[str]


@dataclass(frozen=True, slots=True)
class AbortCheckpoint:
    """Tell the job to stop working on a pending checkpoint and drop what it wrote."""

    checkpoint_id: int
    kind: CheckpointKind
    reason: FailureReason
    message: str
    label: str = ""  # the request's (TriggerRequested.label): whoever asked learns it failed


@dataclass(frozen=True, slots=True)
class FinalizeCheckpoint:
    """Every expected task acknowledged: write ``_metadata`` atomically from the acks."""

    checkpoint_id: int
    kind: CheckpointKind
    batch_id: int
    tasks: frozenset[str]


@dataclass(frozen=True, slots=True)
class NotifyCheckpointComplete:
    """The image is registered (status and events report it).

    When ``sinks_may_commit``, the job is told and its sinks may commit the output of
    batches <= the image's batch: for checkpoints and stop-with-savepoints only. A savepoint
    the job continues after commits nothing (as in Flink 1.15+): it may later be trimmed or
    deleted, and committed output must never be ahead of every image left to restore from.
    """

    checkpoint: CompletedCheckpoint
    sinks_may_commit: bool


@dataclass(frozen=True, slots=True)
class DiscardCheckpoint:
    """Delete a checkpoint that is no longer registered, keeping the shared files that the
    ``retained`` checkpoints reference."""

    checkpoint_id: int
    retained: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DiscardSavepoint:
    """Delete a savepoint that left the registry: trimmed by the savepoint history, or
    disposed of by the request labelled ``label``."""

    savepoint: CompletedCheckpoint
    label: str = ""


@dataclass(frozen=True, slots=True)
class RequestDeclined:
    """A request never became a checkpoint; recorded for status and events."""

    request: TriggerRequest
    reason: FailureReason


@dataclass(frozen=True, slots=True)
class FailJob:
    """More consecutive checkpoint failures than tolerated: fail (and restore) the job."""

    message: str


Effect = (
    PersistState
    | TriggerCheckpoint
    | AbortCheckpoint
    | FinalizeCheckpoint
    | NotifyCheckpointComplete
    | DiscardCheckpoint
    | DiscardSavepoint
    | RequestDeclined
    | FailJob
)
