"""`spark-checkpoint inspect [KIND:ID ...]`: a line per snapshot with the essentials of its
`_metadata`, more columns with `-o wide`, every `_metadata` in full with `-o json|yaml`;
driven through the installed console script on storage the storage package wrote."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import string
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
)

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]
Writer = Callable[..., CheckpointMetadata]


def table(output: str) -> list[list[str]]:
    """The table's rows after its header, cells split on runs of two or more spaces."""
    lines = output.splitlines()
    assert lines[0].startswith("KIND "), output
    return [re.split(r"\s{2,}", line.strip()) for line in lines[1:]]


def rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_line_per_snapshot_with_the_essentials(job: Job, console: Cli) -> None:
    result = console("inspect", *job.flags)

    assert result.code == 0, result.err
    assert result.out.splitlines()[0].split() == [
        "KIND", "ID", "BATCH", "COMPLETED", "AGE", "DURATION", "SIZE", "FILES", "SHARED"
    ]  # fmt: skip
    completed = {
        (kind, i): rfc3339(job.storage.read_metadata(kind, i).completion_time)
        for kind, i in ((CheckpointKind.CHECKPOINT, 1), (CheckpointKind.CHECKPOINT, 2))
    } | {(CheckpointKind.SAVEPOINT, 3): rfc3339(
        job.storage.read_metadata(CheckpointKind.SAVEPOINT, 3).completion_time
    )}  # fmt: skip
    assert table(result.out) == [
        ["checkpoint", "1", "0", completed[(CheckpointKind.CHECKPOINT, 1)], "2d2h", "2.25s",
         "80 B", "3", "3"],
        ["checkpoint", "2", "1", completed[(CheckpointKind.CHECKPOINT, 2)], "2d2h", "2.25s",
         "127 B", "4", "4"],
        # A savepoint is self-contained: no shared files.
        ["savepoint", "3", "1", completed[(CheckpointKind.SAVEPOINT, 3)], "2d2h", "2.25s",
         "127 B", "4", "0"],
    ]  # fmt: skip


def test_wide_adds_reuse_trigger_tasks_query_registry_and_path(job: Job, console: Cli) -> None:
    job.write_registry(checkpoints=[2], savepoints=[3])
    meta = job.storage.read_metadata(CheckpointKind.CHECKPOINT, 2)

    result = console("inspect", "checkpoint:2", "savepoint:3", *job.flags, "-o", "wide")

    assert result.code == 0, result.err
    checkpoint, savepoint = table(result.out)
    # state/0/0/1.delta is stored once and referenced by checkpoints 1 and 2.
    assert checkpoint[9:] == [
        "1", rfc3339(meta.trigger_time), "2", meta.query_id, "registered",
        str(job.metadata_file(CheckpointKind.CHECKPOINT, 2)),
    ]  # fmt: skip
    assert savepoint[9] == "-"  # reuse is a checkpoint's
    assert savepoint[-1] == str(job.metadata_file(CheckpointKind.SAVEPOINT, 3))


def test_a_query_id_that_would_drive_the_terminal_is_printed_escaped(job: Job, cli: Cli) -> None:
    """A `_metadata`'s query id went to the terminal as it was: one could set its title,
    clear the screen and forge a row (a reviewer's hostile storage)."""
    metadata = job.metadata_file(CheckpointKind.CHECKPOINT, 2)
    document = json.loads(gzip.decompress(metadata.read_bytes()))
    document["query_id"] = "q\x1b]0;PWNED\x07\x1b[2J\nfake row"
    metadata.write_bytes(gzip.compress(json.dumps(document).encode()))

    result = cli("inspect", "checkpoint:2", *job.flags, "-o", "wide")

    assert result.code == 0, result.err
    assert "\x1b" not in result.out and "\x07" not in result.out
    (row,) = result.out.splitlines()[1:]
    assert "q\\x1b]0;PWNED\\x07\\x1b[2J\\nfake row" in row


def test_json_and_yaml_hold_each_metadata_as_stored(job: Job, console: Cli) -> None:
    job.write_registry(checkpoints=[2], savepoints=[3])

    as_json = console("inspect", *job.flags, "-o", "json")
    as_yaml = console("inspect", *job.flags, "-o", "yaml")

    assert as_json.code == 0, as_json.err
    assert as_yaml.code == 0, as_yaml.err
    document = json.loads(as_json.out)
    assert yaml.safe_load(as_yaml.out) == document  # one document, two notations
    assert document["namespace"] == "analytics"
    assert document["job"] == "clicks"
    assert document["statusFile"] == str(job.status_file.resolve())
    assert document["problems"] == []
    snapshots = document["snapshots"]
    assert [(s["kind"], s["id"]) for s in snapshots] == [
        ("checkpoint", 1), ("checkpoint", 2), ("savepoint", 3)
    ]  # fmt: skip
    for snapshot in snapshots:
        kind = CheckpointKind(snapshot["kind"])
        stored = job.metadata_file(kind, snapshot["id"])
        assert snapshot["metadata"] == json.loads(gzip.decompress(stored.read_bytes()))
        assert snapshot["metadataPath"] == str(stored)
    assert [s["registered"] for s in snapshots] == [False, True, True]
    assert [s["sharedFiles"] for s in snapshots] == [3, 4, 0]
    assert [s["sharedWithOthers"] for s in snapshots] == [1, 1, None]


def test_an_unreadable_snapshot_exits_1_naming_it_and_the_others_are_shown(
    job: Job, console: Cli
) -> None:
    result = console("inspect", "checkpoint:9", "checkpoint:2", *job.flags)

    assert result.code == 1
    absent = job.storage.layout.checkpoint_dir(9)
    assert result.err.strip() == (
        f"spark-checkpoint inspect: checkpoint:9: not in storage: no {absent} (never written, "
        "or discarded; checkpoints in storage: 1, 2)"
    )
    assert [row[:2] for row in table(result.out)] == [["checkpoint", "2"]]


def test_an_invalid_metadata_exits_1_naming_the_field(job: Job, cli: Cli) -> None:
    path = job.metadata_file(CheckpointKind.CHECKPOINT, 1)
    document = json.loads(gzip.decompress(path.read_bytes()))
    document["files"][0]["sha256"] = "not-a-digest"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))

    result = cli("inspect", *job.flags, "-o", "json")

    assert result.code == 1
    assert f"invalid metadata: {path}: files[0].sha256: " in result.err
    problems = json.loads(result.out)["problems"]
    assert len(problems) == 1
    assert problems[0].startswith(f"checkpoint:1: invalid metadata: {path}: files[0].sha256")


def test_empty_storage_has_nothing_to_inspect_which_exits_1(cli: Cli, tmp_path: Path) -> None:
    flags = ["--storage", str(tmp_path), "--namespace", "analytics", "--job", "clicks"]
    (tmp_path / "analytics" / "clicks" / "checkpoints").mkdir(parents=True)
    result = cli("inspect", *flags, "--state-dir", str(tmp_path / "state"))

    assert result.code == 1
    assert result.out == ""
    assert "no checkpoints or savepoints with a _metadata in" in result.err


def test_a_malformed_snapshot_reference_exits_2(job: Job, cli: Cli) -> None:
    for reference in ("7", "chk-7", "checkpoint:", "checkpoint:07", "checkpoint:-1", "stage:1"):
        result = cli("inspect", reference, *job.flags)
        assert result.code == 2, reference
        assert result.err.startswith(f"spark-checkpoint inspect: {reference!r}: "), result.err


def test_an_external_savepoint_is_not_a_snapshot_of_the_job(job: Job, cli: Cli) -> None:
    reference = "external:file:///elsewhere/savepoints/sp-1/_metadata"
    result = cli("inspect", reference, *job.flags)
    assert result.code == 2
    assert result.err.startswith(f"spark-checkpoint inspect: {reference!r}: "), result.err


NAMES = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=12).filter(
    lambda name: name[0].isalpha()
)


@st.composite
def snapshot_sets(draw: st.DrawFn) -> dict[int, tuple[CheckpointKind, int]]:
    """Ids from one counter, as the coordinator takes them, each a checkpoint or a
    savepoint of some batch; sparse (retention removed some) and across digit counts."""
    ids = draw(st.sets(st.integers(min_value=1, max_value=1200), min_size=1, max_size=8))
    batches = st.integers(min_value=0, max_value=10**6)
    return {i: (draw(st.sampled_from(CheckpointKind)), draw(batches)) for i in ids}


# In-process (the tests above run the console script): a process start would cost a
# second or more an example on a loaded machine, and the order is the code's, not the
# process's.
@settings(
    max_examples=25,
    deadline=None,
    # `cli` reads what each example printed; `snapshot_writer` is stateless.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(snapshots=snapshot_sets(), names=st.tuples(NAMES, NAMES))
def test_natural_order_and_a_line_per_snapshot_for_any_set(
    snapshots: dict[int, tuple[CheckpointKind, int]],
    names: tuple[str, str],
    cli: Cli,
    snapshot_writer: Writer,
) -> None:
    namespace, job_name = names
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        storage = CheckpointStorage(JobStorageLayout(str(root / "storage"), namespace, job_name))
        written = {
            (kind, snapshot_id): snapshot_writer(
                storage,
                root / "spark",
                kind=kind,
                snapshot_id=snapshot_id,
                batch_id=batch,
                files={f"offsets/{batch}": f"batch {batch} of {snapshot_id}".encode()},
            )
            for snapshot_id, (kind, batch) in snapshots.items()
        }
        flags = ["--storage", str(root / "storage"), "--namespace", namespace]
        flags += ["--job", job_name, "--state-dir", str(root / "state")]

        compact = cli("inspect", *flags)
        document = cli("inspect", *flags, "-o", "json")

    expected = sorted(written, key=lambda ref: ref[1])  # by id, numerically
    assert compact.code == 0, compact.err
    assert document.code == 0, document.err
    rows = table(compact.out)
    assert len(rows) == len(snapshots)  # a line each
    assert [(CheckpointKind(row[0]), int(row[1])) for row in rows] == expected
    assert [int(row[2]) for row in rows] == [written[ref].batch_id for ref in expected]
    assert [row[3] for row in rows] == [rfc3339(written[ref].completion_time) for ref in expected]
    assert [int(row[7]) for row in rows] == [len(written[ref].files) for ref in expected]
    stored = json.loads(document.out)["snapshots"]
    assert [(CheckpointKind(s["kind"]), s["id"]) for s in stored] == expected
    assert [s["metadata"] for s in stored] == [
        json.loads(written[ref].to_json()) for ref in expected
    ]


def test_a_snapshot_not_in_storage_names_the_ids_nearest_it(job: Job, cli: Cli) -> None:
    # Retention never discards savepoints: a mistyped id must not list hundreds.
    for savepoint_id in range(4, 31):
        shutil.copytree(
            job.storage.layout.savepoint_dir(3), job.storage.layout.savepoint_dir(savepoint_id)
        )

    result = cli("inspect", "savepoint:100", *job.flags)

    assert result.code == 1
    assert result.err.rstrip().endswith(
        "(never written, or discarded; savepoints in storage: 21, 22, 23, 24, 25, 26, 27, 28, "
        "29, 30 (of 28))"
    ), result.err


def test_the_id_of_the_other_kinds_snapshot_is_named_as_that_kind(job: Job, cli: Cli) -> None:
    """One counter numbers checkpoints and savepoints: `checkpoint:3` of a job whose 3 is a
    savepoint said only which checkpoints there are (a newcomer's)."""
    result = cli("inspect", "checkpoint:3", *job.flags)

    assert result.code == 1
    assert result.err.rstrip().endswith(
        "(never written, or discarded; checkpoints in storage: 1, 2); 3 is a savepoint: savepoint:3"
    ), result.err
