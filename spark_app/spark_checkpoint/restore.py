"""Restore: materialize a registered image into a fresh Spark checkpoint location.

Candidates are tried newest first; an image that cannot be read or verified is skipped
with a warning and the next one is tried. The live location of an earlier attempt is
never reused: two drivers on one location corrupt it.

An image can be intact and still not restorable (a file Spark reads at restart is not in
it): Spark then fails the restored query. `checkpoint_failure` tells such a failure from
any other, so that the runtime falls back to an older image instead of retrying this one.
"""

import errno
import json
import logging
import re
import shutil
import uuid
from pathlib import Path

from spark_checkpoint.exit_codes import STORAGE_UNAVAILABLE
from spark_checkpoint.protocol import RestoreCandidate, RestoredFrom, SkippedImage
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    StorageAccessError,
    StorageError,
    UnregisteredCheckpointError,
    parse_snapshot_address,
)

log = logging.getLogger(__name__)

SPARK_METADATA_FILE = "metadata"  # the query id, at the root of a checkpoint location

# Spark's error classes (Spark 4's error-conditions.json) that say the query no longer fits
# a checkpoint's state: its schema, operators or settings changed. Every image of the job
# fails alike (supervisor: `_fails_like_the_last_image`).
QUERY_CHANGE_ERROR_CLASSES = (
    "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE",
    "STATE_STORE_INVALID_CONFIG_AFTER_RESTART",
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
    "STREAM_STREAM_JOIN_INCOMPATIBLE_STATE_STORE_CONFIGS",
)
# ... and how Spark (MetadataVersionUtil) says a log was written by a newer Spark than the
# one reading it: the image is whole, the pipeline's Spark older (a downgrade).
NEWER_SPARK_LOG = "UnsupportedLogVersion: "
# ... and those that say a checkpoint's files are missing or corrupt, or either.
CHECKPOINT_ERROR_CLASSES = (
    "CANNOT_LOAD_STATE_STORE",
    "CHECKPOINT_FILE_CHECKSUM_VERIFICATION_FAILED",
    "STATE_STORE_BASE_CHECKPOINT_ID_MISMATCH",
    "STATE_STORE_ROW_CHECKSUM_VERIFICATION_FAILED",
    "STATE_STORE_UNEXPECTED_EMPTY_FILE_IN_ROCKSDB_ZIP",
    "STREAMING_CHECKPOINT_MISSING_METADATA_FILE",
    "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY",
    *QUERY_CHANGE_ERROR_CLASSES,
)
MAX_REASON_CHARS = 500
# Failures to read a file, which point at the checkpoint when the file is in it.
_FILE_READ_FAILURE = re.compile(
    r"FileNotFoundException|NoSuchFileException|EOFException|does not exist|doesn't exist"
    r"|malformed|corrupt|UnsupportedLogVersion|Failed to read",
    re.IGNORECASE,
)


# Spark's metadata logs (offsets, a file source's) missing an entry a restart reads: its
# IllegalStateException names neither an error class nor the file.
_MISSING_LOG_ENTRY = re.compile(r"\bbatch \d+ doesn't exist\b")


def image_free(error: str) -> str:
    """A query change's error without what differs in each image: Spark's metadata log
    prefixes ``UnsupportedLogVersion`` with the log file it read (``Failed to read log file
    .../offsets/12.``)."""
    start = error.find(NEWER_SPARK_LOG)
    return error if start < 0 else error[start:]


def query_change(error: str) -> bool:
    """Whether a restored query's error says the query (or its Spark) no longer fits the
    image's state."""
    return NEWER_SPARK_LOG in error or any(
        error_class in error for error_class in QUERY_CHANGE_ERROR_CLASSES
    )


class RestoreFailed(Exception):
    """No candidate could be restored; the message lists each one with its reason."""


# An object store's client's OSError numbers (s3fs: EBUSY for SlowDown) for storage that did
# not answer or asked to be called later.
_STORAGE_DID_NOT_ANSWER = frozenset(
    {errno.ETIMEDOUT, errno.EBUSY, errno.EAGAIN, errno.EREMOTEIO, errno.EHOSTUNREACH}
)


class StorageUnavailable(Exception):
    """Storage could not be read as an image was restored (no access, no answer): that
    says nothing of the image, which is not passed over; another attempt may read it."""


def restore(
    storage: CheckpointStorage,
    candidates: tuple[RestoreCandidate, ...],
    target: Path,
) -> RestoredFrom | None:
    """Materialize the newest usable candidate into ``target``; None when there are none.
    What it restored is what the agent reports as ``restoredFrom``."""
    skipped: list[SkippedImage] = []
    for candidate in candidates:
        try:
            metadata, source_storage = _open(storage, candidate)
            source_storage.materialize(metadata, str(target))
            relocate_state_schema_paths(target)
            if not (target / SPARK_METADATA_FILE).is_file():
                # Spark writes it when a query first starts, before any batch: an image
                # without it (an external savepoint made by hand) is not a query's checkpoint.
                raise StorageError(str(candidate), "the image has no Spark metadata file")
            if candidate.is_external and (metadata.namespace, metadata.job) != (
                storage.layout.namespace,
                storage.layout.job,
            ):
                # Another job's image (the same job's, in another root, is its own query).
                _give_new_query_id(target)
        except (StorageError, OSError, ValueError, ImportError, RecursionError) as error:
            # ValueError and ImportError: fsspec knows no such protocol (or lacks its
            # package); ValueError and RecursionError: Spark's metadata file is no JSON
            # object (nested too deeply).
            shutil.rmtree(target, ignore_errors=True)
            if _storage_unavailable(error):
                # Passed over, the image would never be restored again, and the job would
                # roll back to an older one, or fail for good with none left.
                raise StorageUnavailable(
                    f"{STORAGE_UNAVAILABLE}: {candidate} ({error}); it is not passed over: "
                    "the next attempt restores it if storage answers then"
                ) from error
            log.warning(
                "cannot restore from %s (%s); falling back to the next image", candidate, error
            )
            skipped.append(SkippedImage(candidate, str(error)))
            continue
        log.info("restored %s at batch %s into %s", candidate, metadata.batch_id, target)
        return RestoredFrom(candidate, metadata.batch_id, tuple(skipped))
    if skipped:
        reasons = "; ".join(f"{s.candidate}: {s.reason}" for s in skipped)
        raise RestoreFailed(f"no image could be restored: {reasons}")
    return None


def _storage_unavailable(error: Exception) -> bool:
    """Whether ``error`` says that storage did not answer (a timeout, a lost connection,
    throttling) or could not be used (no or wrong credentials, an endpoint that is not
    there): the environment's, not the image's. A refusal to read is the image's, as a
    missing or damaged file is: S3 answers a read of a missing object 403 without the right
    to list, and of an archived one too."""
    if isinstance(error, (StorageAccessError, TimeoutError, ConnectionError)):
        return True
    return isinstance(error, OSError) and error.errno in _STORAGE_DID_NOT_ANSWER


def checkpoint_failure(error: str, location: Path) -> str | None:
    """The line of a query failure (Spark's error text) that shows it is about the
    checkpoint at ``location``: one of Spark's checkpoint error classes (from the class on:
    what comes before, `[STREAM_FAILED] Query [id = ..., runId = ...] terminated with
    exception: Job aborted due to stage failure: ...`, says nothing of the image), or a
    file under ``location`` that cannot be read. None for failures of the pipeline, its
    input or its sink."""
    names = {str(location), str(location.resolve())}  # Spark prints file:<absolute path>
    for line in error.splitlines():
        classes = [line.find(name) for name in CHECKPOINT_ERROR_CLASSES if name in line]
        if classes:
            start = min(classes)
            start -= line[start - 1 : start] == "["
            return line[start:].strip()[:MAX_REASON_CHARS]
        if _MISSING_LOG_ENTRY.search(line) or (
            any(name in line for name in names) and _FILE_READ_FAILURE.search(line)
        ):
            return line.strip()[:MAX_REASON_CHARS]
    return None


def _open(
    storage: CheckpointStorage, candidate: RestoreCandidate
) -> tuple[CheckpointMetadata, CheckpointStorage]:
    if candidate.metadata_uri is None:
        assert candidate.snapshot_id is not None
        return storage.read_metadata(candidate.kind, candidate.snapshot_id), storage
    uri = candidate.metadata_uri
    try:
        address = parse_snapshot_address(uri)
    except ValueError as error:
        raise StorageError(uri, str(error)) from None
    # Read through the storage seam (a missing file or credentials are a StorageError),
    # which also checks that the `_metadata` is of the snapshot its place names.
    source = CheckpointStorage(address.layout)
    if address.kind is CheckpointKind.CHECKPOINT and source.is_same_job_directory(storage):
        # The runtime names the registry's own as checkpoint:N: this one is garbage.
        raise UnregisteredCheckpointError(uri)
    return source.read_metadata(address.kind, address.snapshot_id), source


# transformWithState's operator metadata (`state/<op>/_metadata/v2/<batch>`) names its
# state schema files by absolute path: the live location the image was taken of.
_OPERATOR_METADATA_V2 = "state/*/_metadata/v2/*"
_SCHEMA_FILE_PATH = re.compile(r"^(?:file:)?.*/(state/\d+/_stateSchema/[^/]+/[^/]+)$")


def relocate_state_schema_paths(location: Path) -> None:
    """Point transformWithState's operator metadata in a restored ``location`` at its own
    schema files. Spark reads the schema files the newest metadata names, by absolute
    path: in a fresh location those of the image's live location, which the restore
    removed (Spark 4.3 failed: "File file:.../attempt-1/checkpoint/state/0/_stateSchema/
    default/0_<uuid> does not exist") or, where it still was, another location's."""
    for path in sorted(location.glob(_OPERATOR_METADATA_V2)):
        if not path.is_file() or path.name.startswith("."):
            continue
        try:
            version, _, rest = path.read_text().partition("\n")
            document = json.loads(rest)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise StorageError(str(path), "not operator metadata (v2): its JSON") from None
        stores = document.get("stateStoreInfo") if isinstance(document, dict) else None
        if not isinstance(stores, list):
            raise StorageError(str(path), "not operator metadata (v2): no stateStoreInfo")
        for store in stores:
            paths = store.get("stateSchemaFilePaths") if isinstance(store, dict) else None
            if not isinstance(paths, list):
                continue
            store["stateSchemaFilePaths"] = [_relocated(old, location) for old in paths]
        path.write_text(f"{version}\n{json.dumps(document, separators=(',', ':'))}")
        # Hadoop's checksum of the bytes as they were (an image a user copied by hand may
        # hold one) would refuse them now.
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)


def _relocated(schema_path: object, location: Path) -> object:
    match = _SCHEMA_FILE_PATH.match(schema_path) if isinstance(schema_path, str) else None
    if match is None:
        return schema_path
    return f"file:{location.resolve()}/{match[1]}"


def _give_new_query_id(location: Path) -> None:
    """A fork from another job's image is a new query: sinks that skip batch ids they
    saw must not mistake it for the old one."""
    metadata_file = location / SPARK_METADATA_FILE
    document = json.loads(metadata_file.read_text())
    if not isinstance(document, dict):
        raise StorageError(str(metadata_file), "Spark's metadata file is not a JSON object")
    document["id"] = str(uuid.uuid4())
    metadata_file.write_text(json.dumps(document))
