"""Errors of the checkpoint storage format.

Every error names the storage path it is about and why, so that an operator reading a
log line or the job's status knows which file to look at. Nothing is skipped silently:
a missing, corrupt or unreadable file is always one of these errors.
"""

from __future__ import annotations

import re
from typing import Literal

from spark_checkpoint.protocol import StorageOwner


class StorageError(Exception):
    """Base class: something is wrong with a file in checkpoint storage (or a restore target)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def storage_failure(error: Exception, job_root: str) -> str:
    """``error`` in one line that names where first, as StorageError does: an object
    store's OSError may name nothing ("The specified bucket does not exist"), so the job's
    storage is named for it; a bucket or container that does not exist is told as such."""
    if is_missing_bucket(error):
        return f"{job_root}: " + missing_bucket_reason("the driver's")
    if not isinstance(error, OSError):
        return str(error)
    if not error.filename:
        return f"{job_root}: {error}"
    return f"{error.filename}: {error.strerror}" if error.strerror else str(error)


# What S3 and Azure Blob Storage answer for a bucket or container that does not exist.
_MISSING_BUCKET_CODES = ("NoSuchBucket", "ContainerNotFound")
# A request to GCS's JSON API as gcsfs's errors name it: its URL (an upload's, a download's)
# or its path from the bucket on (`b/<bucket>/o/<key>`, a listing's or an object's).
GCS_REQUEST = re.compile(
    r"(?:https?://[^/\s]+(?:/upload|/download)?/storage/v1/)?b/(?P<bucket>[^/?\s]+)/o"
    r"(?P<key>/[^?\s]*)?(?:\?(?P<query>\S*))?"
)


def is_missing_bucket(error: BaseException) -> bool:
    """Whether an object store's error says that its bucket (S3, GCS) or container (Azure)
    does not exist, as the service's error code does: s3fs raises FileNotFoundError with the
    service's error as the cause, adlfs that or the service's error itself; gcsfs a
    FileNotFoundError naming the request, which is a bucket's list of objects (a listing,
    an upload, not a resumable upload's later part) only when the bucket is missing. Not a
    key that does not exist, nor a refusal. (Asking for the bucket instead takes rights a
    least-privilege policy may not give: HeadBucket needs s3:ListBucket without a prefix
    condition.)"""
    if isinstance(error, FileNotFoundError) and error.strerror == "No such container":
        return True  # adlfs's own
    gcs = GCS_REQUEST.fullmatch(str(error.args[0]) if error.args else "")
    if isinstance(error, FileNotFoundError) and gcs and not gcs["key"]:
        return "upload_id=" not in (gcs["query"] or "")
    for cause in (error, error.__cause__, error.__context__):
        response = getattr(cause, "response", None)  # botocore's ClientError
        code = (
            response.get("Error", {}).get("Code")
            if isinstance(response, dict)
            else getattr(cause, "error_code", None)  # azure-core's HttpResponseError
        )
        if any(code == missing for missing in _MISSING_BUCKET_CODES):
            return True
    return False


def missing_bucket_reason(credentials: str, bucket: str | None = None) -> str:
    """What is said of a bucket (S3, GCS) or container (Azure) that does not exist, at the
    endpoint and account that `credentials` ("the driver's") reach."""
    named = f" {bucket!r}" if bucket is not None else ""
    return (
        f"its bucket or container{named} does not exist (at the endpoint and account "
        f"{credentials} credentials reach)"
    )


class StorageAccessError(StorageError):
    """The storage service could not be used for a path: no or wrong credentials, an
    endpoint that does not answer, a request it refused (the reason names the library's
    error, e.g. botocore's NoCredentialsError)."""


class MissingFileError(StorageError):
    """A file that a manifest or the layout says must exist does not."""


class ChecksumMismatchError(StorageError):
    """A file's size or SHA-256 differs from what the manifest recorded.

    `mismatch` says which of the two differed; the size is checked first because it is
    cheap and a truncated copy is the most likely corruption.
    """

    def __init__(
        self, path: str, mismatch: Literal["size", "sha256"], expected: str, actual: str
    ) -> None:
        super().__init__(path, f"{mismatch} mismatch: expected {expected}, found {actual}")
        self.args = (path, mismatch, expected, actual)
        self.mismatch = mismatch
        self.expected = expected
        self.actual = actual


class UnknownFormatVersionError(StorageError):
    """A `_metadata` file was written in a format version this code cannot read."""

    def __init__(self, path: str, version: int, supported_versions: tuple[int, ...]) -> None:
        super().__init__(
            path,
            f"unknown format_version {version}; this version of spark-checkpoint reads "
            f"format_version {' or '.join(str(known) for known in supported_versions)}",
        )
        self.args = (path, version, supported_versions)
        self.version = version
        self.supported_versions = supported_versions


class TruncatedMetadataError(StorageError):
    """A `_metadata` file is empty, a cut short or damaged gzip stream, or not parseable JSON
    (e.g. cut short by a foreign writer)."""


class InvalidMetadataError(StorageError):
    """A `_metadata` file is JSON but violates the schema or is internally inconsistent.

    `field` is the JSON path of the offending value, e.g. ``files[3].sha256``.
    """

    def __init__(self, path: str, field: str, reason: str) -> None:
        super().__init__(path, f"{field}: {reason}")
        self.args = (path, field, reason)
        self.field = field


class NotEmptyError(StorageError):
    """A restore target directory already has content; restoring never merges into it."""


# What links are never followed out of (`SymbolicLinkError`), unless another is named.
STORAGE_DIRECTORY = "the job's storage directory"


class UnregisteredCheckpointError(StorageError):
    """A checkpoint of the job's own storage that its registry does not list, named to
    restore from: its garbage collection deletes such a checkpoint, maybe while it is read."""

    def __init__(self, path: str) -> None:
        super().__init__(
            path,
            "a checkpoint in this job's own storage that its registry does not list (one "
            "written just before a crash, or an earlier registry's): the job's garbage "
            "collection deletes it; to restore it, copy the job's directory to another "
            "root and name the copy there",
        )


class NotARegularFileError(StorageError):
    """Something other than a file where storage keeps one (a FIFO, a device, a socket, a
    directory): refused before it is read, since reading a FIFO or a device never ends."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(path, f"is {what}, not a regular file: remove it")
        self.args = (path, what)


class SymbolicLinkError(StorageError):
    """A symbolic link below the storage root: the job's directory, its namespace's, or
    anything inside them (or below another directory a job owns: `within` names it).

    Nothing in this package creates one, and following one could read or delete files
    outside the job's directory, so every operation that meets one refuses it.
    """

    def __init__(self, path: str, target: str, within: str = STORAGE_DIRECTORY) -> None:
        super().__init__(
            path,
            f"is a symbolic link (to {target!r}); links are never followed out of {within}: "
            "remove the link",
        )
        self.args = (path, target, within)
        self.target = target


class StorageOwnedElsewhere(StorageError):
    """The job's storage belongs to another registry of the job (see `StorageOwner`)."""

    def __init__(self, path: str, owner: StorageOwner, claimant: StorageOwner) -> None:
        super().__init__(
            path,
            f"this job's storage belongs to {printable_line(owner.description)}, not to "
            f"{claimant.description}, whose garbage collection would delete the other's "
            "checkpoints: run the job from the registry that owns it, or give this one "
            "another spec.checkpointing.storage (spec.restore.initialSavepointPath can start "
            f"it from a savepoint there); {hand_over_hint(path)}",
        )
        self.args = (path, owner, claimant)
        self.owner = owner
        self.claimant = claimant


def hand_over_hint(owner_path: str) -> str:
    """How a registry the job's storage does not belong to gets it (`owner_path`: its
    `owner.json`)."""
    return (
        f"to hand the storage over, delete {owner_path.removeprefix('file://')} (the "
        "checkpoints the other registry lists are then deleted as garbage; its savepoints stay)"
    )


def first_line(error: BaseException) -> str:
    """An error's message as one printable line: its first (a library may add many:
    pyarrow's error for a missing libhdfs lists each of the 88 places it looked)."""
    lines = str(error).strip().splitlines()
    return printable_line(lines[0] if lines else type(error).__name__)


def joined_lines(error: BaseException, limit: int = 600) -> str:
    """An error's message as one printable line, all its lines joined: a library may say
    why on later ones (Azure's DefaultAzureCredential names each credential it tried and
    what failed, a line each)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return printable_line(" ".join(lines) or type(error).__name__, limit)


def printable(text: str) -> str:
    """`text` with each character a terminal would act on or cannot print (controls,
    escape sequences, line breaks, lone surrogates) written as its Python escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def printable_line(text: str, limit: int = 300) -> str:
    """Text read from storage as one line of printable characters, at most ``limit``:
    what a message or a log line quotes of it."""
    line = printable(text)
    return line if len(line) <= limit else f"{line[: limit - 3]}..."
