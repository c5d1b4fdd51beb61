"""What a clean finish of bounded input tells the user: its final checkpoint, and no
failure. The agent behaves as a real one at the end: it reports the exhausted input, and
once told of the final checkpoint its driver exits, cutting the completion call short and
leaving the agent unreachable while the JVM stops."""

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from helpers.fake_driver import (
    STORAGE,
    TASKS,
    FakeAgent,
    FakeDriver,
    FakeLauncher,
    NoJanitor,
    until,
)
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import (
    AckReport,
    AfterCompletion,
    AgentStatus,
    CheckpointKind,
    DeclineReport,
    FinalizeAnswer,
    QueryState,
    RestoreCandidate,
    RestoredFrom,
    SkippedImage,
    SnapshotPhase,
    SnapshotStatus,
)
from spark_checkpoint_operator.agent_client import (
    AgentAnswerTimedOut,
    AgentRejected,
    AgentUnavailable,
)
from spark_checkpoint_operator.coordinator import (
    CompletedCheckpoint,
    CoordinatorConfig,
    JobPhase,
    PersistedState,
    TerminalOutcome,
    TriggerRequested,
)
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor, Level, Notice
from spark_checkpoint_operator.supervisor import attempt as attempt_module

JVM_SHUTDOWN_SECONDS = 1.5


class FinishingAgent(FakeAgent):
    def __init__(self) -> None:
        super().__init__()
        self.exhausted = False
        self.notified: int | None = None
        self.driver: FakeDriver | None = None

    def _status(self) -> AgentStatus:
        document = super()._status()
        if self.exhausted:
            document = replace(
                document,
                query=replace(document.query, state=QueryState.FINISHED),
                awaiting_final_checkpoint=self.notified is None or self.notified < self.batch,
            )
        return document

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        await super().complete(checkpoint_id, batch_id)
        self.notified = batch_id
        if self.exhausted and batch_id >= self.batch:
            # The driver got it and exits before the answer is written.
            self.reachable = False
            asyncio.get_running_loop().call_later(JVM_SHUTDOWN_SECONDS, self._exit)
            raise AgentUnavailable("Connection reset by peer")

    def _exit(self) -> None:
        assert self.driver is not None
        self.driver.code = DriverExit.FINISHED


class FinishingLauncher(FakeLauncher):
    def __init__(self, agent_class: type[FinishingAgent] = FinishingAgent) -> None:
        super().__init__()
        self.finishing_agent = agent_class

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = FakeDriver(self.finishing_agent())
        driver.agent.driver = driver
        self.drivers.append(driver)
        return driver


def _job(
    launcher: FakeLauncher,
    notices: list[Notice],
    config: CoordinatorConfig,
    restart_policy: RestartPolicySpec,
    *,
    janitor: NoJanitor | None = None,
    record: JobRecord | None = None,
) -> JobSupervisor:
    async def save(record: JobRecord) -> None:
        return None

    return JobSupervisor(
        storage=STORAGE,
        config=config,
        restart_policy=restart_policy,
        launcher=launcher,
        janitor=janitor or NoJanitor(),
        save=save,
        record=record or JobRecord(),
        report=notices.append,
    )


def _checkpointing_often(
    launcher: FakeLauncher, notices: list[Notice], janitor: NoJanitor | None = None
) -> JobSupervisor:
    return _job(
        launcher,
        notices,
        CoordinatorConfig(interval=0.1, min_pause=0.0, timeout=5.0, retained=1),
        RestartPolicySpec(RestartPolicyType.ON_FAILURE, 3, 0.01, 0.05),
        janitor=janitor,
    )


def _finish(
    launcher: FakeLauncher, end_input: Callable[[FakeAgent], None], janitor: NoJanitor | None = None
) -> list[Notice]:
    """Runs a job until it ends, calling ``end_input`` on its agent once two checkpoints
    completed; the job must finish. Periodic checkpoints go as often as they can: one is
    due while the driver exits."""
    notices: list[Notice] = []

    async def scenario() -> TerminalOutcome:
        supervisor = _checkpointing_often(launcher, notices, janitor)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        end_input(launcher.drivers[0].agent)
        return await run

    assert asyncio.run(scenario()) is TerminalOutcome.FINISHED
    return notices


def test_a_clean_finish_reports_no_failure_and_says_what_the_runtime_did_instead() -> None:
    def end_input(agent: FakeAgent) -> None:
        assert isinstance(agent, FinishingAgent)
        agent.batch += 1  # the last batch: the checkpoints so far do not cover it
        agent.exhausted = True

    launcher, janitor = FinishingLauncher(), NoJanitor()
    notices = _finish(launcher, end_input, janitor)
    lines = [notice.message for notice in notices]
    assert [n for n in notices if n.level is Level.WARNING] == [], "\n".join(lines)
    assert not [line for line in lines if "failed" in line or "not delivered" in line], lines
    # A discard or an abort the exiting driver no longer takes is not reported (the janitor
    # does the discard): nothing reads as trouble.
    assert not [line for line in lines if "did not take" in line], lines
    agent = launcher.drivers[0].agent
    # Each discarded once (RetainOnFailure: a finished job keeps none), by the janitor once
    # the driver exits.
    assert sorted(agent.discarded + janitor.discarded) == agent.completed
    assert janitor.discarded == agent.completed[-2:]
    final = next(n for n in notices if "(final)" in n.message)
    assert final.reason == "CheckpointCompleted"
    final_id = final.message.split()[1]
    assert (
        f"the driver did not confirm the completion of checkpoint {final_id} (Connection reset "
        f"by peer); nothing is lost: checkpoint {final_id} is registered, and sinks commit up "
        "to it when a driver restores it"
    ) in lines
    assert lines[-1] == "job finished"


class ToldEarlyAgent(FakeAgent):
    """Told of a checkpoint covering its last batch while the query still ran: once the
    query ends the driver has nothing to wait for and exits. A checkpoint of that same
    batch, acknowledged just before, completes after the agent stopped listening."""

    def __init__(self) -> None:
        super().__init__()
        self.last_batch: int | None = None
        self.told_end = False
        self.ended = False
        self.driver: FakeDriver | None = None

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        await super().trigger(checkpoint_id, kind, after)
        # The query ends just after this snapshot of its last batch was acknowledged.
        self.ended = self.told_end

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        if self.ended:
            self.reachable = False
            asyncio.get_running_loop().call_later(JVM_SHUTDOWN_SECONDS, self._exit)
            raise AgentUnavailable("POST /v1/complete: cannot connect to 127.0.0.1:1 (refused)")
        await super().complete(checkpoint_id, batch_id)
        self.told_end = self.last_batch is not None and batch_id >= self.last_batch

    def _status(self) -> AgentStatus:
        document = super()._status()
        if self.ended:  # nothing to wait for
            document = replace(document, query=replace(document.query, state=QueryState.FINISHED))
        return document

    def _exit(self) -> None:
        assert self.driver is not None
        self.driver.code = DriverExit.FINISHED


class ToldEarlyLauncher(FakeLauncher):
    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = FakeDriver(ToldEarlyAgent())
        driver.agent.driver = driver
        self.drivers.append(driver)
        return driver


def test_a_checkpoint_of_a_batch_the_driver_was_told_of_needs_no_confirmation() -> None:
    def end_input(agent: FakeAgent) -> None:
        assert isinstance(agent, ToldEarlyAgent)
        agent.batch += 1
        agent.last_batch = agent.batch

    notices = _finish(ToldEarlyLauncher(), end_input)
    lines = [notice.message for notice in notices]
    assert not [line for line in lines if "did not confirm" in line or "fail" in line], lines
    assert lines[-1] == "job finished"


class CommitFailsOnceAgent(FinishingAgent):
    """Bounded input done; the first completion of its final checkpoint fails in a
    participant (the agent's 500: a sink's commit raised); once told, the driver exits."""

    def __init__(self) -> None:
        super().__init__()
        self.exhausted = True
        self.complete_calls = 0

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        self.complete_calls += 1
        if self.complete_calls == 1:
            raise AgentRejected(
                f"POST /v1/checkpoints/{checkpoint_id}/complete: 500 participant "
                "TransactionalFileSink did not commit batch 3: OSError: throttled"
            )
        await FakeAgent.complete(self, checkpoint_id, batch_id)
        self.notified = batch_id
        assert self.driver is not None
        self.driver.code = DriverExit.FINISHED


def _bounded_job(
    launcher: FakeLauncher, notices: list[Notice], record: JobRecord | None = None
) -> JobSupervisor:
    return _job(
        launcher,
        notices,
        CoordinatorConfig(interval=None, timeout=2.0),
        RestartPolicySpec(RestartPolicyType.ON_FAILURE, 3, 0.01, 0.05, heartbeat_timeout=1.0),
        record=record,
    )


def test_a_final_completion_the_driver_refused_is_sent_again_and_the_job_finishes() -> None:
    """The driver waits for its final checkpoint's completion until it takes one: a
    completion refused once (a sink's commit failed) was never sent again, and the job hung
    (a reviewer)."""
    launcher = FakeLauncher()
    launcher.agent_class = CommitFailsOnceAgent
    notices: list[Notice] = []

    async def scenario() -> TerminalOutcome:
        supervisor = _bounded_job(launcher, notices)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers))
        agent = launcher.drivers[0].agent
        assert isinstance(agent, CommitFailsOnceAgent)
        agent.driver = launcher.drivers[0]
        return await asyncio.wait_for(run, 20.0)

    assert asyncio.run(scenario()) is TerminalOutcome.FINISHED
    (driver,) = launcher.drivers
    assert driver.agent.complete_calls == 2  # type: ignore[attr-defined]
    assert "did not commit batch 3" in next(
        n.message for n in notices if n.reason == "CompletionNotDelivered"
    )


class HangsOnceToldAgent(FinishingAgent):
    """Input done; once told of its final checkpoint the driver hangs (Spark's stop
    blocks) and its agent stops answering."""

    def __init__(self) -> None:
        super().__init__()
        self.exhausted = True

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        await FakeAgent.complete(self, checkpoint_id, batch_id)
        self.notified = batch_id
        self.reachable = False


class RefusesEveryCompletionAgent(HangsOnceToldAgent):
    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        raise AgentRejected("500 participant TransactionalFileSink: OSError: disk full")


@pytest.mark.parametrize(
    ("agent_class", "outcome", "restarts"),
    [
        (HangsOnceToldAgent, TerminalOutcome.FINISHED, 0),
        (RefusesEveryCompletionAgent, None, 1),
    ],
)
def test_a_driver_that_does_not_exit_after_its_final_checkpoint_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
    agent_class: type[HangsOnceToldAgent],
    outcome: TerminalOutcome | None,
    restarts: int,
) -> None:
    """A driver told of its final checkpoint that hangs on its way out was waited for
    for ever (a stop-with-savepoint's was stopped; a reviewer): stopped, it finished. One
    whose sinks never take the completion is stopped and restarts (its restore commits what
    the checkpoint covers)."""
    monkeypatch.setattr(attempt_module, "STOPPED_DRIVER_EXIT_SECONDS", 0.5)
    launcher = FakeLauncher()
    launcher.agent_class = agent_class
    notices: list[Notice] = []

    async def scenario() -> TerminalOutcome | None:
        supervisor = _bounded_job(launcher, notices)
        run = asyncio.create_task(supervisor.run())
        if outcome is not None:
            return await asyncio.wait_for(run, 20.0)
        await until(lambda: len(launcher.drivers) >= 2, timeout=20.0)
        supervisor.cancel()
        await run
        return None

    assert asyncio.run(scenario()) is outcome
    assert launcher.drivers[0].code == -15, "stopped from here"
    assert len(launcher.drivers) >= 1 + restarts
    stopped = next(n for n in notices if n.reason == "StopTimedOut")
    assert stopped.level is Level.WARNING
    if restarts:
        assert "did not take its final checkpoint's completion" in stopped.message
    else:
        assert "did not exit after its final checkpoint completed" in stopped.message


def test_a_stop_while_the_driver_finishes_is_kept_when_the_driver_then_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C, `stop` or a suspension while the driver finished (what each does: the stop
    is recorded, the driver left to exit), and its sinks never take the completion: it was
    stopped as overdue and restarted, though the user had asked to stop (a reviewer's)."""
    monkeypatch.setattr(attempt_module, "STOPPED_DRIVER_EXIT_SECONDS", 0.5)
    launcher = FakeLauncher()
    launcher.agent_class = RefusesEveryCompletionAgent
    notices: list[Notice] = []

    async def scenario() -> TerminalOutcome:
        supervisor = _bounded_job(launcher, notices)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.finishing)
        supervisor.end_suspended()
        return await asyncio.wait_for(run, 20.0)

    assert asyncio.run(scenario()) is TerminalOutcome.SUSPENDED
    assert len(launcher.drivers) == 1, "restarted after the stop"
    stopped = next(n for n in notices if n.reason == "StopTimedOut")
    assert stopped.message.endswith("the next run's sinks commit what that checkpoint covers.")


def test_a_finishing_driver_whose_agent_stops_answering_leaves_the_job_running() -> None:
    """The driver stops answering as it exits after its final checkpoint: the job went
    back to Deploying ("Spark is starting" on the live line) until it ended, and a Ctrl-C
    then took it for a query not running yet and stopped the driver (a newcomer's)."""

    async def scenario() -> set[JobPhase]:
        launcher = FinishingLauncher()
        supervisor = _checkpointing_often(launcher, [])
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        agent = launcher.drivers[0].agent
        assert isinstance(agent, FinishingAgent) and agent.batch is not None
        agent.batch += 1
        agent.exhausted = True
        await until(lambda: supervisor.finishing)
        phases = set()
        while launcher.drivers[0].code is None:  # the JVM shutting down
            phases.add(supervisor.record.phase)
            await asyncio.sleep(0.02)
        assert await run is TerminalOutcome.FINISHED
        return phases

    assert asyncio.run(scenario()) == {JobPhase.RUNNING}


class SlowJanitor(NoJanitor):
    """Its cleanup pods take a while."""

    async def collect_garbage(self, checkpoints: list[int], savepoints: list[int]) -> None:
        await asyncio.sleep(1.0)


def test_a_job_whose_driver_exited_finished_is_finishing_until_it_ends() -> None:
    """Between the driver's exit and the job's end (its cleanup), a stop found nothing
    finishing: Ctrl-C said a savepoint could not be taken and the next run resumes, and on
    Kubernetes a suspension stopped the job as not running."""
    notices: list[Notice] = []

    async def scenario() -> bool:
        launcher = FinishingLauncher()
        supervisor = _checkpointing_often(launcher, notices, SlowJanitor())
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        agent = launcher.drivers[0].agent
        assert isinstance(agent, FinishingAgent) and agent.batch is not None
        agent.batch += 1
        agent.exhausted = True
        await until(lambda: launcher.drivers[0].code is not None)
        await asyncio.sleep(0.3)  # the exit noticed, the cleanup under way
        finishing = not run.done() and supervisor.finishing
        assert await run is TerminalOutcome.FINISHED
        return finishing

    assert asyncio.run(scenario())


def _checkpoint(checkpoint_id: int, batch_id: int) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id,
        CheckpointKind.CHECKPOINT,
        batch_id,
        f"file:///s/chk-{checkpoint_id}",
        20,
        0.0,
        1.0,
    )


class RestoredAnOlderImageAgent(FinishingAgent):
    """Input done at batch 5. Its restore skipped checkpoint 10 (batch 5: the final
    checkpoint of the driver before, registered before that driver was told of it) and took
    checkpoint 9 (batch 2). As the agent, it completes only what it finalized (404)."""

    def __init__(self) -> None:
        super().__init__()
        self.exhausted = True
        self.batch = 5
        self.restored_from = RestoredFrom(
            RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 9),
            2,
            (
                SkippedImage(
                    RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 10), "unreadable"
                ),
            ),
        )
        self.finalized: set[int] = set()
        self.refused: list[int] = []

    async def finalize(
        self, checkpoint_id: int, tasks: list[str], *, waits: float = 0.0
    ) -> FinalizeAnswer:
        self.finalized.add(checkpoint_id)
        return await super().finalize(checkpoint_id, tasks, waits=waits)

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        if checkpoint_id not in self.finalized:
            self.refused.append(checkpoint_id)
            raise AgentRejected(
                f"POST /v1/checkpoints/{checkpoint_id}/complete: 404 checkpoint "
                f"{checkpoint_id} is unknown"
            )
        await super().complete(checkpoint_id, batch_id)


def test_a_final_checkpoint_the_driver_did_not_take_is_not_what_it_is_told_of() -> None:
    """A registered checkpoint covering the input's end that the driver neither took nor
    restored (its restore skipped it) was sent as its final completion, refused (404) every
    second, the driver stopped as overdue and restarted, the same again, for ever (a
    reviewer): a final checkpoint of its own is taken."""
    launcher = FinishingLauncher(RestoredAnOlderImageAgent)
    notices: list[Notice] = []
    registry = PersistedState(
        next_checkpoint_id=11, checkpoints=(_checkpoint(9, 2), _checkpoint(10, 5))
    )

    async def scenario() -> TerminalOutcome:
        supervisor = _bounded_job(launcher, notices, JobRecord(coordinator=registry))
        return await asyncio.wait_for(supervisor.run(), 10.0)

    assert asyncio.run(scenario()) is TerminalOutcome.FINISHED
    (driver,) = launcher.drivers
    assert isinstance(driver.agent, RestoredAnOlderImageAgent)
    assert driver.agent.refused == []
    assert driver.agent.notified == 5
    assert [n for n in notices if n.reason == "StopTimedOut"] == []


class SlowCommitAgent(CommitFailsOnceAgent):
    """Input done; the final completion's sink commit outlasts the client's timeout (its
    answer times out) and ends two seconds later, when the driver exits."""

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        self.complete_calls += 1
        assert self.driver is not None
        asyncio.get_running_loop().call_later(2.0, setattr, self.driver, "code", 0)
        raise AgentAnswerTimedOut(f"POST /v1/checkpoints/{checkpoint_id}/complete: no answer")


def test_a_final_completion_whose_answer_timed_out_is_not_sent_again() -> None:
    """Sent again every second, a completion still under way ran beside itself in the
    agent, each a participant's commit of the same batch (a reviewer)."""
    launcher = FinishingLauncher(SlowCommitAgent)
    notices: list[Notice] = []

    async def scenario() -> TerminalOutcome:
        return await asyncio.wait_for(_bounded_job(launcher, notices).run(), 20.0)

    assert asyncio.run(scenario()) is TerminalOutcome.FINISHED
    (driver,) = launcher.drivers
    assert driver.agent.complete_calls == 1  # type: ignore[attr-defined]


class DrainingAgent(FinishingAgent):
    """Bounded input with batches left: a drain savepoint waits while the input runs out,
    and captures two statuses after that (the agent's drain waits for no input to be left,
    then for its batch); told of it, the driver stops."""

    def __init__(self) -> None:
        super().__init__()
        self.drains: list[int] = []
        self.final_checkpoints: list[int] = []
        self.statuses_exhausted = 0

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        if after is not AfterCompletion.DRAIN:
            if self.exhausted:
                self.final_checkpoints.append(checkpoint_id)
            await super().trigger(checkpoint_id, kind, after)
            return
        self.triggers.append(checkpoint_id)
        self.drains.append(checkpoint_id)
        self.snapshots[checkpoint_id] = SnapshotStatus(
            checkpoint_id, kind, SnapshotPhase.CAPTURING, None
        )
        self.exhausted = True

    def _status(self) -> AgentStatus:
        if self.exhausted:
            self.statuses_exhausted += 1
        if self.statuses_exhausted > 2:
            self._capture_held(self.drains)
        return super()._status()

    def _capture_held(self, checkpoint_ids: list[int]) -> None:
        """Those of ``checkpoint_ids`` still capturing are acknowledged at the batch now."""
        for checkpoint_id in checkpoint_ids:
            held = self.snapshots.get(checkpoint_id)
            if held is not None and held.state is SnapshotPhase.CAPTURING:
                acks = tuple(AckReport(task, self.batch, 10, 1) for task in TASKS)
                self.snapshots[checkpoint_id] = replace(
                    held, state=SnapshotPhase.ACKNOWLEDGED, batch_id=self.batch, acks=acks
                )

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        if checkpoint_id not in self.drains:
            await super().complete(checkpoint_id, batch_id)
            return
        await FakeAgent.complete(self, checkpoint_id, batch_id)
        assert self.driver is not None
        self.driver.code = DriverExit.STOPPED_WITH_SAVEPOINT


class SlowToStopDrainingAgent(DrainingAgent):
    """Told of its drain savepoint, the driver takes a while to stop (Spark's shutdown), its
    agent answering meanwhile that the input is done and waits for its final checkpoint."""

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        if checkpoint_id not in self.drains:
            await super().complete(checkpoint_id, batch_id)
            return
        await FakeAgent.complete(self, checkpoint_id, batch_id)
        asyncio.get_running_loop().call_later(JVM_SHUTDOWN_SECONDS, self._stopped)

    def _stopped(self) -> None:
        assert self.driver is not None
        self.driver.code = DriverExit.STOPPED_WITH_SAVEPOINT


@pytest.mark.parametrize("agent_class", [DrainingAgent, SlowToStopDrainingAgent])
def test_a_drain_whose_input_runs_out_ends_with_its_savepoint(
    agent_class: type[DrainingAgent],
) -> None:
    """The final checkpoint of the input that ran out came first: the job Finished and the
    drain savepoint the user asked for was given up (`stop --drain` said 'savepoint N
    failed', exit 1, on the user guide's example: a newcomer). Once the savepoint
    completed, a final checkpoint was still asked for while the driver stopped, and
    declined with a wrong reason ('not all required tasks are running': a newcomer)."""
    launcher = FinishingLauncher(agent_class)
    notices: list[Notice] = []

    async def scenario() -> TerminalOutcome:
        supervisor = _bounded_job(launcher, notices)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        supervisor.request(
            TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.DRAIN, label="stop")
        )
        return await asyncio.wait_for(run, 10.0)

    assert asyncio.run(scenario()) is TerminalOutcome.SUSPENDED
    (driver,) = launcher.drivers
    assert isinstance(driver.agent, DrainingAgent)
    assert driver.agent.final_checkpoints == []
    (savepoint,) = driver.agent.drains
    assert driver.agent.completed == [savepoint]
    assert [n.message for n in notices if n.reason in ("FinalCheckpoint", "RequestDeclined")] == []


class CheckpointBeforeTheDrainAgent(DrainingAgent):
    """A checkpoint triggered before the drain savepoint (a final or a user's one) is
    captured once the drain came and the input ran out, and completes before the drain
    savepoint, captured only then. Told of it, the driver waits for the stop-with-savepoint
    in flight (as the agent does): it stops once told of that, finishes if it is aborted."""

    input_ran_out_first = False

    def __init__(self) -> None:
        super().__init__()
        self.exhausted = self.input_ran_out_first
        self.checkpoints: list[int] = []
        self.drain_aborted = False

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        if after is not AfterCompletion.CONTINUE or self.drains:
            await super().trigger(checkpoint_id, kind, after)
            return
        self.checkpoints.append(checkpoint_id)
        self.triggers.append(checkpoint_id)
        self.snapshots[checkpoint_id] = SnapshotStatus(
            checkpoint_id, kind, SnapshotPhase.CAPTURING, None
        )

    def _status(self) -> AgentStatus:
        if self.drains:
            self._capture_held(self.checkpoints)
            if not set(self.checkpoints) <= set(self.completed):
                self.statuses_exhausted = 0  # the drain's capture comes after
        return super()._status()

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        if checkpoint_id not in self.checkpoints:
            await super().complete(checkpoint_id, batch_id)
            return
        await FakeAgent.complete(self, checkpoint_id, batch_id)
        self.notified = batch_id  # the driver waits on while a drain is in flight
        self._finish_if_told()

    async def abort(self, checkpoint_id: int, reason: str) -> None:
        await super().abort(checkpoint_id, reason)
        if checkpoint_id in self.drains:
            self.drain_aborted = True
            self._finish_if_told()

    def _finish_if_told(self) -> None:
        """The driver finishes once told of its last batch, with no drain in flight."""
        told = self.notified is not None and self.batch is not None and self.notified >= self.batch
        if self.drain_aborted and told and self.driver is not None:
            self.driver.code = DriverExit.FINISHED


class FinalCheckpointBeforeTheDrainAgent(CheckpointBeforeTheDrainAgent):
    input_ran_out_first = True


def _drain_after_a_checkpoint(
    launcher: FinishingLauncher,
    agent_class: type[CheckpointBeforeTheDrainAgent],
    notices: list[Notice],
) -> TerminalOutcome:
    """A bounded job asked for a checkpoint (unless its input ran out first: its final
    one), then, once that was triggered, for a drain savepoint (stop --drain)."""

    async def scenario() -> TerminalOutcome:
        supervisor = _bounded_job(launcher, notices)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers))
        if not agent_class.input_ran_out_first:
            await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
            supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: launcher.drivers[0].agent.triggers != [])
        supervisor.request(
            TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.DRAIN, label="stop")
        )
        return await asyncio.wait_for(run, 10.0)

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    "agent_class", [CheckpointBeforeTheDrainAgent, FinalCheckpointBeforeTheDrainAgent]
)
def test_a_drain_ends_with_its_savepoint_when_a_checkpoint_covering_the_end_came_first(
    agent_class: type[CheckpointBeforeTheDrainAgent],
) -> None:
    """The job Finished and gave up the drain savepoint the user asked for: the status of a
    driver told of its last batch was taken for one about to exit (a reviewer), or the
    final checkpoint already under way ended the job."""
    launcher, notices = FinishingLauncher(agent_class), []
    outcome = _drain_after_a_checkpoint(launcher, agent_class, notices)
    (driver,) = launcher.drivers
    assert isinstance(driver.agent, CheckpointBeforeTheDrainAgent)
    assert driver.agent.completed == [*driver.agent.checkpoints, *driver.agent.drains]
    assert outcome is TerminalOutcome.SUSPENDED, [n.message for n in notices]


class DeclinedDrainAgent(CheckpointBeforeTheDrainAgent):
    """As its base, but the drain savepoint is declined once the checkpoint before it
    completed (``refuse_first_completion``: whose first completion a sink's commit refused)."""

    refuse_first_completion = False

    def __init__(self) -> None:
        super().__init__()
        self.refused: list[int] = []

    def _status(self) -> AgentStatus:
        if self.drains and set(self.checkpoints) <= set(self.completed):
            self.statuses_exhausted = -1000  # never captured: declined
            for checkpoint_id in self.drains:
                if (held := self.snapshots.get(checkpoint_id)) is not None and not held.declines:
                    declined = (DeclineReport("logs", "no space left on device"),)
                    self.snapshots[checkpoint_id] = replace(held, declines=declined)
        return super()._status()

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        if self.refuse_first_completion and checkpoint_id in self.checkpoints and not self.refused:
            self.refused.append(checkpoint_id)
            self.snapshots.pop(checkpoint_id, None)  # completed, as the agent marks it first
            raise AgentRejected("500 participant TransactionalFileSink: OSError: disk full")
        await super().complete(checkpoint_id, batch_id)


class DeclinedDrainRefusedCompletionAgent(DeclinedDrainAgent):
    input_ran_out_first = True
    refuse_first_completion = True


class DeclinedDrainAfterTheFinalCheckpointAgent(DeclinedDrainAgent):
    input_ran_out_first = True


@pytest.mark.parametrize(
    "agent_class",
    [
        DeclinedDrainAgent,
        DeclinedDrainAfterTheFinalCheckpointAgent,
        DeclinedDrainRefusedCompletionAgent,
    ],
)
def test_a_drain_that_fails_after_a_checkpoint_covering_the_end_ends_finished(
    agent_class: type[DeclinedDrainAgent],
) -> None:
    """The driver waits for the drain in flight, then finishes. A final completion its sink
    refused while the drain was in flight was never sent again (only a finishing attempt's
    was), and the driver waited for it for ever (a reviewer)."""
    launcher, notices = FinishingLauncher(agent_class), []
    outcome = _drain_after_a_checkpoint(launcher, agent_class, notices)
    (driver,) = launcher.drivers
    assert isinstance(driver.agent, DeclinedDrainAgent)
    assert driver.agent.completed == driver.agent.checkpoints
    assert outcome is TerminalOutcome.FINISHED, [n.message for n in notices]


class HungAfterToldAgent(FinishingAgent):
    """Takes the final completion (its sinks committed all), then hangs in Spark's stop."""

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        await FakeAgent.complete(self, checkpoint_id, batch_id)
        self.notified = batch_id


@pytest.mark.parametrize(
    ("agent_class", "outcome"),
    [
        # Told, its answer cut short by the exit: the driver exits by itself.
        (FinishingAgent, TerminalOutcome.FINISHED),
        # Told and confirmed, then stopped: its sinks committed all of its output.
        (HungAfterToldAgent, TerminalOutcome.FINISHED),
    ],
    ids=["exits", "hangs-once-told"],
)
def test_a_driver_told_of_its_final_checkpoint_and_then_stopped_ends_finished(
    agent_class: type[FinishingAgent], outcome: TerminalOutcome
) -> None:
    """A stop without a savepoint (a second Ctrl-C, a suspension while no query runs) once
    the final checkpoint completed: the job ended Suspended, to be run again for nothing,
    though all of its output was committed."""
    notices: list[Notice] = []

    async def scenario() -> TerminalOutcome:
        launcher = FinishingLauncher(agent_class)
        supervisor = _checkpointing_often(launcher, notices)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        agent = launcher.drivers[0].agent
        assert isinstance(agent, FinishingAgent) and agent.batch is not None
        agent.batch += 1
        agent.exhausted = True
        last = agent.batch
        await until(lambda: agent.notified is not None and agent.notified >= last)
        assert supervisor.finishing
        if agent_class is FinishingAgent:
            await until(lambda: launcher.drivers[0].code is not None)
        supervisor.suspend_now()
        return await run

    assert asyncio.run(scenario()) is outcome
    assert not [n for n in notices if n.level is Level.WARNING], notices
