"""The operator started where no cluster can be reached (no service account, no kubeconfig)
stops at once with one line that says so (exit code 1, no traceback), instead of retrying
its startup for ever."""

import os
import subprocess
from pathlib import Path

from helpers.kube.cluster import OPERATOR_COMMAND


def test_operator_without_credentials_stops_and_says_why(tmp_path: Path) -> None:
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    }
    environment["HOME"] = str(tmp_path)  # no ~/.kube/config
    environment["SPARK_CHECKPOINT_METRICS_PORT"] = "0"
    finished = subprocess.run(
        [OPERATOR_COMMAND, "--all-namespaces"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=120,  # a retry loop would first retry after 60 s
        check=False,
    )
    assert finished.returncode == 1
    reported = [line for line in finished.stderr.splitlines() if "failed permanently" in line]
    assert len(reported) == 1, finished.stderr
    assert "no Kubernetes credentials" in reported[0]
    assert "kube-config" in reported[0]
    assert "will try again" not in finished.stderr
    assert "Traceback" not in finished.stderr, finished.stderr
    # Besides that line only the Kubernetes client's warning that it found no kubeconfig.
    others = [line for line in finished.stderr.splitlines() if line not in reported]
    assert len(others) == 1 and "Config not found" in others[0], finished.stderr
