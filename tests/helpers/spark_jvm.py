"""The JVM settings of every Spark driver the tests start, through ``SPARK_SUBMIT_OPTS`` (which
Spark's launcher puts on each driver JVM it starts): C1 only, the serial collector, and a
class-data sharing archive of the classes a small streaming job loads.

The suite is CPU-bound and most of a short-lived driver's CPU is the JVM's start: on this
2-core machine a session's start and one small job cost ~12 core-seconds, ~6 with the
archive. Drivers of every kind share it: `spark-checkpoint run`'s, the emulated cluster's
pods', in-process sessions'. The JVM checks an archive against its own build and each jar's
size and modification time and silently goes without one that does not match, so it is
made once per machine and environment (the key below) and checked with ``-Xshare:on``
before use. The archived classes are those spark_jvm_workload.py loads."""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

# Halves JVM start and first-job time on small machines.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"
WORKLOAD = Path(__file__).with_name("spark_jvm_workload.py")


def spark_home() -> Path:
    spec = find_spec("pyspark")
    assert spec is not None and spec.origin is not None, "pyspark is not installed"
    return Path(spec.origin).parent


def java() -> str:
    """The java binary Spark's launcher script runs."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    assert found, "no java: set JAVA_HOME or put java on PATH"
    return found


def _key() -> str:
    """What the archive depends on: the JVM and every jar (path, size, modification time)."""
    parts = [os.path.realpath(java()), str(os.stat(os.path.realpath(java())).st_mtime_ns)]
    for jar in sorted((spark_home() / "jars").iterdir()):
        stat = jar.stat()
        parts.append(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    """`command`'s standard error; an error with its output when it fails."""
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, env=env, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:3])} ... exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done.stderr


def _driver_command(launcher_output: str) -> list[str]:
    """The driver's java command line up to its main class, as Spark's launcher printed it
    (SPARK_PRINT_LAUNCH_COMMAND): what an archive must match. Its parts hold no spaces
    here; a wrong split fails the -Xshare:on check."""
    line = next(line for line in launcher_output.splitlines() if line.startswith("Spark Command: "))
    command = line.removeprefix("Spark Command: ").split(" ")
    return command[: command.index(SPARK_SUBMIT)]


def class_archive(directory: Path) -> Path:
    """The archive under `directory`, made when missing (~40 core-seconds)."""
    archive = directory / f"spark-classes-{_key()}.jsa"
    if archive.exists():
        return archive
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spark-classes-") as work:
        class_list = Path(work) / "classes.lst"
        listing = f"{FAST_JVM} -XX:DumpLoadedClassList={class_list}"
        environment = {
            key: value for key, value in os.environ.items() if key != "PYSPARK_SUBMIT_ARGS"
        }
        launch = _run(
            [sys.executable, str(WORKLOAD), work],
            env={
                **environment,
                "SPARK_SUBMIT_OPTS": listing,
                "SPARK_PRINT_LAUNCH_COMMAND": "1",
                "PYSPARK_PYTHON": sys.executable,
            },
        )
        command = [
            part
            for part in _driver_command(launch)
            if part != f"-XX:DumpLoadedClassList={class_list}"
        ]
        written = Path(work) / "spark.jsa"
        _run(
            [
                *command,
                "-Xshare:dump",
                f"-XX:SharedClassListFile={class_list}",
                f"-XX:SharedArchiveFile={written}",
                "-Xlog:cds=off",
            ]
        )
        # -Xshare:on fails where the JVM would quietly go without it.
        _run([*command, "-Xshare:on", f"-XX:SharedArchiveFile={written}", "-version"])
        os.replace(written, archive)
    return archive


def driver_options(directory: Path | None) -> str:
    """SPARK_SUBMIT_OPTS for the tests' drivers: with a class archive under `directory`."""
    if directory is None:
        return FAST_JVM
    return f"{FAST_JVM} -XX:SharedArchiveFile={class_archive(directory)}"
