"""Runs `spark-checkpoint run` on the reference word count in a temporary directory,
with hooks to kill the driver or interrupt the runtime at chosen points."""

import ipaddress
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "wordcount"
sys.path.insert(0, str(EXAMPLE))

from generate_input import generate  # noqa: E402
from ground_truth import expected_counts  # noqa: E402

from spark_checkpoint.sink import latest_values, read_committed  # noqa: E402


class JobRun:
    def __init__(
        self,
        directory: Path,
        *,
        bounded: bool = True,
        checkpointing: dict[str, Any] | None = None,
        restart_policy: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        process_env: dict[str, str] | None = None,
        spark_conf: dict[str, str] | None = None,
        shutdown: dict[str, Any] | None = None,
        name: str = "wordcount",
        output: str = "data/output",
        trigger_seconds: float | None = None,
        files_per_batch: int | None = None,
    ) -> None:
        self.directory = directory
        self.name = name
        # The run's own environment, which its driver inherits: for the agent's test knobs,
        # whose names (SPARK_CHECKPOINT_*) a manifest may not set.
        self.process_env = process_env or {}
        self.output = output  # the sink's output: relative to `directory`, or a URI
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy(EXAMPLE / "pipeline.py", directory / "pipeline.py")
        arguments = ["--input", "data/input", "--output", output]
        if trigger_seconds is not None:  # the word count's option (pipeline.py's default: 1)
            arguments += ["--trigger-seconds", str(trigger_seconds)]
        if files_per_batch is not None:  # its option too (default: 1)
            arguments += ["--files-per-batch", str(files_per_batch)]
        manifest = {
            "apiVersion": "sparkcheckpoint.io/v1alpha1",
            "kind": "SparkCheckpointJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "application": {
                    "mainFile": "pipeline.py",
                    "arguments": [*arguments, *(["--bounded"] if bounded else [])],
                    "sparkConf": {
                        "spark.sql.shuffle.partitions": "2",
                        "spark.master": "local[2]",
                        **(spark_conf or {}),
                    },
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                },
                "checkpointing": {
                    "interval": "3s",
                    "minPause": "500ms",
                    "timeout": "60s",
                    "retained": 2,
                    **(checkpointing or {}),
                },
                "shutdown": shutdown or {},
                "restartPolicy": {
                    "type": "OnFailure",
                    "maxRetries": 10,
                    "backoff": "500ms",
                    **(restart_policy or {}),
                },
            },
        }
        (directory / "job.yaml").write_text(yaml.safe_dump(manifest))
        self.lines: list[str] = []
        self._new_lines: queue.Queue[str] = queue.Queue()
        self.process: subprocess.Popen[str] | None = None

    @property
    def input_dir(self) -> Path:
        return self.directory / "data" / "input"

    @property
    def output_dir(self) -> Path:
        return self.directory / "data" / "output"

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def storage_dir(self) -> Path:
        return self.state_dir / "storage" / "default" / self.name

    @property
    def status_file(self) -> Path:
        return self.state_dir / "default" / self.name / "status.json"

    def add_input(self, files: int, start_index: int = 0, lines: int = 150) -> None:
        generate(self.input_dir, files=files, lines=lines, seed=11, start_index=start_index)

    def start(self, *options: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_checkpoint_operator.cli",
                "run",
                "job.yaml",
                "--state-dir",
                "state",
                *options,
            ],
            cwd=self.directory,
            env={**os.environ, **self.process_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            self._new_lines.put(line.rstrip())
        self._new_lines.put("")

    def wait_for_line(self, pattern: str, timeout: float = 300) -> re.Match[str]:
        """Block until the runtime prints a line matching ``pattern`` (seen lines included
        only if they arrive after this call)."""
        deadline = time.monotonic() + timeout
        expression = re.compile(pattern)
        while time.monotonic() < deadline:
            try:
                line = self._new_lines.get(timeout=1)
            except queue.Empty:
                continue
            if match := expression.search(line):
                return match
            if line == "" and self.process is not None and self.process.poll() is not None:
                break
        raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines))

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.status_file.read_text())
        return document

    def kill_driver(self) -> None:
        """kill -9 of the driver and its JVM, as a node or OOM kill would."""
        pid = self.status()["driver"]["pid"]
        os.killpg(pid, signal.SIGKILL)

    def driver_listening_addresses(self) -> set[str]:
        """The addresses the driver's processes (its Python, its JVM) listen on."""
        return listening_addresses(self.status()["driver"]["pid"])

    def interrupt(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)

    def wait(self, timeout: float = 600) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()  # its driver dies with it (PR_SET_PDEATHSIG)
            raise AssertionError("run timed out; output:\n" + "\n".join(self.lines)) from None

    def output_counts(self) -> dict[str, int]:
        return {w: int(row["count"]) for w, row in latest_values(self._output_url, "word").items()}

    def expected_counts(self) -> dict[str, int]:
        return expected_counts(self.input_dir)

    def committed_batches(self) -> list[int]:
        return sorted(read_committed(self._output_url))

    @property
    def _output_url(self) -> str:
        return self.output if "://" in self.output else str(self.directory / self.output)


def listening_addresses(process_group: int) -> set[str]:
    """The local addresses of the TCP sockets that processes of `process_group` listen on,
    from /proc (``127.0.0.1``, ``::``, ``192.0.2.2``...)."""
    inodes: set[str] = set()
    for process in Path("/proc").iterdir():
        try:
            if not process.name.isdigit() or os.getpgid(int(process.name)) != process_group:
                continue
            for descriptor in (process / "fd").iterdir():
                target = os.readlink(descriptor)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except OSError:  # gone meanwhile
            continue
    addresses: set[str] = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                address = bytes.fromhex(local.split(":")[0])
                # /proc prints each 32-bit word in the host's (little-endian) byte order.
                words = [address[i : i + 4][::-1] for i in range(0, width, 4)]
                ip = ipaddress.ip_address(b"".join(words))
                mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
                addresses.add(str(mapped or ip))  # a JVM's IPv4 sockets are in tcp6
    return addresses
