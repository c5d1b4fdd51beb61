"""What a write killed midway leaves that no listing shows, and that the sink removes when it
starts (`on_restore`): a local record's hidden temporary, left by a driver killed between
writing it and linking or renaming it into place, and an S3 multipart upload left by a task
killed while it uploaded a large data object. The writers are real processes, stopped at
the real point and killed there with SIGKILL (tests/helpers/paused_process.py)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from helpers.faulty_proxy import http_answer
from helpers.objectstore import StorageRoot
from helpers.paused_process import PausedProcess
from spark_checkpoint.sink import (
    COMMITTED_DIR,
    DATA_DIR,
    STAGING_DIR,
    BatchRecord,
    TransactionalFileSink,
    batch_record_name,
    read_committed,
)
from spark_checkpoint.sink_storage import OutputStorage

JOB = "default/orders"  # the job the output belongs to (TransactionalFileSink.on_restore)

if TYPE_CHECKING:
    from conftest import StartProxy

Stage = Callable[[TransactionalFileSink, int, list[dict[str, Any]]], Any]
NewSink = Callable[[], TransactionalFileSink]
TEMPORARY = re.compile(r"\.batch-0\.json\.[0-9a-f]{32}\.tmp")
ROWS = [{"word": "a", "count": 1}, {"word": "b", "count": 1}]


def names(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


@pytest.mark.local_only
@pytest.mark.parametrize(
    ("directory", "before", "code"),
    [
        # The driver committing batch 0: the commit record's temporary, not yet linked.
        (COMMITTED_DIR, "os.link", "TransactionalFileSink(URL).on_checkpoint_complete(0)"),
        # The driver staging batch 0 again: the staged record's temporary, not yet renamed.
        (STAGING_DIR, "os.replace", "OutputStorage(URL).write('_staging/batch-0.json', b'{}')"),
    ],
    ids=["commit-record", "staged-record"],
)
def test_a_temporary_left_by_a_killed_driver_is_removed_when_the_next_one_starts(
    sink: TransactionalFileSink,
    new_sink: NewSink,
    stage: Stage,
    *,
    output_url: str,
    directory: str,
    before: str,
    code: str,
) -> None:
    stage(sink, 0, ROWS)
    records = Path(output_url) / directory
    with PausedProcess(_with_sink(output_url, code), before=before) as driver:
        driver.kill()

    leftovers = [name for name in names(records) if TEMPORARY.fullmatch(name)]
    assert len(leftovers) == 1, names(records)  # what the crash left, as it left it
    assert read_committed(output_url) == {}  # readers never see it
    assert sink.staged_batches() == [0]
    assert sink.committed_batches() == []

    restarted = new_sink()
    restarted.on_restore(0, JOB)

    assert names(records) == (["batch-0.json"] if directory == COMMITTED_DIR else [])
    assert read_committed(output_url) == {0: ROWS}
    assert names(Path(output_url) / COMMITTED_DIR) == ["batch-0.json"]


@pytest.mark.local_only
def test_a_temporary_that_is_being_linked_is_never_removed(output_url: str) -> None:
    """Another driver (one not quite gone) holds its temporary: a driver starting now
    leaves it, and the other one's commit succeeds."""
    committed = Path(output_url) / COMMITTED_DIR
    code = "print(OutputStorage(URL).create('committed/batch-0.json', b'theirs'))"
    with PausedProcess(_with_sink(output_url, code), before="os.link") as other:
        assert OutputStorage(output_url).remove_unfinished_writes(COMMITTED_DIR) == 0
        TransactionalFileSink(output_url).on_restore(None, JOB)
        assert len(names(committed)) == 1
        assert other.resume() == "True\n"

    assert names(committed) == ["batch-0.json"]
    assert (committed / "batch-0.json").read_bytes() == b"theirs"


@pytest.mark.local_only
def test_a_temporary_removed_before_its_writer_locked_it_is_made_again(output_url: str) -> None:
    """The one moment a live writer's temporary is unlocked: created, not yet locked. A
    start removing it then must not make the write fail."""
    committed = Path(output_url) / COMMITTED_DIR
    code = "print(OutputStorage(URL).create('committed/batch-0.json', b'theirs'))"
    with PausedProcess(_with_sink(output_url, code), before="fcntl.flock") as other:
        assert OutputStorage(output_url).remove_unfinished_writes(COMMITTED_DIR) == 1
        assert names(committed) == []
        assert other.resume() == "True\n"

    assert names(committed) == ["batch-0.json"]
    assert (committed / "batch-0.json").read_bytes() == b"theirs"


def test_an_upload_left_by_a_killed_task_is_aborted_when_the_driver_starts(
    s3_root: StorageRoot, stage: Stage
) -> None:
    """A task killed while it uploads a data object larger than s3fs's block size (5 MiB
    here, 50 MiB by default) leaves a multipart upload that no listing shows. The next
    start aborts it, and only the uploads below its own output directory."""
    root = s3_root
    output_url = f"{root.url}/out"
    sink = TransactionalFileSink(output_url)
    stage(sink, 0, ROWS)
    sink.on_checkpoint_complete(0)
    task = (
        "def lines():\n"
        "    for _ in range(6 * 1024):\n"
        "        yield 'x' * 1023\n"
        "    pause()\n"
        "    yield 'end'\n"
        f"write_partition(URL, '{DATA_DIR}/batch-1/{'a' * 32}', 0, lines())\n"
    )
    block_size = {"FSSPEC_S3": '{"default_block_size": 5242880}'}
    with PausedProcess(_with_sink(output_url, task), environment=block_size) as executor:
        executor.kill()
    s3 = root.fs
    bucket = root.url.removeprefix("s3://").split("/", 1)[0]
    other = s3.call_s3("create_multipart_upload", Bucket=bucket, Key=_key(root, "other"))

    keys = [upload["Key"] for upload in root.unfinished_uploads()]
    assert len(keys) == 2, keys
    assert keys[0] == _key(root, "other")
    assert keys[1].startswith(_key(root, f"out/{DATA_DIR}/batch-1/{'a' * 32}/part-00000-"))
    assert read_committed(output_url) == {0: ROWS}

    TransactionalFileSink(output_url).on_restore(0, JOB)

    assert [upload["UploadId"] for upload in root.unfinished_uploads()] == [other["UploadId"]]
    assert read_committed(output_url) == {0: ROWS}
    record_path = f"{output_url}/{COMMITTED_DIR}/{batch_record_name(0)}"
    record = BatchRecord.from_json(root.read(record_path), record_path)
    assert [f"{DATA_DIR}/{path}" for path in root.files(f"{output_url}/{DATA_DIR}")] == [
        path for path, _size in record.files
    ]


def test_a_store_that_refuses_to_list_uploads_delays_no_start(
    s3_root: StorageRoot,
    faulty_proxy: StartProxy,
    stage: Stage,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Listing and aborting uploads need two permissions of their own: a store that refuses
    them leaves the uploads there, and the start goes on with a warning naming them."""
    denied = faulty_proxy(
        s3_root,
        re.compile(rb"^GET /\S*\?uploads"),
        http_answer("403 Forbidden", b"<Error><Code>AccessDenied</Code></Error>"),
    )
    output_url = f"{s3_root.url}/out"
    stage(TransactionalFileSink(output_url), 0, ROWS)
    caplog.set_level(logging.WARNING, logger="spark_checkpoint.sink")

    TransactionalFileSink(output_url).on_restore(0, JOB)

    assert denied.matched == 4, "a listing per directory, the first one refused"
    assert "cannot remove unfinished writes in " in caplog.text
    assert "/out/_staging (on S3 that needs s3:ListBucketMultipartUploads" in caplog.text
    assert read_committed(output_url) == {0: ROWS}


def _with_sink(output_url: str, code: str) -> str:
    return (
        "from spark_checkpoint.sink import TransactionalFileSink\n"
        "from spark_checkpoint.sink_storage import OutputStorage, write_partition\n"
        f"URL = {output_url!r}\n{code}"
    )


def _key(root: StorageRoot, path: str) -> str:
    return f"{root.url.removeprefix('s3://').split('/', 1)[1]}/{path}"
