"""Bytes written and time per checkpoint as state grows: incremental vs full copies.

A stateful query (``groupBy("k").count()`` over CSV files of long keys, HDFS state store,
``local[2]``, 4 shuffle partitions) runs in this process. Input is fed one file per batch:
the state grows in steps (by default 10 thousand, 100 thousand, then 1 million keys) and
every batch also updates ~1% of the keys already in the state. After each batch commits,
while the query idles, one checkpoint of batch B is taken with the project's own snapshot
and storage modules (``plan_snapshot``, ``pin``, ``CheckpointStorage.add_shared_file``,
``write_metadata``), the way the agent takes it, into three storages:

- ``incremental`` -- one storage root for all checkpoints, content-addressed shared files,
  hard links on a local filesystem (the default the agent uses);
- ``incremental-copy`` -- the same, but with ``link=False``: every new file is copied, as
  it would be uploaded to an object store;
- ``full`` -- a fresh storage root for every checkpoint with ``link=False``: every file of
  the image is copied every time (what a non-incremental checkpoint costs).

Reported per checkpoint: keys in state, new state bytes since the previous checkpoint (the
state files, without Hadoop ``.crc`` files, that appeared in the live location), bytes
stored by each storage (sizes of the files that appeared under its root, ``_metadata``
included), the ratio incremental / new state, and the duration of each.

    python benchmarks/incremental.py [--quick] [--stages 10000:3,100000:3,1000000:4]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import (
    SPARK_CONF,
    LoadSampler,
    load_average,
    save_results,
    submit_arguments,
    summary,
    wait_for_file,
)

from spark_checkpoint.agent.snapshot import pin, plan_snapshot
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    ManifestEntry,
    TaskAcknowledgement,
)

TARGET = 1.2
NAMESPACE, JOB = "default", "incremental-bench"
UPDATE_FRACTION = 0.01


def parse_stages(text: str) -> list[tuple[int, int]]:
    """``keys:batches,...``: grow to `keys` in the stage's first batch, then keep the size
    for the remaining batches (each batch updates ~1% of the keys)."""
    stages = []
    for item in text.split(","):
        keys, _, batches = item.partition(":")
        stages.append((int(keys), int(batches)))
    return stages


def write_input(directory: Path, index: int, keys: list[int]) -> None:
    target = directory / f"part-{index:05d}.csv"
    temporary = directory / f".part-{index:05d}.csv.tmp"
    temporary.write_text("".join(f"{k}\n" for k in keys))
    os.rename(temporary, target)


def files_below(root: Path) -> dict[str, int]:
    """Relative path -> size of every regular file below `root`."""
    found: dict[str, int] = {}
    if not root.exists():
        return found
    for parent, _dirs, names in os.walk(root):
        for name in names:
            path = Path(parent, name)
            found[path.relative_to(root).as_posix()] = path.stat().st_size
    return found


def state_files(location: Path) -> dict[str, int]:
    return {
        path: size
        for path, size in files_below(location / "state").items()
        if not path.endswith(".crc")
    }


def take_checkpoint(
    storage: CheckpointStorage,
    location: Path,
    batch_id: int,
    checkpoint_id: int,
    pin_dir: Path,
    link: bool,
    query_id: str,
) -> tuple[float, CheckpointMetadata]:
    """One checkpoint as the agent takes it: plan, pin, copy per task (2 workers), then
    ``_metadata``. Returns the duration and the metadata."""
    started = time.monotonic()
    trigger_time = datetime.now(UTC)
    plan = plan_snapshot(location, batch_id)
    pin(location, (f for files in plan.files_by_task.values() for f in files), pin_dir)

    def copy_task(task: str, files: tuple[str, ...]) -> tuple[TaskAcknowledgement, list[Any]]:
        task_started = time.monotonic()
        entries: list[ManifestEntry] = [
            storage.add_shared_file(str(pin_dir / relative), relative, link=link)
            for relative in files
        ]
        ack = TaskAcknowledgement(
            task=task,
            files=tuple(e.path for e in entries),
            bytes=sum(e.size for e in entries),
            duration_ms=int((time.monotonic() - task_started) * 1000),
        )
        return ack, entries

    with ThreadPoolExecutor(2) as workers:
        results = list(
            workers.map(lambda item: copy_task(*item), sorted(plan.files_by_task.items()))
        )
    entries = [e for _ack, task_entries in results for e in task_entries]
    metadata = CheckpointMetadata(
        namespace=NAMESPACE,
        job=JOB,
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.CHECKPOINT,
        batch_id=batch_id,
        query_id=query_id,
        trigger_time=trigger_time,
        completion_time=datetime.now(UTC),
        acknowledgements=tuple(ack for ack, _entries in results),
        files=tuple(entries),
        total_bytes=sum(e.size for e in entries),
        properties={"benchmark": "incremental"},
    )
    storage.write_metadata(metadata)
    shutil.rmtree(pin_dir)
    return time.monotonic() - started, metadata


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (< 2 min)")
    parser.add_argument("--stages", help="keys:batches,... (see parse_stages)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    stages = parse_stages(
        args.stages or ("1000:2,10000:3" if args.quick else "10000:3,100000:3,1000000:4")
    )

    base = Path(tempfile.mkdtemp(prefix="bench-incremental-"))
    input_dir, location = base / "input", base / "checkpoint"
    input_dir.mkdir()
    roots = {
        "incremental": base / "storage-incremental",
        "incremental-copy": base / "storage-incremental-copy",
    }
    storages = {
        name: CheckpointStorage(JobStorageLayout(str(root), NAMESPACE, JOB))
        for name, root in roots.items()
    }
    load = LoadSampler()
    rows: list[dict[str, Any]] = []
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_arguments(SPARK_CONF, driver_memory="4g")
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("incremental-bench").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    query = None
    try:
        keys_stream = (
            spark.readStream.schema("k LONG").option("maxFilesPerTrigger", 1).csv(str(input_dir))
        )
        query = (
            keys_stream.groupBy("k")
            .count()
            .writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(location))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        rng = random.Random(42)
        state_size = 0
        batch_id = 0
        previous_state: dict[str, int] = {}
        print(f"incremental: stages {stages}, load {load_average()}", flush=True)
        for target, batches in stages:
            for _ in range(batches):
                updated = rng.sample(range(state_size), int(state_size * UPDATE_FRACTION))
                new = list(range(state_size, max(target, state_size)))
                write_input(input_dir, batch_id, updated + new)
                wait_for_file(location / "commits" / str(batch_id), timeout=900)
                state_size = max(target, state_size)
                load.sample()
                row = measure(storages, roots, base, location, batch_id, previous_state)
                row.update(
                    keys=state_size,
                    keys_updated=len(updated),
                    keys_added=len(new),
                    load=load_average()[0],
                )
                previous_state = state_files(location)
                rows.append(row)
                print(
                    f"  chk {batch_id + 1:2d} batch {batch_id:2d} keys {state_size:8d}: "
                    f"new state {row['new_state_bytes'] / 1e6:8.3f} MB, incremental "
                    f"{row['bytes']['incremental'] / 1e6:8.3f} MB "
                    f"({row['ratio_incremental_to_new_state']:.3f}x) in "
                    f"{row['seconds']['incremental']:.2f}s (copy "
                    f"{row['seconds']['incremental-copy']:.2f}s), full "
                    f"{row['bytes']['full'] / 1e6:8.3f} MB in {row['seconds']['full']:.2f}s, "
                    f"load {row['load']}",
                    flush=True,
                )
                batch_id += 1
    finally:
        if query is not None:
            query.stop()
        spark.stop()
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    # The first checkpoint copies everything in every mode; the claim is about the others.
    later = rows[1:]
    ratios = [r["ratio_incremental_to_new_state"] for r in later]
    document = {
        "parameters": {
            "stages": stages,
            "update_fraction": UPDATE_FRACTION,
            "spark_conf": SPARK_CONF,
            "state_store": "HDFSBackedStateStoreProvider (default)",
        },
        "load_average": load.to_json(),
        "checkpoints": rows,
        "ratio_incremental_to_new_state_after_first": summary(ratios),
        "target": f"incremental bytes <= {TARGET}x new state bytes",
        "target_met_all_after_first": all(r <= TARGET for r in ratios),
        "target_met_state_over_100k_keys": all(
            r["ratio_incremental_to_new_state"] <= TARGET for r in later if r["keys"] >= 100_000
        ),
    }
    path = save_results("incremental", args.quick, document)
    print(
        f"ratio incremental/new-state after the first checkpoint: median "
        f"{summary(ratios)['median']:.3f}, max {summary(ratios)['max']:.3f}; "
        f"target <= {TARGET}: all {document['target_met_all_after_first']}, "
        f">=100k keys {document['target_met_state_over_100k_keys']}; "
        f"load {load.to_json()}; {path}"
    )
    return 0


def measure(
    storages: dict[str, CheckpointStorage],
    roots: dict[str, Path],
    base: Path,
    location: Path,
    batch_id: int,
    previous_state: dict[str, int],
) -> dict[str, Any]:
    checkpoint_id = batch_id + 1
    state = state_files(location)
    new_state = {p: s for p, s in state.items() if p not in previous_state}
    query_id = (location / "metadata").read_text()
    query_id = query_id.split('"id":"', 1)[1].split('"', 1)[0]
    full_root = base / f"storage-full-{checkpoint_id}"
    modes = ["incremental", "incremental-copy", "full"]
    # Rotate the order so that no mode always runs first (colder caches, fresher load).
    shift = batch_id % len(modes)
    seconds: dict[str, float] = {}
    written: dict[str, int] = {}
    for mode in modes[shift:] + modes[:shift]:
        if mode == "full":
            storage = CheckpointStorage(JobStorageLayout(str(full_root), NAMESPACE, JOB))
            root, link = full_root, False
        else:
            storage, root, link = storages[mode], roots[mode], mode == "incremental"
        before = files_below(root)
        seconds[mode], metadata = take_checkpoint(
            storage, location, batch_id, checkpoint_id, base / f"pins-{mode}", link, query_id
        )
        after = files_below(root)
        written[mode] = sum(size for path, size in after.items() if path not in before)
    shutil.rmtree(full_root)
    image_state = sum(e.size for e in metadata.files if e.path.startswith("state/"))
    new_state_bytes = sum(new_state.values())
    return {
        "checkpoint": checkpoint_id,
        "batch": batch_id,
        "new_state_files": len(new_state),
        "new_state_bytes": new_state_bytes,
        "image_files": len(metadata.files),
        "image_bytes": metadata.total_bytes,
        "image_state_bytes": image_state,
        "bytes": written,
        "seconds": seconds,
        "ratio_incremental_to_new_state": written["incremental"] / max(1, new_state_bytes),
        "ratio_full_to_incremental": written["full"] / max(1, written["incremental"]),
    }


if __name__ == "__main__":
    sys.exit(main())
