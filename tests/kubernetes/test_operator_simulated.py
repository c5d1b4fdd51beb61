"""The operator (a real ``spark-checkpoint-operator`` process) against the emulated API server, with
simulated drivers: its control flow, fast and without Spark. tests/e2e/ runs the same
operator with real Spark drivers."""

import asyncio
import base64
import contextlib
import copy
import hashlib
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import kmock
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.kube.cluster import (
    JOBS,
    NAMESPACE,
    OPERATOR_NAMESPACE,
    OPERATOR_SERVICE_ACCOUNT,
    SECRETS,
    LocalCluster,
    OperatorProcess,
    operator_stopped,
    refused_requests,
)
from helpers.kube.emulator import PODS, SPARK_CHECKPOINT_JOBS_CRD
from helpers.kube.simulated import SimulatedAgents
from helpers.kube.simulated_jobs import completed, in_phase, job, savepoint_by_nonce
from spark_checkpoint.janitor_commands import DiscardCheckpoint, VerifyRestorable
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.events import BURST
from spark_checkpoint_operator.kubernetes.handlers import LEASE_SECONDS_VARIABLE, USER_IDS_VARIABLE
from spark_checkpoint_operator.kubernetes.lease import MIN_LEASE_SECONDS

pytestmark = pytest.mark.timeout(240)
LEASES = "coordination.k8s.io/v1/leases"


SECRET_KEY_REF = {"name": "s3", "key": "secret-key"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path, simulated=SimulatedAgents(batch_seconds=0.3)) as running:
        yield running


def test_checkpoints_complete_and_appear_in_status(tmp_path: Path) -> None:
    """Its driver finds savepoints up to 250 in the job's storage, which a job of the same
    name deleted before kept: this job's ids continue above them, persisted."""
    agents = SimulatedAgents(batch_seconds=0.3, highest_stored_id=250)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())
        status = completed(cluster, "orders", 3)
        job_object = cluster.job("orders")
        driver_pods = cluster.driver_pods("orders")

    assert status["phase"] == "Running"
    assert status["lastCheckpoint"]["id"] > 250
    assert status["coordinator"]["nextCheckpointId"] > status["lastCheckpoint"]["id"]
    assert status["driver"] == {"ready": 1, "expected": 1}
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "True", "CheckpointsHealthy": "True", "SpecValid": "True"}
    assert job_object is not None
    assert status["observedGeneration"] == job_object["metadata"]["generation"]
    assert "orders" not in str(job_object.get("spec", {}).get("status", ""))
    assert driver_pods == ["orders-driver-1"]


def test_failing_checkpoints_appear_in_status_before_any_completes(tmp_path: Path) -> None:
    """Status was written only when a checkpoint completed: checkpoints that kept
    expiring left counts.failed 0 and CheckpointsHealthy True (a hostile-input tester)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(3.0, 4.0))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"timeout": "1s", "tolerableFailures": 100}))

        status = cluster.wait_for(
            "two failed checkpoints in status",
            lambda: (s := cluster.status("orders")).get("counts", {}).get("failed", 0) >= 2 and s,
            job="orders",
        )

    assert status["counts"]["completed"] == 0
    assert status["consecutiveFailures"] >= 2
    assert [h["status"] for h in status["history"][:2]] == ["Failed", "Failed"], status
    healthy = next(c for c in status["conditions"] if c["type"] == "CheckpointsHealthy")
    assert healthy["status"] == "False", healthy


def test_checkpoints_failing_every_few_milliseconds_post_a_burst_of_events_not_a_flood(
    tmp_path: Path,
) -> None:
    """Kopf posts each event as an Event object of its own: checkpoints failing 10 times a
    second posted 10 objects a second into the cluster's etcd (a hostile-input tester)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(3.0, 4.0))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        checkpointing = {"interval": "10ms", "timeout": "10ms", "tolerableFailures": 100000}
        cluster.apply(job(checkpointing=checkpointing))
        cluster.wait_for(
            "failed checkpoints, three bursts' worth",
            lambda: cluster.status("orders").get("counts", {}).get("failed", 0) >= 3 * BURST,
            job="orders",
        )
        time.sleep(1.0)  # Kopf posts from a queue
        reasons = cluster.event_reasons("orders")

    assert reasons.count("CheckpointFailed") == BURST, reasons


def test_the_operator_serves_prometheus_metrics_per_job(cluster: LocalCluster) -> None:
    cluster.apply(job())
    status = completed(cluster, "orders", 3)

    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(
            urllib.request.urlopen(cluster.operator.metrics_url, timeout=5).read().decode()
        )
        for sample in family.samples
    }

    job_labels = (("job_name", "orders"), ("job_namespace", "default"))
    completed_checkpoints = samples[
        (
            "spark_checkpoint_checkpoints_total",
            tuple(sorted((*job_labels, ("kind", "checkpoint"), ("outcome", "completed")))),
        )
    ]
    assert completed_checkpoints >= status["counts"]["completed"] - 1
    durations = samples[
        (
            "spark_checkpoint_duration_seconds_count",
            tuple(sorted((*job_labels, ("kind", "checkpoint")))),
        )
    ]
    assert durations == completed_checkpoints
    assert samples[("spark_checkpoint_trigger_lateness_seconds_count", job_labels)] >= 3
    last = samples[
        (
            "spark_checkpoint_last_completion_timestamp_seconds",
            tuple(sorted((*job_labels, ("kind", "checkpoint")))),
        )
    ]
    assert abs(last - time.time()) < 60


def test_a_crashed_driver_restarts_from_the_latest_checkpoint(cluster: LocalCluster) -> None:
    cluster.apply(job())
    completed(cluster, "orders", 2)

    cluster.crash_driver("orders-driver-1")

    status = cluster.wait_for(
        "a restored second attempt",
        lambda: (s := cluster.status("orders")).get("counts", {}).get("restored") and s,
        job="orders",
    )
    assert status["jobAttempt"] == 2
    assert status["restoredFrom"]["source"].startswith("checkpoint:")
    cluster.wait_for(
        "the first driver gone", lambda: cluster.driver_pods("orders") == ["orders-driver-2"]
    )
    cluster.wait_for_event("orders", "DriverFailed")


def test_a_crashed_driver_a_finalizer_holds_is_told_and_replaced_only_once_it_is_gone(
    cluster: LocalCluster,
) -> None:
    """A finalizer another controller added to the driver pod (a backup tool's) keeps the
    crashed driver's pod: the next driver waits for it (never two on one checkpoint
    location), and an event says what it waits for."""
    held_by = "backup.example.com/snapshot"
    cluster.apply(job())
    completed(cluster, "orders", 1)
    cluster.api.patch(PODS, "default", "orders-driver-1", {"metadata": {"finalizers": [held_by]}})

    cluster.crash_driver("orders-driver-1")

    event = cluster.wait_for_event("orders", "PodStuckTerminating", timeout=90)
    assert "pod orders-driver-1 is still there" in event["message"]
    assert f"finalizers {held_by} hold it" in event["message"]
    assert event["type"] == "Warning"
    assert cluster.driver_pods("orders") == ["orders-driver-1"], "no second driver meanwhile"
    cluster.api.patch(PODS, "default", "orders-driver-1", {"metadata": {"finalizers": None}})
    cluster.wait_for(
        "a restored second attempt",
        lambda: (s := cluster.status("orders")).get("counts", {}).get("restored") and s,
        job="orders",
    )
    assert cluster.driver_pods("orders") == ["orders-driver-2"]
    assert cluster.event_reasons("orders").count("PodStuckTerminating") == 1


def test_a_pipeline_without_run_coordinated_fails_the_job_after_the_start_timeout(
    tmp_path: Path,
) -> None:
    """Its driver pod runs and its query would run without checkpoints: no agent answers."""
    agents = SimulatedAgents(uncoordinated_images=frozenset({"example/uncoordinated:1"}))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        policy = {"type": "OnFailure", "backoff": "1s", "startTimeout": "2s"}
        cluster.apply(job(image="example/uncoordinated:1", restartPolicy=policy))

        failed = in_phase(cluster, "orders", "Failed")
        assert failed["message"] == (
            "the driver's checkpoint agent never answered in 2s after the driver started "
            "(restartPolicy.startTimeout): does the pipeline reach run_coordinated(writer, "
            "participants=[...])? (If the code before it, or Spark's start, is slow rather "
            "than stuck: raise startTimeout.)"
        )
        assert failed["jobAttempt"] == 1, "not retried: the next driver would do the same"
        assert "AgentNeverAnswered" in cluster.event_reasons("orders")
        cluster.wait_for("the driver gone", lambda: cluster.driver_pods("orders") == [])


def test_a_restore_longer_than_the_start_timeout_is_not_taken_for_a_missing_agent(
    tmp_path: Path,
) -> None:
    """A restored driver restores for 6 s (its agent answers "starting") against a start
    timeout of 1 s: it is not failed; its restore is recorded once the query started, also
    by an operator restarted while the driver restores."""
    agents = SimulatedAgents(batch_seconds=0.3, starting_seconds=6.0)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        policy = {"type": "OnFailure", "backoff": "100ms", "startTimeout": "1s"}
        cluster.apply(job(restartPolicy=policy))
        completed(cluster, "orders", 2)
        cluster.crash_driver("orders-driver-1", exit_code=1)
        second = cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
        deploying = in_phase(cluster, "orders", "Deploying")
        assert deploying["jobAttempt"] == 2
        assert deploying.get("restoredFrom") is None, "attempt 1's restore is not attempt 2's"

        with operator_stopped(cluster):  # the driver restores meanwhile
            time.sleep(1)
        running = in_phase(cluster, "orders", "Running")
        assert running["jobAttempt"] == 2
        assert running["restoredFrom"]["source"] == second.restored_from
        assert "AgentNeverAnswered" not in cluster.event_reasons("orders")
        restored = cluster.wait_for_event("orders", "Restored")
        assert restored["message"] == f"restored from {second.restored_from}"
        assert cluster.wait_for(
            "the restore counted", lambda: cluster.status("orders")["counts"]["restored"] == 1
        )


def test_a_driver_adopted_while_it_restored_falls_back_when_its_image_is_unusable(
    tmp_path: Path,
) -> None:
    """The operator restarts while the second driver restores (its agent answers
    "starting": no restore recorded); the driver then exits RESTORE_UNUSABLE. The adopted
    driver's image is the first its pod was to restore from: the next driver falls back."""
    agents = SimulatedAgents(batch_seconds=0.3, starting_seconds=20.0)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(restartPolicy={"type": "OnFailure", "maxRetries": 1, "backoff": "100ms"}))
        completed(cluster, "orders", 2)
        registered = sorted(c["id"] for c in cluster.status("orders")["coordinator"]["checkpoints"])
        newest, previous = f"checkpoint:{registered[-1]}", f"checkpoint:{registered[-2]}"
        cluster.crash_driver("orders-driver-1", exit_code=1)
        second = cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
        assert second.restored_from == newest

        with operator_stopped(cluster):
            pass
        cluster.wait_for_event(
            "orders", "DriverAdopted", "resumed with the driver of attempt 2, which has not ended"
        )
        cluster.crash_driver("orders-driver-2", exit_code=5)  # DriverExit.RESTORE_UNUSABLE

        third = cluster.wait_for("driver 3", lambda: cluster.simulated_agent("orders-driver-3"))
        assert third.restored_from == previous
        event = cluster.wait_for_event("orders", "RestoreFailed", f"{newest} cannot be restored")
        assert event["message"].endswith(f"falling back to {previous}")
        assert [e["source"] for e in cluster.status("orders")["unrestorable"]] == [newest]


def test_a_driver_cut_off_from_the_operator_is_restarted_after_the_heartbeat_timeout(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job(restartPolicy={"type": "OnFailure", "backoff": "1s"}))
    completed(cluster, "orders", 1)
    # Changed while the driver runs: it applies at once (the default is 60s).
    restart_policy = {"type": "OnFailure", "backoff": "1s", "heartbeatTimeout": "3s"}
    cluster.patch_spec("orders", {"restartPolicy": restart_policy})
    before = completed(cluster, "orders", 2)

    agent = cluster.simulated_agent("orders-driver-1")
    assert agent is not None
    agent.cut_off = True  # its pod stays Running

    event = cluster.wait_for_event("orders", "AgentStoppedAnswering", timeout=60)
    assert event["message"].startswith("the driver's checkpoint agent has not answered for")
    status = cluster.wait_for(
        "a restored second attempt",
        lambda: (s := cluster.status("orders")).get("counts", {}).get("restored") and s,
        job="orders",
    )
    kind, restored = status["restoredFrom"]["source"].split(":")
    assert kind == "checkpoint" and int(restored) >= before["lastCheckpoint"]["id"]
    cluster.wait_for(
        "the cut-off driver gone", lambda: cluster.driver_pods("orders") == ["orders-driver-2"]
    )


def test_a_driver_pod_deleted_while_the_operators_watch_was_down_is_replaced_at_once(
    cluster: LocalCluster,
) -> None:
    """The operator's pod watch is throttled (429) while the driver pod is deleted and the
    API server compacts its history: the watch resumes with 410 Gone and a new list, and
    no DELETED event ever comes. The operator showed the pod running and restarted only
    after the heartbeat timeout (10 minutes here); now its agent's silence has it ask the
    API server for the pod, finds it gone, and restarts at once."""
    policy = {"type": "OnFailure", "backoff": "1s", "heartbeatTimeout": "10m"}
    cluster.apply(job(restartPolicy=policy))
    completed(cluster, "orders", 1)
    watch_down = threading.Event()

    def operator_watching_pods(request: Any) -> bool:
        return (
            watch_down.is_set()
            and request.params.get("watch") == "true"
            and request.url.path.endswith("/pods")
            and request.headers.get("User-Agent", "").startswith("kopf/")
        )

    throttled = kmock.KubernetesError(429, "TooManyRequests", "throttled", {})
    cluster.api.call(lambda emulator: emulator[operator_watching_pods] << throttled)
    watch_down.set()
    cluster.api.call(lambda emulator: emulator.stop_watches())  # the simulated kubelet's too
    cluster.api.delete(PODS, "default", "orders-driver-1", grace_period_seconds=0)
    cluster.wait_for(
        "the kubelet to stop the deleted driver",
        lambda: cluster.simulated_agent("orders-driver-1") is None,
    )
    cluster.api.call(lambda emulator: emulator.compact())
    watch_down.clear()

    event = cluster.wait_for_event("orders", "DriverFailed", timeout=60)
    assert event["message"] == "driver failed (its pod was deleted); restart 1 in 1s"
    cluster.wait_for(
        "a second driver", lambda: cluster.driver_pods("orders") == ["orders-driver-2"]
    )
    completed(cluster, "orders", 2)
    assert "AgentStoppedAnswering" not in cluster.event_reasons("orders")


def test_a_driver_waiting_for_its_secret_is_told_and_starts_once_it_exists(
    cluster: LocalCluster,
) -> None:
    document = job()
    document["spec"]["application"]["env"] = [
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": SECRET_KEY_REF}}
    ]
    cluster.apply(document)

    event = cluster.wait_for_event("orders", "DriverNotStarting")
    told = 'the driver cannot start yet: CreateContainerConfigError: secret "s3" not found'
    assert event["type"] == "Warning" and event["message"] == told
    status = cluster.status("orders")
    assert (status["phase"], status["message"]) == ("Deploying", told)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["message"]) == ("False", told)

    secret = {"metadata": {"name": "s3"}, "stringData": {"secret-key": "not-a-real-key"}}
    cluster.api.create(SECRETS, secret, namespace="default")
    status = completed(cluster, "orders", 1)
    assert (status["phase"], status.get("message", "")) == ("Running", "")
    assert cluster.event_reasons("orders").count("DriverNotStarting") == 1


def test_quantities_written_as_numbers_reach_the_pods_as_the_api_server_takes_them(
    cluster: LocalCluster,
) -> None:
    """The API server takes `sizeLimit: 1`, a quantity, as a number; the client's typed pod
    took only text, so the job passed validation and failed when its driver was created."""
    volumes = [
        {"name": "scratch", "emptyDir": {"sizeLimit": 1073741824}},
        {
            "name": "limits",
            "downwardAPI": {
                "items": [
                    {
                        "path": "memory",
                        "resourceFieldRef": {"resource": "limits.memory", "divisor": 1},
                    }
                ]
            },
        },
        {
            "name": "ephemeral",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": 1.5}},
                    }
                }
            },
        },
    ]
    cluster.apply(job(driver={"volumes": volumes}))

    completed(cluster, "orders", 1)

    (pod,) = cluster.pods("orders", component="driver")
    created = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert created["scratch"]["emptyDir"] == {"sizeLimit": "1073741824"}
    item = created["limits"]["downwardAPI"]["items"][0]
    assert item["resourceFieldRef"]["divisor"] == "1"
    claim = created["ephemeral"]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"] == {"requests": {"storage": "1.5"}}


def test_an_image_that_cannot_be_pulled_is_told_until_the_image_changes(
    tmp_path: Path,
) -> None:
    """An upgrade to a missing image: the new driver's pod waits as its kubelet retries
    (told: ErrImagePull, then ImagePullBackOff), and the next image runs the job again from
    the upgrade's savepoint."""
    agents = SimulatedAgents(batch_seconds=0.3, missing_images=frozenset({"example/orders:2"}))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())
        completed(cluster, "orders", 1)

        cluster.patch_spec("orders", {"image": "example/orders:2"})
        told = (
            "the driver cannot start yet: ImagePullBackOff: "
            'Back-off pulling image "example/orders:2"'
        )
        status = cluster.wait_for(
            "told", lambda: (s := cluster.status("orders")).get("message") == told and s
        )
        assert status["phase"] == "Deploying"
        pulls = [
            e["message"] for e in cluster.events("orders") if e["reason"] == "DriverNotStarting"
        ]
        # The first failure is short-lived, as on a node: told if a poll saw it.
        first = (
            'the driver cannot start yet: ErrImagePull: failed to pull image "example/orders:2": '
            "not found"
        )
        assert sorted(pulls) in (sorted([first, told]), [told]), pulls

        cluster.patch_spec("orders", {"image": "example/orders:1"})
        status = cluster.wait_for(
            "restored from the upgrade's savepoint",
            lambda: (s := cluster.status("orders")).get("counts", {}).get("restored") and s,
            job="orders",
        )
        assert status["restoredFrom"]["source"].startswith("savepoint:")
        assert status.get("message", "") == ""
        completed(cluster, "orders", 2)
        # The stop's cleanup pods run the reverted image, which can be pulled.
        failed = [e["message"] for e in cluster.events("orders") if e["reason"] == "CleanupFailed"]
        assert failed == []
        assert agents.cleanups, "no cleanup pod ran: the assertion above proves nothing"


def test_cleanup_pods_whose_image_cannot_be_pulled_fail_at_once(tmp_path: Path) -> None:
    """A job deleted while its image cannot be pulled: its retention's cleanup pods (the
    same image) fail at once, not after their 600 s timeout each, and the deletion goes on
    (what they would have deleted is left, as the event says)."""
    agents = SimulatedAgents(batch_seconds=0.3, missing_images=frozenset({"example/orders:2"}))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"retentionPolicy": "NeverRetainAfterTermination"}))
        completed(cluster, "orders", 1)
        cluster.patch_spec("orders", {"image": "example/orders:2"})
        cluster.wait_for_event("orders", "DriverNotStarting")

        cluster.delete("orders")
        cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
        failed = [e["message"] for e in cluster.events("orders") if e["reason"] == "CleanupFailed"]
        assert any("discard-checkpoint" in message for message in failed), failed
        assert all("cannot start: ImagePullBackOff" in message for message in failed), failed


def test_discards_that_failed_as_the_job_ended_are_done_when_it_is_deleted(
    tmp_path: Path,
) -> None:
    """The retention of a job that ended ran in cleanup pods that failed (their image
    could not be pulled): the discards were said to fail and forgotten. They stay due, and
    the job's deletion does them."""
    agents = SimulatedAgents(batch_seconds=0.3, finish_after=12)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"retentionPolicy": "NeverRetainAfterTermination"}))
        in_phase(cluster, "orders", "Running")
        agents.missing_images = frozenset({"example/orders:1"})  # pulled by the driver already
        in_phase(cluster, "orders", "Finished")
        due = cluster.status("orders")["discardsDue"]
        assert due and {d["kind"] for d in due} == {"checkpoint"}, due
        assert agents.cleanups == []

        agents.missing_images = frozenset()
        cluster.delete("orders")
        cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
        discarded = {
            int(command[command.index(DiscardCheckpoint.NAME) + 1])
            for command in agents.cleanups
            if DiscardCheckpoint.NAME in command
        }
        assert {d["id"] for d in due} <= discarded, agents.cleanups


def test_verify_restorable_turned_on_for_a_running_job_checks_its_next_images(
    tmp_path: Path,
) -> None:
    """It calls for no new driver, and was read when the driver started only (a
    reviewer's): turned on, check pods check the images completed from then on."""
    agents = SimulatedAgents(batch_seconds=0.3)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())
        completed(cluster, "orders", 2)
        assert not any(VerifyRestorable.NAME in command for command in agents.cleanups)
        spec = {"checkpointing": {"verifyRestorable": True}}
        cluster.api.patch(JOBS, "default", "orders", {"spec": spec})

        cluster.wait_for(
            "a check pod",
            lambda: any(VerifyRestorable.NAME in command for command in agents.cleanups),
        )
        assert cluster.status("orders")["jobAttempt"] == 1, "the driver runs on"


def test_with_user_ids_from_the_platform_no_pod_of_the_operator_sets_an_id(
    tmp_path: Path,
) -> None:
    """SPARK_CHECKPOINT_USER_IDS=platform (the chart's `userIds`, for OpenShift's
    restricted-v2 SCC) reaches every pod the operator makes: drivers, the executors'
    template, check pods, cleanup pods."""
    agents = SimulatedAgents(batch_seconds=0.3, finish_after=8)
    with LocalCluster(tmp_path, simulated=agents, operator=False) as cluster:
        cluster.operator.settings[USER_IDS_VARIABLE] = "platform"
        cluster.operator.start()
        checkpointing = {"verifyRestorable": True, "retentionPolicy": "NeverRetainAfterTermination"}
        cluster.apply(job(checkpointing=checkpointing))
        in_phase(cluster, "orders", "Finished")
        cluster.wait_for(
            "a discard", lambda: any(DiscardCheckpoint.NAME in c for c in agents.cleanups)
        )

    started = {pod["spec"]["containers"][0]["name"]: pod for pod in agents.started}
    assert started.keys() == {"driver", objects.CHECK, objects.CLEANUP}, started.keys()
    driver = started["driver"]
    template = json.loads(driver["metadata"]["annotations"][objects.ANNOTATION_EXECUTOR_TEMPLATE])
    for name, pod in [*started.items(), ("executor template", template)]:
        context = pod["spec"]["securityContext"]
        assert context == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}, name


def test_jobs_of_one_name_in_two_namespaces_are_two_jobs(tmp_path: Path) -> None:
    """Everything is keyed by namespace and name (pods, Secrets, storage; Kopf's memos by
    uid): a crash, a restore and a deletion of one leave the other as it was (a reviewer's:
    untested)."""
    teams = ("team-a", "team-b")
    with LocalCluster(
        tmp_path, simulated=SimulatedAgents(batch_seconds=0.3), namespaces=teams
    ) as cluster:

        def status(team: str, test: Callable[[Any], bool]) -> Any:
            def check() -> Any:
                current = cluster.status("orders", team)
                return current if test(current) else None

            return cluster.wait_for(f"{team}/orders", check)

        for team in teams:
            document = job()
            document["metadata"]["namespace"] = team
            cluster.apply(document)
        for team in teams:
            status(team, lambda s: s.get("counts", {}).get("completed", 0) >= 1)
        other = cluster.status("orders", "team-b")

        cluster.crash_driver("orders-driver-1", "team-a")
        status("team-a", lambda s: s.get("jobAttempt") == 2 and s.get("restoredFrom"))
        cluster.delete("orders", "team-a")
        cluster.wait_for("team-a's job gone", lambda: cluster.job("orders", "team-a") is None)

        after = status(
            "team-b", lambda s: s["counts"]["completed"] > other["counts"]["completed"] + 2
        )
        assert after["jobAttempt"] == 1 and after.get("restoredFrom") is None
        assert cluster.driver_pods("orders", "team-b") == ["orders-driver-1"]
        assert cluster.pods("orders", "team-a") == []
        assert "JobCancelled" not in cluster.event_reasons("orders", "team-b")


def test_suspend_takes_a_savepoint_and_resume_restores_it(cluster: LocalCluster) -> None:
    cluster.apply(job())
    completed(cluster, "orders", 1)

    cluster.patch_spec("orders", {"state": "Suspended"})
    suspended = in_phase(cluster, "orders", "Suspended")
    cluster.wait_for("no driver pods", lambda: cluster.driver_pods("orders") == [])
    savepoint = suspended["lastSavepoint"]
    assert savepoint["label"] == "suspend"

    cluster.patch_spec("orders", {"state": "Running"})
    resumed = cluster.wait_for(
        "a resumed driver",
        lambda: (
            (s := cluster.status("orders")).get("phase") == "Running"
            and (s.get("restoredFrom") or {}).get("source") == f"savepoint:{savepoint['id']}"
            and s
        ),
        job="orders",
    )
    assert resumed["jobAttempt"] == 2


def test_a_suspension_while_an_upgrades_savepoint_is_in_flight_takes_that_savepoint(
    tmp_path: Path,
) -> None:
    """The suspension asked for a second savepoint beside the upgrade's, which was aborted
    once the first stopped the driver and counted as failed (a reviewer's)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(2.5, 3.0))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s"}))
        in_phase(cluster, "orders", "Running")
        cluster.patch_spec("orders", {"image": "example/orders:2"})
        cluster.wait_for_event("orders", "Stopping", "savepoint, then stop the driver (upgrade)")
        cluster.patch_spec("orders", {"state": "Suspended"})

        suspended = in_phase(cluster, "orders", "Suspended")
        assert suspended["lastSavepoint"]["label"] == "upgrade"
        assert [(h["kind"], h["status"]) for h in suspended["history"]] == [
            ("savepoint", "Completed")
        ]
        assert suspended["counts"].get("failed", 0) == 0
        stops = [e["message"] for e in cluster.events("orders") if e["reason"] == "Stopping"]
        assert stops == ["savepoint, then stop the driver (upgrade)"], stops
        # For the suspension, asked last: not "for an upgrade" (a reviewer's).
        assert cluster.wait_for_event("orders", "JobSuspended")["message"] == "job suspended"


def test_a_job_suspended_in_a_restarts_backoff_while_no_operator_ran_resumes_at_once(
    cluster: LocalCluster,
) -> None:
    """Its restart count and backoff were kept: set Running again, it said Suspended while
    it waited out the rest of the backoff, and posted no JobSuspended (a reviewer's). A
    running operator counts restarts afresh after a suspension; so does one that returns."""
    cluster.apply(job(restartPolicy={"type": "OnFailure", "maxRetries": 3, "backoff": "60s"}))
    completed(cluster, "orders", 1)
    cluster.crash_driver("orders-driver-1", exit_code=1)
    assert in_phase(cluster, "orders", "Restarting")["restarts"] == 1
    with operator_stopped(cluster):
        cluster.patch_spec("orders", {"state": "Suspended"})

    suspended = in_phase(cluster, "orders", "Suspended")
    assert suspended.get("restarts", 0) == 0 and suspended.get("restartDue") is None, suspended
    cluster.wait_for_event("orders", "JobSuspended")
    # Not the local runtime's words (`spark-checkpoint run`: a reviewer's).
    ready = next(c for c in suspended["conditions"] if c["type"] == "Ready")
    assert (
        ready["message"] == "suspended; it resumes from its newest image when spec.state is Running"
    )

    cluster.patch_spec("orders", {"state": "Running"})
    resumed = in_phase(cluster, "orders", "Running", timeout=20)
    assert resumed["jobAttempt"] == 2
    assert not [e for e in cluster.events("orders") if e["reason"] == "RestartBackoff"]


def test_suspend_without_a_final_savepoint_resumes_from_the_latest_checkpoint(
    cluster: LocalCluster,
) -> None:
    """spec.shutdown.finalSavepoint: false was ignored on suspend (a reviewer's): the CRD
    says Suspended stops the job with a final savepoint only if it is true."""
    cluster.apply(job(shutdown={"finalSavepoint": False}))
    completed(cluster, "orders", 2)

    cluster.patch_spec("orders", {"state": "Suspended"})
    suspended = in_phase(cluster, "orders", "Suspended")
    cluster.wait_for("no driver pods", lambda: cluster.driver_pods("orders") == [])
    stopped_without_a_savepoint(cluster, suspended, "suspend")
    newest = cluster.status("orders")["lastCheckpoint"]["id"]

    cluster.patch_spec("orders", {"state": "Running"})
    cluster.wait_for(
        "a driver resumed from the latest checkpoint",
        lambda: (
            (s := cluster.status("orders")).get("phase") == "Running"
            and (s.get("restoredFrom") or {}).get("source") == f"checkpoint:{newest}"
        ),
        job="orders",
    )


def stopped_without_a_savepoint(cluster: LocalCluster, status: dict[str, Any], reason: str) -> None:
    """The driver was stopped for `reason` without a savepoint, asked once."""
    assert status.get("lastSavepoint") is None, status
    cluster.wait_for_event("orders", "Stopping", f"{reason}: no final savepoint")
    # Asked once: each change event while the driver stopped asked again (a reviewer's).
    stops = [e for e in cluster.events("orders") if e.get("reason") == "Stopping"]
    assert sum(e.get("count", 1) for e in stops) == 1, stops


def test_an_upgrade_without_a_final_savepoint_restores_the_latest_checkpoint(
    cluster: LocalCluster,
) -> None:
    """spec.shutdown.finalSavepoint: false held for suspensions only, though the docs said
    an upgrade goes by it too: a job whose savepoints fail could not be upgraded but by
    suspending it first (a GitOps user's). As Flink's last-state upgrade mode."""
    cluster.apply(job(shutdown={"finalSavepoint": False}))
    before = completed(cluster, "orders", 2)["lastCheckpoint"]["id"]

    cluster.patch_spec("orders", {"image": "example/orders:2"})

    status = cluster.wait_for(
        "the upgraded driver",
        lambda: (
            (s := cluster.status("orders")).get("phase") == "Running"
            and s.get("jobAttempt") == 2
            and s
        ),
        job="orders",
    )
    stopped_without_a_savepoint(cluster, status, "upgrade")
    cluster.wait_for_event("orders", "JobSuspended", "job suspended: for an upgrade")
    kind, restored = status["restoredFrom"]["source"].split(":")
    assert kind == "checkpoint" and int(restored) >= before, status["restoredFrom"]
    pods = cluster.pods("orders", component="driver")
    assert [p["spec"]["containers"][0]["image"] for p in pods] == ["example/orders:2"]


def ready(cluster: LocalCluster) -> dict[str, Any]:
    conditions = cluster.status("orders").get("conditions", [])
    return next((c for c in conditions if c["type"] == "Ready"), {})


@pytest.mark.parametrize(
    ("change", "reason", "message"),
    [
        ({"image": "example/orders:2"}, "UpgradePending", "the spec changed: the driver is "),
        ({"state": "Suspended"}, "SuspendPending", "the spec asks to suspend: the driver "),
    ],
)
def test_a_change_whose_savepoint_cannot_complete_is_not_ready_until_it_happens(
    tmp_path: Path, change: dict[str, Any], reason: str, message: str
) -> None:
    """observedGeneration reached the new spec's at once, and Ready stayed True while the
    upgrade's savepoint failed at every timeout: Argo CD's health said Healthy and the old
    image ran on (a GitOps user's). Ready is False until the driver has stopped for the
    change, here once its savepoint is given up (last-state)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(2.0, 2.5))  # after the timeout
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"timeout": "1s", "tolerableFailures": 1000}))
        cluster.wait_for("Ready", lambda: ready(cluster).get("status") == "True", job="orders")

        cluster.patch_spec("orders", change)

        waiting = cluster.wait_for(
            f"Ready False, {reason}",
            lambda: (c := ready(cluster)).get("reason") == reason and c,
            job="orders",
        )
        assert waiting["status"] == "False"
        assert waiting["observedGeneration"] == 2
        assert waiting["message"].startswith(message)
        cluster.wait_for_event("orders", "Stopping", "savepoint, then stop the driver")
        time.sleep(3)  # its savepoint timed out meanwhile
        assert ready(cluster)["reason"] == reason
        assert cluster.status("orders")["phase"] == "Running"

        cluster.patch_spec("orders", {"shutdown": {"finalSavepoint": False}})
        if reason == "SuspendPending":
            in_phase(cluster, "orders", "Suspended")
            return
        cluster.wait_for(
            "the upgraded driver ready",
            lambda: (
                cluster.status("orders").get("jobAttempt") == 2
                and ready(cluster).get("status") == "True"
            ),
            job="orders",
        )
        pods = cluster.pods("orders", component="driver")
        assert [p["spec"]["containers"][0]["image"] for p in pods] == ["example/orders:2"]


def test_an_operator_killed_once_it_wrote_suspending_stops_the_driver_when_it_returns(
    cluster: LocalCluster,
) -> None:
    """Suspending is written once the stopping savepoint is registered, before the agent is
    told to stop: an operator killed in between came back, marked the job Suspended and left
    its driver running, uncoordinated (an adversary)."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    with operator_stopped(cluster):
        cluster.patch_spec("orders", {"state": "Suspended"})
        cluster.api.patch(
            JOBS, "default", "orders", {"status": {"phase": "Suspending"}}, subresource="status"
        )

    cluster.wait_for("the driver gone", lambda: cluster.driver_pods("orders") == [])
    status = in_phase(cluster, "orders", "Suspended")
    # Adopted, it was stopped before it answered (as a driver starting is): what it
    # resumes from is the newest image, kept.
    assert [c["id"] for c in status["coordinator"]["checkpoints"]] == [1]


def test_a_suspension_that_drains_endless_input_asks_for_one_savepoint_and_can_be_taken_back(
    tmp_path: Path,
) -> None:
    """A drain savepoint waits for the input to run out, however long that takes: the
    suspension asked again after every checkpointing.timeout, and drain savepoints piled up
    in flight (a reviewer). Taken back, its drain is withdrawn and checkpoints resume: it
    held them for good, and would have suspended the job whenever the input ran out (a
    reviewer)."""
    agents = SimulatedAgents(batch_seconds=0.3, endless_input=True)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"timeout": "1s"}, shutdown={"drain": True}))
        completed(cluster, "orders", 1)
        cluster.patch_spec("orders", {"state": "Suspended"})
        cluster.wait_for_event("orders", "Stopping", "savepoint, then stop the driver")
        time.sleep(3.5)  # three timeouts

        status = cluster.status("orders")
        stops = [
            e for e in cluster.events("orders") if e["message"].startswith("savepoint, then stop")
        ]
        assert len(stops) == 1, [e["message"] for e in stops]
        assert "CheckpointFailed" not in cluster.event_reasons("orders"), "it drains"
        assert status["phase"] == "Running"
        # Its savepoint is in flight all along (status said `pending: []`).
        assert [p["kind"] for p in status["pending"]] == ["savepoint"], status["pending"]
        assert status["counts"]["inProgress"] == 1

        cluster.patch_spec("orders", {"state": "Running"})
        withdrawn = cluster.wait_for_event("orders", "StopWithdrawn")
        assert withdrawn["message"] == (
            "the spec no longer asks to suspend: a savepoint for it still in flight is withdrawn"
        )
        resumed = completed(cluster, "orders", status["counts"]["completed"] + 2)
        assert cluster.event_reasons("orders").count("StopWithdrawn") == 1
        assert (resumed["phase"], resumed["jobAttempt"]) == ("Running", 1)
        assert resumed["pending"] == []
        assert "CheckpointFailed" not in cluster.event_reasons("orders")


def test_a_suspending_driver_is_stopped_when_the_operator_returns_to_an_invalid_spec(
    cluster: LocalCluster,
) -> None:
    """As above, with the spec made invalid meanwhile: the driver goes on under the spec
    accepted before (status.lastAcceptedSpec), Suspended, and is stopped. It was left
    running, uncoordinated: only the active phases had a driver to go on (a reviewer)."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    with operator_stopped(cluster):
        accepted = json.loads(cluster.status("orders")["lastAcceptedSpec"])
        status = {
            "phase": "Suspending",
            "lastAcceptedSpec": json.dumps(accepted | {"state": "Suspended"}),
        }
        cluster.api.patch(JOBS, "default", "orders", {"status": status}, subresource="status")
        cluster.patch_spec("orders", {"state": "Suspended", "image": None})

    cluster.wait_for("the driver gone", lambda: cluster.driver_pods("orders") == [])
    status = in_phase(cluster, "orders", "Suspended")
    assert [c["id"] for c in status["coordinator"]["checkpoints"]] == [1]


def test_trigger_nonces_take_a_checkpoint_and_a_savepoint(cluster: LocalCluster) -> None:
    cluster.apply(job(checkpointing={"interval": "0s"}))
    cluster.wait_for("Running", lambda: cluster.status("orders").get("phase") == "Running")

    cluster.patch_spec("orders", {"savepointTriggerNonce": 1, "checkpointTriggerNonce": 5})

    def labelled() -> Any:
        status = cluster.status("orders")
        history = status.get("coordinator", {})
        labels = {c.get("label") for c in history.get("checkpoints", [])}
        labels |= {s.get("label") for s in history.get("savepoints", [])}
        return {"nonce 1", "nonce 5"} <= labels and status

    status = cluster.wait_for("both requests completed", labelled, job="orders")
    assert status["handledTriggers"] == {"savepointNonce": 1, "checkpointNonce": 5}
    cluster.wait_for_event("orders", "SavepointCompleted", "(nonce 1)")
    # As the user guide's workflows say: the same, as a checkpoint (it had no event).
    cluster.wait_for_event("orders", "CheckpointCompleted", "(nonce 5)")


def test_a_requested_checkpoint_is_in_status_while_it_is_in_flight(tmp_path: Path) -> None:
    """A nonce's checkpoint (slow to acknowledge) left status.pending empty until it
    ended: only savepoints were written at their trigger (a reviewer's)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(2.0, 2.5))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s", "timeout": "30s"}))
        cluster.wait_for("Running", lambda: cluster.status("orders").get("phase") == "Running")

        cluster.patch_spec("orders", {"checkpointTriggerNonce": 4})  # its id block is written
        cluster.wait_for(
            "the first nonce's checkpoint",
            lambda: cluster.status("orders").get("lastCheckpoint", {}).get("label") == "nonce 4",
        )
        cluster.patch_spec("orders", {"checkpointTriggerNonce": 5})

        pending = cluster.wait_for(
            "the nonce's checkpoint in status",
            lambda: cluster.status("orders").get("pending"),
            timeout=10.0,
        )
        assert [(p["kind"], p.get("label")) for p in pending] == [("checkpoint", "nonce 5")]


def test_nonces_a_job_is_created_with_request_nothing(cluster: LocalCluster) -> None:
    """ "Changing this value requests one", the CRD says: a new job (a copy of another's
    manifest, say) took a savepoint and a checkpoint at its start (a reviewer's)."""
    cluster.apply(job(savepointTriggerNonce=3, checkpointTriggerNonce=7))
    running = completed(cluster, "orders", 3)
    assert running["handledTriggers"] == {"savepointNonce": 3, "checkpointNonce": 7}
    assert [e["message"] for e in cluster.events("orders") if "nonce" in e["message"]] == []

    cluster.patch_spec("orders", {"savepointTriggerNonce": 4})

    completed_savepoint = cluster.wait_for_event("orders", "SavepointCompleted")
    assert "(nonce 4)" in completed_savepoint["message"], completed_savepoint


def test_a_nonces_savepoint_in_flight_when_the_operator_stops_is_taken_after_it(
    tmp_path: Path,
) -> None:
    """It was lost without a word (a reviewer's): the nonce counted as handled when asked
    for, and the coordinator that was taking it went with the operator."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(3.0, 3.5))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s"}))
        cluster.wait_for("Running", lambda: cluster.status("orders").get("phase") == "Running")
        cluster.patch_spec("orders", {"savepointTriggerNonce": 1})
        cluster.wait_for(
            "the savepoint in flight",
            lambda: (
                [p.get("label") for p in cluster.status("orders").get("pending", [])] == ["nonce 1"]
            ),
        )
        with operator_stopped(cluster):
            pass

        cluster.wait_for(
            "the nonce's savepoint",
            lambda: (cluster.status("orders").get("lastSavepoint") or {}).get("label") == "nonce 1",
            timeout=30,
        )
        assert cluster.status("orders")["handledTriggers"] == {"savepointNonce": 1}


def upgraded_to_image_2(cluster: LocalCluster) -> None:
    """The job's driver was upgraded to image example/orders:2 through a savepoint."""
    status = cluster.wait_for(
        "the upgraded driver",
        lambda: (
            (s := cluster.status("orders")).get("phase") == "Running"
            and (s.get("restoredFrom") or {}).get("source", "").startswith("savepoint:")
            and s
        ),
        job="orders",
    )
    assert status["lastSavepoint"]["label"] == "upgrade"
    pods = cluster.pods("orders", component="driver")
    assert [p["spec"]["containers"][0]["image"] for p in pods] == ["example/orders:2"]


def test_an_application_change_upgrades_through_a_savepoint(cluster: LocalCluster) -> None:
    cluster.apply(job())
    completed(cluster, "orders", 1)

    cluster.patch_spec("orders", {"image": "example/orders:2"})

    upgraded_to_image_2(cluster)
    # Not a plain "job suspended", as for a suspension the user asked for (a Flink user's).
    suspended = cluster.wait_for_event("orders", "JobSuspended")
    assert suspended["message"] == "job suspended: for an upgrade"


def test_an_upgrades_stopped_driver_is_an_upgrade_pending_not_a_suspension(
    tmp_path: Path,
) -> None:
    """From its savepoint until the new driver starts the phase is Suspending, then
    Suspended (what a restarted operator resumes from); Ready said reason Suspended, "it
    resumes at its next run", and Argo CD's health check said Suspended at every upgrade (a
    Flink operator user's): Ready says UpgradePending until the new driver starts."""
    agents = SimulatedAgents(batch_seconds=0.3, exit_seconds=4.0)  # a stopping driver's exit
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())
        completed(cluster, "orders", 1)
        cluster.patch_spec("orders", {"image": "example/orders:2"})

        seen: set[tuple[str, str]] = set()

        def upgraded() -> bool:
            status = cluster.status("orders")
            ready = {c["type"]: c for c in status.get("conditions", ())}.get("Ready", {})
            seen.add((status.get("phase", ""), ready.get("reason", "")))
            pods = cluster.pods("orders", component="driver")
            images = [p["spec"]["containers"][0]["image"] for p in pods]
            return status.get("phase") == "Running" and images == ["example/orders:2"]

        cluster.wait_for("the upgraded driver running", upgraded, job="orders")
        stopped = {(phase, reason) for phase, reason in seen if phase.startswith("Suspend")}
        assert ("Suspending", "UpgradePending") in stopped, seen
        assert stopped <= {("Suspending", "UpgradePending"), ("Suspended", "UpgradePending")}, seen


def test_an_upgrade_asked_while_the_operator_is_down_goes_through_a_savepoint(
    cluster: LocalCluster,
) -> None:
    """The restarted operator adopts the running driver (Deploying until its agent
    answers): the upgrade stopped it without a savepoint, and the new driver restored an
    older checkpoint than the query had gone past (a Flink operator user's)."""
    cluster.apply(job())
    completed(cluster, "orders", 1)

    with operator_stopped(cluster):
        cluster.patch_spec("orders", {"image": "example/orders:2"})

    upgraded_to_image_2(cluster)
    assert not [e for e in cluster.events("orders") if "not running" in e["message"]]


@pytest.mark.parametrize("gone", ["pod", "token"])
def test_an_upgrade_pending_at_an_operator_restart_whose_driver_is_gone_starts_one_driver(
    cluster: LocalCluster, gone: str
) -> None:
    """The recorded driver gone while no operator ran (its pod deleted, or stopped as its
    token was lost): the restarted operator started a driver of the new spec, stopped it
    for the upgrade ("the job is not running"), said the spec no longer asked to upgrade,
    and started a third (a newcomer's). As the Flink operator recovers a missing
    JobManager: one driver of the new spec, restored from the newest image."""
    cluster.apply(job())
    completed(cluster, "orders", 1)

    with operator_stopped(cluster):
        cluster.patch_spec("orders", {"image": "example/orders:2"})
        _lose_driver(cluster, gone)

    status = cluster.wait_for(
        "the new spec's driver restored",
        lambda: (
            (s := cluster.status("orders")).get("phase") == "Running"
            and s.get("restoredFrom")
            and s
        ),
        job="orders",
    )
    assert status["jobAttempt"] == 2
    assert status["restoredFrom"]["source"].startswith("checkpoint:")
    pods = cluster.pods("orders", component="driver")
    assert [p["spec"]["containers"][0]["image"] for p in pods] == ["example/orders:2"]
    time.sleep(1.0)  # Kopf posts from a queue
    reasons = cluster.event_reasons("orders")
    assert reasons.count("DriverStarting") == 2, reasons  # attempts 1 and 2
    assert not {"Stopping", "StopWithdrawn", "JobSuspended", "RequestDeclined"} & set(reasons), [
        (e["reason"], e["message"]) for e in cluster.events("orders")
    ]


def test_an_upgrade_asked_while_the_agent_does_not_answer_for_a_moment_takes_a_savepoint(
    cluster: LocalCluster,
) -> None:
    """One status request its agent did not answer made the job Deploying, and the upgrade
    stopped the driver without a savepoint (a Flink operator user's)."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    agent = cluster.simulated_agent("orders-driver-1")
    assert agent is not None
    agent.cut_off = True
    in_phase(cluster, "orders", "Deploying")

    cluster.patch_spec("orders", {"image": "example/orders:2"})
    time.sleep(1.5)
    agent.cut_off = False

    upgraded_to_image_2(cluster)
    assert not [e for e in cluster.events("orders") if "not running" in e["message"]]


def test_a_suspension_waits_for_an_adopted_silent_driver_no_longer_than_its_heartbeat(
    cluster: LocalCluster,
) -> None:
    """An adopted driver whose agent never answers (hung, unreachable from the restarted
    operator): the suspension waited for it for ever (a reviewer's)."""
    cluster.apply(job(restartPolicy={"type": "OnFailure", "heartbeatTimeout": "3s"}))
    completed(cluster, "orders", 1)
    agent = cluster.simulated_agent("orders-driver-1")
    assert agent is not None

    with operator_stopped(cluster):
        agent.cut_off = True
        cluster.patch_spec("orders", {"state": "Suspended"})

    in_phase(cluster, "orders", "Suspended")
    cluster.wait_for_event("orders", "Stopping", "waiting up to 3s for the driver's agent")
    cluster.wait_for_event("orders", "Stopping", "did not answer in 3s")


def test_a_restart_nonce_restarts_the_driver_through_a_savepoint(cluster: LocalCluster) -> None:
    """Flink's restartNonce: the one way to restart a job's driver from Git without changing
    what it runs (a GitOps user bumped a driver annotation instead)."""
    cluster.apply(job(restartNonce=1))  # the value a job is created with restarts nothing
    completed(cluster, "orders", 1)
    assert cluster.status("orders")["jobAttempt"] == 1

    cluster.patch_spec("orders", {"restartNonce": 2})

    restarted = cluster.wait_for(
        "the restarted driver",
        lambda: (
            (s := cluster.status("orders")).get("jobAttempt") == 2
            and s.get("phase") == "Running"
            and s
        ),
        job="orders",
    )
    assert restarted["restoredFrom"]["source"] == f"savepoint:{restarted['lastSavepoint']['id']}"
    assert restarted["lastSavepoint"]["label"] == "upgrade"


def redeploy(savepoint_id: int, nonce: int, job_name: str = "orders") -> dict[str, Any]:
    path = f"/simulated/default/{job_name}/savepoints/sp-{savepoint_id}"
    return {"restore": {"initialSavepointPath": path, "savepointRedeployNonce": nonce}}


def redeploy_handled(cluster: LocalCluster, nonce: int, phase: str = "Running") -> Any:
    """The job's status once the redeploy of `nonce` is handled and the job is in `phase`."""
    return cluster.wait_for(
        f"the redeploy of nonce {nonce} handled",
        lambda: (
            (s := cluster.status("orders")).get("handledTriggers", {}).get("savepointRedeployNonce")
            == nonce
            and s["phase"] == phase
            and s
        ),
        job="orders",
    )


def test_a_redeploy_nonce_restores_the_named_savepoint_instead_of_the_newest_image(
    cluster: LocalCluster,
) -> None:
    """Flink's savepointRedeployNonce: the driver stops without a savepoint, the next one
    restores the savepoint spec.restore.initialSavepointPath names, and the newer images are
    set aside (restored later, one would resume after output its sinks discarded); an
    operator restart after it redeploys nothing again."""
    cluster.apply(job())
    older = savepoint_by_nonce(cluster, 1)
    newer = completed(cluster, "orders", older + 2)["coordinator"]["checkpoints"]
    newer_ids = {c["id"] for c in newer if c["id"] > older}
    assert newer_ids

    cluster.patch_spec("orders", redeploy(older, 1))

    second = cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
    assert second.restored_from == f"savepoint:{older}"
    status = redeploy_handled(cluster, 1)
    assert status["restoredFrom"]["source"] == f"savepoint:{older}"
    set_aside = {e["source"] for e in status["unrestorable"]}
    assert {f"checkpoint:{i}" for i in newer_ids} <= set_aside
    labels = [s.get("label") for s in status["coordinator"]["savepoints"]]
    assert labels == ["nonce 1"], "no savepoint was taken to stop the driver"
    stopping = cluster.wait_for_event("orders", "Stopping", "redeploy")
    assert "no savepoint" in stopping["message"]
    event = cluster.wait_for_event("orders", "Redeploying", f"restores savepoint:{older}")
    assert f"instead of the newest image, checkpoint:{max(newer_ids)}" in event["message"]
    # The phase Suspended between the drivers says what for (an alert on JobSuspended).
    cluster.wait_for_event(
        "orders",
        "JobSuspended",
        "job suspended: for a redeploy (spec.restore.savepointRedeployNonce 1)",
    )

    completed(cluster, "orders", status["counts"]["completed"] + 1)
    with operator_stopped(cluster):
        pass
    completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)
    assert cluster.driver_pods("orders") == ["orders-driver-2"], "redeployed once only"


def test_a_redeploy_interrupted_by_an_operator_restart_is_carried_out_by_the_next(
    tmp_path: Path,
) -> None:
    """The operator killed after it stopped the driver for the redeploy, before the next
    driver restored the image: the redeploy is not lost (the next driver would have
    restored the newest image), nor the newer images restored later."""
    agents = SimulatedAgents(batch_seconds=0.3, starting_seconds=4.0)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())
        older = savepoint_by_nonce(cluster, 1)
        completed(cluster, "orders", older + 2)

        cluster.patch_spec("orders", redeploy(older, 1))
        cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
        with operator_stopped(cluster):
            status = cluster.status("orders")
            assert "savepointRedeployNonce" not in status.get("handledTriggers", {})

        status = redeploy_handled(cluster, 1)
        assert status["restoredFrom"]["source"] == f"savepoint:{older}"
        # The driver started for the redeploy goes on: not stopped and replaced by another
        # restoring the same image (an operator chaos try's).
        assert status["jobAttempt"] == 2
        agent = cluster.simulated_agent("orders-driver-2")
        assert agent is not None
        assert agent.restored_from == f"savepoint:{older}"
        assert cluster.event_reasons("orders").count("Redeploying") == 1


def test_a_second_redeploy_to_the_same_image_asked_while_no_operator_ran_is_carried_out(
    cluster: LocalCluster,
) -> None:
    """The driver the first redeploy started (restoring that image only) was taken for
    the second's, which was marked done without rewinding the job (a reviewer's)."""
    cluster.apply(job())
    older = savepoint_by_nonce(cluster, 1)
    completed(cluster, "orders", older + 2)
    cluster.patch_spec("orders", redeploy(older, 1))
    redeploy_handled(cluster, 1)
    completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)

    with operator_stopped(cluster):
        cluster.patch_spec("orders", redeploy(older, 2))

    status = redeploy_handled(cluster, 2)
    assert status["jobAttempt"] == 3
    assert status["restoredFrom"]["source"] == f"savepoint:{older}"
    assert cluster.event_reasons("orders").count("Redeploying") == 2


@pytest.mark.parametrize("gone", ["pod", "token"])
def test_a_redeploy_pending_at_an_operator_restart_whose_driver_is_gone_starts_one_driver(
    cluster: LocalCluster, gone: str
) -> None:
    """The recorded driver gone while no operator ran and a redeploy asked meanwhile: the
    restarted operator started a driver from the newest image, then stopped it for the
    redeploy (a reviewer's). One driver, restoring the named savepoint."""
    cluster.apply(job())
    older = savepoint_by_nonce(cluster, 1)
    completed(cluster, "orders", older + 2)

    with operator_stopped(cluster):
        cluster.patch_spec("orders", redeploy(older, 1))
        _lose_driver(cluster, gone)

    status = redeploy_handled(cluster, 1)
    assert status["restoredFrom"]["source"] == f"savepoint:{older}"
    assert status["jobAttempt"] == 2
    time.sleep(1.0)  # Kopf posts from a queue
    reasons = cluster.event_reasons("orders")
    assert reasons.count("DriverStarting") == 2, reasons  # attempts 1 and 2
    assert reasons.count("DriverReplaced") == (gone == "token"), reasons  # once: one adopt
    assert reasons.count("Redeploying") == 1, reasons
    assert "Stopping" not in reasons, reasons


@pytest.mark.parametrize("gone", ["pod", "token"])
def test_a_suspension_pending_at_an_operator_restart_whose_driver_is_gone_starts_no_driver(
    cluster: LocalCluster, gone: str
) -> None:
    """The recorded driver gone while no operator ran and the job suspended meanwhile: it
    ends Suspended without a driver started."""
    cluster.apply(job())
    completed(cluster, "orders", 1)

    with operator_stopped(cluster):
        cluster.patch_spec("orders", {"state": "Suspended"})
        _lose_driver(cluster, gone)

    cluster.wait_for("suspended", lambda: cluster.status("orders").get("phase") == "Suspended")
    time.sleep(1.0)  # Kopf posts from a queue
    reasons = cluster.event_reasons("orders")
    assert reasons.count("DriverStarting") == 1, reasons
    assert cluster.status("orders")["jobAttempt"] == 1


def test_a_redeploy_from_another_jobs_savepoint_outlives_an_operator_restart(
    cluster: LocalCluster,
) -> None:
    """Another job's savepoint: once restored, every image of the job's own is set aside.
    An operator restart, then a driver crash before the next checkpoint: the next driver
    restores that savepoint again (the job failed: no restorable image left)."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    elsewhere = "/simulated/default/other/savepoints/sp-3"
    spec = {
        "checkpointing": {"interval": "0s"},  # no image of its own completes meanwhile
        "restore": {"initialSavepointPath": elsewhere, "savepointRedeployNonce": 1},
    }
    cluster.patch_spec("orders", spec)
    status = redeploy_handled(cluster, 1)
    external = f"external:file://{elsewhere}/_metadata"
    assert status["restoredFrom"]["source"] == external
    assert status["restoreChoice"]["image"] == external

    with operator_stopped(cluster):
        pass
    attempt = status["jobAttempt"]
    cluster.crash_driver(f"orders-driver-{attempt}", exit_code=1)

    following = cluster.wait_for(
        "the next driver",
        lambda: cluster.simulated_agent(f"orders-driver-{attempt + 1}"),
    )
    assert following.restored_from == external
    assert in_phase(cluster, "orders", "Running")["jobAttempt"] == attempt + 1


def test_a_redeploy_nonce_the_job_is_created_with_redeploys_nothing(
    cluster: LocalCluster,
) -> None:
    """Nor a changed path without a changed nonce (as in Flink)."""
    cluster.apply(job(**redeploy(7, 3, job_name="elsewhere")))
    completed(cluster, "orders", 2)
    cluster.patch_spec("orders", redeploy(8, 3, job_name="elsewhere"))
    status = completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)

    assert status["jobAttempt"] == 1
    assert status["handledTriggers"]["savepointRedeployNonce"] == 3
    assert "Redeploying" not in cluster.event_reasons("orders")


def test_a_redeploy_to_a_checkpoint_the_registry_no_longer_lists_is_refused_and_the_job_goes_on(
    cluster: LocalCluster,
) -> None:
    """The job's own checkpoint that retention discarded (or that its garbage collection
    would delete): refused before the driver is stopped."""
    cluster.apply(job())
    completed(cluster, "orders", 4)
    spec = {
        "restore": {
            "initialSavepointPath": "/simulated/default/orders/chk-1",
            "savepointRedeployNonce": 1,
        }
    }
    cluster.patch_spec("orders", spec)

    event = cluster.wait_for_event("orders", "RedeployRefused")
    assert event["type"] == "Warning"
    # Why it is gone, not how to restore an unlisted one (copy the job's directory).
    assert (
        "checkpoint 1 was deleted: the job keeps only its newest checkpoints "
        "(spec.checkpointing.retained)" in event["message"]
    )
    assert event["message"].endswith("the job goes on as it is")
    status = completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)
    assert status["jobAttempt"] == 1
    assert status["handledTriggers"]["savepointRedeployNonce"] == 1


def test_a_redeploy_to_a_savepoint_the_job_let_go_or_never_took_is_refused(
    cluster: LocalCluster,
) -> None:
    """The savepoint history deleted it, or no such id was taken: refused before the
    driver is stopped (it was taken for another registry's savepoint, and the driver,
    stopped for it, would have failed the job on a missing image; an outside-in try's)."""
    cluster.apply(job(savepoints={"historyMaxCount": 1}))
    first = savepoint_by_nonce(cluster, 1)
    savepoint_by_nonce(cluster, 2)  # the history keeps this one only
    cluster.wait_for_event("orders", "SavepointDiscarded", f"deleting savepoint {first} ")

    cluster.patch_spec("orders", redeploy(first, 1))
    deleted = cluster.wait_for_event("orders", "RedeployRefused")
    cluster.patch_spec("orders", redeploy(999_999, 2))
    never = cluster.wait_for_event("orders", "RedeployRefused", "999999")

    assert (
        f"savepoint {first} was deleted: the savepoint history let it go (spec.savepoints), "
        "or it was disposed of"  # the registry records no disposal
    ) in deleted["message"]
    # The newest id it took, not its id counter (at 101: a block of ids is reserved).
    said = re.search(
        r"savepoint 999999 was never taken \(the job's newest id is (\d+)\)", never["message"]
    )
    assert said is not None and first < int(said[1]) < 100, never["message"]
    status = completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)
    assert status["jobAttempt"] == 1, "the job went on"
    assert status["handledTriggers"]["savepointRedeployNonce"] == 2


def test_a_refused_redeploy_leaves_the_rest_of_its_change_to_be_carried_out(
    cluster: LocalCluster,
) -> None:
    """An image change in the same edit is an upgrade as without the redeploy."""
    cluster.apply(job())
    completed(cluster, "orders", 4)  # checkpoint 1 discarded (retained: 2)
    spec = {
        "image": "example/orders:2",
        "restore": {
            "initialSavepointPath": "/simulated/default/orders/chk-1",
            "savepointRedeployNonce": 1,
        },
    }
    cluster.patch_spec("orders", spec)

    cluster.wait_for_event("orders", "RedeployRefused")
    upgraded = cluster.wait_for(
        "the upgraded driver",
        lambda: (
            (s := cluster.status("orders")).get("jobAttempt") == 2 and s["phase"] == "Running" and s
        ),
        job="orders",
    )
    assert upgraded["lastSavepoint"]["label"] == "upgrade"
    pod = cluster.pods("orders", component="driver")[0]
    assert pod["spec"]["containers"][0]["image"] == "example/orders:2"


def test_a_redeploy_of_a_finished_job_is_refused_saying_what_runs_it_again(
    tmp_path: Path,
) -> None:
    """Its input is done: a Finished job is not run again (a redeploy nonce was ignored
    without a word: a reviewer's)."""
    with LocalCluster(
        tmp_path, simulated=SimulatedAgents(batch_seconds=0.3, finish_after=8)
    ) as cluster:
        cluster.apply(job())
        in_phase(cluster, "orders", "Finished")

        cluster.patch_spec("orders", redeploy(1, 1))

        event = cluster.wait_for_event("orders", "RedeployRefused")
        assert "Finished" in event["message"] and "initialSavepointPath" in event["message"]
        status = redeploy_handled(cluster, 1, phase="Finished")
        assert status["phase"] == "Finished"
        assert cluster.driver_pods("orders") == []


def test_a_redeploy_asked_while_the_job_is_suspended_is_carried_out_when_it_resumes(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job())
    older = savepoint_by_nonce(cluster, 1)
    completed(cluster, "orders", older + 2)
    cluster.patch_spec("orders", {"state": "Suspended"})
    suspended = in_phase(cluster, "orders", "Suspended")
    assert suspended["lastSavepoint"]["label"] == "suspend"

    cluster.patch_spec("orders", redeploy(older, 1))
    # Ready says which image it resumes from: the redeploy's, not its newest.
    waiting = (
        f"suspended; it resumes from savepoint:{older} (spec.restore.savepointRedeployNonce "
        "1) when spec.state is Running"
    )
    cluster.wait_for(
        "Ready naming the redeploy's image",
        lambda: (
            {c["type"]: c for c in cluster.status("orders")["conditions"]}["Ready"]["message"]
            == waiting
        ),
        job="orders",
    )
    assert cluster.driver_pods("orders") == []
    cluster.patch_spec("orders", {"state": "Running"})

    second = cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
    assert second.restored_from == f"savepoint:{older}"
    status = redeploy_handled(cluster, 1)
    assert f"savepoint:{suspended['lastSavepoint']['id']}" in {
        e["source"] for e in status["unrestorable"]
    }


def test_a_redeploy_runs_a_failed_job_again_from_the_named_savepoint(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job(restartPolicy={"type": "Never"}))
    older = savepoint_by_nonce(cluster, 1)
    completed(cluster, "orders", older + 1)
    cluster.crash_driver("orders-driver-1", exit_code=1)
    in_phase(cluster, "orders", "Failed")

    cluster.patch_spec("orders", redeploy(older, 1))

    second = cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
    assert second.restored_from == f"savepoint:{older}"
    in_phase(cluster, "orders", "Running")


def test_periodic_savepoints_are_taken_kept_to_the_history_and_survive_an_operator_restart(
    cluster: LocalCluster,
) -> None:
    """spec.savepoints.interval: savepoints labelled periodic, an interval apart, the
    oldest deleted past historyMaxCount; the schedule is in status, so a restarted operator
    does not take one at once."""
    cluster.apply(job(savepoints={"interval": "3s", "historyMaxCount": 2}))

    def periodic_after(savepoint_id: int) -> tuple[int, datetime, Any]:
        """The next periodic savepoint's id and trigger time, and the status."""
        status = cluster.wait_for(
            f"a periodic savepoint after {savepoint_id}",
            lambda: (
                (s := cluster.status("orders")).get("lastSavepoint", {}).get("label") == "periodic"
                and s["lastSavepoint"]["id"] > savepoint_id
                and s
            ),
            job="orders",
        )
        triggered = datetime.fromisoformat(status["lastSavepoint"]["triggerTime"])
        return status["lastSavepoint"]["id"], triggered, status

    first, first_time, _ = periodic_after(0)
    second, second_time, _ = periodic_after(first)
    third, third_time, status = periodic_after(second)
    assert second_time - first_time >= timedelta(seconds=3)
    assert third_time - second_time >= timedelta(seconds=3)
    labels = [s["label"] for s in status["coordinator"]["savepoints"]]
    assert labels == ["periodic", "periodic"], "historyMaxCount 2 kept the newest two"
    cluster.wait_for_event("orders", "SavepointDiscarded")

    # Where the next operator reads the schedule from.
    scheduled = datetime.fromisoformat(status["coordinator"]["lastPeriodicSavepoint"])
    assert abs(scheduled - third_time) < timedelta(seconds=1)
    with operator_stopped(cluster):
        time.sleep(1)
    _, fourth_time, after = periodic_after(third)
    assert fourth_time - third_time >= timedelta(seconds=3), "not at once after the restart"
    assert after["jobAttempt"] == 1


def test_status_says_when_the_next_periodic_savepoint_is_due_as_the_settings_change(
    cluster: LocalCluster,
) -> None:
    """status.nextPeriodicSavepoint: an interval after the last one (the first Running);
    a changed interval or a schedule shows at once (no periodic checkpoint writes the status
    meanwhile); none once they are turned off."""
    cluster.apply(job(checkpointing={"interval": "0s"}, savepoints={"interval": "1h"}))

    def next_due(spoken: str) -> datetime:
        status = cluster.wait_for(
            spoken,
            lambda: (
                (s := cluster.status("orders")).get("phase") == "Running"
                and s.get("nextPeriodicSavepoint")
                and s["nextPeriodicSavepoint"] != due.get("at")
                and s
            ),
            job="orders",
        )
        last = datetime.fromisoformat(status["coordinator"]["lastPeriodicSavepoint"])
        due["at"] = status["nextPeriodicSavepoint"]
        return datetime.fromisoformat(due["at"]) - last

    due: dict[str, str] = {}
    assert next_due("the first due") == timedelta(hours=1)
    cluster.patch_spec("orders", {"savepoints": {"interval": "2h"}})
    assert next_due("the new interval's") == timedelta(hours=2)
    cluster.patch_spec("orders", {"savepoints": {"interval": None, "schedule": "0 0 1 1 *"}})
    next_new_year = next_due("the schedule's")
    scheduled = datetime.fromisoformat(due["at"])
    assert (scheduled.month, scheduled.day, scheduled.hour, scheduled.minute) == (1, 1, 0, 0)
    assert timedelta(0) < next_new_year <= timedelta(days=366)

    cluster.patch_spec("orders", {"savepoints": None})
    cluster.wait_for(
        "none due", lambda: cluster.status("orders").get("nextPeriodicSavepoint") is None
    )
    assert cluster.status("orders")["phase"] == "Running"


def test_a_deletion_while_the_agent_does_not_answer_for_a_moment_takes_its_savepoint(
    cluster: LocalCluster,
) -> None:
    """One status request its agent did not answer made the job Deploying, and the deletion
    cancelled it without its final savepoint (as an upgrade stopped it, a reviewer's)."""
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 1)
    agent = cluster.simulated_agent("orders-driver-1")
    assert agent is not None
    agent.cut_off = True
    in_phase(cluster, "orders", "Deploying")

    cluster.delete("orders")
    time.sleep(1.5)
    agent.cut_off = False

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    cluster.wait_for_event("orders", "SavepointCompleted")


def test_deletion_takes_a_final_savepoint_then_releases_the_job(cluster: LocalCluster) -> None:
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 1)

    cluster.delete("orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    cluster.wait_for_event("orders", "SavepointCompleted")
    cluster.wait_for_event("orders", "JobCancelled")
    cluster.wait_for("pods gone", lambda: cluster.pods("orders") == [])
    # Garbage is collected once: Kopf's deletion handler, called once the daemon that did
    # the deletion had exited, collected it again (a reviewer's).
    commands = [c[0] for c in cleanup_commands(cluster, "orders")]
    assert commands.count("collect-garbage") == 1, commands


def test_a_deletion_found_by_a_restarted_operator_collects_garbage_once(
    cluster: LocalCluster,
) -> None:
    """The adopted driver's shutdown left the job looking uncleaned, and the deletion's
    end collected its garbage a second time (an operator chaos try's)."""
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 1)
    cluster.operator.kill()
    cluster.delete("orders")
    cluster.operator.start()

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    cluster.wait_for_event("orders", "JobCancelled")
    commands = [c[0] for c in cleanup_commands(cluster, "orders")]
    assert commands.count("collect-garbage") == 1, commands


@pytest.mark.parametrize("final_savepoint", [True, False])
def test_deletion_goes_by_the_shutdown_settings_the_spec_has_when_it_is_deleted(
    cluster: LocalCluster, final_savepoint: bool
) -> None:
    """spec.shutdown changed while the driver runs (it calls for no new driver): the
    deletion went by the settings the driver was started with, and a finalSavepoint turned
    on just before deleting the job took none (a reviewer's)."""
    cluster.apply(job(shutdown={"finalSavepoint": not final_savepoint}))
    completed(cluster, "orders", 1)
    spec = {"shutdown": {"finalSavepoint": final_savepoint}}
    cluster.api.patch(JOBS, "default", "orders", {"spec": spec})

    cluster.delete("orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    cluster.wait_for_event("orders", "JobCancelled")
    final = [
        event
        for event in cluster.events("orders")
        if event["reason"] == "SavepointCompleted" and "complete (final)" in event["message"]
    ]
    assert len(final) == int(final_savepoint), cluster.event_reasons("orders")


def test_a_checkpoint_timeout_edited_with_the_deletion_applies_to_the_final_savepoint(
    tmp_path: Path,
) -> None:
    """An edit the operator has not followed when the job is deleted (it was busy writing
    the status of an earlier edit): the final savepoint was timed by the coordinator's
    earlier timeout, 2 s, and given up, though the spec, edited to 30 s, gave it time."""
    agents = SimulatedAgents(batch_seconds=0.3)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(shutdown={"finalSavepoint": True}, checkpointing={"timeout": "2s"}))
        completed(cluster, "orders", 1)
        first_edit = cluster.job("orders")["metadata"]["generation"] + 1
        held, release = threading.Event(), threading.Event()

        async def hold_the_first_edits_write(request: Any) -> None:
            # The next patch (a callback answering none is used up): the edit's status, or
            # first the job's last stable spec annotation, written with it.
            data = request.data or {}
            status = data.get("status") or {}
            if (
                request.name == "orders"
                and (status.get("observedGeneration") == first_edit or "metadata" in data)
                and not release.is_set()
            ):
                held.set()
                while not release.is_set():
                    await asyncio.sleep(0.05)

        cluster.api.call(lambda emulator: emulator["patch"] << hold_the_first_edits_write)
        cluster.api.patch(JOBS, "default", "orders", {"spec": {"checkpointing": {"retained": 3}}})
        cluster.wait_for("the first edit's write", held.is_set)
        slow = (4.0, 4.0)  # longer than the earlier timeout, well within the edited one
        for agent in list(agents.agents.values()):
            agent.ack_delay = slow
        cluster.api.patch(
            JOBS, "default", "orders", {"spec": {"checkpointing": {"timeout": "30s"}}}
        )
        cluster.delete("orders")
        time.sleep(1.0)  # Kopf tells the daemon of the deletion
        release.set()

        cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=90)
        final = [
            event
            for event in cluster.events("orders")
            if event["reason"] == "SavepointCompleted" and "complete (final)" in event["message"]
        ]
        assert len(final) == 1, cluster.event_reasons("orders")


@pytest.mark.parametrize(
    "progress",
    ["{garbage", json.dumps({"started": "not-a-date", "retries": "x", "success": "maybe"})],
)
def test_a_job_whose_handler_progress_a_user_garbled_is_still_deleted(
    cluster: LocalCluster, progress: str
) -> None:
    """Kopf keeps its handlers' progress in annotations anyone who may patch the job can
    write: one it could not read held the deleted job by its finalizer for ever."""
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 1)
    cluster.api.patch(
        JOBS,
        "default",
        "orders",
        {"metadata": {"annotations": {"sparkcheckpoint.io/delete_job": progress}}},
    )

    cluster.delete("orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    cluster.wait_for_event("orders", "ProgressIgnored")


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ({"coordinator": {"nextCheckpointId": "x"}}, "status.coordinator.nextCheckpointId"),
        ({"jobAttempt": -5}, "status.jobAttempt: expected 0 to"),
        ({"jobAttempt": 2**63 - 1}, "status.jobAttempt: expected 0 to"),
    ],
)
def test_a_status_written_by_hand_that_cannot_be_read_stops_nothing_else(
    cluster: LocalCluster, written: dict[str, Any], said: str
) -> None:
    """The registry in status is what garbage collection and restores go by: one that
    cannot be read is said once and the job is left alone until it can (it crashed the
    job's daemon every 5 s, and a negative attempt deleted the running driver); the other
    jobs go on, and the deletion releases the job, its storage as it is."""
    cluster.apply(job("good"))
    cluster.apply(job())
    completed(cluster, "orders", 1)
    with operator_stopped(cluster):
        cluster.api.patch(JOBS, "default", "orders", {"status": written}, subresource="status")

    event = cluster.wait_for_event("orders", "StatusUnreadable")
    assert said in event["message"], event
    before = completed(cluster, "good", 1)["counts"]["completed"]
    completed(cluster, "good", before + 2)
    assert cluster.driver_pods("orders") == ["orders-driver-1"]  # left as it was
    assert "Traceback" not in cluster.operator.log_path.read_text(), "a crash loop"

    cluster.delete("orders")
    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)


FINALIZER = "sparkcheckpoint.io/finalizer"


def cleanup_pods(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    """The cleanup pods the operator created for the job, in order, as it created them
    (the simulated kubelet completes them at once; the API server's record keeps them)."""
    pods = []
    for request in cluster.api.call(list):
        pod = request.data if isinstance(request.data, dict) else {}
        if request.method.value != "POST" or pod.get("kind", "Pod") != "Pod":
            continue
        labels = pod.get("metadata", {}).get("labels", {})
        if labels.get("sparkcheckpoint.io/job") == name and (
            labels.get("sparkcheckpoint.io/component") == "cleanup"
        ):
            pods.append(pod)
    return pods


def cleanup_commands(cluster: LocalCluster, name: str) -> list[list[str]]:
    """The janitor commands of the job's cleanup pods, in order."""
    commands = []
    for pod in cleanup_pods(cluster, name):
        command = pod["spec"]["containers"][0]["command"]
        commands.append(command[command.index("spark_checkpoint.janitor") + 1 :])
    return commands


def last_written_status(cluster: LocalCluster, name: str) -> dict[str, Any]:
    """The status the operator wrote last (the job itself may be gone)."""
    written = [
        request.data["status"]
        for request in cluster.api.call(list)
        if request.method.value == "PATCH"
        and request.subresource == "status"
        and request.name == name
        and isinstance(request.data, dict)
    ]
    assert written, f"no status written for {name}"
    return written[-1]


def deleted_while_the_operator_is_down(cluster: LocalCluster, name: str) -> list[int]:
    """Delete the job while no operator runs: its finalizer holds it. Returns the ids of
    the checkpoints its status retains."""
    cluster.delete(name)
    held = cluster.job(name)
    assert held is not None and held["metadata"].get("deletionTimestamp")
    assert FINALIZER in held["metadata"].get("finalizers", [])
    return [c["id"] for c in held["status"]["coordinator"]["checkpoints"]]


@pytest.mark.parametrize("spec", ["valid", "made invalid"])
def test_a_job_deleted_while_the_operator_is_down_gets_its_final_savepoint_and_retention(
    cluster: LocalCluster, spec: str
) -> None:
    """Also when its spec had become invalid: the spec last accepted (status) is in effect
    for its driver, so the next operator takes the final savepoint with it."""
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 2)
    if spec == "made invalid":
        cluster.patch_spec("orders", {"image": None})
        cluster.wait_for_event("orders", "InvalidSpec", "spec.image")

    cluster.operator.kill()
    retained = deleted_while_the_operator_is_down(cluster, "orders")
    assert retained
    cluster.operator.start()

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    cluster.wait_for_event("orders", "SavepointCompleted", "(final)")
    cluster.wait_for_event("orders", "DriverAdopted")
    status = last_written_status(cluster, "orders")
    assert status["phase"] == "Cancelled"
    final = status["lastSavepoint"]
    assert final["label"] == "final"
    said = f"the job was deleted; its final savepoint {final['id']} is at {final['path']}"
    assert status["message"] == said
    # Named in the last event too: SavepointCompleted may be rate-limited away (a newcomer's).
    cluster.wait_for_event("orders", "JobCancelled", f"job cancelled: {said}")
    assert status["jobAttempt"] == 1, "the running driver was adopted, none started"
    # RetainOnFailure: a cancelled job's checkpoints are discarded by cleanup pods; the
    # savepoint stays.
    assert status["coordinator"]["checkpoints"] == []
    assert [s["label"] for s in status["coordinator"]["savepoints"]] == ["final"]
    commands = cleanup_commands(cluster, "orders")
    discarded = {int(c[1]) for c in commands if c[0] == "discard-checkpoint"}
    assert set(retained) <= discarded
    assert commands[-1][0] == "collect-garbage"
    cluster.wait_for_event("orders", "JobCancelled")
    cluster.wait_for("pods gone", lambda: cluster.pods("orders") == [])


def test_a_suspended_jobs_deletion_names_its_newest_savepoint(cluster: LocalCluster) -> None:
    """It said only "the job was deleted", though a running job's deletion names its final
    savepoint: where a new job starts from (a Flink user's)."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    cluster.patch_spec("orders", {"state": "Suspended"})
    cluster.wait_for("suspended", lambda: cluster.status("orders").get("phase") == "Suspended")
    newest = cluster.status("orders")["lastSavepoint"]

    cluster.delete("orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    said = f"the job was deleted; its newest savepoint {newest['id']} is at {newest['path']}"
    assert last_written_status(cluster, "orders")["message"] == said
    cluster.wait_for_event("orders", "JobCancelled", f"job cancelled: {said}")


def test_a_job_deleted_while_the_operator_is_down_and_its_driver_gone_names_its_newest_savepoint(
    cluster: LocalCluster,
) -> None:
    """No final savepoint could be taken (its driver pod was deleted): said, with the
    savepoint a new job starts from."""
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    savepoint = savepoint_by_nonce(cluster, 1)
    path = cluster.status("orders")["lastSavepoint"]["path"]
    with operator_stopped(cluster):
        cluster.api.delete(PODS, "default", "orders-driver-1", grace_period_seconds=0)
        cluster.wait_for("the driver gone", lambda: not cluster.driver_pods("orders"))
        deleted_while_the_operator_is_down(cluster, "orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    said = (
        "the job was deleted; no final savepoint could be taken; its newest savepoint "
        f"{savepoint} is at {path}"
    )
    assert last_written_status(cluster, "orders")["message"] == said
    cluster.wait_for_event("orders", "JobCancelled", f"job cancelled: {said}")


def test_a_job_deleted_while_the_operator_and_its_driver_are_down_gets_its_retention(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 2)

    cluster.operator.kill()
    cluster.crash_driver("orders-driver-1")
    cluster.wait_for(
        "the driver pod failed",
        lambda: (
            [p["status"].get("phase") for p in cluster.pods("orders", component="driver")]
            == ["Failed"]
        ),
    )
    retained = deleted_while_the_operator_is_down(cluster, "orders")
    assert retained
    cluster.operator.start()

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    status = last_written_status(cluster, "orders")
    assert status["phase"] == "Cancelled"
    assert status["coordinator"]["checkpoints"] == []
    assert status["jobAttempt"] == 1, "no driver started for a deleted job"
    commands = cleanup_commands(cluster, "orders")
    assert {int(c[1]) for c in commands if c[0] == "discard-checkpoint"} == set(retained)
    assert commands[-1][0] == "collect-garbage"
    said = "the job was deleted; no final savepoint could be taken"
    assert status["message"] == said
    cluster.wait_for_event("orders", "JobCancelled", f"job cancelled: {said}")
    assert "SavepointCompleted" not in cluster.event_reasons("orders"), "nothing ran to take one"
    cluster.wait_for("pods gone", lambda: cluster.pods("orders") == [])


def test_an_ended_job_deleted_after_an_operator_restart_has_its_leftovers_collected(
    cluster: LocalCluster,
) -> None:
    """An end's discards follow the status write that ended it: an operator killed in
    between left checkpoints no registry lists, and deleting the job removed nothing (an
    adversary). What the registry does not list is collected when the job is deleted."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    with operator_stopped(cluster):
        # As the killed operator left it: Cancelled, its registry emptied, no discard run.
        stored = cluster.job("orders")
        assert stored is not None
        ended = copy.deepcopy(stored["status"])
        ended["phase"] = "Cancelled"
        ended["coordinator"] |= {"checkpoints": [], "terminated": "Cancelled"}
        cluster.api.patch(JOBS, "default", "orders", {"status": ended}, subresource="status")
        cluster.crash_driver("orders-driver-1", exit_code=0)
        cluster.delete("orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    assert [c[0] for c in cleanup_commands(cluster, "orders")] == ["collect-garbage"]


def refused_status_writes(
    cluster: LocalCluster, name: str, code: int, reason: str, message: str
) -> threading.Event:
    """The API server answers the job's status writes with that error while the returned
    event is set (clear it to let them through)."""

    def status_write(request: Any) -> bool:
        return bool(
            request.method.value == "PATCH"
            and request.subresource == "status"
            and request.name == name
        )

    return refused_requests(cluster, status_write, kmock.KubernetesError(code, reason, message, {}))


def test_a_status_write_the_api_server_refuses_is_told_in_one_line_until_it_is_taken(
    cluster: LocalCluster,
) -> None:
    """An operator whose role may not patch the status (a chart's RBAC edited by hand) logged
    the client's 30-line traceback, with the response's headers, every six seconds."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    forbidden = (
        'sparkcheckpointjobs.sparkcheckpoint.io "orders" is forbidden: User '
        '"system:serviceaccount:ops:operator" cannot patch resource '
        '"sparkcheckpointjobs/status" in API group "sparkcheckpoint.io"'
    )
    refusing = refused_status_writes(cluster, "orders", 403, "Forbidden", forbidden)
    told = f"the job's status was not written (HTTP 403, 5 attempts): {forbidden}"
    cluster.wait_for(
        "the refusal told",
        lambda: told in cluster.operator.log_path.read_text(),
        timeout=60,
    )
    before = cluster.status("orders")
    refusing.clear()

    after = completed(cluster, "orders", before["counts"]["completed"] + 2)
    assert after["jobAttempt"] == 1, "the running driver was adopted each time"
    assert "Traceback" not in cluster.operator.log_path.read_text()


def test_a_failed_deletion_is_retried_and_holds_the_job_until_it_is_done(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 1)
    cluster.operator.kill()
    deleted_while_the_operator_is_down(cluster, "orders")
    failing = refused_status_writes(cluster, "orders", 503, "ServiceUnavailable", "injected")
    cluster.operator.start()

    told = "Handler 'delete_job' failed temporarily: the job's status was not written (HTTP 503"
    cluster.wait_for("the deletion failing", lambda: told in cluster.operator.log_path.read_text())
    held = cluster.job("orders")
    assert held is not None and FINALIZER in held["metadata"]["finalizers"]
    agent = cluster.simulated_agent("orders-driver-1")
    assert agent is not None and agent.exit_code is None, "the driver waits for the next try"
    failing.clear()

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    status = last_written_status(cluster, "orders")
    assert status["phase"] == "Cancelled"
    assert status["lastSavepoint"]["label"] == "final"
    assert status["jobAttempt"] == 1


def test_an_operator_restart_adopts_the_driver_and_never_reuses_an_id(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job())
    before = completed(cluster, "orders", 2)

    with operator_stopped(cluster):
        agent = cluster.simulated_agent("orders-driver-1")
        assert agent is not None and agent.exit_code is None, "the driver runs on"

    after = completed(cluster, "orders", before["counts"]["completed"] + 3)
    assert after["jobAttempt"] == 1, "adopted, not restarted"
    assert cluster.driver_pods("orders") == ["orders-driver-1"]
    ids = [c["id"] for c in after["history"]]
    assert len(ids) == len(set(ids))
    assert min(ids) > before["lastCheckpoint"]["id"] or before["lastCheckpoint"]["id"] in ids


def test_a_suspension_whose_savepoint_drops_an_older_one_says_no_delay(
    cluster: LocalCluster,
) -> None:
    """The stopping driver does not take the discard of the savepoint its stop's savepoint
    pushed out of the history: the cleanup after it deletes it. No SavepointDiscardDelayed,
    which read like an error at every suspension and upgrade (a newcomer's)."""
    cluster.apply(job(checkpointing={"interval": "0s"}, savepoints={"historyMaxCount": 1}))
    in_phase(cluster, "orders", "Running")
    agent = cluster.simulated_agent("orders-driver-1")
    assert agent is not None
    agent.refuses_discards = True  # as an exiting driver's agent does
    cluster.patch_spec("orders", {"savepointTriggerNonce": 1})
    older = cluster.wait_for(
        "savepoint nonce 1",
        lambda: (cluster.status("orders").get("lastSavepoint") or {}).get("id"),
        job="orders",
    )

    cluster.patch_spec("orders", {"state": "Suspended"})

    suspended = in_phase(cluster, "orders", "Suspended")
    assert [s["id"] for s in suspended["coordinator"]["savepoints"]] != [older]
    cluster.wait_for(
        "the discard done", lambda: cluster.status("orders").get("discardsDue") == [], job="orders"
    )
    assert "SavepointDiscarded" in cluster.event_reasons("orders")
    assert "SavepointDiscardDelayed" not in cluster.event_reasons("orders")


def test_a_savepoint_discard_the_driver_did_not_take_is_done_after_an_operator_restart(
    cluster: LocalCluster,
) -> None:
    """The savepoint history's discard a driver refused lived in the operator's memory: a
    restart before the driver took it left the savepoint in storage for good. It is in
    status.discardsDue until done, so the restarted operator asks the driver it adopts."""
    cluster.apply(job(checkpointing={"interval": "0s"}, savepoints={"historyMaxCount": 1}))
    in_phase(cluster, "orders", "Running")
    agent = cluster.simulated_agent("orders-driver-1")
    assert agent is not None
    agent.refuses_discards = True

    def savepoint(nonce: int) -> Any:
        cluster.patch_spec("orders", {"savepointTriggerNonce": nonce})
        return cluster.wait_for(
            f"savepoint nonce {nonce}",
            lambda: [
                s["id"]
                for s in cluster.status("orders")["coordinator"]["savepoints"]
                if s.get("label") == f"nonce {nonce}"
            ],
            job="orders",
        )[0]

    dropped = savepoint(1)
    savepoint(2)
    # Written ahead without a reason (with the write that drops the savepoint from the
    # history), then with the driver's refusal.
    due = cluster.wait_for(
        "a discard due with the refusal",
        lambda: [d for d in cluster.status("orders").get("discardsDue", []) if "reason" in d],
        job="orders",
    )
    assert due == [
        {
            "kind": "savepoint",
            "id": dropped,
            "reason": f"the driver's agent did not take it (POST /v1/savepoints/{dropped}/discard:"
            " 503 storage unavailable: 503 Slow Down)",
        }
    ]

    cluster.wait_for_event("orders", "SavepointDiscardDelayed", f"savepoint {dropped} is not")
    with operator_stopped(cluster):
        agent.refuses_discards = False
    cluster.patch_spec("orders", {"checkpointTriggerNonce": 1})
    cluster.wait_for(
        "the discard done", lambda: cluster.status("orders").get("discardsDue") == [], job="orders"
    )
    assert agent.discarded_savepoints == [dropped]
    assert cluster.status("orders")["jobAttempt"] == 1, "adopted, not restarted"


@pytest.mark.parametrize(
    ("restart_policy", "exit_code", "phase", "drivers"),
    [
        ("Never", 1, "Failed", []),
        ("OnFailure", 1, "Running", ["orders-driver-2"]),
        ("OnFailure", 0, "Finished", []),
    ],
)
def test_a_driver_that_ended_while_the_operator_was_down_is_judged_by_its_exit(
    cluster: LocalCluster, restart_policy: str, exit_code: int, phase: str, drivers: list[str]
) -> None:
    cluster.apply(job(restartPolicy={"type": restart_policy, "maxRetries": 3, "backoff": "1s"}))
    completed(cluster, "orders", 2)

    with operator_stopped(cluster):
        cluster.crash_driver("orders-driver-1", exit_code=exit_code)
        cluster.wait_for(
            "the pod's exit in its status",
            lambda: cluster.pods("orders")[0]["status"]["phase"] in ("Succeeded", "Failed"),
        )

    status = cluster.wait_for(
        f"phase {phase}",
        lambda: (s := cluster.status("orders")).get("phase") == phase and s,
        job="orders",
    )
    cluster.wait_for("the ended driver removed", lambda: cluster.driver_pods("orders") == drivers)
    event = cluster.wait_for_event("orders", "DriverAdopted", f"ended (exit {exit_code})")
    assert "while the runtime was down" in event["message"]
    if phase == "Failed":
        assert "restartPolicy is Never" in status["message"]
    if phase == "Running":
        cluster.wait_for_event("orders", "DriverFailed")


def _lose_driver(cluster: LocalCluster, gone: str) -> None:
    """The first driver gone while no operator runs: its pod deleted, or its token."""
    if gone == "pod":
        cluster.api.delete(PODS, "default", "orders-driver-1", grace_period_seconds=0)
        cluster.wait_for("the driver gone", lambda: not cluster.driver_pods("orders"))
    else:
        _damage_token(cluster, None)


def _damage_token(cluster: LocalCluster, token: bytes | None) -> None:
    if token is None:
        cluster.api.delete("v1/secrets", "default", "orders-agent-token")
    else:
        data = {"token": base64.b64encode(token).decode()}
        cluster.api.patch("v1/secrets", "default", "orders-agent-token", {"data": data})


@pytest.mark.parametrize(
    ("damaged", "why"),
    [
        (None, "is missing"),
        # Edited by hand (the security reviewer's): the operator crashed in a loop and,
        # deleted, the job was never released.
        (b"\xff\xfe", "is damaged: not base64 of UTF-8 text"),
        (b"abc\r\nX-Injected: 1", "is damaged: not a token an HTTP header can carry"),
    ],
)
def test_a_driver_whose_token_is_gone_is_replaced_after_an_operator_restart(
    cluster: LocalCluster, damaged: bytes | None, why: str
) -> None:
    cluster.apply(job())
    before = completed(cluster, "orders", 2)

    with operator_stopped(cluster):
        _damage_token(cluster, damaged)

    after = cluster.wait_for(
        "a new attempt checkpointing",
        lambda: (
            (s := cluster.status("orders")).get("jobAttempt") == 2
            and s["counts"]["completed"] > before["counts"]["completed"]
            and s
        ),
    )
    assert cluster.driver_pods("orders") == ["orders-driver-2"]
    cluster.wait_for_event("orders", "DriverReplaced", f"key token) {why}")
    assert after["counts"]["restored"] == 1
    kind, restored_id = after["restoredFrom"]["source"].split(":")
    assert kind == "checkpoint" and int(restored_id) >= before["lastCheckpoint"]["id"]
    ids = [c["id"] for c in after["history"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("damaged", "why"), [(None, "is missing"), (b"\xff", "is damaged: not base64 of UTF-8 text")]
)
def test_a_driver_whose_token_is_gone_at_a_deletion_while_the_operator_was_down(
    cluster: LocalCluster, damaged: bytes | None, why: str
) -> None:
    """Its event said "a new attempt restores from the latest checkpoint", and none follows
    a deletion (a reviewer's); a damaged token held the job's finalizer for good."""
    cluster.apply(job(shutdown={"finalSavepoint": True}))
    completed(cluster, "orders", 1)
    with operator_stopped(cluster):
        _damage_token(cluster, damaged)
        deleted_while_the_operator_is_down(cluster, "orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    event = cluster.wait_for_event("orders", "DriverReplaced")
    assert event["message"].endswith(
        f"{why}; it is stopped and the job is deleted without a final savepoint"
    ), event
    assert cluster.pods("orders") == []


def test_a_token_secret_edited_with_a_trailing_newline_is_read_as_its_driver_reads_it(
    cluster: LocalCluster,
) -> None:
    # kubectl create secret --from-file keeps a file's newline; the driver strips it.
    cluster.apply(job())
    before = completed(cluster, "orders", 1)
    secret = cluster.api.get(SECRETS, "default", "orders-agent-token")
    token = base64.b64decode(secret["data"]["token"])

    with operator_stopped(cluster):
        _damage_token(cluster, token + b"\n")

    completed(cluster, "orders", before["counts"]["completed"] + 1)
    assert cluster.driver_pods("orders") == ["orders-driver-1"]
    assert "DriverReplaced" not in cluster.event_reasons("orders")


def test_a_secret_of_the_tokens_name_that_is_not_the_jobs_is_never_written_over(
    cluster: LocalCluster,
) -> None:
    # The security review: a user allowed to create jobs, not Secrets, could have the
    # operator write a token over any Secret named <job>-agent-token.
    theirs = {"metadata": {"name": "orders-agent-token"}, "stringData": {"token": "theirs"}}
    cluster.api.create(SECRETS, theirs, namespace="default")

    cluster.apply(job())

    status = cluster.wait_for(
        "Failed", lambda: (s := cluster.status("orders")).get("phase") == "Failed" and s
    )
    assert status["message"] == (
        "the driver could not be started: secret orders-agent-token exists and is not this "
        "job's (no owner reference to it): the operator names the driver's token so and "
        "never writes over or deletes another's Secret; rename or delete it"
    )
    stored = cluster.api.get(SECRETS, "default", "orders-agent-token")
    assert base64.b64decode(stored["data"]["token"]) == b"theirs"
    assert cluster.driver_pods("orders") == []


def test_a_job_created_again_waits_for_its_earlier_namesakes_secret_to_go(
    cluster: LocalCluster,
) -> None:
    """Deleted and created again (`kubectl replace --force`, a GitOps Replace): the earlier
    job's token Secret is removed by the garbage collector some time after. The new job
    failed for good on it, and the message said "no owner reference to it" (a reviewer's);
    it now waits for it to go."""
    earlier = {
        "apiVersion": f"{objects.GROUP}/{objects.VERSION}",
        "kind": objects.KIND,
        "name": "orders",
        "uid": "5c3b1bb4-0000-4000-8000-000000000001",
        "controller": True,
    }
    leftover = {
        "metadata": {"name": "orders-agent-token", "ownerReferences": [earlier]},
        "stringData": {"token": "earlier"},
    }
    cluster.api.create(SECRETS, leftover, namespace="default")

    cluster.apply(job())

    blocked = cluster.wait_for_event("orders", "DriverBlocked", timeout=30)
    assert blocked["message"].startswith(
        "the driver could not be started yet: secret orders-agent-token is still the "
        f"earlier job orders's (uid {earlier['uid']}), which the garbage collector removes; "
        "trying again in 1s"
    ), blocked
    assert cluster.driver_pods("orders") == []
    cluster.api.delete(SECRETS, "default", "orders-agent-token")  # the collector's turn
    completed(cluster, "orders", 1)
    assert cluster.driver_pods("orders") == ["orders-driver-1"]


def test_a_pod_of_the_drivers_name_that_is_not_the_jobs_fails_the_job_in_one_line(
    cluster: LocalCluster,
) -> None:
    """Without the job's labels `remove_pods` never removes it, and the create's conflict
    was raised as it was: a traceback every few seconds, for ever (a reviewer)."""
    theirs = {
        "metadata": {"name": "orders-driver-1"},
        "spec": {"containers": [{"name": "theirs", "image": "busybox"}]},
    }
    cluster.api.create(PODS, theirs, namespace="default")

    cluster.apply(job())

    status = cluster.wait_for(
        "Failed", lambda: (s := cluster.status("orders")).get("phase") == "Failed" and s
    )
    assert status["message"] == (
        "the driver could not be started: pod orders-driver-1 exists and is not this job's "
        "(no owner reference to it): the operator names the driver of this attempt so and "
        "never writes over or deletes another's Pod; rename or delete it"
    )
    assert (
        cluster.api.get(PODS, "default", "orders-driver-1")["spec"]["containers"][0]["name"]
        == "theirs"
    )


def test_a_pod_that_took_the_drivers_name_while_the_operator_was_down_is_left_alone(
    cluster: LocalCluster,
) -> None:
    """The hostile reviewer's: adopt read the pod by name without its owner, judged the
    stranger's exit as the driver's, and deleted it as an outdated driver."""
    cluster.apply(job())
    before = completed(cluster, "orders", 2)
    theirs = {
        "metadata": {"name": "orders-driver-1"},
        "spec": {"containers": [{"name": "theirs", "image": "busybox"}]},
    }
    with operator_stopped(cluster):
        cluster.api.delete(PODS, "default", "orders-driver-1", grace_period_seconds=0)
        cluster.wait_for("the driver gone", lambda: not cluster.driver_pods("orders"))
        cluster.api.create(PODS, theirs, namespace="default")

    cluster.wait_for(
        "a new attempt checkpointing",
        lambda: (
            (s := cluster.status("orders")).get("jobAttempt") == 2
            and s["counts"]["completed"] > before["counts"]["completed"]
        ),
    )
    replaced = cluster.wait_for_event("orders", "DriverReplaced")
    assert replaced["message"] == (
        "driver orders-driver-1 cannot be adopted: the pod of that name is not this job's "
        "(no owner reference to it); it is left alone and the job goes on without it, as after "
        "a crash of its driver"
    )
    kept = cluster.api.get(PODS, "default", "orders-driver-1")
    assert kept["spec"]["containers"][0]["name"] == "theirs"


def test_pods_that_only_wear_the_jobs_labels_are_never_deleted(cluster: LocalCluster) -> None:
    """Anyone who may create pods in the namespace can label one as a job's driver,
    cleanup pod or executor; the operator deleted each before a launch or at the end."""
    labelled = {
        "imposter-driver": {objects.LABEL_COMPONENT: objects.DRIVER},
        "imposter-cleanup": {objects.LABEL_COMPONENT: objects.CLEANUP},
        "imposter-executor": {objects.LABEL_SPARK_ROLE: objects.EXECUTOR},
    }
    for name, labels in labelled.items():
        pod = {
            "metadata": {"name": name, "labels": {objects.LABEL_JOB: "orders", **labels}},
            "spec": {"containers": [{"name": "theirs", "image": "busybox"}]},
        }
        cluster.api.create(PODS, pod, namespace="default")
    distributed = job()
    distributed["spec"]["checkpointing"]["liveVolumeClaim"] = "orders-live"
    cluster.apply(distributed)
    completed(cluster, "orders", 1)

    cluster.delete("orders")
    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=60)
    left = {pod["metadata"]["name"] for pod in cluster.api.list(PODS, "default")}
    assert set(labelled) <= left, left


@pytest.mark.parametrize(
    "refusal",
    [
        "exceeded quota: compute, requested: requests.cpu=1, used: requests.cpu=20, "
        "limited: requests.cpu=20",
        'error looking up service account default/spark: serviceaccount "spark" not found',
    ],
    ids=["quota", "service-account"],
)
def test_a_driver_refused_for_now_is_started_once_the_refusal_passes(
    cluster: LocalCluster, refusal: str
) -> None:
    """A reviewer's: a restart refused for a full quota failed the job for good, under a
    policy of 10 retries, and it stayed Failed once the quota was freed (a GitOps sync that
    creates the job before its service account does the same). Now the launch is tried
    again after the policy's backoff, and not counted as a driver failure."""
    cluster.apply(job(restartPolicy={"type": "OnFailure", "maxRetries": 1, "backoff": "1s"}))
    completed(cluster, "orders", 2)

    def pod_create(request: Any) -> bool:
        return bool(
            request.method.value == "POST" and request.url.path.endswith("/namespaces/default/pods")
        )

    forbidden = kmock.KubernetesError(
        403, "Forbidden", f'pods "orders-driver-2" is forbidden: {refusal}', {}
    )
    refusing = refused_requests(cluster, pod_create, forbidden)
    cluster.crash_driver("orders-driver-1")

    blocked = cluster.wait_for_event("orders", "DriverBlocked", timeout=30)
    assert blocked["message"] == (
        f'the driver could not be started yet: pod orders-driver-2: pods "orders-driver-2" '
        f"is forbidden: {refusal}; trying again in 1s"
    )
    cluster.wait_for_event("orders", "DriverBlocked", "trying again in 2s", timeout=30)
    status = cluster.status("orders")
    assert status["phase"] == "Deploying", status
    refusing.clear()

    after = completed(cluster, "orders", status["counts"]["completed"] + 2)
    assert after["jobAttempt"] == 2, "the refused tries are one attempt"
    assert cluster.driver_pods("orders") == ["orders-driver-2"]
    assert after["message"] == "", after


def test_a_spec_only_a_cluster_rejects_is_a_condition_and_other_jobs_run(
    cluster: LocalCluster,
) -> None:
    broken = job("broken")
    del broken["spec"]["checkpointing"]["storage"]
    cluster.apply(broken)
    # Executors without a shared live volume: their state would be out of the agent's reach.
    unshared = job("unshared")
    unshared["spec"]["application"]["sparkConf"] = {"spark.master": "k8s://cluster"}
    cluster.apply(unshared)
    # Nor those dynamic allocation adds, with no executors to start with (a reviewer's: the
    # job ran, its executors' state on their own disks).
    dynamic = job("dynamic", executor={"instances": 0})
    dynamic["spec"]["application"]["sparkConf"] = {
        "spark.master": "k8s://cluster",
        "spark.dynamicAllocation.enabled": "True",
    }
    cluster.apply(dynamic)
    cluster.apply(job("healthy"))

    for name, field in (
        ("broken", "spec.checkpointing.storage"),
        ("unshared", "spec.checkpointing.liveVolumeClaim"),
        ("dynamic", "spec.checkpointing.liveVolumeClaim"),
    ):
        status = cluster.wait_for(
            "the problem in status",
            lambda name=name: (s := cluster.status(name)).get("conditions") and s,
            job=name,
        )
        conditions = {c["type"]: c for c in status["conditions"]}
        assert conditions["SpecValid"]["status"] == "False"
        assert conditions["SpecValid"]["message"].startswith(field)
        assert cluster.pods(name) == []
        cluster.wait_for_event(name, "InvalidSpec")
    completed(cluster, "healthy", 2)


def test_a_new_generation_invalid_for_the_same_reason_is_observed(cluster: LocalCluster) -> None:
    """observedGeneration is the generation the operator last read: a spec edited but still
    invalid the same way wrote no status, so GitOps tools (kstatus) saw the edit as still
    being reconciled (a reviewer's)."""
    unshared = job()  # executors without a shared live volume
    unshared["spec"]["application"]["sparkConf"] = {"spark.master": "k8s://cluster"}
    cluster.apply(unshared)
    cluster.wait_for_event("orders", "InvalidSpec")
    cluster.wait_for("generation 1 observed", lambda: cluster.status("orders").get("conditions"))

    cluster.patch_spec("orders", {"checkpointing": {"retained": 4}})

    status = cluster.wait_for(
        "generation 2 observed",
        lambda: (s := cluster.status("orders")).get("observedGeneration") == 2 and s,
    )
    assert {c["type"]: c["observedGeneration"] for c in status["conditions"]} == {
        "Ready": 2,
        "CheckpointsHealthy": 2,
        "SpecValid": 2,
    }
    assert cluster.pods("orders") == []


def test_a_restarted_operator_says_no_generation_observed_already_again(
    cluster: LocalCluster,
) -> None:
    """Each generation read is written once: after a restart too, or an operator of
    thousands of jobs would write each one's status once more as it starts."""
    cluster.apply(job(state="Suspended"))
    in_phase(cluster, "orders", "Suspended")
    cluster.wait_for("generation 1 observed", lambda: cluster.status("orders").get("conditions"))
    cluster.operator.kill()
    restarted_at = cluster.api.call(lambda emulator: len(list(emulator)))
    cluster.operator.start()
    cluster.apply(job("marker"))  # handled after the first job's daemon has read its spec
    completed(cluster, "marker", 1)

    writes = cluster.api.call(
        lambda emulator: [
            f"{request.name}/{request.subresource}"
            for request in list(emulator)[restarted_at:]
            if request.method.value == "PATCH"
        ]
    )
    assert "marker/status" in writes, writes
    # None: an operator of thousands of jobs writes no status of an idle one as it starts.
    # (A filter counting them was shown the first operator's writes too: it counted two.)
    assert "orders/status" not in writes, writes


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        # A mount of no volume: the API server would refuse each executor pod Spark creates,
        # which Spark retries for ever. Refused as the spec is read, before any pod.
        (
            {"executor": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}},
            "spec.executor.volumeMounts[0].name: 'data' is not in spec.executor.volumes",
        ),
        # Volumes are core/v1 objects the job's schema passes on as they are.
        (
            {
                "driver": {
                    "volumes": [
                        {"name": "settings", "secret": {"secretName": "s", "defaultMode": "rw"}}
                    ],
                    "volumeMounts": [{"name": "settings", "mountPath": "/etc/settings"}],
                }
            },
            "spec.driver.volumes[0].secret.defaultMode: Input should be a valid integer",
        ),
        # A field the API server would drop: the volume would be an emptyDir.
        (
            {
                "driver": {
                    "volumes": [{"name": "out", "persistentVolumeClam": {"claimName": "o"}}],
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                }
            },
            "spec.driver.volumes[0]: unknown field 'persistentVolumeClam' (did you mean "
            "persistentVolumeClaim?)",
        ),
        # A number for a string that is no quantity (the API server takes only those).
        (
            {"driver": {"volumes": [{"name": "host", "hostPath": {"path": 5}}]}},
            "spec.driver.volumes[0].hostPath.path: Input should be a valid string",
        ),
        # The job's code would hold the operator's token (a hostile reviewer's).
        (
            {"executor": {"serviceAccount": OPERATOR_SERVICE_ACCOUNT}},
            f"spec.executor.serviceAccount: '{OPERATOR_SERVICE_ACCOUNT}' is the operator's own "
            f"service account (namespace {OPERATOR_NAMESPACE}), which a job's pods may not "
            "use: give the job one of its own",
        ),
        # A pod template's spec, a core/v1 PodSpec the job's schema passes on as it is.
        (
            {"podTemplate": {"spec": {"tolerations": [{"key": "k", "tolerationSeconds": "5"}]}}},
            "spec.podTemplate.spec.tolerations[0].tolerationSeconds: Input should be a valid "
            "integer",
        ),
    ],
    ids=[
        "executor-mount-of-no-volume",
        "driver-volume-the-pod-schema-refuses",
        "driver-volume-of-a-misspelt-source",
        "driver-volume-path-a-number",
        "the-operators-service-account",
        "pod-template-of-a-wrong-type",
    ],
)
def test_pods_the_api_server_would_refuse_are_an_invalid_spec_naming_the_field(
    cluster: LocalCluster, spec: dict[str, Any], reason: str
) -> None:
    cluster.apply(job(**spec))

    status = cluster.wait_for(
        "the problem in status",
        lambda: (s := cluster.status("orders")).get("conditions") and s,
        job="orders",
    )

    valid = {c["type"]: c for c in status["conditions"]}["SpecValid"]
    assert (valid["status"], valid["reason"], valid["message"]) == ("False", "InvalidSpec", reason)
    cluster.wait_for_event("orders", "InvalidSpec", reason)
    assert cluster.pods("orders") == []


def test_a_change_to_pods_the_api_server_would_refuse_leaves_the_running_driver_on(
    cluster: LocalCluster,
) -> None:
    """A misspelt volume source in a running job's spec passed validation: the upgrade took
    its savepoint, stopped the driver, and the next one was refused, failing the job. It is
    refused as the spec is read; the driver goes on under the spec accepted before."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    volume = {"name": "out", "persistentVolumeClam": {"claimName": "o"}}
    mount = {"name": "out", "mountPath": "/out"}

    cluster.patch_spec("orders", {"driver": {"volumes": [volume], "volumeMounts": [mount]}})

    cluster.wait_for_event("orders", "InvalidSpec", "unknown field 'persistentVolumeClam'")
    before = cluster.status("orders")["counts"]["completed"]
    after = completed(cluster, "orders", before + 2)
    assert after["jobAttempt"] == 1 and after["phase"] == "Running"
    assert after.get("lastSavepoint") is None, "no upgrade's savepoint"
    assert cluster.driver_pods("orders") == ["orders-driver-1"]
    # Running, but not what the applied manifest asks for: not Ready (docs/operator.md).
    ready = {c["type"]: c for c in after["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    # Fixed: an upgrade to the spec with the volume.
    volume = {"name": "out", "persistentVolumeClaim": {"claimName": "o"}}
    cluster.patch_spec("orders", {"driver": {"volumes": [volume]}})
    upgraded = cluster.wait_for(
        "the upgraded driver",
        lambda: (s := cluster.status("orders")).get("jobAttempt") == 2 and s,
        job="orders",
    )
    assert {c["type"]: c["status"] for c in upgraded["conditions"]}["SpecValid"] == "True"
    assert upgraded["lastSavepoint"]["label"] == "upgrade"
    cluster.wait_for(
        "Ready again",
        lambda: (
            {c["type"]: c["status"] for c in cluster.status("orders")["conditions"]}["Ready"]
            == "True"
        ),
    )


def test_a_driver_running_with_pods_this_operator_refuses_goes_on_but_is_not_replaced(
    cluster: LocalCluster,
) -> None:
    """An earlier operator let a misspelt volume source in, and its driver runs: adopted and
    coordinated on, the problem told; a change of its deployment is refused (a reviewer's:
    an image change took the upgrade savepoint and the job then failed to start), and a
    driver that fails cannot be replaced: the job fails naming the field."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    misspelt = {"name": "out", "persistentVolumeClam": {"claimName": "o"}}
    problem = (
        "spec.driver.volumes[0]: unknown field 'persistentVolumeClam' (did you mean "
        "persistentVolumeClaim?)"
    )

    with operator_stopped(cluster):
        cluster.patch_spec("orders", {"driver": {"volumes": [misspelt]}})
        stored, deployed = _driver_deployed_by_an_earlier_operator(cluster)
        status = {"deploymentHash": deployed, "lastAcceptedSpec": json.dumps(stored["spec"])}
        cluster.api.patch(JOBS, "default", "orders", {"status": status}, subresource="status")

    before = cluster.status("orders")["counts"]["completed"]
    after = completed(cluster, "orders", before + 2)
    assert after["jobAttempt"] == 1, "adopted"
    valid = {c["type"]: c for c in after["conditions"]}["SpecValid"]
    assert (valid["status"], valid["reason"]) == ("True", "AcceptedUnchanged")
    assert valid["message"].startswith(f"{problem} (the API server would refuse this")

    cluster.patch_spec("orders", {"image": "example/orders:2"})
    cluster.wait_for_event("orders", "InvalidSpec", problem)
    later = completed(cluster, "orders", after["counts"]["completed"] + 2)
    assert (later["jobAttempt"], later.get("lastSavepoint")) == (1, None), "no upgrade"

    cluster.patch_spec("orders", {"image": "example/orders:1"})  # as deployed again
    cluster.wait_for(
        "AcceptedUnchanged again",
        lambda: (
            {c["type"]: c["reason"] for c in cluster.status("orders")["conditions"]}["SpecValid"]
            == "AcceptedUnchanged"
        ),
    )
    cluster.crash_driver("orders-driver-1")
    failed = in_phase(cluster, "orders", "Failed")
    assert failed["message"] == f"the driver could not be started: {problem}"


def test_an_upgrade_whose_pod_the_api_server_refuses_leaves_the_running_driver_on(
    cluster: LocalCluster,
) -> None:
    """An admission policy (a namespace's Pod Security level, a policy engine) refused the
    upgraded driver's pod after the upgrade's savepoint had stopped the running one: the job
    failed. The operator asks first, in a dry run; refused, the spec is in error and the
    driver goes on; asked again after the restart policy's backoff, it upgrades once the
    refusal passes."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    refusal = (
        'pods "orders-driver-2" is forbidden: violates PodSecurity "restricted:latest": '
        'hostPath volumes (volume "data")'
    )

    refusing = refused_requests(
        cluster, _dry_runs_of_pods, kmock.KubernetesError(403, "Forbidden", refusal, {})
    )
    cluster.patch_spec("orders", {"image": "example/orders:2"})

    invalid = cluster.wait_for_event("orders", "InvalidSpec", refusal)
    assert invalid["message"] == (
        "the API server refuses the driver pod of this spec (asked in a dry run, again after "
        f"spec.restartPolicy's backoff): pod orders-driver-2: {refusal}"
    )
    later = completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 2)
    assert (later["jobAttempt"], later.get("lastSavepoint")) == (1, None), "no upgrade"
    assert cluster.driver_pods("orders") == ["orders-driver-1"]
    valid = {c["type"]: c for c in later["conditions"]}["SpecValid"]
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    time.sleep(4.0)  # asked again after 1s, 2s: the same verdict is not told again
    assert cluster.event_reasons("orders").count("InvalidSpec") == 1

    refusing.clear()
    upgraded_to_image_2(cluster)


def _dry_runs_of_pods(request: Any) -> bool:
    return bool(
        request.method.value == "POST"
        and request.url.path.endswith("/namespaces/default/pods")
        and request.params.get("dryRun") == "All"
    )


def test_a_suspension_is_not_held_by_an_upgrade_the_api_server_refuses(
    cluster: LocalCluster,
) -> None:
    """A reviewer's: with the upgrade's pod refused, the spec was in error as a whole, so a
    suspension asked for after it was not acted on either."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    refused_requests(
        cluster,
        _dry_runs_of_pods,
        kmock.KubernetesError(403, "Forbidden", 'pods "orders-driver-2" is forbidden: no', {}),
    )
    cluster.patch_spec("orders", {"image": "example/orders:2"})
    cluster.wait_for_event("orders", "InvalidSpec", "is forbidden: no")

    cluster.patch_spec("orders", {"state": "Suspended"})

    suspended = in_phase(cluster, "orders", "Suspended")
    assert suspended["lastSavepoint"]["label"] == "suspend"


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        # The running driver holds the quota the new one needs once it is stopped.
        (403, "Forbidden", 'pods "orders-driver-2" is forbidden: exceeded quota: compute'),
        # A webhook with side effects cannot say: the real create will.
        (400, "BadRequest", 'admission webhook "audit.example.com" does not support dry run'),
    ],
    ids=["quota", "webhook-without-dry-run"],
)
def test_an_upgrade_a_dry_run_cannot_judge_goes_ahead(
    cluster: LocalCluster, code: int, reason: str, message: str
) -> None:
    cluster.apply(job())
    completed(cluster, "orders", 2)
    refused_requests(cluster, _dry_runs_of_pods, kmock.KubernetesError(code, reason, message, {}))

    cluster.patch_spec("orders", {"image": "example/orders:2"})

    upgraded_to_image_2(cluster)
    assert "InvalidSpec" not in cluster.event_reasons("orders")


def executor(cluster: LocalCluster, name: str, driver: str | None = "orders-driver-1") -> Any:
    """An executor pod as Spark creates it for the driver pod (the operator labels
    executors); with no driver, a pod that only wears an executor's labels."""
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {"spark-role": "executor", "sparkcheckpoint.io/job": "orders"},
    }
    if driver is not None:
        uid = cluster.api.get(PODS, "default", driver)["metadata"]["uid"]
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": driver, "uid": uid, "controller": True}
        ]
    pod = {"metadata": metadata, "spec": {"containers": [{"name": "executor", "image": "x"}]}}
    return cluster.api.create(PODS, pod, namespace="default")


def test_a_lost_executor_holds_checkpoints_until_spark_replaces_it(
    cluster: LocalCluster,
) -> None:
    distributed = job()
    distributed["spec"]["application"]["sparkConf"] = {"spark.master": "k8s://cluster"}
    distributed["spec"]["executor"] = {"instances": 1}
    distributed["spec"]["checkpointing"]["liveVolumeClaim"] = "orders-live"
    cluster.apply(distributed)
    cluster.wait_for("Running", lambda: cluster.status("orders").get("phase") == "Running")
    time.sleep(2.5)
    status = cluster.status("orders")
    assert status["counts"]["completed"] == 0, "no executor: no checkpoint"
    # ... which is said, not a healthy job's silence (a newcomer).
    skipped = cluster.wait_for_event("orders", "CheckpointSkipped")
    assert "an executor is missing" in skipped["message"], skipped["message"]
    healthy = next(c for c in status["conditions"] if c["type"] == "CheckpointsHealthy")
    assert (healthy["status"], healthy["reason"]) == ("False", "CheckpointsSkipped"), healthy
    assert status["checkpointsSkipped"]["reason"] == "NotAllRequiredTasksRunning"
    # A pod that only wears an executor's labels is none of its driver's executors.
    executor(cluster, "imposter", driver=None)
    cluster.wait_for(
        "the imposter running",
        lambda: (
            cluster.api.get(PODS, "default", "imposter").get("status", {}).get("phase") == "Running"
        ),
    )
    time.sleep(1.5)
    status = cluster.status("orders")
    assert status["executors"] == {"ready": 0, "expected": 1}
    assert status["counts"]["completed"] == 0

    executor(cluster, "orders-exec-1")
    status = completed(cluster, "orders", 2)
    assert status["executors"] == {"ready": 1, "expected": 1}
    assert status.get("checkpointsSkipped") is None
    healthy = next(c for c in status["conditions"] if c["type"] == "CheckpointsHealthy")
    assert healthy["status"] == "True", healthy

    cluster.api.delete("v1/pods", "default", "orders-exec-1")
    cluster.wait_for(
        "the executor missing in status",
        lambda: cluster.status("orders")["executors"] == {"ready": 0, "expected": 1},
    )
    held = cluster.status("orders")["counts"]["completed"]
    time.sleep(2.5)
    assert cluster.status("orders")["counts"]["completed"] <= held + 1  # one in flight may end

    executor(cluster, "orders-exec-2")
    completed(cluster, "orders", held + 2)


def test_a_bounded_job_finishes_with_a_final_checkpoint_and_its_retention(
    tmp_path: Path,
) -> None:
    agents = SimulatedAgents(batch_seconds=0.3, finish_after=8)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())

        finished = in_phase(cluster, "orders", "Finished")

        assert finished["lastCheckpoint"]["batch"] == 8, "the final checkpoint covers the end"
        # RetainOnFailure: a finished job needs no checkpoint; cleanup pods discarded them.
        assert finished["coordinator"]["checkpoints"] == []
        # The phase is stored first; the event follows once the cleanup pods are done.
        cluster.wait_for_event("orders", "JobFinished")
        cluster.wait_for("no pods left", lambda: cluster.pods("orders") == [])
        conditions = {c["type"]: c for c in finished["conditions"]}
        assert conditions["Ready"]["reason"] == "Finished"


@pytest.mark.parametrize("change", [{"state": "Suspended"}, {"image": "example/orders:2"}])
def test_a_suspension_or_upgrade_while_the_driver_finishes_lets_it_finish(
    tmp_path: Path, change: dict[str, str]
) -> None:
    """Its final checkpoint completed, the driver on its way out: the stop's savepoint was
    declined (nothing runs to take it), a RequestDeclined warning asked again at every
    timeout until the driver exited."""
    agents = SimulatedAgents(batch_seconds=0.3, finish_after=8, exit_seconds=4.0)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"timeout": "1s"}))
        cluster.wait_for(
            "the final checkpoint",
            lambda: (cluster.status("orders").get("lastCheckpoint") or {}).get("batch") == 8,
        )

        cluster.patch_spec("orders", change)

        finished = in_phase(cluster, "orders", "Finished")
        reason = "suspend" if "state" in change else "upgrade"
        stopping = [e["message"] for e in cluster.events("orders") if e["reason"] == "Stopping"]
        assert stopping == [
            f"{reason}: no savepoint is needed: the input is done and its final checkpoint "
            "completed; the job finishes once its driver has committed it and exits"
        ]
        assert "RequestDeclined" not in cluster.event_reasons("orders")
        assert finished["coordinator"]["savepoints"] == []


def test_cleanup_pods_are_labelled_and_annotated_as_the_driver_is(tmp_path: Path) -> None:
    """Azure Workload Identity gives credentials only to pods labelled for it, so the
    cleanup pods that discard a finished job's checkpoints carry the driver's labels and
    annotations; but not a label that tells drivers and executors apart: the simulated
    kubelet, as Spark would, takes a pod labelled spark-role=executor for an executor and
    keeps it running, so the job would never finish."""
    identity = {"azure.workload.identity/use": "true"}
    annotations = {"azure.workload.identity/inject-proxy-sidecar": "false"}
    agents = SimulatedAgents(batch_seconds=0.3, finish_after=8)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        labels = {**identity, "spark-role": "executor", "sparkcheckpoint.io/component": "x"}
        cluster.apply(job(driver={"labels": labels, "annotations": annotations}))

        cluster.wait_for_event("orders", "JobFinished", timeout=60)

        pods = cleanup_pods(cluster, "orders")
        assert pods, "a finished job's checkpoints are discarded in cleanup pods"
        for pod in pods:
            metadata = pod["metadata"]
            assert identity.items() <= metadata["labels"].items()
            assert metadata["labels"]["sparkcheckpoint.io/component"] == "cleanup"
            assert "spark-role" not in metadata["labels"]
            assert metadata["annotations"] == annotations


def test_too_many_driver_failures_fail_the_job_until_its_spec_changes(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job(restartPolicy={"type": "OnFailure", "maxRetries": 1, "backoff": "100ms"}))
    for attempt in (1, 2):
        pod = f"orders-driver-{attempt}"
        cluster.wait_for(f"{pod} running", lambda pod=pod: cluster.simulated_agent(pod))
        cluster.crash_driver(pod)

    failed = in_phase(cluster, "orders", "Failed")
    assert "restartPolicy.maxRetries=1 exhausted" in failed["message"]
    cluster.wait_for_event("orders", "JobFailed")
    assert {c["type"]: c["status"] for c in failed["conditions"]}["Ready"] == "False"
    time.sleep(1.5)
    assert cluster.status("orders")["jobAttempt"] == 2, "a failed job stays failed"

    # Not while the spec says Suspended (a reviewer's: a driver started, restored, and was
    # stopped with a savepoint again), but once it says Running.
    cluster.patch_spec("orders", {"state": "Suspended"})
    cluster.patch_spec("orders", {"image": "example/orders:2"})
    cluster.wait_for(
        "the change seen", lambda: cluster.status("orders").get("observedGeneration") == 3
    )
    time.sleep(1.5)
    assert cluster.status("orders")["phase"] == "Failed"
    assert cluster.driver_pods("orders") == []
    cluster.patch_spec("orders", {"state": "Running"})

    retried = cluster.wait_for(
        "the job running again",
        lambda: (s := cluster.status("orders")).get("phase") == "Running" and s,
        job="orders",
    )
    assert retried["jobAttempt"] == 3
    assert retried["message"] == ""


def test_a_change_its_driver_ran_with_does_not_retry_a_failed_job(cluster: LocalCluster) -> None:
    """A setting changed in place (the checkpoint interval: no new driver), then the driver
    fails under restartPolicy Never: the failure is of the changed spec, and the job stays
    Failed (a reviewer's: it started again at once, as if the spec had changed since)."""
    cluster.apply(job(restartPolicy={"type": "Never"}))
    completed(cluster, "orders", 1)
    cluster.patch_spec("orders", {"checkpointing": {"interval": "2s"}})
    cluster.wait_for(
        "the change seen", lambda: cluster.status("orders").get("observedGeneration") == 2
    )
    cluster.crash_driver("orders-driver-1", exit_code=1)

    failed = in_phase(cluster, "orders", "Failed")
    assert "restartPolicy is Never" in failed["message"]
    time.sleep(2)
    stays = cluster.status("orders")
    assert (stays["phase"], stays["jobAttempt"]) == ("Failed", 1)
    assert cluster.driver_pods("orders") == []

    cluster.patch_spec("orders", {"checkpointing": {"interval": "3s"}})
    retried = in_phase(cluster, "orders", "Running")
    assert retried["jobAttempt"] == 2
    retry = [e["message"] for e in cluster.events("orders") if e["reason"] == "JobRetried"]
    assert retry == ["the spec changed since the job failed: it runs again"], retry


def test_a_change_made_while_a_failed_jobs_cleanup_runs_retries_it(tmp_path: Path) -> None:
    """The job is Failed (stored) before its cleanup pods run: a change then is one its
    driver never ran, and retries the job (a reviewer's: 808e404 took it for the failed
    driver's, and the job stayed Failed)."""
    with LocalCluster(tmp_path, simulated=SimulatedAgents(cleanup_seconds=6.0)) as cluster:
        cluster.apply(job(restartPolicy={"type": "Never"}))
        completed(cluster, "orders", 1)
        cluster.crash_driver("orders-driver-1", exit_code=1)
        in_phase(cluster, "orders", "Failed")
        cluster.patch_spec("orders", {"restartPolicy": {"type": "OnFailure", "maxRetries": 3}})

        retried = in_phase(cluster, "orders", "Running", timeout=30)
        assert retried["jobAttempt"] == 2


def _driver_deployed_by_an_earlier_operator(cluster: LocalCluster) -> tuple[Any, str]:
    """The job as stored, and its spec's deployment hash, which its running driver's pod is
    annotated with, as the earlier operator wrote once it had deployed the driver from it."""
    stored = cluster.job("orders")
    assert stored is not None
    deployed = objects.deployment_hash(stored["spec"])
    annotations = {"metadata": {"annotations": {objects.ANNOTATION_SPEC_HASH: deployed}}}
    cluster.api.patch(PODS, "default", "orders-driver-1", annotations)
    return stored, deployed


@pytest.mark.parametrize("earlier_operator", ["lastAcceptedSpec", "SpecValid condition only"])
def test_an_upgrade_that_tightens_a_rule_neither_stops_a_running_job_nor_its_next_change(
    cluster: LocalCluster, earlier_operator: str
) -> None:
    """An earlier CRD and operator let a value in that this one refuses: the running
    driver is adopted and coordinated on, the value reported, and a change elsewhere in
    the spec is acted on (as the API server ratchets it). An operator from before
    status.lastAcceptedSpec left its verdict in the SpecValid condition."""
    cluster.apply(job())
    before = completed(cluster, "orders", 2)

    with operator_stopped(cluster):
        reserved = {"name": "SPARK_CHECKPOINT_LEGACY", "value": "set before the rule"}
        with cluster.api.validated_by(SPARK_CHECKPOINT_JOBS_CRD, lambda obj, stored: obj):
            cluster.patch_spec("orders", {"application": {"env": [reserved]}})
        stored, deployed = _driver_deployed_by_an_earlier_operator(cluster)
        status: dict[str, Any] = {"deploymentHash": deployed}
        generation = stored["metadata"]["generation"]
        if earlier_operator == "lastAcceptedSpec":
            status["lastAcceptedSpec"] = json.dumps(stored["spec"])
        else:
            conditions = stored["status"]["conditions"]
            for condition in conditions:
                condition["observedGeneration"] = generation
            status |= {"lastAcceptedSpec": None, "conditions": conditions}
        cluster.api.patch(JOBS, "default", "orders", {"status": status}, subresource="status")

    after = completed(cluster, "orders", before["counts"]["completed"] + 2)
    assert after["jobAttempt"] == 1, "adopted, not upgraded or restarted"
    assert cluster.driver_pods("orders") == ["orders-driver-1"]
    valid = {c["type"]: c for c in after["conditions"]}["SpecValid"]
    assert (valid["status"], valid["reason"]) == ("True", "AcceptedUnchanged")
    assert valid["message"].startswith("spec.application.env[0].name: is set by the operator")
    cluster.wait_for_event("orders", "SpecAcceptedUnchanged", "spec.application.env[0].name")
    if earlier_operator != "lastAcceptedSpec":  # stored by this operator
        assert json.loads(after["lastAcceptedSpec"])["application"]["env"] == [reserved]

    cluster.patch_spec("orders", {"savepointTriggerNonce": 1})
    cluster.wait_for_event("orders", "SavepointCompleted", "nonce 1")
    assert cluster.driver_pods("orders") == ["orders-driver-1"]


def test_a_trigger_nonce_changed_while_the_job_is_suspended_is_said_to_wait_for_it_to_run(
    cluster: LocalCluster,
) -> None:
    """No event said so and status.pending was empty: the request looked lost until the
    job resumed (a Flink user's). As in Flink, it is taken once the job runs."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    cluster.patch_spec("orders", {"state": "Suspended"})
    in_phase(cluster, "orders", "Suspended")

    cluster.patch_spec("orders", {"savepointTriggerNonce": 10})

    cluster.wait_for_event(
        "orders",
        "TriggerWaiting",
        "spec.savepointTriggerNonce 10: the job is Suspended; its savepoint is taken once it runs",
    )
    cluster.patch_spec("orders", {"checkpointing": {"interval": "2s"}})  # another change
    cluster.patch_spec("orders", {"state": "Running"})
    cluster.wait_for_event("orders", "SavepointCompleted", "nonce 10")
    assert cluster.event_reasons("orders").count("TriggerWaiting") == 1


def test_a_trigger_nonce_changed_while_the_driver_stops_for_a_suspension_is_said_to_wait(
    tmp_path: Path,
) -> None:
    """Read while the suspended driver was still exiting (phase Suspending), the nonce was
    in the spec the controller compared with once the job was Suspended: nothing said."""
    agents = SimulatedAgents(batch_seconds=0.3, exit_seconds=4.0)  # a stopping driver's exit
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())
        completed(cluster, "orders", 1)
        cluster.patch_spec("orders", {"state": "Suspended"})
        in_phase(cluster, "orders", "Suspending")

        cluster.patch_spec("orders", {"savepointTriggerNonce": 10})

        cluster.wait_for_event("orders", "TriggerWaiting", "spec.savepointTriggerNonce 10")
        assert cluster.status("orders")["phase"] == "Suspended"


def test_a_job_created_suspended_is_suspended_until_it_is_set_running(
    cluster: LocalCluster,
) -> None:
    """It showed phase Pending with Ready "waiting to start" (a reviewer's): a GitOps health
    check read it as progressing for ever."""
    cluster.apply(job(state="Suspended"))

    suspended = in_phase(cluster, "orders", "Suspended")
    assert suspended["message"] == "created suspended; starts when spec.state is Running"
    assert cluster.pods("orders") == []
    cluster.patch_spec("orders", {"state": "Running"})
    started = completed(cluster, "orders", 1)
    assert started["jobAttempt"] == 1
    assert started["message"] == ""


def test_the_accepted_spec_of_a_job_that_does_not_run_is_stored_at_once(
    cluster: LocalCluster,
) -> None:
    """Nothing else writes the status of a suspended job: the spec the next operator
    ratchets against must not be an older one."""
    cluster.apply(job(state="Suspended"))
    variable = {"name": "REGION", "value": "eu"}
    cluster.wait_for("the spec in status", lambda: cluster.status("orders").get("lastAcceptedSpec"))
    cluster.patch_spec("orders", {"application": {"env": [variable]}})

    def accepted() -> Any:
        text = cluster.status("orders").get("lastAcceptedSpec")
        return text and json.loads(text)["application"].get("env") == [variable]

    cluster.wait_for("the changed spec in status", accepted, job="orders")
    assert cluster.pods("orders") == []


def test_a_running_job_whose_spec_became_invalid_goes_on_across_an_operator_restart(
    cluster: LocalCluster,
) -> None:
    """The last valid spec stays in effect for a running driver, also for the next
    operator process (status.lastAcceptedSpec): its driver is adopted and coordinated."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    cluster.patch_spec("orders", {"image": None})  # only the operator refuses that
    cluster.wait_for_event("orders", "InvalidSpec", "spec.image")

    with operator_stopped(cluster):
        pass
    before = cluster.status("orders")["counts"]["completed"]

    after = completed(cluster, "orders", before + 2)
    assert after["jobAttempt"] == 1, "adopted, not restarted"
    assert cluster.driver_pods("orders") == ["orders-driver-1"]
    valid = {c["type"]: c for c in after["conditions"]}["SpecValid"]
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert valid["message"].startswith("spec.image: required on a cluster")

    cluster.patch_spec("orders", {"image": "example/orders:1"})
    cluster.wait_for(
        "SpecValid again",
        lambda: (
            {c["type"]: c["status"] for c in cluster.status("orders")["conditions"]}["SpecValid"]
            == "True"
        ),
    )
    completed(cluster, "orders", after["counts"]["completed"] + 1)
    assert cluster.driver_pods("orders") == ["orders-driver-1"], "the same spec: no upgrade"


def test_a_changed_storage_is_refused_and_the_job_goes_on_where_its_checkpoints_are(
    cluster: LocalCluster,
) -> None:
    """A reviewer's: the running driver kept the old storage, the next one (an upgrade, a
    resume) got the new one with restore candidates that lay in the old, failed the job, and
    the old storage was never cleaned."""
    cluster.apply(job())
    completed(cluster, "orders", 2)

    cluster.patch_spec("orders", {"checkpointing": {"storage": "file:///elsewhere"}})

    cluster.wait_for_event(
        "orders",
        "InvalidSpec",
        "spec.checkpointing.storage: cannot change from 'file:///simulated' to 'file:///elsewhere'",
    )
    before = cluster.status("orders")["counts"]["completed"]
    after = completed(cluster, "orders", before + 2)
    assert cluster.driver_pods("orders") == ["orders-driver-1"]
    assert after["lastCheckpoint"]["path"].startswith("file:///simulated/"), after
    # The same storage spelled otherwise is no move (a reviewer's).
    cluster.patch_spec("orders", {"checkpointing": {"storage": "file:///simulated/"}})
    valid = cluster.wait_for(
        "SpecValid again",
        lambda: (
            (s := cluster.status("orders"))["observedGeneration"] == 3
            and {c["type"]: c["status"] for c in s["conditions"]}["SpecValid"] == "True"
        ),
    )
    assert valid


def test_the_storage_of_a_job_without_images_may_change(cluster: LocalCluster) -> None:
    """Nothing is where it was (a job created suspended, or failed on a mistyped storage):
    the change was refused, and such a job could only be deleted (a reviewer's)."""
    cluster.apply(job(state="Suspended"))
    in_phase(cluster, "orders", "Suspended")

    cluster.patch_spec(
        "orders", {"state": "Running", "checkpointing": {"storage": "file:///elsewhere"}}
    )

    completed(cluster, "orders", 1)
    pod = cluster.api.get(PODS, "default", "orders-driver-1")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["SPARK_CHECKPOINT_STORAGE"] == "file:///elsewhere"


@pytest.mark.parametrize(
    ("tampering", "why"),
    [
        ("another image", "it was not built from the spec accepted before"),
        ("a refused value", "the spec accepted before cannot run either: spec.application.env"),
        # Said as it is (it read 'not built from the spec accepted before': a reviewer).
        ("the pod gone", "its pod is gone"),
    ],
)
def test_a_status_write_alone_never_chooses_what_an_invalid_specs_driver_runs_under(
    cluster: LocalCluster, tampering: str, why: str
) -> None:
    """status.lastAcceptedSpec is only a spec the recorded driver's pod was built from,
    checked as a spec is: anyone who may write a job's status could otherwise choose the
    image, service account or env of the pods the operator creates for it."""
    cluster.apply(job())
    completed(cluster, "orders", 2)
    cluster.patch_spec("orders", {"image": None})
    cluster.wait_for_event("orders", "InvalidSpec", "spec.image")

    with operator_stopped(cluster):
        stored = cluster.job("orders")
        assert stored is not None
        accepted = json.loads(stored["status"]["lastAcceptedSpec"])
        if tampering == "another image":
            accepted["image"] = "attacker/image:1"
        elif tampering == "a refused value":
            accepted["application"]["env"] = [{"name": "POD_IP", "value": "10.0.0.1"}]
        else:
            cluster.api.delete("v1/pods", "default", "orders-driver-1")
        cluster.api.patch(
            JOBS,
            "default",
            "orders",
            {"status": {"lastAcceptedSpec": json.dumps(accepted)}},
            subresource="status",
        )

    event = cluster.wait_for_event("orders", "DriverNotAdopted", why)
    assert event["message"].startswith("driver orders-driver-1 waits for a valid spec: ")
    assert not [e for e in cluster.events("orders") if e["reason"] == "DriverAdopted"]
    left = [] if tampering == "the pod gone" else ["orders-driver-1"]
    assert cluster.driver_pods("orders") == left, "nothing launched"


@pytest.mark.parametrize(
    "lacking",
    [
        [("restartPolicy", "startTimeout", "5m")],
        [("restartPolicy", "heartbeatTimeout", "60s"), ("restartPolicy", "startTimeout", "5m")],
        [
            ("checkpointing", "verifyRestorable", False),
            ("restartPolicy", "heartbeatTimeout", "60s"),
            ("restartPolicy", "startTimeout", "5m"),
        ],
    ],
    ids=["before-startTimeout", "before-heartbeatTimeout", "before-verifyRestorable"],
)
def test_a_failed_job_stays_failed_when_a_newer_crd_defaults_a_new_field(
    cluster: LocalCluster, lacking: list[tuple[str, str, Any]]
) -> None:
    """The API server fills in the fields the CRD gained when it reads a stored job: for
    the operator that is no change of the spec, which would run a Failed job again."""
    cluster.apply(job(restartPolicy={"type": "Never"}))
    cluster.wait_for("a driver", lambda: cluster.simulated_agent("orders-driver-1"))
    cluster.crash_driver("orders-driver-1")
    cluster.wait_for("Failed", lambda: cluster.status("orders").get("phase") == "Failed")

    with operator_stopped(cluster):
        # What the operator of an earlier CRD stored: the spec's hash without those fields
        # (nor spec.rollback, which every earlier CRD lacked).
        spec = cluster.job("orders")["spec"]  # type: ignore[index]
        for section, field, default in lacking:
            assert spec[section].pop(field) == default
        spec.pop("rollback")
        relevant = {
            key: value
            for key, value in spec.items()
            if key not in ("checkpointTriggerNonce", "savepointTriggerNonce", "state")
        }
        text = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
        earlier = hashlib.sha256(text.encode()).hexdigest()[:16]
        cluster.api.patch(
            JOBS,
            "default",
            "orders",
            {"status": {"stoppedSpecHash": earlier}},
            subresource="status",
        )

    cluster.wait_for("the operator back", lambda: cluster.operator.running)
    time.sleep(3)
    status = cluster.status("orders")
    assert (status["phase"], status["jobAttempt"]) == ("Failed", 1)
    assert (
        cluster.driver_pods("orders") == ["orders-driver-1"] or cluster.driver_pods("orders") == []
    )


def test_a_restore_that_fails_on_its_image_falls_back_and_says_so(tmp_path: Path) -> None:
    """A restored driver exits RESTORE_UNUSABLE: the image goes to status.unrestorable, an
    event says so, and the next driver restores the previous image (not a retry: maxRetries
    is 1 and the first crash used it); an operator restart does not try the image again."""
    agents = SimulatedAgents(batch_seconds=0.3, restore_seconds=3.0)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(restartPolicy={"type": "OnFailure", "maxRetries": 1, "backoff": "100ms"}))
        completed(cluster, "orders", 2)
        cluster.crash_driver("orders-driver-1", exit_code=1)
        second = cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
        newest = second.restored_from
        registered = cluster.status("orders")["coordinator"]["checkpoints"]
        previous = f"checkpoint:{sorted(c['id'] for c in registered)[-2]}"
        assert newest == f"checkpoint:{max(c['id'] for c in registered)}"
        cluster.crash_driver("orders-driver-2", exit_code=5)  # DriverExit.RESTORE_UNUSABLE

        third = cluster.wait_for("driver 3", lambda: cluster.simulated_agent("orders-driver-3"))
        assert third.restored_from == previous
        status = cluster.wait_for(
            "the fallback restored and running",
            lambda: (
                (s := cluster.status("orders")).get("phase") == "Running"
                and s["counts"]["restored"] == 1
                and s
            ),
            job="orders",
        )
        assert [e["source"] for e in status["unrestorable"]] == [newest]
        assert status["counts"]["failedRestores"] == 1
        assert status["restoredFrom"]["source"] == previous
        event = cluster.wait_for_event("orders", "RestoreFailed", f"{newest} cannot be restored")
        assert event["type"] == "Warning"
        assert event["message"].endswith(f"falling back to {previous}")

        # A checkpoint of its own, so its crash restarts it again under maxRetries 1 (the
        # restarted operator goes on with the count: without it, the job fails).
        completed(cluster, "orders", status["counts"]["completed"] + 1)
        # The count of restarts in a row is reset in a write after the completion's: an
        # operator killed between the two would fail the job (seen under load).
        cluster.wait_for("restarts reset", lambda: cluster.status("orders").get("restarts", 0) == 0)
        with operator_stopped(cluster):
            cluster.crash_driver("orders-driver-3", exit_code=1)
        fourth = cluster.wait_for("driver 4", lambda: cluster.simulated_agent("orders-driver-4"))
        assert fourth.restored_from != newest, "the operator read the unrestorable image back"


def test_an_operator_restart_neither_resets_the_restart_count_nor_cuts_the_backoff(
    cluster: LocalCluster,
) -> None:
    """Both lived in the operator's memory: a restarted operator restarted the driver at
    once and counted from 0, so maxRetries never failed a job whose operator restarted
    between its failures (a Flink operator user's)."""
    policy = {"type": "OnFailure", "maxRetries": 1, "backoff": "4s"}
    cluster.apply(
        job(
            checkpointing={**job()["spec"]["checkpointing"], "interval": "0s"}, restartPolicy=policy
        )
    )
    in_phase(cluster, "orders", "Running")
    cluster.crash_driver("orders-driver-1", exit_code=1)
    restarting = in_phase(cluster, "orders", "Restarting")
    assert restarting["restarts"] == 1 and restarting["restartDue"], restarting

    with operator_stopped(cluster):
        pass
    time.sleep(1.0)
    assert cluster.driver_pods("orders") == [], "the backoff was waited out"
    cluster.wait_for("driver 2", lambda: cluster.simulated_agent("orders-driver-2"))
    cluster.crash_driver("orders-driver-2", exit_code=1)

    failed = in_phase(cluster, "orders", "Failed")
    assert "restartPolicy.maxRetries=1 exhausted" in failed["message"], failed
    assert (failed["restarts"], failed.get("restartDue")) == (0, None)


def test_a_second_operator_of_the_namespace_waits_and_takes_over_once_the_first_stops(
    tmp_path: Path,
) -> None:
    """A hostile reviewer's: two operators serving one namespace (chart releases whose
    namespaces overlap, one run by hand beside the chart's) both drove every job; after a
    driver crash the one whose registry was empty started the next driver from nothing,
    ids from 1 again. Now the job's Lease decides: the other waits, says so, and takes the
    job over (adopting its driver) once the first stops."""
    with LocalCluster(tmp_path, simulated=SimulatedAgents(batch_seconds=0.3)) as cluster:
        second = OperatorProcess(tmp_path / "kubeconfig", tmp_path / "operator-2.log", (NAMESPACE,))
        second.pod = "spark-checkpoint-operator-1"
        second.start()
        try:
            cluster.apply(job())
            before = completed(cluster, "orders", 2)
            lease = cluster.api.get(LEASES, NAMESPACE, "orders.sparkcheckpoint.io")
            holder = lease["spec"]["holderIdentity"]
            driving, waiting = (
                (cluster.operator, second)
                if holder == cluster.operator.pod
                else (second, cluster.operator)
            )
            told = cluster.wait_for_event("orders", "AnotherOperator")
            assert told["message"].startswith(f"operator {holder} holds this job's Lease")

            cluster.crash_driver("orders-driver-1")
            restored = cluster.wait_for(
                "a restore",
                lambda: (s := cluster.status("orders")).get("counts", {}).get("restored") and s,
            )
            assert restored["coordinator"]["nextCheckpointId"] > before["lastCheckpoint"]["id"]
            logs = driving.log_path.read_text() + waiting.log_path.read_text()
            assert logs.count("starting driver attempt") == 2, logs

            driving.stop()  # releases the Lease on its way out
            # Kopf waited for no daemon at its exit: a warning per job (a Flink user's).
            assert "did not exit in time" not in driving.log_path.read_text()
            cluster.wait_for_event("orders", "DriverAdopted", timeout=60)
            done = cluster.status("orders")["counts"]["completed"]
            after = completed(cluster, "orders", done + 2)
            assert after["jobAttempt"] == 2
            assert "orders: starting driver" not in waiting.log_path.read_text()
        finally:
            second.stop()


@contextlib.contextmanager
def _two_operators(tmp_path: Path) -> Iterator[tuple[LocalCluster, OperatorProcess]]:
    """The cluster's operator, started, and a second one (another pod: another holder of
    Leases), not started; both with the shortest Lease."""
    with LocalCluster(
        tmp_path, simulated=SimulatedAgents(batch_seconds=0.3), operator=False
    ) as cluster:
        second = OperatorProcess(tmp_path / "kubeconfig", tmp_path / "operator-2.log", (NAMESPACE,))
        second.pod = "spark-checkpoint-operator-1"
        for operator in (cluster.operator, second):
            operator.settings[LEASE_SECONDS_VARIABLE] = str(MIN_LEASE_SECONDS)
        cluster.operator.start()
        try:
            yield cluster, second
        finally:
            second.stop()


def _series_of(operator: OperatorProcess, job_name: str) -> dict[str, float]:
    text = urllib.request.urlopen(operator.metrics_url, timeout=5).read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("job_name") == job_name
    }


def test_an_operator_that_lost_a_jobs_lease_stops_serving_its_metrics(tmp_path: Path) -> None:
    """The other operator drives the job now, and serves its metrics: the first one's would
    stand still beside them (a frozen last completion, as if its checkpoints had stalled)."""
    with _two_operators(tmp_path) as (cluster, second):
        cluster.apply(job())
        completed(cluster, "orders", 1)
        second.start()
        cluster.wait_for_event("orders", "AnotherOperator")
        assert _series_of(cluster.operator, "orders")

        # As when the first could not renew it in time and the second took it over.
        cluster.api.patch(
            LEASES,
            NAMESPACE,
            "orders.sparkcheckpoint.io",
            {"spec": {"holderIdentity": second.pod}},
        )

        cluster.wait_for("the second serving its metrics", lambda: _series_of(second, "orders"))
        cluster.wait_for(
            "the first's series gone", lambda: not _series_of(cluster.operator, "orders")
        )
        assert "holds the job's Lease now" in cluster.operator.log_path.read_text()


def test_a_job_deleted_after_its_operator_was_killed_is_deleted_by_the_other_once_the_lease_expires(
    tmp_path: Path,
) -> None:
    """The holder of a job's Lease killed outright (`kill -9`, a lost node) releases nothing:
    the other operator waits until the Lease has gone unrenewed for its duration, then does
    the deletion, the final savepoint from the driver that ran on, and releases the job."""
    seconds = MIN_LEASE_SECONDS
    with _two_operators(tmp_path) as (cluster, second):
        cluster.apply(job(shutdown={"finalSavepoint": True}))
        completed(cluster, "orders", 1)
        second.start()
        told = cluster.wait_for_event("orders", "AnotherOperator")
        assert f"leaves it unrenewed for {seconds} s" in told["message"]

        cluster.operator.kill()
        killed = time.monotonic()
        cluster.delete("orders")

        cluster.wait_for("the job gone", lambda: cluster.job("orders") is None, timeout=90)
        # Unrenewed for its duration since the last renewal seen, up to a third before the kill.
        assert time.monotonic() - killed >= seconds * 2 / 3
        cluster.wait_for_event("orders", "SavepointCompleted")
        cluster.wait_for_event("orders", "JobCancelled")
        assert "holds the job's Lease; its deletion waits for it" in second.log_path.read_text()
        cluster.wait_for("pods gone", lambda: cluster.pods("orders") == [])
