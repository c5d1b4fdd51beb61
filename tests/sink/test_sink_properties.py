"""Property test of the sink's protocol: whatever interleaving of staged batches,
registered checkpoints, notifications, kills at any storage write, restores, fallbacks to
older checkpoints and drivers that run on once superseded, readers see each batch exactly
once and never ahead of a registered checkpoint, and no object a commit record lists is
ever lost; after the last restore no object is left that no record lists (before it, only
objects of batches still staged). Runs on the local filesystem, S3 and Azure."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from helpers.objectstore import StorageRoot
from spark_checkpoint.sink import (
    COMMITTED_DIR,
    DATA_DIR,
    EPOCHS_DIR,
    BatchRecord,
    Superseded,
    TransactionalFileSink,
    read_committed,
)
from spark_checkpoint.sink_storage import OutputStorage

JOB = "default/orders"  # the job the output belongs to (TransactionalFileSink.on_restore)

MUTATIONS = ("write", "create", "delete", "write_lines")
# Examples per kind of root: the object stores answer over HTTP, hundreds of requests each.
EXAMPLES = {"local": 200, "s3": 3, "gcs": 3, "azure": 3}


class SimulatedKill(Exception):
    """Raised by a storage write, create or delete in place of the driver dying there."""


def rows_of(batch_id: int) -> list[dict[str, Any]]:
    """Batch `batch_id`'s rows: the same whenever Spark re-runs it from its offsets."""
    return [{"word": f"w{batch_id}-{index}", "count": batch_id + 1} for index in range(3)]


def test_readers_see_each_batch_exactly_once_whatever_happens(
    output_root: StorageRoot,
    output_url: str,
    fake_batch: Any,  # conftest.FakeBatch
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Durability is not observable here, and skipping fsync keeps the test fast.
    monkeypatch.setattr(os, "fsync", lambda _descriptor: None)
    patches: list[Callable[[], None]] = []

    def kill_at(mutation: int) -> None:
        """The `mutation`-th storage write, create or delete from now kills the driver."""
        count = [0]
        for name in MUTATIONS:
            real = getattr(OutputStorage, name)

            def patched(storage: OutputStorage, *args: Any, _real: Any = real) -> Any:
                if count[0] == mutation:
                    raise SimulatedKill
                count[0] += 1
                return _real(storage, *args)

            setattr(OutputStorage, name, patched)
            patches.append(lambda _name=name, _real=real: setattr(OutputStorage, _name, _real))

    def disarm() -> None:
        while patches:
            patches.pop()()

    class DriverLifetimes(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.output = f"{output_url}/{uuid.uuid4().hex}"
            self.sink = TransactionalFileSink(self.output)
            self.sink.on_restore(None, JOB)
            self.next_batch = 0  # Spark's next batch: commits/<next_batch - 1> exists
            self.registry: list[int] = []  # batches of the registered checkpoints, in order
            self.highest_registered = -1
            # The driver before the last restart, and its next batch: one that ran on
            # (its pod force-deleted while its node was cut off).
            self.superseded: tuple[TransactionalFileSink, int] | None = None

        def restart(self) -> None:
            """A new driver restores the newest registered checkpoint (or starts fresh)."""
            restored = self.registry[-1] if self.registry else None
            self.superseded = (self.sink, self.next_batch)
            self.sink = TransactionalFileSink(self.output)
            self.sink.on_restore(restored, JOB)
            self.next_batch = 0 if restored is None else restored + 1
            self.check_no_garbage(restored)

        def run_killed(self, action: Callable[[], None], mutation: int) -> None:
            """Run `action` with a kill at its `mutation`-th storage change (or after it),
            then a restart."""
            kill_at(mutation)
            try:
                action()
            except SimulatedKill:
                pass
            finally:
                disarm()
            self.restart()

        def stage(self, partitions: int) -> None:
            batch = fake_batch(rows_of(self.next_batch), partitions=partitions)
            self.sink.write_batch(cast(Any, batch), self.next_batch)
            self.next_batch += 1

        @rule(partitions=st.integers(1, 4))
        def stage_next_batch(self, partitions: int) -> None:
            self.stage(partitions)

        @precondition(lambda self: self.next_batch > 0)
        @rule(notify=st.booleans())
        def checkpoint(self, notify: bool) -> None:
            """A checkpoint of Spark's last batch is registered, then the sink notified, or
            not yet (a later notification, or a kill, comes first)."""
            self.registry.append(self.next_batch - 1)
            self.highest_registered = max(self.highest_registered, self.registry[-1])
            if notify:
                self.sink.on_checkpoint_complete(self.registry[-1])

        @rule(partitions=st.integers(1, 4), mutation=st.integers(0, 12))
        def kill_while_staging(self, partitions: int, mutation: int) -> None:
            self.run_killed(lambda: self.stage(partitions), mutation)

        @precondition(lambda self: self.next_batch > 0)
        @rule(mutation=st.integers(0, 12), newest_unusable=st.booleans())
        def kill_while_committing(self, mutation: int, newest_unusable: bool) -> None:
            """A checkpoint of Spark's last batch is registered and the driver dies while
            the sink commits; the next driver restores it, or falls back to the image
            before it when it turns out unusable (with none before it the job fails: the
            runtime never starts fresh past registered images)."""
            newest = self.next_batch - 1
            self.registry.append(newest)
            self.highest_registered = max(self.highest_registered, newest)
            if newest_unusable and len(self.registry) > 1:
                self.registry.pop()
            self.run_killed(lambda: self.sink.on_checkpoint_complete(newest), mutation)

        @rule(mutation=st.integers(0, 12))
        def kill_while_restoring(self, mutation: int) -> None:
            restored = self.registry[-1] if self.registry else None
            self.run_killed(
                lambda: TransactionalFileSink(self.output).on_restore(restored, JOB), mutation
            )

        @precondition(lambda self: len(self.registry) >= 2)
        @rule(data=st.data())
        def fall_back_to_an_older_checkpoint(self, data: st.DataObject) -> None:
            """The newest images turn out unusable: restore an older one."""
            keep = data.draw(st.integers(1, len(self.registry) - 1), label="images kept")
            del self.registry[keep:]
            self.restart()

        @precondition(lambda self: self.superseded is not None)
        @rule(partitions=st.integers(1, 4))
        def superseded_driver_stages(self, partitions: int) -> None:
            """The driver before the last restart runs on and stages its next batch, of
            other rows (it restored other state): it is fenced and leaves nothing."""
            assert self.superseded is not None
            sink, batch_id = self.superseded
            stale = [{"word": "stale", "count": batch_id}]
            with pytest.raises(Superseded):
                sink.write_batch(cast(Any, fake_batch(stale, partitions=partitions)), batch_id)

        @precondition(lambda self: self.registry)
        @rule(newest_unusable=st.booleans())
        def restart_as_the_driver_commits(self, newest_unusable: bool) -> None:
            """The driver finds its writer epoch current on a notification and reads what
            it staged; then the next driver restores (the old one runs on: its pod was
            force-deleted while its node was cut off), the image before the newest if that
            one turns out unusable, and only then do the old driver's commit records land."""
            driver, notified, real_create = self.sink, self.registry[-1], OutputStorage.create
            restarted: list[bool] = []

            def create(storage: OutputStorage, path: str, data: bytes) -> bool:
                if path.startswith(f"{COMMITTED_DIR}/") and not restarted:
                    restarted.append(True)
                    if newest_unusable and len(self.registry) > 1:
                        self.registry.pop()
                    self.restart()
                return real_create(storage, path, data)

            OutputStorage.create = create  # type: ignore[method-assign]
            try:
                driver.on_checkpoint_complete(notified)
            finally:
                OutputStorage.create = real_create  # type: ignore[method-assign]

        @invariant()
        def each_committed_batch_is_visible_once_and_never_ahead(self) -> None:
            committed = read_committed(self.output)
            assert list(committed) == list(range(len(committed))), "committed batches have gaps"
            assert len(committed) - 1 <= self.highest_registered, "output ahead of the registry"
            for batch_id, rows in committed.items():
                assert rows == rows_of(batch_id), f"batch {batch_id} is not its output once"

        def check_no_garbage(self, restored: int | None) -> None:
            """After a restore every data object is one a record lists, or of a batch that
            is still staged (garbage until the batch is committed); nothing is staged that
            the restored checkpoint covers."""
            storage = OutputStorage(self.output)
            listed = set()
            for name in storage.list_names(COMMITTED_DIR):
                data = storage.read(f"{COMMITTED_DIR}/{name}")
                assert data is not None
                listed |= {path for path, _ in BatchRecord.from_json(data, name).files}
            staged = self.sink.staged_batches()
            assert all(restored is None or batch > restored for batch in staged), staged
            unlisted = set(storage.find(DATA_DIR)) - listed
            assert {int(path.split("/")[1].removeprefix("batch-")) for path in unlisted} <= set(
                staged
            ), unlisted
            assert len(storage.list_names(EPOCHS_DIR)) == 1, "the older writer epochs go"

        def teardown(self) -> None:
            """The last driver runs to the end: every batch exactly once."""
            disarm()
            last = max(
                self.next_batch, len(read_committed(self.output)), *self.sink.staged_batches()
            )
            while self.next_batch <= last:
                self.stage(2)
            self.registry.append(last)
            self.sink.on_checkpoint_complete(last)
            assert read_committed(self.output) == {b: rows_of(b) for b in range(last + 1)}
            self.sink.on_restore(last, JOB)
            self.check_no_garbage(last)
            assert self.sink.staged_batches() == []

    run_state_machine_as_test(
        DriverLifetimes,
        settings=settings(
            max_examples=EXAMPLES[output_root.kind],
            stateful_step_count=14,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
