"""The real kubectl (the v1.32 client) against the emulated API server: the user guide's
cluster steps run as written (sections 3-4: namespace, driver RBAC, claims, the job, then
``kubectl get``, ``describe`` and ``explain``), and ``kubectl apply`` of changed manifests
patches as on a real server (strategic merge for built-in kinds, JSON merge for the job)."""

import datetime
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.doc_blocks import ROOT, marked_blocks, shell_commands
from helpers.kube.cluster import LocalCluster
from helpers.kube.emulator import EmulatedApiServer, spark_checkpoint_api
from helpers.kube.simulated import SimulatedAgents
from spark_checkpoint_operator.manifest.crd import load_crd

JOBS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs"
CRD_VERSION = load_crd()["spec"]["versions"][0]
HEADERS = [
    "NAME",
    "PHASE",
    "LAST CHECKPOINT",
    "CHECKPOINT AGE",
    "LAST SAVEPOINT",
    "RESTORES",
    "ROLLED BACK",
    "AGE",
]


class Kubectl:
    """kubectl with a kubeconfig for the emulator and its own cache (discovery, OpenAPI)."""

    def __init__(self, api: EmulatedApiServer, home: Path) -> None:
        executable = shutil.which("kubectl")
        if executable is None:
            pytest.fail("kubectl (the Kubernetes client, v1.32) is not on PATH")
        self.executable = executable
        home.mkdir(parents=True, exist_ok=True)
        self.environment = {
            **os.environ,
            "HOME": str(home),
            "KUBECONFIG": str(api.write_kubeconfig(home / "kubeconfig")),
        }

    def run(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.executable, *arguments],
            cwd=ROOT,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert result.returncode == 0, (
                f"kubectl {' '.join(arguments)} exits {result.returncode}:\n{result.stderr}"
            )
        return result


@pytest.fixture
def api() -> Iterator[EmulatedApiServer]:
    with spark_checkpoint_api() as server:
        yield server


@pytest.fixture
def kubectl(api: EmulatedApiServer, tmp_path: Path) -> Kubectl:
    return Kubectl(api, tmp_path / "home")


def _table(output: str) -> list[list[str]]:
    """kubectl's columns: cells are separated by at least two spaces or an empty column's
    width; split at the header's column starts."""
    lines = output.rstrip("\n").splitlines()
    starts = [match.start() for match in re.finditer(r"(?:(?<=\s{2})|^)\S", lines[0])]
    return [
        [line[start:end].strip() for start, end in zip(starts, [*starts[1:], None], strict=True)]
        for line in lines
    ]


def _words(text: str) -> str:
    return " ".join(text.split())


def _status(completed_ago: datetime.timedelta) -> dict[str, Any]:
    """A status as the operator writes it after seven checkpoints and savepoints (the
    newest savepoint 5) and one restore."""
    completion = datetime.datetime.now(datetime.UTC) - completed_ago
    return {
        "phase": "Running",
        "jobAttempt": 2,
        "counts": {"completed": 7, "failed": 0, "inProgress": 0, "restored": 1},
        "lastCheckpoint": {
            "id": 7,
            "batch": 41,
            "path": "s3a://bucket/checkpoints/streaming/orders/chk-7",
            "sizeBytes": 52_113,
            "triggerTime": (completion - datetime.timedelta(seconds=2)).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            "completionTime": completion.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "duration": "2.0s",
        },
        "lastSavepoint": {"id": 5, "batch": 30, "path": "s3a://bucket/sp-5"},
    }


def test_the_guides_cluster_steps_run_with_kubectl(
    api: EmulatedApiServer, kubectl: Kubectl
) -> None:
    """Every command of the guide's kubectl blocks, in the guide's order; the operator's part
    (a status after checkpoints and a restore) is written through the status subresource."""
    outputs: dict[str, str] = {}
    blocks = marked_blocks(
        "tests/kube/test_kubectl.py::test_the_guides_cluster_steps_run_with_kubectl"
    )
    [shown] = [block.text for block in blocks if block.language == "text"]  # get's output
    for block in blocks:
        if block.language == "text":
            continue
        for program, *arguments in shell_commands(block.text):
            assert program == "kubectl", f"{block}: {program} is not run here"
            outputs[" ".join(arguments)] = kubectl.run(*arguments).stdout
            if arguments[:3] == ["apply", "-f", "examples/orders/job.yaml"]:
                status = _status(completed_ago=datetime.timedelta(minutes=12, seconds=20))
                api.patch(JOBS, "streaming", "orders", {"status": status}, subresource="status")

    applied = " ".join(out for command, out in outputs.items() if command.startswith("apply"))
    for created in (
        "namespace/streaming created",
        "serviceaccount/spark-driver created",
        "role.rbac.authorization.k8s.io/spark-driver created",
        "rolebinding.rbac.authorization.k8s.io/spark-driver created",
        "persistentvolumeclaim/orders-live created",
        "persistentvolumeclaim/orders-output created",
        "sparkcheckpointjob.sparkcheckpoint.io/orders created",
    ):
        assert created in applied
    binding = api.get("rbac.authorization.k8s.io/v1/rolebindings", "streaming", "spark-driver")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "spark-driver", "namespace": "streaming"}
    ]
    assert api.get("v1/persistentvolumeclaims", "streaming", "orders-live")["spec"][
        "accessModes"
    ] == ["ReadWriteMany"]

    [get] = [out for command, out in outputs.items() if command.startswith("get scj")]
    # The CRD's printer columns, evaluated by the server over the status (Table output), as
    # the guide shows them (but for the job's age).
    assert [row[:-1] for row in _table(get)] == [row[:-1] for row in _table(shown)]
    assert _table(get) == [
        HEADERS,
        ["orders", "Running", "7", "12m", "5", "1", "", _table(get)[1][-1]],
    ]
    assert re.fullmatch(r"\d+s", _table(get)[1][-1])
    assert [c["name"].upper() for c in CRD_VERSION["additionalPrinterColumns"]] == HEADERS[1:]

    [described] = [out for command, out in outputs.items() if command.startswith("describe")]
    assert re.search(r"Name:\s+orders\nNamespace:\s+streaming\n", described)
    assert re.search(r"Last Checkpoint:\s+Batch:\s+41\b", described)

    [explained] = [out for command, out in outputs.items() if command.startswith("explain")]
    _assert_explains(explained, "spec.checkpointing")


@pytest.mark.parametrize("field", ["spec", "spec.checkpointing"])
def test_explain_answers_from_the_crds_schema(kubectl: Kubectl, field: str) -> None:
    _assert_explains(kubectl.run("explain", f"scj.{field}").stdout, field)


def _assert_explains(output: str, field: str) -> None:
    schema = CRD_VERSION["schema"]["openAPIV3Schema"]
    for name in field.split("."):
        schema = schema["properties"][name]
    assert f"FIELD: {field.rsplit('.', maxsplit=1)[-1]} <Object>" in output
    assert _words(schema["description"]) in _words(output)
    for name, child in schema["properties"].items():
        assert re.search(rf"^  {name}\t<", output, flags=re.MULTILINE), name
        assert _words(child["description"]) in _words(output), name


def test_get_and_wide_show_the_printer_columns_of_each_job(
    api: EmulatedApiServer, kubectl: Kubectl
) -> None:
    kubectl.run("apply", "-f", "examples/orders/namespace.yaml")
    kubectl.run("apply", "-f", "examples/orders/job.yaml")
    job = yaml.safe_load((ROOT / "examples/orders/job.yaml").read_text())
    job["metadata"]["name"] = "orders-fork"
    api.create(JOBS, job, namespace="streaming")
    status = _status(completed_ago=datetime.timedelta(hours=3, minutes=5))
    api.patch(JOBS, "streaming", "orders", {"status": status}, subresource="status")

    for wide in ((), ("-o", "wide")):
        rows = _table(kubectl.run("get", "scj", "-A", *wide).stdout)
        assert rows[0] == ["NAMESPACE", *HEADERS]
        assert [row[:7] for row in rows[1:]] == [
            ["streaming", "orders", "Running", "7", "3h5m", "5", "1"],
            ["streaming", "orders-fork", "", "", "", "", ""],  # no status yet: empty cells
        ]
    named = _table(kubectl.run("get", "sparkcheckpointjob", "orders", "-n", "streaming").stdout)
    assert named[1][:6] == ["orders", "Running", "7", "3h5m", "5", "1"]


def test_apply_of_changed_manifests_patches_them_as_a_real_server(
    api: EmulatedApiServer, kubectl: Kubectl, tmp_path: Path
) -> None:
    """kubectl sends strategic merge patches for a built-in kind (an item added in front:
    ``$setElementOrder``; an item removed: ``$patch: delete``) and a JSON merge patch for the
    job; then deletes it."""
    kubectl.run("apply", "-f", "examples/orders/namespace.yaml")
    # secrets: a list merged by name (imagePullSecrets and the guide's other lists are atomic).
    account: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "spark-driver", "namespace": "streaming"},
    }
    manifest = tmp_path / "account.yaml"
    stored = {}
    for secrets in (["a"], ["b", "a"], ["b"]):
        account["secrets"] = [{"name": name} for name in secrets]
        manifest.write_text(yaml.safe_dump(account))
        kubectl.run("apply", "-f", str(manifest))
        stored = api.get("v1/serviceaccounts", "streaming", "spark-driver")
        assert stored["secrets"] == account["secrets"]
    assert not [key for key in stored if key.startswith("$")]

    job = yaml.safe_load((ROOT / "examples/orders/job.yaml").read_text())
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    kubectl.run("apply", "-f", str(job_file))
    job["spec"]["checkpointing"]["retained"] = 5
    del job["spec"]["restartPolicy"]
    job_file.write_text(yaml.safe_dump(job))
    assert "configured" in kubectl.run("apply", "-f", str(job_file)).stdout
    stored = api.get(JOBS, "streaming", "orders")
    assert stored["spec"]["checkpointing"]["retained"] == 5
    assert stored["metadata"]["generation"] == 2
    deleted = kubectl.run("delete", "-f", str(job_file)).stdout
    assert 'sparkcheckpointjob.sparkcheckpoint.io "orders" deleted' in deleted
    missing = kubectl.run("get", "scj", "-n", "streaming")
    assert "No resources found in streaming namespace." in missing.stderr


def test_the_server_rejects_a_job_its_schema_and_rules_reject(
    api: EmulatedApiServer, kubectl: Kubectl, tmp_path: Path
) -> None:
    """As the guide shows: the API server names the field (here through kubectl)."""
    [block] = marked_blocks(
        "tests/kube/test_kubectl.py::test_the_server_rejects_a_job_its_schema_and_rules_reject"
    )
    [command, *shown] = block.text.splitlines()
    kubectl.run("apply", "-f", "examples/orders/namespace.yaml")
    job = yaml.safe_load((ROOT / "examples/orders/job.yaml").read_text())
    job["spec"]["checkpointing"]["minPause"] = "2m"  # above the 60s interval
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    assert command == "$ kubectl apply -f examples/orders/job.yaml"
    rejected = kubectl.run("apply", "-f", str(job_file), check=False)
    assert rejected.returncode == 1
    assert rejected.stderr.splitlines() == shown
    assert api.list(JOBS, "streaming") == []


@pytest.mark.timeout(120)
def test_the_columns_show_what_the_operator_writes(tmp_path: Path) -> None:
    """The operator (``spark-checkpoint-operator``, simulated drivers) runs the guide's job
    on a faster schedule: ``kubectl get`` shows the status it writes, ``kubectl delete``
    returns once the final savepoint is taken and the job is gone."""
    job = yaml.safe_load((ROOT / "examples/orders/job.yaml").read_text())
    job["spec"]["checkpointing"] |= {"interval": "1s", "minPause": "0s"}
    # Simulated drivers start no executors: a local master, as in the operator's own tests.
    job["spec"]["application"]["sparkConf"]["spark.master"] = "local[2]"
    del job["spec"]["executor"]
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    agents = SimulatedAgents(batch_seconds=0.3)
    with LocalCluster(tmp_path / "cluster", simulated=agents, namespaces=("streaming",)) as cluster:
        kubectl = Kubectl(cluster.api, tmp_path / "home")
        kubectl.run("apply", "-f", str(job_file))

        def checkpointed() -> dict[str, Any] | None:
            status = cluster.status("orders", "streaming")
            return status if status.get("counts", {}).get("completed", 0) >= 2 else None

        status = cluster.wait_for("two checkpoints", checkpointed)
        rows = _table(kubectl.run("get", "scj", "-n", "streaming").stdout)

        assert rows[0] == HEADERS
        name, phase, last, age, _savepoint, restores, rolled_back, _age = rows[1]
        assert (name, phase) == ("orders", "Running")
        assert int(last) >= status["lastCheckpoint"]["id"] >= 2
        assert re.fullmatch(r"\d+s", age), age
        assert restores == str(status["counts"].get("restored", ""))
        assert rolled_back == ""

        deleted = kubectl.run("delete", "-f", str(job_file), "--timeout=60s").stdout
        assert 'sparkcheckpointjob.sparkcheckpoint.io "orders" deleted' in deleted
        assert cluster.job("orders", "streaming") is None
        assert "SavepointCompleted" in cluster.event_reasons("orders", "streaming")


def test_server_side_apply_is_refused_in_one_line(api: EmulatedApiServer, kubectl: Kubectl) -> None:
    """Not emulated (it needs managedFields): kubectl says so, and nothing is created."""
    refused = kubectl.run(
        "apply", "--server-side", "-f", "examples/orders/namespace.yaml", check=False
    )
    assert refused.returncode == 1
    assert "server-side apply is not emulated here: apply client-side" in refused.stderr
    assert [n["metadata"]["name"] for n in api.list("v1/namespaces")] == ["default"]


def test_the_server_is_the_kubernetes_of_its_schemas(kubectl: Kubectl) -> None:
    """The OpenAPI documents hold Kubernetes 1.32's schemas, so /version says 1.32: no skew
    warning for the 1.32 client."""
    answer = kubectl.run("version")
    assert "Server Version: v1.32.0" in answer.stdout
    assert "WARNING" not in answer.stdout + answer.stderr
