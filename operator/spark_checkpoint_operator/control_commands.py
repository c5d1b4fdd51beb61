"""``spark-checkpoint status | savepoint | stop | cancel``: a running local job's controls
from another terminal (Flink's ``flink savepoint``, ``stop``, ``cancel``)."""

import argparse
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

from spark_checkpoint.storage import CheckpointKind, printable_line
from spark_checkpoint_operator.cli_conventions import (
    OptionError,
    OutputFormat,
    Parser,
    add_job_options,
    add_manifest_option,
    add_output_option,
    directory,
    epilog,
    error_lines,
    format_table,
    job_options,
    print_document,
    seconds,
)
from spark_checkpoint_operator.control import (
    ControlPaths,
    ControlRefused,
    NoRuntime,
    request,
    wait_until_gone,
)
from spark_checkpoint_operator.control_protocol import (
    MAX_WAIT_SECONDS,
    Command,
    ControlAnswer,
    Image,
    Outcome,
    RuntimeStatus,
)
from spark_checkpoint_operator.coordinator import TerminalOutcome
from spark_checkpoint_operator.coordinator.state import format_time
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.local_state import (
    STATE_DIR_NAME,
    LocalPaths,
    default_state_dir,
    local_job_paths,
    run_lock_holder,
)
from spark_checkpoint_operator.manifest.loading import load_manifest
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.savepoint_disposal import (
    DisposalDeclined,
    DisposalIncomplete,
    DisposalRefused,
    dispose_here,
    savepoint_argument,
    savepoint_named,
)
from spark_checkpoint_operator.status import StatusFile, StatusFileError, last_image
from spark_checkpoint_operator.storage_commands.job import (
    CommandError,
    StorageSource,
    StorageUnusable,
    opened_job_storage,
)

DEFAULT_TIMEOUT_SECONDS = 600.0

# What every control command may exit with; each adds what its 0 and 1 mean.
REACHING_THE_RUN = {
    ExitCode.USAGE: "bad usage, or the manifest cannot be read",
    ExitCode.NO_RUNTIME: "no `spark-checkpoint run` of the job is running (for that state "
    "directory)",
    ExitCode.REFUSED: "refused: the control directory is not private, or the run's token is wrong",
}
SAVEPOINT_EXIT_CODES = {
    **REACHING_THE_RUN,
    ExitCode.FAILED: "the savepoint failed, was given up (the job stopped or finished first: "
    "what happened is printed) or did not complete within --timeout",
    ExitCode.DECLINED: "the checkpoint coordinator declined the request (its reason is printed)",
}


def add_control_commands(commands: "argparse._SubParsersAction[Parser]") -> None:
    job = Parser(add_help=False)
    where = job.add_argument_group(
        "which job",
        "either -f FILE, or --job (and --namespace; with --state-dir unless the state is in "
        f"./{STATE_DIR_NAME})",
    )
    add_manifest_option(where, "the SparkCheckpointJob manifest run")
    add_job_options(where)
    where.add_argument(
        "--state-dir",
        type=directory,
        metavar="DIR",
        help=f"the run's state directory (default: {STATE_DIR_NAME} next to the manifest, "
        "else in the current directory)",
    )
    timeout = Parser(add_help=False)
    _timeout_option(
        timeout,
        DEFAULT_TIMEOUT_SECONDS,
        "how long to wait for the savepoint (default: %(default).0f; 0: only until it is "
        "triggered); the savepoint goes on after the command gives up",
    )
    status = commands.add_parser(
        "status",
        parents=[job],
        help="show a running job: phase, attempt, last batch, checkpoint and savepoint",
        description="Asks the running `spark-checkpoint run` of the job for its status: a "
        "line with its phase, attempt, the query's last committed batch (Spark's commit log; a "
        "two-phase-commit sink's output is committed up to the batch of the last completed "
        "checkpoint or stop-with-savepoint), last checkpoint and savepoint and the snapshots in "
        "progress; -o wide adds the pids of the run and of its driver, "
        "the images' paths and the run's message. With no run answering (exit 3), it says how "
        "the last run left the job; -o json and yaml print its fields then too (running: "
        "false).",
        epilog=epilog(
            [
                "spark-checkpoint status -f job.yaml",
                "spark-checkpoint status -f job.yaml -o wide",
                "spark-checkpoint status -n default --job wordcount --state-dir /var/lib/sc "
                "-o json",
            ],
            {ExitCode.OK: "shown", **REACHING_THE_RUN},
        ),
    )
    add_output_option(status, *OutputFormat)

    savepoint = commands.add_parser(
        "savepoint",
        parents=[job, timeout],
        help="take a savepoint of a running job; the job keeps running",
        description="Triggers a savepoint (a self-contained image that the retention policy "
        "never deletes; the savepoint history, spec.savepoints.historyMaxCount and "
        "historyMaxAge, deletes the oldest) and waits until it completes, then prints its id "
        "and path.",
        epilog=epilog(
            [
                "spark-checkpoint savepoint -f job.yaml",
                "spark-checkpoint savepoint -f job.yaml --detached   # print its id once triggered",
                "spark-checkpoint savepoint -f job.yaml --dispose savepoint:3",
            ],
            {
                ExitCode.OK: "the savepoint completed (--detached or --timeout 0: was triggered); "
                "--dispose: disposed of (--timeout 0: the run took the request)",
                **SAVEPOINT_EXIT_CODES,
                ExitCode.FAILED: f"{SAVEPOINT_EXIT_CODES[ExitCode.FAILED]}; --dispose: not "
                "disposed of (not the job's registered savepoint, a checkpoint, a run that "
                "does not answer within --timeout), or its files could not be deleted",
                ExitCode.DECLINED: f"{SAVEPOINT_EXIT_CODES[ExitCode.DECLINED]}; --dispose: "
                "the savepoint is the job's newest image, which the coordinator keeps",
                ExitCode.NO_RUNTIME: f"{REACHING_THE_RUN[ExitCode.NO_RUNTIME]} (not with "
                "--dispose, which then disposes of the savepoint itself)",
            },
        ),
    )
    # A disposal is done or refused at once: nothing to detach from.
    detached_or_dispose = savepoint.add_mutually_exclusive_group()
    detached_or_dispose.add_argument(
        "--detached",
        "-dcp",
        action="store_true",
        help="return once the savepoint is triggered, with its id (as `flink savepoint "
        "--detached`)",
    )
    detached_or_dispose.add_argument(
        "--dispose",
        "-d",
        type=savepoint_argument,
        metavar="SAVEPOINT",
        help="take no savepoint: dispose of the job's savepoint savepoint:N, or the one at "
        "PATH (.../savepoints/sp-N), as `flink savepoint --dispose`: it leaves the job's "
        "registry, then its files are deleted; through the job's run if one runs, else here. "
        "Not the job's newest image (the output may be committed up to it)",
    )

    stop = commands.add_parser(
        "stop",
        parents=[job, timeout],
        help="take a savepoint, then stop the job (the next run resumes from it)",
        description="Stop-with-savepoint, as `flink stop` (and Ctrl-C in the run's "
        "terminal): the driver stops once the savepoint completes; the command waits "
        "until the run has ended.",
        epilog=epilog(
            [
                "spark-checkpoint stop -f job.yaml",
                "spark-checkpoint stop -f job.yaml --drain   # process all available input first",
            ],
            {
                ExitCode.OK: "the savepoint completed and the run has ended (--timeout 0: the "
                "savepoint was triggered, or the driver stops without one)",
                **SAVEPOINT_EXIT_CODES,
                ExitCode.FAILED: "the savepoint failed, was given up (another stop's completed "
                "first: what happened is printed) or did not complete within --timeout, or the "
                "run did not end",
            },
        ),
    )
    stop.add_argument(
        "--drain",
        action="store_true",
        help="process all available input before the savepoint (as `flink stop --drain`); "
        "checkpointing.timeout counts from when the input ran out, however long that takes. "
        "Periodic checkpoints wait meanwhile. Bounded input that runs out ends with the "
        "savepoint, not a final checkpoint: the job is Suspended",
    )

    cancel = commands.add_parser(
        "cancel",
        parents=[job],
        help="stop a job at once, without a savepoint",
        description="Stops the driver without a savepoint (a second Ctrl-C): the job ends "
        "Cancelled and its retention policy applies. Under the default RetainOnFailure its "
        "checkpoints are discarded and its savepoints stay: the next run resumes from the "
        "newest savepoint, or starts over (then its output must be deleted too, as the run "
        "says); under RetainOnCancellation it resumes from the newest checkpoint. "
        "Waits until the run has ended.",
        epilog=epilog(
            ["spark-checkpoint cancel -f job.yaml"],
            {
                ExitCode.OK: "the run has ended (--timeout 0: the run took the cancel and "
                "ends without waiting for it)",
                ExitCode.FAILED: "the run did not end within --timeout",
                **REACHING_THE_RUN,
            },
        ),
    )
    _timeout_option(
        cancel, 60.0, "how long to wait for the run to end (default: %(default).0f; 0: do not wait)"
    )


def _timeout_option(parser: argparse.ArgumentParser, default: float, text: str) -> None:
    parser.add_argument(
        "--timeout",
        type=seconds(zero=True, at_most=MAX_WAIT_SECONDS),
        metavar="SECONDS",
        default=default,
        help=text,
    )


class _Usage(Exception):
    """The arguments name no job; the message says what to give."""


def job_paths(args: argparse.Namespace) -> LocalPaths:
    """Where the run of the job the arguments name keeps its state; `_Usage` if they name
    no job."""
    if args.manifest is not None:
        if args.job is not None or args.namespace is not None:
            # Either would be dropped: `cancel -f a.yaml --job b` cancelled a.
            raise _Usage("-f FILE names the job: do not combine it with --namespace or --job")
        try:
            manifest = load_manifest(args.manifest)
        except (ManifestError, OSError) as error:
            raise _Usage(str(error)) from None
        namespace, name = manifest.namespace, manifest.name
        state_dir = args.state_dir or default_state_dir(args.manifest)
    elif args.job is not None:
        try:
            namespace, name = job_options(args.namespace, args.job)
        except OptionError as error:
            raise _Usage(str(error)) from None
        state_dir = args.state_dir or Path(STATE_DIR_NAME)
    else:
        raise _Usage("name the job: -f FILE, or --job NAME (and --namespace)")
    return local_job_paths(state_dir, namespace, name)


def run_control(args: argparse.Namespace) -> int:
    prog = f"spark-checkpoint {args.command}"
    try:
        paths = job_paths(args)
        if getattr(args, "dispose", None) is not None:
            return _dispose(args)
        return _control(args, ControlPaths(paths.control_dir))
    except _Usage as error:
        print(error_lines(prog, error), file=sys.stderr)
        return ExitCode.USAGE
    except NoRuntime as error:
        holder = run_lock_holder(paths)
        if holder is not None:
            # Not "has not run": a run holds the job (starting: it serves commands only
            # once it claimed the storage; or stuck).
            ended = f"; {_unanswering_run(paths, holder)}"
        elif args.command == Command.STATUS:
            ended = f"; {last_run(paths.status_file)}"
        else:
            ended = ""
        if args.command == Command.STATUS and args.output in (OutputFormat.JSON, OutputFormat.YAML):
            # A script reads a document either way; the exit code says no run answered.
            print_document(last_run_document(paths, holder), args.output, sys.stdout)
        print(f"{prog}: {error}{ended}", file=sys.stderr)
        return ExitCode.NO_RUNTIME
    except ControlRefused as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return ExitCode.REFUSED


def _control(args: argparse.Namespace, paths: ControlPaths) -> int:
    prog = f"spark-checkpoint {args.command}"
    command = Command(args.command)
    if command is Command.STATUS:
        answer = request(paths, command)
        assert answer.status is not None
        if args.output in (OutputFormat.JSON, OutputFormat.YAML):
            print_document({**answer.status.to_json(), "running": True}, args.output, sys.stdout)
        else:
            for line in status_lines(answer.status, wide=args.output is OutputFormat.WIDE):
                print(line)
        return ExitCode.OK
    if command is Command.CANCEL:
        answer = request(paths, command)
        print(answer.message, flush=True)
        if args.timeout == 0:  # as `flink cancel`: the request was taken, the run ends
            return ExitCode.OK
        # FAILED: nothing was left to cancel (the answer says why), the job ends as it did.
        ended = None if answer.outcome is Outcome.FAILED else "cancelled"
        return _ended(paths, args.timeout, ended, prog)
    # --timeout 0 waits only until the savepoint is triggered, as --detached does.
    detached = getattr(args, "detached", False) or args.timeout == 0
    wait = 0.0 if detached else args.timeout
    drain = getattr(args, "drain", False)
    # A savepoint can take minutes (a drain: as long as the input lasts): an answer that
    # takes longer than a moment is announced, on standard error (standard output is the
    # result, for scripts).
    waiting = threading.Timer(
        WAITING_NOTICE_SECONDS,
        lambda: print(f"{prog}: {_waiting(command, drain, wait)}", file=sys.stderr, flush=True),
    )
    if wait > WAITING_NOTICE_SECONDS:
        waiting.start()
    try:
        try:
            answer = request(paths, command, drain=drain, wait=wait)
        finally:
            # Not once answered: a stop without a savepoint waited for the run to end
            # under "waiting for the savepoint" (an S3 user's).
            waiting.cancel()
            if waiting.is_alive():
                waiting.join()  # a notice being printed comes before the answer
        code = _report(answer, command, prog, detached=detached, timeout=args.timeout)
        if command is Command.STOP and answer.outcome is Outcome.OK and not detached:
            return _ended(paths, args.timeout, "stopped", prog)
        return code
    except KeyboardInterrupt:
        print(
            f"\n{prog}: interrupted; the {command} goes on in the run "
            f"(`{_status_command(args)}` follows it)",
            file=sys.stderr,
        )
        return ExitCode.CANCELLED


def _dispose(args: argparse.Namespace) -> int:
    """`savepoint --dispose`: through the job's run if one answers, else here."""
    prog = "spark-checkpoint savepoint"
    source = StorageSource(args.manifest, None, args.namespace, args.job, args.state_dir)
    try:
        with opened_job_storage(source) as job:
            savepoint_id = savepoint_named(args.dispose, job.storage)
            try:
                answer = request(
                    ControlPaths(job.paths.control_dir),
                    Command.DISPOSE,
                    wait=args.timeout,
                    savepoint=savepoint_id,
                )
            except NoRuntime:
                name = f"{job.layout.namespace}/{job.layout.job}"
                print(dispose_here(job.paths, job.storage, name, savepoint_id, job.named))
                return ExitCode.OK
    except StorageUnusable as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return ExitCode.FAILED
    except CommandError as error:
        print(error_lines(prog, error), file=sys.stderr)
        return ExitCode.USAGE
    except DisposalDeclined as error:
        print(f"{prog}: not disposed of: {error}", file=sys.stderr)
        return ExitCode.DECLINED
    except DisposalIncomplete as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return ExitCode.FAILED
    except DisposalRefused as error:
        print(f"{prog}: not disposed of: {error}", file=sys.stderr)
        return ExitCode.FAILED
    match answer.outcome:
        case Outcome.OK:
            print(answer.message)
            return ExitCode.OK
        case Outcome.DECLINED:
            print(f"{prog}: not disposed of: {answer.message}", file=sys.stderr)
            return ExitCode.DECLINED
        case Outcome.FAILED:
            print(f"{prog}: not disposed of: {answer.message}", file=sys.stderr)
            return ExitCode.FAILED
        case Outcome.TRIGGERED if args.timeout == 0:  # as `cancel --timeout 0`: it was taken
            print(answer.message)
            return ExitCode.OK
        case _:
            print(f"{prog}: {answer.message}", file=sys.stderr)
            return ExitCode.FAILED


WAITING_NOTICE_SECONDS = 2.0  # an answer within it (a decline, a quick savepoint) is not announced


def _waiting(command: Command, drain: bool, wait: float) -> str:
    savepoint = f"for the savepoint (--timeout {wait:.0f}s)"
    if drain:
        savepoint = f"for the job to process its available input and {savepoint}"
    if command is Command.SAVEPOINT:
        return f"waiting {savepoint}"
    return f"waiting {savepoint}, then for the run to end"


def _status_command(args: argparse.Namespace) -> str:
    """The `status` command line that names the same job as `args`."""
    if args.manifest is not None:
        words = ["-f", str(args.manifest)]
    else:
        words = ["--job", args.job, *(["--namespace", args.namespace] if args.namespace else [])]
    if args.state_dir is not None:
        words += ["--state-dir", str(args.state_dir)]
    return shlex.join(["spark-checkpoint", "status", *words])


def _report(
    answer: ControlAnswer, command: Command, prog: str, *, detached: bool, timeout: float
) -> int:
    savepoint = answer.savepoint
    then = "the run stops once it completes" if command is Command.STOP else "the job keeps running"
    match answer.outcome:
        case Outcome.OK if savepoint is None:  # a stop without one: the answer says why
            print(answer.message, flush=True)
            return ExitCode.OK
        case Outcome.OK:
            assert savepoint is not None
            print(f"savepoint {savepoint.snapshot_id} completed: {savepoint.path}", flush=True)
            return ExitCode.OK
        case Outcome.TRIGGERED if detached and savepoint is not None:
            print(f"savepoint {savepoint.snapshot_id} triggered; {then}")
            return ExitCode.OK
        case Outcome.TRIGGERED if detached:
            print(f"{answer.message}; {then}")
            return ExitCode.OK
        case Outcome.TRIGGERED:
            print(
                f"{prog}: {answer.message} after {_as_given(timeout)}s; it goes on in the "
                "background (`spark-checkpoint list` shows it once complete)",
                file=sys.stderr,
            )
            return ExitCode.FAILED
        case Outcome.DECLINED:
            print(f"{prog}: {answer.message}", file=sys.stderr)
            return ExitCode.DECLINED
        case _:
            print(f"{prog}: {answer.message}", file=sys.stderr)
            return ExitCode.FAILED


def _as_given(seconds: float) -> str:
    """``--timeout``'s seconds as a user writes them: 60, 0.01, 1000000 (not 1e+06)."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def _ended(paths: ControlPaths, timeout: float, what: str | None, prog: str) -> int:
    """Wait for the run to end; ``what`` (cancelled, stopped) prefixes the line saying so."""
    if wait_until_gone(paths, timeout):
        print("the run has ended" if what is None else f"{what}: the run has ended")
        return ExitCode.OK
    print(f"{prog}: the run has not ended within {_as_given(timeout)}s", file=sys.stderr)
    return ExitCode.FAILED


def last_run(status_file: Path) -> str:
    """What the status file says of the job's last run, for a ``status`` no run answers."""
    try:
        found = StatusFile.read(status_file)
        status = None if found is None else found.persisted_status()
    except StatusFileError as error:
        return f"its status file cannot be read: {error}"
    if status is None:
        return "the job has not run with this state directory"
    due = {discard.key for discard in status.discards_due}
    images = ", ".join(
        f"{kind} {_or_none(image and image.snapshot_id)}{_discarded(image)}"
        for kind in CheckpointKind
        for image in [Image.from_view(last_image(status.coordinator, kind), kind, due)]
    )
    message = f": {printable_line(status.message)}" if status.message else ""
    recorded = (
        f"{status.phase.value} (attempt {status.job_attempt}, batch "
        f"{_or_none(status.last_committed_batch)}, {images}){message}"
    )
    if status.phase.value not in set(TerminalOutcome):
        # A run ends by recording how; one that did not was killed (its driver with it).
        return f"the last run ended without recording how (killed?); it last recorded {recorded}"
    return f"the last run left it {recorded}"


def _unanswering_run(paths: LocalPaths, holder: str) -> str:
    return (
        f"a run of the job (pid {holder}) holds it and does not answer (starting, or stuck; "
        f"its output is in {paths.logs_dir / 'runtime.log'}); `kill {holder}` ends it"
    )


def last_run_document(paths: LocalPaths, holder: str | None) -> dict[str, Any]:
    """``status -o json`` when no run answers: a running one's fields, as the status file
    the last run left says them (nothing in progress), its message the sentence `last_run`
    says, or, when a run ``holder`` (its pid) holds the job without answering, that
    (``runtimePid`` its pid); ``running`` false."""
    try:
        found = StatusFile.read(paths.status_file)
        status = None if found is None else found.persisted_status()
    except StatusFileError:
        status = None
    due = set() if status is None else {discard.key for discard in status.discards_due}
    images = {
        kind: image and image.to_json()
        for kind in CheckpointKind
        for image in [
            None
            if status is None
            else Image.from_view(last_image(status.coordinator, kind), kind, due)
        ]
    }
    return {
        "job": f"{paths.job_dir.parent.name}/{paths.job_dir.name}",
        "phase": None if status is None else status.phase.value,
        "attempt": None if status is None else status.job_attempt,
        "runtimePid": int(holder) if holder is not None and holder.isdigit() else None,
        "driverPid": None,
        "lastCommittedBatch": None if status is None else status.last_committed_batch,
        "lastCheckpoint": images[CheckpointKind.CHECKPOINT],
        "lastSavepoint": images[CheckpointKind.SAVEPOINT],
        "inProgress": 0,
        "message": last_run(paths.status_file)
        if holder is None
        else _unanswering_run(paths, holder),
        "nextPeriodicSavepoint": None
        if status is None or status.next_periodic_savepoint is None
        else format_time(status.next_periodic_savepoint),
        "running": False,
    }


def _discarded(image: Image | None) -> str:
    """A finished job's last checkpoint, which retention discarded, has no path; its
    files may wait for a delete (storage that did not answer: an Azure user's "discarded"
    while `list` showed it in storage)."""
    if image is None or image.path is not None:
        return ""
    if image.discard_due:
        return " (discarded; its files stay in storage until a run of the job deletes them)"
    return " (discarded)"


def status_lines(status: RuntimeStatus, *, wide: bool) -> list[str]:
    """``status``: the job as a one-row table, as ``kubectl get``; ``wide`` adds the pids,
    the images' paths and the run's message."""
    header = ["JOB", "PHASE", "ATTEMPT", "BATCH", "CHECKPOINT", "SAVEPOINT", "IN-PROGRESS"]
    row = [
        status.job,
        status.phase,
        str(status.attempt),
        _or_none(status.last_batch),
        _or_none(status.last_checkpoint and status.last_checkpoint.snapshot_id),
        _or_none(status.last_savepoint and status.last_savepoint.snapshot_id),
        str(status.in_progress),
    ]
    if wide:
        header += [
            "RUNTIME-PID",
            "DRIVER-PID",
            "CHECKPOINT-PATH",
            "SAVEPOINT-PATH",
            "NEXT-PERIODIC-SAVEPOINT",
            "MESSAGE",
        ]
        row += [
            str(status.runtime_pid),
            _or_none(status.driver_pid),
            _path(status.last_checkpoint),
            _path(status.last_savepoint),
            _or_none(status.next_periodic_savepoint),
            status.message or "-",
        ]
    return format_table([header, row], right_aligned={2, 3, 4, 5, 6, 7, 8})


def _or_none(value: object) -> str:
    return "none" if value is None else str(value)


def _path(image: Image | None) -> str:
    """A finished job's last checkpoint, which retention discarded, has no path; while its
    files wait for a delete it is "discarding" (one word, for a table's column)."""
    if image is None:
        return "none"
    if image.path is None:
        return "discarding" if image.discard_due else "discarded"
    return image.path
