"""SparkCheckpointJob manifests: validated locally as the API server would, then typed.

The CRD in ``crds/`` is the one source of truth. A manifest is checked against its
``openAPIV3Schema`` (translated to JSON Schema), defaulted like the API server defaults it,
and its CEL rules (``x-kubernetes-validations``) are evaluated with the
``common-expression-language`` package. Unlike the API server, which silently prunes unknown
fields, a local manifest with an unknown field is rejected, so a misspelt setting is never
silently ignored. Every problem is reported, each naming the file and the field.

The package ships the CRD as package data next to this module: in the checkout a symlink to
the ``crds/`` file, which the wheel build copies as a file.
"""

import copy
import difflib
import functools
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

import cel
import yaml
from jsonschema import Draft202012Validator, ValidationError

from spark_checkpoint_operator.coordinator import (
    CoordinatorConfig,
    RetentionPolicy,
    SavepointHistoryLimits,
)

# Next to this module, not through importlib.resources: on Python 3.11 that cannot read a
# namespace package (this one has no __init__.py) installed in editable mode.
CRD_PATH = Path(__file__).with_name("sparkcheckpointjobs.sparkcheckpoint.io.yaml")

_Schema = Mapping[str, Any]

_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

# The CRD has no schema for metadata (the API server validates ObjectMeta itself), so a
# local manifest's metadata is checked against this subset instead.
_OBJECT_META: _Schema = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
        "namespace": {
            "type": "string",
            "maxLength": 63,
            "pattern": _DNS_LABEL,
            "default": "default",
        },
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

# What a value failing each pattern should have been; a raw regular expression teaches
# little. tests/manifest checks that every pattern of the CRD is listed here.
PATTERN_HINTS: Mapping[str, str] = {
    r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$": "a duration such as 500ms, 30s, 5m or 1h30m",
    r"^[1-9][0-9]*([kKmMgGtT][bB]?|[KMGT]i)$": "a memory size such as 512m, 1g or 2Gi",
    r"^([a-zA-Z][a-zA-Z0-9+.-]*://.+|/.*)$": (
        "a URI such as s3a://bucket/path or file:///data, or an absolute path"
    ),
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$": (
        "a dotted Python module name such as pipelines.orders"
    ),
    r"^[-._a-zA-Z][-._a-zA-Z0-9]*$": (
        "an environment variable name (letters, digits, '-', '.' and '_'; no leading digit)"
    ),
    _DNS_SUBDOMAIN: (
        "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending"
        " with a letter or digit)"
    ),
    _DNS_LABEL: (
        "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a"
        " letter or digit)"
    ),
}

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_MEMORY = re.compile(r"([0-9]+)([kmgt])[bi]?", re.IGNORECASE)
_MEMORY_EXPONENTS = {"k": 1, "m": 2, "g": 3, "t": 4}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

# CEL evaluation errors surface as these builtin exceptions (a missing field as KeyError).
_CEL_ERRORS = (KeyError, RuntimeError, TypeError, ValueError)


# --- the CRD ------------------------------------------------------------------------------


def load_crd() -> dict[str, Any]:
    """The CustomResourceDefinition, parsed from ``crds/`` (a fresh copy each call)."""
    return copy.deepcopy(_crd())


def crd_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the CRD's storage version (a fresh copy each call)."""
    return copy.deepcopy(_storage_version(_crd())["schema"]["openAPIV3Schema"])


@functools.cache
def _crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
    return crd


def _storage_version(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    version: Mapping[str, Any] = next(v for v in crd["spec"]["versions"] if v["storage"])
    return version


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One thing wrong with a manifest: the field it is about (``""`` for the whole
    document) and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(ValueError):
    """A manifest that cannot be used; ``problems`` lists everything found, not just the
    first. Each line of the message names the file and the field."""

    def __init__(self, source: str, problems: Iterable[Problem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__("\n".join(f"{source}: {problem}" for problem in self.problems))


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
class EnvVar:
    name: str
    value: str


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
    incremental: bool


@dataclass(frozen=True, slots=True)
class SavepointsSpec:
    history_max_count: int
    history_max_age: float | None


@dataclass(frozen=True, slots=True)
class RestoreSpec:
    initial_savepoint_path: str | None


@dataclass(frozen=True, slots=True)
class RestartPolicySpec:
    type: RestartPolicyType
    max_retries: int
    backoff: float
    max_backoff: float


@dataclass(frozen=True, slots=True)
class ShutdownSpec:
    final_savepoint: bool
    drain: bool


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
        )


# --- entry points -------------------------------------------------------------------------


def load_manifest(path: str | os.PathLike[str]) -> JobManifest:
    """Read, validate and default the SparkCheckpointJob in the YAML file at ``path``."""
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        reason = error.strerror or str(error)
        raise ManifestError(source, [Problem("", f"cannot read the file: {reason}")]) from error
    except UnicodeDecodeError as error:
        raise ManifestError(source, [Problem("", f"not UTF-8 text: {error}")]) from error
    return parse_manifest(text, source)


def parse_manifest(text: str, source: str = "<manifest>") -> JobManifest:
    """Like ``load_manifest`` for YAML text; ``source`` names it in messages."""
    return manifest_from_document(_parse_yaml(text, source), source)


def manifest_from_document(document: object, source: str = "<manifest>") -> JobManifest:
    """Validate and default a parsed document, then convert it to a ``JobManifest``."""
    return _to_manifest(validate_document(document, source))


def validate_document(document: object, source: str = "<manifest>") -> dict[str, Any]:
    """Check a parsed SparkCheckpointJob against the CRD (schema and CEL rules) and return
    a defaulted copy, as the API server would store it; raise ``ManifestError`` listing
    every problem."""
    if not isinstance(document, dict):
        kind = "null" if document is None else type(document).__name__
        raise ManifestError(source, [Problem("", f"expected a SparkCheckpointJob, got {kind}")])
    checker = _checker()
    if problems := checker.envelope_problems(document):
        # Another kind of object: its fields would only bury the one problem that matters.
        raise ManifestError(source, problems)
    defaulted = copy.deepcopy(document)
    _apply_defaults(defaulted, checker.schema)
    if problems := checker.problems(defaulted):
        raise ManifestError(source, problems)
    return defaulted


# --- YAML ---------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of duplicate keys; a manifest with two ``interval:`` lines is a
    mistake worth reporting."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, source: str) -> object:
    try:
        documents = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = Problem("", f"{where}invalid YAML: {error.problem}")
        raise ManifestError(source, [problem]) from None
    except yaml.YAMLError as error:
        raise ManifestError(source, [Problem("", f"invalid YAML: {error}")]) from None
    if len(documents) != 1:
        found = "none" if not documents else str(len(documents))
        raise ManifestError(
            source, [Problem("", f"expected one SparkCheckpointJob document, found {found}")]
        )
    return documents[0]


# --- schema translation and checks --------------------------------------------------------


class _Checker:
    """The CRD's schema with local metadata rules, as JSON _Schema plus compiled CEL rules."""

    def __init__(self, crd: Mapping[str, Any]) -> None:
        names = crd["spec"]["names"]
        self.api_version = f"{crd['spec']['group']}/{_storage_version(crd)['name']}"
        self.kind: str = names["kind"]
        schema = copy.deepcopy(_storage_version(crd)["schema"]["openAPIV3Schema"])
        schema["properties"]["metadata"] = copy.deepcopy(_OBJECT_META)
        schema["required"] = sorted({*schema.get("required", ()), "metadata"})
        self.schema: _Schema = schema
        self.validator = Draft202012Validator(_to_json_schema(schema, "#"))
        self.programs = {rule: cel.compile(rule) for rule in _rules(schema)}

    def envelope_problems(self, document: Mapping[str, Any]) -> list[Problem]:
        problems = []
        for field, expected in (("apiVersion", self.api_version), ("kind", self.kind)):
            if field not in document:
                problems.append(Problem(field, f"required field is missing (use {expected})"))
            elif document[field] != expected:
                problems.append(Problem(field, f"must be {expected}, got {document[field]!r}"))
        return problems

    def problems(self, document: Mapping[str, Any]) -> list[Problem]:
        found: dict[Problem, None] = {}  # ordered and without duplicates
        error_paths: list[tuple[str | int, ...]] = []
        for error in self.validator.iter_errors(document):
            error_paths.append(tuple(error.absolute_path))
            found.update(dict.fromkeys(_schema_problems(error)))
        found.update(dict.fromkeys(self._walk_problems(document, self.schema, (), error_paths)))
        return sorted(found)

    def _walk_problems(
        self,
        value: Any,
        schema: _Schema,
        path: tuple[str | int, ...],
        error_paths: Sequence[tuple[str | int, ...]],
    ) -> Iterator[Problem]:
        """What JSON _Schema cannot express: CEL rules and unique keys of list maps."""
        # The API server skips the rules of an absent or null value.
        if value is None:
            return
        if isinstance(value, list) and (keys := schema.get("x-kubernetes-list-map-keys")):
            yield from _duplicate_keys(value, keys, path)
        if rules := schema.get("x-kubernetes-validations"):
            activation = {"self": _cel_value(value)}
            for rule in rules:
                try:
                    result = self.programs[rule["rule"]].execute(activation)
                except _CEL_ERRORS as error:
                    # A rule that cannot read a value the schema already rejected adds
                    # nothing; one that fails on a valid value is reported.
                    if not any(p[: len(path)] == path for p in error_paths):
                        yield Problem(_render(path), f"rule {rule['rule']!r} failed: {error}")
                    continue
                if result is not True:
                    field_path = [p for p in rule.get("fieldPath", "").split(".") if p]
                    yield Problem(
                        _render((*path, *field_path)),
                        rule.get("message") or f"failed rule: {rule['rule']}",
                    )
        if isinstance(value, dict):
            for key, child in value.items():
                if (child_schema := _child_schema(schema, key)) is not None:
                    yield from self._walk_problems(child, child_schema, (*path, key), error_paths)
        elif isinstance(value, list) and (items := schema.get("items")) is not None:
            for index, item in enumerate(value):
                yield from self._walk_problems(item, items, (*path, index), error_paths)


@functools.cache
def _checker() -> _Checker:
    return _Checker(_crd())


def _rules(schema: _Schema) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", ()):
        yield rule["rule"]
    for child in _child_schemas(schema):
        yield from _rules(child)


def _child_schemas(schema: _Schema) -> Iterator[_Schema]:
    yield from schema.get("properties", {}).values()
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), Mapping):
            yield schema[key]


def _child_schema(schema: _Schema, key: str) -> _Schema | None:
    if key in schema.get("properties", {}):
        child: _Schema = schema["properties"][key]
        return child
    additional = schema.get("additionalProperties")
    return additional if isinstance(additional, Mapping) else None


def _apply_defaults(value: Any, schema: _Schema | None) -> None:
    """Default ``value`` in place as the API server does: a missing field gets its
    default; a null in a field that is not nullable gets its default, or is dropped when
    there is none (a null in a nullable field is kept: ``interval: null`` means never)."""
    if schema is None:
        return
    if isinstance(value, dict):
        for key, child in schema.get("properties", {}).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
        for key in list(value):
            child = _child_schema(schema, key)
            if child is not None and value[key] is None and not child.get("nullable", False):
                if "default" not in child:
                    del value[key]
                    continue
                value[key] = copy.deepcopy(child["default"])
            _apply_defaults(value[key], child)
    elif isinstance(value, list):
        items = schema.get("items")
        for index, item in enumerate(value):
            if item is None and items is not None and not items.get("nullable", False):
                if "default" not in items:
                    continue  # the API server keeps null items; the schema rejects them
                value[index] = copy.deepcopy(items["default"])
            _apply_defaults(value[index], items)


# OpenAPI keywords whose JSON _Schema meaning is the same.
_SAME_KEYWORDS = frozenset(
    {
        "enum",
        "maxItems",
        "maxLength",
        "maxProperties",
        "maximum",
        "minItems",
        "minLength",
        "minProperties",
        "minimum",
        "multipleOf",
        "pattern",
        "required",
        "uniqueItems",
    }
)
# Keywords JSON _Schema does not check: defaults are applied before validation, formats
# are descriptive (int64, date-time), and CEL rules and list-map keys are checked by
# _Checker._walk_problems.
_IGNORED_KEYWORDS = frozenset(
    {
        "default",
        "description",
        "format",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-validations",
    }
)
_HANDLED_KEYWORDS = frozenset(
    {
        "additionalProperties",
        "items",
        "nullable",
        "properties",
        "type",
        "x-kubernetes-list-type",
        "x-kubernetes-preserve-unknown-fields",
    }
)


def _to_json_schema(schema: _Schema, pointer: str) -> dict[str, Any]:
    """Translate the structural OpenAPI v3 subset the CRD uses to JSON _Schema 2020-12.

    A keyword outside the subset raises, so the CRD cannot gain a constraint that local
    validation silently skips.
    """
    unsupported = set(schema) - _SAME_KEYWORDS - _IGNORED_KEYWORDS - _HANDLED_KEYWORDS
    if unsupported:
        raise ValueError(f"{pointer}: unsupported schema keywords {sorted(unsupported)}")
    result = {key: value for key, value in schema.items() if key in _SAME_KEYWORDS}
    nullable = schema.get("nullable", False)
    if "type" in schema:
        result["type"] = [schema["type"], "null"] if nullable else schema["type"]
    if nullable and "enum" in schema:
        result["enum"] = [*schema["enum"], None]
    if "properties" in schema:
        result["properties"] = {
            name: _to_json_schema(child, f"{pointer}/properties/{name}")
            for name, child in schema["properties"].items()
        }
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        result["additionalProperties"] = _to_json_schema(
            additional, f"{pointer}/additionalProperties"
        )
    elif additional is not None:
        result["additionalProperties"] = additional
    elif schema.get("type") == "object" and not schema.get(
        "x-kubernetes-preserve-unknown-fields", False
    ):
        # The API server would prune unknown fields silently; locally they are errors.
        result["additionalProperties"] = False
    if "items" in schema:
        result["items"] = _to_json_schema(schema["items"], f"{pointer}/items")
    if schema.get("x-kubernetes-list-type") == "set":
        result["uniqueItems"] = True
    return result


def _duplicate_keys(
    items: Sequence[Any], keys: Sequence[str], path: tuple[str | int, ...]
) -> Iterator[Problem]:
    """``x-kubernetes-list-type: map``: no two items may have the same key fields."""
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        key = json.dumps([item.get(name) for name in keys])
        if key in first_index:
            described = ", ".join(f"{name}={item.get(name)!r}" for name in keys)
            yield Problem(
                _render((*path, index)),
                f"duplicate entry ({described} is also at index {first_index[key]})",
            )
        else:
            first_index[key] = index


def _schema_problems(error: ValidationError) -> Iterator[Problem]:
    path = tuple(error.absolute_path)
    instance, schema = error.instance, error.schema
    if not isinstance(schema, Mapping):
        yield Problem(_render(path), error.message)
    elif error.validator == "required" and isinstance(instance, dict):
        for name in schema["required"]:
            if name not in instance:
                yield Problem(_render((*path, name)), "required field is missing")
    elif error.validator == "additionalProperties" and isinstance(instance, dict):
        known = list(schema.get("properties", {}))
        for name in sorted(set(instance) - set(known), key=str):
            close = difflib.get_close_matches(name, known, n=1) if isinstance(name, str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            yield Problem(_render((*path, name)), f"unknown field{hint}")
    elif error.validator in ("type", "pattern") and schema.get("pattern") in PATTERN_HINTS:
        yield Problem(_render(path), f"{instance!r} is not {PATTERN_HINTS[schema['pattern']]}")
    elif error.validator == "type":
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        expected = " or ".join(repr(t) for t in types if t != "null")
        yield Problem(_render(path), f"{instance!r} is not of type {expected}")
    else:
        yield Problem(_render(path), error.message)


def _render(path: Iterable[str | int]) -> str:
    """``spec.application.env[2].name``; keys that are not identifiers are bracketed."""
    rendered = ""
    for part in path:
        if isinstance(part, str) and _IDENTIFIER.fullmatch(part):
            rendered += f".{part}"
        elif isinstance(part, str):
            rendered += f"[{json.dumps(part)}]"
        else:  # a list index, or a YAML key that is not a string
            rendered += f"[{part}]"
    return rendered.removeprefix(".")


def _cel_value(value: Any) -> Any:
    # The API server gives CEL no null fields: has() is false for a field set to null.
    if isinstance(value, dict):
        return {k: _cel_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_cel_value(item) for item in value]
    return value


# --- conversion ---------------------------------------------------------------------------


def _seconds(duration: str) -> float:
    """A Go duration string (the CRD's pattern guarantees the form) in seconds."""
    return sum(
        float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION.findall(duration)
    )


def _optional_seconds(duration: str | None) -> float | None:
    return None if duration is None else _seconds(duration)


def _strings(mapping: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


def _objects(items: Sequence[Mapping[str, Any]] | None) -> tuple[Mapping[str, Any], ...]:
    return tuple(MappingProxyType(copy.deepcopy(dict(item))) for item in items or ())


def _env(items: Sequence[Mapping[str, str]] | None) -> tuple[EnvVar, ...]:
    return tuple(EnvVar(item["name"], item["value"]) for item in items or ())


def _pod_fields(role: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "cores": role["cores"],
        "memory": role["memory"],
        "service_account": role.get("serviceAccount"),
        "env": _env(role.get("env")),
        "node_selector": _strings(role.get("nodeSelector")),
        "tolerations": _objects(role.get("tolerations")),
        "volumes": _objects(role.get("volumes")),
        "volume_mounts": _objects(role.get("volumeMounts")),
        "labels": _strings(role.get("labels")),
        "annotations": _strings(role.get("annotations")),
    }


def _to_manifest(document: Mapping[str, Any]) -> JobManifest:
    """Convert a validated, defaulted document; its shape is guaranteed by the schema."""
    metadata, spec = document["metadata"], document["spec"]
    application = spec["application"]
    checkpointing = spec["checkpointing"]
    savepoints = spec["savepoints"]
    restart = spec["restartPolicy"]
    pull_policy = spec.get("imagePullPolicy")
    return JobManifest(
        name=metadata["name"],
        namespace=metadata["namespace"],
        labels=_strings(metadata.get("labels")),
        annotations=_strings(metadata.get("annotations")),
        spec=JobSpec(
            image=spec.get("image"),
            image_pull_policy=None if pull_policy is None else ImagePullPolicy(pull_policy),
            application=Application(
                main_file=application.get("mainFile"),
                module=application.get("module"),
                arguments=tuple(application.get("arguments", ())),
                spark_conf=_strings(application.get("sparkConf")),
                env=_env(application.get("env")),
            ),
            driver=RoleSpec(**_pod_fields(spec["driver"])),
            executor=ExecutorSpec(
                **_pod_fields(spec["executor"]), instances=spec["executor"]["instances"]
            ),
            checkpointing=CheckpointingSpec(
                interval=_optional_seconds(checkpointing.get("interval")),
                min_pause=_seconds(checkpointing["minPause"]),
                timeout=_seconds(checkpointing["timeout"]),
                max_concurrent=checkpointing["maxConcurrent"],
                tolerable_failures=checkpointing["tolerableFailures"],
                retained=checkpointing["retained"],
                storage=checkpointing.get("storage"),
                live_volume_claim=checkpointing.get("liveVolumeClaim"),
                retention_policy=RetentionPolicy(checkpointing["retentionPolicy"]),
                incremental=checkpointing["incremental"],
            ),
            savepoints=SavepointsSpec(
                history_max_count=savepoints["historyMaxCount"],
                history_max_age=_optional_seconds(savepoints.get("historyMaxAge")),
            ),
            restore=RestoreSpec(
                initial_savepoint_path=spec.get("restore", {}).get("initialSavepointPath")
            ),
            restart_policy=RestartPolicySpec(
                type=RestartPolicyType(restart["type"]),
                max_retries=restart["maxRetries"],
                backoff=_seconds(restart["backoff"]),
                max_backoff=_seconds(restart["maxBackoff"]),
            ),
            state=JobState(spec["state"]),
            checkpoint_trigger_nonce=spec.get("checkpointTriggerNonce"),
            savepoint_trigger_nonce=spec.get("savepointTriggerNonce"),
            shutdown=ShutdownSpec(
                final_savepoint=spec["shutdown"]["finalSavepoint"],
                drain=spec["shutdown"]["drain"],
            ),
        ),
    )
