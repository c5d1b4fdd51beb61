"""The operator on a real Kubernetes cluster: ``pytest -m cluster`` with KUBECONFIG set.

Skipped unless KUBECONFIG names a reachable cluster. Needs, besides:

- ``SPARK_CHECKPOINT_TEST_IMAGE``: the Spark image (Dockerfile target ``spark``) with the
  word count at ``/opt/spark-checkpoint/examples/wordcount/pipeline.py``;
- ``SPARK_CHECKPOINT_TEST_STORAGE``: a storage URI the driver pods can write (for
  example ``s3a://bucket/ci``; credentials as the image's environment provides them);
- rights to create CRDs and namespaces (the suite installs the CRD and makes a namespace
  of its own, deleted at the end).

The operator runs on this machine (``spark-checkpoint-operator`` with the same KUBECONFIG),
so driver pods must be reachable from here at their pod IPs (a kind or minikube cluster on
this host, or a routable pod network).
"""

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import load_all_yaml
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import ConfigMap, Namespace
from lightkube.types import PatchType

from helpers.kube.cluster import OPERATOR_COMMAND

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
# Custom resources take no strategic merge patch (lightkube's default).
MERGE = PatchType.MERGE
INPUT = "wordcount-input"
OUTPUT = os.environ.get("SPARK_CHECKPOINT_TEST_OUTPUT", "/tmp/output")
PIPELINE = os.environ.get(
    "SPARK_CHECKPOINT_TEST_MAIN_FILE",
    "local:///opt/spark-checkpoint/examples/wordcount/pipeline.py",
)


def _reachable() -> str | None:
    """Why the suite cannot run here, or None."""
    if not os.environ.get("KUBECONFIG"):
        return "KUBECONFIG is not set"
    for variable in ("SPARK_CHECKPOINT_TEST_IMAGE", "SPARK_CHECKPOINT_TEST_STORAGE"):
        if not os.environ.get(variable):
            return f"{variable} is not set"
    try:
        Client().get(Namespace, "default")
    except Exception as error:  # any failure to reach it: report it as the skip reason
        return f"the cluster in KUBECONFIG is not reachable: {error}"
    return None


@pytest.fixture(scope="module")
def client() -> Any:
    if reason := _reachable():
        pytest.skip(reason)
    return Client(field_manager="spark-checkpoint-tests")


@pytest.fixture(scope="module")
def namespace(client: Any) -> Iterator[str]:
    for crd in (crd for path in CRDS for crd in load_all_yaml(path.read_text())):
        try:
            client.create(crd)
        except ApiError as error:
            if error.status.code != 409:
                raise
            current = client.get(CustomResourceDefinition, crd.metadata.name)
            crd.metadata.resourceVersion = current.metadata.resourceVersion
            client.replace(crd)
    name = f"scj-test-{uuid.uuid4().hex[:6]}"
    client.create(Namespace(metadata=ObjectMeta(name=name)))
    lines = "\n".join(json.dumps({"word": f"w{i % 7}", "n": 1}) for i in range(50))
    client.create(
        ConfigMap(
            metadata=ObjectMeta(name=INPUT, namespace=name),
            data={f"part-{i}.json": lines for i in range(3)},
        )
    )
    try:
        yield name
    finally:
        client.delete(Namespace, name)


@pytest.fixture(scope="module")
def operator(namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [OPERATOR_COMMAND, f"--namespace={namespace}"],
            stdout=output,
            stderr=subprocess.STDOUT,
            # No metrics endpoint: its default port may be another operator's on this host.
            env={**os.environ, "SPARK_CHECKPOINT_METRICS_PORT": "0"},
        )
    try:
        yield
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        process.kill()


def _jobs() -> Any:
    return create_namespaced_resource(
        "sparkcheckpoint.io", "v1alpha1", "SparkCheckpointJob", "sparkcheckpointjobs"
    )


def _job(name: str, namespace: str, **spec: Any) -> Any:
    """The word count in one pod (a local master) over input from a ConfigMap."""
    document = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": os.environ["SPARK_CHECKPOINT_TEST_IMAGE"],
            "application": {
                "mainFile": PIPELINE,
                "arguments": [
                    "--input",
                    "/opt/input",
                    "--output",
                    OUTPUT,
                    "--trigger-seconds",
                    "2",
                ],
                # As the example's manifest: Spark's default of 200 shuffle partitions
                # makes each batch and checkpoint of this small input cost many times more
                # (docs/user-guide.md), here in CPU the emulated run's suite shares.
                "sparkConf": {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "4"},
            },
            "driver": {
                "volumes": [{"name": "input", "configMap": {"name": INPUT}}],
                "volumeMounts": [{"name": "input", "mountPath": "/opt/input"}],
            },
            "checkpointing": {
                "interval": "10s",
                "storage": os.environ["SPARK_CHECKPOINT_TEST_STORAGE"],
            },
            **spec,
        },
    }
    return _jobs()(**yaml.safe_load(yaml.safe_dump(document)))


def _wait(what: str, condition: Callable[[], Any], timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_api_server_enforces_the_crd_rules(client: Any, namespace: str) -> None:
    invalid = _job("invalid", namespace, checkpointing={"interval": "10s", "minPause": "1m"})

    with pytest.raises(ApiError) as rejected:
        client.create(invalid)

    assert rejected.value.status.code == 422
    assert "minPause" in str(rejected.value.status.message)


def test_a_job_checkpoints_suspends_resumes_and_is_deleted(
    client: Any, namespace: str, operator: None
) -> None:
    jobs = _jobs()
    client.create(_job("wordcount", namespace))

    def status() -> dict[str, Any]:
        return dict(client.get(jobs, "wordcount", namespace=namespace).get("status") or {})

    _wait("2 checkpoints", lambda: status().get("counts", {}).get("completed", 0) >= 2)
    client.patch(
        jobs, "wordcount", {"spec": {"state": "Suspended"}}, namespace=namespace, patch_type=MERGE
    )
    suspended = _wait("Suspended", lambda: (s := status()).get("phase") == "Suspended" and s)
    assert suspended["lastSavepoint"]["label"] == "suspend"

    client.patch(
        jobs, "wordcount", {"spec": {"state": "Running"}}, namespace=namespace, patch_type=MERGE
    )
    _wait(
        "resumed",
        lambda: (status().get("restoredFrom") or {}).get("source", "").startswith("savepoint:"),
    )

    client.delete(jobs, "wordcount", namespace=namespace)

    def gone() -> bool:
        return not list(client.list(jobs, namespace=namespace))

    _wait("the job released by its finalizer", gone)
