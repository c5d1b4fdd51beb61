"""How many Events one job posts: a burst of one reason, then one a minute.

Kopf posts every event as a new Event object (client-go's recorder would fold repeats
into one, counting them). A job whose checkpoints keep failing, every few seconds for
hours (storage down, or an interval of milliseconds), would otherwise write an Event
object each time into etcd, which every job of the cluster shares. Each (type, reason,
request) of a job has a bucket of its own, so a flood of one reason never holds back
another (a `JobFailed` after many `CheckpointFailed`), nor a flood of periodic savepoints'
`SavepointCompleted` the one answering a user's request (a trigger nonce, a snapshot
object: its label). Nothing is lost to the operator's log, which has every notice; the
next event posted of a reason says how many were not.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# Events of one type and reason a job posts at once, and how often one more may be
# posted after that (client-go's spam filter allows 25 per object, then one every 5
# minutes, across all reasons).
BURST = 10
REFILL_SECONDS = 60.0
# Kubernetes takes an Event's message up to 1 KiB.
MAX_MESSAGE_LENGTH = 1000


class PostEvent(Protocol):
    def __call__(self, kind: str, reason: str, message: str, request: str = "") -> None:
        """Post an event: ``kind`` Normal or Warning; ``request``, the label of the request
        it answers ("" or a periodic one's: none of the user's)."""


@dataclass
class _Bucket:
    tokens: float
    updated: float
    withheld: int = 0
    withheld_since: float = 0.0


class EventThrottle:
    """A `PostEvent` that passes each (type, reason, request) on at most `BURST` times at
    once and once every `REFILL_SECONDS` after that; a message passed on after some were
    withheld ends by saying how many, and for how long."""

    def __init__(
        self,
        post: Callable[[str, str, str], None],
        clock: Callable[[], float] = time.monotonic,
        burst: int = BURST,
        refill_seconds: float = REFILL_SECONDS,
    ) -> None:
        self._post = post
        self._clock = clock
        self._burst = burst
        self._refill_seconds = refill_seconds
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}

    def __call__(self, kind: str, reason: str, message: str, request: str = "") -> None:
        now = self._clock()
        key = (kind, reason, request)
        if key not in self._buckets:
            # A full bucket that withholds nothing is a new one: those of requests long
            # answered go, so that a job asked for snapshots for months keeps a few.
            for other, held in list(self._buckets.items()):
                self._refill(held, now)
                if held.tokens >= self._burst and not held.withheld:
                    del self._buckets[other]
            self._buckets[key] = _Bucket(float(self._burst), now)
        bucket = self._buckets[key]
        self._refill(bucket, now)
        if bucket.tokens < 1.0:
            if not bucket.withheld:
                bucket.withheld_since = now
            bucket.withheld += 1
            return
        bucket.tokens -= 1.0
        suffix = ""
        if bucket.withheld:
            suffix = (
                f" ({bucket.withheld} more {reason} event(s) not posted in the last "
                f"{now - bucket.withheld_since:.0f}s: see the operator's log)"
            )
            bucket.withheld = 0
        self._post(kind, reason, message[: MAX_MESSAGE_LENGTH - len(suffix)] + suffix)

    def _refill(self, bucket: _Bucket, now: float) -> None:
        bucket.tokens = min(
            float(self._burst),
            bucket.tokens + (now - bucket.updated) / self._refill_seconds,
        )
        bucket.updated = now
