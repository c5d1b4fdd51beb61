"""SparkCheckpointSnapshot objects: a savepoint or checkpoint of a job asked for by creating
an object (the Flink Kubernetes Operator's FlinkStateSnapshot), in place of a trigger nonce.

The controller of the job a snapshot names decides the snapshot's next status here, from
the snapshot as stored and what it observes of the job (`JobView`): observe, decide
(`decide`), record (its status patch). A snapshot is taken once: its savepoint or
checkpoint carries the label `label` (its name and uid), by which its completion is found
in the job's registry after an operator restart; one still in flight then was aborted with
the coordinator that asked for it, and is asked for again.

With the job's spec.savepoints.snapshotObjects, the operator makes a snapshot object for each
savepoint in the job's savepoint history that no snapshot object keeps (`plan_mirrors`): such
a mirror (named for the job that controls it, its owner) is never taken, pinned or held; it
follows the registry.
"""

import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CompletedCheckpoint,
    FailureReason,
    JobPhase,
)
from spark_checkpoint_operator.coordinator.state import format_time, parse_time
from spark_checkpoint_operator.kubernetes import objects

# A failed snapshot is taken again after this long, doubling with each failure up to the
# longest (Flink's doubles from 10 s without a bound).
FIRST_RETRY_SECONDS = 10.0
LONGEST_RETRY_SECONDS = 300.0
LABEL_PREFIX = "snapshot "
# Held on a savepoint snapshot whose deletion disposes of its savepoint (disposeOnDelete),
# until the job's controller did, as Flink's finalizer: the object's spec at its deletion
# decides, and no deletion goes unseen (a watch gap, an operator restart).
FINALIZER = "sparkcheckpoint.io/savepoint-disposal"
# The job phases in which a snapshot waiting for its trigger can no longer be taken, nor
# a savepoint disposed of (no driver runs again).
ENDED = (JobPhase.FINISHED, JobPhase.FAILED, JobPhase.CANCELLED)
KIND = "SparkCheckpointSnapshot"
# The `objects.LABEL_COMPONENT` of a mirror (to list them by; what makes one a mirror is its
# owner); the label of the savepoint it mirrors.
MIRROR_COMPONENT = "savepoint-history"
ANNOTATION_SAVEPOINT_LABEL = "sparkcheckpoint.io/savepoint-label"
_MIRROR_NAME = re.compile(r"(.+)-savepoint-(?:0|[1-9][0-9]*)")  # `mirror_name`'s: the job's first


class SnapshotState(StrEnum):
    TRIGGER_PENDING = "TRIGGER_PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"


FINAL_STATES = (SnapshotState.COMPLETED, SnapshotState.FAILED, SnapshotState.ABANDONED)


@dataclass(frozen=True)
class Snapshot:
    """A SparkCheckpointSnapshot as stored (its spec checked by the API server)."""

    namespace: str
    name: str
    uid: str
    job: str
    kind: CheckpointKind
    backoff_limit: int  # -1: no limit
    status: Mapping[str, Any]
    # spec.savepoint.path with alreadyExists: a savepoint of the job's to keep, not to take
    # (read, as the rest of the spec, until a trigger).
    existing_path: str | None = None
    dispose_on_delete: bool = True  # read at any time, as Flink reads it at the deletion
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    resource_version: str | None = None
    owner: str | None = None  # the uid of the job that controls it, if one does
    owner_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    spec: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "Snapshot":
        """The job and kind are the spec's until the snapshot is first triggered, then the
        status's: an edit after the trigger changes nothing (as in Flink), one before it
        (a job's name mistyped) counts."""
        metadata, spec = body["metadata"], body.get("spec") or {}
        status = dict(body.get("status") or {})
        controller: Mapping[str, Any] = next(
            (
                reference
                for reference in metadata.get("ownerReferences") or ()
                if reference.get("controller") is True and reference.get("kind") == objects.KIND
            ),
            {},
        )
        backoff_limit = spec.get("backoffLimit", -1)
        savepoint: Mapping[str, Any] = spec.get("savepoint") or {}
        existing = savepoint.get("path") if savepoint.get("alreadyExists") is True else None
        job = str((spec.get("jobReference") or {}).get("name", ""))
        kind = CheckpointKind.SAVEPOINT if "savepoint" in spec else CheckpointKind.CHECKPOINT
        if "triggerTimestamp" in status:
            existing = None
            job = str(status.get("job") or job)
            kind = (
                CheckpointKind(status["kind"])
                if status.get("kind") in ("savepoint", "checkpoint")
                else kind
            )
        return cls(
            namespace=metadata["namespace"],
            name=metadata["name"],
            uid=metadata["uid"],
            job=job,
            kind=kind,
            backoff_limit=backoff_limit if isinstance(backoff_limit, int) else -1,
            status=status,
            existing_path=str(existing) if existing is not None else None,
            dispose_on_delete=savepoint.get("disposeOnDelete") is not False,
            deleting=bool(metadata.get("deletionTimestamp")),
            finalizers=tuple(metadata.get("finalizers") or ()),
            resource_version=metadata.get("resourceVersion"),
            owner=controller.get("uid"),
            owner_name=controller.get("name"),
            labels=dict(metadata.get("labels") or {}),
            annotations=dict(metadata.get("annotations") or {}),
            spec=dict(spec),
        )

    @property
    def label(self) -> str:
        """The label of its savepoint or checkpoint: the uid tells a snapshot from an
        earlier one of the same name."""
        return f"{LABEL_PREFIX}{self.name} ({self.uid[:8]})"

    @property
    def concerns(self) -> set[str]:
        """The jobs whose controller looks at it when it changes: the one it names; the
        one that owns it; the one whose mirror's name it has (a name it may free)."""
        concerned = {self.job}
        if self.owner_name is not None:
            concerned.add(self.owner_name)
        if (named := _MIRROR_NAME.fullmatch(self.name)) is not None:
            concerned.add(named[1])
        return concerned

    @property
    def mirror(self) -> bool:
        """Made by the operator for a savepoint of the job's: controlled by the job, under
        a mirror's name. Not by its labels: one taken off (or put on another object)
        would pin (or release) a savepoint."""
        named = _MIRROR_NAME.fullmatch(self.name)
        return named is not None and named[1] == self.owner_name

    @property
    def held(self) -> bool:
        return FINALIZER in self.finalizers

    @property
    def state(self) -> SnapshotState | None:
        state = self.status.get("state")
        return SnapshotState(state) if state in tuple(SnapshotState) else None

    @property
    def open(self) -> bool:
        """Not completed, failed for good or abandoned yet."""
        return self.state not in FINAL_STATES


@dataclass
class JobView:
    """What a snapshot's decision reads of its job: the phase, and by label the snapshots
    completed (the registry's, and those completed under this controller, which retention
    may have let go since), in flight (their id; None while queued) and failed since the
    snapshot's status was written last (why); for a snapshot of an existing savepoint, the
    registry's savepoint its path names, or why it names none (None: no driver runs to
    pin it)."""

    phase: JobPhase
    completed: Mapping[str, CompletedCheckpoint] = field(default_factory=dict)
    in_flight: Mapping[str, int | None] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)
    existing: CompletedCheckpoint | str | None = None


@dataclass(frozen=True)
class Decision:
    status: dict[str, Any]
    trigger: bool = False  # ask the job's supervisor for the snapshot now
    pin: CompletedCheckpoint | None = None  # pin this registered savepoint
    wake_at: float | None = None  # look again then (epoch seconds): a retry falls due


class Answer(StrEnum):
    FAILED = "failed"  # counted against backoffLimit
    NOT_TAKEN = "not taken"  # taken again once the job runs


# The notices (by reason) that answer a request: it failed or was declined, or is not
# needed; and why one may end without a failure of its own: the job stopped running
# (suspended, upgraded, its driver failed), or it was withdrawn.
_FAILURES = ("CheckpointFailed", "RequestDeclined")
_NOT_NEEDED = "CheckpointNotNeeded"
_NOT_ITS_OWN = (
    FailureReason.COORDINATOR_SUSPEND,
    FailureReason.COORDINATOR_SHUTDOWN,
    FailureReason.WITHDRAWN,
)


def answer(reason: str, cause: FailureReason | None) -> Answer | None:
    """What a notice (its event reason, and why it failed) says of the request it is
    about; None if it does not answer one (a completion is told apart)."""
    if reason in _FAILURES:
        return Answer.NOT_TAKEN if cause in _NOT_ITS_OWN else Answer.FAILED
    if reason == _NOT_NEEDED:
        # One a newer checkpoint overtook failed (counted, taken again after its backoff):
        # not taken again at once, however often that happens.
        return Answer.FAILED if cause is FailureReason.SUBSUMED else Answer.NOT_TAKEN
    return None


def is_snapshot_label(label: str) -> bool:
    return label.startswith(LABEL_PREFIX)


def retry_delay(failures: int) -> float:
    return float(min(FIRST_RETRY_SECONDS * 2 ** max(0, failures - 1), LONGEST_RETRY_SECONDS))


def decide(snapshot: Snapshot, job: JobView, now: float) -> Decision:
    """The snapshot's next status, and whether to ask for it now. A final status stands;
    a mirror's is `plan_mirrors`'s to write."""
    if not snapshot.open or snapshot.mirror:
        return Decision(dict(snapshot.status))
    status = _open_status(snapshot)
    label = snapshot.label
    if snapshot.deleting and label not in job.in_flight and label not in job.completed:
        # Nothing is taken, nor kept, for an object on its way out (as Flink lets one go
        # that was not triggered); one in flight completes, and its deletion disposes.
        return Decision(_abandoned(status, "deleted before it was taken"))
    if snapshot.existing_path is not None:
        return _decide_existing(snapshot, status, job, now)
    if (completed := job.completed.get(label)) is not None:
        return Decision(_completed(status, completed))
    if label in job.in_flight:
        status["state"] = SnapshotState.IN_PROGRESS.value
        if (checkpoint_id := job.in_flight[label]) is not None:
            status["id"] = checkpoint_id
        return Decision(_without(status, "message"))
    if (error := job.failed.get(label)) is not None:
        status |= {
            "failures": status["failures"] + 1,
            "error": error,
            "resultTimestamp": format_time(now),
        }
        if 0 <= snapshot.backoff_limit < status["failures"]:
            status["state"] = SnapshotState.FAILED.value
            limit = f"spec.backoffLimit {snapshot.backoff_limit}"
            status["message"] = f"failed {status['failures']} time(s), {limit}: not taken again"
            return Decision(status)
    if job.phase in ENDED:
        return Decision(
            _abandoned(status, f"the job is {job.phase.value}: nothing runs to take it")
        )
    status = _without(status, "id") | {"state": SnapshotState.TRIGGER_PENDING.value}
    if (due := _retry_due(status)) is not None and due > now:
        status["message"] = f"taken again at {format_time(due)} (failure {status['failures']})"
        return Decision(status, wake_at=due)
    if job.phase is not JobPhase.RUNNING:
        status["message"] = f"waits for the job to run (phase {job.phase.value})"
        return Decision(status)
    status |= {"state": SnapshotState.IN_PROGRESS.value, "triggerTimestamp": format_time(now)}
    return Decision(_without(status, "message"), trigger=True)


def _decide_existing(
    snapshot: Snapshot, status: dict[str, Any], job: JobView, now: float
) -> Decision:
    """A snapshot of an existing savepoint (Flink's alreadyExists): completed as the
    registry's savepoint once the job's coordinator pinned it (asked for while a driver
    runs), failed if its path names none."""
    if job.phase in ENDED:
        return Decision(
            _abandoned(status, f"the job is {job.phase.value}: nothing runs to keep it")
        )
    if job.phase is not JobPhase.RUNNING or job.existing is None:
        message = f"waits for the job to run (phase {job.phase.value}) to keep it"
        return Decision(status | {"state": SnapshotState.TRIGGER_PENDING.value, "message": message})
    if isinstance(job.existing, str):
        status |= {
            "state": SnapshotState.FAILED.value,
            "failures": status["failures"] + 1,
            "error": job.existing,
            "resultTimestamp": format_time(now),
            # What -o wide shows: the reason, and what to do (the spec is not read again).
            "message": f"{job.existing}; create another object to keep another savepoint",
        }
        return Decision(status)
    if not job.existing.pinned:
        sid = job.existing.checkpoint_id
        message = f"keeps savepoint {sid} once the job's coordinator has pinned it"
        pending = status | {"state": SnapshotState.TRIGGER_PENDING.value, "message": message}
        return Decision(pending, pin=job.existing)
    return Decision(_completed(status, job.existing))


def _completed(status: dict[str, Any], completed: CompletedCheckpoint) -> dict[str, Any]:
    return _without(status, "error", "message") | {
        "state": SnapshotState.COMPLETED.value,
        "id": completed.checkpoint_id,
        "path": completed.path,
        "batch": completed.batch_id,
        "sizeBytes": completed.size_bytes,
        "triggerTimestamp": format_time(completed.trigger_time),
        "resultTimestamp": format_time(completed.completion_time),
    }


@dataclass
class PinPlan:
    """What the job's controller does for its savepoint snapshots' savepoints: the
    registered savepoints to pin and to release, those to dispose of (by the label of the
    deleted snapshot that disposes of it), the snapshots to hold with `FINALIZER` and
    those whose finalizer may go."""

    pin: set[int] = field(default_factory=set)
    release: set[int] = field(default_factory=set)
    dispose: dict[int, str] = field(default_factory=dict)
    hold: list[Snapshot] = field(default_factory=list)
    let_go: list[Snapshot] = field(default_factory=list)


def plan_pins(
    job: str,
    listed: Sequence[Snapshot],
    savepoints: Sequence[CompletedCheckpoint],
    *,
    existing: Callable[[str], CompletedCheckpoint | str],
    in_flight: Callable[[str], bool],
    outstanding: Set[int] = frozenset(),
) -> PinPlan:
    """Each registered savepoint kept while a savepoint snapshot of ``job`` stands for it,
    released once none does; disposed of as the last ones that stood for it are deleted
    (held by `FINALIZER`), if one of them completed and none says disposeOnDelete false (as
    in Flink). ``listed``: the API server's list (a watch gap reports no deletion);
    ``existing``: the savepoint an alreadyExists path names; ``in_flight``: whether a
    snapshot's own savepoint (by label) is being taken; ``outstanding``: the savepoints
    with an ask not in the registry yet (nothing else is asked of them meanwhile)."""
    registered = {s.checkpoint_id: s for s in savepoints}
    by_label = {s.label: s.checkpoint_id for s in savepoints if is_snapshot_label(s.label)}

    def stands_for(snapshot: Snapshot) -> int | None:
        if snapshot.state is SnapshotState.COMPLETED:
            # By its id and path: a job of the same name created later counts ids again.
            sid, path = snapshot.status.get("id"), snapshot.status.get("path")
            found = registered.get(sid) if isinstance(sid, int) else None
            return sid if found is not None and found.path == path else None
        if not snapshot.open:
            return None
        if snapshot.existing_path is not None:
            named = existing(snapshot.existing_path)
            return None if isinstance(named, str) else named.checkpoint_id
        return by_label.get(snapshot.label)

    def completing(snapshot: Snapshot) -> bool:
        """Its own savepoint is taken, or taken and its status not written yet: its
        deletion disposes of it once it says COMPLETED (Flink waits too)."""
        taken = snapshot.open and snapshot.existing_path is None
        return taken and (in_flight(snapshot.label) or snapshot.label in by_label)

    def disposes(snapshot: Snapshot) -> bool:
        """Its deletion may dispose of its savepoint: held until then."""
        return (
            snapshot.kind is CheckpointKind.SAVEPOINT
            and snapshot.dispose_on_delete
            and snapshot.state not in (SnapshotState.FAILED, SnapshotState.ABANDONED)
        )

    mine = [s for s in listed if s.job == job and not s.mirror]
    standing = [s for s in mine if not s.deleting and s.kind is CheckpointKind.SAVEPOINT]
    wanted = {sid for s in standing if (sid := stands_for(s)) is not None}
    plan = PinPlan(pin={sid for sid in wanted if not registered[sid].pinned} - outstanding)
    plan.hold = [s for s in standing if disposes(s) and not s.held]
    plan.let_go = [s for s in mine if s.held and not s.deleting and not disposes(s)]
    deleted: dict[int, list[Snapshot]] = {}
    for snapshot in (s for s in mine if s.deleting):
        sid = stands_for(snapshot) if snapshot.kind is CheckpointKind.SAVEPOINT else None
        if sid is not None and sid not in wanted:
            # With the others deleted, held or not: one that says false keeps it.
            deleted.setdefault(sid, []).append(snapshot)
        elif snapshot.held and (sid is not None or not completing(snapshot)):
            plan.let_go.append(snapshot)  # another stands for it, or it stood for none
    for sid, group in deleted.items():
        if sid in outstanding or any(completing(s) for s in group):
            continue  # its ask first; or its status, to say it completed
        if not registered[sid].pinned:
            plan.let_go += [s for s in group if s.held]  # released (a disposal refused): done
            continue
        disposing = [s for s in group if s.state is SnapshotState.COMPLETED]
        if disposing and all(s.dispose_on_delete for s in group):
            plan.dispose[sid] = disposing[0].label
        plan.release.add(sid)
    plan.release |= {
        sid
        for sid, savepoint in registered.items()
        if savepoint.pinned and sid not in wanted | set(deleted) | outstanding
    }
    return plan


@dataclass
class MirrorPlan:
    """The mirrors of a job's savepoints to create, those whose status to write (the
    registry's savepoint), those to delete (their savepoint let go or kept by a snapshot
    object, or mirrors turned off) and to replace (edited: deleted, made again once gone),
    and the savepoints whose mirror's name another object holds (by the name)."""

    create: list[CompletedCheckpoint] = field(default_factory=list)
    complete: list[tuple[Snapshot, CompletedCheckpoint]] = field(default_factory=list)
    delete: list[Snapshot] = field(default_factory=list)
    replace: list[Snapshot] = field(default_factory=list)
    blocked: dict[str, CompletedCheckpoint] = field(default_factory=dict)
    let_go: list[Snapshot] = field(default_factory=list)  # `FINALIZER` put on one by hand


def plan_mirrors(
    job: Mapping[str, Any],
    listed: Sequence[Snapshot],
    savepoints: Sequence[CompletedCheckpoint],
    *,
    enabled: bool,
) -> MirrorPlan:
    """A mirror, as `mirror` makes it, for each savepoint in the savepoint history of
    ``job`` (its body) that no snapshot object keeps (pins), while ``enabled``; none
    otherwise: each savepoint is then listed once, by a snapshot object of the user's or a
    mirror. Only the job's own mirrors (by uid: a job of the same name created later has
    others) are written or deleted; a name another object holds is left to it."""
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    wanted = {
        mirror_name(name, savepoint.checkpoint_id): savepoint
        for savepoint in savepoints
        if enabled and not savepoint.pinned
    }
    plan = MirrorPlan()
    for snapshot in listed:
        savepoint = wanted.pop(snapshot.name, None)
        if snapshot.owner != uid or not snapshot.mirror:
            if savepoint is not None:
                plan.blocked[snapshot.name] = savepoint
            continue
        if snapshot.held:
            plan.let_go.append(snapshot)  # it disposes of nothing: nothing to wait for
        if snapshot.deleting:
            continue  # made again once gone
        if savepoint is None:
            plan.delete.append(snapshot)
        elif not _as_made(snapshot, mirror(job, savepoint)):
            plan.replace.append(snapshot)
        elif dict(snapshot.status) != mirror_status(name, savepoint):
            plan.complete.append((snapshot, savepoint))
    plan.create = list(wanted.values())
    return plan


def _as_made(snapshot: Snapshot, made: Mapping[str, Any]) -> bool:
    """What `mirror` sets is as it set it (what the API server defaults aside)."""
    metadata, spec = made["metadata"], made["spec"]
    kept = snapshot.spec.get("savepoint") or {}
    return (
        all(snapshot.labels.get(k) == v for k, v in metadata["labels"].items())
        and all(snapshot.annotations.get(k) == v for k, v in metadata["annotations"].items())
        and (snapshot.spec.get("jobReference") or {}).get("name") == spec["jobReference"]["name"]
        and "checkpoint" not in snapshot.spec
        and all(kept.get(k) == v for k, v in spec["savepoint"].items())
    )


def mirror_name(job: str, savepoint_id: int) -> str:
    return f"{job}-savepoint-{savepoint_id}"


def mirror(job: Mapping[str, Any], savepoint: CompletedCheckpoint) -> dict[str, Any]:
    """The mirror of ``savepoint`` of ``job`` (its body): owned by the job (it goes with
    it), of an existing savepoint that its deletion does not dispose of."""
    name = job["metadata"]["name"]
    return {
        "apiVersion": f"{objects.GROUP}/{objects.VERSION}",
        "kind": KIND,
        "metadata": {
            "name": mirror_name(name, savepoint.checkpoint_id),
            "namespace": job["metadata"]["namespace"],
            "labels": {objects.LABEL_JOB: name, objects.LABEL_COMPONENT: MIRROR_COMPONENT},
            "annotations": {ANNOTATION_SAVEPOINT_LABEL: savepoint.label},
            "ownerReferences": [objects.owner_reference(job)],
        },
        "spec": {
            "jobReference": {"name": name},
            "savepoint": {"alreadyExists": True, "path": savepoint.path, "disposeOnDelete": False},
        },
    }


def mirror_status(job: str, savepoint: CompletedCheckpoint) -> dict[str, Any]:
    status = {"job": job, "kind": CheckpointKind.SAVEPOINT.value, "failures": 0}
    return _completed(status, savepoint)


def event(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The event (type, reason, message) a change of a snapshot's status posts on it, so
    that `kubectl describe` tells its story; None for a change that says nothing new."""
    state, kind = after.get("state"), after.get("kind", "snapshot")
    if state == before.get("state") and after.get("failures") == before.get("failures"):
        return None
    if state == SnapshotState.COMPLETED:
        return ("Normal", "SnapshotCompleted", f"{kind} {after['id']} completed: {after['path']}")
    if state == SnapshotState.ABANDONED:
        return ("Warning", "SnapshotAbandoned", str(after.get("error")))
    if after.get("failures") != before.get("failures", 0):
        error, message = str(after.get("error")), str(after.get("message"))
        # A message that repeats its error (an alreadyExists path's, for -o wide) is said once.
        said = message if message.startswith(error) else f"{error}; {message}"
        return ("Warning", "SnapshotError", said)
    return None


def for_missing_job(snapshot: Snapshot) -> dict[str, Any]:
    """The status of an open snapshot whose job does not exist: it waits for one of that
    name (a GitOps sync may apply the snapshot first: any job of that name created later
    takes it); one in flight was abandoned with its job."""
    if snapshot.state is SnapshotState.IN_PROGRESS:
        return for_deleted_job(snapshot)
    return _open_status(snapshot) | {
        "state": SnapshotState.TRIGGER_PENDING.value,
        "message": f"waits for SparkCheckpointJob {snapshot.job}, which does not exist",
    }


def for_deleted_job(snapshot: Snapshot) -> dict[str, Any]:
    """The status of an open snapshot whose job was deleted: abandoned (a job created
    later under that name is another job)."""
    return _abandoned(_open_status(snapshot), f"SparkCheckpointJob {snapshot.job} was deleted")


def status_patch(stored: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that turns the stored status into ``status`` (None for a field to
    remove); None if they are the same."""
    if dict(stored) == dict(status):
        return None
    return {key: status.get(key) for key in {*stored, *status}}


def _open_status(snapshot: Snapshot) -> dict[str, Any]:
    """The stored status with what each written status of an open snapshot says: its job
    and kind, and its failures (0 before the first)."""
    status = dict(snapshot.status) | {"job": snapshot.job, "kind": snapshot.kind.value}
    status.setdefault("failures", 0)
    return status


def _abandoned(status: dict[str, Any], error: str) -> dict[str, Any]:
    return _without(status, "id") | {
        "state": SnapshotState.ABANDONED.value,
        "error": error,
        "message": error,  # what -o wide shows
    }


def _retry_due(status: Mapping[str, Any]) -> float | None:
    """When a failed snapshot is taken again; None if it never failed."""
    failures, last = status.get("failures"), status.get("resultTimestamp")
    if not isinstance(failures, int) or failures < 1 or not isinstance(last, str):
        return None
    try:
        failed_at = parse_time(last)
    except ValueError:  # a status written by hand: taken again now
        return None
    return failed_at + retry_delay(failures)


def _without(status: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in status.items() if key not in keys}
