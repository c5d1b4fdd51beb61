"""Why a checkpoint request was declined or a pending checkpoint failed."""

from enum import StrEnum


class FailureReason(StrEnum):
    """Reasons modelled on Flink's ``CheckpointFailureReason``.

    Pre-flight reasons decline a request before any checkpoint id is spent; they never
    count toward ``tolerableFailures``. The others end a pending checkpoint; those that
    mean "the job could not take a checkpoint" count as a consecutive failure, as Flink's
    ``CheckpointFailureReason.isPreFlight``/``CheckpointFailureManager`` decide: a trigger
    that never reached the job is not counted (Flink's TRIGGER_CHECKPOINT_FAILURE), while
    expiry, a declining task and a failed metadata write (the coordinator's own I/O) are.
    """

    COORDINATOR_SHUTDOWN = "CoordinatorShutdown"
    PERIODIC_SCHEDULER_SHUTDOWN = "PeriodicSchedulerShutdown"
    TOO_MANY_CHECKPOINT_REQUESTS = "TooManyCheckpointRequests"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "MinimumTimeBetweenCheckpoints"
    NOT_ALL_REQUIRED_TASKS_RUNNING = "NotAllRequiredTasksRunning"
    COORDINATOR_SUSPEND = "CoordinatorSuspend"
    SUBSUMED = "Subsumed"
    EXPIRED = "Expired"
    TASK_DECLINED = "TaskDeclined"
    INCONSISTENT_ACKNOWLEDGEMENTS = "InconsistentAcknowledgements"
    TRIGGER_FAILURE = "TriggerFailure"
    FINALIZE_FAILURE = "FinalizeFailure"
    WITHDRAWN = "Withdrawn"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    @property
    def counts_toward_tolerable_failures(self) -> bool:
        return self in _COUNTED


_DESCRIPTIONS = {
    FailureReason.COORDINATOR_SHUTDOWN: "the checkpoint coordinator is shut down",
    FailureReason.PERIODIC_SCHEDULER_SHUTDOWN: "periodic checkpoint scheduling is stopped",
    FailureReason.TOO_MANY_CHECKPOINT_REQUESTS: "too many checkpoint requests are queued",
    FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS: (
        "the minimum pause since the last completed checkpoint has not passed"
    ),
    FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING: (
        "not all required tasks are running (the query is starting or has not committed "
        "its first batch yet, the driver is restarting, or an executor is missing)"
    ),
    FailureReason.COORDINATOR_SUSPEND: "the job left the Running phase",
    FailureReason.SUBSUMED: "a newer checkpoint completed first",
    FailureReason.EXPIRED: "the checkpoint expired before all tasks acknowledged",
    FailureReason.TASK_DECLINED: "a task declined the checkpoint",
    FailureReason.INCONSISTENT_ACKNOWLEDGEMENTS: "tasks acknowledged different batches",
    FailureReason.TRIGGER_FAILURE: "the trigger could not be delivered to the job",
    FailureReason.FINALIZE_FAILURE: "writing the checkpoint metadata failed",
    FailureReason.WITHDRAWN: "what asked for it no longer does",
}

_COUNTED = frozenset(
    {
        FailureReason.EXPIRED,
        FailureReason.TASK_DECLINED,
        FailureReason.INCONSISTENT_ACKNOWLEDGEMENTS,
        FailureReason.FINALIZE_FAILURE,
    }
)
