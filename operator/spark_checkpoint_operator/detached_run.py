"""``spark-checkpoint run --detach``: the same run in the background, its output in a log;
the command returns once the run answers on its control socket."""

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import time

from spark_checkpoint.storage import SymbolicLinkError
from spark_checkpoint_operator.control import ControlPaths, ControlRefused, NoRuntime, request
from spark_checkpoint_operator.control_protocol import Command, RuntimeStatus
from spark_checkpoint_operator.coordinator import JobPhase, TerminalOutcome
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.local_runtime import (
    RunRefused,
    job_lock,
    load_runnable_manifest,
    name_lock_holder,
)
from spark_checkpoint_operator.local_state import (
    LocalPaths,
    UnsafeStateDirectory,
    default_state_dir,
    local_paths,
    make_private_job_directory,
    open_state_file,
)
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.run_display import wall_clock

# Set for the background run, to the descriptor of the job's lock it is handed: it runs,
# whatever its arguments say (-d, --detach or --detached; taking them out of its arguments
# missed a spelling, and each run detached again, a process each time for ever).
BACKGROUND_RUN_VARIABLE = "SPARK_CHECKPOINT_BACKGROUND_RUN"
# Python's start and the run's checks (the manifest, --from's image): no Spark yet.
ANSWER_TIMEOUT_SECONDS = 60.0
# The phases the detached run is waited through: no driver's agent has answered yet (a
# driver that failed before it did restarts: Restarting), or the run is ending (its exit
# and last lines are the answer).
WAITED_PHASES = frozenset(
    {
        JobPhase.PENDING.value,
        JobPhase.DEPLOYING.value,
        JobPhase.RESTARTING.value,
        *(o.value for o in TerminalOutcome),
    }
)
POLL_SECONDS = 0.1
LOG_LINES_SHOWN = 5


def run_detached(args: argparse.Namespace, argv: list[str]) -> int:
    """Start ``spark-checkpoint run`` with ``argv`` in a new session, as the background
    run (`BACKGROUND_RUN_VARIABLE`); 0 once it answers, else its exit code (or 1) with the
    end of its log."""
    try:
        manifest = load_runnable_manifest(args.manifest)
    except (ManifestError, OSError) as error:
        print(f"spark-checkpoint run: {error}", file=sys.stderr)
        return ExitCode.USAGE
    paths = local_paths(manifest, args.state_dir or default_state_dir(args.manifest))
    # Quoted: a path with a space is copied into a shell as it is printed.
    job = shlex.join(
        ["-f", str(args.manifest)]
        + (["--state-dir", str(args.state_dir)] if args.state_dir else [])
    )
    try:
        make_private_job_directory(paths)
        paths.logs_dir.mkdir(exist_ok=True)
        # Refused here, its refusal is not appended to the running job's log; taken here,
        # no other run writes there before this one's background run holds the lock.
        with job_lock(paths, f"{manifest.namespace}/{manifest.name}") as lock:
            started = _start_background_run(paths, argv, lock)
    except KeyboardInterrupt:
        print(
            "\nspark-checkpoint run: interrupted as the background run was starting: "
            f"`spark-checkpoint status {job}` tells whether it runs",
            file=sys.stderr,
        )
        return ExitCode.CANCELLED
    except (RunRefused, UnsafeStateDirectory) as refused:
        print(f"spark-checkpoint run: {refused}", file=sys.stderr)
        return ExitCode.FAILED
    except SymbolicLinkError as error:
        print(f"spark-checkpoint run: {error}", file=sys.stderr)
        return ExitCode.FAILED
    except OSError as error:  # a state directory that is a file, a name too long
        print(
            f"spark-checkpoint run: cannot create the job's state directory "
            f"{paths.logs_dir.parent}: {error.strerror or error}",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    process, earlier_runs = started
    log_file = paths.logs_dir / "runtime.log"
    deadline = time.monotonic() + ANSWER_TIMEOUT_SECONDS
    answering = False
    # Until its driver's agent answers, the run may still end at once (no image it can
    # restore, no driver it can start, a pipeline that starts its query without
    # run_coordinated): that is its answer, not "runs in the background". A long restore
    # past the deadline is left to go on.
    try:
        while process.poll() is None and time.monotonic() < deadline:
            status = _status_of(paths, process.pid)
            answering = answering or status is not None
            if status is not None and status.phase not in WAITED_PHASES:
                break
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        # Only the wait is interrupted: the run is in its own session (a newcomer read the
        # bare exit 130 as a cancelled job).
        print(
            f"\nspark-checkpoint run: interrupted; the background run (pid {process.pid}) "
            f"goes on (its output is in {log_file}): `spark-checkpoint status {job}` follows "
            f"it, `spark-checkpoint cancel {job}` ends it",
            file=sys.stderr,
        )
        return ExitCode.CANCELLED
    if process.poll() is None and answering:
        print(
            f"job {manifest.namespace}/{manifest.name} runs in the background (pid "
            f"{process.pid}, output in {log_file})\n"
            f"  follow it:  spark-checkpoint status {job}\n"
            f"  savepoint:  spark-checkpoint savepoint {job}\n"
            f"  stop it:    spark-checkpoint stop {job}   (a savepoint first; or cancel)"
        )
        return ExitCode.OK
    with log_file.open("rb") as log:
        log.seek(earlier_runs)
        tail = log.read().decode(errors="replace").splitlines()[-LOG_LINES_SHOWN:]
    if process.poll() is None:
        # It may yet run (storage that answers late): said, so that exit 1 is not read as
        # a run that ended (an Azure newcomer's ran on after it).
        for line in tail:
            print(line, file=sys.stderr)
        print(
            f"spark-checkpoint run: the background run (pid {process.pid}) did not answer "
            f"within {ANSWER_TIMEOUT_SECONDS:.0f}s and goes on (its output is in {log_file}): "
            f"`spark-checkpoint status {job}` says when it answers; `kill {process.pid}` ends "
            "it before",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    ended = process.returncode
    for line in tail:
        print(line, file=sys.stdout if ended == 0 else sys.stderr)
    return ended if ended >= 0 else ExitCode.FAILED  # a signal's end is a failure


def _status_of(paths: LocalPaths, runtime_pid: int) -> RuntimeStatus | None:
    """What the run of `runtime_pid` answers `status` with; None while it does not (not
    serving yet, or another run of the job answers: this one is refused and exits)."""
    try:
        answer = request(ControlPaths(paths.control_dir), Command.STATUS)
    except (NoRuntime, ControlRefused):  # not serving yet, or an old run's leftovers
        return None
    if answer.status is None or answer.status.runtime_pid != runtime_pid:
        return None
    return answer.status


def _start_background_run(
    paths: LocalPaths, argv: list[str], lock: int
) -> tuple["subprocess.Popen[bytes]", int]:
    """The background run, its output appended to the job's log, handed the job's
    ``lock``; with where its part of the log starts. Raises `RunRefused` naming the log
    or the interpreter that cannot be used."""
    log_file = paths.logs_dir / "runtime.log"
    try:
        opened = open_state_file(log_file, append=True)
    except OSError as error:
        raise RunRefused(
            f"cannot open the job's log {log_file}: {error.strerror or error}"
        ) from None
    with opened as log:
        # Each run's part of the log starts with its command line: an earlier run's
        # refusal is not read as this one's.
        log.write(f"{wall_clock(time.time())} --- spark-checkpoint {shlex.join(argv)}\n".encode())
        log.flush()
        earlier_runs = log.tell()  # what this run adds is all a refusal shows
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "spark_checkpoint_operator.cli", *argv],
                env={**os.environ, BACKGROUND_RUN_VARIABLE: str(lock)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(lock,),
                start_new_session=True,  # Ctrl-C in this terminal is not the run's any more
            )
        except OSError as error:
            where = f"{error.filename}: " if error.filename else ""
            raise RunRefused(
                f"cannot start the background run: {where}{error.strerror or error}"
            ) from None
    # A run refused from now on names the background run, not this command (which exits).
    with contextlib.suppress(OSError):  # the background run names itself anyway
        name_lock_holder(lock, process.pid)
    return process, earlier_runs
