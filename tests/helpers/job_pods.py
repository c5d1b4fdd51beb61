"""The pods the operator makes for a job, built as its runtime builds them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_checkpoint.janitor_commands import CollectGarbage
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.manifest.model import JobManifest

CHECKED_IMAGE = "checkpoint:7"


def job_pods(
    manifest: JobManifest,
    document: Mapping[str, Any],
    *,
    storage: str = "s3a://b/c",
    user_ids: objects.UserIds = objects.UserIds.IMAGE,
) -> dict[str, dict[str, Any]]:
    """The job's first driver pod, a cleanup pod (garbage collection) and a check pod (of
    `CHECKED_IMAGE`), by their containers' names."""
    driver = objects.driver_pod(
        manifest,
        document,
        attempt=1,
        storage=storage,
        restore=[],
        deployed_hash="h",
        user_ids=user_ids,
    )
    cleanup = objects.cleanup_pod(
        manifest,
        document,
        storage=storage,
        command=CollectGarbage((), ()),
        user_ids=user_ids,
    )
    check = objects.check_pod(
        manifest, document, storage=storage, image=CHECKED_IMAGE, user_ids=user_ids
    )
    return {"driver": driver, objects.CLEANUP: cleanup, objects.CHECK: check}
