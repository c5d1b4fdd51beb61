"""The `_metadata` file: a checkpoint's or savepoint's manifest and its JSON format.

A `_metadata` file is validated against `METADATA_SCHEMA` (JSON Schema, Draft 2020-12)
and then for consistency (sizes add up, acknowledged files are in the manifest, ...)
before any object is built from it, so code holding a `CheckpointMetadata` can trust it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from spark_checkpoint.protocol import CheckpointKind

from .errors import InvalidMetadataError, TruncatedMetadataError, UnknownFormatVersionError
from .layout import (
    DNS_1123_LABEL_MAX_LENGTH,
    DNS_1123_LABEL_PATTERN,
    DNS_1123_SUBDOMAIN_MAX_LENGTH,
    DNS_1123_SUBDOMAIN_PATTERN,
    END_OF_INPUT,
    SAFE_RELATIVE_PATH_PATTERN,
    SHA256_PATTERN,
    require_dns_1123_label,
    require_dns_1123_subdomain,
    require_safe_relative_path,
    require_snapshot_id,
    snapshot_location_prefix,
)

FORMAT_VERSION = 1

_TIMESTAMP_PATTERN = (
    rf"^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}(?:\.[0-9]{{1,6}})?"
    rf"(?:Z|[+-][0-9]{{2}}:[0-9]{{2}}){END_OF_INPUT}"
)
_NON_NEGATIVE_INTEGER = {"type": "integer", "minimum": 0}
_RELATIVE_PATH = {"type": "string", "pattern": SAFE_RELATIVE_PATH_PATTERN}
_TIMESTAMP = {"type": "string", "pattern": _TIMESTAMP_PATTERN}

METADATA_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://sparkcheckpoint.io/schemas/checkpoint-metadata-v1.json",
    "title": "spark-checkpoint _metadata, format_version 1",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "format_version",
        "namespace",
        "job",
        "checkpoint_id",
        "kind",
        "batch_id",
        "query_id",
        "trigger_time",
        "completion_time",
        "acknowledgements",
        "files",
        "total_bytes",
        "properties",
    ],
    "properties": {
        "format_version": {"const": FORMAT_VERSION},
        "namespace": {
            "type": "string",
            "pattern": DNS_1123_LABEL_PATTERN,
            "maxLength": DNS_1123_LABEL_MAX_LENGTH,
        },
        "job": {
            "type": "string",
            "pattern": DNS_1123_SUBDOMAIN_PATTERN,
            "maxLength": DNS_1123_SUBDOMAIN_MAX_LENGTH,
        },
        "checkpoint_id": _NON_NEGATIVE_INTEGER,
        "kind": {"enum": [kind.value for kind in CheckpointKind]},
        "batch_id": _NON_NEGATIVE_INTEGER,
        "query_id": {"type": "string", "minLength": 1},
        "trigger_time": _TIMESTAMP,
        "completion_time": _TIMESTAMP,
        "acknowledgements": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["task", "files", "bytes", "duration_ms"],
                "properties": {
                    "task": {"type": "string", "minLength": 1},
                    "files": {"type": "array", "items": _RELATIVE_PATH},
                    "bytes": _NON_NEGATIVE_INTEGER,
                    "duration_ms": _NON_NEGATIVE_INTEGER,
                },
            },
        },
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "size", "sha256", "location"],
                "properties": {
                    "path": _RELATIVE_PATH,
                    "size": _NON_NEGATIVE_INTEGER,
                    "sha256": {"type": "string", "pattern": SHA256_PATTERN},
                    "location": _RELATIVE_PATH,
                },
            },
        },
        "total_bytes": _NON_NEGATIVE_INTEGER,
        "properties": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


_VALIDATOR = Draft202012Validator(METADATA_SCHEMA)
# Schema error messages quote the offending value, which can be a whole array.
_MAX_REASON_LENGTH = 300


def _require_non_negative(value: int, field_name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field_name} must be a non-negative integer, got {value!r}")


def _require_utc(value: datetime, field_name: str) -> None:
    if value.utcoffset() != timedelta(0):
        raise ValueError(f"{field_name} must be a timezone-aware UTC datetime, got {value!r}")


@dataclass(frozen=True)
class ManifestEntry:
    """One file of a snapshot.

    `path` is where the file belongs inside a Spark checkpoint location (e.g.
    `state/0/3/2.delta`, `offsets/5`); `location` is where its bytes are stored, relative
    to the job root (`shared/...` for checkpoints, `savepoints/sp-N/files/...` for
    savepoints).
    """

    path: str
    size: int
    sha256: str
    location: str

    def __post_init__(self) -> None:
        require_safe_relative_path(self.path, "path")
        _require_non_negative(self.size, "size")
        if not re.match(SHA256_PATTERN, self.sha256):
            raise ValueError(f"sha256 must be 64 lower-case hex digits, got {self.sha256!r}")
        require_safe_relative_path(self.location, "location")


@dataclass(frozen=True)
class TaskAcknowledgement:
    """A snapshot task's report: the manifest paths it contributed, how many bytes it
    stored and how long it took."""

    task: str
    files: tuple[str, ...]
    bytes: int
    duration_ms: int

    def __post_init__(self) -> None:
        if not self.task:
            raise ValueError("task must be a non-empty name")
        _require_non_negative(self.bytes, "bytes")
        _require_non_negative(self.duration_ms, "duration_ms")


@dataclass(frozen=True, kw_only=True)
class CheckpointMetadata:
    """The content of a `_metadata` file: a complete checkpoint or savepoint of a query.

    It captures the query as of Spark batch `batch_id` (committed after `trigger_time`).
    Construction checks the same rules as reading a file does, so an inconsistent
    manifest is never written.
    """

    format_version: int = FORMAT_VERSION
    namespace: str
    job: str
    checkpoint_id: int
    kind: CheckpointKind
    batch_id: int
    query_id: str
    trigger_time: datetime
    completion_time: datetime
    acknowledgements: tuple[TaskAcknowledgement, ...]
    files: tuple[ManifestEntry, ...]
    total_bytes: int
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format_version != FORMAT_VERSION:
            raise ValueError(
                f"format_version {self.format_version} cannot be written; "
                f"this version writes {FORMAT_VERSION}"
            )
        # Also accepts the plain string ("checkpoint"), and rejects anything else.
        object.__setattr__(self, "kind", CheckpointKind(self.kind))
        require_dns_1123_label(self.namespace, "namespace")
        require_dns_1123_subdomain(self.job, "job")
        require_snapshot_id(self.checkpoint_id, "checkpoint_id")
        _require_non_negative(self.batch_id, "batch_id")
        if not self.query_id:
            raise ValueError("query_id must not be empty")
        _require_utc(self.trigger_time, "trigger_time")
        _require_utc(self.completion_time, "completion_time")
        inconsistency = _find_inconsistency(
            self.kind, self.checkpoint_id, self.files, self.acknowledgements, self.total_bytes
        )
        if inconsistency is not None:
            field_path, reason = inconsistency
            raise ValueError(f"{field_path}: {reason}")
        # A snapshot of the caller's mapping, so the frozen object cannot change under us.
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))

    @property
    def locations(self) -> frozenset[str]:
        """The storage locations (relative to the job root) this snapshot references."""
        return frozenset(entry.location for entry in self.files)

    def to_json(self) -> bytes:
        """The `_metadata` file content: UTF-8 JSON, stable key order, ending in a newline."""
        document = {
            "format_version": self.format_version,
            "namespace": self.namespace,
            "job": self.job,
            "checkpoint_id": self.checkpoint_id,
            "kind": self.kind.value,
            "batch_id": self.batch_id,
            "query_id": self.query_id,
            "trigger_time": _format_timestamp(self.trigger_time),
            "completion_time": _format_timestamp(self.completion_time),
            "acknowledgements": [
                {
                    "task": ack.task,
                    "files": list(ack.files),
                    "bytes": ack.bytes,
                    "duration_ms": ack.duration_ms,
                }
                for ack in self.acknowledgements
            ],
            "files": [
                {
                    "path": entry.path,
                    "size": entry.size,
                    "sha256": entry.sha256,
                    "location": entry.location,
                }
                for entry in self.files
            ],
            "total_bytes": self.total_bytes,
            "properties": dict(self.properties),
        }
        return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, source: str) -> CheckpointMetadata:
        """Parse and validate a `_metadata` file's content; `source` is its path, named in
        every error.

        Raises TruncatedMetadataError (empty or not JSON), UnknownFormatVersionError, or
        InvalidMetadataError (schema violation or inconsistency, naming the field).
        """
        document = _parse_json(data, source)
        version = document.get("format_version") if isinstance(document, dict) else None
        # Checked before the schema: a newer format may be valid under a different schema.
        if isinstance(version, int) and not isinstance(version, bool) and version != FORMAT_VERSION:
            raise UnknownFormatVersionError(source, version, FORMAT_VERSION)
        error = best_match(_VALIDATOR.iter_errors(document))
        if error is not None:
            raise InvalidMetadataError(source, _field_path(error), _shorten(error.message))
        return cls._from_valid_document(document, source)

    @classmethod
    def _from_valid_document(cls, document: dict[str, Any], source: str) -> CheckpointMetadata:
        files = tuple(
            ManifestEntry(
                path=entry["path"],
                size=entry["size"],
                sha256=entry["sha256"],
                location=entry["location"],
            )
            for entry in document["files"]
        )
        acknowledgements = tuple(
            TaskAcknowledgement(
                task=ack["task"],
                files=tuple(ack["files"]),
                bytes=ack["bytes"],
                duration_ms=ack["duration_ms"],
            )
            for ack in document["acknowledgements"]
        )
        kind = CheckpointKind(document["kind"])
        inconsistency = _find_inconsistency(
            kind, document["checkpoint_id"], files, acknowledgements, document["total_bytes"]
        )
        if inconsistency is not None:
            raise InvalidMetadataError(source, *inconsistency)
        return cls(
            format_version=document["format_version"],
            namespace=document["namespace"],
            job=document["job"],
            checkpoint_id=document["checkpoint_id"],
            kind=kind,
            batch_id=document["batch_id"],
            query_id=document["query_id"],
            trigger_time=_parse_timestamp(document["trigger_time"], "trigger_time", source),
            completion_time=_parse_timestamp(
                document["completion_time"], "completion_time", source
            ),
            acknowledgements=acknowledgements,
            files=files,
            total_bytes=document["total_bytes"],
            properties=document["properties"],
        )


def _find_inconsistency(
    kind: CheckpointKind,
    snapshot_id: int,
    files: tuple[ManifestEntry, ...],
    acknowledgements: tuple[TaskAcknowledgement, ...],
    total_bytes: int,
) -> tuple[str, str] | None:
    """The first rule the manifest breaks, as (JSON field path, reason), or None."""
    location_prefix = snapshot_location_prefix(kind, snapshot_id)
    manifest_paths: set[str] = set()
    for index, entry in enumerate(files):
        if entry.path in manifest_paths:
            return f"files[{index}].path", f"duplicate manifest path {entry.path!r}"
        manifest_paths.add(entry.path)
        # Garbage collection and discarding rely on this: checkpoints reference only
        # shared files, and a savepoint only files below its own directory.
        if not entry.location.startswith(location_prefix):
            return (
                f"files[{index}].location",
                f"a {kind.value} stores its files below {location_prefix!r}, "
                f"got {entry.location!r}",
            )
    files_total = sum(entry.size for entry in files)
    if total_bytes != files_total:
        return "total_bytes", f"is {total_bytes} but the file sizes add up to {files_total}"
    tasks: set[str] = set()
    for ack_index, ack in enumerate(acknowledgements):
        if ack.task in tasks:
            return f"acknowledgements[{ack_index}].task", f"duplicate task {ack.task!r}"
        tasks.add(ack.task)
        for file_index, path in enumerate(ack.files):
            if path not in manifest_paths:
                return (
                    f"acknowledgements[{ack_index}].files[{file_index}]",
                    f"{path!r} is not in the manifest",
                )
    return None


def _parse_json(data: bytes, source: str) -> Any:
    if not data.strip():
        raise TruncatedMetadataError(source, "the file is empty")
    try:
        # JSON Schema counts 1.0 as an integer, but no `_metadata` writer produces one: as
        # Decimals, fractional numbers fail the schema's integer checks.
        return json.loads(data, parse_float=Decimal)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TruncatedMetadataError(source, f"not parseable as JSON ({error})") from error


def _field_path(error: ValidationError) -> str:
    """The JSON path of the value a schema error is about, e.g. `files[3].sha256`."""
    parts = list(error.absolute_path)
    # Missing and unexpected properties are reported on the enclosing object; name the
    # property itself, which is what the reader has to fix.
    if (
        error.validator == "required"
        and isinstance(error.instance, dict)
        and isinstance(error.validator_value, list)
    ):
        parts.append(next(name for name in error.validator_value if name not in error.instance))
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        parts.append(min(name for name in error.instance if name not in allowed))
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.removeprefix(".") or "$"


def _shorten(message: str) -> str:
    if len(message) <= _MAX_REASON_LENGTH:
        return message
    return message[: _MAX_REASON_LENGTH - 3] + "..."


def _format_timestamp(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _parse_timestamp(value: str, field_path: str, source: str) -> datetime:
    try:
        # The schema pattern requires an offset, so the result is never a naive datetime.
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError as error:
        raise InvalidMetadataError(
            source, field_path, f"not a valid timestamp ({error})"
        ) from error
