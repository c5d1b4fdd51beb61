"""Fuzzing the emulated API server's create and patch of SparkCheckpointJobs over HTTP: never
a 5xx, a rejection names the field in one line, and a rejected write changes nothing."""

import json
import math
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.hostile import mutated, values
from helpers.kube.emulator import (
    EmulatedApiServer,
    spark_checkpoint_api,
    validate_spark_checkpoint_job,
)

JOBS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs"
COLLECTION = "/apis/sparkcheckpoint.io/v1alpha1/namespaces/default/sparkcheckpointjobs"
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def api() -> Iterator[EmulatedApiServer]:
    with spark_checkpoint_api() as server:
        server.create(
            JOBS,
            {
                "apiVersion": "sparkcheckpoint.io/v1alpha1",
                "kind": "SparkCheckpointJob",
                "metadata": {"name": "patched", "namespace": "default"},
                "spec": {"application": {"module": "pipelines.orders"}},
            },
        )
        yield server


def send(
    api: EmulatedApiServer, method: str, path: str, body: bytes, content_type: str
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        api.url + path, data=body, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _json(document: object) -> bytes:
    # Python writes NaN and Infinity, which are not JSON: the server must refuse them.
    return json.dumps(document).encode()


def _names(api: EmulatedApiServer) -> set[str]:
    return {job["metadata"]["name"] for job in api.list(JOBS, "default")}


def _check_rejection(code: int, answer: dict[str, Any]) -> None:
    assert code in (400, 409, 422), (code, answer)
    assert answer["kind"] == "Status" and answer["code"] == code
    assert "\n" not in answer["message"] and len(answer["message"]) < 20_000
    if code == 422 and answer["details"].get("causes"):
        assert all(cause["field"] or cause["message"] for cause in answer["details"]["causes"])


def _is_stored_validly(stored: dict[str, Any]) -> bool:
    """The stored job passes validation again and holds no non-finite number."""
    validate_spark_checkpoint_job(stored, None)
    numbers = [stored]
    while numbers:
        value = numbers.pop()
        if isinstance(value, dict):
            numbers.extend(value.values())
        elif isinstance(value, list):
            numbers.extend(value)
        elif isinstance(value, float):
            assert math.isfinite(value)
    return True


@FUZZ
@given(case=mutated())
def test_create_answers_2xx_or_4xx_and_a_rejection_stores_nothing(
    api: EmulatedApiServer, case: tuple[Any, tuple[str | int, ...]]
) -> None:
    document, _ = case
    before = _names(api)

    code, answer = send(api, "POST", COLLECTION, _json(document), "application/json")

    if code == 201:
        name = answer["metadata"]["name"]
        stored = api.get(JOBS, "default", name)
        assert _is_stored_validly(stored)
        api.delete(JOBS, "default", name)
    else:
        _check_rejection(code, answer)
        assert _names(api) == before


@FUZZ
@given(
    patch=st.dictionaries(
        st.sampled_from(["spec", "metadata", "status", "kind", "apiVersion", "bogus"]),
        values,
        max_size=3,
    )
    | values,
    content_type=st.sampled_from(["application/merge-patch+json", "application/json-patch+json"]),
)
def test_patch_answers_2xx_or_4xx_and_a_rejection_changes_nothing(
    api: EmulatedApiServer, patch: Any, content_type: str
) -> None:
    before = api.get(JOBS, "default", "patched")

    code, answer = send(api, "PATCH", f"{COLLECTION}/patched", _json(patch), content_type)

    after = api.get(JOBS, "default", "patched")
    if code == 200:
        assert _is_stored_validly(after)
    else:
        _check_rejection(code, answer)
        assert after == before


@FUZZ
@given(
    spec=st.dictionaries(
        st.sampled_from(["checkpointing", "restartPolicy", "savepoints", "x"]), values
    ),
)
def test_spec_patches_through_json_patch_operations(api: EmulatedApiServer, spec: Any) -> None:
    operations = [{"op": "add", "path": f"/spec/{key}", "value": v} for key, v in spec.items()]
    before = api.get(JOBS, "default", "patched")

    code, answer = send(
        api,
        "PATCH",
        f"{COLLECTION}/patched",
        _json(operations),
        "application/json-patch+json",
    )

    if code != 200:
        _check_rejection(code, answer)
        assert api.get(JOBS, "default", "patched") == before


@settings(max_examples=50, deadline=None)
@given(body=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_get_a_4xx_not_a_5xx(api: EmulatedApiServer, body: bytes) -> None:
    before = _names(api)

    code, answer = send(api, "POST", COLLECTION, body, "application/json")

    _check_rejection(code, answer)
    assert _names(api) == before


_DIRECTIVES = st.sampled_from(
    [
        "$patch",
        "$retainKeys",
        "$setElementOrder/containers",
        "$setElementOrder/finalizers",
        "$deleteFromPrimitiveList/finalizers",
        "containers",
        "finalizers",
        "name",
        "image",
    ]
)
# Objects with strategic merge directives where kubectl puts them, and hostile values.
_STRATEGIC = st.recursive(
    values | st.sampled_from(["replace", "delete", "merge", "main"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_DIRECTIVES, children, max_size=3)
    ),
    max_leaves=12,
)


@FUZZ
@given(
    metadata=st.dictionaries(_DIRECTIVES, _STRATEGIC, max_size=2),
    pod_spec=st.dictionaries(_DIRECTIVES, _STRATEGIC, max_size=3),
)
def test_strategic_merge_patches_answer_2xx_or_4xx_and_a_rejection_changes_nothing(
    api: EmulatedApiServer, metadata: Any, pod_spec: Any
) -> None:
    deployments = "/apis/apps/v1/namespaces/default/deployments"
    name = f"strategic-{uuid.uuid4().hex[:8]}"  # one each: its finalizer may keep it
    body = {
        "metadata": {"name": name, "finalizers": ["a/x"]},
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "m:1"}]}}},
    }
    assert send(api, "POST", deployments, _json(body), "application/json")[0] == 201
    before = api.get("apps/v1/deployments", "default", name)
    patch = {"metadata": metadata, "spec": {"template": {"spec": pod_spec}}}

    code, answer = send(
        api,
        "PATCH",
        f"{deployments}/{name}",
        _json(patch),
        "application/strategic-merge-patch+json",
    )

    if code != 200:
        _check_rejection(code, answer)
        assert api.get("apps/v1/deployments", "default", name) == before
