"""SparkCheckpointJob manifests: validated locally as the API server would, then typed.

The CRD in ``crds/`` is the one source of truth. A manifest is checked against its
``openAPIV3Schema`` (translated to JSON Schema), defaulted like the API server defaults it,
and its CEL rules (``x-kubernetes-validations``) are evaluated with the
``common-expression-language`` package. Unlike the API server, which silently prunes unknown
fields, a local manifest with an unknown field is rejected, so a misspelt setting is never
silently ignored. Every problem is reported, each on one line naming the file and the field.

Otherwise the verdict is the API server's: patterns match as Go's RE2 does (``$`` is the end
of the text), integers are int64 (an integral float is stored as an integer), and a file
is bounded in size, nesting and alias expansion, so hostile YAML costs bounded time.

The package ships the CRD as package data next to this module: in the checkout a symlink to
the ``crds/`` file, which the wheel build copies as a file.
"""

import copy
import difflib
import functools
import itertools
import json
import math
import os
import re
import reprlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

import cel
import yaml
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

from spark_checkpoint.storage.layout import (
    DNS_1123_LABEL_MAX_LENGTH,
    DNS_1123_LABEL_PATTERN,
    DNS_1123_SUBDOMAIN_MAX_LENGTH,
    DNS_1123_SUBDOMAIN_PATTERN,
)
from spark_checkpoint_operator.coordinator import (
    CoordinatorConfig,
    RetentionPolicy,
    SavepointHistoryLimits,
)

# Next to this module, not through importlib.resources: on Python 3.11 that cannot read a
# namespace package (this one has no __init__.py) installed in editable mode.
CRD_PATH = Path(__file__).with_name("sparkcheckpointjobs.sparkcheckpoint.io.yaml")

_Schema = Mapping[str, Any]

# The DNS-1123 subdomain pattern as the CRD spells it (Go's RE2 has no lookahead, so the
# CRD cannot use spark_checkpoint.storage.layout's; both anchor at the very end).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# Label and annotation keys and label values, as Kubernetes validates them on every object
# (k8s.io/apimachinery: a qualified name with an optional DNS-subdomain prefix of at most
# 253 characters; a name part and a value of at most 63).
QUALIFIED_NAME_PATTERN = (
    r"^((?=[^/]{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

# The API server validates ObjectMeta itself, so a local manifest's metadata is checked
# against this subset; the CRD may only restrict metadata.name further (its maxLength).
_OBJECT_META: _Schema = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {
            "type": "string",
            "maxLength": DNS_1123_SUBDOMAIN_MAX_LENGTH,
            "pattern": DNS_1123_SUBDOMAIN_PATTERN,
        },
        "namespace": {
            "type": "string",
            "maxLength": DNS_1123_LABEL_MAX_LENGTH,
            "pattern": DNS_1123_LABEL_PATTERN,
            "default": "default",
        },
        "labels": {
            "type": "object",
            "additionalProperties": {"type": "string", "pattern": LABEL_VALUE_PATTERN},
        },
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

# Bounds on a manifest file, so that hostile YAML costs bounded time and memory. Aliases
# are expanded when the document is used, so a 1 KB file of nested aliases (a "billion
# laughs") stands for billions of values: the expanded size is what is bounded. The API
# server's own bounds are larger (3 MiB requests, 10,000 levels of nesting), but PyYAML
# reads some 25,000 tokens a second; no job manifest comes near these bounds.
MAX_MANIFEST_BYTES = 512 << 10
MAX_MANIFEST_VALUES = 10_000  # scalars, lists and mappings, with aliases expanded
MAX_MANIFEST_DEPTH = 64
# A document that is wrong everywhere is reported by its first problems.
MAX_PROBLEMS = 50

# JSON integers the API server accepts: int64. A float is accepted where an integer is
# expected only if it is integral and exactly representable (|f| < 2**53, go-openapi's
# IsFloat64AJSONInteger); the API server then stores it as an integer (2.0 becomes 2).
_INT64 = range(-(1 << 63), 1 << 63)
_MAX_EXACT_FLOAT_INTEGER = float((1 << 53) - 1)

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist = 2, 4, 4

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
    DNS_1123_SUBDOMAIN_PATTERN: (
        "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending"
        " with a letter or digit)"
    ),
    DNS_1123_LABEL_PATTERN: (
        "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a"
        " letter or digit)"
    ),
    QUALIFIED_NAME_PATTERN: (
        "a label or annotation key (an optional DNS subdomain and '/', then at most 63"
        " letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
    ),
    LABEL_VALUE_PATTERN: (
        "a label value (empty, or at most 63 letters, digits, '-', '_' and '.', starting"
        " and ending with a letter or digit)"
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
    # Each completed image is proven restorable by Spark in the background; one that is
    # not is recorded as unrestorable, so restores skip it.
    verify_restorable: bool = False


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
        with Path(path).open("rb") as file:
            data = file.read(MAX_MANIFEST_BYTES + 1)
        text = data.decode("utf-8")
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
    if deeper_than(document, MAX_MANIFEST_DEPTH):
        nested = f"nested more than {MAX_MANIFEST_DEPTH} levels deep"
        raise ManifestError(source, [Problem("", nested)])
    checker = _checker()
    if problems := checker.envelope_problems(document):
        # Another kind of object: its fields would only bury the one problem that matters.
        raise ManifestError(source, problems)
    defaulted: dict[str, Any] = _expanded_copy(document)
    _apply_defaults(defaulted, checker.schema)
    _store_integers(defaulted, checker.schema)
    if problems := checker.problems(defaulted):
        raise ManifestError(source, problems)
    return defaulted


def _expanded_copy(value: Any) -> Any:
    """A copy in which a value used twice (a YAML alias) becomes two values, as the API
    server's YAML-to-JSON conversion makes it: defaulting one must not change the other.
    (``copy.deepcopy`` keeps shared values shared.)"""
    if isinstance(value, dict):
        return {key: _expanded_copy(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_expanded_copy(item) for item in value]
    return copy.deepcopy(value)


def deeper_than(document: object, limit: int) -> bool:
    """Whether lists and mappings nest more than ``limit`` levels (checked without recursion:
    validation recurses, and a document from an API request has no YAML bounds)."""
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


# --- YAML ---------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of duplicate keys; a manifest with two ``interval:`` lines is a
    mistake worth reporting. Composing is recursive, so nesting is bounded as it is read."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.values = 0

    def fetch_flow_collection_start(self, TokenClass: type[yaml.Token]) -> None:
        # The scanner looks ahead over every open bracket (each may start a key), so deep
        # flow nesting is refused here, before it costs quadratic time.
        if self.flow_level >= MAX_MANIFEST_DEPTH:
            raise yaml.scanner.ScannerError(
                None,
                None,
                f"nested more than {MAX_MANIFEST_DEPTH} levels deep",
                self.get_mark(),
            )
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        self.depth += 1
        self.values += not isinstance(event, yaml.AliasEvent)
        try:
            if self.depth > MAX_MANIFEST_DEPTH or self.values > MAX_MANIFEST_VALUES:
                too_many = f"more than {MAX_MANIFEST_VALUES} values"
                too_deep = f"nested more than {MAX_MANIFEST_DEPTH} levels deep"
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    too_deep if self.depth > MAX_MANIFEST_DEPTH else too_many,
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


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
                None, None, f"duplicate key {_shown(key)}", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, source: str) -> object:
    if len(text.encode("utf-8", errors="replace")) > MAX_MANIFEST_BYTES:
        problem = Problem("", f"larger than {MAX_MANIFEST_BYTES} bytes; a manifest is far smaller")
        raise ManifestError(source, [problem])
    try:
        documents = _documents(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = Problem("", _clip(f"{where}invalid YAML: {error.problem}"))
        raise ManifestError(source, [problem]) from None
    except yaml.YAMLError as error:  # e.g. a control character, which has no mark
        raise ManifestError(source, [Problem("", _clip(f"invalid YAML: {error}"))]) from None
    if len(documents) != 1:
        found = "none" if not documents else str(len(documents))
        raise ManifestError(
            source, [Problem("", f"expected one SparkCheckpointJob document, found {found}")]
        )
    return documents[0]


def _documents(text: str) -> list[object]:
    loader = _StrictLoader(text)
    try:
        documents = []
        while loader.check_node():
            if (node := loader.get_node()) is None:
                break
            _check_expanded_size(node)
            if (document := loader.construct_document(node)) is not None:
                documents.append(document)
        return documents
    finally:
        loader.dispose()


def _check_expanded_size(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand it beyond MAX_MANIFEST_VALUES values or
    MAX_MANIFEST_DEPTH levels, or that contains itself; computed on the composed nodes
    (each counted once), without expanding anything."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded values, depth)
    visiting: set[int] = set()
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack[-1]
        if id(node) in sizes:
            stack.pop()
            continue
        children = _child_nodes(node)
        if id(node) not in visiting:
            visiting.add(id(node))
            for child in children:
                if id(child) in visiting:
                    raise yaml.composer.ComposerError(
                        None, None, "an alias refers to a value that contains it", node.start_mark
                    )
                if id(child) not in sizes:
                    stack.append(child)
            continue
        stack.pop()
        visiting.discard(id(node))
        size = 1 + sum(sizes[id(child)][0] for child in children)
        depth = 1 + max((sizes[id(child)][1] for child in children), default=0)
        if size > MAX_MANIFEST_VALUES or depth > MAX_MANIFEST_DEPTH:
            limit = (
                f"more than {MAX_MANIFEST_VALUES} values"
                if size > MAX_MANIFEST_VALUES
                else f"more than {MAX_MANIFEST_DEPTH} levels deep"
            )
            raise yaml.composer.ComposerError(
                None, None, f"{limit} once its aliases are expanded", node.start_mark
            )
        sizes[id(node)] = (size, depth)


def _child_nodes(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


# --- schema translation and checks --------------------------------------------------------


class _Checker:
    """The CRD's schema with local metadata rules, as JSON _Schema plus compiled CEL rules."""

    def __init__(self, crd: Mapping[str, Any]) -> None:
        names = crd["spec"]["names"]
        self.api_version = f"{crd['spec']['group']}/{_storage_version(crd)['name']}"
        self.kind: str = names["kind"]
        schema = copy.deepcopy(_storage_version(crd)["schema"]["openAPIV3Schema"])
        schema["properties"]["metadata"] = _object_meta(schema["properties"]["metadata"])
        schema["required"] = sorted({*schema.get("required", ()), "metadata"})
        self.schema: _Schema = schema
        json_schema = _to_json_schema(schema, "#")
        # Keys are checked as names (OpenAPI's structural subset has no keyword for it).
        for field in ("labels", "annotations"):
            metadata_field = json_schema["properties"]["metadata"]["properties"][field]
            metadata_field["propertyNames"] = {"pattern": QUALIFIED_NAME_PATTERN}
        self.validator = _KubernetesValidator(json_schema)
        self.programs = {rule: cel.compile(rule) for rule in _rules(schema)}

    def envelope_problems(self, document: Mapping[str, Any]) -> list[Problem]:
        problems = []
        for field, expected in (("apiVersion", self.api_version), ("kind", self.kind)):
            if field not in document:
                problems.append(Problem(field, f"required field is missing (use {expected})"))
            elif document[field] != expected:
                got = _shown(document[field])
                problems.append(Problem(field, f"must be {expected}, got {got}"))
        return problems

    def problems(self, document: Mapping[str, Any]) -> list[Problem]:
        found: dict[Problem, None] = {}  # ordered and without duplicates
        error_paths: list[tuple[str | int, ...]] = []
        for error in itertools.islice(self.validator.iter_errors(document), MAX_PROBLEMS + 1):
            error_paths.append(tuple(error.absolute_path))
            found.update(dict.fromkeys(_schema_problems(error)))
        walked = self._walk_problems(document, self.schema, (), error_paths)
        found.update(dict.fromkeys(itertools.islice(walked, MAX_PROBLEMS + 1)))
        problems = sorted(found)
        if len(problems) > MAX_PROBLEMS:
            more = Problem("", f"(and more problems; only the first {MAX_PROBLEMS} are listed)")
            return [*problems[:MAX_PROBLEMS], more]
        return problems

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
                        failed = f"rule {rule['rule']!r} failed: {error}"
                        yield Problem(_render(path), _clip(failed))
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


def _object_meta(crd_metadata: _Schema) -> dict[str, Any]:
    """ObjectMeta's rules, with the CRD's further restriction of metadata.name (a structural
    schema may restrict only name and generateName; this CRD restricts the name's length)."""
    metadata = copy.deepcopy(dict(_OBJECT_META))
    crd_name = crd_metadata.get("properties", {}).get("name", {})
    if unsupported := set(crd_name) - {"type", "description", "maxLength"}:
        raise ValueError(f"metadata.name: unsupported schema keywords {sorted(unsupported)}")
    name = metadata["properties"]["name"]
    name["maxLength"] = min(name["maxLength"], crd_name.get("maxLength", name["maxLength"]))
    return metadata


@functools.cache
def go_regex(pattern: str) -> re.Pattern[str]:
    """A CRD pattern as the API server matches it (Go's RE2; the schema says ECMA-262):
    ``$`` matches only at the very end of the text, where Python's also matches before a
    final newline (``"probe\\n"`` would pass ``^[a-z]+$``)."""
    translated, escaped, in_class = [], False, False
    for char in pattern:
        end_of_text = False
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        else:
            end_of_text = char == "$"
        translated.append(r"\Z" if end_of_text else char)
    return re.compile("".join(translated), re.ASCII)


def _pattern_keyword(
    validator: Validator, pattern: str, instance: object, schema: _Schema
) -> Iterator[ValidationError]:
    if isinstance(instance, str) and not go_regex(pattern).search(instance):
        yield ValidationError(f"{_shown(instance)} does not match {pattern!r}")


def _is_int64(checker: object, instance: object) -> bool:
    """The API server's integers: int64, never a boolean. (Integral floats were already
    stored as integers, see _store_integers.)"""
    return isinstance(instance, int) and not isinstance(instance, bool) and instance in _INT64


_KubernetesValidator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {"pattern": _pattern_keyword},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_int64),
)


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


def _store_integers(value: Any, schema: _Schema | None) -> None:
    """Turn integral floats in integer fields into integers in place, as the API server
    stores them: it accepts 2.0 for an integer (go-openapi's IsFloat64AJSONInteger) and
    its JSON encoding writes it as 2. Other floats are left for the schema to reject."""
    if schema is None:
        return
    entries: Iterable[tuple[Any, _Schema | None]]
    if isinstance(value, dict):
        entries = [(key, _child_schema(schema, key)) for key in value]
    elif isinstance(value, list):
        entries = [(index, schema.get("items")) for index in range(len(value))]
    else:
        return
    for key, child_schema in entries:
        child = value[key]
        if (
            child_schema is not None
            and child_schema.get("type") == "integer"
            and isinstance(child, float)
            and child.is_integer()
            and abs(child) <= _MAX_EXACT_FLOAT_INTEGER
        ):
            value[key] = int(child)
        else:
            _store_integers(child, child_schema)


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
    shown = _shown(instance)
    if not isinstance(schema, Mapping):
        yield Problem(_render(path), _clip(error.message))
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
        yield Problem(_render(path), f"{shown} is not {PATTERN_HINTS[schema['pattern']]}")
    elif error.validator == "type" and isinstance(instance, int) and instance not in _INT64:
        yield Problem(_render(path), f"{shown} is outside the range of a 64-bit integer")
    elif error.validator == "type":
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        expected = " or ".join(repr(t) for t in types if t != "null")
        yield Problem(_render(path), f"{shown} is not of type {expected}")
    elif error.validator == "maxLength":
        yield Problem(_render(path), f"{shown} is longer than {schema['maxLength']} characters")
    elif error.validator in ("minimum", "maximum"):
        bound = (
            "less than the minimum" if error.validator == "minimum" else "greater than the maximum"
        )
        yield Problem(_render(path), f"{shown} is {bound} of {schema[error.validator]}")
    elif error.validator == "enum":
        yield Problem(_render(path), f"{shown} is not one of {schema['enum']!r}")
    else:
        yield Problem(_render(path), _clip(error.message))


def _shown(value: object) -> str:
    """A value as a message quotes it: its repr, cut short."""
    return _clip(_SHORT.repr(value), 100)


def _clip(message: str, limit: int = 300) -> str:
    """One bounded line: a message may quote a value of any size."""
    line = message.replace("\r", "\\r").replace("\n", "\\n")
    return line if len(line) <= limit else f"{line[: limit - 1]}…"


def _render(path: Iterable[str | int]) -> str:
    """``spec.application.env[2].name``; keys that are not identifiers are bracketed."""
    rendered = ""
    for part in path:
        if isinstance(part, str) and _IDENTIFIER.fullmatch(part) and len(part) <= 80:
            rendered += f".{part}"
        elif isinstance(part, str):
            rendered += f"[{_clip(json.dumps(part), 80)}]"
        else:  # a list index, or a YAML key that is not a string
            rendered += f"[{_shown(part)}]"
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
                verify_restorable=checkpointing["verifyRestorable"],
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
