"""Every benchmark runs in its quick mode, so none can rot unnoticed: each is started as a user
starts it (its script, `--quick`), writes its result file into a temporary directory, and the
file must hold the numbers the benchmark exists to measure. The numbers themselves are not
judged here (a shared CI machine measures nothing reliably).

The operator-scale benchmark talks to a cluster through a kubeconfig: here, the emulated
API server and the simulated cluster, started as benchmarks/README.md says
(``python -m helpers.kube.launch``, from ``tests/``).

About 20-45 s each here (a JVM start, or the operator and its simulated cluster).
"""

import contextlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.doc_blocks import ROOT, Block, marked_blocks, shell_commands

BENCHMARKS = ROOT / "benchmarks"
_README_WORK = "/tmp/scale"  # the work directory benchmarks/README.md's commands name


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _check_throughput(result: dict[str, Any]) -> None:
    assert result["parameters"]["pairs"] == 1
    assert sorted(run["mode"] for run in result["runs"]) == ["coordinated", "plain"]
    for mode in ("coordinated", "plain"):
        assert _positive(result[f"{mode}_rows_per_second"]["median"])
        assert _positive(result[f"{mode}_batch_seconds_median"]["median"])
    (coordinated,) = [run for run in result["runs"] if run["mode"] == "coordinated"]
    assert coordinated["checkpoints_completed"] >= 1
    assert _positive(result["paired_ratio"]["median"])
    assert isinstance(result["target_met"], bool)


def _check_incremental(result: dict[str, Any]) -> None:
    checkpoints = result["checkpoints"]
    assert len(checkpoints) == sum(batches for _keys, batches in result["parameters"]["stages"])
    for row in checkpoints:
        assert _positive(row["new_state_bytes"])
        for mode in ("incremental", "incremental-copy", "full"):
            assert _positive(row["bytes"][mode]) and _positive(row["seconds"][mode])
    assert _positive(result["ratio_incremental_to_new_state_after_first"]["median"])
    assert isinstance(result["target_met_all_after_first"], bool)


def _check_restore_time(result: dict[str, Any]) -> None:
    assert sorted(run["mode"] for run in result["runs"]) == ["ours", "spark"]
    for key in ("spark_seconds", "ours_seconds", "ours_restore_seconds", "paired_ratio"):
        assert _positive(result[key]["median"]), key
    assert result["parameters"]["image_files"] > 0
    assert isinstance(result["target_met"], bool)


def _check_checkpoint_cost(result: dict[str, Any]) -> None:
    assert {(row["storage"], row["first"]) for row in result["checkpoints"]} == {
        (storage, first) for storage in ("local", "s3") for first in (True, False)
    }
    for row in result["checkpoints"]:
        assert row["stored_files"] > 0 and _positive(row["metadata_bytes"])
        assert _positive(row["cost_seconds"]) and _positive(row["limit_seconds"])
        assert _positive(row["fixed_cost_seconds"])
    assert [(row["storage"], row["checkpoints"]) for row in result["table"]] == [
        ("local", 1),
        ("s3", 1),
    ]
    assert all(_positive(row["ratio"]["median"]) for row in result["table"])
    assert all(_positive(row["share_of_batch"]["median"]) for row in result["table"])
    assert isinstance(result["target_met"], bool)


def _check_operator_scale(result: dict[str, Any]) -> None:
    assert result["jobs"] == 20
    assert result["checkpoints"]["completed"] > 0
    assert result["triggers"]["slots"] > 0
    assert set(result["triggers"]["lateness"]) >= {"p50", "p99", "max"}
    assert _positive(result["operator"]["rss_mib_max"])
    assert result["operator"]["cpu_cores"] >= 0
    assert _positive(result["api"]["requests_per_s"])
    assert result["api"]["by_kind_per_s"]["PATCH sparkcheckpointjobs/status"] > 0
    assert _positive(result["api"]["job_object_bytes"])
    assert result["triggers"]["until"] == "the arrival at the agent"
    assert result["triggers"]["not_arrived"] < result["triggers"]["slots"]
    assert _positive(result["agents"]["by_route_per_s"]["trigger"])
    assert result["other_processes"]["api_server_process_cpu_cores"] >= 0


BENCHMARKS_CHECKED: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    # script: (result file, check)
    "throughput": ("throughput-quick.json", _check_throughput),
    "incremental": ("incremental-quick.json", _check_incremental),
    "restore_time": ("restore_time-quick.json", _check_restore_time),
    "checkpoint_cost": ("checkpoint_cost-quick.json", _check_checkpoint_cost),
    "operator_scale": ("operator_scale-20x5s-quick.json", _check_operator_scale),
}


def test_every_benchmark_is_checked() -> None:
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(BENCHMARKS_CHECKED)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("throughput", marks=pytest.mark.spark),
        pytest.param("incremental", marks=pytest.mark.spark),
        pytest.param("restore_time", marks=pytest.mark.spark),
        pytest.param("checkpoint_cost", marks=pytest.mark.spark),
        "operator_scale",
    ],
)
def test_the_quick_mode_produces_its_results(name: str, tmp_path: Path) -> None:
    result_file, check = BENCHMARKS_CHECKED[name]
    results = tmp_path / "results"
    # How benchmarks/README.md runs operator_scale: its launcher, then the benchmark.
    (readme,) = marked_blocks(
        "tests/benchmarks/test_quick.py::test_the_quick_mode_produces_its_results"
    )

    with _cluster_for(name, readme, tmp_path) as cluster_arguments:
        run = subprocess.run(
            [
                sys.executable,
                str(BENCHMARKS / f"{name}.py"),
                "--quick",
                "--results-dir",
                str(results),
                *cluster_arguments,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert [p.name for p in results.glob("*.json")] == [result_file]
    result = json.loads((results / result_file).read_text())
    assert result.get("quick", True) is True
    check(result)


@contextlib.contextmanager
def _cluster_for(name: str, block: Block, tmp_path: Path) -> Iterator[list[str]]:
    """The benchmark's arguments naming its cluster. For operator_scale, the commands of
    benchmarks/README.md: the launcher runs (the emulated API server and the simulated
    cluster) while the benchmark does, with the README's work directory in ``tmp_path``."""
    if name != "operator_scale":
        yield []
        return
    launch, benchmark = (
        [word.replace(_README_WORK, str(tmp_path)) for word in command]
        for command in shell_commands(block.text)
    )
    assert launch[:4] == ["PYTHONPATH=tests", ".venv/bin/python", "-m", "helpers.kube.launch"]
    assert benchmark[:2] == [".venv/bin/python", "benchmarks/operator_scale.py"]
    assert "--quick" in benchmark, f"{block}: not the quick mode"
    launcher = subprocess.Popen(
        [sys.executable, *launch[2:]],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": "tests"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        assert re.fullmatch(r"ready http://\S+\n", launcher.stdout.readline())
        yield benchmark[2:]
    finally:
        launcher.terminate()
        # A clean stop on SIGTERM, as the README says.
        assert launcher.wait(60) == 0
