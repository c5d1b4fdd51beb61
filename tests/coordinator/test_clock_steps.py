"""The wall clock may step (an NTP correction, a resumed VM); deadlines, the periodic
schedule and the minimum pause run on the timer, a clock that never steps, as Flink's do.
The wall clock gives the times recorded and savepoint ages."""

import random

import pytest

from helpers.coordinator import TASKS, FakeClock, of_type
from spark_checkpoint_operator.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CheckpointFinalized,
    CheckpointKind,
    CoordinatorConfig,
    Effect,
    FailJob,
    JobPhase,
    JobPhaseChanged,
    TaskAck,
    TaskAcknowledged,
    TasksReported,
    Tick,
    TriggerCheckpoint,
    TriggerRequested,
)

CONFIG = CoordinatorConfig(interval=60.0, min_pause=0.0, timeout=600.0, tolerable_failures=0)


class SteppingJob:
    """A coordinator whose wall clock and timer are apart."""

    def __init__(self) -> None:
        self.wall = FakeClock()
        self.timer = FakeClock(1_000.0)
        self.coordinator = CheckpointCoordinator(
            CONFIG, clock=self.wall, timer=self.timer, rng=random.Random(3)
        )
        self.send(TasksReported(TASKS, all_running=True))
        self.send(JobPhaseChanged(JobPhase.RUNNING))

    def send(self, event: object) -> list[Effect]:
        return self.coordinator.handle(event)  # type: ignore[arg-type]

    def elapse(self, seconds: float, *, wall_step: float = 0.0) -> list[Effect]:
        self.timer.now += seconds
        self.wall.now += seconds + wall_step
        return self.send(Tick())


def test_a_wall_clock_stepped_forward_expires_no_healthy_checkpoint() -> None:
    """A checkpoint 5 s in, the wall clock 660 s ahead: it expired and failed a job that
    tolerates no failure (a Flink-rules review's)."""
    job = SteppingJob()
    job.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    (pending,) = job.coordinator.pending

    effects = job.elapse(5.0, wall_step=660.0)

    assert of_type(effects, AbortCheckpoint) == [] and of_type(effects, FailJob) == []
    assert job.coordinator.pending == (pending,)
    assert of_type(job.elapse(595.0), AbortCheckpoint) != [], "its own timeout still holds"


def test_a_wall_clock_stepped_back_holds_no_periodic_checkpoint() -> None:
    """Stepped back an hour, periodic triggers waited an hour of real time."""
    job = SteppingJob()  # the first periodic trigger is due within the interval, 60 s

    job.elapse(1.0, wall_step=-3600.0)
    effects = job.elapse(59.0)

    assert of_type(effects, TriggerCheckpoint) != []


def test_recorded_times_are_the_wall_clocks() -> None:
    job = SteppingJob()
    job.send(TriggerRequested(CheckpointKind.CHECKPOINT))
    (trigger,) = job.coordinator.pending
    assert trigger.trigger_time == job.wall.now
    job.elapse(2.0, wall_step=100.0)
    for task in sorted(TASKS):
        job.send(TaskAcknowledged(trigger.checkpoint_id, TaskAck(task, 3, 10, 1)))
    job.send(CheckpointFinalized(trigger.checkpoint_id, "file:///s/chk-1", 30))

    (completed,) = job.coordinator.persisted_state.checkpoints
    assert (completed.trigger_time, completed.completion_time) == (
        trigger.trigger_time,
        job.wall.now,
    )


def test_a_periodic_savepoint_is_due_on_the_timer_when_its_wall_clock_time_comes() -> None:
    """Periodic savepoints go by the wall clock (their last time is persisted), the adapter
    sleeps on the timer until `next_deadline`: the wall time converted. A wall clock stepped
    forward brings the savepoint nearer by the step (a mutation run found the conversion
    with two clocks untested)."""
    wall, timer = FakeClock(), FakeClock(1_000.0)
    config = CoordinatorConfig(interval=None, savepoint_interval=300.0)
    coordinator = CheckpointCoordinator(config, clock=wall, timer=timer, rng=random.Random(3))
    coordinator.handle(TasksReported(TASKS, all_running=True))
    coordinator.handle(JobPhaseChanged(JobPhase.RUNNING))
    assert coordinator.next_deadline() == pytest.approx(timer.now + 300.0)

    timer.now += 100.0
    wall.now += 100.0 + 50.0
    assert of_type(coordinator.handle(Tick()), TriggerCheckpoint) == []
    assert coordinator.next_deadline() == pytest.approx(timer.now + 150.0)

    timer.now += 150.0
    wall.now += 150.0
    (savepoint,) = of_type(coordinator.handle(Tick()), TriggerCheckpoint)
    assert savepoint.kind is CheckpointKind.SAVEPOINT
