"""The registry of completed checkpoints and savepoints, and the bounded outcome history."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from spark_checkpoint_operator.coordinator.config import SavepointHistoryLimits
from spark_checkpoint_operator.coordinator.reasons import FailureReason
from spark_checkpoint_operator.coordinator.requests import CheckpointKind


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    """A consistent image of the query as of ``batch_id``: its ``_metadata`` is written and
    the registry lists it, so it may be restored from."""

    checkpoint_id: int
    kind: CheckpointKind
    batch_id: int
    path: str
    size_bytes: int
    trigger_time: float
    completion_time: float
    label: str = ""
    # Kept out of the savepoint history's limits until released (`TriggerRequested.pinned`).
    pinned: bool = False

    @property
    def duration(self) -> float:
        return self.completion_time - self.trigger_time


class OutcomeStatus(StrEnum):
    COMPLETED = "Completed"
    FAILED = "Failed"


# The most characters of one message the job's status keeps (a history line's, a skipped
# image's reason): most are a driver's words, whose code is the job author's, and the
# status must stay far below the API server's limit on an object (etcd's 1.5 MiB).
MESSAGE_CHARACTERS = 1000


def shortened(message: str) -> str:
    """``message`` within `MESSAGE_CHARACTERS`, its cut marked."""
    if len(message) <= MESSAGE_CHARACTERS:
        return message
    return f"{message[: MESSAGE_CHARACTERS - 1]}\u2026"


@dataclass(frozen=True, slots=True)
class CheckpointOutcome:
    """One line of the bounded checkpoint history shown in status."""

    checkpoint_id: int
    kind: CheckpointKind
    status: OutcomeStatus
    trigger_time: float
    end_time: float
    batch_id: int | None = None
    size_bytes: int | None = None
    reason: FailureReason | None = None
    message: str = ""
    label: str = ""  # who asked for it ("periodic", "upgrade", "nonce 3"); "" for a routine one


class CompletedCheckpointStore:
    """Keeps the newest ``retained`` completed checkpoints; older ones are subsumed.
    ``unrestorable`` tells the checkpoints a restore failed on or passed over (the job never
    restores them again): over the count they go first, or a corrupt image would count
    against ``retained`` and push out one the job could restore (a newcomer's)."""

    def __init__(
        self,
        retained: int,
        checkpoints: Iterable[CompletedCheckpoint] = (),
        unrestorable: Callable[[int], bool] = lambda checkpoint_id: False,
    ) -> None:
        self._retained = retained
        self._checkpoints = sorted(checkpoints, key=lambda c: c.checkpoint_id)
        self._unrestorable = unrestorable

    @property
    def checkpoints(self) -> tuple[CompletedCheckpoint, ...]:
        return tuple(self._checkpoints)

    def add(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        """Register ``checkpoint``; return the checkpoints it subsumes, oldest first."""
        if checkpoint.kind is not CheckpointKind.CHECKPOINT:
            raise ValueError(f"savepoint {checkpoint.checkpoint_id} is not a checkpoint")
        self._checkpoints.append(checkpoint)
        self._checkpoints.sort(key=lambda c: c.checkpoint_id)
        # Clamped: a negative excess would slice from the end and drop the oldest
        # checkpoints from the registry without reporting them.
        excess = max(0, len(self._checkpoints) - self._retained)
        first_to_go = sorted(
            self._checkpoints,
            key=lambda c: (not self._unrestorable(c.checkpoint_id), c.checkpoint_id),
        )
        subsumed = sorted(first_to_go[:excess], key=lambda c: c.checkpoint_id)
        self._checkpoints = [c for c in self._checkpoints if c not in subsumed]
        return subsumed

    def remove_all(self) -> list[CompletedCheckpoint]:
        removed, self._checkpoints = self._checkpoints, []
        return removed


class SavepointHistory:
    """Completed savepoints, trimmed by count and age. The newest the job can restore from
    is always kept: it is what a suspended job resumes from. ``unrestorable`` tells the
    savepoints a restore failed on (the job never restores them again): over the count,
    they go first."""

    def __init__(
        self,
        limits: SavepointHistoryLimits,
        savepoints: Iterable[CompletedCheckpoint] = (),
        unrestorable: Callable[[int], bool] = lambda savepoint_id: False,
    ) -> None:
        self._limits = limits
        self._savepoints = sorted(savepoints, key=lambda s: s.checkpoint_id)
        self._unrestorable = unrestorable

    @property
    def savepoints(self) -> tuple[CompletedCheckpoint, ...]:
        return tuple(self._savepoints)

    def add(self, savepoint: CompletedCheckpoint, now: float) -> list[CompletedCheckpoint]:
        """Record ``savepoint``; return the savepoints that fall out of the history.

        The savepoint just added is never among them, even when it completed after newer
        ones: whoever asked for it gets to see it.
        """
        if savepoint.kind is not CheckpointKind.SAVEPOINT:
            raise ValueError(f"checkpoint {savepoint.checkpoint_id} is not a savepoint")
        self._savepoints.append(savepoint)
        self._savepoints.sort(key=lambda s: s.checkpoint_id)
        return self.expire(now, keep=savepoint)

    def remove(self, savepoint_id: int) -> CompletedCheckpoint | None:
        """Take savepoint ``savepoint_id`` out of the history (a user disposes of it); None
        if the history does not hold it."""
        found = next((s for s in self._savepoints if s.checkpoint_id == savepoint_id), None)
        if found is not None:
            self._savepoints.remove(found)
        return found

    def pinned(self, savepoint_id: int) -> bool | None:
        """Whether savepoint ``savepoint_id`` is pinned; None if the history has none."""
        return next((s.pinned for s in self._savepoints if s.checkpoint_id == savepoint_id), None)

    def pin(self, savepoint_id: int, pinned: bool, now: float) -> list[CompletedCheckpoint]:
        """Savepoint ``savepoint_id`` is pinned, or no longer; return the savepoints the
        limits let go now (it among them, if released beyond them)."""
        self._savepoints = [
            replace(s, pinned=pinned) if s.checkpoint_id == savepoint_id else s
            for s in self._savepoints
        ]
        return self.expire(now)

    def expire(
        self, now: float, keep: CompletedCheckpoint | None = None
    ) -> list[CompletedCheckpoint]:
        """Drop savepoints beyond the count limit or older than the age limit, oldest
        first (the unrestorable before the rest); the newest restorable and ``keep`` stay."""
        pinned = {s.checkpoint_id for s in self._savepoints if s.pinned}
        protected = self._newest_restorable() - pinned  # what the limits count
        if keep is not None and not keep.pinned:
            protected.add(keep.checkpoint_id)
        max_age = self._limits.max_age_seconds
        candidates = [s for s in self._savepoints if s.checkpoint_id not in protected | pinned]
        too_old = [
            s for s in candidates if max_age is not None and now >= s.completion_time + max_age
        ]
        young = sorted(
            (s for s in candidates if s not in too_old),
            key=lambda s: (not self._unrestorable(s.checkpoint_id), s.checkpoint_id),
        )
        excess = len(young) + len(protected) - self._limits.max_count
        dropped = too_old + young[: max(0, excess)]
        self._savepoints = [s for s in self._savepoints if s not in dropped]
        return sorted(dropped, key=lambda s: s.checkpoint_id)

    def next_expiry(self) -> float | None:
        """When the first savepoint but the newest restorable and the pinned ones ages out,
        if an age limit is set: `expire` drops it then (a deadline it would not act on would
        come back at once, for ever). The first to complete, not the lowest id: savepoints
        are forced, so several may be under way and complete out of id order."""
        max_age = self._limits.max_age_seconds
        protected = self._newest_restorable()
        ageing = [s for s in self._savepoints if s.checkpoint_id not in protected and not s.pinned]
        if max_age is None or not ageing:
            return None
        return min(s.completion_time for s in ageing) + max_age

    def _newest_restorable(self) -> set[int]:
        """The id of the savepoint a suspended job resumes from: the newest the job can
        restore (the newest, if it can restore none)."""
        restorable = [s for s in self._savepoints if not self._unrestorable(s.checkpoint_id)]
        return {s.checkpoint_id for s in (restorable or self._savepoints)[-1:]}
