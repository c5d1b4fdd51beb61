"""The opt-in real-cluster suite (tests/cluster/) runs: here against the emulated API
server with the local kubelet running its pods as real Spark drivers, so the suite is known
to work before anyone points it at a real cluster with ``pytest -m cluster``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.job_run import EXAMPLE
from helpers.kube.emulator import spark_checkpoint_api
from helpers.kube.kubelet import KubeletThread

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


@pytest.mark.spark
def test_the_cluster_suite_passes_against_the_emulated_cluster(tmp_path: Path) -> None:
    with spark_checkpoint_api() as api, KubeletThread(api.url, tmp_path / "pods"):
        environment = {
            **os.environ,
            "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "SPARK_CHECKPOINT_TEST_IMAGE": "example/spark:1",
            "SPARK_CHECKPOINT_TEST_STORAGE": (tmp_path / "storage").as_uri(),
            "SPARK_CHECKPOINT_TEST_MAIN_FILE": f"local://{EXAMPLE / 'pipeline.py'}",
            "SPARK_CHECKPOINT_TEST_OUTPUT": str(tmp_path / "output"),
        }
        result = subprocess.run(
            [*PYTEST, "-m", "cluster", "tests/cluster"],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        # Inside: if stopping the cluster fails too, its error comes with this one.
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 passed" in result.stdout, result.stdout
