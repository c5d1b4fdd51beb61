"""Writing, reading, discarding and restoring one job's checkpoints and savepoints."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import shutil
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from spark_checkpoint.protocol import CheckpointKind, StorageOwner

from .errors import (
    ChecksumMismatchError,
    InvalidMetadataError,
    MissingFileError,
    NotEmptyError,
    StorageError,
    StorageOwnedElsewhere,
    SymbolicLinkError,
    TruncatedMetadataError,
    UnknownFormatVersionError,
    printable_line,
)
from .filesystem import FileDigest, StorageFileSystem, digest_local_file
from .layout import (
    DISCARDING_FILE_NAME,
    METADATA_FILE_NAME,
    OWNER_FILE_NAME,
    SHARED_DIR_NAME,
    JobStorageLayout,
    is_safe_relative_path,
    parse_snapshot_dir_name,
    require_safe_relative_path,
    snapshot_location_prefix,
)
from .metadata import MAX_DOCUMENT_BYTES, CheckpointMetadata, ManifestEntry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GarbageReport:
    """What `CheckpointStorage.collect_garbage` deleted."""

    checkpoint_ids: tuple[int, ...]
    savepoint_ids: tuple[int, ...]
    shared_locations: tuple[str, ...]
    aborted_uploads: int = 0  # S3 multipart uploads a killed writer left unfinished


MAX_OWNER_RECORD_BYTES = 64 * 1024

# What storage writes below `shared/`: `ab/<sha256 ab...>-<name>` (`shared_location`), or
# `ab/.<sha256>-<name>.<uuid>.tmp`, the temporary file of a copy cut short.
_SHARED_FILE_NAME = re.compile(r"([0-9a-f]{2})/\.?\1[0-9a-f]{62}-[^/]+", re.DOTALL)


def _is_shared_file_name(relative: str) -> bool:
    """Whether a path below `shared/` is one storage writes there. Garbage collection
    leaves anything else: another job's storage directory set inside this one's
    `shared/` lost its images to it (a newcomer's)."""
    return _SHARED_FILE_NAME.fullmatch(relative) is not None


class CheckpointStorage:
    """One job's checkpoint storage: snapshot files, `_metadata`, discarding and restore.

    A snapshot exists once its `_metadata` is written (atomically, after all of its files).
    Which snapshots are *valid* is decided by the coordinator's persisted registry, not by
    storage: `collect_garbage` removes whatever the registry does not list.

    Concurrency contract: one writer per job (the driver, or a cleanup pod while no driver
    runs). Discarding and garbage collection may run while a snapshot is in flight only if
    every location that snapshot references so far is passed as `protected_locations`;
    `collect_garbage` must not run between a `_metadata` write and the registry update, nor
    while a snapshot copies files (on S3 it aborts unfinished uploads).
    """

    def __init__(self, layout: JobStorageLayout, *, fresh: bool = False) -> None:
        """``fresh``: a filesystem made in this environment (`StorageFileSystem.for_url`)."""
        self.layout = layout
        # Every path this class builds is below the job's directory; a link placed there,
        # or as the job's or its namespace's directory (on a root jobs share), must not lead
        # a delete or a read outside of it. The root is the administrator's to link.
        self.fs = StorageFileSystem.for_url(layout.root, fresh=fresh).confined(layout.root)
        # What this process knows of `shared/`, only ever a reason to skip work, never to
        # trust storage (write_metadata checks every size it names in storage):
        # - the files it made durable (write_metadata makes the others durable);
        # - on an object store, the sizes its last listing found, with what it stored and
        #   deleted since: the next snapshot starts from them instead of listing again.
        self._lock = threading.Lock()
        self._durable: set[str] = set()
        self._known_sizes: dict[str, int] | None = None
        self._forgets = 0  # a listing taken across a change may hold what is gone

    def is_same_job_directory(self, other: CheckpointStorage) -> bool:
        """Whether `other` is this job's directory, however its root is spelled."""
        return self.fs.place(self.layout.job_root) == other.fs.place(other.layout.job_root)

    def claim(self, owner: StorageOwner) -> None:
        """Make sure the job's storage belongs to `owner`'s registry before writing or
        deleting anything: storage no registry has claimed yet (a new job, or one written
        before owners were recorded) becomes `owner`'s, and so does storage another
        registry left without checkpoints (a job deleted under a retention policy that
        discarded them: its savepoints stay, and are never written over); storage holding
        another registry's checkpoints raises StorageOwnedElsewhere, as its garbage
        collection would delete them. The record of `owner`'s own registry is brought up to
        date (where it is now). Two first claims racing on an object store may both pass:
        the claim fences registries that follow each other, the local writer lock runs
        that overlap."""
        path = self.layout.owner_path
        current = self.recorded_owner()
        if current is None:
            self.fs.write_atomic(path, owner.encode().encode())
            return
        if current.id != owner.id:
            if self._snapshot_dir_ids(CheckpointKind.CHECKPOINT):
                raise StorageOwnedElsewhere(path, current, owner)
            savepoints = len(self._snapshot_dir_ids(CheckpointKind.SAVEPOINT))
            logger.warning(
                "%s: taken over from %s, which left no checkpoints there%s",
                self.layout.job_root,
                printable_line(current.description),
                f"; its {savepoints} savepoint(s) stay, never written over nor deleted"
                if savepoints
                else "",
            )
        if current != owner:  # taken over, or moved: later refusals name where it is now
            self.fs.write_atomic(path, owner.encode().encode())

    def recorded_owner(self) -> StorageOwner | None:
        """The registry `owner.json` names, or None where no registry claimed the storage;
        StorageError if the file is not an owner record."""
        path = self.layout.owner_path
        try:
            # A record names one registry: its first bytes tell whether it is one (one of
            # gigabytes took every reader's memory).
            stored = self.fs.read_bytes(path, at_most=MAX_OWNER_RECORD_BYTES + 1)
        except MissingFileError:
            return None
        try:
            if len(stored) > MAX_OWNER_RECORD_BYTES:
                raise ValueError(f"larger than {MAX_OWNER_RECORD_BYTES} bytes")
            return StorageOwner.decode(stored.decode(errors="replace"))
        except ValueError as error:
            raise StorageError(
                path,
                f"not an owner record ({error}): if no other registry of this job writes "
                "here, delete it to hand the storage to the next writer",
            ) from None

    def listed_shared_sizes(self) -> dict[str, int] | None:
        """Sizes of the files stored in `shared/` by location, for
        `add_shared_file(..., stored=...)` to consult instead of asking for each file's
        size: on an object store that is a request per file. They are those of the last
        listing (the previous checkpoint's `write_metadata` lists `shared/`) with what this
        process stored and deleted since, or of one listing now if there is none. None on
        a local filesystem, where a stat each is cheaper than walking all of `shared/`."""
        if self.fs.is_local:
            return None
        with self._lock:
            known = None if self._known_sizes is None else dict(self._known_sizes)
        return known if known is not None else self._list_shared_sizes()

    def _list_shared_sizes(self) -> dict[str, int]:
        """Sizes of the files in `shared/` by location, from one listing, remembered unless
        a file changed while it ran (it may list one deleted since)."""
        with self._lock:
            forgets = self._forgets
        sizes = {
            f"{SHARED_DIR_NAME}/{relative}": size
            for relative, size in self.fs.list_file_sizes(self.layout.shared_dir).items()
        }
        with self._lock:
            if self._forgets == forgets:
                self._known_sizes = dict(sizes)
        return sizes

    def add_shared_file(
        self,
        local_src: str,
        path: str,
        link: bool = True,
        stored: Mapping[str, int] | None = None,
    ) -> ManifestEntry:
        """Store a checkpoint file in `shared/`, content-addressed, and return its entry.

        `path` is the file's path in the Spark checkpoint location. A file already stored
        (same name and bytes, e.g. by an earlier checkpoint) is not written again, which is
        what makes checkpoints incremental. With `link`, a local file is hard-linked rather
        than copied: files are immutable once their Spark batch is committed, and Spark
        deleting its own link leaves ours intact. `stored` (from `shared_sizes`, taken
        when the snapshot began) says what is stored already, where asking storage would
        cost a request per file on an object store; a file it wrongly lists is found
        missing by `write_metadata`. Links are made durable by `write_metadata`.
        """
        require_safe_relative_path(path, "path")
        digest = digest_local_file(local_src)
        location = self.layout.shared_location(digest.sha256, posixpath.basename(path))
        stored_path = self.layout.location_path(location)
        stored_size = stored.get(location) if stored is not None else self.fs.file_size(stored_path)
        # The name holds the SHA-256, so an object of the right size holds the right bytes;
        # one of another size is damaged and is replaced.
        if stored_size != digest.size:
            with self._changing([location]):
                if link:
                    self.fs.link_in(local_src, stored_path, digest, durable=False)
                else:
                    self.fs.copy_in(local_src, stored_path, digest)
            with self._lock:
                if self._known_sizes is not None:
                    self._known_sizes[location] = digest.size
        return ManifestEntry(path=path, size=digest.size, sha256=digest.sha256, location=location)

    def require_no_snapshot(self, kind: CheckpointKind, snapshot_id: int) -> None:
        """Raise StorageError unless the snapshot's directory is absent: it is not written
        over, whoever left it there."""
        directory = self.layout.snapshot_dir(kind, snapshot_id)
        if self.fs.exists(directory):
            raise StorageError(
                directory,
                f"exists already, left by another registry of this job: the {kind.value} is "
                "not written over it, and the next one takes the next id",
            )

    def add_savepoint_file(self, savepoint_id: int, local_src: str, path: str) -> ManifestEntry:
        """Copy a file into savepoint `savepoint_id` and return its entry.

        Savepoints are self-contained: their bytes live below `savepoints/sp-N/` only.
        """
        location = self.layout.savepoint_file_location(savepoint_id, path)
        digest = self.fs.copy_in(local_src, self.layout.location_path(location))
        return ManifestEntry(path=path, size=digest.size, sha256=digest.sha256, location=location)

    def write_metadata(self, meta: CheckpointMetadata) -> None:
        """Write a snapshot's `_metadata` atomically, which makes the snapshot exist.

        Every manifest file must already be stored with its size (MissingFileError or
        ChecksumMismatchError otherwise), so a `_metadata` never points at nothing; on a
        local filesystem the files are made durable first (all at once: `make_durable`),
        so that a `_metadata` which survives a power loss finds its files' bytes.
        """
        if (meta.namespace, meta.job) != (self.layout.namespace, self.layout.job):
            raise ValueError(
                f"metadata of job {meta.namespace}/{meta.job} cannot be written to the "
                f"storage of job {self.layout.namespace}/{self.layout.job}"
            )
        paths = {location: self.layout.location_path(location) for location in meta.locations}
        if meta.kind is CheckpointKind.CHECKPOINT and not self.fs.is_local:
            # The listing of `shared/` this takes anyway tells the next snapshot what is stored.
            listed = self._list_shared_sizes()
            stored = {location: listed.get(location) for location in meta.locations}
        else:
            prefix = snapshot_location_prefix(meta.kind, meta.checkpoint_id)
            sizes = self.fs.file_sizes(
                paths.values(), below=self.layout.location_path(prefix.rstrip("/"))
            )
            stored = {location: sizes[path] for location, path in paths.items()}
        # Whatever this process remembers of a file not stored as named is wrong, also when
        # the listing is not remembered (a change overlapped it).
        if wrong := [e.location for e in meta.files if stored[e.location] != e.size]:
            self._forget(wrong)
        for entry in meta.files:
            self._require_stored_size(entry, stored[entry.location])
        with self._lock:
            not_durable = sorted(meta.locations - self._durable)
        self.fs.make_durable(paths[location] for location in not_durable)
        if meta.kind is CheckpointKind.CHECKPOINT:  # savepoints' files are never reused
            with self._lock:
                self._durable.update(not_durable)
        path = self.layout.metadata_path(meta.kind, meta.checkpoint_id)
        try:
            data = meta.to_bytes()
        except ValueError as error:  # too large to be read back: the snapshot fails
            raise StorageError(path, str(error)) from None
        self.fs.write_atomic(path, data)

    def read_metadata(self, kind: CheckpointKind, snapshot_id: int) -> CheckpointMetadata:
        """Read and validate the `_metadata` of a checkpoint or savepoint.

        Besides the errors of `CheckpointMetadata.from_bytes`, raises MissingFileError if
        there is none and InvalidMetadataError if it belongs to another job or snapshot.
        """
        return self._read_manifest(self.layout.metadata_path(kind, snapshot_id), kind, snapshot_id)

    def verify(self, meta: CheckpointMetadata) -> None:
        """Check that every manifest file is stored with its size and SHA-256.

        Raises MissingFileError or ChecksumMismatchError naming the first bad file.
        """
        for entry in meta.files:
            stored_path = self.layout.location_path(entry.location)
            self._require_stored_size(entry, self.fs.file_size(stored_path))
            expected = FileDigest(size=entry.size, sha256=entry.sha256)
            self.fs.digest(stored_path).require_match(expected, stored_path)

    def list_ids(self, kind: CheckpointKind) -> list[int]:
        """Ids of the snapshots of `kind` whose directory has a `_metadata`, ascending.

        This is what storage holds, which may include crash leftovers: the registry, not
        this list, says which checkpoints are valid.
        """
        return [
            snapshot_id
            for snapshot_id in self._snapshot_dir_ids(kind)
            if self.has_metadata(kind, snapshot_id)
        ]

    def has_metadata(self, kind: CheckpointKind, snapshot_id: int) -> bool:
        """Whether the snapshot has a `_metadata`. A snapshot directory or `_metadata`
        that is a link, or one storage does not let this process look into, counts:
        reading it fails for this one snapshot, and the others are still listed."""
        try:
            return self.fs.exists(self.layout.metadata_path(kind, snapshot_id))
        except (SymbolicLinkError, PermissionError):
            return True

    def highest_snapshot_id(self) -> int | None:
        """The highest id of a snapshot directory in the job's storage (`chk-N`, `sp-N`,
        with a `_metadata` or not, of whichever registry), None if there is none: a registry
        the storage was handed over to continues its ids above the savepoints kept there."""
        kinds = (CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT)
        return max((i for kind in kinds for i in self._snapshot_dir_ids(kind)), default=None)

    def discard_checkpoint(
        self,
        checkpoint_id: int,
        retained: Iterable[int],
        protected_locations: Iterable[str] = (),
    ) -> None:
        """Delete checkpoint `checkpoint_id` and the shared files only it needed.

        Shared files referenced by a `retained` checkpoint's manifest or listed in
        `protected_locations` (files an in-flight snapshot is about to reference) are kept.

        Crash safety: first the manifest moves from `_metadata` to `_discarding`, so the
        checkpoint is never mistaken for a complete one again; then its shared files go;
        then its directory. Calling this again after a crash at any step finishes the job;
        discarding a checkpoint that is already gone does nothing. If a retained
        checkpoint's `_metadata` cannot be read, this raises before deleting anything; if
        this checkpoint's own is damaged, its shared files are left to garbage collection.
        """
        retained_ids = set(retained)
        if checkpoint_id in retained_ids:
            raise ValueError(f"checkpoint {checkpoint_id} cannot be discarded and retained")
        # Read everything needed before changing anything, so bad input changes nothing.
        keep = self._referenced_locations(retained_ids) | set(protected_locations)
        self.fs.require_no_link(self.layout.checkpoint_dir(checkpoint_id))
        manifest = self._manifest_to_discard(checkpoint_id)
        if manifest is not None:
            deleted = sorted(manifest.locations - keep)
            with self._changing(deleted):
                self.fs.delete_files(map(self.layout.location_path, deleted))
        directory = self.layout.checkpoint_dir(checkpoint_id)
        self._delete_snapshot_dir(directory, holds_another_job=self._holds_another_job(directory))

    def discard_savepoint(self, savepoint_id: int) -> None:
        """Delete savepoint `savepoint_id` (its `_metadata` first, then its directory)."""
        self.fs.require_no_link(self.layout.savepoint_dir(savepoint_id))
        self.fs.delete_file(self.layout.metadata_path(CheckpointKind.SAVEPOINT, savepoint_id))
        directory = self.layout.savepoint_dir(savepoint_id)
        self._delete_snapshot_dir(directory, holds_another_job=self._holds_another_job(directory))

    def collect_garbage(
        self,
        registered_checkpoints: Iterable[int],
        registered_savepoints: Iterable[int],
        protected_locations: Iterable[str] = (),
    ) -> GarbageReport:
        """Delete what the registry does not know about and return what was deleted.

        - `chk-N` directories of unregistered checkpoints, even with a valid `_metadata`
          (written just before a crash, so never confirmed);
        - `sp-N` directories without `_metadata` that are not registered (savepoints cut
          short); an unregistered savepoint *with* `_metadata` is the user's and is kept;
        - shared files (including temporary files of interrupted copies) that no
          registered checkpoint references and that are not in `protected_locations`, of
          the names storage writes there (`_is_shared_file_name`; others are kept, with a
          warning); of a snapshot directory that holds another job's `owner.json`, only
          this job's `_metadata` and `_discarding` (`_delete_snapshot_dir`);
        - on S3, the multipart uploads below the job's directory that a writer killed
          midway left unfinished (no listing shows them; they are billed until aborted):
          garbage collection runs while nothing of the job uploads. A store that refuses
          to list or abort them keeps them, with a warning.

        If a registered checkpoint's `_metadata` cannot be read, a symbolic link is in the
        way (SymbolicLinkError) or an object's key below `shared/` is not a location (`..`
        segments), this raises StorageError before deleting anything: storage disagrees with
        the registry, or was tampered with, which needs a human.
        """
        checkpoint_ids = set(registered_checkpoints)
        savepoint_ids = set(registered_savepoints)
        keep = self._referenced_locations(checkpoint_ids) | set(protected_locations)

        # Everything to delete is decided, and checked for links, before the first delete.
        unregistered_checkpoints = [
            checkpoint_id
            for checkpoint_id in self._snapshot_dir_ids(CheckpointKind.CHECKPOINT)
            if checkpoint_id not in checkpoint_ids
        ]
        holding_another_job = {
            checkpoint_id
            for checkpoint_id in unregistered_checkpoints
            if self._holds_another_job(self.layout.checkpoint_dir(checkpoint_id))
        }
        deleted_checkpoints = [
            checkpoint_id
            for checkpoint_id in unregistered_checkpoints
            if (
                checkpoint_id not in holding_another_job
                or self.fs.exists(
                    self.layout.metadata_path(CheckpointKind.CHECKPOINT, checkpoint_id)
                )
                or self.fs.exists(self.layout.discarding_path(checkpoint_id))
            )
        ]
        deleted_savepoints = [
            savepoint_id
            for savepoint_id in self._snapshot_dir_ids(CheckpointKind.SAVEPOINT)
            if savepoint_id not in savepoint_ids
            and not self.fs.exists(
                self.layout.metadata_path(CheckpointKind.SAVEPOINT, savepoint_id)
            )
            and not self._holds_another_job(self.layout.savepoint_dir(savepoint_id))
        ]
        shared: list[str] = []
        foreign: list[str] = []
        for relative in self.fs.list_files(self.layout.shared_dir):
            # An object store's key can hold `..` segments: deleted by its name, it could
            # take a file outside the job's directory with it. A local listing has none (a
            # name with a line break in it is garbage like any other).
            location = f"{SHARED_DIR_NAME}/{relative}"
            if not self.fs.is_local and not is_safe_relative_path(location):
                raise StorageError(
                    f"{self.layout.job_root}/{printable_line(location)}",
                    "an object key that is no location ('.', '..', empty or control-character "
                    "segments), maybe placed to delete outside the job's directory: remove it",
                )
            (shared if _is_shared_file_name(relative) else foreign).append(location)
        if foreign:
            logger.warning(
                "%s: %d file(s) of a kind storage never writes there are kept (another job's "
                "storage directory inside this one's?), e.g. %s",
                self.layout.job_root,
                len(foreign),
                printable_line(foreign[0]),
            )
        deleted_locations = [location for location in shared if location not in keep]
        # Listed, not a manifest's: checked above where a name could leave the directory.
        deleted_paths = [f"{self.layout.job_root}/{location}" for location in deleted_locations]
        self._require_no_links(
            [self.layout.checkpoint_dir(checkpoint_id) for checkpoint_id in deleted_checkpoints]
        )

        for checkpoint_id in deleted_checkpoints:
            # `_metadata` first, as in discard_checkpoint.
            self.fs.delete_file(self.layout.metadata_path(CheckpointKind.CHECKPOINT, checkpoint_id))
            self._delete_snapshot_dir(
                self.layout.checkpoint_dir(checkpoint_id),
                holds_another_job=checkpoint_id in holding_another_job,
            )
        for savepoint_id in deleted_savepoints:
            self.fs.delete_tree(self.layout.savepoint_dir(savepoint_id))
        with self._changing(deleted_locations):
            self.fs.delete_files(deleted_paths)
        try:
            aborted = self.fs.abort_unfinished_uploads(self.layout.job_root)
        except (StorageError, OSError) as error:
            # Only garbage stays, and what was deleted above is deleted: the collection did
            # its work, so this is a warning, not its failure.
            logger.warning(
                "cannot abort the unfinished uploads below %s (S3 needs "
                "s3:ListBucketMultipartUploads and s3:AbortMultipartUpload): %s",
                self.layout.job_root,
                error,
            )
            aborted = 0

        return GarbageReport(
            checkpoint_ids=tuple(deleted_checkpoints),
            savepoint_ids=tuple(deleted_savepoints),
            shared_locations=tuple(deleted_locations),
            aborted_uploads=aborted,
        )

    def materialize(self, meta: CheckpointMetadata, target_dir: str) -> None:
        """Restore a snapshot: copy every manifest file to `target_dir/<path>`.

        `target_dir` is a local directory that must be absent or empty (NotEmptyError
        otherwise): a restore never merges into an existing Spark checkpoint location.
        Every file's SHA-256 is checked while it is copied; on any error everything
        written so far is removed (and `target_dir` too, if this call created it) before
        the error propagates.
        """
        if os.path.lexists(target_dir):
            if not os.path.isdir(target_dir):
                raise NotEmptyError(target_dir, "exists and is not a directory")
            if os.listdir(target_dir):
                raise NotEmptyError(target_dir, "is not empty; a restore needs a fresh directory")
            created = False
        else:
            os.makedirs(target_dir)
            created = True
        try:
            for entry in meta.files:
                self.fs.copy_out(
                    self.layout.location_path(entry.location),
                    os.path.join(target_dir, *entry.path.split("/")),
                    FileDigest(size=entry.size, sha256=entry.sha256),
                )
        except BaseException:
            _empty_directory(target_dir, remove=created)
            raise

    def _read_manifest(
        self, path: str, kind: CheckpointKind, snapshot_id: int
    ) -> CheckpointMetadata:
        return self._parse_manifest(_read_metadata_file(self.fs, path), path, kind, snapshot_id)

    def _parse_manifest(
        self, data: bytes, path: str, kind: CheckpointKind, snapshot_id: int
    ) -> CheckpointMetadata:
        meta = CheckpointMetadata.from_bytes(data, source=path)
        # A `_metadata` copied from another job or directory would reference the wrong files.
        for field, actual, expected in (
            ("namespace", meta.namespace, self.layout.namespace),
            ("job", meta.job, self.layout.job),
            ("kind", meta.kind.value, CheckpointKind(kind).value),
            ("checkpoint_id", meta.checkpoint_id, snapshot_id),
        ):
            if actual != expected:
                raise InvalidMetadataError(
                    path,
                    field,
                    f"is {actual!r} but the file's directory is for {expected!r}: a "
                    "snapshot is read only where it was written "
                    "(<root>/<namespace>/<job>/chk-N or .../savepoints/sp-N)",
                )
        return meta

    def _manifest_to_discard(self, checkpoint_id: int) -> CheckpointMetadata | None:
        """The manifest of a checkpoint being discarded, moved to `_discarding` first;
        None if even that is gone (its shared files were handled already), or damaged
        (its shared files are then left to garbage collection, which deletes the ones no
        registered checkpoint names: a damaged image is no image, and would otherwise stay
        for ever, its discard failing at each try)."""
        kind = CheckpointKind.CHECKPOINT
        metadata_path = self.layout.metadata_path(kind, checkpoint_id)
        discarding_path = self.layout.discarding_path(checkpoint_id)
        for path in (metadata_path, discarding_path):
            if not self.fs.exists(path):
                continue
            data = _read_metadata_file(self.fs, path)
            try:
                manifest = self._parse_manifest(data, path, kind, checkpoint_id)
            except _DAMAGED_METADATA as error:
                logger.warning(
                    "checkpoint %d is discarded without its shared files, which garbage "
                    "collection deletes once no checkpoint names them: %s",
                    checkpoint_id,
                    error,
                )
                self.fs.delete_file(path)
                return None
            self._require_no_links(manifest)  # before the first change
            if path == metadata_path:
                self.fs.write_atomic(discarding_path, data)
                self.fs.delete_file(metadata_path)
            return manifest
        return None

    def _referenced_locations(self, checkpoint_ids: Iterable[int]) -> set[str]:
        locations: set[str] = set()
        for checkpoint_id in checkpoint_ids:
            locations |= self.read_metadata(CheckpointKind.CHECKPOINT, checkpoint_id).locations
        return locations

    def _holds_another_job(self, directory: str) -> bool:
        """Whether another job's storage directory lies below `directory` (its
        `owner.json`): a job whose storage root was set inside this one's (a name of its
        namespace and job that is a `chk-N` here) lost everything to this job's deletes.
        Said as a warning: the directory is left, with what it holds."""
        try:
            files = self.fs.list_files(directory)
        except SymbolicLinkError:
            return False  # deleting the tree removes a link in it, never what it points at
        inside = [relative for relative in files if posixpath.basename(relative) == OWNER_FILE_NAME]
        if inside:
            logger.warning(
                "%s/%s: another job's storage directory lies inside this job's; left as it is",
                directory,
                printable_line(posixpath.dirname(inside[0]) or "."),
            )
        return bool(inside)

    def _delete_snapshot_dir(self, directory: str, *, holds_another_job: bool) -> None:
        """Delete a snapshot's directory once its `_metadata` is gone; where another job's
        storage lies inside it (`_holds_another_job`), only what a snapshot keeps at its top
        (`_metadata`, `_discarding`: left, either would show a snapshot that is gone)."""
        if not holds_another_job:
            self.fs.delete_tree(directory)
            return
        for name in (METADATA_FILE_NAME, DISCARDING_FILE_NAME):
            self.fs.delete_file(f"{directory}/{name}")

    def _snapshot_dir_ids(self, kind: CheckpointKind) -> list[int]:
        names = self.fs.list_dir(self.layout.snapshot_parent_dir(kind))
        return sorted(
            snapshot_id
            for snapshot_id in (parse_snapshot_dir_name(kind, name) for name in names)
            if snapshot_id is not None
        )

    def _require_no_links(self, what: Iterable[str] | CheckpointMetadata) -> None:
        """Raise SymbolicLinkError if one of these paths (or a manifest's files) goes
        through a link: checked for all before a multi-step delete changes anything."""
        if isinstance(what, CheckpointMetadata):
            what = [self.layout.location_path(location) for location in sorted(what.locations)]
        for path in what:
            self.fs.require_no_link(path)

    @contextlib.contextmanager
    def _changing(self, locations: Iterable[str]) -> Iterator[None]:
        """Around replacing or deleting these locations: what this process knew of them
        (durable, stored with a size) stops being true. Forgotten before and after, since a
        listing that ran in between shows either state."""
        locations = list(locations)
        self._forget(locations)
        try:
            yield
        finally:
            self._forget(locations)

    def _forget(self, locations: list[str]) -> None:
        with self._lock:
            self._forgets += 1
            self._durable.difference_update(locations)
            if self._known_sizes is not None:
                for location in locations:
                    self._known_sizes.pop(location, None)

    def _require_stored_size(self, entry: ManifestEntry, size: int | None) -> None:
        """Check that `entry` is stored with its size (`size`: the stored file's, or None)."""
        if size == entry.size:
            return
        stored_path = self.layout.location_path(entry.location)
        if size is None:
            raise MissingFileError(stored_path, f"file {entry.path!r} of the manifest is missing")
        raise ChecksumMismatchError(stored_path, "size", f"{entry.size} bytes", f"{size} bytes")


# What makes a `_metadata` no manifest of this job's checkpoint: damaged, cut short, of a
# format this version does not read, or another snapshot's.
_DAMAGED_METADATA = (InvalidMetadataError, TruncatedMetadataError, UnknownFormatVersionError)


def _read_metadata_file(fs: StorageFileSystem, path: str) -> bytes:
    """A `_metadata` as stored, read up to one byte past what its parser accepts: a damaged
    file of gigabytes is refused for its size, not read."""
    return fs.read_bytes(path, at_most=MAX_DOCUMENT_BYTES + 1)


def _empty_directory(directory: str, remove: bool) -> None:
    """Remove what a failed restore wrote: everything in `directory`, which was empty."""
    if remove:
        shutil.rmtree(directory)
        return
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
