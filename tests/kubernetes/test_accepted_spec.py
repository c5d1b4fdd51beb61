"""What the operator runs a job's driver under when the spec is invalid after a restart:
the spec it accepted before (status.lastAcceptedSpec), checked as a spec is, only what it
shares with the current spec ratcheted. A status can be written by others than the
operator, and an older operator wrote another layout: neither is run, nor crashes it.
tests/kubernetes/test_operator_simulated.py runs the operator through it."""

import copy
from typing import Any

from spark_checkpoint_operator.kubernetes.controller import (
    MAX_ACCEPTED_SPEC_LENGTH,
    TOLERATED_SHOWN,
    _stored_spec,
    _validated,
    accepted_spec_text,
)
from spark_checkpoint_operator.kubernetes.objects import deployment_hash

SPEC: dict[str, Any] = {
    "image": "example/orders:1",
    "application": {
        "mainFile": "local:///opt/app/orders.py",
        "sparkConf": {"spark.master": "local[2]"},
    },
    "checkpointing": {"interval": "10s", "storage": "s3a://b/c"},
}
RESERVED = {"name": "POD_IP", "value": "10.0.0.1"}


def _body(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "orders", "namespace": "default"}, "spec": spec}


def _invalid_current(spec: dict[str, Any]) -> dict[str, Any]:
    current = copy.deepcopy(spec)
    del current["image"]  # only the operator refuses it
    return current


def test_a_stored_spec_sharing_a_tightened_value_with_the_current_one_is_run() -> None:
    stored = copy.deepcopy(SPEC)
    stored["application"]["env"] = [RESERVED]
    manifest, problem, _ = _validated(_body(stored), _invalid_current(stored), None)
    assert problem is None and manifest is not None
    assert [v.name for v in manifest.spec.application.env] == ["POD_IP"]


def test_a_stored_spec_with_a_refused_value_the_current_one_lacks_is_not_run() -> None:
    stored = copy.deepcopy(SPEC)
    stored["application"]["env"] = [RESERVED]
    manifest, problem, _ = _validated(_body(stored), _invalid_current(SPEC), None)
    assert manifest is None
    assert problem is not None and problem.startswith("spec.application.env[0].name: is set")


def test_a_stored_spec_of_another_layout_is_a_problem_not_a_crash() -> None:
    older = {"image": "example/orders:1", "mainFile": "orders.py"}
    manifest, problem, _ = _validated(_body(older), _invalid_current(SPEC), None)
    assert manifest is None
    assert problem is not None and "spec.application: required field is missing" in problem


def test_a_status_field_that_is_no_spec_is_none() -> None:
    nested = "[" * 100_000 + "]" * 100_000  # past the JSON parser's recursion
    for text in (nested, "{", "[1]", 7, None, '"spec"'):
        assert _stored_spec(text) is None
    assert _stored_spec('{"image":"x"}') == {"image": "x"}


def test_the_stored_spec_is_compact_json_and_none_above_its_bound() -> None:
    assert accepted_spec_text({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    big = {"image": "x" * MAX_ACCEPTED_SPEC_LENGTH}
    assert accepted_spec_text(big) is None
    just = {"image": "x" * (MAX_ACCEPTED_SPEC_LENGTH - len('{"image":""}'))}
    assert accepted_spec_text(just) is not None


def test_a_condition_names_the_first_tolerated_problems_and_counts_the_rest() -> None:
    """A job may run with thousands of values a newer rule refuses: the condition, repeated
    in every status write, stays small."""
    spec = copy.deepcopy(SPEC)
    reserved = [{"name": f"SPARK_CHECKPOINT_{n}", "value": "x"} for n in range(7)]
    spec["application"]["env"] = reserved
    manifest, problem, kept = _validated(_body(spec), spec, None)
    assert manifest is not None and problem is None and kept is not None
    assert kept.count("is set by the operator itself") == TOLERATED_SHOWN
    assert f"; and {7 - TOLERATED_SHOWN} more (refused by this operator" in kept


def test_pod_problems_are_kept_only_for_a_driver_that_runs_with_those_pods() -> None:
    """What the API server would refuse in the pods is refused as the spec is read, so a
    running driver is not stopped for it. A driver that runs with such pods (an earlier
    operator let them in) goes on while its deployment is unchanged; a change of the
    deployment (a new image) would need a new driver, which cannot start: refused (a
    reviewer's: held problems let an image change through, and the job then failed)."""
    misspelt = {"name": "out", "persistentVolumeClam": {"claimName": "o"}}
    held = copy.deepcopy(SPEC) | {"driver": {"volumes": [misspelt]}}
    problem_text = (
        "spec.driver.volumes[0]: unknown field 'persistentVolumeClam' (did you mean "
        "persistentVolumeClaim?)"
    )
    running = deployment_hash(held)

    manifest, problem, kept = _validated(_body(held), held, running)
    assert manifest is not None and problem is None
    assert kept == (
        f"{problem_text} (the API server would refuse this in a new driver pod: the running "
        "driver goes on, and none is started until it is fixed)"
    )
    # A checkpoint setting is no change of the pods.
    tuned = copy.deepcopy(held)
    tuned["checkpointing"]["interval"] = "20s"
    manifest, problem, _ = _validated(_body(tuned), held, running)
    assert manifest is not None and problem is None

    for deployment in (None, deployment_hash(SPEC)):  # none runs, or one without them
        manifest, problem, kept = _validated(_body(held), held, deployment)
        assert (manifest, problem, kept) == (None, problem_text, None)
    upgraded = held | {"image": "example/orders:2"}
    manifest, problem, _ = _validated(_body(upgraded), held, running)
    assert (manifest, problem) == (None, problem_text)


def test_a_tolerated_value_and_a_pod_problem_are_told_apart() -> None:
    spec = copy.deepcopy(SPEC) | {
        "driver": {"volumes": [{"name": "x", "emptyDir": {"sizeLimit": "1GB"}}]}
    }
    spec["application"]["env"] = [RESERVED]

    _, problem, kept = _validated(_body(spec), spec, deployment_hash(spec))

    assert problem is None and kept is not None
    tolerated, pods = kept.split("); ")
    assert tolerated.startswith("spec.application.env[0].name: is set by the operator")
    assert tolerated.endswith("a change to these fields must fix them")
    assert pods.startswith("spec.driver.volumes[0].emptyDir.sizeLimit: '1GB' is not a quantity")
