"""The `_metadata` file: a checkpoint's or savepoint's manifest and its format.

Format 2 (written since 2026-11) is a gzip-compressed JSON document in which each file is
listed once: the acknowledgements refer to files by index, paths are split into a table
of directories and a name, and a location is stored only when it differs from the one
derived from the entry (`default_location`). Format 1 (plain JSON, every path and location
spelled out) is still read. A document is validated against its version's JSON Schema
(Draft 2020-12: `METADATA_SCHEMA`, `METADATA_SCHEMA_V1`) and then for consistency (sizes
add up, acknowledged files are in the manifest, ...) before any object is built from it,
so code holding a `CheckpointMetadata` can trust it.
"""

from __future__ import annotations

import gzip
import itertools
import json
import posixpath
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from spark_checkpoint.protocol import MAX_ID, CheckpointKind

from .errors import InvalidMetadataError, TruncatedMetadataError, UnknownFormatVersionError
from .layout import (
    DNS_1123_LABEL_MAX_LENGTH,
    DNS_1123_LABEL_PATTERN,
    DNS_1123_SUBDOMAIN_MAX_LENGTH,
    DNS_1123_SUBDOMAIN_PATTERN,
    END_OF_INPUT,
    SAFE_RELATIVE_PATH_PATTERN,
    SHA256_PATTERN,
    default_location,
    is_shared_location,
    require_dns_1123_label,
    require_dns_1123_subdomain,
    require_safe_relative_path,
    require_snapshot_id,
    snapshot_location_prefix,
)

FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
# A JSON escape of a UTF-16 surrogate, paired or alone.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# gzip's magic number: a format 2 file starts with it, a JSON document never does.
_GZIP_MAGIC = b"\x1f\x8b"
# A bound on a `_metadata`'s JSON, as stored or once decompressed, so that a damaged or
# hostile file cannot exhaust memory (parsed, JSON takes up to ~25x its size: a document
# of empty objects): a manifest of 200,000 files is about 25 MiB of JSON.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024

_TIMESTAMP_PATTERN = (
    rf"^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}T[0-9]{{2}}:[0-9]{{2}}:[0-9]{{2}}(?:\.[0-9]{{1,6}})?"
    rf"(?:Z|[+-][0-9]{{2}}:[0-9]{{2}}){END_OF_INPUT}"
)
# Within int64, as every id and size is written: a larger one (Python reads integers of
# thousands of digits) is no snapshot's, and overflowed where it is shown as a float.
_NON_NEGATIVE_INTEGER = {"type": "integer", "minimum": 0, "maximum": MAX_ID}
_RELATIVE_PATH = {"type": "string", "pattern": SAFE_RELATIVE_PATH_PATTERN}
_FILE_NAME = {"type": "string", "pattern": SAFE_RELATIVE_PATH_PATTERN, "not": {"pattern": "/"}}
_TIMESTAMP = {"type": "string", "pattern": _TIMESTAMP_PATTERN}
_SHA256 = {"type": "string", "pattern": SHA256_PATTERN}
# The fields both formats share, with the same meaning.
_HEADER_PROPERTIES: dict[str, Any] = {
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
    "total_bytes": _NON_NEGATIVE_INTEGER,
    "properties": {"type": "object", "additionalProperties": {"type": "string"}},
}
_HEADER_REQUIRED = [
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
]


def _acknowledgements_schema(file_reference: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["task", "files", "bytes", "duration_ms"],
            "properties": {
                "task": {"type": "string", "minLength": 1},
                "files": {"type": "array", "items": file_reference},
                "bytes": _NON_NEGATIVE_INTEGER,
                "duration_ms": _NON_NEGATIVE_INTEGER,
            },
        },
    }


METADATA_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://sparkcheckpoint.io/schemas/checkpoint-metadata-v2.json",
    "title": "spark-checkpoint _metadata, format_version 2 (the JSON inside the gzip)",
    "type": "object",
    "additionalProperties": False,
    "required": [*_HEADER_REQUIRED, "directories"],
    "properties": {
        "format_version": {"const": 2},
        **_HEADER_PROPERTIES,
        # Each directory of the Spark checkpoint once; "" for files at its top level.
        "directories": {
            "type": "array",
            "items": {"anyOf": [{"const": ""}, _RELATIVE_PATH]},
            "uniqueItems": True,
        },
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["dir", "name", "size", "sha256"],
                "properties": {
                    "dir": _NON_NEGATIVE_INTEGER,
                    "name": _FILE_NAME,
                    "size": _NON_NEGATIVE_INTEGER,
                    "sha256": _SHA256,
                    # Only when it is not `default_location` of the entry.
                    "location": _RELATIVE_PATH,
                },
            },
        },
        # Indices into `files`.
        "acknowledgements": _acknowledgements_schema(_NON_NEGATIVE_INTEGER),
    },
}

METADATA_SCHEMA_V1: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://sparkcheckpoint.io/schemas/checkpoint-metadata-v1.json",
    "title": "spark-checkpoint _metadata, format_version 1",
    "type": "object",
    "additionalProperties": False,
    "required": _HEADER_REQUIRED,
    "properties": {
        "format_version": {"const": 1},
        **_HEADER_PROPERTIES,
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["path", "size", "sha256", "location"],
                "properties": {
                    "path": _RELATIVE_PATH,
                    "size": _NON_NEGATIVE_INTEGER,
                    "sha256": _SHA256,
                    "location": _RELATIVE_PATH,
                },
            },
        },
        "acknowledgements": _acknowledgements_schema(_RELATIVE_PATH),
    },
}


_VALIDATORS = {
    1: Draft202012Validator(METADATA_SCHEMA_V1),
    2: Draft202012Validator(METADATA_SCHEMA),
}
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
    manifest is never written. `format_version` is the format of the file it was read
    from; writing always writes `FORMAT_VERSION`.
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
        if self.format_version not in READABLE_FORMAT_VERSIONS:
            raise ValueError(
                f"format_version {self.format_version} is not one this version reads "
                f"{READABLE_FORMAT_VERSIONS}"
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

    def to_bytes(self) -> bytes:
        """The `_metadata` file content: the format 2 document as compact UTF-8 JSON,
        gzip-compressed (modification time 0, so equal metadata gives equal bytes)."""
        compact = json.dumps(self._document(), separators=(",", ":"), ensure_ascii=False)
        document = compact.encode("utf-8")
        if len(document) > MAX_DOCUMENT_BYTES:  # written, it could never be read
            raise ValueError(
                f"the manifest of {len(self.files)} files is {len(document)} bytes of JSON, "
                f"more than a _metadata may hold ({MAX_DOCUMENT_BYTES}): fewer state files "
                "per image (spark.sql.shuffle.partitions) keep it smaller"
            )
        return gzip.compress(document, compresslevel=9, mtime=0)

    def to_json(self) -> bytes:
        """The same format 2 document, readable: UTF-8 JSON with a 2-space indent, stable
        key order, ending in a newline (what `inspect --json` prints; `from_bytes` reads
        it too)."""
        return (json.dumps(self._document(), indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    def _document(self) -> dict[str, Any]:
        directories: dict[str, int] = {}
        files: list[dict[str, Any]] = []
        for entry in self.files:
            directory, name = posixpath.split(entry.path)
            item: dict[str, Any] = {
                "dir": directories.setdefault(directory, len(directories)),
                "name": name,
                "size": entry.size,
                "sha256": entry.sha256,
            }
            if entry.location != default_location(
                self.kind, self.checkpoint_id, entry.path, entry.sha256
            ):
                item["location"] = entry.location
            files.append(item)
        index_of = {entry.path: index for index, entry in enumerate(self.files)}
        return {
            "format_version": FORMAT_VERSION,
            "namespace": self.namespace,
            "job": self.job,
            "checkpoint_id": self.checkpoint_id,
            "kind": self.kind.value,
            "batch_id": self.batch_id,
            "query_id": self.query_id,
            "trigger_time": _format_timestamp(self.trigger_time),
            "completion_time": _format_timestamp(self.completion_time),
            "total_bytes": self.total_bytes,
            "properties": dict(self.properties),
            "acknowledgements": [
                {
                    "task": ack.task,
                    "files": [index_of[path] for path in ack.files],
                    "bytes": ack.bytes,
                    "duration_ms": ack.duration_ms,
                }
                for ack in self.acknowledgements
            ],
            "directories": list(directories),
            "files": files,
        }

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> CheckpointMetadata:
        """Parse and validate a `_metadata` file's content, format 2 (gzip-compressed or
        plain JSON) or format 1; `source` is its path, named in every error.

        Raises TruncatedMetadataError (empty, cut short, or not JSON),
        UnknownFormatVersionError, or InvalidMetadataError (schema violation or
        inconsistency, naming the field).
        """
        document = _parse_document(data, source)
        version = document.get("format_version") if isinstance(document, dict) else None
        if not isinstance(version, int) or isinstance(version, bool):
            if isinstance(document, dict) and "format_version" in document:
                # Named, not the first field the schema finds missing (a reviewer's 2.0),
                # and worded as the schema words every other field's type.
                raise InvalidMetadataError(
                    source,
                    "format_version",
                    _shorten(f"{version!r} is not of type 'integer'"),
                )
            version = FORMAT_VERSION  # whose schema then names the bad field
        # Checked before the schema: a newer format may be valid under a different schema.
        elif version not in READABLE_FORMAT_VERSIONS:
            raise UnknownFormatVersionError(source, version, READABLE_FORMAT_VERSIONS)
        # The first few: a document of millions of bad entries (64 MiB of "{}," is 65 KB
        # gzipped) made millions of errors, minutes of work for every reader.
        error = best_match(itertools.islice(_VALIDATORS[version].iter_errors(document), 50))
        if error is not None:
            raise InvalidMetadataError(source, _field_path(error), _shorten(error.message))
        if version == 1:
            files, acknowledgements = _read_files_v1(document)
        else:
            files, acknowledgements = _read_files_v2(document, source)
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


_Manifest = tuple[tuple[ManifestEntry, ...], tuple[TaskAcknowledgement, ...]]


def _read_files_v1(document: dict[str, Any]) -> _Manifest:
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
    return files, acknowledgements


def _read_files_v2(document: dict[str, Any], source: str) -> _Manifest:
    kind = CheckpointKind(document["kind"])
    directories: list[str] = document["directories"]
    files: list[ManifestEntry] = []
    for index, item in enumerate(document["files"]):
        if item["dir"] >= len(directories):
            raise InvalidMetadataError(
                source,
                f"files[{index}].dir",
                f"is {item['dir']} but there are {len(directories)} directories",
            )
        path = posixpath.join(directories[item["dir"]], item["name"])
        location = item.get("location") or default_location(
            kind, document["checkpoint_id"], path, item["sha256"]
        )
        files.append(
            ManifestEntry(path=path, size=item["size"], sha256=item["sha256"], location=location)
        )
    acknowledgements: list[TaskAcknowledgement] = []
    for ack_index, ack in enumerate(document["acknowledgements"]):
        for file_index, reference in enumerate(ack["files"]):
            if reference >= len(files):
                raise InvalidMetadataError(
                    source,
                    f"acknowledgements[{ack_index}].files[{file_index}]",
                    f"is {reference} but there are {len(files)} files",
                )
        acknowledgements.append(
            TaskAcknowledgement(
                task=ack["task"],
                files=tuple(files[reference].path for reference in ack["files"]),
                bytes=ack["bytes"],
                duration_ms=ack["duration_ms"],
            )
        )
    return tuple(files), tuple(acknowledgements)


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
    # A file where another's directory is cannot be restored ('offsets/0' and 'offsets/0/x').
    directories = {parent for path in manifest_paths for parent in _parents(path)}
    for index, entry in enumerate(files):
        if entry.path in directories:
            return (
                f"files[{index}].path",
                f"{entry.path!r} is a file and the directory of another file",
            )
        # Garbage collection and discarding rely on this: checkpoints reference only
        # shared files, by their content's digest (so never another job's files nested in
        # `shared/`), and a savepoint only files below its own directory.
        if not entry.location.startswith(location_prefix):
            return (
                f"files[{index}].location",
                f"a {kind.value} stores its files below {location_prefix!r}, "
                f"got {entry.location!r}",
            )
        if kind is CheckpointKind.CHECKPOINT and not is_shared_location(
            entry.location, entry.sha256
        ):
            return (
                f"files[{index}].location",
                f"a checkpoint stores a file at shared/<first 2 digits of its sha256>/"
                f"<sha256>-<name>, got {entry.location!r} for sha256 {entry.sha256}",
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


def _parents(path: str) -> Iterator[str]:
    """'a/b/c' -> 'a/b', 'a'."""
    while path := posixpath.dirname(path):
        yield path


def _parse_document(data: bytes, source: str) -> Any:
    """The JSON value in a `_metadata` file, gzip-compressed (format 2) or not."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InvalidMetadataError(source, "$", f"is larger than {MAX_DOCUMENT_BYTES} bytes")
    if data.startswith(_GZIP_MAGIC):
        data = _gunzip(data, source)
    if not data.strip():
        raise TruncatedMetadataError(source, "the file is empty")
    try:
        # JSON Schema counts 1.0 as an integer, but no `_metadata` writer produces one: as
        # Decimals, fractional numbers fail the schema's integer checks.
        # As UTF-8, the format's encoding: json.loads would take UTF-16 and UTF-32 too.
        document = json.loads(data.decode("utf-8"), parse_float=_Fraction)
    except RecursionError:
        raise TruncatedMetadataError(source, "not parseable as JSON (nested too deeply)") from None
    except ValueError as error:  # not UTF-8, not JSON, an integer of over 4300 digits
        raise TruncatedMetadataError(source, f"not parseable as JSON ({error})") from error
    if _SURROGATE_ESCAPE.search(data):
        # JSON may escape half a UTF-16 pair alone (\ud800), which no file name or text
        # is: every use of the string (a path, a printed line) would fail on it.
        try:
            json.dumps(document, ensure_ascii=False, default=str).encode()
        except UnicodeEncodeError as error:
            lone = error.object[error.start : error.end].encode("unicode_escape").decode()
            raise InvalidMetadataError(
                source, "$", f"holds a lone UTF-16 surrogate ({lone}), which is no text"
            ) from None
    return document


class _Fraction(Decimal):
    """A fractional JSON number, shown as written in a schema error (`1.5 is not of type
    'integer'`, not `Decimal('1.5') ...`)."""

    def __repr__(self) -> str:
        return str(self)


def _gunzip(data: bytes, source: str) -> bytes:
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # one gzip member
    try:
        document = decompressor.decompress(data, MAX_DOCUMENT_BYTES + 1)
    except zlib.error as error:
        raise TruncatedMetadataError(source, f"not a valid gzip stream ({error})") from error
    if len(document) > MAX_DOCUMENT_BYTES:
        raise InvalidMetadataError(
            source, "$", f"expands to more than {MAX_DOCUMENT_BYTES} bytes once decompressed"
        )
    if not decompressor.eof:
        raise TruncatedMetadataError(source, "the gzip stream is cut short")
    if decompressor.unused_data:
        raise InvalidMetadataError(source, "$", "has bytes after the end of its gzip stream")
    return document


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
    except (ValueError, OverflowError) as error:  # Overflow: its UTC is outside years 1-9999
        raise InvalidMetadataError(
            source, field_path, f"not a valid timestamp ({error})"
        ) from error
