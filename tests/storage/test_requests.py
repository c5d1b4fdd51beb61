"""What a checkpoint costs in requests to an S3 server (moto's, counting what it serves).

Spark's own checkpoints on object stores LIST directories for every batch, which is a known
cost that grows with the number of files. An incremental checkpoint here must not: an
unchanged file costs no request of its own. What `shared/` holds is listed once when the
snapshot starts (the agent's `listed_shared_sizes`) and once before `_metadata` is written
(every file it names must be there), a request per 1,000 objects each, where a HEAD per file
cost a request per file twice (at 200 partitions, 800 HEADs took 4-13 s against moto).
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

    def checkpoint(checkpoint_id: int) -> None:  # as the agent takes it
        stored = storage.listed_shared_sizes()
        entries = [
            storage.add_shared_file(spark_file(p, c), p, stored=stored) for p, c in image.items()
        ]
        storage.write_metadata(build_metadata(CheckpointKind.CHECKPOINT, checkpoint_id, entries))

    checkpoint(1)
    image["state/0/0/1.delta"] = b"partition 0, next batch"
    before = s3_server.requests.snapshot()
    checkpoint(2)
    return s3_server.requests.snapshot() - before


def test_an_unchanged_file_costs_no_request_and_the_requests_do_not_grow(
    s3_server: S3Server,
    tmp_path: Path,
    spark_file: SparkFile,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = _checkpoint_requests(s3_server, tmp_path / "small", spark_file, monkeypatch, 3)
    large = _checkpoint_requests(s3_server, tmp_path / "large", spark_file, monkeypatch, 15)

    assert small == large
    assert small["PUT"] == 2, small  # the changed file and `_metadata`
    # `shared/` listed when the snapshot starts and before `_metadata` is written.
    assert small["LIST"] == 2, small
    assert set(small) == {"PUT", "LIST"}, small
