"""``spark-checkpoint list|inspect|verify``: what is in a job's checkpoint storage.

Storage is read through ``spark_checkpoint.storage`` only (the format's own reader and
checks), never written. Storage alone cannot say which snapshots are valid: the
coordinator's registry does. Locally that is the status file of ``spark-checkpoint run``
(``<state-dir>/<namespace>/<job>/status.json``), which these commands read when present
to mark each snapshot registered or unregistered.

Exit codes: 0 success; 1 a snapshot cannot be read or failed verification; 2 the command
line, the manifest or the storage address is wrong.
"""

import dataclasses
import json
import math
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointMetadata,
    CheckpointStorage,
    ChecksumMismatchError,
    InvalidMetadataError,
    JobStorageLayout,
    ManifestEntry,
    MissingFileError,
    StorageError,
    TruncatedMetadataError,
    UnknownFormatVersionError,
    parse_snapshot_dir_name,
)
from spark_checkpoint_operator.local_runtime import (
    STATE_DIR_NAME,
    LocalPaths,
    default_state_dir,
    local_paths,
)
from spark_checkpoint_operator.manifest.loading import load_manifest
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.restorable_check import problems_by_image, restorable_command

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


_DISCARDING_FILE_NAME = "_discarding"  # see CheckpointStorage.discard_checkpoint
_SHARED_PREFIX = "shared/"


class CommandError(Exception):
    """The command cannot run as asked (exit code 2); the message says why."""


# --------------------------------------------------------------------------- the job


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
    """A job's checkpoint storage and the local status file that holds its registry."""

    storage: CheckpointStorage
    status_file: Path

    @property
    def layout(self) -> JobStorageLayout:
        return self.storage.layout


def open_job_storage(source: StorageSource) -> JobStorage:
    """Resolve ``source``; raise CommandError naming what is wrong."""
    if source.manifest is not None:
        if source.storage is not None or source.namespace is not None or source.job is not None:
            raise CommandError(
                "--manifest names the job and its storage: do not combine it with "
                "--storage, --namespace or --job"
            )
        try:
            manifest = load_manifest(source.manifest)
        except ManifestError as error:
            raise CommandError(str(error)) from error
        paths = local_paths(manifest, source.state_dir or default_state_dir(source.manifest))
        root = manifest.spec.checkpointing.storage or paths.default_storage
        namespace, job = manifest.namespace, manifest.name
    else:
        missing = [
            flag
            for flag, value in (
                ("--storage", source.storage),
                ("--namespace", source.namespace),
                ("--job", source.job),
            )
            if not value
        ]
        if missing:
            raise CommandError(
                "give either --manifest FILE or all of --storage, --namespace and --job "
                f"(missing: {', '.join(missing)})"
            )
        assert source.storage and source.namespace and source.job
        root, namespace, job = source.storage, source.namespace, source.job
        paths = None
    try:
        # Validates namespace and job before they become part of any local path.
        layout = JobStorageLayout(root, namespace, job)
        storage = CheckpointStorage(layout)
    except (ValueError, ImportError) as error:
        raise CommandError(f"storage {root!r}: {error}") from error
    if paths is None:
        state_dir = source.state_dir or Path(STATE_DIR_NAME)
        paths = LocalPaths(state_dir.resolve() / namespace / job)
    return JobStorage(storage, paths.status_file)


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True, slots=True)
class Registry:
    """The snapshots the coordinator registered, from a local status file."""

    source: Path
    checkpoints: frozenset[int]
    savepoints: frozenset[int]

    def ids(self, kind: CheckpointKind) -> frozenset[int]:
        return self.checkpoints if kind is CheckpointKind.CHECKPOINT else self.savepoints

    def lists(self, kind: CheckpointKind, snapshot_id: int) -> bool:
        return snapshot_id in self.ids(kind)


class RegistryError(ValueError):
    """The status file cannot be read; the message names the file and the field."""


def load_registry(status_file: Path) -> Registry | None:
    """The registry in ``status_file``; None if there is no such file."""
    try:
        text = status_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise RegistryError(f"{status_file}: cannot read: {error}") from error
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise RegistryError(f"{status_file}: not JSON: {error}") from error
    coordinator: Any = document
    field_path = ""
    for key in ("status", "coordinator"):
        field_path = f"{field_path}.{key}" if field_path else key
        if not isinstance(coordinator, Mapping) or key not in coordinator:
            raise RegistryError(f"{status_file}: {field_path}: missing")
        coordinator = coordinator[key]
    return Registry(
        source=status_file,
        checkpoints=frozenset(_registered_ids(status_file, coordinator, "checkpoints")),
        savepoints=frozenset(_registered_ids(status_file, coordinator, "savepoints")),
    )


def _registered_ids(status_file: Path, coordinator: Any, key: str) -> Iterator[int]:
    prefix = f"status.coordinator.{key}"
    if not isinstance(coordinator, Mapping):
        raise RegistryError(f"{status_file}: status.coordinator: not an object")
    items = coordinator.get(key, [])
    if not isinstance(items, list):
        raise RegistryError(f"{status_file}: {prefix}: not a list")
    for index, item in enumerate(items):
        value = item.get("id") if isinstance(item, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RegistryError(
                f"{status_file}: {prefix}[{index}].id: expected a non-negative integer, "
                f"got {value!r}"
            )
        yield value


def _registry_or_warn(job: JobStorage, err: TextIO) -> Registry | None:
    try:
        return load_registry(job.status_file)
    except RegistryError as error:
        print(f"warning: registry ignored: {error}", file=err)
        return None


def _registered(registry: Registry | None, kind: CheckpointKind, snapshot_id: int) -> bool | None:
    return None if registry is None else registry.lists(kind, snapshot_id)


def _registry_word(registered: bool | None) -> str:
    if registered is None:
        return "-"
    return "registered" if registered else "unregistered"


def _registry_line(job: JobStorage, registry: Registry | None) -> str:
    if registry is None:
        return f"registry: none (no readable status file at {job.status_file})"
    return f"registry: {registry.source}"


# --------------------------------------------------------------------------- snapshot ids


@dataclass(frozen=True, slots=True, order=True)
class SnapshotRef:
    """A checkpoint or savepoint of the job, written ``KIND:ID`` (``checkpoint:7``)."""

    kind: CheckpointKind
    snapshot_id: int

    @classmethod
    def parse(cls, text: str) -> "SnapshotRef":
        kind, separator, number = text.partition(":")
        kinds = [k.value for k in CheckpointKind]
        if not separator or kind not in kinds:
            raise CommandError(f"{text!r}: expected KIND:ID with KIND one of {', '.join(kinds)}")
        # The canonical spelling only, as in storage (`chk-7`, never `chk-07`).
        if not number.isascii() or not number.isdigit() or (len(number) > 1 and number[0] == "0"):
            raise CommandError(f"{text!r}: ID must be a non-negative integer without leading 0")
        return cls(CheckpointKind(kind), int(number))

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.snapshot_id}"


# --------------------------------------------------------------------------- list


class SnapshotState(StrEnum):
    COMPLETE = "complete"  # `_metadata` present and valid
    UNREADABLE = "unreadable"  # `_metadata` present but cannot be read or validated
    INCOMPLETE = "incomplete"  # a directory without `_metadata`: in flight or cut short
    DISCARDING = "discarding"  # a discard was started (`_discarding`) and not finished
    MISSING = "missing"  # registered, but storage has no directory for it


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    ref: SnapshotRef
    state: SnapshotState
    path: str
    registered: bool | None
    metadata: CheckpointMetadata | None = None
    error: str | None = None

    @property
    def note(self) -> str:
        if self.state is SnapshotState.COMPLETE:
            if self.registered is not False:
                return ""
            if self.ref.kind is CheckpointKind.CHECKPOINT:
                return "not in the registry: never restored from; garbage collection removes it"
            return "not in the registry: kept, a savepoint with _metadata is the user's"
        if self.state is SnapshotState.UNREADABLE:
            return f"unreadable _metadata: {self.error}"
        if self.state is SnapshotState.MISSING:
            return "registered but not in storage"
        if self.registered:
            return f"registered but its _metadata is missing ({self.state.value})"
        if self.state is SnapshotState.INCOMPLETE:
            return "no _metadata: in flight or cut short"
        return "being discarded (_discarding present)"

    def to_json(self, now: datetime) -> dict[str, Any]:
        meta = self.metadata
        return {
            "kind": self.ref.kind.value,
            "id": self.ref.snapshot_id,
            "state": self.state.value,
            "registered": self.registered,
            "batchId": meta.batch_id if meta else None,
            "sizeBytes": meta.total_bytes if meta else None,
            "files": len(meta.files) if meta else None,
            "triggerTime": _timestamp(meta.trigger_time) if meta else None,
            "completionTime": _timestamp(meta.completion_time) if meta else None,
            "ageSeconds": _age_seconds(meta.completion_time, now) if meta else None,
            "path": self.path,
            "error": self.error,
        }


def list_snapshots(storage: CheckpointStorage, registry: Registry | None) -> list[SnapshotRow]:
    """Every snapshot directory in storage, and every registered snapshot storage lacks,
    checkpoints first, by id."""
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
                rows.append(SnapshotRow(ref, SnapshotState.MISSING, path, registered=True))
    return rows


def _row(storage: CheckpointStorage, ref: SnapshotRef, registry: Registry | None) -> SnapshotRow:
    layout = storage.layout
    registered = _registered(registry, ref.kind, ref.snapshot_id)
    metadata_path = layout.metadata_path(ref.kind, ref.snapshot_id)
    if storage.fs.exists(metadata_path):
        try:
            meta = storage.read_metadata(ref.kind, ref.snapshot_id)
        except StorageError as error:
            return SnapshotRow(
                ref, SnapshotState.UNREADABLE, metadata_path, registered, error=str(error)
            )
        return SnapshotRow(ref, SnapshotState.COMPLETE, metadata_path, registered, meta)
    directory = layout.snapshot_dir(ref.kind, ref.snapshot_id)
    if storage.fs.exists(f"{directory}/{_DISCARDING_FILE_NAME}"):
        return SnapshotRow(ref, SnapshotState.DISCARDING, directory, registered)
    return SnapshotRow(ref, SnapshotState.INCOMPLETE, directory, registered)


def run_list(
    source: StorageSource,
    *,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    now: datetime | None = None,
) -> int:
    """``spark-checkpoint list``."""
    now = now or datetime.now(UTC)
    try:
        job = open_job_storage(source)
    except CommandError as error:
        return _usage_error("list", error, err)
    registry = _registry_or_warn(job, err)
    try:
        rows = list_snapshots(job.storage, registry)
    except (StorageError, OSError) as error:
        print(f"spark-checkpoint list: {error}", file=err)
        return EXIT_FAILED
    if as_json:
        document = {
            "namespace": job.layout.namespace,
            "job": job.layout.job,
            "storage": job.layout.root,
            "jobRoot": job.layout.job_root,
            "statusFile": str(registry.source) if registry else None,
            "snapshots": [row.to_json(now) for row in rows],
        }
        print(json.dumps(document, indent=2), file=out)
        return EXIT_OK
    print(f"job {job.layout.namespace}/{job.layout.job}: {job.layout.job_root}", file=out)
    print(_registry_line(job, registry), file=out)
    if not rows:
        print("no checkpoints or savepoints in storage", file=out)
        return EXIT_OK
    table = [["KIND", "ID", "BATCH", "SIZE", "FILES", "AGE", "REGISTRY", "NOTE"]]
    for row in rows:
        meta = row.metadata
        table.append(
            [
                row.ref.kind.value,
                str(row.ref.snapshot_id),
                str(meta.batch_id) if meta else "-",
                human_size(meta.total_bytes) if meta else "-",
                str(len(meta.files)) if meta else "-",
                human_age(_age_seconds(meta.completion_time, now)) if meta else "-",
                _registry_word(row.registered),
                row.note,
            ]
        )
    for line in _format_table(table, right_aligned={1, 2, 3, 4, 5}):
        print(line, file=out)
    return EXIT_OK


# --------------------------------------------------------------------------- inspect


def run_inspect(
    source: StorageSource,
    snapshot: str,
    *,
    as_json: bool,
    show_files: bool,
    out: TextIO,
    err: TextIO,
    now: datetime | None = None,
) -> int:
    """``spark-checkpoint inspect KIND:ID``."""
    now = now or datetime.now(UTC)
    try:
        ref = SnapshotRef.parse(snapshot)
        job = open_job_storage(source)
    except CommandError as error:
        return _usage_error("inspect", error, err)
    try:
        meta = job.storage.read_metadata(ref.kind, ref.snapshot_id)
    except StorageError as error:
        print(f"spark-checkpoint inspect: {ref}: {_problem(error)}", file=err)
        return EXIT_FAILED
    except OSError as error:
        print(f"spark-checkpoint inspect: {ref}: I/O error: {error}", file=err)
        return EXIT_FAILED
    if as_json:
        out.write(meta.to_json().decode("utf-8"))
        return EXIT_OK
    registry = _registry_or_warn(job, err)
    for line in describe_metadata(
        meta,
        path=job.layout.metadata_path(ref.kind, ref.snapshot_id),
        registered=_registered(registry, ref.kind, ref.snapshot_id),
        reuse=_shared_reuse(job.storage, meta),
        now=now,
        show_files=show_files,
    ):
        print(line, file=out)
    return EXIT_OK


@dataclass(frozen=True, slots=True)
class SharedReuse:
    """How many of a checkpoint's shared files other checkpoints in storage reference."""

    shared_with_others: int
    unreadable: tuple[int, ...] = field(default=())


def _shared_reuse(storage: CheckpointStorage, meta: CheckpointMetadata) -> SharedReuse | None:
    if meta.kind is not CheckpointKind.CHECKPOINT:
        return None  # savepoints are self-contained
    others: set[str] = set()
    unreadable: list[int] = []
    try:
        checkpoint_ids = storage.list_ids(CheckpointKind.CHECKPOINT)
    except OSError:
        return None
    for checkpoint_id in checkpoint_ids:
        if checkpoint_id == meta.checkpoint_id:
            continue
        try:
            others |= storage.read_metadata(CheckpointKind.CHECKPOINT, checkpoint_id).locations
        except (StorageError, OSError):
            unreadable.append(checkpoint_id)
    return SharedReuse(len(_shared_locations(meta) & others), tuple(unreadable))


def _shared_locations(meta: CheckpointMetadata) -> set[str]:
    return {entry.location for entry in meta.files if entry.location.startswith(_SHARED_PREFIX)}


def describe_metadata(
    meta: CheckpointMetadata,
    *,
    path: str,
    registered: bool | None,
    reuse: SharedReuse | None,
    now: datetime,
    show_files: bool,
) -> list[str]:
    """The human summary of a `_metadata` document."""
    duration = (meta.completion_time - meta.trigger_time).total_seconds()
    shared = len(_shared_locations(meta))
    shared_text = str(shared)
    if reuse is not None:
        shared_text += f" ({reuse.shared_with_others} also referenced by other checkpoints"
        if reuse.unreadable:
            unreadable = ", ".join(str(i) for i in reuse.unreadable)
            shared_text += f"; unreadable _metadata of checkpoints {unreadable} not counted"
        shared_text += ")"
    registry = {
        None: "unknown (no readable status file)",
        True: "registered",
        False: "unregistered",
    }
    fields = [
        ("metadata", path),
        ("registry", registry[registered]),
        ("format version", str(meta.format_version)),
        ("batch", str(meta.batch_id)),
        ("query id", meta.query_id),
        ("triggered", _timestamp(meta.trigger_time)),
        (
            "completed",
            f"{_timestamp(meta.completion_time)} ({_duration(duration)} after the trigger, "
            f"{human_age(_age_seconds(meta.completion_time, now))} ago)",
        ),
        (
            "total",
            f"{human_size(meta.total_bytes)} ({meta.total_bytes} bytes) in {len(meta.files)} files",
        ),
        ("shared files", shared_text),
    ]
    if meta.properties:
        fields.append(
            ("properties", ", ".join(f"{k}={v}" for k, v in sorted(meta.properties.items())))
        )
    width = max(len(name) for name, _ in fields) + 1
    lines = [f"{meta.kind.value} {meta.checkpoint_id} of {meta.namespace}/{meta.job}"]
    lines += [f"  {name + ':':<{width}} {value}" for name, value in fields]
    lines.append(f"  task acknowledgements ({len(meta.acknowledgements)}):")
    table = [["TASK", "FILES", "BYTES", "DURATION"]]
    table += [
        [ack.task, str(len(ack.files)), human_size(ack.bytes), _duration(ack.duration_ms / 1000)]
        for ack in meta.acknowledgements
    ]
    lines += [f"    {line}" for line in _format_table(table, right_aligned={1, 2, 3})]
    if show_files:
        lines.append(f"  files ({len(meta.files)}):")
        table = [["PATH", "SIZE", "SHA256", "LOCATION"]]
        table += [
            [entry.path, human_size(entry.size), entry.sha256[:12], entry.location]
            for entry in meta.files
        ]
        lines += [f"    {line}" for line in _format_table(table, right_aligned={1})]
    return lines


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True, slots=True)
class Verification:
    """The outcome of verifying one snapshot: OK when ``problems`` is empty."""

    ref: SnapshotRef
    problems: tuple[str, ...]
    files: int = 0
    total_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.ref.kind.value,
            "id": self.ref.snapshot_id,
            "ok": self.ok,
            "files": self.files,
            "sizeBytes": self.total_bytes,
            "problems": list(self.problems),
        }


def verify_snapshot(storage: CheckpointStorage, ref: SnapshotRef) -> Verification:
    """Read a snapshot's `_metadata` and check every file it lists (size, then SHA-256).

    The checks of ``CheckpointStorage.verify``, except that every bad file is reported
    rather than the first, so that the extent of the damage shows at once.
    """
    try:
        meta = storage.read_metadata(ref.kind, ref.snapshot_id)
    except StorageError as error:
        return Verification(ref, (_problem(error),))
    except OSError as error:
        return Verification(ref, (f"I/O error: {error}",))
    problems = [problem for entry in meta.files if (problem := _check_file(storage, entry))]
    return Verification(ref, tuple(problems), len(meta.files), meta.total_bytes)


def _check_file(storage: CheckpointStorage, entry: ManifestEntry) -> str | None:
    """What is wrong with the stored bytes of one manifest file, or None."""
    stored_path = storage.layout.location_path(entry.location)
    where = f"{entry.path} at {stored_path}"
    try:
        size = storage.fs.file_size(stored_path)
        if size is None:
            return f"missing file: {where}"
        if size != entry.size:
            # Checked first, as CheckpointStorage.verify does: cheap, and what a truncated
            # copy gets wrong.
            return f"size mismatch: {where}: expected {entry.size} bytes, found {size} bytes"
        digest = storage.fs.digest(stored_path)
    except MissingFileError:
        return f"missing file: {where}"
    except (StorageError, OSError) as error:
        return f"I/O error: {where}: {error}"
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
        found = {
            ref: [f"not restorable: {problem}" for problem in problems.get(str(ref), [])]
            for ref in intact
        }
    except ValueError:
        lines = completed.stderr.strip().splitlines() or [f"exit code {completed.returncode}"]
        found = {ref: [f"the restore check could not run: {lines[-1]}"] for ref in intact}
    return [
        dataclasses.replace(result, problems=(*result.problems, *found.get(result.ref, ())))
        if result.ok
        else result
        for result in results
    ]


def run_verify(
    source: StorageSource,
    snapshots: Sequence[str],
    *,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    deep: bool = False,
) -> int:
    """``spark-checkpoint verify [--deep] [KIND:ID ...]``: exit 0 only if every snapshot is
    OK (with ``--deep``: and restorable)."""
    try:
        refs = [SnapshotRef.parse(text) for text in snapshots]
        job = open_job_storage(source)
    except CommandError as error:
        return _usage_error("verify", error, err)
    if not refs:
        registry = _registry_or_warn(job, err)
        try:
            refs = _default_refs(job.storage, registry)
        except (StorageError, OSError) as error:
            print(f"spark-checkpoint verify: {error}", file=err)
            return EXIT_FAILED
    results = [verify_snapshot(job.storage, ref) for ref in dict.fromkeys(refs)]
    if deep:
        results = deep_verify(job.storage, results)
    failed = sum(not result.ok for result in results)
    # Nothing verified is not a pass: a gate that reads exit 0 as "the images are sound"
    # must not see it for storage that is empty or named wrongly.
    ok = bool(results) and not failed
    if as_json:
        document = {
            "namespace": job.layout.namespace,
            "job": job.layout.job,
            "jobRoot": job.layout.job_root,
            "ok": ok,
            "snapshots": [result.to_json() for result in results],
        }
        print(json.dumps(document, indent=2), file=out)
        return EXIT_OK if ok else EXIT_FAILED
    if not results:
        print(
            "spark-checkpoint verify: nothing to verify: no checkpoints or savepoints in "
            f"{job.layout.job_root}",
            file=err,
        )
        return EXIT_FAILED
    width = max(len(str(result.ref)) for result in results)
    for result in results:
        name = f"{result.ref!s:<{width}}"
        if result.ok:
            print(
                f"{name}  OK      {result.files} files, {human_size(result.total_bytes)}", file=out
            )
            continue
        first, *rest = result.problems
        print(f"{name}  FAILED  {first}", file=out)
        for problem in rest:
            print(f"{'':<{width}}          {problem}", file=out)
    print(f"{len(results)} verified: {len(results) - failed} OK, {failed} failed", file=out)
    return EXIT_FAILED if failed else EXIT_OK


def _default_refs(storage: CheckpointStorage, registry: Registry | None) -> list[SnapshotRef]:
    """Every snapshot with a `_metadata` in storage, plus every registered one (a
    registered snapshot missing from storage is exactly what verify must report)."""
    refs = {
        SnapshotRef(kind, snapshot_id)
        for kind in CheckpointKind
        for snapshot_id in storage.list_ids(kind)
    }
    if registry is not None:
        refs |= {SnapshotRef(kind, i) for kind in CheckpointKind for i in registry.ids(kind)}
    return sorted(refs)  # checkpoints, then savepoints, each by id


# --------------------------------------------------------------------------- formatting


def _problem(error: StorageError) -> str:
    """A storage error as one line that starts with what kind of problem it is."""
    labels: list[tuple[type[StorageError], str]] = [
        (MissingFileError, "missing file"),
        (TruncatedMetadataError, "truncated metadata"),
        (InvalidMetadataError, "invalid metadata"),
        (UnknownFormatVersionError, "unknown metadata format"),
        (ChecksumMismatchError, "checksum mismatch"),
    ]
    label = next((text for cls, text in labels if isinstance(error, cls)), "storage error")
    return f"{label}: {error}"


def human_size(size: int) -> str:
    """``17 B``, ``9.3 KiB``, ``1.2 MiB`` ..."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def human_age(seconds: float) -> str:
    """A duration the way ``kubectl get`` shows ages: ``45s``, ``5m30s``, ``3h``, ``2d``."""
    total = max(0, math.floor(seconds))
    minutes, hours, days = total // 60, total // 3600, total // 86400
    if total < 120:
        return f"{total}s"
    if minutes < 10:
        return f"{minutes}m{total % 60}s" if total % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:.2f}s"


def _age_seconds(completion_time: datetime, now: datetime) -> float:
    return (now - completion_time).total_seconds()


def _timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _format_table(rows: Iterable[Sequence[str]], right_aligned: set[int]) -> list[str]:
    rows = [list(row) for row in rows]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[column]) if column in right_aligned else cell.ljust(widths[column])
            for column, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _usage_error(command: str, error: CommandError, err: TextIO) -> int:
    print(f"spark-checkpoint {command}: {error}", file=err)
    return EXIT_USAGE
