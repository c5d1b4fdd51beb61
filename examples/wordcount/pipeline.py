"""Reference pipeline: a stateful word count over a replayable file source, written
exactly-once through the two-phase-commit sink.

The only line that differs from a plain Structured Streaming job is the last one:
``run_coordinated(writer, participants=[sink])`` instead of ``writer.start()``.

Usage (normally through `spark-checkpoint run job.yaml`):
    python pipeline.py --input DIR --output DIR [--bounded] [--trigger-seconds N]
"""

import argparse

from pyspark.sql import SparkSession

from spark_checkpoint.driver import run_coordinated
from spark_checkpoint.sink import TransactionalFileSink


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--bounded", action="store_true", help="process what is there, then end")
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--files-per-batch", type=int, default=1)
    args = parser.parse_args()

    spark = SparkSession.builder.appName("wordcount").getOrCreate()
    words = (
        spark.readStream.schema("word STRING, n INT")
        .option("maxFilesPerTrigger", args.files_per_batch)
        .json(args.input)
    )
    counts = words.groupBy("word").count()
    sink = TransactionalFileSink(args.output)
    writer = counts.writeStream.outputMode("update").foreachBatch(sink.write_batch)
    if args.bounded:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    run_coordinated(writer, participants=[sink])


if __name__ == "__main__":
    main()
