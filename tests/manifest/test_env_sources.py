"""Environment variables from a Secret (`valueFrom.secretKeyRef`): validated as the API
server validates them, one line naming the field."""

from typing import Any

import pytest

from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.model import EnvVar, SecretKeyRef
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.manifest.validation import validate_document


def _with_env(minimal: dict[str, Any], variable: dict[str, Any]) -> dict[str, Any]:
    minimal["spec"]["executor"] = {"env": [variable]}
    return minimal


def test_a_secret_reference_is_read_into_the_model(minimal: dict[str, Any]) -> None:
    reference = {"secretKeyRef": {"name": "s3-creds", "key": "secret.key_1"}}
    manifest = manifest_from_document(_with_env(minimal, {"name": "K", "valueFrom": reference}))

    assert manifest.spec.executor.env == (
        EnvVar("K", "", SecretKeyRef("s3-creds", "secret.key_1")),
    )


def test_a_secret_reference_reads_back_as_it_was_applied(minimal: dict[str, Any]) -> None:
    # What the API server stores (its defaults filled in) is what a GitOps tool compares
    # with the manifest: an item of a list differs as a whole.
    reference = {"secretKeyRef": {"name": "s3-creds", "key": "secret.key_1"}}
    document = _with_env(minimal, {"name": "K", "valueFrom": reference})

    stored = validate_document(document)

    assert stored["spec"]["executor"]["env"] == [{"name": "K", "valueFrom": reference}]


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        (
            {"name": "K", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            "spec.executor.env[0]: value and valueFrom are exclusive",
        ),
        (
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "S3_creds", "key": "k"}}},
            "spec.executor.env[0].valueFrom.secretKeyRef.name: 'S3_creds' is not a DNS-1123",
        ),
        (
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a/b"}}},
            "spec.executor.env[0].valueFrom.secretKeyRef.key: 'a/b' is not a Secret key",
        ),
        (
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s"}}},
            "spec.executor.env[0].valueFrom.secretKeyRef.key: required",
        ),
        (
            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
            "spec.executor.env[0].valueFrom.configMapKeyRef: unknown field",
        ),
    ],
)
def test_a_bad_secret_reference_is_one_line_naming_the_field(
    minimal: dict[str, Any], variable: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ManifestError) as raised:
        manifest_from_document(_with_env(minimal, variable), "job.yaml")

    # One line per problem, each naming its field.
    lines = str(raised.value).splitlines()
    assert lines[0].startswith(f"job.yaml: {expected}"), lines
    assert all(line.startswith("job.yaml: spec.executor.env[0]") for line in lines), lines


RESERVED = (
    "is set by the operator itself (reserved: SPARK_CHECKPOINT_* variables, "
    "PYSPARK_SUBMIT_ARGS (set Spark options in sparkConf), PYSPARK_GATEWAY_PORT, "
    "PYSPARK_GATEWAY_SECRET, POD_NAME, POD_NAMESPACE and POD_IP)"
)


@pytest.mark.parametrize("role", ["application", "driver", "executor"])
@pytest.mark.parametrize(
    "name",
    [
        "SPARK_CHECKPOINT_STORAGE",
        "SPARK_CHECKPOINT_",
        "PYSPARK_SUBMIT_ARGS",
        "PYSPARK_GATEWAY_PORT",
        "POD_IP",
    ],
)
def test_a_variable_the_operator_sets_itself_is_refused_naming_it(
    minimal: dict[str, Any], role: str, name: str
) -> None:
    """The pods' own variables come after the manifest's: one of the same name would be
    replaced without a word (POD_IP would move the agent's address)."""
    minimal["spec"].setdefault(role, {})["env"] = [{"name": "KEPT"}, {"name": name}]
    with pytest.raises(ManifestError) as raised:
        manifest_from_document(minimal, "job.yaml")
    assert str(raised.value) == f"job.yaml: spec.{role}.env[1].name: {RESERVED}"


@pytest.mark.parametrize("name", ["SPARK_CHECKPOINT", "spark_checkpoint_storage", "POD_IPS"])
def test_a_variable_only_like_a_reserved_one_is_the_users(
    minimal: dict[str, Any], name: str
) -> None:
    manifest = manifest_from_document(_with_env(minimal, {"name": name, "value": "v"}))
    assert manifest.spec.executor.env == (EnvVar(name, "v", None),)


def test_an_env_list_is_bounded_and_says_so_in_one_line(minimal: dict[str, Any]) -> None:
    """The bound keeps the CEL rules' estimated cost within the API server's budget."""
    minimal["spec"]["application"]["env"] = [{"name": f"V{i}"} for i in range(1001)]
    with pytest.raises(ManifestError) as raised:
        manifest_from_document(minimal, "job.yaml")
    assert str(raised.value) == (
        "job.yaml: spec.application.env: has 1001 items; at most 1000 are allowed"
    )
