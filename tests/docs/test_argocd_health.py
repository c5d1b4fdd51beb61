"""The user guide's Argo CD health check, run as Argo CD runs it (Lua 5.1, the language of
its gopher-lua) on job objects whose status is the operator's own rendering."""

from collections.abc import Callable, Mapping
from typing import Any

import lupa.lua51
import pytest
import yaml

from helpers.doc_blocks import Block, marked_blocks
from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.status import Observed, render_status
from spark_checkpoint_operator.supervisor import JobRecord

HEALTH_KEY = "resource.customizations.health.sparkcheckpoint.io_SparkCheckpointJob"

Health = Callable[[Mapping[str, Any]], tuple[str, str]]


MARKED = "tests/docs/test_argocd_health.py::test_the_health_check"


def _compiled(block: Block) -> Health:
    script = yaml.safe_load(block.text)[HEALTH_KEY]
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
