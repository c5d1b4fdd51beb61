"""docs/agent-protocol.md's JSON examples, sent to and compared with a real agent over HTTP.

Each example belongs to the endpoint of the heading above it (`### POST /v1/...`): the first
example under a POST heading is its request body, a later one its answer; under GET, the
answer. The test walks the documented cycle in the doc's own terms (trigger 7, finalize,
complete, abort, discard 7 keeping 8 and 9, collect garbage): every documented request must
be accepted as written, and every documented answer must have the fields, nested the same
way, that the agent's real answer has. The agent runs on a synthetic live checkpoint location
(no Spark), as in tests/data_plane/test_agent.py.
"""

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.agent import live_location
from helpers.doc_blocks import ROOT, Block, marked_blocks
from helpers.ports import free_port
from spark_checkpoint.agent.agent import CheckpointAgent, QueryView
from spark_checkpoint.agent.server import AgentServer
from spark_checkpoint.protocol import QueryProgress, QueryState
from spark_checkpoint.sink import TransactionalFileSink
from spark_checkpoint.storage import CheckpointStorage, JobStorageLayout

DOC = Path("docs/agent-protocol.md")
TOKEN = "docs-token"
_HEADING = re.compile(r"^#+ `(GET|POST) (/v1/[^`]*)`")


@dataclass(frozen=True)
class Example:
    method: str
    route: str  # as documented, with {id}
    role: str  # "request" or "answer"
    body: Any
    block: Block


def _examples(blocks: list[Block]) -> dict[tuple[str, str], Example]:
    text = (ROOT / DOC).read_text().splitlines()
    found: dict[tuple[str, str], Example] = {}
    for block in blocks:
        assert block.doc == DOC.as_posix(), f"{block}: this test reads {DOC} only"
        heading = next(
            (m for line in reversed(text[: block.line - 1]) if (m := _HEADING.match(line))),
            None,
        )
        assert heading, f"{block}: no `### METHOD /v1/...` heading above it"
        method, route = heading[1], heading[2]
        earlier = [e for e in found.values() if (e.method, e.route) == (method, route)]
        role = "request" if method == "POST" and not earlier else "answer"
        assert (route, role) not in found, f"{block}: a second {role} example for {route}"
        found[route, role] = Example(method, route, role, json.loads(block.text), block)
    return found


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    agent = CheckpointAgent(
        storage=CheckpointStorage(
            JobStorageLayout((tmp_path / "storage").as_uri(), "default", "wordcount")
        ),
        location=live_location(tmp_path, batches=3),
        pin_root=tmp_path / "pins",
        participants=[TransactionalFileSink(tmp_path / "output")],
        attempt=1,
    )
    agent.query_started(
        lambda: QueryView(QueryState.RUNNING, progress=QueryProgress(2, 120, 40.5, 360)),
        None,
        lambda moment: True,
    )
    port = free_port()
    server = AgentServer(agent, TOKEN, "127.0.0.1", port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
    agent.close()


def _call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _differences(documented: Any, real: Any, where: str = "") -> list[str]:
    """Where the two documents differ in shape: an object's keys, nested; a list's elements
    by its first one (when both have one); whether a value is an object or a list."""
    if isinstance(documented, dict) and isinstance(real, dict):
        missing = [f"{where}.{k}: not in the answer" for k in documented.keys() - real.keys()]
        extra = [f"{where}.{k}: not documented" for k in real.keys() - documented.keys()]
        nested = [
            d
            for k in documented.keys() & real.keys()
            for d in _differences(documented[k], real[k], f"{where}.{k}")
        ]
        return missing + extra + nested
    if isinstance(documented, list) and isinstance(real, list):
        return _differences(documented[0], real[0], f"{where}[]") if documented and real else []
    documented_kind, real_kind = (
        type(d).__name__ if isinstance(d, dict | list) else "value" for d in (documented, real)
    )
    if documented_kind != real_kind:
        return [f"{where}: {documented_kind} documented, {real_kind} answered"]
    return []


def _same_fields(example: Example, real: Any) -> None:
    differences = _differences(example.body, real)
    assert not differences, (
        f"{example.block}: the documented answer of {example.method} {example.route} is not "
        f"shaped like the agent's: {differences}\ndocumented: {json.dumps(example.body)}\n"
        f"real: {json.dumps(real)}"
    )


def test_agent_protocol_examples_are_what_a_real_agent_accepts_and_answers(
    agent_url: str,
) -> None:
    examples = _examples(
        marked_blocks(
            "tests/docs/test_agent_protocol_examples.py::"
            "test_agent_protocol_examples_are_what_a_real_agent_accepts_and_answers"
        )
    )

    exercised: set[tuple[str, str]] = set()

    def post(route: str, checkpoint_id: int, body: Any = None) -> Any:
        exercised.update({(route, "request"), (route, "answer")})
        example = examples.get((route, "request"))
        sent = body if body is not None else (example.body if example else {})
        path = route.replace("{id}", str(checkpoint_id))
        status, answer = _call(agent_url, "POST", path, sent)
        where = example.block if example else route
        assert 200 <= status < 300, f"{where}: POST {path} {json.dumps(sent)} -> {status} {answer}"
        if (route, "answer") in examples:
            _same_fields(examples[route, "answer"], answer)
        return answer

    def acknowledged(checkpoint_id: int) -> Any:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            _, status = _call(agent_url, "GET", "/v1/status")
            if any(
                s["id"] == checkpoint_id and s["state"] == "acknowledged"
                for s in status["checkpoints"]
            ):
                return status
            time.sleep(0.05)
        raise AssertionError(f"checkpoint {checkpoint_id} was never acknowledged: {status}")

    trigger = examples["/v1/checkpoints", "request"].body
    first = trigger["id"]
    # The documented ids: checkpoint 7 is discarded while 8 and 9 are retained.
    retained = examples["/v1/checkpoints/{id}/discard", "request"].body["retained"]
    for checkpoint_id in [first, *retained]:
        post("/v1/checkpoints", checkpoint_id, {**trigger, "id": checkpoint_id})
        status = acknowledged(checkpoint_id)
        if checkpoint_id == first:
            _same_fields(examples["/v1/status", "answer"], status)
            exercised.add(("/v1/status", "answer"))
        post("/v1/checkpoints/{id}/finalize", checkpoint_id)
        post("/v1/checkpoints/{id}/complete", checkpoint_id)
    post("/v1/checkpoints/{id}/abort", first)
    post("/v1/checkpoints/{id}/discard", first)
    post("/v1/storage/collect-garbage", first)
    unused = examples.keys() - exercised
    assert not unused, f"examples this test does not exercise: {sorted(unused)}"
