"""A job's checkpoint storage and its registry, as the command line names them."""

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from spark_checkpoint.protocol import RestoreCandidate
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointStorage,
    JobStorageLayout,
    first_line,
)
from spark_checkpoint_operator.cli_conventions import OptionError, job_options, storage_option
from spark_checkpoint_operator.local_environment import driver_environment_here
from spark_checkpoint_operator.local_state import (
    STATE_DIR_NAME,
    LocalPaths,
    default_state_dir,
    local_job_paths,
    local_paths,
    storage_field,
)
from spark_checkpoint_operator.manifest.loading import load_manifest
from spark_checkpoint_operator.manifest.model import JobManifest
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.status import RegisteredSnapshots, StatusFile, StatusFileError


class CommandError(Exception):
    """The command cannot run as asked (exit code 2); the message says why."""


class StorageUnusable(CommandError):
    """The job's storage cannot be opened here: no credentials, no library for its
    protocol (exit code 1, as storage that cannot be read)."""


@dataclass(frozen=True, slots=True)
class StorageSource:
    """Where a job's storage is, as given on the command line: a manifest, or explicit
    ``storage``, ``namespace`` and ``job``. ``state_dir`` is where ``spark-checkpoint run``
    keeps the job's status file (and, for a manifest without ``checkpointing.storage``,
    its default storage); by default next to the manifest, as for ``run``, else in the
    current directory."""

    manifest: Path | None = None
    storage: str | None = None
    namespace: str | None = None
    job: str | None = None
    state_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class JobStorage:
    """A job's checkpoint storage and the local state directory of its registry."""

    storage: CheckpointStorage
    paths: LocalPaths
    # The manifest's variables a Secret gives the pods that this process lacks (storage
    # credentials, perhaps), as `JobSpec.unset_secret_variables` says them.
    unset_secrets: str | None = None
    # What a message calls the storage: `local_state.storage_field`, or (--job) ``storage``.
    named: str = "storage"

    @property
    def status_file(self) -> Path:
        return self.paths.status_file

    @property
    def layout(self) -> JobStorageLayout:
        return self.storage.layout


@contextlib.contextmanager
def opened_job_storage(source: StorageSource) -> Iterator[JobStorage]:
    """Resolve ``source`` (raise CommandError naming what is wrong); with a manifest, this
    process has the driver's environment meanwhile, as `run` reads the storage (the
    manifest's endpoint, region or credentials)."""
    if source.manifest is None:
        yield _opened(source, None)
        return
    if source.storage is not None or source.namespace is not None or source.job is not None:
        raise CommandError(
            "-f FILE names the job and its storage: do not combine it with "
            "--storage, --namespace or --job"
        )
    try:
        manifest = load_manifest(source.manifest)
    except ManifestError as error:
        raise CommandError(str(error)) from error
    with driver_environment_here(manifest):
        yield _opened(source, manifest)


def _opened(source: StorageSource, manifest: JobManifest | None) -> JobStorage:
    if manifest is not None:
        assert source.manifest is not None
        paths = local_paths(manifest, source.state_dir or default_state_dir(source.manifest))
        root = manifest.spec.checkpointing.storage or paths.default_storage
        named = storage_field(manifest)  # as `run` names it
        namespace, job = manifest.namespace, manifest.name
        unset_secrets = manifest.spec.unset_secret_variables(os.environ)
    else:
        unset_secrets = None
        named = "storage"
        if not source.job:
            raise CommandError("give either -f FILE or --job (and --namespace, --storage)")
        try:
            namespace, job = job_options(source.namespace, source.job)
            paths = local_job_paths(source.state_dir or Path(STATE_DIR_NAME), namespace, job)
            # Without --storage, the state directory's default storage, as `status --job`
            # finds the run there.
            root = (
                paths.default_storage
                if source.storage is None
                else (storage_option(source.storage))
            )
        except OptionError as error:
            raise CommandError(str(error)) from None
    try:
        # Validates namespace and job before they become part of any local path.
        layout = JobStorageLayout(root, namespace, job)
    except ValueError as error:
        raise CommandError(f"{named} {root!r}: {first_line(error)}") from error
    try:
        storage = CheckpointStorage(layout)
    except (ValueError, ImportError, OSError) as error:  # no credentials, libhdfs, gcsfs
        reason = f"{named} {root!r}: {first_line(error)}"
        raise StorageUnusable(reason + unset_secrets_hint(unset_secrets)) from error
    return JobStorage(storage, paths, unset_secrets, named)


def unset_secrets_hint(unset_secrets: str | None) -> str:
    """What to add to a failure of storage for the manifest's Secret variables this
    process lacks (an object store's credentials); "" if none."""
    if not unset_secrets:
        return ""
    return f"; {unset_secrets}: the storage commands take such variables from their own environment"


@dataclass(frozen=True, slots=True)
class Registry:
    """The snapshots the coordinator registered, from a local status file."""

    source: Path
    registered: RegisteredSnapshots
    refused_by_run: str | None = None  # why `run` refuses the status file, if it does

    def ids(self, kind: CheckpointKind) -> frozenset[int]:
        return self.registered.of(kind)

    def lists(self, kind: CheckpointKind, snapshot_id: int) -> bool:
        return snapshot_id in self.ids(kind)

    def label(self, kind: CheckpointKind, snapshot_id: int) -> str:
        """Who asked for the snapshot ("periodic", "upgrade", "nonce 3"); "" if unknown."""
        return self.registered.labels.get(
            RestoreCandidate.registered(kind, snapshot_id).encode(), ""
        )

    def unrestorable(self, kind: CheckpointKind, snapshot_id: int) -> str | None:
        """Why the job does not restore from the snapshot any more; None if it does."""
        candidate = RestoreCandidate.registered(kind, snapshot_id).encode()
        return self.registered.unrestorable.get(candidate)


def load_registry(status_file: Path) -> Registry | None:
    """The registry in ``status_file``, read leniently (a status file of another version
    still says which snapshots are registered); None if there is no such file. Raises
    StatusFileError naming the file and the field."""
    found = StatusFile.read(status_file)
    if found is None:
        return None
    registry = Registry(status_file, found.registered_snapshots())
    try:
        found.persisted_status()
    except StatusFileError as error:
        return dataclasses.replace(registry, refused_by_run=str(error))
    return registry


def registry_or_warn(job: JobStorage, err: TextIO) -> Registry | None:
    try:
        registry = load_registry(job.status_file)
    except StatusFileError as error:
        print(f"warning: registry ignored: {error}", file=err)
        return None
    if registry is not None and registry.refused_by_run:
        print(
            f"warning: `spark-checkpoint run` refuses this status file: {registry.refused_by_run}",
            file=err,
        )
    return registry


def is_registered(registry: Registry | None, kind: CheckpointKind, snapshot_id: int) -> bool | None:
    """Whether the registry lists the snapshot; None without a registry."""
    return None if registry is None else registry.lists(kind, snapshot_id)
