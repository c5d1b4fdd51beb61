"""The word-count example's input generator and ground truth (no Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from spark_checkpoint.sink import TransactionalFileSink

Stage = Callable[[TransactionalFileSink, int, list[dict[str, Any]]], Any]
ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_writes_json_lines_files_named_by_index(
    generate_input: ModuleType, tmp_path: Path
) -> None:
    paths = generate_input.generate(tmp_path, files=3, lines=50, seed=1, start_index=4)

    assert [path.name for path in paths] == [
        "part-00004.json",
        "part-00005.json",
        "part-00006.json",
    ]
    assert sorted(os.listdir(tmp_path)) == [path.name for path in paths]  # no temp files left
    for path in paths:
        rows = _rows(path)
        assert len(rows) == 50
        assert all(row.keys() == {"word", "n"} and row["n"] == 1 for row in rows)
        assert {row["word"] for row in rows} <= set(generate_input.VOCABULARY)


def test_the_vocabulary_has_200_words_with_zipf_like_frequencies(
    generate_input: ModuleType, tmp_path: Path
) -> None:
    assert len(set(generate_input.VOCABULARY)) == 200
    (path,) = generate_input.generate(tmp_path, files=1, lines=20_000, seed=5, start_index=0)
    counts = Counter(row["word"] for row in _rows(path))
    top, tenth = (counts[generate_input.VOCABULARY[rank]] for rank in (0, 9))

    assert 5 < top / tenth < 20  # 10 ** 1.1 ~ 12.6
    assert len(counts) > 150


def test_a_file_depends_only_on_seed_and_index(generate_input: ModuleType, tmp_path: Path) -> None:
    generate_input.generate(tmp_path / "once", files=4, lines=30, seed=9, start_index=0)
    generate_input.generate(tmp_path / "twice", files=2, lines=30, seed=9, start_index=0)
    generate_input.generate(tmp_path / "twice", files=2, lines=30, seed=9, start_index=2)
    generate_input.generate(tmp_path / "other", files=1, lines=30, seed=10, start_index=0)

    for index in range(4):
        name = generate_input.file_name(index)
        assert (tmp_path / "once" / name).read_bytes() == (tmp_path / "twice" / name).read_bytes()
    once = (tmp_path / "once" / "part-00000.json").read_bytes()
    assert once != (tmp_path / "other" / "part-00000.json").read_bytes()


def test_generate_never_overwrites_input(generate_input: ModuleType, tmp_path: Path) -> None:
    generate_input.generate(tmp_path, files=2, lines=10, seed=1, start_index=0)
    before = (tmp_path / "part-00001.json").read_bytes()

    with pytest.raises(FileExistsError, match=r"part-00001\.json"):
        generate_input.generate(tmp_path, files=2, lines=10, seed=2, start_index=1)

    assert (tmp_path / "part-00001.json").read_bytes() == before
    assert not (tmp_path / "part-00002.json").exists()


def test_generate_input_command_line(tmp_path: Path) -> None:
    script = ROOT / "examples" / "wordcount" / "generate_input.py"
    args = ["--files", "2", "--lines", "5", "--seed", "3", "--start-index", "7"]
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), *args],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"wrote 2 files of 5 rows to {tmp_path} (part-00007.json .. part-00008.json)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00007.json", "part-00008.json"]


def test_expected_counts_counts_rows_per_word_and_ignores_other_files(
    ground_truth: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "part-00000.json").write_text('{"word": "a", "n": 1}\n{"word": "b", "n": 1}\n')
    (tmp_path / "part-00001.json").write_text('{"word": "a", "n": 1}\n\n')
    (tmp_path / ".part-00002.json.123.tmp").write_text('{"word": "partial"')
    (tmp_path / "notes.txt").write_text("not input")

    assert ground_truth.expected_counts(tmp_path) == {"a": 2, "b": 1}


def _committed_output(sink: TransactionalFileSink, stage: Stage) -> None:
    stage(sink, 0, [{"word": "a", "count": 1}, {"word": "b", "count": 1}])
    stage(sink, 1, [{"word": "a", "count": 2}])
    sink.on_checkpoint_complete(1)


def test_ground_truth_command_accepts_matching_output(
    ground_truth: ModuleType,
    sink: TransactionalFileSink,
    stage: Stage,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-00000.json").write_text(
        '{"word": "a", "n": 1}\n{"word": "b", "n": 1}\n{"word": "a", "n": 1}\n'
    )
    _committed_output(sink, stage)

    assert ground_truth.main([str(tmp_path / "in"), str(sink.output_dir)]) == 0
    assert capsys.readouterr().out == "OK: 2 words, 3 rows\n"


def test_ground_truth_command_reports_every_difference(
    ground_truth: ModuleType,
    sink: TransactionalFileSink,
    stage: Stage,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-00000.json").write_text(
        '{"word": "a", "n": 1}\n{"word": "c", "n": 1}\n'
    )
    _committed_output(sink, stage)

    assert ground_truth.main([str(tmp_path / "in"), str(sink.output_dir)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "missing    c: expected 1",
        "unexpected b: 1",
        "wrong      a: expected 1, got 2",
        "MISMATCH: 1 missing, 1 unexpected, 1 wrong of 2 words (2 rows)",
    ]


def test_ground_truth_runs_as_a_script(tmp_path: Path) -> None:
    script = ROOT / "examples" / "wordcount" / "ground_truth.py"
    (tmp_path / "in").mkdir()
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "in"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "OK: 0 words, 0 rows\n"
