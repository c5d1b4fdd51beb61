"""`local_owner`: which registry of a job a state directory is, for the job's storage to
record (`CheckpointStorage.claim`). A moved state directory stays the registry it was; a
copied one is another."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout, StorageOwnedElsewhere
from spark_checkpoint_operator.local_state import (
    CopiedStateDirectory,
    LocalPaths,
    RegistryRecord,
    local_job_paths,
    local_owner,
)


def _checkpoint_in(storage: CheckpointStorage) -> None:
    """A checkpoint directory of the registry that owns the storage."""
    Path(storage.fs.local_path(storage.layout.checkpoint_dir(1)) or "").mkdir(parents=True)


def _paths(state_dir: Path) -> LocalPaths:
    paths = local_job_paths(state_dir, "default", "orders")
    paths.job_dir.mkdir(parents=True, exist_ok=True)
    return paths


def test_a_state_directory_keeps_its_registry_from_run_to_run(tmp_path: Path) -> None:
    paths = _paths(tmp_path / "state")
    first = local_owner(paths, own_storage=False)
    assert local_owner(paths, own_storage=False) == first
    assert first.description == f"the state directory {paths.job_dir} (registry {first.id[:8]})"
    assert json.loads(paths.registry_id_file.read_text()) == {
        "id": first.id,
        "stateDirectory": str(paths.job_dir),
    }


def test_a_moved_state_directory_is_the_same_registry_and_says_where_it_is_now(
    tmp_path: Path,
) -> None:
    storage = CheckpointStorage(
        JobStorageLayout((tmp_path / "storage").as_uri(), "default", "orders")
    )
    before = local_owner(_paths(tmp_path / "old"), own_storage=False)
    storage.claim(before)
    shutil.move(tmp_path / "old", tmp_path / "new")
    after = local_owner(_paths(tmp_path / "new"), own_storage=False)
    assert after.id == before.id
    assert after.description.startswith(f"the state directory {tmp_path / 'new/default/orders'} ")
    storage.claim(after)  # its storage's record now names where it is
    _checkpoint_in(storage)
    with pytest.raises(StorageOwnedElsewhere, match=re.escape(f"belongs to {after.description},")):
        storage.claim(local_owner(_paths(tmp_path / "third"), own_storage=False))


def test_a_copied_state_directory_is_refused_while_its_original_keeps_the_registry(
    tmp_path: Path,
) -> None:
    """`cp -r project project2` copies the state directory, registry and all: two
    registries listing the same snapshots. The copy is refused until it is deleted."""
    original = local_owner(_paths(tmp_path / "project/state"), own_storage=False)
    shutil.copytree(tmp_path / "project", tmp_path / "project2")
    copied = _paths(tmp_path / "project2/state")
    with pytest.raises(CopiedStateDirectory) as refused:
        local_owner(copied, own_storage=False)
    assert str(refused.value) == (
        f"{copied.job_dir} is a copy of the state directory "
        f"{tmp_path / 'project/state/default/orders'}, whose registry of the job's snapshots "
        f"it lists: run the job from there, or delete {copied.job_dir} to run this copy as a "
        "new job (on storage of its own: spec.checkpointing.storage)"
    )
    assert local_owner(_paths(tmp_path / "project/state"), own_storage=False) == original, (
        "the original keeps its"
    )
    shutil.rmtree(copied.job_dir)  # as the message says
    assert local_owner(_paths(tmp_path / "project2/state"), own_storage=False).id != original.id


def test_a_copy_with_the_storage_it_was_copied_with_is_a_job_of_its_own(tmp_path: Path) -> None:
    """The default storage is inside the state directory: `cp -r` copied it too."""
    original = local_owner(_paths(tmp_path / "project/state"), own_storage=True)
    shutil.copytree(tmp_path / "project", tmp_path / "project2")
    copy = local_owner(_paths(tmp_path / "project2/state"), own_storage=True)
    assert copy.id == original.id
    assert copy.description.startswith(f"the state directory {tmp_path / 'project2/state'}")


def test_one_directory_reached_by_another_path_is_no_copy(tmp_path: Path) -> None:
    """A bind mount or a case-insensitive filesystem: os.path.samefile, not the string."""
    original = local_owner(_paths(tmp_path / "state"), own_storage=False)
    (tmp_path / "alias").symlink_to(tmp_path / "state")
    alias = LocalPaths(tmp_path / "alias/default/orders")  # not resolved, as a mount is not
    assert local_owner(alias, own_storage=False).id == original.id


def test_the_description_names_the_registry_and_shows_no_control_character(
    tmp_path: Path,
) -> None:
    paths = _paths(tmp_path / "state")
    owner = local_owner(paths, own_storage=False)
    assert owner.description == f"the state directory {paths.job_dir} (registry {owner.id[:8]})"
    storage = CheckpointStorage(
        JobStorageLayout((tmp_path / "storage").as_uri(), "default", "orders")
    )
    hostile = StorageOwner(id="x", description="\x1b[31mred\n" + "y" * 5000)
    storage.claim(hostile)
    _checkpoint_in(storage)
    with pytest.raises(StorageOwnedElsewhere) as refused:
        storage.claim(owner)
    message = str(refused.value)
    assert "\x1b" not in message and "\n" not in message
    assert "belongs to \\x1b[31mred\\nyyy" in message
    assert "y" * 300 not in message and "y..., not to" in message


@pytest.mark.parametrize(
    "content", ["", "abc", '{"id": ""}', '{"id": "x"}', "[]", "[" * 100_000, "9" * 5000]
)
def test_a_registry_file_without_a_record_is_an_error_and_is_left_as_it_is(
    tmp_path: Path, content: str
) -> None:
    paths = _paths(tmp_path / "state")
    paths.registry_id_file.write_text(content)
    with pytest.raises(ValueError):
        local_owner(paths, own_storage=False)
    assert paths.registry_id_file.read_text() == content


def test_no_hard_link_is_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some mounts (vboxsf, SMB) refuse links; the record is renamed into place."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("os.link", refused)
    paths = _paths(tmp_path / "state")
    assert local_owner(paths, own_storage=False) == local_owner(paths, own_storage=False)
    assert sorted(p.name for p in paths.job_dir.iterdir()) == ["registry-id"]


def test_a_symbolic_link_in_place_of_the_records_temporary_is_replaced(tmp_path: Path) -> None:
    record = tmp_path / "registry-id"
    victim = tmp_path / "victim.rc"
    victim.write_text("the user's file\n")
    (tmp_path / f".registry-id.{os.getpid()}").symlink_to(victim)

    RegistryRecord("registry-1", str(tmp_path)).write(record)

    assert victim.read_text() == "the user's file\n"
    assert RegistryRecord.read(record) == RegistryRecord("registry-1", str(tmp_path))
