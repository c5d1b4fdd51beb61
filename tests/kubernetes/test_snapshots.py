"""`snapshots.decide`: a SparkCheckpointSnapshot's next status from what its job's controller
observes, drawn as sequences of job phases, failures and completions with drawn backoff
limits."""

import asyncio
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
from spark_checkpoint_operator.kubernetes import snapshots
from spark_checkpoint_operator.kubernetes.controller import note_missing_job, write_snapshot_status
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


def test_a_missing_job_is_waited_for_unless_the_snapshot_was_in_flight() -> None:
    assert snapshots.for_missing_job(snapshot())["message"] == (
        "waits for SparkCheckpointJob orders, which does not exist"
    )
    gone = snapshots.for_missing_job(snapshot({"state": "IN_PROGRESS", "id": 3}))
    assert gone["state"] == "ABANDONED" and gone["error"] == "SparkCheckpointJob orders was deleted"
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
    assert snapshots.answer("CheckpointFailed", FailureReason.EXPIRED) is Answer.FAILED
    assert (
        snapshots.answer("RequestDeclined", FailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING)
        is Answer.FAILED
    )
    assert snapshots.answer("SavepointCompleted", None) is None
