"""The checkpoint coordinator of one job: a deterministic state machine.

It consumes events and returns effects; time and randomness are injected, so it never
sleeps, never does I/O and can be driven by a fake clock. Its rules are modelled on Flink's
(CheckpointCoordinator, CheckpointRequestDecider, CheckpointFailureManager);
docs/coordinator.md lists each with the test that proves it, and where and why it
differs from Flink.
"""

import functools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from spark_checkpoint_operator.coordinator.completed import (
    CheckpointOutcome,
    CompletedCheckpoint,
    CompletedCheckpointStore,
    OutcomeStatus,
    SavepointHistory,
    shortened,
)
from spark_checkpoint_operator.coordinator.config import CoordinatorConfig, TerminalOutcome
from spark_checkpoint_operator.coordinator.effects import (
    AbortCheckpoint,
    DiscardCheckpoint,
    DiscardSavepoint,
    Effect,
    FailJob,
    FinalizeCheckpoint,
    NotifyCheckpointComplete,
    PersistState,
    RequestDeclined,
    TriggerCheckpoint,
)
from spark_checkpoint_operator.coordinator.events import (
    CheckpointFinalized,
    Event,
    FinalizationFailed,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    SavepointDisposeRequested,
    SavepointPinChanged,
    SnapshotCaptured,
    StoredIdsReported,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    Tick,
    TriggerDeliveryFailed,
    TriggerRequested,
    TriggerWithdrawn,
)
from spark_checkpoint_operator.coordinator.pending import PendingCheckpoint
from spark_checkpoint_operator.coordinator.reasons import FailureReason
from spark_checkpoint_operator.coordinator.requests import (
    PERIODIC_SAVEPOINT_LABEL,
    AfterCompletion,
    CheckpointKind,
    RequestOrigin,
    RequestQueue,
    TriggerRequest,
)
from spark_checkpoint_operator.coordinator.state import MAX_COUNT, PersistedState

Clock = Callable[[], float]

# Checkpoint ids are made durable a block at a time: one state write per block, not one per
# checkpoint. A restarted coordinator starts after the block, so the unused rest of a block
# is a gap in the ids, never a reuse.
CHECKPOINT_ID_BLOCK = 100


@dataclass(frozen=True, slots=True)
class PendingView:
    checkpoint_id: int
    kind: CheckpointKind
    origin: RequestOrigin
    forced: bool
    label: str
    trigger_time: float
    deadline: float | None  # None: a drain waiting for the input to run out
    acknowledged: int
    expected: int
    finalizing: bool


class CheckpointCoordinator:
    """Coordinates the checkpoints of one job.

    ``clock`` returns the current time in seconds (epoch based: the times recorded and shown
    to users, and savepoint ages); ``timer`` returns seconds on a clock that never steps
    (``time.monotonic``), on which deadlines, the periodic schedule and the minimum pause
    run, as Flink's do: a wall clock stepped forward expired healthy checkpoints, one
    stepped back held periodic ones (None: ``clock``, as a fake clock is both); ``rng``
    picks the random initial delay of the periodic scheduler; ``id_block`` is how many
    checkpoint ids one state write reserves. ``next_id`` continues the counter
    of a coordinator this one replaces in the same process (new settings, a resumed job):
    the ids from it up to the persisted counter are reserved and unused. Without it, the
    counter starts after the reserved block (after a restart, the only safe place).
    ``unrestorable`` tells whether a restore failed on or passed over a checkpoint or
    savepoint (by kind and id): retention and the savepoint history drop those first.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        clock: Clock,
        timer: Clock | None = None,
        rng: random.Random,
        state: PersistedState | None = None,
        id_block: int = CHECKPOINT_ID_BLOCK,
        next_id: int | None = None,
        unrestorable: Callable[[CheckpointKind, int], bool] = lambda kind, image_id: False,
    ) -> None:
        if id_block < 1:
            raise ValueError(f"id_block must be at least 1, got {id_block}")
        state = state or PersistedState()
        if next_id is not None and not 1 <= next_id <= state.next_checkpoint_id:
            raise ValueError(
                f"next_id {next_id} is outside the reserved ids (1 to {state.next_checkpoint_id})"
            )
        self._config = config
        self._unrestorable = unrestorable
        self._clock = clock
        self._timer = timer or clock
        self._rng = rng
        self._id_block = id_block
        self._next_id = state.next_checkpoint_id if next_id is None else next_id
        self._reserved_until = state.next_checkpoint_id
        self._store = CompletedCheckpointStore(
            config.retained,
            state.checkpoints,
            functools.partial(unrestorable, CheckpointKind.CHECKPOINT),
        )
        self._savepoints = SavepointHistory(
            config.savepoint_history,
            state.savepoints,
            functools.partial(unrestorable, CheckpointKind.SAVEPOINT),
        )
        self._history: deque[CheckpointOutcome] = deque(state.history, maxlen=config.history_size)
        self._completed_count = state.completed_count
        self._failed_count = state.failed_count
        self._terminated = state.terminated
        self._queue = RequestQueue(config.max_queued_requests)
        self._pending: dict[int, PendingCheckpoint] = {}
        self._next_periodic_at: float | None = None
        self._consecutive_failures = 0
        # Flink's lastSucceededCheckpointId: a failure of an older checkpoint (still pending
        # as a savepoint completed, which subsumes nothing) is not counted.
        self._last_completed_id = 0
        self._tasks: frozenset[str] = frozenset()
        self._tasks_running = False
        self._job_running = False
        # Restored state needs no last completion time: the first periodic trigger after
        # a (re)start waits at least minPause anyway (random delay in [minPause, interval]).
        self._last_completion_time: float | None = None
        # Kept only while periodic savepoints are on: turned on again, the first comes an
        # interval (or the schedule's first time) after the job runs with them.
        self._last_periodic_savepoint = (
            state.last_periodic_savepoint if self._periodic_savepoints else None
        )

    # ------------------------------------------------------------------ queries

    @property
    def persisted_state(self) -> PersistedState:
        return PersistedState(
            next_checkpoint_id=self._reserved_until,
            checkpoints=self._store.checkpoints,
            savepoints=self._savepoints.savepoints,
            history=tuple(self._history),
            completed_count=self._completed_count,
            failed_count=self._failed_count,
            terminated=self._terminated,
            last_periodic_savepoint=self._last_periodic_savepoint,
        )

    @property
    def config(self) -> CoordinatorConfig:
        return self._config

    @property
    def next_checkpoint_id(self) -> int:
        """The id the next trigger gets (the persisted counter may be ahead: a block)."""
        return self._next_id

    @property
    def periodic_scheduling(self) -> bool:
        return self._next_periodic_at is not None

    @property
    def next_periodic_trigger(self) -> float | None:
        return self._next_periodic_at

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive_failures

    @property
    def pending(self) -> tuple[PendingView, ...]:
        return tuple(
            PendingView(
                checkpoint_id=p.checkpoint_id,
                kind=p.kind,
                origin=p.origin,
                forced=p.forced,
                label=p.label,
                trigger_time=p.trigger_time,
                deadline=p.deadline,
                acknowledged=len(p.acks),
                expected=len(p.expected_tasks),
                finalizing=p.finalizing,
            )
            for p in self._pending.values()
        )

    @property
    def queued(self) -> tuple[TriggerRequest, ...]:
        return tuple(self._queue)

    @property
    def tasks_reported(self) -> TasksReported:
        """The agent's last word on the snapshot tasks, as a coordinator that replaces this
        one is told it (else it declines every request until the next status)."""
        return TasksReported(self._tasks, self._tasks_running)

    def unfinished_user_requests(self) -> tuple[TriggerRequested, ...]:
        """What users asked for and has not completed (in flight or queued), oldest first,
        as the requests a coordinator that replaces this one is given: new settings give up
        what is in flight, and a savepoint asked for must not be lost with it."""
        # Not a periodic savepoint: the schedule (persisted) asks for it again when due,
        # and asked for as well, it would be taken twice.
        requests: list[PendingCheckpoint | TriggerRequest] = [
            p
            for p in self._pending.values()
            if p.origin is RequestOrigin.USER and p.label != PERIODIC_SAVEPOINT_LABEL
        ]
        requests += [
            q for q in self._queue if not q.is_periodic and q.label != PERIODIC_SAVEPOINT_LABEL
        ]
        return tuple(
            TriggerRequested(r.kind, after=r.after, forced=r.forced, label=r.label, pinned=r.pinned)
            for r in requests
        )

    def restore_candidates(self) -> tuple[CompletedCheckpoint, ...]:
        """Registered checkpoints and savepoints, newest first: restore tries them in order
        and falls back to the next one when an image turns out to be unreadable."""
        registered = (*self._store.checkpoints, *self._savepoints.savepoints)
        return tuple(sorted(registered, key=lambda c: c.checkpoint_id, reverse=True))

    def next_deadline(self) -> float | None:
        """The earliest time, on ``timer``, at which a Tick has something to do."""
        deadlines = [p.deadline for p in self._pending.values() if p.deadline is not None]
        if self._next_periodic_at is not None:
            deadlines.append(self._next_periodic_at)
        # Both on the wall clock: converted only when the clocks differ (with one clock, a
        # sum that rounds a step short would be a deadline at which a Tick does nothing, for
        # ever).
        same = self._timer is self._clock
        for wall_time in (self._savepoints.next_expiry(), self._periodic_savepoint_due()):
            if wall_time is not None:
                converted = self._timer() + (wall_time - self._clock())
                deadlines.append(wall_time if same else converted)
        return min(deadlines, default=None)

    def _periodic_savepoint_due(self) -> float | None:
        """When the next periodic savepoint is due (wall clock); None while none can be
        triggered: no interval, the job not running with all its tasks, a stop under way,
        or the last periodic one still in flight (as the Flink Kubernetes Operator, which
        triggers the next once it is done)."""
        if not (self._job_running and self._tasks_running and self._tasks) or self.stopping:
            return None
        in_flight = [p.label for p in self._pending.values()] + [q.label for q in self._queue]
        if PERIODIC_SAVEPOINT_LABEL in in_flight:
            return None
        return self.next_periodic_savepoint

    @property
    def next_periodic_savepoint(self) -> float | None:
        """When the next periodic savepoint is due by its interval or schedule (wall clock;
        the next after one in flight): taken then if the job runs with all its tasks, else
        once it does. None without periodic savepoints, before the job first ran with them,
        once it ended, and once the schedule has no later time."""
        last = self._last_periodic_savepoint
        if last is None or self._terminated is not None:
            return None
        if (interval := self._config.savepoint_interval) is not None:
            return last + interval
        schedule = self._config.savepoint_schedule
        return None if schedule is None else schedule.next_after(last)

    @property
    def _periodic_savepoints(self) -> bool:
        config = self._config
        return config.savepoint_interval is not None or config.savepoint_schedule is not None

    # ------------------------------------------------------------------ events

    def handle(self, event: Event) -> list[Effect]:
        effects: list[Effect] = []
        match event:
            case Tick():
                self._on_tick(effects)
            case JobPhaseChanged(phase=phase):
                self._on_phase(phase, effects)
            case TasksReported(tasks=tasks, all_running=all_running):
                self._tasks, self._tasks_running = tasks, all_running
            case StoredIdsReported(highest=highest):
                self._continue_above(highest, effects)
            case TriggerRequested():
                self._on_user_request(event, effects)
            case TriggerWithdrawn(label=label):
                self._withdraw(label, effects)
            case SavepointDisposeRequested(savepoint_id=savepoint_id, label=label):
                self._dispose(savepoint_id, label, effects)
            case SavepointPinChanged(savepoint_id=savepoint_id, pinned=pinned):
                self._pin(savepoint_id, pinned, effects)
            case TaskAcknowledged():
                self._on_ack(event, effects)
            case TaskDeclined(checkpoint_id=checkpoint_id, task=task, message=message):
                self._fail_pending(
                    checkpoint_id, FailureReason.TASK_DECLINED, f"{message} (task {task})", effects
                )
            case SnapshotCaptured(checkpoint_id=checkpoint_id):
                self._captured(checkpoint_id)
            case TriggerDeliveryFailed(checkpoint_id=checkpoint_id, message=message):
                self._fail_pending(checkpoint_id, FailureReason.TRIGGER_FAILURE, message, effects)
            case FinalizationFailed(checkpoint_id=checkpoint_id, message=message):
                self._fail_pending(checkpoint_id, FailureReason.FINALIZE_FAILURE, message, effects)
            case CheckpointFinalized():
                self._on_finalized(event, effects)
            case JobTerminated(outcome=outcome):
                self._on_terminated(outcome, effects)
        self._trigger_periodic_savepoint(effects)
        return _failures_persisted(effects, self.persisted_state)

    def _trigger_periodic_savepoint(self, effects: list[Effect]) -> None:
        """A savepoint labelled `PERIODIC_SAVEPOINT_LABEL` once one is due (after any event:
        the tasks running again may make it so), its time persisted first: a restart
        waits an interval from it, not from the restart."""
        due = self._periodic_savepoint_due()
        now = self._clock()
        if due is None or now < due:
            return
        self._last_periodic_savepoint = now
        effects.append(PersistState(self.persisted_state))
        request = self._new_request(
            CheckpointKind.SAVEPOINT,
            RequestOrigin.USER,
            forced=True,
            label=PERIODIC_SAVEPOINT_LABEL,
        )
        self._submit(request, effects)
        self._run_queue(effects)

    def _dispose(self, savepoint_id: int, label: str, effects: list[Effect]) -> None:
        # Whoever asked checked first (`why_not_disposable`) and told the user; this is
        # what keeps the rule when that changed since (a second request, say).
        if self.persisted_state.why_not_disposable(savepoint_id, self._unrestorable) is not None:
            return
        disposed = self._savepoints.remove(savepoint_id)
        assert disposed is not None
        effects.append(PersistState(self.persisted_state))
        effects.append(DiscardSavepoint(disposed, label))

    def _pin(self, savepoint_id: int, pinned: bool, effects: list[Effect]) -> None:
        if self._savepoints.pinned(savepoint_id) in (None, pinned):
            return  # as asked already, or not registered (disposed of meanwhile)
        dropped = self._savepoints.pin(savepoint_id, pinned, self._clock())
        effects.append(PersistState(self.persisted_state))
        effects.extend(DiscardSavepoint(s) for s in dropped)

    def _continue_above(self, highest: int, effects: list[Effect]) -> None:
        if highest < self._next_id or highest + self._id_block >= MAX_COUNT:
            # Below the counter already; or a directory name no registry's counter reaches
            # (made by hand), whose id a persisted counter could not hold.
            return
        self._next_id = highest + 1
        if self._next_id > self._reserved_until:
            # Reserved (the block starts at the next trigger): a coordinator replacing this
            # one continues from here, and a restarted one starts no lower.
            self._reserved_until = self._next_id
            effects.append(PersistState(self.persisted_state))

    def _on_tick(self, effects: list[Effect]) -> None:
        now = self._timer()
        # Stops first: a checkpoint expiring with a failing stop-with-savepoint is counted,
        # as one after it; the others in trigger order, which is id order.
        in_order = sorted(self._pending.values(), key=lambda p: p.after is AfterCompletion.CONTINUE)
        for pending in in_order:
            if pending.deadline is not None and pending.deadline <= now:
                if pending.finalizing:
                    # Every task acknowledged: what outlasted the timeout is the agent's
                    # `_metadata` write (Flink's FINALIZE_CHECKPOINT_FAILURE).
                    late = "not written within the checkpoint's timeout"
                    self._abort(pending, FailureReason.FINALIZE_FAILURE, late, effects)
                else:
                    self._abort(pending, FailureReason.EXPIRED, "", effects)
        expired_savepoints = self._savepoints.expire(self._clock())
        if expired_savepoints:
            effects.append(PersistState(self.persisted_state))
            effects.extend(DiscardSavepoint(s) for s in expired_savepoints)
        if self._next_periodic_at is not None and self._next_periodic_at <= now:
            assert self._config.interval is not None
            missed = (now - self._next_periodic_at) // self._config.interval
            self._next_periodic_at += (missed + 1) * self._config.interval
            self._submit(
                self._new_request(CheckpointKind.CHECKPOINT, RequestOrigin.PERIODIC), effects
            )
        self._run_queue(effects)

    def _on_phase(self, phase: JobPhase, effects: list[Effect]) -> None:
        self._job_running = phase is JobPhase.RUNNING
        if (
            self._job_running
            and self._periodic_savepoints
            and self._last_periodic_savepoint is None
        ):
            # The first periodic savepoint is an interval after the job first ran (or the
            # schedule's first time after it).
            self._last_periodic_savepoint = self._clock()
            effects.append(PersistState(self.persisted_state))
        if self._job_running:
            if self._next_periodic_at is None:
                self._start_scheduler()
        else:
            self._stop_scheduler(FailureReason.COORDINATOR_SUSPEND, effects)

    def _start_scheduler(self) -> None:
        if self._terminated is not None or self._config.interval is None or self.stopping:
            return
        delay = self._rng.uniform(self._config.min_pause, self._config.interval)
        self._next_periodic_at = self._timer() + delay

    @property
    def stopping(self) -> bool:
        """A stop-with-savepoint is pending: the query stops once it completes."""
        return any(p.after is not AfterCompletion.CONTINUE for p in self._pending.values())

    def _hold_periodic(self, effects: list[Effect]) -> None:
        """Flink's stop-with-savepoint stops the periodic scheduler before it triggers: a
        checkpoint triggered after the stopping savepoint spends an id only to be aborted
        when the query stops."""
        self._next_periodic_at = None
        for request in self._queue.drain_periodic():
            effects.append(RequestDeclined(request, FailureReason.PERIODIC_SCHEDULER_SHUTDOWN))

    def _stop_scheduler(self, reason: FailureReason, effects: list[Effect]) -> None:
        self._next_periodic_at = None
        for request in self._queue.drain():
            declined_for = (
                FailureReason.PERIODIC_SCHEDULER_SHUTDOWN if request.is_periodic else reason
            )
            effects.append(RequestDeclined(request, declined_for))
        for pending in list(self._pending.values()):
            self._abort(pending, reason, "", effects)
        self._consecutive_failures = 0

    def _withdraw(self, label: str, effects: list[Effect]) -> None:
        for request in self._queue.drain_labelled(label):
            effects.append(RequestDeclined(request, FailureReason.WITHDRAWN))
        for pending in list(self._pending.values()):
            if pending.label == label:
                self._abort(pending, FailureReason.WITHDRAWN, "", effects)
        # As after every abort: a request queued behind the withdrawn ones takes its slot now,
        # not at whatever event comes next.
        self._run_queue(effects)

    def _on_user_request(self, event: TriggerRequested, effects: list[Effect]) -> None:
        forced = (
            event.forced if event.forced is not None else (event.kind is CheckpointKind.SAVEPOINT)
        )
        request = self._new_request(
            event.kind,
            RequestOrigin.USER,
            forced=forced,
            after=event.after,
            label=event.label,
            pinned=event.pinned and event.kind is CheckpointKind.SAVEPOINT,
        )
        self._submit(request, effects)
        self._run_queue(effects)

    def _new_request(
        self,
        kind: CheckpointKind,
        origin: RequestOrigin,
        *,
        forced: bool = False,
        after: AfterCompletion = AfterCompletion.CONTINUE,
        label: str = "",
        pinned: bool = False,
    ) -> TriggerRequest:
        return TriggerRequest(
            kind=kind,
            origin=origin,
            requested_at=self._timer(),
            forced=forced,
            after=after,
            label=label,
            pinned=pinned,
        )

    def _submit(self, request: TriggerRequest, effects: list[Effect]) -> None:
        if self._terminated is not None:
            effects.append(RequestDeclined(request, FailureReason.COORDINATOR_SHUTDOWN))
        else:
            rejected = self._queue.offer(request)
            if rejected is not None:
                effects.append(
                    RequestDeclined(rejected, FailureReason.TOO_MANY_CHECKPOINT_REQUESTS)
                )

    def _run_queue(self, effects: list[Effect]) -> None:
        """Trigger queued requests while slots allow (Flink's chooseRequestToExecute)."""
        while (first := self._queue.peek()) is not None:
            if len(self._pending) >= self._config.max_concurrent and not first.forced:
                return
            if first.is_periodic and not first.forced:
                earliest = self._earliest_unforced_trigger()
                if earliest > self._timer():
                    self._queue.pop()
                    effects.append(
                        RequestDeclined(first, FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
                    )
                    self._next_periodic_at = earliest
                    continue
            self._trigger(self._queue.pop(), effects)

    def _earliest_unforced_trigger(self) -> float:
        if self._last_completion_time is None:
            return float("-inf")
        return self._last_completion_time + self._config.min_pause

    def _trigger(self, request: TriggerRequest, effects: list[Effect]) -> None:
        if not (self._job_running and self._tasks and self._tasks_running):
            effects.append(RequestDeclined(request, FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING))
            return
        now = self._clock()
        checkpoint_id = self._next_id
        self._next_id += 1
        reserving = checkpoint_id >= self._reserved_until
        if reserving:
            self._reserved_until = checkpoint_id + self._id_block
        self._pending[checkpoint_id] = PendingCheckpoint(
            checkpoint_id=checkpoint_id,
            kind=request.kind,
            origin=request.origin,
            after=request.after,
            forced=request.forced,
            label=request.label,
            pinned=request.pinned,
            trigger_time=now,
            # A drain first waits for the input to run out, however long that takes.
            deadline=None
            if request.after is AfterCompletion.DRAIN
            else self._timer() + self._config.timeout,
            expected_tasks=self._tasks,
        )
        if request.after is not AfterCompletion.CONTINUE:
            self._hold_periodic(effects)
        if reserving:
            # The id is spent only once it is durable: a restarted coordinator never reuses it.
            effects.append(PersistState(self.persisted_state))
        effects.append(
            TriggerCheckpoint(
                checkpoint_id=checkpoint_id,
                kind=request.kind,
                after=request.after,
                trigger_time=now,
                expected_tasks=self._tasks,
            )
        )

    def _captured(self, checkpoint_id: int) -> None:
        """A drain's image is taken (or acknowledged, which says as much): the savepoint
        counts from now, its timeout and its trigger time (the wait for the input to run out
        is no part of its duration), as the agent's ``_metadata`` does."""
        pending = self._pending.get(checkpoint_id)
        if pending is not None and pending.deadline is None:
            pending.trigger_time = self._clock()
            pending.deadline = self._timer() + self._config.timeout

    def _on_ack(self, event: TaskAcknowledged, effects: list[Effect]) -> None:
        self._captured(event.checkpoint_id)
        pending = self._pending.get(event.checkpoint_id)
        # Nothing answers a late, unknown or duplicate ack (Flink answers so that the job
        # manager discards the task's state): the agent owns the files, it was told of
        # every abort, and what no registered image lists is garbage-collected.
        if pending is None or not pending.acknowledge(event.ack):
            return
        if len(pending.batch_ids) > 1:
            batches = ", ".join(str(b) for b in sorted(pending.batch_ids))
            self._abort(
                pending,
                FailureReason.INCONSISTENT_ACKNOWLEDGEMENTS,
                f"batches {batches}",
                effects,
            )
            self._run_queue(effects)
        elif pending.fully_acknowledged:
            pending.finalizing = True
            (batch_id,) = pending.batch_ids
            effects.append(
                FinalizeCheckpoint(
                    checkpoint_id=pending.checkpoint_id,
                    kind=pending.kind,
                    batch_id=batch_id,
                    tasks=pending.expected_tasks,
                )
            )

    def _on_finalized(self, event: CheckpointFinalized, effects: list[Effect]) -> None:
        pending = self._pending.get(event.checkpoint_id)
        if pending is None or not pending.finalizing:
            # Finalized after an abort: the AbortCheckpoint effect already told the job to
            # drop that image, and an unregistered image is never restored from.
            return
        now = self._clock()
        del self._pending[pending.checkpoint_id]
        (batch_id,) = pending.batch_ids
        completed = CompletedCheckpoint(
            checkpoint_id=pending.checkpoint_id,
            kind=pending.kind,
            batch_id=batch_id,
            path=event.path,
            size_bytes=event.size_bytes,
            trigger_time=pending.trigger_time,
            completion_time=now,
            label=pending.label,
            pinned=pending.pinned,
        )
        self._last_completion_time = self._timer()
        self._completed_count += 1
        self._history.append(
            CheckpointOutcome(
                checkpoint_id=completed.checkpoint_id,
                kind=completed.kind,
                status=OutcomeStatus.COMPLETED,
                trigger_time=completed.trigger_time,
                end_time=now,
                batch_id=batch_id,
                size_bytes=event.size_bytes,
                label=pending.label,
            )
        )
        subsumed: list[CompletedCheckpoint] = []
        dropped_savepoints: list[CompletedCheckpoint] = []
        # A completed image newer than the last shows the job can checkpoint again (Flink's
        # handleCheckpointSuccess); an older one, a savepoint that outlasted a newer
        # checkpoint, says nothing of the failures since that checkpoint.
        if completed.checkpoint_id > self._last_completed_id:
            self._consecutive_failures = 0
            self._last_completed_id = completed.checkpoint_id
        if completed.kind is CheckpointKind.CHECKPOINT:
            subsumed = self._store.add(completed)
        else:
            dropped_savepoints = self._savepoints.add(completed, now)
        # Crash-consistency order: registry, then sinks, then discards.
        effects.append(PersistState(self.persisted_state))
        sinks_may_commit = (
            completed.kind is CheckpointKind.CHECKPOINT
            or pending.after is not AfterCompletion.CONTINUE
        )
        effects.append(NotifyCheckpointComplete(completed, sinks_may_commit))
        retained = self._retained_ids()
        effects.extend(DiscardCheckpoint(c.checkpoint_id, retained) for c in subsumed)
        effects.extend(DiscardSavepoint(s) for s in dropped_savepoints)
        if completed.kind is CheckpointKind.CHECKPOINT:
            older = [
                p
                for p in self._pending.values()
                if p.kind is CheckpointKind.CHECKPOINT and p.checkpoint_id < completed.checkpoint_id
            ]
            for stale in older:
                self._abort(
                    stale,
                    FailureReason.SUBSUMED,
                    f"by checkpoint {completed.checkpoint_id}",
                    effects,
                )
        self._run_queue(effects)

    def _fail_pending(
        self, checkpoint_id: int, reason: FailureReason, message: str, effects: list[Effect]
    ) -> None:
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            return
        self._abort(pending, reason, message, effects)
        self._run_queue(effects)

    def _abort(
        self,
        pending: PendingCheckpoint,
        reason: FailureReason,
        message: str,
        effects: list[Effect],
    ) -> None:
        del self._pending[pending.checkpoint_id]
        message = shortened(message)
        now = self._clock()
        self._failed_count += 1
        self._history.append(
            CheckpointOutcome(
                checkpoint_id=pending.checkpoint_id,
                kind=pending.kind,
                status=OutcomeStatus.FAILED,
                trigger_time=pending.trigger_time,
                end_time=now,
                reason=reason,
                message=message,
                label=pending.label,
            )
        )
        detail = f"{reason.description}: {message}" if message else reason.description
        effects.append(
            AbortCheckpoint(pending.checkpoint_id, pending.kind, reason, detail, pending.label)
        )
        self._count_failure(pending, reason, detail, effects)
        stop_failed = pending.after is not AfterCompletion.CONTINUE and self._job_running
        if stop_failed and self._next_periodic_at is None:
            self._start_scheduler()  # the job runs on

    def _count_failure(
        self,
        pending: PendingCheckpoint,
        reason: FailureReason,
        detail: str,
        effects: list[Effect],
    ) -> None:
        """Modelled on Flink's CheckpointFailureManager: only checkpoint failures of the
        kinds that say the job cannot checkpoint count, and not those of a checkpoint older
        than the last completed image. Unlike Flink, no savepoint failure counts, nor a
        checkpoint's while a stop-with-savepoint is pending (docs/coordinator.md)."""
        if pending.kind is not CheckpointKind.CHECKPOINT:
            return
        if not reason.counts_toward_tolerable_failures:
            return
        if pending.checkpoint_id < self._last_completed_id:
            return
        if self.stopping:
            # Flink's stop-with-savepoint aborts pending checkpoints uncounted; here they
            # may still complete (one covering a bounded job's end finishes it), but one
            # that fails beside the stop (expired during a long drain) fails no job.
            return
        self._consecutive_failures += 1
        if self._consecutive_failures > self._config.tolerable_failures:
            effects.append(
                FailJob(
                    f"{self._consecutive_failures} consecutive checkpoint failures exceed "
                    f"tolerableFailures={self._config.tolerable_failures}; "
                    f"last: checkpoint {pending.checkpoint_id}: {detail}"
                )
            )
            # As Flink's failover stops the scheduler: a checkpoint triggered before the
            # driver leaves Running would only be aborted then, and counted as failed.
            # The next Running phase starts it again.
            self._hold_periodic(effects)

    def _on_terminated(self, outcome: TerminalOutcome, effects: list[Effect]) -> None:
        if self._terminated is not None:
            return
        self._terminated = outcome  # first: nothing the shutdown aborts restarts the scheduler
        self._stop_scheduler(FailureReason.COORDINATOR_SHUTDOWN, effects)
        discarded = (
            self._store.remove_all() if self._config.retention_policy.discards_on(outcome) else []
        )
        effects.append(PersistState(self.persisted_state))
        effects.extend(DiscardCheckpoint(c.checkpoint_id, ()) for c in discarded)

    def _retained_ids(self) -> tuple[int, ...]:
        return tuple(c.checkpoint_id for c in self._store.checkpoints)


def _failures_persisted(effects: list[Effect], state: PersistedState) -> list[Effect]:
    """`effects`, ending with a PersistState of `state` if a checkpoint was aborted after
    the last one: a failure is part of the persisted history (the status' counts and
    history show it), once per event however many checkpoints it aborted."""
    aborted = [i for i, effect in enumerate(effects) if isinstance(effect, AbortCheckpoint)]
    persisted = [i for i, effect in enumerate(effects) if isinstance(effect, PersistState)]
    if aborted and (not persisted or persisted[-1] < aborted[-1]):
        effects.append(PersistState(state))
    return effects
