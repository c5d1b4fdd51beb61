"""The storage operations checkpoints need, as a thin seam over fsspec.

Everything else in this package does storage I/O through `StorageFileSystem`, so adding a
Hadoop-compatible object store is a matter of installing its fsspec implementation (and,
where its semantics differ, adjusting this module only).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import posixpath
import re
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import fsspec.asyn
from fsspec.implementations.local import LocalFileSystem

from .connections import open_url, protocols_of
from .durability import fsync_descriptor, fsync_path, make_files_durable
from .errors import (
    GCS_REQUEST,
    STORAGE_DIRECTORY,
    ChecksumMismatchError,
    MissingFileError,
    NotARegularFileError,
    StorageAccessError,
    StorageError,
    SymbolicLinkError,
    first_line,
    is_missing_bucket,
    joined_lines,
    printable_line,
)
from .layout import GLOB_CHARACTERS, hide_password

logger = logging.getLogger(__name__)

_CHUNK_SIZE = 1024 * 1024
# A hard link failing with one of these means "not possible here" (another device, a
# file owned by someone else under protected_hardlinks, too many links, no link support):
# copying is then the right thing to do. Any other error is a real failure.
_LINK_FALLBACK_ERRNOS = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP}
)

_Result = TypeVar("_Result")


@dataclass(frozen=True)
class FileDigest:
    """Size in bytes and SHA-256 (lower-case hex) of a file's content."""

    size: int
    sha256: str

    def require_match(self, expected: FileDigest, path: str) -> None:
        """Raise ChecksumMismatchError about `path` unless this digest equals `expected`.

        The size is compared first: it is what a truncated copy gets wrong.
        """
        if self.size != expected.size:
            raise ChecksumMismatchError(
                path, "size", f"{expected.size} bytes", f"{self.size} bytes"
            )
        if self.sha256 != expected.sha256:
            raise ChecksumMismatchError(path, "sha256", expected.sha256, self.sha256)


def digest_local_file(path: str) -> FileDigest:
    """Size and SHA-256 of a local file, read in one streaming pass."""
    with open(path, "rb") as source:
        return _stream_digest(_reads_naming(source, path), write=None)


class StorageFileSystem:
    """The few storage operations the checkpoint format needs, over one fsspec filesystem.

    Paths are URIs or paths of the wrapped filesystem (`file:///x`, `/x`, `s3://b/x`).
    Missing files are reported as MissingFileError; deleting something that is already
    gone is not an error, so every delete can be repeated after a crash.

    Atomicity of writes, which is what keeps a partially written file from ever appearing
    under its final name:

    - Local filesystem: bytes go to a temporary file in the destination directory, are
      fsynced, and the temporary file is renamed over the destination (`os.replace`);
      the directory is fsynced so the rename survives a power loss.
    - Object stores (S3, GCS, ABFS, ...): a single put (`pipe_file` / `put_file`). An
      object becomes visible only when its upload completes, so a put is atomic per
      object. A filesystem that is neither (e.g. HDFS, where a file is visible while
      being written) would need a write-then-rename branch here.

    Errors: a missing file is MissingFileError; any other failure of the storage library
    (no credentials, an endpoint that does not answer, a refused request: each library has
    its own exception classes) is StorageAccessError naming the path, or an OSError.

    Symbolic links: below the directory given as `confined_to` (the storage root, so the
    namespace's and the job's directories too), no path is followed through a symbolic
    link. Every operation whose path crosses one, and a listing that meets one, raises
    SymbolicLinkError instead: a link placed there could otherwise make a delete or a read
    reach files outside the job's directory. Reads, writes and deletes open their file's
    directory from the boundary down by descriptors, never following a link, so a link
    swapped in after the check (another writer on a shared volume) is refused as well.
    (Object stores have no links.)
    """

    def __init__(self, fs: Any, confined_to: str | None = None) -> None:
        self._fs = fs
        self._is_local = isinstance(fs, LocalFileSystem)
        self._boundary = (
            None if confined_to is None else self._fs._strip_protocol(confined_to).rstrip("/")
        )

    @classmethod
    def for_url(cls, url: str, *, fresh: bool = False) -> StorageFileSystem:
        """The filesystem fsspec resolves for `url` (a URI or a local path).

        Without fsspec's listings cache: every listing and existence check asks storage,
        which another process (a cleanup pod, the next driver) may have changed. With
        `fresh`, not fsspec's instance either, which holds the credentials of the
        environment it was made in (adlfs reads them as it is made).
        """
        fs, _ = open_url(url, use_listings_cache=False, skip_instance_cache=fresh)
        require_named_account_reached(fs, url)
        return cls(fs)

    def confined(self, directory: str) -> StorageFileSystem:
        """This filesystem, refusing symbolic links below `directory` (see the class).
        Raises ValueError for a `directory` whose paths fsspec places elsewhere than below
        it (`file://` is the working directory, `file:///x` is `/x`): no link would be
        checked on them."""
        confined = StorageFileSystem(self._fs, confined_to=directory)
        below = self._fs._strip_protocol(f"{directory.rstrip('/')}/x")
        if not below.startswith(f"{confined._boundary}/"):
            raise ValueError(f"{directory!r} names no directory that paths below it lie in")
        return confined

    @property
    def is_local(self) -> bool:
        """True if storage is the local filesystem (atomic renames and hard links work)."""
        return self._is_local

    def local_path(self, path: str) -> str | None:
        """`path` as the local filesystem names it; None on an object store."""
        return self._native(path) if self._is_local else None

    def place(self, path: str) -> tuple[str, str, str]:
        """Where `path` is, however it is spelled (a path or a ``file://`` URI, ``s3://`` or
        ``s3a://``, through a linked directory): the filesystem's protocol, the Azure
        account (which the path drops: ``abfs://c@account.dfs.core.windows.net/p`` is
        ``c/p``): the one the URI names, else the one the client reaches (a connection
        string's), lowercased; and the path as it names it, resolved on a local filesystem."""
        protocol = self._fs.protocol
        native: str = self._fs._strip_protocol(path)
        named = self._fs._get_kwargs_from_urls(path).get("account_name")
        reached = getattr(getattr(self._fs, "service_client", None), "account_name", None)
        account = next((a for a in (named, reached) if isinstance(a, str)), "")
        return (
            protocol if isinstance(protocol, str) else protocol[0],
            account.lower(),
            os.path.realpath(native) if self._is_local else native.rstrip("/"),
        )

    def abort_unfinished_uploads(self, directory: str) -> int:
        """Abort every unfinished S3 multipart upload below `directory` (an upload killed
        midway: no listing shows it, and it is kept and billed until aborted); how many.
        Call it only while nothing uploads there. Nothing to do on other storage: a local
        file is a file, and Azure deletes uncommitted blocks after 7 days. PermissionError
        when the store refuses to list or abort uploads."""
        with _storage_errors(directory):
            return abort_s3_uploads(self._fs, self._native(directory))

    def require_no_link(self, path: str) -> None:
        """Raise SymbolicLinkError if `path` goes through a link (see the class docstring);
        for checking every path of a multi-step delete before the first step."""
        self._native(path)

    def read_bytes(self, path: str, at_most: int | None = None) -> bytes:
        """The content of the file at `path`: all of it, or its first `at_most` bytes (a
        caller that bounds what it takes asks for one more byte than it accepts), read no
        further."""
        with _storage_errors(path):
            native = self._native(path)
            try:
                if self._is_local:
                    with self._open_local(native, path) as source:
                        return source.read(-1 if at_most is None else at_most)
                if at_most is None:
                    whole: bytes = self._fs.cat_file(native)
                    return whole
                return self._read_object_range(native, at_most)
            except FileNotFoundError as error:
                raise MissingFileError(path, "no such file") from error

    def _read_object_range(self, native: str, at_most: int) -> bytes:
        """An object's first `at_most` bytes, in one ranged request. S3 and Azure refuse
        any range of an empty object (InvalidRange): only then is its size asked."""
        if at_most <= 0:  # an empty range is none to the stores (moto sent all of it)
            return b""
        try:
            data: bytes = self._fs.cat_file(native, start=0, end=at_most)
        except FileNotFoundError:
            raise
        except Exception as error:
            refused = error
        else:
            return data
        # The refusal is what is told when the size cannot be had either: a HEAD's says
        # less (S3 answers one without a reason).
        with contextlib.suppress(Exception):
            if self._fs.size(native) == 0:
                return b""
        raise refused

    def missing_bucket(self, path: str) -> str | None:
        """On an object store, the bucket (S3) or container (Azure) `path` lies in when it
        does not exist; None when it does, and on other storage (one listing of `path`).
        Below a missing bucket the other operations find nothing, as below a missing
        directory."""
        if self._is_local:
            return None
        with _storage_errors(path):
            native = self._native(path)
            try:
                self._fs.ls(native, detail=False)
            except FileNotFoundError as error:
                if is_missing_bucket(error):
                    bucket: str = self._fs.split_path(native)[0]
                    return bucket
        return None

    def exists(self, path: str) -> bool:
        """True if a file or directory exists at `path`."""
        with _storage_errors(path):
            return bool(self._fs.exists(self._native(path)))

    def file_size(self, path: str) -> int | None:
        """The size of the file at `path`, or None if there is no file there."""
        if self._is_local:
            return _local_file_size(self._natives([path])[0])
        with _storage_errors(path):
            try:
                info = self._fs.info(self._native(path))
            except FileNotFoundError:
                return None
        return int(info["size"]) if info["type"] == "file" else None

    def list_dir(self, path: str) -> list[str]:
        """Sorted names of the entries directly in the directory `path` ([] if it is absent),
        each once: an object store lists an object `x` and the prefix `x/` of others apart."""
        with _storage_errors(path):
            try:
                entries = self._fs.ls(self._native(path), detail=False)
            except FileNotFoundError:
                return []
        return sorted({posixpath.basename(entry.rstrip("/")) for entry in entries})

    def list_files(self, path: str) -> list[str]:
        """Sorted paths, relative to `path`, of all files below the directory `path`."""
        return sorted(self.list_file_sizes(path))

    def file_sizes(self, paths: Iterable[str], below: str) -> dict[str, int | None]:
        """The size of each file of `paths` (None: there is none, or it is not below the
        directory `below`): on a local filesystem a stat each, each directory checked for
        links once; on an object store one listing of `below` (a request per 1,000
        objects, where a size each is a request per file)."""
        paths = list(paths)
        base = below.rstrip("/")
        inside = [path for path in paths if path.startswith(base + "/")]
        if self._is_local:
            found = dict(zip(inside, map(_local_file_size, self._natives(inside)), strict=True))
        else:
            listed = self.list_file_sizes(base) if inside else {}
            found = {path: listed.get(path[len(base) + 1 :]) for path in inside}
        return {path: found.get(path) for path in paths}

    def list_file_sizes(self, path: str) -> dict[str, int]:
        """Sizes of all files below the directory `path`, by path relative to it ({} if it
        is absent): one listing."""
        with _storage_errors(path):
            base = self._native(path).rstrip("/")
            if self._is_local and self._boundary is not None:
                return local_file_sizes_refusing_links(base)
            found = self._fs.find(base, detail=True)
            sizes = {name[len(base) + 1 :]: int(info["size"]) for name, info in found.items()}
            # A zero-byte key ending in '/' is a "folder" (S3's and GCS's consoles, sync
            # tools put them), no file: listed as "" or "ab/".
            return {
                relative: size
                for relative, size in sizes.items()
                if size or not (relative == "" or relative.endswith("/"))
            }

    def delete_file(self, path: str) -> None:
        """Delete the file at `path`, if there is one."""
        self._delete_one(path)

    def delete_files(self, paths: Iterable[str]) -> None:
        """Delete the files `paths` that exist: one by one on a local filesystem (as
        `delete_file`), in few requests on an object store (`delete_objects`)."""
        paths = list(paths)
        if self._is_local:
            for path in paths:
                self._delete_one(path)
        elif paths:
            with _storage_errors(paths[0]):
                delete_objects(self._fs, [self._native(path) for path in paths])

    def delete_tree(self, path: str) -> None:
        """Delete the directory `path` and everything below it, if it exists."""
        with _storage_errors(path), contextlib.suppress(FileNotFoundError):
            native = self._native(path)
            if self._confines(native):
                with self._parent_directory(native) as (parent, name):
                    _remove_tree(parent, name, native)
            elif _is_s3(self._fs):
                # s3fs's recursive rm takes its own batches, which drop refusals.
                _delete_s3_objects(self._fs, self._fs.find(native, withdirs=True))
            elif _is_azure(self._fs):
                # What adlfs's recursive rm lists and deletes, with the keys checked between.
                found = self._fs.expand_path(native, recursive=True)
                _refuse_dot_segments(found, "abfs://")
                self._fs.rm(found, expand_path=False)
            else:
                self._fs.rm(native, recursive=True)

    def digest(self, path: str) -> FileDigest:
        """Size and SHA-256 of the stored file at `path`, read in one streaming pass."""
        return self._read_stream(path, lambda source: _stream_digest(source.read, write=None))

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write `data` as the file `path`, replacing it atomically (see the class docstring)."""
        with _storage_errors(path):
            native = self._native(path)
            if self._is_local:
                with self._directory_of(native) as (directory, name):
                    _replace_in(
                        directory,
                        name,
                        lambda target: target.write(data),
                        durable=True,
                        shown=native,
                    )
            else:
                self._fs.pipe_file(native, data)

    def copy_in(self, local_src: str, path: str, expected: FileDigest | None = None) -> FileDigest:
        """Copy the local file `local_src` to `path` atomically and return its digest.

        With `expected`, the copied bytes must match it (else ChecksumMismatchError naming
        `local_src`, and nothing is left at `path`): this catches a source file that
        changed after it was first hashed.
        """
        native = self._native(path)
        if not self._is_local:
            # A put reads the file itself, so the digest takes a separate (local) pass.
            digest = digest_local_file(local_src)
            if expected is not None:
                digest.require_match(expected, local_src)
            with _storage_errors(path):
                self._fs.put_file(local_src, native)
            return digest
        with open(local_src, "rb") as source, self._directory_of(native) as (directory, name):
            return _replace_in(
                directory,
                name,
                lambda target: _copy_verified(
                    source, target, expected, local_src, read_from=local_src, written_to=native
                ),
                durable=True,
                shown=native,
            )

    def link_in(
        self, local_src: str, path: str, expected: FileDigest, *, durable: bool = True
    ) -> None:
        """Make `path` a hard link to the local file `local_src`, or a copy if that is not
        possible (storage is not local, another device, no permission, ...).

        Only for files that are never modified in place: the link shares their bytes.
        Deleting `local_src` later does not affect the link. `expected` is the digest of
        `local_src`, checked when falling back to copying. Without `durable` the link is
        not fsynced: the caller makes many links durable at once (`make_durable`), since
        an fsync each costs milliseconds.
        """
        native = self._native(path)
        if not self._is_local:
            self.copy_in(local_src, path, expected)
            return
        with self._directory_of(native) as (directory, name):
            # Linked under a temporary name and renamed, because os.link cannot replace an
            # existing (e.g. damaged) file.
            temporary = _temporary_name(name)
            try:
                os.link(local_src, temporary, dst_dir_fd=directory)
            except OSError as error:
                if error.errno not in _LINK_FALLBACK_ERRNOS:
                    raise OSError(error.errno, error.strerror, native) from None
                linked = False
            else:
                linked = True
                if durable:
                    # Spark does not fsync its files; a checkpoint must survive a power loss.
                    with _removed_on_failure(directory, temporary):
                        fsync_path(temporary, dir_fd=directory)
                _rename_into_place(directory, temporary, name, durable=durable, shown=native)
        if not linked:
            self.copy_in(local_src, path, expected)

    def make_durable(self, paths: Iterable[str]) -> None:
        """Make the local files `paths` and their names survive a power loss: one syncfs
        of their filesystem, or fsyncs of them and their directories (`durability`);
        nothing to do on an object store, where a completed put is durable."""
        if self._is_local:
            make_files_durable(self._natives(paths))

    def copy_out(self, path: str, local_dst: str, expected: FileDigest | None = None) -> FileDigest:
        """Copy the stored file `path` to the local path `local_dst` atomically and return
        its digest.

        With `expected`, a stored file whose bytes do not match raises
        ChecksumMismatchError naming `path`, and nothing is left at `local_dst`. The copy
        is not fsynced: it is restored into a fresh directory, which is made again from
        storage if the machine goes down.
        """

        def copy(source: IO[bytes]) -> FileDigest:
            with _local_directory(local_dst) as (directory, name):
                return _replace_in(
                    directory,
                    name,
                    lambda target: _copy_verified(
                        source, target, expected, path, read_from=path, written_to=local_dst
                    ),
                    durable=False,
                    shown=local_dst,
                )

        return self._read_stream(path, copy)

    def _read_stream(self, path: str, consume: Callable[[IO[bytes]], _Result]) -> _Result:
        """`consume` applied to the stored file at `path`, open for reading."""
        with _storage_errors(path):
            native = self._native(path)
            try:
                if self._is_local:
                    source = self._open_local(native, path)
                else:
                    source = self._fs.open(native, "rb")
            except FileNotFoundError as error:
                raise MissingFileError(path, "no such file") from error
            with source:
                return consume(source)

    def _natives(self, paths: Iterable[str]) -> list[str]:
        """`_native` of each of the local `paths`, for many files in few directories: each
        directory is checked for links once, then each file itself."""
        natives: list[str] = []
        checked: set[str] = set()
        for path in paths:
            native: str = self._fs._strip_protocol(path)
            directory = posixpath.dirname(native)
            if directory not in checked:
                self._native(directory)
                checked.add(directory)
            if self._boundary is not None and native.startswith(self._boundary + "/"):
                require_no_link_below(directory, native)
            natives.append(native)
        return natives

    def _delete_one(self, path: str) -> None:
        with _storage_errors(path), contextlib.suppress(FileNotFoundError):
            native = self._native(path)
            if self._confines(native):
                with self._parent_directory(native) as (parent, name):
                    try:
                        os.unlink(name, dir_fd=parent)
                    except OSError as error:
                        raise _named(error, name, native) from None
            else:
                self._fs.rm_file(native)

    def _confines(self, native: str) -> bool:
        return (
            self._is_local
            and self._boundary is not None
            and native.startswith(self._boundary + "/")
        )

    def _open_local(self, native: str, path: str) -> IO[bytes]:
        """`_open_local_file`, below the boundary from a directory `_parent_directory`
        opened (a link swapped in after the check cannot redirect the read)."""
        if not self._confines(native):
            return _open_local_file(native, path)
        with self._parent_directory(native) as opened_from:
            return _open_local_file(native, path, opened_from=opened_from)

    @contextlib.contextmanager
    def _directory_of(self, native: str) -> Iterator[tuple[int, str]]:
        """The directory a write of the local `native` goes to, made if missing and
        opened, and the name in it: below the boundary as `_parent_directory` opens it."""
        if self._confines(native):
            with self._parent_directory(native, create=True) as found:
                yield found
        else:
            with _local_directory(native) as found:
                yield found

    @contextlib.contextmanager
    def _parent_directory(self, native: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """The directory holding the local `native` below the boundary, opened from the
        boundary down one component at a time without following a link (each made first
        if missing, with `create`), and the name in it: a link swapped in after `_native`
        checked the path cannot redirect a write or delete out of the confined directory
        (SymbolicLinkError)."""
        assert self._boundary is not None
        parent, name = posixpath.split(native)
        relative = parent[len(self._boundary) + 1 :]
        try:
            descriptor = os.open(self._boundary, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            if not create:
                raise
            os.makedirs(self._boundary, exist_ok=True)
            descriptor = os.open(self._boundary, os.O_RDONLY | os.O_DIRECTORY)
        try:
            current = self._boundary
            for part in relative.split("/") if relative else []:
                current = f"{current}/{part}"
                try:
                    below = _open_directory_in(descriptor, part, create=create)
                except OSError as error:
                    if error.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(current):
                        raise SymbolicLinkError(current, _link_target(current)) from None
                    # Named whole: relative to its directory, 'chk-9' said nothing.
                    raise OSError(error.errno, error.strerror, current) from None
                os.close(descriptor)
                descriptor = below
            yield descriptor, name
        finally:
            os.close(descriptor)

    def _native(self, path: str) -> str:
        # The wrapped filesystem's own form of the path: no protocol, absolute if local.
        native: str = self._fs._strip_protocol(path)
        if self._is_local and self._boundary is not None:
            require_no_link_below(self._boundary, native)
        return native


_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file that is no regular file is, by its mode: "a FIFO", "a directory", ..."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "an unknown kind of file")


def _open_local_file(
    native: str, path: str, *, opened_from: tuple[int, str] | None = None
) -> IO[bytes]:
    """The local file `native` (`path` as the caller names it; ``opened_from``: its
    directory, open, and its name there), open for reading; anything but a regular file is
    refused (NotARegularFileError) without a read: a FIFO's or a device's would never end.
    Opened non-blocking, so that a FIFO does not block the open itself waiting for a
    writer, and never through a link in its place (one swapped in after the path was
    checked: SymbolicLinkError)."""
    directory, name = opened_from or (None, native)
    try:
        descriptor = os.open(
            name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=directory
        )
    except OSError as error:
        if error.errno == errno.ELOOP and os.path.islink(native):
            raise SymbolicLinkError(native, _link_target(native)) from None
        if error.errno == errno.ENXIO:  # what opening a socket fails with
            raise NotARegularFileError(path, "a socket") from None
        raise _named(error, name, native) from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(path, file_kind(mode))
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def require_named_account_reached(fs: Any, url: str) -> None:
    """Raise ValueError if `url` names an Azure account (``abfs://c@account.dfs...``) other
    than the one the credentials reach: adlfs takes a connection string's account over the
    URI's, so the job would write to another account than its manifest names, without a
    word (an Azure newcomer's)."""
    named = fs._get_kwargs_from_urls(url).get("account_name")
    reached = getattr(getattr(fs, "service_client", None), "account_name", None)
    if not (isinstance(named, str) and isinstance(reached, str)):
        return
    # adlfs keeps more of the host than the account: `account.privatelink` (Private Link).
    named = named.split(".")[0]
    if named.lower() != reached.lower():
        raise ValueError(
            f"{hide_password(url)} names Azure account {named!r}, but the credentials "
            f"(AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME) reach account "
            f"{reached!r}"
        )


def delete_objects(fs: Any, natives: list[str]) -> None:
    """Delete the objects `natives` (paths of the fsspec object store `fs`) that exist, in
    few requests or at once: S3 takes 1,000 keys a request, GCS 100, Azure's deletes go out
    together. On GCS a key with '*', '?' or '[' (which nothing of ours writes) goes alone,
    as fsspec's rm reads such a path as a pattern (`batch-5/**` would take the objects
    beside it)."""
    if _is_s3(fs):
        _delete_s3_objects(fs, natives)
        return
    if _is_azure(fs):
        # adlfs's rm checks each path first, one request after another.
        _refuse_dot_segments(natives, "abfs://")
        fsspec.asyn.sync(fs.loop, _delete_each, fs, natives)
        return
    patterns = [native for native in natives if set(GLOB_CHARACTERS) & set(native)]
    with contextlib.suppress(FileNotFoundError):
        if plain := [native for native in natives if native not in patterns]:
            fs.rm(plain)
    _delete_one_by_one(fs, patterns)


# The most keys one S3 DeleteObjects request takes.
_S3_DELETE_BATCH = 1000
# What S3-compatible stores answer a DeleteObjects they do not take as botocore sends it
# (a CRC32 checksum, no Content-MD5: older MinIO, Ceph and others; s3fs#931): their
# objects are deleted one per request, as before batches.
_S3_BATCH_DELETE_REFUSED = frozenset(
    {"MissingContentMD5", "InvalidDigest", "BadDigest", "InvalidRequest", "NotImplemented"}
)
# The buckets that refused one, asked no more in this process.
_S3_ONE_BY_ONE: set[str] = set()


def _delete_s3_objects(fs: Any, natives: list[str]) -> None:
    """`delete_objects` on S3: DeleteObjects requests, each key's own refusal raised (s3fs's
    rm drops them: a key left behind would go unsaid)."""
    keys_by_bucket: dict[str, list[str]] = {}
    for native in natives:
        bucket, key, _version = fs.split_path(native)
        keys_by_bucket.setdefault(bucket, []).append(key)
        fs.invalidate_cache(native)
    for bucket, keys in keys_by_bucket.items():
        for start in range(0, len(keys), _S3_DELETE_BATCH):
            batch = keys[start : start + _S3_DELETE_BATCH]
            if bucket in _S3_ONE_BY_ONE:
                _delete_s3_one_by_one(fs, bucket, batch)
                continue
            try:
                answer = fs.call_s3(
                    "delete_objects",
                    Bucket=bucket,
                    Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
                )
            except Exception as error:
                if (code := _s3_error_code(error)) not in _S3_BATCH_DELETE_REFUSED:
                    raise
                logger.info("s3://%s takes no batched delete (%s): one per request", bucket, code)
                _S3_ONE_BY_ONE.add(bucket)
                _delete_s3_one_by_one(fs, bucket, batch)
                continue
            refused = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if refused:
                first = refused[0]
                denied = first.get("Code") == "AccessDenied"
                raise (PermissionError if denied else OSError)(
                    errno.EACCES if denied else errno.EIO,
                    f"{len(refused)} of {len(batch)} object(s) not deleted, e.g. this one: "
                    f"{first.get('Code')}: {first.get('Message')}"
                    + (" (is s3:DeleteObject granted?)" if denied else ""),
                    f"s3://{bucket}/{first.get('Key')}",
                )


def _delete_s3_one_by_one(fs: Any, bucket: str, keys: list[str]) -> None:
    """Delete `keys` of `bucket` by a request each (`_refuse_dot_segments` first: a batch
    names keys in its body, a request of its own in its path)."""
    _refuse_dot_segments(keys, f"s3://{bucket}/")
    _delete_one_by_one(fs, [f"{bucket}/{key}" for key in keys])


def _refuse_dot_segments(keys: list[str], shown_after: str) -> None:
    """Refuse, before any is deleted, a key with a '.' or '..' segment (which nothing of ours
    writes): deleted by a request naming it in its path, the client, a proxy or the store
    may resolve it to another object (adlfs's client does: another job's)."""
    if unsafe := [key for key in keys if {".", ".."} & set(key.split("/"))]:
        raise OSError(
            errno.EINVAL,
            "a key with a '.' or '..' segment, which a request deleting it could have "
            "resolved to another object: not deleted; delete it by hand",
            shown_after + max(unsafe, key=len),  # an object's, not a prefix's
        )


def _delete_one_by_one(fs: Any, natives: list[str]) -> None:
    for native in natives:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(native)


def _s3_error_code(error: Exception) -> str | None:
    """S3's code of `error` (botocore's ClientError, or what s3fs made of one)."""
    for cause in (error, error.__cause__):
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return code if isinstance(code, str) else None
    return None


async def _delete_each(fs: Any, natives: list[str]) -> None:
    """Delete each of `natives` by a request of its own, all at once; the first refusal is
    raised naming its object."""

    async def delete(native: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await fs._rm_file(native)

    results = await asyncio.gather(*map(delete, natives), return_exceptions=True)
    for native, result in zip(natives, results, strict=True):
        if isinstance(result, Exception):
            with _storage_errors(native):
                raise result


def _is_s3(fs: Any) -> bool:
    return "s3" in protocols_of(fs)  # s3fs's are ("s3", "s3a")


def _is_azure(fs: Any) -> bool:
    return "abfs" in protocols_of(fs)


def abort_s3_uploads(fs: Any, native_directory: str) -> int:
    """Abort the unfinished multipart uploads below `native_directory` if the fsspec
    filesystem `fs` is S3 (s3fs); how many. Other storage has none to abort."""
    if not _is_s3(fs):
        return 0
    bucket, prefix, _version = fs.split_path(native_directory)
    aborted = 0
    markers: dict[str, str] = {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=f"{prefix}/", **markers)
        for upload in page.get("Uploads", []):
            fs.abort_mpu(bucket, upload["Key"], upload["UploadId"])
            aborted += 1
        # A store that says "truncated" without the markers to go on would repeat the page.
        next_key, next_upload = page.get("NextKeyMarker"), page.get("NextUploadIdMarker")
        if not page.get("IsTruncated") or not next_key:
            return aborted
        markers = {
            "KeyMarker": next_key,
            **({"UploadIdMarker": next_upload} if next_upload else {}),
        }


@contextlib.contextmanager
def _storage_errors(path: str) -> Iterator[None]:
    """Any error of the storage library as StorageAccessError naming `path`, except the
    OSErrors (FileNotFoundError, PermissionError, ...) that fsspec libraries translate
    their errors to: callers handle StorageError and OSError, not each library's own
    classes (botocore's NoCredentialsError, Azure's ClientAuthenticationError, ...)."""
    try:
        yield
    except StorageError:
        raise
    except OSError as error:
        if not error.filename:
            _name_path(error, path)
        raise
    except Exception as error:
        raise StorageAccessError(path, _with_endpoint_origin(error, _reason(error))) from error


# The errno of each OSError an fsspec library raises without one (s3fs: PermissionError
# ("Access Denied")), for the message to name the path: "[Errno None]" would say nothing.
_ERRNO_OF: dict[type[OSError], int] = {
    PermissionError: errno.EACCES,
    FileNotFoundError: errno.ENOENT,
    FileExistsError: errno.EEXIST,
    TimeoutError: errno.ETIMEDOUT,  # fsspec's FSTimeoutError, s3fs's RequestTimeout
}
# gcsfs's 403: "Forbidden: <request>" (`GCS_REQUEST`), GCS's message on the next line.
_GCS_FORBIDDEN = re.compile(r"Forbidden: (?P<request>\S*)\n?(?P<message>.*)", re.DOTALL)
# The errno of a GCS status in a batch delete's error (gcsfs gives the answer's JSON).
_ERRNO_OF_STATUS = {403: errno.EACCES, 404: errno.ENOENT, 401: errno.EACCES}


def _name_path(error: OSError, path: str) -> None:
    """Make `error`, which names no file (an object store's, as s3fs translates it from the
    service's answer), name `path`; in place, so that its class and causes stay what callers
    and `is_missing_bucket` look at. A bare 403 says what it may mean."""
    said, status = _said(error)
    if error.errno is None:
        error.errno = _ERRNO_OF_STATUS.get(status or 0) or _errno_of(type(error))
    if error.strerror is None:
        # s3fs's FileNotFoundError(path) says nothing but the path.
        error.strerror = os.strerror(error.errno) if not said or path.endswith(said) else said
    if _is_bare_refusal(error):
        error.strerror = (
            f"{error.strerror} (an HTTP 403 without a reason, as S3 answers a HEAD request: "
            "the credentials are wrong, the clock is off, or a policy refuses s3:GetObject "
            "on this path, or s3:ListBucket on its bucket, without which a missing object is "
            "answered 403)"
        )
    error.filename = path


def _errno_of(kind: type[OSError]) -> int:
    return next((code for base in kind.__mro__ if (code := _ERRNO_OF.get(base))), errno.EIO)


def _said(error: OSError) -> tuple[str, int | None]:
    """What `error` says, and the HTTP status it names, if any. gcsfs's errors name their
    request instead (a 404's, a 412's), or say "Forbidden: <request>" with GCS's message on
    the next line, or are the JSON of a batch delete's answer: said as GCS's message."""
    said = str(error.args[0]) if error.args else ""
    if GCS_REQUEST.fullmatch(said):
        return "", None
    forbidden = _GCS_FORBIDDEN.fullmatch(said)
    if forbidden and GCS_REQUEST.fullmatch(forbidden["request"]):
        message = printable_line(forbidden["message"].strip())
        return (f"Forbidden: {message}" if message else "Forbidden"), 403
    if said.startswith("{"):
        with contextlib.suppress(ValueError, KeyError, TypeError):  # other JSON: as said
            answer = json.loads(said)["error"]
            return printable_line(str(answer["message"])), int(answer["code"])
    return said, None


def _is_bare_refusal(error: OSError) -> bool:
    """Whether S3 refused the request `error` was translated from without saying why (the
    answer to a HEAD request has no body, so botocore's error code is the HTTP status)."""
    response = getattr(error.__cause__, "response", None)  # botocore's ClientError
    return isinstance(response, dict) and response.get("Error", {}).get("Code") == "403"


def _reason(error: Exception) -> str:
    """The storage library's error in one line. Azure's message holds the service's
    answer twice, in lines and as the XML it came as: its first line and its code say it.
    gcsfs's ends in the HTTP status, which is said as such; a token google-auth could not
    get (a key file's, Workload Identity's) gcsfs raises as GCS's 401, after its retries."""
    code = getattr(error, "error_code", None)  # azure-core's HttpResponseError
    if isinstance(code, str) and code:
        name = getattr(code, "value", code)  # azure-storage's StorageErrorCode, a str enum
        # Only its details say why a SAS or a clock was refused (AuthenticationErrorDetail).
        details = getattr(error, "additional_info", None)
        told = [printable_line(f"{key}: {value}") for key, value in (details or {}).items()]
        return f"{type(error).__name__}: {first_line(error)} ({'; '.join([name, *told])})"
    status, message = getattr(error, "code", None), getattr(error, "message", None)
    if isinstance(status, int) and isinstance(message, str):  # gcsfs's HttpError
        cause = error.__cause__
        if cause is not None and type(cause).__name__ == "RefreshError":  # gcsfs: "a 401"
            why = cause.args[0] if cause.args and isinstance(cause.args[0], str) else cause
            return (
                f"the credentials could not get a token (google-auth's RefreshError: "
                f"{printable_line(str(why))}); no request reached GCS"
            )
        said = message.removesuffix(f", {status}")  # which it appends to the service's
        return f"{type(error).__name__}: {printable_line(said)} (HTTP {status})"
    return f"{type(error).__name__}: {joined_lines(error)}"


# botocore's errors of an endpoint it cannot resolve or reach.
_S3_ENDPOINT_ERRORS = ("EndpointConnectionError", "EndpointResolutionError", "ConnectTimeoutError")
# Where botocore takes a custom S3 endpoint from, the first set winning.
_S3_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def _with_endpoint_origin(error: Exception, reason: str) -> str:
    """`reason`, for an S3 endpoint that cannot be resolved or reached, with where the
    endpoint came from (a typo in a variable, a trailing space, looked like a store that is
    down) and without the password botocore echoes in it."""
    # botocore refuses some endpoints as it builds its client, with a ValueError ("Invalid
    # endpoint: ...", "Invalid IPv6 URL").
    refused_as_built = isinstance(error, ValueError) and re.search(r"(?i)endpoint|url", str(error))
    if type(error).__name__ not in _S3_ENDPOINT_ERRORS and not refused_as_built:
        return reason
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return f"{reason} (AWS_IGNORE_CONFIGURED_ENDPOINT_URLS is set: the endpoint is AWS's)"
    for variable in _S3_ENDPOINT_VARIABLES:
        if endpoint := os.environ.get(variable):  # botocore passes over an empty one
            shown = hide_password(endpoint)
            return f"{reason.replace(endpoint, shown)} (the endpoint is {variable}'s: {shown!r})"
    return (
        f"{reason} (no AWS_ENDPOINT_URL is set: the endpoint is AWS's or the AWS config's "
        "endpoint_url)"
    )


def require_no_link_below(boundary: str, native: str, within: str = STORAGE_DIRECTORY) -> None:
    """Raise SymbolicLinkError if a component of `native` below `boundary` (`within` says
    what it is) is a link."""
    if not native.startswith(boundary + "/"):
        return
    current = boundary
    for part in native[len(boundary) + 1 :].split("/"):
        current = f"{current}/{part}"
        try:
            mode = os.lstat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing further down exists, so nothing there is a link
        if stat.S_ISLNK(mode):
            raise SymbolicLinkError(current, _link_target(current), within)


# Opens a directory to remove what is in it: never through a link (ELOOP), never a file
# (ENOTDIR), and without waiting on a FIFO swapped in for it.
_DIRECTORY_TO_EMPTY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK


def _remove_tree(parent: int, name: str, path: str) -> None:
    """Remove `name` in the directory open as `parent` and, if it is a directory, all
    below it, by file descriptors: a link anywhere (one placed after the paths were
    checked included) is removed, never followed. Python 3.11's ``shutil.rmtree`` with
    ``dir_fd`` opens each directory without O_NOFOLLOW and O_NONBLOCK (a link swapped in
    for one raised OSError, one to a FIFO hung the delete). `path` is what `name` is, for
    an error to name. Depth first without recursion: a tree thousands of directories deep
    (anything may write below a job's storage) is removed too, holding one descriptor per
    level."""
    # Each level below `name`: its descriptor, its name and its entries still to remove.
    levels: list[tuple[int, str, list[str]]] = []
    current = name  # what an error names, relative to the deepest level's directory
    try:
        try:
            opened = _open_to_empty(parent, name)
            if opened is None:
                return
            levels.append((opened, name, []))  # before it is listed: closed if that fails
            levels[-1][2].extend(_entries(opened))
            while levels:
                directory, own_name, entries = levels[-1]
                if entries:
                    current = entries.pop()
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                        if (child := _open_to_empty(directory, current)) is not None:
                            levels.append((child, current, []))
                            levels[-1][2].extend(_entries(child))
                    continue
                levels.pop()
                os.close(directory)
                current = own_name
                os.rmdir(own_name, dir_fd=levels[-1][0] if levels else parent)
        finally:
            for directory, _, _ in levels:
                os.close(directory)
    except OSError as error:
        if not levels and current == name:  # `name` itself: `path`
            raise _named(error, current, path) from None
        below = "/".join(level[1] for level in levels[1:])
        raise _named(error, current, "/".join(filter(None, (path, below, current)))) from None


def _open_to_empty(parent: int, name: str) -> int | None:
    """The directory `name` in `parent` opened to be emptied; None once `name` was no
    directory (a link or a file, unlinked: itself, not what it names)."""
    try:
        return os.open(name, _DIRECTORY_TO_EMPTY, dir_fd=parent)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    os.unlink(name, dir_fd=parent)
    return None


def _entries(directory: int) -> list[str]:
    with os.scandir(directory) as entries:
        return [entry.name for entry in entries]


def _named(error: OSError, name: str, path: str) -> OSError:
    """`error` of an operation on `name` relative to a directory descriptor, naming the
    whole `path` instead ("Is a directory: '_metadata'" named no file one could find)."""
    if error.filename == name:
        error.filename = path
    return error


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # replaced again since
        return "?"


def _local_file_size(native: str) -> int | None:
    """The size of the local file `native` (None: no regular file there), from one stat
    without the overhead of fsspec's `info`."""
    try:
        status = os.stat(native)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def local_file_sizes_refusing_links(base: str, within: str = STORAGE_DIRECTORY) -> dict[str, int]:
    """Sizes of the files below `base` by path relative to it, never descending through a
    link (one raises SymbolicLinkError; `within` says what `base` is part of)."""
    found: dict[str, int] = {}
    # Without recursion (Python 3.11's os.walk recurses): a tree thousands of directories
    # deep is listed too.
    directories = [base]
    while directories:
        directory = directories.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except (FileNotFoundError, NotADirectoryError):  # deleted since it was listed
            if directory == base:
                return found
            continue
        for entry in entries:
            if entry.is_symlink():
                raise SymbolicLinkError(entry.path, _link_target(entry.path), within)
            if entry.is_dir(follow_symlinks=False):
                directories.append(entry.path)
                continue
            with contextlib.suppress(FileNotFoundError):  # deleted since it was listed
                size = entry.stat(follow_symlinks=False).st_size
                found[os.path.relpath(entry.path, base)] = size
    return found


def _stream_digest(
    read: Callable[[int], bytes], write: Callable[[bytes], object] | None
) -> FileDigest:
    sha256 = hashlib.sha256()
    size = 0
    while chunk := read(_CHUNK_SIZE):
        sha256.update(chunk)
        size += len(chunk)
        if write is not None:
            write(chunk)
    return FileDigest(size=size, sha256=sha256.hexdigest())


def _reads_naming(source: IO[bytes], shown: str) -> Callable[[int], bytes]:
    """``source.read``, its local errors naming ``shown``."""

    def read(size: int) -> bytes:
        with _naming(shown):
            return source.read(size)

    return read


def _copy_verified(
    source: IO[bytes],
    target: IO[bytes],
    expected: FileDigest | None,
    checked_path: str,
    *,
    read_from: str,
    written_to: str,
) -> FileDigest:
    """Copy ``source`` to ``target``: a local error of either names its own file (a full
    disk restored into was told as the stored object's)."""

    def write(chunk: bytes) -> None:
        with _naming(written_to):
            target.write(chunk)

    digest = _stream_digest(_reads_naming(source, read_from), write=write)
    if expected is not None:
        digest.require_match(expected, checked_path)
    return digest


_DIRECTORY_BELOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_directory_in(directory: int, name: str, *, create: bool) -> int:
    """The directory `name` in the open `directory`, never through a link; made first if
    missing, with `create` (tried after the open: a checkpoint's directories mostly exist)."""
    try:
        return os.open(name, _DIRECTORY_BELOW, dir_fd=directory)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # made by another writer meanwhile
        os.mkdir(name, dir_fd=directory)
    return os.open(name, _DIRECTORY_BELOW, dir_fd=directory)


@contextlib.contextmanager
def _local_directory(native: str) -> Iterator[tuple[int, str]]:
    """The directory holding the local `native` (outside any confined directory), made if
    missing and opened, and the name in it."""
    directory, name = os.path.split(native)
    directory = directory or "."
    os.makedirs(directory, exist_ok=True)
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield descriptor, name
    finally:
        os.close(descriptor)


def _replace_in(
    directory: int,
    name: str,
    write: Callable[[IO[bytes]], _Result],
    *,
    durable: bool,
    shown: str,
) -> _Result:
    """Create `name` in the open `directory` through a temporary file there, renamed into
    place only after `write` succeeded; on any failure the temporary file is removed. Its
    errors name `shown` (the file's whole path), not the temporary's name alone."""
    temporary = _temporary_name(name)
    with _removed_on_failure(directory, temporary):
        # O_EXCL never follows or reuses an existing file; the mode honours the umask.
        with _naming(shown):
            descriptor = os.open(temporary, _NEW_FILE, 0o666, dir_fd=directory)
        target = os.fdopen(descriptor, "wb")
        try:
            result = write(target)  # which names its own errors
            with _naming(shown):  # a full disk may be told only now
                if durable:
                    target.flush()
                    os.fsync(target.fileno())
                target.close()
        except BaseException:
            with contextlib.suppress(OSError):
                target.close()
            raise
    _rename_into_place(directory, temporary, name, durable=durable, shown=shown)
    return result


def _rename_into_place(
    directory: int, temporary: str, name: str, *, durable: bool, shown: str
) -> None:
    """Rename the finished `temporary` over `name` in the open `directory` (removed if
    that fails); with `durable`, the rename survives a power loss."""
    with _removed_on_failure(directory, temporary), _naming(shown):
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    if durable:
        fsync_descriptor(directory)


@contextlib.contextmanager
def _removed_on_failure(directory: int, temporary: str) -> Iterator[None]:
    """`temporary` in the open `directory` is removed if the block fails in any way."""
    try:
        yield
    except BaseException:
        _remove_in(directory, temporary)
        raise


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """An OSError of a call relative to a directory descriptor, naming `path` whole."""
    try:
        yield
    except OSError as error:
        if error.errno is None:
            raise  # no system call's: nothing relative to name
        raise OSError(error.errno, error.strerror, path) from None


def _temporary_name(name: str) -> str:
    # Hidden and unique, next to the final file so that the rename stays on one filesystem.
    return f".{name}.{uuid.uuid4().hex}.tmp"


def _remove_in(directory: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory)
