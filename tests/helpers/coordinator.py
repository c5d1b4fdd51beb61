"""A test driver for the coordinator core: a fake clock and helpers that play the agent."""

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from spark_checkpoint_operator.coordinator import (
    CHECKPOINT_ID_BLOCK,
    CheckpointCoordinator,
    CheckpointFinalized,
    CheckpointKind,
    CoordinatorConfig,
    Effect,
    Event,
    JobPhase,
    JobPhaseChanged,
    PersistedState,
    TaskAck,
    TaskAcknowledged,
    TasksReported,
    Tick,
    TriggerCheckpoint,
)

TASKS = frozenset({"logs", "state-0-0", "state-0-1"})
START = 1_800_000_000.0

_E = TypeVar("_E")


class FakeClock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def of_type(effects: Iterable[Effect], kind: type[_E]) -> list[_E]:
    return [e for e in effects if isinstance(e, kind)]


class Harness:
    def __init__(
        self,
        config: CoordinatorConfig | None = None,
        *,
        state: PersistedState | None = None,
        seed: int = 7,
        clock: FakeClock | None = None,
        id_block: int = CHECKPOINT_ID_BLOCK,
        next_id: int | None = None,
        unrestorable: Callable[[CheckpointKind, int], bool] = lambda kind, image_id: False,
    ) -> None:
        self.clock = clock or FakeClock()
        self.config = config or CoordinatorConfig(interval=10.0, min_pause=0.0, timeout=60.0)
        self.coordinator = CheckpointCoordinator(
            self.config,
            clock=self.clock,
            rng=random.Random(seed),
            state=state,
            id_block=id_block,
            next_id=next_id,
            unrestorable=unrestorable,
        )

    def send(self, event: Event) -> list[Effect]:
        return self.coordinator.handle(event)

    def start(self, tasks: frozenset[str] = TASKS) -> list[Effect]:
        effects = self.send(TasksReported(tasks, all_running=True))
        return effects + self.send(JobPhaseChanged(JobPhase.RUNNING))

    def advance(self, seconds: float) -> list[Effect]:
        self.clock.now += seconds
        return self.send(Tick())

    def advance_to_next_deadline(self) -> list[Effect]:
        deadline = self.coordinator.next_deadline()
        assert deadline is not None, "nothing scheduled"
        self.clock.now = max(self.clock.now, deadline)
        return self.send(Tick())

    def next_trigger(self) -> TriggerCheckpoint:
        """Advance until the periodic scheduler triggers a checkpoint."""
        for _ in range(10):
            triggers = of_type(self.advance_to_next_deadline(), TriggerCheckpoint)
            if triggers:
                return triggers[0]
        raise AssertionError("no trigger")

    def ack_all(
        self, checkpoint_id: int, batch_id: int = 3, tasks: frozenset[str] = TASKS
    ) -> list[Effect]:
        effects: list[Effect] = []
        for task in sorted(tasks):
            ack = TaskAck(task=task, batch_id=batch_id, size_bytes=100, duration_ms=5)
            effects += self.send(TaskAcknowledged(checkpoint_id, ack))
        return effects

    def complete(self, checkpoint_id: int, batch_id: int = 3) -> list[Effect]:
        effects = self.ack_all(checkpoint_id, batch_id)
        return effects + self.send(
            CheckpointFinalized(checkpoint_id, f"file:///store/chk-{checkpoint_id}", 300)
        )


@dataclass(frozen=True)
class Aligned:
    """A calendar schedule of periodic savepoints (as a cron expression's times): each
    whole multiple of ``period`` seconds."""

    period: int

    def next_after(self, wall_time: float) -> float:
        return float((math.floor(wall_time / self.period) + 1) * self.period)
