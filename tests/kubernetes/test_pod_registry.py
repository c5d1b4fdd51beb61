"""The operator's view of pods (`PodRegistry`, fed by its pod watch) against the emulated API
server: a watch that was down misses DELETED events, so waiting for a pod to be gone asks
the API server too."""

import asyncio
import datetime
import math
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import config
from kubernetes.aio.client import Configuration, V1ObjectMeta, V1Pod, V1PodSpec

from helpers.kube.emulator import PODS, EmulatedApiServer, spark_checkpoint_api
from spark_checkpoint_operator.kubernetes import objects, runtime
from spark_checkpoint_operator.kubernetes.runtime import (
    GONE_CHECK_SECONDS,
    STUCK_DELETION_SECONDS,
    Clients,
    KubernetesDriver,
    OperatorApiClient,
    PodRegistry,
    delete_pod_and_wait,
    deletion_due,
    stuck_deletion,
)
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.supervisor import DRIVER_GONE, Level, Notice


def test_a_pod_deleted_while_the_watch_was_down_is_not_waited_for(tmp_path: Path) -> None:
    """After a 410 Gone Kopf lists again and reports only the pods that exist: the registry
    kept a deleted driver, and terminating it waited for ever (the job's daemon hung)."""
    driver = {
        "metadata": {
            "name": "orders-driver-1",
            "namespace": "default",
            "labels": {objects.LABEL_JOB: "orders"},
        }
    }

    pods = PodRegistry()
    pods.observe("ADDED", driver)  # the last the watch saw of it
    waits: list[float] = []
    changed = pods.changed

    async def counted(namespace: str, job: str, timeout: float) -> None:
        waits.append(timeout)
        await changed(namespace, job, timeout)

    pods.changed = counted  # type: ignore[method-assign]

    async def scenario(clients: Clients) -> None:
        await asyncio.wait_for(
            delete_pod_and_wait(clients, "default", "orders", "orders-driver-1", _unexpected),
            3 * GONE_CHECK_SECONDS,
        )

    with spark_checkpoint_api() as api:
        _with_clients(api, tmp_path, pods, scenario)

    assert pods.pod("default", "orders", "orders-driver-1") is None
    # The delete found no pod: nothing to wait for (every stop of a driver whose pod was
    # gone waited 5 s for a change, a Flink operator user's).
    assert waits == []


ORDERS = manifest_from_document(
    {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "orders", "namespace": "default"},
        "spec": {"application": {"mainFile": "local:///app/job.py"}},
    }
)


def _driver(clients: Clients, name: str) -> KubernetesDriver:
    """The operator's handle of job orders' driver pod `name`."""
    return KubernetesDriver(
        clients,
        ORDERS,
        name=name,
        token="t",
        executors=0,
        deployed_hash="",
        report=_unexpected,
    )


def _running_pod(name: str, role: str = objects.DRIVER, owner: str | None = None) -> dict[str, Any]:
    """A running pod of job orders; an executor owned by driver pod ``owner``, as Spark makes
    it (pods the test creates in the API server get that server's uid instead)."""
    labels = {objects.LABEL_JOB: "orders", objects.LABEL_SPARK_ROLE: role}
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "labels": labels,
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": f"uid-{owner}"}
        ]
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": objects.DRIVER, "image": "spark:4"}]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": objects.DRIVER,
                    "state": {"running": {"startedAt": "2026-12-03T00:00:00Z"}},
                }
            ],
        },
    }


def test_a_running_driver_deleted_while_the_watch_was_down_ends_once_rechecked(
    tmp_path: Path,
) -> None:
    """The registry showed a deleted driver running, and the job waited for its silent
    agent's heartbeat timeout (60 s) before it restarted: a recheck (the supervisor asks
    while the agent does not answer) finds it gone at once; one the API server has stays
    running, and the API server is asked at most every RECHECK_SECONDS. The executors the
    watch missed going with the gone driver are forgotten too."""
    pods = PodRegistry()
    pods.observe("ADDED", _running_pod("orders-driver-1"))  # deleted since, unseen
    pods.observe("ADDED", _running_pod("orders-driver-2"))  # still there
    pods.observe("ADDED", _running_pod("orders-exec-1", objects.EXECUTOR, "orders-driver-1"))
    pods.observe("ADDED", _running_pod("orders-exec-2", objects.EXECUTOR, "orders-driver-2"))
    ended: dict[str, list[int | None]] = {}

    async def scenario(clients: Clients) -> None:
        for name in ("orders-driver-1", "orders-driver-2"):
            driver = _driver(clients, name)
            before = driver.exit_code()
            await driver.recheck()
            ended[name] = [before, driver.exit_code()]
        # Deleted now, unseen too: not asked again so soon.
        api.delete(PODS, "default", "orders-driver-2", grace_period_seconds=0)
        await driver.recheck()
        ended["orders-driver-2"].append(driver.exit_code())

    with spark_checkpoint_api() as api:
        api.create(PODS, _running_pod("orders-driver-2"), "default")
        _with_clients(api, tmp_path, pods, scenario)

    assert ended == {
        "orders-driver-1": [None, DRIVER_GONE],
        "orders-driver-2": [None, None, None],
    }
    assert {pod["metadata"]["name"] for pod in pods.pods("default", "orders")} == {
        "orders-driver-2",
        "orders-exec-2",
    }


def test_only_the_drivers_own_executors_count_as_ready(tmp_path: Path) -> None:
    """A pod that only wears the job's executor labels (anyone who may create pods can set
    them), or an executor of an earlier attempt's driver still going, let checkpoints be
    triggered while the driver's own executor was missing (a reviewer's)."""
    pods = PodRegistry()
    pods.observe("ADDED", _running_pod("orders-driver-1"))
    pods.observe("ADDED", _running_pod("orders-driver-2"))
    pods.observe("ADDED", _running_pod("orders-exec-1", objects.EXECUTOR, "orders-driver-1"))
    pods.observe("ADDED", _running_pod("imposter", objects.EXECUTOR))
    ready: list[bool] = []

    async def scenario(clients: Clients) -> None:
        driver = KubernetesDriver(
            clients,
            ORDERS,
            name="orders-driver-2",
            token="t",
            executors=1,
            deployed_hash="",
            report=_unexpected,
        )
        ready.append(driver.executors_ready())
        pods.observe("ADDED", _running_pod("orders-exec-2", objects.EXECUTOR, "orders-driver-2"))
        ready.append(driver.executors_ready())

    with spark_checkpoint_api() as api:
        _with_clients(api, tmp_path, pods, scenario)

    assert ready == [False, True]


FINALIZER = "backup.example.com/snapshot"


def test_a_pod_a_finalizer_holds_is_told_once_and_waited_for_until_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finalizer someone else added (a backup tool's) keeps a deleted pod for ever: the
    job's next pod must not start meanwhile, and the user must learn why it waits, once
    (each waiting task told it: a reviewer)."""
    monkeypatch.setattr(runtime, "STUCK_DELETION_SECONDS", 0.5)
    monkeypatch.setattr(runtime, "GONE_CHECK_SECONDS", 0.2)
    notices: list[Notice] = []
    told = threading.Event()
    gone = threading.Event()

    def report(notice: Notice) -> None:
        notices.append(notice)
        told.set()

    async def scenario(clients: Clients) -> None:
        # Two wait for it, as when a stopped job's driver is terminated by two tasks.
        await asyncio.gather(
            *(
                delete_pod_and_wait(clients, "default", "orders", "orders-driver-1", report)
                for _ in range(2)
            )
        )
        gone.set()

    with spark_checkpoint_api() as api:
        api.create(PODS, _pod(finalizers=[FINALIZER]), namespace="default")
        waiting = threading.Thread(
            target=_with_clients, args=(api, tmp_path, PodRegistry(), scenario), daemon=True
        )
        waiting.start()
        assert told.wait(30), "the stuck pod was never told"
        assert not gone.is_set(), "it was waited for"
        held = api.get(PODS, "default", "orders-driver-1")
        assert held["metadata"]["deletionTimestamp"]
        time.sleep(1)  # five more checks: still one notice
        api.patch(PODS, "default", "orders-driver-1", {"metadata": {"finalizers": None}})
        assert gone.wait(10), "its removal ends the wait"
        waiting.join(10)

    [notice] = notices
    assert (notice.reason, notice.level) == ("PodStuckTerminating", Level.WARNING)
    assert notice.message.startswith("pod orders-driver-1 is still there ")
    assert f"finalizers {FINALIZER} hold it" in notice.message
    assert "\n" not in notice.message


@pytest.mark.parametrize("api_server_clock", [-3600, 0, 3600], ids=["behind", "same", "ahead"])
def test_a_pod_whose_node_never_confirms_its_deletion_says_how_to_release_it(
    api_server_clock: int,
) -> None:
    """Due when its grace period has passed since the operator asked, by the operator's
    clock: the deletionTimestamp was compared with the operator's clock, so an API server
    whose clock ran ahead had every pod told stuck at once (behind: never)."""
    stamp = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=api_server_clock)
    grace = 30
    metadata = V1ObjectMeta(
        name="orders-driver-3",
        namespace="team-a",
        deletion_timestamp=stamp + datetime.timedelta(seconds=grace),
        deletion_grace_period_seconds=grace,
    )
    pod = V1Pod(metadata=metadata, spec=V1PodSpec(containers=[], node_name="worker-7"))
    asked = 1000.0  # the operator's monotonic clock when it deleted the pod
    due = deletion_due(pod, math.inf, asked)
    assert due == asked + grace

    def after(seconds: float) -> str | None:
        return stuck_deletion(pod, asked + grace + seconds - due)

    assert stuck_deletion(pod, asked + 1 - due) is None, "in its grace period"
    assert after(STUCK_DELETION_SECONDS - 1) is None, "its kubelet may still be at it"
    assert after(STUCK_DELETION_SECONDS + 2) == (
        "pod orders-driver-3 is still there 32s after its deletion was due: its node "
        "worker-7 has not confirmed that its containers stopped (an unreachable node keeps "
        "it for ever: kubectl get node worker-7); once they are known to have stopped, "
        "kubectl delete pod orders-driver-3 -n team-a --grace-period=0 --force releases "
        "it; the job waits until it is gone (no other pod of the job starts while it may run)"
    )
    assert stuck_deletion(V1Pod(metadata=V1ObjectMeta(name="running")), 3600) is None


def test_a_grace_period_that_shortens_brings_the_deletion_forward() -> None:
    """A grace period only shortens (another deletion; the kubelet's last one sets 0 once
    the containers stopped): due at the shorter one's end, never later than first found;
    one missing is 0."""
    pod = V1Pod(metadata=V1ObjectMeta(name="p", deletion_grace_period_seconds=60))
    due = deletion_due(pod, math.inf, 100.0)
    assert due == 160.0
    assert deletion_due(pod, due, 110.0) == 160.0, "the same grace, looked at later"
    pod.metadata.deletion_grace_period_seconds = 0  # the containers stopped at 155
    assert deletion_due(pod, due, 155.0) == 155.0
    assert deletion_due(V1Pod(metadata=V1ObjectMeta(name="p")), math.inf, 7.0) == 7.0


def _pod(**metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "orders-driver-1",
            "labels": {objects.LABEL_JOB: "orders"},
            **metadata,
        },
        "spec": {"containers": [{"name": "driver", "image": "example/orders:1"}]},
    }


def _unexpected(notice: Notice) -> None:
    raise AssertionError(f"unexpected notice: {notice}")


def _with_clients(
    api: EmulatedApiServer,
    tmp_path: Path,
    pods: PodRegistry,
    scenario: Callable[[Clients], Coroutine[Any, Any, None]],
) -> None:
    """Run ``scenario`` with the operator's clients of ``api`` (its own event loop)."""

    async def run() -> None:
        configuration = Configuration()
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        await config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        async with aiohttp.ClientSession() as session:
            clients = Clients(OperatorApiClient(configuration), pods, session)
            try:
                await scenario(clients)
            finally:
                await clients.api.close()

    asyncio.run(run())
