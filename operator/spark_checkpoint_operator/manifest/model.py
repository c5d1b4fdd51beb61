"""The typed SparkCheckpointJob: what the runtimes read, built from a validated document."""

import copy
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from spark_checkpoint.storage import metadata_location
from spark_checkpoint_operator.coordinator import (
    CoordinatorConfig,
    RetentionPolicy,
    SavepointHistoryLimits,
)
from spark_checkpoint_operator.manifest import go_duration
from spark_checkpoint_operator.manifest.cron import CronSchedule
from spark_checkpoint_operator.manifest.pod_template import merged

QuantityPaths = tuple[tuple[str, ...], ...]
_MEMORY = re.compile(r"([0-9]+)([kmgt])[bi]?", re.IGNORECASE)
_MEMORY_EXPONENTS = {"k": 1, "m": 2, "g": 3, "t": 4}


class ImagePullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class RestartPolicyType(StrEnum):
    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    ALWAYS = "Always"


class JobState(StrEnum):
    RUNNING = "Running"
    SUSPENDED = "Suspended"


@dataclass(frozen=True, slots=True)
class SecretKeyRef:
    """A key of a Secret in the job's namespace (storage credentials): the pods read it,
    the operator never does."""

    name: str
    key: str


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str  # empty when the value comes from a Secret
    secret: SecretKeyRef | None = None
    # Where the manifest sets it (spec.executor.env[0]), for messages: not part of it.
    source: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Application:
    """Exactly one of ``main_file`` and ``module`` is set."""

    main_file: str | None
    module: str | None
    arguments: tuple[str, ...]
    spark_conf: Mapping[str, str]
    env: tuple[EnvVar, ...]


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """The pods of one Spark role (the driver; the executors add a count). ``tolerations``,
    ``volumes`` and ``volume_mounts`` are core/v1 objects as written in the manifest:
    read-only at the top level, private copies inside."""

    cores: int
    memory: str
    service_account: str | None
    env: tuple[EnvVar, ...]
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    volumes: tuple[Mapping[str, Any], ...]
    volume_mounts: tuple[Mapping[str, Any], ...]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    # The role's core/v1 PodTemplateSpec (metadata and spec), over spec.podTemplate's.
    pod_template: Mapping[str, Any]

    @property
    def memory_mib(self) -> int:
        """``memory`` in MiB, rounded up: Spark and Kubernetes spell sizes differently."""
        match = _MEMORY.fullmatch(self.memory)
        if match is None:
            raise ValueError(f"not a memory size: {self.memory!r}")
        size_bytes = int(match[1]) << (10 * _MEMORY_EXPONENTS[match[2].lower()])
        return math.ceil(size_bytes / (1 << 20))


@dataclass(frozen=True, slots=True)
class ExecutorSpec(RoleSpec):
    instances: int


@dataclass(frozen=True, slots=True)
class CheckpointingSpec:
    """Durations are seconds; ``interval`` None disables periodic checkpoints."""

    interval: float | None
    min_pause: float
    timeout: float
    max_concurrent: int
    tolerable_failures: int
    retained: int
    storage: str | None
    live_volume_claim: str | None
    retention_policy: RetentionPolicy
    # Each completed image is proven restorable by Spark in the background; one that is
    # not is recorded as unrestorable, so restores skip it.
    verify_restorable: bool = False


@dataclass(frozen=True, slots=True)
class SavepointsSpec:
    history_max_count: int
    history_max_age: float | None
    interval: float | None  # periodic savepoints; None: none
    schedule: str | None = None  # periodic savepoints by a cron expression (manifest/cron.py)
    # A SparkCheckpointSnapshot mirrors each savepoint no snapshot object asked for (Kubernetes).
    snapshot_objects: bool = False


@dataclass(frozen=True, slots=True)
class RestoreSpec:
    initial_savepoint_path: str | None
    # A change redeploys the job from `initial_savepoint_path` (Kubernetes only).
    savepoint_redeploy_nonce: int | None


@dataclass(frozen=True, slots=True)
class RestartPolicySpec:
    type: RestartPolicyType
    max_retries: int
    backoff: float
    max_backoff: float
    heartbeat_timeout: float = 60.0  # the CRD's defaults
    start_timeout: float = 300.0


@dataclass(frozen=True, slots=True)
class ShutdownSpec:
    final_savepoint: bool
    drain: bool


@dataclass(frozen=True, slots=True)
class RollbackSpec:
    enabled: bool = False  # the CRD's defaults
    readiness_timeout: float = 300.0


@dataclass(frozen=True, slots=True)
class JobSpec:
    image: str | None
    image_pull_policy: ImagePullPolicy | None
    application: Application
    driver: RoleSpec
    executor: ExecutorSpec
    checkpointing: CheckpointingSpec
    savepoints: SavepointsSpec
    restore: RestoreSpec
    restart_policy: RestartPolicySpec
    state: JobState
    checkpoint_trigger_nonce: int | None
    savepoint_trigger_nonce: int | None
    shutdown: ShutdownSpec
    # Secrets every pod of the job pulls `image` with (Kubernetes only).
    image_pull_secrets: tuple[str, ...] = ()
    # Every pod's core/v1 PodTemplateSpec, under the role's own (Kubernetes only).
    pod_template: Mapping[str, Any] = field(default_factory=dict)
    rollback: RollbackSpec = RollbackSpec()  # of an upgrade (Kubernetes only)

    @property
    def pod_templates(self) -> tuple[tuple[str, Mapping[str, Any]], ...]:
        """The three pod templates as written, each with its field."""
        return (
            ("spec.podTemplate", self.pod_template),
            ("spec.driver.podTemplate", self.driver.pod_template),
            ("spec.executor.podTemplate", self.executor.pod_template),
        )

    @property
    def driver_pod_template(self) -> dict[str, Any]:
        """The template of the driver pod and of the cleanup and check pods, which run as
        the driver does: spec.podTemplate, then spec.driver.podTemplate over it."""
        template: dict[str, Any] = merged(self.pod_template, self.driver.pod_template)
        return template

    @property
    def executor_pod_template(self) -> dict[str, Any]:
        template: dict[str, Any] = merged(self.pod_template, self.executor.pod_template)
        return template

    @property
    def driver_env(self) -> tuple[EnvVar, ...]:
        """What the driver (and the cleanup pods, with its credentials) get:
        ``application.env``, then ``driver.env``, which wins on a clash."""
        return _overridden(self.application.env, self.driver.env)

    @property
    def executor_env(self) -> tuple[EnvVar, ...]:
        return _overridden(self.application.env, self.executor.env)

    @property
    def local_env(self) -> tuple[EnvVar, ...]:
        """What a local run's driver process gets: Spark's executors run in it (threads of
        its JVM, whose Python workers inherit its environment), so the executors'
        variables too; the driver's win on a clash."""
        return _overridden(self.executor_env, self.driver_env)

    def unset_secret_variables(self, environment: Mapping[str, str]) -> str | None:
        """The variables a Secret gives the pods on Kubernetes that ``environment`` (a local
        process's own) lacks, each with its field and Secret: ``A, B not set (on
        Kubernetes spec.application.env[0] takes A from Secret s, key a; ...)``."""
        unset = [v for v in self.local_env if v.secret and v.name not in environment]
        if not unset:
            return None
        sources = "; ".join(
            f"{v.source} takes {v.name} from Secret {v.secret.name}, key {v.secret.key}"
            for v in unset
            if v.secret
        )
        return f"{', '.join(v.name for v in unset)} not set (on Kubernetes {sources})"


def _overridden(common: tuple[EnvVar, ...], own: tuple[EnvVar, ...]) -> tuple[EnvVar, ...]:
    by_name = {variable.name: variable for variable in common}
    by_name.update({variable.name: variable for variable in own})
    return tuple(by_name.values())


@dataclass(frozen=True, slots=True)
class JobManifest:
    """A validated, defaulted SparkCheckpointJob."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    spec: JobSpec

    def coordinator_config(self) -> CoordinatorConfig:
        checkpointing, savepoints = self.spec.checkpointing, self.spec.savepoints
        return CoordinatorConfig(
            interval=checkpointing.interval,
            min_pause=checkpointing.min_pause,
            timeout=checkpointing.timeout,
            max_concurrent=checkpointing.max_concurrent,
            tolerable_failures=checkpointing.tolerable_failures,
            retained=checkpointing.retained,
            retention_policy=checkpointing.retention_policy,
            savepoint_history=SavepointHistoryLimits(
                max_count=savepoints.history_max_count,
                max_age_seconds=savepoints.history_max_age,
            ),
            savepoint_interval=savepoints.interval,
            savepoint_schedule=None
            if savepoints.schedule is None
            else CronSchedule(savepoints.schedule),
        )


def to_manifest(document: Mapping[str, Any]) -> JobManifest:
    """Convert a validated, defaulted document; its shape is guaranteed by the schema."""
    metadata, spec = document["metadata"], document["spec"]
    application = spec["application"]
    checkpointing = spec["checkpointing"]
    savepoints = spec["savepoints"]
    restart = spec["restartPolicy"]
    restore = spec.get("restore", {})
    pull_policy = spec.get("imagePullPolicy")
    return JobManifest(
        name=metadata["name"],
        namespace=metadata["namespace"],
        labels=_strings(metadata.get("labels")),
        annotations=_strings(metadata.get("annotations")),
        spec=JobSpec(
            image=spec.get("image"),
            image_pull_policy=None if pull_policy is None else ImagePullPolicy(pull_policy),
            image_pull_secrets=tuple(s["name"] for s in spec.get("imagePullSecrets", ())),
            pod_template=_pod_template(spec.get("podTemplate")),
            application=Application(
                main_file=application.get("mainFile"),
                module=application.get("module"),
                arguments=tuple(application.get("arguments", ())),
                spark_conf=_strings(application.get("sparkConf")),
                env=_env(application.get("env"), "spec.application.env"),
            ),
            driver=RoleSpec(**_pod_fields(spec, "driver")),
            executor=ExecutorSpec(
                **_pod_fields(spec, "executor"), instances=spec["executor"]["instances"]
            ),
            checkpointing=CheckpointingSpec(
                interval=_optional_seconds(checkpointing.get("interval")) or None,
                min_pause=_seconds(checkpointing["minPause"]),
                timeout=_seconds(checkpointing["timeout"]),
                max_concurrent=checkpointing["maxConcurrent"],
                tolerable_failures=checkpointing["tolerableFailures"],
                retained=checkpointing["retained"],
                storage=checkpointing.get("storage"),
                live_volume_claim=checkpointing.get("liveVolumeClaim"),
                retention_policy=RetentionPolicy(checkpointing["retentionPolicy"]),
                verify_restorable=checkpointing["verifyRestorable"],
            ),
            savepoints=SavepointsSpec(
                history_max_count=savepoints["historyMaxCount"],
                history_max_age=_optional_seconds(savepoints.get("historyMaxAge")),
                interval=_optional_seconds(savepoints.get("interval")),
                schedule=savepoints.get("schedule"),
                snapshot_objects=savepoints["snapshotObjects"],
            ),
            restore=RestoreSpec(
                initial_savepoint_path=_optional_metadata(restore.get("initialSavepointPath")),
                savepoint_redeploy_nonce=restore.get("savepointRedeployNonce"),
            ),
            restart_policy=RestartPolicySpec(
                type=RestartPolicyType(restart["type"]),
                max_retries=restart["maxRetries"],
                backoff=_seconds(restart["backoff"]),
                max_backoff=_seconds(restart["maxBackoff"]),
                heartbeat_timeout=_seconds(restart["heartbeatTimeout"]),
                start_timeout=_seconds(restart["startTimeout"]),
            ),
            state=JobState(spec["state"]),
            checkpoint_trigger_nonce=spec.get("checkpointTriggerNonce"),
            savepoint_trigger_nonce=spec.get("savepointTriggerNonce"),
            shutdown=ShutdownSpec(
                final_savepoint=spec["shutdown"]["finalSavepoint"],
                drain=spec["shutdown"]["drain"],
            ),
            rollback=RollbackSpec(
                enabled=spec["rollback"]["enabled"],
                readiness_timeout=_seconds(spec["rollback"]["readinessTimeout"]),
            ),
        ),
    )


def _seconds(duration: str) -> float:
    """A Go duration string (the CRD's pattern and range guarantee the form) in seconds,
    from the whole nanoseconds Go's ``time.ParseDuration`` makes of it, as the API
    server's rules compare them."""
    return go_duration.nanoseconds(duration) / 10**9


def _optional_seconds(duration: str | None) -> float | None:
    return None if duration is None else _seconds(duration)


def _optional_metadata(snapshot: str | None) -> str | None:
    return None if snapshot is None else metadata_location(snapshot)


def _strings(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


def _objects(items: Sequence[Mapping[str, Any]] | None) -> tuple[Mapping[str, Any], ...]:
    return tuple(MappingProxyType(copy.deepcopy(dict(item))) for item in items or ())


# The quantities of a core/v1 Volume, by their path in it ("*": every key or item).
_VOLUME_QUANTITY_PATHS: QuantityPaths = (
    ("emptyDir", "sizeLimit"),
    ("downwardAPI", "items", "*", "resourceFieldRef", "divisor"),
    ("projected", "sources", "*", "downwardAPI", "items", "*", "resourceFieldRef", "divisor"),
    ("ephemeral", "volumeClaimTemplate", "spec", "resources", "requests", "*"),
    ("ephemeral", "volumeClaimTemplate", "spec", "resources", "limits", "*"),
)
# ... and of a core/v1 PodTemplateSpec.
_CONTAINER_QUANTITY_PATHS: QuantityPaths = (
    ("resources", "requests", "*"),
    ("resources", "limits", "*"),
    ("env", "*", "valueFrom", "resourceFieldRef", "divisor"),
)
_POD_TEMPLATE_QUANTITY_PATHS = (
    *(("spec", "volumes", "*", *path) for path in _VOLUME_QUANTITY_PATHS),
    *(
        ("spec", containers, "*", *path)
        for containers in ("containers", "initContainers")
        for path in _CONTAINER_QUANTITY_PATHS
    ),
    ("spec", "overhead", "*"),
    ("spec", "resources", "requests", "*"),
    ("spec", "resources", "limits", "*"),
)
# Kubernetes' quantity (resource.Quantity): a decimal, then an SI, binary or exponent suffix.
QUANTITY = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?")
_QUANTITY_SUFFIXES = {
    **{suffix: Decimal(10) ** (3 * power) for power, suffix in enumerate("kMGTPE", 1)},
    **{suffix: Decimal(10) ** (-3 * power) for power, suffix in enumerate("mun", 1)},
    **{f"{suffix}i": Decimal(2) ** (10 * power) for power, suffix in enumerate("KMGTPE", 1)},
}


def quantity_amount(text: Any) -> Decimal | None:
    """A quantity's amount (``1Gi``, ``500m``, ``1e3``, a number), to compare two of them
    as the API server does; None for one that is no quantity."""
    text = str(text)
    if QUANTITY.fullmatch(text) is None:
        return None
    number = re.match(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", text)
    assert number is not None
    suffix = text[number.end() :]
    if suffix[:1] in ("e", "E"):
        return Decimal(number[0]) * Decimal(10) ** int(suffix[1:])
    return Decimal(number[0]) * _QUANTITY_SUFFIXES.get(suffix, Decimal(1))


def volume_quantities(volume: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Each quantity of a core/v1 Volume with its path in it (``emptyDir.sizeLimit``)."""
    return _quantities(volume, _VOLUME_QUANTITY_PATHS)


def pod_template_quantities(template: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Each quantity of a core/v1 PodTemplateSpec with its path in it."""
    return _quantities(template, _POD_TEMPLATE_QUANTITY_PATHS)


def _quantities(value: Mapping[str, Any], paths: QuantityPaths) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []

    def note(path: str, value: Any) -> Any:
        found.append((path, value))
        return value

    _each_quantity(value, note, paths)
    return found


def _quantities_as_text(value: Mapping[str, Any], paths: QuantityPaths) -> Any:
    """``value`` with its quantities written as numbers (``sizeLimit: 1``) as text: the API
    server takes either, the client's typed objects only text."""
    return _each_quantity(value, lambda _, quantity: _quantity(quantity), paths)


def _pod_template(template: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(
        copy.deepcopy(_quantities_as_text(template or {}, _POD_TEMPLATE_QUANTITY_PATHS))
    )


def _quantity(value: Any) -> Any:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return str(value) if is_number else value


def _each_quantity(
    value: Mapping[str, Any], change: Callable[[str, Any], Any], paths: QuantityPaths
) -> Any:
    """``value`` with ``change(path, quantity)`` in place of each of its quantities."""
    changed: Any = value
    for path in paths:
        changed = _changed_at(changed, path, change, "")
    return changed


def _changed_at(
    value: Any, path: tuple[str, ...], change: Callable[[str, Any], Any], where: str
) -> Any:
    if not path:
        return change(where, value)
    first, rest = path[0], path[1:]
    if first == "*" and isinstance(value, Mapping):
        return {k: _changed_at(v, rest, change, f"{where}.{k}") for k, v in value.items()}
    if first == "*" and isinstance(value, list):
        return [_changed_at(v, rest, change, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping) and first in value:
        inner = f"{where}.{first}" if where else first
        return {**value, first: _changed_at(value[first], rest, change, inner)}
    return value


def _env(items: Sequence[Mapping[str, Any]] | None, path: str) -> tuple[EnvVar, ...]:
    return tuple(
        EnvVar(
            item["name"],
            item.get("value", ""),
            _secret_key_ref(item.get("valueFrom")),
            source=f"{path}[{index}]",
        )
        for index, item in enumerate(items or ())
    )


def _secret_key_ref(source: Mapping[str, Any] | None) -> SecretKeyRef | None:
    if source is None:
        return None
    reference = source["secretKeyRef"]
    return SecretKeyRef(reference["name"], reference["key"])


def _pod_fields(spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    role = spec[name]
    return {
        "cores": role["cores"],
        "memory": role["memory"],
        "service_account": role.get("serviceAccount"),
        "env": _env(role.get("env"), f"spec.{name}.env"),
        "node_selector": _strings(role.get("nodeSelector")),
        "tolerations": _objects(role.get("tolerations")),
        "volumes": _objects(
            [
                _quantities_as_text(volume, _VOLUME_QUANTITY_PATHS)
                for volume in role.get("volumes") or ()
            ]
        ),
        "volume_mounts": _objects(role.get("volumeMounts")),
        "labels": _strings(role.get("labels")),
        "annotations": _strings(role.get("annotations")),
        "pod_template": _pod_template(role.get("podTemplate")),
    }
