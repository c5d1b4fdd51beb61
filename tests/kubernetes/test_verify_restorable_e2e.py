"""checkpointing.verifyRestorable on Kubernetes, end to end: the operator (a real ``kopf
run``) checks each completed image in a check pod, which the local kubelet runs as a real
janitor with real PySpark. The hook in check_hook/ holds each check until the test
answers: the first is skipped (its pod ends without a verdict, a RestorableCheckSkipped
event says why); the newest image is damaged while its check is under way and its driver
is killed, so that a restore would pick it: the check finds it unrestorable with Spark's reason, the
status records it and an ImageUnrestorable event says so, and the restore after the kill
skips it (tests/e2e/test_verify_restorable.py checks the output of the same flow locally)."""

import re
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.job_run import EXAMPLE, generate
from helpers.kube.cluster import LocalCluster, wordcount_job
from spark_checkpoint_operator.kubernetes import objects

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

NAME = "wordcount"
HOOK = Path(__file__).parent / "check_hook"


def _job(work: Path) -> dict[str, Any]:
    return wordcount_job(
        NAME,
        EXAMPLE / "pipeline.py",
        work / "input",
        work / "output",
        env=[
            {"name": "PYTHONPATH", "value": str(HOOK)},
            {"name": "CHECK_HOOK_JOB", "value": str(work)},
            {
                "name": "CHECK_HOOK_STORAGE",
                "value": str(work / "storage" / "default" / NAME),
            },
        ],
        checkpointing={
            "interval": "3s",
            "minPause": "500ms",
            "timeout": "60s",
            "retained": 4,
            "storage": (work / "storage").as_uri(),
            "verifyRestorable": True,
        },
        restartPolicy={"type": "OnFailure", "maxRetries": 3, "backoff": "500ms"},
    )


def _newest(status: dict[str, Any]) -> str:
    registry = status["coordinator"]
    images = [("checkpoint", c["id"]) for c in registry["checkpoints"]]
    images += [("savepoint", s["id"]) for s in registry["savepoints"]]
    kind, number = max(images, key=lambda image: image[1])
    return f"{kind}:{number}"


def _damage_the_newest_while_it_is_checked(cluster: LocalCluster, work: Path) -> str:
    """Answer each check the hook holds: the first one (an older image must stay) and any
    not of the newest image are skipped (no verdict); the newest one's driver is killed,
    then it is damaged."""
    answered: set[str] = set()
    while True:
        waiting = cluster.wait_for(
            "a check pod holding its check",
            lambda: [
                p.name.removeprefix("checking-")
                for p in work.glob("checking-*")
                if p.name.removeprefix("checking-") not in answered
            ],
            timeout=180,
            job=NAME,
        )
        for image in waiting:
            answered.add(image)
            status = cluster.status(NAME)
            if len(answered) == 1 or _newest(status) != image:
                (work / f"answer-{image}").write_text("skip")
                continue
            driver = objects.driver_pod_name(NAME, status["jobAttempt"])
            cluster.crash_driver(driver)
            time.sleep(1.0)  # anything the operator was registering is in its status now
            assert _newest(cluster.status(NAME)) == image, "newest when its driver was killed"
            (work / f"answer-{image}").write_text("damage")
            return image


def test_an_image_found_unrestorable_on_kubernetes_is_recorded_and_skipped(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    generate(work / "input", files=16, lines=150, seed=11)
    with LocalCluster(tmp_path / "cluster") as cluster:
        cluster.apply(_job(work))
        damaged = _damage_the_newest_while_it_is_checked(cluster, work)
        # A check that ends without a verdict says why, from the pod's log.
        skipped = cluster.wait_for_event(NAME, "RestorableCheckSkipped")
        assert re.search(r"exit code 3 \(Error\): check hook: \w+:\d+ skipped$", skipped["message"])

        def recorded() -> list[dict[str, Any]]:
            return list(cluster.status(NAME).get("unrestorable", []))

        (entry,) = cluster.wait_for("the verdict in the status", recorded, timeout=120, job=NAME)
        assert entry["source"] == damaged
        assert entry["reason"].startswith("the restorable check after it completed found: state")
        assert "CANNOT_LOAD_STATE_STORE" in entry["reason"], "Spark's reason"
        event = cluster.wait_for_event(NAME, "ImageUnrestorable", containing=damaged)
        assert "restores skip it" in event["message"]

        # The restart waited for the verdict: the restore starts from an older image.
        started = cluster.wait_for_event(NAME, "DriverStarting", containing="restoring from")
        source = re.search(r"restoring from (\w+:\d+)", started["message"])
        assert source, started["message"]
        assert int(source[1].split(":")[1]) < int(damaged.split(":")[1]), "the damaged one skipped"
        assert cluster.status(NAME)["counts"]["failedRestores"] == 0, "no restore tried on it"
