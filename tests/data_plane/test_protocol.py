"""The wire contract (spark_checkpoint.protocol): every document survives JSON unchanged,
whatever its fields hold; what the real agent serves parses; a hostile document is one
`ProtocolError` naming its field; the module needs only the standard library."""

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grimp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.agent import Running, raw_request
from spark_checkpoint import protocol
from spark_checkpoint.protocol import (
    MAX_ID,
    AbortBody,
    Acknowledgement,
    AckReport,
    AfterCompletion,
    AgentStatus,
    CheckpointKind,
    CollectGarbageAnswer,
    CollectGarbageBody,
    CompleteBody,
    DeclineReport,
    DiscardCheckpointBody,
    ErrorAnswer,
    FinalizeAnswer,
    FinalizeBody,
    ProtocolError,
    QueryProgress,
    QueryState,
    QueryStatus,
    RestoreCandidate,
    RestoredFrom,
    SkippedImage,
    SnapshotPhase,
    SnapshotStatus,
    TriggerBody,
)

# Edge values first: hypothesis shrinks towards them and draws them often.
ids = st.one_of(st.sampled_from([0, 1, MAX_ID]), st.integers(0, MAX_ID))
texts = st.text()  # any Unicode, the empty string and lone surrogates included
id_tuples = st.lists(ids, max_size=5).map(tuple)
candidates = st.one_of(
    st.builds(RestoreCandidate.registered, st.sampled_from(CheckpointKind), ids),
    # Anything after "external:" is the URI, colons and commas included.
    st.builds(RestoreCandidate.external, st.text(min_size=1)),
)
acks = st.builds(AckReport, texts, ids, ids, ids)
declines = st.builds(DeclineReport, texts, texts)
snapshots = st.builds(
    SnapshotStatus,
    ids,
    st.sampled_from(CheckpointKind),
    st.sampled_from(SnapshotPhase),
    st.none() | ids,
    st.lists(acks, max_size=3).map(tuple),
    st.lists(declines, max_size=3).map(tuple),
)
restored = st.builds(
    RestoredFrom,
    candidates,
    ids,
    st.lists(st.builds(SkippedImage, candidates, texts), max_size=3).map(tuple),
)
progresses = st.builds(
    QueryProgress,
    ids,
    ids,
    st.none() | st.floats(min_value=0, allow_infinity=False) | st.sampled_from([0.0, 1e308]),
    ids,
)
statuses = st.builds(
    AgentStatus,
    st.none() | ids,
    ids,
    st.builds(
        QueryStatus,
        st.sampled_from(QueryState),
        texts,
        st.none() | ids,
        st.none() | progresses,
    ),
    st.lists(texts, max_size=4).map(tuple),
    st.booleans(),
    st.booleans(),
    st.none() | restored,
    st.lists(snapshots, max_size=3).map(tuple),
)
documents = st.one_of(
    statuses,
    st.builds(TriggerBody, ids, st.sampled_from(CheckpointKind), st.sampled_from(AfterCompletion)),
    st.builds(FinalizeBody, st.lists(texts, max_size=4).map(tuple)),
    st.builds(FinalizeAnswer, texts, ids),
    st.builds(CompleteBody, ids),
    st.builds(AbortBody, texts),
    st.builds(DiscardCheckpointBody, id_tuples),
    st.builds(CollectGarbageBody, id_tuples, id_tuples),
    st.builds(CollectGarbageAnswer, id_tuples, id_tuples, ids),
    st.builds(ErrorAnswer, texts),
)


def _over_the_wire(value: Any) -> Any:
    # surrogatepass: a lone surrogate is a string JSON can carry (as an escape).
    return json.loads(json.dumps(value, ensure_ascii=True))


@given(documents)
def test_every_document_reads_back_what_was_written(document: Any) -> None:
    written = _over_the_wire(document.to_json())

    assert type(document).from_json(written) == document
    assert type(document).from_json(written).to_json() == written


@given(candidates)
def test_a_restore_candidate_decodes_to_itself(candidate: RestoreCandidate) -> None:
    assert RestoreCandidate.decode(candidate.encode()) == candidate


@pytest.mark.parametrize(
    "text",
    [
        "",
        "checkpoint",
        "checkpoint:",
        "checkpoint:007",
        "savepoint:-1",
        "checkpoint:٣",
        f"checkpoint:{MAX_ID + 1}",
        "external:",
        "chk-7",
        "latest:3",
    ],
)
def test_a_malformed_restore_candidate_is_refused(text: str) -> None:
    with pytest.raises(ProtocolError, match="is not checkpoint:N, savepoint:N or external:URI"):
        RestoreCandidate.decode(text)


def test_an_agent_without_long_polls_has_no_version_on_the_wire() -> None:
    status = AgentStatus(None, 1, QueryStatus(QueryState.RUNNING), (), True, False, None, ())

    assert "version" not in status.to_json()
    assert AgentStatus.from_json(status.to_json()).version is None


def _status(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "version": 3,
        "attempt": 1,
        "query": {"state": "running", "message": "", "lastCommittedBatch": 2},
        "tasks": ["logs"],
        "allTasksRunning": True,
        "awaitingFinalCheckpoint": False,
        "restoredFrom": {"source": "checkpoint:4", "batchId": 1, "skipped": []},
        "checkpoints": [
            {
                "id": 7,
                "kind": "checkpoint",
                "state": "copying",
                "batchId": 2,
                "acks": [{"task": "logs", "batchId": 2, "sizeBytes": 9, "durationMs": 1}],
                "declines": [],
            }
        ],
    }
    return document | changes


def _query(**changes: Any) -> dict[str, Any]:
    return {"state": "running", "message": "", "lastCommittedBatch": 2} | changes


def _progress(**changes: Any) -> dict[str, Any]:
    progress = {"batchId": 2, "numInputRows": 5, "inputRowsPerSecond": 9.5, "totalInputRows": 40}
    return progress | changes


HOSTILE = [
    ([], "the status must be a JSON object, got list"),
    (_status(apiVersion="v2"), "apiVersion must be 'v1', got \"v2\""),
    (_status(version="3"), "version must be an integer from 0 to"),
    (_status(version=-1), "version must be an integer from 0 to"),
    (_status(attempt=True), "attempt must be an integer"),
    (_status(query={"state": "running", "message": ""}), "field 'query.lastCommittedBatch' is"),
    (_status(query={"state": "gone", "message": "", "lastCommittedBatch": 1}), "query.state must"),
    (
        _status(query=_query(progress={"batchId": 2, "numInputRows": 5})),
        "field 'query.progress.inputRowsPerSecond' is missing",
    ),
    (
        _status(query=_query(progress=_progress(inputRowsPerSecond="9.5"))),
        'query.progress.inputRowsPerSecond must be a number >= 0, got "9.5"',
    ),
    (
        _status(query=_query(progress=_progress(inputRowsPerSecond=-1))),
        "query.progress.inputRowsPerSecond must be a number >= 0, got -1",
    ),
    (
        _status(query=_query(progress=_progress(numInputRows=2.5))),
        "query.progress.numInputRows must be an integer from 0 to",
    ),
    (_status(tasks="logs"), 'tasks must be a list of task names, got "logs"'),
    (_status(tasks=["logs", None]), "tasks[1] must be a string, got null"),
    (_status(allTasksRunning=1), "allTasksRunning must be true or false, got 1"),
    (_status(restoredFrom={"source": "chk-4", "batchId": 1, "skipped": []}), "restoredFrom.source"),
    (
        _status(restoredFrom={"source": "checkpoint:4", "skipped": []}),
        "field 'restoredFrom.batchId' is missing",
    ),
    (
        _status(restoredFrom={"source": 4, "batchId": 1, "skipped": []}),
        "restoredFrom.source must be a string, got 4",
    ),
    (_status(checkpoints=[{"id": 7}]), "field 'checkpoints[0].kind' is missing"),
    (_status(checkpoints=[7]), "checkpoints[0] must be a JSON object, got int"),
    (
        _status(
            checkpoints=[
                {
                    "id": 7,
                    "kind": "checkpoint",
                    "state": "copying",
                    "batchId": None,
                    "acks": [{"task": "logs", "batchId": 2, "sizeBytes": 1.5, "durationMs": 1}],
                    "declines": [],
                }
            ]
        ),
        "checkpoints[0].acks[0].sizeBytes must be an integer from 0 to 9223372036854775807, "
        "got 1.5",
    ),
]


@pytest.mark.parametrize(("document", "message"), HOSTILE)
def test_a_hostile_status_is_one_line_naming_the_field(document: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        AgentStatus.from_json(document)

    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_a_valid_status_parses() -> None:
    status = AgentStatus.from_json(_status())

    assert status.checkpoints[0].acks[0] == AckReport("logs", 2, 9, 1)
    assert status.restored_from == RestoredFrom(
        RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 4), 1
    )


def test_the_query_progress_is_read_and_optional() -> None:
    with_progress = AgentStatus.from_json(_status(query=_query(progress=_progress())))
    without_rate = _progress(inputRowsPerSecond=None)
    no_rate = AgentStatus.from_json(_status(query=_query(progress=without_rate)))

    assert with_progress.query.progress == QueryProgress(2, 5, 9.5, 40)
    assert no_rate.query.progress == QueryProgress(2, 5, None, 40)
    # An agent from before the field: its status has no progress, and is read.
    assert AgentStatus.from_json(_status()).query.progress is None


def test_what_the_real_agent_serves_parses(tmp_path: Path) -> None:
    """A snapshot the real agent took, with every task's ack, read off its HTTP API."""
    running = Running(tmp_path)  # three committed batches: the image is of batch 2
    running.server.start()
    try:
        running.agent.trigger(3, CheckpointKind.SAVEPOINT, AfterCompletion.STOP)
        deadline = time.monotonic() + 20
        while running.agent.status().checkpoints[0].state is not SnapshotPhase.ACKNOWLEDGED:
            assert time.monotonic() < deadline, running.agent.status()
            time.sleep(0.05)
        served = json.loads(raw_request(running.port, b"GET", b"/v1/status").body)

        status = AgentStatus.from_json(served)
    finally:
        running.server.stop()
        running.agent.close()

    assert status.to_json() == served
    assert (status.version, status.query.last_committed_batch) == (served["version"], 2)
    [snapshot] = status.checkpoints
    assert (snapshot.checkpoint_id, snapshot.kind, snapshot.state, snapshot.batch_id) == (
        3,
        CheckpointKind.SAVEPOINT,
        SnapshotPhase.ACKNOWLEDGED,
        2,
    )
    assert sorted(ack.task for ack in snapshot.acks) == list(status.tasks)
    assert {ack.batch_id for ack in snapshot.acks} == {2}


def test_the_wire_contract_imports_only_the_standard_library() -> None:
    graph = grimp.build_graph("spark_checkpoint", include_external_packages=True)
    imported = graph.find_modules_directly_imported_by(protocol.__name__)

    assert {name.split(".")[0] for name in imported} <= sys.stdlib_module_names


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
readers = st.sampled_from(
    [
        AgentStatus,
        TriggerBody,
        FinalizeBody,
        FinalizeAnswer,
        CompleteBody,
        AbortBody,
        DiscardCheckpointBody,
        CollectGarbageBody,
        CollectGarbageAnswer,
        ErrorAnswer,
    ]
)


def _damaged(document: Any, path: list[int], value: Any) -> Any:
    """``document`` with one value replaced: the one ``path`` leads to, each step the n-th
    (modulo) key of an object or element of a list, stopping early at a leaf."""
    if not path or not isinstance(document, dict | list) or not document:
        return value
    if isinstance(document, dict):
        key = sorted(document)[path[0] % len(document)]
        return document | {key: _damaged(document[key], path[1:], value)}
    index = path[0] % len(document)
    return [*document[:index], _damaged(document[index], path[1:], value), *document[index + 1 :]]


@given(
    documents,
    st.lists(st.integers(0, 10), max_size=5),
    json_values,
)
def test_a_damaged_document_is_read_or_refused_in_one_line(
    document: Any, path: list[int], value: Any
) -> None:
    """Any field of a valid document replaced by any JSON value: the reader returns a
    document or raises one ProtocolError of one line, never another exception."""
    damaged = _damaged(_over_the_wire(document.to_json()), path, value)
    try:
        type(document).from_json(damaged)
    except ProtocolError as error:
        assert "\n" not in str(error) and str(error)


@given(readers, json_values)
def test_any_json_value_is_read_or_refused_in_one_line(reader: Any, value: Any) -> None:
    try:
        reader.from_json(value)
    except ProtocolError as error:
        assert "\n" not in str(error) and str(error)


@given(st.sampled_from(Acknowledgement), json_values)
def test_an_acknowledgement_reads_back_and_anything_else_is_refused_in_one_line(
    acknowledgement: Acknowledgement, value: Any
) -> None:
    assert acknowledgement.read(_over_the_wire(acknowledgement.to_json())) is acknowledgement
    try:
        acknowledgement.read(value)
    except ProtocolError as error:
        assert "\n" not in str(error) and str(error)
    else:  # other fields are ignored, as in every document
        assert value[acknowledgement.value] is True


def test_an_acknowledgement_of_another_command_is_refused_naming_the_field() -> None:
    with pytest.raises(ProtocolError, match="field 'notified' is missing"):
        Acknowledgement.NOTIFIED.read(Acknowledgement.ABORTED.to_json())
    with pytest.raises(ProtocolError, match="accepted must be true, got false"):
        Acknowledgement.ACCEPTED.read({"accepted": False})


DECLINE = DeclineReport("state-0-0", "disk full")
OTHER_NEWS = {
    "query state": lambda s: replace(
        s, query=replace(s.query, state=_other(QueryState, s.query.state))
    ),
    "tasks": lambda s: replace(s, tasks=(*s.tasks, "state-9-9")),
    "all tasks running": lambda s: replace(s, all_tasks_running=not s.all_tasks_running),
    "a snapshot's state": lambda s: _first_snapshot(
        s, lambda snapshot: replace(snapshot, state=_other(SnapshotPhase, snapshot.state))
    ),
    "a decline": lambda s: _first_snapshot(
        s, lambda snapshot: replace(snapshot, declines=(*snapshot.declines, DECLINE))
    ),
    "a new snapshot": lambda s: replace(s, checkpoints=(*s.checkpoints, s.checkpoints[0])),
    "a snapshot gone": lambda s: replace(s, checkpoints=s.checkpoints[1:]),
}


def _other(enum: Any, value: Any) -> Any:
    return next(member for member in enum if member != value)


def _first_snapshot(status: AgentStatus, change: Any) -> AgentStatus:
    return replace(status, checkpoints=(change(status.checkpoints[0]), *status.checkpoints[1:]))


@given(
    statuses.filter(lambda s: s.checkpoints and s.version is not None),
    st.lists(acks, min_size=1, max_size=3),
    progresses,
    st.sampled_from(sorted(OTHER_NEWS)),
    st.data(),
)
def test_a_long_poll_tells_more_acknowledgements_from_other_news(
    earlier: AgentStatus,
    more_acks: list[AckReport],
    progress: QueryProgress,
    news: str,
    data: st.DataObject,
) -> None:
    """What a long poll gathers for a moment (only more acks, whatever the informational
    fields did) and what it answers at once (docs/agent-protocol.md, "Long polls")."""
    version = data.draw(ids.filter(lambda v: v != earlier.version))
    index = data.draw(st.integers(0, len(earlier.checkpoints) - 1))
    snapshots = list(earlier.checkpoints)
    snapshots[index] = replace(snapshots[index], acks=(*snapshots[index].acks, *more_acks))
    acknowledged = replace(
        earlier,
        version=version,
        query=replace(earlier.query, progress=progress, last_committed_batch=version),
        checkpoints=tuple(snapshots),
    )
    assert acknowledged.only_acknowledged_since(earlier)
    assert not replace(acknowledged, version=earlier.version).only_acknowledged_since(earlier)
    assert not OTHER_NEWS[news](acknowledged).only_acknowledged_since(earlier)
