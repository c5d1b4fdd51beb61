"""The agent client reads every answer through the wire contract: an answer that is not
the protocol's document (another version, a broken agent) is `AgentAnswerInvalid`, an
`AgentRejected` the supervisor already handles, with one line naming the field."""

import asyncio
import dataclasses
import re
from typing import Any

import pytest
from aiohttp import web

from helpers.agent import free_port
from spark_checkpoint.protocol import (
    MAX_ANSWER_VALUES,
    MAX_BODY_BYTES,
    MAX_COMMAND_ANSWER_BYTES,
    AckReport,
    AfterCompletion,
    AgentStatus,
    CheckpointKind,
    CollectGarbageAnswer,
    ErrorAnswer,
    FinalizeAnswer,
    QueryState,
    QueryStatus,
    SnapshotPhase,
    SnapshotStatus,
)
from spark_checkpoint_operator.agent_client import (
    AgentAnswerInvalid,
    AgentAnswerTimedOut,
    AgentClient,
    AgentRejected,
    AgentUnavailable,
)

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
FINALIZE = "/v1/checkpoints/7/finalize"
COLLECT = "/v1/storage/collect-garbage"


class Chunked(bytes):
    """An answer's bytes sent without a Content-Length."""


def _ask(answers: dict[str, Any], call: str, *args: Any, status: int = 200) -> Any:
    """``call`` of a client against a server that answers each path with ``answers`` (as
    JSON; a string as plain text, bytes as they are) and ``status``."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = answers[request.path]
        if isinstance(body, Chunked):  # no Content-Length: read until the stream ends
            streamed = web.StreamResponse(status=status)
            streamed.enable_chunked_encoding()
            await streamed.prepare(request)
            for start in range(0, len(body), 4096):
                await streamed.write(body[start : start + 4096])
            await streamed.write_eof()
            return streamed
        if isinstance(body, bytes):
            return web.Response(body=body, status=status)
        if isinstance(body, str):
            return web.Response(text=body, status=status)
        return web.json_response(body, status=status)

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


def test_finalize_and_garbage_collection_answers_are_read_as_typed_documents() -> None:
    finalized = FinalizeAnswer("file:///s/chk-7/_metadata", 2048)
    collected = CollectGarbageAnswer(checkpoints=(3, 4), savepoints=(), shared_files=5)

    assert _ask({FINALIZE: finalized.to_json()}, "finalize", 7, ["logs"]) == finalized
    assert _ask({COLLECT: collected.to_json()}, "collect_garbage", [7], []) == collected


@pytest.mark.parametrize(
    ("call", "path", "answer", "message"),
    [
        ("read_status", "/v1/status", STATUS.to_json() | {"apiVersion": "v2"}, "apiVersion"),
        ("read_status", "/v1/status", STATUS.to_json() | {"tasks": "logs"}, "tasks must be"),
        ("read_status", "/v1/status", {"version": 1}, "field 'apiVersion' is missing"),
        ("finalize", FINALIZE, {"path": "p"}, "'sizeBytes' is missing"),
        ("collect_garbage", COLLECT, [], "must be a JSON object"),
        ("trigger", "/v1/checkpoints", {}, "field 'accepted' is missing"),
        ("complete", "/v1/checkpoints/7/complete", {"aborted": True}, "'notified' is missing"),
        ("abort", "/v1/checkpoints/7/abort", {"aborted": 1}, "aborted must be true or false"),
        ("discard_savepoint", "/v1/savepoints/7/discard", {"discarded": False}, "must be true"),
    ],
)
def test_an_answer_that_breaks_the_protocol_is_refused_in_one_line(
    call: str, path: str, answer: Any, message: str
) -> None:
    args = {
        "trigger": (7, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE),
        "finalize": (7, ["logs"]),
        "complete": (7, 2),
        "abort": (7, "expired"),
        "discard_savepoint": (7,),
        "collect_garbage": ([], []),
    }.get(call, ())

    with pytest.raises(AgentAnswerInvalid) as raised:
        _ask({path: answer}, call, *args)

    assert isinstance(raised.value, AgentRejected)
    assert str(raised.value).startswith(f"{'GET' if 'status' in call else 'POST'} {path}: ")
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("sent", [bytes, Chunked], ids=["with-length", "chunked"])
def test_an_answer_larger_than_the_client_reads_is_refused_before_it_is_all_read(
    sent: type[bytes],
) -> None:
    # The agent runs in the job author's process: an answer of hundreds of MiB would
    # take the memory of the operator that serves every job.
    huge = sent(b'{"version": "' + b"x" * MAX_BODY_BYTES + b'"}')

    with pytest.raises(AgentAnswerInvalid) as raised:
        _ask({"/v1/status": huge}, "read_status")

    assert str(raised.value) == (
        f"GET /v1/status: the answer is larger than {MAX_BODY_BYTES} bytes, the most read"
    )


def test_a_commands_answer_larger_than_a_command_needs_is_refused() -> None:
    """Only a status may be large (every task, its acks): a command's answer of 16 MiB
    would be read and parsed for nothing."""
    padded = {"notified": True, "padding": "x" * MAX_COMMAND_ANSWER_BYTES}

    with pytest.raises(AgentAnswerInvalid) as raised:
        _ask({"/v1/checkpoints/7/complete": padded}, "complete", 7, 3)

    assert str(raised.value) == (
        f"POST /v1/checkpoints/7/complete: the answer is larger than "
        f"{MAX_COMMAND_ANSWER_BYTES} bytes, the most read"
    )


def test_an_answer_of_more_values_than_the_agent_writes_is_refused_unparsed() -> None:
    """A driver runs the job author's code: 16 MiB of `[[],[],...]` parsed took 500 MiB of
    the memory of an operator that serves every job (a security review's)."""
    values = b"[" + b",".join([b"[]"] * (MAX_BODY_BYTES // 4)) + b"]"
    assert len(values) < MAX_BODY_BYTES

    with pytest.raises(AgentAnswerInvalid) as raised:
        _ask({"/v1/status": values}, "read_status")

    assert str(raised.value) == (
        f"GET /v1/status: the answer holds more than {MAX_ANSWER_VALUES} JSON values, the most read"
    )


def test_the_largest_status_a_job_makes_is_read() -> None:
    """A stream-stream join and an aggregation at 8,000 partitions: 40,000 tasks, all of
    them acknowledged in two snapshots in flight (6.5 MiB, one JSON value per 15 bytes:
    the densest answer the agent writes), is read."""
    tasks = tuple(
        f"state-{operator}-{partition}" for operator in range(5) for partition in range(8000)
    )
    acks = tuple(AckReport(task, 1, 1350, 908) for task in tasks)
    snapshots = tuple(
        SnapshotStatus(
            checkpoint_id, CheckpointKind.CHECKPOINT, SnapshotPhase.ACKNOWLEDGED, 1, acks
        )
        for checkpoint_id in (7, 8)
    )
    status = dataclasses.replace(STATUS, tasks=tasks, checkpoints=snapshots)

    assert _ask({"/v1/status": status.to_json()}, "read_status") == status


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"version": ' + b"9" * 5000 + b"}"],
    ids=["nested-too-deep", "too-many-digits"],
)
def test_an_answer_json_cannot_parse_is_refused_in_one_line(body: bytes) -> None:
    with pytest.raises(AgentAnswerInvalid) as raised:
        _ask({"/v1/status": body}, "read_status")

    assert str(raised.value).startswith("GET /v1/status: the answer breaks the protocol: ")
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 1000


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ErrorAnswer("checkpoint 7 is copying").to_json(), "checkpoint 7 is copying"),
        # Not the protocol's error answer: shown as it came.
        (["not", "an", "object"], "['not', 'an', 'object']"),
        ({"reason": "busy"}, "{'reason': 'busy'}"),
        ("409: Conflict", "409: Conflict"),
    ],
)
def test_a_refusal_is_one_line_with_the_agents_reason(answer: Any, reason: str) -> None:
    with pytest.raises(AgentRejected) as raised:
        _ask({FINALIZE: answer}, "finalize", 7, ["logs"], status=409)

    assert str(raised.value) == f"POST {FINALIZE}: 409 {reason}"
    assert not isinstance(raised.value, AgentAnswerInvalid)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_not_followed(status: int) -> None:
    """A driver's agent could send the operator to any address (its cloud's metadata
    service, a service in its namespace) and have the answer quoted in the job's events
    (a security review's)."""
    followed: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": "/elsewhere"})

    async def elsewhere(request: web.Request) -> web.Response:
        followed.append(request.method)
        return web.json_response(STATUS.to_json())

    async def scenario() -> None:
        app = web.Application()
        app.router.add_route("*", "/elsewhere", elsewhere)
        app.router.add_route("*", "/v1/{tail:.*}", redirect)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        client = AgentClient(f"http://127.0.0.1:{port}", "token")
        try:
            with pytest.raises(AgentRejected) as raised:
                await client.read_status()
            assert str(raised.value) == (
                f"GET /v1/status: {status} redirect refused (the agent answers at its own address)"
            )
            with pytest.raises(AgentRejected):
                await client.finalize(7, ["logs"])
        finally:
            await client.close()
            await runner.cleanup()

    asyncio.run(scenario())
    assert followed == []


def test_an_agent_whose_port_is_closed_is_unavailable_in_words_that_do_not_alarm() -> None:
    # A driver that exits closes its port: the fallbacks that follow (the janitor
    # discards, a completion is recovered on restore) quote this reason to the user.
    port = free_port()

    async def scenario() -> str:
        client = AgentClient(f"http://127.0.0.1:{port}", "token")
        try:
            await client.complete(7, 3)
        except AgentUnavailable as error:
            return str(error)
        finally:
            await client.close()
        raise AssertionError("a closed port answered")

    reason = asyncio.run(scenario())
    assert reason.endswith(f"cannot connect to 127.0.0.1:{port} (Connection refused)"), reason
    assert not re.search(r"fail|error|warning", reason, re.I), reason


def test_a_request_as_the_client_closes_is_unavailable_not_a_crash() -> None:
    """A second Ctrl-C: the supervisor closes the driver's client while a task posts the
    abort of the snapshot the stop gave up; aiohttp's "Session is closed" ended the run in a
    traceback (exit 1, not the 130 of a cancel)."""
    port = free_port()

    async def scenario() -> str:
        client = AgentClient(f"http://127.0.0.1:{port}", "token")
        with pytest.raises(AgentUnavailable):
            await client.complete(7, 3)  # the session is made, the port is closed
        session = client._session  # the moment inside close()
        assert session is not None
        await session.close()
        try:
            await client.abort(3, "the job is stopping")
        except AgentUnavailable as error:
            return str(error)
        finally:
            await client.close()
        raise AssertionError("a closed client answered")

    assert asyncio.run(scenario()) == "POST /v1/checkpoints/3/abort: the driver is gone"


@pytest.mark.parametrize(
    ("agent", "reason"),
    [
        ("closes before reading the request", "the connection closed before the agent answered"),
        ("closes after reading its headers", "the connection closed before the agent answered"),
        ("never answers", "no answer within 1s"),
        ("closes in the middle of its answer", "the connection closed before the agent answered"),
    ],
)
def test_an_agent_that_ends_or_holds_a_request_midway_is_unavailable_in_plain_words(
    agent: str, reason: str
) -> None:
    """A driver exiting, or hanging, while a request is under way: aiohttp's own words for
    it ("[Errno None] Can not write request body", "Server disconnected") read like an error."""

    async def scenario() -> str:
        async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if agent != "closes before reading the request":
                await reader.readuntil(b"\r\n\r\n")
            if agent == "never answers":
                await asyncio.sleep(30)
            if agent == "closes in the middle of its answer":
                writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"version": 1')
                await writer.drain()
            writer.transport.abort()

        server = await asyncio.start_server(closing, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = AgentClient(f"http://127.0.0.1:{port}", "token", timeout=1.0)
        try:
            await client.discard_checkpoint(4, [5, 6])
        except AgentUnavailable as error:
            return str(error)
        finally:
            await client.close()
            server.close()
        raise AssertionError("a closed connection answered")

    assert asyncio.run(scenario()) == f"POST /v1/checkpoints/4/discard: {reason}"


def test_a_finalize_may_take_the_time_it_is_given_and_no_answer_in_it_is_a_timeout() -> None:
    """Writing `_metadata` lists and syncs the image's files: on an object store it may take
    longer than other requests. A finalize held past the client's timeout was an agent
    taken for lost (the job left Running, the checkpoint aborted uncounted, again and again;
    a reviewer); now it has the time it is given, and no answer within it is a timeout."""

    async def scenario(waits: float) -> Any:
        async def slow(request: web.Request) -> web.Response:
            await asyncio.sleep(1.5)
            return web.json_response(FinalizeAnswer("file:///s/chk-7/_metadata", 10).to_json())

        app = web.Application()
        app.router.add_post(FINALIZE, slow)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        client = AgentClient(f"http://127.0.0.1:{port}", "token", timeout=1.0)
        try:
            return await client.finalize(7, ["logs"], waits=waits)
        except AgentUnavailable as error:
            return error
        finally:
            await client.close()
            await runner.cleanup()

    assert asyncio.run(scenario(waits=2.0)) == FinalizeAnswer("file:///s/chk-7/_metadata", 10)
    timed_out = asyncio.run(scenario(waits=0.0))
    assert isinstance(timed_out, AgentAnswerTimedOut)
    assert str(timed_out) == f"POST {FINALIZE}: no answer within 1s"
