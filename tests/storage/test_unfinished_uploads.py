"""What a checkpoint upload killed midway leaves on S3, and that garbage collection removes:
a shared file large enough for a multipart upload (s3fs: 100 MiB and more; 5 MiB parts
here) whose writer, a driver copying a snapshot, was killed with SIGKILL after its first
part (tests/helpers/paused_process.py). No listing shows such an upload, and S3 keeps and
bills it until it is aborted."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from helpers.faulty_proxy import http_answer
from helpers.objectstore import StorageRoot
from helpers.paused_process import PausedProcess
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout

if TYPE_CHECKING:
    from conftest import StartProxy

NAMESPACE, JOB = "team-a", "orders.v2"
PART = 5 * 1024 * 1024

# The driver's copy of a new shared file, stopped once its upload has sent one part.
KILLED_COPY = """
import s3fs
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout

s3fs.core.calculate_chunksize = lambda size, chunksize=None: {part}
call_s3 = s3fs.S3FileSystem._call_s3

async def stopping_after_a_part(self, method, *args, **kwargs):
    answer = await call_s3(self, method, *args, **kwargs)
    if method == "upload_part":
        pause()
    return answer

s3fs.S3FileSystem._call_s3 = stopping_after_a_part
storage = CheckpointStorage(JobStorageLayout({root!r}, {namespace!r}, {job!r}))
storage.add_shared_file({source!r}, "state/0/1/1.delta")
"""


def _killed_copy(root: StorageRoot, source: Path) -> None:
    source.write_bytes(b"x" * (3 * PART))
    code = KILLED_COPY.format(
        part=PART, root=root.url, namespace=NAMESPACE, job=JOB, source=str(source)
    )
    with PausedProcess(code, environment=root.environment) as driver:
        driver.kill()


def _uploads(root: StorageRoot) -> list[str]:
    return [str(upload["Key"]) for upload in root.unfinished_uploads()]


def test_an_upload_left_by_a_killed_driver_is_aborted_by_garbage_collection(
    s3_root: StorageRoot, tmp_path: Path
) -> None:
    _killed_copy(s3_root, tmp_path / "1.delta")
    bucket, prefix = s3_root.url.removeprefix("s3://").split("/", 1)
    other_job = f"{prefix}/{NAMESPACE}/billing/shared/x"
    s3_root.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=other_job)
    (left,) = [key for key in _uploads(s3_root) if key != other_job]
    assert re.fullmatch(rf"{prefix}/{NAMESPACE}/{JOB}/shared/.+", left)

    storage = CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))
    report = storage.collect_garbage([], [])

    assert report.aborted_uploads == 1
    assert _uploads(s3_root) == [other_job], "another job's upload is its own"


@pytest.mark.parametrize(
    "answer",
    [
        http_answer("403 Forbidden", b"<Error><Code>AccessDenied</Code></Error>"),
        http_answer("400 Bad Request", b"<Error><Code>InvalidRequest</Code></Error>"),
    ],
    ids=["permission-denied", "refused-otherwise"],
)
def test_a_store_that_refuses_to_list_uploads_collects_the_rest_with_a_warning(
    s3_root: StorageRoot,
    tmp_path: Path,
    faulty_proxy: StartProxy,
    caplog: pytest.LogCaptureFixture,
    answer: bytes,
) -> None:
    """Listing and aborting uploads need two permissions of their own, and the store may
    fail: the uploads stay, and the collection (its deletes done already) goes on."""
    _killed_copy(s3_root, tmp_path / "1.delta")
    bucket, prefix = s3_root.url.removeprefix("s3://").split("/", 1)
    unreferenced = f"{JOB}/shared/ab/{'ab' * 32}-2.delta"
    s3_root.fs.pipe_file(f"{bucket}/{prefix}/{NAMESPACE}/{unreferenced}", b"left")
    denied = faulty_proxy(s3_root, re.compile(rb"^GET /\S*\?uploads"), answer)
    caplog.set_level(logging.WARNING, logger="spark_checkpoint.storage.store")

    storage = CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))
    report = storage.collect_garbage([], [])

    assert denied.matched == 1
    assert report.shared_locations == (f"shared/ab/{'ab' * 32}-2.delta",)
    assert report.aborted_uploads == 0
    assert "cannot abort the unfinished uploads below " in caplog.text
    assert "s3:ListBucketMultipartUploads" in caplog.text
    assert len(_uploads(s3_root)) == 1


def _paging(
    monkeypatch: pytest.MonkeyPatch, storage: CheckpointStorage, *, upload_id_markers: bool
) -> list[dict[str, Any]]:
    """Make the S3 server answer listings of uploads one upload per page, as S3 does past
    1,000 (moto answers in one page whatever it holds): the request goes to the server as
    sent, whose botocore checks its parameters, and its answer is cut down to the upload
    after the markers sent, by key and then upload id (S3's ListMultipartUploads). A store
    without `upload_id_markers` pages by key alone. Returns the listing requests' markers."""
    s3 = storage.fs._fs  # fsspec gave each method its instance's sync wrapper
    call_s3 = s3.call_s3
    requests: list[dict[str, Any]] = []

    def one_per_page(method: str, *args: Any, **kwargs: Any) -> Any:
        answer = call_s3(method, *args, **kwargs)
        if method != "list_multipart_uploads":
            return answer
        markers = {k: v for k, v in kwargs.items() if k.endswith("Marker")}
        requests.append(markers)
        key, upload_id = markers.get("KeyMarker"), markers.get("UploadIdMarker")
        uploads = sorted(answer.get("Uploads", []), key=lambda u: (u["Key"], u["UploadId"]))
        if key is not None:
            uploads = [
                u
                for u in uploads
                if u["Key"] > key
                or (upload_id is not None and u["Key"] == key and u["UploadId"] > upload_id)
            ]
        page = {k: v for k, v in answer.items() if k != "Uploads"}
        page["IsTruncated"] = len(uploads) > 1
        if uploads:
            page["Uploads"] = uploads[:1]
        if len(uploads) > 1:
            page["NextKeyMarker"] = uploads[0]["Key"]
            if upload_id_markers:
                page["NextUploadIdMarker"] = uploads[0]["UploadId"]
        return page

    monkeypatch.setattr(s3, "call_s3", one_per_page)
    return requests


@pytest.mark.parametrize("upload_id_markers", [True, False], ids=["key-and-upload-id", "key"])
def test_uploads_listed_over_several_pages_are_all_aborted(
    s3_root: StorageRoot, monkeypatch: pytest.MonkeyPatch, upload_id_markers: bool
) -> None:
    """Past 1,000 uploads S3 answers in pages: each is asked for after the last upload of
    the one before. Two drivers killed while uploading the same file leave two uploads of
    one key, which only the upload id tells apart (a store that pages by key alone has
    one upload per key here)."""
    bucket, prefix = s3_root.url.removeprefix("s3://").split("/", 1)
    shared = f"{prefix}/{NAMESPACE}/{JOB}/shared"
    keys = (
        [f"{shared}/a", f"{shared}/a", f"{shared}/b"]
        if upload_id_markers
        else [
            f"{shared}/a",
            f"{shared}/b",
            f"{shared}/c",
        ]
    )
    other_job = f"{prefix}/{NAMESPACE}/billing/shared/x"
    for key in [*keys, other_job]:
        s3_root.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    storage = CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))
    requests = _paging(monkeypatch, storage, upload_id_markers=upload_id_markers)

    report = storage.collect_garbage([], [])

    assert report.aborted_uploads == 3
    assert len(requests) == 3, requests
    assert requests[0] == {}
    if upload_id_markers:
        assert set(requests[1]) == {"KeyMarker", "UploadIdMarker"}
    else:
        assert requests[1:] == [{"KeyMarker": f"{shared}/a"}, {"KeyMarker": f"{shared}/b"}]
    monkeypatch.undo()
    assert _uploads(s3_root) == [other_job]


def test_a_page_said_truncated_without_markers_ends_the_listing(
    s3_root: StorageRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that says "truncated" but not where to go on would answer the same page
    again: what the page lists is aborted, and the listing ends."""
    bucket, prefix = s3_root.url.removeprefix("s3://").split("/", 1)
    for name in ("a", "b"):
        key = f"{prefix}/{NAMESPACE}/{JOB}/shared/{name}"
        s3_root.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    storage = CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))
    call_s3 = storage.fs._fs.call_s3
    listings: list[str] = []

    def truncated_without_markers(method: str, *args: Any, **kwargs: Any) -> Any:
        answer = call_s3(method, *args, **kwargs)
        if method == "list_multipart_uploads":
            listings.append(method)
            answer = {**answer, "IsTruncated": True, "Uploads": answer["Uploads"][:1]}
        return answer

    monkeypatch.setattr(storage.fs._fs, "call_s3", truncated_without_markers)

    assert storage.collect_garbage([], []).aborted_uploads == 1
    assert len(listings) == 1


def test_with_no_unfinished_upload_collection_aborts_none_and_warns_of_nothing(
    storage_root: StorageRoot, caplog: pytest.LogCaptureFixture
) -> None:
    """On every storage: S3 lists no upload (its answer then has no `Uploads` at all),
    and there is nothing to ask the local filesystem or Azure."""
    caplog.set_level(logging.WARNING)
    storage = CheckpointStorage(JobStorageLayout(storage_root.url, NAMESPACE, JOB))

    assert storage.collect_garbage([], []).aborted_uploads == 0
    # google-auth's, on GCS: this machine has no Google credentials (gcsfs goes on without).
    assert [record for record in caplog.records if record.name != "google.auth._default"] == []
