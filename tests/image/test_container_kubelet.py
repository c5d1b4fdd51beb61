"""The local kubelet's container mode: pods of the emulated API server run as Podman
containers from their images, as a kubelet runs them (tests/helpers/kube/kubelet.py)."""

import base64
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from helpers import containers
from helpers.kube.emulator import EmulatedApiServer
from helpers.kube.kubelet import CONTAINER_LABEL, KubeletThread

pytestmark = [pytest.mark.containers, pytest.mark.timeout(600)]

NS = "default"
PODS = "v1/pods"
UID = 10001

# What the container reports about itself, one fact a line (read back in order).
PROBE = r"""
id -u; id -g; id -G | tr ' ' '\n' | grep -c '^10001$'
grep -E '^(CapEff|NoNewPrivs)' /proc/self/status | tr -s '\t' ' '
touch /probe 2>/dev/null && echo root-writable || echo root-read-only
touch /scratch/probe && echo scratch-writable
mkdir -p /data/out && echo kept > /data/out/file && echo data-writable
stat -c '%a %g' /etc/secret/password
cat /etc/secret/password; echo
stat -c '%a %g' /etc/projected/greeting
cat /etc/projected/greeting; echo; cat /etc/projected/pod-name; echo
echo "$GREETING $PASSWORD $POD_NAME $1"
echo "$(hostname) $(getent hosts "$(hostname)" | awk '{print $1}')"
echo "it ended badly" > /dev/termination-log
exit 3
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[EmulatedApiServer, KubeletThread]]:
    with (
        EmulatedApiServer() as api,
        KubeletThread(api.url, tmp_path / "node", containers=True) as kubelet,
    ):
        yield api, kubelet


def pod(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """A pod as the operator makes them: restricted, its image's user, fsGroup 10001."""
    container = {
        "name": "main",
        "image": image,
        "command": command,
        "args": spec.pop("args", []),
        "env": spec.pop("env", []),
        "volumeMounts": spec.pop("volumeMounts", []),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            **spec.pop("containerSecurity", {}),
        },
    }
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 10,
            "securityContext": {"runAsNonRoot": True, "fsGroup": UID},
            "containers": [container],
            **spec,
        },
    }


def container_status(api: EmulatedApiServer, name: str) -> dict[str, Any]:
    status = api.get(PODS, NS, name)["status"]
    return dict(status["containerStatuses"][0])


def waiting_state(api: EmulatedApiServer, name: str) -> dict[str, Any] | None:
    """The container's waiting state once it has a message (after ContainerCreating)."""
    statuses = api.get(PODS, NS, name).get("status", {}).get("containerStatuses", [])
    waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
    return dict(waiting) if waiting.get("message") else None


def exists(api: EmulatedApiServer, name: str) -> bool:
    try:
        api.get(PODS, NS, name)
    except kmock.KubernetesError as error:
        assert error.status == 404
        return False
    return True


def wait_until(what: str, condition: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return result


def test_a_pod_runs_in_its_image_with_its_security_context_volumes_and_environment(
    images: dict[str, str], cluster: tuple[EmulatedApiServer, KubeletThread]
) -> None:
    api, kubelet = cluster
    password = base64.b64encode(b"s3cret").decode()
    api.create(
        "v1/secrets",
        {"metadata": {"name": "creds"}, "data": {"password": password}},
        NS,
    )
    api.create("v1/configmaps", {"metadata": {"name": "words"}, "data": {"greeting": "hello"}}, NS)
    spec = pod(
        "probe",
        images["spark"],
        ["bash", "-c", PROBE, "probe"],
        args=["$(GREETING)-expanded"],
        containerSecurity={"readOnlyRootFilesystem": True},
        env=[
            {
                "name": "GREETING",
                "valueFrom": {"configMapKeyRef": {"name": "words", "key": "greeting"}},
            },
            {
                "name": "PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}},
            },
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        volumeMounts=[
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "data", "mountPath": "/data"},
            {"name": "secret", "mountPath": "/etc/secret", "readOnly": True},
            {"name": "projected", "mountPath": "/etc/projected", "readOnly": True},
        ],
        volumes=[
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "secret", "secret": {"secretName": "creds", "defaultMode": 0o400}},
            {
                "name": "projected",
                "projected": {
                    "defaultMode": 0o444,
                    "sources": [
                        {"configMap": {"name": "words"}},
                        {
                            "downwardAPI": {
                                "items": [
                                    {"path": "pod-name", "fieldRef": {"fieldPath": "metadata.name"}}
                                ]
                            }
                        },
                    ],
                },
            },
        ],
    )

    api.create(PODS, spec, NS)

    assert kubelet.wait_for_phase(NS, "probe", "Succeeded", "Failed", timeout=120) == "Failed"
    log = kubelet.kubelet.log_path(NS, "probe").read_text()
    assert log.splitlines() == [
        str(UID),  # the image's user
        str(UID),
        "1",  # fsGroup among the groups
        "CapEff: 0000000000000000",
        "NoNewPrivs: 1",
        "root-read-only",
        "scratch-writable",
        "data-writable",
        "440 10001",  # defaultMode 0400, readable by the fsGroup as on a node
        "s3cret",
        "444 10001",
        "hello",
        "probe",
        "hello s3cret probe hello-expanded",
        f"probe {api.get(PODS, NS, 'probe')['status']['podIP']}",  # as in a kubelet's /etc/hosts
    ], log
    terminated = container_status(api, "probe")["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert terminated["message"] == "it ended badly\n"
    status = container_status(api, "probe")
    assert status["containerID"].startswith("podman://")
    assert status["imageID"]
    claim = kubelet.kubelet.work_root / NS / "claims" / "data" / "out" / "file"
    assert claim.read_text() == "kept\n", "the claim is a directory of this machine"


def test_deletion_stops_the_container_with_sigterm_and_a_kill_ends_it_with_137(
    images: dict[str, str], cluster: tuple[EmulatedApiServer, KubeletThread]
) -> None:
    api, kubelet = cluster
    trap = (
        "trap 'echo SIGTERM > /data/stopped; exit 0' TERM; echo ready; "
        "while true; do sleep 0.1; done"
    )
    claim = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    mounts = [{"name": "data", "mountPath": "/data"}]
    api.create(
        PODS,
        pod("graceful", images["spark"], ["bash", "-c", trap], volumes=claim, volumeMounts=mounts),
        NS,
    )
    api.create(PODS, pod("victim", images["spark"], ["sleep", "300"]), NS)
    kubelet.wait_for_phase(NS, "graceful", "Running", timeout=120)
    kubelet.wait_for_phase(NS, "victim", "Running", timeout=120)

    kubelet.kubelet.kill(NS, "victim")
    api.delete(PODS, NS, "graceful", grace_period_seconds=20)

    assert kubelet.wait_for_phase(NS, "victim", "Failed", timeout=60) == "Failed"
    terminated = container_status(api, "victim")["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "Error")
    stopped = kubelet.kubelet.work_root / NS / "claims" / "data" / "stopped"
    wait_until("the graceful pod gone", lambda: not exists(api, "graceful"))
    assert stopped.read_text() == "SIGTERM\n", "the object outlived its container"


def test_a_pod_that_cannot_run_waits_or_fails_as_on_a_node(
    images: dict[str, str], cluster: tuple[EmulatedApiServer, KubeletThread]
) -> None:
    """runAsNonRoot with user 0 and a missing image keep their pods waiting; a command the
    image does not have fails to start (exit 128)."""
    api, kubelet = cluster
    api.create(
        PODS, pod("as-root", images["spark"], ["true"], containerSecurity={"runAsUser": 0}), NS
    )
    api.create(PODS, pod("no-image", "localhost/no/such-image:1", ["true"]), NS)
    api.create(PODS, pod("no-command", images["spark"], ["no-such-command"]), NS)

    assert kubelet.wait_for_phase(NS, "no-command", "Failed", timeout=120) == "Failed"
    terminated = container_status(api, "no-command")["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")
    assert "no-such-command" in terminated["message"]
    waiting = {
        name: wait_until(name, lambda name=name: waiting_state(api, name))
        for name in ("as-root", "no-image")
    }
    assert waiting["as-root"]["reason"] == "CreateContainerConfigError"
    assert "runAsNonRoot" in waiting["as-root"]["message"]
    assert waiting["no-image"]["reason"] == "ErrImageNeverPull"
    assert api.get(PODS, NS, "as-root")["status"]["phase"] == "Pending"


def test_a_kubelet_removes_the_containers_of_a_kubelet_that_died(
    images: dict[str, str], tmp_path: Path
) -> None:
    """A test run killed before its kubelet stopped leaves running containers behind (they
    are not its children): the next container-mode kubelet removes them, not others'."""
    # 4194305: above any pid Linux gives (PID_MAX_LIMIT is 2**22).
    dead, alive = "local-kubelet-4194305-0badf00d", f"local-kubelet-{os.getpid()}-0badf00d"
    names = {label: f"orphan-probe-{uuid.uuid4().hex[:8]}" for label in (dead, alive)}
    for label, name in names.items():
        containers.podman(
            *("run", "--detach", "--pull=never", "--name", name),
            *("--label", f"{CONTAINER_LABEL}={label}", images["spark"], "sleep", "300"),
        )
    try:
        with EmulatedApiServer() as api, KubeletThread(api.url, tmp_path, containers=True):
            pass

        running = containers.podman("ps", "--all", "--format", "{{.Names}}").split()
        assert names[dead] not in running
        assert names[alive] in running
    finally:
        for name in names.values():  # one at a time: see kubelet._remove_containers
            containers.podman("rm", "--force", "--time", "0", name)
