"""The state of one attempt (one driver), and of the job's stop request.

An attempt moves through `Stage`s, only by the named transitions of `Attempt`::

    STARTING --answered--> CONNECTED --finish--> FINISHING
    ADOPTED  --answered--> CONNECTED --suspend--> SUSPENDING --finish--> FINISHING

- STARTING: a driver this runtime started; its agent has not answered yet.
- ADOPTED: a driver from before this runtime restarted; its agent answered that runtime.
- CONNECTED: its agent answered this runtime (it answers while the driver restores and
  starts its query): storage was garbage-collected; the restore is recorded once the query
  started. The job's phase (Deploying, Running) follows the query's state from here.
- FINISHING: bounded input is done and a completed checkpoint covers its last batch: the
  driver is told (again, while it did not take it) and exits; nothing more is triggered, and
  what its exit cuts short is no failure.
- SUSPENDING: its stop-with-savepoint completed: the query stops and the driver exits.

A driver that has not exited `STOPPED_DRIVER_EXIT_SECONDS` after it began leaving (either
stage) is stopped from here (`leaving_overdue`).

Alongside the stage, an attempt may be failing (`fail`: its driver is being stopped for a
reason the job fails or restarts with), and its restore is unconfirmed until the restored
query got past its image (`restored`, `confirm_restore`). Every attempt ends with its
driver's exit; the next one starts from a new `Attempt`.
"""

import time
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from spark_checkpoint.protocol import QueryState, RestoredFrom
from spark_checkpoint_operator.coordinator import CompletedCheckpoint
from spark_checkpoint_operator.supervisor.ports import DriverHandle, StartProblem

# How long a driver may take to exit on its own after its stop-with-savepoint or final
# checkpoint completed; then it is stopped (see driver_command.TERMINATION_GRACE_SECONDS).
STOPPED_DRIVER_EXIT_SECONDS = 120.0
# How soon a final checkpoint's completion the driver did not take (a sink's commit failed)
# is sent again.
FINAL_COMPLETION_RETRY_SECONDS = 1.0


class Stage(Enum):
    STARTING = "starting"
    ADOPTED = "adopted"
    CONNECTED = "connected"
    FINISHING = "finishing"
    SUSPENDING = "suspending"


class StopRequest(IntEnum):
    """What the job was asked to stop for, the strongest request winning: a cancellation
    overrides a suspension, a deletion (which ends Cancelled too) overrides both."""

    NONE = 0
    SUSPEND = 1  # end Suspended: the newest image is what a resume restores
    CANCEL = 2  # end Cancelled, without a savepoint
    DELETE = 3  # the job is deleted: a final savepoint if asked, then Cancelled


@dataclass
class Attempt:
    driver: DriverHandle
    stage: Stage
    # The images the driver was started to restore from, newest first.
    candidates: list[str] = field(default_factory=list)
    # When its driver was first seen running (monotonic; a pod may wait for a node or an
    # image first), while its agent had not answered.
    running_since: float | None = None
    # Why the attempt is being failed (`fail`); None while it is not.
    failing: str | None = None
    # The image it restored from until the agent reports the query running or it ends
    # cleanly (`confirm_restore`); None: confirmed, or none.
    unconfirmed_restore: RestoredFrom | None = None
    # The restore its agent reported, from before the query starts on (kept once
    # confirmed): which image a failure before its first batch is of.
    reported_restore: RestoredFrom | None = None
    completed: list[str] = field(default_factory=list)  # images registered by this attempt
    # The last batch of bounded input, once the agent reported it (its final checkpoint
    # was requested, or one covering it was found).
    input_exhausted_at: int | None = None
    # The committed batch the attempt's first status showed (a tuple: it may be None),
    # and whether a later status showed another: the query made progress.
    first_batch: tuple[int | None] | None = None
    batches_advanced: bool = False
    executors_ready: bool = True  # as of the last status
    # The newest batch a completion the agent confirmed covers: its sinks may commit that far.
    told_batch: int | None = None
    # When a completion covering its last batch was last refused or not answered (monotonic).
    final_completion_refused_at: float | None = None
    # Since when it is leaving (FINISHING or SUSPENDING; monotonic), and whether it was
    # stopped for taking too long.
    leaving_since: float | None = None
    stopped_overdue: bool = False
    # The stop-with-savepoint that completed (SUSPENDING), which the next run resumes from.
    stopped_with: CompletedCheckpoint | None = None
    # The first status request its agent did not answer since the last it did (monotonic).
    unanswered_since: float | None = None
    # What keeps the driver from starting, as last reported (`kept_from_starting`).
    start_problem: StartProblem | None = None
    # Since when its agent reports the driver restoring and starting its query (monotonic;
    # None once the query started), and whether a start longer than the start timeout was
    # told (`slow_start_due`).
    starting_since: float | None = None
    slow_start_told: bool = False
    # A driver from before this runtime restarted (`adopted`).
    adopted_driver: bool = False
    # Its agent reported its query's state in this runtime, and whether the last one it
    # reported runs its tasks.
    query_reported: bool = False
    query_running: bool = False

    @classmethod
    def launched(cls, driver: DriverHandle, candidates: list[str]) -> "Attempt":
        return cls(driver, Stage.STARTING, candidates)

    @classmethod
    def adopted(cls, driver: DriverHandle) -> "Attempt":
        return cls(driver, Stage.ADOPTED, driver.restore_candidates(), adopted_driver=True)

    # ------------------------------------------------------------------ queries

    @property
    def agent_answered(self) -> bool:
        """In this runtime or, for an adopted driver, the one before."""
        return self.stage is not Stage.STARTING

    @property
    def finishing(self) -> bool:
        return self.stage is Stage.FINISHING

    @property
    def may_run_query(self) -> bool:
        """Its driver runs, and so may its query, though the job is not Running now: the
        query ran when its agent last answered, or the driver was adopted and its agent has
        not told this runtime its query's state yet (it runs, or it restores). Not once the
        driver is being stopped here (`fail`)."""
        if self.leaving or self.failing is not None or self.driver.exit_code() is not None:
            return False
        unknown = self.adopted_driver and not self.query_reported and self.driver.started()
        return self.query_running or unknown

    @property
    def leaving(self) -> bool:
        """The driver exits on its own now: no phase change brings it back to Running."""
        return self.stage in (Stage.FINISHING, Stage.SUSPENDING)

    def running_for(self) -> float:
        """How long the driver has run without its agent ever answering; 0 once it answered
        (an adopted one: in the runtime before) or while it does not run yet."""
        if self.stage is not Stage.STARTING:
            return 0.0
        if self.running_since is None and self.driver.started():
            self.running_since = time.monotonic()
        return 0.0 if self.running_since is None else time.monotonic() - self.running_since

    def starting_for(self) -> float:
        """How long its agent has reported the driver starting; 0 once the query started."""
        since = self.starting_since
        return 0.0 if since is None else time.monotonic() - since

    def slow_start_due(self, timeout: float) -> bool:
        """Its agent has reported the driver starting for ``timeout``, and nobody was told."""
        since = self.starting_since
        return (
            not self.slow_start_told and since is not None and time.monotonic() - since >= timeout
        )

    def silent_for(self) -> float:
        """How long its agent, having answered this runtime, has answered no status
        request; 0 while it answers. An adopted driver counts only once it answered: the
        runtime before may have recorded it before its pod ran or its agent started."""
        since = self.unanswered_since
        if self.stage is not Stage.CONNECTED or since is None:
            return 0.0
        return time.monotonic() - since

    def leaving_overdue(self) -> bool:
        """Leaving for longer than a driver takes to exit, and not stopped for it yet."""
        since = self.leaving_since
        return (
            not self.stopped_overdue
            and since is not None
            and time.monotonic() - since > STOPPED_DRIVER_EXIT_SECONDS
        )

    def told_final(self) -> bool:
        """The driver confirmed a completion covering its last batch: its sinks committed
        all of its output."""
        end, told = self.input_exhausted_at, self.told_batch
        return self.finishing and end is not None and told is not None and told >= end

    def final_completion_due(self) -> bool:
        """A completion covering its last batch, refused or unanswered, is to be sent again:
        also one refused while a stop-with-savepoint was in flight (the attempt did not
        finish then), for the driver waits for it if that savepoint fails."""
        end, told, refused = (
            self.input_exhausted_at,
            self.told_batch,
            self.final_completion_refused_at,
        )
        return (
            end is not None
            and (told is None or told < end)
            and refused is not None
            and time.monotonic() - refused >= FINAL_COMPLETION_RETRY_SECONDS
        )

    # ------------------------------------------------------------------ transitions

    def answered(self) -> Stage:
        """The agent answered; returns the stage before (STARTING or ADOPTED: its first
        answer in this runtime)."""
        before = self.stage
        if before in (Stage.STARTING, Stage.ADOPTED):
            self.stage = Stage.CONNECTED
        self.replied()
        return before

    def replied(self) -> None:
        """Its agent answered a status request, if only with a refusal: it is not silent."""
        self.unanswered_since = None

    def unanswered(self) -> None:
        """A status request reached no agent (no connection, or no answer in time)."""
        if self.unanswered_since is None:
            self.unanswered_since = time.monotonic()

    def kept_from_starting(self, problem: StartProblem | None) -> bool:
        """What keeps the driver from starting now (None: nothing the runtime reports, or
        its agent answered in this runtime); whether that changed since the last report."""
        if self.stage not in (Stage.STARTING, Stage.ADOPTED):
            problem = None
        changed = problem != self.start_problem
        self.start_problem = problem
        return changed

    @property
    def has_batch(self) -> bool:
        """Its query reported a committed batch (its own, or its restored image's)."""
        return self.batches_advanced or self.first_batch not in (None, (None,))

    def saw_batch(self, batch: int | None) -> None:
        if self.first_batch is None:
            self.first_batch = (batch,)
        elif self.first_batch != (batch,):
            self.batches_advanced = True

    def reported_query(self, state: QueryState) -> None:
        """Its agent reported its query in `state` (restoring and starting, running...)."""
        self.query_reported = True
        self.query_running = state.runs_tasks
        if state is not QueryState.STARTING:
            self.starting_since = None
        elif self.starting_since is None:
            self.starting_since = time.monotonic()

    def restored(self, restore: RestoredFrom) -> None:
        self.unconfirmed_restore = restore

    def confirm_restore(self) -> bool:
        """Whether this confirms the restore (it had one, unconfirmed until now)."""
        confirms = self.unconfirmed_restore is not None
        self.unconfirmed_restore = None
        return confirms

    def finish(self) -> bool:
        """The driver is told that a completed checkpoint covers its input's end; False
        when it was told already."""
        if self.stage is Stage.FINISHING:
            return False
        self.stage = Stage.FINISHING
        self.leaving_since = time.monotonic()
        return True

    def suspend(self, savepoint: CompletedCheckpoint) -> None:
        """Its stop-with-savepoint ``savepoint`` completed: the agent stops the query now."""
        self.stage = Stage.SUSPENDING
        self.stopped_with = savepoint
        self.leaving_since = time.monotonic()

    def fail(self, message: str) -> bool:
        """Fail the attempt for ``message``; False when it is failing already (the first
        reason stays)."""
        if self.failing is not None:
            return False
        self.failing = message
        return True
