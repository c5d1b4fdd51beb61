"""The agent protocol's wire contract (docs/agent-protocol.md): its enums, every JSON
document the agent's HTTP API carries, and the restore-candidate encoding.

Both sides build and read their documents here: the agent and its server in the driver,
the agent client in the control plane, and the test doubles that play an agent. So a field
has one name, one type and one check. The coordinator core imports this module (and no
other of the data plane) for the enums, so the module uses the standard library only.

Each document is a frozen dataclass with Python names; ``to_json`` gives the JSON object
(camelCase keys, enums as strings) and ``from_json`` takes a decoded JSON value, checks
every field's JSON type and range (nothing is coerced: ``"7"``, ``7.0`` and ``true`` are
no id) and raises `ProtocolError`, whose one-line message names the field. Fields a reader
does not know are ignored, so adding a field is compatible (docs/agent-protocol.md,
"Transport and versioning").
"""

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Self, TypeVar

API_VERSION = "v1"
# A long poll holds back an answer whose only news is more task acknowledgements of
# snapshots still copying, at most this long after the first of them, so that one
# snapshot's acknowledgements come in a few answers rather than one each; any other change
# (a snapshot's state, a decline, the query) is answered at once. docs/agent-protocol.md,
# "Long polls".
ACKNOWLEDGEMENT_GATHER_SECONDS = 0.25
# Ids, batch ids and byte counts are int64 wherever they are recorded (the job's status in
# Kubernetes).
MAX_ID = 2**63 - 1
# The largest body either side reads, request or answer: a finalize lists every task (a
# stream-stream join and an aggregation at 8,000 partitions: 40,000 tasks, 1.4 MB), a
# status too. The driver runs the job author's code: its answers are untrusted input to an
# operator that serves every job, and one of hundreds of MiB would take its memory.
MAX_BODY_BYTES = 16 * 1024 * 1024
# The largest answer to a command (an acknowledgement, a finalize's or a garbage
# collection's answer, an error): a few hundred bytes, a few KiB of deleted ids.
MAX_COMMAND_ANSWER_BYTES = 1024 * 1024
# The most JSON values an answer may hold (counted by its ',', '[' and '{'), one per
# 8 bytes of the largest body: the densest answer the agent writes, a status of acks,
# holds one per 11 bytes or more. Python takes 35-90 bytes for each value, so 16 MiB of
# `[[],[],...]` took 500 MiB of an operator's memory.
MAX_ANSWER_VALUES = MAX_BODY_BYTES // 8

MAX_OWNER_ID_LENGTH = 200
# The agent closes a connection idle this long, or whose request's headers have not all
# come in this long (aiohttp's default, an hour, let whoever reaches the port hold sockets
# with a header byte now and then). The client keeps an idle connection for a third of it,
# so that it never sends on one the agent is closing.
IDLE_CONNECTION_SECONDS = 15.0

T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)


class ProtocolError(ValueError):
    """A document that breaks the contract; the one-line message names the field."""


class CheckpointKind(StrEnum):
    """What a snapshot is: a checkpoint (owned and retained by the coordinator) or a
    savepoint (self-contained, owned by the user)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class AfterCompletion(StrEnum):
    """What the query does once the snapshot is complete (stop-with-savepoint)."""

    CONTINUE = "continue"
    STOP = "stop"
    DRAIN = "drain"  # first wait until no input is left, then take the image and stop


class SnapshotPhase(StrEnum):
    """Where a snapshot is in the agent (docs/agent-protocol.md, "Snapshot states"). The
    status lists the phases up to FINALIZED only: those in flight."""

    CAPTURING = "capturing"
    COPYING = "copying"
    ACKNOWLEDGED = "acknowledged"
    FINALIZED = "finalized"
    COMPLETED = "completed"
    ABORTED = "aborted"


class QueryState(StrEnum):
    # The driver restores its image and starts its query: no query yet, no snapshot.
    STARTING = "starting"
    # A restored query that has not yet got past its image: no snapshot is taken.
    RESTORING = "restoring"
    RUNNING = "running"
    FINISHED = "finished"  # ended without error (bounded input exhausted)
    FAILED = "failed"  # ended with an exception
    STOPPED = "stopped"  # ended after a stop-with-savepoint

    @property
    def runs_tasks(self) -> bool:
        """Every snapshot task runs: a finished query's final image can still be taken."""
        return self in (QueryState.RUNNING, QueryState.FINISHED)


# --------------------------------------------------------------------------- checks


def shown(value: Any) -> str:
    """A JSON value as an error message quotes it: short, and a float as Python prints it."""
    if isinstance(value, str):
        value = value[:60]  # not all of a long one made into JSON first
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def read_integer(value: Any, field: str) -> int:
    """An id, batch id or count: a JSON integer from 0 to MAX_ID (no string, float, bool)."""
    if type(value) is not int or not 0 <= value <= MAX_ID:
        raise ProtocolError(f"{field} must be an integer from 0 to {MAX_ID}, got {shown(value)}")
    return value


def read_optional(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    def optional(value: Any, field: str) -> T | None:
        return None if value is None else check(value, field)

    return optional


_optional_integer = read_optional(read_integer)


def read_string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{field} must be a string, got {shown(value)}")
    return value


def read_boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{field} must be true or false, got {shown(value)}")
    return value


def read_one_of(values: type[E]) -> Callable[[Any, str], E]:
    def check(value: Any, field: str) -> E:
        if not isinstance(value, str) or value not in set(values):
            allowed = ", ".join(repr(str(member)) for member in values)
            raise ProtocolError(f"{field} must be one of {allowed}, got {shown(value)}")
        return values(value)

    return check


def _list_of(items: str, item: Callable[[Any, str], T]) -> Callable[[Any, str], tuple[T, ...]]:
    def check(value: Any, field: str) -> tuple[T, ...]:
        if not isinstance(value, list):
            raise ProtocolError(f"{field} must be a list of {items}, got {shown(value)}")
        return tuple(item(element, f"{field}[{index}]") for index, element in enumerate(value))

    return check


_ids = _list_of("ids", read_integer)
_task_names = _list_of("task names", read_string)
_REQUIRED: Any = object()


class Fields:
    """The fields of one JSON object being read. A bad one is a `ProtocolError` naming it
    by its path from the document's root (``checkpoints[0].acks[1].sizeBytes``)."""

    def __init__(self, value: Any, name: str, path: str = "") -> None:
        if not isinstance(value, dict):
            raise ProtocolError(f"{name} must be a JSON object, got {type(value).__name__}")
        self._fields: Mapping[str, Any] = value
        self._path = path

    @classmethod
    def nested(cls, value: Any, field: str) -> "Fields":
        return cls(value, field, f"{field}.")

    def read(self, key: str, check: Callable[[Any, str], T], default: Any = _REQUIRED) -> T:
        if key in self._fields:
            return check(self._fields[key], self._path + key)
        if default is _REQUIRED:
            raise ProtocolError(f"field {self._path + key!r} is missing")
        return check(default, self._path + key)


# --------------------------------------------------------------------------- restore candidates


def _canonical_id(text: str) -> int | None:
    """The id ``text`` spells without a leading zero in ASCII digits, or None."""
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    number = int(text)
    return number if number <= MAX_ID else None


@dataclass(frozen=True, slots=True)
class RestoreCandidate:
    """An image a driver may restore from: this job's registered checkpoint or savepoint
    (``checkpoint:N``, ``savepoint:N``), or another image's ``_metadata`` by URI
    (``external:<URI>``: the job's initial savepoint, or a savepoint or retained checkpoint
    that ``run --from`` names by its path). Build one with `registered` or
    `external`; `encode` and `decode` are the only spelling of candidates."""

    kind: CheckpointKind
    snapshot_id: int | None = None  # a registered image's id
    metadata_uri: str | None = None  # an external image's _metadata

    @classmethod
    def registered(cls, kind: CheckpointKind, snapshot_id: int) -> Self:
        return cls(kind, snapshot_id=snapshot_id)

    @classmethod
    def external(cls, metadata_uri: str) -> Self:
        return cls(CheckpointKind.SAVEPOINT, metadata_uri=metadata_uri)

    @property
    def is_external(self) -> bool:
        return self.metadata_uri is not None

    def encode(self) -> str:
        if self.metadata_uri is not None:
            return f"external:{self.metadata_uri}"
        return f"{self.kind}:{self.snapshot_id}"

    @classmethod
    def decode(cls, text: str) -> Self:
        prefix, _, rest = text.partition(":")
        if prefix == "external" and rest:
            return cls.external(rest)
        snapshot_id = _canonical_id(rest)
        if prefix in set(CheckpointKind) and snapshot_id is not None:
            return cls.registered(CheckpointKind(prefix), snapshot_id)
        raise ProtocolError(f"{shown(text)} is not checkpoint:N, savepoint:N or external:URI")

    def __str__(self) -> str:
        return self.encode()


@dataclass(frozen=True, slots=True)
class StorageOwner:
    """The registry of a job's snapshots that its storage belongs to: snapshots are valid
    because a registry lists them (the resource's status on Kubernetes, a state directory's
    ``status.json`` locally), and garbage collection deletes what its registry does not
    list, so two registries of one job on one storage (a job recreated under its name, a
    manifest run from a second state directory) would delete each other's snapshots and
    write the same ids. The runtime passes its registry to drivers and janitors
    (``SPARK_CHECKPOINT_OWNER``); storage records the first (`CheckpointStorage.claim`).
    ``id`` tells registries apart (a resource's uid, a random id a state directory keeps);
    ``description`` says to a person where the registry is."""

    id: str
    description: str

    def __post_init__(self) -> None:
        if not 1 <= len(self.id) <= MAX_OWNER_ID_LENGTH:
            raise ProtocolError(
                f"owner id: expected 1 to {MAX_OWNER_ID_LENGTH} characters, got {shown(self.id)}"
            )

    def encode(self) -> str:
        return json.dumps({"id": self.id, "description": self.description}, sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> Self:
        try:
            document = json.loads(text)
        except (ValueError, RecursionError):  # also nested too deeply, a number too long
            raise ProtocolError(f"owner: not JSON: {shown(text)}") from None
        if not isinstance(document, dict):
            raise ProtocolError(f"owner: not a JSON object: {shown(text)}")
        return cls(
            id=read_string(document.get("id"), "owner.id"),
            description=read_string(document.get("description"), "owner.description"),
        )


def _candidate(value: Any, field: str) -> RestoreCandidate:
    text = read_string(value, field)
    try:
        return RestoreCandidate.decode(text)
    except ProtocolError as error:
        raise ProtocolError(f"{field}: {error}") from None


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class TriggerBody:
    """``POST /v1/checkpoints``: take snapshot ``checkpoint_id``."""

    checkpoint_id: int  # "id"
    kind: CheckpointKind
    after: AfterCompletion = AfterCompletion.CONTINUE

    def to_json(self) -> dict[str, Any]:
        return {"id": self.checkpoint_id, "kind": str(self.kind), "after": str(self.after)}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        body = Fields(value, "the body")
        return cls(
            checkpoint_id=body.read("id", read_integer),
            kind=body.read("kind", read_one_of(CheckpointKind)),
            after=body.read("after", read_one_of(AfterCompletion), default="continue"),
        )


@dataclass(frozen=True, slots=True)
class FinalizeBody:
    """``POST /v1/checkpoints/{id}/finalize``: write ``_metadata`` from these tasks' acks."""

    tasks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"tasks": list(self.tasks)}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        return cls(tasks=Fields(value, "the body").read("tasks", _task_names))


@dataclass(frozen=True, slots=True)
class FinalizeAnswer:
    """What finalize wrote: the ``_metadata`` file's storage URI and the image's bytes."""

    path: str
    size_bytes: int  # "sizeBytes"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sizeBytes": self.size_bytes}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        body = Fields(value, "the body")
        return cls(
            path=body.read("path", read_string), size_bytes=body.read("sizeBytes", read_integer)
        )


@dataclass(frozen=True, slots=True)
class CompleteBody:
    """``POST /v1/checkpoints/{id}/complete``: the image of ``batch_id`` is registered."""

    batch_id: int  # "batchId"

    def to_json(self) -> dict[str, Any]:
        return {"batchId": self.batch_id}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        return cls(batch_id=Fields(value, "the body").read("batchId", read_integer))


@dataclass(frozen=True, slots=True)
class AbortBody:
    """``POST /v1/checkpoints/{id}/abort``; the reason is only logged."""

    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        return cls(reason=Fields(value, "the body").read("reason", read_string, default=""))


@dataclass(frozen=True, slots=True)
class DiscardCheckpointBody:
    """``POST /v1/checkpoints/{id}/discard``: the checkpoints whose shared files stay."""

    retained: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"retained": list(self.retained)}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        return cls(retained=Fields(value, "the body").read("retained", _ids))


@dataclass(frozen=True, slots=True)
class CollectGarbageBody:
    """``POST /v1/storage/collect-garbage``: the registered ids; the rest is garbage."""

    checkpoints: tuple[int, ...]
    savepoints: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"checkpoints": list(self.checkpoints), "savepoints": list(self.savepoints)}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        body = Fields(value, "the body")
        return cls(
            checkpoints=body.read("checkpoints", _ids), savepoints=body.read("savepoints", _ids)
        )


@dataclass(frozen=True, slots=True)
class CollectGarbageAnswer:
    """The ids whose directories were deleted, and how many shared files were."""

    checkpoints: tuple[int, ...]
    savepoints: tuple[int, ...]
    shared_files: int  # "sharedFiles"

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoints": list(self.checkpoints),
            "savepoints": list(self.savepoints),
            "sharedFiles": self.shared_files,
        }

    @classmethod
    def from_json(cls, value: Any) -> Self:
        body = Fields(value, "the body")
        return cls(
            checkpoints=body.read("checkpoints", _ids),
            savepoints=body.read("savepoints", _ids),
            shared_files=body.read("sharedFiles", read_integer),
        )


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """Any request the agent refuses or fails, with a 4xx or 5xx status: what went wrong,
    in one line (docs/agent-protocol.md, "Status codes and errors")."""

    message: str  # "error"

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message}

    @classmethod
    def from_json(cls, value: Any) -> Self:
        return cls(message=Fields(value, "the error answer").read("error", read_string))


class Acknowledgement(StrEnum):
    """The answer to a command with nothing else to report: ``{"<value>": true}``."""

    ACCEPTED = "accepted"  # a trigger (202): the snapshot runs in the background
    NOTIFIED = "notified"  # complete
    ABORTED = "aborted"
    DISCARDED = "discarded"  # a checkpoint's or a savepoint's discard

    def to_json(self) -> dict[str, Any]:
        return {self.value: True}

    def read(self, value: Any) -> Self:
        """This acknowledgement if ``value`` is it; else `ProtocolError` naming the field."""
        if not Fields(value, "the body").read(self.value, read_boolean):
            raise ProtocolError(f"{self.value} must be true, got false")
        return self


# --------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class AckReport:
    """A snapshot task copied all its files (``checkpoints[].acks[]``)."""

    task: str
    batch_id: int  # "batchId": the image's batch B
    size_bytes: int  # "sizeBytes": bytes the task stored
    duration_ms: int  # "durationMs"

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "batchId": self.batch_id,
            "sizeBytes": self.size_bytes,
            "durationMs": self.duration_ms,
        }

    @classmethod
    def from_json(cls, value: Any, field: str = "ack") -> Self:
        ack = Fields.nested(value, field)
        return cls(
            task=ack.read("task", read_string),
            batch_id=ack.read("batchId", read_integer),
            size_bytes=ack.read("sizeBytes", read_integer),
            duration_ms=ack.read("durationMs", read_integer),
        )


@dataclass(frozen=True, slots=True)
class DeclineReport:
    """A snapshot task failed (``checkpoints[].declines[]``)."""

    task: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "message": self.message}

    @classmethod
    def from_json(cls, value: Any, field: str = "decline") -> Self:
        decline = Fields.nested(value, field)
        return cls(
            task=decline.read("task", read_string), message=decline.read("message", read_string)
        )


@dataclass(frozen=True, slots=True)
class SnapshotStatus:
    """A snapshot in flight (``checkpoints[]``)."""

    checkpoint_id: int  # "id"
    kind: CheckpointKind
    state: SnapshotPhase
    batch_id: int | None  # "batchId": the image's batch B; None while capturing
    acks: tuple[AckReport, ...] = ()
    declines: tuple[DeclineReport, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.checkpoint_id,
            "kind": str(self.kind),
            "state": str(self.state),
            "batchId": self.batch_id,
            "acks": [ack.to_json() for ack in self.acks],
            "declines": [decline.to_json() for decline in self.declines],
        }

    @classmethod
    def from_json(cls, value: Any, field: str = "snapshot") -> Self:
        snapshot = Fields.nested(value, field)
        return cls(
            checkpoint_id=snapshot.read("id", read_integer),
            kind=snapshot.read("kind", read_one_of(CheckpointKind)),
            state=snapshot.read("state", read_one_of(SnapshotPhase)),
            batch_id=snapshot.read("batchId", _optional_integer),
            acks=snapshot.read("acks", _list_of("objects", AckReport.from_json)),
            declines=snapshot.read("declines", _list_of("objects", DeclineReport.from_json)),
        )


def _rate(value: Any, field: str) -> float:
    """Rows per second: a finite JSON number >= 0 (no string, bool, NaN)."""
    if type(value) not in (int, float) or not 0 <= value < math.inf:
        raise ProtocolError(f"{field} must be a number >= 0, got {shown(value)}")
    return float(value)


@dataclass(frozen=True, slots=True)
class QueryProgress:
    """The query's latest micro-batch (``query.progress``), from Spark's
    ``StreamingQuery.lastProgress``, and the input this driver's query has read so far."""

    batch_id: int  # "batchId": the batch lastProgress describes
    num_input_rows: int  # "numInputRows": the rows that batch read
    # "inputRowsPerSecond": the rate input arrived at for that batch; None when Spark has none
    input_rows_per_second: float | None
    # "totalInputRows": the rows of every batch this driver's query ran (its recentProgress,
    # each progress counted once)
    total_input_rows: int

    def to_json(self) -> dict[str, Any]:
        return {
            "batchId": self.batch_id,
            "numInputRows": self.num_input_rows,
            "inputRowsPerSecond": self.input_rows_per_second,
            "totalInputRows": self.total_input_rows,
        }

    @classmethod
    def from_json(cls, value: Any, field: str = "progress") -> Self:
        progress = Fields.nested(value, field)
        return cls(
            batch_id=progress.read("batchId", read_integer),
            num_input_rows=progress.read("numInputRows", read_integer),
            input_rows_per_second=progress.read("inputRowsPerSecond", read_optional(_rate)),
            total_input_rows=progress.read("totalInputRows", read_integer),
        )


@dataclass(frozen=True, slots=True)
class QueryStatus:
    """The streaming query (``query``)."""

    state: QueryState
    message: str = ""  # the query's exception when failed
    # "lastCommittedBatch": the highest B with commits/B in the live location; informational,
    # it changes no status version.
    last_committed_batch: int | None = None
    # "progress": None before the query's first progress (and from agents without it);
    # informational, as lastCommittedBatch.
    progress: QueryProgress | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": str(self.state),
            "message": self.message,
            "lastCommittedBatch": self.last_committed_batch,
            "progress": None if self.progress is None else self.progress.to_json(),
        }

    @classmethod
    def from_json(cls, value: Any, field: str = "query") -> Self:
        query = Fields.nested(value, field)
        return cls(
            state=query.read("state", read_one_of(QueryState)),
            message=query.read("message", read_string),
            last_committed_batch=query.read("lastCommittedBatch", _optional_integer),
            progress=query.read("progress", read_optional(QueryProgress.from_json), default=None),
        )


@dataclass(frozen=True, slots=True)
class SkippedImage:
    """A newer candidate a restore passed over, and why."""

    candidate: RestoreCandidate  # "source"
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"source": self.candidate.encode(), "reason": self.reason}

    @classmethod
    def from_json(cls, value: Any, field: str = "skipped") -> Self:
        skipped = Fields.nested(value, field)
        return cls(
            candidate=skipped.read("source", _candidate), reason=skipped.read("reason", read_string)
        )


@dataclass(frozen=True, slots=True)
class RestoredFrom:
    """What this attempt was restored from (``restoredFrom``): what `restore` returns."""

    candidate: RestoreCandidate  # "source"
    batch_id: int  # "batchId": the restored image's batch
    skipped: tuple[SkippedImage, ...] = ()  # newer candidates passed over, newest first

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.candidate.encode(),
            "batchId": self.batch_id,
            "skipped": [skipped.to_json() for skipped in self.skipped],
        }

    @classmethod
    def from_json(cls, value: Any, field: str = "restoredFrom") -> Self:
        restored = Fields.nested(value, field)
        return cls(
            candidate=restored.read("source", _candidate),
            batch_id=restored.read("batchId", read_integer),
            skipped=restored.read("skipped", _list_of("objects", SkippedImage.from_json)),
        )


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """``GET /v1/status``: the agent's status document (docs/agent-protocol.md, "The
    status document"). ``apiVersion`` is always `API_VERSION` and is not a field."""

    # Rises whenever anything but query.last_committed_batch changes; compare only for
    # equality, within one driver. None from an agent before long polls (no "version").
    version: int | None
    attempt: int  # the driver's job attempt
    query: QueryStatus
    tasks: tuple[str, ...]  # the snapshot tasks an image needs, sorted; empty before a commit
    all_tasks_running: bool  # "allTasksRunning"
    # "awaitingFinalCheckpoint": a finished query's last batch is in no notified image yet.
    awaiting_final_checkpoint: bool
    restored_from: RestoredFrom | None  # "restoredFrom"; None for a fresh start
    checkpoints: tuple[SnapshotStatus, ...]  # the snapshots in flight
    # "highestStoredId": the highest snapshot id in the job's storage when the driver
    # started, of whichever registry (the coordinator's ids continue above it); None if
    # there was none, or from an agent before this field.
    highest_stored_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"apiVersion": API_VERSION}
        if self.version is not None:
            document["version"] = self.version
        return document | {
            "attempt": self.attempt,
            "query": self.query.to_json(),
            "tasks": list(self.tasks),
            "allTasksRunning": self.all_tasks_running,
            "awaitingFinalCheckpoint": self.awaiting_final_checkpoint,
            "restoredFrom": None if self.restored_from is None else self.restored_from.to_json(),
            "checkpoints": [snapshot.to_json() for snapshot in self.checkpoints],
            "highestStoredId": self.highest_stored_id,
        }

    @classmethod
    def from_json(cls, value: Any) -> Self:
        status = Fields(value, "the status")
        api_version = status.read("apiVersion", read_string)
        if api_version != API_VERSION:
            raise ProtocolError(f"apiVersion must be {API_VERSION!r}, got {shown(api_version)}")
        return cls(
            version=status.read("version", _optional_integer, default=None),
            attempt=status.read("attempt", read_integer),
            query=status.read("query", QueryStatus.from_json),
            tasks=status.read("tasks", _task_names),
            all_tasks_running=status.read("allTasksRunning", read_boolean),
            awaiting_final_checkpoint=status.read("awaitingFinalCheckpoint", read_boolean),
            restored_from=status.read("restoredFrom", read_optional(RestoredFrom.from_json)),
            checkpoints=status.read("checkpoints", _list_of("objects", SnapshotStatus.from_json)),
            highest_stored_id=status.read("highestStoredId", _optional_integer, default=None),
        )

    def versioned_part(self) -> Self:
        """What the version covers: the document without its version and the query's
        informational fields (lastCommittedBatch, progress), which change with every batch
        and so wake no long poll."""
        query = replace(self.query, last_committed_batch=None, progress=None)
        return replace(self, version=None, query=query)

    def only_acknowledged_since(self, earlier: Self) -> bool:
        """Whether this status is a newer version than ``earlier`` whose only difference
        is more task acknowledgements (what a long poll may gather for a moment)."""
        return self.version != earlier.version and _without_acks(self) == _without_acks(earlier)


def _without_acks(status: AgentStatus) -> AgentStatus:
    snapshots = tuple(replace(snapshot, acks=()) for snapshot in status.checkpoints)
    return replace(status.versioned_part(), checkpoints=snapshots)
