"""What a checkpoint costs in requests to an S3 server (moto's, counting what it serves).

Spark's own checkpoints on object stores LIST directories for every batch, which is a known
cost that grows with the number of files. An incremental checkpoint here must not: an
unchanged file costs no request of its own. What `shared/` holds is listed once per
checkpoint, before `_metadata` is written (every file it names must be there), a request per
1,000 objects, where a HEAD per file cost a request per file twice (at 200 partitions, 800
HEADs took 4-13 s against moto). The next snapshot starts from that listing, with what the
process stored and deleted since; only the first one of a process lists when it starts.
"""

from __future__ import annotations

import collections
import hashlib
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helpers.faulty_proxy import http_answer
from helpers.objectstore import S3Server, StorageRoot, storage_roots
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    MissingFileError,
    StorageError,
    filesystem,
)
from spark_checkpoint.storage.layout import SHARED_DIR_NAME, shared_location

from .conftest import JOB, NAMESPACE, build_metadata

if TYPE_CHECKING:
    from conftest import StartProxy

SparkFile = Callable[[str, bytes], str]


def _checkpoint(
    storage: CheckpointStorage, spark_file: SparkFile, checkpoint_id: int, image: dict[str, bytes]
) -> CheckpointMetadata:
    """Store `image` (path: content) as the agent does, and write its `_metadata`."""
    stored = storage.listed_shared_sizes()
    entries = [
        storage.add_shared_file(spark_file(p, c), p, stored=stored) for p, c in image.items()
    ]
    metadata = build_metadata(CheckpointKind.CHECKPOINT, checkpoint_id, entries)
    storage.write_metadata(metadata)
    return metadata


def _requests_after_a_checkpoint(
    s3_server: S3Server,
    tmp_path: Path,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
    *,
    files: int,
    then: Callable[[CheckpointStorage, dict[str, bytes]], object],
) -> collections.Counter[str]:
    """Requests of `then` (given the storage and the image), after checkpoint 1 stored an
    image of `files` files."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    root = storage_roots("s3", tmp_path, lambda _kind: s3_server)
    storage = CheckpointStorage(JobStorageLayout(root.url, NAMESPACE, JOB))
    image = {f"state/0/{n}/1.delta": f"partition {n}".encode() for n in range(files)}
    _checkpoint(storage, spark_file, 1, image)
    before = s3_server.requests.snapshot()
    then(storage, image)
    return s3_server.requests.snapshot() - before


def _small_and_large(
    s3_server: S3Server,
    tmp_path: Path,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
    then: Callable[[CheckpointStorage, dict[str, bytes]], object],
) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """The requests of `then` after a checkpoint of 3 files and after one of 15."""
    small, large = (
        _requests_after_a_checkpoint(
            s3_server, tmp_path / str(files), spark_file, monkeypatch, files=files, then=then
        )
        for files in (3, 15)
    )
    return small, large


def test_an_unchanged_file_costs_no_request_and_the_requests_do_not_grow(
    s3_server: S3Server,
    tmp_path: Path,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def next_checkpoint(storage: CheckpointStorage, image: dict[str, bytes]) -> None:
        # One file changed in between (the usual case: a few state files change per batch).
        _checkpoint(storage, spark_file, 2, {**image, "state/0/0/1.delta": b"next batch"})

    small, large = _small_and_large(s3_server, tmp_path, spark_file, monkeypatch, next_checkpoint)

    assert small == large
    assert small["PUT"] == 2, small  # the changed file and `_metadata`
    # `shared/` listed before `_metadata` is written, not when the snapshot starts: it
    # starts from the previous checkpoint's listing.
    assert small["LIST"] == 1, small
    assert set(small) == {"PUT", "LIST"}, small


def _discard(storage: CheckpointStorage, _image: dict[str, bytes]) -> None:
    storage.discard_checkpoint(1, retained=[])
    assert storage.listed_shared_sizes() == {}


def _collect_garbage(storage: CheckpointStorage, _image: dict[str, bytes]) -> None:
    storage.collect_garbage([], [])
    assert storage.listed_shared_sizes() == {}


DELETES = {"discard": _discard, "garbage collection": _collect_garbage}


@pytest.mark.parametrize("delete", DELETES.values(), ids=DELETES.keys())
def test_deleting_shared_files_costs_requests_that_do_not_grow_with_them(
    s3_server: S3Server,
    tmp_path: Path,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
    delete: Callable[[CheckpointStorage, dict[str, bytes]], None],
) -> None:
    """A discard or a collection deletes the shared files in batches (S3's DeleteObjects,
    1,000 keys a request), not with a request per file: 2,000 files took 6.6 s against
    moto one by one, 0.14 s in batches."""
    small, large = _small_and_large(s3_server, tmp_path, spark_file, monkeypatch, delete)

    assert small == large
    assert small["DELETE"] <= 2, small  # `_metadata` (and `_discarding`), each alone


def test_a_shared_file_the_store_refused_to_delete_fails_the_discard_naming_it(
    s3_root: StorageRoot, spark_file: SparkFile, faulty_proxy: StartProxy
) -> None:
    """S3 answers a DeleteObjects with 200 and the keys it refused to delete in the body
    (s3fs's rm drops them): the discard fails naming one, so that a missing s3:DeleteObject
    shows and nothing is thought deleted that is not; discarding again finishes it."""
    layout = JobStorageLayout(s3_root.url, NAMESPACE, JOB)
    bucket, prefix = s3_root.url.removeprefix("s3://").split("/", 1)
    location = shared_location(hashlib.sha256(IMAGE["state/0/0/1.delta"]).hexdigest(), "1.delta")
    key = f"{prefix}/{NAMESPACE}/{JOB}/{location}"
    refusal = (
        '<?xml version="1.0" encoding="UTF-8"?><DeleteResult><Error>'
        f"<Key>{key}</Key><Code>AccessDenied</Code><Message>Access Denied</Message>"
        "</Error></DeleteResult>"
    ).encode()
    refused = faulty_proxy(
        s3_root, re.compile(rb"^POST /\S*\?delete"), http_answer("200 OK", refusal)
    )
    storage = CheckpointStorage(layout)
    assert location in _checkpoint(storage, spark_file, 1, IMAGE).locations

    with pytest.raises(PermissionError) as raised:
        storage.discard_checkpoint(1, retained=[])

    assert refused.matched == 1
    assert str(raised.value) == (
        f"[Errno 13] 1 of {len(IMAGE)} object(s) not deleted, e.g. this one: AccessDenied: "
        f"Access Denied (is s3:DeleteObject granted?): 's3://{bucket}/{key}'"
    )
    storage.discard_checkpoint(1, retained=[])
    assert storage.listed_shared_sizes() == {}
    assert not s3_root.exists(layout.checkpoint_dir(1))


def test_a_store_that_takes_no_batched_delete_gets_one_per_request(
    s3_root: StorageRoot,
    s3_server: S3Server,
    spark_file: SparkFile,
    faulty_proxy: StartProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S3-compatible stores (older MinIO, Ceph and others) refuse a DeleteObjects without
    Content-MD5, which botocore no longer sends: the discard deletes the objects one by
    one, as before batches, and asks that bucket no more."""
    monkeypatch.setattr(filesystem, "_S3_ONE_BY_ONE", set())
    refused = faulty_proxy(
        s3_root,
        re.compile(rb"^POST /\S*\?delete"),
        http_answer(
            "400 Bad Request",
            b"<Error><Code>MissingContentMD5</Code><Message>Missing required header for this "
            b"request: Content-Md5.</Message></Error>",
        ),
    )
    storage = CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))
    _checkpoint(storage, spark_file, 1, IMAGE)
    before = s3_server.requests.snapshot()

    storage.discard_checkpoint(1, retained=[])

    assert refused.matched == 1
    requests = s3_server.requests.snapshot() - before
    assert requests["DELETE"] >= len(IMAGE) + 1, requests  # and the directory's `_discarding`
    assert storage.listed_shared_sizes() == {}
    assert not s3_root.exists(storage.layout.checkpoint_dir(1))


def test_a_key_with_a_dot_dot_segment_is_never_deleted_by_a_request_of_its_own(
    s3_root: StorageRoot,
    spark_file: SparkFile,
    faulty_proxy: StartProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key planted in a snapshot's directory whose path, resolved, names an object
    outside the job's directory: on a store that takes no batched delete, its DELETE's path
    would be resolved to that object by a proxy or store that normalises paths (a
    hostile-storage tester's). Refused, naming it, before any object goes."""
    monkeypatch.setattr(filesystem, "_S3_ONE_BY_ONE", set())
    faulty_proxy(
        s3_root,
        re.compile(rb"^POST /\S*\?delete"),
        http_answer("501 Not Implemented", b"<Error><Code>NotImplemented</Code></Error>"),
    )
    storage = CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))
    _checkpoint(storage, spark_file, 1, IMAGE)
    planted = f"{storage.layout.checkpoint_dir(1)}/x/../../../outside"
    s3_root.write(planted, b"planted")

    with pytest.raises(OSError, match=r"a key with a '\.' or '\.\.' segment") as raised:
        storage.discard_checkpoint(1, retained=[])

    assert raised.value.filename == planted
    assert s3_root.exists(planted)


def test_a_blob_azure_refused_to_delete_fails_the_discard_naming_it(
    azure_root: StorageRoot, spark_file: SparkFile, faulty_proxy: StartProxy
) -> None:
    """Azure has no batched delete (adlfs's rm asked for each blob in turn before deleting
    them, and named the whole list in a refusal): each delete is a request of its own, all
    at once, and a refusal names its blob with Azure's code."""
    refused = faulty_proxy(
        azure_root,
        re.compile(rb"^DELETE /\S*/shared/"),
        http_answer(
            "403 This request is not authorized to perform this operation using this permission.",
            b"<?xml version='1.0' encoding='utf-8'?><Error><Code>AuthorizationPermissionMismatch"
            b"</Code><Message>This request is not authorized.</Message></Error>",
        ),
    )
    storage = CheckpointStorage(JobStorageLayout(azure_root.url, NAMESPACE, JOB))
    _checkpoint(storage, spark_file, 1, IMAGE)

    with pytest.raises(StorageError) as raised:
        storage.discard_checkpoint(1, retained=[])

    assert refused.matched == len(IMAGE)  # all sent, the first answer spoiled
    assert f"/{SHARED_DIR_NAME}/" in str(raised.value), raised.value
    assert "AuthorizationPermissionMismatch" in str(raised.value), raised.value
    storage.discard_checkpoint(1, retained=[])
    assert storage.listed_shared_sizes() == {}


@pytest.fixture
def s3_storage(s3_root: StorageRoot) -> CheckpointStorage:
    return CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))


IMAGE = {f"state/0/{n}/1.delta": f"partition {n}".encode() for n in range(4)}


def test_what_a_discard_deleted_is_stored_again_without_another_listing(
    s3_server: S3Server, s3_storage: CheckpointStorage, spark_file: SparkFile
) -> None:
    _checkpoint(s3_storage, spark_file, 1, IMAGE)
    s3_storage.discard_checkpoint(1, retained=[])
    before = s3_server.requests.snapshot()

    second = _checkpoint(s3_storage, spark_file, 2, IMAGE)

    requests = s3_server.requests.snapshot() - before
    assert requests["PUT"] == len(IMAGE) + 1 and requests["LIST"] == 1, requests
    s3_storage.verify(second)


def test_the_next_snapshot_knows_what_was_stored_since_the_last_listing(
    s3_server: S3Server, s3_storage: CheckpointStorage, spark_file: SparkFile
) -> None:
    _checkpoint(s3_storage, spark_file, 1, IMAGE)
    path = "state/0/0/2.delta"
    stored = s3_storage.listed_shared_sizes()
    entry = s3_storage.add_shared_file(spark_file(path, b"next batch"), path, stored=stored)
    before = s3_server.requests.snapshot()

    listed = s3_storage.listed_shared_sizes()

    assert s3_server.requests.snapshot() - before == collections.Counter()
    assert listed is not None and listed[entry.location] == entry.size


@pytest.mark.parametrize("listing", ["across the start of the deletes", "amid the deletes"])
def test_a_listing_that_overlaps_deletes_is_not_what_the_next_snapshot_starts_from(
    s3_storage: CheckpointStorage,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
    listing: str,
) -> None:
    """A listing taken while files are deleted may show them: remembering it would make the
    next snapshot skip storing them, and fail."""
    first = _checkpoint(s3_storage, spark_file, 1, IMAGE)
    # What another process of the job sees: nothing remembered yet.
    storage = CheckpointStorage(s3_storage.layout)
    if listing == "amid the deletes":
        delete_files = storage.fs.delete_files

        def listing_amid(paths: Iterable[str]) -> None:
            first, *rest = paths
            assert f"/{SHARED_DIR_NAME}/" in first
            delete_files([first])
            storage.listed_shared_sizes()
            delete_files(rest)

        monkeypatch.setattr(storage.fs, "delete_files", listing_amid)
        storage.discard_checkpoint(1, retained=[])
    else:
        list_file_sizes = storage.fs.list_file_sizes

        def deleting_meanwhile(path: str) -> dict[str, int]:
            sizes = list_file_sizes(path)
            monkeypatch.setattr(storage.fs, "list_file_sizes", list_file_sizes)
            storage.discard_checkpoint(1, retained=[])
            return sizes

        monkeypatch.setattr(storage.fs, "list_file_sizes", deleting_meanwhile)
        listed = storage.listed_shared_sizes()
        assert listed is not None and listed.keys() == first.locations

    assert storage.listed_shared_sizes() == {}
    storage.verify(_checkpoint(storage, spark_file, 2, IMAGE))


def test_a_file_found_missing_is_stored_again_even_when_that_listing_is_not_remembered(
    s3_storage: CheckpointStorage, spark_file: SparkFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file deleted behind the job's back fails the checkpoint that names it; the next
    stores it again, also when another snapshot's upload overlapped the listing that found
    it missing (so that listing is not what the next snapshot starts from)."""
    first = _checkpoint(s3_storage, spark_file, 1, IMAGE)
    gone = first.files[0]
    CheckpointStorage(s3_storage.layout).fs.delete_file(
        s3_storage.layout.location_path(gone.location)
    )
    list_file_sizes = s3_storage.fs.list_file_sizes

    def uploading_meanwhile(path: str) -> dict[str, int]:
        sizes = list_file_sizes(path)
        monkeypatch.setattr(s3_storage.fs, "list_file_sizes", list_file_sizes)
        concurrent = "state/1/0/1.delta"
        s3_storage.add_shared_file(spark_file(concurrent, b"another snapshot"), concurrent)
        return sizes

    monkeypatch.setattr(s3_storage.fs, "list_file_sizes", uploading_meanwhile)
    with pytest.raises(MissingFileError, match=re.escape(repr(gone.path))):
        _checkpoint(s3_storage, spark_file, 2, IMAGE)

    s3_storage.verify(_checkpoint(s3_storage, spark_file, 3, IMAGE))
