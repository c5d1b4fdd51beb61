"""A two-phase-commit file sink for Spark Structured Streaming's ``foreachBatch``.

Contract
--------
Output committed by `TransactionalFileSink` is **never ahead of the restorable state** and is
**exactly-once**: a micro-batch's rows become visible under ``committed/`` only after the
checkpoint coordinator has registered a checkpoint covering that batch, and each batch id is
committed at most once, even when batches are replayed after a restore from an older
checkpoint or when any step below is interrupted by a crash.

Layout (local filesystem)
-------------------------
::

    <output>/_staging/batch-<B>/      # phase 1: batch B written, waiting for its checkpoint
    <output>/_staging/_tmp/...        # Spark writes here first; discards pass through here
    <output>/committed/batch-<B>/     # phase 2: batch B is durable output

Each batch directory holds what Spark's JSON writer produces (``part-*.json`` files with one
JSON object per line, plus ``_SUCCESS`` and Hadoop ``.crc`` files). Batch ids are canonical
decimal integers (``batch-7``, never ``batch-07``); other names are ignored.

Protocol (`CheckpointParticipant`)
----------------------------------
1. ``write_batch(df, B)`` (Spark's ``foreachBatch``): Spark writes the batch into a fresh
   temporary directory, the files are fsynced, and the directory is renamed to
   ``_staging/batch-B`` (replacing an earlier staged attempt of the same batch). Spark records
   ``commits/B`` in its checkpoint location only after this returns, so a batch that Spark
   considers done is always staged. If ``committed/batch-B`` already exists, the batch is a
   replay of output committed in an earlier attempt: it is computed but its output dropped.
2. ``on_checkpoint_complete(B)`` (the agent, after the coordinator registered a checkpoint
   covering batches <= B): every staged batch <= B is committed, in ascending batch order, by
   renaming its directory to ``committed/batch-<id>``.
3. ``on_restore(R)`` (before the restored query starts): staged batches > R are discarded
   (Spark re-runs them from the restored offsets); staged batches <= R are committed, because
   the restored checkpoint is registered, so the crash came between the registry update and
   the notification. ``R = None`` is a fresh start: every staged batch is discarded.

Crash consistency: every state change is a single ``rename(2)`` of a complete directory, so
a batch is at any time wholly absent, wholly staged or wholly committed, never partial.
Renames are followed by an fsync of the directories involved so they survive a power loss.
An interrupted step leaves either garbage in ``_staging/_tmp`` (removed by `on_restore`) or
a prefix of its renames done; repeating the call finishes it. Discarding a directory renames
it into ``_staging/_tmp`` before deleting it, so a half-deleted batch is never visible.

On an object store (S3, GCS, ABFS) there is no atomic directory rename; the same protocol
works with marker objects instead: a batch is written under an attempt-specific prefix and
becomes staged when a ``_staging/batch-B`` marker object naming the attempt is written, and
committed when a ``committed/batch-B`` marker object naming it is written (a single PUT is
atomic per object). Readers and the replay check then look only at markers, never at a
listing of data objects, and a discard deletes the marker first and the data after.

Assumptions
-----------
- One writer: a single driver owns an output directory (the same rule Spark has for a
  checkpoint location). Calls are serialised by a lock inside one sink instance, so
  `on_checkpoint_complete` may run on the agent's thread while Spark stages the next batch.
- Skipping a replayed batch by id is exact when the replay reads the same input as the
  original run, which is what Spark does when it re-runs a batch from its offset log entry
  ``offsets/B``. A batch that Spark has to *plan again* (its offsets are not in the restored
  checkpoint) can cover a different range of the input than the committed one of the same id;
  the skip is then exact only if the source plans batches deterministically (for example a
  file source with ``maxFilesPerTrigger`` over files that were all present originally).
- A skipped replay is still computed (into Spark's ``noop`` sink): stateful operators commit
  their state for a batch only while its partitions are computed, and Spark 4 fails a batch
  whose ``foreachBatch`` returned without computing them.
- Executors write the batch through Spark, so with a cluster the output directory must be on
  a filesystem every executor and the driver share (local mode needs nothing).

Importing this module does not import pyspark.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.request import url2pathname

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "COMMITTED_DIR",
    "STAGING_DIR",
    "CheckpointParticipant",
    "TransactionalFileSink",
    "batch_dir_name",
    "latest_values",
    "parse_batch_dir_name",
    "read_committed",
]

logger = logging.getLogger(__name__)

STAGING_DIR = "_staging"
"""Directory (under the output directory) of batches written but not yet committed."""

COMMITTED_DIR = "committed"
"""Directory (under the output directory) of committed batches."""

_TMP_DIR = "_tmp"
_FSYNC_UNSUPPORTED_ERRNOS = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF})
_BATCH_DIR_PATTERN = re.compile(r"batch-(0|[1-9][0-9]*)")


@runtime_checkable
class CheckpointParticipant(Protocol):
    """What the checkpoint agent calls on a sink that takes part in checkpoints.

    A participant stages each micro-batch's output and makes it visible only when a
    checkpoint covering the batch is registered, which is what keeps output from ever
    running ahead of the state a restore can bring back.
    """

    def write_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        """Stage the output of micro-batch `batch_id` (the ``foreachBatch`` function).

        It must compute every partition of `batch_df`, even when it drops the output:
        stateful operators commit the batch's state only then."""
        ...

    def on_checkpoint_complete(self, batch_id: int) -> None:
        """Commit staged output of batches <= `batch_id`: a checkpoint covering them is
        registered. Must be idempotent and safe to call while a batch is being staged."""
        ...

    def on_restore(self, restored_batch: int | None) -> None:
        """Reconcile staged output before the query starts from the checkpoint of
        `restored_batch` (``None``: fresh start, no checkpoint)."""
        ...


def batch_dir_name(batch_id: int) -> str:
    """The directory name of batch `batch_id`: ``batch-<id>``."""
    _require_batch_id(batch_id, "batch_id")
    return f"batch-{batch_id}"


def parse_batch_dir_name(name: str) -> int | None:
    """The batch id of a canonical batch directory name, else ``None``."""
    match = _BATCH_DIR_PATTERN.fullmatch(name)
    return int(match.group(1)) if match else None


_URI = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://(?P<authority>[^/]*)(?P<path>.*)")


def _local_directory(output_dir: str | os.PathLike[str]) -> Path:
    """``output_dir`` as a local path. A URI would otherwise become a relative directory
    named after its scheme (``s3a:/bucket/...``), written silently on the driver's disk."""
    text = os.fspath(output_dir)
    uri = _URI.fullmatch(text)
    if uri is None:
        return Path(text)
    if uri["scheme"].lower() == "file" and uri["authority"] in ("", "localhost"):
        return Path(url2pathname(uri["path"]))
    raise ValueError(
        f"TransactionalFileSink writes to a local filesystem only, not {text!r}: commits are "
        "directory renames, which object stores do not have. Give a local path, on a cluster "
        "a shared volume mounted at the same path in the driver and the executors"
    )


class TransactionalFileSink:
    """A two-phase-commit sink writing each micro-batch as JSON lines on a local filesystem.

    Use it as ``query.writeStream.foreachBatch(sink.write_batch)`` and hand the same instance
    to the checkpoint agent, which calls `on_restore` before the query starts and
    `on_checkpoint_complete` after each registered checkpoint. The module docstring describes
    the layout, the protocol and why it is crash-consistent. Committed output is never ahead
    of the restorable state and is exactly-once.
    """

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        """Use `output_dir` (created if missing) for staged and committed output: a local
        path or ``file://`` URI. Another filesystem's URI raises ValueError (object stores
        are not supported yet: see the module docstring)."""
        self._root = _local_directory(output_dir).absolute()
        self._staging = self._root / STAGING_DIR
        self._committed = self._root / COMMITTED_DIR
        self._tmp = self._staging / _TMP_DIR
        self._lock = threading.Lock()
        for directory in (self._staging, self._committed, self._tmp):
            directory.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._root)!r})"

    @property
    def output_dir(self) -> Path:
        """The absolute output directory."""
        return self._root

    def staged_batches(self) -> list[int]:
        """Ids of the batches staged and not yet committed, ascending."""
        return _batch_ids(self._staging)

    def committed_batches(self) -> list[int]:
        """Ids of the committed batches, ascending."""
        return _batch_ids(self._committed)

    def write_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        """Stage micro-batch `batch_id` under ``_staging/batch-<id>`` (phase 1).

        Pass it to ``foreachBatch``. Spark writes the rows as JSON lines into a temporary
        directory, which is then renamed into place, replacing an earlier staged attempt of
        the same batch. A batch already committed (a replay after a restore from an older
        checkpoint) is recognised by its id and not staged again; it is still executed, into
        Spark's ``noop`` sink, because stateful operators commit their state for the batch
        only when every partition of the batch is computed.
        """
        _require_batch_id(batch_id, "batch_id")
        name = batch_dir_name(batch_id)
        if (self._committed / name).exists():
            logger.info(
                "batch %d is already committed; discarding the output of its replay", batch_id
            )
            _run_without_output(batch_df)
            return
        attempt = self._tmp / f"{name}-{uuid.uuid4().hex}"
        try:
            # Not Path.as_uri(): Hadoop's Path does not decode percent escapes, so a
            # directory named "a b" would be written to one named "a%20b".
            batch_df.write.mode("overwrite").json(f"file://{attempt.as_posix()}")
            _fsync_tree(attempt)
            with self._lock:
                if (self._committed / name).exists():
                    logger.warning(
                        "batch %d was committed while it was being written; dropping the write",
                        batch_id,
                    )
                    return
                target = self._staging / name
                replaced = target.exists()
                if replaced:
                    self._discard(target)
                os.rename(attempt, target)
                _fsync_dir(self._staging)
            if replaced:
                logger.info("batch %d staged again, replacing an earlier attempt", batch_id)
            else:
                logger.info("batch %d staged", batch_id)
        finally:
            shutil.rmtree(attempt, ignore_errors=True)

    def on_checkpoint_complete(self, batch_id: int) -> None:
        """Commit every staged batch <= `batch_id`, in ascending order (phase 2).

        Called once a checkpoint covering batches <= `batch_id` is registered. Idempotent
        (an already committed batch is not staged any more) and thread-safe. If it raises,
        a prefix of the batches is committed and the rest is still staged: call it again.
        """
        _require_batch_id(batch_id, "batch_id")
        with self._lock:
            self._commit_through(batch_id)

    def on_restore(self, restored_batch: int | None) -> None:
        """Reconcile staged output before a query starts from a restored checkpoint.

        Staged batches > `restored_batch` are discarded (the query re-runs them); staged
        batches <= `restored_batch` are committed (the restored checkpoint is registered, so
        their notification was lost in a crash). ``None`` means a fresh start without a
        checkpoint: every staged batch is discarded. Leftovers of interrupted writes are
        removed. Committed batches are never touched. Idempotent.
        """
        if restored_batch is not None:
            _require_batch_id(restored_batch, "restored_batch")
        with self._lock:
            self._clear_tmp()
            for batch_id in _batch_ids(self._staging):
                if restored_batch is None or batch_id > restored_batch:
                    self._discard(self._staging / batch_dir_name(batch_id))
                    logger.info("discarded staged batch %d (it will be re-run)", batch_id)
            if restored_batch is not None:
                self._commit_through(restored_batch)
            ahead = [
                batch_id
                for batch_id in _batch_ids(self._committed)
                if restored_batch is None or batch_id > restored_batch
            ]
            if ahead:
                logger.warning(
                    "restoring %s while batches %d..%d are already committed: their "
                    "replays will be skipped",
                    "a fresh start" if restored_batch is None else f"batch {restored_batch}",
                    ahead[0],
                    ahead[-1],
                )

    def _commit_through(self, batch_id: int) -> None:
        """Commit staged batches <= `batch_id` in ascending order. Caller holds the lock."""
        for staged_id in _batch_ids(self._staging):
            if staged_id > batch_id:
                break
            name = batch_dir_name(staged_id)
            source, target = self._staging / name, self._committed / name
            if target.exists():
                logger.warning("batch %d is already committed; dropping its staged copy", staged_id)
                self._discard(source)
                continue
            os.rename(source, target)
            _fsync_dir(self._committed)
            _fsync_dir(self._staging)
            logger.info("batch %d committed", staged_id)

    def _discard(self, directory: Path) -> None:
        """Remove `directory` so that it disappears in one rename. Caller holds the lock."""
        doomed = self._tmp / f"discard-{directory.name}-{uuid.uuid4().hex}"
        os.rename(directory, doomed)
        _fsync_dir(directory.parent)
        shutil.rmtree(doomed)

    def _clear_tmp(self) -> None:
        self._tmp.mkdir(parents=True, exist_ok=True)
        for leftover in self._tmp.iterdir():
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()


def read_committed(output_dir: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """The committed output of a `TransactionalFileSink`: batch id -> rows, ascending ids.

    Rows of a batch come in the order of its part files (by name) and of the lines in each.
    Hidden files (``_SUCCESS``, ``.crc``) are skipped. A missing output directory reads as
    no output.
    """
    committed = Path(output_dir) / COMMITTED_DIR
    return {
        batch_id: list(_read_rows(committed / batch_dir_name(batch_id)))
        for batch_id in _batch_ids(committed)
    }


def latest_values(output_dir: str | os.PathLike[str], key: str) -> dict[str, dict[str, Any]]:
    """For an update-mode aggregation's output: for each value of column `key`, the row
    from the highest committed batch that contains it.

    Key values that are not strings are keyed by their JSON text (``5`` -> ``"5"``). A row
    without `key` (Spark's JSON writer leaves out null fields) or a key occurring twice in
    one batch raises ValueError: neither can come from an update-mode aggregation keyed by
    `key`.
    """
    latest: dict[str, dict[str, Any]] = {}
    for batch_id, rows in read_committed(output_dir).items():
        seen: set[str] = set()
        for row in rows:
            if row.get(key) is None:
                raise ValueError(f"batch {batch_id}: a row has no value for {key!r}: {row}")
            value = row[key]
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            if text in seen:
                raise ValueError(f"batch {batch_id}: {key!r} = {text!r} occurs more than once")
            seen.add(text)
            latest[text] = row
    return latest


def _run_without_output(batch_df: DataFrame) -> None:
    """Compute every partition of `batch_df` and drop the rows.

    A stateful query's batch DataFrame must be computed in full: its state store commits
    (state version B+1) happen while the partitions are computed, and Spark 4 fails the
    batch (STATE_STORE_COMMIT_VALIDATION_FAILED) if ``foreachBatch`` returns without them.
    """
    batch_df.write.format("noop").mode("overwrite").save()


def _require_batch_id(value: int, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be a non-negative integer, not {value!r}")


def _batch_ids(directory: Path) -> list[int]:
    """Ids of the canonical batch directories in `directory`, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(
        batch_id
        for name in names
        if (batch_id := parse_batch_dir_name(name)) is not None and (directory / name).is_dir()
    )


def _read_rows(batch_dir: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(batch_dir.iterdir()):
        if path.name.startswith(("_", ".")) or not path.is_file():
            continue
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{number}: expected a JSON object, got {line!r}")
                yield row


def _fsync_tree(directory: Path) -> None:
    """Flush every file below `directory`, then the directories themselves."""
    for parent, _dirs, files in os.walk(directory, topdown=False):
        for name in files:
            descriptor = os.open(os.path.join(parent, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        _fsync_dir(Path(parent))


def _fsync_dir(directory: Path) -> None:
    """Make renames in `directory` durable. Skipped where directories cannot be opened or
    flushed (Windows; filesystems answering EINVAL), which offer no other way to do it."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except (PermissionError, IsADirectoryError):
        return
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in _FSYNC_UNSUPPORTED_ERRNOS:
            raise
    finally:
        os.close(descriptor)
