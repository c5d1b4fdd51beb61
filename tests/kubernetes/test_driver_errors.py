"""A driver pod's error reaches the job's status and events as a local run's does: the
operator reads it from the pod's termination message (the log's tail, by
FallbackToLogsOnError), which the local kubelet fills as a kubelet does. Script drivers: no
Spark needed to end with an error."""

import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers.kube.cluster import NAMESPACE, LocalCluster
from spark_checkpoint.exit_codes import DriverExit

pytestmark = pytest.mark.timeout(240)


def _job(tmp_path: Path, script: str) -> dict[str, Any]:
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
