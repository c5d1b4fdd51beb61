"""The trigger request decider: declines, queueing, ordering and the queue cap."""

import pytest

from helpers.coordinator import TASKS, Harness, of_type
from spark_checkpoint_operator.coordinator import (
    CHECKPOINT_ID_BLOCK,
    AfterCompletion,
    CheckpointKind,
    CoordinatorConfig,
    FailureReason,
    JobTerminated,
    PersistState,
    RequestDeclined,
    RequestOrigin,
    StoredIdsReported,
    TasksReported,
    TerminalOutcome,
    TriggerCheckpoint,
    TriggerRequest,
    TriggerRequested,
)
from spark_checkpoint_operator.coordinator.requests import RequestQueue
from spark_checkpoint_operator.coordinator.state import MAX_COUNT


def _request(
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    origin: RequestOrigin = RequestOrigin.USER,
    forced: bool = False,
    at: float = 0.0,
    label: str = "",
) -> TriggerRequest:
    return TriggerRequest(kind=kind, origin=origin, requested_at=at, forced=forced, label=label)


def test_declined_when_coordinator_is_shut_down(harness: Harness) -> None:
    harness.start()
    harness.send(JobTerminated(TerminalOutcome.CANCELLED))
    effects = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    assert [d.reason for d in of_type(effects, RequestDeclined)] == [
        FailureReason.COORDINATOR_SHUTDOWN
    ]
    assert of_type(effects, TriggerCheckpoint) == []


def test_declined_when_not_all_required_tasks_run_without_spending_an_id(
    harness: Harness,
) -> None:
    harness.start()
    harness.send(TasksReported(frozenset({"logs", "state-0-0"}), all_running=False))
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert [d.reason for d in of_type(effects, RequestDeclined)] == [
        FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING
    ]
    harness.send(TasksReported(frozenset({"logs", "state-0-0"}), all_running=True))
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert [t.checkpoint_id for t in of_type(effects, TriggerCheckpoint)] == [1]


def test_declined_when_the_agent_reported_no_tasks_yet() -> None:
    harness = Harness()
    harness.start(tasks=frozenset())
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert [d.reason for d in of_type(effects, RequestDeclined)] == [
        FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING
    ]


def test_request_waits_in_queue_while_too_many_are_pending() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=1))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="first"))
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="second"))
    assert of_type(effects, TriggerCheckpoint) == []
    assert [r.label for r in harness.coordinator.queued] == ["second"]

    effects = harness.complete(1)
    assert [t.checkpoint_id for t in of_type(effects, TriggerCheckpoint)] == [2]
    assert harness.coordinator.queued == ()


def test_what_users_asked_for_and_is_unfinished_is_what_a_replacement_is_asked() -> None:
    """In flight and queued user requests, oldest first, with what follows them and whether a
    snapshot object pins them; periodic checkpoints, in flight or queued, are not: new
    settings replace the coordinator, and a savepoint asked for was lost with the one
    replaced (a reviewer's)."""
    harness = Harness(CoordinatorConfig(interval=1.0, max_concurrent=2, min_pause=0.0))
    harness.start()
    harness.advance_to_next_deadline()  # a periodic checkpoint in flight
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="in flight"))
    pinned = TriggerRequested(CheckpointKind.SAVEPOINT, label="snapshot s", pinned=True)
    harness.send(pinned)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="queued"))
    harness.advance_to_next_deadline()  # a periodic checkpoint queued
    queued = [(r.label, r.is_periodic) for r in harness.coordinator.queued]
    assert queued == [("queued", False), ("", True)]
    checkpoint, savepoint = CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT
    in_flight = TriggerRequested(checkpoint, AfterCompletion.CONTINUE, False, "in flight")
    pinned_again = TriggerRequested(savepoint, AfterCompletion.CONTINUE, True, "snapshot s", True)
    queued_again = TriggerRequested(checkpoint, AfterCompletion.CONTINUE, False, "queued")
    assert harness.coordinator.unfinished_user_requests() == (
        in_flight,
        pinned_again,
        queued_again,
    )
    stop = TriggerRequested(savepoint, after=AfterCompletion.STOP, label="suspend")
    harness.send(stop)

    again = harness.coordinator.unfinished_user_requests()

    pending = [p.label for p in harness.coordinator.pending]
    assert pending == ["", "in flight", "snapshot s", "suspend"]
    assert [r.label for r in harness.coordinator.queued] == ["queued"]
    assert again == (
        in_flight,
        pinned_again,
        TriggerRequested(savepoint, AfterCompletion.STOP, True, "suspend"),
        queued_again,
    )
    assert harness.coordinator.tasks_reported == TasksReported(TASKS, all_running=True)


def test_before_the_agents_first_word_a_replacement_is_told_of_no_tasks_running() -> None:
    """`tasks_reported` is what a replacing coordinator is told: before any TasksReported,
    no tasks and not all running, so that it declines requests as this one does."""
    assert Harness().coordinator.tasks_reported == TasksReported(frozenset(), all_running=False)


def test_max_concurrent_allows_that_many_pending() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=2))
    harness.start()
    for _ in range(3):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert [p.checkpoint_id for p in harness.coordinator.pending] == [1, 2]
    assert len(harness.coordinator.queued) == 1


def test_forced_requests_bypass_max_concurrent_and_min_pause() -> None:
    harness = Harness(CoordinatorConfig(interval=100.0, min_pause=50.0, max_concurrent=1))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    effects = harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))  # forced by default
    assert [t.kind for t in of_type(effects, TriggerCheckpoint)] == [CheckpointKind.SAVEPOINT]
    harness.complete(1)
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, forced=True))
    assert len(of_type(effects, TriggerCheckpoint)) == 1


def test_min_pause_declines_periodic_request_and_reschedules_at_earliest_time() -> None:
    harness = Harness(CoordinatorConfig(interval=10.0, min_pause=8.0, max_concurrent=1))
    harness.start()
    first = harness.next_trigger()
    harness.clock.now = first.trigger_time + 9.5  # completes just before the next period
    harness.complete(first.checkpoint_id)
    completed_at = harness.clock.now

    effects = harness.advance_to_next_deadline()  # the periodic trigger at +10 s
    assert [d.reason for d in of_type(effects, RequestDeclined)] == [
        FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    ]
    assert harness.coordinator.next_periodic_trigger == pytest.approx(completed_at + 8.0)

    second = harness.next_trigger()
    assert second.trigger_time == pytest.approx(completed_at + 8.0)


def test_min_pause_does_not_hold_back_user_requests() -> None:
    harness = Harness(CoordinatorConfig(interval=10.0, min_pause=8.0))
    harness.start()
    first = harness.next_trigger()
    harness.complete(first.checkpoint_id)
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    assert len(of_type(effects, TriggerCheckpoint)) == 1


def test_the_id_counter_is_persisted_before_the_trigger_goes_out(harness: Harness) -> None:
    harness.start()
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    persist = of_type(effects, PersistState)
    trigger = of_type(effects, TriggerCheckpoint)
    assert effects.index(persist[0]) < effects.index(trigger[0])
    assert persist[0].state.next_checkpoint_id > trigger[0].checkpoint_id


def test_one_state_write_reserves_a_block_of_ids() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=10), id_block=3)
    harness.start()
    persisted = []
    for _ in range(7):
        effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
        [trigger] = of_type(effects, TriggerCheckpoint)
        persisted += [
            (trigger.checkpoint_id, p.state.next_checkpoint_id)
            for p in of_type(effects, PersistState)
        ]

    # Ids 1, 4 and 7 each open a block; the others are covered by a block already durable.
    assert persisted == [(1, 4), (4, 7), (7, 10)]
    assert harness.coordinator.persisted_state.next_checkpoint_id == 10


def test_a_block_must_hold_an_id() -> None:
    with pytest.raises(ValueError, match="id_block must be at least 1, got 0"):
        Harness(id_block=0)


def test_queue_orders_savepoints_forced_user_then_time() -> None:
    queue = RequestQueue(capacity=10)
    requests = [
        _request(origin=RequestOrigin.PERIODIC, at=1, label="periodic-early"),
        _request(origin=RequestOrigin.PERIODIC, at=0, label="periodic-earliest"),
        _request(at=5, label="user"),
        _request(forced=True, at=9, label="forced"),
        _request(kind=CheckpointKind.SAVEPOINT, at=9, label="savepoint"),
        _request(kind=CheckpointKind.SAVEPOINT, forced=True, at=10, label="forced-savepoint"),
    ]
    for request in requests:
        assert queue.offer(request) is None
    assert [r.label for r in queue] == [
        "forced-savepoint",
        "savepoint",
        "forced",
        "user",
        "periodic-earliest",
        "periodic-early",
    ]


def test_coordinator_triggers_queued_requests_in_priority_order() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=1))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="blocker"))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="user-checkpoint"))
    harness.clock.now += 1
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, forced=False, label="savepoint"))
    triggered = []
    for checkpoint_id in (1, 2):
        effects = harness.complete(checkpoint_id)
        triggered += [t.kind for t in of_type(effects, TriggerCheckpoint)]
    assert triggered == [CheckpointKind.SAVEPOINT, CheckpointKind.CHECKPOINT]


def test_full_queue_drops_the_lowest_priority_periodic_request() -> None:
    queue = RequestQueue(capacity=2)
    queue.offer(_request(origin=RequestOrigin.PERIODIC, at=1, label="old-periodic"))
    queue.offer(_request(origin=RequestOrigin.PERIODIC, at=2, label="new-periodic"))
    dropped = queue.offer(_request(at=3, label="user"))
    assert dropped is not None and dropped.label == "new-periodic"
    assert [r.label for r in queue] == ["user", "old-periodic"]


def test_full_queue_of_user_requests_rejects_the_new_request() -> None:
    queue = RequestQueue(capacity=2)
    queue.offer(_request(at=1, label="a"))
    queue.offer(_request(at=2, label="b"))
    rejected = queue.offer(_request(kind=CheckpointKind.SAVEPOINT, at=3, label="c"))
    assert rejected is not None and rejected.label == "c"
    assert [r.label for r in queue] == ["a", "b"]


def test_coordinator_reports_requests_dropped_by_the_cap() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=1, max_queued_requests=1))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="pending"))
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="queued"))
    effects = harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, label="overflow"))
    declined = of_type(effects, RequestDeclined)
    assert [(d.request.label, d.reason) for d in declined] == [
        ("overflow", FailureReason.TOO_MANY_CHECKPOINT_REQUESTS)
    ]


@pytest.mark.parametrize(("above_the_last_block", "continued"), [(1, True), (0, False)])
def test_stored_ids_are_continued_above_only_while_a_block_above_them_is_persistable(
    above_the_last_block: int, continued: bool
) -> None:
    """The next trigger reserves a block of ids past the highest stored one; a highest id
    whose block would pass MAX_COUNT (a directory named by hand) changes nothing: a
    persisted counter could not hold it (a mutation run found the bound untested)."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    highest = MAX_COUNT - CHECKPOINT_ID_BLOCK - above_the_last_block

    effects = harness.send(StoredIdsReported(highest))

    assert (harness.coordinator.next_checkpoint_id == highest + 1) is continued
    assert bool(of_type(effects, PersistState)) is continued
    if continued:
        (trigger,) = of_type(
            harness.send(TriggerRequested(CheckpointKind.SAVEPOINT)), TriggerCheckpoint
        )
        assert trigger.checkpoint_id == highest + 1
        assert harness.coordinator.persisted_state.next_checkpoint_id <= MAX_COUNT


def test_a_stored_id_equal_to_the_next_one_is_not_used_again() -> None:
    """A directory chk-1 left by a run whose state was lost: the next trigger is 2."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    assert harness.coordinator.next_checkpoint_id == 1

    harness.send(StoredIdsReported(1))

    (trigger,) = of_type(
        harness.send(TriggerRequested(CheckpointKind.SAVEPOINT)), TriggerCheckpoint
    )
    assert trigger.checkpoint_id == 2


@pytest.mark.parametrize("beyond", [0, 1])
def test_stored_ids_inside_the_reserved_block_take_no_state_write(beyond: int) -> None:
    """The first trigger reserved ids up to the block's end (persisted): a highest stored
    id at the block's last one continues the counter without a write; one past it is
    persisted (a mutation run's)."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))  # reserves 1..CHECKPOINT_ID_BLOCK
    highest = CHECKPOINT_ID_BLOCK + beyond

    effects = harness.send(StoredIdsReported(highest))

    assert harness.coordinator.next_checkpoint_id == highest + 1
    assert len(of_type(effects, PersistState)) == beyond
