"""`spark-checkpoint list`: the snapshots in a job's storage and the registry's view."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spark_checkpoint.protocol import StorageOwner
from spark_checkpoint.storage import CheckpointKind
from spark_checkpoint.storage.filesystem import StorageFileSystem
from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.local_state import RegistryRecord, local_job_paths

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]


def rows(output: str) -> dict[tuple[str, str], list[str]]:
    """Table rows by (kind, id): the cells split on runs of two or more spaces."""
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("KIND"))
    table = {}
    for line in lines[header + 1 :]:
        cells = re.split(r"\s{2,}", line.strip())
        table[(cells[0], cells[1])] = cells
    return table


def test_lists_checkpoints_and_savepoints_without_a_status_file(job: Job, cli: Cli) -> None:
    result = cli("list", *job.flags)

    assert result.code == 0, result.err
    assert f"job analytics/clicks: {job.job_root}" in result.out
    assert f"registry: none (no readable status file at {job.status_file})" in result.out
    table = rows(result.out)
    assert list(table) == [("checkpoint", "1"), ("checkpoint", "2"), ("savepoint", "3")]
    # kind, id, batch, size, files, age, registry (unknown without a status file), label
    assert table[("checkpoint", "1")] == ["checkpoint", "1", "0", "80 B", "3", "2d2h", "-", "-"]
    assert table[("checkpoint", "2")] == ["checkpoint", "2", "1", "127 B", "4", "2d2h", "-", "-"]
    assert table[("savepoint", "3")] == ["savepoint", "3", "1", "127 B", "4", "2d2h", "-", "-"]


def test_a_snapshot_storage_does_not_let_this_user_read_is_one_row(
    job: Job, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's `chk-1` (mode 000: not even its `_metadata`'s existence can be
    asked) or `sp-3/_metadata` made `list` print only that permission error and exit 1,
    the other snapshots unshown (a hostile newcomer's, run as nobody; these tests run as
    root, whom no mode stops, so the refusals are the library's)."""

    def refused(path: str) -> bool:
        return "/chk-1/" in path or "/sp-3/" in path

    exists, read_bytes = StorageFileSystem.exists, StorageFileSystem.read_bytes

    def guarded_exists(fs: StorageFileSystem, path: str) -> bool:
        if "/chk-1/" in path:
            raise PermissionError(13, "Permission denied", path)
        return exists(fs, path)

    def guarded_read(fs: StorageFileSystem, path: str, **options: Any) -> bytes:
        if refused(path):
            raise PermissionError(13, "Permission denied", path)
        return read_bytes(fs, path, **options)

    monkeypatch.setattr(StorageFileSystem, "exists", guarded_exists)
    monkeypatch.setattr(StorageFileSystem, "read_bytes", guarded_read)

    listed, inspected = cli("list", *job.flags), cli("inspect", *job.flags)

    assert listed.code == 0, listed.err  # as for any unreadable snapshot
    assert inspected.code == 1, inspected.err
    for result in (listed, inspected):
        shown = result.out + result.err
        assert "chk-1/_metadata: Permission denied" in shown, shown
        assert "sp-3/_metadata: Permission denied" in shown, shown
    assert rows(listed.out)[("checkpoint", "2")][:3] == ["checkpoint", "2", "1"]
    assert re.search(r"^checkpoint +2 ", inspected.out, flags=re.MULTILINE), inspected.out


def test_marks_registered_and_unregistered_from_the_status_file(job: Job, cli: Cli) -> None:
    job.write_registry(checkpoints=[2, 5], savepoints=[3], labels={3: "periodic"})
    Path(job.storage.layout.checkpoint_dir(4)).mkdir()  # a checkpoint cut short by a crash

    result = cli("list", *job.flags)

    assert result.code == 0, result.err
    assert f"registry: {job.status_file.resolve()}" in result.out
    table = rows(result.out)
    assert table[("checkpoint", "1")][6:] == [
        "unregistered",
        "-",
        "not in the registry (subsumed, or left by a crash): never restored from; its discard "
        "or garbage collection removes it",
    ]  # fmt: skip
    assert table[("checkpoint", "2")][6:] == ["registered", "-"]
    assert table[("checkpoint", "4")][2:] == [
        "-", "-", "-", "-", "unregistered", "-", "no _metadata: in flight or cut short"
    ]  # fmt: skip
    assert table[("checkpoint", "5")][2:] == [
        "-", "-", "-", "-", "registered", "-", "registered but not in storage"
    ]  # fmt: skip
    # Who asked for it, as the registry says (savepoints.interval's "periodic").
    assert table[("savepoint", "3")][6:] == ["registered", "periodic"]


def test_json_output(job: Job, cli: Cli) -> None:
    job.write_registry(checkpoints=[2], savepoints=[3], labels={3: "nonce 2"})
    Path(job.storage.layout.metadata_path(CheckpointKind.CHECKPOINT, 1)).write_text("{")

    result = cli("list", *job.flags, "--json")

    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert document["namespace"] == "analytics"
    assert document["job"] == "clicks"
    assert document["jobRoot"] == str(job.job_root)
    assert document["statusFile"] == str(job.status_file.resolve())
    by_id = {(s["kind"], s["id"]): s for s in document["snapshots"]}
    assert by_id.keys() == {("checkpoint", 1), ("checkpoint", 2), ("savepoint", 3)}
    assert [by_id[key]["label"] for key in sorted(by_id)] == ["", "", "nonce 2"]
    second = by_id[("checkpoint", 2)]
    assert second["state"] == "complete"
    assert second["registered"] is True
    assert (second["batchId"], second["sizeBytes"], second["files"]) == (1, 127, 4)
    assert 50 * 3600 <= second["ageSeconds"] < 51 * 3600
    assert second["completionTime"].endswith("Z")
    assert second["path"] == job.storage.layout.metadata_path(CheckpointKind.CHECKPOINT, 2)
    first = by_id[("checkpoint", 1)]
    assert first["state"] == "unreadable"
    assert first["registered"] is False
    assert first["batchId"] is None
    assert first["error"].startswith(first["path"] + ": not parseable as JSON")


def test_reads_the_job_from_a_manifest(job: Job, cli: Cli, tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: sparkcheckpoint.io/v1alpha1\n"
        "kind: SparkCheckpointJob\n"
        "metadata: {name: clicks, namespace: analytics}\n"
        "spec:\n"
        "  application: {module: pipelines.clicks}\n"
        f"  checkpointing: {{storage: {job.root!r}}}\n"
    )
    job.write_registry(checkpoints=[1, 2], savepoints=[])

    result = cli("list", "--manifest", str(manifest), "--state-dir", str(job.state_dir))

    assert result.code == 0, result.err
    table = rows(result.out)
    assert table[("checkpoint", "1")][6] == "registered"
    assert table[("savepoint", "3")][6:] == [
        "unregistered", "-", "not in the registry: kept, a savepoint with _metadata is the user's"
    ]  # fmt: skip


def test_a_mistyped_job_name_is_told_the_job_stored_beside_it(job: Job, cli: Cli) -> None:
    # A newcomer's `list --job wc-strem` said only that nothing is stored there.
    root = job.storage.layout.root
    namespace, name = job.storage.layout.namespace, job.storage.layout.job
    typo = name[:-1]

    result = cli("list", "--storage", root, "--namespace", namespace, "--job", typo)

    assert result.code == 0, result.err
    assert (
        f"nothing is stored at {root}/{namespace}/{typo} (did you mean job {name!r}, stored "
        "beside it?)"
    ) in result.out
    unlike = cli("list", "--storage", root, "--namespace", namespace, "--job", "zzzzzz")
    assert "(has the job run with this storage, namespace and name?)" in unlike.out


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_mistyped_storage_is_told_where_the_registry_says_the_images_are(
    job: Job, cli: Cli, tmp_path: Path, command: str
) -> None:
    """As `list` (above): verify failed each registered image as not in storage, and said
    nothing of the storage named."""
    job.write_registry(checkpoints=[1, 2], savepoints=[])
    flags = job.flags
    typo = tmp_path / "mistyped"
    flags[flags.index("--storage") + 1] = str(typo)

    result = cli(command, *flags)

    layout = job.storage.layout
    said = (
        f"nothing is stored at {typo}/{layout.namespace}/{layout.job}; the job's registry "
        f"names checkpoints and savepoints in storage {job.root}: is that the storage it "
        "ran with?"
    )
    assert said in result.out + result.err, result.out + result.err


def test_a_manifest_without_storage_uses_the_local_default(
    job: Job, cli: Cli, tmp_path: Path
) -> None:
    # `spark-checkpoint run` keeps such a job's storage in <state-dir>/storage.
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: sparkcheckpoint.io/v1alpha1\n"
        "kind: SparkCheckpointJob\n"
        "metadata: {name: clicks, namespace: analytics}\n"
        "spec: {application: {module: pipelines.clicks}}\n"
    )
    job_root = f"{(job.state_dir / 'storage').resolve().as_uri()}/analytics/clicks"

    empty = cli("list", "-f", str(manifest), "--state-dir", str(job.state_dir))
    assert empty.code == 0, empty.err
    assert f"job analytics/clicks: {job_root}\n" in empty.out
    assert f"nothing is stored at {job_root} (has the job run" in empty.out

    (job.state_dir / "storage").parent.mkdir(parents=True, exist_ok=True)
    Path(job.storage.layout.root).rename(job.state_dir / "storage")
    moved = cli("list", "-f", str(manifest), "--state-dir", str(job.state_dir))
    assert moved.code == 0, moved.err
    assert list(rows(moved.out)) == [("checkpoint", "1"), ("checkpoint", "2"), ("savepoint", "3")]


def test_a_job_without_storage_lists_the_state_directorys_default_storage(
    job: Job, cli: Cli
) -> None:
    """As `status --job` finds the run: `list --job clicks` said "(missing: --storage)"
    where the default state directory held it (a newcomer's)."""
    job.state_dir.mkdir(parents=True, exist_ok=True)
    Path(job.storage.layout.root).rename(job.state_dir / "storage")

    result = cli("list", "-n", "analytics", "--job", "clicks", "--state-dir", str(job.state_dir))

    assert result.code == 0, result.err
    job_root = f"file://{(job.state_dir / 'storage').resolve()}/analytics/clicks"
    assert f"job analytics/clicks: {job_root}\n" in result.out
    assert list(rows(result.out)) == [("checkpoint", "1"), ("checkpoint", "2"), ("savepoint", "3")]


def test_a_damaged_status_file_is_ignored_with_a_warning(job: Job, cli: Cli) -> None:
    job.status_file.parent.mkdir(parents=True)
    job.status_file.write_text('{"status": {"coordinator": {"checkpoints": [{"id": "2"}]}}}')

    result = cli("list", *job.flags)

    assert result.code == 0
    assert (
        f"warning: registry ignored: {job.status_file.resolve()}: "
        "status.coordinator.checkpoints[0].id: expected a non-negative integer, got '2'"
    ) in result.err
    assert rows(result.out)[("checkpoint", "2")][6] == "-"


def test_a_registry_that_run_refuses_is_listed_with_a_warning(job: Job, cli: Cli) -> None:
    """`list` reads only the registry's ids, so it listed from a status file `run` refuses
    without a word of it (a newcomer's)."""
    job.write_registry(checkpoints=[1, 2], savepoints=[3])
    document = json.loads(job.status_file.read_text())
    document["status"]["phase"] = "Exploded"
    job.status_file.write_text(json.dumps(document))

    result = cli("list", *job.flags)

    assert result.code == 0
    phases = ", ".join(JobPhase)
    assert result.err == (
        f"warning: `spark-checkpoint run` refuses this status file: "
        f"{job.status_file.resolve()}: status.phase: expected one of {phases}, got 'Exploded'\n"
    )
    assert [row[6] for row in rows(result.out).values()] == ["registered"] * 3


def test_the_namespace_is_kubernetes_default_unless_given(job: Job, cli: Cli) -> None:
    """As `status --job` and kubectl: `list --job` alone was a usage error."""
    result = cli("list", "--storage", job.root, "--job", "clicks")
    assert result.code == 0, result.err
    assert result.out.startswith("job default/clicks: ")


def test_usage_errors_exit_2(job: Job, cli: Cli, tmp_path: Path) -> None:
    incomplete = cli("list", "--storage", job.root, "-n", "analytics")
    assert incomplete.code == 2
    assert "give either -f FILE or --job (and --namespace, --storage)" in incomplete.err

    both = cli("list", "--manifest", str(tmp_path / "job.yaml"), *job.flags)
    assert both.code == 2
    assert "do not combine it with --storage" in both.err

    no_manifest = cli("list", "--manifest", str(tmp_path / "absent.yaml"))
    assert no_manifest.code == 2
    assert "absent.yaml" in no_manifest.err

    bad_name = cli("list", "--storage", job.root, "--namespace", "../etc", "--job", "clicks")
    assert bad_name.code == 2
    assert "--namespace: '../etc' is not a DNS-1123 label" in bad_name.err


@pytest.mark.parametrize("command", ["list", "inspect", "verify"])
def test_storage_that_cannot_be_opened_here_exits_1_not_as_bad_usage(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """No Azure credentials at all: adlfs refuses to build its client, which `list` took
    for bad usage (exit 2; an Azure newcomer's); `run` said exit 1."""
    for variable in [name for name in os.environ if name.startswith("AZURE_STORAGE_")]:
        monkeypatch.delenv(variable)

    result = cli(command, "--storage", "abfs://ckpts/x", "--job", "clicks")

    assert result.code == 1, result.out + result.err
    assert result.err.startswith(f"spark-checkpoint {command}: storage 'abfs://ckpts/x': ")
    assert len(result.err.splitlines()) == 1, result.err


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["list", "-f", "-"], "-f/--filename/--manifest: standard input is not read"),
        (["run", "-"], "argument FILE: standard input is not read"),
        (["run", ""], "argument FILE: is empty: give the manifest's file"),
        (["run", "job.yaml", "--from", ""], "--from: is empty: give savepoint:N"),
        (["list", "--storage", "", "--job", "clicks"], "--storage: is empty"),
        (["status", "-n", "", "--job", "clicks"], "--namespace: '' is not a DNS-1123 label"),
    ],
)
def test_an_empty_or_stdin_argument_is_a_usage_error(cli: Cli, words: list[str], said: str) -> None:
    """kubectl's `-f -` said "-: cannot read the file: No such file or directory"; an
    empty manifest was read as the current directory ("." in the error), an empty
    --storage listed the current directory, an empty --namespace meant default and an
    empty --from exited 1 (a hostile newcomer's)."""
    result = cli(*words)

    assert result.code == 2, result.err
    assert said in result.err, result.err
    assert len(result.err.splitlines()) == 1, result.err


STORAGE_COMMANDS = ("list", "inspect", "verify")


@pytest.mark.parametrize("command", STORAGE_COMMANDS)
@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        # The rules of the manifest's fields these options stand for.
        ("--storage", "file://host/data", "--storage: a file:// or local:// URI names an absolute"),
        ("--storage", "s3:/bucket/ckpt", "--storage: 's3:/bucket/ckpt' is not a URI such as"),
        ("--namespace", "Analytics", "--namespace: 'Analytics' is not a DNS-1123 label"),
        ("--job", "clicks/../x", "--job: 'clicks/../x' is not a DNS-1123 subdomain"),
        ("--job", "c" * 64, "--job: 'cccc"),
        # A path's bytes that are not UTF-8 (failed CEL's "Conversion Error").
        ("--storage", "/data/\udcff\udcfe", "--storage: '/data/\\xff\\xfe' is not UTF-8 text"),
    ],
)
def test_storage_options_are_judged_as_the_manifest_fields_they_stand_for(
    job: Job, cli: Cli, *, command: str, flag: str, value: str, said: str
) -> None:
    given = {"--storage": job.root, "--namespace": "analytics", "--job": "clicks", flag: value}

    result = cli(command, *(part for option in given.items() for part in option))

    assert result.code == 2
    assert result.out == ""
    assert result.err.startswith(f"spark-checkpoint {command}: {said}"), result.err
    assert result.err.count("\n") == 1


@pytest.mark.parametrize("command", STORAGE_COMMANDS)
def test_a_relative_storage_path_is_read_from_the_current_directory(
    job: Job, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    relative = f"./{Path(job.root).relative_to(tmp_path)}"
    flags = ["--storage", relative, "-n", "analytics", "--job", "clicks"]

    monkeypatch.chdir(tmp_path)
    found = cli(command, *flags)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    not_here = cli(command, *flags)

    assert found.code == 0, found.err
    assert "checkpoint" in found.out
    elsewhere = tmp_path / "elsewhere" / Path(job.root).name / "analytics" / "clicks"
    assert f"nothing is stored at {elsewhere} " in not_here.out + not_here.err
    # --storage=~/... is no shell's to expand.
    monkeypatch.setenv("HOME", str(tmp_path))
    home = cli(command, f"--storage=~/{Path(job.root).name}", *flags[2:])
    assert home.code == 0, home.err


@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        ("list", ""),
        ("inspect", "spark-checkpoint inspect: "),
        ("verify", "spark-checkpoint verify: nothing to verify: "),
    ],
)
def test_storage_where_the_job_never_wrote_says_so(
    cli: Cli, tmp_path: Path, command: str, prefix: str
) -> None:
    # A mistyped storage, namespace or name must not read as a job without snapshots.
    absent = tmp_path / "mistyped"
    flags = ["--storage", str(absent), "-n", "analytics", "--job", "clicks"]

    result = cli(command, *flags, "--state-dir", str(tmp_path / "state"))

    said = (
        f"{prefix}nothing is stored at {absent}/analytics/clicks "
        "(has the job run with this storage, namespace and name?)\n"
    )
    assert result.code == (0 if command == "list" else 1)
    assert (result.out if command == "list" else result.err).endswith(said)
    if command != "inspect":  # a script sees it too
        as_json = cli(command, *flags, "--state-dir", str(tmp_path / "state"), "-o", "json")
        assert json.loads(as_json.out)["nothingStored"] == said.removeprefix(prefix).rstrip()
    (absent / "analytics" / "clicks").mkdir(parents=True)
    emptied = cli(command, *flags, "--state-dir", str(tmp_path / "state"))
    assert "nothing is stored" not in emptied.out + emptied.err


def test_list_and_verify_find_the_default_storage_next_to_the_manifest_from_any_directory(
    job: Job, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `spark-checkpoint run project/job.yaml` keeps a job without checkpointing.storage in
    # project/.spark-checkpoint, whichever directory it was run from.
    project = tmp_path / "project"
    project.mkdir()
    manifest = project / "job.yaml"
    manifest.write_text(
        "apiVersion: sparkcheckpoint.io/v1alpha1\n"
        "kind: SparkCheckpointJob\n"
        "metadata: {name: clicks, namespace: analytics}\n"
        "spec: {application: {module: pipelines.clicks}}\n"
    )
    state = project / ".spark-checkpoint"
    state.mkdir()
    Path(job.storage.layout.root).rename(state / "storage")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    listed = cli("list", "-f", str(manifest))
    assert listed.code == 0, listed.err
    assert f"job analytics/clicks: {(state / 'storage').as_uri()}/analytics/clicks\n" in listed.out
    assert list(rows(listed.out)) == [("checkpoint", "1"), ("checkpoint", "2"), ("savepoint", "3")]
    verified = cli("verify", "-f", "../project/job.yaml")
    assert verified.code == 0, verified.err
    assert verified.out.endswith("3 verified: 3 OK, 0 failed\n")


@pytest.mark.parametrize(
    ("registry_id", "recorded_at", "said", "is_this"),
    [
        ("abcd", "here", ": this state directory's registry", True),
        # cp -r of a project: registry-id names the directory it was copied from.
        (
            "abcd",
            "/old/place",
            ": this state directory's registry, copied or moved here since",
            True,
        ),
        (
            "ef0123456789",
            "here",
            ": not this state directory's registry (ef012345): runs from here are "
            "refused while the owner's checkpoints are there",
            False,
        ),
    ],
)
def test_says_whether_the_owner_is_this_state_directorys_registry(
    job: Job, cli: Cli, *, registry_id: str, recorded_at: str, said: str, is_this: bool
) -> None:
    job.storage.claim(StorageOwner(id="abcd", description="the state directory /x"))
    paths = local_job_paths(job.state_dir, "analytics", "clicks")
    paths.job_dir.mkdir(parents=True)
    where = str(paths.job_dir) if recorded_at == "here" else recorded_at
    RegistryRecord(registry_id, where).write(paths.registry_id_file)

    job.write_registry(checkpoints=[2], savepoints=[3])

    listed = cli("list", *job.flags, "--state-dir", str(job.state_dir))
    as_json = cli("list", *job.flags, "--state-dir", str(job.state_dir), "-o", "json")

    assert f"owner: the state directory /x{said}" in listed.out.splitlines()
    assert json.loads(as_json.out)["ownerIsThisRegistry"] is is_this
    # Another registry's garbage collection never runs there (a newcomer's).
    unlisted = rows(listed.out)[("checkpoint", "1")][-1]
    assert unlisted == (
        "not in the registry (subsumed, or left by a crash): never restored from; its discard "
        "or garbage collection removes it"
        if is_this
        else "not in this registry: the owner's"
    )


def test_a_registry_whose_storage_is_named_wrongly_says_nothing_is_stored_there(
    job: Job, cli: Cli, tmp_path: Path
) -> None:
    # A newcomer's mistyped bucket listed the registry's snapshots as missing, not why;
    # then not where the registry's are (an object-store reviewer's).
    job.write_registry(checkpoints=[2], savepoints=[3])
    mistyped = tmp_path / "storag"
    flags = ["--storage", str(mistyped), "-n", "analytics", "--job", "clicks"]

    result = cli("list", *flags, "--state-dir", str(job.state_dir))

    assert result.code == 0, result.err
    assert (
        f"nothing is stored at {mistyped}/analytics/clicks; the job's registry names "
        f"checkpoints and savepoints in storage {job.root}: is that the storage it ran with?"
    ) in result.out.splitlines()
    assert list(rows(result.out)) == [("checkpoint", "2"), ("savepoint", "3")]
    right = cli("list", *job.flags, "--state-dir", str(job.state_dir))
    assert "nothing is stored" not in right.out


def test_shows_the_registry_the_storage_belongs_to(job: Job, cli: Cli) -> None:
    """`owner.json`: what a refusal to run from another registry names, shown before it."""
    unclaimed = cli("list", *job.flags)
    assert "owner: none recorded (the next run or cleanup of the job claims" in unclaimed.out
    assert json.loads(cli("list", *job.flags, "--json").out)["owner"] is None

    owner = StorageOwner(id="abcd", description="the state directory /x (registry abcd)\n")
    job.storage.claim(owner)
    claimed = cli("list", *job.flags)
    assert claimed.code == 0, claimed.err
    assert "owner: the state directory /x (registry abcd)\\n" in claimed.out.splitlines()
    document = json.loads(cli("list", *job.flags, "--json").out)
    assert document["owner"] == {"id": "abcd", "description": owner.description}
    assert document["ownerProblem"] is None
    assert document["ownerIsThisRegistry"] is None  # this state directory has no registry-id

    Path(job.storage.layout.owner_path).write_text("{")
    broken = cli("list", *job.flags, "--json")
    assert broken.code == 0, broken.err
    problem = json.loads(broken.out)["ownerProblem"]
    assert problem.startswith(f"storage error: {job.storage.layout.owner_path}: not an owner")
    assert f"owner: unreadable: {problem}" in cli("list", *job.flags).out.splitlines()


@pytest.mark.parametrize("finished", [False, True])
def test_an_image_the_job_no_longer_restores_from_says_so(
    job: Job, cli: Cli, finished: bool
) -> None:
    """A newcomer saw every image "registered" with no note, and `verify` "OK", while the
    run refused them all. A Finished job's names no `run --from`, which `run` refuses
    (another newcomer's)."""
    job.write_registry(
        checkpoints=[1, 2], savepoints=[3], unrestorable=["checkpoint:2"], finished=finished
    )

    table = cli("list", *job.flags)
    document = json.loads(cli("list", *job.flags, "--json").out)

    assert table.code == 0, table.err
    [row] = [line for line in table.out.splitlines() if line.split()[:2] == ["checkpoint", "2"]]
    hint = "" if finished else " (run --from names it to try)"
    assert row.endswith(f"not restored from again{hint}: its restored query failed in attempt 2"), (
        row
    )
    by_id = {(s["kind"], s["id"]): s for s in document["snapshots"]}
    assert by_id[("checkpoint", 2)]["unrestorable"] == "its restored query failed in attempt 2"
    assert by_id[("checkpoint", 1)]["unrestorable"] is None


def test_a_storage_library_that_fails_loudly_is_told_in_one_line(job: Job) -> None:
    """Azure's DefaultAzureCredential without credentials: `list` printed its twelve-line
    message five times (four warnings of azure.identity, one per try, then the error; a
    newcomer's). Played by the local filesystem's listing, in a process of its own (the
    warnings reach standard error where no logging is set up, as for a user)."""
    program = f"""
import logging, sys
from fsspec.implementations.local import LocalFileSystem
from spark_checkpoint_operator.cli import main

def no_token(*_args, **_kwargs):
    message = "DefaultAzureCredential failed to retrieve a token.\\nAttempted credentials:\\n\\t..."
    for _ in range(4):
        logging.getLogger("azure.identity._credentials.chained").warning(message)
    raise RuntimeError(message)

LocalFileSystem.ls = no_token
sys.exit(main({["list", *job.flags]!r}))
"""
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False
    )

    assert result.returncode == 1
    assert result.stderr == (
        f"spark-checkpoint list: {job.job_root}: RuntimeError: DefaultAzureCredential failed "
        "to retrieve a token. Attempted credentials: ...\n"
    )


@pytest.mark.parametrize("command", ["list", "inspect", "verify"])
def test_a_refusal_that_names_no_path_is_told_with_the_storage(
    job: Job, cli: Cli, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """An object store refusing the credentials names no path ("Forbidden", "The AWS
    Access Key Id you provided does not exist in our records."): the commands printed
    only that (a hostile newcomer on S3)."""

    def refused(*_args: object, **_options: object) -> Any:
        raise PermissionError("Forbidden")

    for method in ("exists", "list_dir", "read_bytes"):
        monkeypatch.setattr(StorageFileSystem, method, refused)

    result = cli(command, *job.flags)

    assert result.code == 1, result.out + result.err
    assert f"I/O error: {job.job_root}: Forbidden" in result.err, result.err
