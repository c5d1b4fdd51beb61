"""The workload whose classes spark_jvm.py archives for the tests' driver JVMs: run as
`python spark_jvm_workload.py DIRECTORY`."""

import sys
from pathlib import Path

from pyspark.sql import SparkSession


def main(work: Path) -> None:
    """A stateful streaming query through foreachBatch and a batch read: the classes a
    coordinated job's driver loads."""
    source = work / "input"
    source.mkdir()
    for number in range(3):
        (source / f"{number}.txt").write_text("a b c a\n" * 50)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    words = spark.readStream.option("maxFilesPerTrigger", 1).text(str(source))
    counts = words.selectExpr("explode(split(value, ' ')) as word").groupBy("word").count()
    query = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", str(work / "checkpoint"))
        .foreachBatch(lambda batch, _: batch.write.mode("append").parquet(str(work / "out")))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert spark.read.parquet(str(work / "out")).count() > 0
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
