"""The supervisor's Prometheus metrics, scraped over HTTP as Prometheus would."""

import asyncio
import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from helpers.fake_driver import STORAGE, FakeLauncher, NoJanitor, until
from helpers.ports import free_port
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CompletedCheckpoint,
    CoordinatorConfig,
    PersistedState,
)
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.metrics import CheckpointMetrics
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor

JOB = {"job_namespace": "default", "job_name": "orders"}


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _labels(**extra: str) -> frozenset[tuple[str, str]]:
    return frozenset({**JOB, **extra}.items())


def test_completions_failures_restores_and_lateness_are_counted() -> None:
    metrics = CheckpointMetrics(CollectorRegistry())
    port = free_port()
    metrics.serve(port, "127.0.0.1")
    job = metrics.job("default", "orders")
    launcher = FakeLauncher()

    async def scenario() -> None:
        async def save(record: JobRecord) -> None:
            return None

        supervisor = JobSupervisor(
            storage=STORAGE,
            config=CoordinatorConfig(interval=0.2, min_pause=0.0, timeout=5.0),
            restart_policy=RestartPolicySpec(RestartPolicyType.ON_FAILURE, 3, 0.01, 0.05),
            launcher=launcher,
            janitor=NoJanitor(),
            save=save,
            record=JobRecord(),
            observer=job,
        )
        run = asyncio.create_task(supervisor.run())
        await until(lambda: launcher.drivers and len(launcher.drivers[0].agent.completed) >= 3)
        launcher.drivers[0].code = DriverExit.FAILED
        await until(lambda: len(launcher.drivers) == 2 and launcher.drivers[1].agent.completed)
        launcher.drivers[1].code = DriverExit.FINISHED
        await run

    asyncio.run(scenario())
    samples = _scrape(port)

    completed = sum(len(d.agent.completed) for d in launcher.drivers)
    checkpoints = _labels(kind="checkpoint")
    assert (
        samples[
            ("spark_checkpoint_checkpoints_total", _labels(kind="checkpoint", outcome="completed"))
        ]
        == completed
    )
    assert samples[("spark_checkpoint_duration_seconds_count", checkpoints)] == completed
    assert samples[("spark_checkpoint_size_bytes_sum", checkpoints)] == 20 * completed
    created = [name for name, _ in samples if name.endswith("_created")]
    assert created == [], "a series of when each series was created reads as a count"
    # The fake agent of the first driver reports no restore; later attempts are counted
    # from the agent's restoredFrom.
    assert ("spark_checkpoint_trigger_lateness_seconds_count", _labels()) in samples

    job.forget()
    assert not any(dict(labels).get("job_name") == "orders" for _, labels in _scrape(port)), (
        "a deleted job's series are gone"
    )


def test_the_counts_alerts_rate_start_at_zero_and_only_those() -> None:
    """A series born at 1 has no sample before it: `increase()` would miss a job's first
    restore or first expired checkpoint (after every operator restart too)."""
    metrics = CheckpointMetrics(CollectorRegistry())
    port = free_port()
    metrics.serve(port, "127.0.0.1")

    metrics.job("default", "orders")

    samples = _scrape(port)
    started = {
        (name, dict(labels).get("kind"), dict(labels).get("outcome"))
        for (name, labels), value in samples.items()
        if value == 0 and dict(labels).get("job_name") == "orders"
    }
    assert started == {
        ("spark_checkpoint_restores_total", None, None),
        *(
            ("spark_checkpoint_checkpoints_total", kind, outcome)
            for kind in ("checkpoint", "savepoint")
            for outcome in (
                "completed",
                "Expired",
                "TaskDeclined",
                "InconsistentAcknowledgements",
                "FinalizeFailure",
            )
        ),
    }


def test_the_last_completion_comes_from_the_registry_a_supervisor_starts_with() -> None:
    """An operator restart: a job whose checkpoints stalled still has the series an alert on
    its age reads, before any checkpoint completes."""
    metrics = CheckpointMetrics(CollectorRegistry())
    port = free_port()
    metrics.serve(port, "127.0.0.1")

    def image(checkpoint_id: int, kind: CheckpointKind, completed: float) -> CompletedCheckpoint:
        return CompletedCheckpoint(checkpoint_id, kind, 1, f"/{checkpoint_id}", 1, 0.0, completed)

    registry = PersistedState(
        next_checkpoint_id=9,
        checkpoints=(
            image(7, CheckpointKind.CHECKPOINT, 700.0),
            image(8, CheckpointKind.CHECKPOINT, 800.0),
        ),
        savepoints=(image(5, CheckpointKind.SAVEPOINT, 500.0),),
    )
    JobSupervisor(
        storage=STORAGE,
        config=CoordinatorConfig(),
        restart_policy=RestartPolicySpec(RestartPolicyType.NEVER, 0, 1.0, 1.0),
        launcher=FakeLauncher(),
        janitor=NoJanitor(),
        save=_never_saved,
        record=JobRecord(coordinator=registry),
        observer=metrics.job("default", "orders"),
    )

    samples = _scrape(port)
    last = "spark_checkpoint_last_completion_timestamp_seconds"
    assert samples[(last, _labels(kind="checkpoint"))] == 800.0
    assert samples[(last, _labels(kind="savepoint"))] == 500.0

    # A later supervisor of the job (a resume, a retirement) whose registry lost its newest
    # image (disposed of) leaves what the metrics already say.
    metrics.job("default", "orders").registered([image(7, CheckpointKind.CHECKPOINT, 700.0)])
    assert _scrape(port)[(last, _labels(kind="checkpoint"))] == 800.0


async def _never_saved(record: JobRecord) -> None:
    raise AssertionError("nothing is saved before the supervisor runs")
