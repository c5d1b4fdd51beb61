"""The persisted part of a job: what status shows and what a restarted runtime resumes from."""

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_checkpoint.protocol import RestoreCandidate, RestoredFrom
from spark_checkpoint_operator.coordinator import CheckpointKind, JobPhase, PersistedState
from spark_checkpoint_operator.status import (
    DiscardDue,
    PersistedStatus,
    RestoreChoice,
    UnrestorableImage,
)


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
    restored_from: RestoredFrom | None = None  # the current attempt's, as its agent reported
    # Images a restored query failed on, or checked unusable, or left behind: not tried
    # again (unless named, or, not permanent, under a changed deployment).
    unrestorable: list[UnrestorableImage] = field(default_factory=list)
    # The last attempt whose query committed a batch after the image it restored (0: none
    # yet). None: not known (a status an earlier operator wrote, of a job not Running).
    last_committing_attempt: int | None = 0
    # The image restored instead of the newest until an image completes (`restore_from`):
    # kept, so that a restart of the runtime restores it again, not an image it set aside.
    restore_choice: RestoreChoice | None = None
    message: str = ""
    coordinator: PersistedState = field(default_factory=PersistedState)
    pending: list[dict[str, Any]] = field(default_factory=list)
    discards_due: list[DiscardDue] = field(default_factory=list)
    last_batch: int | None = None
    consecutive_failures: int = 0
    # Driver restarts in a row, and when the one waiting out its backoff is due (epoch
    # seconds): an operator restart neither forgets them nor cuts the backoff short.
    restarts: int = 0
    restart_due: float | None = None
    # Periodic checkpoints skipped since the last one triggered (see PersistedStatus); a
    # restart starts afresh, as with the failure streak.
    checkpoints_skipped: dict[str, Any] | None = None
    # When the next periodic savepoint is due (epoch seconds; the coordinator's, as of its
    # last state write or replacement).
    next_periodic_savepoint: float | None = None
    # The live counter of this process's coordinator: no id at or above it has been
    # triggered (at most the persisted counter). None in a record read back: its coordinator
    # starts after the persisted counter, as nothing tells which ids below were used.
    next_checkpoint_id: int | None = None

    def is_unrestorable(self, kind: CheckpointKind, image_id: int) -> bool:
        """Whether a restore failed on or passed over the registry's image (`unrestorable`)."""
        image = RestoreCandidate.registered(kind, image_id).encode()
        return any(entry.source == image for entry in self.unrestorable)

    @property
    def restore_choice_in_force(self) -> RestoreChoice | None:
        """`restore_choice` until an image completes after it (the supervisor drops it at
        its next restore; a status written meanwhile leaves it out)."""
        choice = self.restore_choice
        if choice is None or not choice.in_force(self.coordinator.completed_count):
            return None
        return choice

    def forget_failed_restores(self) -> list[str]:
        """A changed deployment runs: the images restores failed on (or checks found
        unusable) since the job's query last committed a batch past its image are
        restorable again, and are returned.
        That streak was of the deployment before (a codec the state was not written with,
        an older Spark, a broken setting); under another one the images restore, or fail
        and are marked again. Not what a restore of an older image left behind
        (``permanent``), whose staged output is gone whatever runs; nothing when it is not
        known when the query last committed one."""
        since = self.last_committing_attempt
        if since is None:
            return []
        forgotten = [e for e in self.unrestorable if e.attempt > since and not e.permanent]
        self.unrestorable = [e for e in self.unrestorable if e not in forgotten]
        return [entry.source for entry in forgotten]

    def why_not_disposable(
        self, savepoint_id: int, absent: Collection[tuple[CheckpointKind, int]] = ()
    ) -> str | None:
        """`PersistedState.why_not_disposable`, counting only the images a restore takes:
        not those it failed on or passed over, nor those known to be ``absent`` from
        storage (kind and id)."""
        return self.coordinator.why_not_disposable(
            savepoint_id,
            lambda kind, image_id: (
                (kind, image_id) in absent or self.is_unrestorable(kind, image_id)
            ),
        )

    def persisted_status(self) -> PersistedStatus:
        """The record's part of the status (``status.render_status`` adds the views)."""
        return PersistedStatus(
            phase=self.phase,
            job_attempt=self.attempt,
            restores=self.restores,
            failed_restores=self.failed_restores,
            restored_from=self.restored_from,
            unrestorable=self.unrestorable,
            last_committing_attempt=self.last_committing_attempt,
            restore_choice=self.restore_choice_in_force,
            message=self.message,
            last_committed_batch=self.last_batch,
            consecutive_failures=self.consecutive_failures,
            restarts=self.restarts,
            restart_due=self.restart_due,
            checkpoints_skipped=self.checkpoints_skipped,
            next_periodic_savepoint=self.next_periodic_savepoint,
            next_checkpoint_id=(
                self.coordinator.next_checkpoint_id
                if self.next_checkpoint_id is None
                else self.next_checkpoint_id
            ),
            pending=self.pending,
            discards_due=self.discards_due,
            coordinator=self.coordinator,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.persisted_status().to_dict()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobRecord":
        """Read back a status: what a restart resumes from (the previous process's pending
        snapshots, failure streak and live id counter start afresh; the last committed batch
        stands until the next query reports one)."""
        return cls.from_status(PersistedStatus.from_dict(data))

    @classmethod
    def from_status(cls, status: PersistedStatus) -> "JobRecord":
        """What a restart resumes from (see ``from_dict``)."""
        return cls(
            phase=status.phase,
            attempt=status.job_attempt,
            restores=status.restores,
            failed_restores=status.failed_restores,
            restored_from=status.restored_from,
            unrestorable=list(status.unrestorable),
            last_committing_attempt=(
                status.job_attempt
                # An earlier operator's status: a Running job's attempt ran its query.
                if status.last_committing_attempt is None and status.phase is JobPhase.RUNNING
                else status.last_committing_attempt
            ),
            restore_choice=status.restore_choice,
            message=status.message,
            discards_due=list(status.discards_due),
            last_batch=status.last_committed_batch,
            restarts=status.restarts,
            restart_due=status.restart_due,
            next_periodic_savepoint=status.next_periodic_savepoint,
            coordinator=status.coordinator,
        )
