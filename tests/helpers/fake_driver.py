"""Scripted drivers and agents for supervisor tests (no Spark, real asyncio time)."""

import asyncio
from dataclasses import replace
from typing import Any

from spark_checkpoint.protocol import (
    AckReport,
    AfterCompletion,
    AgentStatus,
    CheckpointKind,
    CollectGarbageAnswer,
    FinalizeAnswer,
    QueryProgress,
    QueryState,
    QueryStatus,
    RestoredFrom,
    SnapshotPhase,
    SnapshotStatus,
)
from spark_checkpoint.storage.layout import JobStorageLayout
from spark_checkpoint_operator.agent_client import AgentUnavailable
from spark_checkpoint_operator.supervisor import StartProblem

TASKS = ("logs", "state-0-0")
# The storage of the supervisors' job, whose paths the agent names.
STORAGE = JobStorageLayout("file:///s", "default", "job")


class FakeAgent:
    """Acknowledges every trigger at once at the current batch. Its status has a version
    and can be long-polled, as the real agent's; ``long_polls = False`` makes it an agent
    without (no ``version``, ``after`` ignored). Tests change its fields directly, so a
    waiting status request looks at them every few milliseconds."""

    def __init__(self) -> None:
        self.reachable = True
        self.long_polls = True
        self.state = QueryState.RUNNING
        self.batch: int | None = 3
        self.progress: QueryProgress | None = None
        self.restored_from: RestoredFrom | None = None
        self.snapshots: dict[int, SnapshotStatus] = {}
        self.completed: list[int] = []
        self.discarded: list[int] = []  # checkpoints
        self.discarded_savepoints: list[int] = []
        self.triggers: list[int] = []
        self.done_at_finalization: set[int] = set()
        self.status_requests = 0
        self._version = 0
        self._reported: AgentStatus | None = None

    def _check(self) -> None:
        if not self.reachable:
            raise AgentUnavailable("connection refused")

    async def read_status(self, after: int | None = None, wait: float = 0.0) -> AgentStatus:
        self.status_requests += 1
        deadline = asyncio.get_running_loop().time() + min(wait, 30.0)
        while True:
            self._check()
            document = self._status()
            unchanged = self.long_polls and after == document.version
            if not unchanged or asyncio.get_running_loop().time() >= deadline:
                return document
            await asyncio.sleep(0.01)

    def _status(self) -> AgentStatus:
        document = AgentStatus(
            version=None,
            attempt=1,
            query=QueryStatus(self.state, last_committed_batch=self.batch, progress=self.progress),
            tasks=TASKS,
            all_tasks_running=self.state.runs_tasks,
            awaiting_final_checkpoint=False,
            restored_from=self.restored_from,
            checkpoints=tuple(self.snapshots.values()),
        )
        if not self.long_polls:
            return document
        # As the real agent: a new committed batch or progress alone changes no version.
        reported = document.versioned_part()
        if reported != self._reported:
            self._reported = reported
            self._version += 1
        return replace(document, version=self._version)

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        self._check()
        self.triggers.append(checkpoint_id)
        acks = tuple(AckReport(task, self.batch, 10, 1) for task in TASKS)
        self.snapshots[checkpoint_id] = SnapshotStatus(
            checkpoint_id,
            kind,
            SnapshotPhase.ACKNOWLEDGED,
            self.batch,
            acks,
        )
        if kind is CheckpointKind.SAVEPOINT and after is AfterCompletion.CONTINUE:
            self.done_at_finalization.add(checkpoint_id)

    async def finalize(
        self, checkpoint_id: int, tasks: list[str], *, waits: float = 0.0
    ) -> FinalizeAnswer:
        self._check()
        kind = self.snapshots[checkpoint_id].kind
        if checkpoint_id in self.done_at_finalization:  # as the agent: no completion follows
            self.snapshots.pop(checkpoint_id, None)
        return FinalizeAnswer(STORAGE.metadata_path(kind, checkpoint_id), 20)

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        self._check()
        self.snapshots.pop(checkpoint_id, None)
        self.completed.append(checkpoint_id)

    async def abort(self, checkpoint_id: int, reason: str) -> None:
        self._check()
        self.snapshots.pop(checkpoint_id, None)

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        self._check()
        self.discarded.append(checkpoint_id)

    async def discard_savepoint(self, savepoint_id: int) -> None:
        self._check()
        self.discarded_savepoints.append(savepoint_id)

    async def collect_garbage(
        self, checkpoints: list[int], savepoints: list[int]
    ) -> CollectGarbageAnswer:
        self._check()
        return CollectGarbageAnswer(checkpoints=(), savepoints=(), shared_files=0)

    async def close(self) -> None:
        return None


class FakeDriver:
    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent
        self.code: int | None = None
        self.executors = True
        self.problem: StartProblem | None = None
        self.restore: list[str] = []  # as the launcher was asked
        self.error: list[str] = []  # what it ended with
        self.rechecks = 0
        self.code_when_rechecked: int | None = None  # an end only a recheck finds

    async def recheck(self) -> None:
        self.rechecks += 1
        self.code = self.code if self.code_when_rechecked is None else self.code_when_rechecked

    def start_problem(self) -> StartProblem | None:
        return self.problem

    def started(self) -> bool:
        return self.problem is None

    def restore_candidates(self) -> list[str]:
        return self.restore

    def executors_ready(self) -> bool:
        return self.executors

    def exit_code(self) -> int | None:
        return self.code

    def error_lines(self) -> list[str]:
        return self.error

    async def terminate(self) -> None:
        if self.code is None:
            self.code = -15


class FakeLauncher:
    def __init__(self, running: FakeDriver | None = None) -> None:
        self.drivers: list[FakeDriver] = []
        self.restores: list[list[str]] = []
        self.running = running
        self.adopt_asked: list[int] = []
        self.agent_class = FakeAgent

    async def adopt(self, attempt: int) -> FakeDriver | None:
        self.adopt_asked.append(attempt)
        return self.running

    async def launch(self, attempt: int, restore: list[str]) -> FakeDriver:
        self.restores.append(restore)
        self.drivers.append(FakeDriver(self.agent_class()))
        self.drivers[-1].restore = restore
        return self.drivers[-1]


class NoJanitor:
    def __init__(self) -> None:
        self.discarded: list[int] = []  # checkpoints
        self.discarded_savepoints: list[int] = []

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        self.discarded.append(checkpoint_id)

    async def discard_savepoint(self, savepoint_id: int) -> None:
        self.discarded_savepoints.append(savepoint_id)

    async def collect_garbage(self, checkpoints: list[int], savepoints: list[int]) -> None:
        return None


async def until(condition: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never met"
        await asyncio.sleep(0.05)
