"""The checkpoint coordinator core: a pure state machine, one instance per job.

It imports no Kubernetes, Kopf, HTTP or Spark code (enforced by import-linter); the
operator and the local runtime are thin adapters that feed it events and carry out
its effects.
"""

from spark_checkpoint_operator.coordinator.completed import (
    MESSAGE_CHARACTERS,
    CheckpointOutcome,
    CompletedCheckpoint,
    OutcomeStatus,
    shortened,
)
from spark_checkpoint_operator.coordinator.config import (
    CoordinatorConfig,
    RetentionPolicy,
    SavepointHistoryLimits,
    SavepointSchedule,
    TerminalOutcome,
)
from spark_checkpoint_operator.coordinator.coordinator import (
    CHECKPOINT_ID_BLOCK,
    CheckpointCoordinator,
    Clock,
    PendingView,
)
from spark_checkpoint_operator.coordinator.effects import (
    AbortCheckpoint,
    DiscardCheckpoint,
    DiscardSavepoint,
    Effect,
    FailJob,
    FinalizeCheckpoint,
    NotifyCheckpointComplete,
    PersistState,
    RequestDeclined,
    TriggerCheckpoint,
)
from spark_checkpoint_operator.coordinator.events import (
    CheckpointFinalized,
    Event,
    FinalizationFailed,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    SavepointDisposeRequested,
    SavepointPinChanged,
    SnapshotCaptured,
    StoredIdsReported,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    Tick,
    TriggerDeliveryFailed,
    TriggerRequested,
    TriggerWithdrawn,
)
from spark_checkpoint_operator.coordinator.pending import TaskAck
from spark_checkpoint_operator.coordinator.reasons import FailureReason
from spark_checkpoint_operator.coordinator.requests import (
    PERIODIC_SAVEPOINT_LABEL,
    AfterCompletion,
    CheckpointKind,
    RequestOrigin,
    TriggerRequest,
)
from spark_checkpoint_operator.coordinator.state import InvalidPersistedState, PersistedState

__all__ = [
    "CHECKPOINT_ID_BLOCK",
    "MESSAGE_CHARACTERS",
    "PERIODIC_SAVEPOINT_LABEL",
    "AbortCheckpoint",
    "AfterCompletion",
    "CheckpointCoordinator",
    "CheckpointFinalized",
    "CheckpointKind",
    "CheckpointOutcome",
    "Clock",
    "CompletedCheckpoint",
    "CoordinatorConfig",
    "DiscardCheckpoint",
    "DiscardSavepoint",
    "Effect",
    "Event",
    "FailJob",
    "FailureReason",
    "FinalizationFailed",
    "FinalizeCheckpoint",
    "InvalidPersistedState",
    "JobPhase",
    "JobPhaseChanged",
    "JobTerminated",
    "NotifyCheckpointComplete",
    "OutcomeStatus",
    "PendingView",
    "PersistState",
    "PersistedState",
    "RequestDeclined",
    "RequestOrigin",
    "RetentionPolicy",
    "SavepointDisposeRequested",
    "SavepointHistoryLimits",
    "SavepointPinChanged",
    "SavepointSchedule",
    "SnapshotCaptured",
    "StoredIdsReported",
    "TaskAck",
    "TaskAcknowledged",
    "TaskDeclined",
    "TasksReported",
    "TerminalOutcome",
    "Tick",
    "TriggerCheckpoint",
    "TriggerDeliveryFailed",
    "TriggerRequest",
    "TriggerRequested",
    "TriggerWithdrawn",
    "shortened",
]
