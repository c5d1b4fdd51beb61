"""The control socket's documents under hostile input: any line is a document or a
one-line `ProtocolError` naming what is wrong, never another exception; and a runtime
answers any line sent to its socket with one line, refusing what is not a request of
this run's."""

import asyncio
import json
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.fake_driver import STORAGE, TASKS, FakeAgent, FakeLauncher, NoJanitor, until
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import AckReport, ProtocolError
from spark_checkpoint_operator.control import (
    ControlPaths,
    ControlRefused,
    ControlServer,
    NoRuntime,
    request,
    serve_controls,
)
from spark_checkpoint_operator.control_commands import status_lines
from spark_checkpoint_operator.control_protocol import (
    MAX_LINE_BYTES,
    MAX_WAIT_SECONDS,
    Command,
    ControlAnswer,
    ControlRequest,
    Image,
    Outcome,
    RuntimeStatus,
    decode_line,
    encode_line,
)
from spark_checkpoint_operator.coordinator import (
    AfterCompletion,
    CheckpointKind,
    CheckpointOutcome,
    CompletedCheckpoint,
    CoordinatorConfig,
    FailureReason,
    JobPhase,
    OutcomeStatus,
    PersistedState,
    TerminalOutcome,
    TriggerRequested,
)
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.status import DiscardDue
from spark_checkpoint_operator.supervisor import (
    FINISHING_NEEDS_NO_SAVEPOINT,
    FINISHING_TAKES_NO_SAVEPOINT,
    JobRecord,
    JobSupervisor,
    Level,
    Notice,
    interpreter,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.sampled_from([10**400, -(10**400)])  # beyond any float
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3),  # lone surrogates
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=12,
)
ids = st.integers(min_value=0, max_value=(1 << 63) - 1)
images = st.builds(Image, ids, st.none() | st.text(max_size=40))
statuses = st.builds(
    RuntimeStatus,
    job=st.text(max_size=30),
    phase=st.text(max_size=12),
    attempt=ids,
    runtime_pid=ids,
    driver_pid=st.none() | ids,
    last_batch=st.none() | ids,
    last_checkpoint=st.none() | images,
    last_savepoint=st.none() | images,
    in_progress=ids,
    message=st.text(max_size=40),
    next_periodic_savepoint=st.none() | st.text(max_size=30),
)
requests = st.builds(
    ControlRequest,
    token=st.text(max_size=50),
    command=st.sampled_from(Command),
    drain=st.booleans(),
    wait=st.floats(min_value=0, max_value=MAX_WAIT_SECONDS),
)
answers = st.builds(
    ControlAnswer,
    outcome=st.sampled_from(Outcome),
    message=st.text(max_size=60),
    savepoint=st.none() | images,
    status=st.none() | statuses,
)


@given(st.one_of(requests, answers))
def test_every_document_survives_its_line(document: ControlRequest | ControlAnswer) -> None:
    assert decode_line(encode_line(document), type(document).from_json) == document


def _hostile_request_values() -> st.SearchStrategy[Any]:
    """A valid request with one field replaced, removed or added, or any JSON value."""
    fields = ("token", "command", "drain", "wait", "extra")

    def spoil(document: dict[str, Any], field: str, value: Any, remove: bool) -> Any:
        document = dict(document)
        if remove:
            document.pop(field, None)
        else:
            document[field] = value
        return document

    valid = requests.map(lambda r: r.to_json())
    return json_values | st.builds(
        spoil, valid, st.sampled_from(fields), json_values, st.booleans()
    )


@given(_hostile_request_values())
def test_a_hostile_request_is_a_document_or_one_line_naming_the_field(value: Any) -> None:
    for read in (ControlRequest.from_json, ControlAnswer.from_json):
        try:
            read(value)
        except ProtocolError as error:
            assert "\n" not in str(error) and str(error)


@given(st.binary(max_size=300))
def test_any_bytes_are_a_document_or_one_line(line: bytes) -> None:
    try:
        decode_line(line, ControlRequest.from_json)
    except ProtocolError as error:
        assert "\n" not in str(error) and str(error)


class _NoSupervisor:
    """What a refused request may not reach."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused request reached the supervisor ({name})")


def _exchange(line: bytes) -> ControlAnswer:
    """``line`` sent to a runtime's control socket (a supervisor nothing may reach); the
    answer, which must be exactly one line."""

    async def exchange(directory: Path) -> bytes:
        paths = ControlPaths(directory / "control")
        supervisor = cast(JobSupervisor, _NoSupervisor())
        async with serve_controls(paths, supervisor, "default/probe", lambda: None, print):
            reader, writer = await asyncio.open_unix_connection(str(paths.socket))
            writer.write(line)
            await writer.drain()
            answer = await reader.read()
            writer.close()
            return answer

    with tempfile.TemporaryDirectory() as directory:
        answer = asyncio.run(exchange(Path(directory)))
    assert answer.endswith(b"\n") and answer.count(b"\n") == 1
    return decode_line(answer, ControlAnswer.from_json)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200) | _hostile_request_values().map(lambda v: json.dumps(v).encode()))
def test_the_runtime_answers_a_hostile_line_with_one_line_and_no_effect(line: bytes) -> None:
    document = _exchange(line.replace(b"\n", b" ") + b"\n")
    assert document.outcome is Outcome.REFUSED
    assert document.message


@pytest.mark.parametrize(
    ("line", "said"),
    [
        # Once an OverflowError in the socket's callback: the client read no answer.
        (b'{"token": "t", "command": "savepoint", "wait": 1' + b"0" * 400 + b"}", "wait"),
        # Once a UnicodeEncodeError comparing the token.
        (b'{"token": "\\ud800", "command": "status"}', "wrong token"),
    ],
)
def test_a_value_no_float_or_utf_8_holds_is_refused_in_one_line(line: bytes, said: str) -> None:
    document = _exchange(line + b"\n")
    assert document.outcome is Outcome.REFUSED
    assert said in document.message


def test_an_overlong_line_is_refused_with_one_line() -> None:
    document = _exchange(b"x" * (MAX_LINE_BYTES + 10) + b"\n")
    assert (document.outcome, document.message) == (
        Outcome.REFUSED,
        f"a request is at most {MAX_LINE_BYTES} bytes",
    )


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (Command.STATUS, "the runtime ended without answering"),
        # A run killed right after the savepoint it was asked for: sp-N completed and was
        # registered, and the command said only this (a hostile newcomer on S3).
        (
            Command.SAVEPOINT,
            "the runtime ended without answering; `spark-checkpoint list` shows its images",
        ),
    ],
)
def test_a_runtime_that_ends_while_it_is_asked_is_no_runtime(
    tmp_path: Path, command: Command, said: str
) -> None:
    """A run ending as a request came (its driver failed at once) reset the connection, and
    `run --detach`, `status`, `stop` ... ended in a ConnectionResetError traceback (a
    newcomer, 2 of 4 tries)."""
    paths = ControlPaths(tmp_path / "control")
    paths.directory.mkdir(mode=0o700)
    paths.token.write_text("token\n")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(paths.socket))
    paths.socket.chmod(0o600)
    listener.listen()

    def reset_the_first_connection() -> None:
        connection, _address = listener.accept()
        while not connection.recv(1, socket.MSG_PEEK):
            pass
        connection.close()  # the request unread: the client's read is reset, not ended

    runtime = threading.Thread(target=reset_the_first_connection)
    runtime.start()
    try:
        with pytest.raises(NoRuntime) as ended:
            request(paths, command)
        assert str(ended.value) == said
    finally:
        runtime.join()
        listener.close()


@pytest.mark.parametrize("listening", [True, False], ids=["run-answers", "nothing-answers"])
def test_a_run_whose_token_is_gone_is_named_not_taken_for_no_run(
    tmp_path: Path, listening: bool
) -> None:
    """A token deleted while the run went on made every command say "no runtime is
    running for this job" (a hostile newcomer's): a user would start another run."""
    paths = ControlPaths(tmp_path / "control")
    paths.directory.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(paths.socket))
        paths.socket.chmod(0o600)
        if listening:
            listener.listen()
            with pytest.raises(ControlRefused) as refused:
                request(paths, Command.STATUS)
            assert str(refused.value) == (
                f"a run answers on {paths.socket}, but its token {paths.token} is gone "
                "(deleted while it runs): no command can reach it; Ctrl-C where it runs, "
                "or SIGTERM to its process, stops it with a savepoint"
            )
        else:
            with pytest.raises(NoRuntime, match=r"^no runtime is running for this job \(no token"):
                request(paths, Command.STATUS)


@pytest.mark.parametrize(
    ("place", "said"),
    [
        (lambda token: token.mkdir(), "is a directory, not a regular file"),
        (os.mkfifo, "is a FIFO, not a regular file"),
        (lambda token: token.symlink_to("/dev/zero"), "is a character device, not a regular file"),
        (lambda token: token.write_bytes(b"\xff\xfe"), "is not UTF-8 text (invalid start byte"),
        (lambda token: token.write_bytes(b"x" * 5000), "is larger than 4096 bytes"),
    ],
    ids=["directory", "fifo", "dev-zero", "not-utf-8", "huge"],
)
def test_a_token_that_cannot_be_read_is_refused_in_one_line(
    tmp_path: Path, place: Callable[[Path], None], said: str
) -> None:
    """A directory in the token's place ended `status` in an IsADirectoryError traceback
    (a reviewer's); a FIFO hung `cancel`, a link to /dev/zero hung `status` and bytes that
    are not UTF-8 ended it in a UnicodeDecodeError traceback (a hostile newcomer's)."""
    paths = ControlPaths(tmp_path / "control")
    paths.directory.mkdir(mode=0o700)
    place(paths.token)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(paths.socket))
        paths.socket.chmod(0o600)

        with pytest.raises(ControlRefused) as refused:
            request(paths, Command.STATUS)

    assert str(refused.value).startswith(f"cannot read the run's token {paths.token}: {said}")


class _StoppedFirstSupervisor:
    """A stop's savepoint that another stop's completion cuts short: in flight (id 7),
    then given up once the other's savepoint 6 completed, as the interpreter says."""

    finishing = False
    stopped_with: CompletedCheckpoint | None = None

    def __init__(self) -> None:
        self.record = JobRecord(phase=JobPhase.RUNNING)  # a query to take a savepoint of
        self.control: ControlServer | None = None

    def request(self, event: TriggerRequested) -> None:
        self.record.pending = [{"id": 7, "kind": "savepoint", "label": event.label}]
        asyncio.get_running_loop().call_later(0.3, self._given_up)

    def _given_up(self) -> None:
        assert self.control is not None
        label = self.record.pending[0]["label"]
        self.record.pending = []
        self.record.phase = JobPhase.SUSPENDING
        self.stopped_with = _STOP_SAVEPOINT
        self.control.notice(
            Notice(
                "CheckpointNotNeeded",
                Level.DETAIL,
                "savepoint 7 given up: the job is stopping with savepoint 6",
                label=label,
            )
        )


_STOP_SAVEPOINT = CompletedCheckpoint(
    6, CheckpointKind.SAVEPOINT, 41, "file:///storage/default/probe/savepoints/sp-6", 0, 0, 0
)


class _FailedAtOnceSupervisor:
    """A savepoint that fails as soon as it is triggered (a task declines it): in flight
    for less than one look at the record."""

    finishing = False

    def __init__(self) -> None:
        self.record = JobRecord(phase=JobPhase.RUNNING)  # a query to take a savepoint of
        self.control: ControlServer | None = None

    def request(self, event: TriggerRequested) -> None:
        assert self.control is not None
        self.control.notice(
            Notice(
                "CheckpointFailed",
                Level.WARNING,
                "savepoint 3 failed: a task declined the checkpoint: sp-3 exists (task logs)",
                label=event.label,
            )
        )


class _SuspendingSupervisor:
    """The stop's savepoint completed; the driver is stopping."""

    finishing = False
    stopped_with = _STOP_SAVEPOINT

    def __init__(self) -> None:
        self.record = JobRecord(phase=JobPhase.SUSPENDING)
        self.control: ControlServer | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _FinishingSupervisor:
    """Its driver was told that a completed checkpoint covers its input's end."""

    def __init__(self) -> None:
        self.record = JobRecord(phase=JobPhase.RUNNING)
        self.control: ControlServer | None = None
        self.finishing = True
        self.decline = False
        self.calls: list[str] = []
        self.declined_is_news: bool | None = None

    def end_suspended(self) -> None:
        self.calls.append("end suspended")

    def request(self, event: TriggerRequested) -> None:
        self.calls.append("savepoint")
        if self.decline:  # the final checkpoint completes first
            assert self.control is not None
            self.finishing = True
            self.declined_is_news = not self.control.notice(
                Notice(
                    "RequestDeclined",
                    Level.NOTE,
                    "savepoint declined: not all required tasks are running",
                    label=event.label,
                )
            )


class _DeclinedSupervisor:
    """Every savepoint is declined for ``reason``, as the coordinator declines it (its query
    runs but has not committed a first batch: no input yet)."""

    finishing = False

    # What the next run would resume from: not always the newest image (a newcomer's: a run
    # restored from savepoint:22 by --from leaves the newer ones behind).
    resumes_from = "savepoint:22"

    def __init__(self, reason: FailureReason = FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING):
        self.record = JobRecord(phase=JobPhase.RUNNING)
        self.control: ControlServer | None = None
        self.calls: list[str] = []
        self.declined_is_news: bool | None = None
        self.reason = reason

    def request(self, event: TriggerRequested) -> None:
        self.calls.append("savepoint")
        assert self.control is not None
        self.declined_is_news = not self.control.notice(
            Notice(
                "RequestDeclined",
                Level.WARNING,
                f"savepoint request declined: {self.reason.description}",
                label=event.label,
            )
        )

    def suspend_now(self) -> None:
        self.calls.append("suspend now")


def _answer_of(
    supervisor: _StoppedFirstSupervisor
    | _FailedAtOnceSupervisor
    | _SuspendingSupervisor
    | _FinishingSupervisor
    | _DeclinedSupervisor,
    command: Command,
    tmp: Path,
) -> ControlAnswer:
    """The answer `command` gets from a run whose supervisor is ``supervisor``."""
    paths = ControlPaths(tmp / "control")

    async def ask() -> ControlAnswer:
        job = cast(JobSupervisor, supervisor)
        async with serve_controls(paths, job, "default/probe", lambda: None, print) as control:
            supervisor.control = control
            return await asyncio.to_thread(request, paths, command, wait=30.0)

    return asyncio.run(ask())


def test_a_cancel_once_the_stops_savepoint_completed_says_nothing_is_cancelled(
    tmp_path: Path,
) -> None:
    """A hostile reviewer's: `cancel` right after `stop` printed its savepoint said
    "cancelling ... its checkpoints are discarded" and "cancelled", exit 0, while the job
    ended Suspended with its checkpoints (as Ctrl-C then says: already stopping)."""
    supervisor = _SuspendingSupervisor()

    answer = _answer_of(supervisor, Command.CANCEL, tmp_path)

    assert (answer.outcome, answer.message) == (
        Outcome.FAILED,
        "not cancelled: the stop's savepoint completed and the job is ending Suspended, its "
        "checkpoints kept",
    )
    assert not supervisor.cancelled


def test_a_stop_whose_savepoint_another_stops_completion_cut_short_names_that_one(
    tmp_path: Path,
) -> None:
    """Two stops at once: the one whose savepoint the other's completion cut short said
    'savepoint 7 failed', while the job stopped cleanly with '0 failed' (a newcomer); then
    'given up: the job is stopping', exit 1, naming no savepoint (a newcomer's)."""
    answer = _answer_of(_StoppedFirstSupervisor(), Command.STOP, tmp_path)
    assert (answer.outcome, answer.message, answer.savepoint) == (
        Outcome.OK,
        "already stopping: an earlier stop's savepoint 6 completed and the job is ending Suspended",
        Image(6, _STOP_SAVEPOINT.path),
    )


def test_a_savepoint_that_fails_at_once_is_told_as_failed(tmp_path: Path) -> None:
    """It was never seen pending, so `savepoint` waited out its timeout and said 'the
    savepoint is requested, not started yet' (a savepoint meeting a kept `sp-N`)."""
    answer = _answer_of(_FailedAtOnceSupervisor(), Command.SAVEPOINT, tmp_path)
    assert (answer.outcome, answer.message) == (
        Outcome.FAILED,
        "savepoint 3 failed: a task declined the checkpoint: sp-3 exists (task logs)",
    )


def test_a_stop_while_the_driver_finishes_asks_for_no_savepoint(tmp_path: Path) -> None:
    """Its savepoint was declined (the input is done: nothing runs to take it), so `stop`
    failed while the job went on to finish."""
    supervisor = _FinishingSupervisor()

    answer = _answer_of(supervisor, Command.STOP, tmp_path)

    assert (answer.outcome, answer.message) == (Outcome.OK, FINISHING_NEEDS_NO_SAVEPOINT)
    # Nothing to stop: the driver exits on its own; the stop is recorded.
    assert supervisor.calls == ["end suspended"]


@pytest.mark.parametrize("finishing_at_the_request", [True, False])
def test_a_savepoint_while_the_driver_finishes_is_declined_saying_the_input_is_done(
    tmp_path: Path, finishing_at_the_request: bool
) -> None:
    """It was declined with "not all required tasks are running (the query is starting or
    has not committed its first batch yet ...)" though the query had ended (an Azure
    newcomer's). Asked once the final checkpoint completed, it is declined before any
    request: the run ended before the request's decline came, exit 1, and the log said a
    savepoint was being taken (a newcomer's)."""
    supervisor = _FinishingSupervisor()
    supervisor.finishing = finishing_at_the_request
    supervisor.decline = True  # the final checkpoint completes while it is queued

    answer = _answer_of(supervisor, Command.SAVEPOINT, tmp_path)

    assert (answer.outcome, answer.message) == (Outcome.DECLINED, FINISHING_TAKES_NO_SAVEPOINT)
    assert supervisor.calls == ([] if finishing_at_the_request else ["savepoint"])


def test_a_stop_whose_savepoint_met_the_final_checkpoint_is_answered_as_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The final checkpoint completed while the stop's savepoint was queued: declined, the
    stop answered DECLINED (exit 4) while the job went on to finish; once answered OK, the
    run's lines still warned that the savepoint request was declined."""
    supervisor = _FinishingSupervisor()
    supervisor.finishing = False
    supervisor.decline = True

    answer = _answer_of(supervisor, Command.STOP, tmp_path)

    assert (answer.outcome, answer.message) == (Outcome.OK, FINISHING_NEEDS_NO_SAVEPOINT)
    assert supervisor.calls == ["savepoint", "end suspended"]
    # The run's lines say so, not that a savepoint request was declined.
    assert supervisor.declined_is_news is False
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == f"`spark-checkpoint stop`: {FINISHING_NEEDS_NO_SAVEPOINT}", said


@pytest.mark.parametrize("command", [Command.STOP, Command.SAVEPOINT])
def test_a_stop_whose_savepoint_is_declined_stops_without_one_as_ctrl_c_does(
    tmp_path: Path, command: Command
) -> None:
    """A newcomer's: a job whose query had no input yet could not be stopped; each `stop`
    was declined (exit 4) while Ctrl-C and SIGTERM stop its driver without a savepoint, as
    the user guide says `stop` does. A `savepoint` is declined still."""
    supervisor = _DeclinedSupervisor()

    answer = _answer_of(supervisor, command, tmp_path)

    if command is Command.SAVEPOINT:
        assert answer.outcome is Outcome.DECLINED
        assert supervisor.calls == ["savepoint"] and supervisor.declined_is_news
        return
    assert (answer.outcome, answer.message) == (
        Outcome.OK,
        "stopping the driver without a savepoint: no savepoint can be taken now: "
        f"{FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING.description} (the next run resumes "
        "from savepoint:22)",
    )
    assert supervisor.calls == ["savepoint", "suspend now"]
    assert supervisor.declined_is_news is False, "the stop's own line says it"


@pytest.mark.parametrize("drain", [True, False])
def test_a_stop_declined_otherwise_or_a_drain_stays_declined(tmp_path: Path, drain: bool) -> None:
    """A reviewer's: a stop declined because the job was cancelled meanwhile said "the next
    run resumes from the newest checkpoint" of a job ending Cancelled; a drain, which waits
    for its input however long, was cut short into a stop without a savepoint."""
    reason = (
        FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING
        if drain
        else FailureReason.COORDINATOR_SHUTDOWN
    )
    supervisor = _DeclinedSupervisor(reason)
    paths = ControlPaths(tmp_path / "control")

    async def ask() -> ControlAnswer:
        job = cast(JobSupervisor, supervisor)
        async with serve_controls(paths, job, "default/probe", lambda: None, print) as control:
            supervisor.control = control
            return await asyncio.to_thread(request, paths, Command.STOP, drain=drain, wait=30.0)

    answer = asyncio.run(ask())

    assert answer.outcome is Outcome.DECLINED, answer
    assert supervisor.calls == ["savepoint"]


def test_a_stop_while_an_earlier_stop_ends_the_job_says_it_is_already_stopping(
    tmp_path: Path,
) -> None:
    answer = _answer_of(_SuspendingSupervisor(), Command.STOP, tmp_path)
    assert (answer.outcome, answer.message, answer.savepoint) == (
        Outcome.OK,
        "already stopping: an earlier stop's savepoint 6 completed and the job is ending Suspended",
        Image(6, _STOP_SAVEPOINT.path),
    )


@pytest.mark.parametrize(("due", "shown_path"), [(False, "discarded"), (True, "discarding")])
def test_a_running_status_and_the_status_file_name_a_discarded_checkpoint_alike(
    due: bool, shown_path: str
) -> None:
    """`status` of a run that had just finished showed CHECKPOINT none while `status -o json`
    from its status file showed {"id": 8, "path": null} (a newcomer's): both name the
    finished job's last checkpoint, which retention discarded; "discarding" while its
    files wait for their delete (it said "discarded" while `list` showed them, an Azure
    user's)."""
    last = CheckpointOutcome(
        8, CheckpointKind.CHECKPOINT, OutcomeStatus.COMPLETED, 100.0, 101.5, 12, 7_000
    )
    record = JobRecord(
        phase=JobPhase.FINISHED, attempt=1, coordinator=PersistedState(history=(last,))
    )
    if due:
        record.discards_due = [DiscardDue(CheckpointKind.CHECKPOINT, 8)]
    supervisor = cast(JobSupervisor, SimpleNamespace(record=record))
    server = ControlServer(supervisor, "default/job", lambda: None, "token", print)

    status = RuntimeStatus.from_json(json.loads(json.dumps(server.status().to_json())))

    assert status.last_checkpoint == Image(8, None, discard_due=due)
    assert status.last_savepoint is None
    header, row = (line.split() for line in status_lines(status, wide=True))
    shown = dict(zip(header, row, strict=False))
    assert (shown["CHECKPOINT"], shown["CHECKPOINT-PATH"]) == ("8", shown_path)
    assert (shown["SAVEPOINT"], shown["SAVEPOINT-PATH"]) == ("none", "none")


def test_a_running_status_says_when_the_next_periodic_savepoint_is_due() -> None:
    record = JobRecord(phase=JobPhase.RUNNING, attempt=1, next_periodic_savepoint=1_800_000_000.0)
    supervisor = cast(JobSupervisor, SimpleNamespace(record=record))
    server = ControlServer(supervisor, "default/job", lambda: None, "token", print)

    status = RuntimeStatus.from_json(json.loads(json.dumps(server.status().to_json())))

    assert status.next_periodic_savepoint == "2027-01-15T08:00:00Z"
    header, row = (line.split() for line in status_lines(status, wide=True))
    assert dict(zip(header, row, strict=False))["NEXT-PERIODIC-SAVEPOINT"] == (
        "2027-01-15T08:00:00Z"
    )


class _HeldAgent(FakeAgent):
    """Its tasks acknowledge nothing until told (`release`)."""

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        await super().trigger(checkpoint_id, kind, after)
        self.snapshots[checkpoint_id] = replace(self.snapshots[checkpoint_id], acks=())

    def release(self, checkpoint_id: int) -> None:
        acks = tuple(AckReport(task, self.batch, 10, 1) for task in TASKS)
        self.snapshots[checkpoint_id] = replace(self.snapshots[checkpoint_id], acks=acks)


def test_two_stops_at_once_both_name_the_savepoint_the_job_stopped_with(tmp_path: Path) -> None:
    """The real supervisor: the stop whose savepoint the other's completion cut short said
    'savepoint 2 given up: the job is stopping', exit 1, naming no savepoint (a newcomer's).
    Now both stops are done by the first savepoint, and say which."""
    paths = ControlPaths(tmp_path / "control")
    launcher = FakeLauncher()
    launcher.agent_class = _HeldAgent
    job = _RealRun(launcher)
    supervisor = job.supervisor

    async def scenario() -> tuple[ControlAnswer, ControlAnswer, TerminalOutcome]:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        async with serve_controls(paths, supervisor, "default/probe", lambda: None, print) as (
            job.control
        ):
            first = asyncio.create_task(asyncio.to_thread(request, paths, Command.STOP, wait=30.0))
            agent = launcher.drivers[0].agent
            assert isinstance(agent, _HeldAgent)
            await until(lambda: agent.triggers == [1])
            second = asyncio.create_task(asyncio.to_thread(request, paths, Command.STOP, wait=30.0))
            await until(lambda: agent.triggers == [1, 2])
            agent.release(1)
            await until(lambda: supervisor.record.phase is JobPhase.SUSPENDING)
            answers = await first, await second
            launcher.drivers[0].code = DriverExit.STOPPED_WITH_SAVEPOINT
            return *answers, await run

    first, second, outcome = asyncio.run(scenario())

    assert outcome is TerminalOutcome.SUSPENDED
    assert first.savepoint is not None and first.savepoint.label.startswith("stop request ")
    label = first.savepoint.label  # the first stop's: its savepoint stopped the job
    savepoint = Image(1, STORAGE.metadata_path(CheckpointKind.SAVEPOINT, 1), label=label)
    assert (first.outcome, first.message, first.savepoint) == (
        Outcome.OK,
        "savepoint 1 completed",
        savepoint,
    )
    assert (second.outcome, second.message, second.savepoint) == (
        Outcome.OK,
        "already stopping: an earlier stop's savepoint 1 completed and the job is ending Suspended",
        savepoint,
    )
    [given_up] = [n for n in job.notices if n.reason == "CheckpointNotNeeded"]
    assert given_up.message == "savepoint 2 given up: the job is stopping with savepoint 1"


class _RealRun:
    """A real supervisor of fake drivers whose notices reach the run's control server once
    it serves (``control``), as a local run's do."""

    def __init__(self, launcher: FakeLauncher, janitor: NoJanitor | None = None) -> None:
        self.notices: list[Notice] = []
        self.control: ControlServer | None = None
        self.supervisor = JobSupervisor(
            storage=STORAGE,
            config=CoordinatorConfig(interval=None, timeout=30.0),
            restart_policy=RestartPolicySpec(RestartPolicyType.NEVER, 0, 0.01, 0.05),
            launcher=launcher,
            janitor=janitor or NoJanitor(),
            save=_ignore,
            record=JobRecord(),
            report=self._notice,
        )

    def _notice(self, notice: Notice) -> None:
        self.notices.append(notice)
        if self.control is not None:
            self.control.notice(notice)


async def _ignore(record: JobRecord) -> None:
    return None


def test_a_savepoint_is_disposed_of_through_the_run(tmp_path: Path) -> None:
    """`savepoint --dispose` while the job runs: the run's coordinator takes it out of the
    registry and the driver's agent deletes its files; the answer says so. The newest
    image is kept (declined), one not registered is refused."""
    paths = ControlPaths(tmp_path / "control")
    launcher = FakeLauncher()
    job = _RealRun(launcher)
    supervisor = job.supervisor

    async def scenario() -> list[ControlAnswer]:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        agent = launcher.drivers[0].agent
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: len(supervisor.record.coordinator.savepoints) == 1)
        agent.batch = 4
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: len(supervisor.record.coordinator.savepoints) == 2)
        async with serve_controls(paths, supervisor, "default/probe", lambda: None, print) as (
            job.control
        ):
            answers = [
                await asyncio.to_thread(request, paths, Command.DISPOSE, wait=30.0, savepoint=n)
                for n in (2, 1, 1, 9)
            ]
            # Two requests at once: the second is told it is done already, not left to
            # wait out its timeout (a reviewer's).
            supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
            await until(lambda: len(supervisor.record.coordinator.savepoints) == 2)
            supervisor.dispose(2, "first")
            supervisor.dispose(2, "second")
            await until(lambda: any(n.label == "second" for n in job.notices))
        supervisor.cancel()
        await run
        assert agent.discarded_savepoints == [1, 2]
        told = {(n.label, n.reason, n.message) for n in job.notices if n.label}
        assert (
            "second",
            "SavepointNotDisposed",
            "savepoint 2 is not in the job's registry",
        ) in told
        assert (
            "first",
            "SavepointDisposed",
            "savepoint 2 disposed of: no longer registered, its files deleted",
        ) in told
        return answers

    newest, disposed, again, unknown = asyncio.run(scenario())

    assert (disposed.outcome, disposed.message) == (
        Outcome.OK,
        "savepoint 1 disposed of: no longer registered, its files deleted",
    )
    assert [s.checkpoint_id for s in supervisor.record.coordinator.savepoints] == [3]
    assert newest.outcome is Outcome.DECLINED
    assert newest.message.startswith("savepoint 2 is the job's newest image (batch 4)")
    assert (again.outcome, again.message) == (
        Outcome.FAILED,
        "savepoint 1 is not in the job's registry",
    )
    assert unknown.outcome is Outcome.FAILED


class _HangingJanitor(NoJanitor):
    """Storage that does not answer: garbage collection never ends."""

    def __init__(self) -> None:
        super().__init__()
        self.collecting = asyncio.Event()
        self.collections = 0

    async def collect_garbage(self, checkpoints: list[int], savepoints: list[int]) -> None:
        self.collections += 1
        self.collecting.set()
        await asyncio.Event().wait()


@pytest.mark.parametrize("ending", [TerminalOutcome.FINISHED, TerminalOutcome.CANCELLED])
def test_cancel_while_an_ended_jobs_cleanup_hangs_stops_it_and_says_the_job_ended(
    tmp_path: Path, ending: TerminalOutcome, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run sat in its end's garbage collection for 14 minutes against an endpoint that
    never answered; `cancel` said "cancelling ... its checkpoints are discarded" and the
    run did not end, nor after two SIGTERMs (an S3 user's). A cancelled job's second
    cancel said "not cancelled" (an Azure user's)."""
    monkeypatch.setattr(interpreter, "SLOW_CLEANUP_SECONDS", 0.2)
    paths = ControlPaths(tmp_path / "control")
    launcher = FakeLauncher()
    janitor = _HangingJanitor()
    job = _RealRun(launcher, janitor)
    supervisor = job.supervisor

    async def scenario() -> tuple[ControlAnswer, TerminalOutcome]:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        async with serve_controls(paths, supervisor, "default/probe", lambda: None, print) as (
            job.control
        ):
            if ending is TerminalOutcome.FINISHED:
                launcher.drivers[0].code = DriverExit.FINISHED
            else:
                await asyncio.to_thread(request, paths, Command.CANCEL)
            await asyncio.wait_for(janitor.collecting.wait(), 10)
            # The run says it waits on storage (it said nothing for minutes).
            await until(lambda: any(n.reason == "CleanupSlow" for n in job.notices))
            # A dispose meanwhile is told the run takes no more requests, not left to wait
            # out its timeout.
            dispose = await asyncio.to_thread(
                request, paths, Command.DISPOSE, wait=30.0, savepoint=1
            )
            assert (dispose.outcome, dispose.message) == (
                Outcome.FAILED,
                f"the job ended {ending.value} and its run is ending: ask again once it has "
                "ended (the command then disposes of the savepoint itself)",
            )
            answer = await asyncio.to_thread(request, paths, Command.CANCEL)
            outcome = await asyncio.wait_for(run, 10)
        # Cut short, the end's cleanup starts no more work (its next step would hang too).
        work = janitor.collect_garbage([], [])
        assert await supervisor._interpreter.clean_up(work) is False
        assert janitor.collections == 1
        return answer, outcome

    answer, outcome = asyncio.run(scenario())

    assert outcome is ending
    ended = (
        "the job was cancelled already"
        if ending is TerminalOutcome.CANCELLED
        else "not cancelled: the job ended Finished"
    )
    assert (answer.outcome, answer.message) == (
        Outcome.FAILED,
        f"{ended}; its storage cleanup is stopped (what it left stays in storage until a run "
        "of the job cleans up) and the run ends",
    )
    said = [(n.reason, n.message) for n in job.notices if n.reason == "CleanupFailed"]
    assert said == [
        (
            "CleanupFailed",
            "storage cleanup stopped (`cancel`, a second Ctrl-C): what it left stays in "
            "storage until a run of the job cleans up",
        )
    ]
