"""Rollback of an upgrade to the last stable spec (``spec.rollback``; Flink's
``kubernetes.operator.deployment.rollback.enabled``): what is stable, when an upgrade is
rolled back, and what runs while it is. Pure: the controller observes and records.

The last stable spec is the last one whose driver ran its query (phase Running). It and the
rollback's state (an upgrade waiting to run, or the spec rolled back from) are kept in the
job's annotations, not in its status, which only shows them: only who may write the spec
may write an annotation, so a status write alone never chooses what the operator's pods
run.
"""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spark_checkpoint_operator.coordinator import JobPhase
from spark_checkpoint_operator.coordinator.state import format_time, parse_time

# Spec fields a rolled-back job takes from the spec as written, not from the stable spec:
# they say what to do now (suspend, take a snapshot, redeploy an image, roll back at all),
# not what to run; changing them does not end the rollback.
FOLLOWED_FIELDS = (
    "state",
    "checkpointTriggerNonce",
    "savepointTriggerNonce",
    "restore",
    "rollback",
)
# The annotation's bound: all of an object's annotations share 256 KiB (Kopf's own among
# them); a spec longer than this (as JSON) is not kept, and such a job is not rolled back.
MAX_STABLE_SPEC_LENGTH = 64 << 10


@dataclass(frozen=True, slots=True)
class Upgrade:
    """An upgrade from the stable spec: to the deployment ``deployment_hash`` (of
    `objects.deployment_hash`), whose readiness timeout started at ``started`` (None: when
    its first driver starts)."""

    deployment_hash: str
    started: float | None = None


@dataclass(frozen=True, slots=True)
class RolledBack:
    """The spec an upgrade was rolled back from."""

    generation: int
    spec_hash: str  # `rolled_back_hash` of that spec
    time: float
    reason: str


@dataclass(frozen=True, slots=True)
class RollbackState:
    """What the job's ``sparkcheckpoint.io/rollback`` annotation holds: at most one of an
    upgrade waiting to run and a rollback."""

    upgrade: Upgrade | None = None
    rolled_back: RolledBack | None = None

    def to_annotation(self) -> str | None:
        """The annotation's value; None (no annotation) for the empty state."""
        document = self.to_status()
        if not any(document.values()):
            return None
        return json.dumps(document, sort_keys=True, separators=(",", ":"))

    def to_status(self) -> dict[str, Any]:
        """``status.upgrade`` and ``status.rolledBack``: None for what is not so."""
        upgrade, rolled_back = self.upgrade, self.rolled_back
        return {
            "upgrade": None
            if upgrade is None
            else {
                "deploymentHash": upgrade.deployment_hash,
                **({} if upgrade.started is None else {"started": format_time(upgrade.started)}),
            },
            "rolledBack": None
            if rolled_back is None
            else {
                "generation": rolled_back.generation,
                "specHash": rolled_back.spec_hash,
                "time": format_time(rolled_back.time),
                "reason": rolled_back.reason,
            },
        }

    @staticmethod
    def from_annotation(text: object) -> "RollbackState":
        """As ``to_annotation`` writes it; anything else (an annotation edited by hand)
        is the empty state."""
        if not isinstance(text, str):
            return RollbackState()
        try:
            document = json.loads(text)
            return RollbackState(
                _upgrade(document["upgrade"]), _rolled_back(document["rolledBack"])
            )
        except (ValueError, RecursionError, TypeError, KeyError):
            return RollbackState()


def _upgrade(value: Any) -> Upgrade | None:
    if value is None:
        return None
    deployment, started = value["deploymentHash"], value.get("started")
    if not isinstance(deployment, str) or not isinstance(started, str | None):
        raise TypeError(value)
    return Upgrade(deployment, None if started is None else parse_time(started))


def _rolled_back(value: Any) -> RolledBack | None:
    if value is None:
        return None
    generation, spec_hash, time, reason = (
        value["generation"],
        value["specHash"],
        value["time"],
        value["reason"],
    )
    if not (
        isinstance(generation, int)
        and isinstance(spec_hash, str)
        and isinstance(time, str)
        and isinstance(reason, str)
    ):
        raise TypeError(value)
    return RolledBack(generation, spec_hash, parse_time(time), reason)


def stable_part(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What of a spec is rolled back to: all but the followed fields."""
    return {key: value for key, value in spec.items() if key not in FOLLOWED_FIELDS}


def _stable_text(spec: Mapping[str, Any]) -> str:
    """What of ``spec`` is rolled back to, as one canonical JSON text."""
    return json.dumps(stable_part(spec), sort_keys=True, separators=(",", ":"))


def rolled_back_hash(spec: Mapping[str, Any]) -> str:
    """The spec without its followed fields: while it is the same, the rollback goes on."""
    return hashlib.sha256(_stable_text(spec).encode()).hexdigest()[:16]


def spec_to_run(written: Mapping[str, Any], stable: Mapping[str, Any]) -> dict[str, Any]:
    """The spec a rolled-back job runs: the stable spec under the written one's followed
    fields (a suspension, a nonce, a redeploy and ``rollback`` itself are acted on
    meanwhile)."""
    return {
        **stable_part(stable),
        **{key: written[key] for key in FOLLOWED_FIELDS if key in written},
    }


@dataclass(frozen=True, slots=True)
class StableSpec:
    """The last stable spec: what of it is rolled back to (`stable_part`), and its
    annotation's value (made once: it is compared at every status write)."""

    spec: dict[str, Any]
    text: str

    @staticmethod
    def of(spec: Mapping[str, Any]) -> "StableSpec | None":
        """``spec`` kept as stable; None above the annotation's bound."""
        text = _stable_text(spec)
        return StableSpec(stable_part(spec), text) if len(text) <= MAX_STABLE_SPEC_LENGTH else None

    @staticmethod
    def from_annotation(text: object) -> "StableSpec | None":
        """The annotation's stable spec; anything `of` does not write is none."""
        try:
            spec = json.loads(text) if isinstance(text, str) else None
        except (ValueError, RecursionError):
            return None
        return StableSpec.of(spec) if isinstance(spec, dict) else None


def rollback_reason(
    *, phase: JobPhase, message: str, started: float, timeout: float, now: float
) -> str | None:
    """Why an upgrade whose new driver has not run its query since ``started`` is rolled
    back now; None while it may still, or once it ended otherwise (finished, cancelled):
    its driver failed for good (the restart policy gave up, or its agent never answered),
    or ``timeout`` passed (an image that cannot be pulled, a driver that keeps failing, a
    restore that takes too long)."""
    if phase is JobPhase.FAILED:
        # The message says how its driver failed ("driver failed (...)" included).
        return f"the job failed: {message}" if message else "the job failed"
    if phase in (JobPhase.RUNNING, JobPhase.FINISHED, JobPhase.CANCELLED):
        return None
    if now - started < timeout:
        return None
    return (
        f"its driver did not run its query within spec.rollback.readinessTimeout "
        f"({timeout:g}s)" + (f": {message}" if message else "")
    )
