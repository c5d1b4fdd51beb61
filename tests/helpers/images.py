"""Damage a stored image the way a planner bug does: a file Spark needs at restart is left
out of the image, while its `_metadata` stays consistent, so plain `verify` passes."""

import dataclasses
from collections.abc import Callable
from pathlib import Path

from spark_checkpoint.storage import CheckpointMetadata


def image_dir(job_storage: Path, kind: str, snapshot_id: int) -> Path:
    return job_storage / (
        f"chk-{snapshot_id}" if kind == "checkpoint" else f"savepoints/sp-{snapshot_id}"
    )


def _read(metadata_file: Path) -> CheckpointMetadata:
    return CheckpointMetadata.from_bytes(metadata_file.read_bytes(), str(metadata_file))


def leave_out(
    job_storage: Path, kind: str, snapshot_id: int, unwanted: Callable[[str], bool]
) -> list[str]:
    """Remove the files whose path ``unwanted`` selects from the image's manifest: a
    restore no longer brings them back (their stored bytes stay, unreferenced). Returns
    their paths."""
    metadata_file = image_dir(job_storage, kind, snapshot_id) / "_metadata"
    meta = _read(metadata_file)
    paths = {entry.path for entry in meta.files if unwanted(entry.path)}
    assert paths, "nothing to leave out"
    files = tuple(entry for entry in meta.files if entry.path not in paths)
    acknowledgements = tuple(
        dataclasses.replace(ack, files=tuple(path for path in ack.files if path not in paths))
        for ack in meta.acknowledgements
    )
    damaged = dataclasses.replace(
        meta,
        files=files,
        total_bytes=sum(entry.size for entry in files),
        acknowledgements=acknowledgements,
    )
    metadata_file.write_bytes(damaged.to_bytes())
    return sorted(paths)


def batch_of(job_storage: Path, kind: str, snapshot_id: int) -> int:
    return _read(image_dir(job_storage, kind, snapshot_id) / "_metadata").batch_id


def leave_out_newest_state(job_storage: Path, kind: str, snapshot_id: int) -> list[str]:
    """The state version the next batch loads (batch B writes version B + 1), in every
    partition: Spark's HDFS state store cannot load it (CANNOT_READ_DELTA_FILE_NOT_EXISTS)."""
    version = batch_of(job_storage, kind, snapshot_id) + 1
    return leave_out(
        job_storage,
        kind,
        snapshot_id,
        lambda path: (
            path.startswith("state/")
            and path.rsplit("/", 1)[-1] in (f"{version}.delta", f"{version}.snapshot")
        ),
    )
