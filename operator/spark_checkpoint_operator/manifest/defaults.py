"""The API server's defaulting of a manifest and its storing of integers, in place."""

import copy
from collections.abc import Iterable
from typing import Any

from spark_checkpoint_operator.manifest.crd import Schema, child_schema

# A float is accepted where an integer is expected only if it is integral and exactly
# representable (|f| < 2**53, go-openapi's IsFloat64AJSONInteger).
_MAX_EXACT_FLOAT_INTEGER = float((1 << 53) - 1)


def store_integers(value: Any, schema: Schema | None) -> None:
    """Turn integral floats in integer fields into integers in place, as the API server
    stores them: it accepts 2.0 for an integer (go-openapi's IsFloat64AJSONInteger) and
    its JSON encoding writes it as 2. Other floats are left for the schema to reject."""
    if schema is None:
        return
    entries: Iterable[tuple[Any, Schema | None]]
    if isinstance(value, dict):
        entries = [(key, child_schema(schema, key)) for key in value]
    elif isinstance(value, list):
        entries = [(index, schema.get("items")) for index in range(len(value))]
    else:
        return
    for key, entry_schema in entries:
        child = value[key]
        if (
            entry_schema is not None
            and entry_schema.get("type") == "integer"
            and isinstance(child, float)
            and child.is_integer()
            and abs(child) <= _MAX_EXACT_FLOAT_INTEGER
        ):
            value[key] = int(child)
        else:
            store_integers(child, entry_schema)


def apply_defaults(value: Any, schema: Schema | None) -> None:
    """Default ``value`` in place as the API server does: a missing field gets its
    default; a null in a field that is not nullable gets its default, or is dropped when
    there is none (a null in a nullable field is kept: ``interval: null`` means never)."""
    if schema is None:
        return
    if isinstance(value, dict):
        for key, child in schema.get("properties", {}).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
        for key in list(value):
            child = child_schema(schema, key)
            if child is not None and value[key] is None and not child.get("nullable", False):
                if "default" not in child:
                    del value[key]
                    continue
                value[key] = copy.deepcopy(child["default"])
            apply_defaults(value[key], child)
    elif isinstance(value, list):
        items = schema.get("items")
        for index, item in enumerate(value):
            if item is None and items is not None and not items.get("nullable", False):
                if "default" not in items:
                    continue  # the API server keeps null items; the schema rejects them
                value[index] = copy.deepcopy(items["default"])
            apply_defaults(value[index], items)


def expanded_copy(value: Any) -> Any:
    """A copy in which a value used twice (a YAML alias) becomes two values, as the API
    server's YAML-to-JSON conversion makes it: defaulting one must not change the other.
    (``copy.deepcopy`` keeps shared values shared.)"""
    if isinstance(value, dict):
        return {key: expanded_copy(child) for key, child in value.items()}
    if isinstance(value, list):
        return [expanded_copy(item) for item in value]
    return copy.deepcopy(value)
