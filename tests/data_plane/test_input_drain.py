"""When a drain (stop --drain) may take its image: a trigger begun after the request found
no new data, told by Spark's processAllAvailable or, for a query that runs a batch at
every trigger or whose input never stops, by its progress (the driver's `_InputDrain`, on
a stand-in for Spark's StreamingQuery, and on Spark's own)."""

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from helpers.spark_session import local_session
from spark_checkpoint.driver import _InputDrain


def until_true(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.005)


class Query:
    """processAllAvailable returns when the test lets it, as Spark's does once a trigger
    finds no new data; lastProgress is the test's."""

    def __init__(self) -> None:
        self.isActive = True
        self.lastProgress: dict[str, Any] | None = None
        self.calls = 0
        self._returns = threading.Semaphore(0)

    def processAllAvailable(self) -> None:
        self.calls += 1
        while not self._returns.acquire(timeout=0.01):
            if not self.isActive:
                return

    def trigger_finds_no_new_data(self) -> None:
        self._returns.release()


def _progress(
    began: float, *, start: int | None = 4, end: int = 4, latest: int | None = 4
) -> dict[str, Any]:
    """Spark's StreamingQueryProgress, as PySpark's lastProgress gives it: its trigger's
    start, a file source's offsets (the start is null before the first batch)."""
    stamp = datetime.fromtimestamp(began, UTC).isoformat(timespec="milliseconds")

    def offset(n: int | None) -> str:
        return json.dumps(None if n is None else {"logOffset": n})  # JSON text, as Spark's

    source = {"description": "FileStreamSource[file:/in]", "numInputRows": 0}
    source |= {"startOffset": offset(start), "endOffset": offset(end)}
    source |= {"latestOffset": offset(latest)}
    return {
        "timestamp": stamp.replace("+00:00", "Z"),
        "batchId": 7,
        "numInputRows": 0,
        "sources": [source],
    }


def test_a_call_begun_before_the_request_does_not_say_the_input_is_processed() -> None:
    query = Query()
    drain = _InputDrain(query)
    assert drain.processed_all_since(time.time()) is False  # an earlier drain's call
    until_true(lambda: query.calls == 1)
    time.sleep(0.01)
    requested = time.time()
    query.trigger_finds_no_new_data()  # ends the call begun before the request
    until_true(lambda: drain._thread is not None and not drain._thread.is_alive())
    assert drain.processed_all_since(requested) is False  # and asks again
    until_true(lambda: query.calls == 2)

    query.trigger_finds_no_new_data()

    until_true(lambda: drain.processed_all_since(requested))
    query.isActive = False


def test_a_query_that_runs_a_batch_at_every_trigger_is_drained_by_its_progress() -> None:
    """A processing-time timeout runs a batch at every trigger, so Spark never marks "no
    new data" and processAllAvailable never returns (a reviewer's: drains hung). Its batch
    found no new data when no source's offsets moved and they were the latest; not when it
    read no rows (an empty file, a filtered scan: a second reviewer's)."""
    query = Query()
    drain = _InputDrain(query)
    requested = time.time()
    for progress in (
        _progress(requested - 1),  # its trigger began before the request
        _progress(requested + 1, start=4, end=5),  # read new offsets (0 rows: an empty file)
        _progress(requested + 1, latest=6),  # a read limit left input
        _progress(requested + 1, start=None, end=0),  # the first batch
        {**_progress(requested + 1), "sources": []},
    ):
        query.lastProgress = progress
        assert drain.processed_all_since(requested) is False, progress

    query.lastProgress = _progress(requested + 2, latest=None)  # a file source's: "null"

    assert drain.processed_all_since(requested) is True
    query.lastProgress = _progress(requested + 2)  # a source that reports its latest
    assert drain.processed_all_since(requested) is True
    query.isActive = False


def _kafka_progress(
    began: float, start: dict[str, int], end: dict[str, int], latest: dict[str, int]
) -> dict[str, Any]:
    """A Kafka source's progress: offsets by partition, its latest as Spark planned the
    batch (each a JSON object's text, partitions in no promised order)."""
    progress = _progress(began)
    progress["sources"] = [
        {
            "description": "KafkaV2[Subscribe[orders]]",
            "numInputRows": 40,
            "startOffset": json.dumps({"orders": start}),
            "endOffset": json.dumps({"orders": end}),
            "latestOffset": json.dumps({"orders": dict(reversed(latest.items()))}),
        }
    ]
    return progress


def test_input_that_never_stops_coming_is_drained_by_a_batch_that_read_up_to_its_latest() -> None:
    """A busy topic: every trigger finds new records, so none is idle and Spark never marks
    "no new data": the drain waited for ever (seen with Spark's rate source, whose input
    never stops). A batch begun after the request that read up to the latest offsets Spark
    found as it planned it read all there was at the request."""
    query = Query()
    drain = _InputDrain(query)
    requested = time.time()
    before, read = {"0": 100, "1": 90}, {"0": 140, "1": 130}
    for progress in (
        _kafka_progress(requested - 1, before, read, read),  # planned before the request
        _kafka_progress(requested + 1, before, {"0": 120, "1": 130}, read),  # a read limit
    ):
        query.lastProgress = progress
        assert drain.processed_all_since(requested) is False, progress

    query.lastProgress = _kafka_progress(requested + 1, before, read, read)

    assert drain.processed_all_since(requested) is True
    query.isActive = False


def test_the_wait_ends_once_a_call_begun_after_the_request_returned() -> None:
    # Not for the rest of the query's life: on an idle query each call returns at the next
    # trigger, 100 times a second (a reviewer's).
    query = Query()
    drain = _InputDrain(query)
    requested = time.time()
    drain.processed_all_since(requested)
    until_true(lambda: query.calls == 1)
    query.trigger_finds_no_new_data()
    until_true(lambda: drain.processed_all_since(requested))
    time.sleep(0.1)

    assert query.calls == 1
    assert drain._thread is not None and not drain._thread.is_alive()
    later = time.time()
    assert drain.processed_all_since(later) is False  # a new request asks again
    until_true(lambda: query.calls == 2)
    query.isActive = False


def test_a_query_that_failed_ends_the_wait_without_a_traceback() -> None:
    class Failing(Query):
        def processAllAvailable(self) -> None:
            raise RuntimeError("StreamingQueryException: boom")

    query = Failing()
    drain = _InputDrain(query)
    errors: list[threading.ExceptHookArgs] = []
    hook, threading.excepthook = threading.excepthook, errors.append
    try:
        assert drain.processed_all_since(time.time()) is False
        until_true(lambda: drain._thread is not None and not drain._thread.is_alive())
    finally:
        threading.excepthook = hook
    assert errors == []


@pytest.mark.spark
def test_spark_input_that_never_stops_coming_is_drained(tmp_path: Path) -> None:
    """Spark's rate source has new rows at every trigger: the drain of such a query waited
    for ever (its `stop --drain` never completed; seen by hand). Its progress, as Spark
    gives it, says when a batch read all there was."""
    with local_session("tests-input-drain") as spark:
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 50)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            # Its offsets are whole seconds: each trigger, 2 s apart, finds new ones.
            .trigger(processingTime="2 seconds")
            .start()
        )
        try:
            until_true(lambda: (query.lastProgress or {}).get("numInputRows", 0) > 0, 60)
            drain = _InputDrain(query)
            requested = time.time()
            until_true(lambda: drain.processed_all_since(requested), timeout=30)
            assert query.isActive
        finally:
            query.stop()
