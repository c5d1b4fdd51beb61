"""The two images, built here and run as Kubernetes runs them.

Buildah builds both targets of the Dockerfile on the stand-in base (tests/helpers/containers.py),
and Podman runs them under the security contexts they get in a cluster: the chart's for the
operator image (user 10001, read-only root file system, every capability dropped, no
privilege escalation, an emptyDir on /tmp), the operator's own pods' for the spark image
(the image's user, every capability dropped, no privilege escalation). Slow on a cold machine
(minutes: the base, PySpark and Java are downloaded), so `make images-test` runs these tests
and `make test` does not; they fail, never skip, where the tools are missing.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from helpers import containers
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.manifest import manifest_from_document, validate_document

pytestmark = [pytest.mark.containers, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "spark-checkpoint-operator"
JOB = ROOT / "tests" / "manifest" / "fixtures" / "minimal-job.yaml"
UID = 10001


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    missing = containers.missing_tools()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `make images-tools` installs them")
    if os.geteuid() != 0:
        pytest.fail("building and running the images needs root here (as CI has)")
    base = containers.stand_in_base()
    return {target: containers.build(target, base) for target in containers.TARGETS}


def chart_deployment(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values=dict(values or {}), name="sco", namespace="operators")
    (deployment,) = [
        document
        for path, text in rendered.items()
        if path.endswith("deployment.yaml")
        for document in yaml.safe_load_all(text)
        if document
    ]
    return deployment


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


def janitor_pod(arguments: list[str]) -> dict[str, Any]:
    """The cleanup pod the operator creates for a job, as it creates it."""
    document = validate_document(yaml.safe_load(JOB.read_text()))
    manifest = manifest_from_document(document)
    document["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"  # the API server's
    return objects.cleanup_pod(manifest, document, storage="file:///tmp", arguments=arguments)


def test_the_images_run_as_their_numeric_non_root_user(images: dict[str, str]) -> None:
    for image in images.values():
        config = json.loads(containers.podman("image", "inspect", image))[0]["Config"]

        assert config["User"] == f"{UID}:{UID}"


def test_the_operator_image_answers_under_the_charts_security_context(
    images: dict[str, str],
) -> None:
    deployment = chart_deployment()
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The image's own entrypoint (Kopf's `run`), asked for its usage.
    container = {key: value for key, value in container.items() if key not in {"command"}}

    output = run_pod_container(images["operator"], pod_spec, {**container, "args": ["--help"]})

    assert "Usage: kopf run" in output
    assert "--all-namespaces" in output


def test_the_spark_image_runs_the_janitor_as_the_operator_starts_it(
    images: dict[str, str],
) -> None:
    pod = janitor_pod(["--help"])
    pod_spec = pod["spec"]
    (container,) = pod_spec["containers"]

    output = run_pod_container(images["spark"], pod_spec, container)

    assert "usage: python -m spark_checkpoint.janitor" in output
    assert "collect-garbage" in output


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
    pod_spec = janitor_pod([])["spec"]
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
