"""A job's namespace deleted with the job in it (`kubectl delete namespace`, an Argo CD
Application deleted with its namespace): everything in it is deleted at once, and nothing
can be created in it any more (no Lease, no cleanup pod, no Event)."""

from pathlib import Path

import kmock
import pytest

from helpers.kube.cluster import LocalCluster
from helpers.kube.simulated import SimulatedAgents
from helpers.kube.simulated_jobs import completed, job
from spark_checkpoint_operator.kubernetes.handlers import LEASE_SECONDS_VARIABLE
from spark_checkpoint_operator.kubernetes.lease import MIN_LEASE_SECONDS, lease_name

pytestmark = pytest.mark.timeout(240)
NAMESPACES = "v1/namespaces"
LEASES = "coordination.k8s.io/v1/leases"


def _gone(cluster: LocalCluster, namespace: str) -> bool:
    try:
        cluster.api.get(NAMESPACES, None, namespace)
    except kmock.KubernetesError as error:
        return error.status == 404
    return False


def test_a_deleted_namespace_goes_and_its_jobs_deletion_says_what_it_left(
    tmp_path: Path,
) -> None:
    """The job's deletion goes on without what it cannot create: its finalizer goes, so the
    namespace does (it stayed Terminating for ever: the job's Lease could not be created
    again). The job in another namespace runs on undisturbed."""
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

        # The namespace controller deletes resource by resource, in no set order: the Lease
        # may go first, and the operator stop driving the job before it is deleted.
        cluster.api.delete(LEASES, "team", lease_name("orders"))
        cluster.wait_for(
            "the Lease lost",
            lambda: "Lease was deleted" in cluster.operator.log_path.read_text(),
        )
        cluster.api.delete(NAMESPACES, None, "team")

        cluster.wait_for("the namespace gone", lambda: _gone(cluster, "team"), timeout=90)
        before = cluster.status("orders")["counts"]["completed"]
        completed(cluster, "orders", before + 2)
        log = cluster.operator.log_path.read_text()
        assert "Traceback" not in log
        assert "team/orders: job cancelled: the job was deleted" in log
        assert "the job's namespace team is being deleted" in log
