"""The ``spark-checkpoint`` command line."""

import argparse
import asyncio
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from spark_checkpoint_operator.control_commands import add_control_commands, run_control
from spark_checkpoint_operator.coordinator import CoordinatorConfig, TerminalOutcome
from spark_checkpoint_operator.detached_run import run_detached
from spark_checkpoint_operator.local_runtime import (
    AGENT_START_TIMEOUT_SECONDS,
    RunRefused,
    run_local,
)
from spark_checkpoint_operator.local_state import STATE_DIR_NAME, default_state_dir
from spark_checkpoint_operator.manifest.loading import load_manifest
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.run_display import RunDisplay
from spark_checkpoint_operator.simulation import SimulatedDriver, simulate
from spark_checkpoint_operator.storage_commands.commands import run_inspect, run_list, run_verify
from spark_checkpoint_operator.storage_commands.job import StorageSource


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-checkpoint",
        description="Flink-grade checkpoint coordination for Spark Structured Streaming.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version('spark-checkpoint-operator')}",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="run a SparkCheckpointJob manifest on this machine (the embedded default)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Validates the manifest against the CRD schema, starts the driver as a local "
            "process under the checkpoint coordinator, restarts it with restore when it "
            "dies, and on Ctrl-C takes a savepoint and stops. From another terminal: "
            "`spark-checkpoint status`, `savepoint`, `stop` and `cancel` with the same -f."
        ),
        epilog=RUN_EPILOG,
    )
    manifest = run.add_mutually_exclusive_group(required=True)
    manifest.add_argument(
        "-f", "--manifest", dest="manifest_file", type=Path, metavar="FILE", help="the manifest"
    )
    manifest.add_argument(
        "manifest", type=Path, nargs="?", metavar="FILE", help="the manifest (as -f FILE)"
    )
    run.add_argument(
        "--from",
        dest="restore_from",
        metavar="IMAGE",
        help="restore savepoint:N, checkpoint:N (of the job's registry) or the savepoint at "
        "PATH instead of the newest image; checked before Spark starts",
    )
    run.add_argument(
        "--detach",
        action="store_true",
        help="run in the background (output in <state-dir>/<namespace>/<job>/logs/"
        "runtime.log); return once the run answers `spark-checkpoint status`",
    )
    run.add_argument(
        "--state-dir",
        type=Path,
        help="status, driver logs, work directories and default storage "
        f"(default: {STATE_DIR_NAME} next to the manifest)",
    )
    run.add_argument(
        "--agent-timeout",
        type=float,
        metavar="SECONDS",
        default=AGENT_START_TIMEOUT_SECONDS,
        help="fail the job if a started driver's checkpoint agent has not answered within "
        "SECONDS (a pipeline that does not call run_coordinated) (default: %(default).0f)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
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
    )
    simulation.add_argument("--duration", type=float, default=120.0, help="virtual seconds")
    simulation.add_argument("--interval", type=float, default=10.0)
    simulation.add_argument("--min-pause", type=float, default=2.0)
    simulation.add_argument("--timeout", type=float, default=8.0)
    simulation.add_argument("--tolerable-failures", type=int, default=1)
    simulation.add_argument("--retained", type=int, default=2)
    simulation.add_argument("--tasks", type=int, default=4)
    simulation.add_argument("--seed", type=int, default=1)

    _add_storage_commands(commands)

    add_control_commands(commands)

    args = parser.parse_args(argv)
    if args.command == "run":
        args.manifest = args.manifest_file or args.manifest
        return (
            run_detached(args, sys.argv[1:] if argv is None else list(argv))
            if args.detach
            else _run(args)
        )
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
        return run_list(source, as_json=args.json, out=sys.stdout, err=sys.stderr)
    if args.command == "inspect":
        return run_inspect(
            source,
            args.snapshot,
            as_json=args.json,
            show_files=args.files,
            out=sys.stdout,
            err=sys.stderr,
        )
    return run_verify(
        source, args.snapshots, as_json=args.json, out=sys.stdout, err=sys.stderr, deep=args.deep
    )


def _add_storage_commands(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """``list``, ``inspect`` and ``verify``: read-only views of a job's checkpoint storage."""
    job = argparse.ArgumentParser(add_help=False)
    where = job.add_argument_group(
        "job storage",
        "either --manifest (storage: spec.checkpointing.storage, else <state-dir>/storage) "
        "or all of --storage, --namespace and --job",
    )
    where.add_argument(
        "--manifest", "-f", type=Path, metavar="FILE", help="a SparkCheckpointJob manifest"
    )
    where.add_argument("--storage", metavar="URI", help="storage root (path or fsspec URI)")
    where.add_argument("--namespace", "-n", metavar="NS", help="the job's namespace")
    where.add_argument("--job", metavar="NAME", help="the job's name")
    where.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="state directory of `spark-checkpoint run`: the registry is read from "
        "<state-dir>/<namespace>/<job>/status.json if present (default: "
        f"{STATE_DIR_NAME} next to the manifest, else in the current directory)",
    )

    listing = commands.add_parser(
        "list",
        parents=[job],
        help="list the checkpoints and savepoints in a job's storage",
        description=(
            "Lists every checkpoint and savepoint directory in the job's storage with its "
            "batch, size, file count, age and whether the local registry lists it; also "
            "registered snapshots that storage lacks."
        ),
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")

    inspect = commands.add_parser(
        "inspect",
        parents=[job],
        help="show the _metadata of one checkpoint or savepoint",
        description="Summarizes a snapshot's _metadata: times, batch, query id, task "
        "acknowledgements, total bytes and shared files. Exit 1 if it cannot be read.",
    )
    inspect.add_argument("snapshot", metavar="KIND:ID", help="e.g. checkpoint:7 or savepoint:2")
    inspect.add_argument("--json", action="store_true", help="print the _metadata document")
    inspect.add_argument("--files", action="store_true", help="also list the manifest's files")

    verify = commands.add_parser(
        "verify",
        parents=[job],
        help="check checkpoints and savepoints against their manifests (size and SHA-256)",
        description=(
            "Reads each snapshot's _metadata and checks the size and SHA-256 of every file "
            "it lists. Without KIND:ID, verifies every snapshot with a _metadata in storage "
            "and every registered one. Exit 0 only if all are OK, 1 otherwise."
        ),
    )
    verify.add_argument(
        "snapshots", metavar="KIND:ID", nargs="*", help="e.g. checkpoint:7 (default: all)"
    )
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.add_argument(
        "--deep",
        action="store_true",
        help="also prove each intact snapshot restorable: materialize it into a scratch "
        "directory and let Spark read what a restarted query reads (needs pyspark; slow)",
    )


def _run(args: argparse.Namespace) -> int:
    try:
        manifest = load_manifest(args.manifest)
    except (ManifestError, OSError) as error:
        print(f"spark-checkpoint run: {error}", file=sys.stderr)
        return 2
    display = RunDisplay(sys.stdout)
    # What libraries log is shown as the runtime's own lines are.
    logging.basicConfig(level=logging.WARNING, handlers=[display.log_handler()], force=True)
    try:
        outcome = asyncio.run(
            run_local(
                manifest,
                args.manifest,
                args.state_dir or default_state_dir(args.manifest),
                display,
                metrics_port=args.metrics_port,
                agent_start_timeout=args.agent_timeout,
                restore_from=args.restore_from,
            )
        )
    except RunRefused as error:
        print(f"spark-checkpoint run: {error}", file=sys.stderr)
        return 1
    exit_codes = {TerminalOutcome.FAILED: 1, TerminalOutcome.CANCELLED: 130}
    return exit_codes.get(outcome, 0)


RUN_EPILOG = """examples:
  spark-checkpoint run -f job.yaml                       # Ctrl-C: savepoint, then stop
  spark-checkpoint run -f job.yaml --detach              # in the background
  spark-checkpoint run -f job.yaml --from savepoint:4    # restore savepoint 4, not the newest

exit codes:
  0    the job Finished, or stopped with a savepoint (Suspended)
  1    the job Failed, or the run was refused (another run of the job, a Finished job,
       an image --from cannot restore)
  2    the manifest cannot be read or is invalid
  130  cancelled (a second Ctrl-C, or `spark-checkpoint cancel`)
"""


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
        return 2
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
        f"retained checkpoints: {retained}; next checkpoint id: {state.next_checkpoint_id}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
