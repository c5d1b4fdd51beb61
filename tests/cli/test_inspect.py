"""`spark-checkpoint inspect KIND:ID`: the summary of a snapshot's `_metadata`."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_checkpoint.storage import CheckpointKind

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]


def test_summarizes_the_metadata(job: Job, cli: Cli) -> None:
    job.write_registry(checkpoints=[2], savepoints=[3])
    meta = job.storage.read_metadata(CheckpointKind.CHECKPOINT, 2)

    result = cli("inspect", "checkpoint:2", *job.flags)

    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == "checkpoint 2 of analytics/clicks"
    fields = dict(line.strip().split(": ", 1) for line in lines[1:10])
    assert {key.strip() for key in fields} == {
        "metadata", "registry", "format version", "batch", "query id", "triggered",
        "completed", "total", "shared files",
    }  # fmt: skip
    assert fields["metadata"].strip() == str(job.metadata_file(CheckpointKind.CHECKPOINT, 2))
    assert fields["registry"].strip() == "registered"
    assert fields["batch"].strip() == "1"
    assert fields["query id"].strip() == "8f14e45f-ea1c-4e9b-9a6e-0c2b1b2f7d11"
    triggered = meta.trigger_time.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert fields["triggered"].strip() == triggered
    assert fields["completed"].endswith("(2.25s after the trigger, 2d2h ago)")
    assert fields["total"].strip() == "127 B (127 bytes) in 4 files"
    # state/0/0/1.delta is stored once and referenced by checkpoints 1 and 2.
    assert fields["shared files"].strip() == "4 (1 also referenced by other checkpoints)"
    assert "  properties:" in result.out
    acks = lines[lines.index("  task acknowledgements (2):") + 1 :]
    assert [line.split() for line in acks] == [
        ["TASK", "FILES", "BYTES", "DURATION"],
        ["logs", "2", "50", "B", "12ms"],
        ["state-0-0", "2", "77", "B", "30ms"],
    ]


def test_lists_the_files_on_request(job: Job, cli: Cli) -> None:
    result = cli("inspect", "savepoint:3", *job.flags, "--files")

    assert result.code == 0, result.err
    assert "registry:       unknown (no readable status file)" in result.out
    assert "shared files:   0\n" in result.out  # a savepoint is self-contained
    files = result.out.split("  files (4):\n", 1)[1].splitlines()
    assert files[0].split() == ["PATH", "SIZE", "SHA256", "LOCATION"]
    assert files[1].split()[0] == "offsets/1"
    assert files[1].split()[-1] == "savepoints/sp-3/files/offsets/1"


def test_json_prints_the_metadata_document(job: Job, cli: Cli) -> None:
    result = cli("inspect", "checkpoint:1", *job.flags, "--json")

    assert result.code == 0, result.err
    stored = gzip.decompress(job.metadata_file(CheckpointKind.CHECKPOINT, 1).read_bytes())
    assert json.loads(result.out) == json.loads(stored)
    assert result.out.startswith('{\n  "format_version": 2,\n')  # readable, not one line


def test_an_absent_snapshot_exits_1_naming_the_file(job: Job, cli: Cli) -> None:
    result = cli("inspect", "checkpoint:9", *job.flags)

    assert result.code == 1
    missing = job.storage.layout.metadata_path(CheckpointKind.CHECKPOINT, 9)
    assert result.err.strip() == (
        f"spark-checkpoint inspect: checkpoint:9: missing file: {missing}: no such file"
    )


def test_an_invalid_metadata_exits_1_naming_the_field(job: Job, cli: Cli) -> None:
    path = job.metadata_file(CheckpointKind.CHECKPOINT, 1)
    document = json.loads(gzip.decompress(path.read_bytes()))
    document["files"][0]["sha256"] = "not-a-digest"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))

    result = cli("inspect", "checkpoint:1", *job.flags)

    assert result.code == 1
    assert f"invalid metadata: {path}: files[0].sha256: " in result.err


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
