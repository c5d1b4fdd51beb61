"""The checkpoint storage format: layout, `_metadata` manifests, and the operations that
write, verify, discard and restore checkpoints and savepoints.

Pure Python over fsspec: shared by the Spark driver (data plane) and the command line.
"""

from spark_checkpoint.protocol import CheckpointKind

from .errors import (
    ChecksumMismatchError,
    InvalidMetadataError,
    MissingFileError,
    NotARegularFileError,
    NotEmptyError,
    StorageAccessError,
    StorageError,
    StorageOwnedElsewhere,
    SymbolicLinkError,
    TruncatedMetadataError,
    UnknownFormatVersionError,
    UnregisteredCheckpointError,
    first_line,
    hand_over_hint,
    missing_bucket_reason,
    printable,
    printable_line,
    storage_failure,
)
from .filesystem import FileDigest, StorageFileSystem, digest_local_file
from .layout import (
    JobStorageLayout,
    SnapshotAddress,
    local_uri,
    metadata_location,
    parse_snapshot_address,
    parse_snapshot_dir_name,
    snapshot_dir_name,
)
from .metadata import (
    FORMAT_VERSION,
    METADATA_SCHEMA,
    METADATA_SCHEMA_V1,
    READABLE_FORMAT_VERSIONS,
    CheckpointMetadata,
    ManifestEntry,
    TaskAcknowledgement,
)
from .store import CheckpointStorage, GarbageReport

__all__ = [
    "FORMAT_VERSION",
    "METADATA_SCHEMA",
    "METADATA_SCHEMA_V1",
    "READABLE_FORMAT_VERSIONS",
    "CheckpointKind",
    "CheckpointMetadata",
    "CheckpointStorage",
    "ChecksumMismatchError",
    "FileDigest",
    "GarbageReport",
    "InvalidMetadataError",
    "JobStorageLayout",
    "ManifestEntry",
    "MissingFileError",
    "NotARegularFileError",
    "NotEmptyError",
    "SnapshotAddress",
    "StorageAccessError",
    "StorageError",
    "StorageFileSystem",
    "StorageOwnedElsewhere",
    "SymbolicLinkError",
    "TaskAcknowledgement",
    "TruncatedMetadataError",
    "UnknownFormatVersionError",
    "UnregisteredCheckpointError",
    "digest_local_file",
    "first_line",
    "hand_over_hint",
    "local_uri",
    "metadata_location",
    "missing_bucket_reason",
    "parse_snapshot_address",
    "parse_snapshot_dir_name",
    "printable",
    "printable_line",
    "snapshot_dir_name",
    "storage_failure",
]
