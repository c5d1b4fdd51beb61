"""Client of the checkpoint agent's HTTP/JSON API (docs/agent-protocol.md). Requests and
answers are the documents of `spark_checkpoint.protocol`, checked on the way in."""

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import aiohttp

from spark_checkpoint.protocol import (
    IDLE_CONNECTION_SECONDS,
    MAX_ANSWER_VALUES,
    MAX_BODY_BYTES,
    MAX_COMMAND_ANSWER_BYTES,
    AbortBody,
    Acknowledgement,
    AfterCompletion,
    AgentStatus,
    CheckpointKind,
    CollectGarbageAnswer,
    CollectGarbageBody,
    CompleteBody,
    DiscardCheckpointBody,
    ErrorAnswer,
    FinalizeAnswer,
    FinalizeBody,
    ProtocolError,
    TriggerBody,
)

Document = TypeVar("Document")


class AgentUnavailable(Exception):
    """The agent did not answer (not started yet, gone, or timed out)."""


class AgentRejected(Exception):
    """The agent answered with an error; the message is its reason."""


class AgentAnswerTimedOut(AgentUnavailable):
    """The agent took the request and gave no answer in time: busy (storage slower than
    the timeout) or hung. What it was asked may still be under way."""


class AgentAnswerInvalid(AgentRejected):
    """The agent answered, but not with the document the protocol defines (another
    version, a broken agent): as useless as a refusal, and handled like one."""


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

    async def read_status(self, after: int | None = None, wait: float = 0.0) -> AgentStatus:
        """The agent's status. With ``after`` (a version it reported), the agent answers
        when its version differs, or after ``wait`` seconds with the same one."""
        if after is None:
            answer = await self._call("GET", "/v1/status")
        else:
            wait = max(0.0, wait)
            params = {"after": str(after), "wait": str(wait)}
            answer = await self._call("GET", "/v1/status", params=params, waits=wait)
        return _checked("GET /v1/status", AgentStatus.from_json, answer)

    async def trigger(
        self, checkpoint_id: int, kind: CheckpointKind, after: AfterCompletion
    ) -> None:
        body = TriggerBody(checkpoint_id, kind, after).to_json()
        await self._command("/v1/checkpoints", body, Acknowledgement.ACCEPTED)

    async def finalize(
        self, checkpoint_id: int, tasks: Sequence[str], *, waits: float = 0.0
    ) -> FinalizeAnswer:
        """``waits``: how much longer than other requests writing ``_metadata`` may take
        (it lists and syncs the image's files in storage)."""
        path = f"/v1/checkpoints/{checkpoint_id}/finalize"
        body = FinalizeBody(tuple(tasks)).to_json()
        answer = await self._call(
            "POST", path, body, waits=max(0.0, waits), max_bytes=MAX_COMMAND_ANSWER_BYTES
        )
        return _checked(f"POST {path}", FinalizeAnswer.from_json, answer)

    async def complete(self, checkpoint_id: int, batch_id: int) -> None:
        path = f"/v1/checkpoints/{checkpoint_id}/complete"
        await self._command(path, CompleteBody(batch_id).to_json(), Acknowledgement.NOTIFIED)

    async def abort(self, checkpoint_id: int, reason: str) -> None:
        path = f"/v1/checkpoints/{checkpoint_id}/abort"
        await self._command(path, AbortBody(reason).to_json(), Acknowledgement.ABORTED)

    async def discard_checkpoint(self, checkpoint_id: int, retained: Sequence[int]) -> None:
        body = DiscardCheckpointBody(tuple(retained)).to_json()
        path = f"/v1/checkpoints/{checkpoint_id}/discard"
        await self._command(path, body, Acknowledgement.DISCARDED)

    async def discard_savepoint(self, savepoint_id: int) -> None:
        path = f"/v1/savepoints/{savepoint_id}/discard"
        await self._command(path, {}, Acknowledgement.DISCARDED)

    async def collect_garbage(
        self, checkpoints: Sequence[int], savepoints: Sequence[int]
    ) -> CollectGarbageAnswer:
        path = "/v1/storage/collect-garbage"
        body = CollectGarbageBody(tuple(checkpoints), tuple(savepoints)).to_json()
        answer = await self._call("POST", path, body, max_bytes=MAX_COMMAND_ANSWER_BYTES)
        return _checked(f"POST {path}", CollectGarbageAnswer.from_json, answer)

    async def _command(
        self, path: str, body: dict[str, Any], acknowledgement: Acknowledgement
    ) -> None:
        """POST a command whose answer only acknowledges it."""
        answer = await self._call("POST", path, body, max_bytes=MAX_COMMAND_ANSWER_BYTES)
        _checked(f"POST {path}", acknowledgement.read, answer)

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        waits: float = 0.0,
        max_bytes: int = MAX_BODY_BYTES,
    ) -> Any:
        """``waits``: how long the agent may hold the answer back, on top of the timeout;
        ``max_bytes``: the largest answer read (a status may be large, a command's is not)."""
        base_url = self.url
        if base_url is None:
            raise AgentUnavailable(f"{method} {path}: the driver has no address yet")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=IDLE_CONNECTION_SECONDS / 3)
            )
        session = self._session
        url = base_url.rstrip("/") + path
        timeout = aiohttp.ClientTimeout(total=self._timeout + waits, sock_connect=CONNECT_TIMEOUT)
        try:
            async with session.request(
                method,
                url,
                json=body,
                params=params,
                headers=self._headers,
                timeout=timeout,
                # The agent answers itself: a redirect would have the operator ask any
                # address a driver names and quote its answer in events.
                allow_redirects=False,
            ) as response:
                request = f"{method} {path}"
                if 300 <= response.status < 400:
                    raise AgentRejected(
                        f"{request}: {response.status} redirect refused (the agent answers "
                        "at its own address)"
                    )
                answer = _decoded(await _bounded_body(response, request, max_bytes), request)
                if response.status >= 400:
                    raise AgentRejected(f"{method} {path}: {response.status} {_reason(answer)}")
                return answer
        except aiohttp.ClientConnectorError as error:
            # A driver that exits closes its port: routine, so the words must not alarm
            # ("Connect call failed" is aiohttp's).
            number = error.os_error.errno
            reason = os.strerror(number) if number else str(error.os_error)
            raise AgentUnavailable(
                f"{method} {path}: cannot connect to {error.host}:{error.port} ({reason})"
            ) from error
        except (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
            aiohttp.ClientPayloadError,
        ) as error:
            # A driver exiting while the request was under way (a payload cut short is not
            # a connection error to aiohttp): its words for it ("[Errno None] Can not write
            # request body", "Server disconnected", "Response payload is not completed")
            # alarm.
            raise AgentUnavailable(
                f"{method} {path}: the connection closed before the agent answered"
            ) from error
        except aiohttp.ConnectionTimeoutError as error:
            raise AgentUnavailable(
                f"{method} {path}: cannot connect to {url} (no answer within "
                f"{CONNECT_TIMEOUT:.0f}s)"
            ) from error
        except TimeoutError as error:
            raise AgentAnswerTimedOut(
                f"{method} {path}: no answer within {timeout.total:.0f}s"
            ) from error
        except aiohttp.ClientConnectionError as error:
            raise AgentUnavailable(f"{method} {path}: {error}") from error
        except RuntimeError as error:
            if not session.closed:
                raise
            # Closed as the driver went (`close`) while a task still asked: the abort of a
            # snapshot a second Ctrl-C gave up. aiohttp says "Session is closed".
            raise AgentUnavailable(f"{method} {path}: the driver is gone") from error


async def _bounded_body(response: aiohttp.ClientResponse, request: str, max_bytes: int) -> bytes:
    """The answer's body, refused once it is larger than `max_bytes`."""
    too_large = AgentAnswerInvalid(
        f"{request}: the answer is larger than {max_bytes} bytes, the most read"
    )
    if (response.content_length or 0) > max_bytes:
        raise too_large
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            raise too_large
    return bytes(body)


def _decoded(body: bytes, request: str) -> Any:
    """The answer as JSON, or its text when it is none (aiohttp's own "404: Not Found"; a
    document nested past the parser's depth, or a number of more digits than it reads).
    Refused unparsed when it holds more values than `MAX_ANSWER_VALUES` (a count from
    above: separators inside strings count too)."""
    if body.count(b",") + body.count(b"[") + body.count(b"{") > MAX_ANSWER_VALUES:
        raise AgentAnswerInvalid(
            f"{request}: the answer holds more than {MAX_ANSWER_VALUES} JSON values, the most read"
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return body[:500].decode(errors="replace")


def _reason(answer: Any) -> str:
    """Why the agent refused: its error answer's message, else the answer as it came."""
    try:
        return ErrorAnswer.from_json(answer).message
    except ProtocolError:
        return str(answer)


def _checked(request: str, read: Callable[[Any], Document], answer: Any) -> Document:
    try:
        return read(answer)
    except ProtocolError as error:
        raise AgentAnswerInvalid(f"{request}: the answer breaks the protocol: {error}") from None
