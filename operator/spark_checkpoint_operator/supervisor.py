"""Runs one job: drivers one after another, and the coordinator between them and storage.

The supervisor is the adapter around the coordinator core. It turns the agent's reports
and the driver's exit into events, and carries out the coordinator's effects in order.
How a driver is started (a local process, a Kubernetes pod) and where status is kept
(a file, the resource's status) are supplied by the runtime.
"""

import asyncio
import contextlib
import dataclasses
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, assert_never

from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint_operator.agent_client import AgentClient, AgentRejected, AgentUnavailable
from spark_checkpoint_operator.coordinator import (
    AbortCheckpoint,
    AfterCompletion,
    CheckpointCoordinator,
    CheckpointFinalized,
    CheckpointKind,
    CompletedCheckpoint,
    CoordinatorConfig,
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
    PersistedState,
    PersistState,
    RequestDeclined,
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    TerminalOutcome,
    Tick,
    TriggerCheckpoint,
    TriggerDeliveryFailed,
    TriggerRequest,
    TriggerRequested,
)
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.status import PersistedStatus

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.5
# The longest a status request waits for the agent's status to change (a long poll).
LONG_POLL_SECONDS = 30.0
# A status request goes out at least this long after the previous answer, so that changes
# in quick succession (a trigger and its snapshot's acks) are picked up together.
STATUS_GAP_SECONDS = 0.25
# The label of the last image of a job: bounded input's final checkpoint, a deleted job's
# final savepoint.
FINAL_LABEL = "final"
# How long a driver may take to exit on its own after its stop-with-savepoint completed;
# then it is told to stop (see driver_command.TERMINATION_GRACE_SECONDS).
STOPPED_DRIVER_EXIT_SECONDS = 120.0

# A status document, or why the agent gave none.
_Answer = dict[str, Any] | AgentUnavailable | AgentRejected


def restart_delay(policy: RestartPolicySpec, retry: int) -> float:
    """Exponential backoff before the ``retry``-th restart (1-based)."""
    return float(min(policy.max_backoff, policy.backoff * 2 ** (retry - 1)))


class DriverHandle(Protocol):
    @property
    def agent(self) -> AgentClient: ...

    def exit_code(self) -> int | None:
        """None while the driver runs."""

    async def terminate(self) -> None:
        """Stop the driver and return once it is gone (never two drivers at once)."""

    def executors_ready(self) -> bool:
        """False while Spark replaces a lost executor: a checkpoint would miss its tasks."""


class DriverLauncher(Protocol):
    async def launch(self, attempt: int, restore: list[str]) -> DriverHandle: ...

    async def adopt(self, attempt: int) -> DriverHandle | None:
        """The driver of ``attempt`` if it still runs from before this runtime restarted
        (an operator upgrade must not restart every job), or if it ended since (its exit
        code is judged as any driver's); None to start a new one."""


class LaunchFailed(Exception):
    """The runtime refused to start a driver (admission, quota, an invalid pod): retrying
    the same spec cannot help; the message says why."""


class NoRestorableImage(Exception):
    """Every image the job could restore from failed its restore; the message lists why."""


class CleanupFailed(Exception):
    """A janitor could not change storage; the message says what and why."""


class CheckUnavailable(Exception):
    """The restorable check could not run (no verdict); the message says why."""


class RestorableCheck(Protocol):
    """Lets Spark read an image as a restart would (``python -m spark_checkpoint.restorable``)
    where storage is reachable: a subprocess locally, a cleanup pod on Kubernetes."""

    async def problems(self, image: str) -> list[str]:
        """What keeps a restarted query from reading ``image`` (``kind:id``); empty when it
        is restorable. Raises `CheckUnavailable` when there is no verdict."""


class Janitor(Protocol):
    """Storage work while no driver runs (a cleanup pod in Kubernetes). Failures raise
    `CleanupFailed`; what is left behind is garbage-collected on a later run."""

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None: ...

    async def discard_savepoint(self, savepoint_id: int) -> None: ...

    async def collect_garbage(self, checkpoints: list[int], savepoints: list[int]) -> None: ...


@dataclass
class JobRecord:
    """Everything about the job that is persisted: the coordinator's registry and the
    runtime's own counters. It is what status shows and what a restart resumes from."""

    phase: JobPhase = JobPhase.PENDING
    attempt: int = 0
    restores: int = 0  # attempts whose restore succeeded (see JobSupervisor._confirm_restore)
    failed_restores: int = 0
    restored_from: dict[str, Any] | None = None
    # Images a restored query failed on ({"source", "reason", "attempt"}): never tried again.
    unrestorable: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    coordinator: PersistedState = field(default_factory=PersistedState)
    pending: list[dict[str, Any]] = field(default_factory=list)
    last_batch: int | None = None
    consecutive_failures: int = 0
    # The live counter of this process's coordinator: no id at or above it has been
    # triggered (at most the persisted counter). None in a record read back: its coordinator
    # starts after the persisted counter, as nothing tells which ids below were used.
    next_checkpoint_id: int | None = None

    def persisted_status(self) -> PersistedStatus:
        """The record's part of the status (``status.render_status`` adds the views)."""
        return PersistedStatus(
            phase=self.phase,
            job_attempt=self.attempt,
            restores=self.restores,
            failed_restores=self.failed_restores,
            restored_from=self.restored_from,
            unrestorable=self.unrestorable,
            message=self.message,
            last_committed_batch=self.last_batch,
            consecutive_failures=self.consecutive_failures,
            next_checkpoint_id=(
                self.coordinator.next_checkpoint_id
                if self.next_checkpoint_id is None
                else self.next_checkpoint_id
            ),
            pending=self.pending,
            coordinator=self.coordinator,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.persisted_status().to_dict()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobRecord":
        """Read back a status: what a restart resumes from (the previous process's pending
        snapshots, failure streak and live id counter start afresh)."""
        return cls.from_status(PersistedStatus.from_dict(data))

    @classmethod
    def from_status(cls, status: PersistedStatus) -> "JobRecord":
        """What a restart resumes from (see ``from_dict``)."""
        return cls(
            phase=status.phase,
            attempt=status.job_attempt,
            restores=status.restores,
            failed_restores=status.failed_restores,
            restored_from=None if status.restored_from is None else dict(status.restored_from),
            unrestorable=[dict(image) for image in status.unrestorable],
            message=status.message,
            coordinator=status.coordinator,
        )


class Observer(Protocol):
    """What a metrics sink learns from the supervisor (see ``metrics.JobMetrics``)."""

    def completed(self, checkpoint: CompletedCheckpoint) -> None: ...

    def failed(self, kind: CheckpointKind, reason: str) -> None: ...

    def restored(self) -> None: ...

    def late(self, seconds: float) -> None:
        """A periodic trigger fired ``seconds`` after its scheduled time."""


class _Unobserved:
    def completed(self, checkpoint: CompletedCheckpoint) -> None:
        pass

    def failed(self, kind: CheckpointKind, reason: str) -> None:
        pass

    def restored(self) -> None:
        pass

    def late(self, seconds: float) -> None:
        pass


class Level(StrEnum):
    DETAIL = "detail"  # routine progress: logged, not an event
    NOTE = "note"  # worth an event: restores, savepoints, terminations
    WARNING = "warning"  # something failed


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should be told; ``reason`` is CamelCase (a Kubernetes event's)."""

    reason: str
    level: Level
    message: str


def _log_notice(notice: Notice) -> None:
    log.log(logging.WARNING if notice.level is Level.WARNING else logging.INFO, notice.message)


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
        report: Callable[[Notice], None] = _log_notice,
        observer: "Observer | None" = None,
        idle_poll_interval: float = POLL_INTERVAL,
        agent_start_timeout: float | None = None,
        driver_error: Callable[[int], list[str]] = lambda attempt: [],
        restorable_check: RestorableCheck | None = None,
    ) -> None:
        self._config = config
        self._restart_policy = restart_policy
        self._launcher = launcher
        self._janitor = janitor
        self._save = save
        self._record = record
        self._initial_savepoint = initial_savepoint
        self._report = report
        self._observer = observer or _Unobserved()
        # How often a running job without pending checkpoints asks an agent that cannot
        # long-poll for status, and checks the driver while a long poll waits; triggers
        # are timed by the coordinator's deadlines, not by polling.
        self._idle_poll_interval = idle_poll_interval
        # How long a started driver's agent may stay silent before the job fails: a
        # pipeline that never calls run_coordinated would otherwise look like a slow start
        # forever. None: no limit (a pod may wait for a node or an image).
        self._agent_start_timeout = agent_start_timeout
        # The last error lines of an attempt's driver (its log), first the error itself;
        # shown with each failure, and compared to tell a repeating failure.
        self._driver_error = driver_error
        # checkpointing.verifyRestorable: each completed image is checked in the background,
        # one at a time; images completed meanwhile give way to the newest (`_check_newest`).
        self._restorable_check = restorable_check
        self._to_check: str | None = None
        self._checking: asyncio.Task[None] | None = None
        # Running a terminated job again (resume after suspend, re-run) starts a new
        # coordinator lifecycle that keeps the id counter and the registry.
        self._coordinator = self._new_coordinator(
            config, record.coordinator, record.next_checkpoint_id
        )
        self._driver: DriverHandle | None = None
        # User requests, and None to wake `_wait` (new settings).
        self._requests: asyncio.Queue[TriggerRequested | None] = asyncio.Queue()
        self._executors_ready = True  # as of the last status
        self._last_status = 0.0  # when the agent last answered (monotonic)
        self._fed_acks: set[tuple[int, str]] = set()
        self._fed_declines: set[tuple[int, str]] = set()
        self._final_requested = False
        # The last batch of bounded input, once the agent reported it; then whether a
        # completed checkpoint covers it: the driver is exiting.
        self._input_exhausted_at: int | None = None
        self._finishing = False
        self._garbage_collected = False
        self._restore_recorded = False
        # This attempt's restore: its candidates, and the image it restored from until the
        # agent reports the query running or it ends cleanly (None: confirmed, or none).
        self._candidates: list[str] = []
        self._unconfirmed_restore: dict[str, Any] | None = None
        self._completed_in_attempt: list[str] = []  # images registered by this attempt
        self._agent_answered = False
        self._attempt_started = 0.0
        # The committed batch the attempt's first status showed (a tuple: it may be None),
        # and whether a later status showed another: the query made progress.
        self._first_batch: tuple[int | None] | None = None
        self._batches_advanced = False
        self._failing: str | None = None
        self._cancelled = False
        self._suspend_on_exit = False
        self._stopping: asyncio.Task[None] | None = None
        self._suspending_since: float | None = None
        self._stopping_savepoints: set[int] = set()
        self._aborted_unknown: set[int] = set()
        self._shutting_down = False
        self._stop_requested = asyncio.Event()

    @property
    def record(self) -> JobRecord:
        return self._record

    @staticmethod
    def _new_coordinator(
        config: CoordinatorConfig, state: PersistedState, next_id: int | None
    ) -> CheckpointCoordinator:
        return CheckpointCoordinator(
            config,
            clock=time.time,
            rng=random.Random(),
            state=dataclasses.replace(state, terminated=None),
            next_id=next_id,
        )

    def reconfigure(self, config: CoordinatorConfig) -> None:
        """New checkpoint settings for the running job. Checkpoints in flight are given up
        (the agent is told on its next report), not counted as failures; the id counter
        and the registry carry over."""
        if config == self._config:
            return
        self._config = config
        self._coordinator = self._new_coordinator(
            config, self._coordinator.persisted_state, self._coordinator.next_checkpoint_id
        )
        self._coordinator.handle(JobPhaseChanged(self._record.phase))
        self._requests.put_nowait(None)  # its deadlines apply now, not after a long poll

    def _notify(self, reason: str, level: Level, message: str) -> None:
        self._report(Notice(reason, level, message))

    def request(self, event: TriggerRequested) -> None:
        """A user's checkpoint or savepoint request (thread-safe through the loop)."""
        self._requests.put_nowait(event)

    async def run(self) -> TerminalOutcome:
        """Run drivers until the job terminates; return how it ended."""
        retries = 0
        # The error of the last attempt that failed before its query committed a batch;
        # its first line (the error itself) is compared: what follows may name the attempt.
        repeating: list[str] | None = None
        adopted = await self._launcher.adopt(self._record.attempt) if self._record.attempt else None
        while True:
            try:
                exit_code = await self._run_attempt(adopted)
            except LaunchFailed as refused:
                self._record.message = f"the driver could not be started: {refused}"
                await self._terminate(TerminalOutcome.FAILED)
                return TerminalOutcome.FAILED
            except NoRestorableImage as exhausted:
                self._record.message = str(exhausted)
                await self._terminate(TerminalOutcome.FAILED)
                return TerminalOutcome.FAILED
            adopted = None
            outcome = self._outcome(exit_code)
            if outcome is None and (failed := self._failed_restore(exit_code)) is not None:
                # Not a retry of the same image: the next attempt restores an older one.
                await self._mark_unrestorable(failed)
                repeating = None
                if (stopped := self._stopped_meanwhile()) is None:
                    continue
                outcome = stopped
            failed_on_its_own = outcome in (None, TerminalOutcome.FAILED) and not self._failing
            # A driver killed by a signal wrote no error of its own: its log's tail would
            # be whatever it was doing at the time, so none is shown.
            killed = exit_code < 0
            error = (
                self._driver_error(self._record.attempt) if failed_on_its_own and not killed else []
            )
            early = not self._batches_advanced and not self._completed_in_attempt
            if outcome is None:
                # An attempt that completed a checkpoint made progress: backoff starts over;
                # not when it was failed for failing checkpoints.
                progressed = bool(self._completed_in_attempt) and self._failing is None
                retries = 1 if progressed else retries + 1
                unlimited = self._restart_policy.type is RestartPolicyType.ALWAYS
                if error and early and repeating and error[0] == repeating[0]:
                    # The same error again before any batch (a misspelled column, a missing
                    # file): the pipeline needs fixing, another attempt cannot help.
                    self._record.message = (
                        "the driver failed the same way twice before its first batch; "
                        f"not retried: {error[0]}"
                    )
                    outcome = TerminalOutcome.FAILED
                elif not unlimited and retries > self._restart_policy.max_retries:
                    self._record.message = (
                        f"driver failed {retries} times; restartPolicy.maxRetries="
                        f"{self._restart_policy.max_retries} exhausted"
                        + (f"; last error: {error[0]}" if error else "")
                    )
                    outcome = TerminalOutcome.FAILED
                else:
                    repeating = error if early else None
                    delay = restart_delay(self._restart_policy, retries)
                    self._notify(
                        "DriverFailed",
                        Level.WARNING,
                        f"driver failed ({describe_exit(exit_code)}); "
                        f"restart {retries} in {delay:.0f}s" + _error_lines(error),
                    )
                    await self._set_phase(JobPhase.RESTARTING)
                    await self._sleep_unless_stopped(delay)
                    if (stopped := self._stopped_meanwhile()) is None:
                        continue
                    outcome = stopped
            elif error:
                self._record.message += f": {error[0]}"
            if outcome is TerminalOutcome.FAILED and error:
                self._notify(
                    "DriverFailed",
                    Level.WARNING,
                    f"driver failed ({describe_exit(exit_code)})" + _error_lines(error),
                )
            await self._terminate(outcome)
            return outcome

    async def _sleep_unless_stopped(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), delay)

    def _stopped_meanwhile(self) -> TerminalOutcome | None:
        """Cancelled, suspended or shut down while no driver ran (a restart's backoff)."""
        if self._cancelled or self._shutting_down:
            self._record.message = self._stop_message()
            return TerminalOutcome.CANCELLED
        return TerminalOutcome.SUSPENDED if self._suspend_on_exit else None

    def _stop_message(self) -> str:
        return "the job was deleted" if self._shutting_down else "cancelled by the user"

    async def retire(self, outcome: TerminalOutcome) -> None:
        """End a job that has no driver (deleted while suspended): its retention policy
        and garbage collection are carried out by the janitor."""
        await self._terminate(outcome)

    def shut_down(self, *, savepoint: bool, drain: bool) -> None:
        """The job is being deleted: a final savepoint if asked (and possible), then the
        job ends Cancelled, so its retention policy applies as to a cancellation."""
        self._shutting_down = True
        self._stop_requested.set()
        if savepoint and self._driver is not None and self._record.phase is JobPhase.RUNNING:
            after = AfterCompletion.DRAIN if drain else AfterCompletion.STOP
            self.request(TriggerRequested(CheckpointKind.SAVEPOINT, after=after, label=FINAL_LABEL))
        else:
            self.cancel()

    def cancel(self) -> None:
        """Stop now, without a savepoint (a second Ctrl-C): the job ends Cancelled."""
        self._cancelled = True
        self._stop_driver()

    def suspend_now(self) -> None:
        """Stop without a savepoint, ending Suspended: for a job that is not Running (a
        driver starting, restoring or in a restart's backoff), whose newest image is
        what it would resume from anyway."""
        self._suspend_on_exit = True
        self._stop_driver()

    def _stop_driver(self) -> None:
        self._stop_requested.set()
        if self._driver is not None:
            self._stopping = asyncio.get_running_loop().create_task(self._driver.terminate())

    def _outcome(self, exit_code: int) -> TerminalOutcome | None:
        """The terminal outcome of a driver exit, or None to restart it."""
        if self._cancelled or self._shutting_down:
            self._record.message = self._stop_message()
            return TerminalOutcome.CANCELLED
        if self._suspend_on_exit:
            # A stop-with-savepoint whose completion could not be delivered: the savepoint
            # is registered, and the driver was stopped here instead of by its agent.
            return TerminalOutcome.SUSPENDED
        if self._failing is not None:
            self._record.message = self._failing
            if not self._agent_answered:
                return TerminalOutcome.FAILED  # its agent never answered: a retry cannot help
        if exit_code == DriverExit.FINISHED:
            return TerminalOutcome.FINISHED
        if exit_code == DriverExit.STOPPED_WITH_SAVEPOINT:
            return TerminalOutcome.SUSPENDED
        if exit_code in (DriverExit.MISCONFIGURED, DriverExit.RESTORE_FAILED):
            self._record.message = f"driver cannot run: {DriverExit(exit_code).name}"
            return TerminalOutcome.FAILED
        if self._failed_restore(exit_code) is not None:
            return None  # a fallback, whatever the restart policy
        if self._restart_policy.type is RestartPolicyType.NEVER:
            self._record.message = (
                f"driver failed ({describe_exit(exit_code)}); restartPolicy is Never"
            )
            return TerminalOutcome.FAILED
        return None

    async def _run_attempt(self, adopted: DriverHandle | None) -> int:
        if adopted is None:
            driver = await self._launch()
        else:
            driver = adopted
            # Running again once its agent answers: the new coordinator starts its scheduler then.
            self._record.phase = JobPhase.DEPLOYING
            ended = driver.exit_code()
            self._notify(
                "DriverAdopted",
                Level.NOTE,
                f"resumed with the running driver of attempt {self._record.attempt}"
                if ended is None
                else f"the driver of attempt {self._record.attempt} exited with {ended} "
                "while the runtime was down",
            )
        self._driver = driver
        await self._persist()  # status now names the driver
        self._final_requested = False
        self._input_exhausted_at = None
        self._finishing = False
        self._garbage_collected = False
        # An adopted driver's restore is in the record already.
        self._restore_recorded = adopted is not None
        self._unconfirmed_restore = None
        self._completed_in_attempt = []
        self._failing = None
        # An adopted driver's agent answered before this runtime restarted.
        self._agent_answered = adopted is not None
        self._attempt_started = time.monotonic()
        self._first_batch = None
        self._batches_advanced = False
        self._suspending_since = None
        if self._stop_requested.is_set():
            self._stop_driver()  # asked to stop while the driver was being started
        try:
            answer: _Answer | None = None  # a status a long poll brought
            while (exit_code := driver.exit_code()) is None:
                version = await self._poll(driver, answer)
                answer = await self._wait(driver, version)
        finally:
            self._driver = None
        if exit_code in (DriverExit.FINISHED, DriverExit.STOPPED_WITH_SAVEPOINT):
            self._confirm_restore()  # e.g. a bounded query with nothing left to run
        # Only here: an error or a cancellation of `run` (the runtime itself stopping) leaves
        # the driver running for the next runtime process to adopt.
        await driver.terminate()
        await self._leave_running()
        return exit_code

    async def _launch(self) -> DriverHandle:
        # A check under way is of the newest image, the one a restore would pick: its
        # verdict is waited for rather than a driver started on an image about to be
        # found unrestorable.
        await self._checks_done()
        self._record.attempt += 1
        candidates = self._restore_candidates()
        self._candidates = candidates
        # Persisted before the driver exists: a restarted runtime knows which attempt's
        # driver may be running and never starts a second one for it.
        await self._set_phase(JobPhase.DEPLOYING)
        self._notify(
            "DriverStarting",
            Level.NOTE,
            f"starting driver attempt {self._record.attempt}"
            + (f", restoring from {candidates[0]}" if candidates else ""),
        )
        return await self._launcher.launch(self._record.attempt, candidates)

    def _images(self) -> list[str]:
        """What the job restores from, newest first: its registered images, else the
        initial savepoint."""
        images = [
            f"{c.kind.value}:{c.checkpoint_id}" for c in self._coordinator.restore_candidates()
        ]
        if not images and self._initial_savepoint:
            images = [f"external:{self._initial_savepoint}"]
        return images

    def _restore_candidates(self) -> list[str]:
        """The images the next driver may restore from, newest first, without those a
        restored query failed on. Raises `NoRestorableImage` when only those are left."""
        images = self._images()
        # Entries of images retention has discarded since are of no use any more.
        self._record.unrestorable = [
            entry for entry in self._record.unrestorable if entry["source"] in images
        ]
        failed = {entry["source"] for entry in self._record.unrestorable}
        candidates = [image for image in images if image not in failed]
        if images and not candidates:
            reasons = "; ".join(
                f"{entry['source']}: {entry['reason']}" for entry in self._record.unrestorable
            )
            raise NoRestorableImage(f"no restorable image left: {reasons}")
        return candidates

    def _failed_restore(self, exit_code: int) -> str | None:
        """The image the driver's query failed on, if it says so (RESTORE_UNUSABLE) and
        restored one."""
        if exit_code != DriverExit.RESTORE_UNUSABLE:
            return None
        if self._unconfirmed_restore is not None:
            return str(self._unconfirmed_restore["source"])
        if self._candidates:
            # The driver died before its agent was asked: every candidate before the one it
            # restored was one it could not read, so the first is unusable in any case.
            return self._candidates[0]
        if self._record.restored_from is not None:  # an adopted driver's
            return str(self._record.restored_from["source"])
        return None

    async def _mark_unrestorable(self, source: str) -> None:
        """The restored query failed on its image before it committed a batch: that image,
        and any checkpoint this attempt took of it, are never restored again."""
        reason = (
            f"its restored query failed in attempt {self._record.attempt} before committing "
            "a batch, on an error that points at the checkpoint (the driver's log has it)"
        )
        for image in (source, *self._completed_in_attempt):
            self._record.unrestorable.append(
                {"source": image, "reason": reason, "attempt": self._record.attempt}
            )
        self._record.failed_restores += 1
        failed = {entry["source"] for entry in self._record.unrestorable}
        following = next((image for image in self._images() if image not in failed), None)
        self._record.message = f"{source} cannot be restored: {reason}; " + (
            f"falling back to {following}" if following else "no older image is left"
        )
        self._notify("RestoreFailed", Level.WARNING, self._record.message)
        await self._persist()

    def _confirm_restore(self) -> None:
        """A restore succeeded once the restored query got past its image (the agent
        reports it running: it committed a batch after the image's, or completed a trigger
        without new data), or ended cleanly: only then is it counted."""
        if self._unconfirmed_restore is not None:
            self._unconfirmed_restore = None
            self._record.restores += 1
            self._observer.restored()

    async def _wait(self, driver: DriverHandle, version: int | None) -> _Answer | None:
        """Until the next status is due. A user request is handled (and None returned:
        ask for status now). With the ``version`` of the last status, the agent is asked
        to answer once its status changes (a long poll), at the latest at the
        coordinator's next deadline, and its answer is returned. Without one (no answer,
        or an agent that cannot long-poll), this sleeps an interval as before."""
        idle = self._record.phase is JobPhase.RUNNING and not self._coordinator.pending
        interval = self._idle_poll_interval if idle else POLL_INTERVAL
        deadline = self._coordinator.next_deadline()
        limit = interval if version is None else LONG_POLL_SECONDS
        delay = limit if deadline is None else min(limit, deadline - time.time())
        request = asyncio.ensure_future(self._requests.get())
        waiting: set[asyncio.Future[Any]] = {request}
        poll = None
        if version is not None:
            poll = asyncio.ensure_future(self._long_poll(driver, version, delay))
            waiting.add(poll)
        try:
            while True:
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=interval if poll else max(0.0, delay),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                # The driver's exit and its executors are not in the agent's status: they
                # are looked at every interval while a long poll waits.
                if done or poll is None or self._driver_changed(driver):
                    break
        finally:
            for task in waiting:
                task.cancel()  # a cancelled long poll closes its connection
            await asyncio.gather(*waiting, return_exceptions=True)
        if not request.cancelled() and (event := request.result()) is not None:
            await self._handle(event)
        return None if poll is None or poll.cancelled() else poll.result()

    def _driver_changed(self, driver: DriverHandle) -> bool:
        return (
            driver.exit_code() is not None
            or driver.executors_ready() != self._executors_ready
            or self._stalled_stopping()
        )

    async def _long_poll(self, driver: DriverHandle, version: int, delay: float) -> _Answer:
        # Never past the deadline: a due periodic trigger is not held back.
        pause = max(0.0, min(self._last_status + STATUS_GAP_SECONDS - time.monotonic(), delay))
        if pause:
            await asyncio.sleep(pause)
        return await self._status(driver, version, max(0.0, delay - pause))

    async def _status(
        self, driver: DriverHandle, after: int | None = None, wait: float = 0.0
    ) -> _Answer:
        try:
            return await driver.agent.status(after=after, wait=wait)
        except (AgentUnavailable, AgentRejected) as error:
            return error
        finally:
            self._last_status = time.monotonic()

    async def _poll(self, driver: DriverHandle, answer: _Answer | None = None) -> int | None:
        """Act on a status of the agent: ``answer`` (from a long poll), or one asked for
        now. Returns the status's version; None when there is none to long-poll after."""
        if answer is None:
            answer = await self._status(driver)
        if isinstance(answer, Exception):
            await self._agent_lost()
            await self._tick()
            await self._give_up_on_a_silent_agent(driver)
            return None
        self._agent_answered = True
        await self._process(driver, answer)
        version = answer.get("version")
        return version if isinstance(version, int) else None  # an older agent: no version

    async def _give_up_on_a_silent_agent(self, driver: DriverHandle) -> None:
        timeout = self._agent_start_timeout
        waited = time.monotonic() - self._attempt_started
        if self._agent_answered or timeout is None or waited < timeout or self._failing:
            return
        self._failing = (
            f"the driver's checkpoint agent never answered in {timeout:.0f}s: does the "
            "pipeline start its query with run_coordinated(writer, participants=[...]) "
            "instead of writer.start()?"
        )
        self._notify("AgentNeverAnswered", Level.WARNING, f"{self._failing} Stopping the driver.")
        await driver.terminate()

    async def _process(self, driver: DriverHandle, status: dict[str, Any]) -> None:
        if not self._garbage_collected:
            # Before the first trigger of an attempt: whatever a crash left in storage that
            # the registry does not list goes now, while no snapshot is in flight.
            self._garbage_collected = True
            try:
                report = await driver.agent.collect_garbage(*self._registered())
            except (AgentUnavailable, AgentRejected) as error:
                self._notify(
                    "GarbageCollectionSkipped",
                    Level.WARNING,
                    f"garbage collection skipped: {error}",
                )
                report = {"checkpoints": [], "sharedFiles": 0}
            if report["checkpoints"] or report["sharedFiles"]:
                self._notify(
                    "GarbageCollected",
                    Level.NOTE,
                    f"removed unregistered checkpoints {report['checkpoints']} and "
                    f"{report['sharedFiles']} unreferenced shared files",
                )
        query = status["query"]
        self._record.last_batch = query.get("lastCommittedBatch")
        if self._first_batch is None:
            self._first_batch = (self._record.last_batch,)
        elif self._first_batch != (self._record.last_batch,):
            self._batches_advanced = True
        if not self._restore_recorded:
            self._restore_recorded = True
            self._record.restored_from = status.get("restoredFrom")
            if self._record.restored_from:
                self._unconfirmed_restore = self._record.restored_from
                self._notify(
                    "Restored", Level.NOTE, f"restored from {self._record.restored_from['source']}"
                )
                for skipped in self._record.restored_from["skipped"]:
                    self._notify(
                        "RestoreSkipped",
                        Level.WARNING,
                        f"skipped {skipped['source']}: {skipped['reason']}",
                    )
        if query["state"] in ("running", "finished"):
            # A restored query is reported "restoring" until it got past its image.
            self._confirm_restore()
        self._executors_ready = driver.executors_ready()
        all_running = status["allTasksRunning"] and self._executors_ready
        await self._handle(TasksReported(frozenset(status["tasks"]), all_running))
        leaving = self._record.phase is JobPhase.SUSPENDING or self._finishing
        if leaving and self._stalled_stopping():
            # Its savepoint is registered; a driver that does not stop on its own is.
            self._notify("StopTimedOut", Level.WARNING, "the driver did not stop: stopping it")
            self.suspend_now()
        running = query["state"] in ("running", "finished")
        if running and not leaving and self._record.phase is not JobPhase.RUNNING:
            self._record.message = ""  # why an earlier attempt ended is in its events
            await self._set_phase(JobPhase.RUNNING)
            await self._handle(JobPhaseChanged(JobPhase.RUNNING))
        known = {p.checkpoint_id for p in self._coordinator.pending}
        known.update(*self._registered())
        in_flight = {int(snapshot["id"]) for snapshot in status["checkpoints"]}
        for snapshot in status["checkpoints"]:
            if int(snapshot["id"]) in known:
                await self._feed_progress(snapshot)
            else:
                await self._drop_unknown(driver, int(snapshot["id"]))
        self._forget_done(in_flight)
        if status["awaitingFinalCheckpoint"] and not self._final_requested:
            await self._on_input_exhausted(driver, query["lastCommittedBatch"])
        await self._tick()

    async def _on_input_exhausted(self, driver: DriverHandle, last: int) -> None:
        """Bounded input is done at batch ``last``: its final checkpoint."""
        self._final_requested = True
        self._input_exhausted_at = last
        covering = [c for c in self._coordinator.persisted_state.checkpoints if c.batch_id >= last]
        if covering:
            # One completed after this status was written: the driver is told of it
            # (again) instead of a new one being triggered that its exit would cut short.
            self._notify(
                "FinalCheckpoint",
                Level.NOTE,
                f"input exhausted at batch {last}: checkpoint {covering[-1].checkpoint_id} "
                "covers it",
            )
            await self._notify_complete(driver, covering[-1])
        else:
            self._notify(
                "FinalCheckpoint",
                Level.NOTE,
                f"input exhausted at batch {last}: final checkpoint",
            )
            await self._handle(
                TriggerRequested(CheckpointKind.CHECKPOINT, forced=True, label=FINAL_LABEL)
            )

    async def _tick(self) -> None:
        due = self._coordinator.next_periodic_trigger
        now = time.time()
        if due is not None and due <= now:
            self._observer.late(now - due)
        await self._handle(Tick())

    async def _feed_progress(self, snapshot: dict[str, Any]) -> None:
        checkpoint_id = int(snapshot["id"])
        for ack in snapshot["acks"]:
            key = (checkpoint_id, ack["task"])
            if key not in self._fed_acks:
                self._fed_acks.add(key)
                task_ack = TaskAck(ack["task"], ack["batchId"], ack["sizeBytes"], ack["durationMs"])
                await self._handle(TaskAcknowledged(checkpoint_id, task_ack))
        for decline in snapshot["declines"]:
            key = (checkpoint_id, decline["task"])
            if key not in self._fed_declines:
                self._fed_declines.add(key)
                await self._handle(TaskDeclined(checkpoint_id, decline["task"], decline["message"]))

    def _forget_done(self, in_flight: set[int]) -> None:
        """What was fed of snapshots the agent no longer lists is never fed again: a job
        runs for months, these sets must not grow with it."""
        self._fed_acks = {key for key in self._fed_acks if key[0] in in_flight}
        self._fed_declines = {key for key in self._fed_declines if key[0] in in_flight}
        self._aborted_unknown &= in_flight

    def _stalled_stopping(self) -> bool:
        since = self._suspending_since
        return since is not None and time.monotonic() - since > STOPPED_DRIVER_EXIT_SECONDS

    async def _drop_unknown(self, driver: DriverHandle, checkpoint_id: int) -> None:
        """A snapshot the coordinator neither waits for nor registered: triggered before
        this runtime restarted, or aborted while the agent was unreachable. The agent
        drops it and unpins its files; its id is never used again."""
        if checkpoint_id not in self._aborted_unknown:
            self._aborted_unknown.add(checkpoint_id)
            await self._abort(driver, checkpoint_id, "not a pending checkpoint of the coordinator")

    async def _agent_lost(self) -> None:
        """The driver process is there but its agent does not answer (starting, stopping,
        or dying): the job is not Running, so nothing is triggered and pending checkpoints
        are aborted without counting as failures (Flink's deactivator)."""
        if self._record.phase is JobPhase.RUNNING:
            await self._set_phase(JobPhase.DEPLOYING)
            await self._handle(JobPhaseChanged(JobPhase.DEPLOYING))

    async def _leave_running(self) -> None:
        await self._handle(JobPhaseChanged(JobPhase.RESTARTING))

    def _registered(self) -> tuple[list[int], list[int]]:
        state = self._coordinator.persisted_state
        return (
            [c.checkpoint_id for c in state.checkpoints],
            [s.checkpoint_id for s in state.savepoints],
        )

    def _check_newest(self, image: str) -> None:
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
        assert self._restorable_check is not None
        while (image := self._to_check) is not None:
            self._to_check = None
            started = time.monotonic()
            try:
                problems = await self._restorable_check.problems(image)
            except CheckUnavailable as error:
                self._notify(
                    "RestorableCheckSkipped", Level.WARNING, f"could not check {image}: {error}"
                )
                continue
            seconds = time.monotonic() - started
            recorded = {entry["source"] for entry in self._record.unrestorable}
            if image not in self._images() or image in recorded:
                continue  # discarded by retention meanwhile, or a restore found it already
            if not problems:
                self._notify(
                    "ImageRestorable", Level.DETAIL, f"{image} is restorable ({seconds:.0f}s)"
                )
                continue
            reason = "the restorable check after it completed found: " + "; ".join(problems)
            self._record.unrestorable.append(
                {"source": image, "reason": reason, "attempt": self._record.attempt}
            )
            self._notify(
                "ImageUnrestorable",
                Level.WARNING,
                f"{image} is not restorable, restores skip it: " + "; ".join(problems),
            )
            await self._persist()

    async def _terminate(self, outcome: TerminalOutcome) -> None:
        if self._checking is not None:
            self._checking.cancel()  # no restore follows
            await asyncio.gather(self._checking, return_exceptions=True)
            self._checking = self._to_check = None
        # The phase is stored with the termination, before the cleanup (which may take
        # minutes): a restarted runtime never runs a finished job again.
        self._record.phase = JobPhase(outcome.value)
        await self._handle(JobTerminated(outcome))
        await self._clean_up(self._janitor.collect_garbage(*self._registered()))
        await self._persist()
        self._notify(
            f"Job{outcome.value}",
            Level.WARNING if outcome is TerminalOutcome.FAILED else Level.NOTE,
            f"job {outcome.value.lower()}"
            + (f": {self._record.message}" if self._record.message else ""),
        )

    async def _set_phase(self, phase: JobPhase) -> None:
        self._record.phase = phase
        await self._persist()

    async def _persist(self) -> None:
        self._record.coordinator = self._coordinator.persisted_state
        self._record.consecutive_failures = self._coordinator.consecutive_failures
        self._record.next_checkpoint_id = self._coordinator.next_checkpoint_id
        self._record.pending = [
            {
                "id": p.checkpoint_id,
                "kind": p.kind.value,
                "acknowledged": p.acknowledged,
                "expected": p.expected,
            }
            for p in self._coordinator.pending
        ]
        await self._save(self._record)

    # ------------------------------------------------------------------ effects

    async def _handle(self, event: Event) -> None:
        for effect in self._coordinator.handle(event):
            await self._carry_out(effect)

    async def _carry_out(self, effect: Effect) -> None:
        driver = self._driver
        match effect:
            case PersistState():
                await self._persist()
            case TriggerCheckpoint():
                # Kept current without a state write: a coordinator that replaces this one
                # in this process continues from it (see JobRecord.next_checkpoint_id).
                self._record.next_checkpoint_id = self._coordinator.next_checkpoint_id
                await self._trigger(driver, effect)
            case FinalizeCheckpoint(checkpoint_id=cid, tasks=tasks):
                await self._finalize(driver, cid, sorted(tasks))
            case NotifyCheckpointComplete(checkpoint=completed, sinks_may_commit=commit):
                image = f"{completed.kind.value}:{completed.checkpoint_id}"
                self._completed_in_attempt.append(image)
                self._check_newest(image)
                self._observer.completed(completed)
                self._notify(
                    _completion_reason(completed),
                    Level.NOTE if completed.kind is CheckpointKind.SAVEPOINT else Level.DETAIL,
                    f"{_describe_completion(completed)} (query at batch {self._record.last_batch})",
                )
                if completed.checkpoint_id in self._stopping_savepoints:
                    # The agent stops the query now: nothing more is triggered.
                    self._suspending_since = time.monotonic()
                    await self._set_phase(JobPhase.SUSPENDING)
                    await self._handle(JobPhaseChanged(JobPhase.SUSPENDING))
                if commit:
                    # A savepoint the job continues after is done once its metadata is
                    # written; the agent hears nothing more of it (docs/coordinator.md).
                    await self._notify_complete(driver, completed)
            case AbortCheckpoint(checkpoint_id=cid, kind=kind, reason=reason, message=message):
                self._observer.failed(kind, reason.value)
                self._report_abort(kind, cid, reason, message)
                await self._abort(driver, cid, message)
                if self._shutting_down and cid in self._stopping_savepoints:
                    self.cancel()  # no final savepoint: the job is deleted without one
            case DiscardCheckpoint(checkpoint_id=cid, retained=retained):
                await self._discard(
                    f"checkpoint {cid}",
                    driver,
                    lambda agent: agent.discard_checkpoint(cid, list(retained)),
                    lambda: self._janitor.discard_checkpoint(cid, list(retained)),
                )
            case DiscardSavepoint(savepoint=savepoint):
                sid = savepoint.checkpoint_id
                await self._discard(
                    f"savepoint {sid}",
                    driver,
                    lambda agent: agent.discard_savepoint(sid),
                    lambda: self._janitor.discard_savepoint(sid),
                )
            case RequestDeclined(request=request, reason=reason):
                if self._shutting_down and request.after is not AfterCompletion.CONTINUE:
                    self.cancel()
                if not request.is_periodic:
                    self._report_declined(request, reason)
            case FailJob(message=message):
                self._notify("FailingJob", Level.WARNING, f"failing the job: {message}")
                if driver is not None and self._failing is None:
                    self._failing = message
                    await driver.terminate()
            case _:
                # Every effect is carried out: a new one fails the type check here.
                assert_never(effect)

    def _report_abort(
        self, kind: CheckpointKind, cid: int, reason: FailureReason, message: str
    ) -> None:
        if self._finishing and reason is FailureReason.COORDINATOR_SUSPEND:
            self._notify(
                "CheckpointNotNeeded",
                Level.DETAIL,
                f"{kind.value} {cid} given up: the input is done and a completed checkpoint "
                "covers its last batch",
            )
        else:
            self._notify("CheckpointFailed", Level.WARNING, f"{kind.value} {cid} failed: {message}")

    def _report_declined(self, request: TriggerRequest, reason: FailureReason) -> None:
        if self._finishing and request.label == FINAL_LABEL:
            self._notify(
                "CheckpointNotNeeded",
                Level.DETAIL,
                "final checkpoint not needed: a completed checkpoint covers the last batch",
            )
        else:
            self._notify(
                "RequestDeclined",
                Level.WARNING,
                f"{request.kind.value} request declined: {reason.description}",
            )

    async def _trigger(self, driver: DriverHandle | None, effect: TriggerCheckpoint) -> None:
        if driver is None or self._record.phase is not JobPhase.RUNNING:
            return  # the agent was lost meanwhile: the coordinator aborted it
        cid, kind, after = effect.checkpoint_id, effect.kind, effect.after
        self._notify("CheckpointTriggered", Level.DETAIL, f"trigger {kind.value} {cid}")
        if after is not AfterCompletion.CONTINUE:
            self._stopping_savepoints.add(cid)
        try:
            await driver.agent.trigger(cid, kind.value, after.value)
        except AgentUnavailable:
            await self._agent_lost()
        except AgentRejected as error:
            await self._handle(TriggerDeliveryFailed(cid, str(error)))

    async def _finalize(self, driver: DriverHandle | None, cid: int, tasks: list[str]) -> None:
        if driver is None:
            return
        try:
            path, size = await driver.agent.finalize(cid, tasks)
        except AgentUnavailable:
            await self._agent_lost()
        except AgentRejected as error:
            await self._handle(FinalizationFailed(cid, str(error)))
        else:
            await self._handle(CheckpointFinalized(cid, path, size))

    async def _abort(self, driver: DriverHandle | None, cid: int, message: str) -> None:
        if driver is None:
            return
        try:
            await driver.agent.abort(cid, message)
        except (AgentUnavailable, AgentRejected) as error:
            # Nothing to undo: an agent that is still there lists the snapshot in its next
            # report and is told again (`_drop_unknown`); files of a dead one are garbage.
            self._notify(
                "AbortNotDelivered",
                Level.DETAIL,
                f"the driver did not take the abort of {cid} ({error}); nothing is lost: a "
                "running agent drops it at its next report, and its files are garbage-collected",
            )

    async def _notify_complete(
        self, driver: DriverHandle | None, completed: CompletedCheckpoint
    ) -> None:
        # A lost notification is recovered on restore: sinks commit what the restored,
        # registered image covers before the query starts.
        if driver is None:
            return
        end = self._input_exhausted_at
        covers_the_end = end is not None and completed.batch_id >= end
        if covers_the_end and completed.kind is CheckpointKind.CHECKPOINT and not self._finishing:
            # The driver exits once told: nothing more is triggered, and what the exit cuts
            # short is no failure.
            self._finishing = True
            await self._handle(JobPhaseChanged(JobPhase.FINISHED))
        try:
            await driver.agent.complete(completed.checkpoint_id, completed.batch_id)
        except (AgentUnavailable, AgentRejected) as error:
            what = f"{completed.kind.value} {completed.checkpoint_id}"
            self._notify(
                "CompletionNotDelivered",
                Level.DETAIL,
                f"the driver did not confirm the completion of {what} ({error}); nothing is "
                f"lost: {what} is registered, and sinks commit up to it when a driver restores it",
            )
            if completed.checkpoint_id in self._stopping_savepoints:
                # The agent would have stopped the query; the savepoint is registered, so
                # stop the driver from here and end suspended.
                self._suspend_on_exit = True
                await driver.terminate()

    async def _discard(
        self,
        what: str,
        driver: DriverHandle | None,
        through_agent: Callable[[AgentClient], Awaitable[object]],
        through_janitor: Callable[[], Awaitable[None]],
    ) -> None:
        """Storage is changed by the driver's agent while one runs, else by the janitor."""
        refused: AgentUnavailable | AgentRejected | None = None
        if driver is not None:
            try:
                await through_agent(driver.agent)
                return
            except (AgentUnavailable, AgentRejected) as error:
                refused = error  # the driver is stopping or gone: the janitor does it
        if await self._clean_up(through_janitor()) and refused is not None:
            self._notify(
                "DiscardedByJanitor",
                Level.DETAIL,
                f"the janitor discarded {what}: the driver's agent did not take it ({refused})",
            )

    async def _clean_up(self, work: Awaitable[None]) -> bool:
        """Whether the janitor did it; its failure is reported."""
        try:
            await work
        except CleanupFailed as error:
            self._notify("CleanupFailed", Level.WARNING, f"storage cleanup failed: {error}")
            return False
        return True


def describe_exit(exit_code: int) -> str:
    """A driver's exit as a person reads it: a negative code is the signal that killed it."""
    if exit_code >= 0:
        return f"exit {exit_code}"
    try:
        return f"killed by {signal.Signals(-exit_code).name}"
    except ValueError:
        return f"killed by signal {-exit_code}"


def _error_lines(error: list[str]) -> str:
    """A driver's error lines as the indented tail of a notice."""
    return "".join(f"\n    {line}" for line in ["its error:", *error]) if error else ""


def _completion_reason(completed: CompletedCheckpoint) -> str:
    return (
        "SavepointCompleted"
        if completed.kind is CheckpointKind.SAVEPOINT
        else "CheckpointCompleted"
    )


def _describe_completion(completed: CompletedCheckpoint) -> str:
    label = f" ({completed.label})" if completed.label else ""
    return (
        f"{completed.kind.value} {completed.checkpoint_id} complete{label}: batch "
        f"{completed.batch_id}, {completed.size_bytes / 1024:.1f} KiB, {completed.duration:.2f}s"
    )
