"""Periodic scheduling and the Running-only deactivator."""

from dataclasses import dataclass

import pytest

from helpers.coordinator import START, TASKS, Aligned, Harness, of_type
from spark_checkpoint_operator.coordinator import (
    PERIODIC_SAVEPOINT_LABEL,
    AbortCheckpoint,
    AfterCompletion,
    CheckpointKind,
    CoordinatorConfig,
    DiscardSavepoint,
    FailJob,
    FailureReason,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    PersistedState,
    PersistState,
    RequestDeclined,
    RequestOrigin,
    SavepointHistoryLimits,
    TaskDeclined,
    TasksReported,
    TerminalOutcome,
    Tick,
    TriggerCheckpoint,
    TriggerRequested,
    TriggerWithdrawn,
)


@pytest.mark.parametrize("seed", range(20))
def test_first_trigger_after_random_delay_between_min_pause_and_interval(seed: int) -> None:
    harness = Harness(CoordinatorConfig(interval=10.0, min_pause=4.0), seed=seed)
    harness.start()
    first = harness.coordinator.next_periodic_trigger
    assert first is not None
    assert START + 4.0 <= first <= START + 10.0

    harness.clock.now = first - 0.001
    assert of_type(harness.send(Tick()), TriggerCheckpoint) == []
    harness.clock.now = first
    assert [t.checkpoint_id for t in of_type(harness.send(Tick()), TriggerCheckpoint)] == [1]


def test_initial_delay_depends_on_the_injected_randomness() -> None:
    delays = set()
    for seed in range(10):
        harness = Harness(CoordinatorConfig(interval=10.0, min_pause=0.0), seed=seed)
        harness.start()
        delays.add(harness.coordinator.next_periodic_trigger)
    assert len(delays) > 1


def test_periodic_triggers_follow_the_base_interval(harness: Harness) -> None:
    harness.start()
    first = harness.next_trigger()
    harness.complete(first.checkpoint_id)
    second = harness.next_trigger()
    harness.complete(second.checkpoint_id)
    third = harness.next_trigger()
    assert second.trigger_time - first.trigger_time == pytest.approx(10.0)
    assert third.trigger_time - second.trigger_time == pytest.approx(10.0)


def test_missed_periods_do_not_fire_back_to_back(harness: Harness) -> None:
    harness.start()
    first = harness.next_trigger()
    harness.complete(first.checkpoint_id)
    effects = harness.advance(35.0)
    assert len(of_type(effects, TriggerCheckpoint)) == 1
    next_at = harness.coordinator.next_periodic_trigger
    assert next_at is not None and next_at > harness.clock.now


def test_no_periodic_trigger_before_the_job_runs() -> None:
    harness = Harness()
    assert harness.coordinator.next_periodic_trigger is None
    assert harness.coordinator.next_deadline() is None
    assert harness.advance(100.0) == []


def test_interval_none_disables_periodic_checkpoints_but_not_manual_ones() -> None:
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    assert harness.coordinator.next_periodic_trigger is None
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert [t.checkpoint_id for t in of_type(effects, TriggerCheckpoint)] == [1]


@pytest.mark.parametrize(
    "phase", [p for p in JobPhase if p is not JobPhase.RUNNING], ids=lambda p: p.value
)
def test_leaving_running_stops_scheduler_and_aborts_pending_and_queued(phase: JobPhase) -> None:
    harness = Harness(CoordinatorConfig(interval=10.0, max_concurrent=1))
    harness.start()
    pending = harness.next_trigger()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="queued-user"))
    harness.advance(10.0)  # a periodic request queues behind the pending one
    assert len(harness.coordinator.queued) == 2

    effects = harness.send(JobPhaseChanged(phase))

    aborts = of_type(effects, AbortCheckpoint)
    assert [(a.checkpoint_id, a.reason) for a in aborts] == [
        (pending.checkpoint_id, FailureReason.COORDINATOR_SUSPEND)
    ]
    declined = {(d.request.label, d.reason) for d in of_type(effects, RequestDeclined)}
    assert declined == {
        ("queued-user", FailureReason.COORDINATOR_SUSPEND),
        ("", FailureReason.PERIODIC_SCHEDULER_SHUTDOWN),
    }
    assert harness.coordinator.pending == ()
    assert harness.coordinator.queued == ()
    assert not harness.coordinator.periodic_scheduling
    assert of_type(harness.advance(100.0), TriggerCheckpoint) == []


def stop_with_savepoint(harness: Harness) -> TriggerCheckpoint:
    effects = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.STOP))
    (trigger,) = of_type(effects, TriggerCheckpoint)
    return trigger


@pytest.mark.parametrize("after", [AfterCompletion.STOP, AfterCompletion.DRAIN])
def test_a_stopping_savepoint_holds_periodic_triggers_until_the_query_stops(
    after: AfterCompletion,
) -> None:
    harness = Harness(CoordinatorConfig(interval=10.0, max_concurrent=1))
    harness.start()
    running = harness.next_trigger()
    harness.advance(10.0)  # a periodic request queues behind the running checkpoint
    assert len(harness.coordinator.queued) == 1

    effects = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=after))

    (savepoint,) = of_type(effects, TriggerCheckpoint)
    declined = [(d.request.is_periodic, d.reason) for d in of_type(effects, RequestDeclined)]
    assert declined == [(True, FailureReason.PERIODIC_SCHEDULER_SHUTDOWN)]
    assert not harness.coordinator.periodic_scheduling
    assert [p.checkpoint_id for p in harness.coordinator.pending] == [
        running.checkpoint_id,
        savepoint.checkpoint_id,
    ], "a checkpoint triggered before the stop may still complete"
    harness.complete(running.checkpoint_id)
    harness.send(JobPhaseChanged(JobPhase.RUNNING))  # a repeated report does not restart it
    assert of_type(harness.advance(30.0), TriggerCheckpoint) == []

    harness.complete(savepoint.checkpoint_id)
    assert of_type(harness.advance(30.0), TriggerCheckpoint) == []
    assert of_type(harness.send(JobPhaseChanged(JobPhase.SUSPENDING)), AbortCheckpoint) == []


def test_a_failed_stopping_savepoint_restarts_periodic_triggers(harness: Harness) -> None:
    harness.start()
    savepoint = stop_with_savepoint(harness)
    assert not harness.coordinator.periodic_scheduling

    harness.send(TaskDeclined(savepoint.checkpoint_id, "logs", "disk full"))

    assert harness.coordinator.periodic_scheduling
    assert harness.next_trigger().checkpoint_id == savepoint.checkpoint_id + 1


def test_a_savepoint_that_continues_keeps_periodic_triggers(harness: Harness) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    assert harness.coordinator.periodic_scheduling


def test_termination_during_a_stopping_savepoint_leaves_the_scheduler_stopped(
    harness: Harness,
) -> None:
    harness.start()
    stop_with_savepoint(harness)

    effects = harness.send(JobTerminated(TerminalOutcome.CANCELLED))

    assert len(of_type(effects, AbortCheckpoint)) == 1
    assert not harness.coordinator.periodic_scheduling


def test_returning_to_running_restarts_with_a_fresh_random_delay(harness: Harness) -> None:
    harness.start()
    harness.send(JobPhaseChanged(JobPhase.RESTARTING))
    harness.clock.now += 50.0
    harness.send(JobPhaseChanged(JobPhase.RUNNING))
    next_at = harness.coordinator.next_periodic_trigger
    assert next_at is not None
    assert harness.clock.now <= next_at <= harness.clock.now + 10.0


def test_repeated_running_reports_do_not_reset_the_schedule(harness: Harness) -> None:
    harness.start()
    first = harness.coordinator.next_periodic_trigger
    harness.clock.now += 1.0
    harness.send(JobPhaseChanged(JobPhase.RUNNING))
    assert harness.coordinator.next_periodic_trigger == first


def test_user_request_while_job_is_not_running_is_declined() -> None:
    harness = Harness()
    harness.start()
    harness.send(JobPhaseChanged(JobPhase.RESTARTING))
    effects = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    assert [d.reason for d in of_type(effects, RequestDeclined)] == [
        FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING
    ]


@pytest.mark.parametrize("after", [AfterCompletion.STOP, AfterCompletion.DRAIN])
def test_a_declined_stopping_savepoint_leaves_the_job_running(after: AfterCompletion) -> None:
    """Differs from Flink, which fails the job (its tasks may have finished by then): here
    the query stops only once the savepoint is registered, so it runs on unchanged."""
    harness = Harness(CoordinatorConfig(interval=10.0, tolerable_failures=0))
    harness.start()
    effects = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=after))
    (savepoint,) = of_type(effects, TriggerCheckpoint)

    effects = harness.send(TaskDeclined(savepoint.checkpoint_id, "state-0-0", "disk full"))

    (abort,) = of_type(effects, AbortCheckpoint)
    assert abort.reason is FailureReason.TASK_DECLINED
    assert of_type(effects, FailJob) == []
    assert harness.coordinator.consecutive_failures == 0
    assert harness.coordinator.periodic_scheduling


@pytest.mark.parametrize("after", [AfterCompletion.STOP, AfterCompletion.DRAIN])
def test_a_withdrawn_stopping_savepoint_lets_periodic_checkpoints_resume(
    after: AfterCompletion,
) -> None:
    """A suspension taken back: its drain would wait for input that never runs out, with
    periodic checkpoints held all along and no way to end it (a reviewer)."""
    harness = Harness(CoordinatorConfig(interval=10.0, tolerable_failures=0))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=after, label="suspend"))
    assert not harness.coordinator.periodic_scheduling
    kept = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, label="nonce 7"))

    effects = harness.send(TriggerWithdrawn("suspend"))

    (abort,) = of_type(effects, AbortCheckpoint)
    assert abort.reason is FailureReason.WITHDRAWN
    assert of_type(effects, FailJob) == []
    assert harness.coordinator.consecutive_failures == 0
    assert harness.coordinator.periodic_scheduling
    (other,) = harness.coordinator.pending
    assert other.checkpoint_id == of_type(kept, TriggerCheckpoint)[0].checkpoint_id
    assert harness.send(TriggerWithdrawn("suspend")) == [], "nothing left to withdraw"


PERIODIC_SAVEPOINTS = CoordinatorConfig(interval=None, timeout=60.0, savepoint_interval=30.0)


def periodic_savepoints(effects: list[object], harness: Harness) -> list[TriggerCheckpoint]:
    labels = {p.checkpoint_id: p.label for p in harness.coordinator.pending}
    return [
        t
        for t in of_type(effects, TriggerCheckpoint)
        if labels.get(t.checkpoint_id) == PERIODIC_SAVEPOINT_LABEL
    ]


def test_periodic_savepoints_come_an_interval_apart_from_the_first_running() -> None:
    """savepoints.interval (the Flink Kubernetes Operator's periodic savepoints): the first
    an interval after the job first ran, each later one an interval after the one before,
    without periodic checkpoints."""
    harness = Harness(PERIODIC_SAVEPOINTS)
    assert harness.coordinator.next_periodic_savepoint is None, "the job has not run yet"
    harness.start()
    assert harness.coordinator.persisted_state.last_periodic_savepoint == START
    assert harness.coordinator.next_deadline() == START + 30.0
    assert harness.coordinator.next_periodic_savepoint == START + 30.0

    assert periodic_savepoints(harness.advance(29.0), harness) == []
    (first,) = periodic_savepoints(harness.advance(1.0), harness)
    assert first.kind is CheckpointKind.SAVEPOINT
    assert harness.coordinator.persisted_state.last_periodic_savepoint == START + 30.0
    assert harness.coordinator.next_periodic_savepoint == START + 60.0, "the next after it"
    harness.complete(first.checkpoint_id)
    assert harness.coordinator.persisted_state.savepoints[-1].label == PERIODIC_SAVEPOINT_LABEL

    assert periodic_savepoints(harness.advance(29.5), harness) == []
    assert len(periodic_savepoints(harness.advance(0.5), harness)) == 1


def test_a_periodic_savepoint_is_asked_for_and_not_pinned() -> None:
    """As a savepoint asked for: the operator writes status when it goes out (someone
    waits for a savepoint), and unpinned, the history's count lets it go."""
    harness = Harness(
        CoordinatorConfig(
            interval=None,
            timeout=60.0,
            savepoint_interval=30.0,
            savepoint_history=SavepointHistoryLimits(max_count=1),
        )
    )
    harness.start()
    (first,) = periodic_savepoints(harness.advance(30.0), harness)
    assert [p.origin for p in harness.coordinator.pending] == [RequestOrigin.USER]
    harness.complete(first.checkpoint_id)
    (second,) = periodic_savepoints(harness.advance(30.0), harness)

    effects = harness.complete(second.checkpoint_id)

    dropped = [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)]
    assert dropped == [first.checkpoint_id]


def test_a_periodic_savepoint_a_full_queue_turns_away_is_declined() -> None:
    """A queue full of user requests takes no other (`RequestQueue.offer`): the periodic
    savepoint is declined, said so, and the next is due an interval later."""
    harness = Harness(
        CoordinatorConfig(
            interval=None,
            timeout=600.0,
            max_concurrent=1,
            max_queued_requests=1,
            savepoint_interval=30.0,
        )
    )
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="nonce 1"))  # pending
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="nonce 2"))  # queued

    effects = harness.advance(30.0)

    (declined,) = of_type(effects, RequestDeclined)
    assert (declined.request.label, declined.reason) == (
        PERIODIC_SAVEPOINT_LABEL,
        FailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
    )
    assert harness.coordinator.next_periodic_savepoint == START + 60.0


def test_periodic_savepoints_by_a_schedule_come_at_its_times() -> None:
    """savepoints.schedule (a cron expression, read outside the core): the first at the
    schedule's first time after the job first ran, each later one at its next time after
    the one before; a time missed while the job did not run is caught up once."""
    config = CoordinatorConfig(interval=None, timeout=60.0, savepoint_schedule=Aligned(10))
    harness = Harness(config)
    harness.start()
    first_time = Aligned(10).next_after(START)
    assert harness.coordinator.next_deadline() == first_time

    assert periodic_savepoints(harness.advance(first_time - START - 0.5), harness) == []
    (first,) = periodic_savepoints(harness.advance(0.5), harness)
    harness.complete(first.checkpoint_id)
    assert harness.coordinator.next_deadline() == first_time + 10.0

    harness.send(JobPhaseChanged(JobPhase.RESTARTING))
    assert harness.advance(35.0) == []
    caught_up = periodic_savepoints(harness.send(JobPhaseChanged(JobPhase.RUNNING)), harness)
    assert len(caught_up) == 1, "three times missed, one savepoint"
    harness.complete(caught_up[0].checkpoint_id)
    assert harness.coordinator.next_deadline() == Aligned(10).next_after(harness.clock())


@dataclass(frozen=True)
class OnceAtTen:
    """A calendar whose times run out (a cron expression's years past)."""

    def next_after(self, wall_time: float) -> float | None:
        return START + 10.0 if wall_time < START + 10.0 else None


def test_a_schedule_that_runs_out_takes_no_more_savepoints() -> None:
    harness = Harness(
        CoordinatorConfig(interval=None, timeout=60.0, savepoint_schedule=OnceAtTen())
    )
    harness.start()
    assert harness.coordinator.next_periodic_savepoint == START + 10.0
    (only,) = periodic_savepoints(harness.advance(10.0), harness)
    harness.complete(only.checkpoint_id)

    assert harness.coordinator.next_deadline() is None
    assert harness.coordinator.next_periodic_savepoint is None
    assert periodic_savepoints(harness.advance(3600.0), harness) == []


def test_a_periodic_savepoint_waits_for_the_tasks_and_for_the_last_one_to_end() -> None:
    harness = Harness(PERIODIC_SAVEPOINTS)
    harness.start()
    harness.send(TasksReported(TASKS, all_running=False))  # an executor lost
    assert periodic_savepoints(harness.advance(45.0), harness) == []
    assert harness.coordinator.next_deadline() is None, "no Tick until the tasks run"

    # Due all the same: taken once the tasks run.
    assert harness.coordinator.next_periodic_savepoint == START + 30.0
    (late,) = periodic_savepoints(harness.send(TasksReported(TASKS, all_running=True)), harness)
    assert periodic_savepoints(harness.advance(40.0), harness) == [], "one in flight"
    assert harness.coordinator.next_deadline() == late.trigger_time + 60.0  # its timeout
    # Due since 75 s: the next one goes as the last one completes.
    assert len(periodic_savepoints(harness.complete(late.checkpoint_id), harness)) == 1


def test_a_restarted_coordinator_keeps_the_periodic_savepoints_schedule() -> None:
    """The time of the last one is persisted: a restart (the operator's, the driver's)
    neither takes one at once nor waits a whole interval again."""
    harness = Harness(PERIODIC_SAVEPOINTS)
    harness.start()
    harness.advance(20.0)
    state = PersistedState.from_dict(harness.coordinator.persisted_state.to_dict())

    restarted = Harness(PERIODIC_SAVEPOINTS, state=state, clock=harness.clock)
    assert periodic_savepoints(restarted.start(), restarted) == []
    assert periodic_savepoints(restarted.advance(9.5), restarted) == []
    assert len(periodic_savepoints(restarted.advance(0.5), restarted)) == 1


def test_periodic_savepoints_turned_on_again_start_their_schedule_afresh() -> None:
    """Not at once from the time of the last one before they were turned off (a
    reviewer's: it fired as the setting came back)."""
    harness = Harness(PERIODIC_SAVEPOINTS)
    harness.start()
    harness.advance(10.0)
    off = Harness(
        CoordinatorConfig(interval=None, timeout=60.0),
        state=harness.coordinator.persisted_state,
        clock=harness.clock,
    )
    off.start()
    assert off.coordinator.persisted_state.last_periodic_savepoint is None
    off.advance(1000.0)

    on = Harness(PERIODIC_SAVEPOINTS, state=off.coordinator.persisted_state, clock=harness.clock)
    assert periodic_savepoints(on.start(), on) == []
    assert on.coordinator.next_deadline() == harness.clock() + 30.0


def test_no_periodic_savepoint_while_a_stop_with_savepoint_is_pending() -> None:
    """The query stops once the stopping savepoint completes: one more would be aborted."""
    harness = Harness(PERIODIC_SAVEPOINTS)
    harness.start()
    harness.advance(20.0)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.STOP))

    assert periodic_savepoints(harness.advance(15.0), harness) == []
    deadline = harness.coordinator.next_deadline()
    assert deadline is not None and deadline > START + 30.0, "its timeout, not the schedule"


def test_no_periodic_savepoint_before_the_agent_reported_its_tasks() -> None:
    """Without tasks a trigger is declined: the schedule would move on for nothing."""
    harness = Harness(PERIODIC_SAVEPOINTS)
    harness.send(TasksReported(frozenset(), all_running=True))  # its query not started yet
    harness.send(JobPhaseChanged(JobPhase.RUNNING))
    assert harness.advance(45.0) == []
    assert harness.coordinator.next_deadline() is None

    assert len(periodic_savepoints(harness.send(TasksReported(TASKS, True)), harness)) == 1


def test_a_periodic_savepoint_in_flight_is_not_asked_again_of_a_replacing_coordinator() -> None:
    """New settings replace the coordinator and ask again for what users asked for; the
    schedule asks for a periodic savepoint itself, and asked twice it would be taken twice."""
    harness = Harness(PERIODIC_SAVEPOINTS)
    harness.start()
    harness.advance(30.0)
    assert [p.label for p in harness.coordinator.pending] == [PERIODIC_SAVEPOINT_LABEL]
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, label="nonce 1"))

    again = harness.coordinator.unfinished_user_requests()

    assert [r.label for r in again] == ["nonce 1"]


@pytest.mark.parametrize("outcome", list(TerminalOutcome))
def test_an_ended_job_has_no_next_periodic_savepoint(outcome: TerminalOutcome) -> None:
    harness = Harness(PERIODIC_SAVEPOINTS)
    harness.start()
    harness.send(JobTerminated(outcome))

    assert harness.coordinator.next_periodic_savepoint is None


def test_without_periodic_savepoints_none_is_next() -> None:
    harness = Harness(CoordinatorConfig(interval=10.0, timeout=60.0))
    harness.start()
    harness.advance(100.0)

    assert harness.coordinator.next_periodic_savepoint is None


def test_withdrawn_requests_still_queued_are_declined_and_pending_ones_aborted_by_label() -> None:
    """A withdrawal reaches the label's queued requests too (declined, `Withdrawn`), its
    aborts carry the label and the reason's own words, as the adapter reports them, and a
    request queued behind them takes the freed slot at once (it waited for the next event;
    a mutation run found the first two untested)."""
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=1))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="upgrade"))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="upgrade"))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="nonce 2"))
    assert [r.label for r in harness.coordinator.queued] == ["upgrade", "nonce 2"]

    effects = harness.send(TriggerWithdrawn("upgrade"))

    (declined,) = of_type(effects, RequestDeclined)
    assert (declined.request.label, declined.reason) == ("upgrade", FailureReason.WITHDRAWN)
    (abort,) = of_type(effects, AbortCheckpoint)
    assert (abort.checkpoint_id, abort.reason, abort.message, abort.label) == (
        1,
        FailureReason.WITHDRAWN,
        FailureReason.WITHDRAWN.description,
        "upgrade",
    )
    assert [r.label for r in harness.coordinator.queued] == []
    assert [p.label for p in harness.coordinator.pending] == ["nonce 2"]


def test_a_job_failed_past_its_tolerance_declines_its_queued_periodic_checkpoints() -> None:
    """Failing the job holds the scheduler and declines what it queued (Flink's failover
    stops it); a mutation run found the declines untested."""
    harness = Harness(
        CoordinatorConfig(interval=1.0, min_pause=0.0, max_concurrent=1, tolerable_failures=0)
    )
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="nonce 1"))
    harness.advance_to_next_deadline()  # periodic checkpoints queue behind it
    assert [r.is_periodic for r in harness.coordinator.queued] == [True]

    effects = harness.send(TaskDeclined(1, "logs", "disk full"))

    assert of_type(effects, FailJob) != []
    (declined,) = of_type(effects, RequestDeclined)
    assert declined.request.is_periodic
    assert declined.reason is FailureReason.PERIODIC_SCHEDULER_SHUTDOWN


def test_periodic_savepoints_start_persisted_and_go_past_max_concurrent() -> None:
    """The first one is an interval after the job first ran, that time persisted (a restart
    waits from it); one due while checkpoints fill `maxConcurrent` is taken anyway, as a
    savepoint asked for is (a mutation run found both untested)."""
    harness = Harness(
        CoordinatorConfig(interval=None, timeout=600.0, max_concurrent=1, savepoint_interval=30.0)
    )
    harness.send(TasksReported(TASKS, all_running=True))
    started = harness.clock.now

    effects = harness.send(JobPhaseChanged(JobPhase.RUNNING))

    (persist,) = of_type(effects, PersistState)
    assert persist.state.last_periodic_savepoint == started
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="nonce 1"))
    assert len(periodic_savepoints(harness.advance(30.0), harness)) == 1
