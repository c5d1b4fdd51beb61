"""The emulated API server, and with it the simulated cluster, as a process of its own: for
programs that reach a cluster only through a kubeconfig, like the operator-scale benchmark.

    cd tests && python -m helpers.kube.launch --kubeconfig-out /tmp/kubeconfig --simulated-cluster

It writes the kubeconfig, then prints ``ready <server URL>`` on stdout once the server
answers and the simulated kubelet and agents run; SIGTERM or SIGINT stops it cleanly (the
simulated cluster first, so the agents' log is complete).

- ``--simulated-cluster``: the simulated kubelet and agents (``simulated.py``) run in a child
  process, so they do not share the emulator's core. With ``--agents-log PATH`` the agents
  write JSON lines as they serve: ``{"host", "checkpoint_id", "at"}`` when a trigger
  arrives (``at`` in Unix seconds), and ``{"second", "route", "count"}`` per second and
  route of the agent API (trigger, status, finalize, complete, abort, discard, garbage).
- ``--fast-path`` hands resource requests straight to the emulator's own handler. kmock
  chooses the reaction serving a request by scanning every request recorded so far
  through each reaction's filter, so each request costs more than the one before: at
  hundreds of requests per second that, not the emulated API, became the bottleneck.
  Discovery still goes through kmock (no test reactions exist in this process).
- ``--trim-history SECONDS``: kmock keeps every request and every version of every
  object, which grows without end at that rate; this forgets them every SECONDS (the
  latest two versions of each object stay).
- ``--event-log-size``: a real API server resumes watches from minutes of history (etcd
  compaction runs every 5 minutes); the default log of 1000 changes is seconds at scale.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from aiohttp import web
from kmock._internal import rendering

from helpers.kube.emulator import (
    OPERATOR_CRDS,
    ApiServerEmulator,
    serve,
    write_kubeconfig,
)
from helpers.kube.simulated import SimulatedAgents, SimulatedKubelet
from spark_checkpoint.protocol import TriggerBody
from spark_checkpoint_operator.manifest.crd import load_crd

TESTS = Path(__file__).resolve().parents[2]
_AGENT_ROUTES = {"checkpoints": "trigger", "collect-garbage": "garbage"}


class FastPathEmulator(ApiServerEmulator):
    """The emulator without kmock's reaction scan for resource requests (``--fast-path``)."""

    async def _handle(self, request: rendering.Request) -> web.StreamResponse:
        if request.resource is None or not request.resource.plural:
            return await super()._handle(request)
        for payload in self._payloads:
            if getattr(payload.response, "payload", None) == self._serve:
                response: web.StreamResponse = await payload(request)
                return response
        raise RuntimeError("the emulator serves no resources")


def forget_history(emulator: ApiServerEmulator) -> None:
    """Forget the requests served and all but the latest two versions of each object."""
    emulator._requests.clear()
    for payload in emulator._payloads:
        requests = getattr(payload, "_requests", None)
        if isinstance(requests, list):
            requests.clear()
    for obj in emulator._objects.values():
        if len(obj.history) > 2:
            del obj.history[:-2]


class LoggedAgents(SimulatedAgents):
    """Simulated agents that log when each trigger arrives, and their requests per second."""

    def __init__(self, batch_seconds: float, log: TextIO | None) -> None:
        super().__init__(batch_seconds=batch_seconds, ack_delay=(0.01, 0.2))
        self._log = log
        self._second = 0
        self._per_route: collections.Counter[str] = collections.Counter()

    def _agent(self, request: web.Request) -> object:
        second = int(time.time())
        if second != self._second:
            self.flush()
            self._second = second
        route = request.path.rsplit("/", 1)[-1]
        self._per_route[_AGENT_ROUTES.get(route, route)] += 1
        return super()._agent(request)

    async def _trigger(self, request: web.Request) -> web.Response:
        arrived = time.time()
        response = await super()._trigger(request)
        # Read once already (aiohttp keeps it) and found the protocol's document.
        body = TriggerBody.from_json(await request.json())
        host = (request.host or "").rsplit(":", 1)[0]
        self._write({"host": host, "checkpoint_id": body.checkpoint_id, "at": arrived})
        return response

    def flush(self) -> None:
        """Log the counts of the second that ended."""
        for route, count in sorted(self._per_route.items()):
            self._write({"second": self._second, "route": route, "count": count})
        self._per_route.clear()

    def _write(self, line: dict[str, object]) -> None:
        if self._log is not None:
            self._log.write(json.dumps(line) + "\n")


async def simulated_cluster(api_url: str, batch_seconds: float, log_path: Path | None) -> None:
    """The simulated kubelet and agents until SIGTERM (the child process)."""
    with contextlib.ExitStack() as files:
        log = None if log_path is None else files.enter_context(log_path.open("w", buffering=1))
        agents = LoggedAgents(batch_seconds, log)
        kubelet = SimulatedKubelet(api_url, agents)
        stop = _stop_on_signals()
        await agents.start()
        await kubelet.start()
        print("ready", flush=True)
        await stop.wait()
        await kubelet.stop()
        await agents.stop()
        agents.flush()


async def launch(args: argparse.Namespace) -> int:
    emulator_class = FastPathEmulator if args.fast_path else ApiServerEmulator
    emulator = emulator_class(
        validators=OPERATOR_CRDS,
        event_log_size=args.event_log_size,
    )
    for crd in OPERATOR_CRDS:
        emulator.register_crd(load_crd(crd))
    stop = _stop_on_signals()
    async with serve(emulator, args.host, args.port) as url:
        args.kubeconfig_out.parent.mkdir(parents=True, exist_ok=True)
        write_kubeconfig(url, args.kubeconfig_out)
        cluster = await _start_simulated_cluster(args, url) if args.simulated_cluster else None
        trimming = asyncio.create_task(_trim(emulator, args.trim_history))
        print(f"ready {url}", flush=True)
        waits = [asyncio.create_task(stop.wait())]
        if cluster is not None:
            waits.append(asyncio.create_task(cluster.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        trimming.cancel()
        if cluster is not None and cluster.returncode is not None:
            print(f"the simulated cluster exited with {cluster.returncode}", file=sys.stderr)
            return 1
        if cluster is not None:
            cluster.terminate()
            await cluster.wait()
    return 0


async def _start_simulated_cluster(
    args: argparse.Namespace, url: str
) -> asyncio.subprocess.Process:
    command = [sys.executable, "-m", "helpers.kube.launch", "--agents-for", url]
    command += ["--kubeconfig-out", str(args.kubeconfig_out)]
    command += ["--batch-seconds", str(args.batch_seconds)]
    if args.agents_log is not None:
        command += ["--agents-log", str(args.agents_log)]
    python_path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": python_path}
    )
    assert process.stdout is not None
    if (await process.stdout.readline()).strip() != b"ready":
        process.kill()
        await process.wait()
        raise RuntimeError("the simulated cluster did not start (see its messages above)")
    return process


async def _trim(emulator: ApiServerEmulator, seconds: float) -> None:
    if seconds <= 0:
        return
    while True:
        await asyncio.sleep(seconds)
        forget_history(emulator)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    return stop


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.kube.launch", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument("--kubeconfig-out", type=Path, required=True, help="write it here")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="default: any free port")
    parser.add_argument(
        "--simulated-cluster", action="store_true", help="run the simulated kubelet and agents"
    )
    parser.add_argument("--batch-seconds", type=float, default=1.0, help="simulated batch time")
    parser.add_argument("--agents-log", type=Path, help="the simulated agents' log (JSON lines)")
    parser.add_argument("--event-log-size", type=int, default=1000, help="watch history")
    parser.add_argument("--fast-path", action="store_true", help="skip kmock's reaction scan")
    parser.add_argument(
        "--trim-history", type=float, default=0.0, metavar="SECONDS", help="0: never"
    )
    parser.add_argument("--agents-for", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.agents_log is not None and not args.simulated_cluster and not args.agents_for:
        parser.error("--agents-log needs --simulated-cluster")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    if args.agents_for:
        asyncio.run(simulated_cluster(args.agents_for, args.batch_seconds, args.agents_log))
        return 0
    return asyncio.run(launch(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
