"""The ``spark-checkpoint`` command line."""

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from spark_checkpoint_operator.coordinator import CoordinatorConfig, TerminalOutcome
from spark_checkpoint_operator.local_runtime import run_local
from spark_checkpoint_operator.manifest import ManifestError, load_manifest
from spark_checkpoint_operator.simulation import SimulatedAgent, simulate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-checkpoint",
        description="Flink-grade checkpoint coordination for Spark Structured Streaming.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="run a SparkCheckpointJob manifest on this machine (the embedded default)",
        description=(
            "Validates the manifest against the CRD schema, starts the driver as a local "
            "process under the checkpoint coordinator, restarts it with restore when it "
            "dies, and on Ctrl-C takes a savepoint and stops."
        ),
    )
    run.add_argument("manifest", type=Path)
    run.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".spark-checkpoint"),
        help="status, driver logs, work directories and default storage (default: %(default)s)",
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

    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    return _simulate(args)


def _run(args: argparse.Namespace) -> int:
    try:
        manifest = load_manifest(args.manifest)
    except (ManifestError, OSError) as error:
        print(f"spark-checkpoint run: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def report(line: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {line}", flush=True)

    outcome = asyncio.run(run_local(manifest, args.manifest, args.state_dir, report))
    return 1 if outcome is TerminalOutcome.FAILED else 0


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
        SimulatedAgent(tasks=args.tasks),
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
