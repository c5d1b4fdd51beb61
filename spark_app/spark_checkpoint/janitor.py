"""Storage work while no driver runs: ``python -m spark_checkpoint.janitor <command>``.

On Kubernetes the operator runs this in a short cleanup pod that has the job's image,
service account, environment and volumes, which is where storage credentials live; the
operator itself never touches storage. The job comes from ``SPARK_CHECKPOINT_NAMESPACE``,
``SPARK_CHECKPOINT_JOB`` and ``SPARK_CHECKPOINT_STORAGE``; ``remove-live-directory`` also
needs ``SPARK_CHECKPOINT_LIVE_ROOT``, where the job's live volume claim is mounted whole.

Exit codes: 0 done, 1 storage failed (the message is the last line of output, which the
pod's termination message shows; a symbolic link in the job's directory is refused this
way, before anything is deleted), 2 bad arguments or settings (an id that is not a
non-negative integer, a namespace or job that is not a valid name, an unknown storage URI).
"""

import argparse
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from spark_checkpoint.settings import PREFIX
from spark_checkpoint.storage import (
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
    SymbolicLinkError,
)


def _id(text: str) -> int:
    # Only ASCII digits: int() would also take "-1", " 7", "1_000" and other scripts' digits.
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a non-negative integer)")
    return int(text)


def _ids(text: str) -> list[int]:
    return [_id(part) for part in text.split(",") if part]


def _directory_name(text: str) -> str:
    if text in ("", ".", "..") or "/" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not one directory name")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spark_checkpoint.janitor")
    commands = parser.add_subparsers(dest="command", required=True)
    discard = commands.add_parser("discard-checkpoint", help="delete one checkpoint")
    discard.add_argument("checkpoint_id", type=_id)
    discard.add_argument(
        "--retained", type=_ids, default=[], help="ids whose shared files must stay (1,2,3)"
    )
    savepoint = commands.add_parser("discard-savepoint", help="delete one savepoint")
    savepoint.add_argument("savepoint_id", type=_id)
    garbage = commands.add_parser("collect-garbage", help="delete what the registry does not list")
    garbage.add_argument("--checkpoints", type=_ids, default=[], help="registered ids (1,2)")
    garbage.add_argument("--savepoints", type=_ids, default=[], help="registered ids (1,2)")
    live = commands.add_parser(
        "remove-live-directory", help="delete a deleted job's directory on its live volume claim"
    )
    live.add_argument("name", type=_directory_name, help="the directory under the claim's root")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    names = ["NAMESPACE", "JOB", "STORAGE"]
    if arguments.command == "remove-live-directory":
        names.append("LIVE_ROOT")
    settings = {name: os.environ.get(PREFIX + name, "") for name in names}
    missing = [PREFIX + name for name, value in settings.items() if not value]
    if missing:
        print(f"not set: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        layout = JobStorageLayout(settings["STORAGE"], settings["NAMESPACE"], settings["JOB"])
        storage = CheckpointStorage(layout)
    except (ValueError, ImportError) as error:  # a bad name, or no fsspec for the URI
        print(f"bad settings: {error}", file=sys.stderr)
        return 2
    try:
        match arguments.command:
            case "discard-checkpoint":
                storage.discard_checkpoint(arguments.checkpoint_id, arguments.retained)
                print(f"discarded checkpoint {arguments.checkpoint_id}")
            case "discard-savepoint":
                storage.discard_savepoint(arguments.savepoint_id)
                print(f"discarded savepoint {arguments.savepoint_id}")
            case "collect-garbage":
                report = storage.collect_garbage(arguments.checkpoints, arguments.savepoints)
                print(
                    f"removed checkpoints {list(report.checkpoint_ids)}, savepoints "
                    f"{list(report.savepoint_ids)}, {len(report.shared_locations)} shared files"
                )
            case "remove-live-directory":
                directory = Path(settings["LIVE_ROOT"]) / arguments.name
                if directory.is_symlink():
                    raise SymbolicLinkError(str(directory), os.readlink(directory))
                if directory.exists():
                    shutil.rmtree(directory)
                    print(f"removed {directory}")
                else:
                    print(f"{directory} does not exist: nothing to remove")
    except (StorageError, OSError, ValueError) as error:
        print(f"{arguments.command} failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
