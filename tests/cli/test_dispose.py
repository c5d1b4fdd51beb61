"""`spark-checkpoint savepoint --dispose` while no run of the job runs (Flink's
`savepoint --dispose`): the savepoint leaves the registry, then its files leave storage.
Through a run: tests/cli/test_control_protocol.py."""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from spark_checkpoint.storage import CheckpointKind, CheckpointStorage, StorageAccessError
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.local_runtime import load_record
from spark_checkpoint_operator.local_state import local_job_paths, local_owner

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]
NAMESPACE, JOB = "analytics", "clicks"  # the `job` fixture's
MINIMAL = Path(__file__).parent.parent / "manifest" / "fixtures" / "minimal-job.yaml"


@pytest.fixture
def manifest(job: Job, tmp_path: Path) -> Path:
    """The job's manifest, its storage the job's; its registry lists checkpoints 1 and 2
    and savepoint 3 (batch 1, as checkpoint 2)."""
    document = yaml.safe_load(MINIMAL.read_text())
    document["metadata"] = {"name": JOB, "namespace": NAMESPACE}
    document["spec"]["checkpointing"] = {"storage": job.root}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    job.write_registry(checkpoints=[1, 2], savepoints=[3])
    return path


def _registered_savepoints(job: Job) -> list[int]:
    record = load_record(local_job_paths(job.state_dir, NAMESPACE, JOB))
    return [s.checkpoint_id for s in record.coordinator.savepoints]


def _sp3(job: Job) -> Path:
    return Path(job.storage.layout.savepoint_dir(3))


@pytest.mark.parametrize("named", ["savepoint:3", "path", "metadata path", "file URI"])
def test_a_savepoint_leaves_the_registry_and_storage(
    job: Job, manifest: Path, cli: Cli, named: str
) -> None:
    directory = _sp3(job)
    choice = {
        "savepoint:3": "savepoint:3",
        "path": str(directory),
        "metadata path": str(directory / "_metadata"),
        "file URI": directory.as_uri(),
    }[named]

    result = cli("savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", choice)

    assert (result.code, result.err) == (ExitCode.OK, "")
    assert result.out == (
        f"savepoint 3 disposed of: no longer registered, its files deleted "
        f"({job.storage.layout.savepoint_dir(3)})\n"
    )
    assert _registered_savepoints(job) == []
    assert not directory.exists()
    # What a run reads next: no discard left due, the checkpoints as they were.
    record = load_record(local_job_paths(job.state_dir, NAMESPACE, JOB))
    assert record.discards_due == []
    assert [c.checkpoint_id for c in record.coordinator.checkpoints] == [1, 2]


def test_a_savepoint_deleted_by_hand_is_disposed_of_from_the_registry(
    job: Job, manifest: Path, cli: Cli
) -> None:
    """It stayed registered for ever (`verify` failed on it each time: a newcomer's)."""
    shutil.rmtree(_sp3(job))

    result = cli(
        "savepoint",
        "-f",
        str(manifest),
        "--state-dir",
        str(job.state_dir),
        "--dispose",
        "savepoint:3",
    )

    assert result.code == ExitCode.OK, result.err
    assert result.out.startswith(
        "savepoint 3 disposed of: no longer registered, its files were gone already"
    )
    assert _registered_savepoints(job) == []


@pytest.mark.parametrize(
    ("choice", "said"),
    [
        *(
            (
                choice,
                "only savepoints are disposed of: retention deletes checkpoints "
                "(spec.checkpointing.retained)",
            )
            for choice in ("checkpoint:2", "chk-2")  # `chk-2`: the directory's name alone
        ),
        ("savepoint:7", "savepoint 7 is not in the job's registry"),
    ],
)
def test_what_is_not_the_jobs_registered_savepoint_is_refused(
    job: Job, manifest: Path, cli: Cli, choice: str, said: str
) -> None:
    result = cli("savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", choice)

    assert result.code == ExitCode.FAILED
    assert result.err.startswith(f"spark-checkpoint savepoint: not disposed of: {said}")
    assert _registered_savepoints(job) == [3]
    assert _sp3(job).is_dir()


def test_a_job_that_never_ran_here_is_told_so(
    job: Job, manifest: Path, cli: Cli, tmp_path: Path
) -> None:
    """It said "cannot open the lock .../run.lock: No such file or directory" (an
    outside-in tester's)."""
    elsewhere = tmp_path / "other-state"

    result = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(elsewhere), "-d", "savepoint:3"
    )

    assert result.code == ExitCode.FAILED
    assert result.err == (
        f"spark-checkpoint savepoint: not disposed of: job {NAMESPACE}/{JOB} has no state in "
        f"{elsewhere}: it has not run with this state directory (--state-dir), so no "
        "savepoint of it is registered here\n"
    )
    assert not elsewhere.exists()
    assert _sp3(job).is_dir()


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["-d", "savepoint:x"], "'savepoint:x' is not savepoint:N with N an id"),
        (["-d", ""], "argument --dispose/-d: is empty: give savepoint:N or a savepoint's path ("),
        (["--detached", "-d", "savepoint:3"], "not allowed with argument --detached"),
    ],
)
def test_a_dispose_asked_wrongly_is_a_usage_error_before_anything_is_read(
    job: Job, manifest: Path, cli: Cli, arguments: list[str], said: str
) -> None:
    """A disposal is done or refused at once: --detached has nothing to detach from (it was
    ignored)."""
    result = cli("savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), *arguments)

    assert result.code == ExitCode.USAGE
    assert said in result.err
    assert _registered_savepoints(job) == [3]


def test_another_jobs_savepoint_by_path_is_refused(
    job: Job, manifest: Path, cli: Cli, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "other" / NAMESPACE / "other-job" / "savepoints" / "sp-3"
    shutil.copytree(_sp3(job), elsewhere)

    result = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", str(elsewhere)
    )

    assert result.code == ExitCode.FAILED
    assert result.err == (
        f"spark-checkpoint savepoint: not disposed of: {elsewhere} is not in the job's storage "
        f"({job.storage.layout.job_root}): only the job's own savepoints are disposed of here\n"
    )
    assert elsewhere.is_dir() and _registered_savepoints(job) == [3]


def test_the_newest_image_is_kept_when_it_is_a_savepoint(
    job: Job, manifest: Path, cli: Cli, snapshot_writer: Callable[..., object]
) -> None:
    """A stop-with-savepoint's sinks committed up to its batch: the next run would restore
    an older image, behind the output."""
    snapshot_writer(
        job.storage,
        job.spark_dir,
        kind=CheckpointKind.SAVEPOINT,
        snapshot_id=4,
        batch_id=5,
        files={"offsets/5": b"{}"},
    )
    job.write_registry(checkpoints=[1, 2], savepoints=[3, 4])
    # write_registry records batch 0 for every image: the savepoint's batch is its own.
    document = json.loads(job.status_file.read_text())
    [_, newest] = document["status"]["coordinator"]["savepoints"]
    newest["batchId"] = 5
    job.status_file.write_text(json.dumps(document))

    result = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", "savepoint:4"
    )

    assert result.code == ExitCode.DECLINED, result.err
    assert result.err == (
        "spark-checkpoint savepoint: not disposed of: savepoint 4 is the job's newest image "
        "(batch 5): the output may be committed up to its batch, and every other image is "
        "older; run the job until a newer checkpoint completes\n"
    )
    assert _registered_savepoints(job) == [3, 4]


def test_images_deleted_by_hand_do_not_count_as_images_a_restore_takes(
    job: Job, manifest: Path, cli: Cli
) -> None:
    """The rule that keeps the job's newest image counted registered checkpoints whose
    files were deleted by hand: the last image a restore could take was disposed of (a
    reviewer's)."""
    for checkpoint_id in (1, 2):
        shutil.rmtree(job.storage.layout.checkpoint_dir(checkpoint_id))

    result = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", "savepoint:3"
    )

    assert result.code == ExitCode.DECLINED, result.err
    assert result.err == (
        "spark-checkpoint savepoint: not disposed of: savepoint 3 is the only image the job "
        "can restore from: run the job until a checkpoint completes (checkpoint 1, "
        "checkpoint 2: registered, but not in storage)\n"
    )
    assert _registered_savepoints(job) == [3]
    assert (_sp3(job) / "_metadata").is_file()
    # Said only where the absence decided it.
    unknown = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", "savepoint:7"
    )
    assert unknown.err == (
        "spark-checkpoint savepoint: not disposed of: savepoint 7 is not in the job's registry\n"
    )


def test_a_savepoint_behind_a_link_is_refused_before_it_leaves_the_registry(
    job: Job, manifest: Path, cli: Cli, tmp_path: Path
) -> None:
    """The delete refused the link only after the registry had let the savepoint go:
    `run --from savepoint:3` no longer took it, and every later try met the same link (a
    reviewer's)."""
    elsewhere = tmp_path / "elsewhere"
    shutil.move(_sp3(job), elsewhere)
    _sp3(job).symlink_to(elsewhere)

    result = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", "savepoint:3"
    )

    assert result.code == ExitCode.FAILED, result.err
    assert result.err.startswith(f"spark-checkpoint savepoint: not disposed of: {_sp3(job)}")
    assert "symbolic link" in result.err
    assert result.err.count("\n") == 1
    assert _registered_savepoints(job) == [3]
    record = load_record(local_job_paths(job.state_dir, NAMESPACE, JOB))
    assert record.discards_due == []
    assert (elsewhere / "_metadata").is_file()


def test_the_default_storage_is_not_called_a_field_the_manifest_does_not_have(
    job: Job, manifest: Path, cli: Cli, tmp_path: Path
) -> None:
    """Without spec.checkpointing.storage, a refusal of the state directory's default
    storage named that field (`list` and `inspect` say "storage"; a reviewer's)."""
    document = yaml.safe_load(MINIMAL.read_text())
    document["metadata"] = {"name": JOB, "namespace": NAMESPACE}
    without_storage = tmp_path / "default-storage.yaml"
    without_storage.write_text(yaml.safe_dump(document))
    default_storage = local_job_paths(job.state_dir, NAMESPACE, JOB).default_storage
    job_dir = Path(default_storage.removeprefix("file://")) / NAMESPACE / JOB
    job_dir.parent.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    job_dir.symlink_to(tmp_path / "elsewhere")

    result = cli(
        "savepoint",
        "-f",
        str(without_storage),
        "--state-dir",
        str(job.state_dir),
        "-d",
        "savepoint:3",
    )

    assert result.code == ExitCode.FAILED, result.err
    assert result.err.startswith(
        f"spark-checkpoint savepoint: not disposed of: storage {default_storage!r}: "
    ), result.err
    assert "symbolic link" in result.err
    assert _registered_savepoints(job) == [3]


def test_the_only_image_is_kept_unless_the_job_has_finished(
    job: Job, manifest: Path, cli: Cli
) -> None:
    """A Finished job is not run again (its end discarded its checkpoints): its last
    savepoint was kept with "run the job until a checkpoint completes", which `run`
    refuses for a Finished job (a newcomer's)."""
    dispose = ("savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d")
    job.write_registry(checkpoints=[], savepoints=[3])

    kept = cli(*dispose, "savepoint:3")

    assert kept.code == ExitCode.DECLINED, kept.err
    assert "savepoint 3 is the only image the job can restore from" in kept.err
    job.write_registry(checkpoints=[], savepoints=[3], finished=True)

    disposed = cli(*dispose, "savepoint:3")

    assert disposed.code == ExitCode.OK, disposed.err
    assert _registered_savepoints(job) == []
    assert not _sp3(job).exists()


def test_storage_other_than_the_registrys_is_refused_before_anything_changes(
    job: Job, manifest: Path, cli: Cli
) -> None:
    """`--job` without the manifest names the state directory's default storage: the
    savepoint left the registry and its files stayed where they were, for ever (a
    reviewer's)."""
    result = cli(
        "savepoint",
        "--job",
        JOB,
        "-n",
        NAMESPACE,
        "--state-dir",
        str(job.state_dir),
        "-d",
        "savepoint:3",
    )

    assert result.code == ExitCode.FAILED
    assert result.err.startswith(
        "spark-checkpoint savepoint: not disposed of: spec.checkpointing.storage: the job's "
        "checkpoints and savepoints are not in "
    ), result.err
    assert _registered_savepoints(job) == [3]
    assert _sp3(job).is_dir()


@pytest.mark.parametrize("failure", ["disk", "endpoint"])
def test_files_that_cannot_be_deleted_stay_due_and_fail_the_command(
    job: Job, manifest: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """The registry lets the savepoint go first (written ahead, as a run does): files the
    delete fails on (a failing disk, storage that refuses or does not answer) stay due to
    the next run. An object store's endpoint that did not answer was a traceback (an
    object-store review's)."""

    def failing(*_args: object) -> None:
        if failure == "disk":
            raise OSError(errno.EIO, "Input/output error", str(_sp3(job)))
        raise StorageAccessError(str(_sp3(job)), "EndpointConnectionError: no answer")

    monkeypatch.setattr(CheckpointStorage, "discard_savepoint", failing)

    result = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", "savepoint:3"
    )

    assert result.code == ExitCode.FAILED
    assert result.err.startswith(
        "spark-checkpoint savepoint: savepoint 3 is no longer registered, but its files are "
        "not deleted ("
    ), result.err
    assert result.err.endswith("): the next run of the job deletes them, or this command again\n")
    record = load_record(local_job_paths(job.state_dir, NAMESPACE, JOB))
    assert [s.checkpoint_id for s in record.coordinator.savepoints] == []
    assert [(d.kind, d.checkpoint_id) for d in record.discards_due] == [
        (CheckpointKind.SAVEPOINT, 3)
    ]
    assert _sp3(job).is_dir()

    # Asked again once storage answers, it deletes them (it said "not in the job's
    # registry", with no word of the delete due).
    monkeypatch.undo()
    again = cli(
        "savepoint", "-f", str(manifest), "--state-dir", str(job.state_dir), "-d", "savepoint:3"
    )
    assert again.code == ExitCode.OK, again.err
    assert again.out.startswith("savepoint 3 disposed of: no longer registered, its files deleted")
    assert load_record(local_job_paths(job.state_dir, NAMESPACE, JOB)).discards_due == []
    assert not _sp3(job).exists()


def test_a_copy_of_the_state_directory_disposes_of_nothing(
    job: Job, manifest: Path, cli: Cli, tmp_path: Path
) -> None:
    """Its registry lists the original's savepoints, which the original would restore from
    (as `run`, refused while the original keeps the registry)."""
    local_owner(local_job_paths(job.state_dir, NAMESPACE, JOB), own_storage=False)
    copy = tmp_path / "copy"
    shutil.copytree(job.state_dir, copy)

    result = cli("savepoint", "-f", str(manifest), "--state-dir", str(copy), "-d", "savepoint:3")

    assert result.code == ExitCode.FAILED
    assert result.err.startswith(
        f"spark-checkpoint savepoint: not disposed of: {copy / NAMESPACE / JOB} is a copy of "
        f"the state directory {job.state_dir / NAMESPACE / JOB}, whose registry of the job's "
        "snapshots it lists: "
    ), result.err
    assert _sp3(job).is_dir()
    copied = load_record(local_job_paths(copy, NAMESPACE, JOB))
    assert [s.checkpoint_id for s in copied.coordinator.savepoints] == [3]
