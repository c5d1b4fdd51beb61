"""Rollback of an upgrade to the last stable spec (``spec.rollback``; Flink's
``kubernetes.operator.deployment.rollback.enabled``): what is stable, when an upgrade is
rolled back, and what runs while it is. Pure: the controller observes and records.

The last stable spec is the last one whose driver ran its query (phase Running). It is kept
in an annotation of the job, not in its status: only who may write the spec may write it,
so a status write alone never chooses what the operator's pods run.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.coordinator.state import format_time, parse_time

# Spec fields a rolled-back job takes from the spec as written, not from the stable spec:
# they say what to do now (suspend, take a snapshot, roll back at all), not what to run.
FOLLOWED_FIELDS = ("state", "checkpointTriggerNonce", "savepointTriggerNonce", "rollback")
# The annotation's bound: all of an object's annotations share 256 KiB (Kopf's own among
# them); a spec longer than this (as JSON) is not kept, and such a job is not rolled back.
MAX_STABLE_SPEC_LENGTH = 64 << 10


@dataclass(frozen=True, slots=True)
class RolledBack:
    """``status.rolledBack``: the spec an upgrade was rolled back from."""

    generation: int
    spec_hash: str  # of the spec as written, without what it is followed for
    time: float
    reason: str

    def to_status(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "specHash": self.spec_hash,
            "time": format_time(self.time),
            "reason": self.reason,
        }

    @staticmethod
    def from_status(value: object) -> "RolledBack | None":
        """As written by ``to_status``; anything else (a status is writable by others than
        the operator) is no rollback."""
        if not isinstance(value, Mapping):
            return None
        generation, spec_hash = value.get("generation"), value.get("specHash")
        time, reason = value.get("time"), value.get("reason")
        if not (
            isinstance(generation, int)
            and isinstance(spec_hash, str)
            and isinstance(time, str)
            and isinstance(reason, str)
        ):
            return None
        try:
            return RolledBack(generation, spec_hash, parse_time(time), reason)
        except ValueError:
            return None


def stable_part(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What of a spec is rolled back to: all but the followed fields."""
    return {key: value for key, value in spec.items() if key not in FOLLOWED_FIELDS}


def spec_to_run(written: Mapping[str, Any], stable: Mapping[str, Any]) -> dict[str, Any]:
    """The spec a rolled-back job runs: the stable spec under the written one's followed
    fields (a suspension, a nonce and ``rollback`` itself are acted on meanwhile)."""
    return {
        **stable_part(stable),
        **{key: written[key] for key in FOLLOWED_FIELDS if key in written},
    }


def stable_spec_text(spec: Mapping[str, Any]) -> str | None:
    """The annotation's value for ``spec``; None above its bound."""
    text = json.dumps(stable_part(spec), sort_keys=True, separators=(",", ":"))
    return text if len(text) <= MAX_STABLE_SPEC_LENGTH else None


def stable_spec(text: object) -> dict[str, Any] | None:
    """The annotation's spec; anything ``stable_spec_text`` does not write is none."""
    try:
        spec = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return None
    return stable_part(spec) if isinstance(spec, dict) else None


def rollback_reason(
    *, phase: JobPhase, message: str, started: float, timeout: float, now: float
) -> str | None:
    """Why an upgrade whose new driver has not run its query since ``started`` is rolled
    back now; None while it may still: its driver failed for good (the restart policy gave
    up, or its agent never answered), or ``timeout`` passed (an image that cannot be pulled,
    a driver that keeps failing, a restore that takes too long)."""
    if phase is JobPhase.FAILED:
        return f"its driver failed: {message}" if message else "its driver failed"
    if phase is JobPhase.RUNNING or now - started < timeout:
        return None
    return (
        f"its driver did not run its query within spec.rollback.readinessTimeout "
        f"({timeout:g}s)" + (f": {message}" if message else "")
    )
