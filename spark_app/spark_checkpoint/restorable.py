"""Prove images restorable, not only intact: ``python -m spark_checkpoint.restorable``.

`spark-checkpoint verify --deep` runs this in a subprocess (the control plane never imports
pyspark). Each image is materialized into a scratch directory, as a restore does, and Spark
reads there what a restarted query reads before and at its first batch, through Spark's own
classes, without running the query:

- the ``metadata`` file (``StreamMetadata.read``, which ``StreamExecution`` calls at start);
- the offset and commit logs (``OffsetSeqLog``, ``CommitLog``): the latest entries, and the
  previous offsets when the latest batch is not committed (``populateStartOffsets``);
- every file source's log (``FileStreamSourceLog``: ``getLatest`` and ``restore``, which
  ``FileStreamSource`` calls when it is created and which reads the compaction files);
- the state of every stateful operator and store at the image's batch, through the State
  Data Source (``spark.read.format("statestore")``), which loads each partition's store
  version as the next batch would.

Prints its report (`spark_checkpoint.restorable_report`) on its last output line. Exit
codes: 0 every image restorable, 1 a problem found, 2 bad arguments.
"""

import argparse
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrameReader, SparkSession

from spark_checkpoint.janitor_commands import image_argument
from spark_checkpoint.query_logs import is_file_source_log
from spark_checkpoint.restorable_report import ImageVerdict, encoded
from spark_checkpoint.restore import SPARK_METADATA_FILE, relocate_state_schema_paths
from spark_checkpoint.settings import LOOPBACK_DRIVER_CONF
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
)

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2
# The longest excerpt of a Spark error kept as a problem (its first lines name the class,
# the file and the reason; a JVM stack trace follows).
MAX_PROBLEM_CHARS = 600

_STREAMING = "org.apache.spark.sql.execution.streaming"
# What py4j puts before the JVM's message: which proxy method was called.
_PY4J_PREFIX = re.compile(r"An error occurred while calling [\w.]+\. : ")


def check_location(spark: SparkSession, location: Path, batch_id: int) -> list[str]:
    """What keeps a restarted query from reading the checkpoint at ``location``, whose
    newest committed batch should be ``batch_id``: one line per problem."""
    problems: list[str] = []
    if not (location / SPARK_METADATA_FILE).is_file():
        return [f"no Spark {SPARK_METADATA_FILE} file: a restarted query cannot start"]
    jvm: Any = spark._jvm
    session: Any = spark._jsparkSession
    hadoop_conf = session.sessionState().newHadoopConf()
    _run(
        problems,
        "metadata",
        lambda: _stream_metadata(jvm).read(
            jvm.org.apache.hadoop.fs.Path(str(location / SPARK_METADATA_FILE)), hadoop_conf
        ),
    )
    _run(problems, "offsets and commits", lambda: _check_logs(jvm, session, location, batch_id))
    for source in sorted((location / "sources").glob("*")):
        if is_file_source_log(source):
            _run(
                problems, f"sources/{source.name}", partial(_read_file_source, jvm, session, source)
            )
    if (location / "state").is_dir():
        _run(problems, "state", lambda: _read_state(spark, location, batch_id, problems))
    return problems


def _stream_metadata(jvm: Any) -> Any:
    return _scala_object(getattr(jvm, _STREAMING).runtime, "StreamMetadata")


def _scala_object(package: Any, name: str) -> Any:
    """A Scala companion object through py4j."""
    return getattr(getattr(package, f"{name}$"), "MODULE$")


def _check_logs(jvm: Any, session: Any, location: Path, batch_id: int) -> None:
    checkpointing = getattr(jvm, _STREAMING).checkpointing
    offsets = checkpointing.OffsetSeqLog(session, str(location / "offsets"), False)
    commits = checkpointing.CommitLog(session, str(location / "commits"), False)
    latest = offsets.getLatest()
    if latest.isEmpty():
        raise RestoreCheckFailed("the offset log has no entry")
    latest_batch = int(latest.get()._1())
    committed = commits.getLatest()
    committed_batch = int(committed.get()._1()) if committed.isDefined() else None
    if committed_batch != batch_id:
        raise RestoreCheckFailed(
            f"the newest committed batch is {committed_batch}, the image says {batch_id}"
        )
    # Spark re-runs a planned, uncommitted batch from the offsets of the one before it.
    if (
        committed_batch != latest_batch
        and latest_batch > 0
        and offsets.get(latest_batch - 1).isEmpty()
    ):
        raise RestoreCheckFailed(f"offsets/{latest_batch - 1} is missing")


def _read_file_source(jvm: Any, session: Any, directory: Path) -> None:
    runtime = getattr(jvm, _STREAMING).runtime
    version = _scala_object(runtime, "FileStreamSourceLog").VERSION()
    source_log = runtime.FileStreamSourceLog(version, session, str(directory))
    source_log.getLatest()
    source_log.restore()


def _read_state(spark: SparkSession, location: Path, batch_id: int, problems: list[str]) -> None:
    stores = (
        spark.read.format("state-metadata")
        .load(str(location))
        .select("operatorId", "stateStoreName")
        .distinct()
        .collect()
    )
    if not stores:
        raise RestoreCheckFailed("state/ has no operator metadata Spark can read")
    for operator_id, store_name in sorted((int(r[0]), str(r[1])) for r in stores):
        reader = (
            spark.read.format("statestore")
            .option("batchId", batch_id)
            .option("operatorId", operator_id)
            .option("storeName", store_name)
        )
        _run(
            problems,
            f"state of operator {operator_id}, store {store_name}",
            partial(_count, reader, str(location)),
        )


def _count(reader: DataFrameReader, location: str) -> None:
    reader.load(location).count()  # loads every partition's store


class RestoreCheckFailed(Exception):
    """What Spark read is there but not what a restart needs."""


def _run(problems: list[str], what: str, read: Callable[[], object]) -> None:
    try:
        read()
    except Exception as error:  # Spark's errors come as many Python classes (py4j, pyspark)
        problems.append(f"{what}: {_excerpt(error)}")


def _excerpt(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines()]
    text = " ".join(line for line in lines if line and not line.startswith("at "))
    text = text.split(" Suppressed: ")[0]  # the same error again, from a task listener
    return _PY4J_PREFIX.sub("", text)[:MAX_PROBLEM_CHARS]


def check_images(
    storage: CheckpointStorage, images: Sequence[tuple[CheckpointKind, int]]
) -> list[ImageVerdict]:
    """Materialize each image into a scratch directory and let Spark read it there."""
    builder = (
        SparkSession.builder.master("local[1]")
        .appName("spark-checkpoint-verify-deep")
        .config("spark.ui.enabled", "false")
    )
    for key, value in LOOPBACK_DRIVER_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    results: list[ImageVerdict] = []
    try:
        for kind, snapshot_id in images:
            with tempfile.TemporaryDirectory(prefix="verify-deep-") as scratch:
                location = Path(scratch) / "checkpoint"
                try:
                    meta = storage.read_metadata(kind, snapshot_id)
                    storage.materialize(meta, str(location))
                    relocate_state_schema_paths(location)
                except (StorageError, OSError) as error:
                    problems = [f"cannot materialize: {error}"]
                else:
                    problems = check_location(spark, location, meta.batch_id)
            results.append(ImageVerdict(kind, snapshot_id, tuple(problems)))
    finally:
        spark.stop()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spark_checkpoint.restorable",
        description="Materialize images and let Spark read what a restart reads.",
    )
    parser.add_argument("--storage", required=True, help="storage root (path or URI)")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("images", nargs="+", type=image_argument, metavar="KIND:ID")
    args = parser.parse_args(argv)
    try:
        storage = CheckpointStorage(JobStorageLayout(args.storage, args.namespace, args.job))
    except ValueError as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return EXIT_USAGE
    results = check_images(storage, args.images)
    print(encoded(results))
    return EXIT_PROBLEMS if any(verdict.problems for verdict in results) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
