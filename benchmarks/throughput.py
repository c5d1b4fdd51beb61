"""Throughput of the reference word count with and without the checkpoint coordinator.

A: coordinated -- examples/wordcount/pipeline.py under `spark-checkpoint run` with a
   checkpoint every 10 s (agent in the driver, coordinator polling it, snapshots copied to
   local storage, two-phase-commit sink committing on each completed checkpoint);
B: uncoordinated -- the same query and sink started with ``writer.start()``
   (benchmarks/_plain_wordcount.py), no agent, no coordinator.

Both process the same generated input (bounded, ``availableNow``, one file per batch, by
default 40 files x 2000 lines) with ``local[2]``, ``spark.sql.shuffle.partitions=4`` and
the JVM flags of the project's tests (C1 only, serial GC). Reported per run, from the run's
Spark checkpoint location (``offsets/B`` is written when batch B starts, ``commits/B``
when it is committed):

- rows/s over the window from the first batch's start to the last batch's commit (JVM
  start and, for A, the final checkpoint after the last batch are outside it; A's window
  includes the agent, the coordinator's polling and every periodic checkpoint; a first
  attempt has nothing to restore);
- "steady" rows/s: the same without batch 0, which also carries the JVM's first-job
  warm-up;
- the median batch duration (``offsets/B`` -> ``commits/B``).

Runs alternate A/B (ABBA order over pairs) so drift from the machine's other load falls on
both sides; the target is judged on the median of the per-pair ratios. Each output is
checked against ground truth computed without Spark.

    python benchmarks/throughput.py [--quick] [--pairs N] [--files N] [--lines N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _common import (
    EXAMPLE,
    SPARK_CONF,
    LoadSampler,
    add_result_arguments,
    load_average,
    paired_ratios,
    save_results,
    submit_arguments,
    summary,
)
from generate_input import generate
from ground_truth import committed_counts, compare, expected_counts

COMPLETION = re.compile(r" complete(?: \([^)]*\))?: batch ")

HERE = Path(__file__).resolve().parent
JOB = "wordcount-bench"
TARGET = 0.97


def checkpoint_window(location: Path) -> dict[str, Any]:
    """Batch timings from the Spark checkpoint location's files: ``offsets/B`` is written
    when batch B starts, ``commits/B`` when it is committed."""
    commits = sorted(int(n) for n in os.listdir(location / "commits") if n.isdigit())
    last = commits[-1]

    def mtime(log: str, batch: int) -> int:
        return (location / log / str(batch)).stat().st_mtime_ns

    start, first_commit, end = mtime("offsets", 0), mtime("commits", 0), mtime("commits", last)
    durations = [(mtime("commits", b) - mtime("offsets", b)) / 1e9 for b in commits]
    return {
        "batches": last + 1,
        "start_ns": start,
        "end_ns": end,
        # The brief's window: first batch's start -> last batch's commit.
        "seconds": (end - start) / 1e9,
        # Without batch 0, which also carries the JVM's first-job warm-up.
        "steady_seconds": (end - first_commit) / 1e9,
        "batch_seconds_median": statistics.median(durations),
    }


def run_coordinated(directory: Path, input_dir: Path, interval: str) -> dict[str, Any]:
    directory.mkdir(parents=True)
    shutil.copy(EXAMPLE / "pipeline.py", directory / "pipeline.py")
    manifest = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": JOB, "namespace": "default"},
        "spec": {
            "application": {
                "mainFile": "pipeline.py",
                "arguments": ["--input", str(input_dir), "--output", "output", "--bounded"],
                "sparkConf": dict(SPARK_CONF),
            },
            "checkpointing": {
                "interval": interval,
                "minPause": "1s",
                "timeout": "60s",
                "retained": 2,
            },
            "restartPolicy": {"type": "Never"},
        },
    }
    (directory / "job.yaml").write_text(yaml.safe_dump(manifest))
    command = [sys.executable, "-m", "spark_checkpoint_operator.cli", "run", "job.yaml"]
    command += ["--state-dir", "state"]
    started = time.time_ns()
    with (directory / "run.log").open("w") as log:
        code = subprocess.call(command, cwd=directory, stdout=log, stderr=subprocess.STDOUT)
    ended = time.time_ns()
    output = (directory / "run.log").read_text()
    if code != 0:
        raise RuntimeError(f"coordinated run failed ({code}):\n{output}")
    work = directory / "state" / "default" / JOB / "work"
    attempts = sorted(p.name for p in work.iterdir())
    if attempts != ["attempt-1"]:
        raise RuntimeError(f"expected one driver attempt, found {attempts}:\n{output}")
    location = work / "attempt-1" / "checkpoint"
    window = checkpoint_window(location)
    completions = [line for line in output.splitlines() if COMPLETION.search(line)]
    status = json.loads((directory / "state" / "default" / JOB / "status.json").read_text())
    return {
        **window,
        "process_seconds": (ended - started) / 1e9,
        "startup_seconds": (window["start_ns"] - started) / 1e9,
        "after_last_commit_seconds": (ended - window["end_ns"]) / 1e9,
        "checkpoints_completed": len(completions),
        "checkpoints_failed": status["status"]["coordinator"].get("failedCount"),
        "output": directory / "output",
    }


def run_plain(directory: Path, input_dir: Path) -> dict[str, Any]:
    directory.mkdir(parents=True)
    location = directory / "checkpoint"
    command = [sys.executable, str(HERE / "_plain_wordcount.py"), "--input", str(input_dir)]
    command += ["--output", "output", "--checkpoint", str(location)]
    environment = dict(os.environ, PYSPARK_SUBMIT_ARGS=submit_arguments(SPARK_CONF))
    started = time.time_ns()
    with (directory / "run.log").open("w") as log:
        code = subprocess.call(
            command, cwd=directory, env=environment, stdout=log, stderr=subprocess.STDOUT
        )
    ended = time.time_ns()
    if code != 0:
        raise RuntimeError(f"plain run failed ({code}):\n{(directory / 'run.log').read_text()}")
    window = checkpoint_window(location)
    return {
        **window,
        "process_seconds": (ended - started) / 1e9,
        "startup_seconds": (window["start_ns"] - started) / 1e9,
        "after_last_commit_seconds": (ended - window["end_ns"]) / 1e9,
        "output": directory / "output",
    }


def one_run(
    mode: str, directory: Path, input_dir: Path, interval: str, expected: dict[str, int]
) -> dict[str, Any]:
    if mode == "coordinated":
        result = run_coordinated(directory, input_dir, interval)
    else:
        result = run_plain(directory, input_dir)
    diff = compare(expected, committed_counts(result.pop("output")))
    if diff:
        raise RuntimeError(f"{mode} run in {directory}: wrong output: {diff.lines()[:5]}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_result_arguments(parser, quick="one pair of 4 files x 300 lines (CI runs it)")
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--files", type=int)
    parser.add_argument("--lines", type=int)
    parser.add_argument("--interval", default="10s", help="checkpoint interval (default 10s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    pairs = args.pairs or (1 if args.quick else 6)
    files = args.files or (4 if args.quick else 40)
    lines = args.lines or (300 if args.quick else 2000)
    rows = files * lines

    base = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    load = LoadSampler()
    runs: list[dict[str, Any]] = []
    try:
        input_dir = base / "input"
        generate(input_dir, files=files, lines=lines, seed=7)
        expected = expected_counts(input_dir)
        print(
            f"throughput: {files} files x {lines} lines = {rows} rows, {pairs} pairs, "
            f"checkpoint interval {args.interval}, load {load_average()}",
            flush=True,
        )
        for pair in range(pairs):
            order = ("coordinated", "plain") if pair % 2 == 0 else ("plain", "coordinated")
            for mode in order:
                load.sample()
                before = load_average()
                result = one_run(mode, base / f"{mode}-{pair}", input_dir, args.interval, expected)
                if result["batches"] != files:
                    raise RuntimeError(f"{mode} run {pair}: {result['batches']} batches")
                result.update(
                    mode=mode,
                    pair=pair,
                    rows_per_second=rows / result["seconds"],
                    # Every file has `lines` rows and each batch reads one file.
                    steady_rows_per_second=(rows - lines) / result["steady_seconds"],
                    load_before=before,
                    load_after=load_average(),
                )
                load.sample()
                runs.append(result)
                print_run(result)
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    document = {
        "parameters": {
            "files": files,
            "lines": lines,
            "rows": rows,
            "pairs": pairs,
            "interval": args.interval,
            "spark_conf": SPARK_CONF,
        },
        "load_average": load.to_json(),
        **analyse(runs),
        "runs": runs,
    }
    path = save_results("throughput", args, document)
    ratio = document["paired_ratio"]
    print(
        f"coordinated {document['coordinated_rows_per_second']['median']:.0f} rows/s, plain "
        f"{document['plain_rows_per_second']['median']:.0f} rows/s; paired ratio median "
        f"{ratio['median']:.3f} (min {ratio['min']:.3f}, max {ratio['max']:.3f}); steady "
        f"ratio median {document['paired_steady_ratio']['median']:.3f}, batch-time ratio median "
        f"{document['paired_batch_ratio']['median']:.3f}; target >= {TARGET}: "
        f"{'met' if document['target_met'] else 'MISSED'}; load {load.to_json()}; {path}"
    )
    return 0


def print_run(result: dict[str, Any]) -> None:
    extra = (
        f", {result['checkpoints_completed']} checkpoints"
        if result["mode"] == "coordinated"
        else ""
    )
    print(
        f"  pair {result['pair']} {result['mode']:11s}: {result['seconds']:6.2f}s window, "
        f"{result['rows_per_second']:6.0f} rows/s (steady "
        f"{result['steady_rows_per_second']:6.0f}), batch median "
        f"{result['batch_seconds_median']:.2f}s, process "
        f"{result['process_seconds']:.1f}s{extra}, load {result['load_before'][0]}",
        flush=True,
    )


def analyse(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = paired_ratios(runs, "rows_per_second", "coordinated", "plain")
    steady_ratios = paired_ratios(runs, "steady_rows_per_second", "coordinated", "plain")

    def of(mode: str, key: str) -> dict[str, float]:
        return summary([r[key] for r in runs if r["mode"] == mode])

    return {
        "coordinated_rows_per_second": of("coordinated", "rows_per_second"),
        "plain_rows_per_second": of("plain", "rows_per_second"),
        "paired_ratio": summary(ratios),
        "ratios": ratios,
        "coordinated_steady_rows_per_second": of("coordinated", "steady_rows_per_second"),
        "plain_steady_rows_per_second": of("plain", "steady_rows_per_second"),
        "paired_steady_ratio": summary(steady_ratios),
        "steady_ratios": steady_ratios,
        "coordinated_batch_seconds_median": of("coordinated", "batch_seconds_median"),
        "plain_batch_seconds_median": of("plain", "batch_seconds_median"),
        # Plain's median batch time over coordinated's: a throughput ratio that a few slow
        # batches (another session's burst) move less than the window.
        "paired_batch_ratio": summary(
            paired_ratios(runs, "batch_seconds_median", "plain", "coordinated")
        ),
        "target": f"coordinated >= {TARGET}x plain (median of paired ratios)",
        "target_met": summary(ratios)["median"] >= TARGET,
    }


if __name__ == "__main__":
    sys.exit(main())
