"""StorageFileSystem: atomic writes and copies, hard links, and the object-store branch."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import re
import stat
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from azure.core.exceptions import ClientAuthenticationError, ResourceNotFoundError
from botocore.exceptions import ClientError
from fsspec.exceptions import FSTimeoutError

from helpers.objectstore import AzureServer, StorageRoot
from spark_checkpoint.sink import TransactionalFileSink
from spark_checkpoint.storage import (
    ChecksumMismatchError,
    FileDigest,
    MissingFileError,
    StorageAccessError,
    StorageFileSystem,
    SymbolicLinkError,
    digest_local_file,
)
from spark_checkpoint.storage.errors import is_missing_bucket
from spark_checkpoint.storage.filesystem import _storage_errors

CONTENT = b"state bytes " * 1000


def digest_of(content: bytes) -> FileDigest:
    return FileDigest(size=len(content), sha256=hashlib.sha256(content).hexdigest())


def all_files(directory: Path) -> list[str]:
    return sorted(
        str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()
    )


@pytest.fixture
def fs(tmp_path: Path) -> StorageFileSystem:
    return StorageFileSystem.for_url(f"file://{tmp_path}")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "spark" / "state" / "0" / "1" / "2.delta"
    path.parent.mkdir(parents=True)
    path.write_bytes(CONTENT)
    return path


def failing(*_args: object, **_directories: object) -> None:
    raise OSError(errno.EIO, "simulated I/O error")


def test_write_atomic_writes_and_replaces_without_leftovers(
    fs: StorageFileSystem, tmp_path: Path
) -> None:
    target = tmp_path / "store" / "chk-1" / "_metadata"

    fs.write_atomic(f"file://{target}", b"first")
    fs.write_atomic(str(target), b"second")

    assert target.read_bytes() == b"second"
    assert all_files(tmp_path / "store") == ["chk-1/_metadata"]
    assert fs.is_local


@pytest.mark.parametrize("broken", ["fsync", "replace"])
def test_failed_write_leaves_neither_a_partial_file_nor_a_temporary_one(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    directory = tmp_path / "store"
    new = directory / "chk-1" / "_metadata"
    existing = directory / "chk-2" / "_metadata"
    fs.write_atomic(str(existing), b"complete")
    monkeypatch.setattr(os, broken, failing)

    for target in (new, existing):
        with pytest.raises(OSError, match="simulated"):
            fs.write_atomic(str(target), b"x" * 10_000)

    monkeypatch.undo()
    assert not new.exists()
    assert existing.read_bytes() == b"complete"
    assert all_files(directory) == ["chk-2/_metadata"]


def test_copy_in_returns_the_digest(fs: StorageFileSystem, source: Path, tmp_path: Path) -> None:
    target = tmp_path / "store" / "shared" / "x"

    digest = fs.copy_in(str(source), str(target))

    assert digest == digest_of(CONTENT) == digest_local_file(str(source))
    assert target.read_bytes() == CONTENT
    assert os.stat(target).st_ino != os.stat(source).st_ino


def test_copy_in_of_a_changed_source_raises_and_leaves_nothing(
    fs: StorageFileSystem, source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "store" / "shared" / "x"

    with pytest.raises(ChecksumMismatchError) as raised:
        fs.copy_in(str(source), str(target), digest_of(CONTENT + b"more"))

    assert raised.value.path == str(source)
    assert raised.value.mismatch == "size"
    assert all_files(tmp_path / "store") == []


def test_link_in_hard_links_on_a_local_filesystem(
    fs: StorageFileSystem, source: Path, tmp_path: Path
) -> None:
    target = tmp_path / "store" / "shared" / "x"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"damaged")

    fs.link_in(str(source), str(target), digest_of(CONTENT))
    source.unlink()  # Spark deleting its own file does not affect the stored one

    assert target.read_bytes() == CONTENT
    assert os.stat(target).st_nlink == 1
    assert all_files(tmp_path / "store") == ["shared/x"]


def test_link_in_shares_the_inode(fs: StorageFileSystem, source: Path, tmp_path: Path) -> None:
    target = tmp_path / "store" / "shared" / "x"

    fs.link_in(str(source), str(target), digest_of(CONTENT))

    assert os.stat(target).st_ino == os.stat(source).st_ino


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EPERM])
def test_link_in_copies_when_linking_is_not_possible(
    fs: StorageFileSystem,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
) -> None:
    def cannot_link(*_args: object, **_directories: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", cannot_link)
    target = tmp_path / "store" / "shared" / "x"

    fs.link_in(str(source), str(target), digest_of(CONTENT))

    assert target.read_bytes() == CONTENT
    assert os.stat(target).st_ino != os.stat(source).st_ino
    # The copy is checked against the digest the caller took: the source may have changed.
    with pytest.raises(ChecksumMismatchError) as raised:
        fs.link_in(str(source), str(tmp_path / "store" / "y"), digest_of(b"earlier content"))
    assert raised.value.path == str(source)
    assert not (tmp_path / "store" / "y").exists()


@pytest.mark.parametrize("broken", ["fsync", "replace"])
def test_a_failed_link_leaves_no_temporary_link(
    fs: StorageFileSystem,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    broken: str,
) -> None:
    monkeypatch.setattr(os, broken, failing)

    with pytest.raises(OSError, match="simulated"):
        fs.link_in(str(source), str(tmp_path / "store" / "x"), digest_of(CONTENT))

    monkeypatch.undo()
    assert all_files(tmp_path / "store") == []


def test_a_size_mismatch_says_both_sizes(fs: StorageFileSystem, source: Path) -> None:
    with pytest.raises(ChecksumMismatchError) as raised:
        fs.digest(str(source)).require_match(digest_of(CONTENT + b"!"), "/s/x")

    assert str(raised.value) == (
        f"/s/x: size mismatch: expected {len(CONTENT) + 1} bytes, found {len(CONTENT)} bytes"
    )


def test_link_in_reports_other_errors(fs: StorageFileSystem, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fs.link_in(str(tmp_path / "absent"), str(tmp_path / "store" / "x"), digest_of(b""))


def test_copy_out_verifies_and_leaves_nothing_on_mismatch(
    fs: StorageFileSystem, source: Path, tmp_path: Path
) -> None:
    restored = tmp_path / "restore" / "state" / "2.delta"

    assert fs.copy_out(str(source), str(restored), digest_of(CONTENT)) == digest_of(CONTENT)
    assert restored.read_bytes() == CONTENT

    with pytest.raises(ChecksumMismatchError) as raised:
        fs.copy_out(
            str(source), str(tmp_path / "restore" / "other"), digest_of(b"x" * len(CONTENT))
        )

    assert raised.value.path == str(source)
    assert raised.value.mismatch == "sha256"
    assert all_files(tmp_path / "restore") == ["state/2.delta"]


def test_missing_files_are_reported_with_their_path(fs: StorageFileSystem, tmp_path: Path) -> None:
    absent = str(tmp_path / "absent")

    for read in (fs.read_bytes, fs.digest, lambda path: fs.copy_out(path, str(tmp_path / "o"))):
        with pytest.raises(MissingFileError) as raised:
            read(absent)
        assert str(raised.value) == f"{absent}: no such file"
    assert fs.file_size(absent) is None
    assert fs.file_size(str(tmp_path)) is None  # a directory is not a file


def test_listing_and_idempotent_deletes(fs: StorageFileSystem, tmp_path: Path) -> None:
    root = tmp_path / "store"
    for name in ("chk-1/_metadata", "chk-2/_metadata", "shared/ab/file"):
        fs.write_atomic(str(root / name), b"x")

    assert fs.list_dir(str(root)) == ["chk-1", "chk-2", "shared"]
    assert fs.list_dir(str(root / "absent")) == []
    assert fs.list_files(str(root / "shared")) == ["ab/file"]
    assert fs.list_files(str(root / "absent")) == []
    assert fs.file_size(str(root / "shared" / "ab" / "file")) == 1

    for _ in range(2):
        fs.delete_file(str(root / "shared" / "ab" / "file"))
        fs.delete_tree(str(root / "chk-1"))

    assert all_files(root) == ["chk-2/_metadata"]


@pytest.mark.parametrize("kind", ["local", "object store"])
def test_file_sizes_answers_for_files_below_the_directory_only(
    tmp_path: Path, memory_root: str, kind: str
) -> None:
    """A path outside `below`, a missing file and a directory have no size, locally (a
    stat each) as on an object store (one listing)."""
    root = f"file://{tmp_path}" if kind == "local" else memory_root
    fs = StorageFileSystem.for_url(root).confined(root)
    for name in ("shared/ab/file", "shared/cd/other", "chk-1/_metadata"):
        fs.write_atomic(f"{root}/{name}", b"x" * len(name))
    paths = [f"{root}/{name}" for name in ("shared/ab/file", "shared/cd/other", "shared/ab/gone")]

    sizes = fs.file_sizes(
        [*paths, f"{root}/chk-1/_metadata", f"{root}/shared/ab"], below=f"{root}/shared/"
    )

    assert sizes == {
        paths[0]: 14,
        paths[1]: 15,
        paths[2]: None,
        f"{root}/chk-1/_metadata": None,
        f"{root}/shared/ab": None,
    }


@pytest.mark.parametrize("kind", ["local", "object store"])
def test_list_file_sizes_sizes_every_file_below_the_directory(
    tmp_path: Path, memory_root: str, kind: str
) -> None:
    root = f"file://{tmp_path}" if kind == "local" else memory_root
    fs = StorageFileSystem.for_url(root).confined(root)
    for name in ("shared/ab/file", "shared/cd/other", "chk-1/_metadata"):
        fs.write_atomic(f"{root}/{name}", b"x" * len(name))

    assert fs.list_file_sizes(f"{root}/shared") == {"ab/file": 14, "cd/other": 15}
    assert fs.list_file_sizes(f"{root}/absent") == {}


def test_a_listing_the_storage_library_fails_names_the_directory(
    memory_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error of the library's own (botocore's, Azure's) becomes a StorageAccessError
    naming the directory and the library's error."""
    fs = StorageFileSystem.for_url(memory_root)

    def refused(*_args: object, **_kwargs: object) -> None:
        # One line: Azure's DefaultAzureCredential says why a line per credential it tried,
        # and `list` printed the twelve lines (a newcomer's); the why is kept (a reviewer's).
        raise RuntimeError("the service refused\nAttempted credentials:\n\tEnvironment: bad")

    monkeypatch.setattr(fs._fs, "find", refused)

    with pytest.raises(StorageAccessError) as raised:
        fs.list_file_sizes(f"{memory_root}/shared")
    assert str(raised.value) == (
        f"{memory_root}/shared: RuntimeError: the service refused Attempted credentials: "
        "Environment: bad"
    )


def test_a_file_deleted_while_its_directory_is_listed_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Garbage collection lists `shared/` while a janitor or driver may delete there."""
    fs = StorageFileSystem.for_url(f"file://{tmp_path}").confined(f"file://{tmp_path}")
    for name in ("gone", "kept"):
        fs.write_atomic(str(tmp_path / "shared" / name), b"x")
    scandir = os.scandir

    @contextlib.contextmanager
    def deleting_after_listing(directory: str) -> Iterator[list[os.DirEntry[str]]]:
        with scandir(directory) as listing:
            entries = list(listing)
        (Path(directory) / "gone").unlink(missing_ok=True)
        yield entries

    monkeypatch.setattr(os, "scandir", deleting_after_listing)

    assert fs.list_file_sizes(str(tmp_path / "shared")) == {"kept": 1}


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"memory://storage-test-{uuid.uuid4().hex}"
    yield root
    memory = fsspec.filesystem("memory")
    if memory.exists(root):
        memory.rm(root, recursive=True)


def test_object_store_branch_on_an_in_memory_filesystem(
    memory_root: str, source: Path, tmp_path: Path
) -> None:
    fs = StorageFileSystem.for_url(memory_root)
    assert not fs.is_local

    fs.write_atomic(f"{memory_root}/chk-1/_metadata", b"meta")
    assert fs.copy_in(str(source), f"{memory_root}/shared/a") == digest_of(CONTENT)
    fs.link_in(str(source), f"{memory_root}/shared/b", digest_of(CONTENT))

    assert fs.read_bytes(f"{memory_root}/chk-1/_metadata") == b"meta"
    assert fs.digest(f"{memory_root}/shared/b") == digest_of(CONTENT)
    assert fs.list_dir(memory_root) == ["chk-1", "shared"]
    assert fs.list_files(f"{memory_root}/shared") == ["a", "b"]

    fs.copy_out(f"{memory_root}/shared/a", str(tmp_path / "out"), digest_of(CONTENT))
    assert (tmp_path / "out").read_bytes() == CONTENT

    with pytest.raises(ChecksumMismatchError) as raised:
        fs.copy_in(str(source), f"{memory_root}/shared/c", digest_of(b"other"))
    assert raised.value.path == str(source)
    with pytest.raises(ChecksumMismatchError):
        fs.link_in(str(source), f"{memory_root}/shared/c", digest_of(b"other"))
    assert not fs.exists(f"{memory_root}/shared/c")

    # Object stores have no links: confining one changes nothing.
    assert fs.confined(memory_root).list_files(f"{memory_root}/shared") == ["a", "b"]

    fs.delete_tree(f"{memory_root}/shared")
    fs.delete_tree(f"{memory_root}/shared")
    assert fs.list_files(f"{memory_root}/shared") == []


@pytest.mark.parametrize("directory", ["filesX", "files "])
def test_names_ending_in_any_character_are_listed_whole(
    fs: StorageFileSystem, tmp_path: Path, directory: str
) -> None:
    root = tmp_path / directory
    for name in ("chk-1X/_metadata", "sub/fileX", "fileX"):
        fs.write_atomic(str(root / name), b"x")

    assert fs.list_dir(str(root)) == ["chk-1X", "fileX", "sub"]
    assert fs.list_files(str(root)) == ["chk-1X/_metadata", "fileX", "sub/fileX"]


def test_a_name_too_long_for_its_temporary_file_fails_with_the_os_error(
    fs: StorageFileSystem, source: Path, tmp_path: Path
) -> None:
    """The temporary file's name is longer than the final one: the OS refuses it, and the
    failure is reported as such, with nothing left behind."""
    stored = str(tmp_path / "stored")
    fs.write_atomic(stored, CONTENT)
    target = tmp_path / "restore" / ("x" * 250)

    with pytest.raises(OSError) as raised:
        fs.copy_out(stored, str(target))

    assert raised.value.errno == errno.ENAMETOOLONG
    assert all_files(tmp_path / "restore") == []


def test_a_content_mismatch_says_both_digests(fs: StorageFileSystem, source: Path) -> None:
    other = digest_of(CONTENT.upper())

    with pytest.raises(ChecksumMismatchError) as raised:
        fs.digest(str(source)).require_match(other, "/s/x")

    actual = hashlib.sha256(CONTENT).hexdigest()
    assert str(raised.value) == f"/s/x: sha256 mismatch: expected {other.sha256}, found {actual}"


def test_a_filesystem_that_cannot_fsync_directories_still_stores_files(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def fsync_files_only(descriptor: int) -> None:
        if stat.S_ISDIR(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync_files_only)

    fs.write_atomic(str(tmp_path / "store" / "x"), b"stored")

    assert (tmp_path / "store" / "x").read_bytes() == b"stored"


def test_the_temporary_file_is_renamed_from_the_final_files_directory(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same directory, so the same filesystem: the rename is atomic (never a copy)."""
    renamed: list[tuple[str, str]] = []
    real_replace = os.replace

    def recording_replace(source: str, target: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        renamed.append(
            (
                os.path.dirname(os.path.join(os.readlink(f"/proc/self/fd/{src_dir_fd}"), source)),
                os.path.dirname(os.path.join(os.readlink(f"/proc/self/fd/{dst_dir_fd}"), target)),
            )
        )
        real_replace(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "replace", recording_replace)
    monkeypatch.chdir(tmp_path)

    fs.write_atomic(str(tmp_path / "store" / "x"), b"stored")

    assert renamed == [(str(tmp_path / "store"), str(tmp_path / "store"))]


def test_a_restore_to_a_bare_file_name_writes_only_that_file(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs.write_atomic(str(tmp_path / "stored"), b"stored")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")

    fs.copy_out(str(tmp_path / "stored"), "restored")

    assert sorted(os.listdir(tmp_path / "cwd")) == ["restored"]


def test_a_file_of_several_chunks_is_digested_whole(fs: StorageFileSystem, tmp_path: Path) -> None:
    content = os.urandom(2 * 1024 * 1024 + 17)  # the digest reads 1 MiB at a time
    (tmp_path / "big").write_bytes(content)

    assert fs.digest(str(tmp_path / "big")) == digest_of(content)


@pytest.mark.parametrize("name", ["jobX", "job "])
def test_links_below_any_confined_directory_are_refused(
    fs: StorageFileSystem, tmp_path: Path, name: str
) -> None:
    confined = tmp_path / name
    confined.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file").write_text("not the job's")
    (confined / "shared").symlink_to(tmp_path / "outside")

    with pytest.raises(SymbolicLinkError):
        fs.confined(str(confined)).read_bytes(str(confined / "shared" / "file"))


@pytest.mark.parametrize("root", ["file://", "local://", "file:", "local:"])
def test_a_directory_whose_paths_fsspec_places_elsewhere_is_no_confinement(
    fs: StorageFileSystem, root: str
) -> None:
    """fsspec reads `file://` as the working directory and `file:///ns/job` as `/ns/job`:
    confined to the one, the job's paths lay outside it, no link on them was checked, and a
    discard deleted through a link outside the job's directory (a security review's; the
    CRD and the CLI refuse these roots, the driver's environment does not)."""
    with pytest.raises(ValueError, match=f"^{root!r} names no directory that paths below it"):
        fs.confined(root)


def test_a_stored_file_is_fsynced_before_it_is_renamed_into_place(
    fs: StorageFileSystem, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint must survive a power loss: a failing fsync fails the copy."""
    monkeypatch.setattr(os, "fsync", failing)

    with pytest.raises(OSError, match="simulated"):
        fs.copy_in(str(source), str(tmp_path / "store" / "x"))

    monkeypatch.undo()
    assert all_files(tmp_path / "store") == []


def test_a_restored_file_is_not_fsynced(
    fs: StorageFileSystem, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore goes to a fresh directory, made again from storage after a crash: it
    does not pay for fsync (which fails here)."""
    fs.copy_in(str(source), str(tmp_path / "store" / "x"))
    monkeypatch.setattr(os, "fsync", failing)

    fs.copy_out(str(tmp_path / "store" / "x"), str(tmp_path / "restore" / "x"))

    assert (tmp_path / "restore" / "x").read_bytes() == CONTENT


def _swap_checkpoints_for_a_link_after_the_check(
    storage: StorageFileSystem, confined: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As another process (the job's own driver, a writer on a shared volume) may: once
    `storage` has checked a path for links, `confined/checkpoints` is moved away and a link
    to `outside` put in its place."""
    checked = storage._native

    def check_then_swap(path: str) -> str:
        native = checked(path)
        if not (confined / "checkpoints").is_symlink():
            (confined / "checkpoints").rename(confined.parent / "moved-away")
            (confined / "checkpoints").symlink_to(outside)
        return native

    monkeypatch.setattr(storage, "_native", check_then_swap)


@pytest.mark.parametrize("operation", ["delete_tree", "delete_file", "delete_files"])
def test_a_link_swapped_in_after_the_check_does_not_redirect_a_delete(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """Another process (the job's own driver) may replace a directory of the job's storage
    with a link between the check for links and the delete: the delete still never
    reaches out of the job's directory."""
    confined = tmp_path / "job"
    (confined / "checkpoints" / "chk-1").mkdir(parents=True)
    (confined / "checkpoints" / "chk-1" / "state").write_text("the job's")
    outside = tmp_path / "outside"
    (outside / "chk-1").mkdir(parents=True)
    (outside / "chk-1" / "state").write_text("not the job's")
    storage = fs.confined(str(confined))
    _swap_checkpoints_for_a_link_after_the_check(storage, confined, outside, monkeypatch)
    target = confined / "checkpoints" / "chk-1"
    path = str(target if operation == "delete_tree" else target / "state")

    with pytest.raises(SymbolicLinkError, match="checkpoints"):
        getattr(storage, operation)([path] if operation == "delete_files" else path)

    assert (outside / "chk-1" / "state").read_text() == "not the job's"


@pytest.mark.parametrize("operation", ["write_atomic", "copy_in", "link_in"])
@pytest.mark.parametrize("missing", [False, True])
def test_a_link_swapped_in_after_the_check_does_not_redirect_a_write(
    tmp_path: Path,
    source: Path,
    monkeypatch: pytest.MonkeyPatch,
    operation: str,
    missing: bool,
) -> None:
    """Writes went by path after the check for links: a directory swapped for a link in
    between (another writer on a shared volume) took the write out of the job's directory
    (a security review reproduced it in 49 writes). Also when the write makes the directory
    below it (``missing``)."""
    confined = tmp_path / "job"
    (confined / "checkpoints").mkdir(parents=True)
    if not missing:
        (confined / "checkpoints" / "chk-1").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    storage = StorageFileSystem.for_url(f"file://{tmp_path}").confined(str(confined))
    _swap_checkpoints_for_a_link_after_the_check(storage, confined, outside, monkeypatch)
    target = str(confined / "checkpoints" / "chk-1" / "_metadata")
    write = {
        "write_atomic": lambda: storage.write_atomic(target, CONTENT),
        "copy_in": lambda: storage.copy_in(str(source), target),
        "link_in": lambda: storage.link_in(str(source), target, digest_of(CONTENT)),
    }[operation]

    with pytest.raises(SymbolicLinkError, match="checkpoints"):
        write()

    assert sorted(outside.rglob("*")) == []


@pytest.mark.parametrize("operation", ["read_bytes", "digest", "copy_out"])
def test_a_link_swapped_in_after_the_check_does_not_redirect_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operation: str
) -> None:
    """As writes: only the file's own name was opened without following a link."""
    confined = tmp_path / "job"
    (confined / "checkpoints" / "chk-1").mkdir(parents=True)
    (confined / "checkpoints" / "chk-1" / "_metadata").write_text("the job's")
    outside = tmp_path / "outside"
    (outside / "chk-1").mkdir(parents=True)
    (outside / "chk-1" / "_metadata").write_text("not the job's")
    storage = StorageFileSystem.for_url(f"file://{tmp_path}").confined(str(confined))
    _swap_checkpoints_for_a_link_after_the_check(storage, confined, outside, monkeypatch)
    target = str(confined / "checkpoints" / "chk-1" / "_metadata")
    read = {
        "read_bytes": lambda: storage.read_bytes(target),
        "digest": lambda: storage.digest(target),
        "copy_out": lambda: storage.copy_out(target, str(tmp_path / "restored")),
    }[operation]

    with pytest.raises(SymbolicLinkError, match="checkpoints"):
        read()

    assert not (tmp_path / "restored").exists()


@pytest.mark.parametrize("operation", ["write_atomic", "copy_in", "link_in"])
def test_a_write_that_fails_names_its_file_whole(
    tmp_path: Path, source: Path, operation: str
) -> None:
    """Opened from its directory's descriptor, an error named only the temporary file's
    name (`.x.<uuid>.tmp`), which the agent's answer then quoted (a reviewer's)."""
    storage = StorageFileSystem.for_url(f"file://{tmp_path}").confined(str(tmp_path / "job"))
    target = tmp_path / "job" / "chk-1" / "_metadata"
    (target / "in-the-way").mkdir(parents=True)  # a directory where the file goes
    write = {
        "write_atomic": lambda: storage.write_atomic(str(target), CONTENT),
        "copy_in": lambda: storage.copy_in(str(source), str(target)),
        "link_in": lambda: storage.link_in(str(source), str(target), digest_of(CONTENT)),
    }[operation]

    with pytest.raises(OSError) as raised:
        write()

    assert raised.value.filename == str(target)
    assert [p.name for p in target.parent.iterdir()] == ["_metadata"]  # no temporary left


@pytest.mark.parametrize("swapped_in", ["directory", "fifo"])
def test_a_deleted_directory_swapped_for_a_link_is_unlinked_not_followed(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swapped_in: str
) -> None:
    """The directory to delete itself replaced by a link after the check: the link goes,
    what it names stays (a FIFO is not waited on: Python 3.11's rmtree opened it and
    hung; a link to a directory made it raise)."""
    confined = tmp_path / "job"
    target = confined / "chk-1"
    (target / "state").mkdir(parents=True)
    outside = tmp_path / "outside"
    if swapped_in == "directory":
        outside.mkdir()
        (outside / "file").write_text("not the job's")
    else:
        os.mkfifo(outside)
    storage = fs.confined(str(confined))
    checked = storage._native

    def check_then_swap(path: str) -> str:
        native = checked(path)
        (target / "state").rmdir()
        target.rmdir()
        target.symlink_to(outside)
        return native

    monkeypatch.setattr(storage, "_native", check_then_swap)
    deleting = threading.Thread(target=storage.delete_tree, args=(str(target),), daemon=True)
    deleting.start()
    deleting.join(timeout=10)
    if deleting.is_alive():  # let the blocked open go, so the thread ends
        with open(outside, "wb"):
            pass
    assert not deleting.is_alive(), "the delete waited on the FIFO"

    assert not os.path.lexists(target)
    assert outside.is_dir() if swapped_in == "directory" else stat.S_ISFIFO(outside.stat().st_mode)
    if swapped_in == "directory":
        assert (outside / "file").read_text() == "not the job's"


def test_a_deleted_tree_removes_links_and_files_in_it_and_a_file_in_its_place(
    fs: StorageFileSystem, tmp_path: Path
) -> None:
    confined = tmp_path / "job"
    (confined / "chk-1" / "state" / "0").mkdir(parents=True)
    (confined / "chk-1" / "state" / "0" / "1.delta").write_text("state")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file").write_text("not the job's")
    (confined / "chk-1" / "state" / "shared").symlink_to(tmp_path / "outside")
    (confined / "chk-2").write_text("a file where a directory was expected")
    storage = fs.confined(str(confined))

    storage.delete_tree(str(confined / "chk-1"))
    storage.delete_tree(str(confined / "chk-2"))

    assert list(confined.iterdir()) == []
    assert (tmp_path / "outside" / "file").read_text() == "not the job's"


def test_deletes_of_a_missing_path_below_the_boundary_do_nothing(
    fs: StorageFileSystem, tmp_path: Path
) -> None:
    confined = tmp_path / "job"
    confined.mkdir()
    storage = fs.confined(str(confined))

    storage.delete_tree(str(confined / "checkpoints" / "chk-9"))
    storage.delete_file(str(confined / "checkpoints" / "chk-9" / "_metadata"))
    storage.delete_file(str(confined / "_metadata"))

    assert list(confined.iterdir()) == []


def test_a_file_uri_is_taken_as_written(tmp_path: Path) -> None:
    """As the user guide says (and fsspec does): no percent-decoding, and `?` and `#` are
    part of the path; a newcomer's `file:///.../a%20b` was the directory `a%20b`."""
    root = f"file://{tmp_path}/a%20b?x#y"
    fs = StorageFileSystem.for_url(root).confined(root)

    fs.write_atomic(f"{root}/chk-1/_metadata", b"complete")

    assert all_files(tmp_path) == ["a%20b?x#y/chk-1/_metadata"]


def _raised_from(cause: BaseException, error: OSError) -> OSError:
    try:
        raise error from cause
    except OSError as raised:
        return raised


def test_a_missing_bucket_is_told_by_the_stores_error_code_alone() -> None:
    """Asking for the bucket took any error for "missing" (s3fs's exists: a 403 of
    least-privilege credentials, a wrong key, an endpoint down), and the sink refused to
    start for good (a reviewer's). Only the store's own code says so."""

    def s3_error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code}}, "ListObjectsV2")

    container = ResourceNotFoundError("The specified container does not exist.")
    container.error_code = "ContainerNotFound"
    blob = ResourceNotFoundError("The specified blob does not exist.")
    blob.error_code = "BlobNotFound"

    assert is_missing_bucket(_raised_from(s3_error("NoSuchBucket"), FileNotFoundError("x")))
    assert is_missing_bucket(FileNotFoundError(errno.ENOENT, "No such container", "c"))
    assert is_missing_bucket(container)
    assert not is_missing_bucket(_raised_from(s3_error("NoSuchKey"), FileNotFoundError("k")))
    assert not is_missing_bucket(_raised_from(s3_error("AccessDenied"), PermissionError("x")))
    assert not is_missing_bucket(PermissionError("Forbidden"))
    assert not is_missing_bucket(FileNotFoundError("s3://bucket/missing/key"))
    assert not is_missing_bucket(blob)
    # gcsfs names the request: a bucket's list of objects is missing with its bucket only.
    upload = "https://storage.googleapis.com/upload/storage/v1/b/bkt/o"
    assert is_missing_bucket(FileNotFoundError("b/bkt/o"))  # a listing's
    assert is_missing_bucket(FileNotFoundError(upload))
    assert is_missing_bucket(FileNotFoundError(f"{upload}?uploadType=multipart"))
    assert not is_missing_bucket(FileNotFoundError("b/bkt/o/a%2Fkey"))  # an object's
    assert not is_missing_bucket(
        FileNotFoundError(
            "https://storage.googleapis.com/download/storage/v1/b/bkt/o/key?alt=media"
        )
    )
    assert not is_missing_bucket(PermissionError("b/bkt/o"))
    # A resumable upload's later part: its session is gone, not the bucket.
    assert not is_missing_bucket(FileNotFoundError(f"{upload}?uploadType=resumable&upload_id=x"))


def test_an_azure_refusal_is_told_in_one_line_with_its_code(
    azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azure's message holds the service's answer twice, as lines and as its XML: a wrong
    key's error ran to hundreds of characters (an Azure newcomer's)."""
    wrong_key = base64.b64encode(b"not the account's key").decode()
    connection = azure_server.environment()["AZURE_STORAGE_CONNECTION_STRING"]
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        re.sub("AccountKey=[^;]*", f"AccountKey={wrong_key}", connection),
    )
    fs = StorageFileSystem(fsspec.filesystem("abfs", skip_instance_cache=True))
    path = f"abfs://{azure_server.container}/refused/x"

    with pytest.raises(StorageAccessError) as refused:
        fs.write_atomic(path, b"x")

    told = str(refused.value)
    assert told.startswith(f"{path}: HttpResponseError: Server failed to authenticate"), told
    assert told.endswith(" (AuthorizationFailure)"), told
    assert "<?xml" not in told and "RequestId" not in told, told


def test_an_azure_account_the_credentials_do_not_reach_is_refused(
    azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adlfs takes the connection string's account over the URI's: storage named as in
    account `someother` was written to Azurite's, without a word (an Azure newcomer's).
    Checkpoint storage and the sink's output are both opened this way."""
    for name, value in azure_server.environment().items():
        monkeypatch.setenv(name, value)
    elsewhere = f"abfss://{azure_server.container}@someother.dfs.core.windows.net/x"

    for opened in (StorageFileSystem.for_url, TransactionalFileSink):
        with pytest.raises(ValueError) as refused:
            opened(elsewhere)
        assert str(refused.value) == (
            f"{elsewhere} names Azure account 'someother', but the credentials "
            "(AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME) reach account "
            "'devstoreaccount1'"
        )
    # The account the credentials reach, however it is spelled, and none named.
    for same in (
        f"az://{azure_server.container}@DevStoreAccount1.blob.core.windows.net/x",
        f"abfs://{azure_server.container}@devstoreaccount1.privatelink.blob.core.windows.net/x",
        f"abfs://{azure_server.container}/x",
    ):
        StorageFileSystem.for_url(same)


def test_a_fresh_filesystem_takes_the_credentials_of_the_environment_it_is_made_in(
    azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adlfs reads its credentials as it is made, and fsspec hands the instance it made
    before to the same arguments: a run checking an image with the driver's environment
    got the one made with its own (a reviewer's)."""
    path = f"abfs://{azure_server.container}/fresh/x"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=elsewhere;AccountKey=a2V5")
    made_before = StorageFileSystem.for_url(path)
    for name, value in azure_server.environment().items():
        monkeypatch.setenv(name, value)

    assert StorageFileSystem.for_url(path).place(path)[1] == "elsewhere"  # fsspec's instance
    assert StorageFileSystem.for_url(path, fresh=True).place(path)[1] == "devstoreaccount1"
    assert made_before.place(path)[1] == "elsewhere"


def test_an_azure_refusal_keeps_the_details_that_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only AuthenticationErrorDetail says that a SAS expired or a clock is skewed: the
    shortened message dropped it (a reviewer's)."""
    refusal = ClientAuthenticationError(
        message="Server failed to authenticate the request.\nRequestId:1\nErrorCode:"
        "AuthenticationFailed\nauthenticationerrordetail:Signed expiry time must be after "
        "signed start time"
    )
    refusal.error_code = "AuthenticationFailed"  # type: ignore[attr-defined]
    refusal.additional_info = {  # type: ignore[attr-defined]
        "authenticationerrordetail": "Signed expiry time must be after signed start time"
    }
    fs = _listing_raising(refusal, monkeypatch)

    with pytest.raises(StorageAccessError) as raised:
        fs.list_dir("memory://c/x")

    assert str(raised.value).endswith(
        "ClientAuthenticationError: Server failed to authenticate the request. "
        "(AuthenticationFailed; authenticationerrordetail: Signed expiry time must be after "
        "signed start time)"
    ), raised.value


def test_a_tree_thousands_of_directories_deep_is_listed_and_deleted(
    fs: StorageFileSystem, tmp_path: Path
) -> None:
    """Anything may write below a job's storage: a deep tree was a RecursionError for
    garbage collection's listing and for a delete, so the job's storage could not be
    cleaned (a hostile reviewer's)."""
    confined = tmp_path / "job"
    confined.mkdir()
    directory = os.open(confined, os.O_RDONLY)
    for _ in range(1_500):  # within PATH_MAX: listings name files by path
        os.mkdir("d", dir_fd=directory)
        below = os.open("d", os.O_RDONLY, dir_fd=directory)
        os.close(directory)
        directory = below
    with open("leaf", "wb", opener=lambda name, flags: os.open(name, flags, dir_fd=directory)) as f:
        f.write(CONTENT)
    os.close(directory)
    storage = fs.confined(str(confined))

    try:
        assert storage.list_file_sizes(str(confined)) == {"d/" * 1_500 + "leaf": len(CONTENT)}
        storage.delete_tree(str(confined / "d"))
        assert list(confined.iterdir()) == []
    finally:  # pytest's own clean-up of tmp_path recurses too
        subprocess.run(["rm", "-rf", str(confined)], check=True)


def test_a_delete_that_fails_on_the_directory_itself_names_it_once(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It named `<dir>/<name>` for the directory itself (a reviewer's)."""
    confined = tmp_path / "job"
    (confined / "chk-1" / "state").mkdir(parents=True)
    storage = fs.confined(str(confined))
    rmdir = os.rmdir

    def busy(name: str, *, dir_fd: int | None = None) -> None:
        if name == "chk-1":
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), name)
        rmdir(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "rmdir", busy)

    with pytest.raises(OSError) as failed:
        storage.delete_tree(str(confined / "chk-1"))

    assert f"'{confined}/chk-1'" in str(failed.value), failed.value
    assert "chk-1/chk-1" not in str(failed.value)


_COPY_OUT_PAST_THE_FILE_SIZE_LIMIT = """
import resource, signal, sys
from spark_checkpoint.storage import StorageFileSystem
stored, local_dst = sys.argv[1], sys.argv[2]
fs = StorageFileSystem.for_url(stored, fresh=True)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    fs.copy_out(stored, local_dst)
except OSError as error:
    print(error)
"""


def test_a_restore_target_that_cannot_be_written_is_named_not_the_stored_file(
    storage_root: StorageRoot, tmp_path: Path
) -> None:
    """A full disk restored into was told as the stored object's error ("[Errno 28] No
    space left on device: 's3://...'"): a reviewer's. A file size limit stands in for it."""
    stored = f"{storage_root.url}/chk-5/state/x"
    storage_root.write(stored, os.urandom(3 << 20))
    local_dst = tmp_path / "restored" / "state" / "x"
    local_dst.parent.mkdir(parents=True)

    told = subprocess.run(
        [sys.executable, "-c", _COPY_OUT_PAST_THE_FILE_SIZE_LIMIT, stored, str(local_dst)],
        env={**os.environ, **storage_root.environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )

    assert told.stdout == f"[Errno {errno.EFBIG}] File too large: '{local_dst}'\n", told.stderr
    assert list(local_dst.parent.iterdir()) == [], "no temporary left"


def test_a_stored_file_that_cannot_be_opened_is_named_whole(
    fs: StorageFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened by its name in its directory's descriptor, its error named the bare name
    ("owner.json: Permission denied"), which read as a path (a reviewer's; as root, the
    test's user, the kernel refuses nothing, so the open is refused here)."""
    confined = fs.confined(str(tmp_path))
    stored = tmp_path / "job" / "owner.json"
    stored.parent.mkdir()
    stored.write_text("{}")
    opened = os.open

    def refusing(path: str, *args: object, **kwargs: object) -> int:
        if path == "owner.json":
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return opened(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing)

    with pytest.raises(PermissionError) as refused:
        confined.read_bytes(str(stored))

    assert refused.value.filename == str(stored)


@pytest.mark.parametrize(
    ("raised", "told"),
    [
        (PermissionError("Access Denied"), f"[Errno {errno.EACCES}] Access Denied"),
        # fsspec's timeout, a TimeoutError without arguments: not an EIO that never was.
        (FSTimeoutError(), f"[Errno {errno.ETIMEDOUT}] {os.strerror(errno.ETIMEDOUT)}"),
        # s3fs's FileNotFoundError(path) says nothing but the path.
        (FileNotFoundError("bucket/key"), f"[Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}"),
        (OSError("Internal Error"), f"[Errno {errno.EIO}] Internal Error"),
    ],
)
def test_an_object_stores_error_names_its_object(raised: OSError, told: str) -> None:
    """The OSErrors fsspec libraries translate their answers to name no object (a task's
    decline of a revoked write said only "PermissionError: Access Denied")."""
    with pytest.raises(type(raised)) as error, _storage_errors("s3://bucket/key"):
        raise raised

    assert str(error.value) == f"{told}: 's3://bucket/key'"


@pytest.mark.parametrize(
    ("raised", "said", "code"),
    [
        # gcsfs's 403 of a listing: its request's path, GCS's message on the next line.
        (
            OSError("Forbidden: b/bkt/o\nsa@p.iam does not have storage.objects.list access"),
            "Forbidden: sa@p.iam does not have storage.objects.list access",
            errno.EACCES,
        ),
        (
            OSError("Forbidden: https://storage.googleapis.com/download/storage/v1/b/bkt/o/k"),
            "Forbidden",
            errno.EACCES,
        ),
        # A batch delete's refusal (real GCS only): the answer's JSON.
        (
            OSError('{  "error": {    "code": 403,    "message": "no storage.objects.delete"  }}'),
            "no storage.objects.delete",
            errno.EACCES,
        ),
        # JSON of another shape is said as it is.
        (OSError('{"error": "denied"}'), '{"error": "denied"}', errno.EIO),
        # Another store's lines stay as they were said.
        (OSError("Server failed.\nRequestId:1"), "Server failed.\nRequestId:1", errno.EIO),
        (PermissionError("Access Denied"), "Access Denied", errno.EACCES),
    ],
)
def test_an_object_stores_error_names_the_path_and_what_the_store_said(
    monkeypatch: pytest.MonkeyPatch, raised: OSError, said: str, code: int
) -> None:
    """gcsfs's errors name their request instead of saying why (a reviewer's): "[Errno 5]
    Forbidden: b/bkt/o: ..." and a batch delete's JSON."""
    fs = _listing_raising(raised, monkeypatch)

    with pytest.raises(OSError) as error:
        fs.list_dir("memory://bkt/x")

    assert (error.value.errno, error.value.strerror, error.value.filename) == (
        code,
        said,
        "memory://bkt/x",
    )


def test_credentials_that_get_no_token_are_told_as_such_not_as_a_401(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gcsfs raises a token google-auth could not get (a key file's, Workload Identity's)
    as GCS's "Invalid Credentials" 401 after its retries, the reason in its cause (a
    reviewer's: a revoked key said "HttpError: Invalid Credentials (HTTP 401)")."""
    from gcsfs.retry import HttpError  # noqa: PLC0415 (gs:// only)
    from google.auth.exceptions import RefreshError  # noqa: PLC0415

    cause = RefreshError("invalid_grant: Invalid JWT Signature.", {"error": "invalid_grant"})
    refusal = HttpError({"code": 401, "message": "Invalid Credentials"})
    refusal.__cause__ = cause
    fs = _listing_raising(refusal, monkeypatch)

    with pytest.raises(StorageAccessError) as raised:
        fs.list_dir("memory://bkt/x")

    assert str(raised.value) == (
        "memory://bkt/x: the credentials could not get a token (google-auth's RefreshError: "
        "invalid_grant: Invalid JWT Signature.); no request reached GCS"
    )


def _listing_raising(error: Exception, monkeypatch: pytest.MonkeyPatch) -> StorageFileSystem:
    """A filesystem whose library raises `error` for any listing."""
    fs = StorageFileSystem(fsspec.filesystem("memory"))

    def refused(path: str, detail: bool) -> list[str]:
        raise error

    monkeypatch.setattr(fs._fs, "ls", refused)
    return fs
