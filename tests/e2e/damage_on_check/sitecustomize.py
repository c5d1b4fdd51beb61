"""Test hook: damages an image right after it completed, before its restorable check reads
it, in the check's own process (``python -m spark_checkpoint.restorable``, which the runtime
starts for checkpointing.verifyRestorable). Put on PYTHONPATH with CHECK_HOOK_JOB
naming the job's directory (of tests/helpers/job_run.JobRun).

The first image checked is left alone (the restore needs an older image). The next one
checked that is the job's newest registered image gets its driver killed (kill -9) and is
damaged as in tests/helpers/images.py, so that it is newest when the next driver restores:
without the check's verdict, that restore would pick it. Every other process ignores this.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

_JOB = os.environ.get("CHECK_HOOK_JOB")
_COMMAND = Path("/proc/self/cmdline").read_bytes().split(b"\0")


def _newest(status_file: Path) -> str:
    registry = json.loads(status_file.read_text())["status"]["coordinator"]
    images = [("checkpoint", c["id"]) for c in registry["checkpoints"]]
    images += [("savepoint", s["id"]) for s in registry["savepoints"]]
    kind, number = max(images, key=lambda image: image[1])
    return f"{kind}:{number}"


def _damage_if_due(job: Path) -> None:
    image = _COMMAND[-2].decode()  # the last argument (cmdline ends with a NUL)
    first, damaged = job / "first-checked", job / "damaged"
    if damaged.exists():
        return
    if not first.exists():
        first.write_text(image)
        return
    status_file = job / "state/default/wordcount/status.json"
    if _newest(status_file) != image:
        return  # one completed after this check began: a later check is the newest's
    os.killpg(json.loads(status_file.read_text())["driver"]["pid"], signal.SIGKILL)
    time.sleep(1.0)  # anything the runtime was registering is in its status now
    damaged.write_text(f"{image} {_newest(status_file)}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from helpers.images import leave_out_newest_state  # noqa: PLC0415 (only in the check)

    kind, number = image.split(":")
    leave_out_newest_state(job / "state/storage/default/wordcount", kind, int(number))


if _JOB and b"spark_checkpoint.restorable" in _COMMAND:
    _damage_if_due(Path(_JOB))
