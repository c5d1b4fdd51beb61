"""Executor pods as Spark builds them for a job on Kubernetes: a real
``spark-checkpoint-operator`` against the emulated API server, whose kubelet runs the
driver pod as a real Spark driver with the emulator as its Kubernetes master. Spark's own
code (the fabric8 client, the pod template loader, its feature steps) creates each executor
pod from the settings and the pod template the operator gives the driver: what it creates
is what a cluster would run.
"""

import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers.job_run import EXAMPLE
from helpers.kube.cluster import NAMESPACE, PODS, LocalCluster, wordcount_job
from spark_checkpoint_operator.kubernetes import objects

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

TOLERATION = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
# A kind of volume Spark's spark.kubernetes.executor.volumes.* settings cannot express.
SETTINGS_VOLUME = {"name": "settings", "configMap": {"name": "orders-settings"}}
SETTINGS_MOUNT = {"name": "settings", "mountPath": "/etc/orders", "readOnly": True}
# What no field of the spec says, through the pod templates (every pod's, the executors').
AFFINITY = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 50,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"spark-role": "executor"}},
                },
            }
        ]
    }
}
INIT_CONTAINER = {"name": "warm-cache", "image": "busybox:1.36", "command": ["true"]}


def _executor_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = cluster.api.list(PODS, NAMESPACE, labels="spark-role=executor")
    return pods


def test_spark_builds_executor_pods_from_the_jobs_executor_spec(tmp_path: Path) -> None:
    pipeline = tmp_path / "pipeline.py"
    shutil.copy(EXAMPLE / "pipeline.py", pipeline)
    (tmp_path / "input").mkdir()
    with LocalCluster(tmp_path / "cluster") as cluster:
        job = wordcount_job(
            "orders",
            pipeline,
            tmp_path / "input",
            tmp_path / "output",
            checkpointing={
                "storage": (tmp_path / "storage").as_uri(),
                "liveVolumeClaim": "orders-live",
            },
            executor={
                "instances": 1,
                "tolerations": [TOLERATION],
                "volumes": [SETTINGS_VOLUME],
                "volumeMounts": [SETTINGS_MOUNT],
                "annotations": {"example.com/team": "streaming"},
                "labels": {"tier": "gold"},
                "nodeSelector": {"pool": "streaming"},
            },
        )
        job["spec"]["application"]["sparkConf"]["spark.master"] = f"k8s://{cluster.api.url}"
        job["spec"]["imagePullSecrets"] = [{"name": "registry"}]
        job["spec"]["imagePullPolicy"] = "Always"
        job["spec"]["podTemplate"] = {
            "metadata": {"labels": {"cost-center": "42"}},
            "spec": {"affinity": AFFINITY},
        }
        job["spec"]["executor"]["podTemplate"] = {
            "spec": {
                "initContainers": [INIT_CONTAINER],
                "containers": [
                    {
                        "name": "spark-main-container",
                        "resources": {"limits": {"ephemeral-storage": "1Gi"}},
                    }
                ],
            }
        }
        stored = cluster.apply(job)
        executor = cluster.wait_for(
            "Spark's first executor pod",
            lambda: next(iter(_executor_pods(cluster)), None),
            timeout=240,
            job="orders",
        )

    spec, metadata = executor["spec"], executor["metadata"]
    assert spec["tolerations"] == [TOLERATION]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["nodeSelector"] == {"pool": "streaming"}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["fsGroup"] == objects.FS_GROUP
    assert metadata["annotations"]["example.com/team"] == "streaming"
    assert metadata["labels"]["tier"] == "gold"
    assert metadata["labels"]["cost-center"] == "42"
    assert spec["affinity"] == AFFINITY
    assert spec["initContainers"] == [INIT_CONTAINER]
    assert metadata["labels"][objects.LABEL_JOB] == "orders"
    (owner,) = metadata["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Pod", "orders-driver-1")

    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["settings"] == SETTINGS_VOLUME
    claim = volumes[objects.WORK_VOLUME]["persistentVolumeClaim"]
    assert claim["claimName"] == "orders-live"
    (container,) = spec["containers"]
    assert container["name"] == objects.EXECUTOR_CONTAINER
    assert container["image"] == job["spec"]["image"]
    assert container["imagePullPolicy"] == "Always"
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # Spark's cpu and memory beside the template's other resources.
    limits = container["resources"]["limits"]
    assert limits["ephemeral-storage"] == "1Gi"
    assert limits["memory"]
    # spark.authenticate: the driver's ports answer only its executors, with the secret
    # Spark generated and gave each executor pod.
    variables = {v["name"]: v.get("value") for v in container["env"]}
    assert variables.get("_SPARK_AUTH_SECRET"), sorted(variables)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["settings"] == SETTINGS_MOUNT
    live = mounts[objects.WORK_VOLUME]
    directory = f"orders-{stored['metadata']['uid']}"
    assert live["subPath"] == directory
    # The local kubelet rewrites the driver's mount paths in its environment, Spark's
    # settings too (a cluster would show /var/lib/spark-checkpoint/work): the executors
    # mount the job's directory where the driver sees it.
    claims = tmp_path / "cluster" / "pods" / NAMESPACE / "claims"
    assert live["mountPath"] == str(claims / "orders-live" / directory)
