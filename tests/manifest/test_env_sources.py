"""Environment variables from a Secret (`valueFrom.secretKeyRef`): validated as the API
server validates them, one line naming the field."""

from typing import Any

import pytest

from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.model import EnvVar, SecretKeyRef
from spark_checkpoint_operator.manifest.problems import ManifestError


def _with_env(minimal: dict[str, Any], variable: dict[str, Any]) -> dict[str, Any]:
    minimal["spec"]["executor"] = {"env": [variable]}
    return minimal


def test_a_secret_reference_is_read_into_the_model(minimal: dict[str, Any]) -> None:
    reference = {"secretKeyRef": {"name": "s3-creds", "key": "secret.key_1"}}
    manifest = manifest_from_document(_with_env(minimal, {"name": "K", "valueFrom": reference}))

    assert manifest.spec.executor.env == (
        EnvVar("K", "", SecretKeyRef("s3-creds", "secret.key_1")),
    )


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
