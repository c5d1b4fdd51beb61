"""The whole story with containers: the operator image, run as the chart deploys it, drives
a job against the emulated API server, and the local kubelet runs the job's driver and
cleanup pods as Podman containers from the spark image (tests/helpers/kube/kubelet.py,
container mode). The job, its input and its ground truth are the process-mode end-to-end
test's (tests/e2e/test_operator_runs.py), on a volume claim the pods mount: kill -9 of the
driver container, restore, suspend and resume, delete with the final savepoint, and the
output exactly once."""

from pathlib import Path
from typing import Any

import pytest
from e2e.test_operator_runs import (
    NAME,
    Workload,
    completed_count,
    crash_and_restore,
    status_where,
    suspend_and_resume,
)

from helpers.kube.cluster import LocalCluster

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]

# Where the driver pods mount the workload's claim, and the image's own word count.
DATA = "/data"
PIPELINE = "local:///opt/spark-checkpoint/examples/wordcount/pipeline.py"
CLAIM = "wordcount-data"


class ClaimWorkload(Workload):
    """The process-mode test's workload in the directory the local kubelet makes for the
    claim ``wordcount-data``: the test writes input and reads output and storage there, the
    pods at DATA."""

    def __init__(self, cluster_dir: Path) -> None:
        super().__init__(cluster_dir / "pods" / "default" / "claims" / CLAIM)

    def container_job(self, image: str) -> dict[str, Any]:
        document = self.job()
        spec = document["spec"]
        spec["image"] = image
        spec["application"]["mainFile"] = PIPELINE
        spec["application"]["arguments"] = [
            *("--input", f"{DATA}/{self.input.name}"),
            *("--output", f"{DATA}/{self.output.name}"),
        ]
        spec["checkpointing"]["storage"] = f"file://{DATA}/{self.storage.name}"
        spec["driver"] = {
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
            "volumeMounts": [{"name": "data", "mountPath": DATA}],
        }
        return document


def test_a_job_lives_through_its_story_in_containers_exactly_once(
    images: dict[str, str], tmp_path: Path
) -> None:
    cluster_dir = tmp_path / "cluster"
    work = ClaimWorkload(cluster_dir)
    work.add_input(files=40)
    with LocalCluster(
        cluster_dir, operator_image=images["operator"], pod_containers=True
    ) as cluster:
        cluster.apply(work.container_job(images["spark"]))

        first = status_where(cluster, "2 checkpoints", lambda s: completed_count(s) >= 2)
        assert first["phase"] == "Running"
        assert first["lastCheckpoint"]["path"].startswith(f"file://{DATA}/storage/")
        (driver,) = cluster.pods(NAME, component="driver")
        status = driver["status"]["containerStatuses"][0]
        assert status["containerID"].startswith("podman://"), "the driver runs in a container"
        assert status["image"] == images["spark"]

        crash_and_restore(cluster)  # podman kill --signal 9 of the driver's container
        suspend_and_resume(cluster, work)

        cluster.wait_for("all input processed", work.caught_up, timeout=300)
        work.assert_exactly_once()

        cluster.delete(NAME)
        cluster.wait_for("the job gone", lambda: cluster.job(NAME) is None, timeout=300)
        cluster.wait_for_event(NAME, containing="(final)")
        cluster.wait_for("no pods", lambda: cluster.pods(NAME) == [])
        savepoints = sorted(p.name for p in (work.job_storage / "savepoints").iterdir())
        assert len(savepoints) >= 2, savepoints  # suspend, final
        assert not list(work.job_storage.glob("chk-*")), "a deleted job's checkpoints go"
        work.assert_exactly_once()
