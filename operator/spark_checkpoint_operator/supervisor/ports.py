"""What the supervisor needs from its runtime: a driver, storage work without one, a
restorable check, and a sink for what it observes. A local process or a Kubernetes pod
supplies them (``local_runtime``, ``kubernetes.runtime``)."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from spark_checkpoint_operator.agent_client import AgentClient
from spark_checkpoint_operator.coordinator import CheckpointKind, CompletedCheckpoint


@dataclass(frozen=True, slots=True)
class StartProblem:
    """Why a driver has not started, as its runtime reports it (a Kubernetes pod's
    container waiting on its image or a Secret, or no node for the pod). It is told and
    waited out: the runtime retries (a registry's outage passes), someone creates what is
    missing, or a new spec replaces the driver."""

    reason: str  # the runtime's own word: ImagePullBackOff, CreateContainerConfigError, ...
    message: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}" if self.message else self.reason


class DriverHandle(Protocol):
    @property
    def agent(self) -> AgentClient: ...

    def start_problem(self) -> StartProblem | None:
        """What keeps the driver from starting now; None when nothing does that the
        runtime can tell."""

    def started(self) -> bool:
        """Its process runs or ran (a pod's container, not a pod waiting for a node or an
        image): the start timeout counts from the first time this is true."""

    def restore_candidates(self) -> list[str]:
        """The images it was started to restore from, newest first, as its environment
        lists them: an adopted driver's too."""

    def exit_code(self) -> int | None:
        """None while the driver runs; `DRIVER_GONE` for one gone without an exit code."""

    async def recheck(self) -> None:
        """Ask where the driver runs whether it still does, where the runtime's own view can
        miss its end (a pod deleted while the pod watch was down); called while its agent
        does not answer, so that `exit_code` tells the end at once, not after the heartbeat
        timeout."""

    def error_lines(self) -> list[str]:
        """Once it exited: the error it ended with, the error itself first (`driver_error`);
        none when it wrote nothing or was killed by a signal."""

    async def terminate(self) -> None:
        """Stop the driver and return once it is gone (never two drivers at once)."""

    def executors_ready(self) -> bool:
        """False while Spark replaces a lost executor: a checkpoint would miss its tasks."""


class DriverLauncher(Protocol):
    async def launch(self, attempt: int, restore: list[str]) -> DriverHandle: ...

    async def adopt(self, attempt: int) -> DriverHandle | None:
        """The driver of ``attempt`` if it still runs from before this runtime restarted
        (an operator upgrade must not restart every job), or if it ended since (its exit
        code is judged as any driver's); None to start a new one."""


class LaunchFailed(Exception):
    """The runtime refused to start a driver (admission, an invalid pod): retrying
    the same spec cannot help; the message says why."""


class LaunchBlocked(Exception):
    """The runtime could not start a driver for now, for a reason that passes without a
    change of the spec (a namespace's quota used up, a service account not created yet):
    tried again after a backoff, as Kubernetes' own controllers retry a refused pod, and
    never counted as a driver failure; the message says why."""


class NoRestorableImage(Exception):
    """Every image the job could restore from failed its restore; the message lists why."""


# The longest a janitor's work (a cleanup or check pod, a local janitor process) may take:
# storage that does not answer held a run's end for ever.
JANITOR_TIMEOUT_SECONDS = 600.0
# How long a janitor's work may take before it is said to be under way: the run's end
# waited minutes on storage that did not answer without a word (an Azure user's).
SLOW_CLEANUP_SECONDS = 30.0


class CleanupFailed(Exception):
    """A janitor could not change storage; the message says what and why."""


class CheckUnavailable(Exception):
    """The restorable check could not run (no verdict); the message says why."""


class RestorableCheck(Protocol):
    """Lets Spark read an image as a restart would (``python -m spark_checkpoint.restorable``)
    where storage is reachable: a subprocess locally, a cleanup pod on Kubernetes."""

    async def problems(self, image: str) -> list[str]:
        """What keeps a restarted query from reading ``image`` (``kind:id``); empty when it
        is restorable. Raises `CheckUnavailable` when there is no verdict."""


class Janitor(Protocol):
    """Storage work while no driver runs (a cleanup pod in Kubernetes). Failures raise
    `CleanupFailed`; what is left behind is garbage-collected on a later run."""

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None: ...

    async def discard_savepoint(self, savepoint_id: int) -> None: ...

    async def collect_garbage(self, checkpoints: list[int], savepoints: list[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class PeriodicSlot:
    """A periodic trigger time that a Tick consumed (epoch seconds)."""

    due: float  # when the coordinator had scheduled it
    decided: float  # when the Tick that consumed it was handled: ``decided - due`` is late
    next_due: float | None  # the slot scheduled after it
    checkpoint_id: int | None  # the checkpoint it triggered; None: declined (minPause)


class Observer:
    """What the supervisor reports as it happens, for metrics (``metrics.JobMetrics``) or
    a measurement (the operator-scale benchmark's probe). Every method does nothing here:
    an observer overrides those it wants."""

    def registered(self, images: Iterable[CompletedCheckpoint]) -> None:
        """The registry the supervisor starts with (read back from storage or status)."""

    def completed(self, checkpoint: CompletedCheckpoint) -> None:
        pass

    def failed(self, kind: CheckpointKind, reason: str) -> None:
        pass

    def restored(self) -> None:
        pass

    def periodic(self, slot: PeriodicSlot) -> None:
        """A periodic slot was consumed: after its trigger (if any) was carried out."""

    def trigger_sent(
        self, checkpoint_id: int, agent: AgentClient, sent: float, answered: float
    ) -> None:
        """The trigger of ``checkpoint_id`` went to ``agent`` at ``sent`` and was answered
        (or failed) at ``answered`` (epoch seconds)."""


class Observers(Observer):
    """Several observers of one job, each told everything."""

    def __init__(self, *observers: Observer) -> None:
        self._observers = observers

    def registered(self, images: Iterable[CompletedCheckpoint]) -> None:
        listed = tuple(images)
        for observer in self._observers:
            observer.registered(listed)

    def completed(self, checkpoint: CompletedCheckpoint) -> None:
        for observer in self._observers:
            observer.completed(checkpoint)

    def failed(self, kind: CheckpointKind, reason: str) -> None:
        for observer in self._observers:
            observer.failed(kind, reason)

    def restored(self) -> None:
        for observer in self._observers:
            observer.restored()

    def periodic(self, slot: PeriodicSlot) -> None:
        for observer in self._observers:
            observer.periodic(slot)

    def trigger_sent(
        self, checkpoint_id: int, agent: AgentClient, sent: float, answered: float
    ) -> None:
        for observer in self._observers:
            observer.trigger_sent(checkpoint_id, agent, sent, answered)
