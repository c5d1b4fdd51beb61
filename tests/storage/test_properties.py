"""Property test: whatever sequence of checkpoints, discards, savepoints and garbage
collections happens, every retained snapshot stays restorable and nothing unreferenced
survives garbage collection."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

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

from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    JobStorageLayout,
    ManifestEntry,
)

from .conftest import choose_fsync

# Files of the live Spark checkpoint location. Two state files share name and bytes (so
# they share one stored object), and "metadata" has the bytes of an offsets file.
POOL = {
    "metadata": b"o1",
    "offsets/0": b"o0",
    "offsets/1": b"o1",
    "commits/0": b"c0",
    "state/0/0/1.delta": b"same",
    "state/0/1/1.delta": b"same",
    "state/0/0/2.snapshot": b"snapshot " * 50,
    "state/0/1/2.delta": b"",
}
POOL_PATHS = sorted(POOL)
subsets = st.sets(st.sampled_from(POOL_PATHS))


def test_retained_snapshots_survive_any_sequence_of_operations(
    make_metadata: Callable[..., CheckpointMetadata], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Durability is not observable here, and skipping fsync (and syncfs) keeps the test fast.
    monkeypatch.setattr(os, "fsync", lambda _descriptor: None)
    choose_fsync(monkeypatch)

    class CheckpointLifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.directory = Path(tempfile.mkdtemp(prefix="storage-property-"))
            layout = JobStorageLayout(str(self.directory / "storage"), "team-a", "orders.v2")
            self.storage = CheckpointStorage(layout)
            self.spark_dir = self.directory / "spark"
            for path, content in POOL.items():
                self.write_spark_file(path, content)
            self.checkpoints: dict[int, CheckpointMetadata] = {}  # the registry
            self.savepoints: dict[int, CheckpointMetadata] = {}
            self.in_flight: list[ManifestEntry] | None = None
            self.next_checkpoint_id = 1
            self.next_savepoint_id = 1

        def teardown(self) -> None:
            shutil.rmtree(self.directory)

        def write_spark_file(self, path: str, content: bytes) -> None:
            local = self.spark_dir / path
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(content)

        def store_shared(self, paths: set[str], link: bool) -> list[ManifestEntry]:
            return [
                self.storage.add_shared_file(str(self.spark_dir / path), path, link=link)
                for path in sorted(paths)
            ]

        def register_checkpoint(self, files: list[ManifestEntry]) -> None:
            meta = make_metadata(CheckpointKind.CHECKPOINT, self.next_checkpoint_id, files)
            self.next_checkpoint_id += 1
            self.storage.write_metadata(meta)
            self.checkpoints[meta.checkpoint_id] = meta

        @property
        def protected_locations(self) -> set[str]:
            return {entry.location for entry in self.in_flight or ()}

        @rule(paths=subsets, link=st.booleans())
        def take_checkpoint(self, paths: set[str], link: bool) -> None:
            self.register_checkpoint(self.store_shared(paths, link))

        @precondition(lambda self: self.in_flight is None)
        @rule(paths=subsets)
        def start_checkpoint(self, paths: set[str]) -> None:
            self.in_flight = self.store_shared(paths, link=True)

        @precondition(lambda self: self.in_flight is not None)
        @rule(complete=st.booleans())
        def finish_checkpoint(self, complete: bool) -> None:
            if complete and self.in_flight is not None:
                self.register_checkpoint(self.in_flight)
            self.in_flight = None  # an aborted checkpoint's files are left to GC

        @rule(paths=subsets)
        def take_savepoint(self, paths: set[str]) -> None:
            savepoint_id = self.next_savepoint_id
            self.next_savepoint_id += 1
            files = [
                self.storage.add_savepoint_file(savepoint_id, str(self.spark_dir / path), path)
                for path in sorted(paths)
            ]
            meta = make_metadata(CheckpointKind.SAVEPOINT, savepoint_id, files)
            self.storage.write_metadata(meta)
            self.savepoints[savepoint_id] = meta

        @precondition(lambda self: self.checkpoints)
        @rule(data=st.data())
        def discard_checkpoint(self, data: st.DataObject) -> None:
            checkpoint_id = data.draw(st.sampled_from(sorted(self.checkpoints)))
            del self.checkpoints[checkpoint_id]
            self.storage.discard_checkpoint(
                checkpoint_id, self.checkpoints, protected_locations=self.protected_locations
            )

        @precondition(lambda self: self.savepoints)
        @rule(data=st.data())
        def discard_savepoint(self, data: st.DataObject) -> None:
            savepoint_id = data.draw(st.sampled_from(sorted(self.savepoints)))
            del self.savepoints[savepoint_id]
            self.storage.discard_savepoint(savepoint_id)

        @rule(path=st.sampled_from(POOL_PATHS))
        def spark_rewrites_its_file(self, path: str) -> None:
            # Spark deleting (and here recreating) its own file never touches ours.
            (self.spark_dir / path).unlink()
            self.write_spark_file(path, POOL[path])

        @rule()
        def collect_garbage(self) -> None:
            self.storage.collect_garbage(
                self.checkpoints, self.savepoints, protected_locations=self.protected_locations
            )
            referenced = self.protected_locations.union(
                *(meta.locations for meta in self.checkpoints.values())
            )
            stored = {
                f"shared/{relative}"
                for relative in self.storage.fs.list_files(self.storage.layout.shared_dir)
            }
            assert stored == referenced

        @invariant()
        def retained_snapshots_are_complete_and_intact(self) -> None:
            assert self.storage.list_ids(CheckpointKind.CHECKPOINT) == sorted(self.checkpoints)
            assert self.storage.list_ids(CheckpointKind.SAVEPOINT) == sorted(self.savepoints)
            for meta in (*self.checkpoints.values(), *self.savepoints.values()):
                self.storage.verify(meta)
            for entry in self.in_flight or ():
                assert (
                    self.storage.fs.file_size(self.storage.layout.location_path(entry.location))
                    == entry.size
                )

    run_state_machine_as_test(
        CheckpointLifecycle,
        settings=settings(
            max_examples=60,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
