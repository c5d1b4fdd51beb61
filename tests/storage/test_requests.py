"""What a checkpoint costs in requests to an S3 server (moto's, counting what it serves).

Spark's own checkpoints on object stores LIST directories for every batch, which is a known
cost that grows with the number of files. An incremental checkpoint here must not: an
unchanged file costs one HEAD (is it stored already, with its size?) and no PUT, and the
LIST requests do not depend on how many files the image has.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.objectstore import S3Server, storage_roots
from spark_checkpoint.storage import CheckpointKind, CheckpointStorage, JobStorageLayout

from .conftest import JOB, NAMESPACE, build_metadata

SparkFile = Callable[[str, bytes], str]


def _checkpoint_requests(
    s3_server: S3Server,
    tmp_path: Path,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
    files: int,
) -> collections.Counter[str]:
    """Requests of checkpoint 2, after checkpoint 1 stored `files` files, of which one
    changed in between (the usual case: a few state files change per batch)."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    root = storage_roots("s3", tmp_path, lambda _kind: s3_server)
    storage = CheckpointStorage(JobStorageLayout(root.url, NAMESPACE, JOB))
    image = {f"state/0/{n}/1.delta": f"partition {n}".encode() for n in range(files)}

    def checkpoint(checkpoint_id: int) -> None:
        entries = [storage.add_shared_file(spark_file(p, c), p) for p, c in image.items()]
        storage.write_metadata(build_metadata(CheckpointKind.CHECKPOINT, checkpoint_id, entries))

    checkpoint(1)
    image["state/0/0/1.delta"] = b"partition 0, next batch"
    before = s3_server.requests.snapshot()
    checkpoint(2)
    return s3_server.requests.snapshot() - before


def test_an_unchanged_file_costs_a_head_and_no_put_and_lists_do_not_grow(
    s3_server: S3Server,
    tmp_path: Path,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = _checkpoint_requests(s3_server, tmp_path / "small", spark_file, monkeypatch, 3)
    large = _checkpoint_requests(s3_server, tmp_path / "large", spark_file, monkeypatch, 15)

    for files, counts in ((3, small), (15, large)):
        assert counts["PUT"] == 2, counts  # the changed file and `_metadata`
        # One per file to find it stored (the changed one's answers "not found"), and one
        # per manifest file before `_metadata` is written (every file it names must be there).
        assert counts["HEAD"] == 2 * files, counts
        assert counts["COPY"] == 0
    # The only LIST is s3fs telling the changed file's absence from a directory.
    assert small["LIST"] == large["LIST"] == 1
    assert set(small) | set(large) <= {"PUT", "HEAD", "LIST"}
