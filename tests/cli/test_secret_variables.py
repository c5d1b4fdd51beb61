"""Variables a Secret gives the pods on Kubernetes (`valueFrom.secretKeyRef`, storage
credentials) come from the run's own environment in a local run; without them the run is
refused with one line, before anything is created."""

import json
import os
import time
from pathlib import Path

import yaml

from helpers.fake_query import run_cli, write_job
from helpers.script_job import wait_until_gone

SECRET = {"secretKeyRef": {"name": "s3-creds", "key": "secret-key"}}


def _job_with_secret_variable(directory: Path) -> Path:
    manifest_path = write_job(directory, interval="1s")
    manifest = yaml.safe_load(manifest_path.read_text())
    manifest["spec"]["application"]["env"] = [
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": SECRET},
        {"name": "REGION", "value": "common"},
    ]
    manifest["spec"]["driver"] = {"env": [{"name": "REGION", "value": "driver"}]}
    manifest_path.write_text(yaml.safe_dump(manifest))
    driver = directory / "driver.py"
    names = ["AWS_SECRET_ACCESS_KEY", "REGION"]
    seen = f"json.dumps({{k: os.environ.get(k) for k in {names!r}}})"
    driver.write_text(
        f"import json, os, pathlib\npathlib.Path('seen.json').write_text({seen})\n"
        + driver.read_text()
    )
    return manifest_path


def test_a_secret_variable_missing_from_a_local_run_refuses_it_naming_the_secret(
    tmp_path: Path,
) -> None:
    _job_with_secret_variable(tmp_path)
    environment = {k: v for k, v in os.environ.items() if k != "AWS_SECRET_ACCESS_KEY"}

    refused = run_cli(tmp_path, "run", "-f", "job.yaml", environment=environment)

    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        "spark-checkpoint run: AWS_SECRET_ACCESS_KEY not set: on Kubernetes "
        "AWS_SECRET_ACCESS_KEY comes from Secret s3-creds (key secret-key); a local run "
        "takes such variables from its own environment"
    ]
    assert not (tmp_path / ".spark-checkpoint").exists()


def test_a_local_driver_gets_secret_variables_from_the_run_and_the_driver_env(
    tmp_path: Path,
) -> None:
    _job_with_secret_variable(tmp_path)
    environment = {**os.environ, "AWS_SECRET_ACCESS_KEY": "from-the-shell"}

    started = run_cli(tmp_path, "run", "-f", "job.yaml", "--detach", environment=environment)
    assert started.returncode == 0, started.stderr
    seen_file = tmp_path / "seen.json"
    deadline = time.monotonic() + 60
    while not seen_file.exists() or not seen_file.read_text():
        assert time.monotonic() < deadline, "the driver never started"
        time.sleep(0.1)
    runtime = int((tmp_path / ".spark-checkpoint" / "default" / "probe" / "run.lock").read_text())
    assert run_cli(tmp_path, "cancel", "-f", "job.yaml", environment=environment).returncode == 0
    wait_until_gone(runtime)

    assert json.loads(seen_file.read_text()) == {
        "AWS_SECRET_ACCESS_KEY": "from-the-shell",
        "REGION": "driver",  # spec.driver.env wins over spec.application.env
    }
