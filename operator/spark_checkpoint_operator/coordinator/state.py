"""The coordinator state that survives restarts: the checkpoint id counter and the
registry of completed checkpoints and savepoints.

Serialized as a JSON-compatible mapping with camelCase keys and RFC 3339 times, which is
what the Kubernetes status (or the local status file) stores.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from spark_checkpoint_operator.coordinator.completed import (
    CheckpointOutcome,
    CompletedCheckpoint,
    OutcomeStatus,
)
from spark_checkpoint_operator.coordinator.config import TerminalOutcome
from spark_checkpoint_operator.coordinator.reasons import FailureReason
from spark_checkpoint_operator.coordinator.requests import CheckpointKind

_E = TypeVar("_E", bound=StrEnum)

# The largest count or id a status holds: exact in any JSON reader (a value written by hand
# beyond it made the next write of it fail, or an agent refuse every trigger's id).
MAX_COUNT = 2**53 - 1


class InvalidPersistedState(ValueError):
    """The stored coordinator state cannot be read; the message names the field."""


@dataclass(frozen=True, slots=True)
class PersistedState:
    next_checkpoint_id: int = 1
    checkpoints: tuple[CompletedCheckpoint, ...] = ()
    savepoints: tuple[CompletedCheckpoint, ...] = ()
    history: tuple[CheckpointOutcome, ...] = ()
    completed_count: int = 0
    failed_count: int = 0
    terminated: TerminalOutcome | None = field(default=None)
    # When the last periodic savepoint was triggered (wall clock; the first Running if none
    # was yet): the next is due an interval after, across restarts.
    last_periodic_savepoint: float | None = None

    def why_not_disposable(
        self,
        savepoint_id: int,
        unrestorable: Callable[[CheckpointKind, int], bool] = lambda kind, image_id: False,
    ) -> str | None:
        """Why savepoint ``savepoint_id`` cannot be disposed of; None if it can. Not one the
        registry does not list; nor, of the images a restore takes (not ``unrestorable``),
        the only one, or one of a later batch than every other: output sinks committed up
        to its batch (a stop-with-savepoint's) would be ahead of every image left. A
        Finished job is not run again: no restore takes any of its images."""
        savepoint = next((s for s in self.savepoints if s.checkpoint_id == savepoint_id), None)
        if savepoint is None:
            return f"savepoint {savepoint_id} is not in the job's registry"
        if self.terminated is TerminalOutcome.FINISHED or unrestorable(
            CheckpointKind.SAVEPOINT, savepoint_id
        ):
            return None  # no restore takes it
        others = [
            image.batch_id
            for image in (*self.checkpoints, *self.savepoints)
            if image is not savepoint and not unrestorable(image.kind, image.checkpoint_id)
        ]
        if not others:
            return (
                f"savepoint {savepoint_id} is the only image the job can restore from: run the "
                "job until a checkpoint completes"
            )
        if savepoint.batch_id > max(others):
            return (
                f"savepoint {savepoint_id} is the job's newest image (batch "
                f"{savepoint.batch_id}): the output may be committed up to its batch, and "
                "every other image is older; run the job until a newer checkpoint completes"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "nextCheckpointId": self.next_checkpoint_id,
            "checkpoints": [_completed_to_dict(c) for c in self.checkpoints],
            "savepoints": [_completed_to_dict(s) for s in self.savepoints],
            "history": [_outcome_to_dict(o) for o in self.history],
            "completedCount": self.completed_count,
            "failedCount": self.failed_count,
            "terminated": self.terminated.value if self.terminated else None,
            "lastPeriodicSavepoint": (
                None
                if self.last_periodic_savepoint is None
                else format_time(self.last_periodic_savepoint)
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PersistedState":
        reader = _Reader(data, "")
        terminated = reader.optional_text("terminated")
        next_id = reader.integer("nextCheckpointId", minimum=1)
        checkpoints = tuple(_completed_from(r) for r in reader.items("checkpoints"))
        savepoints = tuple(_completed_from(r) for r in reader.items("savepoints"))
        # Ids are never used twice: a counter at or below a registered id would be.
        newest = max((c.checkpoint_id for c in (*checkpoints, *savepoints)), default=0)
        if next_id <= newest:
            raise InvalidPersistedState(
                f"nextCheckpointId: {next_id} is not above the newest registered id, {newest}"
            )
        return cls(
            next_checkpoint_id=next_id,
            checkpoints=checkpoints,
            savepoints=savepoints,
            history=tuple(_outcome_from(r) for r in reader.items("history")),
            completed_count=reader.integer("completedCount", minimum=0),
            failed_count=reader.integer("failedCount", minimum=0),
            terminated=reader.choice("terminated", TerminalOutcome) if terminated else None,
            # Absent in what an operator before periodic savepoints wrote.
            last_periodic_savepoint=reader.optional_timestamp("lastPeriodicSavepoint"),
        )


def format_time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()  # reads the "Z" suffix since 3.11


def _completed_to_dict(checkpoint: CompletedCheckpoint) -> dict[str, Any]:
    return {
        "id": checkpoint.checkpoint_id,
        "kind": checkpoint.kind.value,
        "batchId": checkpoint.batch_id,
        "path": checkpoint.path,
        "sizeBytes": checkpoint.size_bytes,
        "triggerTime": format_time(checkpoint.trigger_time),
        "completionTime": format_time(checkpoint.completion_time),
        "label": checkpoint.label,
        **({"pinned": True} if checkpoint.pinned else {}),
    }


def _outcome_to_dict(outcome: CheckpointOutcome) -> dict[str, Any]:
    # What an outcome lacks is left out, not null: `kubectl describe` shows a null as <nil>.
    known = {
        "batchId": outcome.batch_id,
        "sizeBytes": outcome.size_bytes,
        "reason": outcome.reason.value if outcome.reason else None,
    }
    return {
        "id": outcome.checkpoint_id,
        "kind": outcome.kind.value,
        "status": outcome.status.value,
        "triggerTime": format_time(outcome.trigger_time),
        "endTime": format_time(outcome.end_time),
        **{key: value for key, value in known.items() if value is not None},
        "message": outcome.message,
        **({"label": outcome.label} if outcome.label else {}),
    }


def _completed_from(reader: "_Reader") -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=reader.integer("id", minimum=1),
        kind=reader.choice("kind", CheckpointKind),
        batch_id=reader.integer("batchId", minimum=0),
        path=reader.text("path"),
        size_bytes=reader.integer("sizeBytes", minimum=0),
        trigger_time=reader.timestamp("triggerTime"),
        completion_time=reader.timestamp("completionTime"),
        label=reader.optional_text("label") or "",
        pinned=reader.optional_flag("pinned"),
    )


def _outcome_from(reader: "_Reader") -> CheckpointOutcome:
    batch_id = reader.optional_integer("batchId")
    size_bytes = reader.optional_integer("sizeBytes")
    reason = reader.optional_text("reason")
    return CheckpointOutcome(
        checkpoint_id=reader.integer("id", minimum=1),
        kind=reader.choice("kind", CheckpointKind),
        status=reader.choice("status", OutcomeStatus),
        trigger_time=reader.timestamp("triggerTime"),
        end_time=reader.timestamp("endTime"),
        batch_id=batch_id,
        size_bytes=size_bytes,
        reason=reader.choice("reason", FailureReason) if reason else None,
        message=reader.optional_text("message") or "",
        label=reader.optional_text("label") or "",  # absent before labels were kept
    )


class _Reader:
    """Typed access to a mapping that reports the full path of any bad field."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        if not isinstance(data, Mapping):
            raise InvalidPersistedState(f"{path or 'state'}: expected an object")
        self._data = data
        self._path = path

    def _field(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def _get(self, key: str, expected: type | tuple[type, ...], what: str) -> Any:
        if key not in self._data:
            raise InvalidPersistedState(f"{self._field(key)}: missing")
        value = self._data[key]
        if not isinstance(value, expected) or isinstance(value, bool):
            raise InvalidPersistedState(f"{self._field(key)}: expected {what}, got {value!r}")
        return value

    def integer(self, key: str, *, minimum: int) -> int:
        value: int = self._get(key, int, "an integer")
        if not minimum <= value <= MAX_COUNT:
            raise InvalidPersistedState(
                f"{self._field(key)}: expected {minimum} to {MAX_COUNT}, got {value}"
            )
        return value

    def optional_integer(self, key: str) -> int | None:
        return None if self._data.get(key) is None else self.integer(key, minimum=0)

    def text(self, key: str) -> str:
        value: str = self._get(key, str, "a string")
        return value

    def optional_text(self, key: str) -> str | None:
        return None if self._data.get(key) is None else self.text(key)

    def optional_flag(self, key: str) -> bool:
        """False if absent (written by an operator before the field)."""
        value = self._data.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise InvalidPersistedState(f"{self._field(key)}: expected a boolean, got {value!r}")
        return value

    def timestamp(self, key: str) -> float:
        text = self.text(key)
        try:
            # Written back as UTC: a time whose UTC is outside years 1-9999 cannot be.
            timestamp = parse_time(text)
            format_time(timestamp)
            return timestamp
        except (ValueError, OverflowError):
            raise InvalidPersistedState(
                f"{self._field(key)}: expected an RFC 3339 time, got {text!r}"
            ) from None

    def optional_timestamp(self, key: str) -> float | None:
        return None if self._data.get(key) is None else self.timestamp(key)

    def choice(self, key: str, enum: type[_E]) -> _E:
        text = self.text(key)
        try:
            return enum(text)
        except ValueError:
            allowed = ", ".join(member.value for member in enum)
            raise InvalidPersistedState(
                f"{self._field(key)}: expected one of {allowed}, got {text!r}"
            ) from None

    def items(self, key: str) -> list["_Reader"]:
        values = self._get(key, list, "a list")
        return [_Reader(value, f"{self._field(key)}[{i}]") for i, value in enumerate(values)]
