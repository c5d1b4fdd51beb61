"""Where a local run (``spark-checkpoint run``) keeps a job's state on this machine:
``<state_dir>/<namespace>/<job>/...``, read back by the storage commands."""

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage.durability import fsync_path
from spark_checkpoint_operator.manifest.model import JobManifest

STATE_DIR_NAME = ".spark-checkpoint"


@dataclass(frozen=True, slots=True)
class LocalPaths:
    """Where a local run keeps its things: ``<state_dir>/<namespace>/<job>/...``."""

    job_dir: Path

    @property
    def status_file(self) -> Path:
        return self.job_dir / "status.json"

    @property
    def work_dir(self) -> Path:
        return self.job_dir / "work"

    @property
    def logs_dir(self) -> Path:
        return self.job_dir / "logs"

    def driver_log(self, attempt: int) -> Path:
        return self.logs_dir / f"driver-{attempt}.log"

    def driver_error_file(self, attempt: int) -> Path:
        """Where the attempt's driver writes the error it fails with (`report_error`)."""
        return self.logs_dir / f"driver-{attempt}.error"

    @property
    def token_file(self) -> Path:
        return self.job_dir / "agent-token"

    @property
    def registry_id_file(self) -> Path:
        """The random id of the registry this state directory keeps (`local_owner`)."""
        return self.job_dir / "registry-id"

    @property
    def lock_file(self) -> Path:
        return self.job_dir / "run.lock"

    @property
    def control_dir(self) -> Path:
        """The control socket and its token (spark_checkpoint_operator.control)."""
        return self.job_dir / "control"

    @property
    def default_storage(self) -> str:
        return (self.job_dir.parent.parent / "storage").resolve().as_uri()


def default_state_dir(manifest_path: Path) -> Path:
    """Next to the manifest, so that every command finds a job's state and default storage
    whichever directory it is run from."""
    return manifest_path.parent / STATE_DIR_NAME


def local_paths(manifest: JobManifest, state_dir: Path) -> LocalPaths:
    return local_job_paths(state_dir, manifest.namespace, manifest.name)


def local_job_paths(state_dir: Path, namespace: str, job: str) -> LocalPaths:
    return LocalPaths(state_dir.resolve() / namespace / job)


def local_owner(paths: LocalPaths) -> StorageOwner:
    """The registry this state directory keeps of the job, as its storage records it
    (`StorageOwner`): an id made at its first run and kept beside its status (durably:
    storage claimed for an id the state directory lost would refuse it), so that a state
    directory that is moved stays the same registry and a copy of the manifest run
    elsewhere is another. OSError, or ValueError for a file that holds no id."""
    target = paths.registry_id_file
    if not target.exists():
        # Written whole under another name and linked: a crash leaves no empty id behind.
        temporary = target.with_name(f".{target.name}.{os.getpid()}")
        with temporary.open("w") as registry_file:
            registry_file.write(f"{uuid.uuid4().hex}\n")
            registry_file.flush()
            os.fsync(registry_file.fileno())
        try:
            os.link(temporary, target)
        except FileExistsError:
            pass  # another run made it first: that one is the id
        finally:
            temporary.unlink()
        fsync_path(str(target.parent))
    registry_id = target.read_text().strip()
    return StorageOwner(id=registry_id, description=f"the state directory {paths.job_dir}")
