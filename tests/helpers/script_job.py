"""`spark-checkpoint run` of a manifest whose driver is a small Python script: what a user
sees when a driver misbehaves (never serves an agent, fails at start) without a JVM."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

# The end of a script that finishes as a coordinated pipeline whose input is done:
# `run_coordinated` with a query that ends at once without a batch (exit 0, FINISHED). A
# script that ends without it is refused as misconfigured (spark_checkpoint.launch).
FINISH = """
from spark_checkpoint.driver import run_coordinated

class EndedQuery:
    isActive = False
    lastProgress = None
    recentProgress = []

    def exception(self):
        return None


class Writer:
    def option(self, key, value):
        return self

    def start(self):
        return EndedQuery()


run_coordinated(Writer())
"""


class ScriptJob:
    def __init__(
        self,
        directory: Path,
        script: str,
        *,
        name: str = "probe",
        restart_policy: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        storage: str | None = None,
    ) -> None:
        self.directory = directory
        self.name = name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "driver.py").write_text(textwrap.dedent(script))
        manifest = {
            "apiVersion": "sparkcheckpoint.io/v1alpha1",
            "kind": "SparkCheckpointJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "application": {
                    "mainFile": "driver.py",
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                },
                "restartPolicy": {"backoff": "100ms", **(restart_policy or {})},
                **({"checkpointing": {"storage": storage}} if storage else {}),
            },
        }
        self.manifest = directory / "job.yaml"
        self.manifest.write_text(yaml.safe_dump(manifest))

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def job_dir(self) -> Path:
        return self.state_dir / "default" / self.name

    def start(self, *options: str) -> "subprocess.Popen[str]":
        return subprocess.Popen(
            self.command(*options),
            cwd=self.directory,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *options: str, timeout: float = 60) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            self.command(*options),
            cwd=self.directory,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def command(self, *options: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "spark_checkpoint_operator.cli",
            "run",
            str(self.manifest),
            "--state-dir",
            str(self.state_dir),
            *options,
        ]


def wait_for_file(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still running"
        time.sleep(0.05)
