"""The job's status as ``kubectl get/describe scj`` shows it (and the local status file).

``status.coordinator`` is the durable part (the checkpoint id counter and the registry,
what an operator restart resumes from); the other fields are views of it and of the
runtime, shaped by the CRD's status schema. Conditions follow the Kubernetes API
conventions: a condition's ``lastTransitionTime`` changes only when its status does.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CheckpointOutcome,
    CompletedCheckpoint,
    JobPhase,
    OutcomeStatus,
)
from spark_checkpoint_operator.coordinator.state import format_time
from spark_checkpoint_operator.supervisor import JobRecord

HISTORY_SHOWN = 10

READY = "Ready"
CHECKPOINTS_HEALTHY = "CheckpointsHealthy"
SPEC_VALID = "SpecValid"


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: int
    expected: int

    def to_dict(self) -> dict[str, int]:
        return {"ready": self.ready, "expected": self.expected}


@dataclass(frozen=True, slots=True)
class Observed:
    """What the runtime saw beyond the record; all optional for the local runtime."""

    generation: int | None = None
    driver: Readiness | None = None
    executors: Readiness | None = None
    spec_problem: str | None = None


def render_status(
    record: JobRecord,
    *,
    now: float,
    observed: Observed = Observed(),
    previous_conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    state = record.coordinator
    status: dict[str, Any] = record.to_dict()
    status |= {
        "counts": {
            "completed": state.completed_count,
            "failed": state.failed_count,
            "inProgress": len(record.pending),
            "restored": record.restores,
            "failedRestores": record.failed_restores,
        },
        "lastCheckpoint": _last(state.checkpoints, state.history, CheckpointKind.CHECKPOINT),
        "lastSavepoint": _last(state.savepoints, state.history, CheckpointKind.SAVEPOINT),
        "history": [_outcome(o) for o in reversed(state.history[-HISTORY_SHOWN:])],
        "savepointHistory": [_completed(s) for s in reversed(state.savepoints)],
    }
    if observed.generation is not None:
        status["observedGeneration"] = observed.generation
    if observed.driver is not None:
        status["driver"] = observed.driver.to_dict()
    if observed.executors is not None:
        status["executors"] = observed.executors.to_dict()
    status["conditions"] = _conditions(record, observed, previous_conditions, now)
    return status


def _last(
    registered: Sequence[CompletedCheckpoint],
    history: Sequence[CheckpointOutcome],
    kind: CheckpointKind,
) -> dict[str, Any] | None:
    """The newest registered image of ``kind``; a finished job's checkpoints are
    discarded, so the history's newest completion stands in for them."""
    if registered:
        return _completed(registered[-1])
    for outcome in reversed(history):
        if outcome.kind is kind and outcome.status is OutcomeStatus.COMPLETED:
            return {
                "id": outcome.checkpoint_id,
                "batch": outcome.batch_id,
                "sizeBytes": outcome.size_bytes,
                "triggerTime": format_time(outcome.trigger_time),
                "completionTime": format_time(outcome.end_time),
                "duration": _duration(outcome.end_time - outcome.trigger_time),
            }
    return None


def _completed(checkpoint: CompletedCheckpoint) -> dict[str, Any]:
    return {
        "id": checkpoint.checkpoint_id,
        "batch": checkpoint.batch_id,
        "path": checkpoint.path,
        "sizeBytes": checkpoint.size_bytes,
        "triggerTime": format_time(checkpoint.trigger_time),
        "completionTime": format_time(checkpoint.completion_time),
        "duration": _duration(checkpoint.duration),
        **({"label": checkpoint.label} if checkpoint.label else {}),
    }


def _outcome(outcome: CheckpointOutcome) -> dict[str, Any]:
    line: dict[str, Any] = {
        "id": outcome.checkpoint_id,
        "kind": outcome.kind.value,
        "status": outcome.status.value,
        "triggerTime": format_time(outcome.trigger_time),
        "duration": _duration(outcome.end_time - outcome.trigger_time),
    }
    if outcome.batch_id is not None:
        line["batch"] = outcome.batch_id
    if outcome.size_bytes is not None:
        line["sizeBytes"] = outcome.size_bytes
    if outcome.reason is not None:
        line["reason"] = outcome.reason.value
        line["message"] = outcome.message
    return line


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.1f}s"


def _conditions(
    record: JobRecord,
    observed: Observed,
    previous: Sequence[Mapping[str, Any]],
    now: float,
) -> list[dict[str, Any]]:
    running = record.phase is JobPhase.RUNNING
    ready_message = record.message or _PHASE_MESSAGES[record.phase]
    if observed.spec_problem is not None:
        ready = ("False", "InvalidSpec", observed.spec_problem)
    else:
        ready = ("True" if running else "False", record.phase.value, ready_message)
    failures = record.consecutive_failures
    last_failure = next(
        (o for o in reversed(record.coordinator.history) if o.status is OutcomeStatus.FAILED),
        None,
    )
    healthy = (
        ("True", "CheckpointsCompleting", "no checkpoint failed since the last completed one")
        if failures == 0
        else (
            "False",
            "CheckpointsFailing",
            f"{failures} consecutive checkpoint failures; last: "
            + (
                f"{last_failure.reason.value if last_failure.reason else ''} "
                f"{last_failure.message}".strip()
                if last_failure
                else "unknown"
            ),
        )
    )
    valid = (
        ("False", "InvalidSpec", observed.spec_problem)
        if observed.spec_problem is not None
        else ("True", "Valid", "the spec can be run")
    )
    earlier = {c.get("type"): c for c in previous}
    conditions = []
    for kind, (state, reason, message) in (
        (READY, ready),
        (CHECKPOINTS_HEALTHY, healthy),
        (SPEC_VALID, valid),
    ):
        before = earlier.get(kind)
        since = format_time(now)
        if before is not None and before.get("status") == state:
            since = before.get("lastTransitionTime", since)
        condition: dict[str, Any] = {
            "type": kind,
            "status": state,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }
        if observed.generation is not None:
            condition["observedGeneration"] = observed.generation
        conditions.append(condition)
    return conditions


_PHASE_MESSAGES = {
    JobPhase.PENDING: "waiting to start",
    JobPhase.DEPLOYING: "the driver is starting",
    JobPhase.RUNNING: "the query is running",
    JobPhase.RESTARTING: "the driver failed and is being restarted",
    JobPhase.SUSPENDING: "taking a savepoint to suspend",
    JobPhase.SUSPENDED: "suspended after a savepoint; set spec.state to Running to resume",
    JobPhase.FINISHED: "the bounded input is done and its final checkpoint completed",
    JobPhase.FAILED: "the job failed",
    JobPhase.CANCELLED: "the job was cancelled",
}
