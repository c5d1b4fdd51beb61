"""How `StorageFileSystem.make_durable` makes many local files durable: one syncfs of
their filesystem where that works and is cheap, else fsyncs (storage/durability.py).

A power loss cannot be simulated, so these tests observe the system calls that provide
durability (`durability_calls`), with the real calls still made; where a rule depends on
the machine (its dirty data, its C library, its kernel), that input is set by the test.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_checkpoint.storage import StorageFileSystem
from spark_checkpoint.storage import durability as durability_module

from .conftest import DurabilityCall, choose_syncfs


def linked_files(directory: Path, count: int) -> list[str]:
    """`count` new files in two directories, as Spark writes them: not fsynced."""
    paths = []
    for index in range(count):
        path = directory / "shared" / f"{index % 2:02x}" / f"{index}.delta"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"state %d" % index)
        paths.append(str(path))
    return paths


def fsyncs_of(files: list[str]) -> list[DurabilityCall]:
    directories = {os.path.dirname(path) for path in files}
    return sorted(("fsync", path) for path in [*files, *directories])


def syncfs_of(path: str | Path) -> DurabilityCall:
    return ("syncfs", str(os.stat(path).st_dev))


def local_fs(directory: Path) -> StorageFileSystem:
    return StorageFileSystem.for_url(f"file://{directory}").confined(str(directory))


@pytest.mark.parametrize(("beyond", "expected"), [(0, "syncfs"), (1, "fsync")])
def test_syncfs_is_chosen_while_dirty_data_is_within_its_allowance(
    tmp_path: Path,
    durability_calls: list[DurabilityCall],
    monkeypatch: pytest.MonkeyPatch,
    beyond: int,
    expected: str,
) -> None:
    """syncfs also writes (and waits for) everyone else's dirty data on the filesystem:
    beyond an allowance that grows with the fsyncs it replaces, the fsyncs are cheaper."""
    choose_syncfs(monkeypatch, tmp_path)
    files = linked_files(tmp_path, 5)
    fsyncs = len(files) + 2  # and their two directories
    dirty = (
        durability_module._SYNCFS_DIRTY_BYTES
        + fsyncs * durability_module._SYNCFS_DIRTY_BYTES_PER_FSYNC
        + beyond
    )
    monkeypatch.setattr(durability_module, "_dirty_bytes", lambda: dirty)

    local_fs(tmp_path).make_durable(files)

    assert sorted(durability_calls) == (
        [syncfs_of(tmp_path)] if expected == "syncfs" else fsyncs_of(files)
    )


def refusing_syncfs(code: int) -> Callable[[int], int]:
    def syncfs(_descriptor: int) -> int:
        ctypes.set_errno(code)
        return -1

    return syncfs


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("_syncfs", None),  # not Linux, or a C library without syncfs
        ("_SYNCFS_FILESYSTEMS", frozenset()),  # e.g. FUSE, whose syncfs may store nothing
        ("_dirty_bytes", lambda: None),  # /proc/meminfo unreadable
        ("_syncfs", refusing_syncfs(errno.ENOSYS)),  # a sandbox without the system call
        ("_syncfs", refusing_syncfs(errno.EPERM)),  # a seccomp profile refusing it
    ],
)
def test_files_are_fsynced_where_syncfs_is_not_known_to_work(
    tmp_path: Path,
    durability_calls: list[DurabilityCall],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: object,
) -> None:
    choose_syncfs(monkeypatch, tmp_path)
    monkeypatch.setattr(durability_module, name, value)
    files = linked_files(tmp_path, 3)

    local_fs(tmp_path).make_durable(files)

    assert sorted(durability_calls) == fsyncs_of(files)


@pytest.fixture
def other_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A directory on a filesystem other than `tmp_path`'s (/dev/shm, a tmpfs)."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no tmpfs at /dev/shm apart from the test's directory")
    directory = Path(tempfile.mkdtemp(prefix="durability-", dir="/dev/shm"))
    yield directory
    shutil.rmtree(directory)


@pytest.mark.parametrize("syncfs", [True, False])
def test_each_filesystem_is_handled_on_its_own(
    tmp_path: Path,
    other_filesystem: Path,
    durability_calls: list[DurabilityCall],
    monkeypatch: pytest.MonkeyPatch,
    syncfs: bool,
) -> None:
    """One syncfs for the files on a filesystem it is used on, fsyncs for those on a tmpfs
    (which it is not used on); without syncfs, fsyncs for both."""
    choose_syncfs(monkeypatch, tmp_path)
    if not syncfs:
        monkeypatch.setattr(durability_module, "_syncfs", None)
    here = linked_files(tmp_path, 3)
    there = linked_files(other_filesystem, 3)

    local_fs(tmp_path).make_durable([*there, *here])

    made_durable_here = [syncfs_of(tmp_path)] if syncfs else fsyncs_of(here)
    assert sorted(durability_calls) == sorted([*made_durable_here, *fsyncs_of(there)])


def test_the_filesystem_type_is_the_one_statfs_reports(tmp_path: Path) -> None:
    """`struct statfs` is read by offset: it must agree with coreutils' stat."""
    if durability_module._fstatfs is None:
        pytest.skip("the C library has no fstatfs")
    reported = subprocess.run(
        ["stat", "--file-system", "--format=%t", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    descriptor = os.open(tmp_path, os.O_RDONLY)
    try:
        assert durability_module._filesystem_type(descriptor) == int(reported, 16)
    finally:
        os.close(descriptor)


def test_dirty_data_is_read_from_meminfo() -> None:
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo")
    dirty = durability_module._dirty_bytes()

    assert dirty is not None
    assert dirty >= 0
    assert dirty % 1024 == 0


def test_dirty_data_is_unknown_without_both_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Then syncfs is not chosen: its cost cannot be bounded."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684084 kB\nDirty:             16552 kB\n")
    monkeypatch.setattr(durability_module, "_MEMINFO", str(meminfo))

    assert durability_module._dirty_bytes() is None
    meminfo.write_text(meminfo.read_text() + "Writeback:            20 kB\n")
    assert durability_module._dirty_bytes() == (16552 + 20) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="syncfs is Linux's")
def test_syncfs_and_fstatfs_are_found_on_linux() -> None:
    """Else every syncfs test here skips, and checkpoints silently pay for fsyncs."""
    assert durability_module._syncfs is not None
    assert durability_module._fstatfs is not None
