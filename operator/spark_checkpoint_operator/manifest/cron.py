"""Cron schedules of periodic savepoints (spec.savepoints.schedule): a standard cron
expression (5 fields, `0 2 * * *`) or the Quartz form the Flink Kubernetes Operator takes
(seconds first, 6 or 7 fields, `0 0 2 * * ?`), in UTC, read by croniter."""

import datetime
import functools
import re
import time
from dataclasses import dataclass

from croniter import CroniterBadDateError, CroniterError, croniter

# Quartz counts the days of the week 1-7 from Sunday, cron (and croniter) 0-6: a number
# there would move a Quartz schedule by a day without a word.
_QUARTZ_FIELDS = (6, 7)
_DAY_OF_MONTH, _DAY_OF_WEEK = 3, 5


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """The coordinator's `SavepointSchedule` of a cron expression (checked by
    `schedule_problem`)."""

    expression: str

    def next_after(self, wall_time: float) -> float | None:
        """The first time of the schedule after ``wall_time`` (seconds since the epoch);
        None if it never fires again (its years are past). Asked at every event of the
        coordinator's for the same ``wall_time``: cached."""
        return _next_time(self.expression, wall_time)


@functools.lru_cache(maxsize=256)
def _next_time(expression: str, wall_time: float) -> float | None:
    try:
        start = datetime.datetime.fromtimestamp(wall_time, datetime.UTC)
        following: float = croniter(expression, start, second_at_beginning=True).get_next(float)
    except (CroniterBadDateError, OverflowError, OSError):
        return None  # past its years, or past what a datetime holds (year 9999)
    return following


def schedule_problem(expression: str) -> str | None:
    """What is wrong with a schedule, said for its field; None if nothing."""
    fields = expression.split()
    if len(fields) in _QUARTZ_FIELDS:
        quartz = (
            f"{expression!r}: 6 or 7 fields are read as Quartz (second minute hour "
            "day-of-month month day-of-week [year])"
        )
        # MON#2 (the second Monday) names the day: the digits after # are the week's.
        if any(c.isdigit() for c in re.sub(r"#[0-9]+", "", fields[_DAY_OF_WEEK])):
            return (
                f"{quartz}, whose days of the week are numbered 1-7 from Sunday where cron's "
                "are 0-6: name the day (MON-FRI)"
            )
        # cron fires on either; Quartz (Flink) refuses both.
        if "?" not in (fields[_DAY_OF_MONTH], fields[_DAY_OF_WEEK]) and "*" not in (
            fields[_DAY_OF_MONTH],
            fields[_DAY_OF_WEEK],
        ):
            return f"{quartz}: set one of day-of-month and day-of-week, '?' the other"
    try:
        croniter(expression, second_at_beginning=True)
    except CroniterError as error:
        return f"{expression!r} is not a cron expression: {error}"
    if CronSchedule(expression).next_after(time.time()) is None:
        return f"{expression!r} never fires again"
    return None
