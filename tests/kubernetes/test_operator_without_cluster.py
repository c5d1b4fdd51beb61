"""The operator started where no cluster can be reached (no service account, no kubeconfig)
stops at once with one line that says so, instead of retrying its startup for ever."""

import os
import subprocess
import sys
from pathlib import Path

from helpers.kube.cluster import OPERATOR_MODULE


def test_operator_without_credentials_stops_and_says_why(tmp_path: Path) -> None:
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    }
    environment["HOME"] = str(tmp_path)  # no ~/.kube/config
    environment["SPARK_CHECKPOINT_METRICS_PORT"] = "0"
    finished = subprocess.run(
        [sys.executable, "-m", "kopf", "run", "--standalone", "-m", OPERATOR_MODULE, "-A"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=120,  # a retry loop would first retry after 60 s
        check=False,
    )
    assert finished.returncode != 0
    reported = [line for line in finished.stderr.splitlines() if "failed permanently" in line]
    assert len(reported) == 1, finished.stderr
    assert "no Kubernetes credentials" in reported[0]
    assert "kube-config" in reported[0]
    assert "will try again" not in finished.stderr
