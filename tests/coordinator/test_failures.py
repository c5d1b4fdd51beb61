"""Expiry, declines, and the tolerable consecutive failure count."""

import pytest

from helpers.coordinator import Harness, of_type
from spark_checkpoint_operator.coordinator import (
    MESSAGE_CHARACTERS,
    AbortCheckpoint,
    AfterCompletion,
    CheckpointKind,
    CoordinatorConfig,
    FailJob,
    FailureReason,
    FinalizationFailed,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    PersistState,
    SnapshotCaptured,
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TerminalOutcome,
    TriggerCheckpoint,
    TriggerDeliveryFailed,
    TriggerRequested,
)


def _failing_harness(tolerable: int) -> Harness:
    harness = Harness(CoordinatorConfig(interval=None, timeout=30.0, tolerable_failures=tolerable))
    harness.start()
    return harness


def test_pending_checkpoint_expires_after_timeout() -> None:
    harness = _failing_harness(tolerable=5)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert harness.coordinator.next_deadline() == harness.clock.now + 30.0
    assert of_type(harness.advance(29.9), AbortCheckpoint) == []
    (abort,) = of_type(harness.advance(0.1), AbortCheckpoint)
    assert (abort.checkpoint_id, abort.reason) == (1, FailureReason.EXPIRED)
    assert harness.coordinator.persisted_state.failed_count == 1
    assert harness.coordinator.consecutive_failures == 1


def test_a_checkpoint_every_task_acknowledged_fails_as_its_metadata_write_not_expired() -> None:
    """Past its timeout while its `_metadata` was written, it failed "expired before all
    tasks acknowledged", which they had (a Flink-rules review's)."""
    harness = _failing_harness(tolerable=5)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.advance(25.0)
    harness.ack_all(1)

    (abort,) = of_type(harness.advance(6.0), AbortCheckpoint)

    assert (abort.checkpoint_id, abort.reason, abort.message) == (
        1,
        FailureReason.FINALIZE_FAILURE,
        "writing the checkpoint metadata failed: not written within the checkpoint's timeout",
    )
    assert harness.coordinator.consecutive_failures == 1


@pytest.mark.parametrize("captured_by", ["capture", "acknowledgement"])
def test_a_drain_savepoint_times_out_only_from_its_capture(captured_by: str) -> None:
    """`stop --drain` first processes all input, however long that takes: its timeout
    counted from the trigger expired the reference example's drain, which then ended
    without a savepoint (a newcomer)."""
    harness = _failing_harness(tolerable=5)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.DRAIN))
    (pending,) = harness.coordinator.pending
    assert pending.deadline is None
    assert harness.coordinator.next_deadline() is None
    assert of_type(harness.advance(3600.0), AbortCheckpoint) == [], "draining for an hour"

    if captured_by == "capture":
        harness.send(SnapshotCaptured(pending.checkpoint_id))
    else:
        harness.send(TaskAcknowledged(pending.checkpoint_id, TaskAck("logs", 3, 1, 1)))
    assert harness.coordinator.next_deadline() == harness.clock.now + 30.0
    harness.send(SnapshotCaptured(pending.checkpoint_id))  # a repeat moves nothing
    assert of_type(harness.advance(29.9), AbortCheckpoint) == []
    (abort,) = of_type(harness.advance(0.1), AbortCheckpoint)
    assert (abort.checkpoint_id, abort.reason) == (pending.checkpoint_id, FailureReason.EXPIRED)


def test_a_drain_savepoints_duration_is_its_own_not_the_drains() -> None:
    """`stop --drain` said "savepoint 2 complete ...: 43.92s" of a sub-second savepoint
    after 43 s of draining, and the duration metric took it so (a newcomer's): it counts
    from its image's capture, as the agent's `_metadata` does."""
    harness = _failing_harness(tolerable=5)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.DRAIN))
    (pending,) = harness.coordinator.pending
    requested = harness.clock.now
    harness.advance(43.0)
    harness.send(SnapshotCaptured(pending.checkpoint_id))
    harness.advance(0.5)

    harness.complete(pending.checkpoint_id)

    (savepoint,) = harness.coordinator.persisted_state.savepoints
    assert savepoint.trigger_time == requested + 43.0
    assert savepoint.duration == 0.5


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (TaskDeclined(1, "state-0-0", "disk full"), FailureReason.TASK_DECLINED),
        (FinalizationFailed(1, "permission denied"), FailureReason.FINALIZE_FAILURE),
    ],
)
def test_failures_abort_with_their_reason_and_count(
    event: TaskDeclined | FinalizationFailed, reason: FailureReason
) -> None:
    harness = _failing_harness(tolerable=5)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    (abort,) = of_type(harness.send(event), AbortCheckpoint)
    assert abort.reason is reason
    assert harness.coordinator.consecutive_failures == 1


@pytest.mark.parametrize(
    "event",
    [
        TaskDeclined(1, "state-0-0", "disk full: " + "x" * 1_000_000),
        TaskDeclined(1, "t" * 1_000_000, "disk full"),
        FinalizationFailed(1, "500 " + "x" * 1_000_000),
        TriggerDeliveryFailed(1, "500 " + "x" * 1_000_000),
    ],
    ids=["decline", "task", "finalize", "trigger"],
)
def test_a_failures_message_in_the_history_is_kept_short(
    event: TaskDeclined | FinalizationFailed | TriggerDeliveryFailed,
) -> None:
    """What a driver says goes into the job's status: its code is the job author's, and
    ten history lines of 1 MB kept the status from being written (the hostile reviewer's)."""
    harness = _failing_harness(tolerable=5)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    (abort,) = of_type(harness.send(event), AbortCheckpoint)
    (failed,) = harness.coordinator.persisted_state.history
    assert len(failed.message) == MESSAGE_CHARACTERS
    assert len(abort.message) < MESSAGE_CHARACTERS + 100


def test_a_failures_message_of_exactly_the_limit_is_kept_whole() -> None:
    harness = _failing_harness(tolerable=5)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    message = "x" * MESSAGE_CHARACTERS

    harness.send(FinalizationFailed(1, message))

    (failed,) = harness.coordinator.persisted_state.history
    assert failed.message == message


def test_a_trigger_the_agent_refused_aborts_without_counting() -> None:
    """Flink counts no TRIGGER_CHECKPOINT_FAILURE: with ``tolerableFailures: 0`` one
    undeliverable trigger once failed the job."""
    harness = _failing_harness(tolerable=0)
    for checkpoint_id in (1, 2, 3):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
        effects = harness.send(TriggerDeliveryFailed(checkpoint_id, "409 agent is closing"))
        (abort,) = of_type(effects, AbortCheckpoint)
        assert abort.reason is FailureReason.TRIGGER_FAILURE
        assert of_type(effects, FailJob) == []
    assert harness.coordinator.consecutive_failures == 0
    # A counted failure after them is the first one: it alone exceeds zero.
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    (fail,) = of_type(harness.send(TaskDeclined(4, "logs", "x")), FailJob)
    assert "1 consecutive checkpoint failures" in fail.message


def test_a_counted_failure_count_survives_an_uncounted_one() -> None:
    harness = _failing_harness(tolerable=1)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TaskDeclined(1, "logs", "x"))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TriggerDeliveryFailed(2, "refused"))
    assert harness.coordinator.consecutive_failures == 1
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert of_type(harness.send(TaskDeclined(3, "logs", "x")), FailJob) != []


def test_exceeding_tolerable_failures_fails_the_job() -> None:
    harness = _failing_harness(tolerable=2)
    fail_effects = []
    for checkpoint_id in (1, 2, 3):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
        effects = harness.send(TaskDeclined(checkpoint_id, "logs", "boom"))
        fail_effects.append(of_type(effects, FailJob))
    assert fail_effects[0] == [] and fail_effects[1] == []
    (fail,) = fail_effects[2]
    assert "3 consecutive checkpoint failures exceed tolerableFailures=2" in fail.message
    assert "boom" in fail.message


def test_zero_tolerable_failures_fails_on_the_first_failure() -> None:
    harness = _failing_harness(tolerable=0)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert of_type(harness.send(TaskDeclined(1, "logs", "x")), FailJob) != []


@pytest.mark.parametrize("kind", [CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT])
def test_a_completed_image_resets_the_failure_count(kind: CheckpointKind) -> None:
    """Flink's handleCheckpointSuccess runs for savepoints too: the job can checkpoint.
    Two declines around a completed savepoint failed a job tolerating one (a Flink-rules
    review's)."""
    harness = _failing_harness(tolerable=1)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TaskDeclined(1, "logs", "x"))
    harness.send(TriggerRequested(kind))
    harness.complete(2)
    assert harness.coordinator.consecutive_failures == 0
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert of_type(harness.send(TaskDeclined(3, "logs", "x")), FailJob) == []


def test_the_jobs_first_checkpoint_completing_resets_the_failure_count() -> None:
    """Checkpoint 1 completes after checkpoint 2 failed: it is above every image completed
    before (none), so the job can checkpoint and the count is cleared."""
    harness = Harness(
        CoordinatorConfig(interval=None, timeout=30.0, tolerable_failures=1, max_concurrent=2)
    )
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TaskDeclined(2, "logs", "x"))
    assert harness.coordinator.consecutive_failures == 1

    harness.complete(1)

    assert harness.coordinator.consecutive_failures == 0


def test_an_image_older_than_the_last_completed_one_leaves_the_failure_count() -> None:
    """Flink's handleCheckpointSuccess clears the count only for an id above its
    lastSucceededCheckpointId: a savepoint that outlasted a newer completed checkpoint says
    nothing of the failures since (it cleared them; a coordinator review's)."""
    harness = Harness(
        CoordinatorConfig(interval=None, timeout=30.0, tolerable_failures=1, max_concurrent=3)
    )
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.complete(2)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TaskDeclined(3, "logs", "x"))

    harness.complete(1)

    assert harness.coordinator.consecutive_failures == 1
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert of_type(harness.send(TaskDeclined(4, "logs", "x")), FailJob) != []


def test_a_checkpoint_older_than_the_last_completed_image_fails_uncounted() -> None:
    """Flink counts only failures after its lastSucceededCheckpointId. A savepoint subsumes
    nothing: the checkpoint pending beside it expired after it completed and failed a job
    that tolerates no failure."""
    harness = _failing_harness(tolerable=0)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.advance(10.0)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    harness.complete(2)

    effects = harness.advance(20.0)

    (abort,) = of_type(effects, AbortCheckpoint)
    assert (abort.checkpoint_id, abort.reason) == (1, FailureReason.EXPIRED)
    assert of_type(effects, FailJob) == []
    assert harness.coordinator.consecutive_failures == 0
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert of_type(harness.send(TaskDeclined(3, "logs", "x")), FailJob) != [], "newer counts"


@pytest.mark.parametrize("after", [AfterCompletion.STOP, AfterCompletion.DRAIN])
def test_a_checkpoint_that_fails_beside_a_stop_with_savepoint_fails_no_job(
    after: AfterCompletion,
) -> None:
    """Flink aborts pending checkpoints when a stop-with-savepoint begins, uncounted; here
    they may still complete, and one that expired while the stop ran (a drain may wait for
    hours) failed a job that tolerates no failure (a Flink-rules review's). Once the stop
    failed, the job runs on and failures count again."""
    harness = _failing_harness(tolerable=0)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.advance(10.0)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=after))

    effects = harness.advance(20.0)

    (abort,) = of_type(effects, AbortCheckpoint)
    assert (abort.checkpoint_id, abort.reason) == (1, FailureReason.EXPIRED)
    assert of_type(effects, FailJob) == []
    harness.send(TaskDeclined(2, "logs", "disk full"))  # the stop fails: the job runs on
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert of_type(harness.send(TaskDeclined(3, "logs", "x")), FailJob) != []


def test_a_checkpoint_expiring_with_a_stop_with_savepoint_counts() -> None:
    """The stop fails in the same Tick, and the job runs on: the checkpoint's failure is
    one of a running job's (it went uncounted, aborted while the stop was still pending:
    a reviewer's)."""
    harness = _failing_harness(tolerable=0)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.STOP))

    effects = harness.advance(30.0)

    assert [a.checkpoint_id for a in of_type(effects, AbortCheckpoint)] == [2, 1]
    assert of_type(effects, FailJob) != []


def test_savepoint_failures_do_not_count() -> None:
    harness = _failing_harness(tolerable=0)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    effects = harness.send(TaskDeclined(1, "logs", "x"))
    assert of_type(effects, AbortCheckpoint) != []
    assert of_type(effects, FailJob) == []
    assert harness.coordinator.consecutive_failures == 0


def test_preflight_declines_do_not_count() -> None:
    harness = _failing_harness(tolerable=0)
    harness.send(JobPhaseChanged(JobPhase.RESTARTING))
    harness.send(JobPhaseChanged(JobPhase.RUNNING))
    for _ in range(3):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="x"))
        harness.complete(harness.coordinator.pending[0].checkpoint_id)
    harness.send(JobPhaseChanged(JobPhase.DEPLOYING))
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert of_type(effects, FailJob) == []
    assert harness.coordinator.consecutive_failures == 0


def test_stopping_the_scheduler_resets_the_failure_count() -> None:
    harness = _failing_harness(tolerable=3)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TaskDeclined(1, "logs", "x"))
    assert harness.coordinator.consecutive_failures == 1
    harness.send(JobPhaseChanged(JobPhase.RESTARTING))
    assert harness.coordinator.consecutive_failures == 0


@pytest.mark.parametrize("pending", [1, 3])
def test_a_failure_is_persisted_once_after_its_aborts(pending: int) -> None:
    """Its counts and history are in the persisted state: the operator wrote status only
    at the next completion, so status showed no failure (counts.failed 0, Healthy) while
    checkpoints kept failing."""
    harness = Harness(
        CoordinatorConfig(interval=None, timeout=30.0, max_concurrent=3, tolerable_failures=9)
    )
    harness.start()
    for _ in range(pending):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))

    effects = harness.advance(30.0)

    assert [type(e) for e in effects] == [AbortCheckpoint] * pending + [PersistState]
    (persisted,) = of_type(effects, PersistState)
    assert persisted.state.failed_count == pending
    assert [o.reason for o in persisted.state.history] == [FailureReason.EXPIRED] * pending


def test_a_termination_that_aborts_checkpoints_writes_the_state_once() -> None:
    """Its write after the aborts holds them: no second write for the failures."""
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=2))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))

    effects = harness.send(JobTerminated(TerminalOutcome.FAILED))

    assert [type(e) for e in effects] == [AbortCheckpoint, AbortCheckpoint, PersistState]
    (persisted,) = of_type(effects, PersistState)
    assert persisted.state.failed_count == 2


def test_failing_the_job_holds_periodic_checkpoints_until_it_runs_again() -> None:
    """Flink's failover stops the checkpoint scheduler: a periodic checkpoint triggered
    after the decision to fail the driver, before its phase changed, was aborted as "the
    job left the Running phase" and counted as failed (an Azure user's)."""
    harness = Harness(
        CoordinatorConfig(interval=10.0, min_pause=0.0, timeout=30.0, tolerable_failures=0)
    )
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    (pending,) = harness.coordinator.pending

    effects = harness.send(TaskDeclined(pending.checkpoint_id, "logs", "x"))

    assert of_type(effects, FailJob) != []
    assert of_type(harness.advance(60.0), TriggerCheckpoint) == [], "held while it fails"
    harness.send(JobPhaseChanged(JobPhase.DEPLOYING))
    harness.send(JobPhaseChanged(JobPhase.RUNNING))
    assert of_type(harness.advance(10.0), TriggerCheckpoint) != [], "the next driver's"
