"""A Kubernetes API server for tests: kmock's ``KubernetesEmulator`` made to behave like one.

kmock serves discovery, records requests and keeps objects in memory, but as plain JSON: no
``resourceVersion``, ``uid`` or ``generation``, ``/status`` merged into the object, selectors
ignored, and every watch (re)connect replays all objects. Kopf relies on all of these: its
finalizer JSON patch tests ``metadata.resourceVersion``, it resumes watches from the last
version it saw, and it expects a no-op write to produce no event. With stale replays, Kopf
acts on old bodies and its patches fail with 422 in a loop. This module adds what a real API
server does, and runs it on a real port (``serve`` in a loop, ``EmulatedApiServer`` in a
thread) so that Kopf, lightkube and subprocesses can talk to it over plain HTTP.

What it does like a real API server:

- One global ``resourceVersion`` counter bumped by every write; lists carry it; a write that
  changes nothing keeps the version and sends no event.
- Create: ``uid``, ``creationTimestamp``, ``generation: 1``, ``generateName``, 409
  AlreadyExists; ``generation`` grows on changes outside ``metadata`` (and ``status`` where
  the status subresource exists), and once when deletion starts.
- Status subresource: the main endpoint ignores ``.status``, ``/status`` changes only it.
- PUT and merge patches carrying ``metadata.resourceVersion`` are preconditions (409
  Conflict); PUT of a custom resource must carry one (422). JSON patch (RFC 6902, the
  ``jsonpatch`` package; a failed ``test`` is 422), merge patch (RFC 7386), strategic merge
  patch (415 for custom resources, as on a real server).
- Label and field selectors on list and watch; a watch sees an object leave (DELETED) or
  enter (ADDED) its selection.
- Watches resume from ``resourceVersion`` out of a bounded per-resource event log; an older
  version gets an ERROR event with code 410; ``timeoutSeconds``, bookmarks, and
  ``sendInitialEvents`` with its closing bookmark; over a WebSocket too (one text frame
  per event), which the fabric8 client in Spark's driver asks for first.
- Deletion: finalizers hold an object (``deletionTimestamp``); removing the last one deletes
  it; dependents (``ownerReferences``) are garbage-collected in the background style; a pod
  bound to a node terminates gracefully until a kubelet deletes it with grace period 0.
- A namespace's deletion: phase Terminating; creates in it are refused as the
  NamespaceLifecycle admission refuses them (403, cause ``NamespaceTerminating``); every
  object in it is deleted as by a client (finalizers and pods' grace periods hold them);
  the namespace goes once nothing is left in it (the namespace controller's work).
- ``/metrics`` counts the requests served as kube-apiserver's ``apiserver_request_total``
  (``request_metrics.py``).
- Custom resources registered from their CRD (or created through the API) are discoverable
  and validated by a callable (422 Invalid with causes); what it returns is stored, so it
  can apply defaults.
- What kubectl reads besides the resources: aggregated discovery (``discovery``), the
  OpenAPI v3 documents (``openapi``: kubectl validates with them, computes strategic merge
  patches and explains fields), a custom resource's Table for ``kubectl get`` from its
  printer columns (``table``), strategic merge patches of built-in kinds with their schemas'
  merge keys and directives (``strategic_merge``).

Simplified:

- Server-side apply (``application/apply-patch+yaml``, ``kubectl apply --server-side``) is
  refused with 415, also for an object that does not exist yet. Built-in kinds
  answer ``kubectl get`` with a list, not their own Table (kubectl then prints names and
  ages); their unknown fields are kept, not pruned. No OpenAPI v2.
- Only a CRD's storage version is served; deleting a CRD leaves its resource served.
- Requests are decoded as the API server decodes them: apiVersion and kind checked against
  the endpoint, ObjectMeta's JSON types checked (400), unknown fields pruned (ObjectMeta's;
  a custom resource's outside its schema) with a Warning, or refused under
  ``fieldValidation=Strict``. Numbers are int64 or finite float64; JSON nested more than
  MAX_JSON_DEPTH (100) levels is refused (a real server allows 10,000: Python's recursion
  cannot follow).
- Validation is whatever the registered validator does (the SparkCheckpointJob one is the
  operator's manifest validation, on the spec and the status); of ObjectMeta, the name (a
  DNS subdomain), label and annotation keys and label values are checked; namespaces need
  not exist.
- Garbage collection happens at once, inside the deleting request; propagationPolicy
  Foreground is treated as Background; Orphan leaves dependents (with their ownerReferences).
- Field selectors accept any field path of built-in resources (a real server supports a
  few per resource); custom resources only ``metadata.name`` and ``metadata.namespace``.
- Pods: an update may change only container images, ``activeDeadlineSeconds``,
  ``tolerations`` and an unset ``spec.nodeName`` (a real server sets that only through
  ``pods/binding``, also served); status starts as ``{"phase": "Pending"}``.
- Lists ignore ``limit``/``continue`` and ``resourceVersion`` (always the latest state);
  ``dryRun=All`` is served on create only (checked and answered, nothing stored); no
  admission, authentication or managedFields.
- Initial watch events are sent oldest first, so a client resuming from the last one it saw
  misses nothing (a real server sends them in key order).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import copy
import datetime
import json
import math
import random
import re
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Self, TypeVar

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import parsing, rendering

from helpers.kube import discovery, openapi, strategic_merge, table
from helpers.kube.request_metrics import METRICS_PATH, RequestMetrics
from spark_checkpoint.storage.layout import (
    DNS_1123_SUBDOMAIN_MAX_LENGTH,
    DNS_1123_SUBDOMAIN_PATTERN,
)
from spark_checkpoint_operator.manifest.crd import JOB_CRD, SNAPSHOT_CRD, load_crd
from spark_checkpoint_operator.manifest.problems import ManifestError
from spark_checkpoint_operator.manifest.validation import (
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    deeper_than,
    go_regex,
    validate_update,
)

Body = dict[str, Any]
_Key = tuple[kmock.resource, str | None, str]  # resource, namespace, name
# A write's object, and the stored one it replaces (None for a create): the object to store.
Validator = Callable[[Body, Body | None], Body]
ResourceRef = str | kmock.resource
_T = TypeVar("_T")

NAMESPACES = kmock.resource("", "v1", "namespaces")
PODS = kmock.resource("", "v1", "pods")
CUSTOM_RESOURCE_DEFINITIONS = kmock.resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions"
)
SPARK_CHECKPOINT_JOBS = kmock.resource("sparkcheckpoint.io", "v1alpha1", "sparkcheckpointjobs")
SPARK_CHECKPOINT_JOBS_CRD = JOB_CRD
SPARK_CHECKPOINT_SNAPSHOTS = kmock.resource(
    "sparkcheckpoint.io", "v1alpha1", "sparkcheckpointsnapshots"
)

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
_JSON_HEADERS = {"Content-Type": "application/json"}  # exactly; lightkube needs no charset
_CUSTOM_RESOURCE_VERBS = (
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
)
_APPLY_PATCH = "application/apply-patch+yaml"
_CUSTOM_RESOURCE_PATCHES = (PATCH_TYPES["json"], PATCH_TYPES["merge"], _APPLY_PATCH)
_GENERATED_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's: no vowels, no 0/1/3
_GENERATED_NAME_MAX_PREFIX = 58  # 63 minus the 5 random characters
# A real API server refuses JSON nested more than 10,000 levels deep; Python's recursion
# (json, copy, validation) cannot follow that far, so the emulator refuses less.
MAX_JSON_DEPTH = 100
_INT64 = range(-(1 << 63), 1 << 63)
FIELD_VALIDATIONS = ("Ignore", "Warn", "Strict")
# ObjectMeta's fields as Go decodes them: a JSON value of another type is a 400.
_OBJECT_META_TYPES: Mapping[str, str] = {
    "name": "string",
    "generateName": "string",
    "namespace": "string",
    "selfLink": "string",
    "uid": "string",
    "resourceVersion": "string",
    "generation": "int64",
    "creationTimestamp": "string",
    "deletionTimestamp": "string",
    "deletionGracePeriodSeconds": "int64",
    "labels": "map[string]string",
    "annotations": "map[string]string",
    "ownerReferences": "[]v1.OwnerReference",
    "finalizers": "[]string",
    "managedFields": "[]v1.ManagedFieldsEntry",
}
# apimachinery's TotalAnnotationSizeLimitB: keys and values together.
MAX_ANNOTATIONS_BYTES = 256 * 1024
_INITIAL_STATUS: Mapping[kmock.resource, Body] = {
    PODS: {"phase": "Pending"},
    NAMESPACES: {"phase": "Active"},
}
_SERVER_METADATA = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
_DEFAULT_GRACE_SECONDS = 30
_IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class Invalid(Exception):
    """Raised by a validator: what is wrong, as (field path, message) pairs."""

    def __init__(self, causes: Sequence[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in causes))
        self.causes = tuple(causes)


class Rejection(NamedTuple):
    """A request the emulator refused, kept for assertions (e.g. no 409/422 retry loops)."""

    method: str
    path: str
    error: kmock.KubernetesError


def _validated_as(crd: str) -> Validator:
    """A validator of the CRD's objects (already pruned of unknown fields): the operator's
    own manifest validation, the CRD's schema and CEL rules, on the spec and the status. Of
    ObjectMeta, the fields a manifest may set are checked with it. An update is ratcheted
    as by Kubernetes 1.30 on: a problem of a value the stored object already held (stored
    under an earlier CRD) is let through."""

    def validate(obj: Body, stored: Body | None) -> Body:
        metadata = obj.get("metadata") or {}

        def document(body: Body) -> Body:
            meta = body.get("metadata") or {}
            fields = ("name", "namespace", "labels", "annotations")
            return {**body, "metadata": {key: meta[key] for key in fields if key in meta}}

        source = metadata.get("name", "<object>")
        try:
            defaulted, _ = validate_update(
                document(obj), None if stored is None else document(stored), source, crd
            )
        except ManifestError as error:
            problems = [(problem.path, problem.message) for problem in error.problems]
            raise Invalid(problems) from None
        defaulted["metadata"] = metadata
        return defaulted

    return validate


validate_spark_checkpoint_job = _validated_as(JOB_CRD)
# The operator's CRDs, each with its validator.
OPERATOR_CRDS: dict[str, Validator] = {
    JOB_CRD: validate_spark_checkpoint_job,
    SNAPSHOT_CRD: _validated_as(SNAPSHOT_CRD),
}


# --- the emulator -------------------------------------------------------------------------


@attrs.frozen
class _Change:
    """One write as watches see it: the object after it, and before it (None when created)."""

    revision: int
    type: str
    obj: Body
    old: Body | None


@attrs.define
class _EventLog:
    """A resource's recent changes: a watch can resume from any version >= ``floor``."""

    size: int
    floor: int = 0
    changes: collections.deque[_Change] = attrs.field(factory=collections.deque)

    def append(self, change: _Change) -> None:
        self.changes.append(change)
        if len(self.changes) > self.size:
            self.floor = self.changes.popleft().revision

    def since(self, revision: int) -> list[_Change] | None:
        """The changes after ``revision``, or None if some of them are forgotten."""
        if revision < self.floor:
            return None
        return [change for change in self.changes if change.revision > revision]


@attrs.define(eq=False)
class _Watcher:
    resource: kmock.resource
    queue: asyncio.Queue[_Change | None] = attrs.field(factory=asyncio.Queue)


class _LabelRequirement(NamedTuple):
    key: str
    operator: str  # in, notin, exists, !exists
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.operator:
            case "exists":
                return self.key in labels
            case "!exists":
                return self.key not in labels
            case "in":
                return labels.get(self.key) in self.values
            case _:
                return labels.get(self.key) not in self.values


class _FieldRequirement(NamedTuple):
    path: str
    negated: bool
    value: str

    def matches(self, obj: Body) -> bool:
        found: Any = obj
        for key in self.path.split("."):
            found = found.get(key) if isinstance(found, dict) else None
        text = (
            "" if found is None else str(found).lower() if isinstance(found, bool) else str(found)
        )
        return (text == self.value) != self.negated


@attrs.frozen
class _Selector:
    """What a list or watch sees: the URL's namespace and the label and field selectors."""

    namespace: str | None = None
    labels: tuple[_LabelRequirement, ...] = ()
    fields: tuple[_FieldRequirement, ...] = ()

    def matches(self, obj: Body) -> bool:
        metadata = obj.get("metadata") or {}
        if self.namespace is not None and metadata.get("namespace") != self.namespace:
            return False
        labels = metadata.get("labels") or {}
        return all(requirement.matches(labels) for requirement in self.labels) and all(
            requirement.matches(obj) for requirement in self.fields
        )

    def event(self, change: _Change) -> Body | None:
        """The change as this selection sees it: entering it is ADDED, leaving it DELETED."""
        now = self.matches(change.obj)
        before = change.old is not None and self.matches(change.old)
        if change.type != "MODIFIED":
            kind = change.type if now else None
        else:
            kind = (
                "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else None
            )
        return None if kind is None else {"type": kind, "object": change.obj}


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with a real API server's versions, subresources, patches, selectors,
    watches, deletion and validation (see the module's docstring).

    Its methods are not thread-safe: call them on the loop that serves it (``serve``), or
    through ``EmulatedApiServer.call``. Requests go to kmock's reactions first, so a test can
    still inject failures, e.g. ``emulator["patch", "pods"] << kmock.KubernetesError(500)``;
    the state then does not change. (``/version``, aggregated discovery and the OpenAPI
    documents are answered before the reactions.)
    """

    event_log_size: int = 1000
    bookmark_interval: float = 1.0
    validators: dict[str, Validator] = attrs.field(factory=dict)  # by CRD name
    rejections: list[Rejection] = attrs.field(factory=list, init=False)
    # What the request being served warns about (unknown fields it pruned), for its response.
    warnings: list[str] = attrs.field(factory=list, init=False)
    _revision: int = attrs.field(default=0, init=False)
    _logs: dict[kmock.resource, _EventLog] = attrs.field(factory=dict, init=False)
    _watchers: set[_Watcher] = attrs.field(factory=set, init=False)
    _custom: dict[kmock.resource, str] = attrs.field(factory=dict, init=False)  # -> CRD name
    _schemas: dict[kmock.resource, Body] = attrs.field(factory=dict, init=False)  # openAPIV3Schema
    # The keys of each resource's objects (deleted ones too): lists and watches then scan one
    # resource, not every object (events, which only grow, outnumber the rest at scale).
    _keys: dict[kmock.resource, dict[_Key, None]] = attrs.field(factory=dict, init=False)
    request_metrics: RequestMetrics = attrs.field(factory=RequestMetrics, init=False)

    def __attrs_post_init__(self) -> None:
        # Discovery from kmock's scaffold, but not KubernetesEmulator's own object handling.
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        self.fallback << self._serve
        with warnings.catch_warnings():  # kmock 0.8 reads them with a deprecated function
            warnings.simplefilter("ignore", DeprecationWarning)
            self.resources.load_bundled()
        self.create_object(NAMESPACES, {"metadata": {"name": "default"}})

    @property
    def revision(self) -> int:
        """The latest resourceVersion, as a number."""
        return self._revision

    def register_crd(
        self, crd: Mapping[str, Any], validator: Validator | None = None
    ) -> kmock.resource:
        """Install a CRD as ``kubectl apply`` would: its resource becomes discoverable and
        served, with writes checked by ``validator`` (or ``validators[crd name]``)."""
        if validator is not None:
            self.validators[crd["metadata"]["name"]] = validator
        self.create_object(CUSTOM_RESOURCE_DEFINITIONS, dict(crd))
        return _crd_resource(crd)

    def stop_watches(self) -> None:
        """End every watch stream, as an API server restart would; clients reconnect."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: resuming a watch from any
        version seen so far gets 410 Gone, and clients must list again."""
        for log in self._logs.values():
            log.changes.clear()
            log.floor = self._revision

    # --- operations for tests (the HTTP handlers use the same code) -------------------------

    def get_object(self, resource: ResourceRef, namespace: str | None, name: str) -> Body:
        res, info = self._resolve(kmock.resource(resource))
        return copy.deepcopy(self._stored(res, _scope(info, namespace), name))

    def list_objects(
        self,
        resource: ResourceRef,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
    ) -> list[Body]:
        res, info = self._resolve(kmock.resource(resource))
        params = {"labelSelector": labels, "fieldSelector": fields}
        return copy.deepcopy(
            self._select(res, self._selector(res, _scope(info, namespace), params))
        )

    def create_object(
        self,
        resource: ResourceRef,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        field_validation: str = "Strict",
    ) -> Body:
        """Create as ``kubectl create`` does: unknown fields are an error (its --validate
        defaults to strict); over HTTP, a request without ``fieldValidation`` gets Warn."""
        res, info = self._resolve(kmock.resource(resource))
        self.warnings.clear()
        created = self._create(
            res, info, _scope(info, namespace), copy.deepcopy(body), field_validation
        )
        return copy.deepcopy(created)

    def patch_object(
        self,
        resource: ResourceRef,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        field_validation: str = "Strict",
    ) -> Body:
        res, info = self._resolve(kmock.resource(resource))
        stored = self._stored(res, _scope(info, namespace), name)
        content_type = PATCH_TYPES[patch_type]
        self.warnings.clear()
        patched = self._patch(
            res,
            info,
            stored,
            copy.deepcopy(patch),
            content_type=content_type,
            subresource=subresource,
            field_validation=field_validation,
        )
        return copy.deepcopy(patched)

    def delete_object(
        self,
        resource: ResourceRef,
        namespace: str | None,
        name: str,
        *,
        grace_period_seconds: int | None = None,
    ) -> Body:
        res, info = self._resolve(kmock.resource(resource))
        options = (
            {} if grace_period_seconds is None else {"gracePeriodSeconds": grace_period_seconds}
        )
        return copy.deepcopy(self._delete(res, _scope(info, namespace), name, options))

    # --- HTTP -------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        path = _parse_path(raw_request.path)
        if raw_request.path == METRICS_PATH:
            response: aiohttp.web.StreamResponse = self.request_metrics.response()
        else:
            response = await self._answer(raw_request, path)
        self.request_metrics.count(raw_request, path, response.status)
        return response

    async def _answer(
        self, raw_request: aiohttp.web.BaseRequest, path: parsing.ParsedPath
    ) -> aiohttp.web.StreamResponse:
        """Parse the request like the API server does, then serve it. kmock 0.8's own parser
        fails on ``/api/v1/namespaces`` and misreads the names of namespaces."""
        body = await raw_request.read()
        method = kmock.method(raw_request.method)
        try:
            data = _json_body(body)
        except kmock.KubernetesError as error:
            self.rejections.append(Rejection(raw_request.method, raw_request.path, error))
            return aiohttp.web.Response(
                status=error.status, body=_dumps(_status(error)), headers=_JSON_HEADERS
            )
        request = rendering.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=body.decode("utf-8", errors="replace"),
            data=data,
            action=parsing.guess_k8s(path, method, dict(raw_request.query)),
            resource=None
            if path.group is None
            else kmock.resource(group=path.group, version=path.version, plural=path.plural),
            namespace=path.namespace,
            name=path.name,
            subresource=path.subresource,
        )
        self._requests.append(request)
        try:
            if _is_websocket_watch(request):
                return await self._websocket_watch(request, raw_request)
            return await self._handle(request)
        except kmock.KubernetesError as error:
            self.rejections.append(Rejection(raw_request.method, raw_request.path, error))
            return aiohttp.web.Response(
                status=error.status, body=_dumps(_status(error)), headers=_JSON_HEADERS
            )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if (document := self._api_document(request)) is not None:
            return document
        # kmock's KubernetesEmulator changes its objects here; ours change in the fallback.
        return await kmock.RawHandler._handle(self, request)

    def _api_document(self, request: rendering.Request) -> aiohttp.web.Response | None:
        """The version, aggregated discovery and the OpenAPI v3 documents (kmock serves legacy
        discovery)."""
        path, accept = request.url.path, _header(request, "accept")
        if request.method != "GET":
            return None
        # The Kubernetes whose schemas the OpenAPI documents hold; the official Python
        # client asks for "/version/", which a real API server answers too.
        if path in ("/version", "/version/"):
            return _document(openapi.server_version(), "application/json")
        if path in ("/api", "/apis") and discovery.wants_aggregated(accept):
            found = discovery.aggregated(self.resources, legacy=path == "/api")
            return _document(found, discovery.CONTENT_TYPE)
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            crds = {
                res: self._stored(CUSTOM_RESOURCE_DEFINITIONS, None, crd)
                for res, crd in self._custom.items()
            }
            documents = openapi.documents(self.resources, crds)
            if path == "/openapi/v3":
                return _document(openapi.index(documents), "application/json")
            if (found := documents.get(path.removeprefix("/openapi/v3/"))) is None:
                error = _resource_not_found()
                return _document(_status(error), "application/json", status=error.status)
            return _document(found, "application/json")
        return None

    def _serve(self, request: rendering.Request) -> rendering.Payload:
        """The fallback for everything that is not discovery: the resources' endpoints."""
        res, info = self._resolve(request.resource)
        namespace = _scope(info, request.namespace)
        name, subresource, params = request.name, request.subresource, request.params
        allowed = (
            {None} | ({"status"} & info.subresources) | ({"binding"} if res == PODS else set())
        )
        if subresource not in allowed:
            raise _resource_not_found()
        content_type = _header(request, "content-type")
        field_validation = params.get("fieldValidation") or "Warn"
        if field_validation not in FIELD_VALIDATIONS:
            raise _bad_request(
                f"fieldValidation must be one of {', '.join(FIELD_VALIDATIONS)}, got"
                f" {field_validation!r}"
            )
        dry_run = params.get("dryRun")
        if dry_run is not None and dry_run != "All":
            raise kmock.KubernetesError(
                422,
                "Invalid",
                f'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: '
                f'[]string{{"{dry_run}"}}: supported values: "All"',
                {},
            )
        if dry_run and (request.method != "POST" or name is not None):
            raise _bad_request(
                f"dryRun is emulated on create only, not on {request.method} {request.url.path}"
            )
        self.warnings.clear()
        match request.method, name, subresource:
            case ("GET", _, None) if params.get("watch") in ("true", "1"):
                return rendering.Response(
                    headers=_JSON_HEADERS, payload=self._watch(res, info, namespace, params, name)
                )
            case ("GET", None, None):
                selector = self._selector(res, namespace, params)
                found = self._select(res, selector)
                if (printed := self._table(request, res, found)) is not None:
                    return printed
                return _json(_list(res, info, found, self._revision))
            case ("GET", str(), None) if (
                printed := self._table(request, res, [self._stored(res, namespace, name)])
            ) is not None:
                return printed
            case ("GET", str(), _):
                return _json(self._stored(res, namespace, name))
            case ("POST", None, None):
                created = self._create(
                    res, info, namespace, request.data, field_validation, dry_run=bool(dry_run)
                )
                return _json(created, status=201, warnings=self.warnings)
            case ("POST", str(), "binding"):
                return _json(self._bind(namespace, name, request.data), status=201)
            case ("PUT", str(), _):
                stored = self._stored(res, namespace, name)
                replaced = self._replace(
                    res,
                    info,
                    stored,
                    request.data,
                    subresource=subresource,
                    field_validation=field_validation,
                )
                return _json(replaced, warnings=self.warnings)
            case ("PATCH", str(), _):
                if content_type.startswith(_APPLY_PATCH):  # even for an object not there yet
                    raise kmock.KubernetesError(
                        415,
                        "UnsupportedMediaType",
                        "server-side apply is not emulated here: apply client-side",
                        {},
                    )
                stored = self._stored(res, namespace, name)
                patched = self._patch(
                    res,
                    info,
                    stored,
                    request.data,
                    content_type=content_type,
                    subresource=subresource,
                    field_validation=field_validation,
                )
                return _json(patched, warnings=self.warnings)
            case ("DELETE", None, None):
                selector = self._selector(res, namespace, params)
                options = _delete_options(request.data, params)
                deleted = [
                    self._delete(res, namespace, obj["metadata"]["name"], options)
                    for obj in self._select(res, selector)
                ]
                return _json(_list(res, info, deleted, self._revision))
            case ("DELETE", str(), None):
                return _json(
                    self._delete(res, namespace, name, _delete_options(request.data, params))
                )
        raise kmock.KubernetesError(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )

    def _table(
        self, request: rendering.Request, res: kmock.resource, objects: list[Body]
    ) -> rendering.Response | None:
        """Custom resources as the Table a client asks for first in ``Accept`` (kubectl get).
        Built-in kinds have their own printers on a real server: here they answer JSON."""
        if res not in self._custom or not table.wants_table(_header(request, "accept")):
            return None
        include = request.params.get("includeObject") or "Metadata"
        if include not in table.INCLUDE_OBJECT:
            raise _bad_request(f"includeObject must be one of {', '.join(table.INCLUDE_OBJECT)}")
        crd = self._stored(CUSTOM_RESOURCE_DEFINITIONS, None, self._custom[res])
        version = next(v for v in crd["spec"]["versions"] if v["name"] == res.version)
        printed = table.table(
            version.get("additionalPrinterColumns") or table.DEFAULT_COLUMNS,
            objects,
            resource_version=str(self._revision)
            if request.name is None
            else objects[0]["metadata"]["resourceVersion"],
            include_object=include,
        )
        headers = {"Content-Type": table.CONTENT_TYPE, "Warning": None}
        return rendering.Response(status=200, headers=headers, payload=_dumps(printed))

    # --- reading ------------------------------------------------------------------------------

    def _resolve(self, res: kmock.resource | None) -> tuple[kmock.resource, kmock.ResourceInfo]:
        # Not `in self.resources`: kmock's mapping makes an empty entry for any key it is
        # asked about, so an unknown (or deleted) resource would be served.
        if res is None or res.plural is None or res not in set(self.resources):
            raise _resource_not_found()
        return res, self.resources[res]

    def _current(self, res: kmock.resource, namespace: str | None, name: str) -> Body | None:
        key = (res, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return self._objects[key].raw

    def _stored(self, res: kmock.resource, namespace: str | None, name: str) -> Body:
        stored = self._current(res, namespace, name)
        if stored is None:
            raise kmock.KubernetesError(
                404, "NotFound", f'{_qualified(res)} "{name}" not found', _details(res, name)
            )
        return stored

    def _live(self) -> Iterator[tuple[kmock.resource, Body]]:
        for (res, _, _), obj in self._objects.items():
            if not obj.deleted:
                yield res, obj.raw

    def _select(self, res: kmock.resource, selector: _Selector) -> list[Body]:
        found = []
        for key in self._keys.get(res, {}):
            stored = self._objects[key]
            if not stored.deleted and selector.matches(body := stored.raw):
                found.append(body)
        return sorted(
            found, key=lambda obj: (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
        )

    def _selector(
        self, res: kmock.resource, namespace: str | None, params: Mapping[str, str]
    ) -> _Selector:
        fields = _field_requirements(params.get("fieldSelector", ""))
        if res in self._custom:
            for requirement in fields:
                if requirement.path not in ("metadata.name", "metadata.namespace"):
                    raise _bad_request(f"field label not supported: {requirement.path}")
        return _Selector(namespace, _label_requirements(params.get("labelSelector", "")), fields)

    # --- watching -------------------------------------------------------------------------

    async def _websocket_watch(
        self, request: rendering.Request, raw_request: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        """A watch over a WebSocket, as the API server serves one (the fabric8 client in
        Spark's driver asks for it first): one text frame per event, closed when the watch
        ends. What the server refuses is refused before the upgrade, as a plain answer."""
        res, info = self._resolve(request.resource)
        namespace = _scope(info, request.namespace)
        events = self._watch(res, info, namespace, request.params, request.name)
        socket = aiohttp.web.WebSocketResponse()  # no subprotocol: JSON in text frames
        await socket.prepare(raw_request)

        async def send() -> None:
            async for event in events:
                if event != b"":  # the plain stream's early headers
                    await socket.send_str(json.dumps(event))
            await socket.close()

        sending = asyncio.create_task(send())
        try:
            # Reading answers the client's pings and its close, which ends the watch.
            async for _message in socket:
                pass
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
        return socket

    def _watch(
        self,
        res: kmock.resource,
        info: kmock.ResourceInfo,
        namespace: str | None,
        params: Mapping[str, str],
        name: str | None,
    ) -> AsyncIterator[rendering.Payload]:
        selector = self._selector(res, namespace, params)
        if name is not None:
            selector = attrs.evolve(
                selector, fields=(*selector.fields, _FieldRequirement("metadata.name", False, name))
            )
        since = params.get("resourceVersion") or "0"
        timeout = params.get("timeoutSeconds")
        if not since.isdigit() or (timeout is not None and not timeout.isdigit()):
            raise _bad_request(f"invalid resourceVersion {since!r} or timeoutSeconds {timeout!r}")
        return self._stream(
            res,
            info,
            selector,
            since=None if since == "0" or params.get("sendInitialEvents") == "true" else int(since),
            timeout=math.inf if timeout is None else float(timeout),
            bookmarks=params.get("allowWatchBookmarks") == "true",
            initial_end=params.get("sendInitialEvents") == "true",
        )

    async def _stream(
        self,
        res: kmock.resource,
        info: kmock.ResourceInfo,
        selector: _Selector,
        *,
        since: int | None,
        timeout: float,
        bookmarks: bool,
        initial_end: bool,
    ) -> AsyncIterator[rendering.Payload]:
        """The events of one watch. Everything up to the first ``yield`` runs at once, so the
        replay and the subscription to new changes have no gap and no overlap."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        watcher = _Watcher(res)
        self._watchers.add(watcher)
        try:
            if since is None:  # the current objects, as if just created, oldest first
                current = sorted(self._select(res, selector), key=_version)
                events: list[Body] = [{"type": "ADDED", "object": obj} for obj in current]
            elif (changes := self._log(res).since(since)) is not None:
                events = [
                    event for change in changes if (event := selector.event(change)) is not None
                ]
            else:
                yield _expired(since, self._log(res).floor)
                return
            yield b""  # the headers, at once, even if no event comes soon
            for event in events:
                yield event
            if initial_end and bookmarks:
                yield self._bookmark(res, info, {_INITIAL_EVENTS_END: "true"})
            while True:
                wait = min(
                    deadline - loop.time(), self.bookmark_interval if bookmarks else math.inf
                )
                try:
                    async with asyncio.timeout(None if wait == math.inf else max(wait, 0)):
                        change = await watcher.queue.get()
                except TimeoutError:
                    if loop.time() >= deadline:
                        return
                    yield self._bookmark(res, info, {})
                    continue
                if change is None:
                    return
                if (event := selector.event(change)) is not None:
                    yield event
        finally:
            self._watchers.discard(watcher)

    def _bookmark(
        self, res: kmock.resource, info: kmock.ResourceInfo, annotations: Mapping[str, str]
    ) -> Body:
        # Safe to send only while idle: every change up to this version is already queued.
        metadata: Body = {"resourceVersion": str(self._revision)}
        if annotations:
            metadata["annotations"] = dict(annotations)
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": _kind(res, info),
                "apiVersion": _api_version(res),
                "metadata": metadata,
            },
        }

    def _log(self, res: kmock.resource) -> _EventLog:
        return self._logs.setdefault(res, _EventLog(self.event_log_size))

    # --- writing --------------------------------------------------------------------------

    def _commit(self, res: kmock.resource, kind: str, obj: Body, old: Body | None) -> Body:
        """Store a new state under a new resourceVersion and tell the watches."""
        self._revision += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self._revision)}}
        key = (res, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in self._objects:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj
            self._keys.setdefault(res, {})[key] = None
        if kind == "DELETED":
            self._objects[key].delete()
        change = _Change(self._revision, kind, obj, old)
        self._log(res).append(change)
        for watcher in self._watchers:
            if watcher.resource == res:
                watcher.queue.put_nowait(change)
        return obj

    def _create(
        self,
        res: kmock.resource,
        info: kmock.ResourceInfo,
        namespace: str | None,
        body: Any,
        field_validation: str,
        *,
        dry_run: bool = False,
    ) -> Body:
        """``dry_run``: checked as a create is, the answer what it would store (without a
        resourceVersion), nothing stored."""
        obj = self._decoded(res, info, body, field_validation, update=False)
        metadata = obj["metadata"]
        if info.namespaced:
            if namespace and metadata.get("namespace") not in (None, namespace):
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent on"
                    " the request"
                )
            metadata["namespace"] = namespace or metadata.get("namespace")
            if not metadata["namespace"]:
                raise _bad_request("the namespace of the object is not set")
            self._require_not_terminating(res, metadata)
        else:
            metadata.pop("namespace", None)
        obj["apiVersion"], obj["kind"] = _api_version(res), _kind(res, info)
        if not metadata.get("name"):
            if not metadata.get("generateName"):
                raise _invalid(
                    res,
                    info,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                )
            metadata["name"] = self._generate_name(
                res, metadata.get("namespace"), metadata["generateName"]
            )
        name = metadata["name"]
        if len(name) > DNS_1123_SUBDOMAIN_MAX_LENGTH or not re.match(
            DNS_1123_SUBDOMAIN_PATTERN, name
        ):
            message = (
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric"
                " characters, '-' or '.'"
            )
            raise _invalid(
                res, info, name, [("metadata.name", f"Invalid value: {name!r}: {message}")]
            )
        if causes := _metadata_problems(metadata):
            raise _invalid(res, info, name, causes)
        if res == PODS and (causes := _pod_problems(obj)):
            raise _invalid(res, info, name, causes)
        if self._current(res, metadata.get("namespace"), name) is not None:
            raise kmock.KubernetesError(
                409,
                "AlreadyExists",
                f'{_qualified(res)} "{name}" already exists',
                _details(res, name),
            )
        for field in (*_SERVER_METADATA[2:], "resourceVersion"):
            metadata.pop(field, None)
        metadata.update(uid=str(uuid.uuid4()), creationTimestamp=_timestamp(), generation=1)
        if "status" in info.subresources:
            obj.pop("status", None)
            if res in _INITIAL_STATUS:
                obj["status"] = copy.deepcopy(_INITIAL_STATUS[res])
        if res == NAMESPACES:  # what the namespace controller finalizes at its deletion
            finalizers = obj.setdefault("spec", {}).setdefault("finalizers", [])
            if "kubernetes" not in finalizers:
                finalizers.append("kubernetes")
        if dry_run:
            return self._validated(res, info, obj, None)
        created = self._commit(res, "ADDED", self._validated(res, info, obj, None), None)
        if res == CUSTOM_RESOURCE_DEFINITIONS:
            self._serve_custom_resource(created)
        return created

    def _generate_name(self, res: kmock.resource, namespace: str | None, prefix: str) -> str:
        prefix = prefix[:_GENERATED_NAME_MAX_PREFIX]  # as the API server's name generator
        while True:
            name = prefix + "".join(random.choices(_GENERATED_NAME_ALPHABET, k=5))
            if self._current(res, namespace, name) is None:
                return name

    def _serve_custom_resource(self, crd: Body) -> None:
        spec, names = crd["spec"], crd["spec"]["names"]
        version = next(version for version in spec["versions"] if version.get("storage"))
        res = _crd_resource(crd)
        self.resources[res] = kmock.ResourceInfo(
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            kind=names["kind"],
            singular=names.get("singular", names["kind"].lower()),
            shortnames=names.get("shortNames", ()),
            categories=names.get("categories", ()),
            verbs=_CUSTOM_RESOURCE_VERBS,
            subresources=set(version.get("subresources") or {}),
        )
        self._custom[res] = crd["metadata"]["name"]
        if schema := (version.get("schema") or {}).get("openAPIV3Schema"):
            self._schemas[res] = schema

    def _decoded(
        self,
        res: kmock.resource,
        info: kmock.ResourceInfo,
        body: Any,
        field_validation: str,
        *,
        update: bool,
    ) -> Body:
        """A copy of a request's object as the API server decodes it: a type that does not
        match the endpoint, or ObjectMeta of the wrong shape, is a 400; unknown fields
        (in ObjectMeta; in a custom resource, outside its schema) are pruned, with a
        warning (fieldValidation Warn, the default), silently (Ignore), or refused (Strict).
        ``update``: the object of a patch, whose type a custom resource's update validation
        checks (422)."""
        if not isinstance(body, dict):
            raise _bad_request("the body must be a JSON object")
        obj = copy.deepcopy(body)  # pruning must not touch what a merge patch shares
        self._check_type(res, info, obj, update=update)
        unknown: list[str] = []
        obj["metadata"] = _object_meta(res, info, obj.get("metadata"), unknown)
        if res in self._schemas:
            unknown += _prune(obj, self._schemas[res])
        if unknown and field_validation == "Strict":
            fields = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise _undecodable(res, info, f"strict decoding error: {fields}")
        if field_validation == "Warn":
            self.warnings.extend(f'unknown field "{path}"' for path in unknown)
        return obj

    def _check_type(
        self, res: kmock.resource, info: kmock.ResourceInfo, obj: Body, *, update: bool
    ) -> None:
        """apiVersion and kind against the endpoint's. Built-in types take them from the
        endpoint when absent; a custom resource's body must carry both."""
        api_version, kind = _api_version(res), _kind(res, info)
        custom = res in self._custom
        given_version, given_kind = obj.get("apiVersion"), obj.get("kind")
        if update and custom and (given_version, given_kind) != (api_version, kind):
            causes = [
                (field, f"Invalid value: {json.dumps(given)}: must be {expected}")
                for field, given, expected in (
                    ("kind", given_kind, kind),
                    ("apiVersion", given_version, api_version),
                )
                if given != expected
            ]
            raise _invalid(res, info, _name_of(obj), causes)
        if custom and given_kind is None:
            raise _undecodable(res, info, "Object 'Kind' is missing", kind_known=False)
        if given_kind is not None and given_kind != kind:
            if custom:
                cause = ("kind", f"Invalid value: {json.dumps(given_kind)}: must be {kind}")
                raise _invalid(res, info, _name_of(obj), [cause])
            raise _bad_request(
                f"{given_kind} in version {json.dumps(res.version)} cannot be handled as a"
                f" {kind}: no kind {json.dumps(given_kind)} is registered for version"
                f" {json.dumps(api_version)}"
            )
        if (custom or given_version is not None) and given_version != api_version:
            shown = given_version if isinstance(given_version, str) else json.dumps(given_version)
            raise _bad_request(
                f"the API version in the data ({'' if given_version is None else shown}) does"
                f" not match the expected API version ({api_version})"
            )

    def _validated(
        self, res: kmock.resource, info: kmock.ResourceInfo, obj: Body, stored: Body | None
    ) -> Body:
        if res.group == "" and res.plural == "secrets" and "stringData" in obj:
            # Write-only convenience field: the API server stores it base64-encoded in data.
            encoded = {
                key: base64.b64encode(str(value).encode()).decode()
                for key, value in (obj.pop("stringData") or {}).items()
            }
            obj["data"] = {**(obj.get("data") or {}), **encoded}
        validator = self.validators.get(self._custom.get(res, ""))
        if validator is None:
            return obj
        try:
            return validator(obj, stored)
        except Invalid as error:
            raise _invalid(res, info, obj["metadata"]["name"], error.causes) from None

    def _replace(
        self,
        res: kmock.resource,
        info: kmock.ResourceInfo,
        stored: Body,
        body: Any,
        *,
        subresource: str | None,
        field_validation: str,
    ) -> Body:
        name = stored["metadata"]["name"]
        body = self._decoded(res, info, body, field_validation, update=False)
        metadata = body["metadata"]
        if metadata.get("name") not in (None, name):
            raise _bad_request(
                f"the name of the object ({metadata['name']}) does not match the name on the URL"
                f" ({name})"
            )
        if res in self._custom and not metadata.get("resourceVersion"):
            cause = (
                "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )
            raise _invalid(res, info, name, [cause])
        return self._update(res, info, stored, body, subresource=subresource)

    def _patch(
        self,
        res: kmock.resource,
        info: kmock.ResourceInfo,
        stored: Body,
        patch: Any,
        *,
        content_type: str,
        subresource: str | None,
        field_validation: str,
    ) -> Body:
        media_type = content_type.split(";", maxsplit=1)[0].strip()
        if media_type == PATCH_TYPES["json"]:
            if not isinstance(patch, list):
                raise _bad_request("a JSON patch must be a list of operations")
            try:
                candidate = jsonpatch.apply_patch(stored, patch)
            except jsonpatch.InvalidJsonPatch as error:
                raise _bad_request(str(error)) from None
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
                # As the API server: any failure to apply, a failed `test` included, is 422.
                raise kmock.KubernetesError(422, "Invalid", str(error), {}) from None
        elif media_type == PATCH_TYPES["merge"] or (
            media_type == PATCH_TYPES["strategic"] and res not in self._custom
        ):
            if not isinstance(patch, dict):
                raise _bad_request("a merge patch must be a JSON object")
            if media_type == PATCH_TYPES["merge"]:
                candidate = _merge_patch(stored, patch)
            else:
                schema = openapi.builtin_schema(res, _kind(res, info))
                try:
                    candidate = strategic_merge.apply(stored, patch, schema, openapi.resolve)
                except strategic_merge.PatchError as error:
                    raise _bad_request(str(error)) from None
        else:
            accepted = _CUSTOM_RESOURCE_PATCHES if res in self._custom else (*PATCH_TYPES.values(),)
            raise kmock.KubernetesError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(accepted),
                {},
            )
        if not isinstance(candidate, dict) or deeper_than(candidate, MAX_JSON_DEPTH):
            raise _bad_request("the patched object is not a JSON object of a bounded depth")
        candidate = self._decoded(res, info, candidate, field_validation, update=True)
        return self._update(res, info, stored, candidate, subresource=subresource)

    def _update(
        self,
        res: kmock.resource,
        info: kmock.ResourceInfo,
        stored: Body,
        candidate: Body,
        *,
        subresource: str | None,
    ) -> Body:
        """Write a new state of an object, from a PUT or a patch, as the API server would."""
        if subresource not in (None, *({"status"} & info.subresources)):
            raise _resource_not_found()
        old_metadata = stored["metadata"]
        name = old_metadata["name"]
        version = (candidate.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != old_metadata["resourceVersion"]:
            raise _conflict(
                res,
                name,
                "the object has been modified; please apply your changes to the latest version"
                " and try again",
            )
        if subresource == "status":
            new = copy.deepcopy(stored)
            _keep(new, candidate, "status")
            new = self._validated(res, info, new, stored)
        else:
            new = copy.deepcopy(candidate)
            metadata = new["metadata"] = dict(new.get("metadata") or {})
            for field in _SERVER_METADATA:
                _keep(metadata, old_metadata, field)
            new["apiVersion"], new["kind"] = stored["apiVersion"], stored["kind"]
            if "status" in info.subresources:
                _keep(new, stored, "status")
            if old_metadata.get("deletionTimestamp") and not set(
                metadata.get("finalizers") or ()
            ) <= set(old_metadata.get("finalizers") or ()):
                cause = (
                    "metadata.finalizers",
                    "Forbidden: no new finalizers can be added if the object is being deleted",
                )
                raise _invalid(res, info, name, [cause])
            if causes := _metadata_problems(metadata):
                raise _invalid(res, info, name, causes)
            if res == PODS and _pod_spec_essence(new, stored) != _pod_spec_essence(stored, stored):
                cause = (
                    "spec",
                    "Forbidden: pod updates may not change fields other than container images,"
                    " activeDeadlineSeconds, tolerations",
                )
                raise _invalid(res, info, name, [cause])
            new = self._validated(res, info, new, stored)
        new["metadata"]["resourceVersion"] = old_metadata["resourceVersion"]
        if _essence(new, info) != _essence(stored, info):
            new["metadata"]["generation"] = old_metadata.get("generation", 0) + 1
        if new == stored:
            return stored  # no new version, no event
        metadata = new["metadata"]
        if (
            old_metadata.get("finalizers")
            and not metadata.get("finalizers")
            and metadata.get("deletionTimestamp")
            and not metadata.get("deletionGracePeriodSeconds")
        ):
            return self._remove(res, new, stored, orphan=False)
        return self._commit(res, "MODIFIED", new, stored)

    def _bind(self, namespace: str | None, name: str, binding: Any) -> Body:
        pod = self._stored(PODS, namespace, name)
        node = (
            ((binding or {}).get("target") or {}).get("name") if isinstance(binding, dict) else None
        )
        if not node:
            raise _bad_request("a Binding needs target.name")
        if pod.get("spec", {}).get("nodeName"):
            raise _conflict(
                PODS, name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise _conflict(
                PODS, name, f"pod {name} is being deleted, cannot be assigned to a host"
            )
        bound = copy.deepcopy(pod)
        bound.setdefault("spec", {})["nodeName"] = node
        self._commit(PODS, "MODIFIED", bound, pod)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

    # --- deleting -------------------------------------------------------------------------

    def _delete(
        self, res: kmock.resource, namespace: str | None, name: str, options: Mapping[str, Any]
    ) -> Body:
        stored = self._stored(res, namespace, name)
        metadata = stored["metadata"]
        preconditions = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            if preconditions.get(field) not in (None, metadata[field]):
                raise _conflict(
                    res,
                    name,
                    f"Precondition failed: {field} in precondition: {preconditions[field]},"
                    f" {field} in object meta: {metadata[field]}",
                )
        if res == NAMESPACES:
            return self._terminate_namespace(stored)
        grace = options.get("gracePeriodSeconds")
        orphan = (
            options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
        )
        if metadata.get("deletionTimestamp"):
            # Already terminating: only a kubelet's zero-grace delete of a pod moves it on.
            if res != PODS or grace != 0:
                return stored
            if not metadata.get("finalizers"):
                return self._remove(res, stored, stored, orphan=orphan)
            return (
                stored
                if metadata.get("deletionGracePeriodSeconds") == 0
                else self._mark(res, stored, 0)
            )
        seconds = 0
        if res == PODS and (stored.get("spec") or {}).get("nodeName"):
            seconds = (
                grace
                if grace is not None
                else stored["spec"].get("terminationGracePeriodSeconds", _DEFAULT_GRACE_SECONDS)
            )
        if seconds == 0 and not metadata.get("finalizers"):
            return self._remove(res, stored, stored, orphan=orphan)
        return self._mark(res, stored, seconds)

    def _mark(self, res: kmock.resource, stored: Body, seconds: int) -> Body:
        """Start (or, with 0 seconds, hurry) a deletion that finalizers or a kubelet finish."""
        marked = copy.deepcopy(stored)
        metadata = marked["metadata"]
        if not metadata.get("deletionTimestamp"):
            metadata["generation"] = metadata.get("generation", 0) + 1
        metadata["deletionTimestamp"] = _timestamp(seconds)
        metadata["deletionGracePeriodSeconds"] = seconds
        return self._commit(res, "MODIFIED", marked, stored)

    def _remove(self, res: kmock.resource, obj: Body, old: Body, *, orphan: bool) -> Body:
        removed = self._commit(res, "DELETED", obj, old)
        if not orphan:
            self._collect_garbage(removed["metadata"]["uid"])
        if res == CUSTOM_RESOURCE_DEFINITIONS:
            self._stop_serving(_crd_resource(removed))
        if namespace := removed["metadata"].get("namespace"):
            self._remove_emptied_namespace(namespace)
        return removed

    def _terminating(self, namespace: str) -> Body | None:
        found = self._current(NAMESPACES, None, namespace)
        return found if found is not None and found["metadata"].get("deletionTimestamp") else None

    def _require_not_terminating(self, res: kmock.resource, metadata: Body) -> None:
        """The NamespaceLifecycle admission plugin's refusal of a create."""
        namespace = metadata["namespace"]
        if self._terminating(namespace) is None:
            return
        # As admission names an object whose name is not generated yet.
        name = metadata.get("name") or metadata.get("generateName") or "Unknown"
        cause = {
            "type": "NamespaceTerminating",
            "message": f"namespace {namespace} is being terminated",
            "field": "metadata.namespace",
        }
        raise kmock.KubernetesError(
            403,
            "Forbidden",
            f'{_qualified(res)} "{name}" is forbidden: unable to create new content in '
            f"namespace {namespace} because it is being terminated",
            {**_details(res, name), "causes": [cause]},
        )

    def _terminate_namespace(self, stored: Body) -> Body:
        """Start a namespace's deletion: what is in it is deleted, the namespace once empty.
        The system's namespaces may not be deleted (NamespaceLifecycle), and one being
        deleted answers a second deletion with 409 (the namespace storage's)."""
        name = stored["metadata"]["name"]
        if name in _IMMORTAL_NAMESPACES:
            raise kmock.KubernetesError(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                _details(NAMESPACES, name),
            )
        if stored["metadata"].get("deletionTimestamp"):
            raise _conflict(
                NAMESPACES,
                name,
                "The system is ensuring all content is removed from this namespace.  Upon "
                "completion, this namespace will automatically be purged by the system.",
            )
        marked = copy.deepcopy(stored)
        marked["metadata"]["deletionTimestamp"] = _timestamp()
        marked["status"] = {"phase": "Terminating"}
        terminating = self._commit(NAMESPACES, "MODIFIED", marked, stored)
        for res, obj in list(self._live()):
            if obj["metadata"].get("namespace") == name and self._current(
                res, name, obj["metadata"]["name"]
            ):
                self._delete(res, name, obj["metadata"]["name"], {})
        return self._remove_emptied_namespace(name) or terminating

    def _remove_emptied_namespace(self, namespace: str) -> Body | None:
        """The namespace controller's last step: a terminating namespace with nothing left
        in it goes."""
        terminating = self._terminating(namespace)
        if terminating is None:
            return None
        if any(obj["metadata"].get("namespace") == namespace for _, obj in self._live()):
            return None
        done = copy.deepcopy(terminating)
        done["spec"] = {}
        return self._commit(NAMESPACES, "DELETED", done, terminating)

    def _stop_serving(self, res: kmock.resource) -> None:
        """A deleted CRD: its objects are deleted (the API server's CRD finalizer; their own
        finalizers, which would hold it, are not emulated), then its resource is no longer
        served (404, and gone from discovery)."""
        for served, obj in list(self._live()):
            if served == res:
                self._remove(res, obj, obj, orphan=False)
        self.resources.pop(res, None)
        self._custom.pop(res, None)
        self._schemas.pop(res, None)

    def _collect_garbage(self, owner: str) -> None:
        """Delete the dependents of a deleted owner that have no other owner left."""
        live = list(self._live())
        uids = {obj["metadata"]["uid"] for _, obj in live}
        for res, obj in live:
            owners = {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or ()}
            if owner in owners and not (owners - {owner}) & uids:
                namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
                if self._current(res, namespace, name) is not None:  # not removed meanwhile
                    self._delete(res, namespace, name, {})


# --- serving ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serve(
    emulator: ApiServerEmulator, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve the emulator over HTTP on this loop; yields its URL. (``kmock.Server`` would
    also patch aiohttp's host resolution for the whole process.)"""
    # handler_cancellation: a client's disconnect ends its watch at once.
    server = aiohttp.web.Server(emulator, handler_cancellation=True)
    runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
    async with emulator:
        await runner.setup()
        try:
            await aiohttp.web.TCPSite(runner, host, port).start()
            bound_host, bound_port = runner.addresses[0][:2]
            yield f"http://{bound_host}:{bound_port}"
        finally:
            emulator.stop_watches()
            await runner.cleanup()


def write_kubeconfig(url: str, path: str | Path, namespace: str = "default") -> Path:
    """A kubeconfig for the emulator at ``url`` (plain http, no credentials) that Kopf's,
    lightkube's and the kubernetes client's kubeconfig loaders accept."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    path = Path(path)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@attrs.frozen
class _Running:
    url: str
    loop: asyncio.AbstractEventLoop
    emulator: ApiServerEmulator
    stop: asyncio.Event


class EmulatedApiServer:
    """The emulator on a real TCP port, in a background thread with its own event loop, for
    sync tests and subprocesses::

        with EmulatedApiServer(crds=[crd]) as api:
            api.write_kubeconfig(tmp_path / "kubeconfig")
            api.create("v1/pods", {...}, namespace="default")

    The helpers run on the emulator's loop (thread-safe) and raise ``kmock.KubernetesError``
    as the API would answer; ``call`` runs anything else there.
    """

    def __init__(
        self,
        *,
        crds: Sequence[Mapping[str, Any]] = (),
        validators: Mapping[str, Validator] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        event_log_size: int = 1000,
        bookmark_interval: float = 1.0,
        timeout: float = 10.0,
    ) -> None:
        self._crds = [copy.deepcopy(dict(crd)) for crd in crds]
        self._options: dict[str, Any] = {
            "validators": dict(validators or {}),
            "event_log_size": event_log_size,
            "bookmark_interval": bookmark_interval,
        }
        self._address = (host, port)
        self._timeout = timeout
        self._thread: threading.Thread | None = None
        self._running: _Running | None = None

    def __enter__(self) -> Self:
        started: concurrent.futures.Future[_Running] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._main(started),), name="kube-api-emulator", daemon=True
        )
        self._thread.start()
        self._running = started.result(timeout=self._timeout)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        running, thread = self._state()
        running.loop.call_soon_threadsafe(running.stop.set)
        thread.join(self._timeout)
        self._running = self._thread = None

    async def _main(self, started: concurrent.futures.Future[_Running]) -> None:
        try:
            emulator = ApiServerEmulator(**self._options)
            for crd in self._crds:
                emulator.register_crd(crd)
            async with serve(emulator, *self._address) as url:
                stop = asyncio.Event()
                started.set_result(_Running(url, asyncio.get_running_loop(), emulator, stop))
                await stop.wait()
        except BaseException as error:
            if started.done():
                raise
            started.set_exception(error)

    def _state(self) -> tuple[_Running, threading.Thread]:
        if self._running is None or self._thread is None:
            raise RuntimeError(
                "the emulated API server is not running (use it as a context manager)"
            )
        return self._running, self._thread

    @property
    def url(self) -> str:
        return self._state()[0].url

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        return write_kubeconfig(self.url, path, namespace)

    def call(self, fn: Callable[[ApiServerEmulator], _T]) -> _T:
        """Run ``fn(emulator)`` on the emulator's loop and return its result."""
        running, _ = self._state()

        async def run() -> _T:
            return fn(running.emulator)

        return asyncio.run_coroutine_threadsafe(run(), running.loop).result(self._timeout)

    @contextlib.contextmanager
    def validated_by(self, crd_name: str, validator: Validator) -> Iterator[None]:
        """Writes of the CRD's objects checked by ``validator`` meanwhile, as by an earlier
        version of the CRD: what a CRD upgrade that tightens a rule finds stored."""
        current = self.call(lambda emulator: emulator.validators[crd_name])
        self.call(lambda emulator: emulator.validators.__setitem__(crd_name, validator))
        try:
            yield
        finally:
            self.call(lambda emulator: emulator.validators.__setitem__(crd_name, current))

    def get(self, resource: ResourceRef, namespace: str | None, name: str) -> Body:
        return self.call(lambda emulator: emulator.get_object(resource, namespace, name))

    def list(
        self,
        resource: ResourceRef,
        namespace: str | None = None,
        *,
        labels: str = "",
        fields: str = "",
    ) -> list[Body]:
        return self.call(
            lambda emulator: emulator.list_objects(
                resource, namespace, labels=labels, fields=fields
            )
        )

    def create(
        self, resource: ResourceRef, body: Mapping[str, Any], namespace: str | None = None
    ) -> Body:
        return self.call(lambda emulator: emulator.create_object(resource, body, namespace))

    def patch(
        self,
        resource: ResourceRef,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> Body:
        return self.call(
            lambda emulator: emulator.patch_object(
                resource, namespace, name, patch, patch_type=patch_type, subresource=subresource
            )
        )

    def delete(
        self,
        resource: ResourceRef,
        namespace: str | None,
        name: str,
        *,
        grace_period_seconds: int | None = None,
    ) -> Body:
        return self.call(
            lambda emulator: emulator.delete_object(
                resource, namespace, name, grace_period_seconds=grace_period_seconds
            )
        )


def spark_checkpoint_api(**options: Any) -> EmulatedApiServer:
    """An emulated API server with the operator's CRDs installed and validated."""
    crds = [load_crd(name) for name in OPERATOR_CRDS]
    return EmulatedApiServer(crds=crds, validators=OPERATOR_CRDS, **options)


# --- helpers ------------------------------------------------------------------------------


def _is_websocket_watch(request: rendering.Request) -> bool:
    return (
        request.method == kmock.method("GET")
        and request.params.get("watch") in ("true", "1")
        and _header(request, "upgrade").lower() == "websocket"
    )


def _json(payload: Body, status: int = 200, warnings: Sequence[str] = ()) -> rendering.Response:
    # RFC 7234 warn-code 299, as the API server sends them. kmock merges a response's headers
    # into its fallback reaction, which serves every request: None unsets an older warning.
    warning = ", ".join(f"299 - {json.dumps(text)}" for text in warnings) or None
    headers: dict[str, str | None] = {**_JSON_HEADERS, "Warning": warning}
    return rendering.Response(status=status, headers=headers, payload=_dumps(payload))


def _document(payload: Body, content_type: str, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        status=status, body=_dumps(payload), headers={"Content-Type": content_type}
    )


def _header(request: rendering.Request, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name), "")


def _dumps(payload: Body) -> bytes:
    return json.dumps(payload).encode("utf-8")


def _json_body(body: bytes) -> Any:
    """A request body decoded as the API server's JSON decoder does: a number is an int64
    or else a float64 (one that fits neither is an error), NaN and Infinity are not JSON,
    and nesting is bounded (MAX_JSON_DEPTH here). None for an empty body."""
    if not body:
        return None
    try:
        data = json.loads(
            body, parse_int=_go_number, parse_float=_go_float, parse_constant=_no_constant
        )
    except RecursionError:
        raise _bad_request(f"exceeded max depth of {MAX_JSON_DEPTH}") from None
    except ValueError as error:  # UnicodeDecodeError too
        raise _bad_request(f"invalid JSON: {str(error)[:200]}") from None
    if deeper_than(data, MAX_JSON_DEPTH):
        raise _bad_request(f"exceeded max depth of {MAX_JSON_DEPTH}")
    return data


def _go_number(text: str) -> int | float:
    number = int(text)
    return number if number in _INT64 else _go_float(text)


def _go_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _no_constant(text: str) -> Any:
    raise ValueError(f"invalid character {text[:1]!r} looking for beginning of value")


def _object_meta(
    res: kmock.resource, info: kmock.ResourceInfo, metadata: Any, unknown: list[str]
) -> Body:
    """ObjectMeta as Go decodes it: a field of the wrong JSON type is a 400, null is
    absent, and an unknown field is dropped (its path added to ``unknown``)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise _undecodable(
            res,
            info,
            f"json: cannot unmarshal {_json_type(metadata)} into Go struct field"
            f" {_kind(res, info)}.metadata of type v1.ObjectMeta",
        )
    decoded = {}
    for key, value in metadata.items():
        go_type = _OBJECT_META_TYPES.get(key)
        if go_type is None:
            unknown.append(f"metadata.{key}")
        elif value is not None:
            if not _decodes_as(value, go_type):
                raise _undecodable(
                    res,
                    info,
                    f"json: cannot unmarshal {_json_type(value)} into Go struct field"
                    f" ObjectMeta.metadata.{key} of type {go_type}",
                )
            decoded[key] = value
    return decoded


def _metadata_problems(metadata: Mapping[str, Any]) -> list[tuple[str, str]]:
    """ObjectMeta validation of labels, annotations, owner references and finalizers, as on
    every object (apimachinery's ValidateObjectMeta): keys and finalizers are qualified
    names, label values at most 63 characters of a restricted alphabet, annotations 256 KiB
    in all, each owner reference complete and at most one of them the controller."""
    causes = _owner_reference_problems(metadata.get("ownerReferences") or ())
    for finalizer in metadata.get("finalizers") or ():
        if not go_regex(QUALIFIED_NAME_PATTERN).search(finalizer):
            causes.append(
                (
                    "metadata.finalizers",
                    f"Invalid value: {json.dumps(finalizer)}: not a qualified name",
                )
            )
    annotations = metadata.get("annotations") or {}
    size = sum(len(key) + len(value or "") for key, value in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        causes.append(
            (
                "metadata.annotations",
                f"Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes",
            )
        )
    for field in ("labels", "annotations"):
        for key, value in (metadata.get(field) or {}).items():
            if not go_regex(QUALIFIED_NAME_PATTERN).search(key):
                causes.append(
                    (f"metadata.{field}", f"Invalid value: {json.dumps(key)}: not a qualified name")
                )
            elif field == "labels" and not go_regex(LABEL_VALUE_PATTERN).search(value or ""):
                causes.append(
                    (
                        f"metadata.{field}",
                        f"Invalid value: {json.dumps(value)}: not a valid label value",
                    )
                )
    return causes


def _owner_reference_problems(references: Sequence[Any]) -> list[tuple[str, str]]:
    """apimachinery's ValidateOwnerReferences (its field paths have no index)."""
    causes = []
    controller = ""
    for reference in references:
        fields = {
            # Of "group/version" or "version": the version.
            "apiVersion": str(reference.get("apiVersion") or "").rpartition("/")[2],
            "kind": reference.get("kind") or "",
            "name": reference.get("name") or "",
            "uid": reference.get("uid") or "",
        }
        for name, value in fields.items():
            if not value:
                given = json.dumps(reference.get(name) or "")
                detail = (
                    "version must not be empty" if name == "apiVersion" else "must not be empty"
                )
                causes.append(
                    (f"metadata.ownerReferences.{name}", f"Invalid value: {given}: {detail}")
                )
        if reference.get("controller") is True:
            named = f"{fields['kind']}/{fields['name']}"
            if controller:
                causes.append(
                    (
                        "metadata.ownerReferences",
                        # Go prints the list with %#v: its type only here.
                        "Invalid value: []v1.OwnerReference{...}: Only one reference can have "
                        f'Controller set to true. Found "true" in references for {controller} '
                        f"and {named}",
                    )
                )
            else:
                controller = named
    return causes


def _pod_problems(pod: Body) -> list[tuple[str, str]]:
    """Of the API server's pod validation, what the operator's pods could break: a
    container's volume mount names a volume of the pod (core validation's
    validateVolumeMounts)."""
    spec = pod.get("spec") or {}
    volumes = {volume.get("name") for volume in spec.get("volumes") or ()}
    causes = []
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or ()):
            for j, mount in enumerate(container.get("volumeMounts") or ()):
                field, name = f"spec.{group}[{i}].volumeMounts[{j}].name", mount.get("name", "")
                if not name:
                    causes.append((field, "Required value"))  # and not found, as named ""
                if name not in volumes:
                    causes.append((field, f"Not found: {json.dumps(name)}"))
    return causes


def _name_of(obj: Body) -> str:
    """The name of a body not decoded yet, for a message."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def _decodes_as(value: Any, go_type: str) -> bool:
    match go_type:
        case "string":
            return isinstance(value, str)
        case "int64":
            return isinstance(value, int) and not isinstance(value, bool)
        case "map[string]string":
            return isinstance(value, dict) and all(
                isinstance(item, str | None) for item in value.values()
            )
        case "[]string":
            return isinstance(value, list) and all(isinstance(item, str) for item in value)
        case _:  # a list of objects
            return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "value")


def _prune(obj: Body, schema: Mapping[str, Any]) -> list[str]:
    """Drop what a CRD's structural schema does not specify, in place, as the API server
    prunes (apiVersion, kind and metadata at the root are its own); returns the paths."""
    unknown: list[str] = []
    for key in [key for key in obj if key not in ("apiVersion", "kind", "metadata")]:
        unknown += _prune_value(obj, key, schema, "")
    return unknown


def _prune_value(parent: Any, key: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    value = parent[key]
    field_path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip(".")
    properties = schema.get("properties", {})
    additional = schema.get("additionalProperties")
    if isinstance(parent, dict) and key not in properties and not isinstance(additional, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") or additional is True:
            return []
        del parent[key]
        return [field_path]
    child = properties.get(key, additional) if isinstance(parent, dict) else schema
    unknown: list[str] = []
    if isinstance(value, dict):
        for name in list(value):
            unknown += _prune_value(value, name, child, field_path)
    elif isinstance(value, list) and isinstance(child.get("items"), dict):
        for index in range(len(value)):
            unknown += _prune_value(value, index, child["items"], field_path)
    return unknown


def _parse_path(path: str) -> parsing.ParsedPath:
    """Split an API path like the API server: ``/api/v1/namespaces/{name}[/status]`` is a
    namespace, ``/api/v1/namespaces/{ns}/{plural}/...`` something in it."""
    parts = path.strip("/").split("/")
    version: str | None
    if parts[0] == "api" and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 2:
        group, version, rest = parts[1], parts[2] if len(parts) >= 3 else None, parts[3:]
    else:
        return parsing.ParsedPath()
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    return parsing.ParsedPath(
        group=group,
        version=version,
        plural=rest[0] if rest else None,
        namespace=namespace,
        name=rest[1] if len(rest) >= 2 else None,
        subresource="/".join(rest[2:]) or None,
    )


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}  # untouched values are shared
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge_patch(merged.get(key), value)
    return merged


_SET_REQUIREMENT = re.compile(
    r"(?P<key>[\w./-]+)\s+(?P<operator>in|notin)\s*\((?P<values>[\w.,\s-]*)\)"
)
_EQUALITY_REQUIREMENT = re.compile(
    r"(?P<key>[\w./-]+)\s*(?P<operator>==|=|!=)\s*(?P<value>[\w.-]*)"
)
_EXISTENCE_REQUIREMENT = re.compile(r"(?P<negation>!?)\s*(?P<key>[\w./-]+)")
_FIELD_REQUIREMENT = re.compile(r"(?P<path>[\w.]+)\s*(?P<operator>==|=|!=)\s*(?P<value>[^,]*?)")


def _label_requirements(selector: str) -> tuple[_LabelRequirement, ...]:
    """Parse a label selector: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``,
    ``k``, ``!k``; commas (outside parentheses) join requirements."""
    if not selector.strip():
        return ()
    requirements = []
    for part in re.split(r",(?![^(]*\))", selector):
        text = part.strip()
        if match := _SET_REQUIREMENT.fullmatch(text):
            values = frozenset(
                value.strip() for value in match["values"].split(",") if value.strip()
            )
            requirements.append(_LabelRequirement(match["key"], match["operator"], values))
        elif match := _EQUALITY_REQUIREMENT.fullmatch(text):
            operator = "notin" if match["operator"] == "!=" else "in"
            requirements.append(
                _LabelRequirement(match["key"], operator, frozenset({match["value"]}))
            )
        elif match := _EXISTENCE_REQUIREMENT.fullmatch(text):
            operator = "!exists" if match["negation"] else "exists"
            requirements.append(_LabelRequirement(match["key"], operator, frozenset()))
        else:
            raise _bad_request(f"unable to parse requirement: {text!r}")
    return tuple(requirements)


def _field_requirements(selector: str) -> tuple[_FieldRequirement, ...]:
    """Parse a field selector: ``path=value``, ``path==value``, ``path!=value``, comma-joined."""
    if not selector.strip():
        return ()
    requirements = []
    for part in selector.split(","):
        match = _FIELD_REQUIREMENT.fullmatch(part.strip())
        if match is None:
            raise _bad_request(f"invalid field selector: {part!r}")
        requirements.append(
            _FieldRequirement(match["path"], match["operator"] == "!=", match["value"])
        )
    return tuple(requirements)


def _crd_resource(crd: Mapping[str, Any]) -> kmock.resource:
    spec = crd["spec"]
    version = next(version for version in spec["versions"] if version.get("storage"))
    return kmock.resource(spec["group"], version["name"], spec["names"]["plural"])


def _scope(info: kmock.ResourceInfo, namespace: str | None) -> str | None:
    return namespace if info.namespaced else None


def _api_version(res: kmock.resource) -> str:
    return f"{res.group}/{res.version}" if res.group else str(res.version)


def _kind(res: kmock.resource, info: kmock.ResourceInfo) -> str:
    return info.kind or str(res.plural).capitalize()


def _qualified(res: kmock.resource) -> str:
    """The resource as the API server names it in messages: ``pods``, ``jobs.batch``."""
    return f"{res.plural}.{res.group}" if res.group else str(res.plural)


def _list(res: kmock.resource, info: kmock.ResourceInfo, items: list[Body], revision: int) -> Body:
    return {
        "apiVersion": _api_version(res),
        "kind": f"{_kind(res, info)}List",
        "metadata": {"resourceVersion": str(revision)},
        "items": items,
    }


def _version(obj: Body) -> int:
    return int(obj["metadata"]["resourceVersion"])


def _timestamp(seconds_from_now: int = 0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _keep(target: Body, source: Mapping[str, Any], key: str) -> None:
    """Make ``target[key]`` what it is in ``source``, absent included."""
    if key in source:
        target[key] = copy.deepcopy(source[key])
    else:
        target.pop(key, None)


def _essence(obj: Body, info: kmock.ResourceInfo) -> Body:
    """What ``metadata.generation`` counts changes of."""
    ignored = {"metadata", "status"} if "status" in info.subresources else {"metadata"}
    return {key: value for key, value in obj.items() if key not in ignored}


def _pod_spec_essence(pod: Body, stored: Body) -> Body:
    """The part of a pod's spec that no update may change."""
    spec = copy.deepcopy(pod.get("spec") or {})
    for field in ("activeDeadlineSeconds", "tolerations"):
        spec.pop(field, None)
    if not (stored.get("spec") or {}).get("nodeName"):
        spec.pop("nodeName", None)
    for container in (*spec.get("containers", ()), *spec.get("initContainers", ())):
        container.pop("image", None)
    return spec


def _delete_options(body: Any, params: Mapping[str, str]) -> Body:
    """DeleteOptions from the body and the query (the query's win, as on the API server)."""
    options = dict(body) if isinstance(body, dict) else {}
    if "propagationPolicy" in params:
        options["propagationPolicy"] = params["propagationPolicy"]
    if "gracePeriodSeconds" in params:
        options["gracePeriodSeconds"] = params["gracePeriodSeconds"]
    if options.get("gracePeriodSeconds") is not None:
        try:
            options["gracePeriodSeconds"] = int(options["gracePeriodSeconds"])
        except (TypeError, ValueError):
            raise _bad_request("gracePeriodSeconds must be an integer") from None
    return options


def _details(res: kmock.resource, name: str) -> Body:
    return {"name": name, "group": res.group, "kind": res.plural}


def _status(error: kmock.KubernetesError) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": error.message or "",
        "reason": error.reason or "",
        "details": error.details or {},
        "code": error.status,
    }


def _expired(since: int, floor: int) -> Body:
    status = kmock.KubernetesError(
        410, "Expired", f"too old resource version: {since} ({floor})", {}
    )
    return {"type": "ERROR", "object": _status(status)}


def _resource_not_found() -> kmock.KubernetesError:
    return kmock.KubernetesError(
        404, "NotFound", "the server could not find the requested resource", {}
    )


def _bad_request(message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(400, "BadRequest", message, {})


def _undecodable(
    res: kmock.resource, info: kmock.ResourceInfo, why: str, *, kind_known: bool = True
) -> kmock.KubernetesError:
    """400 for a body that does not decode into the endpoint's type, worded as the API
    server words it."""
    kind = _kind(res, info)
    if kind_known:
        return _bad_request(
            f"{kind} in version {json.dumps(res.version)} cannot be handled as a {kind}: {why}"
        )
    return _bad_request(f"the object provided is unrecognized (must be of type {kind}): {why}")


def _conflict(res: kmock.resource, name: str, why: str) -> kmock.KubernetesError:
    message = f'Operation cannot be fulfilled on {_qualified(res)} "{name}": {why}'
    return kmock.KubernetesError(409, "Conflict", message, _details(res, name))


def _invalid(
    res: kmock.resource, info: kmock.ResourceInfo, name: str, causes: Sequence[tuple[str, str]]
) -> kmock.KubernetesError:
    """422 Invalid, worded as the API server words it."""
    listed = [f"{field}: {message}" if field else message for field, message in causes]
    text = listed[0] if len(listed) == 1 else f"[{', '.join(listed)}]"
    kind = f"{_kind(res, info)}.{res.group}" if res.group else _kind(res, info)
    details = {
        **_details(res, name),
        "kind": _kind(res, info),
        "causes": [
            {"reason": "FieldValueInvalid", "message": message, "field": field}
            for field, message in causes
        ],
    }
    return kmock.KubernetesError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)
