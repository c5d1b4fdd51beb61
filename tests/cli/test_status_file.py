"""A status file the storage commands cannot read is ignored with a one-line warning that
names the file and the field; the listing goes on without the registry. `status` with no
run to ask reads how the last run left the job from it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spark_checkpoint_operator.control_commands import last_run
from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.status import PersistedStatus, StatusFile

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xff\xfe", "cannot read"),
        (b"{", "not JSON"),
        (b"[" * 100_000, "not JSON: nested too deeply"),
        (b'{"status": ' + b"9" * 5000 + b"}", "not JSON: Exceeds the limit"),
        (b"[]", "not an object"),
        (b'{"metadata": ["x"], "driver": [7]}', "status: missing"),
        (b'{"status": []}', "status: expected an object, got a list"),
        (b'{"status": {}}', "status.coordinator: missing"),
        (b'{"status": {"coordinator": []}}', "status.coordinator: not an object"),
        (
            b'{"status": {"coordinator": {"savepoints": {}}}}',
            "status.coordinator.savepoints: not a list",
        ),
        (
            b'{"status": {"coordinator": {"checkpoints": [7]}}}',
            "status.coordinator.checkpoints[0].id",
        ),
        (b'{"status": {"coordinator": {"checkpoints": [{"id": true}]}}}', "got True"),
        (b'{"status": {"coordinator": {"checkpoints": [{"id": -1}]}}}', "got -1"),
    ],
)
def test_an_unreadable_status_file_is_a_warning(
    job: Job, cli: Cli, content: bytes, problem: str
) -> None:
    job.status_file.parent.mkdir(parents=True)
    job.status_file.write_bytes(content)

    result = cli("list", *job.flags)

    assert result.code == 0, result.err
    [warning] = result.err.splitlines()
    assert warning.startswith(f"warning: registry ignored: {job.status_file.resolve()}: ")
    assert problem in warning
    assert "registry: none" in result.out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("place", "problem"),
    [
        (os.mkfifo, "cannot read: is a FIFO, not a regular file"),
        (lambda path: path.symlink_to("/dev/zero"), "is a character device, not a regular file"),
        (lambda path: path.write_bytes(b" " * (65 << 20)), "is larger than 67108864 bytes"),
    ],
    ids=["fifo", "dev-zero", "huge"],
)
@pytest.mark.parametrize("command", ["list", "status"])
def test_a_status_file_that_is_no_file_is_refused_unread(
    job: Job, cli: Cli, place: Callable[[Path], None], problem: str, command: str
) -> None:
    """A FIFO in its place hung `list`, `status` and `run`; a link to /dev/zero had `list`
    and `status` read gigabytes until they were killed (a hostile newcomer's)."""
    job.status_file.parent.mkdir(parents=True)
    place(job.status_file)
    namespace, name = job.status_file.parent.parent.name, job.status_file.parent.name
    flags = ["--namespace", namespace, "--job", name, "--state-dir", str(job.state_dir)]

    result = cli(command, *(job.flags if command == "list" else flags))

    assert problem in result.err, result.err
    assert len(result.err.splitlines()) == 1, result.err


@pytest.mark.parametrize(
    ("phase", "said"),
    [
        (JobPhase.SUSPENDED, "the last run left it Suspended (attempt 3, batch none, "),
        # kill -9 of the run: its status file still says Running.
        (
            JobPhase.RUNNING,
            "the last run ended without recording how (killed?); it last recorded Running "
            "(attempt 3, batch none, ",
        ),
    ],
)
def test_status_with_no_run_says_how_the_last_one_ended(
    tmp_path: Path, phase: JobPhase, said: str
) -> None:
    path = tmp_path / "status.json"
    status = PersistedStatus(phase=phase, job_attempt=3).to_dict()
    StatusFile(path, name="probe", namespace="default", status=status, driver_pid=None).write()

    assert last_run(path).startswith(said), last_run(path)


@pytest.mark.parametrize(
    ("due", "said"),
    [
        ([], "checkpoint 1 (discarded)"),
        # Its delete failed (storage that did not answer): "discarded" while `list` showed
        # it in storage (an Azure user's).
        (
            [{"kind": "checkpoint", "id": 1}],
            "checkpoint 1 (discarded; its files stay in storage until a run of the job "
            "deletes them)",
        ),
    ],
)
def test_status_of_a_finished_job_says_its_last_checkpoint_was_discarded(
    job: Job, cli: Cli, due: list[dict[str, object]], said: str
) -> None:
    """A newcomer's: after a bounded job finished, `status -o yaml` showed its last
    checkpoint with the path '' (retention discarded it as the job finished)."""
    completed = {
        "id": 1,
        "kind": "checkpoint",
        "status": "Completed",
        "triggerTime": "2026-12-03T08:22:17.602992Z",
        "endTime": "2026-12-03T08:22:17.651318Z",
        "batchId": 2,
        "sizeBytes": 7527,
    }
    status = {
        "phase": "Finished",
        "jobAttempt": 1,
        "lastCommittedBatch": 2,
        "coordinator": {
            "nextCheckpointId": 2,
            "checkpoints": [],
            "savepoints": [],
            "history": [completed],
            "completedCount": 1,
            "failedCount": 0,
            "terminated": "Finished",
        },
        "discardsDue": due,
    }
    job.status_file.parent.mkdir(parents=True)
    job.status_file.write_text(json.dumps({"status": status}))
    namespace, name = job.status_file.parent.parent.name, job.status_file.parent.name
    flags = ["--namespace", namespace, "--job", name, "--state-dir", str(job.state_dir)]

    table = cli("status", *flags)
    document = cli("status", *flags, "-o", "json")

    assert table.code == document.code == 3
    assert table.err.endswith(
        f"the last run left it Finished (attempt 1, batch 2, {said}, savepoint none)\n"
    ), table.err
    assert json.loads(document.out)["lastCheckpoint"] == {
        "id": 1,
        "path": None,
        "label": "",
        "discardDue": bool(due),
    }
