"""`CheckpointStorage.claim`: a job's storage belongs to one registry of its snapshots (on
the local filesystem, S3 and Azure alike)."""

from __future__ import annotations

import errno
import json
import logging
import re
from typing import TYPE_CHECKING

import pytest

from helpers.faulty_proxy import http_answer
from helpers.objectstore import StorageRoot
from spark_checkpoint.protocol import ProtocolError, StorageOwner
from spark_checkpoint.storage import (
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
    StorageOwnedElsewhere,
)
from spark_checkpoint.storage.errors import StorageAccessError, storage_failure

if TYPE_CHECKING:
    from conftest import StartProxy

FIRST = StorageOwner(id="uid-1", description="SparkCheckpointJob default/orders (uid uid-1)")
SECOND = StorageOwner(id="uid-2", description="SparkCheckpointJob default/orders (uid uid-2)")


def test_the_first_claim_records_its_registry_and_later_claims_of_it_pass(
    storage: CheckpointStorage, storage_root: StorageRoot
) -> None:
    storage.claim(FIRST)
    storage.claim(FIRST)
    recorded = storage_root.read(storage.layout.owner_path)
    assert StorageOwner.decode(recorded.decode()) == FIRST


def _checkpoint_of_the_owner(storage: CheckpointStorage, storage_root: StorageRoot) -> None:
    storage_root.write(f"{storage.layout.checkpoint_dir(3)}/_metadata", b"its checkpoint")


def test_another_registry_is_refused_naming_both_and_the_record_stays(
    storage: CheckpointStorage, storage_root: StorageRoot
) -> None:
    storage.claim(FIRST)
    _checkpoint_of_the_owner(storage, storage_root)
    with pytest.raises(StorageOwnedElsewhere) as refused:
        storage.claim(SECOND)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"{storage.layout.owner_path}: this job's storage belongs to {FIRST.description}, not "
        f"to {SECOND.description}"
    )
    assert refused.value.owner == FIRST and refused.value.claimant == SECOND
    assert StorageOwner.decode(storage_root.read(storage.layout.owner_path).decode()) == FIRST


def test_handing_the_storage_over_is_deleting_the_record(
    storage: CheckpointStorage, storage_root: StorageRoot
) -> None:
    storage.claim(FIRST)
    _checkpoint_of_the_owner(storage, storage_root)
    storage.fs.delete_file(storage.layout.owner_path)
    storage.claim(SECOND)
    with pytest.raises(StorageOwnedElsewhere):
        storage.claim(FIRST)


def test_storage_another_registry_left_without_checkpoints_is_taken_over(
    storage: CheckpointStorage, storage_root: StorageRoot, caplog: pytest.LogCaptureFixture
) -> None:
    """A job deleted under a retention policy that discarded its checkpoints, created
    again: nothing there its garbage collection could delete but garbage; the savepoints
    stay (and are never written over: the agent's require_no_snapshot), as the warning
    says (it read as if nothing had been there: a newcomer's)."""
    storage.claim(FIRST)
    savepoint = f"{storage.layout.savepoint_dir(5)}/_metadata"
    storage_root.write(savepoint, b"kept")
    with caplog.at_level(logging.WARNING):
        storage.claim(SECOND)
    [line] = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert line.endswith(
        "which left no checkpoints there; its 1 savepoint(s) stay, never written over nor deleted"
    ), line
    assert StorageOwner.decode(storage_root.read(storage.layout.owner_path).decode()) == SECOND
    assert storage_root.read(savepoint) == b"kept"
    _checkpoint_of_the_owner(storage, storage_root)
    with pytest.raises(StorageOwnedElsewhere):
        storage.claim(FIRST)


@pytest.mark.parametrize(
    "record",
    [
        b"",
        b"uid-1",
        b'{"id": 1, "description": ""}',
        b"[]",
        b'{"id": ""}',
        b"\xff",
        b"[" * 100_000,  # crafted: past the parser's depth
        b'{"id": ' + b"9" * 5000 + b"}",  # a number the parser refuses
    ],
)
def test_a_record_that_names_no_registry_is_an_error_naming_it(
    storage: CheckpointStorage, storage_root: StorageRoot, record: bytes
) -> None:
    storage_root.write(storage.layout.owner_path, record)
    with pytest.raises(StorageError) as broken:
        storage.claim(FIRST)
    assert not isinstance(broken.value, StorageOwnedElsewhere)
    assert broken.value.path == storage.layout.owner_path
    assert "not an owner record" in str(broken.value)
    assert storage_root.read(storage.layout.owner_path) == record


@pytest.mark.parametrize("owner_id", ["", "x" * 201])
def test_an_owner_id_is_one_to_200_characters(owner_id: str) -> None:
    with pytest.raises(ProtocolError):
        StorageOwner(id=owner_id, description="")


def test_a_takeover_logs_the_old_registry_as_one_printable_line(
    storage: CheckpointStorage, storage_root: StorageRoot, caplog: pytest.LogCaptureFixture
) -> None:
    """owner.json is read from storage: whatever its description holds, the log line
    quoting it stays one line without terminal escapes."""
    hostile = StorageOwner(id="uid-0", description="job\n\x1b[31mERROR forged line")
    storage_root.write(storage.layout.owner_path, hostile.encode().encode())
    with caplog.at_level(logging.WARNING):
        storage.claim(SECOND)
    [line] = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert "\n" not in line and "\x1b" not in line
    assert "job\\n\\x1b[31mERROR forged line" in line


def test_an_owner_record_too_large_to_be_one_is_refused_from_its_first_bytes(
    storage: CheckpointStorage, storage_root: StorageRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 6 GB owner.json was read whole by every claim and `list` (12 GB of memory, then a
    MemoryError traceback: a hostile reviewer's)."""
    storage_root.write(storage.layout.owner_path, b" " * 100_000 + FIRST.encode().encode())
    read = storage.fs.read_bytes
    asked: list[int | None] = []

    def bounded(path: str, at_most: int | None = None) -> bytes:
        asked.append(at_most)
        return read(path, at_most)

    monkeypatch.setattr(storage.fs, "read_bytes", bounded)

    with pytest.raises(StorageError) as refused:
        storage.claim(SECOND)

    assert "not an owner record (larger than 65536 bytes)" in str(refused.value)
    assert asked and None not in asked, asked


def test_a_claim_s3_refuses_is_told_with_the_object_and_the_stores_reason(
    s3_root: StorageRoot, faulty_proxy: StartProxy
) -> None:
    """Not the bare 403 of the HEAD request that asks the refused object's size after: a
    run with a wrong secret key said "cannot claim the job's storage: s3://.../orders:
    Forbidden" (an S3 user's)."""
    denied = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
    answer = http_answer("403 Forbidden", denied)
    storage, error = _refused_claim(s3_root, faulty_proxy, rb"^GET \S*/owner\.json ", answer)

    assert isinstance(error, PermissionError)
    told = storage_failure(error, storage.layout.job_root)
    assert told == f"{storage.layout.owner_path}: Access Denied"


def test_a_request_s3_refuses_without_a_reason_names_the_object_and_what_it_may_mean(
    s3_root: StorageRoot, faulty_proxy: StartProxy
) -> None:
    """S3 answers a HEAD request it refuses with a bare 403 ("Forbidden")."""
    refused = faulty_proxy(s3_root, re.compile(rb"^HEAD "), http_answer("403 Forbidden", b""))
    storage = CheckpointStorage(JobStorageLayout(s3_root.url, "default", "orders"))

    with pytest.raises(PermissionError) as error:
        storage.fs.file_size(storage.layout.owner_path)

    assert refused.matched == 1
    assert storage_failure(error.value, storage.layout.job_root) == (
        f"{storage.layout.owner_path}: Forbidden (an HTTP 403 without a reason, as S3 answers "
        "a HEAD request: the credentials are wrong, the clock is off, or a policy refuses "
        "s3:GetObject on this path, or s3:ListBucket on its bucket, without which a missing "
        "object is answered 403)"
    )


def test_a_write_s3_refuses_names_the_object(
    s3_root: StorageRoot, faulty_proxy: StartProxy
) -> None:
    """The error s3fs translates a refusal to names no object: a task's decline of a
    revoked write said only "PermissionError: Access Denied" (an S3 user's)."""
    denied = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
    refused = faulty_proxy(s3_root, re.compile(rb"^PUT "), http_answer("403 Forbidden", denied))
    storage = CheckpointStorage(JobStorageLayout(s3_root.url, "default", "orders"))
    path = f"{storage.layout.job_root}/shared/x"

    with pytest.raises(PermissionError) as error:
        storage.fs.write_atomic(path, b"x")

    assert refused.matched == 1
    assert str(error.value) == f"[Errno 13] Access Denied: '{path}'"


def test_a_claim_gcs_refuses_is_told_in_one_line_with_the_object_and_the_stores_reason(
    gcs_root: StorageRoot, faulty_proxy: StartProxy
) -> None:
    """gcsfs says a 403 in two lines, the request's URL on the first: "Forbidden:
    http://.../o/...owner.json?alt=media" then GCS's message."""
    denied = json.dumps(
        {"error": {"code": 403, "message": "caller does not have storage.objects.get access"}}
    ).encode()
    answer = http_answer("403 Forbidden", denied)
    storage, error = _refused_claim(gcs_root, faulty_proxy, _GCS_OWNER_DOWNLOAD, answer)

    assert isinstance(error, OSError)
    assert error.errno == errno.EACCES
    told = storage_failure(error, storage.layout.job_root)
    assert told == (
        f"{storage.layout.owner_path}: Forbidden: caller does not have storage.objects.get access"
    )


def test_a_claim_gcs_refuses_an_anonymous_caller_is_told_with_the_object_and_the_stores_reason(
    gcs_root: StorageRoot, faulty_proxy: StartProxy
) -> None:
    """A machine or a pod off GCP without credentials reaches GCS anonymously (google-auth
    finds none, gcsfs goes on without): the 401 is gcsfs's HttpError, not an OSError."""
    said = "Anonymous caller does not have storage.objects.get access to the object."
    answer = http_answer(
        "401 Unauthorized", json.dumps({"error": {"code": 401, "message": said}}).encode()
    )
    storage, error = _refused_claim(gcs_root, faulty_proxy, _GCS_OWNER_DOWNLOAD, answer)

    assert isinstance(error, StorageAccessError)
    told = storage_failure(error, storage.layout.job_root)
    assert told == f"{storage.layout.owner_path}: HttpError: {said} (HTTP 401)"


# The claim's read of owner.json on GCS (its JSON API's download).
_GCS_OWNER_DOWNLOAD = rb"^GET \S*owner\.json\?alt=media"


def _refused_claim(
    root: StorageRoot, faulty_proxy: StartProxy, request_line: bytes, answer: bytes
) -> tuple[CheckpointStorage, Exception]:
    """A claim of the job's storage on `root` whose request matching `request_line` the
    store answers with `answer`: the storage and what the claim raised."""
    refused = faulty_proxy(root, re.compile(request_line), answer)
    storage = CheckpointStorage(JobStorageLayout(root.url, "default", "orders"))

    with pytest.raises(Exception) as error:  # each test names its class
        storage.claim(FIRST)

    assert refused.matched == 1
    return storage, error.value
