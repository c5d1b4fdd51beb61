"""The user guide's storage examples (section 5) deploy as written and reach their storage
from every pod that uses it.

Each example is a Secret and a SparkCheckpointJob. The test loads the job as the operator
does (the CRD's schema and rules, then what only a cluster needs), builds its driver,
cleanup and check pods and checks them against Kubernetes' schemas, and then gives each pod
the environment Kubernetes would give it, the Secret's keys included, in a process of its
own against a real protocol server (moto's S3 server, fake-gcs-server, Azurite):

- the executors' environment (the driver's Spark configuration: ``spark.executorEnv.*`` and
  ``spark.kubernetes.executor.secretKeyRef.*``) writes a batch's data object to the sink's
  output, as Spark's tasks do;
- the driver's commits that batch and stores a checkpoint file, with the storage settings
  the operator put in its environment;
- the cleanup pod's own command removes that file as garbage.

So a credential variable the libraries do not read, or one that does not reach a pod,
fails here. The server stands in for the cloud: S3's endpoint is added to each pod's
environment (``AWS_ENDPOINT_URL``), as is GCS's (``STORAGE_EMULATOR_HOST``), and Azure's
connection string replaces the Secret's value.
"""

import contextlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fsspec
import kubernetes_validate
import pytest
import yaml

from helpers.doc_blocks import Block, marked_blocks
from helpers.job_pods import job_pods
from helpers.objectstore import AzureServer, GCSServer, S3Server
from spark_checkpoint.sink import read_committed
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.controller import _validated
from spark_checkpoint_operator.manifest.loading import parse_manifest

KUBERNETES_VERSION = "1.30"
TIMEOUT_SECONDS = 120
ROW = {"order": "o-1", "count": 3}
ATTEMPT = "0" * 32

# What Spark's tasks do for one partition of batch 0 (TransactionalFileSink.write_batch).
EXECUTOR = """
import json, sys
from spark_checkpoint.sink_storage import write_partition
url, directory, row = sys.argv[1:]
print(json.dumps(write_partition(url, directory, 0, iter([row]))))
"""

# The sink's stage and commit of batch 0 (what write_batch does once its tasks returned,
# then on_checkpoint_complete), and one checkpoint file stored as the agent stores it.
DRIVER = """
import json, os, sys, tempfile
from spark_checkpoint.sink import STAGING_DIR, BatchRecord, TransactionalFileSink, batch_record_name
from spark_checkpoint.sink_storage import OutputStorage
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout

url, attempt, files = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
record = BatchRecord(0, attempt, tuple((path, size) for path, size in files))
OutputStorage(url).write(f"{STAGING_DIR}/{batch_record_name(0)}", record.to_json())
TransactionalFileSink(url).on_checkpoint_complete(0)
settings = [os.environ[f"SPARK_CHECKPOINT_{name}"] for name in ("STORAGE", "NAMESPACE", "JOB")]
storage = CheckpointStorage(JobStorageLayout(*settings))
with tempfile.NamedTemporaryFile() as state:
    state.write(b"state of partition 0")
    state.flush()
    print(storage.add_shared_file(state.name, "state/0/0/1.delta").location)
"""


def test_the_s3_example_reaches_its_storage_from_every_pod(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = marked_blocks(
        "tests/docs/test_storage_examples.py::test_the_s3_example_reaches_its_storage_from_every_pod"
    )
    # `spark-checkpoint run` takes the job from the block as it stands, Secret and all.
    assert parse_manifest(block.text, "job.yaml").name == "orders"
    server_environment = s3_server.environment()
    for name, value in server_environment.items():
        monkeypatch.setenv(name, value)
    _deploy_and_reach_storage(
        block,
        tmp_path,
        pod_extra={"AWS_ENDPOINT_URL": s3_server.endpoint},
        secret_values={},
    )


def test_the_gcs_example_reaches_its_storage_from_every_pod(
    gcs_server: GCSServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workload Identity gives no variable to check: the emulator takes requests without
    credentials. What makes it work is the service account each pod runs as."""
    (block,) = marked_blocks(
        "tests/docs/test_storage_examples.py::test_the_gcs_example_reaches_its_storage_from_every_pod"
    )
    for name, value in gcs_server.environment().items():
        monkeypatch.setenv(name, value)
    accounts = _deploy_and_reach_storage(
        block, tmp_path, pod_extra=gcs_server.environment(), secret_values={}
    )

    assert accounts == {
        "driver": "spark-driver",
        "cleanup": "spark-driver",
        "check": "spark-driver",
        "executor": "orders-executor",
    }
    (account,) = (d for d in yaml.safe_load_all(block.text) if d["kind"] == "ServiceAccount")
    assert account["metadata"] == {"name": "orders-executor", "namespace": "streaming"}


def test_the_azure_example_reaches_its_storage_from_every_pod(
    azure_server: AzureServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = marked_blocks(
        "tests/docs/test_storage_examples.py::"
        "test_the_azure_example_reaches_its_storage_from_every_pod"
    )
    connection_string = azure_server.environment()["AZURE_STORAGE_CONNECTION_STRING"]
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string)
    _deploy_and_reach_storage(
        block, tmp_path, pod_extra={}, secret_values={"connection-string": connection_string}
    )


def _deploy_and_reach_storage(
    block: Block, tmp_path: Path, pod_extra: Mapping[str, str], secret_values: Mapping[str, str]
) -> dict[str, str]:
    """Deploys the example and reaches its storage from each pod; the service account
    each kind of pod runs as."""
    documents = list(yaml.safe_load_all(block.text))
    secrets = {}
    for document in documents:
        if document["kind"] != "SparkCheckpointJob":
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        if document["kind"] == "Secret":
            data = document["stringData"]
            secrets[document["metadata"]["name"]] = {
                key: secret_values.get(key, value) for key, value in data.items()
            }
    (job,) = (d for d in documents if d["kind"] == "SparkCheckpointJob")
    job["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"
    manifest, problem, _ = _validated(job, None, None)
    assert manifest is not None, f"{block}: the operator refuses the job: {problem}"
    storage = manifest.spec.checkpointing.storage
    assert storage is not None
    arguments = list(manifest.spec.application.arguments)
    output = arguments[arguments.index("--output") + 1]

    pods = job_pods(manifest, job, storage=storage)
    driver, cleanup, check = pods["driver"], pods[objects.CLEANUP], pods[objects.CHECK]
    for pod in (driver, cleanup, check):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        for mount in pod["spec"]["containers"][0]["volumeMounts"]:
            assert mount["name"] in {v["name"] for v in pod["spec"]["volumes"]}

    base = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "HOME": str(tmp_path),  # no credentials file of this machine's user
        "AWS_EC2_METADATA_DISABLED": "true",  # a missing credential fails at once
        **pod_extra,
    }
    credentials = {v.name for v in manifest.spec.application.env}
    check_env = _pod_environment(check, secrets)
    assert credentials <= check_env.keys(), "the check pod has the credentials too"
    driver_env = {**base, **_pod_environment(driver, secrets)}
    executor_env = {**base, **_executor_environment(driver, secrets)}
    cleanup_env = {**base, **_pod_environment(cleanup, secrets)}

    with _emptied_afterwards(output, storage):
        directory = f"_data/batch-0/{ATTEMPT}"
        written = _run(
            "an executor", ["-c", EXECUTOR, output, directory, json.dumps(ROW)], executor_env
        )
        location = _run("the driver", ["-c", DRIVER, output, ATTEMPT, written], driver_env)
        command = cleanup["spec"]["containers"][0]["command"]
        assert command[0] == "python"
        removed = _run("the cleanup pod", command[1:], cleanup_env)

        assert read_committed(output) == {0: [ROW]}
        assert location.strip().startswith("shared/")
        assert removed.strip() == (
            "removed checkpoints [], savepoints [], 1 shared files, 0 unfinished uploads"
        )
    executor_account = _spark_settings(driver, secrets).get(
        "spark.kubernetes.authenticate.executor.serviceAccountName", "default"
    )
    return {
        "driver": driver["spec"]["serviceAccountName"],
        "cleanup": cleanup["spec"]["serviceAccountName"],
        "check": check["spec"]["serviceAccountName"],
        "executor": executor_account,
    }


def _pod_environment(
    pod: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The variables Kubernetes gives the pod's container: values, and Secrets' keys
    (the field references, such as the pod's IP, do not matter here)."""
    environment = {}
    for variable in pod["spec"]["containers"][0]["env"]:
        source = variable.get("valueFrom")
        if source is None:
            environment[variable["name"]] = variable["value"]
        elif "secretKeyRef" in source:
            reference = source["secretKeyRef"]
            environment[variable["name"]] = secrets[reference["name"]][reference["key"]]
    return environment


def _executor_environment(
    driver: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The variables Spark gives its executor pods, from the driver's configuration."""
    environment = {}
    for key, value in _spark_settings(driver, secrets).items():
        if key.startswith("spark.executorEnv."):
            environment[key.removeprefix("spark.executorEnv.")] = value
        elif key.startswith("spark.kubernetes.executor.secretKeyRef."):
            name, secret_key = value.split(":", 1)
            variable = key.removeprefix("spark.kubernetes.executor.secretKeyRef.")
            environment[variable] = secrets[name][secret_key]
    return environment


def _spark_settings(
    driver: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The driver's Spark configuration, as the operator gives it (``--conf`` options)."""
    words = shlex.split(_pod_environment(driver, secrets)["PYSPARK_SUBMIT_ARGS"])
    return dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "--conf")


def _run(who: str, arguments: list[str], environment: Mapping[str, str]) -> str:
    """This Python with ``arguments``, in a process of its own with only ``environment``."""
    result = subprocess.run(
        [sys.executable, *arguments],
        env=dict(environment),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, f"{who} exits {result.returncode}:\n{result.stderr}"
    return result.stdout


@contextlib.contextmanager
def _emptied_afterwards(*uris: str) -> Iterator[None]:
    """Creates the buckets or containers the URIs name (the examples expect them to exist);
    afterwards removes what the test wrote below the URIs, and what it created."""
    created = []
    for uri in uris:
        fs, path = fsspec.url_to_fs(uri, skip_instance_cache=True)
        bucket = path.split("/", 1)[0]
        if not fs.exists(bucket):
            fs.mkdir(bucket)
            created.append((fs, bucket))
    try:
        yield
    finally:
        for uri in uris:
            fs, path = fsspec.url_to_fs(uri, skip_instance_cache=True)
            if fs.exists(path):
                fs.rm(path, recursive=True)
        for fs, bucket in created:
            fs.rmdir(bucket)
