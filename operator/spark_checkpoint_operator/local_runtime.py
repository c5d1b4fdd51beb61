"""The embedded default: a SparkCheckpointJob manifest run on this machine.

The driver is a local process (Spark ``local[*]``), storage a local directory unless the
manifest names one, and status a JSON file; the coordinator and the driver's agent are the
same as on Kubernetes and talk over loopback HTTP with a per-run token.
"""

import asyncio
import contextlib
import dataclasses
import difflib
import errno
import fcntl
import functools
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar, cast

from prometheus_client import REGISTRY

from spark_checkpoint.janitor_commands import (
    JANITOR_MODULE,
    ClaimStorage,
    CollectGarbage,
    DiscardCheckpoint,
    DiscardSavepoint,
    JanitorCommand,
    failure_reason,
    janitor_environment,
)
from spark_checkpoint.protocol import RestoreCandidate, StorageOwner
from spark_checkpoint.settings import (
    LOOPBACK_DRIVER_CONF,
    DriverSettings,
    remove_attempt_directories,
)
from spark_checkpoint.storage import (
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
    StorageOwnedElsewhere,
    SymbolicLinkError,
    first_line,
    hand_over_hint,
    parse_snapshot_address,
    printable_line,
)
from spark_checkpoint_operator.agent_client import AgentClient
from spark_checkpoint_operator.child_process import dying_with_parent
from spark_checkpoint_operator.control import ControlPaths, next_run, serve_controls
from spark_checkpoint_operator.coordinator import (
    AfterCompletion,
    CheckpointKind,
    JobPhase,
    TerminalOutcome,
    TriggerRequested,
)
from spark_checkpoint_operator.driver_command import (
    LOCAL_SCHEME,
    TERMINATION_GRACE_SECONDS,
    driver_command,
    submit_arguments,
)
from spark_checkpoint_operator.local_environment import driver_environment, driver_environment_here
from spark_checkpoint_operator.local_state import (
    DEFAULT_STORAGE_DIR_NAME,
    CopiedStateDirectory,
    LocalPaths,
    UnsafeStateDirectory,
    local_owner,
    local_paths,
    made_here_before,
    make_private_job_directory,
    open_state_file,
    storage_field,
)
from spark_checkpoint_operator.manifest.crd import cached_crd, resource_api_version, resource_kind
from spark_checkpoint_operator.manifest.loading import load_manifest, manifest_from_document
from spark_checkpoint_operator.manifest.model import Application, JobManifest, JobSpec, JobState
from spark_checkpoint_operator.manifest.problems import ManifestError, Problem
from spark_checkpoint_operator.metrics import CheckpointMetrics
from spark_checkpoint_operator.restorable_check import local_restorable_check
from spark_checkpoint_operator.restore_choice import (
    ChosenImage,
    UnknownImage,
    chosen_image,
    snapshot_uri,
)
from spark_checkpoint_operator.run_display import RunDisplay
from spark_checkpoint_operator.status import StatusFile, StatusFileError, render_status
from spark_checkpoint_operator.supervisor import (
    FINISHING_NEEDS_NO_SAVEPOINT,
    JANITOR_TIMEOUT_SECONDS,
    KILLING_SIGNALS,
    NO_QUERY_RUNNING,
    CleanupFailed,
    JobRecord,
    JobSupervisor,
    LaunchFailed,
    Notice,
    StartProblem,
    driver_error,
)

LOCAL_SPARK_DEFAULTS = {"spark.master": "local[*]", "spark.ui.enabled": "false"}
# How long a run tries the job's lock before it is refused as busy (a `status` asking
# whether a run holds it takes it shared for an instant).
LOCK_PROBE_PATIENCE_SECONDS = 0.5


def local_spark_conf(application: Application) -> dict[str, str]:
    """The Spark settings of a local driver: the manifest's over the local defaults."""
    conf = {**LOCAL_SPARK_DEFAULTS, **application.spark_conf}
    if conf["spark.master"].startswith("local"):
        conf = {**LOOPBACK_DRIVER_CONF, **conf}
    return conf


class RunRefused(Exception):
    """The job is not run; the message says why and what to do instead."""


class RunInterrupted(RunRefused):
    """A signal ended the run before its job started; the message says which."""


class JobBusy(RunRefused):
    """Another `spark-checkpoint run` holds the job; the message names it."""


def load_runnable_manifest(path: Path) -> JobManifest:
    """The manifest at ``path`` if this machine can run it; ManifestError naming the file
    and each field that keeps it from running here (fields Kubernetes takes)."""
    manifest = load_manifest(path)
    problems = []
    if manifest.namespace == DEFAULT_STORAGE_DIR_NAME:
        problems.append(
            Problem(
                "metadata.namespace",
                f"{DEFAULT_STORAGE_DIR_NAME!r} is the name of the default storage's directory "
                "in the state directory: the job's state would lie among other jobs' "
                "checkpoints (its logs/ and work/ where jobs named logs and work keep "
                "theirs); give the job another namespace",
            )
        )
    if manifest.spec.state is JobState.SUSPENDED:
        problems.append(
            Problem(
                "spec.state",
                "is Suspended: the manifest asks for the job not to run; set it to Running "
                "(the default) to run it here (on this machine, `spark-checkpoint stop` "
                "suspends a run)",
            )
        )
    if problems:
        raise ManifestError(str(path), problems)
    return manifest


@contextlib.contextmanager
def job_lock(paths: LocalPaths, job: str, *, handed_over: int | None = None) -> Iterator[int]:
    """Held for a whole run: a second run of the same job would otherwise take the first
    one's driver for a leftover and kill it. Yields the lock's descriptor, which a
    detached run's command hands over to its background run (``handed_over`` there): no
    other run can take the lock in between."""
    with _exclusive(
        paths.lock_file,
        subject="the job's state directory",
        busy=lambda holder: (
            f"job {job} is already running "
            f"(pid {holder}, lock {paths.lock_file}): stop that run first"
        ),
        handed_over=handed_over,
    ) as descriptor:
        yield descriptor


@contextlib.contextmanager
def storage_lock(storage: CheckpointStorage, job: str, named: str) -> Iterator[None]:
    """Held for a whole run on local storage: a job's storage has one writer. Two runs of a
    job kept in two state directories would otherwise share it, each taking the other's
    checkpoints for garbage and writing the same checkpoint ids. (An object store has no
    lock to take: there, one storage root per run is the user's to keep.) ``named``: what
    messages call the storage (`local_state.storage_field`)."""
    subject = f"{named} {storage.layout.root!r}"
    try:
        lock_file = storage.fs.local_path(storage.layout.writer_lock_path)
        if lock_file is not None:
            Path(lock_file).parent.mkdir(parents=True, exist_ok=True)
    except StorageError as error:
        raise RunRefused(f"{subject}: {error}") from None
    except OSError as error:
        raise RunRefused(
            f"{subject}: cannot create the job's directory {error.filename}: "
            f"{error.strerror or error}"
        ) from None
    if lock_file is None:
        yield
        return
    with _exclusive(
        Path(lock_file),
        subject=subject,
        busy=lambda holder: (
            f"job {job}'s storage {Path(lock_file).parent} is "
            f"in use by another run (pid {holder}, lock {lock_file}): stop that run, or give "
            "this one another spec.checkpointing.storage"
        ),
    ):
        yield


@contextlib.contextmanager
def _exclusive(
    lock_file: Path,
    *,
    subject: str,
    busy: Callable[[str], str],
    handed_over: int | None = None,
) -> Iterator[int]:
    """An ``flock`` on ``lock_file``, which goes with the process however it ends; the file
    only names the holder (its pid) for the `JobBusy` message ``busy`` makes of it. A lock
    that cannot be taken (no permission, no lock manager on NFS) refuses the run, naming
    ``subject``. Created as any shared file is (the umask decides who else may take it):
    flock on NFS needs the file open for writing. ``handed_over``: a descriptor of the
    file, inherited from the process holding the lock on it (the lock is the open file's,
    so it is taken again at once)."""
    try:
        if handed_over is None:
            descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        else:
            descriptor = _inherited(handed_over, lock_file)
    except OSError as error:
        raise RunRefused(
            f"{subject}: cannot open the lock {lock_file}: {error.strerror or error}"
        ) from None
    try:
        try:
            _lock_exclusively(descriptor)
        except BlockingIOError:
            holder = os.read(descriptor, 200).decode(errors="replace").strip() or "unknown"
            raise JobBusy(busy(holder)) from None
        except OSError as error:
            raise RunRefused(
                f"{subject}: cannot lock {lock_file}: {error.strerror or error}"
            ) from None
        try:
            name_lock_holder(descriptor, os.getpid())
        except OSError as error:
            raise RunRefused(
                f"{subject}: cannot write the lock {lock_file}: {error.strerror or error}"
            ) from None
        yield descriptor
    finally:
        os.close(descriptor)


def _lock_exclusively(descriptor: int) -> None:
    """``flock`` LOCK_EX, tried for a moment: `status` asks whether a run holds the lock
    with a shared lock it lets go at once (`run_lock_holder`), which must not refuse a run
    starting then. BlockingIOError when it stays held."""
    deadline = time.monotonic() + LOCK_PROBE_PATIENCE_SECONDS
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def name_lock_holder(descriptor: int, pid: int) -> None:
    """Write ``pid`` into the lock file open as ``descriptor``: the run a refused one names."""
    os.ftruncate(descriptor, 0)
    # At the start: a handed-over descriptor's offset is past its first holder's pid.
    os.pwrite(descriptor, f"{pid}\n".encode(), 0)


def _inherited(descriptor: int, lock_file: Path) -> int:
    """``descriptor``, once found open on ``lock_file`` itself (OSError otherwise), and no
    longer passed on to the processes this one starts."""
    opened, named = os.fstat(descriptor), os.stat(lock_file, follow_symlinks=False)
    if (opened.st_dev, opened.st_ino) != (named.st_dev, named.st_ino):
        raise OSError(errno.EBADF, f"descriptor {descriptor} handed over is another file")
    os.set_inheritable(descriptor, False)
    return descriptor


class LocalDriver:
    def __init__(
        self,
        process: asyncio.subprocess.Process,
        agent: AgentClient,
        *,
        log: IO[bytes],
        log_file: Path,
        error_file: Path,
        restore: list[str],
    ):
        self._process = process
        self._agent = agent
        self._log = log
        self._log_file = log_file
        self._error_file = error_file
        self._restore = restore

    @property
    def agent(self) -> AgentClient:
        return self._agent

    @property
    def pid(self) -> int:
        return self._process.pid

    def executors_ready(self) -> bool:
        return True  # local mode: the executors are threads of the driver

    def start_problem(self) -> StartProblem | None:
        return None  # a process that cannot start exits: its exit code says why

    def started(self) -> bool:
        return True

    def restore_candidates(self) -> list[str]:
        return self._restore

    def exit_code(self) -> int | None:
        code = self._process.returncode
        if code is not None:
            self._log.close()
        return code

    async def recheck(self) -> None:
        """Nothing to ask: the process's end reaches `exit_code` at once."""

    def error_lines(self) -> list[str]:
        """The error the driver reported, else the one its log ends with (`driver_error`)."""
        killed = -(self._process.returncode or 0) in KILLING_SIGNALS
        output = _head(self._error_file) or ("" if killed else _log_tail(self._log_file))
        return driver_error(output, killed=killed)

    async def terminate(self) -> None:
        if self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), TERMINATION_GRACE_SECONDS)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        # What it leaves in its group (a JVM hung in its shutdown) must not run beside the
        # next driver.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        await self._agent.close()


class LocalLauncher:
    def __init__(
        self,
        manifest: JobManifest,
        manifest_dir: Path,
        paths: LocalPaths,
        storage: str,
        owner: StorageOwner,
    ):
        self._manifest = manifest
        self._manifest_dir = manifest_dir
        self._paths = paths
        self._storage = storage
        self._owner = owner
        self.current: LocalDriver | None = None
        self.on_launch: Callable[[LocalDriver], None] = lambda driver: None

    def driver_pid(self) -> int | None:
        """The running driver's; None between drivers (a killed one's is no news)."""
        current = self.current
        return current.pid if current is not None and current.exit_code() is None else None

    def driver_group(self) -> int | None:
        """The last driver's process group (its pid), kept in the status file: its JVM may
        outlive it, and a run after a killed runtime stops what is left of it."""
        return self.current.pid if self.current is not None else None

    async def adopt(self, attempt: int) -> None:
        """Never: a local driver dies with the runtime that started it."""

    async def launch(self, attempt: int, restore: list[str]) -> LocalDriver:
        # Live locations of attempts from this one on: left by a registry since lost (its
        # status.json deleted, its attempts counted from 1 again), and dead: this run holds
        # the job's run.lock, and a local driver dies with the runtime that started it (one
        # left over is stopped before). The driver refuses to reuse a location, a first
        # failure that named no cause the user knew of.
        remove_attempt_directories(self._paths.work_dir, lambda number: number >= attempt)
        token = secrets.token_urlsafe(32)
        # Created owner-only from the start: the token never exists with looser modes.
        self._paths.token_file.unlink(missing_ok=True)
        descriptor = os.open(self._paths.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as token_file:
            token_file.write(token)
        # Bound here and inherited by the driver, which listens on it once its agent serves
        # (connections are refused until then, as the supervisor expects of a driver that
        # is starting): the port is the agent's from the start. This copy is closed once the
        # driver holds its own, or the launch failed.
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            port = int(listener.getsockname()[1])
            process, log, log_file, error_file = await self._start_driver(
                attempt, restore, token, listener
            )
        agent = AgentClient(f"http://127.0.0.1:{port}", token)
        driver = LocalDriver(
            process, agent, log=log, log_file=log_file, error_file=error_file, restore=restore
        )
        self.current = driver
        self.on_launch(driver)
        return driver

    async def _start_driver(
        self, attempt: int, restore: list[str], token: str, listener: socket.socket
    ) -> tuple[asyncio.subprocess.Process, IO[bytes], Path, Path]:
        """The driver process of `attempt`, its agent on the socket `listener`; its log
        (open, appended to), the log's path and where it writes the error it fails with."""
        settings = DriverSettings(
            namespace=self._manifest.namespace,
            job=self._manifest.name,
            storage_root=self._storage,
            work_dir=self._paths.work_dir,
            agent_host="127.0.0.1",
            agent_port=int(listener.getsockname()[1]),
            token=token,
            attempt=attempt,
            restore_candidates=tuple(RestoreCandidate.decode(c) for c in restore),
            owner=self._owner,
            agent_socket_fd=listener.fileno(),
        )
        application = self._manifest.spec.application
        # Relative main files are relative to the manifest: the driver runs from there.
        command = driver_command(application, sys.executable)
        environment = driver_environment(self._manifest)
        error_file = self._paths.driver_error_file(attempt)
        error_file.unlink(missing_ok=True)
        environment.update(settings.to_environment(self._paths.token_file, error_file))
        environment["PYSPARK_SUBMIT_ARGS"] = submit_arguments(local_spark_conf(application))
        self._paths.logs_dir.mkdir(parents=True, exist_ok=True)
        log_file = self._paths.driver_log(attempt)
        try:
            log = open_state_file(log_file, append=True)
        except SymbolicLinkError as error:
            raise LaunchFailed(str(error)) from None
        try:
            process = await asyncio.create_subprocess_exec(
                *dying_with_parent(command),
                cwd=self._manifest_dir,
                env=environment,
                stdout=log,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(listener.fileno(),),
            )
        except OSError as error:  # an interpreter or a manifest directory out of reach
            log.close()
            where = f"{error.filename}: " if error.filename else ""
            raise LaunchFailed(f"{where}{error.strerror or error}") from None
        return process, log, log_file, error_file


# What only the cluster's pods use, by field name: a local run's Spark runs on this machine
# (spark.master local[*] unless sparkConf says otherwise).
_POD_ONLY_FIELDS = {
    "cores": "cores",
    "memory": "memory",
    "instances": "instances",
    "service_account": "serviceAccount",
    "node_selector": "nodeSelector",
    "tolerations": "tolerations",
    "volumes": "volumes",
    "volume_mounts": "volumeMounts",
}


@functools.cache
def _default_spec() -> JobSpec:
    """The spec of a manifest that sets nothing it need not: the CRD's defaults."""
    return manifest_from_document(
        {
            "apiVersion": resource_api_version(cached_crd()),
            "kind": resource_kind(cached_crd()),
            "metadata": {"name": "defaults"},
            "spec": {"application": {"module": "m"}},
        }
    ).spec


def _pod_settings_note(manifest: JobManifest) -> str | None:
    """A note naming the manifest's settings for the cluster's pods that a local run does
    not use (those set to other than their defaults), or None."""
    spec, defaults = manifest.spec, _default_spec()
    unused = [
        f"spec.{role}.{field}"
        for role in ("driver", "executor")
        for attribute, field in _POD_ONLY_FIELDS.items()
        if getattr(getattr(spec, role), attribute, None)
        != getattr(getattr(defaults, role), attribute, None)
    ]
    unused += [field for field, template in spec.pod_templates if template]
    if spec.checkpointing.live_volume_claim:
        unused.append("spec.checkpointing.liveVolumeClaim")
    if not unused:
        return None
    master = local_spark_conf(spec.application)["spark.master"]
    return (
        f"note: a local run's Spark runs on this machine (spark.master {master}): "
        f"{', '.join(unused)} are for the cluster's pods and not used here"
    )


def _executor_variables_warning(manifest: JobManifest) -> str | None:
    """A warning naming the executors' variables a local run gives the driver's value of
    (never the values), or None."""
    driver = {v.name: v for v in manifest.spec.driver_env}
    clashes = [
        f"{v.name} ({driver[v.name].source} over {v.source})"
        for v in manifest.spec.executor_env
        if v.name in driver and v != driver[v.name]
    ]
    if not clashes:
        return None
    return (
        "warning: a local run's executors are in the driver's process and get the driver's "
        f"{', '.join(clashes)}"
    )


class LocalJanitor:
    """Storage work while no driver runs, as on Kubernetes: the janitor
    (`spark_checkpoint.janitor`) in a process with the driver's environment, which holds
    the storage credentials."""

    def __init__(self, manifest: JobManifest, storage_root: str, owner: StorageOwner) -> None:
        self._environment = {
            **driver_environment(manifest),
            **janitor_environment(manifest.namespace, manifest.name, storage_root, owner),
        }

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        await self._run(DiscardCheckpoint(checkpoint_id, tuple(retained)))

    async def discard_savepoint(self, savepoint_id: int) -> None:
        await self._run(DiscardSavepoint(savepoint_id))

    async def collect_garbage(self, checkpoints: list[int], savepoints: list[int]) -> None:
        await self._run(CollectGarbage(tuple(checkpoints), tuple(savepoints)))

    async def claim(self) -> None:
        """Claim the job's storage with the driver's credentials, before Spark starts: an
        object store the driver would fail on (a mistyped bucket, missing keys) refuses the
        run at once, not after a Spark start and the restart policy's retries."""
        if (reason := await self._failure(ClaimStorage())) is not None:
            raise RunRefused(f"cannot claim the job's storage: {reason}")

    async def _run(self, command: JanitorCommand) -> None:
        if (reason := await self._failure(command)) is not None:
            raise CleanupFailed(f"{command.NAME}: {reason}")

    async def _failure(self, command: JanitorCommand) -> str | None:
        """Why ``command`` failed in its janitor process; None when it did not."""
        try:
            process = await asyncio.create_subprocess_exec(
                *dying_with_parent([sys.executable, "-m", JANITOR_MODULE, *command.arguments()]),
                env=self._environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as error:
            return str(error)
        try:
            async with asyncio.timeout(JANITOR_TIMEOUT_SECONDS):
                output, _ = await process.communicate()
        except TimeoutError:
            _kill(process)
            await process.wait()
            return (
                f"did not finish in {JANITOR_TIMEOUT_SECONDS:.0f}s (storage that does not answer?)"
            )
        except asyncio.CancelledError:
            _kill(process)  # cut short (`JobSupervisor.cancel`), or the run is going
            await process.wait()
            raise
        if process.returncode == 0:
            return None
        lines = output.decode(errors="replace").strip().splitlines()
        return failure_reason(command, lines[-1]) if lines else f"exit code {process.returncode}"


def load_record(paths: LocalPaths) -> JobRecord:
    """What the job resumes from; raises RunRefused if its status file cannot be read (the
    registry in it is what keeps ids unique and images restorable: never guessed)."""
    try:
        status_file = StatusFile.read(paths.status_file)
        if status_file is None:
            return JobRecord()
        return JobRecord.from_status(status_file.persisted_status())
    except StatusFileError as error:
        raise RunRefused(
            f"the job's status file cannot be read ({error}); repair it, or delete "
            f"{paths.job_dir} and the job's storage to start the job afresh"
        ) from error


async def run_local(
    manifest: JobManifest,
    manifest_path: Path,
    state_dir: Path,
    display: RunDisplay,
    *,
    metrics_port: int | None = None,
    agent_start_timeout: float | None = None,
    restore_from: str | None = None,
    handed_over_lock: int | None = None,
) -> TerminalOutcome:
    """Run the job to its end; Ctrl-C takes a savepoint and stops (a second one kills).
    With ``metrics_port``, Prometheus metrics are served on loopback; with ``restore_from``
    (``run --from``), that image is restored instead of the newest; ``handed_over_lock``:
    the job's lock, taken by the command that started this run (`job_lock`). Raises `JobBusy` if
    another run of the job is under way, `RunRefused` for an image that cannot be restored
    (before anything else is started)."""
    require_secret_variables(manifest, os.environ)
    require_main_file(manifest.spec.application, manifest_path)
    paths = local_paths(manifest, state_dir)
    if manifest.spec.checkpointing.storage is None and (
        left := paths.storage_left_percent_encoded()
    ):
        raise RunRefused(
            f"{left} holds this job's checkpoints and savepoints from an earlier version, "
            "which named the default storage's directory percent-encoded: move it to "
            f"{paths.default_storage.removeprefix('file://')}/{manifest.namespace}/"
            f"{manifest.name} and run again"
        )
    try:
        make_private_job_directory(paths)
    except UnsafeStateDirectory as error:
        raise RunRefused(str(error)) from None
    except OSError as error:
        raise RunRefused(f"cannot create the job's state directory: {error}") from None
    with driver_environment_here(manifest):
        # adlfs takes its credentials as it is made: they may be the manifest's literal
        # variables alone (the run's own storage work is local, its janitors' the driver's).
        storage = _checkpoint_storage(
            manifest,
            JobStorageLayout(
                manifest.spec.checkpointing.storage or paths.default_storage,
                manifest.namespace,
                manifest.name,
            ),
        )
    job = f"{manifest.namespace}/{manifest.name}"
    with job_lock(paths, job, handed_over=handed_over_lock):
        # Before the storage's lock, which would create the job's directory there.
        check_storage_unchanged(load_record(paths), storage, paths)
        with storage_lock(storage, job, storage_field(manifest)):
            if warning := _executor_variables_warning(manifest):
                display.line(warning)
            if note := _pod_settings_note(manifest):
                display.line(note)
            metrics = None
            if metrics_port is not None:
                metrics = CheckpointMetrics(REGISTRY)
                try:
                    metrics.serve(metrics_port, "127.0.0.1")
                except OSError as error:
                    raise RunRefused(
                        f"--metrics-port {metrics_port}: cannot serve metrics there: "
                        f"{error.strerror or error}"
                    ) from None
                display.line(f"metrics on http://127.0.0.1:{metrics_port}/metrics")
            return await _run_locked(
                manifest,
                manifest_path,
                paths,
                storage,
                display,
                metrics=metrics,
                agent_start_timeout=agent_start_timeout,
                restore_from=restore_from,
            )


async def _prepared(
    manifest: JobManifest,
    record: JobRecord,
    storage: CheckpointStorage,
    paths: LocalPaths,
    *,
    owner: StorageOwner,
    report: Callable[[str], None],
    restore_from: str | None,
) -> tuple[LocalJanitor, ChosenImage | None]:
    """What comes before the job starts: the storage claimed, the image to restore
    checked, a driver an earlier run left stopped. A signal meanwhile ends the run with a
    line (`_StartSignals`, whose handlers stay until the supervisor's replace them)."""
    signals = _StartSignals()
    try:
        janitor = await _claiming_janitor(manifest, storage, owner, report, signals)
        image = await signals.leaving_behind(
            functools.partial(_checked_images, manifest, record, storage, restore_from),
            "while checking the image to restore",
        )
        _tell_unrecorded_end(record, paths, report)
        _stop_leftover_driver(paths, report)
    except BaseException:
        signals.restore()
        raise
    return janitor, image


async def _claiming_janitor(
    manifest: JobManifest,
    storage: CheckpointStorage,
    owner: StorageOwner,
    report: Callable[[str], None],
    signals: "_StartSignals",
) -> LocalJanitor:
    """The run's janitor, once it claimed an object store (`_claimed` claims local storage).
    A claim that takes long is said: against an endpoint that did not answer, the run's log
    held nothing for minutes (an S3 user's). A signal meanwhile ends the claim."""
    janitor = LocalJanitor(manifest, storage.layout.root, owner)
    if storage.fs.is_local:
        return janitor
    claim = asyncio.ensure_future(janitor.claim())
    try:
        with signals.cancelling(claim):
            await asyncio.wait({claim}, timeout=SLOW_CLAIM_SECONDS)
            if not claim.done():
                # Azure's SDK retries a refused connection for about 3 minutes.
                report(
                    f"claiming the job's storage {storage.layout.job_root}: no answer after "
                    f"{SLOW_CLAIM_SECONDS:.0f}s (an endpoint that does not answer, or one "
                    "that refuses and the storage library retries?); waiting up to "
                    f"{JANITOR_TIMEOUT_SECONDS:.0f}s"
                )
            await claim
    finally:
        claim.cancel()  # its janitor process goes too
    signals.check(f"while claiming the job's storage {storage.layout.job_root}")
    return janitor


_Result = TypeVar("_Result")


class _StartSignals:
    """Ctrl-C, SIGTERM and SIGHUP from the run's start until its supervisor takes them
    (`_Interrupts`, whose handlers replace these): each ends the run with a line saying
    which, once the work under way (`cancelling`) is cancelled or has returned; without
    them, SIGTERM and SIGHUP ended it without a word (an S3 user's, while it claimed an
    object store that did not answer). `restore` gives them back as they were."""

    # What a run says of each signal that ends it before its job starts.
    _SAID: ClassVar[dict[signal.Signals, str]] = {
        signal.SIGINT: "interrupted (Ctrl-C)",
        signal.SIGTERM: "terminated (SIGTERM)",
        signal.SIGHUP: "hung up (SIGHUP)",
    }

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._signalled: list[str] = []
        self._work: asyncio.Future[Any] | None = None
        self._previous = {number: signal.getsignal(number) for number in self._SAID}
        self._installed: list[signal.Signals] = []
        try:
            for number, why in self._SAID.items():
                self._loop.add_signal_handler(number, self._received, why)
                self._installed.append(number)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread's loop
            self.restore()

    def _received(self, why: str) -> None:
        self._signalled.append(why)
        if self._work is not None:
            self._work.cancel()

    @contextlib.contextmanager
    def cancelling(self, work: "asyncio.Future[Any]") -> Iterator[None]:
        """A signal while the block runs cancels ``work``, whose cancellation ends the block
        quietly (`check` then says why)."""
        self._work = work
        try:
            yield
        except asyncio.CancelledError:
            if not self._signalled:
                raise  # the run's own cancellation
        finally:
            self._work = None

    async def leaving_behind(self, work: Callable[[], _Result], when: str) -> _Result:
        """``work``'s result, from a daemon thread that a signal leaves behind: the run ends
        at once (`check`, ``when`` saying during what) rather than once storage reads that
        retry for minutes return (Ctrl-C waited for them)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_Result] = loop.create_future()

        def settle(result: _Result | None, error: BaseException | None) -> None:
            if done.done():  # cancelled by a signal
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(cast(_Result, result))

        def run() -> None:
            try:
                outcome: tuple[_Result | None, BaseException | None] = (work(), None)
            except BaseException as error:  # the awaiting task raises it
                outcome = (None, error)
            with contextlib.suppress(RuntimeError):  # the run ended: its loop is closed
                loop.call_soon_threadsafe(settle, *outcome)

        threading.Thread(target=run, name="start-checks", daemon=True).start()
        with self.cancelling(done):
            await done
        self.check(when)
        return done.result()

    def check(self, when: str) -> None:
        """Raise RunInterrupted if a signal came (``when`` says during what)."""
        if self._signalled:
            raise RunInterrupted(f"{self._signalled[0]} {when}: nothing was started")

    def restore(self) -> None:
        for number in self._installed:
            self._loop.remove_signal_handler(number)
            signal.signal(number, self._previous[number])
        self._installed.clear()


def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill ``process`` unless it ended (which asyncio may know before its output is read)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()


# How long a claim of an object store may take before the run says it waits for it.
SLOW_CLAIM_SECONDS = 10.0


def registry_owner(paths: LocalPaths, storage: CheckpointStorage) -> StorageOwner:
    """This state directory's registry of the job (`local_owner`); RunRefused for a copy
    whose original keeps it, or a registry id that cannot be kept."""
    try:
        return local_owner(paths, own_storage=storage.layout.root == paths.default_storage)
    except CopiedStateDirectory as error:
        raise RunRefused(str(error)) from None
    except (OSError, ValueError) as error:
        raise RunRefused(
            f"{paths.registry_id_file}: cannot keep the id of the job's registry there: "
            f"{getattr(error, 'strerror', None) or error}"
        ) from None


def _claimed(storage: CheckpointStorage, paths: LocalPaths) -> StorageOwner:
    """This state directory's registry. The driver and the janitors claim the job's storage
    for it (that is where it is enforced, with the credentials the manifest gives them);
    local storage, which needs none, is claimed here too, so that another registry's run
    is refused before Spark starts."""
    owner = registry_owner(paths, storage)
    if not storage.fs.is_local:
        return owner  # an object store: this process has no credentials for it
    try:
        storage.claim(owner)
    except StorageOwnedElsewhere as error:
        if made_here_before(error.owner, paths):
            # "Run the job from the registry that owns it" cannot be done: it is gone.
            raise RunRefused(
                f"{error.path}: this job's storage belongs to an earlier registry of a "
                f"state directory at this path (registry {error.owner.id[:8]}; this one is "
                f"{owner.id[:8]}): this one's records of the job were deleted since (or it "
                "is another machine's), and this registry's garbage collection would delete "
                "its checkpoints. Give the job another spec.checkpointing.storage "
                "(spec.restore.initialSavepointPath can start it from a savepoint or a "
                f"retained checkpoint there), or {hand_over_hint(error.path)}"
            ) from None
        raise RunRefused(str(error)) from None
    except (StorageError, OSError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise RunRefused(
            f"{storage.layout.job_root}: cannot claim the job's storage: {reason}"
        ) from None
    return owner


def require_secret_variables(manifest: JobManifest, environment: Mapping[str, str]) -> None:
    """A variable a Secret gives the pods on Kubernetes is taken from the run's own
    environment (no cluster, no Secret), the executors' too (they are in the driver's
    process): refuse the run, naming it and its field, where it is not set."""
    if unset := manifest.spec.unset_secret_variables(environment):
        raise RunRefused(f"{unset}; a local run takes such variables from its own environment")


def require_main_file(application: Application, manifest_path: Path) -> None:
    """A main file that is not there is named before Spark starts (Python would only say
    so in the driver's log, and the job would fail as misconfigured), with the manifest
    that names it."""
    if application.main_file is None:
        return
    path = manifest_path.parent.resolve() / application.main_file.removeprefix(LOCAL_SCHEME)
    if path.is_file() or (path / "__main__.py").is_file():  # Python runs both
        return
    try:
        # What Python could run: a script, or a directory with __main__.py.
        siblings = [
            entry.name
            for entry in path.parent.iterdir()
            if (entry.is_file() and entry.suffix == ".py") or (entry / "__main__.py").is_file()
        ]
    except OSError:
        siblings = []
    close = difflib.get_close_matches(path.name, siblings, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise RunRefused(
        f"{printable_line(str(manifest_path))}: spec.application.mainFile: no file "
        f"{printable_line(str(path))} (a relative path is read from the manifest's "
        f"directory){hint}"
    )


def _finished(
    manifest: JobManifest, record: JobRecord, paths: LocalPaths, layout: JobStorageLayout
) -> str:
    """Why a Finished job is not run again, and how to run it anyway."""
    storage_dir = layout.job_root.removeprefix("file://")
    # Two courses, told apart: the output goes with a start from scratch, and stays with
    # a savepoint's restore (the transactional sink skips the batches it committed
    # already; a sink of the user's may not).
    from_savepoint = (
        "; to run it on from one of its savepoints instead, copy the savepoint's "
        f"directory to <another root>/{manifest.namespace}/{manifest.name}/savepoints/"
        "sp-N (where a savepoint must lie to be read), delete its state and storage but "
        "not its output, and run --from that path (or name it in "
        "spec.restore.initialSavepointPath): a TransactionalFileSink does not write the "
        "batches it committed already again"
        if record.coordinator.savepoints
        else ""
    )
    return (
        f"job {manifest.namespace}/{manifest.name} has Finished and is not run again; "
        f"to run it from the start, delete its state {paths.job_dir}, storage "
        f"{storage_dir} and the output it committed" + from_savepoint
    )


async def _run_locked(
    manifest: JobManifest,
    manifest_path: Path,
    paths: LocalPaths,
    storage: CheckpointStorage,
    display: RunDisplay,
    *,
    metrics: CheckpointMetrics | None,
    agent_start_timeout: float | None,
    restore_from: str | None,
) -> TerminalOutcome:
    layout = storage.layout
    record = load_record(paths)
    if record.phase is JobPhase.FINISHED:
        # As on Kubernetes: its input is done. Running it again would restore whatever
        # image is left (an old savepoint) and recompute from there without a word. Both
        # directories go: a new registry's ids would run into the old snapshots'.
        raise RunRefused(_finished(manifest, record, paths, layout))
    owner = _claimed(storage, paths)
    report = display.line
    janitor, image = await _prepared(
        manifest, record, storage, paths, owner=owner, report=report, restore_from=restore_from
    )
    launcher = LocalLauncher(manifest, manifest_path.parent.resolve(), paths, layout.root, owner)
    launcher.on_launch = lambda driver: report(
        f"driver pid {driver.pid}, log {paths.driver_log(record.attempt)}"
    )

    conditions: list[dict[str, Any]] = []

    async def save(current: JobRecord) -> None:
        status = render_status(current, now=time.time(), previous_conditions=conditions)
        conditions[:] = status["conditions"]
        StatusFile(
            path=paths.status_file,
            name=manifest.name,
            namespace=manifest.namespace,
            status=status,
            driver_pid=launcher.driver_group(),
        ).write()

    def on_notice(notice: Notice) -> None:
        if notice.reason == "RequestDeclined" and interrupts.asked_for(notice.label):
            # Ctrl-C's savepoint cannot be taken (an executor is missing, the query has
            # not committed a batch yet): the user asked to stop, so stop without one
            # rather than keep running. One line: the request was the runtime's own.
            interrupts.cannot_take_savepoint(notice.message.partition(": ")[2])
            return
        if control.notice(notice):
            return
        display.notice(notice)
        if notice.reason == "CheckpointFailed" and interrupts.asked_for(notice.label):
            interrupts.savepoint_failed()
        elif notice.reason in _JOB_ENDED:
            interrupts.job_ended()

    restart_policy = manifest.spec.restart_policy
    if agent_start_timeout is not None:  # `run --agent-timeout` over the manifest's
        restart_policy = dataclasses.replace(restart_policy, start_timeout=agent_start_timeout)
    supervisor = JobSupervisor(
        config=manifest.coordinator_config(),
        restart_policy=restart_policy,
        launcher=launcher,
        janitor=janitor,
        save=save,
        record=record,
        initial_savepoint=manifest.spec.restore.initial_savepoint_path,
        report=on_notice,
        observer=None if metrics is None else metrics.job(manifest.namespace, manifest.name),
        storage=layout,
        restorable_check=local_restorable_check(manifest, layout, driver_environment(manifest)),
    )

    # shutdown.drain: process all available input before the savepoint (stop --drain).
    after = AfterCompletion.DRAIN if manifest.spec.shutdown.drain else AfterCompletion.STOP
    interrupts = _Interrupts(supervisor, after, report)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, interrupts.interrupt)
        loop.add_signal_handler(signal.SIGTERM, interrupts.terminate)
        loop.add_signal_handler(signal.SIGHUP, interrupts.hang_up)
    # A line may be written from any thread (a log record): the loop acts on it.
    display.when_closed(lambda: loop.call_soon_threadsafe(interrupts.output_closed))
    if image is not None:
        withdrawn = supervisor.restore_from(image.candidate, stored_as=image.own)
        newer = supervisor.passed_over
        instead = f" instead of the newest image, {newer[0]}" if newer else ""
        report(f"restoring {image.candidate} (--from){instead}")
        if withdrawn is not None:
            report(
                f"{withdrawn.describe()} was due for deletion; restored from, it stays in "
                "storage: delete it yourself once it is no longer needed"
            )
    job = f"{manifest.namespace}/{manifest.name}"
    # `spark-checkpoint status`, `savepoint`, `stop` and `cancel` from another terminal.
    async with (
        serve_controls(
            ControlPaths(paths.control_dir), supervisor, job, launcher.driver_pid, report
        ) as control,
        display.showing(supervisor),
    ):
        outcome = await supervisor.run()
    _summarize(display, supervisor, outcome, paths.status_file)
    return outcome


def _summarize(
    display: RunDisplay, supervisor: JobSupervisor, outcome: TerminalOutcome, status_file: Path
) -> None:
    display.summary(
        outcome,
        supervisor.record,
        status_file,
        unconfirmed_restores=supervisor.unconfirmed_restores,
    )
    if outcome is TerminalOutcome.FAILED and supervisor.set_aside:
        display.line(set_aside_hint(supervisor.set_aside))


def set_aside_hint(images: Sequence[str]) -> str:
    """What a failed job's user can still restore: a plain run would not (a newcomer, told
    to "restore the newest image", ran it again and failed the same way)."""
    return (
        f"not restored from again unless named: {', '.join(images)} (`spark-checkpoint list` "
        f"says why); `run --from {images[0]}` restores the newest of them"
    )


# Phases in which a savepoint request could only be declined: no driver's query runs.
# The notices of the job's end in this run (`JobSupervisor._terminate`).
_JOB_ENDED = frozenset(f"Job{outcome.value}" for outcome in TerminalOutcome)


OUTPUT_CLOSED = "the output was closed"


class _Interrupts:
    """Ctrl-C (SIGINT, SIGTERM, SIGHUP): a savepoint, then the job stops; a second one stops the
    driver without a savepoint. A savepoint that fails leaves the job running, and the next
    one asks again. A run whose output goes away (``run ... | head``) stops
    as on Ctrl-C (Python would die of the closed pipe, its driver with it, its status left
    Running); that is no Ctrl-C of the user's, so their first one still takes a savepoint
    (the pipe's reader gets it too, and may close the pipe first)."""

    def __init__(
        self, supervisor: JobSupervisor, after: AfterCompletion, report: Callable[[str], None]
    ) -> None:
        self._supervisor = supervisor
        self._after = after
        self._report = report
        self._count = 0
        self._stopping = False
        self._why = "interrupted"  # what asked for the savepoint
        self._key = "Ctrl-C"  # and how to ask again
        self._label: str | None = None  # its savepoint's, in the log and the history
        self._stopping_without_savepoint = False  # the driver stops without one
        self._finishing = False  # the stop waits for the finishing driver's exit
        self._job_ended = False  # in this run (the record's phase is the last run's at first)

    def interrupt(self) -> None:
        self._signalled("interrupted", "Ctrl-C", "ctrl-c")

    def terminate(self) -> None:
        """SIGTERM (`kill`, a service manager stopping a detached run): as Ctrl-C."""
        self._signalled("terminated (SIGTERM)", "SIGTERM", "sigterm")

    def hang_up(self) -> None:
        """SIGHUP (the terminal closed, an SSH session dropped): as SIGTERM. Python's own
        answer ended the run at once, without a savepoint or a line, its status Running."""
        self._signalled("hung up (SIGHUP)", "SIGHUP", "sighup")

    def asked_for(self, label: str) -> bool:
        """Whether `label` is this run's stop savepoint's (not a `savepoint` command's)."""
        return label == self._label

    def _signalled(self, why: str, key: str, label: str) -> None:
        again = f"{key} again to cancel"
        self._key = key
        self._count += 1
        if self._job_ended:
            # Nothing left to stop or cancel: "stopping the driver without a savepoint; its
            # checkpoints are discarded" after "job finished" alarmed (a newcomer's).
            self._report(f"{why}: the job has ended; the run ends with its cleanup")
        elif self._stopping_without_savepoint:
            # Cancelling would gain nothing (the driver stops already) and could discard
            # the checkpoints (retentionPolicy RetainOnFailure).
            self._report(f"{why}: the driver is already stopping without a savepoint")
        elif self._finishing and self._count > 1:
            # Not a cancellation, which could discard the checkpoints the next run commits.
            self._stopping_without_savepoint = True
            self._report(
                f"{why} again: stopping the finishing driver now; the job is Finished if its "
                "sinks committed the final checkpoint, else Suspended (the next run commits it)"
            )
            self._supervisor.suspend_now()
        elif self._finishing:  # the first signal of the user's, after the output closed
            self._waiting_for_finish(why)
        elif self._count > 1 and (ended := self._supervisor.outcome) is not None:
            # Only the end's storage cleanup is left (storage that does not answer held it):
            # nothing is cancelled or discarded.
            self._report(
                f"{why} again: the job ended {ended.value}; stopping its storage cleanup "
                "(what it left stays in storage until a run of the job cleans up)"
            )
            self._supervisor.cancel()
        elif self._count > 1 and self._supervisor.record.phase is JobPhase.SUSPENDING:
            # The stop's savepoint completed, the driver only exits: no cancellation, which
            # said "without a savepoint" and discarded the checkpoints (a newcomer's).
            self._report(
                f"{why} again: the stop's savepoint completed; stopping the driver now, the "
                "job ends Suspended with its checkpoints"
            )
            self._supervisor.suspend_now()
        elif self._count > 1:
            self._report(
                f"{why} again: stopping the driver without a savepoint; "
                + self._supervisor.what_cancelling_leaves()
            )
            self._supervisor.cancel()
        elif self._stopping:
            self._report(f"{why}: the savepoint is under way ({again})")
        else:
            self._stop(why, again, label)

    def job_ended(self) -> None:
        self._job_ended = True

    def output_closed(self) -> None:
        if not self._stopping:
            self._stop(OUTPUT_CLOSED, "Ctrl-C twice to cancel", "output closed")

    def cannot_take_savepoint(self, reason: str) -> None:
        if self._supervisor.finishing:  # its final checkpoint completed as the stop came
            self._waiting_for_finish(self._why)
            return
        self._without_savepoint(self._why, reason)

    def _waiting_for_finish(self, why: str) -> None:
        """The driver exits on its own: nothing to stop, unless the user insists. The stop
        is recorded: a driver that fails on its way out ends the job Suspended, not
        restarted."""
        self._finishing = True
        self._report(f"{why}: {FINISHING_NEEDS_NO_SAVEPOINT} ({self._key} again to stop it now)")
        self._supervisor.end_suspended()

    def savepoint_failed(self) -> None:
        """The stop's savepoint failed (its line says why): as after a failed `flink stop`,
        the job runs on, and the next signal asks for a stop again."""
        if not self._stopping or self._stopping_without_savepoint:
            return
        if self._why == OUTPUT_CLOSED:  # no one is left to ask again
            self._without_savepoint(self._why, "its savepoint failed")
            return
        self._stopping = False
        self._count = 0
        self._report(
            f"not stopping: the job keeps running without the savepoint ({self._key} to try "
            f"again; twice to stop without a savepoint)"
        )

    def _stop(self, why: str, cancel: str, label: str) -> None:
        self._stopping = True
        self._why = why
        self._label = label
        if self._supervisor.finishing:
            self._waiting_for_finish(why)
            return
        if self._supervisor.record.phase in NO_QUERY_RUNNING:
            self._without_savepoint(why, "its query is not running yet")
            return
        what = "draining the input, then " if self._after is AfterCompletion.DRAIN else ""
        self._report(f"{why}: {what}taking a savepoint, then stopping ({cancel})")
        self._supervisor.request(
            TriggerRequested(CheckpointKind.SAVEPOINT, after=self._after, label=label)
        )

    def _without_savepoint(self, why: str, reason: str) -> None:
        self._stopping_without_savepoint = True
        self._report(
            f"{why}: no savepoint can be taken now: {reason}; stopping the driver without "
            f"one ({next_run(self._supervisor)})"
        )
        self._supervisor.suspend_now()


LOG_TAIL_BYTES = 64 * 1024


def _log_tail(log_file: Path) -> str:
    try:
        with log_file.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def _head(error_file: Path) -> str:
    try:
        with error_file.open("rb") as reported:
            return reported.read(LOG_TAIL_BYTES).decode(errors="replace")
    except OSError:
        return ""


def _checkpoint_storage(manifest: JobManifest, layout: JobStorageLayout) -> CheckpointStorage:
    """The job's storage, its own filesystem (one fsspec made before holds this process's
    credentials); RunRefused naming it as `storage_field` does."""
    try:
        return CheckpointStorage(layout, fresh=True)
    except (ValueError, ImportError, OSError) as error:  # no library for it (gcsfs, libhdfs)
        raise RunRefused(
            f"{storage_field(manifest)} {layout.root!r}: {first_line(error)}"
        ) from None


def check_storage_unchanged(
    record: JobRecord, storage: CheckpointStorage, paths: LocalPaths
) -> None:
    """Refuse a run whose storage is not where the job's registered images are (the
    manifest's spec.checkpointing.storage changed between runs): its restore would find
    none of them and fail the job, and its garbage collection could not read them."""
    registry = record.coordinator
    *store, job_root = storage.fs.place(storage.layout.job_root)
    # Versions before local_uri registered a local storage's paths percent-encoded (a
    # space as %20); their storage, moved as the run asks, is where they say.
    encoded = f"{Path(job_root).as_uri()}/" if job_root.startswith("/") else None

    def here(path: str) -> bool:
        if encoded is not None and path.startswith(encoded):
            return True
        try:
            image_root = parse_snapshot_address(snapshot_uri(path)).layout.job_root
        except ValueError:  # a path this version would not have written
            return False
        # Where its job directory is, not the image: a link inside the job's directory
        # (refused where it is met) does not move the job's storage elsewhere.
        return storage.fs.place(image_root) == (*store, job_root)

    images = (*registry.savepoints, *registry.checkpoints)
    elsewhere = [image for image in images if not here(image.path)]
    if not elsewhere:
        return
    # The newest image a restore can use (ids are in completion order, one counter for
    # both kinds): an older one would replay batches the output already holds.
    failed = {entry.source for entry in record.unrestorable}
    usable = [
        i
        for i in elsewhere
        if RestoreCandidate.registered(i.kind, i.checkpoint_id).encode() not in failed
    ]
    newest = max(usable or elsewhere, key=lambda image: image.checkpoint_id)
    shown = job_root if storage.fs.is_local else storage.layout.job_root  # with its account
    try:
        ran_in = parse_snapshot_address(snapshot_uri(newest.path)).layout.job_root
        before = f"in {ran_in.removeprefix('file://')}, "
    except ValueError:  # a path this version would not have written
        before = ""
    raise RunRefused(
        f"spec.checkpointing.storage: the job's checkpoints and savepoints are not in "
        f"{shown} but {before}where it ran before; set it back, or start the job afresh on "
        f"this storage from its newest {newest.kind.value} there: delete its state "
        f"{paths.job_dir} and run --from {newest.path}"
    )


def _checked_images(
    manifest: JobManifest, record: JobRecord, storage: CheckpointStorage, restore_from: str | None
) -> ChosenImage | None:
    """The image ``run --from`` names, and the initial savepoint, checked before Spark
    starts, as the driver would read them."""
    initial = _initial_savepoint(manifest, record)
    if restore_from is None and initial is None:
        return None
    with driver_environment_here(manifest):
        storage = _checkpoint_storage(manifest, storage.layout)
        image = None if restore_from is None else _chosen(restore_from, "--from", record, storage)
        if initial is not None:
            _chosen(initial, "spec.restore.initialSavepointPath", record, storage)
    return image


def _initial_savepoint(manifest: JobManifest, record: JobRecord) -> str | None:
    """The initial savepoint, if the job starts from it: it has no images of its own."""
    registry = record.coordinator
    if registry.checkpoints or registry.savepoints:
        return None
    return manifest.spec.restore.initial_savepoint_path or None


def _chosen(
    choice: str, named_by: str, record: JobRecord, storage: CheckpointStorage
) -> ChosenImage:
    try:
        return chosen_image(choice, record.coordinator, storage)
    except UnknownImage as error:
        raise RunRefused(f"{named_by}: {error}") from None


def _tell_unrecorded_end(
    record: JobRecord, paths: LocalPaths, report: Callable[[str], None]
) -> None:
    """A run ends by recording how; one that did not was killed (`status` says the same)."""
    if paths.status_file.exists() and record.phase.value not in set(TerminalOutcome):
        report(
            f"the last run (attempt {record.attempt}) ended without recording how "
            f"(killed?) while {record.phase.value}"
        )


def _stop_leftover_driver(paths: LocalPaths, report: Callable[[str], None]) -> None:
    """A driver of an earlier run whose runtime was killed must be gone before a new one
    starts: two drivers of one job would commit the same output."""
    status_file = StatusFile.read(paths.status_file)
    pid = None if status_file is None else status_file.driver_pid
    if pid is None:
        return
    # Only a group of this job's driver (pids get reused): an environment in it names this
    # job's work directory. The driver itself may be gone and its JVM still there.
    marker = f"SPARK_CHECKPOINT_WORK_DIR={paths.work_dir}".encode()
    for member in _group_members(pid):
        try:
            environment = Path(f"/proc/{member}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environment:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                report(f"stopped driver {pid} left over from an earlier run")
            return


def _group_members(group: int) -> list[int]:
    """The processes of process group ``group`` (from /proc)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 2 and fields[2] == str(group):
            members.append(int(entry.name))
    return members
