"""Operator scale: N jobs with simulated drivers in one operator process (issue 4).

Three processes share the machine:

- this one: the emulated API server (``tests/helpers/kube/emulator.py``, in a thread) and
  the sampler;
- a child process: the simulated kubelet and every simulated agent
  (``tests/helpers/kube/simulated.py``), which records when each trigger arrives;
- the operator, ``kopf run --standalone -m spark_checkpoint_operator.kubernetes.handlers``,
  as it runs in its Deployment. This is the process that is measured.

Trigger lateness is the time a periodic trigger arrives at its agent minus the time the
coordinator had scheduled it for. The scheduled time comes from the coordinator itself:
when the operator imports this module (``kopf run ... -m operator_scale`` with
``OPERATOR_SCALE_PROBE`` set), it adds an observer to every job (the supervisor reports
each consumed periodic slot and each trigger sent) that writes one line per consumed
slot; the module imports nothing else into the operator. ``--idle-poll`` sets the
operator's own setting.

Everything runs in a private network namespace (``unshare``) when it can, so the agents'
fixed port 8484 does not collide with tests running on the same machine; as root, the
operator runs SCHED_FIFO, so other work on a shared machine does not take its core.
Results and method: benchmarks/README.md, section 4.

    .venv/bin/python benchmarks/operator_scale.py --jobs 1000 --interval 10
    .venv/bin/python benchmarks/operator_scale.py --jobs 10000 --interval 60 --duration 300
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import math
import os
import re
import shlex
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
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from aiohttp import web

    from helpers.kube.emulator import ApiServerEmulator, EmulatedApiServer

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
TESTS = ROOT / "tests"
RESULTS = BENCHMARKS / "results"
PROBE_VARIABLE = "OPERATOR_SCALE_PROBE"
IDLE_POLL_VARIABLE = "SPARK_CHECKPOINT_IDLE_POLL_SECONDS"  # the operator's setting
NETNS_VARIABLE = "OPERATOR_SCALE_IN_NETNS"
OPERATOR_MODULE = "spark_checkpoint_operator.kubernetes.handlers"
TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024
TRIGGER_LINE = re.compile(r"\S+/job-\d+: trigger (checkpoint|savepoint) \d+")
SAMPLE_SECONDS = 1.0
DRAIN_SECONDS = 5.0
TARGET_LATENESS = 1.0
TARGET_CORES = 1.0
TARGET_RSS_MIB = 500.0


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


# --- the simulated cluster, in a child process ---------------------------------------------


def _simulated_cluster(api_url: str, out: Path, batch_seconds: float) -> None:
    """Run the simulated kubelet and agents until SIGTERM; then write what the agents saw."""
    sys.path.insert(0, str(TESTS))
    from helpers.kube.simulated import SimulatedAgents, SimulatedKubelet  # noqa: PLC0415
    from spark_checkpoint.protocol import TriggerBody  # noqa: PLC0415

    class RecordingAgents(SimulatedAgents):
        """Simulated agents that note when each trigger arrives and count requests."""

        def __init__(self) -> None:
            super().__init__(batch_seconds=batch_seconds, ack_delay=(0.01, 0.2))
            self.arrivals: list[tuple[str, int, float]] = []
            self.per_second: collections.Counter[tuple[int, str]] = collections.Counter()

        def _agent(self, request: web.Request) -> Any:
            route = request.path.rsplit("/", 1)[-1]
            route = {"checkpoints": "trigger", "collect-garbage": "garbage"}.get(route, route)
            self.per_second[int(time.time()), route] += 1
            return super()._agent(request)

        async def _trigger(self, request: web.Request) -> web.Response:
            arrived = time.time()
            response = await super()._trigger(request)
            # Read once already (aiohttp keeps it) and found the protocol's document.
            body = TriggerBody.from_json(await request.json())
            host = (request.host or "").rsplit(":", 1)[0]
            self.arrivals.append((host, body.checkpoint_id, arrived))
            return response

    async def main() -> None:
        agents = RecordingAgents()
        kubelet = SimulatedKubelet(api_url, agents)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await agents.start()
        await kubelet.start()
        print("ready", flush=True)
        await stop.wait()
        document = {
            "arrivals": agents.arrivals,
            "requests": [[s, r, n] for (s, r), n in sorted(agents.per_second.items())],
        }
        out.write_text(json.dumps(document), encoding="utf-8")
        await kubelet.stop()
        await agents.stop()

    asyncio.run(main())


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
    simulated_cpu: float
    harness_cpu: float
    emulator_cpu: float
    load: float


@dataclass
class Sampler:
    """Samples CPU and memory of the three processes every second, in a thread."""

    operator: int
    simulated: int
    emulator_thread: int
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> Sample:
        me = os.getpid()
        sample = Sample(
            at=time.time(),
            operator_cpu=cpu_seconds(self.operator),
            operator_waited=waited_seconds(self.operator),
            operator_rss=memory_mib(self.operator)["VmRSS"],
            simulated_cpu=cpu_seconds(self.simulated),
            harness_cpu=cpu_seconds(me),
            emulator_cpu=cpu_seconds(me, self.emulator_thread),
            load=os.getloadavg()[0],
        )
        self.samples.append(sample)
        return sample

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


# --- the emulator's side ---------------------------------------------------------------------


def _request_kind(request: Any) -> str:
    resource = request.resource.plural if request.resource is not None else "discovery"
    if request.subresource:
        resource += f"/{request.subresource}"
    if request.params.get("watch") in ("true", "1"):
        return f"WATCH {resource}"
    return f"{getattr(request.method, 'value', request.method)} {resource}"


def drain_requests(emulator: ApiServerEmulator) -> collections.Counter[str]:
    """Count the requests served since the last call by kind, and forget them. kmock
    keeps every request and every version of every object, which would grow without end
    at this rate; only the latest version of each object is kept."""
    counts = collections.Counter(_request_kind(r) for r in emulator._requests)
    emulator._requests.clear()
    for payload in emulator._payloads:
        requests = getattr(payload, "_requests", None)
        if isinstance(requests, list):
            requests.clear()
    for obj in emulator._objects.values():
        if len(obj.history) > 2:
            del obj.history[:-2]
    return counts


def serve_resources_directly() -> None:
    """Hand resource requests straight to the emulator's own handler (in this process).
    kmock decides which reaction serves a request by scanning every request recorded so
    far through each reaction's filter, so each request costs more than the one before;
    at hundreds of requests per second that, not the emulated API, became the bottleneck.
    Discovery still goes through kmock; no test reactions exist here to take precedence."""
    from helpers.kube.emulator import ApiServerEmulator  # noqa: PLC0415

    through_kmock = ApiServerEmulator._handle

    async def handle(self: ApiServerEmulator, request: Any) -> Any:
        if request.resource is None or not request.resource.plural:
            return await through_kmock(self, request)
        for payload in self._payloads:
            if getattr(payload.response, "payload", None) == self._serve:
                return await payload(request)
        raise RuntimeError("the emulator serves no resources")

    ApiServerEmulator._handle = handle  # type: ignore[method-assign]


def job_object_bytes(emulator: ApiServerEmulator) -> int:
    """The median size of a job object as JSON (of the first 50): what every status patch
    returns and every watch event carries."""
    from helpers.kube.emulator import SPARK_CHECKPOINT_JOBS  # noqa: PLC0415

    sizes = [
        len(json.dumps(obj.last.raw))
        for (resource, _, _), obj in emulator._objects.items()
        if resource == SPARK_CHECKPOINT_JOBS and not obj.deleted
    ][:50]
    return int(statistics.median(sizes)) if sizes else 0


@dataclass(frozen=True)
class JobTotals:
    phases: dict[str, int]
    completed: int
    failed: int


def job_totals(emulator: ApiServerEmulator) -> JobTotals:
    """Phases and checkpoint counters over every job, read in place (no copies)."""
    from helpers.kube.emulator import SPARK_CHECKPOINT_JOBS  # noqa: PLC0415

    phases: collections.Counter[str] = collections.Counter()
    completed = failed = 0
    for (resource, _, _), obj in emulator._objects.items():
        if resource != SPARK_CHECKPOINT_JOBS or obj.deleted:
            continue
        status = obj.last.get("status") or {}
        phases[str(status.get("phase", "-"))] += 1
        counts = status.get("counts") or {}
        completed += int(counts.get("completed", 0))
        failed += int(counts.get("failed", 0))
    return JobTotals(dict(phases), completed, failed)


class RequestLog:
    """The emulator's request counts, drained every few seconds, with their times."""

    def __init__(self, api: EmulatedApiServer) -> None:
        self._api = api
        self.drains: list[tuple[float, collections.Counter[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def drain(self) -> None:
        self.drains.append((time.time(), self._api.call(drain_requests)))

    def _loop(self) -> None:
        while not self._stop.wait(DRAIN_SECONDS):
            self.drain()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> collections.Counter[str]:
        """Requests drained after ``start`` up to ``end`` (drain at both ends)."""
        total: collections.Counter[str] = collections.Counter()
        for at, counts in self.drains:
            if start < at <= end:
                total += counts
        return total


# --- jobs ----------------------------------------------------------------------------------


def job(name: str, interval: float) -> dict[str, Any]:
    """A job as in tests/kubernetes/test_operator_simulated.py: a local master, so no
    executor pods; a checkpoint every ``interval`` seconds."""
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": name, "namespace": "default"},
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
    arrivals: Mapping[tuple[str, int], float],
    start: float,
    end: float,
    interval: float,
) -> dict[str, Any]:
    """Lateness of the periodic slots due in [start, end)."""
    due = [s for s in slots if start <= s.due < end]
    triggered = [s for s in due if s.checkpoint_id >= 0]
    arrived = [
        (s, arrivals[s.host, s.checkpoint_id])
        for s in triggered
        if (s.host, s.checkpoint_id) in arrivals
    ]
    late = [at - s.due for s, at in arrived]
    return {
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


def start_simulated(api_url: str, out: Path, batch_seconds: float, log: TextIO) -> Any:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--simulated-cluster",
        api_url,
        "--agents-out",
        str(out),
        "--batch-seconds",
        str(batch_seconds),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError("the simulated cluster did not start (see its log)")
    return process


def start_operator(
    kubeconfig: Path, probe: Path, log: TextIO, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    priority = ["chrt", "--fifo", "1"] if args.realtime else []
    command = [*priority, sys.executable, "-m", "kopf", "run", "--standalone"]
    command += ["-m", OPERATOR_MODULE, "-m", Path(__file__).stem, "--namespace=default"]
    python_path = os.pathsep.join(filter(None, [str(BENCHMARKS), os.environ.get("PYTHONPATH")]))
    environment = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONPATH": python_path,
        PROBE_VARIABLE: str(probe),
        "SPARK_CHECKPOINT_METRICS_PORT": "9090",  # its own network namespace: free
    }
    if args.idle_poll is not None:
        environment[IDLE_POLL_VARIABLE] = str(args.idle_poll)
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
    )


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


def emulator_thread_id() -> int:
    for thread in threading.enumerate():
        if thread.name == "kube-api-emulator" and thread.native_id is not None:
            return thread.native_id
    raise RuntimeError("no emulator thread")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Timeline:
    """What a run saw, for the summary."""

    sampler: Sampler
    requests: RequestLog
    began: float = 0.0
    created: float = 0.0
    running: float = 0.0
    start: float = 0.0
    end: float = 0.0
    phases_when_settled: dict[str, int] = field(default_factory=dict)
    before: JobTotals | None = None
    after: JobTotals | None = None
    peak_rss: float = 0.0
    job_bytes: int = 0


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sys.path.insert(0, str(TESTS))
    from helpers.kube.emulator import spark_checkpoint_api  # noqa: PLC0415

    serve_resources_directly()
    # A real API server resumes watches from minutes of history (etcd compaction runs
    # every 5 minutes); the default log of 1000 changes would be seconds at this rate.
    with (
        spark_checkpoint_api(event_log_size=200_000, timeout=120.0) as api,
        (work / "simulated.log").open("w") as simulated_log,
        (work / "operator.log").open("w") as operator_log,
    ):
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        requests = RequestLog(api)
        requests.start()
        simulated = start_simulated(
            api.url, work / "agents.json", args.batch_seconds, simulated_log
        )
        operator = start_operator(kubeconfig, work / "probe.txt", operator_log, args)
        sampler = Sampler(operator.pid, simulated.pid, emulator_thread_id())
        sampler.start()
        timeline = Timeline(sampler, requests)
        try:
            run(args, work, api, operator, timeline)
        finally:
            sampler.stop()
            requests.stop()
            stop(operator, 20.0)  # Kopf stops 1000s of daemons slowly; nothing to measure
            stop(simulated, 60.0)
    say("analysing")
    return summarize(args, work, timeline)


def run(
    args: argparse.Namespace,
    work: Path,
    api: EmulatedApiServer,
    operator: subprocess.Popen[bytes],
    timeline: Timeline,
) -> None:
    """Apply the jobs, wait until they run, and measure for ``args.duration``."""
    timeline.began = time.time()
    for index in range(args.jobs):
        if args.ramp:  # jobs applied at a steady rate, not in one burst
            time.sleep(max(0.0, timeline.began + index / args.ramp - time.time()))
        api.create(
            "sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs",
            job(f"job-{index:05d}", args.interval),
            namespace="default",
        )
    timeline.created = time.time()
    say(f"{args.jobs} jobs created in {timeline.created - timeline.began:.0f}s")
    phases = wait_running(api, args, operator).phases
    timeline.running = time.time()
    say(f"{phases} after {timeline.running - timeline.began:.0f}s; settling {args.settle:.0f}s")
    time.sleep(args.settle)
    timeline.requests.drain()
    timeline.start, timeline.before = time.time(), api.call(job_totals)
    timeline.phases_when_settled = timeline.before.phases
    say(f"measuring for {args.duration:.0f}s")
    profilers = profile(args, work, {"operator": operator.pid, "harness": os.getpid()})
    while time.time() < timeline.start + args.duration:
        time.sleep(min(10.0, timeline.start + args.duration - time.time()))
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited with {operator.returncode}")
    timeline.requests.drain()
    timeline.end, timeline.after = time.time(), api.call(job_totals)
    for profiler in profilers:
        profiler.wait()
    timeline.peak_rss = memory_mib(operator.pid)["VmHWM"]
    timeline.job_bytes = api.call(job_object_bytes)


def summarize(args: argparse.Namespace, work: Path, timeline: Timeline) -> dict[str, Any]:
    assert timeline.before is not None and timeline.after is not None
    start, end, seconds = timeline.start, timeline.end, timeline.end - timeline.start
    agents = json.loads((work / "agents.json").read_text(encoding="utf-8"))
    arrivals = {(host, cid): at for host, cid, at in agents["arrivals"]}
    window = timeline.sampler.between(start, end)
    served = timeline.requests.between(start, end)
    agent_requests = collections.Counter[str]()
    for second, route, count in agents["requests"]:
        if start <= second < end:
            agent_requests[route] += count
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
        "agents": {
            "requests_per_s": round(sum(agent_requests.values()) / seconds, 1),
            "by_route_per_s": {k: round(v / seconds, 2) for k, v in agent_requests.most_common()},
        },
        "other_processes": {
            "emulator_thread_cpu_cores": round(cores(window, lambda s: s.emulator_cpu), 3),
            "harness_process_cpu_cores": round(cores(window, lambda s: s.harness_cpu), 3),
            "simulated_cluster_cpu_cores": round(cores(window, lambda s: s.simulated_cpu), 3),
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
    api: EmulatedApiServer, args: argparse.Namespace, operator: subprocess.Popen[bytes]
) -> JobTotals:
    deadline = time.time() + args.startup_timeout
    while True:
        totals = api.call(job_totals)
        if totals.phases.get("Running", 0) >= args.jobs:
            return totals
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited with {operator.returncode}")
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
        f" | {result['api']['requests_per_s']:.0f} / {result['agents']['requests_per_s']:.0f} |"
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


def in_network_namespace(argv: Sequence[str]) -> int | None:
    """Run this script again in a private network namespace; None if that is impossible."""
    if os.environ.get(NETNS_VARIABLE) or shutil.which("unshare") is None:
        return None
    # As root: a network namespace only (the operator's priority can still be raised).
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    probe = subprocess.run([*unshare, "true"], check=False, capture_output=True)
    if probe.returncode != 0:
        return None
    inner = shlex.join([sys.executable, str(Path(__file__).resolve()), *argv])
    environment = {**os.environ, NETNS_VARIABLE: "1"}
    script = f"ip link set lo up && exec {inner}"
    command = [*unshare, "sh", "-c", script]
    return subprocess.run(command, check=False, env=environment).returncode


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
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
    parser.add_argument("--batch-seconds", type=float, default=1.0, help="simulated batch time")
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
    parser.add_argument("--no-netns", action="store_true", help="use the host's network")
    parser.add_argument("--simulated-cluster", metavar="API_URL", help=argparse.SUPPRESS)
    parser.add_argument("--agents-out", type=Path, help=argparse.SUPPRESS)
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
    if args.simulated_cluster:
        _simulated_cluster(args.simulated_cluster, args.agents_out, args.batch_seconds)
        return 0
    if not args.no_netns and (code := in_network_namespace(argv)) is not None:
        return code
    # `kill` or `timeout`: clean up (the operator and the simulated cluster stop) first.
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
