"""The API server's OpenAPI v3 documents: ``/openapi/v3`` lists one document per group
version, ``/openapi/v3/api/v1`` and ``/openapi/v3/apis/<group>/<version>`` hold its paths
and schemas. kubectl reads them to validate what it applies (whether PATCH takes
``fieldValidation``), to compute strategic merge patches (the ``x-kubernetes-patch-*``
extensions) and for ``kubectl explain``.

- Built-in kinds: the schemas of Kubernetes 1.32 as kubernetes-validate ships them (JSON
  Schema converted from the API server's OpenAPI), converted back: nullable types become
  their type, ``#/$defs/`` references ``#/components/schemas/``.
- Custom resources: what apiextensions-apiserver builds from a CRD's storage version: the
  ``openAPIV3Schema`` under ``<reversed group>.<version>.<Kind>`` with the standard
  ``apiVersion``, ``kind`` and ``metadata`` (ObjectMeta) fields, and its list kind.

Simplified: each path has the operations of its verbs with the parameters kubectl looks at
(not every one a real server lists); no OpenAPI v2 (kubectl 1.32 asks for v3 first and uses
v2 only where v3 is missing).
"""

import copy
import functools
import hashlib
import importlib.resources
import json
from collections.abc import Iterator, Mapping
from typing import Any

import kmock

Body = dict[str, Any]
KUBERNETES_VERSION = "1.32"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
_REFERENCE = "#/components/schemas/"
# Their OpenAPI form; the JSON Schema conversion made them a oneOf.
_SCALARS: Mapping[str, Body] = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "type": "string",
        "format": "int-or-string",
    },
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
}
_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)
_WRITE_PARAMETERS = ("dryRun", "fieldManager", "fieldValidation")
_API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers"
    " should convert recognized schemas to the latest internal value, and may reject"
    " unrecognized values. More info:"
    " https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
)
_KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers"
    " may infer this from the endpoint the client submits requests to. Cannot be updated."
    " In CamelCase. More info:"
    " https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)
_METADATA_DESCRIPTION = (
    "Standard object's metadata. More info:"
    " https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)


def server_version() -> Body:
    """``/version``: the Kubernetes release whose built-in schemas these documents hold,
    with every field a real API server's has (the official client's model requires them)."""
    major, minor = KUBERNETES_VERSION.split(".")
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{KUBERNETES_VERSION}.0",
        "gitCommit": "0" * 40,
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.3",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def document_path(res: kmock.resource) -> str:
    """A group version's key in the ``/openapi/v3`` index: ``api/v1``, ``apis/apps/v1``."""
    return f"apis/{res.group}/{res.version}" if res.group else f"api/{res.version}"


def index(documents: Mapping[str, Body]) -> Body:
    """``/openapi/v3``: each document's URL, with a hash of its content (clients cache by it)."""
    return {
        "paths": {
            path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={_hash(document)}"}
            for path, document in sorted(documents.items())
        }
    }


def documents(
    resources: Mapping[kmock.resource, kmock.ResourceInfo], crds: Mapping[kmock.resource, Body]
) -> dict[str, Body]:
    """The document of every group version served: resources of a CRD (``crds``, by
    resource) from its schema, built-in ones from Kubernetes' schemas."""
    by_path: dict[str, list[tuple[kmock.resource, kmock.ResourceInfo]]] = {}
    for res, info in resources.items():
        by_path.setdefault(document_path(res), []).append((res, info))
    built = {}
    for path, served in by_path.items():
        schemas: Body = {}
        paths: Body = {}
        for res, info in served:
            if res in crds:
                kind_schemas = _custom_schemas(res, info, crds[res])
                name = _custom_name(res, str(info.kind))
            else:
                kind_schemas = _builtin_schemas(res, str(info.kind))
                name = _builtin_name(res, str(info.kind))
            if name is None:
                continue  # a kind this Kubernetes version does not have
            schemas.update(kind_schemas)
            paths.update(_paths(res, info, name, custom=res in crds))
        if paths:
            built[path] = {
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": f"v{KUBERNETES_VERSION}.0"},
                "paths": dict(sorted(paths.items())),
                "components": {"schemas": dict(sorted(schemas.items()))},
            }
    return built


def builtin_schema(res: kmock.resource, kind: str) -> Body | None:
    """A built-in kind's schema (references unresolved: see ``resolve``), None for a kind
    Kubernetes does not have."""
    name = _builtin_name(res, kind)
    return None if name is None else _definitions()[name]


def resolve(schema: Body | None) -> Body | None:
    """Follow a ``$ref`` (also inside a lone ``allOf``) to the definition it names."""
    while schema is not None:
        ref = schema.get("$ref") or next(
            (part["$ref"] for part in schema.get("allOf", ()) if "$ref" in part), None
        )
        if ref is None:
            return schema
        schema = _definitions().get(ref.removeprefix(_REFERENCE))
    return None


# --- built-in kinds -------------------------------------------------------------------------


@functools.cache
def _definitions() -> dict[str, Body]:
    """Kubernetes' definitions by name, in their OpenAPI v3 form."""
    source = importlib.resources.files("kubernetes_validate").joinpath(
        f"kubernetes-json-schema/v{KUBERNETES_VERSION}.0-local/_definitions.json"
    )
    converted = {
        name: _from_json_schema(schema)
        for name, schema in json.loads(source.read_text(encoding="utf-8"))["$defs"].items()
    }
    for schema in converted.values():
        if "x-kubernetes-group-version-kind" in schema:
            for field in ("apiVersion", "kind"):  # the conversion pinned them with an enum
                schema.get("properties", {}).get(field, {}).pop("enum", None)
    for name, scalar in _SCALARS.items():
        description = converted.get(name, {}).get("description")
        converted[name] = {**scalar, **({"description": description} if description else {})}
    return converted


def _from_json_schema(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json_schema(item) for item in value]
    if not isinstance(value, dict):
        return value
    converted = {}
    for key, item in value.items():
        if key == "type" and isinstance(item, list):
            types = [t for t in item if t != "null"]
            converted[key] = types[0] if len(types) == 1 else types
        elif key == "$ref" and isinstance(item, str):
            converted[key] = item.replace("#/$defs/", _REFERENCE)
        else:
            converted[key] = _from_json_schema(item)
    return converted


@functools.cache
def _kinds() -> dict[tuple[str, str, str], str]:
    """Definition names by (group, version, kind)."""
    found = {}
    for name, schema in _definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", ()):
            found.setdefault((gvk["group"], gvk["version"], gvk["kind"]), name)
    return found


def _builtin_name(res: kmock.resource, kind: str) -> str | None:
    return _kinds().get((str(res.group), str(res.version), kind))


def _builtin_schemas(res: kmock.resource, kind: str) -> Body:
    name = _builtin_name(res, kind)
    if name is None:
        return {}
    return {found: copy.deepcopy(_definitions()[found]) for found in _closure([name])}


def _closure(names: list[str]) -> Iterator[str]:
    """The definitions named and every one they reference, transitively."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in seen or name not in _definitions():
            continue
        seen.add(name)
        yield name
        pending += _references(_definitions()[name])


def _references(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield item.removeprefix(_REFERENCE)
            else:
                yield from _references(item)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)


# --- custom resources -----------------------------------------------------------------------


def _custom_name(res: kmock.resource, kind: str) -> str:
    """As apiextensions-apiserver names a CRD's schema: the group reversed, then version and
    kind (``io.sparkcheckpoint.v1alpha1.SparkCheckpointJob``)."""
    return ".".join([*reversed(str(res.group).split(".")), str(res.version), kind])


def _custom_schemas(res: kmock.resource, info: kmock.ResourceInfo, crd: Body) -> Body:
    version = next(v for v in crd["spec"]["versions"] if v["name"] == res.version)
    schema = copy.deepcopy((version.get("schema") or {}).get("openAPIV3Schema") or {})
    kind = str(info.kind)
    list_kind = crd["spec"]["names"].get("listKind", f"{kind}List")
    properties = schema.setdefault("properties", {})
    properties["apiVersion"] = {
        "type": "string",
        "description": properties.get("apiVersion", {}).get("description")
        or _API_VERSION_DESCRIPTION,
    }
    properties["kind"] = {
        "type": "string",
        "description": properties.get("kind", {}).get("description") or _KIND_DESCRIPTION,
    }
    properties["metadata"] = {
        "description": _METADATA_DESCRIPTION,
        "allOf": [{"$ref": _REFERENCE + _OBJECT_META}],
    }
    schema["type"] = "object"
    schema["x-kubernetes-group-version-kind"] = [_gvk(res, kind)]
    name = _custom_name(res, kind)
    list_schema = {
        "type": "object",
        "description": f"{list_kind} is a list of {kind}",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": _API_VERSION_DESCRIPTION},
            "kind": {"type": "string", "description": _KIND_DESCRIPTION},
            "items": {
                "type": "array",
                "description": (
                    f"List of {crd['spec']['names']['plural']}. More info:"
                    " https://git.k8s.io/community/contributors/devel/sig-architecture/"
                    "api-conventions.md"
                ),
                "items": {"$ref": _REFERENCE + name},
            },
            "metadata": {
                "description": _METADATA_DESCRIPTION,
                "allOf": [{"$ref": _REFERENCE + _LIST_META}],
            },
        },
        "x-kubernetes-group-version-kind": [_gvk(res, list_kind)],
    }
    found = {name: schema, _custom_name(res, list_kind): list_schema}
    for meta in _closure([_OBJECT_META, _LIST_META]):
        found[meta] = copy.deepcopy(_definitions()[meta])
    return found


# --- paths ----------------------------------------------------------------------------------


def _gvk(res: kmock.resource, kind: str) -> Body:
    return {"group": res.group, "version": res.version, "kind": kind}


def _paths(res: kmock.resource, info: kmock.ResourceInfo, name: str, *, custom: bool) -> Body:
    prefix = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
    collection = (
        f"{prefix}/namespaces/{{namespace}}/{res.plural}"
        if info.namespaced
        else f"{prefix}/{res.plural}"
    )
    kind = str(info.kind)
    gvk = _gvk(res, kind)
    body = {"$ref": _REFERENCE + name}
    patch_types = [t for t in _PATCH_TYPES if not (custom and "strategic" in t)]

    def operation(action: str, parameters: tuple[str, ...] = (), **extra: Any) -> Body:
        return {
            "operationId": f"{action}{kind}",
            "parameters": [
                {"name": p, "in": "query", "schema": {"type": "string"}} for p in parameters
            ],
            "responses": {"200": {"content": {"application/json": {"schema": body}}}},
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            **extra,
        }

    def request(types: list[str]) -> Body:
        return {"requestBody": {"content": {t: {"schema": body} for t in types}}}

    verbs = set(info.verbs)
    item: Body = {}
    if "get" in verbs:
        item["get"] = operation("get")
    if "update" in verbs:
        item["put"] = operation("put", _WRITE_PARAMETERS, **request(["application/json"]))
    if "patch" in verbs:
        item["patch"] = operation("patch", (*_WRITE_PARAMETERS, "force"), **request(patch_types))
    if "delete" in verbs:
        item["delete"] = operation("delete", ("dryRun", "gracePeriodSeconds", "propagationPolicy"))
    items: Body = {}
    if "list" in verbs:
        items["get"] = operation("list", ("labelSelector", "fieldSelector", "watch"))
    if "create" in verbs:
        items["post"] = operation("post", _WRITE_PARAMETERS, **request(["application/json"]))
    paths = {}
    if item:
        paths[f"{collection}/{{name}}"] = item
    if items:
        paths[collection] = items
    return paths


def _hash(document: Body) -> str:
    return hashlib.sha512(json.dumps(document, sort_keys=True).encode()).hexdigest()[:128].upper()
