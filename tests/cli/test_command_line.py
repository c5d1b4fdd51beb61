"""What every `spark-checkpoint` subcommand shares, driven through the installed console
script: `--version`, help with examples and exit codes, `-f`/`--filename`, `-o` and its
one-line error, and a quiet exit when the reader of its output goes away (`| head -1`)."""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.metadata
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from helpers.imports import modules_loaded_by
from helpers.script_job import ScriptJob
from spark_checkpoint.storage import CheckpointKind
from spark_checkpoint_operator.command import main as console_script_main
from spark_checkpoint_operator.exit_codes import ExitCode

if TYPE_CHECKING:
    from conftest import Job, Result

Cli = Callable[..., "Result"]
EXAMPLE_MANIFEST = Path(__file__).parents[2] / "examples" / "wordcount" / "job.yaml"
MANIFEST_COMMANDS = {"run", "list", "inspect", "verify", "status", "savepoint", "stop", "cancel"}


def commands(help_text: str) -> list[str]:
    """The subcommands, as the top-level help lists them."""
    listed = help_text.split("positional arguments:", 1)[1].split("options:", 1)[0]
    return re.findall(r"^    (\w+)", listed, flags=re.MULTILINE)


def test_version_is_the_installed_distributions(console: Cli) -> None:
    result = console("--version")

    assert result.code == 0
    installed = importlib.metadata.version("spark-checkpoint-operator")
    assert result.out == f"spark-checkpoint {installed}\n"


def test_every_help_has_examples_of_itself_and_the_exit_codes_it_uses(
    console: Cli, cli: Cli
) -> None:
    top = console("--help")  # the installed script's; each command's in-process
    names = commands(top.out)
    assert set(names) == MANIFEST_COMMANDS | {"simulate"}
    for command in [None, *names]:
        result = top if command is None else cli(command, "--help")
        assert result.code == 0, result.err
        epilog = result.out.split("\nexamples:\n", 1)[1]
        examples, codes = epilog.split("\n\nexit codes:\n")
        example_lines = examples.splitlines()
        assert example_lines, command
        for line in example_lines:
            assert line.startswith(f"  spark-checkpoint {command or ''}".rstrip()), line
        # Exit codes: one a line, ascending, each one of ExitCode; usage and closed pipe
        # in every command's.
        numbers = [int(line.split()[0]) for line in codes.splitlines() if line.strip()]
        assert numbers == sorted(numbers), command
        assert {ExitCode(n) for n in numbers} >= {ExitCode.USAGE, ExitCode.CLOSED_PIPE}
        if command in MANIFEST_COMMANDS:
            assert "-f FILE, --filename FILE" in result.out, command


def test_every_command_that_takes_a_manifest_reads_it_from_f_and_filename(
    cli: Cli, console: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each reads the named manifest: the job it names has no storage and no run, which
    each says in its own way; a manifest that is not there is a one-line usage error
    naming it."""
    shutil.copy(EXAMPLE_MANIFEST, tmp_path / "job.yaml")
    monkeypatch.chdir(tmp_path)
    expected = {
        "list": ExitCode.OK,  # an empty table
        "inspect": ExitCode.FAILED,  # nothing to inspect
        "verify": ExitCode.FAILED,  # nothing to verify
        "status": ExitCode.NO_RUNTIME,
        "savepoint": ExitCode.NO_RUNTIME,
        "stop": ExitCode.NO_RUNTIME,
        "cancel": ExitCode.NO_RUNTIME,
    }
    for command, code in expected.items():
        for option in ("-f", "--filename"):
            result = cli(command, option, "job.yaml")
            assert result.code == code, (command, option, result.err)
        absent = cli(command, "--filename", "absent.yaml")
        assert absent.code == ExitCode.USAGE, (command, absent.err)
        assert len(absent.err.splitlines()) == 1, absent.err
        assert "absent.yaml" in absent.err, absent.err
    run = console("run", "--filename", "absent.yaml", cwd=tmp_path)
    assert run.code == ExitCode.USAGE, run.err
    assert run.err.startswith("spark-checkpoint run: "), run.err
    assert "absent.yaml" in run.err, run.err
    assert len(run.err.splitlines()) == 1, run.err


def test_each_problem_of_a_manifest_is_a_line_that_names_the_command(
    cli: Cli, console: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second problem's line lacked the command's name (a newcomer's)."""
    manifest = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    manifest["spc"] = manifest.pop("spec")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    monkeypatch.chdir(tmp_path)
    problems = [
        "job.yaml: spc: unknown field (did you mean 'spec'?)",
        "job.yaml: spec: required field is missing",
    ]
    for command in ("list", "status", "run"):
        if command == "run":
            result = console(command, "-f", "job.yaml", cwd=tmp_path)
        else:
            result = cli(command, "-f", "job.yaml")
        assert result.code == ExitCode.USAGE, (command, result.err)
        assert result.err.splitlines() == [
            f"spark-checkpoint {command}: {problem}" for problem in problems
        ], result.err


def test_an_unknown_output_format_is_a_one_line_usage_error(
    job: Job, console: Cli, cli: Cli
) -> None:
    for run, command, output in (
        (console, "list", "xml"),
        (cli, "inspect", "table"),
        (cli, "status", "JSON"),
        (cli, "verify", "wide"),  # verify has no table columns to add
    ):
        result = run(command, *job.flags[:6], "-o", output)
        assert result.code == ExitCode.USAGE, (command, result.err)
        assert result.out == ""
        assert result.err.startswith(
            f"spark-checkpoint {command}: argument -o/--output: {output!r} is not an output "
            "format: use json|yaml"
        ), result.err
        assert len(result.err.splitlines()) == 1, result.err


@pytest.mark.parametrize("command", ["status", "stop", "cancel", "list"])
def test_an_unrecognized_argument_is_named_by_its_command(cli: Cli, command: str) -> None:
    """`spark-checkpoint status job.yaml` (a manifest without -f, as `run` takes it) said
    'spark-checkpoint: unrecognized arguments' and pointed at the top-level help (a
    newcomer); then it did not say that a manifest goes after -f here (another)."""
    result = cli(command, "job.yaml")
    assert result.code == ExitCode.USAGE, result.err
    assert result.err == (
        f"spark-checkpoint {command}: unrecognized arguments: job.yaml (a manifest is named "
        f"with -f job.yaml; see spark-checkpoint {command} --help)\n"
    )
    other = cli(command, "extra")
    assert other.err == (
        f"spark-checkpoint {command}: unrecognized arguments: extra "
        f"(see spark-checkpoint {command} --help)\n"
    )
    spaced = cli(command, "my job.yaml")
    assert "(a manifest is named with -f 'my job.yaml'; see" in spaced.err
    # With -f given, another manifest is not what it meant (a reviewer's).
    given = cli(command, "-f", "a.yaml", "b.yaml")
    assert given.err == (
        f"spark-checkpoint {command}: unrecognized arguments: b.yaml "
        f"(see spark-checkpoint {command} --help)\n"
    )


def test_run_given_two_manifests_gets_no_hint_to_use_f(cli: Cli) -> None:
    result = cli("run", "a.yaml", "b.yaml")
    assert result.err == (
        "spark-checkpoint run: unrecognized arguments: b.yaml (see spark-checkpoint run --help)\n"
    )


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        # A newcomer's: each said "argument FILE: not allowed with argument -f/...": the
        # word after the unknown option was taken for a second manifest.
        (["-f", "job.yaml", "--fro", "savepoint:10"], "unrecognized arguments: --fro"),
        (["-f", "job.yaml", "-x", "foo"], "unrecognized arguments: -x"),
        (["a.yaml", "-f", "b.yaml"], "name the manifest once: FILE or -f FILE, not both"),
        ([], "name the manifest: FILE, or -f FILE"),
    ],
)
def test_run_names_what_is_wrong_with_its_arguments(
    cli: Cli, arguments: list[str], said: str
) -> None:
    result = cli("run", *arguments)
    assert (result.code, result.err) == (
        ExitCode.USAGE,
        f"spark-checkpoint run: {said} (see spark-checkpoint run --help)\n",
    )


@pytest.mark.parametrize(
    ("image", "meant"),
    [
        ("4", ("checkpoint:4 or savepoint:4", "savepoint:4")),
        ("sp-4", ("savepoint:4", "savepoint:4")),
        ("SP-5", ("savepoint:5", "savepoint:5")),  # as a Flink user writes it (a reviewer's)
        ("SAVEPOINT:31", ("savepoint:31", "savepoint:31")),  # exit 1, a newcomer's
        ("savepoint-31", ("savepoint:31", "savepoint:31")),
        ("chk-12", ("checkpoint:12", None)),
        ("007", ("checkpoint:7 or savepoint:7", "savepoint:7")),
    ],
)
def test_an_images_id_or_directory_name_alone_is_told_how_to_name_the_image(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    image: str,
    meant: tuple[str, str | None],
) -> None:
    """`--from 4` (or `savepoint -d 4`) was "not where a checkpoint or a savepoint lies",
    exit 1, after the manifest was read (a newcomer's). A path of that name is still one.
    `--dispose` names only a savepoint (it suggested checkpoint:4, which it refuses)."""
    monkeypatch.chdir(tmp_path)
    restorable, disposable = meant
    result = cli("run", "-f", "job.yaml", "--from", image)
    assert result.code == ExitCode.USAGE, result.err
    assert f"'{image}' is no path here: for the job's image, write {restorable} (" in result.err

    result = cli("savepoint", "-f", "job.yaml", "-d", image)
    if disposable is None:  # refused as any checkpoint is, once the job is read (exit 1)
        assert "checkpoint:" not in result.err, result.err
    else:
        assert result.code == ExitCode.USAGE, result.err
        said = f"'{image}' is no path here: for the job's image, write {disposable} ("
        assert said in result.err

    (tmp_path / image).mkdir()
    result = cli("run", "-f", "absent.yaml", "--from", image)
    assert "absent.yaml: cannot read the file" in result.err, result.err


@pytest.mark.parametrize(
    ("word", "meant"),
    [
        ("lst", " (did you mean spark-checkpoint list?; "),
        ("savepiont", " (did you mean spark-checkpoint savepoint?; "),
        ("dispose", " (did you mean spark-checkpoint savepoint --dispose?; "),  # Flink's
        ("restore", " (did you mean spark-checkpoint run --from?; "),
        ("xyz", " ("),
    ],
)
def test_a_word_that_is_no_command_is_told_the_command_meant(
    cli: Cli, word: str, meant: str
) -> None:
    """argparse's "invalid choice" listed every command, quoted, and no likely one."""
    result = cli(word, "-f", "job.yaml")
    assert (result.code, result.err) == (
        ExitCode.USAGE,
        f"spark-checkpoint: {word!r} is no command (commands: run, simulate, list, inspect, "
        f"verify, status, savepoint, stop, cancel){meant}see spark-checkpoint --help)\n",
    )


@pytest.mark.parametrize(
    ("words", "meant"),
    [
        (["-f", "job.yaml", "list"], "list -f job.yaml"),
        (["-o", "wide", "list", "-f", "my job.yaml"], "list -o wide -f 'my job.yaml'"),
        (
            ["--state-dir", "state", "status", "--job", "orders"],
            "status --state-dir state --job orders",
        ),
    ],
)
def test_options_before_the_command_are_shown_after_it(
    cli: Cli, words: list[str], meant: str
) -> None:
    """kubectl takes global flags before its command; ours are each command's, and
    argparse took the option's value for an unknown command."""
    result = cli(*words)
    assert result.code == ExitCode.USAGE, result.err
    assert f" (did you mean spark-checkpoint {meant}?; see spark-checkpoint --help)\n" in (
        result.err
    )


def test_run_takes_flinks_s_and_from_savepoint_for_from(cli: Cli) -> None:
    for option in ("-s", "--fromSavepoint"):
        result = cli("run", "-f", "absent.yaml", option, "savepoint:x")
        assert (result.code, result.err) == (
            ExitCode.USAGE,
            "spark-checkpoint run: argument -s/--fromSavepoint: 'savepoint:x' is not "
            "savepoint:N with N an id (0 to 9223372036854775807, no leading 0); for a path of "
            "that name, write ./savepoint:x (see spark-checkpoint run --help)\n",
        ), result.err


def test_an_abbreviated_option_is_not_taken(cli: Cli) -> None:
    """`run --deta` detached: the background run is started with the arguments less their
    exact `--detach`, so it detached again, and again, a process each time for ever (11
    processes after 10 s, by hand). Options are spelled out (the manifest here is absent:
    the refusal must come before it is read)."""
    result = cli("run", "-f", "absent.yaml", "--deta")
    assert result.code == ExitCode.USAGE, result.err
    assert result.err == (
        "spark-checkpoint run: unrecognized arguments: --deta (see spark-checkpoint run --help)\n"
    )


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["-d"], "argument --dispose/-d: expected one argument"),
        (["-d", "/savepoints/sp-7"], "absent.yaml: cannot read the file"),
    ],
)
def test_flinks_savepoint_dispose_is_never_taken_for_detached(
    cli: Cli, arguments: list[str], said: str
) -> None:
    """argparse took `-d` for `-dcp` (--detached): a Flink user's `savepoint -d PATH`,
    which disposes of a savepoint there, would take one (a reviewer). It disposes of it
    (tests/cli/test_dispose.py)."""
    result = cli("savepoint", "-f", "absent.yaml", *arguments)
    assert result.code == ExitCode.USAGE, result.err
    assert result.err.startswith(f"spark-checkpoint savepoint: {said}"), result.err


def test_storage_that_cannot_be_read_is_one_line_naming_the_path(tmp_path: Path, cli: Cli) -> None:
    """A file where a directory of the job's storage should be: the path and the reason,
    not Python's ``[Errno 20]``."""
    (tmp_path / "blocker").write_text("")
    flags = ("--storage", (tmp_path / "blocker").as_uri(), "--namespace", "a", "--job", "b")
    job_root = tmp_path / "blocker/a/b"
    for command, expected in (
        ("list", f"I/O error: {job_root}: Not a directory"),
        ("verify", f"I/O error: {job_root}: Not a directory"),
        # The read opens the file's directory from the storage root down: the file named is
        # the one that is no directory.
        ("inspect", f"checkpoint:1: I/O error: {tmp_path / 'blocker'}: Not a directory"),
    ):
        arguments = ("checkpoint:1",) if command == "inspect" else ()
        result = cli(command, *flags, *arguments)
        assert result.code == ExitCode.FAILED, (command, result.err)
        assert result.err.splitlines()[-1] == f"spark-checkpoint {command}: {expected}"


def test_list_documents_are_the_same_in_json_and_yaml_and_match_storage(
    job: Job, console: Cli
) -> None:
    job.write_registry(checkpoints=[2], savepoints=[3])

    as_json = console("list", *job.flags, "-o", "json")
    as_yaml = console("list", *job.flags, "-o", "yaml")
    wide = console("list", *job.flags, "-o", "wide")

    assert as_json.code == as_yaml.code == wide.code == 0, as_json.err + as_yaml.err + wide.err
    document, from_yaml = json.loads(as_json.out), yaml.safe_load(as_yaml.out)
    # Every field but the age, which grows between the two runs.
    for snapshot in [*document["snapshots"], *from_yaml["snapshots"]]:
        assert isinstance(snapshot.pop("ageSeconds"), float)
    assert from_yaml == document
    for snapshot in document["snapshots"]:
        meta = job.storage.read_metadata(CheckpointKind(snapshot["kind"]), snapshot["id"])
        assert snapshot["batchId"] == meta.batch_id
        assert snapshot["sizeBytes"] == meta.total_bytes
        assert snapshot["files"] == len(meta.files)
        completed = snapshot["completionTime"]
        assert completed.endswith("Z")
        assert abs(_parse(completed) - meta.completion_time.timestamp()) < 0.001
    table = wide.out.splitlines()
    table = table[next(i for i, line in enumerate(table) if line.startswith("KIND")) :]
    header, *rows = (re.split(r"\s{2,}", line) for line in table)
    assert header[7:] == ["LABEL", "COMPLETED", "DURATION", "PATH", "NOTE"]
    assert [row[10] for row in rows] == [s["path"] for s in document["snapshots"]]


def _parse(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_closed_pipe_ends_the_command_quietly_with_141(job: Job, console_script: Path) -> None:
    """`spark-checkpoint inspect | head -1`: the output is more than a pipe holds (64 KiB),
    so the command is still writing when `head` has gone: a table, and a document."""
    checkpoint = job.storage.read_metadata(CheckpointKind.CHECKPOINT, 2)
    for snapshot_id in range(4, 400):  # about 100 KiB of wide table, 180 KiB of JSON
        job.storage.write_metadata(dataclasses.replace(checkpoint, checkpoint_id=snapshot_id))

    for command in (["inspect", "-o", "wide"], ["list", "-o", "json"]):
        line = shlex.join([str(console_script), *command, *job.flags])
        shell = subprocess.run(
            ["bash", "-c", f'{line} | head -1; echo "exit ${{PIPESTATUS[0]}}" >&2'],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert len(shell.stdout.splitlines()) == 1, shell.stdout
        assert shell.stderr == f"exit {ExitCode.CLOSED_PIPE}\n", (command, shell.stderr)


def _script_manifest(directory: Path, storage: str | None = None) -> Path:
    """A job whose driver (never started by these tests) is a script."""
    manifest = ScriptJob(directory, "raise SystemExit(1)").manifest
    if storage:
        document = yaml.safe_load(manifest.read_text())
        document["spec"]["checkpointing"] = {"storage": storage}
        manifest.write_text(yaml.safe_dump(document))
    return manifest


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--agent-timeout", "-1"], "argument --agent-timeout: '-1' is not a number of seconds"),
        (["--agent-timeout", "nan"], "argument --agent-timeout: 'nan' is not a number of seconds"),
        (["--metrics-port", "99999"], "argument --metrics-port: '99999' is not a port number"),
        (["--metrics-port", "0"], "argument --metrics-port: '0' is not a port number"),
    ],
)
def test_a_run_option_out_of_range_is_a_one_line_usage_error(
    tmp_path: Path, cli: Cli, option: list[str], said: str
) -> None:
    result = cli("run", "-f", str(_script_manifest(tmp_path)), *option)
    assert result.code == ExitCode.USAGE, result.err
    assert result.err.startswith(f"spark-checkpoint run: {said}"), result.err
    assert len(result.err.splitlines()) == 1, result.err


@pytest.mark.usefixtures("without_gcsfs")
def test_what_keeps_a_run_from_starting_is_said_in_one_line_before_any_driver(
    tmp_path: Path, cli: Cli
) -> None:
    """A metrics port in use, a state directory that cannot be made, storage of a kind no
    library here serves: one line naming it, and no driver started."""
    manifest = _script_manifest(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = cli("run", "-f", str(manifest), "--metrics-port", str(port))
    no_state = cli("run", "-f", str(manifest), "--state-dir", "/proc/no-such-dir")
    gcs = _script_manifest(tmp_path / "gcs", "gs://bucket/checkpoints")
    no_library = cli("run", "-f", str(gcs))

    for result in (in_use, no_state, no_library):
        assert result.code == ExitCode.FAILED, result.err
        assert len(result.err.splitlines()) == 1, result.err
        assert "Traceback" not in result.err + result.out
    assert in_use.err == (
        f"spark-checkpoint run: --metrics-port {port}: cannot serve metrics there: "
        "Address already in use\n"
    )
    assert no_state.err.startswith(
        "spark-checkpoint run: cannot create the job's state directory: "
    ), no_state.err
    assert no_library.err == (
        "spark-checkpoint run: spec.checkpointing.storage 'gs://bucket/checkpoints': Please "
        "install gcsfs to access Google Storage (pip install 'spark-checkpoint-operator[spark]' "
        "installs s3fs, adlfs, gcsfs)\n"
    )
    # `list` of the same manifest names the field too (it said "storage", a newcomer's).
    listed = cli("list", "-f", str(gcs))
    assert (listed.code, listed.err) == (ExitCode.FAILED, no_library.err.replace("run", "list"))
    assert "starting driver" not in in_use.out + no_state.out + no_library.out


def test_storage_whose_library_cannot_load_is_one_line(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow's error for a missing libhdfs lists every place it looked: `list` printed 89
    lines for an hdfs:// root (a hostile-input tester)."""
    searched = "".join(f"\ndlopen(/opt/place-{n}/libjvm.so) failed" for n in range(88))

    def no_library(url: str, **_: object) -> object:
        raise OSError(f"Unable to load libjvm{searched}")

    monkeypatch.setattr("fsspec.core.url_to_fs", no_library)
    monkeypatch.setattr("spark_checkpoint.storage.connections.url_to_fs", no_library)
    for command in ("list", "verify"):
        result = cli(command, "--storage", "hdfs://nn:8020/ckpt", "--namespace", "a", "--job", "b")
        assert result.err == (
            f"spark-checkpoint {command}: storage 'hdfs://nn:8020/ckpt': Unable to load libjvm\n"
        ), result.err


def test_an_empty_state_directory_is_a_usage_error(cli: Cli) -> None:
    """`--state-dir ''` read as the current directory, where another run's state may be."""
    for command in ("run", "list", "status"):
        result = cli(command, "-f", "job.yaml", "--state-dir", "")
        assert (result.code, result.err) == (
            ExitCode.USAGE,
            f"spark-checkpoint {command}: argument --state-dir: '' names no directory ('.' "
            f"names this one) (see spark-checkpoint {command} --help)\n",
        )


def test_a_state_directory_that_is_a_file_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    """A file as --state-dir was an I/O error (exit 1) later, from each command."""
    (tmp_path / "state").write_text("")
    for command in ("run", "list", "status"):
        result = cli(command, "-f", "job.yaml", "--state-dir", str(tmp_path / "state"))
        assert (result.code, result.err) == (
            ExitCode.USAGE,
            f"spark-checkpoint {command}: argument --state-dir: "
            f"'{tmp_path / 'state'}' is not a directory (see spark-checkpoint {command} --help)\n",
        )


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """A Ctrl-C that comes while Python imports the command line."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "spark_checkpoint_operator.cli":
            raise KeyboardInterrupt


@pytest.mark.parametrize("when", ["while it is imported", "while a command runs"])
def test_a_ctrl_c_ends_the_console_script_quietly(
    console_script: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    when: str,
) -> None:
    """Importing the command line takes a second or more on a loaded machine: a Ctrl-C then
    printed a KeyboardInterrupt traceback (a newcomer). The installed script is
    `command.main`, which ends a Ctrl-C there, or in a command, with 130 and no traceback.
    (Signalling the script while it imports raced the import under CI's load.)"""
    assert "from spark_checkpoint_operator.command import main" in console_script.read_text()
    if when == "while it is imported":
        monkeypatch.delitem(sys.modules, "spark_checkpoint_operator.cli", raising=False)
        monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    else:

        def interrupted(argv: object = None) -> int:
            raise KeyboardInterrupt

        monkeypatch.setattr("spark_checkpoint_operator.cli.main", interrupted)
    assert console_script_main() == ExitCode.CANCELLED
    assert capsys.readouterr().err == "\n"


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_manifest_given_without_f_to_a_command_of_images_gets_the_hint(
    cli: Cli, command: str
) -> None:
    """`inspect job.yaml`: these take images (KIND:ID) as words, so the manifest was taken
    for a malformed one without a word of -f (a newcomer's)."""
    result = cli(command, "job.yaml")
    assert result.code == ExitCode.USAGE, result.err
    assert result.err.endswith("; a manifest is named with -f job.yaml\n"), result.err
    assert len(result.err.splitlines()) == 1


def test_an_id_beyond_the_largest_is_named_as_out_of_range(cli: Cli) -> None:
    """It said "a non-negative integer without leading 0", which it is (a reviewer's)."""
    result = cli("inspect", "--job", "orders", "--storage", "/nowhere", "savepoint:" + "9" * 30)
    assert result.code == ExitCode.USAGE, result.err
    assert "ID a whole number from 0 to 9223372036854775807 without leading 0" in result.err
    assert len(result.err.splitlines()) == 1


def test_a_command_loads_no_interactive_command_line_of_a_library() -> None:
    """The `cel` package imports its own command line (typer, prompt_toolkit), a sixth of
    every command's start, which nothing here uses (rich is the run's live line's)."""
    loaded = modules_loaded_by(
        "spark_checkpoint_operator.cli", "spark_checkpoint_operator.manifest.loading"
    )
    packages = {name.partition(".")[0] for name in loaded}
    assert packages & {"typer", "prompt_toolkit", "click"} == set()
