"""Checkpoint trigger requests and the bounded, ordered queue they wait in."""

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

# The protocol's enums are defined once, with the wire contract the agent speaks.
from spark_checkpoint.protocol import AfterCompletion, CheckpointKind

__all__ = [
    "PERIODIC_SAVEPOINT_LABEL",
    "AfterCompletion",
    "CheckpointKind",
    "RequestOrigin",
    "RequestQueue",
    "TriggerRequest",
]

# The label of the savepoints `savepoints.interval` asks for (Flink's periodic savepoints).
PERIODIC_SAVEPOINT_LABEL = "periodic"


class RequestOrigin(StrEnum):
    PERIODIC = "periodic"
    USER = "user"


@dataclass(frozen=True, slots=True)
class TriggerRequest:
    """A wish for a checkpoint; it becomes a pending checkpoint with an id once triggered.

    ``label`` identifies a user request in status and events (for example the trigger
    nonce that asked for it).
    """

    kind: CheckpointKind
    origin: RequestOrigin
    requested_at: float
    forced: bool = False
    after: AfterCompletion = AfterCompletion.CONTINUE
    label: str = ""
    pinned: bool = False  # `TriggerRequested.pinned`

    @property
    def is_periodic(self) -> bool:
        return self.origin is RequestOrigin.PERIODIC

    @property
    def priority_key(self) -> tuple[bool, bool, bool, float]:
        """Savepoints before checkpoints, forced before unforced, user before periodic,
        then oldest first (Flink's ``CheckpointRequestDecider`` order); equal keys keep
        their arrival order."""
        return (
            self.kind is not CheckpointKind.SAVEPOINT,
            not self.forced,
            self.is_periodic,
            self.requested_at,
        )


class RequestQueue:
    """Requests waiting for a free slot, highest priority first, bounded in size."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._requests: list[TriggerRequest] = []

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[TriggerRequest]:
        return iter(tuple(self._requests))

    def offer(self, request: TriggerRequest) -> TriggerRequest | None:
        """Queue ``request``; return the request that is rejected, if any.

        When the queue is full: if it holds only user requests, the new request is the
        one rejected (user requests are never silently dropped for another); otherwise
        the lowest-priority request, a periodic one, makes room.
        """
        if len(self._requests) >= self._capacity and not self._requests[-1].is_periodic:
            return request
        keys = [queued.priority_key for queued in self._requests]
        # bisect_right: after every request of an equal key, so arrival order breaks ties.
        self._requests.insert(bisect.bisect_right(keys, request.priority_key), request)
        if len(self._requests) > self._capacity:
            return self._requests.pop()
        return None

    def peek(self) -> TriggerRequest | None:
        return self._requests[0] if self._requests else None

    def pop(self) -> TriggerRequest:
        return self._requests.pop(0)

    def drain(self) -> list[TriggerRequest]:
        drained, self._requests = self._requests, []
        return drained

    def drain_labelled(self, label: str) -> list[TriggerRequest]:
        drained = [request for request in self._requests if request.label == label]
        self._requests = [request for request in self._requests if request.label != label]
        return drained

    def drain_periodic(self) -> list[TriggerRequest]:
        drained = [request for request in self._requests if request.is_periodic]
        self._requests = [request for request in self._requests if not request.is_periodic]
        return drained
