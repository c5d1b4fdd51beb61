"""The JVM settings of every Spark driver the tests start as a process here, through
``SPARK_SUBMIT_OPTS`` (which Spark's launcher puts on each driver JVM it starts): C1 only,
the serial collector, and a class-data sharing archive of the classes a small streaming job
loads.

The suite is CPU-bound and most of a short-lived driver's CPU is the JVM's start: on this
2-core machine a session's start and one small job cost ~12 core-seconds, ~6 with the
archive. Drivers of every kind share it: `spark-checkpoint run`'s, the emulated cluster's
process pods', in-process sessions'. The JVM checks an archive against its own build and
each jar's size and modification time and silently goes without one that is missing or
does not match. So the archive's path is handed out at once, linked to the JDK's default
archive, and the archive is made in the background (``python spark_jvm.py build
DIRECTORY``, one build at a time under a file lock, checked with ``-Xshare:on``, then
renamed over the link): drivers started before it exists run as without the option, and a
failed build (its log beside it, a marker against trying again) costs speed only. The
archived classes are those spark_jvm_workload.py loads."""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from importlib.util import find_spec
from pathlib import Path

# Halves JVM start and first-job time on small machines.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"
WORKLOAD = Path(__file__).with_name("spark_jvm_workload.py")
ARCHIVE_PREFIX = "spark-classes-"
BUILD_LOG = "build.log"


def spark_home() -> Path:
    """The Spark installation a driver runs: SPARK_HOME's, else pyspark's own, as pyspark
    finds it."""
    if home := os.environ.get("SPARK_HOME"):
        return Path(home)
    spec = find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed")
    return Path(spec.origin).parent


def java() -> str:
    """The java binary Spark's launcher script runs."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found:
        raise RuntimeError("no java: set JAVA_HOME or put java on PATH")
    return found


def archive_path(directory: Path) -> Path:
    """Where the archive for this JVM and these jars (path, size, modification time) is."""
    binary = os.path.realpath(java())
    parts = [binary, str(os.stat(binary).st_mtime_ns)]
    for jar in sorted((spark_home() / "jars").iterdir()):
        stat = jar.stat()
        parts.append(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}")
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return directory / f"{ARCHIVE_PREFIX}{key}.jsa"


def _made(archive: Path) -> bool:
    """Whether the archive is there: until then its path links to the JDK's own."""
    return archive.exists() and not archive.is_symlink()


def _failed(archive: Path) -> Path:
    return archive.with_suffix(".failed")


def driver_options(directory: Path | None) -> tuple[str, str]:
    """SPARK_SUBMIT_OPTS for the tests' drivers, with the archive under `directory` (None:
    none), whose build starts in the background when it is missing; and what to say of it.
    Until it is made, its path links to the JDK's default archive (of the JDK's own
    classes), which a JVM given a missing archive would go without too."""
    if directory is None:
        return FAST_JVM, "no class archive (pytest's cache is off)"
    try:
        archive = archive_path(directory)
        default = Path(os.path.realpath(java())).parents[1] / "lib" / "server" / "classes.jsa"
    except (RuntimeError, OSError) as error:
        return FAST_JVM, f"no class archive: {error}"
    if any(character.isspace() for character in str(archive)):
        return FAST_JVM, f"no class archive: a JVM option cannot hold the path {archive}"
    options = f"{FAST_JVM} -XX:SharedArchiveFile={archive}"
    if _made(archive):
        return options, f"class archive {archive}"
    if _failed(archive).exists():
        log = directory / BUILD_LOG
        return FAST_JVM, f"no class archive: its build failed ({log}; delete {_failed(archive)})"
    with open(directory / ".build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # being made: its path links to the default already
        else:
            if not archive.exists() and default.exists():
                link = directory / f"link-{os.getpid()}"
                link.symlink_to(default)
                os.replace(link, archive)
    subprocess.Popen(
        [sys.executable, __file__, "build", str(directory)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # it finishes after a short session
    )
    if not archive.exists():
        return FAST_JVM, f"no class archive: the JDK has no default one ({default}) to stand in"
    return options, f"class archive {archive}, being made (log: {directory / BUILD_LOG})"


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    """`command`'s standard error; an error with its output when it fails."""
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, env=env, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:3])} ... exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done.stderr


def _driver_command(launcher_output: str) -> list[str]:
    """The driver's java command line up to its main class, as Spark's launcher printed it
    (SPARK_PRINT_LAUNCH_COMMAND): what an archive must match. Its parts hold no spaces
    (`driver_options`); a wrong split fails the -Xshare:on check."""
    line = next(line for line in launcher_output.splitlines() if line.startswith("Spark Command: "))
    command = line.removeprefix("Spark Command: ").split(" ")
    return command[: command.index(SPARK_SUBMIT)]


def build(directory: Path) -> None:
    """Make the archive unless it exists or another process is making it, saying how it
    went in the build log."""
    with open(directory / ".build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        for leftover in directory.glob("build-*"):  # of a build that was killed
            shutil.rmtree(leftover, ignore_errors=True)
        archive = archive_path(directory)
        with open(directory / BUILD_LOG, "w") as log:
            try:
                _build(directory, archive)
            except Exception:
                log.write(traceback.format_exc())
                _failed(archive).touch()  # not tried again by every run
                raise
            log.write(f"made {archive}\n")


def _build(directory: Path, archive: Path) -> None:
    """The archive, made unless it is there; older ones go."""
    if _made(archive):
        return
    # In the same directory: the rename into place is atomic (a tmpfs /tmp is another
    # filesystem), so a JVM finds no archive or a whole one.
    with tempfile.TemporaryDirectory(prefix="build-", dir=directory) as work:
        class_list = Path(work) / "classes.lst"
        listing = f"-XX:DumpLoadedClassList={class_list}"
        environment = {
            key: value for key, value in os.environ.items() if key != "PYSPARK_SUBMIT_ARGS"
        }
        launch = _run(
            [sys.executable, str(WORKLOAD), work],
            env={
                **environment,
                "SPARK_SUBMIT_OPTS": f"{FAST_JVM} {listing}",
                "SPARK_PRINT_LAUNCH_COMMAND": "1",
                "PYSPARK_PYTHON": sys.executable,
            },
        )
        command = [part for part in _driver_command(launch) if part != listing]
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
    for old in directory.glob(f"{ARCHIVE_PREFIX}*"):
        if old != archive:
            old.unlink()


if __name__ == "__main__":
    assert sys.argv[1] == "build", "usage: spark_jvm.py build DIRECTORY"
    build(Path(sys.argv[2]))
