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
    operator's start; `core_api` makes the few calls the operator needs. (Custom objects
    take no models, the Coordination API's Leases a handful.)"""
    loaded = modules_loaded_by("spark_checkpoint_operator.kubernetes.handlers")
    generated = sorted(name for name in loaded if name.startswith("kubernetes.aio.client.api."))
    assert generated == [
        "kubernetes.aio.client.api.coordination_v1_api",
        "kubernetes.aio.client.api.custom_objects_api",
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
