"""The opt-in real-cluster suite (tests/cluster/) runs: here against the emulated API
server, for the part that needs no pods (CRD install, namespace, the API server's CEL
rules). A real cluster runs all of it with ``pytest -m cluster``."""

import os
import subprocess
import sys
from pathlib import Path

from helpers.kube.emulator import spark_checkpoint_api

ROOT = Path(__file__).resolve().parents[2]


def test_the_cluster_suite_runs_against_an_api_server(tmp_path: Path) -> None:
    with spark_checkpoint_api() as api:
        environment = {
            **os.environ,
            "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "SPARK_CHECKPOINT_TEST_IMAGE": "example/spark:1",
            "SPARK_CHECKPOINT_TEST_STORAGE": (tmp_path / "storage").as_uri(),
        }
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "cluster",
                "-k",
                "crd_rules",
                "tests/cluster",
            ],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
