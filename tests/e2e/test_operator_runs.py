"""The operator end to end: a real ``spark-checkpoint-operator`` process against the
emulated API server, whose pods a local kubelet runs as real Spark drivers (local mode).

One job lives through everything a job goes through, and its output is checked against
ground truth computed independently from its input: exactly once, whatever happened.
"""

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers.job_run import EXAMPLE, expected_counts, generate
from helpers.kube.cluster import LocalCluster, operator_stopped, wordcount_job
from spark_checkpoint.sink import latest_values, read_committed

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

NAME = "wordcount"
SNAPSHOTS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointsnapshots"


class Workload:
    """The word count's input, output and checkpoint storage on this machine."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True)
        self.pipeline = directory / "pipeline.py"
        shutil.copy(EXAMPLE / "pipeline.py", self.pipeline)
        self.input = directory / "input"
        self.output = directory / "output"
        self.storage = directory / "storage"
        self.files = 0

    def add_input(self, files: int) -> None:
        generate(self.input, files=files, lines=150, seed=11, start_index=self.files)
        self.files += files

    def job(self, **spec: Any) -> dict[str, Any]:
        defaults: dict[str, Any] = {
            "checkpointing": {
                "interval": "3s",
                "minPause": "500ms",
                "timeout": "60s",
                "retained": 2,
                "storage": self.storage.as_uri(),
                # The driver's live location on a claim (as executors would need): the
                # deletion must remove the job's directory there.
                "liveVolumeClaim": "wordcount-live",
            },
            "restartPolicy": {"type": "OnFailure", "maxRetries": 10, "backoff": "500ms"},
        }
        return wordcount_job(NAME, self.pipeline, self.input, self.output, **defaults | spec)

    @property
    def job_storage(self) -> Path:
        return self.storage / "default" / NAME

    def assert_exactly_once(self) -> None:
        counts = {w: int(row["count"]) for w, row in latest_values(self.output, "word").items()}
        assert counts == expected_counts(self.input)
        batches = sorted(read_committed(self.output))
        assert batches == list(range(len(batches))), "committed batches are 0..N without gaps"

    def caught_up(self) -> bool:
        if not self.output.exists():
            return False
        counts = {w: int(row["count"]) for w, row in latest_values(self.output, "word").items()}
        return counts == expected_counts(self.input)


def status_where(cluster: LocalCluster, what: str, check: Any, timeout: float = 240) -> Any:
    def poll() -> Any:
        status = cluster.status(NAME)
        return status if status and check(status) else None

    return cluster.wait_for(what, poll, timeout=timeout, job=NAME)


def completed_count(status: dict[str, Any]) -> int:
    return int(status.get("counts", {}).get("completed", 0))


def registered_labels(status: dict[str, Any]) -> set[str]:
    return {s.get("label", "") for s in status.get("coordinator", {}).get("savepoints", [])}


def test_a_job_lives_through_everything_exactly_once(tmp_path: Path) -> None:
    work = Workload(tmp_path / "work")
    work.add_input(files=40)
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(work.job())

        first = status_where(cluster, "2 checkpoints", lambda s: completed_count(s) >= 2)
        assert first["phase"] == "Running"
        assert first["lastCheckpoint"]["path"].startswith(work.storage.as_uri())
        job = cluster.job(NAME)
        assert job is not None
        claim = cluster.work_dir / "pods" / "default" / "claims" / "wordcount-live"
        live = claim / f"{NAME}-{job['metadata']['uid']}"
        assert (live / "attempt-1").is_dir(), "the driver works on the claim"

        crash_and_restore(cluster)
        suspend_and_resume(cluster, work)
        savepoint_by_nonce(cluster)
        redeploy_from_a_snapshot_objects_savepoint(cluster, work, snapshot_object(cluster))
        upgrade(cluster, work)
        restart_the_operator_mid_checkpoint(cluster)

        cluster.wait_for("all input processed", work.caught_up, timeout=300)
        work.assert_exactly_once()

        delete_with_final_savepoint(cluster, work)
        work.assert_exactly_once()
        assert claim.is_dir() and not live.exists(), "the job's directory left the claim"


def crash_and_restore(cluster: LocalCluster) -> None:
    """kill -9 of the driver: restored from the latest checkpoint."""
    cluster.crash_driver("wordcount-driver-1")
    restored = status_where(
        cluster, "the restore", lambda s: s.get("counts", {}).get("restored", 0) >= 1
    )
    assert restored["jobAttempt"] == 2
    assert re.fullmatch(r"checkpoint:\d+", restored["restoredFrom"]["source"])
    status_where(cluster, "Running again", lambda s: s["phase"] == "Running")


def suspend_and_resume(cluster: LocalCluster, work: Workload) -> None:
    """Suspend: a savepoint, then no pods. Resume with more input: from that savepoint."""
    cluster.patch_spec(NAME, {"state": "Suspended"})
    suspended = status_where(cluster, "Suspended", lambda s: s["phase"] == "Suspended")
    cluster.wait_for("no driver pod", lambda: cluster.driver_pods(NAME) == [])
    savepoint = suspended["lastSavepoint"]
    assert savepoint["label"] == "suspend"
    assert (work.job_storage / "savepoints" / f"sp-{savepoint['id']}" / "_metadata").is_file()

    work.add_input(files=20)
    cluster.patch_spec(NAME, {"state": "Running"})
    status_where(
        cluster,
        "resumed from the savepoint",
        lambda s: (
            s["phase"] == "Running"
            and (s.get("restoredFrom") or {}).get("source") == f"savepoint:{savepoint['id']}"
        ),
    )


def savepoint_by_nonce(cluster: LocalCluster) -> None:
    cluster.patch_spec(NAME, {"savepointTriggerNonce": 1})
    status_where(cluster, "the nonce's savepoint", lambda s: "nonce 1" in registered_labels(s))
    cluster.wait_for_event(NAME, containing="(nonce 1)")


def snapshot_object(cluster: LocalCluster) -> dict[str, Any]:
    """A SparkCheckpointSnapshot: its status names the savepoint taken (COMPLETED, its
    path), which the job's registry keeps pinned while the object exists."""
    snapshot = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointSnapshot",
        "metadata": {"name": "before-redeploy", "namespace": "default"},
        "spec": {"jobReference": {"name": NAME}, "savepoint": {}},
    }
    cluster.api.create(SNAPSHOTS, snapshot, namespace="default")
    status = cluster.wait_for(
        "the snapshot object's savepoint",
        lambda: (
            (s := cluster.api.get(SNAPSHOTS, "default", "before-redeploy").get("status") or {}).get(
                "state"
            )
            == "COMPLETED"
            and s
        ),
        timeout=240,
        job=NAME,
    )
    registered = next(
        s for s in cluster.status(NAME)["coordinator"]["savepoints"] if s["id"] == status["id"]
    )
    assert registered["pinned"] is True and registered["path"] == status["path"]
    assert registered["label"].startswith("snapshot before-redeploy (")
    return dict(registered)


def redeploy_from_a_snapshot_objects_savepoint(
    cluster: LocalCluster, work: Workload, savepoint: dict[str, Any]
) -> None:
    """spec.restore.savepointRedeployNonce back to a snapshot object's savepoint (its
    status.path) once batches of new input were committed after it: the driver stops
    without a savepoint, the next restores that savepoint, the newer images are set aside,
    and the batches after it are planned again over the same files (recognised as
    committed: exactly once, checked at the end)."""
    work.add_input(files=6)
    status_where(
        cluster,
        "batches committed after the savepoint",
        lambda s: s.get("lastCommittedBatch", -1) >= savepoint["batchId"] + 3,
    )
    before = cluster.status(NAME)
    newest, committed = before["lastCheckpoint"]["id"], before["lastCommittedBatch"]
    path = savepoint["path"]
    cluster.patch_spec(
        NAME, {"restore": {"initialSavepointPath": path, "savepointRedeployNonce": 1}}
    )
    redeployed = status_where(
        cluster,
        "the redeploy restored",
        lambda s: (
            s.get("handledTriggers", {}).get("savepointRedeployNonce") == 1
            and s["phase"] == "Running"
        ),
    )
    assert redeployed["restoredFrom"]["source"] == f"savepoint:{savepoint['id']}"
    assert f"checkpoint:{newest}" in {e["source"] for e in redeployed["unrestorable"]}
    cluster.wait_for_event(NAME, "Redeploying", f"restores savepoint:{savepoint['id']}")
    # Past the output committed before (a change of how batches are planned, as the upgrade
    # next makes, fails a replay of a committed batch over other input: ReplayDiffers).
    status_where(
        cluster,
        "the replay past the committed output",
        lambda s: s["lastCommittedBatch"] > committed,
    )


def upgrade(cluster: LocalCluster, work: Workload) -> None:
    """An application change goes through a savepoint and a new driver."""
    before = cluster.driver_pods(NAME)
    arguments = [*work.job()["spec"]["application"]["arguments"], "--files-per-batch", "2"]
    cluster.patch_spec(NAME, {"application": {"arguments": arguments}})
    upgraded = status_where(
        cluster,
        "the upgraded driver",
        lambda s: (
            s["phase"] == "Running"
            and "upgrade" in registered_labels(s)
            and cluster.driver_pods(NAME) not in ([], before)
        ),
    )
    assert upgraded["restoredFrom"]["source"].startswith("savepoint:")
    pod = cluster.pods(NAME, component="driver")[0]
    assert pod["spec"]["containers"][0]["command"][-2:] == ["--files-per-batch", "2"]


def restart_the_operator_mid_checkpoint(cluster: LocalCluster) -> None:
    """kill -9 of the operator right after a trigger: the driver is adopted, no checkpoint
    id is used twice, no second driver starts."""
    log = cluster.operator.log_path
    triggers = log.read_text().count("trigger checkpoint")
    cluster.wait_for("a trigger", lambda: log.read_text().count("trigger checkpoint") > triggers)
    before = cluster.status(NAME)
    with operator_stopped(cluster):
        drivers = cluster.driver_pods(NAME)
    after = status_where(
        cluster,
        "checkpoints after the operator restart",
        lambda s: completed_count(s) >= completed_count(before) + 2,
    )
    assert after["jobAttempt"] == before["jobAttempt"], "the running driver was adopted"
    assert cluster.driver_pods(NAME) == drivers, "never a second driver"
    ids = [o["id"] for o in after["coordinator"]["history"]]
    assert ids == sorted(set(ids)), "no checkpoint id was used twice"
    assert after["nextCheckpointId"] > before["nextCheckpointId"]


def delete_with_final_savepoint(cluster: LocalCluster, work: Workload) -> None:
    """The final savepoint, retention by cleanup pods, then the finalizer is released."""
    cluster.delete(NAME)
    cluster.wait_for("the job gone", lambda: cluster.job(NAME) is None, timeout=240)
    cluster.wait_for_event(NAME, containing="(final)")
    cluster.wait_for("no pods", lambda: cluster.pods(NAME) == [])
    savepoints = sorted(p.name for p in (work.job_storage / "savepoints").iterdir())
    assert len(savepoints) >= 4, savepoints  # suspend, nonce, upgrade, final
    # RetainOnFailure: a deleted (cancelled) job's checkpoints are discarded.
    assert not list(work.job_storage.glob("chk-*"))
