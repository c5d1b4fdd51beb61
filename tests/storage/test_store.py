"""CheckpointStorage: incremental checkpoints, savepoints, discarding, GC and restore."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

from helpers.objectstore import AzureServer, S3Server, StorageRoot, storage_roots
from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    ChecksumMismatchError,
    GarbageReport,
    InvalidMetadataError,
    JobStorageLayout,
    MissingFileError,
    NotEmptyError,
    StorageError,
    StorageFileSystem,
    SymbolicLinkError,
    TruncatedMetadataError,
    digest_local_file,
)
from spark_checkpoint.storage import durability as durability_module
from spark_checkpoint.storage import store as store_module

from .conftest import JOB, NAMESPACE, DurabilityCall, choose_fsync, choose_syncfs

SparkFile = Callable[[str, bytes], str]
MetadataMaker = Callable[..., CheckpointMetadata]
CHECKPOINT = CheckpointKind.CHECKPOINT
SAVEPOINT = CheckpointKind.SAVEPOINT


def all_files(directory: Path) -> list[str]:
    return sorted(
        str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()
    )


def stored(storage: CheckpointStorage, location: str) -> Path:
    """The local path of a stored file (local_only tests)."""
    return Path(storage.layout.location_path(location))


@pytest.fixture
def job_root(layout: JobStorageLayout) -> str:
    """The job's directory on the storage root under test (a path or a URI)."""
    return layout.job_root


@pytest.fixture
def local_job_root(layout: JobStorageLayout) -> Path:
    """The job's directory, for local_only tests."""
    return Path(layout.job_root)


@pytest.fixture
def take_checkpoint(
    storage: CheckpointStorage, spark_file: SparkFile, make_metadata: MetadataMaker
) -> Callable[..., CheckpointMetadata]:
    """Stores the given Spark files as checkpoint `checkpoint_id` and writes its `_metadata`."""

    def take(
        checkpoint_id: int, files: Mapping[str, bytes], *, link: bool = True
    ) -> CheckpointMetadata:
        entries = [
            storage.add_shared_file(spark_file(path, content), path, link=link)
            for path, content in files.items()
        ]
        meta = make_metadata(CHECKPOINT, checkpoint_id, entries)
        storage.write_metadata(meta)
        return meta

    return take


@pytest.fixture
def take_checkpoint_on(
    spark_file: SparkFile, make_metadata: MetadataMaker
) -> Callable[[CheckpointStorage], CheckpointMetadata]:
    """Takes checkpoint 1 (one file) on the given storage, which need not be `storage`."""

    def take(storage: CheckpointStorage) -> CheckpointMetadata:
        entry = storage.add_shared_file(spark_file("offsets/0", b"o0"), "offsets/0")
        meta = make_metadata(CHECKPOINT, 1, [entry])
        storage.write_metadata(meta)
        return meta

    return take


@pytest.fixture
def take_savepoint(
    storage: CheckpointStorage, spark_file: SparkFile, make_metadata: MetadataMaker
) -> Callable[..., CheckpointMetadata]:
    def take(savepoint_id: int, files: Mapping[str, bytes]) -> CheckpointMetadata:
        entries = [
            storage.add_savepoint_file(savepoint_id, spark_file(path, content), path)
            for path, content in files.items()
        ]
        meta = make_metadata(SAVEPOINT, savepoint_id, entries)
        storage.write_metadata(meta)
        return meta

    return take


@pytest.mark.local_only
def test_shared_files_are_content_addressed_and_hard_linked(
    storage: CheckpointStorage, spark_file: SparkFile
) -> None:
    local = spark_file("state/0/3/2.delta", b"delta")

    entry = storage.add_shared_file(local, "state/0/3/2.delta")

    assert entry.path == "state/0/3/2.delta"
    assert entry.size == 5
    assert entry.location == f"shared/{entry.sha256[:2]}/{entry.sha256}-2.delta"
    assert os.stat(stored(storage, entry.location)).st_ino == os.stat(local).st_ino


@pytest.mark.local_only
def test_shared_files_can_be_copied_instead(
    storage: CheckpointStorage, spark_file: SparkFile
) -> None:
    local = spark_file("offsets/1", b"offsets")

    entry = storage.add_shared_file(local, "offsets/1", link=False)

    assert stored(storage, entry.location).read_bytes() == b"offsets"
    assert os.stat(stored(storage, entry.location)).st_ino != os.stat(local).st_ino


def recording(
    operation: Callable[..., object], path_argument: int, paths: list[str]
) -> Callable[..., object]:
    """`operation`, also recording the path it writes (its positional `path_argument`)."""

    def run(*args: object, **options: object) -> object:
        paths.append(str(args[path_argument]))
        return operation(*args, **options)

    return run


def test_incremental_checkpoint_writes_no_bytes_for_files_already_stored(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = take_checkpoint(1, {"state/0/0/1.delta": b"one", "offsets/0": b"o0"})
    writes: list[str] = []
    for name, path_argument in (("link_in", 1), ("copy_in", 1), ("write_atomic", 0)):
        operation = getattr(storage.fs, name)
        monkeypatch.setattr(storage.fs, name, recording(operation, path_argument, writes))

    second = take_checkpoint(2, {"state/0/0/1.delta": b"one", "offsets/1": b"o1"})

    assert second.files[0].location == first.files[0].location
    # (Off the local filesystem, link_in stores by calling copy_in: one write, two records.)
    assert list(dict.fromkeys(writes)) == [
        storage.layout.location_path(second.files[1].location),
        storage.layout.metadata_path(CHECKPOINT, 2),
    ]


def test_a_damaged_shared_file_is_replaced(
    storage: CheckpointStorage, spark_file: SparkFile, storage_root: StorageRoot
) -> None:
    entry = storage.add_shared_file(spark_file("offsets/0", b"offsets"), "offsets/0", link=False)
    path = storage.layout.location_path(entry.location)
    storage_root.write(path, b"off")

    storage.add_shared_file(spark_file("offsets/0", b"offsets"), "offsets/0", link=False)

    assert storage_root.read(path) == b"offsets"


def test_metadata_round_trip_and_listing(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    take_savepoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
) -> None:
    first = take_checkpoint(1, {"offsets/0": b"o0"})
    take_checkpoint(12, {"offsets/1": b"o1"})
    savepoint = take_savepoint(3, {"offsets/1": b"o1"})
    # In flight or crashed: no `_metadata`, not listed.
    storage_root.write(f"{job_root}/chk-13/.x.tmp", b"partial")
    storage_root.write(f"{job_root}/savepoints/sp-4/files/offsets/1", b"o1")

    assert storage.read_metadata(CHECKPOINT, 1) == first
    assert storage.read_metadata(SAVEPOINT, 3) == savepoint
    assert storage.list_ids(CHECKPOINT) == [1, 12]
    assert storage.list_ids(SAVEPOINT) == [3]


def test_an_object_named_as_a_snapshot_directory_beside_it_lists_once(
    storage: CheckpointStorage,
    take_savepoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
) -> None:
    """An object store keeps an object `sp-3` and objects below `sp-3/` apart, and lists
    both: `list` showed savepoint 3 twice (a hostile newcomer on S3). A local directory
    cannot have both."""
    if storage_root.kind == "local":
        pytest.skip("a local directory holds no file and directory of one name")
    take_savepoint(3, {"offsets/1": b"o1"})
    storage_root.write(f"{job_root}/savepoints/sp-3", b"stray")

    assert storage.fs.list_dir(f"{job_root}/savepoints") == ["sp-3"]
    assert storage.list_ids(SAVEPOINT) == [3]


def test_the_highest_snapshot_id_counts_every_snapshot_directory(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
) -> None:
    """Whatever holds an id a new registry must not write over: complete or not, a
    checkpoint's or a savepoint's (a handed-over registry's ids continue above it)."""
    assert storage.highest_snapshot_id() is None
    take_checkpoint(2, {"offsets/0": b"o0"})
    storage_root.write(f"{job_root}/savepoints/sp-40/files/offsets/1", b"o1")
    storage_root.write(f"{job_root}/savepoints/sp-x/files/offsets/1", b"not a snapshot")
    assert storage.highest_snapshot_id() == 40
    storage_root.write(f"{job_root}/chk-41/.x.tmp", b"partial")
    # Beyond what the protocol carries (2**63 - 1): named by hand, no registry's.
    storage_root.write(f"{job_root}/savepoints/sp-99999999999999999999/_metadata", b"{}")
    assert storage.highest_snapshot_id() == 41


def test_a_snapshot_directory_named_beyond_the_protocols_ids_is_none_of_ours(
    storage: CheckpointStorage, job_root: str, storage_root: StorageRoot
) -> None:
    """`chk-99999999999999999999` was listed (an id no command could name) and collected:
    the agent's answer carried an id the protocol refuses, so the runtime logged "garbage
    collection skipped" for a collection that had deleted it (a newcomer's)."""
    storage_root.write(f"{job_root}/chk-99999999999999999999/_metadata", b"{}")
    storage_root.write(f"{job_root}/chk-{2**63}/_metadata", b"{}")
    storage_root.write(f"{job_root}/chk-{2**63 - 1}/.x.tmp", b"partial")

    assert storage.list_ids(CHECKPOINT) == []  # the highest id: cut short, no _metadata
    assert storage.collect_garbage([], []).checkpoint_ids == (2**63 - 1,)
    assert storage_root.exists(f"{job_root}/chk-99999999999999999999/_metadata")
    assert storage_root.exists(f"{job_root}/chk-{2**63}/_metadata")


def test_write_metadata_requires_every_file_to_be_stored(
    storage: CheckpointStorage,
    spark_file: SparkFile,
    make_metadata: MetadataMaker,
    storage_root: StorageRoot,
) -> None:
    entry = storage.add_shared_file(spark_file("offsets/0", b"o0"), "offsets/0")
    storage_root.delete(storage.layout.location_path(entry.location))

    with pytest.raises(MissingFileError) as raised:
        storage.write_metadata(make_metadata(CHECKPOINT, 1, [entry]))

    assert raised.value.path == storage.layout.location_path(entry.location)
    assert "offsets/0" in raised.value.reason
    assert storage.list_ids(CHECKPOINT) == []


def test_write_metadata_requires_every_file_to_have_its_size(
    storage: CheckpointStorage,
    spark_file: SparkFile,
    make_metadata: MetadataMaker,
    storage_root: StorageRoot,
) -> None:
    entry = storage.add_shared_file(spark_file("offsets/0", b"o0"), "offsets/0", link=False)
    storage_root.write(storage.layout.location_path(entry.location), b"o")

    with pytest.raises(ChecksumMismatchError) as raised:
        storage.write_metadata(make_metadata(CHECKPOINT, 1, [entry]))

    path = storage.layout.location_path(entry.location)
    assert str(raised.value) == f"{path}: size mismatch: expected 2 bytes, found 1 bytes"
    assert storage.list_ids(CHECKPOINT) == []


@pytest.mark.local_only
@pytest.mark.parametrize("linked", ["file", "directory"])
def test_write_metadata_refuses_a_file_reached_through_a_link(
    storage: CheckpointStorage,
    spark_file: SparkFile,
    make_metadata: MetadataMaker,
    tmp_path: Path,
    linked: str,
) -> None:
    """A link in `shared/` could make a `_metadata` name bytes outside the job's
    directory, which a later discard would delete: the size check refuses it (the file
    is durable already, so only that check looks at it)."""
    entry = storage.add_shared_file(spark_file("offsets/0", b"o0"), "offsets/0")
    storage.write_metadata(make_metadata(CHECKPOINT, 1, [entry]))
    path = stored(storage, entry.location)
    moved = path if linked == "file" else path.parent
    _move_behind_link(moved, tmp_path / "elsewhere")

    with pytest.raises(SymbolicLinkError) as raised:
        storage.write_metadata(make_metadata(CHECKPOINT, 2, [entry]))

    assert (raised.value.path, raised.value.target) == (str(moved), str(tmp_path / "elsewhere"))
    assert storage.list_ids(CHECKPOINT) == [1]


@pytest.mark.local_only  # argument checks, the same on every root
def test_write_metadata_refuses_another_jobs_metadata(
    storage_root: StorageRoot, make_metadata: MetadataMaker
) -> None:
    other = CheckpointStorage(JobStorageLayout(storage_root.url, "team-a", "other"))

    with pytest.raises(ValueError, match="team-a/other"):
        other.write_metadata(make_metadata(CHECKPOINT, 1, []))


@pytest.mark.local_only
def test_a_failed_metadata_write_leaves_no_checkpoint_and_no_temporary_file(
    storage: CheckpointStorage,
    make_metadata: MetadataMaker,
    local_job_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def power_cut(*_args: object, **_directories: object) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", power_cut)

    with pytest.raises(OSError, match="simulated"):
        storage.write_metadata(make_metadata(CHECKPOINT, 1, []))

    monkeypatch.undo()
    assert storage.list_ids(CHECKPOINT) == []
    assert all_files(local_job_root) == []


def test_read_metadata_errors_name_the_file(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
) -> None:
    path = storage.layout.metadata_path(CHECKPOINT, 1)
    with pytest.raises(MissingFileError) as missing:
        storage.read_metadata(CHECKPOINT, 1)
    assert missing.value.path == path

    take_checkpoint(1, {"offsets/0": b"o0"})
    storage_root.write(path, b"")
    with pytest.raises(TruncatedMetadataError) as truncated:
        storage.read_metadata(CHECKPOINT, 1)
    assert truncated.value.path == path


def test_a_metadata_file_copied_to_another_directory_is_invalid(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
) -> None:
    take_checkpoint(1, {"offsets/0": b"o0"})
    storage_root.write(
        f"{job_root}/chk-2/_metadata", storage_root.read(f"{job_root}/chk-1/_metadata")
    )

    with pytest.raises(InvalidMetadataError) as raised:
        storage.read_metadata(CHECKPOINT, 2)

    assert raised.value.field == "checkpoint_id"
    assert raised.value.path == storage.layout.metadata_path(CHECKPOINT, 2)
    assert raised.value.reason == f"checkpoint_id: is 1 but the file's directory is for 2{WHERE}"


# What every mismatch of a `_metadata` with its directory adds: where a snapshot must lie.
WHERE = (
    ": a snapshot is read only where it was written "
    "(<root>/<namespace>/<job>/chk-N or .../savepoints/sp-N)"
)


@pytest.mark.local_only  # parsing, the same on every root
@pytest.mark.parametrize(
    "case",
    [
        (
            "namespace",
            {"namespace": "team-b"},
            "is 'team-b' but the file's directory is for 'team-a'",
        ),
        ("job", {"job": "payments"}, "is 'payments' but the file's directory is for 'orders.v2'"),
        (
            "kind",
            {"kind": SAVEPOINT},
            "is 'savepoint' but the file's directory is for 'checkpoint'",
        ),
    ],
)
def test_a_metadata_file_of_another_job_or_kind_is_invalid_naming_the_field(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
    case: tuple[str, dict[str, object], str],
) -> None:
    field, change, reason = case
    meta = take_checkpoint(1, {"offsets/0": b"o0"})
    files = () if field == "kind" else meta.files  # a savepoint stores its own files
    foreign = dataclasses.replace(
        meta, files=files, total_bytes=sum(f.size for f in files), acknowledgements=(), **change
    )
    storage_root.write(f"{job_root}/chk-1/_metadata", foreign.to_bytes())

    with pytest.raises(InvalidMetadataError) as raised:
        storage.read_metadata(CHECKPOINT, 1)

    assert (raised.value.field, raised.value.reason) == (field, f"{field}: {reason}{WHERE}")


def test_verify_passes_for_an_intact_checkpoint(
    storage: CheckpointStorage, take_checkpoint: Callable[..., CheckpointMetadata]
) -> None:
    storage.verify(take_checkpoint(1, {"offsets/0": b"o0", "commits/0": b"c0"}))


def test_verify_reports_a_missing_file(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
) -> None:
    meta = take_checkpoint(1, {"offsets/0": b"o0", "commits/0": b"c0"})
    storage_root.delete(storage.layout.location_path(meta.files[1].location))

    with pytest.raises(MissingFileError) as raised:
        storage.verify(meta)

    assert raised.value.path == storage.layout.location_path(meta.files[1].location)
    assert "commits/0" in str(raised.value)


@pytest.mark.parametrize(("damaged_content", "mismatch"), [(b"o", "size"), (b"xx", "sha256")])
def test_verify_reports_a_size_or_checksum_mismatch(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
    damaged_content: bytes,
    mismatch: str,
) -> None:
    meta = take_checkpoint(1, {"offsets/0": b"o0"}, link=False)
    storage_root.write(storage.layout.location_path(meta.files[0].location), damaged_content)

    with pytest.raises(ChecksumMismatchError) as raised:
        storage.verify(meta)

    assert raised.value.path == storage.layout.location_path(meta.files[0].location)
    assert raised.value.mismatch == mismatch
    assert f"{mismatch} mismatch" in str(raised.value)


def test_discard_deletes_only_unreferenced_shared_files(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
) -> None:
    first = take_checkpoint(1, {"a": b"a", "b": b"b", "p": b"p"})
    second = take_checkpoint(2, {"b": b"b", "c": b"c"})
    only_first, shared_by_both, protected = first.files[0], first.files[1], first.files[2]

    storage.discard_checkpoint(1, retained=[2], protected_locations=[protected.location])

    assert not storage_root.exists(f"{job_root}/chk-1")
    assert not storage_root.exists(storage.layout.location_path(only_first.location))
    assert storage_root.exists(storage.layout.location_path(shared_by_both.location))
    assert storage_root.exists(storage.layout.location_path(protected.location))
    storage.verify(second)
    assert storage.list_ids(CHECKPOINT) == [2]


def test_a_checkpoint_naming_a_file_not_its_own_is_discarded_without_deleting_it(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hand-edited `_metadata` listed another job's file nested in this one's `shared/`
    (its storage root set there): discarding the checkpoint deleted it (a hostile
    reviewer's). A checkpoint's files are named by their digests: such a manifest is a
    damaged one, whose checkpoint goes without its files, and garbage collection keeps a
    file of a name storage never writes."""
    take_checkpoint(1, {"offsets/0": b"o0"})
    second = take_checkpoint(2, {"offsets/1": b"o1"})
    theirs = f"{job_root}/shared/zz/other/chk-1/_metadata"
    storage_root.write(theirs, b"theirs")
    document = json.loads(second.to_json())
    document["files"].append(
        {
            "dir": 0,
            "name": "stolen",
            "size": 6,
            "sha256": hashlib.sha256(b"theirs").hexdigest(),
            "location": "shared/zz/other/chk-1/_metadata",
        }
    )
    document["total_bytes"] += 6
    storage_root.write(storage.layout.metadata_path(CHECKPOINT, 2), json.dumps(document).encode())

    storage.discard_checkpoint(2, retained=[1])

    assert r"files[1].location" in caplog.text
    assert storage_root.read(theirs) == b"theirs"
    storage.collect_garbage([1], [])
    assert storage_root.read(theirs) == b"theirs"


def test_discard_of_a_checkpoint_that_is_gone_does_nothing(
    storage: CheckpointStorage, take_checkpoint: Callable[..., CheckpointMetadata]
) -> None:
    meta = take_checkpoint(2, {"a": b"a"})

    storage.discard_checkpoint(1, retained=[2])

    storage.verify(meta)


def test_discard_checks_its_input_before_deleting_anything(
    storage: CheckpointStorage, take_checkpoint: Callable[..., CheckpointMetadata]
) -> None:
    meta = take_checkpoint(1, {"a": b"a"})

    with pytest.raises(ValueError, match="discarded and retained"):
        storage.discard_checkpoint(1, retained=[1])
    with pytest.raises(MissingFileError):
        storage.discard_checkpoint(1, retained=[5])

    assert storage.read_metadata(CHECKPOINT, 1) == meta
    storage.verify(meta)


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "cut short": lambda data: data[: len(data) // 2],
    "not a manifest": lambda data: b"\x00" * len(data),
    "a newer format": lambda _data: b'{"format_version": 99}',
    "another checkpoint's": lambda data: dataclasses.replace(
        CheckpointMetadata.from_bytes(data, source="chk-1/_metadata"), checkpoint_id=7
    ).to_bytes(),
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
@pytest.mark.parametrize("name", ["_metadata", "_discarding"])
def test_a_checkpoint_whose_manifest_is_damaged_is_discarded_and_garbage_collection_takes_its_files(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[bytes], bytes],
    name: str,
) -> None:
    """Its discard failed at every try (retention kept it for ever, a registry entry no
    restore could use): it goes without its shared files, which are left to garbage
    collection, since which of them only it named is unknown."""
    first = take_checkpoint(1, {"a": b"a", "keep": b"k"})
    second = take_checkpoint(2, {"keep": b"k"})
    fs, directory = storage.fs, storage.layout.checkpoint_dir(1)
    metadata = storage.layout.metadata_path(CHECKPOINT, 1)
    damaged = damage(fs.read_bytes(metadata))
    fs.delete_file(metadata)
    fs.write_atomic(f"{directory}/{name}", damaged)

    storage.discard_checkpoint(1, retained=[2])

    assert fs.list_files(directory) == []
    assert "checkpoint 1 is discarded without its shared files" in caplog.text
    (only_its,) = first.locations - second.locations
    assert fs.exists(storage.layout.location_path(only_its))
    report = storage.collect_garbage([2], [])
    assert report.shared_locations == (only_its,)
    storage.verify(second)


class SimulatedCrash(Exception):
    pass


@pytest.mark.parametrize("crash_at", range(5))
def test_discard_finishes_after_a_crash_at_any_step(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
    monkeypatch: pytest.MonkeyPatch,
    crash_at: int,
) -> None:
    first = take_checkpoint(1, {"a": b"a", "b": b"b", "keep": b"k"})
    second = take_checkpoint(2, {"keep": b"k"})
    # The steps of discard_checkpoint(1): write `_discarding`, delete `_metadata`, delete
    # shared files a and b (in one batch on an object store, which may be cut between its
    # files), delete the directory. The crash comes before step `crash_at`.
    steps: list[str] = []

    def step(name: str, operation: Callable[..., None]) -> Callable[..., None]:
        def run(*args: object) -> None:
            if len(steps) == crash_at:
                raise SimulatedCrash(name)
            steps.append(name)
            operation(*args)

        return run

    def file_by_file(operation: Callable[[list[str]], None]) -> Callable[[Iterable[str]], None]:
        def run(paths: Iterable[str]) -> None:
            for path in paths:
                step("delete_files", operation)([path])

        return run

    with monkeypatch.context() as patch:
        for name in ("write_atomic", "delete_file", "delete_tree"):
            patch.setattr(storage.fs, name, step(name, getattr(storage.fs, name)))
        patch.setattr(storage.fs, "delete_files", file_by_file(storage.fs.delete_files))

        with pytest.raises(SimulatedCrash):
            storage.discard_checkpoint(1, retained=[2])
        if crash_at >= 2:  # `_metadata` is gone before any shared file is
            assert storage.list_ids(CHECKPOINT) == [2]

    storage.discard_checkpoint(1, retained=[2])
    storage.discard_checkpoint(1, retained=[2])

    assert not storage_root.exists(storage.layout.checkpoint_dir(1))
    assert not storage_root.exists(storage.layout.location_path(first.files[0].location))
    assert not storage_root.exists(storage.layout.location_path(first.files[1].location))
    storage.verify(second)
    assert storage.list_ids(CHECKPOINT) == [2]


@pytest.mark.local_only
def test_savepoints_are_self_contained_copies(
    storage: CheckpointStorage, take_savepoint: Callable[..., CheckpointMetadata], spark_dir: Path
) -> None:
    meta = take_savepoint(4, {"state/0/0/1.delta": b"state", "offsets/0": b"o0"})

    assert [entry.location for entry in meta.files] == [
        "savepoints/sp-4/files/state/0/0/1.delta",
        "savepoints/sp-4/files/offsets/0",
    ]
    copy = stored(storage, meta.files[0].location)
    assert os.stat(copy).st_ino != os.stat(spark_dir / "state/0/0/1.delta").st_ino
    storage.verify(meta)


def test_discard_savepoint(
    storage: CheckpointStorage,
    take_savepoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
) -> None:
    take_savepoint(1, {"a": b"a"})
    kept = take_savepoint(2, {"a": b"a"})

    storage.discard_savepoint(1)
    storage.discard_savepoint(1)

    assert not storage_root.exists(f"{job_root}/savepoints/sp-1")
    assert storage.list_ids(SAVEPOINT) == [2]
    storage.verify(kept)


def test_collect_garbage_follows_the_registry(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    take_savepoint: Callable[..., CheckpointMetadata],
    job_root: str,
    storage_root: StorageRoot,
) -> None:
    first = take_checkpoint(1, {"a": b"a"})
    second = take_checkpoint(2, {"a": b"a", "b": b"b"})
    # Written just before a crash, so never registered:
    unconfirmed = take_checkpoint(3, {"b": b"b", "c": b"c", "protected": b"p"})
    storage_root.write(f"{job_root}/chk-4/.x.tmp", b"partial")
    partial = f"shared/ff/.ff{'0' * 62}-c.{'1' * 32}.tmp"  # a copy cut short
    storage_root.write(f"{job_root}/{partial}", b"partial")
    storage_root.write(f"{job_root}/shared/ff/stray", b"no name storage writes")
    registered_savepoint = take_savepoint(1, {"a": b"a"})
    users_savepoint = take_savepoint(2, {"a": b"a"})
    storage_root.write(f"{job_root}/savepoints/sp-3/files/a", b"a")
    storage_root.write(f"{job_root}/unrelated/x", b"x")
    protected = unconfirmed.files[2].location

    report = storage.collect_garbage([1, 2], [1], protected_locations=[protected])

    assert report == GarbageReport(
        checkpoint_ids=(3, 4),
        savepoint_ids=(3,),
        shared_locations=tuple(sorted([unconfirmed.files[1].location, partial])),
    )
    assert storage.list_ids(CHECKPOINT) == [1, 2]
    assert storage.list_ids(SAVEPOINT) == [1, 2]
    for meta in (first, second, registered_savepoint, users_savepoint):
        storage.verify(meta)
    assert storage_root.exists(storage.layout.location_path(protected))
    assert storage_root.exists(f"{job_root}/unrelated/x")
    assert storage_root.exists(f"{job_root}/shared/ff/stray")
    assert storage.collect_garbage([1, 2], [1], [protected]) == GarbageReport((), (), ())


INNER_OWNER = StorageOwner(id="inner", description="the inner job's registry")


@pytest.mark.parametrize(
    ("inner_namespace", "inner_job"),
    [
        ("shared", "ab"),
        ("shared", "ow"),  # shared/ow/owner.json: a two-character name, then its own
        ("shared", "wr"),  # shared/wr/writer.lock, the lock a local run holds
        ("chk-5", "x"),  # beside this job's own unregistered checkpoint 5
        ("chk-6", "x"),  # inside a checkpoint this job discards
        ("savepoints", "sp-3"),
    ],
)
def test_another_jobs_storage_set_inside_this_jobs_loses_nothing_to_its_deletes(
    storage: CheckpointStorage,
    spark_file: SparkFile,
    make_metadata: MetadataMaker,
    inner_namespace: str,
    inner_job: str,
    *,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job whose storage root is this job's directory, its namespace `shared`, `chk-N`
    or `savepoints`, keeps its images in this job's `shared/`, a `chk-N` or an `sp-3` of
    it: this job's garbage collection deleted them all, its savepoint too (a newcomer's),
    and so would a discard of checkpoint 6 or savepoint 3. Garbage collection deletes only
    names it writes, and of a snapshot directory that holds another job's `owner.json`
    only what is this job's snapshot (`_metadata`, `_discarding`), so that none shows a
    snapshot that is gone."""
    layout = JobStorageLayout(storage.layout.job_root, inner_namespace, inner_job)
    inner = CheckpointStorage(layout)
    inner.claim(INNER_OWNER)
    inner.fs.write_atomic(f"{layout.job_root}/writer.lock", b"")
    images = []
    for kind, snapshot_id in ((CHECKPOINT, 1), (SAVEPOINT, 2)):
        local = spark_file("offsets/0", b"o0")
        entry = (
            inner.add_shared_file(local, "offsets/0")
            if kind is CHECKPOINT
            else inner.add_savepoint_file(snapshot_id, local, "offsets/0")
        )
        meta = make_metadata(kind, snapshot_id, [entry])
        images.append(dataclasses.replace(meta, namespace=inner_namespace, job=inner_job))
        inner.write_metadata(images[-1])
    for checkpoint_id in (5, 6):  # this job's: 5 never registered, 6 registered
        entry = storage.add_shared_file(spark_file(f"state/{checkpoint_id}", b"s"), "state/1")
        storage.write_metadata(make_metadata(CHECKPOINT, checkpoint_id, [entry]))

    storage.discard_checkpoint(6, [])
    storage.discard_savepoint(3)
    caplog.clear()
    report = storage.collect_garbage([], [])

    assert report.checkpoint_ids == (5,) and report.savepoint_ids == ()
    warnings = [record.getMessage() for record in caplog.records if "lies inside" in record.message]
    assert len(warnings) == len(set(warnings)), "each directory is told once"
    assert all(_is_ours(location) for location in report.shared_locations), report
    assert storage.list_ids(CHECKPOINT) == []
    assert not storage.fs.exists(storage.layout.discarding_path(6))
    for image in images:
        inner.verify(image)
    assert inner.recorded_owner() == INNER_OWNER
    assert inner.fs.exists(f"{layout.job_root}/writer.lock")


@pytest.mark.local_only  # a link in a snapshot's directory
def test_a_link_inside_a_discarded_checkpoints_directory_is_removed_not_followed(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    local_job_root: Path,
    tmp_path: Path,
) -> None:
    """The search for another job's `owner.json` refused the link, after the discard had
    moved `_metadata` aside and deleted the shared files: the discard failed at every try
    (a reviewer's). The link goes, what it points at stays."""
    take_checkpoint(6, {"offsets/0": b"o0"})
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "owner.json").write_text("{}")
    (local_job_root / "chk-6" / "link").symlink_to(outside)

    storage.discard_checkpoint(6, [])

    assert not (local_job_root / "chk-6").exists()
    assert (outside / "sub" / "owner.json").exists()


def _is_ours(location: str) -> bool:
    return location.startswith("shared/") and len(location.split("/")) == 3


def test_materialize_restores_every_file(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    tmp_path: Path,
) -> None:
    files = {"metadata": b"{}", "offsets/0": b"o0", "state/0/0/1.delta": b"state"}
    meta = take_checkpoint(1, files)
    target = tmp_path / "restore" / "attempt-2"

    storage.materialize(meta, str(target))

    assert {path: (target / path).read_bytes() for path in files} == files
    assert all_files(target) == sorted(files)


@pytest.mark.local_only  # argument checks, the same on every root
def test_materialize_into_an_existing_empty_directory(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    tmp_path: Path,
) -> None:
    meta = take_checkpoint(1, {"offsets/0": b"o0"})
    target = tmp_path / "fresh"
    target.mkdir()

    storage.materialize(meta, str(target))

    assert all_files(target) == ["offsets/0"]


@pytest.mark.local_only  # argument checks, the same on every root
def test_materialize_refuses_a_target_with_content(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    tmp_path: Path,
) -> None:
    meta = take_checkpoint(1, {"offsets/0": b"o0"})
    live = tmp_path / "live"
    live.mkdir()
    (live / "commits").mkdir()
    not_a_directory = tmp_path / "file"
    not_a_directory.write_bytes(b"")

    for target, reason in (
        (live, "is not empty; a restore needs a fresh directory"),
        (not_a_directory, "exists and is not a directory"),
    ):
        with pytest.raises(NotEmptyError) as raised:
            storage.materialize(meta, str(target))
        assert str(raised.value) == f"{target}: {reason}"
    assert all_files(live) == []


def test_materialize_keeps_a_space_in_a_path_as_part_of_the_name(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    tmp_path: Path,
) -> None:
    meta = take_checkpoint(1, {"sources/0/my input.txt": b"source"})

    storage.materialize(meta, str(tmp_path / "restore"))

    assert all_files(tmp_path / "restore") == ["sources/0/my input.txt"]


def test_a_failed_restore_into_an_existing_directory_empties_it_of_files_and_directories(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
    tmp_path: Path,
) -> None:
    files = {"metadata": b"{}", "offsets/0": b"o0", "state/0/0/1.delta": b"state"}
    meta = take_checkpoint(1, files, link=False)
    # The last one copied is missing.
    storage_root.delete(storage.layout.location_path(meta.files[2].location))
    target = tmp_path / "restore"
    target.mkdir()

    with pytest.raises(MissingFileError):
        storage.materialize(meta, str(target))

    assert list(target.iterdir()) == []


@pytest.mark.parametrize("target_exists", [False, True])
def test_materialize_removes_what_it_wrote_after_a_checksum_failure(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
    tmp_path: Path,
    target_exists: bool,
) -> None:
    meta = take_checkpoint(1, {"offsets/0": b"o0", "state/0/0/1.delta": b"state"}, link=False)
    corrupt = storage.layout.location_path(meta.files[1].location)
    storage_root.write(corrupt, b"STATE")
    target = tmp_path / "restore"
    if target_exists:
        target.mkdir()

    with pytest.raises(ChecksumMismatchError) as raised:
        storage.materialize(meta, str(target))

    assert raised.value.path == corrupt
    assert target.exists() == target_exists
    if target_exists:
        assert list(target.iterdir()) == []


# ---------------------------------------------------------------- symbolic links (issue 12, #7)


def _move_behind_link(directory: Path, elsewhere: Path) -> None:
    directory.rename(elsewhere)
    directory.symlink_to(elsewhere)


@pytest.mark.local_only
def test_restoring_through_a_linked_shared_directory_is_refused(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    local_job_root: Path,
    tmp_path: Path,
) -> None:
    meta = take_checkpoint(1, {"state/1.delta": b"one"})
    _move_behind_link(local_job_root / "shared", tmp_path / "elsewhere")

    with pytest.raises(SymbolicLinkError, match="shared: is a symbolic link"):
        storage.materialize(meta, str(tmp_path / "restored"))
    with pytest.raises(SymbolicLinkError):
        storage.verify(meta)
    assert not (tmp_path / "restored").exists()


@pytest.mark.local_only
def test_listing_through_a_linked_savepoints_directory_is_refused(
    storage: CheckpointStorage, local_job_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere" / "sp-4").mkdir(parents=True)
    (local_job_root).mkdir(parents=True)
    (local_job_root / "savepoints").symlink_to(tmp_path / "elsewhere")

    with pytest.raises(SymbolicLinkError, match="savepoints: is a symbolic link") as raised:
        storage.list_ids(SAVEPOINT)
    assert raised.value.target == str(tmp_path / "elsewhere")
    with pytest.raises(SymbolicLinkError):
        storage.discard_savepoint(4)
    assert (tmp_path / "elsewhere" / "sp-4").is_dir()


@pytest.mark.local_only
def test_a_linked_metadata_file_is_not_read(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    local_job_root: Path,
    tmp_path: Path,
) -> None:
    take_checkpoint(1, {"state/1.delta": b"one"})
    (local_job_root / "chk-1" / "_metadata").rename(tmp_path / "foreign-metadata")
    (local_job_root / "chk-1" / "_metadata").symlink_to(tmp_path / "foreign-metadata")

    with pytest.raises(SymbolicLinkError, match="_metadata: is a symbolic link"):
        storage.read_metadata(CHECKPOINT, 1)
    with pytest.raises(SymbolicLinkError):
        storage.discard_checkpoint(1, retained=[])
    assert (tmp_path / "foreign-metadata").exists()


@pytest.mark.local_only
def test_links_above_the_jobs_directory_are_the_administrators_and_work(
    tmp_path: Path, spark_file: SparkFile, make_metadata: MetadataMaker
) -> None:
    """A storage root mounted or linked elsewhere is ordinary; what is below the root (the
    namespace's and job's directories and all in them) is guarded."""
    (tmp_path / "volume").mkdir()
    (tmp_path / "root-link").symlink_to(tmp_path / "volume")
    layout = JobStorageLayout(str(tmp_path / "root-link"), "team-a", "orders.v2")
    storage = CheckpointStorage(layout)
    entry = storage.add_shared_file(spark_file("state/1.delta", b"one"), "state/1.delta")
    storage.write_metadata(make_metadata(CHECKPOINT, 1, [entry]))

    storage.verify(storage.read_metadata(CHECKPOINT, 1))
    assert storage.collect_garbage([], []).checkpoint_ids == (1,)
    assert not (tmp_path / "volume" / "team-a" / "orders.v2" / "chk-1").exists()


@pytest.mark.local_only
@pytest.mark.parametrize("linked", ["namespace", "job"])
def test_a_jobs_or_namespaces_directory_that_is_a_link_is_refused_and_nothing_is_deleted(
    tmp_path: Path, spark_file: SparkFile, make_metadata: MetadataMaker, linked: str
) -> None:
    """On a root jobs share, a job's directory placed as a link to another job's would
    make its garbage collection delete that job's files."""
    root = tmp_path / "root"
    other = CheckpointStorage(JobStorageLayout(str(root), "team-a", "orders.v2"))
    entry = other.add_shared_file(spark_file("state/1.delta", b"theirs"), "state/1.delta")
    other.write_metadata(make_metadata(CHECKPOINT, 1, [entry]))
    if linked == "job":
        link = root / "team-b" / "orders.v2"
        link.parent.mkdir()
        link.symlink_to(root / "team-a" / "orders.v2")
    else:
        link = root / "team-b"
        link.symlink_to(root / "team-a")
    storage = CheckpointStorage(JobStorageLayout(str(root), "team-b", "orders.v2"))

    with pytest.raises(SymbolicLinkError) as raised:
        storage.collect_garbage([], [])
    assert raised.value.path == str(link)
    with pytest.raises(SymbolicLinkError):
        storage.list_ids(CHECKPOINT)
    with pytest.raises(SymbolicLinkError):
        storage.add_shared_file(spark_file("state/2.delta", b"mine"), "state/2.delta")
    other.verify(other.read_metadata(CHECKPOINT, 1))


def test_discarding_names_a_corrupt_metadata_file(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
    caplog: pytest.LogCaptureFixture,
) -> None:
    take_checkpoint(1, {"offsets/0": b"o0"})
    path = storage.layout.metadata_path(CHECKPOINT, 1)
    storage_root.write(path, b'{"format_version": 1}')

    storage.discard_checkpoint(1, retained=[])

    assert f"once no checkpoint names them: {path}:" in caplog.text
    assert not storage_root.exists(path)


@pytest.mark.local_only
@pytest.mark.parametrize(
    ("link", "target"),
    [("shared/ab/cd", "directory"), ("shared/ab/cd/file", "file"), ("shared/top", "file")],
)
def test_garbage_collection_meets_a_link_deep_in_shared_and_deletes_nothing(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    local_job_root: Path,
    link: str,
    target: str,
) -> None:
    take_checkpoint(1, {"offsets/0": b"o0"})
    outside = local_job_root.parent.parent / "outside"
    (outside / "directory").mkdir(parents=True)
    (outside / "directory" / "precious").write_text("not the job's")
    (outside / "file").write_text("not the job's")
    (local_job_root / link).parent.mkdir(parents=True, exist_ok=True)
    (local_job_root / link).symlink_to(outside / target)
    before = all_files(local_job_root)

    with pytest.raises(SymbolicLinkError) as raised:
        storage.collect_garbage([], [])

    assert (raised.value.path, raised.value.target) == (
        str(local_job_root / link),
        str(outside / target),
    )
    assert all_files(local_job_root) == before
    assert all_files(outside) == ["directory/precious", "file"]


@pytest.mark.parametrize("link", [True, False])
def test_a_file_that_changes_between_hashing_and_storing_is_refused(
    storage: CheckpointStorage,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
    link: bool,
) -> None:
    """Spark could rewrite a file while a checkpoint stores it: the bytes stored must be
    the bytes hashed (here the hash is taken of an earlier version). A hard link (local
    storage) stores the file itself, which Spark never rewrites once committed."""
    if link and storage.fs.is_local:
        pytest.skip("a hard link is the file itself")
    local = spark_file("state/0/0/1.delta", b"earlier")
    earlier = digest_local_file(local)
    Path(local).write_bytes(b"rewritten")
    monkeypatch.setattr(store_module, "digest_local_file", lambda _path: earlier)

    with pytest.raises(ChecksumMismatchError) as raised:
        storage.add_shared_file(local, "state/0/0/1.delta", link=link)

    assert raised.value.path == local
    assert storage.fs.list_files(storage.layout.shared_dir) == []


@pytest.mark.local_only  # argument checks, the same on every root
def test_a_shared_file_path_must_be_relative(
    storage: CheckpointStorage, spark_file: SparkFile
) -> None:
    with pytest.raises(ValueError, match=r"^path must be a relative path"):
        storage.add_shared_file(spark_file("x", b"x"), "../x")


def test_every_retained_checkpoints_files_are_kept_not_only_the_last_ones(
    storage: CheckpointStorage, take_checkpoint: Callable[..., CheckpointMetadata]
) -> None:
    first = take_checkpoint(1, {"state/0/0/1.delta": b"one"})
    second = take_checkpoint(2, {"state/0/0/2.delta": b"two"})
    take_checkpoint(3, {"state/0/0/3.delta": b"three"})

    storage.discard_checkpoint(3, retained=[1, 2])
    report = storage.collect_garbage([1, 2], [])

    assert report == GarbageReport((), (), ())
    storage.verify(first)
    storage.verify(second)


def test_an_object_key_with_dot_segments_stops_garbage_collection_before_any_delete(
    s3_server: S3Server,
    take_checkpoint_on: Callable[[CheckpointStorage], CheckpointMetadata],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An object store's keys are plain strings: `shared/ab/../../../victim` can be a key
    (S3 keeps it as it is; Azure refuses such a name). Such a key is not a location, and
    garbage collection refuses it before it deletes anything."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    root = storage_roots("s3", tmp_path, lambda _kind: s3_server)
    storage = CheckpointStorage(JobStorageLayout(root.url, NAMESPACE, JOB))
    take_checkpoint_on(storage)  # never registered
    trap = f"{storage.layout.shared_dir}/ab/../../../victim"
    root.write(f"{root.url}/team-a/victim", b"not the job's")
    root.write(trap, b"placed by someone")

    with pytest.raises(
        StorageError, match=r"ab/\.\./\.\./\.\./victim: an object key that is no location"
    ):
        storage.collect_garbage([], [])

    assert storage.list_ids(CHECKPOINT) == [1], "nothing was deleted"
    assert root.read(f"{root.url}/team-a/victim") == b"not the job's"
    assert root.exists(trap)


@pytest.mark.parametrize("deleting", ["discard", "garbage collection"])
def test_an_azure_blob_with_dot_segments_stops_a_savepoints_delete_before_any_goes(
    azure_server: AzureServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deleting: str
) -> None:
    """adlfs deletes each blob by a request naming it in its path, and its client resolves
    `..` segments there: a blob `sp-3/files/x/../../../../../victim/...` (Azure reads a
    name's backslashes as `/`) deleted another job's `_metadata` with the savepoint (a
    security review's; with a SAS token or Entra ID, whose requests do not sign the path
    as Shared Key's do)."""
    for name, value in azure_server.sas_environment().items():
        monkeypatch.setenv(name, value)
    root = storage_roots("azure", tmp_path, lambda _kind: azure_server)
    storage = CheckpointStorage(JobStorageLayout(root.url, NAMESPACE, JOB))
    victim = f"{root.url}/{NAMESPACE}/victim/chk-1/_metadata"
    trap = storage.layout.savepoint_dir(3) + "/files/x" + "\\.." * 5 + "\\victim\\chk-1\\_metadata"
    root.write(victim, b"another job's")
    root.write(trap, b"placed by the job's code")

    with pytest.raises(OSError, match=r"x/\.\./\.\./\.\./\.\./\.\./victim/chk-1/_metadata"):
        if deleting == "discard":
            storage.discard_savepoint(3)
        else:
            storage.collect_garbage([], [])

    assert root.read(victim) == b"another job's"
    assert root.files(storage.layout.savepoint_dir(3)) != [], "nothing was deleted"


def test_zero_byte_folder_objects_are_no_files_to_garbage_collection_or_verify(
    s3_server: S3Server,
    take_checkpoint_on: Callable[[CheckpointStorage], CheckpointMetadata],
    spark_file: SparkFile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S3's console ("Create folder") and sync tools put zero-byte keys ending in `/`:
    `shared/` was listed as a file named "", which stopped every garbage collection as a
    key "maybe placed to delete outside the job's directory" (an object-store review's)."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    root = storage_roots("s3", tmp_path, lambda _kind: s3_server)
    storage = CheckpointStorage(JobStorageLayout(root.url, NAMESPACE, JOB))
    checkpoint = take_checkpoint_on(storage)
    bucket, _, prefix = storage.layout.job_root.removeprefix("s3://").partition("/")
    markers = [f"{prefix}/", f"{prefix}/shared/", f"{prefix}/shared/ab/", f"{prefix}/chk-1/"]
    for key in markers:
        root.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"")
    orphan = storage.add_shared_file(spark_file("offsets/9", b"never in one"), "offsets/9")

    report = storage.collect_garbage([1], [])

    assert report.shared_locations == (orphan.location,)
    storage.verify(checkpoint)
    assert storage.list_ids(CHECKPOINT) == [1]


@pytest.mark.local_only  # local file names; an object's key is refused above
def test_a_stray_file_with_a_line_break_in_its_name_is_garbage_like_any_other(
    storage: CheckpointStorage, local_job_root: Path
) -> None:
    """It stopped every garbage collection, in two lines giving the wrong reason ("'.',
    '..' or empty segments"): a local listing holds no `..`, and deleting by its name
    cannot leave the job's directory (a reviewer's)."""
    name = f"ab{'0' * 62}-evil\nname"  # a shared file's name, with a line break in it
    stray = local_job_root / "shared" / "ab" / name
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"placed by someone")

    report = storage.collect_garbage([], [])

    assert report.shared_locations == (f"shared/ab/{name}",)
    assert not stray.exists()


@pytest.mark.local_only  # deletes by directory descriptor
def test_a_delete_that_fails_names_the_whole_path(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    local_job_root: Path,
) -> None:
    """Deletes go relative to an open directory, and their errors named the bare name:
    "Is a directory: '_metadata'" (a reviewer's `_metadata` made a directory)."""
    take_checkpoint(1, {"offsets/0": b"o0"})  # never registered: garbage
    metadata = local_job_root / "chk-1" / "_metadata"
    metadata.unlink()
    (metadata / "inside").mkdir(parents=True)

    with pytest.raises(IsADirectoryError) as raised:
        storage.collect_garbage([], [])

    assert raised.value.filename == str(metadata)


def test_the_hadoop_scheme_s3a_names_the_same_storage(
    s3_server: S3Server,
    take_checkpoint_on: Callable[[CheckpointStorage], CheckpointMetadata],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Manifests name the root as Spark does (`s3a://`); s3fs serves both schemes."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    root = storage_roots("s3", tmp_path, lambda _kind: s3_server)
    written = take_checkpoint_on(CheckpointStorage(JobStorageLayout(root.url, NAMESPACE, JOB)))
    hadoop_root = root.url.replace("s3://", "s3a://", 1)

    storage = CheckpointStorage(JobStorageLayout(hadoop_root, NAMESPACE, JOB))

    assert storage.list_ids(CHECKPOINT) == [1]
    assert storage.read_metadata(CHECKPOINT, 1) == written
    storage.verify(written)


def test_what_another_process_changed_is_seen(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    storage_root: StorageRoot,
) -> None:
    """A cleanup pod or the next driver changes storage between two listings of this one
    (storage_root writes through a filesystem object of its own)."""
    first = take_checkpoint(1, {"offsets/0": b"o0"})
    assert storage.list_ids(CHECKPOINT) == [1]
    assert storage.fs.list_files(storage.layout.shared_dir) == [
        first.files[0].location.removeprefix("shared/")
    ]
    storage_root.write(
        storage.layout.metadata_path(CHECKPOINT, 2),
        dataclasses.replace(first, checkpoint_id=2).to_bytes(),
    )
    partial = f"ff/.ff{'0' * 62}-c.{'1' * 32}.tmp"  # a copy cut short
    storage_root.write(f"{storage.layout.shared_dir}/{partial}", b"partial")

    assert storage.list_ids(CHECKPOINT) == [1, 2]
    assert storage.collect_garbage([1, 2], []).shared_locations == (f"shared/{partial}",)


@dataclasses.dataclass
class Durability:
    """What made files durable, and when: `calls` are `durability_calls` with ("write",
    path) and ("written", path) around each `_metadata` write; `mechanism` is the one
    `make_durable` was made to choose."""

    mechanism: str
    calls: list[DurabilityCall]

    def before_metadata(self) -> list[DurabilityCall]:
        """The calls after the last but one `_metadata` write, before the last, sorted."""
        writes = [i for i, (kind, _path) in enumerate(self.calls) if kind == "write"]
        written = [i for i, (kind, _path) in enumerate(self.calls) if kind == "written"]
        start = written[-2] + 1 if len(written) > 1 else 0
        return sorted(self.calls[start : writes[-1]])

    def of(self, files: list[str]) -> list[DurabilityCall]:
        """The calls that make these new files durable: one syncfs of their filesystem,
        or an fsync of each and of each of their directories."""
        if self.mechanism == "syncfs":
            return [("syncfs", str(os.stat(files[0]).st_dev))]
        directories = {os.path.dirname(path) for path in files}
        return sorted(("fsync", path) for path in [*files, *directories])


@pytest.fixture(params=["syncfs", "fsync"])
def durability(
    request: pytest.FixtureRequest,
    storage: CheckpointStorage,
    durability_calls: list[DurabilityCall],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Durability:
    if request.param == "syncfs":
        choose_syncfs(monkeypatch, tmp_path)  # the local storage root's filesystem
    else:
        choose_fsync(monkeypatch)
    write_atomic = storage.fs.write_atomic

    def recorded_write(path: str, data: bytes) -> None:
        durability_calls.append(("write", path))
        write_atomic(path, data)
        durability_calls.append(("written", path))

    monkeypatch.setattr(storage.fs, "write_atomic", recorded_write)
    return Durability(request.param, durability_calls)


@pytest.mark.local_only
def test_linked_files_are_made_durable_together_before_metadata_and_once(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    durability: Durability,
) -> None:
    """A power loss must not leave a `_metadata` whose files' bytes were lost (Spark does
    not fsync its files): the linked files are made durable (one syncfs of their
    filesystem, or an fsync of each file and directory) before the `_metadata` naming
    them is written, by this process once, not again by later checkpoints that share them."""
    first = take_checkpoint(1, {"state/0/0/1.delta": b"one", "offsets/0": b"o0"})
    files = [str(stored(storage, entry.location)) for entry in first.files]

    assert durability.before_metadata() == durability.of(files)
    second = take_checkpoint(2, {"state/0/0/1.delta": b"one", "offsets/1": b"o1"})
    (new,) = [str(stored(storage, e.location)) for e in second.files if e not in first.files]
    assert durability.before_metadata() == durability.of([new])
    take_checkpoint(3, {"state/0/0/1.delta": b"one", "offsets/1": b"o1"})
    assert durability.before_metadata() == []


@pytest.mark.local_only
def test_a_file_another_process_stored_is_made_durable_before_metadata_names_it(
    storage: CheckpointStorage,
    layout: JobStorageLayout,
    spark_file: SparkFile,
    make_metadata: MetadataMaker,
    durability: Durability,
) -> None:
    """A driver that linked a file and died before its `_metadata` left it in `shared/`
    without an fsync; the next driver reuses it, so it makes it durable first."""
    earlier_driver = CheckpointStorage(layout)
    earlier_driver.add_shared_file(spark_file("state/0/0/1.delta", b"one"), "state/0/0/1.delta")

    entry = storage.add_shared_file(spark_file("state/0/0/1.delta", b"one"), "state/0/0/1.delta")
    storage.write_metadata(make_metadata(CHECKPOINT, 1, [entry]))

    assert durability.before_metadata() == durability.of([str(stored(storage, entry.location))])


@pytest.mark.local_only
def test_a_file_stored_again_after_a_discard_is_made_durable_again(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    durability: Durability,
) -> None:
    first = take_checkpoint(1, {"state/0/0/1.delta": b"one"})
    storage.discard_checkpoint(1, retained=[])

    take_checkpoint(2, {"state/0/0/1.delta": b"one"})

    assert durability.before_metadata() == durability.of(
        [str(stored(storage, first.files[0].location))]
    )


@pytest.mark.local_only
def test_a_failed_syncfs_fails_the_checkpoint_with_its_error(
    storage: CheckpointStorage,
    spark_file: SparkFile,
    make_metadata: MetadataMaker,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """syncfs reports a writeback error of the filesystem (Linux 5.8+): its files may not
    be on disk, so no `_metadata` names them."""
    choose_syncfs(monkeypatch, tmp_path)
    entry = storage.add_shared_file(spark_file("offsets/0", b"o0"), "offsets/0")

    def failing_syncfs(_descriptor: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(durability_module, "_syncfs", failing_syncfs)

    with pytest.raises(OSError) as raised:
        storage.write_metadata(make_metadata(CHECKPOINT, 1, [entry]))

    directory = os.path.dirname(stored(storage, entry.location))
    assert (
        str(raised.value)
        == f"[Errno 5] syncfs of the filesystem of {directory}: {os.strerror(errno.EIO)}"
    )
    assert storage.list_ids(CHECKPOINT) == []


@pytest.mark.parametrize(
    ("size", "at_most"), [(0, 5), (3, 5), (5, 5), (6, 5), (2 << 20, 1000), (10, 0)]
)
def test_a_bounded_read_takes_no_more_than_its_bound(
    storage_root: StorageRoot, monkeypatch: pytest.MonkeyPatch, size: int, at_most: int
) -> None:
    """A `_metadata` is read with a bound (64 MiB): an object was fetched whole before it
    applied, so a huge one (placed, or a wrong file) took its size in memory. An empty
    object, whose every range S3 and Azure refuse (InvalidRange), reads as empty."""
    content = os.urandom(size)
    path = f"{storage_root.url}/chk-1/_metadata"
    storage_root.write(path, content)
    fs = StorageFileSystem.for_url(storage_root.url)
    served: list[int] = []
    cat_file = fs._fs.cat_file

    def counted_cat_file(native: str, *args: object, **kwargs: object) -> bytes:
        data: bytes = cat_file(native, *args, **kwargs)
        served.append(len(data))
        return data

    monkeypatch.setattr(fs._fs, "cat_file", counted_cat_file)

    assert fs.read_bytes(path, at_most=at_most) == content[:at_most]
    assert all(length <= at_most for length in served), served


@pytest.mark.local_only
def test_a_file_in_a_checkpoints_place_is_named_whole_when_garbage_collection_meets_it(
    storage: CheckpointStorage,
    take_checkpoint: Callable[..., CheckpointMetadata],
    local_job_root: Path,
) -> None:
    """The janitor said only "[Errno 20] Not a directory: 'chk-9'" (a hostile reviewer's)."""
    take_checkpoint(1, {"offsets/0": b"o0"})
    (local_job_root / "chk-9").write_text("not a checkpoint")

    with pytest.raises(OSError) as raised:
        storage.collect_garbage(registered_checkpoints=[1], registered_savepoints=[])

    assert raised.value.filename == str(local_job_root / "chk-9")
