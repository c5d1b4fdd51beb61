"""The operator's command, `spark-checkpoint-operator`: started where no cluster can be
reached (no service account, no kubeconfig) it stops at once with one line that says so
(exit code 1, no traceback), instead of retrying its startup for ever; what it hands to
Kopf; what it refuses."""

import logging
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from kopf import LogFormat, cli

from helpers.kube.cluster import OPERATOR_COMMAND
from spark_checkpoint_operator.kubernetes.main import HANDLERS, PROGRAM, main

URL = "http://0.0.0.0:8080/healthz"


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
    assert reported[0].endswith(
        "no Kubernetes credentials: not in a pod (Service host/port is not set), and "
        f"KUBECONFIG is not set and {tmp_path}/.kube/config does not exist"
    )
    assert "will try again" not in finished.stderr
    assert "Traceback" not in finished.stderr, finished.stderr
    # Besides that line only the Kubernetes client's warning that it found no kubeconfig.
    others = [line for line in finished.stderr.splitlines() if line not in reported]
    assert len(others) == 1 and "Config not found" in others[0], finished.stderr


def test_an_operator_whose_metrics_port_is_taken_stops_and_says_why(tmp_path: Path) -> None:
    """Another process on the port (a second operator on the node's network): one line and
    exit 1, not a retry every minute that could never succeed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        finished = subprocess.run(
            [OPERATOR_COMMAND, "--all-namespaces"],
            capture_output=True,
            text=True,
            env={**os.environ, "SPARK_CHECKPOINT_METRICS_PORT": str(port)},
            cwd=tmp_path,
            timeout=120,  # a retry loop would first retry after 60 s
            check=False,
        )
    assert finished.returncode == 1, finished.stderr
    reported = [line for line in finished.stderr.splitlines() if "failed permanently" in line]
    assert len(reported) == 1, finished.stderr
    assert (
        f"cannot serve metrics on 0.0.0.0 port {port} (SPARK_CHECKPOINT_METRICS_ADDRESS, "
        "SPARK_CHECKPOINT_METRICS_PORT" in reported[0]
    )
    assert "Traceback" not in finished.stderr, finished.stderr


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"SPARK_CHECKPOINT_METRICS_PORT": "abc"}, "SPARK_CHECKPOINT_METRICS_PORT='abc' is not"),
        ({"SPARK_CHECKPOINT_METRICS_PORT": "70000"}, "SPARK_CHECKPOINT_METRICS_PORT='70000'"),
        (
            {"SPARK_CHECKPOINT_METRICS_ADDRESS": "[::]"},
            "SPARK_CHECKPOINT_METRICS_ADDRESS='[::]' is not an IPv4 or IPv6 address",
        ),
        ({"SPARK_CHECKPOINT_IDLE_POLL_SECONDS": "abc"}, "SPARK_CHECKPOINT_IDLE_POLL_SECONDS='abc'"),
        ({"SPARK_CHECKPOINT_IDLE_POLL_SECONDS": "-1"}, "SPARK_CHECKPOINT_IDLE_POLL_SECONDS='-1'"),
        (
            {"SPARK_CHECKPOINT_LEASE_SECONDS": "14"},
            "SPARK_CHECKPOINT_LEASE_SECONDS='14' is not a whole number of seconds from 15 to 86400",
        ),
        ({"SPARK_CHECKPOINT_LEASE_SECONDS": "7.5"}, "SPARK_CHECKPOINT_LEASE_SECONDS='7.5'"),
        (
            {"SPARK_CHECKPOINT_USER_IDS": "openshift"},
            "SPARK_CHECKPOINT_USER_IDS='openshift' is not 'image' or 'platform'",
        ),
        (
            {"KUBECONFIG": "kubeconfig"},
            "no Kubernetes credentials: not in a pod (Service host/port is not set), and the "
            "kubeconfig kubeconfig: while parsing a flow sequence in",
        ),
        (
            {"KUBECONFIG": "absent"},
            "no Kubernetes credentials: not in a pod (Service host/port is not set), and "
            "KUBECONFIG names absent, which does not exist",
        ),
        # A wrong context, a VPN that is down: a minute of Kopf's retries, then tracebacks.
        (
            {"KUBECONFIG": "unreachable"},
            "cannot reach the Kubernetes API server at https://127.0.0.1:1: Cannot connect",
        ),
    ],
)
def test_a_wrong_setting_stops_the_operator_with_one_line(
    tmp_path: Path, setting: dict[str, str], said: str
) -> None:
    """Each was retried every minute for ever, a traceback each time (a tester's finding)."""
    (tmp_path / "kubeconfig").write_text("{not: [yaml")
    (tmp_path / "unreachable").write_text(
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]\n'
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    }
    finished = subprocess.run(
        [OPERATOR_COMMAND, "--all-namespaces"],
        capture_output=True,
        text=True,
        env={**environment, "SPARK_CHECKPOINT_METRICS_PORT": "0", **setting},
        cwd=tmp_path,
        timeout=120,  # a retry loop would first retry after 60 s
        check=False,
    )
    assert finished.returncode == 1, finished.stderr
    reported = [line for line in finished.stderr.splitlines() if "failed permanently" in line]
    assert len(reported) == 1 and said in reported[0], finished.stderr
    assert "Traceback" not in finished.stderr, finished.stderr


def test_the_operator_command_runs_kopf_standalone_with_its_handlers_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the command hands to Kopf's run: the handlers, then each -m module, standalone,
    and the options it was given."""
    received: dict[str, Any] = {}
    kopf_run = click.Command("run", params=cli.run.params, callback=received.update)
    monkeypatch.setattr(cli, "run", kopf_run)

    with pytest.raises(SystemExit) as exited:  # Click's standalone mode exits
        main(["-n", "team-a", "-n", "team-b", "-m", "probe", "--log-format=json", "-L", URL])

    assert exited.value.code == 0

    assert received["modules"] == (HANDLERS, "probe")
    assert (received["paths"], received["standalone"]) == ((), True)
    assert received["namespaces"] == ("team-a", "team-b")
    assert (received["clusterwide"], received["liveness_endpoint"]) == (False, URL)
    assert received["log_format"] == LogFormat.JSON


@pytest.fixture
def kopfs_logging_given_back() -> Iterator[None]:
    """Kopf's run sets up logging (the root logger, asyncio's) before its own checks: as it
    was, for the tests after this one in its process."""
    root, asyncio_log = logging.getLogger(), logging.getLogger("asyncio")
    saved = (root.handlers[:], root.level, asyncio_log.handlers[:], asyncio_log.propagate)
    yield
    root.handlers[:], level, asyncio_log.handlers[:], asyncio_log.propagate = saved
    root.setLevel(level)


@pytest.mark.usefixtures("kopfs_logging_given_back")
@pytest.mark.parametrize(
    "arguments",
    [["run"], ["--standalone"], ["--peering=p"], ["--dev"], ["handlers.py"], ["-A", "-n", "x"]],
    ids=["kopf-verb", "standalone", "peering", "dev", "path", "all-and-one-namespace"],
)
def test_the_operator_command_refuses_what_would_change_its_handlers_or_peering(
    arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(arguments)
    assert exited.value.code == 2  # Click's usage error
    error = capsys.readouterr().err
    assert error.startswith(f"Usage: {PROGRAM} [OPTIONS]"), error
    assert "Traceback" not in error


# Kopf's run options the command leaves out: it runs standalone, its own handlers.
LEFT_OUT = {"paths", "standalone", "peering_name", "priority", "dev"}


def test_the_operator_commands_help_lists_every_other_kopf_run_option() -> None:
    shown = subprocess.run(
        [OPERATOR_COMMAND, "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert shown.startswith(f"Usage: {PROGRAM} [OPTIONS]\n")
    for option in cli.run.params:
        listed = any(re.search(rf"(?<![\w-]){name}(?![\w-])", shown) for name in option.opts)
        assert listed is (option.name not in LEFT_OUT), option.opts
    assert "PATHS" not in shown


def test_kopf_run_variables_set_the_operator_commands_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    received: dict[str, Any] = {}
    monkeypatch.setattr(
        cli, "run", click.Command("run", params=cli.run.params, callback=received.update)
    )
    monkeypatch.setenv("KOPF_RUN_VERBOSE", "1")
    monkeypatch.setenv("KOPF_RUN_LOG_FORMAT", "json")
    monkeypatch.setenv("KOPF_RUN_LIVENESS_ENDPOINT", URL)

    with pytest.raises(SystemExit):
        main(["-q", "-d", "-A"])

    assert (received["verbose"], received["quiet"], received["debug"]) == (True, True, True)
    assert received["log_format"] == LogFormat.JSON
    assert (received["clusterwide"], received["liveness_endpoint"]) == (True, URL)
