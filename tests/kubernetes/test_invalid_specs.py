"""Specs the API server rejects (schema and CEL rules of the CRD, as the emulator enforces
them with the same validator `spark-checkpoint run` uses), each with a message that names
the field; and a change to an existing job that is rejected leaves the stored job as it was.

Specs only a cluster rejects (no image, no storage) are accepted by the API server and
reported by the operator as a condition: tests/kubernetes/test_operator_simulated.py.
"""

import copy
from collections.abc import Iterator
from typing import Any

import kmock
import pytest

from helpers.kube.cluster import JOBS, MINIMAL_JOB
from helpers.kube.emulator import (
    SPARK_CHECKPOINT_JOBS_CRD,
    EmulatedApiServer,
    spark_checkpoint_api,
)

# (change to the spec, a field the message names, a phrase of the message)
INVALID_SPECS = [
    ({"checkpointing": {"minPause": "1m"}}, "spec.checkpointing", "minPause"),
    ({"checkpointing": {"timeout": "0s"}}, "spec.checkpointing", "timeout"),
    ({"checkpointing": {"interval": "5ms"}}, "spec.checkpointing", "interval"),  # 0s: none
    ({"checkpointing": {"retained": 0}}, "spec.checkpointing.retained", "minimum"),
    ({"checkpointing": {"maxConcurrent": 0}}, "spec.checkpointing.maxConcurrent", "minimum"),
    # The driver runs it with python, which fetches nothing: it was "no such file".
    ({"application": {"mainFile": "s3a://b/x.py"}}, "spec.application.mainFile", "local://"),
    # fsspec resolves it, and nothing is kept once the driver's process ends.
    (
        {"checkpointing": {"storage": "memory://checkpoints"}},
        "spec.checkpointing.storage",
        "outlives",
    ),
    (
        {"restore": {"initialSavepointPath": "http://host/default/orders/chk-1"}},
        "spec.restore.initialSavepointPath",
        "outlives",
    ),
    ({"checkpointing": {"interval": "ten seconds"}}, "spec.checkpointing.interval", "duration"),
    ({"checkpointing": {"retentionPolicy": "Sometimes"}}, "retentionPolicy", "one of"),
    ({"application": {"mainFile": "a.py", "module": "a"}}, "spec.application", "exactly one"),
    ({"application": {}}, "spec.application", "exactly one"),
    (
        {
            "application": {
                "mainFile": "a.py",
                "sparkConf": {"spark.sql.streaming.checkpointLocation": "/x"},
            }
        },
        "spec.application.sparkConf",
        "checkpointLocation",
    ),
    ({"restartPolicy": {"type": "Sometimes"}}, "spec.restartPolicy.type", "one of"),
    ({"restartPolicy": {"backoff": "10m", "maxBackoff": "1m"}}, "spec.restartPolicy", "backoff"),
    (
        {"restartPolicy": {"heartbeatTimeout": "0s"}},
        "spec.restartPolicy.heartbeatTimeout",
        "must be positive",
    ),
    (
        {"restartPolicy": {"startTimeout": "0s"}},
        "spec.restartPolicy.startTimeout",
        "must be positive",
    ),
    (
        {"rollback": {"enabled": True, "readinessTimeout": "0s"}},
        "spec.rollback.readinessTimeout",
        "must be positive",
    ),
    ({"rollback": {"enabled": "yes"}}, "spec.rollback.enabled", "boolean"),
    ({"savepoints": {"snapshotObjects": "true"}}, "spec.savepoints.snapshotObjects", "boolean"),
    ({"state": "Paused"}, "spec.state", "one of"),
    ({"executor": {"instances": -1}}, "spec.executor.instances", "minimum"),
    ({"driver": {"memory": "lots"}}, "spec.driver.memory", "memory size"),
    (
        {"restore": {"initialSavepointPath": "s3a://b/default/orders/checkpoints/4"}},
        "spec.restore.initialSavepointPath",
        "must name a savepoint or a retained checkpoint where it was written",
    ),
    (
        {"restore": {"initialSavepointPath": "s3a://b/savepoints/sp-4"}},  # no <ns>/<job>
        "spec.restore.initialSavepointPath",
        "must name a savepoint or a retained checkpoint where it was written",
    ),
    ({"savepoints": {"interval": "0s"}}, "spec.savepoints.interval", "greater than 0s"),
    ({"imagePullSecrets": [{"name": "Registry"}]}, "spec.imagePullSecrets[0].name", "DNS-1123"),
    ({"imagePullSecrets": [{}]}, "spec.imagePullSecrets[0].name", "required"),
    ({"podTemplate": {"kind": "Deployment"}}, "spec.podTemplate.kind", "one of"),
    (
        {"executor": {"podTemplate": {"apiVersion": "apps/v1"}}},
        "spec.executor.podTemplate.apiVersion",
        "one of",
    ),
    (
        {"restore": {"savepointRedeployNonce": 2}},
        "spec.restore.savepointRedeployNonce",
        "needs spec.restore.initialSavepointPath",
    ),
]


def _with(change: dict[str, Any]) -> dict[str, Any]:
    """MINIMAL_JOB with ``change``: merged into checkpointing, replacing anything else."""
    document = copy.deepcopy(MINIMAL_JOB)
    for key, value in change.items():
        if key == "checkpointing":
            document["spec"][key] = {**document["spec"][key], **value}
        else:
            document["spec"][key] = value
    return document


@pytest.fixture
def api() -> Iterator[EmulatedApiServer]:
    with spark_checkpoint_api() as server:
        yield server


@pytest.mark.parametrize(
    ("change", "field", "phrase"), INVALID_SPECS, ids=[str(c[0]) for c in INVALID_SPECS]
)
def test_an_invalid_spec_is_rejected_naming_its_field(
    api: EmulatedApiServer, change: dict[str, Any], field: str, phrase: str
) -> None:
    with pytest.raises(kmock.KubernetesError) as rejected:
        api.create(JOBS, _with(change), namespace="default")

    assert rejected.value.status == 422
    message = str(rejected.value.message)
    assert message.startswith('SparkCheckpointJob.sparkcheckpoint.io "orders" is invalid: ')
    assert api.list(JOBS, "default") == [], "nothing was stored"
    assert field in message and phrase.lower() in message.lower(), message


def test_a_rejected_change_leaves_the_job_as_it_was(api: EmulatedApiServer) -> None:
    created = api.create(JOBS, {**MINIMAL_JOB, "metadata": {"name": "kept"}}, namespace="default")

    with pytest.raises(kmock.KubernetesError) as rejected:
        api.patch(JOBS, "default", "kept", {"spec": {"checkpointing": {"minPause": "1h"}}})

    assert rejected.value.status == 422
    stored = api.get(JOBS, "default", "kept")
    assert stored["spec"] == created["spec"]
    assert stored["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_a_job_stored_under_an_earlier_crd_is_ratcheted(api: EmulatedApiServer) -> None:
    """A value a newer CRD's rule refuses stays writable while unchanged (Kubernetes 1.30
    on): the operator's status writes and changes elsewhere pass; a changed value does not."""
    reserved = {"name": "SPARK_CHECKPOINT_TOKEN", "value": "from an earlier CRD"}
    earlier = _with({"application": {"mainFile": "a.py", "env": [reserved]}})
    with pytest.raises(kmock.KubernetesError, match="SPARK_CHECKPOINT_"):
        api.create(JOBS, earlier, namespace="default")
    with api.validated_by(SPARK_CHECKPOINT_JOBS_CRD, lambda obj, stored: obj):
        api.create(JOBS, earlier, namespace="default")

    api.patch(JOBS, "default", "orders", {"status": {"phase": "Running"}}, subresource="status")
    api.patch(JOBS, "default", "orders", {"spec": {"checkpointTriggerNonce": 1}})
    added = {"name": "REGION", "value": "eu"}
    api.patch(JOBS, "default", "orders", {"spec": {"application": {"env": [added, reserved]}}})
    with pytest.raises(kmock.KubernetesError) as rejected:
        renamed = {**reserved, "name": "SPARK_CHECKPOINT_OTHER"}
        api.patch(JOBS, "default", "orders", {"spec": {"application": {"env": [renamed]}}})

    assert rejected.value.status == 422
    assert "spec.application.env[0].name" in str(rejected.value.message)
    stored = api.get(JOBS, "default", "orders")
    assert stored["spec"]["application"]["env"] == [added, reserved]
    assert stored["status"]["phase"] == "Running"


SNAPSHOTS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointsnapshots"
INVALID_SNAPSHOTS = [
    (
        {"savepoint": {"path": "/s/default/orders/savepoints/sp-1"}},
        "savepoint.path goes with alreadyExists",
    ),
    ({"savepoint": {"alreadyExists": True}}, "savepoint.path goes with alreadyExists"),
    (
        {"savepoint": {"alreadyExists": False, "path": "/s"}},
        "savepoint.path goes with alreadyExists",
    ),
    ({"savepoint": {}, "checkpoint": {}}, "exactly one of savepoint and checkpoint"),
    ({"savepoint": {"formatType": "NATIVE"}}, 'unknown field "spec.savepoint.formatType"'),
    # No job has such a name: it waited in TRIGGER_PENDING for ever (a newcomer's).
    ({"jobReference": {"name": "Bad_Name!"}, "savepoint": {}}, "spec.jobReference.name"),
]


@pytest.mark.parametrize(("spec", "phrase"), INVALID_SNAPSHOTS)
def test_an_invalid_snapshot_is_rejected(
    api: EmulatedApiServer, spec: dict[str, Any], phrase: str
) -> None:
    body = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointSnapshot",
        "metadata": {"name": "keep"},
        "spec": {"jobReference": {"name": "orders"}, **spec},
    }
    with pytest.raises(kmock.KubernetesError) as rejected:
        api.create(SNAPSHOTS, body, namespace="default")

    assert phrase in str(rejected.value.message), rejected.value.message
    assert api.list(SNAPSHOTS, "default") == []
