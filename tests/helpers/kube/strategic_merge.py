"""Strategic merge patches of built-in kinds, applied as the API server applies them
(``k8s.io/apimachinery/pkg/util/strategicpatch``), with the patch strategy and merge key of
each list read from the kind's OpenAPI schema (``x-kubernetes-patch-strategy``,
``x-kubernetes-patch-merge-key``): what ``kubectl apply`` computes for a built-in object
it has applied before.

- Maps merge recursively, ``null`` deletes a key; ``$patch: replace`` replaces a map,
  ``$patch: delete`` deletes it; ``$retainKeys`` drops the keys it does not list.
- A list whose strategy is ``merge`` merges: items with the same merge key merge, others are
  appended, an item ``{$patch: delete, <key>: ...}`` removes its match, ``{$patch: replace}``
  makes the rest of the patch's list the list; a list of scalars is a union, and
  ``$deleteFromPrimitiveList/<field>`` removes values. Any other list is replaced.
- ``$setElementOrder/<field>`` orders the merged list: the items it names in its order,
  then the others in their order.

Simplified: a real server interleaves items the order does not name where they were; here
they follow the named ones.
"""

import copy
from collections.abc import Callable
from typing import Any

Body = dict[str, Any]
Schema = dict[str, Any]
Resolve = Callable[[Schema | None], Schema | None]

_DIRECTIVE = "$patch"
_RETAIN_KEYS = "$retainKeys"
_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"


class PatchError(ValueError):
    """A patch the API server refuses to apply (400 BadRequest)."""


def apply(original: Body, patch: Body, schema: Schema | None, resolve: Resolve) -> Body:
    """``original`` with ``patch`` applied; ``schema``: the kind's, ``resolve`` follows refs."""
    return _merge_map(original, patch, resolve(schema), resolve)


def _merge_map(original: Any, patch: Body, schema: Schema | None, resolve: Resolve) -> Body:
    directive = patch.get(_DIRECTIVE)
    if directive == "replace":
        return copy.deepcopy({k: v for k, v in patch.items() if k != _DIRECTIVE})
    if directive not in (None, "merge"):  # merge: what a map does anyway
        raise PatchError(f"unknown patch type: {directive!r} in map")
    merged = dict(original) if isinstance(original, dict) else {}
    if _RETAIN_KEYS in patch:
        retained = patch[_RETAIN_KEYS]
        if not isinstance(retained, list):
            raise PatchError(f"{_RETAIN_KEYS} must be a list")
        merged = {k: v for k, v in merged.items() if k in retained}
    properties = (schema or {}).get("properties", {})
    for key, value in patch.items():
        if key in (_RETAIN_KEYS, _DIRECTIVE) or key.startswith((_ORDER, _DELETE_FROM)):
            continue
        field = properties.get(key)
        if field is None and isinstance((schema or {}).get("additionalProperties"), dict):
            field = schema["additionalProperties"] if schema else None
        if value is None or (isinstance(value, dict) and value.get(_DIRECTIVE) == "delete"):
            merged.pop(key, None)
        elif isinstance(value, dict):
            merged[key] = _merge_map(merged.get(key), value, resolve(field), resolve)
        elif isinstance(value, list) and "merge" in str(
            (field or {}).get("x-kubernetes-patch-strategy", "")
        ):
            merged[key] = _merge_list(merged.get(key), value, field or {}, resolve)
        else:
            merged[key] = copy.deepcopy(value)
    for key, value in patch.items():
        if key.startswith(_DELETE_FROM):
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            field_name = key.removeprefix(_DELETE_FROM)
            if isinstance(merged.get(field_name), list):
                merged[field_name] = [item for item in merged[field_name] if item not in value]
    for key, value in patch.items():
        if key.startswith(_ORDER):
            field_name = key.removeprefix(_ORDER)
            field = properties.get(field_name) or {}
            if isinstance(merged.get(field_name), list):
                merged[field_name] = _ordered(
                    merged[field_name], value, field.get("x-kubernetes-patch-merge-key")
                )
    return merged


def _merge_list(original: Any, patch: list[Any], field: Schema, resolve: Resolve) -> list[Any]:
    key = field.get("x-kubernetes-patch-merge-key")
    items_schema = resolve(field.get("items"))
    if any(isinstance(item, dict) and item.get(_DIRECTIVE) == "replace" for item in patch):
        return [
            copy.deepcopy(item)
            for item in patch
            if not (isinstance(item, dict) and _DIRECTIVE in item)
        ]
    merged = list(original) if isinstance(original, list) else []
    for item in patch:
        if not isinstance(item, dict):  # a list of scalars: a set union
            if item not in merged:
                merged.append(item)
            continue
        if key is None or key not in item:
            raise PatchError(f"map: {item} does not contain declared merge key: {key}")
        index = next(
            (
                i
                for i, old in enumerate(merged)
                if isinstance(old, dict) and old.get(key) == item[key]
            ),
            None,
        )
        if item.get(_DIRECTIVE) == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(copy.deepcopy({k: v for k, v in item.items() if k != _DIRECTIVE}))
        else:
            merged[index] = _merge_map(merged[index], item, items_schema, resolve)
    return merged


def _ordered(items: list[Any], order: Any, key: str | None) -> list[Any]:
    if not isinstance(order, list):
        raise PatchError(f"{_ORDER} must be a list")

    def identity(item: Any) -> Any:
        return item.get(key) if key is not None and isinstance(item, dict) else item

    names = [identity(entry) if isinstance(entry, dict) else entry for entry in order]
    named = sorted(
        (item for item in items if identity(item) in names),
        key=lambda item: names.index(identity(item)),
    )
    return named + [item for item in items if identity(item) not in names]
