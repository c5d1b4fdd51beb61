"""TransactionalFileSink with real Spark (local mode): batch DataFrames encoded by Spark and
written by its tasks, and streaming word counts whose committed output is compared with a
ground truth computed without Spark, including a restore and a fallback to an older
checkpoint. Each runs with the output on the local filesystem, S3 and Azure; the tasks get
the store's credentials as executors do, from the executor environment
(``spark.executorEnv.*``, here `SparkContext.environment`)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from helpers.objectstore import StorageRoot
from helpers.spark_session import local_session, named_sources
from spark_checkpoint.sink import TransactionalFileSink, read_committed

JOB = "default/orders"  # the job the output belongs to (TransactionalFileSink.on_restore)

pytestmark = pytest.mark.spark


INPUT_SCHEMA = "word STRING, n INT"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_session("tests-sink", cores=2) as session:
        yield session


@pytest.fixture
def executor_env(spark: Any, output_root: StorageRoot) -> Iterator[None]:
    """The output root's credentials in the executors' environment, for this test."""
    environment = spark.sparkContext.environment
    saved = dict(environment)
    environment.update(output_root.environment)
    yield
    environment.clear()
    environment.update(saved)


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: sorted(row.items()))


def test_a_local_output_directory_is_the_path_given(spark: Any, tmp_path: Path) -> None:
    sink = TransactionalFileSink(str(tmp_path / "out put %41"))  # Hadoop paths are not URIs
    sink.write_batch(spark.createDataFrame([("a", 1)], "word STRING, count LONG"), 0)
    sink.on_checkpoint_complete(0)

    assert read_committed(tmp_path / "out put %41") == {0: [{"word": "a", "count": 1}]}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out put %41"]


@pytest.mark.usefixtures("executor_env")
def test_spark_writes_the_staged_batch_and_commit_publishes_it(spark: Any, output_url: str) -> None:
    sink = TransactionalFileSink(output_url)
    rows = [{"word": f"w{i}", "count": i, "note": None} for i in range(10)]
    batch = spark.createDataFrame(rows, "word STRING, count LONG, note STRING").repartition(3)

    sink.write_batch(batch, 0)

    assert sink.staged_batches() == [0]
    assert read_committed(output_url) == {}
    sink.on_checkpoint_complete(0)
    committed = read_committed(output_url)
    assert list(committed) == [0]
    # Spark's JSON encoding: null fields are left out, as its JSON writer does.
    assert _sorted(committed[0]) == _sorted(
        [{"word": r["word"], "count": r["count"]} for r in rows]
    )


@pytest.mark.usefixtures("executor_env")
def test_a_re_run_replaces_the_staged_batch_and_a_committed_batch_is_not_rewritten(
    spark: Any, output_url: str
) -> None:
    sink = TransactionalFileSink(output_url)
    first = spark.createDataFrame([("a", 1)], "word STRING, count LONG")
    second = spark.createDataFrame([("b", 2)], "word STRING, count LONG")

    sink.write_batch(first, 0)
    sink.write_batch(second, 0)
    sink.on_checkpoint_complete(0)
    sink.write_batch(first, 0)  # a replay of the committed batch

    assert sink.staged_batches() == []
    assert read_committed(output_url) == {0: [{"word": "b", "count": 2}]}


def _run_wordcount(
    spark: Any,
    input_dir: Path,
    checkpoint: Path,
    sink: Any,
    *,
    files_per_batch: int = 1,
    source_name: str | None = None,
    after_rate: bool = False,
) -> list[int]:
    """Run ``groupBy(word).count()`` in update mode over everything in `input_dir`,
    `files_per_batch` files a batch, until the input is exhausted; return the ids of the
    batches it ran. A `source_name` names the source (run it in `named_sources`);
    `after_rate` reads a rate source (a row a batch, word "rate") first, in a union."""
    reader = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", files_per_batch)
    if source_name is not None:
        reader = reader.name(source_name)
    words = reader.json(str(input_dir))
    if after_rate:
        rate = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1)
        rows = rate.option("startTimestamp", 0).load()
        words = rows.selectExpr("'rate' AS word", "CAST(value AS INT) AS n").union(words)
    counts = words.groupBy("word").count()
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


@pytest.mark.usefixtures("executor_env")
def test_committed_word_counts_equal_the_ground_truth(
    spark: Any,
    tmp_path: Path,
    output_url: str,
    generate_input: ModuleType,
    ground_truth: ModuleType,
) -> None:
    input_dir, output_dir = tmp_path / "input", output_url
    generate_input.generate(input_dir, files=3, lines=400, seed=7, start_index=0)
    sink = TransactionalFileSink(str(output_dir))
    sink.on_restore(None, JOB)

    batches = _run_wordcount(spark, input_dir, tmp_path / "checkpoint", sink)

    assert batches == [0, 1, 2]
    assert sink.staged_batches() == batches
    assert read_committed(output_dir) == {}  # nothing before the checkpoint completes
    sink.on_checkpoint_complete(batches[-1])

    expected = ground_truth.expected_counts(input_dir)
    assert ground_truth.committed_counts(output_dir) == expected
    assert sum(expected.values()) == 3 * 400
    assert ground_truth.main([str(input_dir), output_dir]) == 0


@pytest.mark.usefixtures("executor_env")
def test_restore_and_fallback_to_an_older_checkpoint_stay_exactly_once(
    spark: Any,
    tmp_path: Path,
    output_url: str,
    generate_input: ModuleType,
    ground_truth: ModuleType,
) -> None:
    """Copies of the stopped query's checkpoint location stand in for registered
    checkpoints; each restore starts a fresh query on a fresh copy."""
    input_dir, output_dir, live = tmp_path / "input", output_url, tmp_path / "live"
    registered: dict[int, Path] = {}

    def register(batch_id: int) -> None:  # registry updated, then the sink is notified
        registered[batch_id] = shutil.copytree(live, tmp_path / f"chk-{batch_id}")
        sink.on_checkpoint_complete(batch_id)

    sink = TransactionalFileSink(str(output_dir))
    sink.on_restore(None, JOB)
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
    restored.on_restore(1, JOB)
    assert restored.staged_batches() == [4], "until the re-run's copy of 4 is committed"
    assert restored.committed_batches() == [0, 1, 2, 3]
    batches = _run_wordcount(
        spark, input_dir, shutil.copytree(registered[1], tmp_path / "r"), restored
    )

    assert batches == [2, 3, 4]  # 2 and 3 replayed and skipped by the sink, 4 staged
    assert restored.staged_batches() == [4]
    restored.on_checkpoint_complete(4)
    assert restored.staged_batches() == []
    assert ground_truth.committed_counts(output_dir) == ground_truth.expected_counts(input_dir)


@pytest.mark.local_only
@pytest.mark.parametrize("source", ["named", "after-a-rate-source"])
def test_a_replay_over_other_files_fails_loudly(
    spark: Any, tmp_path: Path, output_url: str, generate_input: ModuleType, source: str
) -> None:
    """maxFilesPerTrigger 3 -> 2 after a restore of an older image: the replay of batch 1
    read two of its three files. The sink took it for the committed batch 1 and skipped
    it, and batch 2 then counted the third file a second time: with the file source named
    (its log in ``sources/<name>/``, ``v2`` offsets), and, after a change that took that
    case in, with a rate source before it (which keeps no ``sources/0``; a reviewer's)."""
    input_dir, live = tmp_path / "input", tmp_path / "live"
    named = source == "named"
    shape = {"source_name": "w"} if named else {"after_rate": True}
    sink = TransactionalFileSink(output_url)
    sink.on_restore(None, JOB, checkpoint_location=live)
    with named_sources(spark) if named else contextlib.nullcontext():
        for batch_id in range(2):
            generate_input.generate(input_dir, files=3, lines=50, seed=5, start_index=3 * batch_id)
            ran = _run_wordcount(spark, input_dir, live, sink, files_per_batch=3, **shape)
            assert ran == [batch_id]
            if batch_id == 0:
                image = shutil.copytree(live, tmp_path / "chk-0")
            sink.on_checkpoint_complete(batch_id)
        logs = sorted(path.name for path in (live / "sources").iterdir())
        assert logs == (["w"] if named else ["1"])
        committed = read_committed(output_url)

        restored = TransactionalFileSink(output_url)
        restored.on_restore(0, JOB, checkpoint_location=image)
        with pytest.raises(Exception, match="its replay reads other input"):
            _run_wordcount(spark, input_dir, image, restored, files_per_batch=2, **shape)

    assert read_committed(output_url) == committed
    assert restored.staged_batches() == []


@pytest.mark.local_only
def test_the_query_of_a_superseded_driver_fails_on_its_next_batch(
    spark: Any, tmp_path: Path, output_url: str, generate_input: ModuleType
) -> None:
    """A driver that runs on after the next one restored (a pod force-deleted on a cut-off
    node): Spark's next batch fails the query with the sink's reason, and nothing of it is
    staged or committed."""
    input_dir = tmp_path / "input"
    generate_input.generate(input_dir, files=1, lines=100, seed=5, start_index=0)
    old = TransactionalFileSink(output_url)
    old.on_restore(None, JOB)
    assert _run_wordcount(spark, input_dir, tmp_path / "old", old) == [0]
    successor = TransactionalFileSink(output_url)
    successor.on_restore(None, JOB)  # its own fresh start: batch 0 is staged again later
    generate_input.generate(input_dir, files=1, lines=100, seed=5, start_index=1)

    with pytest.raises(Exception, match="a newer driver writes the output") as failed:
        _run_wordcount(spark, input_dir, tmp_path / "old", old)

    assert type(failed.value).__name__ == "StreamingQueryException"
    assert successor.staged_batches() == [0], "the old driver's first, before the successor"
    assert read_committed(output_url) == {}
