"""``spark-checkpoint savepoint --dispose`` (Flink's ``savepoint --dispose``): a savepoint
leaves the job's registry, then its files leave storage. Through the run of the job while
one runs (`ControlServer`, the coordinator's `SavepointDisposeRequested`), else here, under
the locks a run takes, with the registry written ahead of the delete as a run does."""

import argparse
import os
import time
from dataclasses import replace

from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointStorage,
    StorageError,
    parse_snapshot_address,
    parse_snapshot_dir_name,
)
from spark_checkpoint_operator.local_runtime import (
    JobBusy,
    RunRefused,
    check_storage_unchanged,
    job_lock,
    load_record,
    registry_owner,
    storage_lock,
)
from spark_checkpoint_operator.local_state import LocalPaths
from spark_checkpoint_operator.restore_choice import (
    image_argument,
    registry_reference,
    snapshot_uri,
)
from spark_checkpoint_operator.status import DiscardDue, StatusFile, render_status
from spark_checkpoint_operator.supervisor import JobRecord


class DisposalRefused(Exception):
    """The savepoint is not disposed of; the message says why."""


class DisposalDeclined(DisposalRefused):
    """The coordinator's rule keeps the savepoint (`PersistedState.why_not_disposable`)."""


class DisposalIncomplete(Exception):
    """The savepoint left the registry, but its files could not be deleted; the message
    says why."""


def savepoint_argument(choice: str) -> str:
    """`image_argument` for ``--dispose``, whose empty value asks for a savepoint."""
    if not choice:
        raise argparse.ArgumentTypeError("is empty: give savepoint:N or a savepoint's path")
    return image_argument(choice, kinds=(CheckpointKind.SAVEPOINT,))


def savepoint_named(choice: str, storage: CheckpointStorage | None) -> int:
    """The id of the job's savepoint ``choice`` (as `image_choice` takes it) names:
    ``savepoint:N``, or the path (or URI) of its directory or ``_metadata`` in the job's
    ``storage`` (None: not known, a path is refused). Raises DisposalRefused naming what
    is wrong."""
    reference = registry_reference(choice)
    if reference is not None:
        if reference.kind is CheckpointKind.CHECKPOINT:
            raise DisposalRefused(_NO_CHECKPOINTS)
        assert reference.snapshot_id is not None
        return reference.snapshot_id
    if parse_snapshot_dir_name(CheckpointKind.CHECKPOINT, choice) is not None and not (
        os.path.lexists(choice)
    ):
        raise DisposalRefused(_NO_CHECKPOINTS)  # `chk-5`: a checkpoint's directory's name
    if storage is None:
        raise DisposalRefused(f"{choice}: a path needs the job's storage: name the job with -f")
    try:
        address = parse_snapshot_address(snapshot_uri(choice))
        own = CheckpointStorage(address.layout).is_same_job_directory(storage)
    except (ValueError, ImportError, OSError) as error:
        raise DisposalRefused(f"{choice} is no savepoint of the job: {error}") from None
    if address.kind is CheckpointKind.CHECKPOINT:
        raise DisposalRefused(_NO_CHECKPOINTS)
    if not own:
        raise DisposalRefused(
            f"{choice} is not in the job's storage ({storage.layout.job_root}): only the "
            "job's own savepoints are disposed of here"
        )
    return address.snapshot_id


_NO_CHECKPOINTS = (
    "only savepoints are disposed of: retention deletes checkpoints (spec.checkpointing.retained)"
)


def dispose_here(
    paths: LocalPaths, storage: CheckpointStorage, job: str, savepoint_id: int, named: str
) -> str:
    """Dispose of savepoint ``savepoint_id`` while no run of the job runs; what was done,
    in a line (``named``: what messages call the storage, as `storage_lock` takes it).
    Raises DisposalRefused (DisposalDeclined: the coordinator's rule), or
    DisposalIncomplete."""
    if not paths.job_dir.is_dir():  # the lock said only "cannot open the lock ...run.lock"
        raise DisposalRefused(
            f"job {job} has no state in {paths.job_dir.parent.parent}: it has not run with "
            "this state directory (--state-dir), so no savepoint of it is registered here"
        )
    try:
        with job_lock(paths, job), storage_lock(storage, job, named):
            return _dispose_locked(paths, storage, savepoint_id)
    except (JobBusy, RunRefused) as error:
        raise DisposalRefused(str(error)) from None


def _dispose_locked(paths: LocalPaths, storage: CheckpointStorage, savepoint_id: int) -> str:
    record = load_record(paths)
    # As `run`: storage other than where the registered images are (`--job` without the
    # manifest's storage, a changed spec.checkpointing.storage) would lose the savepoint's
    # files, registered no more.
    check_storage_unchanged(record, storage, paths)
    # As `run`: a copy of the state directory whose original still keeps its registry
    # lists the same savepoints, which the original would restore from (RunRefused).
    registry_owner(paths, storage)
    state = record.coordinator
    due = DiscardDue(CheckpointKind.SAVEPOINT, savepoint_id)
    directory = storage.layout.savepoint_dir(savepoint_id)
    # Asked again after a delete failed: its files are deleted now.
    if all(d.key != due.key for d in record.discards_due):
        why = record.why_not_disposable(savepoint_id)
        # Images deleted by hand are none a restore takes: they keep no savepoint disposable.
        if (
            why is None
            and (absent := _absent_images(storage, record))
            and (why := record.why_not_disposable(savepoint_id, absent)) is not None
        ):
            gone = ", ".join(f"{kind.value} {image_id}" for kind, image_id in sorted(absent))
            why = f"{why} ({gone}: registered, but not in storage)"
        if why is not None:
            registered = any(s.checkpoint_id == savepoint_id for s in state.savepoints)
            raise DisposalDeclined(why) if registered else DisposalRefused(why)
        try:  # a link in the way is refused before the registry changes
            storage.fs.require_no_link(directory)
        except StorageError as error:
            raise DisposalRefused(str(error)) from None
        record.coordinator = replace(
            state, savepoints=tuple(s for s in state.savepoints if s.checkpoint_id != savepoint_id)
        )
        # Written ahead, as a run does: if this process dies before the delete, the next
        # run deletes what is due.
        record.discards_due = [*record.discards_due, due]
        _write(paths, record)
    try:
        was_there = storage.fs.exists(directory)
        storage.discard_savepoint(savepoint_id)
    except (StorageError, OSError, ValueError) as error:
        raise DisposalIncomplete(
            f"savepoint {savepoint_id} is no longer registered, but its files are not deleted "
            f"({error}): the next run of the job deletes them, or this command again"
        ) from None
    record.discards_due = [d for d in record.discards_due if d.key != due.key]
    _write(paths, record)
    files = "its files deleted" if was_there else "its files were gone already"
    return f"savepoint {savepoint_id} disposed of: no longer registered, {files} ({directory})"


def _absent_images(
    storage: CheckpointStorage, record: JobRecord
) -> set[tuple[CheckpointKind, int]]:
    """The registered images whose `_metadata` is not in storage (deleted by hand): the
    rule that keeps the newest image must not count on them."""
    images = (*record.coordinator.checkpoints, *record.coordinator.savepoints)
    try:
        return {
            (image.kind, image.checkpoint_id)
            for image in images
            if not storage.has_metadata(image.kind, image.checkpoint_id)
        }
    except (StorageError, OSError) as error:
        raise DisposalRefused(f"cannot look for the job's images in storage: {error}") from None


def _write(paths: LocalPaths, record: JobRecord) -> None:
    """The status file with ``record``, as the run writes it (its conditions kept)."""
    found = StatusFile.read(paths.status_file)
    assert found is not None  # `load_record` read a registry from it
    previous = found.status.get("conditions") if isinstance(found.status, dict) else None
    status = render_status(
        record,
        now=time.time(),
        previous_conditions=previous if isinstance(previous, list) else [],
    )
    StatusFile(
        path=paths.status_file,
        name=found.name,
        namespace=found.namespace,
        status=status,
        driver_pid=found.driver_pid,  # a killed run's driver, which the next run stops
    ).write()
