"""The Helm chart, rendered by Helm's own Go code (helm-python-sdk): lint, Kubernetes schemas,
names within Kubernetes' limits, security defaults, the NetworkPolicy, values.schema.json,
the CRD's single source and the Kubernetes version it needs, and RBAC that is namespaced by
default and grants exactly what a recorded run of the operator uses."""

import contextlib
import itertools
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import helm_python
import kubernetes_validate
import pytest
import yaml

from helpers.kube.cluster import OPERATOR_COMMAND, LocalCluster
from helpers.kube.simulated import SimulatedAgents
from helpers.ports import free_port
from spark_checkpoint.storage import layout
from spark_checkpoint_operator.kubernetes.handlers import (
    METRICS_PORT_VARIABLE,
    OPERATOR_NAMESPACE_VARIABLE,
    OPERATOR_SERVICE_ACCOUNT_VARIABLE,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "spark-checkpoint-operator"
SNAPSHOTS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointsnapshots"
CRD_NAMES = (
    "sparkcheckpointjobs.sparkcheckpoint.io",
    "sparkcheckpointsnapshots.sparkcheckpoint.io",
)
# Each CRD's source in crds/ and its copy's name in the chart.
CRDS = {ROOT / "crds" / f"{name}.yaml": f"files/{name}.yaml" for name in CRD_NAMES}
KUBERNETES_VERSION = "1.30"
RELEASE = "sco"
RELEASE_NAMESPACE = "spark-ops"
FULLNAME = f"{RELEASE}-spark-checkpoint-operator"
AGENT_PORT = 8484
KEEP = "helm.sh/resource-policy"
OPERATOR_TOKEN = "operator-service-account"

# Non-default values the chart must render, lint and validate with.
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "cluster-wide": {"clusterWide": True},
    "monitoring": {
        "metrics": {
            "enabled": True,
            "service": {"port": 9100, "annotations": {"example.com/scrape": "true"}},
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
        }
    },
    "no-network-policy": {"networkPolicy": {"enabled": False}, "metrics": {"enabled": False}},
    "custom-image": {
        "image": {"repository": "registry.example.com/sco", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "operator": {"extraArgs": ["--verbose"], "env": [{"name": "TZ", "value": "UTC"}]},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "ops", "operator": "Exists", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "data"},
    },
    "cluster-wide-policies": {
        "clusterWide": True,
        "networkPolicy": {
            "namespaces": ["jobs-1", "jobs-2"],
            "otherTraffic": "executors",
            "extraIngress": [{"ports": [{"protocol": "TCP", "port": 4040}]}],
        },
    },
    "external-crd-and-account": {
        "crds": {"install": False},
        "serviceAccount": {"create": False, "name": "existing"},
        "rbac": {"create": False},
    },
    "longest-fullname": {"fullnameOverride": "f" * 63, "podLabels": {"team": "data"}},
}


def _render(
    values: Mapping[str, Any] | None = None,
    release: str = RELEASE,
    namespace: str = RELEASE_NAMESPACE,
) -> list[dict[str, Any]]:
    """Every object the chart renders with ``values`` (NOTES.txt aside)."""
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values=dict(values or {}), name=release, namespace=namespace)
    return [
        document
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document
    ]


def _notes(values: Mapping[str, Any] | None = None) -> str:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(
            values=dict(values or {}), name=RELEASE, namespace=RELEASE_NAMESPACE
        )
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def _of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = _of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


# --- rendering, lint, schemas ------------------------------------------------------------------


def _oldest_kubernetes() -> tuple[int, int]:
    """The lower bound of Chart.yaml's kubeVersion (">=1.28.0-0")."""
    with helm_python.Chart.load(CHART) as chart:
        bound = chart.metadata["kubeVersion"]
    found = re.fullmatch(r">=(\d+)\.(\d+)\.0-0", bound)
    assert found, f"kubeVersion {bound!r}: expected a single lower bound"
    return int(found[1]), int(found[2])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_chart_lints_clean(scenario: str) -> None:
    """Helm's linter (strict: warnings fail) on the oldest supported Kubernetes."""
    major, minor = _oldest_kubernetes()
    report = helm_python.lint(
        CHART,
        SCENARIOS[scenario],
        strict=True,
        namespace=RELEASE_NAMESPACE,
        kube_version=f"v{major}.{minor}.0",
    )
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); 2 warning, 3 error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_chart_metadata() -> None:
    with helm_python.Chart.load(CHART) as chart:
        metadata = chart.metadata
    assert metadata["apiVersion"] == "v2"
    assert (metadata["version"], metadata["appVersion"]) == ("0.1.0", "0.1.0")


# The Kubernetes minor version from which the API server accepts each field of a CRD
# validation rule (x-kubernetes-validations), and the chart's other version-bound feature.
CEL_RULE_FIELDS = {
    "rule": (1, 25),
    "message": (1, 25),
    "messageExpression": (1, 27),
    "reason": (1, 28),
    "fieldPath": (1, 28),
    "optionalOldSelf": (1, 30),
}
NETWORK_POLICY_END_PORT = (1, 25)


def _validation_rules(node: object) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield from node.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from _validation_rules(value)
    elif isinstance(node, list):
        for item in node:
            yield from _validation_rules(item)


def test_kube_version_admits_only_clusters_that_accept_the_crd() -> None:
    """Helm refuses an install below kubeVersion (lint and render do not check it); below
    what the CRD's CEL rules use, the API server would reject the CRD instead."""
    crds = [yaml.safe_load(source.read_text(encoding="utf-8")) for source in CRDS]
    used = {field for crd in crds for rule in _validation_rules(crd) for field in rule}
    assert used <= CEL_RULE_FIELDS.keys(), f"add the version of {used - CEL_RULE_FIELDS.keys()}"
    needed = max([NETWORK_POLICY_END_PORT, *(CEL_RULE_FIELDS[field] for field in used)])
    assert _oldest_kubernetes() == needed


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_object_is_valid_kubernetes(scenario: str) -> None:
    """kubernetes-validate's strict schemas; the ServiceMonitor is a CRD (prometheus-operator)
    with no schema there, so its shape is checked by hand."""
    objects = _render(SCENARIOS[scenario])
    assert objects
    for obj in objects:
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            _check_service_monitor(obj, objects)
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        namespaced = obj["kind"] not in {
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
        }
        assert ("namespace" in obj["metadata"]) == namespaced, obj["metadata"]["name"]


# Kubernetes' name rules (k8s.io/apimachinery validation): a Service's name is a DNS-1035
# label, other objects' names DNS-1123 subdomains; label values at most 63 characters.
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(layout.DNS_1123_SUBDOMAIN)  # see tests/manifest/test_dns_names.py
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
LONGEST_RELEASE_NAME = "analytics-streaming-platform-prod"


@pytest.mark.parametrize(
    ("release", "values"),
    [
        (LONGEST_RELEASE_NAME, {}),
        ("r" * 53, {"clusterWide": True, "metrics": {"serviceMonitor": {"enabled": True}}}),
        (RELEASE, SCENARIOS["longest-fullname"]),
    ],
    ids=["long-release", "longest-release", "longest-fullname"],
)
def test_every_name_and_label_fits_kubernetes_limits(release: str, values: dict[str, Any]) -> None:
    """kubernetes-validate checks types, not these: the API server would reject the object.
    Helm allows release names up to 53 characters."""
    for obj in _render(values, release=release):
        name = obj["metadata"]["name"]
        pattern = DNS_1035_LABEL if obj["kind"] == "Service" else DNS_1123_SUBDOMAIN
        assert pattern.fullmatch(name) and len(name) <= 253, (obj["kind"], name)
        labels = dict(obj["metadata"].get("labels", {}))
        if obj["kind"] == "Deployment":
            labels.update(obj["spec"]["template"]["metadata"]["labels"])
        for key, value in labels.items():
            assert LABEL_VALUE.fullmatch(value), (obj["kind"], key, value)


def test_the_metrics_service_name_keeps_its_suffix_when_shortened() -> None:
    (service,) = _of_kind(_render(release=LONGEST_RELEASE_NAME), "Service")
    name = service["metadata"]["name"]
    assert len(name) == 63
    assert name == f"{LONGEST_RELEASE_NAME}-spark-checkpoint-oper-metrics"


def _check_service_monitor(monitor: dict[str, Any], objects: list[dict[str, Any]]) -> None:
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["namespace"] == RELEASE_NAMESPACE
    service = _one(objects, "Service")
    spec = monitor["spec"]
    assert set(spec) == {"selector", "namespaceSelector", "endpoints"}
    labels = service["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert isinstance(endpoint["interval"], str)
    assert isinstance(endpoint["scrapeTimeout"], str)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"image": {"tag": 1.2}}, "/image/tag"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        ({"networkPolicy": {"otherTraffic": "none"}}, "/networkPolicy/otherTraffic"),
        ({"metrics": {"serviceMonitor": {"interval": 30}}}, "/metrics/serviceMonitor/interval"),
        # The ServiceMonitor CRD's pattern: whole numbers, units largest first.
        ({"metrics": {"serviceMonitor": {"interval": "1.5m"}}}, "/metrics/serviceMonitor/interval"),
        (
            {"metrics": {"serviceMonitor": {"scrapeTimeout": "10s1m"}}},
            "/metrics/serviceMonitor/scrapeTimeout",
        ),
        ({"metrics": {"service": {"port": 70000}}}, "/metrics/service/port"),
        ({"operator": {"healthPort": 9090}}, "/operator/healthPort"),
        ({"operator": {"listenAddress": "[::]"}}, "/operator/listenAddress"),
        ({"resources": {"limits": {"memory": ["1Gi"]}}}, "/resources/limits/memory"),
        ({"rbac": {"create": 1}}, "/rbac/create"),
        ({"crds": {"instal": True}}, "instal"),
        ({"replicaCount": 2}, "replicaCount"),
    ],
)
def test_values_schema_rejects_bad_values(values: dict[str, Any], named: str) -> None:
    """A typo or a wrong type fails at render time, naming the value."""
    with pytest.raises(helm_python.HelmValuesError) as raised:
        _render(values)
    assert named in str(raised.value)


@pytest.mark.parametrize(
    ("interval", "timeout"), [("30s", "1m"), ("1m", "1m0s1ms"), ("1d", "2w"), ("59m", "1h")]
)
def test_a_scrape_timeout_longer_than_the_interval_is_refused(interval: str, timeout: str) -> None:
    """Prometheus refuses such a scrape (prometheus-operator skips the ServiceMonitor): the
    release would install without metrics and say nothing."""
    values = {"enabled": True, "interval": interval, "scrapeTimeout": timeout}
    with pytest.raises(helm_python.HelmRenderError) as raised:
        _render({"metrics": {"serviceMonitor": values}})
    assert (
        f"metrics.serviceMonitor.scrapeTimeout ({timeout}) exceeds "
        f"metrics.serviceMonitor.interval ({interval})"
    ) in str(raised.value)


@pytest.mark.parametrize(
    ("interval", "timeout"), [("90s", "1m30s"), ("1h", "59m59s999ms"), ("", "2m"), ("15s", "")]
)
def test_a_scrape_timeout_up_to_the_interval_renders(interval: str, timeout: str) -> None:
    """Equal in other spellings is not longer; an empty one is left to the Prometheus."""
    values = {"enabled": True, "interval": interval, "scrapeTimeout": timeout}
    monitor = _one(_render({"metrics": {"serviceMonitor": values}}), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    given = {"interval": interval, "scrapeTimeout": timeout}
    assert {k: v for k, v in endpoint.items() if k in given} == {
        k: v for k, v in given.items() if v
    }


def test_every_default_value_is_described_by_the_schema() -> None:
    """The schema allows no unknown keys, so it must cover every default (and each scenario
    above rendering proves the non-default shapes pass)."""
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(chart.values)
        schema = chart.schema
    assert schema is not None
    assert schema["additionalProperties"] is False


# --- the CRD: one source ------------------------------------------------------------------------


def test_the_chart_ships_the_repository_crds_byte_for_byte() -> None:
    """crds/ is the one source of truth; the chart holds copies (a platform reviewer's: a
    symlink, as it was, is left out of a Flux GitRepository's artifact, and the chart did
    not render from Git). A copy that drifts fails here."""
    with helm_python.Chart.load(CHART) as chart:
        files = {f["name"]: f["data"] for f in chart.files}
    for source, in_chart in CRDS.items():
        copy = CHART / in_chart
        assert copy.read_bytes() == source.read_bytes(), (
            f"copy {source.relative_to(ROOT)} to {copy.relative_to(ROOT)}"
        )
        assert files[in_chart] == source.read_text(encoding="utf-8")
    links = [p.relative_to(CHART) for p in CHART.rglob("*") if p.is_symlink()]
    assert links == [], "Flux leaves symlinks out of a Git source"


def test_a_packaged_chart_carries_the_crds_themselves(tmp_path: Path) -> None:
    """A published chart needs no repository."""
    archive = helm_python.package(CHART, destination=tmp_path)
    with helm_python.Chart.load_archive(Path(archive).read_bytes()) as chart:
        files = {f["name"]: f["data"] for f in chart.files}
    for source, in_chart in CRDS.items():
        assert files[in_chart] == source.read_text(encoding="utf-8")


def test_the_rendered_crds_are_the_source_crds_plus_keep_policy() -> None:
    """Semantically equal to crds/ once the chart's labels and keep annotation are set
    aside: the fromYaml/toYaml round trip in the template loses nothing."""
    rendered = {
        crd["metadata"]["name"]: crd for crd in _of_kind(_render(), "CustomResourceDefinition")
    }
    assert sorted(rendered) == sorted(CRD_NAMES)
    for source in CRDS:
        crd = rendered[source.name.removesuffix(".yaml")]
        metadata = crd["metadata"]
        # Argo CD prunes what stops being rendered whatever Helm's policy says.
        assert metadata["annotations"] == {
            KEEP: "keep",
            "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
        }
        assert metadata["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        stripped = {
            **crd,
            "metadata": {k: v for k, v in metadata.items() if k not in {"labels", "annotations"}},
        }
        assert stripped == yaml.safe_load(source.read_text(encoding="utf-8"))


def test_notes_tell_the_next_step() -> None:
    notes = _notes()
    assert f"kubectl apply -n {RELEASE_NAMESPACE} -f job.yaml" in notes
    assert f"kubectl get scj -n {RELEASE_NAMESPACE}" in notes
    assert "docs/operator.md" in notes
    assert f"rollout status deployment/{FULLNAME}" in notes


def test_notes_name_a_served_namespace_and_warn_of_the_operators_own() -> None:
    """The next step applied a job to the default namespace, which the default install does
    not serve, and nothing warned of jobs in the operator's own namespace, which the docs'
    known limits advise against (a platform reviewer's)."""
    assert f"WARNING: jobs in {RELEASE_NAMESPACE}, the operator's own namespace" in _notes()
    served = _notes({"watchNamespaces": ["streaming"]})
    assert "kubectl apply -n streaming -f job.yaml" in served
    assert "WARNING" not in served
    everywhere = _notes({"clusterWide": True})
    assert "kubectl apply -n <namespace> -f job.yaml" in everywhere
    assert f"WARNING: jobs in {RELEASE_NAMESPACE}, the operator's own namespace" in everywhere


def test_the_crd_can_be_left_to_someone_else() -> None:
    assert _of_kind(_render({"crds": {"install": False}}), "CustomResourceDefinition") == []
    notes = _notes({"crds": {"install": False}})
    assert "apply crds/sparkcheckpointjobs" in notes
    assert "crds/sparkcheckpointsnapshots" in notes


# --- the Deployment ---------------------------------------------------------------------------


def test_one_operator_at_a_time_with_kopfs_liveness_probe() -> None:
    objects = _render()
    deployment = _one(objects, "Deployment")
    container = _container(objects)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert container["command"] == ["spark-checkpoint-operator"]
    assert container["args"] == [
        "--liveness=http://0.0.0.0:8080/healthz",
        f"--namespace={RELEASE_NAMESPACE}",  # least privilege: its own namespace by default
    ]
    ports = {p["name"]: p for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "health"}
    assert ports["health"]["containerPort"] == 8080
    assert ports["metrics"] == {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}
    assert container["image"] == "ghcr.io/spark-checkpoint/operator:0.1.0"  # appVersion
    assert container["imagePullPolicy"] == "IfNotPresent"
    pod = deployment["spec"]["template"]
    assert (
        pod["metadata"]["labels"].items() <= deployment["spec"]["selector"]["matchLabels"].items()
    )
    assert pod["spec"]["serviceAccountName"] == _one(objects, "ServiceAccount")["metadata"]["name"]


def test_pod_labels_add_to_the_selector_labels_but_cannot_change_them() -> None:
    """The Deployment's selector is immutable and must select its own pods."""
    deployment = _one(_render({"podLabels": {"team": "data"}}), "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "data"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for key in deployment["spec"]["selector"]["matchLabels"]:
        with pytest.raises(helm_python.HelmRenderError) as raised:
            _render({"podLabels": {key: "mine"}})
        assert f"podLabels: {key} is a selector label" in str(raised.value)


def test_security_defaults() -> None:
    objects = _render()
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    container = _container(objects)
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] > 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"]
    assert "emptyDir" in volume


def test_with_user_ids_from_the_platform_no_pod_sets_an_id() -> None:
    """OpenShift's restricted-v2 SCC refuses a pod whose ids lie outside the namespace's
    range: `userIds: platform` leaves the operator pod's out, whatever podSecurityContext
    says, and tells the operator to leave the jobs' pods' out too."""
    objects = _render({"userIds": "platform", "podSecurityContext": {"fsGroup": 10001}})
    deployment = _one(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    environment = {e["name"]: e.get("value") for e in _container(objects)["env"]}
    assert environment["SPARK_CHECKPOINT_USER_IDS"] == "platform"
    for document in objects:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)

    default = _render()
    assert {e["name"]: e.get("value") for e in _container(default)["env"]}[
        "SPARK_CHECKPOINT_USER_IDS"
    ] == "image"
    assert (
        _one(default, "Deployment")["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        == 10001
    )
    with pytest.raises(helm_python.HelmValuesError, match="userIds"):
        _render({"userIds": "openshift"})
    for key in ("runAsUser", "runAsGroup"):
        with pytest.raises(helm_python.HelmRenderError, match=f"securityContext.{key}: with"):
            _render({"userIds": "platform", "securityContext": {key: 10001}})


def test_the_operator_knows_its_own_service_account() -> None:
    """From the downward API: the operator refuses it for a job's pods (a job in the
    release namespace would otherwise run its code with the operator's token)."""
    objects = _render()
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    env = {variable["name"]: variable for variable in _container(objects)["env"]}

    assert env[OPERATOR_NAMESPACE_VARIABLE]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    assert env[OPERATOR_SERVICE_ACCOUNT_VARIABLE]["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.serviceAccountName"}
    }
    assert pod["serviceAccountName"] == FULLNAME


@pytest.mark.parametrize("name", ["HOME", OPERATOR_SERVICE_ACCOUNT_VARIABLE, METRICS_PORT_VARIABLE])
def test_operator_env_cannot_set_what_the_chart_sets(name: str) -> None:
    """It rendered the variable twice (a platform reviewer's): server-side apply refuses a
    duplicate name, client-side apply keeps the last; and a metrics port moved the server
    away from the port the Service and ServiceMonitor scrape."""
    with pytest.raises(helm_python.HelmRenderError) as raised:
        _render({"operator": {"env": [{"name": name, "value": "1"}]}})
    assert f"operator.env: {name} is set by the chart" in str(raised.value)


def test_liveness_probe_timings_set_to_null_leave_kubernetes_defaults() -> None:
    """`--set livenessProbe=null` (Helm drops the key) rendered `null` into the probe and
    failed as YAML (a platform reviewer's)."""
    probe = _container(_render({"livenessProbe": None}))["livenessProbe"]
    assert probe == {"httpGet": {"path": "/healthz", "port": "health"}}


def test_an_image_digest_pins_the_image() -> None:
    """There was no way to pin by digest (a platform reviewer's): a digest as the tag
    rendered `repository:sha256:...`, which Kubernetes refuses (InvalidImageName)."""
    digest = "sha256:" + "ab" * 32
    image = {"repository": "registry.example.com/sco", "tag": "1.2.3", "digest": digest}
    assert (
        _container(_render({"image": image}))["image"] == f"registry.example.com/sco:1.2.3@{digest}"
    )
    with pytest.raises(helm_python.HelmValuesError):
        _render({"image": {**image, "digest": "1.2.3"}})


def test_the_operators_environment_names_each_variable_once() -> None:
    names = [variable["name"] for variable in _container(_render(SCENARIOS["custom-image"]))["env"]]
    assert len(names) == len(set(names)) and "TZ" in names, names


def test_custom_image_resources_and_arguments() -> None:
    objects = _render(SCENARIOS["custom-image"])
    container = _container(objects)
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert container["image"] == "registry.example.com/sco:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert container["args"][-1] == "--verbose"
    assert {"name": "TZ", "value": "UTC"} in container["env"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_namespaced_mode_watches_each_namespace() -> None:
    objects = _render(SCENARIOS["namespaced"])
    args = _container(objects)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    roles = _of_kind(objects, "Role")
    bindings = _of_kind(objects, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    # The only cluster-wide grant is Kopf's read-only scanning.
    (cluster_role,) = _of_kind(objects, "ClusterRole")
    assert cluster_role["metadata"]["name"].endswith("-kopf-scanning")
    assert {r["resources"][0] for r in cluster_role["rules"]} == {
        "customresourcedefinitions",
        "namespaces",
    }


def test_the_default_serves_the_release_namespace_only() -> None:
    """Least privilege by default: pods and Secrets only in the operator's own namespace."""
    objects = _render()
    (role,) = _of_kind(objects, "Role")
    (binding,) = _of_kind(objects, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert _role_grants(objects, "ClusterRole") == KOPF_SCANNING | KOPF_NAMESPACES
    assert f"in its own namespace, {RELEASE_NAMESPACE}" in _notes()


def test_cluster_wide_mode_is_explicit_and_excludes_a_namespace_list() -> None:
    args = _container(_render(SCENARIOS["cluster-wide"]))["args"]
    assert args[-1] == "--all-namespaces"
    assert not [a for a in args if a.startswith("--namespace")]
    with pytest.raises(helm_python.HelmRenderError) as raised:
        _render({"clusterWide": True, "watchNamespaces": ["team-a"]})
    assert "leave watchNamespaces empty" in str(raised.value)


def test_metrics_service_and_service_monitor() -> None:
    objects = _render(SCENARIOS["monitoring"])
    service = _one(objects, "Service")
    assert service["metadata"]["name"] == f"{FULLNAME}-metrics"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}
    ]
    monitor = _one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert _of_kind(_render(), "ServiceMonitor") == []  # off by default
    assert _of_kind(_render(SCENARIOS["no-network-policy"]), "Service") == []


# --- the NetworkPolicy ----------------------------------------------------------------------------


def _policies(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["namespace"]: p["spec"] for p in _of_kind(_render(values), "NetworkPolicy")
    }


def test_only_the_operator_reaches_the_agent_port() -> None:
    policies = _policies(SCENARIOS["namespaced"])
    assert set(policies) == {"team-a", "team-b"}
    deployment = _one(_render(), "Deployment")
    operator_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for spec in policies.values():
        assert spec["podSelector"] == {"matchLabels": {"sparkcheckpoint.io/component": "driver"}}
        assert spec["policyTypes"] == ["Ingress"]
        operator_rule, others = spec["ingress"]
        (source,) = operator_rule["from"]
        assert source["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}
        }
        assert source["podSelector"]["matchLabels"].items() <= operator_labels.items()
        assert operator_rule["ports"] == [{"protocol": "TCP", "port": AGENT_PORT}]
        # Everyone else: every port but the agent's (no `from`: any source).
        assert "from" not in others
        tcp = [(p["port"], p["endPort"]) for p in others["ports"] if p["protocol"] == "TCP"]
        assert tcp == [(1, AGENT_PORT - 1), (AGENT_PORT + 1, 65535)]
        assert {"protocol": "UDP"} in others["ports"]
    # A network plugin without endPort would cut executors off: the install says so.
    assert "networkPolicy.otherTraffic=executors" in _notes(SCENARIOS["namespaced"])


def test_cluster_wide_policies_go_to_listed_namespaces_only() -> None:
    """A NetworkPolicy selects pods of its own namespace: cluster-wide, the chart cannot know
    where drivers run, so it renders one per listed namespace, or none and says so."""
    assert set(_policies({})) == {RELEASE_NAMESPACE}
    assert _policies(SCENARIOS["cluster-wide"]) == {}
    assert "no NetworkPolicy protects" in _notes(SCENARIOS["cluster-wide"])
    policies = _policies(SCENARIOS["cluster-wide-policies"])
    assert set(policies) == {"jobs-1", "jobs-2"}
    for spec in policies.values():
        operator_rule, executors, extra = spec["ingress"]
        assert operator_rule["ports"] == [{"protocol": "TCP", "port": AGENT_PORT}]
        assert executors == {"from": [{"podSelector": {"matchLabels": {"spark-role": "executor"}}}]}
        assert extra == {"ports": [{"protocol": "TCP", "port": 4040}]}
    assert _policies(SCENARIOS["no-network-policy"]) == {}


# --- RBAC ----------------------------------------------------------------------------------


class Grant(NamedTuple):
    verb: str
    group: str
    resource: str  # "plural" or "plural/subresource"


def _grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        Grant(verb, group, resource)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# What the operator's code calls, per namespace it serves (docs/operator.md, RBAC), as found in
# operator/spark_checkpoint_operator/kubernetes/: runtime.py, controller.py (the kubernetes
# client) and handlers.py (Kopf).
OPERATOR_GRANTS = {
    Grant("get", "sparkcheckpoint.io", "sparkcheckpointjobs"),  # the stored status at start
    Grant("list", "sparkcheckpoint.io", "sparkcheckpointjobs"),  # Kopf's watch: list, then watch
    Grant("watch", "sparkcheckpoint.io", "sparkcheckpointjobs"),
    Grant("patch", "sparkcheckpoint.io", "sparkcheckpointjobs"),  # Kopf: finalizer, annotations
    Grant("patch", "sparkcheckpoint.io", "sparkcheckpointjobs/status"),  # the controller
    Grant("list", "sparkcheckpoint.io", "sparkcheckpointsnapshots"),  # Kopf's watch
    Grant("watch", "sparkcheckpoint.io", "sparkcheckpointsnapshots"),
    Grant("patch", "sparkcheckpoint.io", "sparkcheckpointsnapshots"),  # the finalizer
    Grant("create", "sparkcheckpoint.io", "sparkcheckpointsnapshots"),  # the mirrors
    Grant("delete", "sparkcheckpoint.io", "sparkcheckpointsnapshots"),
    Grant("patch", "sparkcheckpoint.io", "sparkcheckpointsnapshots/status"),  # the controller
    Grant("list", "", "pods"),  # Kopf's pod events; earlier drivers before a launch
    Grant("watch", "", "pods"),
    Grant("get", "", "pods"),  # adoption; waiting for a deleted pod to be gone
    Grant("create", "", "pods"),  # drivers and cleanup pods
    Grant("delete", "", "pods"),
    Grant("create", "", "secrets"),  # the agent token, per job
    Grant("patch", "", "secrets"),  # a new token per attempt
    Grant("get", "", "secrets"),  # the token read back when adopting a driver
    Grant("create", "", "events"),  # kopf.event(): core v1 events, POST
    Grant("get", "coordination.k8s.io", "leases"),  # the job's Lease: who drives it
    Grant("create", "coordination.k8s.io", "leases"),
    Grant("update", "coordination.k8s.io", "leases"),  # renewed, taken over, released
}


def _documented_grants(page: Path, after: str) -> set[Grant]:
    """The rules of the first `| resource | verbs |` table after the line holding `after`
    (resources as `plural[.group][/subresource]`, verbs before any parenthesis)."""
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    rows = itertools.dropwhile(
        lambda line: not line.startswith("| resource | verbs"), lines[start:]
    )
    grants = set()
    for row in itertools.takewhile(lambda line: line.startswith("|"), list(rows)[2:]):
        resource, verbs = (cell.strip() for cell in row.split("|")[1:3])
        name, _, subresource = resource.strip("`").partition("/")
        plural, _, group = name.partition(".")
        for verb in re.sub(r"\([^)]*\)", "", verbs).split(","):
            grants.add(Grant(verb.strip(), group, "/".join(filter(None, (plural, subresource)))))
    return grants


def test_the_rules_the_docs_list_are_the_charts() -> None:
    """operator.md says "the chart's RBAC is exactly this" and lacked the Lease rule: RBAC
    written from it left every job without an operator (a GitOps user's)."""
    assert _documented_grants(
        ROOT / "docs" / "operator.md", "the operator needs, per watched namespace"
    ) == (OPERATOR_GRANTS)
    assert _documented_grants(CHART / "README.md", "The operator's rules") == OPERATOR_GRANTS


# What Kopf 1.45 observes cluster-wide (kopf/_core/reactor/observation.py): CRDs always,
# namespaces only with --namespace. Peering (kopfpeerings) is off: --standalone.
KOPF_SCANNING = {
    Grant("list", "apiextensions.k8s.io", "customresourcedefinitions"),
    Grant("watch", "apiextensions.k8s.io", "customresourcedefinitions"),
}
KOPF_NAMESPACES = {Grant("list", "", "namespaces"), Grant("watch", "", "namespaces")}


def _role_grants(objects: list[dict[str, Any]], kind: str) -> set[Grant]:
    return {g for role in _of_kind(objects, kind) for g in _grants(role["rules"])}


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses() -> None:
    objects = _render(SCENARIOS["cluster-wide"])
    assert _of_kind(objects, "Role") == []
    roles = {r["metadata"]["name"]: _grants(r["rules"]) for r in _of_kind(objects, "ClusterRole")}
    cluster_name = f"{FULLNAME}-{RELEASE_NAMESPACE}"
    assert roles == {
        cluster_name: OPERATOR_GRANTS,
        f"{cluster_name}-kopf-scanning": KOPF_SCANNING,
    }


@pytest.mark.parametrize(
    "values",
    [
        {"watchNamespaces": ["shared", "spark-ops"], "networkPolicy": {"enabled": True}},
        {"clusterWide": True},
    ],
    ids=["namespaced", "cluster-wide"],
)
def test_releases_of_one_name_in_two_namespaces_claim_no_object_of_each_other(
    values: Mapping[str, Any],
) -> None:
    """Both rendered the ClusterRoles, and Roles in a namespace both serve, under one name
    (a platform reviewer's): Helm refused the second install, Argo CD flipped the binding's
    subject between the two service accounts."""

    def claimed(namespace: str) -> set[tuple[str, str | None, str]]:
        # The CRD is shared: one release installs it (the chart's README).
        return {
            (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
            for o in _render({**values, "crds": {"install": False}}, namespace=namespace)
            if o["metadata"].get("namespace") != namespace
        }

    team_a, team_b = claimed("team-a"), claimed("team-b")
    assert team_a and team_b
    assert team_a.isdisjoint(team_b), team_a & team_b


def test_namespaced_rbac_is_exactly_what_the_operator_uses() -> None:
    objects = _render(SCENARIOS["namespaced"])
    for role in _of_kind(objects, "Role"):
        assert _grants(role["rules"]) == OPERATOR_GRANTS
    assert _role_grants(objects, "ClusterRole") == KOPF_SCANNING | KOPF_NAMESPACES


def test_every_binding_binds_the_operators_service_account_to_a_rendered_role() -> None:
    for scenario in ("default", "namespaced", "cluster-wide"):
        objects = _render(SCENARIOS[scenario])
        account = _one(objects, "ServiceAccount")["metadata"]
        roles = {
            (r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"])
            for r in _of_kind(objects, "Role") + _of_kind(objects, "ClusterRole")
        }
        bindings = _of_kind(objects, "RoleBinding") + _of_kind(objects, "ClusterRoleBinding")
        assert len(bindings) == len(roles)
        for binding in bindings:
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
            assert (ref["kind"], namespace, ref["name"]) in roles
            assert binding["subjects"] == [
                {
                    "kind": "ServiceAccount",
                    "name": account["name"],
                    "namespace": account["namespace"],
                }
            ]


def test_without_kopf_scanning_namespaced_mode_needs_no_cluster_rights() -> None:
    """rbac.kopfScanning=false: a tenant without cluster-level rights can install it."""
    objects = _render({"watchNamespaces": ["team-a"], "rbac": {"kopfScanning": False}})
    assert _of_kind(objects, "ClusterRole") == _of_kind(objects, "ClusterRoleBinding") == []


# --- RBAC against a recorded run ---------------------------------------------------------


class Access(NamedTuple):
    verb: str
    group: str
    resource: str
    namespace: str | None  # None: cluster scope (a cluster-scoped resource, or all namespaces)


def _verb(request: Any) -> str:
    method = str(request.method.value)
    named = request.name is not None
    if method == "GET":
        if named:
            return "get"
        return "watch" if request.params.get("watch") in ("true", "1") else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]


def _accesses(requests: list[Any]) -> set[Access]:
    """The operator's resource requests: those with its token (the simulated kubelet has
    none). Discovery (/api, /apis, /version) is for every authenticated user
    (system:discovery) and needs no grant."""
    found = set()
    for request in requests:
        if request.headers.get("Authorization") != f"Bearer {OPERATOR_TOKEN}":
            continue
        if request.resource is None or request.resource.plural is None:
            continue
        resource = request.resource.plural
        if request.subresource:
            resource += f"/{request.subresource}"
        found.add(Access(_verb(request), request.resource.group, resource, request.namespace))
    return found


def _allowed(objects: list[dict[str, Any]], access: Access) -> bool:
    """Kubernetes' RBAC authorizer, for the rendered objects: a ClusterRole bound by a
    ClusterRoleBinding allows everywhere, a Role bound by a RoleBinding in its namespace."""
    roles = {
        (r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"]): _grants(r["rules"])
        for r in _of_kind(objects, "Role") + _of_kind(objects, "ClusterRole")
    }
    grant = Grant(access.verb, access.group, access.resource)
    for binding in _of_kind(objects, "ClusterRoleBinding") + _of_kind(objects, "RoleBinding"):
        scope = binding["metadata"].get("namespace")
        if scope is not None and scope != access.namespace:
            continue
        ref = binding["roleRef"]
        key = (ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])
        if grant in roles.get(key, set()):
            return True
    return False


def _job() -> dict[str, Any]:
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": "orders", "namespace": "default"},
        "spec": {
            "image": "example/orders:1",
            "application": {
                "mainFile": "local:///opt/app/orders.py",
                "sparkConf": {"spark.master": "local[2]"},
            },
            "checkpointing": {
                "interval": "1s",
                "minPause": "0s",
                "timeout": "20s",
                "retained": 2,
                "storage": "file:///simulated",
            },
            "restartPolicy": {"type": "OnFailure", "maxRetries": 3, "backoff": "1s"},
            # A snapshot object mirrors each savepoint; the history keeps one.
            "savepoints": {"historyMaxCount": 1, "snapshotObjects": True},
        },
    }


@contextlib.contextmanager
def _operator(
    container: Mapping[str, Any], kubeconfig: Path, log: Path, metrics_port: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The Deployment's own command, arguments and environment (its literal values), as
    the operator identity. Its metrics port is a free one: the container's 9090 is the
    pod's own, not this machine's (two tests, or another checkout's, would take it from
    each other)."""
    environment = {
        **os.environ,
        **{e["name"]: e["value"] for e in container.get("env", ()) if "value" in e},
        "HOME": os.environ["HOME"],  # the image's /tmp is this machine's too
        "KUBECONFIG": str(kubeconfig),
        METRICS_PORT_VARIABLE: str(metrics_port or free_port()),
    }
    args = container["args"]
    with log.open("ab") as output:
        process = subprocess.Popen(
            [OPERATOR_COMMAND, *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _healthy(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _last_savepoint(cluster: LocalCluster, nonce: int) -> int | None:
    """The id of the job's last savepoint if `savepointTriggerNonce: nonce` took it."""
    last = cluster.status("orders").get("lastSavepoint") or {}
    return last.get("id") if last.get("label") == f"nonce {nonce}" else None


def _mirror_ids(cluster: LocalCluster) -> list[int | None]:
    return [(o.get("status") or {}).get("id") for o in cluster.api.list(SNAPSHOTS, "default")]


def _counts(cluster: LocalCluster, key: str) -> int:
    counts: dict[str, int] = cluster.status("orders").get("counts", {})
    return counts.get(key, 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "scope",
    [{"watchNamespaces": ["default"]}, {"clusterWide": True}],
    ids=["namespaced", "cluster-wide"],
)
def test_a_recorded_run_uses_exactly_what_the_chart_grants(
    tmp_path: Path, scope: dict[str, Any]
) -> None:
    """The operator, started with the rendered Deployment's arguments against the emulated
    API server, goes through a job's life (driver, checkpoints, a crash and restore, its own
    restart with adoption, deletion with a final savepoint). Every request it makes must be
    allowed by the rendered RBAC, and every rule must have been used."""
    health = free_port()
    values = {**scope, "operator": {"healthPort": health}}
    objects = _render(values)
    container = _container(objects)
    assert f"--liveness=http://0.0.0.0:{health}/healthz" in container["args"]

    with LocalCluster(
        tmp_path, simulated=SimulatedAgents(batch_seconds=0.3), operator=False
    ) as cluster:
        kubeconfig = cluster.api.write_kubeconfig(tmp_path / "operator-kubeconfig")
        config = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
        config["users"][0]["user"] = {"token": OPERATOR_TOKEN}
        kubeconfig.write_text(yaml.safe_dump(config), encoding="utf-8")
        log = tmp_path / "operator.log"

        def wait(what: str, condition: Any) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                assert time.monotonic() < deadline, f"{what}\n{log.read_text(errors='replace')}"
                time.sleep(0.2)

        with _operator(container, kubeconfig, log):
            wait("Kopf's liveness endpoint", lambda: _healthy(health))
            cluster.apply(_job())
            wait("2 checkpoints", lambda: _counts(cluster, "completed") >= 2)
            for nonce in (1, 2):  # the second's mirror is made, the first's deleted
                cluster.patch_spec("orders", {"savepointTriggerNonce": nonce})
                wait(f"nonce {nonce}'s savepoint", partial(_last_savepoint, cluster, nonce))
                taken = _last_savepoint(cluster, nonce)
                wait("its mirror alone", lambda t=taken: _mirror_ids(cluster) == [t])
            snapshot = {
                "apiVersion": "sparkcheckpoint.io/v1alpha1",
                "kind": "SparkCheckpointSnapshot",
                "metadata": {"name": "before-crash", "namespace": "default"},
                "spec": {"jobReference": {"name": "orders"}, "savepoint": {}},
            }
            cluster.api.create(SNAPSHOTS, snapshot, namespace="default")
            wait(
                "the snapshot taken",
                lambda: (
                    cluster.api.get(SNAPSHOTS, "default", "before-crash")
                    .get("status", {})
                    .get("state")
                    == "COMPLETED"
                ),
            )
            cluster.crash_driver("orders-driver-1")
            wait("a restore", lambda: _counts(cluster, "restored") >= 1)
        with _operator(container, kubeconfig, log):  # adopts the running driver
            done = _counts(cluster, "completed")
            wait("a checkpoint after adoption", lambda: _counts(cluster, "completed") > done)
            cluster.delete("orders")
            wait("the job gone", lambda: cluster.job("orders") is None)
        requests = cluster.api.call(list)  # kmock's record of every request

    used = _accesses(requests)
    assert used, "no request carried the operator's token"
    denied = sorted(a for a in used if not _allowed(objects, a))
    assert denied == [], f"the chart does not grant: {denied}"
    granted = _role_grants(objects, "Role") | _role_grants(objects, "ClusterRole")
    unused = granted - {Grant(a.verb, a.group, a.resource) for a in used}
    assert unused == set(), f"granted but never used: {sorted(unused)}"


@pytest.mark.timeout(120)
def test_on_an_ipv6_only_cluster_the_probe_and_the_metrics_answer_on_ipv6(
    tmp_path: Path,
) -> None:
    """listenAddress `::`: Kopf's liveness endpoint and the metrics listen on IPv6, where an
    IPv6-only cluster's kubelet and Prometheus reach the pod (both bound IPv4 only)."""
    health, metrics = free_port(), free_port()
    container = _container(_render({"operator": {"healthPort": health, "listenAddress": "::"}}))
    assert f"--liveness=http://[::]:{health}/healthz" in container["args"]

    with LocalCluster(tmp_path, operator=False) as cluster:
        kubeconfig = cluster.api.write_kubeconfig(tmp_path / "operator-kubeconfig")
        log = tmp_path / "operator.log"
        with _operator(container, kubeconfig, log, metrics_port=metrics):
            deadline = time.monotonic() + 60
            while not _healthy(health, "[::1]"):
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)
            with urllib.request.urlopen(f"http://[::1]:{metrics}/metrics", timeout=5) as answer:
                assert b"spark_checkpoint_checkpoints_total" in answer.read()
