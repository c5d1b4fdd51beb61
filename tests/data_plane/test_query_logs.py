"""Reading a query's own logs (spark_checkpoint.query_logs) in the shapes Spark writes them;
the real-Spark tests (test_snapshot_spark_layouts, the sink's) run queries that write them."""

import errno
import json
import os
from pathlib import Path

import pytest

from spark_checkpoint.query_logs import (
    file_source_entries,
    file_source_log_offsets,
    is_file_source_log,
    read_offset_log_entry,
    source_dirs,
)

METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'


def _offsets(location: Path, batch_id: int, version: str, *lines: str) -> None:
    (location / "offsets").mkdir(parents=True, exist_ok=True)
    (location / "offsets" / str(batch_id)).write_text("\n".join([version, METADATA, *lines]))


def _file_source_log(location: Path, name: str, *files: str) -> Path:
    log = location / "sources" / name
    log.mkdir(parents=True)
    entries = [json.dumps({"path": f"file:///in/{f}", "timestamp": 7, "batchId": 0}) for f in files]
    (log / "0").write_text("\n".join(["v1", *entries]))
    return log


def _kafka_source_log(location: Path, name: str, topic: str) -> Path:
    log = location / "sources" / name
    log.mkdir(parents=True)
    (log / "0").write_text(f'v1\n{{"{topic}":{{"0":0}}}}')  # KafkaSourceInitialOffsetWriter
    return log


def test_numbered_sources_first_then_named_ones(tmp_path: Path) -> None:
    for name in ("10", "2", "orders", ".hidden"):
        (tmp_path / "sources" / name).mkdir(parents=True)
    (tmp_path / "sources" / "3").write_text("")  # not a directory

    assert source_dirs(tmp_path) == ["2", "10", "orders"]
    assert source_dirs(tmp_path / "missing") == []


def test_v1_lines_map_to_numbered_sources_in_order(tmp_path: Path) -> None:
    _file_source_log(tmp_path, "0", "a")
    _kafka_source_log(tmp_path, "1", "events")
    _file_source_log(tmp_path, "2", "b")
    _offsets(tmp_path, 4, "v1", '{"logOffset":3}', '{"events":{"0":5}}', "-")
    entry = read_offset_log_entry(tmp_path, 4)
    assert entry is not None

    assert file_source_log_offsets(tmp_path, entry, source_dirs(tmp_path)) == {"0": 3, "2": -1}


def test_v1_lines_of_a_source_read_twice_map_to_no_source_unless_guessed(tmp_path: Path) -> None:
    """``a.union(a).union(b)``: three lines, two directories; b's line is the third. Taken
    by position (a fingerprint's guess), b's directory gets a's second line."""
    _file_source_log(tmp_path, "0", "a")
    _file_source_log(tmp_path, "1", "b")
    _offsets(tmp_path, 4, "v1", '{"logOffset":3}', '{"logOffset":3}', '{"logOffset":1}')
    entry = read_offset_log_entry(tmp_path, 4)
    assert entry is not None
    dirs = source_dirs(tmp_path)

    assert file_source_log_offsets(tmp_path, entry, dirs) == {}
    assert file_source_log_offsets(tmp_path, entry, dirs, exact=False) == {"0": 3, "1": 3}


def test_v1_lines_map_past_a_source_that_keeps_no_directory(tmp_path: Path) -> None:
    """``rate.union(files)``: the rate source keeps no ``sources/0``; the file source's
    ``sources/1`` is the last line's, so no source can have been read twice (a reviewer's:
    such a query lost the sink's check of the files a replay reads)."""
    _file_source_log(tmp_path, "1", "a")
    _offsets(tmp_path, 4, "v1", '{"0":{"value":9}}', '{"logOffset":3}')
    entry = read_offset_log_entry(tmp_path, 4)
    assert entry is not None

    assert file_source_log_offsets(tmp_path, entry, source_dirs(tmp_path)) == {"1": 3}


def test_v1_lines_before_a_source_that_keeps_no_directory_are_a_guess(tmp_path: Path) -> None:
    """``files.union(rate)`` writes what ``files.union(files)`` writes: two lines and
    ``sources/0``; only a guess maps the first line to it."""
    _file_source_log(tmp_path, "0", "a")
    _offsets(tmp_path, 4, "v1", '{"logOffset":3}', '{"0":{"value":9}}')
    entry = read_offset_log_entry(tmp_path, 4)
    assert entry is not None
    dirs = source_dirs(tmp_path)

    assert file_source_log_offsets(tmp_path, entry, dirs) == {}
    assert file_source_log_offsets(tmp_path, entry, dirs, exact=False) == {"0": 3}


def test_sources_that_cannot_be_listed_are_an_error_not_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image planned as if the query had no source log would restart reading its input
    again (a reviewer's: an I/O error listing ``sources/`` planned an image without them)."""
    _file_source_log(tmp_path, "0", "a")

    def failing(path: object) -> object:
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(os, "scandir", failing)
    with pytest.raises(OSError, match="Input/output error"):
        source_dirs(tmp_path)


def test_v2_lines_name_their_sources(tmp_path: Path) -> None:
    _file_source_log(tmp_path, "orders", "a")
    _file_source_log(tmp_path, "returns", "b")
    _offsets(tmp_path, 4, "v2", 'orders:{"logOffset":2}', "returns:-", 'gone:{"logOffset":1}')
    entry = read_offset_log_entry(tmp_path, 4)
    assert entry is not None

    assert file_source_log_offsets(tmp_path, entry, source_dirs(tmp_path)) == {
        "orders": 2,
        "returns": -1,
    }


@pytest.mark.parametrize("content", ["", "v1", "v1\n", "\x00" * 10])
def test_an_offset_log_entry_without_its_metadata_is_none(tmp_path: Path, content: str) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text(content)

    assert read_offset_log_entry(tmp_path, 0) is None
    assert read_offset_log_entry(tmp_path, 1) is None


def test_a_kafka_topic_named_path_is_no_file_source(tmp_path: Path) -> None:
    assert not is_file_source_log(_kafka_source_log(tmp_path, "0", "path"))
    assert is_file_source_log(_file_source_log(tmp_path, "1", "a"))


def test_a_log_holding_only_a_compaction_is_a_file_source(tmp_path: Path) -> None:
    log = tmp_path / "sources" / "0"
    log.mkdir(parents=True)
    (log / "9.compact").write_text("v1\n")

    assert is_file_source_log(log)
    assert not is_file_source_log(tmp_path / "sources" / "missing")


def test_a_batch_lists_its_own_files_of_a_compaction(tmp_path: Path) -> None:
    log = tmp_path / "sources" / "0"
    log.mkdir(parents=True)
    lines = [
        json.dumps({"path": f"file:///in/{name}", "timestamp": 7, "batchId": batch})
        for batch, name in ((0, "a"), (1, "b"), (1, "c"))
    ]
    (log / "1.compact").write_text("\n".join(["v1", *lines]))

    assert file_source_entries(log, 1) == ["file:///in/b\t7", "file:///in/c\t7"]
    assert file_source_entries(log, 2) is None
