"""The checkpoint agent inside the Spark driver: takes snapshots, finalizes, notifies.

It does what the coordinator asks (trigger, finalize, complete, abort, discard) and
reports progress; it never decides that a checkpoint is complete. All storage I/O of a
job happens here, in the process that already holds the job's storage configuration.
"""

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from spark_checkpoint.agent.snapshot import (
    LOGS_TASK,
    FileIdentity,
    SnapshotError,
    SnapshotPlan,
    committed_batches,
    file_identities,
    pin,
    plan_snapshot,
    planned_batches,
    snapshot_tasks,
)
from spark_checkpoint.protocol import (
    AckReport,
    AfterCompletion,
    AgentStatus,
    CheckpointKind,
    CollectGarbageAnswer,
    DeclineReport,
    FinalizeAnswer,
    QueryProgress,
    QueryState,
    QueryStatus,
    RestoredFrom,
    SnapshotPhase,
    SnapshotStatus,
)
from spark_checkpoint.sink import CheckpointParticipant
from spark_checkpoint.storage import (
    CheckpointMetadata,
    CheckpointStorage,
    ChecksumMismatchError,
    ManifestEntry,
    MissingFileError,
    StorageAccessError,
    StorageError,
    TaskAcknowledgement,
    printable_line,
    snapshot_dir_name,
)

log = logging.getLogger(__name__)

COPY_DELAY_VARIABLE = "SPARK_CHECKPOINT_COPY_DELAY"
# Status versions kept for `status_as_of`: a client acts on a status within a few versions.
RECENT_VERSIONS = 16
# Completed and aborted snapshots kept, newest first, for requests repeated about them (a
# completion the coordinator is unsure arrived); older ones are forgotten: each holds its
# plan and file entries, and a driver lives through thousands of checkpoints.
DONE_SNAPSHOTS_KEPT = 16
_DONE = (SnapshotPhase.COMPLETED, SnapshotPhase.ABORTED)


class AgentRequestError(Exception):
    """A request the agent cannot honour; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@contextmanager
def _storage_must_agree(undone: str) -> Iterator[None]:
    """A storage deletion checks all it goes by before its first delete (`CheckpointStorage`):
    storage that disagrees with the registry the request carries (an image it names is
    missing or unreadable, a link is in the way, a key is no location) is the request's
    conflict (409), and nothing was deleted. Storage that cannot be used stays a storage
    error (500)."""
    try:
        yield
    except StorageAccessError:
        raise
    except StorageError as error:
        raise AgentRequestError(
            409, f"storage disagrees with the registry, nothing {undone}: {error}"
        ) from error


# How many task names a refusal names of each difference: one line, however many differ.
_TASKS_NAMED = 3


def _tasks_differ(asked: AbstractSet[str], image: AbstractSet[str]) -> str:
    """Why a finalize's task set is refused, in one line (both sets may be thousands)."""
    parts = []
    for count_of, names in (("not in the image", asked - image), ("missing", image - asked)):
        if names:
            named = ", ".join(sorted(names)[:_TASKS_NAMED])
            more = f" and {len(names) - _TASKS_NAMED} more" if len(names) > _TASKS_NAMED else ""
            parts.append(f"{len(names)} {count_of} ({named}{more})")
    return f"the tasks differ from the image's {len(image)}: " + "; ".join(parts)


@dataclass(frozen=True, slots=True)
class QueryView:
    """What the agent needs to know about the running query."""

    state: QueryState
    message: str = ""
    progress: QueryProgress | None = None  # None before the query's first progress


STARTING = QueryView(QueryState.STARTING)


@dataclass
class _Snapshot:
    checkpoint_id: int
    kind: CheckpointKind
    after: AfterCompletion
    trigger_time: datetime
    state: SnapshotPhase = SnapshotPhase.CAPTURING
    plan: SnapshotPlan | None = None
    acks: dict[str, TaskAcknowledgement] = field(default_factory=dict)
    entries: dict[str, list[ManifestEntry]] = field(default_factory=dict)
    # Files of the newest completed checkpoint this image has unchanged: not copied again.
    reused: dict[str, ManifestEntry] = field(default_factory=dict)
    identities: dict[str, FileIdentity] = field(default_factory=dict)
    declines: dict[str, str] = field(default_factory=dict)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # The first finalize request's answer: a repeated one (a proxy's replay, a retry) waits
    # for it instead of writing _metadata again, and never moves a completed image back.
    finalizing: Future[FinalizeAnswer] | None = None

    def locations(self) -> set[str]:
        copied = {e.location for entries in self.entries.values() for e in entries}
        return copied | {e.location for e in self.reused.values()}

    def report(self) -> SnapshotStatus:
        batch_id = self.plan.batch_id if self.plan else None
        return SnapshotStatus(
            checkpoint_id=self.checkpoint_id,
            kind=self.kind,
            state=self.state,
            batch_id=batch_id,
            # An ack exists only once the plan (and so the batch) does.
            acks=tuple(
                AckReport(ack.task, batch_id, ack.bytes, ack.duration_ms)
                for ack in self.acks.values()
                if batch_id is not None
            ),
            declines=tuple(DeclineReport(t, m) for t, m in self.declines.items()),
        )


class _AddersOrDiscarder:
    """Many snapshot copies may add shared files at once; a discard runs alone, so it
    never deletes a shared file that a copy in flight has just decided to reuse."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._adders = 0
        self._discarding = False

    @contextmanager
    def add(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: not self._discarding)
            self._adders += 1
        try:
            yield
        finally:
            with self._condition:
                self._adders -= 1
                self._condition.notify_all()

    @contextmanager
    def discard(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: not self._discarding and self._adders == 0)
            self._discarding = True
        try:
            yield
        finally:
            with self._condition:
                self._discarding = False
                self._condition.notify_all()


def _completes_at_finalization(snapshot: _Snapshot) -> bool:
    """A savepoint the query continues after gets no completion notification (its sinks
    commit nothing up to it, docs/coordinator.md): it is done once its metadata is written."""
    return snapshot.kind is CheckpointKind.SAVEPOINT and snapshot.after is AfterCompletion.CONTINUE


class CheckpointAgent:
    def __init__(
        self,
        *,
        storage: CheckpointStorage,
        location: Path,
        pin_root: Path,
        participants: Sequence[CheckpointParticipant],
        attempt: int,
        highest_stored_id: int | None = None,
        copy_workers: int = 2,
    ) -> None:
        self._storage = storage
        self._highest_stored_id = highest_stored_id
        self._location = location
        self._pin_root = pin_root
        self._participants = list(participants)
        # Until `query_started`: the driver restores its image and starts its query, and
        # the agent answers meanwhile, so that a long restore is not taken for a driver
        # whose pipeline never started an agent.
        self._query_view: Callable[[], QueryView] = lambda: STARTING
        self._processed_all_since: Callable[[float], bool] = lambda moment: False
        self._restored_from: RestoredFrom | None = None
        self._attempt = attempt
        self._lock = threading.Lock()
        self._snapshots: dict[int, _Snapshot] = {}
        self._forgotten_up_to = 0  # the newest id of a done snapshot no longer kept
        self._storage_access = _AddersOrDiscarder()
        # The files of the newest checkpoint this agent completed, by path, with their
        # identity then. Retention always keeps the newest completed checkpoint, so their
        # locations stay; a later image's file of the same path and identity is the same
        # bytes there, so it is neither pinned, hashed nor looked up in storage again.
        self._completed_files: dict[str, tuple[FileIdentity, ManifestEntry]] = {}
        self._completed_id = -1
        self._copies = ThreadPoolExecutor(copy_workers, thread_name_prefix="snapshot-copy")
        self._stop_requested = threading.Event()
        self._notified_batch: int | None = None
        self._notified = threading.Condition(self._lock)
        self._copy_delay = float(os.environ.get(COPY_DELAY_VARIABLE, "0") or 0)
        # The status version: one status at a time, so versions follow the documents.
        self._status_lock = threading.Lock()
        # The snapshot tasks as of a last committed batch (see _tasks).
        self._tasks_lock = threading.Lock()
        self._tasks_listed: tuple[int, tuple[str, ...]] | None = None
        self._version = 0
        self._reported: AgentStatus | None = None
        self._recent_versions: dict[int, AgentStatus] = {}
        self._watchers: list[Callable[[bool], None]] = []

    def restored(self, restored_from: RestoredFrom) -> None:
        """The image the driver restored, reported from now on while the query still
        starts: the participants' ``on_restore`` then discards the output staged after it,
        which the images the restore passed over covered; the coordinator must never
        restore those later."""
        with self._status_lock:
            self._restored_from = restored_from
        self._changed()

    def query_started(
        self,
        query_view: Callable[[], QueryView],
        restored_from: RestoredFrom | None,
        processed_all_since: Callable[[float], bool],
    ) -> None:
        """The query runs, restored from ``restored_from`` (None: a fresh start); from now
        on the status reports it as ``query_view`` sees it, and a drain asks
        ``processed_all_since`` whether the query has processed and committed all input
        available at a moment (``time.time()``). The participants committed
        through the restored image's batch when they restored it (``on_restore``): they
        know of an image covering it, so a query whose input was done there needs no
        final checkpoint (it waited for one, told of an image this agent never took)."""
        with self._status_lock:
            self._restored_from = restored_from
            self._query_view = query_view
            self._processed_all_since = processed_all_since
        if restored_from is not None:
            with self._notified:
                if self._notified_batch is None or restored_from.batch_id > self._notified_batch:
                    self._notified_batch = restored_from.batch_id
                self._notified.notify_all()

    # ------------------------------------------------------------------ status

    def status(self) -> AgentStatus:
        """The status ``GET /v1/status`` serves. Its ``version`` rises
        whenever what the coordinator acts on differs from the previous document
        (``lastCommittedBatch`` and ``progress`` alone do not count)."""
        with self._status_lock:
            document = self._status()
            reported = document.versioned_part()
            if reported != self._reported:
                self._reported = reported
                self._version += 1
                self._recent_versions[self._version] = replace(reported, version=self._version)
                if len(self._recent_versions) > RECENT_VERSIONS:
                    del self._recent_versions[min(self._recent_versions)]
            return replace(document, version=self._version)

    def status_as_of(self, version: int) -> AgentStatus | None:
        """The status this agent reported as ``version`` (its versioned part), if recent:
        a long poll compares it with the current one to tell what its client missed."""
        with self._status_lock:
            return self._recent_versions.get(version)

    def watch(self, changed: Callable[[bool], None]) -> None:
        """Call ``changed`` (from any thread) when a snapshot makes progress: a status
        computed afterwards may have a new version. Its argument says whether the progress
        was only another task's acknowledgement (its snapshot still copying). Query state
        and tasks change without a call; a long poll finds those by asking for status
        again now and then."""
        self._watchers.append(changed)

    def unwatch(self, changed: Callable[[bool], None]) -> None:
        self._watchers.remove(changed)

    def _changed(self, *, acknowledgement_only: bool = False) -> None:
        for changed in list(self._watchers):
            changed(acknowledgement_only)

    def _status(self) -> AgentStatus:
        view = self._query_view()
        if self.stop_requested and view.state is QueryState.FINISHED:
            view = QueryView(QueryState.STOPPED)
        committed = self._committed(view)
        with self._lock:
            snapshots = tuple(s.report() for s in self._in_flight())
            notified = self._notified_batch
        return AgentStatus(
            version=None,  # set by status()
            attempt=self._attempt,
            query=QueryStatus(
                view.state, view.message, committed[-1] if committed else None, view.progress
            ),
            tasks=self._tasks(committed[-1]) if committed else (),
            all_tasks_running=view.state.runs_tasks,
            awaiting_final_checkpoint=view.state is QueryState.FINISHED
            and bool(committed)
            and (notified is None or notified < committed[-1]),
            restored_from=self._restored_from,
            checkpoints=snapshots,
            highest_stored_id=self._highest_stored_id,
        )

    def _committed(self, view: QueryView) -> list[int]:
        """The live location's committed batches; none while the driver starts: a restore
        may be writing them."""
        return [] if view.state is QueryState.STARTING else committed_batches(self._location)

    def _tasks(self, last_committed: int) -> tuple[str, ...]:
        """The query's snapshot tasks, listed again only once another batch committed:
        state partitions appear when a batch runs, and listing them (a directory each)
        for every status took a fifth of a second at 200 partitions on a loaded machine."""
        with self._tasks_lock:
            if self._tasks_listed is None or self._tasks_listed[0] != last_committed:
                tasks = tuple(sorted(snapshot_tasks(self._location)))
                self._tasks_listed = (last_committed, tasks)
            return self._tasks_listed[1]

    def _in_flight(self) -> list[_Snapshot]:
        return [s for s in self._snapshots.values() if s.state not in _DONE]

    def _forget_old_done_snapshots(self) -> None:
        """Called under the lock whenever a snapshot is done."""
        done = sorted(i for i, s in self._snapshots.items() if s.state in _DONE)
        for checkpoint_id in done[:-DONE_SNAPSHOTS_KEPT]:
            del self._snapshots[checkpoint_id]  # copies still running hold their own
            self._forgotten_up_to = max(self._forgotten_up_to, checkpoint_id)

    # ------------------------------------------------------------------ commands

    def trigger(self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion) -> None:
        with self._lock:
            if checkpoint_id in self._snapshots:
                return  # a retried request: the snapshot is already under way
            if checkpoint_id <= self._forgotten_up_to:
                raise self._forgotten(checkpoint_id)
            snapshot = _Snapshot(checkpoint_id, kind, after, datetime.now(UTC))
            self._snapshots[checkpoint_id] = snapshot
        self._changed()
        threading.Thread(
            target=self._capture, args=(snapshot,), name=f"capture-{checkpoint_id}", daemon=True
        ).start()

    def finalize(self, checkpoint_id: int, tasks: Sequence[str]) -> FinalizeAnswer:
        """Write ``_metadata`` from the acknowledgements; return its path and total size.
        Once: a repeated request gets the first one's answer (waiting for it)."""
        with self._lock:
            snapshot = self._require(checkpoint_id)
            earlier = snapshot.finalizing
            if earlier is None:
                metadata = self._metadata(snapshot, tasks)
                finalizing = snapshot.finalizing = Future[FinalizeAnswer]()
            elif snapshot.state is SnapshotPhase.ABORTED:
                raise AgentRequestError(409, f"checkpoint {checkpoint_id} is {snapshot.state}")
            elif snapshot.plan is not None and set(tasks) != snapshot.plan.tasks:
                raise AgentRequestError(409, _tasks_differ(set(tasks), snapshot.plan.tasks))
        if earlier is not None:
            return earlier.result()
        try:
            answer = self._finalized(snapshot, metadata)
        except BaseException as error:
            with self._lock:
                snapshot.finalizing = None  # it may be asked again
            finalizing.set_exception(error)
            raise
        finalizing.set_result(answer)
        return answer

    def _metadata(self, snapshot: _Snapshot, tasks: Sequence[str]) -> CheckpointMetadata:
        """The image's _metadata from its acknowledgements (under the lock)."""
        checkpoint_id = snapshot.checkpoint_id
        if snapshot.state is not SnapshotPhase.ACKNOWLEDGED or snapshot.plan is None:
            raise AgentRequestError(409, f"checkpoint {checkpoint_id} is {snapshot.state}")
        if set(tasks) != snapshot.plan.tasks:
            # The coordinator expected another task set than the image has (a state
            # partition appeared in between): an image missing a partition would
            # restore it empty, so it is refused.
            raise AgentRequestError(409, _tasks_differ(set(tasks), snapshot.plan.tasks))
        entries = [e for task in sorted(tasks) for e in snapshot.entries[task]]
        return CheckpointMetadata(
            namespace=self._storage.layout.namespace,
            job=self._storage.layout.job,
            checkpoint_id=checkpoint_id,
            kind=snapshot.kind,
            batch_id=snapshot.plan.batch_id,
            query_id=self._query_id(),
            trigger_time=snapshot.trigger_time,
            completion_time=datetime.now(UTC),
            acknowledgements=tuple(snapshot.acks[t] for t in sorted(tasks)),
            files=tuple(entries),
            total_bytes=sum(e.size for e in entries),
            properties={"attempt": str(self._attempt)},
        )

    def _finalized(self, snapshot: _Snapshot, metadata: CheckpointMetadata) -> FinalizeAnswer:
        """Write `metadata`; the image is finalized (completed if nothing waits for it)."""
        checkpoint_id = snapshot.checkpoint_id
        try:
            self._storage.write_metadata(metadata)
        except (MissingFileError, ChecksumMismatchError):
            # A shared file the image names is not stored as it says (deleted behind the
            # job's back?): the next image looks up every file instead of reusing this one's,
            # and stores again what is missing (where the completed checkpoint finds it too).
            if snapshot.kind is CheckpointKind.CHECKPOINT:
                with self._lock:
                    self._completed_files = {}
            raise
        with self._lock:
            aborted = snapshot.cancelled.is_set()  # set by abort() under this lock
            if not aborted:
                done_here = _completes_at_finalization(snapshot)
                snapshot.state = SnapshotPhase.COMPLETED if done_here else SnapshotPhase.FINALIZED
                self._forget_old_done_snapshots()
        self._changed()
        if aborted:  # the abort came while _metadata was being written: take it back
            self._storage.fs.delete_tree(
                self._storage.layout.snapshot_dir(snapshot.kind, checkpoint_id)
            )
            raise AgentRequestError(409, f"checkpoint {checkpoint_id} was aborted")
        path = self._storage.layout.metadata_path(snapshot.kind, checkpoint_id)
        return FinalizeAnswer(path, metadata.total_bytes)

    def complete(self, checkpoint_id: int, batch_id: int) -> None:
        """The coordinator registered the image: sinks may commit batches <= batch_id.

        Only an image this agent finalized can complete, and only at its own batch:
        sinks committing past the newest restorable image would break exactly-once, so
        anything else is refused (404, 409) before a sink hears of it. Repeating a
        completion is allowed (the coordinator cannot know whether the first arrived).
        """
        with self._lock:
            snapshot = self._require(checkpoint_id)
            completable = (SnapshotPhase.FINALIZED, SnapshotPhase.COMPLETED)
            if snapshot.plan is None or snapshot.state not in completable:
                raise AgentRequestError(
                    409,
                    f"checkpoint {checkpoint_id} is {snapshot.state}: only a finalized image "
                    "can complete",
                )
            if batch_id != snapshot.plan.batch_id:
                raise AgentRequestError(
                    409,
                    f"checkpoint {checkpoint_id} is an image of batch "
                    f"{snapshot.plan.batch_id}, not of batch {batch_id}",
                )
            snapshot.state = SnapshotPhase.COMPLETED
            self._forget_old_done_snapshots()
            after = snapshot.after
            if snapshot.kind is CheckpointKind.CHECKPOINT and checkpoint_id > self._completed_id:
                self._completed_id = checkpoint_id
                self._completed_files = {
                    entry.path: (snapshot.identities[entry.path], entry)
                    for entry in (
                        *snapshot.reused.values(),
                        *(e for entries in snapshot.entries.values() for e in entries),
                    )
                    if entry.path in snapshot.identities
                }
        for participant in self._participants:
            try:
                participant.on_checkpoint_complete(batch_id)
            except Exception as error:  # the participant's own: the coordinator repeats it
                log.exception("participant %r did not commit batch %s", participant, batch_id)
                failed = (
                    f"{participant!r} did not commit batch {batch_id}: "
                    f"{type(error).__name__}: {error}"
                )
                raise AgentRequestError(500, f"participant {printable_line(failed)}") from error
        if after is not AfterCompletion.CONTINUE:
            # The driver's main thread stops the query: stopping it from this (HTTP)
            # thread could block on the batch the query is running. Set before the
            # notification: a driver whose input ran out, woken by it, stops, not finishes.
            log.info("savepoint %s complete: stopping the query", checkpoint_id)
            self._stop_requested.set()
        with self._notified:
            if self._notified_batch is None or batch_id > self._notified_batch:
                self._notified_batch = batch_id
            self._notified.notify_all()
        self._changed()

    def abort(self, checkpoint_id: int, reason: str) -> None:
        with self._notified:  # a driver waits for the end of a stop-with-savepoint
            snapshot = self._snapshots.get(checkpoint_id)
            if snapshot is None:
                return
            # A completed image is registered, so never aborted, except a savepoint done at
            # finalization whose abort overtook the coordinator's registration.
            if snapshot.state is SnapshotPhase.COMPLETED and not _completes_at_finalization(
                snapshot
            ):
                return
            was = snapshot.state
            snapshot.state = SnapshotPhase.ABORTED
            snapshot.cancelled.set()
            self._forget_old_done_snapshots()
            self._notified.notify_all()
        self._changed()
        # Quoted and clipped: the reason is the client's text, and may hold line breaks.
        log.info("checkpoint %s aborted: %.500r", checkpoint_id, reason)
        # A finalized image or a savepoint's own files are garbage once aborted (shared
        # files of an aborted checkpoint are left to garbage collection). Copies still
        # running would write after a delete, so they delete when the last one ends.
        copies_running = was in (SnapshotPhase.CAPTURING, SnapshotPhase.COPYING)
        if not copies_running and (
            was is SnapshotPhase.FINALIZED or snapshot.kind is CheckpointKind.SAVEPOINT
        ):
            self._delete_image(snapshot)

    def discard_checkpoint(self, checkpoint_id: int, retained: Sequence[int]) -> None:
        with self._storage_access.discard():
            with self._lock:
                protected = set().union(*(s.locations() for s in self._in_flight()))
                if checkpoint_id == self._completed_id:  # its files may go: reuse none
                    self._completed_files = {}
            with _storage_must_agree("discarded"):
                self._storage.discard_checkpoint(checkpoint_id, retained, protected)

    def discard_savepoint(self, savepoint_id: int) -> None:
        self._storage.discard_savepoint(savepoint_id)

    def collect_garbage(
        self, checkpoints: Sequence[int], savepoints: Sequence[int]
    ) -> CollectGarbageAnswer:
        with self._storage_access.discard():
            with self._lock:
                if self._in_flight():
                    raise AgentRequestError(409, "snapshots are in flight")
            with self._lock:
                if self._completed_id not in checkpoints:  # its files may go: reuse none
                    self._completed_files = {}
            with _storage_must_agree("collected"):
                report = self._storage.collect_garbage(checkpoints, savepoints)
        if report.aborted_uploads:
            log.info("aborted %d unfinished uploads in storage", report.aborted_uploads)
        return CollectGarbageAnswer(
            tuple(report.checkpoint_ids), tuple(report.savepoint_ids), len(report.shared_locations)
        )

    # ------------------------------------------------------------------ driver side

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def wait_for_notification(self, batch_id: int, should_give_up: Callable[[], bool]) -> bool:
        """Block until sinks were notified of an image covering ``batch_id`` (the final
        checkpoint of a bounded run) and no stop-with-savepoint is in flight, or until
        ``should_give_up``. A stop-with-savepoint that completes stops the query: the run
        ends with it (stop --drain), also when a checkpoint covering the batch came first."""
        with self._notified:
            while (
                self._notified_batch is None
                or self._notified_batch < batch_id
                or self._stop_under_way()
            ):
                if should_give_up():
                    return False
                self._notified.wait(timeout=0.5)
        return True

    def _stop_under_way(self) -> bool:
        """A stop-with-savepoint not aborted, whose stop is not set yet: one completed is
        marked so before its participants commit, and the stop follows only then."""
        return not self.stop_requested and any(
            s.after is not AfterCompletion.CONTINUE and s.state is not SnapshotPhase.ABORTED
            for s in self._snapshots.values()
        )

    def close(self) -> None:
        self._copies.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ snapshots

    def _require(self, checkpoint_id: int) -> _Snapshot:
        snapshot = self._snapshots.get(checkpoint_id)
        if snapshot is None and checkpoint_id <= self._forgotten_up_to:
            raise self._forgotten(checkpoint_id)
        if snapshot is None:
            raise AgentRequestError(404, f"checkpoint {checkpoint_id} is unknown")
        return snapshot

    @staticmethod
    def _forgotten(checkpoint_id: int) -> AgentRequestError:
        return AgentRequestError(
            409,
            f"checkpoint {checkpoint_id} ended long ago: this agent keeps the "
            f"{DONE_SNAPSHOTS_KEPT} newest completed or aborted snapshots",
        )

    def _capture(self, snapshot: _Snapshot) -> None:
        pin_dir = self._pin_root / snapshot_dir_name(snapshot.kind, snapshot.checkpoint_id)
        try:
            if snapshot.kind is CheckpointKind.SAVEPOINT:
                # Written over, another registry's savepoint of this job would be lost
                # (made after this driver reported the ids in storage, or a coordinator
                # too old to continue above them); a checkpoint's id is new.
                self._storage.require_no_snapshot(snapshot.kind, snapshot.checkpoint_id)
            batch_id = self._choose_batch(snapshot)
            if snapshot.after is AfterCompletion.DRAIN:
                # The wait for the input to run out is no part of the savepoint's duration.
                snapshot.trigger_time = datetime.now(UTC)
            plan = plan_snapshot(self._location, batch_id)
            planned = [f for files in plan.files_by_task.values() for f in files]
            identities = file_identities(self._location, planned)
            reused = self._unchanged(snapshot, identities)
            pin(self._location, (f for f in planned if f not in reused), pin_dir)
            # What shared/ holds, listed once for all tasks where storage would otherwise
            # be asked about each file (an object store); savepoints copy everything.
            stored = (
                self._storage.listed_shared_sizes()
                if snapshot.kind is CheckpointKind.CHECKPOINT
                else None
            )
        except (SnapshotError, StorageError, OSError) as error:
            # Pins go first: whoever sees the decline must see no pins left behind.
            shutil.rmtree(pin_dir, ignore_errors=True)
            self._decline_all(snapshot, str(error))
            return
        with self._lock:
            snapshot.plan = plan
            snapshot.identities = identities
            snapshot.reused = reused
            if snapshot.state is SnapshotPhase.CAPTURING:
                snapshot.state = SnapshotPhase.COPYING
        self._changed()
        remaining = [len(plan.files_by_task)]

        def copy_done(task: str, ack: TaskAcknowledgement | None) -> None:
            with self._lock:
                remaining[0] -= 1
                finished = remaining[0] == 0
                if ack is not None and not finished:
                    snapshot.acks[task] = ack
            if finished:
                # Gone before the last acknowledgement shows: a coordinator that sees every
                # task acknowledged may finalize, and no hard link holds Spark's files then.
                shutil.rmtree(pin_dir, ignore_errors=True)
            with self._lock:
                # The last acknowledgement and "acknowledged" show together: finalize
                # answers 409 to a snapshot still copying.
                if ack is not None and finished:
                    snapshot.acks[task] = ack
                if finished and snapshot.state is SnapshotPhase.COPYING and not snapshot.declines:
                    snapshot.state = SnapshotPhase.ACKNOWLEDGED
                aborted = snapshot.cancelled.is_set()
                acknowledgement_only = not finished and not snapshot.declines
            # This task's ack or decline, and perhaps "acknowledged".
            self._changed(acknowledgement_only=acknowledgement_only)
            if finished and aborted and snapshot.kind is CheckpointKind.SAVEPOINT:
                self._delete_image(snapshot)

        try:
            for task, files in plan.files_by_task.items():
                self._copies.submit(
                    self._copy_task, snapshot, task, files, pin_dir, copy_done, stored=stored
                )
        except RuntimeError:  # close() shut the copy pool down: the driver is exiting
            shutil.rmtree(pin_dir, ignore_errors=True)
            self._decline_all(snapshot, "the agent is closing")

    def _unchanged(
        self, snapshot: _Snapshot, identities: Mapping[str, FileIdentity]
    ) -> dict[str, ManifestEntry]:
        """The entries of the newest completed checkpoint for the files this image has
        unchanged (a savepoint copies every file: it is self-contained)."""
        if snapshot.kind is not CheckpointKind.CHECKPOINT:
            return {}
        with self._lock:
            completed = self._completed_files
        return {
            path: entry
            for path, (identity, entry) in completed.items()
            if identities.get(path) == identity
        }

    def _choose_batch(self, snapshot: _Snapshot) -> int:
        """The image is the query as of the first batch committed after the trigger: a
        batch already running when the trigger came is waited for; an idle query's image
        is its last committed batch. Drain first waits until no input is left."""
        planned_at_trigger = planned_batches(self._location)
        # On a busy query the next batch is planned right after each commit; waiting for
        # "nothing planned" could wait forever, so wait for the batch running at the trigger.
        target = planned_at_trigger[-1] if planned_at_trigger else 0
        requested = time.time()  # a drain: what input there is now, processed
        while True:
            if snapshot.cancelled.is_set():
                raise SnapshotError("aborted before capture")
            # Asked before the commit log is read: a batch committed in between is in it.
            drained = snapshot.after is not AfterCompletion.DRAIN or self._processed_all_since(
                requested
            )
            view = self._query_view()
            committed = self._committed(view)
            waiting_for_batch = not committed or committed[-1] < target
            if view.state is not QueryState.RUNNING and committed:
                return committed[-1]  # a finished query cannot move on
            if committed and not waiting_for_batch and drained:
                return committed[-1]
            if view.state in (QueryState.FAILED, QueryState.STOPPED):
                raise SnapshotError(f"the query is {view.state}: {view.message}")
            time.sleep(0.05)

    def _copy_task(
        self,
        snapshot: _Snapshot,
        task: str,
        files: tuple[str, ...],
        pin_dir: Path,
        done: Callable[[str, TaskAcknowledgement | None], None],
        *,
        stored: Mapping[str, int] | None,
    ) -> None:
        started = time.monotonic()
        entries: list[ManifestEntry] = []
        ack: TaskAcknowledgement | None = None
        try:
            for relative in files:
                if snapshot.cancelled.is_set():
                    return
                if relative in snapshot.reused:
                    with self._lock:
                        entries.append(snapshot.reused[relative])
                        snapshot.entries[task] = entries
                    continue
                if self._copy_delay:
                    time.sleep(self._copy_delay)
                source = str(pin_dir / relative)
                with self._storage_access.add():
                    if snapshot.kind is CheckpointKind.SAVEPOINT:
                        entry = self._storage.add_savepoint_file(
                            snapshot.checkpoint_id, source, relative
                        )
                    else:
                        entry = self._storage.add_shared_file(source, relative, stored=stored)
                    with self._lock:
                        entries.append(entry)
                        snapshot.entries[task] = entries
            ack = TaskAcknowledgement(
                task=task,
                files=tuple(e.path for e in entries),
                bytes=sum(e.size for e in entries),
                duration_ms=int((time.monotonic() - started) * 1000),
            )
        except Exception as error:  # every failure of a task is a decline with its reason
            log.warning("checkpoint %s task %s failed: %s", snapshot.checkpoint_id, task, error)
            with self._lock:
                snapshot.declines[task] = f"{type(error).__name__}: {error}"
        finally:
            done(task, ack)

    def _delete_image(self, snapshot: _Snapshot) -> None:
        self._storage.fs.delete_tree(
            self._storage.layout.snapshot_dir(snapshot.kind, snapshot.checkpoint_id)
        )

    def _decline_all(self, snapshot: _Snapshot, message: str) -> None:
        log.warning("checkpoint %s cannot be taken: %s", snapshot.checkpoint_id, message)
        with self._lock:
            snapshot.declines[LOGS_TASK] = message
        self._changed()

    def _query_id(self) -> str:
        document = json.loads((self._location / "metadata").read_text())
        return str(document["id"])
