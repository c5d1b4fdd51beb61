"""checkpointing.verifyRestorable in the supervisor, against scripted drivers and a scripted
check: each completed image is checked in the background; one found unrestorable is
recorded once (status.unrestorable, an ImageUnrestorable event) and the next restore skips
it; a check under way is waited for before a restore; with the setting off nothing is
checked."""

import asyncio
from pathlib import Path

import yaml

from helpers.fake_driver import STORAGE, FakeLauncher, NoJanitor, until
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.restorable_report import problems_by_image
from spark_checkpoint.storage import JobStorageLayout
from spark_checkpoint_operator.coordinator import CoordinatorConfig, TerminalOutcome
from spark_checkpoint_operator.manifest.loading import parse_manifest
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.restorable_check import (
    LocalRestorableCheck,
    local_restorable_check,
)
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor, Notice

SPARK_REASON = "state of operator 0, store default: [CANNOT_LOAD_STATE_STORE] ..."


class ScriptedCheck:
    """Finds the images in ``unrestorable`` not restorable; holds each verdict until
    ``release`` is set."""

    def __init__(self, unrestorable: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.unrestorable = set(unrestorable)
        self.checked: list[str] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.release.set()

    async def problems(self, image: str) -> list[str]:
        self.checked.append(image)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(image)
            raise
        return [SPARK_REASON] if image in self.unrestorable else []


def _supervisor(
    launcher: FakeLauncher, check: ScriptedCheck | None
) -> tuple[JobSupervisor, list[Notice]]:
    notices: list[Notice] = []

    async def save(record: JobRecord) -> None:
        return None

    supervisor = JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(interval=0.1, min_pause=0.0, timeout=5.0, retained=5),
        restart_policy=RestartPolicySpec(RestartPolicyType.ON_FAILURE, 3, 0.01, 0.05),
        launcher=launcher,
        janitor=NoJanitor(),
        save=save,
        record=JobRecord(),
        report=notices.append,
        restorable_check=check,
    )
    return supervisor, notices


def _reasons(notices: list[Notice], reason: str) -> list[str]:
    return [n.message for n in notices if n.reason == reason]


def test_restorable_images_are_checked_and_nothing_is_recorded() -> None:
    async def scenario() -> tuple[JobSupervisor, list[Notice], ScriptedCheck, list[int]]:
        launcher, check = FakeLauncher(), ScriptedCheck()
        supervisor, notices = _supervisor(launcher, check)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 3)
        await until(lambda: len(_reasons(notices, "ImageRestorable")) >= 2)
        launcher.drivers[0].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor, notices, check, launcher.drivers[0].agent.completed

    supervisor, notices, check, completed = asyncio.run(scenario())
    assert check.checked and set(check.checked) <= {f"checkpoint:{i}" for i in completed}
    assert supervisor.record.unrestorable == []
    assert _reasons(notices, "ImageUnrestorable") == []


def test_an_unrestorable_image_is_recorded_once_and_the_restore_skips_it() -> None:
    async def scenario() -> tuple[JobSupervisor, list[Notice], FakeLauncher, ScriptedCheck]:
        launcher, check = FakeLauncher(), ScriptedCheck()
        supervisor, notices = _supervisor(launcher, check)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        # The next image's verdict is held; its driver dies right after it completed.
        check.release.clear()
        first = launcher.drivers[0].agent
        done = len(first.completed)
        await until(lambda: len(first.completed) > done)
        first.reachable = False
        launcher.drivers[0].code = DriverExit.FAILED
        await asyncio.sleep(0.5)
        assert len(launcher.drivers) == 1, "no restore while the newest image's check runs"
        # The newest image is the registry's: one more checkpoint may have been registered
        # before its completion reached the (by then unreachable) agent.
        registered = supervisor.record.coordinator.checkpoints
        newest = f"checkpoint:{max(c.checkpoint_id for c in registered)}"
        check.unrestorable.add(newest)
        check.release.set()
        await until(lambda: len(launcher.drivers) == 2)
        launcher.drivers[1].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return supervisor, notices, launcher, check

    supervisor, notices, launcher, check = asyncio.run(scenario())
    (newest,) = check.unrestorable
    assert newest not in launcher.restores[1], "the restore skips the unrestorable image"
    assert launcher.restores[1], "and restores an older one"
    assert [e.source for e in supervisor.record.unrestorable] == [newest]
    assert supervisor.record.unrestorable[0].reason.endswith(SPARK_REASON)
    warnings = _reasons(notices, "ImageUnrestorable")
    assert warnings == [f"{newest} is not restorable, restores skip it: {SPARK_REASON}"]
    assert check.checked.count(newest) == 1  # the restored attempt may check newer images


def test_a_run_cut_short_leaves_no_check_behind() -> None:
    """The operator's controller cancels its supervisor's run (the operator stopping, a
    status not written) and starts another, which adopts the driver: a check the first one
    started went on and could write its verdict into the status over the next one's."""

    async def scenario() -> tuple[list[str], list[str]]:
        launcher, check = FakeLauncher(), ScriptedCheck()
        check.release.clear()
        supervisor, _ = _supervisor(launcher, check)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: bool(check.checked))
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        return check.checked, list(check.cancelled)  # before asyncio.run cancels what is left

    checked, cancelled = asyncio.run(scenario())
    assert cancelled == checked, "the check ended with the run"


def test_the_setting_turned_on_and_off_while_the_job_runs_applies_from_then_on() -> None:
    """verifyRestorable changed on a running job's spec (it calls for no new driver): it
    was read when the driver started only (a reviewer's)."""

    async def scenario() -> tuple[ScriptedCheck, list[int]]:
        launcher, check = FakeLauncher(), ScriptedCheck()
        supervisor, _ = _supervisor(launcher, None)
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 2)
        agent = launcher.drivers[0].agent
        unchecked = list(agent.completed)
        check.release.clear()
        supervisor.check_restorable_with(check)
        await until(lambda: bool(check.checked))
        supervisor.check_restorable_with(None)  # while a check is under way
        check.release.set()
        done = len(agent.completed)
        await until(lambda: len(agent.completed) >= done + 3)
        launcher.drivers[0].code = DriverExit.FINISHED
        assert await run is TerminalOutcome.FINISHED
        return check, unchecked

    check, unchecked = asyncio.run(scenario())
    [image] = check.checked  # none after it was off
    assert image not in {f"checkpoint:{i}" for i in unchecked}, "completed before it was on"


def test_with_the_setting_off_nothing_is_checked(tmp_path: Path) -> None:
    document = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "job", "namespace": "default"},
        "spec": {"application": {"mainFile": "pipeline.py"}},
    }
    layout = JobStorageLayout(tmp_path.as_uri(), "default", "job")
    default = parse_manifest(yaml.safe_dump(document))
    assert default.spec.checkpointing.verify_restorable is False
    assert local_restorable_check(default, layout, {}) is None
    document["spec"]["checkpointing"] = {"verifyRestorable": True}
    enabled = parse_manifest(yaml.safe_dump(document))
    assert isinstance(local_restorable_check(enabled, layout, {}), LocalRestorableCheck)


def test_the_report_of_the_check_is_read_from_its_last_line() -> None:
    output = 'spark noise\n{"snapshots": [{"kind": "checkpoint", "id": 4, "problems": ["x"]}]}\n'
    assert problems_by_image(output) == {"checkpoint:4": ["x"]}
