"""Which files of a live Spark checkpoint location make up a consistent image at batch B.

Facts this relies on (verified in docs/spark-checkpoint-layout.md):
- batch B is committed exactly when ``commits/B`` exists; state version B+1 is the state
  after batch B;
- every file Spark writes is renamed into place complete and never modified afterwards, so
  a hard link taken now keeps its bytes even when Spark's maintenance deletes the original;
- files of versions <= B+1 stay until ``minBatchesToRetain`` newer versions exist, so
  pinning right after B commits wins the race against Spark's cleanup.

A snapshot is split into tasks: ``logs`` (query metadata, offset, commit and source logs,
state schemas) and one task per state-store partition, named ``state-<op>-<part>`` (plus
``-<store>`` for operators with several stores).
"""

import errno
import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from spark_checkpoint.query_logs import (
    BATCH_FILE,
    COMPACT_FILE,
    file_source_log_offsets,
    read_offset_log_entry,
    source_dirs,
)
from spark_checkpoint.storage.errors import SymbolicLinkError
from spark_checkpoint.storage.filesystem import require_no_link_below

LOGS_TASK = "logs"
# What `SymbolicLinkError` says links are never followed out of.
_LOCATION = "the query's checkpoint location"

# transformWithState's operator metadata and schema files: `<batch>` and `<batch>_<uuid>`.
_WRITTEN_BY_BATCH = re.compile(r"^(\d+)(?:_[0-9a-fA-F-]+)?$")
_STATE_FILE = re.compile(r"^(\d+)\.(delta|snapshot|zip|changelog)$")
# checkpointFormatVersion=2 names files <version>_<uniqueId>; which one a version uses is
# recorded in commits/B. Not supported yet: refused rather than guessed.
_UNIQUE_ID_STATE_FILE = re.compile(r"^\d+_[0-9a-fA-F-]+\.(delta|snapshot|zip|changelog)$")


class SnapshotError(Exception):
    """The live checkpoint location does not hold what an image at batch B needs."""


@dataclass(frozen=True, slots=True)
class StatePartition:
    """One state store instance: ``state/<operator>/<partition>[/<store>]``."""

    operator: str
    partition: str
    store: str | None
    path: str  # relative to the checkpoint location

    @property
    def task(self) -> str:
        suffix = f"-{self.store}" if self.store else ""
        return f"state-{self.operator}-{self.partition}{suffix}"


@dataclass(frozen=True, slots=True)
class SnapshotPlan:
    """The files (relative paths) each task must copy for an image at ``batch_id``."""

    batch_id: int
    files_by_task: dict[str, tuple[str, ...]]

    @property
    def tasks(self) -> frozenset[str]:
        return frozenset(self.files_by_task)


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """Which file a name of the live location stands for. Spark renames complete files
    into place and never rewrites one, so a name with the same identity as before has
    the same bytes (an in-place rewrite would change the modification time)."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def file_identities(location: Path, relative_paths: Iterable[str]) -> dict[str, FileIdentity]:
    """The identity of each of these files that exists (one gone is left out: pinning it
    reports that)."""
    identities: dict[str, FileIdentity] = {}
    for relative in relative_paths:
        try:
            found = os.stat(location / relative)
        except FileNotFoundError:
            continue
        identities[relative] = FileIdentity(
            found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns
        )
    return identities


def committed_batches(location: Path) -> list[int]:
    return _numbered(location / "commits")


def planned_batches(location: Path) -> list[int]:
    return _numbered(location / "offsets")


@dataclass(frozen=True, slots=True)
class _Listing:
    """The names in one directory: its subdirectories and everything else."""

    directories: frozenset[str]
    others: tuple[str, ...]

    @property
    def names(self) -> Iterator[str]:
        yield from self.directories
        yield from self.others


def _listing(directory: Path) -> _Listing:
    # One scandir: its entries know their type without a stat per name, which at Spark's
    # 200 partitions and more was most of the time a snapshot took to plan.
    directories: set[str] = set()
    others: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if _is_dir(entry):
                directories.add(entry.name)
            else:
                others.append(entry.name)
    return _Listing(frozenset(directories), tuple(others))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # as Path.is_dir: a link that cannot be followed is no directory
        return False


def state_partitions(location: Path) -> list[StatePartition]:
    """State store instances present in the live location, in a stable order."""
    return [partition for partition, _list in _listed_state_partitions(location)]


def _listed_state_partitions(
    location: Path,
) -> Iterator[tuple[StatePartition, Callable[[], _Listing]]]:
    """Each state store instance, and how to list its directory: the partition's own
    listing, made once to find its stores, or the store's, made only when asked for."""
    state = location / "state"
    for operator in _numeric_dirs(state):
        for partition in _numeric_dirs(state / operator):
            partition_dir = state / operator / partition
            listing = _listing(partition_dir)
            stores = sorted(
                name
                for name in listing.directories
                if not name.startswith(("_", ".")) and name not in ("SSTs", "logs")
            )
            if stores and not any(_STATE_FILE.match(name) for name in listing.names):
                for store in stores:
                    yield (
                        StatePartition(
                            operator, partition, store, f"state/{operator}/{partition}/{store}"
                        ),
                        functools.partial(_listing, partition_dir / store),
                    )
            else:
                yield (
                    StatePartition(operator, partition, None, f"state/{operator}/{partition}"),
                    functools.partial(_same, listing),
                )


def snapshot_tasks(location: Path) -> frozenset[str]:
    """The tasks a checkpoint of this query needs; empty before the first commit."""
    if not committed_batches(location):
        return frozenset()
    return frozenset({LOGS_TASK, *(p.task for p in state_partitions(location))})


def plan_snapshot(location: Path, batch_id: int) -> SnapshotPlan:
    """What each task copies so that a fresh location restarts after ``batch_id``."""
    if not (location / "commits" / str(batch_id)).is_file():
        raise SnapshotError(f"batch {batch_id} is not committed in {location}")
    for needed in {batch_id - 1, batch_id} - {-1}:
        # A restart reads both (Spark's populateStartOffsets); Spark's purge takes B-1 once
        # B+1 is planned under spark.sql.streaming.minBatchesToRetain=1.
        if not (location / "offsets" / str(needed)).is_file():
            raise SnapshotError(
                f"offsets/{needed} is gone from {location} (purged by Spark: "
                "spark.sql.streaming.minBatchesToRetain too small?); a restart at batch "
                f"{batch_id} needs it"
            )
    files_by_task = {LOGS_TASK: tuple(_log_files(location, batch_id))}
    for partition, list_directory in _listed_state_partitions(location):
        files_by_task[partition.task] = tuple(
            _state_files(location, partition.path, list_directory(), batch_id + 1)
        )
    return SnapshotPlan(batch_id, files_by_task)


def pin(location: Path, relative_paths: Iterable[str], pin_dir: Path) -> None:
    """Hard-link files into ``pin_dir`` so Spark's cleanup cannot take them away.

    Falls back to a copy where links are impossible (another filesystem); a file that is
    already gone means the image cannot be taken, which is reported, never papered over.
    Spark writes no symbolic link there: one in the way (a directory, or a file, placed by
    whoever else writes the location) raises SymbolicLinkError instead of being followed
    (the image would hold, and a restore bring back, whatever it points at).
    """
    boundary = str(location)
    checked: set[str] = set()
    for relative in relative_paths:
        source, target = location / relative, pin_dir / relative
        if (directory := str(source.parent)) not in checked:
            require_no_link_below(boundary, directory, _LOCATION)
            checked.add(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target, follow_symlinks=False)
        except FileNotFoundError:
            raise SnapshotError(f"{relative} disappeared before it could be pinned") from None
        except OSError:
            _copy_file(source, target)
        if stat.S_ISLNK(os.lstat(target).st_mode):  # the link itself was linked
            pointed_at = os.readlink(target)
            target.unlink()
            raise SymbolicLinkError(str(source), pointed_at, _LOCATION)


def _copy_file(source: Path, target: Path) -> None:
    temporary = target.with_name(target.name + ".pinning")
    try:
        descriptor = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP:  # the file is a link
            raise SymbolicLinkError(str(source), os.readlink(source), _LOCATION) from None
        raise
    with open(descriptor, "rb") as reader, temporary.open("wb") as writer:
        while chunk := reader.read(1 << 20):
            writer.write(chunk)
    temporary.replace(target)


def _log_files(location: Path, batch_id: int) -> Iterator[str]:
    """What a restart at ``batch_id`` reads of the query logs: the offsets of B and B-1
    (Spark checks the second latest on restart), the commit of B, each source's metadata
    log (``_source_log_files``), and the state operators' metadata and schemas."""
    yield "metadata"
    for log, oldest in (("offsets", batch_id - 1), ("commits", batch_id)):
        yield from (f"{log}/{n}" for n in _numbered(location / log) if oldest <= n <= batch_id)
    sources = location / "sources"
    dirs = source_dirs(location)
    entry = read_offset_log_entry(location, batch_id)  # plan_snapshot refuses a B without one
    log_offsets = {} if entry is None else file_source_log_offsets(location, entry, dirs)
    for source in dirs:
        # A file source's log ids are its own: after a no-data batch they lag the batch ids,
        # and its entry for the uncommitted B+1 may be numbered B or below. In the image,
        # the restored query counts its files as read and folds them into its B+1 with the
        # next ones: batch boundaries, hence watermarks, timeouts and late rows, differed.
        bound = log_offsets.get(source, batch_id)
        yield from (
            f"sources/{source}/{name}" for name in _source_log_files(sources / source, bound)
        )
    state = location / "state"
    # State schemas and operator metadata: small, rewritten only under new names. Those
    # named after the batch that wrote them (transformWithState's `_metadata/v2/<batch>`,
    # `_stateSchema/.../<batch>_<uuid>`) are left out above B: Spark writes its own at the
    # first batch of the restored run only when no file of that name exists.
    # A stream-stream join's stores keep their schema in `<op>/<part>/<store>/_metadata`:
    # without it a restored query's schema goes unchecked (a changed column type read old
    # state as garbage).
    for pattern in ("*/_metadata", "*/*/_metadata", "*/*/*/_metadata"):
        for directory in sorted(state.glob(pattern)):
            yield from _files_up_to(location, directory, batch_id)
    for directory in sorted(state.glob("*/_stateSchema")) + sorted(state.glob("*/*/_stateSchema")):
        yield from _files_up_to(location, directory, batch_id)


def _source_log_files(directory: Path, batch_id: int) -> list[str]:
    """A file source's metadata log (a ``CompactibleFileStreamLog``) as of ``batch_id``.

    A restart reads the newest compaction ``C <= B`` and the batch files after it. Spark
    also derives the log's compact interval from the names of the ``.compact`` files it
    lists: the difference of the newest two, or a guess from ``C`` alone when there is only
    one, which can differ from the interval the query used (``19.compact`` alone gives 20
    where the query used 10) and later makes it look for a compaction that was never
    written. So the compaction before ``C`` comes too, whenever the live log still has it.
    """
    batches: dict[int, str] = {}
    compactions: dict[int, str] = {}
    for name in os.listdir(directory):
        if (match := BATCH_FILE.match(name)) and int(match[1]) <= batch_id:
            batches[int(match[1])] = name
        elif (match := COMPACT_FILE.match(name)) and int(match[1]) <= batch_id:
            compactions[int(match[1])] = name
    newest_two = sorted(compactions)[-2:]
    since = newest_two[-1] if newest_two else -1
    return [compactions[n] for n in newest_two] + [batches[n] for n in sorted(batches) if n > since]


def _state_files(location: Path, partition: str, listing: _Listing, version: int) -> list[str]:
    """Files to rebuild ``version`` of one state store (``listing``: its directory's): the
    newest full image (snapshot or RocksDB zip) at or below it, the deltas or changelogs
    after it, and RocksDB's SSTs.

    RocksDB's SST files are shared by many versions; all present ones are taken (a
    superset of what the zip references), which keeps the rule independent of RocksDB's
    internal manifest and costs nothing extra with incremental, content-addressed storage.
    """
    directory = location / partition
    versions: dict[int, dict[str, str]] = {}
    for name in listing.names:
        if _UNIQUE_ID_STATE_FILE.match(name):
            raise SnapshotError(
                f"{partition}/{name}: spark.sql.streaming.stateStore.checkpointFormatVersion=2 "
                "is not supported; use the default version 1"
            )
        match = _STATE_FILE.match(name)
        if match and int(match[1]) <= version:
            versions.setdefault(int(match[1]), {})[match[2]] = f"{partition}/{name}"
    full_images = [v for v, kinds in versions.items() if kinds.keys() & {"snapshot", "zip"}]
    base = max(full_images, default=0)  # version 0 is the empty state: no file needed
    missing = [
        v
        for v in range(base + 1, version + 1)
        if not versions.get(v, {}).keys() & {"delta", "changelog"}
    ]
    if missing:
        raise SnapshotError(
            f"{partition}: version {version} cannot be rebuilt; missing versions {missing}"
        )
    selected = [versions[base][k] for k in ("snapshot", "zip") if k in versions.get(base, {})]
    for v in range(base + 1, version + 1):
        selected += [versions[v][k] for k in ("delta", "changelog") if k in versions[v]]
    # Every SST (and archived RocksDB log, `RocksDBImmutableFile`) present: a superset of
    # what the zip lists; uploads in progress are hidden temporary names and are left out.
    for subdirectory, suffix in (("SSTs", ".sst"), ("logs", ".log")):
        if subdirectory in listing.directories:
            selected += [
                f"{partition}/{subdirectory}/{name}"
                for name in sorted(os.listdir(directory / subdirectory))
                if name.endswith(suffix) and not name.startswith(".")
            ]
    return selected


def _files_up_to(location: Path, directory: Path, batch_id: int) -> Iterator[str]:
    for path in sorted(directory.rglob("*")):
        written_by = _WRITTEN_BY_BATCH.match(path.name)
        if written_by and int(written_by[1]) > batch_id:
            continue
        if path.is_file() and not path.name.endswith(".crc"):
            yield path.relative_to(location).as_posix()


def _same(listing: _Listing) -> _Listing:
    return listing


def _numbered(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(name) for name in os.listdir(directory) if BATCH_FILE.match(name))


def _numeric_dirs(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    names = [name for name in _listing(directory).directories if name.isdigit()]
    return sorted(names, key=int)
