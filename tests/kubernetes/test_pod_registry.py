"""The operator's view of pods (`PodRegistry`, fed by its pod watch) against the emulated API
server: a watch that was down misses DELETED events, so waiting for a pod to be gone asks
the API server too."""

import asyncio
from pathlib import Path

import aiohttp
from kubernetes.aio import config
from kubernetes.aio.client import Configuration

from helpers.kube.emulator import spark_checkpoint_api
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.runtime import (
    GONE_CHECK_SECONDS,
    Clients,
    OperatorApiClient,
    PodRegistry,
    delete_pod_and_wait,
)


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

    async def scenario(kubeconfig: Path) -> PodRegistry:
        configuration = Configuration()
        await config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        pods = PodRegistry()
        pods.observe("ADDED", driver)  # the last the watch saw of it
        async with aiohttp.ClientSession() as session:
            clients = Clients(OperatorApiClient(configuration), pods, session)
            try:
                await asyncio.wait_for(
                    delete_pod_and_wait(clients, "default", "orders", "orders-driver-1"),
                    3 * GONE_CHECK_SECONDS,
                )
            finally:
                await clients.api.close()
        return pods

    with spark_checkpoint_api() as api:
        pods = asyncio.run(scenario(api.write_kubeconfig(tmp_path / "kubeconfig")))

    assert pods.pod("default", "orders", "orders-driver-1") is None
