"""Client of the checkpoint agent's HTTP/JSON API (docs/agent-protocol.md)."""

from collections.abc import Callable
from typing import Any

import aiohttp


class AgentUnavailable(Exception):
    """The agent did not answer (not started yet, gone, or timed out)."""


class AgentRejected(Exception):
    """The agent answered with an error; the message is its reason."""


BaseUrl = str | Callable[[], str | None]
CONNECT_TIMEOUT = 2.0


class AgentClient:
    """``base_url`` may be a function: a pod's address is known only once it runs, and
    until then the agent is simply unavailable. A shared ``session`` (one per operator,
    not per job) is left open by ``close``."""

    def __init__(
        self,
        base_url: BaseUrl,
        token: str,
        *,
        timeout: float = 10.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._base_url = base_url
        self._headers = {"Authorization": f"Bearer {token}"}
        # A partitioned node's agent must not hold a connection slot for long.
        self._timeout = timeout
        self._session = session
        self._owns_session = session is None

    @property
    def url(self) -> str | None:
        """Where the agent is now; None while it has no address."""
        return self._base_url() if callable(self._base_url) else self._base_url

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
            self._session = None

    async def status(self, after: int | None = None, wait: float = 0.0) -> dict[str, Any]:
        """The agent's status. With ``after`` (a version it reported), the agent answers
        when its version differs, or after ``wait`` seconds with the same one."""
        if after is None:
            answer: dict[str, Any] = await self._call("GET", "/v1/status")
        else:
            wait = max(0.0, wait)
            params = {"after": str(after), "wait": str(wait)}
            answer = await self._call("GET", "/v1/status", params=params, waits=wait)
        return answer

    async def trigger(self, checkpoint_id: int, kind: str, after: str) -> None:
        await self._call(
            "POST", "/v1/checkpoints", {"id": checkpoint_id, "kind": kind, "after": after}
        )

    async def finalize(self, checkpoint_id: int, tasks: list[str]) -> tuple[str, int]:
        answer = await self._call(
            "POST", f"/v1/checkpoints/{checkpoint_id}/finalize", {"tasks": tasks}
        )
        return str(answer["path"]), int(answer["sizeBytes"])

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        await self._call("POST", f"/v1/checkpoints/{checkpoint_id}/complete", {"batchId": batch_id})

    async def abort(self, checkpoint_id: int, reason: str) -> None:
        await self._call("POST", f"/v1/checkpoints/{checkpoint_id}/abort", {"reason": reason})

    async def discard_checkpoint(self, checkpoint_id: int, retained: list[int]) -> None:
        await self._call("POST", f"/v1/checkpoints/{checkpoint_id}/discard", {"retained": retained})

    async def discard_savepoint(self, savepoint_id: int) -> None:
        await self._call("POST", f"/v1/savepoints/{savepoint_id}/discard", {})

    async def collect_garbage(
        self, checkpoints: list[int], savepoints: list[int]
    ) -> dict[str, Any]:
        body = {"checkpoints": checkpoints, "savepoints": savepoints}
        answer: dict[str, Any] = await self._call("POST", "/v1/storage/collect-garbage", body)
        return answer

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        waits: float = 0.0,
    ) -> Any:
        """``waits``: how long the agent may hold the answer back, on top of the timeout."""
        base_url = self.url
        if base_url is None:
            raise AgentUnavailable(f"{method} {path}: the driver has no address yet")
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = base_url.rstrip("/") + path
        timeout = aiohttp.ClientTimeout(total=self._timeout + waits, sock_connect=CONNECT_TIMEOUT)
        try:
            async with self._session.request(
                method, url, json=body, params=params, headers=self._headers, timeout=timeout
            ) as response:
                try:
                    answer = await response.json(content_type=None)
                except ValueError:
                    answer = {"error": (await response.text())[:500]}
                if response.status >= 400:
                    raise AgentRejected(
                        f"{method} {path}: {response.status} {answer.get('error', answer)}"
                    )
                return answer
        except (aiohttp.ClientConnectionError, TimeoutError) as error:
            raise AgentUnavailable(f"{method} {path}: {error}") from error
