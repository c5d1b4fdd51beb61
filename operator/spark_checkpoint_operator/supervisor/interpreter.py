"""Carries out the coordinator's effects, and owns what the coordinator is told.

Effects are carried out from one queue, in the order the coordinator produced them. An
effect whose outcome is an event for the coordinator (a finalized checkpoint, a refused
trigger, a phase change) feeds it back with `handle`: its effects join the end of the same
queue, after the effects queued already, instead of running inside the effect that caused
them. Every coordinator decision happens when its event arrives; only carrying it out
waits its turn.

The job's phase is kept in one place, the record; the coordinator is told the phase it
derives from the record and the attempt (`coordinator_phase`), and only by this class.
"""

import asyncio
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol, assert_never

from spark_checkpoint.protocol import RestoreCandidate
from spark_checkpoint.storage.layout import JobStorageLayout, storage_place
from spark_checkpoint_operator.agent_client import (
    AgentAnswerTimedOut,
    AgentClient,
    AgentRejected,
    AgentUnavailable,
)
from spark_checkpoint_operator.coordinator import (
    AbortCheckpoint,
    AfterCompletion,
    CheckpointCoordinator,
    CheckpointFinalized,
    CheckpointKind,
    CompletedCheckpoint,
    DiscardCheckpoint,
    DiscardSavepoint,
    Effect,
    Event,
    FailJob,
    FailureReason,
    FinalizationFailed,
    FinalizeCheckpoint,
    JobPhase,
    JobPhaseChanged,
    JobTerminated,
    NotifyCheckpointComplete,
    PersistState,
    RequestDeclined,
    RequestOrigin,
    SavepointDisposeRequested,
    TerminalOutcome,
    TriggerCheckpoint,
    TriggerDeliveryFailed,
    TriggerRequest,
    TriggerRequested,
    shortened,
)
from spark_checkpoint_operator.coordinator.state import format_time
from spark_checkpoint_operator.status import DiscardDue
from spark_checkpoint_operator.supervisor.attempt import Attempt
from spark_checkpoint_operator.supervisor.notices import (
    Level,
    completion_reason,
    describe_completion,
)
from spark_checkpoint_operator.supervisor.ports import (
    JANITOR_TIMEOUT_SECONDS,
    SLOW_CLEANUP_SECONDS,
    CleanupFailed,
    Janitor,
    Observer,
)
from spark_checkpoint_operator.supervisor.record import JobRecord

# The label of the last image of a job: bounded input's final checkpoint, a deleted job's
# final savepoint.
FINAL_LABEL = "final"


class Notify(Protocol):
    def __call__(
        self,
        reason: str,
        level: Level,
        message: str,
        *,
        label: str = "",
        image: str = "",
        cause: FailureReason | None = None,
    ) -> None: ...


class JobControl(Protocol):
    """What effects may ask of the job beyond its driver (the supervisor)."""

    @property
    def deleting(self) -> bool: ...

    def cancel(self) -> None: ...

    def end_suspended(self) -> None:
        """The driver is stopped from here (after its stop-with-savepoint completed): the
        job ends Suspended."""

    def check_restorable(self, image: str) -> None:
        """``image`` was registered: check it in the background (verifyRestorable)."""

    @property
    def heartbeat_timeout(self) -> float:
        """How long its agent may be silent before its driver is taken for hung."""

    @property
    def stopping(self) -> bool:
        """The job was asked to stop (suspend, cancel or delete)."""

    @property
    def cancelling(self) -> bool:
        """The job was cancelled (`cancel`, a second Ctrl-C), not deleted or suspended."""


# The discards kept due (`_set_due`); beyond them the oldest go: a checkpoint's to garbage
# collection, which removes unregistered checkpoints; a savepoint's is said (it is kept).
CHECKPOINT_DISCARDS_KEPT = 10
SAVEPOINT_DISCARDS_KEPT = 100
# The refusals after which a round of discards due ends (`discard_due`).
REFUSALS_PER_ROUND = 3


class EffectInterpreter:
    """The coordinator of one job, the queue of its effects, and what carries them out
    (the running attempt's agent, else the janitor)."""

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        *,
        record: JobRecord,
        janitor: Janitor,
        observer: Observer,
        notify: Notify,
        save: Callable[[JobRecord], Awaitable[None]],
        job: JobControl,
        storage: JobStorageLayout,
    ) -> None:
        self._coordinator = coordinator
        self._storage = storage
        self._record = record
        self._janitor = janitor
        self._observer = observer
        self._notify = notify
        self._save = save
        self._job = job
        self._queue: deque[Effect] = deque()
        self._carrying_out = False
        # The janitor failed a discard among the effects being carried out: the others
        # stay due rather than start a cleanup pod each that fails as well.
        self._janitor_failed = False
        # The running attempt; None between drivers.
        self.attempt: Attempt | None = None
        # The janitor's work under way (`clean_up`), and whether a cancellation stopped it.
        self._cleaning: asyncio.Future[None] | None = None
        self._cleanup_cut_short = False
        # Stop-with-savepoints triggered: the query stops once one completes.
        self._stopping_savepoints: set[int] = set()

    @property
    def coordinator(self) -> CheckpointCoordinator:
        """For its queries; events go through `handle`."""
        return self._coordinator

    # ------------------------------------------------------------------ events and phases

    async def handle(self, event: Event) -> list[Effect]:
        """Feed ``event`` to the coordinator and carry out its effects, which are returned.
        Fed back while effects are being carried out, its effects are queued after those
        (and carried out once this returns)."""
        refused = (
            self._coordinator.persisted_state.why_not_disposable(
                event.savepoint_id, self._record.is_unrestorable
            )
            if isinstance(event, SavepointDisposeRequested)
            else None
        )
        effects = self._coordinator.handle(event)
        if isinstance(event, SavepointDisposeRequested) and refused is not None:
            # Disposed of meanwhile (a second request), or newest by now: told, or its
            # request would wait out its timeout.
            self._notify("SavepointNotDisposed", Level.DETAIL, refused, label=event.label)
        self._queue.extend(effects)
        await self.carry_out_queued()
        return effects

    def replace(
        self, coordinator: CheckpointCoordinator, requests: Sequence[TriggerRequested] = ()
    ) -> None:
        """Continue with ``coordinator`` (new settings), told the current phase and the
        tasks the one it replaces knew, then given ``requests``. Its effects are queued;
        `carry_out_queued` (or the next event) carries them out."""
        tasks = self._coordinator.tasks_reported
        self._coordinator = coordinator
        self._queue.extend(coordinator.handle(tasks))
        self._queue.extend(coordinator.handle(JobPhaseChanged(self.coordinator_phase())))
        for request in requests:
            self._queue.extend(coordinator.handle(request))
        if coordinator.next_periodic_savepoint != self._record.next_periodic_savepoint:
            # Status shows when the new settings take the next periodic savepoint.
            self._queue.append(PersistState(coordinator.persisted_state))

    async def carry_out_queued(self) -> None:
        if self._carrying_out:
            return  # fed back by an effect: the loop below reaches its effects in turn
        self._carrying_out = True
        self._janitor_failed = False
        try:
            while self._queue:
                await self._carry_out(self._queue.popleft())
        except BaseException:
            # The effects stop at the first that fails (the order is the crash-consistency
            # protocol): what follows it is never carried out.
            self._queue.clear()
            raise
        finally:
            self._carrying_out = False

    def coordinator_phase(self) -> JobPhase:
        """The phase the coordinator acts on: the job's, except that without a driver,
        or with one exiting after its final checkpoint, nothing is to be triggered."""
        if self.attempt is None:
            return JobPhase.RESTARTING
        if self.attempt.finishing:
            return JobPhase.FINISHED
        return self._record.phase

    async def enter(self, phase: JobPhase) -> None:
        """The job is in ``phase`` now (not a terminal one: see `end`): stored, then the
        coordinator is told."""
        self._record.phase = phase
        if phase is not JobPhase.RUNNING:
            self._record.checkpoints_skipped = None  # what is skipped now is no news
        await self.persist()
        await self.tell_phase()

    async def tell_phase(self) -> None:
        """The attempt changed what the coordinator acts on (`coordinator_phase`)."""
        await self.handle(JobPhaseChanged(self.coordinator_phase()))

    async def end(self, outcome: TerminalOutcome) -> None:
        """The job terminated: the phase is stored with the termination, before any
        cleanup (which may take minutes), so a restarted runtime never runs it again."""
        self._record.phase = JobPhase(outcome.value)
        self._record.checkpoints_skipped = None  # an ended job skips nothing
        await self.handle(JobTerminated(outcome))

    async def agent_lost(self) -> None:
        """The driver process is there but its agent does not answer (starting, stopping,
        or dying): the job is not Running, so nothing is triggered and pending checkpoints
        are aborted without counting as failures (Flink's deactivator). A finishing driver
        stops answering as it exits: it is no restart (its job showed Deploying, "Spark is
        starting", and a Ctrl-C then took it for a query not running yet), and nothing is
        triggered for it anyway."""
        finishing = self.attempt is not None and self.attempt.finishing
        if self._record.phase is JobPhase.RUNNING and not finishing:
            await self.enter(JobPhase.DEPLOYING)

    async def persist(self) -> None:
        coordinator = self._coordinator
        self._write_ahead()  # any state write may let go of images whose discards are queued
        self._record.coordinator = coordinator.persisted_state
        self._record.consecutive_failures = coordinator.consecutive_failures
        self._record.next_checkpoint_id = coordinator.next_checkpoint_id
        self._record.next_periodic_savepoint = coordinator.next_periodic_savepoint
        self._refresh_pending()
        await self._save(self._record)

    def _refresh_pending(self) -> None:
        self._record.pending = [
            {
                "id": p.checkpoint_id,
                "kind": p.kind.value,
                "acknowledged": p.acknowledged,
                "expected": p.expected,
                **({"label": p.label} if p.label else {}),
            }
            for p in self._coordinator.pending
        ]

    # ------------------------------------------------------------------ effects

    async def _carry_out(self, effect: Effect) -> None:
        attempt = self.attempt
        match effect:
            case PersistState():
                await self.persist()
            case TriggerCheckpoint():
                # Kept current without a state write: a coordinator that replaces this one
                # in this process continues from it (see JobRecord.next_checkpoint_id), and
                # the local controls show what is in progress (a savepoint's id).
                self._record.next_checkpoint_id = self._coordinator.next_checkpoint_id
                self._refresh_pending()
                if self._record.checkpoints_skipped is not None:
                    self._record.checkpoints_skipped = None
                    await self.persist()  # healthy again now, not once this one completes
                await self._trigger(attempt, effect)
                if self._requested(effect.checkpoint_id):
                    # Status shows it in flight: someone waits for it (a savepoint, a
                    # nonce's checkpoint, the final one), and a drain may wait for its
                    # input for hours. Periodic ones take no status write of their own.
                    await self.persist()
            case FinalizeCheckpoint(checkpoint_id=cid, kind=kind, tasks=tasks):
                await self._finalize(attempt, cid, kind, sorted(tasks))
            case NotifyCheckpointComplete(checkpoint=completed, sinks_may_commit=commit):
                await self._completed(attempt, completed, commit)
            case AbortCheckpoint(checkpoint_id=cid, kind=kind, reason=reason, message=message):
                self._observer.failed(kind, reason.value)
                self._report_abort(attempt, effect)
                if attempt is not None:
                    await self.abort(attempt, cid, message)
                if self._job.deleting and cid in self._stopping_savepoints:
                    self._job.cancel()  # no final savepoint: the job is deleted without one
                self._stopping_savepoints.discard(cid)
            case DiscardCheckpoint(checkpoint_id=cid, retained=retained):
                await self._discard(
                    DiscardDue(CheckpointKind.CHECKPOINT, cid), attempt, list(retained)
                )
            case DiscardSavepoint(savepoint=savepoint, label=label):
                sid = savepoint.checkpoint_id
                # Savepoints are the user's: deleting one is news, never a detail.
                self._notify(
                    "SavepointDiscarded",
                    Level.NOTE,
                    f"deleting savepoint {sid} (batch {savepoint.batch_id}): "
                    + (f"disposed of ({label})" if label else self._why_trimmed(sid)),
                )
                discard = DiscardDue(CheckpointKind.SAVEPOINT, sid)
                await self._discard(discard, attempt, [])
                if label:
                    self._notify_disposed(discard, label)
            case RequestDeclined(request=request, reason=reason):
                if self._job.deleting and request.after is not AfterCompletion.CONTINUE:
                    self._job.cancel()
                if not request.is_periodic:
                    self._report_declined(attempt, request, reason)
                elif reason is FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING:
                    await self._skipped(reason)
            case FailJob(message=message):
                # Flink's "fail the job" is a failover: the restart policy decides.
                self._notify(
                    "FailingJob",
                    Level.WARNING,
                    f"failing the driver: {message}; restartPolicy decides what follows",
                )
                if attempt is not None and attempt.fail(message):
                    await attempt.driver.terminate()
            case _:
                # Every effect is carried out: a new one fails the type check here.
                assert_never(effect)

    def _requested(self, checkpoint_id: int) -> bool:
        """Whether the pending checkpoint was asked for, not periodic."""
        return any(
            p.checkpoint_id == checkpoint_id and p.origin is RequestOrigin.USER
            for p in self._coordinator.pending
        )

    async def _trigger(self, attempt: Attempt | None, effect: TriggerCheckpoint) -> None:
        if attempt is None or self._record.phase is not JobPhase.RUNNING or attempt.failing:
            # The agent was lost meanwhile (the coordinator aborted it), or the driver is
            # being failed: its stop aborts it.
            return
        cid, kind, after = effect.checkpoint_id, effect.kind, effect.after
        self._notify("CheckpointTriggered", Level.DETAIL, f"trigger {kind.value} {cid}")
        if after is not AfterCompletion.CONTINUE:
            self._stopping_savepoints.add(cid)
        agent = attempt.driver.agent
        sent = time.time()
        try:
            await agent.trigger(cid, kind, after)
        except AgentUnavailable:
            await self.agent_lost()
        except AgentRejected as error:
            await self.handle(TriggerDeliveryFailed(cid, str(error)))
        finally:
            self._observer.trigger_sent(cid, agent, sent, time.time())

    async def _finalize(
        self, attempt: Attempt | None, cid: int, kind: CheckpointKind, tasks: list[str]
    ) -> None:
        if attempt is None:
            return
        pending = next((p for p in self._coordinator.pending if p.checkpoint_id == cid), None)
        deadline = None if pending is None else pending.deadline
        time_left = 0.0 if deadline is None else deadline - time.monotonic()
        try:
            finalized = await attempt.driver.agent.finalize(
                cid, tasks, waits=min(time_left, self._job.heartbeat_timeout)
            )
        except AgentAnswerTimedOut as error:
            # Busy writing (storage slower than the checkpoint's time left) or hung: the
            # checkpoint fails, counted; the abort takes back what the agent writes after.
            await self.handle(FinalizationFailed(cid, str(error)))
        except AgentUnavailable:
            await self.agent_lost()
        except AgentRejected as error:
            await self.handle(FinalizationFailed(cid, str(error)))
        else:
            # The driver runs the user's code: status shows the image's path and users
            # restore from it, so it must be this image's in the job's storage. A running
            # driver may spell the storage as the spec did before (`storage_place`).
            path = self._storage.metadata_path(kind, cid)
            if storage_place(finalized.path) != storage_place(path):
                reason = f"the agent named {finalized.path!r} as its _metadata, not {path!r}"
                await self.handle(FinalizationFailed(cid, reason))
            else:
                await self.handle(CheckpointFinalized(cid, finalized.path, finalized.size_bytes))

    async def _completed(
        self, attempt: Attempt | None, completed: CompletedCheckpoint, sinks_may_commit: bool
    ) -> None:
        image = RestoreCandidate.registered(completed.kind, completed.checkpoint_id).encode()
        if attempt is not None:
            attempt.completed.append(image)
            if self._record.restarts:
                # It made progress: the restarts in a row that a runtime restarted later
                # goes on from are over (this one's count for failing checkpoints is its
                # own). Written now: the completion's own write came before.
                self._record.restarts = 0
                await self.persist()
        self._job.check_restorable(image)
        self._observer.completed(completed)
        self._notify(
            completion_reason(completed),
            # A checkpoint someone asked for (a nonce, a snapshot object, the final one) is
            # news as a savepoint is; periodic ones are routine.
            Level.NOTE
            if completed.kind is CheckpointKind.SAVEPOINT or completed.label
            else Level.DETAIL,
            f"{describe_completion(completed)} (query at batch {self._record.last_batch})",
        )
        if completed.checkpoint_id in self._stopping_savepoints:
            # The agent stops the query now: nothing more is triggered.
            if attempt is not None:
                attempt.suspend(completed)
            await self.enter(JobPhase.SUSPENDING)
        if sinks_may_commit and attempt is not None:
            # A savepoint the job continues after is done once its metadata is written;
            # the agent hears nothing more of it (docs/coordinator.md).
            await self.notify_complete(attempt, completed)
        if attempt is not None and not attempt.leaving:
            await self.discard_due(attempt)
        self._stopping_savepoints.discard(completed.checkpoint_id)  # a job runs for months

    async def notify_complete(self, attempt: Attempt, completed: CompletedCheckpoint) -> None:
        """Tell the driver that sinks may commit up to ``completed``. A lost notification
        is recovered on restore: sinks commit what the restored, registered image covers
        before the query starts."""
        end = attempt.input_exhausted_at
        covers_the_end = end is not None and completed.batch_id >= end
        final = completed.kind is CheckpointKind.CHECKPOINT and not self._coordinator.stopping
        if covers_the_end and final and attempt.finish():
            # The driver exits once told: nothing more is triggered, and what the exit cuts
            # short is no failure. While a stop-with-savepoint is in flight it waits for
            # that, and stops once it completes.
            await self.tell_phase()
        try:
            await attempt.driver.agent.complete(completed.checkpoint_id, completed.batch_id)
            attempt.told_batch = max(completed.batch_id, attempt.told_batch or completed.batch_id)
        except (AgentUnavailable, AgentRejected) as error:
            resent = covers_the_end and attempt.final_completion_refused_at is not None
            if covers_the_end:
                # The driver waits for it to exit: sent again (`Attempt.final_completion_due`),
                # unless its answer timed out: under way (a slow sink's commit), it would run
                # beside itself. The driver exits once it is done, or is stopped as overdue.
                timed_out = isinstance(error, AgentAnswerTimedOut)
                attempt.final_completion_refused_at = None if timed_out else time.monotonic()
            told = attempt.told_batch
            # A job cancelled or deleted kills its driver anyway, and its retention policy
            # decides whether the image stays: "nothing is lost" is no news, and may be untrue.
            ending = self._job.cancelling or self._job.deleting
            if not resent and not ending and (told is None or completed.batch_id > told):
                # Below that, the driver (which may have exited already, having been told of
                # its last batch) missed nothing its sinks need.
                what = f"{completed.kind.value} {completed.checkpoint_id}"
                self._notify(
                    "CompletionNotDelivered",
                    Level.DETAIL,
                    f"the driver did not confirm the completion of {what} ({error}); nothing "
                    f"is lost: {what} is registered, and sinks commit up to it when a driver "
                    "restores it",
                )
            if completed.checkpoint_id in self._stopping_savepoints:
                # The agent would have stopped the query; the savepoint is registered, so
                # stop the driver from here and end suspended.
                self._job.end_suspended()
                await attempt.driver.terminate()

    async def abort(self, attempt: Attempt, cid: int, message: str) -> None:
        try:
            await attempt.driver.agent.abort(cid, message)
        except (AgentUnavailable, AgentRejected) as error:
            # Nothing to undo: an agent that is still there lists the snapshot in its next
            # report and is told again; files of a dead one are garbage. A driver that
            # finishes or suspends, or a job asked to stop (a second Ctrl-C), ends anyway:
            # no news.
            if attempt.leaving or self._job.stopping:
                return
            self._notify(
                "AbortNotDelivered",
                Level.DETAIL,
                f"the driver did not take the abort of {cid} ({error}); nothing is lost: a "
                "running agent drops it at its next report, and its files are garbage-collected",
            )

    def _write_ahead(self) -> None:
        """The discards queued behind a state write are due from that write on: it lets
        their images go, and an operator restart before they are done does them then (once
        more at worst: a discard of what is gone does nothing)."""
        self._set_due(self._record.discards_due + self._queued_discards())

    def _notify_disposed(self, discard: DiscardDue, label: str) -> None:
        """The answer to the dispose request labelled ``label``: whether the files went."""
        due = next((d for d in self._record.discards_due if d.key == discard.key), None)
        self._notify(
            "SavepointDisposed",
            Level.DETAIL,
            f"{discard.describe()} disposed of: no longer registered, its files deleted"
            if due is None
            else f"{discard.describe()} disposed of: no longer registered; its files are not "
            f"deleted yet ({due.reason or 'the driver is starting or leaving'}): the driver "
            "is asked again after the next completion, or a cleanup does it once none runs",
            label=label,
        )

    def _why_trimmed(self, savepoint_id: int) -> str:
        """Why the savepoint history lets a savepoint go: its age or count, and the ones
        a restore would not take first (the coordinator's rule)."""
        # The limits set, with their values (naming one not set puzzled a newcomer).
        history = self._coordinator.config.savepoint_history
        given = [f"spec.savepoints.historyMaxCount {history.max_count}"]
        if history.max_age_seconds is not None:
            given.append(f"historyMaxAge {history.max_age_seconds:g}s")
        limits = f"({', '.join(given)})"
        image = RestoreCandidate.registered(CheckpointKind.SAVEPOINT, savepoint_id).encode()
        entry = next((e for e in self._record.unrestorable if e.source == image), None)
        if entry is None:
            return f"older than the savepoint history keeps {limits}"
        return (
            f"not restored from again ({entry.reason}): the first to go over the savepoint "
            f"history {limits}"
        )

    def _queued_discards(self) -> list[DiscardDue]:
        queued: list[DiscardDue] = []
        for effect in self._queue:
            match effect:
                case DiscardCheckpoint(checkpoint_id=cid):
                    queued.append(DiscardDue(CheckpointKind.CHECKPOINT, cid))
                case DiscardSavepoint(savepoint=savepoint):
                    queued.append(DiscardDue(CheckpointKind.SAVEPOINT, savepoint.checkpoint_id))
        return queued

    async def _discard(
        self, discard: DiscardDue, attempt: Attempt | None, retained: list[int]
    ) -> None:
        """Storage is changed by the driver's agent while one runs, else by the janitor.
        One not done stays due (`JobRecord.discards_due`, written ahead): asked of the agent
        again after each completion, and done by the janitor once the driver is gone
        (`janitor_discards_due`), never beside it: a driver exiting, hung or cut off may
        still write (storage has one writer per job). One done is forgotten with the next
        status write, not a write of its own."""
        if attempt is None:
            if not self._janitor_failed and await self.clean_up(
                self._through_janitor(discard, retained)
            ):
                self._forget_due([discard])
            else:
                self._janitor_failed = True
                await self._still_due(self._set_with(discard))  # keeps a reason it had
            return
        if not attempt.agent_answered:
            # Its driver restores and starts Spark before its agent listens: asked at its
            # first answer, as any discard due (a refusal now is no news).
            await self._still_due(self._set_with(discard))
            return
        try:
            await self._through_agent(discard, attempt.driver.agent, retained)
        except (AgentUnavailable, AgentRejected) as error:
            # A driver that finishes or suspends exits any moment: its refusal is no news.
            refused = shortened(f"the driver's agent did not take it ({error})")
            reason = None if attempt.leaving else refused
            if discard.kind is CheckpointKind.SAVEPOINT and not attempt.leaving:
                # Its deletion was said (SavepointDiscarded): that it waits is news too
                # (not at a stop: the cleanup after it deletes it, at every suspension).
                self._notify(
                    "SavepointDiscardDelayed",
                    Level.NOTE,
                    f"{discard.describe()} is not deleted yet: {refused}; the driver is asked "
                    "again after the next completion, or a cleanup does it once none runs",
                )
            await self._still_due(self._set_with(replace(discard, reason=reason)))
        else:
            self._forget_due([discard])

    async def discard_due(self, attempt: Attempt) -> None:
        """The discards due (but those still queued), asked of the agent again. What they
        keep is what the registry retains now: checkpoints completed since may share their
        files, and those retained then may be gone. An agent that cannot be reached is not
        asked the rest; one refused stays due, behind the others, and a few refused end the
        round (a storage refusing every delete is not asked each a completion)."""
        done: list[DiscardDue] = []
        refused: list[DiscardDue] = []
        for discard in self._waiting_discards():
            try:
                await self._through_agent(discard, attempt.driver.agent, self._retained())
            except AgentUnavailable:
                break
            except AgentRejected:
                refused.append(discard)
                if len(refused) == REFUSALS_PER_ROUND:
                    break
            else:
                done.append(discard)
        keys = {discard.key for discard in refused}
        due = self._record.discards_due
        self._record.discards_due = [d for d in due if d.key not in keys] + refused
        if done:
            self._forget_due(done)
            await self.persist()

    async def janitor_discards_due(self, *, deleting: bool = False) -> None:
        """No driver runs (its attempt's is gone, or the job ended): the janitor does the
        discards due, until one fails (the rest stay due: its next try is at the next
        driver's exit, the job's end or its deletion). At the deletion, the last chance,
        each is tried, and a savepoint left is said."""
        done: list[DiscardDue] = []
        for discard in self._waiting_discards():
            if not await self.clean_up(self._through_janitor(discard, self._retained())):
                if not deleting:
                    break
                if discard.kind is CheckpointKind.SAVEPOINT:
                    self._notify(
                        "DiscardGivenUp",
                        Level.WARNING,
                        f"{discard.describe()} stays in storage: the job is deleted and its "
                        "discard failed; delete it by hand",
                    )
                continue
            done.append(discard)
            if discard.reason is not None:
                self._notify(
                    "DiscardedByJanitor",
                    Level.DETAIL,
                    f"{discard.describe()} discarded by the janitor: {discard.reason}",
                )
        if done:
            self._forget_due(done)
            await self.persist()

    def _waiting_discards(self) -> list[DiscardDue]:
        """The discards due whose effects are not queued (those come in their turn)."""
        queued = {discard.key for discard in self._queued_discards()}
        return [d for d in self._record.discards_due if d.key not in queued]

    def _set_with(self, discard: DiscardDue) -> list[DiscardDue]:
        """The discards due with `discard`, in place of an entry for its image (whose
        reason it keeps if it has none)."""
        due = self._record.discards_due
        if not any(d.key == discard.key for d in due):
            return [*due, discard]
        return [
            replace(discard, reason=discard.reason or d.reason) if d.key == discard.key else d
            for d in due
        ]

    def _forget_due(self, done: list[DiscardDue]) -> None:
        keys = {discard.key for discard in done}
        self._record.discards_due = [d for d in self._record.discards_due if d.key not in keys]

    async def _still_due(self, discards: list[DiscardDue]) -> None:
        """Stored at once when it changed: an operator restart does what is due."""
        before = self._record.discards_due
        self._set_due(discards)
        if self._record.discards_due != before:
            await self.persist()

    def _set_due(self, discards: list[DiscardDue]) -> None:
        """Each image once (its first entry); within the limits, which count those not
        queued: a storage that refuses every delete would otherwise grow the status for
        ever (past the API server's size limit)."""
        first: dict[tuple[CheckpointKind, int], DiscardDue] = {}
        for discard in discards:
            first.setdefault(discard.key, discard)
        unique = list(first.values())
        queued = {discard.key for discard in self._queued_discards()}
        waiting = [d for d in unique if d.key not in queued]
        checkpoints = [d for d in waiting if d.kind is CheckpointKind.CHECKPOINT]
        savepoints = [d for d in waiting if d.kind is CheckpointKind.SAVEPOINT]
        old_checkpoints = checkpoints[:-CHECKPOINT_DISCARDS_KEPT]
        old_savepoints = savepoints[:-SAVEPOINT_DISCARDS_KEPT]
        for discard in old_checkpoints:
            self._notify(
                "DiscardLeftToGarbageCollection",
                Level.DETAIL,
                f"{discard.describe()} is left to garbage collection (when the next driver "
                f"starts, or the job ends): {CHECKPOINT_DISCARDS_KEPT} newer checkpoint "
                "discards are due",
            )
        for discard in old_savepoints:
            self._notify(
                "DiscardGivenUp",
                Level.WARNING,
                f"{discard.describe()} stays in storage, no longer due for discarding: "
                f"{SAVEPOINT_DISCARDS_KEPT} newer savepoint discards are due "
                f"({discard.reason or 'not done'}); delete it by hand",
            )
        dropped = {discard.key for discard in old_checkpoints + old_savepoints}
        self._record.discards_due = [d for d in unique if d.key not in dropped]

    async def _through_agent(
        self, discard: DiscardDue, agent: AgentClient, retained: list[int]
    ) -> None:
        if discard.kind is CheckpointKind.CHECKPOINT:
            await agent.discard_checkpoint(discard.checkpoint_id, retained)
        else:
            await agent.discard_savepoint(discard.checkpoint_id)

    def _through_janitor(self, discard: DiscardDue, retained: list[int]) -> Awaitable[None]:
        if discard.kind is CheckpointKind.CHECKPOINT:
            return self._janitor.discard_checkpoint(discard.checkpoint_id, retained)
        return self._janitor.discard_savepoint(discard.checkpoint_id)

    def _retained(self) -> list[int]:
        return [c.checkpoint_id for c in self._coordinator.persisted_state.checkpoints]

    async def clean_up(self, work: Awaitable[None]) -> bool:
        """Whether the janitor did it; its failure is reported, and so is its work cut
        short (`cut_cleanup_short`, after which none is started)."""
        if self._cleanup_cut_short:
            if inspect.iscoroutine(work):
                work.close()  # never started
            return False
        cleaning = self._cleaning = asyncio.ensure_future(work)
        slow = asyncio.get_running_loop().call_later(SLOW_CLEANUP_SECONDS, self._cleanup_slow)
        try:
            await cleaning
        except CleanupFailed as error:
            self._notify("CleanupFailed", Level.WARNING, f"storage cleanup failed: {error}")
            return False
        except asyncio.CancelledError:
            # Not the work cut short (`cut_cleanup_short`, the only one that cancels it) but
            # the supervisor itself cancelled: that goes on.
            current = asyncio.current_task()
            if current is None or current.cancelling():
                raise
            self._notify(
                "CleanupFailed",
                Level.WARNING,
                "storage cleanup stopped (`cancel`, a second Ctrl-C): what it left stays in "
                "storage until a run of the job cleans up",
            )
            return False
        finally:
            slow.cancel()
            self._cleaning = None
        return True

    def _cleanup_slow(self) -> None:
        self._notify(
            "CleanupSlow",
            Level.NOTE,
            f"storage cleanup under way for {SLOW_CLEANUP_SECONDS:.0f}s (storage that does "
            f"not answer?); it is given up to {JANITOR_TIMEOUT_SECONDS:.0f}s",
        )

    def cut_cleanup_short(self) -> None:
        """Stop the janitor's work under way, and start no more (a cancellation: storage
        that does not answer must not hold the job's end); what it left is due, or garbage
        to the job's next run."""
        self._cleanup_cut_short = True
        if self._cleaning is not None and not self._cleaning.done():
            self._cleaning.cancel()

    def _report_abort(self, attempt: Attempt | None, abort: AbortCheckpoint) -> None:
        kind, cid, reason, message = abort.kind, abort.checkpoint_id, abort.reason, abort.message
        finishing = attempt is not None and attempt.finishing
        if finishing and reason is FailureReason.COORDINATOR_SUSPEND:
            self._notify(
                "CheckpointNotNeeded",
                Level.DETAIL,
                f"{kind.value} {cid} given up: the input is done and a completed checkpoint "
                "covers its last batch",
                label=abort.label,
            )
        elif reason is FailureReason.COORDINATOR_SUSPEND and (
            self._job.stopping or (attempt is not None and attempt.leaving)
        ):
            # Cancelled, or stopped after its savepoint: no failure of the job's.
            stopped_with = attempt.stopped_with if attempt is not None else None
            why = (
                "cancelled"
                if self._job.cancelling
                else "stopping"
                if stopped_with is None
                else f"stopping with savepoint {stopped_with.checkpoint_id}"
            )
            self._notify(
                "CheckpointNotNeeded",
                Level.DETAIL,
                f"{kind.value} {cid} given up: the job is {why}",
                label=abort.label,
            )
        elif reason in (FailureReason.WITHDRAWN, FailureReason.SUBSUMED):
            # No warning for one a newer checkpoint overtook either (a bounded job's final
            # checkpoint overtaking a periodic one read as a failure); the history counts
            # it, as Flink's statistics do.
            how = "withdrawn" if reason is FailureReason.WITHDRAWN else "given up"
            self._notify(
                "CheckpointNotNeeded",
                Level.DETAIL,
                f"{kind.value} {cid} {how}: {message}",
                label=abort.label,
                cause=reason,  # a snapshot object's overtaken checkpoint is its failure
            )
        else:
            self._notify(
                "CheckpointFailed",
                Level.WARNING,
                f"{kind.value} {cid} failed: {message}",
                label=abort.label,
                cause=reason,
            )

    async def _skipped(self, reason: FailureReason) -> None:
        """A periodic checkpoint was skipped while Running (an executor missing, or tasks
        not running after the query committed a batch): said once per streak, and in status
        until one is triggered, so that a job that runs without checkpoints does not look
        healthy. Not before the first batch commits, which every start waits for."""
        if self._record.checkpoints_skipped is not None or self._record.phase is not (
            JobPhase.RUNNING
        ):
            return
        attempt = self.attempt
        missing = attempt is not None and not attempt.executors_ready
        if not missing and (attempt is None or not attempt.has_batch):
            return  # the query's first batch: every start skips until it commits
        executors = "; an executor is missing" if missing else ""
        message = f"{reason.description}{executors}"
        self._record.checkpoints_skipped = {
            "since": format_time(time.time()),
            "reason": reason.value,
            "message": message,
        }
        self._notify(
            "CheckpointSkipped",
            Level.WARNING,
            f"periodic checkpoint skipped: {message}; checkpoints resume once every task runs",
        )
        await self.persist()

    def _report_declined(
        self, attempt: Attempt | None, request: TriggerRequest, reason: FailureReason
    ) -> None:
        finishing = attempt is not None and attempt.finishing
        if finishing and request.label == FINAL_LABEL:
            self._notify(
                "CheckpointNotNeeded",
                Level.DETAIL,
                "final checkpoint not needed: a completed checkpoint covers the last batch",
            )
        elif reason is FailureReason.WITHDRAWN:
            self._notify(
                "CheckpointNotNeeded",
                Level.DETAIL,
                f"{request.kind.value} request withdrawn: {reason.description}",
                label=request.label,
            )
        else:
            self._notify(
                "RequestDeclined",
                Level.WARNING,
                f"{request.kind.value} request declined: {reason.description}",
                label=request.label,
                cause=reason,
            )
