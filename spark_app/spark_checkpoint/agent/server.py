"""The agent's HTTP/JSON control API (docs/agent-protocol.md), served from a thread of
the driver. Every request needs the job's bearer token."""

import asyncio
import concurrent.futures
import contextlib
import functools
import hmac
import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from spark_checkpoint.agent.agent import AgentRequestError, CheckpointAgent
from spark_checkpoint.protocol import (
    ACKNOWLEDGEMENT_GATHER_SECONDS,
    IDLE_CONNECTION_SECONDS,
    MAX_BODY_BYTES,
    MAX_ID,
    AbortBody,
    Acknowledgement,
    CollectGarbageBody,
    CompleteBody,
    DiscardCheckpointBody,
    ErrorAnswer,
    FinalizeBody,
    ProtocolError,
    TriggerBody,
)
from spark_checkpoint.storage import StorageError
from spark_checkpoint.storage.errors import printable_line

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Number = TypeVar("Number", int, float)

_CANONICAL_ID = re.compile(r"0|[1-9][0-9]*")
# The longest a status request waits for a change (``wait`` is capped to it).
MAX_WAIT_SECONDS = 30.0
# How long `stop` lets requests in progress finish before it cancels them: a storage call
# (a garbage collection while the driver restores) must not hold up the driver's exit.
# aiohttp waits that long twice (for the handler, then for it once its request is cancelled).
STOP_GRACE_SECONDS = 2.0
# Query state and tasks change without telling the agent: a waiting status request
# computes the status again this often to notice.
RECHECK_SECONDS = 1.0


# How often the agent says that it refused requests it could not parse.
MALFORMED_REQUEST_LOG_SECONDS = 60.0
# The most header lines of a request, and bytes per header name or value, read before it
# is refused (400):
# aiohttp's 128 lines of 8 KiB held about 2 MiB per connection whose headers never end.
# The client sends fewer than ten short lines.
MAX_REQUEST_HEADERS = 32
MAX_HEADER_FIELD_BYTES = 4096


class _SaidOnceAMinute:
    """What a flood of one kind of log line is cut down to: one line a minute at most,
    with how many came since."""

    def __init__(self) -> None:
        self._said = -math.inf
        self._since = 0

    def due(self) -> str | None:
        """None while the last line is less than a minute old (this one is counted), else
        what to add to the line ("" or " (N more since the last one said)")."""
        now = time.monotonic()
        if now - self._said < MALFORMED_REQUEST_LOG_SECONDS:
            self._since += 1
            return None
        more = f" ({self._since} more since the last one said)" if self._since else ""
        self._said, self._since = now, 0
        return more


class _MalformedRequests(logging.Filter):
    """aiohttp logs each request it cannot parse (a bad header, a line too long) at ERROR
    with a traceback: whoever reaches the agent's port, without a token, could fill the
    driver's log. Said as one warning line instead, at most once a minute with how many
    came since."""

    def __init__(self) -> None:
        super().__init__()
        self.said = _SaidOnceAMinute()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        # aiohttp's own DEBUG lines (a first request that is no HTTP at all) stay as they are.
        if record.levelno < logging.ERROR or not isinstance(error, HttpProcessingError):
            return True
        more = self.said.due()
        if more is None:
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = "refused a request from %s that is not valid HTTP: %s%s"
        record.args = (peer, printable_line(str(error)), more)
        record.exc_info = record.exc_text = None
        return True


_MALFORMED_REQUESTS = _MalformedRequests()
_EXHAUSTED_SOCKETS = _SaidOnceAMinute()
# asyncio's words when accept() fails for want of descriptors or buffers; it says so at
# ERROR with a traceback for every connection waiting, thousands a second.
_ACCEPT_EXHAUSTED = "socket.accept() out of system resource"


def _quiet_accept_failures(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The agent's loop's exception handler: whoever reaches the port could fill the
    driver's log by opening connections until none can be accepted. Said in one warning
    line a minute; anything else as asyncio says it."""
    if context.get("message") != _ACCEPT_EXHAUSTED:
        loop.default_exception_handler(context)
        return
    more = _EXHAUSTED_SOCKETS.due()
    if more is not None:
        log.warning(
            "cannot accept connections to the agent: %s%s",
            printable_line(str(context.get("exception", "out of system resource"))),
            more,
        )


# Written out in ASCII digits (a decimal as Python's repr of a float writes it: "3.4e-05"):
# int() and float() also take " 7", "+7", "1_0", other scripts' digits and "inf".
_INTEGER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")


def long_poll_parameters(query: Mapping[str, str]) -> tuple[int | None, float]:
    """``after`` and ``wait`` of a status request; a bad value is a ValueError naming it."""
    after = _parameter(query, "after", _INTEGER, int, "a status version (an integer >= 0)")
    wait = _parameter(query, "wait", _DECIMAL, float, "a number of seconds >= 0")
    return after, min(wait or 0.0, MAX_WAIT_SECONDS)


def _parameter(
    query: Mapping[str, str],
    name: str,
    written: re.Pattern[str],
    parse: Callable[[str], Number],
    meaning: str,
) -> Number | None:
    text = query.get(name)
    if text is None:
        return None
    try:
        value = parse(text) if written.fullmatch(text) else None
        if value is not None and not math.isfinite(value):
            value = None
    except (ValueError, OverflowError):  # over 4300 digits; an integer beyond any float
        value = None
    if value is None:
        raise ValueError(f"query parameter {name!r} must be {meaning}, got {text!r}")
    return value


def _bad_request(message: str) -> AgentRequestError:
    return AgentRequestError(400, f"bad request: {message}")


def _error(status: int, message: str) -> web.Response:
    return web.json_response(ErrorAnswer(message).to_json(), status=status)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


Document = TypeVar("Document")


async def _body(request: web.Request, read: Callable[[Any], Document]) -> Document:
    """The request's body as ``read`` makes it a document of the protocol, else a 400 (or
    413, 408) that says what is wrong with it."""
    try:
        # A body that never all comes would hold its connection for ever.
        async with asyncio.timeout(IDLE_CONNECTION_SECONDS):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.client_max_size
        raise AgentRequestError(413, f"the body is larger than {limit} bytes") from None
    except TimeoutError:
        raise AgentRequestError(
            408, f"the body did not all come in {IDLE_CONNECTION_SECONDS:g} s"
        ) from None
    try:
        # Decoded first: json.loads would take bytes in UTF-16 or UTF-32 too (RFC 8259: UTF-8).
        value = json.loads(raw.decode(), parse_constant=_refuse_constant)
    except RecursionError:
        raise _bad_request("the body is nested too deeply") from None
    except UnicodeDecodeError as error:
        raise _bad_request(f"the body is not JSON in UTF-8: {error}") from None
    except ValueError as error:  # not JSON, a byte order mark, more than 4300 digits
        raise _bad_request(f"the body is not JSON: {error}") from None
    try:
        return read(value)
    except ProtocolError as error:
        raise _bad_request(str(error)) from None


def _path_id(request: web.Request) -> int:
    # The route admits ASCII digits only; leading zeros and int64 overflow are refused here.
    text = request.match_info["id"]
    if not _CANONICAL_ID.fullmatch(text) or len(text) > 19 or int(text) > MAX_ID:
        raise _bad_request(
            f"the id in the path must be an integer from 0 to {MAX_ID}, got {text!r}"
        )
    return int(text)


async def _in_thread(call: Callable[[], Any]) -> Any:
    """``call()`` on a thread of its own: storage I/O blocks, and the loop stays free for
    status requests. A daemon thread, not an executor's: Python joins those when the
    process exits, so a storage call that hangs (a garbage collection when the restore
    failed at once) would hold the driver's exit."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not answer.done():  # not cancelled meanwhile
            outcome()

    def run() -> None:
        try:
            result = call()
        except BaseException as error:
            outcome = functools.partial(answer.set_exception, error)
        else:
            outcome = functools.partial(answer.set_result, result)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="agent-storage-call", daemon=True).start()
    return await answer


class _StatusRoute:
    """``GET /v1/status``: at once, unless ``after`` names the current version; then when
    the version changes, or after ``wait`` seconds with the same one (a long poll). A
    change that is only more task acknowledgements is gathered for a moment
    (``ACKNOWLEDGEMENT_GATHER_SECONDS``) before it is answered."""

    def __init__(self, agent: CheckpointAgent) -> None:
        self._agent = agent
        # The status is computed on a thread of its own: storage calls on the shared pool
        # may wait long (a discard waits for copies under way), and a status that cannot
        # be answered reads as a driver that stopped answering.
        self._status_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="agent-status"
        )
        # Each replaced by a new one at each change: any change, and any change other than
        # an acknowledgement alone (which ends the gathering of acknowledgements).
        self._changed = asyncio.Event()
        self._milestone = asyncio.Event()
        self._closing = False

    async def watch_agent(self, app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def changed(acknowledgement_only: bool) -> None:  # called from the agent's threads
            loop.call_soon_threadsafe(self._notify, acknowledgement_only)

        self._agent.watch(changed)
        yield
        self._agent.unwatch(changed)
        self._status_thread.shutdown(wait=False)

    async def answer_waiting(self, app: web.Application) -> None:
        """The server is stopping: waiting requests answer now, not after their wait."""
        self._closing = True
        self._notify(acknowledgement_only=False)

    def _notify(self, acknowledgement_only: bool) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        if not acknowledgement_only:
            self._milestone.set()
            self._milestone = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        after, wait = long_poll_parameters(request.query)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        # What the client last saw: a client that missed only acknowledgements (they come
        # faster than it asks, e.g. 1,000 tasks) waits for more like one that missed none.
        seen = None if after is None else self._agent.status_as_of(after)
        gathered_until: float | None = None
        while True:
            # Taken before the status: a later change wakes us.
            changed, milestone = self._changed, self._milestone
            document = await loop.run_in_executor(self._status_thread, self._agent.status)
            now = loop.time()
            remaining = deadline - now
            gone = request.transport is None  # the client gave up waiting
            if after is None or remaining <= 0 or gone or self._closing:
                return web.json_response(document.to_json())
            if document.version == after:
                wake, timeout = changed, RECHECK_SECONDS
            elif seen is not None and document.only_acknowledged_since(seen):
                if gathered_until is None:
                    gathered_until = now + ACKNOWLEDGEMENT_GATHER_SECONDS
                if now >= gathered_until:
                    return web.json_response(document.to_json())
                # Only another kind of change ends the gathering early: computing the
                # status for every acknowledgement would compete with the copies.
                wake, timeout = milestone, gathered_until - now
            else:
                return web.json_response(document.to_json())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), min(remaining, timeout))


def build_app(agent: CheckpointAgent, token: str) -> web.Application:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        # aiohttp decodes header bytes that are not UTF-8 as lone surrogates: encode them back.
        supplied = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(supplied, f"Bearer {token}".encode()):
            return _error(401, "missing or wrong bearer token")
        try:
            return await handler(request)
        except AgentRequestError as error:
            return _error(error.status, str(error))
        except ValueError as error:  # an argument the agent or storage refuses
            return _error(400, f"bad request: {error}")
        except (StorageError, OSError) as error:
            log.warning("%s %s failed: %s", request.method, request.path, error)
            return _error(500, f"storage: {error}")

    status = _StatusRoute(agent)

    async def trigger(request: web.Request) -> web.Response:
        body = await _body(request, TriggerBody.from_json)
        agent.trigger(body.checkpoint_id, body.kind, body.after)
        return web.json_response(Acknowledgement.ACCEPTED.to_json(), status=202)

    async def finalize(request: web.Request) -> web.Response:
        checkpoint_id = _path_id(request)
        body = await _body(request, FinalizeBody.from_json)
        answer = await _in_thread(lambda: agent.finalize(checkpoint_id, body.tasks))
        return web.json_response(answer.to_json())

    async def complete(request: web.Request) -> web.Response:
        checkpoint_id = _path_id(request)
        body = await _body(request, CompleteBody.from_json)
        await _in_thread(lambda: agent.complete(checkpoint_id, body.batch_id))
        return web.json_response(Acknowledgement.NOTIFIED.to_json())

    async def abort(request: web.Request) -> web.Response:
        checkpoint_id = _path_id(request)
        body = await _body(request, AbortBody.from_json)
        await _in_thread(lambda: agent.abort(checkpoint_id, body.reason))
        return web.json_response(Acknowledgement.ABORTED.to_json())

    async def discard_checkpoint(request: web.Request) -> web.Response:
        checkpoint_id = _path_id(request)
        body = await _body(request, DiscardCheckpointBody.from_json)
        await _in_thread(lambda: agent.discard_checkpoint(checkpoint_id, body.retained))
        return web.json_response(Acknowledgement.DISCARDED.to_json())

    async def discard_savepoint(request: web.Request) -> web.Response:
        savepoint_id = _path_id(request)
        await _in_thread(lambda: agent.discard_savepoint(savepoint_id))
        return web.json_response(Acknowledgement.DISCARDED.to_json())

    async def collect_garbage(request: web.Request) -> web.Response:
        body = await _body(request, CollectGarbageBody.from_json)
        answer = await _in_thread(lambda: agent.collect_garbage(body.checkpoints, body.savepoints))
        return web.json_response(answer.to_json())

    app = web.Application(middlewares=[authenticate], client_max_size=MAX_BODY_BYTES)
    app.cleanup_ctx.append(status.watch_agent)
    app.on_shutdown.append(status.answer_waiting)
    app.add_routes(
        [
            web.get("/v1/status", status.handle),
            web.post("/v1/checkpoints", trigger),
            # [0-9], not \\d: \\d also matches other scripts' digits, which int() would take.
            web.post("/v1/checkpoints/{id:[0-9]+}/finalize", finalize),
            web.post("/v1/checkpoints/{id:[0-9]+}/complete", complete),
            web.post("/v1/checkpoints/{id:[0-9]+}/abort", abort),
            web.post("/v1/checkpoints/{id:[0-9]+}/discard", discard_checkpoint),
            web.post("/v1/savepoints/{id:[0-9]+}/discard", discard_savepoint),
            web.post("/v1/storage/collect-garbage", collect_garbage),
        ]
    )
    return app


class AgentServer:
    """Runs the API on its own event loop in a daemon thread."""

    def __init__(
        self,
        agent: CheckpointAgent,
        token: str,
        host: str,
        port: int,
        *,
        socket_fd: int | None = None,
    ) -> None:
        """Serves on ``host:port``, or on the socket ``socket_fd``, which whoever started
        this process bound to it (listened on here)."""
        self._app = build_app(agent, token)
        self._host = host
        self._port = port
        self._socket_fd = socket_fd
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="checkpoint-agent", daemon=True)
        self._started = threading.Event()
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(_quiet_accept_failures)
        try:
            try:
                runner = web.AppRunner(
                    self._app,
                    access_log=None,
                    shutdown_timeout=STOP_GRACE_SECONDS,
                    keepalive_timeout=IDLE_CONNECTION_SECONDS,
                    max_headers=MAX_REQUEST_HEADERS,
                    max_field_size=MAX_HEADER_FIELD_BYTES,
                )
                self._loop.run_until_complete(runner.setup())
                site: web.BaseSite = (
                    web.TCPSite(runner, self._host, self._port)
                    if self._socket_fd is None
                    else web.SockSite(runner, socket.socket(fileno=self._socket_fd))
                )
                self._loop.run_until_complete(site.start())
            except BaseException as error:  # reported to the starting thread
                self._error = error
                return
            finally:
                self._started.set()
            self._runner = runner
            logging.getLogger("aiohttp.server").addFilter(_MALFORMED_REQUESTS)  # once: a set
            log.info("checkpoint agent listening on %s:%s", self._host, self._port)
            self._loop.run_forever()
        finally:
            # Storage calls still running on their threads (`_in_thread`) are not waited
            # for: the driver is exiting, and their answers have nobody to go to.
            self._loop.close()

    def stop(self) -> None:
        """Stop serving and return once the server's thread and loop are gone."""
        if self._runner is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        future.result(timeout=2 * STOP_GRACE_SECONDS + 10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
