"""Storage errors: what they say and carry (`args` too, which their repr in a log shows),
and that they survive pickling (an error raised in a worker process reaches its parent as
a pickled copy)."""

import pickle
from collections.abc import Callable

import pytest

from spark_checkpoint.storage import (
    ChecksumMismatchError,
    InvalidMetadataError,
    MissingFileError,
    NotEmptyError,
    StorageError,
    SymbolicLinkError,
    TruncatedMetadataError,
    UnknownFormatVersionError,
)

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
