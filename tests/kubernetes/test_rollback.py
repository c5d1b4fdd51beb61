"""`rollback`: when an upgrade is rolled back to the last stable spec, what runs meanwhile,
and what of it is kept where, with the phases, times and timeouts drawn."""

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.kubernetes import objects, rollback
from spark_checkpoint_operator.kubernetes.controller import JobController, _spec_hash
from spark_checkpoint_operator.metrics import CheckpointMetrics, JobMetrics

SPEC = {
    "image": "example/orders:1",
    "application": {"mainFile": "local:///opt/app/orders.py"},
    "checkpointing": {"interval": "1s"},
}


@given(
    phase=st.sampled_from(JobPhase),
    message=st.sampled_from(["", "ImagePullBackOff: not found"]),
    started=st.floats(0, 1e9),
    timeout=st.floats(1e-3, 1e6),
    waited=st.floats(0, 2e6),
)
def test_an_upgrade_is_rolled_back_once_failed_or_out_of_time_unless_it_ran_or_ended(
    phase: JobPhase, message: str, started: float, timeout: float, waited: float
) -> None:
    why = rollback.rollback_reason(
        phase=phase, message=message, started=started, timeout=timeout, now=started + waited
    )
    # Running is ready; finished or cancelled, it ended otherwise.
    ended = (JobPhase.RUNNING, JobPhase.FINISHED, JobPhase.CANCELLED)
    due = phase is JobPhase.FAILED or (
        phase not in ended and (started + waited) - started >= timeout
    )
    assert (why is not None) == due
    if why is not None:
        assert message in why
        if phase is not JobPhase.FAILED:
            assert "spec.rollback.readinessTimeout" in why


def test_a_rolled_back_job_runs_the_stable_spec_under_the_written_state_and_nonces() -> None:
    stable = {**SPEC, "state": "Running", "savepointTriggerNonce": 1}
    written = {
        **SPEC,
        "image": "example/orders:2",
        "state": "Suspended",
        "savepointTriggerNonce": 7,
        "rollback": {"enabled": True, "readinessTimeout": "5m"},
    }
    assert rollback.spec_to_run(written, stable) == {
        **SPEC,
        "state": "Suspended",
        "savepointTriggerNonce": 7,
        "rollback": {"enabled": True, "readinessTimeout": "5m"},
    }
    # A nonce the written spec does not have is not taken from the stable one either.
    assert "checkpointTriggerNonce" not in rollback.spec_to_run(
        written, {**SPEC, "checkpointTriggerNonce": 3}
    )


def test_the_stable_spec_is_kept_without_what_the_written_spec_decides() -> None:
    spec = {**SPEC, "state": "Running", "checkpointTriggerNonce": 2, "rollback": {"enabled": True}}
    stable = rollback.StableSpec.of(spec)
    assert stable is not None
    assert stable.spec == SPEC
    assert rollback.StableSpec.from_annotation(stable.text) == stable
    # A change of what it is followed for is no change of the job: a failed job is not
    # run again for it, and a rolled-back job stays rolled back.
    assert _spec_hash(spec) == _spec_hash(SPEC)
    assert _spec_hash({**SPEC, "image": "example/orders:2"}) != _spec_hash(SPEC)


def test_a_stable_spec_too_long_to_keep_is_not_kept() -> None:
    long = {**SPEC, "application": {"arguments": ["x" * rollback.MAX_STABLE_SPEC_LENGTH]}}
    assert rollback.StableSpec.of(long) is None
    # Nor read from an annotation written by hand.
    assert rollback.StableSpec.from_annotation(json.dumps(long)) is None


def test_an_annotation_that_is_no_spec_is_no_stable_spec() -> None:
    for text in (None, 3, "", "[1]", "{", "[" * 100_000, '"text"'):
        assert rollback.StableSpec.from_annotation(text) is None, text


def test_the_rollback_annotation_is_read_as_written_and_anything_else_is_none() -> None:
    upgrade = rollback.RollbackState(upgrade=rollback.Upgrade("d1", 1_700_000_000.0))
    pending = rollback.RollbackState(upgrade=rollback.Upgrade("d1"))
    rolled_back = rollback.RollbackState(
        rolled_back=rollback.RolledBack(4, "abc", 1_700_000_000.0, "the job failed")
    )
    for state in (upgrade, pending, rolled_back):
        assert rollback.RollbackState.from_annotation(state.to_annotation()) == state
    assert rollback.RollbackState().to_annotation() is None
    written = json.loads(rolled_back.to_annotation() or "")
    garbled: list[Any] = [
        None,
        3,
        "",
        "x",
        "[]",
        "null",
        "{}",
        json.dumps({**written, "rolledBack": {**written["rolledBack"], "generation": "4"}}),
        json.dumps({**written, "rolledBack": {**written["rolledBack"], "time": "yesterday"}}),
        json.dumps({**written, "rolledBack": {**written["rolledBack"], "reason": None}}),
        json.dumps({**written, "upgrade": {"deploymentHash": 1}}),
        json.dumps({**written, "upgrade": {"deploymentHash": "d", "started": 5}}),
    ]
    for value in garbled:
        assert rollback.RollbackState.from_annotation(value) == rollback.RollbackState(), value


def test_a_rollback_goes_on_while_only_the_followed_fields_change() -> None:
    written = {**SPEC, "image": "example/orders:2"}
    followed = {
        **written,
        "state": "Suspended",
        "savepointTriggerNonce": 4,
        "restore": {"initialSavepointPath": "file:///s/default/orders/chk-3"},
        "rollback": {"enabled": True, "readinessTimeout": "1m"},
    }
    assert rollback.rolled_back_hash(followed) == rollback.rolled_back_hash(written)
    for changed in ({"restartNonce": 2}, {"checkpointing": {"interval": "2s"}}, {"image": "x"}):
        assert rollback.rolled_back_hash({**written, **changed}) != rollback.rolled_back_hash(
            written
        )


def test_a_value_back_to_what_the_watch_still_shows_is_written_too() -> None:
    """The watched job may not show the operator's last annotation write yet: an upgrade
    recorded and then ended (a suspension) must reach the annotation, which an operator
    restart goes on from (a pending upgrade left there was started at the resume, and a
    good job rolled back)."""
    patches: list[dict[str, Any]] = []

    async def patch(*arguments: Any, **_: Any) -> None:
        *_where, patched = arguments  # group, version, namespace, plural, name, body
        patches.append(patched["metadata"]["annotations"])

    clients: Any = SimpleNamespace(
        custom_objects=SimpleNamespace(patch_namespaced_custom_object=patch)
    )
    body = {"metadata": {"name": "orders", "namespace": "default", "uid": "u"}, "spec": SPEC}
    controller = JobController(
        clients,
        body,
        lambda *_: None,
        JobMetrics(CheckpointMetrics(CollectorRegistry()), "default", "orders"),
    )

    async def record_then_end() -> None:
        controller._rollback = rollback.RollbackState(upgrade=rollback.Upgrade("d2"))
        await controller._write_annotations()
        controller._rollback = rollback.RollbackState()  # the watch still shows none
        await controller._write_annotations()

    asyncio.run(record_then_end())

    assert patches == [
        {objects.ANNOTATION_ROLLBACK: '{"rolledBack":null,"upgrade":{"deploymentHash":"d2"}}'},
        {objects.ANNOTATION_ROLLBACK: None},
    ]
