"""What a checkpoint upload killed midway leaves on S3, and that garbage collection removes:
a shared file large enough for a multipart upload (s3fs: 100 MiB and more; 5 MiB parts
here) whose writer, a driver copying a snapshot, was killed with SIGKILL after its first
part (tests/helpers/paused_process.py). No listing shows such an upload, and S3 keeps and
bills it until it is aborted."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

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
    unreferenced = f"{JOB}/shared/{'ab' * 32}-2.delta"
    s3_root.fs.pipe_file(f"{bucket}/{prefix}/{NAMESPACE}/{unreferenced}", b"left")
    denied = faulty_proxy(s3_root, re.compile(rb"^GET /\S*\?uploads"), answer)
    caplog.set_level(logging.WARNING, logger="spark_checkpoint.storage.store")

    storage = CheckpointStorage(JobStorageLayout(s3_root.url, NAMESPACE, JOB))
    report = storage.collect_garbage([], [])

    assert denied.matched == 1
    assert report.shared_locations == (f"shared/{'ab' * 32}-2.delta",)
    assert report.aborted_uploads == 0
    assert "cannot abort the unfinished uploads below " in caplog.text
    assert "s3:ListBucketMultipartUploads" in caplog.text
    assert len(_uploads(s3_root)) == 1
