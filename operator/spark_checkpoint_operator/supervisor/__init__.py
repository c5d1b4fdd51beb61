"""Runs one job: drivers one after another, and the coordinator between them and storage.

The supervisor is the adapter around the coordinator core; the runtime (a local process,
Kubernetes pods) supplies its ports. Its parts, by responsibility:

- ``ports``: what the runtime supplies (drivers, a janitor, a restorable check, an observer);
- ``driver_errors``: the error a driver ended with, read from its output's end;
- ``record``: the persisted `JobRecord`;
- ``notices``: what the user is told;
- ``status_events``: the agent's status read as coordinator events;
- ``interpreter``: the coordinator's effects carried out from one queue, and the job's
  phase as the coordinator is told it;
- ``attempt``: the state of one attempt (one driver) and its named transitions;
- ``polling``: asking the agent for status, at once or as a long poll;
- ``job``: the attempt loop, with restores and the restart policy.

Adapters import from this package; its modules import each other directly.
"""

from spark_checkpoint_operator.supervisor.driver_errors import KILLING_SIGNALS, driver_error
from spark_checkpoint_operator.supervisor.job import (
    BLOCKED_MIN_DELAY,
    FINISHING_NEEDS_NO_SAVEPOINT,
    FINISHING_TAKES_NO_SAVEPOINT,
    NO_QUERY_RUNNING,
    JobSupervisor,
    restart_delay,
)
from spark_checkpoint_operator.supervisor.notices import DRIVER_GONE, Level, Notice
from spark_checkpoint_operator.supervisor.polling import POLL_INTERVAL
from spark_checkpoint_operator.supervisor.ports import (
    JANITOR_TIMEOUT_SECONDS,
    CheckUnavailable,
    CleanupFailed,
    DriverHandle,
    DriverLauncher,
    Janitor,
    LaunchBlocked,
    LaunchFailed,
    Observer,
    Observers,
    PeriodicSlot,
    RestorableCheck,
    StartProblem,
)
from spark_checkpoint_operator.supervisor.record import JobRecord

__all__ = [
    "BLOCKED_MIN_DELAY",
    "DRIVER_GONE",
    "FINISHING_NEEDS_NO_SAVEPOINT",
    "FINISHING_TAKES_NO_SAVEPOINT",
    "JANITOR_TIMEOUT_SECONDS",
    "KILLING_SIGNALS",
    "NO_QUERY_RUNNING",
    "POLL_INTERVAL",
    "CheckUnavailable",
    "CleanupFailed",
    "DriverHandle",
    "DriverLauncher",
    "Janitor",
    "JobRecord",
    "JobSupervisor",
    "LaunchBlocked",
    "LaunchFailed",
    "Level",
    "Notice",
    "Observer",
    "Observers",
    "PeriodicSlot",
    "RestorableCheck",
    "StartProblem",
    "driver_error",
    "restart_delay",
]
