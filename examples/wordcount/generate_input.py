"""Generate word-count input for the streaming examples and tests.

Each file ``part-<index>.json`` (index zero-padded to five digits) holds `lines` JSON lines
``{"word": ..., "n": 1}`` drawn from a fixed vocabulary of 200 words with Zipf-like
frequencies. A file's content depends only on the seed and its index, so generating files
0-9 in one call or in two calls (``--start-index 0`` then ``--start-index 5``) gives the
same bytes.

Files appear atomically: each is written to a hidden temporary file in the same directory
(Spark's file source ignores names starting with ``.``), flushed, and renamed into place, so
a streaming file source never sees a partial file. An existing file is never overwritten: a
file source would not read it again, and the ground truth would no longer match.

Usage::

    python examples/wordcount/generate_input.py DIR --files N --lines M --seed S --start-index K
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path

VOCABULARY_SIZE = 200
ZIPF_EXPONENT = 1.1
_ONSETS = ("b", "d", "f", "k", "l", "m", "n", "p", "r", "s", "t", "v")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "n", "r", "s")


def _vocabulary() -> tuple[str, ...]:
    """200 distinct pronounceable words, in a fixed order (rank 1 first)."""
    syllables = [o + v + c for o, v, c in itertools.product(_ONSETS, _VOWELS, _CODAS)]
    shuffled = random.Random("wordcount-vocabulary").sample(syllables, len(syllables))
    pairs = zip(shuffled, reversed(shuffled), strict=True)
    return tuple(first + second for first, second in itertools.islice(pairs, VOCABULARY_SIZE))


VOCABULARY = _vocabulary()
"""The words, most frequent first."""

WEIGHTS = tuple(1.0 / rank**ZIPF_EXPONENT for rank in range(1, VOCABULARY_SIZE + 1))
"""Zipf-like relative frequency of each word of `VOCABULARY`."""


def file_name(index: int) -> str:
    """The name of input file number `index`."""
    return f"part-{index:05d}.json"


def generate(
    directory: str | os.PathLike[str],
    files: int,
    lines: int,
    seed: int,
    start_index: int = 0,
) -> list[Path]:
    """Write files `start_index` .. `start_index + files - 1` into `directory` (created if
    missing), each with `lines` rows, and return their paths in index order.

    Raises FileExistsError, before writing anything, if one of the files exists.
    """
    if files < 0 or lines < 0 or start_index < 0:
        raise ValueError("files, lines and start_index must not be negative")
    target_dir = Path(directory)
    target_dir.mkdir(parents=True, exist_ok=True)
    targets = [target_dir / file_name(index) for index in range(start_index, start_index + files)]
    existing = [str(path) for path in targets if path.exists()]
    if existing:
        raise FileExistsError(f"input files exist already: {', '.join(existing)}")
    for index, target in enumerate(targets, start=start_index):
        rng = random.Random(f"{seed}:{index}")
        words = rng.choices(VOCABULARY, weights=WEIGHTS, k=lines)
        content = "".join(json.dumps({"word": word, "n": 1}) + "\n" for word in words)
        _write_atomically(target, content)
    return targets


def _write_atomically(target: Path, content: str) -> None:
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        description="Write word-count input files (JSON lines) atomically."
    )
    parser.add_argument("directory", type=Path, help="where to write the files")
    parser.add_argument("--files", type=int, default=1, help="number of files (default 1)")
    parser.add_argument("--lines", type=int, default=1000, help="rows per file (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--start-index", type=int, default=0, help="index of the first file (default 0)"
    )
    args = parser.parse_args(argv)
    try:
        paths = generate(args.directory, args.files, args.lines, args.seed, args.start_index)
    except (FileExistsError, ValueError) as error:
        parser.error(str(error))
    # One line, however many files (a newcomer's --files 200 printed 200 lines).
    first, last = (paths[0].name, paths[-1].name) if paths else ("-", "-")
    print(f"wrote {len(paths)} files of {args.lines} rows to {args.directory} ({first} .. {last})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
