"""Making local files survive a power loss: one at a time, and many at once.

Many at once is the cost of a checkpoint on local storage: Spark does not fsync its files,
so every file a `_metadata` names must be made durable before it is written. One
`syncfs(2)` does that for a whole filesystem in about the time of one journal commit, where
fsyncs cost a commit each (batched by a pool). It is used where it is known to work and to
be cheap, and fsyncs everywhere else:

- Only on ext2/3/4, XFS and Btrfs: their syncfs writes back every dirty inode of the
  filesystem (directories too) and then commits the journal, log or transaction, which
  holds every link, rename and new directory entry. A filesystem without its own sync
  operation (FUSE, e.g. JuiceFS or gcsfuse; CIFS) returns success from syncfs without asking
  its server to store anything, though it forwards an fsync.
- Only while the system holds little dirty data: syncfs also writes everything else that is
  dirty on the filesystem (Spark's shuffle files, if on the same disk), and waits for it.
  Measured (ext4 on a virtio disk, Linux 6.18, 2 cores, load 1.3-1.6; new 2 KB files in
  content-addressed directories, median of 8 paired runs): syncfs took 0.5, 3 and 14 ms
  for 7, 200 and 1,000 such files plus 0.43 ms per MiB of other dirty data; the pool of
  fsyncs took 3-6 ms for 7 files and their 7 directories, 20-23 ms for 200 (340 fsyncs),
  80-84 ms for 1,000 (1,256 fsyncs): about 4 ms plus 0.066 ms an fsync. They cost the same
  at about 9 MiB plus 150 KiB per fsync of other dirty data; syncfs is chosen up to about
  half of that (`_SYNCFS_DIRTY_BYTES`, `_SYNCFS_DIRTY_BYTES_PER_FSYNC`), so that even when
  all of the dirty data is someone else's, it costs about half of the fsyncs here. The
  amount is read system-wide (/proc/meminfo), an upper bound for any one filesystem.
- Only where the C library has syncfs (Linux; not macOS) and the kernel accepts it (a
  seccomp profile may refuse it with ENOSYS or EPERM).

Errors: since Linux 5.8 syncfs reports a writeback error of the filesystem that no syncfs
has reported yet; it becomes an OSError, as a failed fsync does. It may be another file's
error (which fails this checkpoint, not the next); and one that another process's syncfs
reported first is not reported again, where an fsync of our file would still report it:
a gap accepted, as nothing else syncs a checkpoint volume.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

# fsyncs in flight at once: enough for the filesystem to commit them together, few enough
# not to flood a shared disk.
_FSYNC_WORKERS = 16

# statfs(2) f_type of the filesystems whose syncfs commits all of their metadata (see above).
_SYNCFS_FILESYSTEMS = frozenset(
    {
        0xEF53,  # ext2, ext3, ext4
        0x58465342,  # XFS
        0x9123683E,  # Btrfs
    }
)
# Dirty data a syncfs may have to write: this much, plus this much per fsync it replaces
# (see the module docstring).
_SYNCFS_DIRTY_BYTES = 4 * 1024 * 1024
_SYNCFS_DIRTY_BYTES_PER_FSYNC = 64 * 1024
# The kernel's memory counters, among them the page cache's dirty and writeback bytes.
_MEMINFO = "/proc/meminfo"
# `struct statfs` is 120 bytes on 64-bit Linux; the buffer leaves room for any layout.
_STATFS_BUFFER_SIZE = 256


def _libc_function(name: str, argtypes: list[type], restype: type) -> Callable[..., int] | None:
    """The C library's function `name`, or None where there is none (not Linux, or a C
    library without it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function  # type: ignore[no-any-return]


_syncfs = _libc_function("syncfs", [ctypes.c_int], ctypes.c_int)
_fstatfs = _libc_function("fstatfs", [ctypes.c_int, ctypes.c_void_p], ctypes.c_int)


def fsync_path(path: str, *, dir_fd: int | None = None) -> None:
    """fsync a file or directory by path (a read-only descriptor suffices on POSIX),
    relative to the open directory `dir_fd` if given (then never through a link)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (0 if dir_fd is None else os.O_NOFOLLOW)
    descriptor = os.open(path, flags, dir_fd=dir_fd)
    try:
        fsync_descriptor(descriptor)
    finally:
        os.close(descriptor)


def fsync_descriptor(descriptor: int) -> None:
    """fsync an open file or directory."""
    try:
        os.fsync(descriptor)
    except OSError as error:
        # Some filesystems cannot fsync directories; they then offer no stronger guarantee.
        if error.errno != errno.EINVAL:
            raise


def make_files_durable(files: Iterable[str]) -> None:
    """Make the local `files`, their bytes and their names, survive a power loss: one
    syncfs per filesystem they are on where that works and is cheap (see the module
    docstring), else an fsync of each file and of each of their directories."""
    directories_by_device: dict[int, set[str]] = {}
    files_by_directory: dict[str, list[str]] = {}
    for path in files:
        files_by_directory.setdefault(os.path.dirname(path), []).append(path)
    for directory in files_by_directory:
        directories_by_device.setdefault(os.stat(directory).st_dev, set()).add(directory)
    to_fsync: list[str] = []
    for directories in directories_by_device.values():
        group = [path for directory in directories for path in files_by_directory[directory]]
        if not _synced_whole_filesystem(min(directories), fsyncs=len(group) + len(directories)):
            to_fsync += group + sorted(directories)
    if to_fsync:
        with ThreadPoolExecutor(_FSYNC_WORKERS, thread_name_prefix="fsync") as pool:
            list(pool.map(fsync_path, to_fsync))


def _synced_whole_filesystem(directory: str, fsyncs: int) -> bool:
    """syncfs the filesystem holding `directory` if that replaces `fsyncs` fsyncs well;
    True if it did, False if fsyncs are needed instead."""
    if _syncfs is None or _fstatfs is None:
        return False
    dirty = _dirty_bytes()
    if dirty is None or dirty > _SYNCFS_DIRTY_BYTES + fsyncs * _SYNCFS_DIRTY_BYTES_PER_FSYNC:
        return False
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        if _filesystem_type(descriptor) not in _SYNCFS_FILESYSTEMS:
            return False
        if _syncfs(descriptor) != 0:
            code = ctypes.get_errno()
            if code in (errno.ENOSYS, errno.EPERM):  # refused by a seccomp sandbox
                return False
            raise OSError(code, f"syncfs of the filesystem of {directory}: {os.strerror(code)}")
    finally:
        os.close(descriptor)
    return True


def _filesystem_type(descriptor: int) -> int | None:
    """statfs(2)'s f_type of the filesystem of `descriptor`, None if it cannot be read.

    f_type is the first member of `struct statfs`, a C long on x86-64 and arm64; where it
    is not (s390x), the value read here matches no type above, and fsyncs are used.
    """
    assert _fstatfs is not None
    buffer = ctypes.create_string_buffer(_STATFS_BUFFER_SIZE)
    if _fstatfs(descriptor, buffer) != 0:
        return None
    return ctypes.c_ulong.from_buffer(buffer).value


def _dirty_bytes() -> int | None:
    """Bytes of the page cache that are dirty or under writeback, on all filesystems
    (/proc/meminfo): at least what a syncfs of one of them writes and waits for. None if
    unknown."""
    try:
        with open(_MEMINFO, encoding="ascii") as meminfo:
            lines = meminfo.readlines()
    except OSError:
        return None
    kibibytes = [
        int(line.split()[1]) for line in lines if line.startswith(("Dirty:", "Writeback:"))
    ]
    return 1024 * sum(kibibytes) if len(kibibytes) == 2 else None
