"""The ``spark-checkpoint`` command line."""

import argparse
import asyncio
import difflib
import importlib.metadata
import logging
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spark_checkpoint_operator.cli_conventions import (
    GENERAL_MEANINGS,
    OutputFormat,
    Parser,
    add_job_options,
    add_manifest_option,
    add_output_option,
    directory,
    epilog,
    error_lines,
    exit_quietly_on_closed_pipe,
    manifest_file,
    port_number,
    seconds,
    whole_number,
)
from spark_checkpoint_operator.control_commands import add_control_commands, run_control
from spark_checkpoint_operator.coordinator import CoordinatorConfig, TerminalOutcome
from spark_checkpoint_operator.detached_run import BACKGROUND_RUN_VARIABLE, run_detached
from spark_checkpoint_operator.exit_codes import ExitCode
from spark_checkpoint_operator.local_runtime import (
    RunInterrupted,
    RunRefused,
    load_runnable_manifest,
    run_local,
)
from spark_checkpoint_operator.local_state import STATE_DIR_NAME, default_state_dir
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.restore_choice import image_argument
from spark_checkpoint_operator.run_display import RunDisplay
from spark_checkpoint_operator.simulation import SimulatedDriver, simulate
from spark_checkpoint_operator.storage_commands.commands import run_inspect, run_list, run_verify
from spark_checkpoint_operator.storage_commands.job import StorageSource

# `simulate --tasks`: each is simulated in memory (100,000,000 took GiB before any output).
MAX_SIMULATED_TASKS = 100_000


def main(argv: Sequence[str] | None = None) -> int:
    return exit_quietly_on_closed_pipe(lambda: _main(argv))


def command_line() -> tuple[Parser, Mapping[str, Parser]]:
    """The `spark-checkpoint` parser and its commands' parsers, by name."""
    parser = Parser(
        prog="spark-checkpoint",
        description="Flink-grade checkpoint coordination for Spark Structured Streaming: run "
        "a SparkCheckpointJob on this machine, control the run from another terminal, and "
        "look into its checkpoint storage. Each command's --help has examples and its exit "
        "codes.",
        epilog=epilog(
            [
                "spark-checkpoint run -f job.yaml              # run a job here",
                "spark-checkpoint status -f job.yaml           # from another terminal",
                "spark-checkpoint list -f job.yaml -o wide     # what its storage holds",
                "spark-checkpoint inspect -f job.yaml -o yaml  # every _metadata, in full",
            ],
            GENERAL_MEANINGS,
        ),
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version('spark-checkpoint-operator')}",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run a SparkCheckpointJob manifest on this machine (the embedded default)",
        description=(
            "Validates the manifest against the CRD schema, starts the driver as a local "
            "process under the checkpoint coordinator, restarts it with restore when it "
            "dies, and on Ctrl-C takes a savepoint and stops. From another terminal: "
            "`spark-checkpoint status`, `savepoint`, `stop` and `cancel` with the same -f."
        ),
        epilog=epilog(
            [
                "spark-checkpoint run -f job.yaml                      # Ctrl-C: savepoint, "
                "then stop",
                "spark-checkpoint run -f job.yaml --detach             # in the background",
                "spark-checkpoint run -f job.yaml --from savepoint:4   # restore savepoint 4, "
                "not the newest",
            ],
            {
                ExitCode.OK: "the job Finished, or stopped (Suspended): with a savepoint, or "
                "without one if Ctrl-C came while it was not running yet; with --detach, a "
                "driver of the background run answered",
                ExitCode.FAILED: "the job Failed, or the run was refused (another run of the "
                "job, a Finished job, an image --from cannot restore, a mainFile or a Secret's "
                "variable that is not there); with --detach also: the background run did not "
                "answer within a minute (it goes on; `status` says when it answers)",
                ExitCode.USAGE: "the manifest cannot be read, is invalid or cannot run here "
                "(spec.state Suspended, the namespace named storage), or an option is invalid (a "
                "malformed --from savepoint:N, an empty --state-dir or one that is a file)",
                ExitCode.CANCELLED: "cancelled (a second Ctrl-C, or `spark-checkpoint cancel`), "
                "or Ctrl-C, SIGTERM or SIGHUP while the run claimed an object store or checked "
                "the image to restore, before the job started",
                ExitCode.CLOSED_PIPE: "not used: output closed (`| head`) stops the job as "
                "Ctrl-C does, and the run exits as the job ended (its lines go on to standard "
                "error)",
            },
        ),
    )
    # Not a mutually exclusive group: with -f, a word an unknown option left (`-s
    # savepoint:3`) was "argument FILE: not allowed with -f", never naming the option.
    add_manifest_option(run, "the manifest", dest="manifest_file")
    run.add_argument(
        "manifest", type=manifest_file, nargs="?", metavar="FILE", help="the manifest (as -f FILE)"
    )
    run.add_argument(
        "--from",
        dest="restore_from",
        type=image_argument,
        metavar="IMAGE",
        help="restore savepoint:N, checkpoint:N (of the job's registry) or the savepoint or "
        "retained checkpoint at PATH (.../savepoints/sp-N or .../chk-N) instead of the "
        "newest image; checked before Spark starts (Flink's -s and --fromSavepoint too)",
    )
    # Apart, so that a --from error says --from.
    run.add_argument(
        "-s", "--fromSavepoint", dest="restore_from", type=image_argument, help=argparse.SUPPRESS
    )
    run.add_argument(
        "-d",
        "--detach",
        "--detached",  # Flink's spelling
        action="store_true",
        help="run in the background (output in <state-dir>/<namespace>/<job>/logs/"
        "runtime.log); return once a driver of the run answers (the job is Running; a "
        "driver that fails first is waited through its restarts), exit 0; or after a minute "
        "without an answer, exit 1 while the run goes on; a run that ends before shows its "
        "last lines and exits as it ended",
    )
    run.add_argument(
        "--state-dir",
        type=directory,
        help="status, driver logs, work directories and default storage "
        f"(default: {STATE_DIR_NAME} next to the manifest)",
    )
    run.add_argument(
        "--agent-timeout",
        type=seconds(),
        metavar="SECONDS",
        help="fail the job if a started driver's checkpoint agent has not answered within "
        "SECONDS (a pipeline that does not call run_coordinated), and warn once of a restore "
        "longer than that (default: the manifest's spec.restartPolicy.startTimeout, 5m by "
        "default: 300 seconds)",
    )
    run.add_argument(
        "--metrics-port",
        type=port_number,
        metavar="PORT",
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics (default: off)",
    )

    simulation = commands.add_parser(
        "simulate",
        help="run the checkpoint coordinator against a simulated agent (no Spark)",
        description=(
            "Runs the real coordinator core on virtual time against simulated snapshot "
            "tasks that acknowledge, decline or hang at random."
        ),
        epilog=epilog(
            [
                "spark-checkpoint simulate",
                "spark-checkpoint simulate --duration 600 --tasks 16 --seed 7",
            ],
            {ExitCode.OK: "the simulation ran", ExitCode.USAGE: "the settings are invalid"},
        ),
    )
    simulation.add_argument(
        "--duration", type=seconds(), default=120.0, help="virtual seconds to run (120)"
    )
    simulation.add_argument(
        "--interval", type=seconds(), default=10.0, help="checkpoint interval, seconds (10)"
    )
    simulation.add_argument(
        "--min-pause",
        type=seconds(zero=True),
        default=2.0,
        help="least pause between checkpoints, seconds (2)",
    )
    simulation.add_argument(
        "--timeout", type=seconds(), default=8.0, help="checkpoint timeout, seconds (8)"
    )
    simulation.add_argument(
        "--tolerable-failures",
        type=whole_number(0),
        default=1,
        help="consecutive failed checkpoints tolerated (1)",
    )
    simulation.add_argument(
        "--retained", type=whole_number(1), default=2, help="checkpoints retained (2)"
    )
    simulation.add_argument(
        "--tasks",
        type=whole_number(1, maximum=MAX_SIMULATED_TASKS),
        default=4,
        help="snapshot tasks per checkpoint: the logs and N-1 state partitions "
        f"(4; at most {MAX_SIMULATED_TASKS})",
    )
    simulation.add_argument("--seed", type=int, default=1, help="the random seed (1)")

    _add_storage_commands(commands)

    add_control_commands(commands)
    return parser, commands.choices


# Commands of Flink's CLI (and words for them) that are options of ours.
_SPELLED_HERE = {"dispose": "savepoint --dispose", "restore": "run --from", "resume": "run"}


@dataclass(frozen=True, slots=True)
class _CommandMeant:
    word: str  # the word where the command belongs
    command_line: str  # what it may mean ("" if nothing is likely)


def _command_meant(words: list[str], commands: Mapping[str, Parser]) -> _CommandMeant | None:
    """None if the first word that is no option is a command (or there is none); else what
    was meant: the command named later, its options put after it (`-f job.yaml list`, as
    kubectl takes global flags), a command of that name elsewhere, or one spelled alike."""
    word = next((w for w in words if not w.startswith("-")), None)
    if word is None or word in commands:
        return None
    if (later := next((i for i, w in enumerate(words) if w in commands), None)) is not None:
        return _CommandMeant(word, shlex.join([words[later], *words[:later], *words[later + 1 :]]))
    close = difflib.get_close_matches(word, commands, n=1)
    return _CommandMeant(word, _SPELLED_HERE.get(word) or (close[0] if close else ""))


def _main(argv: Sequence[str] | None) -> int:
    parser, commands = command_line()
    words = sys.argv[1:] if argv is None else list(argv)
    if (meant := _command_meant(words, commands)) is not None:
        parser.error(
            f"{meant.word!r} is no command (commands: {', '.join(commands)})",
            f"did you mean {parser.prog} {meant.command_line}?" if meant.command_line else "",
        )
    args, unrecognized = parser.parse_known_args(words)
    # Azure's DefaultAzureCredential logs each attempt at a token as a warning of a dozen
    # lines (four of them without credentials), google-auth that it found none, and gcsfs
    # each refused request as an error with its traceback; the storage error after them
    # says it in one line.
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    logging.getLogger("google.auth").setLevel(logging.ERROR)
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    if unrecognized:  # named by the command that took the rest, whose --help says more
        # `run` takes the manifest without -f too: another word is no manifest's.
        named = args.command == "run" or getattr(args, "manifest", None) is not None
        commands[args.command].refuse_unrecognized(unrecognized, manifest_named=named)
    if args.command == "run":
        if args.manifest_file is None and args.manifest is None:
            commands["run"].error("name the manifest: FILE, or -f FILE")
        if args.manifest_file is not None and args.manifest is not None:
            commands["run"].error("name the manifest once: FILE or -f FILE, not both")
        args.manifest = args.manifest_file or args.manifest
        # Taken out: a process the background run starts (its driver) is none.
        background = os.environ.pop(BACKGROUND_RUN_VARIABLE, None)
        if args.detach and background is None:
            return run_detached(args, sys.argv[1:] if argv is None else list(argv))
        handed_over = int(background) if background and background.isdigit() else None
        return _run(args, handed_over_lock=handed_over)
    if args.command == "simulate":
        return _simulate(args)
    if args.command in ("status", "savepoint", "stop", "cancel"):
        return run_control(args)
    source = StorageSource(
        manifest=args.manifest,
        storage=args.storage,
        namespace=args.namespace,
        job=args.job,
        state_dir=args.state_dir,
    )
    if args.command == "list":
        return run_list(source, output=args.output, out=sys.stdout, err=sys.stderr)
    if args.command == "inspect":
        return run_inspect(
            source, args.snapshots, output=args.output, out=sys.stdout, err=sys.stderr
        )
    return run_verify(
        source, args.snapshots, output=args.output, out=sys.stdout, err=sys.stderr, deep=args.deep
    )


def _add_storage_commands(commands: "argparse._SubParsersAction[Parser]") -> None:
    """``list``, ``inspect`` and ``verify``: read-only views of a job's checkpoint storage."""
    job = Parser(add_help=False)
    where = job.add_argument_group(
        "job storage",
        "either -f FILE (storage: spec.checkpointing.storage, else <state-dir>/storage) "
        "or --job (and --namespace; storage: --storage, else <state-dir>/storage)",
    )
    add_manifest_option(where, "a SparkCheckpointJob manifest")
    where.add_argument(
        "--storage",
        metavar="URI",
        help="storage root (path or fsspec URI); default: <state-dir>/storage",
    )
    add_job_options(where)
    where.add_argument(
        "--state-dir",
        type=directory,
        metavar="DIR",
        help="state directory of `spark-checkpoint run`: the registry is read from "
        "<state-dir>/<namespace>/<job>/status.json if present (default: "
        f"{STATE_DIR_NAME} next to the manifest, else in the current directory)",
    )
    order = (
        "Snapshots are in id order, numerically (checkpoint 2 before checkpoint 10); "
        "checkpoints and savepoints take their ids from one counter, so savepoints stand "
        "among the checkpoints in the order they were triggered."
    )
    failed = "a snapshot cannot be read, or there is none"

    listing = commands.add_parser(
        "list",
        parents=[job],
        help="list the checkpoints and savepoints in a job's storage",
        description=(
            "Lists every checkpoint and savepoint directory in the job's storage with its "
            "batch, size, file count, age and whether the local registry lists it; also "
            f"registered snapshots that storage lacks. {order}"
        ),
        epilog=epilog(
            [
                "spark-checkpoint list -f job.yaml",
                "spark-checkpoint list -f job.yaml -o wide   # completion time, duration, path",
                "spark-checkpoint list --storage s3://bucket/ckpt -n analytics --job clicks "
                "-o json",
            ],
            {ExitCode.OK: "listed", ExitCode.FAILED: "storage cannot be listed"},
        ),
    )
    add_output_option(listing, *OutputFormat)

    inspect = commands.add_parser(
        "inspect",
        parents=[job],
        help="show the _metadata of checkpoints and savepoints, a line each",
        description="A line per snapshot with the essentials of its _metadata: batch, "
        "completion time, age, duration, size, files and shared files; -o wide adds the "
        "trigger time, the task count, the query id, the registry and the _metadata path; "
        "-o yaml or -o json print every _metadata in full (acknowledgements, files and "
        f"checksums). Without KIND:ID, every snapshot with a _metadata in storage. {order}",
        epilog=epilog(
            [
                "spark-checkpoint inspect -f job.yaml",
                "spark-checkpoint inspect -f job.yaml checkpoint:7 savepoint:8 -o wide",
                "spark-checkpoint inspect -f job.yaml checkpoint:7 -o yaml   # everything",
            ],
            {ExitCode.OK: "shown", ExitCode.FAILED: failed},
        ),
    )
    inspect.add_argument(
        "snapshots", metavar="KIND:ID", nargs="*", help="e.g. checkpoint:7 (default: all)"
    )
    add_output_option(inspect, *OutputFormat)

    verify = commands.add_parser(
        "verify",
        parents=[job],
        help="check checkpoints and savepoints against their manifests (size and SHA-256)",
        description=(
            "Reads each snapshot's _metadata and checks the size and SHA-256 of every file "
            "it lists. Without KIND:ID, verifies every snapshot with a _metadata in storage "
            f"and every registered one. {order}"
        ),
        epilog=epilog(
            [
                "spark-checkpoint verify -f job.yaml",
                "spark-checkpoint verify -f job.yaml savepoint:4 --deep   # and restorable",
            ],
            {
                ExitCode.OK: "every snapshot is intact (with --deep: and restorable)",
                ExitCode.FAILED: "a snapshot failed verification, or there is none",
            },
        ),
    )
    verify.add_argument(
        "snapshots", metavar="KIND:ID", nargs="*", help="e.g. checkpoint:7 (default: all)"
    )
    add_output_option(verify, OutputFormat.JSON, OutputFormat.YAML)
    verify.add_argument(
        "--deep",
        action="store_true",
        help="also prove each intact snapshot restorable: materialize it into a scratch "
        "directory and let Spark read what a restarted query reads (needs pyspark; slow)",
    )


def _run(args: argparse.Namespace, *, handed_over_lock: int | None) -> int:
    try:
        manifest = load_runnable_manifest(args.manifest)
    except (ManifestError, OSError) as error:
        print(error_lines("spark-checkpoint run", error), file=sys.stderr)
        return ExitCode.USAGE
    display = RunDisplay(sys.stdout, fallback=sys.stderr)
    try:
        with display.showing_logs():  # as the runtime's own lines are
            outcome = asyncio.run(
                run_local(
                    manifest,
                    args.manifest,
                    args.state_dir or default_state_dir(args.manifest),
                    display,
                    metrics_port=args.metrics_port,
                    agent_start_timeout=args.agent_timeout,
                    restore_from=args.restore_from,
                    handed_over_lock=handed_over_lock,
                )
            )
    except RunRefused as error:
        print(f"spark-checkpoint run: {error}", file=sys.stderr)
        return ExitCode.CANCELLED if isinstance(error, RunInterrupted) else ExitCode.FAILED
    exit_codes = {
        TerminalOutcome.FAILED: ExitCode.FAILED,
        TerminalOutcome.CANCELLED: ExitCode.CANCELLED,
    }
    return exit_codes.get(outcome, ExitCode.OK)


def _simulate(args: argparse.Namespace) -> int:
    try:
        config = CoordinatorConfig(
            interval=args.interval,
            min_pause=args.min_pause,
            timeout=args.timeout,
            tolerable_failures=args.tolerable_failures,
            retained=args.retained,
        )
    except ValueError as error:
        print(f"spark-checkpoint simulate: {error}", file=sys.stderr)
        return ExitCode.USAGE
    coordinator = simulate(
        config,
        SimulatedDriver(tasks=args.tasks),
        duration=args.duration,
        seed=args.seed,
        report=lambda at, line: print(f"[{at:8.2f}s] {line}"),
    )
    state = coordinator.persisted_state
    retained = ", ".join(str(c.checkpoint_id) for c in state.checkpoints) or "none"
    print(
        f"\n{state.completed_count} completed, {state.failed_count} failed; "
        f"retained checkpoints: {retained}; "
        f"a restarted coordinator would go on from checkpoint {state.next_checkpoint_id}"
    )
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
