"""A passwd entry for the container's user where the platform gives none.

OpenShift's restricted-v2 runs a container as an arbitrary uid of the namespace's range with
gid 0. CRI-O adds a passwd line for that uid, containerd does not, and without one Spark
cannot start: the JVM's ``user.home`` is ``?`` (Ivy: "basedir must be absolute") and
Hadoop's login fails ("Invalid UID, could not determine effective user"); SPARK_USER and
HADOOP_USER_NAME do not help. The spark image has Debian's libnss-wrapper: with it preloaded,
the user and group lookups of a process read the passwd and group files its environment
names instead of the system's.

`provide_user_entry` writes such files (the system's entries and one for this uid) and sets
the variables in the environment that the JVM PySpark starts inherits: the driver's launcher
and the janitor call it first. ``python -m spark_checkpoint.user_entry`` prints the same
variables as shell ``export`` lines, which the image's entrypoint evaluates before it starts
an executor's JVM. Where the uid has an entry, or the library is missing, nothing changes.
"""

import glob
import os
import pwd
import shlex
import sys
import tempfile
from collections.abc import Mapping, MutableMapping

USER_NAME = "spark"
SHELL = "/usr/sbin/nologin"
# Debian installs the library into its multiarch directory (/usr/lib/x86_64-linux-gnu/...).
LIBRARY_PATTERNS = (
    "/usr/lib/*/libnss_wrapper.so",
    "/usr/lib64/libnss_wrapper.so",
    "/usr/lib/libnss_wrapper.so",
)
SYSTEM_PASSWD = "/etc/passwd"
SYSTEM_GROUP = "/etc/group"


def nss_wrapper_library() -> str | None:
    """The path of libnss_wrapper.so, if installed."""
    for pattern in LIBRARY_PATTERNS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def has_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def user_entry_environment(
    environ: Mapping[str, str], *, library: str | None = None
) -> dict[str, str]:
    """The variables that give this process's uid a passwd entry in the processes started
    with them, after writing the files they name; none where the uid has an entry or
    libnss_wrapper.so is missing (``library`` overrides where it is looked for)."""
    uid, gid = os.getuid(), os.getgid()
    if has_entry(uid):
        return {}
    library = library or nss_wrapper_library()
    if library is None:
        _warn(f"uid {uid} has no passwd entry and libnss_wrapper.so is missing")
        return {}
    try:
        directory = tempfile.mkdtemp(prefix="spark-checkpoint-user-")
    except OSError as error:
        _warn(f"uid {uid} has no passwd entry, and no file can hold one: {error}")
        return {}
    home = environ.get("HOME", "")
    if not (os.path.isdir(home) and os.access(home, os.W_OK | os.X_OK)):
        home = directory  # Ivy and Spark write below the home
    # nss_wrapper reads only its own files: they start with the system's entries.
    users = _read(SYSTEM_PASSWD)
    taken = {line.split(":", 1)[0] for line in users}
    name = USER_NAME if USER_NAME not in taken else f"{USER_NAME}-{uid}"
    users.append(f"{name}:x:{uid}:{gid}:{name}:{home}:{SHELL}")
    groups = _read(SYSTEM_GROUP)
    known = {fields[2] for line in groups if len(fields := line.split(":")) > 2}
    # The primary group and the supplemental ones (fsGroup and the like), named where the
    # system does not name them, with the user as a member of those.
    for group in dict.fromkeys([gid, *os.getgroups()]):
        if str(group) not in known:
            groups.append(f"{USER_NAME}-{group}:x:{group}:{name}")
    passwd_file = os.path.join(directory, "passwd")
    group_file = os.path.join(directory, "group")
    try:
        _write(passwd_file, users)
        _write(group_file, groups)
    except OSError as error:  # a full temporary directory: Spark then says what it lacks
        _warn(f"uid {uid} has no passwd entry, and no file can hold one: {error}")
        return {}
    preload = environ.get("LD_PRELOAD", "")
    variables = {
        # First, before whatever else the environment preloads (glibc also reads ':').
        "LD_PRELOAD": f"{library}:{preload}" if preload else library,
        "NSS_WRAPPER_PASSWD": passwd_file,
        "NSS_WRAPPER_GROUP": group_file,
    }
    if home != environ.get("HOME"):
        variables["HOME"] = home  # what Python and shells read agrees with the entry
    return variables


def provide_user_entry(environ: MutableMapping[str, str] = os.environ) -> None:
    """Give this process's uid a passwd entry in the processes it starts from now on (the
    JVM of PySpark, say), if it has none: see the module's docstring."""
    environ.update(user_entry_environment(environ))


def exports(environ: Mapping[str, str]) -> str:
    """`user_entry_environment` as shell ``export`` lines."""
    return "".join(
        f"export {name}={shlex.quote(value)}\n"
        for name, value in user_entry_environment(environ).items()
    )


def _read(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as file:
            return [line for line in file.read().splitlines() if line.strip()]
    except OSError:
        return []


def _write(path: str, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write("".join(f"{line}\n" for line in lines))


def _warn(message: str) -> None:
    print(f"spark_checkpoint.user_entry: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.stdout.write(exports(os.environ))
