"""Acknowledgement answers, completion and subsumption."""

import pytest

from helpers.coordinator import TASKS, Harness, of_type
from spark_checkpoint_operator.coordinator import (
    AbortCheckpoint,
    AfterCompletion,
    CheckpointFinalized,
    CheckpointKind,
    CoordinatorConfig,
    DiscardCheckpoint,
    Effect,
    FailureReason,
    FinalizeCheckpoint,
    NotifyCheckpointComplete,
    PersistState,
    SavepointHistoryLimits,
    TaskAck,
    TaskAcknowledged,
    TriggerRequested,
)


def _ack(harness: Harness, checkpoint_id: int, task: str, batch_id: int = 3) -> list[Effect]:
    return harness.send(TaskAcknowledged(checkpoint_id, TaskAck(task, batch_id, 10, 1)))


def _acknowledged(harness: Harness) -> list[int]:
    return [p.acknowledged for p in harness.coordinator.pending]


def test_duplicate_and_unexpected_acks_count_once_and_never_complete(harness: Harness) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    first, *others = sorted(TASKS)
    assert _ack(harness, 1, first) == []
    assert _acknowledged(harness) == [1]
    assert _ack(harness, 1, first, batch_id=4) == [], "the first ack of a task stands"
    assert _ack(harness, 1, "state-9-9", batch_id=4) == [], "a task the checkpoint never expected"
    assert _acknowledged(harness) == [1]
    for task in others[:-1]:
        harness.send(TaskAcknowledged(1, TaskAck(task, 3, 10, 1)))
    (finalize,) = of_type(_ack(harness, 1, others[-1]), FinalizeCheckpoint)
    assert finalize.batch_id == 3


def test_ack_for_an_id_never_triggered_changes_nothing(harness: Harness) -> None:
    harness.start()
    assert _ack(harness, 42, "logs") == []
    assert harness.coordinator.pending == ()


def test_late_ack_for_an_aborted_checkpoint_changes_nothing(harness: Harness) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.advance(61.0)  # expires
    assert _ack(harness, 1, "logs") == []
    assert harness.coordinator.persisted_state.history[-1].reason is FailureReason.EXPIRED


def test_checkpoint_finalizes_only_when_every_expected_task_acknowledged(
    harness: Harness,
) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    tasks = sorted(TASKS)
    for task in tasks[:-1]:
        effects = harness.send(TaskAcknowledged(1, TaskAck(task, 3, 10, 1)))
        assert of_type(effects, FinalizeCheckpoint) == []
    effects = harness.send(TaskAcknowledged(1, TaskAck(tasks[-1], 3, 10, 1)))
    (finalize,) = of_type(effects, FinalizeCheckpoint)
    assert (finalize.checkpoint_id, finalize.batch_id, finalize.tasks) == (1, 3, TASKS)


def test_finalized_checkpoint_is_registered_then_notified_in_that_order(
    harness: Harness,
) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.ack_all(1, batch_id=7)
    harness.clock.now += 2.5
    effects = harness.send(CheckpointFinalized(1, "file:///s/chk-1", 300))
    persist, notify = of_type(effects, PersistState), of_type(effects, NotifyCheckpointComplete)
    assert effects.index(persist[0]) < effects.index(notify[0])
    (registered,) = persist[0].state.checkpoints
    assert (registered.checkpoint_id, registered.batch_id, registered.path) == (
        1,
        7,
        "file:///s/chk-1",
    )
    assert registered.duration == 2.5
    assert notify[0].checkpoint == registered
    assert harness.coordinator.pending == ()


def test_finalization_without_all_acks_is_ignored(harness: Harness) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    effects = harness.send(CheckpointFinalized(1, "file:///s/chk-1", 300))
    assert effects == []
    assert [p.checkpoint_id for p in harness.coordinator.pending] == [1]


def test_acks_for_different_batches_fail_the_checkpoint(harness: Harness) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    _ack(harness, 1, "logs", batch_id=3)
    effects = harness.send(TaskAcknowledged(1, TaskAck("state-0-0", 4, 10, 1)))
    (abort,) = of_type(effects, AbortCheckpoint)
    assert abort.reason is FailureReason.INCONSISTENT_ACKNOWLEDGEMENTS
    assert "3, 4" in abort.message


def test_completing_n_aborts_older_pending_checkpoints_but_not_savepoints() -> None:
    harness = Harness(CoordinatorConfig(interval=None, max_concurrent=3))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))  # 1
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))  # 2
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))  # 3
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))  # 4
    effects = harness.complete(3)
    aborts = of_type(effects, AbortCheckpoint)
    assert [(a.checkpoint_id, a.reason) for a in aborts] == [(1, FailureReason.SUBSUMED)]
    assert [p.checkpoint_id for p in harness.coordinator.pending] == [2, 4]


def test_completed_store_keeps_the_last_retained_and_discards_subsumed() -> None:
    harness = Harness(CoordinatorConfig(interval=None, retained=2))
    harness.start()
    discarded = []
    for checkpoint_id in (1, 2, 3, 4):
        harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
        effects = harness.complete(checkpoint_id)
        discard = of_type(effects, DiscardCheckpoint)
        notify = of_type(effects, NotifyCheckpointComplete)
        if discard:
            assert effects.index(notify[0]) < effects.index(discard[0])
        discarded += [(d.checkpoint_id, d.retained) for d in discard]
    assert discarded == [(1, (2, 3)), (2, (3, 4))]
    state = harness.coordinator.persisted_state
    assert [c.checkpoint_id for c in state.checkpoints] == [3, 4]


def test_finalization_arriving_after_abort_registers_nothing(harness: Harness) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.ack_all(1)
    (abort,) = of_type(harness.advance(61.0), AbortCheckpoint)  # its `_metadata` outlasted it
    assert abort.reason is FailureReason.FINALIZE_FAILURE
    assert harness.send(CheckpointFinalized(1, "file:///s/chk-1", 300)) == []
    assert harness.coordinator.persisted_state.checkpoints == ()


def _completion(harness: Harness, request: TriggerRequested, batch_id: int) -> bool:
    harness.send(request)
    checkpoint_id = harness.coordinator.pending[-1].checkpoint_id
    (notify,) = of_type(harness.complete(checkpoint_id, batch_id), NotifyCheckpointComplete)
    assert notify.checkpoint.checkpoint_id == checkpoint_id
    return notify.sinks_may_commit


@pytest.mark.parametrize(
    ("request_", "commits"),
    [
        (TriggerRequested(CheckpointKind.CHECKPOINT), True),
        (TriggerRequested(CheckpointKind.SAVEPOINT), False),
        (TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.STOP), True),
        (TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.DRAIN), True),
    ],
)
def test_sinks_commit_for_checkpoints_and_stopping_savepoints_only(
    request_: TriggerRequested, commits: bool
) -> None:
    """Flink 1.15+ notifies no savepoint but a stop-with-savepoint (its last commit)."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    assert _completion(harness, request_, batch_id=3) is commits


def test_committed_output_stays_behind_a_checkpoint_when_savepoints_go() -> None:
    limits = SavepointHistoryLimits(max_count=1)
    harness = Harness(CoordinatorConfig(interval=None, savepoint_history=limits))
    harness.start()
    committed = 0
    for kind, batch in [
        (CheckpointKind.CHECKPOINT, 3),
        (CheckpointKind.SAVEPOINT, 5),
        (CheckpointKind.SAVEPOINT, 8),  # trims the savepoint at batch 5
    ]:
        if _completion(harness, TriggerRequested(kind), batch):
            committed = batch
    checkpoints = harness.coordinator.persisted_state.checkpoints
    assert committed == 3
    assert committed <= max(c.batch_id for c in checkpoints), "no savepoint is needed"
