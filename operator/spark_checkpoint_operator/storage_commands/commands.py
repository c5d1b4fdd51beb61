"""``spark-checkpoint list``, ``inspect`` and ``verify``: from arguments to exit code."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from spark_checkpoint.storage import StorageError
from spark_checkpoint_operator.cli_conventions import OutputFormat, error_lines, print_document
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.storage_commands.job import (
    CommandError,
    JobStorage,
    StorageSource,
    StorageUnusable,
    opened_job_storage,
    registry_or_warn,
    unset_secrets_hint,
)
from spark_checkpoint_operator.storage_commands.rendering import (
    inspect_document,
    inspect_lines,
    list_document,
    list_lines,
    verify_document,
    verify_lines,
)
from spark_checkpoint_operator.storage_commands.snapshots import (
    SnapshotRef,
    StoredSnapshotState,
    deep_verify,
    default_refs,
    inspect_snapshots,
    io_problem,
    list_snapshots,
    nothing_stored,
    read_ownership,
    verify_snapshot,
)


def run_list(
    source: StorageSource,
    *,
    output: OutputFormat | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """``spark-checkpoint list``."""
    try:
        with opened_job_storage(source) as job:
            return _list(job, output=output, out=out, err=err)
    except CommandError as error:
        return _usage_error("list", error, err)


def _list(job: JobStorage, *, output: OutputFormat | None, out: TextIO, err: TextIO) -> int:
    now = datetime.now(UTC)
    registry = registry_or_warn(job, err)
    try:
        rows = list_snapshots(job.storage, registry)
        ownership = read_ownership(job.storage, job.paths)
        stored = any(row.state is not StoredSnapshotState.MISSING for row in rows)
        missing = None if stored else nothing_stored(job.storage, registry)
    except (StorageError, OSError) as error:
        return _storage_failed("list", error, err, job)
    if output in (OutputFormat.JSON, OutputFormat.YAML):
        print_document(
            list_document(job, registry, ownership, rows, now, missing=missing), output, out
        )
    else:
        wide = output is OutputFormat.WIDE
        for line in list_lines(job, registry, ownership, rows, now, wide=wide, missing=missing):
            print(line, file=out)
    return ExitCode.OK


def run_inspect(
    source: StorageSource,
    snapshots: Sequence[str],
    *,
    output: OutputFormat | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """``spark-checkpoint inspect [KIND:ID ...]``: exit 1 if a snapshot cannot be read
    (the others are shown), or if there is none."""
    try:
        refs = [SnapshotRef.parse(text) for text in snapshots]
        with opened_job_storage(source) as job:
            return _inspect(job, refs, output=output, out=out, err=err)
    except CommandError as error:
        return _usage_error("inspect", error, err)


def _inspect(
    job: JobStorage,
    refs: list[SnapshotRef],
    *,
    output: OutputFormat | None,
    out: TextIO,
    err: TextIO,
) -> int:
    now = datetime.now(UTC)
    registry = registry_or_warn(job, err)
    try:
        inspection = inspect_snapshots(job.storage, refs, registry)
        missing = None if inspection.snapshots else nothing_stored(job.storage, registry)
    except (StorageError, OSError) as error:
        return _storage_failed("inspect", error, err, job)
    for problem in inspection.problems:
        print(f"spark-checkpoint inspect: {problem}", file=err)
    if output in (OutputFormat.JSON, OutputFormat.YAML):
        print_document(inspect_document(job, registry, inspection), output, out)
    else:
        for line in inspect_lines(inspection, now, wide=output is OutputFormat.WIDE):
            print(line, file=out)
    if not inspection.snapshots and not inspection.problems:
        found = f"no checkpoints or savepoints with a _metadata in {job.layout.job_root}"
        print(f"spark-checkpoint inspect: {missing or found}", file=err)
        return ExitCode.FAILED
    return ExitCode.FAILED if inspection.problems else ExitCode.OK


def run_verify(
    source: StorageSource,
    snapshots: Sequence[str],
    *,
    output: OutputFormat | None,
    out: TextIO,
    err: TextIO,
    deep: bool = False,
) -> int:
    """``spark-checkpoint verify [--deep] [KIND:ID ...]``: exit 0 only if every snapshot is
    OK (with ``--deep``: and restorable)."""
    try:
        refs = [SnapshotRef.parse(text) for text in snapshots]
        with opened_job_storage(source) as job:
            return _verify(job, refs, output=output, out=out, err=err, deep=deep)
    except CommandError as error:
        return _usage_error("verify", error, err)


def _verify(
    job: JobStorage,
    refs: list[SnapshotRef],
    *,
    output: OutputFormat | None,
    out: TextIO,
    err: TextIO,
    deep: bool,
) -> int:
    registry = registry_or_warn(job, err)
    try:
        refs = refs or default_refs(job.storage, registry)
        # Also for images named or registered: a bucket that does not exist is said so.
        nothing = nothing_stored(job.storage, registry)
    except (StorageError, OSError) as error:
        return _storage_failed("verify", error, err, job)
    missing = None if refs else nothing
    results = [verify_snapshot(job.storage, ref, registry) for ref in dict.fromkeys(refs)]
    if deep:
        results = deep_verify(job.storage, results)
    failed = any(not result.ok for result in results)
    # Nothing verified is not a pass: a gate that reads exit 0 as "the images are sound"
    # must not see it for storage that is empty or named wrongly.
    ok = bool(results) and not failed
    if output is not None:
        print_document(verify_document(job, results, ok, missing), output, out)
        return ExitCode.OK if ok else ExitCode.FAILED
    if not results:
        found = f"no checkpoints or savepoints in {job.layout.job_root}"
        print(f"spark-checkpoint verify: nothing to verify: {missing or found}", file=err)
        return ExitCode.FAILED
    for line in verify_lines(results, registry):
        print(line, file=out)
    if nothing is not None:  # registered images, and no directory of the job's where named
        print(nothing, file=out)
    return ExitCode.FAILED if failed else ExitCode.OK


def _usage_error(command: str, error: CommandError, err: TextIO) -> int:
    print(error_lines(f"spark-checkpoint {command}", error), file=err)
    return ExitCode.FAILED if isinstance(error, StorageUnusable) else ExitCode.USAGE


def _storage_failed(
    command: str, error: StorageError | OSError, err: TextIO, job: JobStorage
) -> int:
    """Storage that cannot be read at all (listed, opened): one line naming the path, and
    the manifest's Secret variables this process lacks (an object store's credentials)."""
    text = str(error) if isinstance(error, StorageError) else io_problem(error, job.layout.job_root)
    if not job.storage.fs.is_local:
        text += unset_secrets_hint(job.unset_secrets)
    print(f"spark-checkpoint {command}: {text}", file=err)
    return ExitCode.FAILED
