"""What the emulated API server serves to kubectl besides objects, over HTTP as kubectl asks
for it: aggregated discovery, the OpenAPI v3 documents, Tables of custom resources, and
strategic merge patches of built-in kinds (tests/kube/test_kubectl.py runs kubectl itself)."""

import datetime
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import kmock
import pytest

from helpers.kube import discovery, table
from helpers.kube.emulator import EmulatedApiServer, spark_checkpoint_api

JOBS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
DISCOVERY_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
)


@pytest.fixture
def api() -> Iterator[EmulatedApiServer]:
    with spark_checkpoint_api() as server:
        yield server


def _get(api: EmulatedApiServer, path: str, accept: str = "application/json") -> tuple[Any, str]:
    request = urllib.request.Request(api.url + path, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response), response.headers["Content-Type"]


def _status_of(api: EmulatedApiServer, path: str, accept: str = "application/json") -> int:
    try:
        _get(api, path, accept)
    except urllib.error.HTTPError as error:
        return error.code
    return 200


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": name},
        "spec": {"application": {"mainFile": "app.py"}},
    }


# --- discovery ------------------------------------------------------------------------------


def test_aggregated_discovery_nests_subresources_under_their_resource(
    api: EmulatedApiServer,
) -> None:
    found, content_type = _get(api, "/apis", DISCOVERY_ACCEPT)
    assert content_type == discovery.CONTENT_TYPE
    assert found["kind"] == "APIGroupDiscoveryList"
    [group] = [g for g in found["items"] if g["metadata"].get("name") == "sparkcheckpoint.io"]
    [version] = group["versions"]
    resources = {resource["resource"]: resource for resource in version["resources"]}
    assert sorted(resources) == ["sparkcheckpointjobs", "sparkcheckpointsnapshots"]
    assert resources["sparkcheckpointsnapshots"]["shortNames"] == ["scsnap"]
    assert resources["sparkcheckpointjobs"] == {
        "resource": "sparkcheckpointjobs",
        "responseKind": {
            "group": "sparkcheckpoint.io",
            "version": "v1alpha1",
            "kind": "SparkCheckpointJob",
        },
        "scope": "Namespaced",
        "singularResource": "sparkcheckpointjob",
        "verbs": sorted(
            ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        ),
        "shortNames": ["scj"],
        "categories": ["spark"],
        "subresources": [
            {
                "subresource": "status",
                "responseKind": resources["sparkcheckpointjobs"]["responseKind"],
                "verbs": ["get", "patch", "update"],
            }
        ],
    }
    core, _ = _get(api, "/api", DISCOVERY_ACCEPT)
    [legacy] = core["items"]
    assert legacy["metadata"] == {}
    pods = next(r for r in legacy["versions"][0]["resources"] if r["resource"] == "pods")
    assert pods["scope"] == "Namespaced"
    assert "binding" in [s["subresource"] for s in pods["subresources"]]


def test_plain_json_clients_get_legacy_discovery(api: EmulatedApiServer) -> None:
    found, _ = _get(api, "/apis")
    assert found["kind"] == "APIGroupList"


def test_preferred_versions_come_first() -> None:
    assert discovery.preferred_first(["v1beta1", "v2", "v1alpha1", "v1", "v2beta2", "x"]) == [
        "v2",
        "v1",
        "v2beta2",
        "v1beta1",
        "v1alpha1",
        "x",
    ]


# --- OpenAPI --------------------------------------------------------------------------------


def test_openapi_index_points_to_each_group_versions_document(api: EmulatedApiServer) -> None:
    index, _ = _get(api, "/openapi/v3")
    url = index["paths"]["apis/sparkcheckpoint.io/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/sparkcheckpoint.io/v1alpha1?hash=")
    document, _ = _get(api, url)
    schemas = document["components"]["schemas"]
    job = schemas["io.sparkcheckpoint.v1alpha1.SparkCheckpointJob"]
    assert job["x-kubernetes-group-version-kind"] == [
        {"group": "sparkcheckpoint.io", "version": "v1alpha1", "kind": "SparkCheckpointJob"}
    ]
    assert job["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in schemas
    assert "io.sparkcheckpoint.v1alpha1.SparkCheckpointJobList" in schemas
    patch = document["paths"][
        "/apis/sparkcheckpoint.io/v1alpha1/namespaces/{namespace}/sparkcheckpointjobs/{name}"
    ]["patch"]
    # kubectl sends fieldValidation where PATCH lists it; a CRD takes no strategic merge.
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]


def test_built_in_kinds_carry_their_patch_strategies(api: EmulatedApiServer) -> None:
    document, _ = _get(api, "/openapi/v3/api/v1")
    pod_spec = document["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]
    containers = pod_spec["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    assert containers["items"] == {"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}
    assert pod_spec["properties"]["hostname"]["type"] == "string"  # not ["string", "null"]
    patch = document["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]


def test_an_unknown_openapi_document_is_404(api: EmulatedApiServer) -> None:
    assert _status_of(api, "/openapi/v3/apis/nothing.example/v1") == 404


# --- Tables ---------------------------------------------------------------------------------


def test_a_table_of_custom_resources_evaluates_the_printer_columns(
    api: EmulatedApiServer,
) -> None:
    api.create(JOBS, _job("a"), namespace="default")
    api.create(JOBS, _job("b"), namespace="default")
    completion = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=4, seconds=3)
    status = {
        "phase": "Running",
        "lastCheckpoint": {"id": 3, "completionTime": completion.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "counts": {"restored": 0},
    }
    api.patch(JOBS, "default", "a", {"status": status}, subresource="status")

    printed, content_type = _get(
        api,
        "/apis/sparkcheckpoint.io/v1alpha1/namespaces/default/sparkcheckpointjobs",
        TABLE_ACCEPT,
    )

    assert content_type == table.CONTENT_TYPE
    assert printed["kind"] == "Table"
    assert [(c["name"], c["type"]) for c in printed["columnDefinitions"]] == [
        ("Name", "string"),
        ("Phase", "string"),
        ("Last Checkpoint", "integer"),
        ("Checkpoint Age", "date"),
        ("Last Savepoint", "integer"),
        ("Restores", "integer"),
        ("Rolled Back", "integer"),
        ("Age", "date"),
    ]
    [a, b] = printed["rows"]
    assert a["cells"][:6] == ["a", "Running", 3, "4m3s", None, 0]  # no savepoint yet
    assert b["cells"][:6] == ["b", None, None, None, None, None]  # no status: empty cells
    assert a["object"]["kind"] == "PartialObjectMetadata"
    assert a["object"]["metadata"]["name"] == "a"
    one, _ = _get(
        api,
        "/apis/sparkcheckpoint.io/v1alpha1/namespaces/default/sparkcheckpointjobs/b"
        "?includeObject=Object",
        TABLE_ACCEPT,
    )
    [row] = one["rows"]
    assert row["object"]["spec"]["application"]["mainFile"] == "app.py"
    bad = "/apis/sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs?includeObject=All"
    assert _status_of(api, bad, TABLE_ACCEPT) == 400


def test_a_client_that_asks_for_json_gets_the_list(api: EmulatedApiServer) -> None:
    api.create(JOBS, _job("a"), namespace="default")
    found, _ = _get(api, "/apis/sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs")
    assert found["kind"] == "SparkCheckpointJobList"


@pytest.mark.parametrize(
    ("column", "value", "cell"),
    [
        ({"type": "integer"}, 3.0, 3),
        ({"type": "integer"}, "3", None),
        ({"type": "number"}, 2, 2.0),
        ({"type": "boolean"}, True, True),
        ({"type": "string"}, 7, "7"),
        ({"type": "string"}, True, "true"),
        ({"type": "string"}, {"a": [1]}, '{"a":[1]}'),
        ({"type": "date"}, "yesterday", "<invalid>"),
        ({"type": "date"}, 5, None),
    ],
)
def test_cells_convert_as_the_api_servers_table_convertor(
    column: dict[str, Any], value: Any, cell: Any
) -> None:
    printed = table.table(
        [{"name": "C", "jsonPath": ".spec.value", **column}],
        [{"metadata": {"name": "x"}, "spec": {"value": value}}],
        resource_version="1",
        include_object="None",
    )
    assert printed["rows"] == [{"cells": ["x", cell]}]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-2, "<invalid>"),
        (-1.999, "0s"),
        (0.999, "0s"),
        (70, "70s"),
        (119.999, "119s"),
        (120, "2m"),
        (190, "3m10s"),
        (599.999, "9m59s"),
        (601, "10m"),
        (3 * 3600 - 0.001, "179m"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600 + 59 * 60, "8h"),
        (47 * 3600, "47h"),
        (49 * 3600, "2d1h"),
        ((8 * 24 + 2) * 3600, "8d"),
        (367 * 24 * 3600, "367d"),
        ((365 * 2 * 24 + 25) * 3600, "2y1d"),
        (8 * 365 * 24 * 3600 - 0.001, "7y364d"),
        ((365 * 8 * 24 + 2) * 3600, "8y"),
    ],
)
def test_ages_read_as_kubernetes_human_durations(seconds: float, shown: str) -> None:
    assert table.human_duration(seconds) == shown


# --- strategic merge patches ----------------------------------------------------------------


DEPLOYMENTS = "apps/v1/deployments"


def _deployment(api: EmulatedApiServer) -> dict[str, Any]:
    containers = [
        {"name": "main", "image": "m:1", "env": [{"name": "A", "value": "1"}]},
        {"name": "side", "image": "s:1"},
    ]
    return api.create(
        DEPLOYMENTS,
        {
            "metadata": {"name": "d", "finalizers": ["a/x"], "labels": {"app": "d", "tier": "1"}},
            "spec": {"template": {"spec": {"containers": containers}}},
        },
        namespace="default",
    )


def _patched(api: EmulatedApiServer, patch: dict[str, Any]) -> dict[str, Any]:
    return api.patch(DEPLOYMENTS, "default", "d", patch, patch_type="strategic")


def _template(patch: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": patch}}}


def test_a_strategic_merge_patch_merges_lists_by_their_merge_key(api: EmulatedApiServer) -> None:
    _deployment(api)
    patched = _patched(
        api,
        {
            "metadata": {"finalizers": ["b/y"], "labels": {"tier": None}},
            **_template({"containers": [{"name": "main", "image": "m:2"}]}),
        },
    )
    assert patched["metadata"]["finalizers"] == ["a/x", "b/y"]  # a set: merged
    assert patched["metadata"]["labels"] == {"app": "d"}
    main, side = patched["spec"]["template"]["spec"]["containers"]
    assert main == {"name": "main", "image": "m:2", "env": [{"name": "A", "value": "1"}]}
    assert side == {"name": "side", "image": "s:1"}


def test_a_strategic_merge_patch_obeys_its_directives(api: EmulatedApiServer) -> None:
    _deployment(api)
    patched = _patched(
        api,
        {
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x"]},
            **_template(
                {
                    "$setElementOrder/containers": [{"name": "side"}, {"name": "main"}],
                    "containers": [{"name": "side", "image": "s:2"}],
                }
            ),
        },
    )
    assert patched["metadata"].get("finalizers") in (None, [])
    containers = patched["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [
        ("side", "s:2"),
        ("main", "m:1"),
    ]
    labels = _patched(api, {"metadata": {"labels": {"$patch": "replace", "new": "1"}}})
    assert labels["metadata"]["labels"] == {"new": "1"}
    env = _patched(
        api, _template({"containers": [{"name": "main", "env": [{"$patch": "replace"}]}]})
    )
    main = next(c for c in env["spec"]["template"]["spec"]["containers"] if c["name"] == "main")
    assert main["env"] == []


def test_a_strategic_merge_patch_can_delete_an_item_by_key(api: EmulatedApiServer) -> None:
    account = {"metadata": {"name": "sa"}, "secrets": [{"name": "a"}, {"name": "b"}]}
    api.create("v1/serviceaccounts", account, namespace="default")
    patched = api.patch(
        "v1/serviceaccounts",
        "default",
        "sa",
        {"secrets": [{"$patch": "delete", "name": "a"}]},
        patch_type="strategic",
    )
    assert patched["secrets"] == [{"name": "b"}]


@pytest.mark.parametrize(
    "patch",
    [
        _template({"containers": [{"image": "no-name"}]}),
        {"metadata": {"$patch": "explode"}},
        {"spec": {"$retainKeys": "template"}},
    ],
    ids=["no merge key", "unknown directive", "retainKeys not a list"],
)
def test_a_malformed_strategic_merge_patch_is_a_400(
    api: EmulatedApiServer, patch: dict[str, Any]
) -> None:
    stored = _deployment(api)
    with pytest.raises(kmock.KubernetesError) as refused:
        _patched(api, patch)
    assert refused.value.status == 400
    assert api.get(DEPLOYMENTS, "default", "d") == stored
