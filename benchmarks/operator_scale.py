"""Operator scale: N jobs in one operator process, against a cluster (issue 4).

The benchmark talks to the cluster as the operator does, through a kubeconfig
(``--kubeconfig``): it creates the jobs, starts the operator under test with the same
kubeconfig, ``spark-checkpoint-operator`` (Kopf's ``run`` of the operator's handlers)
as it runs in its Deployment (the process that is measured), and reads back what it needs
through the API: the jobs' phases and checkpoint counts, their size, and the requests
the API server served, from its ``/metrics`` (``apiserver_request_total``).

On this machine the cluster is the emulated API server with simulated drivers, started
beforehand as a process of their own (``tests/helpers/kube/launch.py``; benchmarks/README.md
says how). With ``--agents-log`` (the simulated agents' log), trigger lateness is the time
a periodic trigger arrives at its agent minus the time the coordinator had scheduled it
for; without it (a real cluster), the time the operator got the trigger's answer. The
scheduled time comes from the coordinator itself: when the operator imports this module
(``spark-checkpoint-operator -m operator_scale`` with ``OPERATOR_SCALE_PROBE`` set), it
adds an observer to every job (the supervisor reports each consumed periodic slot and each
trigger sent) that writes one line per consumed slot; the module imports nothing the
operator has not loaded already (the Kubernetes client and prometheus_client come with it).
``--idle-poll`` sets the operator's own setting.

As root, the operator runs SCHED_FIFO, so other work on a shared machine does not take its
core. Results and method: benchmarks/README.md, section 4.

    .venv/bin/python benchmarks/operator_scale.py --kubeconfig KUBECONFIG --jobs 1000 --interval 10
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
PROBE_VARIABLE = "OPERATOR_SCALE_PROBE"
IDLE_POLL_VARIABLE = "SPARK_CHECKPOINT_IDLE_POLL_SECONDS"  # the operator's setting
TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024
TRIGGER_LINE = re.compile(r"\S+/job-\d+: trigger (checkpoint|savepoint) \d+")
SAMPLE_SECONDS = 1.0
TARGET_LATENESS = 1.0
TARGET_CORES = 1.0
TARGET_RSS_MIB = 500.0
JOBS = ("sparkcheckpoint.io", "v1alpha1", "sparkcheckpointjobs")


# --- the probe, inside the operator process ---------------------------------------------


def _install_probe(path: str) -> None:
    """Record, per periodic slot a job's coordinator consumes, when it was due, when the
    Tick handled it, and when the trigger request was sent and answered. One line each:
    ``ip checkpoint_id due decided sent answered next_due`` (checkpoint_id -1: declined).
    The operator tells every job's observers (``handlers.JOB_OBSERVERS``)."""
    # Imported here: the operator has these loaded already; nothing else enters it.
    from spark_checkpoint_operator.agent_client import AgentClient  # noqa: PLC0415
    from spark_checkpoint_operator.kubernetes.handlers import JOB_OBSERVERS  # noqa: PLC0415
    from spark_checkpoint_operator.supervisor import Observer, PeriodicSlot  # noqa: PLC0415

    out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (the process's life)

    class Probe(Observer):
        """One job's: a slot's trigger is sent before the slot is reported."""

        def __init__(self) -> None:
            self._sent: dict[int, tuple[str, float, float]] = {}

        def trigger_sent(
            self, checkpoint_id: int, agent: AgentClient, sent: float, answered: float
        ) -> None:
            host = urlsplit(agent.url or "").hostname or "-"
            self._sent[checkpoint_id] = (host, sent, answered)

        def periodic(self, slot: PeriodicSlot) -> None:
            next_due = slot.next_due or 0.0
            if slot.checkpoint_id is None:
                out.write(f"- -1 {slot.due:.6f} {slot.decided:.6f} 0 0 {next_due:.6f}\n")
                return
            sent = self._sent.pop(slot.checkpoint_id, None)
            self._sent.clear()  # requested checkpoints' triggers: no slot reports them
            if sent is not None:
                host, at, answered = sent
                out.write(
                    f"{host} {slot.checkpoint_id} {slot.due:.6f} {slot.decided:.6f} {at:.6f}"
                    f" {answered:.6f} {next_due:.6f}\n"
                )

    JOB_OBSERVERS.append(lambda namespace, name: Probe())


# --- measuring processes -------------------------------------------------------------------


def cpu_seconds(pid: int, task: int | None = None) -> float:
    """User + system CPU time of a process (or one of its threads) so far."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    with open(path, encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def waited_seconds(pid: int) -> float:
    """How long the process's main thread (the operator's event loop) has waited for a CPU
    while runnable (``/proc/<pid>/schedstat``): time other processes took from it."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as schedstat:
        return int(schedstat.read().split()[1]) / 1e9


def memory_mib(pid: int) -> dict[str, float]:
    """Resident set size now (VmRSS) and its peak so far (VmHWM), in MiB."""
    found = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
    return found


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of a sorted sample."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class Sample:
    at: float
    operator_cpu: float
    operator_waited: float
    operator_rss: float
    harness_cpu: float
    load: float


@dataclass
class Sampler:
    """Samples CPU and memory of the operator and of this process every second, in a thread."""

    operator: int
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        try:
            sample = Sample(
                at=time.time(),
                operator_cpu=cpu_seconds(self.operator),
                operator_waited=waited_seconds(self.operator),
                operator_rss=memory_mib(self.operator)["VmRSS"],
                harness_cpu=cpu_seconds(os.getpid()),
                load=os.getloadavg()[0],
            )
        except (FileNotFoundError, KeyError):
            return  # the operator has exited (the run reports why)
        self.samples.append(sample)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(SAMPLE_SECONDS):
                self.sample()

        self.sample()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]


def cores(samples: Sequence[Sample], metric: Callable[[Sample], float]) -> float:
    if len(samples) < 2:
        return math.nan
    first, last = samples[0], samples[-1]
    return (metric(last) - metric(first)) / (last.at - first.at)


def busiest(samples: Sequence[Sample], metric: Callable[[Sample], float], window: int) -> float:
    """The highest CPU use (cores) over any ``window`` consecutive sampling intervals."""
    if len(samples) <= window:
        return cores(samples, metric)
    return max(cores(samples[i : i + window + 1], metric) for i in range(len(samples) - window))


# --- the cluster, through its API ---------------------------------------------------------------


@dataclass(frozen=True)
class JobTotals:
    phases: dict[str, int]
    completed: int
    failed: int


@dataclass(frozen=True)
class ServerMetrics:
    """What the API server's ``/metrics`` said at one time."""

    at: float
    requests: collections.Counter[str]  # by kind: "<verb> <resource>[/<subresource>]"
    cpu_seconds: float | None  # process_cpu_seconds_total, if the server reports it


class Cluster:
    """The cluster the kubeconfig names, as the benchmark uses it: jobs created and listed
    through the API, the API server's request counts read from its ``/metrics`` (on a real
    cluster that needs ``get`` on the non-resource URL ``/metrics``)."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self._api = config.new_client_from_config(config_file=str(kubeconfig))
        self._jobs = client.CustomObjectsApi(self._api)
        self.namespace = namespace

    def create_job(self, body: Mapping[str, Any]) -> None:
        self._jobs.create_namespaced_custom_object(*JOBS[:2], self.namespace, JOBS[2], body)

    def jobs(self) -> list[dict[str, Any]]:
        listed = self._jobs.list_namespaced_custom_object(*JOBS[:2], self.namespace, JOBS[2])
        items: list[dict[str, Any]] = listed["items"]
        return items

    def job_totals(self) -> JobTotals:
        """Phases and checkpoint counters over every job."""
        phases: collections.Counter[str] = collections.Counter()
        completed = failed = 0
        for job in self.jobs():
            status = job.get("status") or {}
            phases[str(status.get("phase", "-"))] += 1
            counts = status.get("counts") or {}
            completed += int(counts.get("completed", 0))
            failed += int(counts.get("failed", 0))
        return JobTotals(dict(phases), completed, failed)

    def job_object_bytes(self) -> int:
        """The median size of a job object as JSON (of the first 50), as a GET returns it:
        what every status patch returns and every watch event carries."""
        kind = {"apiVersion": "/".join(JOBS[:2]), "kind": "SparkCheckpointJob"}
        sizes = [len(json.dumps({**kind, **job})) for job in self.jobs()[:50]]
        return int(statistics.median(sizes)) if sizes else 0

    def metrics(self) -> ServerMetrics:
        method, url, headers, _, _ = self._api.param_serialize(
            "GET", "/metrics", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"]
        )
        response = self._api.call_api(method, url, header_params=headers)
        response.read()
        if response.status != 200:
            raise RuntimeError(f"GET /metrics: {response.status} {response.data[:200]!r}")
        return parse_metrics(response.data.decode("utf-8"), time.time())


def parse_metrics(text: str, at: float) -> ServerMetrics:
    """``apiserver_request_total`` by kind, and the server's CPU time, from the Prometheus
    text format. Non-resource requests (discovery) are named by their path; the
    benchmark's own scrapes of ``/metrics`` are left out."""
    requests: collections.Counter[str] = collections.Counter()
    cpu = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_cpu_seconds_total":
                cpu = sample.value
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            if labels.get("resource"):
                resource = labels["resource"]
                if labels.get("subresource"):
                    resource += f"/{labels['subresource']}"
            elif labels.get("subresource") == "/metrics":
                continue
            else:
                resource = labels.get("subresource", "")
            requests[f"{labels.get('verb', '')} {resource}"] += int(sample.value)
    return ServerMetrics(at, requests, cpu)


# --- jobs ----------------------------------------------------------------------------------


def job(name: str, namespace: str, interval: float) -> dict[str, Any]:
    """A job as in tests/kubernetes/test_operator_simulated.py: a local master, so no
    executor pods; a checkpoint every ``interval`` seconds."""
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "example/orders:1",
            "application": {
                "mainFile": "local:///opt/app/orders.py",
                "sparkConf": {"spark.master": "local[2]"},
            },
            "checkpointing": {
                "interval": f"{interval:g}s",
                "minPause": "1s",
                "timeout": "60s",
                "retained": 2,
                "storage": "file:///simulated",
            },
            "restartPolicy": {"type": "OnFailure", "maxRetries": 3, "backoff": "1s"},
        },
    }


# --- lateness --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    host: str
    checkpoint_id: int
    due: float
    decided: float
    sent: float
    answered: float
    next_due: float


def read_slots(path: Path) -> list[Slot]:
    slots: list[Slot] = []
    if not path.exists():
        return slots
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) != 7:
            continue  # a line cut short by the operator's exit
        host, checkpoint_id, *times = parts
        slots.append(Slot(host, int(checkpoint_id), *(float(t) for t in times)))
    return slots


def quantiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(percentile(ordered, 0.50), 4),
        "p95": round(percentile(ordered, 0.95), 4),
        "p99": round(percentile(ordered, 0.99), 4),
        "max": round(ordered[-1], 4) if ordered else math.nan,
    }


def lateness(
    slots: Sequence[Slot],
    arrivals: Mapping[tuple[str, int], float] | None,
    start: float,
    end: float,
    interval: float,
) -> dict[str, Any]:
    """Lateness of the periodic slots due in [start, end): until the trigger arrived at its
    agent, or without ``arrivals`` (the agents' log), until the operator got its answer."""
    due = [s for s in slots if start <= s.due < end]
    triggered = [s for s in due if s.checkpoint_id >= 0]
    if arrivals is None:
        arrived = [(s, s.answered) for s in triggered]
    else:
        arrived = [
            (s, arrivals[s.host, s.checkpoint_id])
            for s in triggered
            if (s.host, s.checkpoint_id) in arrivals
        ]
    late = [at - s.due for s, at in arrived]
    return {
        "until": "the answer at the operator" if arrivals is None else "the arrival at the agent",
        "slots": len(due),
        "declined": len(due) - len(triggered),
        "not_arrived": len(triggered) - len(arrived),
        "skipped_slots": sum(max(0, round((s.next_due - s.due) / interval) - 1) for s in triggered),
        "jobs": len({s.host for s in triggered}),
        "lateness": quantiles(late),
        "over_1s": sum(1 for value in late if value > TARGET_LATENESS),
        # Where the time goes: Tick handled after the slot (event loop, the status poll
        # before it), the status write before the trigger, the trigger's HTTP request.
        "tick_after_due": quantiles([s.decided - s.due for s, _ in arrived]),
        "persist_before_trigger": quantiles([s.sent - s.decided for s, _ in arrived]),
        "trigger_request": quantiles([at - s.sent for s, at in arrived]),
    }


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentsLog:
    """What the simulated agents logged (``helpers.kube.launch --agents-log``): when each
    trigger arrived, by (host, checkpoint id), and their requests per (second, route)."""

    arrivals: dict[tuple[str, int], float]
    requests: list[tuple[int, str, int]]

    @classmethod
    def read(cls, path: Path) -> AgentsLog:
        arrivals: dict[tuple[str, int], float] = {}
        requests: list[tuple[int, str, int]] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by the agents' exit
            if "checkpoint_id" in entry:
                arrivals[entry["host"], entry["checkpoint_id"]] = entry["at"]
            elif "second" in entry:
                requests.append((entry["second"], entry["route"], entry["count"]))
        return cls(arrivals, requests)


def start_operator(probe: Path, log: TextIO, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    priority = ["chrt", "--fifo", "1"] if args.realtime else []
    operator = Path(sys.executable).parent / "spark-checkpoint-operator"
    command = [*priority, str(operator), "-m", Path(__file__).stem, f"--namespace={args.namespace}"]
    python_path = os.pathsep.join(filter(None, [str(BENCHMARKS), os.environ.get("PYTHONPATH")]))
    environment = {
        **os.environ,
        "KUBECONFIG": str(args.kubeconfig),
        "PYTHONPATH": python_path,
        PROBE_VARIABLE: str(probe),
        "SPARK_CHECKPOINT_METRICS_PORT": "0",  # its endpoint off: nothing scrapes it here
    }
    if args.idle_poll is not None:
        environment[IDLE_POLL_VARIABLE] = str(args.idle_poll)
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
    )


class OperatorExited(RuntimeError):
    """The operator under test ended during the run; the message ends with its log's tail."""

    def __init__(self, operator: subprocess.Popen[bytes], log: Path) -> None:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        super().__init__(f"the operator exited with {operator.returncode}:\n" + "\n".join(tail))


def stop(process: subprocess.Popen[Any], timeout: float) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def profile(
    args: argparse.Namespace, work: Path, pids: Mapping[str, int]
) -> list[subprocess.Popen[bytes]]:
    """py-spy over the measured window (``--profile``): collapsed stacks per process in the
    work directory. Diagnosis only: sampling costs the sampled process some time."""
    if not args.profile:
        return []
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return [
        subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(args.duration)),
                "--gil",
                "--rate",
                "100",
                "--format",
                "raw",
                "--output",
                str(work / f"{name}.stacks"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Timeline:
    """What a run saw, for the summary."""

    sampler: Sampler
    began: float = 0.0
    created: float = 0.0
    running: float = 0.0
    start: float = 0.0
    end: float = 0.0
    phases_when_settled: dict[str, int] = field(default_factory=dict)
    before: JobTotals | None = None
    after: JobTotals | None = None
    served_before: ServerMetrics | None = None
    served_after: ServerMetrics | None = None
    peak_rss: float = 0.0
    job_bytes: int = 0


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    cluster = Cluster(args.kubeconfig, args.namespace)
    with (work / "operator.log").open("w") as operator_log:
        operator = start_operator(work / "probe.txt", operator_log, args)
        sampler = Sampler(operator.pid)
        sampler.start()
        timeline = Timeline(sampler)
        try:
            run(args, work, cluster, operator, timeline)
        finally:
            sampler.stop()
            stop(operator, 20.0)  # Kopf stops 1000s of daemons slowly; nothing to measure
    say("analysing")
    return summarize(args, work, timeline)


def run(
    args: argparse.Namespace,
    work: Path,
    cluster: Cluster,
    operator: subprocess.Popen[bytes],
    timeline: Timeline,
) -> None:
    """Apply the jobs, wait until they run, and measure for ``args.duration``."""
    timeline.began = time.time()
    for index in range(args.jobs):
        if args.ramp:  # jobs applied at a steady rate, not in one burst
            time.sleep(max(0.0, timeline.began + index / args.ramp - time.time()))
        cluster.create_job(job(f"job-{index:05d}", args.namespace, args.interval))
    timeline.created = time.time()
    say(f"{args.jobs} jobs created in {timeline.created - timeline.began:.0f}s")
    phases = wait_running(cluster, args, work, operator).phases
    timeline.running = time.time()
    say(f"{phases} after {timeline.running - timeline.began:.0f}s; settling {args.settle:.0f}s")
    time.sleep(args.settle)
    # The jobs are listed outside the window, so the requests counted are the operator's.
    timeline.before = cluster.job_totals()
    timeline.phases_when_settled = timeline.before.phases
    timeline.served_before = cluster.metrics()
    timeline.start = time.time()
    say(f"measuring for {args.duration:.0f}s")
    profilers = profile(args, work, {"operator": operator.pid, "harness": os.getpid()})
    while time.time() < timeline.start + args.duration:
        time.sleep(min(10.0, timeline.start + args.duration - time.time()))
        if operator.poll() is not None:
            raise OperatorExited(operator, work / "operator.log")
    timeline.end = time.time()
    timeline.served_after = cluster.metrics()
    timeline.after = cluster.job_totals()
    for profiler in profilers:
        profiler.wait()
    timeline.peak_rss = memory_mib(operator.pid)["VmHWM"]
    timeline.job_bytes = cluster.job_object_bytes()


def summarize(args: argparse.Namespace, work: Path, timeline: Timeline) -> dict[str, Any]:
    assert timeline.before is not None and timeline.after is not None
    start, end, seconds = timeline.start, timeline.end, timeline.end - timeline.start
    assert timeline.served_before is not None and timeline.served_after is not None
    agents = AgentsLog.read(args.agents_log) if args.agents_log else None
    window = timeline.sampler.between(start, end)
    served = timeline.served_after.requests - timeline.served_before.requests
    arrivals = None if agents is None else agents.arrivals
    triggers = lateness(read_slots(work / "probe.txt"), arrivals, start, end, args.interval)
    completed = timeline.after.completed - timeline.before.completed
    operator_cores = cores(window, lambda s: s.operator_cpu)
    rss = [s.operator_rss for s in window]
    result = {
        "jobs": args.jobs,
        "interval_s": args.interval,
        "window_s": round(seconds, 1),
        "settle_s": args.settle,
        "experiments": {"idle_poll_s": args.idle_poll},
        "startup": {
            "create_s": round(timeline.created - timeline.began, 1),
            "ramp_jobs_per_s": args.ramp,
            "all_running_s": round(timeline.running - timeline.began, 1)
            if timeline.phases_when_settled.get("Running", 0) >= args.jobs
            else None,
            "phases_when_measuring": timeline.phases_when_settled,
        },
        "operator": {
            "cpu_cores": round(operator_cores, 3),
            "cpu_cores_busiest_10s": round(busiest(window, lambda s: s.operator_cpu, 10), 3),
            # Share of the window the event loop was runnable but had no CPU.
            "waited_for_cpu": round(cores(window, lambda s: s.operator_waited), 3),
            "priority": "SCHED_FIFO 1" if args.realtime else "normal",
            "cpu_ms_per_completed_checkpoint": round(1000 * operator_cores * seconds / completed, 2)
            if completed
            else None,
            "rss_mib_median": round(statistics.median(rss), 1),
            "rss_mib_max": round(max(rss), 1),
            "rss_mib_peak_since_start": round(timeline.peak_rss, 1),
            "log": operator_log_summary(work / "operator.log", end),
        },
        "operator_timeline_10s": [
            {
                "t": round(b.at - start),
                "cores": round(cores([a, b], lambda s: s.operator_cpu), 2),
                "waited_for_cpu": round(cores([a, b], lambda s: s.operator_waited), 2),
                "rss_mib": round(b.operator_rss),
            }
            for a, b in itertools.pairwise(window[::10])
        ],
        "triggers": triggers,
        "checkpoints": {
            "completed": completed,
            "failed": timeline.after.failed - timeline.before.failed,
            "expected": round(args.jobs * seconds / args.interval),
            "phases_at_end": timeline.after.phases,
        },
        "api": {
            "requests_per_s": round(sum(served.values()) / seconds, 1),
            "job_status_patches_per_s": round(
                served["PATCH sparkcheckpointjobs/status"] / seconds, 1
            ),
            "by_kind_per_s": {k: round(v / seconds, 2) for k, v in served.most_common()},
            "job_object_bytes": timeline.job_bytes,
        },
        "agents": None if agents is None else agent_requests(agents, start, end),
        "other_processes": {
            "api_server_process_cpu_cores": server_cores(
                timeline.served_before, timeline.served_after
            ),
            "harness_process_cpu_cores": round(cores(window, lambda s: s.harness_cpu), 3),
        },
        "load_1min": {
            "min": min(s.load for s in window),
            "median": statistics.median(s.load for s in window),
            "max": max(s.load for s in window),
        },
    }
    result["targets"] = {
        "p99_lateness_le_1s": triggers["lateness"]["p99"] <= TARGET_LATENESS,
        "cpu_le_1_core": operator_cores <= TARGET_CORES,
        "rss_le_500_mib": max(rss) <= TARGET_RSS_MIB,
    }
    return result


def agent_requests(agents: AgentsLog, start: float, end: float) -> dict[str, Any]:
    """The agents' requests per second over the window, in total and by route."""
    by_route = collections.Counter[str]()
    for second, route, count in agents.requests:
        if start <= second < end:
            by_route[route] += count
    seconds = end - start
    return {
        "requests_per_s": round(sum(by_route.values()) / seconds, 1),
        "by_route_per_s": {k: round(v / seconds, 2) for k, v in by_route.most_common()},
    }


def server_cores(before: ServerMetrics, after: ServerMetrics) -> float | None:
    """The API server process's CPU use over the window, if its /metrics reports it."""
    if before.cpu_seconds is None or after.cpu_seconds is None:
        return None
    return round((after.cpu_seconds - before.cpu_seconds) / (after.at - before.at), 3)


def operator_log_summary(path: Path, until: float) -> dict[str, Any]:
    """Warnings and errors the operator logged until the end of the window, by kind, and
    checkpoint ids triggered twice for one job over the whole run (never allowed)."""
    kinds: collections.Counter[str] = collections.Counter()
    triggered: collections.Counter[str] = collections.Counter()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if found := TRIGGER_LINE.search(line):
            triggered[found.group(0)] += 1
        try:
            logged = datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue  # a traceback's lines
        if logged <= until and ("[WARNING" in line or "[ERROR" in line):
            message = line.split("] ", 2)[-1]
            kinds[re.sub(r"job-\d+|\d+(\.\d+)?", "N", message)[:120]] += 1
    return {
        "warnings_and_errors": dict(kinds.most_common(10)),
        "triggers_logged": sum(triggered.values()),
        "ids_triggered_twice": sorted(key for key, count in triggered.items() if count > 1)[:20],
    }


def wait_running(
    cluster: Cluster, args: argparse.Namespace, work: Path, operator: subprocess.Popen[bytes]
) -> JobTotals:
    deadline = time.time() + args.startup_timeout
    while True:
        totals = cluster.job_totals()
        if totals.phases.get("Running", 0) >= args.jobs:
            return totals
        if operator.poll() is not None:
            raise OperatorExited(operator, work / "operator.log")
        if time.time() > deadline:
            # Measured anyway: an operator that cannot keep every job Running is a result.
            say(f"not all jobs Running after {args.startup_timeout:.0f}s: {totals.phases}")
            return totals
        say(f"phases {totals.phases}")
        time.sleep(5.0)


def result_name(args: argparse.Namespace) -> str:
    name = f"operator_scale-{args.jobs}x{args.interval:g}s"
    if args.idle_poll is not None:
        name += f"-idle{args.idle_poll:g}s"
    return name + ("-quick" if args.quick else "")


def readme_row(result: Mapping[str, Any]) -> str:
    """One row of the results table in benchmarks/README.md."""
    operator, triggers = result["operator"], result["triggers"]
    late = triggers["lateness"]
    return (
        f"| {result['jobs']:,} @ {result['interval_s']:g} s | {result['window_s']:.0f} s"
        f" | {late['p50']:.3f} / {late['p95']:.3f} / {late['p99']:.3f} / {late['max']:.3f} s"
        f" | {operator['cpu_cores']:.2f} ({operator['cpu_cores_busiest_10s']:.2f})"
        f" | {operator['rss_mib_median']:.0f} / {operator['rss_mib_max']:.0f}"
        f" ({operator['rss_mib_peak_since_start']:.0f})"
        f" | {result['checkpoints']['completed']:,} / {result['checkpoints']['failed']}"
        f" | {result['api']['job_status_patches_per_s']:.0f}"
        f" | {result['api']['requests_per_s']:.0f}"
        f" / {result['agents']['requests_per_s'] if result['agents'] else '-'} |"
    )


# --- results -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return {"cpus": os.cpu_count(), "memory_gib": round(kib / MIB, 1), "python": sys.version}


def git(*arguments: str) -> str:
    command = ["git", "-C", str(ROOT), *arguments]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def git_commit() -> str:
    return git("rev-parse", "--short", "HEAD")


def changed_files() -> list[str]:
    """Uncommitted changes under operator/ at the end: the code measured may differ from
    the commit (other sessions edit the tree)."""
    return [line for line in git("status", "--short", "operator").splitlines() if line]


# --- command line ------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        required=True,
        help="the cluster's; the operator under test gets it too",
    )
    parser.add_argument("--namespace", default="default", help="where the jobs go")
    parser.add_argument(
        "--agents-log",
        type=Path,
        help="the simulated agents' log (helpers.kube.launch --agents-log): lateness until"
        " a trigger arrives at its agent, and the agents' requests",
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=10.0, help="checkpoint interval, s")
    parser.add_argument("--duration", type=float, default=180.0, help="measured window, s")
    parser.add_argument(
        "--settle", type=float, default=None, help="wait after all Running (default: interval)"
    )
    parser.add_argument(
        "--ramp", type=float, default=25.0, help="jobs created per second (0: all at once)"
    )
    parser.add_argument(
        "--startup-timeout", type=float, default=180.0, help="wait for all Running at most"
    )
    parser.add_argument(
        "--idle-poll", type=float, help="experiment: the controllers' idle poll interval, s"
    )
    parser.add_argument(
        "--no-realtime",
        dest="realtime",
        action="store_false",
        help="run the operator at normal priority (by default, as root, it runs SCHED_FIFO:"
        " a core of its own whenever it is runnable, whatever else runs on this machine)",
    )
    parser.add_argument("--quick", action="store_true", help="20 jobs @ 5 s for 15 s (CI runs it)")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS,
        help="where the result file goes (default: benchmarks/results)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy (implies --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.interval, args.duration = 20, 5.0, 15.0
    args.keep = args.keep or args.profile
    args.realtime = args.realtime and os.geteuid() == 0
    if args.settle is None:
        args.settle = args.interval
    return args


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    # `kill` or `timeout`: clean up (the operator stops) first.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started, commit = datetime.now(UTC).isoformat(timespec="seconds"), git_commit()
    changes_at_start = changed_files()
    work = Path(tempfile.mkdtemp(prefix="operator-scale-"))
    try:
        result = measure(args, work)
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    path = args.results_dir / f"{result_name(args)}.json"
    document = {
        "benchmark": "operator_scale",
        "started": started,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "commit": commit,  # at the start; the operator loads its code then
        "uncommitted_in_operator_at_start": changes_at_start,
        "uncommitted_in_operator_at_end": changed_files(),
        **result,
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    print(readme_row(result))
    say(f"wrote {path}\n{readme_row(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
elif os.environ.get(PROBE_VARIABLE):
    _install_probe(os.environ[PROBE_VARIABLE])
