"""`run --from` tells the job's own snapshots from other jobs' (by name or by path,
registered or not): the local runtime withdraws a due discard of the one it restores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from spark_checkpoint.storage import CheckpointKind
from spark_checkpoint_operator import coordinator
from spark_checkpoint_operator.restore_choice import chosen_image

if TYPE_CHECKING:
    from conftest import Job


def test_the_jobs_own_snapshot_is_told_by_name_or_path_registered_or_not(
    job: Job, job_on: Callable[[str], Job], tmp_path: Path
) -> None:
    savepoint_3 = coordinator.CompletedCheckpoint(
        3, coordinator.CheckpointKind.SAVEPOINT, 1, "", 0, 0, 0
    )
    registered = coordinator.PersistedState(next_checkpoint_id=4, savepoints=(savepoint_3,))
    let_go = coordinator.PersistedState(next_checkpoint_id=4)  # retention dropped it
    path = str(job.metadata_file(CheckpointKind.SAVEPOINT, 3).parent)
    own = (CheckpointKind.SAVEPOINT, 3)

    by_name = chosen_image("savepoint:3", registered, job.storage)
    assert (by_name.candidate, by_name.own) == ("savepoint:3", own)
    by_path = chosen_image(path, registered, job.storage)
    assert (by_path.candidate, by_path.own) == ("savepoint:3", own)
    unregistered = chosen_image(path, let_go, job.storage)
    assert unregistered.candidate.startswith("external:file://")
    assert unregistered.own == own

    another_jobs = job_on(str(tmp_path / "elsewhere"))  # the same names, another root
    elsewhere = str(another_jobs.metadata_file(CheckpointKind.SAVEPOINT, 3).parent)
    foreign = chosen_image(elsewhere, registered, job.storage)
    assert foreign.candidate.startswith("external:file://") and foreign.own is None
