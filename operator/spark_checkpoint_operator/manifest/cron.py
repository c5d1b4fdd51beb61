"""Cron schedules of periodic savepoints (spec.savepoints.schedule): a standard cron
expression (5 fields, `0 2 * * *`) or the Quartz form the Flink Kubernetes Operator takes
(seconds first, 6 or 7 fields, `0 0 2 * * ?`), in UTC, read by croniter."""

import datetime
import time
from dataclasses import dataclass

from croniter import CroniterBadDateError, CroniterError, croniter

# Quartz counts the days of the week 1-7 from Sunday, cron (and croniter) 0-6: a number
# there would move a Quartz schedule by a day without a word.
_QUARTZ_FIELDS = (6, 7)
_DAY_OF_WEEK = 5


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """The coordinator's `SavepointSchedule` of a cron expression (checked by
    `schedule_problem`)."""

    expression: str

    def next_after(self, wall_time: float) -> float | None:
        """The first time of the schedule after ``wall_time`` (seconds since the epoch);
        None if it never fires again (its years are past)."""
        start = datetime.datetime.fromtimestamp(wall_time, datetime.UTC)
        try:
            following: float = croniter(self.expression, start, second_at_beginning=True).get_next(
                float
            )
        except CroniterBadDateError:
            return None
        return following


def schedule_problem(expression: str) -> str | None:
    """What is wrong with a schedule, said for its field; None if nothing."""
    fields = expression.split()
    if len(fields) in _QUARTZ_FIELDS and any(c.isdigit() for c in fields[_DAY_OF_WEEK]):
        return (
            f"{expression!r}: a day of the week by number is read differently by Quartz "
            "(1-7 from Sunday) and cron (0-6 from Sunday); name it (MON-FRI)"
        )
    try:
        following = CronSchedule(expression).next_after(time.time())
    except CroniterError as error:
        return f"{expression!r} is not a cron expression: {error}"
    return f"{expression!r} never fires again" if following is None else None
