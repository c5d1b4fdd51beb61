"""How a coordinated driver ends; the runtime turns these into job phases."""

from enum import IntEnum


class DriverExit(IntEnum):
    FINISHED = 0  # bounded input done and its final checkpoint completed
    FAILED = 1  # the query failed; the runtime may restart it with restore
    MISCONFIGURED = 2  # settings or pipeline are wrong; restarting cannot help
    STOPPED_WITH_SAVEPOINT = 3  # stop-with-savepoint (suspend, upgrade, shutdown) done
    RESTORE_FAILED = 4  # no registered image could be restored
    # The restored image failed the query before it committed a batch, with an error that
    # points at the checkpoint: the runtime marks that image unrestorable and falls back.
    RESTORE_UNUSABLE = 5


# How a driver's error (exit FAILED) begins when storage did not answer as it restored: an
# error that passes, which the runtime retries however often it comes.
STORAGE_UNAVAILABLE = "storage did not answer as the image was restored"
