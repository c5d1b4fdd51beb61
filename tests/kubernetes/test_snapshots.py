"""`snapshots.decide`: a SparkCheckpointSnapshot's next status from what its job's controller
observes, drawn as sequences of job phases, failures and completions with drawn backoff
limits."""

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.aio import config
from kubernetes.aio.client import Configuration
from kubernetes.aio.client.exceptions import ApiException, NotFoundException

from helpers.kube.emulator import spark_checkpoint_api
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CompletedCheckpoint,
    FailureReason,
    JobPhase,
)
from spark_checkpoint_operator.coordinator.state import parse_time
from spark_checkpoint_operator.kubernetes import objects, snapshots
from spark_checkpoint_operator.kubernetes.controller import (
    hold_snapshot,
    note_missing_job,
    write_snapshot_status,
)
from spark_checkpoint_operator.kubernetes.runtime import (
    Clients,
    OperatorApiClient,
    PodRegistry,
    SnapshotRegistry,
)
from spark_checkpoint_operator.kubernetes.snapshots import (
    Answer,
    JobView,
    Snapshot,
    SnapshotState,
    decide,
    retry_delay,
)

START = 1_800_000_000.0


def snapshot(status: dict[str, Any] | None = None, backoff_limit: int = -1) -> Snapshot:
    return Snapshot(
        namespace="default",
        name="nightly",
        uid="0123456789abcdef",
        job="orders",
        kind=CheckpointKind.SAVEPOINT,
        backoff_limit=backoff_limit,
        status=status or {},
    )


LABEL = snapshot().label


def image(checkpoint_id: int, label: str = LABEL) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.SAVEPOINT,
        batch_id=4,
        path=f"file:///s/default/orders/savepoints/sp-{checkpoint_id}/_metadata",
        size_bytes=10,
        trigger_time=START,
        completion_time=START + 1,
        label=label,
    )


def test_the_label_tells_a_snapshot_from_an_earlier_one_of_its_name() -> None:
    again = Snapshot.from_body(
        {
            "metadata": {"namespace": "default", "name": "nightly", "uid": "fedcba9876543210"},
            "spec": {"jobReference": {"name": "orders"}, "savepoint": {}},
        }
    )
    assert LABEL == "snapshot nightly (01234567)"
    assert again.label != LABEL
    assert snapshots.is_snapshot_label(LABEL) and not snapshots.is_snapshot_label("nonce 1")
    # A completion labelled for the earlier one is not the new one's.
    decision = decide(again, JobView(JobPhase.RUNNING, completed={LABEL: image(7)}), START)
    assert decision.trigger and decision.status["state"] == "IN_PROGRESS"


def test_a_running_job_is_asked_and_the_snapshot_completes_with_its_image() -> None:
    asked = decide(snapshot(), JobView(JobPhase.RUNNING), START)
    assert asked.trigger
    assert asked.status == {
        "job": "orders",
        "kind": "savepoint",
        "failures": 0,
        "state": "IN_PROGRESS",
        "triggerTimestamp": "2027-01-15T08:00:00Z",
    }
    in_flight = decide(
        snapshot(asked.status), JobView(JobPhase.RUNNING, in_flight={LABEL: 9}), START
    )
    assert not in_flight.trigger and in_flight.status["id"] == 9
    done = decide(
        snapshot(in_flight.status),
        JobView(JobPhase.RUNNING, completed={LABEL: image(9)}),
        START + 2,
    )
    assert done.status["state"] == "COMPLETED"
    assert done.status["path"].endswith("/sp-9/_metadata")
    assert decide(snapshot(done.status), JobView(JobPhase.FAILED), START + 3).status == done.status


def test_a_snapshot_waits_while_the_job_does_not_run_and_is_abandoned_once_it_ended() -> None:
    for phase in (JobPhase.PENDING, JobPhase.DEPLOYING, JobPhase.RESTARTING, JobPhase.SUSPENDED):
        waiting = decide(snapshot(), JobView(phase), START)
        assert not waiting.trigger
        assert waiting.status["message"] == f"waits for the job to run (phase {phase.value})"
    for phase in (JobPhase.FINISHED, JobPhase.FAILED, JobPhase.CANCELLED):
        abandoned = decide(snapshot({"state": "IN_PROGRESS", "id": 3}), JobView(phase), START)
        assert abandoned.status["state"] == "ABANDONED" and "id" not in abandoned.status
        assert abandoned.status["error"] == f"the job is {phase.value}: nothing runs to take it"


def test_a_snapshot_of_an_existing_savepoint_completes_once_it_is_pinned() -> None:
    """Flink's alreadyExists: nothing is asked for; the registry's savepoint is pinned
    (`Decision.pin`) while a driver runs, and the snapshot completes as it once the
    registry shows the pin; failed at once, once, for a path that names none; waits while
    no driver runs, abandoned once the job ended. Read until the trigger, as the spec."""
    body = {
        "metadata": {"namespace": "default", "name": "keep", "uid": "0123456789abcdef"},
        "spec": {
            "jobReference": {"name": "orders"},
            "savepoint": {"alreadyExists": True, "path": image(4).path, "disposeOnDelete": False},
        },
    }
    existing = Snapshot.from_body(body)
    assert (existing.existing_path, existing.dispose_on_delete) == (image(4).path, False)
    assert Snapshot.from_body({**body, "spec": {"savepoint": {}}}).dispose_on_delete
    triggered = {**body, "status": {"triggerTimestamp": "2027-01-15T08:00:00Z"}}
    assert Snapshot.from_body(triggered).existing_path is None

    registered = image(4, "nonce 1")
    pinning = decide(existing, JobView(JobPhase.RUNNING, existing=registered), START)
    assert (pinning.trigger, pinning.pin) == (False, registered)
    assert pinning.status["state"] == "TRIGGER_PENDING"
    pinned = dataclasses.replace(registered, pinned=True)
    kept = decide(existing, JobView(JobPhase.RUNNING, existing=pinned), START)
    assert kept.pin is None and kept.status["state"] == "COMPLETED"
    assert (kept.status["id"], kept.status["path"]) == (4, image(4).path)
    waiting = decide(existing, JobView(JobPhase.RUNNING), START)  # no driver attached yet
    assert waiting.status["state"] == "TRIGGER_PENDING" and waiting.pin is None
    assert waiting.status["message"] == "waits for the job to run (phase Running) to keep it"
    abandoned = decide(existing, JobView(JobPhase.FINISHED, existing=pinned), START)
    assert abandoned.status["state"] == "ABANDONED" and abandoned.pin is None
    failed = decide(existing, JobView(JobPhase.RUNNING, existing="no such savepoint"), START)
    assert failed.status["state"] == "FAILED" and failed.pin is None
    assert (failed.status["error"], failed.status["failures"]) == ("no such savepoint", 1)
    assert snapshots.event(existing.status, failed.status) == (
        "Warning",
        "SnapshotError",
        "no such savepoint; create another object to keep another savepoint",
    ), "the error said once"
    again = Snapshot.from_body({**body, "status": failed.status})
    assert decide(again, JobView(JobPhase.RUNNING, existing=pinned), START).status == (
        failed.status
    )


def test_a_missing_job_is_waited_for_unless_the_snapshot_was_in_flight() -> None:
    assert snapshots.for_missing_job(snapshot())["message"] == (
        "waits for SparkCheckpointJob orders, which does not exist"
    )
    gone = snapshots.for_missing_job(snapshot({"state": "IN_PROGRESS", "id": 3}))
    assert gone["state"] == "ABANDONED" and gone["error"] == "SparkCheckpointJob orders was deleted"
    assert gone["message"] == gone["error"], "what kubectl get -o wide shows (a newcomer's)"
    assert snapshots.for_deleted_job(snapshot({"state": "TRIGGER_PENDING"})) == gone | {
        "state": "ABANDONED"
    }


def test_each_step_of_the_story_posts_one_event() -> None:
    asked = {"kind": "savepoint", "failures": 0, "state": "IN_PROGRESS"}
    assert snapshots.event({}, asked) is None
    assert snapshots.event(asked, asked | {"id": 3}) is None
    retry = asked | {"state": "TRIGGER_PENDING", "failures": 1, "error": "expired"}
    retry["message"] = "taken again at T (failure 1)"
    assert snapshots.event(asked, retry) == (
        "Warning",
        "SnapshotError",
        "expired; taken again at T (failure 1)",
    )
    done = asked | {"state": "COMPLETED", "id": 4, "path": "p"}
    assert snapshots.event(retry | {"state": "IN_PROGRESS"}, done) == (
        "Normal",
        "SnapshotCompleted",
        "savepoint 4 completed: p",
    )
    gone = asked | {"state": "ABANDONED", "error": "the job is Failed: nothing runs to take it"}
    assert snapshots.event(asked, gone) == ("Warning", "SnapshotAbandoned", gone["error"])


def test_the_status_patch_removes_what_the_new_status_has_not() -> None:
    assert snapshots.status_patch({"state": "X", "message": "m"}, {"state": "Y"}) == {
        "state": "Y",
        "message": None,
    }
    assert snapshots.status_patch({"state": "Y"}, {"state": "Y"}) is None


_PHASES = st.sampled_from(list(JobPhase))
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(
            [JobPhase.RUNNING] * 4 + [JobPhase.RESTARTING, JobPhase.SUSPENDED, JobPhase.FINISHED]
        ),
        st.sampled_from(["nothing", "in flight", "fail", "complete"]),
        # Seconds passed: about the retry delays (10 s doubling up to 300 s), either side.
        st.sampled_from([0.0, 1.0, 5.0, 9.5, 10.0, 15.0, 19.5, 20.0, 39.0, 80.0, 299.0, 300.0]),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(backoff_limit=st.integers(min_value=-1, max_value=4), steps=_STEPS)
def test_drawn_histories_keep_the_snapshot_rules(
    backoff_limit: int, steps: list[tuple[JobPhase, str, float]]
) -> None:
    """Whatever the job does: asked only while it runs, nothing in flight and no retry
    pending; each failure counted once; FAILED exactly past the backoff limit; a final
    state stands; never asked again once final."""
    status: dict[str, Any] = {}
    now = START
    asked = False  # the snapshot's savepoint is in flight or queued
    for phase, event, elapsed in steps:
        now += elapsed
        before = snapshot(status, backoff_limit)
        view = JobView(phase)
        if asked and event == "fail":
            view.failed = {LABEL: "savepoint 3 failed: expired"}
        elif asked and event == "complete":
            view.completed = {LABEL: image(3)}
        elif asked and event in ("in flight", "nothing") and phase is JobPhase.RUNNING:
            view.in_flight = {LABEL: 3}
        decision = decide(before, view, now)
        after = decision.status
        if not before.open:
            assert after == status and not decision.trigger
            continue
        failures_before = status.get("failures", 0)
        counted = LABEL in view.failed and LABEL not in view.completed
        assert after["failures"] == failures_before + counted
        if decision.trigger:
            assert phase is JobPhase.RUNNING and not view.in_flight
            if failures_before:
                last = parse_time(status["resultTimestamp"])
                assert now >= last + retry_delay(failures_before)
            asked = True
        elif LABEL not in view.in_flight:
            asked = False
        state = SnapshotState(after["state"])
        if counted and 0 <= backoff_limit < after["failures"]:
            assert state is SnapshotState.FAILED
        elif state is SnapshotState.FAILED:
            raise AssertionError(f"FAILED within the backoff limit: {after}")
        if state is SnapshotState.COMPLETED:
            assert after["id"] == 3 and "error" not in after
        if phase in (JobPhase.FINISHED,) and state not in (
            SnapshotState.COMPLETED,
            SnapshotState.FAILED,
        ):
            assert state is SnapshotState.ABANDONED
        status = after


class _Refusing:
    """custom_objects whose status patch fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        raise self.error

    async def patch_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
        raise self.error


def _body() -> dict[str, Any]:
    return {
        "metadata": {"namespace": "default", "name": "nightly", "uid": "0123456789abcdef"},
        "spec": {"jobReference": {"name": "orders"}, "savepoint": {}},
    }


@pytest.mark.parametrize(
    "error",
    [
        NotFoundException(status=404, reason="Not Found"),
        ApiException(status=409, reason="Conflict"),
        ApiException(status=403, reason="Forbidden"),
        aiohttp.ClientConnectionError("connection reset"),
        TimeoutError(),
    ],
    ids=["gone", "changed", "forbidden", "no answer", "timed out"],
)
def test_a_status_write_that_fails_is_no_failure_of_the_job(error: Exception) -> None:
    """An unanswered write escaped into the job's daemon and took its coordinator down (a
    reviewer's); a snapshot gone is forgotten: a watch listed again after a gap says no
    deletion, and the controller asked for a savepoint for it at every change."""
    registry = SnapshotRegistry()
    registry.observe("ADDED", _body())
    clients = SimpleNamespace(custom_objects=_Refusing(error), snapshots=registry)

    written = asyncio.run(
        write_snapshot_status(clients, Snapshot.from_body(_body()), {"state": "IN_PROGRESS"})  # type: ignore[arg-type]
    )

    assert written is False
    gone = isinstance(error, NotFoundException)
    assert (registry.of("default", "orders") == []) == gone


@pytest.mark.parametrize(
    ("error", "done"),
    [
        (NotFoundException(status=404, reason="Not Found"), True),
        (ApiException(status=409, reason="Conflict"), False),
        (ApiException(status=403, reason="Forbidden"), True),
        (aiohttp.ClientConnectionError("connection reset"), False),
        (TimeoutError(), False),
    ],
    ids=["gone", "changed", "forbidden", "no answer", "timed out"],
)
def test_a_finalizer_write_that_fails_is_tried_again_unless_it_cannot_be(
    error: Exception, done: bool
) -> None:
    """A conflict or no answer: tried again (soon, or at the next change); gone: nothing to
    hold; forbidden (a role without patch on the snapshots): not at every change (the
    object is then released, not disposed of, at its deletion)."""
    clients = SimpleNamespace(custom_objects=_Refusing(error))
    for held in (True, False):
        written = asyncio.run(hold_snapshot(clients, Snapshot.from_body(_body()), held=held))  # type: ignore[arg-type]
        assert written is done


SNAPSHOTS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointsnapshots"


def test_a_missing_jobs_status_is_never_written_from_an_older_event(tmp_path: Path) -> None:
    """Any operator replica handles a snapshot whose job does not exist; one that handles an
    older event late must not overwrite a newer status (the job's controller's, say): its
    write is made over the version it read (a reviewer's)."""
    with spark_checkpoint_api() as api:
        created = api.create(
            SNAPSHOTS,
            {
                **_body(),
                "apiVersion": "sparkcheckpoint.io/v1alpha1",
                "kind": "SparkCheckpointSnapshot",
                "metadata": {"namespace": "default", "name": "nightly"},
            },
            namespace="default",
        )
        api.patch(SNAPSHOTS, "default", "nightly", {"spec": {"backoffLimit": 3}})
        fresh = api.get(SNAPSHOTS, "default", "nightly")
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

        async def handle(*bodies: dict[str, Any]) -> None:
            configuration = Configuration()
            await config.load_kube_config(str(kubeconfig), client_configuration=configuration)
            async with aiohttp.ClientSession() as session:
                clients = Clients(OperatorApiClient(configuration), PodRegistry(), session)
                try:
                    for body in bodies:
                        await note_missing_job(clients, body)
                finally:
                    await clients.api.close()

        asyncio.run(handle(created))
        assert api.get(SNAPSHOTS, "default", "nightly").get("status") in (None, {})
        asyncio.run(handle(fresh))
        status = api.get(SNAPSHOTS, "default", "nightly")["status"]

    assert status["message"] == "waits for SparkCheckpointJob orders, which does not exist"


def test_a_request_that_ends_because_the_job_stopped_is_no_failure() -> None:
    """A queued snapshot request declined as the job stopped counted against backoffLimit
    (one in flight, aborted by the same stop, did not: a reviewer's)."""
    assert (
        snapshots.answer("RequestDeclined", FailureReason.COORDINATOR_SUSPEND) is Answer.NOT_TAKEN
    )
    assert snapshots.answer("CheckpointFailed", FailureReason.WITHDRAWN) is Answer.NOT_TAKEN
    assert snapshots.answer("CheckpointNotNeeded", None) is Answer.NOT_TAKEN
    # Overtaken by a newer checkpoint: no warning on the job, but the snapshot's failure,
    # taken again after its backoff (NOT_TAKEN asked it again at once, without end).
    assert snapshots.answer("CheckpointNotNeeded", FailureReason.SUBSUMED) is Answer.FAILED
    assert snapshots.answer("CheckpointFailed", FailureReason.EXPIRED) is Answer.FAILED
    assert (
        snapshots.answer("RequestDeclined", FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING)
        is Answer.FAILED
    )
    assert snapshots.answer("SavepointCompleted", None) is None


# --- plan_pins: drawn objects of the job (and others'), drawn registries and asks --------

_OBJECT = st.fixed_dictionaries(
    {
        "state": st.sampled_from(
            [None, "TRIGGER_PENDING", "IN_PROGRESS", "COMPLETED", "FAILED", "ABANDONED"]
        ),
        "checkpoint": st.booleans(),
        "stands_for": st.integers(1, 4),  # its completed savepoint's id, or its label's
        "by_path": st.booleans(),  # COMPLETED: status.path names the registered savepoint
        "existing": st.booleans(),  # alreadyExists (open): its path names the savepoint
        "deleting": st.booleans(),
        "held": st.booleans(),
        "dispose": st.booleans(),
        "in_flight": st.booleans(),
        "job": st.sampled_from(["orders", "orders", "other"]),
        "mirror": st.sampled_from([False, False, False, True]),  # made by the operator
    }
)


def _drawn_snapshot(index: int, drawn: dict[str, Any]) -> Snapshot:
    sid, state = drawn["stands_for"], drawn["state"]
    status: dict[str, Any] = {"state": state} if state else {}
    if state == "COMPLETED":
        path = image(sid).path if drawn["by_path"] else "file:///elsewhere/sp-1/_metadata"
        status |= {"id": sid, "path": path, "triggerTimestamp": "2027-01-15T08:00:00Z"}
    return Snapshot(
        namespace="default",
        name=snapshots.mirror_name("orders", index) if drawn["mirror"] else f"s{index}",
        uid=f"{index:016d}",
        job=drawn["job"],
        kind=CheckpointKind.CHECKPOINT if drawn["checkpoint"] else CheckpointKind.SAVEPOINT,
        backoff_limit=-1,
        status=status,
        existing_path=image(sid).path if drawn["existing"] and state != "COMPLETED" else None,
        dispose_on_delete=drawn["dispose"],
        deleting=drawn["deleting"],
        finalizers=(snapshots.FINALIZER,) if drawn["held"] else (),
        owner="job-uid" if drawn["mirror"] else None,
        owner_name="orders" if drawn["mirror"] else None,
    )


@settings(max_examples=400, deadline=None)
@given(
    objects=st.lists(_OBJECT, max_size=6),
    registered=st.dictionaries(st.integers(1, 4), st.booleans()),
    outstanding=st.sets(st.integers(1, 4)),
)
def test_drawn_pin_plans_never_dispose_of_a_kept_savepoint(
    objects: list[dict[str, Any]], registered: dict[int, bool], outstanding: set[int]
) -> None:
    """What `plan_pins` asks for, over drawn objects, registries and outstanding asks: a
    savepoint a standing object of the job stands for is never released nor disposed of;
    one is disposed of only as the last deleted objects for it go, one of them completed,
    none saying disposeOnDelete false; a deleted object's finalizer goes only once nothing
    is left to do for it; nothing is asked twice of a savepoint with an ask outstanding. The
    operator's own mirrors of savepoints count for nothing."""
    listed = [_drawn_snapshot(i, o) for i, o in enumerate(objects)]
    flights = {s.label for s, o in zip(listed, objects, strict=True) if o["in_flight"]}
    savepoints = [
        dataclasses.replace(
            image(sid, label=listed[sid - 1].label if sid <= len(listed) else ""), pinned=pinned
        )
        for sid, pinned in sorted(registered.items())
    ]

    def existing(path: str) -> CompletedCheckpoint | str:
        return next((s for s in savepoints if s.path == path), f"{path}: not registered")

    plan = snapshots.plan_pins(
        "orders",
        listed,
        savepoints,
        existing=existing,
        in_flight=flights.__contains__,
        outstanding=outstanding,
    )

    by_label = {s.label: s.checkpoint_id for s in savepoints}

    def stands_for(snapshot: Snapshot) -> int | None:
        if snapshot.state is SnapshotState.COMPLETED:
            sid = snapshot.status["id"]
            return sid if sid in registered and snapshot.status["path"] == image(sid).path else None
        if not snapshot.open:
            return None
        if snapshot.existing_path is not None:
            named = existing(snapshot.existing_path)
            return None if isinstance(named, str) else named.checkpoint_id
        return by_label.get(snapshot.label)

    made = {s.name for s, o in zip(listed, objects, strict=True) if o["mirror"]}  # owned: mirrors
    mine = [s for s in listed if s.job == "orders" and s.name not in made]
    own = [s for s in mine if s.kind is CheckpointKind.SAVEPOINT]
    kept = {sid for s in own if not s.deleting and (sid := stands_for(s)) is not None}
    asked = plan.pin | plan.release | set(plan.dispose)
    assert not asked & outstanding
    assert not (plan.release | set(plan.dispose)) & kept
    assert plan.pin == {sid for sid in kept if not registered[sid]} - outstanding
    for sid, label in plan.dispose.items():
        going = [s for s in own if s.deleting and stands_for(s) == sid]  # held or not
        assert all(s.dispose_on_delete for s in going) and registered[sid]
        # None still being taken, or completed with its status not saying so yet.
        assert not any(
            s.open and s.existing_path is None and (s.label in flights or s.label in by_label)
            for s in going
        )
        assert label in {s.label for s in going if s.state is SnapshotState.COMPLETED}
        assert sid in plan.release  # released after: a refused disposal hands it to the history

    def disposes(snapshot: Snapshot) -> bool:
        return (
            snapshot.kind is CheckpointKind.SAVEPOINT
            and snapshot.dispose_on_delete
            and snapshot.state not in ("FAILED", "ABANDONED")
        )

    for snapshot in plan.let_go:
        assert snapshot.held and snapshot.job == "orders"
        if not snapshot.deleting:
            assert not disposes(snapshot)  # no longer one whose deletion disposes
            continue
        sid = stands_for(snapshot) if snapshot.kind is CheckpointKind.SAVEPOINT else None
        assert sid is None or sid in kept or not registered[sid], (snapshot, sid)
        assert sid in kept or sid not in outstanding
    # Every held object is let go of once nothing is left to do for it.
    for snapshot in (s for s in mine if s.held and s not in plan.let_go):
        sid = stands_for(snapshot) if snapshot.kind is CheckpointKind.SAVEPOINT else None
        if snapshot.deleting:
            assert (sid is not None and sid not in kept) or (
                snapshot.open and snapshot.existing_path is None
            ), snapshot
        else:
            assert disposes(snapshot)
    for snapshot in plan.hold:
        assert not snapshot.deleting and not snapshot.held and disposes(snapshot)
    assert all(s.job == "orders" and s.name not in made for s in plan.hold + plan.let_go)


def test_the_last_completed_object_deleted_disposes_of_its_savepoint() -> None:
    """The plans the drawn test checks the bounds of, one by one."""
    objects = [_drawn_snapshot(0, {**_BASE, "deleting": True, "held": True})]
    objects.append(_drawn_snapshot(1, {**_BASE, "state": "IN_PROGRESS", "stands_for": 2}))
    taken = [
        dataclasses.replace(image(1, objects[0].label), pinned=True),
        dataclasses.replace(image(2, objects[1].label), pinned=True),
    ]

    def plan(
        *listed: Snapshot, outstanding: frozenset[int] = frozenset(), flights: str = ""
    ) -> Any:
        return snapshots.plan_pins(
            "orders",
            listed,
            taken,
            existing=lambda path: "none",
            in_flight=lambda label: label == flights,
            outstanding=outstanding,
        )

    disposing = plan(*objects)
    assert (disposing.dispose, disposing.release, disposing.let_go) == (
        {1: objects[0].label},
        {1},
        [],
    )
    kept_too = dataclasses.replace(objects[0], name="again", deleting=False, finalizers=())
    assert plan(*objects, kept_too).let_go == [objects[0]]  # another stands for it
    edited = dataclasses.replace(objects[0], dispose_on_delete=False)
    assert (plan(edited, objects[1]).dispose, plan(edited, objects[1]).release) == ({}, {1})
    assert plan(*objects, outstanding=frozenset({1})).release == set()  # its ask first
    # Deleted with it, not held (another's finalizer shows it), saying false: kept.
    keeper = dataclasses.replace(objects[0], name="k", dispose_on_delete=False, finalizers=())
    assert (plan(*objects, keeper).dispose, plan(*objects, keeper).release) == ({}, {1})
    released = [dataclasses.replace(taken[0], pinned=False)]
    assert snapshots.plan_pins(
        "orders", objects, released, existing=str, in_flight=lambda label: False
    ).let_go == [objects[0]]
    # Deleted while its savepoint is taken, or taken and its status not written yet: waits.
    going = dataclasses.replace(objects[1], deleting=True, finalizers=(snapshots.FINALIZER,))
    waiting = plan(objects[0], going, flights=going.label)
    assert 2 not in waiting.release and going not in waiting.let_go
    assert objects[1] in plan(*objects).hold


_BASE: dict[str, Any] = {
    "state": "COMPLETED",
    "checkpoint": False,
    "stands_for": 1,
    "by_path": True,
    "existing": False,
    "deleting": False,
    "held": False,
    "dispose": True,
    "in_flight": False,
    "job": "orders",
    "mirror": False,
}


def test_an_object_on_its_way_out_is_taken_only_if_it_was_in_flight() -> None:
    """Deleted (held by the finalizer): nothing is taken or kept for it any more (Flink
    lets a not-triggered one go without a disposal); one in flight completes, so that its
    deletion disposes of its savepoint."""
    going = dataclasses.replace(snapshot(), deleting=True)
    waiting = decide(going, JobView(JobPhase.RUNNING), START)
    assert not waiting.trigger and waiting.status["state"] == "ABANDONED"
    assert waiting.status["error"] == "deleted before it was taken"
    in_flight = decide(going, JobView(JobPhase.RUNNING, in_flight={LABEL: 3}), START)
    assert in_flight.status["state"] == "IN_PROGRESS"
    done = decide(going, JobView(JobPhase.RUNNING, completed={LABEL: image(3)}), START)
    assert done.status["state"] == "COMPLETED"
    existing = dataclasses.replace(going, existing_path=image(4).path)
    kept = decide(existing, JobView(JobPhase.RUNNING, existing=image(4, "nonce 1")), START)
    assert kept.pin is None and kept.status["state"] == "ABANDONED"


# --- plan_mirrors: drawn registries, settings and objects -------------------------------

JOB_BODY = {"metadata": {"name": "orders", "namespace": "default", "uid": "job-uid"}}

_MIRROR_OBJECT = st.fixed_dictionaries(
    {
        "id": st.integers(1, 5),
        # The job's own; an earlier job's of its name (garbage collection lags); a user's.
        "owner": st.sampled_from(["job-uid", "job-uid", "earlier-job-uid", None]),
        "status": st.sampled_from(["right", "right", "none", "stale"]),
        "edited": st.sampled_from([None, None, "label", "dispose", "path", "job"]),
        "deleting": st.sampled_from([False, False, True]),
        "held": st.sampled_from([False, False, True]),  # the finalizer put on by hand
    }
)


def _listed_mirror(
    index: int, drawn: dict[str, Any], savepoints: list[CompletedCheckpoint]
) -> Snapshot:
    sid = drawn["id"]
    registered = next((s for s in savepoints if s.checkpoint_id == sid), image(sid, label=""))
    body = snapshots.mirror(JOB_BODY, registered)
    metadata, spec = body["metadata"], body["spec"]
    metadata |= {"uid": f"uid-{index}", "labels": dict(metadata["labels"])}
    owner = metadata["ownerReferences"][0]
    metadata["ownerReferences"] = (
        [] if drawn["owner"] is None else [owner | {"uid": drawn["owner"]}]
    )
    match drawn["edited"]:
        case "label":
            del metadata["labels"][objects.LABEL_COMPONENT]
        case "dispose":
            spec["savepoint"]["disposeOnDelete"] = True
        case "path":
            spec["savepoint"]["path"] = image(sid + 1).path
        case "job":
            spec["jobReference"]["name"] = "other"
    metadata["finalizers"] = [snapshots.FINALIZER] if drawn["held"] else []
    if drawn["deleting"]:  # held by someone else's finalizer: it stays
        metadata["deletionTimestamp"] = "2027-01-15T08:00:00Z"
        metadata["finalizers"].append("example.com/backup")
    snapshot = Snapshot.from_body(body)
    status = {
        "right": snapshots.mirror_status("orders", registered),
        "none": {},
        "stale": snapshots.mirror_status("orders", dataclasses.replace(registered, batch_id=99)),
    }[drawn["status"]]
    return dataclasses.replace(snapshot, status=status)


def _carried_out(plan: snapshots.MirrorPlan, listed: list[Snapshot]) -> list[Snapshot]:
    """What the API server lists once the plan is carried out (a create over a name
    taken fails; a deleted object goes once it has no finalizer)."""
    let_go = {s.name for s in plan.let_go}
    ours = (snapshots.FINALIZER,)
    after = {
        s.name: dataclasses.replace(s, finalizers=tuple(set(s.finalizers) - set(ours)))
        if s.name in let_go
        else s
        for s in listed
    }
    for snapshot in plan.delete + plan.replace:
        after[snapshot.name] = dataclasses.replace(after[snapshot.name], deleting=True)
    after = {name: s for name, s in after.items() if not (s.deleting and not s.finalizers)}
    for snapshot, savepoint in plan.complete:
        status = snapshots.mirror_status("orders", savepoint)
        after[snapshot.name] = dataclasses.replace(snapshot, status=status)
    for savepoint in plan.create:
        body = snapshots.mirror(JOB_BODY, savepoint)
        if body["metadata"]["name"] not in after:
            made = Snapshot.from_body({**body, "metadata": {**body["metadata"], "uid": "new"}})
            status = snapshots.mirror_status("orders", savepoint)
            after[made.name] = dataclasses.replace(made, status=status)
    return list(after.values())


@settings(max_examples=300, deadline=None)
@given(
    enabled=st.booleans(),
    registered=st.dictionaries(st.integers(1, 5), st.booleans()),  # True: pinned
    objects=st.lists(_MIRROR_OBJECT, max_size=6, unique_by=lambda o: o["id"]),
)
def test_drawn_mirror_plans_make_the_objects_follow_the_registry(
    enabled: bool, registered: dict[int, bool], objects: list[dict[str, Any]]
) -> None:
    """`plan_mirrors` carried out until it asks nothing more, over drawn settings,
    registries and objects (edited or held ones too): the job's own mirrors are then
    exactly its savepoints no snapshot object keeps (none when turned off), each as
    `mirror` makes it, with its savepoint's status and no finalizer; an edited one is
    replaced; a name another object holds is said, never taken; no one else's object is
    ever touched."""
    savepoints = [
        dataclasses.replace(image(sid, label="nonce 1"), pinned=pinned)
        for sid, pinned in sorted(registered.items())
    ]
    listed = [_listed_mirror(i, o, savepoints) for i, o in enumerate(objects)]
    wanted = {
        snapshots.mirror_name("orders", sid): sid
        for sid, pinned in registered.items()
        if enabled and not pinned
    }
    others = {s.name for s in listed if s.owner != "job-uid"}

    def own(snapshot: Snapshot) -> bool:
        return snapshot.owner == "job-uid" and not snapshot.deleting

    for _ in range(4):  # an edited mirror: deleted, then made again; a held one let go first
        plan = snapshots.plan_mirrors(JOB_BODY, listed, savepoints, enabled=enabled)
        assert all(own(s) for s in plan.delete + plan.replace + [s for s, _ in plan.complete])
        assert all(s.name in wanted for s in plan.replace)  # edited: the rest are deleted
        assert all(s.owner == "job-uid" and s.held for s in plan.let_go)
        going = {s.name for s in listed if s.owner == "job-uid" and s.deleting}
        assert plan.blocked.keys() == wanted.keys() & others
        assert not {snapshots.mirror_name("orders", s.checkpoint_id) for s in plan.create} & (
            others | going
        )
        if not (plan.create or plan.complete or plan.delete or plan.replace or plan.let_go):
            break
        listed = _carried_out(plan, listed)
    assert not (plan.create or plan.complete or plan.delete or plan.replace or plan.let_go)
    mirrored = {s.name: s for s in listed if own(s)}
    going = {s.name for s in listed if s.owner == "job-uid" and s.deleting}  # someone holds it
    assert mirrored.keys() == wanted.keys() - others - going
    assert not any(s.held for s in listed if s.owner == "job-uid")
    for name, snapshot in mirrored.items():
        registered_image = image(wanted[name], label="nonce 1")
        assert snapshot.status == snapshots.mirror_status("orders", registered_image)
        made = snapshots.mirror(JOB_BODY, registered_image)
        assert snapshot.spec["savepoint"] == made["spec"]["savepoint"]
        assert snapshot.labels == made["metadata"]["labels"]


def test_a_mirror_is_the_jobs_object_under_a_mirrors_name_whatever_its_labels() -> None:
    """A label taken off a mirror would have made it an alreadyExists object of the user's,
    which pins its savepoint for ever; a mirror's YAML copied under another name (to keep
    the savepoint, as the docs say) would have been ignored, or deleted (reviewers')."""
    body = snapshots.mirror(JOB_BODY, image(7, label="nonce 2"))
    body["metadata"] |= {"uid": "m", "labels": {}}
    assert Snapshot.from_body(body).mirror
    for name in ("keep", "orders-savepoint-07", "orders-savepoint-", "other-savepoint-7"):
        copied = {**body, "metadata": {**body["metadata"], "name": name}}
        assert not Snapshot.from_body(copied).mirror, name
    unowned = {**body, "metadata": {**body["metadata"], "ownerReferences": []}}
    assert not Snapshot.from_body(unowned).mirror
    # A job whose name has "-savepoint-" in it: its mirrors, not another job's.
    owned = body["metadata"]["ownerReferences"][0]
    for owner, name, mirrors in [
        ("a-savepoint-1", "a-savepoint-1-savepoint-5", True),
        ("a", "a-savepoint-1-savepoint-5", False),
        ("a", "a-savepoint-1", True),
    ]:
        reference = {**owned, "name": owner}
        metadata = {**body["metadata"], "name": name, "ownerReferences": [reference]}
        assert Snapshot.from_body({**body, "metadata": metadata}).mirror is mirrors, (owner, name)
    keep = Snapshot.from_body({**body, "metadata": {**body["metadata"], "name": "keep"}})
    plan = snapshots.plan_mirrors(JOB_BODY, [keep], [image(7)], enabled=True)
    assert keep not in plan.delete + plan.replace and not plan.complete  # the user's


def test_a_mirror_is_never_taken_nor_pinned() -> None:
    """Its status is the controller's to write (`plan_mirrors`): an alreadyExists object
    otherwise, it would be pinned, and its savepoint kept past the history."""
    body = snapshots.mirror(JOB_BODY, image(7, label="nonce 2"))
    mirror = Snapshot.from_body({**body, "metadata": {**body["metadata"], "uid": "m"}})
    assert mirror.mirror and mirror.owner == "job-uid" and mirror.existing_path is not None

    decision = decide(mirror, JobView(JobPhase.RUNNING, existing=image(7)), START)

    assert (decision.status, decision.trigger, decision.pin) == ({}, False, None)
