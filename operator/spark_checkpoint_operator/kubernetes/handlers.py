"""Kopf handlers: thin glue between the cluster's events and `JobController`.

Run with ``spark-checkpoint-operator`` (``kubernetes/main.py``: Kopf's ``run`` of this
module; add ``--namespace`` per watched namespace, or ``--all-namespaces``). Kubernetes credentials
come from the service account or KUBECONFIG, for Kopf and for the operator's own client.
"""

import asyncio
import datetime
import ipaddress
import logging
import math
import os
import socket
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar, cast

import aiohttp
import kopf
from kubernetes.aio.client import ApiClient
from prometheus_client import REGISTRY

from spark_checkpoint_operator.kubernetes import objects, snapshots
from spark_checkpoint_operator.kubernetes.connection import (
    CannotConnect,
    api_configuration,
    require_api_server,
)
from spark_checkpoint_operator.kubernetes.controller import (
    JobController,
    StatusNotWritten,
    note_missing_job,
)
from spark_checkpoint_operator.kubernetes.events import EventThrottle
from spark_checkpoint_operator.kubernetes.lease import (
    LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    JobLease,
    LeaseHolder,
    LeaseUnavailable,
    NamespaceTerminating,
    lease_name,
)
from spark_checkpoint_operator.kubernetes.runtime import Clients, OperatorApiClient, PodRegistry
from spark_checkpoint_operator.metrics import CheckpointMetrics
from spark_checkpoint_operator.supervisor import Observer

log = logging.getLogger(__name__)

METRICS_PORT_VARIABLE = "SPARK_CHECKPOINT_METRICS_PORT"
DEFAULT_METRICS_PORT = 9090
# Where the metrics endpoint listens: 0.0.0.0 (IPv4), or :: on an IPv6-only cluster.
METRICS_ADDRESS_VARIABLE = "SPARK_CHECKPOINT_METRICS_ADDRESS"
DEFAULT_METRICS_ADDRESS = "0.0.0.0"
# How often a job's supervisor asks an idle agent that cannot long-poll for status, and
# checks its driver while a long poll waits (seconds; JobController's default if unset).
IDLE_POLL_VARIABLE = "SPARK_CHECKPOINT_IDLE_POLL_SECONDS"
# The operator's own service account (the chart sets both from its pod by the downward API):
# a job's pods may not run as it, or the job's code would act as the operator.
OPERATOR_NAMESPACE_VARIABLE = "SPARK_CHECKPOINT_OPERATOR_NAMESPACE"
OPERATOR_SERVICE_ACCOUNT_VARIABLE = "SPARK_CHECKPOINT_OPERATOR_SERVICE_ACCOUNT"
# Who holds a job's Lease (`lease.py`): the operator's pod (the chart sets it by the downward
# API), the same across its container's restarts; else this process on this host.
OPERATOR_POD_VARIABLE = "SPARK_CHECKPOINT_OPERATOR_POD"
# How long a job's Lease lasts unrenewed (seconds): how soon another operator takes over the
# jobs of one killed outright, and how soon a holder that cannot renew stops driving them.
LEASE_SECONDS_VARIABLE = "SPARK_CHECKPOINT_LEASE_SECONDS"
# Who chooses the user and group ids of the job's pods (`objects.UserIds`): the image
# ("image", the default) or the platform ("platform": OpenShift's restricted-v2 SCC).
USER_IDS_VARIABLE = "SPARK_CHECKPOINT_USER_IDS"
# Observers of every job beside its metrics, each made from the job's namespace and name:
# a module run with the operator (``spark-checkpoint-operator -m``) may add one, as the
# operator-scale benchmark's probe does.
JOB_OBSERVERS: list[Callable[[str, str], Observer]] = []
FINALIZER = f"{objects.GROUP}/finalizer"
CONTROLLER = "controller"
CONTROLLERS = "controllers"
# In a job's own memo: its daemon's controller did its deletion (`delete_job` has none to do).
DELETED = "deleted"
CLIENTS = "clients"
METRICS = "metrics"
CONTROLLER_SETTINGS = "controller settings"
EVENT_THROTTLE = "event throttle"
IDENTITY = "identity"
LEASE = "lease"  # the job's own, in its memo
LEASES = "leases"  # of the jobs this operator drives
LEASE_DURATION = "lease duration"
# How soon a failed deletion is tried again (Kopf's default backoff is 60 s).
DELETE_RETRY_SECONDS = 5.0
# How soon a job's daemon that failed (a status not written) starts over and adopts the driver.
DAEMON_RETRY_SECONDS = 5.0
# How long an exiting operator waits for a job's controller to stop before it releases (or
# leaves to expire) the job's Lease.
CONTROLLER_EXIT_SECONDS = 5.0
_T = TypeVar("_T")


class _NoDiffBase(kopf.DiffBaseStorage):
    """Kopf keeps the last handled spec for creation and update handlers; there are none
    (the daemon follows the spec itself), only a deletion handler. Nothing is stored, so
    no job is patched with Kopf's copy of its spec when it is created or changed."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


class _CheckedProgressStorage(kopf.AnnotationsProgressStorage):
    """Kopf's handler progress in the job's annotations, which anyone who may patch the job
    can write: a record Kopf cannot read (not JSON, a time that is none) made every handling
    of the job fail, so a deleted job kept its finalizer for ever. Such a record is said once
    and taken as none: the handler runs afresh (the deletion handler is idempotent)."""

    def fetch(self, *, key: kopf.HandlerId, body: kopf.Body) -> kopf.ProgressRecord | None:
        problem: str | None
        try:
            record = super().fetch(key=key, body=body)
        except ValueError as error:  # json.JSONDecodeError
            record, problem = None, f"not JSON: {error}"
        else:
            problem = None if record is None else _progress_problem(record)
        if problem is not None:
            kopf.warn(
                body, reason="ProgressIgnored", message=f"{self.prefix}/{key}: {problem}; ignored"
            )
            return None
        return record


def _progress_problem(record: Any) -> str | None:
    """What keeps Kopf from reading a progress record, or None."""
    if not isinstance(record, dict):
        return "not an object"
    for field in ("started", "stopped", "delayed"):
        value = record.get(field)
        if value is None:
            continue
        try:
            datetime.datetime.fromisoformat(value)
        except (TypeError, ValueError):
            return f"{field}: not an ISO 8601 time"
    retries = record.get("retries")
    if retries is not None and (type(retries) is not int or retries < 0):
        return "retries: not a count"
    for field in ("success", "failure"):
        if record.get(field) not in (None, True, False):
            return f"{field}: not a boolean"
    for field in ("message", "purpose"):
        if record.get(field) is not None and not isinstance(record.get(field), str):
            return f"{field}: not a string"
    subrefs = record.get("subrefs")
    if subrefs is not None and not (
        isinstance(subrefs, list) and all(isinstance(s, str) for s in subrefs)
    ):
        return "subrefs: not a list of names"
    return None


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = _CheckedProgressStorage(prefix=objects.GROUP)
    settings.persistence.diffbase_storage = _NoDiffBase()
    # No peering resources: each job's Lease says which operator drives it (`lease.py`).
    settings.peering.standalone = True
    # Only the events this operator posts itself, not one per handler run.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # Only the jobs' pods are sent to the operator (the handler's filter is client-side).
    settings.watching.label_selectors["pods"] = objects.LABEL_JOB
    # Every handler call at INFO would bury what the operator says.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # The operator-wide memo is shared by every object's memo: pods find their job here.
    memo[CONTROLLERS] = {}
    metrics = CheckpointMetrics(REGISTRY)
    port = _setting(METRICS_PORT_VARIABLE, str(DEFAULT_METRICS_PORT), _port, "a port number")
    address = _setting(
        METRICS_ADDRESS_VARIABLE, DEFAULT_METRICS_ADDRESS, _address, "an IPv4 or IPv6 address"
    )
    if port:  # 0 turns the endpoint off
        try:
            metrics.serve(port, address)
        except OSError as error:
            # Said once, and the operator exits: a retry would register the metrics twice.
            raise kopf.PermanentError(
                f"cannot serve metrics on {address} port {port} ({METRICS_ADDRESS_VARIABLE}, "
                f"{METRICS_PORT_VARIABLE}; 0 turns them off): {error.strerror or error}"
            ) from None
    memo[METRICS] = metrics
    idle_poll = _setting(IDLE_POLL_VARIABLE, "", _seconds, "a number of seconds above 0")
    memo[CONTROLLER_SETTINGS] = {} if idle_poll is None else {"idle_poll_interval": idle_poll}
    memo[LEASES] = {}
    memo[LEASE_DURATION] = _setting(
        LEASE_SECONDS_VARIABLE,
        str(LEASE_SECONDS),
        _lease_seconds,
        f"a whole number of seconds from {MIN_LEASE_SECONDS} to {MAX_LEASE_SECONDS}",
    )
    memo[IDENTITY] = (
        os.environ.get(OPERATOR_POD_VARIABLE) or f"{socket.gethostname()}/{os.getpid()}"
    )
    memo[CONTROLLER_SETTINGS]["user_ids"] = _setting(
        USER_IDS_VARIABLE,
        objects.UserIds.IMAGE.value,
        objects.UserIds,
        " or ".join(repr(ids.value) for ids in objects.UserIds),
    )
    namespace = os.environ.get(OPERATOR_NAMESPACE_VARIABLE)
    account = os.environ.get(OPERATOR_SERVICE_ACCOUNT_VARIABLE)
    if namespace and account:
        memo[CONTROLLER_SETTINGS]["operator_account"] = objects.ServiceAccount(namespace, account)
    try:
        api: ApiClient = OperatorApiClient(await api_configuration())
    except CannotConnect as error:
        raise kopf.PermanentError(str(error)) from None  # retrying cannot help
    try:
        await require_api_server(api)
    except CannotConnect as error:
        await api.close()
        # Said once: in a pod, the kubelet's restarts retry (Kopf's retries would be a
        # minute of tracebacks).
        raise kopf.PermanentError(str(error)) from None
    memo[CLIENTS] = Clients(
        api=api,
        pods=PodRegistry(),
        # One connection pool for every job's agent; no cap shared by all of them.
        session=aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)),
    )


def _setting(name: str, default: str, parse: Callable[[str], _T], meaning: str) -> _T:
    """The operator's setting from the environment variable ``name``: a wrong value stops
    the operator with one line (Kopf would retry its startup every minute for ever)."""
    text = os.environ.get(name, default)
    try:
        return parse(text)
    except ValueError:
        raise kopf.PermanentError(f"{name}={text!r} is not {meaning}") from None


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(text)
    return port


def _address(text: str) -> str:
    return str(ipaddress.ip_address(text))


def _lease_seconds(text: str) -> int:
    seconds = int(text)
    if not MIN_LEASE_SECONDS <= seconds <= MAX_LEASE_SECONDS:
        raise ValueError(text)
    return seconds


def _seconds(text: str) -> float | None:
    """None if unset (empty)."""
    if not text:
        return None
    seconds = float(text)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(text)
    return seconds


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    # Kopf leaves the jobs' daemons running as it exits: their Leases are released here,
    # while the client is open, so that the next operator takes the jobs at once.
    # Not a deleted job's, whose final savepoint may still be under way: another operator
    # takes that over once it expires.
    held: dict[tuple[str, str], JobLease] = memo[LEASES]
    controllers: dict[tuple[str, str], JobController] = memo[CONTROLLERS]
    await asyncio.gather(
        *(
            _released_once_stopped(key, lease, controllers.get(key))
            for key, lease in list(held.items())
        )
    )
    clients: Clients = memo[CLIENTS]
    await clients.session.close()
    await clients.api.close()


async def _released_once_stopped(
    key: tuple[str, str], lease: JobLease, controller: JobController | None
) -> None:
    """Release the Lease of a job whose controller has stopped (Kopf gives up waiting for a
    daemon that is slow to exit); a controller still running keeps it, for another operator
    to take over once it expires, as does a deletion."""
    if controller is not None:
        if controller.deleting:
            return
        try:
            async with asyncio.timeout(CONTROLLER_EXIT_SECONDS):
                await controller.ended()
        except TimeoutError:
            log.warning(
                "%s/%s: still stopping as the operator exits; its Lease is left to expire",
                *key,
            )
            return
    await lease.release()


# The event handlers are coroutines: Kopf runs plain functions in a thread pool, where the
# controllers' asyncio events must not be set, and each call would cost a thread hop.
@kopf.on.event("", "v1", "pods", labels={objects.LABEL_JOB: kopf.PRESENT})
async def pod_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    clients: Clients = memo[CLIENTS]
    pod = event["object"]
    clients.pods.observe(event.get("type"), pod)
    job = (pod["metadata"]["namespace"], pod["metadata"]["labels"][objects.LABEL_JOB])
    controller: JobController | None = memo[CONTROLLERS].get(job)
    if controller is not None:
        controller.changed()


@kopf.on.event(objects.GROUP, objects.VERSION, objects.PLURAL)
async def job_changed(memo: kopf.Memo, **_: Any) -> None:
    controller: JobController | None = memo.get(CONTROLLER)
    if controller is not None:
        controller.changed()


@kopf.on.event(objects.GROUP, objects.VERSION, objects.SNAPSHOT_PLURAL)
async def snapshot_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    clients: Clients = memo[CLIENTS]
    body = event["object"]
    job = clients.snapshots.observe(event.get("type"), body)
    namespace = body["metadata"]["namespace"]
    for concerned in snapshots.Snapshot.from_body(body).concerns - {job[1]}:
        if (other := memo[CONTROLLERS].get((namespace, concerned))) is not None:
            other.pins_changed()  # its mirror, or a name its mirror may take
    controller: JobController | None = memo[CONTROLLERS].get(job)
    if controller is not None:
        controller.pins_changed()  # to hold or let go, deleted, edited, completed
    elif event.get("type") != "DELETED":
        await note_missing_job(clients, body)


def _controller(body: kopf.Body, memo: kopf.Memo) -> JobController:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    return JobController(
        memo[CLIENTS],
        body,
        _event_throttle(body, memo),
        memo[METRICS].job(namespace, name),
        observers=[observe(namespace, name) for observe in JOB_OBSERVERS],
        post_snapshot_event=_post_object_event,
        **memo[CONTROLLER_SETTINGS],
    )


def _post_object_event(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    kopf.event(kopf.Body(cast(kopf.RawBody, body)), type=kind, reason=reason, message=message)


def _lease(body: kopf.Body, memo: kopf.Memo) -> JobLease:
    """The job's Lease, one object for all its handlers' runs (Kopf's memo is per job): a
    Lease is expired once seen unchanged for its duration, which a new one never has."""
    lease: JobLease | None = memo.get(LEASE)
    if lease is None:
        clients: Clients = memo[CLIENTS]
        lease = memo[LEASE] = JobLease(
            clients.api, body, memo[IDENTITY], seconds=memo[LEASE_DURATION]
        )
    return lease


def _acquired(lease: JobLease, body: kopf.Body, memo: kopf.Memo) -> Coroutine[Any, Any, None]:
    """Until the Lease is held, each holder waited for and each reason it cannot be taken
    told, once each, as a warning event on the job."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    post_event = _event_throttle(body, memo)

    def waiting(holder: LeaseHolder) -> None:
        message = (
            f"operator {holder.identity} holds this job's Lease "
            f"{namespace}/{lease_name(name)}: this one drives the job once that one releases "
            f"it or leaves it unrenewed for {holder.seconds:g} s (another operator serves "
            "this namespace, or this operator's previous pod ended without releasing it)"
        )
        log.warning("%s/%s: %s", namespace, name, message)
        post_event("Warning", "AnotherOperator", message)

    def unavailable(why: str) -> None:
        log.warning("%s/%s: %s", namespace, name, why)
        post_event("Warning", "LeaseUnavailable", why)

    return lease.acquire(waiting, unavailable)


async def _first(work: Coroutine[Any, Any, None], other: asyncio.Future[Any]) -> bool:
    """Whether ``work`` ended before ``other`` (else it is cancelled, as when this is)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, other}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _cancelled(task)
    if task.cancelled():
        return False
    task.result()
    return True


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` unless it is done, and wait until it is. Its CancelledError is not
    this one's: a cancellation of the caller while it waits goes on (``suppress`` would
    swallow it, and the caller would carry on as if the task had just stopped)."""
    if not task.done():
        task.cancel()
        await asyncio.wait({task})


def _event_throttle(body: kopf.Body, memo: kopf.Memo) -> EventThrottle:
    """The job's events, throttled across its daemon's runs (Kopf's memo is per job): a
    daemon restarted every few seconds (a status write refused) posted each of its events
    anew every time."""

    def post_event(kind: str, reason: str, message: str) -> None:
        kopf.event(body, type=kind, reason=reason, message=message)

    throttle: EventThrottle = memo.setdefault(EVENT_THROTTLE, EventThrottle(post_event))
    return throttle


# While a deleted job takes its final savepoint, Kopf checks every second whether its
# daemon is done (it releases the finalizer then; first after the cancellation backoff
# below), not once a minute. As the operator exits, Kopf waits for each daemon (its
# controller stopping, its Lease released) as long as for a controller in `close`, not
# ten event-loop cycles: then it warned that it left each one orphaned. A deletion waits
# for the daemon however long, as before.
@kopf.daemon(
    objects.GROUP,
    objects.VERSION,
    objects.PLURAL,
    backoff=DAEMON_RETRY_SECONDS,
    cancellation_backoff=CONTROLLER_EXIT_SECONDS,
    cancellation_polling=1.0,
)
async def run_job(
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    stopping = asyncio.ensure_future(stopped.wait())
    try:
        await _drive(body, stopped, stopping, memo)
    finally:
        await _cancelled(stopping)
        clients: Clients = memo[CLIENTS]
        if stopped.reason and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
            clients.pods.forget(*key)


async def _drive(
    body: kopf.Body, stopped: kopf.DaemonStopped, stopping: asyncio.Future[Any], memo: kopf.Memo
) -> None:
    """Once the job's Lease is held, its controller runs until it ends, the daemon is
    stopped or the Lease is lost; the Lease is released only once nothing drives the job."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    lease = _lease(body, memo)
    try:
        if not await _first(_acquired(lease, body, memo), stopping):
            return  # stopped while waiting (a deletion waits for the Lease in `delete_job`)
    except asyncio.CancelledError:
        await lease.release()  # taken in the very step this daemon was cancelled
        raise
    memo[LEASES][key] = lease
    controller = _controller(body, memo)
    memo[CONTROLLER] = memo[CONTROLLERS][key] = controller
    running = asyncio.create_task(controller.run())
    lost = asyncio.create_task(lease.held())
    try:
        await asyncio.wait({running, stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            reason = stopped.reason or kopf.DaemonStoppingReason.OPERATOR_EXITING
            deleting = stopping.done() and bool(reason & kopf.DaemonStoppingReason.RESOURCE_DELETED)
            controller.stop(deleting=deleting)
        await running
        if await controller.ended():
            memo[DELETED] = True
        if lost.done():
            # Its driver runs on; whoever holds the Lease now drives it (adopts it).
            raise kopf.TemporaryError(
                f"stopped driving the job: {lost.result()}", delay=DAEMON_RETRY_SECONDS
            )
    except StatusNotWritten as error:
        # One line (Kopf logs a TemporaryError without its traceback), not the client's
        # traceback with the response's headers every few seconds.
        raise kopf.TemporaryError(str(error), delay=DAEMON_RETRY_SECONDS) from error
    finally:
        # Only if this daemon itself was cancelled (the event loop closing): nothing may go
        # on driving the job once its Lease is released.
        await _cancelled(running)
        if lost.done():
            # Whoever holds the Lease now serves the job's metrics: this operator's would
            # stand still beside them.
            memo[METRICS].job(*key).forget()
        else:
            await _cancelled(lost)
            # A deleted job's Lease goes with it: released, another operator would do the
            # deletion again before the finalizer is gone.
            if not controller.deleting:
                await lease.release()
        if memo[LEASES].get(key) is lease:
            del memo[LEASES][key]
        memo.pop(CONTROLLER, None)
        if memo[CONTROLLERS].get(key) is controller:
            del memo[CONTROLLERS][key]


# Kopf holds a deleted job by its finalizer until this handler has succeeded and the daemon
# has exited (both are checked on every cycle), and tells the daemon to stop before it calls
# this handler. It starts no daemon for a job that is being deleted already (the operator
# was down when it was deleted): then this handler does the deletion itself. A failure must
# be retried until it succeeds, never given up (Kopf would release the finalizer then):
# errors, timeout and retries are Kopf's defaults for handlers, stated so that they stay so;
# the backoff is 5 s instead of Kopf's 60 s.
@kopf.on.delete(
    objects.GROUP,
    objects.VERSION,
    objects.PLURAL,
    errors=kopf.ErrorsMode.TEMPORARY,
    timeout=None,
    retries=None,
    backoff=DELETE_RETRY_SECONDS,
)
async def delete_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if memo.get(DELETED):
        # Kopf calls this handler once the daemon exited too: its deletion is done, and a
        # second one would collect the job's garbage again.
        return
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    clients: Clients = memo[CLIENTS]
    controllers: dict[tuple[str, str], JobController] = memo[CONTROLLERS]
    running = controllers.get(key)
    if running is not None:
        # The daemon's controller does the deletion (Kopf told the daemon to stop, for the
        # deletion, before it called this handler); never a second one for the same job.
        running.stop(deleting=True)
        if await running.ended():
            return
        raise kopf.TemporaryError(
            "the job's deletion failed; trying again", delay=DELETE_RETRY_SECONDS
        )
    lease = _lease(body, memo)
    try:
        holder = await lease.try_acquire()
    except NamespaceTerminating as error:
        # No operator can take the Lease, and the namespace goes only once the job's
        # finalizer does. Another operator may still be carrying out the deletion (its
        # Lease deleted under it; the job going cuts it short): nothing is done to the
        # driver or the storage here, so two never act on them at once.
        log.warning(
            "%s/%s: %s; the job is let go without a final savepoint or retention (its "
            "checkpoints stay in storage; no pod can be created there)",
            *key,
            error,
        )
        await _controller(body, memo).let_go_with_namespace()
        memo[DELETED] = True
        clients.pods.forget(*key)
        return
    except LeaseUnavailable as error:
        raise kopf.TemporaryError(str(error), delay=DELETE_RETRY_SECONDS) from error
    if holder is not None:
        raise kopf.TemporaryError(
            f"operator {holder.identity} holds the job's Lease; its deletion waits for it",
            delay=DELETE_RETRY_SECONDS,
        )
    controller = _controller(body, memo)
    controllers[key] = controller  # its pods' events reach it
    renewing = asyncio.create_task(lease.held())  # through a final savepoint
    try:
        await controller.delete()
    except StatusNotWritten as error:
        raise kopf.TemporaryError(str(error), delay=DELETE_RETRY_SECONDS) from error
    finally:
        await _cancelled(renewing)
        if controllers.get(key) is controller:
            del controllers[key]
    clients.pods.forget(*key)
