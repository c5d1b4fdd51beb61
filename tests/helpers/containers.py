"""The project's images, built and run on this machine: no Docker engine and no image registry.

Debian's Buildah builds the Dockerfile's targets on a stand-in for the official Python image
that mmdebstrap assembles from Debian's packages (`stand_in_base`), and Podman runs
containers from them under a Kubernetes securityContext (`security_options`). Both reach
package sources the way this machine does: the stand-in keeps the machine's apt sources, its
own certificate authorities and its pip index settings, so the Dockerfile's `apt-get` and
`pip install` work in the build unchanged.

Everything is cached outside the clone: the base's root file system tarball in `CACHE`,
the imported base, the images and Buildah's layer cache in Podman's storage. A rerun
rebuilds only the layers whose inputs changed.

    python tests/helpers/containers.py build [TARGET...]  # prints each image's exact name
    python tests/helpers/containers.py run TARGET [COMMAND...]

Needs root (as on CI), and `apt-get install podman buildah mmdebstrap runc` (`make
images-tools`). Podman runs with runc and cgroupfs (crun fails on this machine's hybrid
cgroup layout) and without default ulimits (refused here).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "spark-checkpoint-operator"
TOOLS = ("podman", "buildah", "mmdebstrap", "runc")
TARGETS = ("operator", "spark")
CACHE = Path(
    os.environ.get("SPARK_CHECKPOINT_IMAGE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spark-checkpoint-images"
)
BASE_REPOSITORY = "localhost/spark-checkpoint-base"
IMAGE_REPOSITORY = "localhost/spark-checkpoint"
# The tag the tests build and run (never pushed anywhere).
IMAGE_TAG = "dev"
# Container runtime options this machine needs (see the module's docstring).
PODMAN_OPTIONS = ("--runtime", "runc", "--cgroup-manager", "cgroupfs")
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"

# --- the stand-in base ---------------------------------------------------------------------------

SUITE = "bookworm"
# Python 3.11 with venv (and so pip, from Debian's bundled wheels), and the CA bundle.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Like Debian's slim images: no documentation, manual pages or translations.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
# The official image's `python` and `pip` live in /usr/local/bin and install into
# /usr/local/lib/python3.11/site-packages, which the Dockerfile relies on (SPARK_HOME, the
# console scripts' paths): a virtual environment rooted at /usr/local has exactly those
# paths, and pip may install into it (Debian's own Python refuses, PEP 668).
VENV_HOOK = 'chroot "$1" python3 -m venv /usr/local'
# What the official image sets that a build or a container relies on.
BASE_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
# Certificate authorities the machine added to its trust store (an egress proxy's, say).
LOCAL_AUTHORITIES = Path("/usr/local/share/ca-certificates")
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
# pip settings that name where packages come from, carried into the stand-in's
# /etc/pip.conf; the others (find-links, constraints) name files of this machine.
PIP_SOURCE_SETTINGS = ("index-url", "extra-index-url", "trusted-host", "cert", "timeout")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class ImageError(Exception):
    """A tool failed: the message says which and ends with its last output lines."""


def environment() -> dict[str, str]:
    """The process environment with CONTAINERS_CONF set to this machine's settings."""
    conf = CACHE / "containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        CACHE.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def _execute(command: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command),
        env=environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def _run(command: Sequence[str], *, timeout: float, what: str) -> str:
    result = _execute(command, timeout=timeout)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise ImageError(f"{what} failed (exit {result.returncode}):\n{tail}")
    return result.stdout


def podman_command(*arguments: str) -> list[str]:
    return ["podman", *PODMAN_OPTIONS, *arguments]


def podman(*arguments: str, timeout: float = 120) -> str:
    return _run(podman_command(*arguments), timeout=timeout, what="podman")


def image_exists(name: str) -> bool:
    return _execute(podman_command("image", "exists", name), timeout=60).returncode == 0


def apt_sources() -> list[Path]:
    """This machine's apt source files (one-line lists and deb822 .sources), which
    mmdebstrap reads as its mirrors and writes into the stand-in."""
    single, directory = APT_SOURCES
    found = [single] if single.is_file() and single.read_text().strip() else []
    if directory.is_dir():
        found += sorted(
            path
            for path in directory.iterdir()
            if path.suffix in {".list", ".sources"} and path.read_text().strip()
        )
    return found


def local_authorities() -> list[Path]:
    if not LOCAL_AUTHORITIES.is_dir():
        return []
    return sorted(path for path in LOCAL_AUTHORITIES.rglob("*.crt") if path.is_file())


def pip_sources() -> str:
    """An /etc/pip.conf for the stand-in: this machine's pip settings that say where packages
    come from (``pip config list``, environment included), local paths left out; a
    certificate setting becomes the stand-in's bundle, which holds this machine's
    certificate authorities."""
    listed = _run(
        [sys.executable, "-m", "pip", "config", "list"], timeout=60, what="pip config list"
    )
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, quoted = line.partition("=")
        name = key.rpartition(".")[2].removeprefix("default-")
        value = quoted.strip().strip("'\"")
        if name not in PIP_SOURCE_SETTINGS or not value:
            continue
        if name == "cert":
            value = CA_BUNDLE
        elif name.endswith("index-url"):
            value = " ".join(url for url in value.split() if url.startswith(("http:", "https:")))
        if value:
            settings[name] = value
    return "".join(["[global]\n", *(f"{name} = {value}\n" for name, value in settings.items())])


def stand_in_base() -> str:
    """The name of an image standing in for the official Python 3.11 image: Debian bookworm
    from this machine's apt sources, Python 3.11 at the official image's paths, this
    machine's certificate authorities and pip settings. Assembled once per recipe (about
    a minute and a half), then taken from the cache."""
    sources = apt_sources()
    authorities = local_authorities()
    pip_conf = pip_sources()
    recipe = hashlib.sha256()
    for part in [
        SUITE,
        *BASE_PACKAGES,
        *DPKG_EXCLUDES,
        VENV_HOOK,
        *BASE_CHANGES,
        pip_conf,
        *(f"{path}:{path.read_text()}" for path in [*sources, *authorities]),
    ]:
        recipe.update(part.encode() + b"\0")
    name = f"{BASE_REPOSITORY}:{SUITE}-{recipe.hexdigest()[:12]}"
    if image_exists(name):
        return name
    tarball = CACHE / f"base-{recipe.hexdigest()[:12]}.tar"
    if not tarball.exists():
        _assemble(tarball, sources, authorities, pip_conf)
    podman("import", *(f"--change={change}" for change in BASE_CHANGES), str(tarball), name)
    return name


def _assemble(tarball: Path, sources: list[Path], authorities: list[Path], pip_conf: str) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as staging:
        conf = Path(staging) / "pip.conf"
        conf.write_text(pip_conf)
        hooks = [f"--customize-hook=copy-in {conf} /etc"]
        if authorities:
            copied = " ".join(str(path) for path in authorities)
            hooks += [
                f"--customize-hook=copy-in {copied} {LOCAL_AUTHORITIES}",
                '--customize-hook=chroot "$1" update-ca-certificates',
            ]
        partial = Path(staging) / tarball.name
        _run(
            [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                *(f"--dpkgopt={option}" for option in DPKG_EXCLUDES),
                *hooks,
                f"--customize-hook={VENV_HOOK}",
                SUITE,
                str(partial),
                *(str(path) for path in sources),
            ],
            timeout=900,
            what="mmdebstrap (the stand-in base)",
        )
        partial.replace(tarball)


# --- the images ----------------------------------------------------------------------------------


def image_name(target: str) -> str:
    return f"{IMAGE_REPOSITORY}/{target}:{IMAGE_TAG}"


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time on this machine: pytest-xdist's workers and other checkouts
    share the cache and Podman's storage, and may need the images at the same moment."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def build_images(targets: Sequence[str] = TARGETS) -> dict[str, str]:
    """The stand-in base and the targets, built under the build lock: each target's name
    (``build``)."""
    with build_lock():
        base = stand_in_base()
        return {target: build(target, base) for target in targets}


def build(target: str, base: str) -> str:
    """Build a target of the Dockerfile on ``base`` with Buildah's layer cache (callers hold
    ``build_lock``). Tags it ``:dev`` and returns a tag naming this very image
    (``:dev-<image id>``): Podman's storage is the machine's, so another checkout may tag
    another build ``:dev`` while a test runs this one."""
    if target not in TARGETS:
        raise ImageError(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    name = image_name(target)
    image_id = build_context(ROOT, name, "--build-arg", f"BASE_IMAGE={base}", "--target", target)
    exact = f"{name}-{image_id.removeprefix('sha256:')[:12]}"
    podman("tag", image_id, exact)
    return exact


def build_context(context: Path, name: str, *options: str) -> str:
    """`buildah bud` of the context's Dockerfile, tagged ``name``, with the layer cache;
    returns the image's id."""
    with tempfile.TemporaryDirectory() as scratch:
        id_file = Path(scratch) / "image-id"
        _run(
            [
                *("buildah", "bud", "--layers", *PODMAN_OPTIONS, "--network", "host"),
                *options,
                *("--iidfile", str(id_file), "--tag", name),
                *("--file", str(context / "Dockerfile"), str(context)),
            ],
            timeout=1800,
            what=f"buildah bud {shlex.join(options)} {context}",
        )
        return id_file.read_text().strip()


# --- running containers as Kubernetes would ------------------------------------------------------


def security_options(
    pod_context: Mapping[str, Any], container_context: Mapping[str, Any]
) -> list[str]:
    """`podman run` options for a container's securityContext over its pod's: the user and
    group, a read-only root file system (without Podman's own writable /tmp, /var/tmp and
    /run, which Kubernetes does not add), dropped and added capabilities, no privilege
    escalation and the supplemental fsGroup. runAsNonRoot is enforced the way the kubelet
    does, with the image's user when none is given."""
    context = {**pod_context, **container_context}
    options: list[str] = []
    user, group = context.get("runAsUser"), context.get("runAsGroup")
    if user is not None:
        options += ["--user", f"{user}:{group}" if group is not None else str(user)]
    elif group is not None:
        raise ImageError("runAsGroup without runAsUser: podman cannot set only the group")
    if context.get("readOnlyRootFilesystem"):
        options += ["--read-only", "--read-only-tmpfs=false"]
    capabilities = context.get("capabilities") or {}
    options += [f"--cap-drop={name}" for name in capabilities.get("drop", [])]
    options += [f"--cap-add={name}" for name in capabilities.get("add", [])]
    if context.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt=no-new-privileges"]
    if "fsGroup" in pod_context:
        options += [f"--group-add={pod_context['fsGroup']}"]
    return options


@dataclass(frozen=True)
class Mount:
    """A volume mount of a container: ``source`` is a host directory or file, or None for a
    fresh tmpfs (an emptyDir kept in memory, of at most ``size``)."""

    path: str
    source: Path | None
    read_only: bool = False
    size: str | None = None


def container_options(
    image: str,
    pod_context: Mapping[str, Any],
    container_context: Mapping[str, Any],
    *,
    env: Mapping[str, str],
    mounts: Sequence[Mount],
    command: Sequence[str] | None,
    working_dir: str | None,
) -> list[str]:
    """`podman create`/`run` options (before the image) for a pod's container with its
    environment and mounts resolved: its securityContext over the pod's (runAsNonRoot
    checked against the image's user), the variables, the mounts and the command, which
    replaces the image's entrypoint and arguments as a pod's `command` does."""
    check_non_root(image, pod_context, container_context)
    options = security_options(pod_context, container_context)
    for name, value in env.items():
        options += ["--env", f"{name}={value}"]
    for mount in mounts:
        if mount.source is None:
            limit = f",size={_tmpfs_size(mount.size)}" if mount.size else ""
            # As an emptyDir: writable by anyone, programs may run from it.
            options += ["--tmpfs", f"{mount.path}:rw,exec,nosuid,nodev,mode=1777{limit}"]
        else:
            access = "ro" if mount.read_only else "rw"
            options += ["--volume", f"{mount.source}:{mount.path}:{access}"]
    if command is not None:
        options += ["--entrypoint", json.dumps(list(command))]
    if working_dir:
        options += ["--workdir", working_dir]
    return options


def pod_container_options(
    image: str,
    pod_spec: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    volumes: Mapping[str, Path],
    namespace: str = "default",
) -> tuple[list[str], list[str]]:
    """`podman run` options and arguments (after the image) for a pod's container without
    an API server: plain environment values and the pod's namespace and service account
    (the downward API) only; a volume named in ``volumes`` is that host directory, an
    emptyDir otherwise a fresh tmpfs (the local kubelet's container mode resolves the
    rest)."""
    fields = {
        "metadata.name": "spark-checkpoint-operator-0",
        "metadata.namespace": namespace,
        "spec.serviceAccountName": pod_spec.get("serviceAccountName", "default"),
    }
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        field = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif field in fields:
            env[variable["name"]] = fields[field]
        else:
            raise ImageError(f"env {variable['name']}: only plain values are supported here")
    sources = {volume["name"]: volume for volume in pod_spec.get("volumes", [])}
    mounts: list[Mount] = []
    for mount in container.get("volumeMounts", []):
        name, path, read_only = mount["name"], mount["mountPath"], bool(mount.get("readOnly"))
        if name in volumes:
            mounts.append(Mount(path, volumes[name] / mount.get("subPath", ""), read_only))
        elif "emptyDir" in sources[name]:
            mounts.append(Mount(path, None, size=sources[name]["emptyDir"].get("sizeLimit")))
        else:
            raise ImageError(f"volume {name}: no host directory given for it")
    options = container_options(
        image,
        pod_spec.get("securityContext", {}),
        container.get("securityContext", {}),
        env=env,
        mounts=mounts,
        command=container.get("command"),
        working_dir=container.get("workingDir"),
    )
    return options, list(container.get("args", []))


def _tmpfs_size(quantity: str) -> str:
    """A Kubernetes quantity (binary suffixes) as tmpfs's size option."""
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if quantity.endswith(suffix):
            return quantity.removesuffix(suffix) + unit
    if quantity.isdigit():
        return quantity
    raise ImageError(f"emptyDir sizeLimit {quantity!r}: use a Ki, Mi or Gi quantity")


def chart_deployment(values: Mapping[str, Any]) -> dict[str, Any]:
    """The operator's Deployment as the chart renders it with ``values``."""
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values=dict(values), name="sco", namespace="operators")
    (deployment,) = [
        document
        for path, text in rendered.items()
        if path.endswith("/deployment.yaml")
        for document in yaml.safe_load_all(text)
        if document
    ]
    return dict(deployment)


def image_user(image: str) -> str:
    return podman("image", "inspect", "--format", "{{.Config.User}}", image).strip()


def check_non_root(
    image: str, pod_context: Mapping[str, Any], container_context: Mapping[str, Any]
) -> None:
    """The kubelet's runAsNonRoot check: a numeric, non-zero user."""
    context = {**pod_context, **container_context}
    if not context.get("runAsNonRoot"):
        return
    user = context.get("runAsUser")
    uid = str(user) if user is not None else image_user(image).partition(":")[0]
    if not uid.isdigit() or int(uid) == 0:
        raise ImageError(
            f"{image}: runAsNonRoot, but the image's user is {uid or 'root'!r} "
            "(the kubelet refuses a non-numeric or zero user)"
        )


def run(
    image: str,
    command: Sequence[str] = (),
    *,
    options: Sequence[str] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`podman run --rm` on the host's network; the result, whatever its exit code. A
    container still running after ``timeout`` is removed (Podman's client would leave it).

    Like containerd (CRI-O does add one), and unlike Podman's default, it adds no passwd
    entry for a user the image has none for (an arbitrary uid of OpenShift's restricted-v2):
    the image must work without; the image's own entries, 10001's among them, are there
    either way. (`podman create`, which the local kubelet uses, has no such option in
    Podman 4.3, and gives such a uid an entry.)"""
    name = f"spark-checkpoint-{uuid.uuid4().hex[:12]}"
    try:
        return _execute(
            [
                *podman_command("run", "--rm", "--pull=never", "--network=host", "--passwd=false"),
                *("--name", name, *options, image, *command),
            ],
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        _execute(podman_command("rm", "--force", name), timeout=60)
        raise


def main(arguments: Sequence[str]) -> int:
    if not arguments or arguments[0] not in {"build", "run"}:
        print(__doc__, file=sys.stderr)
        return 2
    missing = missing_tools()
    if missing:
        print(f"missing {', '.join(missing)}: run `make images-tools`", file=sys.stderr)
        return 1
    try:
        if arguments[0] == "build":
            started = time.monotonic()
            for name in build_images(arguments[1:] or TARGETS).values():
                print(name)
            print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
            return 0
        result = run(image_name(arguments[1]), arguments[2:], timeout=3600)
    except ImageError as error:
        print(error, file=sys.stderr)
        return 1
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
