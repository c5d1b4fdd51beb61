"""Restore fallback in the supervisor, against scripted drivers: a driver that exits
RESTORE_UNUSABLE makes the next attempt restore the previous image (not a retry of the
restart policy); the image is never restored again, also after a runtime restart; with no
image left the job fails with that reason. ``counts.restored`` counts only restores the
query got past."""

import asyncio
import dataclasses
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.fake_driver import STORAGE, FakeAgent, FakeLauncher, NoJanitor, until
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import (
    AgentStatus,
    QueryState,
    RestoreCandidate,
    RestoredFrom,
    SkippedImage,
)
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CompletedCheckpoint,
    CoordinatorConfig,
    JobPhase,
    PersistedState,
    TerminalOutcome,
)
from spark_checkpoint_operator.local_runtime import set_aside_hint
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.status import (
    DiscardDue,
    RestoreChoice,
    UnrestorableImage,
    render_status,
)
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor, Notice


class RestoringAgent(FakeAgent):
    """Reports the restore its driver did, and the query as restoring (no task running)
    until it committed a batch past its image, as the driver's agent does."""

    restored: RestoredFrom | None = None

    def __init__(self) -> None:
        super().__init__()
        self.long_polls = False  # its state changes are not versioned: asked every interval

    def _status(self) -> AgentStatus:
        document = replace(super()._status(), restored_from=self.restored)
        if self.restored is not None and self.batch <= self.restored.batch_id:
            restoring = replace(document.query, state=QueryState.RESTORING)
            document = replace(document, query=restoring, all_tasks_running=False)
        return document


class RestoringLauncher(FakeLauncher):
    """Its drivers restore the first candidate, at the batch the fake agent is at."""

    def __init__(self) -> None:
        super().__init__()
        self.agent_class = RestoringAgent

    async def launch(self, attempt: int, restore: list[str]) -> Any:
        driver = await super().launch(attempt, restore)
        agent: RestoringAgent = driver.agent
        if restore:
            agent.restored = RestoredFrom(RestoreCandidate.decode(restore[0]), agent.batch)
        return driver


def _supervisor(
    launcher: FakeLauncher,
    *,
    policy: RestartPolicyType = RestartPolicyType.ON_FAILURE,
    max_retries: int = 1,
    record: JobRecord | None = None,
    janitor: NoJanitor | None = None,
    retained: int = 2,
) -> tuple[JobSupervisor, list[Notice]]:
    notices: list[Notice] = []

    async def save(record: JobRecord) -> None:
        return None

    supervisor = JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(interval=0.2, min_pause=0.0, timeout=5.0, retained=retained),
        restart_policy=RestartPolicySpec(policy, max_retries, 0.01, 0.05),
        launcher=launcher,
        janitor=janitor or NoJanitor(),
        save=save,
        record=record or JobRecord(),
        report=notices.append,
    )
    return supervisor, notices


async def _checkpoints_then_crash(launcher: FakeLauncher, count: int) -> None:
    """The first driver completes ``count`` checkpoints, then dies (an ordinary failure)."""
    await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= count)
    launcher.drivers[0].agent.reachable = False  # no checkpoint after these
    launcher.drivers[0].code = DriverExit.FAILED


async def _second_driver_restored(launcher: FakeLauncher, supervisor: JobSupervisor) -> None:
    """The first driver completes two checkpoints and dies; the second has reported the
    restore of the newest."""
    await _checkpoints_then_crash(launcher, 2)
    await _next_driver(launcher, 1)
    await until(lambda: supervisor.record.restored_from is not None)


async def _next_driver(launcher: FakeLauncher, index: int) -> FakeAgent:
    await until(lambda: len(launcher.drivers) > index)
    agent: FakeAgent = launcher.drivers[index].agent
    return agent


async def _next_run_restores(status: dict[str, Any]) -> list[str]:
    """The images the first driver of a run from ``status`` (a runtime restarted) restores
    from."""
    launcher = FakeLauncher()
    supervisor, _ = _supervisor(launcher, record=JobRecord.from_dict(status))
    run = asyncio.create_task(supervisor.run())
    await _next_driver(launcher, 0)
    launcher.drivers[0].code = DriverExit.FINISHED
    await run
    return launcher.restores[0]


SCHEMA_ERROR = (
    "[STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE] Provided value schema does not match existing "
    "state value schema."
)


def test_a_driver_killed_after_restoring_leaves_its_restore_unconfirmed_not_failed() -> None:
    """Killed before its restored query committed a batch past the image: not a restore
    (`record.restores`), not a failed one, but one `run`'s summary tells as not counted
    (it said "restored from"); the next driver restores the same image."""

    async def scenario() -> tuple[JobSupervisor, FakeLauncher]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=3)
        run = asyncio.create_task(supervisor.run())
        await _second_driver_restored(launcher, supervisor)
        launcher.drivers[1].agent.reachable = False
        launcher.drivers[1].code = DriverExit.FAILED  # killed, nothing about its image
        third = await _next_driver(launcher, 2)
        await until(lambda: third.status_requests > 0)
        third.batch += 1
        await until(lambda: supervisor.record.restores == 1)
        launcher.drivers[2].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor, launcher

    supervisor, launcher = asyncio.run(scenario())
    assert launcher.restores[2][0] == launcher.restores[1][0], "the same image again"
    assert (supervisor.record.restores, supervisor.record.failed_restores) == (1, 0)
    assert supervisor.unconfirmed_restores == 1


def test_a_restore_that_fails_on_its_image_falls_back_to_the_previous_one() -> None:
    async def scenario() -> tuple[JobSupervisor, FakeLauncher, list[Notice], list[int]]:
        launcher = RestoringLauncher()
        # maxRetries 1: the failure of attempt 1 uses it up, so only a fallback that is
        # not counted as a retry lets attempt 3 run.
        supervisor, notices = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await _second_driver_restored(launcher, supervisor)
        restores_while_failing = supervisor.record.restores
        launcher.drivers[1].agent.reachable = False
        # The line of Spark's error the driver found pointing at the checkpoint.
        launcher.drivers[1].error = [SCHEMA_ERROR]
        launcher.drivers[1].code = DriverExit.RESTORE_UNUSABLE
        third = await _next_driver(launcher, 2)
        await until(lambda: third.status_requests > 0)
        third.batch += 1  # the restored query commits a batch: its restore worked
        await until(lambda: supervisor.record.restores == 1)
        launcher.drivers[2].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor, launcher, notices, [restores_while_failing]

    supervisor, launcher, notices, (restores_while_failing,) = asyncio.run(scenario())
    newest, previous = launcher.restores[1][:2]
    assert launcher.restores[2][0] == previous, "attempt 3 restores the previous image"
    assert newest not in launcher.restores[2]
    record = supervisor.record
    assert [e.source for e in record.unrestorable] == [newest]
    assert record.unrestorable[0].attempt == 2
    assert record.failed_restores == 1
    assert restores_while_failing == 0, "a restore is counted only once the query got past it"
    assert record.restores == 1
    assert supervisor.unconfirmed_restores == 0, "a failed restore is not one left unconfirmed"
    failed = [n for n in notices if n.reason == "RestoreFailed"]
    assert [n.message.split(": ")[0] for n in failed] == [f"{newest} cannot be restored"]
    assert [n.image for n in failed] == [newest]  # what the run's summary counts
    assert failed[0].message.endswith(f"; falling back to {previous}")
    assert (
        "its restored query failed in attempt 2 before committing a batch, on an error that "
        f"points at the checkpoint: {SCHEMA_ERROR}; falling back to"
    ) in failed[0].message
    assert record.unrestorable[0].reason.endswith(f": {SCHEMA_ERROR}")
    status = render_status(record, now=0.0)
    assert status["counts"]["restored"] == 1
    assert status["counts"]["failedRestores"] == 1
    assert status["unrestorable"][0]["source"] == newest


# Spark's words when an older Spark reads a log a newer one wrote (MetadataVersionUtil),
# after the log file of each image (HDFSMetadataLog).
OLDER_SPARK_ERROR = (
    "java.lang.IllegalStateException: Failed to read log file file:/live/offsets/{batch}. "
    "UnsupportedLogVersion: maximum supported log version is v1, but encountered v2. The log "
    "file was produced by a newer version of Spark and cannot be read by this version. Please "
    "upgrade."
)


@pytest.mark.parametrize("error", [SCHEMA_ERROR, OLDER_SPARK_ERROR])
def test_the_same_failure_on_two_images_fails_the_job_and_leaves_both_restorable(
    error: str,
) -> None:
    """A newcomer's incompatible upgrade (a changed grouping key; an image with an older
    Spark): every retained checkpoint and savepoint was tried, each marked unrestorable for
    ever, and with the code changed back the job could not run again, not even from a
    savepoint named by --from."""

    async def scenario() -> tuple[TerminalOutcome, JobSupervisor, FakeLauncher]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 3)
        for index in (1, 2):  # the newest image, then the one before: the same error
            await _next_driver(launcher, index)
            await until(lambda: supervisor.record.restored_from is not None)
            launcher.drivers[index].agent.reachable = False
            launcher.drivers[index].error = [error.format(batch=12 - index)]
            launcher.drivers[index].code = DriverExit.RESTORE_UNUSABLE
        return await run, supervisor, launcher

    ended, supervisor, launcher = asyncio.run(scenario())

    assert ended is TerminalOutcome.FAILED
    assert len(launcher.drivers) == 3, "no third image was tried"
    newest, previous = launcher.restores[1][:2]
    assert launcher.restores[2][0] == previous
    assert supervisor.record.message == (
        f"the restored query failed the same way on {newest} and {previous}: the pipeline or "
        "its settings no longer fit the job's state, not the images (both stay restorable): "
        f"change them back or start without that state: {error.format(batch=10)}"
    )
    assert supervisor.record.unrestorable == []


class NewestSkippedOnceLauncher(RestoringLauncher):
    """Its second driver cannot read the newest image (a connection reset) and restores
    the one before."""

    async def launch(self, attempt: int, restore: list[str]) -> Any:
        driver = await super().launch(attempt, restore)
        if len(self.drivers) == 2:
            newest, previous = (RestoreCandidate.decode(image) for image in restore[:2])
            skipped = (SkippedImage(newest, "connection reset by peer"),)
            driver.agent.restored = RestoredFrom(previous, driver.agent.batch, skipped)
        return driver


def test_the_same_failure_on_two_images_leaves_what_a_restore_skipped_unrestorable() -> None:
    """The pipeline's fault, not the images': the images the two failures marked are
    restorable again, but not the one the first restore skipped, whose staged output its
    sinks discarded (a reviewer: all of that attempt's entries went)."""

    async def scenario() -> tuple[TerminalOutcome, JobSupervisor, FakeLauncher]:
        launcher = NewestSkippedOnceLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=1, retained=3)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 3)
        for index in (1, 2):  # the image before the newest, then the one before: alike
            await _fails_at_restore(launcher, supervisor, index, SCHEMA_ERROR)
        return await run, supervisor, launcher

    ended, supervisor, launcher = asyncio.run(scenario())

    assert ended is TerminalOutcome.FAILED
    skipped = launcher.restores[1][0]
    assert [(e.source, e.attempt) for e in supervisor.record.unrestorable] == [(skipped, 2)]
    assert supervisor.record.message.startswith("the restored query failed the same way on ")


LOAD_ERROR = "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state."


async def _fails_at_restore(
    launcher: FakeLauncher, supervisor: JobSupervisor, index: int, error: str
) -> None:
    """Driver `index` restores its image, then its query fails on it with `error`."""
    await _next_driver(launcher, index)
    await until(lambda: supervisor.record.restored_from is not None)
    launcher.drivers[index].agent.reachable = False
    launcher.drivers[index].error = [error]
    launcher.drivers[index].code = DriverExit.RESTORE_UNUSABLE


def test_the_same_image_fault_on_two_images_falls_back_on() -> None:
    # A missing or corrupt file is the image's fault, whatever its words: older images
    # (without that file) may restore. Here the two retained checkpoints are all there is.
    async def scenario() -> tuple[TerminalOutcome, JobSupervisor]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 3)
        for index in (1, 2):
            await _fails_at_restore(launcher, supervisor, index, LOAD_ERROR)
        return await run, supervisor

    ended, supervisor = asyncio.run(scenario())
    assert ended is TerminalOutcome.FAILED
    assert supervisor.record.message.startswith("no restorable image left: ")
    assert len(supervisor.record.unrestorable) == 2


class IdleRunningAgent(RestoringAgent):
    """Reports its restored query running without a batch past its image, as the driver's
    agent does after a trigger without new data (the state is read when data comes)."""

    def _status(self) -> AgentStatus:
        return replace(FakeAgent._status(self), restored_from=self.restored)


def test_a_restored_query_running_without_a_batch_is_not_past_its_image() -> None:
    """A reviewer's: the codec scenario on idle input. Each restored query ran (phase
    Running) before its first batch read the state and failed: counted as past its image,
    every mark was of an attempt not after it, and none was forgotten under a fixed spec."""

    async def scenario() -> tuple[TerminalOutcome, JobSupervisor]:
        launcher = RestoringLauncher()
        launcher.agent_class = IdleRunningAgent
        supervisor, _ = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 3)
        for index in (1, 2):
            await _next_driver(launcher, index)
            attempt = index + 1
            await until(
                lambda attempt=attempt: (
                    supervisor.record.attempt == attempt
                    and supervisor.record.phase is JobPhase.RUNNING
                )
            )
            launcher.drivers[index].agent.reachable = False
            launcher.drivers[index].error = [f"{LOAD_ERROR} {index}.delta"]
            launcher.drivers[index].code = DriverExit.RESTORE_UNUSABLE
        return await run, supervisor

    ended, supervisor = asyncio.run(scenario())
    assert ended is TerminalOutcome.FAILED
    record = supervisor.record
    assert record.last_committing_attempt == 1
    assert [e.attempt for e in record.unrestorable] == [2, 3]
    assert len(record.forget_failed_restores()) == 2


def test_a_restore_failure_before_a_run_that_went_on_is_not_compared_with_later_ones() -> None:
    """The review's case: the newest image failed (and was fallen back from), the job ran on
    from the previous one for long, then a restore failed with the same words: a fallback,
    not a failed job."""

    async def scenario() -> tuple[TerminalOutcome, JobSupervisor]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=3)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 3)
        await _fails_at_restore(launcher, supervisor, 1, SCHEMA_ERROR)
        third = await _next_driver(launcher, 2)
        await until(lambda: third.status_requests > 0)
        third.batch += 1  # past its image: the restore worked, and the job runs on
        await until(lambda: len(third.completed) >= 2)
        third.reachable = False
        launcher.drivers[2].code = DriverExit.FAILED
        await _fails_at_restore(launcher, supervisor, 3, SCHEMA_ERROR)
        fifth = await _next_driver(launcher, 4)
        await until(lambda: fifth.status_requests > 0)
        fifth.batch += 1
        launcher.drivers[4].code = DriverExit.FINISHED
        return await run, supervisor

    ended, supervisor = asyncio.run(scenario())
    assert ended is TerminalOutcome.FINISHED
    assert supervisor.record.unrestorable[-1].attempt == 4, "a fallback, marked"


def test_the_start_says_why_a_newer_image_is_not_restored() -> None:
    """A newcomer saw savepoint 4 restored while status named savepoint 10 as the last one,
    with no word why."""
    savepoints = tuple(
        CompletedCheckpoint(n, CheckpointKind.SAVEPOINT, n, f"file:///s/sp-{n}", 1, n, n)
        for n in (4, 9, 10)
    )
    record = JobRecord(attempt=1, coordinator=PersistedState(11, savepoints=savepoints))
    record.unrestorable = [
        UnrestorableImage("savepoint:10", "its restored query failed", 1),
        UnrestorableImage("savepoint:9", "a restore of an older image passed it over", 1),
    ]

    async def scenario() -> list[Notice]:
        launcher = FakeLauncher()
        supervisor, notices = _supervisor(launcher, record=record)
        run = asyncio.create_task(supervisor.run())
        await _next_driver(launcher, 0)
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return notices

    [started] = [n.message for n in asyncio.run(scenario()) if n.reason == "DriverStarting"]
    assert started == (
        "starting driver attempt 2, restoring from savepoint:4 (not savepoint:10 and 1 more: "
        "its restored query failed)"
    )


def test_an_image_asked_for_by_name_is_tried_again_though_a_restore_failed_on_it() -> None:
    record = JobRecord()
    record.unrestorable = [UnrestorableImage("savepoint:7", "its restored query failed", 2)]

    async def scenario() -> FakeLauncher:
        launcher = FakeLauncher()
        supervisor, _ = _supervisor(launcher, record=record)
        supervisor.restore_from("savepoint:7")
        run = asyncio.create_task(supervisor.run())
        await _next_driver(launcher, 0)
        launcher.drivers[0].code = DriverExit.FINISHED
        await run
        return launcher

    launcher = asyncio.run(scenario())
    assert launcher.restores[0] == ["savepoint:7"]
    assert record.unrestorable == []


def test_a_savepoint_due_for_deletion_that_is_asked_for_by_name_is_kept() -> None:
    """`run --from` the path of a savepoint retention had let go: its discard stayed due,
    and the janitor deleted it after the first attempt failed, so the retry restored from
    nothing."""
    due = DiscardDue(CheckpointKind.SAVEPOINT, 7, None)
    record = JobRecord(discards_due=[due])
    janitor = NoJanitor()
    image = RestoreCandidate.external("file:///storage/default/job/savepoints/sp-7/_metadata")

    reachable = iter([False])  # the first driver's agent never answers: no checkpoint

    class Agent(FakeAgent):
        def __init__(self) -> None:
            super().__init__()
            self.reachable = next(reachable, True)

    async def scenario() -> FakeLauncher:
        launcher = FakeLauncher()
        launcher.agent_class = Agent
        supervisor, _ = _supervisor(launcher, record=record, janitor=janitor)
        assert supervisor.restore_from(image.encode(), stored_as=due.key) == due
        run = asyncio.create_task(supervisor.run())
        await _next_driver(launcher, 0)
        launcher.drivers[0].code = DriverExit.FAILED
        await _next_driver(launcher, 1)
        launcher.drivers[1].code = DriverExit.FINISHED
        await run
        return launcher

    launcher = asyncio.run(scenario())
    assert launcher.restores[:2] == [[image.encode()]] * 2
    assert janitor.discarded_savepoints == []
    assert record.discards_due == []


def test_a_failed_restore_falls_back_even_with_restart_policy_never() -> None:
    async def scenario() -> tuple[TerminalOutcome, FakeLauncher]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, policy=RestartPolicyType.NEVER)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        launcher.drivers[0].agent.reachable = False
        launcher.drivers[0].code = DriverExit.RESTORE_UNUSABLE  # a fresh start: nothing to mark
        return await run, launcher

    ended, launcher = asyncio.run(scenario())
    assert ended is TerminalOutcome.FAILED, "without a restore, exit 5 is an ordinary failure"
    assert len(launcher.drivers) == 1

    async def restored() -> tuple[TerminalOutcome, FakeLauncher, JobSupervisor]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, policy=RestartPolicyType.ALWAYS)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 2)
        await _next_driver(launcher, 1)
        supervisor._restart_policy = RestartPolicySpec(RestartPolicyType.NEVER, 0, 0.01, 0.05)
        launcher.drivers[1].code = DriverExit.RESTORE_UNUSABLE
        third = await _next_driver(launcher, 2)
        third.reachable = False
        launcher.drivers[2].code = DriverExit.FAILED
        return await run, launcher, supervisor

    ended, launcher, supervisor = asyncio.run(restored())
    assert len(launcher.drivers) == 3, "the fallback ran although restartPolicy is Never"
    assert ended is TerminalOutcome.FAILED
    assert "restartPolicy is Never" in supervisor.record.message


class DeadAtRestoreLauncher(FakeLauncher):
    """The agents of drivers after the first never answer: each dies at its restore (one
    that answered would take checkpoints, and retention would discard older images)."""

    async def launch(self, attempt: int, restore: list[str]) -> Any:
        driver = await super().launch(attempt, restore)
        driver.agent.reachable = attempt == 1
        return driver


def test_with_every_image_unrestorable_the_job_fails_with_that_reason() -> None:
    async def scenario() -> tuple[TerminalOutcome, JobSupervisor, FakeLauncher]:
        launcher = DeadAtRestoreLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 2)

        # Every driver fails at its restore, however many images there are.
        def restoring() -> bool:
            return len(launcher.drivers) > 1 and launcher.drivers[-1].code is None

        while not run.done():
            await until(lambda: restoring() or run.done())
            if restoring():
                launcher.drivers[-1].code = DriverExit.RESTORE_UNUSABLE
        return await run, supervisor, launcher

    ended, supervisor, launcher = asyncio.run(scenario())
    assert ended is TerminalOutcome.FAILED
    images = launcher.restores[1]
    assert len(images) >= 2
    # Each attempt restores the next older image; none is tried twice.
    assert [restore[0] for restore in launcher.restores[1:]] == images
    message = supervisor.record.message
    assert message.startswith("no restorable image left: ")
    for image in images:
        assert f"{image}: its restored query failed in attempt" in message


def test_an_unrestorable_image_stays_so_after_a_runtime_restart() -> None:
    async def first_run() -> tuple[dict[str, Any], list[str]]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=3)
        run = asyncio.create_task(supervisor.run())
        await _second_driver_restored(launcher, supervisor)
        launcher.drivers[1].agent.reachable = False
        launcher.drivers[1].code = DriverExit.RESTORE_UNUSABLE
        await _next_driver(launcher, 2)
        await until(lambda: bool(supervisor.record.unrestorable))
        status = render_status(supervisor.record, now=0.0)
        run.cancel()  # the runtime stops (an operator restart); the status is what remains
        await asyncio.gather(run, return_exceptions=True)
        return status, launcher.restores[1]

    status, first_candidates = asyncio.run(first_run())

    candidates = asyncio.run(_next_run_restores(status))
    assert first_candidates[0] not in candidates
    assert candidates[0] == first_candidates[1]


def _two_checkpoints() -> tuple[dict[str, Any], int, int]:
    """The status of a job with two registered checkpoints, its newer and older ids."""

    async def first_run() -> dict[str, Any]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        launcher.drivers[0].agent.reachable = False
        status = render_status(supervisor.record, now=0.0)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        return status

    status = asyncio.run(first_run())
    newer, older = (c["id"] for c in reversed(status["coordinator"]["checkpoints"]))
    return status, newer, older


def test_the_images_newer_than_one_restored_by_name_are_never_restored_again() -> None:
    """`run --from` an older image: its restored query's sinks discard the output staged
    after it, which only the newer images covered. A run cut short before its first
    checkpoint left those the newest, and the next run restored one: its output resumed
    after batches that were gone (a reviewer)."""
    status, newer, older = _two_checkpoints()

    async def run_from_older() -> tuple[dict[str, Any], list[Notice]]:
        launcher = RestoringLauncher()
        supervisor, notices = _supervisor(
            launcher, record=JobRecord.from_dict(status), max_retries=3
        )
        supervisor.restore_from(f"checkpoint:{older}", stored_as=(CheckpointKind.CHECKPOINT, older))
        # What `run --from` says it restores instead of.
        assert supervisor.passed_over == (f"checkpoint:{newer}",)
        # Stopped before its driver restored the older one, the next run takes the newer.
        assert supervisor.resumes_from == f"checkpoint:{newer}"
        run = asyncio.create_task(supervisor.run())
        await _next_driver(launcher, 0)
        await until(lambda: supervisor.record.restored_from is not None)
        launcher.drivers[0].code = DriverExit.FAILED  # restarts from the chosen image again
        second = await _next_driver(launcher, 1)
        await until(lambda: second.status_requests > 1)
        cut = render_status(supervisor.record, now=0.0)
        # What a stop without a savepoint says the next run resumes from (it said "the
        # newest checkpoint or savepoint", a newcomer's).
        assert supervisor.resumes_from == f"checkpoint:{older}"
        run.cancel()  # Ctrl-C, a killed runtime: the status is what remains
        await asyncio.gather(run, return_exceptions=True)
        assert launcher.restores == [[f"checkpoint:{older}"]] * 2
        assert [d.agent.completed for d in launcher.drivers] == [[], []], "no checkpoint"
        return cut, notices

    status, notices = asyncio.run(run_from_older())

    assert asyncio.run(_next_run_restores(status)) == [f"checkpoint:{older}"]
    # Named, it can still be restored: a failed local run says which and how (a newcomer
    # told to "restore the newest image" ran the job again and it restored the older one).
    later, _ = _supervisor(RestoringLauncher(), record=JobRecord.from_dict(status))
    assert later.resumes_from == f"checkpoint:{older}"
    assert later.set_aside == (f"checkpoint:{newer}",)
    assert set_aside_hint(later.set_aside) == (
        f"not restored from again unless named: checkpoint:{newer} (`spark-checkpoint list` "
        f"says why); `run --from checkpoint:{newer}` restores the newest of them"
    )
    [entry] = status["unrestorable"]
    assert entry == {
        "source": f"checkpoint:{newer}",
        "reason": f"attempt 2 went on from checkpoint:{older}",
        "attempt": 2,
        "permanent": True,
    }
    restored = [n.message for n in notices if n.reason == "Restored"]
    assert restored == 2 * [
        f"restored from checkpoint:{older}; never restored again: checkpoint:{newer} (output "
        f"staged after checkpoint:{older} and not yet committed is discarded; committed "
        "output stays)"
    ]


def test_restoring_by_name_passes_over_no_image_a_restore_would_not_take() -> None:
    """`run --from` says which image it restores "instead of": the one a plain run would
    have restored, never a newer one already marked unrestorable (a reviewer's)."""
    status, newer, older = _two_checkpoints()
    status["unrestorable"] = [
        {"source": f"checkpoint:{newer}", "reason": "a restored query failed", "attempt": 1}
    ]
    launcher = RestoringLauncher()
    supervisor, _ = _supervisor(launcher, record=JobRecord.from_dict(status))

    supervisor.restore_from(f"checkpoint:{older}", stored_as=(CheckpointKind.CHECKPOINT, older))

    assert supervisor.passed_over == ()
    [entry] = supervisor.record.unrestorable
    assert entry.source == f"checkpoint:{newer}", "it stays unrestorable"


class StillStartingAgent(RestoringAgent):
    """Reports its driver's restore while the query still starts, as the agent does from
    before the sinks' on_restore."""

    def _status(self) -> AgentStatus:
        document = super()._status()
        starting = replace(document.query, state=QueryState.STARTING)
        return replace(document, query=starting, all_tasks_running=False)


class StillStartingLauncher(RestoringLauncher):
    """Its driver restored the first candidate, and its query is still starting."""

    def __init__(self) -> None:
        super().__init__()
        self.agent_class = StillStartingAgent


class StartFailsLauncher(RestoringLauncher):
    """Its driver restored the first candidate, then Spark's start of the query failed on
    the image (RESTORE_UNUSABLE) before the supervisor heard from its agent."""

    async def launch(self, attempt: int, restore: list[str]) -> Any:
        driver = await super().launch(attempt, restore)
        driver.agent.reachable = False
        driver.code = DriverExit.RESTORE_UNUSABLE
        return driver


@pytest.mark.parametrize("launcher_class", [StillStartingLauncher, StartFailsLauncher])
def test_images_a_restore_left_behind_are_marked_though_its_query_never_started(
    launcher_class: type[RestoringLauncher],
) -> None:
    """The sinks discard what the newer images covered before the query starts: a run cut
    short (Ctrl-C) while it starts, or a query whose start fails on the image, left the
    newer images restorable (a reviewer)."""
    status, newer, older = _two_checkpoints()

    async def run_from_older() -> dict[str, Any]:
        launcher = launcher_class()
        supervisor, _ = _supervisor(launcher, record=JobRecord.from_dict(status))
        supervisor.restore_from(f"checkpoint:{older}", stored_as=(CheckpointKind.CHECKPOINT, older))
        run = asyncio.create_task(supervisor.run())
        agent = await _next_driver(launcher, 0)
        if launcher_class is StillStartingLauncher:
            await until(lambda: agent.status_requests > 1)
            supervisor.suspend_now()  # Ctrl-C while its query starts
        await asyncio.wait_for(run, 10)
        return render_status(supervisor.record, now=0.0)

    status = asyncio.run(run_from_older())

    marked = {entry["source"] for entry in status["unrestorable"]}
    if launcher_class is StartFailsLauncher:
        # The older image failed too: the job has no restorable image left, and says so.
        assert marked == {f"checkpoint:{newer}", f"checkpoint:{older}"}
        assert status["phase"] == "Failed"
        assert status["message"].startswith("no restorable image left: ")
    else:
        assert marked == {f"checkpoint:{newer}"}
        assert asyncio.run(_next_run_restores(status)) == [f"checkpoint:{older}"]


def test_a_restored_attempt_that_fails_before_committing_is_not_counted() -> None:
    async def scenario() -> JobSupervisor:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=5)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 1)
        await _next_driver(launcher, 1)
        await until(lambda: supervisor.record.restored_from is not None)
        launcher.drivers[1].code = DriverExit.FAILED  # an ordinary failure, no progress
        third = await _next_driver(launcher, 2)
        await until(lambda: third.status_requests > 0)
        launcher.drivers[2].code = DriverExit.FINISHED  # nothing left to run: a clean end
        await run
        return supervisor

    supervisor = asyncio.run(scenario())
    assert supervisor.record.restores == 1
    assert supervisor.record.unrestorable == []
    assert supervisor.record.failed_restores == 0


def test_another_jobs_image_restored_by_name_is_restored_again_after_a_runtime_restart() -> None:
    """A redeploy (or `run --from`) from another job's savepoint sets every image of the
    job's own aside once restored. A runtime rebuilt before the next checkpoint (an
    operator restart, then a driver crash) found only those and failed the job: "no
    restorable image left" (a reviewer's). The choice is kept in status until an image
    completes after it."""
    status, newer, older = _two_checkpoints()
    external = RestoreCandidate.external("/other/default/other/savepoints/sp-3/_metadata")

    async def restored() -> dict[str, Any]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, record=JobRecord.from_dict(status), max_retries=3)
        supervisor.restore_from(external.encode())
        run = asyncio.create_task(supervisor.run())
        await _next_driver(launcher, 0)
        await until(lambda: supervisor.record.restored_from is not None)
        cut = render_status(supervisor.record, now=0.0)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        return cut

    cut = asyncio.run(restored())

    assert cut["restoreChoice"] == {
        "image": external.encode(),
        "completedCount": 2,
        "passedOver": [f"checkpoint:{newer}", f"checkpoint:{older}"],
    }
    assert {e["source"] for e in cut["unrestorable"]} == {
        f"checkpoint:{newer}",
        f"checkpoint:{older}",
    }
    assert asyncio.run(_next_run_restores(cut)) == [external.encode()]


def test_a_chosen_image_that_cannot_be_restored_is_not_chosen_again_by_a_later_run() -> None:
    """Its run fails on it, as a named image that cannot be restored does; the next run
    restores what is left (the kept choice made every later run fail at once with no
    driver, an older image restorable: a reviewer's). A stop says so beforehand."""
    status, newer, older = _two_checkpoints()

    async def chosen_fails() -> tuple[TerminalOutcome, dict[str, Any], str | None]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, record=JobRecord.from_dict(status))
        supervisor.restore_from(f"checkpoint:{newer}", stored_as=(CheckpointKind.CHECKPOINT, newer))
        run = asyncio.create_task(supervisor.run())
        await _fails_at_restore(launcher, supervisor, 0, LOAD_ERROR)
        ended = await run
        return ended, render_status(supervisor.record, now=0.0), supervisor.resumes_from

    ended, after, resumes_from = asyncio.run(chosen_fails())

    assert ended is TerminalOutcome.FAILED
    assert after["restoreChoice"] is None
    assert resumes_from == f"checkpoint:{older}"
    assert asyncio.run(_next_run_restores(after)) == [f"checkpoint:{older}"]


def test_a_stop_after_another_jobs_image_was_restored_says_the_next_run_restores_it() -> None:
    status, _, _ = _two_checkpoints()
    external = RestoreCandidate.external("/other/default/other/savepoints/sp-3/_metadata")

    async def restored() -> tuple[str | None, str | None]:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, record=JobRecord.from_dict(status))
        supervisor.restore_from(external.encode())
        before = supervisor.resumes_from  # not restored yet: the newest image
        run = asyncio.create_task(supervisor.run())
        await _next_driver(launcher, 0)
        await until(lambda: supervisor.record.restored_from is not None)
        after = supervisor.resumes_from
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        return before, after

    before, after = asyncio.run(restored())

    assert before != external.encode()
    assert after == external.encode()


def test_a_restore_choice_is_written_until_an_image_completes_after_it() -> None:
    record = JobRecord(restore_choice=RestoreChoice("savepoint:7", completed=0))
    assert render_status(record, now=0.0)["restoreChoice"]["image"] == "savepoint:7"

    record.coordinator = dataclasses.replace(record.coordinator, completed_count=1)

    assert render_status(record, now=0.0)["restoreChoice"] is None


@given(
    entries=st.lists(
        st.builds(
            UnrestorableImage,
            st.sampled_from([f"checkpoint:{n}" for n in range(1, 6)]),
            st.just("its restored query failed"),
            st.integers(0, 8),
            st.booleans(),
        ),
        max_size=6,
    ),
    since=st.none() | st.integers(0, 8),
)
def test_a_changed_deployment_forgets_the_failed_restores_since_the_query_last_ran(
    entries: list[UnrestorableImage], since: int | None
) -> None:
    record = JobRecord(unrestorable=list(entries), last_committing_attempt=since)
    forgotten = record.forget_failed_restores()
    # Of the streak since the query last ran; never what a restore left behind (its staged
    # output is gone), nor anything when that is not known (an earlier operator's status).
    expected = [e for e in entries if since is not None and e.attempt > since and not e.permanent]
    assert forgotten == [e.source for e in expected]
    assert record.unrestorable == [e for e in entries if e not in expected]


def test_a_restore_reported_while_the_query_starts_is_no_guess() -> None:
    """A reviewer's: a query that fails at once (an older Spark reading the offsets log)
    had its restore reported only while starting: the mark was taken for a guess, made
    permanent, and never forgotten under a fixed spec."""

    async def scenario() -> JobSupervisor:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 3)
        launcher.agent_class = StillStartingAgent
        launcher.drivers[0].agent.reachable = False
        launcher.drivers[0].code = DriverExit.FAILED
        agent = await _next_driver(launcher, 1)
        await until(lambda: agent.status_requests > 1)
        launcher.drivers[1].agent.reachable = False
        launcher.drivers[1].error = [OLDER_SPARK_ERROR.format(batch=3)]
        launcher.drivers[1].code = DriverExit.RESTORE_UNUSABLE
        await until(lambda: supervisor.record.unrestorable)
        supervisor.suspend_now()
        await asyncio.wait_for(run, 10)
        return supervisor

    supervisor = asyncio.run(scenario())
    [entry] = supervisor.record.unrestorable
    assert (entry.attempt, entry.permanent) == (2, False)
    assert supervisor.record.forget_failed_restores() == [entry.source]


def test_a_failure_without_error_lines_is_compared_with_the_next_without_a_crash() -> None:
    """A reviewer's: the restored query failed without a word, the next one with a query
    change's error: comparing them raised IndexError, and the supervisor died."""

    async def scenario() -> TerminalOutcome:
        launcher = RestoringLauncher()
        supervisor, _ = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 3)
        for index, error in ((1, []), (2, [OLDER_SPARK_ERROR.format(batch=2)])):
            await _next_driver(launcher, index)
            await until(lambda: supervisor.record.restored_from is not None)
            launcher.drivers[index].agent.reachable = False
            launcher.drivers[index].error = error
            launcher.drivers[index].code = DriverExit.RESTORE_UNUSABLE
        return await asyncio.wait_for(run, 20)

    assert asyncio.run(scenario()) is TerminalOutcome.FAILED


class UnreportedRestoreLauncher(RestoringLauncher):
    """Its drivers of the given indexes end before their agents said which image they
    restored."""

    def __init__(self, unreported: set[int]) -> None:
        super().__init__()
        self.unreported = unreported

    async def launch(self, attempt: int, restore: list[str]) -> Any:
        driver = await super().launch(attempt, restore)
        if len(self.drivers) - 1 in self.unreported:
            driver.agent.restored = None
            driver.agent.reachable = False
        return driver


GUESS = "ended before {} said which image {} restored"


@pytest.mark.parametrize(
    ("unreported", "said"),
    [
        ({1}, "{previous} stays restorable; {newest} not: its driver " + GUESS.format("it", "it")),
        ({2}, "{newest} stays restorable; {previous} not: its driver " + GUESS.format("it", "it")),
        ({1, 2}, "neither stays restorable: their drivers " + GUESS.format("they", "they")),
    ],
    ids=["first", "second", "both"],
)
def test_the_same_failure_on_two_images_keeps_guessed_marks(
    unreported: set[int], said: str
) -> None:
    """A driver that failed on its image before it said which it restored may have skipped
    it (its staged output discarded): that image is marked for good. Two failing the same
    way are the pipeline's fault, but a guess stays (reviewers: it went with the rest; the
    second failure's was not marked at all)."""

    async def scenario() -> tuple[TerminalOutcome, JobSupervisor, FakeLauncher]:
        launcher = UnreportedRestoreLauncher(unreported)
        supervisor, _ = _supervisor(launcher, max_retries=1)
        run = asyncio.create_task(supervisor.run())
        await _checkpoints_then_crash(launcher, 3)
        for index in (1, 2):
            if index in unreported:
                await _next_driver(launcher, index)
                launcher.drivers[index].error = [SCHEMA_ERROR]
                launcher.drivers[index].code = DriverExit.RESTORE_UNUSABLE
            else:
                await _fails_at_restore(launcher, supervisor, index, SCHEMA_ERROR)
        return await asyncio.wait_for(run, 20), supervisor, launcher

    ended, supervisor, launcher = asyncio.run(scenario())

    assert ended is TerminalOutcome.FAILED
    newest, previous = launcher.restores[1][:2]
    assert launcher.restores[2][0] == previous
    restored = {1: (newest, 2), 2: (previous, 3)}
    assert [(e.source, e.attempt, e.permanent) for e in supervisor.record.unrestorable] == [
        (*restored[index], True) for index in sorted(unreported)
    ]
    assert supervisor.record.message.startswith(
        f"the restored query failed the same way on {newest} and {previous}: the pipeline or "
        "its settings no longer fit the job's state, not the images "
        f"({said.format(newest=newest, previous=previous)}): "
    )
