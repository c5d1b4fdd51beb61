"""A cluster on this machine for operator tests: the emulated API server, a kubelet (real
processes, or simulated drivers), and the operator itself as a real process (its command's
``main()``, started from a fork server: ``operator_child``; or its image in a container) that
a test can kill and start again."""

import asyncio
import contextlib
import copy
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import kmock

from helpers import containers
from helpers.kube import operator_child
from helpers.kube.emulator import EmulatedApiServer, spark_checkpoint_api
from helpers.kube.kubelet import KubeletThread
from helpers.kube.simulated import SimulatedAgent, SimulatedAgents, SimulatedKubelet
from helpers.ports import free_port
from helpers.spark_jvm import FAST_JVM
from spark_checkpoint_operator.kubernetes.handlers import (
    OPERATOR_NAMESPACE_VARIABLE,
    OPERATOR_POD_VARIABLE,
    OPERATOR_SERVICE_ACCOUNT_VARIABLE,
)

JOBS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs"
PODS = "v1/pods"
SECRETS = "v1/secrets"
EVENTS = "v1/events"
NAMESPACE = "default"
# The smallest job the operator accepts (its pods are never started by the tests using it).
MINIMAL_JOB: dict[str, Any] = {
    "apiVersion": "sparkcheckpoint.io/v1alpha1",
    "kind": "SparkCheckpointJob",
    "metadata": {"name": "orders", "namespace": NAMESPACE},
    "spec": {
        "image": "example/orders:1",
        "application": {"mainFile": "local:///opt/app/orders.py"},
        "checkpointing": {"interval": "10s", "storage": "s3a://bucket/checkpoints"},
    },
}
# The console script the package installs beside this interpreter, as users start it.
OPERATOR_COMMAND = str(Path(sys.executable).parent / "spark-checkpoint-operator")
# Where the operator runs as which service account (the chart's: its release's account).
OPERATOR_NAMESPACE = NAMESPACE
OPERATOR_SERVICE_ACCOUNT = "spark-checkpoint-operator"

T = TypeVar("T")


class _Started(Protocol):
    """A started operator, as ``multiprocessing.Process`` controls one."""

    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def is_alive(self) -> bool: ...


class OperatorProcess:
    """The operator's command (``spark-checkpoint-operator``: Kopf's ``run`` of its
    handlers), as it runs in its Deployment: a process of its own, with the Deployment's
    environment, started from a fork server that imported it once (``operator_child``)."""

    def __init__(self, kubeconfig: Path, log_path: Path, namespaces: tuple[str, ...]) -> None:
        self._kubeconfig = kubeconfig
        self.log_path = log_path
        self._namespaces = namespaces
        self._process: _Started | None = None
        self.starts = 0
        self.metrics_port = free_port()
        self.pod = "spark-checkpoint-operator-0"
        self.settings: dict[str, str] = {}  # the operator's environment variables, set by hand

    def _launch(self) -> _Started:
        environment = {
            **os.environ,
            "KUBECONFIG": str(self._kubeconfig),
            "SPARK_CHECKPOINT_METRICS_PORT": str(self.metrics_port),
            # As the chart's Deployment gives them (the downward API).
            OPERATOR_NAMESPACE_VARIABLE: OPERATOR_NAMESPACE,
            OPERATOR_SERVICE_ACCOUNT_VARIABLE: OPERATOR_SERVICE_ACCOUNT,
            # One pod: a restart is its container's (the same holder of the jobs' Leases).
            OPERATOR_POD_VARIABLE: self.pod,
            **self.settings,
        }
        arguments = [f"--namespace={n}" for n in self._namespaces]
        return operator_child.start(arguments, environment, str(self.log_path))

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"--- operator start {self.starts + 1}\n".encode())
        self._process = self._launch()
        self.starts += 1

    def kill(self) -> None:
        """``kill -9``: no handler gets to clean anything up."""
        if self._process is not None:
            # Only a live one: the process id of one that ended may be another's by now.
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
            self._process = None

    def stop(self, timeout: float = 30.0) -> None:
        if self._process is None:
            return
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class OperatorContainer(OperatorProcess):
    """The operator image run as the chart's Deployment runs it (its command and arguments,
    environment, securityContext and /tmp volume) in a Podman container on the host's
    network, with a kubeconfig for the emulated API server mounted read-only. Stopping it
    sends SIGTERM through Podman's client, as the kubelet stops a pod."""

    KUBECONFIG_DIR = "/etc/spark-checkpoint-kubeconfig"

    def __init__(
        self, image: str, kubeconfig: Path, log_path: Path, namespaces: tuple[str, ...]
    ) -> None:
        super().__init__(kubeconfig, log_path, namespaces)
        self.image = image
        self.health_port = free_port()
        self._name = f"spark-checkpoint-operator-{os.getpid()}-{self.metrics_port}"
        # Readable by the image's user: pytest's own directories are root's alone.
        self._mounted = kubeconfig.parent / "operator-kubeconfig"
        self._mounted.mkdir(mode=0o755, exist_ok=True)
        self._mounted.chmod(0o755)

    def _launch(self) -> _Started:
        config = self._mounted / "config"
        config.write_bytes(self._kubeconfig.read_bytes())
        config.chmod(0o644)
        settings = {"KUBECONFIG": f"{self.KUBECONFIG_DIR}/config", **self.settings}
        deployment = containers.chart_deployment(
            {
                "watchNamespaces": list(self._namespaces),
                "operator": {
                    "healthPort": self.health_port,
                    "env": [{"name": name, "value": value} for name, value in settings.items()],
                },
            }
        )
        pod_spec = copy.deepcopy(deployment["spec"]["template"]["spec"])
        (container,) = pod_spec["containers"]
        # The chart keeps the metrics on 9090 (operator.env may not move them); containers
        # here share the host's network, each on a port of its own.
        container["env"].append(
            {"name": "SPARK_CHECKPOINT_METRICS_PORT", "value": str(self.metrics_port)}
        )
        pod_spec["volumes"].append({"name": "kubeconfig", "hostPath": {"path": str(self._mounted)}})
        container["volumeMounts"].append(
            {"name": "kubeconfig", "mountPath": self.KUBECONFIG_DIR, "readOnly": True}
        )
        options, arguments = containers.pod_container_options(
            self.image,
            pod_spec,
            container,
            volumes={"kubeconfig": self._mounted},
            namespace=deployment["metadata"]["namespace"],
        )
        command = [
            *containers.podman_command("run", "--rm", "--pull=never", "--network=host"),
            *("--name", self._name, *options, self.image, *arguments),
        ]
        with self.log_path.open("ab") as log:
            podman = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=containers.environment(),
                start_new_session=True,
            )
        return _PodmanRun(podman, self._name)

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/healthz"


class _PodmanRun:
    """``podman run`` of the operator's container, controlled as a process."""

    def __init__(self, podman: "subprocess.Popen[bytes]", name: str) -> None:
        self._podman = podman
        self._name = name

    def terminate(self) -> None:
        self._podman.terminate()

    def kill(self) -> None:
        """``kill -9`` of the container (Podman's client cannot pass SIGKILL on)."""
        subprocess.run(
            containers.podman_command("kill", "--signal", "KILL", self._name),
            env=containers.environment(),
            capture_output=True,
            check=False,
            timeout=60,
        )

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._podman.wait(timeout)

    def is_alive(self) -> bool:
        return self._podman.poll() is None


class _LoopThread:
    """An event loop in a daemon thread for the simulated kubelet and agents."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, function: Callable[[], T]) -> T:
        async def call() -> T:
            return function()

        return self.run(call())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class LocalCluster:
    """``with LocalCluster(tmp_path) as cluster:`` runs real drivers (the kubelet runs pod
    processes); ``LocalCluster(tmp_path, simulated=SimulatedAgents(...))`` runs simulated
    ones, and with ``pod_containers=True`` runs each pod as a Podman container from its
    image. The operator starts with the cluster unless ``operator=False``: a
    ``spark-checkpoint-operator`` process of this checkout, or with ``operator_image`` that
    image in a container."""

    def __init__(
        self,
        work_dir: Path,
        *,
        simulated: SimulatedAgents | None = None,
        operator: bool = True,
        namespaces: tuple[str, ...] = (NAMESPACE,),
        operator_image: str | None = None,
        pod_containers: bool = False,
    ) -> None:
        self._pod_containers = pod_containers
        self.work_dir = work_dir
        self._operator_image = operator_image
        self._simulated_agents = simulated
        self._start_operator = operator
        self._namespaces = namespaces
        self._stack = contextlib.ExitStack()
        self.api: EmulatedApiServer
        self.operator: OperatorProcess
        self.kubelet: KubeletThread | None = None
        self._simulated: tuple[_LoopThread, SimulatedKubelet] | None = None

    def __enter__(self) -> Self:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.api = self._stack.enter_context(spark_checkpoint_api())
            kubeconfig = self.api.write_kubeconfig(self.work_dir / "kubeconfig")
            for namespace in self._namespaces:
                with contextlib.suppress(kmock.KubernetesError):  # "default" exists already
                    self.api.create("v1/namespaces", {"metadata": {"name": namespace}})
            if self._simulated_agents is None:
                self.kubelet = self._stack.enter_context(
                    KubeletThread(
                        self.api.url, self.work_dir / "pods", containers=self._pod_containers
                    )
                )
            else:
                self._start_simulated(self._simulated_agents)
            log = self.work_dir / "operator.log"
            if self._operator_image is None:
                self.operator = OperatorProcess(kubeconfig, log, self._namespaces)
            else:
                self.operator = OperatorContainer(
                    self._operator_image, kubeconfig, log, self._namespaces
                )
            self._stack.callback(self.operator.stop)
            if self._start_operator:
                self.operator.start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stack.close()

    def _start_simulated(self, agents: SimulatedAgents) -> None:
        thread = _LoopThread()
        kubelet = SimulatedKubelet(self.api.url, agents)
        thread.run(agents.start())
        thread.run(kubelet.start())
        self._simulated = (thread, kubelet)

        def stop() -> None:
            thread.run(kubelet.stop())
            thread.run(agents.stop())
            thread.close()

        self._stack.callback(stop)

    # ------------------------------------------------------------------ jobs

    def apply(self, document: Mapping[str, Any]) -> dict[str, Any]:
        namespace = document["metadata"].get("namespace", NAMESPACE)
        return self.api.create(JOBS, document, namespace=namespace)

    def patch_spec(self, name: str, spec: Mapping[str, Any], namespace: str = NAMESPACE) -> None:
        self.api.patch(JOBS, namespace, name, {"spec": spec})

    def delete(self, name: str, namespace: str = NAMESPACE) -> None:
        self.api.delete(JOBS, namespace, name)

    def job(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        try:
            return self.api.get(JOBS, namespace, name)
        except kmock.KubernetesError as error:
            if error.status == 404:
                return None
            raise

    def status(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        job = self.job(name, namespace)
        assert job is not None, f"{namespace}/{name} does not exist"
        status: dict[str, Any] = job.get("status") or {}
        return status

    def pods(self, name: str, namespace: str = NAMESPACE, component: str = "") -> list[Any]:
        selector = f"sparkcheckpoint.io/job={name}"
        if component:
            selector += f",sparkcheckpoint.io/component={component}"
        return self.api.list(PODS, namespace, labels=selector)

    def events(self, name: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return [
            event
            for event in self.api.list(EVENTS, namespace)
            if event.get("involvedObject", {}).get("name") == name
        ]

    def event_reasons(self, name: str, namespace: str = NAMESPACE) -> list[str]:
        return [event.get("reason", "") for event in self.events(name, namespace)]

    def wait_for_event(
        self, name: str, reason: str = "", containing: str = "", timeout: float = 30.0
    ) -> dict[str, Any]:
        """The job's first event with ``reason`` (any if empty) whose message contains
        ``containing``: Kopf posts events from a queue, so one may arrive after the status
        write a test waited for."""

        def found() -> dict[str, Any] | None:
            for event in self.events(name):
                if reason in ("", event.get("reason")) and containing in event.get("message", ""):
                    return event
            return None

        return dict(self.wait_for(f"event {reason} {containing!r}".strip(), found, timeout))

    def wait_for(
        self,
        what: str,
        condition: Callable[[], Any],
        timeout: float = 60.0,
        job: str | None = None,
    ) -> Any:
        """Poll ``condition`` until it returns something truthy; on timeout, fail with the
        job's status and the operator's log."""
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                status = self.status(job) if job and self.job(job) else None
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n"
                    f"status: {status}\noperator log:\n{self.operator.log_tail()}"
                )
            time.sleep(0.2)

    # ------------------------------------------------------------------ drivers

    def simulated_agent(self, pod: str, namespace: str = NAMESPACE) -> SimulatedAgent | None:
        assert self._simulated is not None, "the cluster runs real drivers"
        thread, kubelet = self._simulated
        return thread.call(lambda: kubelet.agent(namespace, pod))

    def crash_driver(self, pod: str, namespace: str = NAMESPACE, exit_code: int = 137) -> None:
        """The driver dies as with ``kill -9`` (a real process, or a simulated one); a
        simulated one may end with another ``exit_code``."""
        if self._simulated is not None:
            thread, kubelet = self._simulated
            thread.call(lambda: kubelet.crash(namespace, pod, exit_code))
        else:
            assert exit_code == 137, "a real driver is killed"

            assert self.kubelet is not None
            self.kubelet.kubelet.kill(namespace, pod, signal.SIGKILL)

    def driver_pods(self, name: str, namespace: str = NAMESPACE) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.pods(name, namespace, "driver"))


def refused_requests(
    cluster: LocalCluster, matches: Callable[[Any], bool], error: kmock.KubernetesError
) -> threading.Event:
    """The API server answers the requests ``matches`` picks with ``error`` while the
    returned event is set (clear it to let them through)."""
    refusing = threading.Event()
    refusing.set()
    cluster.api.call(
        lambda emulator: emulator[lambda request: refusing.is_set() and matches(request)] << error
    )
    return refusing


def wordcount_job(
    name: str, pipeline: Path, input_dir: Path, output_dir: Path, **spec: Any
) -> dict[str, Any]:
    """The word count example as a job the local kubelet runs (its paths are this
    machine's); ``spec`` adds to the spec (``env`` to the application's)."""
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "image": "example/wordcount:1",
            "application": {
                "mainFile": f"local://{pipeline}",
                "arguments": ["--input", str(input_dir), "--output", str(output_dir)],
                "sparkConf": {
                    "spark.master": "local[2]",
                    "spark.sql.shuffle.partitions": "2",
                    # For container pods (and a real cluster's), which do not inherit the
                    # tests' SPARK_SUBMIT_OPTS (helpers/spark_jvm.py) as process pods do.
                    "spark.driver.extraJavaOptions": FAST_JVM,
                },
                "env": spec.pop("env", []),
            },
            **spec,
        },
    }


@contextlib.contextmanager
def operator_stopped(cluster: LocalCluster) -> Iterator[None]:
    """The operator is down for the block (its pods and status stay), then starts again."""
    cluster.operator.kill()
    try:
        yield
    finally:
        cluster.operator.start()
