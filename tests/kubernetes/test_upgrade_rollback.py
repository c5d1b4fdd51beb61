"""spec.rollback with the operator (a real process) against the emulated API server and
simulated drivers: an upgrade whose driver does not run is rolled back to the last stable
spec, which runs until the spec changes."""

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.doc_blocks import marked_blocks
from helpers.kube.cluster import JOBS, NAMESPACE, LocalCluster, operator_stopped
from helpers.kube.simulated import SimulatedAgents
from helpers.kube.simulated_jobs import completed, in_phase, job
from spark_checkpoint_operator.kubernetes import objects, rollback

pytestmark = pytest.mark.timeout(240)

MISSING = "example/orders:missing"
UNCOORDINATED = "example/orders:uncoordinated"
UNREADING = "example/orders:zstd-state"


def agents(cleanup_seconds: float = 0.0, exit_seconds: float = 0.0) -> SimulatedAgents:
    return SimulatedAgents(
        batch_seconds=0.3,
        exit_seconds=exit_seconds,
        missing_images=frozenset({MISSING}),
        uncoordinated_images=frozenset({UNCOORDINATED}),
        unreading_images=frozenset({UNREADING}),
        cleanup_seconds=cleanup_seconds,
    )


def driver_images(cluster: LocalCluster) -> list[str]:
    return [p["spec"]["containers"][0]["image"] for p in cluster.pods("orders", component="driver")]


def stable_image(cluster: LocalCluster) -> str:
    job_object = cluster.job("orders")
    assert job_object is not None
    annotations = job_object["metadata"].get("annotations") or {}
    kept = annotations.get(objects.ANNOTATION_STABLE_SPEC)
    return "" if kept is None else str(json.loads(kept)["image"])


def committing(cluster: LocalCluster) -> dict[str, Any]:
    """The status once the job's current attempt committed a batch past its image (Running
    comes earlier: a restored query runs its first trigger without new data)."""
    status: dict[str, Any] = cluster.wait_for(
        "the current attempt's query committing",
        lambda: (
            (s := cluster.status("orders")).get("lastCommittingAttempt") == s.get("jobAttempt")
            and s
        ),
        job="orders",
    )
    return status


def rolled_back_and_running(cluster: LocalCluster, image: str = "example/orders:1") -> dict:
    """The job runs its stable spec's driver again, restored from the upgrade's savepoint."""
    status = cluster.wait_for(
        "the stable spec's driver running",
        lambda: (
            (s := cluster.status("orders")).get("phase") == "Running"
            and s.get("rolledBack")
            and driver_images(cluster) == [image]
            and (s.get("restoredFrom") or {}).get("source", "").startswith("savepoint:")
            and s
        ),
        job="orders",
    )
    assert status["lastSavepoint"]["label"] == "upgrade"
    return status


def ran_then_upgraded(cluster: LocalCluster, image: str, **spec: Any) -> None:
    """The job ran its first spec (kept as its last stable spec), then was changed to
    ``image``, whose driver pod is there."""
    cluster.apply(job(**spec))
    completed(cluster, "orders", 1)
    cluster.wait_for("the stable spec kept", lambda: stable_image(cluster) == "example/orders:1")
    cluster.patch_spec("orders", {"image": image})
    cluster.wait_for("the new driver", lambda: driver_images(cluster) == [image])


def ran_then_asked_an_upgrade(
    cluster: LocalCluster,
    simulated: SimulatedAgents,
    image: str,
    *,
    savepoint_seconds: float,
    timeout: str,
) -> None:
    """The job ran its first spec, then was changed to ``image``, whose upgrade's savepoint
    (as every checkpoint from then on) takes ``savepoint_seconds``; it is being taken."""
    cluster.apply(job(rollback={"enabled": True, "readinessTimeout": timeout}))
    completed(cluster, "orders", 1)
    cluster.wait_for("the stable spec kept", lambda: stable_image(cluster) == "example/orders:1")
    for agent in list(simulated.agents.values()):
        agent.ack_delay = (savepoint_seconds, savepoint_seconds)
    cluster.patch_spec("orders", {"image": image})
    cluster.wait_for("the upgrade asked for", lambda: cluster.status("orders").get("upgrade"))


def running_image(cluster: LocalCluster, image: str, timeout: float = 60) -> dict[str, Any]:
    """The job runs a driver of ``image`` (phase Running); its status then."""
    status: dict[str, Any] = cluster.wait_for(
        f"a driver of {image} running",
        lambda: (
            (s := cluster.status("orders")).get("phase") == "Running"
            and driver_images(cluster) == [image]
            and s
        ),
        job="orders",
        timeout=timeout,
    )
    return status


def timeout_started(cluster: LocalCluster) -> None:
    cluster.wait_for(
        "the upgrade's timeout started",
        lambda: (cluster.status("orders").get("upgrade") or {}).get("started"),
    )


def not_rolled_back(cluster: LocalCluster, waited: float) -> None:
    """Long past the readiness timeout, the new driver's pod still waits for its image."""
    time.sleep(waited)
    assert cluster.status("orders")["phase"] == "Deploying"
    assert driver_images(cluster) == [MISSING]
    assert "RolledBack" not in cluster.event_reasons("orders")


def test_an_upgrade_whose_image_cannot_be_pulled_is_rolled_back_until_the_spec_changes(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "3s"})
        timeout_started(cluster)
        event = cluster.wait_for_event("orders", "RolledBack")
        assert event["type"] == "Warning"
        # ErrImagePull first, then ImagePullBackOff: which one the timeout sees depends on load.
        assert re.match(
            "spec generation 2 is rolled back to the last stable spec: its driver did not run "
            r"its query within spec.rollback.readinessTimeout \(3s\): the driver cannot start "
            "yet: (ErrImagePull|ImagePullBackOff)",
            event["message"],
        ), event["message"]
        status = rolled_back_and_running(cluster)
        assert status["rolledBack"]["generation"] == 2
        assert "upgrade" not in status
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "RolledBack")
        assert ready["message"].startswith("spec generation 2 was rolled back (its driver did")
        job_object = cluster.job("orders")
        assert job_object is not None and job_object["spec"]["image"] == MISSING
        assert stable_image(cluster) == "example/orders:1"
        completed(cluster, "orders", status["counts"]["completed"] + 1)

        # The next change of the spec is an upgrade again; once it runs, it is stable.
        cluster.patch_spec("orders", {"image": "example/orders:3"})
        running_image(cluster, "example/orders:3")
        cluster.wait_for("image 3 stable", lambda: stable_image(cluster) == "example/orders:3")
        status = cluster.status("orders")
        assert "rolledBack" not in status and "upgrade" not in status
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", ready
        assert cluster.event_reasons("orders").count("RolledBack") == 1


def test_the_documented_rollback_rolls_back_a_driver_that_fails_for_good(
    tmp_path: Path,
) -> None:
    """docs/operator.md's example, as written. The upgrade's agent never answers (a pipeline
    without run_coordinated): the job fails, and is rolled back then, long before its
    readiness timeout."""
    (block,) = marked_blocks(
        "tests/kubernetes/test_upgrade_rollback.py::"
        "test_the_documented_rollback_rolls_back_a_driver_that_fails_for_good"
    )
    documented = yaml.safe_load(block.text)["spec"]["rollback"]
    assert documented == {"enabled": True, "readinessTimeout": "5m"}
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        policy = {"type": "OnFailure", "backoff": "1s", "startTimeout": "2s"}
        ran_then_upgraded(cluster, UNCOORDINATED, restartPolicy=policy, rollback=documented)

        event = cluster.wait_for_event("orders", "RolledBack")
        assert event["message"].startswith(
            "spec generation 2 is rolled back to the last stable spec: the job failed: the "
            "driver's checkpoint agent never answered in 2s"
        ), event["message"]
        rolled_back_and_running(cluster)
        assert "AgentNeverAnswered" in cluster.event_reasons("orders")
        retried = cluster.wait_for_event("orders", "JobRetried")
        assert retried["message"] == (
            "the job failed: it runs again, rolled back to the last stable spec"
        )


def test_without_rollback_an_upgrade_that_does_not_run_waits_for_the_next_change(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        # The stable spec is kept all the same: rollback turned on later rolls the next
        # upgrade back.
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": False, "readinessTimeout": "1s"})
        not_rolled_back(cluster, waited=3)


def test_an_upgrade_suspended_before_it_ran_is_not_rolled_back_when_it_resumes(
    tmp_path: Path,
) -> None:
    """As in Flink: a job suspended meanwhile is never rolled back to running."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "8s"})

        cluster.patch_spec("orders", {"state": "Suspended"})
        status = in_phase(cluster, "orders", "Suspended")
        assert "upgrade" not in status
        time.sleep(9)
        cluster.patch_spec("orders", {"state": "Running"})

        cluster.wait_for(
            "the new driver waiting again", lambda: driver_images(cluster) == [MISSING]
        )
        not_rolled_back(cluster, waited=9)


def test_a_rollback_outlives_operator_restarts_in_its_timeout_and_after_it(
    tmp_path: Path,
) -> None:
    """The timeout's start is in status, the stable spec in the job's annotation: an operator
    that was down rolls back when the timeout is over, and the next adopts the stable spec's
    driver (no upgrade to the spec rolled back from)."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "4s"})
        timeout_started(cluster)
        with operator_stopped(cluster):
            time.sleep(5)

        rolled_back_and_running(cluster)
        attempt = cluster.status("orders")["jobAttempt"]
        with operator_stopped(cluster):
            pass
        completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)
        status = cluster.status("orders")
        assert status["jobAttempt"] == attempt, "the stable spec's driver was adopted"
        assert driver_images(cluster) == ["example/orders:1"]
        assert status["rolledBack"]["generation"] == 2
        assert cluster.event_reasons("orders").count("RolledBack") == 1


def test_rollback_turned_off_in_the_timeout_rolls_back_only_once_turned_on_again(
    tmp_path: Path,
) -> None:
    """The upgrade's timeout is kept whether rollback is on or not: turned on after it ran
    out, the upgrade that did not run is rolled back at once."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "8s"})
        timeout_started(cluster)

        cluster.patch_spec("orders", {"rollback": {"enabled": False}})
        not_rolled_back(cluster, waited=9)

        cluster.patch_spec("orders", {"rollback": {"enabled": True}})
        rolled_back_and_running(cluster)


def test_a_stable_spec_the_operator_no_longer_accepts_ends_the_rollback(tmp_path: Path) -> None:
    """As after an operator upgrade that tightened a rule the stable spec breaks (here its
    annotation, edited while no operator ran, lacks the image a cluster needs): said, and
    the spec runs as written."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "3s"})
        rolled_back_and_running(cluster)

        with operator_stopped(cluster):
            job_object = cluster.job("orders")
            assert job_object is not None
            stable = json.loads(
                job_object["metadata"]["annotations"][objects.ANNOTATION_STABLE_SPEC]
            )
            del stable["image"]
            annotations = {objects.ANNOTATION_STABLE_SPEC: json.dumps(stable)}
            cluster.api.patch(JOBS, NAMESPACE, "orders", {"metadata": {"annotations": annotations}})

        event = cluster.wait_for_event("orders", "RollbackEnded")
        assert event["message"] == (
            "the last stable spec cannot run any more, so the spec runs as written: spec.image: "
            "required on a cluster (the driver's container image)"
        ), event["message"]
        cluster.wait_for("the spec as written", lambda: driver_images(cluster) == [MISSING])
        status = cluster.status("orders")
        assert "rolledBack" not in status


def test_a_fix_applied_while_no_operator_ran_gets_a_timeout_of_its_own(tmp_path: Path) -> None:
    """The timeout is its deployment's: the next change, made while the operator was down
    and the earlier one's timeout ran out, is tried (not rolled back at once)."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "6s"})
        timeout_started(cluster)
        with operator_stopped(cluster):
            cluster.patch_spec("orders", {"image": "example/orders:3"})
            time.sleep(7)

        running_image(cluster, "example/orders:3")
        cluster.wait_for("the fix stable", lambda: stable_image(cluster) == "example/orders:3")
        assert "RolledBack" not in cluster.event_reasons("orders")


def test_a_redeploy_of_a_rolled_back_job_redeploys_the_stable_spec(tmp_path: Path) -> None:
    """restore is followed, as the state and the trigger nonces are: the stable spec's
    driver restores the named image, and the job stays rolled back."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "3s"})
        status = rolled_back_and_running(cluster)
        upgrades = status["lastSavepoint"]
        completed(cluster, "orders", status["counts"]["completed"] + 1)

        restore = {"initialSavepointPath": upgrades["path"], "savepointRedeployNonce": 1}
        cluster.patch_spec("orders", {"restore": restore})

        status = cluster.wait_for(
            "the redeploy restored",
            lambda: (
                (s := cluster.status("orders"))
                .get("handledTriggers", {})
                .get("savepointRedeployNonce")
                == 1
                and s.get("phase") == "Running"
                and s
            ),
            job="orders",
        )
        assert status["restoredFrom"]["source"] == f"savepoint:{upgrades['id']}"
        assert driver_images(cluster) == ["example/orders:1"]
        assert status["rolledBack"]["generation"] == 2
        assert "Redeploying" in cluster.event_reasons("orders")


@pytest.mark.timeout(300)
def test_an_upgrade_suspended_while_its_savepoint_is_taken_is_not_rolled_back(
    tmp_path: Path,
) -> None:
    """Suspended before its first driver started: no timeout starts when it resumes, also
    when it resumes before the suspension's cleanup is done (the old driver's supervisor
    still ends: the resume is no upgrade of a running driver)."""
    simulated = agents(cleanup_seconds=6)
    with LocalCluster(tmp_path, simulated=simulated) as cluster:
        ran_then_asked_an_upgrade(cluster, simulated, MISSING, savepoint_seconds=4, timeout="8s")
        cluster.patch_spec("orders", {"state": "Suspended"})
        status = in_phase(cluster, "orders", "Suspended")
        assert "upgrade" not in status
        cluster.patch_spec("orders", {"state": "Running"})

        cluster.wait_for("the new driver", lambda: driver_images(cluster) == [MISSING])
        not_rolled_back(cluster, waited=9)


@pytest.mark.timeout(300)
def test_a_second_change_while_the_stable_driver_stops_gets_the_timeout(tmp_path: Path) -> None:
    """Changed again after the first upgrade's savepoint, while the stable driver exits: the
    driver that starts runs the second change, and its readiness timeout starts with it."""
    simulated = agents(exit_seconds=6)
    with LocalCluster(tmp_path, simulated=simulated) as cluster:
        ran_then_asked_an_upgrade(
            cluster, simulated, "example/orders:2", savepoint_seconds=1, timeout="3s"
        )
        in_phase(cluster, "orders", "Suspending")
        cluster.patch_spec("orders", {"image": MISSING})

        cluster.wait_for("the new driver", lambda: driver_images(cluster) == [MISSING])
        timeout_started(cluster)
        rolled_back_and_running(cluster)
        assert stable_image(cluster) == "example/orders:1"


def test_a_status_written_by_hand_chooses_no_rollback(tmp_path: Path) -> None:
    """status.rolledBack and status.upgrade are copies: the annotation is acted on, which
    only who may write the spec may write."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "1h"})
        timeout_started(cluster)
        job_object = cluster.job("orders")
        assert job_object is not None
        forged = {
            "rolledBack": {
                "generation": 2,
                "specHash": rollback.rolled_back_hash(job_object["spec"]),
                "time": "2026-01-01T00:00:00Z",
                "reason": "forged",
            },
            "upgrade": {"deploymentHash": "forged", "started": "2020-01-01T00:00:00Z"},
        }
        with operator_stopped(cluster):
            cluster.api.patch(JOBS, NAMESPACE, "orders", {"status": forged}, subresource="status")

        cluster.wait_for(
            "the status written again",
            lambda: (
                (cluster.status("orders").get("upgrade") or {}).get("deploymentHash")
                not in (None, "forged")
            ),
        )
        not_rolled_back_yet = cluster.status("orders")
        assert "rolledBack" not in not_rolled_back_yet
        time.sleep(3)
        assert driver_images(cluster) == [MISSING]
        assert "RolledBack" not in cluster.event_reasons("orders")


@pytest.mark.timeout(300)
def test_an_operator_restart_during_the_upgrades_savepoint_starts_no_timeout(
    tmp_path: Path,
) -> None:
    """The restarted operator adopts the old driver, still taking the upgrade's savepoint:
    the timeout starts with the new driver, however long the savepoint takes."""
    simulated = agents()
    with LocalCluster(tmp_path, simulated=simulated) as cluster:
        # A good release.
        ran_then_asked_an_upgrade(
            cluster, simulated, "example/orders:2", savepoint_seconds=8, timeout="5s"
        )
        with operator_stopped(cluster):
            pass

        running_image(cluster, "example/orders:2", timeout=90)
        cluster.wait_for("image 2 stable", lambda: stable_image(cluster) == "example/orders:2")
        assert "RolledBack" not in cluster.event_reasons("orders")


def test_annotations_taken_out_by_someone_else_are_written_again(tmp_path: Path) -> None:
    """As a replace (kubectl replace, Argo CD's Replace=true) does: they are what an
    operator restart goes on from."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        ran_then_upgraded(cluster, MISSING, rollback={"enabled": True, "readinessTimeout": "3s"})
        rolled_back_and_running(cluster)

        gone = {objects.ANNOTATION_STABLE_SPEC: None, objects.ANNOTATION_ROLLBACK: None}
        cluster.api.patch(JOBS, NAMESPACE, "orders", {"metadata": {"annotations": gone}})

        cluster.wait_for(
            "the stable spec again", lambda: stable_image(cluster) == "example/orders:1"
        )
        with operator_stopped(cluster):
            pass
        completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)
        assert driver_images(cluster) == ["example/orders:1"]
        assert cluster.status("orders")["rolledBack"]["generation"] == 2


def test_a_failed_upgrade_without_a_savepoint_keeps_the_checkpoints_it_rolls_back_to(
    tmp_path: Path,
) -> None:
    """NeverRetainAfterTermination discards the checkpoints of a job that fails; an upgrade
    that may be rolled back keeps them (without a savepoint they are all there is)."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        policy = {"type": "OnFailure", "backoff": "1s", "startTimeout": "2s"}
        ran_then_upgraded(
            cluster,
            UNCOORDINATED,
            restartPolicy=policy,
            rollback={"enabled": True, "readinessTimeout": "5m"},
            shutdown={"finalSavepoint": False},
            checkpointing={"retentionPolicy": "NeverRetainAfterTermination"},
        )

        cluster.wait_for_event("orders", "RolledBack")
        status = cluster.wait_for(
            "the stable spec restored",
            lambda: (
                (s := cluster.status("orders")).get("phase") == "Running"
                and driver_images(cluster) == ["example/orders:1"]
                and s.get("restoredFrom")
                and s
            ),
            job="orders",
        )
        assert status["restoredFrom"]["source"].startswith("checkpoint:"), status["restoredFrom"]


def test_a_stable_spec_the_annotations_have_no_room_for_is_said_once(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        body = job(rollback={"enabled": True, "readinessTimeout": "1m"})
        body["spec"]["application"]["sparkConf"]["spark.big"] = "x" * (60 << 10)
        body["metadata"]["annotations"] = {"example.com/user": "y" * (200 << 10)}
        cluster.apply(body)
        completed(cluster, "orders", 4)

        event = cluster.wait_for_event("orders", "RollbackUnavailable")
        assert "have no room for it" in event["message"]
        completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 3)
        job_object = cluster.job("orders")
        assert job_object is not None
        assert objects.ANNOTATION_STABLE_SPEC not in job_object["metadata"]["annotations"]
        assert cluster.event_reasons("orders").count("RollbackUnavailable") == 1
        log = cluster.operator.log_path.read_text(errors="replace")
        assert "rollback annotations were not written" not in log


def test_images_an_upgrade_could_not_read_are_restored_by_the_spec_rolled_back_to(
    tmp_path: Path,
) -> None:
    """An upgrade whose driver cannot read the job's state (another compression codec)
    fails on each image in turn, on another file each time, and marks each unrestorable;
    the stable spec reads them: rolled back, it restores the upgrade's savepoint (the marks
    were the upgrade's, not the images')."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        cluster.apply(job(rollback={"enabled": True, "readinessTimeout": "5m"}))
        completed(cluster, "orders", 1)
        cluster.wait_for(
            "the stable spec kept", lambda: stable_image(cluster) == "example/orders:1"
        )
        cluster.patch_spec("orders", {"image": UNREADING})

        event = cluster.wait_for_event("orders", "RolledBack")
        assert "no restorable image left" in event["message"], event["message"]
        assert "RestoreFailed" in cluster.event_reasons("orders")
        rolled_back_and_running(cluster)
        status = committing(cluster)
        assert not status.get("unrestorable"), status["unrestorable"]
        assert not any(s.get("unrestorable") for s in status["savepointHistory"])


def failed_on_every_image(cluster: LocalCluster) -> dict[str, Any]:
    """The job ran (its query committed a batch), then was changed to an image whose
    driver cannot read its state: it failed with no restorable image left; its status."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    cluster.wait_for("Running", lambda: cluster.status("orders").get("lastCommittingAttempt"))
    cluster.patch_spec("orders", {"image": UNREADING})
    failed: dict[str, Any] = in_phase(cluster, "orders", "Failed")
    assert failed["message"].startswith("no restorable image left: savepoint:"), failed
    return failed


def test_images_a_failed_upgrade_could_not_read_are_restored_once_it_is_changed_back(
    tmp_path: Path,
) -> None:
    """Without rollback (the default), the same upgrade fails with no image left; the
    image changed back is another deployment, which restores the upgrade's savepoint."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        failed = failed_on_every_image(cluster)
        assert failed["lastCommittingAttempt"] == 1

        cluster.patch_spec("orders", {"image": "example/orders:1"})
        status = running_image(cluster, "example/orders:1")
        assert status["restoredFrom"]["source"] == failed["unrestorable"][0]["source"]
        again = cluster.wait_for_event("orders", "RestorableAgain")
        assert again["message"].endswith(
            ": " + ", ".join(entry["source"] for entry in failed["unrestorable"])
        ), again["message"]
        committed = committing(cluster)
        assert not committed.get("unrestorable"), committed["unrestorable"]


def test_a_failed_jobs_images_stay_unrestorable_when_it_runs_again_under_the_same_deployment(
    tmp_path: Path,
) -> None:
    """A change beyond the deployment (checkpoint settings) runs a Failed job again, under
    the spec whose drivers could not read its images: they stay unrestorable, and the job
    fails again at once, without a driver that would fail on each again."""
    with LocalCluster(tmp_path, simulated=agents()) as cluster:
        failed = failed_on_every_image(cluster)
        started = cluster.event_reasons("orders").count("DriverStarting")

        cluster.patch_spec("orders", {"checkpointing": {"interval": "2s"}})
        cluster.wait_for_event("orders", "JobRetried")
        again = cluster.wait_for(
            "failed again",
            lambda: (
                cluster.event_reasons("orders").count("JobFailed") == 2
                and (s := cluster.status("orders")).get("phase") == "Failed"
                and s
            ),
            job="orders",
        )
        assert again["message"].startswith("no restorable image left: savepoint:"), again
        assert again["unrestorable"] == failed["unrestorable"]
        assert again["jobAttempt"] == failed["jobAttempt"]
        assert cluster.event_reasons("orders").count("DriverStarting") == started
        assert "RestorableAgain" not in cluster.event_reasons("orders")
