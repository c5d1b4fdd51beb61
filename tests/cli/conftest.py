"""Fixtures for the storage commands: a job's real checkpoint storage, written with the
storage package (no Spark), a local status file and a way to run the command line."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    ManifestEntry,
    TaskAcknowledgement,
)
from spark_checkpoint_operator import coordinator
from spark_checkpoint_operator.cli import main
from spark_checkpoint_operator.status import StatusFile, UnrestorableImage, render_status
from spark_checkpoint_operator.supervisor import JobRecord

NAMESPACE = "analytics"
JOB = "clicks"
QUERY_ID = "8f14e45f-ea1c-4e9b-9a6e-0c2b1b2f7d11"
# Old enough for a stable age column ("2d2h") however long the test takes.
COMPLETED_AGO = timedelta(hours=50)

# checkpoint 1 at batch 0, checkpoint 2 at batch 1 (reuses the state file of checkpoint 1),
# savepoint 3 at batch 1 (self-contained copies).
CHECKPOINT_1 = {
    "offsets/0": b'{"batchWatermarkMs":0}\n',
    "commits/0": b'{"nextBatchWatermarkMs":0}\n',
    "state/0/0/1.delta": b"state version 1 of partition 0",
}
CHECKPOINT_2 = {
    "offsets/1": b'{"batchWatermarkMs":1}\n',
    "commits/1": b'{"nextBatchWatermarkMs":1}\n',
    "state/0/0/1.delta": CHECKPOINT_1["state/0/0/1.delta"],
    "state/0/0/2.delta": b"state version 2 of partition 0, a little longer",
}
SAVEPOINT_3 = CHECKPOINT_2


@dataclass(frozen=True)
class Job:
    """The storage of job analytics/clicks under tmp_path, and where its registry goes."""

    storage: CheckpointStorage
    state_dir: Path
    spark_dir: Path

    @property
    def root(self) -> str:
        return self.storage.layout.root

    @property
    def job_root(self) -> Path:
        return Path(self.storage.layout.job_root)

    @property
    def flags(self) -> list[str]:
        """The explicit way to name the job's storage on the command line."""
        return [
            "--storage",
            self.root,
            "--namespace",
            NAMESPACE,
            "--job",
            JOB,
            "--state-dir",
            str(self.state_dir),
        ]

    @property
    def status_file(self) -> Path:
        return self.state_dir / NAMESPACE / JOB / "status.json"

    def metadata_file(self, kind: CheckpointKind, snapshot_id: int) -> Path:
        return Path(self.storage.layout.metadata_path(kind, snapshot_id))

    def stored_file(self, kind: CheckpointKind, snapshot_id: int, path: str) -> Path:
        """Where the bytes of the Spark file ``path`` of a snapshot are stored."""
        meta = self.storage.read_metadata(kind, snapshot_id)
        entry = next(e for e in meta.files if e.path == path)
        return Path(self.storage.layout.location_path(entry.location))

    def write_registry(
        self,
        checkpoints: Iterable[int],
        savepoints: Iterable[int],
        unrestorable: Iterable[str] = (),
        *,
        finished: bool = False,
        labels: Mapping[int, str] | None = None,
    ) -> None:
        """A status file as `spark-checkpoint run` writes it, registering these snapshots;
        a restored query failed on the `unrestorable` ones (``checkpoint:N``); the job
        Running, or Finished."""

        def registered(
            kind: coordinator.CheckpointKind, ids: Iterable[int]
        ) -> tuple[coordinator.CompletedCheckpoint, ...]:
            return tuple(
                coordinator.CompletedCheckpoint(
                    i,
                    kind,
                    0,
                    self.storage.layout.metadata_path(kind, i),
                    0,
                    0,
                    0,
                    label=(labels or {}).get(i, ""),
                )
                for i in ids
            )

        checkpoints, savepoints = tuple(checkpoints), tuple(savepoints)
        state = coordinator.PersistedState(
            next_checkpoint_id=max([*checkpoints, *savepoints, 0]) + 1,
            checkpoints=registered(coordinator.CheckpointKind.CHECKPOINT, checkpoints),
            savepoints=registered(coordinator.CheckpointKind.SAVEPOINT, savepoints),
            terminated=coordinator.TerminalOutcome.FINISHED if finished else None,
        )
        phase = coordinator.JobPhase.FINISHED if finished else coordinator.JobPhase.RUNNING
        record = JobRecord(phase=phase, coordinator=state)
        record.unrestorable = [
            UnrestorableImage(image, "its restored query failed in attempt 2", 2)
            for image in unrestorable
        ]
        status = render_status(record, now=time.time())
        self.status_file.parent.mkdir(parents=True, exist_ok=True)
        StatusFile(self.status_file, JOB, NAMESPACE, status, driver_pid=None).write()


def _spark_file(spark_dir: Path, path: str, content: bytes) -> str:
    local = spark_dir / path
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(content)
    return str(local)


def _metadata(
    layout: JobStorageLayout,
    kind: CheckpointKind,
    snapshot_id: int,
    batch_id: int,
    entries: list[ManifestEntry],
) -> CheckpointMetadata:
    completion = datetime.now(UTC) - COMPLETED_AGO
    logs = [e for e in entries if not e.path.startswith("state/")]
    state = [e for e in entries if e.path.startswith("state/")]
    return CheckpointMetadata(
        namespace=layout.namespace,
        job=layout.job,
        checkpoint_id=snapshot_id,
        kind=kind,
        batch_id=batch_id,
        query_id=QUERY_ID,
        trigger_time=completion - timedelta(milliseconds=2250),
        completion_time=completion,
        acknowledgements=tuple(
            TaskAcknowledgement(
                task=task,
                files=tuple(e.path for e in task_entries),
                bytes=sum(e.size for e in task_entries),
                duration_ms=duration,
            )
            for task, task_entries, duration in (("logs", logs, 12), ("state-0-0", state, 30))
        ),
        files=tuple(entries),
        total_bytes=sum(e.size for e in entries),
        properties={"attempt": "1"},
    )


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return write_job(str(tmp_path / "storage"), tmp_path)


@pytest.fixture
def job_on(tmp_path: Path) -> Callable[[str], Job]:
    """Writes the job's snapshots on another storage root (a URI) and returns it."""
    return lambda root: write_job(root, tmp_path)


def write_snapshot(
    storage: CheckpointStorage,
    spark_dir: Path,
    *,
    kind: CheckpointKind,
    snapshot_id: int,
    batch_id: int,
    files: Mapping[str, bytes],
) -> CheckpointMetadata:
    """A checkpoint (its files shared, as incremental checkpoints store them) or a savepoint
    (self-contained) of the Spark files ``files``, written as the agent writes it."""
    entries = [
        storage.add_shared_file(_spark_file(spark_dir, path, content), path)
        if kind is CheckpointKind.CHECKPOINT
        else storage.add_savepoint_file(snapshot_id, _spark_file(spark_dir, path, content), path)
        for path, content in files.items()
    ]
    meta = _metadata(storage.layout, kind, snapshot_id, batch_id, entries)
    storage.write_metadata(meta)
    return meta


def write_job(root: str, tmp_path: Path) -> Job:
    """Checkpoints 1 and 2 and savepoint 3 on the storage root `root`, written as the agent
    writes them; the live location and the state directory are below `tmp_path`."""
    storage = CheckpointStorage(JobStorageLayout(root, NAMESPACE, JOB))
    spark_dir = tmp_path / "spark"
    for kind, snapshot_id, batch_id, files in (
        (CheckpointKind.CHECKPOINT, 1, 0, CHECKPOINT_1),
        (CheckpointKind.CHECKPOINT, 2, 1, CHECKPOINT_2),
        (CheckpointKind.SAVEPOINT, 3, 1, SAVEPOINT_3),
    ):
        write_snapshot(
            storage, spark_dir, kind=kind, snapshot_id=snapshot_id, batch_id=batch_id, files=files
        )
    return Job(storage, tmp_path / "state", spark_dir)


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Runs ``spark-checkpoint ARGS`` in-process (a process start costs a second or more on
    a loaded machine); returns exit code, stdout and stderr."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as end:  # --help, --version, usage errors
            code = int(end.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


CONSOLE_SCRIPT = Path(sys.executable).parent / "spark-checkpoint"


@pytest.fixture
def console() -> Callable[..., Result]:
    """Runs the installed console script ``spark-checkpoint ARGS`` (keyword ``cwd``) in a
    process of its own, as a user does. Stateless: hypothesis examples may share it."""
    return run_console


@pytest.fixture
def console_script() -> Path:
    """The installed console script, for a test that runs it in a shell pipeline."""
    return CONSOLE_SCRIPT


@pytest.fixture
def snapshot_writer() -> Callable[..., CheckpointMetadata]:
    """`write_snapshot`, for tests (hypothesis' among them) that draw their own snapshots."""
    return write_snapshot


def run_console(*args: str, cwd: Path | None = None) -> Result:
    completed = subprocess.run(
        [str(CONSOLE_SCRIPT), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Result(completed.returncode, completed.stdout, completed.stderr)
