"""A two-phase-commit file sink for Spark Structured Streaming's ``foreachBatch``.

Contract
--------
Output committed by `TransactionalFileSink` is **never ahead of the restorable state** and is
**exactly-once**: a micro-batch's rows become visible (to `read_committed`) only after the
checkpoint coordinator has registered a checkpoint covering that batch, and each batch id is
committed at most once, even when batches are replayed after a restore from an older
checkpoint or when any step below is interrupted by a crash.

The output directory is a local path, or an ``s3://`` (``s3a://``), ``gs://`` or ``abfs://``
(``abfss://``, ``az://``) URI: one protocol and one reader for all of them, over fsspec
(`spark_checkpoint.sink_storage`). Nothing is ever renamed: a batch is committed by
creating one small **commit record**, a create-only write that is atomic on each of them.

Layout
------
::

    <output>/_data/batch-<B>/<attempt>/part-<P>-<task>.json   # data objects of one attempt
    <output>/_staging/batch-<B>.epoch-<E>.json  # staged record: batch B written by the
                                         # driver of writer epoch E, awaiting its checkpoint
    <output>/committed/batch-<B>.json    # commit record: batch B is output
    <output>/_owner.json                 # the job the output belongs to
    <output>/_epochs/epoch-<E>.json      # the writer epoch of the driver writing the output

A data object holds one partition of the batch as JSON lines (one object per row, as
Spark's JSON writer writes them). ``<attempt>`` is a fresh random id per `write_batch`, and
``<task>`` one per Spark task attempt, so no write ever lands on a name another attempt
wrote or a record lists. A **record** (staged or commit) is a small JSON document naming
the batch, the attempt and its data objects in partition order, each with its size::

    {"format": 1, "batch": 7, "attempt": "3f2a...",
     "files": [{"path": "_data/batch-7/3f2a.../part-00000-9c1e....json", "size": 1234}]}

**Readers see a batch exactly when its commit record exists, and only the objects it
lists.** Data objects that no record lists (of killed attempts, failed tasks, replays) are
invisible and are garbage-collected. Directories starting with ``_`` are also what Hadoop
and Spark readers skip. Batch ids are canonical decimal integers (``batch-7``, never
``batch-07``); other names are ignored.

Protocol (`CheckpointParticipant`)
----------------------------------
1. ``write_batch(df, B)`` (Spark's ``foreachBatch``): if ``committed/batch-B.json`` exists
   the batch is a replay of output committed in an earlier attempt: it is computed (into
   Spark's ``noop`` sink) and its output dropped. Otherwise Spark's tasks write the data
   objects of a new attempt; then, once the driver's writer epoch E is found current, the
   staged record ``_staging/batch-B.epoch-E.json`` is written (replacing an earlier
   attempt's of the same driver, whose objects are deleted after its record). Spark
   records ``commits/B`` in its checkpoint location only after this returns, so a batch
   that Spark considers done is always staged.
2. ``on_checkpoint_complete(B)`` (the agent, after the coordinator registered a checkpoint
   covering batches <= B): every staged batch <= B is committed, in ascending batch order:
   of a batch staged by several drivers the newest one's record (the others, of drivers
   that ran on once superseded, are dropped; a newer driver's are never touched), its
   commit record is created from that staged record (create-only), the batch's data
   objects that the commit record does not list are deleted, then the staged records.
   If the commit record exists already, it wins: one identical to the staged record is
   this commit's own (written before a crash, or by a request whose answer was lost, so
   that the store refused its retry); another of the same input means the staged one is
   a duplicate (a superseded driver committed its own copy), whose objects are deleted
   and never seen; one of other input fails the commit (`ReplayDiffers`), and a refusal
   with no record there fails it too (OSError), the staged record kept for another try.
   A staged copy some of whose objects are gone (a superseded driver's garbage
   collection took them before the copy was staged) is never committed (OSError; a
   restore commits an older whole copy of the same input, or refuses to start).
3. ``on_restore(R, job)`` (before the restored query starts): the output must be `job`'s
   or no job's yet (``_owner.json``, created create-only; another job is refused, as its
   batch ids would collide with the owner's). The driver claims the next writer epoch
   (``_epochs/epoch-<E>.json``, create-only; it creates it once more, and a store that
   does not refuse that, ignoring the condition, is refused: `StartRefused`) and deletes
   the older ones, which fences every earlier driver: one that runs on finds a newer epoch
   before it stages its next batch or commits, and fails (`Superseded`). Staged batches
   <= R are committed (of several copies, the newest that read the input the restored
   image's batch read), because the restored checkpoint is registered, so the crash came
   between the registry update and the notification. Staged batches > R stay until their
   batch is committed (Spark re-runs them from the restored offsets, and this driver's
   copy of each, staged under its newer epoch, wins): the superseded driver may be
   committing one right now (its epoch check passed just before the claim), so neither
   record nor data objects may go before a commit record decides. ``R = None`` is a fresh
   start: no staged batch is committed, and a committed batch refuses the start (an
   earlier run's output: new batches of its id would be dropped as replays). Then, the
   epoch found still the newest, garbage is collected: the data objects of every batch
   that has neither a commit nor a staged record (attempts killed while writing), and what
   writes killed midway left that no listing shows
   (`OutputStorage.remove_unfinished_writes`): a local record's temporary whose writer is
   gone, an S3 multipart upload of a data object that was never completed.

Crash consistency: the visible state of a batch changes with one atomic write (of its
commit record), so a batch is at any time wholly invisible or wholly committed, never
partial. Every data object a record lists is complete and durable before the record is
written, and no object a commit record lists is ever deleted: a batch's data objects are
deleted only once its commit record exists, keeping what it lists (and a driver's own
attempt that no record lists, or that its own newer record replaced). An
interrupted step leaves either garbage no record lists, deleted when its batch is next
committed, or a prefix of its commits done; repeating the call finishes it.

Assumptions
-----------
- One writer: a single driver owns an output directory (the same rule Spark has for a
  checkpoint location); of two jobs, the one that did not start on it first is refused.
  Calls are serialised by a lock inside one sink instance, so `on_checkpoint_complete`
  may run on the agent's thread while Spark stages the next batch.
  The create-only commit also keeps a second writer (a driver that is not quite gone) from
  replacing a committed batch, and a starting driver removes only the temporaries whose
  writer is gone, never one that a second writer is still linking into place. A driver
  that runs on once the next one started (its pod force-deleted on a cut-off node) is
  fenced by the writer epochs: it stages and commits nothing once it finds a newer one, and
  a record it wrote just before (its check and the next driver's claim crossing) is never
  committed, as the next driver stages the same batch under its newer epoch. A commit it
  makes in that moment lands on data that is still there (see step 3); the next driver's
  copy of that batch then yields to it, as the same input's, or fails as another's.
- A replayed batch is skipped only when it reads the committed batch's input (each record
  keeps the SHA-256 of the batch's source offsets in ``offsets/B`` and of the files its file
  sources read), which is what Spark does when it re-runs a batch from its offset log
  entry. A batch that Spark has to *plan again* (its offsets are not in the restored
  checkpoint) can cover other input than the committed one of the same id (a batch that
  only advanced the watermark now reads new files; another ``maxFilesPerTrigger`` splits
  the files otherwise): it fails the query with ReplayDiffers, as it can be neither skipped
  nor committed.
  A record without its input (no checkpoint location was given) is skipped by id alone.
- A skipped replay is still computed (into Spark's ``noop`` sink): stateful operators commit
  their state for a batch only while its partitions are computed, and Spark 4 fails a batch
  whose ``foreachBatch`` returned without computing them.
- Spark's executors write the data objects (Python tasks over ``DataFrame.toJSON()``), so
  they need what the driver needs to reach the output: on a cluster, a local path must be a
  volume every executor mounts at the same path, and an object store's credentials must be
  in the executors' environment too (docs/user-guide.md).

Importing this module does not import pyspark.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import threading
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from .query_logs import (
    OffsetLogEntry,
    file_source_entries,
    file_source_log_offsets,
    read_offset_log_entry,
    source_dirs,
)
from .sink_storage import DATA_OBJECT_PATTERN, OutputStorage, write_partition
from .storage.errors import is_missing_bucket, missing_bucket_reason, printable_line

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame

__all__ = [
    "COMMITTED_DIR",
    "DATA_DIR",
    "EPOCHS_DIR",
    "OWNER_FILE",
    "STAGING_DIR",
    "BatchRecord",
    "CheckpointParticipant",
    "DamagedRecord",
    "ReplayDiffers",
    "StartRefused",
    "Superseded",
    "TransactionalFileSink",
    "batch_record_name",
    "latest_values",
    "parse_batch_record_name",
    "read_committed",
]

logger = logging.getLogger(__name__)
# PySpark 4 announces that toJSON will return a DataFrame some day, on every call; the sink
# needs the RDD it returns today (spark.sql.pyspark.toJSON.returnDataFrame=false, the default).
warnings.filterwarnings(
    "ignore",
    message="The return type of DataFrame.toJSON will be changed",
    module=r"pyspark\.sql\.classic\.dataframe",
)

STAGING_DIR = "_staging"
"""Directory (under the output directory) of the records of batches written but not yet
committed."""

COMMITTED_DIR = "committed"
"""Directory (under the output directory) of the commit records."""

DATA_DIR = "_data"
"""Directory (under the output directory) of the data objects of every attempt."""

MAX_OWNER_BYTES = 4096  # a record names one job; anything larger is none
OWNER_FILE = "_owner.json"
"""The job the output belongs to (under the output directory): ``{"format": 1, "job":
"<namespace>/<name>"}``."""

EPOCHS_DIR = "_epochs"
"""Directory (under the output directory) of the writer epoch of the driver that writes the
output (``epoch-<n>.json``): each driver claims the next one as it restores, and a driver
whose epoch is gone, or has a newer one beside it, has been superseded."""

RECORD_FORMAT = 1
_BATCH_RECORD_PATTERN = re.compile(r"batch-(0|[1-9][0-9]*)\.json")
# A staged record's name carries the writer epoch of the driver that staged it; one without
# it (epoch 0) was staged by a version that kept no epochs.
_STAGED_RECORD_PATTERN = re.compile(r"batch-(0|[1-9][0-9]*)(?:\.epoch-([1-9][0-9]*))?\.json")
_EPOCH_PATTERN = re.compile(r"epoch-([1-9][0-9]*)\.json")
_CLAIM_TRIES = 10
_ATTEMPT_PATTERN = re.compile(r"[0-9a-f]{32}")
_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")


class ReplayDiffers(RuntimeError):
    """A replay of a committed batch reads other input than the committed batch did: it
    can be neither skipped nor committed without breaking exactly-once (the query fails;
    the message says how to go on)."""


class Superseded(RuntimeError):
    """A newer driver claimed the output (its writer epoch is newer than this driver's):
    this driver stages and commits nothing more, and its query fails."""


class _StagedObjectsMissing(OSError):
    """A staged copy of a batch lists data objects that are gone: it is never committed."""


class StartRefused(Exception):
    """A participant refuses to start the query (`CheckpointParticipant.on_restore`):
    another attempt cannot help, so the driver exits MISCONFIGURED with this message."""


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

    def on_restore(
        self,
        restored_batch: int | None,
        job: str,
        *,
        checkpoint_location: str | os.PathLike[str] | None = None,
    ) -> None:
        """Reconcile staged output before the query starts from the checkpoint of
        `restored_batch` (``None``: fresh start, no checkpoint) in `checkpoint_location`,
        for `job` (``namespace/name``): output belongs to one job, which a restore from
        another job's savepoint (a fork) must not write into."""
        ...


def batch_record_name(batch_id: int) -> str:
    """The name of batch `batch_id`'s staged and commit records: ``batch-<id>.json``."""
    _require_batch_id(batch_id, "batch_id")
    return f"batch-{batch_id}.json"


def parse_batch_record_name(name: str) -> int | None:
    """The batch id of a canonical record name, else ``None``."""
    match = _BATCH_RECORD_PATTERN.fullmatch(name)
    return int(match.group(1)) if match else None


def _data_dir(batch_id: int) -> str:
    return f"{DATA_DIR}/batch-{batch_id}"


def _attempt_dir(batch_id: int, attempt: str) -> str:
    return f"{_data_dir(batch_id)}/{attempt}"


@dataclass(frozen=True)
class BatchRecord:
    """A staged or commit record: batch `batch`'s output is the data objects `files`
    (paths relative to the output directory, with their sizes) of attempt `attempt`."""

    batch: int
    attempt: str
    files: tuple[tuple[str, int], ...]
    # The input the batch read (None: not known, a record written without a checkpoint
    # location or before this was kept): SHA-256 of its source offsets in Spark's offset
    # log, and of the files its file sources read (`_source_files`; None without one too).
    source_offsets: str | None = None
    source_files: str | None = None

    def __post_init__(self) -> None:
        _require_batch_id(self.batch, "batch")
        for field, digest in (
            ("sourceOffsets", self.source_offsets),
            ("sourceFiles", self.source_files),
        ):
            if digest is not None and not _SHA256_PATTERN.fullmatch(digest):
                raise ValueError(f"{field} must be a SHA-256 hex digest, not {digest!r}")
        if not _ATTEMPT_PATTERN.fullmatch(self.attempt):
            raise ValueError(f"attempt must be 32 lower-case hex digits, not {self.attempt!r}")
        prefix = _attempt_dir(self.batch, self.attempt) + "/"
        seen: set[str] = set()
        for path, size in self.files:
            # Only names the writer gives: an alias of an object (on S3 `...json?versionId=x`
            # is the same key to s3fs) or a path listed twice would read its rows twice.
            if not (
                isinstance(path, str)
                and path.startswith(prefix)
                and DATA_OBJECT_PATTERN.fullmatch(path.removeprefix(prefix))
            ):
                raise ValueError(f"file {path!r} is not a data object of {prefix}")
            if path in seen:
                raise ValueError(f"file {path!r} is listed twice")
            seen.add(path)
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"file {path!r}: size must be a non-negative integer")

    def to_json(self) -> bytes:
        document = {
            "format": RECORD_FORMAT,
            "batch": self.batch,
            "attempt": self.attempt,
            "files": [{"path": path, "size": size} for path, size in self.files],
        }
        if self.source_offsets is not None:
            document["sourceOffsets"] = self.source_offsets
        if self.source_files is not None:
            document["sourceFiles"] = self.source_files
        return json.dumps(document, indent=1).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, data: bytes, source: str) -> BatchRecord:
        """Parse a record; anything else raises ValueError naming `source`."""
        try:
            document = json.loads(data)
            if type(document["format"]) is not int or document["format"] != RECORD_FORMAT:
                raise ValueError(f"format {document['format']!r} is not {RECORD_FORMAT}")
            return cls(
                batch=document["batch"],
                attempt=document["attempt"],
                files=tuple((entry["path"], entry["size"]) for entry in document["files"]),
                source_offsets=document.get("sourceOffsets"),
                source_files=document.get("sourceFiles"),
            )
        except RecursionError:
            raise DamagedRecord(f"{source}: not a batch record: nested too deeply") from None
        except (ValueError, KeyError, TypeError) as error:
            reason = f"no field {error}" if isinstance(error, KeyError) else str(error)
            raise DamagedRecord(f"{source}: not a batch record: {reason}") from None


class DamagedRecord(ValueError):
    """A staged or commit record that is no record (edited, truncated, another program's):
    the message names the file. Never guessed at: the batch's output is what it lists."""


class TransactionalFileSink:
    """A two-phase-commit sink writing each micro-batch as JSON lines, to a local directory,
    S3, Google Cloud Storage or Azure Blob Storage.

    Use it as ``query.writeStream.foreachBatch(sink.write_batch)`` and hand the same instance
    to the checkpoint agent, which calls `on_restore` before the query starts and
    `on_checkpoint_complete` after each registered checkpoint. The module docstring describes
    the layout, the protocol and why it is crash-consistent. Committed output is never ahead
    of the restorable state and is exactly-once; read it with `read_committed`.
    """

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        """Use `output_dir` for staged and committed output: a local path or ``file://``
        URI (created if missing), or an ``s3://``, ``s3a://``, ``gs://``, ``abfs://``,
        ``abfss://`` or ``az://`` URI (the bucket or container must exist). Any other URI raises
        ValueError before anything is written."""
        self._storage = OutputStorage(output_dir)
        self._lock = threading.Lock()
        self._checkpoint_location: Path | None = None  # the query's (on_restore)
        self._epoch: int | None = None  # this driver's writer epoch, once claimed
        self._restored = False  # on_restore ran: its restore commits earlier drivers' copies
        if self._storage.is_local:
            os.makedirs(self._storage.native(COMMITTED_DIR), exist_ok=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.output_dir!r})"

    @property
    def output_dir(self) -> str:
        """The output directory: an absolute local path or the URI given."""
        return self._storage.url

    def staged_batches(self) -> list[int]:
        """Ids of the batches staged and not yet committed, ascending."""
        return sorted({staged.batch for staged in _staged_records(self._storage)})

    def committed_batches(self) -> list[int]:
        """Ids of the committed batches, ascending."""
        return _record_ids(self._storage, COMMITTED_DIR)

    def write_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        """Stage micro-batch `batch_id` (phase 1); pass it to ``foreachBatch``.

        Spark's tasks write the rows as JSON lines, one data object per non-empty
        partition, under a fresh attempt; the staged record naming them then replaces an
        earlier staged attempt of the same batch by this driver. Superseded once a newer
        driver claimed the output (see `on_restore`). A batch already committed (a replay after
        a restore from an older checkpoint) is recognised by its id and not staged again; it
        is still executed, into Spark's ``noop`` sink, because stateful operators commit
        their state for the batch only when every partition of the batch is computed.
        """
        _require_batch_id(batch_id, "batch_id")
        with self._lock:
            self._current_epoch()  # a superseded driver stops here, before any work
        source_offsets, source_files = self._input_digests(batch_id)
        if (committed := self._committed_record(batch_id)) is not None:
            self._require_same_input(
                committed,
                source_offsets,
                source_files,
                "its replay reads other input (Spark planned it again after a restore to "
                "an older image)",
            )
            logger.info(
                "batch %d is already committed; discarding the output of its replay", batch_id
            )
            _run_without_output(batch_df)
            return
        attempt = uuid.uuid4().hex
        directory = _attempt_dir(batch_id, attempt)
        try:
            # Spark's own JSON encoding of each row, as an RDD of strings (classic PySpark).
            lines = cast("RDD[str]", cast(Any, batch_df).toJSON())
            written = lines.mapPartitionsWithIndex(
                functools.partial(write_partition, self._storage.url, directory)
            )
            files = tuple((path, size) for path, size in written.collect())
            self._storage.sync_tree(directory)
        except BaseException:
            self._delete_attempt(batch_id, attempt)
            raise
        record = BatchRecord(batch_id, attempt, files, source_offsets, source_files)
        with self._lock:
            if self._committed_record(batch_id) is not None:
                logger.warning(
                    "batch %d was committed while it was being written; dropping the write",
                    batch_id,
                )
                self._delete_attempt(batch_id, attempt)
                return
            try:
                staged = _Staged(batch_id, self._current_epoch())
            except Superseded:
                self._delete_attempt(batch_id, attempt)
                raise
            earlier = _read_record(self._storage, staged.path)
            if earlier is not None:
                self._discard_staged(staged, earlier)
            self._storage.write(staged.path, record.to_json())
        if earlier is not None:
            logger.info("batch %d staged again, replacing an earlier attempt", batch_id)
        else:
            logger.info("batch %d staged", batch_id)

    def on_checkpoint_complete(self, batch_id: int) -> None:
        """Commit every staged batch <= `batch_id`, in ascending order (phase 2).

        Called once a checkpoint covering batches <= `batch_id` is registered. Idempotent
        (an already committed batch is not staged any more) and thread-safe. If it raises,
        a prefix of the batches is committed and the rest is still staged: call it again.
        """
        _require_batch_id(batch_id, "batch_id")
        with self._lock:
            if self._epoch is not None:
                self._current_epoch()  # a superseded driver commits nothing (Superseded)
            self._commit_through(batch_id)

    def on_restore(
        self,
        restored_batch: int | None,
        job: str,
        *,
        checkpoint_location: str | os.PathLike[str] | None = None,
    ) -> None:
        """Reconcile staged output before a query starts from a restored checkpoint.

        `checkpoint_location` is the query's: each batch's record keeps the input it read
        (its source offsets there), so that a replay of a committed batch that reads other
        input is refused (ReplayDiffers) instead of skipped.

        The output belongs to the first job that starts on it (``_owner.json``, written
        create-only): another `job` is refused (StartRefused), as its batches would take
        the ids of the owner's and each would drop the other's as replays.

        This driver claims the next writer epoch, which fences the drivers before it: one
        that runs on (a pod force-deleted while its node was cut off) stages no batch any
        more (Superseded), and no record it staged is committed over this driver's.

        Staged batches <= `restored_batch` are committed (the restored checkpoint is
        registered, so their notification was lost in a crash); later ones stay until their
        batch is committed (the query re-runs them, and its copies win; a superseded driver
        may still be committing one). ``None`` means a fresh start without a checkpoint: no
        staged batch is committed, and committed batches refuse the start (StartRefused:
        new batches of their ids would be dropped as replays). Data objects of batches with
        neither a commit nor a staged record (attempts killed while writing) are deleted,
        and so is what writes killed midway left unlisted (temporaries, unfinished
        uploads). Committed batches are never touched. Idempotent. A damaged record
        refuses the start (StartRefused naming the file): a staged one before anything
        changes, a commit record where it is met.
        """
        if restored_batch is not None:
            _require_batch_id(restored_batch, "restored_batch")
        if checkpoint_location is not None:
            self._checkpoint_location = Path(checkpoint_location)
        with self._lock, _refusing_a_missing_bucket(self._storage), _refusing_a_damaged_record():
            self._owned_by(job)  # refused before anything is written
            committed = self.committed_batches()
            if restored_batch is None and committed:
                # New batches of those ids would be taken for replays and dropped: the
                # output of an earlier run of the job (its state and storage deleted to
                # start over) must go too.
                raise StartRefused(
                    f"the output {self._storage.url} holds batches {committed[0]}.."
                    f"{committed[-1]} committed by an earlier run, but the query starts "
                    "without a checkpoint, so its batches of those ids would be dropped as "
                    "replays; to start over, delete that output too (or write to an empty "
                    "one); to go on from those batches, restore the checkpoint or savepoint "
                    "they belong to (spec.restore.initialSavepointPath, run --from)"
                )
            for staged in _staged_records(self._storage):  # refused before any change
                _read_record(self._storage, staged.path)
            self._claim(job)
            self._claim_epoch()
            self._restored = True
            # Staged batches after the restored one stay, each until its batch is committed
            # (_commit_through): the driver this one superseded may be committing one right
            # now (its epoch check passed before the claim), and this driver stages its own
            # copy of each batch it runs, which is newer and wins.
            if restored_batch is not None:
                try:
                    self._commit_through(restored_batch, restoring=True)
                except (ReplayDiffers, _StagedObjectsMissing) as error:
                    raise StartRefused(str(error)) from None  # every attempt would meet it
            # A driver that started meanwhile (never two at once, by the runtimes; this is
            # the fence should they be) may be writing data no record lists yet.
            self._current_epoch()
            self._collect_garbage()
            self._current_epoch()
            for directory in (STAGING_DIR, COMMITTED_DIR, DATA_DIR, EPOCHS_DIR):
                try:
                    removed = self._storage.remove_unfinished_writes(directory)
                except PermissionError as error:
                    # Only garbage stays: not a reason to keep the query from starting.
                    logger.warning(
                        "cannot remove unfinished writes in %s (on S3 that needs "
                        "s3:ListBucketMultipartUploads and s3:AbortMultipartUpload): %s",
                        self._storage.native(directory),
                        error,
                    )
                    continue
                if removed:
                    logger.info("removed %d unfinished writes in %s", removed, directory)
            # Batches committed above are <= restored_batch: the listing before still holds.
            ahead = [
                committed_id
                for committed_id in committed
                if restored_batch is not None and committed_id > restored_batch
            ]
            if ahead:
                logger.warning(
                    "restoring batch %d while batches %d..%d are already committed: their "
                    "replays will be skipped",
                    restored_batch,
                    ahead[0],
                    ahead[-1],
                )

    def _owned_by(self, job: str) -> bool:
        """True if the output is `job`'s, False if it is no job's yet; StartRefused if it
        is another's, or its owner record cannot be read."""
        path = f"{self._storage.url}/{OWNER_FILE}"
        try:
            data = self._storage.read(OWNER_FILE, at_most=MAX_OWNER_BYTES + 1)
        except IsADirectoryError:
            data = b""  # refused below, as any other content that is no record
        if data is None:
            return False
        try:
            owner = json.loads(data)["job"] if len(data) <= MAX_OWNER_BYTES else None
        except (ValueError, KeyError, TypeError, RecursionError):
            owner = None
        if not isinstance(owner, str):
            raise StartRefused(
                f'{path}: not a record of the job the output belongs to ({{"job": '
                '"<namespace>/<name>"}): delete it to hand the output to the next job'
            )
        if owner != job:
            raise StartRefused(
                f"the output {self._storage.url} belongs to job {printable_line(owner)} "
                f"({path}), whose batch ids this job's would take (each dropping the "
                f"other's as replays): give job {job} an output of its own (a fork of a job "
                f"too), or delete {path} to hand the output over once that job no longer "
                "writes there"
            )
        return True

    def _claim(self, job: str) -> None:
        """Make the output `job`'s (create-only: of two jobs starting at once, one wins
        and the other is refused). Caller holds the lock."""
        record = json.dumps({"format": RECORD_FORMAT, "job": job}).encode("utf-8") + b"\n"
        for _ in range(3):  # a record deleted between the two steps: its hand-over
            if self._owned_by(job) or self._storage.create(OWNER_FILE, record):
                return
        raise StartRefused(
            f"{self._storage.url}/{OWNER_FILE}: cannot record the job the output belongs "
            "to: it is there when created and gone when read, again and again"
        )

    def _claim_epoch(self) -> None:
        """Claim the next writer epoch (create-only) and delete the older ones, which
        supersedes the drivers that hold them: each checks its own before it stages a
        batch. Caller holds the lock."""
        for _ in range(_CLAIM_TRIES):
            claimed = _claimed_epochs(self._storage)
            epoch = max(claimed, default=0) + 1
            document = json.dumps({"format": RECORD_FORMAT, "epoch": epoch}).encode() + b"\n"
            if self._storage.create(_epoch_path(epoch), document):
                self._epoch = epoch
                try:
                    self._require_create_only_writes(_epoch_path(epoch), document)
                except StartRefused:
                    self._epoch = None  # claimed by nothing: the next call is refused too
                    raise
                self._storage.delete(_epoch_path(older) for older in claimed)
                return
        raise Superseded(
            f"{self._storage.native(EPOCHS_DIR)}: cannot claim a writer epoch: other drivers "
            f"claimed {_CLAIM_TRIES} in a row meanwhile"
        )

    def _require_create_only_writes(self, claimed: str, document: bytes) -> None:
        """Create the epoch record this driver just created (`claimed`) once more: the
        store must refuse it. One that ignores the condition (older S3-compatible stores
        ignore ``If-None-Match: *``) would let two drivers claim one epoch and a superseded
        driver replace a commit record: the sink refuses it (StartRefused). Caller holds
        the lock."""
        if not self._storage.create(claimed, document):
            return
        self._current_epoch()  # a newer driver deleted it meanwhile: this one is Superseded
        raise StartRefused(
            f"the output {self._storage.url}: its store replaced {claimed} on a create-only "
            "write instead of refusing it (on S3, a PutObject with If-None-Match: *, which "
            "older MinIO and other S3-compatible stores ignore); the sink's writer epochs "
            "and commit records rely on that refusal for exactly-once output: write the "
            "output to a store that honours it (AWS S3, Google Cloud Storage, Azure Blob "
            "Storage, a current MinIO)"
        )

    def _current_epoch(self) -> int:
        """This driver's writer epoch (claimed now if it has none, for a sink used without
        `on_restore`); Superseded once a newer driver claimed the output. Caller holds
        the lock."""
        if self._epoch is None:
            self._claim_epoch()
        # One listing: a newer epoch can be there beside this driver's (its claimer died
        # before deleting the older ones), or have replaced it.
        elif self._epoch not in (claimed := _claimed_epochs(self._storage)) or any(
            epoch > self._epoch for epoch in claimed
        ):
            newest = max(claimed, default=None)
            raise Superseded(
                f"a newer driver writes the output {self._storage.url} (writer epoch "
                f"{newest if newest is not None else 'unknown'} in {EPOCHS_DIR}/, this "
                f"driver's was {self._epoch}): this driver stages and commits nothing more "
                "there. The job's runtime replaced it (a force-deleted pod whose driver ran "
                "on, a second run of the job)"
            )
        assert self._epoch is not None
        return self._epoch

    def _staged_not_newer(self) -> list[_Staged]:
        """The staged records of this driver's writer epoch or older ones, by batch then
        epoch: a newer driver's records are never touched (this driver is superseded)."""
        return [
            staged
            for staged in _staged_records(self._storage)
            if self._epoch is None or staged.epoch <= self._epoch
        ]

    def _commit_through(self, batch_id: int, *, restoring: bool = False) -> None:
        """Commit staged batches <= `batch_id` in ascending order: of a batch staged by
        several drivers, the newest driver's record; the others (of drivers that ran on
        after they were superseded, or were replaced) go once the commit record decides
        what the batch's data objects are. Only a restore (`restoring`: its checkpoint
        covers them) commits what an earlier driver staged: afterwards this driver stages
        every batch it runs itself, and an earlier driver's copy of a batch it has not run
        stays as it is (a sink used without `on_restore` commits the newest copy, as
        ever). Caller holds the lock."""
        staged_by_batch: dict[int, list[_Staged]] = {}
        for staged in self._staged_not_newer():
            if staged.batch <= batch_id:
                staged_by_batch.setdefault(staged.batch, []).append(staged)
        for staged_id, candidates in staged_by_batch.items():
            if restoring or not self._restored or candidates[-1].epoch == self._epoch:
                if (chosen := self._copy_to_commit(staged_id, candidates, restoring)) is None:
                    continue
                self._commit(chosen[1])
                dropped = [staged for staged in candidates if staged != chosen[0]]
            elif self._committed_record(staged_id) is None:
                continue  # an earlier driver's copy of a batch this driver has not run yet
            else:
                dropped = candidates  # this driver found the batch committed: a replay
            self._collect_batch_garbage(staged_id)
            self._storage.delete(staged.path for staged in candidates)
            if dropped:
                logger.warning("batch %d: dropped the copy an earlier driver staged", staged_id)

    def _copy_to_commit(
        self, batch_id: int, candidates: list[_Staged], restoring: bool
    ) -> tuple[_Staged, BatchRecord] | None:
        """The staged copy of `batch_id` to commit: the newest; at a restore the newest that
        read the input the restored image's batch read (its offsets in the checkpoint): a
        driver of another lineage (one that fell back to an older image) may have staged
        one over other input; and whose objects are all there (a superseded driver's
        garbage collection may have taken a newer copy's), else the newest of that input,
        whose commit then fails naming what is missing. ReplayDiffers if no copy read that
        input; None if none is left."""
        if not restoring:
            record = _read_record(self._storage, candidates[-1].path)
            return None if record is None else (candidates[-1], record)
        offsets, files = self._input_digests(batch_id)
        copies = [
            (staged, record)
            for staged in reversed(candidates)
            if (record := _read_record(self._storage, staged.path)) is not None
        ]
        same_input = [
            (staged, record)
            for staged, record in copies
            if _same(record.source_offsets, offsets) and _same(record.source_files, files)
        ]
        whole = (copy for copy in same_input if not self._missing_objects(copy[1]))
        if (chosen := next(whole, None) or next(iter(same_input), None)) is not None:
            return chosen
        if copies:
            raise ReplayDiffers(
                f"batch {batch_id} is staged in {self._storage.url}, but no staged copy of it "
                f"reads the input the restored image's batch {batch_id} read (a driver that "
                "fell back to an older image staged it again over other input): its output "
                "would be lost; restore another image"
            )
        return None

    def _commit(self, staged: BatchRecord) -> None:
        """Create the commit record of `staged` (create-only), or find it there already.

        A refused create is decided by the record the store holds: one identical to
        `staged` is this commit's own (written by an earlier try: before a crash, or by a
        request whose answer was lost and whose retry the store refused, S3 and GCS 412,
        Azure 409); one of the same input is a superseded driver's copy of the batch, which
        wins; one of other input is ReplayDiffers; none at all (a refusal for another
        reason) raises OSError and leaves the staged record for another try."""
        path = f"{COMMITTED_DIR}/{batch_record_name(staged.batch)}"
        # Never a commit record over objects that are gone: a driver that ran on after it
        # was superseded deletes, as its own commit's garbage, the objects of a newer
        # driver's attempt that is not staged yet.
        missing = self._missing_objects(staged)
        if not missing and self._storage.create(path, staged.to_json()):
            logger.info("batch %d committed", staged.batch)
            return
        committed = self._committed_record(staged.batch)
        if committed == staged:
            logger.info("batch %d committed (its record was already there)", staged.batch)
        elif committed is None and missing:
            raise _StagedObjectsMissing(
                f"{self._storage.native(missing[0])}: listed by staged batch {staged.batch}, "
                "missing (a driver that ran on after it was superseded deleted it): the "
                "batch cannot be committed from this copy; restore an image from before it"
            )
        elif committed is None:
            raise OSError(
                f"{self._storage.native(path)}: the store refused to create it as existing, "
                f"but it is not there: batch {staged.batch} stays staged for another try"
            )
        else:
            # A superseded driver's copy, committed as this driver took over. It stands if
            # it read the input this query's batch read (its offsets in the checkpoint).
            self._require_same_input(
                committed,
                *self._input_digests(staged.batch),
                "the copy this query staged reads other input (a driver that ran on after "
                "it was superseded committed its own)",
            )
            logger.warning("batch %d is already committed; dropping its staged copy", staged.batch)

    def _missing_objects(self, record: BatchRecord) -> list[str]:
        """The data objects `record` lists that are not there (one listing)."""
        if not record.files:
            return []
        present = set(self._storage.find(_attempt_dir(record.batch, record.attempt)))
        return [path for path, _size in record.files if path not in present]

    def _discard_staged(self, staged: _Staged, record: BatchRecord) -> None:
        """Remove a staged attempt: its record first, so that no record ever names a
        deleted object, then its objects. Caller holds the lock."""
        self._storage.delete([staged.path])
        self._delete_attempt(record.batch, record.attempt)

    def _delete_attempt(self, batch_id: int, attempt: str) -> None:
        """Delete the objects of one attempt, unless a commit record lists them."""
        committed = self._committed_record(batch_id)
        if committed is not None and committed.attempt == attempt:
            return
        self._storage.delete(self._storage.find(_attempt_dir(batch_id, attempt)))

    def _collect_batch_garbage(self, batch_id: int) -> None:
        """Delete the data objects of committed batch `batch_id` that its commit record
        does not list. Only a commit record decides them: a driver this one superseded may
        be committing an attempt it staged (its epoch check passed before this driver's
        claim), so no other driver's attempt is deleted before the commit record exists.
        Nor is a newer driver's staged attempt: this driver may be the superseded one,
        whose commit the newer driver's may yet replace (ReplayDiffers says how).
        Caller holds the lock."""
        committed = self._committed_record(batch_id)
        if committed is None:
            return
        keep = {path for path, _size in committed.files}
        newer = [
            staged
            for staged in _staged_records(self._storage)
            if staged.batch == batch_id and self._epoch is not None and staged.epoch > self._epoch
        ]
        for staged in newer:
            if (record := _read_record(self._storage, staged.path)) is not None:
                keep.update(path for path, _size in record.files)
        self._storage.delete(
            path for path in self._storage.find(_data_dir(batch_id)) if path not in keep
        )

    def _collect_garbage(self) -> None:
        """Delete the data of every batch without a commit record or a staged one: what
        attempts killed while writing left. Committed batches were cleaned when they were
        committed, so only the names of data directories are listed for them."""
        keep = set(self.committed_batches()) | set(self.staged_batches())
        for name in self._storage.list_names(DATA_DIR):
            batch_id = parse_batch_record_name(f"{name}.json")
            if batch_id is not None and batch_id not in keep:
                self._storage.delete(self._storage.find(_data_dir(batch_id)))
                logger.info("removed the data of unfinished attempts of batch %d", batch_id)

    def _input_digests(self, batch_id: int) -> tuple[str | None, str | None]:
        """The digests of `batch_id`'s input: of the source offsets Spark logged for it
        before running it, and of the files its file sources read (see `BatchRecord`);
        each None when unknown (no checkpoint location, no log entry, no file source)."""
        location = self._checkpoint_location
        if location is None:
            return None, None
        entry = read_offset_log_entry(location, batch_id)
        if entry is None:
            return None, None
        return hashlib.sha256(b"\n".join(entry.offsets)).hexdigest(), _source_files(
            location, batch_id, entry
        )

    def _require_same_input(
        self,
        committed: BatchRecord,
        source_offsets: str | None,
        source_files: str | None,
        difference: str,
    ) -> None:
        """This query's batch is taken for the committed one only if it reads the committed
        batch's input. After a restore to an older image Spark plans again the batches
        whose offsets the image lacks, and may give one other input (a batch that only
        advanced the watermark now reads new files; another maxFilesPerTrigger splits the
        files otherwise); a superseded driver may have committed its own copy of a batch
        (`difference` says which). Skipping this query's batch would lose that data, committing
        it would add a second batch of its id. Raises ReplayDiffers."""
        if _same(committed.source_offsets, source_offsets) and _same(
            committed.source_files, source_files
        ):
            return
        later = [b for b in self.committed_batches() if b >= committed.batch]
        raise ReplayDiffers(
            f"batch {committed.batch} is committed in {self._storage.url}, but {difference}; "
            "skipping it would lose that input's output and committing it would add a second "
            f"batch {committed.batch}: restore the newest image, or take the output back to "
            f"the restored image by deleting the commit records of batches {later[0]}.."
            f"{later[-1]} ({COMMITTED_DIR}/batch-<B>.json), which the query then writes again"
        )

    def _committed_record(self, batch_id: int) -> BatchRecord | None:
        return _read_record(self._storage, f"{COMMITTED_DIR}/{batch_record_name(batch_id)}")


def _same(known: str | None, now: str | None) -> bool:
    """Whether two digests of an input are equal, as far as both are known."""
    return known is None or now is None or known == now


def _source_files(location: Path, batch_id: int, entry: OffsetLogEntry) -> str | None:
    """SHA-256 of the files Spark's file sources read in `batch_id` (their paths and
    modification times), given its offset log `entry`; None without a file source.

    A file source's offset is the id of its own log (``{"logOffset": L}``), which
    ``maxFilesPerTrigger`` or new files leave unchanged while changing what the batch
    reads: the files are those its log lists under the ids after its offset of batch B-1
    up to its offset of B (``sources/<s>/<L>``, or ``<L>.compact`` at a compaction)."""
    try:
        dirs = source_dirs(location)
    except OSError:
        return None
    ends = file_source_log_offsets(location, entry, dirs, exact=False)
    if not ends:
        return None
    starts: dict[str, int] = {}
    if batch_id > 0:
        earlier = read_offset_log_entry(location, batch_id - 1)
        if earlier is None:
            return None
        starts = file_source_log_offsets(location, earlier, dirs, exact=False)
    entries: list[str] = []
    for source, end in ends.items():
        for log_id in range(starts.get(source, -1) + 1, end + 1):
            listed = file_source_entries(location / "sources" / source, log_id)
            if listed is None:
                return None
            entries += [f"{source}\t{file}" for file in listed]
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def read_committed(output_dir: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """The committed output of a `TransactionalFileSink`: batch id -> rows, ascending ids.

    `output_dir` is what the sink was given (a local path or URI). A batch is read from the
    data objects its commit record lists, in their order, and the lines in each; nothing
    else under the output directory is read. A listed object that is missing or has
    another size raises ValueError naming it. A missing output directory reads as no
    output.
    """
    storage = OutputStorage(output_dir)
    output: dict[int, list[dict[str, Any]]] = {}
    for batch_id in _record_ids(storage, COMMITTED_DIR):
        path = f"{COMMITTED_DIR}/{batch_record_name(batch_id)}"
        record = _read_record(storage, path)
        if record is None:
            continue  # listed, then gone: the output directory is being deleted
        if record.batch != batch_id:
            raise ValueError(f"{storage.native(path)}: names batch {record.batch}")
        output[batch_id] = list(_read_rows(storage, record))
    return output


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


@contextlib.contextmanager
def _refusing_a_missing_bucket(storage: OutputStorage) -> Iterator[None]:
    """An output whose bucket or container does not exist refuses the start, naming it:
    the store's own error names neither ("The specified bucket does not exist")."""
    try:
        yield
    except Exception as error:  # adlfs raises the service's own errors too
        if not is_missing_bucket(error):
            raise
        reason = missing_bucket_reason("the driver's")
        raise StartRefused(f"the output {storage.url}: {reason}") from error


@contextlib.contextmanager
def _refusing_a_damaged_record() -> Iterator[None]:
    """A damaged record refuses the start, naming the file: every attempt would meet it
    again, and removing it could lose a committed batch's output."""
    try:
        yield
    except DamagedRecord as error:
        raise StartRefused(
            f"{error}; put the record back as it was written (from a backup or another copy; "
            "one of another format: run the version that wrote it), "
            "or, if the batch may be dropped, move the file away (a staged batch after the "
            "restored checkpoint is re-run; any other batch's output is lost)"
        ) from None


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


@dataclass(frozen=True, order=True)
class _Staged:
    """A staged record of batch `batch` by the driver of writer epoch `epoch`."""

    batch: int
    epoch: int

    @property
    def path(self) -> str:
        if self.epoch == 0:
            return f"{STAGING_DIR}/{batch_record_name(self.batch)}"
        return f"{STAGING_DIR}/batch-{self.batch}.epoch-{self.epoch}.json"


def _staged_records(storage: OutputStorage) -> list[_Staged]:
    """The staged records in the output, by batch then epoch."""
    return sorted(
        _Staged(int(match.group(1)), int(match.group(2) or 0))
        for name in storage.list_names(STAGING_DIR)
        if (match := _STAGED_RECORD_PATTERN.fullmatch(name))
    )


def _epoch_path(epoch: int) -> str:
    return f"{EPOCHS_DIR}/epoch-{epoch}.json"


def _claimed_epochs(storage: OutputStorage) -> list[int]:
    return sorted(
        int(match.group(1))
        for name in storage.list_names(EPOCHS_DIR)
        if (match := _EPOCH_PATTERN.fullmatch(name))
    )


def _record_ids(storage: OutputStorage, directory: str) -> list[int]:
    """Ids of the canonical records in `directory`, ascending."""
    return sorted(
        batch_id
        for name in storage.list_names(directory)
        if (batch_id := parse_batch_record_name(name)) is not None
    )


def _read_record(storage: OutputStorage, path: str) -> BatchRecord | None:
    data = storage.read(path)
    return None if data is None else BatchRecord.from_json(data, storage.native(path))


def _read_rows(storage: OutputStorage, record: BatchRecord) -> Iterable[dict[str, Any]]:
    for path, size in record.files:
        data = storage.read(path)
        where = storage.native(path)
        if data is None:
            raise ValueError(f"{where}: listed by committed batch {record.batch}, missing")
        if len(data) != size:
            raise ValueError(
                f"{where}: committed batch {record.batch} lists {size} bytes, found {len(data)}"
            )
        # Lines end at "\n" only: Spark's JSON holds U+2028, U+2029 and U+0085 as they are
        # (splitlines would cut a row there).
        for number, line in enumerate(data.decode("utf-8").split("\n"), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{where}:{number}: not a JSON line: {error}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}:{number}: expected a JSON object, got {line!r}")
            yield row
