"""Where TransactionalFileSink may write: a local directory, S3, Google Cloud Storage or
Azure Blob Storage, never a filesystem it cannot commit to atomically."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_checkpoint.sink import TransactionalFileSink, read_committed


@pytest.mark.parametrize(
    "uri",
    [
        "hdfs://namenode/out",
        "file://host/out",
        "s3://",
        "memory://out",
        "hdfs://key:secret@namenode/out",
    ],
)
def test_a_uri_without_create_only_writes_is_refused_before_anything_is_written(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as refused:
        TransactionalFileSink(uri)
    assert str(refused.value).startswith(
        f"TransactionalFileSink cannot commit atomically to {uri.replace('secret', '***')!r}: "
        "its output must be a local path"
    )
    assert "secret" not in str(refused.value)
    with pytest.raises(ValueError, match="cannot commit atomically"):
        read_committed(uri)
    assert list(tmp_path.iterdir()) == [], "nothing is created (such as a directory 'hdfs:')"


@pytest.mark.parametrize(
    ("uri", "shown", "problem"),
    [
        ("s3://bkt/jobs/team-*/out", None, "contains '*', which fsspec reads as a pattern"),
        ("s3://bkt//out", None, "has an empty path segment"),
        ("abfs://cont@account/a/../out", None, "has a '..' path segment"),
        ("s3://key:secret@bkt/out", "s3://key:***@bkt/out", "carries a password"),
        ("abfss://key:secret@c/out", "abfss://key:***@c/out", "carries a password"),
        ("gs://key:secret@bkt/out", "gs://key:***@bkt/out", "carries a password"),
        ("gs://Bad!/out", None, "does not start with its bucket's name"),
        ("s3://AKIA:wJ/secret@bkt/out", "s3://AKIA:***@bkt/out", "carries a password"),
        ("s3://user:p@secret@bkt/out", "s3://user:***@bkt/out", "carries a password"),
        ("s3a://Bad!/out", None, "does not start with its bucket's name"),
        ("az://cont/a\tb", None, "contains a control character"),
        ("abfs://cont/back\\slash", None, "contains a backslash, which Azure Blob Storage"),
        ("abfs://Bad_Container!/out", None, "does not start with its container's name"),
        ("S3://Bad!/out", None, "has its scheme in capitals: write s3://"),
        ("gs:/bucket/out", None, "has one slash after its scheme: write gs://bucket/out"),
        ("s3:/key:secret@b/out", "s3:/key:***@b/out", "has one slash after its scheme"),
        ("", None, "is empty: give a local path or a URI"),
    ],
)
def test_an_object_store_uri_fsspec_would_not_take_literally_is_refused(
    uri: str, shown: str | None, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsspec expands `*`, `?` and `[` as a pattern in deletes: the commit of the output
    at `s3://bkt/jobs/team-*/out` deleted the staged batch of the one at
    `s3://bkt/jobs/team-a/out`, which never committed it (a reviewer). s3fs lists an empty
    segment's keys under another prefix than it writes: nothing was ever committed. A
    password in the URI was taken, and botocore's errors echoed it; the refusal hides it."""
    monkeypatch.chdir(tmp_path)
    for reader in (TransactionalFileSink, read_committed):
        with pytest.raises(ValueError) as refused:
            reader(uri)
        assert str(refused.value).startswith(
            f"TransactionalFileSink's output {shown or uri!r} {problem}"
        )
        assert "secret" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "uri",
    ["s3a://bucket/output/orders", "s3://bucket/out/", "abfss://cont@account/out", "az://cont/out"],
)
def test_an_object_store_uri_is_taken_as_it_is_without_a_request(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "account")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there

    assert TransactionalFileSink(uri).output_dir == uri.rstrip("/")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("form", ["file:///path", "file:/path"])
def test_a_file_uri_is_its_local_path(tmp_path: Path, form: str) -> None:
    target = tmp_path / "out put"
    uri = target.as_uri() if form == "file:///path" else target.as_uri().replace("///", "/")
    sink = TransactionalFileSink(uri)
    assert sink.output_dir == str(target)
    assert (target / "committed").is_dir()


def _python(code: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a Python process of its own, with ``variables`` over a plain environment."""
    environment = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **variables}
    return subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_spark_checkpoint_chooses_gcsfs_classic_filesystem() -> None:
    """gcsfs's default (2026.8 on) is its experimental class for zonal and hierarchical-
    namespace buckets, whose create-only write overwrites on a zonal bucket (a reviewer's)."""
    chosen = _python(
        "import spark_checkpoint, fsspec; "
        "print(type(fsspec.filesystem('gs', token='anon')).__name__)"
    )

    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout == "GCSFileSystem\n"


def test_the_sink_refuses_gcsfs_experimental_filesystem() -> None:
    """A user's environment turned it on: commit records would not fence a second writer."""
    refused = _python(
        "from spark_checkpoint.sink import TransactionalFileSink\n"
        "try:\n"
        "    TransactionalFileSink('gs://bucket/out')\n"
        "except ValueError as error:\n"
        "    print(error)\n",
        GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="true",
    )

    assert refused.returncode == 0, refused.stderr
    assert refused.stdout == (
        "TransactionalFileSink cannot commit atomically to 'gs://bucket/out' with gcsfs's "
        "experimental filesystem, whose create-only write overwrites on a zonal bucket: set "
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, or import spark_checkpoint before gcsfs\n"
    )
