"""A driver pod's error reaches the job's status and events as a local run's does: the
operator reads it from the pod's termination message (the log's tail, by
FallbackToLogsOnError), which the local kubelet fills as a kubelet does. Script drivers: no
Spark needed to end with an error."""

import re
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from helpers.fake_query import FAILURE_VARIABLE, reported_failure
from helpers.kube.cluster import NAMESPACE, LocalCluster
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.runtime import KubernetesDriver, PodRegistry
from spark_checkpoint_operator.manifest.loading import manifest_from_document
from spark_checkpoint_operator.supervisor.driver_errors import same_error

pytestmark = pytest.mark.timeout(240)
TESTS = Path(__file__).resolve().parents[1]


def _job(tmp_path: Path, script: str, **env: str) -> dict[str, Any]:
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(script))
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "orders", "namespace": NAMESPACE},
        "spec": {
            "image": "example/orders:1",
            "application": {
                "mainFile": f"local://{driver}",
                "sparkConf": {"spark.master": "local[2]"},
                "env": [{"name": name, "value": value} for name, value in env.items()],
            },
            "checkpointing": {"storage": (tmp_path / "storage").as_uri()},
            "restartPolicy": {"type": "OnFailure", "maxRetries": 5, "backoff": "100ms"},
        },
    }


def _failed(cluster: LocalCluster) -> dict[str, Any]:
    return dict(
        cluster.wait_for(
            "Failed",
            lambda: (s := cluster.status("orders")).get("phase") == "Failed" and s,
            job="orders",
        )
    )


def test_a_driver_pod_that_fails_the_same_way_twice_shows_its_error(tmp_path: Path) -> None:
    script = """
        import logging
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j").info("starting")
        raise ValueError("no such column 'k'")
    """
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(_job(tmp_path, script))
        failed = _failed(cluster)
        assert failed["message"] == (
            "the driver failed the same way twice before its first batch; not retried: "
            "ValueError: no such column 'k'"
        )
        event = cluster.wait_for_event("orders", "DriverFailed", containing="restart 1")
        assert event["message"].endswith("its error:\n    ValueError: no such column 'k'")


def test_a_misconfigured_driver_pod_says_why_in_the_status(tmp_path: Path) -> None:
    """The error line, without what the driver logged as it ended."""
    script = f"""
        import logging, sys
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        log = logging.getLogger("spark_checkpoint")
        log.error("cannot start: the output holds committed batches and no image restores")
        log.warning("Closing down clientserver connection")
        sys.exit({DriverExit.MISCONFIGURED.value})
    """
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(_job(tmp_path, script))
        failed = _failed(cluster)
        assert failed["message"] == (
            "driver cannot run: MISCONFIGURED: ERROR spark_checkpoint: cannot start: the "
            "output holds committed batches and no image restores"
        )
        assert failed["jobAttempt"] == 1, "a misconfigured driver is not retried"


def test_the_error_a_driver_pod_reports_is_shown_however_long_its_log_goes_on(
    tmp_path: Path,
) -> None:
    """The real `run_coordinated` around a query that fails as Spark's do (the error, then
    kilobytes of plan) and logs 120 lines as it ends: far more than the 80 lines a
    termination message keeps of a log. The error it wrote to its termination message file
    is the one shown."""
    script = f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from helpers.fake_query import main
        main()
    """
    job = _job(tmp_path, script, **{FAILURE_VARIABLE: "no such column 'k'"})
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(job)
        failed = _failed(cluster)
        repeated = "the driver failed the same way twice before its first batch; not retried: "
        failure = reported_failure("no such column 'k'")
        assert re.fullmatch(re.escape(repeated) + failure, failed["message"])


def test_a_job_recreated_under_its_name_is_refused_the_old_jobs_storage(tmp_path: Path) -> None:
    """Another uid is another registry of the job's snapshots: the real `run_coordinated`
    refuses storage the job of the same name claimed before it was deleted (whose
    checkpoints this job's garbage collection would delete), and nothing there changes."""
    earlier = StorageOwner(
        id="0b5c1f9e-0000-4000-8000-000000000001",
        description=f"SparkCheckpointJob {NAMESPACE}/orders (uid 0b5c1f9e-...-000000000001)",
    )
    job_storage = tmp_path / "storage" / NAMESPACE / "orders"
    (job_storage / "chk-7").mkdir(parents=True)
    (job_storage / "chk-7" / "_metadata").write_text("the old job's")
    (job_storage / "owner.json").write_text(earlier.encode())
    script = f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from helpers.fake_query import main
        main()
    """
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(_job(tmp_path, script))
        failed = _failed(cluster)
        job = cluster.job("orders")
        assert job is not None
        uid = job["metadata"]["uid"]
        assert failed["message"] == (
            "driver cannot run: MISCONFIGURED: "
            f"{(job_storage / 'owner.json').as_uri()}: this job's storage belongs to "
            f"{earlier.description}, not to SparkCheckpointJob {NAMESPACE}/orders (uid {uid}), "
            "whose garbage collection would delete the other's checkpoints: run the job from "
            "the registry that owns it, or give this one another spec.checkpointing.storage "
            "(spec.restore.initialSavepointPath can start it from a savepoint there); to hand "
            f"the storage over, delete {job_storage / 'owner.json'} (the checkpoints the other "
            "registry lists are then deleted as garbage; its savepoints stay)"
        )
        assert failed["jobAttempt"] == 1, "a misconfigured driver is not retried"
        # No cleanup pod: it would be refused the storage too (a CleanupFailed event).
        cluster.wait_for_event("orders", "JobFailed")
        assert [e["reason"] for e in cluster.events("orders") if "Cleanup" in e["reason"]] == []
        assert cluster.pods("orders", component="cleanup") == []
    assert (job_storage / "chk-7" / "_metadata").read_text() == "the old job's"
    assert StorageOwner.decode((job_storage / "owner.json").read_text()) == earlier


def test_a_job_recreated_where_the_old_one_left_no_checkpoints_takes_its_storage_over(
    tmp_path: Path,
) -> None:
    """The old job deleted under a retention policy that discarded its checkpoints: the
    job created again under its name claims the storage (nothing there its garbage
    collection could delete but garbage) and checkpoints; the old savepoint stays."""
    earlier = StorageOwner(
        id="0b5c1f9e-0000-4000-8000-000000000001",
        description=f"SparkCheckpointJob {NAMESPACE}/orders (uid 0b5c1f9e-...-000000000001)",
    )
    job_storage = tmp_path / "storage" / NAMESPACE / "orders"
    savepoint = job_storage / "savepoints" / "sp-3" / "_metadata"
    savepoint.parent.mkdir(parents=True)
    savepoint.write_text("the old job's savepoint")
    (job_storage / "owner.json").write_text(earlier.encode())
    script = f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from helpers.fake_query import main
        main()
    """
    job = _job(tmp_path, script)
    job["spec"]["checkpointing"] |= {"interval": "1s", "minPause": "0s"}
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(job)
        cluster.wait_for(
            "a completed checkpoint",
            lambda: cluster.status("orders").get("counts", {}).get("completed", 0) >= 1,
            job="orders",
        )
        stored = cluster.job("orders")
        assert stored is not None
        owner = StorageOwner.decode((job_storage / "owner.json").read_text())
        assert owner.id == stored["metadata"]["uid"]
    assert savepoint.read_text() == "the old job's savepoint"


def test_a_driver_pod_killed_by_a_signal_has_no_log_line_for_an_error(tmp_path: Path) -> None:
    """Exit 137: its log's tail is whatever it was doing, not an error; a kill is no
    failure that repeats the same way, so it is retried to the end."""
    script = """
        import logging, os, signal
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("spark_checkpoint").error("cannot list /in/_tmp, skipping")
        os.kill(os.getpid(), signal.SIGKILL)
    """
    job = _job(tmp_path, script)
    job["spec"]["restartPolicy"]["maxRetries"] = 1
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(job)
        failed = _failed(cluster)
        assert failed["message"] == (
            "driver failed 2 times in a row; restartPolicy.maxRetries=1 exhausted"
        )
        event = cluster.wait_for_event("orders", "DriverFailed", containing="restart 1")
        assert "exit 137" in event["message"]
        assert "its error" not in event["message"]


def _ended_driver(
    tmp_path: Path, state: dict[str, Any], name: str = "orders-driver-1"
) -> tuple[KubernetesDriver, PodRegistry, dict[str, Any]]:
    manifest = manifest_from_document(_job(tmp_path, ""))
    pod = {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": objects.job_labels(manifest, objects.DRIVER),
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "driver", "state": {"terminated": state}}],
        },
    }
    pods = PodRegistry()
    pods.observe("ADDED", pod)
    clients = SimpleNamespace(pods=pods, session=None)
    driver = KubernetesDriver(
        clients,
        manifest,
        name=name,
        token="t",
        executors=0,
        deployed_hash="",
        report=lambda notice: None,  # it is never terminated
    )
    return driver, pods, pod


def test_a_driver_pod_over_its_memory_limit_says_so_for_its_error(tmp_path: Path) -> None:
    driver, _, _ = _ended_driver(
        tmp_path, {"exitCode": 137, "reason": "OOMKilled", "message": "INFO BlockManager: dropping"}
    )
    assert driver.exit_code() == 137
    assert driver.error_lines() == [
        "OOMKilled: the driver went over its container's memory limit (spec.driver.memory "
        "and Spark's overhead)"
    ]


def test_an_evicted_driver_pod_says_why_the_node_ended_it(tmp_path: Path) -> None:
    """Only the container's exit (137) and its log's last lines were told (a Flink
    operator user's)."""
    driver, pods, pod = _ended_driver(
        tmp_path, {"exitCode": 137, "reason": "Error", "message": "INFO BlockManager: dropping"}
    )
    pod["status"]["reason"] = "Evicted"
    pod["status"]["message"] = "The node was low on resource: memory. Threshold quantity: 100Mi,\n"
    pods.observe("MODIFIED", pod)

    assert driver.exit_code() == 137
    assert driver.error_lines() == [
        "Evicted: The node was low on resource: memory. Threshold quantity: 100Mi, "
        "(pod orders-driver-1)"
    ]
    # Evicted alike twice before its first batch, a driver is retried (a reviewer's): it is
    # not the pipeline's error that two failures alike are taken for.
    other, other_pods, other_pod = _ended_driver(
        tmp_path, {"exitCode": 137, "reason": "Error"}, name="orders-driver-2"
    )
    other_pod["status"].update(reason=pod["status"]["reason"], message=pod["status"]["message"])
    other_pods.observe("MODIFIED", other_pod)
    assert other.exit_code() == 137
    assert not same_error(driver.error_lines(), other.error_lines())


def test_a_driver_pod_deleted_after_it_was_seen_ended_keeps_its_exit_and_error(
    tmp_path: Path,
) -> None:
    driver, pods, pod = _ended_driver(
        tmp_path,
        {"exitCode": 2, "reason": "Error", "message": "cannot start: the output has batches"},
    )
    assert driver.exit_code() == 2
    pods.observe("DELETED", pod)
    assert driver.exit_code() == 2
    assert driver.error_lines() == ["cannot start: the output has batches"]
