"""Storage paths of a job, and the names that may (not) become part of them."""

from __future__ import annotations

import pytest

from spark_checkpoint.storage import (
    CheckpointKind,
    JobStorageLayout,
    SnapshotAddress,
    metadata_location,
    parse_snapshot_address,
    parse_snapshot_dir_name,
)
from spark_checkpoint.storage.layout import storage_place

SHA = "0f" + "1" * 62


def test_paths_below_a_uri_root() -> None:
    layout = JobStorageLayout("s3://bucket/checkpoints/", "team-a", "orders")

    assert layout.job_root == "s3://bucket/checkpoints/team-a/orders"
    assert layout.checkpoint_dir(7) == "s3://bucket/checkpoints/team-a/orders/chk-7"
    assert (
        layout.metadata_path(CheckpointKind.CHECKPOINT, 7)
        == "s3://bucket/checkpoints/team-a/orders/chk-7/_metadata"
    )
    assert layout.shared_dir == "s3://bucket/checkpoints/team-a/orders/shared"
    assert layout.savepoint_dir(2) == "s3://bucket/checkpoints/team-a/orders/savepoints/sp-2"
    assert (
        layout.metadata_path(CheckpointKind.SAVEPOINT, 2)
        == "s3://bucket/checkpoints/team-a/orders/savepoints/sp-2/_metadata"
    )


def test_paths_below_a_local_root() -> None:
    layout = JobStorageLayout("/data", "default", "orders")

    assert layout.checkpoint_dir(0) == "/data/default/orders/chk-0"


def test_locations_are_relative_to_the_job_root() -> None:
    layout = JobStorageLayout("file:///data", "default", "orders")

    shared = layout.shared_location(SHA, "2.delta")
    saved = layout.savepoint_file_location(4, "state/0/1/2.delta")

    assert shared == f"shared/0f/{SHA}-2.delta"
    assert layout.location_path(shared) == f"file:///data/default/orders/shared/0f/{SHA}-2.delta"
    assert saved == "savepoints/sp-4/files/state/0/1/2.delta"


@pytest.mark.parametrize("job", ["../x", "..", ".", "", "x/y", "Orders", "a..b", "-a", "a-", "a_b"])
def test_rejects_job_names_that_are_not_dns_subdomains(job: str) -> None:
    with pytest.raises(ValueError, match="job"):
        JobStorageLayout("/data", "default", job)


def test_accepts_dns_subdomain_job_names() -> None:
    assert JobStorageLayout("/data", "default", "orders.v2-eu").job == "orders.v2-eu"


def test_accepts_names_of_the_longest_length_kubernetes_allows() -> None:
    longest_job = ".".join(["a" * 63] * 4)[:253]
    layout = JobStorageLayout("/data", "n" * 63, longest_job)
    assert (len(layout.namespace), len(layout.job)) == (63, 253)
    with pytest.raises(ValueError, match=r"^job must be a DNS-1123 subdomain"):
        JobStorageLayout("/data", "default", longest_job + "a")


@pytest.mark.parametrize("snapshot_id", ["5", 1.5, True, None])
def test_an_id_that_is_not_an_integer_is_refused_naming_it(snapshot_id: object) -> None:
    layout = JobStorageLayout("/data", "default", "orders")

    with pytest.raises(ValueError, match=r"^checkpoint id must be a non-negative integer, got "):
        layout.checkpoint_dir(snapshot_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("namespace", ["../x", "a.b", "A", "", "x" * 64, "ns\n"])
def test_rejects_namespaces_that_are_not_dns_labels(namespace: str) -> None:
    with pytest.raises(ValueError, match=r"^namespace must be a DNS-1123 label"):
        JobStorageLayout("/data", namespace, "orders")


def test_rejects_an_empty_root() -> None:
    with pytest.raises(ValueError, match=r"^root must be a non-empty URI or path$"):
        JobStorageLayout("", "default", "orders")


@pytest.mark.parametrize("location", ["../other-job/shared/x", "shared/../../x", "/etc/passwd"])
def test_rejects_locations_that_escape_the_job_root(location: str) -> None:
    layout = JobStorageLayout("/data", "default", "orders")

    with pytest.raises(ValueError, match=r"^location must be a relative path"):
        layout.location_path(location)


def test_rejects_negative_ids_and_bad_shared_names() -> None:
    layout = JobStorageLayout("/data", "default", "orders")

    with pytest.raises(ValueError, match="checkpoint id"):
        layout.checkpoint_dir(-1)
    with pytest.raises(ValueError, match="sha256"):
        layout.shared_location("ABC", "x")
    with pytest.raises(ValueError, match=r"^file name must be a relative path"):
        layout.shared_location(SHA, "..")
    with pytest.raises(ValueError, match=r"^file name must not contain '/', got 'state/x'$"):
        layout.shared_location(SHA, "state/x")
    # A savepoint's files live below its own directory: never `savepoints/sp--7/`.
    with pytest.raises(ValueError, match="savepoint id must be a non-negative integer, got -7"):
        layout.savepoint_file_location(-7, "offsets/0")
    with pytest.raises(ValueError, match=r"^path must be a relative path"):
        layout.savepoint_file_location(7, "../offsets/0")
    # Azure reads a backslash as '/': `..` segments there (a security review's).
    with pytest.raises(ValueError, match=r"^path must be a relative path.*backslashes"):
        layout.savepoint_file_location(7, "state/0/0/x\\..\\..\\..\\victim")
    with pytest.raises(ValueError, match=r"^file name must be a relative path.*backslashes"):
        layout.shared_location(SHA, "x\\..\\..\\victim")


@pytest.mark.parametrize(
    ("kind", "name", "expected"),
    [
        (CheckpointKind.CHECKPOINT, "chk-12", 12),
        (CheckpointKind.CHECKPOINT, "chk-0", 0),
        (CheckpointKind.CHECKPOINT, "chk-012", None),
        (CheckpointKind.CHECKPOINT, "chk-", None),
        (CheckpointKind.CHECKPOINT, "chk-1x", None),
        (CheckpointKind.CHECKPOINT, "sp-1", None),
        (CheckpointKind.CHECKPOINT, "shared", None),
        (CheckpointKind.SAVEPOINT, "sp-3", 3),
        (CheckpointKind.SAVEPOINT, "chk-3", None),
    ],
)
def test_parses_ids_from_directory_names(
    kind: CheckpointKind, name: str, expected: int | None
) -> None:
    assert parse_snapshot_dir_name(kind, name) == expected


def test_directory_names_round_trip() -> None:
    layout = JobStorageLayout("/data", "default", "orders")
    for kind in CheckpointKind:
        name = layout.snapshot_dir(kind, 42).rsplit("/", 1)[-1]
        assert parse_snapshot_dir_name(kind, name) == 42


@pytest.mark.parametrize(
    ("given", "job", "kind", "snapshot_id"),
    [
        ("s3://b/p/team-a/orders/chk-7", ("s3://b/p", "team-a", "orders"), "checkpoint", 7),
        ("s3://b/team-a/orders/chk-7/_metadata/", ("s3://b", "team-a", "orders"), "checkpoint", 7),
        ("file:///d/ns/j/savepoints/sp-0", ("file:///d", "ns", "j"), "savepoint", 0),
        ("/d/ns/j.v2/savepoints/sp-12/_metadata", ("/d", "ns", "j.v2"), "savepoint", 12),
        # A job may be called "savepoints": its checkpoints are still checkpoints.
        ("/d/ns/savepoints/chk-3", ("/d", "ns", "savepoints"), "checkpoint", 3),
    ],
)
def test_a_snapshot_is_named_by_where_it_lies(
    given: str, job: tuple[str, str, str], kind: str, snapshot_id: int
) -> None:
    address = parse_snapshot_address(given)

    assert address == SnapshotAddress(JobStorageLayout(*job), CheckpointKind(kind), snapshot_id)
    assert metadata_location(given) == address.layout.metadata_path(
        address.kind, address.snapshot_id
    )


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("/d/ns/j/chk-07", "not where a checkpoint or a savepoint lies"),
        ("/d/ns/j/sp-1", "not where a checkpoint or a savepoint lies"),
        ("/d/ns/j/checkpoints/chk-x", "not where a checkpoint or a savepoint lies"),
        ("ns/j/chk-1", "not where a checkpoint or a savepoint lies"),
        ("/d/Bad_NS/j/chk-1", "namespace must be a DNS-1123 label"),
        ("s3a://ns/j/chk-1", "names no storage root"),
        ("file:///ns/j/chk-1", "names no storage root"),
        ("/ns/j/savepoints/sp-1", "names no storage root"),
        ("/d/ns/j/savepoints/../sp-1", "not where a checkpoint or a savepoint lies"),
        # Was "job must be a DNS-1123 subdomain, got '..'" (an Azure newcomer's).
        ("abfs://c1x/d/ns/j/savepoints/../savepoints/sp-1", "has a '..' path segment"),
        ("s3://key:secret@b/d/ns/j/chk-1", "carries a password"),
    ],
)
def test_a_place_that_is_no_snapshots_is_refused(given: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_snapshot_address(given)


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("/data/ckpt", "file:///data/ckpt/", True),
        ("local:///data/ckpt", "/data/ckpt", True),
        ("s3a://bucket/ckpt", "s3://bucket/ckpt/", True),
        ("s3://bucket/ckpt", "s3://bucket/other", False),
        ("gcs://bucket/ckpt", "gs://bucket/ckpt/", True),
        ("gs://bucket/ckpt", "s3://bucket/ckpt", False),
        ("file:///data", "s3://data", False),
        ("abfs://c@one.dfs.core.windows.net/p", "abfs://c@two.dfs.core.windows.net/p", False),
    ],
)
def test_a_storage_root_is_one_place_however_it_is_spelled(
    one: str, other: str, same: bool
) -> None:
    assert (storage_place(one) == storage_place(other)) is same
