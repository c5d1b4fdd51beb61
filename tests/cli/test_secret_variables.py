"""The manifest's variables in a local run. Those a Secret gives the pods on Kubernetes
(`valueFrom.secretKeyRef`, storage credentials) come from the run's own environment;
without them the run is refused with one line naming the field, before anything is
created. Spark's executors are in the driver's process (threads of its JVM; its Python
workers inherit its environment), so it gets `spec.executor.env` too, and a variable the
driver sets otherwise is named in a warning, never its values."""

import json
import os
from pathlib import Path

import pytest
import yaml

from helpers.fake_query import BATCHES_VARIABLE, run_cli, write_job


def _secret(key: str) -> dict[str, dict[str, str]]:
    return {"secretKeyRef": {"name": "s3-creds", "key": key}}


NAMES = ["AWS_SECRET_ACCESS_KEY", "REGION", "ROLE", "SINK_TOKEN", "SINK_FORMAT"]
# What a Python worker of the driver sees (Spark's inherit the driver's environment).
WORKER = f"""
import json, os, pathlib
seen = {{name: os.environ.get(name) for name in {NAMES!r}}}
pathlib.Path("seen.json").write_text(json.dumps(seen))
"""


def _job_with_variables(directory: Path) -> Path:
    manifest_path = write_job(directory, interval="1s")
    manifest = yaml.safe_load(manifest_path.read_text())
    manifest["spec"]["application"]["env"] = [
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": _secret("secret-key")},
        {"name": "REGION", "value": "common-region"},
    ]
    manifest["spec"]["driver"] = {
        "env": [
            {"name": "REGION", "value": "driver-region"},
            {"name": "ROLE", "value": "driver-role"},
        ]
    }
    manifest["spec"]["executor"] = {
        "env": [
            {"name": "ROLE", "value": "executor-role"},
            {"name": "SINK_TOKEN", "valueFrom": _secret("sink-token")},
            {"name": "SINK_FORMAT", "value": "executor-format"},
        ]
    }
    manifest_path.write_text(yaml.safe_dump(manifest))
    driver = directory / "driver.py"
    driver.write_text(
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {WORKER!r}], check=True)\n"
        + driver.read_text()
    )
    return manifest_path


@pytest.mark.parametrize(
    ("unset", "field"),
    [
        ("AWS_SECRET_ACCESS_KEY", "spec.application.env[0]"),
        ("SINK_TOKEN", "spec.executor.env[1]"),
    ],
)
def test_a_secret_variable_missing_from_a_local_run_refuses_it_naming_the_field(
    tmp_path: Path, unset: str, field: str
) -> None:
    _job_with_variables(tmp_path)
    environment = {
        **{k: v for k, v in os.environ.items() if k not in NAMES},
        "AWS_SECRET_ACCESS_KEY": "from-the-shell",
        "SINK_TOKEN": "token-from-the-shell",
        BATCHES_VARIABLE: "2",  # were it run, it would end
    }
    del environment[unset]

    refused = run_cli(tmp_path, "run", "-f", "job.yaml", environment=environment)

    assert refused.returncode == 1, refused.stdout
    key = _secret("sink-token" if unset == "SINK_TOKEN" else "secret-key")["secretKeyRef"]["key"]
    assert refused.stderr.splitlines() == [
        f"spark-checkpoint run: {unset} not set (on Kubernetes {field} takes {unset} from "
        f"Secret s3-creds, key {key}); a local run takes such variables from its own "
        "environment"
    ]
    assert not (tmp_path / ".spark-checkpoint").exists()


def test_a_local_driver_and_its_workers_get_the_driver_and_executor_variables(
    tmp_path: Path,
) -> None:
    _job_with_variables(tmp_path)
    environment = {
        **{k: v for k, v in os.environ.items() if k not in NAMES},
        "AWS_SECRET_ACCESS_KEY": "from-the-shell",
        "SINK_TOKEN": "token-from-the-shell",
        BATCHES_VARIABLE: "2",
    }

    run = run_cli(tmp_path, "run", "-f", "job.yaml", environment=environment)

    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((tmp_path / "seen.json").read_text()) == {
        "AWS_SECRET_ACCESS_KEY": "from-the-shell",
        "REGION": "driver-region",  # spec.driver.env wins over spec.application.env
        "ROLE": "driver-role",  # and over spec.executor.env
        "SINK_TOKEN": "token-from-the-shell",  # an executor's, from the run's environment
        "SINK_FORMAT": "executor-format",  # an executor's own
    }
    warnings = [line for line in run.stdout.splitlines() if "warning:" in line]
    assert len(warnings) == 1, run.stdout
    assert warnings[0].endswith(
        "warning: a local run's executors are in the driver's process and get the driver's "
        "REGION (spec.driver.env[0] over spec.application.env[1]), "
        "ROLE (spec.driver.env[1] over spec.executor.env[0])"
    )
    values = ["common-region", "driver-region", "driver-role", "executor-role", "executor-format"]
    for value in [*values, "from-the-shell"]:
        assert value not in run.stdout + run.stderr, "never a value"
