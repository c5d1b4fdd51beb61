"""SparkCheckpointJobs for the simulated drivers (`helpers.kube.simulated`), and waits for
what their status says."""

from typing import Any

from helpers.kube.cluster import LocalCluster


def job(name: str = "orders", **spec: Any) -> dict[str, Any]:
    checkpointing = {
        "interval": "1s",
        "minPause": "0s",
        "timeout": "20s",
        "retained": 2,
        "storage": "file:///simulated",
    }
    checkpointing |= spec.pop("checkpointing", {})
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "image": "example/orders:1",
            # A local master: simulated drivers have no executor pods.
            "application": {
                "mainFile": "local:///opt/app/orders.py",
                "sparkConf": {"spark.master": "local[2]"},
            },
            "checkpointing": checkpointing,
            "restartPolicy": {"type": "OnFailure", "maxRetries": 3, "backoff": "1s"},
            **spec,
        },
    }


def completed(cluster: LocalCluster, name: str, at_least: int) -> Any:
    def check() -> Any:
        status = cluster.status(name)
        done = status.get("counts", {}).get("completed", 0)
        return status if done >= at_least else None

    return cluster.wait_for(f"{at_least} completed checkpoints", check, job=name)


def in_phase(cluster: LocalCluster, name: str, phase: str, timeout: float = 60) -> Any:
    return cluster.wait_for(
        phase,
        lambda: (s := cluster.status(name)).get("phase") == phase and s,
        job=name,
        timeout=timeout,
    )


def savepoint_by_nonce(cluster: LocalCluster, nonce: int) -> int:
    """The id of the savepoint `savepointTriggerNonce: nonce` took, once the job runs."""
    completed(cluster, "orders", 1)
    cluster.patch_spec("orders", {"savepointTriggerNonce": nonce})
    status = cluster.wait_for(
        f"savepoint of nonce {nonce}",
        lambda: (
            (s := cluster.status("orders")).get("lastSavepoint", {}).get("label")
            == f"nonce {nonce}"
            and s
        ),
        job="orders",
    )
    return int(status["lastSavepoint"]["id"])
