"""Server-side printing of custom resources: the ``meta.k8s.io/v1`` Table that ``kubectl get``
asks for (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...``), built as
apiextensions-apiserver's table convertor builds it from a CRD's
``additionalPrinterColumns``: a Name column, then each column's JSONPath evaluated over the
object (a missing value is an empty cell), ``integer``/``number``/``boolean`` cells as JSON
values, ``date`` cells as the age of the timestamp (Kubernetes' HumanDuration, "5m10s"), and
each row's object as PartialObjectMetadata (``includeObject=Metadata``, the default), the
whole object (``Object``) or nothing (``None``).

JSONPath is jsonpath-ng's extended syntax, which reads the simple paths CRD columns use
(``.status.phase``, ``.status.items[0].name``); Kubernetes' filter syntax
(``[?(@.type=="Ready")]``) is not client-go's here.
"""

import datetime
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpath_ng.ext

Body = dict[str, Any]
CONTENT_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"
_ACCEPTED = re.compile(r"as=Table;\s*v=v1;\s*g=meta\.k8s\.io")
# ObjectMeta's description of name, which the API server gives the Name column.
NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although"
    " some resources may allow a client to request the generation of an appropriate name"
    " automatically. Name is primarily intended for creation idempotence and configuration"
    " definition. Cannot be updated. More info:"
    " https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
INCLUDE_OBJECT = ("None", "Metadata", "Object")
# What apiextensions-apiserver prints for a CRD version without additionalPrinterColumns.
DEFAULT_COLUMNS = ({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},)


def wants_table(accept: str) -> bool:
    """Whether a request's ``Accept`` header asks for a meta.k8s.io/v1 Table first."""
    first = accept.split(",", maxsplit=1)[0]
    return bool(_ACCEPTED.search(first))


def table(
    columns: Sequence[Mapping[str, Any]],
    objects: Sequence[Body],
    *,
    resource_version: str,
    include_object: str = "Metadata",
    now: datetime.datetime | None = None,
) -> Body:
    """The Table of ``objects`` with a CRD version's ``additionalPrinterColumns``."""
    moment = now or datetime.datetime.now(datetime.UTC)
    definitions = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": NAME_DESCRIPTION,
            "priority": 0,
        }
    ]
    for column in columns:
        definitions.append(
            {
                "name": column["name"],
                "type": column["type"],
                "format": column.get("format", ""),
                "description": column.get("description")
                or f"Custom resource definition column (in JSONPath format): {column['jsonPath']}",
                "priority": column.get("priority", 0),
            }
        )
    rows = []
    for obj in objects:
        cells: list[Any] = [obj["metadata"]["name"]]
        cells += [_cell(column, obj, moment) for column in columns]
        row: Body = {"cells": cells}
        if include_object == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        elif include_object == "Object":
            row["object"] = obj
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }


def human_duration(seconds: float) -> str:
    """Kubernetes' ``duration.HumanDuration``: about two significant figures."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m{whole % 60}s" if whole % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, hours // 24 % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


@functools.cache
def _path(json_path: str) -> Any:
    return jsonpath_ng.ext.parse("$" + json_path)


def _cell(column: Mapping[str, Any], obj: Body, now: datetime.datetime) -> Any:
    found = _path(column["jsonPath"]).find(obj)
    if not found:
        return None
    value = found[0].value
    match column["type"]:
        case "string":
            return _printed(value)
        case "integer":
            return (
                int(value)
                if isinstance(value, int | float) and not isinstance(value, bool)
                else None
            )
        case "number":
            return (
                float(value)
                if isinstance(value, int | float) and not isinstance(value, bool)
                else None
            )
        case "boolean":
            return value if isinstance(value, bool) else None
        case "date":
            return _age(value, now) if isinstance(value, str) else None
    return None


def _printed(value: Any) -> str:
    """A value as client-go's JSONPath printer writes it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return "" if value is None else str(value)


def _age(timestamp: str, now: datetime.datetime) -> str:
    try:
        moment = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    if moment.tzinfo is None:
        return "<invalid>"
    return human_duration((now - moment).total_seconds())
