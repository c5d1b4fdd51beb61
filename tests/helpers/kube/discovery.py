"""Aggregated discovery (``apidiscovery.k8s.io/v2``), as the API server serves it since
Kubernetes 1.30 to a client whose ``Accept`` asks for it (kubectl and client-go do): ``/api``
and ``/apis`` each answer every group, version and resource in one document, with the
subresources nested under their resource. Clients that ask for plain JSON get kmock's
legacy discovery (APIVersions, APIGroupList, one APIResourceList per group version).

Simplified: a subresource's ``responseKind`` is its resource's kind (a real server names
e.g. ``autoscaling/v1 Scale`` for ``scale``); every version is reported ``Current``.
"""

import re
from collections.abc import Iterable, Mapping
from typing import Any

import kmock

CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_ACCEPTED = re.compile(r"g=apidiscovery\.k8s\.io;\s*v=v2;\s*as=APIGroupDiscoveryList")
# What a subresource's endpoint allows, as the API server lists it.
_SUBRESOURCE_VERBS: Mapping[str, tuple[str, ...]] = {
    "status": ("get", "patch", "update"),
    "scale": ("get", "patch", "update"),
    "binding": ("create",),
    "eviction": ("create",),
    "token": ("create",),
    "exec": ("create", "get"),
    "attach": ("create", "get"),
    "portforward": ("create", "get"),
    "proxy": ("create", "delete", "get", "patch", "update"),
}
_VERSION = re.compile(r"v(?P<major>\d+)(?:(?P<stage>alpha|beta)(?P<minor>\d+))?")
_STAGES = {"alpha": 0, "beta": 1, None: 2}


def wants_aggregated(accept: str) -> bool:
    """Whether a discovery request's ``Accept`` header asks for aggregated discovery v2."""
    return bool(_ACCEPTED.search(accept))


def aggregated(
    resources: Mapping[kmock.resource, kmock.ResourceInfo], *, legacy: bool
) -> dict[str, Any]:
    """The APIGroupDiscoveryList of ``/api`` (``legacy``: the core group) or ``/apis``."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for res, info in resources.items():
        if (res.group == "") == legacy and res.plural is not None and "/" not in res.plural:
            versions = groups.setdefault(str(res.group), {})
            versions.setdefault(str(res.version), []).append(_resource(res, info))
    return {
        "apiVersion": "apidiscovery.k8s.io/v2",
        "kind": "APIGroupDiscoveryList",
        "metadata": {},
        "items": [
            {
                "metadata": {"name": group} if group else {},
                "versions": [
                    {
                        "version": version,
                        "resources": sorted(versions[version], key=lambda r: r["resource"]),
                        "freshness": "Current",
                    }
                    for version in preferred_first(versions)
                ],
            }
            for group, versions in sorted(groups.items())
        ],
    }


def preferred_first(versions: Iterable[str]) -> list[str]:
    """Versions in the API server's order of preference: GA before beta before alpha, higher
    numbers first, versions that do not look like Kubernetes versions last by name."""

    def priority(version: str) -> tuple[int, int, int, str]:
        match = _VERSION.fullmatch(version)
        if match is None:
            return (1, 0, 0, version)
        stage = _STAGES[match["stage"]]
        return (0, -stage, -int(match["major"]) * 1000 - int(match["minor"] or 0), version)

    return sorted(versions, key=priority)


def _resource(res: kmock.resource, info: kmock.ResourceInfo) -> dict[str, Any]:
    kind = {"group": res.group, "version": res.version, "kind": info.kind}
    entry: dict[str, Any] = {
        "resource": res.plural,
        "responseKind": kind,
        "scope": "Namespaced" if info.namespaced else "Cluster",
        "singularResource": info.singular or "",
        "verbs": sorted(info.verbs),
    }
    if info.shortnames:
        entry["shortNames"] = sorted(info.shortnames)
    if info.categories:
        entry["categories"] = sorted(info.categories)
    if info.subresources:
        entry["subresources"] = [
            {
                "subresource": name,
                "responseKind": kind,
                "verbs": list(_SUBRESOURCE_VERBS.get(name, ("get",))),
            }
            for name in sorted(info.subresources)
        ]
    return entry
