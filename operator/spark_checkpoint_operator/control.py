"""A local run's controls from another terminal, as Flink's CLI has them: ``status``,
``savepoint``, ``stop`` and ``cancel``.

The runtime serves them on a Unix domain socket in ``<job dir>/control/`` (the directory
0700, the socket 0600, never TCP); each run writes a new token beside it (0600) that a
request must carry, compared in constant time, like the agent's bearer token. The
requests and answers are the documents of `control_protocol`.
"""

import asyncio
import contextlib
import hmac
import os
import secrets
import socket
import stat
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from spark_checkpoint.protocol import ProtocolError
from spark_checkpoint_operator.control_protocol import (
    MAX_LINE_BYTES,
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
    CompletedCheckpoint,
    FailureReason,
    JobPhase,
    TerminalOutcome,
    TriggerRequested,
)
from spark_checkpoint_operator.coordinator.state import format_time
from spark_checkpoint_operator.local_files import UnreadableFile, read_small_text
from spark_checkpoint_operator.status import last_image
from spark_checkpoint_operator.supervisor import (
    FINISHING_NEEDS_NO_SAVEPOINT,
    FINISHING_TAKES_NO_SAVEPOINT,
    NO_QUERY_RUNNING,
    JobRecord,
    JobSupervisor,
    Notice,
)

SOCKET_NAME = "runtime.sock"
TOKEN_NAME = "token"
MAX_TOKEN_BYTES = 4096  # a token is 43 characters: anything larger is no token of ours
# Unix socket paths are limited to 107 bytes; a longer one is reached through the
# directory's descriptor (/proc/self/fd/N/runtime.sock).
MAX_SOCKET_PATH = 100
POLL_SECONDS = 0.05
TRIGGER_GRACE_SECONDS = 5.0
REQUEST_SECONDS = 10.0  # a connection that sends no request line is not kept open


class NoRuntime(Exception):
    """No runtime answers on the control socket of that state directory."""


class ControlRefused(Exception):
    """The control directory is not private, or the runtime refused the request."""


@dataclass(frozen=True, slots=True)
class ControlPaths:
    directory: Path

    @property
    def socket(self) -> Path:
        return self.directory / SOCKET_NAME

    @property
    def token(self) -> Path:
        return self.directory / TOKEN_NAME


@contextlib.contextmanager
def _socket_address(path: Path) -> Iterator[str]:
    """``path`` as a socket address: itself if short enough, else through an open
    descriptor of its directory."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        yield str(path)
        return
    descriptor = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{descriptor}/{path.name}"
    finally:
        os.close(descriptor)


# --------------------------------------------------------------------------- the runtime's side


def next_run(supervisor: JobSupervisor) -> str:
    """What the next run of a job stopped without a savepoint resumes from, as said."""
    image = supervisor.resumes_from
    if image is None:
        return "no checkpoint or savepoint to resume from: the next run starts afresh"
    return f"the next run resumes from {image}"


class ControlServer:
    """Answers the control requests of one run of one job."""

    def __init__(
        self,
        supervisor: JobSupervisor,
        job: str,
        driver_pid: Callable[[], int | None],
        token: str,
        report: Callable[[str], None],
    ) -> None:
        self._supervisor = supervisor
        self._report = report
        self._job = job
        self._driver_pid = driver_pid
        self._token = token
        self._asking: set[str] = set()  # the labels of the requests waiting for an answer
        # Request label -> its answer, told by a notice: declined, failed or given up (the
        # job stopped or finished first). A savepoint can fail between two looks at the
        # record, so a notice, not the record, tells its end.
        self._told: dict[str, ControlAnswer] = {}
        self._ended = False

    def notice(self, notice: Notice) -> bool:
        """Every notice of the supervisor: one about a request of ours answers it. True when
        it is no news for the run's lines: a stop whose request met the final checkpoint's
        completion has nothing to do, which is said instead of the declined request."""
        if notice.label not in self._asking:
            return False
        if notice.reason == "RequestDeclined":
            finishing = self._supervisor.finishing
            if finishing and notice.label.startswith(Command.STOP):
                self._told[notice.label] = self._stop_finishing()
                return True
            if notice.label.startswith(f"{Command.STOP} request") and notice.message.endswith(
                FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING.description
            ):
                # As Ctrl-C: the savepoint cannot be taken now (the query has not committed
                # a batch yet, an executor is missing), and the user asked to stop. Not a
                # drain, which waits for its input however long; nor a decline for another
                # reason (the job cancelled meanwhile ends Cancelled whatever a stop says).
                reason = notice.message.partition(": ")[2]
                self._told[notice.label] = self._stop_without_savepoint(
                    f"no savepoint can be taken now: {reason}"
                )
                return True
            # Not "not all required tasks are running (the query is starting ...)": it ended.
            message = FINISHING_TAKES_NO_SAVEPOINT if finishing else notice.message
            self._told[notice.label] = ControlAnswer(Outcome.DECLINED, message)
        elif notice.reason == "SavepointDisposed":
            self._told[notice.label] = ControlAnswer(Outcome.OK, notice.message)
        elif notice.reason == "SavepointNotDisposed":
            self._told[notice.label] = ControlAnswer(Outcome.FAILED, notice.message)
        elif (
            notice.reason == "CheckpointNotNeeded"
            and notice.label.startswith(Command.STOP)
            and self._supervisor.stopped_with is not None
        ):
            # Another stop's savepoint completed first: this stop is done by it.
            self._told[notice.label] = self._already_stopping()
        elif notice.reason in ("CheckpointFailed", "CheckpointNotNeeded"):
            self._told[notice.label] = ControlAnswer(Outcome.FAILED, notice.message)
        return False

    def _already_stopping(self) -> ControlAnswer:
        """A stop while an earlier stop's savepoint completed and the driver stops: done,
        with that savepoint (which the next run resumes from)."""
        stopped_with = self._supervisor.stopped_with
        if stopped_with is None:  # the driver has just exited
            return ControlAnswer(
                Outcome.OK,
                "already stopping: an earlier stop's savepoint completed and the job is "
                "ending Suspended",
            )
        return ControlAnswer(
            Outcome.OK,
            f"already stopping: an earlier stop's savepoint {stopped_with.checkpoint_id} "
            "completed and the job is ending Suspended",
            _image(stopped_with),
        )

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answer = await self._answer(reader, writer)
            writer.write(encode_line(answer))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the command went away: its request stands, nobody to tell
        finally:
            writer.close()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> ControlAnswer:
        peer = writer.get_extra_info("socket")
        if peer is not None and _peer_uid(peer) != os.getuid():
            return ControlAnswer(Outcome.REFUSED, "the request comes from another user")
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), REQUEST_SECONDS)
        except asyncio.LimitOverrunError:
            return ControlAnswer(Outcome.REFUSED, f"a request is at most {MAX_LINE_BYTES} bytes")
        except TimeoutError:
            return ControlAnswer(Outcome.REFUSED, f"no request line within {REQUEST_SECONDS:.0f}s")
        try:
            request = decode_line(line, ControlRequest.from_json)
        except ProtocolError as error:
            return ControlAnswer(Outcome.REFUSED, f"not a control request: {error}")
        # surrogatepass: a JSON string may hold a lone surrogate, which UTF-8 does not.
        offered = request.token.encode(errors="surrogatepass")
        if not hmac.compare_digest(offered, self._token.encode()):
            return ControlAnswer(Outcome.REFUSED, "wrong token: not this run's")
        match request.command:
            case Command.STATUS:
                return ControlAnswer(Outcome.OK, "running", status=self.status())
            case Command.CANCEL if self._supervisor.record.phase is JobPhase.SUSPENDING:
                # The stop's savepoint completed and the driver is stopping: nothing is left
                # to cancel (it said "cancelling" while the job ended Suspended).
                return ControlAnswer(
                    Outcome.FAILED,
                    "not cancelled: the stop's savepoint completed and the job is ending "
                    "Suspended, its checkpoints kept",
                )
            case Command.CANCEL if (ended := self._supervisor.outcome) is not None:
                # The job ended (a stop while no query ran, its input done): only its end's
                # storage cleanup runs, which storage that does not answer held for ever.
                self._report("`spark-checkpoint cancel`: stopping the storage cleanup")
                self._supervisor.cancel()
                said = (
                    "the job was cancelled already"
                    if ended is TerminalOutcome.CANCELLED
                    else f"not cancelled: the job ended {ended.value}"
                )
                return ControlAnswer(
                    Outcome.FAILED,
                    f"{said}; its storage cleanup is stopped (what it left stays in storage "
                    "until a run of the job cleans up) and the run ends",
                )
            case Command.CANCEL:
                leaves = self._supervisor.what_cancelling_leaves()
                self._report(
                    f"`spark-checkpoint cancel`: stopping the driver without a savepoint; {leaves}"
                )
                self._supervisor.cancel()
                return ControlAnswer(
                    Outcome.OK, f"cancelling: the driver stops without a savepoint; {leaves}"
                )
            # Before a request: one asked just after the final checkpoint completed was
            # given up when the run ended, exit 1, and the log said one was being taken.
            case Command.SAVEPOINT if self._supervisor.finishing:
                return ControlAnswer(Outcome.DECLINED, FINISHING_TAKES_NO_SAVEPOINT)
            case Command.SAVEPOINT:
                self._report("`spark-checkpoint savepoint`: taking a savepoint")
                return await self._savepoint(AfterCompletion.CONTINUE, request)
            case Command.STOP if self._supervisor.finishing:
                return self._stop_finishing()
            case Command.STOP if self._supervisor.record.phase is JobPhase.SUSPENDING:
                return self._already_stopping()
            # As Ctrl-C: its savepoint was declined, and `cancel` was all that was left.
            case Command.STOP if self._supervisor.record.phase in NO_QUERY_RUNNING:
                return self._stop_without_savepoint("the query is not running")
            case Command.STOP if request.drain:
                self._report(
                    "`spark-checkpoint stop --drain`: draining the input, then taking a "
                    "savepoint, then stopping"
                )
                return await self._savepoint(AfterCompletion.DRAIN, request)
            case Command.STOP:
                self._report("`spark-checkpoint stop`: taking a savepoint, then stopping")
                return await self._savepoint(AfterCompletion.STOP, request)
            case Command.DISPOSE:
                return await self._dispose(request)

    async def _dispose(self, request: ControlRequest) -> ControlAnswer:
        savepoint_id = request.savepoint
        if savepoint_id is None:
            return ControlAnswer(Outcome.REFUSED, "a dispose request names its savepoint")
        if (ended := self._supervisor.outcome) is not None:
            # Its run takes no more requests: this one would wait out its timeout.
            return ControlAnswer(
                Outcome.FAILED,
                f"the job ended {ended.value} and its run is ending: ask again once it has "
                "ended (the command then disposes of the savepoint itself)",
            )
        record = self._supervisor.record
        if (why := record.why_not_disposable(savepoint_id)) is not None:
            registered = any(s.checkpoint_id == savepoint_id for s in record.coordinator.savepoints)
            return ControlAnswer(Outcome.DECLINED if registered else Outcome.FAILED, why)
        self._report(
            f"`spark-checkpoint savepoint --dispose`: disposing of savepoint {savepoint_id}"
        )
        label = f"`spark-checkpoint savepoint --dispose` {secrets.token_hex(4)}"
        self._asking.add(label)
        try:
            self._supervisor.dispose(savepoint_id, label)
            deadline = time.monotonic() + request.wait
            while label not in self._told:
                if self._ended:
                    return ControlAnswer(
                        Outcome.FAILED,
                        f"the run ended before it disposed of savepoint {savepoint_id}",
                    )
                if time.monotonic() >= deadline:
                    savepoints = self._supervisor.record.coordinator.savepoints
                    if all(s.checkpoint_id != savepoint_id for s in savepoints):
                        return ControlAnswer(
                            Outcome.OK,
                            f"savepoint {savepoint_id} disposed of: no longer registered",
                        )
                    return ControlAnswer(
                        Outcome.TRIGGERED,
                        f"the disposal of savepoint {savepoint_id} is requested: the run "
                        "takes it at its next look at the driver",
                    )
                await asyncio.sleep(POLL_SECONDS)
            return self._told[label]
        finally:
            self._asking.discard(label)
            self._told.pop(label, None)

    def _stop_without_savepoint(self, why: str) -> ControlAnswer:
        said = f"stopping the driver without a savepoint: {why} ({next_run(self._supervisor)})"
        self._report(f"`spark-checkpoint stop`: {said}")
        self._supervisor.suspend_now()
        return ControlAnswer(Outcome.OK, said)

    def _stop_finishing(self) -> ControlAnswer:
        """Nothing to stop: the driver exits on its own (`cancel` stops it now). A driver
        failing on its way out ends the job Suspended, not restarted."""
        self._report(f"`spark-checkpoint stop`: {FINISHING_NEEDS_NO_SAVEPOINT}")
        self._supervisor.end_suspended()
        return ControlAnswer(Outcome.OK, FINISHING_NEEDS_NO_SAVEPOINT)

    def status(self) -> RuntimeStatus:
        record = self._supervisor.record
        state = record.coordinator
        due = {discard.key for discard in record.discards_due}
        return RuntimeStatus(
            job=self._job,
            phase=record.phase.value,
            attempt=record.attempt,
            runtime_pid=os.getpid(),
            driver_pid=self._driver_pid(),
            last_batch=record.last_batch,
            last_checkpoint=Image.from_view(
                last_image(state, CheckpointKind.CHECKPOINT), CheckpointKind.CHECKPOINT, due
            ),
            last_savepoint=Image.from_view(
                last_image(state, CheckpointKind.SAVEPOINT), CheckpointKind.SAVEPOINT, due
            ),
            in_progress=len(record.pending),
            message=record.message,
            next_periodic_savepoint=(
                None
                if record.next_periodic_savepoint is None
                else format_time(record.next_periodic_savepoint)
            ),
        )

    def ended(self) -> None:
        """The run is over: requests still waiting are answered."""
        self._ended = True

    async def _savepoint(self, after: AfterCompletion, request: ControlRequest) -> ControlAnswer:
        # What the run's lines show with the savepoint ("savepoint 4 complete (stop request
        # 3f2a9c01)"); unique, so that each request knows its own answer.
        command = f"{request.command} --drain" if request.drain else request.command
        label = f"{command} request {secrets.token_hex(4)}"
        self._asking.add(label)
        try:
            return await self._answer_savepoint(after, label, request.wait)
        finally:
            self._asking.discard(label)
            self._told.pop(label, None)

    async def _answer_savepoint(
        self, after: AfterCompletion, label: str, wait: float
    ) -> ControlAnswer:
        self._supervisor.request(
            TriggerRequested(CheckpointKind.SAVEPOINT, after=after, label=label)
        )
        deadline = time.monotonic() + wait
        # Even an answer that does not wait says whether the request was declined.
        trigger_deadline = time.monotonic() + max(wait, TRIGGER_GRACE_SECONDS)
        savepoint_id: int | None = None
        while True:
            record = self._supervisor.record
            completed = next((s for s in record.coordinator.savepoints if s.label == label), None)
            if completed is not None:
                return ControlAnswer(
                    Outcome.OK, f"savepoint {completed.checkpoint_id} completed", _image(completed)
                )
            if label in self._told:
                return self._told[label]
            pending = next((p for p in record.pending if p.get("label") == label), None)
            if pending is not None:
                savepoint_id = int(pending["id"])
            elif savepoint_id is not None:  # ended, its notice not carried out yet
                return ControlAnswer(Outcome.FAILED, _failure(record, savepoint_id))
            if self._ended:
                return ControlAnswer(Outcome.FAILED, "the run ended before the savepoint completed")
            if savepoint_id is not None and time.monotonic() >= deadline:
                return ControlAnswer(
                    Outcome.TRIGGERED,
                    f"savepoint {savepoint_id} is in progress",
                    Image(savepoint_id, None),
                )
            if time.monotonic() >= trigger_deadline:
                # Queued behind a checkpoint in progress, or the minimum pause.
                return ControlAnswer(
                    Outcome.TRIGGERED, "the savepoint is requested, not started yet"
                )
            await asyncio.sleep(POLL_SECONDS)


def _image(completed: CompletedCheckpoint) -> Image:
    return Image(completed.checkpoint_id, completed.path, label=completed.label)


def _failure(record: JobRecord, savepoint_id: int) -> str:
    history = record.coordinator.history
    outcome = next((o for o in history if o.checkpoint_id == savepoint_id), None)
    if outcome is None or not outcome.message:
        return f"savepoint {savepoint_id} failed"
    return f"savepoint {savepoint_id} failed: {outcome.message}"


def _peer_uid(peer: socket.socket) -> int:
    credentials = peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", credentials)
    return int(uid)


@contextlib.asynccontextmanager
async def serve_controls(
    paths: ControlPaths,
    supervisor: JobSupervisor,
    job: str,
    driver_pid: Callable[[], int | None],
    report: Callable[[str], None],
) -> AsyncIterator[ControlServer]:
    """Serve the controls for the run inside the block; a new token each run."""
    paths.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(paths.directory, 0o700)  # one made by an earlier version, or by hand
    token = secrets.token_urlsafe(32)
    paths.token.unlink(missing_ok=True)
    descriptor = os.open(paths.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as token_file:
        token_file.write(token)
    control = ControlServer(supervisor, job, driver_pid, token, report)
    paths.socket.unlink(missing_ok=True)  # left by a killed run (the job lock is ours)
    with _socket_address(paths.socket) as address:
        server = await asyncio.start_unix_server(control.handle, address, limit=MAX_LINE_BYTES)
        os.chmod(address, 0o600)
    try:
        yield control
    finally:
        control.ended()
        server.close()
        paths.socket.unlink(missing_ok=True)
        paths.token.unlink(missing_ok=True)
        # Requests still waiting see the end and are answered before the loop stops.
        await asyncio.sleep(2 * POLL_SECONDS)


# --------------------------------------------------------------------------- the command's side


def check_private(paths: ControlPaths) -> None:
    """Refuse a control directory or socket that others may use: a request carries the
    run's token, and an answer is trusted."""
    for path, required in ((paths.directory, 0o700), (paths.socket, 0o600)):
        try:
            found = path.lstat()
        except (FileNotFoundError, NotADirectoryError):
            raise NoRuntime(f"no runtime is running for this job (no {path})") from None
        except OSError as error:  # a name too long for the filesystem, say
            raise NoRuntime(
                f"no runtime is running for this job ({path}: {error.strerror or error})"
            ) from None
        mode = stat.S_IMODE(found.st_mode)
        if found.st_uid != os.getuid() or mode & 0o077:
            raise ControlRefused(
                f"refusing {path}: it must be yours and private (mode {required:04o}), "
                f"it is mode {mode:04o} owned by uid {found.st_uid}"
            )


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the socket at `path`."""
    with _socket_address(path) as address, socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(5.0)
        try:
            connection.connect(address)
        except OSError:
            return False
    return True


def request(
    paths: ControlPaths,
    command: Command,
    *,
    drain: bool = False,
    wait: float = 0.0,
    savepoint: int | None = None,
) -> ControlAnswer:
    """Send one request to the runtime and return its answer. Raises `NoRuntime` when
    none answers, `ControlRefused` for a directory that is not private or a refusal."""
    check_private(paths)
    try:
        token = read_small_text(paths.token, MAX_TOKEN_BYTES).strip()
    except FileNotFoundError:
        if _answers(paths.socket):
            raise ControlRefused(
                f"a run answers on {paths.socket}, but its token {paths.token} is gone (deleted "
                "while it runs): no command can reach it; Ctrl-C where it runs, or SIGTERM to "
                "its process, stops it with a savepoint"
            ) from None
        raise NoRuntime(f"no runtime is running for this job (no token {paths.token})") from None
    except OSError as error:  # not allowed, a directory, a FIFO, not UTF-8 ...
        reason = error if isinstance(error, UnreadableFile) else error.strerror or error
        raise ControlRefused(f"cannot read the run's token {paths.token}: {reason}") from None
    document = ControlRequest(token, command, drain=drain, wait=wait, savepoint=savepoint)
    with _socket_address(paths.socket) as address, socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(wait + 30.0)
        try:
            connection.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NoRuntime(
                f"no runtime is running for this job (nothing answers on {paths.socket})"
            ) from None
        answer = b""
        try:
            connection.sendall(encode_line(document))
            while not answer.endswith(b"\n") and len(answer) <= MAX_LINE_BYTES:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            raise NoRuntime(f"the runtime did not answer within {wait + 30.0:.0f}s") from None
        except ConnectionError:  # reset or a broken pipe: a run ending as it was asked
            answer = b""
    if not answer:
        # A run killed as it answered may have completed what it was asked.
        shown = "" if command is Command.STATUS else "; `spark-checkpoint list` shows its images"
        raise NoRuntime(f"the runtime ended without answering{shown}")
    try:
        reply = decode_line(answer.rstrip(b"\n"), ControlAnswer.from_json)
    except ProtocolError as error:
        raise ControlRefused(f"not the runtime's answer: {error}") from None
    if reply.outcome is Outcome.REFUSED:
        raise ControlRefused(f"the runtime refused the request: {reply.message}")
    return reply


def wait_until_gone(paths: ControlPaths, timeout: float) -> bool:
    """Whether the runtime stopped answering within ``timeout`` (its run is over)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _socket_address(paths.socket) as address, socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(address)
            except (FileNotFoundError, ConnectionRefusedError):
                return True
        time.sleep(POLL_SECONDS * 2)
    return False
