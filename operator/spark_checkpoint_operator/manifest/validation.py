"""A SparkCheckpointJob checked as the API server checks it: the CRD's schema (translated
to JSON Schema) with ObjectMeta's rules, then its CEL rules and list-map keys.

Unlike the API server, which silently prunes unknown fields, an unknown field is a problem.
Patterns match as Go's RE2 does (``$`` is the end of the text) and integers are int64.
"""

import copy
import difflib
import functools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

from spark_checkpoint.storage.layout import (
    DNS_1123_LABEL_MAX_LENGTH,
    DNS_1123_LABEL_PATTERN,
    DNS_1123_SUBDOMAIN,
    DNS_1123_SUBDOMAIN_MAX_LENGTH,
    DNS_1123_SUBDOMAIN_PATTERN,
)
from spark_checkpoint_operator.manifest import go_duration
from spark_checkpoint_operator.manifest.cel_rules import cel
from spark_checkpoint_operator.manifest.crd import (
    JOB_CRD,
    Schema,
    cached_crd,
    child_schema,
    child_schemas,
    resource_api_version,
    resource_kind,
    storage_version,
)
from spark_checkpoint_operator.manifest.defaults import (
    apply_defaults,
    expanded_copy,
    store_integers,
)
from spark_checkpoint_operator.manifest.problems import (
    ManifestError,
    Problem,
    clip,
    render_path,
    shown,
)

# The DNS-1123 subdomain pattern as the CRD spells it (Go's RE2 has no lookahead, so the
# CRD cannot use spark_checkpoint.storage.layout's anchoring; go_regex makes its `$` the
# very end, as layout's is).
_DNS_SUBDOMAIN = f"^{DNS_1123_SUBDOMAIN}$"

# Label and annotation keys and label values, as Kubernetes validates them on every object
# (k8s.io/apimachinery: a qualified name with an optional DNS-subdomain prefix of at most
# 253 characters; a name part and a value of at most 63).
QUALIFIED_NAME_PATTERN = (
    rf"^((?=[^/]{{1,{DNS_1123_SUBDOMAIN_MAX_LENGTH}}}/){DNS_1123_SUBDOMAIN}/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

# Where Kubernetes puts an object whose manifest names no namespace (kubectl's default).
DEFAULT_NAMESPACE = "default"

# The API server validates ObjectMeta itself, so a local manifest's metadata is checked
# against this subset; the CRD may only restrict metadata.name further (its maxLength).
_ANY_OBJECT: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_OBJECT_META: Schema = {
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
            "default": DEFAULT_NAMESPACE,
        },
        "labels": {
            "type": "object",
            "additionalProperties": {"type": "string", "pattern": LABEL_VALUE_PATTERN},
        },
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        # What the API server sets, in a manifest exported with `kubectl get -o yaml`:
        # taken, and not used by a local run.
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": "string"},
        "deletionTimestamp": {"type": "string"},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "generateName": {"type": "string"},
        "selfLink": {"type": "string"},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": _ANY_OBJECT},
        "managedFields": {"type": "array", "items": _ANY_OBJECT},
    },
}

# Documents nest at most this deep (the API server allows 10,000 levels; no job manifest
# comes near this).
MAX_MANIFEST_DEPTH = 64
# A document that is wrong everywhere is reported by its first problems.
MAX_PROBLEMS = 50

# JSON integers the API server accepts: int64 (an integral float in an integer field was
# already stored as an integer, see defaults.store_integers).
_INT64 = range(-(1 << 63), 1 << 63)

_DNS_SUBDOMAIN_HINT = (
    "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending"
    " with a letter or digit)"
)
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
    r"^[-._a-zA-Z0-9]+$": "a Secret key (letters, digits, '-', '.' and '_')",
    _DNS_SUBDOMAIN: _DNS_SUBDOMAIN_HINT,
    DNS_1123_SUBDOMAIN_PATTERN: _DNS_SUBDOMAIN_HINT,
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

# Problem.keyword of a CEL rule's problem and of a list map's duplicate keys; the others are
# JSON Schema's keywords.
_RULE = "x-kubernetes-validations"
_UNIQUE_KEYS = "x-kubernetes-list-map-keys"

# CEL evaluation errors surface as these builtin exceptions (a missing field as KeyError).
_CEL_ERRORS = (KeyError, RuntimeError, TypeError, ValueError)


def validate_document(document: object, source: str = "<manifest>") -> dict[str, Any]:
    """Check a parsed SparkCheckpointJob against the CRD (schema and CEL rules) and return
    a defaulted copy, as the API server would store it; raise ``ManifestError`` listing
    every problem."""
    defaulted, _ = validate_update(document, None, source)
    return defaulted


def validate_update(
    document: object,
    previous: Mapping[str, Any] | None,
    source: str = "<manifest>",
    crd: str = JOB_CRD,
) -> tuple[dict[str, Any], tuple[Problem, ...]]:
    """Check an object of ``crd`` (a SparkCheckpointJob unless said) that replaces
    ``previous`` (None: a new one) as the API server checks an update, with its validation
    ratcheting (Kubernetes 1.30 on): a problem whose judged value is unchanged from
    ``previous`` (a rule tightened since that value was let in) is tolerated, any other
    raised. Returns the defaulted copy and the problems tolerated."""
    checker = _checker(crd)
    if not isinstance(document, dict):
        kind = "null" if document is None else type(document).__name__
        raise ManifestError(source, [Problem("", f"expected a {checker.kind}, got {kind}")])
    if deeper_than(document, MAX_MANIFEST_DEPTH):
        nested = f"nested more than {MAX_MANIFEST_DEPTH} levels deep"
        raise ManifestError(source, [Problem("", nested)])
    if problems := checker.envelope_problems(document):
        # Another kind of object: its fields would only bury the one problem that matters.
        raise ManifestError(source, problems)
    defaulted = checker.defaulted(document)
    problems, tolerated = checker.problems(defaulted)
    if problems and isinstance(previous, dict) and not deeper_than(previous, MAX_MANIFEST_DEPTH):
        # Checked again against the stored object only when there is something to ratchet:
        # most updates (the operator's status writes) have nothing.
        problems, tolerated = checker.problems(defaulted, checker.defaulted(previous))
    if problems:
        raise ManifestError(source, problems)
    return defaulted, tolerated


def field_problems(path: Sequence[str], value: object) -> list[Problem]:
    """What the CRD's schema and rules find wrong with ``value`` as the field at ``path``
    (such as ``("spec", "checkpointing", "storage")``), with paths relative to it: a
    command-line option standing for a manifest's field is judged by the field's rules."""
    return _checker().field_problems(path, value)


class _Ratchet:
    """Which problems of an update the API server's ratcheting lets through, ``old`` being
    the stored object: those of a value unchanged from the value ``old`` holds at the same
    place, or under an unchanged ancestor (an atomic list compared whole). Values are found
    as the API server correlates them: object fields by name, the items of a list map by
    their keys; other lists' items are not correlated. Each place is looked up and compared
    once per update, so a document of many tolerated problems costs no more than a few
    walks of it. An unknown field is not ratcheted: the API server prunes unknown fields
    (it never stores one), and an operator older than its CRD would drop the setting
    without a word. Duplicate keys of list maps are not checked when the stored object had
    any (kube-apiserver skips that check on the whole object then)."""

    def __init__(self, new: Any, old: Any, schema: Schema) -> None:
        self._old = old
        self._schema = schema
        # By place: the new and the stored value there with their schema; None where the
        # stored object has none to correlate.
        self._places: dict[tuple[str | int, ...], tuple[Any, Any, Schema | None] | None] = {
            (): (new, old, schema)
        }
        self._unchanged: dict[tuple[str | int, ...], bool] = {}
        self._keyed: dict[tuple[str | int, ...], dict[str, list[Any]]] = {}
        self._old_has_duplicates: bool | None = None

    def tolerates(self, problem: Problem) -> bool:
        if not problem.location or problem.keyword == "additionalProperties":
            return False
        if problem.keyword == _UNIQUE_KEYS:
            if self._old_has_duplicates is None:
                self._old_has_duplicates = _has_duplicate_keys(self._old, self._schema)
            return self._old_has_duplicates
        for depth in range(len(problem.location) + 1):
            place = problem.location[:depth]
            if (values := self._place(place)) is None:
                return False
            if place not in self._unchanged:
                self._unchanged[place] = _same(values[0], values[1])
            if self._unchanged[place]:
                return True
        return False

    def _place(self, place: tuple[str | int, ...]) -> tuple[Any, Any, Schema | None] | None:
        if place in self._places:
            return self._places[place]
        parent = self._place(place[:-1])
        found = None if parent is None else self._child(place, *parent)
        self._places[place] = found
        return found

    def _child(
        self, place: tuple[str | int, ...], new: Any, old: Any, schema: Schema | None
    ) -> tuple[Any, Any, Schema | None] | None:
        step = place[-1]
        if isinstance(step, str):
            if isinstance(new, dict) and isinstance(old, dict) and step in new and step in old:
                child = child_schema(schema, step) if schema is not None else None
                return new[step], old[step], child
            return None
        keys = schema.get("x-kubernetes-list-map-keys") if schema is not None else None
        if not keys or not isinstance(new, list) or not isinstance(old, list):
            return None
        if not 0 <= step < len(new) or not isinstance(new[step], dict):
            return None
        parent = place[:-1]
        if parent not in self._keyed:
            keyed: dict[str, list[Any]] = {}
            for item in old:
                if isinstance(item, dict):
                    keyed.setdefault(_key(item, keys), []).append(item)
            self._keyed[parent] = keyed
        matches = self._keyed[parent].get(_key(new[step], keys), [])
        items = schema.get("items") if schema is not None else None
        return (new[step], matches[0], items) if len(matches) == 1 else None


def _key(item: Mapping[str, Any], keys: Sequence[str]) -> str:
    return json.dumps([item.get(name) for name in keys], sort_keys=True, default=repr)


def _has_duplicate_keys(value: Any, schema: Schema | None) -> bool:
    """Whether any list map in ``value`` has two items of the same keys."""
    stack = [(value, schema)]
    while stack:
        value, schema = stack.pop()
        if schema is None:
            continue
        if isinstance(value, list):
            if (keys := schema.get("x-kubernetes-list-map-keys")) and any(
                _duplicate_keys(value, keys, ())
            ):
                return True
            stack.extend((item, schema.get("items")) for item in value)
        elif isinstance(value, dict):
            stack.extend((child, child_schema(schema, key)) for key, child in value.items())
    return False


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``true`` is not ``1``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


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


class _Checker:
    """The CRD's schema with local metadata rules, as JSON Schema plus compiled CEL rules."""

    def __init__(self, crd: Mapping[str, Any]) -> None:
        self.api_version = resource_api_version(crd)
        self.kind = resource_kind(crd)
        schema = copy.deepcopy(storage_version(crd)["schema"]["openAPIV3Schema"])
        schema["properties"]["metadata"] = _object_meta(schema["properties"]["metadata"])
        schema["required"] = sorted({*schema.get("required", ()), "metadata"})
        self.schema: Schema = schema
        json_schema = _to_json_schema(schema, "#")
        # Keys are checked as names (OpenAPI's structural subset has no keyword for it).
        for field in ("labels", "annotations"):
            metadata_field = json_schema["properties"]["metadata"]["properties"][field]
            metadata_field["propertyNames"] = {"pattern": QUALIFIED_NAME_PATTERN}
        self.validator = _KubernetesValidator(json_schema)
        self.programs = {rule: _compiled(rule) for rule in _rules(schema)}

    def envelope_problems(self, document: Mapping[str, Any]) -> list[Problem]:
        problems = []
        for field, expected in (("apiVersion", self.api_version), ("kind", self.kind)):
            if field not in document:
                problems.append(Problem(field, f"required field is missing (use {expected})"))
            elif document[field] != expected:
                got = shown(document[field])
                problems.append(Problem(field, f"must be {expected}, got {got}"))
        return problems

    def defaulted(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """A copy defaulted as the API server stores it."""
        defaulted: dict[str, Any] = expanded_copy(document)
        apply_defaults(defaulted, self.schema)
        store_integers(defaulted, self.schema)
        return defaulted

    def problems(
        self, document: Mapping[str, Any], previous: Mapping[str, Any] | None = None
    ) -> tuple[list[Problem], tuple[Problem, ...]]:
        """The problems of ``document``, and apart from them those ratcheted against
        ``previous`` (the stored object of an update): the first are bounded, the second
        are bounded by the document's size."""
        found: dict[Problem, None] = {}  # ordered and without duplicates
        tolerated: dict[Problem, None] = {}
        ratchet = None if previous is None else _Ratchet(document, previous, self.schema)

        def refused(problem: Problem) -> bool:
            if ratchet is not None and ratchet.tolerates(problem):
                tolerated[problem] = None
                return False
            found[problem] = None
            return True

        # A rule that cannot evaluate a value already refused adds nothing; one that
        # cannot evaluate a tolerated value is reported (the object around it changed).
        error_paths: list[tuple[str | int, ...]] = []
        for error in self.validator.iter_errors(document):
            judged = tuple(error.absolute_path)
            problems = [
                replace(p, location=judged, keyword=str(error.validator))
                for p in _schema_problems(error)
            ]
            if [p for p in problems if refused(p)]:
                error_paths.append(judged)
            if len(found) > MAX_PROBLEMS:
                break
        schema_problems = len(found)
        for problem in self._walk_problems(document, self.schema, (), error_paths):
            if refused(problem) and len(found) - schema_problems > MAX_PROBLEMS:
                break
        problems = sorted(found)
        if len(problems) > MAX_PROBLEMS:
            more = Problem("", f"(and more problems; only the first {MAX_PROBLEMS} are listed)")
            problems = [*problems[:MAX_PROBLEMS], more]
        return problems, tuple(sorted(tolerated))

    def field_problems(self, path: Sequence[str], value: object) -> list[Problem]:
        schema = self.schema
        for key in path:
            field_schema = child_schema(schema, key)
            if field_schema is None:
                raise KeyError(f"the CRD has no field {render_path(path)}")
            schema = field_schema
        validator = _KubernetesValidator(_to_json_schema(schema, "#"))
        problems = [p for error in validator.iter_errors(value) for p in _schema_problems(error)]
        # A rule would only repeat what the schema refused (as in ``problems``).
        return problems or list(self._walk_problems(value, schema, (), ()))

    def _walk_problems(
        self,
        value: Any,
        schema: Schema,
        path: tuple[str | int, ...],
        error_paths: Sequence[tuple[str | int, ...]],
    ) -> Iterator[Problem]:
        """What JSON Schema cannot express: CEL rules and unique keys of list maps."""
        # The API server skips the rules of an absent or null value.
        if value is None:
            return
        if isinstance(value, list) and (keys := schema.get("x-kubernetes-list-map-keys")):
            yield from _duplicate_keys(value, keys, path)
        if rules := schema.get("x-kubernetes-validations"):
            activation = {"self": _cel_value(value), _EXACT_DURATION: _exact_duration}
            for rule in rules:
                try:
                    result = self.programs[rule["rule"]].execute(activation)
                except _CEL_ERRORS as error:
                    # A rule that cannot read a value the schema already rejected adds
                    # nothing; one that fails on a valid value is reported.
                    if not any(p[: len(path)] == path for p in error_paths):
                        failed = f"rule {rule['rule']!r} failed: {error}"
                        yield Problem(render_path(path), clip(failed), path, _RULE)
                    continue
                if result is not True:
                    field_path = [p for p in rule.get("fieldPath", "").split(".") if p]
                    yield Problem(
                        render_path((*path, *field_path)),
                        rule.get("message") or f"failed rule: {rule['rule']}",
                        path,  # the rule judged its object, whatever field it names
                        _RULE,
                    )
        if isinstance(value, dict):
            for key, child in value.items():
                if (field_schema := child_schema(schema, key)) is not None:
                    yield from self._walk_problems(child, field_schema, (*path, key), error_paths)
        elif isinstance(value, list) and (items := schema.get("items")) is not None:
            for index, item in enumerate(value):
                yield from self._walk_problems(item, items, (*path, index), error_paths)


@functools.cache
def _checker(crd: str = JOB_CRD) -> _Checker:
    return _Checker(cached_crd(crd))


def _object_meta(crd_metadata: Schema) -> dict[str, Any]:
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
    validator: Validator, pattern: str, instance: object, schema: Schema
) -> Iterator[ValidationError]:
    if isinstance(instance, str) and not go_regex(pattern).search(instance):
        yield ValidationError(f"{shown(instance)} does not match {pattern!r}")


def _is_int64(checker: object, instance: object) -> bool:
    """The API server's integers: int64, never a boolean. (Integral floats were already
    stored as integers, see defaults.store_integers.)"""
    return isinstance(instance, int) and not isinstance(instance, bool) and instance in _INT64


_KubernetesValidator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {"pattern": _pattern_keyword},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_int64),
)


def _rules(schema: Schema) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", ()):
        yield rule["rule"]
    for child in child_schemas(schema):
        yield from _rules(child)


# OpenAPI keywords whose JSON Schema meaning is the same.
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
# Keywords JSON Schema does not check: defaults are applied before validation, formats
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


def _to_json_schema(schema: Schema, pointer: str) -> dict[str, Any]:
    """Translate the structural OpenAPI v3 subset the CRD uses to JSON Schema 2020-12.

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
                render_path((*path, index)),
                f"duplicate entry ({described} is also at index {first_index[key]})",
                path,
                _UNIQUE_KEYS,
            )
        else:
            first_index[key] = index


def _schema_problems(error: ValidationError) -> Iterator[Problem]:
    path = tuple(error.absolute_path)
    instance, schema = error.instance, error.schema
    quoted = shown(instance)
    if not isinstance(schema, Mapping):
        yield Problem(render_path(path), clip(error.message))
    elif error.validator == "required" and isinstance(instance, dict):
        for name in schema["required"]:
            if name not in instance:
                yield Problem(render_path((*path, name)), "required field is missing")
    elif error.validator == "additionalProperties" and isinstance(instance, dict):
        known = list(schema.get("properties", {}))
        for name in sorted(set(instance) - set(known), key=str):
            close = difflib.get_close_matches(name, known, n=1) if isinstance(name, str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            yield Problem(render_path((*path, name)), f"unknown field{hint}")
    elif error.validator in ("type", "pattern") and schema.get("pattern") in PATTERN_HINTS:
        yield Problem(render_path(path), f"{quoted} is not {PATTERN_HINTS[schema['pattern']]}")
    elif error.validator == "type" and isinstance(instance, int) and instance not in _INT64:
        yield Problem(render_path(path), f"{quoted} is outside the range of a 64-bit integer")
    elif error.validator == "type":
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        expected = " or ".join(repr(t) for t in types if t != "null")
        yield Problem(render_path(path), f"{quoted} is not of type {expected}")
    elif error.validator == "maxLength":
        yield Problem(
            render_path(path), f"{quoted} is longer than {schema['maxLength']} characters"
        )
    elif error.validator == "maxItems" and isinstance(instance, list):
        limit = schema["maxItems"]
        yield Problem(render_path(path), f"has {len(instance)} items; at most {limit} are allowed")
    elif error.validator in ("minimum", "maximum"):
        bound = (
            "less than the minimum" if error.validator == "minimum" else "greater than the maximum"
        )
        yield Problem(render_path(path), f"{quoted} is {bound} of {schema[error.validator]}")
    elif error.validator == "enum":
        yield Problem(render_path(path), f"{quoted} is not one of {schema['enum']!r}")
    else:
        yield Problem(render_path(path), clip(error.message))


# CEL's duration() as the API server's (cel-go, Go's exact nanoseconds): the `cel` package
# reads durations through floats, a nanosecond off where a fraction needs more than 53 bits
# (1125899906.842623ms), and its built-in cannot be replaced, so the rules call this instead.
_EXACT_DURATION = "exactDuration"
_DURATION_CALL = re.compile(r"\bduration\(")


def _compiled(rule: str) -> Any:
    return cel.compile(_DURATION_CALL.sub(f"{_EXACT_DURATION}(", rule))


def _exact_duration(text: object) -> int | None:
    # Beyond int64 (which Go refuses) as the `cel` package gives it, the longest duration:
    # the CRD's range rules say "must be at most 2562047h". No duration (a value the
    # schema refuses) is None, whose comparison fails the rule: an exception raised here
    # would be printed to stderr by the package.
    if not isinstance(text, str):
        return None
    try:
        return min(go_duration.nanoseconds(text), go_duration.INT64_MAX)
    except ValueError:
        return None


def _cel_value(value: Any) -> Any:
    # The API server gives CEL no null fields: has() is false for a field set to null.
    if isinstance(value, dict):
        return {k: _cel_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_cel_value(item) for item in value]
    return value
