"""The in-process Spark session of the tests that run queries themselves: small, quiet,
stopped after."""

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Tests of a machine without pyspark are skipped, not failed.
SparkSession = pytest.importorskip("pyspark.sql").SparkSession


@contextlib.contextmanager
def local_session(app_name: str, *, cores: int = 1) -> Iterator[Any]:
    # Python tasks run this interpreter (its packages: the sink's writer, pandas), as the
    # runtime's do.
    environment = pytest.MonkeyPatch()
    environment.setenv("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        environment.undo()


@contextlib.contextmanager
def named_sources(session: Any) -> Iterator[None]:
    """Queries started in this block may name their sources (``readStream.name``): Spark
    then keeps each source's log in ``sources/<name>/`` and writes ``v2`` offset logs
    (``name:offset`` lines)."""
    confs = {
        "spark.sql.streaming.queryEvolution.enableSourceEvolution": "true",
        "spark.sql.streaming.offsetLog.formatVersion": "2",
    }
    for key, value in confs.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key in confs:
            session.conf.unset(key)
