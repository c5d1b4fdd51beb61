"""The two images, built here and run as Kubernetes runs them.

Buildah builds both targets of the Dockerfile on the stand-in base (tests/helpers/containers.py),
and Podman runs them under the security contexts they get in a cluster: the chart's for the
operator image (user 10001, read-only root file system, every capability dropped, no
privilege escalation, an emptyDir on /tmp), the operator's own pods' for the spark image
(the image's user, every capability dropped, no privilege escalation), and the spark image
also as OpenShift's restricted-v2 runs it (an arbitrary uid in group 0 that has no passwd
entry, as on containerd). The smoke tests
(marker `images`: each image starts and answers) run in `make test`, on images cached
outside the clone; the slow ones (marker `containers`) after the rest in `make test`, and
alone in `make images-test`. They fail, never skip, where the tools are missing.
"""

import json
import shutil
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import containers
from helpers.doc_blocks import marked_blocks
from helpers.kube.cluster import LocalCluster, OperatorContainer
from helpers.kube.simulated import SimulatedAgents
from helpers.objectstore import storage_roots, with_credentials_set
from helpers.ports import free_port
from spark_checkpoint.janitor_commands import CollectGarbage
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.validation import validate_document

pytestmark = pytest.mark.timeout(3600)

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "manifest" / "fixtures" / "minimal-job.yaml"
GUIDE_JOB = ROOT / "examples" / "orders" / "job.yaml"
UID = 10001
# OpenShift's restricted-v2 runs a pod as a uid of its namespace's range (this is the first
# of a typical one) with that range's first id as fsGroup, and sets no runAsGroup: a runtime
# gives such a uid group 0. containerd adds no passwd entry for it (nor does the harness).
ARBITRARY_UID = 1000680000


def run_pod_container(
    image: str,
    pod_spec: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    volumes: Mapping[str, Path] | None = None,
) -> str:
    """Run the container as the kubelet would; its output, which must end with exit 0."""
    options, arguments = containers.pod_container_options(
        image, pod_spec, container, volumes=volumes or {}
    )
    result = containers.run(image, arguments, options=options)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def as_arbitrary_uid(
    pod_spec: Mapping[str, Any], container: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod and its container as OpenShift's restricted-v2 admits them: ARBITRARY_UID
    in the container's securityContext and as the pod's fsGroup, no runAsGroup."""
    context = {**pod_spec.get("securityContext", {}), "fsGroup": ARBITRARY_UID}
    container_context = {**container.get("securityContext", {}), "runAsUser": ARBITRARY_UID}
    return (
        {**pod_spec, "securityContext": context},
        {**container, "securityContext": container_context},
    )


def janitor_pod(*extra_arguments: str, storage: str = "file:///tmp") -> dict[str, Any]:
    """The cleanup pod the operator creates for a job to collect garbage in `storage`, as
    it creates it, with ``extra_arguments`` after its command line."""
    document = validate_document(yaml.safe_load(JOB.read_text()))
    manifest = manifest_from_document(document)
    document["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"  # the API server's
    command = CollectGarbage(checkpoints=(), savepoints=())
    pod = objects.cleanup_pod(
        manifest, document, storage=storage, command=command, user_ids=objects.UserIds.IMAGE
    )
    pod["spec"]["containers"][0]["command"] += list(extra_arguments)
    return pod


@pytest.mark.images
def test_the_images_run_as_their_numeric_non_root_user(images: dict[str, str]) -> None:
    for image in images.values():
        config = json.loads(containers.podman("image", "inspect", image))[0]["Config"]

        assert config["User"] == f"{UID}:{UID}"


@pytest.mark.images
def test_the_operator_image_answers_under_the_charts_security_context(
    images: dict[str, str],
) -> None:
    deployment = containers.chart_deployment({})
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The image's own entrypoint (the operator's command), asked for its usage.
    container = {key: value for key, value in container.items() if key not in {"command"}}

    output = run_pod_container(images["operator"], pod_spec, {**container, "args": ["--help"]})

    assert "Usage: spark-checkpoint-operator [OPTIONS]" in output
    assert "--all-namespaces" in output


@pytest.mark.images
def test_the_spark_image_runs_the_janitor_as_the_operator_starts_it(
    images: dict[str, str],
) -> None:
    pod = janitor_pod("--help")
    pod_spec = pod["spec"]
    (container,) = pod_spec["containers"]

    output = run_pod_container(images["spark"], pod_spec, container)

    assert "usage: python -m spark_checkpoint.janitor" in output
    assert "collect-garbage" in output


@pytest.mark.images
@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_the_spark_images_storage_clients_collect_garbage_on_each_object_store(
    images: dict[str, str],
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The image's s3fs, gcsfs and adlfs at their pins, with the credentials in the pod's
    environment: its cleanup pod removes a stored file no image references."""
    root = with_credentials_set(
        storage_roots(kind, tmp_path, lambda _kind: request.getfixturevalue(f"{kind}_server")),
        monkeypatch,
    )
    pod = janitor_pod(storage=root.url)
    (container,) = pod["spec"]["containers"]
    container["env"] += [{"name": name, "value": value} for name, value in root.environment.items()]
    namespace = pod["metadata"]["namespace"]
    storage = CheckpointStorage(JobStorageLayout(root.url, namespace, "word-count"))
    state = tmp_path / "1.delta"
    state.write_bytes(b"state of partition 0")
    stored = storage.add_shared_file(str(state), "state/0/0/1.delta")

    output = run_pod_container(images["spark"], pod["spec"], container)

    assert output.strip().splitlines()[-1] == (
        "removed checkpoints [], savepoints [], 1 shared files, 0 unfinished uploads"
    )
    assert not root.exists(storage.layout.location_path(stored.location))


@pytest.mark.images
@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "-c", "import spark_checkpoint, pyspark; print(pyspark.__version__)"], "4."),
        (["bash", "-c", '"$JAVA_HOME/bin/java" -version'], 'openjdk version "17.'),
        (["bash", "-c", "id -u; id -g; pwd; touch probe && echo writable"], "writable"),
    ],
    ids=["python-imports", "java", "working-directory"],
)
def test_the_spark_image_runs_python_java_and_writes_its_working_directory(
    images: dict[str, str], command: list[str], expected: str
) -> None:
    """The operator's pods' security context (the image's user, no capabilities): Python
    finds both packages and Java 17 runs, even on a read-only root file system; the working
    directory a driver starts in is writable."""
    pod_spec = janitor_pod()["spec"]
    (container,) = pod_spec["containers"]
    context = container["securityContext"]
    if expected != "writable":
        context = {**context, "readOnlyRootFilesystem": True}

    output = run_pod_container(
        images["spark"], pod_spec, {**container, "command": command, "securityContext": context}
    )

    assert expected in output
    if expected == "writable":
        assert output.splitlines()[:3] == [str(UID), str(UID), "/opt/spark-checkpoint/work"]


@pytest.mark.images
def test_the_spark_image_as_an_arbitrary_uid_without_a_passwd_entry_writes_home_and_work(
    images: dict[str, str],
) -> None:
    """A uid the image has no passwd entry for, in group 0: HOME is the image's home, and it
    and the working directory are writable (group 0 has the owner's permissions)."""
    probe = (
        'id -u; id -g; getent passwd "$(id -u)" || echo no-entry; echo "$HOME"; pwd; '
        'touch probe && echo work-writable; touch "$HOME/probe" && echo home-writable'
    )
    pod_spec = janitor_pod()["spec"]
    (container,) = pod_spec["containers"]
    pod_spec, container = as_arbitrary_uid(pod_spec, container)

    output = run_pod_container(
        images["spark"], pod_spec, {**container, "command": ["bash", "-c", probe]}
    )

    assert output.splitlines() == [
        str(ARBITRARY_UID),
        "0",
        "no-entry",  # as on containerd: what the image must cope with
        "/home/sparkcheckpoint",
        "/opt/spark-checkpoint/work",
        "work-writable",
        "home-writable",
    ]


# Spark in local mode as the launcher runs a driver's pipeline: the session (Ivy's paths
# from the JVM's user.home, Hadoop's login of the user), a parquet round trip in the working
# directory. It hands no query over, so it ends with a code of its own, which the launcher
# lets through.
TINY_PIPELINE = """
import sys
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
)
spark.range(10).write.parquet("numbers")
jvm = spark.sparkContext._jvm
user = jvm.org.apache.hadoop.security.UserGroupInformation.getCurrentUser().getShortUserName()
print("ran as", user, jvm.System.getProperty("user.home"), spark.read.parquet("numbers").count())
sys.exit(3)
"""


@pytest.mark.containers
def test_the_spark_image_runs_a_local_spark_session_as_an_arbitrary_uid(
    images: dict[str, str], tmp_path: Path
) -> None:
    """`python -m spark_checkpoint.launch`, as the operator starts drivers (the pod's
    command, past the image's entrypoint), as a uid without a passwd entry: the launcher
    gives it one (spark_checkpoint.user_entry) before Spark's JVM starts."""
    (tmp_path / "tiny.py").write_text(TINY_PIPELINE)
    tmp_path.chmod(0o755)  # pytest's own are private; the container's user reads this one
    pod_spec = janitor_pod()["spec"]
    (container,) = pod_spec["containers"]
    pod_spec, container = as_arbitrary_uid(pod_spec, container)
    command = ["python", "-m", "spark_checkpoint.launch", "/opt/app/tiny.py"]
    options, arguments = containers.pod_container_options(
        images["spark"], pod_spec, {**container, "command": command}, volumes={}
    )

    result = containers.run(
        images["spark"],
        arguments,
        options=[*options, "--volume", f"{tmp_path}:/opt/app:ro"],
        timeout=300,
    )

    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert "ran as spark /home/sparkcheckpoint 10" in result.stdout, output


def orders_job() -> dict[str, Any]:
    """The user guide's job, checkpointing every second, with a final savepoint, on a local
    master (simulated drivers start no executor pods, which the operator would wait for)."""
    document: dict[str, Any] = yaml.safe_load(GUIDE_JOB.read_text())
    document["metadata"]["namespace"] = "default"
    document["spec"]["application"]["sparkConf"]["spark.master"] = "local[2]"
    document["spec"]["checkpointing"] |= {"interval": "1s", "minPause": "0s", "timeout": "20s"}
    document["spec"]["shutdown"] = {"finalSavepoint": True}
    return document


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.containers
def test_the_operator_image_runs_a_job_as_the_chart_deploys_it(
    images: dict[str, str], tmp_path: Path
) -> None:
    """The chart's Deployment (command, arguments, environment, securityContext, /tmp) run
    from the operator image against the emulated API server, with simulated drivers: Kopf's
    liveness endpoint answers, checkpoints reach the status, a killed operator container
    is replaced and adopts the running driver, and deletion takes the final savepoint."""
    with LocalCluster(
        tmp_path,
        simulated=SimulatedAgents(batch_seconds=0.3),
        operator_image=images["operator"],
    ) as cluster:
        operator = cluster.operator
        assert isinstance(operator, OperatorContainer)

        def completed() -> int:
            return int(cluster.status("orders").get("counts", {}).get("completed", 0))

        cluster.wait_for("the liveness endpoint", lambda: answers(operator.health_url), 120)
        cluster.apply(orders_job())
        cluster.wait_for("2 checkpoints", lambda: completed() >= 2, 120, job="orders")
        assert answers(operator.metrics_url)
        operator.kill()
        operator.start()
        done = completed()
        cluster.wait_for("a checkpoint after adoption", lambda: completed() > done, 120, "orders")
        assert cluster.driver_pods("orders") == ["orders-driver-1"]
        cluster.delete("orders")
        cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, 120)
        cluster.wait_for_event("orders", "SavepointCompleted")


@pytest.mark.images
def test_the_harness_enforces_the_charts_security_context(images: dict[str, str]) -> None:
    """What the tests above rely on: under the chart's context the container runs as
    10001:10001 without capabilities or privilege escalation, and only the emptyDir on /tmp
    is writable (no writable /var/tmp or /run as Podman's read-only mode would add)."""
    pod_spec = containers.chart_deployment({})["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    probe = (
        "id -u; id -g; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
        "for d in / /var/tmp /run /tmp; do touch $d/probe 2>/dev/null && echo writable $d; done"
    )

    output = run_pod_container(
        images["operator"], pod_spec, {**container, "command": ["bash", "-c", probe], "args": []}
    )

    assert output.split() == [
        *(str(UID), str(UID)),
        *("CapEff:", "0000000000000000", "NoNewPrivs:", "1"),
        *("writable", "/tmp"),
    ]


@pytest.mark.containers
@pytest.mark.parametrize("arbitrary_uid", [False, True], ids=["image-user", "arbitrary-uid"])
def test_the_spark_image_starts_an_executor_as_spark_does(
    images: dict[str, str], arbitrary_uid: bool
) -> None:
    """Spark's executor pods run the image with the argument `executor` and the settings in
    SPARK_* variables: the JVM's executor backend starts, logs its user in (Hadoop's login:
    a uid without a passwd entry gets one from the entrypoint) and tries the driver (none
    listens on the port here)."""
    port = free_port()
    settings = {
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{port}",
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "spark-application-1",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "orders-exec-1",
        "SPARK_JAVA_OPT_0": "-Dspark.driver.port=" + str(port),
    }
    pod_spec = janitor_pod()["spec"]
    (container,) = pod_spec["containers"]
    executor = {
        "name": "spark-kubernetes-executor",
        "args": ["executor"],
        "env": [{"name": name, "value": value} for name, value in settings.items()],
        "securityContext": container["securityContext"],
    }
    if arbitrary_uid:
        pod_spec, executor = as_arbitrary_uid(pod_spec, executor)
    options, arguments = containers.pod_container_options(
        images["spark"], pod_spec, executor, volumes={}
    )

    result = containers.run(images["spark"], arguments, options=options)

    assert result.returncode != 0
    assert "KubernetesExecutorBackend" in result.stdout + result.stderr
    assert f"Failed to connect to /127.0.0.1:{port}" in result.stdout + result.stderr


@pytest.mark.containers
def test_a_pipeline_image_builds_on_the_spark_image_as_the_guide_says(
    images: dict[str, str], tmp_path: Path
) -> None:
    """The user guide's pipeline Dockerfile, built with Buildah on the spark image (tagged
    with the name the guide gives it), runs its pipeline as the image's user."""
    (dockerfile,) = [
        block
        for block in marked_blocks(
            "tests/docs/test_image_examples.py::"
            "test_image_commands_build_the_dockerfiles_targets_and_pipelines_build_on_spark"
        )
        if block.language == "dockerfile"
    ]
    base = dockerfile.text.split()[1]
    containers.podman("tag", images["spark"], base)
    (tmp_path / "Dockerfile").write_text(dockerfile.text)
    # The guide's orders.py is the user's: the reference word count stands in for it.
    shutil.copy(ROOT / "examples" / "wordcount" / "pipeline.py", tmp_path / "orders.py")
    pipeline_image = f"{containers.IMAGE_REPOSITORY}/orders:{containers.IMAGE_TAG}"
    try:
        containers.build_context(tmp_path, pipeline_image)
        pod_spec = janitor_pod()["spec"]
        (container,) = pod_spec["containers"]
        command = ["python", "/opt/app/orders.py", "--help"]

        output = run_pod_container(pipeline_image, pod_spec, {**container, "command": command})
    finally:
        containers.podman("rmi", base)

    assert "usage: orders.py" in output
