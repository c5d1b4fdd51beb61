"""Bad input to the agent over real HTTP (issue 12, defect 8): every request the agent
cannot honour gets a 4xx naming the problem, and changes nothing: no sink commits, no
file is written, no snapshot starts."""

import contextlib
import json
import logging
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp.http_exceptions import HttpProcessingError

from helpers.agent import TOKEN, Running, raw_request
from spark_checkpoint.agent import server
from spark_checkpoint.agent.server import MAX_ID
from spark_checkpoint.protocol import MAX_BODY_BYTES, SnapshotPhase
from spark_checkpoint.storage import StorageAccessError

TASKS = ["logs", "state-0-0", "state-0-1"]


def _post(running: Running, path: str, body: object) -> tuple[int, dict[str, object]]:
    answer = raw_request(running.port, b"POST", path.encode(), json.dumps(body).encode())
    return answer.status, json.loads(answer.body)


def _finalized(running: Running, checkpoint_id: int) -> None:
    assert _post(running, "/v1/checkpoints", {"id": checkpoint_id, "kind": "checkpoint"})[0] == 202
    deadline = time.monotonic() + 20
    while not any(
        s.checkpoint_id == checkpoint_id and s.state is SnapshotPhase.ACKNOWLEDGED
        for s in running.agent.status().checkpoints
    ):
        assert time.monotonic() < deadline, running.agent.status()
        time.sleep(0.05)
    status, _ = _post(running, f"/v1/checkpoints/{checkpoint_id}/finalize", {"tasks": TASKS})
    assert status == 200


BAD_REQUESTS = [
    # Ids: a JSON integer from 0 to 2^63-1, nothing coerced.
    ("/v1/checkpoints", b'{"id": "7", "kind": "checkpoint"}', 400, "id must be an integer"),
    ("/v1/checkpoints", b'{"id": 7.0, "kind": "checkpoint"}', 400, "id must be an integer"),
    ("/v1/checkpoints", b'{"id": true, "kind": "checkpoint"}', 400, "id must be an integer"),
    ("/v1/checkpoints", b'{"id": -7, "kind": "savepoint"}', 400, "got -7"),
    ("/v1/checkpoints", b'{"id": 9223372036854775808, "kind": "savepoint"}', 400, "id must"),
    ("/v1/checkpoints", b'{"id": 7, "kind": 5}', 400, "kind must be one of"),
    ("/v1/checkpoints", b'{"id": 7, "kind": "checkpoint", "after": "later"}', 400, "after must"),
    ("/v1/checkpoints", b'{"kind": "checkpoint"}', 400, "field 'id' is missing"),
    ("/v1/checkpoints/007/complete", b'{"batchId": 2}', 400, "the id in the path"),
    ("/v1/checkpoints/9223372036854775808/abort", b"{}", 400, "the id in the path"),
    # Batch ids likewise; numbers JSON cannot hold.
    ("/v1/checkpoints/1/complete", b'{"batchId": "2"}', 400, "batchId must be an integer"),
    ("/v1/checkpoints/1/complete", b'{"batchId": 1e999}', 400, "got inf"),
    ("/v1/checkpoints/1/complete", b'{"batchId": NaN}', 400, "NaN is not a JSON number"),
    ("/v1/checkpoints/1/complete", b'{"batchId": ' + b"9" * 5000 + b"}", 400, "not JSON"),
    ("/v1/checkpoints/1/complete", b"{}", 400, "field 'batchId' is missing"),
    # Bodies that are not a JSON object.
    ("/v1/checkpoints/1/abort", b"[]", 400, "must be a JSON object, got list"),
    ("/v1/checkpoints/1/abort", b'"stop"', 400, "must be a JSON object, got str"),
    ("/v1/checkpoints/1/abort", b"", 400, "not JSON"),
    ("/v1/checkpoints/1/abort", b'{"reason": 5}', 400, "reason must be a string"),
    ("/v1/checkpoints/1/abort", b"\xff\xfe{}", 400, "not JSON in UTF-8"),
    # JSON is UTF-8 (RFC 8259); json.loads took UTF-16 and UTF-32 bytes too (a reviewer's).
    ("/v1/checkpoints", '{"id": 1, "kind": "checkpoint"}'.encode("utf-16"), 400, "UTF-8"),
    ("/v1/checkpoints/1/abort", "{}".encode("utf-32-le"), 400, "not JSON"),
    ("/v1/checkpoints/1/abort", b"\xef\xbb\xbf{}", 400, "not JSON"),  # a byte order mark
    ("/v1/checkpoints", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    # aiohttp's own 413 was a text/plain page, no error answer.
    ("/v1/checkpoints/1/abort", b" " * (MAX_BODY_BYTES + 1), 413, "larger than 16777216 bytes"),
    ("/v1/checkpoints/1/finalize", b'{"tasks": "logs"}', 400, "tasks must be a list"),
    ("/v1/checkpoints/1/finalize", b'{"tasks": ["logs", 0]}', 400, "tasks[1] must be a string"),
    ("/v1/checkpoints/1/discard", b'{"retained": [2, "3"]}', 400, "retained[1] must be"),
    ("/v1/storage/collect-garbage", b'{"checkpoints": [], "savepoints": [-1]}', 400, "savepoints"),
    ("/v1/storage/collect-garbage", b'{"checkpoints": {}}', 400, "checkpoints must be a list"),
]


@pytest.mark.parametrize(("path", "body", "status", "message"), BAD_REQUESTS)
def test_a_bad_request_is_refused_naming_the_problem_and_changes_nothing(
    running: Running, path: str, body: bytes, status: int, message: str
) -> None:
    _finalized(running, 1)  # something a wrong request could damage
    before = running.side_effects()

    answer = raw_request(running.port, b"POST", path.encode(), body)

    assert (answer.status, message in answer.error()) == (status, True), answer
    assert running.side_effects() == before


def test_an_id_in_other_scripts_digits_is_no_route(running: Running) -> None:
    before = running.side_effects()
    # U+0663 ARABIC-INDIC DIGIT THREE: int() reads it as 3; the route does not match it.
    answer = raw_request(running.port, b"POST", b"/v1/checkpoints/%D9%A3/abort", b"{}")
    assert answer.status == 404
    assert running.side_effects() == before


def test_completing_an_unknown_checkpoint_commits_nothing(running: Running) -> None:
    status, body = _post(running, "/v1/checkpoints/424242/complete", {"batchId": 1_000_000_000})

    assert (status, body) == (404, {"error": "checkpoint 424242 is unknown"})
    assert running.participant.completed == []
    assert running.agent.status().awaiting_final_checkpoint is False


def test_completing_a_checkpoint_at_another_batch_commits_nothing(running: Running) -> None:
    _finalized(running, 1)  # an image of batch 2
    before = running.side_effects()

    status, body = _post(running, "/v1/checkpoints/1/complete", {"batchId": 1_000_000_000})

    assert status == 409
    assert body["error"] == "checkpoint 1 is an image of batch 2, not of batch 1000000000"
    assert running.side_effects() == before
    assert _post(running, "/v1/checkpoints/1/complete", {"batchId": 2}) == (
        200,
        {"notified": True},
    )
    assert _post(running, "/v1/checkpoints/1/complete", {"batchId": 2})[0] == 200, "a repeat"
    assert running.participant.completed == [2, 2]


def test_completing_an_image_that_is_not_finalized_commits_nothing(running: Running) -> None:
    assert _post(running, "/v1/checkpoints", {"id": 4, "kind": "checkpoint"})[0] == 202
    deadline = time.monotonic() + 20
    while running.agent.status().checkpoints[0].state is not SnapshotPhase.ACKNOWLEDGED:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    status, body = _post(running, "/v1/checkpoints/4/complete", {"batchId": 2})

    assert status == 409 and "only a finalized image can complete" in str(body["error"])
    assert running.participant.completed == []
    assert not (running.root / "storage/default/wordcount/chk-4").exists()


def test_collecting_garbage_for_a_registry_storage_disagrees_with_deletes_nothing(
    running: Running,
) -> None:
    _finalized(running, 1)  # chk-1 exists; the request says only chk-1000000000 is retained
    assert _post(running, "/v1/checkpoints/1/complete", {"batchId": 2})[0] == 200
    before = running.side_effects()

    status, body = _post(
        running, "/v1/storage/collect-garbage", {"checkpoints": [1_000_000_000], "savepoints": []}
    )

    assert status == 409, body
    assert str(body["error"]).startswith("storage disagrees with the registry, nothing collected: ")
    assert "chk-1000000000/_metadata" in str(body["error"])
    assert running.side_effects() == before


def test_discarding_a_checkpoint_whose_retained_image_storage_lacks_deletes_nothing(
    running: Running,
) -> None:
    """The same disagreement as collect-garbage's, answered the same way: the request's
    conflict with storage, not the agent's failure."""
    _finalized(running, 1)
    assert _post(running, "/v1/checkpoints/1/complete", {"batchId": 2})[0] == 200
    before = running.side_effects()

    status, body = _post(running, "/v1/checkpoints/1/discard", {"retained": [1_000_000_000]})

    assert status == 409, body
    assert str(body["error"]).startswith("storage disagrees with the registry, nothing discarded: ")
    assert "chk-1000000000/_metadata" in str(body["error"])
    assert running.side_effects() == before


@pytest.mark.parametrize(
    ("path", "body", "operation"),
    [
        ("/v1/checkpoints/1/discard", {"retained": []}, "discard_checkpoint"),
        ("/v1/storage/collect-garbage", {"checkpoints": [], "savepoints": []}, "collect_garbage"),
    ],
)
def test_storage_that_cannot_be_used_is_a_storage_error_not_a_disagreement(
    running: Running,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict[str, list[int]],
    operation: str,
) -> None:
    """Refused credentials are no disagreement with the registry, and the deletes may have
    begun: the agent's failure (500), never "nothing discarded"."""

    def refused(*args: object) -> None:
        raise StorageAccessError("s3://bucket/default/wordcount", "AccessDenied: not allowed")

    monkeypatch.setattr(running.storage, operation, refused)

    status, answer = _post(running, path, body)

    assert (status, answer) == (
        500,
        {"error": "storage: s3://bucket/default/wordcount: AccessDenied: not allowed"},
    )


def test_a_negative_savepoint_id_writes_nothing(running: Running) -> None:
    status, _ = _post(running, "/v1/checkpoints", {"id": -7, "kind": "savepoint"})
    time.sleep(0.3)  # a capture would have started copying by now

    assert status == 400
    assert not (running.root / "storage").exists()
    assert not (running.root / "pins").exists()


@pytest.mark.parametrize(
    "authorization", [b"Bearer \xff\xfe", b"\xc3\x28", b"Bearer s3cret-token\x80", b""]
)
def test_a_token_that_is_not_utf8_is_unauthorized(running: Running, authorization: bytes) -> None:
    answer = raw_request(
        running.port,
        b"GET",
        b"/v1/status",
        token=None,
        headers=((b"Authorization", authorization),),
    )

    assert answer.status == 401
    assert answer.error() == "missing or wrong bearer token"


def test_the_upper_id_bound_is_accepted(running: Running) -> None:
    status, body = _post(running, f"/v1/checkpoints/{MAX_ID}/abort", {"reason": "probe"})
    assert (status, body) == (200, {"aborted": True})


JOIN_STORES = ("keyToNumValues", "keyWithIndexToValue")


def test_a_finalize_listing_tens_of_thousands_of_tasks_is_taken(running: Running) -> None:
    """aiohttp reads at most 1 MiB by default: a finalize of a stream-stream join at 8,000
    partitions (40,000 tasks, 1.4 MB) was refused with a 413 at every checkpoint (a
    reviewer's). Its length is what counts here: the agent knows none of these tasks."""
    join = [f"{side}-{store}" for side in ("left", "right") for store in JOIN_STORES]
    stores = [(0, store) for store in join] + [(1, "default")]  # and an aggregation
    tasks = [f"state-{op}-{partition}-{store}" for op, store in stores for partition in range(8000)]
    body = json.dumps({"tasks": tasks}).encode()
    assert len(body) > 1024**2

    answer = raw_request(running.port, b"POST", b"/v1/checkpoints/1/finalize", body)

    assert answer.status != 413, answer


def test_requests_that_are_not_http_are_refused_and_said_in_one_line_a_minute(
    running: Running, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp logged each at ERROR with its traceback (500-750 bytes), token or not: whoever
    reaches the agent's port could fill the driver's log (a hostile reviewer's)."""
    malformed = [
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
        b"POST /v1/checkpoints HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
        b"GET /v1/status HTTP/9.9\r\nHost: x\r\n\r\n",
    ]
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    said_before = getattr(server, "_MALFORMED_REQUESTS", None)
    if said_before is not None:  # none said earlier in this process
        monkeypatch.setattr(said_before.said, "_said", -math.inf)
    answers = []
    for request in malformed:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as connection:
            connection.sendall(request)
            answers.append(connection.recv(100).split(b"\r\n", 1)[0].split(b" ", 1)[1])
    time.sleep(0.2)

    assert answers == [b"400 Bad Request"] * len(malformed)
    said = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [(r.levelname, r.exc_info) for r in said] == [("WARNING", None)], said
    assert said[0].getMessage().startswith("refused a request from 127.0.0.1 that is not valid")


def test_aiohttps_quiet_lines_about_requests_that_are_no_http_stay_quiet() -> None:
    """A first request that is no HTTP at all (a TLS probe) aiohttp logs at DEBUG: left as
    it is, it neither becomes a warning nor uses up the minute's line (a reviewer's)."""
    probe = HttpProcessingError(message="Received HTTPS traffic")
    record = logging.LogRecord(
        "aiohttp.server",
        logging.DEBUG,
        __file__,
        1,
        "Error handling request from %s",
        ("127.0.0.1",),
        (type(probe), probe, None),
    )

    assert server._MalformedRequests().filter(record)
    assert (record.levelname, record.getMessage()) == (
        "DEBUG",
        "Error handling request from 127.0.0.1",
    )


def test_a_connection_whose_headers_do_not_end_is_closed_after_the_idle_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's default held such a connection for an hour: whoever reaches the port could
    hold a socket each with a header byte every few seconds (a security review's)."""
    monkeypatch.setattr(server, "IDLE_CONNECTION_SECONDS", 0.5)
    running = Running(tmp_path)
    running.server.start()
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as connection:
            connection.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            for _ in range(4):  # a byte now and then does not keep it open
                time.sleep(0.2)
                with contextlib.suppress(OSError):
                    connection.sendall(b"X")
            assert connection.recv(100) == b""  # closed by the agent, nothing answered
            assert time.monotonic() - started < 5
        # A client's next request on a new connection is answered.
        assert raw_request(running.port, b"GET", b"/v1/status").status == 200
    finally:
        running.server.stop()
        running.agent.close()


def test_a_body_that_does_not_all_come_is_answered_408_after_the_idle_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its headers complete, its body short of its Content-Length: the request held its
    connection for ever (a security review's: 40 s and counting)."""
    monkeypatch.setattr(server, "IDLE_CONNECTION_SECONDS", 0.5)
    running = Running(tmp_path)
    running.server.start()
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as connection:
            connection.sendall(
                b"POST /v1/checkpoints HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            answer = b""
            # The answer, not the connection's end: aiohttp reads on for a while (its
            # lingering time, bounded) before it closes a connection whose body is unread.
            while b's"}' not in answer and (chunk := connection.recv(65536)):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert answer.endswith(b'{"error": "the body did not all come in 0.5 s"}'), answer
    finally:
        running.server.stop()
        running.agent.close()


def test_a_request_of_too_many_or_too_long_header_lines_is_refused(running: Running) -> None:
    """aiohttp read 128 lines of 8 KiB each: about 2 MiB per connection whose headers never
    end (a security review's)."""
    many = tuple((b"X-%d" % n, b"1") for n in range(server.MAX_REQUEST_HEADERS))
    long = ((b"X-Long", b"a" * (server.MAX_HEADER_FIELD_BYTES + 1)),)
    for headers in (many, long):
        answer = raw_request(running.port, b"GET", b"/v1/status", headers=headers)
        assert answer.status == 400, answer
    # What the client sends is far within both.
    fewer = tuple((b"X-%d" % n, b"1") for n in range(server.MAX_REQUEST_HEADERS // 2))
    assert raw_request(running.port, b"GET", b"/v1/status", headers=fewer).status == 200


_OUT_OF_DESCRIPTORS = """
import logging, os, resource, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from helpers.agent import Running
logging.basicConfig(level=logging.INFO)
running = Running(Path({root!r}))
running.server.start()
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 10, hard))
print(running.port, flush=True)
time.sleep(3)
"""


def test_connections_beyond_the_drivers_descriptors_are_said_in_one_line(tmp_path: Path) -> None:
    """Once no connection could be accepted, asyncio logged every failed accept() at ERROR
    with a traceback, thousands a second: 43 MB of driver log in 25 s (a security
    review's)."""
    script = _OUT_OF_DESCRIPTORS.format(tests=str(Path(__file__).parents[1]), root=str(tmp_path))
    driver = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert driver.stdout is not None
    port = int(driver.stdout.readline())
    connections = []
    try:
        for _ in range(40):
            connections.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        _, log = driver.communicate(timeout=30)
    finally:
        for connection in connections:
            connection.close()
        driver.kill()
    lines = log.decode().splitlines()
    assert "Traceback (most recent call last):" not in lines, "\n".join(lines[:20])
    said = [line for line in lines if "cannot accept connections to the agent" in line]
    assert len(said) == 1, lines
    assert "Too many open files" in said[0]
