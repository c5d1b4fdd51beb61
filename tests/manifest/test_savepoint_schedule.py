"""spec.savepoints.schedule: periodic savepoints at the times of a cron expression, in the
standard form or the Quartz form the Flink Kubernetes Operator takes, in UTC."""

import copy
import datetime
from typing import Any

import pytest

from spark_checkpoint_operator.manifest.cron import CronSchedule
from spark_checkpoint_operator.manifest.loading import manifest_from_document, manifest_from_update
from spark_checkpoint_operator.manifest.problems import ManifestError

UTC = datetime.UTC


def _at(*fields: int) -> float:
    return datetime.datetime(*fields, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("expression", "after", "following"),
    [
        ("0 2 * * *", _at(2026, 12, 6, 1, 30), _at(2026, 12, 6, 2, 0)),
        ("0 2 * * *", _at(2026, 12, 6, 2, 0), _at(2026, 12, 7, 2, 0)),  # strictly after
        ("0 0 2 * * ?", _at(2026, 12, 6, 1, 30), _at(2026, 12, 6, 2, 0)),  # Quartz
        ("0 0 2 ? * MON-FRI", _at(2026, 12, 5, 3, 0), _at(2026, 12, 7, 2, 0)),  # Sat -> Mon
        ("*/15 * * * * ?", _at(2026, 12, 6, 1, 30, 1), _at(2026, 12, 6, 1, 30, 15)),
        ("0 0 0 1 1 ? 2027", _at(2026, 12, 6), _at(2027, 1, 1)),
        ("@daily", _at(2026, 12, 6, 12, 0), _at(2026, 12, 7)),
    ],
)
def test_a_schedule_gives_its_next_time_in_utc(
    expression: str, after: float, following: float
) -> None:
    assert CronSchedule(expression).next_after(after) == following


def test_a_schedule_whose_years_are_past_has_no_next_time() -> None:
    """Checked when read; one that ran out while the job ran takes no more savepoints, nor
    one past what a date holds (a status's time near year 9999)."""
    assert CronSchedule("0 0 0 1 1 ? 2027").next_after(_at(2027, 1, 1)) is None
    assert CronSchedule("0 2 * * *").next_after(_at(9999, 12, 31, 23)) is None


def test_a_quartz_nth_weekday_by_name_is_a_schedule(minimal: dict[str, Any]) -> None:
    """MON#2, the second Monday: its digit is the week's, not a day's number."""
    manifest = manifest_from_document(_document(minimal, schedule="0 0 2 ? * MON#2"))
    schedule = manifest.coordinator_config().savepoint_schedule
    assert schedule is not None
    assert schedule.next_after(_at(2026, 12, 1)) == _at(2026, 12, 14, 2)


def _document(minimal: dict[str, Any], **savepoints: Any) -> dict[str, Any]:
    minimal["spec"]["savepoints"] = savepoints
    return minimal


def test_a_schedule_reaches_the_coordinator(minimal: dict[str, Any]) -> None:
    manifest = manifest_from_document(_document(minimal, schedule="0 0 2 * * ?"))

    config = manifest.coordinator_config()
    assert config.savepoint_schedule == CronSchedule("0 0 2 * * ?")
    assert config.savepoint_interval is None


@pytest.mark.parametrize(
    ("savepoints", "problem"),
    [
        (
            {"schedule": "0 0 2 ? * 2"},
            "spec.savepoints.schedule: '0 0 2 ? * 2': 6 or 7 fields are read as Quartz "
            "(second minute hour day-of-month month day-of-week [year]), whose days of the "
            "week are numbered 1-7 from Sunday where cron's are 0-6: name the day (MON-FRI)",
        ),
        # Seconds last (croniter's other form): said to be read as Quartz (a newcomer's).
        (
            {"schedule": "0 2 * * * 30"},
            "spec.savepoints.schedule: '0 2 * * * 30': 6 or 7 fields are read as Quartz",
        ),
        (
            {"schedule": "0 0 2 1 * MON"},
            "spec.savepoints.schedule: '0 0 2 1 * MON': 6 or 7 fields are read as Quartz "
            "(second minute hour day-of-month month day-of-week [year]): set one of "
            "day-of-month and day-of-week, '?' the other",
        ),
        (
            {"schedule": "every night"},
            "spec.savepoints.schedule: 'every night' is not a cron expression: Exactly 5, 6 "
            "or 7 columns has to be specified for iterator expression.",
        ),
        (
            {"schedule": "0 0 0 30 2 ?"},
            "spec.savepoints.schedule: '0 0 0 30 2 ?' never fires again",
        ),
        (
            {"schedule": "0 0 0 1 1 ? 2020"},
            "spec.savepoints.schedule: '0 0 0 1 1 ? 2020' never fires again",
        ),
        (
            {"schedule": "0 2 * * *", "interval": "1h"},
            "spec.savepoints.schedule: set interval or schedule, not both",
        ),
        ({"schedule": ""}, "spec.savepoints.schedule"),
    ],
)
def test_a_schedule_the_coordinator_cannot_follow_is_one_line_naming_it(
    minimal: dict[str, Any], savepoints: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ManifestError) as refused:
        manifest_from_document(_document(minimal, **savepoints), "job.yaml")

    said = [str(p) for p in refused.value.problems]
    assert len(said) == 1 and said[0].startswith(problem), said


def test_a_schedule_that_ran_out_leaves_the_unchanged_spec_valid(minimal: dict[str, Any]) -> None:
    """Checked when set or changed, not at every read (a reviewer's: an operator restart
    refused the job once the schedule's years were past)."""
    expired = _document(minimal, schedule="0 0 0 1 1 ? 2020")
    previous = copy.deepcopy(expired)

    manifest, tolerated = manifest_from_update(copy.deepcopy(expired), previous)

    assert manifest.spec.savepoints.schedule == "0 0 0 1 1 ? 2020"
    assert tolerated == ()
    changed = copy.deepcopy(expired)
    changed["spec"]["savepoints"]["schedule"] = "0 0 0 1 1 ? 2021"
    with pytest.raises(ManifestError, match="never fires again"):
        manifest_from_update(changed, previous)
