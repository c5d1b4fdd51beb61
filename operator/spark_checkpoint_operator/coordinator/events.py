"""What the coordinator consumes. Adapters turn timers, pod or process changes, agent
reports and HTTP calls into these."""

from dataclasses import dataclass
from enum import StrEnum

from spark_checkpoint_operator.coordinator.config import TerminalOutcome
from spark_checkpoint_operator.coordinator.pending import TaskAck
from spark_checkpoint_operator.coordinator.requests import AfterCompletion, CheckpointKind


class JobPhase(StrEnum):
    """Lifecycle phase of a job, derived from its pods (or local process) and its agent.

    The periodic scheduler runs only in RUNNING (Flink's CheckpointCoordinatorDeActivator).
    """

    PENDING = "Pending"
    DEPLOYING = "Deploying"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDING = "Suspending"
    SUSPENDED = "Suspended"
    FINISHED = "Finished"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


@dataclass(frozen=True, slots=True)
class Tick:
    """Time moved on: fire due triggers, expire pending checkpoints, age out savepoints."""


@dataclass(frozen=True, slots=True)
class JobPhaseChanged:
    phase: JobPhase


@dataclass(frozen=True, slots=True)
class TasksReported:
    """The agent's view of the snapshot tasks a checkpoint needs right now.

    ``tasks`` are the ids of the state-store partitions plus the query-log task;
    ``all_running`` is False while, for example, an executor is lost.
    """

    tasks: frozenset[str]
    all_running: bool


@dataclass(frozen=True, slots=True)
class StoredIdsReported:
    """Snapshot directories up to ``highest`` exist in the job's storage: ids continue
    above it. Another registry's savepoints stay when the storage is handed over, and a
    savepoint is never written over one (it would fail, and the next take the next id)."""

    highest: int


@dataclass(frozen=True, slots=True)
class TriggerRequested:
    """A user (or the runtime on the user's behalf) asks for a checkpoint or savepoint.

    Savepoints are forced unless said otherwise: they bypass maxConcurrent and minPause.
    """

    kind: CheckpointKind
    after: AfterCompletion = AfterCompletion.CONTINUE
    forced: bool | None = None
    label: str = ""
    # A savepoint the savepoint history's limits never let go until its pin changes
    # (`SavepointPinChanged`): one a SparkCheckpointSnapshot object stands for.
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class TriggerWithdrawn:
    """What asked for the checkpoints and savepoints labelled ``label`` no longer does (a
    suspension or an upgrade taken back): pending ones are aborted and queued ones declined,
    neither counted as a failure; a stop-with-savepoint withdrawn lets periodic checkpoints
    resume."""

    label: str


@dataclass(frozen=True, slots=True)
class SavepointDisposeRequested:
    """A user disposes of a registered savepoint (Flink's `savepoint --dispose`): it
    leaves the registry and its files are deleted, whatever the savepoint history keeps;
    ``label`` tells the request's own notice from another's. Nothing happens to one
    `PersistedState.why_not_disposable` refuses (disposed meanwhile, the newest image)."""

    savepoint_id: int
    label: str = ""


@dataclass(frozen=True, slots=True)
class SavepointPinChanged:
    """A registered savepoint is pinned (a SparkCheckpointSnapshot object keeps it), or no
    longer (its objects are gone): the savepoint history's limits apply to it from then on,
    and may let it go at once. Disposing of it is `SavepointDisposeRequested`."""

    savepoint_id: int
    pinned: bool


@dataclass(frozen=True, slots=True)
class TaskAcknowledged:
    checkpoint_id: int
    ack: TaskAck


@dataclass(frozen=True, slots=True)
class TaskDeclined:
    checkpoint_id: int
    task: str
    message: str


@dataclass(frozen=True, slots=True)
class SnapshotCaptured:
    """The agent took checkpoint ``checkpoint_id``'s image (its batch is known): a drain
    savepoint's wait for the input to run out is over, and its timeout counts from now."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class TriggerDeliveryFailed:
    """The job's agent refused the trigger: the checkpoint is aborted without counting as a
    failure. (An agent that cannot be reached at all is a job that is not Running: the
    adapter reports a phase change, which aborts pending checkpoints without counting.)"""

    checkpoint_id: int
    message: str


@dataclass(frozen=True, slots=True)
class CheckpointFinalized:
    """``_metadata`` of the checkpoint was written atomically at ``path``."""

    checkpoint_id: int
    path: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class FinalizationFailed:
    checkpoint_id: int
    message: str


@dataclass(frozen=True, slots=True)
class JobTerminated:
    outcome: TerminalOutcome


Event = (
    Tick
    | JobPhaseChanged
    | TasksReported
    | StoredIdsReported
    | TriggerRequested
    | TriggerWithdrawn
    | SavepointDisposeRequested
    | SavepointPinChanged
    | TaskAcknowledged
    | TaskDeclined
    | SnapshotCaptured
    | TriggerDeliveryFailed
    | CheckpointFinalized
    | FinalizationFailed
    | JobTerminated
)
