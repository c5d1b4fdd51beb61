"""`JobLease` against the emulated API server: one operator drives a job; another waits,
takes the Lease over once it saw it unchanged for its duration by its own clock (or at once
when released), and the first then finds it lost."""

import asyncio
import contextlib
import copy
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
from kubernetes.aio import config
from kubernetes.aio.client import Configuration

from helpers.kube.cluster import JOBS, MINIMAL_JOB, NAMESPACE
from helpers.kube.emulator import EmulatedApiServer, spark_checkpoint_api
from spark_checkpoint_operator.kubernetes.lease import (
    LEASE_SECONDS,
    JobLease,
    LeaseHolder,
    LeaseUnavailable,
    NamespaceTerminating,
    lease_name,
)
from spark_checkpoint_operator.kubernetes.runtime import Clients, OperatorApiClient, PodRegistry

LEASES = "coordination.k8s.io/v1/leases"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _job(api: EmulatedApiServer) -> dict[str, Any]:
    created: dict[str, Any] = api.create(JOBS, copy.deepcopy(MINIMAL_JOB), namespace=NAMESPACE)
    return created


def test_a_second_operator_waits_takes_over_an_expired_lease_and_the_first_finds_it_lost(
    tmp_path: Path,
) -> None:
    first_clock, second_clock = Clock(), Clock()
    seen: dict[str, Any] = {}
    # A short Lease, renewed every second (by real time; the deadline by the clock): shorter
    # than the operator's setting may be.
    seconds = 3

    async def scenario(clients: Clients, job: dict[str, Any]) -> None:
        first = JobLease(clients.api, job, "operator-a", seconds=seconds, clock=first_clock)
        # The holder's duration counts (the Lease says it), not the waiter's own setting.
        second = JobLease(clients.api, job, "operator-b", clock=second_clock)
        assert await first.try_acquire() is None
        seen["waiting"] = await second.try_acquire()
        # Renewed meanwhile (a new version): not expired, however long the second waits.
        renewing = asyncio.create_task(first.held())
        await asyncio.sleep(seconds / 3 + 0.5)
        second_clock.now += seconds + 1
        seen["renewed"] = await second.try_acquire()
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        await asyncio.sleep(0.2)  # a renewal sent before the cancel lands meanwhile
        # Not renewed for its duration by the second's clock: taken over.
        await second.try_acquire()
        second_clock.now += seconds
        seen["expired"] = await second.try_acquire()
        seen["lost"] = await asyncio.wait_for(first.held(), 10)

    _run(tmp_path, scenario)

    # The holder's duration, told in the waiter's AnotherOperator event (it told its own).
    assert seen["waiting"] == LeaseHolder("operator-a", seconds)
    assert seen["renewed"] == LeaseHolder("operator-a", seconds)
    assert seen["expired"] is None
    assert seen["lost"] == "operator operator-b holds the job's Lease now"


def test_a_released_lease_is_taken_at_once_and_is_gone_with_its_job(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def scenario(clients: Clients, job: dict[str, Any]) -> None:
        first = JobLease(clients.api, job, "operator-a", clock=Clock())
        second = JobLease(clients.api, job, "operator-b", clock=Clock())
        assert await first.try_acquire() is None
        await first.release()
        seen["taken"] = await second.try_acquire()
        seen["again"] = await first.try_acquire()

    with spark_checkpoint_api() as api:
        job = _with_clients(api, tmp_path, scenario)
        lease = api.get(LEASES, "default", lease_name("orders"))
        api.delete(JOBS, NAMESPACE, "orders")
        left = [item["metadata"]["name"] for item in api.list(LEASES, "default")]

    assert seen == {"taken": None, "again": ("operator-b", LEASE_SECONDS)}
    assert lease["spec"]["holderIdentity"] == "operator-b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert lease["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert left == []


def _run(
    tmp_path: Path, scenario: Callable[[Clients, dict[str, Any]], Coroutine[Any, Any, None]]
) -> None:
    with spark_checkpoint_api() as api:
        _with_clients(api, tmp_path, scenario)


def _with_clients(
    api: EmulatedApiServer,
    tmp_path: Path,
    scenario: Callable[[Clients, dict[str, Any]], Coroutine[Any, Any, None]],
) -> dict[str, Any]:
    job = _job(api)

    async def run() -> None:
        configuration = Configuration()
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        await config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        async with aiohttp.ClientSession() as session:
            clients = Clients(OperatorApiClient(configuration), PodRegistry(), session)
            try:
                await scenario(clients, job)
            finally:
                await clients.api.close()

    asyncio.run(run())
    return job


def test_a_lease_the_operator_may_not_read_is_said_so_not_taken_for_another_operator(
    tmp_path: Path,
) -> None:
    """An operator image upgraded without the chart's new RBAC rule got 403 for every Lease:
    each job said "another operator (unknown) drives this job" (a reviewer's)."""
    seen: dict[str, Any] = {}

    def leases(request: Any) -> bool:
        return "/leases" in request.url.path

    forbidden = kmock.KubernetesError(403, "Forbidden", "leases is forbidden", {})

    async def scenario(clients: Clients, job: dict[str, Any]) -> None:
        with pytest.raises(LeaseUnavailable) as refused:
            await JobLease(clients.api, job, "operator-a", clock=Clock()).try_acquire()
        seen["message"], seen["type"] = str(refused.value), type(refused.value)

    with spark_checkpoint_api() as api:
        api.call(lambda emulator: emulator[leases] << forbidden)
        _with_clients(api, tmp_path, scenario)

    assert seen["message"] == (
        "the job's Lease default/orders.sparkcheckpoint.io cannot be taken: HTTP 403 (the "
        "operator needs get, create and update on leases.coordination.k8s.io in the job's "
        "namespace)"
    )
    assert seen["type"] is LeaseUnavailable  # not taken for a namespace being deleted


def test_a_lease_in_a_namespace_being_deleted_cannot_be_created_and_says_so(
    tmp_path: Path,
) -> None:
    """No operator can create it: a deletion goes on without it (`handlers.delete_job`)."""
    seen: dict[str, Any] = {}

    async def scenario(clients: Clients, job: dict[str, Any]) -> None:
        in_team = {**job, "metadata": {**job["metadata"], "namespace": "team"}}
        api.create("v1/namespaces", {"metadata": {"name": "team"}})
        held = {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}
        api.create("v1/configmaps", held, "team")  # the namespace stays Terminating
        api.delete("v1/namespaces", None, "team")
        with pytest.raises(NamespaceTerminating) as refused:
            await JobLease(clients.api, in_team, "operator-a", clock=Clock()).try_acquire()
        seen["message"] = str(refused.value)

    with spark_checkpoint_api() as api:
        _with_clients(api, tmp_path, scenario)

    assert seen["message"] == (
        "the job's namespace team is being deleted: its Lease orders.sparkcheckpoint.io "
        "cannot be created"
    )
