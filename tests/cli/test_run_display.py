"""What `spark-checkpoint run` shows, seen as a user sees it: on a terminal (a pseudo-
terminal read through the pyte terminal emulator, so assertions are about the screen, not
escape codes) a live status line under the events; through a pipe, plain lines stamped with
the wall clock; at the end a summary of this run alone. The driver runs the real
`run_coordinated` and agent around a stand-in query (helpers/fake_query.py): no Spark."""

import fcntl
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pyte
import pytest

from helpers.doc_blocks import Block, marked_blocks
from helpers.fake_query import (
    BATCHES_VARIABLE,
    RESTORE_SECONDS_VARIABLE,
    ROWS_PER_BATCH,
    write_job,
)
from helpers.script_job import alive
from spark_checkpoint.agent.agent import COPY_DELAY_VARIABLE
from spark_checkpoint.protocol import AgentStatus, QueryProgress, QueryState, QueryStatus
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CheckpointOutcome,
    JobPhase,
    OutcomeStatus,
    PersistedState,
    TerminalOutcome,
)
from spark_checkpoint_operator.run_display import RunDisplay
from spark_checkpoint_operator.supervisor import JobRecord, Level, Notice

COLUMNS, LINES = 320, 50  # wide: the summary ends with a path under tmp_path
# Seconds the driver waits before it imports anything: Spark's start, as the user waits
# for it (no agent answers before the pipeline calls run_coordinated).
SPARK_START_SECONDS = 2.5
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d) ")
SUMMARY = re.compile(
    r"(?P<outcome>\w+): this run took (?P<took>\S+): (?P<checkpoints>\d+) checkpoints? and "
    r"(?P<savepoints>\d+) savepoints? completed, (?P<failed>\d+) failed, (?P<restores>\d+) "
    r"restores?(?: \((?:(?P<failed_restores>\d+) images? failed)?(?:, )?(?:(?P<unconfirmed>\d+) "
    r"not counted: its driver ended before a batch past the image)?\))?; "
    r"(?P<batches>\d+) batch(?:es)?, "
    r"(?P<rows>\d+) input rows?; status in "
)
LIVE_LINE = re.compile(
    r"Running  attempt 1  batch (?P<batch>\d+)  (?P<rate>[\d.,]+) rows/s  checkpoint "
    r"(?P<id>\d+) (?P<age>\S+) ago \((?P<size>[\d.]+ (?:B|KiB)) in (?P<took>\d+ms|[\d.]+s)\)"
    r"  (?:next in \S+|checkpoint \d+ in progress \(\d/\d tasks\))  failed 0"
)


def _command(*options: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "spark_checkpoint_operator.cli",
        "run",
        "-f",
        "job.yaml",
        *options,
    ]


def _environment(**extra: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    return environment | {"TERM": "xterm-256color"} | extra


class TerminalRun:
    """`spark-checkpoint run` on a pseudo-terminal of COLUMNS x LINES; ``screen()`` is what
    a terminal emulator shows at that moment."""

    def __init__(self, directory: Path, **environment: str) -> None:
        main, terminal = os.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        self.process = subprocess.Popen(
            _command(),
            cwd=directory,
            env=_environment(**environment),
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            start_new_session=True,
        )
        os.close(terminal)
        self._main = main
        self._screen = pyte.Screen(COLUMNS, LINES)
        self._stream = pyte.ByteStream(self._screen)
        self._lock = threading.Lock()
        self.seen: list[str] = []  # every screen, in order (for failure messages)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._main, 65536)
            except OSError:  # EIO: the run closed the terminal
                return
            if not data:
                return
            with self._lock:
                self._stream.feed(data)

    def screen(self) -> list[str]:
        """The lines on screen that are not blank (at least one, maybe empty)."""
        with self._lock:
            return [line.rstrip() for line in self._screen.display if line.strip()] or [""]

    def wait_for(self, found: Callable[[list[str]], bool], timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if not self.seen or self.seen[-1] != "\n".join(screen):
                self.seen.append("\n".join(screen))
            if found(screen):
                return screen
            assert time.monotonic() < deadline, "never on screen; last screens:\n" + "\n--\n".join(
                self.seen[-3:]
            )
            assert self.process.poll() is None, "the run ended:\n" + "\n".join(screen)
            time.sleep(0.05)

    def wait(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self._main)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Path]:
    write_job(tmp_path, interval="1s")
    yield tmp_path
    lock = tmp_path / ".spark-checkpoint" / "default" / "probe" / "run.lock"
    if lock.exists() and (text := lock.read_text().strip()) and alive(int(text)):
        os.kill(int(text), signal.SIGKILL)  # a test that failed half-way leaves no run behind


def _slow_start(directory: Path) -> None:
    """The driver waits before it starts its query, as Spark's start makes a user wait."""
    driver = directory / "driver.py"
    driver.write_text(f"import time\ntime.sleep({SPARK_START_SECONDS})\n" + driver.read_text())


def test_a_terminal_shows_spark_starting_then_a_live_line_under_the_events(job: Path) -> None:
    _slow_start(job)
    run = TerminalRun(job)
    try:
        starting = run.wait_for(lambda screen: "Spark is starting" in screen[-1])
        assert re.fullmatch(
            r"Deploying  attempt 1  Spark is starting \(\d+s\)  no checkpoint "
            r"yet  failed 0",
            starting[-1],
        ), starting
        assert "starting driver attempt 1" in starting[0]

        running = run.wait_for(lambda screen: LIVE_LINE.fullmatch(screen[-1]) is not None)
        live = LIVE_LINE.fullmatch(running[-1])
        assert live is not None
        # The fake query reads ROWS_PER_BATCH rows every 0.2 s.
        assert float(live["rate"]) == pytest.approx(ROWS_PER_BATCH / 0.2)
        # The events stay above it, one time-stamped line each.
        completed = [
            line
            for line in running
            if re.fullmatch(
                rf"\d\d:\d\d:\d\d checkpoint {live['id']} complete: batch \d+, .*", line
            )
        ]
        assert len(completed) == 1, running

        # A later screen: the batch moves on, the line stays the last line.
        later = run.wait_for(
            lambda screen: (
                (m := LIVE_LINE.fullmatch(screen[-1])) is not None
                and int(m["batch"]) > int(live["batch"])
            )
        )
        assert all(not LIVE_LINE.search(line) for line in later[:-1]), later

        run.process.send_signal(signal.SIGINT)  # Ctrl-C: a savepoint, then stop
        assert run.wait() == 0
        final = run.screen()
    finally:
        run.close()
    # The live line is gone; the summary is the last line.
    assert not any(LIVE_LINE.search(line) or "Spark is starting" in line for line in final)
    summary = SUMMARY.search(final[-1])
    assert summary is not None, final
    assert summary["outcome"] == "Suspended"
    assert int(summary["savepoints"]) == 1

    # The user guide shows the screen as it is.
    *events, live_line = _lines(
        marked_blocks(
            "tests/cli/test_run_display.py::test_a_terminal_shows_spark_starting_then_a_live_line_under_the_events"
        )
    )
    assert LIVE_LINE.fullmatch(live_line), live_line
    assert all(re.match(r"\d\d:\d\d:\d\d \S", line) for line in events), events


def _lines(blocks: list[Block]) -> list[str]:
    """The lines of the one doc block a test keeps true."""
    (block,) = blocks
    return block.text.splitlines()


def _plain_run(directory: Path, **environment: str) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        _command(),
        cwd=directory,
        env=_environment(**environment),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_terminal_shows_spark_starting_while_the_driver_restores(job: Path) -> None:
    """The agent answers while its driver restores: the line still says Spark is starting,
    not a batch of a query that does not run yet."""
    first = _plain_run(job)
    assert first.stdout is not None
    for line in first.stdout:
        if " checkpoint 1 complete" in line:
            break
    first.send_signal(signal.SIGINT)  # a savepoint, then stop
    first.communicate(timeout=60)

    run = TerminalRun(job, **{RESTORE_SECONDS_VARIABLE: "4"})
    try:
        run.wait_for(lambda screen: any("starting driver attempt 2" in line for line in screen))
        time.sleep(2.5)  # its agent answers "starting" by now; the restore takes 4 s
        restoring = run.screen()
        assert re.fullmatch(
            r"Deploying  attempt 2  Spark is starting \(\d+s\)  checkpoint \d+ .*", restoring[-1]
        ), restoring
        run.wait_for(lambda screen: screen[-1].startswith("Running  attempt 2  batch "))
        run.process.send_signal(signal.SIGINT)
        assert run.wait() == 0
    finally:
        run.close()


def test_without_a_terminal_each_line_has_the_wall_clock_time_and_no_control_code(
    job: Path,
) -> None:
    # Checkpoints every 200 ms that copy slowly: one is in flight when the bounded input
    # (8 batches) is done and the final checkpoint has completed, and is cut short.
    write_job(job, interval="200ms")
    started = datetime.now().astimezone().replace(microsecond=0)
    run = _plain_run(job, **{BATCHES_VARIABLE: "8", COPY_DELAY_VARIABLE: "0.3"})
    out, _ = run.communicate(timeout=120)
    ended = datetime.now().astimezone()

    assert run.returncode == 0, out
    assert "\x1b" not in out and "\r" not in out, repr(out)
    lines = out.splitlines()
    stamped = [line for line in lines if not line.startswith(" ")]  # a message's tail is not
    for line in stamped:
        stamp = STAMP.match(line)
        assert stamp is not None, line
        assert started <= datetime.fromisoformat(stamp[1]) <= ended, line
    summary = SUMMARY.search(lines[-1])
    assert summary is not None, out
    assert summary["outcome"] == "Finished"
    assert (int(summary["batches"]), int(summary["rows"])) == (8, 8 * ROWS_PER_BATCH)
    completions = re.findall(r"^\S+ \S+ checkpoint \d+ complete", out, re.MULTILINE)
    assert int(summary["checkpoints"]) == len(completions) > 0
    # A checkpoint given up because the input is done is no failure.
    assert re.search(r"checkpoint \d+ given up: the input is done", out), out
    assert int(summary["failed"]) == 0, out

    # The user guide shows such lines as they are.
    guide = _lines(
        marked_blocks(
            "tests/cli/test_run_display.py::test_without_a_terminal_each_line_has_the_wall_clock_time_and_no_control_code"
        )
    )
    assert all(STAMP.match(line) for line in guide), guide
    assert SUMMARY.match(guide[-1].split(" ", 2)[2]), guide[-1]


def test_the_summary_of_a_resumed_run_counts_that_run_alone(job: Path) -> None:
    first = _plain_run(job)
    assert first.stdout is not None
    for line in first.stdout:  # until a checkpoint completed
        if re.search(r" checkpoint 1 complete", line):
            break
    first.send_signal(signal.SIGINT)  # a savepoint, then stop
    rest, _ = first.communicate(timeout=60)
    assert first.returncode == 0, rest
    status_file = job / ".spark-checkpoint" / "default" / "probe" / "status.json"
    before = json.loads(status_file.read_text())["status"]["counts"]

    # Again from the same state: it restores the savepoint and reads 8 batches of input.
    started = time.monotonic()
    second = _plain_run(job, **{BATCHES_VARIABLE: "8"})
    out, _ = second.communicate(timeout=120)
    took = time.monotonic() - started

    assert second.returncode == 0, out
    summary = SUMMARY.search(out.splitlines()[-1])
    assert summary is not None, out
    after = json.loads(status_file.read_text())["status"]["counts"]
    completions = len(re.findall(r"^\S+ \S+ checkpoint \d+ complete", out, re.MULTILINE))
    assert int(summary["checkpoints"]) == completions == after["completed"] - before["completed"]
    assert int(summary["savepoints"]) == 0
    assert int(summary["restores"]) == 1
    assert (int(summary["batches"]), int(summary["rows"])) == (8, 8 * ROWS_PER_BATCH)
    # This run's time, not the job's since its first run.
    assert int(summary["took"].removesuffix("s")) <= took
    assert int(summary["failed"]) == 0


def test_the_live_line_shows_the_last_committed_batch_as_status_does() -> None:
    """An idle trigger's progress names the next batch, not yet run: the line said batch
    48 beside "(query at batch 47)" and `status`'s 47 (a newcomer's)."""
    record = JobRecord(phase=JobPhase.RUNNING, attempt=1)
    supervisor = SimpleNamespace(record=record, next_periodic_trigger_in=None)
    status = AgentStatus(
        version=3,
        attempt=1,
        query=QueryStatus(
            QueryState.RUNNING,
            last_committed_batch=47,
            progress=QueryProgress(
                batch_id=48, num_input_rows=0, input_rows_per_second=0.0, total_input_rows=470
            ),
        ),
        tasks=(),
        all_tasks_running=True,
        awaiting_final_checkpoint=False,
        restored_from=None,
        checkpoints=(),
    )

    line = RunDisplay(io.StringIO()).status_line(supervisor, status, now=0.0)  # type: ignore[arg-type]

    assert "  batch 47  " in line.plain, line.plain


def test_the_summary_counts_the_images_a_run_could_not_restore(tmp_path: Path) -> None:
    """A run that fell back past two images before one restored said "0 restores" as if
    it had never tried (a newcomer's reading); an image skipped again in the next attempt
    is one image."""
    out = io.StringIO()
    display = RunDisplay(out)
    for reason, image in (
        ("RestoreSkipped", "checkpoint:7"),
        ("RestoreFailed", "checkpoint:6"),
        ("RestoreSkipped", "checkpoint:7"),
        ("Restored", ""),
        ("CheckpointCompleted", ""),
    ):
        display.notice(Notice(reason, Level.NOTE, reason, image=image))
    record = JobRecord(phase=JobPhase.RUNNING, coordinator=PersistedState())
    record.restores = 1

    display.summary(TerminalOutcome.SUSPENDED, record, tmp_path / "status.json")

    summary = SUMMARY.search(out.getvalue().splitlines()[-1])
    assert summary is not None, out.getvalue()
    assert (summary["restores"], summary["failed_restores"], summary["failed"]) == ("1", "2", "0")


@pytest.mark.parametrize(
    ("failed_images", "unconfirmed", "expected"),
    [(0, 1, ("0", None, "1")), (0, 0, ("0", None, None)), (2, 1, ("0", "2", "1"))],
)
def test_the_summary_tells_restores_that_ended_before_they_were_confirmed(
    tmp_path: Path, failed_images: int, unconfirmed: int, expected: tuple[str, ...]
) -> None:
    """Stopped before its restored query committed a batch, a run said "0 restores" after
    "restored from checkpoint:3", as if nothing had been restored (a newcomer's); the
    supervisor counts those (tests/control_plane/test_restore_fallback.py)."""
    out = io.StringIO()
    display = RunDisplay(out)
    for image in range(failed_images):
        display.notice(Notice("RestoreSkipped", Level.WARNING, "", image=f"checkpoint:{image}"))
    record = JobRecord(phase=JobPhase.RUNNING, coordinator=PersistedState())

    display.summary(
        TerminalOutcome.SUSPENDED,
        record,
        tmp_path / "status.json",
        unconfirmed_restores=unconfirmed,
    )

    summary = SUMMARY.search(out.getvalue().splitlines()[-1])
    assert summary is not None, out.getvalue()
    assert (summary["restores"], summary["failed_restores"], summary["unconfirmed"]) == expected


def _finished_record() -> JobRecord:
    """A finished job's: retention discarded its checkpoints, the history keeps the last."""
    last = CheckpointOutcome(
        8, CheckpointKind.CHECKPOINT, OutcomeStatus.COMPLETED, 100.0, 101.5, 12, 7_000
    )
    state = PersistedState(
        next_checkpoint_id=9,
        history=(last,),
        completed_count=8,
        terminated=TerminalOutcome.FINISHED,
    )
    return JobRecord(phase=JobPhase.FINISHED, attempt=1, coordinator=state, last_batch=12)


def test_the_live_line_of_a_finished_job_names_its_last_checkpoint() -> None:
    """The final line said "no checkpoint yet" after eight completed, as retention discarded
    a finished job's checkpoints (a newcomer's)."""
    supervisor = SimpleNamespace(record=_finished_record(), next_periodic_trigger_in=None)

    line = RunDisplay(io.StringIO()).status_line(supervisor, None, now=131.5)  # type: ignore[arg-type]

    assert "  checkpoint 8 30s ago (discarded)  " in line.plain, line.plain
