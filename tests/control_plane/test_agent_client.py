"""The agent client reads every answer through the wire contract: an answer that is not
the protocol's document (another version, a broken agent) is `AgentAnswerInvalid`, an
`AgentRejected` the supervisor already handles, with one line naming the field."""

import asyncio
from typing import Any

import pytest
from aiohttp import web

from helpers.agent import free_port
from spark_checkpoint.protocol import (
    AgentStatus,
    CheckpointKind,
    QueryState,
    QueryStatus,
    SnapshotPhase,
    SnapshotStatus,
)
from spark_checkpoint_operator.agent_client import AgentAnswerInvalid, AgentClient, AgentRejected

STATUS = AgentStatus(
    version=4,
    attempt=2,
    query=QueryStatus(QueryState.RUNNING, "", 3),
    tasks=("logs",),
    all_tasks_running=True,
    awaiting_final_checkpoint=False,
    restored_from=None,
    checkpoints=(SnapshotStatus(7, CheckpointKind.CHECKPOINT, SnapshotPhase.CAPTURING, None),),
)


def _ask(answers: dict[str, Any], call: str, *args: Any) -> Any:
    """``call`` of a client against a server that answers each path with ``answers``."""

    async def answer(request: web.Request) -> web.Response:
        return web.json_response(answers[request.path])

    async def scenario() -> Any:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        client = AgentClient(f"http://127.0.0.1:{port}", "token")
        try:
            return await getattr(client, call)(*args)
        finally:
            await client.close()
            await runner.cleanup()

    return asyncio.run(scenario())


def test_the_status_is_read_as_the_typed_document() -> None:
    assert _ask({"/v1/status": STATUS.to_json()}, "read_status") == STATUS


@pytest.mark.parametrize(
    ("call", "path", "answer", "message"),
    [
        ("read_status", "/v1/status", STATUS.to_json() | {"apiVersion": "v2"}, "apiVersion"),
        ("read_status", "/v1/status", STATUS.to_json() | {"tasks": "logs"}, "tasks must be"),
        ("status", "/v1/status", {"version": 1}, "field 'apiVersion' is missing"),
        ("finalize", "/v1/checkpoints/7/finalize", {"path": "p"}, "'sizeBytes' is missing"),
        ("collect_garbage", "/v1/storage/collect-garbage", [], "must be a JSON object"),
    ],
)
def test_an_answer_that_breaks_the_protocol_is_refused_in_one_line(
    call: str, path: str, answer: Any, message: str
) -> None:
    args = {"finalize": (7, ["logs"]), "collect_garbage": ([], [])}.get(call, ())

    with pytest.raises(AgentAnswerInvalid) as raised:
        _ask({path: answer}, call, *args)

    assert isinstance(raised.value, AgentRejected)
    assert str(raised.value).startswith(f"{'GET' if 'status' in call else 'POST'} {path}: ")
    assert message in str(raised.value) and "\n" not in str(raised.value)
