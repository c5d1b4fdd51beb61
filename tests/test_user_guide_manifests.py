"""The user guide's cluster steps (sections 3-4) can be followed: every manifest they apply
exists under examples/orders/, is valid for Kubernetes, and names only what the others
create; the guide shows those files, not copies that drift."""

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from spark_checkpoint_operator.kubernetes import objects
from spark_checkpoint_operator.manifest.loading import load_manifest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "orders"
GUIDE = ROOT / "docs" / "user-guide.md"
KUBERNETES_VERSION = "1.30"


def _objects() -> list[dict[str, Any]]:
    return [
        document
        for path in sorted(EXAMPLE.glob("*.yaml"))
        if path.name != "job.yaml"
        for document in yaml.safe_load_all(path.read_text())
    ]


def _named(kind: str, name: str, namespace: str) -> dict[str, Any]:
    found = [
        o
        for o in _objects()
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and o["metadata"].get("namespace", namespace) == namespace
    ]
    assert len(found) == 1, f"no {kind} {namespace}/{name} in {EXAMPLE}"
    return found[0]


def test_every_object_the_guide_applies_is_valid() -> None:
    for document in _objects():
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_job_names_only_what_the_other_manifests_create() -> None:
    job = load_manifest(EXAMPLE / "job.yaml")
    namespace = job.namespace
    _named("Namespace", namespace, namespace)
    account = job.spec.driver.service_account
    assert account is not None
    _named("ServiceAccount", account, namespace)
    [binding] = [
        o
        for o in _objects()
        if o["kind"] == "RoleBinding"
        and {"kind": "ServiceAccount", "name": account, "namespace": namespace} in o["subjects"]
    ]
    role = _named(binding["roleRef"]["kind"], binding["roleRef"]["name"], namespace)
    [rule] = role["rules"]
    assert {"pods", "configmaps", "services", "persistentvolumeclaims"} <= set(rule["resources"])
    claims = {job.spec.checkpointing.live_volume_claim} | {
        v["persistentVolumeClaim"]["claimName"] for v in job.spec.driver.volumes
    }
    claims |= {
        value
        for key, value in job.spec.application.spark_conf.items()
        if key.endswith(".options.claimName")
    }
    for claim in claims:
        assert claim is not None
        assert _named("PersistentVolumeClaim", claim, namespace)["spec"]["accessModes"] == [
            "ReadWriteMany"
        ]


def test_the_jobs_driver_pod_is_valid_and_its_token_mode_is_the_documented_one() -> None:
    job = load_manifest(EXAMPLE / "job.yaml")
    stored = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    stored["metadata"]["uid"] = "0b6c3a52-6f1d-4a57-9d0c-6c1b8f1d2e3f"
    pod = objects.driver_pod(
        job,
        stored,
        attempt=1,
        storage="s3a://bucket/checkpoints",
        restore=[],
        deployed_hash=objects.deployment_hash(stored["spec"]),
        user_ids=objects.UserIds.IMAGE,
    )
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    [token] = [v for v in pod["spec"]["volumes"] if "secret" in v]
    documented = re.search(
        r"mounted read-only \(mode (0\d{3})", (ROOT / "docs/operator.md").read_text()
    )
    assert documented is not None
    assert int(documented[1], 8) == token["secret"]["defaultMode"]


def test_the_guide_shows_the_example_files() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    for name in ("driver-rbac.yaml", "volumes.yaml", "job.yaml"):
        assert (EXAMPLE / name).read_text() in blocks, f"the guide's copy of {name} differs"
    for name in ("namespace.yaml", "driver-rbac.yaml", "volumes.yaml", "job.yaml"):
        assert f"kubectl apply -f examples/orders/{name}" in GUIDE.read_text()
