"""Reading the small local files a user or another process may have put anything in place
of (a manifest, a state directory's status, a run's token): only a regular file is read,
and only up to a bound. Opening a FIFO waited for a writer for ever; a link to /dev/zero
was read until memory ran out."""

import os
import stat
from pathlib import Path

from spark_checkpoint.storage.filesystem import file_kind


class UnreadableFile(OSError):
    """Not a regular file, or larger than its bound; its message names neither the path
    (the caller's does) nor an errno."""

    def __str__(self) -> str:
        return str(self.args[0])


def read_small_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path`` (links followed), at most ``limit``;
    OSError if it cannot be read, UnreadableFile if it is no regular file or larger."""
    # O_NONBLOCK: a FIFO's open does not wait for a writer (its kind is refused below).
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(f"is {file_kind(mode)}, not a regular file")
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(f"is larger than {limit} bytes")
    return data


def read_small_text(path: Path, limit: int) -> str:
    """``read_small_file`` decoded as UTF-8: UnreadableFile if it is not."""
    try:
        return read_small_file(path, limit).decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"is not UTF-8 text ({error.reason} at byte {error.start})") from None
