"""How the supervisor carries effects out and tells the coordinator the job's phase, as
the driver's agent sees it.

Effects run from one queue in the order the coordinator produced them; an effect whose
outcome is an event for the coordinator (a finalized checkpoint, a phase change) queues
that event's effects after those already queued, never inside the effect that caused it.
The coordinator is told one phase, derived from the job's and its attempt's, also when new
settings replace it.
"""

import asyncio
from dataclasses import replace

from helpers.fake_driver import STORAGE, FakeAgent, FakeLauncher, NoJanitor, until
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import AgentStatus, FinalizeAnswer, QueryState
from spark_checkpoint_operator.coordinator import (
    AfterCompletion,
    CheckpointKind,
    CoordinatorConfig,
    JobPhase,
    SavepointHistoryLimits,
    TerminalOutcome,
    TriggerRequested,
)
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor


class RecordingAgent(FakeAgent):
    """Notes the calls that carry effects out, in order; a checkpoint's tasks never
    acknowledge it (it stays pending)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        await super().trigger(checkpoint_id, kind, after)
        if kind is CheckpointKind.CHECKPOINT:
            self.snapshots[checkpoint_id] = replace(self.snapshots[checkpoint_id], acks=())

    async def finalize(
        self, checkpoint_id: int, tasks: list[str], *, waits: float = 0.0
    ) -> FinalizeAnswer:
        self.calls.append(("finalize", checkpoint_id))
        return await super().finalize(checkpoint_id, tasks)

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        self.calls.append(("complete", checkpoint_id))
        await super().complete(checkpoint_id, batch_id)

    async def abort(self, checkpoint_id: int, reason: str) -> None:
        self.calls.append(("abort", checkpoint_id))
        await super().abort(checkpoint_id, reason)

    async def discard_savepoint(self, savepoint_id: int) -> None:
        self.calls.append(("discard savepoint", savepoint_id))
        await super().discard_savepoint(savepoint_id)


def _supervisor(launcher: FakeLauncher, config: CoordinatorConfig) -> JobSupervisor:
    async def save(record: JobRecord) -> None:
        return None

    return JobSupervisor(
        storage=STORAGE,
        config=config,
        restart_policy=RestartPolicySpec(RestartPolicyType.NEVER, 0, 0.01, 0.05),
        launcher=launcher,
        janitor=NoJanitor(),
        save=save,
        record=JobRecord(),
    )


def test_a_phase_change_fed_back_by_a_completion_runs_after_the_completions_discards() -> None:
    """A stop-with-savepoint completes while a checkpoint is pending: its finalization
    feeds back ``CheckpointFinalized``, whose effects are [persist, notify complete,
    discard the savepoint that fell out of the history]; notifying it feeds back the
    phase change to Suspending, whose effect is aborting the pending checkpoint. That
    abort comes after the discard queued before it, not in the middle of the
    notification."""
    config = CoordinatorConfig(
        interval=None, timeout=30.0, savepoint_history=SavepointHistoryLimits(max_count=1)
    )

    async def scenario() -> tuple[TerminalOutcome, RecordingAgent]:
        launcher = FakeLauncher()
        launcher.agent_class = RecordingAgent
        supervisor = _supervisor(launcher, config)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        agent = launcher.drivers[0].agent
        assert isinstance(agent, RecordingAgent)
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: len(supervisor.record.coordinator.savepoints) == 1)
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: agent.triggers == [1, 2])
        agent.calls.clear()
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.STOP))
        await until(lambda: len(agent.calls) == 4)
        launcher.drivers[0].code = DriverExit.STOPPED_WITH_SAVEPOINT
        return await run, agent

    outcome, agent = asyncio.run(scenario())
    assert outcome is TerminalOutcome.SUSPENDED
    assert agent.calls == [
        ("finalize", 3),
        ("complete", 3),
        ("discard savepoint", 1),
        ("abort", 2),
    ]


class BoundedAgent(FakeAgent):
    """Bounded input read to its end: the query waits for its final checkpoint and, once
    told of it, stays until the test lets the driver exit."""

    def __init__(self) -> None:
        super().__init__()
        self.notified: int | None = None

    def _status(self) -> AgentStatus:
        document = super()._status()
        return replace(
            document,
            query=replace(document.query, state=QueryState.FINISHED),
            awaiting_final_checkpoint=self.notified is None or self.notified < self.batch,
        )

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        await super().complete(checkpoint_id, batch_id)
        self.notified = batch_id


def test_new_settings_trigger_nothing_while_the_driver_exits_after_its_final_checkpoint() -> None:
    async def scenario() -> tuple[TerminalOutcome, FakeAgent]:
        launcher = FakeLauncher()
        launcher.agent_class = BoundedAgent
        supervisor = _supervisor(launcher, CoordinatorConfig(interval=None, timeout=30.0))
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and launcher.drivers[0].agent.completed)
        agent = launcher.drivers[0].agent
        supervisor.reconfigure(CoordinatorConfig(interval=0.1, timeout=30.0))
        await asyncio.sleep(1.0)
        launcher.drivers[0].code = DriverExit.FINISHED
        return await run, agent

    outcome, agent = asyncio.run(scenario())
    assert outcome is TerminalOutcome.FINISHED
    assert agent.triggers == [1], "only the final checkpoint: the driver is exiting"
