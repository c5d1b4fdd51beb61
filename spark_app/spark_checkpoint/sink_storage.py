"""Where `TransactionalFileSink` keeps its output: one directory on a local filesystem, S3,
Google Cloud Storage or Azure Blob Storage, reached through fsspec, with the one operation
a commit needs that an object store has and a rename-based design lacks: a create-only
write.

`OutputStorage` works on paths relative to the output directory (``committed/batch-3.json``).
The driver uses it for records and garbage collection; Spark's executors use
`write_partition` to write data objects, each opening the same directory from its URL.

Create-only writes (`OutputStorage.create`), each atomic with respect to a reader and to
another writer of the same name:

- local filesystem: the bytes go to a temporary file, are fsynced, and the file is
  hard-linked to its final name (``link(2)`` fails when the name exists), then the
  temporary name is removed and the directory fsynced;
- S3 (s3fs): ``PutObject`` with ``If-None-Match: *``;
- Google Cloud Storage (gcsfs): an upload with ``ifGenerationMatch=0``;
- Azure Blob Storage (adlfs): ``Put Blob`` with ``If-None-Match: *`` (``overwrite=False``).

A refused create raises FileExistsError in the three libraries (s3fs: when the 412 names its
condition, as AWS does; a 412 `PreconditionFailed` without it, as MinIO answers, is taken
for a refusal too). Other fsspec filesystems are
refused when the sink is created: fsspec's generic create-only write checks and then
writes, which is not atomic.

What a write killed midway leaves behind, and who removes it
(`OutputStorage.remove_unfinished_writes`):

- local filesystem: the hidden temporary ``.<name>.<uuid>.tmp`` of `OutputStorage.write` or
  `OutputStorage.create`, next to its target. Its writer holds a lock (``flock``) on it
  until the temporary name is gone, and the lock dies with the process, so a temporary
  whose lock can be taken is one whose writer is gone: only those are removed, at any
  time, even while another process writes. A data object (`write_partition`) is written
  under its final name: a partial one is an ordinary file that no record lists.
- S3: the multipart upload of a data object larger than s3fs's block size (50 MiB) whose
  task was killed: never listed as an object, kept (and billed) until aborted.
- Google Cloud Storage: the resumable upload of such a data object (gcsfs uploads one
  larger than its block size, 5 MiB, in parts), likewise invisible; left to the service,
  which forgets an unfinished one after 7 days.
- Azure Blob Storage: the uncommitted blocks of such a data object, likewise invisible;
  left to the service, which deletes uncommitted blocks after 7 days.

Importing this module does not import pyspark.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.request import url2pathname

from spark_checkpoint.storage.connections import open_url
from spark_checkpoint.storage.errors import printable_line
from spark_checkpoint.storage.filesystem import (
    abort_s3_uploads,
    delete_objects,
    local_file_sizes_refusing_links,
    require_named_account_reached,
    require_no_link_below,
)
from spark_checkpoint.storage.layout import (
    hide_password,
    is_safe_relative_path,
    remote_uri_problem,
)

__all__ = ["OutputStorage", "write_partition"]

logger = logging.getLogger(__name__)

_URI = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://(?P<authority>[^/]*)(?P<path>.*)")
# A URI missing a slash (`gs:/bucket/out`), which would otherwise be a local directory `gs:`.
_ONE_SLASH_URI = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*):/(?!/)")
# fsspec protocols whose create-only write is atomic (see the module docstring).
_OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"})
_FSYNC_UNSUPPORTED_ERRNOS = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF})
# What `SymbolicLinkError` says links are never followed out of.
_OUTPUT_DIRECTORY = "the sink's output directory"
# The hidden temporary of `OutputStorage.write` and `OutputStorage.create`, next to its target.
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")


def _output_url(output_dir: str | os.PathLike[str]) -> tuple[str, bool]:
    """The output directory as fsspec's URL (an absolute path when local), and whether it
    is local. Refuses what has no atomic create-only write, before anything is written:
    a URI of such a filesystem would otherwise become a local directory named after its
    scheme (``gs:/bucket/...``)."""
    text = os.fspath(output_dir)
    if not text:
        raise ValueError("TransactionalFileSink's output '' is empty: give a local path or a URI")
    uri = _URI.fullmatch(text)
    if uri is None:
        if typo := _ONE_SLASH_URI.match(text):
            if typo["scheme"].lower() == "file":  # file:/path, RFC 8089's short form
                return os.path.abspath(url2pathname(text[typo.end() - 1 :])), True
            meant = hide_password(f"{typo['scheme']}://{text[typo.end() :]}")
            shown = meant.replace("://", ":/", 1)
            raise ValueError(
                f"TransactionalFileSink's output {shown!r} has one slash after its scheme: "
                f"write {meant}"
            )
        return os.path.abspath(text), True
    scheme = uri["scheme"].lower()
    if scheme == "file" and uri["authority"] in ("", "localhost"):
        return os.path.abspath(url2pathname(uri["path"])), True
    if scheme in _OBJECT_STORE_SCHEMES and uri["authority"]:
        if uri["scheme"] != scheme:  # fsspec: "Protocol not known: S3"
            raise ValueError(
                f"TransactionalFileSink's output {hide_password(text)!r} has its scheme in "
                f"capitals: write {scheme}://, the storage libraries know no other spelling"
            )
        if problem := remote_uri_problem(text):
            raise ValueError(f"TransactionalFileSink's output {hide_password(text)!r} {problem}")
        return text.rstrip("/"), False
    raise ValueError(
        f"TransactionalFileSink cannot commit atomically to {hide_password(text)!r}: its output "
        "must be a local path (on a cluster a volume every executor mounts at the same path), an "
        "s3:// or s3a:// URI, a gs:// URI, or an abfs://, abfss:// or az:// URI"
    )


class OutputStorage:
    """One sink's output directory. Paths are relative to it, ``/``-separated.

    A missing file reads as ``None`` and a missing directory lists as empty; deleting what
    is already gone is not an error, so every step can be repeated after a crash.
    Listings bypass fsspec's listings cache: another driver may have changed the store.

    On a local filesystem no path below the output directory is followed through a
    symbolic link: each operation whose path crosses one, and a listing that meets one,
    raises SymbolicLinkError (a link placed there would otherwise have a write or the
    garbage collection of `on_restore` reach files outside it).
    """

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        self.url, self.is_local = _output_url(output_dir)
        fs, root = open_url(self.url, use_listings_cache=False)
        _require_create_only_writes(fs, self.url)
        require_named_account_reached(fs, self.url)
        self._fs: Any = fs
        self._root: str = root.rstrip("/")

    def native(self, path: str) -> str:
        """`path` as the filesystem's own path (refused if local and it crosses a link)."""
        if not path:
            return self._root
        native = f"{self._root}/{path}"
        if self.is_local:
            require_no_link_below(self._root, native, _OUTPUT_DIRECTORY)
        return native

    def read(self, path: str, at_most: int | None = None) -> bytes | None:
        """The content of the file at `path`, or None if there is none. With `at_most`, its
        first `at_most` bytes only (a file that can only be refused when larger is never
        read whole, nor a store's read-ahead block of it), and IsADirectoryError if it is
        not a regular file (a directory, a prefix of objects)."""
        native = self.native(path)
        try:
            if at_most is None:
                data: bytes = self._fs.cat_file(native)
                return data
            info = self._fs.info(native)
            if info.get("type") != "file":
                raise IsADirectoryError(f"{self.url}/{path}: not a regular file")
            # Ranged even when it was small (it may have been replaced since); but no range
            # of an empty object, which stores refuse.
            data = self._fs.cat_file(native, end=at_most) if info.get("size") else b""
        except FileNotFoundError:
            return None
        return data

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self.native(path)))

    def write(self, path: str, data: bytes) -> None:
        """Write `path` atomically, replacing what is there."""
        native = self.native(path)
        if not self.is_local:
            self._fs.pipe_file(native, data)
            return
        with _locked_temporary(native, data) as temporary:
            os.replace(temporary, native)
        _fsync_directory(os.path.dirname(native))

    def create(self, path: str, data: bytes) -> bool:
        """Create `path` with `data` unless it exists, atomically (see the module
        docstring); True if this call created it."""
        native = self.native(path)
        if not self.is_local:
            try:
                self._fs.pipe_file(native, data, mode="create")
            except FileExistsError:
                return False
            except OSError as error:
                if _precondition_failed(error):
                    return False
                raise
            return True
        with _locked_temporary(native, data) as temporary:
            try:
                os.link(temporary, native)
            except FileExistsError:
                return False
        _fsync_directory(os.path.dirname(native))
        return True

    def list_names(self, directory: str) -> list[str]:
        """Names of the entries (files and subdirectories) directly in `directory`."""
        try:
            entries = self._fs.ls(self.native(directory), detail=False)
        except FileNotFoundError:
            return []
        return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries})

    def find(self, directory: str) -> list[str]:
        """Paths (relative to the output directory) of every file below `directory`."""
        base = self.native(directory).rstrip("/")
        if self.is_local:
            below = local_file_sizes_refusing_links(base, _OUTPUT_DIRECTORY)
            return sorted(f"{directory}/{relative}" for relative in below)
        try:
            found = self._fs.find(base)
        except FileNotFoundError:
            return []
        prefix = base[len(self._root) + 1 :]
        paths = sorted(f"{prefix}/{entry[len(base) + 1 :]}" for entry in found)
        # An object store's keys are plain strings: `..` segments in one (no sink writes
        # any) could name, or be sent as, an object outside the output directory.
        if strays := [path for path in paths if not is_safe_relative_path(path)]:
            logger.warning(
                "%s: %d object key(s) that are no path below it ('.', '..' or empty "
                "segments) are left alone, e.g. %s",
                self.url,
                len(strays),
                printable_line(strays[0]),
            )
        return [path for path in paths if path not in strays]

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the files `paths`; on a local filesystem also the directories left empty."""
        natives = [self.native(path) for path in paths]
        if not natives:
            return
        if not self.is_local:
            delete_objects(self._fs, natives)
            return
        for native in natives:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(native)
        for directory in sorted({os.path.dirname(native) for native in natives}, reverse=True):
            _remove_empty_directories(directory, stop=self._root)

    def write_lines(self, path: str, lines: Iterable[str]) -> int:
        """Write a new file `path` of `lines`, each ended by a newline; its size. Not
        atomic on a local filesystem (only a record makes the file part of the output),
        but durable there once this returns."""
        native = self.native(path)
        size = 0
        if self.is_local:
            os.makedirs(os.path.dirname(native), exist_ok=True)
            with open(native, "xb") as target:
                for line in lines:
                    size += target.write((line + "\n").encode("utf-8"))
                target.flush()
                os.fsync(target.fileno())
        else:
            with self._fs.open(native, "wb") as target:
                for line in lines:
                    size += target.write((line + "\n").encode("utf-8"))
        return size

    def sync_tree(self, directory: str) -> None:
        """Make the names of the files below `directory` durable (`write_lines` flushed
        their bytes). Only a local filesystem needs it: an upload is durable once done."""
        if not self.is_local:
            return
        for parent, _dirs, _files in os.walk(self.native(directory), topdown=False):
            _fsync_directory(parent)
        _fsync_directory(os.path.dirname(self.native(directory)))

    def remove_unfinished_writes(self, directory: str) -> int:
        """Remove what writes killed midway left in `directory` and that no listing shows
        (see the module docstring); how many. On a local filesystem the temporaries directly
        in `directory` whose writer is gone: safe while others write. On S3 every unfinished
        multipart upload below `directory`: call it only when nothing writes there. Nothing
        on GCS and Azure, whose unfinished uploads expire."""
        if self.is_local:
            return _remove_abandoned_temporaries(self.native(directory))
        return abort_s3_uploads(self._fs, self.native(directory))


# The name of each data object `write_partition` writes: its partition and a fresh uuid.
DATA_OBJECT_PATTERN = re.compile(r"part-[0-9]{5,}-[0-9a-f]{32}\.json")


def write_partition(
    output_url: str, directory: str, partition: int, lines: Iterator[str]
) -> list[tuple[str, int]]:
    """Write one partition's JSON lines as one object in `directory` (runs in a Spark task).

    Returns ``[(path, size)]``, or ``[]`` for an empty partition (no object). The name is
    unique per task attempt, so a retried task never writes over an object a finished
    attempt reported; what a failed attempt leaves is garbage no record lists.
    """
    first = next(lines, None)
    if first is None:
        return []
    path = f"{directory}/part-{partition:05d}-{uuid.uuid4().hex}.json"
    size = OutputStorage(output_url).write_lines(path, itertools.chain([first], lines))
    return [(path, size)]


def _require_create_only_writes(fs: Any, url: str) -> None:
    """Refuse gcsfs's experimental filesystem (zonal and hierarchical-namespace buckets),
    whose create-only write on a zonal bucket overwrites: `spark_checkpoint` turns it off
    unless the user's environment turned it on, or gcsfs was imported first."""
    # By name: gcsfs is in the spark image only, and the operator's holds this module too.
    if any(kind.__name__ == "ExtendedGcsFileSystem" for kind in type(fs).__mro__):
        raise ValueError(
            f"TransactionalFileSink cannot commit atomically to {hide_password(url)!r} with "
            "gcsfs's experimental filesystem, whose create-only write overwrites on a zonal "
            "bucket: set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, or import spark_checkpoint "
            "before gcsfs"
        )


def _precondition_failed(error: OSError) -> bool:
    """Whether S3 refused a create-only write (its only condition: the key exists) in a
    way s3fs does not take for FileExistsError: a `412 PreconditionFailed` without the
    `<Condition>If-None-Match</Condition>` that AWS adds and MinIO leaves out."""
    response = getattr(error.__cause__, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return bool(response.get("Error", {}).get("Code") == "PreconditionFailed" or status == 412)


@contextlib.contextmanager
def _locked_temporary(native: str, data: bytes) -> Iterator[str]:
    """A fsynced file holding `data`, hidden next to `native` (same filesystem), for the
    body to link or rename into place. It is locked until it is removed, after the body."""
    directory, name = os.path.split(native)
    os.makedirs(directory, exist_ok=True)
    while True:
        temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            removed = os.fstat(descriptor).st_nlink == 0
        except BaseException:
            os.close(descriptor)  # what is left has a free lock: removed as abandoned
            raise
        if not removed:
            break
        # Removed between its creation and our lock, as one whose writer was gone.
        os.close(descriptor)
    with os.fdopen(descriptor, "wb") as target:  # closing it releases the lock
        try:
            target.write(data)
            target.flush()
            os.fsync(target.fileno())
            yield temporary
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


def _remove_abandoned_temporaries(directory: str) -> int:
    """Remove the temporaries in `directory` whose writer is gone (their lock is free);
    how many. One is removed while holding its lock, so that a writer that locks it
    afterwards finds it unlinked and makes another."""
    try:
        names = [entry.name for entry in os.scandir(directory) if _TEMPORARY.fullmatch(entry.name)]
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(directory, name)
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # its writer finished
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its writer is alive
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += 1
        finally:
            os.close(descriptor)
    return removed


def _remove_empty_directories(directory: str, stop: str) -> None:
    """Remove `directory` and its parents up to (not including) `stop` while empty."""
    while directory.startswith(stop + "/"):
        try:
            os.rmdir(directory)
        except OSError:
            return
        _fsync_directory(os.path.dirname(directory))
        directory = os.path.dirname(directory)


def _fsync_directory(directory: str) -> None:
    """Make the names in `directory` durable. Skipped where directories cannot be opened
    or flushed (Windows; filesystems answering EINVAL), which offer no other way."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except (PermissionError, IsADirectoryError, FileNotFoundError):
        return
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in _FSYNC_UNSUPPORTED_ERRNOS:
            raise
    finally:
        os.close(descriptor)
