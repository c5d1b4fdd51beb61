"""The agent's status document read as coordinator events (docs/agent-protocol.md).

The agent lists each snapshot in flight with all its acknowledgements and declines until
the snapshot is done; each is fed to the coordinator once. A snapshot the coordinator
neither waits for nor registered is reported once, to be dropped at the agent.
"""

from dataclasses import dataclass
from typing import Any

from spark_checkpoint_operator.coordinator import (
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
)

# A status document as the agent sends it.
Status = dict[str, Any]


@dataclass(frozen=True, slots=True)
class UnknownSnapshot:
    """Triggered before this runtime restarted, or aborted while the agent was unreachable:
    the agent drops it and unpins its files; its id is never used again."""

    checkpoint_id: int


Progress = TaskAcknowledged | TaskDeclined | UnknownSnapshot


def version(status: Status) -> int | None:
    """What a long poll waits to change; None from an agent that cannot long-poll."""
    found = status.get("version")
    return found if isinstance(found, int) else None


def last_batch(status: Status) -> int | None:
    batch: int | None = status["query"].get("lastCommittedBatch")
    return batch


def query_running(status: Status) -> bool:
    """A restored query is reported "restoring" until it got past its image."""
    return status["query"]["state"] in ("running", "finished")


def restored_from(status: Status) -> dict[str, Any] | None:
    """The image the driver restored from (``source``) and those it skipped (``skipped``:
    each a ``source`` and a ``reason``)."""
    restored: dict[str, Any] | None = status.get("restoredFrom")
    return restored


def input_exhausted_at(status: Status) -> int | None:
    """The last batch of bounded input, once the query waits for its final checkpoint."""
    if not status["awaitingFinalCheckpoint"]:
        return None
    batch: int = status["query"]["lastCommittedBatch"]
    return batch


def tasks_reported(status: Status, executors_ready: bool) -> TasksReported:
    return TasksReported(frozenset(status["tasks"]), status["allTasksRunning"] and executors_ready)


class SnapshotProgress:
    """Remembers what was fed of each snapshot while the agent lists it: a job runs for
    months, so what it no longer lists is forgotten."""

    def __init__(self) -> None:
        self._fed_acks: set[tuple[int, str]] = set()
        self._fed_declines: set[tuple[int, str]] = set()
        self._dropped: set[int] = set()

    def read(self, status: Status, known: set[int]) -> list[Progress]:
        """What is new in ``status``, in the agent's order, for the snapshots the
        coordinator ``known``s (pending or registered); the others are unknown."""
        progress: list[Progress] = []
        in_flight = {int(snapshot["id"]) for snapshot in status["checkpoints"]}
        for snapshot in status["checkpoints"]:
            checkpoint_id = int(snapshot["id"])
            if checkpoint_id in known:
                progress.extend(self._new(checkpoint_id, snapshot))
            elif checkpoint_id not in self._dropped:
                self._dropped.add(checkpoint_id)
                progress.append(UnknownSnapshot(checkpoint_id))
        self._fed_acks = {key for key in self._fed_acks if key[0] in in_flight}
        self._fed_declines = {key for key in self._fed_declines if key[0] in in_flight}
        self._dropped &= in_flight
        return progress

    def _new(self, checkpoint_id: int, snapshot: dict[str, Any]) -> list[Progress]:
        progress: list[Progress] = []
        for ack in snapshot["acks"]:
            key = (checkpoint_id, ack["task"])
            if key not in self._fed_acks:
                self._fed_acks.add(key)
                task_ack = TaskAck(ack["task"], ack["batchId"], ack["sizeBytes"], ack["durationMs"])
                progress.append(TaskAcknowledged(checkpoint_id, task_ack))
        for decline in snapshot["declines"]:
            key = (checkpoint_id, decline["task"])
            if key not in self._fed_declines:
                self._fed_declines.add(key)
                progress.append(TaskDeclined(checkpoint_id, decline["task"], decline["message"]))
        return progress
