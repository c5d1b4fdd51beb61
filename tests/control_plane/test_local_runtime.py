"""Local runtime safeguards: never two drivers of one job, never two runs of one job."""

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from helpers.fake_query import (
    FAILURE_VARIABLE,
    reported_failure,
    run_cli,
    write_job,
)
from helpers.objectstore import AzureServer
from helpers.script_job import FINISH, ScriptJob, alive, wait_for_file, wait_until_gone
from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout
from spark_checkpoint_operator import detached_run, local_runtime
from spark_checkpoint_operator.cli import main
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CompletedCheckpoint,
    PersistedState,
)
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.local_runtime import (
    LocalJanitor,
    RunRefused,
    _checked_images,
    _stop_leftover_driver,
    check_storage_unchanged,
    job_lock,
    local_spark_conf,
    storage_lock,
)
from spark_checkpoint_operator.local_state import LocalPaths, local_job_paths, run_lock_holder
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.manifest.model import Application, JobManifest
from spark_checkpoint_operator.status import UnrestorableImage
from spark_checkpoint_operator.supervisor import CleanupFailed, JobRecord


def _fake_driver(work_dir: Path) -> subprocess.Popen[bytes]:
    environment = dict(os.environ, SPARK_CHECKPOINT_WORK_DIR=str(work_dir))
    process = subprocess.Popen(["sleep", "600"], env=environment, start_new_session=True)
    # Until it has exec'd, the child shows its parent's environment, not its own.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
        assert time.monotonic() < deadline, "the fake driver never started"
        time.sleep(0.01)
    return process


def _record(paths: LocalPaths, pid: int) -> None:
    paths.job_dir.mkdir(parents=True)
    paths.status_file.write_text(json.dumps({"driver": {"pid": pid}}))


def test_what_a_left_over_driver_left_in_its_group_is_stopped(tmp_path: Path) -> None:
    """The driver (its group's leader) is gone, its JVM still runs: it was left running
    beside the next driver (a reviewer's)."""
    paths = LocalPaths(tmp_path / "default" / "job")
    environment = dict(os.environ, SPARK_CHECKPOINT_WORK_DIR=str(paths.work_dir))
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 600 & echo $!"],
        env=environment,
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert leader.stdout is not None
    jvm = int(leader.stdout.readline())
    assert leader.wait(timeout=10) == 0
    _record(paths, leader.pid)
    reports: list[str] = []
    try:
        _stop_leftover_driver(paths, reports.append)

        wait_until_gone(jvm)  # the driver's group is not left running
        assert reports == [f"stopped driver {leader.pid} left over from an earlier run"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(jvm, signal.SIGKILL)


def test_a_driver_left_over_from_a_killed_run_is_stopped(tmp_path: Path) -> None:
    paths = LocalPaths(tmp_path / "default" / "job")
    leftover = _fake_driver(paths.work_dir)
    _record(paths, leftover.pid)
    reports: list[str] = []
    _stop_leftover_driver(paths, reports.append)
    assert leftover.wait(timeout=10) == -9
    assert reports == [f"stopped driver {leftover.pid} left over from an earlier run"]


def test_a_reused_pid_of_another_process_is_left_alone(tmp_path: Path) -> None:
    paths = LocalPaths(tmp_path / "default" / "job")
    stranger = _fake_driver(tmp_path / "another-job" / "work")
    _record(paths, stranger.pid)
    try:
        _stop_leftover_driver(paths, print)
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


SLEEPING_DRIVER = """
    import os, pathlib, time
    pathlib.Path("driver.pid").write_text(str(os.getpid()))
    time.sleep(600)
"""


def test_a_second_run_of_a_running_job_is_refused_and_leaves_the_first_alone(
    tmp_path: Path,
) -> None:
    job = ScriptJob(tmp_path, SLEEPING_DRIVER)
    first = job.start()
    try:
        driver = int(wait_for_file(tmp_path / "driver.pid"))
        second = job.run(timeout=20)
        assert second.returncode == 1
        assert second.stderr.splitlines() == [
            f"spark-checkpoint run: job default/probe is already running (pid {first.pid}, "
            f"lock {job.job_dir.resolve() / 'run.lock'}): stop that run first"
        ]
        assert alive(driver), "the first run's driver was killed"
        assert first.poll() is None
    finally:
        first.kill()
        first.communicate()
    # The lock goes with its holder: the next run starts (and stops the orphaned driver).
    wait_until_gone(driver)
    (tmp_path / "driver.pid").unlink()
    third = job.start()
    try:
        wait_for_file(tmp_path / "driver.pid")
        assert int((tmp_path / "driver.pid").read_text()) != driver
    finally:
        third.kill()
        third.communicate()


def test_a_run_of_the_job_from_another_state_directory_is_refused_its_storage(
    tmp_path: Path,
) -> None:
    """Two copies of a manifest naming one storage: one writer per job's storage."""
    storage = tmp_path / "storage"
    job = ScriptJob(tmp_path / "here", SLEEPING_DRIVER, storage=storage.as_uri())
    first = job.start()
    try:
        driver = int(wait_for_file(job.directory / "driver.pid"))
        copy = ScriptJob(tmp_path / "there", SLEEPING_DRIVER, storage=storage.as_uri())
        second = copy.run(timeout=20)
        assert second.returncode == 1
        job_storage = storage / "default" / "probe"
        assert second.stderr.splitlines() == [
            f"spark-checkpoint run: job default/probe's storage {job_storage} is in use by "
            f"another run (pid {first.pid}, lock {job_storage / 'writer.lock'}): stop that run, "
            "or give this one another spec.checkpointing.storage"
        ]
        assert not (copy.directory / "driver.pid").exists(), "the second run started a driver"
        assert alive(driver)
    finally:
        first.kill()
        first.communicate()
    wait_until_gone(driver)
    # Nor after it: each state directory is a registry of the job's snapshots, and the
    # copy's would delete the first one's checkpoints as garbage.
    (job_storage / "chk-1").mkdir()
    (job_storage / "chk-1" / "_metadata").write_text("the first run's")
    third = copy.run(timeout=20)
    assert third.returncode == 1
    owner_file = job_storage / "owner.json"
    assert third.stderr.splitlines() == [
        f"spark-checkpoint run: {owner_file.as_uri()}: this job's storage belongs to the state "
        f"directory {job.job_dir} (registry {_registry(job)}), not to the state directory "
        f"{copy.job_dir} (registry {_registry(copy)}), whose garbage collection would delete "
        "the other's checkpoints: run the job from the registry that owns it, or give this "
        "one another spec.checkpointing.storage (spec.restore.initialSavepointPath can start "
        f"it from a savepoint there); to hand the storage over, delete {owner_file} (the "
        "checkpoints the other registry lists are then deleted as garbage; its savepoints "
        "stay)"
    ]
    assert not (copy.directory / "driver.pid").exists(), "the copy started a driver"
    (job.directory / "driver.pid").unlink()
    again = job.start()  # its own registry runs on it
    try:
        wait_for_file(job.directory / "driver.pid")
    finally:
        again.kill()
        again.communicate()
    owner_file.unlink()  # handed over, as the message says
    fourth = copy.start()
    try:
        wait_for_file(copy.directory / "driver.pid")
    finally:
        fourth.kill()
        fourth.communicate()


def test_a_job_whose_records_were_deleted_is_told_its_storage_has_an_earlier_registry(
    tmp_path: Path,
) -> None:
    """A newcomer's, having deleted the job's records to start afresh: the refusal named
    the same state directory twice, as the owner and as the claimant, and said to run the
    job from the registry that owns it, which was gone."""
    job = ScriptJob(tmp_path, FINISH)
    assert job.run(timeout=60).returncode == 0
    earlier = _registry(job)
    job_storage = job.state_dir / "storage" / "default" / "probe"
    (job_storage / "chk-7").mkdir()
    (job_storage / "chk-7" / "_metadata").write_text("listed nowhere now")
    shutil.rmtree(job.job_dir)

    refused = job.run(timeout=20)

    assert refused.returncode == 1
    owner_file = job_storage / "owner.json"
    assert refused.stderr.splitlines() == [
        f"spark-checkpoint run: {owner_file.as_uri()}: this job's storage belongs to an "
        f"earlier registry of a state directory at this path (registry {earlier}; this one "
        f"is {_registry(job)}): this one's records of the job were deleted since (or it is "
        "another machine's), and this registry's garbage collection would delete its "
        "checkpoints. Give the job another spec.checkpointing.storage "
        "(spec.restore.initialSavepointPath "
        "can start it from a savepoint or a retained checkpoint there), or to hand the "
        f"storage over, delete {owner_file} (the checkpoints the other registry lists are "
        "then deleted as garbage; its savepoints stay)"
    ]


def test_storage_another_registry_left_without_checkpoints_is_taken_over_and_said_once(
    tmp_path: Path,
) -> None:
    """Said as the run's own warnings are: it read 'warning: WARNING:spark_checkpoint.
    storage.store:...' (a newcomer's)."""
    job = ScriptJob(tmp_path, FINISH)
    layout = JobStorageLayout((job.state_dir / "storage").as_uri(), "default", "probe")
    CheckpointStorage(layout).claim(StorageOwner("registry-2", "another registry"))

    result = job.run(timeout=60)

    assert result.returncode == 0, result.stdout + result.stderr
    said = [line.split(" ", 2)[2] for line in result.stdout.splitlines() if "taken over" in line]
    assert said == [
        f"warning: {layout.job_root}: taken over from another registry, which left no "
        "checkpoints there"
    ], result.stdout


def _registry(job: ScriptJob) -> str:
    """The short id a state directory's registry is named by in messages."""
    return str(json.loads((job.job_dir / "registry-id").read_text())["id"])[:8]


def test_a_state_directory_that_is_also_the_storage_root_does_not_lock_out_its_own_run(
    tmp_path: Path,
) -> None:
    job = ScriptJob(tmp_path, SLEEPING_DRIVER, storage=(tmp_path / "state").as_uri())
    run = job.start()
    try:
        wait_for_file(tmp_path / "driver.pid")
    finally:
        run.kill()
        run.communicate()


def test_a_status_asking_whether_a_run_holds_the_job_does_not_refuse_a_run_starting_then(
    tmp_path: Path,
) -> None:
    """`status` takes the job's lock shared for an instant (`run_lock_holder`): a run taking
    it then was refused as "already running", naming a leftover pid (a reviewer's)."""
    manifest = _orders_manifest()
    paths = local_job_paths(tmp_path, "default", "orders")
    paths.job_dir.mkdir(parents=True)
    paths.lock_file.write_text("424242\n")  # a leftover's
    probe = os.open(paths.lock_file, os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    released = threading.Timer(0.1, os.close, [probe])
    released.start()
    try:
        with job_lock(paths, f"{manifest.namespace}/{manifest.name}"):
            assert run_lock_holder(paths) == str(os.getpid())
    finally:
        released.join()
    assert run_lock_holder(paths) is None


def test_a_lock_the_filesystem_cannot_take_refuses_the_run_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS without a lock manager: ENOLCK, one line, not a traceback."""

    def no_locks(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    layout = JobStorageLayout((tmp_path / "nfs").as_uri(), "default", "orders")
    manifest = _orders_manifest()
    with (
        pytest.raises(RunRefused) as refused,
        storage_lock(
            CheckpointStorage(layout),
            f"{manifest.namespace}/{manifest.name}",
            "spec.checkpointing.storage",
        ),
    ):
        pass
    lock = tmp_path / "nfs" / "default" / "orders" / "writer.lock"
    assert str(refused.value) == (
        f"spec.checkpointing.storage {layout.root!r}: cannot lock {lock}: No locks available"
    )


@pytest.mark.parametrize("kind", ["file", "link"])
def test_local_storage_that_cannot_be_used_is_refused_before_a_driver_starts(
    tmp_path: Path, kind: str
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    if kind == "file":
        (root / "default").write_text("not a directory")
    else:
        (tmp_path / "elsewhere").mkdir()
        (root / "default").symlink_to(tmp_path / "elsewhere")
    job = ScriptJob(tmp_path / "job", SLEEPING_DRIVER, storage=root.as_uri())
    result = job.run(timeout=20)
    assert result.returncode == 1
    expected = {
        "file": f"cannot create the job's directory {root / 'default' / 'probe'}: Not a directory",
        "link": f"{root / 'default'}: is a symbolic link (to '{tmp_path / 'elsewhere'}'); "
        "links are never followed out of the job's storage directory: remove the link",
    }[kind]
    assert result.stderr.splitlines() == [
        f"spark-checkpoint run: spec.checkpointing.storage {root.as_uri()!r}: {expected}"
    ]
    assert not (job.directory / "driver.pid").exists()
    if kind == "link":
        assert not list((tmp_path / "elsewhere").iterdir()), "the run wrote through the link"


def test_an_initial_savepoint_on_this_machine_is_checked_before_a_driver_starts(
    tmp_path: Path,
) -> None:
    """As `run --from PATH` is: before, only the driver found it missing, after Spark had
    started, and the job failed."""
    job = ScriptJob(tmp_path, "open('runs', 'a').write('run\\n')\n")
    missing = tmp_path / "backup" / "default" / "probe" / "savepoints" / "sp-9"
    manifest = yaml.safe_load(job.manifest.read_text())
    manifest["spec"]["restore"] = {"initialSavepointPath": str(missing)}
    job.manifest.write_text(yaml.safe_dump(manifest))

    result = job.run(timeout=20)

    assert result.returncode == 1, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line == (
        "spark-checkpoint run: spec.restore.initialSavepointPath: the savepoint cannot be "
        f"restored: {missing.as_uri()}/_metadata: no such file"
    ), line
    assert not (tmp_path / "runs").exists(), "no driver was started"


@pytest.mark.parametrize("store", ["s3", "gcs", "azure"])
@pytest.mark.parametrize("named_by", ["initialSavepointPath", "--from"])
def test_an_image_on_an_object_store_is_checked_with_the_manifests_credentials(
    tmp_path: Path, request: pytest.FixtureRequest, store: str, named_by: str
) -> None:
    """A newcomer's: an initialSavepointPath on S3 was not checked before Spark started (the
    job failed, RESTORE_FAILED), and `--from` read it without the credentials that the
    manifest's variables give the driver (NoCredentialsError). adlfs takes its credentials
    as it is made: a filesystem fsspec kept from before would have this process's."""
    server = request.getfixturevalue(f"{store}_server")
    job = ScriptJob(tmp_path, "open('runs', 'a').write('run\\n')\n", env=server.environment())
    missing = server.uri(f"{uuid.uuid4().hex}/default/probe/savepoints/sp-9")
    options = ["--from", missing] if named_by == "--from" else []
    if named_by == "initialSavepointPath":
        manifest = yaml.safe_load(job.manifest.read_text())
        manifest["spec"]["restore"] = {"initialSavepointPath": missing}
        job.manifest.write_text(yaml.safe_dump(manifest))
    assert not set(server.environment()) & set(os.environ)

    result = job.run(*options, timeout=60)

    assert result.returncode == 1, result.stdout + result.stderr
    field = "spec.restore.initialSavepointPath" if named_by != "--from" else "--from"
    assert result.stderr.splitlines() == [
        f"spark-checkpoint run: {field}: the savepoint cannot be restored: {missing}/_metadata: "
        "no such file"
    ]
    assert not (tmp_path / "runs").exists(), "no driver was started"


@pytest.mark.parametrize("restore_from", [None, "savepoint:1"])
def test_storage_the_manifests_credentials_do_not_reach_is_refused_at_the_image_check(
    azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch, restore_from: str | None
) -> None:
    """The check of an image reads storage as the driver would, with the manifest's
    credentials: another account's was a ValueError traceback, on every run (a
    reviewer's); without an image to check, storage is not read there."""
    for name, value in azure_server.environment().items():
        monkeypatch.setenv(name, value)
    elsewhere = "AccountName=elsewhere;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:9/elsewhere;"
    root = (
        f"abfs://{azure_server.container}@devstoreaccount1.dfs.core.windows.net/{uuid.uuid4().hex}"
    )
    manifest = manifest_from_document(
        {
            "apiVersion": "sparkcheckpoint.io/v1alpha1",
            "kind": "SparkCheckpointJob",
            "metadata": {"name": "orders"},
            "spec": {
                "application": {
                    "mainFile": "main.py",
                    "env": [{"name": "AZURE_STORAGE_CONNECTION_STRING", "value": elsewhere}],
                },
                "checkpointing": {"storage": root},
            },
        }
    )
    storage = CheckpointStorage(JobStorageLayout(root, "default", "orders"))

    if restore_from is None:
        assert _checked_images(manifest, JobRecord(), storage, None) is None
        return
    with pytest.raises(RunRefused) as refused:
        _checked_images(manifest, JobRecord(), storage, restore_from)
    assert str(refused.value).startswith(f"spec.checkpointing.storage {root!r}: ")
    assert "names Azure account 'devstoreaccount1'" in str(refused.value)
    assert os.environ["AZURE_STORAGE_CONNECTION_STRING"] != elsewhere, "the run's is back"


def test_how_an_earlier_run_failed_is_not_how_the_next_one_ended(tmp_path: Path) -> None:
    # A newcomer's fixed pipeline finished with "job finished: the driver failed the same
    # way twice ...", the failed run's message, in its status too.
    job = ScriptJob(tmp_path, "raise RuntimeError('amout is not a column')\n")
    assert job.run(timeout=30).returncode == 1
    (tmp_path / "driver.py").write_text(FINISH)

    finished = job.run(timeout=30)

    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "amout" not in finished.stdout
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert (status["phase"], status["message"]) == ("Finished", "")


def test_a_finished_job_is_not_run_again(tmp_path: Path) -> None:
    job = ScriptJob(tmp_path, "open('runs', 'a').write('run\\n')\n" + FINISH)
    first = job.run()
    assert first.returncode == 0, first.stdout + first.stderr
    assert json.loads((job.job_dir / "status.json").read_text())["status"]["phase"] == "Finished"
    again = job.run()
    assert again.returncode == 1
    storage = tmp_path / "state" / "storage" / "default" / "probe"
    assert again.stderr.splitlines() == [
        "spark-checkpoint run: job default/probe has Finished and is not run again; to run it "
        f"from the start, delete its state {job.job_dir}, storage {storage} and the output it "
        "committed"  # of savepoints, as it has none (a newcomer's)
    ]
    assert (tmp_path / "runs").read_text() == "run\n", "no driver was started"
    # What the message says works.
    shutil.rmtree(job.job_dir)
    shutil.rmtree(storage)
    assert job.run().returncode == 0
    assert (tmp_path / "runs").read_text() == "run\nrun\n"


def test_run_keeps_its_state_next_to_the_manifest_by_default(tmp_path: Path) -> None:
    job = ScriptJob(tmp_path / "project", FINISH)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = [a for a in job.command() if a not in ("--state-dir", str(job.state_dir))]
    finished = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, check=False)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    status = json.loads(
        (tmp_path / "project/.spark-checkpoint/default/probe/status.json").read_text()
    )
    assert status["status"]["phase"] == "Finished"
    assert list(elsewhere.iterdir()) == []


# A pipeline that never reaches run_coordinated(...) (stuck before it): the process runs,
# and no checkpoint agent ever answers.
UNCOORDINATED_DRIVER = SLEEPING_DRIVER


def test_a_driver_whose_agent_never_answers_fails_the_job_with_the_likely_cause(
    tmp_path: Path,
) -> None:
    job = ScriptJob(tmp_path, UNCOORDINATED_DRIVER, restart_policy={"maxRetries": 3})
    started = time.monotonic()
    result = job.run("--agent-timeout", "2", timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - started < 30
    expected = (
        "the driver's checkpoint agent never answered in 2s after the driver started "
        "(restartPolicy.startTimeout): does the pipeline reach run_coordinated(writer, "
        "participants=[...])? (If the code before it, or Spark's start, is slow rather "
        "than stuck: raise startTimeout.)"
    )
    assert f"{expected} Stopping the driver." in result.stdout
    assert f"job failed: {expected}" in result.stdout
    assert "starting driver attempt 2" not in result.stdout, "retrying cannot help"
    # As the run says it (under load the driver may be stopped before it wrote its pid).
    pid = re.search(r"driver pid (\d+),", result.stdout)
    assert pid is not None and not alive(int(pid[1])), result.stdout
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert (status["phase"], status["message"]) == ("Failed", expected)


def test_a_pipeline_that_exits_0_without_run_coordinated_fails_the_job_and_is_not_finished(
    tmp_path: Path,
) -> None:
    # A pipeline that started its query with writer.start() and left (or a batch job):
    # its exit 0 was taken for "finished with a final checkpoint", and the job was never
    # run again though nothing of it had been checkpointed.
    job = ScriptJob(
        tmp_path, "open('runs', 'a').write('run\\n')\n", restart_policy={"maxRetries": 3}
    )

    result = job.run(timeout=60)

    assert result.returncode == 1, result.stdout + result.stderr
    reason = (
        "the pipeline ended without calling run_coordinated: nothing of it was checkpointed, "
        "and an exit 0 would read as finished; hand the writer to "
        "spark_checkpoint.driver.run_coordinated(writer, participants=[...])"
    )
    assert f"driver failed (exit 2)\n    its error:\n    {reason}\n" in result.stdout
    # Told once: the job's end says how it ended, not the error again.
    assert "job failed: driver cannot run: MISCONFIGURED\n" in result.stdout
    assert result.stdout.count(reason) == 1
    assert (tmp_path / "runs").read_text() == "run\n", "retrying cannot help"
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Failed", status
    # Fixed, it runs: a failed job is run again.
    (tmp_path / "driver.py").write_text(FINISH)
    assert job.run(timeout=60).returncode == 0


@pytest.mark.parametrize(
    ("signal_number", "why"),
    [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated (SIGTERM)")],
)
def test_ctrl_c_while_no_savepoint_can_be_taken_says_so_and_stops(
    tmp_path: Path, signal_number: int, why: str
) -> None:
    """SIGTERM (`kill` of a detached run) is taken as Ctrl-C, and said so: it said
    'Ctrl-C again to cancel' (a newcomer's try)."""
    job = ScriptJob(tmp_path, UNCOORDINATED_DRIVER)
    run = job.start()
    driver = int(wait_for_file(tmp_path / "driver.pid"))
    run.send_signal(signal_number)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, out + err
    # One line: "taking a savepoint", its decline and "stopping without one" contradicted
    # each other (a newcomer's try).
    said = [line.split(" ", 2)[2] for line in out.splitlines() if why in line]
    assert said == [
        f"{why}: no savepoint can be taken now: its query is not running yet; stopping the "
        "driver without one (no checkpoint or savepoint to resume from: the next run starts "
        "afresh)"
    ], out
    assert "declined" not in out
    wait_until_gone(driver)
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Suspended"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"].endswith("(on this machine: spark-checkpoint run)"), ready


def test_ctrl_c_in_a_restarts_backoff_stops_at_once_without_a_driver(tmp_path: Path) -> None:
    """No driver runs between a failure and the restart: Ctrl-C's savepoint is declined at
    once and the run ends Suspended, rather than wait out the backoff and start a driver
    to decline it."""
    script = """
        import pathlib
        pathlib.Path("failed").write_text("yes")
        raise RuntimeError("lost the connection")
    """
    job = ScriptJob(tmp_path, script, restart_policy={"backoff": "60s", "maxBackoff": "60s"})
    run = job.start()
    wait_for_file(tmp_path / "failed")
    wait_for_file(job.job_dir / "status.json")
    deadline = time.monotonic() + 30
    while json.loads((job.job_dir / "status.json").read_text())["status"]["phase"] != "Restarting":
        assert time.monotonic() < deadline, "never restarting"
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    try:
        out, err = run.communicate(timeout=20)  # the backoff is 60 s
    finally:
        run.kill()
    assert run.returncode == 0, out + err
    assert "starting driver attempt 2" not in out
    assert (
        "interrupted: no savepoint can be taken now: its query is not running yet; "
        "stopping the driver without one"
    ) in out
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Suspended"


def test_a_driver_that_fails_the_same_way_at_start_is_not_retried_and_shows_its_error(
    tmp_path: Path,
) -> None:
    script = """
        from spark_checkpoint.sink import TransactionalFileSink
        sink = TransactionalFileSink("hdfs://namenode/output/orders")
    """
    job = ScriptJob(tmp_path, script, restart_policy={"maxRetries": 5})
    result = job.run()
    assert result.returncode == 1, result.stdout + result.stderr
    error = (
        "ValueError: TransactionalFileSink cannot commit atomically to "
        "'hdfs://namenode/output/orders': its output must be a local path"
    )
    lines = result.stdout.splitlines()
    restart = next(i for i, line in enumerate(lines) if "driver failed (exit 1); restart 1" in line)
    assert lines[restart + 1] == "    its error:"
    assert lines[restart + 2].startswith(f"    {error}")
    assert "starting driver attempt 3" not in result.stdout
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Failed"
    assert status["message"].startswith(
        f"the driver failed the same way twice before its first batch; not retried: {error}"
    )
    assert (
        "job failed: the driver failed the same way twice before its first batch; not retried\n"
    ) in result.stdout
    assert result.stdout.count(error) == 2, "told by each attempt's DriverFailed, once"


def test_the_same_error_logged_at_another_time_is_the_same_error(tmp_path: Path) -> None:
    """A driver logs its error (`run_coordinated`'s "query failed: ...") with the time of
    day: two attempts that fail the same way a moment apart failed the same way."""
    script = """
        import logging, sys, time
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        time.sleep(0.01)
        logging.getLogger("spark_checkpoint").error("query failed: Wrong basePath data/input")
        logging.getLogger("py4j.clientserver").warning("Closing down clientserver connection")
        sys.exit(1)
    """
    job = ScriptJob(tmp_path, script, restart_policy={"maxRetries": 5})
    result = job.run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "starting driver attempt 3" not in result.stdout
    assert "Closing down" not in result.stdout, "what the driver logs after its error"
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["message"] == (
        "the driver failed the same way twice before its first batch; not retried: "
        "ERROR spark_checkpoint: query failed: Wrong basePath data/input"
    )


def test_a_driver_that_ends_without_an_error_in_its_log_is_retried(tmp_path: Path) -> None:
    """Its log's last lines are shown as they are; alike in every attempt, they are no
    error the rule of "the same error twice" could recognise."""
    script = """
        import logging, sys
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j.clientserver").warning("Closing down clientserver connection")
        sys.exit(1)
    """
    job = ScriptJob(tmp_path, script, restart_policy={"maxRetries": 2})
    result = job.run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "starting driver attempt 3" in result.stdout
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert "restartPolicy.maxRetries=2 exhausted" in status["message"], status["message"]


def test_a_failure_that_changes_is_retried_up_to_max_retries_with_each_error_shown(
    tmp_path: Path,
) -> None:
    script = """
        import pathlib
        runs = pathlib.Path("runs")
        runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
        raise RuntimeError(f"lost the connection, run {len(runs.read_text())}")
    """
    job = ScriptJob(tmp_path, script, restart_policy={"maxRetries": 2})
    result = job.run()
    assert result.returncode == 1, result.stdout + result.stderr
    for run in (1, 2, 3):
        assert f"    RuntimeError: lost the connection, run {run}" in result.stdout
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["message"] == (
        "driver failed 3 times in a row; restartPolicy.maxRetries=2 exhausted; "
        "last error: RuntimeError: lost the connection, run 3"
    )
    assert "job failed: driver failed 3 times in a row; restartPolicy.maxRetries=2 exhausted\n" in (
        result.stdout
    )
    assert result.stdout.count("lost the connection, run 3") == 1


def test_a_main_file_may_be_a_directory_python_runs(tmp_path: Path) -> None:
    job = ScriptJob(tmp_path, FINISH)
    (tmp_path / "app").mkdir()
    (tmp_path / "driver.py").rename(tmp_path / "app" / "__main__.py")
    manifest = yaml.safe_load(job.manifest.read_text())
    manifest["spec"]["application"]["mainFile"] = "app"
    job.manifest.write_text(yaml.safe_dump(manifest))

    result = job.run(timeout=30)

    assert "mainFile" not in result.stderr, result.stderr
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Finished", status["message"]


@pytest.mark.parametrize(
    ("present", "hint"),
    [
        ("drivers.py", "; did you mean 'drivers.py'?"),
        ("other.txt", ""),
        ("driver.pyc", ""),  # close, but no Python source (a newcomer was offered a .yaml)
    ],
)
def test_a_missing_main_file_is_refused_before_spark_starts(
    tmp_path: Path, present: str, hint: str
) -> None:
    """Before, Python said so in the driver's log and the job failed as misconfigured."""
    job = ScriptJob(tmp_path, "open('runs', 'a').write('run\\n')\n")
    (tmp_path / "driver.py").rename(tmp_path / present)

    result = job.run(timeout=20)

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == (
        f"spark-checkpoint run: {job.manifest}: spec.application.mainFile: no file "
        f"{tmp_path / 'driver.py'} (a relative path is read from the manifest's directory)"
        f"{hint}\n"
    )
    assert not (tmp_path / "runs").exists(), "no driver was started"
    assert not job.job_dir.exists(), "nothing of the run was left"


def test_a_driver_killed_by_a_signal_is_described_so_without_log_lines_as_its_error(
    tmp_path: Path,
) -> None:
    script = """
        import os, signal, sys
        print("INFO spark_checkpoint.sink: batch 13 staged", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    job = ScriptJob(tmp_path, script, restart_policy={"maxRetries": 1})
    result = job.run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "driver failed (killed by SIGKILL); restart 1" in result.stdout
    assert "its error:" not in result.stdout, "a killed driver's log tail is not its error"
    assert "batch 13 staged" not in result.stdout


MANIFEST_FIXTURES = Path(__file__).parent.parent / "manifest" / "fixtures"


def _orders_manifest() -> JobManifest:
    """Job default/orders, with nothing but its main file."""
    return manifest_from_document(
        {
            "apiVersion": "sparkcheckpoint.io/v1alpha1",
            "kind": "SparkCheckpointJob",
            "metadata": {"name": "orders"},
            "spec": {"application": {"mainFile": "main.py"}},
        }
    )


@pytest.mark.parametrize("detach", [False, True])
def test_a_job_state_directory_that_is_a_link_or_another_users_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], detach: bool
) -> None:
    """The run's tokens and control socket went where a link planted as the job's state
    directory pointed (in a state directory others may write to); another user's could
    have them swapped (a security review's)."""
    manifest = tmp_path / "job.yaml"
    shutil.copy(MANIFEST_FIXTURES / "minimal-job.yaml", manifest)
    job_dir = tmp_path / ".spark-checkpoint" / "default" / "word-count"
    job_dir.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    job_dir.symlink_to(elsewhere)
    command = ["run", str(manifest), *(["--detach"] if detach else [])]

    assert main(command) == 1
    assert capsys.readouterr().err == (
        f"spark-checkpoint run: the job's state directory {job_dir} is a symbolic link (to "
        f"{elsewhere}): never followed, since the run's tokens and control socket would go "
        "there; make it a directory\n"
    )
    assert list(elsewhere.iterdir()) == []
    assert elsewhere.stat().st_mode & 0o777 == 0o755

    job_dir.unlink()
    job_dir.mkdir()
    os.chown(job_dir, 54321, -1)  # the tests run as root: another user's directory
    assert main(command) == 1
    assert capsys.readouterr().err == (
        f"spark-checkpoint run: the job's state directory {job_dir} belongs to another user "
        "(uid 54321), who could swap the run's tokens and control socket: give --state-dir "
        "a directory of your own\n"
    )
    assert list(job_dir.iterdir()) == []


def test_a_state_directory_of_another_user_is_refused_touching_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Made first by another user where the manifest is (a shared directory), it took the
    job's directory and default storage: the other user could read the checkpoints and
    swap them, and the job's directory after its check (a security review's)."""
    manifest = tmp_path / "job.yaml"
    shutil.copy(MANIFEST_FIXTURES / "minimal-job.yaml", manifest)
    state_dir = tmp_path / ".spark-checkpoint"
    (state_dir / "storage" / "default" / "word-count").mkdir(parents=True, mode=0o777)
    state_dir.chmod(0o777)
    os.chown(state_dir, 54321, -1)  # the tests run as root: another user's directory

    assert main(["run", str(manifest)]) == 1
    assert capsys.readouterr().err == (
        f"spark-checkpoint run: the state directory {state_dir} belongs to another user (uid "
        "54321), who could swap the job's checkpoints, tokens and control socket: give "
        "--state-dir a directory of your own\n"
    )
    assert [p.name for p in state_dir.iterdir()] == ["storage"]
    assert state_dir.stat().st_mode & 0o777 == 0o777


def test_the_default_storage_and_job_directories_are_made_owner_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job's holds the run's tokens, control socket and driver logs, the default
    storage the job's checkpoints, which were readable by every user (a security review's);
    ones made by an earlier version (0755) are made private too, also by a run refused
    later. A state directory that was there is left as it was (a project's, say)."""
    manifest = tmp_path / "job.yaml"
    shutil.copy(MANIFEST_FIXTURES / "minimal-job.yaml", manifest)
    state_dir = tmp_path / ".spark-checkpoint"
    job_dir = state_dir / "default" / "word-count"
    job_dir.mkdir(parents=True, mode=0o755)
    (state_dir / "storage").mkdir(mode=0o755)
    state_dir.chmod(0o755)
    (job_dir / "status.json").write_text("{")

    assert main(["run", str(manifest)]) == 1
    assert "the job's status file cannot be read" in capsys.readouterr().err
    assert job_dir.stat().st_mode & 0o777 == 0o700
    assert (state_dir / "storage").stat().st_mode & 0o777 == 0o700
    assert state_dir.stat().st_mode & 0o777 == 0o755


def test_a_default_storage_linked_elsewhere_is_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A storage root may be a link (the administrator's: to a larger disk); only links
    below it are refused."""
    manifest = tmp_path / "job.yaml"
    shutil.copy(MANIFEST_FIXTURES / "minimal-job.yaml", manifest)
    state_dir = tmp_path / ".spark-checkpoint"
    job_dir = state_dir / "default" / "word-count"
    job_dir.mkdir(parents=True)
    (job_dir / "status.json").write_text("{")
    disk = tmp_path / "disk"
    disk.mkdir(mode=0o755)
    (state_dir / "storage").symlink_to(disk)

    assert main(["run", str(manifest)]) == 1
    assert "the job's status file cannot be read" in capsys.readouterr().err
    assert disk.stat().st_mode & 0o777 == 0o700


def test_a_state_directory_every_user_writes_in_is_refused_and_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--state-dir /tmp` as root was made 0700, /tmp with it (a reviewer's)."""
    manifest = tmp_path / "job.yaml"
    shutil.copy(MANIFEST_FIXTURES / "minimal-job.yaml", manifest)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)

    assert main(["run", str(manifest), "--state-dir", str(shared)]) == 1
    assert capsys.readouterr().err == (
        f"spark-checkpoint run: the state directory {shared} is every user's to write in, "
        "who could swap the job's checkpoints, tokens and control socket: give --state-dir "
        "a directory of your own\n"
    )
    assert shared.stat().st_mode & 0o7777 == 0o1777
    assert list(shared.iterdir()) == []


def test_a_run_gives_the_root_logger_back_as_it_found_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While it runs, what libraries log is lines of its display; after, a caller in the
    same process logs as before (not into the run's display, whose stream may be gone)."""
    manifest = tmp_path / "job.yaml"
    shutil.copy(MANIFEST_FIXTURES / "minimal-job.yaml", manifest)
    status_file = tmp_path / ".spark-checkpoint" / "default" / "word-count" / "status.json"
    status_file.parent.mkdir(parents=True)
    status_file.write_text("{")  # refused once the run has begun
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    assert main(["run", str(manifest)]) == 1

    assert (root.handlers, root.level) == (handlers, level)
    assert "status file cannot be read" in capsys.readouterr().err


def test_an_unreadable_status_file_refuses_the_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "job.yaml"
    shutil.copy(MANIFEST_FIXTURES / "minimal-job.yaml", manifest)
    status_file = tmp_path / ".spark-checkpoint" / "default" / "word-count" / "status.json"
    status_file.parent.mkdir(parents=True)
    for content, field in [
        ('{"status": {"phase": "Sleeping"}}', "status.phase: expected one of Pending"),
        ('{"status": {"jobAttempt": "2"}}', "status.jobAttempt: expected an integer"),
        ('{"status": {"coordinator": {"nextCheckpointId": 0}}}', "coordinator.nextCheckpointId"),
        (
            '{"status": {"restoredFrom": {"source": "checkpoint:3", "skipped": []}}}',
            "status.restoredFrom: field 'restoredFrom.batchId' is missing",
        ),
        ('{"status": {"restoredFrom": "checkpoint:3"}}', "status.restoredFrom: restoredFrom must"),
        ('{"status": []}', "status: expected an object, got a list"),
        ("{", "not JSON"),
    ]:
        status_file.write_text(content)

        assert main(["run", str(manifest)]) == 1
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"spark-checkpoint run: the job's status file cannot be read ({status_file}: "
        )
        assert field in line
        assert not (status_file.parent / "work").exists()  # nothing was started


def test_the_error_a_driver_reports_is_its_error_whatever_its_log_ends_with(
    tmp_path: Path,
) -> None:
    """The real `run_coordinated` around a query that fails as Spark's do (the error, then
    kilobytes of plan), logging on as it ends: the error it reported is the one shown."""
    write_job(tmp_path, interval="10s")
    environment = {**os.environ, FAILURE_VARIABLE: "no such column 'k'"}
    result = run_cli(tmp_path, "run", "job.yaml", environment=environment)
    assert result.returncode == 1, result.stdout + result.stderr
    status = json.loads(
        (tmp_path / ".spark-checkpoint" / "default" / "probe" / "status.json").read_text()
    )["status"]
    repeated = "the driver failed the same way twice before its first batch; not retried: "
    assert re.fullmatch(
        re.escape(repeated) + reported_failure("no such column 'k'"), status["message"]
    )


def test_a_run_that_failed_on_its_images_ends_naming_the_command_that_restores_one(
    tmp_path: Path,
) -> None:
    """A run whose restored query fails on each image in turn marks them all unrestorable,
    and a plain run would never restore them again: its last line names them and the
    `run --from` that would, and that command restores the image (a newcomer ran a plain
    run again, as the error suggested, and it failed the same way)."""
    write_job(tmp_path, interval="1s")
    environment = dict(os.environ)
    detached = run_cli(tmp_path, "run", "-f", "job.yaml", "-d", environment=environment)
    assert detached.returncode == 0, detached.stderr
    stopped = run_cli(tmp_path, "stop", "-f", "job.yaml", environment=environment)
    assert stopped.returncode == 0, stopped.stderr
    savepoint = re.search(r"savepoint (\d+) completed", stopped.stdout)
    assert savepoint, stopped.stdout
    error = "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state."

    failed = run_cli(
        tmp_path, "run", "-f", "job.yaml", environment={**environment, FAILURE_VARIABLE: error}
    )

    assert failed.returncode == 1, failed.stdout + failed.stderr
    *_, summary, hint = failed.stdout.splitlines()
    assert " Failed: " in summary, failed.stdout
    command = f"run --from savepoint:{savepoint[1]}"
    assert re.search(
        rf"not restored from again unless named: savepoint:{savepoint[1]}(, checkpoint:\d+)* "
        rf"\(`spark-checkpoint list` says why\); `{command}` restores the newest of them$",
        hint,
    ), hint
    restored = run_cli(
        tmp_path, "run", "-f", "job.yaml", "-d", *command.split()[1:], environment=environment
    )
    assert restored.returncode == 0, restored.stdout + restored.stderr
    status = json.loads(
        (tmp_path / ".spark-checkpoint" / "default" / "probe" / "status.json").read_text()
    )["status"]
    assert status["restoredFrom"]["source"] == f"savepoint:{savepoint[1]}", status
    assert run_cli(tmp_path, "cancel", "-f", "job.yaml", environment=environment).returncode == 0


def test_a_detached_run_whose_driver_fails_before_it_answers_exits_1(tmp_path: Path) -> None:
    """`run -d` said "runs in the background" and exited 0 while the first driver's failure
    had the job Restarting (a newcomer's SyntaxError; the job Failed seconds later): a
    driver that has not answered yet is waited for through its restarts."""
    write_job(tmp_path, interval="10s")
    environment = {**os.environ, FAILURE_VARIABLE: "no such column 'k'"}

    result = run_cli(tmp_path, "run", "-f", "job.yaml", "-d", environment=environment)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "runs in the background" not in result.stdout
    assert "the driver failed the same way twice before its first batch" in result.stderr


def test_a_detached_run_that_does_not_answer_in_time_says_it_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run -d` said only "did not answer within 60s" (exit 1) of a run stuck on storage
    that did not answer, which then ran on (an Azure newcomer's): it says the run goes on,
    how to see when it answers and how to end it."""
    write_job(tmp_path, interval="10s")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(detached_run, "ANSWER_TIMEOUT_SECONDS", 0.0)

    code = main(["run", "-f", "job.yaml", "-d"])

    told = capsys.readouterr().err
    pid = int(re.search(r"the background run \(pid ([0-9]+)\)", told)[1])  # type: ignore[index]
    try:
        assert code == 1
        assert told.endswith(
            f"did not answer within 0s and goes on (its output is in "
            f"{tmp_path / '.spark-checkpoint' / 'default' / 'probe' / 'logs' / 'runtime.log'}): "
            f"`spark-checkpoint status -f job.yaml` says when it answers; `kill {pid}` ends it "
            "before\n"
        ), told
        assert alive(pid)
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_until_gone(pid)


@pytest.mark.parametrize("detached", [False, True])
def test_a_job_in_the_namespace_named_storage_is_refused_before_it_writes(
    tmp_path: Path, detached: bool
) -> None:
    """The state of job storage/default would lie in the default storage's directory for
    namespace default, its logs/ and work/ in the storage of jobs default/logs and
    default/work (a reviewer's)."""
    manifest = write_job(tmp_path, interval="10s")
    document = yaml.safe_load(manifest.read_text())
    document["metadata"] = {"name": "default", "namespace": "storage"}
    manifest.write_text(yaml.safe_dump(document))

    options = ["-d"] if detached else []
    result = run_cli(tmp_path, "run", "job.yaml", *options, environment=dict(os.environ))

    # A manifest this machine cannot run: exit 2 naming the file, as any bad manifest.
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(
        "spark-checkpoint run: job.yaml: metadata.namespace: 'storage' is the name of the "
        "default storage's directory"
    ), result.stderr
    assert not (tmp_path / ".spark-checkpoint").exists()


@pytest.mark.parametrize("detached", [False, True])
def test_a_manifest_that_says_suspended_is_not_run(tmp_path: Path, detached: bool) -> None:
    """A newcomer's: spec.state Suspended ran in the foreground for ten minutes, without a
    word (on Kubernetes: phase Suspended, no pods)."""
    manifest = write_job(tmp_path, interval="10s")
    document = yaml.safe_load(manifest.read_text())
    document["spec"]["state"] = "Suspended"
    manifest.write_text(yaml.safe_dump(document))

    options = ["-d"] if detached else []
    result = run_cli(tmp_path, "run", "job.yaml", *options, environment=dict(os.environ))

    assert (result.returncode, result.stderr) == (
        2,
        "spark-checkpoint run: job.yaml: spec.state: is Suspended: the manifest asks for the "
        "job not to run; set it to Running (the default) to run it here (on this machine, "
        "`spark-checkpoint stop` suspends a run)\n",
    )
    assert not (tmp_path / ".spark-checkpoint").exists()


def test_a_failed_cleanup_names_its_command_once(tmp_path: Path) -> None:
    # The janitor's last line ("collect-garbage failed: ...") is its reason for the runtime,
    # which names the command itself: the event read "collect-garbage: collect-garbage
    # failed: ...".
    layout = JobStorageLayout((tmp_path / "storage").as_uri(), "default", "orders")
    CheckpointStorage(layout).claim(StorageOwner("registry-2", "another registry"))
    (Path(layout.job_root.removeprefix("file://")) / "chk-3").mkdir()
    manifest = _orders_manifest()
    janitor = LocalJanitor(manifest, layout.root, StorageOwner("registry-1", "this registry"))

    with pytest.raises(CleanupFailed) as failed:
        asyncio.run(janitor.collect_garbage([], []))

    message = str(failed.value)
    assert message.startswith("collect-garbage: "), message
    assert message.count("collect-garbage") == 1, message
    assert "another registry" in message
    assert (Path(layout.job_root.removeprefix("file://")) / "chk-3").is_dir()


def test_a_janitor_that_does_not_end_is_killed_at_its_time_limit_or_when_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against storage that did not answer, a run's end waited on its janitor for ever
    (14 minutes and on, through `cancel` and two SIGTERMs: an S3 user's)."""
    started: list[int] = []
    real_exec = asyncio.create_subprocess_exec

    async def hanging(*_command: str, **options: object) -> asyncio.subprocess.Process:
        process = await real_exec(sys.executable, "-c", "import time; time.sleep(60)", **options)  # type: ignore[arg-type]
        started.append(process.pid)
        return process

    monkeypatch.setattr(asyncio, "create_subprocess_exec", hanging)
    monkeypatch.setattr(local_runtime, "JANITOR_TIMEOUT_SECONDS", 0.5)
    manifest = _orders_manifest()
    janitor = LocalJanitor(manifest, (tmp_path / "storage").as_uri(), StorageOwner("r", "r"))

    with pytest.raises(CleanupFailed) as failed:
        asyncio.run(janitor.collect_garbage([], []))
    assert str(failed.value) == (
        "collect-garbage: did not finish in 0s (storage that does not answer?)"
    )

    async def cut_short() -> None:
        collecting = asyncio.create_task(janitor.collect_garbage([], []))
        await until_async(lambda: len(started) == 2)
        collecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collecting

    monkeypatch.setattr(local_runtime, "JANITOR_TIMEOUT_SECONDS", 60.0)
    asyncio.run(cut_short())
    for pid in started:
        wait_until_gone(pid)


def test_a_slow_claim_of_an_object_store_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against an endpoint that did not answer, a run's log held nothing for minutes while
    it claimed the job's storage (an S3 user's)."""

    async def slow_claim(self: LocalJanitor) -> None:
        await asyncio.sleep(0.5)

    monkeypatch.setattr(LocalJanitor, "claim", slow_claim)
    monkeypatch.setattr(local_runtime, "SLOW_CLAIM_SECONDS", 0.05)
    manifest = _orders_manifest()
    storage = CheckpointStorage(JobStorageLayout("s3://bucket/ckpt", "default", "orders"))
    said: list[str] = []

    async def claim() -> None:
        signals = local_runtime._StartSignals()
        try:
            await local_runtime._claiming_janitor(
                manifest, storage, StorageOwner("r", "r"), said.append, signals
            )
        finally:
            signals.restore()

    asyncio.run(claim())

    assert said == [
        "claiming the job's storage s3://bucket/ckpt/default/orders: no answer after 0s (an "
        "endpoint that does not answer, or one that refuses and the storage library "
        "retries?); waiting up to 600s"
    ]


@pytest.mark.parametrize(
    ("ending", "said"),
    [
        (signal.SIGINT, "interrupted (Ctrl-C)"),
        (signal.SIGTERM, "terminated (SIGTERM)"),
        (signal.SIGHUP, "hung up (SIGHUP)"),
    ],
)
def test_a_signal_while_an_object_store_is_claimed_ends_the_run_saying_so(
    tmp_path: Path, ending: signal.Signals, said: str
) -> None:
    """Against an endpoint that does not answer: the run ended without a word (an S3
    user's), and the claim's janitor process goes with it."""
    document = yaml.safe_load((MANIFEST_FIXTURES / "minimal-job.yaml").read_text())
    document["spec"]["checkpointing"] = {"storage": "s3://bucket/ckpt"}
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(document))
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        environment = {
            **os.environ,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        run = subprocess.Popen(
            [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", str(manifest)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        silent.settimeout(60)
        claiming, _ = silent.accept()  # the claim's first request
        run.send_signal(ending)
        out, err = run.communicate(timeout=60)
        claiming.settimeout(60)
        while claiming.recv(65536):  # until the janitor that sent it is gone
            pass
        claiming.close()

    assert (run.returncode, out) == (ExitCode.CANCELLED, "")
    assert err == (
        f"spark-checkpoint run: {said} while claiming the job's storage "
        "s3://bucket/ckpt/default/word-count: nothing was started\n"
    )


def test_a_signal_while_the_images_are_checked_ends_the_run_at_once_with_a_line(
    tmp_path: Path,
) -> None:
    """Between the claim and the supervisor's own handlers the image to restore is read
    from storage, which may retry for minutes (Azure's SDK: 3): SIGTERM killed the run
    without a word, and later Ctrl-C waited for the reads to end."""
    write_job(tmp_path, interval="1s")
    script = tmp_path / "signalled.py"
    script.write_text(
        "import os, signal, time\n"
        "from spark_checkpoint_operator import local_runtime\n"
        "from spark_checkpoint_operator.cli import main\n"
        "def hanging(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(600)  # a storage read that does not return\n"
        "local_runtime._checked_images = hanging\n"
        "raise SystemExit(main(['run', '-f', 'job.yaml']))\n"
    )

    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert (run.returncode, run.stderr) == (
        ExitCode.CANCELLED,
        "spark-checkpoint run: terminated (SIGTERM) while checking the image to restore: "
        "nothing was started\n",
    ), run.stdout + run.stderr
    assert "starting driver" not in run.stdout


def test_a_refused_run_gives_the_signal_handlers_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As they were: a caller in the same process keeps its own (SIGHUP ignored under
    nohup, say)."""
    write_job(tmp_path, interval="1s")
    ignored = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    own = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        before = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        with contextlib.chdir(tmp_path):
            assert main(["run", "-f", "job.yaml", "--from", "savepoint:9"]) == ExitCode.FAILED
        after = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    finally:
        signal.signal(signal.SIGHUP, ignored)
        signal.signal(signal.SIGTERM, own)
    assert after == before
    assert "savepoint:9 is not a registered savepoint" in capsys.readouterr().err


async def until_async(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    ("spark_conf", "bound_to"),
    [
        ({}, "127.0.0.1"),
        ({"spark.master": "local[2]"}, "127.0.0.1"),
        ({"spark.driver.bindAddress": "0.0.0.0"}, "0.0.0.0"),  # the manifest's choice
        # Executors elsewhere must reach the driver: Spark's own default stands.
        ({"spark.master": "spark://cluster:7077"}, None),
    ],
)
def test_a_local_driver_listens_on_loopback_unless_its_executors_are_elsewhere(
    spark_conf: dict[str, str], bound_to: str | None
) -> None:
    # tests/e2e/test_local_runs.py checks the sockets of a real driver.
    application = Application("pipeline.py", None, (), spark_conf, ())

    assert local_spark_conf(application).get("spark.driver.bindAddress") == bound_to


@pytest.mark.parametrize("place", ["logs/driver-1.log", "logs/runtime.log"])
def test_a_log_of_the_state_directory_that_is_a_symbolic_link_is_refused(
    tmp_path: Path, place: str
) -> None:
    # The security review appended a whole driver log to a file of the user's this way.
    job = ScriptJob(tmp_path, FINISH)
    victim = tmp_path / "victim.rc"
    victim.write_text("the user's file\n")
    link = job.job_dir / place
    link.parent.mkdir(parents=True)
    link.symlink_to(victim)

    result = job.run(*(["--detach"] if place.endswith("runtime.log") else []), timeout=60)

    assert result.returncode == 1, result.stdout + result.stderr
    assert victim.read_text() == "the user's file\n"
    said = result.stdout + result.stderr
    assert (
        f"{link}: is a symbolic link (to {str(victim)!r}); links are never followed out of "
        "the state directory: remove the link"
    ) in said, said
    assert "Traceback" not in said


def test_a_symbolic_link_in_place_of_the_status_files_temporary_is_replaced(
    tmp_path: Path,
) -> None:
    job = ScriptJob(tmp_path, FINISH)
    victim = tmp_path / "victim.rc"
    victim.write_text("the user's file\n")
    job.job_dir.mkdir(parents=True)
    (job.job_dir / "status.tmp").symlink_to(victim)

    result = job.run(timeout=60)

    assert result.returncode == 0, result.stdout + result.stderr
    assert victim.read_text() == "the user's file\n"
    assert json.loads((job.job_dir / "status.json").read_text())["status"]["phase"] == "Finished"


@pytest.mark.parametrize(
    ("script", "link_the_log", "told"),
    [
        # No driver can start.
        (FINISH, True, "job failed: the driver could not be started: "),
        # The review's: the driver started, then ended without run_coordinated.
        (
            "import time\ntime.sleep(1.5)\n",
            False,
            "the pipeline ended without calling run_coordinated",
        ),
    ],
    ids=["no-driver", "uncoordinated"],
)
def test_a_detached_run_that_fails_before_its_driver_answers_says_so_and_exits_1(
    tmp_path: Path, script: str, link_the_log: bool, told: str
) -> None:
    # A newcomer's `run --from ... --detach` printed "runs in the background", exit 0, for
    # a run that failed in the same second (no image it could restore).
    job = ScriptJob(tmp_path, script)
    if link_the_log:
        log = job.job_dir / "logs" / "driver-1.log"
        log.parent.mkdir(parents=True)
        log.symlink_to(tmp_path / "elsewhere.log")

    result = job.run("--detach", timeout=60)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "runs in the background" not in result.stdout
    assert told in result.stderr, result.stderr


def test_a_detached_run_that_finishes_while_it_is_waited_for_says_how_and_exits_0(
    tmp_path: Path,
) -> None:
    job = ScriptJob(tmp_path, FINISH)

    result = job.run("--detach", timeout=60)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "runs in the background" not in result.stdout
    assert "job finished" in result.stdout, result.stdout


def test_a_job_whose_status_file_was_deleted_does_not_meet_its_old_attempts(
    tmp_path: Path,
) -> None:
    """Its attempts count from 1 again: the first driver met the live location attempt 1
    of the lost registry left and failed with "a checkpoint location is never reused"
    (an exactly-once tester, after deleting status.json as the docs suggest)."""
    job = ScriptJob(tmp_path, FINISH)
    assert job.run().returncode == 0
    left = job.job_dir / "work" / "attempt-1" / "checkpoint"
    left.mkdir(parents=True, exist_ok=True)
    (job.job_dir / "status.json").unlink()
    shutil.rmtree(job.state_dir / "storage", ignore_errors=True)

    again = job.run()

    assert again.returncode == 0, again.stdout + again.stderr
    assert "never reused" not in again.stdout + again.stderr


def _azure(account: str) -> CheckpointStorage:
    return CheckpointStorage(
        JobStorageLayout(f"abfs://state@{account}.dfs.core.windows.net/ckpt", "default", "job")
    )


def test_storage_in_another_azure_account_is_not_where_the_images_are(tmp_path: Path) -> None:
    """A path drops its Azure account (abfs://c@account.dfs.core.windows.net/p is c/p), so
    staging's storage passed for production's, whose savepoints it does not hold; restores
    likewise took another account's savepoint for the job's own of that id."""
    production, staging = _azure("production"), _azure("staging")
    assert not staging.is_same_job_directory(production)
    assert staging.is_same_job_directory(_azure("staging"))
    savepoint = f"{production.layout.job_root}/savepoints/sp-3/_metadata"
    registry = PersistedState(
        next_checkpoint_id=4,
        savepoints=(CompletedCheckpoint(3, CheckpointKind.SAVEPOINT, 1, savepoint, 0, 0, 0),),
    )
    record = JobRecord(coordinator=registry)
    paths = LocalPaths(tmp_path / "default" / "job")

    check_storage_unchanged(record, production, paths)
    with pytest.raises(RunRefused) as refused:
        check_storage_unchanged(record, staging, paths)
    assert str(refused.value).startswith(
        "spec.checkpointing.storage: the job's checkpoints and savepoints are not in "
        "abfs://state@staging.dfs.core.windows.net/ckpt/default/job but in "
        "abfs://state@production.dfs.core.windows.net/ckpt/default/job, where it ran before;"
    )
    assert str(refused.value).endswith(f" and run --from {savepoint}")


@pytest.mark.parametrize("checkpoint_restorable", [True, False])
def test_a_storage_change_names_the_newest_image_a_restore_can_use(
    tmp_path: Path, checkpoint_restorable: bool
) -> None:
    """Checkpoints and savepoints share one id counter: checkpoint 50 is newer than
    savepoint 3, which a restore after it would replay batches from (a reviewer's)."""
    before = CheckpointStorage(JobStorageLayout((tmp_path / "a").as_uri(), "default", "job"))
    after = CheckpointStorage(JobStorageLayout((tmp_path / "b").as_uri(), "default", "job"))
    root = before.layout.job_root
    images = {
        kind: CompletedCheckpoint(n, kind, n, f"{root}/{name}/_metadata", 0, 0, 0)
        for kind, n, name in (
            (CheckpointKind.SAVEPOINT, 3, "savepoints/sp-3"),
            (CheckpointKind.CHECKPOINT, 50, "chk-50"),
        )
    }
    registry = PersistedState(
        next_checkpoint_id=51,
        checkpoints=(images[CheckpointKind.CHECKPOINT],),
        savepoints=(images[CheckpointKind.SAVEPOINT],),
    )
    record = JobRecord(coordinator=registry)
    if not checkpoint_restorable:
        record.unrestorable.append(UnrestorableImage("checkpoint:50", "its query failed", 1))

    with pytest.raises(RunRefused) as refused:
        check_storage_unchanged(record, after, LocalPaths(tmp_path / "state"))

    named = images[CheckpointKind.CHECKPOINT if checkpoint_restorable else CheckpointKind.SAVEPOINT]
    assert str(refused.value).endswith(
        f"from its newest {named.kind.value} there: delete its state {tmp_path / 'state'} and "
        f"run --from {named.path}"
    )


# Azurite's well-known development key (documented by Microsoft; not a secret).
DEVELOPMENT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@pytest.mark.parametrize(
    "now",
    [
        "abfs://state/ckpt",  # the account from the connection string, as before
        "abfs://state@PRODUCTION.dfs.core.windows.net/ckpt",  # host names know no case
    ],
)
def test_storage_that_did_not_move_is_not_refused_whatever_names_its_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, now: str
) -> None:
    """The images registered under an account the URI named; the manifest now leaves it to
    the connection string, or spells it in capitals: the same storage (a reviewer's: such
    a run was refused, and told to delete the job's state)."""
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        f"DefaultEndpointsProtocol=http;AccountName=production;AccountKey={DEVELOPMENT_KEY};"
        "BlobEndpoint=http://127.0.0.1:1/production;",
    )
    production = _azure("production")
    savepoint = f"{production.layout.job_root}/savepoints/sp-3/_metadata"
    registry = PersistedState(
        next_checkpoint_id=4,
        savepoints=(CompletedCheckpoint(3, CheckpointKind.SAVEPOINT, 1, savepoint, 0, 0, 0),),
    )
    storage = CheckpointStorage(JobStorageLayout(now, "default", "job"))

    check_storage_unchanged(JobRecord(coordinator=registry), storage, LocalPaths(tmp_path))
    assert storage.is_same_job_directory(production)


def test_a_driver_that_cannot_be_started_fails_the_job_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An interpreter the user may not run: the run ended in a traceback, its status left
    Deploying (a newcomer's)."""
    job = ScriptJob(tmp_path, "pass\n")
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-python"))

    assert main(["run", str(job.manifest), "--state-dir", str(job.state_dir)]) == 1

    out = capsys.readouterr().out
    assert (
        f"job failed: the driver could not be started: {tmp_path / 'no-python'}: No such file "
        "or directory\n"
    ) in out
    assert "Traceback" not in out
    status = json.loads((job.job_dir / "status.json").read_text())
    assert status["status"]["phase"] == "Failed"


def test_a_run_names_the_settings_for_the_clusters_pods_it_does_not_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The orders example run locally ignored its executors, memory and volumes without a
    word (a newcomer's); the defaults, and the image (a cluster's only), are not named."""
    job = ScriptJob(tmp_path, "pass\n")
    document = yaml.safe_load(job.manifest.read_text())
    document["spec"] |= {
        "image": "example/orders:1",
        "driver": {"memory": "2g"},
        "executor": {"instances": 2, "cores": 1},
        "checkpointing": {"liveVolumeClaim": "live"},
        "podTemplate": {"spec": {"priorityClassName": "streaming"}},
    }
    job.manifest.write_text(yaml.safe_dump(document))

    main(["run", str(job.manifest), "--state-dir", str(job.state_dir)])

    [note] = [line for line in capsys.readouterr().out.splitlines() if "note:" in line]
    assert note.endswith(
        "note: a local run's Spark runs on this machine (spark.master local[*]): "
        "spec.driver.memory, spec.executor.instances, spec.podTemplate, "
        "spec.checkpointing.liveVolumeClaim are for the cluster's pods and not used here"
    )
    plain = ScriptJob(tmp_path / "plain", "pass\n")
    main(["run", str(plain.manifest), "--state-dir", str(plain.state_dir)])
    assert "note:" not in capsys.readouterr().out
