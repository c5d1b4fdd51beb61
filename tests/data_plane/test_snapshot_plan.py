"""Which files of a live Spark checkpoint location an image at batch B takes (no Spark:
the layouts are built by hand after the ones Spark 4.3 writes)."""

import errno
import os
from pathlib import Path

import pytest

from spark_checkpoint.agent import snapshot as snapshot_module
from spark_checkpoint.agent.snapshot import (
    LOGS_TASK,
    SnapshotError,
    pin,
    plan_snapshot,
    snapshot_tasks,
    state_partitions,
)
from spark_checkpoint.storage import SymbolicLinkError


def _touch(root: Path, *relative: str) -> None:
    for name in relative:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)


def _logs(root: Path, batches: int, planned: int | None = None) -> None:
    _touch(root, "metadata")
    for b in range(planned if planned is not None else batches):
        _touch(root, f"offsets/{b}", f"sources/0/{b}")
    for b in range(batches):
        _touch(root, f"commits/{b}", f"commits/.{b}.crc")


def test_no_tasks_before_the_first_commit(tmp_path: Path) -> None:
    _logs(tmp_path, batches=0, planned=1)
    assert snapshot_tasks(tmp_path) == frozenset()


def test_hdfs_provider_takes_latest_snapshot_and_later_deltas(tmp_path: Path) -> None:
    _logs(tmp_path, batches=6, planned=7)
    for partition in ("0", "1"):
        base = f"state/0/{partition}"
        _touch(tmp_path, *(f"{base}/{v}.delta" for v in range(1, 8)), f"{base}/4.snapshot")
        _touch(tmp_path, f"{base}/.5.delta.crc")
    _touch(tmp_path, "state/0/0/_metadata/schema", "state/0/_metadata/v2/0")

    plan = plan_snapshot(tmp_path, batch_id=5)

    assert plan.tasks == {LOGS_TASK, "state-0-0", "state-0-1"}
    assert plan.files_by_task["state-0-1"] == (
        "state/0/1/4.snapshot",
        "state/0/1/5.delta",
        "state/0/1/6.delta",
    )
    logs = plan.files_by_task[LOGS_TASK]
    assert [f for f in logs if f.startswith(("offsets/", "commits/"))] == [
        "offsets/4",  # Spark reads the second latest offsets on restart
        "offsets/5",  # batch 6 is planned but not committed: not part of the image
        "commits/5",
    ]
    assert "sources/0/5" in logs and "sources/0/6" not in logs
    assert {"metadata", "state/0/0/_metadata/schema", "state/0/_metadata/v2/0"} <= set(logs)
    assert not any(name.endswith(".crc") for files in plan.files_by_task.values() for name in files)


def test_source_logs_from_the_latest_two_compactions(tmp_path: Path) -> None:
    _logs(tmp_path, batches=25)
    _touch(tmp_path, "sources/0/9.compact", "sources/0/19.compact", "sources/0/29.compact")
    for name in ("sources/0/9", "sources/0/19"):
        (tmp_path / name).unlink()  # replaced by their compaction
    logs = plan_snapshot(tmp_path, 22).files_by_task[LOGS_TASK]
    assert [f for f in logs if f.startswith("sources/")] == [
        "sources/0/9.compact",  # only its name matters: Spark derives the interval from it
        "sources/0/19.compact",
        "sources/0/20",
        "sources/0/21",
        "sources/0/22",
    ]


def test_a_single_compaction_is_all_the_log_has(tmp_path: Path) -> None:
    _logs(tmp_path, batches=14)
    (tmp_path / "sources/0/9").unlink()
    _touch(tmp_path, "sources/0/9.compact")
    logs = plan_snapshot(tmp_path, 12).files_by_task[LOGS_TASK]
    assert [f for f in logs if f.startswith("sources/")] == [
        "sources/0/9.compact",
        "sources/0/10",
        "sources/0/11",
        "sources/0/12",
    ]


def test_transform_with_state_metadata_written_after_the_batch_is_left_out(tmp_path: Path) -> None:
    _logs(tmp_path, batches=8)
    _touch(tmp_path, *(f"state/0/0/{v}.delta" for v in range(1, 9)))
    for batch in (0, 4, 7):  # the first batch of three runs
        _touch(tmp_path, f"state/0/_metadata/v2/{batch}")
        _touch(tmp_path, f"state/0/_stateSchema/default/{batch}_0a1b2c3d-4e5f")
    logs = plan_snapshot(tmp_path, 5).files_by_task[LOGS_TASK]
    assert [f for f in logs if f.startswith("state/")] == [
        "state/0/_metadata/v2/0",
        "state/0/_metadata/v2/4",
        "state/0/_stateSchema/default/0_0a1b2c3d-4e5f",
        "state/0/_stateSchema/default/4_0a1b2c3d-4e5f",
    ]


def test_without_a_snapshot_every_delta_from_version_one(tmp_path: Path) -> None:
    _logs(tmp_path, batches=3)
    _touch(tmp_path, *(f"state/0/0/{v}.delta" for v in range(1, 4)))
    assert plan_snapshot(tmp_path, 2).files_by_task["state-0-0"] == (
        "state/0/0/1.delta",
        "state/0/0/2.delta",
        "state/0/0/3.delta",
    )


def test_rocksdb_takes_the_version_zip_and_the_sst_files(tmp_path: Path) -> None:
    _logs(tmp_path, batches=4)
    base = "state/0/0"
    _touch(tmp_path, *(f"{base}/{v}.zip" for v in range(1, 6)))
    _touch(tmp_path, f"{base}/SSTs/000008-aa.sst", f"{base}/SSTs/000009-bb.sst")
    _touch(tmp_path, f"{base}/SSTs/.000010-cc.sst.tmp", f"{base}/.6.zip.tmp")
    _touch(tmp_path, f"{base}/logs/000007-dd.log")  # an archived log a zip can list
    files = plan_snapshot(tmp_path, 3).files_by_task["state-0-0"]
    assert files == (
        f"{base}/4.zip",
        f"{base}/SSTs/000008-aa.sst",
        f"{base}/SSTs/000009-bb.sst",
        f"{base}/logs/000007-dd.log",
    )
    assert [p.task for p in state_partitions(tmp_path)] == ["state-0-0"]


def test_rocksdb_changelog_checkpointing_takes_zip_and_later_changelogs(tmp_path: Path) -> None:
    _logs(tmp_path, batches=6)
    base = "state/0/0"
    _touch(tmp_path, *(f"{base}/{v}.changelog" for v in range(1, 8)), f"{base}/5.zip")
    files = plan_snapshot(tmp_path, 5).files_by_task["state-0-0"]
    assert files == (f"{base}/5.zip", f"{base}/6.changelog")


def test_a_missing_version_is_an_error_not_a_silent_gap(tmp_path: Path) -> None:
    _logs(tmp_path, batches=4)
    _touch(tmp_path, "state/0/0/1.delta", "state/0/0/2.delta", "state/0/0/4.delta")
    with pytest.raises(
        SnapshotError, match=r"state/0/0: version 4 cannot be rebuilt; missing versions \[3\]"
    ):
        plan_snapshot(tmp_path, 3)


def test_an_uncommitted_batch_cannot_be_planned(tmp_path: Path) -> None:
    _logs(tmp_path, batches=2, planned=3)
    with pytest.raises(SnapshotError, match="batch 2 is not committed"):
        plan_snapshot(tmp_path, 2)


def test_operators_with_several_stores_get_a_task_per_store(tmp_path: Path) -> None:
    _logs(tmp_path, batches=1)
    for store in ("left-keyToNumValues", "right-keyToNumValues"):
        _touch(tmp_path, f"state/0/0/{store}/1.delta")
    assert [p.task for p in state_partitions(tmp_path)] == [
        "state-0-0-left-keyToNumValues",
        "state-0-0-right-keyToNumValues",
    ]


JOIN_STORES = (
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
)


def test_a_joins_store_schemas_are_in_the_image(tmp_path: Path) -> None:
    """A stream-stream join (state format 1 or 2) keeps each store's schema in
    `state/<op>/0/<store>/_metadata/schema`, which Spark checks a restored query against:
    an image without them let a changed column type read the old state as garbage (a
    reviewer's, with Spark 4.3: an int read as 4.2e-45)."""
    _logs(tmp_path, batches=3)
    for partition in ("0", "1"):
        for store in JOIN_STORES:
            _touch(tmp_path, *(f"state/0/{partition}/{store}/{v}.delta" for v in (1, 2, 3)))
    schemas = [f"state/0/0/{store}/_metadata/schema" for store in JOIN_STORES]
    _touch(tmp_path, *schemas, "state/0/_metadata/metadata")

    plan = plan_snapshot(tmp_path, batch_id=2)

    logs = plan.files_by_task[LOGS_TASK]
    assert {*schemas, "state/0/_metadata/metadata"} <= set(logs), logs
    for task, files in plan.files_by_task.items():
        assert task == LOGS_TASK or not any("/_metadata/" in name for name in files), task


def test_named_sources_logs_are_in_the_image(tmp_path: Path) -> None:
    """With source evolution (`readStream.name("orders")`) a source's log lies in
    `sources/orders/`: an image without it could not be restarted (Spark 4.3: "batch 3
    doesn't exist", a reviewer's)."""
    _logs(tmp_path, batches=4)
    _touch(tmp_path, *(f"sources/orders/{b}" for b in range(4)), "sources/.orders.tmp/0")

    logs = plan_snapshot(tmp_path, batch_id=3).files_by_task[LOGS_TASK]

    assert [f for f in logs if f.startswith("sources/")] == [
        *(f"sources/0/{b}" for b in range(4)),
        *(f"sources/orders/{b}" for b in range(4)),
    ]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_file_sources_log_is_cut_at_its_offset_of_the_batch(tmp_path: Path, version: str) -> None:
    """Offsets as Spark 4.3 writes them: a line per source in their order (v1), or
    `name:offset` for named sources (v2). The file source (0, or `orders`) read up to its
    log id 2 in batch 4; its entries 3 and 4 are batch 5's. A source with no file offset
    (`-`, or another kind's) is cut at the batch id."""
    _logs(tmp_path, batches=5)
    file_source, other = ("0", "1") if version == "v1" else ("orders", "rate")
    for name in (file_source, other):
        _touch(tmp_path, *(f"sources/{name}/{n}" for n in range(6)))
    offsets = ['{"logOffset":2}', "-"]
    if version == "v2":
        offsets = [f"{file_source}:{offsets[0]}", f"{other}:{{}}"]
    (tmp_path / "offsets" / "4").write_text("\n".join([version, "{}", *offsets]))

    logs = plan_snapshot(tmp_path, 4).files_by_task[LOGS_TASK]

    assert [f for f in logs if f.startswith(f"sources/{file_source}/")] == [
        f"sources/{file_source}/{n}" for n in range(3)
    ]
    assert [f for f in logs if f.startswith(f"sources/{other}/")] == [
        f"sources/{other}/{n}" for n in range(5)
    ]


def test_a_file_source_with_no_offset_yet_has_none_of_its_log_in_the_image(
    tmp_path: Path,
) -> None:
    """`-`: the source read no file up to B, so every entry of its log is a later batch's
    (a reviewer's, Spark 4.3: `c.union(e)` with e's first files after B; the image held
    them and the restored query read two in one batch)."""
    _logs(tmp_path, batches=2)
    _touch(tmp_path, "sources/1/.0.crc")
    (tmp_path / "sources" / "1" / "0").write_text('v1\n{"path":"file:/in/e0.json"}')
    (tmp_path / "offsets" / "1").write_text('v1\n{}\n{"logOffset":1}\n-')

    logs = plan_snapshot(tmp_path, 1).files_by_task[LOGS_TASK]

    assert [f for f in logs if f.startswith("sources/")] == ["sources/0/0", "sources/0/1"]


def test_offsets_of_a_source_read_twice_are_no_map_of_the_sources(tmp_path: Path) -> None:
    """Spark writes an offset line per source of the plan, a source read twice
    (`a.filter(x).union(a.filter(y)).union(b)`) twice, and numbers directories once per
    source: line 1 was taken for `sources/1` (b), which was cut at a's offset, and the
    image could not restart ("batch 2 doesn't exist", a reviewer's, Spark 4.3). With more
    lines than directories every log is cut at B."""
    _logs(tmp_path, batches=3)
    _touch(tmp_path, *(f"sources/1/{n}" for n in range(3)))
    (tmp_path / "offsets" / "2").write_text(
        'v1\n{}\n{"logOffset":0}\n{"logOffset":0}\n{"logOffset":2}'
    )

    logs = plan_snapshot(tmp_path, 2).files_by_task[LOGS_TASK]

    assert [f for f in logs if f.startswith("sources/1/")] == [
        "sources/1/0",
        "sources/1/1",
        "sources/1/2",
    ]


@pytest.mark.parametrize("purged", [2, 3])
def test_an_offsets_file_a_restart_reads_gone_fails_the_plan(tmp_path: Path, purged: int) -> None:
    """Under `spark.sql.streaming.minBatchesToRetain=1` Spark deletes offsets/B-1 once it
    plans B+1: an image without it completed, and its restore failed (Spark 4.3: "The
    offset log for batch 2 doesn't exist", a reviewer's). The checkpoint fails instead."""
    _logs(tmp_path, batches=4)
    (tmp_path / "offsets" / str(purged)).unlink()

    with pytest.raises(SnapshotError, match=rf"offsets/{purged} is gone .* needs it"):
        plan_snapshot(tmp_path, 3)


def test_the_first_batchs_image_needs_no_earlier_offsets(tmp_path: Path) -> None:
    _logs(tmp_path, batches=1)
    logs = plan_snapshot(tmp_path, 0).files_by_task[LOGS_TASK]
    assert [f for f in logs if f.startswith("offsets/")] == ["offsets/0"]


def test_pinned_files_survive_spark_deleting_its_own(tmp_path: Path) -> None:
    live, pins = tmp_path / "live", tmp_path / "pins"
    _touch(live, "state/0/0/1.delta")
    pin(live, ["state/0/0/1.delta"], pins)
    os.remove(live / "state/0/0/1.delta")
    assert (pins / "state/0/0/1.delta").read_text() == "state/0/0/1.delta"


def test_pinning_a_file_that_is_already_gone_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="disappeared before it could be pinned"):
        pin(tmp_path, ["state/0/0/9.delta"], tmp_path / "pins")


@pytest.mark.parametrize("hard_links", [True, False], ids=["linked", "copied"])
@pytest.mark.parametrize(
    ("link", "planned"),
    [
        ("state/0/_metadata/zz", "state/0/_metadata/zz"),  # a file link
        ("state/0/0", "state/0/0/1.delta"),  # a directory link on the way
    ],
)
def test_pinning_never_follows_a_symbolic_link_out_of_the_location(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    link: str,
    planned: str,
    hard_links: bool,
) -> None:
    # Whoever else writes the live location (executors, a shared claim) could otherwise
    # have the image hold, and a restore bring back, any file the driver can read.
    live, pins, secret = tmp_path / "live", tmp_path / "pins", tmp_path / "secret"
    secret.mkdir()
    # Named as Spark names its own files.
    (secret / "1.delta").write_text("token of the driver's service account")
    (live / link).parent.mkdir(parents=True)
    target = secret / "1.delta" if link.endswith("zz") else secret
    (live / link).symlink_to(target)
    if not hard_links:  # another filesystem: pins are copies

        def cross_device(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(snapshot_module.os, "link", cross_device)

    with pytest.raises(SymbolicLinkError) as refused:
        pin(live, [planned], pins)

    assert str(refused.value) == (
        f"{live / link}: is a symbolic link (to {str(target)!r}); links are never followed "
        "out of the query's checkpoint location: remove the link"
    )
    pinned = [path for path in pins.rglob("*") if path.is_file()] if pins.exists() else []
    assert all("service account" not in path.read_text() for path in pinned)


def test_checkpoint_format_version_2_is_refused_not_guessed(tmp_path: Path) -> None:
    _logs(tmp_path, batches=2)
    _touch(tmp_path, "state/0/0/1_0a1b2c3d-4e5f.delta", "state/0/0/2_0a1b2c3d-4e5f.delta")
    with pytest.raises(SnapshotError, match="checkpointFormatVersion=2 is not supported"):
        plan_snapshot(tmp_path, 1)
