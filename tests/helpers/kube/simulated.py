"""Simulated drivers: a kubelet that runs no process, and agents that speak the agent
protocol (docs/agent-protocol.md) without Spark.

For tests of the operator's control flow that need no data, and for the operator-scale
benchmark (thousands of jobs on one machine). One HTTP server serves every agent: a pod's
IP is a distinct 127.x.y.z address, on which the server listens at ``<port>`` once the pod
starts, and which the request's Host header carries, so each pod reaches its own agent at
``http://<podIP>:<port>`` exactly as the operator addresses a real one. The addresses begin
at a random block, and no socket listens on 0.0.0.0, so test runs in parallel (and real
drivers on the local kubelet) do not take each other's ports.
"""

import asyncio
import base64
import contextlib
import datetime
import functools
import hmac
import itertools
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx2 as httpx
from aiohttp import web
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.kubeconfig import Cluster, User
from lightkube.resources.core_v1 import Pod, Secret

from spark_checkpoint.agent.server import long_poll_parameters
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import (
    MAX_BODY_BYTES,
    Acknowledgement,
    AckReport,
    AfterCompletion,
    AgentStatus,
    CheckpointKind,
    CollectGarbageAnswer,
    CompleteBody,
    ErrorAnswer,
    FinalizeAnswer,
    QueryState,
    QueryStatus,
    RestoreCandidate,
    RestoredFrom,
    SnapshotPhase,
    SnapshotStatus,
    TriggerBody,
)
from spark_checkpoint.settings import REPORTED_ERROR_HEADER
from spark_checkpoint.storage.layout import JobStorageLayout

log = logging.getLogger(__name__)

AGENT_PORT = 8484
TASKS = ("logs", "state-0-0", "state-0-1")
# What a driver that cannot read the job's state fails with (`unreading_images`), naming the
# file it read: another in each image.
UNREADABLE_STATE_ERROR = (
    "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state. Error "
    "reading delta file file:/live/state/0/0/{version}.delta: java.io.IOException: Stream is "
    "corrupted"
)


Document = TypeVar("Document")


@dataclass
class Snapshot:
    checkpoint_id: int
    kind: CheckpointKind
    after: AfterCompletion
    batch: int
    acks: tuple[AckReport, ...] = ()
    # A drain whose input never runs out: capturing for ever, as a real agent's would be.
    draining: bool = False

    def report(self) -> SnapshotStatus:
        if self.draining:
            return SnapshotStatus(self.checkpoint_id, self.kind, SnapshotPhase.CAPTURING, None)
        state = SnapshotPhase.ACKNOWLEDGED if self.acks else SnapshotPhase.COPYING
        return SnapshotStatus(self.checkpoint_id, self.kind, state, self.batch, self.acks)


@dataclass
class SimulatedAgent:
    """One driver's agent: the query commits a batch every ``batch_seconds``; snapshot
    tasks acknowledge after a random delay; a stop-with-savepoint ends the driver.

    Its status ``version`` counts the changes (`changed`), plus one once the query started,
    one once a bounded query has finished and one once a restored query is past restoring
    (those happen at a time, not on a request)."""

    token: str
    # Where the driver's environment says the job's storage is: finalize names its images.
    storage: JobStorageLayout
    attempt: int
    restored_from: str | None  # the first restore candidate, as the environment spells it
    batch_seconds: float
    ack_delay: tuple[float, float]
    finish_after: int | None  # batches of a bounded input, None for unbounded
    # When the query starts (loop time); until then the agent reports "starting", as a real
    # one does while its driver restores the image and starts the query.
    started: float
    # A restored query reports "restoring" (no snapshot task running) this long, as a real
    # driver does until its query got past the image.
    restore_seconds: float = 0.0
    # The highest snapshot id in the job's storage when the driver started (another
    # registry's savepoints kept there), reported from the start as a real agent does.
    highest_stored_id: int | None = None
    exit_code: int | None = None
    # What its termination message says as it ends (a reported error).
    exit_message: str = ""
    # The error its restored query fails with once its status was read (its restore
    # reported), as a real one fails at its first batch: RESTORE_UNUSABLE.
    fails_restore_with: str = ""
    # The driver runs on, but nothing reaches its agent (a hung process, a network cut).
    cut_off: bool = False
    # Savepoint discards are answered 503 (storage unavailable for a while); those taken
    # are listed.
    refuses_discards: bool = False
    discarded_savepoints: list[int] = field(default_factory=list)
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    notified_batch: int | None = None
    rng: random.Random = field(default_factory=random.Random)
    changes: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def batch(self, now: float) -> int:
        committed = int((now - self.started) / self.batch_seconds)
        return committed if self.finish_after is None else min(committed, self.finish_after)

    def finished(self, now: float) -> bool:
        return self.finish_after is not None and self.batch(now) >= self.finish_after

    def changed(self) -> None:
        """Something the coordinator acts on changed: waiting status requests answer."""
        self.changes += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.changed()  # a waiting status request loses its connection

    async def wait_for_change(self, timeout: float) -> None:
        """Until `changed`, the query's finish, or ``timeout``."""
        now = asyncio.get_running_loop().time()
        if now < self.started:  # the query starts then
            timeout = min(timeout, self.started - now + 0.001)
        if self.finish_after is not None and not self.finished(now):
            # Just after the finish time: batch() rounds down.
            finish = self.started + self.finish_after * self.batch_seconds + 0.001
            timeout = max(0.0, min(timeout, finish - now))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def status(self, now: float) -> AgentStatus:
        if now < self.started:
            return AgentStatus(
                version=self.changes,
                attempt=self.attempt,
                query=QueryStatus(QueryState.STARTING),
                tasks=(),
                all_tasks_running=False,
                awaiting_final_checkpoint=False,
                restored_from=None,
                checkpoints=(),
                highest_stored_id=self.highest_stored_id,
            )
        batch = self.batch(now)
        finished = self.finished(now)
        restoring = self.restored_from is not None and now - self.started < self.restore_seconds
        past_restoring = self.restored_from is not None and not restoring
        state = (
            QueryState.RESTORING
            if restoring
            else QueryState.FINISHED
            if finished
            else QueryState.RUNNING
        )
        return AgentStatus(
            version=self.changes + 1 + finished + past_restoring,
            attempt=self.attempt,
            query=QueryStatus(state, last_committed_batch=batch),
            tasks=TASKS,
            all_tasks_running=not restoring,
            awaiting_final_checkpoint=finished
            and (self.notified_batch is None or self.notified_batch < batch),
            # Batches count from 0 in every simulated attempt: the image is "before" batch 0.
            restored_from=None
            if self.restored_from is None
            else RestoredFrom(RestoreCandidate.decode(self.restored_from), batch_id=0),
            checkpoints=tuple(s.report() for s in self.snapshots.values()),
            highest_stored_id=self.highest_stored_id,
        )


class SimulatedAgents:
    """Every simulated agent behind one server, found by the Host header's IP."""

    def __init__(
        self,
        *,
        port: int = AGENT_PORT,
        batch_seconds: float = 0.5,
        ack_delay: tuple[float, float] = (0.01, 0.2),
        finish_after: int | None = None,
        restore_seconds: float = 0.0,
        starting_seconds: float = 0.0,
        missing_images: frozenset[str] = frozenset(),
        uncoordinated_images: frozenset[str] = frozenset(),
        unreading_images: frozenset[str] = frozenset(),
        endless_input: bool = False,
        highest_stored_id: int | None = None,
        exit_seconds: float = 0.0,
        cleanup_seconds: float = 0.0,
    ) -> None:
        self.port = port
        # How long a cleanup pod runs (storage that is slow to delete from).
        self.cleanup_seconds = cleanup_seconds
        # How long a driver takes to exit once its query stopped (a final checkpoint, a
        # stop-with-savepoint): its sinks commit, then Spark stops.
        self._exit_seconds = exit_seconds
        self.highest_stored_id = highest_stored_id
        # The query's input never runs out: a drain savepoint never captures its image.
        self.endless_input = endless_input
        # Images no registry has: a driver pod of one waits as a kubelet reports it.
        self.missing_images = missing_images
        # Images of a pipeline that starts its query without run_coordinated: the driver
        # pod runs, and no agent ever listens.
        self.uncoordinated_images = uncoordinated_images
        # Images whose driver cannot read the job's state (another state store compression
        # codec in their Spark defaults): a driver of one with an image to restore fails as a
        # real one does (RESTORE_UNUSABLE), on a file of that image.
        self.unreading_images = unreading_images
        self.restore_seconds = restore_seconds
        # A driver with an image to restore reports "starting" this long (its restore).
        self.starting_seconds = starting_seconds
        self.batch_seconds = batch_seconds
        self.ack_delay = ack_delay
        self.finish_after = finish_after
        self.agents: dict[str, SimulatedAgent] = {}
        # The command of each cleanup pod that ran, in order.
        self.cleanups: list[list[str]] = []
        # Each pod the kubelet started, as it was created, in order.
        self.started: list[Mapping[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.requests = 0

    async def add(
        self,
        ip: str,
        token: str,
        storage: JobStorageLayout,
        attempt: int,
        restore: list[str],
    ) -> SimulatedAgent:
        loop = asyncio.get_running_loop()
        assert self._runner is not None, "start() the agents first"
        await web.TCPSite(self._runner, ip, self.port, reuse_address=True).start()
        agent = SimulatedAgent(
            token=token,
            storage=storage,
            attempt=attempt,
            restored_from=restore[0] if restore else None,
            batch_seconds=self.batch_seconds,
            ack_delay=self.ack_delay,
            finish_after=self.finish_after,
            started=loop.time() + (self.starting_seconds if restore else 0.0),
            restore_seconds=self.restore_seconds,
            highest_stored_id=self.highest_stored_id,
        )
        self.agents[ip] = agent
        return agent

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/v1/status", self._status)
        app.router.add_post("/v1/checkpoints", self._trigger)
        app.router.add_post(r"/v1/checkpoints/{id:\d+}/{action}", self._command)
        app.router.add_post(r"/v1/savepoints/{id:\d+}/discard", self._discarded)
        app.router.add_post("/v1/storage/collect-garbage", self._garbage)
        # A long poll still waiting when the cluster stops (its operator gone) is cut short.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _agent(self, request: web.Request) -> SimulatedAgent:
        self.requests += 1
        agent = self._running(request)
        expected = f"Bearer {agent.token}"
        if not hmac.compare_digest(request.headers.get("Authorization", ""), expected):
            raise web.HTTPUnauthorized(
                text=json.dumps(ErrorAnswer("missing or wrong bearer token").to_json()),
                content_type="application/json",
            )
        return agent

    def _running(self, request: web.Request) -> SimulatedAgent:
        ip = (request.host or "").rsplit(":", 1)[0]
        agent = self.agents.get(ip)
        if agent is None or agent.exit_code is not None or agent.cut_off:
            # Like a port nobody listens on: the connection drops, nothing answers.
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable()
        return agent

    async def _status(self, request: web.Request) -> web.Response:
        """The real agent's long poll: with ``after`` (the current version), answered
        when the version changes or after ``wait`` seconds."""
        agent = self._agent(request)
        try:
            after, wait = long_poll_parameters(request.query)
        except ValueError as error:
            return web.json_response(ErrorAnswer(f"bad request: {error}").to_json(), status=400)
        loop = asyncio.get_running_loop()
        if agent.fails_restore_with and not agent.exit_message:
            agent.exit_message = f"{REPORTED_ERROR_HEADER}\n{agent.fails_restore_with}"
            loop.call_later(0.2, agent.end, DriverExit.RESTORE_UNUSABLE)
        deadline = loop.time() + wait
        while True:
            status = agent.status(loop.time())
            remaining = deadline - loop.time()
            if after is None or status.version != after or remaining <= 0:
                return web.json_response(status.to_json())
            # In slices: a bounded query's end and a restore's end happen at a time.
            await agent.wait_for_change(min(remaining, 0.5))
            agent = self._running(request)  # a driver that ended drops the connection

    async def _trigger(self, request: web.Request) -> web.Response:
        agent = self._agent(request)
        body = await _body(request, TriggerBody.from_json)
        checkpoint_id = body.checkpoint_id
        if checkpoint_id not in agent.snapshots:
            now = asyncio.get_running_loop().time()
            snapshot = Snapshot(checkpoint_id, body.kind, body.after, agent.batch(now))
            snapshot.draining = self.endless_input and body.after is AfterCompletion.DRAIN
            agent.snapshots[checkpoint_id] = snapshot
            agent.changed()
            if not snapshot.draining:
                delay = agent.rng.uniform(*agent.ack_delay)
                asyncio.get_running_loop().call_later(delay, _acknowledge, agent, snapshot)
        return web.json_response(Acknowledgement.ACCEPTED.to_json(), status=202)

    async def _command(self, request: web.Request) -> web.Response:
        agent = self._agent(request)
        checkpoint_id = int(request.match_info["id"])
        action = request.match_info["action"]
        snapshot = agent.snapshots.get(checkpoint_id)
        if action == "finalize":
            if snapshot is None:
                raise web.HTTPNotFound(text=json.dumps(ErrorAnswer("unknown").to_json()))
            path = agent.storage.metadata_path(snapshot.kind, checkpoint_id)
            return web.json_response(FinalizeAnswer(path, 1024 * len(TASKS)).to_json())
        if action == "complete":
            body = await _body(request, CompleteBody.from_json)
            agent.snapshots.pop(checkpoint_id, None)
            agent.notified_batch = body.batch_id
            agent.changed()
            if snapshot is not None and snapshot.after is not AfterCompletion.CONTINUE:
                exit_code = DriverExit.STOPPED_WITH_SAVEPOINT
            elif agent.finish_after is not None and agent.notified_batch >= agent.finish_after:
                exit_code = DriverExit.FINISHED
            else:
                return web.json_response(Acknowledgement.NOTIFIED.to_json())
            asyncio.get_running_loop().call_later(self._exit_seconds, agent.end, exit_code)
            return web.json_response(Acknowledgement.NOTIFIED.to_json())
        if action == "abort":
            if agent.snapshots.pop(checkpoint_id, None) is not None:
                agent.changed()
            return web.json_response(Acknowledgement.ABORTED.to_json())
        if action == "discard":
            return web.json_response(Acknowledgement.DISCARDED.to_json())
        raise web.HTTPNotFound()  # as the agent: no such route

    async def _discarded(self, request: web.Request) -> web.Response:
        agent = self._agent(request)
        if agent.refuses_discards:
            return web.json_response(
                ErrorAnswer("storage unavailable: 503 Slow Down").to_json(), status=503
            )
        agent.discarded_savepoints.append(int(request.match_info["id"]))
        return web.json_response(Acknowledgement.DISCARDED.to_json())

    async def _garbage(self, request: web.Request) -> web.Response:
        self._agent(request)
        return web.json_response(CollectGarbageAnswer((), (), 0).to_json())


async def _body(request: web.Request, read: Callable[[Any], Document]) -> Document:
    """A request's body as the protocol's document; anything else is answered 400."""
    try:
        return read(await request.json())
    except ValueError as error:  # not JSON, or a ProtocolError: not the document
        raise web.HTTPBadRequest(
            text=json.dumps(ErrorAnswer(f"bad request: {error}").to_json()),
            content_type="application/json",
        ) from None


def _acknowledge(agent: SimulatedAgent, snapshot: Snapshot) -> None:
    snapshot.acks = tuple(AckReport(task, snapshot.batch, 1024, 5) for task in TASKS)
    agent.changed()


class SimulatedKubelet:
    """Runs driver pods as simulated agents, executor pods (Spark's ``spark-role`` label)
    as idle running pods, and cleanup pods as instant successes; pods are deleted as soon
    as they are asked to be (no process to stop)."""

    def __init__(self, api_url: str, agents: SimulatedAgents) -> None:
        config = KubeConfig.from_one(cluster=Cluster(server=api_url), user=User())
        self._api = AsyncClient(config, trust_env=False, field_manager="simulated-kubelet")
        self._agents = agents
        self._addresses = (f"127.{b}.{c}.{d}" for b, c, d in _address_space())
        self._pod_ips: dict[tuple[str, str], str] = {}
        self._task: asyncio.Task[None] | None = None
        self._reporter: asyncio.Task[None] | None = None
        # Driver pods whose container cannot start yet (an image, a Secret).
        self._waiting: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch())
        self._reporter = asyncio.create_task(self._report_exits())

    async def stop(self) -> None:
        for task in (self._task, self._reporter, *self._waiting.values()):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._api.close()

    def agent(self, namespace: str, pod: str) -> SimulatedAgent | None:
        ip = self._pod_ips.get((namespace, pod))
        return None if ip is None else self._agents.agents.get(ip)

    def crash(self, namespace: str, pod: str, exit_code: int = 137) -> None:
        agent = self.agent(namespace, pod)
        assert agent is not None, f"{namespace}/{pod} runs no simulated driver"
        agent.end(exit_code)

    async def _watch(self) -> None:
        while True:
            try:
                async for kind, pod in self._api.watch(Pod, namespace="*"):
                    try:
                        await self._on_pod(kind, pod.to_dict())
                    except (ApiError, httpx.HTTPError, KeyError, StopIteration):
                        # One bad pod never stops the kubelet.
                        log.exception("simulated kubelet: pod %s", pod.metadata)
            except (ApiError, httpx.HTTPError, OSError):  # reconnect, like a kubelet
                await asyncio.sleep(0.2)

    async def _on_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        metadata = pod["metadata"]
        key = (metadata["namespace"], metadata["name"])
        deleted = kind == "DELETED" or metadata.get("deletionTimestamp")
        if deleted and (waiting := self._waiting.pop(key, None)) is not None:
            waiting.cancel()  # its container never started
        if kind == "DELETED":
            ip = self._pod_ips.pop(key, None)
            agent = None if ip is None else self._agents.agents.pop(ip, None)
            if agent is not None:
                agent.changed()  # a waiting status request loses its connection
            return
        if metadata.get("deletionTimestamp"):
            agent = self.agent(*key)
            if agent is not None and agent.exit_code is None:
                agent.end(143)
            await _ignore_missing(self._api.delete(Pod, key[1], namespace=key[0], grace_period=0))
            return
        if key in self._pod_ips or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        await self._start(pod, key)

    async def _start(self, pod: Mapping[str, Any], key: tuple[str, str]) -> None:
        ip = next(self._addresses)
        self._pod_ips[key] = ip
        self._agents.started.append(pod)
        container = pod["spec"]["containers"][0]
        if pod["metadata"].get("labels", {}).get("spark-role") == "executor":
            await self._set_status(key, _running(ip, container["name"]))  # runs until deleted
        elif container["name"] == "driver":
            start = functools.partial(self._start_driver, pod, key, ip)
            self._waiting[key] = asyncio.create_task(self._start_when_it_can(pod, key, start))
        else:  # a cleanup pod: storage work that succeeds at once
            self._waiting[key] = asyncio.create_task(
                self._start_when_it_can(
                    pod, key, functools.partial(self._clean_up, key, ip, container)
                )
            )

    async def _start_when_it_can(
        self, pod: Mapping[str, Any], key: tuple[str, str], start: Callable[[], Awaitable[None]]
    ) -> None:
        """``start`` once the pod's container can start, reporting why it waits until then
        as a kubelet does (retried every half second)."""
        name = pod["spec"]["containers"][0]["name"]
        reported: tuple[str, str] | None = None
        try:
            for tries in itertools.count():
                if (waiting := await self._waiting_for(pod, tries)) is None:
                    break
                if waiting != reported:
                    reported = waiting
                    await self._set_status(key, _pending(name, *waiting))
                await asyncio.sleep(0.5)
            self._waiting.pop(key, None)
            await start()
        except (ApiError, httpx.HTTPError, KeyError, StopIteration):
            # Deleted meanwhile, or a pod it cannot run: one pod never stops the kubelet.
            log.exception("simulated kubelet: pod %s/%s", *key)

    async def _clean_up(self, key: tuple[str, str], ip: str, container: Mapping[str, Any]) -> None:
        self._agents.cleanups.append(list(container.get("command", ())))
        await asyncio.sleep(self._agents.cleanup_seconds)
        await self._set_status(key, _terminated(ip, container["name"], 0))

    async def _start_driver(self, pod: Mapping[str, Any], key: tuple[str, str], ip: str) -> None:
        container = pod["spec"]["containers"][0]
        if container.get("image") in self._agents.uncoordinated_images:
            await self._set_status(key, _running(ip, container["name"]))
            return
        environment = {e["name"]: e.get("value", "") for e in container.get("env", ())}
        restore = json.loads(environment.get("SPARK_CHECKPOINT_RESTORE", "[]"))
        agent = await self._agents.add(
            ip,
            await self._token(pod),
            JobStorageLayout(
                environment["SPARK_CHECKPOINT_STORAGE"],
                environment["SPARK_CHECKPOINT_NAMESPACE"],
                environment["SPARK_CHECKPOINT_JOB"],
            ),
            int(environment.get("SPARK_CHECKPOINT_ATTEMPT", "1")),
            restore,
        )
        if restore and container.get("image") in self._agents.unreading_images:
            agent.fails_restore_with = UNREADABLE_STATE_ERROR.format(version=len(restore) + 1)
            # Restoring (its restore reported) until it fails: no batch past its image.
            agent.restore_seconds = agent.batch_seconds = 3600.0
        if key not in self._pod_ips:  # deleted while it started
            self._agents.agents.pop(ip, None)
            return
        await self._set_status(key, _running(ip, container["name"]))

    async def _waiting_for(self, pod: Mapping[str, Any], tries: int) -> tuple[str, str] | None:
        """Why the pod's container cannot start (reason, message, as a kubelet words
        them) at the check ``tries`` after the first: its image is missing (ErrImagePull,
        then the kubelet backs off), or a Secret its env refers to (or the key) is."""
        container = pod["spec"]["containers"][0]
        if (image := container.get("image")) in self._agents.missing_images:
            if tries == 0:
                return "ErrImagePull", f'failed to pull image "{image}": not found'
            return "ImagePullBackOff", f'Back-off pulling image "{image}"'
        namespace = pod["metadata"]["namespace"]
        for variable in container.get("env", ()):
            reference = variable.get("valueFrom", {}).get("secretKeyRef")
            if reference is None or reference.get("optional"):
                continue
            name, secret_key = reference["name"], reference["key"]
            try:
                secret = await self._api.get(Secret, name, namespace=namespace)
            except ApiError as error:
                if error.status.code != 404:
                    raise
                return "CreateContainerConfigError", f'secret "{name}" not found'
            if secret_key not in (secret.data or {}) | (secret.stringData or {}):
                message = f"couldn't find key {secret_key} in Secret {namespace}/{name}"
                return "CreateContainerConfigError", message
        return None

    async def _token(self, pod: Mapping[str, Any]) -> str:
        volume = next(v for v in pod["spec"]["volumes"] if "secret" in v)
        secret = await self._api.get(
            Secret, volume["secret"]["secretName"], namespace=pod["metadata"]["namespace"]
        )
        data = secret.data or {}
        return base64.b64decode(data["token"]).decode()

    async def _report_exits(self) -> None:
        # By pod and address: a pod of the same name (its job created again) is another.
        reported: set[tuple[tuple[str, str], str]] = set()
        while True:
            await asyncio.sleep(0.1)
            for key, ip in list(self._pod_ips.items()):
                agent = self._agents.agents.get(ip)
                if agent is None or agent.exit_code is None or (key, ip) in reported:
                    continue
                reported.add((key, ip))
                await _ignore_missing(
                    self._set_status(
                        key, _terminated(ip, "driver", agent.exit_code, agent.exit_message)
                    )
                )

    async def _set_status(self, key: tuple[str, str], status: dict[str, Any]) -> None:
        await self._api.patch(Pod.Status, key[1], {"status": status}, namespace=key[0])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pending(name: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            _container(name, ready=False, state={"waiting": {"reason": reason, "message": message}})
        ],
    }


def _running(ip: str, name: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            _container(name, ready=True, state={"running": {"startedAt": _now()}})
        ],
    }


def _terminated(ip: str, name: str, exit_code: int, message: str = "") -> dict[str, Any]:
    ended = {
        "exitCode": exit_code,
        "reason": "Simulated",
        **({"message": message} if message else {}),
    }
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            _container(
                name,
                ready=False,
                state={"terminated": ended},
            )
        ],
    }


def _container(name: str, *, ready: bool, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "simulated",
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "state": state,
    }


def _address_space() -> Any:
    # Clusters of parallel test workers run at once: a random second octet alone let two
    # of them give pods one address (a bind failed: "address already in use"); the third
    # starts at the worker's process id, so they differ in one or the other.
    second = random.randrange(1, 255)
    third = os.getpid() % 256
    return itertools.product(
        (*range(second, 255), *range(1, second)),
        (*range(third, 256), *range(third)),
        range(2, 255),
    )


async def _ignore_missing(call: Any) -> None:
    try:
        await call
    except ApiError as error:
        if error.status.code != 404:
            raise
