"""A local manifest gets the verdict a real API server gives it (kube-apiserver with this
CRD), and hostile YAML costs bounded time and memory.

What the API server does, from its sources: CRD patterns are matched with Go's RE2, whose
``$`` matches only at the very end; durations go through Go's time.ParseDuration (at most
about 2562047h) in the CEL rules; JSON numbers are int64 or float64, and go-openapi accepts a
float for an integer only if it is integral and below 2**53, which the API server then
stores as an integer.
"""

import re
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_checkpoint.janitor_commands import CollectGarbage
from spark_checkpoint.storage.layout import DNS_1123_SUBDOMAIN
from spark_checkpoint_operator import cli
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.manifest import validation
from spark_checkpoint_operator.manifest.crd import crd_schema
from spark_checkpoint_operator.manifest.loading import (
    MAX_MANIFEST_BYTES,
    load_manifest,
    manifest_from_document,
    parse_manifest,
)
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.manifest.validation import MAX_MANIFEST_DEPTH

# Kubernetes' own rules for what the operator creates (k8s.io/apimachinery validation; the
# subdomain's definition is checked against Kubernetes' rule in test_dns_names.py).
_DNS_SUBDOMAIN = re.compile(DNS_1123_SUBDOMAIN)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _with(document: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    *parents, last = path.split(".")
    node = document
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = value
    return document


def _rejection(document: dict[str, Any]) -> str:
    with pytest.raises(ManifestError) as raised:
        manifest_from_document(document, "job.yaml")
    return str(raised.value)


# --- patterns: `$` is the end of the text ------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("metadata.name", "probe\n"),
        ("metadata.namespace", "team\n"),
        ("spec.checkpointing.interval", "5s\n"),
        ("spec.checkpointing.storage", "/data/checkpoints\n"),
        ("spec.application.module", "pipelines.orders\n"),
        ("spec.driver.memory", "1g\n"),
        ("spec.driver.serviceAccount", "spark\n"),
        ("spec.checkpointing.liveVolumeClaim", "live\n"),
    ],
)
def test_a_trailing_newline_is_rejected_naming_the_field(
    minimal: dict[str, Any], field: str, value: str
) -> None:
    message = _rejection(_with(minimal, field, value))

    assert message.startswith(f"job.yaml: {field}: "), message
    assert "\n" not in message, "one line, the newline shown escaped"
    assert repr(value) in message


def test_a_rejected_name_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    document = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "probe\n"},
        "spec": {"application": {"module": "pipelines.orders"}},
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    state = tmp_path / "state"

    assert cli.main(["run", str(path), "--state-dir", str(state)]) == 2

    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "metadata.name" in error, error
    assert not state.exists()


# --- durations: Go's range ----------------------------------------------------------------

DURATIONS = [
    "spec.checkpointing.interval",
    "spec.checkpointing.minPause",
    "spec.checkpointing.timeout",
    "spec.savepoints.historyMaxAge",
    "spec.restartPolicy.backoff",
    "spec.restartPolicy.maxBackoff",
]


@pytest.mark.parametrize("field", DURATIONS)
@pytest.mark.parametrize("value", ["2562048h", "99999999999999999999h", "2562047h3600s"])
def test_a_duration_go_cannot_represent_is_rejected(
    minimal: dict[str, Any], field: str, value: str
) -> None:
    _with(minimal, "spec.checkpointing.interval", None)  # minPause is then unbounded
    _with(minimal, "spec.restartPolicy.maxBackoff", "2562047h")  # backoff is then unbounded

    message = _rejection(_with(minimal, field, value))

    assert f"job.yaml: {field}: must be at most 2562047h" in message


@pytest.mark.parametrize(
    ("interval", "min_pause"),
    [
        ("1125899.906842623s", "1125899906.842623ms"),
        ("1125899.906842623s", "1125899906842.623us"),
        ("1125899.906842623s", "312h44m59.906842623s"),
    ],
)
def test_durations_are_compared_to_the_nanosecond_as_go_reads_them(
    minimal: dict[str, Any], interval: str, min_pause: str
) -> None:
    """minPause equal to the interval, written in other units: Go reads both to the same
    nanosecond (the `cel` package's own duration() read the first a nanosecond short, and
    refused a valid spec, as the manifest fuzz found); one nanosecond more is refused."""
    _with(minimal, "spec.checkpointing.interval", interval)
    _with(minimal, "spec.checkpointing.minPause", min_pause)
    manifest_from_document(minimal, "job.yaml")

    _with(minimal, "spec.checkpointing.minPause", f"{min_pause}1ns")
    message = _rejection(minimal)

    assert "spec.checkpointing.minPause: must not exceed spec.checkpointing.interval" in message


def test_the_longest_duration_go_represents_is_accepted(minimal: dict[str, Any]) -> None:
    for field in DURATIONS:
        _with(minimal, field, "2562047h")

    job = manifest_from_document(minimal)

    assert job.spec.checkpointing.timeout == 2562047 * 3600


# --- integers: int64, and integral floats stored as integers -------------------------------


def test_an_integral_float_is_stored_as_an_integer(minimal: dict[str, Any]) -> None:
    # The API server accepts 2.0 for an integer and stores 2; the coordinator slices with it.
    _with(minimal, "spec.checkpointing.retained", 2.0)
    _with(minimal, "spec.checkpointTriggerNonce", -4.0)

    job = manifest_from_document(minimal)

    assert job.spec.checkpointing.retained == 2
    assert type(job.spec.checkpointing.retained) is int
    assert type(job.coordinator_config().retained) is int
    assert type(job.spec.checkpoint_trigger_nonce) is int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2.5, "2.5 is not of type 'integer'"),
        (float(1 << 53), "9007199254740992.0 is not of type 'integer'"),
        (True, "True is not of type 'integer'"),
        (1 << 63, "9223372036854775808 is outside the range of a 64-bit integer"),
        (-(1 << 63) - 1, "-9223372036854775809 is outside the range of a 64-bit integer"),
    ],
)
def test_a_value_that_is_not_an_int64_is_rejected(
    minimal: dict[str, Any], value: object, expected: str
) -> None:
    message = _rejection(_with(minimal, "spec.savepointTriggerNonce", value))

    assert message == f"job.yaml: spec.savepointTriggerNonce: {expected}"


@pytest.mark.parametrize("nonce", [(1 << 63) - 1, -(1 << 63)])
def test_the_int64_bounds_are_accepted(minimal: dict[str, Any], nonce: int) -> None:
    _with(minimal, "spec.savepointTriggerNonce", nonce)

    assert manifest_from_document(minimal).spec.savepoint_trigger_nonce == nonce


# --- names: what the operator derives from them must be valid ------------------------------


def test_a_name_longer_than_a_label_value_is_rejected(minimal: dict[str, Any]) -> None:
    message = _rejection(_with(minimal, "metadata.name", "a" * 64))

    assert message == f"job.yaml: metadata.name: {'a' * 64!r} is longer than 63 characters"


def test_the_longest_name_gives_valid_pod_secret_and_label_names(minimal: dict[str, Any]) -> None:
    name = "a" * 61 + ".b"  # a DNS subdomain of the longest length accepted
    job = manifest_from_document(_with(minimal, "metadata.name", name))
    resource = {"metadata": {"name": name, "uid": "5f2c1c1e-0000-4000-8000-000000000000"}}
    pod = objects.driver_pod(
        job,
        resource,
        attempt=1000,
        storage="/data",
        restore=[],
        deployed_hash="0" * 16,
        user_ids=objects.UserIds.IMAGE,
    )
    secret = objects.token_secret(job, resource, "token")
    cleanup = objects.cleanup_pod(
        job,
        resource,
        storage="/data",
        command=CollectGarbage(checkpoints=(), savepoints=()),
        user_ids=objects.UserIds.IMAGE,
    )

    for derived in (pod["metadata"]["name"], secret["metadata"]["name"]):
        assert len(derived) <= 253 and _DNS_SUBDOMAIN.fullmatch(derived), derived
    for made in (pod, secret, cleanup):
        for value in made["metadata"]["labels"].values():
            assert len(value) <= 63 and _LABEL_VALUE.fullmatch(value), value
    # The API server cuts a generateName prefix to 58 characters itself.
    assert cleanup["metadata"]["generateName"].startswith(name)


# --- hostile YAML -------------------------------------------------------------------------

HEADER = (
    "apiVersion: sparkcheckpoint.io/v1alpha1\nkind: SparkCheckpointJob\n"
    "metadata: {name: p}\nspec:\n  application: {module: a}\n"
)


def _alias_bomb(levels: int) -> str:
    """Each level is a list of nine aliases of the level below: 9**levels strings."""
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        lines.append(f"  a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * 9) + "]")
    return HEADER + "  arguments:\n" + "".join(f"  {line}\n" for line in lines)


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        (_alias_bomb(7), "more than 10000 values once its aliases are expanded"),
        (_alias_bomb(12), "more than 10000 values once its aliases are expanded"),
        (HEADER + "  x: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested more than 64 levels"),
        (HEADER + "  x: &loop [*loop]\n", "an alias refers to a value that contains it"),
    ],
    ids=["alias-bomb-7", "alias-bomb-12", "nested-50000", "recursive-alias"],
)
def test_hostile_yaml_is_refused_in_bounded_time_and_memory(text: str, phrase: str) -> None:
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ManifestError) as raised:
            parse_manifest(text, "job.yaml")
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    message = str(raised.value)
    assert phrase in message and len(message) < 200 and "\n" not in message, message
    assert elapsed < 5  # seconds, under tracemalloc on a loaded machine; well under 1 alone
    assert peak < 50 << 20


def test_a_file_too_large_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(HEADER + "#" * (4 * MAX_MANIFEST_BYTES), encoding="utf-8")

    with pytest.raises(ManifestError) as raised:
        load_manifest(path)

    assert f"larger than {MAX_MANIFEST_BYTES} bytes" in str(raised.value)


def test_nesting_up_to_the_bound_is_accepted(minimal: dict[str, Any]) -> None:
    # Inside a free-form core/v1 object; spec.driver.tolerations[0] is 4 levels down.
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_MANIFEST_DEPTH - 6):
        node["x"] = node = {}
    _with(minimal, "spec.driver.tolerations", [deep])

    job = parse_manifest(yaml.safe_dump(minimal))

    assert job.spec.driver.tolerations


def test_aliases_expand_as_yaml_says() -> None:
    text = HEADER.replace(
        "spec:\n", "spec:\n  driver: &pod {cores: 2, memory: 2g}\n  executor: *pod\n"
    )

    job = parse_manifest(text)

    assert (job.spec.executor.cores, job.spec.executor.memory) == (2, "2g")


def test_a_huge_value_gives_a_short_message(minimal: dict[str, Any]) -> None:
    message = _rejection(_with(minimal, "spec.checkpointing.storage", "relative" * 500))

    assert len(message) < 300 and "\n" not in message
    assert message.startswith("job.yaml: spec.checkpointing.storage: 'relativerelative")


def test_every_crd_pattern_is_anchored_at_the_end_of_the_text() -> None:
    # The translation to Python's `re` is what makes `$` mean the end: each CRD pattern,
    # translated, refuses its own valid example followed by a newline.
    examples = {
        "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$": "5s",
        "^[1-9][0-9]*([kKmMgGtT][bB]?|[KMGT]i)$": "1g",
        "^([a-zA-Z][a-zA-Z0-9+.-]*://.+|/.*)$": "/data",
        "^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*$": "a.b",
        "^[-._a-zA-Z][-._a-zA-Z0-9]*$": "NAME",
        "^[-._a-zA-Z0-9]+$": "access-key",
        validation._DNS_SUBDOMAIN: "a.b",
        validation.LABEL_VALUE_PATTERN: "v",
    }
    crd_patterns = {node["pattern"] for node in _schema_nodes(crd_schema()) if "pattern" in node}
    assert crd_patterns == examples.keys()
    for pattern, example in examples.items():
        assert validation.go_regex(pattern).search(example)
        assert not validation.go_regex(pattern).search(example + "\n"), pattern


def _schema_nodes(schema: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [schema]
    for child in schema.get("properties", {}).values():
        nodes += _schema_nodes(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            nodes += _schema_nodes(schema[key])
    return nodes


@pytest.mark.parametrize(
    ("field", "entries", "phrase"),
    [
        ("labels", {"Bad Key": "x"}, "'Bad Key' is not a label or annotation key"),
        ("labels", {"team": "pay ments"}, "'pay ments' is not a label value"),
        ("labels", {"team": "p" * 64}, "is not a label value"),
        ("labels", {"team": "payments\n"}, "'payments\\n' is not a label value"),
        ("annotations", {"a/b/c": "anything"}, "'a/b/c' is not a label or annotation key"),
    ],
)
def test_metadata_labels_and_annotations_are_validated_as_on_every_object(
    minimal: dict[str, Any], field: str, entries: dict[str, str], phrase: str
) -> None:
    message = _rejection(_with(minimal, f"metadata.{field}", entries))

    assert message.startswith(f"job.yaml: metadata.{field}") and phrase in message, message


def test_valid_labels_and_annotations_are_accepted(minimal: dict[str, Any]) -> None:
    _with(minimal, "metadata.labels", {"app.kubernetes.io/part-of": "orders", "tier": ""})
    _with(minimal, "metadata.annotations", {"example.com/owner": "payments team <x@y>"})

    job = manifest_from_document(minimal)

    assert job.labels["tier"] == "" and "example.com/owner" in job.annotations


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spec.driver.labels", {"role": "driver pod"}),
        ("spec.executor.labels", {"role": "e" * 64}),
        ("spec.driver.nodeSelector", {"pool": "-streaming"}),
        ("spec.executor.nodeSelector", {"pool": "streaming\n"}),
    ],
)
def test_a_pod_label_value_kubernetes_would_refuse_is_rejected_at_apply_time(
    minimal: dict[str, Any], field: str, value: dict[str, str]
) -> None:
    # These become labels (and node selectors) of the pods: refused now, not at launch.
    message = _rejection(_with(minimal, field, value))

    (key,) = value
    assert message.startswith(f"job.yaml: {field}.{key}: "), message
