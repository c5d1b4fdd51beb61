"""Coordinator settings and the termination retention policy."""

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


def _require_integer(name: str, value: object) -> None:
    # bool is an int subclass, and True is no count.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _require_seconds(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    # NaN passes every comparison the settings are checked with; infinity is no time.
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")


class RetentionPolicy(StrEnum):
    """What happens to retained checkpoints when the job terminates (Flink's externalized
    checkpoint retention). Savepoints are never touched by it."""

    NEVER_RETAIN_AFTER_TERMINATION = "NeverRetainAfterTermination"
    RETAIN_ON_FAILURE = "RetainOnFailure"
    RETAIN_ON_CANCELLATION = "RetainOnCancellation"

    def discards_on(self, outcome: "TerminalOutcome") -> bool:
        """Whether checkpoints are discarded when the job ends with ``outcome``.

        Mirrors Flink's ``CheckpointProperties``, applied as Flink applies them only in
        globally terminal states: a suspended job resumes, from its checkpoints if its
        suspension took no savepoint, so it keeps them under every policy; a finished job
        never needs them; a failed one keeps them unless the policy is NeverRetain; a
        cancelled one keeps them only under RetainOnCancellation.
        """
        if outcome is TerminalOutcome.SUSPENDED:
            return False
        if self is RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION:
            return True
        if outcome is TerminalOutcome.FINISHED:
            return True
        if outcome is TerminalOutcome.CANCELLED:
            return self is RetentionPolicy.RETAIN_ON_FAILURE
        return False


class TerminalOutcome(StrEnum):
    FINISHED = "Finished"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    SUSPENDED = "Suspended"


@dataclass(frozen=True, slots=True)
class SavepointHistoryLimits:
    """Savepoints have their own limits; the newest the job can restore is always kept."""

    max_count: int = 10
    max_age_seconds: float | None = None

    def __post_init__(self) -> None:
        _require_integer("savepoints.historyMaxCount", self.max_count)
        _require_seconds("savepoints.historyMaxAge", self.max_age_seconds, optional=True)
        if self.max_count < 1:
            raise ValueError(f"savepoints.historyMaxCount must be >= 1, got {self.max_count}")
        if self.max_age_seconds is not None and self.max_age_seconds <= 0:
            raise ValueError(
                f"savepoints.historyMaxAge must be > 0 seconds, got {self.max_age_seconds}"
            )


class SavepointSchedule(Protocol):
    """When periodic savepoints are due by a calendar (spec.savepoints.schedule, a cron
    expression: read outside the core)."""

    def next_after(self, wall_time: float) -> float | None:
        """The first time of the schedule after ``wall_time`` (wall clock seconds); None
        if it never fires again."""
        ...


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Checkpointing settings of one job; times are seconds.

    ``interval`` None disables periodic checkpoints (manual ones still work);
    ``savepoint_interval`` and ``savepoint_schedule`` (at most one) None, periodic
    savepoints.
    """

    interval: float | None = 60.0
    min_pause: float = 0.0
    timeout: float = 600.0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retained: int = 1
    retention_policy: RetentionPolicy = RetentionPolicy.RETAIN_ON_FAILURE
    max_queued_requests: int = 1000
    history_size: int = 10
    savepoint_history: SavepointHistoryLimits = SavepointHistoryLimits()
    savepoint_interval: float | None = None
    savepoint_schedule: SavepointSchedule | None = None

    def __post_init__(self) -> None:
        # Types first: a float count (``retained: 2.0``) passes every comparison below and
        # only fails later, inside a completion, where nothing can report it.
        for name, value in (
            ("checkpointing.maxConcurrent", self.max_concurrent),
            ("checkpointing.tolerableFailures", self.tolerable_failures),
            ("checkpointing.retained", self.retained),
            ("max_queued_requests", self.max_queued_requests),
            ("history_size", self.history_size),
        ):
            _require_integer(name, value)
        _require_seconds("checkpointing.interval", self.interval, optional=True)
        _require_seconds("checkpointing.minPause", self.min_pause)
        _require_seconds("checkpointing.timeout", self.timeout)
        _require_seconds("savepoints.interval", self.savepoint_interval, optional=True)
        if not isinstance(self.retention_policy, RetentionPolicy):
            raise ValueError(
                f"checkpointing.retentionPolicy must be one of "
                f"{', '.join(p.value for p in RetentionPolicy)}, got {self.retention_policy!r}"
            )
        problems = []
        if self.interval is not None and self.interval <= 0:
            problems.append(f"checkpointing.interval must be > 0, got {self.interval}")
        if self.min_pause < 0:
            problems.append(f"checkpointing.minPause must be >= 0, got {self.min_pause}")
        if self.interval is not None and self.min_pause > self.interval:
            problems.append(
                f"checkpointing.minPause ({self.min_pause}) must not exceed "
                f"checkpointing.interval ({self.interval})"
            )
        if self.savepoint_interval is not None and self.savepoint_interval <= 0:
            problems.append(f"savepoints.interval must be > 0, got {self.savepoint_interval}")
        if self.savepoint_interval is not None and self.savepoint_schedule is not None:
            problems.append("savepoints.interval and savepoints.schedule: set one of them")
        if self.timeout <= 0:
            problems.append(f"checkpointing.timeout must be > 0, got {self.timeout}")
        if self.max_concurrent < 1:
            problems.append(f"checkpointing.maxConcurrent must be >= 1, got {self.max_concurrent}")
        if self.tolerable_failures < 0:
            problems.append(
                f"checkpointing.tolerableFailures must be >= 0, got {self.tolerable_failures}"
            )
        if self.retained < 1:
            problems.append(f"checkpointing.retained must be >= 1, got {self.retained}")
        if self.max_queued_requests < 1:
            problems.append(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        if self.history_size < 1:
            problems.append(f"history_size must be >= 1, got {self.history_size}")
        if problems:
            raise ValueError("; ".join(problems))
