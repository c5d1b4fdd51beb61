"""A local run's controls from another terminal, driven as a user does: the real CLI as a
subprocess (`run --detach`, `status`, `savepoint`, `stop`, `cancel`, `run --from`), with
a driver that runs the real `run_coordinated` and agent around a stand-in query
(helpers/fake_query.py): real images in real storage, no Spark."""

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.fake_query import INPUT_BATCHES_VARIABLE, write_job
from helpers.script_job import alive, wait_until_gone
from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout
from spark_checkpoint_operator import control_commands, detached_run
from spark_checkpoint_operator.cli import main
from spark_checkpoint_operator.control_protocol import Command, ControlAnswer, Image, Outcome
from spark_checkpoint_operator.detached_run import BACKGROUND_RUN_VARIABLE
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.local_runtime import job_lock
from spark_checkpoint_operator.local_state import default_state_dir, local_paths
from spark_checkpoint_operator.manifest.loading import load_manifest


class LocalJob:
    """A job directory with a manifest and its driver; ``cli`` runs `spark-checkpoint`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        write_job(directory, interval="1s")
        self.job_dir = directory / ".spark-checkpoint" / "default" / "probe"

    def cli(self, *args: str) -> "subprocess.CompletedProcess[str]":
        """``spark-checkpoint ARGS`` in the job's directory: `run` as a process of its own,
        the controls (which only talk to the socket) in this one, to spare a Python start."""
        if args[0] == "run":
            return subprocess.run(
                [sys.executable, "-m", "spark_checkpoint_operator.cli", *args],
                cwd=self.directory,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.chdir(self.directory), redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as end:  # --help, --version
                code = int(end.code or 0)
        return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())

    def runtime_pid(self) -> int:
        return int((self.job_dir / "run.lock").read_text())

    def status(self) -> dict[str, object]:
        result = self.cli("status", "-f", "job.yaml", "--json")
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))

    def status_file(self) -> dict[str, object]:
        return dict(json.loads((self.job_dir / "status.json").read_text())["status"])


@pytest.fixture
def job(tmp_path: Path) -> Iterator[LocalJob]:
    with _local_job(tmp_path) as local:
        yield local


@contextlib.contextmanager
def _local_job(directory: Path) -> Iterator[LocalJob]:
    directory.mkdir(parents=True, exist_ok=True)
    local = LocalJob(directory)
    try:
        yield local
    finally:
        lock = local.job_dir / "run.lock"
        if lock.exists() and (text := lock.read_text().strip()) and alive(int(text)):
            os.kill(int(text), 9)  # a test that failed half-way leaves no run behind


def _detach(job: LocalJob, *options: str, running: bool = True, spelling: str = "--detach") -> None:
    """``run --detach``, then (``running``) until its first checkpoint: before, the query
    may not run all its tasks yet, and a savepoint is declined."""
    started = job.cli("run", "-f", "job.yaml", spelling, *options)
    assert started.returncode == 0, started.stderr
    assert "spark-checkpoint status -f job.yaml" in started.stdout
    assert "spark-checkpoint stop -f job.yaml" in started.stdout
    deadline = time.monotonic() + 60
    before = _last_checkpoint(job)
    while running and _last_checkpoint(job) == before:
        assert time.monotonic() < deadline, "the run never completed a checkpoint"
        time.sleep(0.1)


def _last_checkpoint(job: LocalJob) -> object:
    last = job.status()["lastCheckpoint"]
    return None if last is None else last["id"]  # type: ignore[index]


def _wait_for_checkpoint(job: LocalJob) -> None:
    result = job.cli("savepoint", "-f", "job.yaml", "--timeout", "60")
    assert result.returncode == 0, result.stderr


def test_detached_run_status_savepoint_and_stop(job: LocalJob) -> None:
    _detach(job)
    status = job.status()
    assert status["job"] == "default/probe"
    assert status["runtimePid"] == job.runtime_pid()
    assert status["running"] is True
    _status_in_yaml_and_wide_is_the_same_status(job, status)

    taken = job.cli("savepoint", "-f", "job.yaml")
    assert taken.returncode == 0, taken.stderr
    first, _, path = taken.stdout.strip().partition(": ")
    assert first.startswith("savepoint ") and first.endswith(" completed")
    savepoint_id = int(first.split()[1])
    assert path.endswith(f"/savepoints/sp-{savepoint_id}/_metadata")
    listing = job.cli("list", "-f", "job.yaml", "--json")
    assert any(
        s["kind"] == "savepoint" and s["id"] == savepoint_id
        for s in json.loads(listing.stdout)["snapshots"]
    ), listing.stdout
    assert job.status()["phase"] == "Running"  # the job keeps running

    runtime = job.runtime_pid()
    stopped = job.cli("stop", "-f", "job.yaml")
    assert stopped.returncode == 0, stopped.stderr
    final = int(stopped.stdout.split()[1])
    assert final > savepoint_id
    assert stopped.stdout.splitlines()[-1] == "stopped: the run has ended"
    wait_until_gone(runtime)
    record = job.status_file()
    assert record["phase"] == "Suspended"
    assert record["lastSavepoint"]["id"] == final  # type: ignore[index]
    log = (job.job_dir / "logs" / "runtime.log").read_text()
    assert "Suspended:" in log

    gone = job.cli("status", "-f", "job.yaml")
    assert gone.returncode == 3
    assert gone.stderr.startswith("spark-checkpoint status: no runtime is running for this job")
    assert len(gone.stderr.splitlines()) == 1


def _status_in_yaml_and_wide_is_the_same_status(job: LocalJob, status: dict[str, object]) -> None:
    """`status -o yaml` (the installed script) is `-o json`'s document; `-o wide` is a row
    of it. The job runs on: only what a running job keeps is compared."""
    script = str(Path(sys.executable).parent / "spark-checkpoint")
    as_yaml = subprocess.run(
        [script, "status", "-f", "job.yaml", "-o", "yaml"],
        cwd=job.directory,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert as_yaml.returncode == 0, as_yaml.stderr
    document = yaml.safe_load(as_yaml.stdout)
    assert document.keys() == status.keys()
    for field in ("job", "runtimePid", "driverPid", "phase"):
        assert document[field] == status[field], field
    assert isinstance(document["lastCommittedBatch"], int)
    assert isinstance(document["lastCheckpoint"]["id"], int)

    wide = job.cli("status", "-f", "job.yaml", "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    header, row = (re.split(r"\s{2,}", line) for line in wide.stdout.splitlines())
    assert header == [
        "JOB", "PHASE", "ATTEMPT", "BATCH", "CHECKPOINT", "SAVEPOINT", "IN-PROGRESS",
        "RUNTIME-PID", "DRIVER-PID", "CHECKPOINT-PATH", "SAVEPOINT-PATH",
        "NEXT-PERIODIC-SAVEPOINT", "MESSAGE",
    ]  # fmt: skip
    assert row[:3] == ["default/probe", "Running", str(status["attempt"])]
    assert row[5] == "none"  # no savepoint yet
    assert row[7:9] == [str(status["runtimePid"]), str(status["driverPid"])]
    assert row[9].endswith("/_metadata")
    narrow = job.cli("status", "-f", "job.yaml")
    assert narrow.stdout.splitlines()[0].split() == header[:7]


def test_stop_while_the_driver_restarts_stops_without_a_savepoint_as_ctrl_c_does(
    job: LocalJob,
) -> None:
    """A hostile reviewer's: during a restart's backoff (or a start, a restore) `stop` was
    declined ("not all required tasks are running"), exit 4, where Ctrl-C suspends the job
    without a savepoint; `cancel`, which discards the checkpoints, was all that was left."""
    manifest = job.directory / "job.yaml"
    document = yaml.safe_load(manifest.read_text())
    document["spec"]["restartPolicy"] = {"backoff": "30s", "maxRetries": 5}
    manifest.write_text(yaml.safe_dump(document))
    _detach(job)
    runtime = job.runtime_pid()
    os.kill(int(job.status()["driverPid"]), signal.SIGKILL)  # type: ignore[call-overload]
    deadline = time.monotonic() + 20
    while job.status()["phase"] != "Restarting":
        assert time.monotonic() < deadline, job.status()
        time.sleep(0.1)
    assert job.status()["driverPid"] is None, "the killed driver's pid was shown"

    stopped = job.cli("stop", "-f", "job.yaml")

    assert stopped.returncode == 0, stopped.stderr
    wait_until_gone(runtime)
    record = job.status_file()
    assert record["phase"] == "Suspended", record
    assert record["coordinator"]["checkpoints"], "the checkpoints are kept"  # type: ignore[index]
    newest = max(c["id"] for c in record["coordinator"]["checkpoints"])  # type: ignore[index]
    assert stopped.stdout.startswith(
        "stopping the driver without a savepoint: the query is not running (the next run "
        f"resumes from checkpoint:{newest})\n"
    ), stopped.stdout


def test_cancel_stops_without_a_savepoint(job: LocalJob) -> None:
    _detach(job)
    runtime = job.runtime_pid()
    cancelled = job.cli("cancel", "-f", "job.yaml")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.splitlines()[-1] == "cancelled: the run has ended"
    # What is left to resume from is said (the default policy discards the checkpoints; a
    # newcomer read --help's "the next run resumes from the newest checkpoint"), and that
    # nothing is when the job has no savepoint (a newcomer's: the next run failed on its
    # committed output).
    assert (
        "cancelling: the driver stops without a savepoint; its checkpoints are discarded "
        "(retentionPolicy RetainOnFailure) and it has no savepoint: its next run starts over, "
        "and its sinks refuse the output they committed until it is deleted (`stop` instead "
        "takes a savepoint to resume from)"
    ) in cancelled.stdout
    wait_until_gone(runtime)
    record = job.status_file()
    assert record["phase"] == "Cancelled"
    assert record["lastSavepoint"] is None


def test_a_stop_that_waits_only_for_its_trigger_says_the_run_stops_after_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    answer = ControlAnswer(Outcome.TRIGGERED, "savepoint 9 is in progress", Image(9, None))

    code = control_commands._report(
        answer, Command.STOP, "spark-checkpoint stop", detached=True, timeout=0
    )

    assert code == ExitCode.OK
    assert capsys.readouterr().out == "savepoint 9 triggered; the run stops once it completes\n"


@pytest.mark.parametrize(("timeout", "said"), [(0.01, "0.01"), (60.0, "60"), (1e6, "1000000")])
def test_a_savepoint_past_its_timeout_says_that_timeout_as_given(
    capsys: pytest.CaptureFixture[str], timeout: float, said: str
) -> None:
    """`--timeout 0.01` said "in progress after 0s" (a newcomer's)."""
    answer = ControlAnswer(Outcome.TRIGGERED, "savepoint 612 is in progress")

    control_commands._report(
        answer, Command.SAVEPOINT, "spark-checkpoint savepoint", detached=False, timeout=timeout
    )

    assert capsys.readouterr().err.startswith(
        f"spark-checkpoint savepoint: savepoint 612 is in progress after {said}s; it goes on"
    )


def test_ctrl_c_while_a_detached_run_starts_says_that_the_run_goes_on(job: LocalJob) -> None:
    """A newcomer's: Ctrl-C while `run --detach` waited for the run to answer printed
    nothing and exited 130, which `run --help` calls cancelled; the job ran on."""
    (job.directory / "driver.py").write_text("import time\ntime.sleep(600)\n")  # never answers
    # Ctrl-C as a terminal's: CI runs in a background shell, whose children ignore SIGINT
    # (inherited), and Python then raises no KeyboardInterrupt.
    command = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['spark-checkpoint', 'run', '-f', 'job.yaml', '-d']; "
        "runpy.run_module('spark_checkpoint_operator.cli', run_name='__main__')"
    )
    starting = subprocess.Popen(
        [sys.executable, "-c", command],
        cwd=job.directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    lock = job.job_dir / "run.lock"
    # Once the lock names the background run (this command's own pid is there first).
    while not lock.exists() or lock.read_text().strip() in ("", str(starting.pid)):
        assert time.monotonic() < deadline and starting.poll() is None, starting.communicate()
        time.sleep(0.1)
    starting.send_signal(signal.SIGINT)
    _, err = starting.communicate(timeout=30)

    assert starting.returncode == 130, err
    runtime = job.runtime_pid()
    assert err.splitlines()[-1] == (
        f"spark-checkpoint run: interrupted; the background run (pid {runtime}) goes on (its "
        f"output is in {job.job_dir.resolve() / 'logs' / 'runtime.log'}): `spark-checkpoint "
        "status -f job.yaml` follows it, `spark-checkpoint cancel -f job.yaml` ends it"
    ), err
    assert alive(runtime)


def test_a_savepoint_while_not_running_is_declined_with_the_coordinators_reason(
    job: LocalJob,
) -> None:
    # A driver that never serves an agent: the job stays Deploying, so nothing is triggered.
    # Run in the background without --detach, which would wait a minute for it to answer.
    (job.directory / "driver.py").write_text("import time\ntime.sleep(600)\n")
    run = subprocess.Popen(
        [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "-f", "job.yaml"],
        cwd=job.directory,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while job.cli("status", "-f", "job.yaml").returncode != 0:
        assert time.monotonic() < deadline, "the run never answered"
        time.sleep(0.1)
    declined = job.cli("savepoint", "-f", "job.yaml", "--timeout", "5")
    assert declined.returncode == 4, declined.stderr
    *waiting, said = declined.stderr.splitlines()
    assert said.startswith("spark-checkpoint savepoint: savepoint request declined: ")
    # A decline slower than a moment (a loaded machine) is announced first.
    assert waiting in ([], ["spark-checkpoint savepoint: waiting for the savepoint (--timeout 5s)"])
    # A stop has no savepoint to take either: it stops the driver without one, as Ctrl-C.
    stop = job.cli("stop", "-f", "job.yaml", "--timeout", "5")
    assert stop.returncode == 0, stop.stderr
    run.wait(timeout=60)
    assert job.status_file()["phase"] == "Suspended"


def test_a_wrong_token_and_a_public_control_directory_are_refused(job: LocalJob) -> None:
    _detach(job)
    control = job.job_dir / "control"
    assert (control.stat().st_mode & 0o777, (control / "runtime.sock").stat().st_mode & 0o777) == (
        0o700,
        0o600,
    )
    token = control / "token"
    real = token.read_text()
    token.write_text("not-the-token")
    refused = job.cli("savepoint", "-f", "job.yaml")
    assert refused.returncode == 5
    assert refused.stderr == (
        "spark-checkpoint savepoint: the runtime refused the request: wrong token: not this run's\n"
    )
    token.write_text(real)
    control.chmod(0o755)
    public = job.cli("status", "-f", "job.yaml")
    assert public.returncode == 5
    assert public.stderr.startswith(f"spark-checkpoint status: refusing {control}: it must be")
    control.chmod(0o700)
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0


def test_run_from_a_savepoint_restores_that_savepoint(job: LocalJob) -> None:
    _detach(job)
    first = job.cli("savepoint", "-f", "job.yaml")
    assert first.returncode == 0, first.stderr
    chosen = int(first.stdout.split()[1])
    _wait_for_checkpoint(job)  # a newer image than the chosen one
    assert job.cli("stop", "-f", "job.yaml").returncode == 0
    wait_until_gone(job.runtime_pid())

    malformed = job.cli("run", "-f", "job.yaml", "--from", "savepoint:07")
    assert (malformed.returncode, malformed.stderr) == (
        2,
        "spark-checkpoint run: argument --from: 'savepoint:07' is not savepoint:N with N an id "
        "(0 to 9223372036854775807, no leading 0); for a path of that name, write ./savepoint:07 "
        "(see spark-checkpoint run --help)\n",
    )
    unknown = job.cli("run", "-f", "job.yaml", "--from", "savepoint:999")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith(
        "spark-checkpoint run: --from: savepoint:999 is not a registered savepoint of the job"
    )
    assert len(unknown.stderr.splitlines()) == 1
    # Detached, the refusal is the end of the run's log, whose earlier runs are not shown.
    detached = job.cli("run", "-f", "job.yaml", "--detach", "--from", "savepoint:999")
    assert detached.returncode == 1
    assert detached.stderr == unknown.stderr
    # In the log, each run's part starts with its command line: the refusal is its own.
    log = (job.job_dir / "logs" / "runtime.log").read_text().splitlines()
    starts = [i for i, line in enumerate(log) if " --- spark-checkpoint run -f job.yaml" in line]
    assert len(starts) == 2, log
    assert log[starts[-1]].endswith(
        " --- spark-checkpoint run -f job.yaml --detach --from savepoint:999"
    )
    assert log[starts[-1] + 1 :] == unknown.stderr.splitlines()
    # One in storage that the registry does not list (another registry's, kept): its path,
    # which restores it, is named (a newcomer's); this one's `_metadata` is no JSON, which
    # the path would be refused for: that is said instead.
    _keep_savepoints(job, [999])
    kept = job.cli("run", "-f", "job.yaml", "--from", "savepoint:999")
    assert kept.returncode == 1
    metadata = _job_storage(job) / "savepoints" / "sp-999" / "_metadata"
    assert kept.stderr.endswith(
        "; the one in the job's storage is not this registry's and cannot be restored: "
        f"file://{metadata}: not parseable as JSON (Expecting value: line 1 column 1 (char 0))\n"
    ), kept.stderr
    newest = job.status_file()["lastSavepoint"]["id"]  # type: ignore[index]
    assert newest > chosen  # the stop's savepoint: what a run without --from restores
    ended = job.cli("status", "-f", "job.yaml")
    assert ended.returncode == 3
    recorded = job.status_file()
    assert ended.stderr.endswith(
        f"; the last run left it {recorded['phase']} (attempt 1, batch "
        f"{recorded['lastCommittedBatch']}, checkpoint {recorded['lastCheckpoint']['id']}, "  # type: ignore[index]
        f"savepoint {newest})\n"
    ), ended.stderr
    # A script reads the same fields as of a running one's, with the exit code 3.
    as_json = job.cli("status", "-f", "job.yaml", "-o", "json")
    assert as_json.returncode == 3
    document = json.loads(as_json.stdout)
    assert document["running"] is False
    assert (document["phase"], document["driverPid"], document["inProgress"]) == (
        recorded["phase"],
        None,
        0,
    )
    assert document["lastSavepoint"]["id"] == newest
    assert document["message"].startswith("the last run left it ")
    assert document["message"] in ended.stderr

    # By the path `savepoint` printed: the registry's savepoint, not an external image.
    printed = first.stdout.split()[-1]
    assert printed.endswith(f"/savepoints/sp-{chosen}/_metadata"), first.stdout
    _detach(job, "--from", printed.removeprefix("file://"))
    restored = job.status_file()["restoredFrom"]
    assert restored is not None and restored["source"] == f"savepoint:{chosen}"  # type: ignore[index]
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0


def _checkpoint_paths(job: LocalJob) -> dict[int, str]:
    """The retained checkpoints' _metadata, as ``list -o json`` shows them."""
    listed = job.cli("list", "-f", "job.yaml", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    return {
        row["id"]: row["path"]
        for row in json.loads(listed.stdout)["snapshots"]
        if row["kind"] == "checkpoint" and row["path"]
    }


def test_a_run_on_other_storage_than_its_images_is_refused_before_it_writes(
    job: LocalJob,
) -> None:
    """The manifest's storage changed between runs: the restore found none of the job's
    images and failed it, and its garbage collection failed on them (found by hand). The
    same storage spelled otherwise (a file:// URI) runs. The image it names is the newest
    savepoint (it named the oldest, whose restore replays what the output holds)."""
    _detach(job)
    assert job.cli("savepoint", "-f", "job.yaml").returncode == 0
    assert job.cli("stop", "-f", "job.yaml").returncode == 0
    wait_until_gone(job.runtime_pid())
    manifest = job.directory / "job.yaml"
    original = manifest.read_text()
    elsewhere = job.directory / "elsewhere"
    document = yaml.safe_load(original)
    document["spec"]["checkpointing"]["storage"] = str(elsewhere)
    manifest.write_text(yaml.safe_dump(document))

    refused = job.cli("run", "-f", "job.yaml")

    assert refused.returncode == 1
    last_savepoint = job.status_file()["lastSavepoint"]
    assert isinstance(last_savepoint, dict)
    assert refused.stderr == (
        "spark-checkpoint run: spec.checkpointing.storage: the job's checkpoints and "
        f"savepoints are not in {elsewhere}/default/probe but in {_job_storage(job)}, where "
        "it ran before; set it back, or start the job afresh on this storage from its newest "
        "savepoint there: "
        f"delete its state {job.job_dir} and run --from {last_savepoint['path']}\n"
    )
    assert not elsewhere.exists()
    document["spec"]["checkpointing"]["storage"] = str(_job_storage(job).parents[1].as_uri())
    manifest.write_text(yaml.safe_dump(document))
    _detach(job)
    assert job.cli("stop", "-f", "job.yaml").returncode == 0


def test_run_from_or_start_from_the_path_of_a_retained_checkpoint(
    job: LocalJob, tmp_path: Path
) -> None:
    """Flink's ``run -s <checkpoint path>``: the job's own retained checkpoint by its path
    (however spelled) is its registry's, one its registry does not list is refused (its
    garbage collection deletes it); one in a copy of the storage elsewhere restores as
    another image, and another job starts from it as its initialSavepointPath."""
    storage = job.directory / "storage"  # a plain path, where --from's become URIs
    manifest = yaml.safe_load((job.directory / "job.yaml").read_text())
    manifest["spec"]["checkpointing"]["retentionPolicy"] = "RetainOnCancellation"
    manifest["spec"]["checkpointing"]["storage"] = str(storage)
    (job.directory / "job.yaml").write_text(yaml.safe_dump(manifest))
    _detach(job)
    _wait_for_checkpoint(job)
    while len(_checkpoint_paths(job)) < 2:  # the newest is what a run restores
        time.sleep(0.2)
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0
    wait_until_gone(job.runtime_pid())
    paths = _checkpoint_paths(job)
    chosen = min(paths)
    assert paths[chosen].endswith(f"/default/probe/chk-{chosen}/_metadata"), paths

    (job.directory / "linked").symlink_to(storage)
    linked = paths[chosen].removeprefix("file://").removeprefix(str(storage))
    _detach(job, "--from", f"{job.directory}/linked{linked}")
    restored = job.status_file()["restoredFrom"]
    assert restored is not None and restored["source"] == f"checkpoint:{chosen}"  # type: ignore[index]
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0
    wait_until_gone(job.runtime_pid())

    retained = min(_checkpoint_paths(job))
    unregistered = storage / "default" / "probe" / f"chk-{retained + 1000}"
    shutil.copytree(storage / "default" / "probe" / f"chk-{retained}", unregistered)
    refused = job.cli("run", "-f", "job.yaml", "--from", str(unregistered))
    assert refused.returncode == 1
    assert "a checkpoint in this job's own storage that its registry does not list" in (
        refused.stderr
    )
    shutil.rmtree(unregistered)
    # Not there (discarded, or never): said so, not that the registry does not list it (a
    # newcomer's, who pasted the path of a checkpoint retention had deleted).
    missing = job.cli("run", "-f", "job.yaml", "--from", str(unregistered))
    assert missing.returncode == 1
    assert missing.stderr.startswith(
        f"spark-checkpoint run: --from: the checkpoint cannot be restored: "
        f"{unregistered.as_uri()}/_metadata"
    ), missing.stderr

    backup = tmp_path / "backup"
    shutil.copytree(storage / "default", backup / "default")
    copied = max(_checkpoint_paths(job))
    elsewhere = backup / "default" / "probe" / f"chk-{copied}"
    _detach(job, "--from", str(elsewhere))
    restored = job.status_file()["restoredFrom"]
    assert restored is not None and restored["source"] == (  # type: ignore[index]
        f"external:{elsewhere.as_uri()}/_metadata"
    )
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0
    wait_until_gone(job.runtime_pid())

    # As Flink's initialSavepointPath: another job starts from the retained checkpoint.
    manifest["metadata"]["name"] = "fork"
    manifest["spec"]["restore"] = {"initialSavepointPath": str(elsewhere)}
    (job.directory / "fork.yaml").write_text(yaml.safe_dump(manifest))
    started = job.cli("run", "-f", "fork.yaml", "--detach")
    assert started.returncode == 0, started.stderr
    fork = job.directory / ".spark-checkpoint" / "default" / "fork" / "status.json"
    restored = json.loads(fork.read_text())["status"]["restoredFrom"]
    assert restored is not None and restored["source"] == f"external:{elsewhere}/_metadata"
    assert job.cli("cancel", "-f", "fork.yaml").returncode == 0


def test_an_unrestorable_image_is_refused_before_the_driver_starts(job: LocalJob) -> None:
    _detach(job)
    taken = job.cli("savepoint", "-f", "job.yaml")
    chosen = int(taken.stdout.split()[1])
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0
    wait_until_gone(job.runtime_pid())
    storage = job.directory / ".spark-checkpoint" / "storage" / "default" / "probe"
    damaged = next((storage / "savepoints" / f"sp-{chosen}" / "files").rglob("commits/*"))
    damaged.write_text("changed")
    logs_before = sorted((job.job_dir / "logs").iterdir())

    refused = job.cli("run", "-f", "job.yaml", "--from", f"savepoint:{chosen}")
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        f"spark-checkpoint run: --from: savepoint:{chosen} cannot be restored:"
    )
    assert len(refused.stderr.splitlines()) == 1
    assert sorted((job.job_dir / "logs").iterdir()) == logs_before  # no driver started
    path = job.cli("run", "-f", "job.yaml", "--from", str(job.directory / "nowhere"))
    assert path.returncode == 1
    assert (
        "is not savepoint:N, checkpoint:N or the path of a checkpoint or a savepoint: not where"
        in path.stderr
    )
    # Storage's error names the path: the refusal does not name it twice.
    moved = storage / "savepoints" / f"sp-{chosen + 100}"
    missing = job.cli("run", "-f", "job.yaml", "--from", str(moved))
    assert missing.returncode == 1
    assert missing.stderr == (
        "spark-checkpoint run: --from: the savepoint cannot be restored: "
        f"{moved.as_uri()}/_metadata: no such file\n"
    )


def test_a_run_that_holds_the_job_but_does_not_answer_yet_is_told_as_starting(
    job: LocalJob,
) -> None:
    """A run stuck claiming storage that did not answer: `status` said "the job has not
    run with this state directory" while `run` said it was already running (a reviewer's)."""
    manifest = load_manifest(job.directory / "job.yaml")
    paths = local_paths(manifest, default_state_dir(job.directory / "job.yaml"))
    paths.logs_dir.mkdir(parents=True)

    with job_lock(paths, f"{manifest.namespace}/{manifest.name}"):
        told = {command: job.cli(command, "-f", "job.yaml") for command in ("status", "stop")}
        document = job.cli("status", "-f", "job.yaml", "-o", "json")
    paths.lock_file.unlink()  # this process is named there: not a run to clean up

    said = (
        f"a run of the job (pid {os.getpid()}) holds it and does not answer (starting, or "
        f"stuck; its output is in {paths.logs_dir / 'runtime.log'}); `kill {os.getpid()}` "
        "ends it"
    )
    for command, result in told.items():
        assert result.returncode == 3, (command, result.stderr)
        assert result.stderr.endswith(f"; {said}\n"), result.stderr
    assert document.returncode == 3
    assert json.loads(document.stdout) | {"job": None} == {
        "job": None,
        "phase": None,
        "attempt": None,
        "runtimePid": os.getpid(),
        "driverPid": None,
        "lastCommittedBatch": None,
        "lastCheckpoint": None,
        "lastSavepoint": None,
        "inProgress": 0,
        "message": said,
        "nextPeriodicSavepoint": None,
        "running": False,
    }
    after = job.cli("status", "-f", "job.yaml")
    assert after.stderr.endswith("; the job has not run with this state directory\n")


def test_no_runtime_and_no_job_are_one_line_errors(job: LocalJob) -> None:
    for command in ("status", "savepoint", "stop", "cancel"):
        result = job.cli(command, "-f", "job.yaml")
        assert result.returncode == 3, (command, result.stderr)
        assert len(result.stderr.splitlines()) == 1
        if command == "status":
            assert result.stderr.endswith("; the job has not run with this state directory\n")
        unnamed = job.cli(command)
        assert unnamed.returncode == 2
        assert unnamed.stderr == (
            f"spark-checkpoint {command}: name the job: -f FILE, or --job NAME (and --namespace)\n"
        )
        # A newcomer's: -f won silently, so `cancel -f a.yaml --job b` cancelled a.
        for named in (["--job", "other"], ["-n", "elsewhere"]):
            both = job.cli(command, "-f", "job.yaml", *named)
            assert (both.returncode, both.stderr) == (
                2,
                f"spark-checkpoint {command}: -f FILE names the job: do not combine it with "
                "--namespace or --job\n",
            )
        # A state directory that is a file: a traceback of NotADirectoryError (a reviewer's);
        # then exit 3 or 1 for what is a bad option (a newcomer's).
        (job.directory / "a-file").touch()
        in_a_file = job.cli(command, "-f", "job.yaml", "--state-dir", "a-file")
        assert (in_a_file.returncode, in_a_file.stderr) == (
            2,
            f"spark-checkpoint {command}: argument --state-dir: 'a-file' is not a directory "
            f"(see spark-checkpoint {command} --help)\n",
        )
    detached = job.cli("run", "-d", "-f", "job.yaml", "--state-dir", "a-file")
    assert (detached.returncode, detached.stderr) == (
        2,
        "spark-checkpoint run: argument --state-dir: 'a-file' is not a directory "
        "(see spark-checkpoint run --help)\n",
    )


@pytest.mark.parametrize("timeout", ["-1", "86401", "nan", "soon"])
def test_a_wait_out_of_range_is_a_one_line_usage_error(job: LocalJob, timeout: str) -> None:
    result = job.cli("savepoint", "-f", "job.yaml", "--timeout", timeout)
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"spark-checkpoint savepoint: argument --timeout: {timeout!r} is not a number of "
        "seconds from 0 up to 86400"
    ), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_detached_savepoint_prints_its_id_a_detached_disposal_returns_and_stop_drain_stops(
    job: LocalJob,
) -> None:
    _detach(job)
    triggered = job.cli("savepoint", "-f", "job.yaml", "--detached")
    assert triggered.returncode == 0, triggered.stderr
    words = triggered.stdout.split()
    # Returned at its trigger; a savepoint this small may be complete already.
    assert words[0] == "savepoint" and words[2] in ("triggered;", "completed:"), words
    # "0: only until it is triggered" exited 1, as a savepoint that did not complete in
    # time (a newcomer's).
    at_once = job.cli("savepoint", "-f", "job.yaml", "--timeout", "0")
    assert at_once.returncode == 0, at_once.stderr
    assert at_once.stdout.split()[2] in ("triggered;", "completed:"), at_once.stdout
    # The same for a disposal: returned once the run took it (it exited 1). The first
    # savepoint is the job's newest image, kept, until the second completes.
    second = int(at_once.stdout.split()[1])
    deadline = time.monotonic() + 60
    while (job.status()["lastSavepoint"] or {}).get("id") != second:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, job.status()
        time.sleep(0.1)
    disposal = job.cli(
        "savepoint", "-f", "job.yaml", "--timeout", "0", "-d", f"savepoint:{words[1]}"
    )
    assert disposal.returncode == 0, disposal.stderr
    assert disposal.stdout.startswith(
        (f"the disposal of savepoint {words[1]} is requested", f"savepoint {words[1]} disposed of")
    ), disposal.stdout
    runtime = job.runtime_pid()
    drained = job.cli("stop", "-f", "job.yaml", "--drain")
    assert drained.returncode == 0, drained.stderr
    wait_until_gone(runtime)
    saved = {s["id"] for s in job.status_file()["savepointHistory"]}  # type: ignore[attr-defined]
    assert int(drained.stdout.split()[1]) in saved
    assert int(words[1]) not in saved
    log = (job.job_dir / "logs" / "runtime.log").read_text()
    assert "`spark-checkpoint stop --drain`: draining the input, then taking a savepoint" in log


@pytest.mark.parametrize("spelling", ["-d", "--detached"])
def test_run_detaches_under_flinks_spellings(job: LocalJob, spelling: str) -> None:
    """`flink run -d` and `--detached`. The background run is started with the same
    arguments, and runs: taking `--detach` out of them missed other spellings, and each
    run detached again, a process each time for ever."""
    _detach(job, spelling=spelling, running=False)
    runtime = job.runtime_pid()
    # --timeout 0 does not wait, as `savepoint --timeout 0` does not: it exited 1, "the
    # run has not ended within 0s", for a cancel the run took (a newcomer's).
    cancelled = job.cli("cancel", "-f", "job.yaml", "--timeout", "0")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "not ended" not in cancelled.stderr
    wait_until_gone(runtime)
    assert job.status_file()["phase"] == "Cancelled"


def test_a_second_detached_run_of_a_running_job_is_refused(job: LocalJob) -> None:
    _detach(job, running=False)
    first = job.runtime_pid()
    second = job.cli("run", "-f", "job.yaml", "--detach")
    assert second.returncode == 1
    # The background run holds the lock its command handed over, and names itself there.
    assert f"job default/probe is already running (pid {first}, " in second.stderr
    assert "runs in the background" not in second.stdout
    log = (job.job_dir / "logs" / "runtime.log").read_text()
    assert "already running" not in log, "the refused run wrote into the running job's log"
    assert job.status()["runtimePid"] == first
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0


def test_two_detached_runs_started_together_one_runs_the_other_is_refused_alone(
    job: LocalJob,
) -> None:
    """Both checked the job's lock before either background run took it: the refused one
    showed the other run's first lines as its own before its refusal (a newcomer's)."""
    command = [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "-f", "job.yaml", "-d"]
    runs = [
        subprocess.Popen(
            command, cwd=job.directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [(run.communicate(timeout=120), run.returncode) for run in runs]
    [((started_out, _), started_code), ((refused_out, refused_err), refused_code)] = sorted(
        outputs, key=lambda output: output[1]
    )
    assert (started_code, refused_code) == (0, 1)
    assert "runs in the background" in started_out
    assert refused_out == ""
    assert refused_err.startswith("spark-checkpoint run: job default/probe is already running")
    assert refused_err.count("\n") == 1, refused_err
    log = (job.job_dir / "logs" / "runtime.log").read_text()
    assert "already running" not in log, "the refused run wrote into the running job's log"
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0


def test_a_background_run_handed_another_file_than_its_lock_is_refused(
    job: LocalJob, tmp_path: Path
) -> None:
    """Only the job's own lock, open in the command that started it, is taken over."""
    lock = job.job_dir / "run.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # an earlier run's
    with (tmp_path / "other").open("w") as other:
        descriptor = other.fileno()
        refused = subprocess.run(
            [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "-f", "job.yaml"],
            cwd=job.directory,
            env={**os.environ, BACKGROUND_RUN_VARIABLE: str(descriptor)},
            pass_fds=(descriptor,),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"spark-checkpoint run: the job's state directory: cannot open the lock {lock}: "
        f"descriptor {descriptor} handed over is another file\n"
    )


def test_the_lock_names_the_background_run_once_it_is_started(job: LocalJob) -> None:
    """Not the command that started it, which exits: until the background run named itself,
    a run refused meanwhile named a pid that was soon gone."""
    manifest = load_manifest(job.directory / "job.yaml")
    paths = local_paths(manifest, default_state_dir(job.directory / "job.yaml"))
    paths.logs_dir.mkdir(parents=True)
    with job_lock(paths, f"{manifest.namespace}/{manifest.name}") as lock:
        background, _ = detached_run._start_background_run(paths, ["--version"], lock)
        named = paths.lock_file.read_text()
    paths.lock_file.unlink()  # this process may be named there: not a run to clean up
    assert background.wait(timeout=60) == 0
    assert named == f"{background.pid}\n"


def test_a_run_whose_output_is_closed_stops_with_a_savepoint(job: LocalJob) -> None:
    """``spark-checkpoint run -f job.yaml | head -3``: before, the run died of the closed
    pipe (exit 141), its driver with it and its status left Running."""
    run = subprocess.Popen(
        [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "-f", "job.yaml"],
        cwd=job.directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    for line in run.stdout:
        if re.search(r"checkpoint \d+ complete", line):
            break
    run.stdout.close()  # as head does once it has its lines

    assert run.wait(timeout=60) == 0, run.stderr.read() if run.stderr else ""
    status = job.status_file()
    assert status["phase"] == "Suspended"
    assert status["lastSavepoint"] is not None
    # The lines go on to standard error, the terminal a pipeline leaves the run.
    assert run.stderr is not None
    told = run.stderr.read()
    assert (
        "the output was closed: taking a savepoint, then stopping (Ctrl-C twice to cancel)"
    ) in told
    assert "Suspended: this run took" in told.splitlines()[-1]
    assert "Traceback" not in told


@pytest.mark.parametrize("command", ["status", "savepoint", "stop", "cancel"])
@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--job", "../../elsewhere"], "--job: '../../elsewhere' is not a DNS-1123 subdomain"),
        (["--job", "x", "-n", "a/../.."], "--namespace: 'a/../..' is not a DNS-1123 label"),
    ],
)
def test_a_job_named_by_options_is_judged_before_it_names_a_path(
    job: LocalJob, command: str, options: list[str], said: str
) -> None:
    # Before, status read a status file wherever the names led (outside the state directory).
    result = job.cli(command, *options)

    assert result.returncode == 2
    assert result.stderr.startswith(f"spark-checkpoint {command}: {said}"), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_stop_drain_of_bounded_input_ends_with_its_savepoint(
    job: LocalJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain waits for the input to run out, and then the final checkpoint of bounded
    input came first: the job Finished, its savepoint was given up and `stop` said
    'savepoint N failed', exit 1, on the user guide's own example (a newcomer)."""
    # 10 s of input (a batch every 0.2 s): the stop must come before it runs out, after the
    # first checkpoint (with 5 s, 4x faster batches let the input end first: Finished).
    monkeypatch.setenv(INPUT_BATCHES_VARIABLE, "50")
    _detach(job)
    runtime = job.runtime_pid()
    drained = job.cli("stop", "-f", "job.yaml", "--drain", "--timeout", "60")
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert drained.stdout.splitlines()[-1] == "stopped: the run has ended"
    wait_until_gone(runtime)
    record = job.status_file()
    assert record["phase"] == "Suspended"
    assert record["lastSavepoint"]["batch"] == 49  # type: ignore[index]
    # The run's line names the request (it said "(cli-3b154906)", which meant nothing).
    log = (job.job_dir / "logs" / "runtime.log").read_text()
    assert re.search(
        r"savepoint \d+ complete \(stop --drain request [0-9a-f]{8}\): batch 49,", log
    ), log

    # Resumed, its input done, it finishes; asked to run again, it says how to start from
    # the savepoint it has (of savepoints only when it has one: a newcomer's).
    finished = job.cli("run", "-f", "job.yaml")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    again = job.cli("run", "-f", "job.yaml")
    assert again.returncode == 1
    assert "has Finished and is not run again" in again.stderr
    assert "; to run it on from one of its savepoints instead, copy the savepoint's" in (
        again.stderr
    )
    assert "delete its state and storage but not its output, and run --from" in again.stderr
    # What it says works: the savepoint copied out, the job's state and storage deleted.
    savepoint = job.status_file()["lastSavepoint"]["id"]  # type: ignore[index]
    copy = job.directory / "kept" / "default" / "probe" / "savepoints" / f"sp-{savepoint}"
    shutil.copytree(_job_storage(job) / "savepoints" / f"sp-{savepoint}", copy)
    shutil.rmtree(job.job_dir)
    shutil.rmtree(_job_storage(job))
    resumed = job.cli("run", "-f", "job.yaml", "--from", str(copy))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"restoring external:file://{copy}/_metadata (--from)" in resumed.stdout
    assert job.status_file()["phase"] == "Finished"


def test_stop_says_what_it_waits_for_and_ctrl_c_leaves_the_stop_going_on(
    job: LocalJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stop --drain` waited in silence as long as the input lasted, and Ctrl-C on it exited
    130 without a word, as if the stop had been called off (a newcomer's). In-process, the
    run's answer played by a stand-in: a `stop` subprocess ignored the test's SIGINT in CI,
    which runs in a background shell (SIGINT ignored, inherited; Python then installs no
    KeyboardInterrupt handler), as a script's background job ignores the script's Ctrl-C."""
    (job.job_dir / "control").mkdir(parents=True, mode=0o700)
    (job.job_dir / "control" / "token").write_text("token")

    def slow_then_interrupted(*_args: object, **_options: object) -> None:
        deadline = time.monotonic() + 60  # the notice comes after 2 s, later under load
        while "waiting" not in sys.stderr.getvalue():  # job.cli captures it
            assert time.monotonic() < deadline, "no waiting notice"
            time.sleep(0.05)
        raise KeyboardInterrupt  # Ctrl-C while the command waits

    monkeypatch.setattr(control_commands, "request", slow_then_interrupted)

    result = job.cli("stop", "-f", "job.yaml", "--drain")

    assert result.returncode == 130
    assert result.stderr == (
        "spark-checkpoint stop: waiting for the job to process its available input and for "
        "the savepoint (--timeout 600s), then for the run to end\n"
        "\nspark-checkpoint stop: interrupted; the stop goes on in the run "
        "(`spark-checkpoint status -f job.yaml` follows it)\n"
    )


def test_a_stop_answered_without_a_savepoint_announces_no_savepoint_wait(
    job: LocalJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answered at once "stopping the driver without a savepoint", it went on to wait for
    the run to end under "waiting for the savepoint (--timeout 600s)" (an S3 user's)."""
    (job.job_dir / "control").mkdir(parents=True, mode=0o700)
    (job.job_dir / "control" / "token").write_text("token")
    said = "stopping the driver without a savepoint: the query is not running"
    monkeypatch.setattr(
        control_commands,
        "request",
        lambda *_args, **_options: ControlAnswer(Outcome.OK, said),
    )

    def ends_late(*_args: object) -> bool:
        time.sleep(control_commands.WAITING_NOTICE_SECONDS + 1)
        return True

    monkeypatch.setattr(control_commands, "wait_until_gone", ends_late)

    result = job.cli("stop", "-f", "job.yaml")

    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{said}\nstopped: the run has ended\n"


def test_an_answer_within_a_moment_is_not_announced(
    job: LocalJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        control_commands,
        "request",
        lambda *_args, **_options: ControlAnswer(Outcome.DECLINED, "savepoint request declined: x"),
    )

    result = job.cli("savepoint", "-f", "job.yaml")

    assert (result.returncode, result.stderr) == (
        4,
        "spark-checkpoint savepoint: savepoint request declined: x\n",
    )


def _job_storage(job: LocalJob) -> Path:
    return job.directory / ".spark-checkpoint" / "storage" / "default" / "probe"


def _keep_savepoints(job: LocalJob, ids: Iterable[int]) -> None:
    """Savepoints of another registry of the job, which a registry never writes over."""
    for savepoint_id in ids:
        kept = _job_storage(job) / "savepoints" / f"sp-{savepoint_id}"
        kept.mkdir(parents=True)
        (kept / "_metadata").write_text("the old registry's")


def test_a_registry_the_storage_was_handed_over_to_numbers_its_snapshots_above_those_kept(
    job: LocalJob,
) -> None:
    """A newcomer's: after handing the storage over, the new registry's ids started at 1
    and met the savepoints the old one kept, and each savepoint that met one failed (its
    `sp-N` exists already), Ctrl-C's too. Its ids now continue above them."""
    layout = JobStorageLayout(_job_storage(job).parent.parent.as_uri(), "default", "probe")
    CheckpointStorage(layout).claim(StorageOwner("registry-old", "the old registry"))
    _keep_savepoints(job, [1, 2, 40])
    _detach(job)

    taken = job.cli("savepoint", "-f", "job.yaml")

    assert taken.returncode == 0, taken.stderr
    assert int(taken.stdout.split()[1]) > 40, taken.stdout
    assert job.status()["lastCheckpoint"]["id"] > 40  # type: ignore[index]
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0
    for savepoint_id in (1, 2, 40):
        kept = _job_storage(job) / "savepoints" / f"sp-{savepoint_id}" / "_metadata"
        assert kept.read_text() == "the old registry's"


@pytest.fixture
def job_in_a_directory_with_a_space(tmp_path: Path) -> Iterator[LocalJob]:
    with _local_job(tmp_path / "my project") as local:
        yield local


def test_a_job_in_a_directory_with_a_space_keeps_its_storage_there_and_restores_by_path(
    job_in_a_directory_with_a_space: LocalJob, tmp_path: Path
) -> None:
    """The default storage's URI was percent-encoded (`Path.as_uri`), and fsspec takes a
    file URI's path as it is: a run in `my project` stored its checkpoints in
    `my%20project`, beside the job's directory; `run --from` a path with a space named no
    file (a reviewer's, then tried by hand)."""
    job = job_in_a_directory_with_a_space
    (job.directory / "my state").mkdir()
    started = job.cli("run", "-d", "-f", "job.yaml", "--state-dir", "my state")
    assert started.returncode == 0, started.stderr
    # Quoted, as a shell takes it (a reviewer's: copied, `sp ace/job.yaml` was two words).
    assert "spark-checkpoint stop -f job.yaml --state-dir 'my state'" in started.stdout
    quoted = job.cli("stop", "-f", "job.yaml", "--state-dir", "my state")
    assert quoted.returncode == 0, quoted.stderr
    _detach(job)
    stopped = job.cli("stop", "-f", "job.yaml")
    assert stopped.returncode == 0, stopped.stderr
    savepoint = stopped.stdout.split(": ", 1)[1].splitlines()[0].removeprefix("file://")
    storage = job.directory / ".spark-checkpoint" / "storage" / "default" / "probe"
    assert Path(savepoint).parent.parent == storage / "savepoints", savepoint
    assert not (tmp_path / "my%20project").exists()
    wait_until_gone(job.runtime_pid())

    _detach(job, "--from", str(Path(savepoint).parent))

    restored = job.status_file()["restoredFrom"]
    assert restored["source"] == f"savepoint:{Path(savepoint).parent.name[3:]}", restored  # type: ignore[index]
    assert job.cli("cancel", "-f", "job.yaml").returncode == 0
    log = (job.job_dir / "logs" / "runtime.log").read_text()
    # The stop's savepoint is the newest image: restored by name, it is no other's stand-in
    # (a newcomer's: "instead of the newest image" was said of the newest).
    assert f"restoring {restored['source']} (--from)\n" in log  # type: ignore[index]

    # A job with no images of its own has no newest image to restore instead.
    with _local_job(tmp_path / "fresh") as fresh:
        _detach(fresh, "--from", str(Path(savepoint).parent))
        assert fresh.cli("cancel", "-f", "job.yaml").returncode == 0
    log = (fresh.job_dir / "logs" / "runtime.log").read_text()
    assert f"restoring external:file://{savepoint} (--from)\n" in log, log


def test_checkpoints_an_earlier_version_left_percent_encoded_are_named_not_lost(
    job_in_a_directory_with_a_space: LocalJob, tmp_path: Path
) -> None:
    """Runs before that fix kept them in `my%20project`: a new run would start without
    them (its registry naming images it cannot find), so it is refused, saying where
    they are and where they go."""
    left = tmp_path / "my%20project" / ".spark-checkpoint" / "storage" / "default" / "probe"
    (left / "chk-3").mkdir(parents=True)

    refused = job_in_a_directory_with_a_space.cli("run", "-f", "job.yaml")

    target = tmp_path / "my project" / ".spark-checkpoint" / "storage" / "default" / "probe"
    assert refused.returncode != 0
    assert refused.stderr == (
        f"spark-checkpoint run: {left} holds this job's checkpoints and savepoints from an "
        "earlier version, which named the default storage's directory percent-encoded: "
        f"move it to {target} and run again\n"
    )
    target.parent.mkdir(parents=True)
    left.rename(target)
    _detach(job_in_a_directory_with_a_space, running=False)
    assert job_in_a_directory_with_a_space.cli("cancel", "-f", "job.yaml").returncode == 0


def test_a_registry_an_earlier_version_wrote_percent_encoded_runs_on_its_moved_storage(
    job_in_a_directory_with_a_space: LocalJob,
) -> None:
    """Versions before local_uri registered the images' paths percent-encoded; once their
    storage is moved where the run asks, the check that the images are in the job's
    storage must not refuse the job over the spelling."""
    job = job_in_a_directory_with_a_space
    _detach(job)
    assert job.cli("stop", "-f", "job.yaml").returncode == 0
    wait_until_gone(job.runtime_pid())
    status_file = job.job_dir / "status.json"
    raw = f"file://{job.directory}"
    text = status_file.read_text()
    assert raw in text
    status_file.write_text(text.replace(raw, job.directory.as_uri()))

    _detach(job)

    assert job.cli("cancel", "-f", "job.yaml").returncode == 0


@pytest.mark.parametrize(
    ("sent", "said", "label"),
    [
        (signal.SIGTERM, "terminated (SIGTERM)", "sigterm"),
        # A closed terminal or a dropped SSH session: the run died at once, without a
        # savepoint or a line, its status Running (a hostile reviewer's).
        (signal.SIGHUP, "hung up (SIGHUP)", "sighup"),
    ],
)
def test_sigterm_to_a_detached_run_takes_a_savepoint_labelled_so_and_suspends(
    job: LocalJob, sent: signal.Signals, said: str, label: str
) -> None:
    """`kill` of a detached run (or a service manager stopping it) stops it as Ctrl-C
    does; its savepoint was labelled "ctrl-c" in the log and the status."""
    _detach(job)
    runtime = job.runtime_pid()

    os.kill(runtime, sent)

    wait_until_gone(runtime)
    log = (job.job_dir / "logs" / "runtime.log").read_text()
    assert f"{said}: taking a savepoint, then stopping" in log, log
    assert re.search(rf"savepoint \d+ complete \({label}\): batch \d+", log), log
    record = job.status_file()
    assert record["phase"] == "Suspended"
    assert record["lastSavepoint"]["label"] == label  # type: ignore[index]


def test_a_ctrl_c_whose_savepoint_fails_says_the_job_runs_on_and_the_next_tries_again(
    job: LocalJob,
) -> None:
    """A newcomer's, after handing the storage over: the new registry's savepoint ids met
    the savepoints the old one left (kept: another registry's, never written over), so
    Ctrl-C's savepoint failed, and the run went on for minutes with no word that it would;
    the next Ctrl-C then cancelled it (discarding its checkpoints). Now it says the job
    runs on, and the next Ctrl-C asks for a stop again. (Ids now continue above the
    savepoints in storage when the driver started: these appear after.)"""
    run = subprocess.Popen(
        [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "-f", "job.yaml"],
        cwd=job.directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert run.stdout is not None
    lines: list[str] = []

    def until(text: str) -> str:
        for line in run.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip("\n").split(" ", 2)[-1])
            if text in line:
                return lines[-1]
        raise AssertionError(f"no line with {text!r}: {lines}")

    try:
        until(" complete: batch")
        _keep_savepoints(job, range(1, 500))  # every id this run can reach
        for _ in range(2):  # the first Ctrl-C, and the one that tries again
            run.send_signal(signal.SIGINT)
            until("taking a savepoint, then stopping")
            failed = until(" failed: ")
            assert re.fullmatch(
                r"savepoint \d+ failed: .*exists already, left by another .*", failed
            )
            assert until("not stopping") == (
                "not stopping: the job keeps running without the savepoint (Ctrl-C to try "
                "again; twice to stop without a savepoint)"
            )
        run.send_signal(signal.SIGINT)
        until("taking a savepoint, then stopping")
        run.send_signal(signal.SIGINT)
        until("interrupted again: stopping the driver without a savepoint")
        rest = run.communicate(timeout=60)[0]
        assert run.returncode == 130, "\n".join([*lines, rest])
        # A second Ctrl-C's routine: the driver stops before it hears of the abort.
        assert "did not take the abort" not in rest, rest
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate()


def test_a_detached_run_whose_log_cannot_be_opened_names_the_log(job: LocalJob) -> None:
    """It named the job's state directory (a reviewer's)."""
    log = job.job_dir / "logs" / "runtime.log"
    log.mkdir(parents=True)

    refused = job.cli("run", "-f", "job.yaml", "-d")

    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"spark-checkpoint run: cannot open the job's log {log}: Is a directory\n"
    )


@pytest.mark.parametrize(
    "savepoints", [{"interval": "2s"}, {"schedule": "*/2 * * * * ?"}], ids=["interval", "schedule"]
)
def test_a_local_run_takes_periodic_savepoints(job: LocalJob, savepoints: dict[str, str]) -> None:
    """spec.savepoints.interval and .schedule (a Quartz cron expression: every even second)
    apply to `spark-checkpoint run` as on Kubernetes."""
    manifest = yaml.safe_load((job.directory / "job.yaml").read_text())
    manifest["spec"]["savepoints"] = savepoints
    (job.directory / "job.yaml").write_text(yaml.safe_dump(manifest))
    _detach(job)

    def periodic() -> list[dict[str, Any]]:
        registry: Any = job.status_file()["coordinator"]
        return [s for s in registry["savepoints"] if s["label"] == "periodic"]

    deadline = time.monotonic() + 60
    while len(periodic()) < 2:
        assert time.monotonic() < deadline, f"periodic savepoints taken: {periodic()}"
        time.sleep(0.2)

    first, second = (datetime.fromisoformat(s["triggerTime"]) for s in periodic()[:2])
    if "interval" in savepoints:
        assert second - first >= timedelta(seconds=2)
    else:  # each at or after a time of its own: two even seconds apart at least
        assert second.timestamp() // 2 > first.timestamp() // 2
    stopped = job.cli("stop", "-f", "job.yaml")
    assert stopped.returncode == 0, stopped.stderr
