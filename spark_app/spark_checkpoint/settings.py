"""What the runtime (local runner or Kubernetes operator) tells a driver, via environment.

The token is read from a file, not the environment, so it does not show up in process
listings or pod specs (in Kubernetes the file is a mounted Secret).
"""

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from spark_checkpoint.protocol import ProtocolError, RestoreCandidate, StorageOwner

PREFIX = "SPARK_CHECKPOINT_"
# The images to restore from, newest first: a JSON list (URIs may contain commas).
RESTORE_VARIABLE = f"{PREFIX}RESTORE"
# The registry the job's storage must belong to (`StorageOwner`, JSON), for drivers and
# janitors alike.
OWNER_VARIABLE = f"{PREFIX}OWNER"
# The address the driver's agent listens on (default: the loopback interface).
AGENT_HOST_VARIABLE = f"{PREFIX}AGENT_HOST"
# Where a driver that fails writes its error, for its runtime to show (a driver pod's
# termination message file; a file beside a local driver's log). Optional.
ERROR_FILE_VARIABLE = f"{PREFIX}ERROR_FILE"
# What Kubernetes keeps of a termination message: the file's last 4096 bytes.
TERMINATION_MESSAGE_BYTES = 4096
# The Spark settings of a driver whose executors run in its own process (local mode): it
# listens on the loopback interface only, where Spark would open its RPC and block
# manager ports on the machine's address.
LOOPBACK_DRIVER_CONF = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
# The first line `report_error` writes: a runtime tells by it a reported error from a log's
# tail, which is what a termination message holds when the file is empty.
REPORTED_ERROR_HEADER = "error reported by run_coordinated:"
REPORTED_ERROR_LINES = 6


def attempt_directory(work_dir: Path, attempt: int) -> Path:
    """Where driver attempt ``attempt`` keeps its live checkpoint location and pins."""
    return work_dir / f"attempt-{attempt}"


def attempt_directories(work_dir: Path) -> dict[int, Path]:
    """The attempt directories in ``work_dir``, by attempt."""
    found = {}
    for directory in work_dir.glob("attempt-*"):
        number = directory.name.removeprefix("attempt-")
        if number.isdigit():
            found[int(number)] = directory
    return found


def remove_attempt_directories(work_dir: Path, which: Callable[[int], bool]) -> None:
    """Remove the attempt directories of ``work_dir`` whose attempt ``which`` picks: dead
    live locations, as a restore reads storage, never a live location."""
    for number, directory in attempt_directories(work_dir).items():
        if which(number):
            shutil.rmtree(directory, ignore_errors=True)


class SettingsError(ValueError):
    """A required setting is missing or malformed; the message names the variable."""


@dataclass(frozen=True, slots=True)
class DriverSettings:
    namespace: str
    job: str
    storage_root: str
    work_dir: Path
    agent_host: str
    agent_port: int
    token: str
    attempt: int
    restore_candidates: tuple[RestoreCandidate, ...]
    owner: StorageOwner
    # A local run's driver inherits the agent's socket, bound to agent_port by the runtime:
    # a port picked free and bound only by the driver was taken meanwhile at times (by
    # Spark's own ports, another process: which would then have received the token).
    agent_socket_fd: int | None = None

    def to_environment(self, token_file: Path, error_file: Path) -> dict[str, str]:
        """The variables that make a driver process see these settings, and where it
        writes the error it fails with (`report_error`)."""
        return {
            ERROR_FILE_VARIABLE: str(error_file),
            f"{PREFIX}NAMESPACE": self.namespace,
            f"{PREFIX}JOB": self.job,
            f"{PREFIX}STORAGE": self.storage_root,
            f"{PREFIX}WORK_DIR": str(self.work_dir),
            AGENT_HOST_VARIABLE: self.agent_host,
            f"{PREFIX}AGENT_PORT": str(self.agent_port),
            f"{PREFIX}TOKEN_FILE": str(token_file),
            f"{PREFIX}ATTEMPT": str(self.attempt),
            RESTORE_VARIABLE: json.dumps([c.encode() for c in self.restore_candidates]),
            OWNER_VARIABLE: self.owner.encode(),
            **(
                {}
                if self.agent_socket_fd is None
                else {f"{PREFIX}AGENT_SOCKET_FD": str(self.agent_socket_fd)}
            ),
        }

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> "DriverSettings":
        env = os.environ if env is None else env

        def get(name: str) -> str:
            value = env.get(PREFIX + name, "").strip()
            if not value:
                raise SettingsError(
                    f"{PREFIX}{name} is not set: run the pipeline with `spark-checkpoint run` "
                    "or as a SparkCheckpointJob"
                )
            return value

        def number(name: str) -> int:
            text = get(name)
            if not text.isdigit():
                raise SettingsError(f"{PREFIX}{name}: expected a number, got {text!r}")
            return int(text)

        token_file = Path(get("TOKEN_FILE"))
        try:
            token = token_file.read_text().strip()
        except OSError as error:
            raise SettingsError(f"{PREFIX}TOKEN_FILE: cannot read {token_file}: {error}") from None
        if not token:
            raise SettingsError(f"{PREFIX}TOKEN_FILE: {token_file} is empty")
        candidates = restore_candidates(env.get(RESTORE_VARIABLE, ""))
        return cls(
            namespace=get("NAMESPACE"),
            job=get("JOB"),
            storage_root=get("STORAGE"),
            work_dir=Path(get("WORK_DIR")),
            agent_host=env.get(AGENT_HOST_VARIABLE, "127.0.0.1"),
            agent_port=number("AGENT_PORT"),
            token=token,
            attempt=number("ATTEMPT"),
            restore_candidates=candidates,
            owner=storage_owner(env.get(OWNER_VARIABLE, "")),
            agent_socket_fd=number("AGENT_SOCKET_FD")
            if env.get(f"{PREFIX}AGENT_SOCKET_FD")
            else None,
        )


def restore_candidates(value: str) -> tuple[RestoreCandidate, ...]:
    """The images `RESTORE_VARIABLE`'s ``value`` lists, newest first (none when empty)."""
    try:
        restore = json.loads(value.strip() or "[]")
    except json.JSONDecodeError as error:
        raise SettingsError(f"{RESTORE_VARIABLE}: not a JSON list: {error}") from None
    if not isinstance(restore, list) or not all(isinstance(c, str) for c in restore):
        raise SettingsError(f"{RESTORE_VARIABLE}: expected a JSON list of strings")
    try:
        return tuple(RestoreCandidate.decode(item) for item in restore)
    except ProtocolError as error:
        raise SettingsError(f"{RESTORE_VARIABLE}: {error}") from None


def storage_owner(value: str) -> StorageOwner:
    """The registry `OWNER_VARIABLE`'s ``value`` names."""
    if not value.strip():
        raise SettingsError(
            f"{OWNER_VARIABLE} is not set: run the pipeline with `spark-checkpoint run` or as "
            "a SparkCheckpointJob"
        )
    try:
        return StorageOwner.decode(value)
    except ProtocolError as error:
        raise SettingsError(f"{OWNER_VARIABLE}: {error}") from None


def report_error(message: str, env: Mapping[str, str] | None = None) -> None:
    """Write the error a driver ends with to `ERROR_FILE_VARIABLE`'s file, if set, for its
    runtime to show whatever the log holds after it: after `REPORTED_ERROR_HEADER`, the
    message's error lines (`error_lines`) in at most `TERMINATION_MESSAGE_BYTES`. Best
    effort: reporting never fails a driver."""
    error_file = (os.environ if env is None else env).get(ERROR_FILE_VARIABLE)
    if not error_file:
        return
    text = "\n".join([REPORTED_ERROR_HEADER, *error_lines(message)]).encode(errors="replace")
    # Kubernetes keeps a message's end: one cut here keeps its head, on a character.
    cut = text[:TERMINATION_MESSAGE_BYTES].decode(errors="ignore")
    # Never through a link: one placed there would have the report truncate its target.
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with contextlib.suppress(OSError), open(os.open(error_file, flags, 0o666), "w") as report:
        report.write(cut)


PYTHON_TRACEBACK = "Traceback (most recent call last):"
# Where Spark's error of a failed query ends and its description of the query (the plan,
# often kilobytes) begins.
QUERY_DESCRIPTION = "\n=== Streaming Query ==="
# Python's lines between chained tracebacks, and where PySpark appends the JVM's stack.
_CHAINED = ("During handling of the above exception", "The above exception was the direct")
_JVM_STACK = "JVM stacktrace:"


def error_lines(message: str) -> list[str]:
    """The lines of an error message that say what failed: its first line and those
    continuing it, up to a stack frame or a blank line. A message holding Python tracebacks
    (an exception raised in a UDF or a foreachBatch function, as Spark passes it on) names
    the exception their last one ended with, in place of the traceback that precedes it.
    Spark's description of the query that follows its error is never part of it."""
    lines = message.split(QUERY_DESCRIPTION, 1)[0].strip().splitlines()
    if not lines:
        return []
    if any(PYTHON_TRACEBACK in line for line in lines):
        exception = _python_exception(lines[1:])
        first = lines[0].rstrip()
        if exception is None:
            return [first]
        if PYTHON_TRACEBACK in first:
            return [first[: first.index(PYTHON_TRACEBACK)] + exception]
        return [f"{first} {exception}"] if first.endswith(":") else [first, exception]
    shown: list[str] = []
    for line in lines:
        if shown and (not line.strip() or line[:1].isspace()):
            break
        shown.append(line.rstrip())
        if len(shown) == REPORTED_ERROR_LINES:
            break
    return shown


def _python_exception(lines: list[str]) -> str | None:
    """The exception line the last of Python's tracebacks in `lines` ends with: the last
    line that is none of a traceback's frames, headers or links between chained ones."""
    found = None
    for line in lines:
        if line.startswith(_JVM_STACK):
            break
        frame = not line.strip() or line[:1].isspace()
        if not frame and PYTHON_TRACEBACK not in line and not line.startswith(_CHAINED):
            found = line.rstrip()
    return found
