"""Asking a driver's agent for its status (docs/agent-protocol.md, "Status").

At once, or as a long poll: the agent answers once its status changes, at the latest at
the coordinator's next deadline. While a long poll waits, the supervisor's inbox (a user's
request, new settings) and the driver itself (its exit, its executors) cut it short.
"""

import asyncio
import time
from collections.abc import Callable
from typing import Any

from spark_checkpoint.protocol import AgentStatus
from spark_checkpoint_operator.agent_client import AgentRejected, AgentUnavailable
from spark_checkpoint_operator.coordinator import (
    SavepointDisposeRequested,
    SavepointPinChanged,
    TriggerRequested,
    TriggerWithdrawn,
)
from spark_checkpoint_operator.supervisor.ports import DriverHandle

POLL_INTERVAL = 0.5
# The longest a status request waits for the agent's status to change (a long poll).
# The next one goes out as soon as the previous answer was acted on: the agent itself
# gathers a snapshot's acknowledgements (ACKNOWLEDGEMENT_GATHER_SECONDS).
LONG_POLL_SECONDS = 30.0

# A status document, or why the agent gave none.
Answer = AgentStatus | AgentUnavailable | AgentRejected
# A user's request or its withdrawal, or None: new settings (their deadlines and effects
# apply now).
Message = (
    TriggerRequested | TriggerWithdrawn | SavepointDisposeRequested | SavepointPinChanged | None
)


class StatusPolls:
    def __init__(self, idle_interval: float) -> None:
        # How often a running job without pending checkpoints asks an agent that cannot
        # long-poll for status, and checks the driver while a long poll waits; triggers
        # are timed by the coordinator's deadlines, not by polling.
        self._idle_interval = idle_interval
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()

    async def status(
        self, driver: DriverHandle, after: int | None = None, wait: float = 0.0
    ) -> Answer:
        try:
            return await driver.agent.read_status(after=after, wait=wait)
        except (AgentUnavailable, AgentRejected) as error:
            return error

    async def message_before(self, stop: asyncio.Event, timeout: float) -> list[Message]:
        """What comes to the inbox within ``timeout`` ([] when it does not, or once ``stop``
        is set): while no driver runs, nothing else is waited for."""
        message = asyncio.ensure_future(self.inbox.get())
        stopped = asyncio.ensure_future(stop.wait())
        waiting: set[asyncio.Future[Any]] = {message, stopped}
        try:
            await asyncio.wait(
                waiting, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        return [] if message.cancelled() else [message.result()]

    async def wait(
        self,
        driver: DriverHandle,
        version: int | None,
        *,
        idle: bool,
        deadline: float | None,
        changed: Callable[[], bool],
    ) -> tuple[Answer | None, list[Message]]:
        """Until the next status is due: the answer of a long poll (None: ask now) and
        what came to the inbox meanwhile (it ends the wait). With the ``version`` of the
        last status, the agent is asked to answer once its status changes, at the latest
        at ``deadline`` (on ``time.monotonic``, as the coordinator's); without one (no
        answer, or an agent that cannot long-poll), this sleeps an interval, shorter unless
        ``idle``. ``changed``: whether the driver
        changed (looked at every interval while a long poll waits)."""
        interval = self._idle_interval if idle else POLL_INTERVAL
        limit = interval if version is None else LONG_POLL_SECONDS
        delay = limit if deadline is None else min(limit, deadline - time.monotonic())
        message = asyncio.ensure_future(self.inbox.get())
        waiting: set[asyncio.Future[Any]] = {message}
        poll = None
        if version is not None:
            # Never past the deadline: a due periodic trigger is not held back.
            poll = asyncio.ensure_future(self.status(driver, version, max(0.0, delay)))
            waiting.add(poll)
        try:
            while True:
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=interval if poll else max(0.0, delay),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                # The driver's exit and its executors are not in the agent's status.
                if done or poll is None or changed():
                    break
        finally:
            for task in waiting:
                task.cancel()  # a cancelled long poll closes its connection
            await asyncio.gather(*waiting, return_exceptions=True)
        messages = [] if message.cancelled() else [message.result()]
        return (None if poll is None or poll.cancelled() else poll.result()), messages
