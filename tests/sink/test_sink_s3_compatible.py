"""The sink against S3-compatible stores that answer a refused create-only write otherwise
than AWS S3 does: a `412 PreconditionFailed` whose body does not name the condition
(`<Condition>If-None-Match</Condition>`, which s3fs needs to raise FileExistsError; MinIO
leaves it out). Moto's server stands in for the store, a proxy rewrites its answer."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

import pytest
from s3fs import S3FileSystem

from helpers.faulty_proxy import FaultyProxy, http_answer
from helpers.objectstore import StorageRoot
from spark_checkpoint.sink import StartRefused, TransactionalFileSink, read_committed

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import Stage, StartProxy

JOB = "default/orders"  # the job the output belongs to (TransactionalFileSink.on_restore)
ROWS = [{"word": "a", "count": 1}]
# MinIO's answer to a PutObject with If-None-Match: * on a key that exists.
PRECONDITION_FAILED = http_answer(
    "412 Precondition Failed",
    b"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>PreconditionFailed</Code>"
    b"<Message>At least one of the pre-conditions you specified did not hold</Message>"
    b"<Key>out/committed/batch-0.json</Key><RequestId>17E2</RequestId></Error>",
)


def test_a_commit_record_already_there_is_recognised_without_the_condition_named(
    s3_root: StorageRoot,
    faulty_proxy: StartProxy,
    stage: Stage,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A driver died after it created a commit record and before it deleted the staged
    one: the next driver's restore creates the record again and the store refuses. Taken
    for a storage error, the restore failed, and so did every restore after it."""
    output_url = f"{s3_root.url}/out"
    sink = TransactionalFileSink(output_url)
    sink.on_restore(None, JOB)
    stage(sink, 0, ROWS)
    [staged] = s3_root.files(f"{output_url}/_staging")
    record = s3_root.read(f"{output_url}/_staging/{staged}")
    sink.on_checkpoint_complete(0)
    s3_root.write(f"{output_url}/_staging/{staged}", record)  # the crash left it
    refused = faulty_proxy(
        s3_root, re.compile(rb"^PUT /\S*/committed/batch-0\.json"), PRECONDITION_FAILED
    )
    caplog.set_level(logging.INFO, logger="spark_checkpoint.sink")
    S3FileSystem.clear_instance_cache()  # the next driver is another process

    TransactionalFileSink(output_url).on_restore(0, JOB)

    assert refused.matched == 1
    assert "batch 0 committed (its record was already there)" in caplog.text
    assert read_committed(output_url) == {0: ROWS}
    assert s3_root.files(f"{output_url}/_staging") == []


def test_a_store_that_refuses_deletes_fails_the_first_commit_naming_the_object(
    s3_root: StorageRoot, faulty_proxy: StartProxy, stage: Stage
) -> None:
    """Without s3:DeleteObject (S3 answers DeleteObjects 200, the refusals in its body,
    which s3fs dropped): the commit deletes the batch's staged record, and says that it
    cannot (as the user guide's permissions say); the committed output is whole, and the
    commit finishes once the store takes deletes."""
    output_url = f"{s3_root.url}/out"
    faulty_proxy(
        s3_root,
        re.compile(rb"^POST /\S*\?delete"),
        http_answer(
            "200 OK",
            b"<?xml version='1.0' encoding='UTF-8'?><DeleteResult><Error><Key>out/x</Key>"
            b"<Code>AccessDenied</Code><Message>Access Denied</Message></Error></DeleteResult>",
        ),
    )
    sink = TransactionalFileSink(output_url)
    sink.on_restore(None, JOB)
    stage(sink, 0, ROWS)

    with pytest.raises(PermissionError, match=r"is s3:DeleteObject granted\?"):
        sink.on_checkpoint_complete(0)

    assert read_committed(output_url) == {0: ROWS}
    sink.on_checkpoint_complete(0)
    assert s3_root.files(f"{output_url}/_staging") == []


@pytest.mark.parametrize("with_restore", [True, False])
def test_a_store_that_ignores_create_only_writes_is_refused_before_anything_is_staged(
    s3_root: StorageRoot,
    condition_ignoring_store: Callable[[StorageRoot], FaultyProxy],
    stage: Stage,
    with_restore: bool,
) -> None:
    """Older S3-compatible stores ignore If-None-Match: *: two drivers could claim one
    writer epoch, and a superseded driver replace a commit record. The sink took such a
    store as it takes AWS S3; it refuses it now, in one line, before it stages anything."""
    output_url = f"{s3_root.url}/out"
    condition_ignoring_store(s3_root)
    S3FileSystem.clear_instance_cache()
    sink = TransactionalFileSink(output_url)

    with pytest.raises(StartRefused) as refused:
        if with_restore:
            sink.on_restore(None, JOB)
        else:
            stage(sink, 0, ROWS)

    message = str(refused.value)
    assert "\n" not in message
    # Refused again, not taken as claimed by the first try (a reviewer's).
    with pytest.raises(StartRefused):
        stage(sink, 0, ROWS)
    assert f"the output {output_url}: its store replaced _epochs/epoch-1.json" in message
    assert "If-None-Match: *" in message
    assert s3_root.files(f"{output_url}/_staging") == []
    assert read_committed(output_url) == {}
