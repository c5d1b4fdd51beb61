"""Where a job's checkpoints, savepoints and shared files live in storage.

    <root>/<namespace>/<job>/chk-<N>/_metadata
    <root>/<namespace>/<job>/shared/<sha256[:2]>/<sha256>-<file name>
    <root>/<namespace>/<job>/savepoints/sp-<N>/_metadata
    <root>/<namespace>/<job>/savepoints/sp-<N>/files/<path in the Spark checkpoint location>

Manifests refer to stored bytes by *location*, a path relative to the job root, so a job's
storage can be moved to another root (or bucket) without rewriting its `_metadata` files.
Every name that becomes part of a path is validated here, so no value read from a
resource or a `_metadata` file can point outside the job's directory.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass

from spark_checkpoint.protocol import MAX_ID, CheckpointKind

# Python's `$` also matches before a trailing newline; this matches only at the very end,
# in Python's `re` and in ECMA-262 regexes alike (the patterns also go into the JSON Schema).
END_OF_INPUT = r"(?![\s\S])"
# Kubernetes' names (k8s.io/apimachinery/pkg/util/validation), spelled as it spells them and
# unanchored: RE2, ECMA-262 and Python read these alike. Anchored below for Python and JSON
# Schema; the CRD anchors them with ^...$, as RE2 has no lookahead (see manifest.validation).
DNS_1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_1123_SUBDOMAIN = rf"{DNS_1123_LABEL}(\.{DNS_1123_LABEL})*"

DNS_1123_LABEL_PATTERN = rf"^{DNS_1123_LABEL}{END_OF_INPUT}"
DNS_1123_LABEL_MAX_LENGTH = 63
DNS_1123_SUBDOMAIN_PATTERN = rf"^{DNS_1123_SUBDOMAIN}{END_OF_INPUT}"
DNS_1123_SUBDOMAIN_MAX_LENGTH = 253

# A path segment is anything but "." and "..", without "/", "\\" or control characters:
# Azure Blob Storage reads a backslash as "/", so a name with one could hold ".." segments
# there (one object under two spellings, or a delete's request path resolved to another
# job's object).
_PATH_SEGMENT = r"(?!\.\.?(?:/|$))[^/\\\x00-\x1f\x7f]+"
SAFE_RELATIVE_PATH_PATTERN = rf"^{_PATH_SEGMENT}(?:/{_PATH_SEGMENT})*{END_OF_INPUT}"
SHA256_PATTERN = rf"^[0-9a-f]{{64}}{END_OF_INPUT}"

METADATA_FILE_NAME = "_metadata"


def local_uri(path: str | os.PathLike[str]) -> str:
    """The ``file://`` URI of the absolute local `path` as storage reads it: the path as it
    is, never percent-encoded. fsspec takes what follows ``file://`` as the path, so
    `Path.as_uri`'s ``%20`` for a space named another directory (a run in ``my dir``
    stored its checkpoints in ``my%20dir``)."""
    return f"file://{os.fspath(path)}"


def storage_place(root: str) -> str:
    """A storage root however it is spelled, for comparing two without reaching either:
    a local one as its path (``/data``, ``file:///data/``, ``local:///data``), ``s3a://``
    as ``s3://``, ``gcs://`` as ``gs://``, no trailing ``/``."""
    same_places = (("file://", ""), ("local://", ""), ("s3a://", "s3://"), ("gcs://", "gs://"))
    for scheme, same in same_places:
        if root.startswith(scheme):
            root = same + root.removeprefix(scheme)
            break
    return root.rstrip("/") or "/"


def metadata_location(snapshot: str) -> str:
    """The `_metadata` of the snapshot that `snapshot` names by its directory or by its
    `_metadata` (a user may give either)."""
    snapshot = snapshot.rstrip("/")
    if snapshot.endswith(f"/{METADATA_FILE_NAME}"):
        return snapshot
    return f"{snapshot}/{METADATA_FILE_NAME}"


# A checkpoint being discarded keeps its manifest under this name until its shared files
# are gone, so that a discard interrupted by a crash can be finished (see CheckpointStorage).
DISCARDING_FILE_NAME = "_discarding"
SHARED_DIR_NAME = "shared"
SAVEPOINTS_DIR_NAME = "savepoints"
SAVEPOINT_FILES_DIR_NAME = "files"
# Held (flock) by a local run for as long as it runs, on local storage: one writer per job
# (see CheckpointStorage), whichever state directory the run keeps its registry in. Not the
# state directory's `run.lock`: a state directory may be the storage root too.
WRITER_LOCK_FILE_NAME = "writer.lock"
# The registry the job's storage belongs to (`StorageOwner`, `CheckpointStorage.claim`).
OWNER_FILE_NAME = "owner.json"


# Prefix of a snapshot directory's name; the id follows it: `chk-7`, `sp-2`.
_DIRECTORY_PREFIX = {CheckpointKind.CHECKPOINT: "chk-", CheckpointKind.SAVEPOINT: "sp-"}


def snapshot_dir_name(kind: CheckpointKind, snapshot_id: int) -> str:
    """The name of a snapshot's directory: `chk-7`, `sp-2`."""
    return f"{_DIRECTORY_PREFIX[kind]}{snapshot_id}"


_REMOTE_URI = re.compile(
    r"(?!(?i:file|local)://)(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://(?P<authority>[^/]*)(?P<path>.*)",
    re.DOTALL,
)
GLOB_CHARACTERS = "*?["
# s3fs and gcsfs take what precedes the first / for the bucket (or an S3 access point's ARN).
_BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs")
_BUCKET = re.compile(
    r"([A-Za-z0-9._-]+|arn:[A-Za-z0-9-]+:s3[A-Za-z0-9-]*:[A-Za-z0-9-]*:[0-9]*:"
    r"(outpost/[A-Za-z0-9-]+/)?accesspoint/[A-Za-z0-9._-]+)(/|$)"
)
# Azure's container names (and its special containers), then the account adlfs may name;
# or the account's Data Lake host (adlfs takes any other host for the container).
_CONTAINER_SCHEMES = ("abfs", "abfss", "az")
_CONTAINER_NAME = r"([a-z0-9][a-z0-9-]{1,61}[a-z0-9]|\$root|\$web|\$logs)"
_CONTAINER = re.compile(
    rf"({_CONTAINER_NAME}(@[A-Za-z0-9.-]+(:[0-9]+)?)?"
    rf"|[A-Za-z0-9.-]*\.dfs\.core\.windows\.net(:[0-9]+)?/{_CONTAINER_NAME})(/|$)"
)
# A user and a password before an '@', in what follows `scheme://`: a password may hold
# '/' (AWS secret keys do, first too), ':' and '@', or be digits; a port is digits followed
# by the path or nothing, and an access point's ARN ('arn:aws:s3:...') is no user and
# password.
_PASSWORD = re.compile(r"(?!arn:)(?P<user>[^/@\[:]*):(?:[0-9]*|[0-9]*[^/@0-9][^@]*|/[^@]*)@")
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


def remote_uri_problem(uri: str) -> str | None:
    """Why fsspec would not name exactly ``uri``'s objects, for a URI of a remote
    filesystem (an object store, HDFS); None for a good one or a local path. fsspec
    expands ``*``, ``?`` and ``[`` as a pattern in deletes (another job's objects would
    match), and s3fs lists an empty segment's keys under another prefix than it writes.
    A password in the URI would be echoed by botocore's errors, s3fs and adlfs fail every
    call on a bucket or container name they cannot send, and Azure (Azurite) stores a
    backslash as '/', below which nothing of the job is listed. The CRD's rules for
    storage URIs say the same (a test holds them to it)."""
    match = _REMOTE_URI.fullmatch(uri)
    if match is None:
        return None
    if _PASSWORD.match(match["authority"] + match["path"]):
        return (
            "carries a password (user:password@): credentials come from the environment "
            "(spec.driver.env, Secrets)"
        )
    if _CONTROL_CHARACTER.search(uri):
        return "contains a control character (a tab, say)"
    if match["scheme"] in _BUCKET_SCHEMES and not _BUCKET.match(match["authority"] + match["path"]):
        return (
            "does not start with its bucket's name (letters, digits, '.', '-' and '_') or an "
            "S3 access point's ARN, as s3://bucket/path"
        )
    if match["scheme"] in _CONTAINER_SCHEMES and not _CONTAINER.match(
        match["authority"] + match["path"]
    ):
        return (
            "does not start with its container's name (3-63 lowercase letters, digits and "
            "'-'), as abfs://container/path or abfs://container@account.dfs.core.windows.net/path, "
            "or with its account's Data Lake host, as "
            "abfs://account.dfs.core.windows.net/container/path"
        )
    if "\\" in match["path"]:
        return (
            "contains a backslash, which Azure Blob Storage takes for '/': the job would "
            "write where it never lists"
        )
    if pattern := sorted(set(GLOB_CHARACTERS) & set(match["path"])):  # [::1] is a host
        return (
            f"contains {' and '.join(repr(c) for c in pattern)}, which fsspec reads as a "
            "pattern: a delete would match other paths"
        )
    segments = match["path"].removesuffix("/").split("/")[1:]
    if odd := [segment for segment in segments if segment in ("", ".", "..")]:
        return f"has {'an empty' if odd[0] == '' else f'a {odd[0]!r}'} path segment"
    return None


def hide_password(uri: str) -> str:
    """``uri`` to be shown in a message: a password in it replaced by ``***`` (up to its
    last '@': more rather than less)."""
    match = _REMOTE_URI.fullmatch(uri)
    if match is None:
        return uri
    rest = match["authority"] + match["path"]
    if not (password := _PASSWORD.match(rest)):
        return uri
    return f"{match['scheme']}://{password['user']}:***@{rest[rest.rindex('@') + 1 :]}"


def is_safe_relative_path(path: str) -> bool:
    """True for a relative POSIX path that stays below the directory it is joined to."""
    return re.match(SAFE_RELATIVE_PATH_PATTERN, path) is not None


def require_safe_relative_path(path: str, field: str) -> None:
    """Raise ValueError naming `field` unless `path` is a safe relative path."""
    if not is_safe_relative_path(path):
        raise ValueError(
            f"{field} must be a relative path without '.', '..', empty or control-character "
            f"segments or backslashes, got {path!r}"
        )


def require_snapshot_id(snapshot_id: int, field: str) -> None:
    """Raise ValueError naming `field` unless `snapshot_id` is a valid (non-negative) id."""
    if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int) or snapshot_id < 0:
        raise ValueError(f"{field} must be a non-negative integer, got {snapshot_id!r}")


def require_dns_1123_label(value: str, field: str) -> None:
    """Raise ValueError naming `field` unless `value` is a DNS-1123 label (a namespace)."""
    if len(value) > DNS_1123_LABEL_MAX_LENGTH or not re.match(DNS_1123_LABEL_PATTERN, value):
        raise ValueError(
            f"{field} must be a DNS-1123 label (lower-case alphanumerics and '-', at most "
            f"{DNS_1123_LABEL_MAX_LENGTH} characters), got {value!r}"
        )


def require_dns_1123_subdomain(value: str, field: str) -> None:
    """Raise ValueError naming `field` unless `value` is a DNS-1123 subdomain (a resource name)."""
    if len(value) > DNS_1123_SUBDOMAIN_MAX_LENGTH or not re.match(
        DNS_1123_SUBDOMAIN_PATTERN, value
    ):
        raise ValueError(
            f"{field} must be a DNS-1123 subdomain (dot-separated labels of lower-case "
            f"alphanumerics and '-', at most {DNS_1123_SUBDOMAIN_MAX_LENGTH} characters), "
            f"got {value!r}"
        )


def snapshot_location_prefix(kind: CheckpointKind, snapshot_id: int) -> str:
    """The location prefix every manifest entry of this snapshot must have.

    Checkpoints keep their bytes in `shared/` (incremental: later checkpoints reuse them);
    a savepoint keeps all of its bytes below its own directory, so deleting or moving the
    directory never affects anything else.
    """
    if kind is CheckpointKind.CHECKPOINT:
        return f"{SHARED_DIR_NAME}/"
    return f"{SAVEPOINTS_DIR_NAME}/sp-{snapshot_id}/{SAVEPOINT_FILES_DIR_NAME}/"


def shared_location(sha256: str, file_name: str) -> str:
    """Content-addressed location of a checkpoint file: equal bytes under an equal name
    are stored once, however many checkpoints reference them. The name is kept only to
    make the directory readable to people."""
    if not re.match(SHA256_PATTERN, sha256):
        raise ValueError(f"sha256 must be 64 lower-case hex digits, got {sha256!r}")
    require_safe_relative_path(file_name, "file name")
    if "/" in file_name:
        raise ValueError(f"file name must not contain '/', got {file_name!r}")
    return f"{SHARED_DIR_NAME}/{sha256[:2]}/{sha256}-{file_name}"


def is_shared_location(location: str, sha256: str) -> bool:
    """Whether ``location`` is where a checkpoint stores bytes with content ``sha256``: in
    `shared/`, named by that digest (`shared_location`; the name after it is one segment)."""
    name = location.removeprefix(f"{SHARED_DIR_NAME}/{sha256[:2]}/{sha256}-")
    return name not in (location, "") and "/" not in name


def savepoint_file_location(savepoint_id: int, path: str) -> str:
    """Location of a savepoint's copy of the file at `path` in the Spark checkpoint."""
    require_snapshot_id(savepoint_id, "savepoint id")
    require_safe_relative_path(path, "path")
    return f"{snapshot_location_prefix(CheckpointKind.SAVEPOINT, savepoint_id)}{path}"


def default_location(kind: CheckpointKind, snapshot_id: int, path: str, sha256: str) -> str:
    """Where a snapshot stores the file at `path` with content `sha256`: in `shared/` for
    a checkpoint, below the savepoint's own directory for a savepoint. Derived from the
    entry itself, so `_metadata` need not spell it out."""
    if kind is CheckpointKind.CHECKPOINT:
        return shared_location(sha256, posixpath.basename(path))
    return savepoint_file_location(snapshot_id, path)


def parse_snapshot_dir_name(kind: CheckpointKind, name: str) -> int | None:
    """The id in a snapshot directory name (`chk-7` -> 7), or None if it is not one.

    Only the canonical spelling is accepted (no leading zeros), so that an id maps to
    exactly one directory, and only ids the protocol can carry: one beyond is no snapshot
    of ours (a command could not name it, nor an agent report it).
    """
    match = re.fullmatch(rf"{_DIRECTORY_PREFIX[kind]}(0|[1-9][0-9]*)", name)
    if match is None or len(match.group(1)) > len(str(MAX_ID)):
        return None
    snapshot_id = int(match.group(1))
    return snapshot_id if snapshot_id <= MAX_ID else None


@dataclass(frozen=True)
class JobStorageLayout:
    """Paths of one job's checkpoint storage.

    `root` is a URI (`file:///data/checkpoints`, `s3://bucket/prefix`) or a local path;
    paths returned here are `root` joined with '/', in the same form. `namespace` must be a
    DNS-1123 label and `job` a DNS-1123 subdomain (Kubernetes' rules for namespaces and
    resource names), which also keeps them from escaping the root (`..`, `/`).
    """

    root: str
    namespace: str
    job: str

    def __post_init__(self) -> None:
        if not self.root:
            raise ValueError("root must be a non-empty URI or path")
        if problem := remote_uri_problem(self.root):
            raise ValueError(f"root {problem}")
        require_dns_1123_label(self.namespace, "namespace")
        require_dns_1123_subdomain(self.job, "job")

    @property
    def job_root(self) -> str:
        """The directory holding everything of this job."""
        return f"{self.root.rstrip('/')}/{self.namespace}/{self.job}"

    @property
    def shared_dir(self) -> str:
        """Files referenced by one or more checkpoints, content-addressed."""
        return f"{self.job_root}/{SHARED_DIR_NAME}"

    @property
    def savepoints_dir(self) -> str:
        """The directory holding the `sp-<N>` savepoint directories."""
        return f"{self.job_root}/{SAVEPOINTS_DIR_NAME}"

    @property
    def writer_lock_path(self) -> str:
        """The lock a local run holds on local storage (see `WRITER_LOCK_FILE_NAME`)."""
        return f"{self.job_root}/{WRITER_LOCK_FILE_NAME}"

    @property
    def owner_path(self) -> str:
        """Names the registry the job's storage belongs to (see `OWNER_FILE_NAME`)."""
        return f"{self.job_root}/{OWNER_FILE_NAME}"

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        """`chk-<N>`, holding the checkpoint's `_metadata`."""
        return self.snapshot_dir(CheckpointKind.CHECKPOINT, checkpoint_id)

    def savepoint_dir(self, savepoint_id: int) -> str:
        """`savepoints/sp-<N>`, holding the savepoint's `_metadata` and all of its bytes."""
        return self.snapshot_dir(CheckpointKind.SAVEPOINT, savepoint_id)

    def snapshot_dir(self, kind: CheckpointKind, snapshot_id: int) -> str:
        """The directory of a checkpoint or savepoint."""
        require_snapshot_id(snapshot_id, f"{kind.value} id")
        return f"{self.snapshot_parent_dir(kind)}/{snapshot_dir_name(kind, snapshot_id)}"

    def snapshot_parent_dir(self, kind: CheckpointKind) -> str:
        """The directory whose `chk-<N>` / `sp-<N>` entries are snapshots of this kind."""
        return self.job_root if kind is CheckpointKind.CHECKPOINT else self.savepoints_dir

    def metadata_path(self, kind: CheckpointKind, snapshot_id: int) -> str:
        """The `_metadata` file whose presence makes a snapshot complete."""
        return f"{self.snapshot_dir(kind, snapshot_id)}/{METADATA_FILE_NAME}"

    def discarding_path(self, checkpoint_id: int) -> str:
        """Where a checkpoint's manifest is kept while the checkpoint is being discarded."""
        return f"{self.checkpoint_dir(checkpoint_id)}/{DISCARDING_FILE_NAME}"

    def shared_location(self, sha256: str, file_name: str) -> str:
        """Content-addressed location of a checkpoint file (see `shared_location`)."""
        return shared_location(sha256, file_name)

    def savepoint_file_location(self, savepoint_id: int, path: str) -> str:
        """Location of a savepoint's copy of the file at `path` (see
        `savepoint_file_location`)."""
        return savepoint_file_location(savepoint_id, path)

    def location_path(self, location: str) -> str:
        """The storage path of a manifest location (a path relative to the job root)."""
        require_safe_relative_path(location, "location")
        return f"{self.job_root}/{location}"


@dataclass(frozen=True)
class SnapshotAddress:
    """A snapshot named by where its `_metadata` lies: the job storage it is in, its kind
    and its id."""

    layout: JobStorageLayout
    kind: CheckpointKind
    snapshot_id: int


def parse_snapshot_address(snapshot: str) -> SnapshotAddress:
    """The snapshot whose directory or `_metadata` is at the URI or path `snapshot`:
    ``<root>/<namespace>/<job>/chk-<N>`` or ``<root>/<namespace>/<job>/savepoints/sp-<N>``
    (a snapshot is read only where it was written: its `_metadata` names its files from
    the job's directory). ValueError if `snapshot` is neither, or a remote URI that
    `remote_uri_problem` refuses (a `..` segment would be taken for a job's name)."""
    if problem := remote_uri_problem(snapshot):
        raise ValueError(problem)
    parts = metadata_location(snapshot).split("/")[:-1]
    kind, snapshot_id, job_at = CheckpointKind.CHECKPOINT, None, -2
    if len(parts) >= 4:
        snapshot_id = parse_snapshot_dir_name(kind, parts[-1])
    if snapshot_id is None and len(parts) >= 5 and parts[-2] == SAVEPOINTS_DIR_NAME:
        kind, job_at = CheckpointKind.SAVEPOINT, -3
        snapshot_id = parse_snapshot_dir_name(kind, parts[-1])
    if snapshot_id is None:
        raise ValueError(
            "not where a checkpoint or a savepoint lies (<root>/<namespace>/<job>/chk-<N> "
            "or <root>/<namespace>/<job>/savepoints/sp-<N>)"
        )
    root = "/".join(parts[: job_at - 1])
    if root.endswith(("/", ":")) or not root:  # `s3a://ns/job/...`: a bucket, no root
        raise ValueError("names no storage root before <namespace>/<job>")
    return SnapshotAddress(
        JobStorageLayout(root, parts[job_at - 1], parts[job_at]), kind, snapshot_id
    )
