"""What `spark-checkpoint run` shows while it runs, and its summary at the end.

Events (a checkpoint completed, a failure, a restore) are lines. On a terminal a live
status line stays under them: phase, attempt, the query's batch and input rate, the last
checkpoint, the next trigger and failures, or that Spark is starting. Elsewhere (a pipe, a
log file) every line starts with the wall-clock time and nothing else is written: no
control codes. The summary counts this run only, not the job's earlier runs.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from spark_checkpoint.protocol import AgentStatus, QueryState
from spark_checkpoint_operator.cli_conventions import discard_output
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CompletedCheckpoint,
    JobPhase,
    TerminalOutcome,
)
from spark_checkpoint_operator.status import newest_completion
from spark_checkpoint_operator.storage_commands.rendering import (
    human_age,
    human_size,
    short_duration,
)
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor, Notice

# How often the driver's agent is asked for the query's progress, for the live line and
# the summary (each answer walks Spark's recentProgress when a batch ran since the last).
SAMPLE_SECONDS = 1.0
COMPLETED = {
    "CheckpointCompleted": CheckpointKind.CHECKPOINT,
    "SavepointCompleted": CheckpointKind.SAVEPOINT,
}
# A checkpoint given up because the input is done is no failure (`CheckpointNotNeeded`).
FAILED = "CheckpointFailed"
# An image the driver could not read (skipped), or whose restored query failed (fallen
# back from): a run that fell back past two images says "1 restore (2 images failed)".
RESTORE_FAILED = frozenset({"RestoreSkipped", "RestoreFailed"})


def wall_clock(at: float) -> str:
    """The time stamp of a line without a terminal: local wall-clock time with its UTC
    offset (status and `list` say UTC times: a log is read beside them)."""
    return datetime.fromtimestamp(at).astimezone().isoformat(sep=" ", timespec="seconds")


@dataclass
class RunTally:
    """What this run did, counted from its own notices and the statuses of its drivers."""

    completed: dict[CheckpointKind, int] = field(
        default_factory=lambda: dict.fromkeys(CheckpointKind, 0)
    )
    failed: int = 0
    failed_images: set[str] = field(default_factory=set)  # that could not be restored
    # Per driver attempt: the batches its query committed and the input rows it read, the
    # highest seen (a restored query starts after its image's batch).
    batches: dict[int, int] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)

    def notice(self, notice: Notice) -> None:
        if notice.reason in COMPLETED:
            self.completed[COMPLETED[notice.reason]] += 1
        elif notice.reason == FAILED:
            self.failed += 1
        elif notice.reason in RESTORE_FAILED:
            self.failed_images.add(notice.image)

    def status(self, status: AgentStatus) -> None:
        last = status.query.last_committed_batch
        if last is not None:
            before = -1 if status.restored_from is None else status.restored_from.batch_id
            batches = max(0, last - before)
            self.batches[status.attempt] = max(self.batches.get(status.attempt, 0), batches)
        if status.query.progress is not None:
            rows = status.query.progress.total_input_rows
            self.rows[status.attempt] = max(self.rows.get(status.attempt, 0), rows)


class RunDisplay:
    """The output of one `spark-checkpoint run` on ``stream``: a live status line when it
    is a terminal, plain time-stamped lines otherwise."""

    def __init__(self, stream: TextIO, fallback: TextIO | None = None) -> None:
        self._console = Console(file=stream, highlight=False, soft_wrap=True)
        self._stream = stream
        # Where the lines go once the reader of ``stream`` is gone (``run ... | head``).
        self._fallback = fallback
        self._gone = False  # no stream is left
        self._on_closed: Callable[[], object] | None = None
        self.closed = False
        self.live = self._console.is_terminal and not self._console.is_dumb_terminal
        self._live: Live | None = None
        self._tally = RunTally()
        self._starting: float | None = None  # when the current driver was started
        self._started = time.monotonic()  # when the job began to run
        self._ended: float | None = None
        self._restores_before = 0  # the job's restores before this run
        self._supervisor: JobSupervisor | None = None
        self._status: AgentStatus | None = None  # the newest status the live line shows

    # ------------------------------------------------------------------ lines

    def line(self, text: str) -> None:
        """An event: above the live line on a terminal; a time-stamped line otherwise
        (the lines after the first of a multi-line message are printed as they are)."""
        if self._gone:
            return
        now = time.time()
        try:
            if not self.live:
                print(f"{wall_clock(now)} {text}", file=self._stream, flush=True)
                return
            stamp = Text(time.strftime("%H:%M:%S ", time.localtime(now)), style="dim")
            self._console.print(stamp + Text(text))
        except BrokenPipeError:
            self._closed()
            self.line(text)

    def _closed(self) -> None:
        """The reader went away (``run ... | head``): the lines go on to the fallback
        stream (the terminal's standard error) if there is one, else nowhere, and the run
        is told once."""
        discard_output(self._stream)
        self.live = False
        if self._fallback is None:
            self._gone = True
        else:
            self._stream, self._fallback = self._fallback, None
            self._console = Console(file=self._stream, highlight=False, soft_wrap=True)
        if not self.closed:
            self.closed = True
            if self._on_closed is not None:
                self._on_closed()

    def when_closed(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once the reader of the output goes away (at once if it has)."""
        self._on_closed = callback
        if self.closed:
            callback()

    def notice(self, notice: Notice) -> None:
        """A notice of the supervisor: a line, and counted for the summary."""
        self._tally.notice(notice)
        if notice.reason == "DriverStarting":
            self._starting = time.monotonic()
        self.line(notice.message)
        self._refresh()  # the live line shows what the notice changed at once

    @contextlib.contextmanager
    def showing_logs(self) -> Iterator[None]:
        """While the block runs, what libraries log at WARNING and above is lines of this
        display; the root logger is given back as it was after (the display's stream may
        be closed by then, and a caller in the same process keeps its own logging)."""
        display = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    display.line(f"{record.levelname.lower()}: {self.format(record)}")
                except Exception:  # as logging's own handlers: never raised into the caller
                    self.handleError(record)

        handler = Handler()
        # The message alone (basicConfig would give it "WARNING:<logger>:" after "warning: ").
        handler.setFormatter(logging.Formatter("%(message)s"))
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        root.handlers[:] = [handler]
        root.setLevel(logging.WARNING)
        try:
            yield
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)

    # ------------------------------------------------------------------ while the job runs

    @contextlib.asynccontextmanager
    async def showing(self, supervisor: JobSupervisor) -> AsyncIterator[None]:
        """While the block runs the job: the live line on a terminal, and the query's
        progress sampled for the summary in any case."""
        self._started = time.monotonic()
        self._restores_before = supervisor.record.restores
        self._supervisor = supervisor
        if self.live:
            self._live = Live(
                console=self._console, auto_refresh=False, transient=True, redirect_stdout=False
            )
            self._live.start()
        sampling = asyncio.get_running_loop().create_task(self._sample(supervisor))
        try:
            yield
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
            if (last := supervisor.last_status) is not None:
                self._tally.status(last)  # the driver's last word, before it exited
            if self._live is not None:
                self._live.stop()
                self._live = None
            self._ended = time.monotonic()

    async def _sample(self, supervisor: JobSupervisor) -> None:
        while True:
            self._status = await supervisor.read_status()
            for seen in (self._status, supervisor.last_status):
                if seen is not None:
                    self._tally.status(seen)
            self._refresh()
            await asyncio.sleep(SAMPLE_SECONDS)

    def _refresh(self) -> None:
        if self._live is not None and self._supervisor is not None:
            line = self.status_line(self._supervisor, self._status, time.time())
            self._live.update(line, refresh=True)

    def status_line(
        self, supervisor: JobSupervisor, status: AgentStatus | None, now: float
    ) -> Text:
        """The live line: what the job does now."""
        record = supervisor.record
        parts = [Text(record.phase.value, style="bold"), Text(f"attempt {record.attempt}")]
        query = None if status is None or status.attempt != record.attempt else status.query
        starting = query is None or query.state is QueryState.STARTING
        if record.phase is JobPhase.DEPLOYING and starting:
            waited = 0.0 if self._starting is None else time.monotonic() - self._starting
            parts.append(Text(f"Spark is starting ({human_age(waited)})", style="yellow"))
        elif query is not None and query.state is QueryState.RESTORING and status is not None:
            source = status.restored_from.candidate if status.restored_from else "an image"
            parts.append(Text(f"restoring from {source}", style="yellow"))
        elif record.phase is JobPhase.RUNNING and query is None:
            parts.append(Text("the driver's agent does not answer", style="yellow"))
        if query is not None and not starting:
            progress = query.progress
            # The last committed, as `status` and "(query at batch N)" say: an idle
            # trigger's progress names the next batch, not yet run (a newcomer saw 48
            # beside 47).
            batch = query.last_committed_batch
            parts.append(Text(f"batch {'-' if batch is None else batch}"))
            rate = None if progress is None else progress.input_rows_per_second
            parts.append(Text(f"{'-' if rate is None else format_rate(rate)} rows/s"))
        parts.append(self._last_checkpoint(record, now))
        parts.append(self._next_trigger(supervisor, record))
        failed = self._tally.failed
        parts.append(Text(f"failed {failed}", style="red" if failed else ""))
        line = Text("  ").join(part for part in parts if part)
        line.no_wrap = True
        line.overflow = "ellipsis"
        return line

    @staticmethod
    def _last_checkpoint(record: JobRecord, now: float) -> Text:
        last = newest_completion(record.coordinator, CheckpointKind.CHECKPOINT)
        if last is None:
            return Text("no checkpoint yet")
        if isinstance(last, CompletedCheckpoint):
            size = human_size(last.size_bytes)
            return Text(
                f"checkpoint {last.checkpoint_id} {human_age(now - last.completion_time)} ago "
                f"({size} in {short_duration(last.duration)})"
            )
        # A finished job's: retention discarded it.
        age = human_age(now - last.end_time)
        return Text(f"checkpoint {last.checkpoint_id} {age} ago (discarded)")

    @staticmethod
    def _next_trigger(supervisor: JobSupervisor, record: JobRecord) -> Text:
        if record.pending:
            pending = record.pending[0]
            return Text(
                f"{pending['kind']} {pending['id']} in progress "
                f"({pending['acknowledged']}/{pending['expected']} tasks)",
                style="cyan",
            )
        due_in = supervisor.next_periodic_trigger_in
        if due_in is None:
            return Text()
        return Text(f"next in {human_age(max(0.0, due_in))}")

    # ------------------------------------------------------------------ at the end

    def summary(
        self,
        outcome: TerminalOutcome,
        record: JobRecord,
        status_file: Path,
        *,
        unconfirmed_restores: int = 0,
    ) -> None:
        """This run's summary: what it completed, failed and processed, in how long;
        ``unconfirmed_restores`` (`JobSupervisor.unconfirmed_restores`) beside the restores."""
        tally = self._tally
        duration = (self._ended or time.monotonic()) - self._started
        completed = tally.completed
        images = [
            _count(completed[CheckpointKind.CHECKPOINT], "checkpoint"),
            _count(completed[CheckpointKind.SAVEPOINT], "savepoint"),
        ]
        confirmed = record.restores - self._restores_before
        restores = _count(confirmed, "restore")
        notes = []
        if tally.failed_images:
            notes.append(f"{_count(len(tally.failed_images), 'image')} failed")
        if unconfirmed_restores:
            # "restored from" was said, and the driver ended (stopped, killed) before it was
            # confirmed: "0 restores" alone read as if nothing had been restored.
            notes.append(
                f"{unconfirmed_restores} not counted: its driver ended before a batch past "
                "the image"
            )
        if notes:
            restores += f" ({', '.join(notes)})"
        self.line(
            f"{outcome.value}: this run took {human_age(duration)}: "
            f"{' and '.join(images)} completed, {tally.failed} failed, "
            f"{restores}; "
            f"{_count(sum(tally.batches.values()), 'batch', 'batches')}, "
            f"{_count(sum(tally.rows.values()), 'input row')}; status in {status_file}"
        )


def format_rate(rows_per_second: float) -> str:
    return f"{rows_per_second:.0f}" if rows_per_second >= 10 else f"{rows_per_second:.1f}"


def _count(number: int, singular: str, plural: str = "") -> str:
    return f"{number} {singular if number == 1 else plural or singular + 's'}"
