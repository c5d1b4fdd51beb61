"""``spark-checkpoint run --from``: the image a local run restores instead of the newest,
checked before Spark starts (known to the job's registry, its files intact)."""

import argparse
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from spark_checkpoint.protocol import MAX_ID, RestoreCandidate
from spark_checkpoint.storage import (
    CheckpointKind,
    CheckpointStorage,
    MissingFileError,
    SnapshotAddress,
    StorageAccessError,
    StorageError,
    UnregisteredCheckpointError,
    local_uri,
    metadata_location,
    parse_snapshot_address,
    parse_snapshot_dir_name,
    storage_failure,
)
from spark_checkpoint_operator.coordinator import OutcomeStatus, PersistedState


class UnknownImage(Exception):
    """The image named by ``--from`` cannot be restored; the message says why."""


@dataclass(frozen=True, slots=True)
class ChosenImage:
    """The image ``--from`` names: its restore candidate's encoding, and the job's own
    snapshot it is in the job's storage (registered or not; None: another job's)."""

    candidate: str
    own: tuple[CheckpointKind, int] | None


def image_choice(choice: str, kinds: Sequence[CheckpointKind] = tuple(CheckpointKind)) -> str:
    """``choice`` if it is spelled as `chosen_image` takes it; ValueError otherwise, before
    a manifest is read. `kinds`: the kinds of image the option takes, which a hint names."""
    if not choice:
        raise ValueError("is empty: give savepoint:N, checkpoint:N or a path")
    registry_reference(choice)
    if (meant := _registry_references_meant(choice, kinds)) and not os.path.lexists(choice):
        raise ValueError(f"{choice!r} is no path here: for the job's image, write {meant}")
    return choice


# An image's kind and id as a newcomer spells them: any case, any separator.
_OTHER_SPELLING = re.compile(r"(?i)(checkpoint|savepoint)[:_ -]?(0|[1-9][0-9]*)")


def _registry_references_meant(choice: str, kinds: Sequence[CheckpointKind]) -> str:
    """What an image's id alone (`4`), its directory's name (`sp-4`, `SP-4`) or its kind
    spelt otherwise (`SAVEPOINT:4`, `savepoint-4`), the spellings a newcomer tries first,
    stand for among `kinds`; "" for anything else."""
    if choice.isascii() and choice.isdigit():
        return " or ".join(f"{kind}:{int(choice)}" for kind in kinds)
    if (spelt := _OTHER_SPELLING.fullmatch(choice)) is not None:
        meant = f"{spelt[1].lower()}:{spelt[2]}"
        return meant if meant != choice and CheckpointKind(spelt[1].lower()) in kinds else ""
    for kind in kinds:
        if (image_id := parse_snapshot_dir_name(kind, choice.lower())) is not None:
            return f"{kind}:{image_id}"
    return ""


def image_argument(choice: str, kinds: Sequence[CheckpointKind] = tuple(CheckpointKind)) -> str:
    """`image_choice` as an argparse ``type``: a misspelt image is a usage error."""
    try:
        return image_choice(choice, kinds)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def registry_reference(choice: str) -> RestoreCandidate | None:
    """The registry's image ``choice`` names as ``savepoint:N`` or ``checkpoint:N``; None
    for a path (or URI); ValueError for ``kind:`` and something that is no id."""
    kind = choice.partition(":")[0]
    if kind not in set(CheckpointKind) or "://" in choice:
        return None
    try:
        return RestoreCandidate.decode(choice)
    except ValueError:
        raise ValueError(
            f"{choice!r} is not {kind}:N with N an id (0 to {MAX_ID}, no leading 0); for a "
            f"path of that name, write ./{choice}"
        ) from None


def chosen_image(choice: str, registry: PersistedState, storage: CheckpointStorage) -> ChosenImage:
    """The restore candidate ``choice`` names: ``savepoint:N`` or
    ``checkpoint:N`` of the job's registry, or the PATH (or URI) of a savepoint's or a
    retained checkpoint's directory or ``_metadata`` (this job's or another's, as Flink's
    ``run -s``). Raises `UnknownImage` if it is not registered or not intact."""
    try:
        candidate = registry_reference(choice)
    except ValueError as error:
        raise UnknownImage(str(error)) from None
    if candidate is not None:
        kind, snapshot_id = candidate.kind, candidate.snapshot_id
        assert snapshot_id is not None
        registered = (
            registry.checkpoints if kind is CheckpointKind.CHECKPOINT else registry.savepoints
        )
        if snapshot_id not in [c.checkpoint_id for c in registered]:
            raise _unregistered(choice, kind, snapshot_id, registry, storage)
        _require_intact(storage, kind, snapshot_id, choice)
        return ChosenImage(candidate.encode(), (kind, snapshot_id))
    return _external(choice, registry, storage)


def _unregistered(
    choice: str,
    kind: CheckpointKind,
    snapshot_id: int,
    registry: PersistedState,
    storage: CheckpointStorage,
) -> UnknownImage:
    by_kind = {
        CheckpointKind.CHECKPOINT: registry.checkpoints,
        CheckpointKind.SAVEPOINT: registry.savepoints,
    }
    known = ", ".join(str(c.checkpoint_id) for c in by_kind[kind]) or "none"
    other = next(k for k in by_kind if k is not kind)
    if any(c.checkpoint_id == snapshot_id for c in by_kind[other]):
        # One counter numbers both kinds: the id is the other kind's (a newcomer's).
        hint = f"; {snapshot_id} is a {other}: {other}:{snapshot_id}"
    elif kind is CheckpointKind.SAVEPOINT:
        hint = _another_registrys(storage, snapshot_id)
    else:
        hint = ""  # a checkpoint is restored from the job's own storage by its registry
    return UnknownImage(f"{choice} is not a registered {kind} of the job ({kind}s: {known}){hint}")


def _another_registrys(storage: CheckpointStorage, savepoint_id: int) -> str:
    """How to restore the savepoint of that id in the job's storage that the registry does
    not list (another registry's, kept when the storage was handed over): by its path, or
    why its `_metadata` cannot be read (the path would be refused next; its files are
    verified only when it is restored: a savepoint's files may be GiB); "" if there is
    none, or this process cannot read the storage (its credentials are the driver's)."""
    stored = storage.layout.metadata_path(CheckpointKind.SAVEPOINT, savepoint_id)
    try:
        storage.read_metadata(CheckpointKind.SAVEPOINT, savepoint_id)
    except MissingFileError:
        return ""
    except (StorageAccessError, OSError):
        return ""  # no verdict on the savepoint: as if it could not be looked for
    except (StorageError, ValueError) as error:
        return (
            f"; the one in the job's storage is not this registry's and cannot be restored: {error}"
        )
    return (
        "; the one in the job's storage is not this registry's: to restore it, name its path: "
        f"--from {stored.removeprefix('file://')}"
    )


def snapshot_uri(choice: str) -> str:
    """The URI of the `_metadata` that `choice` names: a local path, a ``file:`` URI in any
    of its spellings (Hadoop prints ``file:/path``) or another store's URI. A local path is
    made absolute as written (``..`` taken away, but no link followed: a link in the job's
    storage is refused when read, naming it); another store's URI keeps no ``.`` or ``..``
    (its keys are names: no image is there)."""
    if choice[:5].lower() == "file:":
        # fsspec: `file://x` is x in the working directory, `file:///x` and `file:/x` are /x,
        # and so is `file://localhost/x` (RFC 8089).
        rest = choice[5:]
        local_host = "//localhost/"
        choice = rest[len(local_host) - 1 :] if rest.startswith(local_host) else rest
        choice = choice.removeprefix("//")
    if "://" not in choice:
        return metadata_location(local_uri(os.path.abspath(choice)))
    if {".", ".."} & set(choice.split("://", 1)[1].split("/")):
        raise ValueError("a '.' or '..' in a URI names no checkpoint or savepoint")
    return metadata_location(choice)


def _external(choice: str, registry: PersistedState, storage: CheckpointStorage) -> ChosenImage:
    try:
        uri = snapshot_uri(choice)
        address = parse_snapshot_address(uri)
        source = CheckpointStorage(address.layout, fresh=True)  # in the driver's environment
    except ValueError as error:  # not a snapshot's place, a bad name, an unknown protocol
        raise UnknownImage(
            f"{choice} is not savepoint:N, checkpoint:N or the path of a checkpoint or a "
            f"savepoint: {error}"
        ) from None
    except (ImportError, OSError) as error:  # no library for it here (an image without gcsfs)
        raise UnknownImage(f"{choice} cannot be read here: {error}") from None
    kind, snapshot_id = address.kind, address.snapshot_id
    own = source.is_same_job_directory(storage)
    try:
        chosen = image_at(uri, address, registry, own=own)
    except UnknownImage:
        if kind is CheckpointKind.CHECKPOINT:
            try:
                source.read_metadata(kind, snapshot_id)
            except MissingFileError as error:  # discarded, or never there (a newcomer's)
                raise UnknownImage(f"the {kind} cannot be restored: {error}") from None
            except (StorageError, OSError, ValueError):
                pass  # whatever else is wrong with it, it is not this run's to restore
        raise
    if not RestoreCandidate.decode(chosen.candidate).is_external:
        _require_intact(storage, kind, snapshot_id, choice)
    else:
        _require_intact(source, kind, snapshot_id, f"the {kind}")  # its errors name the path
    return chosen


def image_at(
    uri: str, address: SnapshotAddress, registry: PersistedState, *, own: bool
) -> ChosenImage:
    """The restore candidate of the image at `uri` (`address`), by what the registry
    lists, without reading storage: one of the job's own registered images (`own`: `uri`
    is in the job's directory) is restored as the registry's (savepoint:N, as `savepoint`
    and `list` print its path); anything else by its path, as another job's. Raises
    `UnknownImage` for a checkpoint of the job's own that the registry does not list."""
    kind, snapshot_id = address.kind, address.snapshot_id
    registered = registry.checkpoints if kind is CheckpointKind.CHECKPOINT else registry.savepoints
    if own and snapshot_id in {s.checkpoint_id for s in registered}:
        return ChosenImage(
            RestoreCandidate.registered(kind, snapshot_id).encode(), (kind, snapshot_id)
        )
    if own and kind is CheckpointKind.CHECKPOINT:
        raise UnknownImage(str(UnregisteredCheckpointError(uri)))
    return ChosenImage(
        RestoreCandidate.external(uri).encode(), (kind, snapshot_id) if own else None
    )


def why_gone(registry: PersistedState, kind: CheckpointKind, snapshot_id: int) -> str | None:
    """Why the job's storage holds no image of ``kind`` and ``snapshot_id`` that its
    registry took, by the registry alone; None if it does not tell (its history is
    short; an earlier registry's may be there)."""
    if snapshot_id >= registry.next_checkpoint_id:
        # Not the id counter: it reserves a block of ids ahead (at 101 after one snapshot).
        ids = [o.checkpoint_id for o in registry.history]
        ids += [image.checkpoint_id for image in (*registry.checkpoints, *registry.savepoints)]
        newest = f"the job's newest id is {max(ids)}" if ids else "the job has taken none yet"
        return f"was never taken ({newest})"
    if any(
        (outcome.kind, outcome.checkpoint_id) == (kind, snapshot_id)
        and outcome.status is OutcomeStatus.COMPLETED
        for outcome in registry.history
    ):
        return LET_GO[kind]
    return None


# Why a completed image the registry no longer lists is gone.
LET_GO = {
    CheckpointKind.CHECKPOINT: (
        "was deleted: the job keeps only its newest checkpoints (spec.checkpointing.retained)"
    ),
    # The registry records no disposal: which of the two, the job's events say.
    CheckpointKind.SAVEPOINT: (
        "was deleted: the savepoint history let it go (spec.savepoints), or it was disposed of"
    ),
}


def _require_intact(
    storage: CheckpointStorage, kind: CheckpointKind, snapshot_id: int, named: str
) -> None:
    try:
        storage.verify(storage.read_metadata(kind, snapshot_id))
    except (StorageError, OSError, ValueError) as error:
        # Its path first, no errno: "<...>/sp-5: Not a directory" (a file where it was).
        reason = storage_failure(error, storage.layout.job_root)
        raise UnknownImage(f"{named} cannot be restored: {reason}") from None
