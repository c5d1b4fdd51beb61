"""What the coordinator records and says: the outcome history, the persisted form of every
field, the messages of aborts, declines and refused settings. Written against the
mutants that survived the other tests (docs/testing.md)."""

import dataclasses
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.coordinator import START, TASKS, Aligned, Harness, of_type
from spark_checkpoint_operator.coordinator import (
    AbortCheckpoint,
    AfterCompletion,
    CheckpointFinalized,
    CheckpointKind,
    CheckpointOutcome,
    CompletedCheckpoint,
    CoordinatorConfig,
    DiscardCheckpoint,
    DiscardSavepoint,
    Effect,
    FailureReason,
    FinalizationFailed,
    FinalizeCheckpoint,
    InvalidPersistedState,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    NotifyCheckpointComplete,
    OutcomeStatus,
    PersistedState,
    PersistState,
    RequestDeclined,
    RequestOrigin,
    RetentionPolicy,
    SavepointHistoryLimits,
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    TerminalOutcome,
    TriggerCheckpoint,
    TriggerDeliveryFailed,
    TriggerRequested,
)
from spark_checkpoint_operator.coordinator.completed import (
    CompletedCheckpointStore,
    SavepointHistory,
)
from spark_checkpoint_operator.coordinator.state import MAX_COUNT, format_time


def _abort_message(harness: Harness, event: object) -> AbortCheckpoint:
    (abort,) = of_type(harness.send(event), AbortCheckpoint)  # type: ignore[arg-type]
    return abort


def test_the_history_records_each_outcome_with_its_times_and_details() -> None:
    harness = Harness(CoordinatorConfig(interval=None, timeout=30.0, tolerable_failures=5))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.clock.now += 2.0
    harness.ack_all(1, batch_id=0)
    harness.send(CheckpointFinalized(1, "file:///store/chk-1", 0))
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, label="nonce-7"))
    harness.advance(31.0)  # the savepoint expires
    state = harness.coordinator.persisted_state

    assert state.history == (
        CheckpointOutcome(
            checkpoint_id=1,
            kind=CheckpointKind.CHECKPOINT,
            status=OutcomeStatus.COMPLETED,
            trigger_time=START,
            end_time=START + 2.0,
            batch_id=0,
            size_bytes=0,
        ),
        CheckpointOutcome(
            checkpoint_id=2,
            kind=CheckpointKind.SAVEPOINT,
            status=OutcomeStatus.FAILED,
            trigger_time=START + 2.0,
            end_time=START + 33.0,
            reason=FailureReason.EXPIRED,
            message="",
            label="nonce-7",  # who asked for it: a failed savepoint is in no registry
        ),
    )
    assert (state.completed_count, state.failed_count) == (1, 1)
    (checkpoint,) = state.checkpoints
    assert (checkpoint.batch_id, checkpoint.size_bytes, checkpoint.label) == (0, 0, "")
    assert PersistedState.from_dict(state.to_dict()) == state


def test_counts_and_history_accumulate_and_the_history_is_bounded() -> None:
    harness = Harness(CoordinatorConfig(interval=None, history_size=3, tolerable_failures=5))
    harness.start()
    for checkpoint_id in (1, 2, 3, 4):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
        harness.send(TaskDeclined(checkpoint_id, "logs", f"boom {checkpoint_id}"))
    state = harness.coordinator.persisted_state
    assert state.failed_count == 4
    assert [o.message for o in state.history] == [
        f"boom {checkpoint_id} (task logs)" for checkpoint_id in (2, 3, 4)
    ]

    rebuilt = Harness(harness.config, state=state, clock=harness.clock)
    rebuilt.start()
    rebuilt.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    rebuilt_id = rebuilt.coordinator.pending[0].checkpoint_id
    rebuilt.complete(rebuilt_id)
    history = rebuilt.coordinator.persisted_state.history
    assert [o.checkpoint_id for o in history] == [3, 4, rebuilt_id]


def test_a_full_state_round_trips_and_its_times_are_rfc3339_utc() -> None:
    harness = Harness(CoordinatorConfig(interval=None, tolerable_failures=5))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.complete(1, batch_id=0)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(FinalizationFailed(2, "permission denied"))
    harness.send(JobTerminated(TerminalOutcome.FAILED))
    state = harness.coordinator.persisted_state
    data = state.to_dict()

    assert data["terminated"] == "Failed"
    assert data["history"][-1]["reason"] == "FinalizeFailure"
    assert data["history"][-1]["message"] == "permission denied"
    assert data["history"][0]["batchId"] == 0
    # What an outcome lacks is left out: kubectl describe showed "Reason: <nil>".
    assert "reason" not in data["history"][0]
    assert "batchId" not in data["history"][-1] and "sizeBytes" not in data["history"][-1]
    assert "label" not in data["history"][0], "a routine checkpoint's outcome has no label"
    assert data["checkpoints"][0]["triggerTime"] == format_time(START)
    assert PersistedState.from_dict(data) == state
    assert format_time(0.0) == "1970-01-01T00:00:00Z"
    assert format_time(1.5) == "1970-01-01T00:00:01.500000Z"


def test_a_coordinator_rebuilt_after_termination_stays_shut_down() -> None:
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    harness.send(JobTerminated(TerminalOutcome.SUSPENDED))
    rebuilt = Harness(state=harness.coordinator.persisted_state, clock=harness.clock)
    rebuilt.start()
    (declined,) = of_type(rebuilt.send(TriggerRequested(CheckpointKind.SAVEPOINT)), RequestDeclined)
    assert declined.reason is FailureReason.COORDINATOR_SHUTDOWN
    assert declined.request.kind is CheckpointKind.SAVEPOINT


def _savepoint_dict(savepoint_id: int, **fields: object) -> dict[str, object]:
    return {
        "id": savepoint_id,
        "kind": "savepoint",
        "batchId": 0,
        "path": f"file:///store/sp-{savepoint_id}",
        "sizeBytes": 0,
        "triggerTime": format_time(START),
        "completionTime": format_time(START),
        **fields,
    }


def test_counts_and_ids_up_to_the_largest_exact_json_integer_are_read() -> None:
    data = PersistedState(next_checkpoint_id=4).to_dict()
    data.update(nextCheckpointId=MAX_COUNT, completedCount=MAX_COUNT, failedCount=MAX_COUNT)

    state = PersistedState.from_dict(data)

    assert (state.next_checkpoint_id, state.completed_count, state.failed_count) == (
        MAX_COUNT,
        MAX_COUNT,
        MAX_COUNT,
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "state: expected an object"),
        ({"nextCheckpointId": 1}, "checkpoints: missing"),
        ({"nextCheckpointId": 1, "checkpoints": {}}, "checkpoints: expected a list, got {}"),
        (
            {"nextCheckpointId": 1, "checkpoints": [{"id": 1, "kind": 5}]},
            "checkpoints[0].kind: expected a string, got 5",
        ),
        (
            {"nextCheckpointId": 1, "checkpoints": [{"id": 1, "kind": "snapshot"}]},
            "checkpoints[0].kind: expected one of checkpoint, savepoint, got 'snapshot'",
        ),
        ({"nextCheckpointId": True}, "nextCheckpointId: expected an integer, got True"),
        (
            {"nextCheckpointId": 3, "checkpoints": [], "savepoints": [_savepoint_dict(3)]},
            "nextCheckpointId: 3 is not above the newest registered id, 3",
        ),
        (
            {
                "nextCheckpointId": 4,
                "checkpoints": [],
                "savepoints": [_savepoint_dict(3, pinned="yes")],
            },
            "savepoints[0].pinned: expected a boolean, got 'yes'",
        ),
    ],
)
def test_invalid_state_messages_name_the_field_exactly(data: object, message: str) -> None:
    with pytest.raises(InvalidPersistedState) as raised:
        PersistedState.from_dict(data)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_an_outcome_with_a_zero_batch_and_size_round_trips() -> None:
    outcome = CheckpointOutcome(
        checkpoint_id=3,
        kind=CheckpointKind.CHECKPOINT,
        status=OutcomeStatus.COMPLETED,
        trigger_time=START,
        end_time=START,
        batch_id=0,
        size_bytes=0,
    )
    state = PersistedState(next_checkpoint_id=4, history=(outcome,))
    assert PersistedState.from_dict(state.to_dict()) == state


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_pause": -1.0}, "checkpointing.minPause must be >= 0, got -1.0"),
        ({"max_queued_requests": 0}, "max_queued_requests must be >= 1, got 0"),
        ({"history_size": 0}, "history_size must be >= 1, got 0"),
        (
            {"timeout": 0, "retained": 0},
            "checkpointing.timeout must be > 0, got 0; checkpointing.retained must be >= 1, got 0",
        ),
        (
            {"interval": None, "savepoint_interval": 60.0, "savepoint_schedule": Aligned(3600)},
            "savepoints.interval and savepoints.schedule: set one of them",
        ),
        (
            {"retention_policy": "Keep"},
            "checkpointing.retentionPolicy must be one of NeverRetainAfterTermination, "
            "RetainOnFailure, RetainOnCancellation, got 'Keep'",
        ),
    ],
)
def test_refused_settings_say_exactly_why(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        CoordinatorConfig(**options)  # type: ignore[arg-type]
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_count": 0}, "savepoints.historyMaxCount must be >= 1, got 0"),
        ({"max_age_seconds": 0.0}, "savepoints.historyMaxAge must be > 0 seconds, got 0.0"),
    ],
)
def test_refused_savepoint_limits_say_exactly_why(limits: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        SavepointHistoryLimits(**limits)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_the_smallest_allowed_settings_are_accepted() -> None:
    CoordinatorConfig(interval=5.0, min_pause=5.0, history_size=1, max_queued_requests=1)
    CoordinatorConfig(interval=None, savepoint_interval=0.5)  # > 0 is the only bound
    SavepointHistoryLimits(max_count=1, max_age_seconds=0.5)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            TaskDeclined(1, "state-0-0", "disk full"),
            "a task declined the checkpoint: disk full (task state-0-0)",
        ),
        (
            TriggerDeliveryFailed(1, "409 closing"),
            "the trigger could not be delivered to the job: 409 closing",
        ),
        (
            FinalizationFailed(1, "permission denied"),
            "writing the checkpoint metadata failed: permission denied",
        ),
        (JobPhaseChanged(JobPhase.RESTARTING), "the job left the Running phase"),
    ],
)
def test_abort_messages_give_the_reason_and_the_detail(event: object, message: str) -> None:
    harness = Harness(CoordinatorConfig(interval=None, tolerable_failures=5))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    abort = _abort_message(harness, event)
    assert (abort.checkpoint_id, abort.kind, abort.message) == (
        1,
        CheckpointKind.CHECKPOINT,
        message,
    )


def test_expiry_and_subsumption_messages() -> None:
    harness = Harness(CoordinatorConfig(interval=None, timeout=30.0, max_concurrent=3))
    harness.start()
    for _ in range(3):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    aborts = of_type(harness.complete(3), AbortCheckpoint)
    assert [(a.checkpoint_id, a.message) for a in aborts] == [
        (1, "a newer checkpoint completed first: by checkpoint 3"),
        (2, "a newer checkpoint completed first: by checkpoint 3"),
    ]
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    aborts = of_type(harness.advance(30.0), AbortCheckpoint)
    assert [(a.checkpoint_id, a.kind, a.message) for a in aborts] == [
        (4, CheckpointKind.SAVEPOINT, "the checkpoint expired before all tasks acknowledged"),
        (5, CheckpointKind.SAVEPOINT, "the checkpoint expired before all tasks acknowledged"),
    ]


def test_leaving_running_aborts_every_pending_checkpoint_in_id_order() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=3))
    harness.start()
    for _ in range(3):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    aborts = of_type(harness.send(JobPhaseChanged(JobPhase.DEPLOYING)), AbortCheckpoint)
    assert [a.checkpoint_id for a in aborts] == [1, 2, 3]
    history = harness.coordinator.persisted_state.history
    assert [(o.reason, o.message) for o in history] == [(FailureReason.COORDINATOR_SUSPEND, "")] * 3


def test_a_periodic_request_meeting_a_full_queue_of_user_requests_is_declined() -> None:
    config = CoordinatorConfig(interval=10.0, max_concurrent=1, max_queued_requests=1)
    harness = Harness(config)
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="running"))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="queued"))
    due = harness.coordinator.next_periodic_trigger
    assert due is not None
    harness.clock.now = due
    (declined,) = of_type(harness.advance(0.0), RequestDeclined)
    assert (declined.request.origin, declined.reason) == (
        RequestOrigin.PERIODIC,
        FailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
    )


def test_every_periodic_request_inside_the_minimum_pause_is_declined() -> None:
    """Two periodic requests wait behind a user checkpoint; when it completes, both fall
    inside the minimum pause and both are declined, and the next trigger is rescheduled."""
    config = CoordinatorConfig(interval=10.0, min_pause=8.0, max_concurrent=1, timeout=100.0)
    harness = Harness(config)
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="slow"))
    for _ in range(2):
        due = harness.coordinator.next_periodic_trigger
        assert due is not None
        harness.clock.now = due
        harness.advance(0.0)
    assert [r.origin for r in harness.coordinator.queued] == [RequestOrigin.PERIODIC] * 2
    effects = harness.complete(1)
    declined = of_type(effects, RequestDeclined)
    assert [(d.request.origin, d.reason) for d in declined] == [
        (RequestOrigin.PERIODIC, FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
    ] * 2
    assert harness.coordinator.queued == ()
    assert harness.coordinator.next_periodic_trigger == harness.clock.now + 8.0


def test_declines_carry_the_request_that_was_declined() -> None:
    harness = Harness(CoordinatorConfig(interval=10.0, min_pause=5.0))
    harness.send(TasksReported(TASKS, all_running=True))  # no phase yet: not Running
    (declined,) = of_type(
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="early")), RequestDeclined
    )
    assert (declined.request.label, declined.request.origin, declined.reason) == (
        "early",
        RequestOrigin.USER,
        FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING,
    )
    assert declined.request.requested_at == START

    harness.send(JobPhaseChanged(JobPhase.RUNNING))
    first = harness.next_trigger()
    harness.complete(first.checkpoint_id)
    harness.clock.now = harness.coordinator.next_periodic_trigger or 0.0
    declined_periodic = of_type(harness.advance(0.0), RequestDeclined)
    if declined_periodic:  # the period ended inside the minimum pause
        (periodic,) = declined_periodic
        assert periodic.request.origin is RequestOrigin.PERIODIC


def test_trigger_and_finalize_effects_carry_kind_and_after() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=2))
    harness.start()
    effects = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.DRAIN))
    (trigger,) = of_type(effects, TriggerCheckpoint)
    assert (trigger.kind, trigger.after, trigger.expected_tasks) == (
        CheckpointKind.SAVEPOINT,
        AfterCompletion.DRAIN,
        TASKS,
    )
    (pending,) = harness.coordinator.pending
    assert pending.forced is True
    (finalize,) = of_type(harness.ack_all(trigger.checkpoint_id), FinalizeCheckpoint)
    assert finalize.kind is CheckpointKind.SAVEPOINT
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, forced=False))
    assert harness.coordinator.pending[-1].forced is False


def test_a_duplicate_ack_after_all_acknowledged_finalizes_once() -> None:
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert len(of_type(harness.ack_all(1), FinalizeCheckpoint)) == 1
    duplicate = harness.send(TaskAcknowledged(1, TaskAck("logs", 3, 10, 1)))
    unknown = harness.send(TaskAcknowledged(1, TaskAck("state-9-9", 3, 10, 1)))
    assert duplicate == [] and unknown == []


def test_a_queued_request_runs_as_soon_as_the_pending_one_fails() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=1, tolerable_failures=5))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="waiting"))
    (trigger,) = of_type(harness.send(TaskDeclined(1, "logs", "x")), TriggerCheckpoint)
    assert trigger.checkpoint_id == 2
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="waiting too"))
    (trigger,) = of_type(_inconsistent(harness, 2), TriggerCheckpoint)
    assert trigger.checkpoint_id == 3


def _inconsistent(harness: Harness, checkpoint_id: int) -> list[Effect]:
    first, second, *_ = sorted(TASKS)
    harness.send(TaskAcknowledged(checkpoint_id, TaskAck(first, 3, 10, 1)))
    return harness.send(TaskAcknowledged(checkpoint_id, TaskAck(second, 4, 10, 1)))


def test_requests_at_the_same_time_run_in_arrival_order() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=1))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="running"))
    for label in ("first", "second", "third"):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label=label))
    assert [r.label for r in harness.coordinator.queued] == ["first", "second", "third"]


def test_a_failed_stopping_savepoint_of_a_job_not_running_does_not_restart_the_scheduler() -> None:
    harness = Harness(CoordinatorConfig(interval=10.0))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.STOP))
    harness.send(JobPhaseChanged(JobPhase.RESTARTING))
    assert not harness.coordinator.periodic_scheduling


def test_termination_discards_with_nothing_retained() -> None:
    harness = Harness(
        CoordinatorConfig(
            interval=None, retention_policy=RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION
        )
    )
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.complete(1)
    discards = of_type(harness.send(JobTerminated(TerminalOutcome.FINISHED)), DiscardCheckpoint)
    assert discards == [DiscardCheckpoint(1, ())]


def _savepoint(checkpoint_id: int, completed_at: float) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.SAVEPOINT,
        batch_id=checkpoint_id,
        path=f"file:///s/sp-{checkpoint_id}",
        size_bytes=1,
        trigger_time=completed_at,
        completion_time=completed_at,
    )


def test_savepoint_history_read_in_any_order_trims_the_oldest() -> None:
    history = SavepointHistory(
        SavepointHistoryLimits(max_count=2), [_savepoint(3, 30.0), _savepoint(1, 10.0)]
    )
    assert [s.checkpoint_id for s in history.savepoints] == [1, 3]
    dropped = history.add(_savepoint(4, 40.0), now=40.0)
    assert [s.checkpoint_id for s in dropped] == [1]


def test_savepoint_history_drops_old_and_excess_ones_oldest_first() -> None:
    limits = SavepointHistoryLimits(max_count=2, max_age_seconds=100.0)
    history = SavepointHistory(limits, [_savepoint(i, 10.0 * i) for i in (1, 2, 3, 4, 5)])
    # At 125 s: 1 and 2 are too old (>= 100 s); of 3, 4 and the newest 5, 3 is one too many.
    assert [s.checkpoint_id for s in history.expire(125.0)] == [1, 2, 3]
    assert [s.checkpoint_id for s in history.savepoints] == [4, 5]


def test_over_the_count_a_savepoint_the_job_cannot_restore_goes_first() -> None:
    """A newcomer's: sp-106 failed its restore (a corrupt file), and the next savepoint
    made the history of 2 delete sp-104, which the job could restore, keeping sp-106,
    protected as the newest."""
    history = SavepointHistory(
        SavepointHistoryLimits(max_count=2),
        [_savepoint(104, 10.0), _savepoint(106, 20.0)],
        unrestorable=lambda savepoint_id: savepoint_id == 106,
    )
    dropped = history.add(_savepoint(108, 30.0), now=30.0)
    assert [s.checkpoint_id for s in dropped] == [106]
    assert [s.checkpoint_id for s in history.savepoints] == [104, 108]


@settings(max_examples=300, deadline=None)
@given(
    max_count=st.integers(1, 100),
    max_age=st.none() | st.floats(1.0, 100.0),
    completions=st.dictionaries(st.integers(1, 30), st.floats(0.0, 300.0), min_size=1),
    in_id_order=st.booleans(),
    unrestorable=st.sets(st.integers(1, 30)),
    pinned=st.sets(st.integers(1, 30)),
    now=st.floats(0.0, 400.0),
)
def test_the_history_keeps_the_newest_restorable_and_drops_unrestorable_ones_first(
    *,
    max_count: int,
    max_age: float | None,
    completions: dict[int, float],
    in_id_order: bool,
    unrestorable: set[int],
    pinned: set[int],
    now: float,
) -> None:
    """Pinned savepoints (a SparkCheckpointSnapshot's) are kept whatever the limits, and
    the limits count only the others."""
    # Savepoints are forced, so several run at once and may complete out of id order.
    ids = sorted(completions)
    if in_id_order:
        completions = {i: 10.0 * i for i in ids}
    limits = SavepointHistoryLimits(max_count=max_count, max_age_seconds=max_age)
    savepoints = [
        dataclasses.replace(_savepoint(i, completions[i]), pinned=i in pinned) for i in ids
    ]
    history = SavepointHistory(limits, savepoints, unrestorable.__contains__)
    dropped = {s.checkpoint_id for s in history.expire(now)}
    kept = {s.checkpoint_id for s in history.savepoints}
    # Its next deadline is the first time `expire` acts: a past one would come back for
    # ever (the supervisor polled with no wait, over and over, a reviewer found), a later
    # one keeps a savepoint past its age (an auditor's, out of id order).
    due = history.next_expiry()
    assert due is None or due > now
    if due is not None:
        later = SavepointHistory(limits, history.savepoints, unrestorable.__contains__)
        assert later.expire(math.nextafter(due, 0.0)) == []
        assert history.expire(due) != []

    assert dropped | kept == set(ids) and not dropped & kept
    restorable = sorted(set(ids) - unrestorable)
    newest = restorable[-1] if restorable else max(ids)
    assert newest in kept
    assert pinned & set(ids) <= kept
    assert len(kept - pinned) <= max(max_count, 1)
    # No unrestorable one kept while a restorable one was dropped for the count.
    young_dropped = {i for i in dropped if max_age is None or now - completions[i] < max_age}
    if young_dropped - unrestorable:
        assert not (kept - {newest} - pinned) & unrestorable


def test_a_released_savepoint_is_judged_by_the_limits_again() -> None:
    pinned = dataclasses.replace(_savepoint(1, 10.0), pinned=True)
    history = SavepointHistory(SavepointHistoryLimits(max_count=1), [pinned])
    assert history.add(_savepoint(2, 20.0), now=20.0) == []
    assert history.add(_savepoint(3, 30.0), now=30.0) == [_savepoint(2, 20.0)]
    assert [s.checkpoint_id for s in history.savepoints] == [1, 3]
    assert [s.checkpoint_id for s in history.pin(1, False, now=40.0)] == [1]
    assert [s.checkpoint_id for s in history.savepoints] == [3]


def test_a_released_savepoint_that_is_the_newest_stays_and_pushes_an_older_one_out() -> None:
    """As docs/operator.md says: the history keeps the newest (a reviewer's case)."""
    pinned = dataclasses.replace(_savepoint(10, 100.0), pinned=True)
    history = SavepointHistory(SavepointHistoryLimits(max_count=1), [_savepoint(5, 50.0), pinned])
    assert [s.checkpoint_id for s in history.pin(10, False, now=110.0)] == [5]
    assert [s.checkpoint_id for s in history.savepoints] == [10]


@given(
    retained=st.integers(1, 12),
    ids=st.lists(st.integers(1, 40), min_size=1, max_size=30, unique=True),
    unrestorable=st.sets(st.integers(1, 40)),
)
def test_retention_keeps_the_newest_restorable_checkpoints_and_drops_unrestorable_ones_first(
    *, retained: int, ids: list[int], unrestorable: set[int]
) -> None:
    """A newcomer's: with retained: 2, a checkpoint a restore had skipped as corrupt was
    kept and the good one before it discarded, leaving one the job could restore."""
    store = CompletedCheckpointStore(retained, unrestorable=unrestorable.__contains__)
    for checkpoint_id in ids:  # completions in any order of ids
        before = [c.checkpoint_id for c in store.checkpoints] + [checkpoint_id]
        gone = [c.checkpoint_id for c in store.add(_checkpoint(checkpoint_id))]
        kept = [c.checkpoint_id for c in store.checkpoints]

        assert sorted(kept + gone) == sorted(before) and kept == sorted(kept)
        assert len(kept) == min(retained, len(before))
        # The unrestorable first, oldest first; then the oldest restorable.
        first_to_go = sorted(before, key=lambda i: (i not in unrestorable, i))
        assert sorted(gone) == sorted(first_to_go[: len(gone)])


def test_a_checkpoint_a_restore_passed_over_goes_before_a_good_one() -> None:
    store = CompletedCheckpointStore(
        2, [_checkpoint(101), _checkpoint(102)], unrestorable={102}.__contains__
    )

    assert [c.checkpoint_id for c in store.add(_checkpoint(201))] == [102]
    assert [c.checkpoint_id for c in store.checkpoints] == [101, 201]


def test_a_registry_over_a_lowered_retained_count_gives_up_its_excess_oldest_first() -> None:
    """Restored with more checkpoints than `retained` now allows, the next completion
    subsumes every one over the count: the one a restore passed over goes first, and all
    are reported (and so discarded) oldest first."""
    restored = [_checkpoint(101), _checkpoint(102), _checkpoint(103)]
    store = CompletedCheckpointStore(1, restored, unrestorable={102}.__contains__)

    assert [c.checkpoint_id for c in store.add(_checkpoint(104))] == [101, 102, 103]
    assert [c.checkpoint_id for c in store.checkpoints] == [104]


def test_a_savepoint_the_history_does_not_hold_is_removed_as_none() -> None:
    history = SavepointHistory(SavepointHistoryLimits(), [_savepoint(1, 10.0)])

    assert history.remove(2) is None
    assert [s.checkpoint_id for s in history.savepoints] == [1]


def _checkpoint(checkpoint_id: int) -> CompletedCheckpoint:
    return dataclasses.replace(_savepoint(checkpoint_id, 0.0), kind=CheckpointKind.CHECKPOINT)


def test_the_newest_savepoint_never_ages_out_and_sets_no_deadline_alone() -> None:
    limits = SavepointHistoryLimits(max_count=5, max_age_seconds=10.0)
    history = SavepointHistory(limits, [_savepoint(1, 0.0)])
    assert history.expire(1000.0) == []
    assert history.next_expiry() is None
    history = SavepointHistory(limits, [_savepoint(1, 0.0), _savepoint(2, 5.0)])
    assert history.next_expiry() == 10.0
    unlimited = SavepointHistory(SavepointHistoryLimits(), [_savepoint(1, 0.0), _savepoint(2, 5.0)])
    assert unlimited.next_expiry() is None


def test_a_savepoint_completing_after_a_newer_one_is_kept_until_the_next_trim() -> None:
    limits = SavepointHistoryLimits(max_count=1)
    harness = Harness(CoordinatorConfig(interval=None, savepoint_history=limits))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))  # 1
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))  # 2
    harness.complete(2)
    effects = harness.complete(1)
    assert of_type(effects, DiscardSavepoint) == []
    assert [s.checkpoint_id for s in harness.coordinator.persisted_state.savepoints] == [1, 2]
    effects = harness.advance(1.0)
    assert [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)] == [1]
    (persist,) = of_type(effects, PersistState)
    assert [s.checkpoint_id for s in persist.state.savepoints] == [2]


def test_stores_refuse_the_other_kind_by_name() -> None:
    savepoint = _savepoint(2, 0.0)
    with pytest.raises(ValueError, match=re.escape("savepoint 2 is not a checkpoint")):
        CompletedCheckpointStore(1).add(savepoint)
    checkpoint = CompletedCheckpoint(2, CheckpointKind.CHECKPOINT, 1, "p", 1, 0.0, 0.0)
    with pytest.raises(ValueError, match=re.escape("checkpoint 2 is not a savepoint")):
        SavepointHistory(SavepointHistoryLimits()).add(checkpoint, now=0.0)


def test_missed_periods_keep_the_base_grid() -> None:
    harness = Harness(CoordinatorConfig(interval=10.0))
    harness.start()
    first = harness.coordinator.next_periodic_trigger
    assert first is not None
    harness.clock.now = first + 25.0  # woke 2.5 periods late
    harness.send(TasksReported(TASKS, all_running=True))
    effects = harness.advance(0.0)
    assert len(of_type(effects, TriggerCheckpoint)) == 1
    assert harness.coordinator.next_periodic_trigger == first + 30.0


def test_notification_carries_the_completed_image() -> None:
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, label="before-upgrade"))
    (notify,) = of_type(harness.complete(1, batch_id=7), NotifyCheckpointComplete)
    assert (notify.checkpoint.label, notify.checkpoint.batch_id, notify.checkpoint.size_bytes) == (
        "before-upgrade",
        7,
        300,
    )
