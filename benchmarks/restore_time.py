"""Restore time: our restore from a checkpoint vs Spark's restart from its live directory.

Setup (not timed): a stateful query (``groupBy("k").count()`` over CSV files of long keys,
HDFS state store, ``local[2]``, 4 shuffle partitions, the reference pipeline's
two-phase-commit sink) builds a few MB of state over a few batches in a live checkpoint
location L; a checkpoint of its last batch B is taken into local storage with the
project's snapshot and storage modules; then one more input file is added.

Each repetition, in one warm Spark session, measures the time until batch B+1 is committed:

- ``spark`` -- Spark's own restart: a new query on the live location (a fresh copy of L,
  made before the clock starts, so every repetition restarts from the same batch B), from
  ``start()`` until ``commits/B+1`` exists;
- ``ours`` -- ``spark_checkpoint.restore.restore`` materializes the checkpoint into a fresh
  location (every file copied out of storage and its SHA-256 checked), the sink's
  ``on_restore`` runs, then the same query starts there, until ``commits/B+1`` exists.

Repetitions alternate (ABBA order over pairs) after one unmeasured warm-up of each. Before
every run the state stores the previous query left loaded in the JVM are unloaded and the
JVM collects garbage (untimed), so each run loads its state from files, as a restarted
driver does.

    python benchmarks/restore_time.py [--quick] [--pairs N] [--keys N] [--batches N]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _checkpoint import query_id_of, take_checkpoint
from _common import (
    SPARK_CONF,
    LoadSampler,
    add_result_arguments,
    load_average,
    paired_ratios,
    save_results,
    submit_arguments,
    summary,
)
from pyspark.sql import DataFrame, SparkSession

from spark_checkpoint.protocol import CheckpointKind, RestoreCandidate
from spark_checkpoint.restore import restore
from spark_checkpoint.sink import TransactionalFileSink
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout

JOB = "default/orders"  # the job the output belongs to (TransactionalFileSink.on_restore)

TARGET = 1.2
NAMESPACE, JOB = "default", "restore-bench"


def write_input(directory: Path, index: int, keys: list[int]) -> None:
    target = directory / f"part-{index:05d}.csv"
    temporary = directory / f".part-{index:05d}.csv.tmp"
    temporary.write_text("".join(f"{k}\n" for k in keys))
    os.rename(temporary, target)


def counts(spark: SparkSession, input_dir: Path) -> DataFrame:
    keys = spark.readStream.schema("k LONG").option("maxFilesPerTrigger", 1).csv(str(input_dir))
    return keys.groupBy("k").count()


def run_to_end(
    spark: SparkSession, input_dir: Path, location: Path, output: Path, batch: int
) -> dict[str, Any]:
    """Start the query on `location` and wait until it ended after committing `batch`.

    Returns the epoch times at which ``offsets/<batch>`` (the batch was planned) and
    ``commits/<batch>`` (it was committed) were written, and Spark's ``durationMs`` of
    the batch."""
    sink = TransactionalFileSink(output)
    query = (
        counts(spark, input_dir)
        .writeStream.outputMode("update")
        .foreachBatch(sink.write_batch)
        .option("checkpointLocation", str(location))
        .trigger(availableNow=True)
        .start()
    )
    commit = location / "commits" / str(batch)
    deadline = time.monotonic() + 600
    while not commit.exists():
        if not query.isActive and not commit.exists():
            raise RuntimeError(f"query ended before batch {batch}: {query.exception()}")
        if time.monotonic() > deadline:
            query.stop()
            raise TimeoutError(f"batch {batch} not committed in {location}")
        time.sleep(0.005)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    progress = next((p for p in query.recentProgress if p.batchId == batch), None)
    return {
        "planned": (location / "offsets" / str(batch)).stat().st_mtime_ns / 1e9,
        "committed": commit.stat().st_mtime_ns / 1e9,
        "duration_ms": dict(progress.durationMs) if progress is not None else {},
    }


def unload_state(spark: SparkSession) -> None:
    """Drop the state stores the finished query left loaded in this JVM (Spark unloads
    them only on its maintenance schedule), as a restarted driver starts without any; then
    collect garbage. Untimed, and done before every run of either kind."""
    jvm = spark._jvm
    assert jvm is not None
    jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
    jvm.java.lang.System.gc()


def spark_restart(
    spark: SparkSession, input_dir: Path, live: Path, work: Path, batch: int
) -> dict[str, Any]:
    location = work / "checkpoint"
    shutil.copytree(live, location)  # before the clock: the live directory as it was at B
    started = time.time()
    run = run_to_end(spark, input_dir, location, work / "output", batch + 1)
    return {
        "seconds": run["committed"] - started,
        "to_planned_seconds": run["planned"] - started,
        "batch_seconds": run["committed"] - run["planned"],
        "duration_ms": run["duration_ms"],
    }


def our_restore(
    spark: SparkSession, input_dir: Path, storage: CheckpointStorage, work: Path, batch: int
) -> dict[str, Any]:
    location = work / "checkpoint"
    sink = TransactionalFileSink(work / "output")
    started = time.time()
    outcome = restore(
        storage, (RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 1),), location
    )
    assert outcome is not None and outcome.batch_id == batch
    sink.on_restore(outcome.batch_id, JOB, checkpoint_location=location)
    restored = time.time()
    run = run_to_end(spark, input_dir, location, work / "output", batch + 1)
    return {
        "seconds": run["committed"] - started,
        "restore_seconds": restored - started,
        "query_seconds": run["committed"] - restored,
        "to_planned_seconds": run["planned"] - started,
        "batch_seconds": run["committed"] - run["planned"],
        "duration_ms": run["duration_ms"],
    }


def build_state(
    spark: SparkSession, base: Path, storage: CheckpointStorage, keys: int, batches: int
) -> dict[str, Any]:
    """`keys` keys over `batches` batches (~1% of the keys updated in each) in the live
    location, a checkpoint of the last batch, and the input of the next batch."""
    input_dir, live = base / "input", base / "live"
    rng = random.Random(3)
    size = 0
    for index in range(batches):
        target = keys * (index + 1) // batches
        updated = rng.sample(range(size), size // 100)
        write_input(input_dir, index, updated + list(range(size, target)))
        size = target
    last = batches - 1
    started = time.monotonic()
    run_to_end(spark, input_dir, live, base / "live-output", last)
    build_seconds = time.monotonic() - started
    checkpoint_seconds, metadata = take_checkpoint(
        storage,
        live,
        batch_id=last,
        checkpoint_id=1,
        pin_dir=base / "pins",
        link=True,
        query_id=query_id_of(live),
    )
    # The batch both restarts run: ~1% of the keys updated and 1% new keys.
    updated = rng.sample(range(size), size // 100)
    write_input(input_dir, batches, updated + list(range(size, size * 101 // 100)))
    return {
        "keys": size,
        "batches": batches,
        "batch": last,
        "metadata": metadata,
        "state_bytes": sum(e.size for e in metadata.files if e.path.startswith("state/")),
        "build_seconds": build_seconds,
        "checkpoint_seconds": checkpoint_seconds,
    }


def analyse(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = paired_ratios(runs, "seconds", "ours", "spark")
    ours = [r for r in runs if r["mode"] == "ours"]
    return {
        "spark_seconds": summary([r["seconds"] for r in runs if r["mode"] == "spark"]),
        "ours_seconds": summary([r["seconds"] for r in ours]),
        "ours_restore_seconds": summary([r["restore_seconds"] for r in ours]),
        "ours_query_seconds": summary([r["query_seconds"] for r in ours]),
        "paired_ratio": summary(ratios),
        "ratios": ratios,
        "target": f"ours <= {TARGET}x spark (median of paired ratios)",
        "target_met": summary(ratios)["median"] <= TARGET,
    }


def print_run(result: dict[str, Any]) -> None:
    detail = (
        f" (restore {result['restore_seconds']:.3f}s + query {result['query_seconds']:.2f}s)"
        if result["mode"] == "ours"
        else ""
    )
    print(
        f"  pair {result['pair']} {result['mode']:5s}: {result['seconds']:.2f}s{detail}, "
        f"planned after {result['to_planned_seconds']:.2f}s, batch "
        f"{result['batch_seconds']:.2f}s {result['duration_ms']}, load {result['load_before']}",
        flush=True,
    )


def start_spark() -> SparkSession:
    conf = {**SPARK_CONF, "spark.ui.showConsoleProgress": "false"}
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_arguments(conf, driver_memory="3g")
    spark = SparkSession.builder.appName("restore-bench").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_result_arguments(parser, quick="one pair, 20,000 keys in 2 batches (CI runs it)")
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--keys", type=int, help="keys in the state")
    parser.add_argument("--batches", type=int, help="batches that build the state")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    pairs = args.pairs or (1 if args.quick else 20)
    keys = args.keys or (20_000 if args.quick else 800_000)
    batches = args.batches or (2 if args.quick else 4)

    base = Path(tempfile.mkdtemp(prefix="bench-restore-"))
    input_dir, live = base / "input", base / "live"
    input_dir.mkdir()
    storage = CheckpointStorage(JobStorageLayout(str(base / "storage"), NAMESPACE, JOB))
    spark = start_spark()
    load = LoadSampler()
    runs: list[dict[str, Any]] = []
    try:
        setup = build_state(spark, base, storage, keys, batches)
        last, metadata = setup["batch"], setup.pop("metadata")
        print(
            f"restore: {setup['keys']} keys, {len(metadata.files)} files, state "
            f"{setup['state_bytes'] / 1e6:.2f} MB (image {metadata.total_bytes / 1e6:.2f} MB), "
            f"built in {setup['build_seconds']:.0f}s, checkpoint in "
            f"{setup['checkpoint_seconds']:.2f}s; {pairs} pairs; load {load_average()}",
            flush=True,
        )
        for pair in range(-1, pairs):  # pair -1 is the warm-up
            order = ("spark", "ours") if pair % 2 == 0 else ("ours", "spark")
            for mode in order:
                work = base / f"{mode}-{pair + 1}"
                unload_state(spark)
                load.sample()
                before = load_average()[0]
                result = (
                    spark_restart(spark, input_dir, live, work, last)
                    if mode == "spark"
                    else our_restore(spark, input_dir, storage, work, last)
                )
                shutil.rmtree(work)
                if pair < 0:
                    print(f"  warm-up {mode:5s}: {result['seconds']:.2f}s", flush=True)
                    continue
                result.update(mode=mode, pair=pair, load_before=before)
                runs.append(result)
                print_run(result)
    finally:
        spark.stop()
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    document = {
        "parameters": {
            **setup,
            "pairs": pairs,
            "spark_conf": SPARK_CONF,
            "image_files": len(metadata.files),
            "image_bytes": metadata.total_bytes,
        },
        "load_average": load.to_json(),
        **analyse(runs),
        "runs": runs,
    }
    path = save_results("restore_time", args, document)
    ratio = document["paired_ratio"]
    print(
        f"spark {document['spark_seconds']['median']:.2f}s, ours "
        f"{document['ours_seconds']['median']:.2f}s (of which restore "
        f"{document['ours_restore_seconds']['median']:.3f}s); paired ratio median "
        f"{ratio['median']:.3f} (min {ratio['min']:.3f}, max {ratio['max']:.3f}); target <= "
        f"{TARGET}: {'met' if document['target_met'] else 'MISSED'}; load {load.to_json()}; "
        f"{path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
