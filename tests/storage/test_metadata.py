"""The `_metadata` format: round trip, compact encoding, schema and consistency errors.

Format 1 files written by the previous version are read through the fixture in
test_format_1.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import pickle
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from spark_checkpoint.storage import (
    FORMAT_VERSION,
    METADATA_SCHEMA,
    METADATA_SCHEMA_V1,
    READABLE_FORMAT_VERSIONS,
    CheckpointKind,
    CheckpointMetadata,
    ChecksumMismatchError,
    InvalidMetadataError,
    ManifestEntry,
    TaskAcknowledgement,
    TruncatedMetadataError,
    UnknownFormatVersionError,
)
from spark_checkpoint.storage import metadata as metadata_module

MetadataMaker = Callable[..., CheckpointMetadata]
SOURCE = "file:///data/team-a/orders.v2/chk-3/_metadata"
SHA_A = "a" * 64
SHA_B = "b" * 64


def entry(path: str, size: int, sha256: str = SHA_A) -> ManifestEntry:
    name = path.rsplit("/", 1)[-1]
    location = f"shared/{sha256[:2]}/{sha256}-{name}"
    return ManifestEntry(path=path, size=size, sha256=sha256, location=location)


@pytest.fixture
def metadata(make_metadata: MetadataMaker) -> CheckpointMetadata:
    return make_metadata(
        CheckpointKind.CHECKPOINT,
        3,
        [entry("state/0/3/2.delta", 120), entry("offsets/5", 7, SHA_B), entry("metadata", 0)],
    )


def document_of(meta: CheckpointMetadata) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(meta.to_json())
    return document


def encode(document: object) -> bytes:
    return json.dumps(document).encode()


@pytest.mark.parametrize("encoding", ["file", "readable"])
def test_round_trip_preserves_every_field(metadata: CheckpointMetadata, encoding: str) -> None:
    data = metadata.to_bytes() if encoding == "file" else metadata.to_json()

    restored = CheckpointMetadata.from_bytes(data, SOURCE)

    assert restored == metadata
    assert restored.trigger_time.tzinfo is UTC
    assert restored.properties == {"spark.sql.shuffle.partitions": "4"}


def test_written_document_satisfies_the_schema(metadata: CheckpointMetadata) -> None:
    Draft202012Validator.check_schema(METADATA_SCHEMA)
    Draft202012Validator(METADATA_SCHEMA).validate(document_of(metadata))


def test_json_is_stable_and_human_readable(metadata: CheckpointMetadata) -> None:
    data = metadata.to_json()

    assert data == metadata.to_json()
    assert data.endswith(b"\n")
    assert b'"trigger_time": "2026-11-21T23:59:00.123456Z"' in data
    assert data.startswith(b'{\n  "format_version": 2,\n  "namespace": "team-a",\n')


def test_json_keeps_non_ascii_text_as_utf8(metadata: CheckpointMetadata) -> None:
    data = dataclasses.replace(metadata, properties={"owner": "Zoë"}).to_json()

    assert '"owner": "Zoë"'.encode() in data


def test_timestamps_are_written_in_utc_whatever_the_local_zone(
    metadata: CheckpointMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        data = metadata.to_json()
    finally:
        monkeypatch.undo()
        time.tzset()

    assert b'"trigger_time": "2026-11-21T23:59:00.123456Z"' in data


def test_timestamps_with_an_offset_are_read_as_utc(metadata: CheckpointMetadata) -> None:
    document = document_of(metadata)
    document["trigger_time"] = "2026-11-22T00:59:00.123456+01:00"

    restored = CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert restored.trigger_time == metadata.trigger_time


def test_properties_cannot_be_changed_through_the_callers_mapping(
    make_metadata: MetadataMaker,
) -> None:
    meta = make_metadata(CheckpointKind.CHECKPOINT, 1, [])
    properties = dict(meta.properties)
    rebuilt = CheckpointMetadata(**{**meta.__dict__, "properties": properties})

    properties["injected"] = "x"

    assert "injected" not in rebuilt.properties


def test_unknown_format_version(metadata: CheckpointMetadata) -> None:
    document = document_of(metadata)
    document["format_version"] = FORMAT_VERSION + 1
    document["something_new"] = True  # a newer format may have fields we do not know

    with pytest.raises(UnknownFormatVersionError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.path == SOURCE
    assert raised.value.version == FORMAT_VERSION + 1
    assert raised.value.supported_versions == READABLE_FORMAT_VERSIONS == (1, 2)
    assert str(raised.value) == (
        f"{SOURCE}: unknown format_version 3; this version of spark-checkpoint reads "
        "format_version 1 or 2"
    )


@pytest.mark.parametrize("version", [2.0, "2", True, None])
def test_a_format_version_that_is_no_integer_is_named(
    metadata: CheckpointMetadata, version: object
) -> None:
    """It was read by the newest schema, which named the first field it found missing
    (``namespace``) instead (a reviewer's)."""
    document = {"format_version": version}

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.field == "format_version"
    assert str(version) in str(raised.value)


@pytest.mark.parametrize("data", [b"", b"  \n"], ids=["empty", "whitespace"])
def test_empty_metadata_is_truncated(data: bytes) -> None:
    with pytest.raises(TruncatedMetadataError) as raised:
        CheckpointMetadata.from_bytes(data, SOURCE)

    assert raised.value.path == SOURCE
    assert raised.value.reason == "the file is empty"


def test_cut_short_metadata_is_truncated(metadata: CheckpointMetadata) -> None:
    data = metadata.to_json()

    with pytest.raises(TruncatedMetadataError) as raised:
        CheckpointMetadata.from_bytes(data[: len(data) // 2], SOURCE)

    assert raised.value.path == SOURCE
    assert "JSON" in raised.value.reason
    assert str(raised.value).startswith(f"{SOURCE}: ")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe\xfa{", "not parseable as JSON ("),
        # Crafted (security review): past the parser's depth, or a number it refuses.
        (b'{"a":' * 200_000, "not parseable as JSON (nested too deeply)"),
        (b'{"format_version": ' + b"9" * 5000 + b"}", "not parseable as JSON (Exceeds the limit"),
    ],
    ids=["not-utf8", "nested-too-deeply", "too-many-digits"],
)
def test_metadata_json_cannot_parse_is_an_error_naming_the_file(data: bytes, reason: str) -> None:
    with pytest.raises(TruncatedMetadataError) as raised:
        CheckpointMetadata.from_bytes(data, SOURCE)

    assert str(raised.value).startswith(f"{SOURCE}: {reason}")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32-be"])
def test_metadata_in_another_encoding_than_utf8_is_refused(
    metadata: CheckpointMetadata, encoding: str
) -> None:
    """json.loads reads bytes in UTF-16 and UTF-32 too: such a file passed verify (a hostile
    reviewer's), while the format says UTF-8 and other readers of it would refuse it."""
    data = gzip.compress(metadata.to_json().decode().encode(encoding))

    with pytest.raises(TruncatedMetadataError) as raised:
        CheckpointMetadata.from_bytes(data, SOURCE)

    assert str(raised.value).startswith(f"{SOURCE}: not parseable as JSON (")


def test_a_file_where_another_files_directory_is_is_refused(make_metadata: MetadataMaker) -> None:
    """offsets/0 and offsets/0/x passed verify, and no restore could write both (a hostile
    reviewer's)."""
    document = document_of(make_metadata(CheckpointKind.CHECKPOINT, 3, [entry("offsets/0", 1)]))
    document["directories"].append("offsets/0")
    document["files"].append(
        {"dir": 1, "name": "x", "size": 1, "sha256": SHA_B, "location": f"shared/bb/{SHA_B}-x"}
    )
    document["total_bytes"] += 1

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.field == "files[0].path"
    assert "'offsets/0' is a file and the directory of another file" in str(raised.value)


def set_sha256_of_second_file(document: dict[str, Any]) -> None:
    document["files"][1]["sha256"] = "not-a-digest"


def drop_size_of_first_file(document: dict[str, Any]) -> None:
    del document["files"][0]["size"]


def add_unknown_field(document: dict[str, Any]) -> None:
    document["acknowledgements"][0]["colour"] = "blue"


def make_size_a_float(document: dict[str, Any]) -> None:
    document["files"][2]["size"] = 0.0


def escape_with_location(document: dict[str, Any]) -> None:
    document["files"][0]["location"] = "shared/../../../etc/passwd"


def escape_with_name(document: dict[str, Any]) -> None:
    document["files"][0]["name"] = "../../etc/passwd"


def escape_with_directory(document: dict[str, Any]) -> None:
    document["directories"][0] = "/etc"


def repeat_a_directory(document: dict[str, Any]) -> None:
    document["directories"].append(document["directories"][0])


def make_a_size_beyond_int64(document: dict[str, Any]) -> None:
    # Python reads integers of up to 4,300 digits; rendered as a size (float) it overflowed.
    document["files"][0]["size"] = 10**400


def make_the_batch_beyond_int64(document: dict[str, Any]) -> None:
    document["batch_id"] = 2**63


def use_a_bad_kind(document: dict[str, Any]) -> None:
    document["kind"] = "snapshot"


def use_a_bad_job_name(document: dict[str, Any]) -> None:
    document["job"] = "orders\n"


@pytest.mark.parametrize(
    ("break_document", "field"),
    [
        (set_sha256_of_second_file, "files[1].sha256"),
        (drop_size_of_first_file, "files[0].size"),
        (add_unknown_field, "acknowledgements[0].colour"),
        (make_size_a_float, "files[2].size"),
        (escape_with_location, "files[0].location"),
        (escape_with_name, "files[0].name"),
        (escape_with_directory, "directories[0]"),
        (repeat_a_directory, "directories"),
        (use_a_bad_kind, "kind"),
        (use_a_bad_job_name, "job"),
        (make_a_size_beyond_int64, "files[0].size"),
        (make_the_batch_beyond_int64, "batch_id"),
    ],
)
def test_schema_violation_names_the_field(
    metadata: CheckpointMetadata,
    break_document: Any,
    field: str,
) -> None:
    document = document_of(metadata)
    break_document(document)

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.path == SOURCE
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{SOURCE}: {field}: ")
    assert len(str(raised.value)) > len(f"{SOURCE}: {field}: ") + 10, "the reason is given"


MISSING = object()  # the key is left out


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        (None, {}, "acknowledgements"),
        (None, ["logs"], "acknowledgements[0]"),
        ("task", MISSING, "acknowledgements[0].task"),
        ("task", "", "acknowledgements[0].task"),
        ("task", 7, "acknowledgements[0].task"),
        ("files", MISSING, "acknowledgements[0].files"),
        ("files", "0", "acknowledgements[0].files"),
        ("files", ["0"], "acknowledgements[0].files[0]"),
        ("bytes", MISSING, "acknowledgements[0].bytes"),
        ("bytes", -1, "acknowledgements[0].bytes"),
        ("bytes", 1.5, "acknowledgements[0].bytes"),
        ("duration_ms", MISSING, "acknowledgements[0].duration_ms"),
        ("duration_ms", -1, "acknowledgements[0].duration_ms"),
        ("duration_ms", "5", "acknowledgements[0].duration_ms"),
    ],
)
def test_each_acknowledgement_field_is_checked_naming_it(
    metadata: CheckpointMetadata, key: str | None, value: Any, field: str
) -> None:
    """What each task acknowledged, as `_metadata` records it: an invalid one is refused
    naming the field, never read as another checkpoint's (the schema's every rule)."""
    document = document_of(metadata)
    if key is None:
        document["acknowledgements"] = value
    elif value is MISSING:
        del document["acknowledgements"][0][key]
    else:
        document["acknowledgements"][0][key] = value

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.field == field


def test_a_fractional_number_is_quoted_as_written(metadata: CheckpointMetadata) -> None:
    """It read `Decimal('1.5') is not of type 'integer'` (a newcomer's report)."""
    document = document_of(metadata)
    document["acknowledgements"][0]["bytes"] = 1.5

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert str(raised.value) == (
        f"{SOURCE}: acknowledgements[0].bytes: 1.5 is not of type 'integer'"
    )


def test_a_document_that_is_not_an_object_is_invalid() -> None:
    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(b"[1, 2]", SOURCE)

    assert raised.value.field == "$"


def test_an_impossible_date_is_invalid(metadata: CheckpointMetadata) -> None:
    document = document_of(metadata)
    document["completion_time"] = "2026-02-30T00:00:00Z"

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.field == "completion_time"


def set_wrong_total(document: dict[str, Any]) -> None:
    document["total_bytes"] += 1


def acknowledge_unknown_file(document: dict[str, Any]) -> None:
    document["acknowledgements"][1]["files"].append(len(document["files"]))


def point_at_an_unknown_directory(document: dict[str, Any]) -> None:
    document["files"][1]["dir"] = len(document["directories"])


def duplicate_a_path(document: dict[str, Any]) -> None:
    for key in ("dir", "name"):
        document["files"][2][key] = document["files"][0][key]


def store_outside_shared(document: dict[str, Any]) -> None:
    document["files"][1]["location"] = "savepoints/sp-1/files/offsets/5"


def store_at_another_jobs_file(document: dict[str, Any]) -> None:
    # Another job's storage directory nested in this one's shared/ (a hostile reviewer's:
    # discarding this checkpoint deleted that job's _metadata).
    document["files"][1]["location"] = "shared/zz/other/chk-1/_metadata"


def store_at_another_digests_file(document: dict[str, Any]) -> None:
    document["files"][1]["location"] = f"shared/aa/{SHA_A}-5"


def spell_a_location_with_a_backslash(document: dict[str, Any]) -> None:
    # Azure reads it as shared/bb/..., one object under two spellings: reference counting
    # kept one and discarding deleted the other (a hostile reviewer's, on Azurite).
    document["files"][1]["location"] = f"shared/bb\\{SHA_B}-5"


def acknowledge_a_task_twice(document: dict[str, Any]) -> None:
    document["acknowledgements"][2]["task"] = document["acknowledgements"][0]["task"]


@pytest.mark.parametrize(
    ("break_document", "field"),
    [
        (set_wrong_total, "total_bytes"),
        (acknowledge_unknown_file, "acknowledgements[1].files[1]"),
        (point_at_an_unknown_directory, "files[1].dir"),
        (duplicate_a_path, "files[2].path"),
        (store_outside_shared, "files[1].location"),
        (store_at_another_jobs_file, "files[1].location"),
        (store_at_another_digests_file, "files[1].location"),
        (spell_a_location_with_a_backslash, "files[1].location"),
        (acknowledge_a_task_twice, "acknowledgements[2].task"),
    ],
)
def test_inconsistent_manifest_names_the_field(
    metadata: CheckpointMetadata, break_document: Any, field: str
) -> None:
    document = document_of(metadata)
    break_document(document)

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.field == field
    assert raised.value.path == SOURCE


def test_savepoint_files_must_be_below_its_own_directory(make_metadata: MetadataMaker) -> None:
    own = ManifestEntry(
        path="offsets/5", size=1, sha256=SHA_A, location="savepoints/sp-2/files/offsets/5"
    )
    assert make_metadata(CheckpointKind.SAVEPOINT, 2, [own]).files == (own,)

    with pytest.raises(ValueError, match="savepoints/sp-3/files/"):
        make_metadata(CheckpointKind.SAVEPOINT, 3, [own])


@pytest.mark.parametrize(
    ("path", "location"),
    [
        # Azure reads offsets\\5 as offsets/5: two entries, one object.
        ("offsets/6", "savepoints/sp-2/files/offsets\\5"),
        # A Spark file's name stored as such: on Azure, `..` segments (a security review's).
        ("state/0/0/x\\..\\..\\v", "savepoints/sp-2/files/state/0/0/x\\..\\..\\v"),
    ],
)
def test_a_path_or_location_with_a_backslash_is_refused(
    make_metadata: MetadataMaker, path: str, location: str
) -> None:
    with pytest.raises(ValueError, match="backslash"):
        make_metadata(
            CheckpointKind.SAVEPOINT,
            2,
            [ManifestEntry(path=path, size=1, sha256=SHA_A, location=location)],
        )


def test_construction_checks_the_same_rules_as_reading(make_metadata: MetadataMaker) -> None:
    meta = make_metadata(CheckpointKind.CHECKPOINT, 1, [entry("offsets/1", 4)])

    with pytest.raises(ValueError, match="total_bytes"):
        CheckpointMetadata(**{**meta.__dict__, "total_bytes": 5})
    with pytest.raises(ValueError, match="trigger_time"):
        CheckpointMetadata(**{**meta.__dict__, "trigger_time": datetime(2026, 1, 1)})
    with pytest.raises(ValueError, match="completion_time"):
        CheckpointMetadata(
            **{
                **meta.__dict__,
                "completion_time": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=1))),
            }
        )
    with pytest.raises(ValueError, match="format_version"):
        CheckpointMetadata(**{**meta.__dict__, "format_version": 3})


@pytest.mark.parametrize("path", ["../x", "a/../b", "/abs", "a//b", "./a", "a/", ""])
def test_manifest_entries_reject_paths_that_escape(path: str) -> None:
    with pytest.raises(ValueError, match="path"):
        ManifestEntry(path=path, size=1, sha256=SHA_A, location="shared/aa/x")


@pytest.mark.parametrize(
    ("task", "size", "duration_ms", "message"),
    [
        ("logs", 0, -1, "duration_ms must be a non-negative integer, got -1"),
        ("logs", -2, 0, "bytes must be a non-negative integer, got -2"),
        ("", 0, 0, "task must be a non-empty name"),
    ],
)
def test_acknowledgements_reject_bad_values_naming_the_field(
    task: str, size: int, duration_ms: int, message: str
) -> None:
    with pytest.raises(ValueError) as raised:
        TaskAcknowledgement(task=task, files=(), bytes=size, duration_ms=duration_ms)

    assert str(raised.value) == message


def test_errors_survive_pickling() -> None:
    errors = [
        InvalidMetadataError(SOURCE, "files[3].sha256", "bad"),
        ChecksumMismatchError(SOURCE, "size", "3 bytes", "2 bytes"),
        UnknownFormatVersionError(SOURCE, 9, (1, 2)),
        TruncatedMetadataError(SOURCE, "the file is empty"),
    ]
    for error in errors:
        assert str(pickle.loads(pickle.dumps(error))) == str(error)


@pytest.mark.parametrize("field", ["trigger_time", "completion_time"])
@pytest.mark.parametrize(
    "value",
    [
        "2026-13-01T25:00:00Z",  # matches the schema's pattern
        # Real times whose UTC lies outside the years datetime holds (an OverflowError).
        "0001-01-01T00:00:00+23:59",
        "9999-12-31T23:59:59-23:59",
    ],
)
def test_a_timestamp_of_the_right_shape_but_no_real_time_names_its_field(
    metadata: CheckpointMetadata, field: str, value: str
) -> None:
    document = document_of(metadata)
    document[field] = value

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert (raised.value.path, raised.value.field) == (SOURCE, field)
    assert str(raised.value).startswith(f"{SOURCE}: {field}: not a valid timestamp (")


def test_an_object_where_a_string_belongs_names_the_field_not_its_keys(
    metadata: CheckpointMetadata,
) -> None:
    document = document_of(metadata)
    document["namespace"] = {"name": "team-a"}

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.field == "namespace"


# The schema's message for a string batch_id is "'<value>' is not of type 'integer'".
_TYPE_MESSAGE_OVERHEAD = len("'' is not of type 'integer'")


@pytest.mark.parametrize("length", [300, 301, 2000])
def test_a_long_reason_is_shortened_to_300_characters(
    metadata: CheckpointMetadata, length: int
) -> None:
    document = document_of(metadata)
    value = "b" * (length - _TYPE_MESSAGE_OVERHEAD)
    document["batch_id"] = value
    message = f"'{value}' is not of type 'integer'"

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    reason = str(raised.value).removeprefix(f"{SOURCE}: batch_id: ")
    assert reason == (message if length <= 300 else message[:297] + "...")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"namespace": "Team"}, "namespace must be a DNS-1123 label"),
        ({"job": "Orders"}, "job must be a DNS-1123 subdomain"),
        ({"checkpoint_id": -1}, "checkpoint_id must be a non-negative integer, got -1"),
        ({"batch_id": 1.5}, "batch_id must be a non-negative integer, got 1.5"),
        ({"batch_id": "7"}, "batch_id must be a non-negative integer, got '7'"),
        ({"query_id": ""}, "query_id must not be empty"),
        ({"trigger_time": datetime(2026, 1, 1)}, "trigger_time must"),
        ({"completion_time": datetime(2026, 1, 1)}, "completion_time must"),
    ],
)
def test_building_metadata_with_a_bad_value_names_the_field(
    metadata: CheckpointMetadata, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as raised:
        dataclasses.replace(metadata, **change)

    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"path": "../x"}, "path must be a relative path"),
        ({"size": -1}, "size must be a non-negative integer, got -1"),
        ({"sha256": "AB"}, "sha256 must be 64 lower-case hex digits, got 'AB'"),
        ({"location": "/etc/x"}, "location must be a relative path"),
    ],
)
def test_building_a_manifest_entry_with_a_bad_value_names_the_field(
    fields: dict[str, Any], message: str
) -> None:
    valid: dict[str, Any] = {"path": "x", "size": 1, "sha256": SHA_A, "location": "shared/aa/x"}

    with pytest.raises(ValueError) as raised:
        ManifestEntry(**(valid | fields))

    assert str(raised.value).startswith(message)


def test_the_file_is_gzip_compressed_json_and_the_same_for_equal_metadata(
    metadata: CheckpointMetadata,
) -> None:
    data = metadata.to_bytes()

    assert data == metadata.to_bytes()  # no timestamp in the gzip header
    assert json.loads(gzip.decompress(data)) == document_of(metadata)


def test_each_file_is_listed_once_and_default_locations_are_left_out(
    make_metadata: MetadataMaker,
) -> None:
    # Six files in two directories, all acknowledged; locations as add_shared_file makes them.
    files = [
        entry(f"state/0/{partition}/{version}.delta", 10 + version, f"{partition}{version}" * 32)
        for partition in (0, 1)
        for version in (1, 2, 3)
    ]
    files = [
        dataclasses.replace(e, location=f"shared/{e.sha256[:2]}/{e.sha256}-{e.path[10:]}")
        for e in files
    ]
    meta = make_metadata(CheckpointKind.CHECKPOINT, 3, files)

    text = gzip.decompress(meta.to_bytes()).decode()

    for e in files:
        assert text.count(e.sha256) == 1, "the digest appears once: no location spells it again"
        assert text.count(e.path) == 0, "paths are stored as a directory and a name"
    assert text.count('"name":') == len(files)
    for directory in ("state/0/0", "state/0/1"):
        assert text.count(f'"{directory}"') == 1
    assert CheckpointMetadata.from_bytes(meta.to_bytes(), SOURCE) == meta


def test_a_location_other_than_the_default_is_kept(make_metadata: MetadataMaker) -> None:
    # The same bytes stored under another name (content-addressed: still theirs).
    elsewhere = dataclasses.replace(entry("offsets/5", 7, SHA_B), location=f"shared/bb/{SHA_B}-4")
    meta = make_metadata(CheckpointKind.CHECKPOINT, 3, [entry("metadata", 0), elsewhere])
    document = document_of(meta)

    assert [f.get("location") for f in document["files"]] == [None, f"shared/bb/{SHA_B}-4"]
    assert CheckpointMetadata.from_bytes(meta.to_bytes(), SOURCE) == meta


def test_the_file_is_much_smaller_than_format_1(make_metadata: MetadataMaker) -> None:
    files = [
        entry(f"state/0/{p}/{v}.delta", 70_000, hashlib.sha256(f"{p}/{v}".encode()).hexdigest())
        for p in range(4)
        for v in range(1, 21)
    ]
    files = [
        dataclasses.replace(e, location=f"shared/{e.sha256[:2]}/{e.sha256}-{e.path[10:]}")
        for e in files
    ]
    meta = make_metadata(CheckpointKind.CHECKPOINT, 3, files)
    format_1 = len(json.dumps(_format_1_document(meta), indent=2)) + 1

    # Under 60 bytes a file (with one acknowledgement each), 32 of them the SHA-256, which
    # does not compress.
    assert len(meta.to_bytes()) < format_1 / 5
    assert len(meta.to_bytes()) < 80 * 60


def _format_1_document(meta: CheckpointMetadata) -> dict[str, Any]:
    document = document_of(meta)
    paths = [e.path for e in meta.files]
    document.update(
        format_version=1,
        files=[dataclasses.asdict(e) for e in meta.files],
        acknowledgements=[
            {**ack, "files": [paths[i] for i in ack["files"]]}
            for ack in document["acknowledgements"]
        ],
    )
    del document["directories"]
    Draft202012Validator(METADATA_SCHEMA_V1).validate(document)
    return document


def test_a_format_1_document_is_read(metadata: CheckpointMetadata) -> None:
    restored = CheckpointMetadata.from_bytes(encode(_format_1_document(metadata)), SOURCE)

    assert restored == dataclasses.replace(metadata, format_version=1)
    assert CheckpointMetadata.from_bytes(restored.to_bytes(), SOURCE) == metadata


def test_a_format_1_document_is_checked_against_its_own_schema(
    metadata: CheckpointMetadata,
) -> None:
    document = _format_1_document(metadata)
    document["files"][1]["path"] = "/etc/passwd"

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(encode(document), SOURCE)

    assert raised.value.field == "files[1].path"


def test_a_cut_short_gzip_stream_is_truncated(metadata: CheckpointMetadata) -> None:
    data = metadata.to_bytes()

    with pytest.raises(TruncatedMetadataError) as raised:
        CheckpointMetadata.from_bytes(data[: len(data) - 9], SOURCE)

    assert str(raised.value) == f"{SOURCE}: the gzip stream is cut short"


def test_a_damaged_gzip_stream_is_truncated(metadata: CheckpointMetadata) -> None:
    data = bytearray(metadata.to_bytes())
    data[-8] ^= 0xFF  # the CRC-32 of the content

    with pytest.raises(TruncatedMetadataError) as raised:
        CheckpointMetadata.from_bytes(bytes(data), SOURCE)

    assert str(raised.value).startswith(f"{SOURCE}: not a valid gzip stream (")


def test_bytes_after_the_gzip_stream_are_refused(metadata: CheckpointMetadata) -> None:
    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(metadata.to_bytes() + metadata.to_bytes(), SOURCE)

    assert str(raised.value) == f"{SOURCE}: $: has bytes after the end of its gzip stream"


def test_plain_json_beyond_the_bound_is_refused_unparsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata_module, "MAX_DOCUMENT_BYTES", 1000)

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(b"[" + b"{}," * 333 + b"{}]", SOURCE)

    assert str(raised.value) == f"{SOURCE}: $: is larger than 1000 bytes"


@pytest.mark.parametrize("field", ["query_id", "files[0].name"])
def test_a_lone_surrogate_is_refused_as_no_text(metadata: CheckpointMetadata, field: str) -> None:
    """JSON can escape half a UTF-16 pair alone; as a file's name it failed `verify` with a
    traceback (os.lstat), as a query id `inspect -o json` and the wide table (a
    reviewer's hostile storage)."""
    document = json.loads(metadata.to_json())
    if field == "query_id":
        document["query_id"] = "q\ud800"
    else:
        document["files"][0]["name"] = "x\ud800"
    data = json.dumps(document).encode()  # ASCII: the surrogate as the escape \ud800
    assert b"\\ud800" in data

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(data, SOURCE)

    assert (
        str(raised.value)
        == f"{SOURCE}: $: holds a lone UTF-16 surrogate (\\ud800), which is no text"
    )


def test_a_manifest_too_large_to_be_read_back_is_not_written(
    metadata: CheckpointMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is the reader's: a snapshot whose `_metadata` exceeds it would be written,
    registered, and refused at every restore (a reviewer's)."""
    monkeypatch.setattr(metadata_module, "MAX_DOCUMENT_BYTES", 100)

    with pytest.raises(ValueError, match=r"^the manifest of 3 files is \d+ bytes of JSON, more "):
        metadata.to_bytes()


def test_a_surrogate_pair_is_text(metadata: CheckpointMetadata) -> None:
    document = json.loads(metadata.to_json())
    document["properties"] = {"owner": "\U0001f600"}
    data = json.dumps(document).encode()  # the emoji as the escapes \ud83d\ude00

    assert CheckpointMetadata.from_bytes(data, SOURCE).properties == {"owner": "\U0001f600"}


def test_a_stream_that_expands_beyond_the_bound_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metadata_module, "MAX_DOCUMENT_BYTES", 1000)

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(gzip.compress(b" " * 1001), SOURCE)

    assert str(raised.value) == f"{SOURCE}: $: expands to more than 1000 bytes once decompressed"
    with pytest.raises(InvalidMetadataError) as within_bound:
        CheckpointMetadata.from_bytes(gzip.compress(b" " * 998 + b"[]"), SOURCE)
    assert str(within_bound.value) == f"{SOURCE}: $: [] is not of type 'object'"


def test_a_document_of_many_bad_entries_is_refused_after_its_first_errors(
    metadata: CheckpointMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 MiB of '{},' is 65 KB gzipped: every reader of it (list, verify, a restore) spent
    ten minutes making one schema error per entry before choosing which to name (a hostile
    reviewer's). Only the first few are made."""
    made = 0
    validator = metadata_module._VALIDATORS[2]

    class Counting:
        def iter_errors(self, document: object) -> Any:
            nonlocal made
            for error in validator.iter_errors(document):
                made += 1
                yield error

    monkeypatch.setitem(metadata_module._VALIDATORS, 2, Counting())
    document = document_of(metadata)
    document["files"] = [{}] * 10_000

    with pytest.raises(InvalidMetadataError) as raised:
        CheckpointMetadata.from_bytes(gzip.compress(encode(document)), SOURCE)

    assert raised.value.field.startswith("files["), raised.value.field
    assert made <= 100, made
