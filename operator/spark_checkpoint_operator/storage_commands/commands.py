"""``spark-checkpoint list``, ``inspect`` and ``verify``: from arguments to exit code."""

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from spark_checkpoint.storage import StorageError
from spark_checkpoint_operator.storage_commands.job import (
    CommandError,
    StorageSource,
    is_registered,
    open_job_storage,
    registry_or_warn,
)
from spark_checkpoint_operator.storage_commands.rendering import (
    describe_metadata,
    list_document,
    list_lines,
    verify_document,
    verify_lines,
)
from spark_checkpoint_operator.storage_commands.snapshots import (
    SnapshotRef,
    deep_verify,
    default_refs,
    list_snapshots,
    shared_reuse,
    storage_problem,
    verify_snapshot,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def run_list(
    source: StorageSource,
    *,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """``spark-checkpoint list``."""
    now = datetime.now(UTC)
    try:
        job = open_job_storage(source)
    except CommandError as error:
        return _usage_error("list", error, err)
    registry = registry_or_warn(job, err)
    try:
        rows = list_snapshots(job.storage, registry)
    except (StorageError, OSError) as error:
        print(f"spark-checkpoint list: {error}", file=err)
        return EXIT_FAILED
    if as_json:
        print(json.dumps(list_document(job, registry, rows, now), indent=2), file=out)
    else:
        for line in list_lines(job, registry, rows, now):
            print(line, file=out)
    return EXIT_OK


def run_inspect(
    source: StorageSource,
    snapshot: str,
    *,
    as_json: bool,
    show_files: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """``spark-checkpoint inspect KIND:ID``."""
    now = datetime.now(UTC)
    try:
        ref = SnapshotRef.parse(snapshot)
        job = open_job_storage(source)
    except CommandError as error:
        return _usage_error("inspect", error, err)
    try:
        meta = job.storage.read_metadata(ref.kind, ref.snapshot_id)
    except StorageError as error:
        print(f"spark-checkpoint inspect: {ref}: {storage_problem(error)}", file=err)
        return EXIT_FAILED
    except OSError as error:
        print(f"spark-checkpoint inspect: {ref}: I/O error: {error}", file=err)
        return EXIT_FAILED
    if as_json:
        out.write(meta.to_json().decode("utf-8"))
        return EXIT_OK
    registry = registry_or_warn(job, err)
    for line in describe_metadata(
        meta,
        path=job.layout.metadata_path(ref.kind, ref.snapshot_id),
        registered=is_registered(registry, ref.kind, ref.snapshot_id),
        reuse=shared_reuse(job.storage, meta),
        now=now,
        show_files=show_files,
    ):
        print(line, file=out)
    return EXIT_OK


def run_verify(
    source: StorageSource,
    snapshots: Sequence[str],
    *,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    deep: bool = False,
) -> int:
    """``spark-checkpoint verify [--deep] [KIND:ID ...]``: exit 0 only if every snapshot is
    OK (with ``--deep``: and restorable)."""
    try:
        refs = [SnapshotRef.parse(text) for text in snapshots]
        job = open_job_storage(source)
    except CommandError as error:
        return _usage_error("verify", error, err)
    if not refs:
        registry = registry_or_warn(job, err)
        try:
            refs = default_refs(job.storage, registry)
        except (StorageError, OSError) as error:
            print(f"spark-checkpoint verify: {error}", file=err)
            return EXIT_FAILED
    results = [verify_snapshot(job.storage, ref) for ref in dict.fromkeys(refs)]
    if deep:
        results = deep_verify(job.storage, results)
    failed = any(not result.ok for result in results)
    # Nothing verified is not a pass: a gate that reads exit 0 as "the images are sound"
    # must not see it for storage that is empty or named wrongly.
    ok = bool(results) and not failed
    if as_json:
        print(json.dumps(verify_document(job, results, ok), indent=2), file=out)
        return EXIT_OK if ok else EXIT_FAILED
    if not results:
        print(
            "spark-checkpoint verify: nothing to verify: no checkpoints or savepoints in "
            f"{job.layout.job_root}",
            file=err,
        )
        return EXIT_FAILED
    for line in verify_lines(results):
        print(line, file=out)
    return EXIT_FAILED if failed else EXIT_OK


def _usage_error(command: str, error: CommandError, err: TextIO) -> int:
    print(f"spark-checkpoint {command}: {error}", file=err)
    return EXIT_USAGE
