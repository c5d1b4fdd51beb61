"""`spark-checkpoint run` restored again and again across the file source log's compactions.

Spark's file source log compacts every ``compactInterval`` batches and derives that
interval, at each query start, from the ``.compact`` files it finds. The driver is killed
(SIGKILL) right after a checkpoint at chosen batches, so each attempt restores an image
taken by an attempt that was itself restored: an image that gives Spark the wrong
interval restores once, and the restore after it dies on a compaction that was never
written. The committed output is compared with counts computed without Spark.
"""

from pathlib import Path

import pytest
from e2e.test_local_runs import ROCKSDB

from helpers.job_run import JobRun

pytestmark = pytest.mark.spark

INTERVAL = 3  # compactions at batches 2, 5, 8, 11, 14, 17, 20
PROVIDERS = {
    "hdfs": {},
    "rocksdb-changelog": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    },
}
STATE_FILES = {"hdfs": "*.delta", "rocksdb-changelog": "*.changelog"}
# Kill right after a checkpoint at these batches. 5 = 2I-1: a single 5.compact would make
# Spark guess interval 6; 14 = 5I-1: a compaction of the interval the job uses but not of
# a run with interval 6; 18: one batch past compaction 17.
KILLED_AFTER = (5, 14, 18)
LAST_BATCH = 21


def _checkpoint_at(run: JobRun, batch_id: int) -> int:
    """Wait for a checkpoint of ``batch_id`` (the query is idle there: its input is used up)
    and return its id."""
    while True:
        done = run.wait_for_line(r"checkpoint (\d+) complete(?: \([^)]*\))?: batch (\d+)")
        if int(done[2]) == batch_id:
            return int(done[1])
        assert int(done[2]) < batch_id, f"the query ran past batch {batch_id}: {done[0]}"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_exactly_once_over_restores_that_straddle_compactions(
    tmp_path: Path, provider: str
) -> None:
    run = JobRun(
        tmp_path / "job",
        bounded=False,
        checkpointing={"interval": "1s", "minPause": "0s"},
        restart_policy={"maxRetries": len(KILLED_AFTER) + 1},
        spark_conf={
            "spark.sql.streaming.fileSource.log.compactInterval": str(INTERVAL),
            **PROVIDERS[provider],
        },
    )
    files = 0
    for attempt, batch_id in enumerate(KILLED_AFTER, start=1):
        run.add_input(files=batch_id + 1 - files, start_index=files, lines=20)
        files = batch_id + 1
        if attempt == 1:
            run.start()
        checkpoint = _checkpoint_at(run, batch_id)
        run.kill_driver()
        run.wait_for_line(rf"starting driver attempt {attempt + 1}, restoring from checkpoint:")
        # That one, or a later checkpoint of the same idle batch completed before the kill
        # landed (a loaded CI machine: 6 after 5, both of batch 5).
        restored = run.wait_for_line(r"restored from checkpoint:(\d+)\b")
        assert int(restored[1]) >= checkpoint, restored[0]

    run.add_input(files=LAST_BATCH + 1 - files, start_index=files, lines=20)
    _checkpoint_at(run, LAST_BATCH)
    # The restored attempt's live location, while it runs: the provider's own files.
    [live] = (tmp_path / "job/state/default/wordcount/work").glob("attempt-*/checkpoint/state/0/0")
    assert live.parts[-5] == f"attempt-{len(KILLED_AFTER) + 1}"
    assert list(live.glob(STATE_FILES[provider])), f"the run did use {provider}"
    run.interrupt()
    run.wait_for_line(r"savepoint \d+ complete")
    assert run.wait() == 0, "\n".join(run.lines)
    status = run.status()["status"]
    assert status["phase"] == "Suspended"
    assert status["counts"]["restored"] == len(KILLED_AFTER)
    assert run.output_counts() == run.expected_counts()
    assert run.committed_batches() == list(range(LAST_BATCH + 1))
