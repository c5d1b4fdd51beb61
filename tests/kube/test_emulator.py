"""The API-server emulator behaves like a real API server wherever Kopf, lightkube (the test
kubelet's client) and the operator (the official client) depend on it; the last test runs
real Kopf against it."""

import asyncio
import contextlib
import datetime
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
import pytest_asyncio
from kubernetes.aio import config as kube_config
from kubernetes.aio.client import (
    ApiClient,
    Configuration,
    CustomObjectsApi,
    V1ObjectMeta,
    V1Pod,
    V1Secret,
)
from kubernetes.aio.client.exceptions import ApiException, ConflictException, NotFoundException
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import PatchType

from helpers.kube.emulator import (
    SPARK_CHECKPOINT_JOBS,
    ApiServerEmulator,
    EmulatedApiServer,
    serve,
    spark_checkpoint_api,
)
from spark_checkpoint_operator.kubernetes.core_api import CoreCalls

JOBS = "sparkcheckpoint.io/v1alpha1/sparkcheckpointjobs"
PODS = "v1/pods"
CONFIGMAPS = "v1/configmaps"
Job = create_namespaced_resource(
    "sparkcheckpoint.io", "v1alpha1", "SparkCheckpointJob", "sparkcheckpointjobs"
)
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
KOPF_LAST_HANDLED = "kopf.zalando.org/last-handled-configuration"


@pytest.fixture
def api() -> Iterator[EmulatedApiServer]:
    with spark_checkpoint_api(bookmark_interval=0.2) as server:
        yield server


@pytest.fixture
def kubeconfig(api: EmulatedApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest_asyncio.fixture
async def client(kubeconfig: Path) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig))
    yield client
    await client.close()


def job(name: str = "wc", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"application": {"module": "pipelines.word_count"}, **spec},
    }


def pod(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "driver", "image": "spark:4", "command": ["python"]}
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [container], **spec},
    }


def owned_by(owner: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }
    references = body["metadata"].setdefault("ownerReferences", [])
    references.append(reference)
    return body


def revision(api: EmulatedApiServer) -> int:
    return api.call(lambda emulator: emulator.revision)


def rejected(api: EmulatedApiServer, *codes: int) -> list[tuple[str, str, int]]:
    return api.call(
        lambda emulator: [
            (r.method, r.path, r.error.status)
            for r in emulator.rejections
            if r.error.status in codes
        ]
    )


def refused(call: Callable[[], object]) -> kmock.KubernetesError:
    with pytest.raises(kmock.KubernetesError) as caught:
        call()
    return caught.value


async def watch(
    api: EmulatedApiServer, path: str, *, count: int = 1000, **params: str
) -> list[dict[str, Any]]:
    """The events of a raw watch request: until `count` events, or the stream's end."""
    events: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(api.url + path, params={"watch": "true", **params}) as response,
    ):
        assert response.status == 200
        async for line in response.content:
            events.append(json.loads(line))
            if len(events) == count:
                break
    return events


async def eventually(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.05)


# --- create, versions, generation ---------------------------------------------------------


def test_create_fills_in_what_the_server_owns(api: EmulatedApiServer) -> None:
    before = revision(api)
    created = api.create(JOBS, {**job(), "status": {"phase": "Running"}})
    metadata = created["metadata"]

    assert uuid.UUID(metadata["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", metadata["creationTimestamp"])
    assert metadata["generation"] == 1
    assert metadata["resourceVersion"] == str(before + 1)
    assert "status" not in created  # the status subresource drops it on create
    assert created["spec"]["checkpointing"]["interval"] == "60s"  # CRD defaults are stored
    assert api.get(JOBS, "default", "wc") == created

    driver = api.create(PODS, {"metadata": {"generateName": "wc-driver-"}}, namespace="spark")
    assert re.fullmatch(r"wc-driver-[a-z0-9]{5}", driver["metadata"]["name"])
    assert driver["metadata"]["namespace"] == "spark"
    assert driver["status"] == {"phase": "Pending"}


def test_create_refuses_duplicates_and_bad_names(api: EmulatedApiServer) -> None:
    api.create(JOBS, job())

    duplicate = refused(lambda: api.create(JOBS, job()))
    assert (duplicate.status, duplicate.reason) == (409, "AlreadyExists")
    assert duplicate.message == 'sparkcheckpointjobs.sparkcheckpoint.io "wc" already exists'

    bad_name = refused(
        lambda: api.create(CONFIGMAPS, {"metadata": {"name": "Bad_Name"}}, "default")
    )
    assert (bad_name.status, bad_name.reason) == (422, "Invalid")
    nameless = refused(lambda: api.create(CONFIGMAPS, {"metadata": {}}, "default"))
    assert nameless.status == 422


@pytest.mark.asyncio
async def test_every_write_takes_the_next_version_of_one_global_counter(
    api: EmulatedApiServer, client: AsyncClient
) -> None:
    start = revision(api)
    versions = [
        api.create(JOBS, job())["metadata"]["resourceVersion"],
        api.create(PODS, pod("p"), "default")["metadata"]["resourceVersion"],
        api.patch(JOBS, "default", "wc", {"metadata": {"labels": {"a": "b"}}})["metadata"][
            "resourceVersion"
        ],
        api.patch(PODS, "default", "p", {"status": {"phase": "Running"}}, subresource="status")[
            "metadata"
        ]["resourceVersion"],
    ]
    assert versions == [str(start + n) for n in (1, 2, 3, 4)]

    pods = client.list(Pod, namespace="default")
    assert [p.metadata.name async for p in pods] == ["p"]
    assert pods.resourceVersion == str(start + 4)  # a list carries the latest version


def test_generation_counts_changes_outside_metadata_and_status(api: EmulatedApiServer) -> None:
    api.create(JOBS, job())

    labelled = api.patch(JOBS, "default", "wc", {"metadata": {"labels": {"team": "data"}}})
    status = api.patch(
        JOBS, "default", "wc", {"status": {"phase": "Running"}}, subresource="status"
    )
    spec = api.patch(JOBS, "default", "wc", {"spec": {"checkpointing": {"interval": "30s"}}})

    assert [labelled["metadata"]["generation"], status["metadata"]["generation"]] == [1, 1]
    assert spec["metadata"]["generation"] == 2


def test_a_write_that_changes_nothing_keeps_the_version(api: EmulatedApiServer) -> None:
    created = api.create(JOBS, job(checkpointing={"interval": "30s"}))

    same = api.patch(JOBS, "default", "wc", {"spec": {"checkpointing": {"interval": "30s"}}})

    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert revision(api) == int(created["metadata"]["resourceVersion"])


def test_the_status_subresource_separates_spec_and_status(api: EmulatedApiServer) -> None:
    api.create(JOBS, job())

    main = {"spec": {"checkpointing": {"interval": "30s"}}, "status": {"phase": "Failed"}}
    api.patch(JOBS, "default", "wc", main)
    status = {
        "metadata": {"labels": {"ignored": "yes"}},
        "spec": {"checkpointing": {"interval": "5m"}},
        "status": {"phase": "Running", "anything": {"goes": 1}},
    }
    api.patch(JOBS, "default", "wc", status, subresource="status")

    stored = api.get(JOBS, "default", "wc")
    assert stored["spec"]["checkpointing"]["interval"] == "30s"
    assert stored["status"] == {"phase": "Running", "anything": {"goes": 1}}  # not validated
    assert "labels" not in stored["metadata"]


# --- updates and patches ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_put_is_optimistic(client: AsyncClient) -> None:
    await client.create(Job(job()))
    fetched = await client.get(Job, "wc", namespace="default")

    fetched.spec["checkpointing"]["interval"] = "30s"
    replaced = await client.replace(fetched)
    assert replaced.spec["checkpointing"]["interval"] == "30s"
    assert replaced.metadata.generation == 2

    with pytest.raises(ApiError) as stale:
        await client.replace(fetched)  # still carries the old resourceVersion
    assert (stale.value.status.code, stale.value.status.reason) == (409, "Conflict")
    assert "the object has been modified" in str(stale.value.status.message)

    unversioned_body = job()
    unversioned_body["spec"]["checkpointing"] = {"interval": "45s"}
    with pytest.raises(ApiError) as unversioned:
        await client.replace(Job(unversioned_body))  # custom resources need one; pods not
    assert unversioned.value.status.code == 422


def test_a_merge_patch_carrying_an_old_version_conflicts(api: EmulatedApiServer) -> None:
    created = api.create(JOBS, job())
    api.patch(JOBS, "default", "wc", {"metadata": {"labels": {"a": "b"}}})

    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}}
    conflict = refused(lambda: api.patch(JOBS, "default", "wc", stale))

    assert (conflict.status, conflict.reason) == (409, "Conflict")


def test_merge_patches_follow_rfc_7386(api: EmulatedApiServer) -> None:
    api.create(JOBS, job(application={"module": "pipelines.wc", "arguments": ["a", "b"]}))

    patched = api.patch(
        JOBS,
        "default",
        "wc",
        {"spec": {"application": {"arguments": ["c"]}, "checkpointing": {"interval": None}}},
    )

    assert patched["spec"]["application"] == {"module": "pipelines.wc", "arguments": ["c"]}
    # null deletes the key, and the CRD's default comes back: a nullable field can only be
    # set to null by a JSON patch or a PUT.
    assert patched["spec"]["checkpointing"]["interval"] == "60s"
    nulled = api.patch(
        JOBS,
        "default",
        "wc",
        [{"op": "replace", "path": "/spec/checkpointing/interval", "value": None}],
        patch_type="json",
    )
    assert nulled["spec"]["checkpointing"]["interval"] is None


def test_a_json_patch_whose_test_fails_is_422_as_kopf_expects(api: EmulatedApiServer) -> None:
    created = api.create(JOBS, job())
    version = created["metadata"]["resourceVersion"]
    api.patch(JOBS, "default", "wc", {"metadata": {"labels": {"a": "b"}}})

    def add_finalizer(tested: str) -> dict[str, Any]:
        operations = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": tested},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
        ]
        return api.patch(JOBS, "default", "wc", operations, patch_type="json")

    failed = refused(lambda: add_finalizer(version))
    assert (failed.status, failed.reason) == (422, "Invalid")

    current = api.get(JOBS, "default", "wc")["metadata"]["resourceVersion"]
    assert add_finalizer(current)["metadata"]["finalizers"] == ["x/y"]


def test_strategic_merge_patches(api: EmulatedApiServer) -> None:
    api.create(PODS, pod("p", labels={"a": "1", "b": "2"}), "default")
    api.create(JOBS, job())

    patched = api.patch(
        PODS, "default", "p", {"metadata": {"labels": {"a": None}}}, patch_type="strategic"
    )
    assert patched["metadata"]["labels"] == {"b": "2"}  # test_emulator_documents: the rest

    unsupported = refused(
        lambda: api.patch(JOBS, "default", "wc", {"spec": {}}, patch_type="strategic")
    )
    assert (unsupported.status, unsupported.reason) == (415, "UnsupportedMediaType")


# --- selectors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("", ["a", "b", "c", "d"]),
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("tier in (front, back)", ["a", "b"]),
        ("tier notin (front)", ["b", "c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("app=web,tier!=back", ["a"]),
        ("app in (web,db),!tier", ["c"]),
    ],
)
def test_label_selectors(api: EmulatedApiServer, selector: str, names: list[str]) -> None:
    labels = {
        "a": {"app": "web", "tier": "front"},
        "b": {"app": "web", "tier": "back"},
        "c": {"app": "db"},
        "d": {},
    }
    for name, pod_labels in labels.items():
        api.create(PODS, pod(name, labels=pod_labels), "default")

    found = api.list(PODS, "default", labels=selector)

    assert [p["metadata"]["name"] for p in found] == names


def test_field_selectors(api: EmulatedApiServer) -> None:
    for name, namespace in [("a", "default"), ("b", "default"), ("c", "other")]:
        api.create(PODS, pod(name), namespace)
    api.patch(PODS, "default", "b", {"status": {"phase": "Running"}}, subresource="status")
    api.create(JOBS, job())

    def names(resource: str, fields: str) -> list[str]:
        return [p["metadata"]["name"] for p in api.list(resource, fields=fields)]

    assert names(PODS, "status.phase=Running") == ["b"]
    assert names(PODS, "status.phase!=Running,metadata.namespace=default") == ["a"]
    assert names(PODS, "metadata.name==c") == ["c"]
    assert names(JOBS, "metadata.name=wc") == ["wc"]
    unsupported = refused(lambda: names(JOBS, "status.phase=Running"))
    assert (unsupported.status, unsupported.message) == (
        400,
        "field label not supported: status.phase",
    )
    assert refused(lambda: api.list(PODS, labels="app in (web")).status == 400


@pytest.mark.asyncio
async def test_selectors_over_http(api: EmulatedApiServer, client: AsyncClient) -> None:
    for name, labels in [("a", {"app": "web"}), ("b", {"app": "db"})]:
        api.create(PODS, pod(name, labels=labels), "default")
    api.patch(PODS, "default", "b", {"status": {"phase": "Running"}}, subresource="status")

    by_label = [p.metadata.name async for p in client.list(Pod, labels={"app": "web"})]
    by_field = [p.metadata.name async for p in client.list(Pod, fields={"status.phase": "Running"})]

    assert (by_label, by_field) == (["a"], ["b"])


# --- watching -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_resumed_watch_gets_only_newer_events(
    api: EmulatedApiServer, client: AsyncClient
) -> None:
    api.create(JOBS, job())
    seen = api.patch(JOBS, "default", "wc", {"metadata": {"labels": {"n": "1"}}})
    api.create(JOBS, job("other"))
    later = [
        api.patch(JOBS, "default", "wc", {"metadata": {"labels": {"n": str(n)}}}) for n in (2, 3)
    ]

    events: list[tuple[str, str]] = []
    since = seen["metadata"]["resourceVersion"]
    async with contextlib.aclosing(client.watch(Job, resource_version=since)) as stream:
        async for kind, obj in stream:
            events.append((kind, obj.metadata.resourceVersion))
            if len(events) == 3:
                break

    assert events == [
        ("ADDED", str(int(seen["metadata"]["resourceVersion"]) + 1)),
        *[("MODIFIED", obj["metadata"]["resourceVersion"]) for obj in later],
    ]


@pytest.mark.asyncio
async def test_a_watch_without_a_version_starts_with_the_current_objects(
    api: EmulatedApiServer,
) -> None:
    api.create(JOBS, job("first"))
    api.create(JOBS, job("second"))
    api.patch(JOBS, "default", "first", {"metadata": {"labels": {"x": "y"}}})

    async def change_later() -> None:
        await asyncio.sleep(0.2)
        await asyncio.to_thread(api.delete, JOBS, "default", "second")

    changing = asyncio.create_task(change_later())
    events = await watch(api, "/apis/" + JOBS, count=3)
    await changing

    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "second"),  # oldest first, so resuming from the last one misses nothing
        ("ADDED", "first"),
        ("DELETED", "second"),
    ]


@pytest.mark.asyncio
async def test_a_watch_from_a_forgotten_version_gets_410(
    api: EmulatedApiServer, client: AsyncClient
) -> None:
    created = api.create(JOBS, job())
    api.patch(JOBS, "default", "wc", {"metadata": {"labels": {"a": "b"}}})
    api.call(lambda emulator: emulator.compact())
    since = created["metadata"]["resourceVersion"]

    events = await watch(api, "/apis/" + JOBS, resourceVersion=since)

    assert [e["type"] for e in events] == ["ERROR"]
    assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")
    with pytest.raises(ApiError) as gone:
        async for _ in client.watch(Job, namespace="default", resource_version=since):
            pass
    assert gone.value.status.code == 410


def test_the_event_log_is_bounded() -> None:
    with EmulatedApiServer(event_log_size=2) as api:
        created = api.create(CONFIGMAPS, {"metadata": {"name": "c"}}, "default")
        for n in range(3):
            api.patch(CONFIGMAPS, "default", "c", {"data": {"n": str(n)}})

        events = asyncio.run(
            watch(api, "/api/v1/configmaps", resourceVersion=created["metadata"]["resourceVersion"])
        )

    assert events[0]["object"]["code"] == 410


@pytest.mark.asyncio
async def test_a_watch_ends_after_timeout_seconds(api: EmulatedApiServer) -> None:
    started = time.monotonic()
    events = await watch(api, "/api/v1/pods", timeoutSeconds="1")

    assert events == []
    assert 1 <= time.monotonic() - started < 2


@pytest.mark.asyncio
async def test_bookmarks_carry_the_latest_version(api: EmulatedApiServer) -> None:
    api.create(JOBS, job())
    api.create(CONFIGMAPS, {"metadata": {"name": "unwatched"}}, "default")

    initial = await watch(
        api,
        "/apis/" + JOBS,
        count=3,
        allowWatchBookmarks="true",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
    )

    assert [e["type"] for e in initial] == ["ADDED", "BOOKMARK", "BOOKMARK"]
    end, idle = initial[1]["object"], initial[2]["object"]
    assert end["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert idle["kind"] == "SparkCheckpointJob"
    assert idle["metadata"]["resourceVersion"] == str(revision(api))


@pytest.mark.asyncio
async def test_a_watch_sees_objects_enter_and_leave_its_selection(api: EmulatedApiServer) -> None:
    async def change() -> None:
        await asyncio.sleep(0.2)
        for labels in [{"app": "db"}, {"app": "web"}, {"app": "web", "v": "2"}, {"app": "db"}]:
            patch = {"metadata": {"labels": labels}}
            await asyncio.to_thread(api.patch, PODS, "default", "p", patch, patch_type="strategic")
        await asyncio.to_thread(api.delete, PODS, "default", "p")

    api.create(PODS, pod("p", labels={"app": "db"}), "default")
    changing = asyncio.create_task(change())
    events = await watch(api, "/api/v1/namespaces/default/pods", count=3, labelSelector="app=web")
    await changing

    assert [(e["type"], e["object"]["metadata"]["labels"]) for e in events] == [
        ("ADDED", {"app": "web"}),
        ("MODIFIED", {"app": "web", "v": "2"}),
        ("DELETED", {"app": "db", "v": "2"}),  # the state that left the selection
    ]


@pytest.mark.asyncio
async def test_a_watch_over_a_websocket_sends_one_text_frame_per_event(
    api: EmulatedApiServer,
) -> None:
    """As the fabric8 client in Spark's driver asks for it; the stream's end closes it."""
    api.create(PODS, pod("a", labels={"app": "web"}), "default")
    api.create(PODS, pod("b"), "default")
    query = {"watch": "true", "labelSelector": "app=web", "timeoutSeconds": "1"}
    frames = []
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(api.url + "/api/v1/namespaces/default/pods", params=query) as socket,
    ):
        async for message in socket:
            frames.append(message)
    assert [m.type for m in frames] == [aiohttp.WSMsgType.TEXT]
    event = json.loads(frames[0].data)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "a")


@pytest.mark.asyncio
async def test_a_websocket_watch_the_client_closes_ends_at_once(api: EmulatedApiServer) -> None:
    """The client's close is answered (not left to its timeout), and the watch goes."""
    async with aiohttp.ClientSession() as session:
        socket = await session.ws_connect(
            api.url + "/api/v1/namespaces/default/pods", params={"watch": "true"}, heartbeat=0.2
        )
        await asyncio.sleep(0.5)  # pings answered meanwhile, or the heartbeat closes it
        assert not socket.closed
        started = time.monotonic()
        await socket.close()
    assert socket.close_code == aiohttp.WSCloseCode.OK
    assert time.monotonic() - started < 1
    # The watch has ended on the server: it no longer waits for changes.
    await eventually(lambda: api.call(lambda emulator: not emulator._watchers))


@pytest.mark.asyncio
async def test_a_refused_websocket_watch_is_answered_before_the_upgrade(
    api: EmulatedApiServer,
) -> None:
    query = {"watch": "true", "resourceVersion": "x"}
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(api.url + "/api/v1/pods", params=query)
    assert refused.value.status == 400


# --- deletion -----------------------------------------------------------------------------


def test_finalizers_hold_an_object_until_the_last_is_removed(api: EmulatedApiServer) -> None:
    created = api.create(
        JOBS, {**job(), "metadata": {"name": "wc", "finalizers": ["a/b", "c/d"]}}, "default"
    )

    marked = api.delete(JOBS, "default", "wc")
    again = api.delete(JOBS, "default", "wc")

    assert marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 0
    assert marked["metadata"]["generation"] == 2  # as a real API server does
    assert int(marked["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert again == marked
    added = refused(lambda: api.patch(JOBS, "default", "wc", {"metadata": {"finalizers": ["x/y"]}}))
    assert added.status == 422

    api.patch(JOBS, "default", "wc", {"metadata": {"finalizers": ["c/d"]}})
    assert api.get(JOBS, "default", "wc")["metadata"]["finalizers"] == ["c/d"]
    gone = api.patch(JOBS, "default", "wc", {"metadata": {"finalizers": []}})
    assert gone["metadata"]["finalizers"] == []
    assert refused(lambda: api.get(JOBS, "default", "wc")).status == 404


def test_deleting_an_owner_deletes_its_dependents(api: EmulatedApiServer) -> None:
    owner = api.create(
        JOBS, {**job(), "metadata": {"name": "wc", "finalizers": ["a/b"]}}, "default"
    )
    config = api.create(CONFIGMAPS, owned_by(owner, {"metadata": {"name": "conf"}}), "default")
    api.create("v1/secrets", owned_by(config, {"metadata": {"name": "deep"}}), "default")
    api.create(PODS, owned_by(owner, pod("unbound")), "default")
    api.create(PODS, owned_by(owner, pod("bound", nodeName="node-1")), "default")
    other_owner = api.create(CONFIGMAPS, {"metadata": {"name": "other"}}, "default")
    shared = owned_by(other_owner, owned_by(owner, {"metadata": {"name": "shared"}}))
    api.create(CONFIGMAPS, shared, "default")

    api.delete(JOBS, "default", "wc")
    assert len(api.list(CONFIGMAPS, "default")) == 3  # held by the owner's finalizer
    api.patch(JOBS, "default", "wc", {"metadata": {"finalizers": None}})

    assert [c["metadata"]["name"] for c in api.list(CONFIGMAPS, "default")] == ["other", "shared"]
    assert api.list("v1/secrets", "default") == []
    (bound,) = api.list(PODS, "default")  # a kubelet still has to stop it
    assert bound["metadata"]["name"] == "bound"
    assert bound["metadata"]["deletionGracePeriodSeconds"] == 30


def test_a_pod_on_a_node_terminates_gracefully(api: EmulatedApiServer) -> None:
    api.create(PODS, pod("unbound"), "default")
    api.create(PODS, pod("bound", nodeName="n", terminationGracePeriodSeconds=5), "default")
    api.create(PODS, pod("default-grace", nodeName="n"), "default")

    api.delete(PODS, "default", "unbound")
    terminating = api.delete(PODS, "default", "bound")
    defaulted = api.delete(PODS, "default", "default-grace", grace_period_seconds=7)
    again = api.delete(PODS, "default", "bound")

    assert [p["metadata"]["name"] for p in api.list(PODS)] == ["bound", "default-grace"]
    deadline = datetime.datetime.fromisoformat(terminating["metadata"]["deletionTimestamp"])
    remaining = deadline - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(seconds=3) < remaining <= datetime.timedelta(seconds=5)
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 5
    assert defaulted["metadata"]["deletionGracePeriodSeconds"] == 7
    assert again == terminating

    api.delete(PODS, "default", "bound", grace_period_seconds=0)  # the kubelet is done
    assert [p["metadata"]["name"] for p in api.list(PODS)] == ["default-grace"]


def test_a_pod_with_finalizers_outlives_its_kubelet(api: EmulatedApiServer) -> None:
    api.create(
        PODS, {**pod("p", nodeName="n"), "metadata": {"name": "p", "finalizers": ["a/b"]}}, "x"
    )

    api.delete(PODS, "x", "p")
    finished = api.delete(PODS, "x", "p", grace_period_seconds=0)
    assert finished["metadata"]["deletionGracePeriodSeconds"] == 0

    api.patch(PODS, "x", "p", {"metadata": {"finalizers": None}})
    assert api.list(PODS, "x") == []


def test_a_deleted_namespace_refuses_creates_and_goes_once_empty(api: EmulatedApiServer) -> None:
    namespaces = "v1/namespaces"
    api.create(namespaces, {"metadata": {"name": "team"}})
    api.create(JOBS, {**job(), "metadata": {"name": "wc", "finalizers": ["a/b"]}}, "team")
    api.create(CONFIGMAPS, {"metadata": {"name": "conf"}}, "team")
    api.create(PODS, pod("bound", nodeName="n"), "team")
    api.create(CONFIGMAPS, {"metadata": {"name": "elsewhere"}}, "default")

    terminating = api.delete(namespaces, None, "team")
    again = refused(lambda: api.delete(namespaces, None, "team"))

    assert terminating["status"]["phase"] == "Terminating"
    assert terminating["spec"]["finalizers"] == ["kubernetes"]
    assert again.status == 409
    assert refused(lambda: api.delete(namespaces, None, "default")).status == 403
    assert terminating["metadata"]["deletionTimestamp"]
    assert api.list(CONFIGMAPS, "team") == []
    assert api.get(JOBS, "team", "wc")["metadata"]["deletionTimestamp"]  # held
    assert api.get(PODS, "team", "bound")["metadata"]["deletionGracePeriodSeconds"] == 30
    assert len(api.list(CONFIGMAPS, "default")) == 1
    creating = refused(lambda: api.create(CONFIGMAPS, {"metadata": {"name": "new"}}, "team"))
    assert creating.status == 403
    assert creating.message == (
        'configmaps "new" is forbidden: unable to create new content in namespace team '
        "because it is being terminated"
    )
    assert creating.details["causes"] == [
        {
            "type": "NamespaceTerminating",
            "message": "namespace team is being terminated",
            "field": "metadata.namespace",
        }
    ]
    generated = refused(
        lambda: api.create(CONFIGMAPS, {"metadata": {"generateName": "g-"}}, "team")
    )
    assert generated.message.startswith('configmaps "g-" is forbidden: unable to create')
    api.patch(JOBS, "team", "wc", {"metadata": {"annotations": {"updates": "allowed"}}})

    api.patch(JOBS, "team", "wc", {"metadata": {"finalizers": None}})
    assert api.get(namespaces, None, "team")["status"]["phase"] == "Terminating"
    api.delete(PODS, "team", "bound", grace_period_seconds=0)  # the kubelet is done
    assert refused(lambda: api.get(namespaces, None, "team")).status == 404
    api.create(namespaces, {"metadata": {"name": "team"}})
    api.create(CONFIGMAPS, {"metadata": {"name": "new"}}, "team")


@pytest.mark.asyncio
async def test_pods_are_bound_through_the_binding_subresource(api: EmulatedApiServer) -> None:
    api.create(PODS, pod("p"), "default")
    binding = {"apiVersion": "v1", "kind": "Binding", "target": {"kind": "Node", "name": "n"}}
    url = api.url + "/api/v1/namespaces/default/pods/p/binding"

    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=binding) as first:
            assert first.status == 201
        async with session.post(url, json=binding) as second:
            assert second.status == 409

    assert api.get(PODS, "default", "p")["spec"]["nodeName"] == "n"
    changed = {"spec": {"containers": [{"name": "driver", "command": ["bash"]}]}}
    assert refused(lambda: api.patch(PODS, "default", "p", changed)).status == 422
    image = {
        "spec": {"containers": [{"name": "driver", "image": "spark:5", "command": ["python"]}]}
    }
    assert api.patch(PODS, "default", "p", image)["spec"]["containers"][0]["image"] == "spark:5"


# --- custom resources, discovery, clients -------------------------------------------------


@pytest.mark.asyncio
async def test_custom_resources_are_validated_like_the_api_server(client: AsyncClient) -> None:
    invalid = job(checkpointing={"interval": "10s", "minPause": "1m", "retained": 0}, bogus=1)

    with pytest.raises(ApiError) as caught:
        await client.create(Job(invalid))

    status = caught.value.status
    assert (status.code, status.reason) == (422, "Invalid")
    assert status.message.startswith('SparkCheckpointJob.sparkcheckpoint.io "wc" is invalid: [')
    assert status.details is not None and status.details.causes is not None
    # spec.bogus is pruned, not an error: lightkube sends no fieldValidation (Warn).
    assert {(c.field, c.message) for c in status.details.causes} == {
        ("spec.checkpointing.minPause", "must not exceed spec.checkpointing.interval"),
        ("spec.checkpointing.retained", "0 is less than the minimum of 1"),
    }


@pytest.mark.asyncio
async def test_discovery_serves_what_kopf_waits_for(api: EmulatedApiServer) -> None:
    async with aiohttp.ClientSession(api.url) as session:
        async with session.get("/apis") as response:
            groups = {g["name"] for g in (await response.json())["groups"]}
        async with session.get("/apis/sparkcheckpoint.io/v1alpha1") as response:
            custom = {r["name"]: r for r in (await response.json())["resources"]}
        async with session.get("/api/v1") as response:
            core = {r["name"] for r in (await response.json())["resources"]}

    assert {"sparkcheckpoint.io", "events.k8s.io", "apiextensions.k8s.io"} <= groups
    assert set(custom) == {
        "sparkcheckpointjobs",
        "sparkcheckpointjobs/status",
        "sparkcheckpointsnapshots",
        "sparkcheckpointsnapshots/status",
    }
    jobs = custom["sparkcheckpointjobs"]
    assert (jobs["kind"], jobs["namespaced"], jobs["shortNames"]) == (
        "SparkCheckpointJob",
        True,
        ["scj"],
    )
    assert {"watch", "patch", "update"} <= set(jobs["verbs"])
    assert {"namespaces", "pods", "pods/status", "secrets", "events"} <= core


@pytest.mark.asyncio
async def test_namespaces_and_crds_through_the_api(
    api: EmulatedApiServer, client: AsyncClient
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }
    await client.create(Namespace(metadata=ObjectMeta(name="spark")))
    api.create("apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    created = api.create("example.com/v1/widgets", {**widget, "spec": {"a": 1}})
    names = [n.metadata.name async for n in client.list(Namespace)]

    assert created["kind"] == "Widget"
    assert "namespace" not in created["metadata"]
    assert names == ["default", "spark"]
    assert (await client.get(Namespace, "spark")).status.phase == "Active"


@pytest.mark.asyncio
async def test_kmock_reactions_still_come_first(
    api: EmulatedApiServer, client: AsyncClient
) -> None:
    api.create(JOBS, job())

    def inject(emulator: ApiServerEmulator) -> None:
        failure = kmock.KubernetesError(503, "ServiceUnavailable", "injected", {})
        emulator["patch", kmock.resource(SPARK_CHECKPOINT_JOBS)] << failure

    api.call(inject)
    with pytest.raises(ApiError) as caught:
        await client.patch(Job, "wc", {"spec": {}}, namespace="default", patch_type=PatchType.MERGE)

    assert caught.value.status.code == 503
    assert api.get(JOBS, "default", "wc")["metadata"]["generation"] == 1


def test_kopfs_own_kubeconfig_login_accepts_the_kubeconfig(
    api: EmulatedApiServer, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))

    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())

    assert info is not None
    assert (info.server, info.token, info.default_namespace) == (api.url, None, "default")


@pytest.mark.asyncio
async def test_serve_runs_in_the_callers_loop() -> None:
    emulator = ApiServerEmulator()
    async with (
        serve(emulator) as url,
        aiohttp.ClientSession() as session,
        session.get(url + "/api/v1/namespaces/default") as response,
    ):
        body = await response.json()
        assert (response.status, response.content_type) == (200, "application/json")

    assert body["metadata"]["name"] == "default"


# --- input handling: a real API server's verdicts --------------------------------------

JOBS_PATH = "/apis/sparkcheckpoint.io/v1alpha1/namespaces/default/sparkcheckpointjobs"
PODS_PATH = "/api/v1/namespaces/default/pods"


async def send(
    api: EmulatedApiServer,
    method: str,
    path: str,
    body: str | dict[str, Any],
    *,
    content_type: str = "application/json",
    **params: str,
) -> tuple[int, dict[str, Any], str]:
    """A raw request: the status code, the JSON answer and the Warning header."""
    data = body if isinstance(body, str) else json.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            api.url + path,
            data=data.encode(),
            params=params,
            headers={"Content-Type": content_type},
        ) as response,
    ):
        return response.status, await response.json(), response.headers.get("Warning", "")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("path", "change", "code", "phrase"),
    [
        (JOBS_PATH, {"apiVersion": "sparkcheckpoint.io/v1"}, 400, "does not match the expected"),
        (JOBS_PATH, {"apiVersion": None}, 400, "does not match the expected"),
        (JOBS_PATH, {"kind": None}, 400, "Object 'Kind' is missing"),
        (JOBS_PATH, {"kind": "Pod"}, 422, "kind: Invalid value"),
        (PODS_PATH, {"apiVersion": "apps/v1", "kind": "Pod"}, 400, "does not match the expected"),
        (PODS_PATH, {"apiVersion": "v1", "kind": "Secret"}, 400, "cannot be handled as a Pod"),
    ],
)
async def test_a_body_of_another_type_is_refused(
    api: EmulatedApiServer, path: str, change: dict[str, Any], code: int, phrase: str
) -> None:
    body = {**(job() if path == JOBS_PATH else pod("p")), **change}
    body = {key: value for key, value in body.items() if value is not None}

    status, answer, _ = await send(api, "POST", path, body)

    assert (status, answer["code"]) == (code, code)
    assert phrase in answer["message"], answer["message"]
    assert api.list(JOBS, "default") == [] and api.list(PODS, "default") == []


@pytest.mark.asyncio
async def test_a_built_in_body_without_its_type_takes_the_endpoints(api: EmulatedApiServer) -> None:
    status, answer, _ = await send(api, "POST", PODS_PATH, pod("p"))

    assert status == 201
    assert (answer["apiVersion"], answer["kind"]) == ("v1", "Pod")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("metadata", "phrase"),
    [
        (5, "cannot unmarshal number into Go struct field SparkCheckpointJob.metadata"),
        ({"name": 5}, "ObjectMeta.metadata.name of type string"),
        ({"name": "wc", "labels": {"a": 1}}, "ObjectMeta.metadata.labels"),
        ({"name": "wc", "finalizers": "x"}, "ObjectMeta.metadata.finalizers"),
        ({"name": "wc", "generation": 1.5}, "ObjectMeta.metadata.generation"),
    ],
)
async def test_metadata_that_does_not_decode_is_a_400(
    api: EmulatedApiServer, metadata: object, phrase: str
) -> None:
    status, answer, _ = await send(api, "POST", JOBS_PATH, {**job(), "metadata": metadata})

    assert status == 400 and phrase in answer["message"], answer
    assert api.list(JOBS, "default") == []


@pytest.mark.asyncio
async def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(
    api: EmulatedApiServer,
) -> None:
    body = job(checkpointing={"intervall": "10s"})
    body["metadata"]["bogus"] = 1
    expected = {"metadata.bogus", "spec.checkpointing.intervall"}

    status, answer, _ = await send(api, "POST", JOBS_PATH, body, fieldValidation="Strict")
    assert status == 400
    assert answer["message"].startswith(
        'SparkCheckpointJob in version "v1alpha1" cannot be handled as a SparkCheckpointJob:'
        " strict decoding error: "
    )
    assert set(re.findall(r'unknown field "([^"]+)"', answer["message"])) == expected
    with pytest.raises(kmock.KubernetesError) as strict:  # the helpers act as kubectl does
        api.create(JOBS, body)
    assert strict.value.status == 400

    status, created, warning = await send(api, "POST", JOBS_PATH, body)  # Warn, the default
    assert status == 201
    assert set(re.findall(r'unknown field \\"([^"\\]+)\\"', warning)) == expected, warning
    assert "bogus" not in created["metadata"]
    assert "intervall" not in created["spec"]["checkpointing"]

    body["metadata"]["name"] = "quiet"
    status, _, warning = await send(api, "POST", JOBS_PATH, body, fieldValidation="Ignore")
    assert (status, warning) == (201, "")


@pytest.mark.asyncio
async def test_the_status_is_validated_on_its_subresource(api: EmulatedApiServer) -> None:
    api.create(JOBS, job())
    status_path = f"{JOBS_PATH}/wc/status"
    merge = "application/merge-patch+json"

    invalid, answer, _ = await send(
        api, "PATCH", status_path, {"status": {"phase": "Bogus"}}, content_type=merge
    )
    valid, _, _ = await send(
        api, "PATCH", status_path, {"status": {"phase": "Running", "x": 1}}, content_type=merge
    )

    assert invalid == 422 and "status.phase" in answer["message"], answer
    assert valid == 200
    assert api.get(JOBS, "default", "wc")["status"] == {"phase": "Running", "x": 1}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ('{"a":' * 50_000 + "1" + "}" * 50_000, "exceeded max depth"),
        ('{"a":' * 101 + "1" + "}" * 101, "exceeded max depth"),
        ('{"apiVersion": "v1", "spec": {"x": 1e999}}', "out of range"),
        ('{"apiVersion": "v1", "spec": {"x": NaN}}', "invalid"),
        ('{"apiVersion": "v1",', "invalid JSON"),
        ("\udcff", "invalid JSON"),
    ],
    ids=["deep-50000", "deep-101", "1e999", "NaN", "truncated", "not-utf8"],
)
async def test_a_body_that_is_not_acceptable_json_is_a_400(
    api: EmulatedApiServer, text: str, phrase: str
) -> None:
    data = text.encode("utf-8", errors="surrogateescape").decode("latin-1")

    status, answer, _ = await send(api, "POST", JOBS_PATH, data)

    assert status == 400 and phrase in answer["message"], answer


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("metadata.name", "probe\n", "metadata.name"),
        ("spec.checkpointing.interval", "5s\n", "spec.checkpointing.interval"),
        ("spec.checkpointing.storage", "/data\n", "spec.checkpointing.storage"),
        ("spec.checkpointing.timeout", "2562048h", "spec.checkpointing.timeout"),
        ("spec.checkpointTriggerNonce", 1 << 63, "spec.checkpointTriggerNonce"),
        ("spec.checkpointing.retained", 2.5, "spec.checkpointing.retained"),
        ("metadata.name", "a" * 64, "metadata.name"),
    ],
)
async def test_values_a_real_api_server_refuses_are_a_422_naming_the_field(
    api: EmulatedApiServer, field: str, value: object, problem: str
) -> None:
    body = job()
    *parents, last = field.split(".")
    node = body
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = value

    status, answer, _ = await send(api, "POST", JOBS_PATH, body)

    assert status == 422, answer
    assert [cause["field"] for cause in answer["details"]["causes"]] == [problem]
    assert api.list(JOBS, "default") == []


@pytest.mark.asyncio
@pytest.mark.parametrize("path", [JOBS_PATH, PODS_PATH])
async def test_invalid_labels_are_a_422_on_every_object(api: EmulatedApiServer, path: str) -> None:
    body = job() if path == JOBS_PATH else pod("p")
    body["metadata"]["labels"] = {"team": "pay ments", "Bad Key": "x"}

    status, answer, _ = await send(api, "POST", path, body)

    assert status == 422, answer
    assert {cause["field"] for cause in answer["details"]["causes"]} == {"metadata.labels"}
    assert api.list(JOBS, "default") == [] and api.list(PODS, "default") == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"finalizers": ["Not Valid!"]}, "metadata.finalizers"),
        ({"annotations": {"note": "x" * (256 * 1024)}}, "metadata.annotations"),
    ],
)
async def test_finalizers_and_annotations_are_checked_as_a_real_api_server_does(
    api: EmulatedApiServer, metadata: dict[str, object], field: str
) -> None:
    """A hostile-input tester found the emulator taking both (a real API server: 422)."""
    body = job()
    body["metadata"] |= metadata

    status, answer, _ = await send(api, "POST", JOBS_PATH, body)

    assert status == 422, answer
    assert [cause["field"] for cause in answer["details"]["causes"]] == [field]
    body["metadata"] |= {"finalizers": ["sparkcheckpoint.io/finalizer"], "annotations": {}}
    assert (await send(api, "POST", JOBS_PATH, body))[0] == 201


@pytest.mark.asyncio
async def test_owner_references_are_checked_as_a_real_api_server_does(
    api: EmulatedApiServer,
) -> None:
    """The emulator took an owner reference without a uid (a real API server: 422), so a
    dependent the operator made that way looked created (and was never collected)."""
    owner = {"apiVersion": "sparkcheckpoint.io/v1alpha1", "kind": "SparkCheckpointJob"}
    body = job()
    body["metadata"]["ownerReferences"] = [owner | {"name": "a"}]

    status, answer, _ = await send(api, "POST", JOBS_PATH, body)

    assert status == 422, answer
    assert [(c["field"], c["message"]) for c in answer["details"]["causes"]] == [
        ("metadata.ownerReferences.uid", 'Invalid value: "": must not be empty')
    ]
    body["metadata"]["ownerReferences"] = [
        owner | {"name": "a", "uid": "1", "controller": True},
        owner | {"name": "b", "uid": "2", "controller": True},
    ]
    status, answer, _ = await send(api, "POST", JOBS_PATH, body)
    assert status == 422, answer
    assert answer["details"]["causes"][0]["message"].endswith(
        'Only one reference can have Controller set to true. Found "true" in references for '
        "SparkCheckpointJob/a and SparkCheckpointJob/b"
    )
    body["metadata"]["ownerReferences"].pop()
    assert (await send(api, "POST", JOBS_PATH, body))[0] == 201


@pytest.mark.asyncio
async def test_a_pod_whose_container_mounts_no_volume_of_the_pod_is_a_422(
    api: EmulatedApiServer,
) -> None:
    """A security reviewer found the emulator taking it (a real API server: 422), so a
    cleanup pod that mounted a driver-only volume looked created."""
    container = {"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [container]}}

    status, answer, _ = await send(api, "POST", "/api/v1/namespaces/default/pods", pod)

    assert status == 422, answer
    assert answer["message"] == (
        'Pod "p" is invalid: spec.containers[0].volumeMounts[0].name: Not found: "v"'
    )
    pod["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    container["volumeMounts"].append({"mountPath": "/w"})
    status, answer, _ = await send(api, "POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 422, answer  # not a 500 (a reviewer's)
    assert answer["message"].endswith(
        "[spec.containers[0].volumeMounts[1].name: Required value, "
        'spec.containers[0].volumeMounts[1].name: Not found: ""]'
    )
    container["volumeMounts"].pop()
    assert (await send(api, "POST", "/api/v1/namespaces/default/pods", pod))[0] == 201


@pytest.mark.asyncio
async def test_an_integral_float_is_stored_as_an_integer(api: EmulatedApiServer) -> None:
    status, created, _ = await send(api, "POST", JOBS_PATH, job(checkpointing={"retained": 2.0}))

    assert status == 201
    retained = api.get(JOBS, "default", "wc")["spec"]["checkpointing"]["retained"]
    assert retained == created["spec"]["checkpointing"]["retained"] == 2
    assert type(retained) is int


def test_a_generated_name_fits_a_label_value(api: EmulatedApiServer) -> None:
    body = job()
    body["metadata"] = {"generateName": "j" * 70}

    created = api.create(JOBS, body, namespace="default")

    assert len(created["metadata"]["name"]) == 63


@pytest.mark.asyncio
async def test_a_patch_cannot_change_the_type_or_break_the_metadata(
    api: EmulatedApiServer,
) -> None:
    api.create(JOBS, job())
    merge = "application/merge-patch+json"

    kind, kind_answer, _ = await send(
        api, "PATCH", f"{JOBS_PATH}/wc", {"kind": "Pod"}, content_type=merge
    )
    metadata, _, _ = await send(
        api, "PATCH", f"{JOBS_PATH}/wc", {"metadata": 5}, content_type=merge
    )
    replaced, _, _ = await send(
        api,
        "PATCH",
        f"{JOBS_PATH}/wc",
        [{"op": "replace", "path": "", "value": 5}],
        content_type="application/json-patch+json",
    )

    assert (kind, metadata, replaced) == (422, 400, 400), kind_answer
    assert api.get(JOBS, "default", "wc")["metadata"]["generation"] == 1


# --- real Kopf ----------------------------------------------------------------------------


def tiny_operator(calls: list[str]) -> kopf.OperatorRegistry:
    """Kopf handlers that record their calls: a finalizer (from the delete handler), a status
    patch, and an update handler for one field."""
    registry = kopf.OperatorRegistry()
    resource = ("sparkcheckpoint.io", "v1alpha1", "sparkcheckpointjobs")
    kopf.on.login(registry=registry)(kopf.login_with_kubeconfig)

    @kopf.on.create(*resource, registry=registry)
    def created(patch: kopf.Patch, **_: Any) -> None:
        calls.append("create")
        patch.status["phase"] = "Pending"

    @kopf.on.update(*resource, field="spec.checkpointing.interval", registry=registry)
    def interval_changed(new: str, **_: Any) -> None:
        calls.append(f"update {new}")

    @kopf.on.delete(*resource, registry=registry)
    def deleted(**_: Any) -> None:
        calls.append("delete")

    return registry


def kopf_handled(api: EmulatedApiServer, interval: str) -> bool:
    """Whether Kopf has finished with the job's `interval` (its finalizer is on, too)."""
    metadata = api.get(JOBS, "default", "wc")["metadata"]
    last = json.loads(metadata.get("annotations", {}).get(KOPF_LAST_HANDLED, "{}"))
    done = last.get("spec", {}).get("checkpointing", {}).get("interval") == interval
    return done and KOPF_FINALIZER in metadata.get("finalizers", [])


def forget_history(emulator: ApiServerEmulator) -> None:
    """A write Kopf has not seen, then compaction: resuming its watch gets 410 Gone."""
    emulator.create_object(CONFIGMAPS, {"metadata": {"name": "unseen"}}, "default")
    emulator.compact()
    emulator.stop_watches()


@pytest.mark.asyncio
async def test_kopf_runs_a_job_through_its_life_without_conflicts(
    api: EmulatedApiServer, kubeconfig: Path, client: AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each change reaches the handlers once, with no 409/422, although Kopf's watches are
    cut, time out every second, and once must list again after 410 Gone."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    calls: list[str] = []
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 1
    stop, ready = asyncio.Event(), asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            registry=tiny_operator(calls),
            settings=settings,
            standalone=True,
            clusterwide=True,
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        await client.create(Job(job()))
        await eventually(lambda: kopf_handled(api, "60s"))
        # Kopf patches the main object, then the status subresource: a second request.
        await eventually(
            lambda: api.get(JOBS, "default", "wc").get("status") == {"phase": "Pending"}
        )

        for interval in ("20s", "30s", "45s"):
            patch = {"spec": {"checkpointing": {"interval": interval}}}
            await client.patch(Job, "wc", patch, namespace="default", patch_type=PatchType.MERGE)
            await eventually(lambda interval=interval: kopf_handled(api, interval))
            api.call(lambda emulator: emulator.stop_watches())
        labels = {"metadata": {"labels": {"team": "data"}}}  # no handler cares about labels
        await client.patch(Job, "wc", labels, namespace="default", patch_type=PatchType.MERGE)
        api.call(forget_history)
        patch = {"spec": {"checkpointing": {"interval": "50s"}}}
        await client.patch(Job, "wc", patch, namespace="default", patch_type=PatchType.MERGE)
        await eventually(lambda: kopf_handled(api, "50s"))

        await client.delete(Job, "wc", namespace="default")
        await eventually(lambda: not api.list(JOBS))
    finally:
        stop.set()
        await asyncio.wait_for(operator, 10)

    assert calls == ["create", "update 20s", "update 30s", "update 45s", "update 50s", "delete"]
    assert rejected(api, 409, 422) == []
    requests = api.call(
        lambda emulator: [r for r in emulator if r.resource == SPARK_CHECKPOINT_JOBS]
    )
    resumed = [
        r for r in requests if r.action == kmock.action.WATCH and r.params.get("resourceVersion")
    ]
    lists = [r for r in requests if r.action == kmock.action.LIST]
    assert len(resumed) >= 4  # every reconnect resumed from the last version it had seen
    assert len(lists) == 2  # at the start, and once more after 410 Gone


@pytest.mark.asyncio
async def test_the_operators_client_gets_the_answers_of_a_real_api_server(
    api: EmulatedApiServer, kubeconfig: Path
) -> None:
    """Each kind of call the operator makes through the official client (kubernetes.aio,
    typed models; pods and Secrets through `CoreCalls`), with the answers and errors a real
    API server gives."""
    configuration = Configuration()
    await kube_config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    async with ApiClient(configuration) as client:
        core = CoreCalls(client)
        jobs = CustomObjectsApi(client)
        stored_job = api.create(JOBS, job("orders"), namespace="default")
        labels = {"sparkcheckpoint.io/job": "orders", "sparkcheckpoint.io/component": "driver"}
        driver = V1Pod.from_dict(pod("orders-driver-1", labels=labels))
        assert driver is not None

        created = await core.create_namespaced_pod("default", driver)
        listed = await core.list_namespaced_pod(
            "default",
            label_selector="sparkcheckpoint.io/job=orders,"
            "sparkcheckpoint.io/component in (driver,cleanup)",
        )
        await core.delete_namespaced_pod("orders-driver-1", "default")

        assert created.metadata is not None and created.metadata.uid
        assert [p.metadata.name for p in listed.items if p.metadata] == ["orders-driver-1"]
        with pytest.raises(NotFoundException):
            await core.read_namespaced_pod("orders-driver-1", "default")

        secret = V1Secret(
            metadata=V1ObjectMeta(name="orders-agent-token"),
            string_data={"token": "first"},
        )
        await core.create_namespaced_secret("default", secret)
        with pytest.raises(ConflictException):
            await core.create_namespaced_secret("default", secret)
        await core.patch_namespaced_secret(
            "orders-agent-token",
            "default",
            {"stringData": {"token": "second"}},
            content_type="application/strategic-merge-patch+json",
        )
        stored_secret = await core.read_namespaced_secret("orders-agent-token", "default")
        assert stored_secret.data == {"token": "c2Vjb25k"}  # base64 of "second"

        name = stored_job["metadata"]["name"]
        group, version = "sparkcheckpoint.io", "v1alpha1"
        patch = {"status": {"phase": "Running"}}
        await jobs.patch_namespaced_custom_object_status(
            group, version, "default", "sparkcheckpointjobs", name, patch,
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        stored = await jobs.get_namespaced_custom_object(
            group, version, "default", "sparkcheckpointjobs", name
        )
        assert isinstance(stored, dict) and stored["status"]["phase"] == "Running"
        with pytest.raises(ApiException) as refused:
            await jobs.patch_namespaced_custom_object_status(
                group, version, "default", "sparkcheckpointjobs", name, patch,
                _content_type="application/strategic-merge-patch+json",
            )  # fmt: skip
        assert refused.value.status == 415
        with pytest.raises(NotFoundException):
            await jobs.patch_namespaced_custom_object_status(
                group, version, "default", "sparkcheckpointjobs", "gone", patch,
                _content_type="application/merge-patch+json",
            )  # fmt: skip


@pytest.mark.asyncio
async def test_a_dry_run_create_is_checked_and_answered_and_stores_nothing(
    api: EmulatedApiServer,
) -> None:
    """The operator asks whether the API server takes the next driver's pod before it stops
    the running one for an upgrade."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wc-driver-2"}}
    before = revision(api)

    status, answer, _ = await send(api, "POST", PODS_PATH, pod, dryRun="All")
    assert status == 201
    assert answer["metadata"]["name"] == "wc-driver-2"
    assert answer["status"] == {"phase": "Pending"}
    assert "resourceVersion" not in answer["metadata"]
    assert api.list(PODS, "default") == [] and revision(api) == before

    bad = job(checkpointing={"interval": "soon"})
    invalid, answer, _ = await send(api, "POST", JOBS_PATH, bad, dryRun="All")
    assert invalid == 422 and "spec.checkpointing.interval" in answer["message"], answer
    api.create(PODS, pod, namespace="default")
    conflict, _, _ = await send(api, "POST", PODS_PATH, pod, dryRun="All")
    assert conflict == 409
    unsupported, answer, _ = await send(api, "POST", PODS_PATH, pod, dryRun="Some")
    assert unsupported == 422
    assert answer["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: []string{"Some"}: '
        'supported values: "All"'
    )
    elsewhere, answer, _ = await send(api, "DELETE", f"{PODS_PATH}/wc-driver-2", {}, dryRun="All")
    assert elsewhere == 400 and "on create only" in answer["message"]
    binding = {"apiVersion": "v1", "kind": "Binding", "target": {"kind": "Node", "name": "n"}}
    bound, answer, _ = await send(
        api, "POST", f"{PODS_PATH}/wc-driver-2/binding", binding, dryRun="All"
    )
    assert bound == 400 and "on create only" in answer["message"]
    assert "nodeName" not in (api.get(PODS, "default", "wc-driver-2").get("spec") or {})
    assert [p["metadata"]["name"] for p in api.list(PODS, "default")] == ["wc-driver-2"]


def test_a_deleted_crd_takes_its_objects_and_is_no_longer_served(api: EmulatedApiServer) -> None:
    """As the API server's CRD finalizer does; an unknown resource is a 404 too (kmock's
    resource mapping made an entry for any resource asked about, and served it)."""
    snapshots = "sparkcheckpoint.io/v1alpha1/sparkcheckpointsnapshots"
    body = {
        "apiVersion": "sparkcheckpoint.io/v1alpha1",
        "kind": "SparkCheckpointSnapshot",
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {"jobReference": {"name": "orders"}, "savepoint": {}},
    }
    api.create(snapshots, body, namespace="default")
    with pytest.raises(kmock.KubernetesError) as unknown:
        api.list("sparkcheckpoint.io/v1alpha1/nosuchthings", "default")
    assert unknown.value.status == 404

    api.delete(
        "apiextensions.k8s.io/v1/customresourcedefinitions",
        None,
        "sparkcheckpointsnapshots.sparkcheckpoint.io",
    )

    with pytest.raises(kmock.KubernetesError) as gone:
        api.list(snapshots, "default")
    assert gone.value.status == 404
    assert (
        api.call(
            lambda emulator: [
                o for r, o in emulator._live() if r.plural == "sparkcheckpointsnapshots"
            ]
        )
        == []
    )
