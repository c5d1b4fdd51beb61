"""One SparkCheckpointJob on the cluster: its driver kept as the spec says, one supervisor
(so one coordinator) at a time, and its status.

The controller knows nothing of Kopf: the handlers give it the job's live body, tell it
when the body changed, and tell it to stop (the job was deleted, or the operator exits).

- ``spec.state: Suspended``: stop-with-savepoint, then no pods; back to ``Running``:
  restore from that savepoint.
- A change of what the driver is built from (image, application, pods): a savepoint that
  stops the driver, then a new driver restored from it (an upgrade).
- Trigger nonces: a checkpoint or savepoint per new value, labelled with it.
- Checkpoint settings: applied to the running coordinator. ``verifyRestorable``: each
  completed image is checked in a check pod (`KubernetesJanitor.problems`).
- Deletion: the final savepoint if ``spec.shutdown.finalSavepoint``, then the job ends
  Cancelled and its retention policy is applied by cleanup pods. The daemon's controller
  does it (``stop(deleting=True)``); a job deleted while the operator was down, with no
  daemon, is done by ``delete``, which adopts the recorded driver for its savepoint.
- An operator restart: the running driver is adopted, the registry and id counter are
  read back from status.
"""

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import Enum
from http import HTTPStatus
from typing import Any

import aiohttp
from kubernetes.aio.client import V1DeleteOptions, V1Preconditions
from kubernetes.aio.client.exceptions import ApiException, NotFoundException

from spark_checkpoint.storage.layout import (
    JobStorageLayout,
    parse_snapshot_address,
    storage_place,
)
from spark_checkpoint_operator.coordinator import (
    AfterCompletion,
    CheckpointKind,
    CompletedCheckpoint,
    CoordinatorConfig,
    JobPhase,
    PersistedState,
    RetentionPolicy,
    TerminalOutcome,
    TriggerRequested,
)
from spark_checkpoint_operator.kubernetes import objects, rollback, snapshots
from spark_checkpoint_operator.kubernetes.events import PostEvent
from spark_checkpoint_operator.kubernetes.runtime import (
    MERGE_PATCH,
    Clients,
    KubernetesDriver,
    KubernetesJanitor,
    KubernetesLauncher,
    api_message,
    driver_restore_candidates,
    executors_of,
    owner_uids,
    pod_ready,
    pod_spec_problems,
)
from spark_checkpoint_operator.manifest.loading import manifest_from_update
from spark_checkpoint_operator.manifest.model import JobManifest, JobState
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.metrics import JobMetrics
from spark_checkpoint_operator.restore_choice import (
    LET_GO,
    ChosenImage,
    UnknownImage,
    image_at,
    snapshot_uri,
    why_gone,
)
from spark_checkpoint_operator.status import (
    IMAGE_FIELDS,
    SPEC_VALID,
    InvalidStatus,
    Observed,
    Readiness,
    render_status,
)
from spark_checkpoint_operator.supervisor import (
    BLOCKED_MIN_DELAY,
    FINISHING_NEEDS_NO_SAVEPOINT,
    CleanupFailed,
    DriverHandle,
    DriverLauncher,
    JobRecord,
    JobSupervisor,
    LaunchFailed,
    Level,
    Notice,
    Observer,
    Observers,
    restart_delay,
)

log = logging.getLogger(__name__)

ACTIVE_PHASES = (JobPhase.DEPLOYING, JobPhase.RUNNING, JobPhase.RESTARTING)
# Suspending too: written once the stopping savepoint was registered, before its driver was
# told to stop, which an operator restart may have come between.
DRIVER_PHASES = (*ACTIVE_PHASES, JobPhase.SUSPENDING)
ENDED_PHASES = (JobPhase.FINISHED, JobPhase.FAILED, JobPhase.CANCELLED)
# Why a running driver is stopped with a savepoint: the label of that savepoint.
SUSPEND = "suspend"
UPGRADE = "upgrade"
ROLLBACK = "rollback"  # an upgrade back to the last stable spec (spec.rollback)
# A driver stopped for spec.restore.savepointRedeployNonce (without a savepoint).
REDEPLOY = "redeploy"
# status.handledTriggers' key of the redeploy nonce last carried out.
REDEPLOY_NONCE = "savepointRedeployNonce"
_STOPPING = (
    "once its savepoint completes (at once without one: spec.shutdown.finalSavepoint false); "
    "the job's Stopping events say how that goes"
)
STATUS_WRITE_ATTEMPTS = 5


class StatusNotWritten(Exception):
    """The API server did not take the job's status, retries included (its RBAC, its
    validation, its size limit): said in one line; the daemon stops and tries again."""


# status.lastAcceptedSpec repeats the spec; a spec longer than this (as JSON) is not kept
# there, so that it cannot take a job over etcd's object size limit (1.5 MiB).
MAX_ACCEPTED_SPEC_LENGTH = 256 << 10
# A condition's message names this many tolerated problems, then counts the rest.
TOLERATED_SHOWN = 5
# How long a deleted job may take for its final savepoint beyond the checkpoint timeout.
SHUTDOWN_GRACE_SECONDS = 60.0
# How soon a change waiting for a driver's agent to answer again is looked at again.
SPEC_RECHECK_SECONDS = 1.0
# How soon a snapshot's finalizer, or the list of snapshots, is asked for again after the API
# server did not answer (nothing else may change meanwhile: a suspended job, say); how many
# times a deleted job's snapshots are (its controller ends then).
SNAPSHOT_RETRY_SECONDS = 5.0
DELETED_JOB_SNAPSHOT_TRIES = 3
# How soon mirrors the API server forbade (a role without create on the snapshots; a quota
# or an admission webhook may also answer 403) are asked for again.
MIRROR_FORBIDDEN_RETRY_SECONDS = 60.0
# How soon the rollback's annotations, refused by the API server, are written again.
ANNOTATIONS_RETRY_SECONDS = 30.0


# Posts an event (type, reason, message) on an object (its body as the watch gave it).
# A snapshot's disposal answers (`SavepointDisposed`, `SavepointNotDisposed`), details when a
# user asked with the CLI, which prints them: news on the job when a deletion asked.
NOT_DISPOSED = "SavepointNotDisposed"
DISPOSALS = ("SavepointDisposed", NOT_DISPOSED)
PostObjectEvent = Callable[[Mapping[str, Any], str, str, str], None]
# What a request to the API server may fail with: its answer, or no answer.
API_ERRORS = (ApiException, aiohttp.ClientError, TimeoutError)


# What a job's mirrors follow: spec.savepoints.snapshotObjects, the registered savepoints
# (id, path, pinned).
_Mirrored = tuple[bool, tuple[tuple[int, str, bool], ...]]


@dataclasses.dataclass
class _MirrorNames:
    """Names of a job's mirrors: those another object holds (said once, not at every
    change); the job's own as last listed or made (one gone that its controller did not
    delete was deleted by someone else, said as it is made again)."""

    blocked: set[str] = dataclasses.field(default_factory=set)
    standing: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _SaidOnce:
    """What a job's events said once, not at every change: the stops said to need no
    savepoint (a run's, its input done), and the trigger nonces said to wait for the job to
    run (by handledTriggers key, the value told)."""

    finishing: set[str] = dataclasses.field(default_factory=set)
    nonces_waiting: dict[str, int] = dataclasses.field(default_factory=dict)


class _Stop(Enum):
    DELETE = "delete"
    EXIT = "exit"


class JobController:
    def __init__(
        self,
        clients: Clients,
        body: Mapping[str, Any],
        post_event: PostEvent,
        metrics: JobMetrics,
        *,
        idle_poll_interval: float = 2.0,
        observers: Sequence[Observer] = (),
        operator_account: objects.ServiceAccount | None = None,
        user_ids: objects.UserIds = objects.UserIds.IMAGE,
        post_snapshot_event: PostObjectEvent = lambda body, kind, reason, message: None,
    ) -> None:
        self._clients = clients
        self._post_snapshot_event = post_snapshot_event
        self._operator_account = operator_account
        self._user_ids = user_ids
        self._metrics = metrics
        # By label: the snapshots completed under this controller (retention may let a
        # checkpoint go before its snapshot's status is written), and why those that failed
        # since their status was written did.
        self._snapshots_completed: dict[str, CompletedCheckpoint] = {}
        self._snapshots_failed: dict[str, str] = {}
        # Asked of the current supervisor and not answered yet (completed, failed, or given
        # up): not asked again meanwhile (its answer may come after its status write).
        self._snapshots_asked: set[str] = set()
        # What this controller wrote last of each snapshot (by uid): newer than the watch's.
        self._snapshots_written: dict[str, Mapping[str, Any]] = {}
        self._snapshot_retries: dict[str, asyncio.TimerHandle] = {}  # by uid
        # Whether a savepoint's pin may no longer be as its snapshot objects say (looked at
        # once a driver runs); the pins asked of the supervisor, not in its registry yet (one
        # at a time per savepoint: the next once its registry shows it).
        self._pins_to_check = True
        self._pins_asked: dict[int, bool] = {}
        self._snapshots_wake: asyncio.TimerHandle | None = None  # a failed write tried again
        # What the job's mirrors (spec.savepoints.snapshotObjects) were last made to follow:
        # whether they are on, and the registered savepoints; None: looked at again.
        self._mirrored: _Mirrored | None = None
        self._mirror_names = _MirrorNames()
        # What was said of a 403 on a mirror (once: tried again a minute later, or once
        # what the mirrors follow changes).
        self._mirrors_forbidden_said = False
        self._mirrors_forbidden: _Mirrored | None = None
        self._mirrors_forbidden_wake: asyncio.TimerHandle | None = None
        self._observer = Observers(  # the supervisor's
            metrics, *observers, _SnapshotCompletions(self._snapshot_completed)
        )
        self._body = body  # a live view: the handlers keep it current
        self._post_event = post_event
        self._idle_poll_interval = idle_poll_interval
        self._changed = asyncio.Event()
        self._stop: _Stop | None = None
        try:
            self._read_status(dict(body.get("status") or {}))
        except InvalidStatus:  # said by `run`, which reads the stored status again
            self._read_status({})
        self._problem: str | None = None
        self._tolerated: str | None = None  # what a newer rule refuses in an unchanged spec
        self._generation = -1  # of the spec read last; status writes do not change it
        # A spec whose driver pod the API server refused in a dry run is read again after the
        # restart policy's backoff, as a launch refused for now is: what refused it (an
        # admission policy, a namespace's Pod Security level) may change.
        self._dry_run_refusals = 0  # in a row, of this generation
        self._dry_run_again: float | None = None
        self._dry_run_wake: asyncio.TimerHandle | None = None
        self._manifest: JobManifest | None = None
        self._spec: dict[str, Any] = {}
        self._saving = asyncio.Lock()
        self._written_readiness: tuple[Readiness | None, Readiness | None] = (None, None)
        self._written_generation: int | None = None  # the observedGeneration stored last
        self._said = _SaidOnce()
        # Since when a change has waited for a driver whose query may run to answer
        # (monotonic; None while none waits), and the one wake-up that looks again.
        self._waiting_since: float | None = None
        self._recheck: asyncio.TimerHandle | None = None
        self._ended = asyncio.Event()  # `run` or `delete` returned or failed
        # Whether the job ended under this controller with nothing left for the janitor (its
        # discards done, its garbage collected): its deletion has no cleanup to do. Not so
        # for a job found ended (by another operator process, or one killed before its
        # end's cleanup was done).
        self._end_cleaned_up = False
        self._deleted = False  # the deletion's work is done
        # The redeploy nonce being carried out, its image and the attempt before its driver:
        # handled once that driver restored the image (`_note_redeployed`).
        self._redeploying: tuple[int, str, int] | None = None
        # spec.rollback: the last stable spec and the rollback's state, as this process last
        # decided them or read them from the job's annotations (written there when they
        # differ), and what it last wrote there; the annotations a write was refused for,
        # and until when they are not asked again; the one wake-up at the end of an
        # upgrade's readiness timeout.
        self._read_annotations(body["metadata"])
        self._annotations_refused: tuple[dict[str, str | None], float] | None = None
        self._no_room_for: rollback.StableSpec | None = None  # said not to fit
        self._rollback_wake: asyncio.TimerHandle | None = None

    @property
    def _namespace(self) -> str:
        return str(self._body["metadata"]["namespace"])

    @property
    def _name(self) -> str:
        return str(self._body["metadata"]["name"])

    def _read_status(self, status: dict[str, Any]) -> None:
        self._record = JobRecord.from_dict(status)
        self._conditions: list[dict[str, Any]] = list(status.get("conditions", ()))
        self._handled = dict(status.get("handledTriggers") or {})
        for pending in status.get("pending") or ():
            # In flight when the status was written: an earlier process's coordinator took
            # it with it, so the nonce is asked for again.
            key = f"{pending.get('kind')}Nonce" if isinstance(pending, dict) else ""
            if key in self._handled and pending.get("label") == f"nonce {self._handled[key]}":
                del self._handled[key]
        if not status:
            # A new job: the nonces it is created with are no change, so no request (as
            # the Flink Kubernetes Operator reads them).
            spec = self._body.get("spec") or {}
            for key, field in (
                ("checkpointNonce", "checkpointTriggerNonce"),
                ("savepointNonce", "savepointTriggerNonce"),
            ):
                if spec.get(field) is not None:
                    self._handled[key] = spec[field]
            if (nonce := _redeploy_nonce(spec)) is not None:
                self._handled[REDEPLOY_NONCE] = nonce
        self._deployed = str(status.get("deploymentHash", ""))
        self._stopped_spec = str(status.get("stoppedSpecHash", ""))
        self._stored_spec = _stored_spec(status.get("lastAcceptedSpec"))
        # As stored: a restarted operator writes no status for a generation said already.
        observed = status.get("observedGeneration")
        self._written_generation = observed if isinstance(observed, int) else None

    async def _read_stored_status(self) -> None:
        """The status as stored, not as the watch last showed it: a daemon restarted after
        an error must not resume from an older registry (an id used twice, a completed
        checkpoint forgotten)."""
        stored = await self._clients.custom_objects.get_namespaced_custom_object(
            objects.GROUP,
            objects.VERSION,
            self._namespace,
            objects.PLURAL,
            self._name,
        )
        assert isinstance(stored, dict)
        self._read_status(dict(stored.get("status") or {}))
        self._read_annotations(stored["metadata"])

    def _read_annotations(self, metadata: Mapping[str, Any]) -> None:
        annotations = metadata.get("annotations") or {}
        self._annotations_written = {
            key: annotations.get(key)
            for key in (objects.ANNOTATION_STABLE_SPEC, objects.ANNOTATION_ROLLBACK)
        }
        self._stable = rollback.StableSpec.from_annotation(
            annotations.get(objects.ANNOTATION_STABLE_SPEC)
        )
        self._rollback = rollback.RollbackState.from_annotation(
            annotations.get(objects.ANNOTATION_ROLLBACK)
        )

    def changed(self) -> None:
        """The job or one of its pods changed."""
        self._changed.set()

    def pins_changed(self) -> None:
        """A snapshot of the job was deleted, completed (maybe after its object was
        deleted) or edited once completed: a savepoint's pin may have to change (and a
        mirror deleted by hand be made again)."""
        self._pins_to_check = True
        self._mirrored = None
        self._changed.set()

    @property
    def deleting(self) -> bool:
        return self._stop is _Stop.DELETE

    def stop(self, *, deleting: bool) -> None:
        if self._stop is not _Stop.DELETE:  # a deletion is never turned into an exit
            self._stop = _Stop.DELETE if deleting else _Stop.EXIT
        self._changed.set()

    async def ended(self) -> bool:
        """Wait until ``run`` (or ``delete``) has returned or failed; return whether the
        job's deletion is done (its final savepoint, its retention policy)."""
        await self._ended.wait()
        return self._deleted

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        try:
            if not await self._readable_status():
                return
            while self._stop is None:
                # An invalid spec: the last valid one goes on for a driver that runs.
                manifest = await self._read_spec() or await self._last_valid_for_the_driver()
                if manifest is not None and await self._should_run(manifest):
                    await self._supervise(manifest)
                    continue
                await self._reconcile_snapshots(None)
                if manifest is not None:
                    self._say_nonces_wait(manifest)
                    await self._reconcile_mirrors(manifest)
                if self._record.phase in snapshots.ENDED:
                    await self._let_go_of_snapshots()
                else:
                    await self._say_deletions_wait()
                await self._wait_for_change()
            if self._stop is _Stop.DELETE:
                await self._finish_deletion()
        finally:
            self._ended.set()
            self._cancel_wakes()

    async def delete(self) -> None:
        """The job is being deleted and no ``run`` drives it (the operator was down when
        it was deleted, or its daemon had exited): what ``run`` does when stopped with
        ``deleting=True``. The recorded attempt's driver, if it still runs, is adopted and
        shut down with the final savepoint; then the job ends Cancelled and its retention
        policy applies. A job that has ended needs nothing. Safe to call again after a
        failure: it starts over from the stored status."""
        self.stop(deleting=True)
        try:
            if not await self._readable_status():
                return
            manifest = await self._read_spec() or await self._last_valid_for_the_driver()
            if manifest is not None and self._record.phase in ACTIVE_PHASES:
                driver = await self._launcher(manifest).adopt(self._record.attempt)
                if driver is not None:
                    await self._shut_down_adopted(manifest, driver)
            await self._finish_deletion()
        finally:
            self._ended.set()
            self._cancel_wakes()

    async def let_go_with_namespace(self) -> None:
        """The job's namespace is being deleted, and its Lease cannot be taken: another
        operator may still be carrying out its deletion (cut short once the job goes), so
        nothing is done to its driver or storage (no pod can be created there anyway); its
        snapshots are let go of, or their finalizers would hold the namespace too."""
        self.stop(deleting=True)
        try:
            await self._abandon_snapshots()
            self._metrics.forget()
            self._deleted = True
        finally:
            self._ended.set()
            self._cancel_wakes()

    async def _finish_deletion(self) -> None:
        """After the final savepoint (or without one): retention, then the job's directory
        on its live volume claim; then the finalizer may go."""
        await self._retire()
        manifest = self._manifest
        claim = manifest.spec.checkpointing.live_volume_claim if manifest is not None else None
        if manifest is not None and claim and self._record.attempt:
            try:
                await self._janitor(manifest).remove_live_directory()
            except CleanupFailed as error:
                # Not worth holding the deletion for: the directory is named after the job
                # object's uid, so nothing ever reads it again.
                self._on_notice(
                    Notice(
                        "LiveDirectoryLeft",
                        Level.WARNING,
                        f"{objects.live_directory(manifest, self._body)} stays on claim "
                        f"{claim}: {error}",
                    )
                )
        await self._abandon_snapshots()
        self._metrics.forget()
        self._deleted = True

    async def _readable_status(self) -> bool:
        """Read the stored status; while it cannot be read (a value written by hand: the
        operator writes none it cannot read), say so once and wait for it to change: the
        registry it holds is what garbage collection and restores go by, so nothing is
        done for the job meanwhile. A job deleted meanwhile loses its finalizer without
        its final savepoint and retention (its storage stays as it is), and so do its
        snapshots; False then."""
        said = ""
        while True:
            try:
                await self._read_stored_status()
                return True
            except InvalidStatus as error:
                problem = f"status.{error}"
            if problem != said:
                said = problem
                self._post_event(
                    "Warning",
                    "StatusUnreadable",
                    f"{problem}: the operator does not act on this job until its status "
                    "is readable (a status written by hand? restore the field, or remove "
                    "it); a deletion meanwhile leaves its storage as it is",
                )
            if self._stop is _Stop.DELETE:
                await self._abandon_snapshots()
                self._metrics.forget()
                self._deleted = True
                return False
            await self._wait_for_change()

    async def _wait_for_change(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    async def _read_spec(self) -> JobManifest | None:
        """The spec as it is run: as written, or rolled back to the last stable spec."""
        manifest = await self._validated_spec()
        if self._roll_back_if_due():
            manifest = await self._validated_spec()
        await self._write_annotations()
        return manifest

    async def _validated_spec(self) -> JobManifest | None:
        """The spec, validated again only when its generation changed. A spec in error
        is reported in status and an event, and None is returned: nothing starts for it
        (which spec a running driver keeps is `_last_valid_for_the_driver`'s call). What a
        rule refuses in a value the accepted spec already held is tolerated, as the API
        server ratchets its validation: an operator upgrade that tightens a rule neither
        stops a running job nor refuses its next change elsewhere in the spec."""
        generation = int(self._body["metadata"].get("generation", 0))
        again = self._dry_run_again is not None and time.monotonic() >= self._dry_run_again
        if generation == self._generation and not again:
            return self._manifest if self._problem is None else None
        if generation != self._generation:
            self._dry_run_refusals = 0
        self._generation = generation
        self._dry_run_again = None
        accepted = self._accepted_spec(generation)
        body = self._body_to_run()
        manifest, problem, tolerated = self._verdict(body, accepted)
        if manifest is None and body is not self._body:
            self._post_event(
                "Warning",
                "RollbackEnded",
                f"the last stable spec cannot run any more, so the spec runs as written: {problem}",
            )
            # Nor is it rolled back to again: the next spec that runs is the stable one.
            self._rollback, self._stable, body = rollback.RollbackState(), None, self._body
            manifest, problem, tolerated = self._verdict(body, accepted)
        moved = manifest and _storage_moved(manifest, accepted, self._record.coordinator)
        if moved:
            manifest, problem = None, moved
        if manifest is not None and (refused := await self._upgrade_refused(manifest, body)):
            manifest, problem = None, refused
        if manifest is not None:
            self._manifest = manifest
            self._spec = json.loads(json.dumps(dict(body["spec"])))
        verdict_changed = (problem, tolerated) != (self._problem, self._tolerated)
        if verdict_changed:
            self._problem, self._tolerated = problem, tolerated
            if problem is not None:
                self._post_event("Warning", "InvalidSpec", problem)
            elif tolerated is not None:
                self._post_event("Warning", "SpecAcceptedUnchanged", tolerated)
        # The accepted spec is stored at once: a job that is not running writes no other
        # status, and the next operator ratchets against what is stored. Every generation
        # read is said (observedGeneration): GitOps tools wait for it.
        if (
            verdict_changed
            or (manifest is not None and self._spec != self._stored_spec)
            or generation != self._written_generation
        ):
            await self._save(self._record)
        return manifest

    def _verdict(
        self, body: Mapping[str, Any], accepted: Mapping[str, Any] | None
    ) -> tuple[JobManifest | None, str | None, str | None]:
        """`_validated` of ``body``, the job as it would be run."""
        running = self._deployed if self._driver_recorded() else None
        if self._stop is _Stop.DELETE:
            # Its pods are not created again: nothing they hold keeps the deletion's work.
            running = objects.deployment_hash(body.get("spec") or {})
        return _validated(body, accepted, running, self._operator_account)

    def _cancel_wakes(self) -> None:
        """The controller ends: nothing wakes it any more."""
        self._cancel_dry_run_wake()
        self._cancel_rollback_wake()
        for wake in (self._snapshots_wake, self._mirrors_forbidden_wake):
            if wake is not None:
                wake.cancel()

    def _cancel_dry_run_wake(self) -> None:
        if self._dry_run_wake is not None:
            self._dry_run_wake.cancel()
            self._dry_run_wake = None

    def _body_to_run(self) -> Mapping[str, Any]:
        """The job as it is run: rolled back (spec.rollback), with the last stable spec
        under the written spec's followed fields, while the spec is the one rolled back
        from and asks for rollbacks; else as written (and the rollback is over)."""
        written = self._body.get("spec") or {}
        rolled_back, stable = self._rollback.rolled_back, self._stable
        if rolled_back is None:
            return self._body
        asks = (written.get("rollback") or {}).get("enabled") is True
        if (
            not asks
            or stable is None
            or rolled_back.spec_hash != rollback.rolled_back_hash(written)
        ):
            self._rollback = rollback.RollbackState()
            return self._body
        return {**self._body, "spec": rollback.spec_to_run(written, stable.spec)}

    def _roll_back_if_due(self) -> bool:
        """An upgrade whose new driver has not run its query within its readiness timeout
        (or failed for good) is rolled back: the last stable spec runs until the spec
        changes. A job suspended meanwhile is not (as in Flink), and its upgrade is over;
        nor one being deleted. Whether it was rolled back now."""
        manifest, upgrade, stable = self._manifest, self._rollback.upgrade, self._stable
        if upgrade is None or manifest is None:
            return False
        written = self._body.get("spec") or {}
        deployment = objects.deployment_hash(written)
        if (
            manifest.spec.state is JobState.SUSPENDED
            or stable is None
            or objects.deployment_hash(stable.spec) == deployment
        ):
            self._rollback = rollback.RollbackState()
            return False
        # Kept without rollbacks too: turned on later, an upgrade that did not run is rolled
        # back.
        if (
            not manifest.spec.rollback.enabled
            or self._stop is not None
            or upgrade.started is None
            or upgrade.deployment_hash != deployment
        ):
            return False  # not started yet, or a newer change: its own driver starts its timeout
        timeout = manifest.spec.rollback.readiness_timeout
        now = time.time()
        why = rollback.rollback_reason(
            phase=self._record.phase,
            message=self._record.message,
            started=upgrade.started,
            timeout=timeout,
            now=now,
        )
        if why is None:
            if self._rollback_wake is not None:
                self._rollback_wake.cancel()
            self._rollback_wake = asyncio.get_running_loop().call_later(
                max(0.0, upgrade.started + timeout - now), self._changed.set
            )
            return False
        generation = int(self._body["metadata"].get("generation", 0))
        rolled_back = rollback.RolledBack(generation, rollback.rolled_back_hash(written), now, why)
        self._rollback = rollback.RollbackState(rolled_back=rolled_back)
        self._generation = -1  # read again: as rolled back
        log.warning(
            "job %s/%s: spec generation %d is rolled back to the last stable spec: %s",
            self._namespace,
            self._name,
            generation,
            why,
        )
        self._post_event(
            "Warning",
            "RolledBack",
            f"spec generation {generation} is rolled back to the last stable spec: {why}; "
            "the spec stays as written, and its next change is an upgrade again",
        )
        return True

    def _note_upgrade(self) -> None:
        """The driver is being stopped for an upgrade: from the last stable spec, or from
        an upgrade still waiting to run (a newer change), the next driver starts its
        readiness timeout."""
        stable, upgrade = self._stable, self._rollback.upgrade
        target = objects.deployment_hash(self._spec)
        if upgrade and upgrade.deployment_hash == target:
            return
        if upgrade is not None or (
            stable is not None and objects.deployment_hash(stable.spec) == self._deployed
        ):
            self._rollback = rollback.RollbackState(upgrade=rollback.Upgrade(target))
            self._cancel_rollback_wake()

    def _start_supervising(self, manifest: JobManifest) -> None:
        """A supervisor starts: an ended job's message goes, and the first driver of an
        upgrade from the stable spec starts its readiness timeout (the upgrade's savepoint
        and stop before it may take any time), whichever spec it runs: the spec may have
        changed again while the stable driver stopped. Under a changed deployment (a fix
        after a failure, a rollback), the images restores failed on since the query last
        committed a batch past its image are restorable again
        (`JobRecord.forget_failed_restores`)."""
        if self._record.phase in (JobPhase.FAILED, JobPhase.CANCELLED):
            self._record.message = ""
        target = objects.deployment_hash(self._spec)
        changed = not self._driver_recorded() and self._deployed not in ("", target)
        if changed and (forgotten := self._record.forget_failed_restores()):
            self._post_event(
                "Normal",
                "RestorableAgain",
                "restorable again under the changed spec (its restores failed on them since "
                f"its query last committed a batch): {', '.join(forgotten)}",
            )
        upgrade, stable = self._rollback.upgrade, self._stable
        # An adopted driver (after an operator restart) is the one being stopped for it.
        if upgrade is not None and upgrade.started is None and not self._driver_recorded():
            if stable is not None and objects.deployment_hash(stable.spec) == target:
                self._rollback = rollback.RollbackState()  # changed back before it ran
            else:
                self._rollback = rollback.RollbackState(
                    upgrade=rollback.Upgrade(target, time.time())
                )

    def _note_stable(self, record: JobRecord) -> None:
        """The driver runs its query under the spec as run: that spec is stable (an
        upgrade's readiness timeout is over), kept in the job's annotation."""
        if (
            record.phase is not JobPhase.RUNNING
            or not self._spec
            or objects.deployment_hash(self._spec) != self._deployed
            or self._stop is _Stop.DELETE
        ):
            return
        if self._rollback.upgrade is not None:
            self._rollback = rollback.RollbackState()
            self._cancel_rollback_wake()
        if self._stable is not None and self._stable.spec == rollback.stable_part(self._spec):
            return
        # Too long to keep: no stable spec, rather than an older one.
        stable = rollback.StableSpec.of(self._spec)
        if stable is None or stable != self._no_room_for:
            self._stable = stable

    def _cancel_rollback_wake(self) -> None:
        if self._rollback_wake is not None:
            self._rollback_wake.cancel()
            self._rollback_wake = None

    async def _write_annotations(self) -> None:
        """The last stable spec and the rollback's state into the job's annotations where
        they are not so (also when someone else took them out: a replace, say). A stable
        spec the annotations have no room for is not kept (said once). A refused write is
        logged and tried again at the next change, at most every
        `ANNOTATIONS_RETRY_SECONDS`."""
        if self._stop is _Stop.DELETE:
            return
        present: Mapping[str, str] = self._body["metadata"].get("annotations") or {}
        wanted = {
            objects.ANNOTATION_STABLE_SPEC: None if self._stable is None else self._stable.text,
            objects.ANNOTATION_ROLLBACK: self._rollback.to_annotation(),
        }
        after = {k: v for k, v in {**present, **wanted}.items() if v is not None}
        if objects.annotation_bytes(after) > objects.MAX_ANNOTATION_BYTES and self._stable:
            self._no_room_for = self._stable
            self._stable = wanted[objects.ANNOTATION_STABLE_SPEC] = None
            self._post_event(
                "Warning",
                "RollbackUnavailable",
                "the last stable spec is not kept: the job's annotations have no room for it "
                f"(Kubernetes allows {objects.MAX_ANNOTATION_BYTES} bytes in all); an upgrade "
                "is not rolled back until a spec that fits has run",
            )
        # The watched object may not show this process's last write yet: a value back to
        # what it still shows is written too.
        changed = {
            key: value
            for key, value in wanted.items()
            if value != present.get(key) or value != self._annotations_written[key]
        }
        retry = self._annotations_refused
        if not changed or (retry and retry[0] == changed and time.monotonic() < retry[1]):
            return
        try:
            await self._clients.custom_objects.patch_namespaced_custom_object(
                objects.GROUP,
                objects.VERSION,
                self._namespace,
                objects.PLURAL,
                self._name,
                {"metadata": {"annotations": changed}},
                _content_type=MERGE_PATCH,
            )
        except API_ERRORS as error:
            self._annotations_refused = (changed, time.monotonic() + ANNOTATIONS_RETRY_SECONDS)
            log.warning(
                "job %s/%s: its rollback annotations were not written: %s",
                self._namespace,
                self._name,
                _api_error(error),
            )
            return
        self._annotations_refused = None
        self._annotations_written |= changed

    def _driver_recorded(self) -> bool:
        """The record says a driver runs (or did, before an operator restart)."""
        return self._record.phase in DRIVER_PHASES and self._record.attempt > 0

    async def _upgrade_refused(self, manifest: JobManifest, body: Mapping[str, Any]) -> str | None:
        """Why the API server refuses the pod that would replace the running driver under
        this spec (an upgrade; ``body`` the job as run), asked in a dry run before the driver
        is stopped for it: such a spec is one in error, asked about again after the restart
        policy's backoff."""
        spec = body.get("spec") or {}
        # A suspension (or deletion) replaces no driver: nothing to ask, and it must not
        # wait for an upgrade that is refused.
        replacing = manifest.spec.state is JobState.RUNNING and self._stop is not _Stop.DELETE
        if (
            not replacing
            or not self._driver_recorded()
            or objects.deployment_hash(spec) == self._deployed
        ):
            self._dry_run_refusals = 0
            return None
        refusal = await self._launcher(manifest, spec).refusal(self._record.attempt + 1)
        if refusal is None:
            self._dry_run_refusals = 0
            return None
        self._dry_run_refusals += 1
        policy = manifest.spec.restart_policy
        delay = max(BLOCKED_MIN_DELAY, restart_delay(policy, self._dry_run_refusals))
        self._dry_run_again = time.monotonic() + delay
        self._cancel_dry_run_wake()
        self._dry_run_wake = asyncio.get_running_loop().call_later(delay, self._changed.set)
        # Worded alike at each retry: a verdict that did not change is not told again.
        return (
            "the API server refuses the driver pod of this spec (asked in a dry run, again "
            f"after spec.restartPolicy's backoff): {refusal}"
        )

    async def _last_valid_for_the_driver(self) -> JobManifest | None:
        """With the spec in error, what a driver that runs goes on under: the spec last
        accepted by this process, else (after an operator restart) the one accepted before,
        from status, if the recorded driver's pod was built from it (its deployment hash):
        a status write alone never chooses what pods the operator creates. Checked as the
        spec would be, ratcheted only against what the current spec shares with it. None
        for a job without a driver to go on."""
        if not self._driver_recorded():
            return None
        if self._manifest is not None or self._stored_spec is None:
            return self._manifest
        stored = self._stored_spec
        # Its pods, which the API server may refuse, were checked below to be the driver's.
        manifest, problem, _ = _validated(
            {**self._body, "spec": stored},
            self._body.get("spec") or {},
            objects.deployment_hash(stored),
            self._operator_account,
        )
        pod = objects.driver_pod_name(self._name, self._record.attempt)
        deployed = await self._pod_deployment_hash(pod)
        if manifest is None:
            why = f"the spec accepted before cannot run either: {problem}"
        elif deployed is None:
            why = "its pod is gone"
        elif deployed != objects.deployment_hash(stored):
            why = "it was not built from the spec accepted before (status.lastAcceptedSpec)"
        else:
            self._manifest, self._spec = manifest, stored
            return manifest
        self._post_event(
            "Warning", "DriverNotAdopted", f"driver {pod} waits for a valid spec: {why}"
        )
        return None

    async def _pod_deployment_hash(self, pod: str) -> str | None:
        """The deployment hash a pod was created with; None if there is no such pod."""
        try:
            found = await self._clients.core.read_namespaced_pod(pod, self._namespace)
        except NotFoundException:
            return None
        metadata = found.metadata
        annotations = (metadata.annotations if metadata is not None else None) or {}
        return str(annotations.get(objects.ANNOTATION_SPEC_HASH, "")) or None

    def _accepted_spec(self, generation: int) -> Mapping[str, Any] | None:
        """The spec the job last ran under: accepted by this process, else as stored in
        status by an earlier one. An operator from before ``lastAcceptedSpec`` left its
        verdict in the SpecValid condition: a spec it found valid at this generation."""
        if self._spec or self._stored_spec is not None:
            return self._spec or self._stored_spec
        valid = next((c for c in self._conditions if c.get("type") == SPEC_VALID), None)
        if (
            valid
            and valid.get("status") == "True"
            and valid.get("observedGeneration") == generation
        ):
            return dict(self._body.get("spec") or {})
        return None

    async def _should_run(self, manifest: JobManifest) -> bool:
        phase = self._record.phase
        if phase is JobPhase.FINISHED:
            if (nonce := self._redeploy_due(manifest)) is not None:
                self._handled[REDEPLOY_NONCE] = nonce
                self._post_event(
                    "Warning",
                    "RedeployRefused",
                    f"spec.restore.savepointRedeployNonce {nonce}: the job is Finished (its "
                    "input is done) and does not run again; a new job with "
                    "spec.restore.initialSavepointPath runs it from that image",
                )
                await self._save(self._record)
            return False  # its input is done; a new job runs it again
        if phase in (JobPhase.FAILED, JobPhase.CANCELLED):
            # Retried when the spec is changed (beyond nonces and state), not otherwise,
            # and not while it says Suspended: the change is retried once it says Running.
            retried = (
                manifest.spec.state is not JobState.SUSPENDED
                and self._stopped_spec not in _spec_hashes(self._spec)
            )
            if retried:
                self._post_event(
                    "Normal",
                    "JobRetried",
                    f"the spec changed since the job {phase.value.lower()}: it runs again"
                    if self._rollback.rolled_back is None
                    else f"the job {phase.value.lower()}: it runs again, rolled back to the last "
                    "stable spec",
                )
            return retried
        if manifest.spec.state is JobState.SUSPENDED:
            if phase in DRIVER_PHASES and self._record.attempt:
                launcher = self._launcher(manifest)
                if await launcher.adopt(self._record.attempt) is not None:
                    return True  # a driver from before a restart: suspend it with a savepoint
                # Its driver went while no operator ran (in a restart's backoff, say): it
                # ends Suspended as a running operator ends it (restarts counted afresh, a
                # JobSuspended event, leftovers collected), once no pod of its is left.
                await launcher.remove_pods()
                self._record.message = ""
                await self._supervisor(manifest, launcher).retire(TerminalOutcome.SUSPENDED)
                return False
            if phase is not JobPhase.SUSPENDED:
                # Also a job created suspended: Pending would read as waiting to start.
                self._record.phase = JobPhase.SUSPENDED
                self._record.message = (
                    "suspended without a driver; resumes from the latest image"
                    if self._record.attempt
                    else "created suspended; starts when spec.state is Running"
                )
                await self._save(self._record)
            return False
        return True

    # ------------------------------------------------------------------ running

    def _launcher(
        self, manifest: JobManifest, spec: Mapping[str, Any] | None = None
    ) -> KubernetesLauncher:
        """The launcher of ``manifest``'s pods; ``spec`` its spec, if not the accepted."""
        return KubernetesLauncher(
            self._clients,
            manifest,
            self._body,
            _storage(manifest),
            deployed_hash=objects.deployment_hash(self._spec if spec is None else spec),
            user_ids=self._user_ids,
            report=self._on_notice,
            deleting=self._stop is _Stop.DELETE,
        )

    def _supervisor(
        self,
        manifest: JobManifest,
        launcher: DriverLauncher,
        save: Callable[[JobRecord], Awaitable[None]] | None = None,
    ) -> JobSupervisor:
        return JobSupervisor(
            config=self._coordinator_config(manifest),
            restart_policy=manifest.spec.restart_policy,
            launcher=launcher,
            janitor=self._janitor(manifest),
            restorable_check=self._restorable_check(manifest),
            save=save or self._save,
            record=self._record,
            initial_savepoint=manifest.spec.restore.initial_savepoint_path,
            report=self._on_notice,
            observer=self._observer,
            idle_poll_interval=self._idle_poll_interval,
            storage=JobStorageLayout(_storage(manifest), manifest.namespace, manifest.name),
        )

    def _coordinator_config(self, manifest: JobManifest) -> CoordinatorConfig:
        """The manifest's; but while an upgrade may be rolled back, a failure keeps the
        checkpoints (NeverRetainAfterTermination would discard what the rollback restores:
        all there is after an upgrade without a savepoint)."""
        config = manifest.coordinator_config()
        if (
            self._rollback.upgrade is None
            or not manifest.spec.rollback.enabled
            or self._stop is not None
            or config.retention_policy is not RetentionPolicy.NEVER_RETAIN_AFTER_TERMINATION
        ):
            return config
        return dataclasses.replace(config, retention_policy=RetentionPolicy.RETAIN_ON_FAILURE)

    def _janitor(self, manifest: JobManifest) -> KubernetesJanitor:
        return KubernetesJanitor(
            self._clients,
            manifest,
            self._body,
            _storage(manifest),
            self._on_notice,
            accepted=lambda: self._manifest or manifest,
            user_ids=self._user_ids,
        )

    def _restorable_check(self, manifest: JobManifest) -> KubernetesJanitor | None:
        """What checks the completed images (in check pods), if verifyRestorable."""
        return self._janitor(manifest) if manifest.spec.checkpointing.verify_restorable else None

    async def _supervise(self, manifest: JobManifest) -> None:
        self._start_supervising(manifest)
        await self._write_annotations()
        launcher = self._launcher(manifest)
        supervisor = self._supervisor(manifest, launcher)
        # A driver recorded before an operator restart: the supervisor adopts it, or finds
        # none to adopt (its pod gone while no operator ran, or stopped for a lost token).
        adopting = self._driver_recorded()
        if (nonce := self._redeploy_due(manifest)) is not None:
            await self._start_redeploy(supervisor, launcher, manifest, nonce, adopting=adopting)
        if not self._driver_recorded() or not self._deployed:
            # A recorded driver is adopted: its own hash (status.deploymentHash, then its
            # pod's) stands until then, or a status write would say it runs this spec.
            self._deployed = objects.deployment_hash(self._spec)
        # A failure is of the spec its driver ran, not of one that waits for an upgrade
        # (an adopted driver's spec, changed while no operator ran: none, so any retries).
        started_spec = self._spec_deployed() or ""
        self._snapshots_of_new_supervisor()
        running = asyncio.create_task(supervisor.run())
        requested: dict[str, float] = {}
        self._said.finishing.clear()
        changed = asyncio.create_task(self._changed.wait())
        try:
            while not running.done():
                await asyncio.wait({running, changed}, return_when=asyncio.FIRST_COMPLETED)
                if changed.done():
                    self._changed.clear()
                    changed = asyncio.create_task(self._changed.wait())
                if running.done():
                    break
                if self._stop is _Stop.EXIT:
                    await _cancel(running)  # the driver runs on; the next operator adopts it
                    return
                if self._stop is _Stop.DELETE:
                    # By the spec as it is now: spec.shutdown changed since the driver
                    # started counts (it starts no new driver), and so does a checkpoint
                    # setting edited in the deletion's Kopf batch (never followed).
                    latest = await self._read_spec() or self._manifest or manifest
                    supervisor.reconfigure(latest.coordinator_config())
                    await self._shut_down(_Shutdown(supervisor, latest), running)
                    return
                self._note_deployed(launcher, adopting=adopting)
                await self._follow_spec(
                    supervisor, requested, adopting=adopting and not launcher.adoption_answered
                )
                await self._follow_snapshots(supervisor, self._manifest or manifest)
                # Changed in place while the job runs: its driver's spec. Not once it ended
                # (stored Failed before its cleanup pods run): a change then is a retry's.
                if supervisor.outcome is None and (deployed := self._spec_deployed()):
                    started_spec = deployed
                await self._refresh_readiness()
            outcome = running.result()
        finally:
            changed.cancel()
            # An error here: never leave a second coordinator of this job behind. The
            # driver runs on and is adopted when the daemon starts again.
            await _cancel(running)
            self._end_cleaned_up = supervisor.cleaned_up
            # Not restored under this supervisor: the next one redeploys again.
            self._redeploying = None
        if outcome in (TerminalOutcome.FAILED, TerminalOutcome.CANCELLED):
            self._stopped_spec = started_spec
            await self._save(self._record)

    async def _start_redeploy(
        self,
        supervisor: JobSupervisor,
        launcher: KubernetesLauncher,
        manifest: JobManifest,
        nonce: int,
        *,
        adopting: bool,
    ) -> None:
        """A new supervisor's redeploy of ``nonce``: its first driver restores the named
        image, unless a recorded driver (``adopting``) not started for it runs: that one
        is stopped first."""
        if not adopting:
            self._redeploy(supervisor, manifest, nonce)
        elif await self._driver_redeploys(manifest):
            # Started for this redeploy before an operator restart: it goes on.
            self._redeploy(supervisor, manifest, nonce, started=True)
        elif await launcher.adopt(self._record.attempt) is None:
            # Gone while no operator ran (its pod deleted, or stopped for a lost token):
            # the next driver is the redeploy's, not one of the newest image stopped for it.
            self._redeploy(supervisor, manifest, nonce)
        else:
            self._changed.set()  # `_follow_spec` stops the driver first

    def _spec_deployed(self) -> str | None:
        """`_spec_hash` of the accepted spec if the driver runs it (changes applied in place
        included); None while it waits for an upgrade."""
        if objects.deployment_hash(self._spec) != self._deployed:
            return None
        return _spec_hash(self._spec)

    def _note_deployed(self, launcher: KubernetesLauncher, *, adopting: bool) -> None:
        """What the driver runs: the launcher's current driver's deployment. The recorded
        driver not adopted (``adopting``: after an operator restart, its pod gone while no
        operator ran, or stopped for a lost token) and no restart's backoff left, the next
        driver, started now, is of the launcher's spec: an upgrade to it needs no stop, and
        its readiness timeout (spec.rollback) starts with it. In a backoff an upgrade ends
        it at once, as for a driver that failed under this operator."""
        if launcher.current is not None:
            self._deployed = launcher.current.deployed_hash
            return
        deployed = launcher.deployed_hash
        if (
            not adopting
            or not launcher.adoption_answered
            or self._record.restart_due is not None
            or deployed == self._deployed
        ):
            return
        if deployed == objects.deployment_hash(self._spec):
            self._note_upgrade()  # against the recorded driver's deployment
            if (upgrade := self._rollback.upgrade) is not None and upgrade.started is None:
                started = rollback.Upgrade(upgrade.deployment_hash, time.time())
                self._rollback = rollback.RollbackState(upgrade=started)
        self._deployed = deployed

    async def _follow_spec(
        self, supervisor: JobSupervisor, requested: dict[str, float], *, adopting: bool = False
    ) -> None:
        """React to a changed spec while a driver runs. With the spec in error, the running
        deployment goes on under the spec accepted before, a suspension it asked for
        included, until the spec is valid again. While the recorded driver is being
        adopted (``adopting``) nothing is stopped: the stored phase may be of a driver that
        is gone, whose stop would stop the next driver, of this spec already."""
        manifest = await self._read_spec() or self._manifest
        if manifest is None:
            return
        supervisor.reconfigure(self._coordinator_config(manifest), manifest.spec.restart_policy)
        supervisor.check_restorable_with(self._restorable_check(manifest))
        running = self._record.phase is JobPhase.RUNNING
        if running:  # a nonce waits for the job to run; handled, it is never repeated
            self._request_by_nonce(supervisor, manifest, CheckpointKind.CHECKPOINT)
            self._request_by_nonce(supervisor, manifest, CheckpointKind.SAVEPOINT)
        now = time.monotonic()
        retry_after = manifest.spec.checkpointing.timeout
        redeploy = self._redeploy_due(manifest)
        if manifest.spec.state is JobState.SUSPENDED:
            stop_reason = SUSPEND
        elif redeploy is not None and self._redeploy_image(manifest, redeploy) is not None:
            stop_reason = REDEPLOY  # refused, the rest of the change goes on below
        elif objects.deployment_hash(self._spec) != self._deployed:
            stop_reason = UPGRADE if self._rollback.rolled_back is None else ROLLBACK
        else:
            self._waiting_since = None
            self._withdraw_stops(supervisor, requested)
            return
        # An upgrade of the driver that runs (not a resume while the suspended one ends).
        if stop_reason == UPGRADE and self._record.phase in ACTIVE_PHASES:
            self._note_upgrade()
            await self._write_annotations()
        if supervisor.stopping or self._held_while_adopting(adopting):
            # Stopped without a savepoint at an earlier change (the driver is going), or the
            # recorded driver's adoption has not answered yet.
            return
        if self._record.phase not in (JobPhase.PENDING, *ACTIVE_PHASES):
            # An earlier change's stop-with-savepoint completed (an upgrade's, and the spec
            # says Suspended now), or the job ended: the driver is going, and the spec
            # says what follows.
            return
        if stop_reason == REDEPLOY:
            assert redeploy is not None
            self._stop_for_redeploy(supervisor, manifest, redeploy)
            return
        if supervisor.finishing:
            # Its final checkpoint completed: the driver exits on its own, and the job ends
            # Finished (Suspended if it fails on its way out: not restarted). A savepoint
            # would be declined, and asked again at every timeout.
            if stop_reason not in self._said.finishing:
                self._said.finishing.add(stop_reason)
                self._post_event(
                    "Normal", "Stopping", f"{stop_reason}: {FINISHING_NEEDS_NO_SAVEPOINT}"
                )
            supervisor.end_suspended(_suspended_for(stop_reason))
            return
        not_running = self._record.phase in (JobPhase.DEPLOYING, JobPhase.RESTARTING)
        if not_running and manifest.spec.shutdown.final_savepoint:
            if self._awaiting_driver(supervisor, stop_reason):
                return
            # Nothing runs to take a savepoint of (starting, restoring, or failing):
            # stop now; the newest image is what it resumes from.
            self._post_event("Normal", "Stopping", f"{stop_reason}: the job is not running")
            supervisor.suspend_now(_suspended_for(stop_reason))
            return
        self._waiting_since = None
        if not manifest.spec.shutdown.final_savepoint:
            # An upgrade too (Flink's last-state upgrade mode): a job whose savepoints fail
            # can still be upgraded in one change.
            self._post_event(
                "Normal",
                "Stopping",
                f"{stop_reason}: no final savepoint (spec.shutdown.finalSavepoint is false); "
                "it resumes from the latest checkpoint",
            )
            supervisor.suspend_now(_suspended_for(stop_reason))
            return
        # One stop-with-savepoint at a time, for a suspension and an upgrade alike (the
        # upgrade's in flight suspends the job as well: the spec says Suspended once it
        # completes); asked again if it did not stop the driver (expired, or declined),
        # never while it is pending: a drain waits for the input to run out, however long.
        # What the job ends Suspended for is the change asked last, whichever savepoint's.
        supervisor.suspending_for(_suspended_for(stop_reason))
        if (
            not any(supervisor.pending(reason) for reason in (SUSPEND, UPGRADE, ROLLBACK))
            and now - requested.get(stop_reason, -retry_after) >= retry_after
        ):
            requested[stop_reason] = now
            self._post_event(
                "Normal", "Stopping", f"savepoint, then stop the driver ({stop_reason})"
            )
            after = AfterCompletion.DRAIN if manifest.spec.shutdown.drain else AfterCompletion.STOP
            supervisor.request(
                TriggerRequested(CheckpointKind.SAVEPOINT, after=after, label=stop_reason)
            )
            asyncio.get_running_loop().call_later(retry_after, self._changed.set)

    def _awaiting_driver(self, supervisor: JobSupervisor, stop_reason: str) -> bool:
        """Whether the change waits for the driver's agent to answer: its query ran and
        its agent did not answer for a moment, or an operator restart adopted the driver.
        Its savepoint is asked for once it answers (Running again); the driver is stopped
        without one once it is known not to run its query, or after the heartbeat timeout
        (a hung driver, an agent this operator cannot reach)."""
        if not supervisor.driver_may_run_query:
            self._waiting_since = None
            return False
        now, bound = time.monotonic(), supervisor.heartbeat_timeout
        if self._waiting_since is None:
            self._waiting_since = now
            self._post_event(
                "Normal",
                "Stopping",
                f"{stop_reason}: waiting up to {bound:.0f}s for the driver's agent to answer, "
                "then a savepoint",
            )
        elif now - self._waiting_since >= bound:
            self._waiting_since = None
            self._post_event(
                "Warning",
                "Stopping",
                f"{stop_reason}: the driver's agent did not answer in {bound:.0f}s; stopping "
                "the driver without a savepoint (it resumes from the newest image)",
            )
            return False
        self._recheck_soon()
        return True

    def _held_while_adopting(self, adopting: bool) -> bool:
        """Whether the change waits for the recorded driver's adoption (after an operator
        restart): its stored phase may be of a driver that is gone, and a stop now would
        stop the next one, of this spec already. Followed again in a moment."""
        if adopting:
            self._recheck_soon()
        return adopting

    def _recheck_soon(self) -> None:
        """The spec is followed again in a moment, whatever changes."""
        if self._recheck is not None:
            self._recheck.cancel()
        self._recheck = asyncio.get_running_loop().call_later(
            SPEC_RECHECK_SECONDS, self._changed.set
        )

    def _withdraw_stops(self, supervisor: JobSupervisor, requested: dict[str, float]) -> None:
        """A suspension or an upgrade taken back: the savepoint that would stop the driver
        is withdrawn. A drain waits for the input to run out, however long, and holds
        periodic checkpoints meanwhile; a savepoint would stop the driver for nothing."""
        for reason in (SUSPEND, UPGRADE, ROLLBACK):
            # Once per request: this runs at every change, and the withdrawal is carried out
            # after the request (the supervisor's inbox is in order), even one not yet taken.
            if requested.pop(reason, None) is None:
                continue
            supervisor.withdraw(reason)
            self._post_event(
                "Normal",
                "StopWithdrawn",
                f"the spec no longer asks to {reason}: a savepoint for it still in flight is "
                "withdrawn",
            )

    def _say_nonces_wait(self, manifest: JobManifest) -> None:
        """A trigger nonce changed while the job does not run waits for it to run (as in
        Flink): said once per value (read while its driver stopped, too), or the request
        looked lost; nothing is taken for a Finished job, which does not run again."""
        for kind in (CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT):
            nonce = _trigger_nonce(manifest, kind)
            key = f"{kind.value}Nonce"
            if nonce is None or nonce in (
                self._handled.get(key),
                self._said.nonces_waiting.get(key),
            ):
                continue
            self._said.nonces_waiting[key] = nonce
            phase = self._record.phase
            self._post_event(
                "Normal",
                "TriggerWaiting",
                f"spec.{kind.value}TriggerNonce {nonce}: the job is {phase.value}"
                + (
                    f" and does not run again: no {kind.value} is taken"
                    if phase is JobPhase.FINISHED
                    else f"; its {kind.value} is taken once it runs"
                ),
            )

    def _request_by_nonce(
        self, supervisor: JobSupervisor, manifest: JobManifest, kind: CheckpointKind
    ) -> None:
        nonce = _trigger_nonce(manifest, kind)
        key = f"{kind.value}Nonce"
        if nonce is None or self._handled.get(key) == nonce:
            return
        self._handled[key] = nonce
        supervisor.request(TriggerRequested(kind, label=f"nonce {nonce}"))

    def _redeploy_due(self, manifest: JobManifest) -> int | None:
        """The redeploy nonce not carried out yet; None if there is none (removing it
        redeploys nothing, as in Flink)."""
        nonce = manifest.spec.restore.savepoint_redeploy_nonce
        if nonce is None or self._handled.get(REDEPLOY_NONCE) == nonce:
            return None
        return None if self._redeploying and self._redeploying[0] == nonce else nonce

    def _redeploy_target(self, manifest: JobManifest) -> ChosenImage:
        """The image spec.restore.initialSavepointPath names, by the job's registry (the
        operator reads no storage: the driver verifies it as it restores it). Raises
        UnknownImage for one the job cannot restore."""
        path = manifest.spec.restore.initial_savepoint_path
        assert path is not None  # the CRD's rule: the nonce needs it
        uri = snapshot_uri(path)
        try:
            address = parse_snapshot_address(uri)
        except ValueError as error:
            raise UnknownImage(f"{path}: {error}") from None
        own = JobStorageLayout(_storage(manifest), manifest.namespace, manifest.name)
        is_own = storage_place(address.layout.job_root) == storage_place(own.job_root)
        registry = self._record.coordinator
        kind, snapshot_id = address.kind, address.snapshot_id
        listed = registry.checkpoints if kind is CheckpointKind.CHECKPOINT else registry.savepoints
        # An image of the job's storage its registry does not list, which the record says
        # it let go or never took (the driver, stopped for it, would fail the job on a
        # missing image); else a savepoint is another registry's, kept there.
        if is_own and snapshot_id not in {image.checkpoint_id for image in listed}:
            key = (kind, snapshot_id)
            due = any(discard.key == key for discard in self._record.discards_due)
            if (gone := LET_GO[kind] if due else why_gone(registry, *key)) is not None:
                raise UnknownImage(f"{path}: {kind.value} {snapshot_id} {gone}")
        return image_at(uri, address, registry, own=is_own)

    def _redeploy_image(self, manifest: JobManifest, nonce: int) -> ChosenImage | None:
        """The image of the redeploy `nonce` asks for; None, said in an event and the nonce
        handled, if the job cannot restore it (the job goes on as it is)."""
        try:
            return self._redeploy_target(manifest)
        except UnknownImage as error:
            self._handled[REDEPLOY_NONCE] = nonce
            self._post_event(
                "Warning",
                "RedeployRefused",
                f"spec.restore.savepointRedeployNonce {nonce}: {error}; the job goes on as it is",
            )
            return None

    def _stop_for_redeploy(
        self, supervisor: JobSupervisor, manifest: JobManifest, nonce: int
    ) -> None:
        """Stop the driver without a savepoint (its newer state is what the redeploy
        leaves): the job ends Suspended, and `_supervise` starts the next driver from the
        redeploy's image."""
        self._post_event(
            "Normal",
            "Stopping",
            f"{REDEPLOY} (spec.restore.savepointRedeployNonce {nonce}): no savepoint; the "
            f"next driver restores {manifest.spec.restore.initial_savepoint_path}",
        )
        supervisor.suspend_now(
            f"{_suspended_for(REDEPLOY)} (spec.restore.savepointRedeployNonce {nonce})"
        )

    async def _driver_redeploys(self, manifest: JobManifest) -> bool:
        """Whether the recorded driver was started to restore the redeploy's image, and
        only it, and has not restored yet (by an operator killed before it restored: one
        that restored that image for an earlier nonce is no redeploy of this one). Its
        pod is asked of the API server: the watch may not have listed it yet."""
        if self._record.restored_from is not None:
            return False
        try:
            image = self._redeploy_target(manifest)
            pod = await self._clients.core.read_namespaced_pod(
                objects.driver_pod_name(self._name, self._record.attempt), self._namespace
            )
        except (UnknownImage, NotFoundException):
            return False
        body = self._clients.api.sanitize_for_serialization(pod)
        return driver_restore_candidates(body) == [image.candidate]

    def _redeploy(
        self,
        supervisor: JobSupervisor,
        manifest: JobManifest,
        nonce: int,
        *,
        started: bool = False,
    ) -> None:
        """The next driver restores the redeploy's image, and only it, until an image of
        its own completes; the newer images are set aside once it restores, and the nonce
        is handled then (`_note_redeployed`): an operator restart before that redeploys
        again, unless the driver it finds was ``started`` for it."""
        image = self._redeploy_image(manifest, nonce)
        if image is None:
            return
        withdrawn = supervisor.restore_from(image.candidate, stored_as=image.own)
        attempt = self._record.attempt - 1 if started else self._record.attempt
        self._redeploying = (nonce, image.candidate, attempt)
        if started:
            return  # said as it was started
        newer = supervisor.passed_over
        instead = f" instead of the newest image, {newer[0]}" if newer else ""
        kept = (
            f"; {withdrawn.describe()} was due for deletion: restored from, it stays in storage"
            if withdrawn is not None
            else ""
        )
        self._post_event(
            "Normal",
            "Redeploying",
            f"spec.restore.savepointRedeployNonce {nonce}: the next driver restores "
            f"{image.candidate}{instead}{kept}",
        )

    def _note_redeployed(self, record: JobRecord) -> None:
        """The redeploy's nonce is handled once a driver after it restored its image."""
        if self._redeploying is None:
            return
        nonce, image, attempt = self._redeploying
        restored = record.restored_from
        if record.attempt > attempt and restored and restored.candidate.encode() == image:
            self._handled[REDEPLOY_NONCE] = nonce
            self._redeploying = None

    async def _shut_down_adopted(self, manifest: JobManifest, driver: KubernetesDriver) -> None:
        """A deleted job's driver, adopted: shut down as the daemon shuts down its own.
        Its supervisor starts Deploying and is Running once the agent answers: only then
        can the final savepoint be taken, so the shutdown is asked for at the first status
        it saves with another phase. Within that save, not later: after a Restarting one
        the supervisor would start a new driver once its backoff is over; shut down before
        then, it ends the job Cancelled instead."""
        shutdown: _Shutdown | None = None

        async def save(record: JobRecord) -> None:
            await self._save(record)
            if record.phase is not JobPhase.DEPLOYING and shutdown is not None:
                shutdown.request()

        supervisor = self._supervisor(manifest, _AdoptedDriver(driver), save)
        shutdown = _Shutdown(supervisor, manifest, wait_for_running=True)
        self._deployed = driver.deployed_hash
        running = asyncio.create_task(supervisor.run())
        try:
            await self._shut_down(shutdown, running)
        finally:
            await _cancel(running)  # after an error: never a coordinator left behind
            self._end_cleaned_up = supervisor.cleaned_up  # as `_supervise` does

    async def _shut_down(
        self, shutdown: "_Shutdown", running: "asyncio.Task[TerminalOutcome]"
    ) -> None:
        """The job is being deleted: the final savepoint if the spec asks for one (and the
        driver runs), then the supervisor ends the job Cancelled. Cancelled without a
        savepoint if it does not complete in the checkpoint timeout + 60 s. A driver
        adopted for the deletion is first given as long to answer (to be Running)."""
        grace = shutdown.grace
        if shutdown.wait_for_running:
            requested = asyncio.ensure_future(shutdown.requested.wait())
            try:
                await asyncio.wait(
                    {running, requested}, timeout=grace, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                requested.cancel()
            if running.done():
                # Failed (raised here): a supervisor that failed must not stop the driver
                # (its next try adopts it again); one that ended needs nothing more.
                await running
                return
            if not shutdown.requested.is_set() and shutdown.final_savepoint:
                self._post_event(
                    "Warning",
                    "FinalSavepointTimedOut",
                    f"the adopted driver did not answer in {grace:.0f}s: no final savepoint",
                )
        elif shutdown.final_savepoint:
            await self._until_driver_answers(shutdown.supervisor, running)
        shutdown.request()
        done, _ = await asyncio.wait({running}, timeout=grace)
        # Not once the job ended: its end's cleanup pods have their own time limit, and a
        # deleted job's garbage left in storage has no next run to collect it.
        if not done and shutdown.supervisor.outcome is None:
            self._post_event(
                "Warning", "FinalSavepointTimedOut", f"no final savepoint in {grace:.0f}s"
            )
            shutdown.supervisor.cancel()
        await running

    async def _until_driver_answers(
        self, supervisor: JobSupervisor, running: "asyncio.Task[TerminalOutcome]"
    ) -> None:
        """A final savepoint waits, as a change's does (`_awaiting_driver`), while the job
        is Deploying but its driver's query may run (its agent did not answer for a moment),
        up to the heartbeat timeout: asked then, it was declined and the job cancelled."""
        deadline = time.monotonic() + supervisor.heartbeat_timeout
        while (
            self._record.phase is JobPhase.DEPLOYING
            and supervisor.driver_may_run_query
            and time.monotonic() < deadline
            and not running.done()
        ):
            await asyncio.sleep(SPEC_RECHECK_SECONDS)

    async def _retire(self) -> None:
        """Deleted with no supervisor running: a job that has not ended (suspended, or
        its driver gone) is cancelled now, so its retention policy applies, once any pod
        of its own left behind is gone; a job that ended was cleaned up then, unless that
        cleanup left work (a discard failed) or was another operator's (found ended): its
        discards due are done, and what no registry lists is collected again; one that
        never started has nothing in storage."""
        manifest = self._manifest
        if manifest is None or not self._record.attempt:
            return
        launcher = self._launcher(manifest)
        if self._record.phase in ENDED_PHASES and self._end_cleaned_up:
            return
        # A driver still terminating, or a cleanup pod a killed operator left, must never
        # write while a cleanup pod of this one's works.
        await launcher.remove_pods()
        if self._record.phase in ENDED_PHASES:
            # Its end's discards follow the status write that ended it: an operator killed
            # in between left checkpoints no registry lists (and a storage directory owned
            # by a job that is gone). They go now.
            await self._supervisor(manifest, launcher).collect_leftovers(deleting=True)
            return
        said = ["the job was deleted"]
        if self._record.phase in ACTIVE_PHASES and manifest.spec.shutdown.final_savepoint:
            said.append("no final savepoint could be taken")  # its driver was gone
        restorable = [
            savepoint
            for savepoint in self._record.coordinator.savepoints
            if not self._record.is_unrestorable(CheckpointKind.SAVEPOINT, savepoint.checkpoint_id)
        ]
        if restorable:
            # What a new job starts from (spec.restore.initialSavepointPath), as the final
            # savepoint of a running job's deletion is named.
            newest = max(restorable, key=lambda savepoint: savepoint.checkpoint_id)
            said.append(f"its newest savepoint {newest.checkpoint_id} is at {newest.path}")
        self._record.message = "; ".join(said)
        await self._supervisor(manifest, launcher).retire(TerminalOutcome.CANCELLED)

    # ------------------------------------------------------------------ status

    def _on_notice(self, notice: Notice) -> None:
        message = notice.message
        if snapshots.is_snapshot_label(notice.label) and notice.label not in message:
            message = f"{message} ({notice.label})"  # which snapshot failed, say
        if snapshots.is_snapshot_label(notice.label) and notice.reason == NOT_DISPOSED:
            message += (
                ": not disposed of at its deletion, but handed to the savepoint history "
                "(`spark-checkpoint savepoint --dispose` disposes of it once it may be)"
            )
        log.log(
            logging.WARNING if notice.level is Level.WARNING else logging.INFO,
            "%s/%s: %s",
            self._namespace,
            self._name,
            message,
        )
        is_snapshots = snapshots.is_snapshot_label(notice.label)
        if notice.level is not Level.DETAIL or (is_snapshots and notice.reason in DISPOSALS):
            kind = "Warning" if notice.level is Level.WARNING else "Normal"
            self._post_event(kind, notice.reason, message, notice.label)
        answer = snapshots.answer(notice.reason, notice.cause)
        if snapshots.is_snapshot_label(notice.label) and answer is not None:
            # Its answer: asked again (or counted as failed) only once it is known.
            self._snapshots_asked.discard(notice.label)
            if answer is snapshots.Answer.FAILED:
                self._snapshots_failed[notice.label] = notice.message
            self._changed.set()

    def _snapshot_completed(self, checkpoint: CompletedCheckpoint) -> None:
        if snapshots.is_snapshot_label(checkpoint.label):
            self._snapshots_completed[checkpoint.label] = checkpoint
            self._snapshots_asked.discard(checkpoint.label)
            self.pins_changed()

    async def _reconcile_snapshots(
        self, supervisor: JobSupervisor | None, manifest: JobManifest | None = None
    ) -> None:
        """Each open SparkCheckpointSnapshot of the job: its next status recorded, and its
        savepoint or checkpoint asked for when the job runs (`snapshots.decide`), once its
        status says so (a snapshot whose object is gone is asked for nothing); an existing
        savepoint it names is pinned before its status says so (``manifest``: the job's
        storage, where it is)."""
        bodies = self._clients.snapshots.of(self._namespace, self._name)
        self._forget_snapshots_but({body["metadata"]["uid"] for body in bodies})
        for body in bodies:
            uid = body["metadata"]["uid"]
            watched = body.get("status") or {}
            if (written := self._snapshots_written.get(uid)) == watched:
                del self._snapshots_written[uid]  # the watch shows this controller's write
            snapshot = snapshots.Snapshot.from_body({**body, "status": written or watched})
            if not snapshot.open:
                continue
            label = snapshot.label
            in_flight = {}
            if supervisor is not None and (
                supervisor.pending(label) or label in self._snapshots_asked
            ):
                in_flight[label] = supervisor.triggered_id(label)
            # As they are now: the writes before this one's took time, and a completion
            # meanwhile ends a request as it is asked (its label no longer in flight).
            registry = self._record.coordinator
            completed = {
                image.label: image
                for image in (*registry.checkpoints, *registry.savepoints)
                if snapshots.is_snapshot_label(image.label)
            } | self._snapshots_completed
            # As its coordinator sees the job: a driver finishing its input takes no more
            # (the job is Finished then), and none attached takes none yet.
            phase = self._record.phase if supervisor is None else supervisor.coordinator_phase
            view = snapshots.JobView(phase, completed, in_flight, self._snapshots_failed)
            if snapshot.existing_path is not None and supervisor is not None:
                assert manifest is not None  # given with the supervisor
                existing = self._existing_savepoint(manifest, snapshot.existing_path)
                if not isinstance(existing, str) and existing.checkpoint_id in self._pins_asked:
                    # A release (and disposal) may be queued: its outcome first.
                    existing = dataclasses.replace(existing, pinned=False)
                view.existing = existing
            now = time.time()
            decision = snapshots.decide(snapshot, view, now)
            if decision.trigger and supervisor is None:
                continue  # asked for once a driver runs
            pin = decision.pin
            if (
                pin is not None
                and supervisor is not None
                and pin.checkpoint_id not in self._pins_asked
            ):
                self._ask_pin(supervisor, pin.checkpoint_id, pinned=True)
            if decision.wake_at is not None:
                if (retry := self._snapshot_retries.get(uid)) is not None:
                    retry.cancel()
                self._snapshot_retries[uid] = asyncio.get_running_loop().call_later(
                    max(0.0, decision.wake_at - now), self._changed.set
                )
            if not await write_snapshot_status(self._clients, snapshot, decision.status):
                continue
            self._snapshots_written[uid] = decision.status
            if decision.trigger and supervisor is not None:
                supervisor.request(TriggerRequested(snapshot.kind, label=label, pinned=True))
                self._snapshots_asked.add(label)
            if decision.status.get("failures") != snapshot.status.get("failures", 0):
                self._snapshots_failed.pop(label, None)  # counted
            if decision.status.get("state") in snapshots.FINAL_STATES:
                self._snapshots_failed.pop(label, None)
                self._snapshots_completed.pop(label, None)
            if (said := snapshots.event(snapshot.status, decision.status)) is not None:
                self._post_snapshot_event(body, *said)

    def _snapshots_of_new_supervisor(self) -> None:
        """What was asked of an earlier supervisor (requests, releases) went with its
        inbox: nothing is in flight, and every pin is looked at again."""
        self._snapshots_asked.clear()
        self._pins_asked.clear()
        self._pins_to_check = True

    async def _follow_snapshots(self, supervisor: JobSupervisor, manifest: JobManifest) -> None:
        await self._reconcile_snapshots(supervisor, manifest)
        await self._reconcile_pins(supervisor, manifest)
        await self._reconcile_mirrors(manifest)

    def _forget_snapshots_but(self, uids: set[str]) -> None:
        """What this controller keeps of snapshots whose objects are gone."""
        for uid in set(self._snapshots_written) - uids:
            del self._snapshots_written[uid]
        for uid in set(self._snapshot_retries) - uids:
            self._snapshot_retries.pop(uid).cancel()

    async def _abandon_snapshots(self) -> None:
        """The job is deleted: its open snapshots are abandoned (a job created later under
        its name is another job), and none is held. By the API server's list: the watch's
        view may not have them yet (a deletion handled at an operator's start). Tried
        again a few times while the API server does not answer (nothing runs for the job
        afterwards: a snapshot left held waits for an operator's restart)."""
        for tries in range(DELETED_JOB_SNAPSHOT_TRIES, 0, -1):
            if await self._abandoned_snapshots() or tries == 1:
                return
            await asyncio.sleep(SNAPSHOT_RETRY_SECONDS)

    async def _abandoned_snapshots(self) -> bool:
        """`_abandon_snapshots` once; whether every write was made."""
        if (listed := await self._listed_snapshots()) is None:
            return False
        done = True
        for body in listed:
            snapshot = snapshots.Snapshot.from_body(body)
            if snapshot.mirror and snapshot.owner == self._body["metadata"]["uid"]:
                if snapshot.held:  # a finalizer put on by hand: it goes with the job
                    done &= await hold_snapshot(self._clients, snapshot, held=False)
                continue
            if snapshot.job != self._name or snapshot.mirror:
                continue
            if snapshot.held:  # nothing runs to dispose of its savepoint: kept in storage
                done &= await self._let_go(body, f"SparkCheckpointJob {self._name} was deleted")
            if not snapshot.open or snapshot.deleting:  # one deleted goes without a word
                continue
            status = snapshots.for_deleted_job(snapshot)
            if not await write_snapshot_status(self._clients, snapshot, status):
                done = False
            elif said := snapshots.event(snapshot.status, status):
                self._post_snapshot_event(body, *said)
        return done

    async def _let_go_of_snapshots(self) -> None:
        """The job ended: no driver runs to dispose of a savepoint, so its snapshots are not
        held (one deleted goes at once; its savepoint stays in storage, as the job's
        others). Held again should the job run again."""
        watched = self._clients.snapshots.of(self._namespace, self._name)
        if not any(snapshots.Snapshot.from_body(body).held for body in watched):
            return
        phase = self._record.phase.value
        if (listed := await self._listed_snapshots()) is None:
            self._try_snapshots_again()
            return
        for body in listed:
            snapshot = snapshots.Snapshot.from_body(body)
            if snapshot.job != self._name or not snapshot.held:
                continue
            if not await self._let_go(body, f"the job is {phase}: nothing runs to dispose of it"):
                self._try_snapshots_again()

    def _try_snapshots_again(self) -> None:
        """A snapshot write or list the API server did not answer is tried again soon, though
        nothing else changes."""
        if self._snapshots_wake is None:
            self._snapshots_wake = asyncio.get_running_loop().call_later(
                SNAPSHOT_RETRY_SECONDS, self._snapshots_woken
            )

    def _snapshots_woken(self) -> None:
        self._snapshots_wake = None
        self._changed.set()

    async def _let_go(self, body: Mapping[str, Any], why: str) -> bool:
        """Take the finalizer away (whether it went); a deletion that would have disposed
        of the savepoint says why it did not."""
        snapshot = snapshots.Snapshot.from_body(body)
        if not await hold_snapshot(self._clients, snapshot, held=False):
            return False
        if snapshot.deleting and snapshot.state is snapshots.SnapshotState.COMPLETED:
            said = f"savepoint {snapshot.status.get('id')} is not disposed of: {why}"
            self._post_snapshot_event(
                body, "Normal", "SnapshotKept", f"{said}; it stays in storage"
            )
        return True

    async def _say_deletions_wait(self) -> None:
        """A deleted snapshot whose savepoint waits for a driver to dispose of it (or to
        release it: one that says disposeOnDelete false keeps it from the others deleted with
        it) says so (`kubectl delete` waits meanwhile); one that stands for no savepoint
        (failed, abandoned, never taken) has nothing to wait for."""
        phase = self._record.phase.value
        for body in self._clients.snapshots.of(self._namespace, self._name):
            written = self._snapshots_written.get(body["metadata"]["uid"])
            snapshot = snapshots.Snapshot.from_body(
                {**body, "status": written or body.get("status")}
            )
            if not (snapshot.deleting and snapshot.held):
                continue
            if snapshot.open:
                # Its status first (`_reconcile_snapshots`: completed, or abandoned): a
                # COMPLETED one disposes of its savepoint, or keeps it from the others.
                self._try_snapshots_again()
                continue
            if (
                snapshot.state is not snapshots.SnapshotState.COMPLETED
                or snapshot.kind is not CheckpointKind.SAVEPOINT
            ):
                if not await hold_snapshot(self._clients, snapshot, held=False):
                    self._try_snapshots_again()
                continue
            then = (
                "dispose of its savepoint"
                if snapshot.dispose_on_delete
                else "hand its savepoint to the savepoint history"
            )
            waits = f"its deletion waits for the job to run (phase {phase}) to {then}"
            if snapshot.status.get("message") != waits:
                await write_snapshot_status(
                    self._clients, snapshot, {**snapshot.status, "message": waits}
                )

    async def _listed_snapshots(self) -> list[dict[str, Any]] | None:
        """The SparkCheckpointSnapshots in the job's namespace as the API server lists them;
        None, logged, if it could not be asked. A 404 too: the CRD gone, or only this
        version no longer served (the objects live on): no pin is released for it."""
        listed: Any
        try:
            listed = await self._clients.custom_objects.list_namespaced_custom_object(
                objects.GROUP, objects.VERSION, self._namespace, objects.SNAPSHOT_PLURAL
            )
        except API_ERRORS as error:
            log.warning(
                "%s/%s: its SparkCheckpointSnapshots could not be listed: %s",
                self._namespace,
                self._name,
                _api_error(error),
            )
            return None
        items: list[dict[str, Any]] = listed["items"]
        return items

    async def _reconcile_pins(self, supervisor: JobSupervisor, manifest: JobManifest) -> None:
        """Each registered savepoint pinned while a SparkCheckpointSnapshot of the job stands
        for it, released once none does, disposed of as its last one is deleted
        (`snapshots.plan_pins`); those whose deletion disposes held by `snapshots.FINALIZER`
        until then. By the API server's list, not the watch's view (incomplete at a start,
        and a watch listed again after a gap reports no deletion)."""
        if not self._pins_to_check or self._record.phase is not JobPhase.RUNNING:
            return
        registered = {s.checkpoint_id: s for s in self._record.coordinator.savepoints}
        # An ask the registry shows is done; one for a savepoint gone went with it.
        self._pins_asked = {
            sid: pinned
            for sid, pinned in self._pins_asked.items()
            if sid in registered and registered[sid].pinned != pinned
        }
        if not any(s.pinned for s in registered.values()) and not self._clients.snapshots.of(
            self._namespace, self._name
        ):
            self._pins_to_check = False
            return
        # Cleared before the awaits: a change meanwhile sets it again.
        self._pins_to_check = False
        if (listed := await self._listed_snapshots()) is None:
            self._pins_to_check = True
            self._try_snapshots_again()
            return
        savepoints = self._record.coordinator.savepoints  # as they are now: the list took time
        plan = snapshots.plan_pins(
            self._name,
            [snapshots.Snapshot.from_body(body) for body in listed],
            savepoints,
            existing=lambda path: self._existing_savepoint(manifest, path),
            in_flight=lambda label: supervisor.pending(label) or label in self._snapshots_asked,
            outstanding=set(self._pins_asked),
        )
        for savepoint_id, label in plan.dispose.items():
            supervisor.dispose(savepoint_id, label)  # before its release: the inbox keeps order
        for savepoint_id in plan.pin:
            self._ask_pin(supervisor, savepoint_id, pinned=True)
        for savepoint in (s for s in savepoints if s.checkpoint_id in plan.release):
            self._ask_pin(supervisor, savepoint.checkpoint_id, pinned=False)
            then = (
                "disposed of (spec.savepoint.disposeOnDelete), unless it is the job's newest image"
                if savepoint.checkpoint_id in plan.dispose
                else "the savepoint history's limits apply to it"
            )
            self._post_event(
                "Normal",
                "SavepointReleased",
                f"savepoint {savepoint.checkpoint_id} ({savepoint.label}) is no longer kept: "
                f"no SparkCheckpointSnapshot stands for it any more; {then}",
            )
        held = [await hold_snapshot(self._clients, s, held=True) for s in plan.hold]
        held += [await hold_snapshot(self._clients, s, held=False) for s in plan.let_go]
        # Looked at again until every ask shows in the registry (its status write is a
        # change) and every hold is written (tried again soon).
        if self._pins_asked or not all(held):
            self._pins_to_check = True
        if not all(held):
            self._try_snapshots_again()

    async def _reconcile_mirrors(self, manifest: JobManifest) -> None:
        """A SparkCheckpointSnapshot for each savepoint in the history that no snapshot
        object keeps while spec.savepoints.snapshotObjects (`snapshots.plan_mirrors`): made
        (and its status written) as the savepoint registers or is released, deleted as the
        history lets it go or an object keeps it, all deleted once turned off. By the API
        server's list (a watch gap reports no deletion); looked at when the registry's
        savepoints or the job's snapshots change; not while the job is being deleted (its
        mirrors go with it)."""
        enabled = manifest.spec.savepoints.snapshot_objects
        registered = self._record.coordinator.savepoints
        following = (enabled, tuple((s.checkpoint_id, s.path, s.pinned) for s in registered))
        deleted = bool(self._body["metadata"].get("deletionTimestamp"))
        if deleted or following in (self._mirrored, self._mirrors_forbidden):
            return
        # Set before the awaits: a change meanwhile clears it.
        self._mirrored = following
        watched = self._clients.snapshots.of(self._namespace, self._name)
        if not enabled and not any(snapshots.Snapshot.from_body(b).mirror for b in watched):
            return
        if (listed := await self._listed_snapshots()) is None:
            self._mirror_again()
            return
        listed_snapshots = [snapshots.Snapshot.from_body(body) for body in listed]
        plan = snapshots.plan_mirrors(
            self._body, listed_snapshots, self._record.coordinator.savepoints, enabled=enabled
        )
        uid = self._body["metadata"].get("uid")
        deleted_by_hand = {
            savepoint.checkpoint_id
            for savepoint in plan.create
            if snapshots.mirror_name(self._name, savepoint.checkpoint_id)
            in self._mirror_names.standing
        }
        # One being deleted stands only if it stood: this controller forgets its own.
        self._mirror_names.standing = {
            s.name
            for s in listed_snapshots
            if s.mirror
            and s.owner == uid
            and (not s.deleting or s.name in self._mirror_names.standing)
        }
        self._mirror_names.blocked &= set(plan.blocked)  # said again if taken again
        for name, savepoint in plan.blocked.items():
            if name not in self._mirror_names.blocked:
                self._mirror_names.blocked.add(name)
                self._post_event(
                    "Warning",
                    "SavepointNotMirrored",
                    f"savepoint {savepoint.checkpoint_id} ({savepoint.label}) has no "
                    f"SparkCheckpointSnapshot: the name {name} is another object's "
                    "(spec.savepoints.snapshotObjects)",
                )
        for savepoint in plan.create:
            if self._mirrors_forbidden == following:
                break
            if (body := await self._create_mirror(savepoint, following)) is not None:
                self._mirror_names.standing.add(body["metadata"]["name"])
                if savepoint.checkpoint_id in deleted_by_hand:
                    self._post_event(
                        "Warning",
                        "SnapshotReplaced",
                        f"SparkCheckpointSnapshot {body['metadata']['name']} was deleted: the "
                        f"operator's mirror of savepoint {savepoint.checkpoint_id}, which the "
                        "history keeps, it is made again, and its deletion disposed of "
                        "nothing; to dispose of the savepoint, name it in an object of your "
                        "own (savepoint.alreadyExists, disposeOnDelete: true) and delete that",
                    )
                plan.complete.append((snapshots.Snapshot.from_body(body), savepoint))
                self._post_snapshot_event(
                    body,
                    "Normal",
                    "SnapshotCompleted",
                    f"savepoint {savepoint.checkpoint_id} ({savepoint.label}) completed: "
                    f"{savepoint.path}",
                )
        for snapshot, savepoint in plan.complete:
            status = snapshots.mirror_status(self._name, savepoint)
            if not await write_snapshot_status(self._clients, snapshot, status):
                self._mirror_again()
        for snapshot in plan.replace:
            self._post_event(
                "Warning",
                "SnapshotReplaced",
                f"SparkCheckpointSnapshot {snapshot.name} was edited: the operator's mirror "
                "of a savepoint in the history, it is made again as it was; to keep the "
                "savepoint, or to say what its deletion does, create an object of your own "
                "under another name (savepoint.alreadyExists)",
            )
        for snapshot in plan.delete + plan.replace:
            if self._mirrors_forbidden != following:
                await self._delete_mirror(snapshot, following)
        for snapshot in plan.let_go:
            if not await hold_snapshot(self._clients, snapshot, held=False):
                self._mirror_again()

    def _mirror_again(self) -> None:
        """Look at the mirrors again soon."""
        self._mirrored = None
        self._try_snapshots_again()

    def _mirror_failed(self, error: Exception, what: str, following: _Mirrored) -> None:
        """A mirror's create or delete failed: tried again soon; but not when the role
        forbids it (one from before the mirrors), said once, on the job: then once the
        registry's savepoints change. A name taken meanwhile: at the next change."""
        status = error.status if isinstance(error, ApiException) else None
        if status == HTTPStatus.FORBIDDEN:
            if not self._mirrors_forbidden_said:
                self._mirrors_forbidden_said = True
                self._post_event(
                    "Warning",
                    "SavepointNotMirrored",
                    f"a SparkCheckpointSnapshot could not be {what}d "
                    f"(spec.savepoints.snapshotObjects): {_api_error(error)}; the operator's "
                    "role needs create and delete on sparkcheckpointsnapshots (the chart "
                    "grants them); asked again every minute",
                )
            self._mirrors_forbidden = following
            if self._mirrors_forbidden_wake is None:
                self._mirrors_forbidden_wake = asyncio.get_running_loop().call_later(
                    MIRROR_FORBIDDEN_RETRY_SECONDS, self._mirrors_allowed_again
                )
        else:  # a name taken meanwhile too: then listed as another's
            self._mirror_again()

    def _mirrors_allowed_again(self) -> None:
        self._mirrors_forbidden = self._mirrors_forbidden_wake = None
        self._mirror_again()

    async def _create_mirror(
        self, savepoint: CompletedCheckpoint, following: _Mirrored
    ) -> dict[str, Any] | None:
        """The created mirror of ``savepoint``; None, logged, if it was not created."""
        body = snapshots.mirror(self._body, savepoint)
        created: Any
        try:
            created = await self._clients.custom_objects.create_namespaced_custom_object(
                objects.GROUP, objects.VERSION, self._namespace, objects.SNAPSHOT_PLURAL, body
            )
        except API_ERRORS as error:
            log.warning(
                "%s/%s: SparkCheckpointSnapshot %s (savepoint %d) was not created: %s",
                self._namespace,
                self._name,
                body["metadata"]["name"],
                savepoint.checkpoint_id,
                _api_error(error),
            )
            self._mirror_failed(error, "create", following)
            return None
        self._mirrors_forbidden_said = False  # said again if refused again
        log.info(
            "%s/%s: made SparkCheckpointSnapshot %s for savepoint %d (%s)",
            self._namespace,
            self._name,
            body["metadata"]["name"],
            savepoint.checkpoint_id,
            savepoint.label,
        )
        return dict(created)

    async def _delete_mirror(self, snapshot: snapshots.Snapshot, following: _Mirrored) -> None:
        """Delete that mirror (by uid: not one made again under its name meanwhile)."""
        try:
            await self._clients.custom_objects.delete_namespaced_custom_object(
                objects.GROUP,
                objects.VERSION,
                self._namespace,
                objects.SNAPSHOT_PLURAL,
                snapshot.name,
                body=V1DeleteOptions(preconditions=V1Preconditions(uid=snapshot.uid)),
            )
        except NotFoundException:
            self._mirror_names.standing.discard(snapshot.name)
            return
        except API_ERRORS as error:
            log.warning(
                "%s/%s: SparkCheckpointSnapshot %s was not deleted: %s",
                self._namespace,
                self._name,
                snapshot.name,
                _api_error(error),
            )
            self._mirror_failed(error, "delete", following)
            return
        self._mirror_names.standing.discard(snapshot.name)
        log.info(
            "%s/%s: deleted SparkCheckpointSnapshot %s", self._namespace, self._name, snapshot.name
        )

    def _ask_pin(self, supervisor: JobSupervisor, savepoint_id: int, *, pinned: bool) -> None:
        self._pins_asked[savepoint_id] = pinned
        supervisor.pin(savepoint_id, pinned)

    def _existing_savepoint(self, manifest: JobManifest, path: str) -> CompletedCheckpoint | str:
        """The registered savepoint of the job's that ``path`` names (as its status's
        lastSavepoint.path, `spark-checkpoint list` and a snapshot's status.path give it), or
        why it names none (the operator reads no storage: the registry says)."""
        named = f"spec.savepoint.path {path}"
        try:
            address = parse_snapshot_address(snapshot_uri(path))
        except ValueError as error:
            return f"{named}: {error}"
        own = JobStorageLayout(_storage(manifest), self._namespace, self._name)
        if storage_place(address.layout.job_root) != storage_place(own.job_root):
            return f"{named}: not in the storage of SparkCheckpointJob {self._name}"
        kind, savepoint_id = address.kind, address.snapshot_id
        if kind is not CheckpointKind.SAVEPOINT:
            return f"{named}: a {kind.value}, not a savepoint"
        registry = self._record.coordinator
        found = next((s for s in registry.savepoints if s.checkpoint_id == savepoint_id), None)
        if found is None:
            # Its completion out of the status history's window: why, the job's events say.
            why = why_gone(registry, kind, savepoint_id) or (
                "is not in the job's registry: the savepoint history let it go, it was "
                "disposed of, or it never completed"
            )
            return f"{named}: savepoint {savepoint_id} {why}"
        return found

    def _observed(self) -> Observed:
        pods = self._clients.pods.pods(self._namespace, self._name)
        driver_expected = 1 if self._record.phase in ACTIVE_PHASES else 0
        # The job's own: a pod that only wears its labels is not counted.
        drivers = [
            pod
            for pod in pods
            if pod["metadata"].get("labels", {}).get(objects.LABEL_SPARK_ROLE) == objects.DRIVER
            and self._body["metadata"]["uid"] in owner_uids(pod)
        ]
        executors_expected = 0
        if driver_expected and self._manifest is not None:
            executors_expected = objects.expected_executors(self._manifest)
        return Observed(
            generation=self._generation,
            driver=Readiness(sum(1 for pod in drivers if pod_ready(pod)), driver_expected),
            executors=Readiness(
                sum(1 for pod in executors_of(pods, drivers) if pod_ready(pod)), executors_expected
            ),
            spec_problem=self._problem,
            spec_tolerated=self._tolerated,
            pending_change=self._pending_change(),
            resumes="when spec.state is Running",
            resumes_from=self._redeploy_pending(),
        )

    def _redeploy_pending(self) -> str | None:
        """The image a redeploy the job waits to run (Suspended) will restore; None if none
        waits or the redeploy would be refused."""
        manifest = self._manifest
        if manifest is None or (nonce := self._redeploy_due(manifest)) is None:
            return None
        try:
            image = self._redeploy_target(manifest)
        except UnknownImage:
            return None
        return f"{image.candidate} (spec.restore.savepointRedeployNonce {nonce})"

    def _pending_change(self) -> tuple[str, str] | None:
        """What the spec asks of the running driver that has not happened yet: GitOps tools
        read Ready (and observedGeneration, already the new spec's) to tell a change
        applied from one that waits, for ever if its savepoint keeps failing. Also once the
        driver stops for an upgrade (phase Suspending, then Suspended until the new driver
        starts): not a suspension, which Ready (and Argo CD's health) would say."""
        if (
            self._manifest is None
            or self._said.finishing  # its input is done: it ends Finished, nothing waits
            or not self._deployed  # adopted, its deployment not known yet
        ):
            return None
        upgrade = self._spec is not None and objects.deployment_hash(self._spec) != self._deployed
        if self._record.phase in (JobPhase.SUSPENDING, JobPhase.SUSPENDED):
            if upgrade and self._manifest.spec.state is JobState.RUNNING and self._stop is None:
                return (
                    "UpgradePending",
                    "the spec changed: a driver of the new spec starts next, from the stopped "
                    "driver's savepoint (without one, spec.shutdown.finalSavepoint false: the "
                    "newest image; a redeploy's: the image it names)",
                )
            return None
        if self._record.phase is not JobPhase.RUNNING:
            return None
        if self._manifest.spec.state is JobState.SUSPENDED:
            return ("SuspendPending", "the spec asks to suspend: the driver stops " + _STOPPING)
        if upgrade:
            return ("UpgradePending", "the spec changed: the driver is replaced " + _STOPPING)
        if (rolled_back := self._rollback.rolled_back) is not None:
            return (
                "RolledBack",
                f"spec generation {rolled_back.generation} was rolled back "
                f"({rolled_back.reason}): the last stable spec runs until the spec changes",
            )
        return None

    async def _refresh_readiness(self) -> None:
        """Pods came or went: status shows it even when nothing else changes."""
        observed = self._observed()
        if (observed.driver, observed.executors) != self._written_readiness:
            await self._save(self._record)

    async def _save(self, record: JobRecord) -> None:
        # One write at a time, each rendered when its turn comes: never an older status
        # over a newer one.
        async with self._saving:
            # The write that records the redeploy's restore handles its nonce with it.
            self._note_redeployed(record)
            self._note_stable(record)
            await self._write_annotations()
            await self._write(record)

    async def _write(self, record: JobRecord) -> None:
        observed = self._observed()
        self._written_readiness = (observed.driver, observed.executors)
        status = render_status(
            record,
            now=time.time(),
            observed=observed,
            previous_conditions=self._conditions,
        )
        for image in ("lastCheckpoint", "lastSavepoint"):
            if isinstance(status.get(image), dict):
                status[image] = dict.fromkeys(IMAGE_FIELDS) | status[image]
        status["handledTriggers"] = dict(self._handled)
        status["deploymentHash"] = self._deployed
        status["stoppedSpecHash"] = self._stopped_spec
        status |= self._rollback.to_status()  # a copy: what is acted on is the annotation's
        accepted = self._spec if self._spec != self._stored_spec else None
        if accepted:
            status["lastAcceptedSpec"] = accepted_spec_text(accepted)
        self._conditions = status["conditions"]
        for attempt in range(1, STATUS_WRITE_ATTEMPTS + 1):
            try:
                await self._clients.custom_objects.patch_namespaced_custom_object_status(
                    objects.GROUP,
                    objects.VERSION,
                    self._namespace,
                    objects.PLURAL,
                    self._name,
                    {"status": status},
                    _content_type=MERGE_PATCH,
                )
                if accepted:
                    self._stored_spec = accepted
                self._written_generation = observed.generation
                return
            except ApiException as error:
                # The coordinator must not act on state that is not stored: retried, then
                # raised (the daemon restarts and adopts the driver).
                if isinstance(error, NotFoundException):
                    raise
                if attempt == STATUS_WRITE_ATTEMPTS:
                    raise StatusNotWritten(
                        f"the job's status was not written (HTTP {error.status}, "
                        f"{STATUS_WRITE_ATTEMPTS} attempts): {api_message(error)}"
                    ) from error
                await asyncio.sleep(0.2 * 2**attempt)


class _Shutdown:
    """The one shutdown request of a deleted job's supervisor (asking twice would ask
    for two final savepoints)."""

    def __init__(
        self, supervisor: JobSupervisor, manifest: JobManifest, *, wait_for_running: bool = False
    ) -> None:
        self.supervisor = supervisor
        self.final_savepoint = manifest.spec.shutdown.final_savepoint
        self._drain = manifest.spec.shutdown.drain
        self.grace = manifest.spec.checkpointing.timeout + SHUTDOWN_GRACE_SECONDS
        self.wait_for_running = wait_for_running
        self.requested = asyncio.Event()

    def request(self) -> None:
        if not self.requested.is_set():
            self.requested.set()
            self.supervisor.shut_down(savepoint=self.final_savepoint, drain=self._drain)


class _AdoptedDriver:
    """The launcher of a deleted job's supervisor: the driver adopted for its shutdown,
    never a new one."""

    def __init__(self, driver: KubernetesDriver) -> None:
        self._driver = driver

    async def adopt(self, attempt: int) -> DriverHandle | None:
        return self._driver

    async def launch(self, attempt: int, restore: list[str]) -> DriverHandle:
        # Not reached: the shutdown is asked for before the supervisor would restart.
        raise LaunchFailed("the job is being deleted")


async def _cancel(task: "asyncio.Task[Any]") -> None:
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _validated(
    body: Mapping[str, Any],
    accepted_spec: Mapping[str, Any] | None,
    running_deployment: str | None,
    operator_account: objects.ServiceAccount | None = None,
) -> tuple[JobManifest | None, str | None, str | None]:
    """Check the spec as a local manifest is checked (the API server checked the schema
    already; the operator may be older or newer than the CRD) and for what only a cluster
    needs, tolerating what a rule refuses in a value ``accepted_spec`` held, and what the
    API server would refuse in the pods of a driver that runs with them
    (``running_deployment``: its `objects.deployment_hash`, None if none runs). Returns the
    manifest or the problem, and what was tolerated."""
    metadata = body["metadata"]

    def document(spec: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": f"{objects.GROUP}/{objects.VERSION}",
            "kind": objects.KIND,
            "metadata": {
                key: metadata[key]
                for key in ("name", "namespace", "labels", "annotations")
                if key in metadata
            },
            "spec": json.loads(json.dumps(dict(spec))),
        }

    source = f"{metadata['namespace']}/{metadata['name']}"
    try:
        manifest, tolerated = manifest_from_update(
            document(body.get("spec") or {}),
            None if accepted_spec is None else document(accepted_spec),
            source,
        )
    except ManifestError as error:
        return None, "; ".join(str(p) for p in error.problems), None
    # What the API server would refuse in the job's pods, refused before a running driver
    # is stopped for it (an upgrade's savepoint, then a driver that cannot start); kept
    # only for a driver that runs with those very pods (its deployment unchanged): no new
    # driver can be started with them.
    spec = body.get("spec") or {}
    pods = pod_spec_problems(manifest) + objects.operator_account_problems(
        manifest, operator_account
    )
    kept_pods = bool(pods) and objects.deployment_hash(spec) == running_deployment
    kept = _kept_text([str(p) for p in tolerated], pods if kept_pods else [])
    problems = []
    if not manifest.spec.image:
        problems.append("spec.image: required on a cluster (the driver's container image)")
    if not manifest.spec.checkpointing.storage:
        problems.append(
            "spec.checkpointing.storage: required on a cluster (a URI every driver and "
            "cleanup pod can reach, such as s3a://bucket/checkpoints)"
        )
    if objects.runs_executors(manifest) and not manifest.spec.checkpointing.live_volume_claim:
        problems.append(
            "spec.checkpointing.liveVolumeClaim: required when the job runs executors "
            "(spark.master is not local, and executor.instances is above 0 or dynamic "
            "allocation is on): they write the state the driver's agent snapshots, "
            "so it must be on a ReadWriteMany volume both mount"
        )
    if not kept_pods:
        problems += pods
    if problems:
        return None, "; ".join(problems), None
    return manifest, None, kept


def _kept_text(tolerated: list[str], pods: list[str]) -> str | None:
    """The SpecValid message of a spec accepted with problems: what a newer rule refuses
    in unchanged values, and what the API server would refuse in the running driver's
    pods; of each, the first TOLERATED_SHOWN named and the rest counted."""

    def group(problems: list[str], why: str) -> list[str]:
        if not problems:
            return []
        more = len(problems) - TOLERATED_SHOWN
        named = "; ".join(problems[:TOLERATED_SHOWN])
        return [named + (f"; and {more} more" if more > 0 else "") + f" ({why})"]

    kept = [
        *group(
            tolerated,
            "refused by this operator, kept while unchanged since the spec was accepted; a "
            "change to these fields must fix them",
        ),
        *group(
            pods,
            "the API server would refuse this in a new driver pod: the running driver goes "
            "on, and none is started until it is fixed",
        ),
    ]
    return "; ".join(kept) or None


def _storage_moved(
    manifest: JobManifest, accepted: Mapping[str, Any] | None, registry: PersistedState
) -> str | None:
    """Why the spec cannot take a storage other than the accepted spec's while the job has
    images: its checkpoints, savepoints and restore candidates are there, and a driver
    given the new one would find none of them (it fails the job) while the old ones are
    never cleaned. Without images (a mistyped storage the job failed on), it may change."""
    checkpointing = (accepted or {}).get("checkpointing") or {}
    before = checkpointing.get("storage") if isinstance(checkpointing, Mapping) else None
    now = manifest.spec.checkpointing.storage
    if not (registry.checkpoints or registry.savepoints) or not isinstance(before, str):
        return None
    if now is not None and storage_place(now) == storage_place(before):
        return None
    return (
        f"spec.checkpointing.storage: cannot change from {before!r} to {now!r} (the job's "
        "checkpoints and savepoints are there); set it back, or move the job: suspend it, "
        "then create a job with this storage and spec.restore.initialSavepointPath the "
        "path of its last savepoint"
    )


def accepted_spec_text(spec: Mapping[str, Any]) -> str | None:
    """``status.lastAcceptedSpec`` of ``spec``: a string, not an object (a merge patch would
    keep fields the spec dropped); None (the field removed) above its bound."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= MAX_ACCEPTED_SPEC_LENGTH else None


def _stored_spec(text: object) -> dict[str, Any] | None:
    """``status.lastAcceptedSpec`` as written by ``_write``; anything else is no spec."""
    try:
        spec = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):  # a status is writable by others than the operator
        return None
    return spec if isinstance(spec, dict) else None


# Fields the CRD gained after jobs were stored, with their defaults. The API server fills
# them in when it reads a stored job, so a hash stored before a field existed is the hash
# of the spec without it: installing a newer CRD must not look like a changed spec, which
# would run a Failed or Cancelled job again.
_LATER_DEFAULTS = {
    ("checkpointing", "verifyRestorable"): False,
    ("restartPolicy", "heartbeatTimeout"): "60s",
    ("restartPolicy", "startTimeout"): "5m",
}


def _suspended_for(stop_reason: str) -> str:
    """Why the job is suspended, said as it ends Suspended: not for a suspension."""
    return {
        UPGRADE: "for an upgrade",
        ROLLBACK: "for a rollback",
        REDEPLOY: "for a redeploy",
    }.get(stop_reason, "")


def _trigger_nonce(manifest: JobManifest, kind: CheckpointKind) -> int | None:
    """spec.checkpointTriggerNonce or spec.savepointTriggerNonce."""
    spec = manifest.spec
    if kind is CheckpointKind.CHECKPOINT:
        return spec.checkpoint_trigger_nonce
    return spec.savepoint_trigger_nonce


def _redeploy_nonce(spec: Mapping[str, Any]) -> int | None:
    """spec.restore.savepointRedeployNonce of a spec not validated yet."""
    restore = spec.get("restore")
    nonce = restore.get("savepointRedeployNonce") if isinstance(restore, Mapping) else None
    return nonce if isinstance(nonce, int) and not isinstance(nonce, bool) else None


def _spec_hash(spec: Mapping[str, Any]) -> str:
    """The spec without what does not call for a retry of a failed job (spec.rollback says
    how later changes are made)."""
    relevant = {
        key: value
        for key, value in spec.items()
        if key not in ("checkpointTriggerNonce", "savepointTriggerNonce", "state", "rollback")
    }
    text = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _spec_hashes(spec: Mapping[str, Any]) -> set[str]:
    """`_spec_hash` of the spec as every earlier CRD stored it: without any of the later
    fields that are at their default."""
    at_default = [
        (section, field)
        for (section, field), default in _LATER_DEFAULTS.items()
        if isinstance(spec.get(section), Mapping) and spec[section].get(field) == default
    ]
    hashes = set()
    for count in range(len(at_default) + 1):
        for left_out in itertools.combinations(at_default, count):
            earlier = dict(spec)
            for section, field in left_out:
                earlier[section] = {k: v for k, v in earlier[section].items() if k != field}
            hashes.add(_spec_hash(earlier))
    return hashes


def _storage(manifest: JobManifest) -> str:
    storage = manifest.spec.checkpointing.storage
    assert storage is not None  # checked by _validated
    return storage


class _SnapshotCompletions(Observer):
    """Tells the controller of each completion (it keeps the snapshots')."""

    def __init__(self, completed: Callable[[CompletedCheckpoint], None]) -> None:
        self._completed = completed

    def completed(self, checkpoint: CompletedCheckpoint) -> None:
        self._completed(checkpoint)


async def write_snapshot_status(
    clients: Clients,
    snapshot: snapshots.Snapshot,
    status: Mapping[str, Any],
    resource_version: str | None = None,
) -> bool:
    """Write the snapshot's status if it changed (only over ``resource_version``, if
    given); whether it is stored as ``status``. A write refused or unanswered is logged:
    it is no job's failure (a role without the snapshots' rules leaves them without a
    status). A snapshot gone meanwhile is forgotten (the watch may not say so: a watch
    listed again after a gap reports no deletion)."""
    patch = snapshots.status_patch(snapshot.status, status)
    if patch is None:
        return True
    body: dict[str, Any] = {"status": patch}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    try:
        await clients.custom_objects.patch_namespaced_custom_object_status(
            objects.GROUP,
            objects.VERSION,
            snapshot.namespace,
            objects.SNAPSHOT_PLURAL,
            snapshot.name,
            body,
            _content_type=MERGE_PATCH,
        )
    except NotFoundException:
        clients.snapshots.forget(snapshot.namespace, snapshot.name)
        return False
    except API_ERRORS as error:
        if not (isinstance(error, ApiException) and error.status == 409):  # changed meanwhile
            log.warning(
                "%s/%s: SparkCheckpointSnapshot %s: its status was not written: %s",
                snapshot.namespace,
                snapshot.job,
                snapshot.name,
                _api_error(error),
            )
        return False
    return True


async def hold_snapshot(clients: Clients, snapshot: snapshots.Snapshot, *, held: bool) -> bool:
    """Add `snapshots.FINALIZER` to the snapshot's finalizers, or take it away, over the
    version read (another's finalizer, added meanwhile, is not lost); whether it was
    written, or the snapshot is gone."""
    finalizers = [f for f in snapshot.finalizers if f != snapshots.FINALIZER]
    if held:
        finalizers.append(snapshots.FINALIZER)
    metadata = {"finalizers": finalizers, "resourceVersion": snapshot.resource_version}
    try:
        await clients.custom_objects.patch_namespaced_custom_object(
            objects.GROUP,
            objects.VERSION,
            snapshot.namespace,
            objects.SNAPSHOT_PLURAL,
            snapshot.name,
            {"metadata": metadata},
            _content_type=MERGE_PATCH,
        )
    except NotFoundException:
        return True
    except API_ERRORS as error:
        if isinstance(error, ApiException) and error.status == HTTPStatus.CONFLICT:
            return False  # changed meanwhile: asked again over its new version
        log.warning(
            "%s: SparkCheckpointSnapshot %s: its finalizer was not %s: %s",
            snapshot.namespace,
            snapshot.name,
            "added" if held else "removed",
            _api_error(error),
        )
        # Forbidden (a role from before the finalizer, without patch on the snapshots):
        # not asked again at each change; an object not held is released, not disposed of.
        return isinstance(error, ApiException) and error.status == HTTPStatus.FORBIDDEN
    return True


async def note_missing_job(clients: Clients, body: Mapping[str, Any]) -> None:
    """An open snapshot that no controller of this operator takes: if its job does not
    exist, its status says so (`snapshots.for_missing_job`), over the version of the
    snapshot read (an older event's body never overwrites a newer status). Else the job's
    controller, here once it starts or in the operator that holds its Lease, takes it."""
    snapshot = snapshots.Snapshot.from_body(body)
    if snapshot.mirror:  # it goes with its job (which owns it), once nothing holds it
        if snapshot.held and snapshot.deleting:
            await hold_snapshot(clients, snapshot, held=False)
        return
    if not snapshot.open and not snapshot.held:
        return
    try:
        await clients.custom_objects.get_namespaced_custom_object(
            objects.GROUP, objects.VERSION, snapshot.namespace, objects.PLURAL, snapshot.job
        )
    except NotFoundException:
        if snapshot.held:  # nothing runs to dispose of its savepoint (one that was kept)
            await hold_snapshot(clients, snapshot, held=False)
        elif snapshot.open:
            version = body["metadata"].get("resourceVersion")
            missing = snapshots.for_missing_job(snapshot)
            await write_snapshot_status(clients, snapshot, missing, version)
    except API_ERRORS as error:
        log.warning(
            "%s: SparkCheckpointSnapshot %s: its job %s could not be read: %s",
            snapshot.namespace,
            snapshot.name,
            snapshot.job,
            _api_error(error),
        )


def _api_error(error: Exception) -> str:
    return (
        api_message(error)
        if isinstance(error, ApiException)
        else f"{type(error).__name__}: {error}"
    )
