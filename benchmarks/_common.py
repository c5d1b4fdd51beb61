"""Shared helpers of the benchmarks: paths, Spark settings, load and statistics."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_checkpoint_operator import driver_command

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "wordcount"
RESULTS = Path(__file__).resolve().parent / "results"
# spark_checkpoint and spark_checkpoint_operator are installed in the venv; the example's
# modules (generate_input, ground_truth) are imported from its directory.
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

# The JVM flags of tests/helpers/spark_jvm.py: C1 only and the serial collector roughly halve
# JVM start and first-job time on this 2-core machine and keep JIT threads from competing
# with the measured work. Both sides of every comparison use the same settings.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_CONF: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": FAST_JVM,
}


# Spark's Python workers run this interpreter, as `spark-checkpoint run` makes them: the
# sink's tasks import spark_checkpoint there (the plain runs and in-process sessions too).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def submit_arguments(conf: Mapping[str, str], driver_memory: str | None = None) -> str:
    """PYSPARK_SUBMIT_ARGS as `spark-checkpoint run` builds them (same conf, same order)."""
    arguments = driver_command.submit_arguments(conf)
    if driver_memory:
        arguments = f"--driver-memory {driver_memory} {arguments}"
    return arguments


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median and spread (min, max) of a sample."""
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def paired_ratios(runs: Sequence[Mapping[str, Any]], key: str, a: str, b: str) -> list[float]:
    """``run[key]`` of mode `a` divided by that of mode `b`, for each pair of runs."""
    by_pair: dict[int, dict[str, Mapping[str, Any]]] = {}
    for run in runs:
        by_pair.setdefault(run["pair"], {})[run["mode"]] = run
    return [float(p[a][key]) / float(p[b][key]) for _pair, p in sorted(by_pair.items())]


def machine() -> dict[str, Any]:
    memory_kib = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
    }


class LoadSampler:
    """Samples the 1-minute load average while a benchmark runs."""

    def __init__(self) -> None:
        self.samples: list[float] = [load_average()[0]]

    def sample(self) -> None:
        self.samples.append(load_average()[0])

    def to_json(self) -> dict[str, float]:
        return {
            "min": min(self.samples),
            "median": statistics.median(self.samples),
            "max": max(self.samples),
        }


def code_fingerprint() -> str:
    """SHA-256 over the code under test (operator/, spark_app/, the example), so a result
    says which code it measured even when the working tree changes between runs."""
    digest = hashlib.sha256()
    for directory in (ROOT / "operator", ROOT / "spark_app", EXAMPLE):
        for path in sorted(directory.rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


STARTED = datetime.now(UTC).isoformat(timespec="seconds")
START_CODE = code_fingerprint()
START_COMMIT = git_commit()


def add_result_arguments(parser: argparse.ArgumentParser, quick: str) -> None:
    """--quick (described by `quick`) and --results-dir, the same in every benchmark."""
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS,
        help="where <name>[-quick].json goes (default: benchmarks/results)",
    )


def save_results(name: str, args: argparse.Namespace, document: dict[str, Any]) -> Path:
    directory: Path = args.results_dir
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}{'-quick' if args.quick else ''}.json"
    end_code = code_fingerprint()
    document = {
        "benchmark": name,
        "quick": args.quick,
        "started": STARTED,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "code": {
            "commit_at_start": START_COMMIT,
            "commit_at_end": git_commit(),
            "fingerprint_at_start": START_CODE,
            "fingerprint_at_end": end_code,
            "changed_during_run": end_code != START_CODE,
        },
        **document,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def wait_for_file(path: Path, timeout: float, poll: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f}s")
        time.sleep(poll)


def write_input(directory: Path, index: int, keys: list[int]) -> None:
    """One CSV input file of `keys`, renamed into place whole (a file source must never see
    half of it)."""
    temporary = directory / f".part-{index:05d}.csv.tmp"
    temporary.write_text("".join(f"{k}\n" for k in keys))
    os.rename(temporary, directory / f"part-{index:05d}.csv")


def start_key_count(
    spark: SparkSession, input_dir: Path, location: Path, trigger: str
) -> StreamingQuery:
    """The benchmarks' stateful query: ``groupBy("k").count()`` over the CSV files of
    `input_dir` (one file per batch, see `write_input`), into the `noop` sink."""
    keys = spark.readStream.schema("k LONG").option("maxFilesPerTrigger", 1)
    return (
        keys.csv(str(input_dir))
        .groupBy("k")
        .count()
        .writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(location))
        .trigger(processingTime=trigger)
        .start()
    )
