"""SparkCheckpointSnapshot objects (the Flink Kubernetes Operator's FlinkStateSnapshot): the
operator process against the emulated API server with simulated drivers, as a user applies
them with kubectl or a GitOps tool."""

import time
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from helpers.doc_blocks import marked_blocks
from helpers.kube.cluster import JOBS, NAMESPACE, LocalCluster, operator_stopped, refused_requests
from helpers.kube.simulated import SimulatedAgents
from helpers.kube.simulated_jobs import completed, in_phase, job, savepoint_by_nonce
from spark_checkpoint.storage.layout import parse_snapshot_address
from spark_checkpoint_operator.coordinator import CheckpointKind
from spark_checkpoint_operator.kubernetes.snapshots import FINALIZER, MIRROR_COMPONENT

pytestmark = pytest.mark.timeout(240)
SNAPSHOTS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointsnapshots"
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"


def snapshot(name: str, job_name: str = "orders", kind: str = "savepoint", **spec: Any) -> Any:
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointSnapshot",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"jobReference": {"name": job_name}, kind: {}, **spec},
    }


def snapshot_status(cluster: LocalCluster, name: str) -> dict[str, Any]:
    return dict(cluster.api.get(SNAPSHOTS, NAMESPACE, name).get("status") or {})


def in_state(cluster: LocalCluster, name: str, state: str, timeout: float = 60) -> Any:
    return cluster.wait_for(
        f"snapshot {name} {state}",
        lambda: (s := snapshot_status(cluster, name)).get("state") == state and s,
        job="orders",
        timeout=timeout,
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with LocalCluster(tmp_path, simulated=SimulatedAgents(batch_seconds=0.3)) as running:
        yield running


def test_a_savepoint_snapshot_is_taken_once_and_its_status_says_where(
    cluster: LocalCluster,
) -> None:
    cluster.apply(job())
    completed(cluster, "orders", 1)
    created = cluster.api.create(SNAPSHOTS, snapshot("before-migration"), namespace=NAMESPACE)

    status = in_state(cluster, "before-migration", "COMPLETED")
    job_status = cluster.status("orders")
    said = cluster.wait_for(
        "the snapshot's event",
        lambda: [e for e in cluster.events("before-migration") if e.get("reason")],
    )

    label = f"snapshot before-migration ({created['metadata']['uid'][:8]})"
    taken = [s for s in job_status["savepointHistory"] if s.get("label") == label]
    assert len(taken) == 1, job_status["savepointHistory"]
    assert status["kind"] == "savepoint"
    assert status["id"] == taken[0]["id"]
    assert status["path"] == taken[0]["path"]
    assert status["path"].endswith(f"/savepoints/sp-{status['id']}/_metadata")
    assert status["batch"] == taken[0]["batch"]
    assert status["failures"] == 0
    assert "error" not in status and "message" not in status
    assert status["triggerTimestamp"] <= status["resultTimestamp"]
    assert [(e["reason"], e["message"], e["involvedObject"]["kind"]) for e in said] == [
        (
            "SnapshotCompleted",
            f"savepoint {status['id']} completed: {status['path']}",
            "SparkCheckpointSnapshot",
        )
    ]


def test_the_documented_snapshot_is_taken(tmp_path: Path) -> None:
    """docs/operator.md's example, as written (its namespace and job's name)."""
    (block,) = marked_blocks(
        "tests/kubernetes/test_snapshot_objects.py::test_the_documented_snapshot_is_taken"
    )
    documented = yaml.safe_load(block.text)
    namespace = documented["metadata"]["namespace"]
    name = documented["metadata"]["name"]
    agents = SimulatedAgents(batch_seconds=0.3)
    with LocalCluster(tmp_path, simulated=agents, namespaces=(namespace,)) as cluster:
        orders = job(documented["spec"]["jobReference"]["name"])
        orders["metadata"]["namespace"] = namespace
        cluster.apply(orders)
        cluster.api.create(SNAPSHOTS, documented, namespace=namespace)
        status = cluster.wait_for(
            "the documented snapshot taken",
            lambda: (
                (s := cluster.api.get(SNAPSHOTS, namespace, name).get("status") or {}).get("state")
                == "COMPLETED"
                and s
            ),
        )
        stored = cluster.api.get(SNAPSHOTS, namespace, name)

    assert stored["spec"]["backoffLimit"] == 2
    assert status["kind"] == "savepoint"
    assert f"/{namespace}/orders/savepoints/sp-{status['id']}/" in status["path"]


def test_the_documented_existing_savepoint_is_kept(tmp_path: Path) -> None:
    """docs/operator.md's alreadyExists example, as written but its path: the simulated
    job's storage is a local one, so the test names the job's own savepoint there; the
    documented path is one of the same job's in an s3a:// storage."""
    (block,) = marked_blocks(
        "tests/kubernetes/test_snapshot_objects.py::test_the_documented_existing_savepoint_is_kept"
    )
    documented = yaml.safe_load(block.text)
    namespace = documented["metadata"]["namespace"]
    name = documented["metadata"]["name"]
    job_name = documented["spec"]["jobReference"]["name"]
    address = parse_snapshot_address(documented["spec"]["savepoint"]["path"])
    assert (address.kind, address.snapshot_id) == (CheckpointKind.SAVEPOINT, 42)
    assert address.layout.job_root.endswith(f"/{namespace}/{job_name}")
    agents = SimulatedAgents(batch_seconds=0.3)
    with LocalCluster(tmp_path, simulated=agents, namespaces=(namespace,)) as cluster:
        orders = job(job_name, savepoints={"historyMaxCount": 1})
        orders["metadata"]["namespace"] = namespace
        cluster.apply(orders)
        cluster.wait_for(
            "a checkpoint",
            lambda: cluster.job(job_name, namespace).get("status", {}).get("lastCheckpoint"),
        )
        cluster.patch_spec(job_name, {"savepointTriggerNonce": 1}, namespace=namespace)
        taken = cluster.wait_for(
            "a savepoint",
            lambda: cluster.status(job_name, namespace).get("lastSavepoint"),
        )
        documented["spec"]["savepoint"]["path"] = taken["path"]
        cluster.api.create(SNAPSHOTS, documented, namespace=namespace)
        status = cluster.wait_for(
            "the documented savepoint kept",
            lambda: (
                (s := cluster.api.get(SNAPSHOTS, namespace, name).get("status") or {}).get("state")
                == "COMPLETED"
                and s
            ),
        )
        history = cluster.status(job_name, namespace)["savepointHistory"]

    assert (status["id"], status["path"]) == (taken["id"], taken["path"])
    assert [s.get("pinned") for s in history if s["id"] == taken["id"]] == [True]


def test_a_checkpoint_snapshot_completes_with_its_checkpoint(cluster: LocalCluster) -> None:
    cluster.apply(job(checkpointing={"interval": "0s"}))
    in_phase(cluster, "orders", "Running")
    cluster.api.create(SNAPSHOTS, snapshot("now", kind="checkpoint"), namespace=NAMESPACE)

    status = in_state(cluster, "now", "COMPLETED")

    assert status["kind"] == "checkpoint"
    assert cluster.status("orders")["lastCheckpoint"]["id"] == status["id"]
    assert status["path"].endswith(f"/chk-{status['id']}/_metadata")


def test_a_snapshot_applied_before_its_job_waits_for_it(cluster: LocalCluster) -> None:
    """A GitOps sync applies objects in any order."""
    cluster.api.create(SNAPSHOTS, snapshot("early"), namespace=NAMESPACE)
    waiting = in_state(cluster, "early", "TRIGGER_PENDING")
    assert waiting["message"] == "waits for SparkCheckpointJob orders, which does not exist"

    cluster.apply(job())

    assert in_state(cluster, "early", "COMPLETED")["kind"] == "savepoint"


def test_a_suspended_job_takes_its_snapshot_once_it_runs_again(cluster: LocalCluster) -> None:
    cluster.apply(job(state="Suspended"))
    in_phase(cluster, "orders", "Suspended")
    cluster.api.create(SNAPSHOTS, snapshot("later"), namespace=NAMESPACE)

    waiting = cluster.wait_for(
        "the snapshot to say what it waits for",
        lambda: (s := snapshot_status(cluster, "later")).get("message") and s,
        job="orders",
    )
    assert waiting["state"] == "TRIGGER_PENDING"
    assert waiting["message"] == "waits for the job to run (phase Suspended)"
    cluster.patch_spec("orders", {"state": "Running"})

    assert in_state(cluster, "later", "COMPLETED")["id"] >= 1


def test_a_snapshot_of_a_finished_job_is_abandoned(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, simulated=SimulatedAgents(finish_after=2)) as cluster:
        cluster.apply(job())
        in_phase(cluster, "orders", "Finished")
        cluster.api.create(SNAPSHOTS, snapshot("too-late"), namespace=NAMESPACE)

        status = in_state(cluster, "too-late", "ABANDONED")
        reasons = cluster.wait_for("its event", lambda: cluster.event_reasons("too-late"))

    assert status["error"] == "the job is Finished: nothing runs to take it"
    assert reasons == ["SnapshotAbandoned"]


def test_a_failing_snapshot_is_retried_up_to_its_backoff_limit(tmp_path: Path) -> None:
    """Every savepoint expires (acknowledged after the checkpoint timeout): taken once,
    then once more (backoffLimit 1, after 10 s), then FAILED with the reason."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(3.0, 3.5))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s", "timeout": "1s"}))
        in_phase(cluster, "orders", "Running")
        cluster.api.create(SNAPSHOTS, snapshot("doomed", backoffLimit=1), namespace=NAMESPACE)

        retrying = cluster.wait_for(
            "the first failure",
            lambda: (s := snapshot_status(cluster, "doomed")).get("failures") == 1 and s,
            job="orders",
        )
        status = in_state(cluster, "doomed", "FAILED", timeout=90)
        job_status = cluster.status("orders")
        said = cluster.wait_for(
            "two SnapshotError events",
            lambda: len(errors := [e["message"] for e in cluster.events("doomed")]) == 2 and errors,
        )

    assert retrying["state"] == "TRIGGER_PENDING"
    assert retrying["message"].startswith("taken again at ")
    assert "expired" in retrying["error"], retrying
    assert status["failures"] == 2
    assert status["message"] == "failed 2 time(s), spec.backoffLimit 1: not taken again"
    failed_savepoints = [
        h for h in job_status["history"] if h["kind"] == "savepoint" and h["status"] == "Failed"
    ]
    assert len(failed_savepoints) == 2, job_status["history"]
    first, last = sorted(said, key=lambda message: "not taken again" in message)  # any order
    assert first.startswith(retrying["error"] + "; taken again at ")
    assert last.endswith("; failed 2 time(s), spec.backoffLimit 1: not taken again")


def test_an_operator_restart_mid_snapshot_takes_it_once(tmp_path: Path) -> None:
    """The savepoint in flight when the operator is killed is aborted with its coordinator;
    the restarted operator asks for it again, and the snapshot completes once."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(2.0, 2.5))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s"}))
        in_phase(cluster, "orders", "Running")
        created = cluster.api.create(SNAPSHOTS, snapshot("restarted"), namespace=NAMESPACE)
        in_state(cluster, "restarted", "IN_PROGRESS")
        with operator_stopped(cluster):
            pass

        status = in_state(cluster, "restarted", "COMPLETED")
        job_status = cluster.status("orders")

    label = f"snapshot restarted ({created['metadata']['uid'][:8]})"
    taken = [s["id"] for s in job_status["savepointHistory"] if s.get("label") == label]
    assert taken == [status["id"]]


def test_without_the_snapshot_crd_jobs_run_as_before(tmp_path: Path) -> None:
    """An operator upgrade that applied only the jobs' CRD: Kopf serves what it finds."""
    agents = SimulatedAgents(batch_seconds=0.3)
    with LocalCluster(tmp_path, simulated=agents, operator=False) as cluster:
        cluster.api.delete(CRDS, None, "sparkcheckpointsnapshots.sparkcheckpoint.io")
        cluster.operator.start()
        cluster.apply(job())
        status = completed(cluster, "orders", 2)
        log = cluster.operator.log_tail()

    assert status["phase"] == "Running"
    assert "Traceback" not in log, log


def _history(cluster: LocalCluster) -> list[dict[str, Any]]:
    return list(cluster.status("orders").get("savepointHistory") or [])


def test_a_snapshots_savepoint_is_kept_past_the_history_until_its_object_goes(
    cluster: LocalCluster,
) -> None:
    """Pinned: the job's savepoint history (historyMaxCount 1 here) lets other savepoints
    go, not this one; deleting the object (disposeOnDelete false) hands it back to the
    history, which lets it go (the newer one is the one it keeps)."""
    cluster.apply(job(savepoints={"historyMaxCount": 1}))
    completed(cluster, "orders", 1)
    keep = snapshot("keep-me", savepoint={"disposeOnDelete": False})
    cluster.api.create(SNAPSHOTS, keep, namespace=NAMESPACE)
    kept = in_state(cluster, "keep-me", "COMPLETED")["id"]
    for nonce in (1, 2):
        cluster.patch_spec("orders", {"savepointTriggerNonce": nonce})
        cluster.wait_for(
            f"savepoint of nonce {nonce}",
            lambda: (
                (s := cluster.status("orders")).get("lastSavepoint", {}).get("label")
                == f"nonce {nonce}"  # noqa: B023 (waited for within the loop)
                and s
            ),
            job="orders",
        )
    history = _history(cluster)
    assert [(s["id"], s.get("pinned", False)) for s in history][-1] == (kept, True)
    # Not the pinned one's pin (or label), which a merge patch of the status kept.
    assert cluster.status("orders")["lastSavepoint"]["label"] == "nonce 2"
    assert "pinned" not in cluster.status("orders")["lastSavepoint"]
    assert len(history) == 2, history  # the pinned one, and the newest

    cluster.api.delete(SNAPSHOTS, NAMESPACE, "keep-me")

    cluster.wait_for(
        "the released savepoint let go",
        lambda: kept not in [s["id"] for s in _history(cluster)],
        job="orders",
    )
    assert "SavepointReleased" in cluster.event_reasons("orders")
    assert len(_history(cluster)) == 1


def _gone(cluster: LocalCluster, name: str) -> Any:
    return cluster.wait_for(
        f"snapshot {name} gone",
        lambda: name not in [o["metadata"]["name"] for o in cluster.api.list(SNAPSHOTS, NAMESPACE)],
        job="orders",
    )


def _ids(cluster: LocalCluster) -> list[int]:
    return [s["id"] for s in _history(cluster)]


def test_a_deleted_objects_savepoint_is_disposed_of_by_default(cluster: LocalCluster) -> None:
    """Flink's disposeOnDelete (true by default), read at the deletion (a finalizer holds
    the object until the operator saw it): the savepoint goes with its object, though the
    history has room for it; one another object stands for stays until that one goes too;
    an edit to false just before the deletion keeps it (in the history); an object deleted
    while no operator runs waits for one."""
    cluster.apply(job(savepoints={"historyMaxCount": 10}))
    completed(cluster, "orders", 1)
    for name in ("first", "second", "third"):
        cluster.api.create(SNAPSHOTS, snapshot(name), namespace=NAMESPACE)
    first, second, third = (in_state(cluster, n, "COMPLETED") for n in ("first", "second", "third"))
    also = snapshot("also-first", savepoint={"alreadyExists": True, "path": first["path"]})
    cluster.api.create(SNAPSHOTS, also, namespace=NAMESPACE)
    assert in_state(cluster, "also-first", "COMPLETED")["id"] == first["id"]
    cluster.wait_for(
        "the finalizers",
        lambda: all(
            FINALIZER in (o["metadata"].get("finalizers") or ())
            for o in cluster.api.list(SNAPSHOTS, NAMESPACE)
        ),
        job="orders",
    )

    cluster.api.delete(SNAPSHOTS, NAMESPACE, "first")
    _gone(cluster, "first")
    assert first["id"] in _ids(cluster)  # also-first stands for it
    cluster.api.delete(SNAPSHOTS, NAMESPACE, "also-first")
    _gone(cluster, "also-first")
    cluster.wait_for("it disposed of", lambda: first["id"] not in _ids(cluster), job="orders")
    cluster.wait_for_event("orders", "SavepointReleased", "disposed of (spec.savepoint.dispo")

    edited = {"spec": {"savepoint": {"disposeOnDelete": False}}}
    cluster.api.patch(SNAPSHOTS, NAMESPACE, "second", edited)
    cluster.api.delete(SNAPSHOTS, NAMESPACE, "second")  # at once: the finalizer waits
    _gone(cluster, "second")
    cluster.wait_for(
        "the savepoint handed to the history",
        lambda: [s.get("pinned") for s in _history(cluster) if s["id"] == second["id"]] == [None],
        job="orders",
    )

    with operator_stopped(cluster):
        cluster.api.delete(SNAPSHOTS, NAMESPACE, "third")
        time.sleep(1)
        assert "third" in [o["metadata"]["name"] for o in cluster.api.list(SNAPSHOTS, NAMESPACE)]
    _gone(cluster, "third")
    cluster.wait_for("it disposed of", lambda: third["id"] not in _ids(cluster), job="orders")
    assert second["id"] in _ids(cluster)


def _held(cluster: LocalCluster, name: str) -> Any:
    return cluster.wait_for(
        f"snapshot {name} held",
        lambda: (
            FINALIZER
            in (cluster.api.get(SNAPSHOTS, NAMESPACE, name)["metadata"].get("finalizers") or ())
        ),
        job="orders",
    )


def test_a_deletion_while_the_job_is_suspended_waits_for_it_to_run(
    cluster: LocalCluster,
) -> None:
    """No driver runs to dispose of the savepoint (or to hand it to the history): the
    object waits (as Flink's, for its cluster), and goes, with its savepoint, once the job
    runs again."""
    cluster.apply(job(savepoints={"historyMaxCount": 10}))
    completed(cluster, "orders", 1)
    cluster.api.create(SNAPSHOTS, snapshot("later"), namespace=NAMESPACE)
    cluster.api.create(SNAPSHOTS, snapshot("kept"), namespace=NAMESPACE)
    taken, handed = in_state(cluster, "later", "COMPLETED"), in_state(cluster, "kept", "COMPLETED")
    _held(cluster, "later")
    _held(cluster, "kept")
    cluster.patch_spec("orders", {"state": "Suspended"})
    in_phase(cluster, "orders", "Suspended")

    cluster.api.delete(SNAPSHOTS, NAMESPACE, "later")
    edited = {"spec": {"savepoint": {"disposeOnDelete": False}}}
    cluster.api.patch(SNAPSHOTS, NAMESPACE, "kept", edited)  # still held: no driver runs
    cluster.api.delete(SNAPSHOTS, NAMESPACE, "kept")
    waiting = cluster.wait_for(
        "the waits said",
        lambda: (
            (later := snapshot_status(cluster, "later").get("message"))
            and (kept := snapshot_status(cluster, "kept").get("message"))
            and (later, kept)
        ),
        job="orders",
    )
    assert waiting == (
        "its deletion waits for the job to run (phase Suspended) to dispose of its savepoint",
        "its deletion waits for the job to run (phase Suspended) to hand its savepoint to the "
        "savepoint history",
    )
    assert cluster.api.get(SNAPSHOTS, NAMESPACE, "later")["metadata"]["deletionTimestamp"]
    assert taken["id"] in _ids(cluster)
    cluster.patch_spec("orders", {"state": "Running"})

    _gone(cluster, "later")
    _gone(cluster, "kept")
    cluster.wait_for("it disposed of", lambda: taken["id"] not in _ids(cluster), job="orders")
    cluster.wait_for(
        "the other handed to the history",
        lambda: [s.get("pinned") for s in _history(cluster) if s["id"] == handed["id"]] == [None],
        job="orders",
    )


def test_a_deletion_of_a_snapshot_never_taken_waits_for_nothing(tmp_path: Path) -> None:
    """Held while it could still be taken, it stands for no savepoint once deleted: it goes
    at once, though the job is suspended (it waited for the job to run, saying it would
    dispose of a savepoint it never had)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(3.0, 3.5))  # savepoints expire
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s", "timeout": "1s"}))
        in_phase(cluster, "orders", "Running")
        cluster.api.create(SNAPSHOTS, snapshot("doomed", backoffLimit=3), namespace=NAMESPACE)
        cluster.wait_for(
            "the first failure",
            lambda: snapshot_status(cluster, "doomed").get("failures") == 1,
            job="orders",
        )
        _held(cluster, "doomed")
        driver = cluster.simulated_agent("orders-driver-1")
        assert driver is not None
        driver.ack_delay = (0.01, 0.2)  # the suspension's savepoint completes
        cluster.patch_spec("orders", {"state": "Suspended"})
        in_phase(cluster, "orders", "Suspended")
        assert snapshot_status(cluster, "doomed")["state"] == "TRIGGER_PENDING"  # retried later

        cluster.api.delete(SNAPSHOTS, NAMESPACE, "doomed")

        _gone(cluster, "doomed")


def test_a_deletion_while_suspended_waits_for_the_status_that_says_it_completed(
    tmp_path: Path,
) -> None:
    """Its savepoint completed, but the API server refused the COMPLETED status: deleted
    while the job was suspended, it was let go as if never taken (its savepoint then only
    released, not disposed of); it waits for its status, then for the job (a reviewer's)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(2.0, 2.5))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s"}, savepoints={"historyMaxCount": 10}))
        in_phase(cluster, "orders", "Running")
        cluster.api.create(SNAPSHOTS, snapshot("racing"), namespace=NAMESPACE)
        in_state(cluster, "racing", "IN_PROGRESS")
        _held(cluster, "racing")

        def status_write(request: Any) -> bool:
            return bool(request.method.value == "PATCH" and request.subresource == "status")

        refusing = refused_requests(
            cluster,
            lambda r: status_write(r) and "/sparkcheckpointsnapshots/" in r.url.path,
            UNAVAILABLE,
        )
        taken = cluster.wait_for(
            "its savepoint completed",
            lambda: next(
                (s for s in _history(cluster) if s.get("label", "").startswith("snapshot racing")),
                None,
            ),
            job="orders",
        )
        cluster.patch_spec("orders", {"state": "Suspended"})
        in_phase(cluster, "orders", "Suspended")
        cluster.api.delete(SNAPSHOTS, NAMESPACE, "racing")
        time.sleep(3)
        assert "racing" in [o["metadata"]["name"] for o in cluster.api.list(SNAPSHOTS, NAMESPACE)]
        refusing.clear()

        in_state(cluster, "racing", "COMPLETED")
        cluster.patch_spec("orders", {"state": "Running"})
        _gone(cluster, "racing")
        cluster.wait_for("it disposed of", lambda: taken["id"] not in _ids(cluster), job="orders")


def test_a_finalizer_the_api_server_did_not_write_is_written_soon(
    cluster: LocalCluster,
) -> None:
    """Nothing else changes (periodic checkpoints are off): the finalizer is asked for
    again on its own (it waited for the job's next change, and a deletion meanwhile would
    not have disposed of the savepoint)."""
    cluster.apply(job(checkpointing={"interval": "0s"}))
    in_phase(cluster, "orders", "Running")
    failing = refused_requests(cluster, _finalizer_write, UNAVAILABLE)
    cluster.api.create(SNAPSHOTS, snapshot("later"), namespace=NAMESPACE)
    in_state(cluster, "later", "COMPLETED")
    _finalizer_write_refused(cluster, 0)
    settled = -1
    while (tried := _finalizer_writes(cluster)) != settled:  # the tries the job's changes make
        settled = tried
        time.sleep(2)
    failing.clear()

    _held(cluster, "later")


def test_a_deleted_jobs_snapshot_is_let_go_though_the_api_server_failed_once(
    cluster: LocalCluster,
) -> None:
    """Nothing runs for the job after its deletion: its snapshot's finalizer is asked to go
    again a few times (it stayed, and `kubectl delete` of the snapshot hung, until an
    operator restart)."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    cluster.api.create(SNAPSHOTS, snapshot("kept"), namespace=NAMESPACE)
    in_state(cluster, "kept", "COMPLETED")
    _held(cluster, "kept")
    failing = refused_requests(cluster, _finalizer_write, UNAVAILABLE)
    before = _finalizer_writes(cluster)

    cluster.delete("orders")
    _finalizer_write_refused(cluster, before)
    failing.clear()

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None)
    cluster.wait_for(
        "the finalizer gone",
        lambda: not cluster.api.get(SNAPSHOTS, NAMESPACE, "kept")["metadata"].get("finalizers"),
    )


UNAVAILABLE = kmock.KubernetesError(503, "ServiceUnavailable", "injected", {})


def _finalizer_write(request: Any) -> bool:
    path = request.url.path
    return bool(
        request.method.value == "PATCH"
        and "/sparkcheckpointsnapshots/" in path
        and not path.endswith("/status")
    )


def _finalizer_writes(cluster: LocalCluster) -> int:
    return sum(_finalizer_write(request) for request in cluster.api.call(list))


def _finalizer_write_refused(cluster: LocalCluster, before: int) -> None:
    """Wait for a finalizer write after the ``before`` first ones (refused)."""
    cluster.wait_for("a finalizer write refused", lambda: _finalizer_writes(cluster) > before)


def test_the_jobs_newest_image_is_not_disposed_of(cluster: LocalCluster) -> None:
    """The output may be committed up to its batch: refused, said on the job, and handed to
    the history (which keeps the newest); the object goes."""
    cluster.apply(job(checkpointing={"interval": "0s"}))
    in_phase(cluster, "orders", "Running")
    cluster.api.create(SNAPSHOTS, snapshot("newest"), namespace=NAMESPACE)
    taken = in_state(cluster, "newest", "COMPLETED")
    _held(cluster, "newest")

    cluster.api.delete(SNAPSHOTS, NAMESPACE, "newest")

    _gone(cluster, "newest")
    said = cluster.wait_for_event("orders", "SavepointNotDisposed")
    assert f"savepoint {taken['id']}" in said["message"] and "snapshot newest" in said["message"]
    assert "handed to the savepoint history" in said["message"]
    cluster.wait_for(
        "the savepoint handed to the history",
        lambda: [s.get("pinned") for s in _history(cluster) if s["id"] == taken["id"]] == [None],
        job="orders",
    )


def test_a_deleted_jobs_snapshots_are_not_held(cluster: LocalCluster) -> None:
    """No driver runs to dispose of their savepoints: the job's deletion lets go of their
    finalizers (the savepoints stay in storage, as the job's others); one whose deletion
    waited says its savepoint was not disposed of."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    for name in ("kept", "waiting"):
        cluster.api.create(SNAPSHOTS, snapshot(name), namespace=NAMESPACE)
        in_state(cluster, name, "COMPLETED")
        _held(cluster, name)
    cluster.patch_spec("orders", {"state": "Suspended"})
    in_phase(cluster, "orders", "Suspended")
    cluster.api.delete(SNAPSHOTS, NAMESPACE, "waiting")
    cluster.delete("orders")
    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None)
    cluster.wait_for(
        "the finalizer gone",
        lambda: not cluster.api.get(SNAPSHOTS, NAMESPACE, "kept")["metadata"].get("finalizers"),
    )
    cluster.api.delete(SNAPSHOTS, NAMESPACE, "kept")
    assert [o["metadata"]["name"] for o in cluster.api.list(SNAPSHOTS, NAMESPACE)] == []
    said = cluster.wait_for_event("waiting", "SnapshotKept")
    assert said["message"].endswith(
        "is not disposed of: SparkCheckpointJob orders was deleted; it stays in storage"
    )


def test_a_job_deleted_while_its_status_cannot_be_read_lets_go_of_its_snapshots(
    cluster: LocalCluster,
) -> None:
    """Its storage stays as it is, and so do its snapshots' savepoints: their finalizers went
    with the job's deletion only when the status could be read (they waited for an operator
    restart otherwise); a waiting snapshot is abandoned."""
    cluster.apply(job())
    completed(cluster, "orders", 1)
    cluster.api.create(SNAPSHOTS, snapshot("kept"), namespace=NAMESPACE)
    in_state(cluster, "kept", "COMPLETED")
    _held(cluster, "kept")
    with operator_stopped(cluster):
        unreadable = {"status": {"jobAttempt": -5}}
        cluster.api.patch(JOBS, NAMESPACE, "orders", unreadable, subresource="status")
        cluster.api.create(SNAPSHOTS, snapshot("waiting"), namespace=NAMESPACE)
    cluster.wait_for_event("orders", "StatusUnreadable")

    cluster.delete("orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None)
    cluster.wait_for(
        "the finalizer gone",
        lambda: not cluster.api.get(SNAPSHOTS, NAMESPACE, "kept")["metadata"].get("finalizers"),
    )
    said = in_state(cluster, "waiting", "ABANDONED")["error"]
    assert said == "SparkCheckpointJob orders was deleted"


def test_a_snapshot_of_an_existing_savepoint_keeps_it(cluster: LocalCluster) -> None:
    """Flink's alreadyExists: a savepoint the job took (here periodic-style, by nonce) is
    kept past the history's limits by an object naming its path; a path naming no
    savepoint of the job's fails the object, without a retry."""
    cluster.apply(job(savepoints={"historyMaxCount": 1}))
    completed(cluster, "orders", 1)
    cluster.patch_spec("orders", {"savepointTriggerNonce": 1})
    taken = cluster.wait_for(
        "the nonce's savepoint",
        lambda: (
            (s := cluster.status("orders").get("lastSavepoint") or {}).get("label") == "nonce 1"
            and s
        ),
        job="orders",
    )
    keep = snapshot("keep", savepoint={"alreadyExists": True, "path": taken["path"]})
    cluster.api.create(SNAPSHOTS, keep, namespace=NAMESPACE)
    status = in_state(cluster, "keep", "COMPLETED")
    assert (status["id"], status["path"], status["kind"]) == (
        taken["id"],
        taken["path"],
        "savepoint",
    )
    cluster.patch_spec("orders", {"savepointTriggerNonce": 2})
    cluster.wait_for(
        "a newer savepoint beside the kept one",
        lambda: (
            [(s["id"], s.get("pinned")) for s in _history(cluster)][-1] == (taken["id"], True)
            and len(_history(cluster)) == 2
        ),
        job="orders",
    )

    checkpoint_path = cluster.status("orders")["lastCheckpoint"]["path"]
    for name, path, error in [
        ("a-checkpoint", checkpoint_path, "not a savepoint"),
        ("elsewhere", "/nowhere/default/other/savepoints/sp-1/_metadata", "not in the storage"),
        ("no-image", "/nowhere/savepoints/sp-1/_metadata", "names no storage root"),
        ("never", taken["path"].replace(f"{taken['id']}", "999"), "was never taken"),
        # Out of the status history's window: it said only "is not in the job's registry".
        (
            "long-gone",
            taken["path"].replace(f"sp-{taken['id']}", "sp-0"),
            "savepoint 0 is not in the job's registry: the savepoint history let it go, it "
            "was disposed of, or it never completed",
        ),
    ]:
        bad = snapshot(name, savepoint={"alreadyExists": True, "path": path})
        cluster.api.create(SNAPSHOTS, bad, namespace=NAMESPACE)
        failed = in_state(cluster, name, "FAILED")
        assert error in failed["error"] and failed["failures"] == 1, failed


def test_an_object_deleted_while_the_operator_is_down_releases_its_savepoint(
    cluster: LocalCluster,
) -> None:
    """No watch event tells the next operator: it lists the snapshots itself."""
    cluster.apply(job(savepoints={"historyMaxCount": 1}))
    completed(cluster, "orders", 1)
    cluster.api.create(SNAPSHOTS, snapshot("gone"), namespace=NAMESPACE)
    kept = in_state(cluster, "gone", "COMPLETED")["id"]
    cluster.patch_spec("orders", {"savepointTriggerNonce": 1})
    cluster.wait_for("a newer savepoint", lambda: len(_history(cluster)) == 2, job="orders")
    with operator_stopped(cluster):
        cluster.api.delete(SNAPSHOTS, NAMESPACE, "gone")

    cluster.wait_for(
        "the released savepoint let go",
        lambda: kept not in [s["id"] for s in _history(cluster)],
        job="orders",
    )


def test_a_snapshot_is_asked_again_only_once_its_failure_is_counted(tmp_path: Path) -> None:
    """Checkpoints that expire now and then (a 10 ms timeout): a failure whose notice came
    after the snapshot's status write was not counted, and the snapshot was asked again at
    once, past backoffLimit 0 (a newcomer's); a snapshot that completed while the status
    writes of the others took their time was asked again. Each is now taken once:
    completed, or failed once and FAILED."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(0.0, 0.02))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        # Failures tolerated: the job keeps running (a restart is no failure of a snapshot's).
        checkpointing = {"interval": "0s", "timeout": "10ms", "tolerableFailures": 100}
        cluster.apply(job(checkpointing=checkpointing))
        in_phase(cluster, "orders", "Running")
        names = [f"once-{i}" for i in range(16)]
        for name in names:
            cluster.api.create(
                SNAPSHOTS, snapshot(name, kind="checkpoint", backoffLimit=0), namespace=NAMESPACE
            )
        final = {
            name: cluster.wait_for(
                f"{name} done",
                lambda name=name: (
                    (s := snapshot_status(cluster, name)).get("state") in ("COMPLETED", "FAILED")
                    and s
                ),
                job="orders",
            )
            for name in names
        }
    log = (tmp_path / "operator.log").read_text()  # every notice (events are throttled)

    for name, status in final.items():
        lines = [line for line in log.splitlines() if f"(snapshot {name} (" in line]
        failed = [line for line in lines if "failed:" in line or "declined:" in line]
        done = [line for line in lines if " complete (snapshot " in line]
        if status["state"] == "COMPLETED":
            assert status["failures"] == 0 and (len(done), failed) == (1, []), (name, lines)
        else:
            assert status["failures"] == 1 and (done, len(failed)) == ([], 1), (name, lines)


def test_an_edit_after_the_trigger_changes_nothing(tmp_path: Path) -> None:
    """Moving a snapshot in flight to another job took it in both (a reviewer's): the job
    and kind are the status's once it was triggered; before that, an edit counts (a job's
    name mistyped)."""
    agents = SimulatedAgents(batch_seconds=0.3, ack_delay=(1.0, 1.2))
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job(checkpointing={"interval": "0s"}))
        cluster.apply(job("other", checkpointing={"interval": "0s"}))
        in_phase(cluster, "orders", "Running")
        in_phase(cluster, "other", "Running")
        cluster.api.create(SNAPSHOTS, snapshot("typo", job_name="ordres"), namespace=NAMESPACE)
        in_state(cluster, "typo", "TRIGGER_PENDING")
        cluster.api.patch(
            SNAPSHOTS, NAMESPACE, "typo", {"spec": {"jobReference": {"name": "orders"}}}
        )
        in_state(cluster, "typo", "IN_PROGRESS")
        cluster.api.patch(
            SNAPSHOTS,
            NAMESPACE,
            "typo",
            {"spec": {"jobReference": {"name": "other"}, "savepoint": None, "checkpoint": {}}},
        )
        status = in_state(cluster, "typo", "COMPLETED")
        time.sleep(2.0)  # time enough for a second trigger, in `other`, to show
        histories = {
            name: [s.get("label", "") for s in cluster.status(name).get("savepointHistory", [])]
            for name in ("orders", "other")
        }
        other = cluster.status("other")

    assert (status.get("job"), status["kind"]) == ("orders", "savepoint"), status
    assert [label.startswith("snapshot typo (") for label in histories["orders"]] == [True]
    assert histories["other"] == []
    assert (other["pending"], other["history"]) == ([], [])


def test_a_deleted_jobs_waiting_snapshots_are_abandoned_not_taken_by_its_successor(
    cluster: LocalCluster,
) -> None:
    """A job deleted before it ran (Suspended here) left its snapshots waiting, and a new
    job of its name took them (a reviewer's)."""
    cluster.apply(job(state="Suspended"))
    in_phase(cluster, "orders", "Suspended")
    cluster.api.create(SNAPSHOTS, snapshot("orphan"), namespace=NAMESPACE)
    cluster.wait_for(
        "the snapshot waiting",
        lambda: snapshot_status(cluster, "orphan").get("message"),
        job="orders",
    )
    cluster.delete("orders")
    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None)

    status = in_state(cluster, "orphan", "ABANDONED")
    cluster.apply(job())
    completed(cluster, "orders", 2)

    assert status["error"] == "SparkCheckpointJob orders was deleted"
    assert snapshot_status(cluster, "orphan")["state"] == "ABANDONED"
    assert cluster.status("orders").get("savepointHistory", []) == []


def test_a_snapshot_asked_while_the_driver_finishes_is_abandoned_not_failed(
    tmp_path: Path,
) -> None:
    """The input done and the final checkpoint completed, the driver takes 8 s to exit
    while the job still shows Running: a snapshot created then was asked for, declined
    (not all tasks running) and FAILED (a reviewer's). Its coordinator takes no more: the
    job is Finished for it."""
    agents = SimulatedAgents(batch_seconds=0.3, finish_after=4, exit_seconds=8.0)
    with LocalCluster(tmp_path, simulated=agents) as cluster:
        cluster.apply(job())
        cluster.wait_for(
            "the final checkpoint completed",
            lambda: cluster.status("orders").get("lastCheckpoint", {}).get("label") == "final",
            job="orders",
        )
        cluster.api.create(SNAPSHOTS, snapshot("late", backoffLimit=0), namespace=NAMESPACE)
        status = cluster.wait_for(
            "the snapshot's end",
            lambda: (
                (s := snapshot_status(cluster, "late")).get("state")
                in ("FAILED", "ABANDONED", "COMPLETED")
                and s
            ),
            job="orders",
        )

    assert status["state"] == "ABANDONED", status
    assert status["error"] == "the job is Finished: nothing runs to take it"
    assert status["failures"] == 0


def _mirrors(cluster: LocalCluster) -> dict[str, Any]:
    """The job's snapshot objects the operator made, by name."""
    return {
        o["metadata"]["name"]: o
        for o in cluster.api.list(SNAPSHOTS, NAMESPACE)
        if (o["metadata"].get("labels") or {}).get("sparkcheckpoint.io/component")
        == MIRROR_COMPONENT
    }


def _mirrored(cluster: LocalCluster, *ids: int, timeout: float = 60) -> dict[str, Any]:
    """Wait until the operator's snapshot objects are those of ``ids``, each COMPLETED."""
    names = {f"orders-savepoint-{i}" for i in ids}
    return cluster.wait_for(
        f"the mirrors of savepoints {ids}",
        lambda: (
            (found := _mirrors(cluster)).keys() == names
            and all((o.get("status") or {}).get("state") == "COMPLETED" for o in found.values())
            and found
        ),
        job="orders",
        timeout=timeout,
    )


def test_a_mirror_the_operator_deleted_is_not_said_deleted_by_hand_once_made_again(
    cluster: LocalCluster,
) -> None:
    """Mirrors turned off while another's finalizer holds one (Terminating), then on again
    once it is gone: it is made again as the operator's own deletion's, without the warning
    that someone else deleted it (a reviewer's: it was listed as standing while deleted)."""
    cluster.apply(job(savepoints={"snapshotObjects": True}))
    first = savepoint_by_nonce(cluster, 1)
    named = f"orders-savepoint-{first}"
    _mirrored(cluster, first)
    cluster.api.patch(SNAPSHOTS, NAMESPACE, named, {"metadata": {"finalizers": ["example/hold"]}})

    cluster.patch_spec("orders", {"savepoints": {"snapshotObjects": False}})
    cluster.wait_for(
        "the mirror deleted, held by the finalizer",
        lambda: cluster.api.get(SNAPSHOTS, NAMESPACE, named)["metadata"].get("deletionTimestamp"),
    )
    cluster.patch_spec("orders", {"savepointTriggerNonce": 2})  # a change that lists again
    savepoint_by_nonce(cluster, 2)
    cluster.api.patch(SNAPSHOTS, NAMESPACE, named, {"metadata": {"finalizers": None}})
    cluster.wait_for("the mirror gone", lambda: named not in _mirrors(cluster))

    cluster.patch_spec("orders", {"savepoints": {"snapshotObjects": True}})
    _mirrored(cluster, *_ids(cluster))
    time.sleep(1)  # its event, were there one, is posted right after the create
    assert "was deleted" not in " ".join(
        e["message"] for e in cluster.events("orders") if e["reason"] == "SnapshotReplaced"
    )


def _mirror_deleted_and_edited_is_made_again(cluster: LocalCluster, third: int) -> None:
    """The mirror of savepoint ``third``, deleted, then edited twice, is made again each
    time, and the job says so."""
    named = f"orders-savepoint-{third}"
    edits = [
        None,  # deleted
        {"spec": {"savepoint": {"disposeOnDelete": True}}},
        {"metadata": {"labels": {"sparkcheckpoint.io/component": None}}},
    ]
    for edit in edits:  # made again: what it says is the operator's to say
        before = cluster.api.get(SNAPSHOTS, NAMESPACE, named)["metadata"]["uid"]
        if edit is None:
            cluster.api.delete(SNAPSHOTS, NAMESPACE, named)
        else:
            cluster.api.patch(SNAPSHOTS, NAMESPACE, named, edit)
        cluster.wait_for(
            f"{named} made again after {edit}",
            lambda: (
                (m := _mirrors(cluster).get(named)) is not None
                and m["metadata"]["uid"] != before  # noqa: B023 (waited for within the loop)
                and (m.get("status") or {}).get("state") == "COMPLETED"
            ),
            job="orders",
        )
    assert third in _ids(cluster), "a mirror's deletion disposes of nothing"
    assert [s.get("pinned") for s in _history(cluster) if s["id"] == third] == [None]
    cluster.wait_for_event("orders", "SnapshotReplaced")
    replaced = [e["message"] for e in cluster.events("orders") if e["reason"] == "SnapshotReplaced"]
    # The deletion is said too (it was made again silently, a newcomer's), once; the
    # operator's own deletion of an edited one is not.
    assert [m for m in replaced if "was deleted" in m] == [
        f"SparkCheckpointSnapshot {named} was deleted: the operator's mirror of savepoint "
        f"{third}, which the history keeps, it is made again, and its deletion disposed of "
        "nothing; to dispose of the savepoint, name it in an object of your own "
        "(savepoint.alreadyExists, disposeOnDelete: true) and delete that"
    ]
    assert any(
        m.startswith(
            f"SparkCheckpointSnapshot {named} was edited: the operator's mirror of a savepoint "
            "in the history, it is made again as it was; "
        )
        for m in replaced
    ), replaced


def test_the_jobs_own_savepoints_are_snapshot_objects_too(cluster: LocalCluster) -> None:
    """Flink's snapshot resources (kubernetes.operator.snapshot.resource.enabled): each
    savepoint in the job's history (here by savepointTriggerNonce, then a suspension's) is
    a COMPLETED SparkCheckpointSnapshot, which goes when the history lets its savepoint go;
    one deleted by hand or edited is made again while its savepoint is in the history; one
    an object of the user's keeps is listed by that object only; all go once turned off,
    and with the job."""
    cluster.apply(job(savepoints={"historyMaxCount": 2, "snapshotObjects": True}))
    first, second = savepoint_by_nonce(cluster, 1), savepoint_by_nonce(cluster, 2)

    mirrors = _mirrored(cluster, first, second)

    made = mirrors[f"orders-savepoint-{second}"]
    registered = next(s for s in _history(cluster) if s["id"] == second)
    job_object = cluster.job("orders")
    assert job_object is not None
    assert made["status"]["path"] == registered["path"]
    assert (made["status"]["id"], made["status"]["kind"]) == (second, "savepoint")
    assert made["spec"] == {
        "jobReference": {"name": "orders", "kind": "SparkCheckpointJob"},
        "savepoint": {"alreadyExists": True, "path": registered["path"], "disposeOnDelete": False},
        "backoffLimit": -1,
    }
    assert made["metadata"]["annotations"]["sparkcheckpoint.io/savepoint-label"] == "nonce 2"
    assert made["metadata"]["labels"]["sparkcheckpoint.io/job"] == "orders"
    owner = made["metadata"]["ownerReferences"]
    assert [(o["kind"], o["uid"]) for o in owner] == [
        ("SparkCheckpointJob", job_object["metadata"]["uid"])
    ]
    assert not made["metadata"].get("finalizers"), "never held: its deletion disposes of nothing"
    told = cluster.wait_for_event(f"orders-savepoint-{second}", "SnapshotCompleted")
    assert told["message"] == f"savepoint {second} (nonce 2) completed: {registered['path']}"

    third = savepoint_by_nonce(cluster, 3)
    _mirrored(cluster, second, third)  # the history let the first go

    _mirror_deleted_and_edited_is_made_again(cluster, third)

    kept = snapshot("kept", savepoint={"alreadyExists": True, "path": registered["path"]})
    cluster.api.create(SNAPSHOTS, kept, namespace=NAMESPACE)
    in_state(cluster, "kept", "COMPLETED")
    _mirrored(cluster, third)  # the user's object lists it now
    cluster.api.patch(
        SNAPSHOTS, NAMESPACE, "kept", {"spec": {"savepoint": {"disposeOnDelete": False}}}
    )
    cluster.api.delete(SNAPSHOTS, NAMESPACE, "kept")
    _mirrored(cluster, second, third)  # handed back to the history

    cluster.patch_spec("orders", {"state": "Suspended"})
    in_phase(cluster, "orders", "Suspended")
    suspension = cluster.status("orders")["lastSavepoint"]
    _mirrored(cluster, third, suspension["id"])  # made while the job is suspended
    assert (
        _mirrors(cluster)[f"orders-savepoint-{suspension['id']}"]["metadata"]["annotations"][
            "sparkcheckpoint.io/savepoint-label"
        ]
        == suspension["label"]
    )

    cluster.patch_spec("orders", {"savepoints": {"snapshotObjects": False}})
    cluster.wait_for("no mirrors", lambda: not _mirrors(cluster), job="orders")
    cluster.patch_spec("orders", {"savepoints": {"snapshotObjects": True}})
    _mirrored(cluster, third, suspension["id"])
    cluster.delete("orders")
    cluster.wait_for("the mirrors gone with the job", lambda: not _mirrors(cluster))


def test_the_documented_savepoint_objects_are_made(cluster: LocalCluster) -> None:
    """docs/operator.md's snapshotObjects example, as written (its periodic savepoints due
    in six hours: the test takes its savepoints by nonce)."""
    (block,) = marked_blocks(
        "tests/kubernetes/test_snapshot_objects.py::test_the_documented_savepoint_objects_are_made"
    )
    documented = yaml.safe_load(block.text)["spec"]["savepoints"]
    cluster.apply(job(savepoints=documented))

    taken = [savepoint_by_nonce(cluster, nonce) for nonce in range(1, 7)]

    mirrors = _mirrored(cluster, *taken[-documented["historyMaxCount"] :])
    assert {o["status"]["path"] for o in mirrors.values()} == {s["path"] for s in _history(cluster)}


@pytest.mark.timeout(300)
def test_a_role_without_create_on_snapshots_leaves_the_savepoints_unmirrored(
    cluster: LocalCluster,
) -> None:
    """An operator whose role predates the mirrors (no create on the snapshots): said once
    on the job, in one log line, not asked again at every change; the job runs on, and
    the mirrors are asked for again a minute later (once the role is mended, they come,
    though nothing else changed: the job's savepoints did not)."""
    forbidden = kmock.KubernetesError(
        403, "Forbidden", "sparkcheckpointsnapshots is forbidden: cannot create", {}
    )
    refusing = refused_requests(
        cluster,
        lambda r: r.method.value == "POST" and "/sparkcheckpointsnapshots" in r.url.path,
        forbidden,
    )
    cluster.apply(job(savepoints={"snapshotObjects": True}))

    taken = savepoint_by_nonce(cluster, 1)
    completed(cluster, "orders", cluster.status("orders")["counts"]["completed"] + 3)

    said = [
        line
        for line in cluster.operator.log_path.read_text().splitlines()
        if f"orders-savepoint-{taken} (savepoint {taken}) was not created" in line
    ]
    assert len(said) == 1, said
    assert "Traceback" not in cluster.operator.log_path.read_text()
    assert not _mirrors(cluster)
    told = [e["message"] for e in cluster.events("orders") if e["reason"] == "SavepointNotMirrored"]
    assert len(told) == 1, told
    assert told[0] == (
        "a SparkCheckpointSnapshot could not be created (spec.savepoints.snapshotObjects): "
        "sparkcheckpointsnapshots is forbidden: cannot create; the operator's role needs "
        "create and delete on sparkcheckpointsnapshots (the chart grants them); asked again "
        "every minute"
    )
    refusing.clear()
    _mirrored(cluster, taken, timeout=90)


def test_a_mirrors_name_another_object_holds_is_said_once(cluster: LocalCluster) -> None:
    """Its savepoint gets no mirror, and the object is left alone; the job says so once (a
    warning in the operator's log at every change of the job's snapshots, a newcomer's);
    the name freed, the mirror is made, though the object named another job (whose
    changes reached only that job's controller) and the savepoints did not change."""
    cluster.apply(job())
    taken = savepoint_by_nonce(cluster, 1)
    name = f"orders-savepoint-{taken}"
    cluster.api.create(SNAPSHOTS, snapshot(name, job_name="other"), namespace=NAMESPACE)
    in_state(cluster, name, "TRIGGER_PENDING")

    cluster.patch_spec("orders", {"savepoints": {"snapshotObjects": True}})
    second = savepoint_by_nonce(cluster, 2)

    _mirrored(cluster, second)
    told = cluster.wait_for_event("orders", "SavepointNotMirrored")
    assert told["message"] == (
        f"savepoint {taken} (nonce 1) has no SparkCheckpointSnapshot: the name {name} is "
        "another object's (spec.savepoints.snapshotObjects)"
    )
    third = savepoint_by_nonce(cluster, 3)
    _mirrored(cluster, second, third)  # looked at after the last savepoint: nothing changes
    assert cluster.event_reasons("orders").count("SavepointNotMirrored") == 1
    assert "ownerReferences" not in cluster.api.get(SNAPSHOTS, NAMESPACE, name)["metadata"]

    cluster.api.delete(SNAPSHOTS, NAMESPACE, name)
    _mirrored(cluster, taken, second, third)


def test_a_mirror_held_by_hand_goes_with_its_job(cluster: LocalCluster) -> None:
    """The garbage collector deletes a job's mirrors with it; one given the disposal
    finalizer by hand (while no operator ran to take it off) stayed Terminating for ever."""
    cluster.apply(job(savepoints={"snapshotObjects": True}))
    taken = savepoint_by_nonce(cluster, 1)
    _mirrored(cluster, taken)
    named = f"orders-savepoint-{taken}"
    with operator_stopped(cluster):
        cluster.api.patch(SNAPSHOTS, NAMESPACE, named, {"metadata": {"finalizers": [FINALIZER]}})
        cluster.delete("orders")

    cluster.wait_for("the job gone", lambda: cluster.job("orders") is None)
    cluster.wait_for("its mirror gone", lambda: not _mirrors(cluster))
