"""Which operator drives a job: the one that holds its Lease (coordination.k8s.io/v1,
``<job>.sparkcheckpoint.io`` in the job's namespace, owned by the job).

Two operators serving one namespace (two chart releases whose namespaces overlap, one run
by hand beside the chart's, a pod on a partitioned node beside its replacement) each ran
the job's coordinator on a registry of its own: both triggered checkpoints, and after a
driver crash the one whose registry was empty started the next driver from nothing, ids
from 1 again (a hostile reviewer's). Now the second one waits, and says so.

Kubernetes' leader election, per job (as client-go's leaderelection reads a Lease): a
holder renews it every third of its duration (no read: its last write's version is the
precondition); another takes it over once it has seen the Lease
unchanged for its ``leaseDurationSeconds`` by its own clock (the holder's clock is never
compared with it), or at once when the holder released it on its way out. A holder that
could not renew within two thirds of the duration stops driving the job (its driver runs
on) before anyone may take the Lease over. Every write carries the ``resourceVersion`` read,
so of two operators racing for it one wins.
"""

import asyncio
import contextlib
import datetime
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import aiohttp
from kubernetes.aio.client import ApiClient, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException, ConflictException, NotFoundException

from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.kubernetes.runtime import namespace_terminating

log = logging.getLogger(__name__)

# By default a job's Lease is renewed every 20 s: one write per job, beside its status
# writes (an operator of thousands of jobs); an operator killed outright is replaced after a
# minute (one that exits releases its Leases; its pod's restarted container is the same
# holder). The operator's setting SPARK_CHECKPOINT_LEASE_SECONDS changes the duration.
LEASE_SECONDS = 60
# The holder stops driving a third of the duration before another may take over: at 15 s
# (client-go's shortest usual LeaseDuration, with its 10 s deadline), 5 s for a controller
# inside a slow status write to stop. A day at most: a replaced pod is a new holder, and its
# jobs wait that long after a lost node.
MIN_LEASE_SECONDS = 15
MAX_LEASE_SECONDS = 86400
# How often an operator that waits for another's Lease looks again (only while two serve
# one namespace): a Lease released on the way out is taken within this.
WAIT_SECONDS = 5.0
_FAILURES = (ApiException, aiohttp.ClientError, TimeoutError)


FORBIDDEN = 403


class LeaseHolder(NamedTuple):
    """Another operator that holds a job's Lease, and the duration its Lease says: how long
    it must go unrenewed before this one takes it over (the holder's setting, not this
    operator's)."""

    identity: str
    seconds: float


# Read and written as plain documents through the generic object API (the same URLs as the
# Coordination API's): the generated client's V1Lease models cost a job's renewal more CPU
# than its status write (operator_scale benchmark).
_GROUP, _VERSION, _PLURAL = "coordination.k8s.io", "v1", "leases"
# How soon a renewal that failed is tried again (client-go's retry period).
RETRY_SECONDS = 2.0


class LeaseUnavailable(Exception):
    """The Lease cannot be read or written (the message says why, naming it)."""


class NamespaceTerminating(LeaseUnavailable):
    """The job's namespace is being deleted: nothing can be created in it, the job's
    Lease neither (by this operator or any other)."""


def lease_name(job: str) -> str:
    """Named after the job and this project: no other application's Lease."""
    return f"{job}.{objects.GROUP}"


class JobLease:
    """The Lease of one job, as ``identity`` (the operator's pod) holds it."""

    def __init__(
        self,
        api: ApiClient,
        job: Mapping[str, Any],
        identity: str,
        *,
        seconds: int = LEASE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._objects = CustomObjectsApi(api)
        self._job = job
        self._namespace = job["metadata"]["namespace"]
        self._name = lease_name(job["metadata"]["name"])
        self.identity = identity
        self.seconds = seconds
        self._renew_seconds = seconds / 3
        self._renew_deadline = seconds * 2 / 3
        self._clock = clock
        # The version last read and when it was first seen (this process's clock).
        self._seen: tuple[str | None, float] | None = None
        self._held: dict[str, Any] | None = None  # as last written
        self._releasing: asyncio.Future[None] | None = None
        self._renewed = 0.0

    async def acquire(
        self, waiting: Callable[[LeaseHolder], None], unavailable: Callable[[str], None]
    ) -> None:
        """Return once this operator holds the Lease; ``waiting`` is told each new holder
        it waits for, ``unavailable`` each new reason it cannot be taken."""
        told: LeaseHolder | str | None = None
        while True:
            try:
                holder = await self.try_acquire()
            except LeaseUnavailable as error:
                if str(error) != told:
                    told = str(error)
                    unavailable(told)
            else:
                if holder is None:
                    return
                if holder != told:
                    told = holder
                    waiting(holder)
            await asyncio.sleep(WAIT_SECONDS)

    async def try_acquire(self) -> LeaseHolder | None:
        """Take the Lease if it is free, expired or this operator's: None once held, else
        the holder that keeps it. LeaseUnavailable if it cannot be read or written."""
        while True:
            started = self._clock()
            try:
                lease = await self._read()
                if lease is None:
                    self._held = _document(
                        await self._objects.create_namespaced_custom_object(
                            _GROUP, _VERSION, self._namespace, _PLURAL, self._body()
                        )
                    )
                else:
                    holder = _holder(lease)
                    if holder and holder != self.identity and not self._expired(lease):
                        return LeaseHolder(holder, self._duration(lease))
                    await self._write(lease, renewing=holder == self.identity)
            except (ConflictException, NotFoundException):
                continue  # another write came first: read it again
            except _FAILURES as error:
                if namespace_terminating(error):
                    raise NamespaceTerminating(
                        f"the job's namespace {self._namespace} is being deleted: its Lease "
                        f"{self._name} cannot be created"
                    ) from error
                raise LeaseUnavailable(self._unavailable(error)) from error
            self._renewed = started
            self._releasing = None
            return None

    async def held(self) -> str:
        """Renew the Lease until it is lost (or released); return why. Each attempt is
        bounded by the renew deadline, and a failed one is tried again soon: past the
        deadline this operator stops driving the job before another may take it over."""
        wait = self._renew_seconds * random.uniform(0.8, 1.0)  # jobs started together spread out
        while True:
            await asyncio.sleep(wait)
            if self._releasing is not None or self._held is None:
                return "the job's Lease was released"
            started = self._clock()
            try:
                async with asyncio.timeout(self._renewed + self._renew_deadline - started):
                    if lost := await self._renew(self._held):
                        return lost
                self._renewed = started
                wait = self._renew_seconds
            except _FAILURES as error:
                if self._clock() - self._renewed >= self._renew_deadline:
                    return f"the job's Lease could not be renewed ({_failure(error)})"
                log.info("cannot renew Lease %s/%s yet: %s", self._namespace, self._name, error)
                wait = min(RETRY_SECONDS, self._renew_seconds)

    async def _renew(self, held: dict[str, Any]) -> str | None:
        """Why the Lease is no longer this operator's, or None once renewed."""
        try:
            await self._write(held, renewing=True)
        except NotFoundException:  # deleted: another may create it at once
            return "the job's Lease was deleted"
        except ConflictException:  # changed since: still ours?
            lease = await self._read()
            holder = _holder(lease) if lease else None
            if lease is None or holder != self.identity:
                return f"operator {holder or '(none)'} holds the job's Lease now"
            await self._write(lease, renewing=True)
        return None

    async def release(self) -> None:
        """Let the next operator take the job at once (an operator on its way out): once,
        however many ask (its daemon, and the operator's cleanup before it closes the
        client), each returning when it is done; renewing stops."""
        if self._releasing is None:
            self._releasing = asyncio.ensure_future(self._give_up())
        await asyncio.shield(self._releasing)

    async def _give_up(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        # RuntimeError: the client is closed already (a daemon Kopf left running as the
        # operator exited); the Lease expires.
        with contextlib.suppress(*_FAILURES, RuntimeError):
            try:
                await self._write(held, renewing=True, holder="")
            except ConflictException:  # a renewal came first
                lease = await self._read()
                if lease is not None and _holder(lease) == self.identity:
                    await self._write(lease, renewing=True, holder="")

    def _unavailable(self, error: BaseException) -> str:
        lease = f"Lease {self._namespace}/{self._name}"
        if isinstance(error, ApiException) and error.status == FORBIDDEN:
            return (
                f"the job's {lease} cannot be taken: HTTP 403 (the operator needs get, create "
                "and update on leases.coordination.k8s.io in the job's namespace)"
            )
        return f"the job's {lease} cannot be taken yet: {_failure(error)}"

    def _expired(self, lease: Mapping[str, Any]) -> bool:
        """Unchanged for its duration since this process first saw that version."""
        version = lease.get("metadata", {}).get("resourceVersion")
        now = self._clock()
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)
        return bool(now - self._seen[1] >= self._duration(lease))

    def _duration(self, lease: Mapping[str, Any]) -> float:
        """The Lease's own duration (its holder's setting); this operator's if it has none."""
        duration = _spec(lease).get("leaseDurationSeconds")
        return float(duration) if isinstance(duration, int | float) and duration else self.seconds

    async def _read(self) -> dict[str, Any] | None:
        try:
            return _document(
                await self._objects.get_namespaced_custom_object(
                    _GROUP, _VERSION, self._namespace, _PLURAL, self._name
                )
            )
        except NotFoundException:
            return None

    async def _write(
        self, lease: Mapping[str, Any], *, renewing: bool, holder: str | None = None
    ) -> None:
        """Replace the Lease as read or last written (its resourceVersion is the
        precondition)."""
        body = self._body()
        body["metadata"]["resourceVersion"] = lease.get("metadata", {}).get("resourceVersion")
        spec = _spec(lease)
        if renewing and spec.get("acquireTime"):
            body["spec"]["acquireTime"] = spec["acquireTime"]
        transitions = spec.get("leaseTransitions") or 0
        body["spec"]["leaseTransitions"] = transitions if renewing else transitions + 1
        if holder is not None:
            body["spec"]["holderIdentity"] = holder
        self._held = _document(
            await self._objects.replace_namespaced_custom_object(
                _GROUP, _VERSION, self._namespace, _PLURAL, self._name, body
            )
        )

    def _body(self) -> dict[str, Any]:
        now = _micro_time(datetime.datetime.now(datetime.UTC))
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self._name,
                "namespace": self._namespace,
                "labels": {objects.LABEL_JOB: self._job["metadata"]["name"]},
                # Gone with the job.
                "ownerReferences": [objects.owner_reference(self._job)],
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }


def _document(answer: object) -> dict[str, Any]:
    """The API server's answer: a JSON object, always."""
    assert isinstance(answer, dict), type(answer)
    return answer


def _spec(lease: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = lease.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _holder(lease: Mapping[str, Any]) -> str | None:
    holder = _spec(lease).get("holderIdentity")
    return holder if isinstance(holder, str) else None


def _micro_time(moment: datetime.datetime) -> str:
    """As the API server's MicroTime reads it (RFC 3339, six fractional digits)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _failure(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status}"
    return str(error) or type(error).__name__
