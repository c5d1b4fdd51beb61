"""The emulator's ``/metrics`` counts requests as kube-apiserver's ``apiserver_request_total``
does (verb, resource, subresource, scope, code), read with Prometheus' own parser through
the official client, as the operator-scale benchmark reads a cluster's."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from helpers.kube.emulator import spark_checkpoint_api

Labels = tuple[str, str, str, str, str]  # verb, resource, subresource, scope, code


@pytest.fixture
def api_client(tmp_path: Path) -> Iterator[client.ApiClient]:
    with spark_checkpoint_api() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield config.new_client_from_config(config_file=str(kubeconfig))


def _metrics(api: client.ApiClient) -> str:
    method, url, headers, _, _ = api.param_serialize("GET", "/metrics")
    response = api.call_api(method, url, header_params=headers)
    response.read()
    assert response.status == 200
    assert response.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    text: str = response.data.decode()
    return text


def _scrape(api: client.ApiClient) -> dict[Labels, float]:
    counts: dict[Labels, float] = {}
    for family in text_string_to_metric_families(_metrics(api)):
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                labels = sample.labels
                assert labels["component"] == "apiserver" and labels["dry_run"] == ""
                verb, resource, subresource = (
                    labels["verb"],
                    labels["resource"],
                    labels["subresource"],
                )
                counts[verb, resource, subresource, labels["scope"], labels["code"]] = sample.value
    return counts


def test_requests_are_counted_by_verb_resource_scope_and_code(api_client: client.ApiClient) -> None:
    core, jobs = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    core.create_namespaced_pod("default", pod)
    core.read_namespaced_pod("p", "default")
    core.read_namespaced_pod("p", "default")
    core.list_namespaced_pod("default")
    core.list_pod_for_all_namespaces()
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    with pytest.raises(ApiException):
        core.read_namespaced_pod("missing", "default")
    for _event in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1):
        pass
    jobs.list_namespaced_custom_object(
        "sparkcheckpoint.io", "v1alpha1", "default", "sparkcheckpointjobs"
    )
    core.delete_collection_namespaced_pod("default", _preload_content=False)

    counts = _scrape(api_client)

    assert counts[("POST", "pods", "", "resource", "201")] == 1
    assert counts[("GET", "pods", "", "resource", "200")] == 2
    assert counts[("GET", "pods", "", "resource", "404")] == 1
    assert counts[("LIST", "pods", "", "namespace", "200")] == 1
    assert counts[("LIST", "pods", "", "cluster", "200")] == 1
    assert counts[("PATCH", "pods", "status", "resource", "200")] == 1
    assert counts[("WATCH", "pods", "", "namespace", "200")] == 1  # counted once it ended
    assert counts[("LIST", "sparkcheckpointjobs", "", "namespace", "200")] == 1
    assert counts[("DELETECOLLECTION", "pods", "", "namespace", "200")] == 1


def test_metrics_report_the_server_process_and_count_requests_outside_the_resources(
    api_client: client.ApiClient,
) -> None:
    method, url, headers, _, _ = api_client.param_serialize("GET", "/api/v1")
    assert api_client.call_api(method, url, header_params=headers).status == 200  # discovery
    first = _scrape(api_client)
    time.sleep(0.01)
    second = _scrape(api_client)

    assert first[("GET", "", "/api/v1", "", "200")] == 1
    # A scrape is counted once answered, as kube-apiserver counts its own /metrics.
    assert ("GET", "", "/metrics", "", "200") not in first
    assert second[("GET", "", "/metrics", "", "200")] == 1


def test_metrics_describe_the_server_process(api_client: client.ApiClient) -> None:
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(_metrics(api_client))
        for sample in family.samples
    }
    assert samples["process_cpu_seconds_total"] > 0
    assert samples["process_resident_memory_bytes"] > 0


def test_emulated_servers_count_apart(tmp_path: Path) -> None:
    """Each emulator has its own counter: tests in one process do not add up."""
    with spark_checkpoint_api() as first, spark_checkpoint_api() as second:
        for server, lists in ((first, 2), (second, 1)):
            kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
            api = config.new_client_from_config(config_file=str(kubeconfig))
            for _ in range(lists):
                client.CoreV1Api(api).list_namespaced_pod("default")
            assert _scrape(api)[("LIST", "pods", "", "namespace", "200")] == lists
