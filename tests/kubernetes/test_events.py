"""The operator's Events per job: a burst of each reason, then one a minute, and what was
withheld said by the next one posted (`EventThrottle`, with an injected clock)."""

import re

import kopf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from spark_checkpoint_operator.kubernetes import handlers
from spark_checkpoint_operator.kubernetes.events import BURST, MAX_MESSAGE_LENGTH, EventThrottle
from spark_checkpoint_operator.metrics import CheckpointMetrics

WITHHELD = re.compile(r" \((\d+) more (\w+) event\(s\) not posted in the last (\d+)s: see the")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_one_reason_posts_a_burst_then_one_a_minute_saying_how_many_were_not() -> None:
    posted: list[tuple[str, str, str]] = []
    clock = Clock()
    throttle = EventThrottle(lambda *event: posted.append(event), clock)
    for number in range(100):  # ten a second for ten seconds
        throttle("Warning", "CheckpointFailed", f"checkpoint {number} expired")
        clock.now += 0.1
    assert [message for _, _, message in posted] == [f"checkpoint {n} expired" for n in range(10)]

    throttle("Warning", "JobFailed", "too many failures")  # another reason is not held back
    assert posted[-1] == ("Warning", "JobFailed", "too many failures")

    clock.now += 60.0
    throttle("Warning", "CheckpointFailed", "checkpoint 100 expired")
    assert posted[-1] == (
        "Warning",
        "CheckpointFailed",
        "checkpoint 100 expired (90 more CheckpointFailed event(s) not posted in the last "
        "69s: see the operator's log)",
    )
    throttle("Warning", "CheckpointFailed", "checkpoint 101 expired")
    assert len(posted) == 12, "one token a minute, spent"
    clock.now += 60.0
    throttle("Warning", "CheckpointFailed", "checkpoint 102 expired")
    assert posted[-1][2] == (
        "checkpoint 102 expired (1 more CheckpointFailed event(s) not posted in the last 60s: "
        "see the operator's log)"
    )
    clock.now += 60.0
    throttle("Warning", "CheckpointFailed", "checkpoint 103 expired")
    assert posted[-1][2] == "checkpoint 103 expired", "nothing withheld since"


def test_a_long_message_keeps_its_count_of_withheld_events() -> None:
    posted: list[str] = []
    clock = Clock()
    throttle = EventThrottle(lambda _kind, _reason, message: posted.append(message), clock, 1)
    throttle("Warning", "DriverFailed", "x" * 5000)
    throttle("Warning", "DriverFailed", "x" * 5000)
    clock.now += 60.0
    throttle("Warning", "DriverFailed", "y" * 5000)
    assert [len(message) for message in posted] == [MAX_MESSAGE_LENGTH, MAX_MESSAGE_LENGTH]
    match = WITHHELD.search(posted[1])
    assert match is not None and match.end() < len(posted[1])
    assert posted[1].startswith("y" * 900)


@settings(max_examples=300, deadline=None)
@given(
    burst=st.integers(min_value=1, max_value=12),
    refill=st.floats(min_value=0.5, max_value=600.0),
    events=st.lists(
        st.tuples(
            # seconds since the previous event: mostly a flood, at times a pause
            st.one_of(st.floats(min_value=0.0, max_value=1.0), st.floats(0.0, 900.0)),
            st.sampled_from(["Warning", "Normal"]),
            st.sampled_from(["CheckpointFailed", "DriverFailed", "Restored"]),
            st.sampled_from(["", "periodic", "nonce 1", "snapshot nightly"]),
        ),
        max_size=200,
    ),
)
def test_every_event_is_posted_or_counted_and_no_reason_exceeds_its_bucket(
    burst: int, refill: float, events: list[tuple[float, str, str, str]]
) -> None:
    posted: list[tuple[float, str, str, str, str]] = []
    clock = Clock()
    request = ""  # of the event being posted: the message says nothing of it
    throttle = EventThrottle(
        lambda kind, reason, message: posted.append((clock.now, kind, reason, request, message)),
        clock,
        burst,
        refill,
    )
    # when, and whether posted
    calls: dict[tuple[str, str, str], list[tuple[float, bool]]] = {}
    for delay, kind, reason, request in events:
        clock.now += delay
        before = len(posted)
        throttle(kind, reason, "m", request)
        calls.setdefault((kind, reason, request), []).append((clock.now, len(posted) > before))

    for key, outcomes in calls.items():
        reason = key[1]
        mine = [message for _, *event, message in posted if tuple(event) == key]
        # The first burst of a reason is posted whole; after it, a bucket's worth at most.
        assert all(was for _, was in outcomes[:burst])
        posted_times = [at for at, was in outcomes if was]
        for first, since in enumerate(posted_times):  # any stretch of time
            for last in range(first, len(posted_times)):
                elapsed = posted_times[last] - since
                assert last - first + 1 <= burst + elapsed / refill + 1e-6
        # Nothing is lost without a word: each one posted, or counted by a later one posted,
        # or withheld since the last one posted (the next one will count it).
        said = sum(int(match[1]) for match in map(WITHHELD.search, mine) if match)
        last_posted = max((i for i, (_, was) in enumerate(outcomes) if was), default=-1)
        unsaid = len(outcomes) - last_posted - 1
        assert len(mine) + said + unsaid == len(outcomes)
        assert all(match[2] == reason for match in map(WITHHELD.search, mine) if match)


def test_a_jobs_throttle_outlives_its_daemons_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon restarted every few seconds (its status writes refused) posted its events
    anew each time, unthrottled for ever (a reviewer's): the throttle is the job's (Kopf's
    per-object memo), not each daemon run's controller's."""
    posted: list[str] = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: posted.append(event["reason"]))
    memo, body = kopf.Memo(), kopf.Body({"metadata": {"namespace": "default", "name": "orders"}})
    memo[handlers.CLIENTS] = None  # not used to build a controller
    memo[handlers.METRICS] = CheckpointMetrics(CollectorRegistry())
    memo[handlers.CONTROLLER_SETTINGS] = {}
    for _ in range(3):  # the daemon's runs, a controller each
        controller = handlers._controller(body, memo)
        for _ in range(BURST):
            controller._post_event("Normal", "DriverAdopted", "adopted the running driver")
    assert posted == ["DriverAdopted"] * BURST


def test_the_answer_to_a_request_is_not_held_back_by_a_flood_of_periodic_ones() -> None:
    """Savepoints every few seconds spent SavepointCompleted's bucket, and the one a
    user's trigger nonce asked for was not posted (a status write alone answered it)."""
    posted: list[tuple[str, str, str]] = []
    clock = Clock()
    throttle = EventThrottle(lambda *event: posted.append(event), clock)
    for savepoint in range(1, 31):
        throttle("Normal", "SavepointCompleted", f"savepoint {savepoint} complete", "periodic")
        clock.now += 2.0
    assert len(posted) == BURST  # a burst; the next in a minute
    throttle("Normal", "SavepointCompleted", "savepoint 31 complete (nonce 4)", "nonce 4")
    assert posted[-1] == ("Normal", "SavepointCompleted", "savepoint 31 complete (nonce 4)")


def test_the_buckets_of_requests_long_answered_are_not_kept() -> None:
    """A job asked for a snapshot every five minutes for a month: a bucket each, for ever."""
    clock = Clock()
    throttle = EventThrottle(lambda *_: None, clock)
    for snapshot in range(8640):
        throttle("Normal", "SnapshotCompleted", "done", f"snapshot s{snapshot}")
        throttle("Normal", "SavepointCompleted", "done", f"snapshot s{snapshot}")
        clock.now += 300.0
    # A bucket full again withholds nothing: it is a new one, and goes.
    assert len(throttle._buckets) == 2
    # One still refilling stays, or the next burst of its key would be a whole one.
    for _ in range(BURST + 1):
        throttle("Warning", "CheckpointFailed", "expired", "")
    throttle("Normal", "SnapshotCompleted", "done", "snapshot later")
    assert ("Warning", "CheckpointFailed", "") in throttle._buckets
