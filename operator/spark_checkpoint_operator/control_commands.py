"""``spark-checkpoint status | savepoint | stop | cancel``: a running local job's controls
from another terminal (Flink's ``flink savepoint``, ``stop``, ``cancel``)."""

import argparse
import json
import sys
from pathlib import Path

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
    Outcome,
    RuntimeStatus,
)
from spark_checkpoint_operator.local_state import STATE_DIR_NAME, default_state_dir, local_job_paths
from spark_checkpoint_operator.manifest.loading import load_manifest
from spark_checkpoint_operator.manifest.problems import ManifestError

EXIT_OK = 0
EXIT_FAILED = 1  # the savepoint failed or was not done in time, or the run did not end
EXIT_USAGE = 2
EXIT_NO_RUNTIME = 3
EXIT_DECLINED = 4
EXIT_REFUSED = 5
DEFAULT_TIMEOUT_SECONDS = 600.0

EXIT_CODES = f"""exit codes:
  {EXIT_OK}  done
  {EXIT_FAILED}  the savepoint failed or did not complete within --timeout, or the run did not end
  {EXIT_USAGE}  bad usage, or the manifest cannot be read
  {EXIT_NO_RUNTIME}  no `spark-checkpoint run` of the job is running (for that state directory)
  {EXIT_DECLINED}  the checkpoint coordinator declined the request (its reason is printed)
  {EXIT_REFUSED}  refused: the control directory is not private, or the run's token is wrong
"""


def _examples(*lines: str) -> str:
    return "examples:\n" + "".join(f"  {line}\n" for line in lines) + "\n" + EXIT_CODES


def add_control_commands(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    job = argparse.ArgumentParser(add_help=False)
    where = job.add_argument_group(
        "which job",
        "either -f FILE, or --namespace and --job (with --state-dir unless the state is in "
        f"./{STATE_DIR_NAME})",
    )
    where.add_argument(
        "-f", "--manifest", type=Path, metavar="FILE", help="the SparkCheckpointJob manifest run"
    )
    where.add_argument("--namespace", "-n", metavar="NS", help="the job's namespace")
    where.add_argument("--job", metavar="NAME", help="the job's name")
    where.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help=f"the run's state directory (default: {STATE_DIR_NAME} next to the manifest, "
        "else in the current directory)",
    )
    timeout = argparse.ArgumentParser(add_help=False)
    _timeout_option(
        timeout,
        DEFAULT_TIMEOUT_SECONDS,
        "how long to wait for the savepoint (default: %(default).0f); the savepoint goes on "
        "after the command gives up",
    )
    formatter = argparse.RawDescriptionHelpFormatter

    status = commands.add_parser(
        "status",
        parents=[job],
        formatter_class=formatter,
        help="show a running job: phase, attempt, last batch, checkpoint and savepoint",
        description="Asks the running `spark-checkpoint run` of the job for its status.",
        epilog=_examples(
            "spark-checkpoint status -f job.yaml",
            "spark-checkpoint status -n default --job wordcount --state-dir /var/lib/sc --json",
        ),
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")

    savepoint = commands.add_parser(
        "savepoint",
        parents=[job, timeout],
        formatter_class=formatter,
        help="take a savepoint of a running job; the job keeps running",
        description="Triggers a savepoint (a self-contained image that retention never "
        "deletes) and waits until it completes, then prints its id and path.",
        epilog=_examples(
            "spark-checkpoint savepoint -f job.yaml",
            "spark-checkpoint savepoint -f job.yaml --detached   # print its id once triggered",
        ),
    )
    savepoint.add_argument(
        "--detached",
        "-d",
        action="store_true",
        help="return once the savepoint is triggered, with its id (as `flink savepoint -d`)",
    )

    stop = commands.add_parser(
        "stop",
        parents=[job, timeout],
        formatter_class=formatter,
        help="take a savepoint, then stop the job (the next run resumes from it)",
        description="Stop-with-savepoint, as `flink stop` (and Ctrl-C in the run's "
        "terminal): the driver stops once the savepoint completes; the command waits "
        "until the run has ended.",
        epilog=_examples(
            "spark-checkpoint stop -f job.yaml",
            "spark-checkpoint stop -f job.yaml --drain   # process all available input first",
        ),
    )
    stop.add_argument(
        "--drain",
        action="store_true",
        help="process all available input before the savepoint (as `flink stop --drain`)",
    )

    cancel = commands.add_parser(
        "cancel",
        parents=[job],
        formatter_class=formatter,
        help="stop a job at once, without a savepoint",
        description="Stops the driver without a savepoint (a second Ctrl-C): the next "
        "run resumes from the newest checkpoint or savepoint. Waits until the run has ended.",
        epilog=_examples("spark-checkpoint cancel -f job.yaml"),
    )
    _timeout_option(cancel, 60.0, "how long to wait for the run to end (default: %(default).0f)")


def _timeout_option(parser: argparse.ArgumentParser, default: float, text: str) -> None:
    parser.add_argument("--timeout", type=_seconds, metavar="SECONDS", default=default, help=text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_WAIT_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds from 0 to {MAX_WAIT_SECONDS:.0f}"
        )
    return value


class _Usage(Exception):
    """The arguments name no job; the message says what to give."""


def control_paths(args: argparse.Namespace) -> ControlPaths:
    """The control directory of the job the arguments name; `_Usage` if they do not."""
    if args.manifest is not None:
        try:
            manifest = load_manifest(args.manifest)
        except (ManifestError, OSError) as error:
            raise _Usage(str(error)) from None
        namespace, name = manifest.namespace, manifest.name
        state_dir = args.state_dir or default_state_dir(args.manifest)
    elif args.job is not None:
        namespace, name = args.namespace or "default", args.job
        state_dir = args.state_dir or Path(STATE_DIR_NAME)
    else:
        raise _Usage("name the job: -f FILE, or --job NAME (and --namespace)")
    return ControlPaths(local_job_paths(state_dir, namespace, name).control_dir)


def run_control(args: argparse.Namespace) -> int:
    prog = f"spark-checkpoint {args.command}"
    try:
        return _control(args, control_paths(args))
    except _Usage as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except NoRuntime as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_NO_RUNTIME
    except ControlRefused as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_REFUSED


def _control(args: argparse.Namespace, paths: ControlPaths) -> int:
    prog = f"spark-checkpoint {args.command}"
    command = Command(args.command)
    if command is Command.STATUS:
        answer = request(paths, command)
        assert answer.status is not None
        if args.json:
            print(json.dumps(answer.status.to_json(), indent=2))
        else:
            print(_describe(answer.status))
        return EXIT_OK
    if command is Command.CANCEL:
        answer = request(paths, command)
        print(answer.message, flush=True)
        return _ended(paths, args.timeout, "cancelled", prog)
    wait = 0.0 if getattr(args, "detached", False) else args.timeout
    answer = request(paths, command, drain=getattr(args, "drain", False), wait=wait)
    code = _report(answer, prog, detached=wait == 0.0, timeout=args.timeout)
    if command is Command.STOP and code == EXIT_OK:
        return _ended(paths, args.timeout, "stopped", prog)
    return code


def _report(answer: ControlAnswer, prog: str, *, detached: bool, timeout: float) -> int:
    savepoint = answer.savepoint
    match answer.outcome:
        case Outcome.OK:
            assert savepoint is not None
            print(f"savepoint {savepoint.snapshot_id} completed: {savepoint.path}", flush=True)
            return EXIT_OK
        case Outcome.TRIGGERED if detached and savepoint is not None:
            print(f"savepoint {savepoint.snapshot_id} triggered; the job keeps running")
            return EXIT_OK
        case Outcome.TRIGGERED if detached:
            print(f"{answer.message}; the job keeps running")
            return EXIT_OK
        case Outcome.TRIGGERED:
            print(
                f"{prog}: {answer.message} after {timeout:.0f}s; it goes on in the background "
                "(`spark-checkpoint list` shows it once complete)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        case Outcome.DECLINED:
            print(f"{prog}: {answer.message}", file=sys.stderr)
            return EXIT_DECLINED
        case _:
            print(f"{prog}: {answer.message}", file=sys.stderr)
            return EXIT_FAILED


def _ended(paths: ControlPaths, timeout: float, what: str, prog: str) -> int:
    if wait_until_gone(paths, timeout):
        print(f"{what}: the run has ended")
        return EXIT_OK
    print(f"{prog}: the run has not ended within {timeout:.0f}s", file=sys.stderr)
    return EXIT_FAILED


def _describe(status: RuntimeStatus) -> str:
    driver = "none" if status.driver_pid is None else str(status.driver_pid)
    lines = [
        f"job {status.job}: {status.phase} (attempt {status.attempt}, runtime pid "
        f"{status.runtime_pid}, driver pid {driver})",
        "last committed batch: "
        + ("none" if status.last_batch is None else str(status.last_batch)),
    ]
    for kind, found in (
        ("checkpoint", status.last_checkpoint),
        ("savepoint", status.last_savepoint),
    ):
        lines.append(
            f"last {kind}: none"
            if found is None
            else f"last {kind}: {found.snapshot_id} {found.path}"
        )
    lines.append(f"in progress: {status.in_progress}")
    if status.message:
        lines.append(f"message: {status.message}")
    return "\n".join(lines)
