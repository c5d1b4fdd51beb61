"""The status view: shaped by the CRD, conditions by the Kubernetes API conventions."""

from pathlib import Path

import yaml

from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CheckpointOutcome,
    CompletedCheckpoint,
    FailureReason,
    JobPhase,
    OutcomeStatus,
    PersistedState,
)
from spark_checkpoint_operator.manifest.validation import validate_document
from spark_checkpoint_operator.status import Observed, Readiness, render_status
from spark_checkpoint_operator.supervisor import JobRecord

FIXTURES = Path(__file__).parent.parent / "manifest" / "fixtures"


def _record(failures: int = 0) -> JobRecord:
    checkpoint = CompletedCheckpoint(
        7, CheckpointKind.CHECKPOINT, 41, "s3a://b/chk-7", 2048, 10, 12
    )
    savepoint = CompletedCheckpoint(8, CheckpointKind.SAVEPOINT, 42, "s3a://b/sp-8", 4096, 20, 21)
    failed = CheckpointOutcome(
        9, CheckpointKind.CHECKPOINT, OutcomeStatus.FAILED, 30, 90, reason=FailureReason.EXPIRED
    )
    return JobRecord(
        phase=JobPhase.RUNNING,
        attempt=2,
        restores=1,
        consecutive_failures=failures,
        next_checkpoint_id=10,
        coordinator=PersistedState(
            next_checkpoint_id=101,
            checkpoints=(checkpoint,),
            savepoints=(savepoint,),
            history=(failed,),
            completed_count=8,
            failed_count=1,
        ),
    )


def test_the_status_is_what_the_crd_describes() -> None:
    document = yaml.safe_load((FIXTURES / "full-job.yaml").read_text())
    document["status"] = render_status(
        _record(),
        now=100.0,
        observed=Observed(generation=3, driver=Readiness(1, 1), executors=Readiness(2, 2)),
    )

    validate_document(document)  # raises on any field the CRD does not describe


def test_printer_columns_and_counters() -> None:
    status = render_status(_record(), now=100.0)

    assert status["lastCheckpoint"]["id"] == 7
    assert status["lastCheckpoint"]["completionTime"] == "1970-01-01T00:00:12Z"
    assert status["lastCheckpoint"]["duration"] == "2.0s"
    assert status["lastSavepoint"]["path"] == "s3a://b/sp-8"
    assert status["counts"] == {
        "completed": 8,
        "failed": 1,
        "inProgress": 0,
        "restored": 1,
        "failedRestores": 0,
    }
    # The id the next checkpoint gets, not the end of the block of ids made durable.
    assert status["nextCheckpointId"] == 10
    assert status["coordinator"]["nextCheckpointId"] == 101
    assert status["history"][0]["reason"] == "Expired"


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = render_status(_record(), now=100.0, observed=Observed(generation=1))
    same = render_status(
        _record(),
        now=200.0,
        observed=Observed(generation=2),
        previous_conditions=first["conditions"],
    )
    failing = render_status(_record(failures=2), now=300.0, previous_conditions=same["conditions"])

    def condition(status: dict[str, object], kind: str) -> dict[str, object]:
        return next(c for c in status["conditions"] if c["type"] == kind)  # type: ignore[attr-defined, index]

    assert condition(same, "Ready")["lastTransitionTime"] == "1970-01-01T00:01:40Z"
    assert condition(same, "Ready")["observedGeneration"] == 2
    healthy = condition(failing, "CheckpointsHealthy")
    assert healthy["status"] == "False"
    assert healthy["lastTransitionTime"] == "1970-01-01T00:05:00Z"
    assert "2 consecutive checkpoint failures; last: Expired" in str(healthy["message"])
    assert condition(failing, "Ready")["lastTransitionTime"] == "1970-01-01T00:01:40Z"


def test_checkpoint_health_is_unknown_until_a_checkpoint_completed_or_failed() -> None:
    """A job that never started said "no checkpoint failed since the last completed one"
    (a GitOps user's)."""
    status = render_status(JobRecord(), now=1.0)

    healthy = next(c for c in status["conditions"] if c["type"] == "CheckpointsHealthy")
    assert (healthy["status"], healthy["reason"]) == ("Unknown", "NoCheckpointYet")


def test_checkpoint_health_is_unknown_while_only_uncounted_failures_happened() -> None:
    """A stop's savepoint withdrawn (the upgrade reverted) said "no checkpoint failed since
    the last completed one" with none completed (a reviewer's)."""
    withdrawn = CheckpointOutcome(
        1, CheckpointKind.SAVEPOINT, OutcomeStatus.FAILED, 3, 5, reason=FailureReason.WITHDRAWN
    )
    state = PersistedState(next_checkpoint_id=2, history=(withdrawn,), failed_count=1)
    status = render_status(JobRecord(phase=JobPhase.RUNNING, coordinator=state), now=9.0)

    healthy = next(c for c in status["conditions"] if c["type"] == "CheckpointsHealthy")
    assert (healthy["status"], healthy["reason"]) == ("Unknown", "NoCheckpointYet")
    assert healthy["message"] == (
        "no checkpoint has completed yet (1 failed: status.history says why)"
    )


def test_an_invalid_spec_is_a_condition_not_a_phase() -> None:
    record = JobRecord()
    status = render_status(
        record, now=1.0, observed=Observed(spec_problem="spec.image: required on a cluster")
    )
    conditions = {c["type"]: c for c in status["conditions"]}

    assert status["phase"] == "Pending"
    assert conditions["SpecValid"]["status"] == "False"
    assert conditions["SpecValid"]["reason"] == "InvalidSpec"
    assert conditions["Ready"]["message"] == "spec.image: required on a cluster"


def test_the_record_reads_back_from_the_status() -> None:
    status = render_status(_record(), now=100.0)

    again = JobRecord.from_dict(status)

    assert again.coordinator == _record().coordinator
    assert (again.phase, again.attempt, again.restores) == (JobPhase.RUNNING, 2, 1)
