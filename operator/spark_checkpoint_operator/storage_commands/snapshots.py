"""What a job's storage holds, snapshot by snapshot, and whether its bytes are intact."""

import contextlib
import dataclasses
import difflib
import shlex
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from spark_checkpoint.protocol import MAX_ID, ProtocolError, RestoreCandidate, StorageOwner
from spark_checkpoint.restorable_report import problems_by_image
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    ChecksumMismatchError,
    InvalidMetadataError,
    ManifestEntry,
    MissingFileError,
    NotARegularFileError,
    StorageError,
    SymbolicLinkError,
    TruncatedMetadataError,
    UnknownFormatVersionError,
    missing_bucket_reason,
    parse_snapshot_address,
    parse_snapshot_dir_name,
)
from spark_checkpoint.storage.layout import DISCARDING_FILE_NAME, SHARED_DIR_NAME, storage_place
from spark_checkpoint_operator.local_state import LocalPaths, RegistryRecord
from spark_checkpoint_operator.restorable_check import restorable_command
from spark_checkpoint_operator.restore_choice import snapshot_uri
from spark_checkpoint_operator.storage_commands.job import CommandError, Registry, is_registered


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """A checkpoint or savepoint of the job, written ``KIND:ID`` (``checkpoint:7``)."""

    kind: CheckpointKind
    snapshot_id: int

    def __lt__(self, other: "SnapshotRef") -> bool:
        """The commands' order: by id, numerically (checkpoints and savepoints take their
        ids from one counter, so this is the order they were triggered in); a checkpoint
        before a savepoint of the same id."""
        return (self.snapshot_id, self.kind) < (other.snapshot_id, other.kind)

    @classmethod
    def parse(cls, text: str) -> "SnapshotRef":
        """A registered image as the wire contract spells it (canonical ids only, as in
        storage: `chk-7`, never `chk-07`)."""
        try:
            image: RestoreCandidate | None = RestoreCandidate.decode(text)
        except ProtocolError:
            image = None
        if image is None or image.snapshot_id is None:
            kinds = ", ".join(CheckpointKind)
            # A manifest given as `run` takes it (`inspect job.yaml`) is named with -f here.
            manifest = (
                f"; a manifest is named with -f {shlex.quote(text)}"
                if text.endswith((".yaml", ".yml", ".json"))
                else ""
            )
            raise CommandError(
                f"{text!r}: expected KIND:ID with KIND one of {kinds} and ID a whole number "
                f"from 0 to {MAX_ID} without leading 0{manifest}"
            )
        return cls(image.kind, image.snapshot_id)

    def __str__(self) -> str:
        return RestoreCandidate.registered(self.kind, self.snapshot_id).encode()


class StoredSnapshotState(StrEnum):
    """What storage holds of a snapshot (not the agent's progress on one)."""

    COMPLETE = "complete"  # `_metadata` present and valid
    UNREADABLE = "unreadable"  # `_metadata` present but cannot be read or validated
    INCOMPLETE = "incomplete"  # a directory without `_metadata`: in flight or cut short
    DISCARDING = "discarding"  # a discard was started (`_discarding`) and not finished
    MISSING = "missing"  # registered, but storage has no directory for it


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    ref: SnapshotRef
    state: StoredSnapshotState
    path: str
    registered: bool | None
    metadata: CheckpointMetadata | None = None
    error: str | None = None
    unrestorable: str | None = None  # why the job does not restore from it (its registry)
    label: str = ""  # who asked for it, as its registry says


def list_snapshots(storage: CheckpointStorage, registry: Registry | None) -> list[SnapshotRow]:
    """Every snapshot directory in storage, and every registered snapshot storage lacks,
    in the order of `SnapshotRef`."""
    rows: list[SnapshotRow] = []
    layout = storage.layout
    for kind in CheckpointKind:
        names = storage.fs.list_dir(layout.snapshot_parent_dir(kind))
        present = sorted(
            snapshot_id
            for snapshot_id in (parse_snapshot_dir_name(kind, name) for name in names)
            if snapshot_id is not None
        )
        for snapshot_id in present:
            rows.append(_row(storage, SnapshotRef(kind, snapshot_id), registry))
        if registry is not None:
            for snapshot_id in sorted(registry.ids(kind) - set(present)):
                ref = SnapshotRef(kind, snapshot_id)
                path = layout.snapshot_dir(kind, snapshot_id)
                rows.append(SnapshotRow(ref, StoredSnapshotState.MISSING, path, registered=True))
    if registry is not None:
        rows = [
            dataclasses.replace(row, label=registry.label(row.ref.kind, row.ref.snapshot_id))
            for row in rows
        ]
    return sorted(rows, key=lambda row: row.ref)


def _row(storage: CheckpointStorage, ref: SnapshotRef, registry: Registry | None) -> SnapshotRow:
    layout = storage.layout
    registered = is_registered(registry, ref.kind, ref.snapshot_id)
    metadata_path = layout.metadata_path(ref.kind, ref.snapshot_id)
    if storage.has_metadata(ref.kind, ref.snapshot_id):
        try:
            meta = storage.read_metadata(ref.kind, ref.snapshot_id)
        except (StorageError, OSError) as error:
            problem = (
                str(error) if isinstance(error, StorageError) else io_problem(error, metadata_path)
            )
            return SnapshotRow(
                ref, StoredSnapshotState.UNREADABLE, metadata_path, registered, error=problem
            )
        unrestorable = registry.unrestorable(ref.kind, ref.snapshot_id) if registry else None
        return SnapshotRow(
            ref,
            StoredSnapshotState.COMPLETE,
            metadata_path,
            registered,
            meta,
            unrestorable=unrestorable,
        )
    directory = layout.snapshot_dir(ref.kind, ref.snapshot_id)
    if storage.fs.exists(f"{directory}/{DISCARDING_FILE_NAME}"):
        return SnapshotRow(ref, StoredSnapshotState.DISCARDING, directory, registered)
    return SnapshotRow(ref, StoredSnapshotState.INCOMPLETE, directory, registered)


@dataclass(frozen=True, slots=True)
class SharedReuse:
    """How many of a checkpoint's shared files other checkpoints in storage reference."""

    shared_with_others: int
    unreadable: tuple[int, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class InspectedSnapshot:
    """A snapshot's `_metadata` and what the job says of it: whether the registry lists
    it, and (a checkpoint) how many of its shared files other checkpoints reference."""

    ref: SnapshotRef
    metadata_path: str
    registered: bool | None
    metadata: CheckpointMetadata
    reuse: SharedReuse | None


@dataclass(frozen=True, slots=True)
class Inspection:
    snapshots: list[InspectedSnapshot]
    problems: list[str]  # "KIND:ID: what is wrong", one per snapshot that cannot be read


def inspect_snapshots(
    storage: CheckpointStorage, refs: Sequence[SnapshotRef], registry: Registry | None
) -> Inspection:
    """Read the `_metadata` of each of ``refs`` (none: every one in storage), in the order
    of `SnapshotRef`. Raises OSError if storage cannot be listed."""
    if not refs:
        refs = [SnapshotRef(kind, i) for kind in CheckpointKind for i in storage.list_ids(kind)]
    found: dict[SnapshotRef, CheckpointMetadata] = {}
    problems = []
    for ref in sorted(set(refs)):
        try:
            found[ref] = storage.read_metadata(ref.kind, ref.snapshot_id)
        except StorageError as error:
            problems.append(f"{ref}: {_unreadable(storage, ref, error)}")
        except OSError as error:
            where = storage.layout.metadata_path(ref.kind, ref.snapshot_id)
            problems.append(f"{ref}: {io_problem(error, where)}")
    checkpoints = (
        _checkpoint_metadata(storage, found)
        if any(ref.kind is CheckpointKind.CHECKPOINT for ref in found)
        else {}
    )
    snapshots = [
        InspectedSnapshot(
            ref,
            storage.layout.metadata_path(ref.kind, ref.snapshot_id),
            is_registered(registry, ref.kind, ref.snapshot_id),
            meta,
            _shared_reuse(meta, checkpoints),
        )
        for ref, meta in found.items()
    ]
    return Inspection(snapshots, problems)


def _checkpoint_metadata(
    storage: CheckpointStorage, known: Mapping[SnapshotRef, CheckpointMetadata]
) -> dict[int, CheckpointMetadata | None]:
    """Every checkpoint's `_metadata` in storage, None where it cannot be read; each read
    once, however many checkpoints are inspected."""
    found: dict[int, CheckpointMetadata | None] = {}
    try:
        checkpoint_ids = storage.list_ids(CheckpointKind.CHECKPOINT)
    except OSError:
        return found
    for checkpoint_id in checkpoint_ids:
        ref = SnapshotRef(CheckpointKind.CHECKPOINT, checkpoint_id)
        if ref in known:
            found[checkpoint_id] = known[ref]
            continue
        try:
            found[checkpoint_id] = storage.read_metadata(CheckpointKind.CHECKPOINT, checkpoint_id)
        except (StorageError, OSError):
            found[checkpoint_id] = None
    return found


def _shared_reuse(
    meta: CheckpointMetadata, checkpoints: Mapping[int, CheckpointMetadata | None]
) -> SharedReuse | None:
    if meta.kind is not CheckpointKind.CHECKPOINT:
        return None  # savepoints are self-contained
    others: set[str] = set()
    unreadable: list[int] = []
    for checkpoint_id, other in checkpoints.items():
        if checkpoint_id == meta.checkpoint_id:
            continue
        if other is None:
            unreadable.append(checkpoint_id)
        else:
            others |= other.locations
    return SharedReuse(len(shared_locations(meta) & others), tuple(unreadable))


def shared_locations(meta: CheckpointMetadata) -> set[str]:
    return {
        entry.location for entry in meta.files if entry.location.startswith(f"{SHARED_DIR_NAME}/")
    }


@dataclass(frozen=True, slots=True)
class Verification:
    """The outcome of verifying one snapshot: OK when ``problems`` is empty;
    ``restorable``: whether Spark restored it (``--deep``), None if not tried;
    ``unrestorable``: why the job no longer restores from it (its registry), if so."""

    ref: SnapshotRef
    problems: tuple[str, ...]
    files: int = 0
    total_bytes: int = 0
    restorable: bool | None = None
    unrestorable: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_snapshot(
    storage: CheckpointStorage, ref: SnapshotRef, registry: Registry | None
) -> Verification:
    """Read a snapshot's `_metadata` and check every file it lists (size, then SHA-256).

    The checks of ``CheckpointStorage.verify``, except that every bad file is reported
    rather than the first, so that the extent of the damage shows at once. An intact
    image the job no longer restores from (a restored query failed on it) says so.
    """
    try:
        meta = storage.read_metadata(ref.kind, ref.snapshot_id)
    except StorageError as error:
        return Verification(ref, (_unreadable(storage, ref, error),))
    except OSError as error:
        where = storage.layout.metadata_path(ref.kind, ref.snapshot_id)
        return Verification(ref, (io_problem(error, where),))
    problems: list[str] = []
    # A linked directory the files lie below (`shared/`, say) is told once, not per file.
    links: dict[str, SymbolicLinkError] = {}
    files_below = Counter[str]()
    for entry in meta.files:
        stored_path = storage.layout.location_path(entry.location)
        link = next((path for path in links if stored_path.startswith(path + "/")), None)
        try:
            if link is None and (problem := _check_file(storage, entry)):
                problems.append(problem)
        except SymbolicLinkError as error:
            link = error.path
            links[link] = error
        if link is not None:
            files_below[link] += 1
    problems += [
        f"{files_below[path]} of its files lie below {path}, which {error.reason}"
        for path, error in links.items()
    ]
    unrestorable = registry.unrestorable(ref.kind, ref.snapshot_id) if registry else None
    return Verification(
        ref, tuple(problems), len(meta.files), meta.total_bytes, unrestorable=unrestorable
    )


def _check_file(storage: CheckpointStorage, entry: ManifestEntry) -> str | None:
    """What is wrong with the stored bytes of one manifest file, or None."""
    stored_path = storage.layout.location_path(entry.location)
    where = f"{entry.path} at {stored_path}"
    try:
        size = storage.fs.file_size(stored_path)
        if size is None:  # no file there: reading it says what is there instead, if anything
            storage.fs.digest(stored_path)
            return f"missing file: {where}"
        if size != entry.size:
            # Checked first, as CheckpointStorage.verify does: cheap, and what a truncated
            # copy gets wrong.
            return f"size mismatch: {where}: expected {entry.size} bytes, found {size} bytes"
        digest = storage.fs.digest(stored_path)
    except MissingFileError:
        return f"missing file: {where}"
    except NotARegularFileError as error:  # a FIFO or a directory in the file's place
        return f"{where}: {error.reason}"
    except SymbolicLinkError as error:
        if error.path != stored_path:
            raise  # a linked directory: the caller tells it once
        return f"{where}: {error.reason}"
    except StorageError as error:
        return f"I/O error: {where}: {error}"
    except OSError as error:
        return f"I/O error: {where}: {error.strerror or error}"
    if digest.size != entry.size:
        return f"size mismatch: {where}: expected {entry.size} bytes, found {digest.size} bytes"
    if digest.sha256 != entry.sha256:
        return f"checksum mismatch: {where}: expected sha256 {entry.sha256}, found {digest.sha256}"
    return None


def deep_verify(storage: CheckpointStorage, results: list[Verification]) -> list[Verification]:
    """``--deep``: the intact snapshots are also proven restorable by Spark, in a data-plane
    subprocess (``python -m spark_checkpoint.restorable``; see docs/data-plane.md)."""
    intact = [result.ref for result in results if result.ok]
    if not intact:
        return results
    command = restorable_command(storage.layout, [str(ref) for ref in intact])
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        problems = problems_by_image(completed.stdout)
    except ValueError:
        lines = completed.stderr.strip().splitlines() or [f"exit code {completed.returncode}"]
        unchecked = (f"the restore check could not run: {lines[-1]}",)
        return [
            dataclasses.replace(result, problems=unchecked) if result.ok else result
            for result in results
        ]
    return [
        dataclasses.replace(
            result,
            problems=tuple(f"not restorable: {p}" for p in problems.get(str(result.ref), [])),
            restorable=not problems.get(str(result.ref)),
        )
        if result.ok
        else result
        for result in results
    ]


def default_refs(storage: CheckpointStorage, registry: Registry | None) -> list[SnapshotRef]:
    """Every snapshot with a `_metadata` in storage, plus every registered one (a
    registered snapshot missing from storage is exactly what verify must report)."""
    refs = {
        SnapshotRef(kind, snapshot_id)
        for kind in CheckpointKind
        for snapshot_id in storage.list_ids(kind)
    }
    if registry is not None:
        refs |= {SnapshotRef(kind, i) for kind in CheckpointKind for i in registry.ids(kind)}
    return sorted(refs)


def nothing_stored(storage: CheckpointStorage, registry: Registry | None) -> str | None:
    """Why storage without snapshots holds none, when the job's directory does not exist
    at all (a mistyped storage, namespace or name reads as an empty job otherwise); None
    when it exists. Raises StorageError when its bucket does not exist: a listing there
    finds nothing, which read as a job whose images are all gone."""
    job_root = storage.layout.job_root
    if storage.fs.exists(job_root):
        return None
    if (bucket := storage.fs.missing_bucket(job_root)) is not None:
        raise StorageError(job_root, missing_bucket_reason("these", bucket))
    if registry is not None and (elsewhere := _registered_elsewhere(job_root, registry)):
        # A mistyped --storage (or spec.checkpointing.storage) beside the job's registry:
        # the storage root to give instead.
        return (
            f"nothing is stored at {job_root}; the job's registry names checkpoints and "
            f"savepoints in storage {elsewhere.removeprefix('file://')}: is that the "
            "storage it ran with?"
        )
    # A mistyped name: the jobs stored beside it (a newcomer's --job wc-strem); a hint, so
    # storage that cannot be listed there says why where the command reads it.
    try:
        beside = storage.fs.list_dir(job_root.rsplit("/", 1)[0])
    except (StorageError, OSError):
        beside = []
    if close := difflib.get_close_matches(storage.layout.job, beside, n=1):
        return f"nothing is stored at {job_root} (did you mean job {close[0]!r}, stored beside it?)"
    return (
        f"nothing is stored at {job_root} (has the job run with this storage, namespace and name?)"
    )


def _registered_elsewhere(job_root: str, registry: Registry) -> str | None:
    """The storage root of the registered images, if they are not below `job_root`."""
    for path in sorted(registry.registered.paths, reverse=True):
        try:
            theirs = parse_snapshot_address(snapshot_uri(path)).layout
        except ValueError:
            continue  # a path this version would not have written
        if storage_place(theirs.job_root) != storage_place(job_root):
            return theirs.root
    return None


@dataclass(frozen=True, slots=True)
class Ownership:
    """What the job's `owner.json` says: the registry that owns its storage (None: no
    registry claimed it yet), or why it cannot be read; and the registry of this state
    directory (its ``registry-id``; None: it has none), to tell whose that is."""

    owner: StorageOwner | None
    problem: str | None = None
    registry_here: str | None = None
    moved_here: bool = False  # this state directory's registry, last run elsewhere

    @property
    def is_this_registry(self) -> bool | None:
        """Whether the owner is the registry of this state directory; None if unknown."""
        if self.owner is None or self.registry_here is None:
            return None
        return self.owner.id == self.registry_here


def read_ownership(storage: CheckpointStorage, paths: LocalPaths) -> Ownership:
    try:
        owner = storage.recorded_owner()
    except StorageError as error:
        return Ownership(None, storage_problem(error))
    try:
        here = RegistryRecord.read(paths.registry_id_file)
    except (OSError, ValueError):  # the run says what is wrong with it; list only reads
        here = None
    if here is None:
        return Ownership(owner)
    moved = owner is not None and owner.id == here.id and not here.made_in(paths.job_dir)
    return Ownership(owner, registry_here=here.id, moved_here=moved)


def _unreadable(storage: CheckpointStorage, ref: SnapshotRef, error: StorageError) -> str:
    """Why a snapshot's `_metadata` cannot be read; a snapshot without even its directory
    was never written or is discarded (a registered one's `_metadata` is what is missing)."""
    directory = storage.layout.snapshot_dir(ref.kind, ref.snapshot_id)
    if isinstance(error, MissingFileError):
        with contextlib.suppress(StorageError, OSError):
            if not storage.fs.exists(directory):
                # One counter numbers both kinds: the id may be the other kind's.
                other = next(kind for kind in CheckpointKind if kind is not ref.kind)
                found = ""
                if ref.snapshot_id in storage.list_ids(other):
                    found = (
                        f"; {ref.snapshot_id} is a {other.value}: {other.value}:{ref.snapshot_id}"
                    )
                return (
                    f"not in storage: no {directory} (never written, or discarded; "
                    f"{ref.kind.value}s in storage: {_nearest(storage.list_ids(ref.kind), ref)})"
                    + found
                )
    return storage_problem(error)


NEAREST_IDS_SHOWN = 10


def _nearest(ids: Sequence[int], ref: SnapshotRef) -> str:
    """The ids nearest the one asked for, in order: savepoints are never discarded by
    retention, so a job may hold hundreds."""
    shown = sorted(sorted(ids, key=lambda i: abs(i - ref.snapshot_id))[:NEAREST_IDS_SHOWN])
    more = f" (of {len(ids)})" if len(ids) > len(shown) else ""
    return (", ".join(map(str, shown)) or "none") + more


def storage_problem(error: StorageError) -> str:
    """A storage error as one line that starts with what kind of problem it is."""
    labels: list[tuple[type[StorageError], str]] = [
        (MissingFileError, "missing file"),
        (TruncatedMetadataError, "unreadable metadata"),
        (InvalidMetadataError, "invalid metadata"),
        (UnknownFormatVersionError, "unknown metadata format"),
        (ChecksumMismatchError, "checksum mismatch"),
    ]
    label = next((text for cls, text in labels if isinstance(error, cls)), "storage error")
    return f"{label}: {error}"


def io_problem(error: OSError, where: str) -> str:
    """An OSError as one line naming the path and the reason, without Python's
    ``[Errno N]`` spelling: ``I/O error: /data/ckpt/default/job: Not a directory``; `where`
    names the path when the error does not (an object store's: "Forbidden")."""
    if error.filename is not None and error.strerror:
        return f"I/O error: {error.filename}: {error.strerror}"
    return f"I/O error: {where}: {error}"
