"""Child processes that die with the thread that started them, however it ends (Linux's
parent-death signal), started without running Python between fork and exec.

``preexec_fn`` runs Python in the forked copy of a process that has threads: a lock another
thread held at the fork is held forever there, the child deadlocks before it execs, and the
parent waits for it without end inside ``subprocess.Popen`` (the subprocess documentation
warns of it; it hung the test kubelet's event loop in CI). Here the child is a fresh
interpreter that sets the signal and execs the command, keeping its pid.
"""

import os
import sys
from collections.abc import Sequence

# Run by `python -I -S -c`: no site, no environment, nothing imported but what it needs.
# PR_SET_PDEATHSIG is 1; a parent gone before the signal was set would never send it.
_SET_PARENT_DEATH_SIGNAL = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit(128 + signal.SIGKILL)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv``, run so that the kernel kills it when the thread that starts it ends (on
    Linux; elsewhere as it is). ``argv[0]`` is looked up in the child's ``PATH``."""
    if sys.platform != "linux":
        return list(argv)
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _SET_PARENT_DEATH_SIGNAL,
        str(os.getpid()),
        *argv,
    ]
