"""The user guide's Argo CD health check, run as Argo CD runs it (Lua 5.1, the language of
its gopher-lua) on job objects whose status is the operator's own rendering."""

from collections.abc import Callable, Mapping
from typing import Any

import lupa.lua51
import pytest
import yaml

from helpers.doc_blocks import ROOT, Block, marked_blocks
from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.status import Observed, render_status
from spark_checkpoint_operator.supervisor import JobRecord

HEALTH_KEY = "resource.customizations.health.sparkcheckpoint.io_SparkCheckpointJob"

Health = Callable[[Mapping[str, Any]], tuple[str, str]]


MARKED = "tests/docs/test_argocd_health.py::test_the_health_check"


def _compiled(block: Block, key: str = HEALTH_KEY) -> Health:
    script = yaml.safe_load(block.text)[key]
    lua = lupa.lua51.LuaRuntime()
    check = lua.eval(f"function(obj)\n{script}\nend")

    def run(job: Mapping[str, Any]) -> tuple[str, str]:
        answer = check(lua.table_from(job, recursive=True))
        return str(answer["status"]), str(answer["message"])

    return run


@pytest.fixture(scope="module")
def health() -> Health:
    (block,) = marked_blocks(MARKED)
    return _compiled(block)


def _job(generation: int, record: JobRecord | None, observed: Observed | None = None) -> Any:
    job: dict[str, Any] = {"metadata": {"name": "orders", "generation": generation}}
    if record is not None:
        job["status"] = render_status(record, now=100.0, observed=observed or Observed())
    return job


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (JobPhase.PENDING, "Progressing"),
        (JobPhase.DEPLOYING, "Progressing"),
        (JobPhase.RUNNING, "Healthy"),
        (JobPhase.RESTARTING, "Progressing"),
        (JobPhase.SUSPENDING, "Progressing"),
        (JobPhase.SUSPENDED, "Suspended"),
        (JobPhase.FINISHED, "Healthy"),
        (JobPhase.FAILED, "Degraded"),
    ],
)
def test_the_health_check(phase: JobPhase, expected: str) -> None:
    # The literal: tests/docs/test_docs_run.py checks that this test reads its block.
    (block,) = marked_blocks("tests/docs/test_argocd_health.py::test_the_health_check")
    job = _job(3, JobRecord(phase=phase), Observed(generation=3))

    assert _compiled(block)(job)[0] == expected


def test_a_job_the_operator_has_not_written_is_progressing(health: Health) -> None:
    assert health(_job(1, None)) == ("Progressing", "waiting for the operator")


def test_a_spec_change_the_operator_has_not_seen_is_progressing(health: Health) -> None:
    """It said Healthy from the status of the spec before (a platform reviewer's): a sync
    wave or `argocd app wait --health` went on before the operator had read the change."""
    job = _job(5, JobRecord(phase=JobPhase.RUNNING), Observed(generation=4))

    assert health(job) == ("Progressing", "the operator has not read spec generation 5 yet")


def test_a_refused_spec_is_degraded_and_a_waiting_upgrade_progressing(health: Health) -> None:
    running = JobRecord(phase=JobPhase.RUNNING)
    refused = Observed(generation=2, spec_problem="spec.image: required on a cluster")
    upgrading = Observed(generation=2, pending_change=("UpgradePending", "savepoint in flight"))

    assert health(_job(2, running, refused)) == ("Degraded", "spec.image: required on a cluster")
    assert health(_job(2, running, upgrading)) == ("Progressing", "savepoint in flight")


def test_a_rolled_back_upgrade_is_degraded(health: Health) -> None:
    """The stable spec runs, not the one in Git (`spec.rollback`): not Healthy."""
    running = JobRecord(phase=JobPhase.RUNNING)
    rolled_back = Observed(generation=2, pending_change=("RolledBack", "spec generation 2 ..."))

    assert health(_job(2, running, rolled_back)) == ("Degraded", "spec generation 2 ...")


def test_the_message_is_the_status_message_or_the_phase(health: Health) -> None:
    failed = JobRecord(phase=JobPhase.FAILED, message="driver failed (exit 1)")

    assert health(_job(1, failed, Observed(generation=1))) == (
        "Degraded",
        "driver failed (exit 1)",
    )
    assert health(_job(1, JobRecord(phase=JobPhase.RUNNING), Observed(generation=1))) == (
        "Healthy",
        "Running",
    )


SNAPSHOT_KEY = "resource.customizations.health.sparkcheckpoint.io_SparkCheckpointSnapshot"
SNAPSHOT_CRD = ROOT / "crds/sparkcheckpointsnapshots.sparkcheckpoint.io.yaml"

# Each state the snapshot CRD lists, with the status the operator writes in it (operator
# kubernetes/snapshots.py) and what the check says of it.
SNAPSHOT_STATES: dict[str, tuple[dict[str, Any], tuple[str, str]]] = {
    "TRIGGER_PENDING": (
        {"message": "waits for the job to run (phase Suspended)"},
        ("Progressing", "waits for the job to run (phase Suspended)"),
    ),
    "IN_PROGRESS": ({"triggerTimestamp": "2025-01-01T00:00:00Z"}, ("Progressing", "IN_PROGRESS")),
    "COMPLETED": (
        {"id": 7, "path": "s3://bucket/orders/savepoints/sp-7/_metadata"},
        ("Healthy", "s3://bucket/orders/savepoints/sp-7/_metadata"),
    ),
    "FAILED": (
        {
            "failures": 3,
            "error": "Expired: the checkpoint timed out",
            "message": "failed 3 time(s), spec.backoffLimit 2: not taken again",
        },
        ("Degraded", "Expired: the checkpoint timed out"),
    ),
    "ABANDONED": (
        {
            "error": "the job is Finished: nothing runs to take it",
            "message": "the job is Finished: nothing runs to take it",
        },
        ("Degraded", "the job is Finished: nothing runs to take it"),
    ),
}


def _snapshot_states() -> list[str]:
    (document,) = [d for d in yaml.safe_load_all(SNAPSHOT_CRD.read_text()) if d is not None]
    (version,) = document["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return list(status["properties"]["state"]["enum"])


def _snapshot(status: Mapping[str, Any] | None) -> dict[str, Any]:
    snapshot: dict[str, Any] = {
        "metadata": {"name": "orders-before-migration", "generation": 1},
        "spec": {"jobReference": {"name": "orders"}, "savepoint": {}},
    }
    if status is not None:
        snapshot["status"] = dict(status)
    return snapshot


def test_the_snapshot_health_check() -> None:
    # The literal: tests/docs/test_docs_run.py checks that this test reads its block.
    (block,) = marked_blocks("tests/docs/test_argocd_health.py::test_the_snapshot_health_check")
    check = _compiled(block, SNAPSHOT_KEY)

    # A state the CRD adds fails here until the check and this table say what it is.
    assert sorted(_snapshot_states()) == sorted(SNAPSHOT_STATES)
    for state, (fields, expected) in SNAPSHOT_STATES.items():
        status = {"state": state, "job": "orders", "kind": "savepoint", "failures": 0} | fields
        assert check(_snapshot(status)) == expected, state
    assert check(_snapshot(None)) == ("Progressing", "waiting for the operator")
    assert check(_snapshot({})) == ("Progressing", "waiting for the operator")
