"""The pods and Secret the operator creates, checked against Kubernetes' own schemas."""

import asyncio
import dataclasses
import json
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import kubernetes_validate
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers.agent import TOKEN, Running
from helpers.doc_blocks import marked_blocks
from helpers.job_pods import job_pods
from helpers.kube.kubelet import _expand as expand
from spark_checkpoint.janitor_commands import CollectGarbage, RemoveLiveDirectory
from spark_checkpoint.protocol import QueryState
from spark_checkpoint_operator.agent_client import AgentClient
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.runtime import (
    KubernetesDriver,
    PodRegistry,
    typed_object_problems,
)
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.model import JobManifest
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.manifest.validation import validate_document

FIXTURES = Path(__file__).parent.parent / "manifest" / "fixtures"
KUBERNETES_VERSION = "1.30"


def _job(
    name: str = "full-job.yaml", edit: Callable[[dict[str, Any]], None] = lambda raw: None
) -> tuple[Any, dict[str, Any]]:
    """The manifest and the stored object (with the uid the API server gave it); ``edit``
    changes the fixture first."""
    raw = yaml.safe_load((FIXTURES / name).read_text())
    edit(raw)
    document = validate_document(raw)
    manifest = manifest_from_document(document)
    document["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"
    return manifest, document


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def _driver(
    name: str = "full-job.yaml",
    restore: list[str] | None = None,
    edit: Callable[[dict[str, Any]], None] = lambda raw: None,
) -> dict[str, Any]:
    manifest, document = _job(name, edit)
    return objects.driver_pod(
        manifest,
        document,
        attempt=3,
        storage="s3a://bucket/checkpoints",
        restore=restore or [],
        deployed_hash=objects.deployment_hash(document["spec"]),
        user_ids=objects.UserIds.IMAGE,
    )


@pytest.mark.parametrize("fixture", ["full-job.yaml", "minimal-job.yaml"])
def test_the_driver_pod_is_a_valid_pod(fixture: str) -> None:
    kubernetes_validate.validate(_driver(fixture), KUBERNETES_VERSION, strict=True)


def test_the_cleanup_pod_and_token_secret_are_valid() -> None:
    manifest, document = _job()
    cleanup = objects.cleanup_pod(
        manifest,
        document,
        storage="s3a://b/c",
        command=CollectGarbage((), ()),
        user_ids=objects.UserIds.IMAGE,
    )
    secret = objects.token_secret(manifest, document, "secret-token")

    kubernetes_validate.validate(cleanup, KUBERNETES_VERSION, strict=True)
    kubernetes_validate.validate(secret, KUBERNETES_VERSION, strict=True)
    assert cleanup["metadata"]["generateName"] == f"{manifest.name}-cleanup-"
    assert cleanup["spec"]["containers"][0]["command"][:3] == [
        "python",
        "-m",
        "spark_checkpoint.janitor",
    ]


def test_the_driver_is_owned_by_its_job_and_labelled_per_attempt() -> None:
    pod = _driver()
    manifest, document = _job()

    assert pod["metadata"]["name"] == f"{manifest.name}-driver-3"
    assert pod["metadata"]["ownerReferences"] == [objects.owner_reference(document)]
    # blockOwnerDeletion would need `update` on sparkcheckpointjobs/finalizers where owner
    # references are enforced (OpenShift): every pod and Secret create was Forbidden there.
    assert "blockOwnerDeletion" not in objects.owner_reference(document)
    labels = pod["metadata"]["labels"]
    assert labels[objects.LABEL_JOB] == manifest.name
    assert labels[objects.LABEL_SPARK_ROLE] == "driver"
    assert labels[objects.LABEL_ATTEMPT] == "3"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert "automountServiceAccountToken" not in pod["spec"], "Spark creates its executors"


def test_the_token_is_mounted_never_written_into_the_pod() -> None:
    pod = _driver()
    environment = _env(pod)

    assert environment["SPARK_CHECKPOINT_TOKEN_FILE"]["value"] == f"{objects.TOKEN_DIR}/token"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[objects.TOKEN_VOLUME]["secret"]["secretName"].endswith("-agent-token")
    assert "secret-token" not in str(pod)


def test_the_agent_listens_on_the_pod_ip_and_restores_from_the_candidates() -> None:
    pod = _driver(restore=["savepoint:9", "checkpoint:8"])
    environment = list(_env(pod))

    assert environment.index("POD_IP") < environment.index("SPARK_CHECKPOINT_AGENT_HOST")
    assert _env(pod)["SPARK_CHECKPOINT_AGENT_HOST"]["value"] == "$(POD_IP)"
    assert _env(pod)["SPARK_CHECKPOINT_RESTORE"]["value"] == '["savepoint:9", "checkpoint:8"]'
    assert _env(pod)["SPARK_CHECKPOINT_STORAGE"]["value"] == "s3a://bucket/checkpoints"


def _as_the_kubelet_starts(pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The container's command and environment after the kubelet's $(NAME) expansion."""
    fields = {"metadata.name": pod["metadata"].get("name", "x"), "status.podIP": "10.0.0.7"}
    defined: dict[str, str] = {}
    container = pod["spec"]["containers"][0]
    for variable in container["env"]:
        if "value" in variable:
            defined[variable["name"]] = expand(variable["value"], defined)
        elif field := variable["valueFrom"].get("fieldRef"):
            defined[variable["name"]] = fields.get(field["fieldPath"], "?")
    return [expand(part, defined) for part in container["command"]], defined


def test_what_the_manifest_says_reaches_the_pods_as_written() -> None:
    """The hostile reviewer's: the kubelet expanded $(POD_NAME) in the storage (a directory
    per attempt, another for cleanup pods), "pa$$word" reached Spark as "pa$word", and
    arguments changed the same way; `spark-checkpoint run` gives them as written."""
    storage = "file:///data/$(POD_NAME)/$$"
    secret = "pa$$word$(POD_IP)"
    arguments = ["--pattern", "^id-[0-9]+$$", "--out", "$(SPARK_CHECKPOINT_JOB)"]

    def edit(raw: dict[str, Any]) -> None:
        raw["spec"]["application"]["sparkConf"]["spark.hadoop.fs.s3a.secret.key"] = secret
        raw["spec"]["application"]["arguments"] = arguments
        raw["spec"]["application"]["env"] = [
            {"name": "BUCKET", "value": "b1"},
            {"name": "URL", "value": "s3://$(BUCKET)/x"},
        ]

    pods = job_pods(*_job(edit=edit), storage=storage)
    driver = pods.pop("driver")
    command, environment = _as_the_kubelet_starts(driver)
    assert command[-len(arguments) :] == arguments
    assert environment["SPARK_CHECKPOINT_STORAGE"] == storage
    assert environment["SPARK_CHECKPOINT_AGENT_HOST"] == "10.0.0.7"
    conf = dict(
        part.split("=", 1)
        for part in shlex.split(environment["PYSPARK_SUBMIT_ARGS"])
        if "=" in part
    )
    assert conf["spark.hadoop.fs.s3a.secret.key"] == secret
    # The job's env values are expanded as Kubernetes does, for the executors too: in the
    # driver's pod, where the variables before them are defined (a reviewer's).
    assert environment["URL"] == conf["spark.executorEnv.URL"] == "s3://b1/x"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "10.0.0.7"
    for pod in pods.values():
        _, environment = _as_the_kubelet_starts(pod)
        assert environment["SPARK_CHECKPOINT_STORAGE"] == storage


def test_spark_runs_in_client_mode_unless_the_manifest_says_otherwise() -> None:
    submit = _env(_driver())["PYSPARK_SUBMIT_ARGS"]["value"]
    manifest, _ = _job()

    assert "spark.submit.deployMode=client" in submit
    assert "spark.kubernetes.driver.pod.name=" in submit
    for key, value in manifest.spec.application.spark_conf.items():
        assert f"{key}={value}" in submit
    assert submit.endswith("pyspark-shell")


def test_driver_and_executors_share_the_live_volume_claim_in_a_directory_per_job() -> None:
    manifest, document = _job()
    pod = _driver()
    submit = _env(pod)["PYSPARK_SUBMIT_ARGS"]["value"]
    directory = f"{manifest.name}-{document['metadata']['uid']}"

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert volumes[objects.WORK_VOLUME]["persistentVolumeClaim"] == {"claimName": "orders-live"}
    assert mounts[objects.WORK_VOLUME] == {
        "name": objects.WORK_VOLUME,
        "mountPath": objects.WORK_DIR,
        "subPath": directory,
    }
    executor_volume = (
        f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{objects.WORK_VOLUME}"
    )
    for setting in (
        f"{executor_volume}.options.claimName=orders-live",
        f"{executor_volume}.mount.path={objects.WORK_DIR}",
        f"{executor_volume}.mount.subPath={directory}",
    ):
        assert setting in submit


def test_the_cleanup_pod_removing_a_live_directory_mounts_the_whole_claim() -> None:
    manifest, document = _job()
    directory = objects.live_directory(manifest, document)
    cleanup = objects.cleanup_pod(
        manifest,
        document,
        storage="s3a://b/c",
        command=RemoveLiveDirectory(directory),
        live_claim=True,
        user_ids=objects.UserIds.IMAGE,
    )

    kubernetes_validate.validate(cleanup, KUBERNETES_VERSION, strict=True)
    volumes = {v["name"]: v for v in cleanup["spec"]["volumes"]}
    mounts = {m["name"]: m for m in cleanup["spec"]["containers"][0]["volumeMounts"]}
    assert volumes[objects.LIVE_VOLUME]["persistentVolumeClaim"] == {"claimName": "orders-live"}
    assert mounts[objects.LIVE_VOLUME] == {
        "name": objects.LIVE_VOLUME,
        "mountPath": objects.LIVE_ROOT_DIR,
    }, "the whole claim: a subPath mount cannot remove its own directory"
    assert _env(cleanup)["SPARK_CHECKPOINT_LIVE_ROOT"]["value"] == objects.LIVE_ROOT_DIR
    assert directory == f"{manifest.name}-{document['metadata']['uid']}"


def test_without_executors_the_live_location_is_on_the_drivers_own_disk() -> None:
    pod = _driver("minimal-job.yaml")

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[objects.WORK_VOLUME] == {"name": objects.WORK_VOLUME, "emptyDir": {}}
    assert "persistentVolumeClaim" not in _env(pod)["PYSPARK_SUBMIT_ARGS"]["value"]


def test_executors_get_tolerations_volumes_and_mounts_through_a_pod_template() -> None:
    """The driver pod carries the template in an annotation and has it as the file Spark's
    spark.kubernetes.executor.podTemplateFile names (a downwardAPI volume)."""
    manifest, _ = _job()
    pod = _driver()
    submit = _env(pod)["PYSPARK_SUBMIT_ARGS"]["value"]
    template = json.loads(pod["metadata"]["annotations"][objects.ANNOTATION_EXECUTOR_TEMPLATE])

    assert template == objects.executor_pod_template(manifest, objects.UserIds.IMAGE)
    kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)
    assert template["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert template["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]
    (container,) = template["spec"]["containers"]
    assert container["name"] == objects.EXECUTOR_CONTAINER == "spark-kubernetes-executor"
    assert container["volumeMounts"] == [{"name": "scratch", "mountPath": "/scratch"}]
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert template["spec"]["securityContext"]["fsGroup"] == objects.FS_GROUP

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    (item,) = volumes[objects.EXECUTOR_TEMPLATE_VOLUME]["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == (
        f"metadata.annotations['{objects.ANNOTATION_EXECUTOR_TEMPLATE}']"
    )
    file = f"{mounts[objects.EXECUTOR_TEMPLATE_VOLUME]['mountPath']}/{item['path']}"
    assert f"spark.kubernetes.executor.podTemplateFile={file}" in submit
    assert f"podTemplateContainerName={objects.EXECUTOR_CONTAINER}" in submit
    assert "spark.kubernetes.executor.annotation.sidecar.istio.io/inject=false" in submit


def test_every_pod_of_the_job_pulls_its_image_with_the_pull_secrets() -> None:
    """spec.imagePullSecrets (an image in a private registry): the driver, the cleanup and
    the check pods, and the executors through Spark's setting (which a job's own executor
    template keeps); a change is an upgrade, and a job without them keeps its hash."""
    secrets = [{"name": "registry"}, {"name": "mirror"}]

    def with_secrets(raw: dict[str, Any]) -> None:
        raw["spec"]["imagePullSecrets"] = secrets
        raw["spec"]["imagePullPolicy"] = "Always"

    manifest, document = _job(edit=with_secrets)
    pods = job_pods(manifest, document)
    for name, pod in pods.items():
        assert pod["spec"]["imagePullSecrets"] == secrets, name
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    submit = _env(pods["driver"])["PYSPARK_SUBMIT_ARGS"]["value"]
    assert "spark.kubernetes.container.image.pullSecrets=registry,mirror" in submit
    assert "spark.kubernetes.container.image.pullPolicy=Always" in submit  # the executors'

    plain_manifest, plain = _job()
    assert all(
        "imagePullSecrets" not in p["spec"] for p in job_pods(plain_manifest, plain).values()
    )
    assert objects.deployment_hash(document["spec"]) != objects.deployment_hash(plain["spec"])
    hash_without = objects.deployment_hash({**plain["spec"], "imagePullSecrets": []})
    assert hash_without == objects.deployment_hash(plain["spec"])


def _every_pod(user_ids: objects.UserIds) -> dict[str, dict[str, Any]]:
    """Every pod the operator makes for the full fixture, and the executors' template."""
    pods = job_pods(*_job(), user_ids=user_ids)
    annotations = pods["driver"]["metadata"]["annotations"]
    return {
        **pods,
        "executor template": json.loads(annotations[objects.ANNOTATION_EXECUTOR_TEMPLATE]),
    }


def _restricted_v2_problems(pod: dict[str, Any]) -> list[str]:
    """What OpenShift's restricted-v2 SCC refuses or overrides in `pod`, whose user, group
    and fsGroup the SCC assigns from the namespace's range: any id set, any capability
    kept, privilege escalation, a seccomp profile other than RuntimeDefault, a volume of
    a kind it does not allow."""
    spec = pod["spec"]
    contexts = [("pod", spec.get("securityContext", {}))] + [
        (container["name"], container.get("securityContext", {}))
        for container in spec["containers"]
    ]
    problems = [
        f"{where}: {key}"
        for where, context in contexts
        for key in ("runAsUser", "runAsGroup", "fsGroup", "supplementalGroups")
        if key in context
    ]
    for container in spec["containers"]:
        context = container.get("securityContext", {})
        if context.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{container['name']}: capabilities not all dropped")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{container['name']}: privilege escalation allowed")
    profiles = [context.get("seccompProfile", {}).get("type") for _, context in contexts]
    problems += [
        f"seccomp {profile}" for profile in profiles if profile not in {None, "RuntimeDefault"}
    ]
    allowed = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    problems += [
        f"volume {volume['name']}: {kind}"
        for volume in spec.get("volumes", [])
        for kind in volume.keys() - {"name"}
        if kind not in allowed
    ]
    return problems


def test_with_user_ids_from_the_platform_no_pod_sets_an_id() -> None:
    """OpenShift's restricted-v2 SCC refuses a pod whose fsGroup or user lies outside the
    namespace's range and assigns them itself: with `UserIds.PLATFORM`, no pod the
    operator makes (nor Spark's executors, through their template) sets one, and the rest
    of the restricted context stays."""
    for name, pod in _every_pod(objects.UserIds.PLATFORM).items():
        assert _restricted_v2_problems(pod) == [], name
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, name
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_with_user_ids_from_the_image_every_pod_has_the_images_group_for_its_secrets() -> None:
    for name, pod in _every_pod(objects.UserIds.IMAGE).items():
        assert _restricted_v2_problems(pod) == ["pod: fsGroup"], name
        assert pod["spec"]["securityContext"]["fsGroup"] == objects.FS_GROUP == 10001, name


def test_a_job_without_executor_settings_gets_a_template_of_the_restricted_context() -> None:
    manifest, _ = _job("minimal-job.yaml")
    template = objects.executor_pod_template(manifest, objects.UserIds.IMAGE)

    assert "tolerations" not in template["spec"]
    assert template["spec"]["volumes"] == []
    assert template["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert objects.pod_problems(manifest) == []


def _manifest(**spec: Any) -> JobManifest:
    """The full fixture with ``spec``'s roles and sparkConf replaced."""
    document = yaml.safe_load((FIXTURES / "full-job.yaml").read_text())
    for key, value in spec.items():
        if key == "sparkConf":
            document["spec"]["application"]["sparkConf"] = value
        else:
            document["spec"][key] = value
    return manifest_from_document(document)


def _problems(**spec: Any) -> list[str]:
    return objects.pod_problems(_manifest(**spec))


SCRATCH = {"name": "scratch", "emptyDir": {}}


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"executor": {"volumes": [{**SCRATCH, "name": "checkpoint-work"}]}},
            "spec.executor.volumes[0].name: 'checkpoint-work' is a volume the operator or "
            "Spark adds",
        ),
        (
            {"executor": {"volumes": [{**SCRATCH, "name": "spark-local-dir-1"}]}},
            "spec.executor.volumes[0].name: 'spark-local-dir-1' is a volume the operator or "
            "Spark adds",
        ),
        (
            {"executor": {"volumes": [SCRATCH, SCRATCH]}},
            "spec.executor.volumes[1].name: 'scratch' names two volumes (and "
            "spec.executor.volumes[0])",
        ),
        ({"executor": {"volumes": [{"emptyDir": {}}]}}, "spec.executor.volumes[0].name: required"),
        (
            {"executor": {"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}},
            "spec.executor.volumeMounts[0].name: 'scratch' is not in spec.executor.volumes",
        ),
        (
            {
                "executor": {
                    "volumes": [SCRATCH],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/opt/spark/conf/"}],
                }
            },
            "spec.executor.volumeMounts[0].mountPath: '/opt/spark/conf/' is where the "
            "operator or Spark mounts",
        ),
        (
            {
                "executor": {
                    "volumes": [SCRATCH, {**SCRATCH, "name": "b"}],
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/data"},
                        {"name": "b", "mountPath": "/data"},
                    ],
                }
            },
            "spec.executor.volumeMounts[1].mountPath: '/data' mounts two volumes",
        ),
        (
            {
                "executor": {"volumes": [SCRATCH], "volumeMounts": [{"name": "scratch"}]},
            },
            "spec.executor.volumeMounts[0].mountPath: an absolute path is required",
        ),
        (
            {"executor": {"volumeMounts": [{"mountPath": "/data"}]}},
            "spec.executor.volumeMounts[0].name: required",
        ),
        (
            {
                "executor": {
                    "volumes": [SCRATCH, {**SCRATCH, "name": "b"}],
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/data/"},
                        {"name": "b", "mountPath": "/data"},
                    ],
                }
            },
            "spec.executor.volumeMounts[1].mountPath: '/data' mounts two volumes",
        ),
        (
            {
                "sparkConf": {"spark.kubernetes.executor.secrets.s3-keys": "/etc/keys/"},
                "executor": {
                    "volumes": [SCRATCH],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/etc/keys"}],
                },
            },
            "spec.executor.volumeMounts[0].mountPath: '/etc/keys' is where the operator or "
            "Spark mounts",
        ),
        (
            {"driver": {"volumes": [{**SCRATCH, "name": objects.TOKEN_VOLUME}]}},
            f"spec.driver.volumes[0].name: {objects.TOKEN_VOLUME!r} is a volume the operator "
            "or Spark adds",
        ),
        # The security reviewer's: each broke every cleanup and check pod (a mount of no
        # volume there), so retention was never carried out; the live one, the driver too.
        *(
            (
                {"driver": {"volumeMounts": [{"name": own, "mountPath": "/extra"}]}},
                f"spec.driver.volumeMounts[0].name: {own!r} is a volume the operator adds "
                "to the driver pod alone (the job's cleanup and check pods, which take the "
                "driver's volumes and mounts, have none of that name)",
            )
            for own in (
                objects.TOKEN_VOLUME,
                objects.WORK_VOLUME,
                objects.LIVE_VOLUME,
                objects.EXECUTOR_TEMPLATE_VOLUME,
            )
        ),
        (
            {
                "driver": {
                    "volumes": [SCRATCH],
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": objects.EXECUTOR_TEMPLATE_DIR}
                    ],
                }
            },
            f"spec.driver.volumeMounts[0].mountPath: {objects.EXECUTOR_TEMPLATE_DIR!r} is "
            "where the operator or Spark mounts",
        ),
        # The hostile reviewer's: the runtime mounts where the path leads, not its text.
        *(
            (
                {
                    "driver": {
                        "volumes": [SCRATCH],
                        "volumeMounts": [{"name": "scratch", "mountPath": spelled}],
                    }
                },
                f"spec.driver.volumeMounts[0].mountPath: {spelled!r} is where the operator or "
                f"Spark mounts{detail}",
            )
            for spelled, detail in (
                (f"{objects.TOKEN_DIR}/.", ""),
                ("/var/run//spark-checkpoint", ""),
                (f"/{objects.WORK_DIR}/../work/", ""),
                (
                    f"{objects.EXECUTOR_TEMPLATE_DIR}/mine",
                    f" ({objects.EXECUTOR_TEMPLATE_DIR}), or inside it",
                ),
            )
        ),
        (
            {
                "sparkConf": {
                    "spark.kubernetes.executor.volumes.nfs.shared.mount.path": "/shared",
                    "spark.kubernetes.executor.volumes.nfs.shared.options.server": "nfs",
                },
                "executor": {
                    "volumes": [{**SCRATCH, "name": "shared"}],
                    "volumeMounts": [{"name": "shared", "mountPath": "/other"}],
                },
            },
            "spec.executor.volumes[0].name: 'shared' is a volume the operator or Spark adds",
        ),
        (
            {
                "sparkConf": {"spark.kubernetes.executor.podTemplateFile": "/opt/t.yaml"},
                "executor": {"tolerations": [{"key": "spot", "operator": "Exists"}]},
            },
            "spec.executor.tolerations: not applied with sparkConf "
            "spark.kubernetes.executor.podTemplateFile, whose template replaces the "
            "operator's; put tolerations, volumes and volumeMounts in that template",
        ),
        # The security review: executors labelled as the operator's pods matched its
        # NetworkPolicy rule and reached every driver's agent port.
        (
            {"sparkConf": {"spark.kubernetes.executor.label.app.kubernetes.io/name": "x"}},
            "spec.application.sparkConf: spark.kubernetes.executor.label."
            "app.kubernetes.io/name is set by the operator",
        ),
        (
            {"executor": {"labels": {"sparkcheckpoint.io/job": "another"}}},
            "spec.executor.labels: 'sparkcheckpoint.io/job' is a label the operator sets",
        ),
        (
            {"sparkConf": {"spark.kubernetes.namespace": "elsewhere"}},
            "spec.application.sparkConf: spark.kubernetes.namespace is set by the operator",
        ),
        (
            {"sparkConf": {"spark.kubernetes.driver.pod.name": "another-driver"}},
            "spec.application.sparkConf: spark.kubernetes.driver.pod.name is set by the operator",
        ),
        # The hostile reviewer's: executors' state in another claim, or in another job's
        # directory of a shared one.
        *(
            (
                {"sparkConf": {key: "another"}},
                f"spec.application.sparkConf: {key} is set by the operator",
            )
            for key in (
                f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{objects.WORK_VOLUME}"
                ".mount.subPath",
                f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{objects.WORK_VOLUME}"
                ".options.claimName",
                f"spark.kubernetes.executor.volumes.hostPath.{objects.WORK_VOLUME}.mount.path",
            )
        ),
        # Keys the CRD cannot check (a reviewer's): the driver pod was refused naming the
        # pod's field; Spark would have retried each executor pod for ever.
        *(
            (
                {role: {field: {"bad key!": "x"}}},
                f"spec.{role}.{field}: 'bad key!' is not a label or annotation key (an "
                "optional DNS subdomain and '/', then at most 63 letters, digits, '-', '_' "
                "and '.', starting and ending with a letter or digit)",
            )
            for role in ("driver", "executor")
            for field in ("labels", "annotations", "nodeSelector")
        ),
    ],
)
def test_what_the_api_server_or_spark_would_refuse_in_pods_is_a_problem_naming_its_field(
    spec: dict[str, Any], problem: str
) -> None:
    assert _problems(**spec) == [problem]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        # A hostile-input reviewer: the API server (and Spark's client, for executors) drops
        # a field its type lacks, and a volume left without a source is an emptyDir: the
        # job ran, writing its output to throw-away disk.
        (
            {"driver": {"volumes": [{"name": "out", "persistentVolumeClam": {"claimName": "o"}}]}},
            "spec.driver.volumes[0]: unknown field 'persistentVolumeClam' (did you mean "
            "persistentVolumeClaim?)",
        ),
        # No source (a templating miss): an emptyDir too (a reviewer's).
        *(
            (
                {"driver": {"volumes": [volume]}},
                "spec.driver.volumes[0]: no volume source (persistentVolumeClaim, configMap, "
                "secret, ...): the API server would make it an emptyDir, lost with its pod; "
                "write emptyDir: {} if that is what is meant",
            )
            for volume in ({"name": "out"}, {"name": "out", "persistentVolumeClaim": None})
        ),
        (
            {"executor": {"volumes": [{"name": "out", "emptyDir": {}, "secret": {}}]}},
            "spec.executor.volumes[0]: emptyDir and secret: a volume has one source",
        ),
        (
            {
                "executor": {
                    "volumes": [SCRATCH],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/s", "readOnlyy": True}],
                }
            },
            "spec.executor.volumeMounts[0]: unknown field 'readOnlyy' (did you mean readOnly?)",
        ),
        (
            {
                "executor": {
                    "volumes": [
                        {"name": "c", "configMap": {"items": [{"key": "k", "path": "p", "mod": 1}]}}
                    ]
                }
            },
            "spec.executor.volumes[0].configMap.items[0]: unknown field 'mod' (did you mean mode?)",
        ),
        (
            {"driver": {"tolerations": [{"key": "spot", "tolerationSeconds": "soon"}]}},
            "spec.driver.tolerations[0].tolerationSeconds: Input should be a valid integer",
        ),
        # A quantity the API server would refuse when the driver is created (a reviewer's).
        (
            {"driver": {"volumes": [{"name": "s", "emptyDir": {"sizeLimit": "1GB"}}]}},
            "spec.driver.volumes[0].emptyDir.sizeLimit: '1GB' is not a quantity such as 1Gi, "
            "500M or 0.5",
        ),
        (
            {"executor": {"volumes": [{"name": "s", "emptyDir": {"sizeLimit": float("inf")}}]}},
            "spec.executor.volumes[0].emptyDir.sizeLimit: 'inf' is not a quantity such as 1Gi, "
            "500M or 0.5",
        ),
        # Below zero: the API server refuses it (a size, a divisor, a claim's request).
        (
            {"driver": {"volumes": [{"name": "s", "emptyDir": {"sizeLimit": "-1Gi"}}]}},
            "spec.driver.volumes[0].emptyDir.sizeLimit: '-1Gi' is below zero",
        ),
        (
            {"executor": {"volumes": [{"name": "s", "emptyDir": {"sizeLimit": -0.5}}]}},
            "spec.executor.volumes[0].emptyDir.sizeLimit: '-0.5' is below zero",
        ),
        # Only quantities are taken as numbers: labels are strings, whatever their keys.
        (
            {
                "driver": {
                    "volumes": [
                        {
                            "name": "e",
                            "ephemeral": {
                                "volumeClaimTemplate": {
                                    "metadata": {"labels": {"sizeLimit": 3}},
                                    "spec": {
                                        "accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": "1Gi"}},
                                    },
                                }
                            },
                        }
                    ]
                }
            },
            "spec.driver.volumes[0].ephemeral.volumeClaimTemplate.metadata.labels.sizeLimit: "
            "Input should be a valid string",
        ),
    ],
)
def test_a_field_a_pod_objects_type_lacks_or_a_wrong_type_is_a_problem_naming_its_field(
    spec: dict[str, Any], problem: str
) -> None:
    manifest = _manifest(**spec)

    assert objects.pod_problems(manifest) == []
    assert typed_object_problems(manifest) == [problem]


def test_a_quantity_written_as_a_number_is_no_problem() -> None:
    """The API server takes `sizeLimit: 1`; the client types quantities as strings (a
    reviewer's: the typed check refused it)."""
    volume = {"name": "scratch", "emptyDir": {"sizeLimit": 1073741824}}
    assert typed_object_problems(_manifest(driver={"volumes": [volume]})) == []
    for zero in ("-0", "-0.0Gi", "0", "+1e3"):
        volume = {"name": "scratch", "emptyDir": {"sizeLimit": zero}}
        assert typed_object_problems(_manifest(driver={"volumes": [volume]})) == [], zero


def test_the_full_example_and_a_template_of_ones_own_without_executor_fields_are_fine() -> None:
    assert _problems() == []
    own_template = {"spark.kubernetes.executor.podTemplateFile": "/opt/t.yaml"}
    assert _problems(sparkConf=own_template, executor={}) == []
    # The API server judges annotation keys lowercased (a reviewer's).
    assert _problems(driver={"annotations": {"Example.com/Owner": "x"}}) == []
    # A mount of a volume the operator adds (the live claim, once more at a subPath).
    again = {"name": objects.WORK_VOLUME, "mountPath": "/state", "subPath": "x"}
    assert _problems(executor={"volumeMounts": [again]}) == []


def test_executors_carry_the_jobs_labels_besides_the_manifests() -> None:
    def gold(raw: dict[str, Any]) -> None:
        raw["spec"].setdefault("executor", {})["labels"] = {"tier": "gold"}

    words = shlex.split(_env(_driver(edit=gold))["PYSPARK_SUBMIT_ARGS"]["value"])
    prefix = "spark.kubernetes.executor.label."
    labels = dict(
        setting.removeprefix(prefix).split("=", 1)
        for setting in words
        if setting.startswith(prefix)
    )

    assert labels == {"tier": "gold", **objects.job_labels(_job()[0], objects.EXECUTOR)}
    assert labels["app.kubernetes.io/name"] == "spark-checkpoint"  # not the operator's


def test_pods_run_as_non_root_without_privileges() -> None:
    pod = _driver()
    container = pod["spec"]["containers"][0]

    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_only_what_a_driver_is_built_from_changes_the_deployment_hash() -> None:
    _, document = _job()
    spec = document["spec"]
    base = objects.deployment_hash(spec)

    for unrelated in (
        {"checkpointTriggerNonce": 7},
        {"state": "Suspended"},
        {"checkpointing": {**spec["checkpointing"], "interval": "1h"}},
    ):
        assert objects.deployment_hash({**spec, **unrelated}) == base
    for redeploy in (
        {"image": "other:2"},
        {"checkpointing": {**spec["checkpointing"], "liveVolumeClaim": "other-claim"}},
        {"application": {**spec["application"], "arguments": ["--new"]}},
    ):
        assert objects.deployment_hash({**spec, **redeploy}) != base


def test_the_deployment_hash_of_a_job_without_a_live_volume_claim_is_unchanged() -> None:
    """Pinned: an operator upgrade that changed it would redeploy every running job."""
    _, document = _job("minimal-job.yaml")

    assert objects.deployment_hash(document["spec"]) == "ee42c8b5226cd4ed"


def _with_env(
    application: list[dict[str, Any]], driver: list[dict[str, Any]], executor: list[dict[str, Any]]
) -> tuple[Any, dict[str, Any]]:
    document = yaml.safe_load((FIXTURES / "full-job.yaml").read_text())
    document["spec"]["application"]["env"] = application
    document["spec"]["driver"]["env"] = driver
    document["spec"]["executor"]["env"] = executor
    stored = validate_document(document)
    manifest = manifest_from_document(stored)
    stored["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"
    return manifest, stored


def _secret(name: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": key}}


def test_storage_credentials_from_a_secret_reach_driver_executors_and_cleanup_pods() -> None:
    # docs/operator.md's example, plus the clashes it describes.
    (example,) = marked_blocks(
        "tests/kubernetes/test_objects.py::"
        "test_storage_credentials_from_a_secret_reach_driver_executors_and_cleanup_pods"
    )
    documented = yaml.safe_load(example.text)["spec"]["application"]["env"]
    manifest, document = _with_env(
        application=[*documented, {"name": "LOG_LEVEL", "value": "INFO"}],
        driver=[{"name": "LOG_LEVEL", "value": "DEBUG"}],
        executor=[{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": _secret("exec", "key")}],
    )
    pods = job_pods(manifest, document)
    driver, cleanup = pods["driver"], pods[objects.CLEANUP]
    for pod in (driver, cleanup):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        environment = _env(pod)
        assert environment["AWS_SECRET_ACCESS_KEY"] == {
            "name": "AWS_SECRET_ACCESS_KEY",
            "valueFrom": _secret("s3-credentials", "secret-key"),
        }
        assert environment["LOG_LEVEL"]["value"] == "DEBUG"  # the driver's own wins
        names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
        assert len(names) == len(set(names)), "each variable once"
    submit = _env(driver)["PYSPARK_SUBMIT_ARGS"]["value"]
    # The executors get the application's variables too, and their own win.
    assert (
        "spark.kubernetes.executor.secretKeyRef.AWS_ACCESS_KEY_ID=s3-credentials:access-key"
        in submit
    )
    assert "spark.kubernetes.executor.secretKeyRef.AWS_SECRET_ACCESS_KEY=exec:key" in submit
    assert "spark.executorEnv.LOG_LEVEL=INFO" in submit
    assert "s3-credentials:secret-key" not in submit
    assert "spark.executorEnv.AWS" not in submit


# Keys the operator or Spark find or tell apart the job's pods by, and others.
_LABEL_KEYS = [
    objects.LABEL_JOB,
    objects.LABEL_COMPONENT,
    objects.LABEL_ATTEMPT,
    objects.LABEL_SPARK_ROLE,
    "app.kubernetes.io/instance",
    "azure.workload.identity/use",
    "team",
]
# Only drivers (and executors) carry these.
DRIVER_ONLY_LABELS = (objects.LABEL_SPARK_ROLE, objects.LABEL_ATTEMPT)
_LABEL_VALUES = [
    objects.DRIVER,
    objects.EXECUTOR,
    objects.CLEANUP,
    objects.CHECK,
    "orders-enrichment",
    "true",
]


@settings(deadline=None)  # the first example loads the manifest
@given(
    labels=st.dictionaries(st.sampled_from(_LABEL_KEYS), st.sampled_from(_LABEL_VALUES)),
    annotations=st.dictionaries(
        st.sampled_from(["azure.workload.identity/skip-containers", objects.ANNOTATION_SPEC_HASH]),
        st.sampled_from(["driver", "h"]),
    ),
)
@example(
    labels={"azure.workload.identity/use": "true", objects.LABEL_SPARK_ROLE: objects.DRIVER},
    annotations={},
)
def test_cleanup_and_check_pods_carry_the_drivers_labels_but_are_never_taken_for_a_driver(
    labels: dict[str, str], annotations: dict[str, str]
) -> None:
    """Azure Workload Identity gives credentials only to pods labelled for it; the pods
    that do the driver's storage work need its labels. The operator's own labels win, and
    the ones only drivers and executors carry are left out, so no selector of the operator
    (or Spark's spark-role) takes a cleanup or check pod for a driver or an executor."""
    document = yaml.safe_load((FIXTURES / "full-job.yaml").read_text())
    document["spec"]["driver"]["labels"] = labels
    document["spec"]["driver"]["annotations"] = annotations
    stored = validate_document(document)
    manifest = manifest_from_document(stored)
    stored["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"
    cleanup = objects.cleanup_pod(
        manifest,
        stored,
        storage="s3a://b/c",
        command=CollectGarbage((), ()),
        user_ids=objects.UserIds.IMAGE,
    )
    check = objects.check_pod(
        manifest, stored, storage="s3a://b/c", image="checkpoint:7", user_ids=objects.UserIds.IMAGE
    )

    for pod, component in ((cleanup, objects.CLEANUP), (check, objects.CHECK)):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        # The driver's service account creates executors; these pods reach storage only.
        assert pod["spec"]["automountServiceAccountToken"] is False
        carried = pod["metadata"]["labels"]
        own = objects.job_labels(manifest, component)
        assert carried[objects.LABEL_JOB] == manifest.name
        assert carried[objects.LABEL_COMPONENT] == component, "never taken for a driver"
        assert objects.LABEL_SPARK_ROLE not in carried, "nor for an executor"
        assert objects.LABEL_ATTEMPT not in carried
        assert carried == own | {
            k: v for k, v in labels.items() if k not in (*own, *DRIVER_ONLY_LABELS)
        }
        assert pod["metadata"]["annotations"] == annotations


def test_an_adopted_driver_restores_from_what_its_container_got() -> None:
    """A variable of the operator's name that a manifest set (before the CRD reserved such
    names) comes first in the pod, the operator's last, which is what the container gets: an
    adopted driver's restore candidates are read from that one."""
    manifest, _ = _job()
    pod = _driver(restore=["checkpoint:7", "savepoint:2"])
    user_set = {"name": "SPARK_CHECKPOINT_RESTORE", "value": '["checkpoint:99"]'}
    pod["spec"]["containers"][0]["env"].insert(0, user_set)
    pods = PodRegistry()
    pods.observe("ADDED", pod)
    clients = SimpleNamespace(pods=pods, session=None)
    driver = KubernetesDriver(
        clients,
        manifest,
        name=pod["metadata"]["name"],
        token="t",
        executors=1,
        deployed_hash="",
        report=lambda notice: None,  # it is never terminated
    )

    assert driver.restore_candidates() == ["checkpoint:7", "savepoint:2"]


def test_an_adopted_drivers_candidates_are_read_as_written() -> None:
    """The pod holds them escaped for the kubelet (`$$`): read back so, an image's path no
    longer matched its entry, and a failed restore marked another (a reviewer's)."""
    manifest, _ = _job()
    external = "external:s3a://bucket/save$points/sp-3/_metadata"
    pod = _driver(restore=[external, "checkpoint:7"])
    pods = PodRegistry()
    pods.observe("ADDED", pod)
    driver = KubernetesDriver(
        SimpleNamespace(pods=pods, session=None),
        manifest,
        name=pod["metadata"]["name"],
        token="t",
        executors=1,
        deployed_hash="",
        report=lambda notice: None,
    )

    assert driver.restore_candidates() == [external, "checkpoint:7"]


def test_every_variable_the_operator_gives_its_pods_is_one_a_manifest_may_not_set() -> None:
    """The CRD's reserved names and the pods' own variables are one list: a variable the
    operator adds later without reserving it fails here."""
    manifest, document = _job()
    pods = [
        _driver(),
        objects.cleanup_pod(
            manifest,
            document,
            storage="s3a://b/c",
            command=RemoveLiveDirectory("orders"),
            live_claim=True,
            user_ids=objects.UserIds.IMAGE,
        ),
        objects.check_pod(
            manifest,
            document,
            storage="s3a://b/c",
            image="checkpoint:7",
            user_ids=objects.UserIds.IMAGE,
        ),
    ]
    from_the_manifest = {
        variable.name for variable in (*manifest.spec.driver_env, *manifest.spec.executor_env)
    }
    own = {
        variable["name"]
        for pod in pods
        for variable in pod["spec"]["containers"][0]["env"]
        if variable["name"] not in from_the_manifest
    }
    assert {"POD_IP", "PYSPARK_SUBMIT_ARGS", "SPARK_CHECKPOINT_RESTORE"} <= own
    for name in sorted(own):
        raw = yaml.safe_load((FIXTURES / "minimal-job.yaml").read_text())
        raw["spec"]["application"] = {**raw["spec"]["application"], "env": [{"name": name}]}
        with pytest.raises(ManifestError, match=r"env\[0\]\.name: is set by the operator"):
            validate_document(raw, "job.yaml")


@pytest.mark.parametrize("over", [0, 1])
def test_annotations_over_the_api_servers_limit_in_the_driver_pod_are_a_problem(
    over: int,
) -> None:
    """A security reviewer's: 262,000 bytes of driver annotations were a valid spec, and
    the job failed naming the pod. The driver pod carries the executors' template too."""

    def annotate(raw: dict[str, Any], value: str) -> None:
        raw["spec"]["driver"]["annotations"] = {"note": value}

    fits = objects.MAX_ANNOTATION_BYTES - _annotation_bytes(_driver(edit=lambda r: annotate(r, "")))
    driver = _driver(edit=lambda raw: annotate(raw, "x" * (fits + over)))
    manifest, _ = _job(edit=lambda raw: annotate(raw, "x" * (fits + over)))

    problems = objects.pod_problems(manifest)

    assert (_annotation_bytes(driver) > objects.MAX_ANNOTATION_BYTES) is (over == 1)
    assert [p for p in problems if "annotations" in p] == (
        [
            f"spec.driver.annotations: the driver pod's annotations would take "
            f"{objects.MAX_ANNOTATION_BYTES + 1} bytes, over Kubernetes' limit of 262144: "
            f"{len('note') + fits + 1} of them these, the rest the executors' pod template "
            "the operator puts there (spec.executor's volumes, volumeMounts and tolerations, "
            "the executors' pod template, and the operator's restricted security context)"
        ]
        if over
        else []
    )


@pytest.mark.parametrize("over", [0, 1])
def test_executor_annotations_over_the_api_servers_limit_are_a_problem(over: int) -> None:
    # Spark puts them on every executor pod (spark.kubernetes.executor.annotation.*), and
    # retries a refused one for ever.
    value = "x" * (objects.MAX_ANNOTATION_BYTES - len("note") + over)
    manifest = _manifest(executor={"annotations": {"note": value}})

    assert [p for p in objects.pod_problems(manifest) if "annotations" in p] == (
        [
            "spec.executor.annotations: 262145 bytes, over Kubernetes' limit of 262144 for a pod's "
            "annotations"
        ]
        if over
        else []
    )


def _annotation_bytes(pod: dict[str, Any]) -> int:
    """As the API server counts them (apimachinery's ValidateAnnotationsSize)."""
    annotations = pod["metadata"]["annotations"]
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


@pytest.mark.parametrize(
    ("name", "is_driver"),
    [
        ("orders-driver-1", True),
        ("orders-driver-12", True),
        ("orders-driver-01", False),
        ("orders-driver-\u00b2", False),  # a digit to isdigit(), not to int()
        ("orders-driver-", False),
        ("other-driver-1", False),
        ("orders-x-driver-1", False),
    ],
)
def test_only_the_jobs_own_driver_names_are_its_drivers(name: str, is_driver: bool) -> None:
    """An owner reference's name is anyone's text: it decides which pods are the job's."""
    assert objects.is_driver_pod_name("orders", name) is is_driver


@pytest.mark.parametrize(
    ("namespace", "spec", "fields"),
    [
        ("ops", {"driver": {"serviceAccount": "sco"}}, ["spec.driver.serviceAccount"]),
        ("ops", {"executor": {"serviceAccount": "sco"}}, ["spec.executor.serviceAccount"]),
        ("ops", {"driver": {"serviceAccount": "orders"}}, []),
        ("team-a", {"driver": {"serviceAccount": "sco"}}, []),  # another namespace's "sco"
        # The executors' account set through Spark (a reviewer's).
        (
            "ops",
            {"sparkConf": {"spark.kubernetes.authenticate.executor.serviceAccountName": "sco"}},
            [
                "spec.application.sparkConf[spark.kubernetes.authenticate.executor.serviceAccountName]"
            ],
        ),
    ],
)
def test_the_operators_own_service_account_is_refused_for_a_jobs_pods(
    namespace: str, spec: dict[str, Any], fields: list[str]
) -> None:
    manifest = dataclasses.replace(_manifest(**spec), namespace=namespace)
    operator = objects.ServiceAccount("ops", "sco")

    problems = objects.operator_account_problems(manifest, operator)

    assert [problem.partition(":")[0] for problem in problems] == fields
    assert objects.operator_account_problems(manifest, None) == []


def test_an_operator_running_as_its_namespaces_default_account_refuses_a_job_naming_none() -> None:
    """The driver's pods (and its cleanup and check pods) run as `default` unless named."""
    manifest = dataclasses.replace(_manifest(driver={}), namespace="ops")

    [problem] = objects.operator_account_problems(
        manifest, objects.ServiceAccount("ops", "default")
    )

    assert problem.startswith("spec.driver.serviceAccount: 'default' is the operator's own")


@pytest.mark.parametrize(
    ("pod_ip", "url"),
    [
        ("10.244.1.7", "http://10.244.1.7:8484"),
        ("fd00:10:244::7", "http://[fd00:10:244::7]:8484"),
    ],
)
def test_the_agents_url_spells_an_ipv6_pod_ip_in_brackets(pod_ip: str, url: str) -> None:
    """`http://fd00:10:244::7:8484` was no URL of the agent (a platform reviewer's): on a
    single-stack IPv6 cluster no checkpoint could be triggered."""
    assert objects.agent_url(pod_ip) == url


def test_an_agent_on_an_ipv6_address_answers_at_its_url(tmp_path: Path) -> None:
    """A real agent bound to an IPv6 address (as a driver binds to its pod's IP) answers
    the operator's client at the URL the operator makes of that address."""
    job = Running(tmp_path, host="::1")
    job.server.start()
    try:
        client = AgentClient(objects.agent_url("::1", job.port), TOKEN)
        status = asyncio.run(_closing(client, client.read_status()))
    finally:
        job.server.stop()
    assert status.query.state is QueryState.RUNNING


T = TypeVar("T")


async def _closing(client: AgentClient, call: Awaitable[T]) -> T:
    try:
        return await call
    finally:
        await client.close()
