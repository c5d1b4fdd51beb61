"""Ground truth for the word-count example, computed without Spark.

`expected_counts` reads the input files written by ``generate_input.py`` in pure Python.
The command line compares it with what a `TransactionalFileSink` committed for the query
``groupBy("word").count()`` in update mode (rows ``{"word": ..., "count": ...}``), taking
for each word the row of the highest committed batch (`latest_values`)::

    python examples/wordcount/ground_truth.py INPUT_DIR OUTPUT_DIR

It prints the differences and exits 0 when the output is exactly right, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spark_checkpoint.sink import latest_values


def input_files(input_dir: str | os.PathLike[str]) -> list[Path]:
    """The input files of `input_dir`: ``part-*.json``, without hidden temporary files."""
    return sorted(path for path in Path(input_dir).glob("part-*.json") if path.is_file())


def expected_counts(input_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Word -> number of rows with that word over every input file of `input_dir`.

    This is what ``groupBy("word").count()`` must converge to once all input is processed.
    """
    counts: Counter[str] = Counter()
    for path in input_files(input_dir):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    counts[json.loads(line)["word"]] += 1
    return dict(counts)


def committed_counts(output_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Word -> the latest committed count in a `TransactionalFileSink` output directory."""
    return {word: int(row["count"]) for word, row in latest_values(output_dir, "word").items()}


@dataclass(frozen=True)
class CountDiff:
    """How committed counts differ from the expected ones."""

    missing: dict[str, int] = field(default_factory=dict)
    """Expected words absent from the output, with their expected counts."""
    unexpected: dict[str, int] = field(default_factory=dict)
    """Words in the output that the input does not contain, with their counts."""
    wrong: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Words with a wrong count: (expected, actual)."""

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.wrong)

    def lines(self) -> list[str]:
        """One human-readable line per difference, sorted by word."""
        return [
            *(f"missing    {word}: expected {n}" for word, n in sorted(self.missing.items())),
            *(f"unexpected {word}: {n}" for word, n in sorted(self.unexpected.items())),
            *(
                f"wrong      {word}: expected {expected}, got {actual}"
                for word, (expected, actual) in sorted(self.wrong.items())
            ),
        ]


def compare(expected: Mapping[str, int], actual: Mapping[str, int]) -> CountDiff:
    """The differences between `expected` and `actual` word counts."""
    return CountDiff(
        missing={word: n for word, n in expected.items() if word not in actual},
        unexpected={word: n for word, n in actual.items() if word not in expected},
        wrong={
            word: (n, actual[word])
            for word, n in expected.items()
            if word in actual and actual[word] != n
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: 0 when the committed output matches the input, else 1."""
    parser = argparse.ArgumentParser(
        description="Compare committed word counts with counts computed from the input."
    )
    parser.add_argument("input_dir", type=Path, help="the generated input files")
    parser.add_argument("output_dir", help="the sink's output directory (a path or URI)")
    args = parser.parse_args(argv)
    expected = expected_counts(args.input_dir)
    actual = committed_counts(args.output_dir)
    diff = compare(expected, actual)
    for line in diff.lines():
        print(line)
    total = sum(expected.values())
    if diff:
        print(
            f"MISMATCH: {len(diff.missing)} missing, {len(diff.unexpected)} unexpected, "
            f"{len(diff.wrong)} wrong of {len(expected)} words ({total} rows)"
        )
        return 1
    print(f"OK: {len(expected)} words, {total} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
