"""Runs one job: drivers one after another, and the coordinator between them and storage.

The supervisor is the adapter around the coordinator core; the runtime (a local process,
Kubernetes pods) supplies its ports. Its parts, by responsibility:

- ``ports``: what the runtime supplies (drivers, a janitor, a restorable check, an observer);
- ``record``: the persisted `JobRecord`;
- ``notices``: what the user is told;
- ``job``: the attempt loop and its restart policy.

Adapters import from this package; its modules import each other directly.
"""

from spark_checkpoint_operator.supervisor.job import POLL_INTERVAL, JobSupervisor
from spark_checkpoint_operator.supervisor.notices import Level, Notice
from spark_checkpoint_operator.supervisor.ports import (
    CheckUnavailable,
    CleanupFailed,
    DriverHandle,
    DriverLauncher,
    Janitor,
    LaunchFailed,
    Observer,
    RestorableCheck,
)
from spark_checkpoint_operator.supervisor.record import JobRecord

__all__ = [
    "POLL_INTERVAL",
    "CheckUnavailable",
    "CleanupFailed",
    "DriverHandle",
    "DriverLauncher",
    "Janitor",
    "JobRecord",
    "JobSupervisor",
    "LaunchFailed",
    "Level",
    "Notice",
    "Observer",
    "RestorableCheck",
]
