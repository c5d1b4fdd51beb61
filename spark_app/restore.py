"""Restore: materialize a registered image into a fresh Spark checkpoint location.

Candidates are tried newest first; an image that cannot be read or verified is skipped
with a warning and the next one is tried. The live location of an earlier attempt is
never reused: two drivers on one location corrupt it.
"""

import json
import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from spark_checkpoint.settings import RestoreCandidate
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
)

log = logging.getLogger(__name__)


class RestoreFailed(Exception):
    """No candidate could be restored; the message lists each one with its reason."""


@dataclass(frozen=True, slots=True)
class RestoreOutcome:
    candidate: RestoreCandidate
    batch_id: int
    skipped: tuple[tuple[str, str], ...]  # (candidate, reason) of images passed over

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.candidate),
            "batchId": self.batch_id,
            "skipped": [{"source": c, "reason": r} for c, r in self.skipped],
        }


def restore(
    storage: CheckpointStorage,
    candidates: tuple[RestoreCandidate, ...],
    target: Path,
) -> RestoreOutcome | None:
    """Materialize the newest usable candidate into ``target``; None when there are none."""
    skipped: list[tuple[str, str]] = []
    for candidate in candidates:
        try:
            metadata, source_storage = _open(storage, candidate)
            source_storage.materialize(metadata, str(target))
        except (StorageError, OSError, ValueError, ImportError) as error:
            # ValueError and ImportError: fsspec knows no such protocol (or lacks its package)
            log.warning(
                "cannot restore from %s (%s); falling back to the next image", candidate, error
            )
            skipped.append((str(candidate), str(error)))
            shutil.rmtree(target, ignore_errors=True)
            continue
        if candidate.kind == "external" and metadata.job != storage.layout.job:
            _give_new_query_id(target)
        log.info("restored %s at batch %s into %s", candidate, metadata.batch_id, target)
        return RestoreOutcome(candidate, metadata.batch_id, tuple(skipped))
    if skipped:
        reasons = "; ".join(f"{c}: {r}" for c, r in skipped)
        raise RestoreFailed(f"no image could be restored: {reasons}")
    return None


def _open(
    storage: CheckpointStorage, candidate: RestoreCandidate
) -> tuple[CheckpointMetadata, CheckpointStorage]:
    if candidate.kind != "external":
        assert candidate.snapshot_id is not None
        kind = CheckpointKind(candidate.kind)
        return storage.read_metadata(kind, candidate.snapshot_id), storage
    uri = candidate.metadata_uri or ""
    with fsspec.open(uri, "rb") as stream:
        metadata = CheckpointMetadata.from_json(stream.read(), uri)
    suffix = (
        f"/{metadata.namespace}/{metadata.job}/savepoints/sp-{metadata.checkpoint_id}/_metadata"
    )
    if not uri.endswith(suffix):
        raise StorageError(uri, f"a savepoint's _metadata must be at <root>{suffix}")
    layout = JobStorageLayout(uri[: -len(suffix)], metadata.namespace, metadata.job)
    return metadata, CheckpointStorage(layout)


def _give_new_query_id(location: Path) -> None:
    """A fork from another job's savepoint is a new query: sinks that skip batch ids they
    saw must not mistake it for the old one."""
    metadata_file = location / "metadata"
    document = json.loads(metadata_file.read_text())
    document["id"] = str(uuid.uuid4())
    metadata_file.write_text(json.dumps(document))
