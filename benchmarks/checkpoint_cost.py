"""What a checkpoint costs beyond its physical limit, by shuffle partitions, state
provider and storage.

A stateful query (``groupBy("k").count()`` over CSV files, ``local[2]``) runs in this
process with ``spark.sql.shuffle.partitions`` = P, the HDFS-backed or the RocksDB state
provider. After each batch commits, while the query idles, checkpoints of that batch are
taken the way a job takes them: the real agent (``CheckpointAgent`` behind its HTTP
server) and, in place of the supervisor, the control plane's ``AgentClient`` doing what
the supervisor does (trigger; long-poll the status until every task acknowledged, the
agent gathering acknowledgements for up to ``ACKNOWLEDGEMENT_GATHER_SECONDS``; finalize,
which writes ``_metadata``; the registry written as the local status file; complete). One agent per
storage: local (hard links) and S3 (moto's server in a subprocess, through s3fs).

**Snapshot cost** = trigger to complete, minus the wait for the batch to commit. Here the
batch is committed and the query idle before the trigger, so that wait is zero by
construction and the snapshot cost is the whole trigger-to-complete time.

**Physical limit**, measured right after each checkpoint on the same files: a loop that
only links (local) or uploads (S3, one PUT each) the files the checkpoint had to store (its
image's files that the previous image did not have; every file for the first) and then
writes one file of ``_metadata``'s size (fsynced locally, one PUT on S3). The live Spark
location is on the driver's local disk, so an object store receives the new bytes by
upload: there is nothing it could copy server-side.

**Same batch again**, right after each measured checkpoint: another checkpoint of the same
batch, whose files are all unchanged and stored. What it costs (the protocol's requests,
the registry, one ``_metadata``, a size check per file) every checkpoint pays, whatever
changed.

Reported per row (P x provider x storage): the median over the checkpoints after the first
of cost / limit (paired per checkpoint), the times themselves, files and bytes stored,
the same-batch cost and the ``_metadata`` size. ``--profile`` adds where the agent's time
goes (perf_counter spans around storage and snapshot functions, summed over threads).

    python benchmarks/checkpoint_cost.py [--quick] [--partitions 4,200,1000]
        [--providers hdfs,rocksdb] [--storages local,s3] [--checkpoints 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import (
    SPARK_CONF,
    LoadSampler,
    add_result_arguments,
    load_average,
    save_results,
    start_key_count,
    submit_arguments,
    summary,
    wait_for_file,
    write_input,
)
from pyspark.sql import SparkSession

from spark_checkpoint.agent import agent as agent_module
from spark_checkpoint.agent import snapshot as snapshot_module
from spark_checkpoint.agent.agent import CheckpointAgent, QueryView
from spark_checkpoint.agent.server import AgentServer
from spark_checkpoint.protocol import (
    ACKNOWLEDGEMENT_GATHER_SECONDS,
    AfterCompletion,
    CheckpointKind,
    QueryState,
    SnapshotPhase,
)
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout
from spark_checkpoint.storage import filesystem as filesystem_module
from spark_checkpoint.storage import metadata as metadata_module
from spark_checkpoint.storage import store as store_module
from spark_checkpoint_operator.agent_client import AgentClient
from spark_checkpoint_operator.status import StatusFile

TARGET = 2.0
NAMESPACE, JOB = "default", "checkpoint-cost"
PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
KEYS = 20_000
UPDATED_KEYS = 200  # per batch after the first: 1% of the keys
BUCKET = "checkpoints"


# --- the physical limit --------------------------------------------------------------------


def local_limit(location: Path, files: list[str], metadata_size: int, scratch: Path) -> float:
    """Link each file once and write one durable file of ``_metadata``'s size."""
    scratch.mkdir(parents=True)
    started = time.perf_counter()
    for index, relative in enumerate(files):
        os.link(location / relative, scratch / str(index))
    with open(scratch / "_metadata", "wb") as target:
        target.write(b"x" * metadata_size)
        target.flush()
        os.fsync(target.fileno())
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch)
    return seconds


def s3_limit(fs: Any, location: Path, files: list[str], metadata_size: int, prefix: str) -> float:
    """One PUT per file and one of ``_metadata``'s size, one after another."""
    started = time.perf_counter()
    for index, relative in enumerate(files):
        fs.put_file(str(location / relative), f"{prefix}/{index}")
    fs.pipe_file(f"{prefix}/_metadata", b"x" * metadata_size)
    seconds = time.perf_counter() - started
    fs.rm(prefix, recursive=True)
    return seconds


# --- where the agent's time goes (--profile) -----------------------------------------------


class Spans:
    """Total perf_counter time and calls per wrapped function, over all threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                with self._lock:
                    self.seconds[name] += elapsed
                    self.calls[name] += 1

        setattr(owner, attribute, timed)
        self._undo.append(lambda: setattr(owner, attribute, original))

    def take(self) -> dict[str, dict[str, float]]:
        with self._lock:
            taken = {
                name: {"seconds": round(self.seconds[name], 4), "calls": self.calls[name]}
                for name in sorted(self.seconds)
            }
            self.seconds.clear()
            self.calls.clear()
        return taken


def instrument(spans: Spans) -> None:
    """Spans around what a checkpoint does, in the modules that call it."""
    fs_class = filesystem_module.StorageFileSystem
    for owner, attribute, name in [
        (snapshot_module, "plan_snapshot", "plan"),
        (agent_module, "plan_snapshot", "plan"),
        (agent_module, "pin", "pin (hard links)"),
        (store_module, "digest_local_file", "sha256 of the source"),
        (filesystem_module, "digest_local_file", "sha256 of the source"),
        (filesystem_module, "_fsync_path", "fsync"),
        (fs_class, "file_size", "stat/HEAD of a stored file"),
        (fs_class, "link_in", "link into shared/"),
        (fs_class, "copy_in", "copy/upload into shared/"),
        (fs_class, "write_atomic", "_metadata write"),
        (store_module.CheckpointStorage, "write_metadata", "finalize: write_metadata"),
        (metadata_module.CheckpointMetadata, "to_json", "_metadata JSON encoding"),
        (CheckpointAgent, "status", "status document"),
        (CheckpointAgent, "_copy_task", "snapshot task (whole)"),
    ]:
        if hasattr(owner, attribute):
            spans.wrap(owner, attribute, name)


# --- the coordinator's side, as the supervisor does it --------------------------------------


async def coordinate(
    client: AgentClient, checkpoint_id: int, registry: StatusFile, changes: list[float]
) -> dict[str, float]:
    """One checkpoint, trigger to complete; the seconds of each step. ``changes``: when the
    agent reported progress (its watch calls), to tell its own time from the polls'."""
    steps: dict[str, float] = {}
    started = mark = time.perf_counter()
    first = await client.read_status()
    tasks = first.tasks
    await client.trigger(checkpoint_id, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    steps["trigger"] = time.perf_counter() - mark
    version = first.version
    polls = 0
    mark = time.perf_counter()
    while True:
        status = await client.read_status(after=version, wait=30.0)
        polls += 1
        version = status.version
        (snapshot,) = [s for s in status.checkpoints if s.checkpoint_id == checkpoint_id]
        if snapshot.declines:
            raise RuntimeError(f"checkpoint {checkpoint_id} declined: {snapshot.declines}")
        if snapshot.state is SnapshotPhase.ACKNOWLEDGED:
            break
    answered = time.perf_counter()
    steps["tasks until all acknowledged"] = answered - mark
    steps["status polls"] = polls
    # The agent's last progress before the answer is its last task's acknowledgement; the
    # rest of the wait ("pacing") is how long that news took to reach the coordinator.
    acknowledged = max(t for t in changes if t <= answered)
    steps["status pacing"] = answered - acknowledged
    mark = time.perf_counter()
    await client.finalize(checkpoint_id, tasks)
    steps["finalize (_metadata)"] = time.perf_counter() - mark
    mark = time.perf_counter()
    replace(registry, status={"coordinator": {"completed": [{"id": checkpoint_id}]}}).write()
    steps["registry"] = time.perf_counter() - mark
    mark = time.perf_counter()
    assert snapshot.batch_id is not None
    await client.complete(checkpoint_id, snapshot.batch_id)
    steps["complete"] = time.perf_counter() - mark
    steps["total"] = time.perf_counter() - started
    return steps


class AgentUnderTest:
    """An agent with its HTTP server on one storage root, over one live location."""

    def __init__(self, root: str, location: Path, pin_root: Path, registry: Path) -> None:
        self.storage = CheckpointStorage(JobStorageLayout(root, NAMESPACE, JOB))
        self.agent = CheckpointAgent(
            storage=self.storage,
            location=location,
            pin_root=pin_root,
            participants=[],
            attempt=1,
        )
        self.agent.query_started(lambda: QueryView(QueryState.RUNNING), None, lambda moment: True)
        self.token = secrets.token_hex(16)
        port = free_port()
        self.server = AgentServer(self.agent, self.token, "127.0.0.1", port)
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"
        self.registry = StatusFile(registry, JOB, NAMESPACE, None, None)
        self.changes: list[float] = []
        self.agent.watch(lambda _acknowledgement_only: self.changes.append(time.perf_counter()))

    def checkpoint(self, checkpoint_id: int) -> dict[str, float]:
        async def run() -> dict[str, float]:
            client = AgentClient(self.url, self.token, timeout=600)
            try:
                return await coordinate(client, checkpoint_id, self.registry, self.changes)
            finally:
                await client.close()

        return asyncio.run(run())

    def close(self) -> None:
        self.server.stop()
        self.agent.close()


@contextmanager
def s3_server() -> Iterator[tuple[str, dict[str, str]]]:
    """moto's S3 server as a subprocess on a loopback port, with one bucket."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    environment = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield endpoint, environment
    finally:
        process.terminate()
        process.wait(timeout=10)


def s3_filesystem(endpoint: str) -> Any:
    import fsspec  # noqa: PLC0415

    return fsspec.filesystem(
        "s3", skip_instance_cache=True, endpoint_url=endpoint, key="testing", secret="testing"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- the query ---------------------------------------------------------------------------


def run_case(
    spark: SparkSession,
    base: Path,
    *,
    partitions: int,
    provider: str,
    storages: dict[str, str],
    s3: Any,
    checkpoints: int,
    spans: Spans | None,
    load: LoadSampler,
) -> list[dict[str, Any]]:
    """One query at P partitions with one provider; ``checkpoints`` + 1 batches, each
    checkpointed into every storage and paired with its limit."""
    case = base / f"{provider}-{partitions}"
    input_dir, location = case / "input", case / "checkpoint"
    input_dir.mkdir(parents=True)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[provider])
    agents = {
        name: AgentUnderTest(root, location, case / f"pins-{name}", case / f"status-{name}.json")
        for name, root in storages.items()
    }
    rng = random.Random(partitions)
    previous: set[str] = set()
    rows: list[dict[str, Any]] = []
    query = start_key_count(spark, input_dir, location, "200 milliseconds")
    try:
        for batch_id in range(checkpoints + 1):
            keys = list(range(KEYS)) if batch_id == 0 else rng.sample(range(KEYS), UPDATED_KEYS)
            batch_started = time.perf_counter()
            write_input(input_dir, batch_id, keys)
            wait_for_file(location / "commits" / str(batch_id), timeout=1800)
            batch_seconds = time.perf_counter() - batch_started
            time.sleep(0.5)  # the query's next trigger finds no input: idle
            load.sample()
            plan = snapshot_module.plan_snapshot(location, batch_id)
            image = sorted(f for files in plan.files_by_task.values() for f in files)
            stored = [f for f in image if f not in previous]
            previous = set(image)
            names = list(storages)
            if batch_id % 2:
                names.reverse()
            for storage_name in names:
                under_test = agents[storage_name]
                checkpoint_id = 2 * batch_id + 1
                if spans:
                    spans.take()
                steps = under_test.checkpoint(checkpoint_id)
                profile = spans.take() if spans else None
                metadata_size = len(
                    under_test.storage.fs.read_bytes(
                        under_test.storage.layout.metadata_path(
                            CheckpointKind.CHECKPOINT, checkpoint_id
                        )
                    )
                )
                # The same batch again: every file is unchanged and stored, so what it
                # costs is the protocol, the registry and one `_metadata` (fixed per
                # checkpoint, whatever changed).
                fixed = under_test.checkpoint(checkpoint_id + 1)["total"]
                if storage_name == "local":
                    limit = local_limit(location, stored, metadata_size, case / "limit")
                else:
                    prefix = f"{BUCKET}/limit-{provider}-{partitions}-{batch_id}"
                    limit = s3_limit(s3, location, stored, metadata_size, prefix)
                row = {
                    "partitions": partitions,
                    "provider": provider,
                    "storage": storage_name,
                    "checkpoint": checkpoint_id,
                    "first": batch_id == 0,
                    "batch_seconds": round(batch_seconds, 3),
                    "tasks": len(plan.files_by_task),
                    "image_files": len(image),
                    "stored_files": len(stored),
                    "stored_bytes": sum((location / f).stat().st_size for f in stored),
                    "metadata_bytes": metadata_size,
                    "cost_seconds": round(steps["total"], 4),
                    "limit_seconds": round(limit, 4),
                    "fixed_cost_seconds": round(fixed, 4),
                    "ratio": steps["total"] / limit,
                    "steps": {k: round(v, 4) for k, v in steps.items()},
                    "load": load_average()[0],
                }
                if profile is not None:
                    row["profile"] = profile
                rows.append(row)
                print_row(row)
    finally:
        query.stop()
        for under_test in agents.values():
            under_test.close()
        shutil.rmtree(case, ignore_errors=True)
    return rows


def print_row(row: dict[str, Any]) -> None:
    steps = row["steps"]
    print(
        f"  P={row['partitions']:5d} {row['provider']:7s} {row['storage']:5s} "
        f"chk {row['checkpoint']}: {row['image_files']:5d} files, {row['stored_files']:5d} "
        f"stored ({row['stored_bytes'] / 1e3:.0f} kB), _metadata "
        f"{row['metadata_bytes'] / 1e3:.0f} kB; cost {row['cost_seconds']:.3f}s "
        f"(acks {steps['tasks until all acknowledged']:.3f}s in {steps['status polls']:.0f} "
        f"polls, pacing {steps['status pacing']:.3f}s, finalize "
        f"{steps['finalize (_metadata)']:.3f}s), same batch again "
        f"{row['fixed_cost_seconds']:.3f}s, limit {row['limit_seconds']:.3f}s: "
        f"{row['ratio']:.2f}x; batch "
        f"{row['batch_seconds']:.1f}s, "
        f"load {row['load']}",
        flush=True,
    )
    for name, span in (row.get("profile") or {}).items():
        print(f"      {name:32s} {span['seconds']:8.3f}s {span['calls']:6.0f} calls", flush=True)


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per P x provider x storage: the checkpoints after the first, their paired ratios."""
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if not row["first"]:
            key = (row["partitions"], row["provider"], row["storage"])
            groups.setdefault(key, []).append(row)
    summarized = []
    for (partitions, provider, storage), group in sorted(groups.items()):
        ratio = summary([r["ratio"] for r in group])
        summarized.append(
            {
                "partitions": partitions,
                "provider": provider,
                "storage": storage,
                "checkpoints": len(group),
                "image_files": summary([r["image_files"] for r in group])["median"],
                "stored_files": summary([r["stored_files"] for r in group])["median"],
                "metadata_bytes": summary([r["metadata_bytes"] for r in group])["median"],
                "cost_seconds": summary([r["cost_seconds"] for r in group]),
                "limit_seconds": summary([r["limit_seconds"] for r in group]),
                "fixed_cost_seconds": summary([r["fixed_cost_seconds"] for r in group]),
                "ratio": ratio,
                "target_met": ratio["median"] <= TARGET,
                # What a user sees: the checkpoint's cost against the batch it follows.
                "share_of_batch": summary([r["cost_seconds"] / r["batch_seconds"] for r in group]),
            }
        )
    return summarized


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_result_arguments(
        parser,
        quick="4 partitions, HDFS provider, 1 checkpoint after the first (CI runs it)",
    )
    parser.add_argument("--partitions", help="comma-separated (default 4,200,1000)")
    parser.add_argument("--providers", help="comma-separated of hdfs, rocksdb (default both)")
    parser.add_argument("--storages", help="comma-separated of local, s3 (default both)")
    parser.add_argument("--checkpoints", type=int, help="measured after the first (default 3)")
    parser.add_argument("--profile", action="store_true", help="where the agent's time goes")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    partitions = [
        int(p) for p in (args.partitions or ("4" if args.quick else "4,200,1000")).split(",")
    ]
    providers = (args.providers or ("hdfs" if args.quick else "hdfs,rocksdb")).split(",")
    storage_kinds = (args.storages or "local,s3").split(",")
    checkpoints = args.checkpoints or (1 if args.quick else 3)

    base = Path(tempfile.mkdtemp(prefix="bench-checkpoint-cost-"))
    spans = Spans() if args.profile else None
    if spans:
        instrument(spans)
    load = LoadSampler()
    rows: list[dict[str, Any]] = []
    conf = {**SPARK_CONF, "spark.ui.showConsoleProgress": "false"}
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_arguments(conf, driver_memory="2g")
    try:
        with s3_server() as (endpoint, environment):
            os.environ.update(environment)
            s3 = s3_filesystem(endpoint)
            s3.mkdir(BUCKET)
            storages = {
                name: (str(base / "storage") if name == "local" else f"s3://{BUCKET}/storage")
                for name in storage_kinds
            }
            spark = SparkSession.builder.appName("checkpoint-cost").getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            try:
                print(
                    f"checkpoint cost: partitions {partitions}, providers {providers}, "
                    f"storages {storage_kinds}, load {load_average()}",
                    flush=True,
                )
                for count in partitions:  # the smaller cases first: a cut run keeps them
                    for provider in providers:
                        rows += run_case(
                            spark,
                            base,
                            partitions=count,
                            provider=provider,
                            storages=storages,
                            s3=s3,
                            checkpoints=checkpoints,
                            spans=spans,
                            load=load,
                        )
                        save(args, rows, load, partitions, providers, storage_kinds, checkpoints)
            finally:
                spark.stop()
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    path = save(args, rows, load, partitions, providers, storage_kinds, checkpoints)
    print(
        "\n P      provider storage  cost (median)  same batch  limit (median)  ratio (min-max)"
        "  of the batch"
    )
    for row in table(rows):
        ratio = row["ratio"]
        print(
            f" {row['partitions']:5d}  {row['provider']:7s}  {row['storage']:5s}  "
            f"{row['cost_seconds']['median']:10.3f}s  "
            f"{row['fixed_cost_seconds']['median']:9.3f}s  "
            f"{row['limit_seconds']['median']:10.3f}s  "
            f"{ratio['median']:6.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})  "
            f"{'met' if row['target_met'] else 'MISSED'}  "
            f"{row['share_of_batch']['median']:.1%}"
        )
    print(f"load {load.to_json()}; {path}")
    return 0


def save(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    load: LoadSampler,
    *parameters: Any,
) -> Path:
    """The result file, written again after each case: a long run cut short keeps what
    it measured."""
    partitions, providers, storage_kinds, checkpoints = parameters
    summarized = table(rows)
    document = {
        "parameters": {
            "partitions": partitions,
            "providers": providers,
            "storages": storage_kinds,
            "checkpoints_after_first": checkpoints,
            "keys": KEYS,
            "updated_keys_per_batch": UPDATED_KEYS,
            "spark_conf": SPARK_CONF,
            "acknowledgement_gather_seconds": ACKNOWLEDGEMENT_GATHER_SECONDS,
        },
        "load_average": load.to_json(),
        "checkpoints": rows,
        "table": summarized,
        "target": f"snapshot cost <= {TARGET}x its physical limit",
        "target_met": all(row["target_met"] for row in summarized),
    }
    return save_results("checkpoint_cost", args, document)


if __name__ == "__main__":
    sys.exit(main())
