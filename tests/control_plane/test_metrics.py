"""The supervisor's Prometheus metrics, scraped over HTTP as Prometheus would."""

import asyncio
import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from helpers.fake_driver import STORAGE, FakeLauncher, NoJanitor, until
from helpers.ports import free_port
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint_operator.coordinator import CoordinatorConfig
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.metrics import CheckpointMetrics
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor

JOB = {"namespace": "default", "job": "orders"}


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
    assert not any(dict(labels).get("job") == "orders" for _, labels in _scrape(port)), (
        "a deleted job's series are gone"
    )
