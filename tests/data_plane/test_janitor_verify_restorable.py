"""``python -m spark_checkpoint.janitor verify-restorable`` as a check pod runs it, without a
cluster: bad arguments and a Spark that cannot start end with one line and an empty report
file (the runtime then has no verdict and says why); the verdicts themselves are Spark's
(tests/kubernetes/test_verify_restorable_e2e.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _verify(
    tmp_path: Path, *arguments: str, **environment: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPARK_CHECKPOINT_NAMESPACE": "default",
        "SPARK_CHECKPOINT_JOB": "orders",
        "SPARK_CHECKPOINT_STORAGE": tmp_path.as_uri(),
        **environment,
    }
    return subprocess.run(
        [sys.executable, "-m", "spark_checkpoint.janitor", "verify-restorable", *arguments],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (("external:s3a://b/sp-1", "--report=r"), "'external:s3a://b/sp-1' is not checkpoint:N"),
        (("checkpoint:-1", "--report=r"), "is not checkpoint:N or savepoint:N"),
        (("checkpoint:3",), "--report"),
    ],
)
def test_bad_arguments_are_one_line_naming_them(
    tmp_path: Path, arguments: tuple[str, ...], named: str
) -> None:
    result = _verify(tmp_path, *arguments)

    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert "verify-restorable: error:" in last and named in last, result.stderr
    assert "Traceback" not in result.stderr


def test_a_spark_that_cannot_start_is_no_verdict_and_one_line(tmp_path: Path) -> None:
    report = tmp_path / "termination-log"
    report.touch()

    result = _verify(
        tmp_path, "checkpoint:3", f"--report={report}", JAVA_HOME=str(tmp_path / "no-java")
    )

    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("verify-restorable failed: Spark could not read checkpoint:3: "), last
    assert report.read_text() == "", "no verdict: the pod's log tail says why"
