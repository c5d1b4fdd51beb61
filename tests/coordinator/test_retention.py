"""Savepoint history limits and the retention policy at termination."""

import pytest

from helpers.coordinator import FakeClock, Harness, of_type
from spark_checkpoint_operator.coordinator import (
    AbortCheckpoint,
    CheckpointKind,
    CompletedCheckpoint,
    CoordinatorConfig,
    DiscardCheckpoint,
    DiscardSavepoint,
    Effect,
    FailureReason,
    JobTerminated,
    PersistedState,
    PersistState,
    RetentionPolicy,
    SavepointDisposeRequested,
    SavepointHistoryLimits,
    SavepointPinChanged,
    TerminalOutcome,
    TriggerRequested,
)


def _take(harness: Harness, kind: CheckpointKind) -> list[Effect]:
    harness.send(TriggerRequested(kind))
    checkpoint_id = harness.coordinator.pending[-1].checkpoint_id
    return harness.complete(checkpoint_id)


def test_savepoints_are_never_discarded_by_checkpoint_retention() -> None:
    harness = Harness(CoordinatorConfig(interval=None, retained=1))
    harness.start()
    _take(harness, CheckpointKind.SAVEPOINT)
    discarded: list[int] = []
    for _ in range(4):
        effects = _take(harness, CheckpointKind.CHECKPOINT)
        discarded += [d.checkpoint_id for d in of_type(effects, DiscardCheckpoint)]
    state = harness.coordinator.persisted_state
    assert [s.checkpoint_id for s in state.savepoints] == [1]
    assert 1 not in discarded
    assert discarded == [2, 3, 4]


@pytest.mark.parametrize("retained", [1, 2, 3, 5, 10])
def test_registry_is_the_newest_retained_and_every_other_checkpoint_is_discarded_once(
    retained: int,
) -> None:
    """The user guide's example uses ``retained: 3``; a negative excess once sliced the
    registry down and lost checkpoints without discarding them."""
    harness = Harness(CoordinatorConfig(interval=None, retained=retained))
    harness.start()
    completed = 12
    discarded: list[int] = []
    for checkpoint_id in range(1, completed + 1):
        effects = _take(harness, CheckpointKind.CHECKPOINT)
        discarded += [d.checkpoint_id for d in of_type(effects, DiscardCheckpoint)]
        registry = [c.checkpoint_id for c in harness.coordinator.persisted_state.checkpoints]
        newest = list(range(max(1, checkpoint_id - retained + 1), checkpoint_id + 1))
        assert registry == newest
    assert discarded == list(range(1, completed - retained + 1))


def test_savepoint_history_is_trimmed_by_count_keeping_the_newest() -> None:
    limits = SavepointHistoryLimits(max_count=2)
    harness = Harness(CoordinatorConfig(interval=None, savepoint_history=limits))
    harness.start()
    dropped: list[int] = []
    for _ in range(4):
        effects = _take(harness, CheckpointKind.SAVEPOINT)
        dropped += [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)]
    assert dropped == [1, 2]
    assert [s.checkpoint_id for s in harness.coordinator.persisted_state.savepoints] == [3, 4]


def test_a_pinned_savepoint_outlives_the_history_until_released() -> None:
    """A SparkCheckpointSnapshot's savepoint: the history's count and age let the others
    go; pinned, it stays (across a restart: persisted), and once released the limits judge
    it at once."""
    limits = SavepointHistoryLimits(max_count=1, max_age_seconds=100.0)
    harness = Harness(CoordinatorConfig(interval=None, savepoint_history=limits))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, label="snapshot a (1)", pinned=True))
    harness.complete(harness.coordinator.pending[-1].checkpoint_id)
    dropped: list[int] = []
    for _ in range(3):
        harness.clock.now += 200
        effects = _take(harness, CheckpointKind.SAVEPOINT)
        dropped += [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)]
    state = harness.coordinator.persisted_state
    assert dropped == [2, 3]
    assert [(s.checkpoint_id, s.pinned) for s in state.savepoints] == [(1, True), (4, False)]
    assert PersistedState.from_dict(state.to_dict()) == state
    assert harness.coordinator.next_deadline() is None  # 4 is the newest, 1 pinned: none ages

    effects = harness.send(SavepointPinChanged(1, pinned=False))

    assert [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)] == [1]
    assert effects.index(of_type(effects, PersistState)[0]) < effects.index(
        of_type(effects, DiscardSavepoint)[0]
    )
    assert [s.checkpoint_id for s in harness.coordinator.persisted_state.savepoints] == [4]


def test_an_existing_savepoint_pinned_outlives_the_history() -> None:
    """A SparkCheckpointSnapshot of an existing savepoint (alreadyExists) pins it after it
    completed; pinning it again, or an id not registered, changes nothing."""
    limits = SavepointHistoryLimits(max_count=1)
    harness = Harness(CoordinatorConfig(interval=None, savepoint_history=limits))
    harness.start()
    _take(harness, CheckpointKind.SAVEPOINT)
    assert of_type(harness.send(SavepointPinChanged(1, pinned=True)), PersistState)
    assert harness.send(SavepointPinChanged(1, pinned=True)) == []
    assert harness.send(SavepointPinChanged(7, pinned=False)) == []
    _take(harness, CheckpointKind.SAVEPOINT)
    _take(harness, CheckpointKind.SAVEPOINT)
    savepoints = harness.coordinator.persisted_state.savepoints
    assert [(s.checkpoint_id, s.pinned) for s in savepoints] == [(1, True), (3, False)]


def test_only_a_savepoint_is_pinned() -> None:
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT, pinned=True))
    harness.complete(harness.coordinator.pending[-1].checkpoint_id)
    assert [c.pinned for c in harness.coordinator.persisted_state.checkpoints] == [False]


def test_savepoint_history_is_trimmed_by_age_but_never_the_newest() -> None:
    limits = SavepointHistoryLimits(max_count=10, max_age_seconds=100.0)
    harness = Harness(CoordinatorConfig(interval=None, savepoint_history=limits))
    harness.start()
    _take(harness, CheckpointKind.SAVEPOINT)
    harness.clock.now += 50
    _take(harness, CheckpointKind.SAVEPOINT)
    assert harness.coordinator.next_deadline() == harness.clock.now + 50
    effects = harness.advance_to_next_deadline()
    persist = of_type(effects, PersistState)
    assert [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)] == [1]
    assert effects.index(persist[0]) < effects.index(of_type(effects, DiscardSavepoint)[0])
    harness.clock.now += 1000
    assert of_type(harness.send(JobTerminated(TerminalOutcome.FINISHED)), DiscardSavepoint) == []
    assert [s.checkpoint_id for s in harness.coordinator.persisted_state.savepoints] == [2]


def test_a_savepoint_ages_out_at_the_deadline_given_for_it() -> None:
    """Its age expiry converted to the timer, now + (expiry - now), rounds a step short
    with one clock: a Tick at that deadline expired nothing, and the next deadline was the
    same, for ever (a reviewer's; numbers where that sum rounds short, as a mutation run
    found the earlier ones no longer did)."""
    expiry, now = 854140.4297478645, 295020.54406568065
    assert now + (expiry - now) < expiry
    limits = SavepointHistoryLimits(max_count=10, max_age_seconds=expiry - 100_000.0)
    harness = Harness(
        CoordinatorConfig(interval=None, savepoint_history=limits), clock=FakeClock(100_000.0)
    )
    harness.start()
    _take(harness, CheckpointKind.SAVEPOINT)  # completes at 100,000: ages out at `expiry`
    harness.clock.now = now
    _take(harness, CheckpointKind.SAVEPOINT)  # the newest, always kept

    assert harness.coordinator.next_deadline() == expiry
    effects = harness.advance_to_next_deadline()

    assert [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)] == [1]


@pytest.mark.parametrize("disposed", [1, 2, 3])
def test_a_disposed_savepoint_leaves_the_registry_persisted_before_its_discard(
    disposed: int,
) -> None:
    """Flink's `savepoint --dispose`: any registered savepoint, the newest too (which the
    history always keeps), leaves the registry; the registry is persisted before the
    files go, and the discard carries the request's label. Disposed again (a second
    request meanwhile), nothing happens."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    for _ in range(3):
        _take(harness, CheckpointKind.SAVEPOINT)

    effects = harness.send(SavepointDisposeRequested(disposed, label="dispose request 1"))

    [persist] = of_type(effects, PersistState)
    [discard] = of_type(effects, DiscardSavepoint)
    assert (discard.savepoint.checkpoint_id, discard.label) == (disposed, "dispose request 1")
    assert effects.index(persist) < effects.index(discard)
    kept = [s.checkpoint_id for s in persist.state.savepoints]
    assert kept == [s for s in (1, 2, 3) if s != disposed]
    assert [s.checkpoint_id for s in harness.coordinator.persisted_state.savepoints] == kept
    assert harness.send(SavepointDisposeRequested(disposed)) == []


@pytest.mark.parametrize("kind", [CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT])
def test_over_the_count_the_image_a_restore_passed_over_goes_first(kind: CheckpointKind) -> None:
    """The coordinator's `unrestorable`, asked by kind and id, decides what retention and
    the savepoint history drop first: image 2, not the oldest."""
    config = CoordinatorConfig(
        interval=None, retained=2, savepoint_history=SavepointHistoryLimits(max_count=2)
    )
    harness = Harness(config, unrestorable=lambda k, image_id: (k, image_id) == (kind, 2))
    harness.start()
    for _ in range(3):
        _take(harness, kind)

    state = harness.coordinator.persisted_state
    images = state.checkpoints if kind is CheckpointKind.CHECKPOINT else state.savepoints
    assert [image.checkpoint_id for image in images] == [1, 3]


def test_the_newest_image_is_disposed_of_when_no_restore_takes_it() -> None:
    """Savepoint 2 (batch 5) is newer than checkpoint 1 (batch 3), but a restore failed on
    it: the coordinator's `unrestorable` lets it go."""

    def failed_on(kind: CheckpointKind, image_id: int) -> bool:
        return (kind, image_id) == (CheckpointKind.SAVEPOINT, 2)

    harness = Harness(CoordinatorConfig(interval=None), unrestorable=failed_on)
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.complete(1, batch_id=3)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    harness.complete(2, batch_id=5)

    effects = harness.send(SavepointDisposeRequested(2))

    assert [d.savepoint.checkpoint_id for d in of_type(effects, DiscardSavepoint)] == [2]
    assert harness.coordinator.persisted_state.savepoints == ()


def test_the_newest_image_is_not_disposed_of_when_it_is_a_savepoint() -> None:
    """Sinks may have committed up to its batch (a stop-with-savepoint's): disposed of, the
    next run would restore an older image, behind the output."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.complete(1, batch_id=3)
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT))
    harness.complete(2, batch_id=5)
    state = harness.coordinator.persisted_state

    assert state.why_not_disposable(2) == (
        "savepoint 2 is the job's newest image (batch 5): the output may be committed up to "
        "its batch, and every other image is older; run the job until a newer checkpoint "
        "completes"
    )
    assert state.why_not_disposable(1) == "savepoint 1 is not in the job's registry"
    assert harness.send(SavepointDisposeRequested(2)) == []
    assert [s.checkpoint_id for s in harness.coordinator.persisted_state.savepoints] == [2]

    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    harness.complete(3, batch_id=5)  # an image as new: the savepoint may go
    assert harness.coordinator.persisted_state.why_not_disposable(2) is None


def test_images_no_restore_takes_do_not_count_for_a_disposal() -> None:
    """After `run --from savepoint:1`, the newer checkpoint 5 it left behind (batch 9) is
    unrestorable: savepoint 6 (batch 6) is the newest image a restore takes, and savepoint
    1, once 6 is gone, the only one (a reviewer's)."""

    def image(kind: CheckpointKind, image_id: int, batch: int) -> CompletedCheckpoint:
        return CompletedCheckpoint(image_id, kind, batch, f"file:///s/{image_id}", 0, 0.0, 0.0)

    checkpoint_5 = image(CheckpointKind.CHECKPOINT, 5, 9)
    savepoints = (image(CheckpointKind.SAVEPOINT, 1, 3), image(CheckpointKind.SAVEPOINT, 6, 6))
    state = PersistedState(next_checkpoint_id=7, checkpoints=(checkpoint_5,), savepoints=savepoints)

    def left_behind(kind: CheckpointKind, image_id: int) -> bool:
        return (kind, image_id) == (CheckpointKind.CHECKPOINT, 5)

    assert state.why_not_disposable(6) is None  # counting checkpoint 5, as before
    assert (state.why_not_disposable(6, left_behind) or "").startswith(
        "savepoint 6 is the job's newest image (batch 6)"
    )
    assert state.why_not_disposable(1, left_behind) is None
    only = PersistedState(
        next_checkpoint_id=7, checkpoints=(checkpoint_5,), savepoints=savepoints[:1]
    )
    assert only.why_not_disposable(1, left_behind) == (
        "savepoint 1 is the only image the job can restore from: run the job until a "
        "checkpoint completes"
    )
    # One no restore takes goes whatever the others.
    assert only.why_not_disposable(1, lambda kind, image_id: True) is None


@pytest.mark.parametrize(
    ("policy", "outcome", "discards"),
    [
        (RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION, TerminalOutcome.FINISHED, True),
        (RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION, TerminalOutcome.FAILED, True),
        (RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION, TerminalOutcome.CANCELLED, True),
        (RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION, TerminalOutcome.SUSPENDED, False),
        (RetentionPolicy.RETAIN_ON_FAILURE, TerminalOutcome.FINISHED, True),
        (RetentionPolicy.RETAIN_ON_FAILURE, TerminalOutcome.FAILED, False),
        (RetentionPolicy.RETAIN_ON_FAILURE, TerminalOutcome.CANCELLED, True),
        (RetentionPolicy.RETAIN_ON_FAILURE, TerminalOutcome.SUSPENDED, False),
        (RetentionPolicy.RETAIN_ON_CANCELLATION, TerminalOutcome.FINISHED, True),
        (RetentionPolicy.RETAIN_ON_CANCELLATION, TerminalOutcome.FAILED, False),
        (RetentionPolicy.RETAIN_ON_CANCELLATION, TerminalOutcome.CANCELLED, False),
        (RetentionPolicy.RETAIN_ON_CANCELLATION, TerminalOutcome.SUSPENDED, False),
    ],
)
def test_retention_policy_at_termination(
    policy: RetentionPolicy, outcome: TerminalOutcome, discards: bool
) -> None:
    harness = Harness(CoordinatorConfig(interval=None, retained=2, retention_policy=policy))
    harness.start()
    _take(harness, CheckpointKind.CHECKPOINT)
    _take(harness, CheckpointKind.SAVEPOINT)
    _take(harness, CheckpointKind.CHECKPOINT)

    effects = harness.send(JobTerminated(outcome))

    discarded = [d.checkpoint_id for d in of_type(effects, DiscardCheckpoint)]
    assert discarded == ([1, 3] if discards else [])
    persist = of_type(effects, PersistState)[-1]
    assert persist.state.terminated is outcome
    assert [s.checkpoint_id for s in persist.state.savepoints] == [2]
    assert len(persist.state.checkpoints) == (0 if discards else 2)
    if discarded:
        first_discard = of_type(effects, DiscardCheckpoint)[0]
        assert effects.index(persist) < effects.index(first_discard)


def test_termination_aborts_pending_with_shutdown_and_is_idempotent(harness: Harness) -> None:
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    effects = harness.send(JobTerminated(TerminalOutcome.CANCELLED))
    assert [a.reason for a in of_type(effects, AbortCheckpoint)] == [
        FailureReason.COORDINATOR_SHUTDOWN
    ]
    assert harness.send(JobTerminated(TerminalOutcome.FAILED)) == []
    assert harness.coordinator.persisted_state.terminated is TerminalOutcome.CANCELLED


def test_a_pin_changes_only_its_own_savepoint() -> None:
    """A mutation run found nothing checking that pinning one savepoint leaves the others
    as they were (each SparkCheckpointSnapshot object pins its own)."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    _take(harness, CheckpointKind.SAVEPOINT)
    _take(harness, CheckpointKind.SAVEPOINT)

    harness.send(SavepointPinChanged(1, pinned=True))

    state = harness.coordinator.persisted_state
    assert [(s.checkpoint_id, s.pinned) for s in state.savepoints] == [(1, True), (2, False)]


def test_the_history_says_who_asked_for_each_completed_image() -> None:
    """status.history's label, of completions as of failures (a mutation run found the
    completed ones' untested)."""
    harness = Harness(CoordinatorConfig(interval=None))
    harness.start()
    harness.send(TriggerRequested(CheckpointKind.SAVEPOINT, label="nonce 3"))
    harness.complete(harness.coordinator.pending[-1].checkpoint_id)

    (outcome,) = harness.coordinator.persisted_state.history
    assert (outcome.checkpoint_id, outcome.label) == (1, "nonce 3")
