"""The user guide's Flux health check (a Kustomization's `healthCheckExprs`), evaluated as
kustomize-controller evaluates it, on job objects whose status is the operator's own
rendering and on snapshot objects in every state the CRD lists.

What Flux does, from fluxcd/pkg runtime/cel (status_evaluator.go, expression.go, and
cli-utils' generic status reader): the expressions are parsed, not compiled against
declared variables, and evaluated with the object's top-level fields (`apiVersion`,
`kind`, `metadata`, `spec`, `status`) as the variables. First, an object whose
`status.observedGeneration` is an integer other than `metadata.generation` is InProgress;
then `inProgress`, `failed` and `current` are evaluated in that order, the first true one
decides, and none true is InProgress. An expression that cannot be evaluated (a missing
field or variable, a result that is no boolean) makes the status Unknown: Flux waits on.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.doc_blocks import ROOT, Block, marked_blocks
from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.manifest.cel_rules import cel
from spark_checkpoint_operator.status import Observed, render_status
from spark_checkpoint_operator.supervisor import JobRecord

MARKED = "tests/docs/test_flux_health.py::test_the_health_check"
GROUP = "sparkcheckpoint.io"
SNAPSHOT_CRD = ROOT / "crds/sparkcheckpointsnapshots.sparkcheckpoint.io.yaml"

# The `cel` package's evaluation errors (a missing key, an undefined variable, a bad type).
_CEL_ERRORS = (KeyError, RuntimeError, TypeError, ValueError)
# Flux's order (RFC 0009): the first expression that is true gives the status.
_ORDER = (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current"))

Health = Callable[[Mapping[str, Any]], str]


def _checks(block: Block) -> dict[str, dict[str, str]]:
    """The Kustomization's health check expressions, by the kind they are for."""
    (kustomization,) = [d for d in yaml.safe_load_all(block.text) if d is not None]
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["spec"]["wait"] is True
    checks = {}
    for check in kustomization["spec"]["healthCheckExprs"]:
        # Flux matches the group (and the kind, if given), never the version.
        assert check["apiVersion"].split("/")[0] == GROUP
        checks[check["kind"]] = check
    return checks


def _evaluated(check: Mapping[str, str]) -> Health:
    programs = [(cel.compile(check[key]), result) for key, result in _ORDER if key in check]
    assert "current" in check, "Flux requires `current`"

    def status(obj: Mapping[str, Any]) -> str:
        observed = obj.get("status", {}).get("observedGeneration")
        generation = obj["metadata"].get("generation")
        if isinstance(observed, int) and isinstance(generation, int) and observed != generation:
            return "InProgress"
        for program, result in programs:
            try:
                value = program.execute(dict(obj))
            except _CEL_ERRORS:
                return "Unknown"
            if not isinstance(value, bool):
                return "Unknown"
            if value:
                return result
        return "InProgress"

    return status


def _stored(value: Any) -> Any:
    # The operator's status patches remove a field set to None: the stored object has none.
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_stored(item) for item in value]
    return value


@pytest.fixture(scope="module")
def checks() -> dict[str, dict[str, str]]:
    (block,) = marked_blocks(MARKED)
    return _checks(block)


@pytest.fixture(scope="module")
def job_health(checks: dict[str, dict[str, str]]) -> Health:
    return _evaluated(checks["SparkCheckpointJob"])


@pytest.fixture(scope="module")
def snapshot_health(checks: dict[str, dict[str, str]]) -> Health:
    return _evaluated(checks["SparkCheckpointSnapshot"])


def _job(generation: int, record: JobRecord | None, observed: Observed | None = None) -> Any:
    job: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "orders", "generation": generation},
        "spec": {},
    }
    if record is not None:
        status = render_status(record, now=100.0, observed=observed or Observed())
        job["status"] = _stored(status)
    return job


# What the Argo CD check says, as Flux can: Healthy and Suspended are Current, Degraded is
# Failed, Progressing is InProgress (Cancelled, a job being deleted, too).
PHASES = {
    JobPhase.PENDING: "InProgress",
    JobPhase.DEPLOYING: "InProgress",
    JobPhase.RUNNING: "Current",
    JobPhase.RESTARTING: "InProgress",
    JobPhase.SUSPENDING: "InProgress",
    JobPhase.SUSPENDED: "Current",
    JobPhase.FINISHED: "Current",
    JobPhase.FAILED: "Failed",
    JobPhase.CANCELLED: "InProgress",
}


def test_every_phase_is_judged() -> None:
    assert set(PHASES) == set(JobPhase)


@pytest.mark.parametrize(("phase", "expected"), PHASES.items())
def test_the_health_check(phase: JobPhase, expected: str) -> None:
    # The literal: tests/docs/test_docs_run.py checks that this test reads its block.
    (block,) = marked_blocks("tests/docs/test_flux_health.py::test_the_health_check")
    job = _job(3, JobRecord(phase=phase), Observed(generation=3))

    assert _evaluated(_checks(block)["SparkCheckpointJob"])(job) == expected


def test_a_job_the_operator_has_not_written_is_unknown(job_health: Health) -> None:
    """No `status` to read: Flux cannot evaluate the expressions and waits on."""
    assert job_health(_job(1, None)) == "Unknown"


def test_a_spec_change_the_operator_has_not_seen_is_in_progress(
    checks: dict[str, dict[str, str]], job_health: Health
) -> None:
    running = JobRecord(phase=JobPhase.RUNNING)
    unseen = _job(5, running, Observed(generation=4))
    unknown_generation = _job(5, running)  # no observedGeneration written

    assert job_health(unseen) == "InProgress"
    assert job_health(unknown_generation) == "InProgress"
    # Flux checks the generation itself; the expression says so too, for a reader and for
    # a status without observedGeneration.
    assert cel.compile(checks["SparkCheckpointJob"]["inProgress"]).execute(unseen) is True


def test_a_refused_spec_is_failed_and_a_waiting_change_in_progress(job_health: Health) -> None:
    running = JobRecord(phase=JobPhase.RUNNING)
    refused = Observed(generation=2, spec_problem="spec.image: required on a cluster")
    upgrading = Observed(generation=2, pending_change=("UpgradePending", "savepoint in flight"))
    suspending = Observed(generation=2, pending_change=("SuspendPending", "savepoint in flight"))

    assert job_health(_job(2, running, refused)) == "Failed"
    assert job_health(_job(2, running, upgrading)) == "InProgress"
    assert job_health(_job(2, running, suspending)) == "InProgress"


def test_a_rolled_back_upgrade_is_failed(job_health: Health) -> None:
    """The stable spec runs, not the one in Git (`spec.rollback`): not Current."""
    running = JobRecord(phase=JobPhase.RUNNING)
    rolled_back = Observed(generation=2, pending_change=("RolledBack", "spec generation 2 ..."))

    assert job_health(_job(2, running, rolled_back)) == "Failed"


def _snapshot_states(crd: Path) -> list[str]:
    (document,) = [d for d in yaml.safe_load_all(crd.read_text()) if d is not None]
    (version,) = document["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return list(status["properties"]["state"]["enum"])


SNAPSHOT_STATES = {
    "TRIGGER_PENDING": "InProgress",
    "IN_PROGRESS": "InProgress",
    "COMPLETED": "Current",
    "FAILED": "Failed",
    "ABANDONED": "Failed",
}


def test_every_snapshot_state_the_crd_lists_is_judged(snapshot_health: Health) -> None:
    assert sorted(_snapshot_states(SNAPSHOT_CRD)) == sorted(SNAPSHOT_STATES)
    for state, expected in SNAPSHOT_STATES.items():
        snapshot = {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "SparkCheckpointSnapshot",
            "metadata": {"name": "orders-before-migration", "generation": 1},
            "spec": {"jobReference": {"name": "orders"}, "savepoint": {}},
            "status": {"state": state, "job": "orders", "kind": "savepoint", "failures": 0},
        }
        assert snapshot_health(snapshot) == expected, state


def test_a_snapshot_the_operator_has_not_written_is_unknown(snapshot_health: Health) -> None:
    snapshot = {"metadata": {"name": "s", "generation": 1}, "spec": {}}

    assert snapshot_health(snapshot) == "Unknown"
    assert snapshot_health(snapshot | {"status": {}}) == "InProgress"
