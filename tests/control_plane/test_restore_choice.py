"""`run --from PATH` (and a local initialSavepointPath): a path that names no checkpoint
or savepoint is refused in one line, before anything reads it; one that names a retained
checkpoint or a savepoint is the job's own registered image or an external one."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    StorageAccessError,
)
from spark_checkpoint_operator.coordinator import (
    CheckpointOutcome,
    CompletedCheckpoint,
    OutcomeStatus,
    PersistedState,
)
from spark_checkpoint_operator.restore_choice import UnknownImage, chosen_image, why_gone


@pytest.mark.parametrize(
    ("choice", "said"),
    [
        (
            "/backup/Bad_NS/orders/savepoints/sp-1",
            "/backup/Bad_NS/orders/savepoints/sp-1 is not savepoint:N, checkpoint:N or the "
            "path of a checkpoint or a savepoint: namespace must be a DNS-1123 label",
        ),
        (
            "gs://bucket/default/orders/savepoints/sp-1",
            "gs://bucket/default/orders/savepoints/sp-1 cannot be read here: ",
        ),
        (
            "/backup/default/orders/checkpoints/chk-x",
            "/backup/default/orders/checkpoints/chk-x is not savepoint:N, checkpoint:N or the "
            "path of a checkpoint or a savepoint: not where a checkpoint or a savepoint lies",
        ),
        (
            "/backup/default/orders/chk-1",
            "the checkpoint cannot be restored: file:///backup/default/orders/chk-1/_metadata: "
            "no such file",
        ),
    ],
)
@pytest.mark.usefixtures("without_gcsfs")
def test_a_path_that_names_no_readable_image_is_one_line(
    tmp_path: Path, choice: str, said: str
) -> None:
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))

    with pytest.raises(UnknownImage) as refused:
        chosen_image(choice, PersistedState(), storage)

    assert str(refused.value).startswith(said), refused.value
    assert "\n" not in str(refused.value)


def test_a_savepoint_path_that_is_a_file_is_said_without_an_errno(tmp_path: Path) -> None:
    """It said "[Errno 20] Not a directory: '.../sp-5'", where every other unreadable
    image names its path first (a newcomer's)."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path / "own"), "default", "orders"))
    file = tmp_path / "backup" / "default" / "orders" / "savepoints" / "sp-5"
    file.parent.mkdir(parents=True)
    file.write_text("not a savepoint")

    with pytest.raises(UnknownImage) as refused:
        chosen_image(str(file), PersistedState(), storage)

    assert str(refused.value) == f"the savepoint cannot be restored: {file}: Not a directory"


def test_an_unregistered_id_in_storage_this_process_cannot_read_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--from savepoint:N` of an id the registry does not list looks for it in storage
    (to name its path), which an object store's credentials may not allow here."""
    storage = CheckpointStorage(JobStorageLayout("s3://bucket", "default", "orders"))

    def no_credentials(path: str) -> bool:
        raise StorageAccessError(path, "NoCredentialsError: Unable to locate credentials")

    monkeypatch.setattr(storage.fs, "exists", no_credentials)

    with pytest.raises(UnknownImage) as refused:
        chosen_image("savepoint:7", PersistedState(), storage)

    assert str(refused.value) == (
        "savepoint:7 is not a registered savepoint of the job (savepoints: none)"
    )


def test_an_unregistered_checkpoint_in_storage_gets_no_path_to_restore_it(tmp_path: Path) -> None:
    """Its path would be refused too: a checkpoint in the job's own storage that its
    registry does not list is garbage to it (a reviewer's)."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))
    (tmp_path / "default" / "orders" / "chk-7").mkdir(parents=True)
    (tmp_path / "default" / "orders" / "chk-7" / "_metadata").write_text("{}")

    with pytest.raises(UnknownImage) as refused:
        chosen_image("checkpoint:7", PersistedState(), storage)

    assert str(refused.value) == (
        "checkpoint:7 is not a registered checkpoint of the job (checkpoints: none)"
    )


@pytest.mark.parametrize(
    ("choice", "said"),
    [
        (
            "checkpoint:502",
            "checkpoint:502 is not a registered checkpoint of the job (checkpoints: 501); "
            "502 is a savepoint: savepoint:502",
        ),
        (
            "savepoint:501",
            "savepoint:501 is not a registered savepoint of the job (savepoints: 502); "
            "501 is a checkpoint: checkpoint:501",
        ),
    ],
)
def test_the_id_of_the_other_kinds_image_is_named_as_that_kind(
    tmp_path: Path, choice: str, said: str
) -> None:
    """One counter numbers checkpoints and savepoints: `--from checkpoint:502` of savepoint
    502 said only that it was no registered checkpoint (a newcomer's)."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))
    registry = PersistedState(
        next_checkpoint_id=503,
        checkpoints=(_registered(CheckpointKind.CHECKPOINT, 501),),
        savepoints=(_registered(CheckpointKind.SAVEPOINT, 502),),
    )

    with pytest.raises(UnknownImage) as refused:
        chosen_image(choice, registry, storage)

    assert str(refused.value) == said


def _registered(kind: CheckpointKind, image_id: int) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=image_id,
        kind=kind,
        batch_id=image_id,
        path=f"file:///s/{image_id}",
        size_bytes=1,
        trigger_time=0.0,
        completion_time=0.0,
    )


def _kept_savepoint_metadata(root: Path, text: str) -> Path:
    """Savepoint 7 of job default/orders below ``root`` that its registry does not list
    (another registry's, kept), its `_metadata` holding ``text``."""
    metadata = root / "default" / "orders" / "savepoints" / "sp-7" / "_metadata"
    metadata.parent.mkdir(parents=True)
    metadata.write_text(text)
    return metadata


def test_an_unregistered_savepoint_in_storage_that_cannot_be_restored_says_why(
    tmp_path: Path,
) -> None:
    """`--from savepoint:N` named the path of the one in storage, whose `_metadata` was not
    parseable: the path, tried next, was refused for it (a newcomer's)."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))
    metadata = _kept_savepoint_metadata(tmp_path, "garbage")

    with pytest.raises(UnknownImage) as refused:
        chosen_image("savepoint:7", PersistedState(), storage)

    assert str(refused.value).startswith(
        "savepoint:7 is not a registered savepoint of the job (savepoints: none); the one in "
        "the job's storage is not this registry's and cannot be restored: "
    ), refused.value
    assert f"{metadata}: not parseable as JSON" in str(refused.value)
    assert "--from" not in str(refused.value)


def test_an_unregistered_savepoint_this_process_cannot_read_gets_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused credentials (this process's are not the driver's) say nothing of whether
    the savepoint can be restored."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))
    metadata = _kept_savepoint_metadata(tmp_path, "{}")

    def refused(*args: object) -> None:
        raise StorageAccessError(str(metadata), "ClientError: Forbidden")

    monkeypatch.setattr(storage, "read_metadata", refused)

    with pytest.raises(UnknownImage) as refused_choice:
        chosen_image("savepoint:7", PersistedState(), storage)

    assert str(refused_choice.value) == (
        "savepoint:7 is not a registered savepoint of the job (savepoints: none)"
    )


def _savepoint(storage: CheckpointStorage, savepoint_id: int) -> None:
    storage.write_metadata(
        CheckpointMetadata(
            namespace="default",
            job="orders",
            checkpoint_id=savepoint_id,
            kind=CheckpointKind.SAVEPOINT,
            batch_id=3,
            query_id="5f0c7a52-1d5e-4a36-9d7e-0d6b1e1b7c11",
            trigger_time=datetime(2026, 12, 4, 10, 0, 0, tzinfo=UTC),
            completion_time=datetime(2026, 12, 4, 10, 0, 1, tzinfo=UTC),
            acknowledgements=(),
            files=(),
            total_bytes=0,
            properties={},
        )
    )


def test_an_unregistered_savepoint_in_storage_is_named_by_the_path_that_restores_it(
    tmp_path: Path,
) -> None:
    """Another registry's savepoint, kept when the storage was handed over (a newcomer's)."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))
    _savepoint(storage, 7)

    with pytest.raises(UnknownImage) as refused:
        chosen_image("savepoint:7", PersistedState(), storage)

    metadata = tmp_path / "default" / "orders" / "savepoints" / "sp-7" / "_metadata"
    assert str(refused.value) == (
        "savepoint:7 is not a registered savepoint of the job (savepoints: none); the one in "
        f"the job's storage is not this registry's: to restore it, name its path: --from {metadata}"
    )


@pytest.mark.parametrize(
    "spelling",
    [
        "file:{root}/default/orders/savepoints/sp-7",  # Hadoop's, as Spark prints paths
        "file://localhost{root}/default/orders/savepoints/sp-7",
        "FILE://{root}/default/orders/savepoints/sp-7",
        "file://{root}/default/orders/savepoints/../savepoints/sp-7/",
        "{root}/default/orders/savepoints/./sp-7/_metadata",
    ],
)
def test_a_local_savepoint_is_the_same_image_however_its_path_is_spelled(
    tmp_path: Path, spelling: str
) -> None:
    """`file:/path` was taken for a relative path, and a `file://` URI with `..` was refused
    blaming the job's name (a newcomer's)."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))
    _savepoint(storage, 7)
    plain = chosen_image(f"{tmp_path}/default/orders/savepoints/sp-7", PersistedState(), storage)

    assert chosen_image(spelling.format(root=tmp_path), PersistedState(), storage) == plain


def test_a_uri_with_dot_segments_is_refused_saying_so(tmp_path: Path) -> None:
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path), "default", "orders"))
    choice = "s3://bucket/default/orders/savepoints/../savepoints/sp-7"

    with pytest.raises(UnknownImage) as refused:
        chosen_image(choice, PersistedState(), storage)

    assert str(refused.value) == (
        f"{choice} is not savepoint:N, checkpoint:N or the path of a checkpoint or a "
        "savepoint: a '.' or '..' in a URI names no checkpoint or savepoint"
    )


def test_a_savepoint_that_is_a_link_is_refused_naming_the_link(tmp_path: Path) -> None:
    """Its path has the layout the refusal asked for: the link was followed before the
    path was read, and the message said the path was not where a savepoint lies (a
    newcomer's). Links are never followed out of the job's storage."""
    storage = CheckpointStorage(JobStorageLayout(str(tmp_path / "root"), "default", "orders"))
    elsewhere = CheckpointStorage(JobStorageLayout(str(tmp_path / "other"), "default", "orders"))
    _savepoint(elsewhere, 9)
    _savepoint(storage, 1)
    link = tmp_path / "root" / "default" / "orders" / "savepoints" / "sp-9"
    link.symlink_to(tmp_path / "other" / "default" / "orders" / "savepoints" / "sp-9")

    with pytest.raises(UnknownImage) as refused:
        chosen_image(str(link), PersistedState(), storage)

    assert "symbolic link" in str(refused.value), refused.value
    assert str(link) in str(refused.value)


@pytest.mark.parametrize(
    ("registry", "said"),
    [
        (PersistedState(next_checkpoint_id=101), "was never taken (the job has taken none yet)"),
        (
            PersistedState(
                next_checkpoint_id=101,
                history=(
                    CheckpointOutcome(3, CheckpointKind.SAVEPOINT, OutcomeStatus.FAILED, 1.0, 2.0),
                    CheckpointOutcome(
                        2, CheckpointKind.CHECKPOINT, OutcomeStatus.COMPLETED, 1.0, 2.0
                    ),
                ),
            ),
            "was never taken (the job's newest id is 3)",
        ),
    ],
    ids=["none", "some"],
)
def test_an_id_never_taken_is_said_with_the_newest_the_job_took(
    registry: PersistedState, said: str
) -> None:
    """Not the id counter, which reserves a block of ids ahead: `the job's ids are below
    101` after one checkpoint read as if ids up to 100 might be there."""
    assert why_gone(registry, CheckpointKind.SAVEPOINT, 101) == said
    assert why_gone(registry, CheckpointKind.SAVEPOINT, 50) is None  # in the reserved block
