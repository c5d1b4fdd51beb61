"""`spark-checkpoint verify`: every stored file against its manifest; exit 1 on damage."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spark_checkpoint.restorable_report import ImageVerdict, encoded
from spark_checkpoint.storage import CheckpointKind
from spark_checkpoint.storage.metadata import MAX_DOCUMENT_BYTES
from spark_checkpoint_operator.storage_commands import snapshots

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]
CHECKPOINT = CheckpointKind.CHECKPOINT
SAVEPOINT = CheckpointKind.SAVEPOINT


def verdicts(output: str) -> dict[str, str]:
    """The first line printed for each snapshot: `KIND:ID  OK|FAILED  detail`."""
    found = {}
    for line in output.splitlines():
        name, _, rest = line.partition("  ")
        if ":" in name and name[:1].isalpha():
            found[name.strip()] = rest.strip()
    return found


def test_all_snapshots_verify(job: Job, cli: Cli) -> None:
    result = cli("verify", *job.flags)

    assert result.code == 0, result.out + result.err
    assert verdicts(result.out) == {
        "checkpoint:1": "OK      3 files, 80 B",
        "checkpoint:2": "OK      4 files, 127 B",
        "savepoint:3": "OK      4 files, 127 B",
    }
    assert result.out.endswith("3 verified: 3 OK, 0 failed\n")


def test_a_flipped_byte_in_a_shared_file_is_detected(job: Job, cli: Cli) -> None:
    # state/0/0/1.delta is stored once in shared/ and referenced by checkpoints 1 and 2.
    damaged = job.stored_file(CHECKPOINT, 1, "state/0/0/1.delta")
    assert damaged == job.stored_file(CHECKPOINT, 2, "state/0/0/1.delta")
    content = bytearray(damaged.read_bytes())
    content[5] ^= 0x01
    damaged.write_bytes(bytes(content))

    result = cli("verify", *job.flags)

    assert result.code == 1
    found = verdicts(result.out)
    expected_sha = damaged.name.split("-", 1)[0]
    actual_sha = hashlib.sha256(content).hexdigest()
    for snapshot in ("checkpoint:1", "checkpoint:2"):
        assert found[snapshot] == (
            f"FAILED  checksum mismatch: state/0/0/1.delta at {damaged}: "
            f"expected sha256 {expected_sha}, found {actual_sha}"
        )
    assert found["savepoint:3"].startswith("OK")
    assert result.out.endswith("3 verified: 1 OK, 2 failed\n")


def test_a_truncated_file_is_a_size_mismatch(job: Job, cli: Cli) -> None:
    damaged = job.stored_file(SAVEPOINT, 3, "offsets/1")
    damaged.write_bytes(damaged.read_bytes()[:-4])

    result = cli("verify", "savepoint:3", *job.flags)

    assert result.code == 1
    assert verdicts(result.out)["savepoint:3"] == (
        f"FAILED  size mismatch: offsets/1 at {damaged}: expected 23 bytes, found 19 bytes"
    )


def test_a_deleted_file_is_detected_and_every_bad_file_is_named(job: Job, cli: Cli) -> None:
    first = job.stored_file(CHECKPOINT, 2, "offsets/1")
    second = job.stored_file(CHECKPOINT, 2, "state/0/0/2.delta")
    first.unlink()
    second.unlink()

    result = cli("verify", "checkpoint:2", "checkpoint:1", *job.flags)

    assert result.code == 1
    lines = result.out.splitlines()
    assert lines[0] == f"checkpoint:2  FAILED  missing file: offsets/1 at {first}"
    assert lines[1] == f"                      missing file: state/0/0/2.delta at {second}"
    assert lines[2].split()[:2] == ["checkpoint:1", "OK"]  # in the order asked for
    assert lines[3] == "2 verified: 1 OK, 1 failed"


def test_a_truncated_metadata_is_detected(job: Job, cli: Cli) -> None:
    metadata = job.metadata_file(CHECKPOINT, 2)
    metadata.write_bytes(metadata.read_bytes()[:100])

    result = cli("verify", *job.flags)

    assert result.code == 1
    found = verdicts(result.out)
    assert found["checkpoint:2"].startswith(
        f"FAILED  unreadable metadata: {metadata}: the gzip stream is cut short"
    )
    assert found["checkpoint:1"].startswith("OK")


def test_an_empty_metadata_is_detected(job: Job, cli: Cli) -> None:
    metadata = job.metadata_file(SAVEPOINT, 3)
    metadata.write_bytes(b"")

    result = cli("verify", "savepoint:3", *job.flags)

    assert result.code == 1
    assert verdicts(result.out)["savepoint:3"] == (
        f"FAILED  unreadable metadata: {metadata}: the file is empty"
    )


def test_a_metadata_that_is_not_json_is_unreadable_not_truncated(job: Job, cli: Cli) -> None:
    """Called truncated, a `_metadata` a foreign writer replaced by other text sent a
    user looking for a cut-short copy (a hostile newcomer on S3)."""
    metadata = job.metadata_file(SAVEPOINT, 3)
    metadata.write_bytes(b"[" * 4000)

    result = cli("verify", "savepoint:3", *job.flags)

    assert result.code == 1
    assert verdicts(result.out)["savepoint:3"] == (
        f"FAILED  unreadable metadata: {metadata}: not parseable as JSON (nested too deeply)"
    )


def test_only_the_named_snapshots_are_verified(job: Job, cli: Cli) -> None:
    job.metadata_file(CHECKPOINT, 2).write_bytes(b"{")

    result = cli("verify", "checkpoint:1", "savepoint:3", *job.flags)

    assert result.code == 0, result.out
    assert set(verdicts(result.out)) == {"checkpoint:1", "savepoint:3"}


def test_a_registered_snapshot_missing_from_storage_fails(job: Job, cli: Cli) -> None:
    job.write_registry(checkpoints=[1, 2], savepoints=[3])
    shutil.rmtree(job.storage.layout.checkpoint_dir(1))

    result = cli("verify", *job.flags)

    assert result.code == 1
    absent = job.storage.layout.checkpoint_dir(1)
    assert verdicts(result.out)["checkpoint:1"] == (
        f"FAILED  not in storage: no {absent} (never written, or discarded; checkpoints in "
        "storage: 2)"
    )
    # A snapshot directory without its `_metadata` is what is missing.
    job.storage.fs.delete_file(job.storage.layout.metadata_path(SAVEPOINT, 3))
    missing = job.storage.layout.metadata_path(SAVEPOINT, 3)
    result = cli("verify", *job.flags)
    assert verdicts(result.out)["savepoint:3"] == f"FAILED  missing file: {missing}: no such file"


def test_a_named_snapshot_that_does_not_exist_fails(job: Job, cli: Cli) -> None:
    result = cli("verify", "savepoint:8", *job.flags)

    assert result.code == 1
    assert verdicts(result.out)["savepoint:8"].startswith("FAILED  not in storage: no ")


def test_json_output(job: Job, cli: Cli) -> None:
    damaged = job.stored_file(CHECKPOINT, 1, "commits/0")
    damaged.unlink()

    result = cli("verify", *job.flags, "--json")

    assert result.code == 1
    document = json.loads(result.out)
    assert document["ok"] is False
    by_id = {(s["kind"], s["id"]): s for s in document["snapshots"]}
    assert by_id[("checkpoint", 1)]["ok"] is False
    assert by_id[("checkpoint", 1)]["problems"] == [f"missing file: commits/0 at {damaged}"]
    assert by_id[("checkpoint", 2)] == {
        "kind": "checkpoint", "id": 2, "ok": True, "files": 4, "sizeBytes": 127, "problems": [],
        "restorable": None,  # not tried without --deep
        "unrestorable": None,  # no restore failed on it
    }  # fmt: skip


def test_empty_storage_has_nothing_to_verify_which_is_not_a_pass(job: Job, cli: Cli) -> None:
    shutil.rmtree(job.job_root)
    Path(job.job_root).mkdir()

    result = cli("verify", *job.flags)

    assert result.code == 1
    assert result.out == ""
    assert result.err == (
        "spark-checkpoint verify: nothing to verify: no checkpoints or savepoints in "
        f"{job.storage.layout.job_root}\n"
    )
    as_json = cli("verify", "--json", *job.flags)
    assert as_json.code == 1
    assert json.loads(as_json.out)["ok"] is False


def _restore_check_printing(
    report: str, *, exit_code: int = 0, stderr: str = ""
) -> Callable[..., list[str]]:
    """A stand-in for the data plane's restorable check (real Spark runs it in
    tests/e2e/test_restore_fallback.py): what verify --deep makes of its report."""
    script = f"import sys; print({report!r}); sys.stderr.write({stderr!r}); sys.exit({exit_code})"
    return lambda _layout, _images: [sys.executable, "-c", script]


def test_deep_says_which_snapshots_spark_restored(
    job: Job, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = encoded(
        [
            ImageVerdict(CHECKPOINT, 1, ()),
            ImageVerdict(CHECKPOINT, 2, ("state of operator 0 cannot be loaded",)),
            ImageVerdict(SAVEPOINT, 3, ()),
        ]
    )
    monkeypatch.setattr(snapshots, "restorable_command", _restore_check_printing(report))

    text = cli("verify", "--deep", *job.flags)
    as_json = cli("verify", "--deep", "-o", "json", *job.flags)

    assert text.code == as_json.code == 1
    assert text.out.splitlines() == [
        "checkpoint:1  OK      3 files, 80 B, restorable",
        "checkpoint:2  FAILED  not restorable: state of operator 0 cannot be loaded",
        "savepoint:3   OK      4 files, 127 B, restorable",
        "3 verified (--deep: each intact one restored by Spark): 2 OK, 1 failed",
    ]
    restorable = [s["restorable"] for s in json.loads(as_json.out)["snapshots"]]
    assert restorable == [True, False, True]
    shallow = cli("verify", "-o", "json", *job.flags)
    assert [s["restorable"] for s in json.loads(shallow.out)["snapshots"]] == [None] * 3
    assert "restored by Spark" not in cli("verify", *job.flags).out


def test_deep_without_a_restore_check_fails_and_claims_nothing_restorable(
    job: Job, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_spark = _restore_check_printing(
        "", exit_code=1, stderr="ModuleNotFoundError: No module named 'pyspark'\n"
    )
    monkeypatch.setattr(snapshots, "restorable_command", no_spark)

    result = cli("verify", "--deep", "-o", "json", *job.flags)

    assert result.code == 1
    for snapshot in json.loads(result.out)["snapshots"]:
        assert snapshot["restorable"] is None
        assert snapshot["problems"] == [
            "the restore check could not run: ModuleNotFoundError: No module named 'pyspark'"
        ]


@pytest.mark.parametrize("finished", [False, True])
def test_an_intact_image_the_job_no_longer_restores_from_says_so(
    job: Job, cli: Cli, finished: bool
) -> None:
    """Its files are intact (exit 0), but a restored query failed on it: `verify` says what
    `list` says, with or without naming the image (of a Finished job, no `run --from`)."""
    job.write_registry(
        checkpoints=[1, 2], savepoints=[3], unrestorable=["checkpoint:2"], finished=finished
    )
    hint = "" if finished else " (run --from names it to try)"
    note = f"not restored from again{hint}: its restored query failed in attempt 2"

    for named in ([], ["checkpoint:2"]):
        result = cli("verify", *job.flags, *named)
        assert result.code == 0, result.err
        lines = result.out.splitlines()
        [at] = [i for i, line in enumerate(lines) if line.startswith("checkpoint:2 ")]
        assert " OK " in lines[at]
        assert lines[at + 1].strip() == note, lines

    document = json.loads(cli("verify", *job.flags, "-o", "json").out)
    by_id = {(s["kind"], s["id"]): s for s in document["snapshots"]}
    assert by_id[("checkpoint", 2)]["unrestorable"] == "its restored query failed in attempt 2"
    assert by_id[("checkpoint", 1)]["unrestorable"] is None
    assert document["ok"] is True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["verify", "inspect", "list"])
@pytest.mark.parametrize("what", ["_metadata", "a stored file"])
def test_a_fifo_in_storage_is_refused_not_read_for_ever(
    job: Job, cli: Cli, command: str, what: str
) -> None:
    """A FIFO is no link, so the link checks let it through, and reading it waited for a
    writer for ever: `list`, `inspect` and `verify` hung (a reviewer's hostile storage),
    as would a cleanup pod's garbage collection."""
    fifo = (
        job.metadata_file(CHECKPOINT, 2)
        if what == "_metadata"
        else job.stored_file(CHECKPOINT, 2, "offsets/1")
    )
    fifo.unlink()
    os.mkfifo(fifo)
    # A socket cannot even be opened (ENXIO): refused the same way.
    other = job.metadata_file(SAVEPOINT, 3)
    listener = socket.socket(socket.AF_UNIX)
    if what == "_metadata":
        other.unlink()
        here = os.getcwd()
        os.chdir(other.parent)  # its path is too long for a socket's address
        try:
            listener.bind(other.name)
        finally:
            os.chdir(here)

    try:
        result = cli(command, *job.flags)
    finally:
        listener.close()

    shown = result.out + result.err
    if what == "a stored file":  # only verify reads it
        assert result.code == (1 if command == "verify" else 0), shown
        if command == "verify":  # it said "missing file" (a reviewer's)
            assert verdicts(result.out)["checkpoint:2"] == (
                f"FAILED  offsets/1 at {fifo}: is a FIFO, not a regular file: remove it"
            )
        return
    assert f"{fifo}: is a FIFO, not a regular file: remove it" in shown, shown
    assert f"{other}: is a socket, not a regular file: remove it" in shown, shown
    assert result.code == (0 if command == "list" else 1), shown


@pytest.mark.parametrize("command", ["verify", "inspect", "list"])
def test_a_directory_or_a_huge_file_as_metadata_fails_that_snapshot_alone(
    job: Job, cli: Cli, command: str
) -> None:
    """A `_metadata` that is a directory failed `list` as a whole (an OSError, not a
    storage error); one of gigabytes was read whole (a sparse file: 4 GB took 5 GB of
    memory to refuse). Each fails its own snapshot, read no further than the bound."""
    directory = job.metadata_file(CHECKPOINT, 2)
    directory.unlink()
    directory.mkdir()
    huge = job.metadata_file(SAVEPOINT, 3)
    with huge.open("r+b") as stored:
        stored.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: no disk used

    result = cli(command, *job.flags)

    shown = result.out + result.err
    assert f"{directory}: is a directory, not a regular file: remove it" in shown, shown
    assert f"{huge}: $: is larger than {MAX_DOCUMENT_BYTES} bytes" in shown, shown
    assert result.code == (0 if command == "list" else 1), shown


@pytest.mark.parametrize("command", ["verify", "inspect", "list"])
def test_a_linked_snapshot_directory_or_metadata_fails_that_snapshot_alone(
    job: Job, cli: Cli, command: str, tmp_path: Path
) -> None:
    """A `chk-N` or a `_metadata` that is a link failed every command as a whole: one
    line about the link and no other snapshot shown. Each fails its own snapshot; the
    link is still never followed."""
    directory = job.metadata_file(CHECKPOINT, 2).parent
    directory.rename(tmp_path / "elsewhere")
    directory.symlink_to(tmp_path / "elsewhere")
    metadata = job.metadata_file(SAVEPOINT, 3)
    metadata.rename(tmp_path / "foreign-metadata")
    metadata.symlink_to(tmp_path / "foreign-metadata")

    result = cli(command, *job.flags)

    shown = result.out + result.err
    for link, target in ((directory, "elsewhere"), (metadata, "foreign-metadata")):
        assert f"{link}: is a symbolic link (to '{tmp_path / target}')" in shown, shown
    if command == "verify":
        assert verdicts(result.out)["checkpoint:1"].startswith("OK"), shown
    else:  # the other snapshots' rows are shown
        assert re.search(r"^checkpoint +1 +0 ", result.out, re.MULTILINE), shown
    assert result.code == (0 if command == "list" else 1), shown


def test_a_linked_shared_directory_is_told_once_per_checkpoint(
    job: Job, cli: Cli, tmp_path: Path
) -> None:
    """A `shared/` that is a link printed one line per file of every checkpoint (138 for a
    newcomer's); each checkpoint now names the link once, with how many of its files it
    hides. Savepoints hold their own files and stay OK."""
    shared = job.job_root / "shared"
    shared.rename(tmp_path / "elsewhere")
    shared.symlink_to(tmp_path / "elsewhere")

    result = cli("verify", *job.flags)

    said = (
        f"lie below {shared}, which is a symbolic link (to '{tmp_path / 'elsewhere'}'); "
        "links are never followed out of the job's storage directory: remove the link"
    )
    assert verdicts(result.out) == {
        "checkpoint:1": f"FAILED  3 of its files {said}",
        "checkpoint:2": f"FAILED  4 of its files {said}",
        "savepoint:3": "OK      4 files, 127 B",
    }, result.out
    assert len(result.out.splitlines()) == 4, result.out
    assert result.code == 1
