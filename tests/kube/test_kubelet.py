"""The local kubelet against an emulated API server: pods run as local processes (no Spark)."""

import asyncio
import base64
import ipaddress
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.core_v1 import Container
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret

from helpers.kube.emulator import ApiServerEmulator, serve
from helpers.kube.kubelet import KubeletThread, LocalKubelet
from helpers.ports import free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

NS = "default"


@dataclass
class Api:
    url: str
    client: AsyncClient


def connect(url: str) -> AsyncClient:
    config = KubeConfig.from_one(cluster=Cluster(server=url), user=User())
    return AsyncClient(config, lazy=False, trust_env=False)


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    async with serve(ApiServerEmulator()) as url, connect(url) as client:
        yield Api(url=url, client=client)


@pytest_asyncio.fixture
async def kubelet(api: Api, tmp_path: Path) -> AsyncIterator[LocalKubelet]:
    async with LocalKubelet(api.url, tmp_path / "node") as running:
        yield running


def pod(name: str, script: str, *, args: tuple[str, ...] = (), **spec: Any) -> Pod:
    """A pod running `python -c script args...`; keyword arguments go into the spec."""
    container = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", script],
        "args": list(args),
        "env": spec.pop("env", []),
        "volumeMounts": spec.pop("volumeMounts", []),
    }
    return Pod.from_dict(
        {
            "metadata": {"name": name, "namespace": NS, "labels": {"team": "streaming"}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "containers": [container],
                **spec,
            },
        }
    )


def field_ref(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def secret(name: str, **data: str) -> Secret:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return Secret.from_dict({"metadata": {"name": name, "namespace": NS}, "data": encoded})


async def status(api: Api, name: str) -> dict[str, Any]:
    found = await api.client.get(Pod, name, namespace=NS)
    return dict(found.to_dict().get("status", {}))


async def until(condition: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Polls `condition` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def exists(api: Api, name: str) -> bool:
    try:
        await api.client.get(Pod, name, namespace=NS)
    except httpx2.HTTPStatusError as error:
        assert error.response.status_code == 404
        return False
    return True


def process_gone(pid: int) -> bool:
    """Whether the process has ended (a zombie nobody reaped has ended too)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


PRINT_ENV = """
import json, os, stat, sys
token_path = sys.argv[1]
print(json.dumps({
    "env": {k: os.environ.get(k) for k in [
        "POD_NAME", "POD_IP", "TEAM", "PASSWORD", "GREETING", "ESCAPED", "TOKEN_FILE",
        "HOSTNAME",
    ]},
    "argv": sys.argv[1:],
    "token": open(token_path).read(),
    "mode": stat.S_IMODE(os.stat(token_path).st_mode),
    "cwd": os.getcwd(),
}))
"""


async def test_a_pod_sees_its_env_and_mounted_secret_and_succeeds(
    api: Api, kubelet: LocalKubelet, tmp_path: Path
) -> None:
    await api.client.create(secret("creds", password="s3cret", token="tok-123"))
    env = [
        field_ref("POD_NAME", "metadata.name"),
        field_ref("POD_IP", "status.podIP"),
        field_ref("TEAM", "metadata.labels['team']"),
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "GREETING", "value": "hello $(POD_NAME) from $(TEAM)"},
        {"name": "ESCAPED", "value": "$$(POD_NAME) $(UNDEFINED)"},
        {"name": "TOKEN_FILE", "value": "/etc/creds/nested/token"},
    ]
    volume = {
        "name": "creds",
        "secret": {
            "secretName": "creds",
            "defaultMode": 0o640,
            "items": [{"key": "token", "path": "nested/token"}],
        },
    }
    mount = {"name": "creds", "mountPath": "/etc/creds", "readOnly": True}
    manifest = pod(
        "env-pod",
        PRINT_ENV,
        args=("/etc/creds/nested/token", "$(GREETING)"),
        env=env,
        volumes=[volume],
        volumeMounts=[mount],
    )
    await api.client.create(manifest)

    assert await kubelet.wait_for_phase(NS, "env-pod", "Succeeded", "Failed") == "Succeeded"
    sandbox = tmp_path / "node" / NS / "env-pod"
    token_path = str(sandbox / "volumes" / "creds" / "nested" / "token")
    output = json.loads(kubelet.log_path(NS, "env-pod").read_text())
    reported = await status(api, "env-pod")
    assert output["env"] == {
        "POD_NAME": "env-pod",
        "POD_IP": reported["podIP"],
        "TEAM": "streaming",
        "PASSWORD": "s3cret",
        "GREETING": "hello env-pod from streaming",
        "ESCAPED": "$(POD_NAME) $(UNDEFINED)",
        "TOKEN_FILE": token_path,
        "HOSTNAME": "env-pod",
    }
    assert output["argv"] == [token_path, "hello env-pod from streaming"]
    assert output["token"] == "tok-123"
    assert output["mode"] == 0o440  # defaultMode without write bits: mounted readOnly
    assert output["cwd"] == str(sandbox)

    bound = await api.client.get(Pod, "env-pod", namespace=NS)
    assert bound.spec is not None and bound.spec.nodeName == "local-kubelet"
    assert reported["phase"] == "Succeeded"
    pod_ip = ipaddress.IPv4Address(reported["podIP"])
    assert pod_ip.is_loopback and str(pod_ip) != "127.0.0.1"
    assert reported["hostIP"] == "127.0.0.1"
    assert reported["startTime"]
    terminated = reported["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    conditions = {c["type"]: c["status"] for c in reported["conditions"]}
    assert conditions == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "False",
        "Ready": "False",
    }
    assert kubelet.pods() == [(NS, "env-pod", "Succeeded")]


async def test_failing_and_unrunnable_pods_fail_and_the_kubelet_goes_on(
    api: Api, kubelet: LocalKubelet
) -> None:
    await api.client.create(pod("exits-3", "import sys; print('bye'); sys.exit(3)"))
    no_binary = pod("no-binary", "")
    assert no_binary.spec is not None
    no_binary.spec.containers[0].command = ["no-such-binary-for-kubelet-tests"]
    await api.client.create(no_binary)
    two = pod("two-containers", "")
    assert two.spec is not None
    two.spec.containers.append(Container(name="sidecar", command=["true"]))
    await api.client.create(two)
    unsupported = pod("nfs", "", volumes=[{"name": "data", "nfs": {"server": "x", "path": "/"}}])
    await api.client.create(unsupported)

    for name in ("exits-3", "no-binary", "two-containers", "nfs"):
        assert await kubelet.wait_for_phase(NS, name, "Succeeded", "Failed") == "Failed"
    failed = await status(api, "exits-3")
    terminated = failed["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert kubelet.log_path(NS, "exits-3").read_text() == "bye\n"
    start_error = (await status(api, "no-binary"))["containerStatuses"][0]["state"]["terminated"]
    assert start_error["reason"] == "StartError"
    assert "no-such-binary-for-kubelet-tests" in start_error["message"]
    assert "exactly one container" in (await status(api, "two-containers"))["message"]
    nfs = await status(api, "nfs")
    assert nfs["reason"] == "UnsupportedVolume" and "'data'" in nfs["message"]

    await api.client.create(pod("fine", "print('still running pods')"))
    assert await kubelet.wait_for_phase(NS, "fine", "Succeeded", "Failed") == "Succeeded"


async def test_a_claim_is_one_directory_the_namespaces_pods_share_and_outlives_them(
    api: Api, kubelet: LocalKubelet
) -> None:
    claim = [{"name": "live", "persistentVolumeClaim": {"claimName": "shared"}}]
    writer = pod(
        "writer",
        "import pathlib; pathlib.Path('/live/state').write_text('written')",
        volumes=claim,
        volumeMounts=[{"name": "live", "mountPath": "/live", "subPath": "job-1"}],
    )
    await api.client.create(writer)
    assert await kubelet.wait_for_phase(NS, "writer", "Succeeded", "Failed") == "Succeeded"
    await api.client.delete(Pod, "writer", namespace=NS)
    reader = pod(
        "reader",
        "import pathlib; print(pathlib.Path('/claim/job-1/state').read_text())",
        volumes=claim,
        volumeMounts=[{"name": "live", "mountPath": "/claim"}],
    )
    await api.client.create(reader)

    assert await kubelet.wait_for_phase(NS, "reader", "Succeeded", "Failed") == "Succeeded"
    assert kubelet.log_path(NS, "reader").read_text() == "written\n"
    assert (kubelet.work_root / NS / "claims" / "shared" / "job-1" / "state").exists()


async def test_a_killed_process_fails_with_exit_code_137_in_the_thread_runner(
    api: Api, tmp_path: Path
) -> None:
    runner = KubeletThread(api.url, tmp_path / "node")
    await asyncio.to_thread(runner.start)
    try:
        await api.client.create(pod("victim", "import time; time.sleep(60)"))
        await asyncio.to_thread(runner.wait_for_phase, NS, "victim", "Running")
        pid = runner.kubelet.pid(NS, "victim")
        assert pid is not None

        runner.kubelet.kill(NS, "victim")

        await asyncio.to_thread(runner.wait_for_phase, NS, "victim", "Failed")
        assert runner.kubelet.pid(NS, "victim") is None
        reported = await status(api, "victim")
        terminated = reported["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["signal"]) == (137, signal.SIGKILL)
        assert reported["containerStatuses"][0]["ready"] is False
    finally:
        await asyncio.to_thread(runner.stop)


TRAP_SIGTERM = """
import pathlib, signal, sys, time
def stop(*_):
    pathlib.Path(sys.argv[1]).write_text("SIGTERM")
    time.sleep(0.5)  # shutting down takes a while: the object must outlive the process
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


async def test_deletion_sends_sigterm_and_the_object_goes_after_the_process(
    api: Api, kubelet: LocalKubelet, tmp_path: Path
) -> None:
    marker = tmp_path / "terminated"
    await api.client.create(pod("graceful", TRAP_SIGTERM, args=(str(marker),)))
    await kubelet.wait_for_phase(NS, "graceful", "Running")
    await until(lambda: "ready" in kubelet.log_path(NS, "graceful").read_text())
    pid = kubelet.pid(NS, "graceful")
    assert pid is not None

    await api.client.delete(Pod, "graceful", namespace=NS)

    seen_while_running = False
    while await exists(api, "graceful"):
        seen_while_running |= not process_gone(pid)
        await asyncio.sleep(0.05)
    assert seen_while_running  # the object stayed while the process shut down
    assert process_gone(pid)
    assert marker.read_text() == "SIGTERM"
    await until(lambda: kubelet.pods() == [])


IGNORE_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
while True:
    time.sleep(0.05)
"""


async def test_a_process_ignoring_sigterm_is_killed_with_its_group_after_the_grace_period(
    api: Api, kubelet: LocalKubelet
) -> None:
    await api.client.create(pod("stubborn", IGNORE_SIGTERM, terminationGracePeriodSeconds=1))
    await kubelet.wait_for_phase(NS, "stubborn", "Running")
    log = kubelet.log_path(NS, "stubborn")
    child = int(await until(lambda: log.read_text().strip()))
    pid = kubelet.pid(NS, "stubborn")
    assert pid is not None

    deleted = time.monotonic()
    await api.client.delete(Pod, "stubborn", namespace=NS, grace_period=1)
    await until(lambda: process_gone(pid))

    assert 0.9 < time.monotonic() - deleted < 5.0
    await until(lambda: process_gone(child), timeout=2.0)  # the container's other processes
    await until(lambda: kubelet.pods() == [])


SERVE_NAME = """
import os, socket
server = socket.socket()
server.bind((os.environ["POD_IP"], int(os.environ["PORT"])))
server.listen()
print("listening", flush=True)
connection, _ = server.accept()
connection.sendall(os.environ["POD_NAME"].encode())
connection.close()
"""


async def test_two_pods_listen_on_the_same_port_on_their_own_pod_ips(
    api: Api, kubelet: LocalKubelet
) -> None:
    port = free_port()
    env = [
        field_ref("POD_IP", "status.podIP"),
        field_ref("POD_NAME", "metadata.name"),
        {"name": "PORT", "value": str(port)},
    ]
    for name in ("server-a", "server-b"):
        await api.client.create(pod(name, SERVE_NAME, env=env))

    answers = {}
    for name in ("server-a", "server-b"):
        await kubelet.wait_for_phase(NS, name, "Running")
        await until(lambda name=name: "listening" in kubelet.log_path(NS, name).read_text())
        pod_ip = (await status(api, name))["podIP"]
        reader, writer = await asyncio.open_connection(pod_ip, port)
        answers[pod_ip] = (await reader.read()).decode()
        writer.close()

    assert sorted(answers.values()) == ["server-a", "server-b"]  # at two addresses
    for name in ("server-a", "server-b"):
        assert await kubelet.wait_for_phase(NS, name, "Succeeded", "Failed") == "Succeeded"


async def test_a_missing_secret_holds_the_container_until_the_secret_exists(
    api: Api, kubelet: LocalKubelet
) -> None:
    env = [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "late", "key": "pw"}}}]
    await api.client.create(pod("patient", "import os; print(os.environ['PASSWORD'])", env=env))

    async def config_error() -> dict[str, Any] | None:
        statuses = (await status(api, "patient")).get("containerStatuses") or [{}]
        waiting: dict[str, Any] = statuses[0].get("state", {}).get("waiting", {})
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    waiting = await until(config_error)
    assert waiting["message"] == 'secret "late" not found'
    assert (await status(api, "patient"))["phase"] == "Pending"

    await api.client.create(secret("late", pw="finally"))

    assert await kubelet.wait_for_phase(NS, "patient", "Succeeded", "Failed") == "Succeeded"
    assert kubelet.log_path(NS, "patient").read_text() == "finally\n"


async def test_restart_policy_on_failure_restarts_the_container(
    api: Api, kubelet: LocalKubelet
) -> None:
    script = (
        "import os, sys\n"
        "if os.path.exists('tried'):\n    sys.exit(0)\n"
        "open('tried', 'w').close()\nsys.exit(1)\n"
    )
    await api.client.create(pod("flaky", script, restartPolicy="OnFailure"))

    assert await kubelet.wait_for_phase(NS, "flaky", "Succeeded", "Failed") == "Succeeded"
    container = (await status(api, "flaky"))["containerStatuses"][0]
    assert container["restartCount"] == 1
    assert container["lastState"]["terminated"]["exitCode"] == 1
    assert container["state"]["terminated"]["exitCode"] == 0


async def test_stop_kills_the_processes_of_pods_still_running(api: Api, tmp_path: Path) -> None:
    async with LocalKubelet(api.url, tmp_path / "node") as kubelet:
        await api.client.create(pod("left", "import time; time.sleep(60)"))
        await kubelet.wait_for_phase(NS, "left", "Running")
        pid = kubelet.pid(NS, "left")
        assert pid is not None
    assert process_gone(pid)


async def test_the_kubelet_waits_for_the_api_and_watches_again_after_restarts(
    tmp_path: Path,
) -> None:
    port = free_port()
    emulator = ApiServerEmulator()
    async with LocalKubelet(f"http://127.0.0.1:{port}", tmp_path / "node") as kubelet:
        await asyncio.sleep(0.2)  # nothing listens yet: its first requests fail
        async with serve(emulator, port=port) as url, connect(url) as client:
            await client.create(pod("first", "print('ok')"))
            assert await kubelet.wait_for_phase(NS, "first", "Succeeded", "Failed") == "Succeeded"

            emulator.stop_watches()  # an API server restart: watches end
            await client.create(pod("second", "print('ok')"))
            assert await kubelet.wait_for_phase(NS, "second", "Succeeded", "Failed") == "Succeeded"

            # While it reconnects, "first" goes, and the history too: resuming its watch gets
            # 410 Gone, and only listing again shows it that "first" is gone.
            emulator.stop_watches()
            emulator.delete_object("v1/pods", NS, "first", grace_period_seconds=0)
            emulator.compact()
            await client.create(pod("third", "print('ok')"))
            assert await kubelet.wait_for_phase(NS, "third", "Succeeded", "Failed") == "Succeeded"
            await until(lambda: sorted(p.name for p in kubelet.pods()) == ["second", "third"])


WRITE_MESSAGE = """
import sys
with open(sys.argv[1], "w") as message:
    message.write(sys.argv[2] * int(sys.argv[3]))
print("log line 1\\nlog line 2")
sys.exit(int(sys.argv[4]))
"""


async def test_the_termination_message_is_the_files_last_4096_bytes_else_the_log_tail(
    api: Api, kubelet: LocalKubelet
) -> None:
    custom = "/var/run/report"
    cases = {
        # name: (path in the spec, args, policy) -> expected message
        "short": (None, ("/dev/termination-log", "ok", "1", "0"), None),
        "long": (custom, (custom, "abc", "2000", "0"), None),
        "fallback": (None, ("/dev/termination-log", "", "0", "2"), "FallbackToLogsOnError"),
        "no-fallback": (None, ("/dev/termination-log", "", "0", "2"), "File"),
        "fallback-success": (None, ("/dev/termination-log", "", "0", "0"), "FallbackToLogsOnError"),
    }
    for name, (path, args, policy) in cases.items():
        created = pod(name, WRITE_MESSAGE, args=args)
        assert created.spec is not None
        created.spec.containers[0].terminationMessagePath = path
        created.spec.containers[0].terminationMessagePolicy = policy
        await api.client.create(created)
    messages = {}
    for name in cases:
        await kubelet.wait_for_phase(NS, name, "Succeeded", "Failed")
        terminated = (await status(api, name))["containerStatuses"][0]["state"]["terminated"]
        messages[name] = terminated.get("message")

    assert messages == {
        "short": "ok",
        "long": ("abc" * 2000)[-4096:],  # as a kubelet's tail.ReadAtMost keeps it
        "fallback": "log line 1\nlog line 2\n",
        "no-fallback": None,
        "fallback-success": None,
    }


async def test_a_projected_volume_holds_its_sources_files_with_their_modes(
    api: Api, kubelet: LocalKubelet, tmp_path: Path
) -> None:
    await api.client.create(secret("creds", password="s3cret"))
    words = {"metadata": {"name": "words", "namespace": NS}, "data": {"greeting": "hello"}}
    await api.client.create(ConfigMap.from_dict(words))
    sources = [
        {"secret": {"name": "creds", "items": [{"key": "password", "path": "db/password"}]}},
        {
            "configMap": {
                "name": "words",
                "items": [{"key": "greeting", "path": "greeting", "mode": 0o600}],
            }
        },
        {
            "downwardAPI": {
                "items": [{"path": "team", "fieldRef": {"fieldPath": "metadata.labels['team']"}}]
            }
        },
    ]
    volume = {"name": "all", "projected": {"defaultMode": 0o640, "sources": sources}}
    token = {"serviceAccountToken": {"path": "token"}}
    await api.client.create(pod("projected", "", volumes=[volume]))
    await api.client.create(
        pod("token", "", volumes=[{"name": "t", "projected": {"sources": [token]}}])
    )

    assert await kubelet.wait_for_phase(NS, "projected", "Succeeded", "Failed") == "Succeeded"
    files = tmp_path / "node" / NS / "projected" / "volumes" / "all"
    found = {
        str(path.relative_to(files)): (path.read_text(), path.stat().st_mode & 0o777)
        for path in files.rglob("*")
        if path.is_file()
    }
    assert found == {
        "db/password": ("s3cret", 0o640),
        "greeting": ("hello", 0o600),
        "team": ("streaming", 0o640),
    }
    assert await kubelet.wait_for_phase(NS, "token", "Succeeded", "Failed") == "Failed"
    unsupported = await status(api, "token")
    assert unsupported["reason"] == "UnsupportedVolume" and "'t'" in unsupported["message"]
