"""`spark_checkpoint.user_entry`: a uid without a passwd entry (OpenShift's arbitrary uid on
containerd) gets one through nss_wrapper's files in the environment of what the process
starts; a uid with one changes nothing. The image tests (tests/image/test_containers.py)
run it with the real library."""

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spark_checkpoint import user_entry

SYSTEM_PASSWD = "root:x:0:0:root:/root:/bin/bash\nsparkcheckpoint:x:10001:10001::/home:/bin/sh\n"
SYSTEM_GROUP = "root:x:0:\nsparkcheckpoint:x:10001:\n"
PRIMARY = 4242
SUPPLEMENTAL = 1000680000  # an fsGroup of OpenShift's namespace range


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A stand-in libnss_wrapper.so where the module looks, the system's passwd and group
    files, and a temporary directory of the test's own."""
    path = tmp_path / "lib" / "libnss_wrapper.so"
    path.parent.mkdir()
    path.touch()
    monkeypatch.setattr(user_entry, "LIBRARY_PATTERNS", (str(path),))
    for name, text in [("SYSTEM_PASSWD", SYSTEM_PASSWD), ("SYSTEM_GROUP", SYSTEM_GROUP)]:
        system = tmp_path / "etc" / name
        system.parent.mkdir(exist_ok=True)
        system.write_text(text)
        monkeypatch.setattr(user_entry, name, str(system))
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    return str(path)


@pytest.fixture
def no_entry(library: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """This uid has no passwd entry; its groups: a primary one and an fsGroup the system
    does not name, and group 0, which it names."""

    def missing(uid: int) -> object:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", missing)
    monkeypatch.setattr(os, "getgid", lambda: PRIMARY)
    monkeypatch.setattr(os, "getgroups", lambda: [PRIMARY, 0, SUPPLEMENTAL])
    return library


def test_a_uid_with_an_entry_changes_nothing(library: str, tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path), "LD_PRELOAD": "libother.so"}

    user_entry.provide_user_entry(environ)

    assert environ == {"HOME": str(tmp_path), "LD_PRELOAD": "libother.so"}
    assert not list((tmp_path / "tmp").iterdir()), "no files written"


def test_without_an_entry_the_files_hold_the_uid_and_the_environment_names_them(
    no_entry: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    environ = {"HOME": str(home)}

    user_entry.provide_user_entry(environ)

    uid = os.getuid()
    assert set(environ) == {"HOME", "LD_PRELOAD", "NSS_WRAPPER_PASSWD", "NSS_WRAPPER_GROUP"}
    assert environ["LD_PRELOAD"] == no_entry
    assert environ["HOME"] == str(home), "a writable HOME stays the home"
    passwd = Path(environ["NSS_WRAPPER_PASSWD"])
    group = Path(environ["NSS_WRAPPER_GROUP"])
    assert passwd.parent == group.parent
    assert passwd.parent.parent == tmp_path / "tmp"
    assert passwd.parent.stat().st_mode & 0o077 == 0, "a private directory"
    # nss_wrapper reads only these files: the system's entries come first.
    assert passwd.read_text() == (
        f"{SYSTEM_PASSWD}spark:x:{uid}:{PRIMARY}:spark:{home}:/usr/sbin/nologin\n"
    )
    assert group.read_text() == (
        f"{SYSTEM_GROUP}spark-{PRIMARY}:x:{PRIMARY}:spark\n"
        f"spark-{SUPPLEMENTAL}:x:{SUPPLEMENTAL}:spark\n"
    )


def test_without_a_usable_home_the_entry_and_home_are_the_private_directory(
    no_entry: str, tmp_path: Path
) -> None:
    environ = {"HOME": str(tmp_path / "missing")}

    user_entry.provide_user_entry(environ)

    directory = Path(environ["NSS_WRAPPER_PASSWD"]).parent
    assert environ["HOME"] == str(directory)
    entry = Path(environ["NSS_WRAPPER_PASSWD"]).read_text().splitlines()[-1]
    assert entry.split(":")[5] == str(directory)


def test_a_taken_user_name_is_not_reused(no_entry: str, tmp_path: Path) -> None:
    Path(user_entry.SYSTEM_PASSWD).write_text(SYSTEM_PASSWD + "spark:x:185:185::/opt:/bin/sh\n")
    environ: dict[str, str] = {}

    user_entry.provide_user_entry(environ)

    entry = Path(environ["NSS_WRAPPER_PASSWD"]).read_text().splitlines()[-1]
    assert entry.startswith(f"spark-{os.getuid()}:x:{os.getuid()}:")


def test_an_existing_ld_preload_is_kept(no_entry: str) -> None:
    environ = {"LD_PRELOAD": "/opt/lib/libjemalloc.so"}

    user_entry.provide_user_entry(environ)

    assert environ["LD_PRELOAD"] == f"{no_entry}:/opt/lib/libjemalloc.so"


def test_without_the_library_nothing_changes(
    no_entry: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(user_entry, "LIBRARY_PATTERNS", (str(tmp_path / "none" / "*.so"),))
    environ = {"HOME": "/"}

    user_entry.provide_user_entry(environ)

    assert environ == {"HOME": "/"}
    assert not list((tmp_path / "tmp").iterdir())


def test_files_that_cannot_be_written_change_nothing_and_say_why(
    no_entry: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full temporary directory: a warning, not a traceback from the launcher."""

    def full(path: str, lines: list[str]) -> None:
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(user_entry, "_write", full)
    environ = {"HOME": "/"}

    user_entry.provide_user_entry(environ)

    assert environ == {"HOME": "/"}
    assert "no file can hold one: [Errno 28] No space left on device" in capsys.readouterr().err


# `python -m spark_checkpoint.user_entry` in a process whose uid has no entry and whose
# system has the library (the test's stand-in).
MODULE_WITHOUT_AN_ENTRY = """
import glob, os, pwd, runpy, sys
def missing(uid):
    raise KeyError(uid)
pwd.getpwuid = missing
library = sys.argv.pop(1)
glob.glob = lambda pattern: [library] if pattern.endswith("/libnss_wrapper.so") else []
runpy.run_module("spark_checkpoint.user_entry", run_name="__main__")
"""


# The entrypoint's evaluation, then each variable named after it.
EVALUATE = 'eval "$1"; shift; for name; do printf "%s\\n" "${!name}"; done'


def test_the_exports_form_round_trips_through_bash(tmp_path: Path) -> None:
    """What the module prints, evaluated by bash as the image's entrypoint does, sets the
    very values, a space and a quote in the paths included."""
    library = tmp_path / "lib" / "libnss_wrapper.so"
    library.parent.mkdir()
    library.touch()
    temporary = tmp_path / "it's tmp"
    temporary.mkdir()
    environment = {
        "PATH": "/usr/bin:/bin",
        "TMPDIR": str(temporary),
        "HOME": str(tmp_path / "no such home"),
    }
    printed = subprocess.run(
        [sys.executable, "-c", MODULE_WITHOUT_AN_ENTRY, str(library)],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    names = ("LD_PRELOAD", "NSS_WRAPPER_PASSWD", "NSS_WRAPPER_GROUP", "HOME")

    evaluated = subprocess.run(
        ["bash", "-c", EVALUATE, "bash", printed.stdout, *names],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )

    values = dict(zip(names, evaluated.stdout.splitlines(), strict=True))
    directory = Path(values["NSS_WRAPPER_PASSWD"]).parent
    assert values == {
        "LD_PRELOAD": str(library),
        "NSS_WRAPPER_PASSWD": str(directory / "passwd"),
        "NSS_WRAPPER_GROUP": str(directory / "group"),
        "HOME": str(directory),
    }
    assert directory.parent == temporary
    assert f":{os.getuid()}:" in (directory / "passwd").read_text()
