"""Images planned by the snapshot planner, restarted by Spark's own readers (real PySpark).

A file-source word count runs with a small ``fileSource.log.compactInterval`` so its source
log compacts every few batches. After every committed batch an image is taken the way the
agent takes it (plan, hard-link pin, copy of the pinned files into a fresh directory), and
a fresh query on each restored image must commit its next batch with counts that match a
ground truth computed without Spark. One restored run then goes on across more
compactions, is imaged after every batch in turn, and each of those images is restored
again: Spark derives the compact interval from the ``.compact`` files an image holds, so an
image that holds the wrong ones restores once and breaks the restore after it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.job_run import expected_counts, generate
from helpers.spark_session import local_session
from spark_checkpoint.agent.snapshot import committed_batches, pin, plan_snapshot

pytestmark = pytest.mark.spark


Outputs = dict[int, dict[str, int]]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_session("tests-snapshot-compaction") as session:
        yield session


def _run(
    spark: Any,
    input_dir: Path,
    location: Path,
    *,
    one_batch: bool,
    after_batch: Callable[[int], None] = lambda batch_id: None,
) -> Outputs:
    """Run the word count on ``location`` until its input is consumed (one file per batch)
    or for exactly one batch; return each batch's updated counts. A Spark failure raises."""
    outputs: Outputs = {}

    def write_batch(batch: Any, batch_id: int) -> None:
        outputs[batch_id] = {row["word"]: row["count"] for row in batch.collect()}
        after_batch(batch_id)

    words = (
        spark.readStream.schema("word STRING, n INT")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
    )
    writer = (
        words.groupBy("word")
        .count()
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(location))
        .foreachBatch(write_batch)
    )
    writer = writer.trigger(once=True) if one_batch else writer.trigger(availableNow=True)
    writer.start().awaitTermination()
    return outputs


def _take_image(live: Path, batch_id: int, images: Path) -> Path:
    """What the agent stores for a checkpoint at ``batch_id``, as restore materializes it."""
    plan = plan_snapshot(live, batch_id)
    pinned = images / f"pinned-{batch_id}"
    pin(live, (f for files in plan.files_by_task.values() for f in files), pinned)
    image = images / str(batch_id)
    shutil.copytree(pinned, image)
    shutil.rmtree(pinned)
    return image


def _imaging_each_commit(live: Path, images: Path, taken: dict[int, Path]) -> Callable[[int], None]:
    """Inside batch N, batch N-1 is committed: image it while the query runs on, as the
    agent does right after a commit."""

    def after_batch(batch_id: int) -> None:
        previous = batch_id - 1
        if previous in committed_batches(live) and previous not in taken:
            taken[previous] = _take_image(live, previous, images)

    return after_batch


def _assert_restores(spark: Any, image: Path, input_dir: Path, scratch: Path) -> None:
    """A fresh query on a copy of ``image`` commits the batch after the image's, reading
    what is left of the input, and its counts include everything before (state restored)."""
    location = scratch / f"restored-{image.name}"
    shutil.copytree(image, location)
    batch_id = int(image.name)
    try:
        outputs = _run(spark, input_dir, location, one_batch=True)
    except Exception as error:
        raise AssertionError(f"image at batch {batch_id} ({image}) does not restore") from error
    assert list(outputs) == [batch_id + 1], f"image at batch {batch_id}"
    totals = expected_counts(input_dir)
    assert outputs[batch_id + 1], f"image at batch {batch_id}: its next batch read nothing"
    assert {w: totals[w] for w in outputs[batch_id + 1]} == outputs[batch_id + 1]


@settings(
    max_examples=1,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(interval=st.integers(min_value=2, max_value=4), data=st.data())
def test_every_image_restores_and_so_do_images_of_the_restored_run(
    spark: Any, interval: int, data: st.DataObject
) -> None:
    spark.conf.set("spark.sql.streaming.fileSource.log.compactInterval", str(interval))
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        input_dir, live = root / "input", root / "live"
        lines = 12

        # The first run crosses three compactions; an image after each commit.
        generate(input_dir, files=3 * interval, lines=lines, seed=7)
        first_images: dict[int, Path] = {}
        _run(
            spark,
            input_dir,
            live,
            one_batch=False,
            after_batch=_imaging_each_commit(live, root / "images-1", first_images),
        )
        last = committed_batches(live)[-1]
        assert last == 3 * interval - 1
        first_images[last] = _take_image(live, last, root / "images-1")
        assert sorted(first_images) == list(range(3 * interval))

        generate(input_dir, files=2 * interval + 1, lines=lines, seed=7, start_index=3 * interval)
        for image in first_images.values():
            _assert_restores(spark, image, input_dir, root / "scratch-1")

        # An image whose newest compaction is 2I-1 is where a single compaction makes
        # Spark guess 2I: the restored run then compacts elsewhere than the live one did.
        chained_from = data.draw(
            st.integers(min_value=2 * interval - 1, max_value=3 * interval - 2), "chained_from"
        )
        restored = root / "restored-run"
        shutil.copytree(first_images[chained_from], restored)
        second_images: dict[int, Path] = {}
        outputs = _run(
            spark,
            input_dir,
            restored,
            one_batch=False,
            after_batch=_imaging_each_commit(restored, root / "images-2", second_images),
        )
        last = committed_batches(restored)[-1]
        assert sorted(outputs) == list(range(chained_from + 1, last + 1))
        assert last == 5 * interval, "the restored run read the rest of the input"
        second_images[last] = _take_image(restored, last, root / "images-2")
        assert sorted(second_images) == list(range(chained_from, last + 1))

        generate(input_dir, files=1, lines=lines, seed=7, start_index=5 * interval + 1)
        for image in second_images.values():
            _assert_restores(spark, image, input_dir, root / "scratch-2")
