"""Prometheus metrics of the coordinators in this process (the operator, or a local run).

Every series is labelled with the job's namespace and name (``job_namespace``,
``job_name``: Prometheus sets ``job`` on every series it scrapes, and Kubernetes service
discovery or a ServiceMonitor ``namespace``, the target's; it would rename ours
``exported_...``); a deleted job's series are removed, and so are those of a job another
operator drives now. Served by ``prometheus_client``'s own
HTTP server on ``/metrics``.
"""

from collections.abc import Iterable
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from spark_checkpoint_operator.coordinator import (
    CheckpointKind,
    CompletedCheckpoint,
    FailureReason,
)
from spark_checkpoint_operator.supervisor import Observer, PeriodicSlot

_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)

JOB = ("job_namespace", "job_name")
# Series that start at 0 when the job's metrics start, so that `increase()` sees their first
# count (a series born at 1 has no sample before it): completions, the failures that count
# toward tolerableFailures, restores.
COUNTED_OUTCOMES = (
    "completed",
    *(r.value for r in FailureReason if r.counts_toward_tolerable_failures),
)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
SIZE_BUCKETS = tuple(float(1 << shift) for shift in range(10, 41, 3))  # 1 KiB .. 1 TiB
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class CheckpointMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # No `<counter>_created` series beside each (prometheus_client's default, for the
        # OpenMetrics format): `spark_checkpoint_checkpoints_created` read as a count of
        # checkpoints, and it held a time (a newcomer's). For the whole process: its own.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
        self.registry = registry
        self._jobs: dict[tuple[str, str], JobMetrics] = {}
        self.checkpoints = Counter(
            "spark_checkpoint_checkpoints",
            "Checkpoints and savepoints by how they ended (completed, or the failure reason).",
            [*JOB, "kind", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "spark_checkpoint_duration_seconds",
            "Time from trigger to completion of completed checkpoints and savepoints.",
            [*JOB, "kind"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.size = Histogram(
            "spark_checkpoint_size_bytes",
            "Bytes each completed checkpoint or savepoint added to storage.",
            [*JOB, "kind"],
            buckets=SIZE_BUCKETS,
            registry=registry,
        )
        self.last_completion = Gauge(
            "spark_checkpoint_last_completion_timestamp_seconds",
            "When the last checkpoint or savepoint of the job completed (Unix time).",
            [*JOB, "kind"],
            registry=registry,
        )
        self.restores = Counter(
            "spark_checkpoint_restores",
            "Driver attempts restored from a checkpoint or savepoint.",
            JOB,
            registry=registry,
        )
        self.lateness = Histogram(
            "spark_checkpoint_trigger_lateness_seconds",
            "How late the coordinator fired periodic triggers against their schedule.",
            JOB,
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )

    def job(self, namespace: str, name: str) -> "JobMetrics":
        """The same object for the same job, however often its daemon restarts: forgetting
        it then removes every series the job ever had."""
        key = (namespace, name)
        if key not in self._jobs:
            self._jobs[key] = JobMetrics(self, namespace, name)
        return self._jobs[key]

    def serve(self, port: int, address: str) -> None:
        start_http_server(port, address, registry=self.registry)


class JobMetrics(Observer):
    """The metrics of one job: what the supervisor reports as it happens."""

    def __init__(self, metrics: CheckpointMetrics, namespace: str, name: str) -> None:
        self._metrics = metrics
        self._job = (namespace, name)
        self._series: set[tuple[Counter | Gauge | Histogram, tuple[str, ...]]] = set()
        for kind in CheckpointKind:
            for outcome in COUNTED_OUTCOMES:
                self._child(metrics.checkpoints, kind.value, outcome)
        self._child(metrics.restores)

    def _child(self, collector: _Metric, *labels: str) -> _Metric:
        values = (*self._job, *labels)
        self._series.add((collector, values))
        return collector.labels(*values)

    def completed(self, checkpoint: CompletedCheckpoint) -> None:
        kind = checkpoint.kind.value
        m = self._metrics
        self._child(m.checkpoints, kind, "completed").inc()
        self._child(m.duration, kind).observe(checkpoint.duration)
        self._child(m.size, kind).observe(checkpoint.size_bytes)
        self._child(m.last_completion, kind).set(checkpoint.completion_time)

    def registered(self, images: Iterable[CompletedCheckpoint]) -> None:
        # An operator restart: the stored registry's newest completions, or a job whose
        # checkpoints stalled would have no series to alert on until one completes. Only
        # then: a later supervisor's registry may have lost its newest (disposed of).
        newest: dict[str, float] = {}
        for image in images:
            kind = image.kind.value
            newest[kind] = max(newest.get(kind, image.completion_time), image.completion_time)
        last = self._metrics.last_completion
        for kind, completion_time in newest.items():
            if (last, (*self._job, kind)) not in self._series:
                self._child(last, kind).set(completion_time)

    def failed(self, kind: CheckpointKind, reason: str) -> None:
        self._child(self._metrics.checkpoints, kind.value, reason).inc()

    def restored(self) -> None:
        self._child(self._metrics.restores).inc()

    def periodic(self, slot: PeriodicSlot) -> None:
        self._child(self._metrics.lateness).observe(slot.decided - slot.due)

    def forget(self) -> None:
        """The job is gone: its series go too (they would grow without bound)."""
        for collector, labels in self._series:
            collector.remove(*labels)
        self._series.clear()
        self._metrics._jobs.pop(self._job, None)
