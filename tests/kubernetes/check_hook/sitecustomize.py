"""Test hook for the restorable check on Kubernetes, in the check pod's own process
(``python -m spark_checkpoint.janitor verify-restorable IMAGE``, which the operator runs for
checkpointing.verifyRestorable). Put on the job's PYTHONPATH with CHECK_HOOK_JOB
naming a directory the test watches and CHECK_HOOK_STORAGE the job's storage.

Before Spark reads the image, the hook writes ``checking-IMAGE`` there and waits for the
test's ``answer-IMAGE``: ``damage`` leaves out of the image the state version its next batch
loads (as tests/helpers/images.py does), then Spark reads it; ``skip`` ends the check at once
with exit code 3 and one line (no verdict). Every other process ignores this.
"""

import os
import sys
import time
from pathlib import Path

_JOB = os.environ.get("CHECK_HOOK_JOB")
_ARGUMENTS = [part.decode() for part in Path("/proc/self/cmdline").read_bytes().split(b"\0")]


def _answer(job: Path, image: str) -> str:
    (job / f"checking-{image}").touch()
    answer = job / f"answer-{image}"
    deadline = time.monotonic() + 300
    while not answer.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return answer.read_text() if answer.exists() else "skip"


if _JOB and "spark_checkpoint.janitor" in _ARGUMENTS and "verify-restorable" in _ARGUMENTS:
    _image = _ARGUMENTS[_ARGUMENTS.index("verify-restorable") + 1]
    if _answer(Path(_JOB), _image) == "skip":
        print(f"check hook: {_image} skipped", file=sys.stderr, flush=True)
        os._exit(3)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from helpers.images import leave_out_newest_state

    _kind, _number = _image.split(":")
    _storage = Path(os.environ["CHECK_HOOK_STORAGE"])
    leave_out_newest_state(_storage, _kind, int(_number))
