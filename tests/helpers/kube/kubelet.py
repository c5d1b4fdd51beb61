"""A local "kubelet" for tests: runs the Pod objects of a Kubernetes API as local processes,
or (``containers=True``) as Podman containers from their images.

No cluster exists in CI, so operator tests need something that turns the pods the operator
creates into running Spark drivers and reports their phases back, as a kubelet would. This
one is an ordinary API client (lightkube, plain http, no auth) of `helpers.kube.emulator` or
a real API server (kmock's stock emulator serves no `pods/binding` and deletes pods at once):
it watches pods, binds the unbound ones to itself, starts each pod's container as a process,
patches the `status` subresource, and on graceful deletion stops the process and then
deletes the object with gracePeriodSeconds=0, so a pod object disappears only after its
process is gone, as on a real node.

Container mode (``containers=True``; root and Podman, tests/helpers/containers.py): each
pod's container is `podman create`d from the pod's image (never pulled: a missing image
keeps the pod Pending, ErrImageNeverPull) and run attached, its output going to the same log
file, with:

- its securityContext over the pod's (user, group, readOnlyRootFilesystem without Podman's
  writable /tmp, /var/tmp and /run, capabilities, no privilege escalation, fsGroup as a
  supplemental group); runAsNonRoot checked against the image's user, as the kubelet does
  (else Pending, CreateContainerConfigError);
- its env (the image's own environment under it), command (replacing the image's
  entrypoint) and args with `$(VAR)` expansion, and workingDir: nothing is rewritten, the
  mounts are real bind mounts of the volumes' directories below, at their mountPath,
  read-only where the mount says so; the termination message file is bind-mounted at
  terminationMessagePath;
- with the pod's fsGroup, every volume but hostPath owned by that group as a kubelet does
  it: group-readable files (and group-writable in emptyDir and claim volumes), setgid
  directories; emptyDirs are mode 0777;
- the host's network (no network namespace; the pod still binds its own 127.x.y.z pod IP),
  the pod's name as hostname, resolving to the pod IP (/etc/hosts, as a kubelet writes it);
- exit codes and reasons from Podman (137 after SIGKILL, OOMKilled; StartError with exit 128
  when runc cannot start the command); containerID `podman://<id>`, imageID the image's id;
- deletion: `podman stop --time <grace period>` (SIGTERM to the container's PID 1, SIGKILL
  after the grace period); `kill()` is `podman kill --signal`; `stop()` removes every
  container of this kubelet (by its label). Containers outlive a killed test run (they are
  not children of it): `podman ps --filter label=io.spark-checkpoint.local-kubelet` lists
  them.

Simplifications (a process is not a container; in container mode, the points about
mounts, environment and processes do not apply):

- Exactly one container; a pod with more, or with initContainers, gets phase Failed.
- No image: the container must have a `command`; `argv = command + args` after `$(VAR)`
  expansion. A bare `python`/`python3` as argv[0] is this interpreter (`sys.executable`):
  the image's Python is the venv's. Other names are looked up on the container's PATH,
  whose first entry is the venv's bin directory (so installed console scripts resolve).
- Environment: `base_env` (the "image's" ENV; by default PATH, HOME, JAVA_HOME, LANG,
  LC_ALL, TZ, TMPDIR, PYTHONPATH, SPARK_HOME, SPARK_SUBMIT_OPTS of this process, not all of
  `os.environ`, so test settings do not leak into pods), `HOSTNAME` = the pod's name, then
  `envFrom` and `env` in order with Kubernetes' `$(VAR)` expansion (`$$` escapes, unknown
  references stay). `fieldRef` supports metadata.name/namespace/uid, metadata.labels['k'],
  metadata.annotations['k'], spec.nodeName, spec.serviceAccountName (default "default"),
  status.podIP(s) and status.hostIP(s). `resourceFieldRef` is not supported (phase Failed).
  No service environment variables (`KUBERNETES_SERVICE_HOST`, ...), no service-account
  token mount. Env and volumes are resolved once per pod, not again on container restarts.
- A missing secret/configmap (or key) that is not optional keeps the pod Pending with the
  container waiting: reason CreateContainerConfigError for env, ContainerCreating for
  volumes, as on a real node; it is retried every half second until it appears.
- Networking: every pod gets its own address from 127.0.0.0/8 (127.x.y.2, .3, ... in a /24
  each kubelet picks at random; Linux routes all of 127/8 to loopback), so two pods, even of
  two test runs, can listen on the same port if they bind to their pod IP (`status.podIP`
  through a fieldRef), not to 0.0.0.0. hostIP is 127.0.0.1.
- Volumes: secret, configMap (files from data/binaryData, and `stringData`, which an
  emulator may keep; `items`, `defaultMode`, `optional` honoured, mode 0o644 by default),
  downwardAPI (fieldRef items), emptyDir (a fresh directory per pod), hostPath (the real
  path; DirectoryOrCreate creates it) and persistentVolumeClaim (a ReadWriteMany volume of
  this node: `<work_root>/<namespace>/claims/<claimName>`, shared by the namespace's pods and
  kept after them; no PersistentVolumeClaim object is needed), projected (secret, configMap
  and downwardAPI sources). Others (nfs, serviceAccountToken projections, ...) fail the pod.
  Secret and configMap files are written when the pod starts, not refreshed.
- Mounts: a process cannot mount, so each volumeMount's `mountPath` maps to a directory:
  `<work_root>/<namespace>/<pod>/volumes/<volume>[/<subPath>]`, or the hostPath itself. Every
  occurrence of a mount path that starts a path (at the start of a string or after a
  character such as `=`, `:` or a space, and followed by `/` or the end of the path) in env
  values, command, args and workingDir is rewritten to its directory, longest mount path
  first, once (values are rewritten before `$(VAR)` expansion, so nothing is rewritten
  twice). A path built any other way (read from a config file, joined from parts at run
  time) is not rewritten. `readOnly` is applied by removing the write bits of the files of
  secret, configMap and downwardAPI volumes; it is not enforced for emptyDir and hostPath
  (and root ignores file modes anyway).
- workingDir is honoured after rewriting and must exist on this machine (else Failed);
  without it the process runs in the pod's sandbox `<work_root>/<namespace>/<pod>/`.
- stdout and stderr go to `<work_root>/<namespace>/<pod>/container.log`, appended across
  container restarts; a new pod of the same name moves it to `container.previous.log`.
- The process gets its own session (`start_new_session`), and dies with the kubelet's thread
  (PR_SET_PDEATHSIG=SIGKILL on Linux, set by `dying_with_parent`, never in a `preexec_fn`,
  which deadlocked a child forked from this threaded process), so a killed test leaves no
  drivers behind.
- Stop: on deletion the main process gets SIGTERM (what a container runtime sends to the
  container's PID 1; a Spark driver's JVM does not get it directly), after
  `deletionGracePeriodSeconds` (else the pod's terminationGracePeriodSeconds, else 30 s) the
  whole process group gets SIGKILL. When the main process exits, whatever is left in its
  process group is killed, as a container's processes die with its PID 1. preStop hooks,
  probes (a started container is ready at once), activeDeadlineSeconds and resource limits
  are ignored; a grace period shortened after termination began is not honoured.
- restartPolicy: Never; OnFailure and Always (the default) restart the container after a
  fixed 1 s back-off, counting restartCount and keeping lastState.
- It schedules too: an unbound pod is bound to it through `pods/<name>/binding`, as a
  scheduler does; a pod bound to another node is ignored. A pod already Running on this
  node when the kubelet first sees it (a kubelet restarted under it) is reported Failed:
  its process is lost.
- Termination messages: `terminationMessagePath` (default /dev/termination-log) is a file
  in the sandbox (rewritten in env, command and args like a mount path), empty at start;
  its last 4096 bytes become the terminated state's `message`, else with
  `terminationMessagePolicy: FallbackToLogsOnError` and a non-zero exit the log's last 80
  lines (at most 2048 bytes), as on a real node.
- Exit codes as Kubernetes reports them: the process's code, or 128+N with `signal: N` when
  signal N killed it (137 for SIGKILL); reason Completed or Error; 128 with reason
  StartError when the executable cannot be started.
"""

import asyncio
import base64
import contextlib
import datetime
import errno
import hashlib
import ipaddress
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Self, TypeVar

import httpx2
import msgspec
from lightkube import ALL_NS, AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ApiError, NotReadyError
from lightkube.models.core_v1 import (
    ConfigMapEnvSource,
    ConfigMapKeySelector,
    ConfigMapVolumeSource,
    Container,
    DownwardAPIVolumeFile,
    KeyToPath,
    ObjectFieldSelector,
    ObjectReference,
    PodSpec,
    SecretEnvSource,
    SecretKeySelector,
    SecretVolumeSource,
    Volume,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret
from lightkube.types import PatchType

from helpers import containers
from spark_checkpoint_operator.child_process import dying_with_parent

log = logging.getLogger(__name__)

HOST_IP = "127.0.0.1"
# Container mode: the label on every container of one kubelet (its value: the kubelet).
CONTAINER_LABEL = "io.spark-checkpoint.local-kubelet"


def _first_pod_ip() -> ipaddress.IPv4Address:
    """The first address of a random 127.x.y.0/24: kubelets of test runs in parallel give
    their pods different addresses, so their agents never compete for one port."""
    return ipaddress.IPv4Address(f"127.{random.randrange(1, 255)}.{random.randrange(256)}.2")


DEFAULT_MODE = 0o644  # Kubernetes' defaultMode 420
DEFAULT_GRACE_SECONDS = 30.0
STOP_GRACE_SECONDS = 2.0  # how long stop() lets processes end on SIGTERM
RETRY_SECONDS = 0.5  # missing secrets, lost API connections
RESTART_BACKOFF_SECONDS = 1.0
IMAGE_ENV_NAMES = (
    "PATH",
    "HOME",
    "JAVA_HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "SPARK_HOME",
    "SPARK_SUBMIT_OPTS",
)
# Kubernetes' termination messages: the file's last 4096 bytes (tail.ReadAtMost), else with
# FallbackToLogsOnError after a failure the log's last 80 lines, at most 2048 bytes.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
TERMINAL_PHASES = ("Succeeded", "Failed")

T = TypeVar("T")


class PodSummary(NamedTuple):
    """A pod on the node, as `LocalKubelet.pods()` lists it."""

    namespace: str
    name: str
    phase: str


class _Waiting(Exception):
    """The container cannot start yet (e.g. a secret is missing); retried."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class _PodFailed(Exception):
    """The pod can never run here: it ends in phase Failed with this reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class _Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass
class _ContainerLaunch:
    """Container mode: `podman create OPTIONS IMAGE ARGUMENTS`."""

    image: str
    options: list[str]
    arguments: list[str]


@dataclass
class _PodState:
    """What the kubelet knows about one pod object (one uid) while it exists."""

    pod: Pod
    sandbox: Path
    deletion: asyncio.Event = field(default_factory=asyncio.Event)
    gone: bool = False  # the object no longer exists: no more API calls for it
    ip: str | None = None
    phase: str = "Pending"  # as last reported
    process: asyncio.subprocess.Process | None = None
    container_name: str | None = None  # container mode: the container, while it exists
    container_id: str | None = None
    image_id: str = ""
    start_time: str | None = None
    restart_count: int = 0
    last_state: dict[str, Any] = field(default_factory=dict)
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    @property
    def namespace(self) -> str:
        return _key(self.pod)[0]

    @property
    def name(self) -> str:
        return _key(self.pod)[1]

    @property
    def container(self) -> Container:
        return _spec(self.pod).containers[0]


class LocalKubelet:
    """Runs the pods of one API server (optionally of one namespace) as local processes.

    Use as `async with LocalKubelet(url, tmp_path) as kubelet:` in the test's event loop, or
    through `KubeletThread`. The test controls (`kill`, `pid`, `log_path`, `pods`) are
    thread-safe.
    """

    def __init__(
        self,
        api_url: str,
        work_root: Path,
        node_name: str = "local-kubelet",
        namespace: str | None = None,
        base_env: Mapping[str, str] | None = None,
        *,
        containers: bool = False,
    ) -> None:
        self.api_url = api_url
        self.containers = containers
        # Labels this kubelet's containers, so that stop() finds every one of them.
        self._instance = f"{node_name}-{os.getpid()}-{random.getrandbits(32):08x}"
        self.work_root = work_root
        self.node_name = node_name
        self.namespace = namespace
        self.base_env = dict(_image_env() if base_env is None else base_env)
        self._pods: dict[tuple[str, str], _PodState] = {}
        self._lock = threading.Lock()  # guards _pods for the test controls
        self._next_ip = _first_pod_ip()
        self._client: AsyncClient | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        config = KubeConfig.from_one(cluster=Cluster(server=self.api_url), user=User())
        self._client = AsyncClient(config, lazy=False, trust_env=False, field_manager="kubelet")
        if self.containers:
            await _remove_orphans()
        self._watcher = asyncio.create_task(self._watch(), name="kubelet-watch")

    async def stop(self) -> None:
        """Stops watching and kills every process it started; leaves the objects as they are."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        with self._lock:
            states = list(self._pods.values())
        tasks = [s.task for s in states if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # An exited process's group was killed when it exited, and its pid may be reused.
        processes = [s.process for s in states if s.process and s.process.returncode is None]
        await asyncio.gather(*(_end_process(p, STOP_GRACE_SECONDS) for p in processes))
        if self.containers:
            await _remove_containers(f"label={CONTAINER_LABEL}={self._instance}")
        if self._client is not None:
            await self._client.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # Test controls.

    def kill(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> None:
        """Signals the pod's main process, e.g. SIGKILL to simulate a crashing driver (in
        container mode, `podman kill --signal` of its container)."""
        if self.containers:
            with self._lock:
                state = self._pods.get((namespace, name))
            container = state.container_name if state is not None else None
            if container is None:
                raise ProcessLookupError(f"pod {namespace}/{name} has no container")
            killed = subprocess.run(
                containers.podman_command("kill", "--signal", str(int(sig)), container),
                env=containers.environment(),
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            if killed.returncode != 0:
                raise ProcessLookupError(f"pod {namespace}/{name}: {killed.stderr.strip()}")
            return
        pid = self.pid(namespace, name)
        if pid is None:
            raise ProcessLookupError(f"pod {namespace}/{name} has no running process")
        os.kill(pid, sig)

    def pid(self, namespace: str, name: str) -> int | None:
        """The pid of the pod's running main process; None when nothing runs."""
        with self._lock:
            state = self._pods.get((namespace, name))
        process = state.process if state is not None else None
        if process is None or process.returncode is not None:
            return None
        return process.pid

    def log_path(self, namespace: str, name: str) -> Path:
        """Where the pod's stdout and stderr go (kept after the pod is deleted)."""
        return self.work_root / namespace / name / "container.log"

    def pods(self) -> list[PodSummary]:
        """The pods on this node, each with the phase last reported for it."""
        with self._lock:
            return [PodSummary(s.namespace, s.name, s.phase) for s in self._pods.values()]

    async def wait_for_phase(
        self, namespace: str, name: str, *phases: str, timeout: float = 10.0
    ) -> str:
        """Waits until the phase reported for the pod is one of `phases`, and returns it."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                state = self._pods.get((namespace, name))
            phase = state.phase if state is not None else None
            if phase in phases:
                return phase
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"pod {namespace}/{name} is {phase or 'unknown'}, not {'/'.join(phases)}, "
                    f"after {timeout}s; its log ends:\n{self._log_tail(namespace, name)}"
                )
            await asyncio.sleep(0.05)

    def _log_tail(self, namespace: str, name: str) -> str:
        try:
            return self.log_path(namespace, name).read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    # The watch.

    @property
    def _api(self) -> AsyncClient:
        assert self._client is not None, "start() the kubelet first"
        return self._client

    async def _watch(self) -> None:
        """List, then watch from the list's version; relist after 410 Gone, retry on errors."""
        namespace = self.namespace or ALL_NS
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._relist(namespace)
                async for event, pod in self._api.watch(
                    Pod, namespace=namespace, resource_version=version
                ):
                    version = _meta(pod).resourceVersion or version
                    self._dispatch(event, pod)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if _http_status(error) == 410:
                    version = None
                else:
                    log.warning("kubelet: pod watch failed, retrying: %r", error)
                    await asyncio.sleep(RETRY_SECONDS)

    async def _relist(self, namespace: str) -> str | None:
        listing = self._api.list(Pod, namespace=namespace)
        seen: set[tuple[str, str]] = set()
        async for pod in listing:
            self._dispatch("ADDED", pod)
            seen.add(_key(pod))
        with self._lock:
            vanished = [s for k, s in self._pods.items() if k not in seen]
        for state in vanished:  # deleted while nobody watched
            self._forget(state)
        try:
            return listing.resourceVersion
        except NotReadyError:
            return None

    def _dispatch(self, event: str, pod: Pod) -> None:
        """Routes one event to its pod's worker; a repeated ADDED counts as MODIFIED."""
        meta, spec = _meta(pod), _spec(pod)
        key = _key(pod)
        with self._lock:
            state = self._pods.get(key)
        if state is not None and _meta(state.pod).uid not in (None, meta.uid):
            self._forget(state)  # deleted and created again under the same name
            state = None
        if event == "DELETED":
            if state is not None:
                state.pod = pod
                self._forget(state)
            return
        if state is not None:
            state.pod = pod
            if meta.deletionTimestamp is not None:
                state.deletion.set()
            return
        if spec.nodeName not in (None, self.node_name):
            return
        if spec.nodeName is None and meta.deletionTimestamp is not None:
            return  # the API server removes an unbound pod at once
        state = _PodState(pod=pod, sandbox=self.work_root / key[0] / key[1])
        if meta.deletionTimestamp is not None:
            state.deletion.set()
        with self._lock:
            self._pods[key] = state
        state.task = asyncio.create_task(self._run_pod(state), name=f"pod {key[0]}/{key[1]}")

    def _forget(self, state: _PodState) -> None:
        """The object is gone: its process is stopped and no more API calls are made for it."""
        state.gone = True
        state.deletion.set()
        with self._lock:
            if self._pods.get((state.namespace, state.name)) is state:
                del self._pods[state.namespace, state.name]

    # One pod's life.

    async def _run_pod(self, state: _PodState) -> None:
        try:
            await self._start_pod(state)
        except _PodFailed as failure:
            await self._report_failed(state, failure.reason, failure.message)
        except Exception as error:  # one bad pod must not stop the kubelet
            log.exception("kubelet: pod %s/%s failed", state.namespace, state.name)
            await self._report_failed(state, "KubeletError", f"local kubelet: {error!r}")
        await state.deletion.wait()
        if not state.gone:
            await self._call(
                state,
                lambda: self._api.delete(
                    Pod, state.name, namespace=state.namespace, grace_period=0
                ),
            )

    async def _start_pod(self, state: _PodState) -> None:
        spec = _spec(state.pod)
        seen_phase = state.pod.status.phase if state.pod.status is not None else None
        if spec.nodeName == self.node_name and seen_phase in ("Running", *TERMINAL_PHASES):
            assert seen_phase is not None
            state.phase = seen_phase
            if seen_phase == "Running":
                raise _PodFailed("ProcessLost", "the local kubelet restarted; the process is lost")
            return
        if state.deletion.is_set():
            return
        if spec.nodeName is None:  # the kubelet is the scheduler too
            await self._call(state, lambda: self._bind(state))
        state.ip = str(self._next_ip)
        self._next_ip += 1
        # A new pod: fresh emptyDirs and log; the log of an earlier pod of this name is kept.
        shutil.rmtree(state.sandbox / "volumes", ignore_errors=True)
        state.sandbox.mkdir(parents=True, exist_ok=True)
        log_file = state.sandbox / "container.log"
        if log_file.exists():
            log_file.replace(state.sandbox / "container.previous.log")
        state.start_time = _now()
        _check_supported(spec)
        await self._report(state, "Pending", _waiting("ContainerCreating"))
        launch = await self._prepare_until_ready(state)
        if launch is not None:
            await self._run_container(state, launch)

    async def _bind(self, state: _PodState) -> None:
        binding = Pod.Binding(
            metadata=ObjectMeta(name=state.name, namespace=state.namespace),
            target=ObjectReference(apiVersion="v1", kind="Node", name=self.node_name),
        )
        # The API answers a Status, which lightkube fails to read as the Binding it expects.
        with contextlib.suppress(msgspec.ValidationError):
            await self._api.create(binding, state.name, namespace=state.namespace)

    async def _prepare_until_ready(self, state: _PodState) -> "_Launch | _ContainerLaunch | None":
        """Resolves env and volumes, retrying while a secret or configmap is missing."""
        reported: tuple[str, str] | None = None
        while not state.deletion.is_set():
            try:
                return await self._prepare(state)
            except _Waiting as waiting:
                if reported != (waiting.reason, waiting.message):
                    reported = (waiting.reason, waiting.message)
                    await self._report(state, "Pending", _waiting(*reported))
                await _wait_event(state.deletion, RETRY_SECONDS)
        return None

    async def _run_container(self, state: _PodState, launch: "_Launch | _ContainerLaunch") -> None:
        while True:
            if isinstance(launch, _ContainerLaunch):
                code, terminated = await self._run_in_container(state, launch)
            else:
                code, terminated = await self._run_process(state, launch)
            if state.deletion.is_set() or not _restarts(_spec(state.pod), code):
                break
            state.restart_count += 1
            state.last_state = terminated
            await self._report(state, "Running", _waiting("CrashLoopBackOff"))
            await _wait_event(state.deletion, RESTART_BACKOFF_SECONDS)
            if state.deletion.is_set():
                break
        await self._report(state, "Succeeded" if code == 0 else "Failed", terminated)

    async def _run_process(self, state: _PodState, launch: _Launch) -> tuple[int, dict[str, Any]]:
        """Runs the container once, until it exits or the pod is deleted."""
        grace = _grace_seconds(state.pod)
        process, code, started = await self._attend(
            state, launch, lambda running: _end_process(running, grace)
        )
        _signal_group(process, signal.SIGKILL)  # the container's other processes die with it
        terminated = _terminated(code, started)
        if message := _termination_message(state, terminated["terminated"]["exitCode"]):
            terminated["terminated"]["message"] = message
        return code, terminated

    async def _run_in_container(
        self, state: _PodState, launch: _ContainerLaunch
    ) -> tuple[int, dict[str, Any]]:
        """Container mode: creates the container, runs it attached (its output goes to the
        pod's log) until it exits or the pod is deleted (then `podman stop` with the grace
        period: SIGTERM to its PID 1, SIGKILL after it), reads how it ended from Podman and
        removes it."""
        meta = _meta(state.pod)
        name = f"k8s_{state.container.name}_{state.name}_{state.namespace}_{meta.uid}"
        name += f"_{state.restart_count}"
        created = await _podman(
            *("create", "--name", name, "--pull=never", "--network=host"),
            # As a kubelet writes /etc/hosts: the pod's name resolves to its IP (Spark looks
            # its host up at start).
            *("--hostname", state.name, "--add-host", f"{state.name}:{state.ip}"),
            *("--label", f"{CONTAINER_LABEL}={self._instance}"),
            *launch.options,
            launch.image,
            *launch.arguments,
        )
        if created.returncode != 0:
            raise _PodFailed("CreateContainerError", _last_line(created.stderr))
        state.container_name, state.container_id = name, created.stdout.strip()
        try:
            inspected = await _podman("container", "inspect", "--format", "{{.Image}}", name)
            state.image_id = inspected.stdout.strip()
            attach = containers.podman_command("start", "--attach", name)
            grace = str(math.ceil(_grace_seconds(state.pod)))

            async def stop(_: asyncio.subprocess.Process) -> None:
                await _podman("stop", "--time", grace, name)

            async def running(process: asyncio.subprocess.Process) -> None:
                # A kubelet reports Running once the runtime runs the container: until then
                # Podman has it "created" (a `podman kill` then fails: "container state
                # improper"); one that never starts ends its `start --attach`.
                while process.returncode is None:
                    status = await _podman(
                        "container", "inspect", "--format", "{{.State.Status}}", name
                    )
                    if status.stdout.strip() != "created":
                        return
                    await asyncio.sleep(0.05)

            _, _, started = await self._attend(
                state,
                _Launch(argv=attach, env=containers.environment(), cwd=state.sandbox),
                stop,
                running,
            )
            ended = await _podman("container", "inspect", "--format", "json", name)
            container_state = json.loads(ended.stdout)[0]["State"]
        finally:
            await _remove_containers(name)
            state.container_name = None
        if container_state["Status"] == "created":  # it never ran: runc could not start it
            message = _last_line(self._log_tail(state.namespace, state.name))
            failed = {"exitCode": 128, "reason": "StartError", "message": message}
            return 128, {"terminated": {"startedAt": started, "finishedAt": _now(), **failed}}
        code = int(container_state["ExitCode"])
        terminated = _terminated(code, started)
        if container_state.get("OOMKilled"):
            terminated["terminated"]["reason"] = "OOMKilled"
        if message := _termination_message(state, code):
            terminated["terminated"]["message"] = message
        return code, terminated

    async def _attend(
        self,
        state: _PodState,
        launch: _Launch,
        stop: Callable[[asyncio.subprocess.Process], Coroutine[Any, Any, None]],
        running: Callable[[asyncio.subprocess.Process], Coroutine[Any, Any, None]] | None = None,
    ) -> tuple[asyncio.subprocess.Process, int, str]:
        """Starts ``launch``, reports the pod Running (once ``running`` returns, if given)
        and waits until the process exits or the pod is deleted (then ``stop`` ends it):
        the process, its exit code and when it started."""
        process = await self._spawn(state, launch)
        if running is not None:
            await running(process)
        started = _now()
        await self._report(state, "Running", {"running": {"startedAt": started}}, ready=True)
        exited = asyncio.ensure_future(process.wait())
        deleted = asyncio.ensure_future(state.deletion.wait())
        try:
            await asyncio.wait({exited, deleted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            deleted.cancel()
        if not exited.done():
            await stop(process)
        return process, await exited, started

    async def _spawn(self, state: _PodState, launch: _Launch) -> asyncio.subprocess.Process:
        with (state.sandbox / "container.log").open("ab") as output:
            try:
                _require_executable(launch)
                process = await asyncio.create_subprocess_exec(
                    *dying_with_parent(launch.argv),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=output,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=launch.cwd,
                    env=launch.env,
                    start_new_session=True,
                )
            except OSError as error:
                raise _PodFailed(
                    "StartError", f"failed to start container {state.container.name!r}: {error}"
                ) from error
        state.process = process
        return process

    # Env, volumes and mounts.

    async def _prepare(self, state: _PodState) -> "_Launch | _ContainerLaunch":
        container = state.container
        sources = _Sources(self._api, state.namespace)
        mounts = await self._mounts(state, sources)
        message_file = _termination_message_file(state)
        message_file.unlink(missing_ok=True)
        message_file.touch()
        message_file.chmod(0o666)  # the container may run as any user (touch applies the umask)
        message_path = container.terminationMessagePath or TERMINATION_MESSAGE_PATH
        mounts.append(containers.Mount(message_path, message_file))
        if self.containers:
            return await self._container_launch(state, sources, mounts)
        rewrite = _mount_rewriter((m.path, m.source) for m in mounts if m.source is not None)
        defined = await self._container_env(state, sources, rewrite)
        env = {**self.base_env, "HOSTNAME": state.name, **defined}
        argv = [_expand(rewrite(a), defined) for a in container.command or []]
        argv += [_expand(rewrite(a), defined) for a in container.args or []]
        if not argv:
            raise _PodFailed(
                "CreateContainerConfigError",
                "the container has no command, and the local kubelet runs images only in "
                "container mode",
            )
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        cwd = Path(rewrite(container.workingDir)) if container.workingDir else state.sandbox
        if not cwd.is_dir():
            raise _PodFailed(
                "CreateContainerConfigError", f"workingDir {str(cwd)!r} is no directory here"
            )
        return _Launch(argv=argv, env=env, cwd=cwd)

    async def _mounts(self, state: _PodState, sources: "_Sources") -> list[containers.Mount]:
        """The pod's volumes made on this node, as the container's mounts; in container
        mode, owned by the pod's fsGroup as a kubelet makes them."""
        container = state.container
        read_only = {m.name for m in container.volumeMounts or [] if m.readOnly}
        volume_dirs: dict[str, Path] = {}
        for volume in _spec(state.pod).volumes or []:
            volume_dirs[volume.name] = await self._volume(
                state, volume, sources, volume.name in read_only
            )
        mounts: list[containers.Mount] = []
        for mount in container.volumeMounts or []:
            if mount.name not in volume_dirs:
                raise _PodFailed(
                    "CreateContainerConfigError",
                    f"volumeMount {mount.mountPath!r} names an unknown volume {mount.name!r}",
                )
            local = volume_dirs[mount.name] / (mount.subPath or "")
            if not local.exists():  # a subPath the kubelet creates, as a real one does
                local.mkdir(parents=True)
            mounts.append(containers.Mount(mount.mountPath, local, bool(mount.readOnly)))
        fs_group = _pod_security(state.pod).get("fsGroup")
        if self.containers and fs_group is not None:
            for volume in _spec(state.pod).volumes or []:
                if volume.hostPath is None:
                    directory, files_only = volume_dirs[volume.name], _files_only(volume)
                    await asyncio.to_thread(_own_by_group, directory, fs_group, files_only)
        return mounts

    async def _container_launch(
        self, state: _PodState, sources: "_Sources", mounts: list[containers.Mount]
    ) -> "_ContainerLaunch":
        """The pod's container as `podman create` options: the environment with no mount
        path rewritten (the mounts are real), the image's own environment under it."""
        container = state.container
        image = container.image or ""
        if not await _podman_succeeds("image", "exists", image):
            raise _Waiting(
                "ErrImageNeverPull",
                f'Container image "{image}" is not present: the local kubelet pulls no images',
            )
        defined = await self._container_env(state, sources, lambda value: value)
        command = [_expand(a, defined) for a in container.command or []]
        arguments = [_expand(a, defined) for a in container.args or []]
        container_context = container.securityContext.to_dict() if container.securityContext else {}
        try:
            options = await asyncio.to_thread(
                containers.container_options,
                image,
                _pod_security(state.pod),
                container_context,
                env=defined,
                mounts=mounts,
                command=command if container.command else None,
                working_dir=container.workingDir,
            )
        except containers.ImageError as error:
            raise _Waiting("CreateContainerConfigError", str(error)) from error
        return _ContainerLaunch(image=image, options=options, arguments=arguments)

    async def _container_env(
        self, state: _PodState, sources: "_Sources", rewrite: Callable[[str], str]
    ) -> dict[str, str]:
        """The variables the pod spec defines, by Kubernetes' order and expansion rules."""
        container = state.container
        defined: dict[str, str] = {}
        for env_from in container.envFrom or []:
            ref: SecretEnvSource | ConfigMapEnvSource | None = (
                env_from.secretRef or env_from.configMapRef
            )
            if ref is None:
                continue
            kind = "Secret" if isinstance(ref, SecretEnvSource) else "ConfigMap"
            data = await sources.read(kind, ref.name or "", bool(ref.optional), for_env=True)
            for key, value in (data or {}).items():
                defined[(env_from.prefix or "") + key] = rewrite(os.fsdecode(value))
        for var in container.env or []:
            source = var.valueFrom
            if source is None:
                defined[var.name] = _expand(rewrite(var.value or ""), defined)
            elif source.fieldRef is not None:
                defined[var.name] = rewrite(self._field(state, source.fieldRef))
            elif (key_ref := source.secretKeyRef or source.configMapKeyRef) is not None:
                selected = await sources.key(key_ref)
                if selected is not None:
                    defined[var.name] = rewrite(os.fsdecode(selected))
            else:
                raise _PodFailed(
                    "CreateContainerConfigError",
                    f"env {var.name!r}: the local kubelet supports value, fieldRef, "
                    "secretKeyRef and configMapKeyRef only",
                )
        return defined

    def _field(self, state: _PodState, selector: ObjectFieldSelector) -> str:
        meta, spec = _meta(state.pod), _spec(state.pod)
        path = selector.fieldPath
        selected = re.fullmatch(r"metadata\.(labels|annotations)\['([^']*)'\]", path)
        if selected is not None:
            values = meta.labels if selected[1] == "labels" else meta.annotations
            return str((values or {}).get(selected[2], ""))
        if path in ("metadata.labels", "metadata.annotations"):  # downwardAPI volumes only
            values = (meta.labels if path == "metadata.labels" else meta.annotations) or {}
            return "".join(f"{k}={_go_quote(v)}\n" for k, v in sorted(values.items()))
        fields = {
            "metadata.name": meta.name,
            "metadata.namespace": state.namespace,
            "metadata.uid": meta.uid,
            "spec.nodeName": self.node_name,
            "spec.serviceAccountName": spec.serviceAccountName or "default",
            "status.podIP": state.ip,
            "status.podIPs": state.ip,
            "status.hostIP": HOST_IP,
            "status.hostIPs": HOST_IP,
        }
        if path not in fields:
            raise _PodFailed(
                "CreateContainerConfigError", f"fieldRef {path!r} is not supported here"
            )
        return fields[path] or ""

    async def _volume(
        self, state: _PodState, volume: Volume, sources: "_Sources", read_only: bool
    ) -> Path:
        """Makes the volume's directory and returns it."""
        if volume.hostPath is not None:
            path = Path(volume.hostPath.path)
            if volume.hostPath.type == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            return path
        if volume.persistentVolumeClaim is not None:
            claim = self.work_root / state.namespace / "claims"
            path = claim / volume.persistentVolumeClaim.claimName
            path.mkdir(parents=True, exist_ok=True)
            return path
        target = state.sandbox / "volumes" / volume.name
        if volume.emptyDir is not None:
            target.mkdir(parents=True, exist_ok=True)
            if self.containers:
                target.chmod(0o777)  # as a kubelet makes it: any user may write
            return target
        if volume.downwardAPI is not None:
            files = self._downward_files(state, volume.name, volume.downwardAPI.items or [])
            _write_files(target, files, volume.downwardAPI.defaultMode, read_only)
            return target
        if volume.projected is not None:
            files = {}
            for projection in volume.projected.sources or []:
                if projection.secret is not None or projection.configMap is not None:
                    kind = "Secret" if projection.secret is not None else "ConfigMap"
                    selected = projection.secret or projection.configMap
                    assert selected is not None
                    files |= await _key_files(
                        sources,
                        volume.name,
                        kind,
                        selected.name or "",
                        items=selected.items,
                        optional=bool(selected.optional),
                    )
                elif projection.downwardAPI is not None:
                    items = projection.downwardAPI.items or []
                    files |= self._downward_files(state, volume.name, items)
                else:
                    raise _PodFailed(
                        "UnsupportedVolume",
                        f"volume {volume.name!r}: projected secret, configMap and downwardAPI "
                        "sources only",
                    )
            _write_files(target, files, volume.projected.defaultMode, read_only)
            return target
        source: SecretVolumeSource | ConfigMapVolumeSource | None = (
            volume.secret or volume.configMap
        )
        if source is None:
            raise _PodFailed(
                "UnsupportedVolume",
                f"volume {volume.name!r}: the local kubelet supports secret, configMap, "
                "downwardAPI, projected, emptyDir, hostPath and persistentVolumeClaim volumes "
                "only",
            )
        if isinstance(source, SecretVolumeSource):
            kind, name = "Secret", source.secretName or ""
        else:
            kind, name = "ConfigMap", source.name or ""
            # On a node every pod sees a ConfigMap at its mountPath, one path for all pods;
            # here the path is a host directory, so pods mounting the same ConfigMap the same
            # way share one (a file source's log records absolute input paths, which a pod
            # restored from another pod's checkpoint must find again).
            shape = json.dumps([source.name, str(source.items), source.defaultMode, read_only])
            digest = hashlib.sha256(shape.encode()).hexdigest()[:12]
            target = self.work_root / state.namespace / "configmaps" / f"{source.name}-{digest}"
        files = await _key_files(
            sources, volume.name, kind, name, items=source.items, optional=bool(source.optional)
        )
        _write_files(target, files, source.defaultMode, read_only)
        return target

    def _downward_files(
        self, state: _PodState, volume: str, items: Iterable[DownwardAPIVolumeFile]
    ) -> dict[str, tuple[bytes, int | None]]:
        files: dict[str, tuple[bytes, int | None]] = {}
        for downward in items:
            if downward.fieldRef is None:
                raise _PodFailed("UnsupportedVolume", f"volume {volume!r}: fieldRef items only")
            files[downward.path] = (self._field(state, downward.fieldRef).encode(), downward.mode)
        return files

    # Status.

    async def _report(
        self,
        state: _PodState,
        phase: str,
        container_state: dict[str, Any],
        *,
        ready: bool = False,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        """Patches the pod's status subresource with the whole status as it is now."""
        container_statuses = [
            {
                "name": container.name,
                "image": container.image or "",
                "imageID": state.image_id,
                "containerID": _container_id(state),
                "ready": ready,
                "started": "running" in container_state,
                "restartCount": state.restart_count,
                "state": container_state,
                "lastState": state.last_state,
            }
            for container in _spec(state.pod).containers[:1]
        ]
        status = {
            "phase": phase,
            "reason": reason,
            "message": message,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": state.ip,
            "podIPs": [{"ip": state.ip}] if state.ip else None,
            "startTime": state.start_time,
            "conditions": _conditions(state, phase, ready),
            "containerStatuses": container_statuses,
        }
        await self._call(
            state,
            lambda: self._api.patch(
                Pod.Status,
                state.name,
                {"status": status},
                namespace=state.namespace,
                patch_type=PatchType.MERGE,
            ),
        )
        state.phase = phase

    async def _report_failed(self, state: _PodState, reason: str, message: str) -> None:
        terminated = {"exitCode": 128, "reason": reason, "message": message, "finishedAt": _now()}
        await self._report(
            state, "Failed", {"terminated": terminated}, reason=reason, message=message
        )

    async def _call(
        self, state: _PodState, request: Callable[[], Coroutine[Any, Any, T]]
    ) -> T | None:
        """One API call about a pod: retried while the API is unreachable; a 404 means the
        object is gone; other errors are logged and dropped, so the kubelet goes on."""
        while not state.gone:
            try:
                return await request()
            except httpx2.TransportError as error:
                log.warning("kubelet: API unreachable, retrying: %r", error)
                await asyncio.sleep(RETRY_SECONDS)
            except httpx2.HTTPStatusError as error:
                if _http_status(error) == 404:
                    self._forget(state)
                else:
                    log.error("kubelet: pod %s/%s: %r", state.namespace, state.name, error)
                return None
        return None


class _Sources:
    """Reads the secrets and configmaps for one pod start, each once."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self._client = client
        self._namespace = namespace
        self._cache: dict[tuple[str, str], dict[str, bytes] | None] = {}

    async def read(
        self, kind: str, name: str, optional: bool, for_env: bool = False
    ) -> dict[str, bytes] | None:
        """The object's data; None if it is optional and missing."""
        if (kind, name) not in self._cache:
            self._cache[kind, name] = await self._fetch(kind, name)
        data = self._cache[kind, name]
        if data is None and not optional:
            reason = "CreateContainerConfigError" if for_env else "ContainerCreating"
            raise _Waiting(reason, f'{kind.lower()} "{name}" not found')
        return data

    async def key(self, ref: SecretKeySelector | ConfigMapKeySelector) -> bytes | None:
        """The value a secretKeyRef or configMapKeyRef selects; None if optional and missing."""
        kind = "Secret" if isinstance(ref, SecretKeySelector) else "ConfigMap"
        data = await self.read(kind, ref.name or "", bool(ref.optional), for_env=True)
        if data is not None and ref.key in data:
            return data[ref.key]
        if ref.optional:
            return None
        raise _Waiting(
            "CreateContainerConfigError",
            f"couldn't find key {ref.key} in {kind} {self._namespace}/{ref.name}",
        )

    async def _fetch(self, kind: str, name: str) -> dict[str, bytes] | None:
        try:
            if kind == "Secret":
                secret = await self._client.get(Secret, name, namespace=self._namespace)
                data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
                data.update({k: v.encode() for k, v in (secret.stringData or {}).items()})
                return data
            config_map = await self._client.get(ConfigMap, name, namespace=self._namespace)
            data = {k: v.encode() for k, v in (config_map.data or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (config_map.binaryData or {}).items()})
            return data
        except httpx2.HTTPError as error:
            if _http_status(error) == 404:
                return None
            raise _Waiting(
                "CreateContainerConfigError", f"cannot read {kind} {name}: {error!r}"
            ) from error


async def _key_files(
    sources: _Sources,
    volume: str,
    kind: str,
    name: str,
    *,
    items: list[KeyToPath] | None,
    optional: bool,
) -> dict[str, tuple[bytes, int | None]]:
    """The files a secret or configMap volume (or projection) holds: every key, or the
    ``items`` selected, each with its mode."""
    data = await sources.read(kind, name, optional) or {}
    files: dict[str, tuple[bytes, int | None]] = {}
    for item in items or [KeyToPath(key=key, path=key) for key in data]:
        if item.key in data:
            files[item.path] = (data[item.key], item.mode)
        elif not optional:
            raise _Waiting(
                "ContainerCreating",
                f"MountVolume.SetUp failed for volume {volume!r}: "
                f"references non-existent key {item.key!r}",
            )
    return files


class KubeletThread:
    """A LocalKubelet on its own event loop in a daemon thread, for sync tests (and for async
    tests whose loop may block). Its processes die with that thread (PR_SET_PDEATHSIG)."""

    def __init__(self, api_url: str, work_root: Path, **options: Any) -> None:
        self.kubelet = LocalKubelet(api_url, work_root, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="local-kubelet", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        self._run(self.kubelet.start(), timeout=10.0)

    def stop(self) -> None:
        # A bound against a hang, not a measure: on a loaded machine (CI beside other work)
        # ending a dozen processes once took more than 22 s.
        self._run(self.kubelet.stop(), timeout=STOP_GRACE_SECONDS + 60.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def wait_for_phase(self, namespace: str, name: str, *phases: str, timeout: float = 10.0) -> str:
        """`LocalKubelet.wait_for_phase`, blocking."""
        waiting = self.kubelet.wait_for_phase(namespace, name, *phases, timeout=timeout)
        return self._run(waiting, timeout=timeout + 5.0)

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            whereabouts = self._whereabouts()
            future.cancel()
            raise TimeoutError(
                f"the local kubelet did not finish {coroutine.__qualname__} in {timeout:g} s; "
                f"{whereabouts}"
            ) from None

    def _whereabouts(self) -> str:
        """Where the kubelet's tasks wait (or its loop's thread, if the loop is blocked): what
        a hang in CI needs explained, as it happens only there."""

        async def tasks() -> str:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            return "its tasks wait at:\n" + "\n".join(_task_location(t) for t in pending)

        try:
            return asyncio.run_coroutine_threadsafe(tasks(), self._loop).result(5.0)
        except TimeoutError:
            frame = sys._current_frames().get(self._thread.ident or -1)
            stack = "".join(traceback.format_stack(frame)) if frame else "(no thread)"
            return f"its loop is blocked at:\n{stack}"


def _image_env() -> dict[str, str]:
    env = {name: os.environ[name] for name in IMAGE_ENV_NAMES if name in os.environ}
    path = [str(Path(sys.executable).parent), *env.get("PATH", os.defpath).split(os.pathsep)]
    env["PATH"] = os.pathsep.join(path)
    return env


def _container_id(state: _PodState) -> str | None:
    if state.container_id is not None:
        return f"podman://{state.container_id}"
    return f"local://{state.process.pid}" if state.process else None


async def _podman(*arguments: str) -> subprocess.CompletedProcess[str]:
    """A Podman command with this machine's options; its result, whatever its exit code."""
    process = await asyncio.create_subprocess_exec(
        *containers.podman_command(*arguments),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=containers.environment(),
    )
    stdout, stderr = await process.communicate()
    assert process.returncode is not None
    return subprocess.CompletedProcess(
        list(arguments),
        process.returncode,
        stdout.decode(errors="replace"),
        stderr.decode(errors="replace"),
    )


async def _podman_succeeds(*arguments: str) -> bool:
    return (await _podman(*arguments)).returncode == 0


async def _remove_containers(*names_or_filter: str) -> None:
    """Removes containers by name, or (with one `label=...` argument) those with the label,
    killing what still runs after STOP_GRACE_SECONDS."""
    names = list(names_or_filter)
    if names and names[0].startswith("label="):
        listed = await _podman("ps", "--all", "--quiet", "--filter", names[0])
        names = listed.stdout.split()
    # One at a time: Podman 4.3 given a name already gone among others leaves the rest.
    grace = str(int(STOP_GRACE_SECONDS))
    await asyncio.gather(*(_podman("rm", "--force", "--time", grace, name) for name in names))


async def _remove_orphans() -> None:
    """Removes the containers of local kubelets whose process is gone (a test run killed
    before its kubelet could stop them): they would run on, a Spark driver among them."""
    listed = await _podman(
        "ps", "--all", "--filter", f"label={CONTAINER_LABEL}", "--format", "json"
    )
    orphans = []
    for container in json.loads(listed.stdout or "[]"):
        instance = (container.get("Labels") or {}).get(CONTAINER_LABEL, "")
        pid = instance.rsplit("-", 2)[-2] if instance.count("-") >= 2 else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            orphans.append(container["Id"])
    if orphans:
        log.warning("kubelet: removing %d containers of kubelets gone", len(orphans))
        await _remove_containers(*orphans)


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _pod_security(pod: Pod) -> dict[str, Any]:
    context = _spec(pod).securityContext
    return dict(context.to_dict()) if context is not None else {}


def _files_only(volume: Volume) -> bool:
    """Volumes of files the kubelet writes, which a pod only reads."""
    sources = (volume.secret, volume.configMap, volume.downwardAPI, volume.projected)
    return any(source is not None for source in sources)


def _own_by_group(root: Path, gid: int, read_only: bool) -> None:
    """What a kubelet does to a volume for the pod's fsGroup: the group owns every file and
    may read it (and write it, unless the volume holds the kubelet's files: secrets,
    configMaps, downwardAPI, projected); directories are setgid, so that new files join the
    group."""
    mask = 0o440 if read_only else 0o660
    for path in [root, *root.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):  # a running pod may remove files
            if path.is_symlink():
                continue
            os.chown(path, -1, gid)
            extra = mask | (stat.S_ISGID | 0o110 if path.is_dir() else 0)
            path.chmod(stat.S_IMODE(path.stat().st_mode) | extra)


def _check_supported(spec: PodSpec) -> None:
    if len(spec.containers) != 1 or spec.initContainers:
        raise _PodFailed(
            "Unsupported",
            "the local kubelet runs exactly one container and no initContainers; this pod has "
            f"{len(spec.containers)} containers and {len(spec.initContainers or [])} "
            "initContainers",
        )


def _restarts(spec: PodSpec, code: int) -> bool:
    policy = spec.restartPolicy or "Always"
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def _grace_seconds(pod: Pod) -> float:
    grace = _meta(pod).deletionGracePeriodSeconds
    if grace is None:
        grace = _spec(pod).terminationGracePeriodSeconds
    return DEFAULT_GRACE_SECONDS if grace is None else float(grace)


def _conditions(state: _PodState, phase: str, ready: bool) -> list[dict[str, Any]]:
    wanted = {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": str(ready),
        "Ready": str(ready),
    }
    conditions = []
    for kind, value in wanted.items():
        previous = state.transitions.get(kind)
        if previous is None or previous[0] != value:
            state.transitions[kind] = previous = (value, _now())
        condition = {"type": kind, "status": value, "lastTransitionTime": previous[1]}
        if value == "False":
            terminal = phase in TERMINAL_PHASES
            condition["reason"] = "PodCompleted" if terminal else "ContainersNotReady"
        conditions.append(condition)
    return conditions


async def _wait_event(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


async def _end_process(process: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM to the main process, SIGKILL to its process group after `grace` seconds."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), grace)
    _signal_group(process, signal.SIGKILL)
    await process.wait()


def _task_location(task: "asyncio.Task[Any]") -> str:
    frames = task.get_stack()
    where = "".join(traceback.format_stack(frames[-1], limit=3)) if frames else "(not started)\n"
    return f"- {task.get_name()}:\n{where}"


def _signal_group(process: asyncio.subprocess.Process, sig: int) -> None:
    # A process group outlives its leader while members remain, so its id stays valid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _require_executable(launch: _Launch) -> None:
    """OSError, as exec would give, for a command that cannot be run: it is started through
    `dying_with_parent`, whose child would only fail later."""
    program = launch.argv[0]
    path = launch.env.get("PATH", os.defpath)
    found = (
        os.path.join(launch.cwd, program) if "/" in program else shutil.which(program, path=path)
    )
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _terminated(returncode: int, started: str) -> dict[str, Any]:
    terminated: dict[str, Any] = {"startedAt": started, "finishedAt": _now()}
    if returncode < 0:  # killed by a signal: Kubernetes reports 128 + the signal
        terminated["signal"] = -returncode
        returncode = 128 - returncode
    terminated["exitCode"] = returncode
    terminated["reason"] = "Completed" if returncode == 0 else "Error"
    return {"terminated": terminated}


def _termination_message_file(state: _PodState) -> Path:
    return state.sandbox / "termination-log"


def _termination_message(state: _PodState, exit_code: int) -> str:
    """What Kubernetes reports as the container's termination message: the end of the
    message file, else (FallbackToLogsOnError, after a failure) the log's last lines."""
    try:
        with _termination_message_file(state).open("rb") as message_file:
            size = message_file.seek(0, os.SEEK_END)
            message_file.seek(max(0, size - TERMINATION_MESSAGE_BYTES))
            message = message_file.read()
    except OSError:
        message = b""
    fallback = state.container.terminationMessagePolicy == "FallbackToLogsOnError"
    if not message and fallback and exit_code != 0:
        try:
            lines = (state.sandbox / "container.log").read_bytes().splitlines(keepends=True)
        except OSError:
            lines = []
        message = b"".join(lines[-FALLBACK_LOG_LINES:])[-FALLBACK_LOG_BYTES:]
    return message.decode(errors="replace")


def _waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def _write_files(
    target: Path,
    files: Mapping[str, tuple[bytes, int | None]],
    default_mode: int | None,
    read_only: bool,
) -> None:
    """Writes a secret, configMap or downwardAPI volume afresh, with Kubernetes' modes."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for relative, (content, item_mode) in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        mode = next((m for m in (item_mode, default_mode) if m is not None), DEFAULT_MODE)
        path.chmod(mode & ~0o222 if read_only else mode)


def _mount_rewriter(mounts: Iterable[tuple[str, Path]]) -> Callable[[str], str]:
    """Replaces each mount path that starts a path in a string by its local directory."""
    targets = {path.rstrip("/"): str(local) for path, local in mounts if path.rstrip("/")}
    if not targets:
        return lambda value: value
    alternatives = "|".join(re.escape(p) for p in sorted(targets, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.\-/])({alternatives})(?![\w.\-])")
    return lambda value: pattern.sub(lambda match: targets[match[1]], value)


_REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")


def _expand(value: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: `$$` is `$`; unknown references stay as they are."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return defined.get(match[1], match[0])

    return _REFERENCE.sub(replace, value)


def _go_quote(value: str) -> str:
    """Kubernetes writes label and annotation files with Go's %q."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _http_status(error: BaseException) -> int | None:
    # aiohttp-based emulators answer `application/json; charset=utf-8`, which lightkube does
    # not turn into an ApiError, so both forms are read.
    if isinstance(error, ApiError) and error.status is not None and error.status.code:
        return int(error.status.code)
    if isinstance(error, httpx2.HTTPStatusError):
        return error.response.status_code
    return None


def _meta(pod: Pod) -> ObjectMeta:
    assert pod.metadata is not None
    return pod.metadata


def _spec(pod: Pod) -> PodSpec:
    assert pod.spec is not None
    return pod.spec


def _key(pod: Pod) -> tuple[str, str]:
    meta = _meta(pod)
    assert meta.name is not None
    return (meta.namespace or "default", meta.name)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
