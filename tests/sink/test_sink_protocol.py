"""The two-phase-commit protocol of TransactionalFileSink, without Spark: batches are
encoded and written by a stand-in for Spark's tasks (conftest.FakeBatch). Each test runs on
the local filesystem, S3 (moto) and Azure Blob Storage (Azurite), unless marked local_only."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from helpers.objectstore import (
    S3Server,
    StorageRoot,
    storage_root_for,
    storage_roots,
    with_credentials_set,
)
from spark_checkpoint.sink import (
    COMMITTED_DIR,
    DATA_DIR,
    EPOCHS_DIR,
    OWNER_FILE,
    STAGING_DIR,
    BatchRecord,
    CheckpointParticipant,
    ReplayDiffers,
    StartRefused,
    Superseded,
    TransactionalFileSink,
    batch_record_name,
    latest_values,
    parse_batch_record_name,
    read_committed,
)
from spark_checkpoint.sink_storage import OutputStorage

JOB = "default/orders"  # the job the output belongs to (TransactionalFileSink.on_restore)

if TYPE_CHECKING:
    from conftest import StartProxy

Stage = Callable[[TransactionalFileSink, int, list[dict[str, Any]]], Any]
NewSink = Callable[[], TransactionalFileSink]


def rows_of(batch_id: int, words: str = "a b") -> list[dict[str, Any]]:
    """Recognisable rows for batch `batch_id`: each word with count batch_id + 1."""
    return [{"word": word, "count": batch_id + 1} for word in words.split()]


def stored(root: StorageRoot, output_url: str, directory: str) -> list[str]:
    """Files below `directory` of the output, as the store lists them (hidden ones too)."""
    return (
        root.files(f"{output_url}/{directory}") if root.exists(f"{output_url}/{directory}") else []
    )


def contents(root: StorageRoot, output_url: str) -> dict[str, bytes]:
    """Every file of the output and its bytes, but the writer epochs (each restore claims
    one): what a step that touches no output keeps."""
    return {
        path: root.read(f"{output_url}/{path}")
        for path in root.files(output_url)
        if not path.startswith(f"{EPOCHS_DIR}/")
    }


def record_of(root: StorageRoot, output_url: str, batch_id: int) -> BatchRecord:
    path = f"{output_url}/{COMMITTED_DIR}/{batch_record_name(batch_id)}"
    return BatchRecord.from_json(root.read(path), path)


def data_objects(root: StorageRoot, output_url: str) -> set[str]:
    return {f"{DATA_DIR}/{path}" for path in stored(root, output_url, DATA_DIR)}


def listed_objects(root: StorageRoot, output_url: str) -> set[str]:
    """Every data object a commit record lists."""
    sink = TransactionalFileSink(output_url)
    return {
        path
        for batch_id in sink.committed_batches()
        for path, _size in record_of(root, output_url, batch_id).files
    }


def stored_path(root: StorageRoot, output_url: str) -> str:
    """The path of the one staged record in the output."""
    (name,) = stored(root, output_url, STAGING_DIR)
    return f"{STAGING_DIR}/{name}"


def recorded_objects(root: StorageRoot, output_url: str) -> set[str]:
    """Every data object a commit record or a staged record lists."""
    staged = {
        path
        for name in stored(root, output_url, STAGING_DIR)
        for path, _size in BatchRecord.from_json(
            root.read(f"{output_url}/{STAGING_DIR}/{name}"), name
        ).files
    }
    return listed_objects(root, output_url) | staged


def first_driver(sink: TransactionalFileSink, stage: Stage, *, checkpoint: int) -> None:
    """A fresh start that stages batches 0..2 and completes the checkpoint of `checkpoint`."""
    sink.on_restore(None, JOB)
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(checkpoint)


# --- staging and commit -------------------------------------------------------------------


def test_staged_batches_are_invisible_until_their_checkpoint_completes(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    stage(sink, 0, rows_of(0))
    stage(sink, 1, rows_of(1))

    assert sink.staged_batches() == [0, 1]
    assert sink.committed_batches() == []
    assert read_committed(output_url) == {}

    sink.on_checkpoint_complete(1)

    assert sink.staged_batches() == []
    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
    assert stored(output_root, output_url, COMMITTED_DIR) == ["batch-0.json", "batch-1.json"]
    assert stored(output_root, output_url, STAGING_DIR) == []
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_rows_holding_line_separators_of_unicode_are_read_back_whole(
    sink: TransactionalFileSink, stage: Stage, output_url: str
) -> None:
    """Spark writes U+2028, U+2029 and U+0085 into its JSON lines as they are; the reader
    split lines at them too, and failed on committed output (a hostile reviewer's)."""
    rows = [{"word": f"a{separator}b", "count": 1} for separator in "\u2028\u2029\x85\x0b\x1c"]
    sink.on_restore(None, JOB)
    stage(sink, 0, rows)
    sink.on_checkpoint_complete(1)

    assert read_committed(output_url) == {0: rows}


def test_a_checkpoint_commits_only_the_batches_it_covers(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))

    sink.on_checkpoint_complete(1)

    assert sink.committed_batches() == [0, 1]
    assert sink.staged_batches() == [2]


def test_commit_is_idempotent(sink: TransactionalFileSink, stage: Stage, output_url: str) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(1)
    before = read_committed(output_url)

    sink.on_checkpoint_complete(1)
    sink.on_checkpoint_complete(0)  # an older notification arriving late

    assert read_committed(output_url) == before
    assert sink.staged_batches() == [2]


def test_commit_records_are_created_in_ascending_batch_order_and_only_created(
    sink: TransactionalFileSink, stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    for batch_id in (10, 2, 7, 0):  # staged out of order: order must come from the ids
        stage(sink, batch_id, rows_of(batch_id))
    created: list[str] = []
    real_create, real_write = OutputStorage.create, OutputStorage.write

    def recording_create(storage: OutputStorage, path: str, data: bytes) -> bool:
        created.append(path)
        return real_create(storage, path, data)

    def checking_write(storage: OutputStorage, path: str, data: bytes) -> None:
        assert not path.startswith(COMMITTED_DIR), "a commit record is never replaced"
        real_write(storage, path, data)

    monkeypatch.setattr(OutputStorage, "create", recording_create)
    monkeypatch.setattr(OutputStorage, "write", checking_write)
    sink.on_checkpoint_complete(10)

    assert created == [f"{COMMITTED_DIR}/batch-{b}.json" for b in (0, 2, 7, 10)]


def test_a_re_run_batch_replaces_its_staged_output_and_its_objects(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    stage(sink, 0, rows_of(0, "first attempt"))
    stage(sink, 0, rows_of(0, "second"))

    assert sink.staged_batches() == [0]
    sink.on_checkpoint_complete(0)
    assert read_committed(output_url) == {0: rows_of(0, "second")}
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_partitions_keep_their_order_and_empty_ones_write_no_object(
    sink: TransactionalFileSink, fake_batch: Any, output_root: StorageRoot, output_url: str
) -> None:
    rows = rows_of(0, "a b c d e f")
    sink.write_batch(fake_batch(rows, partitions=4), 0)
    sink.write_batch(fake_batch([], partitions=3), 1)
    sink.on_checkpoint_complete(1)

    assert read_committed(output_url) == {0: rows, 1: []}
    record = record_of(output_root, output_url, 0)
    assert [path.rsplit("/", 1)[1][:10] for path, _ in record.files] == [
        "part-00000",
        "part-00002",
        "part-00003",
    ]
    assert record_of(output_root, output_url, 1).files == ()


def test_a_failed_write_stages_nothing_and_leaves_no_garbage(
    sink: TransactionalFileSink,
    stage: Stage,
    fake_batch: Any,
    output_root: StorageRoot,
    output_url: str,
) -> None:
    stage(sink, 0, rows_of(0, "good"))
    kept = data_objects(output_root, output_url)

    with pytest.raises(RuntimeError, match="executor lost"):
        sink.write_batch(fake_batch(rows_of(0, "bad"), fail_after_part=True), 0)

    assert data_objects(output_root, output_url) == kept
    sink.on_checkpoint_complete(0)
    assert read_committed(output_url) == {0: rows_of(0, "good")}


# --- restore -------------------------------------------------------------------------------


def test_restore_commits_the_staged_batches_it_covers_and_the_re_run_replaces_later_ones(
    sink: TransactionalFileSink,
    stage: Stage,
    new_sink: NewSink,
    output_root: StorageRoot,
    output_url: str,
) -> None:
    for batch_id in range(5):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(1)
    # The registry now lists a checkpoint of batch 2, but the crash came before notify.

    restored = new_sink()
    restored.on_restore(2, JOB)

    assert restored.committed_batches() == [0, 1, 2]
    assert read_committed(output_url)[2] == rows_of(2)
    # Batches 3 and 4 stay staged (the driver before may be committing one) until the
    # re-run's copies, staged under the newer epoch, are committed in their place.
    assert restored.staged_batches() == [3, 4]
    assert data_objects(output_root, output_url) == recorded_objects(output_root, output_url)
    for batch_id in (3, 4):
        stage(restored, batch_id, rows_of(batch_id, "re-run"))
    restored.on_checkpoint_complete(4)

    assert read_committed(output_url) == {
        **{batch_id: rows_of(batch_id) for batch_id in range(3)},
        **{batch_id: rows_of(batch_id, "re-run") for batch_id in (3, 4)},
    }
    assert restored.staged_batches() == []
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_a_fresh_start_commits_no_staged_batch_and_its_own_replace_them(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))

    sink.on_restore(None, JOB)
    sink.on_checkpoint_complete(2)

    assert sink.committed_batches() == []
    stage(sink, 0, rows_of(0, "fresh"))
    sink.on_checkpoint_complete(2)
    assert read_committed(output_url) == {0: rows_of(0, "fresh")}
    assert sink.staged_batches() == [1, 2]
    assert data_objects(output_root, output_url) == recorded_objects(output_root, output_url)


def test_restore_is_idempotent_and_collects_the_objects_of_killed_attempts(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    # Attempts killed while their tasks wrote: objects that no record lists.
    orphans = {
        f"{DATA_DIR}/batch-3/{'a' * 32}/part-00000-x.json",
        f"{DATA_DIR}/batch-1/{'b' * 32}/part-00001-y.json",
    }
    for orphan in orphans:
        output_root.write(f"{output_url}/{orphan}", b'{"word": "partial"')

    sink.on_restore(1, JOB)
    sink.on_restore(1, JOB)

    assert sink.committed_batches() == [0, 1]
    assert sink.staged_batches() == [2]
    assert not orphans & data_objects(output_root, output_url)
    assert data_objects(output_root, output_url) == recorded_objects(output_root, output_url)
    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}


def test_a_stray_key_of_pattern_characters_is_deleted_as_itself_not_as_a_pattern(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    """fsspec's rm reads `*`, `?` and `[` as a pattern: a stray object named
    `_data/batch-1/**` took every committed object of batch 1 with it (a security
    reviewer's, on S3)."""
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    # (Not `?`: adlfs reads what follows it as a version id.)
    strays = [f"{DATA_DIR}/batch-1/**", f"{DATA_DIR}/batch-1/[a-z]*"]
    for stray in strays:
        output_root.write(f"{output_url}/{stray}", b"placed by someone")

    sink.on_restore(1, JOB)

    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
    assert data_objects(output_root, output_url) == recorded_objects(output_root, output_url)


def test_an_object_key_with_dot_segments_is_left_alone_by_garbage_collection(
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stage: Stage,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """S3 keeps `_data/batch-1/x/../../../victim` as a key (Azure refuses the name): the
    sink never writes one, and deleting it by a name that a store or a proxy normalises
    would take an object outside the output directory."""
    root = with_credentials_set(storage_roots("s3", tmp_path, lambda _kind: s3_server), monkeypatch)
    output_url = f"{root.url}/out"
    sink = TransactionalFileSink(output_url)
    for batch_id in range(2):
        stage(sink, batch_id, rows_of(batch_id))
    trap = f"{output_url}/{DATA_DIR}/batch-1/x/../../../victim"
    root.write(f"{output_url}/victim", b"not garbage")
    root.write(trap, b"placed by someone")

    with caplog.at_level(logging.WARNING, logger="spark_checkpoint.sink_storage"):
        sink.on_restore(1, JOB)  # commits batch 1, then deletes its unlisted objects

    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
    assert root.read(f"{output_url}/victim") == b"not garbage"
    assert root.exists(trap)
    assert "1 object key(s) that are no path below it" in caplog.text


@pytest.mark.parametrize("damaged", [1, 3], ids=["covered-by-the-restore", "after-it"])
def test_a_damaged_staged_record_refuses_the_start_naming_it_and_deletes_nothing(
    *,
    sink: TransactionalFileSink,
    stage: Stage,
    new_sink: NewSink,
    output_root: StorageRoot,
    output_url: str,
    damaged: int,
) -> None:
    """It failed with a ValueError traceback on every attempt (a hostile reviewer's); nor
    may a restore drop what the record lists: batch 1's output is the checkpoint's."""
    sink.on_restore(None, JOB)
    for batch_id in range(4):
        stage(sink, batch_id, rows_of(batch_id))
    [name] = [
        n for n in stored(output_root, output_url, STAGING_DIR) if n.startswith(f"batch-{damaged}.")
    ]
    record = f"{output_url}/{STAGING_DIR}/{name}"
    written = output_root.read(record)
    output_root.write(record, written[: len(written) // 2])
    before = contents(output_root, output_url)

    with pytest.raises(StartRefused) as refused:
        new_sink().on_restore(2, JOB)

    message = str(refused.value)
    assert f"{STAGING_DIR}/{name}: not a batch record: " in message, message
    assert "move the file away" in message and "\n" not in message
    assert contents(output_root, output_url) == before, "nothing was deleted or committed"
    output_root.write(record, written)
    new_sink().on_restore(2, JOB)
    assert read_committed(output_url) == {b: rows_of(b) for b in range(3)}


def test_a_replayed_batch_that_is_already_committed_is_not_staged_again(
    sink: TransactionalFileSink,
    stage: Stage,
    fake_batch: Any,
    output_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(2)
    # Fall back to an older checkpoint (batch 0): Spark replays batches 1 and 2.
    caplog.set_level(logging.INFO, logger="spark_checkpoint.sink")
    sink.on_restore(0, JOB)
    assert "batches 1..2 are already committed" in caplog.text

    replays = [fake_batch(rows_of(batch_id, "replayed")) for batch_id in (1, 2)]
    for batch_id, replay in zip((1, 2), replays, strict=True):
        sink.write_batch(replay, batch_id)
    stage(sink, 3, rows_of(3))
    sink.on_checkpoint_complete(3)

    assert [replay.writes for replay in replays] == [0, 0]
    assert [replay.noop_runs for replay in replays] == [1, 1]  # computed, output dropped
    assert "batch 2 is already committed; discarding the output of its replay" in caplog.text
    assert read_committed(output_url) == {b: rows_of(b) for b in range(4)}


def test_the_existing_commit_record_wins_over_a_staged_copy_of_another_attempt(
    sink: TransactionalFileSink,
    stage: Stage,
    output_root: StorageRoot,
    output_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A staged record of another attempt of a committed batch (written by a driver that
    was not quite gone): the commit record stays, the other attempt's objects are never
    visible and are deleted, the committed ones are kept."""
    stage(sink, 0, rows_of(0, "first"))
    sink.on_checkpoint_complete(0)
    winner = record_of(output_root, output_url, 0)
    stage(sink, 1, rows_of(1))
    loser = BatchRecord(
        0, "c" * 32, ((f"{DATA_DIR}/batch-0/{'c' * 32}/part-00000-{'f' * 32}.json", 3),)
    )
    output_root.write(f"{output_url}/{loser.files[0][0]}", b"{}\n")
    output_root.write(f"{output_url}/{STAGING_DIR}/batch-0.json", loser.to_json())
    caplog.set_level(logging.WARNING, logger="spark_checkpoint.sink")

    sink.on_checkpoint_complete(1)

    assert "batch 0 is already committed; dropping its staged copy" in caplog.text
    assert record_of(output_root, output_url, 0) == winner
    assert read_committed(output_url) == {0: rows_of(0, "first"), 1: rows_of(1)}
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_a_start_without_a_checkpoint_onto_committed_output_is_refused_touching_nothing(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    """An earlier run's output (its job's state and storage deleted to start over, or
    another job's): the new query's batches 0, 1, ... would be taken for replays of the
    committed ones and dropped. The runtime never starts fresh past registered images, so
    a start without a checkpoint onto committed batches is always such a mistake."""
    for batch_id in range(3):
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(1)
    before = contents(output_root, output_url)

    with pytest.raises(StartRefused) as refused:
        TransactionalFileSink(output_url).on_restore(None, JOB)

    assert str(refused.value) == (
        f"the output {OutputStorage(output_url).url} holds batches 0..1 committed by an "
        "earlier run, but the query starts without a checkpoint, so its batches of those ids "
        "would be dropped as replays; to start over, delete that output too (or write to an "
        "empty one); to go on from those batches, restore the checkpoint or savepoint they "
        "belong to (spec.restore.initialSavepointPath, run --from)"
    )
    after = contents(output_root, output_url)
    assert after == before


def test_the_output_belongs_to_the_first_job_and_another_is_refused_touching_nothing(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    """A fork (a job restored from another job's savepoint) given the original's output:
    its batches would take the original's ids, and each job would drop the other's
    batches as replays (a newcomer's fork committed batches 28..37 there, and the original
    then skipped its own 28..37 with only a warning in its driver log)."""
    first_driver(sink, stage, checkpoint=1)
    before = contents(output_root, output_url)
    owner = f"{OutputStorage(output_url).url}/{OWNER_FILE}"

    with pytest.raises(StartRefused) as refused:
        TransactionalFileSink(output_url).on_restore(1, "default/orders-fork")

    assert str(refused.value) == (
        f"the output {OutputStorage(output_url).url} belongs to job default/orders ({owner}), "
        "whose batch ids this job's would take (each dropping the other's as replays): give "
        "job default/orders-fork an output of its own (a fork of a job too), or delete "
        f"{owner} to hand the output over once that job no longer writes there"
    )
    after = contents(output_root, output_url)
    assert after == before, "the staged batch 2 and everything else untouched"
    TransactionalFileSink(output_url).on_restore(1, JOB)  # the owner goes on
    assert sink.committed_batches() == [0, 1]
    output_root.delete(f"{output_url}/{OWNER_FILE}")  # handed over
    TransactionalFileSink(output_url).on_restore(1, "default/orders-fork")
    with pytest.raises(StartRefused, match="belongs to job default/orders-fork "):
        TransactionalFileSink(output_url).on_restore(1, JOB)


def _offsets(location: Path, batch_id: int, files: int, at: int) -> None:
    """Spark's offset log entry of a batch over a file source: its version, its metadata
    (the batch's watermark and time) and the source's end offset."""
    (location / "offsets").mkdir(parents=True, exist_ok=True)
    (location / "offsets" / str(batch_id)).write_text(
        f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{at},"conf":{{}}}}\n'
        f'{{"logOffset":{files - 1}}}'
    )


def test_a_replay_that_reads_other_input_than_the_committed_batch_fails_loudly(
    stage: Stage, output_root: StorageRoot, output_url: str, tmp_path: Path
) -> None:
    """A newcomer's windowed count: batch 72 only advanced the watermark; after a cancel
    and a restore of the savepoint of batch 70, Spark planned 72 again over a new file, and
    the sink dropped it as a replay of the committed 72: 5 of 125 keys came out wrong."""
    first, second = tmp_path / "first" / "checkpoint", tmp_path / "second" / "checkpoint"
    sink = TransactionalFileSink(output_url)
    sink.on_restore(None, JOB, checkpoint_location=first)
    for batch_id, files in ((0, 1), (1, 2), (2, 2)):  # batch 2 read no new file
        _offsets(first, batch_id, files, at=1000 + batch_id)
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(2)
    committed = contents(output_root, output_url)

    restored = TransactionalFileSink(output_url)
    restored.on_restore(0, JOB, checkpoint_location=second)  # an image of batch 0
    _offsets(second, 1, 2, at=5000)  # batch 1 planned again over the same input
    stage(restored, 1, rows_of(1, "replayed"))
    _offsets(second, 2, 3, at=5001)  # batch 2 planned again over a new file
    with pytest.raises(ReplayDiffers) as refused:
        stage(restored, 2, rows_of(2, "new data"))

    assert str(refused.value) == (
        f"batch 2 is committed in {OutputStorage(output_url).url}, but its replay reads "
        "other input (Spark planned it again after a restore to an older image); skipping "
        "it would lose that input's output and committing it would add a second batch 2: "
        "restore the newest image, or take the output back to the restored image by "
        "deleting the commit records of batches 2..2 (committed/batch-<B>.json), which the "
        "query then writes again"
    )
    after = contents(output_root, output_url)
    assert after == committed, "nothing written or lost"
    output_root.delete(f"{output_url}/{COMMITTED_DIR}/batch-2.json")  # as the message says
    stage(restored, 2, rows_of(2, "new data"))
    restored.on_checkpoint_complete(2)
    assert read_committed(output_url) == {
        0: rows_of(0),
        1: rows_of(1),
        2: rows_of(2, "new data"),
    }


def _file_source_batch(
    location: Path, batch_id: int, files: list[str], *, compact_every: int = 0
) -> None:
    """What Spark logs when it plans `batch_id` over a file source that finds `files`: its
    log's next id (one per batch here) in the offset log, and the files under that id in
    ``sources/0/<id>``, or in ``<id>.compact`` (with every earlier id's) at a compaction."""
    log = location / "sources" / "0"
    log.mkdir(parents=True, exist_ok=True)
    (location / "offsets").mkdir(parents=True, exist_ok=True)
    (location / "offsets" / str(batch_id)).write_text(
        f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{batch_id},"conf":{{}}}}\n'
        f'{{"logOffset":{batch_id}}}'
    )
    lines = [
        json.dumps({"path": f"file:///in/{name}", "timestamp": 7, "batchId": batch_id})
        for name in files
    ]
    if compact_every and (batch_id + 1) % compact_every == 0:
        earlier = [
            line
            for log_id in range(batch_id)
            for line in (log / str(log_id)).read_text().splitlines()[1:]
        ]
        (log / f"{batch_id}.compact").write_text("\n".join(["v1", *earlier, *lines]))
    else:
        (log / str(batch_id)).write_text("\n".join(["v1", *lines]))


@pytest.mark.parametrize("compact_every", [0, 2], ids=["plain-log", "compacted-log"])
def test_a_replay_over_other_files_of_a_file_source_fails_loudly(
    stage: Stage, output_root: StorageRoot, output_url: str, tmp_path: Path, compact_every: int
) -> None:
    """A newcomer's upgrade: maxFilesPerTrigger 3 -> 2 after a cancel, and a restore of an
    older savepoint. The file source's offsets (its log ids) were the same, so the replays
    of batches 1.. over other files were skipped as the committed ones, and the files they
    had left out came again in later batches: 1,000 of 6,000 rows committed twice."""
    first, second = tmp_path / "first" / "checkpoint", tmp_path / "second" / "checkpoint"
    sink = TransactionalFileSink(output_url)
    sink.on_restore(None, JOB, checkpoint_location=first)
    for batch_id in range(3):  # three files a batch
        names = [f"part-{3 * batch_id + i}" for i in range(3)]
        _file_source_batch(first, batch_id, names, compact_every=compact_every)
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(2)
    committed = contents(output_root, output_url)

    restored = TransactionalFileSink(output_url)
    restored.on_restore(0, JOB, checkpoint_location=second)  # an image of batch 0
    _file_source_batch(second, 0, ["part-0", "part-1", "part-2"])  # in the image
    _file_source_batch(second, 1, ["part-3", "part-4"], compact_every=compact_every)
    with pytest.raises(
        ReplayDiffers, match=r"^batch 1 is committed in .* but its replay reads other input"
    ):
        stage(restored, 1, rows_of(1, "two files"))

    assert contents(output_root, output_url) == committed, "nothing written or lost"


def test_a_replay_over_the_same_files_of_a_file_source_is_skipped(
    stage: Stage, output_root: StorageRoot, output_url: str, tmp_path: Path
) -> None:
    first, second = tmp_path / "first" / "checkpoint", tmp_path / "second" / "checkpoint"
    sink = TransactionalFileSink(output_url)
    sink.on_restore(None, JOB, checkpoint_location=first)
    for batch_id in range(2):
        _file_source_batch(first, batch_id, [f"part-{batch_id}"])
        stage(sink, batch_id, rows_of(batch_id))
    sink.on_checkpoint_complete(1)
    restored = TransactionalFileSink(output_url)
    restored.on_restore(0, JOB, checkpoint_location=second)
    _file_source_batch(second, 0, ["part-0"])
    _file_source_batch(second, 1, ["part-1"])  # planned again at another time: same files

    stage(restored, 1, rows_of(1, "replayed"))

    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
    assert record_of(output_root, output_url, 1).source_files is not None


def test_a_record_without_its_input_skips_replays_as_before(
    sink: TransactionalFileSink, stage: Stage, output_url: str, tmp_path: Path
) -> None:
    """Records written without a checkpoint location (or before inputs were kept) cannot
    be compared: their replays are skipped by batch id."""
    stage(sink, 0, rows_of(0))
    sink.on_checkpoint_complete(0)
    restored = TransactionalFileSink(output_url)
    restored.on_restore(0, JOB, checkpoint_location=tmp_path / "chk")
    _offsets(tmp_path / "chk", 0, 5, at=1)

    stage(restored, 0, rows_of(0, "other"))

    assert read_committed(output_url) == {0: rows_of(0)}


def test_output_of_a_sink_without_owners_goes_to_the_first_job_that_starts(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    sink.on_restore(None, JOB)
    stage(sink, 0, rows_of(0))
    sink.on_checkpoint_complete(0)
    output_root.delete(f"{output_url}/{OWNER_FILE}")  # written before outputs had owners

    TransactionalFileSink(output_url).on_restore(0, "default/renamed")

    assert read_committed(output_url) == {0: rows_of(0)}
    owner = json.loads(output_root.read(f"{output_url}/{OWNER_FILE}"))
    assert owner == {"format": 1, "job": "default/renamed"}


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"job": 7}', b"[]", b"[" * 4000, b'{"job": "' + b"x" * 5000 + b'"}'],
)
def test_an_unreadable_owner_record_refuses_the_start_naming_it(
    output_root: StorageRoot, output_url: str, content: bytes
) -> None:
    output_root.write(f"{output_url}/{OWNER_FILE}", content)

    with pytest.raises(StartRefused) as refused:
        TransactionalFileSink(output_url).on_restore(None, JOB)

    assert str(refused.value) == (
        f"{OutputStorage(output_url).url}/{OWNER_FILE}: not a record of the job the output "
        'belongs to ({"job": "<namespace>/<name>"}): delete it to hand the output to the next '
        "job"
    )


def test_a_directory_where_the_owner_record_belongs_refuses_the_start_naming_it(
    output_root: StorageRoot, output_url: str
) -> None:
    """On Azure a bounded read of it was a TypeError traceback naming no file (a reviewer's)."""
    output_root.write(f"{output_url}/{OWNER_FILE}/stray", b"{}")

    with pytest.raises(StartRefused) as refused:
        TransactionalFileSink(output_url).on_restore(None, JOB)

    assert str(refused.value).startswith(
        f"{OutputStorage(output_url).url}/{OWNER_FILE}: not a record of the job the output"
    )


def test_an_owner_record_too_large_to_be_one_is_refused_without_reading_it_whole(
    tmp_path: Path,
) -> None:
    """Only its first bytes are read: an 8 GiB `_owner.json` (here sparse) was read whole
    before its size was checked, a MemoryError traceback under the driver's memory limit."""
    output = tmp_path / "out"
    output.mkdir()
    with (output / OWNER_FILE).open("wb") as owner:
        owner.truncate(8 << 30)
    script = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from spark_checkpoint.sink import StartRefused, TransactionalFileSink
try:
    TransactionalFileSink({str(output)!r}).on_restore(None, {JOB!r})
except StartRefused as refused:
    print(refused)
"""
    finished = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )

    assert finished.stdout.startswith(f"{output}/{OWNER_FILE}: not a record of the job"), (
        finished.stdout + finished.stderr
    )


def test_an_output_whose_bucket_does_not_exist_refuses_the_start_naming_it(
    output_root: StorageRoot,
) -> None:
    """The driver failed with `FileNotFoundError: The specified bucket does not exist`,
    naming neither the output nor the bucket, after two Spark starts (a hostile newcomer
    on S3); a local directory is made as it is written."""
    if output_root.kind == "local":
        TransactionalFileSink(f"{output_root.url}/missing/out").on_restore(None, JOB)
        return
    scheme, _, path = output_root.url.partition("://")
    missing = f"{scheme}://missing-bucket/{path.partition('/')[2]}/out"

    with pytest.raises(StartRefused) as refused:
        TransactionalFileSink(missing).on_restore(None, JOB)

    assert str(refused.value) == (
        f"the output {OutputStorage(missing).url}: its bucket or container does not exist "
        "(at the endpoint and account the driver's credentials reach)"
    )


def test_a_batch_staged_before_writer_epochs_is_committed_by_the_next_restore(
    sink: TransactionalFileSink,
    new_sink: NewSink,
    stage: Stage,
    output_root: StorageRoot,
    output_url: str,
) -> None:
    """An upgrade while a batch waits for its checkpoint: the last driver staged it as
    `_staging/batch-<B>.json` (no writer epoch); the next one commits it at its restore."""
    sink.on_restore(None, JOB)
    stage(sink, 0, rows_of(0))
    [name] = stored(output_root, output_url, STAGING_DIR)
    staged = output_root.read(f"{output_url}/{STAGING_DIR}/{name}")
    output_root.delete(f"{output_url}/{STAGING_DIR}/{name}")
    output_root.write(f"{output_url}/{STAGING_DIR}/{batch_record_name(0)}", staged)

    new_sink().on_restore(0, JOB)

    assert read_committed(output_url) == {0: rows_of(0)}
    assert stored(output_root, output_url, STAGING_DIR) == []


def test_a_staged_record_of_the_committed_attempt_keeps_its_objects(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    """A crash after the commit record was created and before the staged record was
    deleted: committing again, or a restore committing the staged batches it covers, must
    not delete the objects the commit record lists."""
    stage(sink, 0, rows_of(0))
    [name] = stored(output_root, output_url, STAGING_DIR)
    staged = output_root.read(f"{output_url}/{STAGING_DIR}/{name}")
    sink.on_checkpoint_complete(0)
    output_root.write(f"{output_url}/{STAGING_DIR}/{name}", staged)

    sink.on_restore(0, JOB)
    output_root.write(f"{output_url}/{STAGING_DIR}/{name}", staged)
    sink.on_checkpoint_complete(0)

    assert sink.staged_batches() == []
    assert read_committed(output_url) == {0: rows_of(0)}


# --- crashes -------------------------------------------------------------------------------


class SimulatedCrash(OSError):
    """Raised by a patched OutputStorage operation in place of the process dying."""


MUTATIONS = ("write", "create", "delete", "write_lines")


@pytest.fixture
def crash_at() -> Iterator[Callable[[int | None], list[str]]]:
    """``crash_at(n)``: the n-th storage write, create or delete from now (0-based) fails
    instead of happening (None: none fails); returns the list the calls are recorded in."""
    patches = pytest.MonkeyPatch()  # its own: undoing it keeps the credentials' variables

    def arm(failing_call: int | None) -> list[str]:
        patches.undo()
        calls: list[str] = []
        for name in MUTATIONS:
            real = getattr(OutputStorage, name)

            def patched(
                storage: OutputStorage, *args: Any, _real: Any = real, _name: str = name
            ) -> Any:
                if len(calls) == failing_call:
                    calls.append(f"{_name} (crashed)")
                    raise SimulatedCrash(f"crash instead of {_name}{args[:1]}")
                calls.append(_name)
                return _real(storage, *args)

            patches.setattr(OutputStorage, name, patched)
        return calls

    yield arm
    patches.undo()


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

    def __init__(self, output_url: str, stage: Stage) -> None:
        self.output_url = output_url
        self.stage = stage
        self.registered: int | None = None

    def run(self) -> None:
        sink = TransactionalFileSink(self.output_url)
        sink.on_restore(None, JOB)
        for step, batch_id in self.SCRIPT:
            if step == "stage":
                self.stage(sink, batch_id, rows_of(batch_id))
            else:
                self.registered = batch_id  # registry updated, then sinks notified
                sink.on_checkpoint_complete(batch_id)

    def recover(self) -> None:
        """A new driver restores the registered checkpoint and runs to the end."""
        sink = TransactionalFileSink(self.output_url)
        sink.on_restore(self.registered, JOB)
        first = 0 if self.registered is None else self.registered + 1
        for batch_id in range(first, self.LAST_BATCH + 1):
            self.stage(sink, batch_id, rows_of(batch_id))
        self.registered = self.LAST_BATCH
        sink.on_checkpoint_complete(self.LAST_BATCH)


@pytest.mark.local_only  # minutes on the servers; the property test kills there too
def test_a_crash_at_any_storage_write_is_consistent_and_recovery_is_exactly_once(
    output_root: StorageRoot,
    output_url: str,
    stage: Stage,
    crash_at: Callable[[int | None], list[str]],
) -> None:
    steps = crash_at(None)
    Driver(f"{output_url}/count", stage).run()
    assert len(steps) > 30, steps  # the writes, creates and deletes of the script

    for crash_point in range(len(steps) + 1):
        output = f"{output_url}/crash-{crash_point}"
        driver = Driver(output, stage)
        crash_at(crash_point)
        try:
            driver.run()
        except SimulatedCrash:
            assert crash_point < len(steps)
        else:
            assert crash_point == len(steps)
        crash_at(None)

        committed = read_committed(output)
        staged = TransactionalFileSink(output).staged_batches()
        assert all(rows == rows_of(b) for b, rows in committed.items()), crash_point
        registered = -1 if driver.registered is None else driver.registered
        assert max(committed, default=-1) <= registered, (
            f"output ahead of the registry at {crash_point}"
        )
        assert set(staged) | set(committed) >= set(range(registered + 1)), crash_point

        driver.recover()

        assert read_committed(output) == {b: rows_of(b) for b in range(Driver.LAST_BATCH + 1)}
        assert TransactionalFileSink(output).staged_batches() == []
        TransactionalFileSink(output).on_restore(Driver.LAST_BATCH, JOB)  # the next start
        assert data_objects(output_root, output) == listed_objects(output_root, output), crash_point


@pytest.fixture(params=["s3", "gcs", "azure"])
def object_store_root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> StorageRoot:
    return storage_root_for(request, tmp_path, monkeypatch)


# What batch 0's commit record upload sends: a PUT of its key (S3, Azure); on GCS a POST of
# the bucket's objects, the key in the body's metadata part (its JSON API's multipart upload).
_PUT_OF_THE_COMMIT_RECORD = re.compile(rb"^PUT /\S*/committed/batch-0\.json[ ?]", re.M)
COMMIT_RECORD_UPLOAD = {
    "s3": _PUT_OF_THE_COMMIT_RECORD,
    "azure": _PUT_OF_THE_COMMIT_RECORD,
    "gcs": re.compile(rb'"name": "\S*/committed/batch-0\.json"'),
}


def test_a_commit_whose_answer_was_lost_is_committed_when_the_store_refuses_its_retry(
    object_store_root: StorageRoot,
    faulty_proxy: StartProxy,
    stage: Stage,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store creates the commit record, its answer is lost, the client library retries
    the create-only upload and the store refuses it (S3 and GCS 412, Azure 409): the record
    there is this commit's own, so the batch is committed, not failed and not dropped."""
    root = object_store_root
    proxy = faulty_proxy(root, COMMIT_RECORD_UPLOAD[root.kind], None)
    output_url = f"{root.url}/out"
    sink = TransactionalFileSink(output_url)
    stage(sink, 0, rows_of(0))
    stage(sink, 1, rows_of(1))
    caplog.set_level(logging.INFO, logger="spark_checkpoint.sink")

    sink.on_checkpoint_complete(1)

    assert proxy.matched == 2, "the create-only upload and its retry"
    assert "batch 0 committed (its record was already there)" in caplog.text
    assert "dropping" not in caplog.text
    assert sink.staged_batches() == []
    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
    assert data_objects(root, output_url) == listed_objects(root, output_url)


# --- concurrency ---------------------------------------------------------------------------


def test_notifications_from_another_thread_while_batches_are_staged(
    sink: TransactionalFileSink, stage: Stage, output_url: str
) -> None:
    batches = 8
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
    assert read_committed(output_url) == {b: rows_of(b) for b in range(batches)}
    assert sink.staged_batches() == []


def test_concurrent_notifications_of_the_same_checkpoint(
    sink: TransactionalFileSink, stage: Stage
) -> None:
    for batch_id in range(8):
        stage(sink, batch_id, rows_of(batch_id))
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def notify() -> None:
        start.wait()
        try:
            sink.on_checkpoint_complete(7)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=notify) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sink.committed_batches() == list(range(8))


def test_a_driver_superseded_by_the_next_one_stages_nothing_more(
    sink: TransactionalFileSink,
    new_sink: NewSink,
    stage: Stage,
    output_root: StorageRoot,
    output_url: str,
) -> None:
    """A driver that runs on after the next one started (its pod force-deleted while its
    node was cut off from the API server) is fenced: its next batch fails its query and
    leaves nothing behind, the next driver's output is untouched."""
    first_driver(sink, stage, checkpoint=1)
    successor = new_sink()
    successor.on_restore(1, JOB)
    stage(successor, 2, rows_of(2))
    before = contents(output_root, output_url)

    with pytest.raises(Superseded) as refused:
        stage(sink, 3, rows_of(3, "stale"))

    assert str(refused.value) == (
        f"a newer driver writes the output {OutputStorage(output_url).url} (writer epoch 2 "
        "in _epochs/, this driver's was 1): this driver stages and commits nothing more "
        "there. The job's runtime replaced it (a force-deleted pod whose driver ran on, a "
        "second run of the job)"
    )
    assert contents(output_root, output_url) == before, "nothing of batch 3"
    successor.on_checkpoint_complete(2)
    assert read_committed(output_url) == {b: rows_of(b) for b in range(3)}


def test_a_driver_is_superseded_by_a_newer_epoch_whose_claimer_died_before_its_cleanup(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    """The next driver created its epoch and died before deleting the older one: the old
    driver, still running, is fenced all the same (a reviewer's finding)."""
    sink.on_restore(None, JOB)
    output_root.write(f"{output_url}/{EPOCHS_DIR}/epoch-2.json", b'{"format": 1, "epoch": 2}\n')

    with pytest.raises(Superseded, match=r"writer epoch 2 in _epochs/, this driver's was 1"):
        stage(sink, 0, rows_of(0))

    assert sink.staged_batches() == []


def test_a_superseded_driver_commits_nothing_on_a_late_notification(
    sink: TransactionalFileSink,
    new_sink: NewSink,
    stage: Stage,
    output_root: StorageRoot,
    output_url: str,
) -> None:
    """A notification that reaches the old driver after the next one restored (a request
    delayed across a network partition) commits none of its staged batches: the next
    driver discarded them and deleted their objects (a reviewer's finding)."""
    first_driver(sink, stage, checkpoint=1)
    [name] = stored(output_root, output_url, STAGING_DIR)
    record = output_root.read(f"{output_url}/{STAGING_DIR}/{name}")
    new_sink().on_restore(1, JOB)  # discards batch 2
    # The old driver's record of batch 2, landing late (its write crossed the restore).
    output_root.write(f"{output_url}/{STAGING_DIR}/{name}", record)

    with pytest.raises(Superseded):
        sink.on_checkpoint_complete(2)

    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}


def test_a_restore_superseded_midway_deletes_no_data_of_the_driver_after_it(
    sink: TransactionalFileSink,
    new_sink: NewSink,
    stage: Stage,
    *,
    output_root: StorageRoot,
    output_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two drivers restoring at once (never, by the runtimes; the fence should they): the
    one superseded while it restores stops before its garbage collection, which would
    delete the data the newer one's tasks are writing (a reviewer's finding)."""
    sink.on_restore(None, JOB)
    stage(sink, 0, rows_of(0))
    sink.on_checkpoint_complete(0)
    writing = f"{DATA_DIR}/batch-1/{'e' * 32}/part-00000-x.json"  # the newer driver's task
    newer: list[TransactionalFileSink] = []
    real_create = OutputStorage.create

    def newer_driver_starts_meanwhile(storage: OutputStorage, path: str, data: bytes) -> bool:
        created = real_create(storage, path, data)
        if path.startswith(f"{EPOCHS_DIR}/") and not newer:
            newer.append(new_sink())
            newer[0].on_restore(0, JOB)
            output_root.write(f"{output_url}/{writing}", b'{"word":"a"}\n')
        return created

    monkeypatch.setattr(OutputStorage, "create", newer_driver_starts_meanwhile)
    with pytest.raises(Superseded):
        new_sink().on_restore(0, JOB)
    monkeypatch.setattr(OutputStorage, "create", real_create)

    assert writing in data_objects(output_root, output_url)


@pytest.mark.parametrize("committed_by", ["notification", "next restore"])
def test_a_batch_a_superseded_driver_stages_as_it_is_replaced_is_never_committed(
    sink: TransactionalFileSink,
    new_sink: NewSink,
    stage: Stage,
    *,
    output_root: StorageRoot,
    output_url: str,
    monkeypatch: pytest.MonkeyPatch,
    committed_by: str,
) -> None:
    """The race the fence leaves: the old driver finds its writer epoch current, the next
    driver restores and stages the same batch, then the old driver's staged record lands.
    It must neither replace the next driver's batch (whose checkpoint would commit the old
    driver's rows) nor be committed later."""
    first_driver(sink, stage, checkpoint=2)
    successors: list[TransactionalFileSink] = []
    checks: list[str] = []
    real_list_names = OutputStorage.list_names

    def successor_starts_meanwhile(storage: OutputStorage, directory: str) -> list[str]:
        names = real_list_names(storage, directory)
        if directory == EPOCHS_DIR and not successors:
            checks.append(directory)
            if len(checks) == 2:  # the old driver's check before it writes its record
                successors.append(new_sink())
                successors[0].on_restore(2, JOB)
                stage(successors[0], 3, rows_of(3))
        return names

    monkeypatch.setattr(OutputStorage, "list_names", successor_starts_meanwhile)
    stage(sink, 3, rows_of(3, "stale"))
    monkeypatch.setattr(OutputStorage, "list_names", real_list_names)
    assert len(stored(output_root, output_url, STAGING_DIR)) == 2, "both drivers staged 3"

    if committed_by == "notification":
        successors[0].on_checkpoint_complete(3)
    else:  # the successor died before its notification
        new_sink().on_restore(3, JOB)

    assert read_committed(output_url) == {b: rows_of(b) for b in range(4)}
    assert stored(output_root, output_url, STAGING_DIR) == []
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_a_commit_a_superseded_driver_makes_as_it_is_replaced_lists_objects_still_there(
    sink: TransactionalFileSink,
    new_sink: NewSink,
    stage: Stage,
    *,
    output_root: StorageRoot,
    output_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race the fence leaves on the commit side (a reviewer's finding): the old driver
    finds its writer epoch current on a late notification and reads its staged record, the
    next driver restores an older checkpoint, then the old driver's commit record lands.
    The next driver had deleted that attempt's objects as it discarded the batch: the
    commit record listed objects that were gone, and every read of the output failed."""
    first_driver(sink, stage, checkpoint=1)  # 0 and 1 committed, 2 staged
    successors: list[TransactionalFileSink] = []
    real_create = OutputStorage.create

    def successor_restores_meanwhile(storage: OutputStorage, path: str, data: bytes) -> bool:
        if path == f"{COMMITTED_DIR}/batch-2.json" and not successors:
            successors.append(new_sink())
            successors[0].on_restore(1, JOB)
        return real_create(storage, path, data)

    monkeypatch.setattr(OutputStorage, "create", successor_restores_meanwhile)
    sink.on_checkpoint_complete(2)
    monkeypatch.setattr(OutputStorage, "create", real_create)

    assert read_committed(output_url) == {b: rows_of(b) for b in range(3)}
    successor = successors[0]
    stage(successor, 2, rows_of(2, "replayed"))  # the same input: skipped as committed
    stage(successor, 3, rows_of(3))
    successor.on_checkpoint_complete(3)
    assert read_committed(output_url) == {b: rows_of(b) for b in range(4)}
    assert successor.staged_batches() == []
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


@pytest.mark.parametrize("input_read", ["the same", "other"])
def test_a_superseded_drivers_commit_over_the_next_drivers_staged_copy_stands_if_same_input(
    stage: Stage,
    *,
    output_root: StorageRoot,
    output_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    input_read: str,
) -> None:
    """The old driver's late commit lands after the next driver staged its own copy of the
    batch: of the same input it stands (the next driver's copy is dropped unseen); of other
    input (Spark planned the batch again) the next driver's commit fails with
    ReplayDiffers, its copy kept staged, and goes through once the message's commit record
    is deleted. Either way no listed object is gone."""
    first, second = tmp_path / "first" / "checkpoint", tmp_path / "second" / "checkpoint"
    old = TransactionalFileSink(output_url)
    old.on_restore(None, JOB, checkpoint_location=first)
    for batch_id in range(2):
        _file_source_batch(first, batch_id, [f"part-{batch_id}"])
        stage(old, batch_id, rows_of(batch_id))
    old.on_checkpoint_complete(0)
    successor = TransactionalFileSink(output_url)
    real_create = OutputStorage.create

    def successor_runs_batch_1_meanwhile(storage: OutputStorage, path: str, data: bytes) -> bool:
        if path == f"{COMMITTED_DIR}/batch-1.json" and successor.staged_batches() == [1]:
            successor.on_restore(0, JOB, checkpoint_location=second)
            _file_source_batch(second, 0, ["part-0"])
            files = ["part-1"] if input_read == "the same" else ["part-1", "part-2"]
            _file_source_batch(second, 1, files)
            stage(successor, 1, rows_of(1, "successor"))
        return real_create(storage, path, data)

    monkeypatch.setattr(OutputStorage, "create", successor_runs_batch_1_meanwhile)
    old.on_checkpoint_complete(1)
    monkeypatch.setattr(OutputStorage, "create", real_create)
    caplog.set_level(logging.WARNING, logger="spark_checkpoint.sink")

    if input_read == "the same":
        successor.on_checkpoint_complete(1)
        assert "batch 1 is already committed; dropping its staged copy" in caplog.text
        assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
    else:
        with pytest.raises(
            ReplayDiffers,
            match=r"^batch 1 is committed in .*, but the copy this query staged reads other "
            r"input \(a driver that ran on after it was superseded committed its own\)",
        ):
            successor.on_checkpoint_complete(1)
        assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
        assert successor.staged_batches() == [1]
        # The driver after it, restoring the image of batch 1, meets it too.
        with pytest.raises(StartRefused, match=r"^batch 1 is committed in .*, but the copy"):
            TransactionalFileSink(output_url).on_restore(1, JOB, checkpoint_location=second)
        output_root.delete(f"{output_url}/{COMMITTED_DIR}/batch-1.json")
        successor = TransactionalFileSink(output_url)
        successor.on_restore(1, JOB, checkpoint_location=second)
        assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1, "successor")}
    assert successor.staged_batches() == []
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_a_commit_the_store_refuses_with_no_record_there_stays_staged_for_another_try(
    sink: TransactionalFileSink,
    stage: Stage,
    *,
    output_root: StorageRoot,
    output_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A create-only write refused for another reason than its record being there (adlfs
    raises FileExistsError for every 409, a container being deleted among them; the sink
    takes any S3 412 for a refusal): the batch was dropped as a duplicate, its objects
    deleted, and no retry could bring it back (a reviewer's finding)."""
    stage(sink, 0, rows_of(0))
    real_create = OutputStorage.create

    def refusing_commits(storage: OutputStorage, path: str, data: bytes) -> bool:
        return not path.startswith(f"{COMMITTED_DIR}/") and real_create(storage, path, data)

    monkeypatch.setattr(OutputStorage, "create", refusing_commits)
    with pytest.raises(
        OSError,
        match=r"/out/committed/batch-0\.json: the store refused to create it as existing, but "
        r"it is not there: batch 0 stays staged for another try$",
    ):
        sink.on_checkpoint_complete(0)
    monkeypatch.setattr(OutputStorage, "create", real_create)

    assert sink.staged_batches() == [0]
    sink.on_checkpoint_complete(0)
    assert read_committed(output_url) == {0: rows_of(0)}
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_a_sink_used_without_on_restore_commits_what_an_earlier_process_staged(
    stage: Stage, output_url: str
) -> None:
    """A sink used on its own (no agent, no on_restore) claims its epoch as it stages: an
    earlier process's staged batch, which Spark took for done, was never committed (a
    reviewer's, of a change that committed only this driver's copies)."""
    stage(TransactionalFileSink(output_url), 0, rows_of(0))  # dies before its notification
    sink = TransactionalFileSink(output_url)
    stage(sink, 1, rows_of(1))

    sink.on_checkpoint_complete(1)

    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}
    assert sink.staged_batches() == []


def test_a_staged_copy_whose_objects_are_gone_is_never_committed(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    """A driver that ran on after it was superseded deletes, as its own commit's garbage,
    the objects of a newer driver's attempt not staged yet, which then stages a record
    naming them (a reviewer's): a commit record of it would fail every read."""
    stage(sink, 0, rows_of(0))
    (listed, _size), *_ = BatchRecord.from_json(
        output_root.read(f"{output_url}/{stored_path(output_root, output_url)}"), "staged"
    ).files
    output_root.delete(f"{output_url}/{listed}")

    with pytest.raises(OSError, match=r"listed by staged batch 0, missing .*restore an image"):
        sink.on_checkpoint_complete(0)

    assert sink.committed_batches() == []
    assert sink.staged_batches() == [0]
    # At a restore no try can commit it: refused (no retries), not a storage error (one line).
    with pytest.raises(StartRefused, match=r"listed by staged batch 0, missing "):
        TransactionalFileSink(output_url).on_restore(0, JOB)


def test_a_restore_commits_an_older_whole_copy_of_a_batch_whose_newest_lost_objects(
    stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    """Two drivers staged batch 0 over the same input; the newer copy's objects were taken
    by a superseded driver's garbage collection. The restore committed nothing (the
    newest copy was chosen, and failed), attempt after attempt: the older copy is whole."""
    first = TransactionalFileSink(output_url)
    first.on_restore(None, JOB)
    stage(first, 0, rows_of(0))
    second = TransactionalFileSink(output_url)
    second.on_restore(None, JOB)
    stage(second, 0, rows_of(0))
    newest = max(stored(output_root, output_url, STAGING_DIR))  # batch-0.epoch-2.json
    (listed, _size), *_ = BatchRecord.from_json(
        output_root.read(f"{output_url}/{STAGING_DIR}/{newest}"), newest
    ).files
    output_root.delete(f"{output_url}/{listed}")

    TransactionalFileSink(output_url).on_restore(0, JOB)

    assert read_committed(output_url) == {0: rows_of(0)}
    assert data_objects(output_root, output_url) == listed_objects(output_root, output_url)


def test_a_restore_commits_the_staged_copy_that_read_the_restored_images_input(
    stage: Stage, output_url: str, tmp_path: Path
) -> None:
    """Image 1 turned out unusable, a driver fell back to image 0 and staged batch 1 again
    over other input, then died; image 1 is restored after all (a change of the spec made
    it usable, `run --from`). The newest copy of batch 1 is the fallback's: committing it
    beside image 1's state would lose the input image 1's batch 1 read (a reviewer's)."""
    first, second = tmp_path / "first" / "checkpoint", tmp_path / "second" / "checkpoint"
    driver = TransactionalFileSink(output_url)
    driver.on_restore(None, JOB, checkpoint_location=first)
    for batch_id in range(2):
        _file_source_batch(first, batch_id, [f"part-{batch_id}"])
        stage(driver, batch_id, rows_of(batch_id))
    driver.on_checkpoint_complete(0)  # image 1 registered, its notification lost
    fallback = TransactionalFileSink(output_url)
    fallback.on_restore(0, JOB, checkpoint_location=second)
    _file_source_batch(second, 0, ["part-0"])
    _file_source_batch(second, 1, ["part-1", "part-2"])
    stage(fallback, 1, rows_of(1, "fallback"))

    TransactionalFileSink(output_url).on_restore(1, JOB, checkpoint_location=first)

    assert read_committed(output_url) == {0: rows_of(0), 1: rows_of(1)}


# --- reading the output --------------------------------------------------------------------


def _commit(sink: TransactionalFileSink, stage: Stage, batches: dict[int, list[Any]]) -> None:
    for batch_id, rows in batches.items():
        stage(sink, batch_id, rows)
    sink.on_checkpoint_complete(max(batches))


@pytest.mark.local_only
def test_latest_values_takes_each_key_from_the_highest_committed_batch(
    sink: TransactionalFileSink, stage: Stage, output_url: str
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

    assert latest_values(output_url, "word") == {
        "a": {"word": "a", "count": 3},
        "b": {"word": "b", "count": 1},
        "c": {"word": "c", "count": 1},
    }


@pytest.mark.local_only
def test_latest_values_keys_non_string_values_by_their_json(
    sink: TransactionalFileSink, stage: Stage, output_url: str
) -> None:
    _commit(sink, stage, {0: [{"id": 5, "v": 1}], 1: [{"id": 5, "v": 2}, {"id": 6, "v": 1}]})

    assert latest_values(output_url, "id") == {
        "5": {"id": 5, "v": 2},
        "6": {"id": 6, "v": 1},
    }


@pytest.mark.local_only
@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"word": "a"}, {"word": "a"}], "occurs more than once"),
        ([{"count": 1}], "has no value for 'word'"),
        ([{"word": None}], "has no value for 'word'"),
    ],
)
def test_latest_values_rejects_output_no_update_mode_aggregation_writes(
    sink: TransactionalFileSink,
    stage: Stage,
    output_url: str,
    rows: list[dict[str, Any]],
    message: str,
) -> None:
    _commit(sink, stage, {0: rows})

    with pytest.raises(ValueError, match=message):
        latest_values(output_url, "word")


def test_reading_a_missing_output_directory_gives_nothing(output_url: str) -> None:
    assert read_committed(f"{output_url}/nothing") == {}
    assert latest_values(f"{output_url}/nothing", "word") == {}


def test_the_reader_reads_only_what_commit_records_list(
    sink: TransactionalFileSink, stage: Stage, output_root: StorageRoot, output_url: str
) -> None:
    _commit(sink, stage, {0: rows_of(0)})
    attempt = record_of(output_root, output_url, 0).attempt
    for stray in (
        f"{COMMITTED_DIR}/batch-01.json",  # not canonical
        f"{COMMITTED_DIR}/notes",
        f"{DATA_DIR}/batch-0/{attempt}/part-00009-unlisted.json",
        f"{DATA_DIR}/batch-1/{'d' * 32}/part-00000-x.json",
        f"{STAGING_DIR}/batch-1.json",
    ):
        output_root.write(f"{output_url}/{stray}", b'{"word": "stray", "count": 1}\n')

    assert read_committed(output_url) == {0: rows_of(0)}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("delete", "listed by committed batch 0, missing"),
        ("truncate", "committed batch 0 lists 2[0-9] bytes, found 3"),
        ("garble", r"\.json:1: not a JSON line: Expecting value"),
    ],
)
def test_a_committed_object_that_is_missing_or_changed_is_an_error_naming_it(
    sink: TransactionalFileSink,
    stage: Stage,
    *,
    output_root: StorageRoot,
    output_url: str,
    damage: str,
    message: str,
) -> None:
    _commit(sink, stage, {0: [{"word": "a", "count": 1}]})
    (path, size) = record_of(output_root, output_url, 0).files[0]
    if damage == "delete":
        output_root.delete(f"{output_url}/{path}")
    elif damage == "truncate":
        output_root.write(f"{output_url}/{path}", b"{}\n")
    else:  # the same size
        output_root.write(f"{output_url}/{path}", b"x" * (size - 1) + b"\n")

    with pytest.raises(ValueError, match=message) as error:
        read_committed(output_url)
    assert path.rsplit("/", 1)[1] in str(error.value)


ATTEMPT = "a" * 32
OBJECT = f"_data/batch-0/{ATTEMPT}/part-00000-{'b' * 32}.json"


def _record_listing(*paths: object) -> bytes:
    files = [{"path": path, "size": 1} for path in paths]
    return json.dumps({"format": 1, "batch": 0, "attempt": ATTEMPT, "files": files}).encode()


@pytest.mark.local_only
@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (b"not json", "not a batch record: Expecting value"),
        (b"[" * 100_000, "not a batch record: nested too deeply"),
        (b'{"format": 2, "batch": 0, "attempt": "", "files": []}', "format 2 is not 1"),
        (b'{"format": 1, "batch": 0, "files": []}', "no field 'attempt'"),
        (
            b'{"format": 1, "batch": 0, "attempt": "' + b"a" * 32 + b'", "files": '
            b'[{"path": "../../etc/passwd", "size": 1}]}',
            "is not a data object of _data/batch-0/",
        ),
        (b'{"format": true, "batch": 0, "attempt": "", "files": []}', "format True is not 1"),
        (_record_listing(5), "file 5 is not a data object"),
        (_record_listing(f"{OBJECT}?versionId=x"), "versionId=x' is not a data object of"),
        (_record_listing(f"{OBJECT}/x"), "is not a data object of"),
        (_record_listing(OBJECT, OBJECT), "is listed twice"),
    ],
)
def test_a_malformed_commit_record_is_an_error_naming_it(
    output_root: StorageRoot, output_url: str, document: bytes, reason: str
) -> None:
    output_root.write(f"{output_url}/{COMMITTED_DIR}/batch-0.json", document)

    with pytest.raises(ValueError, match=reason) as error:
        read_committed(output_url)
    assert str(error.value).startswith(
        f"{output_url.removeprefix('file://')}/committed/batch-0.json: "
    )


# --- names, types, imports -----------------------------------------------------------------


def test_batch_record_names_are_canonical() -> None:
    assert batch_record_name(0) == "batch-0.json"
    assert batch_record_name(12) == "batch-12.json"
    assert parse_batch_record_name("batch-12.json") == 12
    assert parse_batch_record_name("batch-0.json") == 0
    for name in ("batch-012.json", "batch--1.json", "batch-1", "batch-.json", "batch-1.json\n"):
        assert parse_batch_record_name(name) is None, name


@pytest.mark.local_only
@pytest.mark.parametrize("bad", [-1, True, 1.0, "1"])
def test_batch_ids_must_be_non_negative_integers(sink: TransactionalFileSink, bad: object) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        sink.on_checkpoint_complete(cast(int, bad))
    with pytest.raises(ValueError, match="non-negative integer"):
        sink.on_restore(cast(int, bad), JOB)


@pytest.mark.local_only
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
