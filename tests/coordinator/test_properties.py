"""Invariants of the coordinator over random configurations and event sequences (a
hypothesis state machine).

Each run draws the coordinator's configuration (retained, maxConcurrent,
tolerableFailures, the id block, interval/minPause/timeout, savepoint history limits), then
a model agent acknowledges, declines and finalizes at random while the job commits
batches; the operator may restart (the coordinator is rebuilt from its persisted state) at
any point.
"""

import random
from collections import Counter

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

from helpers.coordinator import Aligned, FakeClock
from spark_checkpoint_operator.coordinator import (
    PERIODIC_SAVEPOINT_LABEL,
    AbortCheckpoint,
    AfterCompletion,
    CheckpointCoordinator,
    CheckpointFinalized,
    CheckpointKind,
    CoordinatorConfig,
    DiscardCheckpoint,
    DiscardSavepoint,
    Effect,
    FailJob,
    FailureReason,
    FinalizationFailed,
    FinalizeCheckpoint,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    NotifyCheckpointComplete,
    PersistedState,
    PersistState,
    RetentionPolicy,
    SavepointDisposeRequested,
    SavepointHistoryLimits,
    SavepointPinChanged,
    StoredIdsReported,
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    TerminalOutcome,
    Tick,
    TriggerCheckpoint,
    TriggerDeliveryFailed,
    TriggerRequested,
    TriggerWithdrawn,
)
from spark_checkpoint_operator.coordinator.state import MAX_COUNT

TASK_POOL = ("logs", "state-0-0", "state-0-1", "state-1-0")
WITHDRAWN_LABEL = "suspend"
COMPLETIONS: list[int] = []
STREAKS: list[tuple[int, int]] = []  # (longest streak of failures, tolerated)
PERIODIC_SAVEPOINTS: list[int] = []  # periodic savepoints triggered per run
SCHEDULED_SAVEPOINTS: list[int] = []  # the same, per run with a schedule
# Per run: whether a pinned savepoint was registered while the others filled the history.
PINNED_PAST_LIMIT: list[bool] = []


@st.composite
def configurations(draw: st.DrawFn) -> CoordinatorConfig:
    """The settings a user may pick: every combination the manifest accepts, small enough
    that runs reach their limits (a full queue, the retained count, the history size)."""
    interval = draw(st.none() | st.floats(1.0, 60.0))
    min_pause = draw(st.floats(0.0, interval if interval is not None else 30.0))
    max_age = draw(st.none() | st.floats(5.0, 300.0))
    return CoordinatorConfig(
        interval=interval,
        min_pause=min_pause,
        timeout=draw(st.floats(1.0, 120.0)),
        max_concurrent=draw(st.integers(1, 5)),
        tolerable_failures=draw(st.integers(0, 5)),
        retained=draw(st.integers(1, 10)),
        retention_policy=draw(st.sampled_from(RetentionPolicy)),
        max_queued_requests=draw(st.integers(1, 5)),
        savepoint_history=SavepointHistoryLimits(
            max_count=draw(st.integers(1, 5)), max_age_seconds=max_age
        ),
        **draw(
            st.just({})
            | st.builds(dict, savepoint_interval=st.floats(1.0, 60.0))
            | st.builds(dict, savepoint_schedule=st.builds(Aligned, st.integers(1, 60)))
        ),
    )


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.highest_triggered = 0
        self.highest_stored = 0  # the highest snapshot id a driver found in storage
        self.expected: dict[int, frozenset[str]] = {}
        self.acked: dict[int, set[str]] = {}
        self.batch_of: dict[int, int] = {}
        self.finalizing: set[int] = set()
        self.savepoint_ids: set[int] = set()
        self.discarded_savepoints: set[int] = set()
        self.freed: set[int] = set()  # savepoints released or disposed of
        self.completed_checkpoints: list[int] = []
        self.discarded_checkpoints: Counter[int] = Counter()
        self.job_batch = 0  # the query's last committed micro-batch
        self.committed_batch = -1  # the newest batch sinks were allowed to commit
        self.terminated = False
        self.pinned_past_limit = False
        self.persisted = PersistedState()
        self.completions = 0
        self.first_running: float | None = None  # when the job first ran
        self.last_periodic: float | None = None  # the last periodic savepoint's trigger
        self.periodic_savepoints = 0
        # Flink's CheckpointFailureManager, modelled apart: checkpoint failures of the kinds
        # that say the job cannot checkpoint, in a row, since an image completed (or the
        # job left Running, or a coordinator took over).
        self.failure_streak = 0
        self.longest_streak = 0
        self.last_completed = 0
        self.stops: set[int] = set()  # pending stop-with-savepoints

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

    def _ack(self, checkpoint_id: int, task: str, batch: int) -> None:
        pending = {p.checkpoint_id for p in self.coordinator.pending}
        counted = checkpoint_id in pending and task in self.expected[checkpoint_id]
        if counted and task not in self.acked[checkpoint_id]:
            self.acked[checkpoint_id].add(task)
        self._send(TaskAcknowledged(checkpoint_id, TaskAck(task, batch, 10, 1)))

    def _fails_the_job(self, cid: int, kind: CheckpointKind, reason: FailureReason) -> bool:
        """Whether the abort of ``cid`` must fail the job: a checkpoint's failure of a kind
        that counts, not one older than the last completed image (Flink's
        lastSucceededCheckpointId) nor one beside a pending stop-with-savepoint."""
        self.stops.discard(cid)
        if kind is not CheckpointKind.CHECKPOINT or not reason.counts_toward_tolerable_failures:
            return False
        if self.stops or cid < self.last_completed:
            return False
        self.failure_streak += 1
        self.longest_streak = max(self.longest_streak, self.failure_streak)
        return self.failure_streak > self.config.tolerable_failures

    def _check_periodic_savepoint(self, checkpoint_id: int, kind: CheckpointKind) -> None:
        """A periodic savepoint comes an interval after the last one (the first an interval
        after the job first ran), across restarts: the time persisted before it says when."""
        label = next(p.label for p in self.coordinator.pending if p.checkpoint_id == checkpoint_id)
        if label != PERIODIC_SAVEPOINT_LABEL:
            return
        interval, schedule = self.config.savepoint_interval, self.config.savepoint_schedule
        assert kind is CheckpointKind.SAVEPOINT
        assert self.first_running is not None
        previous = self.last_periodic if self.last_periodic is not None else self.first_running
        if interval is not None:
            assert self.clock.now >= previous + interval
        else:
            assert schedule is not None
            assert self.clock.now >= schedule.next_after(previous)
        assert self.persisted.last_periodic_savepoint == self.clock.now
        self.last_periodic = self.clock.now
        self.periodic_savepoints += 1

    def _check(self, effects: list[Effect]) -> None:
        must_fail = False
        for effect in effects:
            match effect:
                case AbortCheckpoint(checkpoint_id=cid, kind=kind, reason=reason):
                    must_fail |= self._fails_the_job(cid, kind, reason)
                case PersistState(state=state):
                    # What is persisted is read back (an operator restart, a local run).
                    read_back = PersistedState.from_dict(state.to_dict())
                    assert read_back.next_checkpoint_id == state.next_checkpoint_id
                    self.persisted = state
                case TriggerCheckpoint(
                    checkpoint_id=cid, kind=kind, after=after, expected_tasks=tasks
                ):
                    if after is not AfterCompletion.CONTINUE:
                        self.stops.add(cid)
                    # Ids strictly increase, across restarts too, and a counter that
                    # covers the id was persisted before the trigger (once per id block).
                    assert cid > self.highest_triggered
                    assert cid > self.highest_stored, "another registry's savepoint id"
                    assert self.persisted.next_checkpoint_id > cid
                    self.highest_triggered = cid
                    self.expected[cid] = tasks
                    self.acked[cid] = set()
                    self.batch_of[cid] = self.job_batch  # the batch its snapshot captures
                    if kind is CheckpointKind.SAVEPOINT:
                        self.savepoint_ids.add(cid)
                    self._check_periodic_savepoint(cid, kind)
                case FinalizeCheckpoint(checkpoint_id=cid, tasks=tasks):
                    assert self.acked[cid] == set(tasks) == set(self.expected[cid])
                    self.finalizing.add(cid)
                case NotifyCheckpointComplete(checkpoint=completed, sinks_may_commit=commit):
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
                    if completed.kind is CheckpointKind.CHECKPOINT:
                        self.completed_checkpoints.append(cid)
                    self.stops.discard(cid)
                    # Any completed image resets the count (Flink's handleCheckpointSuccess).
                    self.failure_streak = 0
                    self.last_completed = max(self.last_completed, cid)
                    if commit:
                        self.committed_batch = max(self.committed_batch, completed.batch_id)
                case DiscardCheckpoint(checkpoint_id=cid, retained=retained):
                    assert cid not in self.savepoint_ids
                    registered = {c.checkpoint_id for c in self.persisted.checkpoints}
                    assert cid not in registered
                    assert set(retained) <= registered
                    self.discarded_checkpoints[cid] += 1
                case DiscardSavepoint(savepoint=savepoint):
                    # A pinned one (a SparkCheckpointSnapshot's) only once released or
                    # disposed of: never by the history's limits.
                    assert not savepoint.pinned or savepoint.checkpoint_id in self.freed
                    self.discarded_savepoints.add(savepoint.checkpoint_id)
        failed = any(isinstance(effect, FailJob) for effect in effects)
        assert failed == must_fail, (self.failure_streak, self.config.tolerable_failures)

    # ------------------------------------------------------------------ rules

    @initialize(config=configurations(), id_block=st.integers(1, 100))
    def job_runs(self, config: CoordinatorConfig, id_block: int) -> None:
        self.config = config
        self.id_block = id_block
        self.coordinator = self._build(None)
        self._start_job()

    def _start_job(self) -> None:
        if self.first_running is None:
            self.first_running = self.clock.now
        self._send(TasksReported(frozenset(TASK_POOL[:3]), all_running=True))
        self._send(JobPhaseChanged(JobPhase.RUNNING))

    @rule(seconds=st.floats(min_value=0.1, max_value=30.0), batches=st.integers(0, 3))
    def advance(self, seconds: float, batches: int) -> None:
        self.clock.now += seconds
        self.job_batch += batches
        self._send(Tick())

    # Flags are phrased so that hypothesis' simplest value (False, 0) is the happy path.
    @rule(leave_running=st.booleans())
    def phase(self, leave_running: bool) -> None:
        self._send(JobPhaseChanged(JobPhase.RESTARTING if leave_running else JobPhase.RUNNING))
        if leave_running:
            self.failure_streak = 0

    @rule(tasks=st.sets(st.sampled_from(TASK_POOL), min_size=1), executor_lost=st.booleans())
    def report(self, tasks: set[str], executor_lost: bool) -> None:
        self._send(TasksReported(frozenset(tasks), all_running=not executor_lost))

    @rule(highest=st.integers(0, 300))
    def storage_reported(self, highest: int) -> None:
        """A driver found snapshot directories up to ``highest`` in the job's storage
        (savepoints another registry kept there, or this one's own)."""
        self._send(StoredIdsReported(highest))
        self.highest_stored = max(self.highest_stored, highest)

    @rule(highest=st.sampled_from([MAX_COUNT - 1, MAX_COUNT, 2**63 - 1]))
    def storage_reported_beyond_any_counter(self, highest: int) -> None:
        """A directory named by hand (`sp-99999999999999999999`): no counter could
        continue above it and be persisted, so it changes nothing."""
        next_id = self.coordinator.next_checkpoint_id
        assert self._send(StoredIdsReported(highest)) == []
        assert self.coordinator.next_checkpoint_id == next_id

    @rule(
        kind=st.sampled_from(CheckpointKind),
        forced=st.none() | st.booleans(),
        stop=st.booleans(),
        drain=st.booleans(),
        label=st.sampled_from(["", WITHDRAWN_LABEL]),
        pinned=st.booleans(),
    )
    def request(
        self,
        *,
        kind: CheckpointKind,
        forced: bool | None,
        stop: bool,
        drain: bool,
        label: str,
        pinned: bool,
    ) -> None:
        after = AfterCompletion.CONTINUE
        if stop and kind is CheckpointKind.SAVEPOINT:
            after = AfterCompletion.DRAIN if drain else AfterCompletion.STOP
        event = TriggerRequested(kind, after=after, forced=forced, label=label, pinned=pinned)
        self._send(event)

    @rule(data=st.data(), pinned=st.booleans())
    def pin(self, data: st.DataObject, pinned: bool) -> None:
        """A SparkCheckpointSnapshot pins a registered savepoint (alreadyExists), or its
        objects are gone: released (any id, registered or not)."""
        registered = [s.checkpoint_id for s in self.coordinator.persisted_state.savepoints]
        savepoint_id = data.draw(
            st.sampled_from(registered)
            if registered and data.draw(st.booleans())
            else st.integers(1, max(1, self.highest_triggered + 1))
        )
        if pinned:
            self.freed.discard(savepoint_id)  # kept again: the history may not let it go
        else:
            self.freed.add(savepoint_id)
        self._send(SavepointPinChanged(savepoint_id, pinned=pinned))
        after = {s.checkpoint_id: s.pinned for s in self.coordinator.persisted_state.savepoints}
        if savepoint_id in registered:
            assert after.get(savepoint_id, False) is pinned

    @rule()
    def withdraw(self) -> None:
        others = [p.checkpoint_id for p in self.coordinator.pending if p.label != WITHDRAWN_LABEL]
        failures = self.coordinator.consecutive_failures
        self._send(TriggerWithdrawn(WITHDRAWN_LABEL))
        pending = self.coordinator.pending
        assert all(p.label != WITHDRAWN_LABEL for p in pending)
        assert set(others) <= {p.checkpoint_id for p in pending}
        assert all(r.label != WITHDRAWN_LABEL for r in self.coordinator.queued)
        assert self.coordinator.consecutive_failures == failures, "not counted"

    @rule(data=st.data())
    def dispose(self, data: st.DataObject) -> None:
        """A user disposes of a savepoint: a registered one, or any id (one disposed
        already, a checkpoint's, an unknown one)."""
        registered = [s.checkpoint_id for s in self.coordinator.persisted_state.savepoints]
        savepoint_id = data.draw(
            st.sampled_from(registered)
            if registered and data.draw(st.booleans())
            else st.integers(1, max(1, self.highest_triggered + 1))
        )
        refusal = self.coordinator.persisted_state.why_not_disposable(savepoint_id)
        self.freed.add(savepoint_id)
        effects = self._send(SavepointDisposeRequested(savepoint_id, label="dispose"))
        if refusal is not None:
            assert effects == []
            return
        discards = [e for e in effects if isinstance(e, DiscardSavepoint)]
        assert [(d.savepoint.checkpoint_id, d.label) for d in discards] == [
            (savepoint_id, "dispose")
        ]
        assert savepoint_id not in {s.checkpoint_id for s in self.persisted.savepoints}

    @rule(kind=st.sampled_from(CheckpointKind), pinned=st.booleans())
    def take_checkpoint(self, kind: CheckpointKind, pinned: bool) -> None:
        """A whole round trip, as most of a healthy job's checkpoints are: without it, runs
        rarely complete enough checkpoints to fill the retained count."""
        effects = self._send(TriggerRequested(kind, pinned=pinned))
        for trigger in [e for e in effects if isinstance(e, TriggerCheckpoint)]:
            cid = trigger.checkpoint_id
            for task in sorted(self.expected[cid] - self.acked[cid]):
                self._ack(cid, task, self.batch_of[cid])
            if cid in self.finalizing:
                self.finalizing.discard(cid)
                self._send(CheckpointFinalized(cid, f"file:///s/chk-{cid}", 100))

    @rule(expire=st.booleans())
    def fail_checkpoint(self, expire: bool) -> None:
        """A whole round trip that fails, as a job's that cannot checkpoint: without it,
        runs rarely fail enough checkpoints in a row to reach tolerableFailures."""
        effects = self._send(TriggerRequested(CheckpointKind.CHECKPOINT))
        for trigger in [e for e in effects if isinstance(e, TriggerCheckpoint)]:
            if expire:
                self.clock.now += self.config.timeout
                self._send(Tick())
            else:
                self._send(TaskDeclined(trigger.checkpoint_id, "logs", "boom"))

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data(), unknown_task=st.booleans(), odd_batch=st.integers(0, 19))
    def acknowledge(self, data: st.DataObject, unknown_task: bool, odd_batch: int) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        cid = pending.checkpoint_id
        missing = sorted(self.expected[cid] - self.acked[cid]) or sorted(self.expected[cid])
        task = "state-9-9" if unknown_task else data.draw(st.sampled_from(missing))
        batch = self.batch_of[cid]
        if odd_batch == 19:
            batch += 1  # a task that captured another batch: the checkpoint must fail
        self._ack(cid, task, batch)

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data())
    def acknowledge_all(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        cid = pending.checkpoint_id
        for task in sorted(self.expected[cid] - self.acked[cid]):
            self._ack(cid, task, self.batch_of[cid])

    @rule(checkpoint_id=st.integers(1, 30))
    def stray_acknowledgement(self, checkpoint_id: int) -> None:
        """An ack of any id: of no pending checkpoint it changes nothing; of a pending one
        it is an ack like any other, recorded as such (unrecorded, one that completed a
        checkpoint's tasks failed the model's finalize check: a random run's)."""
        if checkpoint_id in {p.checkpoint_id for p in self.coordinator.pending}:
            self._ack(checkpoint_id, "logs", 5)
            return
        effects = self._send(TaskAcknowledged(checkpoint_id, TaskAck("logs", 5, 1, 1)))
        assert effects == [], "an ack of no pending checkpoint changes nothing"

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data(), refused_trigger=st.booleans())
    def decline(self, data: st.DataObject, refused_trigger: bool) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        if refused_trigger:
            self._send(TriggerDeliveryFailed(pending.checkpoint_id, "409 refused"))
        else:
            self._send(TaskDeclined(pending.checkpoint_id, "logs", "boom"))

    @precondition(lambda self: bool(self.coordinator.pending))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from(self.coordinator.pending))
        cid = pending.checkpoint_id
        for task in sorted(self.expected[cid] - self.acked[cid]):
            self._ack(cid, task, self.batch_of[cid])
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
        self.stops.clear()
        self.failure_streak = 0

    @rule()
    def replace_in_process(self) -> None:
        """New settings or a resumed job: a new coordinator continues the live counter."""
        old = self.coordinator
        self.coordinator = self._build(old.persisted_state, next_id=old.next_checkpoint_id)
        self.finalizing.clear()
        self.stops.clear()
        self.failure_streak = 0
        self._start_job()  # the supervisor tells it the phase; the next status, the tasks

    @precondition(lambda self: self.highest_triggered > 6)
    @rule(outcome=st.sampled_from(TerminalOutcome))
    def terminate(self, outcome: TerminalOutcome) -> None:
        self._send(JobTerminated(outcome))
        self.terminated = True

    # ------------------------------------------------------------------ invariants

    @invariant()
    def concurrency_is_bounded_except_for_forced_requests(self) -> None:
        pending = self.coordinator.pending
        unforced = [p for p in pending if not p.forced]
        assert len(unforced) <= self.config.max_concurrent
        if len(pending) > self.config.max_concurrent:
            assert any(p.forced for p in pending)

    @invariant()
    def registry_is_the_newest_retained_and_every_other_is_discarded_once(self) -> None:
        registry = [c.checkpoint_id for c in self.coordinator.persisted_state.checkpoints]
        completed = self.completed_checkpoints
        discarded_everything = self.terminated and not registry and completed
        if not discarded_everything:
            assert (
                registry == completed[len(completed) - min(len(completed), self.config.retained) :]
            )
        assert set(self.discarded_checkpoints) == set(completed) - set(registry)
        assert all(times == 1 for times in self.discarded_checkpoints.values())

    @invariant()
    def savepoints_leave_the_registry_only_discarded(self) -> None:
        state = self.coordinator.persisted_state
        registered_savepoints = {s.checkpoint_id for s in state.savepoints}
        completed_savepoints = {
            h.checkpoint_id
            for h in state.history
            if h.kind is CheckpointKind.SAVEPOINT and h.status.value == "Completed"
        }
        for sid in completed_savepoints - registered_savepoints:
            assert sid in self.discarded_savepoints
        unpinned = [s for s in state.savepoints if not s.pinned]
        assert len(unpinned) <= self.config.savepoint_history.max_count + 1
        if len(unpinned) >= self.config.savepoint_history.max_count > 0 and any(
            s.pinned for s in state.savepoints
        ):
            self.pinned_past_limit = True

    @invariant()
    def committed_output_is_never_ahead_of_the_newest_restorable_image(self) -> None:
        if self.terminated:
            return  # the retention policy may discard every checkpoint: nothing restarts
        state = self.coordinator.persisted_state
        images = [c.batch_id for c in (*state.checkpoints, *state.savepoints)]
        assert self.committed_batch <= max(images, default=-1)

    @invariant()
    def queue_is_bounded(self) -> None:
        assert len(self.coordinator.queued) <= self.config.max_queued_requests

    def teardown(self) -> None:
        # Steer the search towards runs that complete checkpoints: most random runs
        # complete none, and the invariants about the registry need some that do.
        target(float(self.completions), label="completed images")
        target(float(len(self.completed_checkpoints)), label="completed checkpoints")
        target(float(self.longest_streak), label="failures in a row")
        COMPLETIONS.append(self.completions)
        PERIODIC_SAVEPOINTS.append(self.periodic_savepoints)
        if self.config.savepoint_schedule is not None:
            SCHEDULED_SAVEPOINTS.append(self.periodic_savepoints)
        STREAKS.append((self.longest_streak, self.config.tolerable_failures))
        PINNED_PAST_LIMIT.append(self.pinned_past_limit)


# max_examples is the profile's (hypothesis' 100; fewer in the mutation profile).
CoordinatorMachine.TestCase.settings = settings(
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCoordinatorInvariants = CoordinatorMachine.TestCase


def test_the_machine_reaches_completions() -> None:
    """Guards the invariants above against vacuity, on a fixed seed."""
    COMPLETIONS.clear()
    STREAKS.clear()
    PERIODIC_SAVEPOINTS.clear()
    SCHEDULED_SAVEPOINTS.clear()
    PINNED_PAST_LIMIT.clear()
    run_state_machine_as_test(
        CoordinatorMachine,
        settings=settings(
            # With 60, no run failed past its tolerance when this ran after the control
            # plane's tests in one worker (cause not found; alone it passed). With 200,
            # 19 of 215 runs did alone, 2 of 230 once a completed savepoint reset the count
            # and a stop-with-savepoint's neighbours went uncounted; 8 of 631 with 600.
            max_examples=600,
            stateful_step_count=60,
            derandomize=True,
            database=None,
            deadline=None,
        ),
    )
    # Few runs are long enough to complete several; one that does shows the rules fire.
    assert max(COMPLETIONS) >= 2
    # And the failure count's: a run failed only past a tolerance above 0.
    assert any(streak > tolerated >= 1 for streak, tolerated in STREAKS), STREAKS
    # And savepoints.interval's and .schedule's: runs took several periodic savepoints.
    assert max(PERIODIC_SAVEPOINTS) >= 2
    assert max(SCHEDULED_SAVEPOINTS, default=0) >= 2
    # And the pins': a pinned savepoint stayed while the others filled the history.
    assert any(PINNED_PAST_LIMIT), sum(PINNED_PAST_LIMIT)
