"""Fixtures for the transactional sink tests: the word-count example modules (loaded from
their files, examples/ is not a package), a stand-in for a batch DataFrame that encodes and
writes rows as Spark's tasks do, for the protocol tests that need no Spark, and the output
roots.

Every test that uses `output_root` (directly or through `sink`) runs three times: on the
local filesystem, on S3 (moto's server) and on Azure Blob Storage (Azurite), as the storage
tests do (tests/helpers/objectstore.py). A test marked `local_only` runs on the local
filesystem only.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pytest

from helpers.objectstore import StorageRoot, parametrize_storage_roots, storage_root_for
from spark_checkpoint.sink import TransactionalFileSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "examples" / "wordcount"


def _load_example(name: str) -> ModuleType:
    module_name = f"wordcount_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, WORDCOUNT / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def generate_input() -> ModuleType:
    """examples/wordcount/generate_input.py."""
    return _load_example("generate_input")


@pytest.fixture(scope="session")
def ground_truth() -> ModuleType:
    """examples/wordcount/ground_truth.py."""
    return _load_example("ground_truth")


class FakeRDD:
    """The part of an RDD the sink uses: ``mapPartitionsWithIndex(f).collect()``, run
    partition after partition in this process."""

    def __init__(self, partitions: Callable[[], list[list[Any]]]) -> None:
        self._partitions = partitions

    def mapPartitionsWithIndex(self, function: Callable[[int, Iterator[Any]], Any]) -> FakeRDD:
        def mapped() -> list[list[Any]]:
            return [
                list(function(index, iter(rows))) for index, rows in enumerate(self._partitions())
            ]

        return FakeRDD(mapped)

    def collect(self) -> list[Any]:
        return [item for partition in self._partitions() for item in partition]


class FakeBatch:
    """Quacks like the part of a batch DataFrame the sink uses: ``df.toJSON()`` (rows as
    JSON lines in `partitions` partitions, in order, the second one empty when there are
    three or more; each run of its tasks is counted in `writes`), and
    ``df.write.format("noop")...save()`` (counted in `noop_runs`). `fail_after_part` makes
    the tasks die after the first partition's object is written, like an executor failure."""

    def __init__(
        self, rows: Sequence[dict[str, Any]], *, partitions: int = 2, fail_after_part: bool = False
    ) -> None:
        self.rows = list(rows)
        self.partitions = partitions
        self.fail_after_part = fail_after_part
        self.writes = 0
        self.noop_runs = 0
        self._noop = False

    def toJSON(self) -> FakeRDD:
        def partitions() -> list[list[str]]:
            self.writes += 1
            # As Spark's toJSON (Jackson) writes them: characters beyond ASCII as they are.
            lines = [
                json.dumps(row, separators=(",", ":"), ensure_ascii=False) for row in self.rows
            ]
            filled = [i for i in range(self.partitions) if not (self.partitions >= 3 and i == 1)]
            split: list[list[str]] = [[] for _ in range(self.partitions)]
            chunk = -(-len(lines) // len(filled))  # contiguous chunks keep the rows' order
            for number, index in enumerate(filled):
                split[index] = lines[number * chunk : (number + 1) * chunk]
            return split

        return _FailingRDD(partitions) if self.fail_after_part else FakeRDD(partitions)

    @property
    def write(self) -> FakeBatch:
        return self

    def mode(self, mode: str) -> FakeBatch:
        assert mode == "overwrite"
        return self

    def format(self, source: str) -> FakeBatch:
        assert source == "noop"
        self._noop = True
        return self

    def save(self) -> None:
        assert self._noop
        self.noop_runs += 1


class _FailingRDD(FakeRDD):
    def mapPartitionsWithIndex(self, function: Callable[[int, Iterator[Any]], Any]) -> FakeRDD:
        def mapped() -> list[list[Any]]:
            first = list(function(0, iter(self._partitions()[0])))
            assert first, "the first partition wrote its object"
            raise RuntimeError("executor lost while writing")

        return FakeRDD(mapped)


Stage = Callable[[TransactionalFileSink, int, Sequence[dict[str, Any]]], FakeBatch]


def stage_rows(
    sink: TransactionalFileSink, batch_id: int, rows: Sequence[dict[str, Any]]
) -> FakeBatch:
    """`sink.write_batch` with a FakeBatch of `rows`."""
    batch = FakeBatch(rows)
    sink.write_batch(cast("DataFrame", batch), batch_id)
    return batch


@pytest.fixture
def stage() -> Stage:
    """``stage(sink, batch_id, rows)``: `sink.write_batch` with a FakeBatch of `rows`."""
    return stage_rows


@pytest.fixture
def fake_batch() -> type[FakeBatch]:
    return FakeBatch


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_storage_roots(metafunc, "output_root")


@pytest.fixture
def output_root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> StorageRoot:
    """A fresh, empty root on local disk, S3 or Azure, its credentials in the environment."""
    return storage_root_for(request, tmp_path / "storage", monkeypatch)


@pytest.fixture
def output_url(output_root: StorageRoot) -> str:
    """The sink's output directory on `output_root`."""
    return f"{output_root.url}/out"


@pytest.fixture
def sink(output_url: str) -> TransactionalFileSink:
    return TransactionalFileSink(output_url)


@pytest.fixture
def new_sink(output_url: str) -> Callable[[], TransactionalFileSink]:
    """Another sink instance on the same output: the next driver's."""
    return functools.partial(TransactionalFileSink, output_url)
