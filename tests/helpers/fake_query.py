"""A driver for `spark-checkpoint run` without Spark: the real `run_coordinated` (restore,
agent, exit codes) around a stand-in streaming query that commits a batch every
``BATCH_SECONDS`` into its checkpoint location, in the layout Spark writes (offsets,
commits, sources, a state store partition). For tests of the local run's control flow:
the images it makes are real and restore, in a second instead of Spark's minutes."""

import atexit
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from spark_checkpoint import driver
from spark_checkpoint.agent.snapshot import committed_batches
from spark_checkpoint.driver import run_coordinated

BATCH_SECONDS = 0.2
ROWS_PER_BATCH = 10
RECENT_PROGRESS = 100  # Spark's spark.sql.streaming.numRecentProgressUpdates
# Set: the input is bounded, and the query finishes once it committed this many batches
# (in this driver), as a query with trigger availableNow does.
BATCHES_VARIABLE = "FAKE_QUERY_BATCHES"
# Set: the input holds this many batches in all, as a file source's does: a query restored
# at its last batch commits none and finishes at once.
INPUT_BATCHES_VARIABLE = "FAKE_INPUT_BATCHES"
# Set: the driver's restore of an image takes this many seconds longer, as a large one's.
RESTORE_SECONDS_VARIABLE = "FAKE_RESTORE_SECONDS"
# Set: the query fails at once with this error, as Spark reports one: the error, then
# its description of the query (kilobytes of plan); the driver then logs on as it ends.
FAILURE_VARIABLE = "FAKE_QUERY_FAILURE"
PLAN_LINES = 120
SHUTDOWN_LINES = 120


class FakeQueryFailure(Exception):
    """A StreamingQueryException's text: Spark's error (the query's ids, a new runId in
    each attempt, then the cause with an executor's stack frames), then the query it ended
    (kilobytes of plan)."""

    def __init__(self, error: str) -> None:
        frames = "\n".join(
            f"\tat org.apache.spark.util.SparkErrorUtils.tryWithSafeFinally(Utils.scala:{i})"
            for i in range(30)
        )
        plan = "\n".join(f"   +- Project [k#{i}, error_count#{i}]" for i in range(PLAN_LINES))
        super().__init__(
            f"[STREAM_FAILED] Query [id = 5c0d6f5e-1bd4-4f0c-9a51-0f2f5d3c8e11, runId = "
            f"{uuid.uuid4()}] terminated with exception: Job aborted due to stage failure: "
            f"Task 0 in stage 1.0 failed 1 times, most recent failure: Lost task 0.0 in stage "
            f"1.0 (TID 1) (10.0.0.5 executor driver): {error}\n{frames}\n"
            f"=== Streaming Query ===\nIdentifier: [id = 1]\n\nCurrent State: ACTIVE\n{plan}"
        )


def reported_failure(error: str) -> str:
    """A pattern of the error line a driver reports for `FakeQueryFailure` (`error`)."""
    return (
        r"query failed: \[STREAM_FAILED\] Query \[id = 5c0d6f5e-1bd4-4f0c-9a51-0f2f5d3c8e11, "
        r"runId = [0-9a-f-]{36}\] terminated with exception: Job aborted due to stage "
        r"failure: Task 0 in stage 1\.0 failed 1 times, most recent failure: Lost task 0\.0 "
        r"in stage 1\.0 \(TID 1\) \(10\.0\.0\.5 executor driver\): " + re.escape(error)
    )


class FakeQuery:
    def __init__(self, location: Path) -> None:
        self._location = location
        self._stopped = threading.Event()
        metadata = location / "metadata"
        if not metadata.exists():  # a restored location has its query's
            location.mkdir(parents=True, exist_ok=True)
            metadata.write_text(json.dumps({"id": str(uuid.uuid4())}))
        committed = committed_batches(location)
        self._batch = committed[-1] + 1 if committed else 0
        self.recentProgress: list[dict[str, Any]] = []
        self._committed = 0  # batches this query committed
        self._failure = os.environ.get(FAILURE_VARIABLE)
        self._input_batches = int(os.environ.get(INPUT_BATCHES_VARIABLE, "-1"))
        if self._failure is not None or self._input_done():
            self._stopped.set()
            return
        # A first batch at once, as a query with input: the agent's first status lists
        # every snapshot task, so a savepoint is not declined for a task still missing.
        self._commit_batch()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        bounded = os.environ.get(BATCHES_VARIABLE)
        while not self._stopped.wait(BATCH_SECONDS):
            if (bounded is not None and self._committed >= int(bounded)) or self._input_done():
                self._stopped.set()  # finished: the input is done
                return
            self._commit_batch()

    def _input_done(self) -> bool:
        return 0 <= self._input_batches <= self._batch

    def _commit_batch(self) -> None:
        b = self._batch
        files = {
            f"offsets/{b}": f"offsets {b}",
            f"sources/0/{b}": f"source {b}",
            f"state/0/0/{b + 1}.delta": f"state {b + 1}",
            f"commits/{b}": f"commit {b}",  # last: the batch is committed
        }
        for relative, text in files.items():
            (self._location / relative).parent.mkdir(parents=True, exist_ok=True)
            (self._location / relative).write_text(text)
        # The fields of Spark's StreamingQueryProgress the agent reports.
        progress = {
            "timestamp": datetime.now(UTC).isoformat(timespec="microseconds"),
            "batchId": b,
            "numInputRows": ROWS_PER_BATCH,
            "inputRowsPerSecond": ROWS_PER_BATCH / BATCH_SECONDS,
        }
        self.recentProgress = [*self.recentProgress, progress][-RECENT_PROGRESS:]
        self._batch += 1
        self._committed += 1

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self.recentProgress[-1] if self.recentProgress else None

    @property
    def isActive(self) -> bool:
        return not self._stopped.is_set()

    def processAllAvailable(self) -> None:
        # As Spark's, returns once a trigger finds no new data: bounded input has data
        # until it is done (a drain waits for that); other input comes as it likes, none
        # new right after a batch.
        committed = self._committed
        while (self._input_batches >= 0 and not self._input_done()) or self._committed == committed:
            if self._stopped.wait(0.01):
                return

    def awaitTermination(self, timeout: float) -> None:
        self._stopped.wait(timeout)

    def stop(self) -> None:
        self._stopped.set()

    def exception(self) -> FakeQueryFailure | None:
        return None if self._failure is None else FakeQueryFailure(self._failure)


class FakeWriter:
    def __init__(self) -> None:
        self._location = ""

    def option(self, key: str, value: str) -> "FakeWriter":
        assert key == "checkpointLocation"
        self._location = value
        return self

    def start(self) -> FakeQuery:
        return FakeQuery(Path(self._location))


def write_job(directory: Path, *, interval: str) -> Path:
    """``job.yaml`` (job default/probe, checkpoints every ``interval``) in ``directory``,
    with ``driver.py`` running this module's query; returns the manifest."""
    tests = Path(__file__).resolve().parents[1]
    (directory / "driver.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tests)!r})\n"
        "from helpers.fake_query import main\nmain()\n"
    )
    manifest = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {
            "application": {"mainFile": "driver.py"},
            "checkpointing": {"interval": interval},
            "restartPolicy": {"backoff": "100ms"},
        },
    }
    (directory / "job.yaml").write_text(yaml.safe_dump(manifest))
    return directory / "job.yaml"


def run_cli(
    directory: Path, *args: str, environment: dict[str, str]
) -> "subprocess.CompletedProcess[str]":
    """``spark-checkpoint ARGS`` as a process of its own in ``directory``."""
    return subprocess.run(
        [sys.executable, "-m", "spark_checkpoint_operator.cli", *args],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def main() -> None:
    if delay := float(os.environ.get(RESTORE_SECONDS_VARIABLE, "0")):
        restore = driver.restore

        def slow_restore(*args: Any) -> Any:
            time.sleep(delay)
            return restore(*args)

        driver.restore = slow_restore
    if FAILURE_VARIABLE in os.environ:
        # What Spark and py4j log as the process ends, after the error.
        atexit.register(
            lambda: print(
                "\n".join(
                    f"INFO ShutdownHookManager: deleting /tmp/spark-{i}"
                    for i in range(SHUTDOWN_LINES)
                ),
                file=sys.stderr,
            )
        )
    run_coordinated(FakeWriter())  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
