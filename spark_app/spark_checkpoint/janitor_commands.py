"""The janitor's commands and their command line, built and parsed here only.

The operator builds a cleanup or check pod's command with `command_line` (it imports no
pyspark and runs no janitor); the janitor in the pod reads it back with `parse`. A command
parsed from the line built for it is equal to it.
"""

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from spark_checkpoint.protocol import CheckpointKind, StorageOwner
from spark_checkpoint.restorable_report import parse_image
from spark_checkpoint.settings import OWNER_VARIABLE, PREFIX

JANITOR_MODULE = "spark_checkpoint.janitor"
# The job a janitor works on comes from its environment (a cleanup pod's, or a local run's).
JANITOR_SETTINGS = ("NAMESPACE", "JOB", "STORAGE")


def janitor_environment(
    namespace: str, job: str, storage: str, owner: StorageOwner
) -> dict[str, str]:
    values = dict(zip(JANITOR_SETTINGS, (namespace, job, storage), strict=True))
    return {
        **{PREFIX + name: value for name, value in values.items()},
        OWNER_VARIABLE: owner.encode(),
    }


def _id(text: str) -> int:
    # Only ASCII digits: int() would also take "-1", " 7", "1_000" and other scripts' digits.
    if not re.fullmatch(r"[0-9]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a non-negative integer)")
    return int(text)


def _ids(text: str) -> tuple[int, ...]:
    return tuple(_id(part) for part in text.split(",") if part)


def _directory_name(text: str) -> str:
    if text in ("", ".", "..") or "/" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not one directory name")
    return text


def image_argument(text: str) -> tuple[CheckpointKind, int]:
    """An image on a command line (``checkpoint:N``, ``savepoint:N``), for argparse."""
    try:
        return parse_image(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _image(text: str) -> str:
    image_argument(text)
    return text


def _joined(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)


@dataclass(frozen=True, slots=True)
class DiscardCheckpoint:
    NAME: ClassVar[str] = "discard-checkpoint"
    checkpoint_id: int
    retained: tuple[int, ...] = ()  # ids whose shared files must stay

    def arguments(self) -> list[str]:
        return [self.NAME, str(self.checkpoint_id), f"--retained={_joined(self.retained)}"]


@dataclass(frozen=True, slots=True)
class DiscardSavepoint:
    NAME: ClassVar[str] = "discard-savepoint"
    savepoint_id: int

    def arguments(self) -> list[str]:
        return [self.NAME, str(self.savepoint_id)]


@dataclass(frozen=True, slots=True)
class CollectGarbage:
    NAME: ClassVar[str] = "collect-garbage"
    checkpoints: tuple[int, ...]  # the registered ids: everything else goes
    savepoints: tuple[int, ...]

    def arguments(self) -> list[str]:
        return [
            self.NAME,
            f"--checkpoints={_joined(self.checkpoints)}",
            f"--savepoints={_joined(self.savepoints)}",
        ]


@dataclass(frozen=True, slots=True)
class ClaimStorage:
    """Claim the job's storage for its registry, and nothing else: a local run's check,
    before Spark starts, that the storage it names can be used with the driver's
    credentials (a mistyped bucket, missing keys)."""

    NAME: ClassVar[str] = "claim-storage"

    def arguments(self) -> list[str]:
        return [self.NAME]


@dataclass(frozen=True, slots=True)
class RemoveLiveDirectory:
    NAME: ClassVar[str] = "remove-live-directory"
    name: str  # the directory under the live claim's root

    def arguments(self) -> list[str]:
        return [self.NAME, "--", self.name]  # a name may start with "-"


@dataclass(frozen=True, slots=True)
class VerifyRestorable:
    NAME: ClassVar[str] = "verify-restorable"
    image: str  # checkpoint:N or savepoint:N
    report: str  # the file the verdict is written to (the pod's termination message)

    def arguments(self) -> list[str]:
        return [self.NAME, self.image, f"--report={self.report}"]


JanitorCommand = (
    DiscardCheckpoint
    | DiscardSavepoint
    | CollectGarbage
    | ClaimStorage
    | RemoveLiveDirectory
    | VerifyRestorable
)


def failure_line(command: JanitorCommand, reason: str) -> str:
    """The janitor's last line when ``command`` fails, as its log shows it."""
    return f"{command.NAME} failed: {reason}"


def failure_reason(command: JanitorCommand, last_line: str) -> str:
    """The reason in the janitor's last line, for a runtime that names the command itself
    (else ``collect-garbage: collect-garbage failed: ...``)."""
    return last_line.removeprefix(failure_line(command, ""))


def command_line(command: JanitorCommand) -> list[str]:
    """The container command that runs ``command`` in the job's image."""
    return ["python", "-m", JANITOR_MODULE, *command.arguments()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {JANITOR_MODULE}")
    commands = parser.add_subparsers(dest="command", required=True)
    discard = commands.add_parser(DiscardCheckpoint.NAME, help="delete one checkpoint")
    discard.add_argument("checkpoint_id", type=_id)
    discard.add_argument(
        "--retained", type=_ids, default=(), help="ids whose shared files must stay (1,2,3)"
    )
    savepoint = commands.add_parser(DiscardSavepoint.NAME, help="delete one savepoint")
    savepoint.add_argument("savepoint_id", type=_id)
    garbage = commands.add_parser(
        CollectGarbage.NAME, help="delete what the registry does not list"
    )
    garbage.add_argument("--checkpoints", type=_ids, default=(), help="registered ids (1,2)")
    garbage.add_argument("--savepoints", type=_ids, default=(), help="registered ids (1,2)")
    commands.add_parser(ClaimStorage.NAME, help="claim the job's storage for its registry")
    live = commands.add_parser(
        RemoveLiveDirectory.NAME,
        help="delete a deleted job's directory on its live volume claim",
    )
    live.add_argument("name", type=_directory_name, help="the directory under the claim's root")
    verify = commands.add_parser(
        VerifyRestorable.NAME, help="let Spark read an image as a restart reads it"
    )
    verify.add_argument("image", type=_image, metavar="KIND:ID")
    verify.add_argument(
        "--report", required=True, help="where the verdict goes (the termination message file)"
    )
    return parser


def parse(argv: Sequence[str] | None = None) -> JanitorCommand:
    """The command on a janitor's command line (after the module name). Bad arguments exit
    with code 2 and a one-line usage error, as argparse does."""
    arguments = vars(_parser().parse_args(argv))
    match arguments.pop("command"):
        case DiscardCheckpoint.NAME:
            return DiscardCheckpoint(**arguments)
        case DiscardSavepoint.NAME:
            return DiscardSavepoint(**arguments)
        case CollectGarbage.NAME:
            return CollectGarbage(**arguments)
        case ClaimStorage.NAME:
            return ClaimStorage()
        case RemoveLiveDirectory.NAME:
            return RemoveLiveDirectory(**arguments)
        case _:
            return VerifyRestorable(**arguments)
