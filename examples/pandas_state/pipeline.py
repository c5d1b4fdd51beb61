"""The word count with pandas-based state (``applyInPandasWithState``): the same input,
output and ground truth as ``examples/wordcount/``, its state kept by a Python function.
Needs pandas and pyarrow, which the `spark` extra and the `spark` image install.

Run through `spark-checkpoint run` with this directory's job.yaml (its header has the
commands); the arguments are ``--input DIR --output DIR [--bounded]``.
"""

import argparse
from collections.abc import Iterator

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from spark_checkpoint.driver import run_coordinated
from spark_checkpoint.sink import TransactionalFileSink


def count_words(
    key: tuple[str], batches: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    total = state.get[0] if state.exists else 0
    for batch in batches:
        total += len(batch)
    state.update((total,))
    yield pd.DataFrame({"word": [key[0]], "count": [total]})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--bounded", action="store_true", help="process what is there, then end")
    args = parser.parse_args()

    spark = SparkSession.builder.appName("pandas-state").getOrCreate()
    words = (
        spark.readStream.schema("word STRING, n INT")
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
    )
    counts = words.groupBy("word").applyInPandasWithState(
        count_words,
        outputStructType="word STRING, count LONG",
        stateStructType="count LONG",
        outputMode="Update",
        timeoutConf=GroupStateTimeout.NoTimeout,
    )
    sink = TransactionalFileSink(args.output)
    writer = counts.writeStream.outputMode("update").foreachBatch(sink.write_batch)
    writer = writer.trigger(availableNow=True) if args.bounded else writer
    run_coordinated(writer, participants=[sink])


if __name__ == "__main__":
    main()
