"""README's setup commands are `make` targets: `make test` is CI itself, and `make demo`'s
script runs in tests/e2e/test_demo.py, so neither runs here a second time. What can drift is
checked: each target exists, the scripts it would run (``make -n``) exist, and CI's entry
point runs README's test command."""

import re
import shlex
import subprocess

from helpers.doc_blocks import ROOT, marked_blocks, shell_commands

DEMO_SCRIPT = "examples/wordcount/demo.py"


def test_setup_commands_are_make_targets_and_ci_runs_the_test_command() -> None:
    (block,) = marked_blocks(
        "tests/docs/test_setup_commands.py::"
        "test_setup_commands_are_make_targets_and_ci_runs_the_test_command"
    )
    commands = shell_commands(block.text)
    ci = shell_commands((ROOT / ".ci" / "run").read_text())
    assert ["make", "test"] in commands, f"{block}: README shows how to run every check"
    assert ci[-1] == ["make", "test"], ".ci/run must run README's test command"
    for command in commands:
        assert command[0] == "make" and len(command) == 2, f"{block}: not a make target"
        dry_run = subprocess.run(
            ["make", "-n", command[1]], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert dry_run.returncode == 0, f"{block}: `{shlex.join(command)}`: {dry_run.stderr}"
        scripts = re.findall(r"[\w./-]+\.py\b", dry_run.stdout)
        for script in scripts:
            assert (ROOT / script).is_file(), (
                f"{block}: `{shlex.join(command)}` runs {script}, which does not exist"
            )
        if command == ["make", "demo"]:
            # What tests/e2e/test_demo.py runs; a demo target run another way would not be.
            assert scripts == [DEMO_SCRIPT], f"{block}: `make demo` runs {scripts}"
