"""Where a local run (``spark-checkpoint run``) keeps a job's state on this machine:
``<state_dir>/<namespace>/<job>/...``, read back by the storage commands."""

import contextlib
import errno
import fcntl
import json
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage import SymbolicLinkError, local_uri
from spark_checkpoint.storage.durability import fsync_path
from spark_checkpoint_operator.local_files import UnreadableFile, read_small_text
from spark_checkpoint_operator.manifest.model import JobManifest

STATE_DIR_NAME = ".spark-checkpoint"
MAX_RECORD_BYTES = 64 << 10  # a registry record is an id and a path


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
        return local_uri(self._default_storage_dir)

    @property
    def _default_storage_dir(self) -> Path:
        return (self.job_dir.parent.parent / DEFAULT_STORAGE_DIR_NAME).resolve()

    def storage_left_percent_encoded(self) -> Path | None:
        """The job's directory in the default storage where earlier versions put it when
        the state directory's path has a character a URI encodes (a space, non-ASCII): its
        percent-encoded path taken as it is (``my%20project``). None if nothing is there."""
        here = self._default_storage_dir
        earlier = Path(here.as_uri().removeprefix("file://"))
        job = earlier / self.job_dir.parent.name / self.job_dir.name
        return job if earlier != here and job.exists() else None


def default_state_dir(manifest_path: Path) -> Path:
    """Next to the manifest, so that every command finds a job's state and default storage
    whichever directory it is run from."""
    return manifest_path.parent / STATE_DIR_NAME


# The default storage's directory in a state directory, beside the namespaces' directories.
DEFAULT_STORAGE_DIR_NAME = "storage"


def local_paths(manifest: JobManifest, state_dir: Path) -> LocalPaths:
    return local_job_paths(state_dir, manifest.namespace, manifest.name)


def storage_field(manifest: JobManifest) -> str:
    """What a message calls the job's checkpoint storage: the manifest's field, or (the
    state directory's default) plain ``storage``."""
    return "spec.checkpointing.storage" if manifest.spec.checkpointing.storage else "storage"


def local_job_paths(state_dir: Path, namespace: str, job: str) -> LocalPaths:
    return LocalPaths(state_dir.resolve() / namespace / job)


class UnsafeStateDirectory(Exception):
    """The job's state directory is a symbolic link or another user's; the message says
    which, naming it."""


def make_private_job_directory(paths: LocalPaths) -> None:
    """Make the state directory, its default storage and the job's directory if missing;
    the last two owner-only: the job's holds the run's tokens, control socket and driver
    logs, the default storage the job's checkpoints (readable by anyone otherwise). A state
    directory this makes is owner-only too; one that is there already is left as it is,
    unless it is another user's or every user's to write in (as /tmp), which is refused:
    its owner, or anyone, could swap what is below it. One that is a symbolic link is
    refused (UnsafeStateDirectory): the tokens and socket would go where the link points.
    OSError if it cannot be made."""
    state_dir = paths.job_dir.parent.parent
    holding = "the job's checkpoints, tokens and control socket"
    try:
        state_dir.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        _require_own_directory(state_dir, "the state directory", holding)
    else:
        _make_owner_only(state_dir, "the state directory", holding)
    storage_dir = state_dir / DEFAULT_STORAGE_DIR_NAME
    storage_dir.mkdir(mode=0o700, exist_ok=True)
    # Followed if it is a link (to a larger disk, say), as storage follows its root.
    _make_owner_only(
        storage_dir.resolve(), "the default storage's directory", "the job's checkpoints"
    )
    paths.job_dir.mkdir(parents=True, exist_ok=True)
    _make_owner_only(
        paths.job_dir, "the job's state directory", "the run's tokens and control socket"
    )


def _require_own_directory(directory: Path, name: str, holding: str) -> None:
    """``directory``, there already, is this user's and no other user may write in it."""
    with _opened_directory(directory, name, holding) as descriptor:
        status = os.fstat(descriptor)
        _require_owner(status, directory, name, holding)
        if status.st_mode & stat.S_IWOTH:
            raise UnsafeStateDirectory(
                f"{name} {directory} is every user's to write in, who could swap {holding}: "
                "give --state-dir a directory of your own"
            )


def _make_owner_only(directory: Path, name: str, holding: str) -> None:
    with _opened_directory(directory, name, holding) as descriptor:
        _require_owner(os.fstat(descriptor), directory, name, holding)
        os.fchmod(descriptor, 0o700)


@contextlib.contextmanager
def _opened_directory(directory: Path, name: str, holding: str) -> Iterator[int]:
    try:
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and directory.is_symlink():
            raise UnsafeStateDirectory(
                f"{name} {directory} is a symbolic link (to {os.readlink(directory)}): never "
                f"followed, since {holding} would go there; make it a directory"
            ) from None
        raise
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def _require_owner(status: os.stat_result, directory: Path, name: str, holding: str) -> None:
    if status.st_uid != os.getuid():
        raise UnsafeStateDirectory(
            f"{name} {directory} belongs to another user (uid {status.st_uid}), who could "
            f"swap {holding}: give --state-dir a directory of your own"
        )


def local_owner(paths: LocalPaths, *, own_storage: bool) -> StorageOwner:
    """The registry this state directory keeps of the job, as its storage records it
    (`StorageOwner`), from ``registry-id`` beside its status: the registry's id and the
    directory it was made in. A state directory that was moved (or is reached by another
    path) stays the same registry. A copy whose original still holds the id raises
    CopiedStateDirectory, unless the job's storage is the state directory's own
    (``own_storage``: the default, copied with it), which makes the copy a job of its own.
    Call it under the job's lock. OSError, or ValueError for a file that holds no record."""
    here = str(paths.job_dir)
    record = RegistryRecord.read(paths.registry_id_file)
    if record is None:
        record = RegistryRecord(uuid.uuid4().hex, here)
        record.write(paths.registry_id_file)
    elif not record.made_in(paths.job_dir):
        original = record.state_directory
        if not own_storage and _holds(Path(original), record.id):
            raise CopiedStateDirectory(
                f"{here} is a copy of the state directory {original}, whose registry of "
                "the job's snapshots it lists: run the job from there, or delete "
                f"{here} to run this copy as a new job (on storage of its own: "
                "spec.checkpointing.storage)"
            )
        record = RegistryRecord(record.id, here)
        record.write(paths.registry_id_file)
    return StorageOwner(id=record.id, description=_description(here, record.id))


def _description(here: str, registry_id: str) -> str:
    return f"the state directory {here} (registry {registry_id[:8]})"


def made_here_before(owner: StorageOwner, paths: LocalPaths) -> bool:
    """Whether `owner` is a registry this state directory kept of the job before its
    records of the job were deleted (its `registry-id` with them)."""
    return owner.description == _description(str(paths.job_dir), owner.id)


def _same_directory(recorded: str, here: str) -> bool:
    """Whether two paths name one directory (a bind mount, a case-insensitive filesystem)."""
    try:
        return os.path.samefile(recorded, here)
    except OSError:
        return False


class CopiedStateDirectory(Exception):
    """A state directory copied with its registry, while the original keeps it: two
    registries would list the same snapshots."""


@dataclass(frozen=True, slots=True)
class RegistryRecord:
    """What ``registry-id`` holds: the registry's id and the state directory it was last
    run from (`local_owner` keeps it up to date)."""

    id: str
    state_directory: str

    def made_in(self, job_dir: Path) -> bool:
        """Whether the record names ``job_dir`` (by another path too: a bind mount, a
        case-insensitive filesystem); else the state directory was moved or copied."""
        here = str(job_dir)
        return self.state_directory == here or _same_directory(self.state_directory, here)

    @classmethod
    def read(cls, path: Path) -> "RegistryRecord | None":
        """The record at ``path``, None if there is none."""
        try:
            document = json.loads(read_small_text(path, MAX_RECORD_BYTES))
        except FileNotFoundError:
            return None
        except UnreadableFile as error:
            raise ValueError(str(error)) from None
        except RecursionError:
            raise ValueError("not a JSON document: nested too deeply") from None
        except ValueError as error:  # also an integer of over 4300 digits
            raise ValueError(f"not a JSON document: {error}") from None
        if not (
            isinstance(document, dict)
            and isinstance(document.get("id"), str)
            and document["id"]
            and isinstance(document.get("stateDirectory"), str)
        ):
            raise ValueError('expected {"id": "...", "stateDirectory": "..."}')
        return cls(document["id"], document["stateDirectory"])

    def write(self, path: Path) -> None:
        """Written whole and durably (storage claimed for an id the state directory lost
        would refuse it) under another name, then renamed over the old one."""
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            with open_state_file(temporary) as record_file:
                document = {"id": self.id, "stateDirectory": self.state_directory}
                record_file.write(json.dumps(document).encode())
                record_file.flush()
                os.fsync(record_file.fileno())
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        fsync_path(str(path.parent))


def _holds(job_dir: Path, registry_id: str) -> bool:
    """Whether the state directory ``job_dir`` (another one's) keeps registry ``registry_id``."""
    try:
        record = RegistryRecord.read(LocalPaths(job_dir).registry_id_file)
    except (OSError, ValueError):
        return False
    return record is not None and record.id == registry_id


def open_state_file(path: Path, *, append: bool = False) -> BinaryIO:
    """A file of the state directory opened for writing, never through a symbolic link: one
    placed there would have a run append to, or truncate, whatever it points at. A log
    appended to refuses one (SymbolicLinkError naming it); a file written anew (a
    temporary, renamed into place) is this process's own: whatever has its name is
    removed first, a link included (not what it points at)."""
    if append:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    else:
        path.unlink(missing_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # O_EXCL: no link is followed
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise SymbolicLinkError(str(path), os.readlink(path), "the state directory") from None
        raise
    return os.fdopen(descriptor, "ab" if append else "wb")


def run_lock_holder(paths: LocalPaths) -> str | None:
    """The pid the run holding the job's lock wrote into it (a run starts serving control
    commands only after its claim of the storage, which may take long); None when no run
    holds it. Asked with a shared lock, let go at once."""
    try:
        descriptor = os.open(paths.lock_file, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(descriptor, 200).decode(errors="replace").strip() or "unknown"
    except OSError:
        return None
    finally:
        os.close(descriptor)
    return None
