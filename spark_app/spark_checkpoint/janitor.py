"""Storage work while no driver runs: ``python -m spark_checkpoint.janitor <command>``.

On Kubernetes the operator runs this in a short cleanup pod that has the job's image,
service account, environment and volumes, which is where storage credentials live; the
operator itself never touches storage. The job comes from ``SPARK_CHECKPOINT_NAMESPACE``,
``SPARK_CHECKPOINT_JOB`` and ``SPARK_CHECKPOINT_STORAGE``, the registry it works for from
``SPARK_CHECKPOINT_OWNER`` (discards and garbage collection claim the job's storage for it
first, `CheckpointStorage.claim`); ``remove-live-directory`` also
needs ``SPARK_CHECKPOINT_LIVE_ROOT``, where the job's live volume claim is mounted whole.

``verify-restorable`` runs the restorable check of `spark_checkpoint.restorable` on one
image and writes its report (`spark_checkpoint.restorable_report`) to the file ``--report``
names, the pod's termination message file, which is how the operator reads the verdict.
The command line is built and parsed in `spark_checkpoint.janitor_commands`.

Exit codes: 0 done (for ``verify-restorable``: a verdict, restorable or not, is in the
report), 1 storage failed or Spark could not run (the message is the last line of output,
which the pod's termination message shows; a symbolic link in the job's directory is
refused this way, before anything is deleted), 2 bad arguments or settings (an id that is
not a non-negative integer, a namespace or job that is not a valid name, an unknown
storage URI).
"""

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from spark_checkpoint.janitor_commands import (
    JANITOR_SETTINGS,
    ClaimStorage,
    CollectGarbage,
    DiscardCheckpoint,
    DiscardSavepoint,
    RemoveLiveDirectory,
    VerifyRestorable,
    failure_line,
    parse,
)
from spark_checkpoint.restorable_report import encoded, fitted, parse_image
from spark_checkpoint.settings import OWNER_VARIABLE, PREFIX, storage_owner
from spark_checkpoint.storage import (
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
    SymbolicLinkError,
    storage_failure,
)
from spark_checkpoint.user_entry import provide_user_entry


def main(argv: Sequence[str] | None = None) -> int:
    provide_user_entry()  # verify-restorable starts Spark's JVM, which needs one
    command = parse(argv)
    names = list(JANITOR_SETTINGS)
    if isinstance(command, RemoveLiveDirectory):
        names.append("LIVE_ROOT")
    settings = {name: os.environ.get(PREFIX + name, "") for name in names}
    missing = [PREFIX + name for name, value in settings.items() if not value]
    if missing:
        print(f"not set: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        layout = JobStorageLayout(settings["STORAGE"], settings["NAMESPACE"], settings["JOB"])
        storage = CheckpointStorage(layout)
        owner = storage_owner(os.environ.get(OWNER_VARIABLE, ""))
    except (ValueError, ImportError) as error:  # a bad name, or no fsspec for the URI
        print(f"bad settings: {error}", file=sys.stderr)
        return 2
    try:
        if isinstance(
            command, DiscardCheckpoint | DiscardSavepoint | CollectGarbage | ClaimStorage
        ):
            storage.claim(owner)  # before anything of the job's storage is deleted
        match command:
            case ClaimStorage():
                print(f"claimed {layout.job_root}")
            case DiscardCheckpoint():
                storage.discard_checkpoint(command.checkpoint_id, list(command.retained))
                print(f"discarded checkpoint {command.checkpoint_id}")
            case DiscardSavepoint():
                storage.discard_savepoint(command.savepoint_id)
                print(f"discarded savepoint {command.savepoint_id}")
            case CollectGarbage():
                report = storage.collect_garbage(
                    list(command.checkpoints), list(command.savepoints)
                )
                print(
                    f"removed checkpoints {list(report.checkpoint_ids)}, savepoints "
                    f"{list(report.savepoint_ids)}, {len(report.shared_locations)} shared "
                    f"files, {report.aborted_uploads} unfinished uploads"
                )
            case RemoveLiveDirectory():
                directory = Path(settings["LIVE_ROOT"]) / command.name
                if directory.is_symlink():
                    raise SymbolicLinkError(str(directory), os.readlink(directory))
                if directory.exists():
                    shutil.rmtree(directory)
                    print(f"removed {directory}")
                else:
                    print(f"{directory} does not exist: nothing to remove")
            case VerifyRestorable():
                return _verify_restorable(storage, command)
    except (StorageError, OSError, ValueError) as error:
        print(failure_line(command, storage_failure(error, layout.job_root)), file=sys.stderr)
        return 1
    return 0


def _verify_restorable(storage: CheckpointStorage, command: VerifyRestorable) -> int:
    """The verdict goes to the report file whatever it is (exit code 0); the whole report
    is printed too, as the termination message keeps only 4096 bytes of it."""
    # Here: the other commands, most cleanup pods, start without importing pyspark.
    from spark_checkpoint.restorable import check_images  # noqa: PLC0415

    try:
        (result,) = check_images(storage, [parse_image(command.image)])
    except Exception as error:  # Spark did not start: its errors come as many classes
        reason = f"Spark could not read {command.image}: {error}"
        print(failure_line(command, reason), file=sys.stderr)
        return 1
    print(encoded([result]))
    Path(command.report).write_text(fitted(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
