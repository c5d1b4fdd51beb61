"""A local run whose storage is on S3 (moto's server) with the credentials only in the
manifest's env: the driver writes its images with them, and the runtime's own storage work
(discarding what retention drops, collecting garbage after the driver stopped) uses them
too: the janitor runs with the driver's environment, as in a cleanup pod."""

import os
import subprocess
import time
import uuid
from pathlib import Path

import yaml

from helpers.fake_query import INPUT_BATCHES_VARIABLE, run_cli, write_job
from helpers.objectstore import AzureServer, S3Server
from helpers.script_job import wait_until_gone


def _cli(directory: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    # The run's own environment has no storage credentials.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return run_cli(directory, *args, environment=environment)


def test_retention_discards_on_s3_with_the_manifests_credentials(
    tmp_path: Path, s3_server: S3Server
) -> None:
    root = f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"
    manifest_path = write_job(tmp_path, interval="200ms")
    manifest = yaml.safe_load(manifest_path.read_text())
    manifest["spec"]["checkpointing"].update({"storage": root, "retained": 1})
    manifest["spec"]["application"]["env"] = [
        {"name": name, "value": value} for name, value in s3_server.environment().items()
    ]
    manifest_path.write_text(yaml.safe_dump(manifest))
    s3 = s3_server.filesystem()
    job_root = f"{root}/default/probe".removeprefix("s3://")

    def checkpoints() -> list[str]:
        if not s3.exists(job_root):
            return []
        return sorted(
            p for p in s3.ls(job_root, detail=False) if p.rsplit("/", 1)[1].startswith("chk-")
        )

    started = _cli(tmp_path, "run", "-f", "job.yaml", "--detach")
    assert started.returncode == 0, started.stderr
    runtime = int((tmp_path / ".spark-checkpoint" / "default" / "probe" / "run.lock").read_text())
    try:
        deadline = time.monotonic() + 90
        while True:
            status = _cli(tmp_path, "status", "-f", "job.yaml", "-o", "json")
            last = (
                yaml.safe_load(status.stdout or "{}").get("lastCheckpoint")
                if status.returncode == 0
                else None
            )
            if last is not None and last["id"] >= 5:
                break
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(0.2)
        # Retention keeps one: the ones before it are discarded from S3 (not at once).
        while len(checkpoints()) > 2:
            log = tmp_path / ".spark-checkpoint" / "default" / "probe" / "logs" / "runtime.log"
            assert time.monotonic() < deadline, (checkpoints(), log.read_text()[-2000:])
            time.sleep(0.2)
        stopped = _cli(tmp_path, "stop", "-f", "job.yaml")
        assert stopped.returncode == 0, stopped.stderr
    finally:
        _cli(tmp_path, "cancel", "-f", "job.yaml")
        wait_until_gone(runtime)
    log = (
        tmp_path / ".spark-checkpoint" / "default" / "probe" / "logs" / "runtime.log"
    ).read_text()
    # The garbage collection after the stop found them too (its failure would be a line).
    assert "cleanup failed" not in log and "NoCredentialsError" not in log, log
    assert "Suspended: " in log
    # The storage commands read it as the run does: with the manifest's endpoint and keys.
    listed = _cli(tmp_path, "list", "-f", "job.yaml", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    kinds = {row["kind"] for row in yaml.safe_load(listed.stdout)["snapshots"]}
    assert "savepoint" in kinds, listed.stdout
    for command in ("inspect", "verify"):
        result = _cli(tmp_path, command, "-f", "job.yaml")
        assert result.returncode == 0, (command, result.stdout, result.stderr)


def test_a_run_on_azure_with_the_manifests_credentials(
    tmp_path: Path, azure_server: AzureServer
) -> None:
    """adlfs takes its credentials as it is made: the run refused ("unable to connect to
    account") where they were the manifest's alone, before any driver started."""
    manifest_path = write_job(tmp_path, interval="200ms")
    manifest = yaml.safe_load(manifest_path.read_text())
    root = f"abfs://{azure_server.container}/{uuid.uuid4().hex}"
    manifest["spec"]["checkpointing"]["storage"] = root
    manifest["spec"]["application"]["env"] = [
        {"name": name, "value": value} for name, value in azure_server.environment().items()
    ] + [{"name": INPUT_BATCHES_VARIABLE, "value": "5"}]
    manifest_path.write_text(yaml.safe_dump(manifest))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}

    result = run_cli(tmp_path, "run", "-f", "job.yaml", environment=environment)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "checkpoint 1 complete" in result.stdout, result.stdout
    assert "Finished: " in result.stdout, result.stdout
    # The Azure SDK's INFO is each request's headers: 95% of an Azure driver's log.
    log = tmp_path / ".spark-checkpoint" / "default" / "probe" / "logs" / "driver-1.log"
    assert "azure.core" not in log.read_text()


def test_a_bucket_that_does_not_exist_is_named_before_spark_starts(
    tmp_path: Path, s3_server: S3Server
) -> None:
    """A newcomer's mistyped bucket read 'cannot claim the job's storage: The specified
    bucket does not exist', without the bucket, after two Spark starts (the restart policy
    retried the driver): the run claims the storage with the driver's credentials first."""
    root = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/checkpoints"
    manifest_path = write_job(tmp_path, interval="200ms")
    manifest = yaml.safe_load(manifest_path.read_text())
    manifest["spec"]["checkpointing"]["storage"] = root
    manifest["spec"]["application"]["env"] = [
        {"name": name, "value": value} for name, value in s3_server.environment().items()
    ]
    manifest_path.write_text(yaml.safe_dump(manifest))

    result = _cli(tmp_path, "run", "-f", "job.yaml")

    assert result.returncode == 1, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"spark-checkpoint run: cannot claim the job's storage: {root}/default/probe: "
    ), line
    assert "its bucket or container does not exist (at the endpoint" in line, line
    assert "starting driver" not in result.stdout, "no Spark was started"


def test_the_storage_commands_name_the_secret_variables_they_lack(
    tmp_path: Path, s3_server: S3Server
) -> None:
    """`list` with the keys unset printed only botocore's 'NoCredentialsError: Unable to
    locate credentials', where `run` names each variable, its field and its Secret (a
    newcomer's)."""
    manifest_path = write_job(tmp_path, interval="200ms")
    manifest = yaml.safe_load(manifest_path.read_text())
    manifest["spec"]["checkpointing"]["storage"] = f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"
    manifest["spec"]["application"]["env"] = [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": key}}}
        for name, key in (("AWS_ACCESS_KEY_ID", "id"), ("AWS_SECRET_ACCESS_KEY", "secret"))
    ]
    manifest_path.write_text(yaml.safe_dump(manifest))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    endpoint = s3_server.environment()
    environment |= {
        "AWS_ENDPOINT_URL": endpoint["AWS_ENDPOINT_URL"],
        "AWS_DEFAULT_REGION": endpoint["AWS_DEFAULT_REGION"],
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance to ask: at once
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    unset = (
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY not set (on Kubernetes "
        "spec.application.env[0] takes AWS_ACCESS_KEY_ID from Secret s3-creds, key id; "
        "spec.application.env[1] takes AWS_SECRET_ACCESS_KEY from Secret s3-creds, key secret)"
    )

    for command in ("list", "inspect", "verify"):
        result = run_cli(tmp_path, command, "-f", "job.yaml", environment=environment)

        assert result.returncode == 1, result.stdout + result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"spark-checkpoint {command}: "), line
        assert line.endswith(
            f"; {unset}: the storage commands take such variables from their own environment"
        ), line

    refused = run_cli(tmp_path, "run", "-f", "job.yaml", environment=environment)
    assert refused.stderr.splitlines() == [
        f"spark-checkpoint run: {unset}; a local run takes such variables from its own environment"
    ]


def test_local_storage_that_cannot_be_read_names_no_secret_variable(tmp_path: Path) -> None:
    """A Secret's variable (a database password) has nothing to do with local storage."""
    manifest_path = write_job(tmp_path, interval="200ms")
    manifest = yaml.safe_load(manifest_path.read_text())
    (tmp_path / "a-file").write_text("x")
    manifest["spec"]["checkpointing"]["storage"] = str(tmp_path / "a-file" / "under")
    manifest["spec"]["application"]["env"] = [
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}
    ]
    manifest_path.write_text(yaml.safe_dump(manifest))

    result = _cli(tmp_path, "list", "-f", "job.yaml")

    assert result.returncode == 1, result.stdout
    assert result.stderr.splitlines() == [
        f"spark-checkpoint list: I/O error: {tmp_path}/a-file/under/default/probe: Not a directory"
    ]
