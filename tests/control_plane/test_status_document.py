"""The job's status document, defined once in ``status``, round-trips through each of its
users: the supervisor's record (``JobRecord``), the status view (``render_status``), the
local runtime's status file (written each save, read back by the next run and for the
leftover driver's pid), and the storage commands' registry. Drawn records cover every
phase, counters, restore history, pending snapshots, discards due and registries."""

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_checkpoint.protocol import RestoreCandidate, RestoredFrom, SkippedImage
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CheckpointOutcome,
    CompletedCheckpoint,
    FailureReason,
    JobPhase,
    OutcomeStatus,
    PersistedState,
    TerminalOutcome,
)
from spark_checkpoint_operator.local_runtime import load_record
from spark_checkpoint_operator.local_state import LocalPaths
from spark_checkpoint_operator.status import (
    HISTORY_SHOWN,
    DiscardDue,
    InvalidStatus,
    Observed,
    PersistedStatus,
    RegisteredSnapshots,
    RestoreChoice,
    StatusFile,
    UnrestorableImage,
    render_status,
)
from spark_checkpoint_operator.storage_commands.job import load_registry
from spark_checkpoint_operator.supervisor import JobRecord

API_VERSION = "sparkcheckpoint.io/v1alpha1"
ids = st.integers(min_value=1, max_value=2**40)  # the coordinator counts from 1
counts = st.integers(min_value=0, max_value=10**6)
texts = st.text(max_size=20)


def _images(kind: CheckpointKind) -> st.SearchStrategy[tuple[CompletedCheckpoint, ...]]:
    image = st.builds(
        lambda checkpoint_id, batch, size, start, took, label: CompletedCheckpoint(
            checkpoint_id,
            kind,
            batch,
            f"file:///storage/{kind.value}-{checkpoint_id}",
            size,
            float(start),
            float(start + took),
            label,
        ),
        ids,
        counts,
        counts,
        st.integers(0, 2**31),  # whole seconds: stored as RFC 3339 times
        st.integers(0, 3600),
        st.sampled_from(["", "final", "ctrl-c"]),
    )
    unique = st.lists(image, max_size=4, unique_by=lambda c: c.checkpoint_id)
    return unique.map(lambda images: tuple(sorted(images, key=lambda c: c.checkpoint_id)))


outcomes = st.builds(
    lambda checkpoint_id, kind, start, took, completed, reason, label: CheckpointOutcome(
        checkpoint_id,
        kind,
        OutcomeStatus.COMPLETED if completed else OutcomeStatus.FAILED,
        float(start),
        float(start + took),
        batch_id=3 if completed else None,
        size_bytes=10 if completed else None,
        reason=None if completed else reason,
        message="" if completed else "why",
        label=label,
    ),
    ids,
    st.sampled_from(CheckpointKind),
    st.integers(0, 2**31),  # whole seconds: stored as RFC 3339 times
    st.integers(0, 3600),
    st.booleans(),
    st.sampled_from(FailureReason),
    st.sampled_from(["", "periodic", "nonce 3", "upgrade"]),
)
coordinators = st.builds(
    PersistedState,
    next_checkpoint_id=st.integers(1, 2**40),
    checkpoints=_images(CheckpointKind.CHECKPOINT),
    savepoints=_images(CheckpointKind.SAVEPOINT),
    history=st.lists(outcomes, max_size=4).map(tuple),
    completed_count=counts,
    failed_count=counts,
    terminated=st.none() | st.sampled_from(TerminalOutcome),
).map(
    # As a coordinator writes it: its counter above every id it registered.
    lambda state: replace(
        state,
        next_checkpoint_id=max(
            [state.next_checkpoint_id]
            + [c.checkpoint_id + 1 for c in (*state.checkpoints, *state.savepoints)]
        ),
    )
)
candidates = st.one_of(
    st.builds(RestoreCandidate.registered, st.sampled_from(CheckpointKind), ids),
    st.builds(RestoreCandidate.external, st.text(min_size=1, max_size=20)),
)
restores = st.builds(
    RestoredFrom,
    candidates,
    counts,
    st.lists(st.builds(SkippedImage, candidates, texts), max_size=2).map(tuple),
)
unrestorable = st.builds(UnrestorableImage, texts, texts, counts, st.booleans())
pending = st.fixed_dictionaries(
    {
        "id": ids,
        "kind": st.sampled_from([k.value for k in CheckpointKind]),
        "acknowledged": counts,
        "expected": counts,
    }
)
discards_due = st.builds(DiscardDue, st.sampled_from(CheckpointKind), ids, st.none() | texts)
records = st.builds(
    JobRecord,
    phase=st.sampled_from(JobPhase),
    attempt=counts,
    restores=counts,
    failed_restores=counts,
    restored_from=st.none() | restores,
    unrestorable=st.lists(unrestorable, max_size=3),
    last_committing_attempt=counts,  # None: read from an earlier status (tested apart)
    message=texts,
    coordinator=coordinators,
    pending=st.lists(pending, max_size=3),
    discards_due=st.lists(discards_due, max_size=3),
    last_batch=st.none() | counts,
    consecutive_failures=counts,
    restarts=counts,
    # Times that are exact as status writes them (microseconds) and reads them back.
    restart_due=st.none() | st.integers(0, 2**36).map(lambda quarters: quarters / 4),
    next_periodic_savepoint=st.none() | st.integers(0, 2**36).map(lambda quarters: quarters / 4),
    next_checkpoint_id=st.none() | st.integers(1, 2**40),
)


@st.composite
def records_with_choices(draw: st.DrawFn) -> JobRecord:
    """A record, maybe with `restore_from`'s choice: in force (no image completed after
    it) or lapsed."""
    record = draw(records)
    if draw(st.booleans()):
        completed = record.coordinator.completed_count
        record.restore_choice = RestoreChoice(
            draw(candidates).encode(),
            draw(st.just(completed) | counts),
            tuple(c.encode() for c in draw(st.lists(candidates, max_size=3))),
        )
    return record


def _resumable(record: JobRecord) -> tuple[object, ...]:
    """What a restart resumes from; the rest is the live process's."""
    return (
        record.phase,
        record.attempt,
        record.restores,
        record.failed_restores,
        record.restored_from,
        record.unrestorable,
        record.last_committing_attempt,
        record.restore_choice_in_force,
        record.message,
        record.discards_due,
        record.last_batch,
        record.restarts,
        record.restart_due,
        record.next_periodic_savepoint,
        record.coordinator,
    )


@settings(max_examples=60, deadline=None)
@given(records_with_choices(), st.none() | st.integers(1, 2**22))
def test_the_status_round_trips_through_each_of_its_users(
    record: JobRecord, driver_pid: int | None
) -> None:
    persisted = record.persisted_status()
    rendered = render_status(record, now=1_000.0)

    # status.history says who asked for each (a failed savepoint's is nowhere else).
    shown = reversed(record.coordinator.history[-HISTORY_SHOWN:])
    assert [line.get("label", "") for line in rendered["history"]] == [o.label for o in shown]
    # The view and the record write the same document, and both read back whole.
    assert PersistedStatus.from_dict(rendered) == persisted
    assert PersistedStatus.from_dict(record.to_dict()) == persisted
    assert _resumable(JobRecord.from_dict(rendered)) == _resumable(record)

    with tempfile.TemporaryDirectory() as directory:
        paths = LocalPaths(Path(directory) / "default" / "job")
        paths.job_dir.mkdir(parents=True)
        StatusFile(paths.status_file, "job", "default", rendered, driver_pid).write()

        # The local runtime's next run, and its search for a leftover driver.
        assert _resumable(load_record(paths)) == _resumable(record)
        envelope = json.loads(paths.status_file.read_text())
        assert (envelope["apiVersion"], envelope["kind"]) == (API_VERSION, "SparkCheckpointJob")
        assert envelope["metadata"] == {"name": "job", "namespace": "default"}
        found = StatusFile.read(paths.status_file)
        assert found is not None and found.driver_pid == driver_pid
        assert found.persisted_status() == persisted

        # The storage commands' registry.
        registry = load_registry(paths.status_file)
        assert registry is not None
        assert registry.registered == RegisteredSnapshots(
            checkpoints=frozenset(c.checkpoint_id for c in record.coordinator.checkpoints),
            savepoints=frozenset(s.checkpoint_id for s in record.coordinator.savepoints),
            unrestorable={e.source: e.reason for e in record.unrestorable},
            paths=frozenset(
                image.path
                for image in (*record.coordinator.checkpoints, *record.coordinator.savepoints)
            ),
            labels={
                f"{image.kind}:{image.checkpoint_id}": image.label
                for image in (*record.coordinator.checkpoints, *record.coordinator.savepoints)
                if image.label
            },
            finished=record.phase is JobPhase.FINISHED,
        )
        assert registry.refused_by_run is None


@pytest.mark.parametrize(("phase", "since"), [(JobPhase.RUNNING, 4), (JobPhase.FAILED, None)])
def test_an_earlier_operators_status_counts_a_running_attempt_as_past_its_image(
    phase: JobPhase, since: int | None
) -> None:
    """Written before lastCommittingAttempt: a Running job's attempt ran its query (its
    restores that fail later are forgotten under a changed deployment); else none is known."""
    written = JobRecord(phase=phase, attempt=4).to_dict()
    del written["lastCommittingAttempt"]
    assert JobRecord.from_dict(written).last_committing_attempt == since
    assert JobRecord().last_committing_attempt == 0  # a new job's: none yet


def test_a_missing_status_file_is_a_new_job() -> None:
    with tempfile.TemporaryDirectory() as directory:
        paths = LocalPaths(Path(directory) / "default" / "job")
        assert StatusFile.read(paths.status_file) is None
        assert load_registry(paths.status_file) is None
        assert _resumable(load_record(paths)) == _resumable(JobRecord())


def _completed(kind: CheckpointKind, checkpoint_id: int) -> dict[str, object]:
    image = CompletedCheckpoint(checkpoint_id, kind, 0, "file:///storage/x", 0, 0.0, 0.0)
    return PersistedState(next_checkpoint_id=checkpoint_id + 1, checkpoints=(image,)).to_dict()[
        "checkpoints"
    ][0]


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ({"jobAttempt": -1}, "jobAttempt: expected 0 to 9007199254740991, got -1"),
        ({"jobAttempt": 2**63 - 1}, "jobAttempt: expected 0 to 9007199254740991, got"),
        ({"counts": {"restored": -2}}, "counts.restored: expected 0 to"),
        ({"lastCommittedBatch": -1}, "lastCommittedBatch: expected 0 to"),
        ({"nextCheckpointId": True}, "nextCheckpointId: expected an integer, got True"),
        ({"discardsDue": {}}, "discardsDue: expected a list, got {}"),
        ({"discardsDue": [3]}, "discardsDue[0]: expected an object, got 3"),
        (
            {"discardsDue": [{"kind": "savepoint", "id": 1}, {"kind": "image", "id": 2}]},
            "discardsDue[1].kind: expected one of checkpoint, savepoint, got 'image'",
        ),
        ({"discardsDue": [{"kind": "savepoint"}]}, "discardsDue[0].id: expected an integer"),
        ({"discardsDue": [{"kind": "checkpoint", "id": -4}]}, "discardsDue[0].id: expected 0 to"),
        (
            {"discardsDue": [{"kind": "checkpoint", "id": 4, "reason": 5}]},
            "discardsDue[0].reason: expected a string, got 5",
        ),
        ({"unrestorable": {}}, "unrestorable: expected a list, got {}"),
        ({"unrestorable": [5]}, "unrestorable[0]: expected an object, got 5"),
        ({"unrestorable": ["ab"]}, "unrestorable[0]: expected an object, got 'ab'"),
        # The CRD's schema lets an empty entry through; a restore's choice needs its source.
        ({"unrestorable": [{}]}, "unrestorable[0].source: missing"),
        (
            {"unrestorable": [{"source": "checkpoint:3", "reason": "x"}]},
            "unrestorable[0].attempt: missing",
        ),
        (
            {"unrestorable": [{"source": "checkpoint:3", "attempt": -1}]},
            "unrestorable[0].attempt: expected 0 to",
        ),
        (
            {"unrestorable": [{"source": "checkpoint:3", "attempt": 1, "permanent": "yes"}]},
            "unrestorable[0].permanent: expected a boolean, got 'yes'",
        ),
        (
            {"unrestorable": [{"source": 3, "attempt": 1}]},
            "unrestorable[0].source: expected a string, got 3",
        ),
        (
            {"coordinator": {"nextCheckpointId": 2**80}},
            "coordinator.nextCheckpointId: expected 1 to 9007199254740991",
        ),
        # `kubectl patch --subresource=status` removing the registry: read as a new job, its
        # first garbage collection deleted every image of the job's storage.
        ({"restartDue": "soon"}, "restartDue: expected a time as"),
        ({"nextPeriodicSavepoint": 3}, "nextPeriodicSavepoint: expected"),
        ({"restarts": -1}, "restarts: expected 0 to"),
        (
            {"phase": "Running", "jobAttempt": 3},
            "coordinator: missing beside phase, jobAttempt: the job's registry",
        ),
        (
            {
                "coordinator": {
                    **PersistedState(next_checkpoint_id=4).to_dict(),
                    "checkpoints": [_completed(CheckpointKind.CHECKPOINT, 4)],
                }
            },
            "coordinator.nextCheckpointId: 4 is not above the newest registered id, 4",
        ),
    ],
)
def test_a_count_out_of_range_is_named(written: dict[str, object], said: str) -> None:
    """Written by hand: one below 0 made the operator name a driver pod Kubernetes refuses,
    one at int64's end made its own next write of it fail. Other values are named too."""
    with pytest.raises(InvalidStatus) as refused:
        PersistedStatus.from_dict(written)
    assert str(refused.value).startswith(said), refused.value


def test_a_suspended_jobs_ready_names_the_image_it_resumes_from() -> None:
    """Its newest, or the image a restore chose while that choice is in force (not 'its
    newest image' while the chosen one is what a resume restores)."""

    def ready(record: JobRecord, **observed: Any) -> str:
        rendered = render_status(record, now=1_000.0, observed=Observed(**observed))
        (condition,) = [c for c in rendered["conditions"] if c["type"] == "Ready"]
        return str(condition["message"])

    record = JobRecord(phase=JobPhase.SUSPENDED)
    resumes = "at its next run (on this machine: spark-checkpoint run)"
    assert ready(record) == f"suspended; it resumes from its newest image {resumes}"
    record.restore_choice = RestoreChoice("savepoint:3", record.coordinator.completed_count)
    assert ready(record) == (
        f"suspended; it resumes from savepoint:3, the image chosen to restore {resumes}"
    )
    assert ready(record, resumes_from="savepoint:2 (a redeploy)", resumes="later") == (
        "suspended; it resumes from savepoint:2 (a redeploy) later"
    )
    # Lapsed (an image completed after it): the newest again.
    record.restore_choice = RestoreChoice("savepoint:3", record.coordinator.completed_count - 1)
    assert ready(record) == f"suspended; it resumes from its newest image {resumes}"


def test_the_savepoint_history_marks_the_savepoints_never_restored_again() -> None:
    """After a redeploy its newer savepoints are in status.unrestorable, yet
    savepointHistory (and a redeploy's choice from it) showed them as any other (a
    newcomer's)."""
    savepoints = tuple(
        CompletedCheckpoint(i, CheckpointKind.SAVEPOINT, i, f"file:///s/sp-{i}", 1, 1.0, 2.0)
        for i in (1, 2)
    )
    record = JobRecord(
        coordinator=PersistedState(next_checkpoint_id=3, savepoints=savepoints),
        unrestorable=[UnrestorableImage("savepoint:2", "newer than the redeploy's image", 1)],
    )

    shown = render_status(record, now=3.0)["savepointHistory"]

    assert [(s["id"], s.get("unrestorable")) for s in shown] == [(2, True), (1, None)]
