"""Children that die with the thread that started them, started without `preexec_fn`
(Python run in a forked copy of a threaded process deadlocked the test kubelet in CI)."""

import ast
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_checkpoint_operator.child_process import dying_with_parent

ROOT = Path(__file__).resolve().parents[2]
PR_GET_PDEATHSIG = 2

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a Linux parent-death signal")


def test_the_command_runs_as_itself_with_the_parent_death_signal_set() -> None:
    report = (
        "import ctypes, os, sys\n"
        "signal = ctypes.c_int()\n"
        f"ctypes.CDLL(None).prctl({PR_GET_PDEATHSIG}, ctypes.byref(signal))\n"
        "print(os.getpid(), signal.value, sys.argv[1:])\n"
    )
    child = subprocess.run(
        dying_with_parent([sys.executable, "-c", report, "a b", "--c"]),
        capture_output=True,
        text=True,
        check=True,
    )
    pid, signal, arguments = child.stdout.split(maxsplit=2)
    assert int(signal) == 9  # SIGKILL
    assert arguments.strip() == "['a b', '--c']"
    assert int(pid) > 0


def test_the_child_keeps_the_pid_it_was_started_with() -> None:
    child = subprocess.Popen(
        dying_with_parent([sys.executable, "-c", "import os; print(os.getpid())"]),
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate(timeout=30)
    assert int(out) == child.pid


def test_the_child_dies_when_the_thread_that_started_it_ends() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        started.append(subprocess.Popen(dying_with_parent(["sleep", "600"])))
        time.sleep(1)  # the shim has exec'd sleep by then

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    (child,) = started
    assert child.wait(timeout=10) == -9


def test_no_process_is_started_with_a_preexec_fn() -> None:
    """Python between fork and exec, in a process with threads, can deadlock the child."""
    found = []
    for directory in ("operator", "spark_app", "tests", "benchmarks"):
        for path in (ROOT / directory).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.keyword) and node.arg == "preexec_fn":
                    found.append(f"{path.relative_to(ROOT)}:{node.value.lineno}")
    assert found == []
