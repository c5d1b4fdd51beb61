"""Notices' wording that is built from data: what garbage collection removed."""

import pytest

from spark_checkpoint.protocol import CollectGarbageAnswer
from spark_checkpoint_operator.supervisor.notices import describe_garbage


@pytest.mark.parametrize(
    ("checkpoints", "savepoints", "shared_files", "said"),
    [
        ((), (), 0, ""),
        # A newcomer's: "removed unregistered checkpoints [] and 16 unreferenced shared files".
        ((), (), 16, "16 unreferenced shared file(s)"),
        ((3, 4), (), 0, "unregistered checkpoints 3, 4"),
        ((7,), (), 2, "unregistered checkpoint 7 and 2 unreferenced shared file(s)"),
        # Savepoint directories it removed were not said at all.
        (
            (7,),
            (9,),
            1,
            "unregistered checkpoint 7, unregistered savepoint 9 and 1 unreferenced shared file(s)",
        ),
    ],
)
def test_what_garbage_collection_removed_is_said_in_words(
    checkpoints: tuple[int, ...], savepoints: tuple[int, ...], shared_files: int, said: str
) -> None:
    report = CollectGarbageAnswer(checkpoints, savepoints, shared_files)
    assert describe_garbage(report) == said
