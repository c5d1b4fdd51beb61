"""A PySpark pipeline that starts its query itself, with real Spark: refused at once, as
misconfigured, rather than after `restartPolicy.startTimeout` of an agent that never
answers (5 minutes by default) while the query runs uncoordinated; and one that sets the
query's checkpoint location, which run_coordinated would replace without a word."""

import json
from pathlib import Path

import pytest

from helpers.script_job import ScriptJob

pytestmark = pytest.mark.spark

PIPELINE = """
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("uncoordinated").getOrCreate()
query = (
    spark.readStream.format("rate").load()
    .writeStream.format("noop").START
)
open("query-started", "w").close()
query.awaitTermination()
"""


STARTED = (
    "the pipeline starts its query with DataStreamWriter.{}(): hand the writer to "
    "spark_checkpoint.driver.run_coordinated(writer, participants=[...]), which starts it "
    "coordinated"
)
LOCATION = (
    "the pipeline sets the query's checkpointLocation: leave it out; run_coordinated starts "
    "each attempt in a fresh one, restored from the job's newest image"
)


@pytest.mark.parametrize(
    ("start", "reason"),
    [
        ("start()", STARTED.format("start")),
        # Spark's option keys are case-insensitive. (toTable and options: test_launch.py.)
        ("option('checkpointlocation', '/tmp/mine').start()", LOCATION),
    ],
)
def test_a_query_started_or_placed_outside_run_coordinated_fails_the_job_at_once(
    tmp_path: Path, start: str, reason: str
) -> None:
    job = ScriptJob(tmp_path, PIPELINE.replace("START", start), restart_policy={"maxRetries": 3})

    result = job.run(timeout=300)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"    its error:\n    {reason}" in result.stdout
    assert "job failed: driver cannot run: MISCONFIGURED\n" in result.stdout
    assert "starting driver attempt 2" not in result.stdout, "retrying cannot help"
    assert not (tmp_path / "query-started").exists()
    status = json.loads((job.job_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Failed"
