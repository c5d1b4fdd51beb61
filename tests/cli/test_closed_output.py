"""`run ... | head`: what the run shows and does once the reader of its output is gone.
(End to end, with a run of a stand-in query: tests/cli/test_controls.py.)"""

import io
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from spark_checkpoint_operator.coordinator import AfterCompletion, JobPhase, TerminalOutcome
from spark_checkpoint_operator.local_runtime import _Interrupts
from spark_checkpoint_operator.run_display import RunDisplay


class ClosedPipe(io.StringIO):
    """A stream whose reader is gone, with a descriptor of its own to point elsewhere."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.descriptor = open(path, "w")  # noqa: SIM115 (closed by the fixture)

    def write(self, text: str) -> int:
        raise BrokenPipeError

    def fileno(self) -> int:
        return self.descriptor.fileno()


@pytest.fixture
def closed(tmp_path: Any) -> Iterator[ClosedPipe]:
    pipe = ClosedPipe(str(tmp_path / "pipe"))
    yield pipe
    pipe.descriptor.close()


def test_lines_go_on_to_the_fallback_and_the_run_is_told_once(closed: ClosedPipe) -> None:
    fallback = io.StringIO()
    display = RunDisplay(closed, fallback=fallback)
    told: list[str] = []

    display.line("checkpoint 1 complete")  # the pipe closes before anyone listens
    display.when_closed(lambda: told.append("closed"))
    display.line("checkpoint 2 complete")

    assert told == ["closed"]
    assert [line.split(" ", 2)[2] for line in fallback.getvalue().splitlines()] == [
        "checkpoint 1 complete",
        "checkpoint 2 complete",
    ]
    assert os.fstat(closed.fileno()).st_rdev == os.stat(os.devnull).st_rdev  # at exit


def test_without_a_fallback_nothing_is_shown_and_nothing_raises(closed: ClosedPipe) -> None:
    display = RunDisplay(closed)
    told: list[str] = []
    display.when_closed(lambda: told.append("closed"))

    display.line("checkpoint 1 complete")
    display.line("checkpoint 2 complete")

    assert told == ["closed"]


class Supervisor:
    resumes_from = "checkpoint:3"
    outcome: TerminalOutcome | None = None

    def __init__(self, phase: JobPhase = JobPhase.RUNNING) -> None:
        self.calls: list[str] = []
        self.labels: list[str] = []
        self.record = SimpleNamespace(phase=phase)
        self.finishing = False

    def request(self, event: Any) -> None:
        self.calls.append(f"savepoint then {event.after.name.lower()}")
        self.labels.append(event.label)

    def cancel(self) -> None:
        self.calls.append("cancel")

    def suspend_now(self) -> None:
        self.calls.append("stop without a savepoint")

    def end_suspended(self) -> None:
        self.calls.append("end suspended")

    def what_cancelling_leaves(self) -> str:
        return "its checkpoints are discarded"


@pytest.mark.parametrize(
    ("events", "calls"),
    [
        (["ctrl-c"], ["savepoint then stop"]),
        (["ctrl-c", "ctrl-c"], ["savepoint then stop", "cancel"]),
        (["closed"], ["savepoint then stop"]),
        # `run | head` and one Ctrl-C: the reader dies of it too, and its pipe may close
        # first; the user's one Ctrl-C is not a second one.
        (["closed", "ctrl-c"], ["savepoint then stop"]),
        (["ctrl-c", "closed"], ["savepoint then stop"]),
        (["closed", "ctrl-c", "ctrl-c"], ["savepoint then stop", "cancel"]),
    ],
)
def test_a_closed_output_stops_the_job_as_a_ctrl_c_that_is_not_the_users(
    events: list[str], calls: list[str]
) -> None:
    supervisor = Supervisor()
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    for event in events:
        (interrupts.interrupt if event == "ctrl-c" else interrupts.output_closed)()

    assert supervisor.calls == calls


def test_a_second_signal_once_the_job_ended_stops_its_cleanup_and_discards_nothing() -> None:
    """Its end's storage cleanup hung on storage that did not answer: the second SIGTERM
    said "stopping the driver without a savepoint; its checkpoints are discarded" of a job
    that had ended Suspended (an S3 user's)."""
    supervisor = Supervisor()
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.terminate()
    supervisor.outcome = TerminalOutcome.SUSPENDED
    interrupts.terminate()

    assert supervisor.calls == ["savepoint then stop", "cancel"]
    assert lines[-1] == (
        "terminated (SIGTERM) again: the job ended Suspended; stopping its storage cleanup "
        "(what it left stays in storage until a run of the job cleans up)"
    )


@pytest.mark.parametrize(
    ("stop", "label"),
    [
        ("interrupt", "ctrl-c"),
        ("terminate", "sigterm"),
        ("hang_up", "sighup"),
        ("output_closed", "output closed"),
    ],
)
def test_the_stops_savepoint_is_labelled_by_what_asked_for_it(stop: str, label: str) -> None:
    """A SIGTERM's savepoint was labelled "ctrl-c" in the log and the history."""
    supervisor = Supervisor()
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, [].append)  # type: ignore[arg-type]
    assert not interrupts.asked_for(label)

    getattr(interrupts, stop)()

    assert supervisor.labels == [label]
    assert interrupts.asked_for(label)
    # A `spark-checkpoint savepoint`'s request is the control's to answer, not the stop's.
    assert not interrupts.asked_for("savepoint 0123abcd")


def test_a_savepoint_a_running_job_declines_stops_without_one_in_one_line() -> None:
    """Running, its savepoint declined (an executor lost): the decline is the reason of the
    one line that says the driver stops without a savepoint; another signal then cancels
    nothing, which could discard the checkpoints (a reviewer)."""
    supervisor = Supervisor()
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.terminate()
    interrupts.cannot_take_savepoint("not all required tasks are running")
    interrupts.interrupt()

    assert supervisor.calls == ["savepoint then stop", "stop without a savepoint"]
    assert lines == [
        "terminated (SIGTERM): taking a savepoint, then stopping (SIGTERM again to cancel)",
        "terminated (SIGTERM): no savepoint can be taken now: not all required tasks are "
        "running; stopping the driver without one (the next run resumes from checkpoint:3)",
        "interrupted: the driver is already stopping without a savepoint",
    ]


FINISHING = (
    "no savepoint is needed: the input is done and its final checkpoint completed; the job "
    "finishes once its driver has committed it and exits"
)


@pytest.mark.parametrize("phase", [JobPhase.RUNNING, JobPhase.DEPLOYING])
def test_a_signal_while_the_driver_finishes_waits_for_it_and_a_second_stops_it(
    phase: JobPhase,
) -> None:
    """The input done and its final checkpoint completed: the savepoint was declined, the
    line said the driver stopped without one, and the job ended Suspended, not Finished.
    A second signal stops the driver now (Suspended, its checkpoints kept), not cancels.
    Deploying (its agent silent as it exits) said "its query is not running yet"."""
    supervisor = Supervisor(phase)
    supervisor.finishing = True
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.interrupt()
    assert supervisor.calls == ["end suspended"], "the stop is recorded, the driver let be"
    interrupts.interrupt()
    interrupts.interrupt()

    assert supervisor.calls == ["end suspended", "stop without a savepoint"]
    assert lines == [
        f"interrupted: {FINISHING} (Ctrl-C again to stop it now)",
        "interrupted again: stopping the finishing driver now; the job is Finished if its "
        "sinks committed the final checkpoint, else Suspended (the next run commits it)",
        "interrupted: the driver is already stopping without a savepoint",
    ]


def test_a_signal_after_the_output_closed_while_the_driver_finishes_is_the_users_first() -> None:
    """The output closed (its stop waits for the finish): the user's Ctrl-C then said 'the
    savepoint is under way', of a savepoint never asked for (a reviewer's)."""
    supervisor = Supervisor()
    supervisor.finishing = True
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.output_closed()
    interrupts.interrupt()

    assert lines[-1] == f"interrupted: {FINISHING} (Ctrl-C again to stop it now)"
    assert supervisor.calls == ["end suspended", "end suspended"]


def test_a_stop_whose_savepoint_met_the_final_checkpoint_waits_for_the_finish() -> None:
    """The final checkpoint completed while the stop's savepoint was queued: declined, it
    stopped the finishing driver."""
    supervisor = Supervisor()
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.terminate()
    supervisor.finishing = True
    interrupts.cannot_take_savepoint("not all required tasks are running")

    assert supervisor.calls == ["savepoint then stop", "end suspended"]
    assert lines[-1] == f"terminated (SIGTERM): {FINISHING} (SIGTERM again to stop it now)"


@pytest.mark.parametrize("phase", [JobPhase.DEPLOYING, JobPhase.RESTARTING])
def test_a_signal_while_no_query_runs_stops_without_a_savepoint_at_once(phase: JobPhase) -> None:
    supervisor = Supervisor(phase)
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.interrupt()
    interrupts.interrupt()

    assert supervisor.calls == ["stop without a savepoint"]
    assert lines[0].startswith("interrupted: no savepoint can be taken now: its query is not ")


def test_a_signal_once_the_job_has_ended_stops_and_cancels_nothing() -> None:
    """Ctrl-C twice as a bounded job finished: the second said 'stopping the driver without
    a savepoint; its checkpoints are discarded' after 'job finished' (a newcomer's). Ended
    in this run: the record's phase at the start is the last run's (Suspended)."""
    supervisor = Supervisor(JobPhase.SUSPENDED)
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.interrupt()
    interrupts.job_ended()
    interrupts.interrupt()
    interrupts.terminate()

    assert supervisor.calls == ["savepoint then stop"]
    assert lines[1:] == [
        "interrupted: the job has ended; the run ends with its cleanup",
        "terminated (SIGTERM): the job has ended; the run ends with its cleanup",
    ]


def test_a_second_signal_once_the_stops_savepoint_completed_ends_suspended() -> None:
    """The driver exiting after its stop's savepoint: the second Ctrl-C cancelled the job,
    said "stopping the driver without a savepoint" and discarded its checkpoints (a
    newcomer's); as `cancel` then, nothing is cancelled."""
    supervisor = Supervisor()
    lines: list[str] = []
    interrupts = _Interrupts(supervisor, AfterCompletion.STOP, lines.append)  # type: ignore[arg-type]

    interrupts.interrupt()
    supervisor.record.phase = JobPhase.SUSPENDING  # its savepoint completed
    interrupts.interrupt()

    assert supervisor.calls == ["savepoint then stop", "stop without a savepoint"]
    assert lines[-1] == (
        "interrupted again: the stop's savepoint completed; stopping the driver now, the job "
        "ends Suspended with its checkpoints"
    )
