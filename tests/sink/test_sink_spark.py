"""TransactionalFileSink with real Spark (local mode): batch DataFrames written by Spark's
JSON writer, and streaming word counts whose committed output is compared with a ground
truth computed without Spark, including a restore and a fallback to an older checkpoint."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from spark_checkpoint.sink import TransactionalFileSink, read_committed

pytestmark = pytest.mark.spark

pyspark_sql = pytest.importorskip("pyspark.sql")
SparkSession = pyspark_sql.SparkSession

INPUT_SCHEMA = "word STRING, n INT"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tests-sink")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Short-lived JVM: the C1 JIT alone and the serial GC start about twice as fast.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: sorted(row.items()))


def test_spark_writes_the_staged_batch_and_commit_publishes_it(spark: Any, tmp_path: Path) -> None:
    sink = TransactionalFileSink(str(tmp_path / "out put %41"))  # Hadoop paths are not URIs
    rows = [{"word": f"w{i}", "count": i} for i in range(10)]
    batch = spark.createDataFrame(rows, "word STRING, count LONG").repartition(3)

    sink.write_batch(batch, 0)

    assert sink.staged_batches() == [0]
    assert read_committed(sink.output_dir) == {}
    sink.on_checkpoint_complete(0)
    committed = read_committed(sink.output_dir)
    assert list(committed) == [0]
    assert _sorted(committed[0]) == _sorted(rows)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out put %41"]


def test_a_re_run_replaces_the_staged_batch_and_a_committed_batch_is_not_rewritten(
    spark: Any, tmp_path: Path
) -> None:
    sink = TransactionalFileSink(str(tmp_path / "out"))
    first = spark.createDataFrame([("a", 1)], "word STRING, count LONG")
    second = spark.createDataFrame([("b", 2)], "word STRING, count LONG")

    sink.write_batch(first, 0)
    sink.write_batch(second, 0)
    sink.on_checkpoint_complete(0)
    sink.write_batch(first, 0)  # a replay of the committed batch

    assert sink.staged_batches() == []
    assert read_committed(sink.output_dir) == {0: [{"word": "b", "count": 2}]}


def _run_wordcount(spark: Any, input_dir: Path, checkpoint: Path, sink: Any) -> list[int]:
    """Run ``groupBy(word).count()`` in update mode over everything in `input_dir`, one
    file per batch, until the input is exhausted; return the ids of the batches it ran."""
    counts = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .groupBy("word")
        .count()
    )
    query = (
        counts.writeStream.outputMode("update")
        .foreachBatch(sink.write_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return [progress["batchId"] for progress in query.recentProgress]


def test_committed_word_counts_equal_the_ground_truth(
    spark: Any, tmp_path: Path, generate_input: ModuleType, ground_truth: ModuleType
) -> None:
    input_dir, output_dir = tmp_path / "input", tmp_path / "out"
    generate_input.generate(input_dir, files=3, lines=400, seed=7, start_index=0)
    sink = TransactionalFileSink(str(output_dir))
    sink.on_restore(None)

    batches = _run_wordcount(spark, input_dir, tmp_path / "checkpoint", sink)

    assert batches == [0, 1, 2]
    assert sink.staged_batches() == batches
    assert read_committed(output_dir) == {}  # nothing before the checkpoint completes
    sink.on_checkpoint_complete(batches[-1])

    expected = ground_truth.expected_counts(input_dir)
    assert ground_truth.committed_counts(output_dir) == expected
    assert sum(expected.values()) == 3 * 400
    assert ground_truth.main([str(input_dir), str(output_dir)]) == 0


def test_restore_and_fallback_to_an_older_checkpoint_stay_exactly_once(
    spark: Any, tmp_path: Path, generate_input: ModuleType, ground_truth: ModuleType
) -> None:
    """Copies of the stopped query's checkpoint location stand in for registered
    checkpoints; each restore starts a fresh query on a fresh copy."""
    input_dir, output_dir, live = tmp_path / "input", tmp_path / "out", tmp_path / "live"
    registered: dict[int, Path] = {}

    def register(batch_id: int) -> None:  # registry updated, then the sink is notified
        registered[batch_id] = shutil.copytree(live, tmp_path / f"chk-{batch_id}")
        sink.on_checkpoint_complete(batch_id)

    sink = TransactionalFileSink(str(output_dir))
    sink.on_restore(None)
    generate_input.generate(input_dir, files=2, lines=200, seed=3, start_index=0)
    assert _run_wordcount(spark, input_dir, live, sink) == [0, 1]
    register(1)
    generate_input.generate(input_dir, files=2, lines=200, seed=3, start_index=2)
    assert _run_wordcount(spark, input_dir, live, sink) == [2, 3]
    register(3)
    generate_input.generate(input_dir, files=1, lines=200, seed=3, start_index=4)
    assert _run_wordcount(spark, input_dir, live, sink) == [4]
    # The driver dies before checkpoint 4 is registered, and checkpoint 3 turns out to be
    # unusable: a new driver falls back to the checkpoint of batch 1.
    assert sink.staged_batches() == [4]

    restored = TransactionalFileSink(str(output_dir))
    restored.on_restore(1)
    assert restored.staged_batches() == []
    assert restored.committed_batches() == [0, 1, 2, 3]
    batches = _run_wordcount(
        spark, input_dir, shutil.copytree(registered[1], tmp_path / "r"), restored
    )

    assert batches == [2, 3, 4]  # 2 and 3 replayed and skipped by the sink, 4 staged
    assert restored.staged_batches() == [4]
    restored.on_checkpoint_complete(4)
    assert ground_truth.committed_counts(output_dir) == ground_truth.expected_counts(input_dir)
