"""The documents of a local run's control socket (`spark-checkpoint status`, `savepoint`,
`stop`, `cancel`): one JSON object a line, a request from the command, an answer from the
runtime.

As the agent protocol's (spark_checkpoint.protocol): frozen dataclasses, ``to_json`` gives
the JSON object (camelCase keys) and ``from_json`` checks every field's JSON type and range,
nothing coerced, raising `ProtocolError` whose one-line message names the field.
"""

import json
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self, TypeVar

# The agent protocol's checked field readers: a field has one kind of check and message.
from spark_checkpoint.protocol import (
    CheckpointKind,
    Fields,
    ProtocolError,
    read_boolean,
    read_integer,
    read_one_of,
    read_optional,
    read_string,
    shown,
)

# A request or an answer is one line of at most this many bytes.
MAX_LINE_BYTES = 64 * 1024
# The longest a command may ask the runtime to wait for a savepoint (a day).
MAX_WAIT_SECONDS = 86400.0

T = TypeVar("T")


class Command(StrEnum):
    STATUS = "status"
    SAVEPOINT = "savepoint"  # the job keeps running
    STOP = "stop"  # a savepoint, then the driver stops
    CANCEL = "cancel"  # stop now, without a savepoint
    DISPOSE = "dispose"  # a registered savepoint leaves the registry and storage


class Outcome(StrEnum):
    """How the runtime answered a request."""

    OK = "ok"  # done (a savepoint: completed; stop: savepoint completed, the run is ending;
    # dispose: no longer registered)
    TRIGGERED = "triggered"  # a savepoint under way (no wait asked, or the wait ran out)
    DECLINED = "declined"  # the coordinator declined the request; the message says why
    FAILED = "failed"  # the savepoint failed, or the run ended before it completed
    REFUSED = "refused"  # not this run's token, or not a control request


_optional_integer = read_optional(read_integer)


def _seconds(value: Any, field: str) -> float:
    # Compared, not converted: an integer beyond any float is refused like another (NaN and
    # the infinities fail the comparison too).
    if type(value) not in (int, float) or not 0 <= value <= MAX_WAIT_SECONDS:
        raise ProtocolError(
            f"{field} must be a number of seconds from 0 to {MAX_WAIT_SECONDS:.0f}, "
            f"got {shown(value)}"
        )
    return float(value)


def decode_line(line: bytes, read: Callable[[Any], T]) -> T:
    """One line of the socket as ``read`` makes it a document; anything else is a
    `ProtocolError`."""
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"a line is at most {MAX_LINE_BYTES} bytes")
    try:
        value = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ProtocolError(f"not a JSON document: {message}") from None
    except RecursionError:
        raise ProtocolError("not a JSON document: nested too deeply") from None
    return read(value)


def encode_line(document: "ControlRequest | ControlAnswer") -> bytes:
    return json.dumps(document.to_json(), separators=(",", ":")).encode() + b"\n"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """What a command asks the runtime. ``wait``: how long a savepoint or stop request
    waits for the savepoint to complete (0: answer once it is triggered)."""

    token: str
    command: Command
    drain: bool = False  # stop: process all available input before the savepoint
    wait: float = 0.0
    savepoint: int | None = None  # dispose: the savepoint's id

    def to_json(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "command": str(self.command),
            "drain": self.drain,
            "wait": self.wait,
            "savepoint": self.savepoint,
        }

    @classmethod
    def from_json(cls, value: Any) -> Self:
        fields = Fields(value, "the request")
        return cls(
            token=fields.read("token", read_string),
            command=fields.read("command", read_one_of(Command)),
            drain=fields.read("drain", read_boolean, default=False),
            wait=fields.read("wait", _seconds, default=0.0),
            savepoint=fields.read("savepoint", _optional_integer, default=None),
        )


@dataclass(frozen=True, slots=True)
class Image:
    """A checkpoint or savepoint: its id and its ``_metadata`` path (None while it is in
    progress, and once retention discarded a finished job's last checkpoint); whether the
    delete of a discarded one's files is still due (storage that did not answer)."""

    snapshot_id: int  # "id"
    path: str | None
    discard_due: bool = False  # "discardDue"
    # Who asked for it: "periodic", "upgrade", "nonce 3", a control's request; "" for none.
    label: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.snapshot_id,
            "path": self.path,
            "discardDue": self.discard_due,
            "label": self.label,
        }

    @classmethod
    def from_json(cls, value: Any, field: str) -> Self:
        fields = Fields.nested(value, field)
        return cls(
            fields.read("id", read_integer),
            fields.read("path", read_optional(read_string)),
            fields.read("discardDue", read_boolean, default=False),
            fields.read("label", read_string, default=""),
        )

    @classmethod
    def from_view(
        cls,
        view: Mapping[str, Any] | None,
        kind: CheckpointKind,
        discards_due: Set[tuple[CheckpointKind, int]],
    ) -> Self | None:
        """The status view's last image of `kind` (``status.last_image``), as the status
        file has it, with the record's `discards_due` (their keys)."""
        if view is None:
            return None
        path = view.get("path")
        discard_due = path is None and (kind, view["id"]) in discards_due
        return cls(view["id"], path, discard_due, str(view.get("label") or ""))


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    """What `spark-checkpoint status` shows of a running job."""

    job: str  # namespace/name
    phase: str
    attempt: int
    runtime_pid: int
    driver_pid: int | None
    last_batch: int | None
    last_checkpoint: Image | None
    last_savepoint: Image | None
    in_progress: int
    message: str
    # When the next periodic savepoint is due (RFC 3339, as status.nextPeriodicSavepoint).
    next_periodic_savepoint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "phase": self.phase,
            "attempt": self.attempt,
            "runtimePid": self.runtime_pid,
            "driverPid": self.driver_pid,
            "lastCommittedBatch": self.last_batch,
            "lastCheckpoint": None
            if self.last_checkpoint is None
            else self.last_checkpoint.to_json(),
            "lastSavepoint": None if self.last_savepoint is None else self.last_savepoint.to_json(),
            "inProgress": self.in_progress,
            "message": self.message,
            "nextPeriodicSavepoint": self.next_periodic_savepoint,
        }

    @classmethod
    def from_json(cls, value: Any, field: str = "status") -> Self:
        fields = Fields.nested(value, field)
        return cls(
            job=fields.read("job", read_string),
            phase=fields.read("phase", read_string),
            attempt=fields.read("attempt", read_integer),
            runtime_pid=fields.read("runtimePid", read_integer),
            driver_pid=fields.read("driverPid", _optional_integer),
            last_batch=fields.read("lastCommittedBatch", _optional_integer),
            last_checkpoint=fields.read("lastCheckpoint", read_optional(Image.from_json)),
            last_savepoint=fields.read("lastSavepoint", read_optional(Image.from_json)),
            in_progress=fields.read("inProgress", read_integer),
            message=fields.read("message", read_string),
            next_periodic_savepoint=fields.read(
                "nextPeriodicSavepoint", read_optional(read_string), default=None
            ),
        )


@dataclass(frozen=True, slots=True)
class ControlAnswer:
    """The runtime's answer: the outcome, a one-line message, and what it is about (the
    savepoint of a savepoint or stop request, the job's status)."""

    outcome: Outcome
    message: str
    savepoint: Image | None = None
    status: RuntimeStatus | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": str(self.outcome),
            "message": self.message,
            "savepoint": None if self.savepoint is None else self.savepoint.to_json(),
            "status": None if self.status is None else self.status.to_json(),
        }

    @classmethod
    def from_json(cls, value: Any) -> Self:
        fields = Fields(value, "the answer")
        return cls(
            outcome=fields.read("outcome", read_one_of(Outcome)),
            message=fields.read("message", read_string),
            savepoint=fields.read("savepoint", read_optional(Image.from_json), default=None),
            status=fields.read("status", read_optional(RuntimeStatus.from_json), default=None),
        )
