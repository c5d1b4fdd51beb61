"""benchmarks/README.md's command synopsis: each script starts and takes every option the
synopsis shows. (Runs take minutes, or a minute each in quick mode; this checks that the
commands a reader copies exist as written.)"""

import re
import subprocess

from helpers.doc_blocks import ROOT, marked_blocks, shell_commands, venv_environment

_OPTION = re.compile(r"--[a-z][a-z-]*")


def test_benchmark_commands_start_and_take_their_documented_options() -> None:
    (block,) = marked_blocks(
        "tests/docs/test_benchmark_commands.py::"
        "test_benchmark_commands_start_and_take_their_documented_options"
    )
    commands = shell_commands(block.text)
    assert commands, f"{block}: no command"
    for python, script, *synopsis in commands:
        assert (ROOT / python).is_file(), f"{block}: {python} is not the venv's interpreter"
        result = subprocess.run(
            [str(ROOT / python), script, "--help"],
            cwd=ROOT,
            env=venv_environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"{block}: {script} does not start:\n{result.stderr}"
        taken = set(_OPTION.findall(result.stdout))
        documented = set(_OPTION.findall(" ".join(synopsis)))
        assert documented <= taken, (
            f"{block}: {script} does not take {sorted(documented - taken)}:\n{result.stdout}"
        )
