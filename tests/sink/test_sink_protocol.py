"""The two-phase-commit protocol of TransactionalFileSink, without Spark: batches are
written by a stand-in for Spark's JSON writer (conftest.FakeBatch)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from spark_checkpoint.sink import (
    COMMITTED_DIR,
    STAGING_DIR,
    CheckpointParticipant,
    TransactionalFileSink,
    batch_dir_name,
    latest_values,
    parse_batch_dir_name,
    read_committed,
)

Stage = Callable[[TransactionalFileSink, int, list[dict[str, Any]]], Any]


def rows_of(batch_id: int, words: str = "a b") -> list[dict[str, Any]]:
    """Recognisable rows for batch `batch_id`: each word with count batch_id + 1."""
    return [{"word": word, "count": batch_id + 1} for word in words.split()]


def tmp_entries(sink: TransactionalFileSink) -> list[str]:
    return sorted(os.listdir(sink.output_dir / STAGING_DIR / "_tmp"))


# --- staging and commit -------------------------------------------------------------------


def test_staged_batches_are_invisible_until_their_checkpoint_completes(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    stage(sink, 0, rows_of(0))
    stage(sink, 1, rows_of(1))

    assert sink.staged_batches() == [0, 1]
    assert sink.committed_batches() == []
    assert read_committed(sink.output_dir) == {}

    sink.on_checkpoint_complete(1)

    assert sink.staged_batches() == []
    assert read_committed(sink.output_dir) == {0: rows_of(0), 1: rows_of(1)}
    assert tmp_entries(sink) == []


def test_a_checkpoint_commits_only_the_batches_it_covers(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))

    sink.on_checkpoint_complete(1)

    assert sink.committed_batches() == [0, 1]
    assert sink.staged_batches() == [2]


def test_commit_is_idempotent(sink: TransactionalFileSink, stage: Stage) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(1)
    before = read_committed(sink.output_dir)

    sink.on_checkpoint_complete(1)
    sink.on_checkpoint_complete(0)  # an older notification arriving late

    assert read_committed(sink.output_dir) == before
    assert sink.staged_batches() == [2]


def test_commit_renames_in_ascending_batch_order(
    sink: TransactionalFileSink, stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    for batch_id in (10, 2, 7, 0):  # staged out of order: order must come from the ids
        stage(sink, batch_id, rows_of(batch_id))
    committed: list[str] = []
    real_rename = os.rename

    def recording_rename(source: Any, target: Any) -> None:
        if Path(target).parent.name == COMMITTED_DIR:
            committed.append(Path(target).name)
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", recording_rename)
    sink.on_checkpoint_complete(10)

    assert committed == ["batch-0", "batch-2", "batch-7", "batch-10"]


def test_a_re_run_batch_replaces_its_staged_output(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    stage(sink, 0, rows_of(0, "first attempt"))
    stage(sink, 0, rows_of(0, "second"))

    assert sink.staged_batches() == [0]
    sink.on_checkpoint_complete(0)
    assert read_committed(sink.output_dir) == {0: rows_of(0, "second")}
    assert tmp_entries(sink) == []


def test_a_failed_write_stages_nothing_and_leaves_no_garbage(
    sink: TransactionalFileSink, stage: Stage, fake_batch: Any
) -> None:
    stage(sink, 0, rows_of(0, "good"))

    with pytest.raises(RuntimeError, match="executor lost"):
        sink.write_batch(fake_batch(rows_of(0, "bad"), fail_after_part=True), 0)

    assert tmp_entries(sink) == []
    sink.on_checkpoint_complete(0)
    assert read_committed(sink.output_dir) == {0: rows_of(0, "good")}


# --- restore -------------------------------------------------------------------------------


def test_restore_discards_staged_batches_after_it_and_commits_those_it_covers(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    for batch_id in range(5):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(1)
    # The registry now lists a checkpoint of batch 2, but the crash came before notify.

    restored = TransactionalFileSink(sink.output_dir)
    restored.on_restore(2)

    assert restored.committed_batches() == [0, 1, 2]
    assert restored.staged_batches() == []
    assert read_committed(sink.output_dir)[2] == rows_of(2)


def test_a_fresh_start_discards_every_staged_batch(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))

    sink.on_restore(None)

    assert sink.staged_batches() == []
    assert sink.committed_batches() == []


def test_restore_is_idempotent_and_removes_leftovers_of_interrupted_writes(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    leftover = sink.output_dir / STAGING_DIR / "_tmp" / "batch-3-0123abcd"
    leftover.mkdir()
    (leftover / "part-00000.json").write_text('{"word": "partial"')

    sink.on_restore(1)
    sink.on_restore(1)

    assert tmp_entries(sink) == []
    assert sink.committed_batches() == [0, 1]
    assert sink.staged_batches() == []


def test_a_replayed_batch_that_is_already_committed_is_not_staged_again(
    sink: TransactionalFileSink,
    stage: Stage,
    fake_batch: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(2)
    # Fall back to an older checkpoint (batch 0): Spark replays batches 1 and 2.
    caplog.set_level(logging.INFO, logger="spark_checkpoint.sink")
    sink.on_restore(0)
    assert "batches 1..2 are already committed" in caplog.text

    replays = [fake_batch(rows_of(batch_id, "replayed")) for batch_id in (1, 2)]
    for batch_id, replay in zip((1, 2), replays, strict=True):
        sink.write_batch(replay, batch_id)
    stage(sink, 3, rows_of(3))
    sink.on_checkpoint_complete(3)

    assert [replay.writes for replay in replays] == [0, 0]
    assert [replay.noop_runs for replay in replays] == [1, 1]  # computed, output dropped
    assert "batch 2 is already committed; discarding the output of its replay" in caplog.text
    assert read_committed(sink.output_dir) == {b: rows_of(b) for b in range(4)}


def test_a_staged_copy_of_a_committed_batch_is_dropped_on_commit(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    stage(sink, 0, rows_of(0))
    sink.on_checkpoint_complete(0)
    # Only possible if someone bypassed write_batch; the committed batch must win.
    committed = sink.output_dir / COMMITTED_DIR / "batch-0"
    staged = sink.output_dir / STAGING_DIR / "batch-0"
    staged.mkdir()
    for path in committed.iterdir():
        (staged / path.name).write_text("{}\n" if path.name.startswith("part") else "")

    sink.on_checkpoint_complete(0)

    assert sink.staged_batches() == []
    assert read_committed(sink.output_dir) == {0: rows_of(0)}


# --- crashes -------------------------------------------------------------------------------


class SimulatedCrash(OSError):
    """Raised by the patched os.rename in place of the process dying."""


@pytest.fixture
def crash_on_rename(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``crash_on_rename(n)``: the n-th os.rename from now (0-based) fails, once."""

    def arm(failing_call: int) -> None:
        real_rename = os.rename
        calls = iter(range(10**9))

        def rename(source: Any, target: Any) -> None:
            if next(calls) == failing_call:
                raise SimulatedCrash(f"crash before rename {source} -> {target}")
            real_rename(source, target)

        monkeypatch.setattr(os, "rename", rename)

    return arm


def test_a_crash_between_commit_renames_leaves_a_prefix_committed_and_a_retry_finishes(
    sink: TransactionalFileSink, stage: Stage, crash_on_rename: Callable[[int], None]
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    crash_on_rename(1)  # batch 0 is renamed, batch 1's rename fails

    with pytest.raises(SimulatedCrash):
        sink.on_checkpoint_complete(2)

    assert sink.committed_batches() == [0]
    assert sink.staged_batches() == [1, 2]
    sink.on_checkpoint_complete(2)
    assert read_committed(sink.output_dir) == {b: rows_of(b) for b in range(3)}


def test_a_crash_while_replacing_a_staged_batch_leaves_it_unstaged_and_a_retry_stages_it(
    sink: TransactionalFileSink, stage: Stage, crash_on_rename: Callable[[int], None]
) -> None:
    stage(sink, 0, rows_of(0, "first"))
    crash_on_rename(1)  # the old attempt is moved aside, the new one's rename fails

    with pytest.raises(SimulatedCrash):
        stage(sink, 0, rows_of(0, "second"))

    assert sink.staged_batches() == []  # Spark did not see the batch finish: it re-runs it
    assert tmp_entries(sink) == []
    stage(sink, 0, rows_of(0, "second"))
    sink.on_checkpoint_complete(0)
    assert read_committed(sink.output_dir) == {0: rows_of(0, "second")}


class Driver:
    """A scripted driver lifetime: Spark stages batches, the coordinator registers
    checkpoints and notifies the sink. `registered` is the registry (the newest registered
    checkpoint's batch), which a crash does not lose."""

    SCRIPT = (
        ("stage", 0),
        ("stage", 1),
        ("checkpoint", 1),
        ("stage", 2),
        ("stage", 2),  # batch 2 re-run after a failed attempt (same input, same rows)
        ("stage", 3),
        ("checkpoint", 3),
        ("stage", 4),
    )
    LAST_BATCH = 4

    def __init__(self, output_dir: Path, stage: Stage) -> None:
        self.output_dir = output_dir
        self.stage = stage
        self.registered: int | None = None

    def run(self) -> None:
        sink = TransactionalFileSink(self.output_dir)
        sink.on_restore(None)
        for step, batch_id in self.SCRIPT:
            if step == "stage":
                self.stage(sink, batch_id, rows_of(batch_id))
            else:
                self.registered = batch_id  # registry updated, then sinks notified
                sink.on_checkpoint_complete(batch_id)

    def recover(self) -> None:
        """A new driver restores the registered checkpoint and runs to the end."""
        sink = TransactionalFileSink(self.output_dir)
        sink.on_restore(self.registered)
        first = 0 if self.registered is None else self.registered + 1
        for batch_id in range(first, self.LAST_BATCH + 1):
            self.stage(sink, batch_id, rows_of(batch_id))
        self.registered = self.LAST_BATCH
        sink.on_checkpoint_complete(self.LAST_BATCH)


# Renames in Driver.run without a crash; crash point RENAMES means "crashed after the run".
RENAMES = 11


def test_the_crash_points_cover_every_rename_of_the_script(
    tmp_path: Path, stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_rename, calls = os.rename, []

    def counting(source: Any, target: Any) -> None:
        calls.append((source, target))
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", counting)
    Driver(tmp_path / "out", stage).run()

    assert len(calls) == RENAMES


@pytest.mark.parametrize("crash_point", range(RENAMES + 1))
def test_a_crash_at_any_rename_is_consistent_and_recovery_is_exactly_once(
    tmp_path: Path,
    stage: Stage,
    crash_on_rename: Callable[[int], None],
    monkeypatch: pytest.MonkeyPatch,
    crash_point: int,
) -> None:
    driver = Driver(tmp_path / "out", stage)
    crash_on_rename(crash_point)

    try:
        driver.run()
    except SimulatedCrash:
        assert crash_point < RENAMES
    else:
        assert crash_point == RENAMES

    committed = read_committed(driver.output_dir)
    staged = TransactionalFileSink(driver.output_dir).staged_batches()
    assert not set(committed) & set(staged), "a batch is both staged and committed"
    assert all(rows == rows_of(b) for b, rows in committed.items()), "a partial batch"
    registered = -1 if driver.registered is None else driver.registered
    assert max(committed, default=-1) <= registered, "output ahead of the registry"

    monkeypatch.undo()  # the new driver runs without crashing
    driver.recover()

    assert read_committed(driver.output_dir) == {
        b: rows_of(b) for b in range(Driver.LAST_BATCH + 1)
    }
    assert TransactionalFileSink(driver.output_dir).staged_batches() == []


# --- concurrency ---------------------------------------------------------------------------


def test_notifications_from_another_thread_while_batches_are_staged(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    batches = 40
    staged_up_to = -1
    errors: list[BaseException] = []
    done = threading.Event()

    def agent() -> None:
        try:
            while not done.is_set():
                if staged_up_to >= 0:
                    sink.on_checkpoint_complete(staged_up_to)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        for batch_id in range(batches):
            stage(sink, batch_id, rows_of(batch_id))
            staged_up_to = batch_id
    finally:
        done.set()
        thread.join()

    assert errors == []
    sink.on_checkpoint_complete(batches - 1)
    assert read_committed(sink.output_dir) == {b: rows_of(b) for b in range(batches)}
    assert sink.staged_batches() == []


def test_concurrent_notifications_of_the_same_checkpoint(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    for batch_id in range(20):
        stage(sink, batch_id, rows_of(batch_id))
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def notify() -> None:
        start.wait()
        try:
            sink.on_checkpoint_complete(19)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=notify) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sink.committed_batches() == list(range(20))


# --- reading the output --------------------------------------------------------------------


def _commit(sink: TransactionalFileSink, stage: Stage, batches: dict[int, list[Any]]) -> None:
    for batch_id, rows in batches.items():
        stage(sink, batch_id, rows)
    sink.on_checkpoint_complete(max(batches))


def test_latest_values_takes_each_key_from_the_highest_committed_batch(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    _commit(
        sink,
        stage,
        {
            0: [{"word": "a", "count": 1}, {"word": "b", "count": 1}],
            1: [{"word": "a", "count": 2}],
            2: [{"word": "c", "count": 1}, {"word": "a", "count": 3}],
        },
    )
    stage(sink, 3, [{"word": "a", "count": 99}])  # staged only: not visible

    assert latest_values(sink.output_dir, "word") == {
        "a": {"word": "a", "count": 3},
        "b": {"word": "b", "count": 1},
        "c": {"word": "c", "count": 1},
    }


def test_latest_values_keys_non_string_values_by_their_json(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    _commit(sink, stage, {0: [{"id": 5, "v": 1}], 1: [{"id": 5, "v": 2}, {"id": 6, "v": 1}]})

    assert latest_values(sink.output_dir, "id") == {
        "5": {"id": 5, "v": 2},
        "6": {"id": 6, "v": 1},
    }


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"word": "a"}, {"word": "a"}], "occurs more than once"),
        ([{"count": 1}], "has no value for 'word'"),
        ([{"word": None}], "has no value for 'word'"),
    ],
)
def test_latest_values_rejects_output_no_update_mode_aggregation_writes(
    sink: TransactionalFileSink, stage: Stage, rows: list[dict[str, Any]], message: str
) -> None:
    _commit(sink, stage, {0: rows})

    with pytest.raises(ValueError, match=message):
        latest_values(sink.output_dir, "word")


def test_reading_a_missing_output_directory_gives_nothing(tmp_path: Path) -> None:
    assert read_committed(tmp_path / "nothing") == {}
    assert latest_values(tmp_path / "nothing", "word") == {}


def test_read_committed_ignores_hidden_files_and_non_batch_directories(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    _commit(sink, stage, {0: rows_of(0)})
    committed = sink.output_dir / COMMITTED_DIR
    (committed / "batch-01").mkdir()  # not canonical
    (committed / "notes").mkdir()
    (committed / "batch-0" / "_metadata").write_text("not json")

    assert read_committed(sink.output_dir) == {0: rows_of(0)}


# --- names, types, imports -----------------------------------------------------------------


def test_batch_directory_names_are_canonical() -> None:
    assert batch_dir_name(0) == "batch-0"
    assert batch_dir_name(12) == "batch-12"
    assert parse_batch_dir_name("batch-12") == 12
    assert parse_batch_dir_name("batch-0") == 0
    for name in ("batch-012", "batch--1", "batch-1 ", "batch-", "chk-1", "batch-1\n"):
        assert parse_batch_dir_name(name) is None, name


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1"])
def test_batch_ids_must_be_non_negative_integers(sink: TransactionalFileSink, bad: object) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        sink.on_checkpoint_complete(cast(int, bad))
    with pytest.raises(ValueError, match="non-negative integer"):
        sink.on_restore(cast(int, bad))


def test_the_sink_is_a_checkpoint_participant(sink: TransactionalFileSink) -> None:
    assert isinstance(sink, CheckpointParticipant)


def test_the_module_imports_without_pyspark() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None; sys.modules['py4j'] = None\n"
        "import spark_checkpoint.sink as sink\n"
        "assert not any(m.startswith(('pyspark.', 'py4j.')) for m in sys.modules)\n"
        "print(sink.TransactionalFileSink.__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "TransactionalFileSink"
