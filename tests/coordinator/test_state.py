"""Persisted state: ids survive restarts, the registry round-trips, bad input is named."""

import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from helpers.coordinator import Harness, of_type
from spark_checkpoint_operator.coordinator import (
    CHECKPOINT_ID_BLOCK,
    CheckpointKind,
    CoordinatorConfig,
    InvalidPersistedState,
    PersistedState,
    PersistState,
    RetentionPolicy,
    SavepointHistoryLimits,
    TaskAck,
    TaskAcknowledged,
    TriggerCheckpoint,
    TriggerRequested,
)


def _run_some_checkpoints() -> Harness:
    harness = Harness(CoordinatorConfig(interval=None, retained=2, max_concurrent=2))
    harness.start()
    for kind in (CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT, CheckpointKind.CHECKPOINT):
        harness.send(TriggerRequested(kind, label=f"{kind}-label"))
        harness.complete(harness.coordinator.pending[-1].checkpoint_id)
    harness.send(TriggerRequested(CheckpointKind.CHECKPOINT))  # 4 stays pending
    return harness


def test_state_round_trips_through_its_dict_form() -> None:
    state = _run_some_checkpoints().coordinator.persisted_state
    assert PersistedState.from_dict(state.to_dict()) == state


def test_a_state_written_before_periodic_savepoints_is_read() -> None:
    data = _run_some_checkpoints().coordinator.persisted_state.to_dict()
    del data["lastPeriodicSavepoint"]
    assert PersistedState.from_dict(data).last_periodic_savepoint is None


def test_rebuilt_coordinator_never_reuses_an_id_and_keeps_the_registry() -> None:
    before = _run_some_checkpoints()
    state = PersistedState.from_dict(before.coordinator.persisted_state.to_dict())

    after = Harness(before.config, state=state, clock=before.clock)
    after.start()
    effects = after.send(TriggerRequested(CheckpointKind.CHECKPOINT))

    # Ids 1-4 came from the first block; the restarted coordinator opens the next one.
    assert [t.checkpoint_id for t in of_type(effects, TriggerCheckpoint)] == [
        CHECKPOINT_ID_BLOCK + 1
    ]
    assert [c.checkpoint_id for c in after.coordinator.restore_candidates()] == [3, 2, 1]
    # The checkpoint pending at the restart is gone; its late acks change nothing.
    assert after.send(TaskAcknowledged(4, TaskAck("logs", 1, 1, 1))) == []
    assert [p.checkpoint_id for p in after.coordinator.pending] == [CHECKPOINT_ID_BLOCK + 1]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("nextCheckpointId"), "nextCheckpointId: missing"),
        (
            lambda d: d.update(nextCheckpointId=0),
            "nextCheckpointId: expected 1 to 9007199254740991",
        ),
        (
            lambda d: d.update(nextCheckpointId=2**80),
            "nextCheckpointId: expected 1 to 9007199254740991",
        ),
        (
            lambda d: d.update(completedCount=2**53),
            "completedCount: expected 0 to 9007199254740991",
        ),
        (lambda d: d["checkpoints"][0].update(sizeBytes=-1), "checkpoints[0].sizeBytes"),
        (lambda d: d.update(nextCheckpointId="7"), "nextCheckpointId: expected an integer"),
        (lambda d: d["checkpoints"][0].update(kind="snapshot"), "checkpoints[0].kind"),
        (lambda d: d["savepoints"][0].update(triggerTime="yesterday"), "savepoints[0].triggerTime"),
        # A real time whose UTC is before year 1: read, it could never be written back.
        (
            lambda d: d["checkpoints"][0].update(completionTime="0001-01-01T00:00:00+23:59"),
            "checkpoints[0].completionTime",
        ),
        (
            lambda d: d["history"][0].update(endTime="9999-12-31T23:59:59-23:59"),
            "history[0].endTime",
        ),
        (lambda d: d["history"][1].update(reason="Gremlins"), "history[1].reason"),
        (lambda d: d.update(terminated="Exploded"), "terminated"),
        (lambda d: d.update(lastPeriodicSavepoint="soon"), "lastPeriodicSavepoint"),
    ],
)
def test_invalid_persisted_state_names_the_field(
    mutate: Callable[[dict[str, Any]], object], field: str
) -> None:
    data = _run_some_checkpoints().coordinator.persisted_state.to_dict()
    data["history"].append(dict(data["history"][0], status="Failed", reason="Expired"))
    mutate(data)
    with pytest.raises(InvalidPersistedState, match=re.escape(field)):
        PersistedState.from_dict(data)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"interval": 0}, "checkpointing.interval must be > 0"),
        ({"interval": 5, "min_pause": 6}, "minPause (6) must not exceed checkpointing.interval"),
        ({"timeout": 0}, "checkpointing.timeout must be > 0"),
        ({"max_concurrent": 0}, "checkpointing.maxConcurrent must be >= 1"),
        ({"tolerable_failures": -1}, "checkpointing.tolerableFailures must be >= 0"),
        ({"retained": 0}, "checkpointing.retained must be >= 1"),
        ({"retained": 2.0}, "checkpointing.retained must be an integer, got 2.0"),
        ({"retained": True}, "checkpointing.retained must be an integer, got True"),
        ({"max_concurrent": 1.5}, "checkpointing.maxConcurrent must be an integer, got 1.5"),
        ({"tolerable_failures": 0.0}, "checkpointing.tolerableFailures must be an integer"),
        ({"max_queued_requests": 9.0}, "max_queued_requests must be an integer"),
        ({"history_size": "10"}, "history_size must be an integer, got '10'"),
        ({"timeout": "60"}, "checkpointing.timeout must be a number of seconds, got '60'"),
        ({"min_pause": None}, "checkpointing.minPause must be a number of seconds, got None"),
        ({"interval": False}, "checkpointing.interval must be a number of seconds, got False"),
        ({"interval": math.nan}, "checkpointing.interval must be a number of seconds, got nan"),
        ({"timeout": math.inf}, "checkpointing.timeout must be a number of seconds, got inf"),
        ({"min_pause": -math.inf}, "checkpointing.minPause must be a number of seconds, got -inf"),
        ({"retention_policy": "RetainOnFailure"}, "checkpointing.retentionPolicy must be one of"),
        ({"savepoint_interval": 0}, "savepoints.interval must be > 0"),
        ({"savepoint_interval": "1h"}, "savepoints.interval must be a number of seconds"),
    ],
)
def test_invalid_config_names_the_setting(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        CoordinatorConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_count": 2.0}, "savepoints.historyMaxCount must be an integer, got 2.0"),
        ({"max_age_seconds": "1h"}, "savepoints.historyMaxAge must be a number of seconds"),
    ],
)
def test_invalid_savepoint_limits_name_the_setting(limits: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SavepointHistoryLimits(**limits)  # type: ignore[arg-type]


def test_a_float_retained_count_is_refused_before_any_checkpoint_completes() -> None:
    """``retained: 2.0`` once passed and crashed the coordinator at the first completion."""
    with pytest.raises(ValueError, match=re.escape("checkpointing.retained must be an integer")):
        Harness(CoordinatorConfig(interval=None, retained=2.0))  # type: ignore[arg-type]


def test_retention_policy_values_are_the_manifest_spelling() -> None:
    assert [p.value for p in RetentionPolicy] == [
        "NeverRetainAfterTermination",
        "RetainOnFailure",
        "RetainOnCancellation",
    ]


def test_a_replacing_coordinator_continues_the_live_counter_inside_the_reserved_block() -> None:
    # Each expires before the next is triggered: failures the job tolerates.
    config = CoordinatorConfig(interval=10.0, min_pause=0.0, timeout=60.0, tolerable_failures=5)
    first = Harness(config)
    first.start()
    triggered = [first.next_trigger().checkpoint_id for _ in range(3)]
    assert triggered == [1, 2, 3]

    replacing = Harness(
        config,
        state=first.coordinator.persisted_state,
        next_id=first.coordinator.next_checkpoint_id,
        clock=first.clock,
    )
    replacing.start()
    effects = replacing.advance_to_next_deadline() + replacing.advance_to_next_deadline()

    assert [t.checkpoint_id for t in of_type(effects, TriggerCheckpoint)][:1] == [4]
    assert of_type(effects, PersistState) == [], "4 is inside the block already reserved"


@pytest.mark.parametrize("next_id", [0, CHECKPOINT_ID_BLOCK + 2])
def test_a_live_counter_outside_the_reserved_ids_is_refused(next_id: int) -> None:
    state = PersistedState(next_checkpoint_id=CHECKPOINT_ID_BLOCK + 1)

    with pytest.raises(ValueError, match=f"next_id {next_id} is outside the reserved ids"):
        Harness(state=state, next_id=next_id)
