"""Fixtures for the transactional sink tests: the word-count example modules (loaded from
their files, examples/ is not a package) and a stand-in for a batch DataFrame that writes
what Spark's JSON writer writes, for the protocol tests that need no Spark."""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pytest

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


class FakeBatch:
    """Quacks like the part of a batch DataFrame the sink uses:
    ``df.write.mode(...).json(uri)``, writing part files, ``_SUCCESS`` and a ``.crc`` file
    the way Spark does (counted in `writes`), and ``df.write.format("noop")...save()``
    (counted in `noop_runs`). `fail_after_part` makes the JSON write die half-way, like an
    executor failure."""

    def __init__(self, rows: Sequence[dict[str, Any]], *, fail_after_part: bool = False) -> None:
        self.rows = list(rows)
        self.fail_after_part = fail_after_part
        self.writes = 0
        self.noop_runs = 0
        self._noop = False

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

    def json(self, uri: str) -> None:
        assert uri.startswith("file:///"), uri
        self.writes += 1
        directory = Path(uri.removeprefix("file://"))
        directory.mkdir(parents=True)
        name = f"part-00000-{uuid.uuid4()}-c000.json"
        (directory / name).write_text("".join(json.dumps(row) + "\n" for row in self.rows))
        (directory / f".{name}.crc").write_bytes(b"crc")
        if self.fail_after_part:
            raise RuntimeError("executor lost while writing")
        (directory / "_SUCCESS").write_text("")


Stage = Callable[[TransactionalFileSink, int, Sequence[dict[str, Any]]], FakeBatch]


def _stage(sink: TransactionalFileSink, batch_id: int, rows: Sequence[dict[str, Any]]) -> FakeBatch:
    batch = FakeBatch(rows)
    sink.write_batch(cast("DataFrame", batch), batch_id)
    return batch


@pytest.fixture
def stage() -> Stage:
    """``stage(sink, batch_id, rows)``: `sink.write_batch` with a FakeBatch of `rows`."""
    return _stage


@pytest.fixture
def fake_batch() -> type[FakeBatch]:
    return FakeBatch


@pytest.fixture
def sink(tmp_path: Path) -> TransactionalFileSink:
    return TransactionalFileSink(str(tmp_path / "out"))
