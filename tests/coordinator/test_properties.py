"""Invariants of the coordinator over random event sequences (hypothesis state machine).

A model agent acknowledges, declines and finalizes at random; the operator may restart
(the coordinator is rebuilt from its persisted state) at any point.
"""

import random

from hypothesis import HealthCheck, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from helpers.coordinator import FakeClock
from spark_checkpoint_operator.coordinator import (
    CheckpointCoordinator,
    CheckpointFinalized,
    CheckpointKind,
    CoordinatorConfig,
    DiscardCheckpoint,
    DiscardSavepoint,
    Effect,
    FinalizationFailed,
    FinalizeCheckpoint,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    NotifyCheckpointComplete,
    PersistedState,
    PersistState,
    SavepointHistoryLimits,
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    TerminalOutcome,
    Tick,
    TriggerCheckpoint,
    TriggerRequested,
)

TASK_POOL = ("logs", "state-0-0", "state-0-1", "state-1-0")
COMPLETIONS: list[int] = []


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.config = CoordinatorConfig(
            interval=10.0,
            min_pause=2.0,
            timeout=25.0,
            max_concurrent=2,
            tolerable_failures=2,
            retained=2,
            max_queued_requests=3,
            savepoint_history=SavepointHistoryLimits(max_count=2, max_age_seconds=120.0),
        )
        # A small id block: runs cross block boundaries and restart inside blocks.
        self.id_block = 3
        self.coordinator = self._build(None)
        self.highest_triggered = 0
        self.expected: dict[int, frozenset[str]] = {}
        self.acked: dict[int, set[str]] = {}
        self.batch_of: dict[int, int] = {}
        self.finalizing: set[int] = set()
        self.savepoint_ids: set[int] = set()
        self.discarded_savepoints: set[int] = set()
        self.persisted = PersistedState()
        self.completions = 0

    def _build(
        self, state: PersistedState | None, next_id: int | None = None
    ) -> CheckpointCoordinator:
        return CheckpointCoordinator(
            self.config,
            clock=self.clock,
            rng=random.Random(len(str(state))),
            state=state,
            id_block=self.id_block,
            next_id=next_id,
        )

    def _send(self, event: object) -> list[Effect]:
        effects = self.coordinator.handle(event)  # type: ignore[arg-type]
        self._check(effects)
        return effects

    def _check(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case PersistState(state=state):
                    self.persisted = state
                case TriggerCheckpoint(checkpoint_id=cid, kind=kind, expected_tasks=tasks):
                    # Ids strictly increase, across restarts too, and a counter that
                    # covers the id was persisted before the trigger (once per id block).
                    assert cid > self.highest_triggered
                    assert self.persisted.next_checkpoint_id > cid
                    self.highest_triggered = cid
                    self.expected[cid] = tasks
                    self.acked[cid] = set()
                    if kind is CheckpointKind.SAVEPOINT:
                        self.savepoint_ids.add(cid)
                case FinalizeCheckpoint(checkpoint_id=cid, tasks=tasks):
                    assert self.acked[cid] == set(tasks) == set(self.expected[cid])
                    self.finalizing.add(cid)
                case NotifyCheckpointComplete(checkpoint=completed):
                    self.completions += 1
                    # Complete only with every expected task acknowledged, and only after
                    # the registry listing it was persisted.
                    cid = completed.checkpoint_id
                    assert self.acked[cid] == set(self.expected[cid])
                    registered = {
                        c.checkpoint_id
                        for c in (*self.persisted.checkpoints, *self.persisted.savepoints)
                    }
                    assert cid in registered
                case DiscardCheckpoint(checkpoint_id=cid, retained=retained):
                    assert cid not in self.savepoint_ids
                    registered = {c.checkpoint_id for c in self.persisted.checkpoints}
                    assert cid not in registered
                    assert set(retained) <= registered
                case DiscardSavepoint(savepoint=savepoint):
                    self.discarded_savepoints.add(savepoint.checkpoint_id)

    # ------------------------------------------------------------------ rules

    @initialize()
    def job_runs(self) -> None:
        self._send(TasksReported(frozenset(TASK_POOL[:3]), all_running=True))
        self._send(JobPhaseChanged(JobPhase.RUNNING))

    @rule(seconds=st.floats(min_value=0.1, max_value=30.0))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self._send(Tick())

    # Flags are phrased so that hypothesis' simplest value (False, 0) is the happy path.
    @rule(leave_running=st.booleans())
    def phase(self, leave_running: bool) -> None:
        self._send(JobPhaseChanged(JobPhase.RESTARTING if leave_running else JobPhase.RUNNING))

    @rule(tasks=st.sets(st.sampled_from(TASK_POOL), min_size=1), executor_lost=st.booleans())
    def report(self, tasks: set[str], executor_lost: bool) -> None:
        self._send(TasksReported(frozenset(tasks), all_running=not executor_lost))

    @rule(
        kind=st.sampled_from(CheckpointKind),
        forced=st.none() | st.booleans(),
    )
    def request(self, kind: CheckpointKind, forced: bool | None) -> None:
        self._send(TriggerRequested(kind, forced=forced))

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data(), unknown_task=st.booleans(), odd_batch=st.integers(0, 19))
    def acknowledge(self, data: st.DataObject, unknown_task: bool, odd_batch: int) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        cid = pending.checkpoint_id
        missing = sorted(self.expected[cid] - self.acked[cid]) or sorted(self.expected[cid])
        task = "state-9-9" if unknown_task else data.draw(st.sampled_from(missing))
        batch = self.batch_of.setdefault(cid, 5)
        if odd_batch == 19:
            batch += 1  # a task that captured another batch: the checkpoint must fail
        self._send(TaskAcknowledged(cid, TaskAck(task, batch, 10, 1)))

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data())
    def acknowledge_all(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        cid = pending.checkpoint_id
        for task in sorted(self.expected[cid] - self.acked[cid]):
            self._send(TaskAcknowledged(cid, TaskAck(task, 5, 10, 1)))

    @rule(checkpoint_id=st.integers(1, 30))
    def stray_acknowledgement(self, checkpoint_id: int) -> None:
        pending_ids = {p.checkpoint_id for p in self.coordinator.pending}
        effects = self._send(TaskAcknowledged(checkpoint_id, TaskAck("logs", 5, 1, 1)))
        if checkpoint_id not in pending_ids:
            assert effects == [], "an ack of no pending checkpoint changes nothing"

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data())
    def decline(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        self._send(TaskDeclined(pending.checkpoint_id, "logs", "boom"))

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        cid = pending.checkpoint_id
        for task in sorted(self.expected[cid] - self.acked[cid]):
            self._send(TaskAcknowledged(cid, TaskAck(task, 5, 10, 1)))
        if cid in self.finalizing:
            self.finalizing.discard(cid)
            self._send(CheckpointFinalized(cid, f"file:///s/chk-{cid}", 100))

    @precondition(lambda self: bool(self.finalizing))
    @rule(data=st.data(), fail=st.booleans())
    def finalize(self, data: st.DataObject, fail: bool) -> None:
        cid = data.draw(st.sampled_from(sorted(self.finalizing)))
        self.finalizing.discard(cid)
        if not fail:
            self._send(CheckpointFinalized(cid, f"file:///s/chk-{cid}", 100))
        else:
            self._send(FinalizationFailed(cid, "disk full"))

    @rule()
    def restart_operator(self) -> None:
        self.coordinator = self._build(PersistedState.from_dict(self.persisted.to_dict()))
        self.finalizing.clear()

    @rule()
    def replace_in_process(self) -> None:
        """New settings or a resumed job: a new coordinator continues the live counter."""
        old = self.coordinator
        self.coordinator = self._build(old.persisted_state, next_id=old.next_checkpoint_id)
        self.finalizing.clear()
        self.job_runs()  # the supervisor tells it the phase; the next status, the tasks

    @precondition(lambda self: self.highest_triggered > 6)
    @rule(outcome=st.sampled_from(TerminalOutcome))
    def terminate(self, outcome: TerminalOutcome) -> None:
        self._send(JobTerminated(outcome))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def concurrency_is_bounded_except_for_forced_requests(self) -> None:
        pending = self.coordinator.pending
        unforced = [p for p in pending if not p.forced]
        assert len(unforced) <= self.config.max_concurrent
        if len(pending) > self.config.max_concurrent:
            assert any(p.forced for p in pending)

    @invariant()
    def registry_respects_retention_and_savepoints_survive_it(self) -> None:
        state = self.coordinator.persisted_state
        assert len(state.checkpoints) <= self.config.retained
        ids = [c.checkpoint_id for c in state.checkpoints]
        assert ids == sorted(ids)
        registered_savepoints = {s.checkpoint_id for s in state.savepoints}
        completed_savepoints = {
            h.checkpoint_id
            for h in state.history
            if h.kind is CheckpointKind.SAVEPOINT and h.status.value == "Completed"
        }
        # A completed savepoint leaves the registry only through the history limits.
        for sid in completed_savepoints - registered_savepoints:
            assert sid in self.discarded_savepoints

    def teardown(self) -> None:
        # Steer the search towards runs that complete checkpoints: most random runs
        # complete none, and the invariants about the registry need some that do.
        target(float(self.completions), label="completed checkpoints")
        COMPLETIONS.append(self.completions)

    @invariant()
    def queue_is_bounded(self) -> None:
        assert len(self.coordinator.queued) <= self.config.max_queued_requests


CoordinatorMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoordinatorInvariants = CoordinatorMachine.TestCase


def test_the_machine_reaches_completions() -> None:
    """Guards the invariants above against vacuity, on a fixed seed."""
    COMPLETIONS.clear()
    run_state_machine_as_test(
        CoordinatorMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=60,
            derandomize=True,
            database=None,
            deadline=None,
        ),
    )
    # Few runs are long enough to complete several; one that does shows the rules fire.
    assert max(COMPLETIONS) >= 2
