"""`list`, `inspect` and `verify` on a job whose storage is on S3 (moto's server), Google
Cloud Storage (fake-gcs-server) or Azure Blob Storage (Azurite): the commands read it with
the credentials of the environment."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helpers.fake_query import run_cli
from helpers.faulty_proxy import http_answer
from helpers.objectstore import ROOT_KINDS, StorageRoot, storage_root_for
from spark_checkpoint.storage import CheckpointKind

if TYPE_CHECKING:
    from conftest import Job, Result, StartProxy

Cli = Callable[..., "Result"]


@pytest.fixture(params=[kind for kind in ROOT_KINDS if kind != "local"])
def root(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> StorageRoot:
    """A fresh root on the server, whose credentials are in the environment."""
    return storage_root_for(request, tmp_path, monkeypatch)


def test_list_inspect_and_verify_on_an_object_store(
    root: StorageRoot, job_on: Callable[[str], Job], cli: Cli
) -> None:
    job = job_on(root.url)
    job.write_registry(checkpoints=[1, 2], savepoints=[3])

    listed = cli("list", *job.flags)
    inspected = cli("inspect", "checkpoint:2", *job.flags, "-o", "wide")
    verified = cli("verify", *job.flags)

    assert listed.code == 0, listed.err
    assert f"job analytics/clicks: {root.url}/analytics/clicks" in listed.out
    assert [line.split()[:3] for line in listed.out.splitlines() if "registered" in line] == [
        ["checkpoint", "1", "0"],
        ["checkpoint", "2", "1"],
        ["savepoint", "3", "1"],
    ]
    assert inspected.code == 0, inspected.err
    metadata = job.storage.layout.metadata_path(CheckpointKind.CHECKPOINT, 2)
    assert inspected.out.splitlines()[1].endswith(f"  registered  {metadata}")
    assert verified.code == 0, verified.out + verified.err
    assert verified.out.endswith("3 verified: 3 OK, 0 failed\n")

    meta = job.storage.read_metadata(CheckpointKind.CHECKPOINT, 1)
    damaged = job.storage.layout.location_path(meta.files[0].location)
    root.write(damaged, b"x" * meta.files[0].size)
    verified = cli("verify", "checkpoint:1", *job.flags)

    assert verified.code == 1
    assert f"checksum mismatch: {meta.files[0].path} at {damaged}" in verified.out


@pytest.mark.parametrize("command", ["list", "inspect", "verify"])
def test_a_bucket_that_does_not_exist_is_said_not_taken_for_empty_storage(
    root: StorageRoot, job_on: Callable[[str], Job], cli: Cli, command: str
) -> None:
    """A mistyped bucket (or an endpoint that has another's) listed as empty: "nothing is
    stored", each registered image "registered but not in storage", exit 0 for `list` (a
    hostile newcomer's): a user told that every savepoint is gone."""
    job = job_on(root.url)
    job.write_registry(checkpoints=[1, 2], savepoints=[3])
    scheme, _, path = root.url.partition("://")
    missing = f"{scheme}://missing-{uuid.uuid4().hex[:12]}/{path.partition('/')[2]}"
    flags = list(job.flags)
    flags[flags.index(job.root)] = missing

    result = cli(command, *flags)

    bucket = missing.split("/")[2]
    assert result.code == 1, result.out + result.err
    assert result.err == (
        f"spark-checkpoint {command}: {missing}/analytics/clicks: its bucket or container "
        f"{bucket!r} does not exist (at the endpoint and account these credentials reach)\n"
    )
    assert result.out == ""


def test_a_refusal_gcs_gives_a_process_of_the_command_line_is_one_line(
    gcs_root: StorageRoot, faulty_proxy: StartProxy, tmp_path: Path
) -> None:
    """gcsfs logs each refused request as an error with its traceback, which Python's
    last-resort handler printed before the command's own line (a reviewer's): a pod or a
    machine without Google credentials is anonymous, which GCS answers 401."""
    said = "Anonymous caller does not have storage.objects.list access to the bucket."
    answer = http_answer(
        "401 Unauthorized", json.dumps({"error": {"code": 401, "message": said}}).encode()
    )
    refused = faulty_proxy(gcs_root, re.compile(rb"^GET /storage/v1/b/\S*/o\?"), answer)
    flags = ["--storage", gcs_root.url, "--namespace", "analytics", "--job", "clicks"]

    result = run_cli(tmp_path, "list", *flags, environment=dict(os.environ))

    assert refused.matched >= 1
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"spark-checkpoint list: {gcs_root.url}/analytics/clicks: HttpError: {said} (HTTP 401)"
    ], result.stderr
