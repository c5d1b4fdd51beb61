"""The one call that turns a streaming query into a coordinated one.

Replace ``writer.start()`` with ``run_coordinated(writer, participants=[sink])``: it
serves the checkpoint agent, restores the newest registered image into a fresh checkpoint
location, starts the query there and ends the process with a `DriverExit` code.
"""

import inspect
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from spark_checkpoint.agent.agent import CheckpointAgent, QueryView
from spark_checkpoint.agent.server import AgentServer
from spark_checkpoint.agent.snapshot import committed_batches
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import QueryProgress, QueryState, RestoredFrom
from spark_checkpoint.restore import (
    RestoreFailed,
    StorageUnavailable,
    checkpoint_failure,
    restore,
)
from spark_checkpoint.settings import (
    DriverSettings,
    SettingsError,
    attempt_directory,
    remove_attempt_directories,
    report_error,
)
from spark_checkpoint.sink import CheckpointParticipant, StartRefused
from spark_checkpoint.storage import (
    CheckpointStorage,
    JobStorageLayout,
    StorageError,
    StorageOwnedElsewhere,
    SymbolicLinkError,
    storage_failure,
)
from spark_checkpoint.storage.errors import is_missing_bucket, printable_line
from spark_checkpoint.storage.layout import hide_password

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger("spark_checkpoint")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The writer option run_coordinated sets, to a fresh location per attempt.
CHECKPOINT_LOCATION = "checkpointLocation"


# Set once `run_coordinated` is called: the launcher refuses a query started, or a
# pipeline ended, without it.
_called = threading.Event()


def run_coordinated_called() -> bool:
    return _called.is_set()


def fail_with(message: str, exit_code: DriverExit) -> DriverExit:
    """Log the error the driver ends with and report it to the runtime."""
    log.error("%s", message)
    report_error(message)
    return exit_code


def configure_logging() -> None:
    """The driver's log: every library's INFO and above, in one format; but only the Azure
    SDK's warnings, since its INFO dumps each HTTP request's headers (95% of an Azure
    driver's log, 10 KB/s for a tiny job: an Azure user's)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("azure").setLevel(logging.WARNING)


def run_coordinated(
    writer: "DataStreamWriter", *, participants: Sequence[CheckpointParticipant] = ()
) -> NoReturn:
    _called.set()
    configure_logging()
    try:
        settings = DriverSettings.from_environment()
    except SettingsError as error:
        sys.exit(fail_with(str(error), DriverExit.MISCONFIGURED))
    if problem := _participant_problem(participants):
        sys.exit(fail_with(problem, DriverExit.MISCONFIGURED))
    sys.exit(_run(writer, participants, settings))


def _participant_problem(participants: Sequence[CheckpointParticipant]) -> str | None:
    """What keeps a participant from being called as `CheckpointParticipant` says, in one
    line (a participant written for an earlier ``on_restore(restored_batch)`` would fail
    the start with a traceback)."""
    for participant in participants:
        for method, arguments, keywords in (
            ("write_batch", (None, 0), {}),
            ("on_checkpoint_complete", (0,), {}),
            ("on_restore", (None, "namespace/job"), {"checkpoint_location": Path()}),
        ):
            try:
                inspect.signature(getattr(participant, method)).bind(*arguments, **keywords)
            except (AttributeError, TypeError, ValueError) as error:
                expected = list(
                    inspect.signature(getattr(CheckpointParticipant, method)).parameters
                )
                return (
                    f"participant {participant!r} is not a CheckpointParticipant: {method} "
                    f"must take ({', '.join(expected[1:])}) ({error})"
                )
    return None


def _run(
    writer: "DataStreamWriter",
    participants: Sequence[CheckpointParticipant],
    settings: DriverSettings,
) -> DriverExit:
    try:
        storage = CheckpointStorage(
            JobStorageLayout(settings.storage_root, settings.namespace, settings.job)
        )
    except ValueError as error:
        # A root a newer rule refuses, of a job that ran under the older one.
        return fail_with(
            f"the job's storage {hide_password(settings.storage_root)!r}: {error}",
            DriverExit.MISCONFIGURED,
        )
    try:
        storage.claim(settings.owner)
        highest_stored_id = storage.highest_snapshot_id()
    except StorageOwnedElsewhere as error:
        return fail_with(str(error), DriverExit.MISCONFIGURED)
    except (StorageError, OSError) as error:
        failure = storage_failure(error, storage.layout.job_root)
        # No restart creates a bucket.
        exit_code = DriverExit.MISCONFIGURED if is_missing_bucket(error) else DriverExit.FAILED
        return fail_with(f"cannot claim the job's storage: {failure}", exit_code)
    attempt_dir = attempt_directory(settings.work_dir, settings.attempt)
    location = attempt_dir / "checkpoint"
    if location.exists():
        return fail_with(
            f"{location} exists: a checkpoint location is never reused across attempts",
            DriverExit.MISCONFIGURED,
        )
    # What earlier drivers left on a work volume that outlives pods (a shared claim, a
    # local run's directory) is dead: a new driver starts only after the previous one is gone.
    remove_attempt_directories(settings.work_dir, lambda number: number < settings.attempt)
    agent = CheckpointAgent(
        storage=storage,
        location=location,
        pin_root=attempt_dir / "pins",
        participants=participants,
        attempt=settings.attempt,
        highest_stored_id=highest_stored_id,
    )
    # Serving before the restore: however long that takes, the agent answers.
    server = AgentServer(
        agent,
        settings.token,
        settings.agent_host,
        settings.agent_port,
        socket_fd=settings.agent_socket_fd,
    )
    server.start()
    try:
        return _start(
            writer,
            participants=participants,
            settings=settings,
            storage=storage,
            location=location,
            agent=agent,
        )
    finally:
        server.stop()
        agent.close()


def _start(
    writer: "DataStreamWriter",
    *,
    participants: Sequence[CheckpointParticipant],
    settings: DriverSettings,
    storage: CheckpointStorage,
    location: Path,
    agent: CheckpointAgent,
) -> DriverExit:
    """Restore, start the query, and run it to its end."""
    try:
        outcome = restore(storage, settings.restore_candidates, location)
    except RestoreFailed as error:
        return fail_with(str(error), DriverExit.RESTORE_FAILED)
    except StorageUnavailable as error:
        return fail_with(str(error), DriverExit.FAILED)
    if outcome is not None:
        agent.restored(outcome)
    for participant in participants:
        try:
            participant.on_restore(
                outcome.batch_id if outcome else None,
                f"{settings.namespace}/{settings.job}",
                checkpoint_location=location,
            )
        except (StartRefused, SymbolicLinkError) as error:
            # A link in the output is not followed, and another attempt would meet it again.
            return fail_with(str(error), DriverExit.MISCONFIGURED)
        except Exception as error:  # its storage: no credentials, no answer, no access
            # Another attempt may reach it (the runtime restarts the driver): the reason in
            # one line, the traceback only at debug level.
            log.debug("participant %r could not start", participant, exc_info=True)
            failure = f"{type(error).__name__}: {error}"
            return fail_with(
                f"participant {participant!r} could not start: {printable_line(failure)}",
                DriverExit.FAILED,
            )

    try:
        # Spark reads the restored metadata file here, the logs and state once it runs.
        query = writer.option(CHECKPOINT_LOCATION, str(location)).start()
    except Exception as error:
        if _restored_image_unusable(outcome, str(error), location):
            return DriverExit.RESTORE_UNUSABLE
        # The pipeline's own error (a missing path, a bad column): its traceback follows in
        # the log, where a long one would push it out of a termination message.
        report_error(f"the query could not start: {error}")
        raise
    restore_check = _RestoreCheck(query, location, outcome)
    progress = _Progress(query)
    drain = _InputDrain(query)
    agent.query_started(
        lambda: _view(query, restore_check, progress), outcome, drain.processed_all_since
    )
    return _await_end(query, agent, location, outcome)


def _await_end(
    query: "StreamingQuery",
    agent: CheckpointAgent,
    location: Path,
    outcome: RestoredFrom | None,
) -> DriverExit:
    def stop_requested() -> bool:  # asked anew each time: the agent's HTTP thread sets it
        return agent.stop_requested

    while query.isActive:
        if stop_requested():
            query.stop()
            break
        try:
            query.awaitTermination(1)
        except Exception:  # the query failed: query.exception() below has the error
            break
    if stop_requested():
        log.info("stopped after a savepoint")
        return DriverExit.STOPPED_WITH_SAVEPOINT
    error = query.exception()
    committed = committed_batches(location)
    if error is not None:
        restarted = outcome is not None and (not committed or committed[-1] <= outcome.batch_id)
        if restarted and _restored_image_unusable(outcome, str(error), location):
            return DriverExit.RESTORE_UNUSABLE
        return fail_with(f"query failed: {error}", DriverExit.FAILED)
    if committed:
        # Final checkpoint (FLIP-147): output is committed only by a checkpoint that
        # covers the last batch, so the driver stays until one completes.
        log.info("input exhausted at batch %s: waiting for the final checkpoint", committed[-1])
        agent.wait_for_notification(committed[-1], should_give_up=stop_requested)
    if stop_requested():  # a stop-with-savepoint covered the input's end (stop --drain)
        log.info("stopped after a savepoint")
        return DriverExit.STOPPED_WITH_SAVEPOINT
    log.info("finished")
    return DriverExit.FINISHED


def _restored_image_unusable(outcome: RestoredFrom | None, error: str, location: Path) -> bool:
    """A failure of the restored query, before it committed a batch, that points at the
    checkpoint: the image is at fault, and retrying it fails the same way."""
    if outcome is None or (reason := checkpoint_failure(error, location)) is None:
        return False
    log.error(
        "the image restored from %s (batch %s) cannot be used: %s; the runtime falls back "
        "to an older image. The query's error: %s",
        outcome.candidate,
        outcome.batch_id,
        reason,
        error,
    )
    report_error(reason)  # what the runtime records as the image's fault
    return True


class _RestoreCheck:
    """Whether a restored query got past its image: it committed a batch after the image's,
    or it completed a trigger without one (no new data: its state is read when data comes).
    Until then the agent reports the query as restoring, not running, so no checkpoint is
    taken of an image that may turn out unusable."""

    def __init__(
        self, query: "StreamingQuery", location: Path, outcome: RestoredFrom | None
    ) -> None:
        self._query = query
        self._location = location
        self._batch = outcome.batch_id if outcome else None
        self._passed = outcome is None

    def passed(self) -> bool:
        if not self._passed:
            committed = committed_batches(self._location)
            assert self._batch is not None
            self._passed = (bool(committed) and committed[-1] > self._batch) or (
                self._query.lastProgress is not None
            )
        return self._passed


class _Progress:
    """The query's progress as the agent reports it: Spark's ``lastProgress``, and the
    input rows of every batch this driver ran, each progress of ``recentProgress`` counted
    once (by its trigger's timestamp). Called with the agent's status lock held."""

    def __init__(self, query: "StreamingQuery") -> None:
        self._query = query
        self._counted_until = ""  # the timestamp of the newest progress counted
        self._total_rows = 0

    def latest(self) -> QueryProgress | None:
        last = self._query.lastProgress
        if last is None:
            return None
        if last["timestamp"] > self._counted_until:
            # Spark keeps the last spark.sql.streaming.numRecentProgressUpdates (100):
            # far more than come between two status requests.
            for progress in self._query.recentProgress:
                if progress["timestamp"] > self._counted_until:
                    self._total_rows += _rows(progress)
                    self._counted_until = progress["timestamp"]
        rate = last.get("inputRowsPerSecond")
        return QueryProgress(
            batch_id=int(last["batchId"]),
            num_input_rows=_rows(last),
            # Spark leaves the rate out (NaN in Scala) when it cannot compute one.
            input_rows_per_second=float(rate) if rate is not None and math.isfinite(rate) else None,
            total_input_rows=self._total_rows,
        )


def _rows(progress: Mapping[str, Any]) -> int:
    return int(progress.get("numInputRows") or 0)


def _view(query: "StreamingQuery", restore_check: _RestoreCheck, progress: _Progress) -> QueryView:
    latest = progress.latest()
    if query.isActive and not restore_check.passed():
        return QueryView(QueryState.RESTORING, progress=latest)
    if query.isActive:
        return QueryView(QueryState.RUNNING, progress=latest)
    error = query.exception()
    if error is not None:
        return QueryView(QueryState.FAILED, str(error), latest)
    return QueryView(QueryState.FINISHED, progress=latest)


class _InputDrain:
    """Whether the query has processed all input there was at a moment (stop --drain): a
    trigger begun after it found no new data. Spark's ``processAllAvailable`` returns once
    one does (Spark lists the sources and marks "no new data" under the lock that call
    resets the mark under, so the trigger that ends a call begun after the moment listed
    its sources after it too). A query that runs a batch at every trigger (a processing-time
    timeout), or whose input never stops coming (a busy Kafka topic), never marks "no new
    data"; its progress says it: a batch begun after the moment that read up to each
    source's latest offset (`_read_all_there_was_since`). (Spark's status told whether
    the last trigger, begun before, found data: files that came after it were left out.)
    A source that holds input back until there is enough (Kafka's minOffsetsPerTrigger)
    reports no new data meanwhile."""

    def __init__(self, query: "StreamingQuery") -> None:
        self._query = query
        self._lock = threading.Lock()
        self._returned_from: float | None = None  # when the last call that returned began
        self._thread: threading.Thread | None = None

    def processed_all_since(self, moment: float) -> bool:
        """``moment``: a ``time.time()``; the first call for it starts finding out."""
        with self._lock:
            if self._returned_from is not None and self._returned_from >= moment:
                return True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._process_all_available,
                    args=(moment,),
                    name="input-drain",
                    daemon=True,
                )
                self._thread.start()
        return _read_all_there_was_since(self._query.lastProgress, moment)

    def _process_all_available(self, moment: float) -> None:
        """Until a call begun after ``moment`` returned: not for the rest of the query's
        life (each call on an idle query returns at its next trigger, every 10 ms)."""
        try:
            while self._query.isActive:
                began = time.time()
                self._query.processAllAvailable()
                with self._lock:
                    self._returned_from = began
                if began >= moment:
                    return
        except Exception:  # the query failed or Spark is gone: its view reports why
            return


def _read_all_there_was_since(progress: Mapping[str, Any] | None, moment: float) -> bool:
    """Whether ``progress`` is of a batch begun after ``moment`` (a ``time.time()``) that
    read all input its sources had: each source's end offset is the latest it reported
    (Spark asks for both as it plans the batch, after the trigger's timestamp), or, for a
    source that reports no latest (a file source), its offsets did not move. Not its rows:
    an empty file or a filtered scan reads none from new offsets. A read limit
    (maxOffsetsPerTrigger) leaves the end below the latest: not drained until it catches up."""
    if progress is None:
        return False
    try:
        began = datetime.fromisoformat(progress["timestamp"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return False
    if began < moment:
        return False
    sources = [
        [_offset(source.get(field)) for field in ("startOffset", "endOffset", "latestOffset")]
        for source in progress.get("sources") or []
    ]
    return bool(sources) and all(
        end is not None and (end == latest if latest is not None else start == end)
        for start, end, latest in sources
    )


def _offset(text: Any) -> Any:
    """A source's offset as Spark's progress gives it: JSON text ("null" where the source
    reports none, as a file source's latest)."""
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text
