"""Loading SparkCheckpointJob manifests: defaults, typed values, and every problem named."""

import json
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_checkpoint.storage import parse_snapshot_address
from spark_checkpoint.storage.layout import remote_uri_problem
from spark_checkpoint_operator.coordinator import (
    CoordinatorConfig,
    RetentionPolicy,
    SavepointHistoryLimits,
)
from spark_checkpoint_operator.manifest import validation
from spark_checkpoint_operator.manifest.crd import load_crd
from spark_checkpoint_operator.manifest.loading import (
    load_manifest,
    manifest_from_document,
    manifest_from_update,
    parse_manifest,
)
from spark_checkpoint_operator.manifest.model import (
    Application,
    CheckpointingSpec,
    EnvVar,
    ImagePullPolicy,
    JobState,
    RestartPolicySpec,
    RestartPolicyType,
    ShutdownSpec,
)
from spark_checkpoint_operator.manifest.problems import ManifestError, Problem
from spark_checkpoint_operator.manifest.validation import validate_document

DELETE = object()


def _set(document: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """Set (or with DELETE remove) the field at a dotted path, creating parents."""
    *parents, last = path.split(".")
    node = document
    for name in parents:
        node = node.setdefault(name, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return document


def _problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestError) as raised:
        manifest_from_document(document, "job.yaml")
    assert raised.value.source == "job.yaml"
    return [str(problem) for problem in raised.value.problems]


def test_full_manifest_sets_every_field(fixtures: Path) -> None:
    job = load_manifest(fixtures / "full-job.yaml")

    assert (job.name, job.namespace) == ("orders-enrichment", "streaming")
    assert job.labels == {"team": "payments"}
    assert job.annotations == {"owner": "payments@example.com"}
    spec = job.spec
    assert spec.image == "registry.example.com/spark-checkpoint:0.1.0"
    assert spec.image_pull_policy is ImagePullPolicy.IF_NOT_PRESENT
    assert spec.application == Application(
        main_file="local:///opt/app/orders.py",
        module=None,
        arguments=("--source", "kafka", "--topic", "orders"),
        spark_conf=MappingProxyType({"spark.sql.shuffle.partitions": "8"}),
        env=(EnvVar("LOG_LEVEL", "INFO"),),
    )
    driver, executor = spec.driver, spec.executor
    assert (driver.cores, driver.memory, driver.memory_mib) == (2, "2Gi", 2048)
    assert driver.service_account == "spark-driver"
    assert driver.env == (EnvVar("ROLE", "driver"),)
    assert driver.node_selector == {"pool": "streaming"}
    assert driver.tolerations == (
        {"key": "dedicated", "operator": "Equal", "value": "streaming", "effect": "NoSchedule"},
    )
    assert driver.volumes == (
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "orders-checkpoints"}},
    )
    assert driver.volume_mounts == ({"name": "checkpoints", "mountPath": "/data/checkpoints"},)
    assert driver.labels == {"role": "driver"}
    assert driver.annotations == {"prometheus.io/scrape": "true"}
    assert (executor.instances, executor.cores, executor.memory_mib) == (3, 4, 4096)
    assert executor.service_account == "spark-executor"
    assert executor.volumes == ({"name": "scratch", "emptyDir": {}},)
    assert executor.annotations == {"sidecar.istio.io/inject": "false"}
    assert spec.checkpointing == CheckpointingSpec(
        interval=5400.0,
        min_pause=30.0,
        timeout=120.0,
        max_concurrent=2,
        tolerable_failures=3,
        retained=5,
        storage="s3a://checkpoints/orders",
        live_volume_claim="orders-live",
        retention_policy=RetentionPolicy.RETAIN_ON_CANCELLATION,
    )
    assert (spec.savepoints.history_max_count, spec.savepoints.history_max_age) == (4, 604800.0)
    assert spec.restore.initial_savepoint_path == (
        "s3a://checkpoints/streaming/orders/savepoints/sp-42/_metadata"
    )
    assert spec.restart_policy == RestartPolicySpec(
        type=RestartPolicyType.ALWAYS, max_retries=10, backoff=0.5, max_backoff=60.0
    )
    assert spec.state is JobState.SUSPENDED
    assert (spec.checkpoint_trigger_nonce, spec.savepoint_trigger_nonce) == (7, 3)
    assert spec.shutdown == ShutdownSpec(final_savepoint=False, drain=True)


def test_full_manifest_gives_the_coordinator_its_settings(fixtures: Path) -> None:
    job = load_manifest(fixtures / "full-job.yaml")

    assert job.coordinator_config() == CoordinatorConfig(
        interval=5400.0,
        min_pause=30.0,
        timeout=120.0,
        max_concurrent=2,
        tolerable_failures=3,
        retained=5,
        retention_policy=RetentionPolicy.RETAIN_ON_CANCELLATION,
        savepoint_history=SavepointHistoryLimits(max_count=4, max_age_seconds=604800.0),
    )


def test_minimal_manifest_takes_the_crd_defaults(fixtures: Path) -> None:
    job = load_manifest(fixtures / "minimal-job.yaml")

    assert (job.name, job.namespace, job.labels) == ("word-count", "default", {})
    spec = job.spec
    assert (spec.image, spec.image_pull_policy) == (None, None)
    assert spec.application == Application(
        main_file=None,
        module="pipelines.word_count",
        arguments=(),
        spark_conf=MappingProxyType({}),
        env=(),
    )
    for role in (spec.driver, spec.executor):
        assert (role.cores, role.memory, role.memory_mib) == (1, "1g", 1024)
        assert (role.service_account, role.env, role.tolerations) == (None, (), ())
    assert spec.executor.instances == 1
    assert spec.checkpointing == CheckpointingSpec(
        interval=60.0,
        min_pause=0.0,
        timeout=600.0,
        max_concurrent=1,
        tolerable_failures=0,
        retained=1,
        storage=None,
        live_volume_claim=None,
        retention_policy=RetentionPolicy.RETAIN_ON_FAILURE,
        verify_restorable=False,
    )
    assert (spec.savepoints.history_max_count, spec.savepoints.history_max_age) == (10, None)
    assert spec.restore.initial_savepoint_path is None
    assert spec.restart_policy == RestartPolicySpec(
        type=RestartPolicyType.ON_FAILURE, max_retries=3, backoff=10.0, max_backoff=300.0
    )
    assert spec.state is JobState.RUNNING
    assert (spec.checkpoint_trigger_nonce, spec.savepoint_trigger_nonce) == (None, None)
    assert spec.shutdown == ShutdownSpec(final_savepoint=True, drain=False)


def test_crd_defaults_are_the_coordinator_defaults(fixtures: Path) -> None:
    assert load_manifest(fixtures / "minimal-job.yaml").coordinator_config() == CoordinatorConfig()


def test_defaulted_document_is_what_the_api_server_would_store(minimal: dict[str, Any]) -> None:
    _set(minimal, "spec.application.env", [{"name": "EMPTY"}])

    stored = validate_document(minimal, "job.yaml")

    assert stored["metadata"] == {"name": "word-count", "namespace": "default"}
    # No default inside a list item (tests/manifest/test_crd.py): the value stays unset.
    assert stored["spec"]["application"]["env"] == [{"name": "EMPTY"}]
    assert manifest_from_document(minimal).spec.application.env[0].value == ""
    assert stored["spec"]["checkpointing"] == {
        "interval": "60s",
        "minPause": "0s",
        "timeout": "10m",
        "maxConcurrent": 1,
        "tolerableFailures": 0,
        "retained": 1,
        "retentionPolicy": "RetainOnFailure",
        "incremental": True,
        "verifyRestorable": False,
    }
    assert stored["spec"]["executor"] == {"cores": 1, "memory": "1g", "instances": 1}
    assert "restore" not in stored["spec"]
    assert "namespace" not in minimal["metadata"], "the caller's document is not changed"


@pytest.mark.parametrize("interval", [None, "0s", "0ms"])
def test_null_or_zero_interval_disables_periodic_checkpoints(
    minimal: dict[str, Any], interval: str | None
) -> None:
    # interval is nullable: null is kept (not defaulted) and CEL's has() is false for it,
    # so the minPause <= interval rule does not apply. A merge patch (kubectl apply) cannot
    # store a null: 0s does the same (a reviewer's).
    _set(minimal, "spec.checkpointing", {"interval": interval, "minPause": "5m"})

    job = manifest_from_document(minimal)

    assert job.spec.checkpointing.interval is None
    assert job.coordinator_config().interval is None
    assert job.spec.checkpointing.min_pause == 300.0


def test_null_in_a_field_that_is_not_nullable_is_defaulted_or_dropped(
    minimal: dict[str, Any],
) -> None:
    _set(minimal, "spec.checkpointing", {"retained": None, "storage": None})
    _set(minimal, "spec.image", None)

    job = manifest_from_document(minimal)

    assert job.spec.checkpointing.retained == 1
    assert job.spec.checkpointing.storage is None
    assert job.spec.image is None


_MINUTE, _SECOND = 60 * 10**9, 10**9


@pytest.mark.parametrize(
    ("duration", "nanoseconds"),
    [
        ("12500us", 12_500_000),
        ("500ms", 500_000_000),
        ("90s", 90 * _SECOND),
        ("1.5h", 90 * _MINUTE),
        ("1h30m", 90 * _MINUTE),
        ("2m30.5s", 150_500_000_000),
        ("1.4s", 1_400_000_000),
        ("8.3m", 498 * _SECOND),
        ("1.0000000001s", _SECOND),  # below a nanosecond: truncated
        # Go's own cases (src/time/time_test.go, parseDurationTests) in the CRD's range:
        ("1h2m3s4ms5us6ns", 62 * _MINUTE + 3 * _SECOND + 4_005_006),
        ("39h9m14.425s", 39 * 60 * _MINUTE + 9 * _MINUTE + 14_425_000_000),
        ("52763797000ns", 52_763_797_000),
        ("0.3333333333333333333h", 20 * _MINUTE),
        ("9007199254740993ns", (1 << 53) + 1),
        ("0.100000000000000000000h", 6 * _MINUTE),
        ("0.830103483285477580700h", 49 * _MINUTE + 48 * _SECOND + 372_539_827),
    ],
)
def test_durations_are_the_nanoseconds_go_reads_in_seconds(
    minimal: dict[str, Any], duration: str, nanoseconds: int
) -> None:
    # The API server's rules compare Go's whole nanoseconds; so must the coordinator.
    _set(minimal, "spec.checkpointing.interval", duration)

    interval = manifest_from_document(minimal).spec.checkpointing.interval

    assert interval == nanoseconds / 10**9


@pytest.mark.parametrize(
    ("interval", "min_pause"),
    [("1.4s", "1400ms"), ("0.7s", "700ms"), ("8.3m", "498s"), ("0.3s", "0.1s0.2s")],
)
def test_a_min_pause_equal_to_the_interval_in_other_units_is_run(
    minimal: dict[str, Any], interval: str, min_pause: str
) -> None:
    _set(minimal, "spec.checkpointing", {"interval": interval, "minPause": min_pause})

    config = manifest_from_document(minimal).coordinator_config()

    assert config.min_pause == config.interval


def test_an_interval_below_a_nanosecond_disables_periodic_checkpoints_as_go_reads_it_as_0s(
    minimal: dict[str, Any],
) -> None:
    _set(minimal, "spec.checkpointing.interval", "0.5ns")

    assert manifest_from_document(minimal).coordinator_config().interval is None


@pytest.mark.parametrize(
    ("memory", "mib"),
    [("512m", 512), ("1g", 1024), ("1GB", 1024), ("2Gi", 2048), ("1536Mi", 1536), ("100k", 1)],
)
def test_memory_sizes_in_spark_and_kubernetes_units(
    minimal: dict[str, Any], memory: str, mib: int
) -> None:
    _set(minimal, "spec.driver.memory", memory)

    assert manifest_from_document(minimal).spec.driver.memory_mib == mib


FILE_URI_HOST = (
    "a file:// or local:// URI names an absolute path, as file:///data/checkpoints (in "
    "file://<name>/..., <name> is a host)"
)
INVALID = [
    # (what is wrong, field, value, the one problem reported)
    (
        "retained below its minimum",
        "spec.checkpointing.retained",
        0,
        "spec.checkpointing.retained: 0 is less than the minimum of 1",
    ),
    (
        "retained above its maximum",
        "spec.checkpointing.retained",
        101,
        "spec.checkpointing.retained: 101 is greater than the maximum of 100",
    ),
    (
        # The status lists each savepoint: without a bound it outgrew the API server's
        # object size limit, and every status write failed.
        "historyMaxCount above its maximum",
        "spec.savepoints.historyMaxCount",
        101,
        "spec.savepoints.historyMaxCount: 101 is greater than the maximum of 100",
    ),
    (
        "maxConcurrent above its maximum",
        "spec.checkpointing.maxConcurrent",
        17,
        "spec.checkpointing.maxConcurrent: 17 is greater than the maximum of 16",
    ),
    (
        "negative tolerableFailures",
        "spec.checkpointing.tolerableFailures",
        -1,
        "spec.checkpointing.tolerableFailures: -1 is less than the minimum of 0",
    ),
    (
        "unknown retention policy",
        "spec.checkpointing.retentionPolicy",
        "Sometimes",
        "spec.checkpointing.retentionPolicy: 'Sometimes' is not one of "
        "['NeverRetainAfterTermination', 'RetainOnFailure', 'RetainOnCancellation']",
    ),
    (
        "interval not a duration",
        "spec.checkpointing.interval",
        "5 minutes",
        "spec.checkpointing.interval: '5 minutes' is not a duration such as 500ms, 30s, 5m "
        "or 1h30m",
    ),
    (
        "interval as a bare number",
        "spec.checkpointing.interval",
        60,
        "spec.checkpointing.interval: 60 is not a duration such as 500ms, 30s, 5m or 1h30m",
    ),
    (
        "storage not a URI or absolute path",
        "spec.checkpointing.storage",
        "checkpoints/orders",
        "spec.checkpointing.storage: 'checkpoints/orders' is not a URI such as "
        "s3a://bucket/path or file:///data, or an absolute path",
    ),
    (
        "incremental not a boolean",
        "spec.checkpointing.incremental",
        "yes",
        "spec.checkpointing.incremental: 'yes' is not of type 'boolean'",
    ),
    (
        "incremental false, taken and ignored before (an auditor's)",
        "spec.checkpointing.incremental",
        False,
        "spec.checkpointing.incremental: must be true: checkpoints always share unchanged "
        "state files (stored once, reference-counted); full copies per checkpoint are not "
        "supported. A savepoint is a self-contained copy",
    ),
    (
        "memory with a space",
        "spec.executor.memory",
        "2 GiB",
        "spec.executor.memory: '2 GiB' is not a memory size such as 512m, 1g or 2Gi",
    ),
    (
        "negative executor instances",
        "spec.executor.instances",
        -1,
        "spec.executor.instances: -1 is less than the minimum of 0",
    ),
    (
        "no driver cores",
        "spec.driver.cores",
        0,
        "spec.driver.cores: 0 is less than the minimum of 1",
    ),
    (
        "unknown state",
        "spec.state",
        "Paused",
        "spec.state: 'Paused' is not one of ['Running', 'Suspended']",
    ),
    (
        "unknown restart policy",
        "spec.restartPolicy.type",
        "Sometimes",
        "spec.restartPolicy.type: 'Sometimes' is not one of ['Never', 'OnFailure', 'Always']",
    ),
    (
        "nonce not an integer",
        "spec.checkpointTriggerNonce",
        "seven",
        "spec.checkpointTriggerNonce: 'seven' is not of type 'integer'",
    ),
    (
        "module that is a path",
        "spec.application.module",
        "pipelines/orders.py",
        "spec.application.module: 'pipelines/orders.py' is not a dotted Python module name "
        "such as pipelines.orders",
    ),
    (
        "savepoint history kept at zero",
        "spec.savepoints.historyMaxCount",
        0,
        "spec.savepoints.historyMaxCount: 0 is less than the minimum of 1",
    ),
    (
        "name that is not a DNS subdomain",
        "metadata.name",
        "Orders_Job",
        "metadata.name: 'Orders_Job' is not a DNS-1123 subdomain (lowercase letters, digits, "
        "'-' and '.', starting and ending with a letter or digit)",
    ),
    (
        "namespace that is not a DNS label",
        "metadata.namespace",
        "team.streaming",
        "metadata.namespace: 'team.streaming' is not a DNS-1123 label (lowercase letters, "
        "digits and '-', starting and ending with a letter or digit)",
    ),
    (
        "no name",
        "metadata.name",
        DELETE,
        "metadata.name: required field is missing",
    ),
    (
        "no application",
        "spec.application",
        DELETE,
        "spec.application: required field is missing",
    ),
    (
        "env entry without a name",
        "spec.application.env",
        [{"value": "1"}],
        "spec.application.env[0].name: required field is missing",
    ),
    (
        "env names not unique",
        "spec.application.env",
        [{"name": "A", "value": "1"}, {"name": "B"}, {"name": "A", "value": "2"}],
        "spec.application.env[2]: duplicate entry (name='A' is also at index 0)",
    ),
    # CEL rules
    (
        "minPause longer than interval",
        "spec.checkpointing",
        {"interval": "1m", "minPause": "90s"},
        "spec.checkpointing.minPause: must not exceed spec.checkpointing.interval",
    ),
    (
        "interval below Flink's floor",
        "spec.checkpointing",
        {"interval": "9999us", "minPause": "0s"},
        "spec.checkpointing.interval: must be at least 10ms, or 0s (or null) to disable "
        "periodic checkpoints",
    ),
    (
        "zero timeout",
        "spec.checkpointing.timeout",
        "0ms",
        "spec.checkpointing.timeout: must be at least 10ms",
    ),
    (
        "timeout below Flink's floor",
        "spec.checkpointing.timeout",
        "9ms",
        "spec.checkpointing.timeout: must be at least 10ms",
    ),
    (
        "backoff longer than maxBackoff",
        "spec.restartPolicy",
        {"backoff": "2m", "maxBackoff": "1m"},
        "spec.restartPolicy.backoff: must not exceed spec.restartPolicy.maxBackoff",
    ),
    (
        "backoff above the default maxBackoff",
        "spec.restartPolicy.backoff",
        "1h",
        "spec.restartPolicy.backoff: must not exceed spec.restartPolicy.maxBackoff",
    ),
    (
        "both mainFile and module",
        "spec.application.mainFile",
        "job.py",
        "spec.application: exactly one of spec.application.mainFile and "
        "spec.application.module must be set",
    ),
    (
        "neither mainFile nor module",
        "spec.application",
        {"arguments": ["--once"]},
        "spec.application: exactly one of spec.application.mainFile and "
        "spec.application.module must be set",
    ),
    (
        "zero savepoint age",
        "spec.savepoints.historyMaxAge",
        "0h",
        "spec.savepoints.historyMaxAge: must be greater than 0s",
    ),
    (
        "checkpoint location in sparkConf",
        "spec.application.sparkConf",
        {"spark.sql.streaming.checkpointLocation": "/tmp/x"},
        "spec.application.sparkConf: must not set spark.sql.streaming.checkpointLocation: the "
        "coordinator owns the checkpoint location (set spec.checkpointing.storage)",
    ),
    (
        "executor count in sparkConf",
        "spec.application.sparkConf",
        {"spark.executor.instances": "4"},
        "spec.application.sparkConf: must not set spark.driver.cores, spark.driver.memory, "
        "spark.executor.cores, spark.executor.memory or spark.executor.instances (set "
        "spec.driver and spec.executor)",
    ),
    (
        "file URI naming a host",
        "spec.checkpointing.storage",
        "file://checkpoints/orders",
        f"spec.checkpointing.storage: {FILE_URI_HOST}",
    ),
    (
        "local URI naming a host",
        "spec.checkpointing.storage",
        "local://checkpoints/orders",
        f"spec.checkpointing.storage: {FILE_URI_HOST}",
    ),
    (
        "file URI of localhost",
        "spec.restore.initialSavepointPath",
        "file://localhost/data/default/orders/savepoints/sp-1",
        f"spec.restore.initialSavepointPath: {FILE_URI_HOST}",
    ),
]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [case[1:] for case in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_invalid_manifest_names_the_field(
    minimal: dict[str, Any],
    field: str,
    value: object,
    expected: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(ManifestError) as raised:
        manifest_from_document(_set(minimal, field, value), "job.yaml")

    assert str(raised.value) == f"job.yaml: {expected}"
    # Nothing else said: the CEL package logs the errors of functions of ours it calls
    # (printed to stderr where logging is not set up).
    assert caplog.records == []


def test_every_problem_is_reported_together(full: dict[str, Any]) -> None:
    _set(full, "metadata.name", "Orders")
    _set(full, "spec.checkpointing.retained", 0)
    _set(full, "spec.checkpointing.minPause", "2h")
    _set(full, "spec.restartPolicy.backoff", "1h")
    _set(full, "spec.driver.memory", "lots")
    _set(full, "spec.application.module", "orders")
    _set(full, "spec.shutdown.drian", True)

    problems = _problems(full)

    assert [problem.split(":")[0] for problem in problems] == [
        "metadata.name",
        "spec.application",
        "spec.checkpointing.minPause",
        "spec.checkpointing.retained",
        "spec.driver.memory",
        "spec.restartPolicy.backoff",
        "spec.shutdown.drian",
    ]
    with pytest.raises(ManifestError) as raised:
        manifest_from_document(full, "job.yaml")
    lines = str(raised.value).splitlines()
    assert len(lines) == 7
    assert all(line.startswith("job.yaml: ") for line in lines)


def test_problems_are_structured_for_api_style_callers(minimal: dict[str, Any]) -> None:
    _set(minimal, "spec.checkpointing.retained", 0)

    with pytest.raises(ManifestError) as raised:
        validate_document(minimal, "scj/word-count")

    assert raised.value.problems == (
        Problem("spec.checkpointing.retained", "0 is less than the minimum of 1"),
    )


def test_unknown_fields_are_named_with_a_suggestion(minimal: dict[str, Any]) -> None:
    _set(minimal, "spec.checkpointing.intervall", "30s")
    _set(minimal, "spec.executor.replicas", 2)
    _set(minimal, "specs", {})
    _set(minimal, "metadata.uuid", "1234")

    assert _problems(minimal) == [
        "metadata.uuid: unknown field (did you mean 'uid'?)",
        "spec.checkpointing.intervall: unknown field (did you mean 'interval'?)",
        "spec.executor.replicas: unknown field",
        "specs: unknown field (did you mean 'spec'?)",
    ]


def test_pod_objects_keep_the_fields_of_their_kubernetes_types(minimal: dict[str, Any]) -> None:
    # Tolerations, volumes and mounts are core/v1 objects the CRD does not spell out.
    volume = {"name": "conf", "configMap": {"name": "orders", "items": [{"key": "a"}]}}
    _set(minimal, "spec.driver.volumes", [volume])

    assert manifest_from_document(minimal).spec.driver.volumes == (volume,)


def test_map_keys_that_are_not_identifiers_are_bracketed(minimal: dict[str, Any]) -> None:
    _set(minimal, "spec.application.sparkConf", {"spark.sql.shuffle.partitions": 8})

    assert _problems(minimal) == [
        "spec.application.sparkConf[\"spark.sql.shuffle.partitions\"]: 8 is not of type 'string'"
    ]


def test_yaml_keys_that_are_not_strings_are_named(minimal: dict[str, Any]) -> None:
    minimal["spec"].update({1.5: "x", 2: "y"})

    assert _problems(minimal) == ["spec[1.5]: unknown field", "spec[2]: unknown field"]


def test_a_value_the_schema_rejects_is_not_also_reported_by_its_rules(
    minimal: dict[str, Any],
) -> None:
    # duration() cannot read "soon", so the interval rules cannot run; the pattern says why.
    _set(minimal, "spec.checkpointing.interval", "soon")

    assert _problems(minimal) == [
        "spec.checkpointing.interval: 'soon' is not a duration such as 500ms, 30s, 5m or 1h30m"
    ]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("kind", "Deployment", "kind: must be SparkCheckpointJob, got 'Deployment'"),
        (
            "apiVersion",
            "sparkcheckpoint.io/v1",
            "apiVersion: must be sparkcheckpoint.io/v1alpha1, got 'sparkcheckpoint.io/v1'",
        ),
        (
            "apiVersion",
            DELETE,
            "apiVersion: required field is missing (use sparkcheckpoint.io/v1alpha1)",
        ),
    ],
)
def test_another_kind_of_object_is_rejected_before_its_fields(
    minimal: dict[str, Any], field: str, value: object, expected: str
) -> None:
    _set(minimal, field, value)
    _set(minimal, "spec.replicas", 3)  # not reported: the object is not a SparkCheckpointJob

    assert _problems(minimal) == [expected]


def test_a_document_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(
        ManifestError, match=r"^job\.yaml: expected a SparkCheckpointJob, got list$"
    ):
        parse_manifest("- a\n- b\n", "job.yaml")


def test_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: sparkcheckpoint.io/v1alpha1\n"
        "kind: SparkCheckpointJob\n"
        "metadata:\n"
        "  name: orders\n"
        "spec:\n"
        "  checkpointing:\n"
        "    interval: 30s\n"
        "     retained: 3\n"
    )

    with pytest.raises(ManifestError) as raised:
        load_manifest(path)

    assert str(raised.value) == (
        f"{path}: line 8, column 14: invalid YAML: mapping values are not allowed here"
    )


@pytest.mark.parametrize(
    ("line", "said"),
    [
        # Not the last one wins: two `interval:` lines are a mistake.
        ("    interval: 5m", "line 8, column 5: invalid YAML: duplicate key 'interval'"),
        # PyYAML's constructors raise a bare ValueError for these: once a traceback.
        ("    maxAge: 2024-02-30", "line 8, column 13: invalid YAML: day is out of range"),
        ("    retained: " + "9" * 5000, "line 8, column 15: invalid YAML: Exceeds the limit"),
        # Keys JSON and the API server cannot hold; `on` is YAML 1.1's true.
        (
            '    sparkConf: {1: "4"}',
            'line 8, column 17: invalid YAML: the key 1 is not a string to YAML; quote it: "1"',
        ),
        ("    on: x", "line 8, column 5: invalid YAML: the key on is not a string to YAML"),
        ("    ~: x", "line 8, column 5: invalid YAML: the key ~ is not a string"),
        # Merged keys too (`on` is 1 there: one silently took the other's place).
        (
            "    sparkConf: {<<: {1: x, on: y}}",
            "line 8, column 16: invalid YAML: the key 1 (merged with <<) is not a string",
        ),
        (
            "    sparkConf: {<<: {~: x}}",
            "line 8, column 16: invalid YAML: the key None (merged with <<) is not a string",
        ),
    ],
)
def test_a_yaml_value_or_key_no_manifest_holds_names_its_line(
    tmp_path: Path, line: str, said: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: sparkcheckpoint.io/v1alpha1\n"
        "kind: SparkCheckpointJob\n"
        "metadata: {name: orders}\n"
        "spec:\n"
        "  application: {module: orders}\n"
        "  checkpointing:\n"
        "    interval: 30s\n"
        f"{line}\n"
    )

    with pytest.raises(ManifestError) as raised:
        load_manifest(path)

    assert str(raised.value).startswith(f"{path}: {said}")
    assert "\n" not in str(raised.value)


def test_yaml_merge_keys_may_be_overridden() -> None:
    job = parse_manifest(
        "apiVersion: sparkcheckpoint.io/v1alpha1\n"
        "kind: SparkCheckpointJob\n"
        "metadata: {name: orders}\n"
        "spec:\n"
        "  application: {module: orders}\n"
        "  driver: &pod {cores: 2, memory: 2g}\n"
        "  executor:\n"
        "    <<: *pod\n"
        "    cores: 4\n"
    )

    assert (job.spec.driver.cores, job.spec.executor.cores) == (2, 4)
    assert job.spec.executor.memory == "2g"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "expected one SparkCheckpointJob document, found none"),
        ("# nothing\n---\n", "expected one SparkCheckpointJob document, found none"),
        (
            "a: 1\n---\nkind: Secret\n",
            "expected one SparkCheckpointJob document, found none among its 2 documents "
            "(no kind, Secret)",
        ),
        (
            "kind: SparkCheckpointJob\n---\nkind: SparkCheckpointJob\n",
            "expected one SparkCheckpointJob document, found 2; a manifest names one job",
        ),
    ],
)
def test_a_file_holds_exactly_one_job(text: str, expected: str) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_manifest(text, "job.yaml")

    assert str(raised.value) == f"job.yaml: {expected}"


def test_the_job_is_read_from_a_file_that_holds_what_kubectl_applies_with_it() -> None:
    # The user guide's S3 job comes with its Secret, in one file for `kubectl apply -f`.
    secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: orders-s3}\nstringData: {a: b}\n"
    job = (
        "apiVersion: sparkcheckpoint.io/v1alpha1\nkind: SparkCheckpointJob\n"
        "metadata: {name: orders}\nspec: {application: {module: pipelines.orders}}\n"
    )

    for text in (f"{secret}---\n{job}", f"{job}---\n{secret}"):
        assert parse_manifest(text, "job.yaml").name == "orders"


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"

    with pytest.raises(
        ManifestError, match=r"absent\.yaml: cannot read the file: No such file or directory$"
    ):
        load_manifest(path)


def test_a_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"kind: \xff\n")

    with pytest.raises(ManifestError, match=r"job\.yaml: not UTF-8 text: "):
        load_manifest(path)


def test_the_typed_manifest_is_frozen(fixtures: Path) -> None:
    job = load_manifest(fixtures / "full-job.yaml")

    with pytest.raises(AttributeError):
        job.spec.checkpointing.retained = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.spec.application.spark_conf["spark.x"] = "y"  # type: ignore[index]


def test_a_rule_that_cannot_run_on_a_valid_value_is_reported(minimal: dict[str, Any]) -> None:
    crd = load_crd()
    checkpointing = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["checkpointing"]
    checkpointing["x-kubernetes-validations"].append(
        {"rule": "self.missing == 'x'", "message": "never shown"}
    )
    checker = validation._Checker(crd)
    document = validate_document(minimal)

    assert [str(p) for p in checker.problems(document)[0]] == [
        "spec.checkpointing: rule \"self.missing == 'x'\" failed: 'missing'"
    ]


def test_schema_keywords_local_validation_cannot_check_are_refused() -> None:
    crd = load_crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["state"]["oneOf"] = [{"enum": ["Running"]}]

    with pytest.raises(ValueError, match=r"#/properties/spec/properties/state: .*'oneOf'"):
        validation._Checker(crd)


@pytest.mark.parametrize(
    "given",
    [
        "/data/storage/default/orders/savepoints/sp-7",
        "/data/storage/default/orders/savepoints/sp-7/",
        "/data/storage/default/orders/savepoints/sp-7/_metadata",
        "/data/storage/default/orders/savepoints/sp-7/_metadata/",
    ],
)
def test_the_initial_savepoint_is_named_by_its_directory_or_its_metadata(
    minimal: dict[str, Any], given: str
) -> None:
    """As `run --from` takes it (and as status' paths name `_metadata`): the driver reads
    the `_metadata` either way."""
    _set(minimal, "spec.restore.initialSavepointPath", given)
    restore = manifest_from_document(minimal).spec.restore
    assert (
        restore.initial_savepoint_path == "/data/storage/default/orders/savepoints/sp-7/_metadata"
    )


@pytest.mark.parametrize(
    "given", ["s3a://bucket/default/orders/chk-12", "/data/default/savepoints/chk-3/_metadata"]
)
def test_the_initial_image_may_be_a_retained_checkpoint(
    minimal: dict[str, Any], given: str
) -> None:
    """As Flink's initialSavepointPath: a job deleted with its checkpoints retained starts
    again from the newest of them (a job may even be called "savepoints")."""
    _set(minimal, "spec.restore.initialSavepointPath", given)
    restore = manifest_from_document(minimal).spec.restore
    assert restore.initial_savepoint_path == given.removesuffix("/_metadata") + "/_metadata"


# Paths drawn from pieces each right or wrong for the driver: a root (or none), a
# namespace, a job, the image's place and how its end is spelled.
IMAGE_PATHS = st.tuples(
    st.sampled_from(
        [
            *("s3a://bucket", "s3a://bucket/p", "/data", "file:///data", "s3a:/", ""),
            *("s3a://bucket/p*", "s3a://bucket//p", "s3a://bucket/./p", "file:///da[ta"),
        ]
    ),
    st.sampled_from(["default", "ns-", "-ns", "a" * 63, "a" * 64, "Team", "a.b"]),
    st.sampled_from(["orders", "j..k", "j-", "savepoints", "orders.v2", "Orders"]),
    st.sampled_from(
        ["chk-0", "chk-07", "chk-12", "savepoints/sp-3", "savepoints/sp-03", "sp-1", "x/chk-1"]
    ),
    st.sampled_from(["", "/", "/_metadata", "/_metadata/"]),
).map(lambda parts: "{}/{}/{}/{}{}".format(*parts))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(path=IMAGE_PATHS)
def test_the_crd_takes_the_initial_image_paths_the_driver_reads(
    minimal: dict[str, Any], path: str
) -> None:
    """The CRD's rule on initialSavepointPath and the parser the driver and `run --from`
    read it with (parse_snapshot_address) agree: a path the API accepts is restored, one
    the driver could not read is refused when applied."""
    _set(minimal, "spec.restore.initialSavepointPath", path)
    try:
        parse_snapshot_address(path)
        readable = True
    except ValueError:
        readable = False
    try:
        manifest_from_document(minimal)
        accepted = True
    except ManifestError:
        accepted = False
    assert accepted == readable, path


@pytest.mark.parametrize(
    ("storage", "refused"),
    [
        ("memory://checkpoints", "names no storage"),
        ("http://host/checkpoints", "names no storage"),
        ("zip://x::file:///a.zip", "names no storage"),
        # fsspec knows schemes in lowercase only: every run failed, "Protocol not known"
        # (a hostile newcomer's).
        ("S3A://bucket/checkpoints", "a URI's scheme is written in lowercase"),
        ("FILE:///data/checkpoints", "a URI's scheme is written in lowercase"),
        # s3fs takes what precedes the first / for the bucket: each failed every run with a
        # botocore error, the last echoing the secret (a hostile newcomer's).
        ("s3:///checkpoints", "an s3://, s3a:// or gs:// URI starts with its bucket's name"),
        ("s3://Bad_Bucket!/c", "an s3://, s3a:// or gs:// URI starts with its bucket's name"),
        ("s3a://key:secret@bucket/c", "an s3://, s3a:// or gs:// URI starts with its bucket"),
        ("gs://user@bucket/c", "an s3://, s3a:// or gs:// URI starts with its bucket's name"),
        ("abfs://key:secret@account/c", "a URI must not carry a password"),
        ("s3://AKIA:wJal/K7MD/secret@bucket/c", "a URI must not carry a password"),
        ("hdfs://namenode:8020/c/x@y", None),
        # Digits are a password before '@', a port before the path (a reviewer's).
        ("webhdfs://user:123456@namenode/c", "a URI must not carry a password"),
        ("hdfs://user:pa:ss@namenode/c", "a URI must not carry a password"),
        ("s3://AKIA:/wJalrXUtnFEMI@bucket/c", "a URI must not carry a password"),
        # adlfs takes any host but a Data Lake one for the container (InvalidResourceName).
        ("abfs://account.blob.core.windows.net/ckpts/c", "an abfs://, abfss:// or az:// URI"),
        ("s3://arn:aws:s3:us-east-1:123456789012:accesspoint/ap/team@corp/c", None),
        ("abfss://account.dfs.core.windows.net/ckpts/c", None),  # adlfs's account-host form
        (
            "abfss://account.dfs.core.windows.net/Bad_C/c",
            "an abfs://, abfss:// or az:// URI starts",
        ),
        ("webhdfs://user:secret@namenode/c", "a URI must not carry a password"),
        ("s3://bucket/a\tb", "a location must not contain control characters"),
        # adlfs failed every call with InvalidResourceName; Azurite stored the backslash as
        # '/', and every checkpoint failed (a newcomer's).
        ("abfs://Bad_Container!/c", "an abfs://, abfss:// or az:// URI starts with its container"),
        ("az://c/checkpoints", "an abfs://, abfss:// or az:// URI starts with its container"),
        ("abfs://ckpts/back\\slash", "a remote URI's path must not contain a backslash"),
        ("s3://bucket/back\\slash", "a remote URI's path must not contain a backslash"),
        ("abfs://$root/checkpoints", None),
        ("az://ckpts-1/checkpoints", None),
        ("/data/a\x7fb", "a location must not contain control characters"),
        ("s3://Legacy_Bucket.1/checkpoints", None),  # us-east-1 names from before 2018
        # Access points' ARNs, which s3fs takes for the bucket (a reviewer's).
        ("s3://arn:aws:s3:us-east-1:123456789012:accesspoint/my-ap/checkpoints", None),
        ("s3a://arn:aws:s3::123456789012:accesspoint/mfzwi23gnjvgw.mrap/c", None),
        ("s3://arn:aws:s3-outposts:us-east-1:123456789012:outpost/op-01/accesspoint/ap/c", None),
        ("gs://bucket/checkpoints", None),
        ("abfss://container@account.dfs.core.windows.net/c", None),
        ("hdfs://namenode:8020/checkpoints", None),
        ("hdfs:///checkpoints", None),  # the cluster's default filesystem
        ("/data/checkpoints", None),
    ],
)
def test_checkpoint_storage_is_a_store_that_outlives_the_job(
    minimal: dict[str, Any], storage: str, refused: str | None
) -> None:
    """memory:// was taken: a run completed checkpoints and a savepoint, said so, and
    kept nothing (the next run could restore nothing over committed output)."""
    _set(minimal, "spec.checkpointing.storage", storage)
    if refused is None:
        assert manifest_from_document(minimal).spec.checkpointing.storage == storage
        return
    with pytest.raises(ManifestError, match=rf"spec\.checkpointing\.storage: {refused}") as error:
        manifest_from_document(minimal)
    assert "secret" not in str(error.value)


# Storage URIs drawn from pieces right or wrong for fsspec and the object stores: a scheme
# (remote, local, none) with an authority (a bucket, a bad one, a password, none) and
# segments that are empty, dot segments, glob patterns or hold a control character.
STORAGE_URIS = st.tuples(
    st.sampled_from(["s3", "s3a", "S3A", "gs", "gcs", "abfs", "abfss", "az", "hdfs", "file", ""]),
    st.sampled_from(
        [
            "bucket",
            "b_1.x",
            "",
            "Bad!",
            "key:secret@bucket",
            "key:se/cret@bucket",  # AWS secret keys hold '/'
            "user:p@ss@bucket",
            "key:12345@bucket",
            "key:/se/cret@bucket",
            "user:pa:ss@namenode",
            "namenode:8020",
            "acct.dfs.core.windows.net",
            "acct.privatelink.blob.core.windows.net:443",
            "c@account",
            "ckpts@account:10000",
            "ckpts",
            "Ckpts",
            "ck_pts@acct.dfs.core.windows.net",
            "$root",
            "[::1]:8020",
            "arn:aws:s3:us-east-1:123456789012:accesspoint/ap",
        ]
    ),
    st.lists(
        st.sampled_from(
            ["", ".", "..", "data", ".x", "a*", "?", "[ab]", "x]", "a\tb", "\x7f", "a\\b", "t@corp"]
        ),
        max_size=4,
    ),
    st.sampled_from(["", "/"]),
).map(
    lambda parts: (
        (f"{parts[0]}://{parts[1]}" if parts[0] else "")
        + "".join(f"/{segment}" for segment in parts[2])
        + parts[3]
    )
)

# Each remote-URI rule of the CRD, by its message, and the start of what the storage
# layout's check says for the same fault.
_REMOTE_URI_RULES = {
    "a remote URI's path must not contain *, ? or [": "contains '",
    "a remote URI's path must not have an empty, '.' or '..' segment": "has a",
    "an s3://, s3a:// or gs:// URI starts with its bucket's name": "does not start with its b",
    "an abfs://, abfss:// or az:// URI starts with its container's name": (
        "does not start with its c"
    ),
    "a remote URI's path must not contain a backslash": "contains a backslash",
    "a URI must not carry a password": "carries a password",
    "a location must not contain control characters": "contains a control character",
}


@settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(storage=STORAGE_URIS)
def test_the_crd_refuses_the_remote_storage_uris_the_storage_layout_refuses(
    minimal: dict[str, Any], storage: str
) -> None:
    """The CRD's rules and the storage layout's check (which the driver, the cleanup pods
    and the sink apply to the URIs the CRD never sees, as the sink's output) agree. fsspec
    expanded `s3://b/team-*/out` as a pattern in deletes, so one job's commit deleted
    another's staged batch (a reviewer); s3fs lists an empty segment's keys under another
    prefix than it writes (`s3://b//out` never committed a batch); the sink took
    `s3://key:secret@b/out`, and botocore's error echoed the secret."""
    _set(minimal, "spec.checkpointing.storage", storage)
    try:
        manifest_from_document(minimal)
        refused = ""
    except ManifestError as error:
        refused = str(error)
    crd_faults = {fault for rule, fault in _REMOTE_URI_RULES.items() if rule in refused}
    layout_problem = remote_uri_problem(storage)
    scheme = storage.partition("://")[0] if "://" in storage else ""
    if scheme.lower() in ("", "file", "local"):
        assert layout_problem is None, storage  # the control-character rule is the CRD's
        return
    if not scheme.islower():
        return  # the CRD refuses it first (fsspec knows no scheme in capitals)
    assert (layout_problem is not None) == bool(crd_faults), (storage, refused, layout_problem)
    if layout_problem is not None:
        assert any(layout_problem.startswith(fault) for fault in crd_faults), (storage, refused)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spec.checkpointing.storage", "/data/a\0b"),
        ("spec.application.arguments", ["--output", "a\0b"]),
        ("spec.application.sparkConf", {"spark.x": "a\0b"}),
        ("spec.driver.annotations", {"note": "a\0b"}),
    ],
)
def test_a_nul_character_is_refused_naming_the_field(
    minimal: dict[str, Any], field: str, value: Any
) -> None:
    """JSON and the API server take it; a path, an argument or a variable cannot hold it:
    `run` ended in a traceback of `embedded null byte` (a hostile-input tester)."""
    _set(minimal, field, value)

    with pytest.raises(ManifestError, match="contains a NUL character") as refused:
        manifest_from_document(minimal)
    assert str(refused.value).startswith(f"<manifest>: {field}"), refused.value
    with pytest.raises(ManifestError, match="contains a NUL character"):
        manifest_from_update(minimal, minimal)


@pytest.mark.parametrize(
    ("yaml_text", "said"),
    [
        (
            'mainFile: "pipeline\\ud800.py"',
            "spec.application.mainFile: 'pipeline\\ud800.py' holds a UTF-16 surrogate (\\ud800), "
            "which is no text",
        ),
        (
            'sparkConf: {"spark.x\\udc00": "1"}',
            "spec.application.sparkConf: the key 'spark.x\\udc00' holds a UTF-16 surrogate "
            "(\\udc00), which is no text",
        ),
    ],
)
def test_a_string_that_is_not_text_is_refused_naming_the_field(
    minimal: dict[str, Any], yaml_text: str, said: str
) -> None:
    """A YAML escape of a lone surrogate: every CEL rule of the field failed with "Conversion
    Error: Failed to convert Python object of type str to Value" (a hostile-input tester);
    the API server stores UTF-8 only."""
    application = yaml.safe_load(yaml_text)
    minimal["spec"]["application"] = {"mainFile": "local:///p.py", **application}

    with pytest.raises(ManifestError) as refused:
        manifest_from_document(minimal)
    assert str(refused.value) == f"<manifest>: {said}"
    with pytest.raises(ManifestError) as refused:
        manifest_from_update(minimal, minimal)
    assert str(refused.value) == f"<manifest>: {said}"


def test_a_character_json_escapes_as_a_surrogate_pair_is_one_character() -> None:
    """`json.dumps` writes an emoji as "\\ud83d\\ude00": PyYAML kept both halves, and the
    check of text refused them (a reviewer's); a JSON parser reads one character."""
    document = {"spark.app.name": "orders 😀"}
    text = (
        "apiVersion: sparkcheckpoint.io/v1alpha1\nkind: SparkCheckpointJob\n"
        "metadata: {name: orders}\n"
        'spec: {application: {mainFile: "local:///p.py", sparkConf: '
        + json.dumps(document)
        + "}}\n"
    )
    assert "\\ud83d\\ude00" in text

    job = parse_manifest(text)

    assert job.spec.application.spark_conf["spark.app.name"] == "orders 😀"


def test_a_manifest_exported_from_a_cluster_runs_as_it_is(minimal: dict[str, Any]) -> None:
    """`kubectl get scj -o yaml > job.yaml` then `spark-checkpoint run job.yaml`: what the
    API server set in metadata was refused as unknown fields (a hostile-input tester)."""
    minimal["metadata"] |= {
        "uid": "0b3f6c1e-2f4a-4d36-9f0e-1c2d3e4f5a6b",
        "resourceVersion": "12345",
        "generation": 3,
        "creationTimestamp": "2026-11-30T10:00:00Z",
        "finalizers": ["sparkcheckpoint.io/finalizer"],
        "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {}}],
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "y"}],
    }
    minimal["status"] = {"phase": "Running", "jobAttempt": 2}

    assert manifest_from_document(minimal).name == minimal["metadata"]["name"]


@pytest.mark.timeout(30)
def test_a_manifest_that_is_no_regular_file_is_one_line(tmp_path: Path) -> None:
    """A FIFO made `run -f` wait for a writer for ever."""
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)

    with pytest.raises(ManifestError) as refused:
        load_manifest(fifo)
    assert str(refused.value) == f"{fifo}: cannot read the file: is a FIFO, not a regular file"
