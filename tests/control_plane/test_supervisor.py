"""The supervisor against scripted drivers and agents (no Spark, real asyncio time)."""

import asyncio
import contextlib
import json
import re
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

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
    AgentStatus,
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
    CHECKPOINT_ID_BLOCK,
    MESSAGE_CHARACTERS,
    AfterCompletion,
    CheckpointKind,
    CompletedCheckpoint,
    CoordinatorConfig,
    FailureReason,
    JobPhase,
    PersistedState,
    RetentionPolicy,
    SavepointHistoryLimits,
    TerminalOutcome,
    TriggerRequested,
)
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.status import DiscardDue, UnrestorableImage
from spark_checkpoint_operator.supervisor import (
    DRIVER_GONE,
    POLL_INTERVAL,
    CleanupFailed,
    JobRecord,
    JobSupervisor,
    LaunchBlocked,
    Level,
    Notice,
    StartProblem,
    interpreter,
)
from spark_checkpoint_operator.supervisor.job import BLOCKED_MIN_DELAY, SLOW_START, restart_delay


def _supervisor(
    launcher: FakeLauncher,
    max_retries: int = 3,
    record: JobRecord | None = None,
    *,
    interval: float | None = 0.2,
    idle_poll_interval: float = POLL_INTERVAL,
    heartbeat_timeout: float = 60.0,
    start_timeout: float = 300.0,
    policy: RestartPolicyType = RestartPolicyType.ON_FAILURE,
    report: Callable[[str], None] = lambda line: None,
    noticed: Callable[[Notice], None] = lambda notice: None,
    savepoints_kept: int = 10,
    saved: Callable[[JobRecord], None] = lambda record: None,
    retained: int = 1,
    initial_savepoint: str | None = None,
) -> tuple[JobSupervisor, list[str]]:
    lines: list[str] = []

    async def save(record: JobRecord) -> None:
        saved(record)

    supervisor = JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(
            interval=interval,
            min_pause=0.0,
            timeout=5.0,
            savepoint_history=SavepointHistoryLimits(max_count=savepoints_kept),
            retained=retained,
        ),
        restart_policy=RestartPolicySpec(
            policy, max_retries, 0.01, 0.05, heartbeat_timeout, start_timeout
        ),
        launcher=launcher,
        janitor=NoJanitor(),
        save=save,
        record=record or JobRecord(),
        initial_savepoint=initial_savepoint,
        report=lambda notice: (
            lines.append(notice.message),
            report(notice.message),
            noticed(notice),
        ),
        idle_poll_interval=idle_poll_interval,
    )
    return supervisor, lines


def test_a_lost_agent_stops_triggers_without_failing_the_job() -> None:
    async def scenario() -> tuple[JobSupervisor, FakeLauncher, list[str]]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        driver = launcher.drivers[0]
        driver.agent.reachable = False  # e.g. the driver is shutting down
        await asyncio.sleep(1.0)
        assert supervisor.record.consecutive_failures == 0
        driver.agent.reachable = True
        completed = len(driver.agent.completed)
        await until(lambda: len(driver.agent.completed) > completed)
        driver.code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor, launcher, lines

    supervisor, launcher, lines = asyncio.run(scenario())
    assert len(launcher.drivers) == 1, "an unreachable agent is not a failure"
    assert not any("failing the driver" in line for line in lines)
    assert supervisor.record.phase.value == "Finished"


class SlowToStopDriver(FakeDriver):
    """Its pod takes a second to go once deleted."""

    async def terminate(self) -> None:
        await asyncio.sleep(1.0)
        await super().terminate()


class SilentDriversLauncher(FakeLauncher):
    """Its drivers run and their agents never answer, and they are slow to stop."""

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        self.restores.append(restore)
        self.drivers.append(SlowToStopDriver(FakeAgent()))
        self.drivers[-1].agent.reachable = False
        return self.drivers[-1]


def test_a_driver_stopped_before_its_agent_answered_is_not_told_as_never_answering() -> None:
    async def scenario() -> tuple[list[str], TerminalOutcome]:
        launcher = SilentDriversLauncher()
        supervisor, lines = _supervisor(launcher, start_timeout=0.2)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers)
        supervisor.suspend_now()  # the pod goes in a second, past the start timeout
        return lines, await asyncio.wait_for(run, 10)

    lines, outcome = asyncio.run(scenario())
    assert outcome is TerminalOutcome.SUSPENDED
    assert not [line for line in lines if "never answered" in line], lines


def test_a_driver_whose_agent_stopped_answering_is_restarted_from_its_latest_checkpoint() -> None:
    """A hung driver, or one cut off from the operator, would run on without checkpoints."""

    async def scenario() -> tuple[JobSupervisor, FakeLauncher, list[str], list[int]]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher, heartbeat_timeout=1.5)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        first = launcher.drivers[0]
        first.agent.reachable = False
        completed = list(first.agent.completed)
        await until(lambda: len(launcher.drivers) == 2)
        launcher.drivers[1].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor, launcher, lines, completed

    supervisor, launcher, lines, completed = asyncio.run(scenario())
    assert launcher.drivers[0].code == -15, "the silent driver was stopped"
    # The newest registered: one more may have been registered as the agent went silent.
    kind, newest = launcher.restores[1][0].split(":")
    assert kind == "checkpoint" and int(newest) >= completed[-1]
    (silence,) = [line for line in lines if "has not answered" in line]
    assert re.match(r"the driver's checkpoint agent has not answered for \d+s", silence)
    assert silence.endswith("connection refused. Stopping the driver.")
    assert supervisor.record.phase.value == "Finished"


def test_a_driver_whose_end_only_a_recheck_finds_is_restarted_without_waiting_for_silence() -> None:
    """A pod deleted while the operator's pod watch was down: its agent stops answering
    and the watch still shows it running. The supervisor asks the runtime to look again
    while the agent does not answer, and restarts at once, not after the heartbeat
    timeout (60 s here); the pod's deletion is the reason told."""

    async def scenario() -> tuple[FakeLauncher, list[str]]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher, heartbeat_timeout=60.0)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        first = launcher.drivers[0]
        assert first.rechecks == 0  # never while its agent answers
        first.agent.reachable = False
        first.code_when_rechecked = DRIVER_GONE
        await until(lambda: len(launcher.drivers) == 2, timeout=10)
        launcher.drivers[1].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return launcher, lines

    launcher, lines = asyncio.run(scenario())
    assert launcher.drivers[0].rechecks >= 1
    assert "driver failed (its pod was deleted); restart 1 in 0s" in lines, lines


@pytest.mark.parametrize("then", ["restartPolicy Never", "suspended in the backoff"])
def test_a_driver_stopped_for_its_silence_is_told_as_such(then: str) -> None:
    """With restartPolicy Never the job fails with why its driver was stopped (not the
    deleted pod's exit); suspended while the restart waits, it keeps no failure message."""

    async def scenario() -> tuple[JobSupervisor, TerminalOutcome]:
        launcher = FakeLauncher()

        def suspend_at_restart(line: str) -> None:
            if line.startswith("driver stopped; restart 1"):
                supervisor.end_suspended()

        supervisor, _lines = _supervisor(
            launcher,
            heartbeat_timeout=0.5,
            policy=RestartPolicyType.NEVER
            if then == "restartPolicy Never"
            else RestartPolicyType.ON_FAILURE,
            report=suspend_at_restart,
        )
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        launcher.drivers[0].agent.reachable = False
        return supervisor, await asyncio.wait_for(run, 10)

    supervisor, outcome = asyncio.run(scenario())
    if then == "restartPolicy Never":
        assert outcome is TerminalOutcome.FAILED
        assert re.fullmatch(
            r"the driver's checkpoint agent has not answered for \ds \(the driver hung, or "
            r"the network to it is down\): .*; restartPolicy is Never",
            supervisor.record.message,
        ), supervisor.record.message
    else:
        assert (outcome, supervisor.record.message) == (TerminalOutcome.SUSPENDED, "")


class StatusRefusingAgent(FakeAgent):
    """Answers its status requests with an error while ``refusing`` (a 500 of a storage
    error): an agent that answers, if only with a refusal, is not silent."""

    refusing = False

    async def read_status(self, after: int | None = None, wait: float = 0.0) -> AgentStatus:
        if self.refusing:
            self.status_requests += 1
            raise AgentRejected("GET /v1/status: 500 storage: the disk is full")
        return await super().read_status(after, wait)


@pytest.mark.parametrize("agent", ["adopted and not answering yet", "refusing"])
def test_an_agent_that_is_not_silent_after_answering_keeps_its_driver(agent: str) -> None:
    """Silence is counted only after an answer in this runtime: the runtime before may
    have recorded the attempt before its pod ran (an image pull, a long restore); and an
    agent that refuses its status requests is not silent."""

    async def scenario() -> tuple[FakeDriver, list[str]]:
        if agent == "refusing":
            launcher = FakeLauncher()
            launcher.agent_class = StatusRefusingAgent
            record = None
        else:
            launcher = FakeLauncher(running=FakeDriver(FakeAgent()))
            assert launcher.running is not None
            launcher.running.agent.reachable = False
            record = JobRecord(attempt=2)
        supervisor, lines = _supervisor(launcher, record=record, heartbeat_timeout=0.5)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.running or launcher.drivers)
        driver = launcher.running or launcher.drivers[0]
        if agent == "refusing":
            await until(lambda: len(driver.agent.completed) >= 1)
            driver.agent.refusing = True
        requests = driver.agent.status_requests
        await until(lambda: driver.agent.status_requests >= requests + 3)
        await asyncio.sleep(1.0)
        driver.agent.reachable, driver.agent.refusing = True, False
        completed = len(driver.agent.completed)
        await until(lambda: len(driver.agent.completed) > completed)
        driver.code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return driver, lines

    driver, lines = asyncio.run(scenario())
    assert driver.code == DriverExit.FINISHED, "the driver was never stopped"
    assert not [line for line in lines if "has not answered" in line]


class KeptFromStartingLauncher(FakeLauncher):
    """Its drivers' pods cannot start (``problem``) until the test clears it."""

    def __init__(self, problem: StartProblem) -> None:
        super().__init__()
        self.problem = problem

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = await super().launch(attempt, restore)
        driver.problem = self.problem
        driver.agent.reachable = False
        return driver


@pytest.mark.parametrize(
    "problem",
    [
        StartProblem("CreateContainerConfigError", 'secret "s3-credentials" not found'),
        # A wrong image or a registry's outage: the kubelet retries, the job waits, told.
        StartProblem("ImagePullBackOff", 'Back-off pulling image "example/orders:1"'),
    ],
    ids=["missing-secret", "image-pull"],
)
def test_what_keeps_a_driver_from_starting_is_told_once_and_the_job_runs_when_it_can(
    problem: StartProblem,
) -> None:
    async def scenario() -> tuple[FakeLauncher, list[str], list[str]]:
        launcher = KeptFromStartingLauncher(problem)
        supervisor, lines = _supervisor(launcher, start_timeout=0.2)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.message)
        messages = [supervisor.record.message]
        driver = launcher.drivers[0]
        requests = driver.agent.status_requests
        await until(lambda: driver.agent.status_requests >= requests + 3)
        await asyncio.sleep(0.5)  # longer than the start timeout: not counted
        driver.problem, driver.agent.reachable = None, True  # the Secret, the image is there
        await until(lambda: len(driver.agent.completed) >= 1)
        messages.append(supervisor.record.message)
        driver.code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return launcher, lines, messages

    launcher, lines, messages = asyncio.run(scenario())
    told = f"the driver cannot start yet: {problem}"
    assert messages == [told, ""]
    assert [line for line in lines if "cannot start" in line] == [told]
    assert len(launcher.drivers) == 1


def test_the_start_timeout_counts_from_when_the_driver_runs() -> None:
    """A pod waiting for its Secret longer than the start timeout is not failed; once it
    runs, an agent that never answers fails the job after the timeout."""

    async def scenario() -> tuple[JobSupervisor, FakeLauncher, TerminalOutcome, float]:
        missing_secret = StartProblem("CreateContainerConfigError", 'secret "s3" not found')
        launcher = KeptFromStartingLauncher(missing_secret)
        supervisor, _lines = _supervisor(launcher, start_timeout=0.5)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers)
        await asyncio.sleep(1.5)
        assert not run.done(), "waiting for the Secret counts"
        launcher.drivers[0].problem = None  # it runs, and its agent never answers
        started = asyncio.get_running_loop().time()
        outcome = await asyncio.wait_for(run, 10)
        return supervisor, launcher, outcome, asyncio.get_running_loop().time() - started

    supervisor, launcher, outcome, after = asyncio.run(scenario())
    assert outcome is TerminalOutcome.FAILED
    assert supervisor.record.message.startswith(
        "the driver's checkpoint agent never answered in 0.5s after the driver started"
    )
    assert after >= 0.5
    assert len(launcher.drivers) == 1 and launcher.drivers[0].code == -15


class RestoringAgent(FakeAgent):
    """A restored driver's agent: "starting" (no batch) for its first two statuses, while
    the driver restores; then its query restoring at the image's batch 5."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses = 0

    def _status(self) -> AgentStatus:
        self.statuses += 1
        started = self.statuses > 2
        self.state = QueryState.RESTORING if started else QueryState.STARTING
        self.batch = 5 if started else None
        return super()._status()


class SlowRestoreAgent(FakeAgent):
    """Its driver restores (the agent answers "starting") until ``restored`` is set; then
    its query runs, or with ``then`` is in that state."""

    def __init__(self) -> None:
        super().__init__()
        self.restored = False
        self.then = QueryState.RUNNING

    def _status(self) -> AgentStatus:
        self.state = self.then if self.restored else QueryState.STARTING
        return super()._status()


def test_a_restore_longer_than_the_start_timeout_is_told_once_and_does_not_fail_the_job() -> None:
    async def scenario() -> tuple[JobSupervisor, FakeLauncher, list[str], list[str]]:
        launcher = FakeLauncher()
        launcher.agent_class = SlowRestoreAgent
        supervisor, lines = _supervisor(launcher, start_timeout=0.5)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers)
        await asyncio.sleep(2)
        restoring = [supervisor.record.phase.value, supervisor.record.message]
        agent = launcher.drivers[0].agent
        agent.restored = True
        await until(lambda: agent.completed)
        launcher.drivers[0].code = DriverExit.FINISHED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FINISHED
        return supervisor, launcher, lines, restoring

    supervisor, launcher, lines, (phase, message) = asyncio.run(scenario())
    told = [line for line in lines if "restoring its image" in line]
    assert len(told) == 1, lines
    assert re.fullmatch(
        r"the driver has been restoring its image and starting its query for \d+s, longer "
        r"than restartPolicy.startTimeout \(0.5s\): a large image takes its time; storage "
        r"that stopped answering needs the driver stopped",
        told[0],
    )
    assert (phase, message) == ("Deploying", told[0])
    assert len(launcher.drivers) == 1, "not failed, not restarted"
    assert supervisor.record.message == ""


def test_a_slow_start_told_is_over_once_the_query_started_however_the_attempt_ends() -> None:
    """Told, then the query is restoring past its image (started, not running yet), and
    the job is suspended there: the message went when the query started, and the
    suspension does not carry it."""

    async def scenario() -> tuple[str, TerminalOutcome, str, list[str]]:
        launcher = FakeLauncher()
        launcher.agent_class = SlowRestoreAgent
        supervisor, lines = _supervisor(launcher, start_timeout=0.3)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.message.startswith(SLOW_START))
        agent = launcher.drivers[0].agent
        assert isinstance(agent, SlowRestoreAgent)
        agent.then, agent.restored = QueryState.RESTORING, True
        await until(lambda: supervisor.record.message == "")
        phase = supervisor.record.phase.value
        supervisor.suspend_now()
        return phase, await asyncio.wait_for(run, 10), supervisor.record.message, lines

    phase, outcome, message, lines = asyncio.run(scenario())
    assert phase == "Deploying"
    assert (outcome, message) == (TerminalOutcome.SUSPENDED, "")
    assert lines[-1] == "job suspended", lines


def test_a_slow_start_an_operator_restart_left_in_the_record_goes_once_the_query_started() -> None:
    """The adopted driver's query restores past its image already: the runtime before
    told a start that is over."""
    running = FakeDriver(SlowRestoreAgent())
    assert isinstance(running.agent, SlowRestoreAgent)
    running.agent.then, running.agent.restored = QueryState.RESTORING, True
    record = JobRecord(
        attempt=2, phase=JobPhase.DEPLOYING, message=f"{SLOW_START} for 301s, longer than"
    )

    async def scenario() -> str:
        launcher = FakeLauncher(running=running)
        supervisor, _ = _supervisor(launcher, record=record)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: running.agent.status_requests > 1)
        message = supervisor.record.message
        supervisor.suspend_now()
        await asyncio.wait_for(run, 10)
        return message

    assert asyncio.run(scenario()) == ""


class SlowRestoreSlowStopLauncher(FakeLauncher):
    """Its drivers restore until told, and take a second to go once deleted."""

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        self.drivers.append(SlowToStopDriver(SlowRestoreAgent()))
        return self.drivers[-1]


def test_a_slow_start_is_not_told_of_a_driver_being_stopped() -> None:
    async def scenario() -> tuple[list[str], TerminalOutcome, str]:
        launcher = SlowRestoreSlowStopLauncher()
        supervisor, lines = _supervisor(launcher, start_timeout=0.3)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.status_requests)
        supervisor.suspend_now()  # the pod goes in a second, past the start timeout
        return lines, await asyncio.wait_for(run, 10), supervisor.record.message

    lines, outcome, message = asyncio.run(scenario())
    assert outcome is TerminalOutcome.SUSPENDED
    assert not [line for line in lines if "restoring its image" in line], lines
    assert message == ""


def test_a_slow_start_an_operator_restart_left_in_the_record_goes_with_its_driver() -> None:
    """The runtime before told the adopted driver's slow start; it is suspended while it
    still restores: the job ends Suspended without that message."""
    running = FakeDriver(SlowRestoreAgent())
    record = JobRecord(
        attempt=2,
        phase=JobPhase.DEPLOYING,
        message="the driver has been restoring its image and starting its query for 301s",
    )

    async def scenario() -> tuple[TerminalOutcome, str]:
        launcher = FakeLauncher(running=running)
        supervisor, _ = _supervisor(launcher, record=record)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: running.agent.status_requests)
        await asyncio.sleep(0.2)
        supervisor.suspend_now()
        return await asyncio.wait_for(run, 10), supervisor.record.message

    outcome, message = asyncio.run(scenario())
    assert (outcome, message) == (TerminalOutcome.SUSPENDED, "")


def test_a_restored_driver_that_fails_the_same_way_before_a_new_batch_is_not_retried() -> None:
    """Its agent answered while it restored, with no batch yet: the image's batch it reports
    next is no progress of its query."""

    async def scenario() -> tuple[JobSupervisor, FakeLauncher]:
        launcher = FakeLauncher()
        launcher.agent_class = RestoringAgent
        supervisor = JobSupervisor(
            storage=STORAGE,
            config=CoordinatorConfig(interval=0.2, min_pause=0.0, timeout=5.0),
            restart_policy=RestartPolicySpec(RestartPolicyType.ON_FAILURE, 5, 0.01, 0.05),
            launcher=launcher,
            janitor=NoJanitor(),
            save=lambda record: asyncio.sleep(0),
            record=JobRecord(),
            report=lambda notice: None,
        )
        run = asyncio.create_task(supervisor.run())
        for attempt in (1, 2):
            await until(lambda n=attempt: len(launcher.drivers) == n)
            driver = launcher.drivers[-1]
            await until(lambda d=driver: d.agent.statuses > 3)  # past starting: it restores
            driver.error = ["ValueError: no such column 'k'"]
            driver.code = DriverExit.FAILED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FAILED
        return supervisor, launcher

    supervisor, launcher = asyncio.run(scenario())
    assert len(launcher.drivers) == 2
    assert supervisor.record.message.startswith(
        "the driver failed the same way twice before its first batch; not retried"
    )


def test_under_restart_policy_always_the_same_early_error_is_retried() -> None:
    """Always restarts after every failure, without a limit (the CRD says so): a broker
    down for a minute failed the job as a pipeline to fix (a Flink operator user's)."""

    error = "TimeoutException: Timeout expired while fetching topic metadata"
    assert _drivers_after_failing_twice_the_same(error, RestartPolicyType.ALWAYS) == 3


@pytest.mark.parametrize(
    "error",
    [
        "spark_checkpoint.storage.errors.StorageAccessError: s3://bucket/ckpt/default/job/"
        "owner.json: EndpointConnectionError: Could not connect to the endpoint URL: "
        '"http://127.0.0.1:45124/bucket?list-type=2"',
        "OSError: [Errno 111] Connection refused",
        "botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the "
        "PutObject operation: Please reduce your request rate.",
        "azure.core.exceptions.ServiceRequestError: <urllib3 ...>: Failed to establish a new "
        "connection",
    ],
)
def test_under_on_failure_the_same_passing_storage_error_is_retried(error: str) -> None:
    """An S3 endpoint down for a minute failed an OnFailure job with its retries left: "the
    driver failed the same way twice before its first batch" (an S3 user's)."""

    assert _drivers_after_failing_twice_the_same(error, RestartPolicyType.ON_FAILURE) == 3


def _drivers_after_failing_twice_the_same(error: str, policy: RestartPolicyType) -> int:
    """How many drivers ran when the first two failed with ``error`` before their first
    batch (maxRetries 3) and a third, if one is started, finished."""

    async def scenario() -> FakeLauncher:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=3, policy=policy)
        run = asyncio.create_task(supervisor.run())
        for attempt in (1, 2):
            await until(lambda n=attempt: len(launcher.drivers) == n)
            driver = launcher.drivers[-1]
            driver.error = [error]
            driver.code = DriverExit.FAILED
        await until(lambda: len(launcher.drivers) == 3)
        launcher.drivers[2].code = DriverExit.FINISHED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FINISHED
        return launcher

    return len(asyncio.run(scenario()).drivers)


class FailingRestartsLauncher(FakeLauncher):
    """Every driver after the first dies before its first checkpoint."""

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = await super().launch(attempt, restore)
        if attempt > 1:
            driver.code = DriverExit.FAILED
        return driver


def test_driver_failures_restart_with_restore_until_retries_run_out() -> None:
    async def scenario() -> tuple[JobSupervisor, FakeLauncher]:
        launcher = FailingRestartsLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=2)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        launcher.drivers[0].code = DriverExit.FAILED
        assert await run is TerminalOutcome.FAILED
        return supervisor, launcher

    supervisor, launcher = asyncio.run(scenario())
    assert len(launcher.drivers) == 3
    assert launcher.restores[0] == []
    assert launcher.restores[1][0].startswith("checkpoint:")
    assert "maxRetries=2 exhausted" in supervisor.record.message


def test_the_backoff_of_many_tries_in_a_row_is_the_maximum() -> None:
    """2 ** 1024 is no float: the 1025th blocked launch in a row raised OverflowError."""
    policy = RestartPolicySpec(RestartPolicyType.ON_FAILURE, 3, 1.0, 300.0, 60.0, 300.0)
    assert [restart_delay(policy, n) for n in (1, 2, 10, 1025, 10**9)] == [
        1.0,
        2.0,
        300.0,
        300.0,
        300.0,
    ]


@pytest.mark.parametrize("stop", ["suspend", "cancel"])
def test_a_launch_refused_for_now_is_tried_again_until_the_job_is_stopped(stop: str) -> None:
    """A refusal that may pass (a quota) is no driver failure: under Never, tried again
    with the backoff as one attempt, until the job is stopped meanwhile."""

    class QuotaLauncher(FakeLauncher):
        def __init__(self) -> None:
            super().__init__()
            self.tried: list[int] = []

        async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
            self.tried.append(attempt)
            raise LaunchBlocked("pod x: exceeded quota: pods")

    async def scenario() -> tuple[TerminalOutcome, JobSupervisor, QuotaLauncher, list[str]]:
        launcher = QuotaLauncher()
        supervisor, lines = _supervisor(launcher, max_retries=0, policy=RestartPolicyType.NEVER)
        run = asyncio.create_task(supervisor.run())
        started = asyncio.get_running_loop().time()
        await until(lambda: len(launcher.tried) >= 2)
        # At least a second apart, whatever the backoff (0.01 s here): the API server
        # was asked without a pause under `backoff: 0s` (a reviewer's).
        assert asyncio.get_running_loop().time() - started >= BLOCKED_MIN_DELAY
        assert supervisor.record.phase is JobPhase.DEPLOYING
        supervisor.suspend_now() if stop == "suspend" else supervisor.cancel()
        return await asyncio.wait_for(run, 5), supervisor, launcher, lines

    outcome, supervisor, launcher, lines = asyncio.run(scenario())

    assert outcome is (
        TerminalOutcome.SUSPENDED if stop == "suspend" else TerminalOutcome.CANCELLED
    )
    assert set(launcher.tried) == {1}, launcher.tried
    assert supervisor.record.attempt == 0
    assert (
        "the driver could not be started yet: pod x: exceeded quota: pods; trying again in 1s"
        in lines
    ), lines


def test_an_attempt_that_completed_a_checkpoint_starts_the_retries_over() -> None:
    """maxRetries counts failures in a row: the second driver made progress before it
    failed, so two more failures are allowed after it (maxRetries=2)."""

    class ProgressOnceLauncher(FakeLauncher):
        async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
            driver = await super().launch(attempt, restore)
            if attempt != 2:
                driver.code = DriverExit.FAILED
            return driver

    async def scenario() -> tuple[JobSupervisor, FakeLauncher]:
        launcher = ProgressOnceLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=2)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: len(launcher.drivers) > 1 and launcher.drivers[1].agent.completed)
        launcher.drivers[1].code = DriverExit.FAILED
        assert await asyncio.wait_for(run, 20) is TerminalOutcome.FAILED
        return supervisor, launcher

    supervisor, launcher = asyncio.run(scenario())
    assert len(launcher.drivers) == 4
    assert supervisor.record.message == (
        "driver failed 3 times in a row; restartPolicy.maxRetries=2 exhausted"
    )


@pytest.mark.parametrize(
    ("policy", "ended"),
    [
        (RestartPolicyType.ON_FAILURE, "driver failed once; restartPolicy.maxRetries=0 exhausted"),
        (RestartPolicyType.NEVER, "driver failed (killed by SIGKILL); restartPolicy is Never"),
    ],
)
def test_a_killed_driver_that_fails_the_job_is_told_how_it_died(
    policy: RestartPolicyType, ended: str
) -> None:
    """A kill leaves no error: the job failed with "driver failed 1 times in a row;
    restartPolicy.maxRetries=0 exhausted" and no line said the driver was killed (a
    newcomer's `kill -9`); with a retry left, the DriverFailed line said so."""

    async def scenario() -> tuple[JobSupervisor, list[str]]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher, max_retries=0, policy=policy)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        launcher.drivers[0].code = -signal.SIGKILL
        assert await asyncio.wait_for(run, 20) is TerminalOutcome.FAILED
        return supervisor, lines

    supervisor, lines = asyncio.run(scenario())
    assert supervisor.record.message == ended
    assert "driver failed (killed by SIGKILL)" in lines, lines


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (DriverExit.FINISHED, TerminalOutcome.FINISHED),
        (DriverExit.STOPPED_WITH_SAVEPOINT, TerminalOutcome.SUSPENDED),
        (DriverExit.MISCONFIGURED, TerminalOutcome.FAILED),
        (DriverExit.RESTORE_FAILED, TerminalOutcome.FAILED),
    ],
)
@pytest.mark.parametrize("policy", list(RestartPolicyType))
def test_exit_codes_end_the_job_without_restart(
    code: DriverExit, outcome: TerminalOutcome, policy: RestartPolicyType
) -> None:
    # Whatever the restart policy, Always included: the policy is for failures (a finished
    # job's input is done).
    async def scenario() -> tuple[TerminalOutcome, FakeLauncher]:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, policy=policy)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers))
        launcher.drivers[0].code = code
        return await run, launcher

    ended, launcher = asyncio.run(scenario())
    assert ended is outcome
    assert len(launcher.drivers) == 1


def test_cancel_ends_the_job_cancelled_without_a_restart() -> None:
    async def scenario() -> tuple[TerminalOutcome, JobSupervisor, FakeLauncher]:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers))
        supervisor.cancel()
        return await run, supervisor, launcher

    ended, supervisor, launcher = asyncio.run(scenario())
    assert ended is TerminalOutcome.CANCELLED
    assert len(launcher.drivers) == 1
    assert supervisor.record.message == "cancelled by the user"


def test_a_restarted_runtime_adopts_the_running_driver_and_drops_its_unknown_checkpoint() -> None:
    """An operator restart mid-checkpoint: the driver of the recorded attempt goes on, the
    checkpoint the old coordinator triggered is aborted at the agent, and no id is reused."""
    running = FakeDriver(FakeAgent())
    # Id 4 was triggered by the previous operator process (the counter was persisted at 5).
    running.agent.snapshots[4] = SnapshotStatus(
        4, CheckpointKind.CHECKPOINT, SnapshotPhase.COPYING, batch_id=None
    )
    record = JobRecord(attempt=2, coordinator=PersistedState(next_checkpoint_id=5))

    async def scenario() -> tuple[JobSupervisor, FakeLauncher]:
        launcher = FakeLauncher(running=running)
        supervisor, _ = _supervisor(launcher, record=record)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: len(running.agent.completed) >= 2)
        running.code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor, launcher

    supervisor, launcher = asyncio.run(scenario())
    assert launcher.adopt_asked == [2]
    assert launcher.drivers == [], "no second driver was started"
    assert supervisor.record.attempt == 2
    assert 4 not in running.agent.snapshots, "the unknown checkpoint was aborted"
    assert min(running.agent.triggers) == 5
    # Id 5 reserved a block; status shows the id the next checkpoint gets.
    assert supervisor.record.coordinator.next_checkpoint_id == 5 + CHECKPOINT_ID_BLOCK
    assert supervisor.record.next_checkpoint_id == max(running.agent.triggers) + 1


def test_an_adopted_driver_failing_on_its_image_marks_the_image_it_restored() -> None:
    """Its pod was to restore checkpoint:6 or else checkpoint:5; the runtime before recorded
    that it restored checkpoint:5 (6 was unreadable). It exits RESTORE_UNUSABLE: 5 is the
    image it failed on."""
    running = FakeDriver(FakeAgent())
    running.restore = ["checkpoint:6", "checkpoint:5"]
    restored = RestoredFrom(
        RestoreCandidate.decode("checkpoint:5"),
        batch_id=9,
        skipped=(SkippedImage(RestoreCandidate.decode("checkpoint:6"), "a file is missing"),),
    )
    running.agent.restored_from = restored
    running.agent.state = QueryState.RESTORING
    record = JobRecord(attempt=2, restored_from=restored)

    async def scenario() -> list[str]:
        launcher = FakeLauncher(running=running)
        supervisor, lines = _supervisor(launcher, record=record)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: running.agent.status_requests > 0)
        running.code = DriverExit.RESTORE_UNUSABLE
        await until(lambda: launcher.drivers)  # the next attempt
        launcher.drivers[0].code = DriverExit.FINISHED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FINISHED
        return lines

    lines = asyncio.run(scenario())
    assert [line.split(" cannot")[0] for line in lines if "cannot be restored" in line] == [
        "checkpoint:5"
    ]


class NewestSkippedOnceLauncher(FakeLauncher):
    """Its second driver's restore cannot read the newest image it is given (a connection
    reset) and restores the one before, whose query is still restoring when it dies."""

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = await super().launch(attempt, restore)
        if len(self.drivers) == 2:
            newest, older = (RestoreCandidate.decode(image) for image in restore[:2])
            driver.agent.restored_from = RestoredFrom(
                older, batch_id=3, skipped=(SkippedImage(newest, "connection reset by peer"),)
            )
            driver.agent.state = QueryState.RESTORING
        return driver


def test_an_image_a_restore_fell_back_past_is_never_restored_later() -> None:
    """The restore skipped the newest image (a transient error) and went on from the one
    before: the restored sink discarded the output batches staged after it, which only the
    skipped image covered. A later attempt that restored the skipped image resumed after
    output that was gone (a reviewer: batches lost for good, or mixed from two runs)."""

    async def scenario() -> tuple[JobSupervisor, FakeLauncher, list[str]]:
        launcher = NewestSkippedOnceLauncher()
        supervisor, lines = _supervisor(launcher, retained=2)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        launcher.drivers[0].code = 137
        await until(lambda: len(launcher.drivers) == 2)
        await until(lambda: any(line.startswith("skipped ") for line in lines))
        launcher.drivers[1].code = 137
        await until(lambda: len(launcher.drivers) == 3)
        launcher.drivers[2].code = DriverExit.FINISHED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FINISHED
        return supervisor, launcher, lines

    supervisor, launcher, lines = asyncio.run(scenario())
    skipped, restored = launcher.restores[1][:2]
    assert launcher.drivers[1].agent.completed == [], "the second driver completed nothing"
    assert launcher.restores[2][0] == restored, "the third restores where the second did"
    assert skipped not in launcher.restores[2]
    [entry] = supervisor.record.unrestorable
    assert entry.source == skipped and entry.attempt == 2
    assert entry.reason == (
        f"a restore skipped it (connection reset by peer) and attempt 2 went on from {restored}"
    )
    told = (
        f"skipped {skipped}: connection reset by peer; the job goes on from {restored} and "
        f"never restores {skipped}"
    )
    # Why first: "restored from ...; never restored again: <skipped>" alone puzzled.
    restored_line = next(line for line in lines if line.startswith(f"restored from {restored}"))
    assert lines.index(told) < lines.index(restored_line), lines


def _second_driver_reports(
    launcher: FakeLauncher, reported: Callable[[list[str]], bool]
) -> tuple[JobSupervisor, list[str]]:
    """A job whose first driver completes two checkpoints and crashes; its second reports
    (``reported`` of the run's lines says when), then finishes."""

    async def scenario() -> tuple[JobSupervisor, list[str]]:
        supervisor, lines = _supervisor(launcher, retained=2)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        launcher.drivers[0].code = 137
        await until(lambda: len(launcher.drivers) == 2)
        await until(lambda: reported(lines))
        launcher.drivers[1].code = DriverExit.FINISHED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FINISHED
        return supervisor, lines

    return asyncio.run(scenario())


class BoastfulRestoreLauncher(FakeLauncher):
    """Its second driver (the job author's code) reports passing over the newest image
    twice, with a reason of 1 MB, and 3,000 images it was never given."""

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = await super().launch(attempt, restore)
        if len(self.drivers) == 2:
            newest, older = (RestoreCandidate.decode(image) for image in restore[:2])
            strangers = [
                SkippedImage(RestoreCandidate.decode(f"checkpoint:{100_000 + n}"), "x" * 1000)
                for n in range(3000)
            ]
            long = SkippedImage(newest, "storage said: " + "y" * 1_000_000)
            driver.agent.restored_from = RestoredFrom(
                older, batch_id=3, skipped=(long, *strangers, long)
            )
        return driver


def test_what_a_driver_says_it_skipped_is_kept_within_bounds() -> None:
    """The hostile reviewer's: every such entry went into the job's status twice (its
    restore, its unrestorable images), whose writes the API server then refused for good
    (413), one RestoreSkipped event each."""

    launcher = BoastfulRestoreLauncher()
    supervisor, lines = _second_driver_reports(
        launcher, lambda lines: any(line.startswith("restored from ") for line in lines)
    )
    newest = launcher.restores[1][0]
    restored = supervisor.record.restored_from
    assert restored is not None
    [skipped] = restored.skipped
    assert str(skipped.candidate) == newest
    assert len(skipped.reason) == MESSAGE_CHARACTERS and skipped.reason.endswith("\u2026")
    [entry] = supervisor.record.unrestorable
    assert entry.source == newest and len(entry.reason) < MESSAGE_CHARACTERS + 100
    assert len([line for line in lines if line.startswith("skipped ")]) == 1
    assert len(json.dumps(supervisor.record.to_dict())) < 20_000


class StrangeRestoreLauncher(FakeLauncher):
    """Its second driver says it restored an image of 1 MB's name it was never given."""

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = await super().launch(attempt, restore)
        if len(self.drivers) == 2:
            strange = RestoreCandidate.decode(f"external:s3://b/{'x' * 1_000_000}/_metadata")
            driver.agent.restored_from = RestoredFrom(strange, batch_id=3)
        return driver


def test_a_restore_of_an_image_the_driver_was_not_given_is_not_recorded() -> None:
    """A reviewer's: its source went into the status whole (2 MB: never written again)."""

    launcher = StrangeRestoreLauncher()
    # Its first status is processed before it is asked for another.
    supervisor, _ = _second_driver_reports(
        launcher, lambda _: launcher.drivers[1].agent.status_requests >= 2
    )
    assert supervisor.record.restored_from is None
    assert len(json.dumps(supervisor.record.to_dict())) < 20_000


def test_triggers_wait_while_an_executor_is_missing() -> None:
    async def scenario() -> FakeDriver:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        driver = launcher.drivers[0]
        driver.executors = False
        await asyncio.sleep(0.6)
        triggered = len(driver.agent.triggers)
        await asyncio.sleep(1.0)
        assert len(driver.agent.triggers) == triggered, "no trigger while an executor is lost"
        driver.executors = True
        await until(lambda: len(driver.agent.triggers) > triggered)
        driver.code = DriverExit.FINISHED
        await run
        return driver

    asyncio.run(scenario())


def test_new_checkpoint_settings_apply_to_the_running_job() -> None:
    async def scenario() -> list[str]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        driver = launcher.drivers[0]
        supervisor.reconfigure(CoordinatorConfig(interval=None, min_pause=0.0, timeout=5.0))
        await asyncio.sleep(0.5)
        triggered = len(driver.agent.triggers)
        await asyncio.sleep(1.0)
        assert len(driver.agent.triggers) == triggered, "periodic checkpoints are off"
        supervisor.reconfigure(CoordinatorConfig(interval=0.1, min_pause=0.0, timeout=5.0))
        await until(lambda: len(driver.agent.triggers) > triggered)
        driver.code = DriverExit.FINISHED
        await run
        ids = driver.agent.triggers
        assert ids == list(range(1, len(ids) + 1)), "new settings skip no ids"
        return lines

    asyncio.run(scenario())


def test_a_savepoint_in_flight_when_the_settings_change_is_asked_for_again() -> None:
    """A reviewer's: a savepoint asked for by a nonce was given up with the settings change
    (retained changed while it was in flight) and never taken, without a word; the nonce
    counts as handled, so nothing asked again."""

    async def scenario() -> tuple[JobSupervisor, SlowAgent, list[str]]:
        launcher = FakeLauncher()
        launcher.agent_class = SlowAgent
        supervisor, lines = _supervisor(launcher, interval=None)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        driver = launcher.drivers[0]
        agent = driver.agent
        assert isinstance(agent, SlowAgent)
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT, label="nonce 1"))
        await until(lambda: len(agent.triggers) == 1)
        supervisor.reconfigure(
            CoordinatorConfig(interval=None, min_pause=0.0, timeout=5.0, retained=3)
        )
        # Pending at once: the controller, which asks again for a stop not pending, asked
        # for a second one (a reviewer's).
        assert supervisor.pending("nonce 1")
        await until(lambda: len(agent.triggers) == 2)
        agent.acknowledge(agent.triggers[1])
        await until(lambda: bool(supervisor.record.coordinator.savepoints))
        driver.code = DriverExit.FINISHED
        await run
        return supervisor, agent, lines

    supervisor, agent, lines = asyncio.run(scenario())

    [savepoint] = supervisor.record.coordinator.savepoints
    assert (savepoint.checkpoint_id, savepoint.label) == (agent.triggers[1], "nonce 1")
    assert "the checkpoint settings changed: asked for again, savepoint (nonce 1)" in lines


def test_a_resumed_job_continues_the_ids_of_its_suspended_run() -> None:
    async def scenario() -> tuple[list[int], list[int], JobRecord]:
        first = FakeLauncher()
        suspended, _ = _supervisor(first)
        run = asyncio.create_task(suspended.run())
        await until(lambda: first.drivers and len(first.drivers[0].agent.completed) >= 2)
        first.drivers[0].code = DriverExit.STOPPED_WITH_SAVEPOINT
        assert await run is TerminalOutcome.SUSPENDED

        second = FakeLauncher()
        resumed, _ = _supervisor(second, record=suspended.record)
        run = asyncio.create_task(resumed.run())
        await until(lambda: second.drivers and len(second.drivers[0].agent.completed) >= 2)
        second.drivers[0].code = DriverExit.FINISHED
        await run
        return first.drivers[0].agent.triggers, second.drivers[0].agent.triggers, resumed.record

    before, after, record = asyncio.run(scenario())
    assert after[0] == max(before) + 1, "the same process knows which ids were used"
    assert record.coordinator.next_checkpoint_id == CHECKPOINT_ID_BLOCK + 1


def test_a_job_read_back_from_status_starts_after_the_reserved_ids() -> None:
    """After a restart nothing tells which reserved ids were used: none is reused."""
    stored = JobRecord(coordinator=PersistedState(next_checkpoint_id=CHECKPOINT_ID_BLOCK + 1))
    record = JobRecord.from_dict(stored.to_dict())

    async def scenario() -> list[int]:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, record=record)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return launcher.drivers[0].agent.triggers

    assert record.to_dict()["nextCheckpointId"] == CHECKPOINT_ID_BLOCK + 1
    assert asyncio.run(scenario())[0] == CHECKPOINT_ID_BLOCK + 1


def test_an_error_in_the_runtime_leaves_the_driver_for_the_next_one_to_adopt() -> None:
    """A status that cannot be stored stops the supervisor; the driver is not killed."""
    launcher = FakeLauncher()
    saves = [0]

    async def failing_save(record: JobRecord) -> None:
        saves[0] += 1
        if saves[0] > 4:
            raise ConnectionError("the API server is gone")

    async def scenario() -> None:
        supervisor = JobSupervisor(
            storage=STORAGE,
            config=CoordinatorConfig(interval=0.2, min_pause=0.0, timeout=5.0),
            restart_policy=RestartPolicySpec(RestartPolicyType.ON_FAILURE, 3, 0.01, 0.05),
            launcher=launcher,
            janitor=NoJanitor(),
            save=failing_save,
            record=JobRecord(),
        )
        with pytest.raises(ConnectionError):
            await supervisor.run()

    asyncio.run(scenario())
    assert len(launcher.drivers) == 1
    assert launcher.drivers[0].code is None, "the driver was left running"


# ---------------------------------------------------------------- long polls of the status


class SlowAgent(FakeAgent):
    """Its snapshots wait for the test to acknowledge them."""

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        await super().trigger(checkpoint_id, kind, after)
        self.unacknowledged = self.snapshots[checkpoint_id]
        self.snapshots[checkpoint_id] = replace(self.unacknowledged, acks=())

    def acknowledge(self, checkpoint_id: int) -> None:
        self.snapshots[checkpoint_id] = self.unacknowledged


@pytest.mark.parametrize("long_polls", [True, False])
def test_an_idle_job_asks_for_status_when_it_changes_not_every_interval(long_polls: bool) -> None:
    """0.1 s idle interval: polling would ask 20 times in 2 s; a long poll asks once (or
    not at all: the one in flight does not count until it is answered)."""

    async def scenario() -> tuple[int, float]:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, interval=None, idle_poll_interval=0.1)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers))
        driver = launcher.drivers[0]
        driver.agent.long_polls = long_polls  # False: an agent from before long polls
        await asyncio.sleep(0.5)
        asked = driver.agent.status_requests
        driver.agent.batch += 5  # a new committed batch alone is no change
        await asyncio.sleep(2.0)
        asked = driver.agent.status_requests - asked
        driver.code = DriverExit.FINISHED  # noticed within the idle interval
        started = asyncio.get_running_loop().time()
        assert await run is TerminalOutcome.FINISHED
        return asked, asyncio.get_running_loop().time() - started

    asked, ending = asyncio.run(scenario())
    if long_polls:
        assert asked <= 1
    else:
        assert asked >= 10, "an agent without versions is polled as before"
    assert ending < 1.0


def test_a_pending_checkpoints_acks_are_picked_up_as_they_arrive() -> None:
    async def scenario() -> tuple[int, float]:
        launcher = FakeLauncher()
        launcher.agent_class = SlowAgent
        supervisor, _ = _supervisor(launcher, interval=None)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and launcher.drivers[0].agent.status_requests)
        agent = launcher.drivers[0].agent
        assert isinstance(agent, SlowAgent)
        await asyncio.sleep(0.3)
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: bool(agent.triggers))
        await asyncio.sleep(0.3)  # the new snapshot is reported
        asked = agent.status_requests
        await asyncio.sleep(2.0)  # pending: polling every 0.5 s would ask 4 times
        asked = agent.status_requests - asked
        acknowledged = asyncio.get_running_loop().time()
        agent.acknowledge(agent.triggers[0])
        await until(lambda: bool(agent.completed), timeout=5.0)
        latency = asyncio.get_running_loop().time() - acknowledged
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return asked, latency

    asked, latency = asyncio.run(scenario())
    assert asked <= 1
    assert latency < 0.3, "the long poll answered when the acks came"


def test_a_request_is_handled_while_a_long_poll_waits() -> None:
    async def scenario() -> float:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, interval=None)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and launcher.drivers[0].agent.status_requests)
        await asyncio.sleep(0.5)  # a long poll is waiting
        requested = asyncio.get_running_loop().time()
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: bool(supervisor.record.coordinator.savepoints), timeout=5.0)
        completed = asyncio.get_running_loop().time() - requested
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return completed

    assert asyncio.run(scenario()) < 1.0


def test_a_savepoint_the_job_continues_after_commits_nothing_but_is_reported() -> None:
    async def scenario() -> tuple[FakeAgent, JobSupervisor, list[str]]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher, interval=None)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and launcher.drivers[0].agent.status_requests)
        agent = launcher.drivers[0].agent
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: agent.completed == [1])
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: bool(supervisor.record.coordinator.savepoints))
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: agent.completed == [1, 3])
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return agent, supervisor, lines

    agent, supervisor, lines = asyncio.run(scenario())
    assert agent.triggers == [1, 2, 3]
    assert agent.completed == [1, 3], "sinks are never told to commit up to savepoint 2"
    assert [s.checkpoint_id for s in supervisor.record.coordinator.savepoints] == [2]
    assert any(line.startswith("savepoint 2 complete") for line in lines)


def test_a_savepoint_the_history_no_longer_keeps_is_deleted_and_said_so() -> None:
    # A newcomer lowered historyMaxCount: savepoints vanished from storage, the only word
    # a janitor line that read like a failure.
    async def scenario() -> tuple[FakeAgent, list[str]]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher, interval=None, savepoints_kept=1)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and launcher.drivers[0].agent.status_requests)
        agent = launcher.drivers[0].agent
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: bool(supervisor.record.coordinator.savepoints))
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: bool(agent.discarded_savepoints))
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return agent, lines

    agent, lines = asyncio.run(scenario())
    assert agent.discarded_savepoints == [1]
    assert (
        "deleting savepoint 1 (batch 3): older than the savepoint history keeps "
        "(spec.savepoints.historyMaxCount 1)"  # no historyMaxAge set: not named
    ) in lines


class StartingAgent(FakeAgent):
    """Not listening yet: the driver restores its image and starts Spark first."""

    def __init__(self) -> None:
        super().__init__()
        self.reachable = False


def test_a_lowered_history_deletes_through_the_agent_once_it_answers_without_a_warning() -> None:
    """A newcomer lowered historyMaxCount: the run asked the new driver's agent to delete
    the savepoints before it listened, five 'savepoint N is not deleted yet: ... Connection
    refused' lines for a routine deletion. They are asked at its first answer, not only
    after a completion (a job without periodic checkpoints has none: a reviewer's)."""
    savepoints = tuple(
        CompletedCheckpoint(n, CheckpointKind.SAVEPOINT, n, f"file:///s/sp-{n}", 1, n, n)
        for n in (1, 2, 3)
    )
    record = JobRecord(attempt=1, coordinator=PersistedState(4, savepoints=savepoints))

    async def scenario() -> tuple[FakeAgent, list[str]]:
        launcher = FakeLauncher()
        launcher.agent_class = StartingAgent
        supervisor, lines = _supervisor(launcher, record=record, savepoints_kept=1, interval=None)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers))
        agent = launcher.drivers[0].agent
        await until(lambda: len(supervisor.record.discards_due) == 2)  # the history's
        agent.reachable = True
        await until(lambda: len(agent.discarded_savepoints) == 2)
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return agent, lines

    agent, lines = asyncio.run(scenario())
    assert agent.discarded_savepoints == [1, 2]
    assert [line for line in lines if "not deleted yet" in line] == [], lines


def test_the_history_deletes_a_savepoint_a_restore_failed_on_before_one_it_can_restore() -> None:
    """The supervisor's record of images a restore failed on reaches the savepoint
    history: with room for 2, savepoint 2 (unrestorable) goes, not savepoint 1."""

    async def scenario() -> tuple[FakeAgent, JobSupervisor, list[str]]:
        launcher = FakeLauncher()
        supervisor, lines = _supervisor(launcher, interval=None, savepoints_kept=2)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and launcher.drivers[0].agent.status_requests)
        agent = launcher.drivers[0].agent
        for taken in (1, 2):
            supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
            await until(lambda n=taken: len(supervisor.record.coordinator.savepoints) == n)
        supervisor.record.unrestorable.append(
            UnrestorableImage("savepoint:2", "its restored query failed", 1)
        )
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: bool(agent.discarded_savepoints))
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return agent, supervisor, lines

    agent, supervisor, lines = asyncio.run(scenario())
    assert agent.discarded_savepoints == [2]
    assert [s.checkpoint_id for s in supervisor.record.coordinator.savepoints] == [1, 3]
    # Not "older than the history keeps" (a newcomer's: savepoint 1 stays).
    [said] = [line for line in lines if line.startswith("deleting savepoint 2")]
    assert said.endswith(
        "not restored from again (its restored query failed): the first to go over the "
        "savepoint history (spec.savepoints.historyMaxCount 2)"
    )


class RefusingAgent(FakeAgent):
    """Answers every trigger with an error, as an agent that is closing does."""

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        self._check()
        self.triggers.append(checkpoint_id)
        raise AgentRejected(f"POST /v1/checkpoints: 409 checkpoint {checkpoint_id} refused")


class FinalizeRefusingAgent(FakeAgent):
    """Every checkpoint fails: its `_metadata` cannot be written."""

    async def finalize(
        self, checkpoint_id: int, tasks: list[str], *, waits: float = 0.0
    ) -> FinalizeAnswer:
        self._check()
        raise AgentRejected(f"POST /v1/checkpoints/{checkpoint_id}/finalize: 500 storage gone")


class LingeringDriver(FakeDriver):
    """Told to stop, it exits a second later, as a JVM does."""

    async def terminate(self) -> None:
        def exit_now() -> None:
            if self.code is None:
                self.code = -15

        asyncio.get_running_loop().call_later(1.0, exit_now)


class FailingCheckpointsLauncher(FakeLauncher):
    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        self.restores.append(restore)
        self.drivers.append(LingeringDriver(FinalizeRefusingAgent()))
        return self.drivers[-1]


def test_checkpoint_failures_past_the_tolerance_fail_the_driver_and_trigger_no_more() -> None:
    """Flink's "fail the job" is a failover: the driver is stopped and the restart policy
    applies. While it stops, nothing more is triggered on it."""

    async def scenario() -> tuple[FakeLauncher, list[str]]:
        launcher = FailingCheckpointsLauncher()
        supervisor, lines = _supervisor(launcher, max_retries=1)  # tolerableFailures 0
        assert await asyncio.wait_for(supervisor.run(), 20) is TerminalOutcome.FAILED
        return launcher, lines

    launcher, lines = asyncio.run(scenario())
    told = [line for line in lines if line.startswith("failing the driver")]
    assert told[0] == (
        "failing the driver: 1 consecutive checkpoint failures exceed tolerableFailures=0; "
        "last: checkpoint 1: writing the checkpoint metadata failed: POST "
        "/v1/checkpoints/1/finalize: 500 storage gone; restartPolicy decides what follows"
    )
    assert len(launcher.drivers) == 2, "restarted once (maxRetries 1)"
    assert [len(driver.agent.triggers) for driver in launcher.drivers] == [1, 1], lines


def test_a_job_suspended_before_its_next_driver_runs_does_not_carry_the_last_failure() -> None:
    """Why the driver before failed is in its events: the suspension's message is its own."""

    class SecondStillStarting(FailingCheckpointsLauncher):
        async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
            driver = await super().launch(attempt, restore)
            driver.agent.reachable = attempt == 1
            return driver

    async def scenario() -> tuple[TerminalOutcome, str]:
        launcher = SecondStillStarting()
        supervisor, _ = _supervisor(launcher, max_retries=3)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: len(launcher.drivers) == 2)
        assert supervisor.record.message.startswith("1 consecutive checkpoint failures")
        supervisor.suspend_now()
        return await asyncio.wait_for(run, 10), supervisor.record.message

    assert asyncio.run(scenario()) == (TerminalOutcome.SUSPENDED, "")


def test_refused_triggers_do_not_fail_a_job_that_tolerates_no_failure() -> None:
    async def scenario() -> tuple[TerminalOutcome, JobSupervisor, FakeLauncher, list[str]]:
        launcher = FakeLauncher()
        launcher.agent_class = RefusingAgent
        supervisor, lines = _supervisor(launcher)  # tolerableFailures 0, interval 0.2 s
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and len(launcher.drivers[0].agent.triggers) > 2)
        launcher.drivers[0].code = DriverExit.FINISHED
        return await run, supervisor, launcher, lines

    outcome, supervisor, launcher, lines = asyncio.run(scenario())
    assert outcome is TerminalOutcome.FINISHED
    assert len(launcher.drivers) == 1
    assert not any("failing the driver" in line for line in lines)
    assert supervisor.record.consecutive_failures == 0


def test_a_checkpoint_a_finished_driver_cut_short_is_given_up_not_failed() -> None:
    """A driver told of a completion covering its input's end exits at once, maybe before
    a status says so: the checkpoint in flight then was reported failed ("the job left the
    Running phase"), and a clean bounded run ended "1 failed" (exactly-once tester)."""

    class SilentAgent(FakeAgent):
        async def trigger(
            self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
        ) -> None:
            self.triggers.append(checkpoint_id)  # never acknowledged: it stays pending

    running = FakeDriver(SilentAgent())

    async def scenario() -> list[str]:
        launcher = FakeLauncher(running=running)
        supervisor, lines = _supervisor(launcher, record=JobRecord(attempt=1))
        run = asyncio.create_task(supervisor.run())
        await until(lambda: running.agent.triggers)
        running.code = DriverExit.FINISHED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FINISHED
        return lines

    lines = asyncio.run(scenario())
    assert not [line for line in lines if " failed" in line], lines
    assert [line for line in lines if "given up: the input is done" in line], lines


def test_a_suspension_without_a_savepoint_keeps_the_checkpoints_it_resumes_from() -> None:
    """A job suspended while it restarts (or whose savepoint was declined) takes no
    savepoint: it resumes from its newest checkpoint, which NeverRetainAfterTermination
    discarded at the suspension (a reviewer). Flink discards only in globally terminal
    states."""
    janitor = NoJanitor()

    async def save(record: JobRecord) -> None:
        return None

    async def scenario() -> tuple[TerminalOutcome, JobSupervisor]:
        launcher = FakeLauncher()
        supervisor = JobSupervisor(
            storage=STORAGE,
            config=CoordinatorConfig(
                interval=None,
                timeout=30.0,
                retention_policy=RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION,
            ),
            # A long backoff: the suspension comes while no driver runs.
            restart_policy=RestartPolicySpec(RestartPolicyType.ON_FAILURE, 5, 30.0, 30.0),
            launcher=launcher,
            janitor=janitor,
            save=save,
            record=JobRecord(),
        )
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: len(supervisor.record.coordinator.checkpoints) == 1)
        launcher.drivers[0].code = 1  # the driver crashes
        await until(lambda: supervisor.record.phase is JobPhase.RESTARTING)
        supervisor.suspend_now()  # spec.state: Suspended while it restarts
        return await run, supervisor

    outcome, supervisor = asyncio.run(scenario())

    assert outcome is TerminalOutcome.SUSPENDED
    assert janitor.discarded == []
    assert [c.checkpoint_id for c in supervisor.record.coordinator.checkpoints] == [1]


class SlowFinalizeAgent(FakeAgent):
    """Writing `_metadata` takes longer than any finalize may wait."""

    def __init__(self) -> None:
        super().__init__()
        self.finalize_waits: list[float] = []

    async def finalize(
        self, checkpoint_id: int, tasks: list[str], *, waits: float = 0.0
    ) -> FinalizeAnswer:
        self.finalize_waits.append(waits)
        raise AgentAnswerTimedOut(f"POST /v1/checkpoints/{checkpoint_id}/finalize: no answer")


def test_finalizations_that_take_too_long_fail_checkpoints_that_count() -> None:
    """A finalize not answered in time was taken for a lost agent: the job left Running,
    the checkpoint was aborted uncounted and the next one triggered, for ever, and
    tolerableFailures never failed the job (a reviewer)."""
    launcher = FakeLauncher()
    launcher.agent_class = SlowFinalizeAgent

    async def save(record: JobRecord) -> None:
        return None

    supervisor = JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(interval=0.2, timeout=30.0, tolerable_failures=1),
        restart_policy=RestartPolicySpec(
            RestartPolicyType.NEVER, 0, 0.01, 0.05, heartbeat_timeout=20.0
        ),
        launcher=launcher,
        janitor=NoJanitor(),
        save=save,
        record=JobRecord(),
    )

    outcome = asyncio.run(asyncio.wait_for(supervisor.run(), 20.0))

    assert outcome is TerminalOutcome.FAILED
    assert "2 consecutive checkpoint failures exceed tolerableFailures=1" in (
        supervisor.record.message
    )
    agent = launcher.drivers[0].agent
    assert isinstance(agent, SlowFinalizeAgent)
    assert len(agent.finalize_waits) == 2
    # As long as the checkpoint has left, at most the heartbeat timeout.
    assert all(19.0 < waits <= 20.0 for waits in agent.finalize_waits), agent.finalize_waits


class DrainingAgent(FakeAgent):
    """A drain savepoint's snapshot waits (capturing, no batch) until the input runs out;
    the driver exits once told of it."""

    def __init__(self) -> None:
        super().__init__()
        self.draining: int | None = None
        self.driver: FakeDriver | None = None

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        await super().trigger(checkpoint_id, kind, after)
        if after is AfterCompletion.DRAIN:
            self.draining = checkpoint_id
            self.snapshots[checkpoint_id] = SnapshotStatus(
                checkpoint_id, kind, SnapshotPhase.CAPTURING, None
            )

    def drained(self) -> None:
        assert self.draining is not None
        self.batch = (self.batch or 0) + 5
        acks = tuple(AckReport(task, self.batch, 10, 1) for task in TASKS)
        self.snapshots[self.draining] = SnapshotStatus(
            self.draining, CheckpointKind.SAVEPOINT, SnapshotPhase.ACKNOWLEDGED, self.batch, acks
        )

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        await super().complete(checkpoint_id, batch_id)
        if checkpoint_id == self.draining and self.driver is not None:
            self.driver.code = DriverExit.STOPPED_WITH_SAVEPOINT


def test_a_drain_longer_than_the_checkpoint_timeout_ends_with_its_savepoint() -> None:
    """`stop --drain` processes all input first: the savepoint's timeout counted from the
    trigger, and a drain longer than it ended without one (a newcomer)."""
    launcher = FakeLauncher()
    launcher.agent_class = DrainingAgent

    async def save(record: JobRecord) -> None:
        return None

    supervisor = JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(interval=None, timeout=1.0),
        restart_policy=RestartPolicySpec(RestartPolicyType.NEVER, 0, 0.01, 0.05),
        launcher=launcher,
        janitor=NoJanitor(),
        save=save,
        record=JobRecord(),
    )

    async def scenario() -> TerminalOutcome:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        agent = launcher.drivers[0].agent
        assert isinstance(agent, DrainingAgent)
        agent.driver = launcher.drivers[0]
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT, after=AfterCompletion.DRAIN))
        await until(lambda: agent.draining is not None)
        await asyncio.sleep(2.5)  # draining for longer than the timeout
        agent.drained()
        return await asyncio.wait_for(run, 10.0)

    assert asyncio.run(scenario()) is TerminalOutcome.SUSPENDED
    (savepoint,) = supervisor.record.coordinator.savepoints
    assert savepoint.batch_id == 8
    assert supervisor.record.coordinator.failed_count == 0


class SlowDiscardAgent(FakeAgent):
    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        # What AgentClient raises after its timeout: the agent's storage thread goes on.
        raise AgentAnswerTimedOut(f"POST /v1/checkpoints/{checkpoint_id}/discard: no answer")


class WatchingJanitor(NoJanitor):
    def __init__(self, launcher: FakeLauncher) -> None:
        super().__init__()
        self._launcher = launcher
        self.beside_a_live_driver: list[int] = []

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        if any(driver.code is None for driver in self._launcher.drivers):
            self.beside_a_live_driver.append(checkpoint_id)
        await super().discard_checkpoint(checkpoint_id, retained)


def _one_checkpoint_kept(launcher: FakeLauncher, janitor: NoJanitor) -> JobSupervisor:
    """A job that takes checkpoints when asked, retains one and never restarts."""

    async def save(record: JobRecord) -> None:
        return None

    return JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(interval=None, timeout=30.0, retained=1),
        restart_policy=RestartPolicySpec(RestartPolicyType.NEVER, 0, 0.01, 0.05),
        launcher=launcher,
        janitor=janitor,
        save=save,
        record=JobRecord(),
    )


def test_a_discard_the_agent_did_not_take_is_done_by_the_janitor_once_the_driver_is_gone() -> None:
    """Storage has one writer per job: a discard the live agent did not answer was handed
    to the janitor at once, beside a driver that may still write (a reviewer)."""
    launcher = FakeLauncher()
    launcher.agent_class = SlowDiscardAgent
    janitor = WatchingJanitor(launcher)
    supervisor = _one_checkpoint_kept(launcher, janitor)

    async def scenario() -> None:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: len(supervisor.record.coordinator.checkpoints) == 1)
        launcher.drivers[0].agent.batch = 4
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: supervisor.record.coordinator.checkpoints[0].checkpoint_id == 2)
        await asyncio.sleep(0.5)
        assert janitor.discarded == [], "not while the driver runs"
        launcher.drivers[0].code = 0
        await run

    asyncio.run(scenario())
    assert janitor.discarded[0] == 1, "once it is gone"
    assert janitor.beside_a_live_driver == []


class NeverAcknowledgingAgent(FakeAgent):
    """Its snapshots never get past capturing: a checkpoint stays in flight."""

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        await super().trigger(checkpoint_id, kind, after)
        self.snapshots[checkpoint_id] = SnapshotStatus(
            checkpoint_id, kind, SnapshotPhase.CAPTURING, None
        )


def test_a_checkpoint_in_flight_when_the_job_is_cancelled_is_given_up_not_failed() -> None:
    """A cancel's run summary said "1 failed" for the checkpoint it cut short, a warning
    line among the cancel's (a newcomer): the job did not fail to checkpoint."""
    launcher = FakeLauncher()
    launcher.agent_class = NeverAcknowledgingAgent
    supervisor, lines = _supervisor(launcher, interval=None)

    async def scenario() -> TerminalOutcome:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: bool(launcher.drivers[0].agent.triggers))
        supervisor.cancel()
        return await asyncio.wait_for(run, 10.0)

    assert asyncio.run(scenario()) is TerminalOutcome.CANCELLED
    assert "checkpoint 1 given up: the job is cancelled" in lines
    assert not [line for line in lines if "failed" in line], lines


def test_a_checkpoint_a_newer_one_overtook_is_given_up_without_a_warning() -> None:
    """A bounded job's final checkpoint overtaking a periodic one posted a CheckpointFailed
    warning on a clean finish (a newcomer's); the history counts it failed, as Flink's."""
    launcher = FakeLauncher()
    notices: list[Notice] = []
    supervisor, lines = _supervisor(launcher, interval=0.1, noticed=notices.append)
    held: list[int] = []

    async def scenario() -> TerminalOutcome:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and bool(launcher.drivers[0].agent.completed))
        agent = launcher.drivers[0].agent
        acknowledged = agent.trigger

        async def first_held(checkpoint_id: int, *args: Any) -> None:
            if not held:
                held.append(checkpoint_id)
                agent.triggers.append(checkpoint_id)
                return
            await acknowledged(checkpoint_id, *args)

        agent.trigger = first_held  # type: ignore[method-assign]
        await until(lambda: bool(held))
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT, forced=True, label="now"))
        await until(lambda: supervisor.record.coordinator.failed_count == 1)
        launcher.drivers[0].code = DriverExit.FINISHED
        return await asyncio.wait_for(run, 10.0)

    assert asyncio.run(scenario()) is TerminalOutcome.FINISHED
    overtaken = [line for line in lines if line.startswith(f"checkpoint {held[0]} ")]
    assert len(overtaken) == 1 and re.fullmatch(
        rf"checkpoint {held[0]} given up: a newer checkpoint completed first: by checkpoint \d+",
        overtaken[0],
    ), overtaken
    assert not [line for line in lines if " failed" in line], lines
    # Why, for a snapshot object's checkpoint: its failure (kubernetes/snapshots.py `answer`).
    (given_up,) = [n for n in notices if n.message == overtaken[0]]
    assert (given_up.reason, given_up.level, given_up.cause) == (
        "CheckpointNotNeeded",
        Level.DETAIL,
        FailureReason.SUBSUMED,
    )


def test_a_triggered_checkpoint_ends_the_skipped_streak_in_status_at_once() -> None:
    """status.checkpointsSkipped (CheckpointsHealthy False) stayed until the next status
    write, the triggered checkpoint's completion, however long that took (a reviewer)."""
    launcher = FakeLauncher()
    skipped: list[object] = []  # status.checkpointsSkipped at each status write
    supervisor, _lines = _supervisor(
        launcher, interval=0.1, saved=lambda record: skipped.append(record.checkpoints_skipped)
    )
    held: list[int] = []

    async def never_acknowledged(checkpoint_id: int, *_: object) -> None:
        held.append(checkpoint_id)

    async def scenario() -> TerminalOutcome:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and bool(launcher.drivers[0].agent.completed))
        driver = launcher.drivers[0]
        driver.executors = False
        await until(lambda: skipped[-1] is not None)
        driver.agent.trigger = never_acknowledged  # type: ignore[method-assign]
        driver.executors = True
        await until(lambda: bool(held))
        # Well before the checkpoint's timeout (5 s), whose abort writes status too.
        await until(lambda: skipped[-1] is None, timeout=2.0)
        driver.code = DriverExit.FINISHED
        return await asyncio.wait_for(run, 10.0)

    assert asyncio.run(scenario()) is TerminalOutcome.FINISHED


def test_skipped_checkpoints_are_said_while_running_and_forgotten_when_the_job_ends() -> None:
    """An ended job kept status.checkpointsSkipped, so CheckpointsHealthy stayed False for
    good (a reviewer)."""
    launcher = FakeLauncher()
    supervisor, lines = _supervisor(launcher, interval=0.1)

    async def scenario() -> TerminalOutcome:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and bool(launcher.drivers[0].agent.completed))
        driver = launcher.drivers[0]
        driver.executors = False  # an executor lost: periodic checkpoints are skipped
        await until(lambda: supervisor.record.checkpoints_skipped is not None)
        driver.code = DriverExit.FINISHED
        return await asyncio.wait_for(run, 10.0)

    assert asyncio.run(scenario()) is TerminalOutcome.FINISHED
    skipped = [line for line in lines if line.startswith("periodic checkpoint skipped")]
    assert skipped == [
        "periodic checkpoint skipped: not all required tasks are running (the query is "
        "starting or has not committed its first batch yet, the driver is restarting, or an "
        "executor is missing); an executor is missing; checkpoints resume once every task runs"
    ], "once per streak"
    assert supervisor.record.checkpoints_skipped is None


class OnceRefusingDiscardAgent(FakeAgent):
    """Refuses the first discard (a blip); takes the rest, noting what each keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[int, list[int]] = {}
        self.refused: list[int] = []

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        if not self.refused:
            self.refused.append(checkpoint_id)
            raise AgentUnavailable("connection reset by peer")
        await super().discard_checkpoint(checkpoint_id, retained)
        self.kept[checkpoint_id] = retained


def test_a_discard_the_agent_did_not_take_is_asked_of_it_again_after_the_next_completion() -> None:
    """It waited for the driver to exit, months for a streaming job, and then kept what the
    registry retained when it was refused: checkpoints completed since may share its files
    (a reviewer)."""
    launcher = FakeLauncher()
    launcher.agent_class = OnceRefusingDiscardAgent
    janitor = NoJanitor()
    supervisor = _one_checkpoint_kept(launcher, janitor)

    async def scenario() -> OnceRefusingDiscardAgent:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        agent = launcher.drivers[0].agent
        assert isinstance(agent, OnceRefusingDiscardAgent)
        for checkpoints in (1, 2, 3):
            agent.batch = 3 + checkpoints
            supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
            await until(lambda n=checkpoints: len(agent.completed) == n)
        await until(lambda: 2 in agent.kept)
        launcher.drivers[0].code = 0
        await run
        return agent

    agent = asyncio.run(scenario())
    assert (agent.refused, agent.discarded) == ([1], [1, 2])
    assert agent.kept == {1: [3], 2: [3]}, "what the registry retains when it is done"
    assert {1, 2}.isdisjoint(janitor.discarded), "not again after the driver exits"


class SavepointDiscardAgent(FakeAgent):
    """Takes savepoint discards as ``discards`` says: "take", "refuse" (a storage blip, a
    restarting pod) or "hang" (under way when the operator is killed)."""

    discards = "refuse"

    def __init__(self) -> None:
        super().__init__()
        self.hanging: list[int] = []

    async def discard_savepoint(self, savepoint_id: int) -> None:
        if self.discards == "refuse":
            raise AgentUnavailable("connection reset by peer")
        if self.discards == "hang":
            self.hanging.append(savepoint_id)
            await asyncio.Event().wait()
        await super().discard_savepoint(savepoint_id)


def _one_savepoint_kept(
    launcher: FakeLauncher,
    janitor: NoJanitor,
    record: JobRecord,
    statuses: list[dict[str, Any]],
    lines: list[str] | None = None,
    *,
    retained: int = 1,
) -> JobSupervisor:
    """A job whose savepoint history keeps one (and ``retained`` checkpoints); each status
    write is appended to ``statuses``, as the API server (or the local status file) would
    hold it, each notice's message to ``lines``."""

    async def save(saved: JobRecord) -> None:
        statuses.append(saved.to_dict())

    return JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(
            interval=None,
            timeout=30.0,
            retained=retained,
            savepoint_history=SavepointHistoryLimits(max_count=1),
        ),
        restart_policy=RestartPolicySpec(RestartPolicyType.ON_FAILURE, 3, 0.01, 0.05),
        launcher=launcher,
        janitor=janitor,
        save=save,
        record=record,
        report=lambda notice: None if lines is None else lines.append(notice.message),
    )


@pytest.mark.parametrize(
    ("discards", "driver"), [("refuse", "adopted"), ("refuse", "gone"), ("hang", "adopted")]
)
def test_a_discard_due_when_the_operator_restarts_is_done_after_it(
    discards: str, driver: str
) -> None:
    """The savepoint history's discard the agent did not take lived in the supervisor's
    memory: an operator restart before the driver took it left the savepoint in storage
    for good (garbage collection keeps an unregistered savepoint as the user's), as did a
    restart while the agent was at it. Now it is due in the status from the state write
    that let it go: the restarted operator asks the driver it adopts, or a new one, after
    its next completion."""
    launcher = FakeLauncher()
    launcher.agent_class = SavepointDiscardAgent
    SavepointDiscardAgent.discards = discards
    statuses: list[dict[str, Any]] = []
    lines: list[str] = []
    first = _one_savepoint_kept(launcher, NoJanitor(), JobRecord(), statuses, lines)

    def said() -> Any:
        due = statuses[-1]["discardsDue"]
        return due and ("reason" in due[0] or launcher.drivers[0].agent.hanging)

    async def before_the_restart() -> int:
        run = asyncio.create_task(first.run())
        await until(lambda: first.record.phase is JobPhase.RUNNING)
        first.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: len(first.record.coordinator.savepoints) == 1)
        (dropped,) = first.record.coordinator.savepoints
        first.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(said)
        run.cancel()  # the operator is killed: its driver runs on
        with contextlib.suppress(asyncio.CancelledError):
            await run
        return dropped.checkpoint_id

    dropped = asyncio.run(before_the_restart())
    refused = {"reason": "the driver's agent did not take it (connection reset by peer)"}
    assert statuses[-1]["discardsDue"] == [
        {"kind": "savepoint", "id": dropped, **(refused if discards == "refuse" else {})}
    ]
    assert [line for line in lines if "not deleted yet" in line] == (
        [
            f"savepoint {dropped} is not deleted yet: the driver's agent did not take it "
            "(connection reset by peer); the driver is asked again after the next completion, "
            "or a cleanup does it once none runs"
        ]
        if discards == "refuse"
        else []
    )
    running = launcher.drivers[0]
    if driver == "gone":
        running.code = -9  # it died while the operator was down
    restarted = FakeLauncher(running=running if driver == "adopted" else None)
    restarted.agent_class = SavepointDiscardAgent
    agent = running.agent if driver == "adopted" else None
    second = _one_savepoint_kept(
        restarted, NoJanitor(), JobRecord.from_dict(statuses[-1]), statuses
    )

    async def after_the_restart() -> FakeAgent:
        run = asyncio.create_task(second.run())
        await until(lambda: agent is not None or bool(restarted.drivers))
        now = agent or restarted.drivers[0].agent
        assert isinstance(now, SavepointDiscardAgent)
        now.discards = "take"
        for _ in range(50):  # declined until the restarted operator has the driver running
            second.request(TriggerRequested(CheckpointKind.CHECKPOINT))
            await asyncio.sleep(0.2)
            if now.completed:
                break
        await until(lambda: bool(now.discarded_savepoints))
        second.cancel()
        await run
        return now

    took = asyncio.run(after_the_restart())
    assert took.discarded_savepoints == [dropped]
    assert second.record.discards_due == []
    assert statuses[-1]["discardsDue"] == []


class DiscardRefusingAgent(FakeAgent):
    """Refuses discards: every one with ``unreachable`` (a network cut), those of
    ``rejected`` checkpoints (storage refusing them)."""

    def __init__(self) -> None:
        super().__init__()
        self.unreachable = False
        self.rejected: set[int] = set()
        self.rejects_all = False
        self.asked: list[int] = []  # checkpoint discards asked

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        self.asked.append(checkpoint_id)
        if self.unreachable:
            raise AgentUnavailable("connection refused")
        if checkpoint_id in self.rejected or self.rejects_all:
            # A storage error's text can be long (an S3 answer's XML).
            raise AgentRejected(f"500 storage refused deleting chk-{checkpoint_id}: " + "x" * 1999)
        await super().discard_checkpoint(checkpoint_id, retained)

    async def discard_savepoint(self, savepoint_id: int) -> None:
        if self.unreachable:
            raise AgentUnavailable("connection refused")
        await super().discard_savepoint(savepoint_id)


def _take(supervisor: JobSupervisor, agent: FakeAgent, kind: CheckpointKind) -> Any:
    """Request one and wait until it is done (a savepoint completes at finalization)."""
    registered = supervisor.record.coordinator
    before = registered.completed_count
    supervisor.request(TriggerRequested(kind))
    return until(lambda: supervisor.record.coordinator.completed_count > before)


def _refusing_job(
    lines: list[str] | None = None,
) -> tuple[FakeLauncher, JobSupervisor, list[dict[str, Any]]]:
    """`_one_savepoint_kept` with a DiscardRefusingAgent: its launcher, itself, and the
    statuses it writes."""
    launcher = FakeLauncher()
    launcher.agent_class = DiscardRefusingAgent
    statuses: list[dict[str, Any]] = []
    supervisor = _one_savepoint_kept(launcher, NoJanitor(), JobRecord(), statuses, lines)
    return launcher, supervisor, statuses


async def _running(
    supervisor: JobSupervisor, launcher: FakeLauncher
) -> tuple["asyncio.Task[TerminalOutcome]", DiscardRefusingAgent]:
    """The supervisor's run, once its driver runs, and that driver's agent."""
    run = asyncio.create_task(supervisor.run())
    await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
    agent = launcher.drivers[0].agent
    assert isinstance(agent, DiscardRefusingAgent)
    return run, agent


def test_one_discard_storage_refuses_does_not_hold_the_others() -> None:
    """The discards due stopped at the first refusal: one image storage would not delete
    (a link in the way, a lock) held every later one for good."""
    launcher, supervisor, _statuses = _refusing_job()

    async def scenario() -> tuple[list[int], list[DiscardDue]]:
        run, agent = await _running(supervisor, launcher)
        agent.unreachable = True
        for _ in range(3):  # checkpoints 1 and 2 are let go, not discarded
            await _take(supervisor, agent, CheckpointKind.CHECKPOINT)
        agent.unreachable = False
        agent.rejected = {1}
        await _take(supervisor, agent, CheckpointKind.CHECKPOINT)
        await until(lambda: 3 in agent.discarded)
        running = sorted(agent.discarded), list(supervisor.record.discards_due)
        supervisor.cancel()  # the janitor does the rest
        await run
        return running

    discarded, due = asyncio.run(scenario())
    assert discarded == [2, 3]
    assert [(d.checkpoint_id, d.reason) for d in due] == [
        (1, "the driver's agent did not take it (connection refused)")
    ]


def test_a_storage_refusing_every_delete_is_asked_a_few_each_completion() -> None:
    """With every discard refused, each completion asked again for every discard due (up
    to 110 storage round trips, each holding the agent's discard lock), and kept each
    refusal's whole text in the status (a reviewer)."""
    launcher, supervisor, _statuses = _refusing_job()

    async def scenario() -> tuple[list[int], list[DiscardDue]]:
        run, agent = await _running(supervisor, launcher)
        agent.rejects_all = True
        for _ in range(7):  # checkpoints 1 to 6 are let go
            await _take(supervisor, agent, CheckpointKind.CHECKPOINT)
        await until(lambda: len(supervisor.record.discards_due) == 6)
        agent.asked.clear()
        await _take(supervisor, agent, CheckpointKind.CHECKPOINT)
        await until(lambda: len(supervisor.record.discards_due) == 7)
        running = list(agent.asked), list(supervisor.record.discards_due)
        supervisor.cancel()
        await run
        return running

    asked, due = asyncio.run(scenario())
    *asked_again, own = asked
    assert len(asked_again) == interpreter.REFUSALS_PER_ROUND, asked
    assert own == 7, "the completion's own discard, after the round"
    assert sorted(d.checkpoint_id for d in due) == [1, 2, 3, 4, 5, 6, 7]
    assert [d.checkpoint_id for d in due][-3:] == asked_again, "those refused go last"
    assert {len(d.reason or "") for d in due} == {MESSAGE_CHARACTERS}


def test_a_storage_that_refuses_every_delete_keeps_the_status_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every discard refused (a bucket's policy denies deletes) grew status.discardsDue
    by one entry a checkpoint, until the object passed the API server's size limit and
    no status write went through. The oldest checkpoints' go to garbage collection; the
    oldest savepoints' are given up, and said."""
    monkeypatch.setattr(interpreter, "CHECKPOINT_DISCARDS_KEPT", 2)
    monkeypatch.setattr(interpreter, "SAVEPOINT_DISCARDS_KEPT", 1)
    lines: list[str] = []
    launcher, supervisor, statuses = _refusing_job(lines)

    async def scenario() -> list[dict[str, Any]]:
        run, agent = await _running(supervisor, launcher)
        agent.unreachable = True
        for kind in [CheckpointKind.CHECKPOINT] * 5 + [CheckpointKind.SAVEPOINT] * 3:
            await _take(supervisor, agent, kind)
        await until(lambda: len(statuses[-1]["discardsDue"]) == 3)
        running = list(statuses[-1]["discardsDue"])
        supervisor.cancel()
        await run
        return running

    due = [(d["kind"], d["id"]) for d in asyncio.run(scenario())]
    assert due == [("checkpoint", 3), ("checkpoint", 4), ("savepoint", 7)]
    assert [line for line in lines if "left to garbage collection" in line] == [
        "checkpoint 1 is left to garbage collection (when the next driver starts, or the job "
        "ends): 2 newer checkpoint discards are due",
        "checkpoint 2 is left to garbage collection (when the next driver starts, or the job "
        "ends): 2 newer checkpoint discards are due",
    ]
    assert [line for line in lines if "stays in storage" in line] == [
        "savepoint 6 stays in storage, no longer due for discarding: 1 newer savepoint "
        "discards are due (the driver's agent did not take it (connection refused)); delete "
        "it by hand"
    ]


async def _cancelled_after_three_checkpoints(
    supervisor: JobSupervisor, launcher: FakeLauncher
) -> None:
    """Three checkpoints, then a cancellation, whose retention (with ``retained`` 3) lets
    go of all three at once."""
    run = asyncio.create_task(supervisor.run())
    await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
    for _ in range(3):
        await _take(supervisor, launcher.drivers[0].agent, CheckpointKind.CHECKPOINT)
    supervisor.cancel()
    await run


def test_discards_queued_together_are_not_cut_by_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound on checkpoint discards due counted those queued behind the state write:
    a termination that let go of more checkpoints than the bound left the oldest to garbage
    collection, said so, moments before their own discards ran (a reviewer)."""
    monkeypatch.setattr(interpreter, "CHECKPOINT_DISCARDS_KEPT", 1)
    launcher = FakeLauncher()
    janitor = NoJanitor()
    statuses: list[dict[str, Any]] = []
    lines: list[str] = []
    supervisor = _one_savepoint_kept(launcher, janitor, JobRecord(), statuses, lines, retained=3)

    asyncio.run(_cancelled_after_three_checkpoints(supervisor, launcher))
    assert sorted(janitor.discarded) == [1, 2, 3]
    assert [line for line in lines if "garbage collection" in line] == []
    assert statuses[-1]["discardsDue"] == []


class AlwaysFailingJanitor(NoJanitor):
    async def discard_savepoint(self, savepoint_id: int) -> None:
        self.discarded_savepoints.append(-savepoint_id)
        raise CleanupFailed("cleanup pod cannot start: ImagePullBackOff")


class FailingCheckpointJanitor(NoJanitor):
    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        self.discarded.append(-checkpoint_id)
        raise CleanupFailed("cleanup pod cannot start: ImagePullBackOff")


def test_a_janitor_that_failed_is_not_asked_for_each_discard_of_the_same_end() -> None:
    """A termination's retention started one cleanup pod per checkpoint, each failing as
    the first did (an image that cannot be pulled, a pod that cannot be scheduled: up to
    600 s each), before the job ended (a reviewer)."""
    launcher = FakeLauncher()
    janitor = FailingCheckpointJanitor()
    lines: list[str] = []
    supervisor = _one_savepoint_kept(launcher, janitor, JobRecord(), [], lines, retained=3)

    asyncio.run(_cancelled_after_three_checkpoints(supervisor, launcher))
    assert janitor.discarded == [-1, -1], "once among the effects, once for what is due"
    assert [d.checkpoint_id for d in supervisor.record.discards_due] == [1, 2, 3]
    assert len([line for line in lines if line.startswith("storage cleanup failed")]) == 2


def test_at_the_deletion_each_discard_due_is_tried_and_a_savepoint_left_is_said() -> None:
    """The janitor stops at its first failure, the rest waiting for its next chance: at
    the deletion there is none, and the savepoints behind the first were left in storage
    without a word (a reviewer)."""
    janitor = AlwaysFailingJanitor()
    due = [DiscardDue(CheckpointKind.SAVEPOINT, 4), DiscardDue(CheckpointKind.SAVEPOINT, 6)]
    record = JobRecord(phase=JobPhase.FINISHED, attempt=1, discards_due=due)
    lines: list[str] = []
    ended = _one_savepoint_kept(FakeLauncher(), janitor, record, [], lines)

    asyncio.run(ended.collect_leftovers())
    assert janitor.discarded_savepoints == [-4], "the next chance is the deletion"

    asyncio.run(ended.collect_leftovers(deleting=True))
    assert janitor.discarded_savepoints == [-4, -4, -6]
    assert [line for line in lines if "stays in storage" in line] == [
        "savepoint 4 stays in storage: the job is deleted and its discard failed; delete it "
        "by hand",
        "savepoint 6 stays in storage: the job is deleted and its discard failed; delete it "
        "by hand",
    ]


class OnceFailingJanitor(NoJanitor):
    async def discard_savepoint(self, savepoint_id: int) -> None:
        if not self.discarded_savepoints:
            self.discarded_savepoints.append(-savepoint_id)  # the failed try
            raise CleanupFailed("cleanup pod sc-cleanup-1 failed: 503 Slow Down")
        await super().discard_savepoint(savepoint_id)


def test_a_discard_the_janitor_failed_stays_due_until_the_deletion_of_the_ended_job() -> None:
    """A cleanup that failed was said once (CleanupFailed) and forgotten: a savepoint
    stayed in storage for good. It stays due, and the deletion of the ended job does it."""
    launcher = FakeLauncher()
    janitor = OnceFailingJanitor()
    statuses: list[dict[str, Any]] = []
    due = DiscardDue(CheckpointKind.SAVEPOINT, 4, "the driver's agent did not take it (reset)")
    record = JobRecord(phase=JobPhase.FINISHED, attempt=1, discards_due=[due])
    lines: list[str] = []
    ended = _one_savepoint_kept(launcher, janitor, record, statuses, lines)

    asyncio.run(ended.collect_leftovers())
    assert janitor.discarded_savepoints == [-4]
    assert statuses == [], "nothing changed: nothing written"
    assert ended.record.discards_due == [due]
    assert lines == ["storage cleanup failed: cleanup pod sc-cleanup-1 failed: 503 Slow Down"]

    asyncio.run(ended.collect_leftovers())  # the job is deleted
    assert janitor.discarded_savepoints == [-4, 4]
    assert ended.record.discards_due == []
    assert statuses[-1]["discardsDue"] == []
    assert lines[1:] == [
        "savepoint 4 discarded by the janitor: the driver's agent did not take it (reset)"
    ]


def test_a_triggered_checkpoint_is_in_progress_in_the_record_at_once() -> None:
    """The local `status` showed 'IN-PROGRESS 0' all through a drain, and `savepoint
    --detached` could miss its savepoint's id: the record's list of pending checkpoints was
    refreshed by state writes only, which a trigger makes only when it reserves ids (a
    newcomer)."""
    launcher = FakeLauncher()
    supervisor, _lines = _supervisor(launcher, interval=None)
    held: list[int] = []

    async def never_acknowledged(checkpoint_id: int, *_: object) -> None:
        held.append(checkpoint_id)

    async def scenario() -> None:
        run = asyncio.create_task(supervisor.run())
        await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))  # reserves ids
        await until(lambda: bool(launcher.drivers[0].agent.completed))
        launcher.drivers[0].agent.trigger = never_acknowledged  # type: ignore[method-assign]
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT, label="cli-1"))
        await until(lambda: bool(held))
        assert [(p["id"], p.get("label")) for p in supervisor.record.pending] == [
            (held[0], "cli-1")
        ]
        supervisor.cancel()
        await run

    asyncio.run(scenario())


class RestoringWithoutBatchLauncher(FakeLauncher):
    """Its second driver restores and reports no committed batch yet, then dies."""

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        driver = await super().launch(attempt, restore)
        if len(self.drivers) == 2:
            driver.agent.state = QueryState.RESTORING
            driver.agent.batch = None
        return driver


def test_a_restoring_driver_that_reports_no_batch_leaves_the_last_one_in_status() -> None:
    """status.lastCommittedBatch went null while a restarted driver restored, and stayed
    null once it died restoring: the last batch the job committed was gone from status."""
    saved: list[int | None] = []

    async def scenario() -> None:
        launcher = RestoringWithoutBatchLauncher()
        supervisor, _ = _supervisor(launcher, saved=lambda record: saved.append(record.last_batch))
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 1)
        launcher.drivers[0].code = 137
        await until(lambda: len(launcher.drivers) == 2)
        restoring = launcher.drivers[1].agent
        await until(lambda: restoring.status_requests >= 1)
        await asyncio.sleep(0.2)  # its status processed
        launcher.drivers[1].code = 137
        await until(lambda: len(launcher.drivers) == 3)
        launcher.drivers[2].code = DriverExit.FINISHED
        assert await asyncio.wait_for(run, 10) is TerminalOutcome.FINISHED

    asyncio.run(scenario())
    assert saved and None not in saved[saved.index(3) :], saved


class CompletionCutShortAgent(FakeAgent):
    """Its first completion call waits until released, then the connection drops."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
            raise AgentUnavailable("the connection closed before the agent answered")
        await super().complete(checkpoint_id, batch_id)


@pytest.mark.parametrize("cancelled", [False, True])
def test_a_completion_a_cancelled_driver_did_not_confirm_is_no_news(cancelled: bool) -> None:
    """`cancel` as a completion was under way said "nothing is lost: checkpoint 7 is
    registered, and sinks commit up to it when a driver restores it"; the cancellation's
    retention then deleted checkpoint 7 (a newcomer's). Not said while cancelling."""

    async def scenario() -> list[str]:
        launcher = FakeLauncher()
        launcher.agent_class = CompletionCutShortAgent
        supervisor, lines = _supervisor(launcher)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers))
        agent = launcher.drivers[0].agent
        assert isinstance(agent, CompletionCutShortAgent)
        await until(agent.entered.is_set)
        if cancelled:
            supervisor.cancel()
        agent.release.set()
        if not cancelled:
            await until(lambda: any("did not confirm the completion" in line for line in lines))
            supervisor.cancel()
        assert await asyncio.wait_for(run, 10.0) is TerminalOutcome.CANCELLED
        return lines

    lines = asyncio.run(scenario())

    said = [line for line in lines if "did not confirm the completion" in line]
    assert len(said) == (0 if cancelled else 1), lines


def test_what_a_cancellation_leaves_says_whether_a_savepoint_is_left_to_resume_from() -> None:
    async def scenario() -> tuple[str, str, str]:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, interval=None)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(launcher.drivers) and launcher.drivers[0].agent.status_requests)
        before = supervisor.what_cancelling_leaves()
        supervisor.request(TriggerRequested(CheckpointKind.CHECKPOINT))
        await until(lambda: bool(supervisor.record.coordinator.checkpoints))
        committed = supervisor.what_cancelling_leaves()
        supervisor.request(TriggerRequested(CheckpointKind.SAVEPOINT))
        await until(lambda: bool(supervisor.record.coordinator.savepoints))
        after = supervisor.what_cancelling_leaves()
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return before, committed, after

    before, committed, after = asyncio.run(scenario())
    assert before == (
        "its checkpoints are discarded (retentionPolicy RetainOnFailure) and it has no "
        "savepoint: its next run starts over (`stop` instead takes a savepoint to resume from)"
    )
    # Its next run failed on the output an earlier one committed (a newcomer's).
    assert committed == (
        "its checkpoints are discarded (retentionPolicy RetainOnFailure) and it has no "
        "savepoint: its next run starts over, and its sinks refuse the output they committed "
        "until it is deleted (`stop` instead takes a savepoint to resume from)"
    )
    assert after == (
        "its checkpoints are discarded (retentionPolicy RetainOnFailure), its savepoints stay"
    )


def test_what_a_cancellation_leaves_of_a_job_started_from_a_savepoint_path() -> None:
    """Its next run restores spec.restore.initialSavepointPath again, not nothing (a
    reviewer's)."""
    supervisor, _ = _supervisor(
        FakeLauncher(), interval=None, initial_savepoint="file:///savepoints/sp-3"
    )
    assert supervisor.what_cancelling_leaves() == (
        "its checkpoints are discarded (retentionPolicy RetainOnFailure) and it has no "
        "savepoint: its next run starts from spec.restore.initialSavepointPath "
        "(file:///savepoints/sp-3) again (`stop` instead takes a savepoint to resume from)"
    )


def test_status_says_why_the_driver_is_being_restarted_and_when() -> None:
    """Through a restart's backoff (minutes at maxBackoff) status said nothing but
    Restarting (a Flink operator user's); running again, it says nothing of it."""
    restarting: list[str] = []

    def saved(record: JobRecord) -> None:
        if record.phase is JobPhase.RESTARTING:
            restarting.append(record.message)

    async def scenario() -> JobSupervisor:
        launcher = FakeLauncher()
        supervisor, _lines = _supervisor(launcher, saved=saved)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and launcher.drivers[0].agent.completed)
        launcher.drivers[0].error = ["java.io.IOException: disk full", "\tat Foo.bar"]
        launcher.drivers[0].code = 1
        await until(lambda: len(launcher.drivers) == 2 and launcher.drivers[1].agent.completed)
        assert supervisor.record.message == ""
        launcher.drivers[1].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor

    asyncio.run(scenario())
    assert restarting, "the job was Restarting"
    assert re.fullmatch(
        r"driver failed \(.+\): java\.io\.IOException: disk full; restart 1 at "
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z",
        restarting[0],
    ), restarting


def test_a_restarted_runtime_goes_on_with_the_restart_count_and_its_backoff() -> None:
    """They lived in the runtime's memory: an operator restarted between two failures
    restarted the driver at once and counted from 0 again, so maxRetries never failed a job
    whose operator restarted too (a Flink operator user's)."""
    due = time.time() + 0.04  # within the helper's maxBackoff, 0.05 s (a wait is cut to it)
    # The runtime before: attempt 1 failed, restart 1 waits out its backoff.
    record = JobRecord(phase=JobPhase.RESTARTING, attempt=1, restarts=1, restart_due=due)
    launched: list[float] = []

    class Launcher(FakeLauncher):
        async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
            launched.append(time.time())
            driver = await super().launch(attempt, restore)
            driver.code = DriverExit.FAILED  # before any checkpoint
            return driver

    async def scenario() -> tuple[JobSupervisor, list[str]]:
        supervisor, lines = _supervisor(Launcher(), max_retries=1, record=record)
        assert await asyncio.wait_for(supervisor.run(), 10) is TerminalOutcome.FAILED
        return supervisor, lines

    supervisor, lines = asyncio.run(scenario())
    assert len(launched) == 1 and launched[0] >= due, "restart 1 came when it was due"
    assert lines[0] == "restart 1 is due in 0s: waiting out its backoff", lines
    assert "driver failed 2 times in a row; restartPolicy.maxRetries=1 exhausted" in (
        supervisor.record.message
    )
    # Ended, the job counts afresh when it runs again.
    assert (supervisor.record.restarts, supervisor.record.restart_due) == (0, None)


def test_without_periodic_checkpoints_committed_batches_start_the_restarts_over() -> None:
    """Progress was a completed checkpoint only: a job without periodic checkpoints counted
    every crash in its life as one more restart in a row, and failed after maxRetries of
    them, weeks apart (a reviewer's)."""

    async def scenario() -> tuple[TerminalOutcome, FakeLauncher]:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=1, interval=None, idle_poll_interval=0.05)
        run = asyncio.create_task(supervisor.run())
        for attempt in (1, 2):
            await until(lambda n=attempt: len(launcher.drivers) == n)
            agent = launcher.drivers[-1].agent
            agent.long_polls = False  # a batch alone changes no status version
            await until(lambda: supervisor.record.phase is JobPhase.RUNNING)
            agent.batch = (agent.batch or 0) + 5  # its query commits batches
            await until(lambda b=agent.batch: supervisor.record.last_batch == b)
            launcher.drivers[-1].code = DriverExit.FAILED
        await until(lambda: len(launcher.drivers) == 3)
        assert supervisor.record.restarts == 1
        launcher.drivers[2].code = DriverExit.FINISHED
        return await asyncio.wait_for(run, 10), launcher

    outcome, launcher = asyncio.run(scenario())
    assert outcome is TerminalOutcome.FINISHED
    assert not launcher.drivers[0].agent.completed, "no checkpoint told the progress"
