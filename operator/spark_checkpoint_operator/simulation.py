"""A coordinator run against a simulated driver on virtual time.

It shows the coordinator's rules at work (periodic triggers, acknowledgements, expiry,
tolerable failures, retention) without Spark: every snapshot task acknowledges after a
random delay, some decline or hang, and each completed checkpoint moves the batch on.
No agent protocol is spoken: the simulated tasks' acks and declines go to the
coordinator as its events (the HTTP-speaking stand-in for tests and benchmarks is
tests/helpers/kube/simulated.py's `SimulatedAgent`).
"""

import heapq
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from spark_checkpoint_operator.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CheckpointFinalized,
    CoordinatorConfig,
    DiscardCheckpoint,
    Effect,
    Event,
    FailJob,
    FinalizeCheckpoint,
    JobPhase,
    JobPhaseChanged,
    NotifyCheckpointComplete,
    RequestDeclined,
    TaskAck,
    TaskAcknowledged,
    TaskDeclined,
    TasksReported,
    Tick,
    TriggerCheckpoint,
)


@dataclass(frozen=True, slots=True)
class SimulatedDriver:
    """How the simulated driver behaves: its snapshot tasks and its batches' pace."""

    tasks: int = 4
    ack_delay: tuple[float, float] = (0.2, 3.0)
    decline_probability: float = 0.05
    hang_probability: float = 0.03
    batch_seconds: float = 2.0


@dataclass(order=True)
class _Scheduled:
    at: float
    order: int
    event: Event = field(compare=False)


def simulate(
    config: CoordinatorConfig,
    driver: SimulatedDriver,
    *,
    duration: float,
    seed: int,
    report: Callable[[float, str], None],
) -> CheckpointCoordinator:
    """Run ``duration`` virtual seconds and report each step; return the coordinator."""
    rng = random.Random(seed)
    now = 0.0
    coordinator = CheckpointCoordinator(config, clock=lambda: now, rng=rng)
    agenda: list[_Scheduled] = []
    counter = iter(range(1 << 62))
    tasks = frozenset({"logs", *(f"state-0-{p}" for p in range(driver.tasks - 1))})

    def schedule(at: float, event: Event) -> None:
        heapq.heappush(agenda, _Scheduled(at, next(counter), event))

    def carry_out(effects: list[Effect]) -> None:
        for line in _describe(effects):
            report(now, line)
        for effect in effects:
            match effect:
                case TriggerCheckpoint(checkpoint_id=cid, expected_tasks=expected):
                    batch = int(now // driver.batch_seconds) + 1
                    for task in sorted(expected):
                        roll = rng.random()
                        at = now + rng.uniform(*driver.ack_delay)
                        if roll < driver.decline_probability:
                            schedule(at, TaskDeclined(cid, task, "simulated I/O error"))
                        elif roll > driver.hang_probability + driver.decline_probability:
                            ack = TaskAck(task, batch, rng.randrange(1 << 20), 1)
                            schedule(at, TaskAcknowledged(cid, ack))
                case FinalizeCheckpoint(checkpoint_id=cid):
                    path = f"file:///simulated/chk-{cid}"
                    schedule(now + 0.05, CheckpointFinalized(cid, path, 4 << 20))
                case FailJob():
                    schedule(now, JobPhaseChanged(JobPhase.RESTARTING))
                    schedule(now + 5.0, JobPhaseChanged(JobPhase.RUNNING))

    carry_out(coordinator.handle(TasksReported(tasks, all_running=True)))
    carry_out(coordinator.handle(JobPhaseChanged(JobPhase.RUNNING)))
    while now < duration:
        deadline = coordinator.next_deadline()
        next_event_at = agenda[0].at if agenda else None
        candidates = [t for t in (deadline, next_event_at) if t is not None]
        if not candidates:
            break
        now = min(*candidates, duration)
        if next_event_at is not None and next_event_at <= now:
            carry_out(coordinator.handle(heapq.heappop(agenda).event))
        else:
            carry_out(coordinator.handle(Tick()))
    return coordinator


def _describe(effects: list[Effect]) -> Iterator[str]:
    for effect in effects:
        match effect:
            case TriggerCheckpoint(checkpoint_id=cid, kind=kind, expected_tasks=tasks):
                yield f"trigger {kind} {cid} ({len(tasks)} tasks)"
            case FinalizeCheckpoint(checkpoint_id=cid, batch_id=batch):
                yield f"all tasks acknowledged {cid}: writing _metadata (batch {batch})"
            case NotifyCheckpointComplete(checkpoint=done):
                yield (
                    f"completed {done.kind} {done.checkpoint_id} at batch {done.batch_id} "
                    f"in {done.duration:.2f}s"
                )
            case AbortCheckpoint(checkpoint_id=cid, kind=kind, message=message):
                yield f"aborted {kind} {cid}: {message}"
            case DiscardCheckpoint(checkpoint_id=cid):
                yield f"discard checkpoint {cid} (subsumed)"
            case RequestDeclined(request=request, reason=reason):
                yield f"declined {request.origin} {request.kind} request: {reason.description}"
            case FailJob(message=message):
                yield f"FAIL JOB: {message}"
