"""Validation of a changed job, ratcheted as the API server ratchets it (Kubernetes 1.30
on): a value a tightened rule refuses is tolerated while it is unchanged from the stored
job, whatever else changes; the value changed, it is refused as in a new job. The operator
(tests/kubernetes/test_operator_simulated.py) and the emulated API server
(tests/kubernetes/test_invalid_specs.py) both check with ``validate_update``."""

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_checkpoint_operator.manifest.loading import manifest_from_update
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.manifest.validation import validate_document, validate_update

Document = dict[str, Any]


def _job(env: list[Document] | None = None, **checkpointing: Any) -> Document:
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "orders", "namespace": "default"},
        "spec": {
            "image": "example/orders:1",
            "application": {"mainFile": "local:///opt/app/orders.py", "env": env or []},
            "checkpointing": {"interval": "10s", "storage": "s3a://b/c", **checkpointing},
        },
    }


def _env(count: int) -> list[Document]:
    return [{"name": f"VAR_{index}", "value": str(index)} for index in range(count)]


# Rules tightened after jobs were stored: each breaks a valid job in its own way, and says
# how to change the refused value itself, with the field its problem names.
Violation = tuple[Callable[[Document], None], Callable[[Document], None], str]


def _reserved_name(index: int) -> Violation:
    def apply(document: Document) -> None:
        variables = _variables(document)
        reserved = {"name": "SPARK_CHECKPOINT_TOKEN", "value": "x"}
        variables.insert(min(index, len(variables)), reserved)

    def touch(document: Document) -> None:
        for variable in _variables(document):
            if variable["name"] == "SPARK_CHECKPOINT_TOKEN":
                variable["name"] = "POD_IP"

    return apply, touch, "spec.application.env"


def _savepoint_elsewhere(document: Document) -> None:
    document["spec"]["restore"] = {"initialSavepointPath": "s3a://b/savepoints/sp-4"}


def _moved_elsewhere(document: Document) -> None:
    document["spec"]["restore"]["initialSavepointPath"] = "s3a://b/default/orders/copy/sp-4"


def _storage_host(document: Document) -> None:
    document["spec"]["checkpointing"]["storage"] = "file://shared/checkpoints"


def _other_host(document: Document) -> None:
    document["spec"]["checkpointing"]["storage"] = "file://other/checkpoints"


def _variables(document: Document) -> list[Document]:
    variables: list[Document] = document["spec"]["application"]["env"]
    return variables


def _add_variable(document: Document, number: int) -> None:
    variables = _variables(document)
    if all(v["name"] != f"ADDED_{number}" for v in variables):
        variables.insert(number % (len(variables) + 1), {"name": f"ADDED_{number}", "value": "a"})


def _remove_variable(document: Document, number: int) -> None:
    valid = [v for v in _variables(document) if v["name"].startswith("VAR_")]
    if valid:
        _variables(document).remove(valid[number % len(valid)])


def _change_value(document: Document, number: int) -> None:
    variables = _variables(document)
    if variables:  # a refused variable's value too: its name is what the rule judges
        variables[number % len(variables)]["value"] = f"changed {number}"


# Edits that change no refused value, whatever else they change.
EDITS: dict[str, Callable[[Document, int], None]] = {
    "nonce": lambda d, n: d["spec"].__setitem__("checkpointTriggerNonce", n),
    "interval": lambda d, n: d["spec"]["checkpointing"].__setitem__("interval", f"{n + 1}s"),
    "image": lambda d, n: d["spec"].__setitem__("image", f"example/orders:{n}"),
    "add variable": _add_variable,
    "remove variable": _remove_variable,
    "change a value": _change_value,
    "reorder variables": lambda d, n: _variables(d).reverse(),
    "sparkConf": lambda d, n: d["spec"]["application"].__setitem__(
        "sparkConf", {"spark.sql.shuffle.partitions": str(n + 1)}
    ),
}


@settings(max_examples=200, deadline=None)
@given(
    variables=st.integers(min_value=0, max_value=5),
    violation=st.one_of(
        st.integers(min_value=0, max_value=6).map(_reserved_name),
        st.just((_storage_host, _other_host, "spec.checkpointing.storage")),
        st.just((_savepoint_elsewhere, _moved_elsewhere, "spec.restore.initialSavepointPath")),
    ),
    edits=st.lists(
        st.tuples(st.sampled_from(sorted(EDITS)), st.integers(min_value=0, max_value=50)),
        max_size=4,
    ),
    touched=st.booleans(),
)
def test_a_refused_value_is_tolerated_exactly_while_it_is_unchanged(
    variables: int,
    violation: Violation,
    edits: list[tuple[str, int]],
    touched: bool,
) -> None:
    apply, touch, field = violation
    stored = _job(_env(variables))
    apply(stored)
    changed = copy.deepcopy(stored)
    for edit, number in edits:
        EDITS[edit](changed, number)
    if touched:
        touch(changed)
    with pytest.raises(ManifestError) as strict:
        validate_document(changed)
    assert field in str(strict.value), "the rule refuses the value in a new job"

    if touched:
        with pytest.raises(ManifestError) as refused:
            validate_update(changed, stored)
        assert field in str(refused.value)
        return
    defaulted, tolerated = validate_update(changed, stored)
    assert tolerated == strict.value.problems
    assert defaulted["spec"]["image"] == changed["spec"]["image"]


def test_a_list_over_its_bound_is_tolerated_only_while_the_whole_list_is_unchanged() -> None:
    stored = _job(_env(1001))
    nonce = copy.deepcopy(stored)
    nonce["spec"]["checkpointTriggerNonce"] = 1
    _, tolerated = validate_update(nonce, stored)
    assert [p.path for p in tolerated] == ["spec.application.env"]

    one_value = copy.deepcopy(stored)
    one_value["spec"]["application"]["env"][3]["value"] = "changed"
    with pytest.raises(ManifestError, match=r"spec\.application\.env: has 1001 items"):
        validate_update(one_value, stored)


def test_a_rule_on_an_object_is_judged_again_when_any_of_its_fields_changes() -> None:
    """A CEL rule judges its object: the API server ratchets it only while the whole
    object is unchanged, whichever field the rule's message names."""
    stored = _job()
    stored["spec"]["checkpointing"] |= {"interval": "10s", "minPause": "1m"}
    with pytest.raises(ManifestError, match="minPause"):
        validate_document(stored)
    elsewhere = copy.deepcopy(stored)
    elsewhere["spec"]["image"] = "example/orders:2"
    assert validate_update(elsewhere, stored)[1]
    same_object = copy.deepcopy(stored)
    same_object["spec"]["checkpointing"]["retained"] = 3
    with pytest.raises(ManifestError, match="minPause"):
        validate_update(same_object, stored)


def test_values_are_compared_as_json_values() -> None:
    """``true`` is not ``1``: a changed type is a change."""
    stored = _job()
    stored["spec"]["checkpointing"]["retained"] = 0
    changed = copy.deepcopy(stored)
    changed["spec"]["checkpointing"]["retained"] = False
    with pytest.raises(ManifestError, match="retained"):
        validate_update(changed, stored)


def test_without_a_previous_job_nothing_is_tolerated() -> None:
    job = _job()
    _reserved_name(0)[0](job)
    with pytest.raises(ManifestError, match=r"reserved: SPARK_CHECKPOINT_\*"):
        validate_update(job, None)
    manifest, tolerated = manifest_from_update(job, job)
    assert [v.name for v in manifest.spec.application.env] == ["SPARK_CHECKPOINT_TOKEN"]
    assert len(tolerated) == 1


def test_the_api_server_ratchets_a_values_shape_but_the_operator_cannot_run_it() -> None:
    """An enum value a newer CRD dropped, a duration of a form it no longer takes: the
    API server keeps them while unchanged; the manifest is read on the schema's word, so
    the operator refuses such a job rather than misread it ("1d" is no duration it knows)."""
    for section, field, value in [
        ("spec", "imagePullPolicy", "Sometimes"),
        ("restartPolicy", "backoff", "1d"),
    ]:
        stored = _job()
        target = stored["spec"] if section == "spec" else stored["spec"].setdefault(section, {})
        target[field] = value
        changed = copy.deepcopy(stored)
        changed["spec"]["checkpointTriggerNonce"] = 1
        assert validate_update(changed, stored)[1], field
        with pytest.raises(ManifestError, match=field):
            manifest_from_update(changed, stored)


def test_an_unknown_field_is_never_tolerated() -> None:
    """The API server prunes unknown fields: one in a spec means the operator is older
    than its CRD, and would drop the setting without a word."""
    stored = _job(compression="zstd")
    changed = copy.deepcopy(stored)
    changed["spec"]["image"] = "example/orders:2"
    with pytest.raises(ManifestError, match=r"compression: unknown field"):
        validate_update(changed, stored)


def test_a_rule_that_cannot_evaluate_a_tolerated_value_of_a_changed_object_refuses_it() -> None:
    stored = _job()
    stored["spec"]["restartPolicy"] = {"backoff": "1d"}
    changed = copy.deepcopy(stored)
    changed["spec"]["restartPolicy"]["maxBackoff"] = "1s"
    with pytest.raises(ManifestError, match=r"spec\.restartPolicy: rule .* failed"):
        validate_update(changed, stored)


def test_duplicate_keys_are_not_checked_where_the_stored_list_had_duplicates() -> None:
    stored = _job([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])
    added = copy.deepcopy(stored)
    _add_variable(added, 7)
    assert [p.path for p in validate_update(added, stored)[1]] == ["spec.application.env[2]"]
    fresh = _job([{"name": "B", "value": "1"}])
    with pytest.raises(ManifestError, match="duplicate entry"):
        validate_update(stored, fresh)


def test_settings_the_coordinator_cannot_run_with_are_refused() -> None:
    """A rule tightened on settings the coordinator checks itself: tolerated by the API
    server, refused by the operator, naming the setting."""
    stored = _job(minPause="1h")  # the CRD's rule: minPause below interval
    changed = copy.deepcopy(stored)
    changed["spec"]["image"] = "example/orders:2"
    assert validate_update(changed, stored)[1]
    with pytest.raises(ManifestError) as refused:
        manifest_from_update(changed, stored)
    assert str(refused.value).splitlines()[-1] == (
        "<manifest>: cannot be run: checkpointing.minPause (3600.0) must not exceed "
        "checkpointing.interval (10.0)"
    )


@pytest.mark.parametrize(
    ("stored_value", "field"),
    [
        ({"retained": "3"}, "retained"),  # type
        ({"retained": 0}, "retained"),  # minimum
        ({"maxConcurrent": 99}, "maxConcurrent"),  # maximum
    ],
    ids=["type", "minimum", "maximum"],
)
def test_the_operator_refuses_tolerated_values_of_another_type_or_out_of_bounds(
    stored_value: Document, field: str
) -> None:
    stored = _job(**stored_value)
    changed = copy.deepcopy(stored)
    changed["spec"]["checkpointTriggerNonce"] = 1
    assert validate_update(changed, stored)[1]
    with pytest.raises(ManifestError, match=field):
        manifest_from_update(changed, stored)


def test_the_operator_refuses_a_tolerated_missing_required_field() -> None:
    stored = _job([{"value": "a variable without a name"}])
    changed = copy.deepcopy(stored)
    changed["spec"]["checkpointTriggerNonce"] = 1
    assert [p.keyword for p in validate_update(changed, stored)[1]] == ["required"]
    with pytest.raises(ManifestError, match=r"env\[0\]\.name: required field is missing"):
        manifest_from_update(changed, stored)


@pytest.mark.parametrize(
    "tolerated",
    [
        # CEL problems (checked after the schema) and schema problems (names over 256
        # characters), more than the bound of 50 either way.
        [{"name": f"SPARK_CHECKPOINT_V{n}", "value": "x"} for n in range(2 * 51)],
        [{"name": f"V{n}_" + "x" * 300, "value": "x"} for n in range(60)],
    ],
    ids=["rules", "schema"],
)
def test_any_number_of_tolerated_problems_leaves_the_bound_to_the_refused_ones(
    tolerated: list[Document],
) -> None:
    stored = _job(tolerated)
    changed = copy.deepcopy(stored)
    changed["spec"]["checkpointTriggerNonce"] = 1
    assert len(validate_update(changed, stored)[1]) == len(tolerated)
    changed["spec"]["checkpointing"]["retained"] = 0
    with pytest.raises(ManifestError) as refused:
        validate_update(changed, stored)
    assert [str(p) for p in refused.value.problems] == [
        "spec.checkpointing.retained: 0 is less than the minimum of 1"
    ]


def test_duplicate_keys_anywhere_in_the_stored_job_lift_the_check_everywhere() -> None:
    """kube-apiserver validates list maps of an update only when the stored object had no
    duplicate keys at all."""
    stored = _job([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])
    changed = copy.deepcopy(stored)
    changed["spec"]["driver"] = {"env": [{"name": "B", "value": "1"}, {"name": "B", "value": "2"}]}
    assert [p.path for p in validate_update(changed, stored)[1]] == [
        "spec.application.env[1]",
        "spec.driver.env[1]",
    ]
