"""The agent's HTTP/JSON control API (docs/agent-protocol.md), served from a thread of
the driver. Every request needs the job's bearer token."""

import asyncio
import hmac
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from spark_checkpoint.agent.agent import AfterCompletion, AgentRequestError, CheckpointAgent
from spark_checkpoint.storage import CheckpointKind, StorageError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(agent: CheckpointAgent, token: str) -> web.Application:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        supplied = request.headers.get("Authorization", "")
        if not hmac.compare_digest(supplied.encode(), f"Bearer {token}".encode()):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        try:
            return await handler(request)
        except AgentRequestError as error:
            return web.json_response({"error": str(error)}, status=error.status)
        except (KeyError, ValueError, TypeError) as error:
            return web.json_response({"error": f"bad request: {error}"}, status=400)
        except (StorageError, OSError) as error:
            log.warning("%s %s failed: %s", request.method, request.path, error)
            return web.json_response({"error": f"storage: {error}"}, status=500)

    async def run(call: Callable[[], Any]) -> Any:
        # Storage I/O blocks; keep the event loop free for status requests.
        return await asyncio.get_running_loop().run_in_executor(None, call)

    async def status(request: web.Request) -> web.Response:
        return web.json_response(await run(agent.status))

    async def trigger(request: web.Request) -> web.Response:
        body = await request.json()
        agent.trigger(
            int(body["id"]),
            CheckpointKind(body["kind"]),
            AfterCompletion(body.get("after", "continue")),
        )
        return web.json_response({"accepted": True}, status=202)

    async def finalize(request: web.Request) -> web.Response:
        body = await request.json()
        checkpoint_id = int(request.match_info["id"])
        path, size = await run(lambda: agent.finalize(checkpoint_id, list(body["tasks"])))
        return web.json_response({"path": path, "sizeBytes": size})

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        checkpoint_id = int(request.match_info["id"])
        await run(lambda: agent.complete(checkpoint_id, int(body["batchId"])))
        return web.json_response({"notified": True})

    async def abort(request: web.Request) -> web.Response:
        body = await request.json()
        checkpoint_id = int(request.match_info["id"])
        await run(lambda: agent.abort(checkpoint_id, str(body.get("reason", ""))))
        return web.json_response({"aborted": True})

    async def discard_checkpoint(request: web.Request) -> web.Response:
        body = await request.json()
        checkpoint_id = int(request.match_info["id"])
        retained = [int(r) for r in body["retained"]]
        await run(lambda: agent.discard_checkpoint(checkpoint_id, retained))
        return web.json_response({"discarded": True})

    async def discard_savepoint(request: web.Request) -> web.Response:
        savepoint_id = int(request.match_info["id"])
        await run(lambda: agent.discard_savepoint(savepoint_id))
        return web.json_response({"discarded": True})

    async def collect_garbage(request: web.Request) -> web.Response:
        body = await request.json()
        checkpoints = [int(c) for c in body["checkpoints"]]
        savepoints = [int(s) for s in body["savepoints"]]
        return web.json_response(await run(lambda: agent.collect_garbage(checkpoints, savepoints)))

    app = web.Application(middlewares=[authenticate])
    app.add_routes(
        [
            web.get("/v1/status", status),
            web.post("/v1/checkpoints", trigger),
            web.post("/v1/checkpoints/{id:\\d+}/finalize", finalize),
            web.post("/v1/checkpoints/{id:\\d+}/complete", complete),
            web.post("/v1/checkpoints/{id:\\d+}/abort", abort),
            web.post("/v1/checkpoints/{id:\\d+}/discard", discard_checkpoint),
            web.post("/v1/savepoints/{id:\\d+}/discard", discard_savepoint),
            web.post("/v1/storage/collect-garbage", collect_garbage),
        ]
    )
    return app


class AgentServer:
    """Runs the API on its own event loop in a daemon thread."""

    def __init__(self, agent: CheckpointAgent, token: str, host: str, port: int) -> None:
        self._app = build_app(agent, token)
        self._host = host
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        threading.Thread(target=self._serve, name="checkpoint-agent", daemon=True).start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = web.AppRunner(self._app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self._host, self._port)
            self._loop.run_until_complete(site.start())
        except BaseException as error:  # reported to the starting thread
            self._error = error
            self._started.set()
            return
        log.info("checkpoint agent listening on %s:%s", self._host, self._port)
        self._started.set()
        self._loop.run_forever()

    def stop(self) -> None:
        if self._runner is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        future.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
