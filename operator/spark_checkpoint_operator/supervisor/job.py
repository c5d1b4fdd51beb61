"""The attempt loop: drivers one after another, each watched through its agent.

An attempt launches (or adopts) a driver and asks its agent for status until the driver
exits; the status is read as coordinator events (`status_events`) and the coordinator's
effects are carried out by the `EffectInterpreter`. When a driver exits, the restart
policy decides between another attempt and the job's end. The attempt's own state is an
`Attempt` (see `attempt` for its stages).
"""

import asyncio
import dataclasses
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import (
    AgentStatus,
    QueryState,
    RestoreCandidate,
    RestoredFrom,
    SkippedImage,
)
from spark_checkpoint.restore import image_free, query_change
from spark_checkpoint.storage.layout import JobStorageLayout
from spark_checkpoint_operator.agent_client import AgentRejected, AgentUnavailable
from spark_checkpoint_operator.coordinator import (
    AfterCompletion,
    CheckpointCoordinator,
    CheckpointKind,
    CompletedCheckpoint,
    CoordinatorConfig,
    FailureReason,
    JobPhase,
    PersistedState,
    SavepointDisposeRequested,
    SavepointPinChanged,
    TerminalOutcome,
    Tick,
    TriggerCheckpoint,
    TriggerRequested,
    TriggerWithdrawn,
)
from spark_checkpoint_operator.coordinator.state import format_time
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.status import DiscardDue, RestoreChoice, UnrestorableImage
from spark_checkpoint_operator.supervisor import status_events
from spark_checkpoint_operator.supervisor.attempt import (
    STOPPED_DRIVER_EXIT_SECONDS,
    Attempt,
    Stage,
    StopRequest,
)
from spark_checkpoint_operator.supervisor.driver_errors import passes, same_error
from spark_checkpoint_operator.supervisor.interpreter import FINAL_LABEL, EffectInterpreter
from spark_checkpoint_operator.supervisor.notices import (
    Level,
    Notice,
    describe_exit,
    describe_garbage,
    error_lines,
    log_notice,
)
from spark_checkpoint_operator.supervisor.polling import POLL_INTERVAL, Answer, Message, StatusPolls
from spark_checkpoint_operator.supervisor.ports import (
    CheckUnavailable,
    DriverHandle,
    DriverLauncher,
    Janitor,
    LaunchBlocked,
    LaunchFailed,
    NoRestorableImage,
    Observer,
    PeriodicSlot,
    RestorableCheck,
    StartProblem,
)
from spark_checkpoint_operator.supervisor.record import JobRecord
from spark_checkpoint_operator.supervisor.status_events import SnapshotProgress, UnknownSnapshot

# How the job's message about a start longer than the start timeout begins: it is kept
# until the query starts, also across an operator restart.
SLOW_START = "the driver has been restoring its image and starting its query"


# No query runs to take a savepoint of: a stop stops the driver without one (the next run
# resumes from the newest image).
NO_QUERY_RUNNING = frozenset({JobPhase.PENDING, JobPhase.DEPLOYING, JobPhase.RESTARTING})
# The shortest wait before a launch refused for now is tried again.
BLOCKED_MIN_DELAY = 1.0
# Why a stop asks a finishing driver for no savepoint, and waits for its exit.
FINISHING_NEEDS_NO_SAVEPOINT = (
    "no savepoint is needed: the input is done and its final checkpoint completed; the job "
    "finishes once its driver has committed it and exits"
)
FINISHING_TAKES_NO_SAVEPOINT = (
    "savepoint declined: the input is done and its final checkpoint completed (no query runs "
    "to take one); the job finishes once its driver has committed it and exits"
)


def restart_delay(policy: RestartPolicySpec, retry: int) -> float:
    """Exponential backoff before the ``retry``-th restart (1-based)."""
    # The exponent is bounded: 2 ** 1024 is no float, and maxBackoff bounds the delay anyway.
    return float(min(policy.max_backoff, policy.backoff * 2.0 ** min(retry - 1, 64)))


class JobSupervisor:
    def __init__(
        self,
        *,
        config: CoordinatorConfig,
        restart_policy: RestartPolicySpec,
        launcher: DriverLauncher,
        janitor: Janitor,
        save: Callable[[JobRecord], Awaitable[None]],
        record: JobRecord,
        initial_savepoint: str | None = None,
        report: Callable[[Notice], None] = log_notice,
        observer: Observer | None = None,
        idle_poll_interval: float = POLL_INTERVAL,
        storage: JobStorageLayout,
        restorable_check: RestorableCheck | None = None,
    ) -> None:
        self._config = config
        self._restart_policy = restart_policy
        self._launcher = launcher
        self._janitor = janitor
        self._record = record
        self._initial_savepoint = initial_savepoint
        self._report = report
        self._observer = observer or Observer()
        self._observer.registered((*record.coordinator.checkpoints, *record.coordinator.savepoints))
        # checkpointing.verifyRestorable: each completed image is checked in the background,
        # one at a time; images completed meanwhile give way to the newest
        # (`check_restorable`).
        self._restorable_check = restorable_check
        self._to_check: str | None = None
        # Whether the job ended with nothing left for the janitor: every discard due done
        # and its garbage collected.
        self.cleaned_up = False
        # Labels of requests in the inbox, not yet handled: `pending` counts them, or the
        # controller, asked again at once, would ask for a second stop-with-savepoint.
        self._unhandled: Counter[str] = Counter()
        self._checking: asyncio.Task[None] | None = None
        # Running a terminated job again (resume after suspend, re-run) starts a new
        # coordinator lifecycle that keeps the id counter and the registry.
        self._interpreter = EffectInterpreter(
            self._new_coordinator(config, record.coordinator, record.next_checkpoint_id),
            record=record,
            janitor=janitor,
            observer=self._observer,
            notify=self._notify,
            save=save,
            job=self,
            storage=storage,
        )
        self._snapshots = SnapshotProgress()
        self._polls = StatusPolls(idle_poll_interval)
        self._stop = StopRequest.NONE
        self._final_savepoint_asked = False  # by the deletion (`shut_down`)
        self._suspended_for = ""  # why the runtime suspends the job, for its end's notice
        self._driver_finished = False  # its last driver exited finished: the job ends so
        self._stop_requested = asyncio.Event()
        # The image the previous attempt's restored query failed on, that attempt and its
        # error (`_mark_unrestorable`); None after any other attempt.
        self._last_restore_failure: tuple[str, int, list[str], list[str]] | None = None
        self._stopping: asyncio.Task[None] | None = None
        # `restore_from`'s choice; kept in the record (`restore_choice`) once restored.
        self._chosen: RestoreChoice | None = None
        self._last_status: AgentStatus | None = None
        # Drivers of this process's attempts that restored an image and ended (stopped,
        # killed) before the restore was confirmed, a failed restore aside: `record.restores`
        # counts confirmed ones only, and `run`'s summary tells these beside them.
        self.unconfirmed_restores = 0
        # How the job ended, once that is decided (its end's cleanup may still run).
        self.outcome: TerminalOutcome | None = None

    @property
    def record(self) -> JobRecord:
        return self._record

    @property
    def next_periodic_trigger_in(self) -> float | None:
        """Seconds until the next periodic checkpoint is due; None while the job is not
        Running or has no interval."""
        due = self._interpreter.coordinator.next_periodic_trigger
        return None if due is None else due - time.monotonic()

    @property
    def last_status(self) -> AgentStatus | None:
        """The newest status a driver's agent gave (to the attempt loop or `read_status`);
        it stays after its driver exits."""
        return self._last_status

    async def read_status(self) -> AgentStatus | None:
        """The running driver's status, asked of its agent now, for a live view of the
        query (its batch, input rate): read, never acted on. None while no driver runs or
        its agent does not answer (Spark is starting)."""
        attempt = self._interpreter.attempt
        if attempt is None:
            return None
        try:
            self._last_status = await attempt.driver.agent.read_status()
        except (AgentUnavailable, AgentRejected):
            return None
        return self._last_status

    def _new_coordinator(
        self, config: CoordinatorConfig, state: PersistedState, next_id: int | None
    ) -> CheckpointCoordinator:
        return CheckpointCoordinator(
            config,
            clock=time.time,
            timer=time.monotonic,
            rng=random.Random(),
            state=dataclasses.replace(state, terminated=None),
            next_id=next_id,
            unrestorable=self._record.is_unrestorable,
        )

    def reconfigure(
        self, config: CoordinatorConfig, restart_policy: RestartPolicySpec | None = None
    ) -> None:
        """New checkpoint settings, and restart policy if given, for the running job. The
        policy applies from the next failure (its heartbeat at once). Checkpoints in flight
        are given up (the agent is told on its next report), not counted as failures, and
        what users asked for is asked for again; the id counter and the registry carry
        over."""
        if restart_policy is not None:
            self._restart_policy = restart_policy
        if config == self._config:
            return
        self._config = config
        current = self._interpreter.coordinator
        again = current.unfinished_user_requests()
        # Asked at once, not through the inbox: a stop asked for again must count as
        # pending right away, or the controller asks for a second one.
        self._interpreter.replace(
            self._new_coordinator(config, current.persisted_state, current.next_checkpoint_id),
            again,
        )
        if again:
            self._notify(
                "CheckpointSettingsChanged",
                Level.NOTE,
                "the checkpoint settings changed: asked for again, "
                + ", ".join(
                    f"{r.kind.value} ({r.label})" if r.label else r.kind.value for r in again
                ),
            )
        # Its deadlines apply now, not after a long poll, and its effects are carried out.
        self._polls.inbox.put_nowait(None)

    def _notify(
        self,
        reason: str,
        level: Level,
        message: str,
        *,
        label: str = "",
        image: str = "",
        cause: FailureReason | None = None,
    ) -> None:
        self._report(Notice(reason, level, message, label, image, cause))

    def what_cancelling_leaves(self) -> str:
        """What a cancellation leaves of the job's images, by its retention policy."""
        policy = self._config.retention_policy
        if policy.discards_on(TerminalOutcome.CANCELLED):
            state = self._interpreter.coordinator.persisted_state
            if not state.savepoints:
                next_run = (
                    f"starts from spec.restore.initialSavepointPath ({self._initial_savepoint}) "
                    "again"
                    if self._initial_savepoint
                    else "starts over"
                )
                if state.completed_count:  # its two-phase-commit sinks committed output
                    next_run += (
                        ", and its sinks refuse the output they committed until it is deleted"
                    )
                return (
                    f"its checkpoints are discarded (retentionPolicy {policy.value}) and it "
                    f"has no savepoint: its next run {next_run} (`stop` instead takes a "
                    "savepoint to resume from)"
                )
            return (
                f"its checkpoints are discarded (retentionPolicy {policy.value}), its "
                "savepoints stay"
            )
        return f"its checkpoints and savepoints stay (retentionPolicy {policy.value})"

    def restore_from(
        self, image: str, *, stored_as: tuple[CheckpointKind, int] | None = None
    ) -> DiscardDue | None:
        """Restore ``image`` (a restore candidate's spelling), and only it, instead of the
        newest image, until a checkpoint or savepoint of this run completes. ``stored_as``:
        the job's own snapshot it is; its discard, if due, is withdrawn and returned (the
        janitor would delete it after a failed attempt, and the next restore find nothing)."""
        completed = self._interpreter.coordinator.persisted_state.completed_count
        # Ids are in completion order; an external image starts the job over from elsewhere.
        # Those already unrestorable are no image a plain run would have restored.
        newer = [
            RestoreCandidate.registered(c.kind, c.checkpoint_id).encode()
            for c in self._interpreter.coordinator.restore_candidates()
            if stored_as is None or c.checkpoint_id > stored_as[1]
        ]
        failed = {entry.source for entry in self._record.unrestorable}
        passed_over = tuple(candidate for candidate in newer if candidate not in failed)
        self._chosen = RestoreChoice(image, completed, passed_over)
        # Asked for by name: tried again, though a restored query failed on it before.
        self._record.unrestorable = [e for e in self._record.unrestorable if e.source != image]
        due = self._record.discards_due
        withdrawn = next((d for d in due if d.key == stored_as), None)
        self._record.discards_due = [d for d in due if d is not withdrawn]
        return withdrawn

    @property
    def set_aside(self) -> tuple[str, ...]:
        """The registered images a restore no longer takes unless one is named (a restored
        query failed on it, a restore of an older one left it behind), newest first."""
        marked = {entry.source for entry in self._record.unrestorable}
        return tuple(image for image in self._registered_images() if image in marked)

    @property
    def passed_over(self) -> tuple[str, ...]:
        """The restorable registered images newer than the one `restore_from` chose, newest
        first."""
        choice = self._restore_choice()
        return () if choice is None else choice.passed_over

    def _restore_choice(self) -> RestoreChoice | None:
        """`restore_from`'s choice, this process's or (kept in the record once restored) an
        earlier one's, while no image completed after it; a lapsed one is dropped."""
        choice = self._chosen or self._record.restore_choice
        completed = self._interpreter.coordinator.persisted_state.completed_count
        if choice is not None and not choice.in_force(completed):
            self._chosen = self._record.restore_choice = choice = None
        return choice

    def request(self, event: TriggerRequested) -> None:
        """A user's checkpoint or savepoint request (thread-safe through the loop)."""
        self._unhandled[event.label] += 1
        self._polls.inbox.put_nowait(event)

    def dispose(self, savepoint_id: int, label: str) -> None:
        """A user disposes of a registered savepoint (`SavepointDisposeRequested`); its
        `SavepointDisposed` notice, labelled ``label``, says when it is done."""
        self._polls.inbox.put_nowait(SavepointDisposeRequested(savepoint_id, label))

    def pin(self, savepoint_id: int, pinned: bool) -> None:
        """A registered savepoint pinned, or released (`SavepointPinChanged`)."""
        self._polls.inbox.put_nowait(SavepointPinChanged(savepoint_id, pinned))

    async def run(self) -> TerminalOutcome:
        """Run drivers until the job terminates; return how it ended."""
        try:
            return await self._run_until_terminated()
        finally:
            # Cut short (the runtime stopping, a status not written): the next supervisor
            # adopts the driver, and a check of this one's must not write its verdict
            # into the status after that one's.
            await self._stop_checks()

    async def _run_until_terminated(self) -> TerminalOutcome:
        # Restarts in a row go on from the runtime before this one (0 once the job ended).
        retries = self._record.restarts
        blocked = 0  # launches refused in a row for a reason that may pass
        # The error of the last attempt that failed before its query committed a batch;
        # its first line (the error itself) is compared: what follows may name the attempt.
        repeating: list[str] | None = None
        adopted = await self._launcher.adopt(self._record.attempt) if self._record.attempt else None
        if adopted is None and (stopped := await self._backoff_left()) is not None:
            return stopped
        while True:
            try:
                attempt, exit_code = await self._run_attempt(adopted)
            except (LaunchBlocked, LaunchFailed, NoRestorableImage) as refused:
                blocked = blocked + 1 if isinstance(refused, LaunchBlocked) else 0
                if (not_started := await self._not_started(refused, blocked)) is None:
                    continue
                return not_started
            adopted, blocked = None, 0
            outcome = self._outcome(attempt, exit_code)
            failed = self._failed_restore(attempt, exit_code) if outcome is None else None
            if failed is None:
                self._last_restore_failure = None  # the rule below is of fallbacks in a row
            elif (outcome := await self._fall_back(attempt, failed)) is None:
                repeating = None
                continue
            failed_on_its_own = outcome in (None, TerminalOutcome.FAILED) and not attempt.failing
            error = attempt.driver.error_lines() if failed_on_its_own else []
            early = not attempt.batches_advanced and not attempt.completed
            # How the job ended, without the error the last DriverFailed tells.
            ended = self._record.message
            if outcome is None:
                # Progress starts the backoff over.
                retries = 1 if self._made_progress(attempt) else retries + 1
                unlimited = self._restart_policy.type is RestartPolicyType.ALWAYS
                if (
                    not unlimited
                    and early
                    and repeating
                    and same_error(error, repeating)
                    and not passes(error)
                ):
                    # The same error again before any batch (a misspelled column, a missing
                    # file): the pipeline needs fixing, another attempt cannot help. Not
                    # under Always, which is asked to ride out what passes, nor for an
                    # error of storage or the network that passes (an S3 endpoint down for
                    # a minute failed an OnFailure job with its retries left).
                    ended = (
                        "the driver failed the same way twice before its first batch; not retried"
                    )
                    self._record.message = f"{ended}: {error[0]}"
                    outcome = TerminalOutcome.FAILED
                elif not unlimited and retries > self._restart_policy.max_retries:
                    ended = _exhausted(self._restart_policy, retries, None)
                    self._record.message = _exhausted(
                        self._restart_policy, retries, error[0] if error else attempt.failing
                    )
                    outcome = TerminalOutcome.FAILED
                else:
                    repeating = error if early else None
                    if (
                        stopped := await self._back_off(attempt, exit_code, retries, error)
                    ) is None:
                        continue
                    outcome = stopped
            elif error:
                self._record.message += f": {error[0]}"
            told = outcome is TerminalOutcome.FAILED and failed_on_its_own
            await self._end_after_driver(outcome, exit_code, error, ended, told=told)
            return outcome

    async def _saw_batch(self, attempt: Attempt, batch: int | None) -> None:
        attempt.saw_batch(batch)
        if self._record.restarts and self._config.interval is None and attempt.batches_advanced:
            # No checkpoint tells progress: its batches do (see `_made_progress`).
            self._record.restarts = 0
            await self._interpreter.persist()

    def _note_committed(self, batch: int | None, restored: RestoredFrom | None) -> None:
        """The attempt's query committed ``batch``: past its image (``restored``), its
        restore can no longer fail on it (Running is not: a trigger without new data reads
        no state)."""
        if batch is not None and (restored is None or batch > restored.batch_id):
            self._record.last_committing_attempt = self._record.attempt

    def _made_progress(self, attempt: Attempt) -> bool:
        """Whether the attempt made progress, so that its failure starts the restarts in a
        row over: it completed a checkpoint, or without periodic checkpoints its query
        committed batches; not when it was failed for failing checkpoints."""
        if attempt.failing is not None:
            return False
        periodic = self._config.interval is not None
        return bool(attempt.completed) or (not periodic and attempt.batches_advanced)

    async def _back_off(
        self, attempt: Attempt, exit_code: int, retries: int, error: list[str]
    ) -> TerminalOutcome | None:
        """Wait out the backoff before restart number ``retries``, recorded (an operator
        restart goes on with it); how the job ended if it was stopped meanwhile."""
        delay = restart_delay(self._restart_policy, retries)
        self._record.restarts = retries
        self._record.restart_due = time.time() + delay
        # What status says through the backoff (and the next start): why.
        self._record.message = (
            _how_failed(attempt, exit_code)
            + (f": {error[0]}" if error else "")
            + f"; restart {retries} at {format_time(self._record.restart_due)}"
        )
        self._notify(
            "DriverFailed",
            Level.WARNING,
            f"{_ended(attempt, exit_code)}; restart {retries} in {delay:.0f}s" + error_lines(error),
        )
        await self._interpreter.enter(JobPhase.RESTARTING)
        await self._sleep_unless_stopped(delay)
        return self._stopped_meanwhile()

    async def _backoff_left(self) -> TerminalOutcome | None:
        """The runtime before stopped in a restart's backoff: the rest is waited out. How
        the job ended if it was stopped meanwhile."""
        if (due := self._record.restart_due) is None:
            return None
        # No longer than the backoff allows now (maxBackoff may have been lowered since).
        left = min(due - time.time(), self._restart_policy.max_backoff)
        if left > 0:
            self._notify(
                "RestartBackoff",
                Level.NOTE,
                f"restart {self._record.restarts} is due in {left:.0f}s: waiting out its backoff",
            )
        await self._sleep_unless_stopped(left)
        if (stopped := self._stopped_meanwhile()) is not None:
            await self._terminate(stopped)
        return stopped

    async def _end_after_driver(
        self,
        outcome: TerminalOutcome,
        exit_code: int,
        error: list[str],
        ended: str,
        *,
        told: bool,
    ) -> None:
        """End the job as its last driver left it. A driver that failed on its own and
        fails the job is ``told`` in DriverFailed, how it ended and its error, first (on
        Kubernetes the job's own event comes after its cleanup pod; a kill leaves no error,
        and only its exit said how it died); the job's notice says how it ended without
        repeating it."""
        if told:
            self._notify(
                "DriverFailed",
                Level.WARNING,
                f"driver failed ({describe_exit(exit_code)})" + error_lines(error),
            )
        # A driver that cannot run (its storage another registry's, its settings wrong)
        # leaves a cleanup pod nothing it could do: the garbage of earlier attempts waits
        # for the job's next run.
        await self._terminate(
            outcome,
            collect_garbage=exit_code != DriverExit.MISCONFIGURED,
            ended=ended if told else None,
        )

    async def _sleep_unless_stopped(self, delay: float) -> None:
        """A restart's backoff, ended by a stop. A request that comes meanwhile goes to the
        coordinator at once, which declines what needs a driver (Ctrl-C then stops without
        a savepoint), rather than wait for the next driver."""
        deadline = time.monotonic() + delay
        while not self._stop_requested.is_set() and (left := deadline - time.monotonic()) > 0:
            await self._handle(await self._polls.message_before(self._stop_requested, left))

    async def _not_started(
        self, refused: LaunchBlocked | LaunchFailed | NoRestorableImage, blocked: int
    ) -> TerminalOutcome | None:
        """How the job ends when no driver could be started; None to try again: a launch
        refused for now (the ``blocked``-th in a row) is tried again after a backoff,
        unless the job is stopped meanwhile."""
        if isinstance(refused, LaunchBlocked):
            self._record.attempt -= 1  # nothing was started: the next try is the same attempt
            # At least a second: under `backoff: 0s` the API server was asked without a pause.
            delay = max(BLOCKED_MIN_DELAY, restart_delay(self._restart_policy, blocked))
            self._record.message = (
                f"the driver could not be started yet: {refused}; trying again in {delay:.0f}s"
            )
            self._notify("DriverBlocked", Level.WARNING, self._record.message)
            await self._interpreter.persist()
            await self._sleep_unless_stopped(delay)
            self._record.message = ""
            if (outcome := self._stopped_meanwhile()) is None:
                return None
        else:
            outcome = TerminalOutcome.FAILED
            self._record.message = (
                f"the driver could not be started: {refused}"
                if isinstance(refused, LaunchFailed)
                else str(refused)
            )
        await self._terminate(outcome)
        return outcome

    def _stopped_meanwhile(self) -> TerminalOutcome | None:
        """Cancelled, suspended or shut down while no driver ran (a restart's backoff)."""
        if self._stop >= StopRequest.CANCEL:
            self._record.message = self._stop_message()
            return TerminalOutcome.CANCELLED
        if self._stop is StopRequest.SUSPEND:
            self._record.message = ""  # why the last driver failed is in its events
            return TerminalOutcome.SUSPENDED
        return None

    def _stop_message(self, final: CompletedCheckpoint | None = None) -> str:
        """Why the job ends Cancelled; a deletion's names its final savepoint (an event's
        may have been rate-limited away), or says none was taken though one was asked."""
        if not self.deleting:
            return "cancelled by the user"
        if final is not None:
            return (
                f"the job was deleted; its final savepoint {final.checkpoint_id} is at {final.path}"
            )
        if self._final_savepoint_asked:
            return "the job was deleted; no final savepoint could be taken"
        return "the job was deleted"

    async def retire(self, outcome: TerminalOutcome) -> None:
        """End a job that has no driver (deleted while suspended): its retention policy
        and garbage collection are carried out by the janitor."""
        await self._terminate(outcome)

    async def collect_leftovers(self, *, deleting: bool = False) -> bool:
        """A job that ended, or is deleted after it ended: the discards due are done, and
        whatever its storage holds that its registry does not list (its end's discards cut
        short) is removed, by the janitor. Whether all of it was done."""
        await self._interpreter.janitor_discards_due(deleting=deleting)
        collected = await self._interpreter.clean_up(
            self._janitor.collect_garbage(*self._registered())
        )
        return collected and not self._record.discards_due

    def shut_down(self, *, savepoint: bool, drain: bool) -> None:
        """The job is being deleted: a final savepoint if asked (and possible), then the
        job ends Cancelled, so its retention policy applies as to a cancellation."""
        self._stop = StopRequest.DELETE
        self._final_savepoint_asked = savepoint
        self._stop_requested.set()
        running = self._interpreter.attempt is not None
        if savepoint and running and self._record.phase is JobPhase.RUNNING:
            after = AfterCompletion.DRAIN if drain else AfterCompletion.STOP
            self.request(TriggerRequested(CheckpointKind.SAVEPOINT, after=after, label=FINAL_LABEL))
        else:
            self.cancel()

    def cancel(self) -> None:
        """Stop now, without a savepoint (a second Ctrl-C): the job ends Cancelled, unless
        it ended already (`outcome`), whose storage cleanup then stops."""
        if self.outcome is not None:
            self._interpreter.cut_cleanup_short()  # nothing else is left to stop
            return
        self._stop = max(self._stop, StopRequest.CANCEL)
        self._stop_driver()

    def suspend_now(self, reason: str = "") -> None:
        """Stop without a savepoint, ending Suspended: for a job that is not Running (a
        driver starting, restoring or in a restart's backoff), whose newest image is
        what it would resume from anyway. ``reason``: see `end_suspended`."""
        self.end_suspended(reason)
        self._stop_driver()

    @property
    def deleting(self) -> bool:
        return self._stop is StopRequest.DELETE

    @property
    def heartbeat_timeout(self) -> float:
        return self._restart_policy.heartbeat_timeout

    @property
    def stopping(self) -> bool:
        return self._stop is not StopRequest.NONE

    @property
    def finishing(self) -> bool:
        """The driver was told that a completed checkpoint covers its input's end (it exits
        on its own), or exited so: the job ends Finished."""
        attempt = self._interpreter.attempt
        return self._driver_finished or (attempt is not None and attempt.finishing)

    @property
    def stopped_with(self) -> CompletedCheckpoint | None:
        """The stop-with-savepoint that completed while the driver stops (Suspending)."""
        attempt = self._interpreter.attempt
        return None if attempt is None else attempt.stopped_with

    @property
    def resumes_from(self) -> str | None:
        """The image the job's next run restores from unless it names one (None: none is
        left to): `restore_from`'s once restored (kept in the record), not before (its newer
        images are left behind only then: `_mark_left_behind`)."""
        failed = {entry.source for entry in self._record.unrestorable}
        kept = self._record.restore_choice_in_force
        if kept is not None and kept.image not in failed:
            return kept.image
        return next((image for image in self._unchosen_images() if image not in failed), None)

    @property
    def driver_may_run_query(self) -> bool:
        """The job is not Running, but its driver's query may well be (see
        `Attempt.may_run_query`): a savepoint may be taken once its agent answers."""
        attempt = self._interpreter.attempt
        return attempt is not None and attempt.may_run_query

    @property
    def cancelling(self) -> bool:
        return self._stop is StopRequest.CANCEL

    def pending(self, label: str) -> bool:
        """Whether a checkpoint or savepoint labelled ``label`` is in flight or queued."""
        coordinator = self._interpreter.coordinator
        return (
            self._unhandled[label] > 0
            or any(p.label == label for p in coordinator.pending)
            or any(r.label == label for r in coordinator.queued)
        )

    @property
    def coordinator_phase(self) -> JobPhase:
        """The phase its coordinator acts on: not Running while no driver is attached or
        one exits after its final checkpoint (`JobInterpreter.coordinator_phase`)."""
        return self._interpreter.coordinator_phase()

    def triggered_id(self, label: str) -> int | None:
        """The id of the checkpoint or savepoint labelled ``label`` in flight; None if none
        is (a queued one has no id yet)."""
        pending = self._interpreter.coordinator.pending
        return next((p.checkpoint_id for p in pending if p.label == label), None)

    def withdraw(self, label: str) -> None:
        """What asked for the checkpoints and savepoints labelled ``label`` no longer does:
        those in flight are aborted and those waiting declined (thread-safe through the
        loop)."""
        self._polls.inbox.put_nowait(TriggerWithdrawn(label))

    def end_suspended(self, reason: str | None = None) -> None:
        """The job ends Suspended when its driver exits (unless it is cancelled);
        ``reason``: see `suspending_for` (None: as told before)."""
        self._stop = max(self._stop, StopRequest.SUSPEND)
        if reason is not None:
            self.suspending_for(reason)

    def suspending_for(self, reason: str) -> None:
        """What the job ends Suspended for if its driver stops now, its stop-with-savepoint
        included, if not a suspension the user asked for (``""``): "for an upgrade". Said
        as it ends: the last told (a user's suspension after an upgrade's stop is one)."""
        self._suspended_for = reason

    def _stop_driver(self) -> None:
        self._stop_requested.set()
        if (attempt := self._interpreter.attempt) is not None:
            self._stopping = asyncio.get_running_loop().create_task(attempt.driver.terminate())

    def _outcome(self, attempt: Attempt, exit_code: int) -> TerminalOutcome | None:
        """The terminal outcome of a driver exit, or None to restart it."""
        if attempt.start_problem is not None or self._record.message.startswith(SLOW_START):
            # Whatever ended the attempt ended its problem too (a slow start an operator
            # restart left in the record included).
            self._record.message = ""
        if self._stop >= StopRequest.CANCEL:
            self._record.message = self._stop_message(attempt.stopped_with)
            return TerminalOutcome.CANCELLED
        if self._stop is StopRequest.SUSPEND and not (
            exit_code == DriverExit.FINISHED or attempt.told_final()
        ):
            # A stop-with-savepoint whose completion could not be delivered: the savepoint
            # is registered, and the driver was stopped here instead of by its agent. Why an
            # earlier driver failed is in its events, not the suspension's message.
            self._record.message = ""
            return TerminalOutcome.SUSPENDED
        if attempt.failing is not None:
            self._record.message = attempt.failing
            if not attempt.agent_answered:
                return TerminalOutcome.FAILED  # its agent never answered: a retry cannot help
        if exit_code in (DriverExit.FINISHED, DriverExit.STOPPED_WITH_SAVEPOINT) or (
            attempt.told_final()  # its sinks committed all; stopped on its way out
        ):
            # An earlier run's failure, kept in its status, is not how this one ended.
            self._record.message = ""
            if exit_code != DriverExit.STOPPED_WITH_SAVEPOINT:
                return TerminalOutcome.FINISHED
            return TerminalOutcome.SUSPENDED
        if exit_code in (DriverExit.MISCONFIGURED, DriverExit.RESTORE_FAILED):
            self._record.message = f"driver cannot run: {DriverExit(exit_code).name}"
            return TerminalOutcome.FAILED
        if self._failed_restore(attempt, exit_code) is not None:
            return None  # a fallback, whatever the restart policy
        if self._restart_policy.type is RestartPolicyType.NEVER:
            self._record.message = f"{_how_failed(attempt, exit_code)}; restartPolicy is Never"
            return TerminalOutcome.FAILED
        return None

    async def _run_attempt(self, adopted: DriverHandle | None) -> tuple[Attempt, int]:
        if adopted is None:
            attempt = await self._launch()
            self._interpreter.attempt = attempt
            await self._interpreter.persist()  # status now names the driver
        else:
            ended = adopted.exit_code()
            self._notify(
                "DriverAdopted",
                Level.NOTE,
                # Not "running": a pod still pulling its image is adopted too.
                f"resumed with the driver of attempt {self._record.attempt}, which has not ended"
                if ended is None
                else f"the driver of attempt {self._record.attempt} ended "
                f"({describe_exit(ended)}) while the runtime was down",
            )
            attempt = Attempt.adopted(adopted)
            self._interpreter.attempt = attempt
            # Running again once its agent answers: the new coordinator starts its
            # scheduler then. Status now names the driver.
            await self._interpreter.enter(JobPhase.DEPLOYING)
        driver = attempt.driver
        if self._stop_requested.is_set():
            self._stop_driver()  # asked to stop while the driver was being started
        try:
            answer: Answer | None = None  # a status a long poll brought
            while (exit_code := driver.exit_code()) is None:
                version = await self._poll(attempt, answer)
                answer = await self._wait(attempt, version)
            if exit_code == DriverExit.FINISHED and attempt.finish():
                # It exited before a status said its input was done and covered (it
                # exits at once once told): what its exit cut short is no failure.
                await self._interpreter.tell_phase()
        finally:
            self._interpreter.attempt = None
        self._driver_finished = exit_code == DriverExit.FINISHED
        if exit_code in (DriverExit.FINISHED, DriverExit.STOPPED_WITH_SAVEPOINT):
            self._confirm_restore(attempt)  # e.g. a bounded query with nothing left to run
        elif attempt.unconfirmed_restore is not None and exit_code != DriverExit.RESTORE_UNUSABLE:
            self.unconfirmed_restores += 1
        # Only here: an error or a cancellation of `run` (the runtime itself stopping) leaves
        # the driver running for the next runtime process to adopt.
        await driver.terminate()
        await self._interpreter.janitor_discards_due()
        await self._interpreter.tell_phase()  # no driver: nothing is to be triggered
        return attempt, exit_code

    async def _launch(self) -> Attempt:
        # A check under way is of the newest image, the one a restore would pick: its
        # verdict is waited for rather than a driver started on an image about to be
        # found unrestorable.
        await self._checks_done()
        # Before the attempt is counted: none is when no image is left to restore.
        candidates = self._restore_candidates()
        self._record.attempt += 1
        self._record.restart_due = None  # its backoff is over
        self._record.restored_from = None  # its agent reports the new attempt's
        # Persisted before the driver exists: a restarted runtime knows which attempt's
        # driver may be running and never starts a second one for it.
        await self._interpreter.enter(JobPhase.DEPLOYING)
        self._notify(
            "DriverStarting",
            Level.NOTE,
            f"starting driver attempt {self._record.attempt}"
            + (
                f", restoring from {candidates[0]}{self._passed_over_said(candidates[0])}"
                if candidates
                else ""
            ),
        )
        driver = await self._launcher.launch(self._record.attempt, candidates)
        return Attempt.launched(driver, candidates)

    def _passed_over_said(self, chosen: str) -> str:
        """Why newer images than the one restored are not (a newcomer saw savepoint 4
        restored while status named savepoint 10 as the last one)."""
        images = self._images()
        newer = images[: images.index(chosen)] if chosen in images else []
        if not newer:
            return ""
        reason = next(e.reason for e in self._record.unrestorable if e.source == newer[0])
        others = f" and {len(newer) - 1} more" if len(newer) > 1 else ""
        return f" (not {newer[0]}{others}: {reason})"

    def _images(self) -> list[str]:
        """What the job restores from, newest first: its registered images, else the
        initial savepoint; the image chosen by `restore_from` alone until an image completes."""
        choice = self._restore_choice()
        return [choice.image] if choice is not None else self._unchosen_images()

    def _unchosen_images(self) -> list[str]:
        """What the job restores from unless an image is named: its registered images,
        else the initial savepoint."""
        images = self._registered_images()
        if not images and self._initial_savepoint:
            images = [RestoreCandidate.external(self._initial_savepoint).encode()]
        return images

    def _registered_images(self) -> list[str]:
        registered = self._interpreter.coordinator.restore_candidates()
        return [RestoreCandidate.registered(c.kind, c.checkpoint_id).encode() for c in registered]

    def _restore_candidates(self) -> list[str]:
        """The images the next driver may restore from, newest first, without those a
        restored query failed on. Raises `NoRestorableImage` when only those are left."""
        images = self._images()
        # Entries of images retention has discarded since are of no use any more.
        known = {*images, *self._registered_images()}
        self._record.unrestorable = [
            entry for entry in self._record.unrestorable if entry.source in known
        ]
        failed = {entry.source for entry in self._record.unrestorable}
        candidates = [image for image in images if image not in failed]
        if images and not candidates:
            reasons = "; ".join(
                f"{entry.source}: {entry.reason}" for entry in self._record.unrestorable
            )
            raise NoRestorableImage(f"no restorable image left: {reasons}")
        return candidates

    def _reported_restore(self, attempt: Attempt) -> RestoredFrom | None:
        """The restore the attempt's agent reported (also while its query still started),
        or its record's (adopted); None if it had not."""
        return attempt.reported_restore or self._record.restored_from

    def _failed_restore(self, attempt: Attempt, exit_code: int) -> str | None:
        """The image the driver's query failed on, if it says so (RESTORE_UNUSABLE) and
        restored one."""
        if exit_code != DriverExit.RESTORE_UNUSABLE:
            return None
        if (reported := self._reported_restore(attempt)) is not None:
            return reported.candidate.encode()
        if attempt.candidates:
            # Its restore is not known (its agent had not reported it): every candidate
            # before the one it restored was one it could not read, so the first is
            # unusable in any case.
            return attempt.candidates[0]
        return None

    async def _fall_back(self, attempt: Attempt, source: str) -> TerminalOutcome | None:
        """The restored query failed on `source`: None to go on with an older image (not a
        retry of the same one), else how the job ends."""
        if self._fails_like_the_last_image(attempt, source):
            return TerminalOutcome.FAILED
        await self._mark_unrestorable(attempt, source)
        return self._stopped_meanwhile()

    def _fails_like_the_last_image(self, attempt: Attempt, source: str) -> bool:
        """Whether the restored query failed on `source`, the fallback from the image
        before, as it did there, with an error of a query that no longer fits its state (a
        changed state schema, operator or setting): not the images' fault but the
        pipeline's. That image is restorable again, and the job fails instead of marking
        every image unrestorable in turn (a missing or corrupt file is the image's fault:
        those fall back on)."""
        error = attempt.driver.error_lines()
        last = self._last_restore_failure
        if (
            last is None
            or not error
            or not query_change(error[0])
            or not same_error([*map(image_free, error)], [*map(image_free, last[2])])
        ):
            return False
        image, failed_attempt, _, marked = last
        # Only the images marked for that failure; not those its restore left behind, nor
        # one it may have skipped (a guess: it ended before it said which it restored).
        self._record.unrestorable = [
            entry
            for entry in self._record.unrestorable
            if entry.attempt != failed_attempt or entry.source not in marked or entry.permanent
        ]
        guessed = (
            {image}
            if any(
                entry.source == image and entry.attempt == failed_attempt and entry.permanent
                for entry in self._record.unrestorable
            )
            else set()
        )
        if self._reported_restore(attempt) is None:
            # This driver may have skipped `source` too: marked for good, as a guess is.
            guessed.add(source)
            reason = self._unusable_reason(error)
            self._record.unrestorable.append(
                UnrestorableImage(source, reason, self._record.attempt, permanent=True)
            )
        self._record.message = (
            f"the restored query failed the same way on {image} and {source}: the "
            "pipeline or its settings no longer fit the job's state, not the images "
            f"({_still_restorable(image, source, guessed)}): change them back or start "
            "without that state"
        )
        return True

    def _unusable_reason(self, error: list[str]) -> str:
        return (
            f"its restored query failed in attempt {self._record.attempt} before committing "
            "a batch, on an error that points at the checkpoint: "
            + (error[0] if error else "(the driver's log has it)")
        )

    async def _mark_unrestorable(self, attempt: Attempt, source: str) -> None:
        """The restored query failed on its image before it committed a batch: that image,
        and any checkpoint this attempt took of it, are not restored again (unless named,
        or under a changed deployment: `JobRecord.forget_failed_restores`)."""
        error = attempt.driver.error_lines()
        marked = [source, *attempt.completed]
        self._last_restore_failure = (source, self._record.attempt, error, marked)
        reason = self._unusable_reason(error)
        # Its driver ended before it said which image it restored: it may have skipped
        # this one, and its sinks discarded the output staged after the one restored.
        guessed = self._reported_restore(attempt) is None
        for image in marked:
            self._record.unrestorable.append(
                UnrestorableImage(image, reason, self._record.attempt, permanent=guessed)
            )
        # Its sinks restored `source` before the query failed: what it passed over is left
        # behind, also when its agent never reported the restore.
        skipped = attempt.unconfirmed_restore.skipped if attempt.unconfirmed_restore else ()
        self._mark_left_behind(source, skipped)
        if self._record.restore_choice is not None and self._record.restore_choice.image == source:
            # This run restores it alone and fails; a later one restores what is left.
            self._record.restore_choice = None
        self._record.failed_restores += 1
        failed = {entry.source for entry in self._record.unrestorable}
        following = next((image for image in self._images() if image not in failed), None)
        self._record.message = f"{source} cannot be restored: {reason}; " + (
            f"falling back to {following}" if following else "no older image is left"
        )
        self._report(Notice("RestoreFailed", Level.WARNING, self._record.message, image=source))
        await self._interpreter.persist()

    def _confirm_restore(self, attempt: Attempt) -> None:
        """A restore succeeded once the restored query got past its image (the agent
        reports it running: it committed a batch after the image's, or completed a trigger
        without new data), or ended cleanly: only then is it counted."""
        if attempt.confirm_restore():
            self._record.restores += 1
            self._observer.restored()

    # ------------------------------------------------------------------ asking the agent

    async def _wait(self, attempt: Attempt, version: int | None) -> Answer | None:
        """Until the next status is due (see `StatusPolls.wait`); a user request that
        came meanwhile is handled, new settings' effects carried out."""
        coordinator = self._interpreter.coordinator
        answer, messages = await self._polls.wait(
            attempt.driver,
            version,
            idle=self._record.phase is JobPhase.RUNNING and not coordinator.pending,
            deadline=coordinator.next_deadline(),
            changed=lambda: self._driver_changed(attempt),
        )
        await self._handle(messages)
        return answer

    async def _handle(self, messages: list[Message]) -> None:
        """What came to the inbox; None: new settings' effects are due."""
        for message in messages:
            if message is None:
                await self._interpreter.carry_out_queued()
                continue
            if isinstance(message, TriggerRequested):
                self._unhandled[message.label] -= 1
            await self._interpreter.handle(message)

    def _driver_changed(self, attempt: Attempt) -> bool:
        driver = attempt.driver
        return (
            driver.exit_code() is not None
            or driver.executors_ready() != attempt.executors_ready
            or attempt.leaving_overdue()
            or attempt.final_completion_due()
            or self._slow_start_due(attempt)
        )

    async def _poll(self, attempt: Attempt, answer: Answer | None = None) -> int | None:
        """Act on a status of the agent: ``answer`` (from a long poll), or one asked for
        now. Returns the status's version; None when there is none to long-poll after."""
        if answer is None:
            answer = await self._polls.status(attempt.driver)
        if isinstance(answer, Exception):
            if isinstance(answer, AgentUnavailable):
                attempt.unanswered()
                await attempt.driver.recheck()
            else:  # refused (a 500 of a storage error, a broken answer): it is not silent
                attempt.replied()
            await self._interpreter.agent_lost()
            await self._tick()
            await self._give_up_on_a_silent_agent(attempt, answer)
            await self._stop_if_overdue(attempt)
            return None
        await self._report_start_problem(attempt, None)
        await self._process(attempt, answer, before=attempt.answered())
        await self._stop_if_overdue(attempt)
        return answer.version

    async def _stop_if_overdue(self, attempt: Attempt) -> None:
        """A driver that does not exit on its own after its stop-with-savepoint or final
        checkpoint completed (hung in Spark's stop, its agent silent or not) is stopped:
        what it leaves is registered. One told its final checkpoint finished; one that
        never took it restarts (`_outcome`), and the restored driver's sinks commit what
        that checkpoint covers before its query starts."""
        if not attempt.leaving_overdue():
            return
        attempt.stopped_overdue = True
        if not attempt.finishing:
            self._notify("StopTimedOut", Level.WARNING, "the driver did not stop: stopping it")
            self.suspend_now()
            return
        if attempt.told_final():
            self._notify(
                "StopTimedOut",
                Level.WARNING,
                "the driver did not exit after its final checkpoint completed: stopping it",
            )
        else:
            # A stop asked meanwhile ends the job Suspended: the next run commits it.
            after = "next run's" if self._stop is StopRequest.SUSPEND else "restarted driver's"
            message = (
                f"the driver did not take its final checkpoint's completion in "
                f"{STOPPED_DRIVER_EXIT_SECONDS:.0f}s (a sink's commit kept failing?): stopping "
                f"it; the {after} sinks commit what that checkpoint covers."
            )
            attempt.fail(message)
            self._notify("StopTimedOut", Level.WARNING, message)
        await attempt.driver.terminate()

    async def _give_up_on_a_silent_agent(self, attempt: Attempt, error: Exception) -> None:
        """Tell what keeps the driver from starting; stop a driver whose agent never answered
        after it started (the job fails: a retry cannot help), or stopped answering after it
        answered this runtime (hung, or cut off from the operator: the restart policy
        decides, as for a crash). A driver leaving on its own is let go, and one being
        stopped."""
        if attempt.failing or attempt.leaving:
            return
        stopping = self._stop_requested.is_set()  # why it does not start is no news then
        if not stopping:
            await self._report_start_problem(attempt, attempt.driver.start_problem())
        timeout = self._restart_policy.start_timeout
        # The agent answers from a thread of its own, whatever the query does.
        if (silent := attempt.silent_for()) >= self._restart_policy.heartbeat_timeout:
            attempt.fail(
                f"the driver's checkpoint agent has not answered for {silent:.0f}s (the "
                f"driver hung, or the network to it is down): {error}."
            )
            reason = "AgentStoppedAnswering"
        elif not stopping and attempt.running_for() >= timeout:
            attempt.fail(
                f"the driver's checkpoint agent never answered in {timeout:.10g}s after the "
                "driver started (restartPolicy.startTimeout): does the pipeline reach "
                "run_coordinated(writer, participants=[...])? (If the code before it, or "
                "Spark's start, is slow rather than stuck: raise startTimeout.)"
            )
            reason = "AgentNeverAnswered"
        else:
            return
        self._notify(reason, Level.WARNING, f"{attempt.failing} Stopping the driver.")
        await attempt.driver.terminate()

    async def _report_start_problem(self, attempt: Attempt, problem: StartProblem | None) -> None:
        """Tell what keeps the driver from starting (a missing Secret, no node for its pod)
        once, and keep it as the job's message while it lasts."""
        if not attempt.kept_from_starting(problem):
            return
        if problem is None:
            self._record.message = ""
        else:
            self._record.message = f"the driver cannot start yet: {problem}"
            self._notify("DriverNotStarting", Level.WARNING, self._record.message)
        await self._interpreter.persist()

    async def _process(self, attempt: Attempt, status: AgentStatus, *, before: Stage) -> None:
        """Act on a status; ``before``: the attempt's stage before this answer."""
        driver = attempt.driver
        if status.restored_from is not None:
            restored = status_events.restore_within_bounds(status.restored_from, attempt.candidates)
            status = dataclasses.replace(status, restored_from=restored)
        if before in (Stage.STARTING, Stage.ADOPTED):
            # Before the first trigger of an attempt: whatever a crash left in storage that
            # the registry does not list goes now, while no snapshot is in flight, and the
            # discards due (a job without periodic checkpoints would keep them to its end).
            await self._collect_garbage(driver)
            await self._interpreter.discard_due(attempt)
        self._last_status = status
        if (stored_ids := status_events.stored_ids_reported(status)) is not None:
            await self._interpreter.handle(stored_ids)  # before this driver's first trigger
        # While the driver restores and starts its query, the location it reports from
        # is not the query's yet: its batches and restore come once the query started (an
        # adopted driver's restore may be in the record already).
        if status.restored_from is not None:
            # Reported before the query starts, as soon as the driver restored: its sinks
            # discard what the images it passed over covered before the query starts.
            restored = attempt.reported_restore = status.restored_from
            if self._mark_left_behind(restored.candidate.encode(), restored.skipped):
                # At once: the next attempt must not choose one, whatever happens next.
                await self._interpreter.persist()
        attempt.reported_query(status.query.state)
        if status.query.state is QueryState.STARTING:
            await self._report_slow_start(attempt)
        else:
            await self._slow_start_over()
            batch = status.query.last_committed_batch
            await self._saw_batch(attempt, batch)
            if batch is not None:  # a restoring query has none yet: the last one stands
                self._record.last_batch = batch
            if status.restored_from != self._record.restored_from:
                self._record_restore(attempt, status.restored_from)
            self._note_committed(batch, status.restored_from)
        # A restored query is reported restoring until it got past its image.
        running = status.query.state.runs_tasks
        if running:
            self._confirm_restore(attempt)
        attempt.executors_ready = driver.executors_ready()
        await self._interpreter.handle(
            status_events.tasks_reported(status, attempt.executors_ready)
        )
        if running and not attempt.leaving and self._record.phase is not JobPhase.RUNNING:
            self._record.message = ""  # why an earlier attempt ended is in its events
            await self._interpreter.enter(JobPhase.RUNNING)
        known = {p.checkpoint_id for p in self._interpreter.coordinator.pending}
        known.update(*self._registered())
        for progress in self._snapshots.read(status, known):
            if isinstance(progress, UnknownSnapshot):
                await self._interpreter.abort(
                    attempt,
                    progress.checkpoint_id,
                    "not a pending checkpoint of the coordinator",
                )
            else:
                await self._interpreter.handle(progress)
        last = status_events.input_exhausted_at(status)
        stopping = self._interpreter.coordinator.stopping
        if (
            last is not None
            and attempt.input_exhausted_at is None
            and not stopping
            and not attempt.leaving
        ):
            # While a stop-with-savepoint is in flight (a drain waits for the input to run
            # out), the savepoint is the last image: a final checkpoint would end the job
            # Finished and give up the savepoint the user asked for. Once it completed,
            # the driver stops with it.
            await self._on_input_exhausted(attempt, last)
        elif (
            last is not None
            and attempt.final_completion_due()
            and (final := self._covering(attempt, last)) is not None
        ):
            # The driver did not take it (a sink's commit failed): it waits for it still.
            await self._interpreter.notify_complete(attempt, final)
        elif status_events.finished_and_told(status) and not stopping and attempt.finish():
            # A completion it was told of covers its last batch: the driver exits now, and
            # what its exit cuts short is no failure. Not while a stop-with-savepoint is in
            # flight: the driver waits for it, and stops once it completes.
            await self._interpreter.tell_phase()
        await self._tick()

    def _slow_start_due(self, attempt: Attempt) -> bool:
        """A slow start to tell: not of a driver being stopped."""
        stopping = self._stop_requested.is_set() or attempt.failing is not None
        return not stopping and attempt.slow_start_due(self._restart_policy.start_timeout)

    async def _report_slow_start(self, attempt: Attempt) -> None:
        """Nothing bounds a restore (its agent answers all along): one that takes longer
        than the start timeout is told once, and kept as the job's message until the query
        starts (`_slow_start_over`), so that one that hangs does not go unseen."""
        if not self._slow_start_due(attempt):
            return
        attempt.slow_start_told = True
        timeout = self._restart_policy.start_timeout
        self._record.message = (
            f"{SLOW_START} for {attempt.starting_for():.0f}s, longer than "
            "restartPolicy.startTimeout "
            f"({timeout:.10g}s): a large image takes its time; storage that stopped answering "
            "needs the driver stopped"
        )
        self._notify("DriverSlowToStart", Level.WARNING, self._record.message)
        await self._interpreter.persist()

    async def _slow_start_over(self) -> None:
        """The query started (restoring or running): a slow start told, here or by the
        runtime before, is over."""
        if self._record.message.startswith(SLOW_START):
            self._record.message = ""
            await self._interpreter.persist()

    def _record_restore(self, attempt: Attempt, restored: RestoredFrom | None) -> None:
        self._record.restored_from = restored
        if restored is None:
            return
        attempt.restored(restored)
        source = restored.candidate.encode()
        left_behind = self._left_behind(source, restored.skipped)
        never = (
            f"; never restored again: {', '.join(left_behind)} (output staged after "
            f"{source} and not yet committed is discarded; committed output stays)"
            if left_behind
            else ""
        )
        # Why an image was skipped comes first: "never restored again: savepoint:106" alone
        # puzzled (a newcomer's).
        for skipped in restored.skipped:
            self._report(
                Notice(
                    "RestoreSkipped",
                    Level.WARNING,
                    f"skipped {skipped.candidate}: {skipped.reason}; the job goes on from "
                    f"{source} and never restores {skipped.candidate}",
                    image=str(skipped.candidate),
                )
            )
        self._notify("Restored", Level.NOTE, f"restored from {source}{never}")

    def _left_behind(self, source: str, skipped: Sequence[SkippedImage]) -> dict[str, str]:
        """The images a restore of ``source`` (an older one) leaves behind, each with why:
        the restored query's sinks discard the output batches staged after its image, which
        only these covered. Restored later, one would resume after output that is gone."""
        left_behind = {
            str(image.candidate): f"a restore skipped it ({image.reason}) and " for image in skipped
        }
        choice = self._restore_choice()
        if choice is not None and source == choice.image:
            left_behind |= {image: "" for image in choice.passed_over if image not in left_behind}
        return {
            image: f"{why}attempt {self._record.attempt} went on from {source}"
            for image, why in left_behind.items()
        }

    def _mark_left_behind(self, source: str, skipped: Sequence[SkippedImage]) -> bool:
        """Mark the images a restore of ``source`` leaves behind unrestorable; whether the
        record changed. Restored, `restore_from`'s choice is kept in the record: with the
        job's newer images set aside, a restarted runtime restores it again (another job's
        image above all, which the registry does not list)."""
        choice = self._restore_choice()
        kept = choice is not None and source == choice.image
        newly_kept = kept and self._record.restore_choice != choice
        if kept:
            self._record.restore_choice = choice
        marked = {entry.source for entry in self._record.unrestorable}
        new = [
            UnrestorableImage(image, reason, self._record.attempt, permanent=True)
            for image, reason in self._left_behind(source, skipped).items()
            if image not in marked
        ]
        self._record.unrestorable.extend(new)
        return bool(new) or newly_kept

    async def _collect_garbage(self, driver: DriverHandle) -> None:
        try:
            report = await driver.agent.collect_garbage(*self._registered())
        except (AgentUnavailable, AgentRejected) as error:
            self._notify(
                "GarbageCollectionSkipped",
                Level.WARNING,
                f"garbage collection skipped: {error}",
            )
            return
        if removed := describe_garbage(report):
            self._notify("GarbageCollected", Level.NOTE, f"removed {removed}")

    def _covering(self, attempt: Attempt, last: int) -> CompletedCheckpoint | None:
        """The newest registered checkpoint covering batch ``last`` that the attempt's
        driver took: its agent refuses another (404: a newer image its restore skipped,
        or one a restore from an older image left registered) however often it is sent.
        (A restored image that covers it needs no telling: the driver does not wait.)"""
        known = set(attempt.completed)
        registered = self._interpreter.coordinator.persisted_state.checkpoints
        return next(
            (
                c
                for c in reversed(registered)
                if c.batch_id >= last
                and RestoreCandidate.registered(c.kind, c.checkpoint_id).encode() in known
            ),
            None,
        )

    async def _on_input_exhausted(self, attempt: Attempt, last: int) -> None:
        """Bounded input is done at batch ``last``: its final checkpoint."""
        attempt.input_exhausted_at = last
        if (covering := self._covering(attempt, last)) is not None:
            # One completed after this status was written: the driver is told of it
            # (again) instead of a new one being triggered that its exit would cut short.
            self._notify(
                "FinalCheckpoint",
                Level.NOTE,
                f"input exhausted at batch {last}: checkpoint {covering.checkpoint_id} covers it",
            )
            await self._interpreter.notify_complete(attempt, covering)
        else:
            self._notify(
                "FinalCheckpoint",
                Level.NOTE,
                f"input exhausted at batch {last}: final checkpoint",
            )
            await self._interpreter.handle(
                TriggerRequested(CheckpointKind.CHECKPOINT, forced=True, label=FINAL_LABEL)
            )

    async def _tick(self) -> None:
        due = self._interpreter.coordinator.next_periodic_trigger
        decided = time.monotonic()
        epoch = time.time() - decided  # the slot's times as epoch seconds, as reported
        effects = await self._interpreter.handle(Tick())
        next_due = self._interpreter.coordinator.next_periodic_trigger
        if due is not None and next_due != due:  # this Tick consumed the periodic slot
            triggered = (e.checkpoint_id for e in effects if isinstance(e, TriggerCheckpoint))
            self._observer.periodic(
                PeriodicSlot(
                    due + epoch,
                    decided + epoch,
                    None if next_due is None else next_due + epoch,
                    next(triggered, None),
                )
            )

    def _registered(self) -> tuple[list[int], list[int]]:
        state = self._interpreter.coordinator.persisted_state
        return (
            [c.checkpoint_id for c in state.checkpoints],
            [s.checkpoint_id for s in state.savepoints],
        )

    # ------------------------------------------------------------------ restorable checks

    def check_restorable_with(self, check: RestorableCheck | None) -> None:
        """checkpointing.verifyRestorable changed while the job runs: the images completed
        from now on are checked with ``check``, or none is (one under way ends as it will;
        one waiting is not checked)."""
        self._restorable_check = check
        if check is None:
            self._to_check = None

    def check_restorable(self, image: str) -> None:
        """Check ``image`` once the check under way (if any) is done, instead of any image
        still waiting: checkpointing never waits for checks, and checks never pile up."""
        if self._restorable_check is None:
            return
        self._to_check = image
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._run_checks())

    async def _checks_done(self) -> None:
        if self._checking is not None:
            await self._checking

    async def _run_checks(self) -> None:
        while (image := self._to_check) is not None and (
            check := self._restorable_check
        ) is not None:
            self._to_check = None
            started = time.monotonic()
            try:
                problems = await check.problems(image)
            except CheckUnavailable as error:
                self._notify(
                    "RestorableCheckSkipped", Level.WARNING, f"could not check {image}: {error}"
                )
                continue
            seconds = time.monotonic() - started
            recorded = {entry.source for entry in self._record.unrestorable}
            if image not in self._images() or image in recorded:
                continue  # discarded by retention meanwhile, or a restore found it already
            if not problems:
                self._notify(
                    "ImageRestorable", Level.DETAIL, f"{image} is restorable ({seconds:.0f}s)"
                )
                continue
            reason = "the restorable check after it completed found: " + "; ".join(problems)
            self._record.unrestorable.append(UnrestorableImage(image, reason, self._record.attempt))
            self._notify(
                "ImageUnrestorable",
                Level.WARNING,
                f"{image} is not restorable, restores skip it: " + "; ".join(problems),
            )
            await self._interpreter.persist()

    async def _stop_checks(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
            await asyncio.gather(self._checking, return_exceptions=True)
            self._checking = self._to_check = None

    async def _terminate(
        self,
        outcome: TerminalOutcome,
        *,
        collect_garbage: bool = True,
        ended: str | None = None,
    ) -> None:
        """End the job; its notice says how (`ended`, else the record's message)."""
        self.outcome = outcome
        await self._stop_checks()  # no restore follows
        # Run again (resumed, re-run), the job counts its restarts afresh.
        self._record.restarts, self._record.restart_due = 0, None
        await self._interpreter.end(outcome)
        if collect_garbage:
            self.cleaned_up = await self.collect_leftovers()
        await self._interpreter.persist()
        how = self._record.message if ended is None else ended
        if outcome is TerminalOutcome.SUSPENDED and not how:
            how = self._suspended_for
        self._notify(
            f"Job{outcome.value}",
            Level.WARNING if outcome is TerminalOutcome.FAILED else Level.NOTE,
            f"job {outcome.value.lower()}" + (f": {how}" if how else ""),
        )


def _ended(attempt: Attempt, exit_code: int) -> str:
    """How a failed attempt ended: a driver stopped here was told of with its reason, and
    its exit says nothing (a pod deleted before it ran)."""
    return "driver stopped" if attempt.failing else f"driver failed ({describe_exit(exit_code)})"


def _how_failed(attempt: Attempt, exit_code: int) -> str:
    """A driver stopped here: why, not its exit (a deleted pod's says nothing)."""
    if attempt.failing:
        return attempt.failing.rstrip(".")
    return f"driver failed ({describe_exit(exit_code)})"


def _exhausted(policy: RestartPolicySpec, retries: int, last: str | None) -> str:
    times = "once" if retries == 1 else f"{retries} times in a row"
    return f"driver failed {times}; restartPolicy.maxRetries={policy.max_retries} exhausted" + (
        f"; last error: {last}" if last else ""
    )


def _still_restorable(image: str, source: str, guessed: set[str]) -> str:
    """Which of two images a query failed on alike stay restorable: not those a driver
    failed on before it said which image it restored (it may have skipped them)."""
    if not guessed:
        return "both stay restorable"
    if len(guessed) == 2:
        return (
            "neither stays restorable: their drivers ended before they said which image "
            "they restored"
        )
    (lost,) = guessed
    kept = source if lost == image else image
    return (
        f"{kept} stays restorable; {lost} not: its driver ended before it said which image "
        "it restored"
    )
