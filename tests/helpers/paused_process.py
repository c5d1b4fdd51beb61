"""Python code run in a child process that stops at a chosen point and waits, so that a test
can kill it there with SIGKILL (a crash exactly at that point, as ``kill -9`` makes one) or
act while it waits and then let it go on (another process caught in the middle of a write).

The child stops just before its first call of `before` (``os.link``, ``os.replace`` or
``fcntl.flock``, seen through ``sys.setprofile``), or where its code calls ``pause()``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import TracebackType

_CHILD = """
import fcntl, os, sys

def pause():
    print("paused", flush=True)
    sys.stdin.readline()

_before = {"": None, "os.link": os.link, "os.replace": os.replace, "fcntl.flock": fcntl.flock}[
    sys.argv[1]
]

def _stop_before(frame, event, function):
    if event == "c_call" and function is _before:
        sys.setprofile(None)
        pause()

sys.setprofile(_stop_before)
exec(sys.argv[2])
"""


class PausedProcess:
    """`code` running in a child process, stopped at its pause point once constructed."""

    def __init__(
        self, code: str, *, before: str = "", environment: dict[str, str] | None = None
    ) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _CHILD, before, code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(environment or {})},
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if line != "paused\n":
            _output, errors = self._process.communicate(timeout=60)
            raise AssertionError(f"the child ended before its pause point: {line}{errors}")

    def kill(self) -> None:
        """Crash it where it stopped (SIGKILL: no cleanup of any kind runs)."""
        self._process.send_signal(signal.SIGKILL)
        self._process.wait(timeout=60)

    def resume(self) -> str:
        """Let it go on to the end; what it printed after its pause. Fails if it failed."""
        output, errors = self._process.communicate("\n", timeout=60)
        assert self._process.returncode == 0, errors
        return output

    def __enter__(self) -> PausedProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process.poll() is None:
            self.kill()
