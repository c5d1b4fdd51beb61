"""Restore's own decisions, without Spark: which images it skips and why, and which query
failures the driver blames on the restored checkpoint."""

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark_checkpoint.protocol import RestoreCandidate
from spark_checkpoint.restore import (
    RestoreFailed,
    checkpoint_failure,
    relocate_state_schema_paths,
    restore,
)
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
    TaskAcknowledgement,
)

WHEN = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _savepoint(
    tmp_path: Path,
    files: dict[str, str],
    savepoint_id: int = 4,
    kind: CheckpointKind = CheckpointKind.SAVEPOINT,
    job: tuple[str, str] = ("default", "source"),
) -> str:
    """A savepoint (or retained checkpoint) of ``job`` (default/source) holding ``files``
    under tmp_path/other; returns its _metadata URI."""
    storage = CheckpointStorage(JobStorageLayout((tmp_path / "other").as_uri(), *job))
    entries = []
    for path, content in files.items():
        local = tmp_path / "live" / path
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(content)
        entries.append(
            storage.add_savepoint_file(savepoint_id, str(local), path)
            if kind is CheckpointKind.SAVEPOINT
            else storage.add_shared_file(str(local), path)
        )
    storage.write_metadata(
        CheckpointMetadata(
            namespace=job[0],
            job=job[1],
            checkpoint_id=savepoint_id,
            kind=kind,
            batch_id=2,
            query_id="q",
            trigger_time=WHEN,
            completion_time=WHEN,
            acknowledgements=(
                TaskAcknowledgement("logs", tuple(files), sum(e.size for e in entries), 1),
            ),
            files=tuple(entries),
            total_bytes=sum(e.size for e in entries),
            properties={},
        )
    )
    return f"{storage.layout.metadata_path(kind, savepoint_id)}"


def _job(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage(JobStorageLayout((tmp_path / "mine").as_uri(), "default", "fork"))


def test_an_external_savepoint_without_sparks_metadata_file_is_skipped_with_a_reason(
    tmp_path: Path,
) -> None:
    without = _savepoint(tmp_path, {"offsets/2": "v1", "commits/2": "v1"})
    target = tmp_path / "restored"

    with pytest.raises(RestoreFailed, match="has no Spark metadata file"):
        restore(_job(tmp_path), (RestoreCandidate.external(without),), target)
    assert not target.exists(), "nothing of the skipped image is left behind"


def test_a_fork_past_an_image_without_metadata_restores_the_next_one(tmp_path: Path) -> None:
    without = _savepoint(tmp_path / "a", {"offsets/2": "v1"}, savepoint_id=5)
    usable = _savepoint(tmp_path / "b", {"metadata": '{"id":"q"}', "offsets/2": "v1"})
    target = tmp_path / "restored"

    outcome = restore(
        _job(tmp_path),
        (
            RestoreCandidate.external(without),
            RestoreCandidate.external(usable),
        ),
        target,
    )

    assert outcome is not None and outcome.candidate.metadata_uri == usable
    assert tuple((str(s.candidate), s.reason) for s in outcome.skipped) == (
        (f"external:{without}", f"external:{without}: the image has no Spark metadata file"),
    )
    assert (target / "offsets/2").read_text() == "v1"


def test_another_jobs_retained_checkpoint_restores_as_a_new_query(tmp_path: Path) -> None:
    """Flink's ``run -s <checkpoint path>``: its files are read from the other job's
    shared/ directory, and the fork gets a query id of its own."""
    retained = _savepoint(
        tmp_path,
        {"metadata": '{"id":"q"}', "offsets/2": "v2", "state/0/0/2.delta": "s"},
        savepoint_id=7,
        kind=CheckpointKind.CHECKPOINT,
    )
    assert retained.endswith("/default/source/chk-7/_metadata")
    target = tmp_path / "restored"

    outcome = restore(_job(tmp_path), (RestoreCandidate.external(retained),), target)

    assert outcome is not None and outcome.batch_id == 2
    assert (target / "state/0/0/2.delta").read_text() == "s"
    assert json.loads((target / "metadata").read_text())["id"] != "q"


@pytest.mark.parametrize(
    ("job", "new_query"),
    [
        (("team-b", "fork"), True),  # the same name in another namespace is another job
        (("default", "fork"), False),  # the job's own image in another root (a copy)
    ],
)
def test_only_another_jobs_image_restores_as_a_new_query(
    tmp_path: Path, job: tuple[str, str], new_query: bool
) -> None:
    image = _savepoint(
        tmp_path,
        {"metadata": '{"id":"q"}'},
        savepoint_id=7,
        kind=CheckpointKind.CHECKPOINT,
        job=job,
    )
    target = tmp_path / "restored"

    assert restore(_job(tmp_path), (RestoreCandidate.external(image),), target) is not None

    assert (json.loads((target / "metadata").read_text())["id"] != "q") is new_query


def test_an_unregistered_checkpoint_of_the_jobs_own_storage_is_not_restored(
    tmp_path: Path,
) -> None:
    """The runtime names the registry's checkpoints checkpoint:N; one named by its path in
    the job's own storage is garbage, which the job's collection deletes meanwhile."""
    own = Path(
        _savepoint(
            tmp_path / "x",
            {"metadata": '{"id":"q"}'},
            savepoint_id=7,
            kind=CheckpointKind.CHECKPOINT,
            job=("default", "fork"),
        ).removeprefix("file://")
    )
    mine = _job(tmp_path)
    copied = Path(mine.layout.job_root.removeprefix("file://"))
    shutil.copytree(own.parents[1], copied)
    spelled_otherwise = f"{tmp_path}/./mine/default/fork/chk-7/_metadata"

    with pytest.raises(RestoreFailed, match="its registry does not list") as failed:
        restore(
            mine,
            (
                RestoreCandidate.external(f"{mine.layout.job_root}/chk-7/_metadata"),
                RestoreCandidate.external(spelled_otherwise),
            ),
            tmp_path / "restored",
        )
    assert str(failed.value).count("its registry does not list") == 2


def test_a_metadata_file_not_where_its_snapshot_was_written_is_skipped(tmp_path: Path) -> None:
    """A checkpoint's _metadata copied into a savepoint's place (or anywhere else) names
    files it cannot reach from there."""
    retained = Path(
        _savepoint(
            tmp_path,
            {"metadata": '{"id":"q"}'},
            savepoint_id=7,
            kind=CheckpointKind.CHECKPOINT,
        ).removeprefix("file://")
    )
    moved = retained.parents[1] / "savepoints" / "sp-7" / "_metadata"
    moved.parent.mkdir(parents=True)
    moved.write_bytes(retained.read_bytes())
    elsewhere = tmp_path / "copy" / "_metadata"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(retained.read_bytes())

    with pytest.raises(RestoreFailed) as failed:
        restore(
            _job(tmp_path),
            (
                RestoreCandidate.external(moved.as_uri()),
                RestoreCandidate.external(elsewhere.as_uri()),
            ),
            tmp_path / "restored",
        )

    assert "kind: is 'checkpoint' but the file's directory is for 'savepoint'" in str(failed.value)
    assert f"{elsewhere.as_uri()}: not where a checkpoint or a savepoint lies" in str(failed.value)


def test_a_restore_points_transform_with_states_metadata_at_its_own_schema_files(
    tmp_path: Path,
) -> None:
    """Spark 4.3's operator metadata v2 names schema files by absolute path, in the live
    location the image was taken of (one whose path holds `state/` too, as a local run's
    state directory does); each is pointed at the restored location's own."""
    live = "file:/data/state/default/orders/work/attempt-1/checkpoint"
    schema = "state/0/_stateSchema/default/0_1c3c7f9e-882e-47cd-8ba0-5793c5add5d7"
    operator = {
        "operatorInfo": {"operatorId": 0, "operatorName": "transformWithStateInPandasExec"},
        "stateStoreInfo": [
            {
                "storeName": "default",
                "numColsPrefixKey": 0,
                "numPartitions": 2,
                "stateSchemaFilePaths": [f"{live}/{schema}", "s3a://elsewhere/schema"],
            }
        ],
        "operatorPropertiesJson": '{"timeMode":"None"}',
    }
    image = _savepoint(
        tmp_path,
        {
            "metadata": '{"id":"q"}',
            "state/0/_metadata/v2/2": "v2\n" + json.dumps(operator),
            "state/0/_metadata/v2/.2.crc": "crc of the bytes before",
            schema: "schema",
        },
    )
    target = tmp_path / "restored"

    restore(_job(tmp_path), (RestoreCandidate.external(image),), target)

    assert not (target / "state/0/_metadata/v2/.2.crc").exists()  # Spark would refuse it
    version, _, document = (target / "state/0/_metadata/v2/2").read_text().partition("\n")
    assert version == "v2"
    relocated = json.loads(document)
    assert relocated["stateStoreInfo"][0]["stateSchemaFilePaths"] == [
        f"file:{target.resolve()}/{schema}",
        "s3a://elsewhere/schema",  # no schema file of a checkpoint location: left as it is
    ]
    assert {k: v for k, v in relocated.items() if k != "stateStoreInfo"} == {
        k: v for k, v in operator.items() if k != "stateStoreInfo"
    }


def test_operator_metadata_that_is_not_text_is_a_storage_error(tmp_path: Path) -> None:
    """A UnicodeDecodeError (a ValueError) crashed verify --deep, which catches storage
    and OS errors (a reviewer's)."""
    v2 = tmp_path / "state" / "0" / "_metadata" / "v2" / "2"
    v2.parent.mkdir(parents=True)
    v2.write_bytes(b"v2\n\xff\xfe")

    with pytest.raises(StorageError, match="not operator metadata"):
        relocate_state_schema_paths(tmp_path)


LOCATION = Path("/work/attempt-3/checkpoint")


@pytest.mark.parametrize(
    "error",
    [
        # Spark 4.3's text for a state version missing from the image (seen in a driver log).
        "org.apache.spark.SparkException: "
        "[CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS] An error occurred during "
        "loading state. Error reading delta file "
        f"file:{LOCATION}/state/0/0/8.delta of HDFSStateStoreProvider[...] does not exist.",
        # Issue 11: the source log's compaction file the derived interval needs.
        "Traceback (most recent call last):\n  ...\njava.io.FileNotFoundException: "
        f"file:{LOCATION}/sources/0/49.compact doesn't exist (latestId: 51, compactInterval: 10)",
        "[STREAMING_CHECKPOINT_MISSING_METADATA_FILE] Checkpoint location "
        f"{LOCATION} is in an inconsistent state: the metadata file is missing.",
        f"java.lang.IllegalStateException: Log file was malformed: failed to read correct log "
        f"version from file:{LOCATION}/offsets/7.",
        # Spark 4.3's text (seen in a driver log) for offsets/B-1 missing from the image, or
        # a named source's log: an IllegalStateException naming no file.
        "[STREAM_FAILED] Query [id = 7f012ae4-b163-4f2a-93cc-fefedd8a0f8c, runId = "
        "afb0bc7e-b5f5-4eb1-b3f8-4b93049a0f45] terminated with exception: batch 2 doesn't "
        "exist SQLSTATE: XXKST",
    ],
    ids=["state-delta", "source-compaction", "metadata-file", "malformed-log", "log-entry"],
)
def test_failures_that_point_at_the_restored_checkpoint(error: str) -> None:
    reason = checkpoint_failure(error, LOCATION)
    assert reason is not None and not reason.startswith("Traceback")


def test_the_reason_starts_at_sparks_error_class() -> None:
    """What a restored query's failure says of the image, without what every failure
    says first: the query's ids and the stage that failed (a failed run's line naming two
    images repeated both in full)."""
    error = (
        "[STREAM_FAILED] Query [id = 5c0d6f5e-1bd4-4f0c-9a51-0f2f5d3c8e11, runId = "
        "953c489a-7add-47d8-9b6e-8718fa482aef] terminated with exception: Job aborted due to "
        "stage failure: Task 0 in stage 1.0 failed 1 times, most recent failure: Lost task "
        "0.0 in stage 1.0 (TID 1) (10.0.0.5 executor driver): "
        "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state."
    )
    assert checkpoint_failure(error, LOCATION) == (
        "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state."
    )


@pytest.mark.parametrize(
    "error",
    [
        "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column `wrod` cannot be resolved.",
        # A missing input file is the pipeline's problem, not the checkpoint's.
        "java.io.FileNotFoundException: File file:/data/input/part-00007.json does not exist",
        # The checkpoint path in a failure that is not a failure to read it.
        f"Query [checkpointLocation={LOCATION}] terminated: ZeroDivisionError: division by zero",
    ],
    ids=["analysis", "input-file", "user-code"],
)
def test_other_failures_do_not(error: str) -> None:
    assert checkpoint_failure(error, LOCATION) is None
