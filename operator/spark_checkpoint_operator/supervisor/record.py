"""The persisted part of a job: what status shows and what a restarted runtime resumes from."""

from dataclasses import dataclass, field
from typing import Any

from spark_checkpoint_operator.coordinator import JobPhase, PersistedState


@dataclass
class JobRecord:
    """Everything about the job that is persisted: the coordinator's registry and the
    runtime's own counters. It is what status shows and what a restart resumes from.

    ``phase`` is the one place the job's phase is kept; the coordinator is told it (see
    ``EffectInterpreter.enter``)."""

    phase: JobPhase = JobPhase.PENDING
    attempt: int = 0
    restores: int = 0  # attempts whose restore succeeded (see JobSupervisor._confirm_restore)
    failed_restores: int = 0
    restored_from: dict[str, Any] | None = None
    # Images a restored query failed on ({"source", "reason", "attempt"}): never tried again.
    unrestorable: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    coordinator: PersistedState = field(default_factory=PersistedState)
    pending: list[dict[str, Any]] = field(default_factory=list)
    last_batch: int | None = None
    consecutive_failures: int = 0
    # The live counter of this process's coordinator: no id at or above it has been
    # triggered (at most the persisted counter). None in a record read back: its coordinator
    # starts after the persisted counter, as nothing tells which ids below were used.
    next_checkpoint_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record's part of the status (``status.render_status`` adds the views)."""
        return {
            "phase": self.phase.value,
            "jobAttempt": self.attempt,
            "restoredFrom": self.restored_from,
            "unrestorable": self.unrestorable,
            "message": self.message,
            "lastCommittedBatch": self.last_batch,
            "consecutiveFailures": self.consecutive_failures,
            "nextCheckpointId": (
                self.coordinator.next_checkpoint_id
                if self.next_checkpoint_id is None
                else self.next_checkpoint_id
            ),
            "pending": self.pending,
            "coordinator": self.coordinator.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobRecord":
        """Read back a status written from ``to_dict`` (views are ignored)."""
        coordinator = (
            PersistedState.from_dict(data["coordinator"])
            if "coordinator" in data
            else PersistedState()
        )
        counts = data.get("counts", {})
        return cls(
            phase=JobPhase(data.get("phase", JobPhase.PENDING)),
            attempt=int(data.get("jobAttempt", 0)),
            restores=int(counts.get("restored", 0)),
            failed_restores=int(counts.get("failedRestores", 0)),
            restored_from=data.get("restoredFrom"),
            unrestorable=list(data.get("unrestorable", [])),
            message=str(data.get("message", "")),
            coordinator=coordinator,
        )
