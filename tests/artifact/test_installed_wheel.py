"""The artifact, not the checkout: the wheel is built as a user or the image builds it (build
isolation, so a current setuptools from PyPI), installed into a fresh virtual environment
outside the checkout, and used from a directory outside the checkout, so nothing here can
import the repository's code. The runtime dependencies are installed at the image's pins
(the Dockerfile's deps stage, as the Makefile does) by uv, from its cache when it has them
(pip resolving the same pins against PyPI's pages took 40 s of a core).

About 50 s here: the build and the environment take about 5 s, the rest is the coordinated
word count on real PySpark, stopped with a drain and resumed from its savepoint.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
EXAMPLE = ROOT / "examples" / "wordcount"
# The Makefile's pattern for the Dockerfile's pins (its deps stage is the lock).
PIN = re.compile(r"^[ \t]+([A-Za-z0-9._-]+==[^\s\\]+)", re.MULTILINE)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    workdir: Path  # outside the checkout; every command runs here

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *command: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            cwd=self.workdir,
            env=_clean_environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _clean_environment() -> dict[str, str]:
    """This process's environment without what could point Python at the checkout."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST"))
    }
    environment["PYTHONNOUSERSITE"] = "1"
    return environment


def _checkout_files() -> Iterator[Path]:
    """The files a fresh clone has (tracked, or new and not ignored), relative to ROOT."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    )
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            yield Path(name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("artifact")
    assert not base.resolve().is_relative_to(ROOT), "the work must happen outside the checkout"
    source = base / "clone"  # what a fresh clone has, symlinks kept as links
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name, follow_symlinks=False)
    wheels = base / "wheels"
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    subprocess.run(
        [*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(source)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("*.whl")

    venv = base / "venv"
    uv = Path(sys.executable).parent / "uv"  # the dev extra's, beside the tests' Python
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, venv], check=True)
    pins = base / "runtime-pins.txt"
    pins.write_text("\n".join(PIN.findall((ROOT / "Dockerfile").read_text())) + "\n")
    # Not --compile-bytecode (the Makefile's): compiling it all costs more than the few
    # processes here compile of what they import.
    install = [uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python"]
    install += ["--constraint", pins, f"{wheel}[spark]"]
    offline = subprocess.run([*install, "--offline"], check=False, capture_output=True)
    if offline.returncode != 0:  # the cache lacks something: fetch it
        subprocess.run(install, check=True, timeout=600)
    workdir = base / "work"
    workdir.mkdir()
    return Installed(wheel, venv, workdir)


def test_the_wheel_ships_the_crds_byte_identical_to_crds(installed: Installed) -> None:
    assert [crd.name for crd in CRDS] == [
        "sparkcheckpointjobs.sparkcheckpoint.io.yaml",
        "sparkcheckpointsnapshots.sparkcheckpoint.io.yaml",
    ]
    with zipfile.ZipFile(installed.wheel) as wheel:
        for crd in CRDS:
            assert wheel.read(f"spark_checkpoint_operator/{crd.name}") == crd.read_bytes()


def test_the_operator_validates_a_spec_from_the_installed_package(installed: Installed) -> None:
    """Through the function the Kopf daemon validates every job's spec with."""
    valid = {
        "image": "ghcr.io/spark-checkpoint/spark:0.1.0",
        "application": {
            "mainFile": "local:///opt/spark-checkpoint/examples/wordcount/pipeline.py",
            "sparkConf": {"spark.master": "local[2]"},
        },
        "checkpointing": {"interval": "30s", "storage": "s3a://bucket/checkpoints"},
    }
    invalid = {**valid, "checkpointing": {**valid["checkpointing"], "interval": "soon"}}
    script = textwrap.dedent(
        """
        import json, sys
        import spark_checkpoint_operator
        from spark_checkpoint_operator.kubernetes.controller import _validated

        def body(spec):
            metadata = {"name": "orders", "namespace": "streaming"}
            return {"metadata": metadata, "spec": spec}

        valid, invalid = (json.loads(a) for a in sys.argv[1:])
        manifest, problem, _ = _validated(body(valid), None, None)
        rejected, reason, _ = _validated(body(invalid), None, None)
        print(json.dumps({
            "package": list(spark_checkpoint_operator.__path__),
            "valid": [manifest is not None, problem],
            "invalid": [rejected is None, reason],
        }))
        """
    )

    result = installed.run(
        installed.bin("python"),
        "-c",
        script,
        json.dumps(valid),
        json.dumps(invalid),
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert all(Path(p).is_relative_to(installed.venv) for p in verdict["package"]), verdict
    assert verdict["valid"] == [True, None]
    accepted, reason = verdict["invalid"]
    assert accepted and "spec.checkpointing.interval" in reason, reason


def test_the_spark_extra_brings_what_pysparks_pandas_apis_import(installed: Installed) -> None:
    """`pip install spark-checkpoint-operator[spark]` is what a pipeline's environment
    needs: pandas and pyarrow (applyInPandasWithState), protobuf (transformWithStateInPandas
    imports its generated StateMessage_pb2, which a protobuf of another major refuses), and
    the object stores' filesystems."""
    modules = ["pandas", "pyarrow", "s3fs", "adlfs", "pyspark.sql.streaming.proto.StateMessage_pb2"]

    result = installed.run(
        installed.bin("python"), "-c", f"import {', '.join(modules)}", timeout=120
    )

    assert result.returncode == 0, result.stderr


def test_the_installed_operator_command_without_a_cluster_says_so_in_one_line(
    installed: Installed,
) -> None:
    """`spark-checkpoint-operator`, the console script the wheel installs (the image's
    entrypoint), where no cluster can be reached: exit 1, one line, no traceback."""
    environment = {
        name: value
        for name, value in _clean_environment().items()
        if name not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    }
    environment |= {"HOME": str(installed.workdir), "SPARK_CHECKPOINT_METRICS_PORT": "0"}

    finished = subprocess.run(
        [installed.bin("spark-checkpoint-operator"), "--all-namespaces"],
        cwd=installed.workdir,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert finished.returncode == 1, finished.stderr
    assert "no Kubernetes credentials" in finished.stderr
    assert "Traceback" not in finished.stderr, finished.stderr


@pytest.mark.spark
def test_the_installed_commands_stop_with_drain_resume_and_end_verified(
    installed: Installed,
) -> None:
    """The reference job with the installed commands, as a user drives it from two
    terminals: `run` unbounded, `stop --drain` once a checkpoint completed (the input added
    meanwhile is processed before the savepoint), `list` and `verify` of what is stored,
    `run --from` that savepoint bounded to the end, then the demo's ground-truth check."""
    example = installed.workdir / "wordcount"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("data", "__pycache__"))
    python = installed.bin("python")
    command = installed.bin("spark-checkpoint")
    manifest = example / "job.yaml"
    bounded = manifest.read_text()
    assert ', "--bounded"]' in bounded
    # Unbounded, with triggers far enough apart that files added at the stop sit unread.
    manifest.write_text(bounded.replace(', "--bounded"]', ', "--trigger-seconds", "5"]'))
    state = ("--state-dir", str(installed.workdir / "state"))

    def generate(first_file: int) -> None:
        generated = installed.run(
            *(python, str(example / "generate_input.py"), str(example / "data" / "input")),
            *("--files", "2", "--lines", "200", "--seed", "1"),
            *("--start-index", str(first_file)),
            timeout=60,
        )
        assert generated.returncode == 0, generated.stderr

    generate(0)
    log = installed.workdir / "first-run.log"
    with log.open("w") as output:
        first = subprocess.Popen(
            [command, "run", str(manifest), *state],
            cwd=installed.workdir,
            env=_clean_environment(),
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        _wait_for(log, r"checkpoint \d+ complete\b", first)
        generate(2)  # unread when the stop comes: --drain must take them in
        stopped = installed.run(
            command, "stop", "--drain", "-f", str(manifest), *state, timeout=300
        )
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert first.wait(timeout=120) == 0, log.read_text()
    finally:
        if first.poll() is None:
            first.kill()
    savepoint = re.search(r"savepoint (\d+) complete", log.read_text())
    assert savepoint is not None, log.read_text()
    _assert_ground_truth(installed, example)  # drained: every file there at the stop
    image = f"savepoint:{savepoint[1]}"

    listed = installed.run(command, "list", "-f", str(manifest), *state, "-o", "json", timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert image in {
        f"{row['kind']}:{row['id']}" for row in json.loads(listed.stdout)["snapshots"]
    }, listed.stdout
    verified = installed.run(command, "verify", "-f", str(manifest), *state, image, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    generate(4)
    manifest.write_text(bounded)  # the rest of the input, then the end
    resumed = installed.run(command, "run", str(manifest), *state, "--from", image, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"restoring from {image}" in resumed.stdout, resumed.stdout
    _assert_ground_truth(installed, example)


def _assert_ground_truth(installed: Installed, example: Path) -> None:
    checked = installed.run(
        *(installed.bin("python"), str(example / "ground_truth.py")),
        *(str(example / "data" / "input"), str(example / "data" / "output")),
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _wait_for(log: Path, pattern: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text()):
            return
        assert process.poll() is None, log.read_text()
        time.sleep(0.5)
    raise AssertionError(f"no line matching {pattern!r}:\n{log.read_text()}")
