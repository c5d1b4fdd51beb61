"""Images of layouts Spark writes for less common queries, restarted by Spark itself (real
PySpark): a stream-stream join's per-store schemas and a named source's log (a reviewer
found both left out of images by the planner, with Spark 4.3).

Each image is taken as the agent takes it (plan, then a copy of the planned files into a
fresh directory), at a batch before the last, and restarted there with the live location
moved away.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from helpers.spark_session import local_session, named_sources
from spark_checkpoint.agent.snapshot import committed_batches, plan_snapshot
from spark_checkpoint.restore import relocate_state_schema_paths

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_session("tests-snapshot-layouts") as session:
        yield session


_WRITTEN = itertools.count(1_700_000_000)


def _write_rows(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """One input file, appearing whole (a file source may list it at any moment), modified
    a second after the one written before: a file source reads them in that order (files
    written in the same tick came in any order)."""
    directory.mkdir(parents=True, exist_ok=True)
    hidden = directory / f".{name}"
    hidden.write_text("".join(json.dumps(row) + "\n" for row in rows))
    written = next(_WRITTEN)
    os.utime(hidden, (written, written))
    os.rename(hidden, directory / name)


def _image(live: Path, batch_id: int, target: Path) -> list[str]:
    """The files an image of ``live`` at ``batch_id`` holds, copied into ``target``."""
    plan = plan_snapshot(live, batch_id)
    files = sorted({name for names in plan.files_by_task.values() for name in names})
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(live / name, target / name)
    return files


def _restarted(live: Path, image: Path, run: Any) -> None:
    """``run(image)`` with ``live`` moved away, so nothing is read from it."""
    moved = live.with_name(live.name + "-moved")
    live.rename(moved)
    try:
        run(image)
    finally:
        moved.rename(live)


def _join(
    spark: Any, left: Path, right: Path, location: Path, *, a_type: str = "int"
) -> dict[int, list[int]]:
    """The left and right inputs joined on k, one file of each a batch, to the end of the
    input: the keys each batch joined."""
    joined = (
        spark.readStream.schema(f"k int, a {a_type}")
        .option("maxFilesPerTrigger", 1)
        .json(str(left))
        .join(
            spark.readStream.schema("k int, b int")
            .option("maxFilesPerTrigger", 1)
            .json(str(right)),
            "k",
        )
    )
    return _keys_by_batch(joined, location)


def test_a_joins_image_keeps_the_schemas_spark_checks_a_changed_query_against(
    spark: Any, tmp_path: Path
) -> None:
    """The left input's column `a` changed from int to float: the live location refuses
    the restarted query, and so must an image (without the stores' schemas Spark read the
    old int state as floats: 4.2e-45 for 4)."""
    left, right, live = tmp_path / "left", tmp_path / "right", tmp_path / "live"
    for i in range(4):
        _write_rows(left, f"l{i:03}.json", [{"k": i % 3, "a": i}])
        _write_rows(right, f"r{i:03}.json", [{"k": i % 3, "b": i}])
    _join(spark, left, right, live)
    files = _image(live, 2, tmp_path / "image")
    assert {
        f"state/0/0/{side}-{store}/_metadata/schema"
        for side in ("left", "right")
        for store in ("keyToNumValues", "keyWithIndexToValue")
    } <= set(files), files
    _write_rows(left, "l004.json", [{"k": 0, "a": 4}])
    _write_rows(right, "r004.json", [{"k": 0, "b": 4}])

    with pytest.raises(Exception, match="STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"):
        _restarted(
            live,
            tmp_path / "image",
            lambda image: _join(spark, left, right, image, a_type="float"),
        )


def test_a_source_whose_log_lags_the_batches_restarts_with_the_same_batches(
    spark: Any, tmp_path: Path
) -> None:
    """A file source's log ids are its own: the right input ran out after two files, so at
    batch 5 its offset is log id 1, and its entry 2, for batch 6, is in the live location
    when batch 5's image is planned. Cut at the batch id, the image held it: the restored
    query counted that file as read and folded it into batch 6 with the next one (two
    files despite maxFilesPerTrigger 1), so batches, hence watermarks, timeouts and late
    rows, differed from the run restarted from a full copy (a reviewer's, Spark 4.3). The
    two sources also prove `sources/<i>` is the i-th offset of `offsets/B`."""
    left, right, live = tmp_path / "left", tmp_path / "right", tmp_path / "live"
    for i in range(6):
        _write_rows(left, f"l{i:03}.json", [{"k": i, "a": i}])
    for i in range(2):
        _write_rows(right, f"r{i:03}.json", [{"k": i, "b": i}])
    _join(spark, left, right, live)  # batches 0-5
    shutil.copytree(live, tmp_path / "full-copy")  # the live location at batch 5
    _write_rows(left, "l006.json", [{"k": 6, "a": 6}])
    _write_rows(right, "r002.json", [{"k": 2, "b": 2}])
    _join(spark, left, right, live)  # batch 6: the log entries above 5's
    files = _image(live, 5, tmp_path / "image")
    assert "sources/1/2" not in files and "sources/1/1" in files, files
    _write_rows(left, "l007.json", [{"k": 7, "a": 7}])
    _write_rows(right, "r003.json", [{"k": 3, "b": 3}])

    expected = _join(spark, left, right, tmp_path / "full-copy")
    restored: dict[int, Any] = {}
    _restarted(
        live,
        tmp_path / "image",
        lambda image: restored.update(_join(spark, left, right, image)),
    )

    assert expected == {6: [2], 7: [3]}, expected
    assert restored == expected


def _named_source_count(spark: Any, input_dir: Path, location: Path) -> dict[int, Any]:
    """A count by k over a source named "orders", one file a batch; each batch's counts."""
    outputs: dict[int, Any] = {}
    with named_sources(spark):
        counts = (
            spark.readStream.schema("k int")
            .option("maxFilesPerTrigger", 1)
            .name("orders")
            .json(str(input_dir))
            .groupBy("k")
            .count()
        )
        query = (
            counts.writeStream.outputMode("complete")
            .foreachBatch(
                lambda frame, batch: outputs.__setitem__(
                    batch, sorted(tuple(row) for row in frame.collect())
                )
            )
            .option("checkpointLocation", str(location))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    return outputs


def test_a_named_sources_log_is_in_the_image_and_the_query_restarts_from_it(
    spark: Any, tmp_path: Path
) -> None:
    input_dir, live = tmp_path / "input", tmp_path / "live"
    for i in range(5):
        _write_rows(input_dir, f"f{i:03}.json", [{"k": i % 2}])
    _named_source_count(spark, input_dir, live)
    assert (live / "sources" / "orders").is_dir()  # the layout this test is about
    files = _image(live, 3, tmp_path / "image")
    assert [f for f in files if f.startswith("sources/")] == [
        f"sources/orders/{b}" for b in range(4)
    ]

    outputs: dict[int, Any] = {}
    _restarted(
        live,
        tmp_path / "image",
        lambda image: outputs.update(_named_source_count(spark, input_dir, image)),
    )

    # Batch 4 again (the image is at 3): file 4 on top of files 0-3's counts.
    assert outputs == {4: [(0, 3), (1, 2)]}, outputs
    assert not re.search(r"\bsources/\d", " ".join(files))


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _run_on_rocksdb(spark: Any, frame: Any, location: Path, on_batch: Any) -> None:
    """Run the streaming `frame` on the RocksDB provider (transformWithState needs it)
    into ``foreachBatch(on_batch)``, to the end of its input."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    try:
        query = (
            frame.writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", str(location))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")


def _counts_with_state(spark: Any, input_dir: Path, location: Path) -> dict[str, int]:
    """Rows per k, counted in transformWithStateInPandas value state (RocksDB), one file a
    batch to the end of the input: each key's last count."""

    class Count(StatefulProcessor):  # defined here: pickled by value for the Python workers
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            n = (self.count.get()[0] if self.count.exists() else 0) + sum(len(p) for p in rows)
            self.count.update((n,))
            yield pd.DataFrame({"k": [key[0]], "n": [n]})

        def close(self) -> None:
            pass

    counts: dict[str, int] = {}
    frame = (
        spark.readStream.schema("k string")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .groupBy("k")
        .transformWithStateInPandas(Count(), "k string, n long", "Update", "None")
    )
    _run_on_rocksdb(
        spark,
        frame,
        location,
        lambda batch, _id: counts.update({row.k: row.n for row in batch.collect()}),
    )
    return counts


def test_a_transform_with_state_image_restarts_in_a_fresh_location(
    spark: Any, tmp_path: Path
) -> None:
    """transformWithState's operator metadata names its schema files by absolute path, in
    the live location: restored into a fresh one (as every restore is), Spark looked for
    them there and failed once the live location was gone (a reviewer's, Spark 4.3)."""
    input_dir, live = tmp_path / "input", tmp_path / "live"
    for i in range(4):
        _write_rows(input_dir, f"f{i:03}.json", [{"k": "ab"[i % 2]}])
    _counts_with_state(spark, input_dir, live)
    image = tmp_path / "image"
    files = _image(live, 2, image)
    assert any("/_metadata/v2/" in name for name in files), files
    relocate_state_schema_paths(image)
    _write_rows(input_dir, "f004.json", [{"k": "a"}])

    counts: dict[str, int] = {}
    _restarted(
        live, image, lambda moved: counts.update(_counts_with_state(spark, input_dir, moved))
    )

    # Files 3 (b) and 4 (a) again, on the counts of files 0-2 kept in the image's state.
    assert counts == {"a": 3, "b": 2}, counts


def _timers_and_lists(spark: Any, input_dir: Path, location: Path) -> list[tuple[Any, ...]]:
    """transformWithStateInPandas in event time (RocksDB): each row appends its v to its
    key's list state and sets a timer 150 s of event time after it; the rows written:
    ``("data", k, list length)`` for each batch of a key, ``("timer", k, expiry ms, list
    length)`` for each timer fired; to the end of the input, one file a batch."""

    class Lists(StatefulProcessor):  # defined here: pickled by value for the Python workers
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.seen = handle.getListState("seen", "v long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            frame = pd.concat(list(rows))
            self.seen.appendList([(int(v),) for v in frame["v"]])
            for t in frame["t"]:
                self.handle.registerTimer(int(t) * 1000 + 150_000)
            size = len(list(self.seen.get()))
            yield pd.DataFrame({"kind": ["data"], "k": [key[0]], "at": [-1], "n": [size]})

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            expiry = expiredTimerInfo.getExpiryTimeInMs()
            size = len(list(self.seen.get()))
            yield pd.DataFrame({"kind": ["timer"], "k": [key[0]], "at": [expiry], "n": [size]})

        def close(self) -> None:
            pass

    written: list[tuple[Any, ...]] = []
    frame = (
        spark.readStream.schema("k string, v long, t long")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .withColumn("ts", F.timestamp_seconds("t"))
        .withWatermark("ts", "0 seconds")
        .groupBy("k")
        .transformWithStateInPandas(
            Lists(), "kind string, k string, at long, n long", "Update", "EventTime"
        )
    )
    _run_on_rocksdb(
        spark,
        frame,
        location,
        lambda batch, _id: written.extend(tuple(row) for row in batch.collect()),
    )
    return written


def test_transform_with_state_timers_and_list_state_go_on_after_a_restore(
    spark: Any, tmp_path: Path
) -> None:
    """Timers set before the image fire after the restore, on the list state the image
    held, as in a run that never stopped (a reviewer's experiments, Spark 4.3, also with
    TTL, map state and processing time; this one is kept as a test). File i's row has
    event time 100(i+1) s, so a timer fires two files after its row's."""

    def rows(i: int) -> list[dict[str, Any]]:
        return [{"k": "ab"[i % 2], "v": i, "t": 100 * (i + 1)}]

    input_dir, live = tmp_path / "input", tmp_path / "live"
    for i in range(4):
        _write_rows(input_dir, f"f{i:03}.json", rows(i))
    before = _timers_and_lists(spark, input_dir, live)
    image = tmp_path / "image"
    _image(live, committed_batches(live)[-1], image)
    relocate_state_schema_paths(image)
    for i in range(4, 7):
        _write_rows(input_dir, f"f{i:03}.json", rows(i))
    after: list[tuple[Any, ...]] = []
    _restarted(live, image, lambda moved: after.extend(_timers_and_lists(spark, input_dir, moved)))

    # Ground truth: a key's list grows by one a file; its timer at 100(i+1) + 150 s fires
    # once the watermark (the latest event time) passes it, with the list as it is then.
    expected = [("data", "ab"[i % 2], -1, i // 2 + 1) for i in range(7)]
    watermarks = [100 * (i + 1) for i in range(7)]
    for i in range(7):
        expiry = 100 * (i + 1) + 150
        fired_after = next((j for j, w in enumerate(watermarks) if w >= expiry), None)
        if fired_after is not None:
            expected.append(("timer", "ab"[i % 2], expiry * 1000, fired_after // 2 + 1))
    assert sorted(before + after) == sorted(expected), (before, after)
    assert any(row[0] == "timer" for row in after), after


def _keys_by_batch(query: Any, location: Path) -> dict[int, list[int]]:
    """The keys each batch of ``query`` (a streaming frame of k) wrote, to the end of its
    input."""
    outputs: dict[int, list[int]] = {}
    started = (
        query.writeStream.foreachBatch(
            lambda frame, batch: outputs.__setitem__(
                batch, sorted(row.k for row in frame.collect())
            )
        )
        .option("checkpointLocation", str(location))
        .trigger(availableNow=True)
        .start()
    )
    started.awaitTermination()
    return outputs


@pytest.mark.parametrize("shape", ["source-read-twice", "source-without-input-yet"])
def test_an_image_restarts_with_the_batches_a_full_copy_does(
    spark: Any, tmp_path: Path, shape: str
) -> None:
    """Two query shapes whose offsets do not map their sources one to one (a reviewer's,
    Spark 4.3): `a` read twice writes two offset lines for one `sources/0` (its lines were
    taken for the next sources, whose logs were cut short: the image could not restart),
    and `e` without input at B writes `-` while its log gains B+1's entry (the image held
    it, and the restored query read two of e's files in one batch)."""

    def read(name: str) -> Any:
        return (
            spark.readStream.schema("k int")
            .option("maxFilesPerTrigger", 1)
            .json(str(tmp_path / name))
        )

    def query() -> Any:
        if shape == "source-read-twice":
            a = read("a")
            return a.filter("k >= 0").union(a.filter("k < 0")).union(read("b"))
        return read("c").union(read("e"))

    def write(name: str, k: int) -> None:
        _write_rows(tmp_path / name, f"{name}{k:03}.json", [{"k": k}])

    (tmp_path / "e").mkdir()
    first, second, third = (
        ([("a", 0), ("b", 100), ("b", 101), ("b", 102)], [("b", 103)], [("b", 104)])
        if shape == "source-read-twice"
        else ([("c", 0), ("c", 1)], [("c", 2), ("e", 200)], [("c", 3), ("e", 201)])
    )
    live = tmp_path / "live"
    for name, k in first:
        write(name, k)
    _keys_by_batch(query(), live)
    shutil.copytree(live, tmp_path / "full-copy")
    batch = max(int(name) for name in os.listdir(live / "commits") if name.isdigit())
    for name, k in second:
        write(name, k)
    _keys_by_batch(query(), live)  # batch B+1: its log entries are in the live location
    _image(live, batch, tmp_path / "image")
    for name, k in third:
        write(name, k)

    expected = _keys_by_batch(query(), tmp_path / "full-copy")
    restored: dict[int, list[int]] = {}
    _restarted(
        live, tmp_path / "image", lambda image: restored.update(_keys_by_batch(query(), image))
    )

    assert len(expected) == 2, expected  # B+1 and B+2, as first run
    assert restored == expected
