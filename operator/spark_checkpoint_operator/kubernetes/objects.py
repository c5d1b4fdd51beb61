"""The Kubernetes objects the operator creates for a job, built from its manifest.

Pure functions: no API calls. The driver runs in Spark's client mode inside a pod the
operator creates itself (not through spark-submit's cluster mode): the operator then owns
the driver pod directly (owner reference, labels, the agent's token Secret mounted, one
pod name per attempt), the checkpoint agent lives in the driver's Python process where the
query is, and executors are still created by Spark, owned by the driver pod, so they go
when it goes.
"""

import enum
import hashlib
import ipaddress
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_checkpoint.janitor_commands import (
    JanitorCommand,
    VerifyRestorable,
    command_line,
    janitor_environment,
)
from spark_checkpoint.protocol import RestoreCandidate, StorageOwner
from spark_checkpoint.settings import AGENT_HOST_VARIABLE, PREFIX, DriverSettings
from spark_checkpoint.storage.layout import DNS_1123_LABEL_MAX_LENGTH, DNS_1123_LABEL_PATTERN
from spark_checkpoint_operator.driver_command import (
    TERMINATION_GRACE_SECONDS,
    driver_command,
    submit_arguments,
)
from spark_checkpoint_operator.manifest.model import EnvVar, JobManifest, RoleSpec, quantity_amount
from spark_checkpoint_operator.manifest.pod_template import MAIN_CONTAINER, merged
from spark_checkpoint_operator.manifest.validation import (
    PATTERN_HINTS,
    QUALIFIED_NAME_PATTERN,
    field_problems,
    go_regex,
)

GROUP = "sparkcheckpoint.io"
VERSION = "v1alpha1"
PLURAL = "sparkcheckpointjobs"
KIND = "SparkCheckpointJob"
SNAPSHOT_PLURAL = "sparkcheckpointsnapshots"

LABEL_JOB = "sparkcheckpoint.io/job"
LABEL_COMPONENT = "sparkcheckpoint.io/component"
LABEL_ATTEMPT = "sparkcheckpoint.io/attempt"
LABEL_SPARK_ROLE = "spark-role"  # Spark's own label on driver and executor pods
# What tells a driver from the job's other pods, besides its component: cleanup and check
# pods carry the driver's labels from spec.driver.labels, never with these keys (one with
# spark-role would be counted, waited for or deleted as a driver or an executor).
_DRIVER_ONLY_LABELS = (LABEL_SPARK_ROLE, LABEL_ATTEMPT)
ANNOTATION_SPEC_HASH = "sparkcheckpoint.io/deployment-hash"
# On the job: its last stable spec, and the state of its rollback (kubernetes/rollback.py).
ANNOTATION_STABLE_SPEC = "sparkcheckpoint.io/last-stable-spec"
ANNOTATION_ROLLBACK = "sparkcheckpoint.io/rollback"
DEPLOYMENT_HASH_LENGTH = 16
# Kubernetes' TotalAnnotationSizeLimitB: the keys and values of one object's annotations.
MAX_ANNOTATION_BYTES = 256 * 1024

DRIVER = "driver"
EXECUTOR = "executor"  # Spark's spark-role of executor pods
CLEANUP = "cleanup"
# Restorable checks only read storage: unlike cleanup pods, they need not be gone before a
# driver starts, and one under way is not deleted then (its restart waits for its verdict).
CHECK = "check"
CLEANUP_MEMORY_MIB = 256
# Kubernetes' default; the janitor's verify-restorable writes its report there.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"

AGENT_PORT = 8484
TOKEN_KEY = "token"
TOKEN_DIR = "/var/run/spark-checkpoint"
WORK_DIR = "/var/lib/spark-checkpoint/work"
TOKEN_VOLUME = "agent-token"
WORK_VOLUME = "checkpoint-work"
# Where a cleanup pod mounts the whole live volume claim (drivers mount only their directory).
LIVE_ROOT_DIR = "/var/lib/spark-checkpoint/live"
LIVE_VOLUME = "checkpoint-live"
# The executors' pod template (spark.kubernetes.executor.podTemplateFile): the driver pod
# carries it in an annotation, which a downwardAPI volume makes the driver's file.
ANNOTATION_EXECUTOR_TEMPLATE = "sparkcheckpoint.io/executor-pod-template"
EXECUTOR_TEMPLATE_VOLUME = "executor-pod-template"
EXECUTOR_TEMPLATE_DIR = "/etc/spark-checkpoint/executor"
EXECUTOR_TEMPLATE_FILE = "pod.json"
EXECUTOR_TEMPLATE_SETTING = "spark.kubernetes.executor.podTemplateFile"
# Spark's own name for the executor container: logs, dashboards and autoscalers know it.
EXECUTOR_CONTAINER = "spark-kubernetes-executor"
# What Spark adds to executor pods (its feature steps): its configuration, its local
# directories, the Hadoop configuration of spark.kubernetes.hadoop.configMapName, the
# Secrets of spark.kubernetes.executor.secrets.<name> (volume <name>-volume) and the
# volumes of spark.kubernetes.executor.volumes.<type>.<name>.*.
_SPARK_EXECUTOR_VOLUMES = {"spark-conf-volume-exec": "/opt/spark/conf"}
_SPARK_HADOOP_CONF_VOLUME = ("spark.kubernetes.hadoop.configMapName", "hadoop-properties")
_SPARK_HADOOP_CONF_DIR = "/opt/hadoop/conf"
_SPARK_LOCAL_DIR_VOLUME_PREFIX = "spark-local-dir-"
_SPARK_EXECUTOR_VOLUME_SETTING = re.compile(
    r"spark\.kubernetes\.executor\.volumes\.[^.]+\.([^.]+)\.mount\.path"
)
# Any setting of an executor volume: its name is the second word after "volumes".
_SPARK_EXECUTOR_VOLUME_ANY_SETTING = re.compile(
    r"spark\.kubernetes\.executor\.volumes\.[^.]+\.([^.]+)\..+"
)
_SPARK_EXECUTOR_SECRET_SETTING = re.compile(r"spark\.kubernetes\.executor\.secrets\.(.+)")
# Mounted Secrets are root-owned: their files are readable by this group (the spark
# image's user group) and the owner only.
FS_GROUP = 10001


class UserIds(enum.Enum):
    """Who chooses the user and group ids the job's pods run as (the operator's setting
    SPARK_CHECKPOINT_USER_IDS, the chart's `userIds`)."""

    # The image's user (10001), and fsGroup 10001 for the mounted Secrets: Kubernetes'
    # restricted Pod Security Standard.
    IMAGE = "image"
    # The platform's, from the namespace's range (OpenShift's restricted-v2 SCC refuses a
    # pod that sets an fsGroup or user outside it): the pods set none.
    PLATFORM = "platform"


# Python drivers need room outside the JVM heap (Spark's non-JVM overhead factor).
MEMORY_OVERHEAD_FACTOR = 0.4
MIN_MEMORY_OVERHEAD_MIB = 384

_RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
_RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def _pod_security(user_ids: UserIds) -> dict[str, Any]:
    if user_ids is UserIds.PLATFORM:
        return _RESTRICTED_POD
    return {**_RESTRICTED_POD, "fsGroup": FS_GROUP}


def driver_pod_name(job: str, attempt: int) -> str:
    """One name per attempt: a create that races a leftover pod of the same attempt fails
    with AlreadyExists instead of starting a second driver."""
    return f"{job}-driver-{attempt}"


def is_driver_pod_name(job: str, name: str) -> bool:
    prefix, _, attempt = name.rpartition("-driver-")
    # ASCII digits only: int() refuses other scripts' digits that isdigit() takes ("²").
    return (
        prefix == job
        and attempt.isascii()
        and attempt.isdigit()
        and driver_pod_name(job, int(attempt)) == name
    )


def token_secret_name(job: str) -> str:
    return f"{job}-agent-token"


def job_labels(manifest: JobManifest, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "spark-checkpoint",
        "app.kubernetes.io/instance": manifest.name,
        "app.kubernetes.io/managed-by": "spark-checkpoint-operator",
        LABEL_JOB: manifest.name,
        LABEL_COMPONENT: component,
    }


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """Makes the job's pods and Secret go with the job (garbage collection). Without
    blockOwnerDeletion: the operator's finalizer already holds the job until its pods are
    gone, and where the API server enforces owner references (OpenShift) setting it needs
    `update` on sparkcheckpointjobs/finalizers, which the operator has no other use for."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
    }


def storage_owner(manifest: JobManifest, job: Mapping[str, Any]) -> StorageOwner:
    """The registry of the job's snapshots, its status, as its storage records it: a job
    deleted and created again under its name is another registry (another uid)."""
    uid = job["metadata"]["uid"]
    return StorageOwner(
        id=uid, description=f"{KIND} {manifest.namespace}/{manifest.name} (uid {uid})"
    )


def deployment_hash(spec: Mapping[str, Any]) -> str:
    """What a running driver was built from: a change means savepoint, redeploy, restore.
    Checkpoint settings (but the pods' live volume), the trigger nonces and the desired
    state are not part of it; the restart nonce, the pull secrets and the pod template are
    (a change of any is an upgrade)."""
    deployed = {key: spec.get(key) for key in ("image", "imagePullPolicy", "application")}
    # An empty pod template is none: adding one is no upgrade.
    deployed |= {
        key: {k: v for k, v in role.items() if k != "podTemplate" or v}
        if isinstance(role := spec.get(key), Mapping)
        else role
        for key in ("driver", "executor")
    }
    # Only when set: the hash of every job that has none stays what it was.
    if claim := spec.get("checkpointing", {}).get("liveVolumeClaim"):
        deployed["liveVolumeClaim"] = claim
    if (nonce := spec.get("restartNonce")) is not None:
        deployed["restartNonce"] = nonce
    if secrets := spec.get("imagePullSecrets"):
        deployed["imagePullSecrets"] = secrets
    if template := spec.get("podTemplate"):
        deployed["podTemplate"] = template
    text = json.dumps(deployed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DEPLOYMENT_HASH_LENGTH]


def expected_executors(manifest: JobManifest) -> int:
    """Local-mode masters (single-pod jobs, the test kubelet) have no executor pods."""
    return manifest.spec.executor.instances if _cluster_master(manifest) else 0


def runs_executors(manifest: JobManifest) -> bool:
    """Whether executor pods may run: the expected ones, or those dynamic allocation adds
    (with ``instances: 0`` too)."""
    conf = manifest.spec.application.spark_conf
    dynamic = conf.get("spark.dynamicAllocation.enabled", "").strip().lower() == "true"
    return _cluster_master(manifest) and (manifest.spec.executor.instances > 0 or dynamic)


def _cluster_master(manifest: JobManifest) -> bool:
    master = manifest.spec.application.spark_conf.get("spark.master", "")
    return not master.startswith("local")


def token_secret(manifest: JobManifest, job: Mapping[str, Any], token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(manifest.name),
            "namespace": manifest.namespace,
            "labels": job_labels(manifest, "agent-token"),
            "ownerReferences": [owner_reference(job)],
        },
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def driver_pod(
    manifest: JobManifest,
    job: Mapping[str, Any],
    *,
    attempt: int,
    storage: str,
    restore: list[str],
    deployed_hash: str,
    user_ids: UserIds,
) -> dict[str, Any]:
    spec = manifest.spec
    name = driver_pod_name(manifest.name, attempt)
    settings = DriverSettings(
        namespace=manifest.namespace,
        job=manifest.name,
        storage_root=storage,
        work_dir=Path(WORK_DIR),
        agent_host=POD_IP,
        agent_port=AGENT_PORT,
        token="",  # never in the pod spec: the driver reads the mounted Secret
        attempt=attempt,
        restore_candidates=tuple(RestoreCandidate.decode(c) for c in restore),
        owner=storage_owner(manifest, job),
    )
    memory_mib = spec.driver.memory_mib
    user_conf = spec.application.spark_conf
    spark_conf = {
        **{
            # The job's env values for the executors are expanded here, as the driver's
            # own are: the executors' pods define no POD_* variables, nor in this order.
            key: value if key.startswith(_EXECUTOR_ENV_SETTING) else _literal(value)
            for key, value in {
                **_spark_defaults(manifest, name),
                **_live_volume_conf(manifest, job),
                **user_conf,
            }.items()
        },
        **{key: POD_IP for key in _POD_IP_SETTINGS if key not in user_conf},
    }
    environment = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_IP", "status.podIP"),
        *_env(spec.driver_env),
        *(
            {"name": key, "value": value if key == AGENT_HOST_VARIABLE else _literal(value)}
            for key, value in settings.to_environment(
                Path(TOKEN_DIR, TOKEN_KEY), Path(TERMINATION_MESSAGE_PATH)
            ).items()
        ),
        {"name": "PYSPARK_SUBMIT_ARGS", "value": submit_arguments(spark_conf)},
    ]
    labels = {
        **spec.driver.labels,
        **job_labels(manifest, DRIVER),
        LABEL_SPARK_ROLE: DRIVER,
        LABEL_ATTEMPT: str(attempt),
    }
    container = {
        "name": "driver",
        "command": [_literal(part) for part in driver_command(spec.application)],
        "env": environment,
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "resources": _resources(spec.driver, memory_mib + _overhead_mib(memory_mib)),
        "volumeMounts": [
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
            {"name": WORK_VOLUME, "mountPath": WORK_DIR, **_live_sub_path(manifest, job)},
            {
                "name": EXECUTOR_TEMPLATE_VOLUME,
                "mountPath": EXECUTOR_TEMPLATE_DIR,
                "readOnly": True,
            },
            *spec.driver.volume_mounts,
        ],
    }
    return _pod(
        manifest,
        job,
        name=name,
        labels=labels,
        annotations=_driver_annotations(manifest, deployed_hash, user_ids),
        role=spec.driver,
        user_ids=user_ids,
        container=container,
        volumes=[
            {
                "name": TOKEN_VOLUME,
                "secret": {
                    "secretName": token_secret_name(manifest.name),
                    # Group-readable: the pod's fsGroup (ours or the platform's) lets the
                    # non-root driver read it.
                    "defaultMode": 0o440,
                },
            },
            {"name": WORK_VOLUME, **_work_volume_source(manifest)},
            {
                "name": EXECUTOR_TEMPLATE_VOLUME,
                "downwardAPI": {
                    "items": [
                        {
                            "path": EXECUTOR_TEMPLATE_FILE,
                            "fieldRef": {
                                "fieldPath": _annotation_path(ANNOTATION_EXECUTOR_TEMPLATE)
                            },
                        }
                    ]
                },
            },
            *spec.driver.volumes,
        ],
    )


def executor_pod_template(manifest: JobManifest, user_ids: UserIds) -> dict[str, Any]:
    """What Spark's settings cannot say about executor pods, as the template Spark builds
    each one from: the manifest's tolerations, volumes and mounts, and the restricted
    security context of the operator's own pods, over the job's executor pod template.
    Spark keeps these and adds its own (name, image, resources, labels, annotations, env,
    its volumes and the live claim's)."""
    executor = manifest.spec.executor
    container = {
        "name": EXECUTOR_CONTAINER,
        "securityContext": _RESTRICTED_CONTAINER,
        "volumeMounts": list(executor.volume_mounts),
    }
    pod_spec: dict[str, Any] = {
        "securityContext": _pod_security(user_ids),
        "containers": [container],
        "volumes": list(executor.volumes),
    }
    if executor.tolerations:
        pod_spec["tolerations"] = list(executor.tolerations)
    own = _plain({"apiVersion": "v1", "kind": "Pod", "spec": pod_spec})
    return _over_template(manifest.spec.executor_pod_template, EXECUTOR_CONTAINER, own)


def _driver_annotations(
    manifest: JobManifest, deployed_hash: str, user_ids: UserIds
) -> dict[str, str]:
    template = json.dumps(
        executor_pod_template(manifest, user_ids), sort_keys=True, separators=(",", ":")
    )
    return {
        **manifest.spec.driver.annotations,
        ANNOTATION_SPEC_HASH: deployed_hash,
        ANNOTATION_EXECUTOR_TEMPLATE: template,
    }


def annotation_bytes(annotations: Mapping[str, str]) -> int:
    """As the API server counts them against MAX_ANNOTATION_BYTES."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in annotations.items())


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    namespace: str
    name: str


def operator_account_problems(manifest: JobManifest, operator: ServiceAccount | None) -> list[str]:
    """The operator's own service account named for the job's pods (the driver's, which
    its cleanup and check pods use too, is the namespace's `default` unless named): the
    job's code would hold the operator's token, and with it every job's status and the
    Secrets of every namespace the operator serves."""
    if operator is None or manifest.namespace != operator.namespace:
        return []
    conf = manifest.spec.application.spark_conf
    accounts = [
        ("spec.driver.serviceAccount", manifest.spec.driver.service_account or "default"),
        ("spec.executor.serviceAccount", manifest.spec.executor.service_account),
        # What Spark's executors would run as, which sparkConf may set too.
        *(
            (f"spec.application.sparkConf[{key}]", conf.get(key))
            for key in (
                "spark.kubernetes.authenticate.executor.serviceAccountName",
                "spark.kubernetes.authenticate.driver.serviceAccountName",
            )
        ),
    ]
    return [
        f"{field}: {account!r} is the operator's own service account (namespace "
        f"{operator.namespace}), which a job's pods may not use: give the job one of its own"
        for field, account in accounts
        if account == operator.name
    ]


def pod_problems(manifest: JobManifest) -> list[str]:
    """What the API server would refuse in the pods built from the manifest (the executors'
    only once Spark creates them, which it retries for ever), each naming its field: a
    volume's or mount path's clash with the operator's or Spark's own, a mount of no
    volume, executor fields a sparkConf pod template would drop, and labels and settings
    of the executors that are the operator's."""
    spec = manifest.spec
    problems = []
    executor_fields = (
        ("tolerations", spec.executor.tolerations),
        ("volumes", spec.executor.volumes),
        ("volumeMounts", spec.executor.volume_mounts),
    )
    dropped = next((field for field, value in executor_fields if value), None)
    if EXECUTOR_TEMPLATE_SETTING in spec.application.spark_conf and dropped is not None:
        problems.append(
            f"spec.executor.{dropped}: not applied with sparkConf "
            f"{EXECUTOR_TEMPLATE_SETTING}, whose template replaces the operator's; put "
            "tolerations, volumes and volumeMounts in that template"
        )
    if EXECUTOR_TEMPLATE_SETTING in spec.application.spark_conf:
        problems += [
            f"{field}: not applied to the executors with sparkConf {EXECUTOR_TEMPLATE_SETTING}, "
            "whose template replaces the operator's"
            + (
                ": put it in spec.driver.podTemplate and that template"
                if field == "spec.podTemplate"
                else ""
            )
            for field, template in spec.pod_templates
            if template and field != "spec.driver.podTemplate"
        ]
    conf = spec.application.spark_conf
    job_own = job_labels(manifest, EXECUTOR)
    problems += [
        f"spec.executor.labels: {key!r} is a label the operator sets"
        for key in spec.executor.labels
        if key in job_own
    ]
    problems += [
        f"spec.application.sparkConf: {key} is set by the operator"
        for key in conf
        if key in _OPERATOR_SPARK_SETTINGS
        or (
            key.startswith(_EXECUTOR_LABEL_SETTING)
            and key[len(_EXECUTOR_LABEL_SETTING) :] in job_own
        )
        # The executors' live volume (`_live_volume_conf`): another claim or subPath would
        # put their state where the driver's agent never snapshots it, or in another job's
        # directory of a shared claim (the hostile reviewer's).
        or (
            (volume := _SPARK_EXECUTOR_VOLUME_ANY_SETTING.fullmatch(key)) is not None
            and volume[1] == WORK_VOLUME
        )
    ]
    executor_own = dict(_SPARK_EXECUTOR_VOLUMES)
    for key, value in conf.items():
        if match := _SPARK_EXECUTOR_VOLUME_SETTING.fullmatch(key):
            executor_own[match[1]] = value
        elif match := _SPARK_EXECUTOR_SECRET_SETTING.fullmatch(key):
            executor_own[f"{match[1]}-volume"] = value
    if _SPARK_HADOOP_CONF_VOLUME[0] in conf:
        executor_own[_SPARK_HADOOP_CONF_VOLUME[1]] = _SPARK_HADOOP_CONF_DIR
    if spec.checkpointing.live_volume_claim:
        executor_own[WORK_VOLUME] = WORK_DIR
    driver_own = {TOKEN_VOLUME: TOKEN_DIR, WORK_VOLUME: WORK_DIR, LIVE_VOLUME: LIVE_ROOT_DIR}
    driver_own[EXECUTOR_TEMPLATE_VOLUME] = EXECUTOR_TEMPLATE_DIR
    for role, own, role_spec in (
        (DRIVER, driver_own, spec.driver),
        (EXECUTOR, executor_own, spec.executor),
    ):
        template = _role_template(manifest, role)
        volumes = [
            *((f"spec.{role}.volumes[{i}]", v) for i, v in enumerate(role_spec.volumes)),
            *(
                (_volume_at(manifest, role, volume), volume)
                for volume in _items(template.get("spec"), "volumes")
            ),
        ]
        mounts = [
            *((f"spec.{role}.volumeMounts[{i}]", m) for i, m in enumerate(role_spec.volume_mounts)),
            *(
                (_item_at(manifest, role, ("containers", MAIN_CONTAINER), "volumeMounts", m), m)
                for container in _items(template.get("spec"), "containers")
                if _is_main(container)
                for m in _items(container, "volumeMounts")
            ),
        ]
        others = [
            (_item_at(manifest, role, (group, container.get("name")), "volumeMounts", m), m)
            for group, container in _sidecars(template)
            for m in _items(container, "volumeMounts")
        ]
        where = " nor ".join(
            [
                f"spec.{role}.volumes",
                *(f"{field}.spec.volumes" for field, _ in _role_templates(manifest, role)),
            ]
        )
        problems += _volume_problems(role, own, volumes, mounts, other_mounts=others, where=where)
    problems += _template_problems(manifest)
    # The driver pod's annotations hold the executors' pod template (their volumes, mounts
    # and tolerations) besides the driver's own; the larger of the two templates (with an
    # fsGroup), so that a spec is valid whatever the setting.
    templated = _template_annotations(spec.driver_pod_template)
    driver_bytes = annotation_bytes(
        {**templated, **_driver_annotations(manifest, "0" * DEPLOYMENT_HASH_LENGTH, UserIds.IMAGE)}
    )
    if driver_bytes > MAX_ANNOTATION_BYTES:
        drivers = annotation_bytes({**templated, **spec.driver.annotations})
        problems.append(
            f"spec.driver.annotations: the driver pod's annotations would take {driver_bytes} "
            f"bytes, over Kubernetes' limit of {MAX_ANNOTATION_BYTES}: {drivers} of them "
            + ("these and its pod templates'" if templated else "these")
            + ", the rest the executors' pod template the operator puts there "
            "(spec.executor's volumes, volumeMounts and tolerations, the executors' pod "
            "template, and the operator's restricted security context)"
        )
    executors = annotation_bytes(
        {**_template_annotations(spec.executor_pod_template), **spec.executor.annotations}
    )
    if executors > MAX_ANNOTATION_BYTES:
        problems.append(
            f"spec.executor.annotations: {executors} bytes, over Kubernetes' limit of "
            f"{MAX_ANNOTATION_BYTES} for a pod's annotations"
        )
    qualified_name = go_regex(QUALIFIED_NAME_PATTERN)
    for role_name, role_spec in (("driver", spec.driver), ("executor", spec.executor)):
        for field, keyed in (
            ("labels", role_spec.labels),
            ("annotations", role_spec.annotations),
            ("nodeSelector", role_spec.node_selector),
        ):
            # The API server judges annotation keys lowercased (Example.com/owner is one).
            judged = str.lower if field == "annotations" else str
            problems += [
                f"spec.{role_name}.{field}: {key!r} is not {PATTERN_HINTS[QUALIFIED_NAME_PATTERN]}"
                for key in keyed
                if not qualified_name.search(judged(key))
            ]
    # Each once: spec.podTemplate's are checked for the driver's pods and the executors'.
    return list(dict.fromkeys(problems))


def _volume_problems(
    role: str,
    own: Mapping[str, str],
    volumes: list[tuple[str, Mapping[str, Any]]],
    mounts: list[tuple[str, Mapping[str, Any]]],
    *,
    other_mounts: list[tuple[str, Mapping[str, Any]]],
    where: str,
) -> list[str]:
    """``own``: the volumes (name: mount path) the operator or Spark adds to the role's
    pods; ``volumes``, ``mounts`` (of the pod's own container) and ``other_mounts`` (of a
    pod template's other containers): the spec's, each with its field; ``where`` the
    spec's volumes are."""
    problems = []
    taken_paths = {_mount_point(path) for path in own.values()}
    names: dict[str, str] = {}  # each name's first field
    label = go_regex(DNS_1123_LABEL_PATTERN)
    for field, volume in volumes:
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{field}.name: required")
        elif name in names:
            problems.append(f"{field}.name: {name!r} names two volumes (and {names[name]})")
        elif name in own or (role == EXECUTOR and name.startswith(_SPARK_LOCAL_DIR_VOLUME_PREFIX)):
            problems.append(f"{field}.name: {name!r} is a volume the operator or Spark adds")
        elif not label.search(name) or len(name) > DNS_1123_LABEL_MAX_LENGTH:
            problems.append(
                f"{field}.name: {name!r} is not {PATTERN_HINTS[DNS_1123_LABEL_PATTERN]}"
            )
        names.setdefault(str(name), field)
    paths: set[str] = set()
    for field, mount, in_own_container in [
        *((field, mount, True) for field, mount in mounts),
        *((field, mount, False) for field, mount in other_mounts),
    ]:
        name, path = mount.get("name"), mount.get("mountPath")
        if not isinstance(name, str) or not name:
            problems.append(f"{field}.name: required")
        elif role == DRIVER and name in own:
            # Cleanup and check pods take the driver's volumes and mounts, not these.
            problems.append(
                f"{field}.name: {name!r} is a volume the operator adds to the driver pod "
                "alone (the job's cleanup and check pods, which take the driver's volumes "
                "and mounts, have none of that name)"
            )
        elif name not in names and name not in own:
            problems.append(f"{field}.name: {name!r} is not in {where}")
        if not isinstance(path, str) or not path.startswith("/"):
            problems.append(f"{field}.mountPath: an absolute path is required")
            continue
        if not in_own_container:
            continue  # the pod's own container's paths are free in another
        point = _mount_point(path)
        if point in paths:
            problems.append(f"{field}.mountPath: {path!r} mounts two volumes")
        elif taken := next((t for t in taken_paths if f"{point}/".startswith(f"{t}/")), None):
            problems.append(
                f"{field}.mountPath: {path!r} is where the operator or Spark mounts"
                + ("" if point == taken else f" ({taken}), or inside it")
            )
        paths.add(point)
    return problems


def _mount_point(path: str) -> str:
    """Where the container runtime mounts ``path`` (``/a//b/./`` is ``/a/b``)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def cleanup_pod(
    manifest: JobManifest,
    job: Mapping[str, Any],
    *,
    storage: str,
    command: JanitorCommand,
    user_ids: UserIds,
    live_claim: bool = False,
) -> dict[str, Any]:
    """A short pod that changes storage while no driver runs. It has the driver's service
    account, environment, volumes, labels and annotations, which is where storage
    credentials live; the operator itself has none. With ``live_claim``, the job's live
    volume claim is mounted whole at LIVE_ROOT_DIR (to remove the job's directory there)."""
    spec = manifest.spec
    environment: list[dict[str, Any]] = []
    mounts, volumes = [], []
    if live_claim:
        environment.append({"name": f"{PREFIX}LIVE_ROOT", "value": LIVE_ROOT_DIR})
        mounts.append({"name": LIVE_VOLUME, "mountPath": LIVE_ROOT_DIR})
        volumes.append({"name": LIVE_VOLUME, **_work_volume_source(manifest)})
    return _janitor_pod(
        manifest,
        job,
        storage=storage,
        command=command,
        user_ids=user_ids,
        component=CLEANUP,
        resources=_resources(spec.driver, CLEANUP_MEMORY_MIB),
        environment=environment,
        mounts=mounts,
        volumes=volumes,
    )


def check_pod(
    manifest: JobManifest, job: Mapping[str, Any], *, storage: str, image: str, user_ids: UserIds
) -> dict[str, Any]:
    """The restorable check of ``image`` (``kind:id``): Spark reads the image as a restart
    would, in a pod shaped like a cleanup pod (the job's image and credentials) with the
    driver's cores and memory and the application's sparkConf (jars, JVM options, state
    store settings; the check runs Spark in local mode), since it loads the image's state
    as the restored driver does. The verdict is the container's termination message."""
    spec = manifest.spec
    memory_mib = spec.driver.memory_mib
    settings = {"spark.driver.memory": f"{memory_mib}m", **spec.application.spark_conf}
    submit = submit_arguments({key: _literal(value) for key, value in settings.items()})
    return _janitor_pod(
        manifest,
        job,
        storage=storage,
        command=VerifyRestorable(image, report=TERMINATION_MESSAGE_PATH),
        user_ids=user_ids,
        component=CHECK,
        resources=_resources(spec.driver, memory_mib + _overhead_mib(memory_mib)),
        environment=[{"name": "PYSPARK_SUBMIT_ARGS", "value": submit}],
        mounts=[],
        volumes=[],
    )


def _janitor_pod(
    manifest: JobManifest,
    job: Mapping[str, Any],
    *,
    storage: str,
    command: JanitorCommand,
    user_ids: UserIds,
    component: str,
    resources: dict[str, Any],
    environment: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
) -> dict[str, Any]:
    """A pod that runs the janitor with the driver's service account, environment, volumes,
    labels and annotations (and the ones given), since that is where storage credentials
    live (Azure Workload Identity, say, reaches only pods with its label); the job's own
    labels win over the driver's. The job comes from its environment."""
    spec = manifest.spec
    drivers = {k: v for k, v in spec.driver.labels.items() if k not in _DRIVER_ONLY_LABELS}
    labels = {**drivers, **job_labels(manifest, component)}
    container = {
        "name": component,
        "command": [_literal(part) for part in command_line(command)],
        "env": [
            *_env(spec.driver_env),
            *(
                {"name": name, "value": _literal(value)}
                for name, value in janitor_environment(
                    manifest.namespace, manifest.name, storage, storage_owner(manifest, job)
                ).items()
            ),
            *environment,
        ],
        "resources": resources,
        "volumeMounts": [*spec.driver.volume_mounts, *mounts],
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
    }
    pod = _pod(
        manifest,
        job,
        name=None,
        generate_name=f"{manifest.name}-{component}-",
        labels=labels,
        annotations=spec.driver.annotations,
        role=spec.driver,
        user_ids=user_ids,
        container=container,
        volumes=[*spec.driver.volumes, *volumes],
    )
    # It reaches storage only, never the API server: no service-account token to steal.
    # (Workload identities of AWS and Azure project tokens of their own audience.)
    pod["spec"]["automountServiceAccountToken"] = False
    return pod


def _pod(
    manifest: JobManifest,
    job: Mapping[str, Any],
    *,
    name: str | None,
    generate_name: str | None = None,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    role: RoleSpec,
    user_ids: UserIds,
    container: dict[str, Any],
    volumes: list[Any],
) -> dict[str, Any]:
    """A pod of the job's image: restricted, never restarted by the kubelet (the
    supervisor decides about restarts), its container's last log lines as the reason it
    failed."""
    container = {
        **container,
        "image": manifest.spec.image,
        "securityContext": _RESTRICTED_CONTAINER,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if manifest.spec.image_pull_policy is not None:
        container["imagePullPolicy"] = manifest.spec.image_pull_policy.value
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": _pod_security(user_ids),
        "containers": [container],
        "volumes": volumes,
    }
    if manifest.spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in manifest.spec.image_pull_secrets]
    if role.service_account:
        pod_spec["serviceAccountName"] = role.service_account
    if role.node_selector:
        pod_spec["nodeSelector"] = dict(role.node_selector)
    if role.tolerations:
        pod_spec["tolerations"] = list(role.tolerations)
    own: dict[str, Any] = _plain(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": manifest.namespace,
                "labels": dict(labels),
                "annotations": dict(annotations),
                "ownerReferences": [owner_reference(job)],
            },
            "spec": pod_spec,
        }
    )
    if name is not None:
        own["metadata"]["name"] = name
    if generate_name is not None:
        own["metadata"]["generateName"] = generate_name
    return _over_template(manifest.spec.driver_pod_template, container["name"], own)


def _over_template(
    template: Mapping[str, Any], own_container: str, pod: dict[str, Any]
) -> dict[str, Any]:
    """``pod`` over the job's pod ``template`` (`merged`: what the operator sets wins),
    the template's MAIN_CONTAINER as the pod's own, which stays the first container
    (``kubectl logs`` shows it)."""
    spec = dict(template.get("spec") or {})
    spec["containers"] = [
        {**container, "name": own_container} if _is_main(container) else container
        for container in _items(template.get("spec"), "containers")
    ]
    base = {"metadata": template.get("metadata") or {}, "spec": spec}
    built: dict[str, Any] = merged(base, pod)
    built["spec"]["containers"].sort(key=lambda container: container["name"] != own_container)
    return built


def _items(holder: Any, key: str) -> list[Mapping[str, Any]]:
    """The objects of the list ``holder[key]`` (a template's spec, a container); a value of
    another type is a problem `typed_object_problems` names, and none here."""
    items = holder.get(key) if isinstance(holder, Mapping) else None
    return [item for item in items if isinstance(item, Mapping)] if isinstance(items, list) else []


def _template_annotations(template: Mapping[str, Any]) -> dict[str, str]:
    return dict((template.get("metadata") or {}).get("annotations") or {})


def _is_main(container: Mapping[str, Any]) -> bool:
    return container.get("name") == MAIN_CONTAINER


def _sidecars(template: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The template's containers besides the pod's own, and its init containers, each
    with its group."""
    return [
        (group, container)
        for group in ("containers", "initContainers")
        for container in _items(template.get("spec"), group)
        if not (group == "containers" and _is_main(container))
    ]


def _role_templates(manifest: JobManifest, role: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The pod templates set for ``role`` (DRIVER: its cleanup and check pods too): the
    common one, then the role's."""
    fields = ("spec.podTemplate", f"spec.{role}.podTemplate")
    return [(field, t) for field, t in manifest.spec.pod_templates if t and field in fields]


def _role_template(manifest: JobManifest, role: str) -> dict[str, Any]:
    """The role's template merged over the common one: what its pods are built over."""
    spec = manifest.spec
    return spec.driver_pod_template if role == DRIVER else spec.executor_pod_template


def _volume_at(manifest: JobManifest, role: str, volume: Mapping[str, Any]) -> str:
    """The field of the first of the role's templates listing ``volume``."""
    return next(
        f"{field}.spec.volumes[{i}]"
        for field, template in _role_templates(manifest, role)
        for i, listed in enumerate(_items(template.get("spec"), "volumes"))
        if listed == volume
    )


def _containers_at(
    manifest: JobManifest, role: str, group: str, name: Any
) -> list[tuple[str, Mapping[str, Any]]]:
    """Each of the role's templates' containers of ``group`` named ``name``, with its field."""
    return [
        (f"{field}.spec.{group}[{i}]", container)
        for field, template in _role_templates(manifest, role)
        for i, container in enumerate(_items(template.get("spec"), group))
        if container.get("name") == name
    ]


def _item_at(
    manifest: JobManifest,
    role: str,
    container: tuple[str, Any],
    key: str,
    item: Mapping[str, Any],
) -> str:
    """The field of the first listing of ``item`` in the list ``key`` of the role's
    templates' ``container`` (its group and name)."""
    return next(
        f"{place}.{key}[{i}]"
        for place, listing in _containers_at(manifest, role, *container)
        for i, listed in enumerate(_items(listing, key))
        if listed == item
    )


# The pod's own container's fields the operator (or Spark) sets, and whence.
_OWN_CONTAINER_FIELDS = {
    "image": "from spec.image",
    "imagePullPolicy": "from spec.imagePullPolicy",
    "command": "from spec.application",
    "args": "from spec.application",
    "terminationMessagePath": "(where the driver reports its error)",
    "terminationMessagePolicy": "(how the driver reports its error)",
}
# What the operator and Spark name the pods' own containers, and their ports.
_OWN_CONTAINER_NAMES = frozenset({DRIVER, CLEANUP, CHECK, EXECUTOR_CONTAINER})
_FLINK_MAIN_CONTAINER = "flink-main-container"  # what a Flink user's template names it
_OWN_PORT_NAMES = frozenset({"agent", "blockmanager"})
_OWN_ANNOTATIONS = frozenset({ANNOTATION_SPEC_HASH, ANNOTATION_EXECUTOR_TEMPLATE})
# Pod fields the spec says otherwise, or that would undo what the operator's pods promise
# (the agent reachable only as its NetworkPolicy says, no API token in cleanup pods).
_REFUSED_POD_FIELDS = {
    "serviceAccountName": "set by spec.driver.serviceAccount and spec.executor.serviceAccount",
    "serviceAccount": "set by spec.driver.serviceAccount and spec.executor.serviceAccount",
    "automountServiceAccountToken": "set by the operator",
    "hostNetwork": "the job's pods run in their own network namespace",
    "hostPID": "the job's pods run in their own process namespace",
    "hostIPC": "the job's pods run in their own IPC namespace",
    "ephemeralContainers": "the API server takes none as a pod is created",
    "restartPolicy": "set by the operator (Never: the operator restarts a driver)",
    "terminationGracePeriodSeconds": "set by the operator (the time a driver has to stop)",
}
# What a template may add to the operator's restricted security contexts: the rest is the
# operator's, or would loosen them.
_POD_CONTEXT_KEYS = frozenset(
    {
        "runAsUser",
        "runAsGroup",
        "fsGroup",
        "fsGroupChangePolicy",
        "supplementalGroups",
        "supplementalGroupsPolicy",
        "sysctls",
    }
)
_CONTAINER_CONTEXT_KEYS = frozenset({"runAsUser", "runAsGroup", "readOnlyRootFilesystem"})


def _context_problems(
    field: str, context: Any, restricted: Mapping[str, Any], allowed: frozenset[str]
) -> list[str]:
    """A template's security context over the operator's ``restricted`` one: only the
    ``allowed`` keys (a user other than root), or the operator's own values."""
    if not isinstance(context, Mapping):
        return []
    problems = []
    for key, value in context.items():
        if key in restricted:
            if value != restricted[key]:
                problems.append(f"{field}.{key}: set by the operator ({restricted[key]!r})")
        elif key not in allowed:
            problems.append(
                f"{field}.{key}: not in the operator's restricted security context (a template "
                f"may add {', '.join(sorted(allowed))})"
            )
        elif key == "runAsUser" and value == 0 and not isinstance(value, bool):
            problems.append(f"{field}.{key}: the job's pods run as a non-root user")
    return problems


def _template_problems(manifest: JobManifest) -> list[str]:
    """What a pod template may not say, each problem naming its field: the pod's own
    container by another name, or what the operator sets of it; pod fields the spec says
    or that would loosen the operator's pods; labels and annotations the operator sets;
    and, in the pods built over the templates, what the API server would refuse."""
    problems = []
    operator_labels = {*job_labels(manifest, DRIVER), *_DRIVER_ONLY_LABELS}
    qualified_name, hint = go_regex(QUALIFIED_NAME_PATTERN), PATTERN_HINTS[QUALIFIED_NAME_PATTERN]
    for field, template in manifest.spec.pod_templates:
        spec = template.get("spec") or {}
        problems += [
            f"{field}.spec.{key}: {why}" for key, why in _REFUSED_POD_FIELDS.items() if key in spec
        ]
        problems += _context_problems(
            f"{field}.spec.securityContext",
            spec.get("securityContext"),
            _RESTRICTED_POD,
            _POD_CONTEXT_KEYS,
        )
        for group in ("containers", "initContainers"):
            for index, container in enumerate(_items(spec, group)):
                at, name = f"{field}.spec.{group}[{index}]", container.get("name")
                if name in _OWN_CONTAINER_NAMES:
                    problems.append(
                        f"{at}.name: {name!r} is what the operator names a pod's own "
                        f"container: a pod template names it {MAIN_CONTAINER}"
                    )
                elif name == _FLINK_MAIN_CONTAINER:
                    problems.append(
                        f"{at}.name: {_FLINK_MAIN_CONTAINER} is Flink's name of the pod's own "
                        f"container: here it is {MAIN_CONTAINER}"
                    )
                elif _is_main(container) and group == "initContainers":
                    problems.append(
                        f"{at}.name: {MAIN_CONTAINER} is the pod's own container, not an "
                        "init container"
                    )
                elif _is_main(container):
                    problems += _own_container_problems(at, container)
                else:
                    problems += _sidecar_context_problems(at, container)
        metadata = template.get("metadata") or {}
        for key in metadata.get("labels") or {}:
            if key in operator_labels:
                problems.append(f"{field}.metadata.labels: {key!r} is a label the operator sets")
            elif not qualified_name.search(key):
                problems.append(f"{field}.metadata.labels: {key!r} is not {hint}")
        for key in metadata.get("annotations") or {}:
            if key in _OWN_ANNOTATIONS:
                problems.append(
                    f"{field}.metadata.annotations: {key!r} is an annotation the operator sets"
                )
            elif not qualified_name.search(key.lower()):  # as the API server judges them
                problems.append(f"{field}.metadata.annotations: {key!r} is not {hint}")
    for role in (DRIVER, EXECUTOR):
        problems += _built_container_problems(manifest, role)
    return problems


def _sidecar_context_problems(at: str, container: Mapping[str, Any]) -> list[str]:
    """A container beside the pod's own runs as the pod does: not as root (the kubelet
    would never start it under the pod's runAsNonRoot), not privileged."""
    context = container.get("securityContext")
    if not isinstance(context, Mapping):
        return []
    return [
        f"{at}.securityContext.{key}: the job's pods run {what}"
        for key, value, what in (
            ("runAsUser", 0, "as a non-root user"),
            ("runAsNonRoot", False, "as a non-root user"),
            ("privileged", True, "unprivileged"),
        )
        if key in context and context[key] == value and type(context[key]) is type(value)
    ]


def _own_container_problems(at: str, container: Mapping[str, Any]) -> list[str]:
    """What a template may not say of the pod's own container (at ``at``)."""
    problems = [
        f"{at}.{key}: set by the operator {whence}"
        for key, whence in _OWN_CONTAINER_FIELDS.items()
        if key in container
    ]
    resources = container.get("resources")
    for kind in ("requests", "limits"):
        given = resources.get(kind) if isinstance(resources, Mapping) else None
        problems += [
            f"{at}.resources.{kind}.{name}: set by the operator from the role's cores and "
            "memory (spec.driver, spec.executor)"
            for name in ("cpu", "memory")
            if isinstance(given, Mapping) and name in given
        ]
    problems += [
        f"{at}.ports[{i}]: {port.get('name')!r} ({port.get('containerPort')}) is a port the "
        "operator or Spark gives the pod's own container"
        for i, port in enumerate(_items(container, "ports"))
        if port.get("name") in _OWN_PORT_NAMES or port.get("containerPort") == AGENT_PORT
    ]
    problems += _context_problems(
        f"{at}.securityContext",
        container.get("securityContext"),
        _RESTRICTED_CONTAINER,
        _CONTAINER_CONTEXT_KEYS,
    )
    # The variables the operator sets, by the rule the spec's env is held to.
    problems += [
        f"{at}.env[{i}].name: {problem.message}"
        for i, variable in enumerate(_items(container, "env"))
        for problem in field_problems(
            ("spec", "application", "env"), [{"name": variable.get("name")}]
        )
        if problem.path == "[0].name"
    ]
    return problems


def _built_container_problems(manifest: JobManifest, role: str) -> list[str]:
    """What the API server would refuse in the containers of the role's pods as the
    templates build them (merged by name), each named where a template lists it: a name
    used twice, a container without an image (only the pod's own has the job's), one
    that is not an init container with a restart policy, two mounts at one path, two
    ports of one name or number, a variable with both a value and a source."""
    template = _role_template(manifest, role)
    problems = []
    seen: set[Any] = set()
    for group in ("containers", "initContainers"):
        for container in _items(template.get("spec"), group):
            name = container.get("name")
            places = _containers_at(manifest, role, group, name)
            listed = places[0][0] if places else f"spec.{role}.podTemplate"
            if not isinstance(name, str) or name in seen:
                problems.append(
                    f"{listed}.name: the {role} pods would have two containers named {name!r}"
                )
            seen.add(name if isinstance(name, str) else repr(name))
            if name in _OWN_CONTAINER_NAMES or name == _FLINK_MAIN_CONTAINER:
                continue  # misnamed: said of the template
            own = group == "containers" and _is_main(container)
            image = container.get("image")
            if not own and not (isinstance(image, str) and image):
                problems.append(
                    f"{listed}.image: required for {name!r} (only the pod's own container "
                    "has the job's)"
                )
            problems += _extended_resource_problems(places, container)
            if group == "containers" and "restartPolicy" in container:
                setting = next(place for place, c in places if "restartPolicy" in c)
                problems.append(f"{setting}.restartPolicy: only an init container may have one")
            problems += _list_problems(manifest, role, (group, name), container, own)
    return problems


# Resources Kubernetes overcommits: any other (a GPU, huge pages) needs a limit of the
# amount it requests.
_OVERCOMMITTED = frozenset({"cpu", "memory", "ephemeral-storage"})


def _extended_resource_problems(
    places: list[tuple[str, Mapping[str, Any]]], container: Mapping[str, Any]
) -> list[str]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return []
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    problems = []
    for name, request in requests.items():
        limit = limits.get(name)
        if name in _OVERCOMMITTED or (
            limit is not None and quantity_amount(limit) == quantity_amount(request)
        ):
            continue
        setting = next(
            (
                place
                for place, c in places
                if name in ((c.get("resources") or {}).get("requests") or {})
            ),
            places[0][0] if places else "",
        )
        problems.append(
            f"{setting}.resources.requests.{name}: needs a limit of the same amount "
            "(Kubernetes does not overcommit it)"
        )
    return problems


def _list_problems(
    manifest: JobManifest,
    role: str,
    at: tuple[str, Any],
    container: Mapping[str, Any],
    own: bool,
) -> list[str]:
    """Two mounts at one path (the pod's own container's: `_volume_problems`), two ports
    of one name or number, a variable with a value and a source."""
    problems = []
    for key, identity in (
        ("volumeMounts", () if own else ("mountPath",)),
        ("ports", ("name", "containerPort")),
    ):
        for part in identity:
            taken: set[Any] = set()
            for item in _items(container, key):
                value = item.get(part)
                if part == "containerPort":
                    value = (value, item.get("protocol", "TCP"))
                elif part == "mountPath" and isinstance(value, str):
                    value = _mount_point(value)
                if value is not None and value in taken:
                    problems.append(
                        f"{_item_at(manifest, role, at, key, item)}.{part}: {item.get(part)!r} "
                        f"is in two {key} of the {role} pods' {at[1]!r}"
                    )
                taken.add(value)
    problems += [
        f"{_item_at(manifest, role, at, 'env', variable)}: a value and a valueFrom (one of them)"
        for variable in _items(container, "env")
        if variable.get("value") is not None and variable.get("valueFrom") is not None
    ]
    return problems


_EXECUTOR_LABEL_SETTING = "spark.kubernetes.executor.label."
# Where the executors go and whose they are: a job's sparkConf may not say otherwise.
# The kubelet expands $(NAME) in a container's command and env values to the variable
# defined before it, and $$ to $: what a manifest says (a storage URI, a password in
# sparkConf, an argument) reaches the driver and cleanup pods escaped, so as written, as
# `spark-checkpoint run` gives it. Not escaped: the operator's references to POD_IP, and
# the job's env values (spark.executorEnv.*), which Kubernetes expands as env.
POD_IP = "$(POD_IP)"
_POD_IP_SETTINGS = ("spark.driver.host", "spark.driver.bindAddress")


_EXECUTOR_ENV_SETTING = "spark.executorEnv."


def _literal(text: str) -> str:
    return text.replace("$", "$$")


def as_written(value: str) -> str:
    """A value the operator escaped (`_literal`), read back from a pod spec."""
    return value.replace("$$", "$")


_OPERATOR_SPARK_SETTINGS = frozenset(
    {"spark.kubernetes.namespace", "spark.kubernetes.driver.pod.name"}
)


def _spark_defaults(manifest: JobManifest, driver_pod: str) -> dict[str, str]:
    """Client mode on Kubernetes; the manifest's sparkConf may override any of it."""
    spec = manifest.spec
    conf = {
        "spark.master": "k8s://https://kubernetes.default.svc:443",
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": manifest.namespace,
        "spark.kubernetes.driver.pod.name": driver_pod,
        "spark.driver.memory": f"{spec.driver.memory_mib}m",
        "spark.executor.instances": str(spec.executor.instances),
        "spark.executor.cores": str(spec.executor.cores),
        "spark.executor.memory": f"{spec.executor.memory_mib}m",
        EXECUTOR_TEMPLATE_SETTING: f"{EXECUTOR_TEMPLATE_DIR}/{EXECUTOR_TEMPLATE_FILE}",
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
        "spark.ui.enabled": "false",
        # The driver's RPC and block manager ports take only its executors: Spark
        # generates the secret and gives it to the executor pods it creates.
        "spark.authenticate": "true",
    }
    if spec.image:
        conf["spark.kubernetes.container.image"] = spec.image
    if spec.image_pull_policy is not None:
        conf["spark.kubernetes.container.image.pullPolicy"] = spec.image_pull_policy.value
    if spec.image_pull_secrets:
        # A setting, not the template: a job's own template keeps them too.
        conf["spark.kubernetes.container.image.pullSecrets"] = ",".join(spec.image_pull_secrets)
    if spec.executor.service_account:
        conf["spark.kubernetes.authenticate.executor.serviceAccountName"] = (
            spec.executor.service_account
        )
    # The job's labels over the manifest's (`pod_problems` refuses those keys there), as
    # on the driver pod: an executor never carries the labels that select the operator
    # (its NetworkPolicy lets the operator's pods reach every driver's agent).
    for key, value in {**spec.executor.labels, **job_labels(manifest, EXECUTOR)}.items():
        conf[f"{_EXECUTOR_LABEL_SETTING}{key}"] = value
    for key, value in spec.executor.annotations.items():
        conf[f"spark.kubernetes.executor.annotation.{key}"] = value
    for key, value in spec.executor.node_selector.items():
        conf[f"spark.kubernetes.executor.node.selector.{key}"] = value
    for variable in spec.executor_env:
        if variable.secret is None:
            conf[f"{_EXECUTOR_ENV_SETTING}{variable.name}"] = variable.value
        else:
            secret = variable.secret
            conf[f"spark.kubernetes.executor.secretKeyRef.{variable.name}"] = (
                f"{secret.name}:{secret.key}"
            )
    return conf


def _work_volume_source(manifest: JobManifest) -> dict[str, Any]:
    """The driver's work directory (its live checkpoint location): the shared claim when
    the job has one, else the pod's own disk."""
    claim = manifest.spec.checkpointing.live_volume_claim
    return {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}


def live_directory(manifest: JobManifest, job: Mapping[str, Any]) -> str:
    """The job's directory on its live volume claim, one per job object: jobs may share a
    claim, and a job recreated under the same name never finds the old one's attempts."""
    return f"{manifest.name}-{job['metadata']['uid']}"


def _live_sub_path(manifest: JobManifest, job: Mapping[str, Any]) -> dict[str, str]:
    if not manifest.spec.checkpointing.live_volume_claim:
        return {}
    return {"subPath": live_directory(manifest, job)}


def _live_volume_conf(manifest: JobManifest, job: Mapping[str, Any]) -> dict[str, str]:
    """Executors mount the claim where the driver does: Spark's state store files, which
    executors write, land where the driver's agent snapshots them."""
    claim = manifest.spec.checkpointing.live_volume_claim
    if not claim:
        return {}
    prefix = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{WORK_VOLUME}"
    return {
        f"{prefix}.options.claimName": claim,
        f"{prefix}.mount.path": WORK_DIR,
        f"{prefix}.mount.subPath": _live_sub_path(manifest, job)["subPath"],
        f"{prefix}.mount.readOnly": "false",
    }


def _resources(role: RoleSpec, memory_mib: int) -> dict[str, Any]:
    return {
        "requests": {"cpu": str(role.cores), "memory": f"{memory_mib}Mi"},
        "limits": {"memory": f"{memory_mib}Mi"},
    }


def _overhead_mib(memory_mib: int) -> int:
    return max(MIN_MEMORY_OVERHEAD_MIB, int(memory_mib * MEMORY_OVERHEAD_FACTOR))


def _env(variables: tuple[EnvVar, ...]) -> list[dict[str, Any]]:
    return [
        {"name": v.name, "value": v.value}
        if v.secret is None
        else {
            "name": v.name,
            "valueFrom": {"secretKeyRef": {"name": v.secret.name, "key": v.secret.key}},
        }
        for v in variables
    ]


def _annotation_path(key: str) -> str:
    return f"metadata.annotations['{key}']"


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def _plain(value: Any) -> Any:
    """Deep copies of the manifest's read-only mappings, as plain JSON values."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def agent_url(pod_ip: str, port: int = AGENT_PORT) -> str:
    """The checkpoint agent of a driver pod at ``pod_ip`` (an IPv6 address in brackets, as
    a URL spells it: a single-stack IPv6 cluster gives pods no other)."""
    host = f"[{pod_ip}]" if ipaddress.ip_address(pod_ip).version == 6 else pod_ip
    return f"http://{host}:{port}"
