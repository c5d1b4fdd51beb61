"""Storage errors: what they say and carry (`args` too, which their repr in a log shows),
and that they survive pickling (an error raised in a worker process reaches its parent as
a pickled copy)."""

import pickle
from collections.abc import Callable

import fsspec
import pytest
from botocore.exceptions import EndpointConnectionError

from spark_checkpoint.storage import (
    ChecksumMismatchError,
    InvalidMetadataError,
    MissingFileError,
    NotEmptyError,
    StorageAccessError,
    StorageError,
    StorageFileSystem,
    SymbolicLinkError,
    TruncatedMetadataError,
    UnknownFormatVersionError,
)

IGNORE_ENDPOINTS = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"

# Built inside the test, not at collection: mutmut credits a test only with the code that
# ran while it ran.
ERRORS: list[tuple[Callable[[], StorageError], str, dict[str, object]]] = [
    (
        lambda: MissingFileError("/s/chk-1/_metadata", "no such file"),
        "/s/chk-1/_metadata: no such file",
        {"args": ("/s/chk-1/_metadata", "no such file")},
    ),
    (
        lambda: ChecksumMismatchError("/s/shared/ab/x", "sha256", "ab" * 32, "cd" * 32),
        f"/s/shared/ab/x: sha256 mismatch: expected {'ab' * 32}, found {'cd' * 32}",
        {"mismatch": "sha256", "expected": "ab" * 32, "actual": "cd" * 32},
    ),
    (
        lambda: UnknownFormatVersionError("/s/chk-2/_metadata", 7, (1, 2)),
        "/s/chk-2/_metadata: unknown format_version 7; this version of spark-checkpoint reads "
        "format_version 1 or 2",
        {"version": 7, "supported_versions": (1, 2)},
    ),
    (
        lambda: TruncatedMetadataError("/m", "the file is empty"),
        "/m: the file is empty",
        {"args": ("/m", "the file is empty")},
    ),
    (
        lambda: InvalidMetadataError("/m", "files[3].sha256", "bad"),
        "/m: files[3].sha256: bad",
        {"field": "files[3].sha256"},
    ),
    (
        lambda: NotEmptyError("/t", "is not empty"),
        "/t: is not empty",
        {"args": ("/t", "is not empty")},
    ),
    (
        lambda: SymbolicLinkError("/s/default/orders/shared", "/etc"),
        "/s/default/orders/shared: is a symbolic link (to '/etc'); links are never followed "
        "out of the job's storage directory: remove the link",
        {"target": "/etc"},
    ),
]


@pytest.mark.parametrize(("make", "text", "attributes"), ERRORS)
def test_an_error_says_which_path_and_why_and_survives_pickling(
    make: Callable[[], StorageError], text: str, attributes: dict[str, object]
) -> None:
    error = make()
    copy = pickle.loads(pickle.dumps(error))

    for candidate in (error, copy):
        assert isinstance(candidate, StorageError)
        assert str(candidate) == text
        assert candidate.path == text.split(": ", maxsplit=1)[0]
        assert candidate.reason == text.split(": ", 1)[1]
        for name, value in attributes.items():
            assert getattr(candidate, name) == value


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        (
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000 "},
            "AWS_ENDPOINT_URL's: 'http://127.0.0.1:9000 '",
        ),
        (
            {"AWS_ENDPOINT_URL_S3": "htp:/x", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"},
            "AWS_ENDPOINT_URL_S3's: 'htp:/x'",
        ),
        (
            {"AWS_ENDPOINT_URL": "http://key:secret@[::1"},
            "AWS_ENDPOINT_URL's: 'http://key:***@[::1'",
        ),
        # botocore echoes the endpoint, its password too.
        (
            {"AWS_ENDPOINT_URL": "http://key:secret@host name:9000"},
            "AWS_ENDPOINT_URL's: 'http://key:***@host name:9000'",
        ),
        # botocore passes over an empty variable.
        (
            {"AWS_ENDPOINT_URL_S3": "", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000 "},
            "AWS_ENDPOINT_URL's: 'http://127.0.0.1:9000 '",
        ),
    ],
)
def test_an_s3_endpoint_that_cannot_be_resolved_is_told_with_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], named: str
) -> None:
    """A trailing space in AWS_ENDPOINT_URL (an S3 newcomer's) read as a store that is down:
    the variable is named, its value quoted (its password hidden)."""
    for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", IGNORE_ENDPOINTS):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    fs = StorageFileSystem(fsspec.filesystem("s3", skip_instance_cache=True))

    with pytest.raises(StorageAccessError) as raised:
        fs.list_dir("s3://bucket/checkpoints")

    assert str(raised.value).startswith("s3://bucket/checkpoints: ")
    assert str(raised.value).endswith(f" (the endpoint is {named})"), raised.value
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("environment", "said"),
    [
        ({}, "no AWS_ENDPOINT_URL is set: the endpoint is AWS's or the AWS config's endpoint_url"),
        (
            {IGNORE_ENDPOINTS: "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"},
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is set: the endpoint is AWS's",
        ),
    ],
)
def test_an_s3_endpoint_that_cannot_be_reached_without_a_variable_says_so(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], said: str
) -> None:
    for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", IGNORE_ENDPOINTS):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    fs = StorageFileSystem(fsspec.filesystem("s3", skip_instance_cache=True))

    def unreachable(path: str, detail: bool) -> list[str]:
        raise EndpointConnectionError(endpoint_url="https://bucket.s3.amazonaws.com/")

    monkeypatch.setattr(fs._fs, "ls", unreachable)

    with pytest.raises(StorageAccessError) as raised:
        fs.list_dir("s3://bucket/checkpoints")

    assert str(raised.value).endswith(f" ({said})"), raised.value
