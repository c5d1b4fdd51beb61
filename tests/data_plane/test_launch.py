"""`python -m spark_checkpoint.launch`: the application runs as `python` would run it, and
one that does not hand its query to `run_coordinated` ends as misconfigured."""

import importlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.driver_environment import driver_environment
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.launch import HAND_OVER
from spark_checkpoint.settings import ERROR_FILE_VARIABLE, REPORTED_ERROR_HEADER

# What a program sees of how it was started.
SEEN = """
import json, sys
import sibling
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                  "file": globals().get("__file__"), "sibling": sibling.VALUE,
                  "path": [entry for entry in sys.path[:3] if "app" in entry]}))
"""


def _launch(
    *arguments: str, cwd: Path, error_file: Path | None = None
) -> "subprocess.CompletedProcess[str]":
    environment = {ERROR_FILE_VARIABLE: str(error_file)} if error_file else {}
    return subprocess.run(
        [sys.executable, "-m", "spark_checkpoint.launch", *arguments],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", **environment},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def _python(*arguments: str, cwd: Path) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("layout", ["file", "directory", "zip", "module"])
def test_the_application_sees_what_python_would_show_it(tmp_path: Path, layout: str) -> None:
    # Named as a manifest names it: relative to the directory the runtime starts it in.
    app = tmp_path / "app"
    app.mkdir()
    (app / "sibling.py").write_text("VALUE = 'next to the main file'\n")
    if layout == "file":
        (app / "main.py").write_text(SEEN)
        target, cwd = ["app/main.py"], tmp_path
    elif layout == "directory":
        (app / "__main__.py").write_text(SEEN)
        target, cwd = ["app"], tmp_path
    elif layout == "zip":
        with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
            archive.writestr("__main__.py", SEEN)
            archive.write(app / "sibling.py", "sibling.py")
        target, cwd = ["app.zip"], tmp_path
    else:
        (app / "main.py").write_text(SEEN)
        target, cwd = ["-m", "main"], app

    expected = _python(*target, "--input", "in dir", cwd=cwd)
    launched = _launch(*target, "--input", "in dir", cwd=cwd)

    assert expected.returncode == 0, expected.stderr
    seen = json.loads(expected.stdout)
    assert seen["argv"][1:] == ["--input", "in dir"]
    shown = json.loads(launched.stdout.splitlines()[0])
    # sys.argv[0] is the main file's absolute path, as __file__ is (runpy sets both).
    assert shown["argv"][0] == str(cwd / seen["argv"][0])
    assert {**shown, "argv": seen["argv"]} == seen
    # It ended without run_coordinated: refused (below), not finished.
    assert launched.returncode == DriverExit.MISCONFIGURED


def test_an_application_that_ends_without_run_coordinated_is_misconfigured(
    tmp_path: Path,
) -> None:
    (tmp_path / "main.py").write_text("print('a batch job, or a query started and left')\n")
    error_file = tmp_path / "error"

    result = _launch("main.py", cwd=tmp_path, error_file=error_file)

    assert result.returncode == DriverExit.MISCONFIGURED
    reason = (
        "the pipeline ended without calling run_coordinated: nothing of it was checkpointed, "
        "and an exit 0 would read as finished; hand the writer to "
        "spark_checkpoint.driver.run_coordinated(writer, participants=[...])"
    )
    assert result.stderr.splitlines()[-1].endswith(reason), result.stderr
    assert error_file.read_text() == f"{REPORTED_ERROR_HEADER}\n{reason}"


def test_the_function_the_misconfigured_pipeline_is_pointed_to_is_there() -> None:
    """The advice named `spark_checkpoint.run_coordinated`, which no module has (a
    newcomer's first error after a plain writer.start())."""
    (named,) = re.findall(r"spark_checkpoint\.[\w.]+(?=\()", HAND_OVER)
    module, _, function = named.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function, None)), named


@pytest.mark.parametrize("code", ["sys.exit(3)", "raise ValueError('bad column')"])
def test_an_application_that_fails_without_run_coordinated_keeps_its_exit(
    tmp_path: Path, code: str
) -> None:
    (tmp_path / "main.py").write_text(f"import sys\n{code}\n")

    result = _launch("main.py", cwd=tmp_path)

    assert result.returncode == (3 if "exit" in code else 1), result.stderr
    assert "run_coordinated" not in result.stderr


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (["nosuch.py"], "mainFile nosuch.py: no such file"),
        (["-m", "nosuch.module"], "module nosuch.module: no such module on the path"),
    ],
)
def test_an_application_that_is_not_there_is_one_line(
    tmp_path: Path, arguments: list[str], reason: str
) -> None:
    result = _launch(*arguments, cwd=tmp_path)

    assert result.returncode == DriverExit.MISCONFIGURED
    [line] = result.stderr.splitlines()
    assert line.endswith(f"ERROR spark_checkpoint: {reason}"), line


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        ("start()", "starts its query with DataStreamWriter.start(): hand the writer to"),
        ("toTable('t')", "starts its query with DataStreamWriter.toTable(): hand the writer to"),
        ("option(key='CheckpointLocation', value='/x')", "sets the query's checkpointLocation"),
        ("options(checkpointLocation='/x')", "sets the query's checkpointLocation"),
    ],
)
def test_what_run_coordinated_does_the_pipeline_may_not_do_before_it(
    tmp_path: Path, call: str, reason: str
) -> None:
    # Refused before PySpark's own method runs: no JVM is needed to see it (a real
    # pipeline's: tests/e2e/test_uncoordinated_pipeline.py).
    (tmp_path / "main.py").write_text(
        "from pyspark.sql.streaming.readwriter import DataStreamWriter\n"
        f"DataStreamWriter.{call.replace('(', '(None, ', 1).replace(', )', ')')}\n"
    )

    result = _launch("main.py", cwd=tmp_path)

    assert result.returncode == DriverExit.MISCONFIGURED, result.stderr
    [line] = result.stderr.splitlines()
    assert f"ERROR spark_checkpoint: the pipeline {reason}" in line


def test_an_option_other_than_the_checkpoint_location_is_the_pipelines(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        "from pyspark.sql.streaming.readwriter import DataStreamWriter\n"
        "try:\n"
        "    DataStreamWriter.option(None, 'maxFilesPerTrigger', 2)\n"
        "except AttributeError:\n"  # PySpark's own method ran: there is no JVM writer
        "    print('passed on to PySpark')\n"
    )

    result = _launch("main.py", cwd=tmp_path)

    assert result.stdout == "passed on to PySpark\n", result.stderr


def test_a_pipeline_that_catches_run_coordinateds_exit_is_told_so(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        "from spark_checkpoint import driver\n"
        "try:\n"
        "    driver.run_coordinated(None)\n"
        "except SystemExit:\n"
        "    pass  # cleanup that swallows the driver's end\n"
    )

    result = _launch("main.py", cwd=tmp_path)

    assert result.returncode == DriverExit.MISCONFIGURED
    assert result.stderr.splitlines()[-1].endswith(
        "the pipeline caught the SystemExit that run_coordinated ends the driver with (how its "
        "query ended is lost): let it through"
    ), result.stderr


@pytest.mark.parametrize("store", ["s3", "gcs", "azure"])
def test_a_storage_bucket_that_does_not_exist_ends_the_driver_as_misconfigured(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    """The claim's error was the SDK's, with its XML (Azure), and the driver failed for a
    restart that could not help (an Azure newcomer's); `list` said it in words."""
    server = request.getfixturevalue(f"{store}_server")
    root = {"s3": "s3://no-such-bucket/ckpt", "gcs": "gs://no-such-bucket/ckpt"}.get(
        store, "abfs://no-such-container/ckpt"
    )
    environment = driver_environment(tmp_path, storage_root=root)

    result = subprocess.run(
        [sys.executable, "-c", "from spark_checkpoint import driver; driver.run_coordinated(None)"],
        env={"PATH": "/usr/bin:/bin", **server.environment(), **environment},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )

    assert result.returncode == DriverExit.MISCONFIGURED, result.stderr
    told = (tmp_path / "error").read_text()
    assert told.endswith(
        f"cannot claim the job's storage: {root}/default/orders: its bucket or container does "
        "not exist (at the endpoint and account the driver's credentials reach)"
    ), told


@pytest.mark.parametrize(
    ("root", "refusal"),
    [
        (
            "s3://bucket/team-*/checkpoints",
            "root contains '*', which fsspec reads as a pattern: a delete would match other paths",
        ),
        ("file://", "'file://' names no directory that paths below it lie in"),
        ("hdfs://user:s3cret@nn:8020/ckpt", "root carries a password"),
    ],
)
def test_a_storage_root_a_newer_rule_refuses_ends_the_driver_as_misconfigured(
    tmp_path: Path, root: str, refusal: str
) -> None:
    """A cluster job that ran under the CRD before remote URIs with glob characters were
    refused goes on (the API server ratchets the rule); its next driver, of the new image,
    met the layout's refusal as an uncaught traceback, retried as a crash (a reviewer).
    `file://` (the CRD never took it) is no confinement for the job's paths."""
    environment = driver_environment(tmp_path, storage_root=root)
    error_file = tmp_path / "error"

    result = subprocess.run(
        [sys.executable, "-c", "from spark_checkpoint import driver; driver.run_coordinated(None)"],
        env={"PATH": "/usr/bin:/bin", **environment},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )

    assert result.returncode == DriverExit.MISCONFIGURED, result.stderr
    assert "Traceback" not in result.stderr
    told = error_file.read_text()
    shown = root.replace("s3cret", "***")
    assert f"the job's storage {shown!r}: {refusal}" in told, told
    assert "s3cret" not in told
