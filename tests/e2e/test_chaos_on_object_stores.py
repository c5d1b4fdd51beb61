"""The kill -9 chaos run of tests/e2e/test_local_runs.py once more, with the sink's output
and the checkpoint storage on object stores (S3: moto's server; Google Cloud Storage:
fake-gcs-server; Azure Blob Storage: Azurite; each on a loopback port): real PySpark
drivers killed at arbitrary points, restored from checkpoints stored there, and the output
read back through the sink's reader and compared with counts computed independently from
the input. Spark's own live checkpoint location stays on local disk (each attempt's fresh
work directory), as it does on a cluster (docs/data-plane.md).

Two runs: both on S3; the checkpoints on Azure and the output on Google Cloud Storage (each
store's storage and sink are tested alone, under failures, in tests/storage and tests/sink;
a run costs ~70 s of CPU the suite shares).

The credentials reach the driver only through the manifest's environment
(`spec.application.env`): this process's environment, which the runtime inherits, has none.
"""

import uuid
from pathlib import Path

import pytest
from e2e.test_local_runs import CHAOS_FILES_PER_BATCH, CHAOS_INPUT_FILES, kill_at_arbitrary_points

from helpers.job_run import JobRun
from helpers.objectstore import AzureServer, GCSServer, S3Server
from spark_checkpoint.sink import BatchRecord, read_committed
from spark_checkpoint.storage.layout import OWNER_FILE_NAME

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("checkpoints_on", "output_on"), [("s3", "s3"), ("azure", "gcs")], ids=["s3", "azure-gcs"]
)
def test_exactly_once_on_an_object_store_when_the_driver_is_killed_at_arbitrary_points(
    tmp_path: Path,
    checkpoints_on: str,
    output_on: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers: dict[str, S3Server | GCSServer | AzureServer] = {
        kind: request.getfixturevalue(f"{kind}_server") for kind in (checkpoints_on, output_on)
    }
    environment = {k: v for server in servers.values() for k, v in server.environment().items()}
    for name in environment:
        monkeypatch.delenv(name, raising=False)
    prefix = uuid.uuid4().hex
    checkpoints_uri = servers[checkpoints_on].uri(f"{prefix}/checkpoints")
    output_uri = servers[output_on].uri(f"{prefix}/output")
    run = JobRun(
        tmp_path / "job",
        # Slow copies make "during a snapshot copy" a window a kill can hit.
        env=environment,
        process_env={"SPARK_CHECKPOINT_COPY_DELAY": "0.05"},
        checkpointing={"storage": checkpoints_uri},
        output=output_uri,
        files_per_batch=CHAOS_FILES_PER_BATCH,
    )
    run.add_input(files=CHAOS_INPUT_FILES)
    run.start()
    # A reader's credentials, in this process only (the runtime started without them).
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    kill_at_arbitrary_points(run)  # and read the output back from the store: exactly-once

    output_store = servers[output_on].filesystem()
    output = output_store._strip_protocol(output_uri)
    batches = sorted(read_committed(run.output))
    assert output_store.find(f"{output}/_staging") == []
    # The killed attempts' data objects are gone: what is left is what the records list.
    listed = {
        f"{output}/{path}"
        for batch in batches
        for path, _size in BatchRecord.from_json(
            output_store.cat_file(f"{output}/committed/batch-{batch}.json"), str(batch)
        ).files
    }
    assert set(output_store.find(f"{output}/_data")) == listed
    assert not (tmp_path / "job" / "data" / "output").exists(), "nothing written locally"
    # Finished: retention discarded every checkpoint (the agent and, once no driver ran,
    # the janitor, both with the manifest's credentials), and garbage collection left no
    # unreferenced shared object from the killed attempts: only the record of the registry.
    checkpoint_store = servers[checkpoints_on].filesystem()
    checkpoints = checkpoint_store._strip_protocol(checkpoints_uri)
    owner_record = f"{checkpoints}/default/wordcount/{OWNER_FILE_NAME}"
    assert checkpoint_store.find(checkpoints) == [owner_record]
