"""The agent over real HTTP against a synthetic live checkpoint location (no Spark):
authentication, the snapshot-finalize-complete cycle, abort, discard and restore."""

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from helpers.agent import TOKEN, Running
from spark_checkpoint.agent import agent as agent_module
from spark_checkpoint.agent import server
from spark_checkpoint.agent.agent import QueryView
from spark_checkpoint.protocol import (
    AfterCompletion,
    AgentStatus,
    QueryProgress,
    QueryState,
    RestoreCandidate,
    RestoredFrom,
    StorageOwner,
)
from spark_checkpoint.restore import RestoreFailed, restore
from spark_checkpoint.settings import DriverSettings
from spark_checkpoint.storage import CheckpointKind, CheckpointStorage, JobStorageLayout
from spark_checkpoint.storage.layout import snapshot_dir_name
from spark_checkpoint_operator.agent_client import AgentClient, AgentRejected, AgentUnavailable


def _call(client: AgentClient, method: str, *args: Any) -> Any:
    async def go() -> Any:
        try:
            return await getattr(client, method)(*args)
        finally:
            await client.close()

    return asyncio.run(go())


def _status(client: AgentClient) -> dict[str, Any]:
    """The status document as the agent sent it (the client checked it on the way in)."""
    return dict(_call(client, "read_status").to_json())


def _wait_for(client: AgentClient, checkpoint_id: int, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = _status(client)
        for snapshot in status["checkpoints"]:
            if snapshot["id"] == checkpoint_id and snapshot["state"] == state:
                return dict(snapshot)
        time.sleep(0.05)
    raise AssertionError(f"checkpoint {checkpoint_id} never reached {state}: {status}")


def test_every_call_needs_the_bearer_token(running: Running) -> None:
    with pytest.raises(AgentRejected, match="401"):
        _call(running.client("wrong"), "read_status")
    with pytest.raises(AgentRejected, match="401"):
        _call(running.client(""), "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    assert _status(running.client())["query"]["lastCommittedBatch"] == 2


def test_status_reports_tasks_and_last_committed_batch(running: Running) -> None:
    status = _status(running.client())
    assert status["tasks"] == ["logs", "state-0-0", "state-0-1"]
    assert status["allTasksRunning"] is True
    assert status["checkpoints"] == []


def test_until_its_query_started_the_agent_answers_starting_and_snapshots_nothing(
    tmp_path: Path,
) -> None:
    """While the driver restores (the live location already holds the image's commits) and
    starts its query, the agent answers: the query is starting, with no batch, task or
    restore to report; a trigger waits for the query instead of copying the half-restored
    location. Then the status is the query's."""
    job = Running(tmp_path, query_started=False)
    job.server.start()
    try:
        client = job.client()
        status = _status(client)
        assert status["query"] == {
            "state": "starting",
            "message": "",
            "lastCommittedBatch": None,
            "progress": None,
        }
        assert (status["tasks"], status["allTasksRunning"], status["restoredFrom"]) == (
            [],
            False,
            None,
        )
        _call(client, "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
        time.sleep(0.5)
        (snapshot,) = _status(client)["checkpoints"]
        assert (snapshot["state"], snapshot["batchId"]) == ("capturing", None)

        restored = RestoredFrom(RestoreCandidate.decode("checkpoint:7"), batch_id=1)
        job.agent.query_started(lambda: job.view, restored, lambda moment: job.drained)
        assert _wait_for(client, 1, "acknowledged")["acks"][0]["batchId"] == 2
        status = _status(client)
        assert (status["query"]["state"], status["query"]["lastCommittedBatch"]) == ("running", 2)
        assert status["tasks"] == ["logs", "state-0-0", "state-0-1"]
        assert status["restoredFrom"] == restored.to_json()
    finally:
        job.server.stop()
        job.agent.close()


def test_checkpoint_cycle_writes_metadata_and_notifies_participants(running: Running) -> None:
    client = running.client()
    _call(client, "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    snapshot = _wait_for(client, 1, "acknowledged")
    assert {a["task"] for a in snapshot["acks"]} == {"logs", "state-0-0", "state-0-1"}
    assert {a["batchId"] for a in snapshot["acks"]} == {2}

    finalized = _call(client, "finalize", 1, ["logs", "state-0-0", "state-0-1"])
    assert finalized.path.endswith("/default/wordcount/chk-1/_metadata")
    metadata = running.storage.read_metadata(CheckpointKind.CHECKPOINT, 1)
    running.storage.verify(metadata)
    assert (metadata.batch_id, metadata.query_id, metadata.total_bytes) == (
        2,
        "0b7c6a0e-query",
        finalized.size_bytes,
    )
    assert "state/0/1/3.delta" in {f.path for f in metadata.files}
    assert "offsets/2" in {f.path for f in metadata.files}

    _call(client, "complete", 1, 2)
    assert running.participant.completed == [2]
    assert running.agent.stop_requested is False
    assert _status(client)["checkpoints"] == []


def test_a_repeated_finalize_gets_the_first_ones_answer_and_never_reopens_the_image(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finalize repeated while the first was writing (a proxy's replay) wrote _metadata
    again and, ending after the completion, moved the image back from completed to
    finalized: in flight again, garbage collection refused, and an abort of it deleted a
    registered checkpoint whose batch the sinks had committed (a hostile reviewer's)."""
    client = running.client()
    tasks = ["logs", "state-0-0", "state-0-1"]
    _call(client, "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    _wait_for(client, 1, "acknowledged")
    writes: list[int] = []
    write_metadata = running.storage.write_metadata

    def slow_write(metadata: Any) -> None:
        writes.append(metadata.checkpoint_id)
        time.sleep(0.5)  # an object store's
        write_metadata(metadata)

    monkeypatch.setattr(running.storage, "write_metadata", slow_write)
    answers: list[Any] = []

    def finalize() -> None:  # a client of its own: each thread runs an event loop
        answers.append(_call(running.client(), "finalize", 1, tasks))

    first, repeated = threading.Thread(target=finalize), threading.Thread(target=finalize)
    first.start()
    time.sleep(0.1)
    repeated.start()
    first.join()
    repeated.join()
    _call(running.client(), "complete", 1, 2)
    again = _call(running.client(), "finalize", 1, tasks)

    assert writes == [1]
    assert answers[0] == answers[1] == again
    assert _status(running.client())["checkpoints"] == []  # none in flight
    assert running.participant.completed == [2]


def test_a_repeated_finalize_of_an_aborted_image_or_of_other_tasks_is_refused(
    running: Running,
) -> None:
    """The first finalize's answer stands for a repeat of it only: after an abort it named
    a deleted image, and another task set was told the image covered it (a reviewer's)."""
    tasks = ["logs", "state-0-0", "state-0-1"]
    _call(running.client(), "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    _wait_for(running.client(), 1, "acknowledged")
    _call(running.client(), "finalize", 1, tasks)

    with pytest.raises(AgentRejected) as other_tasks:
        _call(running.client(), "finalize", 1, tasks[:1])
    _call(running.client(), "abort", 1, "expired")
    with pytest.raises(AgentRejected) as aborted:
        _call(running.client(), "finalize", 1, tasks)

    assert "the tasks differ from the image's 3: 2 missing" in str(other_tasks.value)
    assert "checkpoint 1 is aborted" in str(aborted.value)


def test_a_driver_keeps_only_its_newest_done_snapshots(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each snapshot holds its plan and file entries; kept for ever, a driver's memory grew
    with every checkpoint it took (thousands a week)."""
    monkeypatch.setattr(agent_module, "DONE_SNAPSHOTS_KEPT", 3)
    client = running.client()
    tasks = ["logs", "state-0-0", "state-0-1"]
    for checkpoint_id in range(1, 7):
        _call(client, "trigger", checkpoint_id, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
        _wait_for(client, checkpoint_id, "acknowledged")
        _call(client, "finalize", checkpoint_id, tasks)
        _call(client, "complete", checkpoint_id, 2)

    # The newest three still take a repeated completion and finalization.
    for checkpoint_id in (4, 5, 6):
        _call(client, "complete", checkpoint_id, 2)
        assert _call(client, "finalize", checkpoint_id, tasks).path.endswith(
            f"/chk-{checkpoint_id}/_metadata"
        )
    # Older ones are forgotten, and said to be so: a trigger repeated late starts nothing.
    for method, arguments in [
        ("complete", (3, 2)),
        ("finalize", (1, tasks)),
        ("trigger", (2, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)),
    ]:
        with pytest.raises(AgentRejected, match="409") as refused:
            _call(client, method, *arguments)
        assert "ended long ago: this agent keeps the 3 newest" in str(refused.value)
    assert _status(client)["checkpoints"] == []
    assert len(running.agent._snapshots) == 3


def test_a_snapshot_showing_every_acknowledgement_holds_no_pins_and_can_be_finalized(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator finalizes once every task acknowledged: by then the hard links into
    the live location are gone, however long removing them takes, and the snapshot is
    acknowledged (not still copying, which finalize refuses with 409)."""
    remove = shutil.rmtree

    def slow_removal(path: Any, ignore_errors: bool = False) -> None:
        time.sleep(0.5)
        remove(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(agent_module.shutil, "rmtree", slow_removal)
    client = running.client()
    tasks = ["logs", "state-0-0", "state-0-1"]
    _call(client, "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    deadline = time.monotonic() + 20
    acknowledged: list[str] = []
    while sorted(acknowledged) != tasks:
        assert time.monotonic() < deadline, f"never acknowledged by every task: {acknowledged}"
        (snapshot,) = _status(client)["checkpoints"]
        acknowledged = [ack["task"] for ack in snapshot["acks"]]
        time.sleep(0.01)

    assert not (running.root / "pins" / "chk-1").exists()
    assert snapshot["state"] == "acknowledged"
    _call(client, "finalize", 1, tasks)


def test_finalize_before_all_acks_is_refused(running: Running) -> None:
    client = running.client()
    with pytest.raises(AgentRejected, match="404"):
        _call(client, "finalize", 9, ["logs"])


@pytest.mark.parametrize("error", [RuntimeError("database is locked"), ValueError("no table")])
def test_a_participant_that_fails_to_commit_is_named_with_its_error(
    running: Running, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """A newcomer's participant raised in on_checkpoint_complete: the coordinator read
    '500 Internal Server Error, Server got itself in trouble' (and a ValueError of a
    participant was answered as a bad request)."""

    def fail(batch_id: int) -> None:
        raise error

    monkeypatch.setattr(running.participant, "on_checkpoint_complete", fail)
    client = running.client()
    _call(client, "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    _wait_for(client, 1, "acknowledged")
    _call(client, "finalize", 1, ["logs", "state-0-0", "state-0-1"])

    with pytest.raises(AgentRejected) as refused:
        _call(running.client(), "complete", 1, 2)

    failed = f"{type(error).__name__}: {error}"
    said = f"participant {running.participant!r} did not commit batch 2: {failed}"
    assert said in str(refused.value)
    assert "500" in str(refused.value)


def test_savepoint_with_stop_stops_the_query_after_completion(running: Running) -> None:
    client = running.client()
    _call(client, "trigger", 2, CheckpointKind.SAVEPOINT, AfterCompletion.STOP)
    _wait_for(client, 2, "acknowledged")
    _call(client, "finalize", 2, ["logs", "state-0-0", "state-0-1"])
    savepoint = running.storage.read_metadata(CheckpointKind.SAVEPOINT, 2)
    assert all(f.location.startswith("savepoints/sp-2/") for f in savepoint.files)
    _call(client, "complete", 2, 2)
    assert running.agent.stop_requested is True


def _driver_awaiting_the_end(
    running: Running, last_batch: int
) -> tuple[threading.Thread, list[bool]]:
    """A driver whose input ran out at ``last_batch``, waiting as the real one does; once
    it is done waiting, the list holds whether it saw a stop (it stops, else finishes)."""
    seen: list[bool] = []

    def driver() -> None:
        running.agent.wait_for_notification(last_batch, should_give_up=lambda: False)
        seen.append(running.agent.stop_requested)

    waiting = threading.Thread(target=driver)
    waiting.start()
    return waiting, seen


def test_a_driver_woken_by_a_stopping_savepoints_completion_sees_the_stop(
    running: Running,
) -> None:
    """A driver whose input ran out waits for a completion covering its last batch: woken
    by a stop-with-savepoint's (stop --drain), it saw no stop yet, exited FINISHED, and the
    job ended Finished instead of Suspended (CI, now and then)."""
    client = running.client()
    _call(client, "trigger", 2, CheckpointKind.SAVEPOINT, AfterCompletion.DRAIN)
    _wait_for(client, 2, "acknowledged")
    _call(client, "finalize", 2, ["logs", "state-0-0", "state-0-1"])
    waiting, seen = _driver_awaiting_the_end(running, last_batch=2)
    # What the agent tells its status watchers after the notification takes its time.
    running.agent.watch(lambda _acknowledgement_only: time.sleep(0.5))
    _call(client, "complete", 2, 2)
    waiting.join(timeout=10)
    assert seen == [True]


def test_a_drain_savepoints_metadata_counts_from_its_capture(running: Running) -> None:
    """Its `_metadata` trigger time was the request's: the savepoint's duration (`list -o
    wide`) held the whole drain (a newcomer's 44 s for a sub-second savepoint)."""
    client = running.client()
    running.drained = False  # input left
    _call(client, "trigger", 2, CheckpointKind.SAVEPOINT, AfterCompletion.DRAIN)
    time.sleep(0.5)
    ran_out = datetime.now(UTC)
    running.drained = True
    _wait_for(client, 2, "acknowledged")
    _call(client, "finalize", 2, ["logs", "state-0-0", "state-0-1"])

    metadata = running.storage.read_metadata(CheckpointKind.SAVEPOINT, 2)

    assert metadata.trigger_time >= ran_out


@pytest.mark.parametrize("savepoint_ends", ["complete", "complete-slowly", "abort"])
def test_a_driver_whose_input_ran_out_waits_for_a_stop_with_savepoint_in_flight(
    running: Running, savepoint_ends: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint covering the last batch completed first while a stop --drain savepoint
    was in flight: the driver exited FINISHED and the savepoint was given up. It waits for
    the savepoint: completed, the run stops with it (also while its participants still
    commit: it is marked completed before, its stop set after them; a reviewer); aborted,
    the run finishes."""
    client = running.client()
    tasks = ["logs", "state-0-0", "state-0-1"]
    _call(client, "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    _call(client, "trigger", 2, CheckpointKind.SAVEPOINT, AfterCompletion.DRAIN)
    for checkpoint_id in (1, 2):
        _wait_for(client, checkpoint_id, "acknowledged")
        _call(client, "finalize", checkpoint_id, tasks)
    waiting, seen = _driver_awaiting_the_end(running, last_batch=2)
    _call(client, "complete", 1, 2)
    waiting.join(timeout=1)
    assert waiting.is_alive(), "the driver did not wait for the stop-with-savepoint"
    if savepoint_ends == "abort":
        _call(client, "abort", 2, "timed out")
    else:
        if savepoint_ends == "complete-slowly":
            commit = running.participant.on_checkpoint_complete

            def slow_commit(batch_id: int) -> None:
                time.sleep(1.5)  # the driver looks every half second
                commit(batch_id)

            monkeypatch.setattr(running.participant, "on_checkpoint_complete", slow_commit)
        _call(client, "complete", 2, 2)
    waiting.join(timeout=10)
    assert seen == [savepoint_ends != "abort"]


def test_a_savepoint_the_query_continues_after_is_done_at_finalization(running: Running) -> None:
    """No completion notification follows it (docs/coordinator.md): sinks commit nothing up
    to it, and it is no longer in flight (in flight, it would hold garbage collection)."""
    client = running.client()
    _call(client, "trigger", 6, CheckpointKind.SAVEPOINT, AfterCompletion.CONTINUE)
    _wait_for(client, 6, "acknowledged")
    _call(client, "finalize", 6, ["logs", "state-0-0", "state-0-1"])
    assert _status(client)["checkpoints"] == []
    assert running.participant.completed == []
    assert running.storage.read_metadata(CheckpointKind.SAVEPOINT, 6).batch_id == 2


def test_aborted_savepoint_leaves_nothing_behind(running: Running, tmp_path: Path) -> None:
    client = running.client()
    _call(client, "trigger", 3, CheckpointKind.SAVEPOINT, AfterCompletion.CONTINUE)
    _wait_for(client, 3, "acknowledged")
    _call(client, "finalize", 3, ["logs", "state-0-0", "state-0-1"])
    _call(client, "abort", 3, "expired")
    assert not (tmp_path / "storage/default/wordcount/savepoints/sp-3").exists()


def test_an_abort_reason_is_logged_as_one_quoted_line(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """The reason is the client's text: with a line break it wrote a line of its own into
    the driver's log."""
    client = running.client()
    _call(client, "trigger", 3, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    with caplog.at_level("INFO", logger=agent_module.__name__):
        _call(client, "abort", 3, "expired\nERROR checkpoint 4 completed" + "x" * 900)

    # Its capture, cut short, may say "cannot be taken: aborted before capture" too.
    (line,) = [r.getMessage() for r in caplog.records if "3 aborted:" in r.getMessage()]
    assert line.startswith("checkpoint 3 aborted: 'expired\\nERROR checkpoint 4 completed")
    assert "\n" not in line and len(line) < 600


def test_a_savepoint_is_never_taken_over_one_another_registry_left(
    running: Running, tmp_path: Path
) -> None:
    """A savepoint directory made after the driver started (its ids continue above those
    in storage then), by another registry of the job: the savepoint is declined, the old
    one stays whole, and an abort of the declined savepoint deletes nothing."""
    old = tmp_path / "storage/default/wordcount/savepoints/sp-4"
    (old / "files").mkdir(parents=True)
    (old / "_metadata").write_text("the old registry's")
    (old / "files/offsets").write_text("its bytes")
    client = running.client()
    _call(client, "trigger", 4, CheckpointKind.SAVEPOINT, AfterCompletion.CONTINUE)
    declines = _declines(client, 4)
    assert declines[0]["message"] == (
        f"{running.storage.layout.savepoint_dir(4)}: exists already, left by another registry "
        "of this job: the savepoint is not written over it, and the next one takes the next id"
    )
    _call(client, "abort", 4, "declined")
    assert (old / "_metadata").read_text() == "the old registry's"
    assert (old / "files/offsets").read_text() == "its bytes"


@pytest.mark.parametrize("kind", [CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT])
def test_a_symbolic_link_in_the_live_location_declines_the_snapshot_and_copies_nothing_of_it(
    running: Running, tmp_path: Path, kind: CheckpointKind
) -> None:
    """The security review's case: a link placed in the live location (by an executor,
    another writer of the shared claim) was followed, and its target's bytes went into
    storage and came back with a restore."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CANARY")
    link = running.location / "state/0/_metadata/zz-evil"
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    client = running.client()

    _call(client, "trigger", 5, kind, AfterCompletion.CONTINUE)
    declines = _declines(client, 5)

    assert declines[0]["message"] == (
        f"{link}: is a symbolic link (to {str(secret)!r}); links are never followed out of "
        "the query's checkpoint location: remove the link"
    )
    _call(client, "abort", 5, "declined")
    stored = [path for path in (tmp_path / "storage").rglob("*") if path.is_file()]
    assert all("CANARY" not in path.read_text(errors="replace") for path in stored)
    assert not (running.root / "pins" / snapshot_dir_name(kind, 5)).exists()


def _declines(client: AgentClient, checkpoint_id: int) -> list[dict[str, Any]]:
    """The declines of the snapshot, once there are any."""
    deadline = time.monotonic() + 20
    while not (declines := _snapshot(client, checkpoint_id).get("declines")):
        assert time.monotonic() < deadline, _status(client)
        time.sleep(0.05)
    return list(declines)


def _snapshot(client: AgentClient, checkpoint_id: int) -> dict[str, Any]:
    found = [s for s in _status(client)["checkpoints"] if s["id"] == checkpoint_id]
    return dict(found[0]) if found else {}


def test_restore_falls_back_past_a_corrupted_checkpoint(running: Running, tmp_path: Path) -> None:
    client = running.client()
    for checkpoint_id in (1, 2):
        _call(client, "trigger", checkpoint_id, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
        _wait_for(client, checkpoint_id, "acknowledged")
        _call(client, "finalize", checkpoint_id, ["logs", "state-0-0", "state-0-1"])
        _call(client, "complete", checkpoint_id, 2)
    newest = running.storage.read_metadata(CheckpointKind.CHECKPOINT, 2)
    # Corrupt a file only the newest image references: its own metadata entry.
    (tmp_path / "storage/default/wordcount/chk-2/_metadata").write_text("{truncated")
    target = tmp_path / "restored"

    outcome = restore(
        running.storage,
        (
            RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 2),
            RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 1),
        ),
        target,
    )

    assert outcome is not None and str(outcome.candidate) == "checkpoint:1"
    skipped = outcome.skipped[0]
    assert str(skipped.candidate) == "checkpoint:2" and "_metadata" in skipped.reason
    assert (target / "state/0/1/3.delta").read_text() == (
        running.location / "state/0/1/3.delta"
    ).read_text()
    assert newest.batch_id == 2


def test_restore_with_no_usable_image_fails_naming_each(running: Running, tmp_path: Path) -> None:
    with pytest.raises(RestoreFailed, match="checkpoint:7"):
        restore(
            running.storage,
            (RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 7),),
            tmp_path / "restored",
        )


def test_fork_from_another_jobs_savepoint_gets_a_new_query_id(
    running: Running, tmp_path: Path
) -> None:
    client = running.client()
    _call(client, "trigger", 4, CheckpointKind.SAVEPOINT, AfterCompletion.CONTINUE)
    _wait_for(client, 4, "acknowledged")
    path = _call(client, "finalize", 4, ["logs", "state-0-0", "state-0-1"]).path
    other_job = CheckpointStorage(
        JobStorageLayout((tmp_path / "other-storage").as_uri(), "default", "wordcount-fork")
    )
    target = tmp_path / "forked"

    outcome = restore(other_job, (RestoreCandidate.external(path),), target)

    assert outcome is not None and outcome.batch_id == 2
    assert json.loads((target / "metadata").read_text())["id"] != "0b7c6a0e-query"
    assert (target / "offsets/2").read_text() == "offsets 2"


def test_finalize_refuses_a_task_set_other_than_the_images(running: Running) -> None:
    client = running.client()
    _call(client, "trigger", 5, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    _wait_for(client, 5, "acknowledged")
    with pytest.raises(AgentRejected) as left_out:
        _call(client, "finalize", 5, ["logs", "state-0-0"])  # a partition left out
    assert "the tasks differ from the image's 3: 1 missing (state-0-1)" in str(left_out.value)
    # Both lists once repeated whole: 634 KB for 40,000 tasks, past the client's answer limit.
    extra = [f"state-1-{partition}" for partition in range(40_000)]
    with pytest.raises(AgentRejected) as too_many:
        _call(running.client(), "finalize", 5, ["logs", "state-0-0", *extra])
    assert str(too_many.value).endswith(
        "the tasks differ from the image's 3: 40000 not in the image (state-1-0, state-1-1, "
        "state-1-10 and 39997 more); 1 missing (state-0-1)"
    )


def test_restore_candidates_survive_commas_in_uris(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    candidates = (
        RestoreCandidate.registered(CheckpointKind.CHECKPOINT, 3),
        RestoreCandidate.external("s3a://bucket/a,b/sp-1/_metadata"),
    )
    settings = DriverSettings(
        namespace="default",
        job="wordcount",
        storage_root="file:///s",
        work_dir=tmp_path,
        agent_host="127.0.0.1",
        agent_port=1,
        token="t",
        attempt=1,
        restore_candidates=candidates,
        owner=StorageOwner(id="uid-1", description='job "a,b"'),
    )
    assert (
        DriverSettings.from_environment(settings.to_environment(token, tmp_path / "error"))
        == settings
    )
    inherited = dataclasses.replace(settings, agent_socket_fd=7)
    assert (
        DriverSettings.from_environment(inherited.to_environment(token, tmp_path / "error"))
        == inherited
    )


def test_the_agent_serves_on_a_socket_bound_by_whoever_started_its_driver(
    tmp_path: Path,
) -> None:
    """A local run binds the agent's port and the driver inherits it: a port the runtime
    picked free and the driver bound only later was taken meanwhile once (the driver
    failed: "address already in use"; another process would have received the token).
    Until the agent serves, connections are refused, as the supervisor expects of a
    driver that is starting."""
    job = Running(tmp_path)
    bound = socket.socket()
    bound.bind(("127.0.0.1", 0))
    port = int(bound.getsockname()[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as other, pytest.raises(OSError, match="Address already in use"):
        other.bind(("127.0.0.1", port))  # the port is held

    agent_server = server.AgentServer(job.agent, TOKEN, "127.0.0.1", port, socket_fd=bound.detach())
    agent_server.start()
    try:
        status = _status(AgentClient(f"http://127.0.0.1:{port}", TOKEN))
    finally:
        agent_server.stop()
        job.agent.close()

    assert status["attempt"] == 1


# ---------------------------------------------------------------- status versions, long polls


def _version(running: Running) -> int:
    version = _status(running.client())["version"]
    assert isinstance(version, int)
    return version


async def _document(call: Awaitable[AgentStatus]) -> dict[str, Any]:
    """`_status` of a long poll."""
    return (await call).to_json()


async def _timed(call: Any) -> tuple[float, Any]:
    started = time.monotonic()
    answer = await call
    return time.monotonic() - started, answer


def test_the_query_progress_is_served_and_changes_no_version(running: Running) -> None:
    """It changes with every batch: a long poll is not woken for it."""
    version = _version(running)
    progress = QueryProgress(
        batch_id=7, num_input_rows=10, input_rows_per_second=50.0, total_input_rows=80
    )
    running.view = QueryView(QueryState.RUNNING, progress=progress)

    status = _status(running.client())

    assert status["query"]["progress"] == {
        "batchId": 7,
        "numInputRows": 10,
        "inputRowsPerSecond": 50.0,
        "totalInputRows": 80,
    }
    assert status["version"] == version


def test_status_answers_at_once_when_its_version_is_another(running: Running) -> None:
    version = _version(running)

    async def ask() -> tuple[float, Any]:
        client = running.client()
        try:
            return await _timed(_document(client.read_status(after=version - 1, wait=10)))
        finally:
            await client.close()

    elapsed, status = asyncio.run(ask())
    assert elapsed < 1.0
    assert status["version"] == version


def test_status_waits_for_a_snapshot_change_and_answers_it(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "RECHECK_SECONDS", 60.0)  # only the agent's notice wakes it
    version = _version(running)

    async def scenario() -> tuple[float, dict[str, Any]]:
        client = running.client()
        try:
            waiting = asyncio.create_task(
                _timed(_document(client.read_status(after=version, wait=20)))
            )
            await asyncio.sleep(0.5)
            assert not waiting.done(), "no change: the status is held back"
            await client.trigger(1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
            elapsed, status = await waiting
            return elapsed, status
        finally:
            await client.close()

    elapsed, status = asyncio.run(scenario())
    assert elapsed < 2.0
    assert status["version"] > version
    assert [s["id"] for s in status["checkpoints"]] == [1]
    _wait_for(running.client(), 1, "acknowledged")  # no copy left running at teardown


def test_status_notices_a_query_change_while_it_waits(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "RECHECK_SECONDS", 0.1)
    version = _version(running)
    threading.Timer(0.3, lambda: setattr(running, "view", QueryView(QueryState.FINISHED))).start()

    async def ask() -> tuple[float, Any]:
        client = running.client()
        try:
            return await _timed(_document(client.read_status(after=version, wait=20)))
        finally:
            await client.close()

    elapsed, status = asyncio.run(ask())
    assert elapsed < 2.0
    assert status["query"]["state"] == "finished"
    assert status["awaitingFinalCheckpoint"] is True
    assert status["version"] > version


def test_status_answers_after_its_wait_with_the_same_version(running: Running) -> None:
    version = _version(running)

    async def ask() -> tuple[float, Any]:
        # The client's 0.5 s timeout is on top of the wait: the answer is not a timeout.
        client = AgentClient(f"http://127.0.0.1:{running.port}", TOKEN, timeout=0.5)
        try:
            return await _timed(_document(client.read_status(after=version, wait=1.5)))
        finally:
            await client.close()

    elapsed, status = asyncio.run(ask())
    assert 1.4 <= elapsed < 3.0
    assert status["version"] == version


class HeldCopies:
    """Each snapshot task's copies wait until the test releases that task."""

    def __init__(self, running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
        self.released = {task: threading.Event() for task in ("logs", "state-0-0", "state-0-1")}
        self.copying: list[str] = []  # the tasks that began to copy (two at a time)
        add_shared_file = running.storage.add_shared_file

        def held(local_src: str, path: str, **options: Any) -> Any:
            parts = path.split("/")
            task = f"state-{parts[1]}-{parts[2]}" if parts[0] == "state" else "logs"
            if task not in self.copying:
                self.copying.append(task)
            assert self.released[task].wait(20), f"task {task} never released"
            return add_shared_file(local_src, path, **options)

        monkeypatch.setattr(running.storage, "add_shared_file", held)

    def release(self, task: str | None = None) -> None:
        for name, event in self.released.items():
            if task in (None, name):
                event.set()


def _copying(
    running: Running, monkeypatch: pytest.MonkeyPatch, gather_seconds: float
) -> tuple[HeldCopies, int]:
    """Checkpoint 1 triggered and copying, its tasks held, and the status version then;
    long polls gather acknowledgements for ``gather_seconds`` and wake only on changes."""
    monkeypatch.setattr(server, "ACKNOWLEDGEMENT_GATHER_SECONDS", gather_seconds)
    monkeypatch.setattr(server, "RECHECK_SECONDS", 60.0)
    copies = HeldCopies(running, monkeypatch)
    _call(running.client(), "trigger", 1, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)
    _wait_for(running.client(), 1, "copying")
    # The state says copying as the tasks are handed to the copy threads, which reach the
    # hold a moment later (a loaded machine: none had, and copying[0] failed).
    deadline = time.monotonic() + 20
    while len(copies.copying) < 2:  # the agent's two copy threads
        assert time.monotonic() < deadline, f"tasks never began to copy: {copies.copying}"
        time.sleep(0.05)
    return copies, _version(running)


def _long_poll_during(
    running: Running,
    copies: HeldCopies,
    version: int,
    meanwhile: Callable[[asyncio.Task[tuple[float, dict[str, Any]]]], Awaitable[None]],
) -> tuple[float, dict[str, Any]]:
    """How long a long poll after ``version`` took, and its answer, while ``meanwhile``
    (given the waiting request) releases copies; every copy is released at the end."""

    async def scenario() -> tuple[float, dict[str, Any]]:
        client = running.client()
        try:
            waiting = asyncio.create_task(
                _timed(_document(client.read_status(after=version, wait=20)))
            )
            await meanwhile(waiting)
            return await waiting
        finally:
            await client.close()

    try:
        return asyncio.run(scenario())
    finally:
        copies.release()


def test_a_long_poll_gathers_acknowledgements_until_the_snapshot_is_acknowledged(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acknowledgements alone do not end a long poll at once (one answer for each of 200
    tasks would keep the coordinator busy); the snapshot's next state does."""
    copies, version = _copying(running, monkeypatch, gather_seconds=60.0)

    async def meanwhile(waiting: asyncio.Task[Any]) -> None:
        await asyncio.sleep(0.3)  # the request waits
        for task in ("state-0-0", "state-0-1"):
            copies.release(task)
            await asyncio.sleep(0.5)
            assert not waiting.done(), f"{task}'s acknowledgement alone was answered"
        copies.release("logs")

    elapsed, status = _long_poll_during(running, copies, version, meanwhile)
    assert elapsed < 10.0, "the snapshot's acknowledged state was not answered at once"
    (snapshot,) = status["checkpoints"]
    assert snapshot["state"] == "acknowledged"
    assert sorted(a["task"] for a in snapshot["acks"]) == ["logs", "state-0-0", "state-0-1"]


def test_a_long_poll_answers_gathered_acknowledgements_after_a_moment(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies, version = _copying(running, monkeypatch, gather_seconds=0.3)

    async def meanwhile(waiting: asyncio.Task[Any]) -> None:
        await asyncio.sleep(0.3)
        copies.release(copies.copying[0])

    elapsed, status = _long_poll_during(running, copies, version, meanwhile)
    assert elapsed < 10.0
    (snapshot,) = status["checkpoints"]
    assert snapshot["state"] == "copying"
    assert [a["task"] for a in snapshot["acks"]] == copies.copying[:1]
    assert status["version"] > version


def test_a_client_that_missed_only_acknowledgements_waits_for_more(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks may come faster than the coordinator asks (1,000 tasks): a request whose
    version is behind by acknowledgements alone is gathered too, not answered at once."""
    copies, version = _copying(running, monkeypatch, gather_seconds=60.0)
    copies.release(copies.copying[0])
    deadline = time.monotonic() + 20
    while _version(running) == version:  # the ack is in the status: the client is behind
        assert time.monotonic() < deadline, "the released task never acknowledged"
        time.sleep(0.05)

    async def meanwhile(waiting: asyncio.Task[Any]) -> None:
        await asyncio.sleep(0.5)
        assert not waiting.done(), "a client behind by an ack was answered at once"
        copies.release()

    elapsed, status = _long_poll_during(running, copies, version, meanwhile)
    assert elapsed < 10.0
    assert status["checkpoints"][0]["state"] == "acknowledged"


def test_status_answers_while_storage_calls_fill_the_shared_threads(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Discards may wait long (for copies under way); the supervisor's heartbeat takes a
    status that is not answered for a driver that stopped answering."""
    release = threading.Event()

    def held_discard(checkpoint_id: int, retained: Any) -> None:
        release.wait(30)

    monkeypatch.setattr(running.agent, "discard_checkpoint", held_discard)

    async def scenario() -> float:
        url = f"http://127.0.0.1:{running.port}"
        clients = [AgentClient(url, TOKEN, timeout=30) for _ in range(40)]
        discards = [
            asyncio.create_task(client.discard_checkpoint(index, []))
            for index, client in enumerate(clients[1:])
        ]
        try:
            await asyncio.sleep(0.5)  # every shared thread holds a discard now
            seconds, _status = await _timed(clients[0].read_status())
            return seconds
        finally:
            release.set()
            await asyncio.gather(*discards, return_exceptions=True)
            for client in clients:
                await client.close()

    assert asyncio.run(scenario()) < 2


def test_a_new_committed_batch_alone_keeps_the_version(running: Running) -> None:
    before = _status(running.client())
    for log in ("offsets", "commits"):
        (running.location / log / "3").write_text(f"{log} 3")
    after = _status(running.client())
    assert after["query"]["lastCommittedBatch"] == before["query"]["lastCommittedBatch"] + 1
    assert after["version"] == before["version"]


@pytest.mark.parametrize("wait", [0.0, 0.25, 3.4e-05, 30.0, 1e16])
def test_every_wait_the_client_sends_is_taken(wait: float) -> None:
    """The client writes ``wait`` as Python writes a float: a deadline a few microseconds
    away is "3.4e-05"."""
    assert server.long_poll_parameters({"after": "7", "wait": str(wait)}) == (7, min(wait, 30.0))


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"after": "abc"}, "after"),
        ({"after": "-1"}, "after"),
        ({"after": "1.5"}, "after"),
        ({"after": "1" + "0" * 400}, "after"),  # once an OverflowError: a 500
        ({"after": "9" * 5000}, "after"),  # more digits than int() converts
        # What int() and float() take besides ASCII digits (a reviewer's: "1_0" was 10).
        ({"after": "1_0"}, "after"),
        ({"after": " 7"}, "after"),
        ({"after": "+7"}, "after"),
        ({"after": "\u0663"}, "after"),
        ({"after": "1", "wait": "-1e1"}, "wait"),
        ({"after": "1", "wait": "1_0"}, "wait"),
        ({"after": "1", "wait": "9" * 400}, "wait"),
        ({"after": "1", "wait": "soon"}, "wait"),
        ({"after": "1", "wait": "-2"}, "wait"),
        ({"after": "1", "wait": "nan"}, "wait"),
        ({"after": "1", "wait": "inf"}, "wait"),
    ],
)
def test_bad_long_poll_parameters_are_refused_naming_them(
    running: Running, query: dict[str, str], parameter: str
) -> None:
    async def ask() -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"http://127.0.0.1:{running.port}/v1/status",
                params=query,
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as response,
        ):
            return response.status, await response.json()

    status, body = asyncio.run(ask())
    assert status == 400
    assert body["error"].startswith(f"bad request: query parameter '{parameter}' must be")


def test_a_cancelled_long_poll_leaves_the_client_usable(running: Running) -> None:
    version = _version(running)

    async def scenario() -> dict[str, Any]:
        client = running.client()
        try:
            waiting = asyncio.create_task(_document(client.read_status(after=version, wait=20)))
            await asyncio.sleep(0.3)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            return await _document(client.read_status())
        finally:
            await client.close()

    assert asyncio.run(scenario())["version"] == version


def test_stopping_the_server_answers_waiting_status_requests(tmp_path: Path) -> None:
    """The driver stops its agent on exit: a long poll must not hold that up."""
    job = Running(tmp_path)
    job.server.start()
    version = _version(job)

    async def scenario() -> float:
        client = job.client()
        try:
            waiting = asyncio.create_task(_document(client.read_status(after=version, wait=25)))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            await asyncio.to_thread(job.server.stop)
            stopped = time.monotonic() - started
            with contextlib.suppress(AgentUnavailable):
                await waiting
            return stopped
        finally:
            await client.close()

    try:
        assert asyncio.run(scenario()) < 5.0
    finally:
        job.agent.close()


def test_stopping_the_server_cuts_a_storage_call_in_progress_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A garbage collection still running when the driver exits (its restore failed at
    once) does not keep the server from stopping, nor turn the driver's exit into an
    error: the request is answered with nothing after the grace period."""
    monkeypatch.setattr(server, "STOP_GRACE_SECONDS", 0.5)
    job = Running(tmp_path)
    collecting = threading.Event()

    def slow_collection(checkpoints: Any, savepoints: Any) -> Any:
        collecting.set()
        time.sleep(4)

    monkeypatch.setattr(job.agent, "collect_garbage", slow_collection)
    job.server.start()

    async def scenario() -> float:
        client = job.client()
        try:
            collection = asyncio.create_task(client.collect_garbage([], []))
            await asyncio.to_thread(collecting.wait, 10)
            started = time.monotonic()
            await asyncio.to_thread(job.server.stop)
            stopped = time.monotonic() - started
            with pytest.raises(AgentUnavailable):
                await collection
            return stopped
        finally:
            await client.close()

    try:
        assert asyncio.run(scenario()) < 3.0
    finally:
        job.agent.close()


# A driver whose agent is in the middle of a storage call that hangs (a garbage collection
# on storage that stopped answering) when the driver exits with its code.
EXITING_DRIVER = """
import sys, threading, time, urllib.request
from pathlib import Path
from helpers.agent import TOKEN, Running

job = Running(Path(sys.argv[1]))
collecting = threading.Event()

def hanging_collection(checkpoints, savepoints):
    collecting.set()
    time.sleep(120)

job.agent.collect_garbage = hanging_collection
job.server.start()
request = urllib.request.Request(
    f"http://127.0.0.1:{job.port}/v1/storage/collect-garbage",
    data=b'{"checkpoints": [], "savepoints": []}',
    headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
)
threading.Thread(target=lambda: urllib.request.urlopen(request), daemon=True).start()
collecting.wait(30)
job.server.stop()
job.agent.close()
sys.exit(4)
"""


def test_a_storage_call_that_hangs_does_not_hold_up_the_drivers_exit(tmp_path: Path) -> None:
    """Python joins an executor's threads when the process exits: the storage call's own
    thread must not be one, or the driver would exit only when storage answers."""
    exited = subprocess.run(  # the storage call would take 120 s
        [sys.executable, "-c", EXITING_DRIVER, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert exited.returncode == 4, exited.stderr


def test_a_stopped_server_ends_its_thread_and_closes_its_loop(tmp_path: Path) -> None:
    def open_loops() -> int:
        return sum(
            1
            for o in gc.get_objects()
            if isinstance(o, asyncio.AbstractEventLoop) and not o.is_closed()
        )

    before = open_loops()
    job = Running(tmp_path)
    job.server.start()
    assert _status(job.client())["query"]["lastCommittedBatch"] == 2

    job.server.stop()
    job.agent.close()

    assert not [t for t in threading.enumerate() if t.name == "checkpoint-agent"]
    assert open_loops() == before, "the server's loop is left open (a ResourceWarning later)"


def test_a_snapshot_captured_after_close_is_declined_and_leaves_no_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    job = Running(tmp_path)
    job.agent.close()  # the driver exits while the trigger's capture starts

    job.agent.trigger(5, CheckpointKind.CHECKPOINT, AfterCompletion.CONTINUE)

    deadline = time.monotonic() + 20
    while not (snapshots := job.agent.status().checkpoints)[0].declines:
        assert time.monotonic() < deadline, snapshots
        time.sleep(0.05)
    assert "the agent is closing" in json.dumps(snapshots[0].to_json()["declines"])
    assert not thread_errors
    assert not list((tmp_path / "pins").glob("*"))


def test_status_lists_the_state_partitions_again_only_after_a_new_commit(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    listings: list[Path] = []
    listed = agent_module.snapshot_tasks

    def recorded(location: Path) -> frozenset[str]:
        listings.append(location)
        return listed(location)

    monkeypatch.setattr(agent_module, "snapshot_tasks", recorded)
    before = [running.agent.status().tasks for _ in range(3)]
    for relative in ("offsets/3", "commits/3", "state/0/2/4.delta"):
        (running.location / relative).parent.mkdir(parents=True, exist_ok=True)
        (running.location / relative).write_text("batch 3")
    after = [running.agent.status().tasks for _ in range(3)]

    assert len(listings) == 2
    assert before == [("logs", "state-0-0", "state-0-1")] * 3
    assert after == [("logs", "state-0-0", "state-0-1", "state-0-2")] * 3


def test_a_query_restored_at_its_last_batch_needs_no_final_checkpoint(tmp_path: Path) -> None:
    """The participants committed through the restored image's batch when they restored
    it: a query whose input was done there finishes without waiting for a final
    checkpoint (it waited for ever: the coordinator's registered image, one this agent
    never took, answered 404)."""
    job = Running(tmp_path, batches=3, query_started=False)  # batches 0..2 committed
    restored = RestoredFrom(RestoreCandidate.decode("checkpoint:4"), batch_id=2, skipped=())
    job.view = QueryView(QueryState.FINISHED)
    job.agent.query_started(lambda: job.view, restored, lambda moment: job.drained)

    assert job.agent.status().awaiting_final_checkpoint is False
    assert job.agent.wait_for_notification(2, should_give_up=lambda: True) is True
    assert job.agent.wait_for_notification(3, should_give_up=lambda: True) is False
    job.agent.close()
