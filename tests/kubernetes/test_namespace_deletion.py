"""A job's namespace deleted with the job in it (`kubectl delete namespace`, an Argo CD
Application deleted with its namespace): everything in it is deleted at once, and nothing
can be created in it any more (no Lease, no cleanup pod, no Event)."""

import json
from pathlib import Path

import kmock
import pytest
from kubernetes.aio.client.exceptions import ApiException

from helpers.kube.cluster import LocalCluster, refused_requests
from helpers.kube.simulated import SimulatedAgents
from helpers.kube.simulated_jobs import completed, job
from spark_checkpoint_operator.kubernetes.handlers import LEASE_SECONDS_VARIABLE
from spark_checkpoint_operator.kubernetes.lease import MIN_LEASE_SECONDS, lease_name
from spark_checkpoint_operator.kubernetes.runtime import _launch_error
from spark_checkpoint_operator.supervisor import LaunchBlocked, LaunchFailed

pytestmark = pytest.mark.timeout(240)
NAMESPACES = "v1/namespaces"
LEASES = "coordination.k8s.io/v1/leases"


def _gone(cluster: LocalCluster, namespace: str) -> bool:
    try:
        cluster.api.get(NAMESPACES, None, namespace)
    except kmock.KubernetesError as error:
        return error.status == 404
    return False


@pytest.mark.parametrize("lease_first", [True, False], ids=["lease-first", "all-at-once"])
def test_a_deleted_namespace_goes_and_the_job_in_it_with_it(
    tmp_path: Path, lease_first: bool
) -> None:
    """The namespace controller deletes resource type by resource type, in no set order.
    All at once: the job's daemon does the deletion (no cleanup pod can be created: its
    checkpoints stay). The Lease first: the operator stops driving the job before it is
    deleted, and its deletion handler finds no Lease to take (the namespace stayed
    Terminating for ever); another operator may still carry out the deletion, so the job
    is let go of without touching its driver or storage. The job in another namespace runs
    on undisturbed."""
    agents = SimulatedAgents(batch_seconds=0.3)
    with LocalCluster(
        tmp_path, simulated=agents, namespaces=("default", "team"), operator=False
    ) as cluster:
        cluster.operator.settings[LEASE_SECONDS_VARIABLE] = str(MIN_LEASE_SECONDS)  # renewed soon
        cluster.operator.start()
        cluster.apply(job())
        team = job()
        team["metadata"]["namespace"] = "team"
        cluster.apply(team)
        cluster.wait_for(
            "a checkpoint in team",
            lambda: cluster.status("orders", "team").get("counts", {}).get("completed", 0) >= 1,
        )

        if lease_first:
            # Not created again by the daemon's next try before the namespace's deletion.
            refusing = refused_requests(
                cluster,
                lambda r: r.method.value == "POST" and "/namespaces/team/leases" in r.url.path,
                kmock.KubernetesError(403, "Forbidden", "leases is forbidden", {}),
            )
            cluster.api.delete(LEASES, "team", lease_name("orders"))
            cluster.wait_for(
                "the Lease lost",
                lambda: "Lease was deleted" in cluster.operator.log_path.read_text(),
            )
        cluster.api.delete(NAMESPACES, None, "team")
        if lease_first:
            refusing.clear()  # the namespace refuses it now

        cluster.wait_for("the namespace gone", lambda: _gone(cluster, "team"), timeout=90)
        before = cluster.status("orders")["counts"]["completed"]
        completed(cluster, "orders", before + 2)
        log = cluster.operator.log_path.read_text()
        assert "Traceback" not in log
        if lease_first:
            assert "the job is let go without a final savepoint or retention" in log
        else:
            assert "team/orders: job cancelled: the job was deleted" in log


def test_a_driver_refused_by_a_namespace_being_deleted_is_no_failure_of_the_job() -> None:
    """Its pod deleted first, the job's restart is refused: it goes with its namespace."""
    cause = {"type": "NamespaceTerminating", "message": "namespace team is being terminated"}
    body = {"message": "pods is forbidden: ...", "details": {"causes": [cause]}}
    terminating = ApiException(status=403)
    terminating.body = json.dumps(body)
    forbidden = ApiException(status=403)
    forbidden.body = json.dumps({"message": "pods is forbidden: no"})

    assert isinstance(_launch_error(terminating, "pod orders-driver-2"), LaunchBlocked)
    assert isinstance(_launch_error(forbidden, "pod orders-driver-2"), LaunchFailed)
