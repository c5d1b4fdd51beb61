"""Fuzzing the agent's HTTP API (issue 12, "Fuzz the agent API"): hypothesis draws the
method, the path and its id, the headers and the body (valid JSON, hostile JSON, bytes)
and sends them over real HTTP to the real agent server, holding it to three rules:

- never a 5xx;
- never a traceback (nor any error) in the log;
- no side effect on rejection: a 4xx writes no file, starts no snapshot, and no sink
  commits.

Requests that succeed do change things (a trigger starts a snapshot, a finalize writes
`_metadata`): the test lets them settle and takes what they did as the new baseline.
"""

import json
import logging
import string
import time
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers.agent import TOKEN, RawAnswer, Running, raw_request
from spark_checkpoint.protocol import SnapshotPhase

TASKS = ["logs", "state-0-0", "state-0-1"]
# Each route with a body the agent accepts; the fuzz sends it as is, with one field
# replaced or left out, or something else entirely.
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/v1/status", {}),
    ("POST", "/v1/checkpoints", {"id": 1, "kind": "checkpoint", "after": "continue"}),
    ("POST", "/v1/checkpoints/{id}/finalize", {"tasks": TASKS}),
    ("POST", "/v1/checkpoints/{id}/complete", {"batchId": 2}),
    ("POST", "/v1/checkpoints/{id}/abort", {"reason": "expired"}),
    ("POST", "/v1/checkpoints/{id}/discard", {"retained": []}),
    ("POST", "/v1/savepoints/{id}/discard", {}),
    ("POST", "/v1/storage/collect-garbage", {"checkpoints": [], "savepoints": []}),
]
FIELDS = [
    "id",
    "kind",
    "after",
    "tasks",
    "batchId",
    "reason",
    "retained",
    "checkpoints",
    "savepoints",
]

# Ids that are real for the agent under test (so that some requests reach its logic) and
# every kind of almost-id.
real_ids = st.sampled_from([1, 2, 3])
integers = st.one_of(
    real_ids,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 2**63 - 1, 2**63, -1, 10**9]),
)
almost_ids = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    integers.map(str),
    st.sampled_from(["\u0663", "\uff13", "1_000", " 7", "0x1f", "1e3", "", "007"]),
)
json_leaves = st.one_of(st.none(), st.booleans(), integers, st.floats(), st.text(max_size=20))
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
field_values = st.one_of(
    integers,
    almost_ids,
    st.sampled_from(["checkpoint", "savepoint", "continue", "stop", "drain", "logs"]),
    st.lists(st.one_of(integers, almost_ids), max_size=4),
    st.just(TASKS),
    json_values,
)
# Objects made of the protocol's own field names, so that validation and the agent's
# logic are reached rather than the "not an object" check only.
protocol_objects = st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=4)


def _encode(value: Any) -> bytes:
    # allow_nan: also NaN and Infinity, which are not JSON but a sender may still write.
    return json.dumps(value, allow_nan=True).encode()


bodies = st.one_of(
    protocol_objects.map(_encode),
    json_values.map(_encode),
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b'{"batchId": 1e999}',
            b'{"id": -0}',
            b'{"batchId": ' + b"9" * 5000 + b"}",
            b"[" * 50_000 + b"]" * 50_000,
            b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
            b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
            '{"id": 1, "kind": "checkpoint"}'.encode("utf-16"),
        ]
    ),
)
id_segments = st.one_of(
    integers.map(str),
    st.sampled_from(["%D9%A3", "%EF%BC%93", "-1", "007", "1e3", "abc", "%00", "..", "1%2F2"]),
    st.text(alphabet=string.ascii_letters + string.digits + "-._~%", min_size=1, max_size=12),
)


@st.composite
def near_valid_bodies(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    body = dict(valid)
    change = draw(st.sampled_from(["none", "replace", "replace", "drop"]))
    if change == "replace":
        body[draw(st.sampled_from(sorted(body) or FIELDS))] = draw(field_values)
    elif change == "drop" and body:
        del body[draw(st.sampled_from(sorted(body)))]
    return _encode(body)


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, bytes, bytes, tuple[tuple[bytes, bytes], ...]]:
    method, template, valid = draw(st.sampled_from(ROUTES))
    method = draw(st.sampled_from([method] * 6 + ["GET", "PUT", "DELETE"]))
    path = template.replace("{id}", draw(st.one_of(real_ids.map(str), id_segments)))
    path += draw(st.sampled_from([""] * 6 + ["?wait=1&after=x", "?after=-1", "/", "?%ff"]))
    body = draw(st.one_of(near_valid_bodies(valid), near_valid_bodies(valid), bodies))
    right = b"Bearer " + TOKEN.encode()
    authorization = draw(
        st.sampled_from(
            [right] * 12
            + [b"Bearer wrong", b"Bearer \xff\xfe", b"bearer " + TOKEN.encode(), right + b"\x80"]
        )
    )
    content_type = draw(
        st.sampled_from([b"application/json", b"text/plain", b"application/json; charset=latin-1"])
    )
    headers = ((b"Authorization", authorization), (b"Content-Type", content_type))
    return method.encode(), path.encode(), body, headers


class _Errors(logging.Handler):
    """Every log record at WARNING or above that carries a traceback, or is an error."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(record)


def _settle(running: Running) -> None:
    """Wait until no snapshot is still capturing or copying, so that what a successful
    trigger does has happened before the next baseline."""
    deadline = time.monotonic() + 20
    while any(
        s.state in (SnapshotPhase.CAPTURING, SnapshotPhase.COPYING) and not s.declines
        for s in running.agent.status().checkpoints
    ):
        assert time.monotonic() < deadline, running.agent.status()
        time.sleep(0.02)


def _describe(answer: RawAnswer) -> str:
    return f"{answer.status} {answer.body[:300]!r}"


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
def test_no_request_gets_a_5xx_a_traceback_or_a_side_effect_when_refused(
    running: Running,
    request: tuple[bytes, bytes, bytes, tuple[tuple[bytes, bytes], ...]],
) -> None:
    method, path, body, headers = request
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    try:
        _settle(running)
        before = running.side_effects()
        answer = raw_request(running.port, method, path, body, headers=headers, token=None)
        if answer.status < 400:
            _settle(running)
        after = running.side_effects()
    finally:
        logging.getLogger().removeHandler(errors)

    event(f"answered {answer.status}")  # --hypothesis-show-statistics: what was reached
    assert answer.status < 500, _describe(answer)
    assert not errors.records, [errors.format(record) for record in errors.records]
    if answer.status >= 400:
        assert after == before, _describe(answer)
        if b"application/json" in answer.headers:
            assert json.loads(answer.body)["error"], _describe(answer)
