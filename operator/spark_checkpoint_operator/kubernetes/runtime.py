"""Drivers as pods: the supervisor's launcher, driver handle and janitor on Kubernetes.

Pods are seen through `PodRegistry`, which Kopf's pod watch keeps current; the API is
asked directly only where a missed watch event would otherwise stall (a pod that is gone).
"""

import asyncio
import base64
import contextlib
import difflib
import json
import logging
import math
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_args

import aiohttp
import pydantic
from kubernetes.aio.client import (
    ApiClient,
    CustomObjectsApi,
    V1Pod,
    V1PodSpec,
    V1Secret,
    V1Toleration,
    V1Volume,
    V1VolumeMount,
)
from kubernetes.aio.client.exceptions import ApiException, ConflictException, NotFoundException

from spark_checkpoint.janitor_commands import (
    CollectGarbage,
    DiscardCheckpoint,
    DiscardSavepoint,
    JanitorCommand,
    RemoveLiveDirectory,
)
from spark_checkpoint.restorable_report import ReportUnreadable, problems_by_image
from spark_checkpoint.settings import RESTORE_VARIABLE, SettingsError, restore_candidates
from spark_checkpoint_operator.agent_client import AgentClient
from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.core_api import CoreCalls
from spark_checkpoint_operator.kubernetes.snapshots import Snapshot
from spark_checkpoint_operator.manifest.model import (
    QUANTITY,
    JobManifest,
    pod_template_quantities,
    volume_quantities,
)
from spark_checkpoint_operator.supervisor import (
    DRIVER_GONE,
    JANITOR_TIMEOUT_SECONDS,
    KILLING_SIGNALS,
    CheckUnavailable,
    CleanupFailed,
    LaunchBlocked,
    LaunchFailed,
    Level,
    Notice,
    StartProblem,
    driver_error,
)

log = logging.getLogger(__name__)

# A container killed by signal N exits 128+N, as a shell reports it.
SIGNAL_EXIT_BASE = 128
OOM_KILLED = (
    "OOMKilled: the driver went over its container's memory limit (spec.driver.memory and "
    "Spark's overhead)"
)

GONE_CHECK_SECONDS = 5.0
# How often a driver whose agent does not answer is looked up (`KubernetesDriver.recheck`).
RECHECK_SECONDS = 10.0
# How long a pod may outlast its grace period's end (when its containers are killed) before
# it is called stuck: its kubelet needs a moment to report their end and remove it.
STUCK_DELETION_SECONDS = 30.0
API_TIMEOUT_SECONDS = 30.0
FORBIDDEN = 403
CONFLICT = 409
TOO_MANY_REQUESTS = 429
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

JobKey = tuple[str, str]  # namespace, job name
_Model = TypeVar("_Model", V1Pod, V1Secret)


class PodRegistry:
    """The pods of every job, as last reported by the pod watch."""

    def __init__(self) -> None:
        self._pods: dict[JobKey, dict[str, Mapping[str, Any]]] = {}
        self._changed: dict[JobKey, asyncio.Event] = defaultdict(asyncio.Event)
        # Pods told stuck in their deletion (`delete_pod_and_wait`), until they are gone.
        self._told_stuck: set[tuple[str, str, str]] = set()

    def observe(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        metadata = pod["metadata"]
        job = metadata.get("labels", {}).get(objects.LABEL_JOB)
        if job is None:
            return
        key = (metadata["namespace"], job)
        if event_type == "DELETED":
            self._pods.get(key, {}).pop(metadata["name"], None)
            self._told_stuck.discard((*key, metadata["name"]))
        else:
            self._pods.setdefault(key, {})[metadata["name"]] = pod
        if key in self._changed:
            self._changed[key].set()

    def pod(self, namespace: str, job: str, name: str) -> Mapping[str, Any] | None:
        return self._pods.get((namespace, job), {}).get(name)

    def pods(self, namespace: str, job: str) -> list[Mapping[str, Any]]:
        return list(self._pods.get((namespace, job), {}).values())

    async def changed(self, namespace: str, job: str, timeout: float) -> None:
        """Return when a pod of the job changed, or after ``timeout``."""
        event = self._changed[namespace, job]
        event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def forget(self, namespace: str, job: str) -> None:
        self._pods.pop((namespace, job), None)
        self._changed.pop((namespace, job), None)
        self._told_stuck = {key for key in self._told_stuck if key[:2] != (namespace, job)}

    def forget_pod(self, namespace: str, job: str, name: str) -> None:
        """A pod the API server no longer has, whose deletion the watch did not report."""
        self._pods.get((namespace, job), {}).pop(name, None)
        self._told_stuck.discard((namespace, job, name))

    def first_told_stuck(self, namespace: str, job: str, name: str) -> bool:
        """Whether the pod is found stuck in its deletion for the first time: told once,
        however many wait for it (a stopped job's driver is terminated by two tasks)."""
        key = (namespace, job, name)
        first = key not in self._told_stuck
        self._told_stuck.add(key)
        return first


class SnapshotRegistry:
    """The SparkCheckpointSnapshots of every job, as last reported by their watch."""

    def __init__(self) -> None:
        self._snapshots: dict[JobKey, dict[str, Mapping[str, Any]]] = {}

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> JobKey:
        """Take the watch's event; return the job the snapshot is of."""
        metadata = body["metadata"]
        key = (metadata["namespace"], Snapshot.from_body(body).job)
        self.forget(metadata["namespace"], metadata["name"])  # under one job only
        if event_type != "DELETED":
            self._snapshots.setdefault(key, {})[metadata["name"]] = body
        return key

    def forget(self, namespace: str, name: str) -> None:
        for (where, _), snapshots in self._snapshots.items():
            if where == namespace:
                snapshots.pop(name, None)

    def of(self, namespace: str, job: str) -> list[Mapping[str, Any]]:
        return list(self._snapshots.get((namespace, job), {}).values())


class OperatorApiClient(ApiClient):
    """The official client with the operator's timeouts: 30 s to connect and 30 s for each
    read of an answer, never on the wait for a free connection (the pool holds the
    client's 100): at startup every job's daemon asks at once, and a request queued behind
    others has not failed. The client's own timeout is a total one that would count the
    wait, so every request gets this one instead."""

    _TIMEOUT = aiohttp.ClientTimeout(
        total=None, sock_connect=API_TIMEOUT_SECONDS, sock_read=API_TIMEOUT_SECONDS
    )

    async def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
        _preload_content: bool = True,
    ) -> Any:
        return await super().call_api(
            method, url, header_params, body, post_params, self._TIMEOUT, _preload_content
        )


@dataclass(frozen=True, slots=True)
class Clients:
    """What every job shares: the API client, the pod view and the agents' HTTP session."""

    api: ApiClient
    pods: PodRegistry
    session: aiohttp.ClientSession
    snapshots: SnapshotRegistry = field(default_factory=SnapshotRegistry)
    core: CoreCalls = field(init=False)
    custom_objects: CustomObjectsApi = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "core", CoreCalls(self.api))
        object.__setattr__(self, "custom_objects", CustomObjectsApi(self.api))


def api_message(error: ApiException) -> str:
    """The message of the API server's Status, else the HTTP reason: one line."""
    try:
        message = json.loads(error.body or "").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or error.reason or f"HTTP {error.status}")


def namespace_terminating(error: BaseException) -> bool:
    """A create the NamespaceLifecycle admission refused: the namespace is being deleted."""
    if not isinstance(error, ApiException) or error.status != FORBIDDEN:
        return False
    try:
        causes = json.loads(error.body or "")["details"]["causes"]
        return any(cause.get("type") == "NamespaceTerminating" for cause in causes)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def _label_selector(labels: Mapping[str, str | tuple[str, ...]]) -> str:
    """``key=value`` for a value, ``key in (a,b)`` for a tuple of values."""
    return ",".join(
        f"{key} in ({','.join(value)})" if isinstance(value, tuple) else f"{key}={value}"
        for key, value in labels.items()
    )


def _own_container_state(pod: Mapping[str, Any], state: str) -> Mapping[str, Any] | None:
    """The `state` (`waiting`, `terminated`) of the pod's own container (named after its
    component: `driver`, `cleanup`, `check`), never that of a container an admission webhook
    added (a service mesh's sidecar); None while it is in another state."""
    name = pod["metadata"].get("labels", {}).get(objects.LABEL_COMPONENT)
    for container in pod.get("status", {}).get("containerStatuses", ()):
        if container.get("name") == name:
            found: Mapping[str, Any] | None = container.get("state", {}).get(state)
            return found
    return None


def _own_container_ended(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return _own_container_state(pod, "terminated")


# How a kubelet reports a container on its usual way to running.
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
# The image cannot be pulled (after a first ErrImagePull): a cleanup or check pod gives up
# at once (its work is done on a later run); a driver waits, told, as the kubelet retries.
_UNPULLABLE = frozenset({"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


def pod_start_problem(pod: Mapping[str, Any]) -> StartProblem | None:
    """What keeps the pod's own container from starting, as Kubernetes reports it: why it
    waits (other than the usual ContainerCreating), why an init container an admission
    webhook added waits, or why the pod has no node."""
    waiting = _own_container_state(pod, "waiting")
    if waiting is not None and waiting.get("reason") not in _STARTING:
        reason = str(waiting.get("reason") or "Waiting")
        message = str(waiting.get("message") or "")
        return StartProblem(reason, message)
    for container in pod.get("status", {}).get("initContainerStatuses", ()):
        waiting = container.get("state", {}).get("waiting")
        if waiting and waiting.get("reason") not in _STARTING:
            # kubectl's spelling; not the job's own image: told, the pod left to Kubernetes.
            reason = f"Init:{waiting.get('reason') or 'Waiting'}"
            detail = waiting.get("message")
            return StartProblem(
                reason, f"{container.get('name')}" + (f": {detail}" if detail else "")
            )
    for condition in pod.get("status", {}).get("conditions", ()):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = str(condition.get("reason") or "Unschedulable")
            return StartProblem(reason, str(condition.get("message") or ""))
    return None


def pod_exit_code(pod: Mapping[str, Any]) -> int | None:
    """The pod's own container's exit code once it has ended, even while an injected
    sidecar keeps the pod running (restartPolicy Never: it stays ended); None while it may
    still run."""
    terminated = _own_container_ended(pod)
    if terminated is not None:
        return int(terminated.get("exitCode", 1))
    phase = pod.get("status", {}).get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    # Ended before the container ran (image pull, eviction): a failure to restart from.
    return 0 if phase == "Succeeded" else 1


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status", {})
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", ())
    )


def pod_failure_message(pod: Mapping[str, Any]) -> str:
    terminated = _own_container_ended(pod)
    if terminated:
        reason = terminated.get("reason", "")
        message = (terminated.get("message") or "").strip().splitlines()
        tail = f": {message[-1]}" if message else ""
        return f"exit code {terminated.get('exitCode')} ({reason}){tail}"
    return _ended_by_node(pod) or "no container status"


def _ended_by_node(pod: Mapping[str, Any]) -> str:
    """Why the node ended the pod, as one line (its status' reason, and message if any);
    "" if it did not."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    message = " ".join(str(status.get("message") or "").split())
    return f"{reason}: {message}" if reason and message else reason


class KubernetesDriver:
    """One driver pod. Its agent is reached at the pod's IP once it has one."""

    def __init__(
        self,
        clients: Clients,
        manifest: JobManifest,
        *,
        name: str,
        token: str,
        executors: int,
        deployed_hash: str,
        report: Callable[[Notice], None],
    ) -> None:
        self._clients = clients
        self._report = report
        self.deployed_hash = deployed_hash  # what the pod was built from
        self._namespace = manifest.namespace
        self._job = manifest.name
        self.name = name
        self._expected_executors = executors
        self._seen = False
        self._gone = False
        self._next_recheck = 0.0  # on the monotonic clock
        # Its container's terminated state, kept from its exit on: the pod is deleted
        # before the supervisor asks for the error.
        self._ended: Mapping[str, Any] | None = None
        # Why the node ended the pod (its status' reason and message: Evicted, NodeLost,
        # Shutdown, DeadlineExceeded), as last seen; "" while it did not.
        self._ended_by_node = ""
        self._agent = AgentClient(self._agent_url, token, session=clients.session)

    @property
    def agent(self) -> AgentClient:
        return self._agent

    @property
    def pod(self) -> Mapping[str, Any] | None:
        return self._clients.pods.pod(self._namespace, self._job, self.name)

    def _agent_url(self) -> str | None:
        pod = self.pod
        ip = pod.get("status", {}).get("podIP") if pod is not None else None
        return objects.agent_url(ip) if ip else None

    def start_problem(self) -> StartProblem | None:
        pod = self.pod
        return None if pod is None else pod_start_problem(pod)

    def started(self) -> bool:
        pod = self.pod
        return pod is not None and (
            _own_container_state(pod, "running") is not None
            or _own_container_state(pod, "terminated") is not None
        )

    def restore_candidates(self) -> list[str]:
        return [] if self.pod is None else driver_restore_candidates(self.pod)

    def exit_code(self) -> int | None:
        pod = self.pod
        if pod is None:
            if self._ended is not None:
                return int(self._ended.get("exitCode", 1))
            # Deleted by someone else (or evicted and collected): the driver is gone.
            return DRIVER_GONE if self._seen or self._gone else None
        self._seen = True
        self._ended = _own_container_ended(pod) or self._ended
        self._ended_by_node = _ended_by_node(pod) or self._ended_by_node
        return pod_exit_code(pod)

    async def recheck(self) -> None:
        """Ask the API server whether the pod the watch shows is still there, at most every
        RECHECK_SECONDS: a deletion that came while the watch was down (a 410 Gone, then a
        new list) has no DELETED event, and the pod would show running until the heartbeat
        timeout. A look that fails is left to the next one."""
        now = time.monotonic()
        if self.pod is None or now < self._next_recheck:
            return
        self._next_recheck = now + RECHECK_SECONDS
        try:
            try:
                await self._clients.core.read_namespaced_pod(self.name, self._namespace)
            except NotFoundException:
                self._seen = True  # `exit_code` tells it gone
                log.warning("pod %s is gone; the pod watch never said so", self.name)
                # Its executors went with it (the garbage collector deletes a pod's
                # dependents), unseen as well.
                pods = self._clients.pods.pods(self._namespace, self._job)
                for gone in [self.pod, *executors_of(pods, [self.pod])]:
                    if gone is not None:
                        self._clients.pods.forget_pod(
                            self._namespace, self._job, gone["metadata"]["name"]
                        )
        except (ApiException, aiohttp.ClientError, TimeoutError) as error:
            log.info("cannot look up pod %s: %s", self.name, error)

    def error_lines(self) -> list[str]:
        """From its termination message: the error the driver reported (`report_error`),
        else the end of its log (FallbackToLogsOnError), as `driver_error` reads them; a
        kill by the container's memory limit is the error."""
        ended = self._ended or {}
        if ended.get("reason") == "OOMKilled":
            return [OOM_KILLED]
        if self._ended_by_node:
            # What the driver logged as it was killed says less. Named by its pod: two
            # evictions of a starting driver are no error of the pipeline's to fail for
            # (`same_error`), as two failures alike before the first batch are.
            return [f"{self._ended_by_node} (pod {self.name})"]
        killed = int(ended.get("exitCode", 0)) - SIGNAL_EXIT_BASE in KILLING_SIGNALS
        return driver_error(str(ended.get("message") or ""), killed=killed)

    def executors_ready(self) -> bool:
        """Enough of this driver's executors are ready: not a pod that only wears the
        job's labels, nor an executor of an earlier attempt's driver still going."""
        pods = self._clients.pods.pods(self._namespace, self._job)
        ready = sum(1 for pod in executors_of(pods, [self.pod]) if pod_ready(pod))
        return ready >= self._expected_executors

    async def terminate(self) -> None:
        """Delete the pod and return once it is gone: only then may another driver of
        this job start (never two on one checkpoint location)."""
        await delete_pod_and_wait(
            self._clients, self._namespace, self._job, self.name, self._report
        )
        self._gone = True


def driver_restore_candidates(pod: Mapping[str, Any]) -> list[str]:
    """The images a driver pod was started to restore, as its container got them."""
    for container in pod["spec"]["containers"]:
        if container["name"] == objects.DRIVER:
            # The last of a name is what the container gets (the operator's come last).
            for variable in reversed(container.get("env") or ()):
                if variable["name"] == RESTORE_VARIABLE:
                    try:
                        value = objects.as_written(variable.get("value") or "")
                        listed = restore_candidates(value)
                    except SettingsError:  # not a pod this made
                        return []
                    return [c.encode() for c in listed]
    return []


async def delete_pod_and_wait(
    clients: Clients, namespace: str, job: str, name: str, report: Callable[[Notice], None]
) -> None:
    """Delete the pod and return once the API server no longer has it; a pod that stays
    long after its deletion was due is told once (`stuck_deletion`), and waited for still:
    its containers may run."""
    try:
        await clients.core.delete_namespaced_pod(name, namespace)
    except NotFoundException:  # gone already (deleted by someone, its driver's exit seen)
        clients.pods.forget_pod(namespace, job, name)
        return
    due, looked = math.inf, time.monotonic()  # the first look's grace runs from the ask
    while True:
        await clients.pods.changed(namespace, job, GONE_CHECK_SECONDS)
        # Asked of the API server, not only the watch: a deletion that came while the
        # watch was down (a 410 Gone, then a new list) has no DELETED event, and the
        # registry would show the pod for ever.
        try:
            pod = await clients.core.read_namespaced_pod(name, namespace)
        except NotFoundException:
            clients.pods.forget_pod(namespace, job, name)
            return
        due = deletion_due(pod, due, looked)
        looked = time.monotonic()
        stuck = stuck_deletion(pod, looked - due)
        if stuck and clients.pods.first_told_stuck(namespace, job, name):
            report(Notice("PodStuckTerminating", Level.WARNING, stuck))


def deletion_due(pod: V1Pod, due: float, since: float) -> float:
    """When the pod's deletion is due on the operator's monotonic clock: its grace period
    from ``since`` (the operator's deletion, then the last look), or the earlier ``due`` an
    earlier look found (a grace period only shortens: another deletion, or the kubelet's
    last one, 0, once the containers stopped). The deletionTimestamp is the API server's
    clock, which may be minutes off the operator's."""
    grace = pod.metadata.deletion_grace_period_seconds if pod.metadata is not None else None
    return min(due, since + (grace or 0))


def stuck_deletion(pod: V1Pod, overdue: float) -> str | None:
    """Why a pod being deleted is still there long after it was due to go (``overdue``
    seconds ago, `deletion_due`), as one line that says what releases it; None while it is
    not overdue."""
    metadata, spec = pod.metadata, pod.spec
    if metadata is None or metadata.deletion_timestamp is None:
        return None
    if overdue < STUCK_DELETION_SECONDS:
        return None
    name, namespace = metadata.name, metadata.namespace
    if metadata.finalizers:
        # Its containers have stopped or will: only whoever added these can end it.
        held = (
            f"finalizers {', '.join(metadata.finalizers)} hold it, and only whatever added "
            "them may remove them"
        )
    else:
        node = spec.node_name if spec is not None else None
        held = (
            f"its node {node} has not confirmed that its containers stopped (an unreachable "
            f"node keeps it for ever: kubectl get node {node}); once they are known to have "
            f"stopped, kubectl delete pod {name} -n {namespace} --grace-period=0 --force "
            "releases it"
        )
    return (
        f"pod {name} is still there {overdue:.0f}s after its deletion was due: {held}; "
        "the job waits until it is gone (no other pod of the job starts while it may run)"
    )


async def delete_job_pods_and_wait(
    clients: Clients,
    job: Mapping[str, Any],
    labels: Mapping[str, str | tuple[str, ...]],
    report: Callable[[Notice], None],
) -> None:
    """Every pod of the job that matches ``labels``, gone; a pod that only wears the job's
    labels (anyone who may create pods in the namespace can label one so) stays."""
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    pods = await clients.core.list_namespaced_pod(
        namespace,
        label_selector=_label_selector({objects.LABEL_JOB: name, **labels}),
    )
    for pod in pods.items:
        assert pod.metadata is not None and pod.metadata.name is not None
        if is_jobs_pod(pod, job):
            await delete_pod_and_wait(clients, namespace, name, pod.metadata.name, report)


def is_jobs_pod(pod: V1Pod, job: Mapping[str, Any]) -> bool:
    """Owned by the job (its drivers, cleanup and check pods), or an executor Spark made
    for one of its drivers (owned by that driver pod)."""
    owners = (pod.metadata and pod.metadata.owner_references) or []
    return owned_by(pod, job) or any(
        owner.kind == "Pod" and objects.is_driver_pod_name(job["metadata"]["name"], owner.name)
        for owner in owners
    )


def executors_of(
    pods: Iterable[Mapping[str, Any]], drivers: Iterable[Mapping[str, Any] | None]
) -> list[Mapping[str, Any]]:
    """The executor pods Spark made for these driver pods: owned by one of them (Spark sets
    the reference). The labels alone anyone who may create pods can set."""
    uids = {driver["metadata"]["uid"] for driver in drivers if driver is not None}
    return [
        pod
        for pod in pods
        if pod["metadata"].get("labels", {}).get(objects.LABEL_SPARK_ROLE) == objects.EXECUTOR
        and owner_uids(pod) & uids
    ]


def owner_uids(pod: Mapping[str, Any]) -> set[str]:
    return {owner["uid"] for owner in pod["metadata"].get("ownerReferences") or ()}


def owned_by(existing: V1Pod | V1Secret, job: Mapping[str, Any]) -> bool:
    owners = (existing.metadata and existing.metadata.owner_references) or []
    return any(owner.uid == job["metadata"]["uid"] for owner in owners)


class KubernetesLauncher:
    """Starts the job's driver pods, one attempt after another."""

    def __init__(
        self,
        clients: Clients,
        manifest: JobManifest,
        job: Mapping[str, Any],
        storage: str,
        *,
        deployed_hash: str,
        user_ids: objects.UserIds,
        report: Callable[[Notice], None],
        deleting: bool = False,
    ) -> None:
        self._clients = clients
        self._api = clients.core
        self.manifest = manifest
        self._job = job
        self._storage = storage
        self._deployed_hash = deployed_hash
        self._user_ids = user_ids
        self._report = report
        self._deleting = deleting  # the job is deleted: no new attempt follows
        self.current: KubernetesDriver | None = None
        # `adopt` has answered: the recorded driver is `current`, or (None) the next driver
        # is one of this launcher's spec. Asked once: the controller may ask before its
        # supervisor does, which then gets the same answer (one read of the pod, one event).
        self.adoption_answered = False
        self._adopted: KubernetesDriver | None = None

    @property
    def deployed_hash(self) -> str:
        """The deployment hash of the drivers this launcher starts."""
        return self._deployed_hash

    async def adopt(self, attempt: int) -> KubernetesDriver | None:
        if not self.adoption_answered:
            self._adopted = await self._adopt(attempt)
            self.adoption_answered = True
        return self._adopted

    async def _adopt(self, attempt: int) -> KubernetesDriver | None:
        name = objects.driver_pod_name(self.manifest.name, attempt)
        try:
            pod = await self._api.read_namespaced_pod(name, self.manifest.namespace)
        except NotFoundException:
            return None
        if not owned_by(pod, self._job):
            # Its own driver went while the operator was down, and another pod took the
            # name: it is neither judged, nor handed the token, nor deleted.
            self._not_adopted(
                name,
                "the pod of that name is not this job's (no owner reference to it); it is "
                "left alone",
            )
            return None
        # As the pod watch shows pods: the API's JSON.
        raw: dict[str, Any] = self._clients.api.sanitize_for_serialization(pod)
        if raw["metadata"].get("deletionTimestamp"):
            return None  # going: the next attempt starts once it is gone
        self._clients.pods.observe("MODIFIED", raw)
        # Built from the spec of its time, which may since have changed (an upgrade).
        deployed = raw["metadata"].get("annotations", {}).get(objects.ANNOTATION_SPEC_HASH, "")
        if pod_exit_code(raw) is not None:
            # It ended while the operator was down: its exit is judged as any driver's (a
            # finished job is not run again, restartPolicy Never is kept); nothing asks
            # its agent anything.
            self.current = self._driver(name, "", deployed)
            return self.current
        try:
            token = await self._token()
        except UnusableToken as error:
            # Without its token the driver cannot be asked for anything, ever: adopting it
            # would retry forever. It is stopped: the job restores as after a crash (a
            # deleted one ends without its final savepoint).
            self._not_adopted(
                name,
                f"its agent token (secret {objects.token_secret_name(self.manifest.name)}, "
                f"key {objects.TOKEN_KEY}) {error}; it is stopped",
            )
            await delete_pod_and_wait(
                self._clients, self.manifest.namespace, self.manifest.name, name, self._report
            )
            return None
        self.current = self._driver(name, token, deployed)
        return self.current

    def _not_adopted(self, name: str, why: str) -> None:
        self._report(
            Notice(
                "DriverReplaced",
                Level.WARNING,
                f"driver {name} cannot be adopted: {why} and "
                + (
                    "the job is deleted without a final savepoint"
                    if self._deleting
                    # Not "a new attempt restores from the latest checkpoint": a redeploy
                    # restores its savepoint, a suspension starts none.
                    else "the job goes on without it, as after a crash of its driver"
                ),
            )
        )

    async def refusal(self, attempt: int) -> str | None:
        """Why the driver pod of ``attempt`` could not be created now, asked of the API
        server (its admission included) in a dry run before a running driver is stopped for
        it. None when it takes the pod, refuses it only for a quota (which the running
        driver holds: the real create follows its stop), or cannot tell (an admission
        webhook with side effects takes no dry run). Any other answer holds the upgrade
        until it is asked again, one that passes by itself too (a service account not
        created yet, an API server or a webhook down): the driver is not stopped for a pod
        that cannot be created."""
        name = objects.driver_pod_name(self.manifest.name, attempt)
        namespace = self.manifest.namespace
        try:
            _, pod = self._driver_pod(attempt, [])
            await self._api.create_namespaced_pod(namespace, pod, dry_run=True)
        except LaunchFailed as refused:
            return str(refused)
        except ConflictException:
            return await self._foreign_pod(name)
        except ApiException as error:
            message = api_message(error)
            quota = error.status == FORBIDDEN and _QUOTA_REFUSAL in message
            return None if quota or _DRY_RUN_UNSUPPORTED in message else f"pod {name}: {message}"
        except (aiohttp.ClientError, TimeoutError) as error:
            return f"pod {name}: the API server did not answer ({type(error).__name__}: {error})"
        return None

    async def _foreign_pod(self, name: str) -> str | None:
        """Why the pod of ``name`` there refuses a driver's: another's (this job's own
        leftover is removed before a launch)."""
        try:
            existing = await self._api.read_namespaced_pod(name, self.manifest.namespace)
            self._require_owned(existing, f"pod {name}", "the driver of this attempt")
        except NotFoundException:
            return None  # gone meanwhile
        except (LaunchFailed, LaunchBlocked) as refused:
            return str(refused)
        except ApiException as error:
            return f"pod {name}: {api_message(error)}"
        return None

    def _driver_pod(self, attempt: int, restore: list[str]) -> tuple[str, V1Pod]:
        """The name and typed model of the driver pod of ``attempt``; a value of the spec
        the model refuses raises LaunchFailed."""
        name = objects.driver_pod_name(self.manifest.name, attempt)
        pod = objects.driver_pod(
            self.manifest,
            self._job,
            attempt=attempt,
            storage=self._storage,
            restore=restore,
            deployed_hash=self._deployed_hash,
            user_ids=self._user_ids,
        )
        return name, _model(V1Pod, pod, LaunchFailed, f"pod {name}")

    async def launch(self, attempt: int, restore: list[str]) -> KubernetesDriver:
        # Also checked as the spec is read, where a problem the accepted spec held is
        # tolerated (a driver that runs goes on); a new driver needs pods the API server
        # accepts.
        if problems := pod_spec_problems(self.manifest):
            raise LaunchFailed("; ".join(problems))
        await self.remove_pods()
        token = secrets.token_urlsafe(32)
        await self._store_token(token)
        name, pod = self._driver_pod(attempt, restore)
        try:
            await self._api.create_namespaced_pod(self.manifest.namespace, pod)
        except ConflictException:
            # This job's own leftover goes before the next try (`remove_pods`); another's
            # would refuse every try.
            existing = await self._api.read_namespaced_pod(name, self.manifest.namespace)
            self._require_owned(existing, f"pod {name}", "the driver of this attempt")
            raise
        except ApiException as error:
            raise _launch_error(error, f"pod {name}") from error
        self.current = self._driver(name, token, self._deployed_hash)
        return self.current

    def _driver(self, name: str, token: str, deployed_hash: str) -> KubernetesDriver:
        return KubernetesDriver(
            self._clients,
            self.manifest,
            name=name,
            token=token,
            executors=objects.expected_executors(self.manifest),
            deployed_hash=deployed_hash,
            report=self._report,
        )

    async def remove_pods(self) -> None:
        """Drivers of earlier attempts that are still there (an operator that died while
        deleting one), and cleanup pods an earlier operator left (one with an older
        registry could delete what the new driver writes): gone before the next driver
        starts, and before a deleted job's retention policy is carried out."""
        await delete_job_pods_and_wait(
            self._clients,
            self._job,
            {objects.LABEL_COMPONENT: (objects.DRIVER, objects.CLEANUP)},
            self._report,
        )

    async def _store_token(self, token: str) -> None:
        """A new token per attempt: a driver of an earlier attempt cannot be talked to."""
        secret = objects.token_secret(self.manifest, self._job, token)
        name = secret["metadata"]["name"]
        namespace = self.manifest.namespace
        try:
            try:
                await self._api.create_namespaced_secret(
                    namespace,
                    _model(V1Secret, secret, LaunchFailed, f"secret {name}"),
                )
            except ConflictException:
                # Errors here too are the launch's (an immutable Secret refuses the patch).
                await self._require_own_secret(name)
                await self._api.patch_namespaced_secret(
                    name,
                    namespace,
                    {"stringData": {objects.TOKEN_KEY: token}},
                    content_type=STRATEGIC_MERGE_PATCH,
                )
        except ApiException as error:
            raise _launch_error(error, f"secret {name}") from error

    async def _require_own_secret(self, name: str) -> None:
        """A Secret of the token's name that this job does not own is another's: written
        over, its key would be lost to its owner and handed to this job's driver."""
        existing = await self._api.read_namespaced_secret(name, self.manifest.namespace)
        self._require_owned(existing, f"secret {name}", "the driver's token")

    def _require_owned(self, existing: V1Pod | V1Secret, what: str, purpose: str) -> None:
        """``existing`` is this job's (an owner reference to its uid), else LaunchFailed;
        LaunchBlocked while it is an earlier job's of this name (deleted, then created
        again: the garbage collector removes what the earlier one owned soon after)."""
        if not owned_by(existing, self._job):
            owners = (existing.metadata and existing.metadata.owner_references) or []
            earlier = next(
                (
                    owner
                    for owner in owners
                    if owner.kind == objects.KIND
                    and owner.api_version.split("/")[0] == objects.GROUP
                    and owner.name == self.manifest.name
                ),
                None,
            )
            if earlier is not None:
                raise LaunchBlocked(
                    f"{what} is still the earlier job {self.manifest.name}'s (uid "
                    f"{earlier.uid}), which the garbage collector removes"
                )
            kind = what.split(maxsplit=1)[0].capitalize()
            raise LaunchFailed(
                f"{what} exists and is not this job's (no owner reference to it): the "
                f"operator names {purpose} so and never writes over or deletes another's "
                f"{kind}; rename or delete it"
            )

    async def _token(self) -> str:
        """The running attempt's agent token as its driver reads it (stripped); raises
        UnusableToken when its Secret or key is gone, or was edited into no token."""
        try:
            secret = await self._api.read_namespaced_secret(
                objects.token_secret_name(self.manifest.name),
                self.manifest.namespace,
            )
        except NotFoundException:
            raise UnusableToken("is missing") from None
        encoded = (secret.data or {}).get(objects.TOKEN_KEY)
        if not encoded:
            raise UnusableToken("is missing")
        try:
            token = base64.b64decode(encoded, validate=True).decode().strip()
        except ValueError:  # binascii.Error, UnicodeDecodeError
            raise UnusableToken("is damaged: not base64 of UTF-8 text") from None
        if not _HEADER_TOKEN.fullmatch(token):
            raise UnusableToken("is damaged: not a token an HTTP header can carry (visible ASCII)")
        return token


class KubernetesJanitor:
    """Storage work in short cleanup pods (the operator holds no storage credentials), and
    the restorable checks, in check pods. Their pods are made from ``manifest``, the spec
    the supervisor's drivers run. A cleanup pod whose image cannot be pulled is made once
    more from the spec accepted last (``accepted``) if that names another image: the stop
    of an upgrade to an image that cannot be pulled, reverted, runs with the image reverted
    to. Not a check pod (its verdict is of the application its spec runs) nor the live
    directory's removal (the directory is named from the driver's spec, the claim too)."""

    def __init__(
        self,
        clients: Clients,
        manifest: JobManifest,
        job: Mapping[str, Any],
        storage: str,
        report: Callable[[Notice], None],
        *,
        accepted: Callable[[], JobManifest],
        user_ids: objects.UserIds,
    ) -> None:
        self._clients = clients
        self._manifest = manifest
        self._accepted = accepted
        self._job = job
        self._storage = storage
        self._report = report
        self._user_ids = user_ids

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        await self._run(DiscardCheckpoint(checkpoint_id, tuple(retained)))

    async def discard_savepoint(self, savepoint_id: int) -> None:
        await self._run(DiscardSavepoint(savepoint_id))

    async def collect_garbage(self, checkpoints: list[int], savepoints: list[int]) -> None:
        await self._run(CollectGarbage(tuple(checkpoints), tuple(savepoints)))

    async def remove_live_directory(self) -> None:
        """The deleted job's directory on its live volume claim (what its last driver and
        executors left there; the claim outlives the job and may be shared)."""
        # Executors outlive their driver until garbage collection takes them; none may
        # write there while the directory goes.
        await delete_job_pods_and_wait(
            self._clients,
            self._job,
            {objects.LABEL_SPARK_ROLE: objects.EXECUTOR},
            self._report,
        )
        name = objects.live_directory(self._manifest, self._job)
        await self._run(RemoveLiveDirectory(name), live_claim=True)

    async def problems(self, image: str) -> list[str]:
        """The restorable check (``checkpointing.verifyRestorable``) of ``image`` in a
        check pod (`objects.check_pod`), whose termination message is the verdict."""
        # Checks run one at a time: a check pod there now is an earlier operator's, whose
        # verdict nobody waits for.
        await delete_job_pods_and_wait(
            self._clients,
            self._job,
            {objects.LABEL_COMPONENT: objects.CHECK},
            self._report,
        )
        pod = objects.check_pod(
            self._manifest, self._job, storage=self._storage, image=image, user_ids=self._user_ids
        )
        try:
            ended = await run_pod_to_end(self._clients, pod, self._report)
        except PodDidNotEnd as error:
            raise CheckUnavailable(str(error)) from None
        return restorable_verdict(ended, image)

    async def _run(self, command: JanitorCommand, *, live_claim: bool = False) -> None:
        try:
            ended = await self._cleanup_pod_ended(command, live_claim)
        except PodDidNotEnd as error:
            raise CleanupFailed(f"{command.NAME}: {error}") from None
        if pod_exit_code(ended) != 0:
            raise CleanupFailed(
                f"{command.NAME} in pod {ended['metadata']['name']}: {pod_failure_message(ended)}"
            )

    async def _cleanup_pod_ended(
        self, command: JanitorCommand, live_claim: bool
    ) -> Mapping[str, Any]:
        def pod_of(manifest: JobManifest) -> dict[str, Any]:
            return objects.cleanup_pod(
                manifest,
                self._job,
                storage=self._storage,
                command=command,
                user_ids=self._user_ids,
                live_claim=live_claim,
            )

        try:
            return await run_pod_to_end(self._clients, pod_of(self._manifest), self._report)
        except ImageNotPulled:
            accepted = self._accepted()
            if live_claim or accepted.spec.image == self._manifest.spec.image:
                raise
            return await run_pod_to_end(self._clients, pod_of(accepted), self._report)


class UnusableToken(Exception):
    """A driver's agent token cannot be used: the message says why (missing, damaged)."""


# What an Authorization header carries (aiohttp refuses control characters in one).
_HEADER_TOKEN = re.compile(r"[!-~]+")


class PodDidNotEnd(Exception):
    """A janitor pod could not be created or did not end in time; the message says which."""


class ImageNotPulled(PodDidNotEnd):
    """A janitor pod cannot start: its image cannot be pulled."""


async def run_pod_to_end(
    clients: Clients, pod: dict[str, Any], report: Callable[[Notice], None]
) -> Mapping[str, Any]:
    """Create ``pod``, wait until its container has ended, delete it (also when cancelled)
    and return it as it ended."""
    namespace, job = pod["metadata"]["namespace"], pod["metadata"]["labels"][objects.LABEL_JOB]
    what = "cannot create a pod"
    try:
        created = await clients.core.create_namespaced_pod(
            namespace, _model(V1Pod, pod, PodDidNotEnd, what)
        )
    except ApiException as error:
        raise PodDidNotEnd(f"{what}: {api_message(error)}") from error
    assert created.metadata is not None and created.metadata.name is not None
    name = created.metadata.name
    problem: StartProblem | None = None
    try:
        async with asyncio.timeout(JANITOR_TIMEOUT_SECONDS):
            while (current := clients.pods.pod(namespace, job, name)) is None or pod_exit_code(
                current
            ) is None:
                problem = None if current is None else pod_start_problem(current)
                if problem is not None and problem.reason in _UNPULLABLE:
                    raise ImageNotPulled(f"pod {name} cannot start: {problem}")
                await clients.pods.changed(namespace, job, GONE_CHECK_SECONDS)
    except TimeoutError:
        kept = f" (it could not start: {problem})" if problem else ""
        raise PodDidNotEnd(
            f"pod {name} did not finish in {JANITOR_TIMEOUT_SECONDS:.0f}s{kept}"
        ) from None
    finally:
        await delete_pod_and_wait(clients, namespace, job, name, report)
    return current


def restorable_verdict(pod: Mapping[str, Any], image: str) -> list[str]:
    """The problems a check pod that ended found in ``image`` (empty: restorable), from its
    termination message. Raises `CheckUnavailable` with one line saying why there is no
    verdict (the check failed, or its message is missing, cut or not a report)."""
    name = pod["metadata"]["name"]
    if pod_exit_code(pod) != 0:
        raise CheckUnavailable(f"check pod {name} failed: {pod_failure_message(pod)}")
    message = (_own_container_ended(pod) or {}).get("message") or ""
    try:
        found = problems_by_image(message)
    except ReportUnreadable as error:
        raise CheckUnavailable(
            f"check pod {name} gave no verdict: its termination message is {error}"
        ) from None
    if image not in found:
        raise CheckUnavailable(
            f"check pod {name} reported on {', '.join(found) or 'no image'}, not on {image}"
        )
    return found[image]


# What the API server says when it refuses a pod for now: a ResourceQuota used up, a
# service account not created yet (a GitOps sync may apply the job first).
_QUOTA_REFUSAL = "exceeded quota:"
_PASSING_REFUSALS = (_QUOTA_REFUSAL, "error looking up service account")
# How the API server refuses a dry run that an admission webhook with side effects sees.
_DRY_RUN_UNSUPPORTED = "does not support dry run"


def _launch_error(error: ApiException, what: str) -> Exception:
    """A refusal that may pass (a quota, a missing service account) is tried again after a
    backoff; any other (admission, invalid) fails the job with its reason; what may pass on
    a mere retry (throttling, server errors) is raised as it is."""
    code = error.status or 0
    if code == FORBIDDEN and any(words in api_message(error) for words in _PASSING_REFUSALS):
        return LaunchBlocked(f"{what}: {api_message(error)}")
    if namespace_terminating(error):  # the job goes with its namespace: no failure of its own
        return LaunchBlocked(f"{what}: {api_message(error)}")
    if 400 <= code < 500 and code not in (CONFLICT, TOO_MANY_REQUESTS):
        return LaunchFailed(f"{what}: {api_message(error)}")
    return error


def _model(
    model: type[_Model], body: Mapping[str, Any], refusal: type[Exception], what: str
) -> _Model:
    """The client's typed model of an object built by `objects`. Fields the model does not
    know are dropped, as the API server drops them; a value of the wrong type (from the
    job's spec) is refused here as the API server would refuse it."""
    try:
        built = model.from_dict(dict(body))
    except pydantic.ValidationError as error:
        raise refusal(f"{what}: {_problems(error)}") from error
    assert built is not None  # None only from None
    return built


def _problems(error: pydantic.ValidationError) -> str:
    """One line: each wrong value's field and what is wrong with it."""
    problems: list[str] = []
    for detail in error.errors():
        field_path = ".".join([error.title, *(str(key) for key in detail["loc"])])
        problems.append(f"{field_path}: {detail['msg']}")
    return "; ".join(problems)


def pod_spec_problems(manifest: JobManifest) -> list[str]:
    """What the API server would refuse in the job's pods, each problem naming its field.
    The typed objects first: the pods are built (their sizes, names and paths checked)
    only from objects of the shapes they have."""
    return typed_object_problems(manifest) or objects.pod_problems(manifest)


def typed_object_problems(manifest: JobManifest) -> list[str]:
    """The core/v1 objects of the spec (volumes, mounts, tolerations of the driver and the
    executors) against their types, each problem naming its spec field."""
    spec = manifest.spec
    problems: list[str] = []
    for role_name, role in (("driver", spec.driver), ("executor", spec.executor)):
        for kind, model, items in (
            ("volumes", V1Volume, role.volumes),
            ("volumeMounts", V1VolumeMount, role.volume_mounts),
            ("tolerations", V1Toleration, role.tolerations),
        ):
            for index, item in enumerate(items):
                field = f"spec.{role_name}.{kind}[{index}]"
                typed = _kubernetes_object_problems(field, model, item)
                if not typed and model is V1Volume:
                    typed = _volume_source_problems(field, item)
                problems += typed
        for index, volume in enumerate(role.volumes):
            problems += [
                f"spec.{role_name}.volumes[{index}].{path}: {problem}"
                for path, value in volume_quantities(volume)
                if isinstance(value, str) and (problem := _quantity_problem(value))
            ]
    for field, template in spec.pod_templates:
        problems += _pod_spec_problems(f"{field}.spec", template.get("spec"))
        problems += [
            f"{field}.{path}: {problem}"
            for path, value in pod_template_quantities(template)
            if isinstance(value, str) and (problem := _quantity_problem(value))
        ]
    return problems


def _pod_spec_problems(field: str, pod_spec: Any) -> list[str]:
    """A pod template's spec against core/v1 PodSpec (its containers may be left out), as
    the API server decodes it: strictly typed, no unknown field."""
    if pod_spec is None:
        return []
    try:
        V1PodSpec.model_validate({"containers": [], **pod_spec}, strict=True)
    except pydantic.ValidationError as error:
        return [
            f"{field}{_field_path(detail['loc'])}: "
            + (
                "unknown field" + _closest_field(V1PodSpec, detail["loc"])
                if detail["type"] == "extra_forbidden"
                else detail["msg"]
            )
            for detail in error.errors()
        ]
    return []


def _closest_field(model: type[pydantic.BaseModel], location: tuple[int | str, ...]) -> str:
    """`` (did you mean X?)`` for the unknown field at ``location`` in ``model``: the
    closest field, as a manifest spells it, of the object it is in; "" if none is close."""
    current: type[pydantic.BaseModel] | None = model
    for key in location[:-1]:
        if isinstance(key, int) or current is None:
            continue  # an item of a list: the list field's model already
        fields = current.model_fields.items()
        found = next((i for name, i in fields if key in (name, i.serialization_alias)), None)
        current = None if found is None else _model_in(found.annotation)
    if current is None:
        return ""
    known = [info.serialization_alias or name for name, info in current.model_fields.items()]
    return _did_you_mean(location[-1], known)


def _did_you_mean(key: object, known: Iterable[object]) -> str:
    """`` (did you mean X?)``, X the field of ``known`` closest to ``key``; "" if none is."""
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The pydantic model an annotation holds (``Optional[List[V1Container]]``: the
    container's), None if it holds none."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    return next(
        (model for arg in get_args(annotation) if (model := _model_in(arg)) is not None),
        None,
    )


def _field_path(location: tuple[int | str, ...]) -> str:
    """A pydantic error's location as a field path: ``.containers[0].name``."""
    return "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in location)


def _quantity_problem(value: str) -> str | None:
    """What the API server refuses in a volume's quantity (a size, a divisor, a claim's
    request or limit): one it cannot parse, or one below zero."""
    parsed = QUANTITY.fullmatch(value)
    if parsed is None:
        return f"{value!r} is not a quantity such as 1Gi, 500M or 0.5"
    if value.startswith("-") and float(parsed.group(1)) != 0:
        return f"{value!r} is below zero"
    return None


_PodPart = type[V1Volume] | type[V1VolumeMount] | type[V1Toleration]


def _kubernetes_object_problems(field: str, model: _PodPart, value: Mapping[str, Any]) -> list[str]:
    """A core/v1 object of the spec (the CRD keeps its fields as given) against its type: a
    wrong value's type, and a field the type does not have. The API server drops such a
    field with a warning no one reads (Spark's client, for executors, without one): a
    volume whose source is misspelt becomes an emptyDir, and output written there is lost."""
    try:
        built = model.from_dict(dict(value))
    except pydantic.ValidationError as error:
        # from_dict builds each nested object on its own, whose error names only its own
        # class and field (`V1HostPathVolumeSource.path`): validated whole, it has the path.
        try:
            model.model_validate(dict(value))
        except pydantic.ValidationError as located:
            return [f"{field}{_field_path(d['loc'])}: {d['msg']}" for d in located.errors()]
        return [f"{field}: {_problems(error)}"]
    return _unknown_fields(value, built.model_dump(by_alias=True) if built else {}, field)


def _volume_source_problems(field: str, volume: Mapping[str, Any]) -> list[str]:
    """A volume names one source: the API server makes one without any (a templating
    miss, ``persistentVolumeClaim: null``) an emptyDir, where output meant for a claim is
    lost with the pod, and refuses one with several."""
    sources = [key for key, value in volume.items() if key != "name" and value is not None]
    if not sources:
        return [
            f"{field}: no volume source (persistentVolumeClaim, configMap, secret, ...): the "
            "API server would make it an emptyDir, lost with its pod; write emptyDir: {} if "
            "that is what is meant"
        ]
    if len(sources) > 1:
        return [f"{field}: {' and '.join(sources)}: a volume has one source"]
    return []


def _unknown_fields(given: Any, known: Any, field: str) -> list[str]:
    """The fields of ``given`` that its typed model's dump ``known`` (every field of each
    object, unset ones None) lacks, named with the closest known field."""
    problems = []
    if isinstance(given, Mapping) and isinstance(known, Mapping):
        for key, value in given.items():
            if key in known:
                problems += _unknown_fields(value, known[key], f"{field}.{key}")
            elif value is not None:
                problems.append(f"{field}: unknown field {key!r}{_did_you_mean(key, known)}")
    elif isinstance(given, list) and isinstance(known, list):
        for index, (item, known_item) in enumerate(zip(given, known, strict=False)):
            problems += _unknown_fields(item, known_item, f"{field}[{index}]")
    return problems
