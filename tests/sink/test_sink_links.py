"""No path below the sink's output directory is followed through a symbolic link: a link
placed there (by another writer of a shared volume, a consumer with write access, an
executor) would otherwise have `on_restore`'s garbage collection delete, or a batch's write
create, files outside the output. Local filesystem only: object stores have no links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_checkpoint.sink import (
    COMMITTED_DIR,
    DATA_DIR,
    EPOCHS_DIR,
    STAGING_DIR,
    TransactionalFileSink,
)
from spark_checkpoint.storage import SymbolicLinkError

from .conftest import stage_rows

JOB = "default/orders"


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the output whose files must survive everything the sink does."""
    directory = tmp_path / "precious"
    (directory / "sub").mkdir(parents=True)
    (directory / "precious.txt").write_text("precious\n")
    (directory / "sub" / "more.txt").write_text("more\n")
    return directory


@pytest.fixture
def output(tmp_path: Path) -> Path:
    """An output with batches 0 and 1 committed and batch 2 staged."""
    directory = tmp_path / "out"
    sink = TransactionalFileSink(directory)
    sink.on_restore(None, JOB)
    for batch_id in range(3):
        stage_rows(sink, batch_id, [{"word": "a", "count": batch_id + 1}])
    sink.on_checkpoint_complete(1)
    return directory


@pytest.mark.parametrize(
    "place",
    [
        f"{DATA_DIR}/batch-99",  # the security review's: the data of a batch without a record
        f"{DATA_DIR}/batch-2/evil",  # in the data of the staged batch the restore commits
        f"{STAGING_DIR}/batch-9.json",
        COMMITTED_DIR,
    ],
)
def test_a_restore_meeting_a_link_refuses_it_and_deletes_nothing_outside(
    output: Path, outside: Path, place: str
) -> None:
    link = output / place
    if link.exists():  # the commit records: moved out, and the link leads to them
        link.rename(outside / COMMITTED_DIR)
        link.symlink_to(outside / COMMITTED_DIR)
    else:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(outside)
    before_outside, before_output = _tree(outside), _tree(output)

    with pytest.raises(SymbolicLinkError) as refused:
        TransactionalFileSink(output).on_restore(2, JOB)

    assert str(refused.value) == (
        f"{link}: is a symbolic link (to {os.readlink(link)!r}); links are never followed out "
        "of the sink's output directory: remove the link"
    )
    assert _tree(outside) == before_outside
    # The restore may have committed staged batch 2 (its staged record is then gone) and
    # claimed the next writer epoch (the last one's record is then gone); every data object
    # and commit record is still there.
    kept = {
        path: data
        for path, data in before_output.items()
        if STAGING_DIR not in path and EPOCHS_DIR not in path
    }
    after_output = _tree(output)
    assert {path: after_output.get(path) for path in kept} == kept


def test_a_batch_whose_data_directory_is_a_link_is_not_written_through_it(
    output: Path, outside: Path
) -> None:
    sink = TransactionalFileSink(output)
    sink.on_restore(2, JOB)
    (output / DATA_DIR / "batch-3").symlink_to(outside)
    before = _tree(outside)

    with pytest.raises(SymbolicLinkError):
        stage_rows(sink, 3, [{"word": "b", "count": 1}])

    assert _tree(outside) == before
    assert sink.staged_batches() == [], "nothing of batch 3 was staged"


def test_an_output_directory_that_is_itself_a_link_is_the_output(
    tmp_path: Path, output: Path
) -> None:
    # Where the output lives is the user's choice: only links below it are refused.
    alias = tmp_path / "alias"
    alias.symlink_to(output)
    sink = TransactionalFileSink(alias)

    sink.on_restore(2, JOB)

    assert sink.committed_batches() == [0, 1, 2]
