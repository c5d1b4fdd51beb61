"""The reference word count without the coordinator: the same query, the same sink, but
``writer.start()`` on a plain checkpoint location instead of ``run_coordinated``.

Used by throughput.py as the baseline. After the query ends, every staged batch is
committed (outside the measured window) so the output can be checked like the
coordinated run's.

    python _plain_wordcount.py --input DIR --output DIR --checkpoint DIR
"""

import argparse

from pyspark.sql import SparkSession

from spark_checkpoint.sink import TransactionalFileSink


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True)
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
    writer = writer.trigger(availableNow=True)
    query = writer.option("checkpointLocation", args.checkpoint).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    staged = sink.staged_batches()
    if staged:
        sink.on_checkpoint_complete(staged[-1])
    spark.stop()


if __name__ == "__main__":
    main()
