"""The restorable check's report, written by the check and read by the operator.

One JSON document, ``{"snapshots": [{"kind", "id", "problems": [...]}]}`` (`ImageVerdict`
per image): the last line
of ``python -m spark_checkpoint.restorable``'s output, and on Kubernetes the termination
message of the check pod (``python -m spark_checkpoint.janitor verify-restorable``), which
Kubernetes cuts at 4096 bytes: `fitted` keeps a report within that, so what the operator
reads is always a whole document.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from spark_checkpoint.protocol import CheckpointKind, ProtocolError, RestoreCandidate
from spark_checkpoint.settings import TERMINATION_MESSAGE_BYTES

# Kubernetes keeps at most this much of a container's termination message file.


class ReportUnreadable(ValueError):
    """No verdict can be read; the message says why, in one line."""


def parse_image(text: str) -> tuple[CheckpointKind, int]:
    """A registered image in the one restore-candidate spelling (``checkpoint:N``,
    ``savepoint:N``; `RestoreCandidate`). Raises ValueError for anything else (an external
    savepoint too: only the job's own images are checked)."""
    try:
        image = RestoreCandidate.decode(text)
    except ProtocolError:
        image = None
    if image is None or image.snapshot_id is None:
        raise ValueError(f"{text!r} is not checkpoint:N or savepoint:N")
    return image.kind, image.snapshot_id


@dataclass(frozen=True, slots=True)
class ImageVerdict:
    """What the check found in one image: no problems means restorable."""

    kind: CheckpointKind
    snapshot_id: int
    problems: tuple[str, ...]

    @property
    def image(self) -> str:
        return RestoreCandidate.registered(self.kind, self.snapshot_id).encode()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "id": self.snapshot_id, "problems": list(self.problems)}

    @classmethod
    def from_dict(cls, data: object) -> "ImageVerdict":
        """Raises `ReportUnreadable` when ``data`` is not one."""
        if not isinstance(data, dict) or not {"kind", "id", "problems"} <= data.keys():
            raise ReportUnreadable("not a report: an image without kind, id and problems")
        problems = data["problems"]
        if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
            raise ReportUnreadable(
                f"not a report: the problems of {data['kind']}:{data['id']} are not a list of text"
            )
        try:
            kind, snapshot_id = parse_image(f"{data['kind']}:{data['id']}")
        except ValueError as error:
            raise ReportUnreadable(f"not a report: {error}") from None
        return cls(kind, snapshot_id, tuple(problems))


def encoded(verdicts: Sequence[ImageVerdict]) -> str:
    """The report of ``verdicts``, one line."""
    return json.dumps({"snapshots": [verdict.to_dict() for verdict in verdicts]})


def fitted(verdict: ImageVerdict, limit: int = TERMINATION_MESSAGE_BYTES) -> str:
    """The report of one image in at most ``limit`` bytes: the problems that fit, in order,
    then one saying how many were left out; a problem alone too long is cut at the end. An
    image with problems keeps at least one (the verdict never changes)."""
    problems = list(verdict.problems)
    left_out = 0
    cut = False  # the one problem left was shortened
    while True:
        kept = [*problems[:-1], problems[-1] + "... (cut)"] if cut else [*problems]
        if left_out:
            kept.append(
                f"... and {left_out} more problem(s), left out to fit the {limit}-byte "
                "termination message (the check pod's log has them all)"
            )
        text = encoded([replace(verdict, problems=tuple(kept))])
        if len(text.encode()) <= limit:
            return text
        if len(problems) > 1:
            problems.pop()
            left_out += 1
        elif problems and problems[0]:
            problems[0] = problems[0][: len(problems[0]) // 2]
            cut = True
        else:
            raise ValueError(f"no report of {verdict.image} fits {limit} bytes")


def problems_by_image(text: str) -> dict[str, list[str]]:
    """The report (the last line of ``text``) as each image's problems, by ``kind:id``.
    Raises `ReportUnreadable` when ``text`` holds none (the check did not get to report, or
    what it wrote was cut or replaced)."""
    lines = text.strip().splitlines()
    if not lines:
        raise ReportUnreadable("empty")
    try:
        snapshots = json.loads(lines[-1])["snapshots"]
    except (ValueError, KeyError, TypeError) as error:
        raise ReportUnreadable(f"not a report: {_excerpt(lines[-1])}") from error
    if not isinstance(snapshots, list):
        raise ReportUnreadable(f"not a report: {_excerpt(lines[-1])}")
    verdicts = [ImageVerdict.from_dict(entry) for entry in snapshots]
    return {verdict.image: list(verdict.problems) for verdict in verdicts}


def _excerpt(line: str, length: int = 200) -> str:
    return line if len(line) <= length else line[:length] + "..."
