"""The emulator's ``/metrics``: what it served, as kube-apiserver reports it.

``apiserver_request_total`` counts every request once it is answered (a watch when it
ends), with kube-apiserver's labels (``staging/src/k8s.io/apiserver/pkg/endpoints/metrics``):
``verb`` (GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION), ``dry_run``,
``group``, ``version``, ``resource``, ``subresource``, ``scope`` (resource, namespace,
cluster), ``component`` and ``code``. A request outside the resources (discovery, this
endpoint) has empty group, version, resource and scope, and its path as ``subresource``, as
kube-apiserver reports one. ``process_cpu_seconds_total`` and its siblings describe the
emulator's process, as they describe kube-apiserver's. So a client that measures a cluster
through ``/metrics`` measures the emulator the same way.
"""

import aiohttp.web
from kmock._internal import parsing
from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

METRICS_PATH = "/metrics"
_APPLY_PATCH = "application/apply-patch+yaml"


class RequestMetrics:
    """One emulator's request counter and its Prometheus text exposition."""

    def __init__(self) -> None:
        self._registry = CollectorRegistry()
        ProcessCollector(registry=self._registry)
        self._requests = Counter(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, dry run value, group,"
            " version, resource, scope, component, and HTTP response code.",
            labelnames=(
                "verb",
                "dry_run",
                "group",
                "version",
                "resource",
                "subresource",
                "scope",
                "component",
                "code",
            ),
            registry=self._registry,
        )

    def count(self, request: aiohttp.web.BaseRequest, path: parsing.ParsedPath, code: int) -> None:
        """Count one answered request; ``path`` is the API path as the emulator parsed it."""
        if path.plural is None:  # not a resource: discovery, /metrics, /openapi/...
            labels = ("", "", "", request.path, "")
        else:
            labels = (
                path.group or "",
                path.version or "",
                path.plural,
                path.subresource or "",
                _scope(request.method, path),
            )
        group, version, resource, subresource, scope = labels
        self._requests.labels(
            verb=_verb(request, path),
            dry_run="All" if request.query.get("dryRun") else "",
            group=group,
            version=version,
            resource=resource,
            subresource=subresource,
            scope=scope,
            component="apiserver",
            code=str(code),
        ).inc()

    def response(self) -> aiohttp.web.Response:
        """``GET /metrics``: the Prometheus text format, version 0.0.4 as kube-apiserver's."""
        return aiohttp.web.Response(
            body=generate_latest(self._registry),
            headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4},
        )


def _verb(request: aiohttp.web.BaseRequest, path: parsing.ParsedPath) -> str:
    """kube-apiserver's reported verb: a collection's GET is LIST, ``watch=true`` WATCH,
    a server-side apply PATCH APPLY, a collection's DELETE DELETECOLLECTION."""
    method = request.method.upper()
    collection = path.plural is not None and path.name is None
    if method == "GET" and request.query.get("watch") in ("true", "1"):
        return "WATCH"
    if method == "GET" and collection:
        return "LIST"
    if method == "DELETE" and collection:
        return "DELETECOLLECTION"
    if method == "PATCH" and request.content_type == _APPLY_PATCH:
        return "APPLY"
    return method


def _scope(method: str, path: parsing.ParsedPath) -> str:
    """kube-apiserver's ``CleanScope``: a named object (or a create) is ``resource``."""
    if path.name is not None or method.upper() == "POST":
        return "resource"
    return "namespace" if path.namespace is not None else "cluster"
