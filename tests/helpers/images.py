"""Damage a stored image the way a planner bug does: a file Spark needs at restart is left
out of the image, while its `_metadata` stays consistent, so plain `verify` passes."""

import json
from collections.abc import Callable
from pathlib import Path


def image_dir(job_storage: Path, kind: str, snapshot_id: int) -> Path:
    return job_storage / (
        f"chk-{snapshot_id}" if kind == "checkpoint" else f"savepoints/sp-{snapshot_id}"
    )


def leave_out(
    job_storage: Path, kind: str, snapshot_id: int, unwanted: Callable[[str], bool]
) -> list[str]:
    """Remove the files whose path ``unwanted`` selects from the image's manifest: a
    restore no longer brings them back (their stored bytes stay, unreferenced). Returns
    their paths."""
    metadata_file = image_dir(job_storage, kind, snapshot_id) / "_metadata"
    document = json.loads(metadata_file.read_text())
    dropped = [entry for entry in document["files"] if unwanted(entry["path"])]
    assert dropped, "nothing to leave out"
    paths = {entry["path"] for entry in dropped}
    document["files"] = [entry for entry in document["files"] if entry["path"] not in paths]
    document["total_bytes"] = sum(entry["size"] for entry in document["files"])
    for ack in document["acknowledgements"]:
        ack["files"] = [path for path in ack["files"] if path not in paths]
    metadata_file.write_text(json.dumps(document, indent=2) + "\n")
    return sorted(paths)


def batch_of(job_storage: Path, kind: str, snapshot_id: int) -> int:
    document = json.loads((image_dir(job_storage, kind, snapshot_id) / "_metadata").read_text())
    batch: int = document["batch_id"]
    return batch


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
