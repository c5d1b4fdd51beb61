"""The job's status as ``kubectl get/describe scj`` shows it (and the local status file).

``status.coordinator`` is the durable part (the checkpoint id counter and the registry,
what an operator restart resumes from); the other fields are views of it and of the
runtime, shaped by the CRD's status schema. Conditions follow the Kubernetes API
conventions: a condition's ``lastTransitionTime`` changes only when its status does.

The shape is defined here once: ``PersistedStatus`` is the part a restart reads back (the
supervisor's ``JobRecord`` writes and reads it), ``render_status`` adds the views, and
``StatusFile`` is the local runtime's file around it, which the storage commands read for
the registry.
"""

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from spark_checkpoint.protocol import ProtocolError, RestoreCandidate, RestoredFrom
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CheckpointOutcome,
    CompletedCheckpoint,
    InvalidPersistedState,
    JobPhase,
    OutcomeStatus,
    PersistedState,
)
from spark_checkpoint_operator.coordinator.state import MAX_COUNT, format_time, parse_time
from spark_checkpoint_operator.local_files import UnreadableFile, read_small_text
from spark_checkpoint_operator.local_state import open_state_file
from spark_checkpoint_operator.manifest import crd

HISTORY_SHOWN = 10
# Far above any status a run writes (its registry and history are bounded).
MAX_STATUS_FILE_BYTES = 64 << 20

READY = "Ready"
CHECKPOINTS_HEALTHY = "CheckpointsHealthy"
SPEC_VALID = "SpecValid"


class StatusFileError(ValueError):
    """A status file cannot be read; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class DiscardDue:
    """A discard retention decided that nothing has done yet: written with the state write
    that lets its image go, and kept while the running driver's agent does not take it or
    the janitor fails. The agent is asked again after each completion, the janitor once no
    driver runs. Kept in the status, so an operator restart in between does not leave the
    image in storage (an unregistered savepoint is the user's to garbage collection).
    ``reason``: why it waits, said once the janitor did it (None: no news, the driver was
    leaving, or not refused yet)."""

    kind: CheckpointKind
    checkpoint_id: int
    reason: str | None = None

    @property
    def key(self) -> tuple[CheckpointKind, int]:
        """The image: a discard due is kept once per image."""
        return self.kind, self.checkpoint_id

    def describe(self) -> str:
        return f"{self.kind.value} {self.checkpoint_id}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "id": self.checkpoint_id,
            **({} if self.reason is None else {"reason": self.reason}),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "DiscardDue":
        """Raises InvalidStatus naming the field (`where` is the entry's place)."""
        if not isinstance(data, Mapping):
            raise InvalidStatus(f"{where}: expected an object, got {data!r}")
        kind = _field(data, "kind", str, None, f"{where}.")
        if kind not in set(CheckpointKind):
            allowed = ", ".join(CheckpointKind)
            raise InvalidStatus(f"{where}.kind: expected one of {allowed}, got {kind!r}")
        checkpoint_id = _count(data, "id", f"{where}.", default=None)
        if checkpoint_id is None:
            raise InvalidStatus(f"{where}.id: expected an integer, got None")
        return cls(
            CheckpointKind(kind), checkpoint_id, _field(data, "reason", str, None, f"{where}.")
        )


@dataclass(frozen=True, slots=True)
class UnrestorableImage:
    """An image a restore will not use again (``status.unrestorable``): a restored query
    failed on it before committing a batch, or the restorable check after it completed
    found it unusable, or a restore of an older image went on without it, whose sinks
    discarded the output staged after that image: restored, it would resume after output
    that is gone, whatever spec runs (``permanent``; so is an image a driver failed on
    before it said which one it restored: it may have skipped it). ``source`` is its
    restore candidate's spelling (``checkpoint:3``)."""

    source: str
    reason: str
    attempt: int  # the job attempt whose restore (or check) found it
    permanent: bool = False

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "source": self.source,
            "reason": self.reason,
            "attempt": self.attempt,
        }
        if self.permanent:  # written only when so: statuses of earlier operators read alike
            document["permanent"] = True
        return document

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "UnrestorableImage":
        """Raises InvalidStatus naming the field (`where` is the entry's place)."""
        if not isinstance(data, Mapping):
            raise InvalidStatus(f"{where}: expected an object, got {data!r}")
        values = {
            "source": _field(data, "source", str, None, f"{where}."),
            "reason": _field(data, "reason", str, "", f"{where}."),
            "attempt": _count(data, "attempt", f"{where}.", default=None),
            "permanent": _field(data, "permanent", bool, False, f"{where}."),
        }
        for key in ("source", "attempt"):
            if values[key] is None:
                raise InvalidStatus(f"{where}.{key}: missing")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class RestoreChoice:
    """The image restored instead of the newest (``status.restoreChoice``: `run --from`, a
    redeploy), and only it, until an image completes after it (`completed` counts them
    when it was chosen); ``passed_over``: the newer images its restore leaves behind."""

    image: str
    completed: int
    passed_over: tuple[str, ...] = ()

    def in_force(self, completed_count: int) -> bool:
        """Whether no image completed since it was chosen (the registry's count now)."""
        return self.completed == completed_count

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "completedCount": self.completed,
            "passedOver": list(self.passed_over),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "RestoreChoice":
        """Raises InvalidStatus naming the field (`where` is its place)."""
        if not isinstance(data, Mapping):
            raise InvalidStatus(f"{where}: expected an object, got {data!r}")
        image = _field(data, "image", str, None, f"{where}.")
        if image is None:
            raise InvalidStatus(f"{where}.image: missing")
        passed_over = _field(data, "passedOver", list, [], f"{where}.")
        if not all(isinstance(entry, str) for entry in passed_over):
            raise InvalidStatus(f"{where}.passedOver: expected a list of strings")
        return cls(image, _count(data, "completedCount", f"{where}."), tuple(passed_over))


@dataclass(frozen=True, slots=True)
class PersistedStatus:
    """The part of a job's status that a restart resumes from: the coordinator's registry
    and the runtime's counters. ``render_status`` adds the views."""

    phase: JobPhase = JobPhase.PENDING
    job_attempt: int = 0
    restores: int = 0
    failed_restores: int = 0
    restored_from: RestoredFrom | None = None
    unrestorable: Sequence[UnrestorableImage] = ()
    # The last job attempt whose query committed a batch after the image it restored (0:
    # none yet); None in a status an earlier operator wrote, which did not keep it.
    last_committing_attempt: int | None = None
    restore_choice: RestoreChoice | None = None
    message: str = ""
    last_committed_batch: int | None = None
    consecutive_failures: int = 0
    # Driver restarts in a row (against restartPolicy.maxRetries), and when the one in its
    # backoff is due (epoch seconds; None while none waits): an operator restart goes on
    # with both.
    restarts: int = 0
    restart_due: float | None = None
    # Periodic checkpoints skipped since the last one triggered, while Running and after
    # the query committed a batch ({"since", "reason", "message"}); None while none is.
    checkpoints_skipped: Mapping[str, Any] | None = None
    # When the next periodic savepoint is due (epoch seconds); None without one.
    next_periodic_savepoint: float | None = None
    next_checkpoint_id: int = 1
    pending: Sequence[Mapping[str, Any]] = ()
    discards_due: Sequence[DiscardDue] = ()
    coordinator: PersistedState = field(default_factory=PersistedState)

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "jobAttempt": self.job_attempt,
            "restoredFrom": None if self.restored_from is None else self.restored_from.to_json(),
            "unrestorable": [image.to_dict() for image in self.unrestorable],
            "lastCommittingAttempt": self.last_committing_attempt,
            "restoreChoice": None if self.restore_choice is None else self.restore_choice.to_dict(),
            "message": self.message,
            "lastCommittedBatch": self.last_committed_batch,
            "consecutiveFailures": self.consecutive_failures,
            "restarts": self.restarts,
            "restartDue": None if self.restart_due is None else format_time(self.restart_due),
            "checkpointsSkipped": (
                None if self.checkpoints_skipped is None else dict(self.checkpoints_skipped)
            ),
            "nextPeriodicSavepoint": (
                None
                if self.next_periodic_savepoint is None
                else format_time(self.next_periodic_savepoint)
            ),
            "nextCheckpointId": self.next_checkpoint_id,
            "pending": [dict(snapshot) for snapshot in self.pending],
            "discardsDue": [discard.to_dict() for discard in self.discards_due],
            "counts": {"restored": self.restores, "failedRestores": self.failed_restores},
            "coordinator": self.coordinator.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PersistedStatus":
        """Read back a status written by ``to_dict`` or ``render_status`` (views are
        ignored; a field not written yet takes its default, as in a new job's status).
        Raises InvalidStatus naming the field."""
        counts = _field(data, "counts", Mapping, {})
        coordinator = _field(data, "coordinator", Mapping, None)
        try:
            state = (
                PersistedState() if coordinator is None else PersistedState.from_dict(coordinator)
            )
        except InvalidPersistedState as error:
            raise InvalidStatus(f"coordinator.{error}") from None
        phase = _field(data, "phase", str, JobPhase.PENDING.value)
        if phase not in set(JobPhase):
            allowed = ", ".join(JobPhase)
            raise InvalidStatus(f"phase: expected one of {allowed}, got {phase!r}")
        persisted = cls(
            phase=JobPhase(phase),
            job_attempt=_count(data, "jobAttempt"),
            restores=_count(counts, "restored", "counts."),
            failed_restores=_count(counts, "failedRestores", "counts."),
            restored_from=_restored_from(data),
            unrestorable=[
                UnrestorableImage.from_dict(entry, f"unrestorable[{index}]")
                for index, entry in enumerate(_field(data, "unrestorable", list, []))
            ],
            last_committing_attempt=_count(data, "lastCommittingAttempt", default=None),
            restore_choice=(
                None
                if data.get("restoreChoice") is None
                else RestoreChoice.from_dict(data["restoreChoice"], "restoreChoice")
            ),
            message=_field(data, "message", str, ""),
            last_committed_batch=_count(data, "lastCommittedBatch", default=None),
            consecutive_failures=_count(data, "consecutiveFailures"),
            restarts=_count(data, "restarts"),
            restart_due=_time(data, "restartDue"),
            checkpoints_skipped=_field(data, "checkpointsSkipped", Mapping, None),
            next_periodic_savepoint=_time(data, "nextPeriodicSavepoint"),
            next_checkpoint_id=_count(data, "nextCheckpointId", default=state.next_checkpoint_id),
            pending=_field(data, "pending", list, []),
            discards_due=[
                DiscardDue.from_dict(entry, f"discardsDue[{index}]")
                for index, entry in enumerate(_field(data, "discardsDue", list, []))
            ],
            coordinator=state,
        )
        # Every write holds the registry: without it, the job would be taken for a new one,
        # and its first garbage collection would delete every image of its storage.
        written = [key for key in cls().to_dict() if data.get(key) is not None]
        if coordinator is None and written:
            raise InvalidStatus(
                f"coordinator: missing beside {', '.join(written[:3])}: the job's registry "
                "of checkpoints and savepoints, which every status the operator writes holds"
            )
        return persisted


class InvalidStatus(ValueError):
    """A status that cannot be read back; the message names the field."""


def _field(
    data: Mapping[str, Any], key: str, expected: type, default: Any, prefix: str = ""
) -> Any:
    """``data[key]`` if it is of the ``expected`` type, ``default`` if absent or null."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        what = {int: "an integer", str: "a string", list: "a list", bool: "a boolean"}.get(
            expected, "an object"
        )
        raise InvalidStatus(f"{prefix}{key}: expected {what}, got {value!r}")
    return value


def _count(data: Mapping[str, Any], key: str, prefix: str = "", *, default: int | None = 0) -> Any:
    """``data[key]``: a count or id from 0 up to what JSON numbers hold exactly (a value
    written by hand beyond it made the operator's next write of it fail, one below 0 a
    driver pod name Kubernetes refuses)."""
    value = _field(data, key, int, default, prefix)
    if value is not None and not 0 <= value <= MAX_COUNT:
        raise InvalidStatus(f"{prefix}{key}: expected 0 to {MAX_COUNT}, got {value}")
    return value


def _time(data: Mapping[str, Any], key: str) -> float | None:
    """``data[key]``: a time as `format_time` writes it, or None."""
    text = _field(data, key, str, None)
    try:
        return None if text is None else parse_time(text)
    except ValueError:
        raise InvalidStatus(
            f"{key}: expected a time as 2026-12-05T10:31:05Z, got {text!r}"
        ) from None


def _restored_from(data: Mapping[str, Any]) -> RestoredFrom | None:
    """``restoredFrom``: the protocol's document, as the agent reported it."""
    value = data.get("restoredFrom")
    try:
        return None if value is None else RestoredFrom.from_json(value)
    except ProtocolError as error:
        raise InvalidStatus(f"restoredFrom: {error}") from None


class StatusRecord(Protocol):
    """What the status is rendered from (the supervisor's ``JobRecord``)."""

    def persisted_status(self) -> PersistedStatus: ...


@dataclass(frozen=True, slots=True)
class RegisteredSnapshots:
    """The snapshots the coordinator registered, and the images a restore no longer
    uses, as a status lists them."""

    checkpoints: frozenset[int]
    savepoints: frozenset[int]
    # Why a restore will not use an image (``status.unrestorable``), by its candidate's
    # spelling (``checkpoint:3``).
    unrestorable: Mapping[str, str] = field(default_factory=dict)
    # Where the registered images are, as recorded (their `_metadata`'s paths or URIs).
    paths: frozenset[str] = frozenset()
    # Who asked for each ("periodic", "upgrade", "nonce 3"), by its candidate's spelling.
    labels: Mapping[str, str] = field(default_factory=dict)
    # The job Finished: `run` runs it no more, not even `--from` one of its images.
    finished: bool = False

    def of(self, kind: CheckpointKind) -> frozenset[int]:
        return self.checkpoints if kind is CheckpointKind.CHECKPOINT else self.savepoints


@dataclass(frozen=True, slots=True)
class StatusFile:
    """The local runtime's status file: the job's status in the envelope of its resource,
    as ``kubectl get scj -o json`` would show it, and the pid of the driver it started."""

    path: Path
    name: str
    namespace: str
    status: object  # as the file holds it (a Mapping when valid): checked by _status
    driver_pid: int | None

    def write(self) -> None:
        """Replace the file at once: a reader never sees half of it."""
        document = {
            "apiVersion": crd.resource_api_version(crd.cached_crd()),
            "kind": crd.resource_kind(crd.cached_crd()),
            "metadata": {"name": self.name, "namespace": self.namespace},
            "status": self.status,
            "driver": {"pid": self.driver_pid},
        }
        temporary = self.path.with_suffix(".tmp")
        with open_state_file(temporary) as status_file:
            status_file.write(json.dumps(document, indent=2).encode())
        os.replace(temporary, self.path)

    @classmethod
    def read(cls, path: Path) -> "StatusFile | None":
        """The file at ``path``; None if there is none."""
        try:
            text = read_small_text(path, MAX_STATUS_FILE_BYTES)
        except FileNotFoundError:
            return None
        except UnreadableFile as error:
            raise StatusFileError(f"{path}: cannot read: {error}") from None
        except OSError as error:
            raise StatusFileError(f"{path}: cannot read: {error.strerror or error}") from None
        try:
            document = json.loads(text)
        except RecursionError:
            raise StatusFileError(f"{path}: not JSON: nested too deeply") from None
        except ValueError as error:  # also an integer of over 4300 digits
            raise StatusFileError(f"{path}: not JSON: {error}") from error
        if not isinstance(document, Mapping):
            raise StatusFileError(f"{path}: not an object")
        metadata = document.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        driver = document.get("driver")
        pid = driver.get("pid") if isinstance(driver, Mapping) else None
        return cls(
            path=path,
            name=str(metadata.get("name", "")),
            namespace=str(metadata.get("namespace", "")),
            status=document.get("status"),
            driver_pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        )

    def persisted_status(self) -> PersistedStatus:
        try:
            return PersistedStatus.from_dict(self._status())
        except InvalidStatus as error:
            raise StatusFileError(f"{self.path}: status.{error}") from None

    def registered_snapshots(self) -> RegisteredSnapshots:
        """Only the registry's ids and the unrestorable images: a status file of another
        version still says which snapshots are registered."""
        status = self._status()
        if "coordinator" not in status:
            raise StatusFileError(f"{self.path}: status.coordinator: missing")
        coordinator = status["coordinator"]
        unrestorable = status.get("unrestorable")
        return RegisteredSnapshots(
            checkpoints=frozenset(self._ids(coordinator, "checkpoints")),
            savepoints=frozenset(self._ids(coordinator, "savepoints")),
            unrestorable={
                entry["source"]: str(entry.get("reason", ""))
                for entry in (unrestorable if isinstance(unrestorable, list) else [])
                if isinstance(entry, Mapping) and isinstance(entry.get("source"), str)
            },
            paths=frozenset(
                item["path"]
                for key in ("checkpoints", "savepoints")
                for item in coordinator.get(key, [])
                if isinstance(item.get("path"), str)
            ),
            labels={
                f"{kind}:{item['id']}": item["label"]
                for key, kind in (("checkpoints", "checkpoint"), ("savepoints", "savepoint"))
                for item in coordinator.get(key, [])
                if isinstance(item.get("label"), str) and item["label"]
            },
            finished=status.get("phase") == JobPhase.FINISHED,
        )

    def _status(self) -> Mapping[str, Any]:
        if self.status is None:
            raise StatusFileError(f"{self.path}: status: missing")
        if not isinstance(self.status, Mapping):
            kind = type(self.status).__name__
            raise StatusFileError(f"{self.path}: status: expected an object, got a {kind}")
        return self.status

    def _ids(self, coordinator: Any, key: str) -> Iterator[int]:
        prefix = f"status.coordinator.{key}"
        if not isinstance(coordinator, Mapping):
            raise StatusFileError(f"{self.path}: status.coordinator: not an object")
        items = coordinator.get(key, [])
        if not isinstance(items, list):
            raise StatusFileError(f"{self.path}: {prefix}: not a list")
        for index, item in enumerate(items):
            value = item.get("id") if isinstance(item, Mapping) else None
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StatusFileError(
                    f"{self.path}: {prefix}[{index}].id: expected a non-negative integer, "
                    f"got {value!r}"
                )
            yield value


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: int
    expected: int

    def to_dict(self) -> dict[str, int]:
        return {"ready": self.ready, "expected": self.expected}


@dataclass(frozen=True, slots=True)
class Observed:
    """What the runtime saw beyond the record; all optional for the local runtime."""

    generation: int | None = None
    driver: Readiness | None = None
    executors: Readiness | None = None
    spec_problem: str | None = None
    # What this operator refuses in a spec it runs unchanged since it was accepted.
    spec_tolerated: str | None = None
    # A job whose spec asks for a change that waits (an upgrade's or a suspension's
    # savepoint, an upgrade's new driver): Ready says so, reason and message, until done.
    pending_change: tuple[str, str] | None = None
    # How a Suspended job is run again, on this runtime.
    resumes: str = "at its next run (on this machine: spark-checkpoint run)"
    # What a Suspended job resumes from when the spec chose it (a redeploy's image, not
    # restored yet); None: the record's restore choice, or its newest image.
    resumes_from: str | None = None


def render_status(
    record: StatusRecord,
    *,
    now: float,
    observed: Observed = Observed(),
    previous_conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    persisted = record.persisted_status()
    state = persisted.coordinator
    unrestorable = {image.source for image in persisted.unrestorable}
    status: dict[str, Any] = persisted.to_dict()
    status |= {
        "counts": {
            "completed": state.completed_count,
            "failed": state.failed_count,
            "inProgress": len(persisted.pending),
            **status["counts"],
        },
        "lastCheckpoint": last_image(state, CheckpointKind.CHECKPOINT),
        "lastSavepoint": last_image(state, CheckpointKind.SAVEPOINT),
        "history": [_outcome(o) for o in reversed(state.history[-HISTORY_SHOWN:])],
        "savepointHistory": [
            # One never restored again (status.unrestorable) is no redeploy's to choose.
            _completed(s) | ({"unrestorable": True} if source in unrestorable else {})
            for s in reversed(state.savepoints)
            for source in [RestoreCandidate.registered(s.kind, s.checkpoint_id).encode()]
        ],
    }
    if observed.generation is not None:
        status["observedGeneration"] = observed.generation
    if observed.driver is not None:
        status["driver"] = observed.driver.to_dict()
    if observed.executors is not None:
        status["executors"] = observed.executors.to_dict()
    status["conditions"] = _conditions(persisted, observed, previous_conditions, now)
    return status


def newest_completion(
    state: PersistedState, kind: CheckpointKind
) -> CompletedCheckpoint | CheckpointOutcome | None:
    """The newest registered image of ``kind``; a finished job's checkpoints are
    discarded, so the history's newest completion stands in for them (it has no path)."""
    registered = state.checkpoints if kind is CheckpointKind.CHECKPOINT else state.savepoints
    if registered:
        return registered[-1]
    for outcome in reversed(state.history):
        if outcome.kind is kind and outcome.status is OutcomeStatus.COMPLETED:
            return outcome
    return None


def last_image(state: PersistedState, kind: CheckpointKind) -> dict[str, Any] | None:
    """``status.lastCheckpoint``/``lastSavepoint``: the view of ``newest_completion``."""
    newest = newest_completion(state, kind)
    if not isinstance(newest, CheckpointOutcome):
        return None if newest is None else _completed(newest)
    return {
        "id": newest.checkpoint_id,
        "batch": newest.batch_id,
        "sizeBytes": newest.size_bytes,
        "triggerTime": format_time(newest.trigger_time),
        "completionTime": format_time(newest.end_time),
        "duration": _duration(newest.end_time - newest.trigger_time),
    }


# Every field `lastCheckpoint` and `lastSavepoint` may have: a merge patch of the status
# keeps a field the new value lacks (a former image's label, path or pin), so the
# operator's writes name each one (None: removed).
IMAGE_FIELDS = (
    "id",
    "batch",
    "path",
    "sizeBytes",
    "triggerTime",
    "completionTime",
    "duration",
    "label",
    "pinned",
)


def _completed(checkpoint: CompletedCheckpoint) -> dict[str, Any]:
    return {
        "id": checkpoint.checkpoint_id,
        "batch": checkpoint.batch_id,
        "path": checkpoint.path,
        "sizeBytes": checkpoint.size_bytes,
        "triggerTime": format_time(checkpoint.trigger_time),
        "completionTime": format_time(checkpoint.completion_time),
        "duration": _duration(checkpoint.duration),
        **({"label": checkpoint.label} if checkpoint.label else {}),
        **({"pinned": True} if checkpoint.pinned else {}),
    }


def _outcome(outcome: CheckpointOutcome) -> dict[str, Any]:
    line: dict[str, Any] = {
        "id": outcome.checkpoint_id,
        "kind": outcome.kind.value,
        "status": outcome.status.value,
        "triggerTime": format_time(outcome.trigger_time),
        "duration": _duration(outcome.end_time - outcome.trigger_time),
    }
    if outcome.batch_id is not None:
        line["batch"] = outcome.batch_id
    if outcome.size_bytes is not None:
        line["sizeBytes"] = outcome.size_bytes
    if outcome.reason is not None:
        line["reason"] = outcome.reason.value
        line["message"] = outcome.message
    if outcome.label:
        line["label"] = outcome.label
    return line


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.1f}s"


def _conditions(
    record: PersistedStatus,
    observed: Observed,
    previous: Sequence[Mapping[str, Any]],
    now: float,
) -> list[dict[str, Any]]:
    running = record.phase is JobPhase.RUNNING
    choice = record.restore_choice
    resumes_from = observed.resumes_from or (
        f"{choice.image}, the image chosen to restore" if choice else "its newest image"
    )
    ready_message = record.message or (
        # Not "after a savepoint": a driver starting, restarting, or stopped without a final
        # savepoint is suspended without one.
        f"suspended; it resumes from {resumes_from} {observed.resumes}"
        if record.phase is JobPhase.SUSPENDED
        else _PHASE_MESSAGES[record.phase]
    )
    if observed.spec_problem is not None:
        ready = ("False", "InvalidSpec", observed.spec_problem)
    elif observed.pending_change is not None:
        ready = ("False", *observed.pending_change)
    else:
        ready = ("True" if running else "False", record.phase.value, ready_message)
    failures = record.consecutive_failures
    last_failure = next(
        (o for o in reversed(record.coordinator.history) if o.status is OutcomeStatus.FAILED),
        None,
    )
    skipped = record.checkpoints_skipped
    counted = record.coordinator
    failed_so_far = (
        f" ({counted.failed_count} failed: status.history says why)" if counted.failed_count else ""
    )
    healthy = (
        # Nothing to judge yet: a job that never started said "no checkpoint failed since
        # the last completed one" (a GitOps user's), and so did one whose failures did not
        # count now (a savepoint withdrawn, checkpoints aborted as a driver went, a streak
        # a restart ended).
        ("Unknown", "NoCheckpointYet", f"no checkpoint has completed yet{failed_so_far}")
        if failures == 0 and skipped is None and counted.completed_count == 0
        else ("True", "CheckpointsCompleting", "no checkpoint failed since the last completed one")
        if failures == 0 and skipped is None
        else (
            "False",
            "CheckpointsSkipped",
            f"periodic checkpoints skipped since {skipped.get('since')}: {skipped.get('message')}",
        )
        if failures == 0 and skipped is not None
        else (
            "False",
            "CheckpointsFailing",
            f"{failures} consecutive checkpoint failures; last: "
            + (
                f"{last_failure.reason.value if last_failure.reason else ''} "
                f"{last_failure.message}".strip()
                if last_failure
                else "unknown"
            ),
        )
    )
    if observed.spec_problem is not None:
        valid = ("False", "InvalidSpec", observed.spec_problem)
    elif observed.spec_tolerated is not None:
        valid = ("True", "AcceptedUnchanged", observed.spec_tolerated)
    else:
        valid = ("True", "Valid", "the spec can be run")
    earlier = {c.get("type"): c for c in previous}
    conditions = []
    for kind, (state, reason, message) in (
        (READY, ready),
        (CHECKPOINTS_HEALTHY, healthy),
        (SPEC_VALID, valid),
    ):
        before = earlier.get(kind)
        since = format_time(now)
        if before is not None and before.get("status") == state:
            since = before.get("lastTransitionTime", since)
        condition: dict[str, Any] = {
            "type": kind,
            "status": state,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }
        if observed.generation is not None:
            condition["observedGeneration"] = observed.generation
        conditions.append(condition)
    return conditions


_PHASE_MESSAGES = {
    JobPhase.PENDING: "waiting to start",
    JobPhase.DEPLOYING: "the driver is starting",
    JobPhase.RUNNING: "the query is running",
    JobPhase.RESTARTING: "the driver failed and is being restarted",
    JobPhase.SUSPENDING: "taking a savepoint to suspend",
    JobPhase.FINISHED: "the bounded input is done and its final checkpoint completed",
    JobPhase.FAILED: "the job failed",
    JobPhase.CANCELLED: "the job was cancelled",
}
