"""Kopf handler shapes that matter: Kopf runs plain functions in a thread pool, where the
controllers' asyncio events must not be touched."""

import asyncio
import inspect

import pytest

from helpers.imports import modules_loaded_by
from spark_checkpoint_operator.kubernetes import handlers


def test_every_handler_runs_on_the_event_loop() -> None:
    for handler in (
        handlers.configure,
        handlers.close,
        handlers.pod_changed,
        handlers.job_changed,
        handlers.run_job,
        handlers.delete_job,
    ):
        assert inspect.iscoroutinefunction(handler), handler.__name__


def test_the_operator_loads_no_generated_api_class_of_the_core_group() -> None:
    """The client's `CoreV1Api` loads every model of the Core v1 API on import, half of the
    operator's start; `core_api` makes the few calls the operator needs. Custom objects take
    no models, and the jobs' Leases go through them too (their models cost each renewal more
    CPU than the job's status write). `VersionApi` (one model, 3 ms) asks the API server its
    version once, at the start."""
    loaded = modules_loaded_by("spark_checkpoint_operator.kubernetes.handlers")
    generated = sorted(name for name in loaded if name.startswith("kubernetes.aio.client.api."))
    assert generated == [
        "kubernetes.aio.client.api.custom_objects_api",
        "kubernetes.aio.client.api.version_api",
    ], generated


def test_a_daemon_cancelled_while_it_waits_for_the_lease_cancels_the_wait_and_stays_cancelled() -> (
    None
):
    """At the event loop's end Kopf's daemons are cancelled: the wait for the Lease went on
    without its daemon; and a cancel that came while the wait was being stopped (the daemon
    told to stop) was swallowed, the daemon carrying on as if nothing had been cancelled."""
    seen: list[str] = []

    async def waiting_for_the_lease() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("wait cancelled")
            await asyncio.sleep(0.2)  # a request under way ends first
            raise

    async def daemon_cancelled(stopped: bool) -> None:
        stopping = asyncio.get_running_loop().create_future()
        daemon = asyncio.create_task(handlers._first(waiting_for_the_lease(), stopping))
        await asyncio.sleep(0.05)
        if stopped:
            stopping.set_result(None)
            await asyncio.sleep(0.05)  # the wait is being stopped
        daemon.cancel()
        with pytest.raises(asyncio.CancelledError):
            await daemon
        # Before asyncio.run's end cancels what is left.
        assert seen == ["wait cancelled"]

    for stopped in (True, False):
        seen.clear()
        asyncio.run(daemon_cancelled(stopped))


class FakeLease:
    def __init__(self) -> None:
        self.held = False
        self.released = False

    async def acquire(self) -> None:
        await asyncio.sleep(0.01)
        self.held = True  # the server took the write

    async def release(self) -> None:
        self.released = True


def test_a_daemon_cancelled_in_the_step_it_took_the_lease_releases_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held, but neither driven nor recorded for the operator's cleanup: the next operator
    waited out the Lease's duration (a reviewer's)."""
    lease = FakeLease()
    monkeypatch.setattr(handlers, "_lease", lambda body, memo: lease)
    monkeypatch.setattr(handlers, "_acquired", lambda lease, body, memo: lease.acquire())
    body = {"metadata": {"namespace": "default", "name": "orders"}}

    async def scenario() -> None:
        stopping = asyncio.get_running_loop().create_future()
        daemon = asyncio.create_task(handlers._drive(body, None, stopping, {}))  # type: ignore[arg-type]
        while not lease.held:
            await asyncio.sleep(0)
        daemon.cancel()
        with pytest.raises(asyncio.CancelledError):
            await daemon

    asyncio.run(scenario())
    assert lease.released


class FakeController:
    def __init__(self, *, deleting: bool, stops: bool) -> None:
        self.deleting = deleting
        self._stops = stops

    async def ended(self) -> bool:
        if not self._stops:
            await asyncio.sleep(3600)
        return False


@pytest.mark.parametrize(
    ("controller", "released"),
    [
        (None, True),
        (FakeController(deleting=False, stops=True), True),
        (FakeController(deleting=False, stops=False), False),  # it may still drive the job
        (FakeController(deleting=True, stops=True), False),  # its final savepoint goes on
    ],
)
def test_an_exiting_operator_releases_only_the_leases_of_jobs_nothing_drives(
    monkeypatch: pytest.MonkeyPatch, controller: FakeController | None, released: bool
) -> None:
    monkeypatch.setattr(handlers, "CONTROLLER_EXIT_SECONDS", 0.1)
    lease = FakeLease()

    asyncio.run(handlers._released_once_stopped(("default", "orders"), lease, controller))  # type: ignore[arg-type]

    assert lease.released is released
